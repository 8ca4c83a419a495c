//! The pool of splice pipes (one per process, held by the runtime).
//!
//! Owns: every pipe used for splicing, its sizing (`tune.pipesize` through
//! F_SETPIPE_SZ) and the `maxpipes` bound (pipes in use + pipes kept free
//! never exceed it).
//! Invariants: only an EMPTY pipe goes back to the free list (a pipe that
//! still holds bytes is closed: those bytes belong to a dead flow); a pipe
//! made under an older configuration is closed instead of pooled.
//! The lock is held only for list/counter updates and `pipe2`+`fcntl`, never
//! across an await.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};

use crate::sys::pipe as sys_pipe;

/// Smallest pipe size honoured: one page (the kernel's minimum).
pub const MIN_PIPE_SIZE: usize = 4096;
/// Largest pipe size honoured: the kernel's default `fs.pipe-max-size`.
pub const MAX_PIPE_SIZE: usize = 1 << 20;

/// One pipe: read end, write end, actual capacity in bytes.
#[derive(Debug)]
pub struct Pipe {
    pub(crate) rd: OwnedFd,
    pub(crate) wr: OwnedFd,
    pub(crate) cap: usize,
    generation: u64,
}

#[derive(Debug)]
struct Inner {
    pipesize: Option<usize>,
    maxpipes: usize,
    generation: u64,
    free: Vec<Pipe>,
    in_use: usize,
}

/// A bounded pool of pipes (the runtime's; tests make private ones).
#[derive(Debug)]
pub struct PipePool {
    inner: Mutex<Inner>,
}

impl PipePool {
    pub const fn new(pipesize: Option<usize>, maxpipes: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                pipesize,
                maxpipes,
                generation: 0,
                free: Vec::new(),
                in_use: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves only counters and a Vec in a
        // consistent state (no multi-step invariant spans a panic point).
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A pool of at most `maxpipes` pipes of `pipesize` bytes (`tune.pipesize`,
    /// clamped to what the kernel honours; `None`: its default).
    pub fn configured(pipesize: Option<usize>, maxpipes: usize) -> Self {
        let pool = Self::new(None, maxpipes);
        pool.configure(pipesize, maxpipes);
        pool
    }

    /// Replaces the configuration; free pipes of the old one are closed.
    pub fn configure(&self, pipesize: Option<usize>, maxpipes: usize) {
        let mut g = self.lock();
        g.pipesize = pipesize.map(|s| s.clamp(MIN_PIPE_SIZE, MAX_PIPE_SIZE));
        g.maxpipes = maxpipes;
        g.generation += 1;
        g.free.clear();
    }

    pub fn in_use(&self) -> usize {
        self.lock().in_use
    }

    pub fn free(&self) -> usize {
        self.lock().free.len()
    }

    /// Takes one pipe, if the bound allows.
    pub fn acquire(&self) -> Option<Pipe> {
        Self::take(&mut self.lock())
    }

    fn take(g: &mut Inner) -> Option<Pipe> {
        if let Some(p) = g.free.pop() {
            g.in_use += 1;
            return Some(p);
        }
        if g.in_use + g.free.len() >= g.maxpipes {
            return None;
        }
        let p = Self::make(g.pipesize, g.generation)?;
        g.in_use += 1;
        Some(p)
    }

    fn make(pipesize: Option<usize>, generation: u64) -> Option<Pipe> {
        let (rd, wr) = match sys_pipe::pipe_nonblocking() {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "pipe2 failed; flow falls back to copy");
                return None;
            }
        };
        if let Some(want) = pipesize {
            // EPERM past fs.pipe-user-pages-soft: keep the size we have.
            if let Err(e) = sys_pipe::set_pipe_size(wr.as_fd(), want) {
                tracing::debug!(error = %e, want, "F_SETPIPE_SZ failed; keeping kernel size");
            }
        }
        let cap = match sys_pipe::pipe_size(wr.as_fd()) {
            Ok(c) if c > 0 => c,
            Ok(_) => return None,
            Err(e) => {
                tracing::debug!(error = %e, "F_GETPIPE_SZ failed; flow falls back to copy");
                return None;
            }
        };
        Some(Pipe {
            rd,
            wr,
            cap,
            generation,
        })
    }

    /// Gives a pipe back; `empty` must be true only when it holds no byte.
    pub fn release(&self, pipe: Pipe, empty: bool) {
        let mut g = self.lock();
        Self::put(&mut g, pipe, empty);
    }

    fn put(g: &mut Inner, pipe: Pipe, empty: bool) {
        g.in_use = g.in_use.saturating_sub(1);
        if empty && pipe.generation == g.generation && g.in_use + g.free.len() < g.maxpipes {
            g.free.push(pipe);
        }
        // otherwise `pipe` drops here: both ends closed, bytes discarded.
    }
}

/// A pipe borrowed from a pool for one direction of one flow. `pending` is
/// the exact number of bytes in the pipe; dropping the lease pools the pipe
/// only when `pending == 0`.
pub struct Lease<'p> {
    pool: &'p PipePool,
    pub(super) pipe: Option<Pipe>,
    pub(super) pending: usize,
}

impl<'p> Lease<'p> {
    /// A lease that takes its pipe only when bytes move ([`Lease::fill`]).
    pub fn lazy(pool: &'p PipePool) -> Self {
        Self {
            pool,
            pipe: None,
            pending: 0,
        }
    }

    /// Make sure a pipe is held; false when the pool has none to give.
    pub fn fill(&mut self) -> bool {
        if self.pipe.is_none() {
            self.pipe = self.pool.acquire();
        }
        self.pipe.is_some()
    }

    /// Give the pipe back while it is empty (an idle direction holds none).
    pub fn idle(&mut self) {
        if self.pending == 0 {
            if let Some(p) = self.pipe.take() {
                self.pool.release(p, true);
            }
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.pipe.take() {
            self.pool.release(p, self.pending == 0);
        }
    }
}
