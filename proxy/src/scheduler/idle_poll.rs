//! How long a worker that ran out of work keeps polling the reactor (without
//! blocking) before it sleeps in it: an adaptive window, the kernel's
//! `haltpoll` governor's rule applied to a worker thread.
//!
//! Why: a sleeping worker is woken by the CPU whose softirq made its socket
//! ready, through an inter-processor interrupt, which a virtual machine pays
//! for with an exit to the hypervisor on the sending CPU. Where load
//! generators, servers and the proxy share two CPUs, that CPU is the busy one,
//! and a proxy that does less work per event than HAProxy sleeps more often
//! than it and costs that CPU more: 2026-12-08, `redis-benchmark -k 0 -c 4`
//! through `nbthread 1` (both proxies on CPU 1, redis on CPU 0), shunt slept
//! 0.34–0.48 times per connection against HAProxy's 0.25–0.30 and made
//! 0.92x of its connections a second (median of 10 alternating triples);
//! polling 30 µs before each sleep made it 1.01x (0.94–1.12), 1.06x of
//! itself without. HAProxy's `busy-polling` (off by default there) never
//! sleeps; this polls only while events come soon after the worker ran dry.
//!
//! The rule: after an idle period (polling, then maybe sleeping) of `idle`
//! ns with the window at `w`:
//! - an event came while polling: `w` stays;
//! - it came after the worker fell asleep, but within [`MAX_NS`]: polling
//!   longer would have caught it, so `w` doubles (at least [`START_NS`], at
//!   most [`MAX_NS`]);
//! - it came later than [`MAX_NS`]: polling was wasted, `w` halves, and
//!   below [`START_NS`] it is 0 (a worker that is idle for long polls never,
//!   so an idle or lightly loaded proxy spends no CPU on it).
//!
//! Must not: poll past [`MAX_NS`] after running dry, or delay an event (a
//! poll is a non-blocking reactor turn: what it finds runs at once).

/// The longest poll: the window that measured the gain above (30 µs; ~45 µs
/// pass between two events of a connection there).
pub const MAX_NS: u64 = 30_000;

/// The first non-zero window, and the smallest: a worker whose window would
/// fall below it stops polling.
pub const START_NS: u64 = 5_000;

/// The next window after an idle period of `idle_ns` that began with the
/// window at `window_ns`; `caught` says whether an event ended it while the
/// worker was still polling.
pub fn next_window(window_ns: u64, caught: bool, idle_ns: u64) -> u64 {
    if caught {
        return window_ns;
    }
    if idle_ns <= MAX_NS {
        return (window_ns * 2).clamp(START_NS, MAX_NS);
    }
    let halved = window_ns / 2;
    if halved < START_NS {
        0
    } else {
        halved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_sleep_opens_the_window_and_grows_it_to_the_cap() {
        let mut w = 0;
        w = next_window(w, false, 12_000);
        assert_eq!(w, START_NS);
        w = next_window(w, false, 12_000);
        assert_eq!(w, 2 * START_NS);
        for _ in 0..10 {
            w = next_window(w, false, 20_000);
        }
        assert_eq!(w, MAX_NS);
    }

    #[test]
    fn a_caught_event_keeps_the_window() {
        assert_eq!(next_window(20_000, true, 3_000), 20_000);
        assert_eq!(next_window(0, true, 0), 0);
    }

    #[test]
    fn long_idle_periods_close_the_window() {
        let mut w = MAX_NS;
        let mut steps = 0;
        while w > 0 {
            w = next_window(w, false, 1_000_000);
            steps += 1;
            assert!(steps < 10, "the window never closed");
        }
        // An idle worker stays closed.
        assert_eq!(next_window(0, false, 5_000_000_000), 0);
    }
}
