//! Thin syscall wrappers, and where most of the daemon's `unsafe` lives.
//!
//! The other `unsafe` blocks of `proxy/src` are single calls in the module
//! that needs them, each with its `// SAFETY:` line: `bpf` (the log ring
//! buffer's fd registered with the reactor, `setrlimit`, `SO_COOKIE`),
//! `handoff::sockmap` (`FIONREAD`), `reload` (descriptors received with
//! `SCM_RIGHTS`), `maps` (the drop thread's `sched_setscheduler` and
//! `setpriority`), `log::time` (`localtime_r`), `notify` (`clock_gettime`)
//! and `main` (`mallopt`).
//!
//! Owns: the raw calls the forwarding code needs and that neither std nor
//! tokio expose (`pipe2`, `splice`, `fcntl(F_{SET,GET}PIPE_SZ)`, socket
//! options, `shutdown`, the SO_LINGER reset, kTLS's `TCP_ULP`/`SOL_TLS` options
//! and record-typed `recvmsg`/`sendmsg`), `chroot` and the privilege drop
//! (`setuid`/`setgid`, capability sets).
//! Must not: keep state, allocate, log, or decide policy. Each wrapper takes a
//! `BorrowedFd` so the fd is guaranteed open for the duration of the call,
//! and returns `io::Error::last_os_error()` on failure.

pub mod bpf;
pub mod caps;
pub mod ktls;
pub mod pipe;
pub mod root;
pub mod sock;

/// CPU time consumed by the calling thread, in nanoseconds
/// (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`); 0 if the clock cannot be read.
/// Used by the scheduler to measure stolen CPU time (`show activity`).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call, and
    // CLOCK_THREAD_CPUTIME_ID is a clock every Linux kernel supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Longest host name the kernel keeps (`HOST_NAME_MAX` is 64), plus the NUL.
const HOSTNAME_BUF: usize = 65;

/// The host name (`gethostname(2)`: no file involved, so it works in a
/// chroot); empty if it cannot be read.
pub fn hostname() -> String {
    let mut buf = [0u8; HOSTNAME_BUF];
    // SAFETY: `buf` is writable for `buf.len()` bytes; gethostname writes at
    // most that many and the last byte stays 0, so the result is terminated.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The soft `RLIMIT_NOFILE` (`getrlimit(2)`, which works in a chroot where
/// `/proc/self/limits` is gone); 0 when unknown.
pub fn nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the duration of the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    if rc != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return 0;
    }
    lim.rlim_cur
}
