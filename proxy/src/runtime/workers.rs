//! The running workers' handles, through which the CLI reaches each worker's
//! flow registry (`stats::flows`). Filled as workers start; read by commands
//! that need every thread.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::scheduler::Remote;

/// One handle per running worker.
#[derive(Default)]
pub struct Workers {
    remotes: Mutex<Vec<Remote>>,
    /// Signalled at each registration.
    registered: Condvar,
}

impl Workers {
    pub fn new(nbthread: usize) -> Self {
        Self {
            remotes: Mutex::new(Vec::with_capacity(nbthread)),
            registered: Condvar::new(),
        }
    }

    /// A worker that started (called on the worker itself).
    pub fn register(&self, remote: Remote) {
        self.remotes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(remote);
        self.registered.notify_all();
    }

    /// Block until `n` workers registered, at most `limit` (false: fewer did).
    /// The process announces that it serves only after this, so a command
    /// that needs every worker sees them all.
    pub fn wait_for(&self, n: usize, limit: Duration) -> bool {
        let guard = self
            .remotes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (guard, _) = self
            .registered
            .wait_timeout_while(guard, limit, |v| v.len() < n)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        guard.len() >= n
    }

    /// The workers' handles, sorted by worker index.
    pub fn remotes(&self) -> Vec<Remote> {
        let mut v = self
            .remotes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        v.sort_by_key(Remote::thread_id);
        v
    }
}
