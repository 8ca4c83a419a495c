//! Seamless reloads through the real binary: `shunt -x SOCK -sf PID` takes the
//! listening sockets of the running shunt over its stats socket (`expose-fd
//! listeners`), then soft-stops it. Under a steady loop of connections, each
//! exchanging data, ten reloads in a row must neither refuse nor reset one, the
//! old process must finish its open flow before it exits, and the stats socket
//! and the pidfile (same paths for every generation) must end up the newest
//! process's.
//!
//! In sockmap mode (root or `SHUNT_REQUIRE_BPF=1`): a hundred long-lived
//! kernel-forwarded flows, each side writing a known stream at a modest rate
//! and checking every byte it reads, keep transferring across ten reloads;
//! each new process adopts them from the old one (`_getflows`), the old one
//! exits at once, and at the end both directions of every flow match
//! byte for byte (SHA-256) with no reset.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shunt_tests::reload::*;
use shunt_tests::*;

/// Reloads in the run (the acceptance number).
const RELOADS: usize = 10;
/// Client threads running the connection loop.
const CLIENTS: usize = 2;
/// Upper bound on the whole loop, whatever happens.
const LOOP_LIMIT: Duration = Duration::from_secs(180);
/// How long an old process may take to exit after the reload.
const OLD_EXIT: Duration = Duration::from_secs(15);

fn config(dir: &std::path::Path, port: u16, server: SocketAddr, expose: bool) -> String {
    [
        reload_global(dir, expose, ""),
        tcp_defaults("30s"),
        frontend("fe", port, "", "be"),
        backend("be", server),
    ]
    .concat()
}

#[test]
fn ten_reloads_under_a_connection_loop_refuse_and_reset_nothing() {
    reload_loop("copy");
}

#[test]
fn ten_reloads_under_a_connection_loop_in_sockmap_mode_refuse_and_reset_nothing() {
    if bpf_wanted() {
        reload_loop("sockmap");
    }
}

/// Ten reloads under the connection loop, forwarding in `mode`.
fn reload_loop(mode: &str) {
    let server = Server::echo();
    let shared = TempDir::new("reload");
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let cfg = config(shared.path(), port, server.addr, true);
    let sock = shared.path().join("admin.sock");
    let pidfile = shared.path().join("shunt.pid");
    let args = ["--forward-mode", mode];

    let mut old = Shunt::start(&cfg, &args);
    assert_eq!(pid_in(&pidfile), old.pid());

    // A flow opened on the first process: it must outlive that process's soft stop.
    let mut long = connect(addr);
    long.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    long.write_all(b"before").expect("send");
    let mut b = [0u8; 6];
    long.read_exact(&mut b).expect("echo before");

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let clients = spawn_clients(addr, CLIENTS, &stop, &tally, LOOP_LIMIT);

    for round in 1..=RELOADS {
        // Wait until the loop is demonstrably running against the current process.
        let before = tally.ok.load(Ordering::Relaxed);
        let t0 = Instant::now();
        while tally.ok.load(Ordering::Relaxed) < before + 5 {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the connection loop made no progress before reload {round}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let old_pid = old.pid().to_string();
        let sock_s = sock.display().to_string();
        let new = Shunt::start(
            &cfg,
            &[
                args[0],
                args[1],
                "-x",
                sock_s.as_str(),
                "-sf",
                old_pid.as_str(),
            ],
        );
        let log = plain(&new.stderr());
        assert!(
            log.contains("took the listening sockets of the old process")
                && log.contains("sockets=3"),
            "reload {round}: the new process did not take both listening sockets and the stats socket:\n{log}"
        );
        if round == 1 && mode == "sockmap" {
            // A kernel flow is handed to the new process: the old one exits
            // at once and the flow goes on.
            assert_eq!(
                old.wait(OLD_EXIT),
                Some(0),
                "the old process kept running; its log:\n{}",
                old.stderr()
            );
            long.write_all(b"during").expect("send on the adopted flow");
            long.read_exact(&mut b).expect("echo after the hand-over");
            assert_eq!(&b, b"during");
            long.shutdown(Shutdown::Write).expect("shutdown");
            let mut rest = Vec::new();
            long.read_to_end(&mut rest).expect("eof");
        } else if round == 1 {
            // The old process is soft-stopping: its open flow still works, and
            // the process waits for it.
            std::thread::sleep(Duration::from_millis(200));
            long.write_all(b"during")
                .expect("send on the old process's flow");
            long.read_exact(&mut b).expect("echo during soft stop");
            assert_eq!(&b, b"during");
            assert_eq!(
                old.wait(Duration::from_millis(300)),
                None,
                "old process left its flow"
            );
            long.shutdown(Shutdown::Write).expect("shutdown");
            let mut rest = Vec::new();
            long.read_to_end(&mut rest).expect("eof");
        }
        if !(round == 1 && mode == "sockmap") {
            assert_eq!(
                old.wait(OLD_EXIT),
                Some(0),
                "reload {round}: old process did not exit cleanly; its log:\n{}",
                old.stderr()
            );
        }
        // The successor owns the shared paths now.
        assert_eq!(pid_in(&pidfile), new.pid(), "reload {round}: pidfile");
        assert_eq!(
            show_info(&sock).get("Pid").map(String::as_str),
            Some(new.pid().to_string().as_str()),
            "reload {round}: the stats socket must reach the new process"
        );
        old = new;
    }
    // Let the loop run against the last process too, then stop it.
    let before = tally.ok.load(Ordering::Relaxed);
    let t0 = Instant::now();
    while tally.ok.load(Ordering::Relaxed) < before + 5 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("client thread");
    }
    let (ok, refused, reset, corrupted, other) = tally.counts();
    // Wrong bytes back are one more kind of other failure here.
    let other = other + corrupted;
    eprintln!("{RELOADS} reloads: {ok} connections ok, {refused} refused, {reset} reset, {other} other failures");
    assert!(ok >= 5 * (RELOADS + 1), "too few connections ran: {ok}");
    assert_eq!(
        (refused, reset, other),
        (0, 0, 0),
        "connections failed during reloads"
    );
}

/// Long-lived kernel flows in the reload test.
const LONG_FLOWS: usize = 100;
/// Bytes per second each side of each long-lived flow writes.
const LONG_RATE: usize = 64 * 1024;
/// Period of the long-lived flows' event loop.
const LONG_TICK: Duration = Duration::from_millis(20);
/// Most bytes one side writes in one round of the pump (a quarter second's worth).
const LONG_BURST: u64 = LONG_RATE as u64 / 4;
/// Bound on each wait for the long-lived flows to make progress.
const PROGRESS_LIMIT: Duration = Duration::from_secs(20);
/// How the pump drives the long-lived flows.
const PACE: Pace = Pace {
    rate: LONG_RATE,
    burst: LONG_BURST,
    tick: LONG_TICK,
    limit: LOOP_LIMIT,
    drain_limit: PROGRESS_LIMIT,
};

/// The test's shared view of the long-lived flows' progress.
#[derive(Default)]
struct LongProgress {
    /// Least bytes read by any side so far.
    min_read: AtomicUsize,
    /// The side that read least: flow id * 2 + (1 when it is the server side).
    slowest: AtomicUsize,
    /// What the slowest side has written so far.
    slowest_written: AtomicUsize,
    failures: AtomicUsize,
}

fn long_flows_config(dir: &std::path::Path, port: u16, server: SocketAddr) -> String {
    [
        reload_global(dir, true, ""),
        tcp_defaults("120s"),
        frontend("fe", port, "", "be"),
        backend("be", server),
    ]
    .concat()
}

#[test]
fn long_kernel_flows_survive_ten_reloads_byte_exact() {
    use sha2::Digest;
    // The hand-over needs the maps pinned: the BPF filesystem at /sys/fs/bpf.
    if !kernel_handover_wanted() {
        return;
    }
    // Deep: a burst of LONG_FLOWS connects must not overflow the accept queue.
    let listener = listen_deep("127.0.0.1:0".parse().expect("addr")).expect("bind backend");
    let backend = listener.local_addr().expect("addr");
    let shared = TempDir::new("reload-kernel");
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let cfg = long_flows_config(shared.path(), port, backend);
    let sock = shared.path().join("admin.sock");
    let args = ["--forward-mode", "sockmap"];
    let mut old = Shunt::start(&cfg, &args);

    // Open the flows: each client announces its id in 8 bytes, which the
    // backend reads before the streams start.
    let mut sides = Vec::with_capacity(2 * LONG_FLOWS);
    listener.set_nonblocking(false).expect("blocking listener");
    for id in 0..LONG_FLOWS as u64 {
        let mut c = connect(addr);
        c.write_all(&id.to_ne_bytes()).expect("send id");
        let (mut s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut got = [0u8; 8];
        s.read_exact(&mut got).expect("read id");
        assert_eq!(u64::from_ne_bytes(got), id, "flows paired in order");
        sides.push(Side::new(c, id, true));
        sides.push(Side::new(s, id, false));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(LongProgress::default());
    let (st, pr) = (stop.clone(), progress.clone());
    let pump = std::thread::spawn(move || {
        pump_sides(sides, PACE, &st, |sides| {
            if let Some(slow) = sides.iter().min_by_key(|s| s.read) {
                pr.slowest.store(
                    slow.id as usize * 2 + usize::from(!slow.writes_to_server),
                    Ordering::Relaxed,
                );
                pr.slowest_written
                    .store(slow.written as usize, Ordering::Relaxed);
                pr.min_read.store(slow.read as usize, Ordering::Relaxed);
            }
            pr.failures.store(
                sides.iter().filter(|s| s.error.is_some() || s.eof).count(),
                Ordering::Relaxed,
            );
        })
    });

    let wait_progress = |what: &str| {
        let from = progress.min_read.load(Ordering::Relaxed);
        let t0 = Instant::now();
        while progress.min_read.load(Ordering::Relaxed) < from + LONG_RATE / 4 {
            assert_eq!(
                progress.failures.load(Ordering::Relaxed),
                0,
                "{what}: a long-lived flow failed"
            );
            assert!(
                t0.elapsed() < PROGRESS_LIMIT,
                "{what}: some long-lived flow stopped transferring (min read {} bytes, by side {} of flow {}, which wrote {}); kernel counters:\n{}",
                progress.min_read.load(Ordering::Relaxed),
                if progress.slowest.load(Ordering::Relaxed) % 2 == 1 { "server" } else { "client" },
                progress.slowest.load(Ordering::Relaxed) / 2,
                progress.slowest_written.load(Ordering::Relaxed),
                cli(&sock, "show info")
                    .lines()
                    .filter(|l| l.starts_with("Sockmap"))
                    .collect::<Vec<_>>()
                    .join("\n")

            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_progress("before the reloads");
    for round in 1..=RELOADS {
        let new = reload_over(&old, &cfg, &sock, &args);
        let log = plain(&new.stderr());
        assert!(
            log.contains("took the kernel flows of the old process")
                && log.contains(&format!("flows={LONG_FLOWS}")),
            "reload {round}: the new process did not adopt the {LONG_FLOWS} flows:\n{log}\nold:\n{}",
            plain(&old.stderr())
        );
        // The old process keeps nothing: it exits at once.
        assert_eq!(
            old.wait(Duration::from_secs(5)),
            Some(0),
            "reload {round}: the old process did not exit promptly; its log:\n{}",
            plain(&old.stderr())
        );
        wait_progress(&format!(
            "after reload {round} (new process's log:\n{}\nold process's log:\n{})",
            plain(&new.stderr()),
            plain(&old.stderr())
        ));
        old = new;
    }
    stop.store(true, Ordering::Relaxed);
    let sides = pump.join().expect("pump thread");
    let mut problems = Vec::new();
    for pair in sides.chunks(2) {
        let (c, s) = (&pair[0], &pair[1]);
        for side in [c, s] {
            if let Some(e) = &side.error {
                problems.push(format!(
                    "flow {} ({}): {e}",
                    side.id,
                    if side.writes_to_server {
                        "client"
                    } else {
                        "server"
                    }
                ));
            } else if !side.eof {
                problems.push(format!("flow {}: no EOF", side.id));
            }
        }
        let up = (
            c.written,
            c.write_hash.clone().finalize(),
            s.read,
            s.read_hash.clone().finalize(),
        );
        let down = (
            s.written,
            s.write_hash.clone().finalize(),
            c.read,
            c.read_hash.clone().finalize(),
        );
        if up.0 != up.2 || up.1 != up.3 {
            problems.push(format!(
                "flow {}: client sent {} bytes, server got {} (SHA-256 equal: {})",
                c.id,
                up.0,
                up.2,
                up.1 == up.3
            ));
        }
        if down.0 != down.2 || down.1 != down.3 {
            problems.push(format!(
                "flow {}: server sent {} bytes, client got {} (SHA-256 equal: {})",
                c.id,
                down.0,
                down.2,
                down.1 == down.3
            ));
        }
    }
    let total: u64 = sides.iter().map(|s| s.read).sum();
    eprintln!(
        "{LONG_FLOWS} kernel flows across {RELOADS} reloads: {total} bytes checked, {} problems",
        problems.len()
    );
    assert!(
        problems.is_empty(),
        "long-lived flows:\n{}\nlast process:\n{}",
        problems.join("\n"),
        plain(&old.stderr())
    );
    let t0 = Instant::now();
    while show_info(&sock).get("CurrConns").map(String::as_str) != Some("0") {
        assert!(
            t0.elapsed() < PROGRESS_LIMIT,
            "flows still open in the last process"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_socket_without_expose_fd_hands_nothing_over() {
    let server = Server::echo();
    let shared = TempDir::new("reload-noexpose");
    let port = free_port();
    let cfg = config(shared.path(), port, server.addr, false);
    let old = Shunt::start(&cfg, &["--forward-mode", "copy"]);
    let other = TempDir::new("reload-noexpose-new");
    let cfg2 = config(other.path(), free_port(), server.addr, false);
    let sock = shared.path().join("admin.sock").display().to_string();
    let pid = old.pid().to_string();
    let mut new = Shunt::spawn_with(&[], &cfg2, &["-x", sock.as_str(), "-sf", pid.as_str()]);
    assert_eq!(
        new.wait(Duration::from_secs(10)),
        Some(1),
        "must refuse to start"
    );
    assert!(
        new.stderr().contains(
            "no answer to _getsocks (is the socket configured with 'expose-fd listeners'?)"
        ),
        "{}",
        new.stderr()
    );
    // The old process was not told to stop and still serves.
    let mut c = connect(SocketAddr::from(([127, 0, 0, 1], port)));
    c.write_all(b"x").expect("send");
    let mut b = [0u8; 1];
    c.read_exact(&mut b).expect("old process still serves");
}

/// The capabilities the README's "Deployment and capabilities" section names as needed at start.
const README_CAPS: [&str; 6] = [
    "CAP_BPF",
    "CAP_NET_ADMIN",
    "CAP_NET_BIND_SERVICE",
    "CAP_SETUID",
    "CAP_SETGID",
    "CAP_SETPCAP",
];

#[test]
fn the_systemd_unit_verifies_and_bounds_capabilities_to_the_readme_s() {
    let unit_path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/shunt.service");
    let unit = std::fs::read_to_string(&unit_path).expect("examples/shunt.service");
    let bounding: Vec<&str> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("a CapabilityBoundingSet= line")
        .split_whitespace()
        .collect();
    let mut want = README_CAPS.to_vec();
    want.sort_unstable();
    let mut got = bounding.clone();
    got.sort_unstable();
    assert_eq!(
        got, want,
        "bounding set differs from the README's capabilities"
    );
    assert!(unit.contains("\nType=notify\n"), "Type=notify");
    assert!(unit.contains("\nExecReload="), "ExecReload");
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"),
    )
    .expect("README.md");
    for cap in README_CAPS {
        assert!(
            readme.contains(&format!("| {cap}")) || readme.contains(&format!("{cap},")),
            "README names {cap}"
        );
    }

    let Ok(out) = std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
    else {
        eprintln!("!!!!! SKIPPED systemd-analyze verify: systemd-analyze is not installed");
        return;
    };
    assert!(out.status.success(), "systemd-analyze --version failed");
    // The unit names /usr/local/sbin/shunt; verify needs an executable there.
    let dir = TempDir::new("unit");
    let local = dir.path().join("shunt.service");
    let bin = shunt_bin().display().to_string();
    std::fs::write(&local, unit.replace("/usr/local/sbin/shunt", &bin)).expect("write unit");
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&local)
        .output()
        .expect("run systemd-analyze verify");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{stderr}"
    );
    // Unknown keys are only warnings: any line about our unit is a defect.
    let about_unit: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("shunt.service"))
        .collect();
    assert!(
        about_unit.is_empty(),
        "systemd-analyze verify complains:\n{}",
        about_unit.join("\n")
    );
}

/// A kernel flow whose client sent a PROXY header (`accept-proxy`), handed
/// over: the header was read by the first process and never forwarded, and the
/// successor's count check at EOF (what TCP received against what went
/// through the verdict) must still agree.
#[test]
fn a_kernel_flow_behind_a_proxy_header_is_handed_over_with_agreeing_counts() {
    if !kernel_handover_wanted() {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind backend");
    let server = listener.local_addr().expect("addr");
    let shared = TempDir::new("reload-proxy-header");
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let cfg = [
        reload_global(shared.path(), true, ""),
        tcp_defaults("30s"),
        format!("frontend fe\n    bind 127.0.0.1:{port} accept-proxy\n    default_backend be\n\n"),
        backend("be", server),
    ]
    .concat();
    let sock = shared.path().join("admin.sock");
    let mut old = Shunt::start(&cfg, &["--forward-mode", "sockmap"]);
    let mut c = connect(addr);
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    c.write_all(b"PROXY TCP4 192.0.2.1 192.0.2.2 40000 80\r\nhello")
        .expect("send");
    let (mut s, _) = listener.accept().expect("accept");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let turn = |from: &mut std::net::TcpStream, to: &mut std::net::TcpStream, what: &[u8]| {
        from.write_all(what).expect("write");
        let mut got = vec![0u8; what.len()];
        to.read_exact(&mut got).expect("read");
        assert_eq!(got, what, "bytes through the flow");
    };
    let mut got = [0u8; 5];
    s.read_exact(&mut got).expect("first bytes");
    assert_eq!(&got, b"hello", "the PROXY header is not forwarded");
    turn(&mut s, &mut c, b"world");

    let new = reload_over(&old, &cfg, &sock, &["--forward-mode", "sockmap"]);
    let log = plain(&new.stderr());
    assert!(
        log.contains("took the kernel flows of the old process") && log.contains("flows=1"),
        "the new process did not adopt the flow:\n{log}\nold:\n{}",
        plain(&old.stderr())
    );
    assert_eq!(old.wait(Duration::from_secs(5)), Some(0), "old process");

    turn(&mut c, &mut s, b"again");
    turn(&mut s, &mut c, b"back!");
    c.shutdown(Shutdown::Write).expect("client FIN");
    assert_eq!(s.read(&mut got).expect("server reads EOF"), 0);
    s.shutdown(Shutdown::Write).expect("server FIN");
    assert_eq!(c.read(&mut got).expect("client reads EOF"), 0);
    let t0 = Instant::now();
    while show_info(&sock).get("CurrConns").map(String::as_str) != Some("0") {
        assert!(t0.elapsed() < PROGRESS_LIMIT, "the flow is still open");
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = plain(&new.stderr());
    assert!(
        !log.contains("sockmap byte counts disagree"),
        "the adopted flow's counts disagreed at EOF:\n{log}"
    );
}
