//! Issue 13, "Reloads that can never take the service down", through the real
//! binary (`shunt -f CFG -x SOCK -sf OLDPID`).
//!
//! Good reloads with each kind of extra listener or socket configured (a
//! Prometheus exporter, a second stats socket, syslog over UDP and a TCP
//! `ring`): under a steady loop of echo connections, three reloads in a row
//! refuse, reset and corrupt none; each new process comes up (its stats
//! sockets answer `show info` with its pid), the old one exits, and what the
//! extra piece serves keeps working (the exporter answers `GET /metrics` with no
//! "Address already in use"; the log targets receive the new process's lines).
//! In copy mode and, where BPF is wanted, in sockmap mode.
//!
//! Reloads that must fail: a long-lived flow (kernel-forwarded in sockmap mode,
//! each side writing a known stream and checking every byte it reads) runs
//! while reloads with a broken configuration are attempted (an unknown
//! keyword, a frontend or Prometheus port held by another process, a map file
//! that cannot be read). Each attempt exits non-zero with an `[ALERT]` naming the
//! problem, and the old process is left exactly as it was: same pid running,
//! its stats socket and pidfile still its own, new connections served, the long
//! flow still moving (and still in the kernel); at the end the flow completes
//! byte for byte both ways, and a good reload still succeeds afterwards.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shunt_tests::reload::*;
use shunt_tests::*;

/// Reloads per connection-loop run.
const RELOADS: usize = 3;
/// Client threads running the connection loop.
const CLIENTS: usize = 2;
/// Upper bound on any load loop, whatever happens.
const LOOP_LIMIT: Duration = Duration::from_secs(120);
/// How long a new process may take to log "shunt started".
const START_LIMIT: Duration = Duration::from_secs(15);
/// How long an old process may take to exit after a good reload.
const OLD_EXIT: Duration = Duration::from_secs(15);
/// How long a reload with a broken configuration may take to give up.
const FAIL_LIMIT: Duration = Duration::from_secs(20);
/// Bound on each wait for traffic to make progress.
const PROGRESS_LIMIT: Duration = Duration::from_secs(20);
/// Bytes per second each side of the long-lived flow writes.
const LONG_RATE: usize = 512 * 1024;
/// Bytes each side of the long-lived flow writes at least before it closes.
const LONG_MIN: usize = 3 * 1024 * 1024;
/// Period of the long-lived flow's event loop.
const LONG_TICK: Duration = Duration::from_millis(10);
/// Most bytes one side writes in one round of the pump (a quarter second's worth).
const LONG_BURST: u64 = LONG_RATE as u64 / 4;
/// How the pump drives the long-lived flow.
const PACE: Pace = Pace {
    rate: LONG_RATE,
    burst: LONG_BURST,
    tick: LONG_TICK,
    limit: LOOP_LIMIT,
    drain_limit: PROGRESS_LIMIT,
};

// ------------------------------------------------------------------ helpers

/// Sets the flag when dropped: client threads stop even when the test panics.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Wait (bounded) until the loop completed `n` more exchanges.
fn wait_loop_progress(tally: &Tally, n: usize, what: &str) {
    let from = tally.ok.load(Ordering::Relaxed);
    eventually(
        &format!("{n} more connections of the loop ({what})"),
        PROGRESS_LIMIT,
        || tally.ok.load(Ordering::Relaxed) >= from + n,
    );
}

/// One stats-socket command, without panicking when nobody answers.
fn try_cli(sock: &Path, cmd: &str) -> Result<String, String> {
    use std::os::unix::net::UnixStream;
    let mut s =
        UnixStream::connect(sock).map_err(|e| format!("connect {}: {e}", sock.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    s.write_all(format!("{cmd}\n").as_bytes())
        .map_err(|e| format!("send '{cmd}': {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("read the answer to '{cmd}': {e}"))?;
    Ok(out)
}

/// The `Pid` that `show info` on `sock` reports.
fn info_pid(sock: &Path) -> Result<i32, String> {
    let text = try_cli(sock, "show info")?;
    text.lines()
        .find_map(|l| l.strip_prefix("Pid: "))
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| format!("no Pid in the answer to 'show info': {text:?}"))
}

/// Whether `shunt` still runs (not exited, not a zombie, and kill(pid, 0) works).
fn running(shunt: &mut Shunt) -> bool {
    let pid = shunt.pid();
    // SAFETY: kill(2) with signal 0 only checks the pid; no memory involved.
    let exists = pid > 0 && unsafe { libc::kill(pid, 0) } == 0;
    exists && shunt.wait(Duration::ZERO).is_none()
}

/// `GET /metrics` from the exporter on `port`: the answer, if it is a 200 with
/// HAProxy's process metrics.
fn scrape(port: u16) -> Result<String, String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| format!("send the request to {addr}: {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("read the answer from {addr}: {e}"))?;
    let status = out.lines().next().unwrap_or("");
    if !(status.starts_with("HTTP/1.1 200") || status.starts_with("HTTP/1.0 200")) {
        return Err(format!("{addr} answered {status:?}"));
    }
    if !out.contains("haproxy_process_") {
        return Err(format!("no haproxy_process_* metric from {addr}"));
    }
    Ok(out)
}

/// Start `shunt -f CFG --forward-mode MODE -x SOCK -sf OLD` and wait (bounded)
/// until it logs "shunt started"; the error says how it failed, with its log.
fn start_successor(cfg: &str, mode: &str, sock: &Path, old_pid: i32) -> Result<Shunt, String> {
    let sock_s = sock.display().to_string();
    let pid = old_pid.to_string();
    let mut new = Shunt::spawn_with(
        &[],
        cfg,
        &[
            "--forward-mode",
            mode,
            "-x",
            sock_s.as_str(),
            "-sf",
            pid.as_str(),
        ],
    );
    let t0 = Instant::now();
    loop {
        if new.stderr().contains("shunt started") {
            return Ok(new);
        }
        if let Some(code) = new.wait(Duration::ZERO) {
            return Err(format!(
                "it exited with code {code}; its log:\n{}",
                plain(&new.stderr())
            ));
        }
        if t0.elapsed() > START_LIMIT {
            return Err(format!(
                "it did not start in {START_LIMIT:?}; its log:\n{}",
                plain(&new.stderr())
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Removes the BPF pin directory of the instance whose reload socket is
/// `socket` (`/sys/fs/bpf/shunt/<the path with '/' and '.' as '_'>`) when
/// dropped, after the test's processes are gone: a process that handed its
/// maps to a successor that then died does not unpin them, and each failing
/// run would leave its maps pinned.
struct PinGuard(std::path::PathBuf);

impl PinGuard {
    fn new(socket: &Path) -> PinGuard {
        PinGuard(pin_dir(socket))
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Whether tests use the kernel path: "sockmap" where BPF is wanted and the
/// BPF filesystem is mounted (the hand-over pins the maps there), else "splice".
fn kernel_mode() -> &'static str {
    if kernel_handover_wanted() {
        "sockmap"
    } else {
        "splice"
    }
}

// ------------------------------------------------ good reloads, each extra kind

/// What the configuration has besides its frontend and stats socket.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Extra {
    /// `stats prometheus bind 127.0.0.1:PORT`.
    Prometheus,
    /// A second stats socket, `level user`.
    TwoStatsSockets,
    /// `log 127.0.0.1:UDP` and `log ring@r1` to a TCP server, `option tcplog`.
    Syslog,
}

/// A UDP syslog receiver and a TCP ring server on loopback, keeping all they get.
struct LogSinks {
    udp_port: u16,
    ring_port: u16,
    udp: Arc<Mutex<String>>,
    ring: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl LogSinks {
    fn start() -> LogSinks {
        let stop = Arc::new(AtomicBool::new(false));
        let (udp, ring) = (Arc::default(), Arc::default());
        let u = UdpSocket::bind("127.0.0.1:0").expect("bind the UDP syslog receiver");
        u.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        let udp_port = u.local_addr().expect("addr").port();
        let (st, text): (Arc<AtomicBool>, Arc<Mutex<String>>) = (stop.clone(), Arc::clone(&udp));
        let t_udp = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            let t0 = Instant::now();
            while !st.load(Ordering::Relaxed) && t0.elapsed() < LOOP_LIMIT {
                if let Ok(n) = u.recv(&mut buf) {
                    let mut t = text.lock().expect("lock");
                    t.push_str(&String::from_utf8_lossy(&buf[..n]));
                    t.push('\n');
                }
            }
        });
        let l = TcpListener::bind("127.0.0.1:0").expect("bind the ring server");
        l.set_nonblocking(true).expect("nonblocking");
        let ring_port = l.local_addr().expect("addr").port();
        let (st, text): (Arc<AtomicBool>, Arc<Mutex<String>>) = (stop.clone(), Arc::clone(&ring));
        let t_ring = std::thread::spawn(move || {
            let mut readers = Vec::new();
            let t0 = Instant::now();
            while !st.load(Ordering::Relaxed) && t0.elapsed() < LOOP_LIMIT {
                let Ok((mut s, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let (st, text) = (st.clone(), text.clone());
                readers.push(std::thread::spawn(move || {
                    s.set_nonblocking(false).expect("blocking");
                    s.set_read_timeout(Some(Duration::from_millis(100)))
                        .expect("timeout");
                    let mut buf = vec![0u8; 65536];
                    while !st.load(Ordering::Relaxed) && t0.elapsed() < LOOP_LIMIT {
                        match s.read(&mut buf) {
                            Ok(0) => break,
                            Ok(n) => text
                                .lock()
                                .expect("lock")
                                .push_str(&String::from_utf8_lossy(&buf[..n])),
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    ErrorKind::WouldBlock | ErrorKind::TimedOut
                                ) => {}
                            Err(_) => break,
                        }
                    }
                }));
            }
            for r in readers {
                let _ = r.join();
            }
        });
        LogSinks {
            udp_port,
            ring_port,
            udp,
            ring,
            stop,
            threads: vec![t_udp, t_ring],
        }
    }

    /// Wait (bounded) until both targets got a line from process `pid`.
    fn wait_lines_from(&self, pid: i32, what: &str) {
        let tag = format!("shunt[{pid}]:");
        eventually(
            &format!("a UDP syslog line from {tag} ({what})"),
            PROGRESS_LIMIT,
            || self.udp.lock().expect("lock").contains(&tag),
        );
        eventually(
            &format!("a ring (TCP syslog) line from {tag} ({what})"),
            PROGRESS_LIMIT,
            || self.ring.lock().expect("lock").contains(&tag),
        );
    }
}

impl Drop for LogSinks {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[test]
fn reloads_with_a_prometheus_exporter_keep_serving() {
    reload_loop(Extra::Prometheus, "copy");
}

#[test]
fn reloads_with_a_prometheus_exporter_keep_serving_in_sockmap_mode() {
    if bpf_wanted() {
        reload_loop(Extra::Prometheus, "sockmap");
    }
}

#[test]
fn reloads_with_two_stats_sockets_keep_serving() {
    reload_loop(Extra::TwoStatsSockets, "splice");
}

#[test]
fn reloads_with_two_stats_sockets_keep_serving_in_sockmap_mode() {
    if bpf_wanted() {
        reload_loop(Extra::TwoStatsSockets, "sockmap");
    }
}

#[test]
fn reloads_with_syslog_and_ring_targets_keep_serving() {
    reload_loop(Extra::Syslog, "copy");
}

#[test]
fn reloads_with_syslog_and_ring_targets_keep_serving_in_sockmap_mode() {
    if bpf_wanted() {
        reload_loop(Extra::Syslog, "sockmap");
    }
}

/// [`RELOADS`] good reloads (same configuration, same ports) under the
/// connection loop, with `extra` configured, forwarding in `mode`.
fn reload_loop(extra: Extra, mode: &str) {
    let server = Server::echo();
    let shared = TempDir::new("reload-safety");
    let d = shared.path().display().to_string();
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let sock = shared.path().join("admin.sock");
    // Dropped after every process of the test (declared before them).
    let _pins = PinGuard::new(&sock);
    let user_sock = shared.path().join("user.sock");
    let pidfile = shared.path().join("shunt.pid");
    let prom_port = free_port();
    let sinks = (extra == Extra::Syslog).then(LogSinks::start);
    let (global_extra, sections, fe_extra) = match (extra, &sinks) {
        (Extra::Prometheus, _) => (
            format!("    stats prometheus bind 127.0.0.1:{prom_port}\n"),
            String::new(),
            String::new(),
        ),
        (Extra::TwoStatsSockets, _) => (
            format!("    stats socket {d}/user.sock level user\n"),
            String::new(),
            String::new(),
        ),
        (Extra::Syslog, Some(s)) => (
            format!(
                "    log 127.0.0.1:{} local0\n    log ring@r1 local0\n",
                s.udp_port
            ),
            format!(
                "ring r1\n    format rfc3164\n    maxlen 1024\n    size 65536\n    timeout connect 1s\n    timeout server 2s\n    server rs 127.0.0.1:{} log-proto octet-count\n\n",
                s.ring_port
            ),
            "    log global\n    option tcplog\n".to_string(),
        ),
        (Extra::Syslog, None) => unreachable!("the sinks exist for the syslog case"),
    };
    let cfg = [
        reload_global(shared.path(), true, &global_extra),
        sections,
        tcp_defaults("30s"),
        frontend("fe", port, &fe_extra, "be"),
        backend("be", server.addr),
    ]
    .concat();
    let what = format!("{extra:?}, {mode} mode");

    let mut old = Shunt::start(&cfg, &["--forward-mode", mode]);
    // The first process serves everything configured (else the test is wrong).
    let check_extra = |pid: i32, stage: &str| match extra {
        Extra::Prometheus => {
            if let Err(e) = scrape(prom_port) {
                panic!("{what}, {stage}: the exporter does not answer: {e}");
            }
        }
        Extra::TwoStatsSockets => assert_eq!(
            info_pid(&user_sock),
            Ok(pid),
            "{what}, {stage}: the level-user stats socket must reach process {pid}"
        ),
        Extra::Syslog => sinks
            .as_ref()
            .expect("sinks")
            .wait_lines_from(pid, &format!("{what}, {stage}")),
    };

    let stop = Arc::new(AtomicBool::new(false));
    let _stop_guard = StopOnDrop(stop.clone());
    let tally = Arc::new(Tally::default());
    let clients = spawn_clients(addr, CLIENTS, &stop, &tally, LOOP_LIMIT);
    wait_loop_progress(&tally, 5, &format!("{what}, before the reloads"));
    check_extra(old.pid(), "before the reloads");

    for round in 1..=RELOADS {
        wait_loop_progress(&tally, 5, &format!("{what}, before reload {round}"));
        let old_pid = old.pid();
        let new = start_successor(&cfg, mode, &sock, old_pid).unwrap_or_else(|e| {
            panic!(
                "{what}, reload {round}: the new process did not come up: {e}\n\
                 old process {old_pid} still running: {}; its stats socket answers: {:?}",
                running(&mut old),
                info_pid(&sock)
            )
        });
        let log = plain(&new.stderr());
        assert!(
            !log.contains("Address already in use"),
            "{what}, reload {round}: the new process met a port in use:\n{log}"
        );
        assert_eq!(
            old.wait(OLD_EXIT),
            Some(0),
            "{what}, reload {round}: the old process did not exit cleanly; its log:\n{}",
            plain(&old.stderr())
        );
        assert_eq!(
            info_pid(&sock),
            Ok(new.pid()),
            "{what}, reload {round}: the admin stats socket must reach the new process"
        );
        assert_eq!(
            pid_in(&pidfile),
            new.pid(),
            "{what}, reload {round}: pidfile"
        );
        check_extra(new.pid(), &format!("after reload {round}"));
        old = new;
    }
    wait_loop_progress(&tally, 5, &format!("{what}, after the reloads"));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("client thread");
    }
    let (ok, refused, reset, corrupted, other) = tally.counts();
    eprintln!(
        "{what}: {RELOADS} reloads, {ok} connections ok, {refused} refused, {reset} reset, \
         {corrupted} corrupted, {other} other failures"
    );
    assert!(
        ok >= 5 * (RELOADS + 2),
        "{what}: too few connections ran: {ok}"
    );
    assert_eq!(
        (refused, reset, corrupted, other),
        (0, 0, 0, 0),
        "{what}: connections failed during reloads (refused, reset, corrupted, other)"
    );
    // The last process forwarded in the mode asked for.
    assert_mode(&sock, mode);
}

// ------------------------------------------ failed reloads and a long-lived flow

/// The test's view of the long-lived flow's progress.
#[derive(Default)]
struct LongProgress {
    /// Least bytes read by either side so far.
    min_read: AtomicUsize,
    /// Least bytes written by either side so far.
    min_written: AtomicUsize,
    /// What went wrong on a side (an error, or an EOF before the end).
    failure: Mutex<Option<String>>,
}

/// A long-lived flow through shunt: both sides pumped by one thread at
/// [`LONG_RATE`] until told to stop, then closed and read to EOF.
struct LongFlow {
    client_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    progress: Arc<LongProgress>,
    pump: Option<JoinHandle<Vec<Side>>>,
}

impl LongFlow {
    /// Connect to `addr`; the server side is accepted on `backend`.
    fn open(addr: SocketAddr, backend: &TcpListener) -> LongFlow {
        let mut c = connect(addr);
        c.write_all(b"long-flow").expect("send the greeting");
        backend.set_nonblocking(true).expect("nonblocking");
        let t0 = Instant::now();
        let mut s = loop {
            match backend.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    assert!(
                        t0.elapsed() < PROGRESS_LIMIT,
                        "shunt did not connect the long flow to its server"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("accept the long flow: {e}"),
            }
        };
        s.set_nonblocking(false).expect("blocking");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut hello = [0u8; 9];
        s.read_exact(&mut hello).expect("read the greeting");
        assert_eq!(&hello, b"long-flow");
        let client_addr = c.local_addr().expect("client addr");
        let sides = vec![Side::new(c, 0, true), Side::new(s, 0, false)];
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(LongProgress::default());
        let (st, pr) = (stop.clone(), progress.clone());
        let pump = std::thread::spawn(move || {
            pump_sides(sides, PACE, &st, |sides| {
                let min = |f: fn(&Side) -> u64| sides.iter().map(f).min().unwrap_or(0) as usize;
                pr.min_read.store(min(|s| s.read), Ordering::Relaxed);
                pr.min_written.store(min(|s| s.written), Ordering::Relaxed);
                if let Some(s) = sides.iter().find(|s| s.error.is_some() || s.eof) {
                    let e = s.error.clone().unwrap_or_else(|| "EOF from shunt".into());
                    pr.failure
                        .lock()
                        .expect("lock")
                        .get_or_insert(format!("{} side: {e}", s.name()));
                }
            })
        });
        LongFlow {
            client_addr,
            stop,
            progress,
            pump: Some(pump),
        }
    }

    fn failure(&self) -> Option<String> {
        self.progress.failure.lock().expect("lock").clone()
    }

    /// Wait (bounded) until both sides read LONG_RATE/4 more bytes; the problem if not.
    fn progressed(&self) -> Result<(), String> {
        let from = self.progress.min_read.load(Ordering::Relaxed);
        let t0 = Instant::now();
        while self.progress.min_read.load(Ordering::Relaxed) < from + LONG_RATE / 4 {
            if let Some(f) = self.failure() {
                return Err(format!("the long flow failed: {f}"));
            }
            if t0.elapsed() > PROGRESS_LIMIT {
                return Err(format!(
                    "the long flow stopped moving (least bytes read by a side: {})",
                    self.progress.min_read.load(Ordering::Relaxed)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Run until both sides wrote LONG_MIN bytes (bounded), close, and check
    /// both directions byte for byte; the problems found.
    fn finish(mut self) -> Vec<String> {
        let t0 = Instant::now();
        while self.progress.min_written.load(Ordering::Relaxed) < LONG_MIN
            && self.failure().is_none()
            && t0.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop.store(true, Ordering::Relaxed);
        let sides = self.pump.take().expect("pump").join().expect("pump thread");
        let mut problems = Vec::new();
        for s in &sides {
            if let Some(e) = &s.error {
                problems.push(format!("{} side: {e}", s.name()));
            } else if !s.eof {
                problems.push(format!("{} side: no EOF", s.name()));
            }
            if (s.written as usize) < LONG_MIN {
                problems.push(format!(
                    "{} side wrote only {} bytes (want {LONG_MIN})",
                    s.name(),
                    s.written
                ));
            }
        }
        use sha2::Digest;
        let (c, s) = (&sides[0], &sides[1]);
        for (from, to) in [(c, s), (s, c)] {
            let sent = from.write_hash.clone().finalize();
            let got = to.read_hash.clone().finalize();
            if from.written != to.read || sent != got {
                problems.push(format!(
                    "{} sent {} bytes, {} got {} (SHA-256 equal: {})",
                    from.name(),
                    from.written,
                    to.name(),
                    to.read,
                    sent == got
                ));
            }
        }
        eprintln!(
            "long flow: {} bytes up, {} down, {} problems",
            s.read,
            c.read,
            problems.len()
        );
        problems
    }
}

impl Drop for LongFlow {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(p) = self.pump.take() {
            let _ = p.join();
        }
    }
}

/// A reload that must fail: its configuration and what its stderr must name.
struct BadReload {
    name: &'static str,
    cfg: String,
    expect: Vec<String>,
}

fn failed_config(
    dir: &Path,
    fe_long: u16,
    fe_echo: u16,
    long: SocketAddr,
    echo: SocketAddr,
    prom: Option<u16>,
) -> String {
    let prom = prom.map_or(String::new(), |p| {
        format!("    stats prometheus bind 127.0.0.1:{p}\n")
    });
    [
        reload_global(dir, true, &prom),
        tcp_defaults("120s"),
        frontend("fe_long", fe_long, "", "be_long"),
        frontend("fe_echo", fe_echo, "", "be_echo"),
        backend("be_long", long),
        "\n".to_string(),
        backend("be_echo", echo),
    ]
    .concat()
}

#[test]
fn broken_configurations_leave_the_old_process_and_its_kernel_flows_intact() {
    failed_reloads(false);
}

#[test]
fn a_prometheus_port_held_elsewhere_fails_the_reload_and_the_old_process_keeps_serving() {
    failed_reloads(true);
}

/// Start shunt (sockmap mode where BPF is wanted) with a long-lived flow, then
/// attempt the failing reloads: with `prometheus`, the old configuration has an
/// exporter and the one attempt moves it to a port held by another socket;
/// otherwise the attempts are an unknown keyword, a frontend port held by
/// another socket and two unreadable map files, followed by a good reload.
fn failed_reloads(prometheus: bool) {
    let mode = kernel_mode();
    let kernel = mode == "sockmap";
    let echo = Server::echo();
    let backend = TcpListener::bind("127.0.0.1:0").expect("bind the long flow's server");
    let shared = TempDir::new("reload-safety-fail");
    let (fe_long, fe_echo) = (free_port(), free_port());
    let prom_port = prometheus.then(free_port);
    let sock = shared.path().join("admin.sock");
    // Dropped after every process of the test (declared before them).
    let _pins = PinGuard::new(&sock);
    let pidfile = shared.path().join("shunt.pid");
    let cfg = failed_config(
        shared.path(),
        fe_long,
        fe_echo,
        backend.local_addr().expect("addr"),
        echo.addr,
        prom_port,
    );
    // A port another process holds (bound and listening, without SO_REUSEPORT).
    let held = TcpListener::bind("127.0.0.1:0").expect("bind the held port");
    let held_port = held.local_addr().expect("addr").port();
    let echo_addr = SocketAddr::from(([127, 0, 0, 1], fe_echo));

    let mut cases = Vec::new();
    if let Some(p) = prom_port {
        cases.push(BadReload {
            name: "the exporter's port is held by another process",
            cfg: cfg.replace(
                &format!("stats prometheus bind 127.0.0.1:{p}"),
                &format!("stats prometheus bind 127.0.0.1:{held_port}"),
            ),
            expect: vec![format!("127.0.0.1:{held_port}"), "prometheus".into()],
        });
    } else {
        let missing = shared.path().join("no-such-dir/src.map");
        let a_dir = shared.path().join("maps.d");
        std::fs::create_dir_all(&a_dir).expect("create the map directory");
        let map_frontend = |path: &Path| {
            format!(
                "{cfg}\nfrontend fe_map\n    bind 127.0.0.1:{}\n    use_backend %[src,map_ip({})]\n    default_backend be_echo\n",
                free_port(),
                path.display()
            )
        };
        cases.push(BadReload {
            name: "an unknown keyword",
            cfg: format!("{cfg}\nbakend be_typo\n    server s9 127.0.0.1:1\n"),
            expect: vec!["bakend".into()],
        });
        cases.push(BadReload {
            name: "a frontend port held by another process",
            cfg: format!(
                "{cfg}\nfrontend fe_busy\n    bind 127.0.0.1:{held_port}\n    default_backend be_echo\n"
            ),
            expect: vec![format!("127.0.0.1:{held_port}")],
        });
        cases.push(BadReload {
            name: "a map file that does not exist",
            cfg: map_frontend(&missing),
            expect: vec![missing.display().to_string()],
        });
        cases.push(BadReload {
            name: "a map file that is a directory",
            cfg: map_frontend(&a_dir),
            expect: vec![a_dir.display().to_string()],
        });
        // Found at start-up after the stats sockets were inherited: a start
        // that fails then must not remove the predecessor's socket files.
        cases.push(BadReload {
            name: "a user that does not exist",
            cfg: format!("{cfg}\nglobal\n    user shunt-no-such-user\n"),
            expect: vec!["shunt-no-such-user".into()],
        });
    }

    let mut old = Shunt::start(&cfg, &["--forward-mode", mode]);
    let old_pid = old.pid();
    let long = LongFlow::open(SocketAddr::from(([127, 0, 0, 1], fe_long)), &backend);
    long.progressed()
        .unwrap_or_else(|e| panic!("before the reloads: {e}"));
    let in_kernel = |sock: &Path| -> Result<(), String> {
        let sess = try_cli(sock, "show sess")?;
        let src = format!("src={}", long.client_addr);
        match sess.lines().find(|l| l.contains(&src)) {
            Some(l) if l.contains("fwd=sockmap") => Ok(()),
            Some(l) => Err(format!("the long flow is not in the kernel: {l}")),
            None => Err(format!("no session for the long flow in:\n{sess}")),
        }
    };
    if kernel {
        eventually("the long flow in the SOCKHASH", PROGRESS_LIMIT, || {
            in_kernel(&sock).is_ok()
        });
    }

    let mut seed = 0u64;
    for case in &cases {
        let what = case.name;
        let sock_s = sock.display().to_string();
        let pid_s = old_pid.to_string();
        let mut new = Shunt::spawn_with(
            &[],
            &case.cfg,
            &[
                "--forward-mode",
                mode,
                "-x",
                sock_s.as_str(),
                "-sf",
                pid_s.as_str(),
            ],
        );
        let code = new.wait(FAIL_LIMIT);
        let log = plain(&new.stderr());
        drop(new);
        let mut problems = Vec::new();
        match code {
            Some(0) => problems.push("the reload exited 0".to_string()),
            Some(_) => {}
            None => problems.push(format!("the reload was still running after {FAIL_LIMIT:?}")),
        }
        if !log.contains("[ALERT]") {
            problems.push("no [ALERT] on stderr".to_string());
        }
        for e in &case.expect {
            if !log.contains(e.as_str()) {
                problems.push(format!("stderr does not name {e:?}"));
            }
        }
        if !running(&mut old) {
            problems.push(format!("the old process {old_pid} is gone"));
        }
        match info_pid(&sock) {
            Ok(p) if p == old_pid => {}
            Ok(p) => problems.push(format!("the stats socket reaches pid {p}, not {old_pid}")),
            Err(e) => problems.push(format!("the stats socket does not answer: {e}")),
        }
        if pid_in(&pidfile) != old_pid {
            problems.push(format!(
                "the pidfile holds {:?}, not {old_pid}",
                std::fs::read_to_string(&pidfile).ok()
            ));
        }
        for _ in 0..3 {
            seed += 1;
            if let Err(e) = one_exchange(echo_addr, seed) {
                problems.push(format!("a new connection failed: {e}"));
                break;
            }
        }
        if let Some(p) = prom_port {
            if let Err(e) = scrape(p) {
                problems.push(format!("the old exporter does not answer: {e}"));
            }
        }
        if let Err(e) = long.progressed() {
            problems.push(e);
        }
        if kernel && problems.is_empty() {
            if let Err(e) = in_kernel(&sock) {
                problems.push(e);
            }
        }
        assert!(
            problems.is_empty(),
            "reload with {what} ({mode} mode):\n- {}\nthe failed reload's log (exit {code:?}):\n{log}\nthe old process's log:\n{}",
            problems.join("\n- "),
            plain(&old.stderr())
        );
    }

    if !prometheus {
        // A failed attempt leaves nothing behind that breaks the next good
        // reload: the new process takes over, the kernel flow with it.
        let new = start_successor(&cfg, mode, &sock, old_pid).unwrap_or_else(|e| {
            panic!("the good reload after the failed ones did not come up: {e}")
        });
        if kernel {
            let log = plain(&new.stderr());
            let flows: usize = log
                .lines()
                .find(|l| l.contains("took the kernel flows of the old process"))
                .and_then(|l| l.split("flows=").nth(1))
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            assert!(
                flows >= 1,
                "the good reload did not adopt the long kernel flow:\n{log}"
            );
        }
        assert_eq!(
            old.wait(OLD_EXIT),
            Some(0),
            "the old process did not exit after the good reload; its log:\n{}",
            plain(&old.stderr())
        );
        assert_eq!(
            info_pid(&sock),
            Ok(new.pid()),
            "the stats socket must reach the new process"
        );
        for _ in 0..3 {
            seed += 1;
            one_exchange(echo_addr, seed)
                .unwrap_or_else(|e| panic!("a connection after the good reload failed: {e}"));
        }
        long.progressed()
            .unwrap_or_else(|e| panic!("after the good reload: {e}"));
        old = new;
    }

    let problems = long.finish();
    assert!(
        problems.is_empty(),
        "the long flow ({mode} mode):\n{}\nlast process:\n{}",
        problems.join("\n"),
        kernel_diagnostics_at(&old, &sock)
    );
    let info: HashMap<String, String> = show_info(&sock);
    eprintln!(
        "counters at the end: {:?}",
        info.iter()
            .filter(|(k, _)| k.ends_with("Flows") || k.starts_with("Sockmap"))
            .collect::<Vec<_>>()
    );
    if kernel {
        assert_mode(&sock, "sockmap");
    }
}

/// The last process's warnings and kernel counters, read over `sock`.
fn kernel_diagnostics_at(shunt: &Shunt, sock: &Path) -> String {
    let log: Vec<String> = plain(&shunt.stderr())
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .map(str::to_owned)
        .collect();
    let counters = try_cli(sock, "show info")
        .map(|t| {
            t.lines()
                .filter(|l| {
                    let key = l.split(':').next().unwrap_or("");
                    key.starts_with("Sockmap") || key.ends_with("Flows")
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_else(|e| e);
    format!("counters: {counters}; log:\n{}", log.join("\n"))
}
