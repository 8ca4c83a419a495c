//! `chroot DIR`: changing the process's root directory.
//!
//! Owns the one call sequence ([`enter`]): load the time zone while
//! `/etc/localtime` is still reachable, `chroot(DIR)`, then `chdir("/")` so
//! that no working directory is left outside the new root. Must not: decide
//! when (the daemon calls it once every file it needs is open and before the
//! privilege drop, which needs CAP_SYS_CHROOT until then) or log.
//!
//! Invariant: on success every path the process resolves from then on,
//! absolute or relative, is under DIR; descriptors opened before stay valid.

use std::io;
use std::path::Path;

// POSIX `tzset(3)`, which the libc crate does not declare.
extern "C" {
    fn tzset();
}

/// Makes `dir` the process's root directory and its working directory.
pub fn enter(dir: &Path) -> io::Result<()> {
    // SAFETY: tzset takes no argument and only fills libc's own time-zone
    // state; it runs here while the process is still single-threaded (the
    // daemon calls this before starting any worker), so nothing races with it.
    unsafe { tzset() };
    nix::unistd::chroot(dir).map_err(io::Error::from)?;
    nix::unistd::chdir("/").map_err(io::Error::from)
}
