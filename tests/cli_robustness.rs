//! The stats socket under junk, over a real daemon: [`TOTAL_LINES`] random and malformed
//! lines (binary junk, bad escapes, unterminated payloads, stray `;`, real command words
//! with random arguments) over several connections must not crash shunt nor disturb
//! forwarding: an echo flow opened before keeps echoing during and after, and new flows
//! still connect. An overlong line gets an error and closes only its own connection; a
//! `level user` socket is refused operator/admin commands and cannot raise its level.
//!
//! Junk with real command words goes to the `level user` socket (so it cannot change
//! servers or maps by chance); the admin socket gets junk that cannot form a command
//! (every line starts with a byte no command starts with) and unterminated payloads.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use shunt_tests::*;

/// Junk lines sent in all.
const TOTAL_LINES: usize = 100_000;
/// Connections sharing them (each opens in prompt mode).
const CONNS: usize = 4;
/// Longest junk line (well under the CLI's line bound).
const MAX_JUNK: usize = 200;
/// A line over the CLI's 16 KiB bound.
const OVERLONG: usize = 20 * 1024;
/// Bound on the whole junk phase.
const JUNK_TIMEOUT: Duration = Duration::from_secs(120);

const WORDS: &[&str] = &[
    "show",
    "info",
    "stat",
    "map",
    "add",
    "set",
    "del",
    "clear",
    "get",
    "servers",
    "state",
    "conn",
    "sess",
    "help",
    "server",
    "weight",
    "maxconn",
    "frontend",
    "global",
    "enable",
    "disable",
    "severity-output",
    "typed",
    "#0",
    "#1",
    "#-1",
    "@1",
    "<<",
    ";",
    "\\",
    "\\;",
    "\\\\",
    "\\ ",
    "-1",
    "99999999999999999999",
    "be/s",
    "be",
    "10.0.0.1",
    "::1/200",
    "0x7f",
    "admin",
    "operator",
    "user",
    "counters",
    "all",
    "level",
    "cli",
];

fn junk_line(rng: &mut impl Rng, sock_is_user: bool) -> Vec<u8> {
    let mut l = Vec::new();
    match rng.gen_range(0..4) {
        // Command words with random arguments, escapes and separators.
        0 | 1 if sock_is_user => {
            for _ in 0..rng.gen_range(1..8) {
                l.extend_from_slice(WORDS[rng.gen_range(0..WORDS.len())].as_bytes());
                l.push(if rng.gen_bool(0.8) { b' ' } else { b'\t' });
            }
            if rng.gen_bool(0.2) {
                l.push(b'\\'); // a dangling escape
            }
        }
        // An unterminated payload: its lines follow, the empty line never comes here.
        2 => {
            l.extend_from_slice(if sock_is_user {
                b"add map #0 <<"
            } else {
                b"\x01add map #0 <<"
            });
        }
        // Binary junk (no newline: the framing adds one).
        _ => {
            l.push(0x80 | rng.gen::<u8>());
            for _ in 0..rng.gen_range(0..MAX_JUNK) {
                let b: u8 = rng.gen();
                if b != b'\n' {
                    l.push(b);
                }
            }
        }
    }
    if !sock_is_user && l.first().is_some_and(u8::is_ascii_alphabetic) {
        l.insert(0, 0x01);
    }
    l.push(b'\n');
    l
}

/// Send `lines` junk lines on one prompt-mode connection while reading its answers.
/// Returns the bytes answered.
fn junk_conn(sock: PathBuf, lines: usize, seed: u64, user: bool) -> usize {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut buf = b"prompt\n".to_vec();
    for _ in 0..lines {
        buf.extend_from_slice(&junk_line(&mut rng, user));
    }
    let mut c = UnixStream::connect(&sock).expect("connect stats socket");
    c.set_read_timeout(Some(JUNK_TIMEOUT)).expect("timeout");
    let mut w = c.try_clone().expect("clone");
    let writer = std::thread::spawn(move || {
        // The server may close on a payload that grew too big; that is fine.
        let _ = w.write_all(&buf);
        let _ = w.shutdown(std::net::Shutdown::Write);
    });
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    writer.join().expect("writer");
    out.len()
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks the pid; no memory involved.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Round-trip `msg` on an open flow.
fn echo_round(s: &mut TcpStream, msg: &[u8]) {
    s.write_all(msg).expect("write on the flow");
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).expect("echo on the flow");
    assert_eq!(back, msg);
}

fn new_flow_echoes(addr: SocketAddr) {
    let mut s = connect(addr);
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    echo_round(&mut s, b"fresh flow");
}

fn cfg(port: u16, echo: SocketAddr) -> String {
    format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n    stats socket @DIR@/user.sock level user\n    stats maxconn 20\n\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 60s\n    timeout server 60s\n\n\
         frontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n\nbackend be\n    server s {echo}\n"
    )
}

fn user_sock(shunt: &Shunt) -> PathBuf {
    shunt.dir().join("user.sock")
}

#[test]
fn junk_never_crashes_shunt_nor_disturbs_forwarding() {
    let echo = Server::echo();
    let port = free_port();
    let shunt = Shunt::start(&cfg(port, echo.addr), &["--forward-mode", "copy"]);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let admin = shunt.sock();
    let user = user_sock(&shunt);

    let mut flow = connect(addr);
    flow.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    echo_round(&mut flow, b"before");

    // Forwarding is exercised all through the junk phase.
    let done = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let prober = {
        let (done, rounds) = (done.clone(), rounds.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !done.load(Ordering::Relaxed) {
                echo_round(&mut flow, format!("during {i}").as_bytes());
                if i.is_multiple_of(10) {
                    new_flow_echoes(addr);
                }
                i += 1;
                rounds.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
            flow
        })
    };

    let t0 = Instant::now();
    let per_conn = TOTAL_LINES / CONNS;
    let workers: Vec<_> = (0..CONNS)
        .map(|i| {
            let is_user = i % 2 == 0;
            let sock = if is_user { user.clone() } else { admin.clone() };
            std::thread::spawn(move || junk_conn(sock, per_conn, 0x5eed + i as u64, is_user))
        })
        .collect();
    let answered: Vec<usize> = workers
        .into_iter()
        .map(|w| w.join().expect("junk connection"))
        .collect();
    assert!(t0.elapsed() < JUNK_TIMEOUT, "junk phase too slow");
    done.store(true, Ordering::Relaxed);
    let mut flow = prober.join().expect("forwarding failed during the junk");
    assert!(rounds.load(Ordering::Relaxed) > 0, "no probe ran");
    for (i, n) in answered.iter().enumerate() {
        assert!(*n > per_conn, "connection {i} answered only {n} bytes");
    }

    assert!(
        alive(shunt.pid()),
        "shunt died; stderr:\n{}",
        shunt.stderr()
    );
    echo_round(&mut flow, b"after");
    new_flow_echoes(addr);
    // The CLI still answers, and the user-level junk changed no map or server.
    assert!(cli(&admin, "show info").contains("Name: "));
    assert_eq!(cli(&user, "show cli level"), "user\n\n");
    drop(echo);
}

#[test]
fn overlong_line_errors_and_closes_only_its_connection() {
    let echo = Server::echo();
    let port = free_port();
    let shunt = Shunt::start(&cfg(port, echo.addr), &["--forward-mode", "copy"]);
    let admin = shunt.sock();

    // A bystander connection in prompt mode, opened first.
    let mut by = UnixStream::connect(&admin).expect("connect");
    by.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    by.write_all(b"prompt\n").expect("prompt");
    let mut b = [0u8; 3];
    by.read_exact(&mut b).expect("prompt answer");
    assert_eq!(&b, b"\n> ");

    for _ in 0..5 {
        let mut c = UnixStream::connect(&admin).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut line = b"prompt\nshow ".to_vec();
        line.extend(std::iter::repeat_n(b'x', OVERLONG));
        line.extend_from_slice(b"\nshow cli level\n");
        // The server may stop reading at the bound; a failed write is fine.
        let _ = c.write_all(&line);
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out); // returns at EOF: the connection was closed
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("Line too long"), "no error: {text:?}");
        assert!(
            !text.contains("admin\n"),
            "ran a command after the overlong line"
        );
    }

    // The bystander is still served, on the same connection.
    by.write_all(b"show cli level\n").expect("write");
    let mut want = b"admin\n\n> ".to_vec();
    let mut got = vec![0u8; want.len()];
    by.read_exact(&mut got).expect("bystander answer");
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&want)
    );
    want.clear();
    assert!(alive(shunt.pid()));
    new_flow_echoes(SocketAddr::from(([127, 0, 0, 1], port)));
}

#[test]
fn user_level_socket_cannot_run_operator_or_admin_commands() {
    let echo = Server::echo();
    let port = free_port();
    let dir = TempDir::new("cli-robust");
    let map = dir.path().join("m.map");
    std::fs::write(&map, "127.0.0.2 be\n").expect("map");
    let cfg = cfg(port, echo.addr).replace(
        "    default_backend be\n",
        &format!(
            "    use_backend %[src,map_ip({})]\n    default_backend be\n",
            map.display()
        ),
    );
    let shunt = Shunt::start(&cfg, &["--forward-mode", "copy"]);
    let user = user_sock(&shunt);
    let admin = shunt.sock();
    let denied = "Permission denied\n\n";
    assert_eq!(cli(&user, "show cli level"), "user\n\n");
    for cmd in [
        "add map #0 10.0.0.1 be",
        "set map #0 127.0.0.2 x",
        "del map #0 127.0.0.2",
        "clear map #0",
    ] {
        assert_eq!(cli(&user, cmd), denied, "{cmd}");
    }
    // Raising the level is refused (as denied, or as unknown at this level), and the
    // operator command after it on the same line is still refused.
    for raise in ["operator", "admin"] {
        let out = cli(
            &user,
            &format!("{raise}; add map #0 10.0.0.9 be; show cli level"),
        );
        let refused = out
            .strip_suffix(&format!("{denied}user\n\n"))
            .unwrap_or_else(|| panic!("{raise}: {out:?}"));
        assert!(
            refused == denied || refused.starts_with("Unknown command"),
            "{raise}: {out:?}"
        );
    }
    // Nothing changed.
    let shown = cli(&admin, "show map #0");
    assert_eq!(shown.lines().count(), 2, "{shown:?}");
    assert!(shown.contains(" 127.0.0.2 be\n"), "{shown:?}");
    // The admin socket can, so the refusals above are about the level.
    assert_eq!(cli(&admin, "add map #0 10.0.0.1 be"), "\n");
}
