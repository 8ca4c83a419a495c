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
//! - Each class that is non-empty at the start of the loop gets
//!   `ceil(max_processed * weight / sum of the weights of the non-empty classes)`;
//!   empty classes get 0 (work that lands there during the loop waits for the next).
//! - The heavy class runs at most [`HEAVY_PER_LOOP`] task per loop.

/// Class weights, indexed by `Class::index()`: Urgent, Normal, Bulk, Heavy
/// (HAProxy's defaults since 2.4: about 50%, 37%, 13% and "one").
pub const CLASS_WEIGHTS: [usize; 4] = [64, 48, 16, 1];

/// Heavy tasks (TLS handshakes in HAProxy) may monopolise a thread; one per loop
/// keeps every other class's latency bounded by a single heavy run.
pub const HEAVY_PER_LOOP: usize = 1;

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

/// Per-class budgets of one loop, given the run-queue depth and the number of
/// entries queued in each class (Urgent, Normal, Bulk, Heavy) at loop start.
///
/// The sum may exceed `max_processed` by up to 3 through rounding up (as in
/// HAProxy); the loop also stops a class early when it runs dry.
pub fn budgets(depth: usize, queued: [usize; 4]) -> [usize; 4] {
    let total: usize = queued.iter().sum();
    let mut max_processed = depth;
    if total > depth && total <= depth.saturating_mul(2) {
        max_processed = total / 2;
    }
    let weight_sum: usize = (0..4)
        .filter(|&c| queued[c] > 0)
        .map(|c| CLASS_WEIGHTS[c])
        .sum();
    let mut out = [0usize; 4];
    if weight_sum == 0 {
        return out;
    }
    for c in 0..4 {
        if queued[c] > 0 {
            out[c] = (max_processed * CLASS_WEIGHTS[c]).div_ceil(weight_sum);
        }
    }
    out[3] = out[3].min(HEAVY_PER_LOOP);
    out
}
