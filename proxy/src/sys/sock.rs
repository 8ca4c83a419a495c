//! Socket options and shutdown on raw TCP socket fds.
//!
//! Invariant: these only change options or state of a socket the caller
//! borrows; none closes an fd (closing stays with the owner, so an abortive
//! close is `set_linger_reset` followed by the owner's drop).

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd};

fn setsockopt_raw<T>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `fd` is borrowed, hence open; `value` points to a live `T` and
    // the length passed is exactly `size_of::<T>()`, which the kernel reads only.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            mem::size_of::<T>() as libc::socklen_t,
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
