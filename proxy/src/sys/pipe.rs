//! Pipes and splice(2).
//!
//! Invariants: every pipe is created `O_NONBLOCK | O_CLOEXEC`; every splice is
//! `SPLICE_F_NONBLOCK | SPLICE_F_MOVE` (the sockets are non-blocking too, so
//! a call never sleeps). `SPLICE_F_MORE` is only set when the caller asks.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr;

/// Creates a non-blocking, close-on-exec pipe. Returns `(read end, write end)`.
pub fn pipe_nonblocking() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds: [libc::c_int; 2] = [-1, -1];
    // SAFETY: `fds` is a valid, writable array of two c_ints as pipe2 requires.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both fds are freshly opened and owned by no
    // one else; each is wrapped exactly once.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((r, w))
}

/// `fcntl(F_SETPIPE_SZ)`: asks for a capacity of `size` bytes and returns the
/// capacity the kernel actually set (rounded up to a power-of-two of pages).
pub fn set_pipe_size(fd: BorrowedFd<'_>, size: usize) -> io::Result<usize> {
    let want = libc::c_int::try_from(size)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pipe size overflows c_int"))?;
    // SAFETY: `fd` is borrowed, hence open; F_SETPIPE_SZ takes an int argument
    // and touches no user memory.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, want) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// `fcntl(F_GETPIPE_SZ)`: the pipe's capacity in bytes.
pub fn pipe_size(fd: BorrowedFd<'_>) -> io::Result<usize> {
    // SAFETY: `fd` is borrowed, hence open; F_GETPIPE_SZ takes no argument.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETPIPE_SZ) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// One non-blocking `splice(from, to, len)` without offsets (both ends are a
/// pipe or a socket). `more` adds `SPLICE_F_MORE` (the kernel then sends
/// with MSG_MORE, which holds a sub-MSS tail: the caller must push it).
/// Returns the bytes moved; 0 means EOF on a socket source.
pub fn splice(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    len: usize,
    more: bool,
) -> io::Result<usize> {
    let mut flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
    if more {
        flags |= libc::SPLICE_F_MORE;
    }
    // SAFETY: both fds are borrowed, hence open for the call; null offsets are
    // what splice requires for pipes and sockets; no user memory is passed.
    let n = unsafe {
        libc::splice(
            from.as_raw_fd(),
            ptr::null_mut(),
            to.as_raw_fd(),
            ptr::null_mut(),
            len,
            flags,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// `read(2)` on a raw fd (used to drain a pipe into userspace).
pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `fd` is borrowed, hence open; `buf` is a valid writable region
    // of exactly `buf.len()` bytes for the duration of the call.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn pipe_size_round_trips_and_splice_moves_bytes() {
        let (r, w) = pipe_nonblocking().unwrap();
        assert_eq!(set_pipe_size(w.as_fd(), 8192).unwrap(), 8192);
        assert_eq!(pipe_size(r.as_fd()).unwrap(), 8192);
        let (r2, w2) = pipe_nonblocking().unwrap();
        // Empty non-blocking pipe: EAGAIN, not a hang.
        let err = splice(r.as_fd(), w2.as_fd(), 10, false).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        // SAFETY: test-only write of a valid 5-byte buffer to an open fd.
        let n = unsafe { libc::write(w.as_raw_fd(), b"hello".as_ptr().cast(), 5) };
        assert_eq!(n, 5);
        assert_eq!(splice(r.as_fd(), w2.as_fd(), 100, true).unwrap(), 5);
        let mut buf = [0u8; 16];
        assert_eq!(read(r2.as_fd(), &mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"hello");
    }
}
