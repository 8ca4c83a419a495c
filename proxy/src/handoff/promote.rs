//! `forward-mode auto`'s per-flow decision: when a flow that started in
//! userspace forwarding has shown that the kernel path pays for it.
//!
//! Owns: the thresholds, the per-flow evidence (`Watch`) and each worker's
//! count of userspace reads. Must not: move a byte or touch a socket; the
//! direction loops park and `handoff::forward` promotes (see "Promotion" in
//! `handoff`).
//!
//! Inserting a pair into the SOCKHASH, setting its flow entries and deleting
//! them again costs more than it saves on a short flow, and the kernel path
//! runs each small message through the peer's psock backlog in a kworker,
//! which loses to one read and one write when many small flows are busy.
//! BENCHMARKS.md of 2026-11-30 (a quiet machine; sockmap for every flow,
//! against the best userspace mode): new connections ×0.66, redis -c50
//! ×0.68, one bulk stream ×0.93 (splice), but redis -c1 ×1.19, the 64 KiB
//! echo ×1.09 and 4 bulk streams ×1.52. The kernel wins where userspace is
//! the bottleneck: one thread for several bulk flows, or the wake-ups of
//! request/response turns; it loses where each message is small and many
//! flows are busy, and it gains nothing on one bulk stream a thread keeps
//! up with. So a flow is promoted on one of two kinds of evidence:
//!
//! - **an elephant among others**, only with `tune.sockmap.promote-bytes`:
//!   it has moved [`Promote::bytes`] in userspace in reads of [`BULK_READ`]
//!   bytes on average or more (a bulk transfer, not a long-lived connection
//!   of small requests) while the worker's other flows make at least a
//!   quarter of its reads (4 bulk streams; not one stream alone). Off by
//!   default since userspace keeps up: on 2026-12-03 (2 rounds, 4 iperf3
//!   streams through `nbthread 1`) copying moved 14.9 Gbit/s against
//!   sockmap's 11.3; and with splice, whose pipe grows to 1 MiB (`pool`), on
//!   2026-12-02, quiet host, 3 interleaved rounds, 4 iperf3 streams
//!   through `nbthread 1`, splice moved 15.4 Gbit/s at 0.28 s/GB of proxy
//!   CPU against sockmap's 13.7 at 0.18, and `auto` promoting the 4 streams
//!   fell to 7.4–13.1 Gbit/s at up to 1.07 s/GB: a fast stream outruns its
//!   receiver, the flow pauses (see "Backpressure" in `sockmap`) and its
//!   bytes come back through userspace. One stream: splice 14.0, sockmap
//!   7.9 Gbit/s. Tried again on 2026-12-04 with 1 MiB as the default: alone
//!   on a quiet host 4 streams moved 18.4-18.9 Gbit/s promoted against
//!   copying's 15.8-15.9 (2 rounds), but in `cargo xtask bench`'s 5 rounds
//!   the same hour 14.2 against copy's 16.0 (forced sockmap 13.5) at no less
//!   proxy CPU per GB (0.28 against 0.25 s/GB): 4 streams through one thread
//!   are bimodal here (copy 15.7 or 19.1, sockmap 13.6 or 19.0 in back to
//!   back runs), and the kernel path pauses more in the slow mode.
//! - **the worker's one busy flow, taking turns**: of the last
//!   [`WINDOW_READS`] userspace reads of this flow, the worker's other flows
//!   did fewer than a third as many ([`DOMINANT_NUM`]/[`DOMINANT_DEN`]), and
//!   its reads changed direction at least once per [`TURN_EVERY`] reads: a
//!   request/response exchange (redis -c1, the 64 KiB echo), whose every turn
//!   the kernel path saves a wake-up on, where with many busy clients (redis
//!   -c50: each flow 2 % of the reads) it would not.
//!
//! A flow that is half-closed is never promoted (the insertion refuses it).

use std::cell::Cell;
use std::time::Instant;

/// Mean read size, in bytes, from which a flow's bytes count as bulk: a
/// redis or database connection reads requests of tens to hundreds of
/// bytes; a bulk stream fills most of a 64 KiB buffer or pipe per read.
pub const BULK_READ: u64 = 4096;

/// Reads of one flow over which its share of the worker's reads is judged,
/// where the worker holds other flows: long enough that the OS scheduler
/// cannot make one of several clients that are busy at the same time look
/// alone. 16 client threads on 2 CPUs doing 32-byte round trips
/// (`tests/promotion.rs`) beside the other promotion tests: with 256 reads
/// one of them was promoted in 2 runs of 4 (it made 256 reads while the 7-10
/// others of its worker made 0-54: the machine's load starved their
/// threads), with 1024 in none of 10 (3 and 4 tests at a time). A single
/// client alone on its worker (redis -c1, the 64 KiB echo) is judged over
/// [`ALONE_WINDOW_READS`] instead, so this costs only a busy flow beside
/// idle ones: ~0.1 s of userspace round trips before it is promoted.
pub const WINDOW_READS: u32 = 1024;

/// The window of a flow whose reads are bulk ([`BULK_READ`] on average): a
/// turn-taking exchange of large messages (the 64 KiB echo: 8 turns with
/// 32 KiB reads) moves ~1 MiB in it, which amortises the insertion, and is
/// forwarded at a quarter of the kernel's pace until promoted: with the
/// 512-read window 1000 echoes ran at 0.76x of forced sockmap (2026-12-03,
/// 2 rounds), with 32 at 1.00x (3 rounds). Once kernel flows stopped waking
/// their worker the kernel's echo went from 33 to 21 µs, and the userspace
/// echoes before promotion (about 150 µs each) weigh more: 2026-12-04, 32
/// reads 0.951-0.957x (2 rounds), 16 reads 0.962-0.969x (3 rounds). Not
/// fewer: a flow must turn twice in the window (`TURN_EVERY`), so a request
/// followed by a download (one turn) is never judged turn-taking.
pub const BULK_WINDOW_READS: u32 = 16;

/// The window of a flow that is the only `auto` flow its worker holds: with
/// no other flow there is nothing to tell it apart from, and its every
/// round trip in userspace crosses CPUs four times (~0.2 ms on this VM
/// against ~0.02 in the kernel), so the long window is what redis -c1 pays
/// for. 2026-12-04, redis -c1, 20,000 requests, 3 alternating runs of each
/// against forced sockmap: with [`WINDOW_READS`] 0.90-0.985x, with this
/// 0.97-1.03x. Many busy flows on one worker never see it: it applies only
/// while the worker holds no other `auto` flow at all and has started none
/// for [`ALONE_QUIET`].
pub const ALONE_WINDOW_READS: u32 = 32;

/// How long a worker must have started no other flow before its only flow
/// counts as alone: many clients that connect at once are accepted and
/// started over a few milliseconds, and the first of them must not look
/// alone meanwhile. A precaution, not a measured failure (the promotions
/// seen in `tests/promotion.rs` while this was tried came from the
/// 256-read window, see [`WINDOW_READS`]); it costs redis -c1 10 ms of
/// userspace round trips.
pub const ALONE_QUIET: std::time::Duration = std::time::Duration::from_millis(10);

/// A flow with at least DOMINANT_NUM/DOMINANT_DEN of its worker's reads in
/// a window is the worker's one busy flow.
pub const DOMINANT_NUM: u64 = 3;
pub const DOMINANT_DEN: u64 = 4;

/// A dominant flow whose reads change direction at least once per this many
/// reads takes turns (request/response: redis -c1 turns on every read, the
/// 64 KiB echo every one or two; a bulk stream almost never).
pub const TURN_EVERY: u32 = 8;

/// How long the directions of a flow may take to become parkable (each has
/// written what it holds and read its socket dry) once a promotion is asked
/// for; a direction parked meanwhile does not read, so this bounds the delay
/// a promotion can add to its bytes. Past it the promotion is called off.
pub const PARK_LIMIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Promotions a flow may try (one that is called off for time is watched
/// again from scratch).
pub const MAX_PROMOTE_ATTEMPTS: u32 = 4;

/// How `auto` promotes (`None` where the mode is forced).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Promote {
    /// Bytes moved in userspace (both directions) that make a bulk flow an
    /// elephant, `tune.sockmap.promote-bytes`; `None` (its default): bulk
    /// flows stay in userspace, only turn-taking flows are promoted.
    pub bytes: Option<u64>,
}

thread_local! {
    /// Userspace reads this worker made, all flows: the denominator of a
    /// flow's share (per thread, as the executor it measures).
    static WORKER_READS: Cell<u64> = const { Cell::new(0) };
    /// `auto` flows this worker holds (each one's `Watch` is alive).
    static WORKER_FLOWS: Cell<u32> = const { Cell::new(0) };
    /// When this worker last started an `auto` flow.
    static LAST_START: Cell<Option<Instant>> = const { Cell::new(None) };
}

fn worker_reads() -> u64 {
    WORKER_READS.with(Cell::get)
}

/// The flow reading is the only one its worker holds, and the worker has
/// started no other for [`ALONE_QUIET`].
fn alone() -> bool {
    WORKER_FLOWS.with(Cell::get) <= 1
        && LAST_START
            .with(Cell::get)
            .is_none_or(|t| t.elapsed() >= ALONE_QUIET)
}

/// The evidence of one flow.
#[derive(Debug)]
pub struct Watch {
    policy: Promote,
    bytes: Cell<u64>,
    reads: Cell<u64>,
    window_reads: Cell<u32>,
    window_turns: Cell<u32>,
    window_start: Cell<u64>,
    /// The side the last read came from (0 client, 1 server).
    last_side: Cell<u8>,
}

impl Watch {
    pub fn new(policy: Promote) -> Self {
        WORKER_FLOWS.with(|n| n.set(n.get() + 1));
        LAST_START.with(|t| t.set(Some(Instant::now())));
        Self {
            policy,
            bytes: Cell::new(0),
            reads: Cell::new(0),
            window_reads: Cell::new(0),
            window_turns: Cell::new(0),
            window_start: Cell::new(worker_reads()),
            last_side: Cell::new(0),
        }
    }

    /// Start over (a promotion was called off for time).
    pub fn reset(&self) {
        self.bytes.set(0);
        self.reads.set(0);
        self.new_window(worker_reads());
    }

    fn new_window(&self, at: u64) {
        self.window_reads.set(0);
        self.window_turns.set(0);
        self.window_start.set(at);
    }

    /// A userspace read of `n` bytes from `side` (0 client, 1 server); true
    /// when the flow should now be promoted.
    pub fn read(&self, side: u8, n: usize) -> bool {
        let total = WORKER_READS.with(|w| {
            w.set(w.get() + 1);
            w.get()
        });
        let bytes = self.bytes.get() + n as u64;
        let reads = self.reads.get() + 1;
        self.bytes.set(bytes);
        self.reads.set(reads);
        if self.last_side.replace(side) != side {
            self.window_turns.set(self.window_turns.get() + 1);
        }
        let w = self.window_reads.get() + 1;
        self.window_reads.set(w);
        // This flow's share of the worker's reads in the window so far.
        let all = total - self.window_start.get();
        let dominant = u64::from(w) * DOMINANT_DEN >= all * DOMINANT_NUM;
        let elephant = self.policy.bytes.is_some_and(|b| bytes >= b);
        if !dominant && elephant && bytes >= reads * BULK_READ {
            return true;
        }
        let window = if w >= ALONE_WINDOW_READS && alone() {
            ALONE_WINDOW_READS
        } else if bytes >= reads * BULK_READ {
            BULK_WINDOW_READS
        } else {
            WINDOW_READS
        };
        if w < window {
            return false;
        }
        let turns = self.window_turns.get();
        self.new_window(total);
        dominant && turns * TURN_EVERY >= w
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // At thread exit the count may be gone with the thread.
        let _ = WORKER_FLOWS.try_with(|n| n.set(n.get().saturating_sub(1)));
    }
}

/// Test hook: count `n` reads of other flows on this worker.
#[cfg(test)]
pub fn others_read(n: u64) {
    WORKER_READS.with(|w| w.set(w.get() + n));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_reads_never_make_an_elephant() {
        let w = Watch::new(Promote { bytes: Some(1000) });
        // 100-byte reads, with the worker busy with other flows.
        for i in 0..10_000u32 {
            others_read(10);
            assert!(!w.read((i % 2) as u8, 100));
        }
    }

    #[test]
    fn bulk_reads_past_the_bytes_promote_among_other_busy_flows() {
        let w = Watch::new(Promote {
            bytes: Some(1 << 20),
        });
        let promoted = (1..=64).find(|_| {
            others_read(3);
            w.read(0, 64 * 1024)
        });
        assert_eq!(promoted, Some(16), "at the 16th 64 KiB read (1 MiB)");
    }

    #[test]
    fn by_default_no_bulk_flow_is_an_elephant() {
        let w = Watch::new(Promote::default());
        for _ in 0..4 * WINDOW_READS {
            others_read(3);
            assert!(!w.read(0, 64 * 1024));
        }
    }

    #[test]
    fn one_bulk_stream_alone_stays_in_userspace() {
        let w = Watch::new(Promote {
            bytes: Some(1 << 20),
        });
        for _ in 0..4 * WINDOW_READS {
            assert!(!w.read(0, 64 * 1024), "nothing to share the thread with");
        }
    }

    #[test]
    fn the_workers_one_busy_flow_taking_turns_is_promoted_after_a_window() {
        // Another flow on the worker, idle.
        let _idle = Watch::new(Promote::default());
        let w = Watch::new(Promote::default());
        let at = (1..=2 * WINDOW_READS).find(|i| w.read((i % 2) as u8, 20));
        assert_eq!(at, Some(WINDOW_READS));
        drop(w);
        // A 64 KiB echo: two reads each way per turn.
        let w = Watch::new(Promote::default());
        let at = (1..=2 * WINDOW_READS).find(|i| w.read(((i / 2) % 2) as u8, 32 * 1024));
        assert_eq!(at, Some(BULK_WINDOW_READS), "bulk turns: the short window");
    }

    #[test]
    fn the_only_flow_of_its_worker_taking_turns_is_promoted_after_a_short_window() {
        let w = Watch::new(Promote::default());
        // Just started: not yet alone for long enough.
        let early = (1..=ALONE_WINDOW_READS).find(|i| w.read((i % 2) as u8, 20));
        assert_eq!(early, None, "the worker started a flow just now");
        std::thread::sleep(ALONE_QUIET);
        assert!(
            w.read(1, 20),
            "alone for ALONE_QUIET, past the short window"
        );
        // Once a second flow arrives, the long window applies again.
        let other = Watch::new(Promote::default());
        let at = (1..=2 * WINDOW_READS).find(|i| w.read((i % 2) as u8, 20));
        assert_eq!(at, Some(WINDOW_READS));
        drop(other);
    }

    #[test]
    fn the_only_flow_streaming_one_way_is_not_promoted() {
        let w = Watch::new(Promote::default());
        for _ in 0..4 * WINDOW_READS {
            assert!(!w.read(0, 200), "no turns, no promotion");
        }
    }

    #[test]
    fn one_of_many_busy_flows_is_not() {
        let w = Watch::new(Promote::default());
        for i in 0..4 * WINDOW_READS {
            others_read(2);
            assert!(
                !w.read((i % 2) as u8, 20),
                "a third of the reads is not dominance"
            );
        }
    }
}
