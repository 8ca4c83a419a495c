//! How many warm spares a server needs: HAProxy's `est_need` estimator, adapted to
//! spares. Pure arithmetic, no I/O, unit-tested on its own.
//!
//! HAProxy sizes idle HTTP connections as `used + idle <= need`, since an idle
//! connection is a used one coming back. A spare never comes back: each new flow
//! consumes one, so the pool must hold as many spares as the flows it should
//! absorb without a connect, which is the recent peak of concurrent flows itself.
//! Hence, each purge period:
//!
//! - `est_need = max((est_need + max_used) / 2, max_used)` (HAProxy's formula);
//! - `need = max(est_need, max_used, prev_max_used)`: the max used over the last
//!   two periods, or the decaying estimate when that is higher;
//! - `excess = idle - need`; kill `ceil(excess / 2)`, oldest first;
//! - `prev_max_used = max_used`, `max_used = used_now`.
//!
//! Between periods the pool refills toward the same `need` (capped by
//! `pool-max-conn`), so purge and refill never fight. With 10 spares left by a
//! burst of 10 and no use afterwards, successive periods leave 10, 10, 6, 3, 1, 0;
//! under a steady 4 concurrent flows the pool settles at 4.

/// Sizing state of one server (guarded by the pool's sizing lock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sizing {
    /// Peak of concurrent flows during the current period.
    pub max_used: usize,
    /// Peak of the previous period.
    pub prev_max_used: usize,
    /// HAProxy's `est_need`.
    pub est_need: usize,
}

impl Sizing {
    /// The spares wanted now.
    pub fn need(&self) -> usize {
        self.est_need.max(self.max_used).max(self.prev_max_used)
    }

    /// A flow started: `used_now` flows run on the server.
    pub fn note_used(&mut self, used_now: usize) {
        self.max_used = self.max_used.max(used_now);
    }

    /// End of a purge period with `idle` spares and `used_now` flows running:
    /// returns how many spares to kill (oldest first).
    pub fn period_end(&mut self, idle: usize, used_now: usize) -> usize {
        self.est_need = (self.est_need.saturating_add(self.max_used) / 2).max(self.max_used);
        let need = self.need();
        self.prev_max_used = self.max_used;
        self.max_used = used_now;
        idle.saturating_sub(need).div_ceil(2)
    }
}

/// Target spares on one thread: the need, capped by `pool-max-conn` (`-1` =
/// unlimited), shared evenly among `nbthread` threads, rounded up.
pub fn per_thread_target(need: usize, max_conn: i64, nbthread: usize) -> usize {
    let capped = match usize::try_from(max_conn) {
        Ok(max) => need.min(max),
        Err(_) => need, // -1: unlimited
    };
    capped.div_ceil(nbthread.max(1))
}
