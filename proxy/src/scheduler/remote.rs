//! The cross-thread door of one worker: its inbox and the handle other threads hold.
//!
//! Owns: [`Shared`] (the `Send + Sync` half of a worker: inbox sender, "something
//! arrived" flag, the waker of the worker's tokio `block_on`) and [`Remote`].
//! Must not: touch the worker's run queues (they are thread-local); messages are
//! turned into queue entries by the worker itself when it drains the inbox.
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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::task::Waker;

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
