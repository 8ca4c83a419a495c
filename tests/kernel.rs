//! The kernel handoff (issue: sockmap), end to end through the real `shunt`
//! binary on the real kernel: integrity at volume, early data and
//! server-first greetings, half-close with slow readers, backpressure, the
//! FIN-before-insertion fallback, map and fd leaks, and timeouts on
//! kernel-forwarded flows. Every test asserts the mode the flows used
//! (`auto`, which promotes flows to the kernel one by one: promotion.rs).
//!
//! Requires root (BPF). Under `SHUNT_REQUIRE_BPF=1` (CI) a missing BPF fails
//! the test; otherwise these tests skip loudly.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shunt_tests::*;

const MIB: usize = 1024 * 1024;

/// Start shunt in forced sockmap mode in front of `servers`.
fn start(servers: &[SocketAddr], global: &str, backend: &str) -> Option<(Shunt, SocketAddr)> {
    if !bpf_wanted() {
        return None;
    }
    let port = free_port();
    let cfg =
        simple_config(port, servers, backend).replacen("global\n", &format!("global\n{global}"), 1);
    let shunt = Shunt::start(&cfg, &["--forward-mode", "sockmap"]);
    Some((shunt, SocketAddr::from(([127, 0, 0, 1], port))))
}

/// Every kernel-forwarded direction that reached EOF compared what the verdict
/// saw and what entered the peer with what TCP received (`check_totals` in
/// the sockmap handoff); a difference is logged as a warning. None may appear.
fn assert_kernel_counts_agreed(shunt: &Shunt) {
    let log = shunt.stderr();
    assert!(
        !log.contains("sockmap byte counts disagree"),
        "a flow's kernel counters disagreed with what TCP received:\n{log}"
    );
    let trimmed = info(shunt, "SockmapOverlapTrimmed");
    if trimmed > 0 {
        eprintln!("retransmitted overlaps trimmed by the verdict: {trimmed}");
    }
    let caught_up = info(shunt, "SockmapEofCatchups");
    if caught_up > 0 {
        eprintln!("EOFs seen before the verdict had caught up (waited for): {caught_up}");
    }
}

fn info(shunt: &Shunt, key: &str) -> u64 {
    info_u64(&shunt.sock(), key)
}

#[test]
fn integrity_256mib_each_way() {
    let size = 256 * MIB;
    let down = Arc::new(pattern(size, 0xd1));
    let d2 = down.clone();
    let got_up = Arc::new(Mutex::new(None));
    let g2 = got_up.clone();
    let server = Server::start(move |mut s| {
        let mut w = s.try_clone().expect("clone");
        let d = d2.clone();
        let writer = std::thread::spawn(move || {
            write_random_chunks(&mut w, &d, 300_000, 11);
            w.shutdown(Shutdown::Write).expect("shutdown");
        });
        let up = read_to_end(&mut s).expect("server read");
        *g2.lock().expect("lock") = Some((up.len(), sha256(&up)));
        writer.join().expect("writer");
    });
    // The default bound: the transfer goes over it, so the pass path and the
    // way back to redirection are part of what this checks.
    let Some((shunt, addr)) = start(&[server.addr], "", "") else {
        return;
    };
    let up = pattern(size, 0x51);
    let mut c = connect(addr);
    let mut w = c.try_clone().expect("clone");
    let up2 = up.clone();
    let writer = std::thread::spawn(move || {
        write_random_chunks(&mut w, &up2, 250_000, 5);
        w.shutdown(Shutdown::Write).expect("shutdown");
    });
    let got_down = read_to_end(&mut c).expect("client read");
    writer.join().expect("writer");
    assert_eq!(
        got_down.len(),
        size,
        "bytes to client; {}",
        kernel_diagnostics(&shunt)
    );
    assert_eq!(
        sha256(&got_down),
        sha256(&down),
        "data to client; {}",
        kernel_diagnostics(&shunt)
    );
    eventually("the server's digest", Duration::from_secs(20), || {
        got_up.lock().expect("lock").is_some()
    });
    let (n, digest) = got_up.lock().expect("lock").clone().expect("digest");
    assert_eq!(n, size, "bytes to server; {}", kernel_diagnostics(&shunt));
    assert_eq!(
        digest,
        sha256(&up),
        "data to server; {}",
        kernel_diagnostics(&shunt)
    );
    assert_mode(&shunt.sock(), "sockmap");
    assert_kernel_counts_agreed(&shunt);
    assert_eq!(info(&shunt, "SockmapFlows"), 1);
    let sock = shunt.sock();
    assert_eq!(stat(&sock, "fe", "FRONTEND", "bin"), size as u64);
    assert_eq!(stat(&sock, "fe", "FRONTEND", "bout"), size as u64);
}

#[test]
fn integrity_1000_concurrent_flows() {
    let server = Server::echo();
    let Some((shunt, addr)) = start(&[server.addr], "    maxconn 4096\n", "") else {
        return;
    };
    let bad = Arc::new(AtomicUsize::new(0));
    // 1000 flows open at once: each connects; once shunt has put every pair
    // in the kernel, all write together. (Released earlier, a loaded machine
    // lets requests and FINs arrive before insertion: those flows are spliced,
    // correctly, but then this test would not be testing the kernel path.)
    let connected = Arc::new(std::sync::Barrier::new(1001));
    let go = Arc::new(std::sync::Barrier::new(1001));
    let clients: Vec<_> = (0..1000u64)
        .map(|i| {
            let (bad, connected, go) = (bad.clone(), connected.clone(), go.clone());
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    let size = 1 + (i as usize * 7919 + 13) % (96 * 1024);
                    let data = pattern(size, i + 100);
                    let mut c = connect(addr);
                    c.set_read_timeout(Some(Duration::from_secs(60)))
                        .expect("t");
                    connected.wait();
                    go.wait();
                    // Small enough for the socket buffers: write, half-close, read.
                    c.write_all(&data).expect("send");
                    c.shutdown(Shutdown::Write).expect("shut");
                    let back = read_to_end(&mut c).expect("read back");
                    if back != data {
                        bad.fetch_add(1, Ordering::SeqCst);
                    }
                })
                .expect("spawn client")
        })
        .collect();
    connected.wait();
    let t0 = std::time::Instant::now();
    while info(&shunt, "SockhashEntries") < 2 * 1000 && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    go.wait();
    for c in clients {
        c.join().expect("client");
    }
    assert_eq!(bad.load(Ordering::SeqCst), 0, "flows with wrong data");
    assert_mode(&shunt.sock(), "sockmap");
    assert_kernel_counts_agreed(&shunt);
    let total = info(&shunt, "SockmapFlows") + info(&shunt, "SpliceFlows");
    assert_eq!(total, 1000, "every flow accounted for");
    assert!(
        info(&shunt, "SockmapFlows") >= 500,
        "most flows in the kernel"
    );
}

/// A listener that accepts each connection only after `delay`.
fn late_server(delay: Duration, handler: impl Fn(TcpStream) + Send + Sync + 'static) -> Server {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let handler = Arc::new(handler);
    Server::serve(l, move |s| {
        std::thread::sleep(delay);
        handler(s)
    })
}

#[test]
fn early_data_with_a_late_server_200_times() {
    // The server reads only 100 ms after accepting; the client writes from the
    // moment it connects, so bytes pile up before and around insertion.
    let digests = Arc::new(Mutex::new(Vec::new()));
    let d2 = digests.clone();
    let server = late_server(Duration::from_millis(100), move |mut s| {
        let got = read_to_end(&mut s).expect("server read");
        // Record first: the client's answer below ends its repetition.
        d2.lock().expect("lock").push(sha256(&got));
        let _ = s.write_all(&(got.len() as u64).to_le_bytes());
    });
    let Some((shunt, addr)) = start(&[server.addr], "", "") else {
        return;
    };
    let size = 256 * 1024;
    let want = sha256(&pattern(size, 77));
    for round in 0..20 {
        let batch: Vec<_> = (0..10)
            .map(|_| {
                std::thread::spawn(move || {
                    let data = pattern(size, 77);
                    let mut c = connect(addr);
                    write_random_chunks(&mut c, &data, 4096, round + 1);
                    c.shutdown(Shutdown::Write).expect("shut");
                    let mut n = [0u8; 8];
                    c.read_exact(&mut n).expect("server's count");
                    assert_eq!(u64::from_le_bytes(n) as usize, size, "bytes the server got");
                })
            })
            .collect();
        for b in batch {
            b.join().expect("client");
        }
    }
    let digests = digests.lock().expect("lock");
    assert_eq!(digests.len(), 200);
    assert!(
        digests.iter().all(|d| *d == want),
        "every repetition byte-exact"
    );
    assert_mode(&shunt.sock(), "sockmap");
    assert_kernel_counts_agreed(&shunt);
}

#[test]
fn server_greeting_is_delivered_once_in_order() {
    let server = Server::start(|mut s| {
        s.write_all(b"220 greeting from the server\r\n")
            .expect("greet");
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => s.write_all(&buf[..n]).expect("echo"),
            }
        }
        let _ = s.shutdown(Shutdown::Write);
    });
    let Some((shunt, addr)) = start(&[server.addr], "", "") else {
        return;
    };
    for _ in 0..50 {
        let mut c = connect(addr);
        // Let the greeting arrive before the client says anything.
        std::thread::sleep(Duration::from_millis(5));
        c.write_all(b"HELO").expect("helo");
        c.shutdown(Shutdown::Write).expect("shut");
        let got = read_to_end(&mut c).expect("read");
        assert_eq!(
            got, b"220 greeting from the server\r\nHELO",
            "greeting once, then the echo"
        );
    }
    assert_mode(&shunt.sock(), "sockmap");
    assert_kernel_counts_agreed(&shunt);
}

/// Read everything at about `rate` bytes per second; returns (count, digest).
fn slow_read(s: &mut TcpStream, rate: usize) -> (usize, String) {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut n = 0usize;
    let chunk = rate / 50;
    let mut buf = vec![0u8; chunk];
    let t0 = Instant::now();
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                h.update(&buf[..k]);
                n += k;
                let due = Duration::from_secs_f64(n as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            Err(e) => panic!("slow reader: {e} after {n} bytes"),
        }
    }
    (n, h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[test]
fn half_close_with_a_slow_reader_both_directions() {
    let size = 64 * MIB;
    let rate = 8 * MIB;
    // Client -> server: the client sends 64 MiB then SHUT_WR; the server
    // reads at 8 MiB/s and must get every byte, then EOF.
    let result = Arc::new(Mutex::new(None));
    let r2 = result.clone();
    let server = Server::start(move |mut s| {
        let got = slow_read(&mut s, rate);
        *r2.lock().expect("lock") = Some(got);
    });
    let Some((shunt, addr)) = start(&[server.addr], "", "") else {
        return;
    };
    let data = pattern(size, 9);
    let mut c = connect(addr);
    c.write_all(&data).expect("send 64 MiB");
    c.shutdown(Shutdown::Write).expect("shut");
    eventually("the slow server", Duration::from_secs(60), || {
        result.lock().expect("lock").is_some()
    });
    let (n, digest) = result.lock().expect("lock").clone().expect("result");
    assert_eq!(n, size, "client to server through a half-close");
    assert_eq!(digest, sha256(&data));
    eventually("the flow to close", Duration::from_secs(10), || {
        info(&shunt, "CurrConns") == 0
    });
    assert_mode(&shunt.sock(), "sockmap");
    assert_kernel_counts_agreed(&shunt);
    drop(shunt);

    // Server -> client: the server sends 64 MiB then SHUT_WR; the client
    // reads at 8 MiB/s.
    let server = Server::start(move |mut s| {
        s.write_all(&pattern(size, 10)).expect("send 64 MiB");
        s.shutdown(Shutdown::Write).expect("shut");
        let _ = read_to_end(&mut s);
    });
    let Some((shunt, addr)) = start(&[server.addr], "", "") else {
        return;
    };
    let mut c = connect(addr);
    let (n, digest) = slow_read(&mut c, rate);
    assert_eq!(n, size, "server to client through a half-close");
    assert_eq!(digest, sha256(&pattern(size, 10)));
    drop(c);
    eventually("the flow to close", Duration::from_secs(10), || {
        info(&shunt, "CurrConns") == 0
    });
    assert_mode(&shunt.sock(), "sockmap");
    assert_kernel_counts_agreed(&shunt);
}

#[test]
fn backpressure_bounds_kernel_memory_then_delivers_everything() {
    const BOUND: u64 = 4 * 1024 * 1024;
    let (tx, rx) = std::sync::mpsc::channel::<TcpStream>();
    let tx = Mutex::new(tx);
    let server = Server::start(move |s| {
        // Never read until the test says so.
        tx.lock().expect("lock").send(s).expect("hand over");
    });
    let Some((shunt, addr)) = start(&[server.addr], "    tune.sockmap.max-inflight 4m\n", "")
    else {
        return;
    };
    let mut c = connect(addr);
    let mut srv = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("server side");
    c.set_nonblocking(true).expect("nonblocking");
    let meminfo_before = slab_and_buffers();
    // Push for 5 s.
    let chunk = pattern(64 * 1024, 3);
    let mut sent = Vec::with_capacity(64 * MIB);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        match c.write(&chunk) {
            Ok(n) => sent.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("client push: {e}"),
        }
        assert!(
            sent.len() < 256 * MIB,
            "no backpressure: {} bytes accepted",
            sent.len()
        );
    }
    let peak = info(&shunt, "SockmapInflightPeak");
    let meminfo_after = slab_and_buffers();
    assert!(
        peak <= BOUND,
        "kernel bytes held by the flow peaked at {peak} > bound {BOUND}"
    );
    assert!(
        info(&shunt, "SockmapPauses") > 0,
        "the verdict must have applied backpressure"
    );
    // What the client could push is the bound plus ordinary socket buffers.
    assert!(
        (sent.len() as u64) < BOUND + 48 * MIB as u64,
        "client pushed {} bytes into a flow whose server never reads",
        sent.len()
    );
    if let (Some(a), Some(b)) = (meminfo_before, meminfo_after) {
        eprintln!(
            "kernel memory (Slab+Buffers) before {a} KiB, after {b} KiB, pushed {} KiB",
            sent.len() / 1024
        );
    }
    // Now the server reads: every byte arrives, in order.
    c.set_nonblocking(false).expect("blocking");
    c.shutdown(Shutdown::Write).expect("shut");
    srv.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("t");
    let got = read_to_end(&mut srv).expect("server drains");
    assert_eq!(got.len(), sent.len(), "every pushed byte arrives");
    assert_eq!(sha256(&got), sha256(&sent));
    drop((c, srv));
    eventually("the flow to close", Duration::from_secs(10), || {
        info(&shunt, "CurrConns") == 0
    });
    assert_mode(&shunt.sock(), "sockmap");
    assert_kernel_counts_agreed(&shunt);
}

/// Slab + Buffers from /proc/meminfo, in KiB (informational).
fn slab_and_buffers() -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let get = |k: &str| -> Option<u64> {
        m.lines()
            .find(|l| l.starts_with(k))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some(get("Slab:")? + get("Buffers:")?)
}

#[test]
fn request_and_fin_before_insertion_is_served_by_the_fallback() {
    // The server is slow to accept, the client sends its whole request and
    // FIN at once: by the time shunt hands the flow over, the client socket
    // is in CLOSE_WAIT and cannot be inserted; the flow is spliced instead.
    let server = late_server(Duration::from_millis(50), |mut s| {
        let got = read_to_end(&mut s).expect("request");
        s.write_all(&got).expect("reply");
    });
    let Some((shunt, addr)) = start(&[server.addr], "", "") else {
        return;
    };
    for i in 0..20u64 {
        let req = pattern(10_000 + i as usize, i);
        let mut c = connect(addr);
        c.write_all(&req).expect("request");
        c.shutdown(Shutdown::Write).expect("FIN");
        let back = read_to_end(&mut c).expect("reply");
        assert_eq!(back, req, "request {i} served with nothing lost");
    }
    // Flows are counted when their session ends, just after the reply.
    eventually(
        "the last flow to be counted",
        Duration::from_secs(10),
        || info(&shunt, "CurrConns") == 0,
    );
    assert!(
        info(&shunt, "SockmapFallbacks") >= 1,
        "some flows fell back"
    );
    assert_eq!(
        info(&shunt, "SpliceFlows"),
        info(&shunt, "SockmapFallbacks"),
        "every fallback was spliced"
    );
    assert_eq!(info(&shunt, "CopyFlows"), 0);
}

fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn no_leaks_after_10000_flows() {
    let server = Server::echo();
    let Some((shunt, addr)) = start(&[server.addr], "", "") else {
        return;
    };
    // Warm up once so lazily opened fds (pipes, epoll) are in the baseline.
    for _ in 0..4 {
        let mut c = connect(addr);
        c.write_all(b"warm").expect("w");
        c.shutdown(Shutdown::Write).expect("s");
        let _ = read_to_end(&mut c);
    }
    eventually("warm-up flows to close", Duration::from_secs(10), || {
        info(&shunt, "CurrConns") == 0
    });
    // Pooled pipes (splice fallbacks) are kept open by design: count them apart.
    let pipe_fds = |s: &Shunt| 2 * (info(s, "PipesUsed") + info(s, "PipesFree")) as usize;
    let baseline = fd_count(shunt.pid()) - pipe_fds(&shunt);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..1250u64 {
                    let msg = pattern(1 + ((t * 1250 + i) % 2000) as usize, i);
                    let mut c = connect(addr);
                    c.write_all(&msg).expect("send");
                    c.shutdown(Shutdown::Write).expect("shut");
                    let back = read_to_end(&mut c).expect("echo");
                    assert_eq!(back, msg);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client");
    }
    eventually("all flows to close", Duration::from_secs(20), || {
        info(&shunt, "CurrConns") == 0
    });
    assert_eq!(info(&shunt, "CumConns"), 10_004);
    assert!(info(&shunt, "SockmapFlows") > 0);
    assert_eq!(info(&shunt, "SockhashEntries"), 0, "SOCKHASH empty");
    assert_eq!(info(&shunt, "SockmapFlowEntries"), 0, "flow map empty");
    // Each worker opens its sockmap watch (one epoll fd, `handoff::sockmap::watch`)
    // on its first kernel flow, which the warm-up may not have given both.
    let watches = 2;
    eventually(
        "fd count back to its baseline",
        Duration::from_secs(10),
        || fd_count(shunt.pid()) - pipe_fds(&shunt) <= baseline + watches,
    );
}

#[test]
fn timeouts_apply_to_kernel_forwarded_flows() {
    let server = Server::echo();
    let Some((shunt, addr)) = start(&[server.addr], "", "    timeout tunnel 2s\n") else {
        return;
    };
    // Active: a round trip every 200 ms for 2 s keeps the flow open (a wide margin
    // to the 2 s timeout, so a loaded machine's scheduling delays do not matter).
    let mut c = connect(addr);
    c.set_read_timeout(Some(Duration::from_secs(5))).expect("t");
    for i in 0..10u8 {
        c.write_all(&[i; 100]).expect("send");
        let mut b = [0u8; 100];
        c.read_exact(&mut b).expect("active flow stays open");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Idle: closed about 2 s after the last activity.
    let t0 = Instant::now();
    let r = c.read(&mut [0u8; 1]);
    let waited = t0.elapsed();
    assert!(matches!(r, Ok(0) | Err(_)), "idle flow closed, got {r:?}");
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(6),
        "closed after the tunnel timeout, waited {waited:?}"
    );
    assert_mode(&shunt.sock(), "sockmap");
    assert_kernel_counts_agreed(&shunt);
}
