//! Socket options and shutdown on raw TCP socket fds.
//!
//! Invariant: these only change options or state of a socket the caller
//! borrows; none closes an fd (closing stays with the owner, so an abortive
//! close is `set_linger_reset` followed by the owner's drop).

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `setsockopt` with `value`'s bytes, its whole size (a value or a slice).
pub(super) fn setsockopt_raw<T: ?Sized>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `fd` is borrowed, hence open; `value` points to a live `T` and
    // the length passed is exactly its size, which the kernel reads only.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            mem::size_of_val(value) as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets TCP_NODELAY. Setting it (even when already set) also pushes any
/// frames TCP is holding back, which is how a MSG_MORE tail is released.
pub fn set_nodelay(fd: BorrowedFd<'_>) -> io::Result<()> {
    let on: libc::c_int = 1;
    setsockopt_raw(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, &on)
}

/// Reads TCP_NODELAY (tests and diagnostics).
pub fn nodelay(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut val: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` is borrowed, hence open; `val` and `len` are valid writable
    // locations and `len` holds the size of `val`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&mut val as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(val != 0)
}

/// Sets `IP_TRANSPARENT` (IPv4) or `IPV6_TRANSPARENT` (IPv6): the socket may
/// bind and accept for addresses that are not local (needs CAP_NET_ADMIN).
pub fn set_transparent(fd: BorrowedFd<'_>, v6: bool) -> io::Result<()> {
    let on: libc::c_int = 1;
    if v6 {
        setsockopt_raw(fd, libc::SOL_IPV6, libc::IPV6_TRANSPARENT, &on)
    } else {
        setsockopt_raw(fd, libc::SOL_IP, libc::IP_TRANSPARENT, &on)
    }
}

/// Sets `TCP_DEFER_ACCEPT` to `secs`: a connection is accepted only once the
/// client sent data (or after about that long).
pub fn set_defer_accept(fd: BorrowedFd<'_>, secs: libc::c_int) -> io::Result<()> {
    setsockopt_raw(fd, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, &secs)
}

/// Sets `TCP_FASTOPEN` on a listening socket: up to `qlen` pending TFO
/// connections.
pub fn set_fastopen(fd: BorrowedFd<'_>, qlen: libc::c_int) -> io::Result<()> {
    setsockopt_raw(fd, libc::IPPROTO_TCP, libc::TCP_FASTOPEN, &qlen)
}

/// Reads an `int` socket option (tests and diagnostics).
pub fn int_opt(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int) -> io::Result<i32> {
    let mut val: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` is borrowed, hence open; `val` and `len` are valid writable
    // locations and `len` holds the size of `val`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut val as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(val)
}

/// Sets SO_LINGER {on, 0}: the owner's next close sends RST instead of FIN.
pub fn set_linger_reset(fd: BorrowedFd<'_>) -> io::Result<()> {
    let lin = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    setsockopt_raw(fd, libc::SOL_SOCKET, libc::SO_LINGER, &lin)
}

/// `shutdown(SHUT_WR)`: sends FIN after the queued bytes.
pub fn shutdown_write(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: `fd` is borrowed, hence open; shutdown touches no user memory.
    let rc = unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_WR) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets SO_RCVLOWAT. On a socket just inserted into a verdict-attached
/// SOCKHASH this also runs the verdict over bytes already queued (the
/// kernel calls `sk_data_ready` when the low-water mark changes).
pub fn set_rcvlowat(fd: BorrowedFd<'_>, bytes: libc::c_int) -> io::Result<()> {
    setsockopt_raw(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, &bytes)
}

/// The prefix of the kernel's `struct tcp_info` up to `tcpi_bytes_received`
/// (stable UAPI layout since Linux 4.1; the kernel copies at most the length
/// we pass, so a longer kernel struct is fine).
#[repr(C)]
#[derive(Default)]
struct TcpInfoPrefix {
    /// tcpi_state .. tcpi_delivery_rate_app_limited: 8 one-byte fields.
    bytes8: [u8; 8],
    /// tcpi_rto .. tcpi_total_retrans: 24 u32 fields.
    words: [u32; 24],
    pacing_rate: u64,
    max_pacing_rate: u64,
    bytes_acked: u64,
    bytes_received: u64,
}

const _: () = assert!(mem::size_of::<TcpInfoPrefix>() == 136);

/// The send side of a TCP socket: bytes the peer acknowledged and bytes
/// still in the send queue. Their sum is how many bytes ever entered the send
/// queue (`write_seq` progress); bytes redirected to the socket by a sockmap
/// but still in its psock backlog are not in it yet, which is what the drain
/// check measures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendState {
    pub acked: u64,
    pub queued: u64,
    /// `tcpi_bytes_received`: in-order bytes this socket received (no duplicates).
    pub received: u64,
}

impl SendState {
    /// Bytes that ever entered the send queue.
    pub fn progress(&self) -> u64 {
        self.acked + self.queued
    }
}

/// Reads [`SendState`]: `TCP_INFO` and `SIOCOUTQ` are two system calls, and an
/// ACK arriving between them moves bytes from "queued" to "acked" unseen, so
/// `acked + queued` would come out short. The pair is read again until
/// `TCP_INFO` before and after `SIOCOUTQ` agree on `bytes_acked` (bounded by
/// [`CONSISTENT_READS`]); past that the shorter sum is kept, which only makes
/// a drain check wait longer.
pub fn send_state(fd: BorrowedFd<'_>) -> io::Result<SendState> {
    let mut before = tcp_info_prefix(fd)?;
    let mut queued = outq(fd)?;
    for _ in 0..CONSISTENT_READS {
        let after = tcp_info_prefix(fd)?;
        if after.bytes_acked == before.bytes_acked {
            break;
        }
        before = after;
        queued = outq(fd)?;
    }
    Ok(SendState {
        acked: before.bytes_acked,
        queued,
        received: before.bytes_received,
    })
}

/// Attempts at a consistent [`send_state`] read.
const CONSISTENT_READS: usize = 4;

fn tcp_info_prefix(fd: BorrowedFd<'_>) -> io::Result<TcpInfoPrefix> {
    let mut info = TcpInfoPrefix::default();
    let mut len = mem::size_of::<TcpInfoPrefix>() as libc::socklen_t;
    // SAFETY: `fd` is borrowed, hence open; `info` is a live, writable
    // buffer of `len` bytes, and the kernel writes at most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut TcpInfoPrefix).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if (len as usize) < mem::size_of::<TcpInfoPrefix>() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("TCP_INFO too short ({len} bytes) for tcpi_bytes_acked"),
        ));
    }
    Ok(info)
}

/// `SIOCOUTQ`: bytes in the send queue not yet acknowledged.
fn outq(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut outq: libc::c_int = 0;
    // SAFETY: `fd` is open; SIOCOUTQ writes one c_int into `outq`, which lives
    // for the duration of the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut outq) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(outq.max(0) as u64)
}

/// `FIONREAD`: on a socket with a psock (in a sockmap) the kernel answers
/// with the bytes queued for userspace by the verdict (`tcp_bpf_ioctl`), not
/// the TCP receive queue.
pub fn inq(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: `fd` is open; FIONREAD writes one c_int into `n`, which lives
    // for the duration of the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as usize)
}

/// `recv` without waiting; with `peek`, the bytes stay queued.
pub fn recv_nowait(fd: BorrowedFd<'_>, buf: &mut [u8], peek: bool) -> io::Result<usize> {
    let flags = libc::MSG_DONTWAIT | if peek { libc::MSG_PEEK } else { 0 };
    // SAFETY: `fd` is open; `buf` is a live, writable buffer of `buf.len()`
    // bytes and the kernel writes at most that many.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}
