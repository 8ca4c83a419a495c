//! Thin syscall wrappers: the only place besides `handoff` with `unsafe`.
//!
//! Owns: the raw calls the forwarding code needs and that neither std nor
//! tokio expose (`pipe2`, `splice`, `fcntl(F_{SET,GET}PIPE_SZ)`, socket
//! options, `shutdown`, the SO_LINGER reset) and the privilege drop
//! (`setuid`/`setgid`, capability sets).
//! Must not: keep state, allocate, log, or decide policy. Each wrapper takes a
//! `BorrowedFd` so the fd is guaranteed open for the duration of the call,
//! and returns `io::Error::last_os_error()` on failure.

pub mod bpf;
pub mod caps;
pub mod pipe;
pub mod sock;
