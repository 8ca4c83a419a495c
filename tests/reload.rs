//! Seamless reloads through the real binary: `shunt -x SOCK -sf PID` takes the
//! listening sockets of the running shunt over its stats socket (`expose-fd
//! listeners`), then soft-stops it. Under a steady loop of connections, each
//! exchanging data, ten reloads in a row must neither refuse nor reset one, the
//! old process must finish its open flow before it exits, and the stats socket
//! and the pidfile (same paths for every generation) must end up the newest
//! process's.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shunt_tests::*;

/// Reloads in the run (the acceptance number).
const RELOADS: usize = 10;
/// Bytes each connection of the loop sends and reads back.
const MSG_LEN: usize = 4096;
/// Client threads running the connection loop.
const CLIENTS: usize = 2;
/// Upper bound on the whole loop, whatever happens.
const LOOP_LIMIT: Duration = Duration::from_secs(180);
/// How long an old process may take to exit after the reload.
const OLD_EXIT: Duration = Duration::from_secs(15);

fn config(dir: &std::path::Path, port: u16, server: SocketAddr, expose: bool) -> String {
    let expose = if expose { " expose-fd listeners" } else { "" };
    format!(
        "global\n    nbthread 2\n    pidfile {d}/shunt.pid\n    stats socket {d}/admin.sock level admin{expose}\n\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n\n\
         backend be\n    server s1 {server}\n",
        d = dir.display()
    )
}

#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    refused: AtomicUsize,
    reset: AtomicUsize,
    other: AtomicUsize,
}

/// One connection of the loop: send MSG_LEN bytes, read them back, close cleanly.
fn one_exchange(addr: SocketAddr, seed: u64) -> std::io::Result<()> {
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    c.set_write_timeout(Some(Duration::from_secs(10)))?;
    let msg = pattern(MSG_LEN, seed);
    c.write_all(&msg)?;
    let mut back = vec![0u8; MSG_LEN];
    c.read_exact(&mut back)?;
    if back != msg {
        return Err(std::io::Error::other("echo differs"));
    }
    c.shutdown(Shutdown::Write)?;
    let mut rest = Vec::new();
    c.read_to_end(&mut rest)?;
    if !rest.is_empty() {
        return Err(std::io::Error::other("bytes after the echo"));
    }
    Ok(())
}

fn client_loop(addr: SocketAddr, id: u64, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let t0 = Instant::now();
    let mut seed = id << 32;
    while !stop.load(Ordering::Relaxed) && t0.elapsed() < LOOP_LIMIT {
        seed += 1;
        match one_exchange(addr, seed) {
            Ok(()) => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                let slot = match e.kind() {
                    ErrorKind::ConnectionRefused => &tally.refused,
                    ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => &tally.reset,
                    _ => &tally.other,
                };
                slot.fetch_add(1, Ordering::Relaxed);
                eprintln!("connection {seed:#x} failed: {e}");
            }
        }
        // Steady, not a flood: the machine has 2 cores shared with others.
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The log without its ANSI colour sequences.
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn pid_in(path: &std::path::Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0)
}

#[test]
fn ten_reloads_under_a_connection_loop_refuse_and_reset_nothing() {
    let server = Server::echo();
    let shared = TempDir::new("reload");
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let cfg = config(shared.path(), port, server.addr, true);
    let sock = shared.path().join("admin.sock");
    let pidfile = shared.path().join("shunt.pid");
    let args = ["--forward-mode", "copy"];

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
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (st, ta) = (stop.clone(), tally.clone());
            std::thread::spawn(move || client_loop(addr, i as u64 + 1, st, ta))
        })
        .collect();

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
                && log.contains("sockets=2"),
            "reload {round}: the new process did not take both listening sockets:\n{log}"
        );
        if round == 1 {
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
        assert_eq!(
            old.wait(OLD_EXIT),
            Some(0),
            "reload {round}: old process did not exit cleanly; its log:\n{}",
            old.stderr()
        );
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
    let (ok, refused, reset, other) = (
        tally.ok.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
        tally.reset.load(Ordering::Relaxed),
        tally.other.load(Ordering::Relaxed),
    );
    eprintln!("{RELOADS} reloads: {ok} connections ok, {refused} refused, {reset} reset, {other} other failures");
    assert!(ok >= 5 * (RELOADS + 1), "too few connections ran: {ok}");
    assert_eq!(
        (refused, reset, other),
        (0, 0, 0),
        "connections failed during reloads"
    );
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

/// The capabilities the README's "Capabilities" section names as needed at start.
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
