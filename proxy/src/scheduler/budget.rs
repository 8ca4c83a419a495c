//! Budget arithmetic of one scheduler loop, as pure functions.
//!
//! Owns: the class weights, the default run-queue depth for a thread count, and
//! the per-class budgets of one loop. Nothing here touches a queue or a clock,
//! so every rule is unit-tested in isolation (see `tests.rs`).
//!
//! Rules (HAProxy `task.c`, `process_runnable_tasks`):
//! - `max_processed` starts at the run-queue depth; when the total queued work is
//!   more than the depth but at most twice it, it becomes `total / 2` so the
//!   backlog is cut into two equal halves (better latency than depth + remainder).
//! - A loop runs in rounds. Each round, each class that is non-empty gets
//!   `ceil(max_processed * weight / sum of the weights of the non-empty classes)`;
//!   empty classes get 0. After a round, `max_processed` is reduced by what ran
//!   and, if some remains and work was queued meanwhile (tasks woke tasks), another
//!   round runs with budgets computed afresh ([`round_budgets`]).
//! - The heavy class gets its weight in the first round only if it is non-empty
//!   then; it is never refilled within a loop, and what it did not use carries
//!   over to the next round (its budget is not lost when unused: it becomes its
//!   weight in the next round). Its budget is capped by [`heavy_limit`]: one task
//!   per loop while any other class has work (or always, in low-latency mode),
//!   `1 + total / HEAVY_ALONE_BATCH` when heavy work is all there is.
//! - `tune.sched.heavy-cap off` (a benchmark knob, [`Rules::heavy_cap`]) lifts
//!   the cap and refills the heavy class every round like the others.

/// Class weights, indexed by `Class::index()`: Urgent, Normal, Bulk, Heavy
/// (HAProxy's defaults since 2.4: about 50%, 37%, 13% and "one").
pub const CLASS_WEIGHTS: [usize; 4] = [64, 48, 16, 1];

/// Heavy tasks (TLS handshakes in HAProxy) may monopolise a thread; one per loop
/// keeps every other class's latency bounded by a single heavy run.
pub const HEAVY_PER_LOOP: usize = 1;

/// With nothing but heavy work queued, one more heavy task per this many queued
/// may run in a loop (HAProxy's later rule): a backlog of heavy work drains
/// faster when nothing else waits behind it.
pub const HEAVY_ALONE_BATCH: usize = 128;

/// Scheduling rules of one worker that change the budgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// `tune.sched.low-latency`: heavy work is always one per loop.
    pub low_latency: bool,
    /// The one-heavy-per-loop rule (on unless `tune.sched.heavy-cap off`).
    pub heavy_cap: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            low_latency: false,
            heavy_cap: true,
        }
    }
}

/// Default depth with one thread (HAProxy reference point: 280 with 1 thread,
/// 186 with 2).
pub const RUNQUEUE_DEPTH_ONE_THREAD: usize = 280;

/// Floor of the default depth: below this a loop no longer amortises the cost of
/// a reactor turn, and every class must still get at least one slot.
pub const RUNQUEUE_DEPTH_MIN: usize = 40;

/// Ceiling for a configured depth: a loop longer than this starves the reactor
/// (timers and I/O readiness) for too long.
pub const RUNQUEUE_DEPTH_MAX: usize = 100_000;

/// Default run-queue depth for `nbthread` threads.
///
/// Formula: `max(RUNQUEUE_DEPTH_MIN, 2 * 280 / (nbthread + 1))`, which gives the
/// two reference points exactly (1 thread: 560/2 = 280; 2 threads: 560/3 = 186)
/// and shrinks the per-loop batch as threads are added (each thread then holds
/// fewer connections, and shorter loops keep its latency low): 3 threads 140,
/// 4 threads 112, 8 threads 62, 13 or more threads 40.
pub fn default_runqueue_depth(nbthread: usize) -> usize {
    let n = nbthread.max(1);
    (2 * RUNQUEUE_DEPTH_ONE_THREAD / (n + 1)).max(RUNQUEUE_DEPTH_MIN)
}

/// Clamp a configured depth into `1..=RUNQUEUE_DEPTH_MAX`.
pub fn clamp_runqueue_depth(depth: usize) -> usize {
    depth.clamp(1, RUNQUEUE_DEPTH_MAX)
}

/// The most entries one loop may run, given the depth and the total queued at
/// its start: the depth, or `total / 2` when `depth < total <= 2 * depth`.
pub fn max_processed(depth: usize, total: usize) -> usize {
    if total > depth && total <= depth.saturating_mul(2) {
        total / 2
    } else {
        depth
    }
}

/// Most heavy tasks one loop may run, given what is queued per class.
pub fn heavy_limit(queued: [usize; 4], rules: Rules) -> usize {
    let others = queued[..3].iter().any(|&n| n > 0);
    if rules.low_latency || others {
        HEAVY_PER_LOOP
    } else {
        1 + queued[3] / HEAVY_ALONE_BATCH
    }
}

/// Per-class budgets of one round: `max_processed` shared among the non-empty
/// classes by weight (rounded up, as in HAProxy; the sum may exceed
/// `max_processed` by up to 3). `heavy_weight` is the heavy class's weight this
/// round: `CLASS_WEIGHTS[3]` in the first round when it is non-empty, then what
/// it left unused (see the module header); it counts only while heavy work is
/// queued. With `rules.heavy_cap` the heavy budget is capped by [`heavy_limit`].
pub fn round_budgets(
    max_processed: usize,
    queued: [usize; 4],
    heavy_weight: usize,
    rules: Rules,
) -> [usize; 4] {
    let weights: [usize; 4] = std::array::from_fn(|c| match (c, queued[c]) {
        (_, 0) => 0,
        (3, _) => heavy_weight,
        _ => CLASS_WEIGHTS[c],
    });
    let weight_sum: usize = weights.iter().sum();
    let mut out = [0usize; 4];
    if weight_sum == 0 {
        return out;
    }
    for c in 0..4 {
        out[c] = (max_processed.saturating_mul(weights[c])).div_ceil(weight_sum);
    }
    if rules.heavy_cap {
        out[3] = out[3].min(heavy_limit(queued, rules));
    }
    out
}

/// Per-class budgets of the first round of a loop, given the run-queue depth and
/// the number of entries queued in each class (Urgent, Normal, Bulk, Heavy) at
/// loop start, with the default rules.
pub fn budgets(depth: usize, queued: [usize; 4]) -> [usize; 4] {
    let total: usize = queued.iter().sum();
    round_budgets(
        max_processed(depth, total),
        queued,
        CLASS_WEIGHTS[3],
        Rules::default(),
    )
}

/// What one loop runs per class when nothing is queued during it and no task is
/// met twice: the rounds of the worker's loop as a pure function (tests compare
/// the real loop's trace with it).
#[cfg(test)]
pub(crate) fn plan_loop(depth: usize, queued: [usize; 4], rules: Rules) -> [usize; 4] {
    let mut q = queued;
    let mut left = max_processed(depth, q.iter().sum());
    let mut heavy_weight = if q[3] > 0 { CLASS_WEIGHTS[3] } else { 0 };
    let mut ran = [0usize; 4];
    loop {
        if !rules.heavy_cap {
            heavy_weight = CLASS_WEIGHTS[3];
        }
        let b = round_budgets(left, q, heavy_weight, rules);
        let mut done = 0;
        let mut heavy_ran = 0;
        for c in 0..4 {
            let n = b[c].min(q[c]);
            q[c] -= n;
            ran[c] += n;
            done += n;
            if c == 3 {
                heavy_ran = n;
            }
        }
        heavy_weight = b[3] - heavy_ran;
        left = left.saturating_sub(done);
        if done == 0 || left == 0 || q.iter().sum::<usize>() == 0 {
            return ran;
        }
    }
}
