//! End-to-end forwarding through the real `shunt` binary, in copy and splice
//! mode: integrity, half-close, resets, the splice cork regression, dead
//! servers with retries and redispatch, and server maxconn queues.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shunt_tests::*;

const MIB: usize = 1024 * 1024;

fn start(servers: &[SocketAddr], extra: &str, mode: &str) -> (Shunt, SocketAddr) {
    let port = free_port();
    let cfg = simple_config(port, servers, extra);
    let shunt = Shunt::start(&cfg, &["--forward-mode", mode]);
    (shunt, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// The server reads everything the client sends while sending its own stream;
/// both directions at once, random write sizes, compared by SHA-256.
fn bidirectional(mode: &str, size: usize) {
    let down = Arc::new(pattern(size, 0xd0));
    let d2 = down.clone();
    let got_up = Arc::new(std::sync::Mutex::new(String::new()));
    let g2 = got_up.clone();
    let server = Server::start(move |mut s| {
        let mut w = s.try_clone().expect("clone");
        let d = d2.clone();
        let writer = std::thread::spawn(move || {
            write_random_chunks(&mut w, &d, 200_000, 7);
            w.shutdown(Shutdown::Write).expect("shutdown");
        });
        let up = read_to_end(&mut s).expect("server read");
        *g2.lock().expect("lock") = format!("{} ({} bytes)", sha256(&up), up.len());
        writer.join().expect("writer");
    });
    let (shunt, addr) = start(&[server.addr], "", mode);
    let up = pattern(size, 0x5eed);
    let mut c = connect(addr);
    let mut w = c.try_clone().expect("clone");
    let up2 = up.clone();
    let writer = std::thread::spawn(move || {
        write_random_chunks(&mut w, &up2, 150_000, 3);
        w.shutdown(Shutdown::Write).expect("shutdown");
    });
    let got_down = read_to_end(&mut c).expect("client read");
    writer.join().expect("writer");
    let diag = || {
        if mode == "sockmap" {
            kernel_diagnostics(&shunt)
        } else {
            String::new()
        }
    };
    assert_eq!(got_down.len(), size, "{mode}: bytes to client; {}", diag());
    assert_eq!(
        sha256(&got_down),
        sha256(&down),
        "{mode}: data to client; {}",
        diag()
    );
    let t0 = Instant::now();
    while got_up.lock().expect("lock").is_empty() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        *got_up.lock().expect("lock"),
        format!("{} ({} bytes)", sha256(&up), up.len()),
        "{mode}: data to server; {}",
        diag()
    );
    let sock = shunt.sock();
    assert_mode(&sock, mode);
    // Counters agree with what was sent (kernel-forwarded bytes included).
    for (px, sv, col) in [
        ("fe", "FRONTEND", "bin"),
        ("fe", "FRONTEND", "bout"),
        ("be", "BACKEND", "bin"),
        ("be", "BACKEND", "bout"),
        ("be", "s1", "bin"),
        ("be", "s1", "bout"),
    ] {
        assert_eq!(
            stat(&sock, px, sv, col),
            size as u64,
            "{mode}: {px}/{sv} {col}"
        );
    }
}

#[test]
fn integrity_64mib_each_way() {
    for mode in forwarding_modes() {
        bidirectional(mode, 64 * MIB);
    }
}

#[test]
fn integrity_200_concurrent_flows() {
    for mode in forwarding_modes() {
        let server = Server::echo();
        let (shunt, addr) = start(&[server.addr], "", mode);
        let clients: Vec<_> = (0..200u64)
            .map(|i| {
                std::thread::spawn(move || {
                    let size =
                        (pattern(8, i)[0] as usize * 977 + (i as usize) * 131) % (600 * 1024) + 1;
                    let data = pattern(size, i + 1);
                    let mut c = connect(addr);
                    let mut w = c.try_clone().expect("clone");
                    let d2 = data.clone();
                    let t = std::thread::spawn(move || {
                        write_random_chunks(&mut w, &d2, 32 * 1024, i + 9);
                        w.shutdown(Shutdown::Write).expect("shutdown");
                    });
                    let back = read_to_end(&mut c).expect("read back");
                    t.join().expect("writer");
                    assert_eq!(back.len(), size, "flow {i} length");
                    assert_eq!(sha256(&back), sha256(&data), "flow {i} data");
                })
            })
            .collect();
        for c in clients {
            c.join().expect("client thread");
        }
        assert_mode(&shunt.sock(), mode);
    }
}

#[test]
fn half_close_client_first_and_server_first() {
    for mode in forwarding_modes() {
        // Client sends N then SHUT_WR; server reads N, sees EOF, replies M and closes.
        let (n, m) = (3 * MIB + 17, 2 * MIB + 5);
        let server = Server::start(move |mut s| {
            let got = read_to_end(&mut s).expect("server read");
            assert_eq!(got.len(), n);
            s.write_all(&pattern(m, 2)).expect("reply");
        });
        let (_shunt, addr) = start(&[server.addr], "", mode);
        let mut c = connect(addr);
        c.write_all(&pattern(n, 1)).expect("send");
        c.shutdown(Shutdown::Write).expect("shut wr");
        let back = read_to_end(&mut c).expect("client read");
        assert_eq!(back.len(), m, "{mode}: reply after half-close");
        assert_eq!(sha256(&back), sha256(&pattern(m, 2)));

        // Mirror: the server sends M and SHUT_WR first; the client reads it all
        // and EOF, then sends N and closes; the server gets all N.
        let got_n = Arc::new(AtomicUsize::new(0));
        let g = got_n.clone();
        let server = Server::start(move |mut s| {
            s.write_all(&pattern(m, 3)).expect("greet");
            s.shutdown(Shutdown::Write).expect("shut wr");
            let got = read_to_end(&mut s).expect("server read");
            g.store(got.len(), Ordering::SeqCst);
        });
        let (_shunt, addr) = start(&[server.addr], "", mode);
        let mut c = connect(addr);
        let mut first = vec![0u8; m];
        c.read_exact(&mut first).expect("read server data");
        let mut one = [0u8; 1];
        assert_eq!(
            c.read(&mut one).expect("eof"),
            0,
            "{mode}: EOF after server data"
        );
        c.write_all(&pattern(n, 4)).expect("send after server EOF");
        c.shutdown(Shutdown::Write).expect("shut");
        let t0 = Instant::now();
        while got_n.load(Ordering::SeqCst) != n && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            got_n.load(Ordering::SeqCst),
            n,
            "{mode}: server got the client's bytes"
        );
    }
}

fn reset(s: &TcpStream) {
    socket2::SockRef::from(s)
        .set_linger(Some(Duration::ZERO))
        .expect("linger");
}

fn expect_reset(s: &mut TcpStream, what: &str) {
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => panic!("{what}: got a clean EOF instead of a reset"),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("{what}: expected a reset, got {e}"),
        }
    }
}

#[test]
fn reset_propagates_both_ways() {
    for mode in forwarding_modes() {
        // Server resets: the client sees a reset.
        let server = Server::start(|mut s| {
            let mut b = [0u8; 5];
            let _ = s.read_exact(&mut b);
            reset(&s);
        });
        let (_shunt, addr) = start(&[server.addr], "", mode);
        let mut c = connect(addr);
        c.write_all(b"hello").expect("send");
        expect_reset(&mut c, &format!("{mode}: server reset"));

        // Client resets: the server sees a reset.
        let (tx, rx) = std::sync::mpsc::channel();
        let server = Server::start(move |mut s| {
            let mut b = [0u8; 5];
            s.read_exact(&mut b).expect("hello");
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("t");
            let r = s.read(&mut [0u8; 16]);
            let _ =
                tx.send(matches!(r, Err(ref e) if e.kind() == std::io::ErrorKind::ConnectionReset));
        });
        let (_shunt, addr) = start(&[server.addr], "", mode);
        let c = connect(addr);
        (&c).write_all(b"hello").expect("send");
        std::thread::sleep(Duration::from_millis(100));
        reset(&c);
        drop(c);
        let was_reset = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("server verdict");
        assert!(
            was_reset,
            "{mode}: the server must see a reset when the client resets"
        );
    }
}

/// Echo round trips through a splice loop with 8 KiB pipes: sizes whose last
/// chunk fills >= 90% of the pipe used to stall ~200 ms per hop (MSG_MORE cork).
#[test]
fn splice_cork_regression() {
    let server = Server::echo();
    let port = free_port();
    let cfg = simple_config(port, &[server.addr], "").replace(
        "    nbthread 2\n",
        "    nbthread 2\n    tune.pipesize 8192\n",
    );
    let _shunt = Shunt::start(&cfg, &["--forward-mode", "splice"]);
    let mut c = connect(SocketAddr::from(([127, 0, 0, 1], port)));
    c.set_nodelay(true).expect("nodelay");
    let mut worst = Vec::new();
    for size in [7000usize, 7372, 8192, 12000, 16384] {
        let data = pattern(size, size as u64);
        let mut back = vec![0u8; size];
        let mut max = Duration::ZERO;
        for _ in 0..5 {
            let t0 = Instant::now();
            c.write_all(&data).expect("send");
            c.read_exact(&mut back).expect("echo");
            max = max.max(t0.elapsed());
            assert_eq!(back, data, "echo of {size} bytes");
        }
        worst.push((size, max));
    }
    for (size, max) in &worst {
        assert!(
            *max < Duration::from_millis(50),
            "echo of {size} bytes took {max:?} (cork stall?); all: {worst:?}"
        );
    }
}

#[test]
fn dead_server_retries_then_redispatch() {
    for mode in forwarding_modes() {
        let live = Server::echo();
        let dead = dead_addr();
        // `balance first` sends the flow to the dead s1; the last retry redispatches to s2.
        let (shunt, addr) = start(
            &[dead.addr, live.addr],
            "    balance first\n    retries 2\n    option redispatch\n    timeout connect 200ms\n",
            mode,
        );
        let mut c = connect(addr);
        c.write_all(b"ping").expect("send");
        let mut b = [0u8; 4];
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("t");
        c.read_exact(&mut b).expect("echo through the live server");
        assert_eq!(&b, b"ping");
        let sock = shunt.sock();
        assert_eq!(
            stat(&sock, "be", "s1", "econ"),
            2,
            "{mode}: connection errors counted on s1"
        );
        assert_eq!(stat(&sock, "be", "BACKEND", "wretr"), 2, "{mode}: retries");
        assert_eq!(
            stat(&sock, "be", "BACKEND", "wredis"),
            1,
            "{mode}: redispatch"
        );
        assert_eq!(live.accepted.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn all_servers_down_closes_client() {
    for mode in forwarding_modes() {
        let (dead1, dead2) = (dead_addr(), dead_addr());
        let (shunt, addr) = start(
            &[dead1.addr, dead2.addr],
            "    retries 1\n    option redispatch\n    timeout connect 200ms\n",
            mode,
        );
        let mut c = connect(addr);
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("t");
        let mut b = [0u8; 8];
        let r = c.read(&mut b);
        assert!(
            matches!(r, Ok(0) | Err(_)),
            "{mode}: client must be closed, got {r:?}"
        );
        let sock = shunt.sock();
        assert_eq!(
            stat(&sock, "be", "BACKEND", "econ"),
            2,
            "{mode}: both attempts failed"
        );
    }
}

#[test]
fn server_maxconn_queues_and_queue_timeout() {
    for mode in forwarding_modes() {
        let cur = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let (c2, p2) = (cur.clone(), peak.clone());
        let server = Server::start(move |mut s| {
            let now = c2.fetch_add(1, Ordering::SeqCst) + 1;
            p2.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(100));
            let mut b = [0u8; 4];
            if s.read_exact(&mut b).is_ok() {
                let _ = s.write_all(&b);
            }
            c2.fetch_sub(1, Ordering::SeqCst);
        });
        let port = free_port();
        let cfg = simple_config(port, &[], "    timeout queue 20s\n")
            + &format!("    server s1 {} maxconn 2\n", server.addr);
        let shunt = Shunt::start(&cfg, &["--forward-mode", mode]);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let clients: Vec<_> = (0..10)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut c = connect(addr);
                    c.set_read_timeout(Some(Duration::from_secs(20)))
                        .expect("t");
                    c.write_all(b"ping").expect("send");
                    let mut b = [0u8; 4];
                    c.read_exact(&mut b).expect("served after queueing");
                })
            })
            .collect();
        for c in clients {
            c.join().expect("client");
        }
        assert_eq!(
            peak.load(Ordering::SeqCst),
            2,
            "{mode}: at most 2 server connections at once"
        );
        assert!(
            stat(&shunt.sock(), "be", "BACKEND", "qmax") >= 1,
            "{mode}: the queue was used"
        );
        drop(shunt);

        // Queue timeout: one slot held forever; the next client waits 300 ms then is closed.
        let server = Server::start(|mut s| {
            let _ = read_to_end(&mut s);
        });
        let port = free_port();
        let cfg = simple_config(port, &[], "    timeout queue 300ms\n")
            + &format!("    server s1 {} maxconn 1\n", server.addr);
        let _shunt = Shunt::start(&cfg, &["--forward-mode", mode]);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let _holder = connect(addr);
        std::thread::sleep(Duration::from_millis(200));
        let mut waiter = connect(addr);
        waiter
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("t");
        let t0 = Instant::now();
        let r = waiter.read(&mut [0u8; 4]);
        let waited = t0.elapsed();
        assert!(
            matches!(r, Ok(0) | Err(_)),
            "{mode}: queued client closed, got {r:?}"
        );
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_secs(5),
            "{mode}: closed after the queue timeout, waited {waited:?}"
        );
    }
}
