//! Traffic logs against a real rsyslog (Debian's `rsyslogd`, run as a child with its
//! own configuration in a scratch directory): every flow of a run appears exactly
//! once, byte-identical to HAProxy's TCP log line in a syslog header, over UDP and
//! over TCP with octet counting (a `ring` section); with the log server stopped,
//! forwarding latency stays where it was and `DroppedLogs` grows.
//!
//! rsyslog writes each message as received (`%rawmsg%`) to a file, one per line.
//! When rsyslogd is missing the tests skip loudly, except under CI (`CI=true`),
//! where `cargo xtask setup` installs it and a missing one fails.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use shunt_tests::*;

/// How long rsyslog may take to start listening / to write the lines it got.
const RSYSLOG_WAIT: Duration = Duration::from_secs(15);
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

struct Rsyslog {
    child: Option<Child>,
    dir: TempDir,
    udp: u16,
    tcp: u16,
}

fn rsyslogd() -> Option<PathBuf> {
    ["/usr/sbin/rsyslogd", "/sbin/rsyslogd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("udp port")
        .port()
}

impl Rsyslog {
    /// rsyslogd in the foreground on free loopback ports; `None` (skip) if absent.
    fn start() -> Option<Rsyslog> {
        let Some(bin) = rsyslogd() else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "rsyslogd not installed (cargo xtask setup installs it)"
            );
            eprintln!("!!!!! SKIPPED: rsyslogd not installed (apt-get install rsyslog)");
            return None;
        };
        let dir = TempDir::new("rsyslog");
        let (udp, tcp) = (free_udp_port(), free_port());
        let d = dir.path().display();
        let conf = format!(
            r#"global(workDirectory="{d}")
module(load="imudp")
module(load="imtcp")
input(type="imudp" address="127.0.0.1" port="{udp}")
input(type="imtcp" address="127.0.0.1" port="{tcp}")
template(name="raw" type="string" string="%rawmsg%\n")
*.* action(type="omfile" file="{d}/out.log" template="raw")
"#
        );
        let conf_path = dir.path().join("rsyslog.conf");
        std::fs::write(&conf_path, conf).expect("write rsyslog.conf");
        let err = std::fs::File::create(dir.path().join("rsyslog.err")).expect("err file");
        let child = Command::new(bin)
            .arg("-n")
            .arg("-f")
            .arg(&conf_path)
            .arg("-i")
            .arg(dir.path().join("rsyslog.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawn rsyslogd");
        let mut r = Rsyslog {
            child: Some(child),
            dir,
            udp,
            tcp,
        };
        // Ready when its TCP input accepts (the UDP input is opened first).
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", tcp)).is_err() {
            if let Some(st) = r.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("rsyslogd exited ({st}): {}", r.errors());
            }
            assert!(
                t0.elapsed() < RSYSLOG_WAIT,
                "rsyslogd did not listen: {}",
                r.errors()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(r)
    }

    fn errors(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("rsyslog.err")).unwrap_or_default()
    }

    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("out.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Wait (bounded) until at least `n` lines arrived, then a little more to
    /// catch any duplicate; the lines.
    fn wait_lines(&self, n: usize) -> Vec<String> {
        let t0 = Instant::now();
        while self.lines().len() < n && t0.elapsed() < RSYSLOG_WAIT {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(300));
        self.lines()
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Rsyslog {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One flow through shunt: send `n` bytes, read the echo, close. Returns the
/// client port and the time it took.
fn flow(addr: SocketAddr, n: usize) -> (u16, Duration) {
    let t0 = Instant::now();
    let mut c = connect(addr);
    let port = c.local_addr().expect("local").port();
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    c.write_all(&vec![b'x'; n]).expect("write");
    let mut got = vec![0u8; n];
    c.read_exact(&mut got).expect("echo");
    c.shutdown(Shutdown::Write).expect("shutdown");
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    (port, t0.elapsed())
}

fn config(fe_port: u16, echo: SocketAddr, global_log: &str, extra: &str) -> String {
    format!(
        "global\n    nbthread 2\n    stats socket @DIR@/admin.sock level admin\n    {global_log}\n\
         {extra}\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend fe\n    bind 127.0.0.1:{fe_port}\n    log global\n    option tcplog\n    default_backend be\n\n\
         backend be\n    server s1 {echo}\n"
    )
}

/// Check one received line against the expected rfc3164 + tcplog bytes: every
/// field is computed from the flow, except the clock-dependent ones (header time,
/// accept date, Tw/Tc/Tt), which are read from the line, checked for range, and
/// put back; then the whole line must be identical.
fn check_line(
    line: &str,
    pid: i32,
    fe_port_bytes: &HashMap<u16, usize>,
    t_start: SystemTime,
) -> u16 {
    // "<134>Mmm dd HH:MM:SS shunt[PID]: 127.0.0.1:PORT [DATE] ..."
    let hdr_time = line
        .get(5..20)
        .unwrap_or_else(|| panic!("short line {line:?}"));
    let month = &hdr_time[..3];
    assert!(MONTHS.contains(&month), "header month in {line:?}");
    let rest = line
        .split_once("]: 127.0.0.1:")
        .unwrap_or_else(|| panic!("no client in {line:?}"))
        .1;
    let port: u16 = rest
        .split(' ')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("port in {line:?}"));
    let bytes = *fe_port_bytes
        .get(&port)
        .unwrap_or_else(|| panic!("a line for an unknown client port {port}: {line:?}"));
    let date = rest
        .split_once(" [")
        .and_then(|(_, r)| r.split_once("] "))
        .map(|(d, _)| d)
        .unwrap_or_else(|| panic!("accept date in {line:?}"));
    // dd/Mmm/yyyy:HH:MM:SS.mmm
    assert_eq!(date.len(), 24, "accept date {date:?}");
    assert!(MONTHS.contains(&&date[3..6]), "accept date {date:?}");
    let year: u64 = date[7..11].parse().expect("year");
    let now_year = 1970
        + SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            / 31_556_952;
    assert!(
        year + 1 >= now_year && year <= now_year + 1,
        "year in {date:?}"
    );
    let _ = t_start;
    let timers = rest
        .split(" fe be/s1 ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("timers in {line:?}"));
    let t: Vec<i64> = timers
        .split('/')
        .map(|v| v.parse().expect("timer"))
        .collect();
    assert_eq!(t.len(), 3, "{line:?}");
    assert!(
        t[0] >= 0 && t[1] >= 0 && t[2] >= t[1],
        "timers {timers} in {line:?}"
    );
    assert!(t[2] < 10_000, "Tt {timers} in {line:?}");
    // actconn/feconn/beconn/srv_conn exclude the flow itself, as HAProxy's
    // end-of-flow lines show them; `run_flows` starts a flow only once the
    // previous one is gone from every gauge, so each is 0.
    let conns = rest
        .split(" -- ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("counts in {line:?}"));
    assert_eq!(conns, "0/0/0/0/0", "counts in {line:?}");
    let expected = format!(
        "<134>{hdr_time} shunt[{pid}]: 127.0.0.1:{port} [{date}] fe be/s1 {}/{}/{} {bytes} -- 0/0/0/0/0 0/0",
        t[0], t[1], t[2]
    );
    assert_eq!(
        line, expected,
        "the line differs from HAProxy's tcplog format"
    );
    port
}

/// Run `n` sequential flows of distinct sizes through the shunt whose stats
/// socket is `sock`; client port → bytes. Each flow starts once the previous one
/// has left `CurrConns` (its log line is sent before it does), so a line's gauges
/// never count a neighbour closing or opening at that instant.
fn run_flows(fe: SocketAddr, sock: &Path, n: usize) -> HashMap<u16, usize> {
    let mut m = HashMap::new();
    for i in 0..n {
        let bytes = 100 + i;
        let (port, _) = flow(fe, bytes);
        assert!(m.insert(port, bytes).is_none(), "client port reused");
        let deadline = Instant::now() + Duration::from_secs(5);
        while info_u64(sock, "CurrConns") != 0 {
            assert!(
                Instant::now() < deadline,
                "flow {i} still counted after 5 s"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    m
}

fn exactly_once(lines: &[String], pid: i32, flows: &HashMap<u16, usize>, t0: SystemTime) {
    let mut seen: HashMap<u16, usize> = HashMap::new();
    for l in lines {
        *seen.entry(check_line(l, pid, flows, t0)).or_default() += 1;
    }
    for port in flows.keys() {
        assert_eq!(
            seen.get(port),
            Some(&1),
            "flow from port {port}: lines {lines:#?}"
        );
    }
    assert_eq!(lines.len(), flows.len(), "{lines:#?}");
}

const FLOWS: usize = 20;

#[test]
fn udp_every_flow_logged_once_in_tcplog_format() {
    let Some(rs) = Rsyslog::start() else { return };
    let echo = Server::echo();
    let mut expected = 0;
    for mode in forwarding_modes() {
        let port = free_port();
        let cfg = config(
            port,
            echo.addr,
            &format!("log 127.0.0.1:{} local0", rs.udp),
            "",
        );
        let shunt = Shunt::start(&cfg, &["--forward-mode", mode]);
        let t0 = SystemTime::now();
        let flows = run_flows(
            SocketAddr::from(([127, 0, 0, 1], port)),
            &shunt.sock(),
            FLOWS,
        );
        expected += FLOWS;
        let lines = rs.wait_lines(expected);
        let mine: Vec<String> = lines
            .into_iter()
            .filter(|l| l.contains(&format!("shunt[{}]:", shunt.pid())))
            .collect();
        exactly_once(&mine, shunt.pid(), &flows, t0);
        assert_mode(&shunt.sock(), mode);
        assert_eq!(info_u64(&shunt.sock(), "DroppedLogs"), 0);
    }
}

#[test]
fn tcp_octet_counting_ring_every_flow_logged_once() {
    let Some(rs) = Rsyslog::start() else { return };
    let echo = Server::echo();
    let port = free_port();
    let ring = format!(
        "ring r1\n    format rfc3164\n    maxlen 1024\n    size 65536\n    timeout connect 1s\n    timeout server 2s\n    server rs 127.0.0.1:{} log-proto octet-count\n",
        rs.tcp
    );
    let cfg = config(port, echo.addr, "log ring@r1 local0 info", &ring);
    let shunt = Shunt::start(&cfg, &["--forward-mode", "splice"]);
    let t0 = SystemTime::now();
    let flows = run_flows(
        SocketAddr::from(([127, 0, 0, 1], port)),
        &shunt.sock(),
        FLOWS,
    );
    let lines = rs.wait_lines(FLOWS);
    exactly_once(&lines, shunt.pid(), &flows, t0);
    assert_eq!(info_u64(&shunt.sock(), "DroppedLogs"), 0);
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Flow latency with a dead log server stays close to a shunt that does not log,
/// and the lines that could not go are counted in `DroppedLogs`.
#[test]
fn dead_log_server_costs_dropped_lines_not_latency() {
    let Some(mut rs) = Rsyslog::start() else {
        return;
    };
    let echo = Server::echo();
    let (p_log, p_plain) = (free_port(), free_port());
    let ring = format!(
        "ring r1\n    format rfc3164\n    size 2048\n    timeout connect 200ms\n    timeout server 500ms\n    server rs 127.0.0.1:{} log-proto octet-count\n",
        rs.tcp
    );
    let cfg = config(p_log, echo.addr, "log ring@r1 local0", &ring);
    let logging = Shunt::start(&cfg, &["--forward-mode", "copy"]);
    let plain_cfg = config(p_plain, echo.addr, "", "");
    let _plain = Shunt::start(&plain_cfg, &["--forward-mode", "copy"]);
    let (fe_log, fe_plain) = (
        SocketAddr::from(([127, 0, 0, 1], p_log)),
        SocketAddr::from(([127, 0, 0, 1], p_plain)),
    );
    // Alive: lines arrive, none dropped.
    let flows = run_flows(fe_log, &logging.sock(), 5);
    let lines = rs.wait_lines(5);
    exactly_once(&lines, logging.pid(), &flows, SystemTime::now());
    assert_eq!(info_u64(&logging.sock(), "DroppedLogs"), 0);

    rs.stop();
    std::thread::sleep(Duration::from_millis(200));
    // Interleave the two proxies so both see the same machine load.
    const ROUNDS: usize = 150;
    let (mut with_dead, mut without) = (Vec::new(), Vec::new());
    let mut dropped_mid = 0;
    for i in 0..ROUNDS {
        with_dead.push(flow(fe_log, 64).1);
        without.push(flow(fe_plain, 64).1);
        if i == ROUNDS / 2 {
            dropped_mid = info_u64(&logging.sock(), "DroppedLogs");
        }
    }
    let dropped_end = info_u64(&logging.sock(), "DroppedLogs");
    let (m_dead, m_plain) = (median(with_dead), median(without));
    eprintln!("median flow time: dead log server {m_dead:?}, no logging {m_plain:?}; dropped {dropped_mid} then {dropped_end}");
    assert!(
        m_dead <= m_plain * 3 + Duration::from_millis(5),
        "a dead log server slowed flows: median {m_dead:?} vs {m_plain:?}"
    );
    assert!(
        dropped_mid > 0,
        "no line counted as dropped with the server down"
    );
    assert!(
        dropped_end > dropped_mid,
        "DroppedLogs did not grow: {dropped_mid} then {dropped_end}"
    );
    // The ring holds at most 2 KiB of lines: nearly every line was dropped.
    assert!(
        dropped_end >= (ROUNDS as u64) - 40,
        "dropped {dropped_end} of {ROUNDS}"
    );
}
