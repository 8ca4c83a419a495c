//! Health and agent checks seen from outside: the real binary checking real
//! servers, its `show stat` columns, its transition logs, and where flows go.
//! Intervals are short (100 ms) and every wait is bounded and tolerant: a test
//! waits for a state, it never counts exact check timings.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shunt_tests::*;

/// Longest wait for a state the checks should reach in a few intervals.
const STATE_WAIT: Duration = Duration::from_secs(10);

/// Wait until `pred` holds for the stat row of px/sv; returns the row.
fn wait_row(
    sh: &Shunt,
    px: &str,
    sv: &str,
    what: &str,
    pred: impl Fn(&std::collections::HashMap<String, String>) -> bool,
) -> std::collections::HashMap<String, String> {
    let t0 = Instant::now();
    loop {
        let r = stat_row(&sh.sock(), px, sv);
        if pred(&r) {
            return r;
        }
        assert!(
            t0.elapsed() < STATE_WAIT,
            "{px}/{sv} never reached {what}; last row: status={:?} check_status={:?} last_chk={:?}\nstderr:\n{}",
            r.get("status"),
            r.get("check_status"),
            r.get("last_chk"),
            sh.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn status_is(want: &'static str) -> impl Fn(&std::collections::HashMap<String, String>) -> bool {
    move |r| r.get("status").map(String::as_str) == Some(want)
}

/// The tag byte of the server a new flow through `fe` reaches.
fn which(fe: SocketAddr) -> u8 {
    let mut s = connect(fe);
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut b = [0u8; 1];
    s.read_exact(&mut b).expect("tag byte from a server");
    b[0]
}

fn config(port: u16, backend: &str) -> String {
    format!(
        "global\n    nbthread 2\n    stats socket @DIR@/admin.sock level admin\n\ndefaults\n    mode tcp\n    timeout connect 1s\n    timeout client 30s\n    timeout server 30s\n\nfrontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n\nbackend be\n{backend}"
    )
}

#[test]
fn dead_server_goes_down_then_comes_back_up() {
    let live = Server::tagged_echo(1);
    let dead_port = free_port();
    let port = free_port();
    let fe: SocketAddr = ([127, 0, 0, 1], port).into();
    let sh = Shunt::start(
        &config(
            port,
            &format!(
                "    server s1 {} check inter 100ms rise 2 fall 2\n    server s2 127.0.0.1:{dead_port} check inter 100ms rise 2 fall 2\n",
                live.addr
            ),
        ),
        &[],
    );
    let down = wait_row(&sh, "be", "s2", "DOWN", status_is("DOWN"));
    assert_eq!(down["check_status"], "L4CON");
    assert_eq!(down["check_desc"], "Layer4 connection problem");
    assert_eq!(down["last_chk"], "Connection refused");
    assert_eq!(down["chkdown"], "1");
    assert_eq!(down["check_health"], "0");
    let up = wait_row(&sh, "be", "s1", "UP", status_is("UP"));
    assert_eq!(up["check_status"], "L4OK");
    assert_eq!(up["check_desc"], "Layer4 check passed");
    let log = sh.stderr();
    assert!(
        log.contains("Server be/s2 is DOWN, reason: Layer4 connection problem, info: \"Connection refused\", check duration: ") && log.contains("ms. 1 active and 0 backup servers left. 0 sessions active, 0 requeued, 0 remaining in queue."),
        "{log}"
    );
    // The live server takes every flow.
    let lb_before = stat(&sh.sock(), "be", "s2", "lbtot");
    for _ in 0..20 {
        assert_eq!(which(fe), 1);
    }
    assert_eq!(stat(&sh.sock(), "be", "s2", "lbtot"), lb_before);

    // Bring s2 up on its port: UP after `rise` passed checks.
    let l = TcpListener::bind(("127.0.0.1", dead_port)).expect("bind the dead port");
    let revived = Server::serve(l, |mut s| {
        if s.write_all(&[2]).is_ok() {
            echo_until_eof(&mut s);
        }
    });
    let back = wait_row(&sh, "be", "s2", "UP", status_is("UP"));
    assert_eq!(back["check_status"], "L4OK");
    assert_eq!(back["check_health"], "3", "rise + fall - 1 once fully up");
    let log = sh.stderr();
    assert!(
        log.contains("Server be/s2 is UP, reason: Layer4 check passed, check duration: ")
            && log.contains(
                "ms. 2 active and 0 backup servers online. 0 sessions requeued, 0 total in queue."
            ),
        "{log}"
    );
    let tags: Vec<u8> = (0..20).map(|_| which(fe)).collect();
    assert!(
        tags.contains(&1) && tags.contains(&2),
        "both servers serve again: {tags:?}"
    );
    drop(revived);
}

#[test]
fn all_servers_down_logs_no_server_available() {
    let port = free_port();
    let dead = free_port();
    let sh = Shunt::start(
        &config(
            port,
            &format!("    server s1 127.0.0.1:{dead} check inter 100ms fall 1\n"),
        ),
        &[],
    );
    wait_row(&sh, "be", "s1", "DOWN", status_is("DOWN"));
    let t0 = Instant::now();
    while !sh.stderr().contains("backend be has no server available!") {
        assert!(t0.elapsed() < STATE_WAIT, "{}", sh.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    let be = stat_row(&sh.sock(), "be", "BACKEND");
    assert_eq!(be["status"], "DOWN");
}

/// A tiny Redis-like server: answers `+PONG` to a `PING` line, then closes.
fn pong_server() -> Server {
    Server::start(|s| {
        let mut r = BufReader::new(s);
        let mut line = String::new();
        if r.read_line(&mut line).is_ok() && line.starts_with("PING") {
            let _ = r.get_mut().write_all(b"+PONG\r\n");
        }
    })
}

#[test]
fn tcp_check_send_expect() {
    let pong = pong_server();
    let port = free_port();
    let cfg = config(
        port,
        &format!(
            "    option tcp-check\n    tcp-check send PING\\r\\n\n    tcp-check expect string +PONG\n    server s1 {} check inter 100ms\n\nbackend wrong\n    option tcp-check\n    tcp-check send PING\\r\\n\n    tcp-check expect string +NOPE comment redis\n    server s1 {} check inter 100ms fall 1\n",
            pong.addr, pong.addr
        ),
    );
    let sh = Shunt::start(&cfg, &[]);
    let ok = wait_row(&sh, "be", "s1", "L7OK", |r| r["check_status"] == "L7OK");
    assert_eq!(ok["status"], "UP");
    assert_eq!(ok["check_desc"], "Layer7 check passed");
    assert_eq!(ok["check_code"], "0");
    assert_eq!(ok["last_chk"], "(tcp-check)");
    let bad = wait_row(&sh, "wrong", "s1", "DOWN", status_is("DOWN"));
    assert_eq!(bad["check_status"], "L7RSP");
    assert_eq!(bad["check_desc"], "Layer7 invalid response");
    assert_eq!(
        bad["last_chk"],
        "TCPCHK did not match content '+NOPE' at step 2 comment: redis"
    );
    assert!(
        sh.stderr().contains(
            "Server wrong/s1 is DOWN, reason: Layer7 invalid response, info: \"TCPCHK did not match content '+NOPE' at step 2 comment: redis\""
        ),
        "{}",
        sh.stderr()
    );
}

#[test]
fn tcp_check_connect_refused_names_the_step() {
    let port = free_port();
    let dead = free_port();
    let cfg = config(
        port,
        &format!(
            "    option tcp-check\n    tcp-check send PING\\r\\n\n    tcp-check expect string +PONG\n    server s1 127.0.0.1:{dead} check inter 100ms fall 1\n"
        ),
    );
    let sh = Shunt::start(&cfg, &[]);
    let r = wait_row(&sh, "be", "s1", "DOWN", status_is("DOWN"));
    assert_eq!(r["check_status"], "L4CON");
    assert_eq!(
        r["last_chk"],
        "Connection refused at initial connection step of tcp-check"
    );
}

/// An agent answering the current contents of `word` (plus a line end) to every
/// connection.
fn agent(word: Arc<Mutex<String>>) -> Server {
    Server::start(move |mut s| {
        let w = word.lock().expect("agent word").clone();
        let _ = s.write_all(format!("{w}\n").as_bytes());
    })
}

#[test]
fn agent_drain_weight_and_maint() {
    let s1 = Server::tagged_echo(1);
    let s2 = Server::tagged_echo(2);
    let word = Arc::new(Mutex::new("drain".to_string()));
    let ag = agent(word.clone());
    let port = free_port();
    let fe: SocketAddr = ([127, 0, 0, 1], port).into();
    let cfg = config(
        port,
        &format!(
            "    server s1 {} weight 10 agent-check agent-addr 127.0.0.1 agent-port {} agent-inter 100ms\n    server s2 {} weight 10\n",
            s1.addr,
            ag.addr.port(),
            s2.addr
        ),
    );
    let sh = Shunt::start(&cfg, &[]);
    // drain: no new flows on s1, its weight kept.
    let r = wait_row(&sh, "be", "s1", "DRAIN (agent)", status_is("DRAIN (agent)"));
    assert_eq!(r["weight"], "10");
    for _ in 0..10 {
        assert_eq!(which(fe), 2, "a drained server takes no new flow");
    }
    // ready 50%: back in rotation at half its configured weight.
    *word.lock().expect("word") = "ready 50%".to_string();
    let r = wait_row(&sh, "be", "s1", "weight 5", |r| {
        r["weight"] == "5" && r["status"] == "no check"
    });
    assert_eq!(r["uweight"], "5");
    let tags: Vec<u8> = (0..30).map(|_| which(fe)).collect();
    assert!(tags.contains(&1), "s1 serves again: {tags:?}");
    // maint: maintenance.
    *word.lock().expect("word") = "maint".to_string();
    wait_row(&sh, "be", "s1", "MAINT", status_is("MAINT"));
    for _ in 0..10 {
        assert_eq!(which(fe), 2, "a server in maintenance takes no new flow");
    }
    // down, then up: DOWN (agent), then UP again.
    *word.lock().expect("word") = "ready down # disk full".to_string();
    wait_row(&sh, "be", "s1", "DOWN (agent)", status_is("DOWN (agent)"));
    assert!(
        sh.stderr().contains(
            "Server be/s1 is DOWN, reason: Layer7 wrong status, code: 0, info: \"via agent : down (disk full)\""
        ),
        "{}",
        sh.stderr()
    );
    *word.lock().expect("word") = "up 100%".to_string();
    let r = wait_row(&sh, "be", "s1", "no check", status_is("no check"));
    assert_eq!(r["weight"], "10");
}

/// A server that accepts and never answers, and a configuration whose check of
/// it (`tcp-check expect string hello`, every 100 ms) times out after
/// `timeout_check`; the server must live as long as the test.
fn silent_check(timeout_check: &str) -> (Server, String) {
    let silent = Server::start(|mut s| {
        let mut b = [0u8; 64];
        // Hold the connection until the checker gives up.
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        while matches!(s.read(&mut b), Ok(n) if n > 0) {}
    });
    let cfg = config(
        free_port(),
        &format!(
            "    timeout check {timeout_check}\n    option tcp-check\n    tcp-check expect string hello\n    server s1 {} check inter 100ms fall 1\n",
            silent.addr
        ),
    );
    (silent, cfg)
}

/// A check against a port that accepts but never answers times out with L7TOUT.
#[test]
fn tcp_check_expect_times_out() {
    let (_silent, cfg) = silent_check("200ms");
    let sh = Shunt::start(&cfg, &[]);
    let r = wait_row(&sh, "be", "s1", "L7TOUT", |r| r["check_status"] == "L7TOUT");
    assert_eq!(r["status"], "DOWN");
    assert_eq!(
        r["last_chk"],
        " at step 1 of tcp-check (expect string 'hello')"
    );
}

/// While a check runs, `show stat` puts `* ` before the last status, as
/// HAProxy does (`CHK_ST_INPROGRESS`): `* INI` during the first check, then
/// the last result with the mark while the next one runs.
#[test]
fn a_running_check_is_marked_in_show_stat() {
    let (_silent, cfg) = silent_check("1500ms");
    let sh = Shunt::start(&cfg, &[]);
    let status = || {
        show_stat_raw(&sh.sock())
            .into_iter()
            .find(|r| r["pxname"] == "be" && r["svname"] == "s1")
            .map(|r| r["check_status"].clone())
            .unwrap_or_default()
    };
    let mut seen = Vec::new();
    let t0 = Instant::now();
    for want in ["* INI", "* L7TOUT"] {
        while !seen.iter().any(|s: &String| s == want) {
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "never saw {want:?}; saw {seen:?}\nstderr:\n{}",
                sh.stderr()
            );
            let s = status();
            if seen.last() != Some(&s) {
                seen.push(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // The result itself, between checks, comes without the mark.
    assert!(
        seen.iter()
            .all(|s| s.starts_with("* ") || s == "L7TOUT" || s == "INI"),
        "unexpected statuses: {seen:?}"
    );
}
