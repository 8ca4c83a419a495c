//! Real HAProxy clients against a real shunt's stats socket: the Debian
//! prometheus-haproxy-exporter, the `haproxyadmin` Python library and hatop (in a
//! pseudo-terminal). Each runs unchanged; shunt is configured with
//! `stats show-name HAProxy` since haproxyadmin refuses a socket whose `Name` differs.
//!
//! The clients are installed by `cargo xtask setup`. Under `SHUNT_REQUIRE_BPF=1` (CI) a
//! missing client fails its test; otherwise the test is skipped loudly.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shunt_tests::*;

/// How long a client gets to answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long hatop runs in its terminal before it is stopped.
const HATOP_RUN: &str = "4";

/// Whether the client is there; panics under `SHUNT_REQUIRE_BPF=1` if not.
fn client_present(what: &str, present: bool) -> bool {
    if present {
        return true;
    }
    if std::env::var("SHUNT_REQUIRE_BPF").as_deref() == Ok("1") {
        panic!("{what} is not installed (run `cargo xtask setup`)");
    }
    eprintln!("!!!!! SKIPPED: {what} is not installed (run `cargo xtask setup`)");
    false
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
}

/// A child process killed and reaped on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// shunt with one frontend to backend `be` (two echo servers), the stats socket named
/// `HAProxy`, and a `map_ip` map in `map_dir` routing 10.1.0.0/16 to `be`.
fn start_shunt(map_dir: &Path) -> (Shunt, Vec<Server>) {
    let servers = vec![Server::echo(), Server::echo()];
    let addrs: Vec<_> = servers.iter().map(|s| s.addr).collect();
    let map = map_dir.join("be.map");
    std::fs::write(&map, "10.1.0.0/16 be\n").expect("write map");
    let port = free_port();
    let cfg = simple_config(port, &addrs, "")
        .replace(
            "level admin\n",
            "level admin\n    stats show-name HAProxy\n",
        )
        .replace(
            "    default_backend be\n",
            &format!(
                "    use_backend %[src,map_ip({},be)]\n    default_backend be\n",
                map.display()
            ),
        );
    (Shunt::start(&cfg, &[]), servers)
}

/// `GET /metrics` from the exporter, or None while it is not answering.
fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/1.").then_some(out)
}

fn metric_lines(body: &str, prefix: &str) -> Vec<String> {
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

#[test]
fn prometheus_haproxy_exporter_scrapes_shunt() {
    if !client_present(
        "prometheus-haproxy-exporter",
        on_path("prometheus-haproxy-exporter"),
    ) {
        return;
    }
    let dir = TempDir::new("exporter");
    let (shunt, _servers) = start_shunt(dir.path());
    let port = free_port();
    let exporter = Command::new("prometheus-haproxy-exporter")
        .arg(format!(
            "--haproxy.scrape-uri=unix:{}",
            shunt.sock().display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus-haproxy-exporter");
    let _exporter = Reaped(exporter);
    let t0 = Instant::now();
    let body = loop {
        if let Some(b) = scrape(port) {
            break b;
        }
        assert!(t0.elapsed() < CLIENT_TIMEOUT, "the exporter never answered");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(body.lines().any(|l| l == "haproxy_up 1"), "{body}");
    assert!(
        body.lines()
            .any(|l| l == "haproxy_exporter_csv_parse_failures_total 0"),
        "{body}"
    );
    for s in ["s1", "s2"] {
        let series = format!("{{backend=\"be\",server=\"{s}\"}}");
        let lines = metric_lines(&body, "haproxy_server_");
        assert!(
            lines.iter().filter(|l| l.contains(&series)).count() >= 10,
            "few series for {s}: {lines:#?}"
        );
        assert!(
            lines.contains(&format!("haproxy_server_up{series} 1")),
            "{lines:#?}"
        );
    }
    assert!(
        body.lines()
            .any(|l| l == "haproxy_backend_up{backend=\"be\"} 1"),
        "{body}"
    );

    // A server put in maintenance over the socket is down in the next scrape.
    assert_eq!(cli(&shunt.sock(), "disable server be/s2"), "\n");
    let body = scrape(port).expect("second scrape");
    assert!(
        body.lines()
            .any(|l| l == "haproxy_server_up{backend=\"be\",server=\"s2\"} 0"),
        "{body}"
    );
    assert!(body.lines().any(|l| l == "haproxy_up 1"), "{body}");
}

/// Lists servers, sets a weight and reads it back, drains and re-enables a server, and
/// edits the map, printing one `key=value` line per step.
const HAPROXYADMIN_SCRIPT: &str = r#"
import sys
import haproxyadmin
from haproxyadmin import haproxy
hap = haproxy.HAProxy(socket_file=sys.argv[1])
print("servers=" + ",".join(sorted(s.backendname + "/" + s.name for s in hap.servers())))
srv = hap.server("s1", backend="be")[0]
print("setweight=%s" % srv.setweight(5))
print("weight=%s" % srv.weight)
print("getweight=%s" % hap.command("get weight be/s1")[0][1][0])
print("drain=%s" % srv.setstate(haproxyadmin.STATE_DRAIN))
print("drainstatus=%s" % srv.status)
print("ready=%s" % srv.setstate(haproxyadmin.STATE_READY))
print("readystatus=%s" % srv.status)
print("addmap=%s" % hap.add_map(0, "10.2.0.0/16", "be"))
print("getmap=%s" % hap.get_map(0, "10.2.3.4"))
print("setmap=%s" % hap.set_map(0, "10.2.0.0/16", "other"))
print("delmap=%s" % hap.del_map(0, "10.1.0.0/16"))
print("showmap=%s" % ";".join(" ".join(e.split()[1:]) for e in hap.show_map(0)))
"#;

fn python_has_haproxyadmin() -> bool {
    Command::new("python3")
        .args(["-c", "import haproxyadmin"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn haproxyadmin_lists_servers_sets_a_weight_and_edits_a_map() {
    if !client_present("python3 with haproxyadmin", python_has_haproxyadmin()) {
        return;
    }
    let dir = TempDir::new("haproxyadmin");
    let (shunt, _servers) = start_shunt(dir.path());
    let script = dir.path().join("hapadm.py");
    std::fs::write(&script, HAPROXYADMIN_SCRIPT).expect("write script");
    let out = Command::new("python3")
        .arg(&script)
        .arg(shunt.sock())
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let got: std::collections::HashMap<&str, &str> =
        stdout.lines().filter_map(|l| l.split_once('=')).collect();
    let want = [
        ("servers", "be/s1,be/s2"),
        ("setweight", "True"),
        ("weight", "5"),
        ("getweight", "5 (initial 1)"),
        ("drain", "True"),
        ("drainstatus", "DRAIN"),
        ("ready", "True"),
        ("readystatus", "no check"),
        ("addmap", "True"),
        ("setmap", "True"),
        ("delmap", "True"),
        ("showmap", "10.2.0.0/16 other"),
    ];
    for (k, v) in want {
        assert_eq!(got.get(k).copied(), Some(v), "{k}: {stdout}\n{stderr}");
    }
    assert!(
        got.get("getmap")
            .is_some_and(|g| g.contains("found=yes") && g.contains("10.2.0.0/16")),
        "{stdout}"
    );
    // The changes are real: seen over the socket by another client.
    assert_eq!(cli(&shunt.sock(), "get weight be/s1"), "5 (initial 1)\n\n");
    let servers = cli(&shunt.sock(), "show servers state be");
    assert!(servers.contains(" be 1 s1 127.0.0.1 2 0 5 1 "), "{servers}");
    let map = cli(&shunt.sock(), "show map #0");
    assert!(map.contains(" 10.2.0.0/16 other\n"), "{map}");
    assert!(!map.contains("10.1.0.0/16"), "{map}");
}

#[test]
fn hatop_shows_backends_and_servers_in_a_terminal() {
    if !client_present(
        "hatop and script (util-linux)",
        on_path("hatop") && on_path("script") && on_path("timeout"),
    ) {
        return;
    }
    let dir = TempDir::new("hatop");
    let (shunt, _servers) = start_shunt(dir.path());
    let typescript = dir.path().join("hatop.typescript");
    let inner = format!(
        "stty cols 132 rows 40; exec hatop -s {}",
        shunt.sock().display()
    );
    // `timeout` stops hatop (exit 124); `script` gives it a pseudo-terminal and
    // records what it drew.
    let status = Command::new("timeout")
        .args([HATOP_RUN, "script", "-qfc", &inner])
        .arg(&typescript)
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run hatop under script");
    let screen =
        String::from_utf8_lossy(&std::fs::read(&typescript).expect("typescript")).to_string();
    assert_eq!(status.code(), Some(124), "hatop exited early:\n{screen}");
    for want in [
        "HATop version",
        ">>> fe",
        ">>> be",
        "FRONTEND",
        "BACKEND",
        "s1",
        "s2",
    ] {
        assert!(
            screen.contains(want),
            "no '{want}' on hatop's screen:\n{screen}"
        );
    }
    assert!(!screen.contains("Traceback"), "{screen}");
}
