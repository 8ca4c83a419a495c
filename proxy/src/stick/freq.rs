//! HAProxy's frequency counters ("freq_ctr"): event rates over a sliding
//! window of one period, kept in three words.
//!
//! Owns [`FreqCtr`] and its arithmetic, on a caller-given clock (`now`, in
//! milliseconds, wrapping as HAProxy's `now_ms` does), so it is pure and
//! testable without time passing. Must not read a clock itself.
//!
//! Semantics (HAProxy's `update_freq_ctr_period` / `read_freq_ctr_period`):
//! the counter holds the events of the current period (`curr`), the count of
//! the period before (`prev`), and when the current period began (`tick`).
//! An event in a period that is over rotates first: the current count becomes
//! the previous one (or 0 when more than one whole period went by) and the
//! new period starts where the old one ended (or now, after a gap). A read
//! estimates the events of the last `period` ms as the current count plus
//! the previous period's share that still lies inside the window:
//! `curr + prev * (period - elapsed) / period`, in integers, rounded down.
//! A counter never touched reads 0; its first event starts its first period.

/// One frequency counter. The period is the table's, passed to each call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FreqCtr {
    /// When the current period began (ms, wrapping).
    tick: u32,
    curr: u32,
    prev: u32,
}

impl FreqCtr {
    /// Counts `inc` events at `now`; returns the current period's count.
    pub fn add(&mut self, now: u32, period: u32, inc: u32) -> u32 {
        let period = period.max(1);
        if now.wrapping_sub(self.tick) >= period {
            self.prev = self.curr;
            self.curr = 0;
            self.tick = self.tick.wrapping_add(period);
            if now.wrapping_sub(self.tick) >= period {
                // More than one whole period without an event.
                self.prev = 0;
                self.tick = now;
            }
        }
        self.curr = self.curr.saturating_add(inc);
        self.curr
    }

    /// The events over the last `period` ms at `now`.
    pub fn read(&self, now: u32, period: u32) -> u32 {
        let period = period.max(1);
        let (mut curr, mut past) = (u64::from(self.curr), u64::from(self.prev));
        let mut elapsed = now.wrapping_sub(self.tick);
        if elapsed >= period {
            // The current period is over: it is the past one now.
            elapsed -= period;
            past = curr;
            curr = 0;
        }
        if elapsed >= period {
            // The past period is over too: nothing of it is in the window.
            past = 0;
            elapsed = 0;
        }
        let p = u64::from(period);
        let total = past * (p - u64::from(elapsed)) + curr * p;
        u32::try_from(total / p).unwrap_or(u32::MAX)
    }

    /// `set table ... data.conn_rate V`: the current period holds `v` events
    /// from `now` on, and nothing before it.
    pub fn set(&mut self, now: u32, v: u32) {
        *self = FreqCtr {
            tick: now,
            curr: v,
            prev: 0,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Far from 0 so the first event's rotation is the ordinary one.
    const T0: u32 = 1_000_000;

    #[test]
    fn counts_within_one_period() {
        let mut f = FreqCtr::default();
        assert_eq!(f.read(T0, 10_000), 0, "never touched");
        for i in 1..=5 {
            assert_eq!(f.add(T0 + i * 10, 10_000, 1), i);
        }
        assert_eq!(f.read(T0 + 100, 10_000), 5);
    }

    #[test]
    fn the_previous_period_fades_out_linearly() {
        let mut f = FreqCtr::default();
        for _ in 0..10 {
            f.add(T0, 1000, 1);
        }
        // The period began at T0; at T0+1000 it is the previous one, whole.
        assert_eq!(f.read(T0 + 1000, 1000), 10);
        // A quarter into the next period, three quarters of it remain.
        assert_eq!(
            f.read(T0 + 1250, 1000),
            7,
            "10 * 750/1000 = 7.5, rounded down"
        );
        assert_eq!(f.read(T0 + 1500, 1000), 5);
        assert_eq!(f.read(T0 + 1999, 1000), 0, "10 * 1/1000 rounds down to 0");
        assert_eq!(
            f.read(T0 + 2000, 1000),
            0,
            "two periods later nothing is left"
        );
        // An event now rotates: prev = 10 would be stale, so it is dropped.
        f.add(T0 + 2500, 1000, 1);
        assert_eq!(f.read(T0 + 2500, 1000), 1);
    }

    #[test]
    fn events_in_the_next_period_add_to_the_faded_previous_one() {
        let mut f = FreqCtr::default();
        for _ in 0..8 {
            f.add(T0, 1000, 1);
        }
        // Half into the second period: 4 events of it, half of the 8 before.
        for _ in 0..4 {
            f.add(T0 + 1500, 1000, 1);
        }
        assert_eq!(f.read(T0 + 1500, 1000), 4 + 4);
        // The second period began at T0+1000 (aligned), not at its first event.
        assert_eq!(f.read(T0 + 2000, 1000), 4, "8 fully out, 4 wholly past");
    }

    #[test]
    fn wrapping_clock_still_counts() {
        let mut f = FreqCtr::default();
        let near = u32::MAX - 100;
        f.add(near, 1000, 3);
        f.add(near.wrapping_add(200), 1000, 2);
        assert_eq!(f.read(near.wrapping_add(200), 1000), 5);
    }

    #[test]
    fn set_replaces_the_history() {
        let mut f = FreqCtr::default();
        f.add(T0, 1000, 9);
        f.set(T0 + 100, 5);
        assert_eq!(f.read(T0 + 100, 1000), 5);
    }
}
