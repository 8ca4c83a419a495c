//! Where the process stands in a seamless reload: the listening sockets kept
//! for a successor (`_getsocks`), whether a `_getflows` transfer is under way
//! and whether a successor took the process over.
//!
//! Owns the exported descriptors (dups of every listening socket, kept while
//! the process runs, closed at soft or hard stop) and the two flags. Only
//! `reload` moves the flags (its `_getflows` server); `daemon` exports and
//! closes the descriptors; the stop path, the stats sockets' and the pidfile's
//! clean-up read them. Built before the runtime (the pidfile and the stats
//! sockets are opened first and read it when they drop) and shared as an
//! `Arc`.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

/// The process's part in a reload.
#[derive(Debug, Default)]
pub struct Handover {
    /// Dups of the process's listening sockets, for `_getsocks`.
    exported: Mutex<Vec<OwnedFd>>,
    /// Set while this process hands its kernel flows over: the soft stop must
    /// not end (and close the descriptors being sent) before the transfer did.
    handing_over: AtomicBool,
    /// Set once a successor committed its take-over (`_getflows`, then its
    /// commit): this process no longer speaks for the service (no
    /// `STOPPING=1` to systemd, no removal of the stats socket files, the
    /// pidfile or the pinned maps when it stops). A successor that only
    /// fetched the sockets and then failed leaves it unset.
    handed_over: AtomicBool,
}

impl Handover {
    fn exported(&self) -> MutexGuard<'_, Vec<OwnedFd>> {
        self.exported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keep `fds` (dups of the listening sockets) for a successor.
    pub fn export(&self, fds: Vec<OwnedFd>) {
        *self.exported() = fds;
    }

    /// Close the exported dups (the process stops listening: at soft or hard
    /// stop the sockets must close with the listeners, unless a successor
    /// holds them).
    pub fn close_exported(&self) {
        self.exported().clear();
    }

    /// Dups of the exported descriptors, the caller's own for a transfer (a
    /// concurrent stop may close the exported ones meanwhile).
    pub fn exported_dups(&self) -> std::io::Result<Vec<OwnedFd>> {
        self.exported().iter().map(OwnedFd::try_clone).collect()
    }

    /// Whether a `_getflows` transfer is in progress.
    pub fn handing_over(&self) -> bool {
        self.handing_over.load(Ordering::Relaxed)
    }

    /// A `_getflows` transfer starts (true) or ended (false).
    pub fn set_handing_over(&self, on: bool) {
        self.handing_over.store(on, Ordering::SeqCst);
    }

    /// Whether a successor took this process over (its commit was
    /// acknowledged).
    pub fn handed_over(&self) -> bool {
        self.handed_over.load(Ordering::Relaxed)
    }

    /// A successor took this process over; never undone.
    pub fn mark_handed_over(&self) {
        self.handed_over.store(true, Ordering::SeqCst);
    }
}
