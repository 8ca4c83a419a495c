//! The cross-thread door of one worker: its inbox and the handle other threads hold.
//!
//! Owns: [`Shared`] (the `Send + Sync` half of a worker: inbox sender, "something
//! arrived" flag, the waker of the worker's tokio `block_on`) and [`Remote`].
//! Must not: touch the worker's run queues (they are thread-local); messages are
//! turned into queue entries by the worker itself when it drains the inbox.
//!
//! It also carries the load figures `show info` reads without disturbing the
//! worker ([`Published`]: live tasks, queued entries, idle percentage), stored
//! with relaxed atomics once per loop by the worker itself.
//!
//! The inbox is `std::sync::mpsc` (a lock-free linked list since Rust 1.67; the
//! sender is `Sync`). The mutex around the reactor waker is taken only on the
//! `notified` false→true transition, i.e. at most once per worker loop.
//!
//! # Race window
//! A sender does `send(msg)` then `notified.swap(true)`; if the flag was false it
//! wakes the worker. The worker does `notified.swap(false)` then drains. Either
//! the sender's swap comes after the worker's in the flag's modification order
//! (it reads false and wakes the worker, which will drain again), or it comes
//! before (the worker's AcqRel swap reads it, so the send happens-before the
//! drain and the message is seen). No message is left behind with the worker
//! parked.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, PoisonError};
use std::task::Waker;
use std::time::Instant;

use super::stats::ThreadStats;
use super::task::Header;

/// A closure sent to run on a worker's thread.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// One message in a worker's inbox.
pub(crate) enum Inbox {
    /// A task of this worker was woken from another thread (its `queued` flag is set).
    Wake(Arc<Header>),
    /// `Remote::run`: run this closure as an Urgent-class job.
    Run(Job),
}

/// Length of one idle-time sample (HAProxy's half second): `Idle_pct` is the
/// share of the last complete sample the worker spent parked in the reactor.
pub const IDLE_WINDOW_NS: u64 = 500_000_000;

/// Process-wide clock origin for [`Published::parked_at_ms`]: one origin for
/// every worker's executor, which publishes from its loop with no runtime.
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Milliseconds since the process-wide origin, plus one (so 0 means "never").
fn mono_ms() -> u64 {
    let e = EPOCH.get_or_init(Instant::now);
    u64::try_from(e.elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}

/// Load figures of one worker for `show info` (each written by the worker only).
pub(crate) struct Published {
    /// Live tasks (`Tasks`).
    tasks: AtomicUsize,
    /// Entries queued when the current loop started (`Run_queue`); 0 while parked.
    run_queue: AtomicUsize,
    /// Idle share of the last complete sample, percent (`Idle_pct`).
    idle_pct: AtomicU32,
    /// When the worker parked ([`mono_ms`]), 0 while it runs: a worker parked
    /// for a whole sample is idle even though it did not measure it yet.
    parked_at_ms: AtomicU64,
}

impl Published {
    fn new() -> Self {
        Self {
            tasks: AtomicUsize::new(0),
            run_queue: AtomicUsize::new(0),
            idle_pct: AtomicU32::new(100),
            parked_at_ms: AtomicU64::new(0),
        }
    }

    /// Worker side, at the start of a loop.
    pub(crate) fn running(&self, tasks: usize, run_queue: usize) {
        self.tasks.store(tasks, Ordering::Relaxed);
        self.run_queue.store(run_queue, Ordering::Relaxed);
        self.parked_at_ms.store(0, Ordering::Relaxed);
    }

    /// Worker side, before parking.
    pub(crate) fn parking(&self, tasks: usize) {
        self.tasks.store(tasks, Ordering::Relaxed);
        self.run_queue.store(0, Ordering::Relaxed);
        self.parked_at_ms.store(mono_ms(), Ordering::Relaxed);
    }

    /// Worker side, at the end of a sample.
    pub(crate) fn idle_pct(&self, pct: u32) {
        self.idle_pct.store(pct.min(100), Ordering::Relaxed);
    }
}

/// Load of the workers, as `show info` prints it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadInfo {
    /// Live tasks of every worker (`Tasks`).
    pub tasks: usize,
    /// Entries queued at the start of each worker's current loop (`Run_queue`).
    pub run_queue: usize,
    /// Mean idle percentage of the workers (`Idle_pct`).
    pub idle_pct: u32,
}

/// Sum (tasks, run queue) and average (idle) the published figures of `remotes`
/// (workers that have returned are left out; no worker gives 100% idle).
pub fn load(remotes: &[Remote]) -> LoadInfo {
    let now = mono_ms();
    let window_ms = IDLE_WINDOW_NS / 1_000_000;
    let mut out = LoadInfo::default();
    let (mut idle_sum, mut n) = (0u64, 0u64);
    for r in remotes.iter().filter(|r| r.is_alive()) {
        let p = &r.shared.load;
        out.tasks += p.tasks.load(Ordering::Relaxed);
        out.run_queue += p.run_queue.load(Ordering::Relaxed);
        let parked = p.parked_at_ms.load(Ordering::Relaxed);
        let idle = if parked != 0 && now.saturating_sub(parked) >= window_ms {
            100
        } else {
            p.idle_pct.load(Ordering::Relaxed)
        };
        idle_sum += u64::from(idle);
        n += 1;
    }
    out.idle_pct = idle_sum
        .checked_div(n)
        .and_then(|v| u32::try_from(v).ok())
        .unwrap_or(100);
    out
}

/// The part of a worker that other threads may touch.
pub(crate) struct Shared {
    pub(crate) thread_id: usize,
    tx: mpsc::Sender<Inbox>,
    /// Set by senders after a send; cleared by the worker before it drains.
    notified: AtomicBool,
    /// The waker of the worker's `block_on` (unparks its reactor).
    waker: Mutex<Option<Waker>>,
    /// Set when the worker has returned: later messages are dropped.
    closed: AtomicBool,
    /// Load figures for `show info`.
    pub(crate) load: Published,
}

impl Shared {
    pub(crate) fn new(thread_id: usize) -> (Arc<Self>, mpsc::Receiver<Inbox>) {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Self {
            thread_id,
            tx,
            notified: AtomicBool::new(false),
            waker: Mutex::new(None),
            closed: AtomicBool::new(false),
            load: Published::new(),
        });
        (shared, rx)
    }

    /// Queue a message for the worker and wake its reactor if it may be parked.
    /// Messages to a worker that has returned are dropped (on this thread).
    pub(crate) fn send(&self, msg: Inbox) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        if self.tx.send(msg).is_err() {
            return;
        }
        if !self.notified.swap(true, Ordering::AcqRel) {
            let guard = self.waker.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(w) = guard.as_ref() {
                w.wake_by_ref();
            }
        }
    }

    /// Worker side: true if messages may be waiting; clears the flag.
    pub(crate) fn take_notified(&self) -> bool {
        self.notified.swap(false, Ordering::AcqRel)
    }

    /// Worker side: peek at the flag without clearing it.
    pub(crate) fn is_notified(&self) -> bool {
        self.notified.load(Ordering::Acquire)
    }

    /// Worker side: re-raise the flag when a drain stopped early.
    pub(crate) fn renotify(&self) {
        self.notified.store(true, Ordering::Release);
    }

    /// Worker side: install (or replace) the reactor waker.
    pub(crate) fn set_waker(&self, w: &Waker) {
        let mut guard = self.waker.lock().unwrap_or_else(PoisonError::into_inner);
        match guard.as_ref() {
            Some(old) if old.will_wake(w) => {}
            _ => *guard = Some(w.clone()),
        }
    }

    /// Worker side, at exit: refuse later messages and drop the reactor waker
    /// (it holds the runtime handle; keeping it would tie the runtime's lifetime
    /// to stray task wakers).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let mut guard = self.waker.lock().unwrap_or_else(PoisonError::into_inner);
        *guard = None;
    }
}

/// Handle to send work to a worker from any thread.
#[derive(Clone)]
pub struct Remote {
    pub(crate) shared: Arc<Shared>,
}

impl Remote {
    /// Run `f` on the worker's thread as an Urgent-class job (at its next loop).
    /// `f` may call `scheduler::spawn`. If the worker has returned, `f` is dropped
    /// without running.
    pub fn run(&self, f: Box<dyn FnOnce() + Send>) {
        self.shared.send(Inbox::Run(f));
    }

    /// A snapshot of the worker's counters and profiling, taken on its own
    /// thread by an Urgent job; `None` if the worker has returned.
    pub async fn stats(&self) -> Option<ThreadStats> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.run(Box::new(move || {
            if let Some(s) = super::worker::with_current(super::worker::Worker::snapshot) {
                let _ = tx.send(s);
            }
        }));
        rx.await.ok()
    }

    /// The index of the worker this handle reaches.
    pub fn thread_id(&self) -> usize {
        self.shared.thread_id
    }

    /// False once the worker has returned from `run_worker`.
    pub fn is_alive(&self) -> bool {
        !self.shared.closed.load(Ordering::Acquire)
    }
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("thread_id", &self.shared.thread_id)
            .finish()
    }
}
