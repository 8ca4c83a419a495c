//! `show sess`, `shutdown session(s)` and `clear counters` against a real daemon:
//! flows opened through shunt in every forwarding mode are listed with their mode,
//! closed one by one or per server, and the counters they left are cleared.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use shunt_tests::*;

const WAIT: Duration = Duration::from_secs(5);

/// One echo round trip on `s`.
fn echo_ok(s: &mut TcpStream, tag: u8) -> bool {
    let msg = [tag; 16];
    if s.write_all(&msg).is_err() {
        return false;
    }
    let mut back = [0u8; 16];
    s.read_exact(&mut back).is_ok() && back == msg
}

/// True when the peer closed `s` (EOF or reset) within [`WAIT`].
fn closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// `show sess` lines (the answer's blank terminator dropped).
fn sess_lines(sock: &Path) -> Vec<String> {
    cli(sock, "show sess")
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The `show sess` line of the flow whose client is `c`.
fn line_of(lines: &[String], c: &TcpStream) -> Option<String> {
    let src = format!(" src={} ", c.local_addr().expect("local addr"));
    lines.iter().find(|l| l.contains(&src)).cloned()
}

#[test]
fn show_sess_lists_flows_and_shutdown_closes_exactly_them() {
    let (e1, e2) = (Server::echo(), Server::echo());
    for mode in forwarding_modes() {
        let port = free_port();
        let cfg = simple_config(port, &[e1.addr, e2.addr], "    balance roundrobin\n");
        let shunt = Shunt::start(&cfg, &["--forward-mode", mode]);
        let sock = shunt.sock();
        let addr = ([127, 0, 0, 1], port).into();
        let mut clients: Vec<TcpStream> = (0..4).map(|_| connect(addr)).collect();
        for (i, c) in clients.iter_mut().enumerate() {
            c.set_read_timeout(Some(WAIT)).expect("timeout");
            assert!(echo_ok(c, i as u8), "{mode}: flow {i} echoes");
        }
        let lines = sess_lines(&sock);
        assert_eq!(lines.len(), 4, "{mode}: one line per flow: {lines:#?}");
        for (i, c) in clients.iter().enumerate() {
            let l = line_of(&lines, c).unwrap_or_else(|| panic!("{mode}: flow {i} listed"));
            assert!(l.starts_with("0x"), "{l}");
            assert!(l.contains(": proto=tcpv4 "), "{l}");
            assert!(l.contains(" fe=fe be=be srv=s"), "{l}");
            assert!(l.ends_with(&format!(" fwd={mode}")), "{mode}: {l}");
        }

        // One flow by id: only it closes.
        let victim = line_of(&lines, &clients[0]).expect("line");
        let id = victim.split(':').next().expect("id");
        assert_eq!(cli(&sock, &format!("shutdown session {id}")), "\n");
        assert!(closed(&mut clients[0]), "{mode}: the shut flow is closed");
        for (i, c) in clients.iter_mut().enumerate().skip(1) {
            assert!(echo_ok(c, 10 + i as u8), "{mode}: flow {i} still echoes");
        }
        eventually("the shut flow to leave show sess", WAIT, || {
            sess_lines(&sock).len() == 3
        });
        assert_eq!(
            cli(&sock, &format!("shutdown session {id}")),
            "No such session (use 'show sess').\n\n"
        );
        assert_eq!(
            cli(&sock, "shutdown session 0xdeadbeef"),
            "No such session (use 'show sess').\n\n"
        );
        assert_eq!(
            cli(&sock, "shutdown session"),
            "Session pointer expected (use 'show sess').\n\n"
        );

        // Every flow of one server.
        let lines = sess_lines(&sock);
        let on_s2: Vec<bool> = clients
            .iter()
            .map(|c| line_of(&lines, c).is_some_and(|l| l.contains(" srv=s2 ")))
            .collect();
        assert!(
            on_s2.iter().any(|b| *b),
            "{mode}: some flow on s2: {lines:#?}"
        );
        assert_eq!(
            cli(&sock, "shutdown sessions server be/nosuch"),
            "No such server.\n\n"
        );
        assert_eq!(cli(&sock, "shutdown sessions server be/s2"), "\n");
        for (i, c) in clients.iter_mut().enumerate().skip(1) {
            if on_s2[i] {
                assert!(closed(c), "{mode}: flow {i} on s2 closed");
            } else {
                assert!(echo_ok(c, 20 + i as u8), "{mode}: flow {i} on s1 kept");
            }
        }
        let kept = on_s2.iter().skip(1).filter(|b| !**b).count();
        eventually("s2 flows to leave show sess", WAIT, || {
            sess_lines(&sock).len() == kept
        });
        assert!(sess_lines(&sock).iter().all(|l| !l.contains(" srv=s2 ")));
    }
}

#[test]
fn shutdown_needs_admin_and_show_sess_needs_operator() {
    let e = Server::echo();
    let port = free_port();
    let shunt = Shunt::start(&simple_config(port, &[e.addr], ""), &[]);
    let sock = shunt.sock();
    assert_eq!(cli(&sock, "user; show sess"), "\nPermission denied\n\n");
    assert_eq!(
        cli(&sock, "operator; shutdown session 0x10"),
        "\nPermission denied\n\n"
    );
    assert_eq!(cli(&sock, "operator; show sess"), "\n\n");
}

#[test]
fn clear_counters_all_zeroes_show_stat() {
    let e = Server::echo();
    let port = free_port();
    let shunt = Shunt::start(
        &simple_config(port, &[e.addr], ""),
        &["--forward-mode", "copy"],
    );
    let sock = shunt.sock();
    let addr = ([127, 0, 0, 1], port).into();
    for i in 0..3 {
        let mut c = connect(addr);
        c.set_read_timeout(Some(WAIT)).expect("timeout");
        assert!(echo_ok(&mut c, i));
    }
    eventually("flows to end", WAIT, || {
        stat(&sock, "be", "BACKEND", "scur") == 0
    });
    assert_eq!(stat(&sock, "be", "s1", "stot"), 3);
    assert!(stat(&sock, "be", "BACKEND", "smax") >= 1);
    assert!(stat(&sock, "fe", "FRONTEND", "bin") >= 48);

    // Maxima only: totals stay, smax falls to the current value.
    assert_eq!(cli(&sock, "clear counters"), "\n");
    assert_eq!(stat(&sock, "be", "BACKEND", "smax"), 0);
    assert_eq!(stat(&sock, "be", "s1", "stot"), 3);

    assert_eq!(
        cli(&sock, "operator; clear counters all"),
        "\nPermission denied\n\n"
    );
    assert_eq!(stat(&sock, "be", "s1", "stot"), 3);
    assert_eq!(cli(&sock, "clear counters all"), "\n");
    for (px, sv) in [("fe", "FRONTEND"), ("be", "BACKEND"), ("be", "s1")] {
        for col in ["stot", "bin", "bout", "smax"] {
            assert_eq!(stat(&sock, px, sv, col), 0, "{px}/{sv} {col}");
        }
    }
}
