//! Listener, server and proxy options seen from outside, on real sockets:
//! `option tcpka|clitcpka|srvtcpka` (SO_KEEPALIVE on the sockets shunt
//! holds, as `ss -o` shows them), `option allbackups`, `option
//! log-health-checks` (HAProxy's lines), `balance source` with `hash-type
//! consistent`, the `bind` options (`backlog`, `maxconn`, `defer-accept`,
//! `tfo`, `name`) and `source` (flows, warm spares and health checks all
//! come from the configured address).

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shunt_tests::*;

/// How long a state change (a check, a log line) may take to show.
const SETTLE: Duration = Duration::from_secs(10);
/// How long a client held back by `bind ... maxconn` is watched for an answer.
const HELD: Duration = Duration::from_millis(600);

const DEFAULTS: &str =
    "defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n";

fn global() -> String {
    "global\n    nbthread 2\n    stats socket @DIR@/admin.sock level admin\n\n".to_string()
}

/// `ss -tnoH state STATE FILTER`: one line per socket; panics without `ss`.
fn ss(args: &[&str]) -> Vec<String> {
    let out = Command::new("ss")
        .args(args)
        .output()
        .expect("run ss (iproute2), which these tests read socket state with");
    assert!(out.status.success(), "ss {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .filter(|l| !l.trim().is_empty())
        .collect()
}

/// The established sockets matching `filter` (an `ss` expression) and
/// whether each has a keepalive timer.
fn keepalive_of(filter: &str) -> Vec<bool> {
    ss(&["-tnoH", "state", "established", filter])
        .iter()
        .map(|l| l.contains("timer:(keepalive"))
        .collect()
}

/// A connection from `src` (a loopback address) to `to`.
fn connect_from(src: [u8; 4], to: SocketAddr) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    s.bind(&SocketAddr::from((src, 0)).into())
        .expect("bind client to a loopback address");
    s.connect(&to.into()).expect("connect");
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(SETTLE)).expect("timeout");
    s
}

/// The tag the server behind `to` sends first.
fn tag_via(src: [u8; 4], to: SocketAddr) -> u8 {
    let mut s = connect_from(src, to);
    let mut b = [0u8; 1];
    s.read_exact(&mut b).expect("server tag");
    b[0]
}

fn round_trip(s: &mut TcpStream) -> std::io::Result<()> {
    s.write_all(b"x")?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    assert_eq!(&b, b"x");
    Ok(())
}

#[test]
fn tcpka_sets_keepalive_on_both_sides_and_clitcpka_on_the_client_only() {
    for (option, client_side, server_side) in [
        ("option tcpka", true, true),
        ("option clitcpka", true, false),
        ("option srvtcpka", false, true),
        ("", false, false),
    ] {
        let server = Server::echo();
        let port = free_port();
        let cfg = format!(
            "{}{DEFAULTS}    {option}\n\nlisten l\n    bind 127.0.0.1:{port}\n    server s {}\n",
            global(),
            server.addr
        );
        let _shunt = Shunt::start(&cfg, &[]);
        let mut c = connect(SocketAddr::from(([127, 0, 0, 1], port)));
        c.set_read_timeout(Some(SETTLE)).expect("timeout");
        round_trip(&mut c).expect("echo through shunt");
        // shunt's accepted socket has the frontend's port as its own.
        let fe = keepalive_of(&format!("( sport = :{port} )"));
        assert_eq!(fe, [client_side], "{option:?}: client side");
        // shunt's socket to the server has the server's port as its peer.
        let be = keepalive_of(&format!("( dport = :{} )", server.addr.port()));
        assert_eq!(be, [server_side], "{option:?}: server side");
    }
}

#[test]
fn allbackups_uses_every_backup_when_no_active_server_is_up() {
    let dead = dead_addr();
    let backups: Vec<Server> = (1..=3).map(Server::tagged_echo).collect();
    let port = free_port();
    let mut cfg = format!(
        "{}{DEFAULTS}\nlisten l\n    bind 127.0.0.1:{port}\n    option allbackups\n    \
         server a {} check inter 100 fall 1\n",
        global(),
        dead.addr
    );
    for (i, b) in backups.iter().enumerate() {
        cfg.push_str(&format!("    server b{i} {} backup\n", b.addr));
    }
    let shunt = Shunt::start(&cfg, &[]);
    eventually("the active server DOWN", SETTLE, || {
        stat_row(&shunt.sock(), "l", "a")
            .get("status")
            .is_some_and(|s| s == "DOWN")
    });
    let fe = SocketAddr::from(([127, 0, 0, 1], port));
    let tags: HashSet<u8> = (0..12).map(|_| tag_via([127, 0, 0, 1], fe)).collect();
    assert_eq!(tags, HashSet::from([1, 2, 3]), "every backup served");
}

#[test]
fn log_health_checks_logs_each_result_that_moves_the_health() {
    let dead = dead_addr();
    let port = free_port();
    let cfg = format!(
        "{}{DEFAULTS}\nlisten l\n    bind 127.0.0.1:{port}\n    option log-health-checks\n    \
         server s {} check inter 100 rise 2 fall 3\n",
        global(),
        dead.addr
    );
    let shunt = Shunt::start(&cfg, &[]);
    let failed = "Health check for server l/s failed, reason: Layer4 connection problem, info: \"Connection refused\", check duration: ";
    eventually("the check's line", SETTLE, || {
        shunt.stderr().contains("Server l/s is DOWN")
    });
    // More checks fail the same way: health stays at 0, nothing more to say.
    std::thread::sleep(Duration::from_millis(500));
    let err = shunt.stderr();
    let lines: Vec<&str> = err.lines().filter(|l| l.contains(failed)).collect();
    assert_eq!(lines.len(), 1, "one line, not one per check: {err}");
    assert!(lines[0].ends_with("ms, status: 0/2 DOWN."), "{}", lines[0]);
    let at = |needle: &str| err.find(needle).expect("logged");
    assert!(
        at(failed) < at("Server l/s is DOWN"),
        "the check's line comes before the transition's, as HAProxy's"
    );

    // The server comes up: each pass moves the health, as HAProxy logs it.
    let addr = dead.addr;
    drop(dead);
    let listener = shunt_testkit::listen_deep(addr).expect("listen where the server was");
    let _server = Server::serve(listener, |mut s| echo_until_eof(&mut s));
    eventually("the server UP", SETTLE, || {
        shunt.stderr().contains("Server l/s is UP")
    });
    let err = shunt.stderr();
    let passed =
        "Health check for server l/s succeeded, reason: Layer4 check passed, check duration: ";
    let lines: Vec<&str> = err.lines().filter(|l| l.contains(passed)).collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[0].ends_with("ms, status: 1/2 DOWN."), "{}", lines[0]);
    assert!(lines[1].ends_with("ms, status: 3/3 UP."), "{}", lines[1]);
    assert!(at_in(&err, lines[1]) < at_in(&err, "Server l/s is UP"));
}

fn at_in(text: &str, needle: &str) -> usize {
    text.find(needle).expect("logged")
}

#[test]
fn balance_source_consistent_keeps_clients_and_moves_only_the_keys_of_a_server_that_goes() {
    let servers: Vec<Server> = (0..4).map(Server::tagged_echo).collect();
    let port = free_port();
    let mut cfg = format!(
        "{}{DEFAULTS}\nlisten l\n    bind 127.0.0.1:{port}\n    balance source\n    hash-type consistent\n",
        global()
    );
    for (i, s) in servers.iter().enumerate() {
        cfg.push_str(&format!("    server s{i} {}\n", s.addr));
    }
    let shunt = Shunt::start(&cfg, &[]);
    let fe = SocketAddr::from(([127, 0, 0, 1], port));
    let sources: Vec<[u8; 4]> = (1..=40).map(|i| [127, 0, 1, i]).collect();
    let before: Vec<u8> = sources.iter().map(|&s| tag_via(s, fe)).collect();
    let again: Vec<u8> = sources.iter().map(|&s| tag_via(s, fe)).collect();
    assert_eq!(before, again, "a source keeps its server");
    assert!(
        before.iter().collect::<HashSet<_>>().len() >= 3,
        "sources spread: {before:?}"
    );
    let gone = before[0];
    let answer = cli(&shunt.sock(), &format!("disable server l/s{gone}"));
    assert!(answer.trim().is_empty(), "disable server: {answer}");
    let during: Vec<u8> = sources.iter().map(|&s| tag_via(s, fe)).collect();
    for (i, (&b, &d)) in before.iter().zip(&during).enumerate() {
        if b == gone {
            assert_ne!(d, gone, "source {i} still on the disabled server");
        } else {
            assert_eq!(b, d, "source {i} moved though its server stayed");
        }
    }
}

#[test]
fn bind_options_backlog_maxconn_defer_accept_tfo() {
    let server = Server::echo();
    let port = free_port();
    let cfg = format!(
        "{}{DEFAULTS}\nlisten l\n    bind 127.0.0.1:{port} name web backlog 7 maxconn 2 defer-accept tfo\n    server s {}\n",
        global(),
        server.addr
    );
    let shunt = Shunt::start(&cfg, &[]);
    // A listening socket's Send-Q is its backlog; one socket per thread.
    let listening = ss(&["-ltnH", &format!("( sport = :{port} )")]);
    assert_eq!(listening.len(), 2, "{listening:?}");
    for l in &listening {
        let send_q = l.split_whitespace().nth(2).expect("Send-Q column");
        assert_eq!(send_q, "7", "{l}");
    }
    let fe = SocketAddr::from(([127, 0, 0, 1], port));
    let mut a = connect(fe);
    let mut b = connect(fe);
    for s in [&mut a, &mut b] {
        s.set_read_timeout(Some(SETTLE)).expect("timeout");
        round_trip(s).expect("within the listener's maxconn");
    }
    // The third waits in the backlog (sent data: defer-accept lets it in
    // once there is room).
    let mut c = connect(fe);
    c.set_read_timeout(Some(HELD)).expect("timeout");
    c.write_all(b"x").expect("send");
    let mut byte = [0u8; 1];
    let early = c.read(&mut byte);
    assert!(
        early.is_err(),
        "a third flow past 'maxconn 2' was served: {early:?}"
    );
    assert_eq!(stat(&shunt.sock(), "l", "FRONTEND", "scur"), 2);
    drop(a);
    c.set_read_timeout(Some(SETTLE)).expect("timeout");
    c.read_exact(&mut byte).expect("served once a slot is free");
    assert_eq!(&byte, b"x");
    let err = shunt.stderr();
    assert!(
        err.lines()
            .any(|l| l.contains(" listening ") && l.contains("web")),
        "the listener's name in the log: {err}"
    );
}

#[test]
fn source_applies_to_flows_spares_and_health_checks() {
    let peers: Arc<Mutex<Vec<SocketAddr>>> = Arc::default();
    let seen = Arc::clone(&peers);
    let server = Server::start(move |mut s| {
        if let Ok(p) = s.peer_addr() {
            seen.lock().expect("lock").push(p);
        }
        echo_until_eof(&mut s);
    });
    let port = free_port();
    let cfg = format!(
        "{}{DEFAULTS}    source 127.0.0.3\n\nlisten l\n    bind 127.0.0.1:{port}\n    \
         server s {} check inter 100 pool-max-conn 2 pool-low-conn 1\n",
        global(),
        server.addr
    );
    let _shunt = Shunt::start(&cfg, &[]);
    let mut c = connect(SocketAddr::from(([127, 0, 0, 1], port)));
    c.set_read_timeout(Some(SETTLE)).expect("timeout");
    round_trip(&mut c).expect("echo through shunt");
    drop(c);
    // Checks every 100 ms, spares refilled: several connections by now.
    eventually("checks, spares and a flow", SETTLE, || {
        peers.lock().expect("lock").len() >= 4
    });
    let all = peers.lock().expect("lock").clone();
    assert!(
        all.iter()
            .all(|p| p.ip() == std::net::Ipv4Addr::new(127, 0, 0, 3)),
        "every connection from the source address: {all:?}"
    );
}
