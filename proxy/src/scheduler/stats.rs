//! Per-thread scheduler counters and per-task-name profiling.
//!
//! Owns: the counters a worker updates (only from its own thread, so plain
//! integers behind the worker's `RefCell`/`Cell`s) and the snapshot type the CLI
//! reads ([`ThreadStats`]); the process-wide profiling switch.
//!
//! Profiling (HAProxy `show profiling tasks`): at wake the time is recorded; at
//! run `lat += run - wake` and `calls += 1`; after the run `cpu += end - run`.
//! To keep it to one clock read per run, a wake made while a task runs is stamped
//! with that task's start time (so `lat` may include part of the waker's own run),
//! and a run's start is the previous run's end (so scheduler bookkeeping between
//! two runs is charged to the second).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// Process-wide switch (`set profiling tasks on|off`); on by default: it costs
/// one clock read per task run.
static PROFILING: AtomicBool = AtomicBool::new(true);

/// Turn task profiling on or off for every worker.
pub fn set_profiling(on: bool) {
    PROFILING.store(on, Ordering::Relaxed);
}

/// Whether task profiling is on.
pub fn profiling() -> bool {
    PROFILING.load(Ordering::Relaxed)
}

/// Profiling totals for one task name on one thread.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskProfile {
    pub name: &'static str,
    /// Number of runs (polls).
    pub calls: u64,
    /// Total time spent running, in nanoseconds.
    pub cpu_ns: u64,
    /// Total time between wake and run, in nanoseconds.
    pub lat_ns: u64,
}

/// Snapshot of one worker's scheduler (for `show activity` / `show profiling`).
#[derive(Clone, Debug, Default)]
pub struct ThreadStats {
    pub thread_id: usize,
    /// Scheduler loops run (each loop ends with a reactor turn).
    pub loops: u64,
    /// Tasks (and remote jobs, counted as Urgent) run, per class (`Class::index()`).
    pub run: [u64; 4],
    /// Entries queued now, per class (remote jobs counted as Urgent).
    pub queued: [usize; 4],
    /// Per-class runs of the last completed loop.
    pub last_loop: [u32; 4],
    /// Live tasks (spawned, not yet finished).
    pub tasks: usize,
    /// Wakes that arrived from other threads.
    pub remote_wakes: u64,
    /// `Remote::run` jobs executed.
    pub remote_jobs: u64,
    /// Per task name, in first-spawn order.
    pub profiling: Vec<TaskProfile>,
}

/// Per-name profiling table of one worker: names are interned at spawn, so a
/// run only indexes a vector.
#[derive(Default)]
pub(crate) struct ProfTable {
    index: HashMap<&'static str, u32>,
    pub(crate) entries: Vec<TaskProfile>,
}

impl ProfTable {
    pub(crate) fn intern(&mut self, name: &'static str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        // Names are `&'static str` literals: their count is tiny and fixed.
        let i = self.entries.len() as u32;
        self.entries.push(TaskProfile {
            name,
            ..TaskProfile::default()
        });
        self.index.insert(name, i);
        i
    }

    pub(crate) fn record(&mut self, idx: u32, lat_ns: u64, cpu_ns: u64) {
        if let Some(e) = self.entries.get_mut(idx as usize) {
            e.calls += 1;
            e.lat_ns = e.lat_ns.saturating_add(lat_ns);
            e.cpu_ns = e.cpu_ns.saturating_add(cpu_ns);
        }
    }

    pub(crate) fn count_call(&mut self, idx: u32) {
        if let Some(e) = self.entries.get_mut(idx as usize) {
            e.calls += 1;
        }
    }
}
