//! Unit tests of the pool: the sizing sequence, the take discipline (own list
//! first, the `pool-low-conn` gate, round-robin over siblings), the peek
//! verdicts, flushes, the `pool-max-conn` reservation bound; and the false
//! sharing micro-benchmark (ignored by default: run with `--ignored --nocapture`).

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use super::*;

fn params(max_conn: i64, low_conn: usize) -> PoolParams {
    PoolParams {
        max_conn,
        low_conn,
        purge_delay: Duration::from_secs(5),
    }
}

/// A listener and a way to make spares to it (the accepted ends are kept so
/// the spares stay open until the test closes them).
struct Peer {
    l: TcpListener,
    addr: SocketAddr,
    accepted: Vec<TcpStream>,
}

impl Peer {
    fn new() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        Self {
            l,
            addr,
            accepted: Vec::new(),
        }
    }

    fn spare(&mut self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_nonblocking(true).unwrap();
        self.accepted.push(self.l.accept().unwrap().0);
        s
    }

    /// Put one spare in thread `tid`'s list of `pool`.
    fn add(&mut self, pool: &ServerPool, tid: usize) {
        assert!(pool.reserve(), "reservation under pool-max-conn");
        let th = pool.threads.get().unwrap();
        th.lists[tid].connecting.fetch_add(1, Ordering::Relaxed);
        let s = self.spare();
        pool.push(tid, s, self.addr, pool.generation(), self.addr, true);
    }
}

#[test]
fn purge_sequence_after_a_burst_of_ten_is_10_10_6_3_1_0() {
    let mut s = Sizing::default();
    // A burst of 10 concurrent flows over a few periods: the need follows.
    for _ in 0..3 {
        s.note_used(10);
        assert_eq!(s.period_end(10, 10), 0);
    }
    // The flows end in the middle of a period; no use afterwards.
    s.note_used(10);
    let mut idle = 10;
    let mut seq = Vec::new();
    for _ in 0..6 {
        idle -= s.period_end(idle, 0);
        seq.push(idle);
    }
    assert_eq!(seq, [10, 10, 6, 3, 1, 0]);
    assert_eq!(s.need(), 0);
}

#[test]
fn steady_load_of_four_settles_at_four() {
    let mut s = Sizing::default();
    let mut idle = 0usize;
    for _ in 0..10 {
        s.note_used(4);
        // Refill toward the need between periods.
        idle = idle.max(s.need());
        idle -= s.period_end(idle, 4);
    }
    assert_eq!(s.need(), 4);
    assert_eq!(idle, 4);
    // A burst to 12 raises the need at once; it decays back afterwards.
    s.note_used(12);
    assert_eq!(s.need(), 12);
}

#[test]
fn per_thread_target_caps_and_splits() {
    assert_eq!(per_thread_target(10, -1, 1), 10);
    assert_eq!(per_thread_target(10, 4, 1), 4);
    assert_eq!(per_thread_target(5, -1, 2), 3);
    assert_eq!(per_thread_target(0, 8, 4), 0);
}

#[test]
fn own_spare_first_then_siblings_round_robin_above_low_conn() {
    let mut peer = Peer::new();
    let pool = ServerPool::new(params(-1, 2));
    pool.init(4, true);
    for tid in 1..4 {
        for _ in 0..3 {
            peer.add(&pool, tid);
        }
    }
    peer.add(&pool, 0);
    assert_eq!(pool.idle_cur(), 10);
    // Own spare first.
    assert!(pool.take(0, peer.addr).is_some());
    assert_eq!(pool.idle_per_thr(4), [0, 3, 3, 3]);
    // Then siblings, round-robin starting after itself: 1, 2, 3, 1, 2, 3 ...
    let mut order = Vec::new();
    for _ in 0..6 {
        let before = pool.idle_per_thr(4);
        assert!(pool.take(0, peer.addr).is_some());
        let after = pool.idle_per_thr(4);
        order.push((0..4).find(|&i| after[i] < before[i]).unwrap());
    }
    assert_eq!(order, [1, 2, 3, 1, 2, 3]);
    // 3 spares left (>= low 2): one more take; then 2 left, still >= 2; then 1 < 2:
    // the gate closes and thread 0 must connect itself.
    assert!(pool.take(0, peer.addr).is_some());
    assert!(pool.take(0, peer.addr).is_some());
    assert_eq!(pool.idle_cur(), 1);
    assert!(pool.take(0, peer.addr).is_none(), "below pool-low-conn");
    // The owner still takes its own.
    let owner = (0..4).find(|&i| pool.idle_per_thr(4)[i] == 1).unwrap();
    assert!(pool.take(owner, peer.addr).is_some());
    let c = pool.counters();
    assert_eq!((c.hit, c.miss), (10, 1));
}

#[test]
fn sharing_off_never_takes_a_siblings_spare() {
    let mut peer = Peer::new();
    let pool = ServerPool::new(params(-1, 0));
    pool.init(2, false);
    peer.add(&pool, 1);
    assert!(pool.take(0, peer.addr).is_none());
    assert!(pool.take(1, peer.addr).is_some());
}

#[test]
fn dead_spares_are_discarded_and_greetings_kept_unread() {
    let mut peer = Peer::new();
    let pool = ServerPool::new(params(-1, 0));
    pool.init(1, true);
    peer.add(&pool, 0); // oldest: will greet
    peer.add(&pool, 0); // closed by the server
    peer.add(&pool, 0); // reset by the server
                        // The server closes the two newest; the oldest greets.
    let rst = peer.accepted.pop().unwrap();
    socket2::SockRef::from(&rst)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(rst);
    drop(peer.accepted.pop().unwrap());
    peer.accepted[0].write_all(b"220 hello\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let s = pool.take(0, peer.addr).expect("the greeting spare");
    let mut buf = [0u8; 32];
    // Still unread: the client will get it.
    assert_eq!(peek(&s), Peek::Greeting);
    let n = s.peek(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"220 hello\r\n");
    let c = pool.counters();
    assert_eq!((c.hit, c.dead), (1, 2));
}

#[test]
fn address_change_makes_spares_stale_and_flush_drops_all() {
    let mut peer = Peer::new();
    let pool = ServerPool::new(params(-1, 0));
    pool.init(2, true);
    for tid in [0, 1, 1] {
        peer.add(&pool, tid);
    }
    let other: SocketAddr = "127.0.0.1:1".parse().unwrap();
    assert!(
        pool.take(0, other).is_none(),
        "never hands a spare of the old address"
    );
    assert_eq!(
        pool.counters().purged,
        3,
        "every stale spare scanned is dropped"
    );
    assert_eq!(pool.idle_cur(), 0);
    peer.add(&pool, 0);
    peer.add(&pool, 1);
    assert_eq!(pool.flush(FlushReason::AddrChanged), 2);
    assert_eq!(pool.idle_cur(), 0);
    assert_eq!(pool.idle_per_thr(2), [0, 0]);
    // A connect that started before the flush is dropped when it lands.
    let gen_before = pool.generation() - 1;
    assert!(pool.reserve());
    pool.threads.get().unwrap().lists[0]
        .connecting
        .fetch_add(1, Ordering::Relaxed);
    let s = peer.spare();
    pool.push(0, s, peer.addr, gen_before, peer.addr, true);
    assert_eq!(pool.idle_cur(), 0);
    assert_eq!(pool.reserved.load(Ordering::Relaxed), 0);
}

#[test]
fn reservations_never_exceed_pool_max_conn() {
    let pool = ServerPool::new(params(3, 0));
    pool.init(2, true);
    // Each thread wants its share of a need of 10 (capped at 3: 2 per thread).
    pool.max_used.store(10, Ordering::Relaxed);
    let a = pool.plan_refill(0, true, 0);
    let b = pool.plan_refill(1, true, 0);
    assert_eq!(a + b, 3);
    assert_eq!(pool.plan_refill(0, true, 0), 0);
    assert_eq!(pool.plan_refill(1, false, 0), 0);
    pool.connect_failed(0);
    assert_eq!(
        pool.plan_refill(0, true, 0),
        0,
        "backoff after a failed connect"
    );
}

#[test]
fn disabled_pool_is_inert() {
    let pool = ServerPool::new(params(0, 0));
    pool.init(2, true);
    assert!(!pool.enabled());
    assert!(pool.take(0, "127.0.0.1:1".parse().unwrap()).is_none());
    assert_eq!(pool.counters(), Counters::default());
    assert_eq!(pool.idle_per_thr(2), [0, 0]);
    assert_eq!(pool.plan_refill(0, true, 0), 0);
}

/// False sharing, measured: two threads each bump their own counter, first in
/// adjacent 8-byte slots (one cache line), then in [`Padded`] slots. Prints ns
/// per increment for both. Run: `cargo test -p proxy --release false_sharing --
/// --ignored --nocapture`.
#[test]
#[ignore = "micro-benchmark, not a test: prints ns per increment; run in release with --ignored --nocapture"]
fn false_sharing_micro_benchmark() {
    use std::sync::atomic::AtomicU64;
    const ITERS: u64 = 20_000_000;
    fn run<T: Sync>(slots: &[T; 2], get: fn(&T) -> &AtomicU64) -> f64 {
        let t0 = std::time::Instant::now();
        std::thread::scope(|sc| {
            for s in slots {
                sc.spawn(move || {
                    let c = get(s);
                    for _ in 0..ITERS {
                        c.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        t0.elapsed().as_nanos() as f64 / ITERS as f64
    }
    for round in 0..3 {
        let plain = [AtomicU64::new(0), AtomicU64::new(0)];
        let padded = [Padded(AtomicU64::new(0)), Padded(AtomicU64::new(0))];
        let shared_ns = run(&plain, |a| a);
        let padded_ns = run(&padded, |p| &p.0);
        println!(
            "round {round}: same cache line {shared_ns:.2} ns/inc, padded {padded_ns:.2} ns/inc, ratio {:.1}x",
            shared_ns / padded_ns
        );
    }
    assert_eq!(std::mem::align_of::<Padded<ThreadList>>(), 128);
}
