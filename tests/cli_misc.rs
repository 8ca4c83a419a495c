//! The small CLI commands against the real daemon: `show version`, `set
//! severity-output`, the `prompt` modes, `set maxconn server|frontend|global`
//! (the next connections obey the new limit) and `set server B/S addr` (the next
//! flow reaches the new address, an open one stays where it is).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use shunt_tests::*;

/// Upper bound of every wait in these tests.
const WAIT: Duration = Duration::from_secs(10);
/// How long a connection that must stay queued or unaccepted is watched. Only a
/// lower bound for a negative check: a slower machine cannot make it fail.
const STAYS_WAITING: Duration = Duration::from_millis(300);

/// shunt on a free port in front of `servers`, copy mode (the forwarding mode
/// does not matter here), with a bounded queue timeout.
fn start(servers: &[SocketAddr], extra_backend: &str) -> (Shunt, SocketAddr) {
    let port = free_port();
    let extra = format!("    timeout queue 20s\n{extra_backend}");
    let shunt = Shunt::start(
        &simple_config(port, servers, &extra),
        &["--forward-mode", "copy"],
    );
    (shunt, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// A client whose reads give up after [`WAIT`].
fn client(addr: SocketAddr) -> TcpStream {
    let s = connect(addr);
    s.set_read_timeout(Some(WAIT)).expect("read timeout");
    s
}

/// The tag byte a `tagged_echo` server sends first.
fn tag(s: &mut TcpStream) -> u8 {
    let mut b = [0u8; 1];
    s.read_exact(&mut b).expect("server tag");
    b[0]
}

/// Whether `s` receives a byte within `d` (false on timeout).
fn gets_byte_within(s: &mut TcpStream, d: Duration) -> bool {
    s.set_read_timeout(Some(d)).expect("read timeout");
    let mut b = [0u8; 1];
    let got = matches!(s.read(&mut b), Ok(1));
    s.set_read_timeout(Some(WAIT)).expect("read timeout");
    got
}

/// One echo round trip.
fn echoes(s: &mut TcpStream, msg: &[u8]) -> bool {
    if s.write_all(msg).is_err() {
        return false;
    }
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).is_ok() && back == msg
}

/// One `show stat` value as text.
fn stat_str(sock: &Path, px: &str, sv: &str, col: &str) -> String {
    show_stat(sock)
        .into_iter()
        .find(|r| r["pxname"] == px && r["svname"] == sv)
        .unwrap_or_else(|| panic!("no stat row {px}/{sv}"))[col]
        .clone()
}

#[test]
fn show_version_severity_output_and_prompt_modes() {
    let srv = Server::echo();
    let (shunt, _) = start(&[srv.addr], "");
    let sock = shunt.sock();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(cli(&sock, "show version"), format!("{version}\n\n"));

    // 19-severity-output.txt: messages are tagged, dumps are not.
    assert_eq!(
        cli(
            &sock,
            "set severity-output number;set server be/nosuch state ready"
        ),
        "\n[3]: No such server.\n\n"
    );
    assert_eq!(
        cli(
            &sock,
            "set severity-output string;set server be/nosuch state ready"
        ),
        "\n[err]: No such server.\n\n"
    );
    assert_eq!(
        cli(&sock, "set severity-output string;show version"),
        format!("\n[info]: {version}\n\n")
    );
    assert!(cli(&sock, "set severity-output number;show stat").starts_with("\n# pxname,"));
    assert_eq!(
        cli(&sock, "set severity-output bogus"),
        "one of 'none', 'number', 'string' is a required argument\n\n"
    );

    // Prompt modes: `i` answers without prompts, `p` with them, `timed` with the
    // uptime; `quit` ends each conversation (cli() reads until the close).
    assert_eq!(
        cli(&sock, "prompt i\nshow version\nshow cli level\nquit"),
        format!("\n{version}\n\nadmin\n\n")
    );
    assert_eq!(
        cli(&sock, "prompt p\nshow version\nquit"),
        format!("\n> {version}\n\n> ")
    );
    assert_eq!(
        cli(&sock, "prompt\nshow version\nquit"),
        format!("\n> {version}\n\n> ")
    );
    let timed = cli(&sock, "prompt timed\nshow version\nquit");
    let prompts: Vec<&str> = timed.split(&format!("{version}\n\n")).collect();
    assert_eq!(prompts.len(), 2, "{timed:?}");
    for p in [&prompts[0][1..], prompts[1]] {
        let inner = p
            .strip_prefix('[')
            .and_then(|p| p.strip_suffix("]> "))
            .unwrap_or_else(|| panic!("not a timed prompt: {p:?} in {timed:?}"));
        let fields: Vec<&str> = inner.split(':').collect();
        assert_eq!(fields.len(), 4, "{timed:?}");
        assert!(fields[1..].iter().all(|f| f.len() == 2), "{timed:?}");
        assert!(
            fields.iter().all(|f| f.bytes().all(|b| b.is_ascii_digit())),
            "{timed:?}"
        );
    }
    assert!(cli(&sock, "prompt help").starts_with("Usage: prompt [help | n | i | p | timed]*\n"));
}

#[test]
fn set_server_addr_sends_the_next_flow_to_the_new_address() {
    let one = Server::tagged_echo(1);
    let two = Server::tagged_echo(2);
    let (shunt, addr) = start(&[one.addr], "");
    let sock = shunt.sock();

    let mut before = client(addr);
    assert_eq!(tag(&mut before), 1);

    let answer = cli(
        &sock,
        &format!("set server be/s1 addr 127.0.0.1 port {}", two.addr.port()),
    );
    assert_eq!(
        answer,
        format!(
            "no need to change the addr, port changed from '{}' to '{}' by 'stats socket command'\n\n",
            one.addr.port(),
            two.addr.port()
        )
    );
    // At once: the very next flow, and every one after, reaches the new server.
    for _ in 0..3 {
        let mut s = client(addr);
        assert_eq!(tag(&mut s), 2);
        assert!(echoes(&mut s, b"after"));
    }
    // The flow opened before the change still talks to the old server.
    assert!(echoes(&mut before, b"still here"));
    assert_eq!(one.accepted.load(std::sync::atomic::Ordering::Relaxed), 1);

    // Where the address is printed.
    let state = cli(&sock, "show servers state be");
    assert!(
        state.contains(" s1 127.0.0.1 ") && state.contains(&format!(" - {} - ", two.addr.port())),
        "{state}"
    );
    assert_eq!(stat_str(&sock, "be", "s1", "addr"), two.addr.to_string());

    // Back, with an IP change reported as HAProxy does.
    assert_eq!(
        cli(&sock, &format!("set server be/s1 addr 127.0.0.2 port {}", one.addr.port())),
        format!(
            "IP changed from '127.0.0.1' to '127.0.0.2', port changed from '{}' to '{}' by 'stats socket command'\n\n",
            two.addr.port(),
            one.addr.port()
        )
    );
    assert_eq!(
        cli(&sock, "set server be/s1 addr 127.0.0.1"),
        "IP changed from '127.0.0.2' to '127.0.0.1' by 'stats socket command'\n\n"
    );
    let mut s = client(addr);
    assert_eq!(tag(&mut s), 1);
}

#[test]
fn set_maxconn_server_makes_the_next_client_queue() {
    let srv = Server::tagged_echo(7);
    let (shunt, addr) = start(&[srv.addr], "");
    let sock = shunt.sock();
    let accepted = || srv.accepted.load(std::sync::atomic::Ordering::Relaxed);

    assert_eq!(cli(&sock, "set maxconn server be/s1 1"), "\n");
    assert_eq!(stat_str(&sock, "be", "s1", "slim"), "1");

    let mut a = client(addr);
    assert_eq!(tag(&mut a), 7);
    // The second client queues: the backend queue holds it, the server never sees it.
    let mut b = client(addr);
    eventually("the second client in the queue", WAIT, || {
        stat(&sock, "be", "BACKEND", "qcur") == 1
    });
    assert!(!gets_byte_within(&mut b, STAYS_WAITING));
    assert_eq!(accepted(), 1);

    // Raising the limit serves the queued client at once (a is still open).
    assert_eq!(cli(&sock, "set maxconn server be/s1 2"), "\n");
    assert_eq!(tag(&mut b), 7);
    assert_eq!(stat(&sock, "be", "BACKEND", "qcur"), 0);

    // Lowered again: a third client waits until both others are gone.
    assert_eq!(cli(&sock, "set maxconn server be/s1 1"), "\n");
    let mut c = client(addr);
    eventually("the third client in the queue", WAIT, || {
        stat(&sock, "be", "BACKEND", "qcur") == 1
    });
    drop(a);
    assert!(!gets_byte_within(&mut c, STAYS_WAITING));
    drop(b);
    assert_eq!(tag(&mut c), 7);
    assert!(echoes(&mut c, b"queued, then served"));

    // 0 = unlimited again.
    assert_eq!(cli(&sock, "set maxconn server be/s1 0"), "\n");
    let mut many: Vec<TcpStream> = (0..3).map(|_| client(addr)).collect();
    for s in &mut many {
        assert_eq!(tag(s), 7);
    }
    assert_eq!(stat_str(&sock, "be", "s1", "slim"), "");
    assert_eq!(
        cli(&sock, "set maxconn server be/nosuch 1"),
        "No such server.\n\n"
    );
}

#[test]
fn set_maxconn_frontend_and_global_gate_the_accepts() {
    let srv = Server::tagged_echo(3);
    let (shunt, addr) = start(&[srv.addr], "");
    let sock = shunt.sock();
    let accepted = || srv.accepted.load(std::sync::atomic::Ordering::Relaxed);

    // Frontend limit 1: the second client stays in the kernel backlog.
    assert_eq!(cli(&sock, "set maxconn frontend fe 1"), "\n");
    assert_eq!(stat_str(&sock, "fe", "FRONTEND", "slim"), "1");
    let mut a = client(addr);
    assert_eq!(tag(&mut a), 3);
    let mut b = client(addr);
    assert!(!gets_byte_within(&mut b, STAYS_WAITING));
    assert_eq!(accepted(), 1);
    // Back to the global limit only: b is accepted without a closing first.
    assert_eq!(cli(&sock, "set maxconn frontend fe 0"), "\n");
    assert_eq!(tag(&mut b), 3);
    assert_eq!(
        cli(&sock, "set maxconn frontend nosuch 1"),
        "No such frontend.\n\n"
    );

    // Global limit: 2 flows are open, so a limit of 2 holds the third back.
    let hard = info_u64(&sock, "Hard_maxconn");
    assert_eq!(cli(&sock, "set maxconn global 2"), "\n");
    assert_eq!(info_u64(&sock, "Maxconn"), 2);
    assert_eq!(info_u64(&sock, "Hard_maxconn"), hard);
    let mut c = client(addr);
    assert!(!gets_byte_within(&mut c, STAYS_WAITING));
    assert_eq!(accepted(), 2);
    drop(a);
    assert_eq!(tag(&mut c), 3);
    assert_eq!(
        cli(&sock, &format!("set maxconn global {}", hard + 1)),
        "Value out of range.\n\n"
    );
    assert_eq!(cli(&sock, "set maxconn global 0"), "\n");
    assert_eq!(info_u64(&sock, "Maxconn"), hard);
    drop((b, c));
}
