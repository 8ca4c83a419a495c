//! `tcp-request content` seen from outside: a reject closes the client
//! cleanly, counts in the frontend's `dreq` (a backend's rule too, as HAProxy)
//! and is logged `PR` with `<NOSRV>`; a rule short of bytes waits for them
//! within `tcp-request inspect-delay` and the peeked bytes reach the server
//! intact; at the delay the rules decide on what is there; a listen's rules
//! run once for its own clients; `nbsrv` follows the servers' state as the
//! CLI changes it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use shunt_tests::*;

/// The inspect-delay of the waiting test: long enough to tell a wait from an
/// immediate answer, short enough for a quick test.
const DELAY: Duration = Duration::from_millis(800);

fn tcplog_config(
    fe_port: u16,
    log_port: u16,
    fe_rules: &str,
    be_rules: &str,
    server: SocketAddr,
) -> String {
    format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n    log 127.0.0.1:{log_port} local0\n\n\
         defaults\n    mode tcp\n    log global\n    option tcplog\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
         frontend fe\n    bind 127.0.0.1:{fe_port}\n{fe_rules}    default_backend be\n\n\
         backend be\n{be_rules}    server s1 {server}\n"
    )
}

/// Send `first`, then read: the server's tag, or `None` when the proxy closed
/// the connection cleanly (a reset fails the test: HAProxy closes with a FIN).
fn outcome(addr: SocketAddr, first: &[u8]) -> Option<u8> {
    let mut s = connect(addr);
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(first).expect("send");
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(1) => Some(b[0]),
        Ok(_) => None,
        Err(e) => panic!("reading after {first:?}: {e} (a reset where HAProxy closes cleanly?)"),
    }
}

/// The next traffic log line received on `log`.
fn next_log(log: &UdpSocket) -> String {
    let mut buf = [0u8; 2048];
    let n = log.recv(&mut buf).expect("a traffic log line");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn a_reject_is_counted_in_dreq_and_logged_pr() {
    let server = Server::tagged_echo(1);
    let log = UdpSocket::bind("127.0.0.1:0").expect("log socket");
    log.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let log_port = log.local_addr().expect("addr").port();
    let port = free_port();
    let cfg = tcplog_config(
        port,
        log_port,
        "    tcp-request inspect-delay 2s\n    tcp-request content reject if { req.payload(0,4) -m str QUIT }\n",
        "    tcp-request inspect-delay 2s\n    tcp-request content reject if { req.payload(0,4) -m str STOP }\n",
        server.addr,
    );
    let shunt = Shunt::start(&cfg, &[]);
    let fe = SocketAddr::from(([127, 0, 0, 1], port));

    assert_eq!(outcome(fe, b"QUIT\r\n"), None, "the frontend's rule");
    let line = next_log(&log);
    assert!(
        line.contains(" fe fe/<NOSRV> ") && line.contains(" PR "),
        "{line}"
    );
    assert_eq!(outcome(fe, b"STOP\r\n"), None, "the backend's rule");
    let line = next_log(&log);
    assert!(
        line.contains(" fe be/<NOSRV> ") && line.contains(" PR "),
        "{line}"
    );
    assert_eq!(outcome(fe, b"HELO\r\n"), Some(1), "no rule applies");

    let sock = shunt.sock();
    assert_eq!(
        stat(&sock, "fe", "FRONTEND", "dreq"),
        2,
        "both rejects are the frontend's"
    );
    assert_eq!(
        stat(&sock, "fe", "FRONTEND", "stot"),
        3,
        "a rejected request was a session"
    );
    assert_eq!(stat(&sock, "fe", "FRONTEND", "dcon"), 0);
    assert_eq!(
        stat(&sock, "be", "BACKEND", "dreq"),
        0,
        "HAProxy counts none in the backend"
    );
    assert_eq!(stat(&sock, "be", "BACKEND", "stot"), 2);
}

#[test]
fn a_rule_waits_for_its_bytes_then_decides_at_the_delay() {
    let server = Server::tagged_echo(4);
    let port = free_port();
    let rules = format!(
        "    tcp-request inspect-delay {}ms\n    tcp-request content accept if {{ req.payload(0,6) -m str HELLO! }}\n    tcp-request content reject\n",
        DELAY.as_millis()
    );
    let cfg = simple_config(port, &[server.addr], "").replace(
        "    default_backend be\n",
        &format!("{rules}    default_backend be\n"),
    );
    let _shunt = Shunt::start(&cfg, &[]);
    let fe = SocketAddr::from(([127, 0, 0, 1], port));

    // In two pieces, the second within the delay: accepted on the second,
    // and the server gets every byte, peeked, never consumed.
    let mut c = connect(fe);
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let t0 = Instant::now();
    c.write_all(b"HEL").expect("first piece");
    std::thread::sleep(Duration::from_millis(200));
    c.write_all(b"LO! and more").expect("second piece");
    let mut got = [0u8; 16];
    c.read_exact(&mut got).expect("tag and echo");
    assert!(
        t0.elapsed() < DELAY,
        "decided after {:?}, not on the bytes",
        t0.elapsed()
    );
    assert_eq!(&got, b"\x04HELLO! and more");

    // Never enough bytes: the rules run once more at the delay, final, and reject.
    let t0 = Instant::now();
    assert_eq!(outcome(fe, b"HEL"), None);
    let waited = t0.elapsed();
    assert!(
        waited >= DELAY - Duration::from_millis(50) && waited < DELAY * 4,
        "closed after {waited:?}, inspect-delay {DELAY:?}"
    );

    // A client that closes its side ends the wait at once: nothing more can come.
    let mut c = TcpStream::connect(fe).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let t0 = Instant::now();
    c.write_all(b"HEL").expect("send");
    c.shutdown(std::net::Shutdown::Write).expect("half-close");
    let mut b = [0u8; 1];
    assert_eq!(c.read(&mut b).expect("clean close"), 0);
    assert!(
        t0.elapsed() < DELAY,
        "the half-closed client waited {:?}",
        t0.elapsed()
    );
}

#[test]
fn nbsrv_follows_the_servers_state() {
    let (a, b) = (Server::tagged_echo(1), Server::tagged_echo(2));
    let port = free_port();
    let cfg = format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
         frontend fe\n    bind 127.0.0.1:{port}\n    use_backend be_b if {{ nbsrv(be_a) lt 1 }}\n    default_backend be_a\n\n\
         backend be_a\n    server s1 {}\n\nbackend be_b\n    server s1 {}\n",
        a.addr, b.addr
    );
    let shunt = Shunt::start(&cfg, &[]);
    let fe = SocketAddr::from(([127, 0, 0, 1], port));
    assert_eq!(outcome(fe, b"x"), Some(1));
    let answer = cli(&shunt.sock(), "disable server be_a/s1");
    assert!(answer.trim().is_empty(), "{answer}");
    assert_eq!(outcome(fe, b"x"), Some(2), "be_a has no usable server");
    let answer = cli(&shunt.sock(), "enable server be_a/s1");
    assert!(answer.trim().is_empty(), "{answer}");
    assert_eq!(outcome(fe, b"x"), Some(1));
}

#[test]
fn a_listen_runs_its_rules_once_for_its_own_clients() {
    let server = Server::tagged_echo(5);
    let (p1, p2) = (free_port(), free_port());
    let cfg = format!(
        "defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
         listen l\n    bind 127.0.0.1:{p1}\n    tcp-request inspect-delay {}ms\n    tcp-request content reject if {{ req.payload(0,4) -m str QUIT }}\n    server s1 {}\n\n\
         frontend f2\n    bind 127.0.0.1:{p2}\n    default_backend l\n",
        DELAY.as_millis(),
        server.addr
    );
    let _shunt = Shunt::start(&cfg, &[]);
    for port in [p1, p2] {
        let fe = SocketAddr::from(([127, 0, 0, 1], port));
        assert_eq!(outcome(fe, b"QUIT"), None, "port {port}");
        // Too short to decide: accepted once the delay ends, after one wait
        // (run as a frontend's and again as a backend's, it would wait twice).
        let t0 = Instant::now();
        assert_eq!(outcome(fe, b"ab"), Some(5), "port {port}");
        let waited = t0.elapsed();
        assert!(
            waited >= DELAY - Duration::from_millis(50)
                && waited < DELAY * 2 - Duration::from_millis(100),
            "port {port}: routed after {waited:?}, inspect-delay {DELAY:?}"
        );
    }
}
