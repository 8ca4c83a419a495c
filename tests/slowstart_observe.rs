//! `slowstart` and `observe layer4` through the real binary: a server coming back
//! UP ramps its effective weight (`show stat` weight) from low to its user weight
//! over the period, and live connection errors with `observe layer4` mark a server
//! whose health check still passes DOWN with HAProxy's `HANA` status and wording.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

use shunt_tests::*;

/// A string column of `px/sv` in `show stat`.
fn col(sock: &Path, px: &str, sv: &str, c: &str) -> String {
    stat_row(sock, px, sv).get(c).cloned().unwrap_or_default()
}

/// Accept and echo on `l` in the background.
fn echo_on(l: TcpListener) {
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || echo_until_eof(&mut c));
        }
    });
}

fn front(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

#[test]
fn slowstart_ramps_the_weight_of_a_server_that_comes_back() {
    let s1 = Server::echo();
    let p2 = free_port();
    let port = free_port();
    let cfg = format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n\ndefaults\n    mode tcp\n    \
         timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n\n\
         backend be\n    balance roundrobin\n    server s1 {} weight 100\n    \
         server s2 127.0.0.1:{p2} weight 100 check inter 100ms rise 1 fall 1 slowstart 3s\n",
        s1.addr
    );
    let shunt = Shunt::start(&cfg, &[]);
    let sock = shunt.sock();
    eventually("s2 DOWN", Duration::from_secs(10), || {
        col(&sock, "be", "s2", "status").starts_with("DOWN")
    });
    echo_on(TcpListener::bind(("127.0.0.1", p2)).expect("bind s2"));
    eventually("s2 UP", Duration::from_secs(10), || {
        col(&sock, "be", "s2", "status") == "UP"
    });
    // Just back: a small share of its weight of 100, its user weight intact.
    let early: u32 = col(&sock, "be", "s2", "weight").parse().expect("weight");
    assert!(early < 50, "weight right after coming back: {early}");
    assert_eq!(col(&sock, "be", "s2", "uweight"), "100");
    // Full weight after the period.
    eventually("the ramp to end", Duration::from_secs(10), || {
        col(&sock, "be", "s2", "weight") == "100"
    });
    // And it serves traffic.
    for _ in 0..4 {
        let mut c = connect(front(port));
        c.write_all(b"ping").expect("send");
        let mut b = [0u8; 4];
        c.read_exact(&mut b).expect("echo");
        assert_eq!(&b, b"ping");
    }
    assert!(stat(&sock, "be", "s2", "stot") >= 1, "s2 took flows");
}

#[test]
fn observe_layer4_marks_a_failing_server_down_with_hana() {
    // s1: traffic goes to a dead port while its health check (`port`) passes.
    let live_check = TcpListener::bind("127.0.0.1:0").expect("bind");
    let check_port = live_check.local_addr().expect("addr").port();
    echo_on(live_check);
    let dead = free_port();
    let s2 = Server::echo();
    let port = free_port();
    let cfg = format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n\ndefaults\n    mode tcp\n    \
         timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n    retries 1\n    \
         option redispatch\n\nfrontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n\n\
         backend be\n    balance roundrobin\n    \
         server s1 127.0.0.1:{dead} check port {check_port} inter 10s observe layer4 \
         error-limit 2 on-error mark-down\n    server s2 {}\n",
        s2.addr
    );
    let shunt = Shunt::start(&cfg, &[]);
    let sock = shunt.sock();
    eventually("s1's first check", Duration::from_secs(10), || {
        col(&sock, "be", "s1", "check_status") == "L4OK"
    });
    // Every client is served (s1's refusals are redispatched to s2); s1 sees two
    // consecutive connection errors.
    for i in 0..4u8 {
        let mut c = connect(front(port));
        c.write_all(&[i; 8]).expect("send");
        let mut b = [0u8; 8];
        c.read_exact(&mut b).expect("served by s2");
        assert_eq!(b, [i; 8]);
    }
    eventually("s1 DOWN", Duration::from_secs(10), || {
        col(&sock, "be", "s1", "status").starts_with("DOWN")
    });
    assert_eq!(col(&sock, "be", "s1", "check_status"), "HANA");
    assert_eq!(col(&sock, "be", "s1", "check_desc"), "Health analyze");
    assert_eq!(col(&sock, "be", "s1", "hanafail"), "1");
    let log = shunt.stderr();
    assert!(
        log.contains(
            "Server be/s1 is DOWN, reason: Health analyze, info: \"Detected 2 consecutive \
             errors, last one was: L4 unsuccessful connection\""
        ),
        "{log}"
    );
    // s2 has no `observe`: no hanafail value.
    assert_eq!(col(&sock, "be", "s2", "hanafail"), "");
}

#[test]
fn check_send_proxy_starts_health_checks_with_a_proxy_v1_line() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let srv = l.local_addr().expect("addr");
    let (tx, rx) = std::sync::mpsc::channel::<(String, SocketAddr)>();
    std::thread::spawn(move || {
        // The check waits for our answer (tcp-check expect), so the connection is
        // still open while its first line is read; the peer address comes from
        // accept itself.
        while let Ok((mut c, peer)) = l.accept() {
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            let mut got = Vec::new();
            let mut b = [0u8; 128];
            while !got.ends_with(b"\r\n") {
                match c.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&b[..n]),
                }
            }
            let _ = c.write_all(b"OK\n");
            if tx
                .send((String::from_utf8_lossy(&got).into_owned(), peer))
                .is_err()
            {
                return;
            }
        }
    });
    let port = free_port();
    let cfg = format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n\ndefaults\n    mode tcp\n    \
         timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n\n\
         backend be\n    option tcp-check\n    tcp-check expect string OK\n    \
         server s1 {srv} check inter 200ms check-send-proxy\n"
    );
    let _shunt = Shunt::start(&cfg, &[]);
    let (line, peer) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a health check connected");
    assert_eq!(
        line,
        format!(
            "PROXY TCP4 {} {} {} {}\r\n",
            peer.ip(),
            srv.ip(),
            peer.port(),
            srv.port()
        )
    );
}
