//! The pool of splice pipes (one per process, held by the runtime).
//!
//! Owns: every pipe used for splicing, its sizing (`tune.pipesize` through
//! F_SETPIPE_SZ) and the `maxpipes` bound (pipes in use + pipes kept free
//! never exceed it).
//!
//! Without `tune.pipesize`, a pipe starts at the kernel's default (64 KiB)
//! and a flow that fills it (a bulk transfer) has it grown once to
//! [`BULK_PIPE_SIZE`] ([`Lease::grow`]): a 1 MiB pipe moves a loopback bulk
//! stream with ~30 % less CPU per byte and ~20 % more throughput (measured
//! 2026-12-02, iperf3 -P 1 through `nbthread 1` in splice mode: 0.35 →
//! 0.25 s/GB, 12.8 → 15.4 Gbit/s); on 2026-12-03, a quieter and faster
//! host, the same test gave the opposite (64 KiB pipes 15.0, grown 13.1
//! Gbit/s, two runs each): to be measured again before it is changed. At
//! most [`LARGE_PIPES`] pipes are grown:
//! the kernel counts a pipe's capacity against `fs.pipe-user-pages-soft`
//! (64 MiB per user by default) and, past it, makes every new pipe of an
//! unprivileged user two pages, which would cost every later flow.
//! With `tune.pipesize`, every pipe has that size, as HAProxy's.
//!
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

/// The size a bulk flow's pipe grows to without `tune.pipesize`.
pub const BULK_PIPE_SIZE: usize = 1 << 20;
/// Most pipes grown to [`BULK_PIPE_SIZE`] at once: 32 MiB of capacity, half
/// of the kernel's default `fs.pipe-user-pages-soft` (see the module doc).
pub const LARGE_PIPES: usize = 32;

/// One pipe: read end, write end, actual capacity in bytes.
#[derive(Debug)]
pub struct Pipe {
    pub(crate) rd: OwnedFd,
    pub(crate) wr: OwnedFd,
    pub(crate) cap: usize,
    generation: u64,
    /// Grown by [`Lease::grow`]: counted in `Inner::large`.
    large: bool,
}

#[derive(Debug)]
struct Inner {
    pipesize: Option<usize>,
    maxpipes: usize,
    generation: u64,
    free: Vec<Pipe>,
    in_use: usize,
    /// Pipes alive (in use or free) that were grown.
    large: usize,
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
                large: 0,
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
        let grown = g.free.iter().filter(|p| p.large).count();
        g.large -= grown;
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
            large: false,
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
        } else if pipe.large {
            // `pipe` drops here: both ends closed, bytes discarded.
            g.large -= 1;
        }
    }

    /// Grow `pipe` to [`BULK_PIPE_SIZE`] if this pool sizes pipes itself (no
    /// `tune.pipesize`) and fewer than [`LARGE_PIPES`] are grown.
    fn grow(&self, pipe: &mut Pipe) {
        if pipe.large || pipe.cap >= BULK_PIPE_SIZE {
            return;
        }
        let mut g = self.lock();
        if g.pipesize.is_some() || pipe.generation != g.generation || g.large >= LARGE_PIPES {
            return;
        }
        // The bytes already in the pipe fit: the kernel only refuses to
        // shrink below them (EBUSY), or EPERM past the user's page limits.
        match sys_pipe::set_pipe_size(pipe.wr.as_fd(), BULK_PIPE_SIZE) {
            Ok(cap) if cap > pipe.cap => {
                pipe.cap = cap;
                pipe.large = true;
                g.large += 1;
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "F_SETPIPE_SZ failed; the pipe keeps its size"),
        }
    }

    /// Pipes grown to [`BULK_PIPE_SIZE`] now alive.
    pub fn large(&self) -> usize {
        self.lock().large
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

    /// The flow filled its pipe: grow it for bulk (see the module doc).
    pub fn grow(&mut self) {
        if let Some(p) = self.pipe.as_mut() {
            self.pool.grow(p);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_sized_pipe_grows_once_for_bulk_and_within_the_bound() {
        let pool = PipePool::new(None, 2 * LARGE_PIPES);
        let mut leases: Vec<Lease<'_>> = (0..LARGE_PIPES + 1)
            .map(|_| {
                let mut l = Lease::lazy(&pool);
                assert!(l.fill());
                l
            })
            .collect();
        let small = leases[0].pipe.as_ref().map_or(0, |p| p.cap);
        assert!(small < BULK_PIPE_SIZE, "kernel default {small}");
        for l in &mut leases {
            l.grow();
            l.grow();
        }
        let caps: Vec<usize> = leases
            .iter()
            .map(|l| l.pipe.as_ref().map_or(0, |p| p.cap))
            .collect();
        assert!(caps[..LARGE_PIPES].iter().all(|c| *c == BULK_PIPE_SIZE));
        assert_eq!(
            caps[LARGE_PIPES], small,
            "past the bound a pipe keeps its size"
        );
        assert_eq!(pool.large(), LARGE_PIPES);
        // A grown pipe pooled empty stays counted; one closed is not.
        let mut first = leases.remove(0);
        first.idle();
        assert_eq!((pool.large(), pool.free()), (LARGE_PIPES, 1));
        let mut held = leases.remove(0);
        held.pending = 1;
        drop(held);
        assert_eq!(pool.large(), LARGE_PIPES - 1);
        // A new configuration closes the free grown pipe.
        pool.configure(None, 2 * LARGE_PIPES);
        assert_eq!((pool.large(), pool.free()), (LARGE_PIPES - 2, 0));
    }

    #[test]
    fn a_configured_pipesize_is_never_grown() {
        let pool = PipePool::configured(Some(8192), 4);
        let mut l = Lease::lazy(&pool);
        assert!(l.fill());
        l.grow();
        assert_eq!(l.pipe.as_ref().map(|p| p.cap), Some(8192));
        assert_eq!(pool.large(), 0);
    }
}
