//! Live server management and the checks' timings, end to end through the real
//! binary: a server killed during traffic (fall, rise, inter/fastinter/downinter),
//! tcp-check against a real `redis-server`, agent drain / N% / maint with open
//! flows, `set server addr` under a connect loop, `on-marked-down
//! shutdown-sessions` in splice and sockmap modes, and the server-state file
//! across a restart. Every wait is bounded; timing bounds are wide (the machine is
//! shared), but each one separates the interval it checks from the others.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shunt_tests::*;

/// Longest wait for a state the checks should reach in a few intervals.
const STATE_WAIT: Duration = Duration::from_secs(15);
/// Longest wait for one read on a client socket.
const IO_WAIT: Duration = Duration::from_secs(5);

type Row = HashMap<String, String>;

/// Wait until `pred` holds for the row of be/`sv`; returns it.
fn wait_row(sh: &Shunt, sv: &str, what: &str, pred: impl Fn(&Row) -> bool) -> Row {
    let t0 = Instant::now();
    loop {
        let r = stat_row(&sh.sock(), "be", sv);
        if pred(&r) {
            return r;
        }
        assert!(
            t0.elapsed() < STATE_WAIT,
            "be/{sv} never reached {what}; last row: status={:?} check_status={:?} weight={:?}\nstderr:\n{}",
            r.get("status"),
            r.get("check_status"),
            r.get("weight"),
            sh.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn status(want: &'static str) -> impl Fn(&Row) -> bool {
    move |r| r.get("status").map(String::as_str) == Some(want)
}

fn config(port: u16, backend: &str) -> String {
    format!(
        "global\n    nbthread 2\n    stats socket @DIR@/admin.sock level admin\n\ndefaults\n    mode tcp\n    timeout connect 1s\n    timeout client 30s\n    timeout server 30s\n\nfrontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n\nbackend be\n{backend}"
    )
}

/// Open a flow through `fe` and read the tag byte of the server it reached.
fn open_tagged(fe: SocketAddr) -> (TcpStream, u8) {
    let mut s = connect(fe);
    s.set_read_timeout(Some(IO_WAIT)).expect("timeout");
    let mut b = [0u8; 1];
    s.read_exact(&mut b).expect("tag byte from a server");
    (s, b[0])
}

fn which(fe: SocketAddr) -> u8 {
    open_tagged(fe).1
}

/// One echo round trip on an open flow.
fn echo_ok(s: &mut TcpStream, tag: u8) -> bool {
    let msg = [tag; 32];
    if s.write_all(&msg).is_err() {
        return false;
    }
    let mut back = [0u8; 32];
    s.read_exact(&mut back).is_ok() && back == msg
}

/// True when the peer closed `s` (EOF or reset) within [`IO_WAIT`].
fn closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(IO_WAIT)).expect("timeout");
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            // Bytes still in flight from before the close.
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

/// A check endpoint for `tcp-check expect string OK`: answers `OK` while healthy,
/// `KO` otherwise, and records when each check arrived and what it was told.
struct Endpoint {
    server: Server,
    healthy: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<(Instant, bool)>>>,
}

impl Endpoint {
    fn start() -> Endpoint {
        let healthy = Arc::new(AtomicBool::new(true));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (h, l) = (healthy.clone(), log.clone());
        let server = Server::start(move |mut s| {
            let ok = h.load(Ordering::SeqCst);
            l.lock().expect("log").push((Instant::now(), ok));
            let _ = s.write_all(if ok { b"OK\n" } else { b"KO\n" });
        });
        Endpoint {
            server,
            healthy,
            log,
        }
    }

    fn arrivals(&self) -> Vec<(Instant, bool)> {
        self.log.lock().expect("log").clone()
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    assert!(!v.is_empty(), "no interval to measure");
    v.sort();
    v[v.len() / 2]
}

/// Acceptance 1: a server killed during traffic goes DOWN after `fall` failed
/// checks, new flows go elsewhere, and revived it is UP again after `rise` passes.
#[test]
fn killed_server_goes_down_traffic_moves_and_it_comes_back() {
    let s1 = Server::tagged_echo(1);
    let s2 = Server::tagged_echo(2);
    let s2_addr = s2.addr;
    let port = free_port();
    let fe: SocketAddr = ([127, 0, 0, 1], port).into();
    let sh = Shunt::start(
        &config(
            port,
            &format!(
                "    balance roundrobin\n    retries 1\n    server s1 {} check inter 1s fastinter 100ms downinter 1s rise 2 fall 3\n    server s2 {s2_addr} check inter 1s fastinter 100ms downinter 1s rise 2 fall 3\n",
                s1.addr
            ),
        ),
        &[],
    );
    wait_row(&sh, "s2", "L4OK", |r| r["check_status"] == "L4OK");
    let tags: Vec<u8> = (0..10).map(|_| which(fe)).collect();
    assert!(tags.contains(&1) && tags.contains(&2), "{tags:?}");

    // Traffic runs while s2 is killed.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::<(Instant, Option<u8>)>::new()));
    let traffic = {
        let (stop, seen) = (stop.clone(), seen.clone());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while !stop.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(60) {
                let at = Instant::now();
                let tag = TcpStream::connect(fe).ok().and_then(|mut s| {
                    s.set_read_timeout(Some(IO_WAIT)).ok()?;
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b).ok().map(|_| b[0])
                });
                seen.lock().expect("seen").push((at, tag));
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let killed = Instant::now();
    drop(s2);
    // The first failure comes within one `inter`; `fall - 1` more follow at
    // `fastinter` each.
    let first_fail = {
        wait_row(&sh, "s2", "a failed check", |r| r["chkfail"] != "0");
        Instant::now()
    };
    let down = wait_row(&sh, "s2", "DOWN", status("DOWN"));
    let went_down = Instant::now();
    assert_eq!(down["check_status"], "L4CON");
    assert_eq!(down["chkfail"], "3", "fall = 3 failures");
    assert_eq!(down["chkdown"], "1");
    let to_first = first_fail.duration_since(killed);
    let fall_time = went_down.duration_since(first_fail);
    assert!(
        to_first < Duration::from_millis(1000 + 700),
        "first failure {to_first:?} after the kill: more than one inter (1s) and slack"
    );
    assert!(
        fall_time < Duration::from_millis(900),
        "two more failures took {fall_time:?}: expected ~2 x fastinter (200ms), not 2 x inter (2s)"
    );
    assert!(sh.stderr().contains(
        "Server be/s2 is DOWN, reason: Layer4 connection problem, info: \"Connection refused\""
    ));

    // New flows all go to s1 once s2 is DOWN (a flow that picked s2 before may
    // still be retrying: the traffic thread waits for it, so leave it time).
    let after_down = Instant::now();
    std::thread::sleep(Duration::from_millis(2500));

    // Revive s2: UP after `rise` passes, the first within one `downinter`.
    let l = TcpListener::bind(s2_addr).expect("rebind s2's port");
    let revived_at = Instant::now();
    let _s2b = Server::serve(l, |mut s| {
        if s.write_all(&[2]).is_ok() {
            echo_until_eof(&mut s);
        }
    });
    let up = wait_row(&sh, "s2", "UP", status("UP"));
    let rise_time = revived_at.elapsed();
    assert_eq!(up["check_health"], "4", "rise + fall - 1");
    assert!(
        rise_time >= Duration::from_millis(80)
            && rise_time < Duration::from_millis(1000 + 100 + 1500),
        "UP {rise_time:?} after the revival: expected at most downinter (1s) + fastinter (100ms)"
    );
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    traffic.join().expect("traffic thread");
    let seen = seen.lock().expect("seen").clone();
    let while_down: Vec<_> = seen
        .iter()
        .filter(|(at, _)| *at >= after_down && *at < revived_at)
        .collect();
    assert!(while_down.len() >= 10, "traffic ran while s2 was down");
    assert!(
        while_down.iter().all(|(_, t)| *t == Some(1)),
        "every flow opened while s2 was DOWN reached s1: {while_down:?}"
    );
    let tags: Vec<u8> = (0..10).map(|_| which(fe)).collect();
    assert!(tags.contains(&2), "s2 serves again: {tags:?}");
}

/// Acceptance 1, timings: the intervals between checks are `inter` while UP,
/// `fastinter` while failing, `downinter` while DOWN.
#[test]
fn check_intervals_follow_inter_fastinter_downinter() {
    let srv = Server::echo();
    let ep = Endpoint::start();
    let port = free_port();
    let sh = Shunt::start(
        &config(
            port,
            &format!(
                "    option tcp-check\n    tcp-check expect string OK\n    server s1 {} check port {} inter 600ms fastinter 100ms downinter 1200ms rise 2 fall 3\n",
                srv.addr,
                ep.server.addr.port()
            ),
        ),
        &[],
    );
    wait_row(&sh, "s1", "L7OK", |r| r["check_status"] == "L7OK");
    std::thread::sleep(Duration::from_millis(2500));
    let sick_at = Instant::now();
    ep.healthy.store(false, Ordering::SeqCst);
    wait_row(&sh, "s1", "DOWN", status("DOWN"));
    std::thread::sleep(Duration::from_millis(4000));
    let log = ep.arrivals();
    let gaps = |from: Instant, to: Instant, ok: Option<bool>| -> Vec<Duration> {
        let pts: Vec<Instant> = log
            .iter()
            .filter(|(t, h)| *t >= from && *t < to && ok.is_none_or(|o| o == *h))
            .map(|(t, _)| *t)
            .collect();
        pts.windows(2).map(|w| w[1].duration_since(w[0])).collect()
    };
    let up = median(gaps(log[0].0, sick_at, Some(true)));
    assert!(
        up >= Duration::from_millis(500) && up <= Duration::from_millis(1000),
        "interval while UP {up:?}: expected inter (600ms)"
    );
    // The failures: the first one, then two at fastinter.
    let fails: Vec<Instant> = log
        .iter()
        .filter(|(t, h)| *t >= sick_at && !*h)
        .map(|(t, _)| *t)
        .collect();
    assert!(
        fails.len() >= 5,
        "checks went on while DOWN: {}",
        fails.len()
    );
    let falling: Vec<Duration> = fails[..3]
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .collect();
    for g in &falling {
        assert!(
            *g >= Duration::from_millis(70) && *g < Duration::from_millis(450),
            "interval while failing {falling:?}: expected fastinter (100ms)"
        );
    }
    let down: Vec<Duration> = fails[2..]
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .collect();
    let down = median(down);
    assert!(
        down >= Duration::from_millis(1000) && down <= Duration::from_millis(1800),
        "interval while DOWN {down:?}: expected downinter (1200ms)"
    );
    // Healthy again: the first pass within one downinter, UP one fastinter later.
    let healed = Instant::now();
    ep.healthy.store(true, Ordering::SeqCst);
    wait_row(&sh, "s1", "UP", status("UP"));
    let took = healed.elapsed();
    assert!(
        took < Duration::from_millis(1200 + 100 + 1000),
        "UP {took:?} after healing: expected <= downinter + fastinter"
    );
}

/// A `redis-server` on a free port, killed on drop.
struct Redis {
    child: std::process::Child,
    port: u16,
}

impl Redis {
    fn start() -> Option<Redis> {
        let port = free_port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let r = Redis { child, port };
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(r)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Acceptance 2: tcp-check PING / +PONG against a real redis-server.
#[test]
fn tcp_check_against_real_redis() {
    let Some(redis) = Redis::start() else {
        panic!("redis-server is not installed (apt-get install redis-server)");
    };
    let port = free_port();
    let cfg = config(
        port,
        &format!(
            "    option tcp-check\n    tcp-check send PING\\r\\n\n    tcp-check expect string +PONG\n    server r1 127.0.0.1:{p} check inter 100ms\n\nbackend wrong\n    option tcp-check\n    tcp-check send PING\\r\\n\n    tcp-check expect min-recv 5 string +NOPE comment redis-ping\n    server r1 127.0.0.1:{p} check inter 100ms fall 1\n",
            p = redis.port
        ),
    );
    let sh = Shunt::start(&cfg, &[]);
    let ok = wait_row(&sh, "r1", "L7OK", |r| r["check_status"] == "L7OK");
    assert_eq!(ok["status"], "UP");
    assert_eq!(ok["check_desc"], "Layer7 check passed");
    assert_eq!(ok["last_chk"], "(tcp-check)");
    let t0 = Instant::now();
    let bad = loop {
        let r = stat_row(&sh.sock(), "wrong", "r1");
        if r["status"] == "DOWN" {
            break r;
        }
        assert!(t0.elapsed() < STATE_WAIT, "wrong/r1 never DOWN: {r:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(bad["check_status"], "L7RSP");
    assert_eq!(bad["check_desc"], "Layer7 invalid response");
    assert_eq!(
        bad["last_chk"],
        "TCPCHK did not match content '+NOPE' at step 2 comment: redis-ping"
    );
    assert!(sh.stderr().contains("Server wrong/r1 is DOWN, reason: Layer7 invalid response, info: \"TCPCHK did not match content '+NOPE' at step 2 comment: redis-ping\""));
}

/// Acceptance 3: the agent's `75%`, `drain` (open flows continue, no new ones) and
/// `maint` (open flows continue).
#[test]
fn agent_percent_drain_and_maint_with_open_flows() {
    let s1 = Server::tagged_echo(1);
    let s2 = Server::tagged_echo(2);
    let word = Arc::new(Mutex::new("75%".to_string()));
    let agent = {
        let word = word.clone();
        Server::start(move |mut s| {
            let w = word.lock().expect("word").clone();
            let _ = s.write_all(format!("{w}\n").as_bytes());
        })
    };
    let port = free_port();
    let fe: SocketAddr = ([127, 0, 0, 1], port).into();
    let sh = Shunt::start(
        &config(
            port,
            &format!(
                "    balance roundrobin\n    server s1 {} weight 8 agent-check agent-port {} agent-inter 100ms\n    server s2 {} weight 8\n",
                s1.addr,
                agent.addr.port(),
                s2.addr
            ),
        ),
        &[],
    );
    let r = wait_row(&sh, "s1", "weight 6", |r| r["weight"] == "6");
    assert_eq!(r["uweight"], "6", "75% of the configured 8");
    assert_eq!(cli(&sh.sock(), "get weight be/s1"), "6 (initial 8)\n\n");
    // An open flow on s1.
    let mut on_s1 = None;
    for _ in 0..20 {
        let (s, tag) = open_tagged(fe);
        if tag == 1 {
            on_s1 = Some(s);
            break;
        }
    }
    let mut on_s1 = on_s1.expect("a flow reached s1");
    assert!(echo_ok(&mut on_s1, 7));

    *word.lock().expect("word") = "drain".to_string();
    wait_row(&sh, "s1", "DRAIN (agent)", status("DRAIN (agent)"));
    for _ in 0..10 {
        assert_eq!(which(fe), 2, "a drained server takes no new flow");
    }
    assert!(
        echo_ok(&mut on_s1, 8),
        "the open flow continues under drain"
    );

    *word.lock().expect("word") = "maint".to_string();
    wait_row(&sh, "s1", "MAINT", status("MAINT"));
    for _ in 0..10 {
        assert_eq!(which(fe), 2, "a server in maintenance takes no new flow");
    }
    assert!(
        echo_ok(&mut on_s1, 9),
        "the open flow continues in maintenance"
    );

    // The CLI's own drain and maintenance keep it too; `shutdown sessions` ends it.
    *word.lock().expect("word") = "ready".to_string();
    wait_row(&sh, "s1", "no check", status("no check"));
    assert_eq!(cli(&sh.sock(), "disable agent be/s1"), "\n");
    assert_eq!(cli(&sh.sock(), "set server be/s1 state drain"), "\n");
    assert!(echo_ok(&mut on_s1, 10));
    assert_eq!(cli(&sh.sock(), "set server be/s1 state maint"), "\n");
    assert!(echo_ok(&mut on_s1, 11));
    assert_eq!(cli(&sh.sock(), "shutdown sessions server be/s1"), "\n");
    assert!(closed(&mut on_s1), "shutdown sessions server ends it");
}

/// Acceptance 4: after `set server be/s1 addr 127.0.0.1 port P2` answers, every new
/// flow reaches P2 (1,000 flows), none the old port.
#[test]
fn addr_change_applies_to_every_later_flow() {
    let old = Server::tagged_echo(1);
    let new = Server::tagged_echo(2);
    let port = free_port();
    let fe: SocketAddr = ([127, 0, 0, 1], port).into();
    let sh = Shunt::start(
        &config(port, &format!("    server s1 {}\n", old.addr)),
        &["--forward-mode", "splice"],
    );
    let changed_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let stop = Arc::new(AtomicBool::new(false));
    let results = Arc::new(Mutex::new(Vec::<(Instant, u8)>::new()));
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (changed_at, stop, results) = (changed_at.clone(), stop.clone(), results.clone());
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let mut after = 0;
                while !stop.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(60) {
                    let at = Instant::now();
                    let tag = which(fe);
                    results.lock().expect("results").push((at, tag));
                    if changed_at.lock().expect("t").is_some_and(|c| at >= c) {
                        after += 1;
                        if after >= 500 {
                            break;
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let answer = cli(
        &sh.sock(),
        &format!("set server be/s1 addr 127.0.0.1 port {}", new.addr.port()),
    );
    *changed_at.lock().expect("t") = Some(Instant::now());
    assert_eq!(
        answer,
        format!(
            "no need to change the addr, port changed from '{}' to '{}' by 'stats socket command'\n\n",
            old.addr.port(),
            new.addr.port()
        )
    );
    for c in clients {
        c.join().expect("client");
    }
    stop.store(true, Ordering::Relaxed);
    let t = changed_at.lock().expect("t").expect("changed");
    let results = results.lock().expect("results").clone();
    let before = results.iter().filter(|(at, _)| *at < t).count();
    let after: Vec<u8> = results
        .iter()
        .filter(|(at, _)| *at >= t)
        .map(|(_, tag)| *tag)
        .collect();
    assert!(before > 0, "flows ran before the change");
    assert!(
        after.len() >= 1000,
        "1,000 flows after the change: {}",
        after.len()
    );
    let stale = after.iter().filter(|t| **t != 2).count();
    assert_eq!(
        stale, 0,
        "flows opened after the answer reached the old port"
    );
    assert_eq!(
        cli(&sh.sock(), "show servers state be")
            .lines()
            .nth(2)
            .map(|l| l.split(' ').nth(18).map(str::to_owned)),
        Some(Some(new.addr.port().to_string())),
        "srv_port"
    );
}

/// Acceptance 5: `on-marked-down shutdown-sessions` resets the open flows of a
/// server marked DOWN, by its checks or by the CLI, in splice and sockmap modes.
#[test]
fn on_marked_down_shutdown_sessions_resets_flows() {
    let mut modes = vec!["splice"];
    if bpf_wanted() {
        modes.push("sockmap");
    }
    let echo = Server::echo();
    for mode in modes {
        let health_port = free_port();
        let health = Server::serve(
            TcpListener::bind(("127.0.0.1", health_port)).expect("health port"),
            |_| {},
        );
        let port = free_port();
        let fe: SocketAddr = ([127, 0, 0, 1], port).into();
        let sh = Shunt::start(
            &config(
                port,
                &format!(
                    "    server s1 {} check port {health_port} inter 100ms rise 1 fall 1 on-marked-down shutdown-sessions\n",
                    echo.addr
                ),
            ),
            &["--forward-mode", mode],
        );
        wait_row(&sh, "s1", "L4OK", |r| r["check_status"] == "L4OK");
        let open = |n: u8| -> Vec<TcpStream> {
            (0..3)
                .map(|i| {
                    let mut c = connect(fe);
                    c.set_read_timeout(Some(IO_WAIT)).expect("timeout");
                    assert!(echo_ok(&mut c, n + i), "{mode}: flow echoes");
                    c
                })
                .collect()
        };
        let mut flows = open(1);
        let sess = cli(&sh.sock(), "show sess");
        assert!(
            sess.lines()
                .filter(|l| l.ends_with(&format!("fwd={mode}")))
                .count()
                == 3,
            "{mode}: the flows are forwarded in {mode}: {sess}"
        );
        // Drain keeps them.
        assert_eq!(cli(&sh.sock(), "set server be/s1 state drain"), "\n");
        for c in flows.iter_mut() {
            assert!(echo_ok(c, 20), "{mode}: drain keeps open flows");
        }
        assert_eq!(cli(&sh.sock(), "set server be/s1 state ready"), "\n");

        // The checks mark it DOWN: every open flow is reset.
        drop(health);
        wait_row(&sh, "s1", "DOWN", status("DOWN"));
        for (i, c) in flows.iter_mut().enumerate() {
            assert!(closed(c), "{mode}: flow {i} closed when s1 went DOWN");
        }
        // Up again; the CLI's `health down` does the same.
        let health = Server::serve(
            TcpListener::bind(("127.0.0.1", health_port)).expect("health port again"),
            |_| {},
        );
        wait_row(&sh, "s1", "UP", status("UP"));
        let mut flows = open(40);
        assert_eq!(cli(&sh.sock(), "disable health be/s1"), "\n");
        assert_eq!(cli(&sh.sock(), "set server be/s1 health down"), "\n");
        for (i, c) in flows.iter_mut().enumerate() {
            assert!(
                closed(c),
                "{mode}: flow {i} closed by 'set server health down'"
            );
        }
        let r = stat_row(&sh.sock(), "be", "s1");
        assert_eq!(r["status"], "DOWN");
        assert!(sh.stderr().contains(
            "Server be/s1 is DOWN, changed from CLI. 0 active and 0 backup servers left."
        ));
        // Health checks stay disabled: nothing brings it back until `health up`.
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(stat_row(&sh.sock(), "be", "s1")["status"], "DOWN");
        assert_eq!(cli(&sh.sock(), "set server be/s1 health up"), "\n");
        assert_eq!(stat_row(&sh.sock(), "be", "s1")["status"], "no check");
        assert_eq!(cli(&sh.sock(), "enable health be/s1"), "\n");
        wait_row(&sh, "s1", "UP", status("UP"));
        drop(health);
    }
}

/// Acceptance 6: `show servers state` saved to the server-state file survives a
/// restart: weights, maintenance, drain, addresses.
#[test]
fn server_state_file_round_trip_across_restart() {
    let a = Server::tagged_echo(1);
    let b = Server::tagged_echo(2);
    let moved = Server::tagged_echo(3);
    let dir = TempDir::new("state");
    let state = dir.path().join("servers.state");
    let port = free_port();
    let fe: SocketAddr = ([127, 0, 0, 1], port).into();
    let cfg = format!(
        "global\n    nbthread 2\n    stats socket @DIR@/admin.sock level admin\n    server-state-file {}\n\ndefaults\n    mode tcp\n    timeout connect 1s\n    timeout client 30s\n    timeout server 30s\n    load-server-state-from-file global\n\nfrontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n\nbackend be\n    server s1 {} weight 10\n    server s2 {} weight 10\n    server s3 {} weight 10\n    server s4 {} weight 10\n",
        state.display(),
        a.addr,
        b.addr,
        b.addr,
        b.addr
    );
    {
        let sh = Shunt::start(&cfg, &[]);
        let sock = sh.sock();
        assert_eq!(cli(&sock, "set server be/s1 weight 3"), "\n");
        assert_eq!(cli(&sock, "set server be/s2 state maint"), "\n");
        assert!(cli(
            &sock,
            &format!("set server be/s3 addr 127.0.0.1 port {}", moved.addr.port())
        )
        .contains("port changed from"));
        assert_eq!(cli(&sock, "set server be/s4 state drain"), "\n");
        let saved = cli(&sock, "show servers state");
        // What an operator saves: the answer without its final empty line.
        std::fs::write(&state, saved.trim_end_matches('\n').to_string() + "\n").expect("save");
    }
    let sh = Shunt::start(&cfg, &[]);
    let sock = sh.sock();
    assert!(
        sh.stderr().contains("server state loaded"),
        "{}",
        sh.stderr()
    );
    assert_eq!(cli(&sock, "get weight be/s1"), "3 (initial 10)\n\n");
    assert_eq!(stat_row(&sock, "be", "s2")["status"], "MAINT");
    assert_eq!(stat_row(&sock, "be", "s4")["status"], "DRAIN");
    assert_eq!(cli(&sock, "get weight be/s4"), "10 (initial 10)\n\n");
    assert_eq!(
        stat_row(&sock, "be", "s3")["addr"],
        moved.addr.to_string(),
        "s3's address survived"
    );
    // Flows: s1 and s3 (moved) only; s2 in maintenance, s4 draining.
    let tags: Vec<u8> = (0..26).map(|_| which(fe)).collect();
    assert!(tags.iter().all(|t| *t == 1 || *t == 3), "{tags:?}");
    assert!(
        tags.contains(&3),
        "s3 serves from its new address: {tags:?}"
    );
    // The saved state is the state: a second save reads the same (ages aside).
    let again = cli(&sock, "show servers state");
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .skip(2)
            .filter(|l| !l.is_empty())
            .map(|l| {
                let mut f: Vec<&str> = l.split(' ').collect();
                if f.len() > 9 {
                    f[9] = "_";
                }
                f.join(" ")
            })
            .collect()
    };
    let saved = std::fs::read_to_string(&state).expect("state");
    assert_eq!(strip(&again), strip(&saved));
}

/// A corrupted state file is ignored as a whole, with HAProxy's warning.
#[test]
fn corrupted_state_file_is_ignored_with_a_warning() {
    let a = Server::echo();
    let dir = TempDir::new("state-bad");
    let state = dir.path().join("bad.state");
    std::fs::write(&state, "1\n# be_id ...\n3 be 1 s1 127.0.0.1 2 1\n").expect("write");
    let port = free_port();
    let cfg = format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n    server-state-file {}\n\ndefaults\n    mode tcp\n    timeout connect 1s\n    timeout client 30s\n    timeout server 30s\n\nfrontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n\nbackend be\n    load-server-state-from-file global\n    server s1 {}\n",
        state.display(),
        a.addr
    );
    let sh = Shunt::start(&cfg, &[]);
    assert!(
        sh.stderr().contains(&format!(
            "config: corrupted global server state file '{}' at line 2.",
            state.display()
        )),
        "{}",
        sh.stderr()
    );
    assert_eq!(stat_row(&sh.sock(), "be", "s1")["status"], "no check");
}
