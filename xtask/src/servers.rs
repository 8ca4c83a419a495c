//! In-process TCP backends and clients for the demo and the bench.
//!
//! Owns: an echo server (writes back what it reads, forwards EOF as FIN), a sink (reads
//! and discards; optionally answers the byte count as 8 big-endian bytes after EOF, so a
//! client knows every byte arrived), their per-server counters (scur, stot, bin, bout as
//! HAProxy names them for a server: bin = bytes received from the proxy), the clients
//! that drive them, and a client of shunt's stats socket (`show stat` CSV and
//! `show info` parsed into rows and fields).
//!
//! Invariants: plain std threads on loopback; at most `MAX_CONNS` connections served at
//! once per server (more are closed at accept); every blocking socket call has a timeout
//! (`IO_TIMEOUT`, `CLI_TIMEOUT`), so no thread waits forever; dropping a `Server` stops
//! its acceptor.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

/// Connections one backend serves at once; the demo and bench need a handful.
const MAX_CONNS: u64 = 64;
/// Inactivity limit on every socket read or write here.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Read/write buffer size of servers and clients.
const BUF: usize = 256 * 1024;
/// Bound of one stats socket exchange (connect, command, answer up to EOF).
const CLI_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest stats socket answer read; `show stat` of the demo or bench is a few KiB.
const CLI_MAX_ANSWER: u64 = 4 << 20;

/// Counters of one endpoint, named as in HAProxy's `show stat`.
#[derive(Default)]
pub struct Counters {
    scur: AtomicU64,
    stot: AtomicU64,
    bin: AtomicU64,
    bout: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub scur: u64,
    pub stot: u64,
    pub bin: u64,
    pub bout: u64,
}

impl std::ops::Add for Snapshot {
    type Output = Snapshot;

    fn add(self, o: Snapshot) -> Snapshot {
        Snapshot {
            scur: self.scur + o.scur,
            stot: self.stot + o.stot,
            bin: self.bin + o.bin,
            bout: self.bout + o.bout,
        }
    }
}

impl Counters {
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            scur: self.scur.load(Ordering::Relaxed),
            stot: self.stot.load(Ordering::Relaxed),
            bin: self.bin.load(Ordering::Relaxed),
            bout: self.bout.load(Ordering::Relaxed),
        }
    }

    /// Counts a session for as long as the returned guard lives.
    pub fn session(self: &Arc<Self>) -> SessionGuard {
        self.stot.fetch_add(1, Ordering::Relaxed);
        self.scur.fetch_add(1, Ordering::Relaxed);
        SessionGuard(Arc::clone(self))
    }

    pub fn add_in(&self, n: usize) {
        self.bin.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn add_out(&self, n: usize) {
        self.bout.fetch_add(n as u64, Ordering::Relaxed);
    }
}

pub struct SessionGuard(Arc<Counters>);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.0.scur.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Echo,
    /// `report`: answer the received byte count after EOF.
    Sink {
        report: bool,
    },
}

/// A running backend; stops accepting when dropped.
pub struct Server {
    pub addr: SocketAddr,
    pub counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start(bind: SocketAddr, kind: Kind) -> Result<Self> {
        let listener =
            TcpListener::bind(bind).with_context(|| format!("cannot listen on {bind}"))?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let counters = Arc::clone(&counters);
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name(format!("xtask-{addr}"))
                .spawn(move || accept_loop(listener, kind, counters, stop))?
        };
        Ok(Self {
            addr,
            counters,
            stop,
            acceptor: Some(acceptor),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, kind: Kind, counters: Arc<Counters>, stop: Arc<AtomicBool>) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = conn else { continue };
        if counters.snapshot().scur >= MAX_CONNS {
            continue; // dropped: closed at once
        }
        let session = counters.session();
        let counters = Arc::clone(&counters);
        let _ = std::thread::Builder::new()
            .name("xtask-conn".into())
            .spawn(move || {
                let _session = session;
                let _ = serve(stream, kind, &counters);
            });
    }
}

fn serve(mut stream: TcpStream, kind: Kind, counters: &Counters) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut buf = vec![0u8; BUF];
    let mut total: u64 = 0;
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        counters.add_in(n);
        total += n as u64;
        if kind == Kind::Echo {
            stream.write_all(&buf[..n])?;
            counters.add_out(n);
        }
    }
    if kind == (Kind::Sink { report: true }) {
        stream.write_all(&total.to_be_bytes())?;
        counters.add_out(8);
    }
    stream.shutdown(Shutdown::Write)
}

fn connect(addr: SocketAddr) -> Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
        .with_context(|| format!("cannot connect to {addr}"))?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// A deterministic payload that makes misordered or shifted bytes visible.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Sends `payload` through `addr` to an echo server, checks the echo byte for byte and
/// the FIN that follows. `client` counts the session as a frontend would.
pub fn echo_round_trip(
    addr: SocketAddr,
    payload: &[u8],
    client: &Arc<Counters>,
) -> Result<Duration> {
    let _session = client.session();
    let started = Instant::now();
    let mut stream = connect(addr)?;
    let mut writer = stream.try_clone()?;
    let echoed = std::thread::scope(|s| -> Result<Vec<u8>> {
        let w = s.spawn(move || -> std::io::Result<()> {
            writer.write_all(payload)?;
            writer.shutdown(Shutdown::Write)
        });
        let mut echoed = Vec::with_capacity(payload.len());
        let read = stream.read_to_end(&mut echoed);
        let wrote = w
            .join()
            .map_err(|_| anyhow::anyhow!("writer thread panicked"))?;
        wrote.context("echo client: write")?;
        read.context("echo client: read")?;
        Ok(echoed)
    })?;
    client.add_in(payload.len());
    client.add_out(echoed.len());
    ensure!(
        echoed.len() == payload.len(),
        "echo through {addr}: sent {} bytes, got {} back before EOF",
        payload.len(),
        echoed.len()
    );
    if let Some(i) = echoed.iter().zip(payload).position(|(a, b)| a != b) {
        bail!("echo through {addr}: byte {i} differs");
    }
    Ok(started.elapsed())
}

/// What one push to a sink measured.
#[derive(Debug, Clone, Copy)]
pub struct Push {
    /// From connect to the sink's EOF (and count, with `report`).
    pub elapsed: Duration,
}

/// Writes `size` bytes through `addr` to a sink, then FIN, then waits for the sink's EOF.
/// With `report`, the sink's byte count must equal `size`. `stop` is polled between
/// writes; `deadline` bounds the whole push.
pub fn push_to_sink(
    addr: SocketAddr,
    size: u64,
    report: bool,
    client: &Arc<Counters>,
    deadline: Instant,
    stop: &dyn Fn() -> bool,
) -> Result<Push> {
    let _session = client.session();
    let started = Instant::now();
    let mut stream = connect(addr)?;
    let chunk = pattern(BUF, size);
    let mut left = size;
    while left > 0 {
        ensure!(!stop(), "interrupted");
        ensure!(
            Instant::now() < deadline,
            "push through {addr}: deadline passed with {left} of {size} bytes unsent"
        );
        let n = usize::try_from(left).unwrap_or(BUF).min(BUF);
        stream
            .write_all(&chunk[..n])
            .with_context(|| format!("push through {addr}: write"))?;
        client.add_in(n);
        left -= n as u64;
    }
    stream.shutdown(Shutdown::Write)?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .with_context(|| format!("push through {addr}: waiting for the sink's EOF"))?;
    client.add_out(answer.len());
    if report {
        let got: [u8; 8] = answer.as_slice().try_into().with_context(|| {
            format!(
                "push through {addr}: expected an 8-byte count, got {} bytes",
                answer.len()
            )
        })?;
        let got = u64::from_be_bytes(got);
        ensure!(
            got == size,
            "push through {addr}: sent {size} bytes, the sink received {got}"
        );
    }
    Ok(Push {
        elapsed: started.elapsed(),
    })
}

/// Runs one command on a stats socket (non-interactive: the answer ends with EOF).
pub fn cli_command(path: &Path, cmd: &str) -> Result<String> {
    let mut s = UnixStream::connect(path)
        .with_context(|| format!("cannot connect to the stats socket {}", path.display()))?;
    s.set_read_timeout(Some(CLI_TIMEOUT))?;
    s.set_write_timeout(Some(CLI_TIMEOUT))?;
    s.write_all(format!("{cmd}\n").as_bytes())
        .with_context(|| format!("stats socket {}: sending '{cmd}'", path.display()))?;
    let mut answer = String::new();
    s.take(CLI_MAX_ANSWER)
        .read_to_string(&mut answer)
        .with_context(|| {
            format!(
                "stats socket {}: reading the answer to '{cmd}'",
                path.display()
            )
        })?;
    Ok(answer)
}

/// One `show stat` row: column name → value (empty columns are present, as "").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatRow(pub BTreeMap<String, String>);

impl StatRow {
    /// The value of a column, "" when absent or empty.
    pub fn get(&self, column: &str) -> &str {
        self.0.get(column).map_or("", String::as_str)
    }

    /// A numeric column; absent or empty columns count as 0, garbage is an error.
    pub fn num(&self, column: &str) -> Result<u64> {
        match self.get(column) {
            "" => Ok(0),
            v => v.parse().with_context(|| {
                format!(
                    "show stat {}/{}: column {column} is '{v}', not a number",
                    self.get("pxname"),
                    self.get("svname")
                )
            }),
        }
    }
}

/// Parses `show stat` CSV: the `# pxname,svname,…` header, then one row per line.
pub fn parse_show_stat(csv: &str) -> Result<Vec<StatRow>> {
    let mut lines = csv.lines().filter(|l| !l.trim().is_empty());
    let header = lines
        .next()
        .and_then(|h| h.strip_prefix("# "))
        .with_context(|| format!("show stat: no '# pxname,…' header in {csv:?}"))?;
    let names: Vec<&str> = header.trim_end_matches(',').split(',').collect();
    ensure!(
        names.first() == Some(&"pxname") && names.get(1) == Some(&"svname"),
        "show stat: the header does not start with pxname,svname: {header:?}"
    );
    lines
        .map(|line| {
            let values: Vec<&str> = line.trim_end_matches(',').split(',').collect();
            ensure!(
                values.len() <= names.len(),
                "show stat: {} values for {} columns in {line:?}",
                values.len(),
                names.len()
            );
            Ok(StatRow(
                names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (n.to_string(), values.get(i).unwrap_or(&"").to_string()))
                    .collect(),
            ))
        })
        .collect()
}

/// Parses `show info`: `Name: value` lines (names may hold spaces, e.g. `Build info`).
pub fn parse_show_info(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// A numeric `show info` field; absent or garbage is an error naming the field.
pub fn info_num(info: &BTreeMap<String, String>, name: &str) -> Result<u64> {
    let v = info
        .get(name)
        .with_context(|| format!("show info has no '{name}' field"))?;
    v.parse()
        .with_context(|| format!("show info: {name} is '{v}', not a number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any_port() -> SocketAddr {
        "127.0.0.1:0".parse().expect("addr")
    }

    #[test]
    fn echo_server_echoes_and_counts() {
        let server = Server::start(any_port(), Kind::Echo).expect("echo");
        let client = Arc::new(Counters::default());
        let payload = pattern(300_000, 7);
        echo_round_trip(server.addr, &payload, &client).expect("round trip");
        let c = client.snapshot();
        assert_eq!((c.scur, c.stot, c.bin, c.bout), (0, 1, 300_000, 300_000));
        let deadline = Instant::now() + Duration::from_secs(5);
        while server.counters.snapshot().scur != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let s = server.counters.snapshot();
        assert_eq!((s.scur, s.stot, s.bin, s.bout), (0, 1, 300_000, 300_000));
    }

    #[test]
    fn reporting_sink_confirms_every_byte() {
        let server = Server::start(any_port(), Kind::Sink { report: true }).expect("sink");
        let client = Arc::new(Counters::default());
        let deadline = Instant::now() + Duration::from_secs(20);
        push_to_sink(server.addr, 3_000_001, true, &client, deadline, &|| false).expect("push");
        assert_eq!(server.counters.snapshot().bin, 3_000_001);
        assert_eq!(client.snapshot().bout, 8);
    }

    #[test]
    fn wrong_echo_is_detected() {
        // A sink in place of an echo server returns nothing: the check must fail.
        let server = Server::start(any_port(), Kind::Sink { report: false }).expect("sink");
        let client = Arc::new(Counters::default());
        let err = echo_round_trip(server.addr, &pattern(1000, 1), &client).expect_err("no echo");
        assert!(format!("{err}").contains("got 0 back"), "{err}");
    }

    #[test]
    fn short_sink_count_is_detected() {
        // A plain (non-reporting) sink sends no count: a reporting push must fail.
        let server = Server::start(any_port(), Kind::Sink { report: false }).expect("sink");
        let client = Arc::new(Counters::default());
        let deadline = Instant::now() + Duration::from_secs(20);
        let err = push_to_sink(server.addr, 1000, true, &client, deadline, &|| false)
            .expect_err("no count");
        assert!(format!("{err}").contains("8-byte count"), "{err}");
    }

    #[test]
    fn show_stat_csv_parses_by_column_name() {
        let csv = "# pxname,svname,qcur,scur,stot,bin,bout,status,\n\
                   demo,FRONTEND,,1,10,123,456,OPEN,\n\
                   echo,echo1,0,0,5,100,,no check,\n\n";
        let rows = parse_show_stat(csv).expect("parse");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].get("svname"), "FRONTEND");
        assert_eq!(rows[0].num("bin").expect("bin"), 123);
        assert_eq!(rows[0].num("qcur").expect("empty is 0"), 0);
        assert_eq!(rows[1].get("status"), "no check");
        assert_eq!(rows[1].num("bout").expect("bout"), 0);
        assert!(rows[1].num("status").is_err());
        assert!(parse_show_stat("demo,FRONTEND\n").is_err(), "no header");
        assert!(
            parse_show_stat("# pxname,svname\na,b,c\n").is_err(),
            "too many values"
        );
    }

    #[test]
    fn show_info_parses_names_with_spaces() {
        let info = parse_show_info(
            "Name: shunt\nBuild info: 0.1.0\nSockmapFlows: 3\nBpf: not loaded: EPERM\n",
        );
        assert_eq!(info.get("Build info").map(String::as_str), Some("0.1.0"));
        assert_eq!(
            info.get("Bpf").map(String::as_str),
            Some("not loaded: EPERM")
        );
        assert_eq!(info_num(&info, "SockmapFlows").expect("n"), 3);
        assert!(info_num(&info, "Name").is_err());
        assert!(info_num(&info, "CopyFlows").is_err());
    }

    #[test]
    fn cli_command_sends_a_line_and_reads_to_eof() {
        let dir = std::env::temp_dir().join(format!("xtask-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().expect("accept");
            let mut line = Vec::new();
            let mut byte = [0u8; 1];
            while c.read(&mut byte).expect("read") == 1 && byte[0] != b'\n' {
                line.push(byte[0]);
            }
            c.write_all(format!("got {}\n\n", String::from_utf8_lossy(&line)).as_bytes())
                .expect("write");
        });
        let answer = cli_command(&path, "show info").expect("command");
        server.join().expect("server");
        assert_eq!(answer, "got show info\n\n");
        assert!(cli_command(&dir.join("absent.sock"), "show info").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
