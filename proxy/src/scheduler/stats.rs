//! Per-thread scheduler counters and per-task-name profiling.
//!
//! Owns: the counters a worker updates (only from its own thread, so plain
//! integers behind the worker's `RefCell`/`Cell`s) and the snapshot type the CLI
//! reads ([`ThreadStats`]); the process-wide profiling mode; the small pure
//! pieces of arithmetic behind `show activity` (sliding loop-time average,
//! per-period counters, the `auto` profiling rule), each unit-tested.
//!
//! Profiling (HAProxy `show profiling tasks`): at wake the time is recorded; at
//! run `lat += run - wake` and `calls += 1`; after the run `cpu += end - run`.
//! To keep it to one clock read per run, a wake made while a task runs is stamped
//! with that task's start time (so `lat` may include part of the waker's own run),
//! and a run's start is the previous run's end (so scheduler bookkeeping between
//! two runs is charged to the second).
//!
//! Modes (`set profiling tasks on|auto|off`): the process-wide mode is read by
//! each worker once per loop, which decides for itself whether its profiling is
//! active: `on` always, `off` never, `auto` when its own average loop time
//! reaches [`AUTO_ON_US`] and until it falls below [`AUTO_OFF_US`] (HAProxy's
//! rule). `on` also resets every worker's table (each worker clears its own at
//! its next loop, seeing the reset epoch change). The default is `auto`, as in
//! HAProxy: a lightly loaded worker pays no clock read per run.
//!
//! Stolen CPU time (`cpust_ms_*`) needs the thread's CPU clock, a real syscall
//! (~0.4 µs here) read twice per loop, so it is measured only while the worker's
//! profiling is active: always with `on`, and with `auto` exactly when loops are
//! slow, which is when stolen time matters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Encoding of [`ProfilingMode`] in [`MODE`].
const MODE_OFF: u8 = 0;
const MODE_ON: u8 = 1;
const MODE_AUTO: u8 = 2;

/// Process-wide mode; `auto` by default (see the module header). A static
/// (like the two below) because each worker's executor loop reads it between
/// tasks, where it holds no runtime, and `set profiling` sets it for all.
static MODE: AtomicU8 = AtomicU8::new(MODE_AUTO);

/// Bumped by `set profiling tasks on`: a worker that sees it change clears its table.
static RESET_EPOCH: AtomicU64 = AtomicU64::new(0);

/// Workers whose profiling is active now (for `auto-on` / `auto-off`).
static ACTIVE_WORKERS: AtomicUsize = AtomicUsize::new(0);

/// Average loop time (µs) at which `auto` switches a worker's profiling on
/// (HAProxy: 1 ms per loop on average).
pub const AUTO_ON_US: u64 = 1000;

/// Average loop time (µs) below which `auto` switches it off again (99% of
/// [`AUTO_ON_US`]: the gap keeps a loop hovering at the threshold from flapping).
pub const AUTO_OFF_US: u64 = AUTO_ON_US * 99 / 100;

/// Samples of the sliding loop-time average (HAProxy's TIME_STATS_SAMPLES):
/// long enough that one slow loop does not flip `auto`, short enough to follow a
/// load change within a fraction of a second of busy loops.
pub const LOOP_AVG_SAMPLES: u64 = 512;

/// Stolen CPU time below this per loop is not counted (HAProxy's half
/// millisecond: smaller gaps are clock noise and ordinary scheduling).
pub const STOLEN_MIN_NS: u64 = 500_000;

/// Periods of the `cpust_ms_1s` and `cpust_ms_15s` counters.
pub const CPUST_PERIOD_1S_NS: u64 = 1_000_000_000;
pub const CPUST_PERIOD_15S_NS: u64 = 15_000_000_000;

/// `set profiling tasks on|auto|off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfilingMode {
    Off,
    On,
    Auto,
}

/// Set the process-wide profiling mode; `On` also resets every worker's table.
pub fn set_profiling_mode(mode: ProfilingMode) {
    let v = match mode {
        ProfilingMode::Off => MODE_OFF,
        ProfilingMode::On => {
            RESET_EPOCH.fetch_add(1, Ordering::AcqRel);
            MODE_ON
        }
        ProfilingMode::Auto => MODE_AUTO,
    };
    MODE.store(v, Ordering::Release);
}

/// The process-wide profiling mode.
pub fn profiling_mode() -> ProfilingMode {
    match MODE.load(Ordering::Acquire) {
        MODE_OFF => ProfilingMode::Off,
        MODE_AUTO => ProfilingMode::Auto,
        _ => ProfilingMode::On,
    }
}

/// Turn task profiling on (resetting the tables) or off for every worker.
pub fn set_profiling(on: bool) {
    set_profiling_mode(if on {
        ProfilingMode::On
    } else {
        ProfilingMode::Off
    });
}

/// Whether task profiling may run (`on`, or `auto`).
pub fn profiling() -> bool {
    profiling_mode() != ProfilingMode::Off
}

/// HAProxy's status word for `show profiling`: `on`, `off`, `auto-on` (some
/// worker has switched its profiling on) or `auto-off`.
pub fn profiling_status() -> &'static str {
    match profiling_mode() {
        ProfilingMode::On => "on",
        ProfilingMode::Off => "off",
        ProfilingMode::Auto if ACTIVE_WORKERS.load(Ordering::Relaxed) > 0 => "auto-on",
        ProfilingMode::Auto => "auto-off",
    }
}

pub(crate) fn reset_epoch() -> u64 {
    RESET_EPOCH.load(Ordering::Acquire)
}

/// A worker's profiling switched on (`true`) or off.
pub(crate) fn note_active(on: bool) {
    if on {
        ACTIVE_WORKERS.fetch_add(1, Ordering::Relaxed);
    } else {
        ACTIVE_WORKERS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether a worker's profiling is active after a loop, given the mode, whether
/// it was active, and its average loop time (HAProxy's hysteresis for `auto`).
pub fn profiling_active(mode: ProfilingMode, active: bool, avg_loop_us: u64) -> bool {
    match mode {
        ProfilingMode::On => true,
        ProfilingMode::Off => false,
        ProfilingMode::Auto if active => avg_loop_us >= AUTO_OFF_US,
        ProfilingMode::Auto => avg_loop_us >= AUTO_ON_US,
    }
}

/// Add one sample `v` to a sliding sum over `n` samples (`sum` ≈ n × average):
/// the oldest share (`ceil(sum / n)`) leaves, `v` enters. A constant input `v`
/// makes [`swrate_avg`] converge to exactly `v`.
pub fn swrate_add(sum: u64, n: u64, v: u64) -> u64 {
    sum.saturating_sub(sum.div_ceil(n.max(1))).saturating_add(v)
}

/// The average held by a sliding sum over `n` samples.
pub fn swrate_avg(sum: u64, n: u64) -> u64 {
    sum.div_ceil(n.max(1))
}

/// Events per period, read as "the last full period" (HAProxy's freq_ctr): the
/// current period's count plus the previous period's count weighted by the part
/// of the period not yet elapsed. Times are ns on the owner's clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreqCtr {
    period_ns: u64,
    /// Start of the current period.
    start: u64,
    curr: u64,
    prev: u64,
}

impl FreqCtr {
    pub fn new(period_ns: u64) -> Self {
        Self {
            period_ns: period_ns.max(1),
            ..Self::default()
        }
    }

    /// Count `v` events at `now`.
    pub fn add(&mut self, now: u64, v: u64) {
        let p = self.period_ns;
        let elapsed = now.saturating_sub(self.start);
        if elapsed >= p {
            self.prev = if elapsed >= 2 * p { 0 } else { self.curr };
            self.curr = 0;
            self.start = now - elapsed % p;
        }
        self.curr = self.curr.saturating_add(v);
    }

    /// The rate at `now` (events per period).
    pub fn read(&self, now: u64) -> u64 {
        let p = self.period_ns;
        let elapsed = now.saturating_sub(self.start);
        let (prev, curr, into) = if elapsed >= 2 * p {
            (0, 0, 0)
        } else if elapsed >= p {
            (self.curr, 0, elapsed - p)
        } else {
            (self.prev, self.curr, elapsed)
        };
        let weighted = u128::from(prev) * u128::from(p - into) / u128::from(p);
        curr.saturating_add(u64::try_from(weighted).unwrap_or(u64::MAX))
    }
}

/// A task run at least this long is logged at debug level (while profiling).
const SLOW_RUN_NS: u64 = 10_000_000;

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
    /// Times the worker found nothing queued and parked in the reactor.
    pub empty_rq: u64,
    /// Loops that ended with work still queued (budget exhausted).
    pub long_rq: u64,
    /// Reactor turns taken without sleeping because work was pending.
    pub wake_tasks: u64,
    /// Reactor turns during which the reactor woke at least one task (I/O
    /// readiness or a timer: tokio does not tell them apart).
    pub poll_io: u64,
    /// Runs of the per-flow task ([`super::FLOW_TASK`]).
    pub stream_calls: u64,
    /// Connections accepted by this worker's listeners.
    pub accepted: u64,
    /// Warm server spares taken from a sibling thread's pool (`crate::pool`).
    pub fd_takeover: u64,
    /// Sliding sum of the awake time per loop, µs (see [`swrate_avg`]).
    pub loop_us_sum: u64,
    /// Whether this worker's task profiling is active now.
    pub profiling_active: bool,
    /// Stolen CPU time counted (ns): wall time of a loop minus the CPU time the
    /// thread got during it, when at least [`STOLEN_MIN_NS`]. Measured only while
    /// the worker's profiling is active (two CPU-clock reads per loop).
    pub cpust_ns: u64,
    /// Stolen CPU time over the last second and the last 15 seconds (ns).
    pub cpust_1s_ns: u64,
    pub cpust_15s_ns: u64,
    /// Per task name, in first-spawn order.
    pub profiling: Vec<TaskProfile>,
}

impl ThreadStats {
    /// Average awake time of a loop, µs.
    pub fn avg_loop_us(&self) -> u64 {
        swrate_avg(self.loop_us_sum, LOOP_AVG_SAMPLES)
    }
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
            if cpu_ns >= SLOW_RUN_NS {
                // HAProxy warns of a stuck thread; a run this long delays every
                // other task of the worker by as much.
                tracing::debug!(task = e.name, ms = cpu_ns / 1_000_000, "long task run");
            }
            e.calls += 1;
            e.lat_ns = e.lat_ns.saturating_add(lat_ns);
            e.cpu_ns = e.cpu_ns.saturating_add(cpu_ns);
        }
    }

    /// Zero every entry (names stay interned: spawned tasks keep their index).
    pub(crate) fn reset(&mut self) {
        for e in &mut self.entries {
            e.calls = 0;
            e.cpu_ns = 0;
            e.lat_ns = 0;
        }
    }
}
