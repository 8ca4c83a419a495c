//! Per-thread executor with HAProxy's task classes, on a current_thread tokio runtime.
//!
//! Owns: the public scheduler API used by the rest of the daemon. Tokio provides
//! only the reactor and timers of each worker thread; every proxy task is a task
//! of this scheduler (nothing proxy-related uses `tokio::spawn`).
//!
//! - [`run_worker`] builds a current_thread runtime (`enable_all`) on the calling
//!   OS thread, drives the scheduler loop in it under
//!   `tokio::task::coop::unconstrained` (so tokio's 128-poll budget never makes an
//!   inner socket return `Pending`), spawns `main` as a Normal task named "main",
//!   and returns when `main` completes; the other tasks are then dropped.
//! - [`spawn`] queues a task in the given class on the current worker.
//! - Wakes are classified HAProxy's way: from the reactor/timers (no task running)
//!   → Urgent; from another task → Normal; a task waking itself → Bulk; a task
//!   spawned Heavy or marked heavy → Heavy (unless `tune.sched.heavy-cap off`);
//!   from another OS thread → Urgent (Heavy if heavy), through the worker's
//!   inbox. A task woken many times before it runs is queued once.
//! - Per loop: rounds of budgets from `tune.runqueue-depth` and the class weights
//!   (see `budget.rs`), at most one Heavy task while other work is queued, no
//!   task run twice, then one non-blocking reactor turn; with nothing queued the
//!   worker parks in the reactor (no busy loop).
//! - A task marks its heavy work with [`heavy`] / [`enter_heavy`]: while marked,
//!   its wakes land in Heavy.
//!
//! Must not: be entered from async code of another executor; a task must not
//! block the thread. Use [`yield_now`] (not `tokio::task::yield_now`, whose wake
//! is deferred past the reactor turn and therefore lands in Urgent) for a task
//! that wants to let others run (Bulk). A panicking task unwinds out of
//! `run_worker` (as a crash would in HAProxy); its sibling tasks are dropped.

mod budget;
mod remote;
mod stats;
mod task;
mod worker;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::rc::Rc;
use std::task::Poll;

pub use budget::{
    budgets, clamp_runqueue_depth, default_runqueue_depth, heavy_limit, max_processed,
    round_budgets, Rules, CLASS_WEIGHTS, HEAVY_ALONE_BATCH, HEAVY_PER_LOOP, RUNQUEUE_DEPTH_MAX,
    RUNQUEUE_DEPTH_MIN, RUNQUEUE_DEPTH_ONE_THREAD,
};
pub use remote::{load, LoadInfo, Remote, IDLE_WINDOW_NS};
pub use stats::{
    profiling, profiling_active, profiling_mode, profiling_status, set_profiling,
    set_profiling_mode, swrate_add, swrate_avg, FreqCtr, ProfilingMode, TaskProfile, ThreadStats,
    AUTO_OFF_US, AUTO_ON_US, LOOP_AVG_SAMPLES,
};
pub use task::TaskHandle;

use worker::{with_current, Installed, Worker};

/// Name of the per-flow task (accept → route → connect → hand off → close); its
/// runs are counted as `stream_calls` in `show activity`.
pub const FLOW_TASK: &str = "session";

/// Task class (HAProxy TL_URGENT, TL_NORMAL, TL_BULK, TL_HEAVY).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// I/O and timer callbacks, cross-thread messages.
    Urgent,
    /// Tasks woken by other tasks.
    Normal,
    /// Tasks that woke themselves (streaming, long dumps).
    Bulk,
    /// Expensive tasks: at most one per loop.
    Heavy,
}

impl Class {
    /// All classes in run order; `ALL[c.index()] == c`.
    pub const ALL: [Class; 4] = [Class::Urgent, Class::Normal, Class::Bulk, Class::Heavy];

    /// Index into per-class arrays (`ThreadStats::run`, `budgets`, ...).
    pub const fn index(self) -> usize {
        match self {
            Class::Urgent => 0,
            Class::Normal => 1,
            Class::Bulk => 2,
            Class::Heavy => 3,
        }
    }

    /// Lower-case name for CLI output.
    pub const fn name(self) -> &'static str {
        match self {
            Class::Urgent => "urgent",
            Class::Normal => "normal",
            Class::Bulk => "bulk",
            Class::Heavy => "heavy",
        }
    }
}

/// Scheduler settings of one worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedConfig {
    /// Number of worker threads (used for the default run-queue depth).
    pub nbthread: usize,
    /// `tune.runqueue-depth`; `None` = [`default_runqueue_depth`]`(nbthread)`
    /// (280 for 1 thread, 186 for 2, 140 for 3, ...; floor 40).
    pub runqueue_depth: Option<usize>,
    /// `tune.sched.low-latency`.
    pub low_latency: bool,
    /// The one-heavy-per-loop rule; off only with `tune.sched.heavy-cap off`, a
    /// benchmark knob: work marked heavy is then queued by the ordinary wake
    /// rules and the Heavy class is uncapped (shunt as it was before the rule).
    pub heavy_cap: bool,
}

impl SchedConfig {
    /// The effective per-loop depth (configured values clamped to
    /// `1..=RUNQUEUE_DEPTH_MAX`).
    pub fn depth(&self) -> usize {
        match self.runqueue_depth {
            Some(d) => clamp_runqueue_depth(d),
            None => default_runqueue_depth(self.nbthread),
        }
    }

    /// The rules that shape the budgets.
    pub fn rules(&self) -> Rules {
        Rules {
            low_latency: self.low_latency,
            heavy_cap: self.heavy_cap,
        }
    }
}

impl Default for SchedConfig {
    fn default() -> Self {
        Self {
            nbthread: 1,
            runqueue_depth: None,
            low_latency: false,
            heavy_cap: true,
        }
    }
}

/// Errors of the scheduler room.
#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    #[error("worker {thread_id}: cannot build the tokio runtime: {source}")]
    Runtime {
        thread_id: usize,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "worker {thread_id}: run_worker called on a thread that already runs worker {running}"
    )]
    Nested { thread_id: usize, running: usize },
}

/// The tokio runtime a worker runs in: current_thread, with the reactor and
/// the timer. Built ahead by a caller that must register sources with it
/// before the worker starts (the daemon's signals, on the main thread).
pub fn worker_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Like [`run_worker`], but returns start-up errors instead of panicking.
pub fn try_run_worker<F>(thread_id: usize, cfg: SchedConfig, main: F) -> Result<(), SchedError>
where
    F: Future<Output = ()> + 'static,
{
    // Before building a runtime: one dropped inside another's context panics.
    if let Some(running) = with_current(|w| w.thread_id) {
        return Err(SchedError::Nested { thread_id, running });
    }
    let rt = worker_runtime().map_err(|source| SchedError::Runtime { thread_id, source })?;
    try_run_worker_in(rt, thread_id, cfg, main)
}

/// [`try_run_worker`] in `rt`, a runtime from [`worker_runtime`].
pub fn try_run_worker_in<F>(
    rt: tokio::runtime::Runtime,
    thread_id: usize,
    cfg: SchedConfig,
    main: F,
) -> Result<(), SchedError>
where
    F: Future<Output = ()> + 'static,
{
    if let Some(running) = with_current(|w| w.thread_id) {
        // Dropped without waiting: this thread runs a worker's runtime.
        rt.shutdown_background();
        return Err(SchedError::Nested { thread_id, running });
    }
    let worker = Worker::new(thread_id, &cfg);
    let _installed = Installed::new(Rc::clone(&worker), &rt);
    worker.spawn_main(main);
    rt.block_on(tokio::task::coop::unconstrained(worker::sched_main(worker)));
    Ok(())
}

/// Build a current_thread tokio runtime (enable_all) on this OS thread, run the
/// scheduler loop in it (under `tokio::task::coop::unconstrained`), spawn `main`
/// as a Normal task named "main", and return when `main` has completed (other
/// tasks are then dropped).
///
/// # Panics
/// If the runtime cannot be built, or this thread already runs a worker.
pub fn run_worker<F: Future<Output = ()> + 'static>(thread_id: usize, cfg: SchedConfig, main: F) {
    if let Err(e) = try_run_worker(thread_id, cfg, main) {
        panic!("scheduler: {e}");
    }
}

/// Spawn on the current thread's scheduler, queued in `class`; `name` is the
/// profiling key.
///
/// # Panics
/// Off a worker thread.
pub fn spawn<F: Future<Output = ()> + 'static>(
    class: Class,
    name: &'static str,
    fut: F,
) -> TaskHandle {
    match with_current(move |w| w.spawn_local(class, name, fut)) {
        Some(h) => h,
        None => {
            panic!("scheduler::spawn({name:?}) called off a worker thread (only inside run_worker)")
        }
    }
}

/// The time as of the worker's latest clock reading, at most one pass of its
/// loop old (HAProxy's `now_ms`, read once per poll loop): what a flow stamps
/// its activity with, without a clock read per read and write. Off a worker
/// thread (tests), tokio's clock.
pub fn now() -> tokio::time::Instant {
    worker::last_clock().map_or_else(tokio::time::Instant::now, tokio::time::Instant::from_std)
}

/// The current worker's index.
///
/// # Panics
/// Off a worker thread.
pub fn thread_id() -> usize {
    match try_thread_id() {
        Some(id) => id,
        None => panic!("scheduler::thread_id() called off a worker thread"),
    }
}

/// The current worker's index, or `None` off a worker thread.
pub fn try_thread_id() -> Option<usize> {
    with_current(|w| w.thread_id)
}

/// The current worker's [`Remote`] (hand it to other threads).
///
/// # Panics
/// Off a worker thread.
pub fn remote() -> Remote {
    match with_current(|w| Remote {
        shared: std::sync::Arc::clone(&w.shared),
    }) {
        Some(r) => r,
        None => panic!("scheduler::remote() called off a worker thread"),
    }
}

/// Snapshot of the current worker's counters and profiling.
///
/// # Panics
/// Off a worker thread.
pub fn stats() -> ThreadStats {
    match with_current(Worker::snapshot) {
        Some(s) => s,
        None => panic!("scheduler::stats() called off a worker thread"),
    }
}

/// Count a connection accepted by a listener of the current worker
/// (`accepted` in `show activity`); a no-op off a worker thread.
pub fn note_accepted() {
    with_current(Worker::note_accepted);
}

/// Count a warm server spare the current worker took from a sibling thread's
/// pool (`fd_takeover` in `show activity`); a no-op off a worker thread.
pub fn note_takeover() {
    with_current(Worker::note_takeover);
}

/// Class the running task was queued in (`Urgent` inside a remote job); `None`
/// outside a task or off a worker thread.
pub fn current_class() -> Option<Class> {
    with_current(Worker::current_class).flatten()
}

/// While alive, the running task is heavy work: its wakes (its own included) queue
/// it in the Heavy class, which runs at most one task per loop while other work
/// is queued. Take it around work that costs more than ~50 µs per run (a large
/// map load or clear, the chunks of a large dump, bulk BPF map walks), and
/// [`yield_now`] right after taking it so the heavy work itself starts from the
/// Heavy queue ([`heavy`] does both). Dropping it restores the task's previous
/// marking. A no-op outside a task.
#[must_use = "the task is heavy only while the guard lives"]
pub struct HeavyGuard {
    /// The task marked, and its marking before.
    prev: Option<(task::TaskKey, bool)>,
}

impl Drop for HeavyGuard {
    fn drop(&mut self) {
        if let Some((key, prev)) = self.prev {
            with_current(|w| w.set_current_heavy(key, prev));
        }
    }
}

/// Mark the running task heavy until the guard drops (see [`HeavyGuard`]).
pub fn enter_heavy() -> HeavyGuard {
    HeavyGuard {
        prev: with_current(|w| w.mark_current_heavy()).flatten(),
    }
}

/// Mark the running task heavy and requeue it in the Heavy class; the caller
/// runs its heavy work when this returns, and the task stays heavy until the
/// guard drops.
pub async fn heavy() -> HeavyGuard {
    let guard = enter_heavy();
    yield_now().await;
    guard
}

/// Let the other queued tasks run: wakes the calling task (a self-wake, so it is
/// requeued in Bulk) and returns `Pending` once.
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(move |cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
}

#[cfg(test)]
pub(crate) fn set_loop_trace(on: bool) {
    with_current(|w| w.set_trace(on));
}

#[cfg(test)]
pub(crate) fn take_loop_trace() -> Vec<[u32; 4]> {
    with_current(Worker::take_trace).unwrap_or_default()
}
