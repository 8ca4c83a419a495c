//! Warm server spares (issue 6), end to end through the real `shunt` binary:
//! the purge sequence and the steady-load size, spares actually serving clients,
//! a server that closes idle spares, a server-first greeting on a spare (splice,
//! and sockmap where BPF is wanted), maintenance and address changes, and the
//! `pool-max-conn` bound under concurrent load.
//!
//! The probe server records every connection it accepts (when, whether a byte
//! arrived, when it closed) and answers the first line of a connection with
//! `TAG id=N at=US\n`, where `at` is its accept time in µs since the test's
//! epoch: a client that connected after `at` was served from a warm spare.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shunt_tests::*;

/// What the probe server knows about one accepted connection.
#[derive(Debug, Clone)]
struct Conn {
    /// Some byte arrived (a client's flow).
    used: bool,
    /// The peer closed it (EOF or reset).
    closed_at: Option<Instant>,
}

/// How a probe server behaves.
#[derive(Clone, Copy)]
struct Behaviour {
    tag: &'static str,
    /// Sent as soon as a connection is accepted (a server-first protocol).
    greeting: Option<&'static [u8]>,
    /// Close a connection that sent nothing within this delay.
    idle_close: Option<Duration>,
}

struct Probe {
    server: Server,
    conns: Arc<Mutex<Vec<Conn>>>,
}

impl Probe {
    fn start(epoch: Instant, b: Behaviour) -> Probe {
        let conns: Arc<Mutex<Vec<Conn>>> = Arc::default();
        let c2 = conns.clone();
        let server = Server::start(move |s| serve(epoch, b, &c2, s));
        Probe { server, conns }
    }

    fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    fn accepted(&self) -> usize {
        self.conns.lock().unwrap().len()
    }

    /// Connections open now that never carried a byte (spares, seen from the server).
    fn open_unused(&self) -> usize {
        self.conns
            .lock()
            .unwrap()
            .iter()
            .filter(|c| !c.used && c.closed_at.is_none())
            .count()
    }
}

fn serve(epoch: Instant, b: Behaviour, conns: &Mutex<Vec<Conn>>, mut s: TcpStream) {
    let at = epoch.elapsed().as_micros();
    let id = {
        let mut v = conns.lock().unwrap();
        v.push(Conn {
            used: false,
            closed_at: None,
        });
        v.len() - 1
    };
    let set = |f: &dyn Fn(&mut Conn)| f(&mut conns.lock().unwrap()[id]);
    if let Some(g) = b.greeting {
        let _ = s.write_all(g);
    }
    let _ = s.set_read_timeout(b.idle_close.or(Some(Duration::from_secs(30))));
    let mut buf = [0u8; 4096];
    let mut first = true;
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if first {
                    first = false;
                    set(&|c| c.used = true);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                    let _ = writeln!(s, "{} id={id} at={at}", b.tag);
                }
                let _ = s.write_all(&buf[..n]);
            }
        }
    }
    let _ = s.shutdown(Shutdown::Both);
    set(&|c| c.closed_at = Some(Instant::now()));
}

const PLAIN: Behaviour = Behaviour {
    tag: "A",
    greeting: None,
    idle_close: None,
};

fn config(port: u16, nbthread: usize, global: &str, servers: &[(SocketAddr, &str)]) -> String {
    let mut cfg = format!(
        "global\n    nbthread {nbthread}\n    stats socket @DIR@/admin.sock level admin\n{global}\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n\nbackend be\n"
    );
    for (i, (a, kw)) in servers.iter().enumerate() {
        cfg.push_str(&format!("    server s{} {a} {kw}\n", i + 1));
    }
    cfg
}

fn start(
    nbthread: usize,
    global: &str,
    servers: &[(SocketAddr, &str)],
    args: &[&str],
) -> (Shunt, SocketAddr) {
    let port = free_port();
    let shunt = Shunt::start(&config(port, nbthread, global, servers), args);
    (shunt, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// `show servers conn be` for server `sv`: (used_cur, used_max, need_est, idle_cur,
/// idle_per_thr).
#[derive(Debug)]
struct ConnRow {
    need_est: usize,
    idle_lim: i64,
    idle_cur: usize,
    per_thr: Vec<usize>,
}

fn servers_conn(sock: &Path, sv: &str) -> ConnRow {
    let out = cli(sock, "show servers conn be");
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("be/{sv} ")))
        .unwrap_or_else(|| panic!("no be/{sv} in:\n{out}"));
    let f: Vec<&str> = line.split(' ').collect();
    let n = |i: usize| f[i].parse::<usize>().unwrap();
    ConnRow {
        need_est: n(8),
        idle_lim: f[11].parse().unwrap(),
        idle_cur: n(12),
        per_thr: f[13..].iter().map(|v| v.parse().unwrap()).collect(),
    }
}

/// One served client: connect, send a line, read the server's answer line and the
/// echo. Returns (tag, server accept time µs, client connect time µs).
fn request(front: SocketAddr, epoch: Instant) -> (String, u128, u128) {
    let t = epoch.elapsed().as_micros();
    let mut c = connect(front);
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"ping\n").unwrap();
    let mut r = BufReader::new(c);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let mut echo = String::new();
    r.read_line(&mut echo).unwrap();
    assert_eq!(echo, "ping\n", "answer line {line:?}");
    let mut it = line.split_whitespace();
    let tag = it.next().unwrap_or_default().to_string();
    let at = it
        .find_map(|w| w.strip_prefix("at="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("bad answer {line:?}"));
    (tag, at, t)
}

/// Hold `n` concurrent served clients open until the returned guard drops.
fn hold(front: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let mut c = connect(front);
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.write_all(b"x").unwrap();
            let mut b = [0u8; 1];
            c.read_exact(&mut b).unwrap();
            c
        })
        .collect()
}

fn warm(sock: &Path) -> (u64, u64, u64, u64) {
    let g = |c| stat(sock, "be", "s1", c);
    (
        g("warm_hit"),
        g("warm_miss"),
        g("warm_dead"),
        g("warm_purged"),
    )
}

#[test]
fn purge_sequence_and_steady_load() {
    let epoch = Instant::now();
    let probe = Probe::start(epoch, PLAIN);
    let period = Duration::from_millis(500);
    let (shunt, front) = start(
        1,
        "",
        &[(probe.addr(), "pool-max-conn 20 pool-purge-delay 500ms")],
        &[],
    );
    let sock = shunt.sock();
    // A burst of 10 concurrent flows teaches the pool a need of 10.
    let clients = hold(front, 10);
    eventually("10 spares", Duration::from_secs(5), || {
        servers_conn(&sock, "s1").idle_cur == 10
    });
    std::thread::sleep(period * 2);
    assert_eq!(servers_conn(&sock, "s1").idle_cur, 10, "steady at the need");
    drop(clients);
    // No use from now on: sample the spare count across the periods.
    let t0 = Instant::now();
    let mut seq: Vec<(usize, Duration)> = Vec::new();
    while t0.elapsed() < period * 10 {
        let n = servers_conn(&sock, "s1").idle_cur;
        if seq.last().map(|l| l.0) != Some(n) {
            seq.push((n, t0.elapsed()));
        }
        if n == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let values: Vec<usize> = seq.iter().map(|s| s.0).collect();
    assert_eq!(values, [10, 6, 3, 1, 0], "{seq:?}");
    // 10 survives at least one full period after the last use; each later step
    // is one period after the previous one.
    assert!(seq[1].1 >= period, "{seq:?}");
    for w in seq[1..].windows(2) {
        assert!(w[1].1 - w[0].1 >= period / 2, "{seq:?}");
    }
    let (_, _, _, purged) = warm(&sock);
    assert_eq!(purged, 10);
    eventually(
        "the server saw every spare closed",
        Duration::from_secs(2),
        || probe.open_unused() == 0,
    );

    // Steady load of 4 concurrent flows (each held 100 ms, then a 100 ms pause so
    // a flow has ended before its client's next one starts): the pool settles at 4.
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) && n < 200 {
                    let c = hold(front, 1);
                    std::thread::sleep(Duration::from_millis(100));
                    drop(c);
                    std::thread::sleep(Duration::from_millis(100));
                    n += 1;
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    eventually("need_est 4 under the load", Duration::from_secs(10), || {
        servers_conn(&sock, "s1").need_est == 4
    });
    std::thread::sleep((period * 3).saturating_sub(t0.elapsed()));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    eventually("4 spares after the load", Duration::from_secs(3), || {
        servers_conn(&sock, "s1").idle_cur == 4
    });
    assert_eq!(servers_conn(&sock, "s1").need_est, 4);
}

#[test]
fn spares_serve_clients_without_a_connect() {
    let epoch = Instant::now();
    let probe = Probe::start(epoch, PLAIN);
    let (shunt, front) = start(1, "", &[(probe.addr(), "pool-max-conn 8")], &[]);
    let sock = shunt.sock();
    let row = servers_conn(&sock, "s1");
    assert_eq!((row.idle_lim, row.idle_cur), (8, 0));
    drop(hold(front, 3));
    eventually("3 spares", Duration::from_secs(5), || {
        servers_conn(&sock, "s1").idle_cur == 3 && probe.open_unused() == 3
    });
    let (hit0, miss0, _, _) = warm(&sock);
    for _ in 0..6 {
        let (_, at, t) = request(front, epoch);
        assert!(
            at < t,
            "the server accepted this flow's connection after the client connected"
        );
        // The take kicked a refill: wait for it (and for the server to have
        // accepted it: its accept loop polls) so the next client finds one.
        eventually("refill", Duration::from_secs(3), || {
            servers_conn(&sock, "s1").idle_cur == 3 && probe.open_unused() == 3
        });
    }
    let (hit, miss, dead, _) = warm(&sock);
    assert_eq!((hit - hit0, miss - miss0, dead), (6, 0, 0));
    assert_eq!(info_u64(&sock, "warm_hit"), hit);
    assert_eq!(stat(&sock, "be", "BACKEND", "warm_hit"), hit);
    let act = cli(&sock, "show activity");
    assert!(act.contains("\nfd_takeover: 0\n"), "{act}");
}

#[test]
fn server_closing_idle_spares_costs_no_client_error() {
    let epoch = Instant::now();
    let probe = Probe::start(
        epoch,
        Behaviour {
            idle_close: Some(Duration::from_millis(100)),
            ..PLAIN
        },
    );
    let (shunt, front) = start(1, "", &[(probe.addr(), "pool-max-conn 5")], &[]);
    let sock = shunt.sock();
    drop(hold(front, 3));
    eventually("3 spares", Duration::from_secs(5), || {
        servers_conn(&sock, "s1").idle_cur == 3
    });
    // The server closes them; the pool learns it only at take time.
    eventually(
        "the server closed the spares",
        Duration::from_secs(3),
        || probe.open_unused() == 0,
    );
    // Each request comes well after the server closed the spare made for it (100 ms
    // idle, 600 ms apart): a close racing the take itself is a different case (the
    // kernel cannot tell shunt in advance) and is not what this checks.
    for _ in 0..8 {
        let (tag, _, _) = request(front, epoch);
        assert_eq!(tag, "A");
        std::thread::sleep(Duration::from_millis(600));
    }
    let (_, _, dead, _) = warm(&sock);
    assert!(dead >= 3, "dead spares discarded: {dead}");
    assert_eq!(stat(&sock, "be", "s1", "econ"), 0);
    assert_eq!(stat(&sock, "be", "s1", "eresp"), 0);
    assert_eq!(stat(&sock, "be", "s1", "srv_abrt"), 0);
}

/// A spare the server greeted: the client reads the greeting once, in order
/// before the echo of its own bytes, and nothing else.
fn greeting_once(mode: &str) {
    const GREET: &[u8] = b"220 ready\r\n";
    let epoch = Instant::now();
    let probe = Probe::start(
        epoch,
        Behaviour {
            greeting: Some(GREET),
            ..PLAIN
        },
    );
    let (shunt, front) = start(
        1,
        "",
        &[(probe.addr(), "pool-max-conn 4")],
        &["--forward-mode", mode],
    );
    let sock = shunt.sock();
    drop(hold(front, 2));
    eventually("2 spares", Duration::from_secs(5), || {
        servers_conn(&sock, "s1").idle_cur == 2 && probe.open_unused() == 2
    });
    // Let the greetings reach the spares' receive queues.
    std::thread::sleep(Duration::from_millis(100));
    let (hit0, _, _, _) = warm(&sock);
    for round in 0..3 {
        let t = epoch.elapsed().as_micros();
        let mut c = connect(front);
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut g = vec![0u8; GREET.len()];
        c.read_exact(&mut g).unwrap();
        assert_eq!(g, GREET, "round {round}");
        c.write_all(b"hello\n").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let rest = read_to_end(&mut c).unwrap();
        let text = String::from_utf8_lossy(&rest);
        let (line, echo) = text.split_once('\n').expect("answer line");
        assert_eq!(echo, "hello\n", "round {round}: {text:?}");
        let at: u128 = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("at="))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!(at < t, "round {round}: not served from a spare");
        eventually("refill", Duration::from_secs(3), || {
            servers_conn(&sock, "s1").idle_cur == 2 && probe.open_unused() == 2
        });
        std::thread::sleep(Duration::from_millis(100));
    }
    let (hit, _, dead, _) = warm(&sock);
    assert_eq!((hit - hit0, dead), (3, 0));
    assert_mode(&sock, mode);
}

#[test]
fn greeting_on_a_spare_reaches_the_client_once_splice() {
    greeting_once("splice");
}

#[test]
fn greeting_on_a_spare_reaches_the_client_once_copy() {
    greeting_once("copy");
}

#[test]
fn greeting_on_a_spare_reaches_the_client_once_sockmap() {
    if bpf_wanted() {
        greeting_once("sockmap");
    }
}

#[test]
fn maintenance_and_address_change_close_every_spare() {
    let epoch = Instant::now();
    let a = Probe::start(epoch, PLAIN);
    let b = Probe::start(epoch, Behaviour { tag: "B", ..PLAIN });
    let purge = Duration::from_secs(1);
    let (shunt, front) = start(
        2,
        "",
        &[(a.addr(), "pool-max-conn 6 pool-purge-delay 1s")],
        &[],
    );
    let sock = shunt.sock();
    // At least 4 spares (a flow still closing may push the need a little higher),
    // all accepted by the server (its accept loop polls), none in flight.
    let rewarm = || {
        drop(hold(front, 4));
        eventually("4 spares", Duration::from_secs(5), || {
            let row = servers_conn(&sock, "s1");
            row.idle_cur >= 4 && a.open_unused() == row.idle_cur
        });
    };
    rewarm();

    // Maintenance: every spare closed within one purge tick, none refilled.
    let t0 = Instant::now();
    assert_eq!(cli(&sock, "disable server be/s1"), "\n");
    eventually("spares closed on maintenance", purge, || {
        a.open_unused() == 0
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(a.open_unused(), 0, "no refill in maintenance");
    assert_eq!(servers_conn(&sock, "s1").idle_cur, 0);
    eprintln!("maintenance: spares closed within {:?}", t0.elapsed());
    assert_eq!(cli(&sock, "enable server be/s1"), "\n");

    // Address change: same, and every later flow reaches the new address.
    rewarm();
    let before = a.accepted();
    let t0 = Instant::now();
    let out = cli(
        &sock,
        &format!("set server be/s1 addr 127.0.0.1 port {}", b.addr().port()),
    );
    assert!(out.contains("changed"), "{out}");
    for _ in 0..6 {
        let (tag, _, _) = request(front, epoch);
        assert_eq!(tag, "B", "a flow after the change reached the old address");
    }
    eventually("spares closed on address change", purge, || {
        a.open_unused() == 0
    });
    eprintln!("address change: spares closed within {:?}", t0.elapsed());
    assert_eq!(a.accepted(), before, "nothing connected to the old address");
    eventually("spares at the new address", Duration::from_secs(5), || {
        b.open_unused() > 0
    });
}

#[test]
fn pool_max_conn_is_never_exceeded() {
    const MAX: usize = 3;
    const CLIENTS: usize = 8;
    let epoch = Instant::now();
    let probe = Probe::start(epoch, PLAIN);
    let (shunt, front) = start(
        2,
        "",
        &[(probe.addr(), "pool-max-conn 3 pool-purge-delay 30s")],
        &[],
    );
    let sock = shunt.sock();
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (stop, served) = (stop.clone(), served.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) && n < 2000 {
                    request(front, epoch);
                    served.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    let mut peak = 0;
    while t0.elapsed() < Duration::from_secs(2) {
        let row = servers_conn(&sock, "s1");
        peak = peak.max(row.idle_cur).max(row.per_thr.iter().sum());
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert!(peak <= MAX, "spares peaked at {peak}");
    eventually("refill settles", Duration::from_secs(3), || {
        servers_conn(&sock, "s1").idle_cur == MAX
    });
    std::thread::sleep(Duration::from_millis(200));
    let row = servers_conn(&sock, "s1");
    let (hit, miss, dead, purged) = warm(&sock);
    let served = served.load(Ordering::Relaxed) as u64;
    assert_eq!(hit + miss, served);
    assert!(hit > 0, "spares were used");
    // Every connection the server accepted either served a client, is a spare
    // now, or was discarded by the pool: none beyond pool-max-conn was made.
    let accepted = probe.accepted() as u64;
    assert_eq!(accepted, served + row.idle_cur as u64 + dead + purged);
    assert_eq!(probe.open_unused(), row.idle_cur);
    assert!(row.idle_cur <= MAX);
}

/// Not a test: the figures of the benchmark point on loopback (no
/// `tc netem` here). Run with `--ignored --nocapture`:
/// - time to first response byte of new flows, with and without spares (p50, p99);
/// - takeovers under a connection storm with `pool-low-conn 0` vs `2 * nbthread`.
#[test]
#[ignore = "benchmark, not a test: prints loopback TTFB and takeover figures; run with --ignored --nocapture"]
fn bench_ttfb_and_takeover_rate() {
    const SAMPLES: usize = 400;
    let epoch = Instant::now();
    let probe = Probe::start(epoch, PLAIN);
    for kw in ["", "pool-max-conn 4"] {
        let (_shunt, front) = start(1, "", &[(probe.addr(), kw)], &[]);
        drop(hold(front, 2));
        std::thread::sleep(Duration::from_millis(300));
        let mut us: Vec<u128> = (0..SAMPLES)
            .map(|_| {
                let t = Instant::now();
                let mut c = connect(front);
                c.write_all(b"ping\n").unwrap();
                let mut b = [0u8; 1];
                c.read_exact(&mut b).unwrap();
                let e = t.elapsed().as_micros();
                drop(c);
                std::thread::sleep(Duration::from_millis(2));
                e
            })
            .collect();
        us.sort_unstable();
        println!(
            "ttfb {:<16} p50 {} us, p99 {} us",
            if kw.is_empty() { "no pool" } else { kw },
            us[SAMPLES / 2],
            us[SAMPLES * 99 / 100]
        );
    }
    for low in [0, 4] {
        let (shunt, front) = start(
            2,
            "",
            &[(
                probe.addr(),
                &format!("pool-max-conn 16 pool-low-conn {low}"),
            )],
            &[],
        );
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) && n < 20_000 {
                        request(front, epoch);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        let flows: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        let act = cli(&shunt.sock(), "show activity");
        let take = act
            .lines()
            .find(|l| l.starts_with("fd_takeover:"))
            .unwrap_or_default()
            .to_string();
        let (hit, miss, dead, _) = warm(&shunt.sock());
        println!(
            "storm pool-low-conn {low}: {flows} flows, warm_hit {hit}, warm_miss {miss}, warm_dead {dead}, {take} ({:.1}% of flows)",
            take.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
                * 100.0
                / flows.max(1) as f64
        );
    }
}
