//! The Prometheus exporter (`stats prometheus bind`): scraped over HTTP, parsed by
//! the reference OpenMetrics parser (python3 `prometheus_client`, installed by
//! `cargo xtask setup`), with HAProxy's exporter metric names, and counters equal
//! to what `show stat` / `show info` say after the same traffic.
//!
//! Without python3's `prometheus_client` the parse test skips loudly, except
//! under CI (`CI=true`), where it fails.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use shunt_tests::*;

/// Reads OpenMetrics text on stdin; prints one `name<TAB>labels<TAB>value` per
/// sample (labels as sorted `k=v` joined by commas). Fails on any parse error.
const PARSER: &str = r#"
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        print(f"{s.name}\t{labels}\t{s.value}")
"#;

fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect exporter");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n").expect("request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("response");
    let (head, body) = out.split_once("\r\n\r\n").expect("http head");
    (head.to_string(), body.to_string())
}

fn parser_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import prometheus_client.openmetrics.parser"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "python3 prometheus_client missing (cargo xtask setup installs it)"
        );
        eprintln!("!!!!! SKIPPED: python3 prometheus_client not installed (pip install prometheus_client)");
    }
    ok
}

/// Parse `body` with the reference parser: (name, labels) → value.
fn parse(body: &str) -> HashMap<(String, String), f64> {
    let mut child = Command::new("python3")
        .args(["-c", PARSER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("feed parser");
    let out = child.wait_with_output().expect("parser output");
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the exposition: {}\n{body}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let mut f = l.split('\t');
            let (n, lb, v) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
            ((n.to_string(), lb.to_string()), v.parse().expect("value"))
        })
        .collect()
}

fn flow(addr: SocketAddr, n: usize) {
    let mut c = connect(addr);
    c.write_all(&vec![7u8; n]).expect("write");
    c.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let got = read_to_end(&mut c).expect("read");
    assert_eq!(got.len(), n);
}

#[test]
fn exporter_parses_and_matches_show_stat() {
    let (s1, s2) = (Server::echo(), Server::echo());
    let (port, mport) = (free_port(), free_port());
    let cfg = simple_config(port, &[s1.addr, s2.addr], "").replacen(
        "level admin\n",
        &format!("level admin\n    stats prometheus bind 127.0.0.1:{mport}\n"),
        1,
    );
    let shunt = Shunt::start(&cfg, &["--forward-mode", "copy"]);
    let fe = SocketAddr::from(([127, 0, 0, 1], port));
    let exporter = SocketAddr::from(([127, 0, 0, 1], mport));
    for i in 0..12 {
        flow(fe, 1000 + i * 10);
    }
    assert_mode(&shunt.sock(), "copy");

    let (head, body) = http_get(exporter, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(
        head.contains("Content-Type: application/openmetrics-text"),
        "{head}"
    );
    let (h404, _) = http_get(exporter, "/nope");
    assert!(h404.starts_with("HTTP/1.1 404"), "{h404}");
    assert!(body.ends_with("# EOF\n"), "not OpenMetrics: {body}");

    // HAProxy's exporter names for the fields shunt has.
    for name in [
        "haproxy_process_nbthread",
        "haproxy_process_current_connections",
        "haproxy_process_connections_total",
        "haproxy_process_dropped_logs_total",
        "haproxy_process_max_connections",
        "haproxy_frontend_current_sessions",
        "haproxy_frontend_sessions_total",
        "haproxy_frontend_bytes_in_total",
        "haproxy_frontend_bytes_out_total",
        "haproxy_backend_sessions_total",
        "haproxy_backend_connection_errors_total",
        "haproxy_server_sessions_total",
        "haproxy_server_bytes_in_total",
        "shunt_flows_total",
        "shunt_bytes_total",
        "shunt_bpf_redirect_errors_total",
        "shunt_promoted_flows_total",
        "shunt_scheduler_loop_avg_microseconds",
    ] {
        assert!(
            body.lines().any(|l| l.starts_with(name)),
            "metric {name} missing:\n{body}"
        );
    }

    if !parser_available() {
        return;
    }
    let m = parse(&body);
    let get = |name: &str, labels: &str| -> u64 {
        *m.get(&(name.to_string(), labels.to_string()))
            .unwrap_or_else(|| panic!("no sample {name}{{{labels}}}")) as u64
    };
    let sock = shunt.sock();
    for (name, col) in [
        ("haproxy_frontend_sessions_total", "stot"),
        ("haproxy_frontend_bytes_in_total", "bin"),
        ("haproxy_frontend_bytes_out_total", "bout"),
        ("haproxy_frontend_current_sessions", "scur"),
        ("haproxy_frontend_max_sessions", "smax"),
    ] {
        assert_eq!(
            get(name, "proxy=fe"),
            stat(&sock, "fe", "FRONTEND", col),
            "{name}"
        );
    }
    for (name, col) in [
        ("haproxy_backend_sessions_total", "stot"),
        ("haproxy_backend_bytes_in_total", "bin"),
        ("haproxy_backend_bytes_out_total", "bout"),
        ("haproxy_backend_connection_errors_total", "econ"),
    ] {
        assert_eq!(
            get(name, "proxy=be"),
            stat(&sock, "be", "BACKEND", col),
            "{name}"
        );
    }
    for sv in ["s1", "s2"] {
        let labels = format!("proxy=be,server={sv}");
        for (name, col) in [
            ("haproxy_server_sessions_total", "stot"),
            ("haproxy_server_bytes_in_total", "bin"),
            ("haproxy_server_bytes_out_total", "bout"),
        ] {
            assert_eq!(
                get(name, &labels),
                stat(&sock, "be", sv, col),
                "{name} {sv}"
            );
        }
    }
    // The traffic really is in there (the comparison is not 0 == 0).
    assert_eq!(get("haproxy_frontend_sessions_total", "proxy=fe"), 12);
    let sent: u64 = (0..12).map(|i| 1000 + i * 10).sum();
    assert_eq!(get("haproxy_frontend_bytes_in_total", "proxy=fe"), sent);
    assert_eq!(
        get("haproxy_server_sessions_total", "proxy=be,server=s1"),
        6
    );
    assert_eq!(
        get("haproxy_process_connections_total", ""),
        info_u64(&sock, "CumConns")
    );
    assert_eq!(
        get("haproxy_process_dropped_logs_total", ""),
        info_u64(&sock, "DroppedLogs")
    );
    assert_eq!(
        get("shunt_flows_total", "mode=copy"),
        info_u64(&sock, "CopyFlows")
    );
    assert_eq!(get("shunt_flows_total", "mode=copy"), 12);
    assert_eq!(get("shunt_bytes_total", "mode=copy"), 2 * sent);
    assert_eq!(get("haproxy_process_nbthread", ""), 2);
}
