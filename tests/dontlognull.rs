//! `option dontlognull` through the real binary: a connection that carried no
//! data from the client (a port probe, a readiness check that connects and
//! closes) gets no log line, with `option tcplog` and with the default
//! "Connect from" line alike, while a connection that sent bytes is logged
//! exactly once. Without the option, the probes are logged too (so the test
//! can tell the two apart). Logs go to a UDP syslog receiver in the test.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use shunt_tests::*;

/// Probes per run (connect, then close without a byte).
const PROBES: usize = 5;
/// How long lines may take to reach the receiver after their flow ended.
const SETTLE: Duration = Duration::from_millis(500);

fn config(fe_port: u16, log_port: u16, echo: SocketAddr, options: &str) -> String {
    format!(
        "global\n    nbthread 2\n    stats socket @DIR@/admin.sock level admin\n\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend fe\n    bind 127.0.0.1:{fe_port}\n    log 127.0.0.1:{log_port} local0\n{options}    default_backend be\n\n\
         backend be\n    server s1 {echo}\n"
    )
}

/// Every datagram the receiver gets until `SETTLE` passes without one.
fn drain(rx: &UdpSocket) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    rx.set_read_timeout(Some(SETTLE)).expect("timeout");
    while let Ok(n) = rx.recv(&mut buf) {
        out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    out
}

/// Run PROBES probes and one real exchange; return the lines logged for the
/// probes' source ports and for the exchange's.
fn run(options: &str) -> (usize, usize) {
    let echo = Server::echo();
    let rx = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    let log_port = rx.local_addr().expect("addr").port();
    let fe_port = free_port();
    let shunt = Shunt::start(&config(fe_port, log_port, echo.addr, options), &[]);
    let fe = SocketAddr::from(([127, 0, 0, 1], fe_port));
    // Whatever the harness's readiness wait sent is not ours to count.
    let _ = drain(&rx);
    let mut probe_ports = Vec::new();
    for _ in 0..PROBES {
        let c = connect(fe);
        probe_ports.push(c.local_addr().expect("local").port());
        drop(c);
    }
    // The probes end in shunt before the real flow starts.
    let sess_empty = Instant::now();
    while cli(&shunt.sock(), "show sess")
        .lines()
        .any(|l| l.contains("fe=fe"))
        && sess_empty.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut c = TcpStream::connect(fe).expect("connect");
    let real_port = c.local_addr().expect("local").port();
    c.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    c.write_all(b"hello").expect("write");
    let mut got = [0u8; 5];
    c.read_exact(&mut got).expect("echo");
    c.shutdown(Shutdown::Write).expect("shutdown");
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    drop(c);
    let lines = drain(&rx);
    let mentions = |port: u16| {
        let needle = format!("127.0.0.1:{port} ");
        lines.iter().filter(|l| l.contains(&needle)).count()
    };
    let probes = probe_ports.iter().map(|p| mentions(*p)).sum();
    let real = mentions(real_port);
    assert!(
        real == 1,
        "the exchange from port {real_port} was logged {real} times; lines:\n{}",
        lines.join("\n")
    );
    (probes, real)
}

#[test]
fn dontlognull_drops_probe_lines_with_tcplog() {
    let (probes, _) = run("    option tcplog\n    option dontlognull\n");
    assert_eq!(probes, 0, "probes were logged despite dontlognull");
}

#[test]
fn dontlognull_drops_probe_lines_with_the_connect_line() {
    let (probes, _) = run("    option dontlognull\n");
    assert_eq!(probes, 0, "probes were logged despite dontlognull");
}

#[test]
fn without_dontlognull_probes_are_logged() {
    let (probes, _) = run("    option tcplog\n");
    assert_eq!(probes, PROBES, "each probe is one line without dontlognull");
}
