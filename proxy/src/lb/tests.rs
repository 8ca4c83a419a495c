//! Unit tests of server selection and queues: each algorithm measured over
//! 10,000 selections against its definition, candidate-set rules (backup,
//! maintenance, down, weight 0, exclusion), and the maxconn queue across OS
//! threads (bounds, FIFO, timeout, maxqueue, cancellation).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::*;
use crate::config::{
    Backend, BackendOpts, Balance, CheckParams, HashType, Location, Server, Timeouts,
};

/// Selections per distribution test.
const N: usize = 10_000;
/// Upper bound of any wait loop in these tests.
const DEADLINE: Duration = Duration::from_secs(20);

#[derive(Clone, Copy)]
struct S {
    weight: u32,
    maxconn: usize,
    maxqueue: usize,
    backup: bool,
    disabled: bool,
    id: Option<u32>,
}

fn s(weight: u32) -> S {
    S {
        weight,
        maxconn: 0,
        maxqueue: 0,
        backup: false,
        disabled: false,
        id: None,
    }
}

impl S {
    fn maxconn(mut self, m: usize) -> S {
        self.maxconn = m;
        self
    }
    fn maxqueue(mut self, m: usize) -> S {
        self.maxqueue = m;
        self
    }
    fn backup(mut self) -> S {
        self.backup = true;
        self
    }
    fn disabled(mut self) -> S {
        self.disabled = true;
        self
    }
    fn id(mut self, id: u32) -> S {
        self.id = Some(id);
        self
    }
}

fn backend(balance: Balance, servers: &[S]) -> Arc<BackendRt> {
    backend_with(balance, servers, BackendOpts::default())
}

/// [`backend`] with options (`allbackups`, `hash-type`).
fn backend_with(balance: Balance, servers: &[S], opts: BackendOpts) -> Arc<BackendRt> {
    let servers = servers
        .iter()
        .enumerate()
        .map(|(i, d)| Server {
            name: format!("s{i}"),
            id: d.id.unwrap_or(i as u32 + 1),
            addr: SocketAddr::from(([127, 0, 0, 1], 10_000 + i as u16)),
            weight: d.weight,
            maxconn: d.maxconn,
            maxqueue: d.maxqueue,
            backup: d.backup,
            disabled: d.disabled,
            check: CheckParams::default(),
            line: Location::default(),
            pool: Default::default(),
            send_proxy: Default::default(),
            source: None,
            tls: None,
            check_tls: None,
        })
        .collect();
    BackendRt::new(&Backend {
        name: "be".into(),
        id: 1,
        balance,
        servers,
        timeouts: Timeouts::default(),
        retries: 3,
        redispatch: false,
        splice: Default::default(),
        maxconn: 0,
        log_global: false,
        line: Location::default(),
        opts,
        tcp_content: Vec::new(),
        stick: vec![],
    })
}

const ALL: [Balance; 6] = [
    Balance::RoundRobin,
    Balance::StaticRr,
    Balance::LeastConn,
    Balance::First,
    Balance::Source,
    Balance::Random,
];

fn client(i: usize) -> SocketAddr {
    SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 40_000))
}

fn cl() -> SocketAddr {
    client(1)
}

/// Counts of `n` pure picks per server (panics if a pick fails).
fn counts(be: &BackendRt, n: usize, mut addr: impl FnMut(usize) -> SocketAddr) -> Vec<usize> {
    let mut c = vec![0; be.servers.len()];
    for k in 0..n {
        let i = be.pick(addr(k), None).expect("a server");
        c[i] += 1;
    }
    c
}

fn assert_within(got: &[usize], weights: &[u32], n: usize, tol: f64) {
    let total: u32 = weights.iter().sum();
    for (i, (&g, &w)) in got.iter().zip(weights).enumerate() {
        let want = n as f64 * f64::from(w) / f64::from(total);
        assert!(
            (g as f64 - want).abs() <= want * tol,
            "server {i}: got {g}, want {want} ±{}% (all {got:?})",
            tol * 100.0
        );
    }
}

/// Poll a future once without a runtime (enough for acquire without timeout).
fn poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

/// Take a slot that must be available right away.
fn take(be: &Arc<BackendRt>, exclude: Option<usize>) -> Slot {
    let fut = pin!(be.acquire(cl(), exclude, None));
    match poll_once(fut) {
        Poll::Ready(r) => r.expect("slot"),
        Poll::Pending => panic!("acquire queued but a slot was expected"),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

// ---------------------------------------------------------------- roundrobin

#[test]
fn roundrobin_follows_weights_smoothly() {
    let w = [1, 2, 3, 4];
    let be = backend(Balance::RoundRobin, &w.map(s));
    let mut seq = Vec::with_capacity(N);
    for _ in 0..N {
        seq.push(be.pick(cl(), None).expect("server"));
    }
    let mut c = vec![0; 4];
    for &i in &seq {
        c[i] += 1;
    }
    assert_within(&c, &w, N, 0.03);
    // Smooth: the heaviest server (40%) never gets more than 2 turns in a row.
    let longest = seq
        .chunk_by(|a, b| a == b)
        .filter(|r| r[0] == 3)
        .map(<[usize]>::len)
        .max();
    assert!(longest <= Some(2), "run of {longest:?} picks of server 3");
}

#[test]
fn roundrobin_weight_change_applies_at_once() {
    let be = backend(Balance::RoundRobin, &[s(1), s(1)]);
    assert_within(&counts(&be, 1000, |_| cl()), &[1, 1], 1000, 0.03);
    be.servers[0].set_weight(3);
    assert_within(&counts(&be, 4000, |_| cl()), &[3, 1], 4000, 0.03);
    be.servers[1].set_weight(0);
    assert_eq!(counts(&be, 100, |_| cl()), vec![100, 0]);
}

// ---------------------------------------------------------------- static-rr

#[test]
fn static_rr_exact_and_ignores_runtime_weights() {
    let w = [1, 2, 3, 4];
    let be = backend(Balance::StaticRr, &w.map(s));
    assert_eq!(counts(&be, N, |_| cl()), vec![1000, 2000, 3000, 4000]);
    // A non-zero runtime weight change has no effect on static-rr ...
    be.servers[3].set_weight(1);
    assert_eq!(counts(&be, N, |_| cl()), vec![1000, 2000, 3000, 4000]);
    // ... but weight 0 takes the server out.
    be.servers[3].set_weight(0);
    assert_eq!(counts(&be, 6000, |_| cl()), vec![1000, 2000, 3000, 0]);
}

#[test]
fn static_rr_many_servers() {
    // More servers than HAProxy's dynamic roundrobin allows (4095).
    let be = backend(Balance::StaticRr, &vec![s(1); 5000]);
    let c = counts(&be, N, |_| cl());
    assert!(c.iter().all(|&x| x == 2), "uneven: {:?}", &c[..10]);
}

// ---------------------------------------------------------------- leastconn

#[test]
fn leastconn_picks_least_loaded_round_robin_on_ties() {
    let be = backend(Balance::LeastConn, &[s(1), s(1), s(1)]);
    // Idle farm: ties everywhere, so turns are taken in order.
    let held: Vec<Slot> = (0..3).map(|_| take(&be, None)).collect();
    let idx: Vec<usize> = held.iter().map(Slot::index).collect();
    assert_eq!(idx, vec![0, 1, 2]);
    // Loads 2,1,1 -> only servers 1 and 2, alternating exactly.
    let extra = take(&be, None);
    assert_eq!(extra.index(), 0);
    let c = counts(&be, N, |_| cl());
    assert_eq!(c, vec![0, N / 2, N / 2]);
    // Free server 1's slot: it is now strictly the least loaded.
    drop(held);
    let a = take(&be, None);
    assert_ne!(a.index(), 0, "server 0 still holds a connection");
    drop(extra);
    drop(a);
}

#[test]
fn leastconn_accounts_for_weight() {
    let w = [1, 2, 3, 4];
    let be = backend(Balance::LeastConn, &w.map(s));
    // Holding every slot, the loads must end up proportional to the weights.
    let held: Vec<Slot> = (0..N).map(|_| take(&be, None)).collect();
    for (i, srv) in be.servers.iter().enumerate() {
        let want = N * w[i] as usize / 10;
        assert!(
            srv.cur_conns().abs_diff(want) <= 1,
            "server {i}: {} conns, want {want}",
            srv.cur_conns()
        );
    }
    drop(held);
    assert!(be.servers.iter().all(|s| s.cur_conns() == 0));
}

// ---------------------------------------------------------------- first

#[test]
fn first_fills_lowest_id_up_to_maxconn() {
    // Config order differs from id order: ids 3, 1, 2.
    let be = backend(
        Balance::First,
        &[
            s(1).maxconn(3).id(3),
            s(1).maxconn(3).id(1),
            s(1).maxconn(3).id(2),
        ],
    );
    assert_eq!(counts(&be, N, |_| cl()), vec![0, N, 0]);
    let held: Vec<Slot> = (0..7).map(|_| take(&be, None)).collect();
    let idx: Vec<usize> = held.iter().map(Slot::index).collect();
    assert_eq!(idx, vec![1, 1, 1, 2, 2, 2, 0]);
    // A slot freed on the first server is the next one used.
    let mut held = held;
    held.remove(1);
    assert_eq!(take(&be, None).index(), 1);
}

#[test]
fn first_without_maxconn_takes_everything() {
    let be = backend(Balance::First, &[s(5), s(1)]);
    let held: Vec<Slot> = (0..100).map(|_| take(&be, None)).collect();
    assert!(held.iter().all(|h| h.index() == 0));
}

// ---------------------------------------------------------------- source

#[test]
fn source_is_stable_and_spread() {
    let w = [1, 1, 1, 1];
    let be = backend(Balance::Source, &w.map(s));
    let first = counts(&be, N, client);
    assert_within(&first, &w, N, 0.08);
    for k in 0..N {
        let a = be.pick(client(k), None);
        let mut other_port = client(k);
        other_port.set_port(1234);
        assert_eq!(a, be.pick(other_port, None), "client {k} moved");
    }
    // Taking a server out and back restores the same mapping.
    let before: Vec<_> = (0..1000).map(|k| be.pick(client(k), None)).collect();
    be.servers[2].set_up(false);
    let during: Vec<_> = (0..1000).map(|k| be.pick(client(k), None)).collect();
    assert!(during.iter().all(|&x| x != Some(2)));
    be.servers[2].set_up(true);
    let after: Vec<_> = (0..1000).map(|k| be.pick(client(k), None)).collect();
    assert_eq!(before, after);
}

/// `balance source` with `hash-type consistent`.
fn consistent(weights: &[u32]) -> Arc<BackendRt> {
    let opts = BackendOpts {
        hash_type: HashType::Consistent,
        ..BackendOpts::default()
    };
    let servers: Vec<S> = weights.iter().map(|&w| s(w)).collect();
    backend_with(Balance::Source, &servers, opts)
}

#[test]
fn consistent_source_moves_only_the_keys_of_a_server_that_goes() {
    let be = consistent(&[1, 1, 1, 1]);
    let before: Vec<usize> = (0..N)
        .map(|k| be.pick(client(k), None).expect("a server"))
        .collect();
    let mut share = [0usize; 4];
    for &s in &before {
        share[s] += 1;
    }
    assert_within(&share, &[1, 1, 1, 1], N, 0.25);
    be.servers[1].set_up(false);
    let during: Vec<usize> = (0..N)
        .map(|k| be.pick(client(k), None).expect("a server"))
        .collect();
    let moved = before.iter().zip(&during).filter(|(a, b)| a != b).count();
    for (k, (&a, &b)) in before.iter().zip(&during).enumerate() {
        if a != 1 {
            assert_eq!(a, b, "key {k} was on server {a}, which stayed, yet moved");
        } else {
            assert_ne!(b, 1, "key {k} still on the server that went");
        }
    }
    assert_eq!(
        moved, share[1],
        "exactly the keys of the server that went moved"
    );
    assert!(
        (N * 15 / 100..=N * 35 / 100).contains(&moved),
        "about a quarter of the keys moved: {moved} of {N}"
    );
    // Its keys spread over the three others, not onto one neighbour.
    let mut took = [0usize; 4];
    for (&a, &b) in before.iter().zip(&during) {
        if a == 1 {
            took[b] += 1;
        }
    }
    assert!(
        [0, 2, 3].iter().all(|&i| took[i] > moved / 10),
        "spread: {took:?}"
    );
    be.servers[1].set_up(true);
    let after: Vec<usize> = (0..N)
        .map(|k| be.pick(client(k), None).expect("a server"))
        .collect();
    assert_eq!(before, after, "its keys come back with it");
}

#[test]
fn map_based_source_moves_most_keys_when_a_server_goes() {
    // The contrast that makes `consistent` worth having (and shows the two
    // hash types are distinct code paths).
    let be = backend(Balance::Source, &[s(1), s(1), s(1), s(1)]);
    let before: Vec<_> = (0..N).map(|k| be.pick(client(k), None)).collect();
    be.servers[1].set_up(false);
    let moved = (0..N)
        .filter(|&k| before[k] != be.pick(client(k), None))
        .count();
    assert!(moved > N / 2, "map-based moved {moved} of {N}");
}

#[test]
fn consistent_source_follows_weights_and_keeps_a_client() {
    let w = [1, 2, 3, 4];
    let be = consistent(&w);
    assert_within(&counts(&be, N, client), &w, N, 0.2);
    for k in 0..1000 {
        let mut other_port = client(k);
        other_port.set_port(1234);
        assert_eq!(
            be.pick(client(k), None),
            be.pick(other_port, None),
            "client {k} moved"
        );
    }
}

#[test]
fn consistent_source_redispatch_takes_the_next_server_on_the_ring() {
    let be = consistent(&[1, 1, 1]);
    for k in 0..1000 {
        let first = be.pick(client(k), None).expect("a server");
        let other = be.pick(client(k), Some(first)).expect("another server");
        assert_ne!(first, other);
    }
    let one = consistent(&[1]);
    assert_eq!(one.pick(cl(), Some(0)), None, "only the excluded server");
}

#[test]
fn source_follows_weights() {
    let w = [1, 2, 3, 4];
    let be = backend(Balance::Source, &w.map(s));
    assert_within(&counts(&be, N, client), &w, N, 0.1);
}

#[test]
fn source_ipv6_clients() {
    let be = backend(Balance::Source, &[s(1), s(1)]);
    let c = counts(&be, 2000, |k| {
        SocketAddr::from(([0x2001, 0xdb8, 0, 0, 0, 0, 0, k as u16], 5))
    });
    assert!(c.iter().all(|&x| x > 800), "{c:?}");
}

// ---------------------------------------------------------------- random

#[test]
fn random_is_weighted() {
    let w = [1, 2, 3, 4];
    let be = backend(Balance::Random, &w.map(s));
    assert_within(&counts(&be, N, |_| cl()), &w, N, 0.15);
}

#[test]
fn random_prefers_less_loaded() {
    let be = backend(Balance::Random, &[s(1), s(1), s(1), s(1)]);
    // Load server 0 with 20 connections: it should now win only when both
    // draws hit it (1/16 of the picks) instead of 1/4.
    be.servers.iter().skip(1).for_each(|s| s.set_maint(true));
    let _held: Vec<Slot> = (0..20).map(|_| take(&be, None)).collect();
    be.servers.iter().skip(1).for_each(|s| s.set_maint(false));
    assert_eq!(be.servers[0].cur_conns(), 20);
    let c = counts(&be, N, |_| cl());
    assert!(c[0] < N / 10, "loaded server still picked {} times", c[0]);
    assert!(
        c[0] > N / 40,
        "two draws should still pick it ~1/16: {}",
        c[0]
    );
}

// ---------------------------------------------------------------- candidate set

#[test]
fn backup_only_when_all_active_are_down() {
    let be = backend(
        Balance::RoundRobin,
        &[s(1), s(1), s(1).backup(), s(1).backup()],
    );
    assert_eq!(counts(&be, 1000, |_| cl()), vec![500, 500, 0, 0]);
    be.servers[0].set_up(false);
    assert_eq!(counts(&be, 1000, |_| cl()), vec![0, 1000, 0, 0]);
    be.servers[1].set_maint(true);
    assert_eq!(counts(&be, 1000, |_| cl()), vec![0, 0, 1000, 0]);
    be.servers[2].set_up(false);
    assert_eq!(counts(&be, 1000, |_| cl()), vec![0, 0, 0, 1000]);
    be.servers[0].set_up(true);
    assert_eq!(counts(&be, 1000, |_| cl()), vec![1000, 0, 0, 0]);
}

#[test]
fn allbackups_spreads_over_every_usable_backup() {
    let opts = BackendOpts {
        allbackups: true,
        ..BackendOpts::default()
    };
    let be = backend_with(
        Balance::RoundRobin,
        &[s(1), s(1).backup(), s(1).backup(), s(1).backup()],
        opts,
    );
    assert_eq!(counts(&be, 900, |_| cl()), vec![900, 0, 0, 0]);
    be.servers[0].set_up(false);
    assert_eq!(counts(&be, 900, |_| cl()), vec![0, 300, 300, 300]);
    be.servers[2].set_maint(true);
    assert_eq!(counts(&be, 900, |_| cl()), vec![0, 450, 0, 450]);
    be.servers[0].set_up(true);
    assert_eq!(counts(&be, 900, |_| cl()), vec![900, 0, 0, 0]);
}

#[test]
fn unusable_servers_never_picked() {
    for balance in ALL {
        let be = backend(balance, &[s(1), s(1).disabled(), s(0), s(1), s(1).backup()]);
        be.servers[0].set_up(false);
        let c = counts(&be, 2000, client);
        assert_eq!(c, vec![0, 0, 0, 2000, 0], "{balance:?}");
        be.servers[3].set_weight(0);
        let c = counts(&be, 100, client);
        assert_eq!(c, vec![0, 0, 0, 0, 100], "{balance:?}: backup expected");
        be.servers[4].set_maint(true);
        assert_eq!(be.pick(cl(), None), None, "{balance:?}");
        let fut = pin!(be.acquire(cl(), None, None));
        assert!(
            matches!(poll_once(fut), Poll::Ready(Err(AcquireError::NoServer))),
            "{balance:?}"
        );
    }
}

#[test]
fn exclude_honoured() {
    for balance in ALL {
        let be = backend(balance, &[s(1), s(1), s(1), s(1).backup()]);
        for k in 0..3000 {
            let got = be.pick(client(k), Some(k % 3)).expect("server");
            assert_ne!(got, k % 3, "{balance:?}");
            assert_ne!(got, 3, "{balance:?}: backup while actives remain");
        }
        // Excluding the last active server falls back to the backup.
        be.servers[1].set_up(false);
        be.servers[2].set_up(false);
        assert_eq!(be.pick(cl(), Some(0)), Some(3), "{balance:?}");
        be.servers[3].set_up(false);
        assert_eq!(be.pick(cl(), Some(0)), None, "{balance:?}");
    }
}

#[test]
fn full_servers_are_skipped() {
    for balance in [
        Balance::RoundRobin,
        Balance::StaticRr,
        Balance::LeastConn,
        Balance::First,
        Balance::Random,
    ] {
        let be = backend(balance, &[s(1).maxconn(1), s(1)]);
        let mut held = Vec::new();
        while be.servers[0].cur_conns() == 0 {
            held.push(take(&be, None));
        }
        let c = counts(&be, 500, |_| cl());
        assert_eq!(c, vec![0, 500], "{balance:?}");
        assert_eq!(be.servers[0].max_conns(), 1);
    }
}

#[test]
fn counters_track_slots() {
    let be = backend(Balance::RoundRobin, &[s(1), s(1)]);
    let held: Vec<Slot> = (0..6).map(|_| take(&be, None)).collect();
    assert_eq!(be.servers[0].cur_conns(), 3);
    assert_eq!(be.servers[0].selected(), 3);
    drop(held);
    assert_eq!(be.servers[0].cur_conns(), 0);
    assert_eq!(be.servers[0].max_conns(), 3);
    assert_eq!(be.servers[1].selected(), 3);
    be.servers[0].set_weight(1000);
    assert_eq!(be.servers[0].weight(), MAX_WEIGHT);
}

// ---------------------------------------------------------------- queue

#[test]
fn queue_bounds_and_fifo_across_threads() {
    const WAITERS: usize = 10;
    const THREADS: usize = 2;
    let be = backend(Balance::RoundRobin, &[s(1).maxconn(2)]);
    let order = Arc::new(Mutex::new(Vec::new()));
    let active = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let release: Arc<Vec<AtomicBool>> =
        Arc::new((0..WAITERS).map(|_| AtomicBool::new(false)).collect());

    let mut senders = Vec::new();
    let mut threads = Vec::new();
    for _ in 0..THREADS {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
        senders.push(tx);
        let (be, order, active, peak, release) = (
            be.clone(),
            order.clone(),
            active.clone(),
            peak.clone(),
            release.clone(),
        );
        threads.push(std::thread::spawn(move || {
            rt().block_on(async move {
                let mut tasks = Vec::new();
                while let Some(k) = rx.recv().await {
                    let (be, order, active, peak, release) = (
                        be.clone(),
                        order.clone(),
                        active.clone(),
                        peak.clone(),
                        release.clone(),
                    );
                    tasks.push(tokio::spawn(async move {
                        let slot = be.acquire(client(k), None, None).await.expect("slot");
                        let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        assert!(slot.server().cur_conns() <= 2);
                        order.lock().expect("order").push(k);
                        let start = Instant::now();
                        while !release[k].load(Ordering::SeqCst) && start.elapsed() < DEADLINE {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        active.fetch_sub(1, Ordering::SeqCst);
                        drop(slot);
                    }));
                }
                for t in tasks {
                    t.await.expect("task");
                }
            });
        }));
    }

    let wait_until = |what: &str, cond: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    // Start acquirers one by one, alternating threads, each visibly in place
    // (holding a slot or queued) before the next starts: that fixes the
    // arrival order.
    for k in 0..WAITERS {
        senders[k % THREADS].send(k).expect("send");
        wait_until("arrival", &|| {
            order.lock().expect("order").len() + be.queue_cur() == k + 1
        });
    }
    assert_eq!(be.queue_cur(), WAITERS - 2);
    assert_eq!(be.queue_max(), WAITERS - 2);
    // Release holders one at a time, oldest first; each release must hand
    // the slot to the next waiter in arrival order.
    for n in 0..WAITERS {
        let holder = order.lock().expect("order")[n];
        release[holder].store(true, Ordering::SeqCst);
        let want = (n + 3).min(WAITERS);
        wait_until("grant", &|| order.lock().expect("order").len() == want);
    }
    drop(senders);
    for t in threads {
        t.join().expect("thread");
    }
    assert_eq!(
        *order.lock().expect("order"),
        (0..WAITERS).collect::<Vec<_>>()
    );
    assert_eq!(peak.load(Ordering::SeqCst), 2);
    assert_eq!(be.servers[0].max_conns(), 2);
    assert_eq!(be.servers[0].cur_conns(), 0);
    assert_eq!(be.servers[0].selected(), WAITERS as u64);
    assert_eq!(be.queue_cur(), 0);
}

#[test]
fn queue_timeout_leaves_queue_clean() {
    let be = backend(Balance::LeastConn, &[s(1).maxconn(1)]);
    rt().block_on(async {
        let held = be.acquire(cl(), None, None).await.expect("slot");
        let start = Instant::now();
        let r = be
            .acquire(cl(), None, Some(Duration::from_millis(50)))
            .await;
        assert_eq!(r.err(), Some(AcquireError::QueueTimeout));
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert_eq!(be.queue_cur(), 0);
        assert_eq!(be.queue_max(), 1);
        drop(held);
        // The slot was not handed to the departed waiter.
        assert_eq!(be.servers[0].cur_conns(), 0);
        let again = be
            .acquire(cl(), None, Some(Duration::from_millis(50)))
            .await
            .expect("slot free again");
        assert_eq!(again.index(), 0);
    });
}

#[test]
fn queued_request_served_within_timeout() {
    let be = backend(Balance::RoundRobin, &[s(1).maxconn(1)]);
    rt().block_on(async {
        let held = be.acquire(cl(), None, None).await.expect("slot");
        let be2 = be.clone();
        let waiter = tokio::spawn(async move {
            be2.acquire(cl(), None, Some(Duration::from_secs(5)))
                .await
                .map(|s| s.index())
        });
        let start = Instant::now();
        while be.queue_cur() == 0 {
            assert!(start.elapsed() < DEADLINE, "request never queued");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(held);
        assert_eq!(waiter.await.expect("join"), Ok(0));
        assert_eq!(be.servers[0].cur_conns(), 0);
    });
}

#[test]
fn maxqueue_refuses_with_queue_full() {
    // Backend queue: bounded by the candidates' maxqueue sum (2 + 1).
    let be = backend(
        Balance::RoundRobin,
        &[s(1).maxconn(1).maxqueue(2), s(1).maxconn(1).maxqueue(1)],
    );
    let _a = take(&be, None);
    let _b = take(&be, None);
    let mut queued: Vec<Pin<Box<_>>> = Vec::new();
    for _ in 0..3 {
        let mut f = Box::pin(be.acquire(cl(), None, None));
        assert!(poll_once(f.as_mut()).is_pending());
        queued.push(f);
    }
    let mut f = pin!(be.acquire(cl(), None, None));
    assert!(matches!(
        poll_once(f.as_mut()),
        Poll::Ready(Err(AcquireError::QueueFull))
    ));
    assert_eq!(be.queue_cur(), 3);
    drop(queued);
    assert_eq!(be.queue_cur(), 0);

    // Server queue (source pins the client to its server).
    let be = backend(Balance::Source, &[s(1).maxconn(1).maxqueue(1)]);
    let _held = take(&be, None);
    let mut f1 = Box::pin(be.acquire(cl(), None, None));
    assert!(poll_once(f1.as_mut()).is_pending());
    assert_eq!(be.servers[0].queue_cur(), 1);
    let mut f2 = pin!(be.acquire(cl(), None, None));
    assert!(matches!(
        poll_once(f2.as_mut()),
        Poll::Ready(Err(AcquireError::QueueFull))
    ));
    drop(f1);
    assert_eq!(be.servers[0].queue_cur(), 0);
    assert_eq!(be.servers[0].queue_max(), 1);
}

#[test]
fn unlimited_maxqueue_keeps_queueing() {
    let be = backend(
        Balance::RoundRobin,
        &[s(1).maxconn(1).maxqueue(1), s(1).maxconn(1)],
    );
    let _a = take(&be, None);
    let _b = take(&be, None);
    let queued: Vec<_> = (0..50)
        .map(|_| {
            let mut f = Box::pin(be.acquire(cl(), None, None));
            assert!(poll_once(f.as_mut()).is_pending());
            f
        })
        .collect();
    assert_eq!(be.queue_cur(), 50);
    drop(queued);
    assert_eq!(be.queue_cur(), 0);
}

#[test]
fn dropped_waiters_do_not_leak() {
    let be = backend(Balance::RoundRobin, &[s(1).maxconn(1)]);
    let held = take(&be, None);
    let mut a = Box::pin(be.acquire(cl(), None, None));
    let mut b = Box::pin(be.acquire(cl(), None, None));
    let mut c = Box::pin(be.acquire(cl(), None, None));
    for f in [a.as_mut(), b.as_mut(), c.as_mut()] {
        assert!(poll_once(f).is_pending());
    }
    assert_eq!(be.queue_cur(), 3);
    // A waiter leaving the middle of the queue.
    drop(b);
    assert_eq!(be.queue_cur(), 2);
    // The slot is granted to `a`, which is dropped before it ever sees it:
    // the grant must pass on to `c`.
    drop(held);
    assert_eq!(be.queue_cur(), 1);
    assert_eq!(be.servers[0].cur_conns(), 1);
    drop(a);
    assert_eq!(be.queue_cur(), 0);
    assert_eq!(be.servers[0].cur_conns(), 1);
    let slot = match poll_once(c.as_mut()) {
        Poll::Ready(r) => r.expect("c is served"),
        Poll::Pending => panic!("c not served"),
    };
    drop(slot);
    assert_eq!(be.servers[0].cur_conns(), 0);
    // Nobody left: a new request gets the slot at once.
    drop(take(&be, None));
    drop(c);
    assert_eq!(be.servers[0].cur_conns(), 0);
}

#[test]
fn aborted_tasks_do_not_leak_across_threads() {
    const ROUNDS: usize = 200;
    let be = backend(Balance::LeastConn, &[s(1).maxconn(1), s(1).maxconn(1)]);
    let be2 = be.clone();
    // A thread that takes and frees slots while this one queues and aborts.
    let churn = std::thread::spawn(move || {
        rt().block_on(async move {
            for _ in 0..ROUNDS {
                let s = be2
                    .acquire(cl(), None, Some(Duration::from_secs(5)))
                    .await
                    .expect("slot");
                tokio::task::yield_now().await;
                drop(s);
            }
        })
    });
    rt().block_on(async {
        for k in 0..ROUNDS {
            let be3 = be.clone();
            let t = tokio::spawn(async move {
                let s = be3.acquire(cl(), None, None).await;
                tokio::time::sleep(Duration::from_micros(200)).await;
                drop(s);
            });
            if k % 2 == 0 {
                tokio::task::yield_now().await;
            }
            t.abort();
            let _ = t.await;
        }
    });
    churn.join().expect("churn thread");
    assert_eq!(be.queue_cur(), 0);
    assert!(be.servers.iter().all(|s| s.cur_conns() == 0));
    assert!(be.servers.iter().all(|s| s.max_conns() <= 1));
}

#[test]
fn queued_requests_move_to_a_server_that_comes_up() {
    let be = backend(Balance::RoundRobin, &[s(1).maxconn(1), s(1)]);
    be.servers[1].set_up(false);
    let _held = take(&be, None);
    let mut w = Box::pin(be.acquire(cl(), None, None));
    assert!(poll_once(w.as_mut()).is_pending());
    be.servers[1].set_up(true);
    be.rebalance();
    match poll_once(w.as_mut()) {
        Poll::Ready(Ok(s)) => assert_eq!(s.index(), 1),
        other => panic!("not served: {:?}", other.map(|r| r.map(|s| s.index()))),
    }
}

#[test]
fn roundrobin_many_servers_stays_even() {
    const SERVERS: usize = 2000;
    let be = backend(Balance::RoundRobin, &vec![s(1); SERVERS]);
    let c = counts(&be, 2 * SERVERS, |_| cl());
    assert!(c.iter().all(|&x| x == 2), "uneven: {:?}", &c[..10]);
}

#[test]
fn slots_and_acquire_cross_threads() {
    fn assert_send<T: Send + 'static>(_: &T) {}
    let be = backend(Balance::RoundRobin, &[s(1)]);
    let slot = take(&be, None);
    assert_send(&slot);
    let fut = {
        let be = be.clone();
        async move { be.acquire(cl(), None, Some(Duration::from_secs(1))).await }
    };
    assert_send(&fut);
    drop(slot);
}

// ------------------------------------------------------ runtime maxconn

#[test]
fn maxconn_changed_at_run_time_applies_to_the_next_slots() {
    let be = backend(Balance::RoundRobin, &[s(1).maxconn(1)]);
    let srv = &be.servers[0];
    let first = take(&be, None);
    let mut queued = Box::pin(be.acquire(cl(), None, None));
    assert!(poll_once(queued.as_mut()).is_pending());
    // Raised: the waiter is served at once (rebalance), not at the next release.
    srv.set_maxconn(2);
    be.rebalance();
    let second = match poll_once(queued.as_mut()) {
        Poll::Ready(r) => r.expect("served after the raise"),
        Poll::Pending => panic!("still queued after maxconn was raised"),
    };
    assert_eq!(srv.cur_conns(), 2);
    // Lowered below what is out: the next release frees its slot instead of
    // handing it to a waiter, until the server is back under the limit.
    srv.set_maxconn(1);
    let mut waiting = Box::pin(be.acquire(cl(), None, None));
    assert!(poll_once(waiting.as_mut()).is_pending());
    drop(first);
    assert!(poll_once(waiting.as_mut()).is_pending());
    assert_eq!(srv.cur_conns(), 1);
    drop(second);
    let third = match poll_once(waiting.as_mut()) {
        Poll::Ready(r) => r.expect("served once under the limit"),
        Poll::Pending => panic!("not served once under the lowered limit"),
    };
    assert_eq!(srv.cur_conns(), 1);
    assert_eq!(srv.max_conns(), 2);
    drop(third);
    // 0 = unlimited.
    srv.set_maxconn(0);
    let many: Vec<_> = (0..5).map(|_| take(&be, None)).collect();
    assert_eq!(srv.cur_conns(), 5);
    drop(many);
    assert_eq!(srv.cur_conns(), 0);
}

#[test]
fn server_address_swaps_for_the_next_reader() {
    let be = backend(Balance::RoundRobin, &[s(1)]);
    let srv = &be.servers[0];
    assert_eq!(srv.addr(), SocketAddr::from(([127, 0, 0, 1], 10_000)));
    let new = SocketAddr::from(([127, 0, 0, 2], 8081));
    srv.set_addr(new);
    assert_eq!(srv.addr(), new);
    assert_eq!(take(&be, None).server().addr(), new);
}

// ---------------------------------------------------------------- stick tables

/// Poll `acquire_sticky` once: the slot it gives at once, `None` when it queued.
fn take_sticky(be: &Arc<BackendRt>, sticky: Option<usize>, exclude: Option<usize>) -> Option<Slot> {
    let fut = pin!(be.acquire_sticky(cl(), sticky, exclude, None));
    match poll_once(fut) {
        Poll::Ready(r) => Some(r.expect("slot")),
        Poll::Pending => None,
    }
}

#[test]
fn a_full_sticky_server_queues_the_flow_for_itself() {
    let be = backend(Balance::RoundRobin, &[s(1).maxconn(1), s(1)]);
    let held = take_sticky(&be, Some(0), None).expect("room");
    assert!(take_sticky(&be, Some(0), None).is_none(), "waits for s0");
    assert_eq!(be.servers[0].queue_cur(), 0, "the dropped waiter left");
    drop(held);
    assert_eq!(take_sticky(&be, Some(0), None).map(|s| s.index()), Some(0));
}

#[test]
fn a_sticky_server_wins_over_the_algorithm_while_it_takes_traffic() {
    let be = backend(Balance::RoundRobin, &[s(1), s(1), s(1).backup()]);
    for _ in 0..4 {
        assert_eq!(take_sticky(&be, Some(1), None).map(|s| s.index()), Some(1));
    }
    // A backup that sticks is used even while the actives are up (Galera).
    assert_eq!(take_sticky(&be, Some(2), None).map(|s| s.index()), Some(2));
    // Draining (weight 0) keeps persistent traffic, as HAProxy's.
    be.servers[1].set_weight(0);
    assert_eq!(take_sticky(&be, Some(1), None).map(|s| s.index()), Some(1));
    // Down, in maintenance or excluded (a redispatch): the algorithm decides.
    be.servers[1].set_up(false);
    assert_eq!(take_sticky(&be, Some(1), None).map(|s| s.index()), Some(0));
    be.servers[2].set_maint(true);
    assert_eq!(take_sticky(&be, Some(2), None).map(|s| s.index()), Some(0));
    be.servers[1].set_up(true);
    be.servers[1].set_weight(1);
    assert_eq!(
        take_sticky(&be, Some(0), Some(0)).map(|s| s.index()),
        Some(1),
        "excluded"
    );
}

#[test]
fn balance_hash_keys_on_the_sample_it_names() {
    use crate::config::HashKey;
    use crate::lb::FlowKey;
    let servers = [s(1), s(1), s(1), s(1)];
    let at = |i: usize, dport: u16| FlowKey {
        src: client(i),
        dst: Some(SocketAddr::from(([127, 0, 0, 1], dport))),
    };
    // `hash dst_port`: one server per port, whatever the client.
    let be = backend(Balance::Hash(HashKey::DstPort), &servers);
    for port in [80u16, 443, 3306, 6379, 8080] {
        let first = be.pick(at(0, port), None).expect("pick");
        assert!(
            (1..200).all(|i| be.pick(at(i, port), None) == Some(first)),
            "every client to port {port} goes to one server"
        );
    }
    // Ports spread: 64 ports reach more than one server.
    let used: std::collections::HashSet<_> = (0..64u16)
        .filter_map(|p| be.pick(at(0, 1000 + p), None))
        .collect();
    assert!(used.len() > 1, "ports spread over the servers: {used:?}");
    // `hash src` is `balance source`: the same server for the same client.
    let by_src = backend(Balance::Hash(HashKey::Src), &servers);
    let source = backend(Balance::Source, &servers);
    for i in 0..500 {
        assert_eq!(by_src.pick(at(i, 1), None), source.pick(client(i), None));
        assert_eq!(by_src.pick(at(i, 1), None), by_src.pick(at(i, 2), None));
    }
    // `hash src_port`: the client's port decides, not its address.
    let by_sport = backend(Balance::Hash(HashKey::SrcPort), &servers);
    let from = |i: usize, port: u16| FlowKey {
        src: SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], port)),
        dst: None,
    };
    for port in [1000u16, 2000, 3000] {
        let first = by_sport.pick(from(0, port), None);
        assert!((1..100).all(|i| by_sport.pick(from(i, port), None) == first));
    }
}
