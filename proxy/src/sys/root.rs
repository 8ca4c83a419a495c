//! `chroot DIR`: changing the process's root directory.
//!
//! Owns the one call sequence: [`open`] the directory early (so a missing or
//! unreadable one fails the start before anything is published), then
//! [`enter`]: load the time zone while `/etc/localtime` is still reachable,
//! `fchdir` to the opened directory, `chroot(".")`, `chdir("/")` so that no
//! working directory is left outside the new root. Must not: decide
//! when (the daemon calls it once every file it needs is open and before the
//! privilege drop, which needs CAP_SYS_CHROOT until then) or log.
//!
//! Invariant: on success every path the process resolves from then on,
//! absolute or relative, is under DIR; descriptors opened before stay valid.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

// POSIX `tzset(3)`, which the libc crate does not declare.
extern "C" {
    fn tzset();
}

/// The directory to enter later, opened now (it must exist and be a directory).
pub fn open(dir: &Path) -> io::Result<OwnedFd> {
    let f = std::fs::File::open(dir)?;
    if !f.metadata()?.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
    }
    Ok(OwnedFd::from(f))
}

/// Makes `dir` (from [`open`]) the process's root directory and its working
/// directory.
pub fn enter(dir: &OwnedFd) -> io::Result<()> {
    // SAFETY: tzset takes no argument and only fills libc's own time-zone
    // state; it runs here while the process is still single-threaded (the
    // daemon calls this before starting any worker), so nothing races with it.
    unsafe { tzset() };
    nix::unistd::fchdir(dir.as_raw_fd()).map_err(io::Error::from)?;
    nix::unistd::chroot(".").map_err(io::Error::from)?;
    nix::unistd::chdir("/").map_err(io::Error::from)
}
