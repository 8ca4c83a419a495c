//! Configurations users have run unmodified with HAProxy (issue 15): Debian's
//! stock `haproxy.cfg` with a TCP `listen` section appended is accepted by
//! `shunt -c` with one warning per TLS or HTTP keyword that does not apply,
//! and it runs: chrooted, as its user, forwarding, its stats socket
//! answering and its traffic log reaching a UNIX datagram socket outside the
//! chroot. Each sample configuration of tests/testdata/compat/ gets the
//! verdict `haproxy -c` gives it, or the one shunt documents where they part.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use shunt_tests::*;

/// The Debian file with its `listen` section, as shipped in testdata.
const DEBIAN: &str = "testdata/compat/debian-tcp.cfg";
/// How long a traffic log line may take to arrive.
const LOG_WAIT: Duration = Duration::from_secs(5);

/// The `parsing [file:line] : ...` messages of a checker's output, prefixes cut.
fn parsing_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.find("parsing [").map(|i| l[i..].to_string()))
        .collect()
}

/// `haproxy -c -f cfg`: exit code and output, `None` without the binary.
fn haproxy_check(cfg: &Path) -> Option<(i32, String)> {
    let out = Command::new("haproxy")
        .arg("-c")
        .arg("-f")
        .arg(cfg)
        .output()
        .ok()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Some((out.status.code().unwrap_or(-1), text))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// True when a test that needs root can run; otherwise a loud skip, or a
/// failure under `SHUNT_REQUIRE_BPF=1` (CI runs as root with it set).
fn can_run_as_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    let required = std::env::var("SHUNT_REQUIRE_BPF").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "{test} needs root (chroot, setuid) and SHUNT_REQUIRE_BPF=1 requires it to run"
    );
    eprintln!("\n!!!!! SKIPPED {test}: needs root (chroot, setuid)\n");
    false
}

#[test]
fn debian_stock_config_is_accepted_with_a_warning_per_keyword_that_does_not_apply() {
    let (code, _, err) = check_config(&[Path::new(DEBIAN)]);
    assert_eq!(code, 0, "shunt -c -f {DEBIAN}:\n{err}");
    assert!(!err.contains("[ALERT]"), "no alert: {err}");
    let ours = parsing_lines(&err);
    let at = |line: usize, kw: &str, what: &str| {
        format!("parsing [{DEBIAN}:{line}] : '{kw}' ignored: shunt does not {what}.")
    };
    let openssl = |line: usize, kw: &str| {
        format!("parsing [{DEBIAN}:{line}] : '{kw}' ignored: shunt does not take OpenSSL settings (rustls picks its own).")
    };
    let mut want = vec![
        format!("parsing [{DEBIAN}:11] : 'daemon' ignored: shunt always runs in the foreground."),
        openssl(18, "ssl-default-bind-ciphers"),
        openssl(19, "ssl-default-bind-ciphersuites"),
        openssl(20, "ssl-default-bind-options"),
        at(
            24,
            "mode http",
            "speak HTTP; a proxy that inherits it without 'mode tcp' is refused",
        ),
    ];
    want.extend((30..=36).map(|l| at(l, "errorfile", "speak HTTP")));
    // HAProxy's own warning, word for word (it gives the same one).
    let fallback = format!("parsing [{DEBIAN}:25] : 'option httplog' not usable with proxy 'tcp_in' (needs 'mode http'). Falling back to 'option tcplog'.");
    want.push(fallback.clone());
    // The bases apply to TLS paths; the Debian file has none for them.
    want.push(format!(
        "parsing [{DEBIAN}:15] : 'crt-base' ignored: no 'bind ... crt' path uses it."
    ));
    want.push(format!(
        "parsing [{DEBIAN}:14] : 'ca-base' ignored: no 'server ... ca-file' path uses it."
    ));
    assert_eq!(ours, want);
    match haproxy_check(Path::new(DEBIAN)) {
        None => eprintln!("SKIP the HAProxy half: no haproxy binary (apt-get install haproxy); shunt's verdict is still checked"),
        Some((hcode, text)) => {
            assert_eq!(hcode, 0, "haproxy -c -f {DEBIAN}:\n{text}");
            assert_eq!(parsing_lines(&text), [fallback], "HAProxy's warnings: {text}");
        }
    }
}

#[test]
fn sample_configs_get_haproxys_verdict_or_the_documented_one() {
    // (file, shunt accepts, HAProxy accepts)
    let cases = [
        (DEBIAN, true, true),
        // A backend left in the defaults' `mode http`: HAProxy runs it as
        // HTTP, shunt refuses it at its header.
        ("testdata/compat/http-inherited.cfg", false, true),
        ("testdata/compat/unknown-backend.cfg", false, false),
    ];
    let haproxy = Command::new("haproxy").arg("-v").output().is_ok();
    if !haproxy {
        eprintln!("SKIP the HAProxy half of sample_configs_get_haproxys_verdict_or_the_documented_one: no haproxy binary (apt-get install haproxy); shunt's verdicts are still checked");
    }
    for (file, ours_ok, theirs_ok) in cases {
        let path = Path::new(file);
        let (code, _, err) = check_config(&[path]);
        assert_eq!(code == 0, ours_ok, "shunt -c -f {file}: {err}");
        assert!(
            ours_ok || !parsing_lines(&err).is_empty(),
            "{file}: no located error: {err}"
        );
        if haproxy {
            let (hcode, text) = haproxy_check(path).expect("run haproxy -c");
            assert_eq!(hcode == 0, theirs_ok, "haproxy -c -f {file}: {text}");
        }
    }
}

#[test]
fn debian_stock_config_runs_chrooted_forwards_answers_and_logs() {
    if !can_run_as_root("debian_stock_config_runs_chrooted_forwards_answers_and_logs") {
        return;
    }
    let server = Server::echo();
    let port = free_port();
    let jail = TempDir::new("jail");
    let outside = TempDir::new("syslog");
    let log_path = outside.path().join("log.sock");
    let syslog = UnixDatagram::bind(&log_path).expect("bind the syslog socket");
    syslog
        .set_read_timeout(Some(LOG_WAIT))
        .expect("syslog timeout");
    let text = std::fs::read_to_string(DEBIAN).expect("read the Debian config");
    // The paths and accounts of this machine; every keyword stays.
    let cfg = text
        .replace("/dev/log", &log_path.display().to_string())
        .replace(
            "chroot /var/lib/haproxy",
            &format!("chroot {}", jail.path().display()),
        )
        // `expose-fd listeners` pins the BPF maps, which a final stop removes.
        .replace(
            "/run/haproxy/admin.sock mode 660",
            "@DIR@/admin.sock expose-fd listeners mode 660",
        )
        .replace("user haproxy", "user nobody")
        .replace("group haproxy", "group nogroup")
        .replace("127.0.0.1:18500", &format!("127.0.0.1:{port}"))
        .replace("127.0.0.1:18501", &server.addr.to_string());
    let pins_before = pin_dirs();
    let mut shunt = Shunt::start(&cfg, &[]);

    let root = std::fs::read_link(format!("/proc/{}/root", shunt.pid())).expect("read root link");
    assert_eq!(root, jail.path(), "the process's root is the chroot");

    let mut c = connect(SocketAddr::from(([127, 0, 0, 1], port)));
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let data = pattern(64 << 10, 7);
    c.write_all(&data).expect("send");
    let mut back = vec![0u8; data.len()];
    c.read_exact(&mut back).expect("echo through shunt");
    assert_eq!(sha256(&back), sha256(&data));
    drop(c);

    let info = show_info(&shunt.sock());
    assert_eq!(info.get("Name").map(String::as_str), Some("shunt"));
    let node = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("host name");
    assert_eq!(
        info.get("node").map(String::as_str),
        Some(node.trim()),
        "read without /proc"
    );
    let nofile: u64 = info
        .get("Ulimit-n")
        .and_then(|v| v.parse().ok())
        .expect("Ulimit-n in show info");
    assert!(nofile > 0, "read without /proc");
    let stat = stat_row(&shunt.sock(), "tcp_in", "s1");
    assert_eq!(
        stat.get("status").map(String::as_str),
        Some("UP"),
        "{stat:?}"
    );

    // `option httplog` fell back to tcplog: one line at the flow's end, sent
    // from inside the chroot through the socket connected before it.
    let mut buf = [0u8; 2048];
    let n = syslog
        .recv(&mut buf)
        .expect("a traffic log line on the UNIX datagram socket");
    let line = String::from_utf8_lossy(&buf[..n]);
    assert!(line.contains("tcp_in tcp_in/s1"), "tcplog line: {line}");

    // A final stop removes the pins, though their path is outside the root.
    let ours: Vec<_> = pin_dirs().difference(&pins_before).cloned().collect();
    let bpf_loaded = info.get("Bpf").is_some_and(|b| b == "loaded");
    if bpf_loaded {
        assert_eq!(ours.len(), 1, "one pin directory: {ours:?}");
    } else {
        eprintln!(
            "\n!!!!! SKIPPED the pin half: BPF not loaded here ({:?})\n",
            info.get("Bpf")
        );
    }
    shunt.signal(libc::SIGTERM);
    assert_eq!(
        shunt.wait(Duration::from_secs(10)),
        Some(0),
        "{}",
        shunt.stderr()
    );
    // The directory may stay (its parent is root's); no map pinned in it may.
    for d in &ours {
        let left: Vec<_> = std::fs::read_dir(d)
            .map(|r| r.filter_map(|e| e.ok().map(|e| e.file_name())).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{} still pins {left:?}", d.display());
        let _ = std::fs::remove_dir(d);
    }
}

/// The instances' pin directories under the BPF filesystem.
fn pin_dirs() -> std::collections::HashSet<std::path::PathBuf> {
    std::fs::read_dir("/sys/fs/bpf/shunt")
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}

#[test]
fn errors_found_after_parsing_name_the_line_that_refers() {
    let file = "testdata/compat/unknown-backend.cfg";
    let (code, _, err) = check_config(&[Path::new(file)]);
    assert_eq!(code, 1, "{err}");
    let ours = parsing_lines(&err);
    let msgs = [
        (
            11,
            "Proxy 'fe': unable to find required default_backend: 'nosuch'.",
        ),
        (
            12,
            "Proxy 'fe': unable to find required use_backend: 'other'.",
        ),
    ];
    let want: Vec<String> = msgs
        .iter()
        .map(|(line, m)| format!("parsing [{file}:{line}] : {m}"))
        .collect();
    assert_eq!(ours, want, "{err}");
    match haproxy_check(Path::new(file)) {
        None => eprintln!("SKIP the HAProxy half: no haproxy binary (apt-get install haproxy)"),
        Some((hcode, text)) => {
            assert_ne!(hcode, 0, "{text}");
            for (_, m) in msgs {
                assert!(text.contains(m), "HAProxy's own words '{m}' in: {text}");
            }
        }
    }
}

#[test]
fn a_chroot_that_cannot_be_entered_fails_the_start() {
    let missing = TempDir::new("no-jail");
    let dir = missing.path().join("absent");
    let server = Server::echo();
    let port = free_port();
    let cfg = simple_config(port, &[server.addr], "").replacen(
        "global\n",
        &format!("global\n    chroot {}\n", dir.display()),
        1,
    );
    let mut shunt = Shunt::spawn_with(&[], &cfg, &[]);
    assert_eq!(
        shunt.wait(Duration::from_secs(10)),
        Some(1),
        "{}",
        shunt.stderr()
    );
    let err = shunt.stderr();
    assert!(
        err.contains("[ALERT]") && err.contains(&format!("Cannot chroot({})", dir.display())),
        "{err}"
    );
    assert!(!err.contains("shunt started"), "{err}");
}

#[test]
fn a_chrooted_process_hands_its_sockets_to_a_successor() {
    use shunt_tests::reload::{backend, frontend, pid_in, plain, reload_global, tcp_defaults};
    if !can_run_as_root("a_chrooted_process_hands_its_sockets_to_a_successor") {
        return;
    }
    let server = Server::echo();
    let shared = TempDir::new("chroot-reload");
    let jail = TempDir::new("jail");
    let port = free_port();
    let extra = format!(
        "    chroot {}\n    user nobody\n    group nogroup\n",
        jail.path().display()
    );
    let cfg = format!(
        "{}{}{}{}",
        reload_global(shared.path(), true, &extra),
        tcp_defaults("30s"),
        frontend("fe", port, "", "be"),
        backend("be", server.addr)
    );
    let sock = shared.path().join("admin.sock");
    let pidfile = shared.path().join("shunt.pid");
    let mut old = Shunt::start(&cfg, &[]);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let echo = |what: &str| {
        let mut c = connect(addr);
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        c.write_all(b"ping").expect("send");
        let mut b = [0u8; 4];
        c.read_exact(&mut b)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(&b, b"ping");
    };
    echo("the first process");
    let (sock_s, old_pid) = (sock.display().to_string(), old.pid().to_string());
    let new = Shunt::start(&cfg, &["-x", &sock_s, "-sf", &old_pid]);
    let log = plain(&new.stderr());
    assert!(
        log.contains("took the listening sockets of the old process"),
        "{log}"
    );
    assert_eq!(
        old.wait(Duration::from_secs(10)),
        Some(0),
        "the old process: {}",
        old.stderr()
    );
    echo("the successor");
    let root = std::fs::read_link(format!("/proc/{}/root", new.pid())).expect("root link");
    assert_eq!(root, jail.path(), "the successor chrooted too");
    assert_eq!(
        pid_in(&pidfile),
        new.pid(),
        "the pidfile names the successor"
    );
    let info = show_info(&sock);
    assert_eq!(info.get("Pid"), Some(&new.pid().to_string()));
    // The empty pin directory a process run as `user` leaves (its parent is root's).
    drop(new);
    let _ = std::fs::remove_dir(shunt_tests::reload::pin_dir(&sock));
}
