//! The load generators of `cargo xtask bench` and the parsers of their reports.
//!
//! Owns: iperf3 bulk runs (`-J` JSON: bytes and seconds the receiver counted), redis-
//! benchmark runs (`--csv`: requests per second, p50 and p99 in ms), a request/response
//! client that times fixed-size echoes over one connection (the 64 KiB and cork-probe
//! scenarios), an idle server that only accepts and holds connections (the idle-flow
//! memory scenario) with the client side that opens N flows through a proxy, and the
//! `add map` stream on a stats socket in `prompt` mode.
//!
//! Invariants: every external tool runs through `proc::run_bounded` (own process group,
//! pid logged, killed on the limit or a stop request); every socket here has a timeout
//! and every loop is bounded in count and time and polls `proc::stop_requested`; echoed
//! bytes are compared with what was sent, so a proxy that corrupts or truncates fails
//! the run instead of producing a figure.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use shunt_testkit::{pattern, stats, Server};
use xtask::proc;

/// Inactivity limit on every socket read or write here.
const IO_TIMEOUT: Duration = Duration::from_secs(20);
/// How many times an iperf3 run is tried again when the server was not ready for it
/// ([`server_not_ready`]).
const IPERF_TRIES: usize = 4;
/// Pause before such a retry.
const IPERF_RETRY_PAUSE: Duration = Duration::from_millis(500);
/// Flows opened before waiting for the idle server to catch up (keeps every accept
/// queue on the way short, so no SYN is dropped and retried a second later).
const IDLE_BATCH: usize = 500;
/// How long the idle server may lag behind the client's connects.
const IDLE_SETTLE: Duration = Duration::from_secs(30);
/// Largest answer read back from the `add map` stream (3 bytes per command).
const CLI_MAX_ANSWER: usize = 64 << 20;

/// What one iperf3 run measured at the receiver.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bulk {
    pub bytes: u64,
    pub seconds: f64,
}

impl Bulk {
    pub fn gbits(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 * 8.0 / self.seconds / 1e9
        } else {
            0.0
        }
    }
}

/// `iperf3 -c` through `front` for `secs` seconds with `streams` parallel streams.
pub fn iperf3(front: SocketAddr, secs: u32, streams: u32) -> Result<Bulk> {
    let args = [
        "-c".to_string(),
        front.ip().to_string(),
        "-p".into(),
        front.port().to_string(),
        "-t".into(),
        secs.to_string(),
        "-P".into(),
        streams.to_string(),
        "-J".into(),
        "--connect-timeout".into(),
        "5000".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let limit = Duration::from_secs(u64::from(secs) + 30);
    let mut last = None;
    for _ in 0..IPERF_TRIES {
        match proc::run_bounded("iperf3", &args, limit).and_then(|out| parse_iperf3(&out)) {
            Ok(b) => return Ok(b),
            Err(e) if server_not_ready(&format!("{e:#}")) && !proc::stop_requested() => {
                last = Some(e);
                std::thread::sleep(IPERF_RETRY_PAUSE);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("iperf3: no try ran")))
}

/// An iperf3 error after which the run measured nothing because the server was not
/// ready for a test: still busy with the previous one (its control connection closes a
/// moment after the client's report), or resetting the new control connection while it
/// recovered from clients that closed without a test (each proxy's start-up probe of
/// its fronts reaches the server as one: seen as the first run of a bench failing with
/// `unable to receive control message: Connection reset by peer`, 2026-12-07).
fn server_not_ready(err: &str) -> bool {
    err.contains("busy") || err.contains("unable to receive control message")
}

/// The receiver's totals of an iperf3 `-J` report (`end.sum_received`); an `error`
/// field is an error.
pub fn parse_iperf3(json: &str) -> Result<Bulk> {
    let v: serde_json::Value =
        serde_json::from_str(json).context("iperf3 -J printed no JSON document")?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        bail!("iperf3: {e}");
    }
    let sum = v
        .pointer("/end/sum_received")
        .context("iperf3 -J: no end.sum_received")?;
    let bytes = sum
        .get("bytes")
        .and_then(serde_json::Value::as_u64)
        .context("iperf3 -J: no sum_received.bytes")?;
    let seconds = sum
        .get("seconds")
        .and_then(serde_json::Value::as_f64)
        .context("iperf3 -J: no sum_received.seconds")?;
    ensure!(bytes > 0, "iperf3: the receiver counted 0 bytes");
    Ok(Bulk { bytes, seconds })
}

/// One redis-benchmark result line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rr {
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// `redis-benchmark -t TEST` through `front`: `requests` requests from `clients`
/// connections, with keep-alive unless `new_conn` (`-k 0`: one connection per request).
pub fn redis_benchmark(
    front: SocketAddr,
    test: &str,
    requests: u32,
    clients: u32,
    new_conn: bool,
    limit: Duration,
) -> Result<Rr> {
    let args = [
        "-h".to_string(),
        front.ip().to_string(),
        "-p".into(),
        front.port().to_string(),
        "-t".into(),
        test.into(),
        "-n".into(),
        requests.to_string(),
        "-c".into(),
        clients.to_string(),
        "-k".into(),
        if new_conn { "0" } else { "1" }.into(),
        "--csv".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = proc::run_bounded("redis-benchmark", &args, limit)?;
    parse_redis_csv(&out)
}

/// redis-benchmark's `--csv` output: a header naming the columns, then one row.
pub fn parse_redis_csv(text: &str) -> Result<Rr> {
    let rows: Vec<Vec<String>> = text
        .lines()
        .filter(|l| l.starts_with('"'))
        .map(|l| {
            l.split(',')
                .map(|f| f.trim().trim_matches('"').to_string())
                .collect()
        })
        .collect();
    let header = rows
        .iter()
        .find(|r| r.first().map(String::as_str) == Some("test"))
        .with_context(|| format!("redis-benchmark --csv: no header in {text:?}"))?;
    let row = rows
        .iter()
        .find(|r| r.first().map(String::as_str) != Some("test"))
        .with_context(|| format!("redis-benchmark --csv: no result row in {text:?}"))?;
    let col = |name: &str| -> Result<f64> {
        let i = header
            .iter()
            .position(|h| h == name)
            .with_context(|| format!("redis-benchmark --csv: no column {name}"))?;
        row.get(i)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("redis-benchmark --csv: {name} is not a number"))
    };
    let rr = Rr {
        rps: col("rps")?,
        p50_ms: col("p50_latency_ms")?,
        p99_ms: col("p99_latency_ms")?,
    };
    ensure!(
        rr.rps > 0.0,
        "redis-benchmark counted 0 requests per second"
    );
    Ok(rr)
}

/// Round trips of `size` bytes through `front` to an echo server over one connection,
/// `count` of them (fewer if `limit` passes first, at least one); every echo is checked.
pub fn echo_round_trips(
    front: SocketAddr,
    size: usize,
    count: usize,
    limit: Duration,
) -> Result<Vec<Duration>> {
    let mut s = TcpStream::connect_timeout(&front, IO_TIMEOUT)
        .with_context(|| format!("cannot connect to {front}"))?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.set_nodelay(true)?;
    let msg = pattern(size, size as u64);
    let mut back = vec![0u8; size];
    let end = Instant::now() + limit;
    let mut times = Vec::with_capacity(count);
    for i in 0..count {
        ensure!(!proc::stop_requested(), "interrupted");
        if i > 0 && Instant::now() >= end {
            break;
        }
        let t0 = Instant::now();
        s.write_all(&msg)
            .with_context(|| format!("echo through {front}: write of {size} bytes"))?;
        s.read_exact(&mut back)
            .with_context(|| format!("echo through {front}: read of {size} bytes"))?;
        times.push(t0.elapsed());
        ensure!(
            back == msg,
            "echo through {front}: {size} bytes came back changed"
        );
    }
    Ok(times)
}

/// A server that accepts connections and holds them without reading (idle flows), on
/// its accept thread (no thread per flow).
pub struct IdleServer {
    pub addr: SocketAddr,
    held: Arc<Mutex<Vec<TcpStream>>>,
    server: Option<Server>,
}

/// The idle server's accept queue (the kernel caps it at `net.core.somaxconn`,
/// 4096 by default).
const IDLE_BACKLOG: libc::c_int = 65535;

impl IdleServer {
    pub fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").context("idle server: bind")?;
        // A deep accept queue: thousands of proxied connects arrive in a burst while
        // the accept thread shares CPU 0 with the clients. With the queue full, the
        // kernel drops the handshake's last ACK of a SYN-cookie connection, which the
        // proxy's side already counts as established: an idle flow sends nothing that
        // would repair it, and it never reaches the server (seen: "only 3486 of 3500
        // idle flows reached the server"). Listening again only resizes the queue.
        // SAFETY: the fd is the listener's own, open for the call.
        if unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&listener), IDLE_BACKLOG) } != 0 {
            return Err(std::io::Error::last_os_error()).context("idle server: listen");
        }
        let held = Arc::new(Mutex::new(Vec::new()));
        let server = {
            let held = Arc::clone(&held);
            Server::on_accept(listener, move |c| {
                if let Ok(mut v) = held.lock() {
                    v.push(c);
                }
            })?
        };
        Ok(Self {
            addr: server.addr,
            held,
            server: Some(server),
        })
    }

    /// Connections accepted (and held until `release`) so far.
    pub fn accepted(&self) -> u64 {
        self.server
            .as_ref()
            .map_or(0, |s| s.accepted.load(Ordering::SeqCst) as u64)
    }

    /// Closes every held connection (the server closes first, so the TIME_WAIT state
    /// lands on the server's port, not on the proxy's ephemeral ports).
    pub fn release(&self) {
        if let Ok(mut v) = self.held.lock() {
            v.clear();
        }
    }
}

impl Drop for IdleServer {
    fn drop(&mut self) {
        // Stop accepting first, so nothing is held after the release.
        drop(self.server.take());
        self.release();
    }
}

/// Opens `n` flows through `front` to `server` and holds them; returns the clients once
/// the server has accepted all of them (each has crossed the proxy).
pub fn open_idle_flows(front: SocketAddr, server: &IdleServer, n: usize) -> Result<Vec<TcpStream>> {
    let base = server.accepted();
    let mut flows = Vec::with_capacity(n);
    while flows.len() < n {
        let batch = IDLE_BATCH.min(n - flows.len());
        for _ in 0..batch {
            ensure!(!proc::stop_requested(), "interrupted");
            let s = TcpStream::connect_timeout(&front, IO_TIMEOUT).with_context(|| {
                format!(
                    "idle flow {} of {n} through {front}: connect",
                    flows.len() + 1
                )
            })?;
            flows.push(s);
        }
        let want = base + flows.len() as u64;
        let end = Instant::now() + IDLE_SETTLE;
        while server.accepted() < want {
            ensure!(!proc::stop_requested(), "interrupted");
            ensure!(
                Instant::now() < end,
                "only {} of {} idle flows reached the server through {front} within {IDLE_SETTLE:?}",
                server.accepted() - base,
                flows.len()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    Ok(flows)
}

/// Streams `prompt` and `lines` `add map` commands through one stats-socket connection
/// and reads until every command has been answered (one `> ` prompt each); returns the
/// time from the first byte written to the last answer. An answer holding anything but
/// prompts (an error message) fails the run.
pub fn add_map_stream(sock: &Path, map: &str, lines: usize, limit: Duration) -> Result<Duration> {
    let mut input = String::with_capacity(lines * 40 + 8);
    input.push_str("prompt\n");
    for i in 0..lines {
        input.push_str(&format!(
            "add map {map} 10.{}.{}.{} be\n",
            (i >> 16) & 0xff,
            (i >> 8) & 0xff,
            i & 0xff
        ));
    }
    let mut c = stats::connect(sock, Some(Duration::from_millis(200)), Some(IO_TIMEOUT))?;
    let mut w = c.try_clone()?;
    let started = Instant::now();
    let writer = std::thread::spawn(move || w.write_all(input.as_bytes()));
    // The first prompt answers `prompt` itself; then one per add.
    let want = lines + 1;
    let mut seen = 0usize;
    let mut total = 0usize;
    let mut tail = [0u8; 2];
    let mut junk = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let end = started + limit;
    while seen < want {
        ensure!(!proc::stop_requested(), "interrupted");
        ensure!(
            Instant::now() < end,
            "add map stream on {}: {seen} of {want} answers within {limit:?}",
            sock.display()
        );
        let n = match c.read(&mut buf) {
            Ok(0) => bail!(
                "add map stream on {}: closed after {seen} of {want} answers",
                sock.display()
            ),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("add map stream: read"),
        };
        total += n;
        ensure!(total <= CLI_MAX_ANSWER, "add map stream: answer too long");
        for &b in &buf[..n] {
            if b == b' ' && (tail == [b'\n', b'>'] || tail == [0, b'>']) {
                seen += 1;
            } else if b != b'\n' && b != b'>' && junk.len() < 200 {
                junk.push(b);
            }
            tail = [tail[1], b];
        }
    }
    let elapsed = started.elapsed();
    let wrote = writer
        .join()
        .map_err(|_| anyhow::anyhow!("add map writer panicked"))?;
    wrote.context("add map stream: write")?;
    ensure!(
        junk.iter().all(|b| *b == b' '),
        "add map stream on {}: answers other than prompts: {:?}",
        sock.display(),
        String::from_utf8_lossy(&junk)
    );
    Ok(elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf3_json_totals_and_errors() {
        let ok = r#"{"start":{},"end":{"sum_sent":{"bytes":5},"sum_received":
            {"start":0,"end":2.0,"seconds":2.0,"bytes":2500000000,"bits_per_second":1e10}}}"#;
        let b = parse_iperf3(ok).expect("ok");
        assert_eq!(b.bytes, 2_500_000_000);
        assert!((b.gbits() - 10.0).abs() < 1e-9);
        let busy = r#"{"start":{},"end":{},"error":"error - the server is busy running a test. try again later"}"#;
        let e = parse_iperf3(busy).expect_err("busy");
        assert!(server_not_ready(&format!("{e:#}")));
        assert!(server_not_ready(
            "iperf3: unable to receive control message: Connection reset by peer"
        ));
        assert!(!server_not_ready("iperf3: unable to connect to server"));
        assert!(format!("{e}").contains("busy"), "{e}");
        assert!(parse_iperf3("not json").is_err());
        assert!(parse_iperf3(r#"{"end":{"sum_received":{"seconds":1.0,"bytes":0}}}"#).is_err());
    }

    #[test]
    fn redis_csv_columns_by_name() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\
                    \"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                    \"PING_INLINE\",\"29850.75\",\"0.029\",\"0.008\",\"0.023\",\"0.055\",\"0.071\",\"0.183\"\n";
        let rr = parse_redis_csv(text).expect("parse");
        assert_eq!(rr.rps, 29850.75);
        assert_eq!(rr.p50_ms, 0.023);
        assert_eq!(rr.p99_ms, 0.071);
        assert!(parse_redis_csv("WARNING: Keepalive disabled\n").is_err());
        assert!(parse_redis_csv("\"test\",\"rps\"\n\"PING\",\"0\"\n").is_err());
    }

    #[test]
    fn echo_round_trips_check_the_bytes() {
        let echo = shunt_testkit::Backend::start(
            "127.0.0.1:0".parse().expect("a"),
            shunt_testkit::Kind::Echo,
        )
        .expect("echo");
        let t = echo_round_trips(echo.addr, 65536, 5, Duration::from_secs(10)).expect("rr");
        assert_eq!(t.len(), 5);
        // A sink never answers: the read must time out into an error, not a figure.
        let idle = IdleServer::start().expect("idle");
        let mut s = TcpStream::connect(idle.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("t");
        s.write_all(b"x").expect("w");
        let mut b = [0u8; 1];
        assert!(s.read_exact(&mut b).is_err());
    }

    #[test]
    fn idle_flows_are_held_and_released() {
        let idle = IdleServer::start().expect("idle");
        let flows = open_idle_flows(idle.addr, &idle, 50).expect("flows");
        assert_eq!(flows.len(), 50);
        assert_eq!(idle.accepted(), 50);
        idle.release();
        // The server closed first: every client reads EOF.
        for mut f in flows {
            f.set_read_timeout(Some(Duration::from_secs(5))).expect("t");
            let mut b = [0u8; 1];
            assert_eq!(f.read(&mut b).expect("eof"), 0);
        }
    }

    #[test]
    fn add_map_stream_counts_prompts_and_rejects_error_text() {
        let dir = std::env::temp_dir().join(format!("xtask-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        for (answer, ok) in [("\n> ", true), ("Unknown map.\n> ", false)] {
            let path = dir.join(format!("s{}.sock", ok as u8));
            let _ = std::fs::remove_file(&path);
            let l = std::os::unix::net::UnixListener::bind(&path).expect("bind");
            let server = std::thread::spawn(move || {
                let (mut c, _) = l.accept().expect("accept");
                let mut r = std::io::BufReader::new(c.try_clone().expect("clone"));
                let mut line = String::new();
                let mut first = true;
                while std::io::BufRead::read_line(&mut r, &mut line).expect("read") > 0 {
                    let a = if first { "\n> " } else { answer };
                    first = false;
                    c.write_all(a.as_bytes()).expect("write");
                    line.clear();
                }
            });
            let r = add_map_stream(&path, "/m.map", 100, Duration::from_secs(10));
            assert_eq!(r.is_ok(), ok, "{r:?}");
            drop(r);
            server.join().ok();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
