//! Counted in-process TCP backends and the clients that drive them, for the demo and
//! the bench.
//!
//! Owns: an echo backend (writes back what it reads, forwards EOF as FIN), a sink (reads
//! and discards; optionally answers the byte count as 8 big-endian bytes after EOF, so a
//! client knows every byte arrived), their per-server counters (scur, stot, bin, bout as
//! HAProxy names them for a server: bin = bytes received from the proxy), and the
//! clients: a checked echo round trip and a checked push to a sink.
//!
//! Invariants: served by the crate's one accept loop (`Server`) with a thread per
//! connection; at most `MAX_CONNS` connections served at once per backend (more are
//! closed at accept); every blocking socket call has a timeout (`IO_TIMEOUT`), so no
//! thread waits forever; dropping a `Backend` stops its acceptor.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::pattern;
use crate::server::{relay, Server};

/// Connections one backend serves at once; the demo and bench need a handful.
const MAX_CONNS: u64 = 64;
/// Inactivity limit on every socket read or write here.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Read/write buffer size of servers and clients.
const BUF: usize = 256 * 1024;

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
pub struct Backend {
    pub addr: SocketAddr,
    pub counters: Arc<Counters>,
    _server: Server,
}

impl Backend {
    pub fn start(bind: SocketAddr, kind: Kind) -> Result<Self> {
        let listener =
            TcpListener::bind(bind).with_context(|| format!("cannot listen on {bind}"))?;
        let counters = Arc::new(Counters::default());
        let server = {
            let counters = Arc::clone(&counters);
            Server::on_accept(listener, move |stream| {
                if counters.snapshot().scur >= MAX_CONNS {
                    return; // dropped: closed at once
                }
                let session = counters.session();
                let counters = Arc::clone(&counters);
                let _ = std::thread::Builder::new()
                    .name("backend-conn".into())
                    .spawn(move || {
                        let _session = session;
                        let _ = serve(stream, kind, &counters);
                    });
            })
            .with_context(|| format!("cannot serve on {bind}"))?
        };
        Ok(Self {
            addr: server.addr,
            counters,
            _server: server,
        })
    }
}

fn serve(mut stream: TcpStream, kind: Kind, counters: &Counters) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    // As real servers do (redis, nginx): an echo written in pieces, as a proxy with
    // 16 KiB buffers hands it over, would otherwise hold its last piece for the ACK of
    // the one before (Nagle), and a delayed ACK makes that 40 ms.
    stream.set_nodelay(true)?;
    let mut buf = vec![0u8; BUF];
    let total = relay(&mut stream, &mut buf, kind == Kind::Echo, Some(counters))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn any_port() -> SocketAddr {
        "127.0.0.1:0".parse().expect("addr")
    }

    #[test]
    fn echo_server_echoes_and_counts() {
        let server = Backend::start(any_port(), Kind::Echo).expect("echo");
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
        let server = Backend::start(any_port(), Kind::Sink { report: true }).expect("sink");
        let client = Arc::new(Counters::default());
        let deadline = Instant::now() + Duration::from_secs(20);
        push_to_sink(server.addr, 3_000_001, true, &client, deadline, &|| false).expect("push");
        assert_eq!(server.counters.snapshot().bin, 3_000_001);
        assert_eq!(client.snapshot().bout, 8);
    }

    #[test]
    fn wrong_echo_is_detected() {
        // A sink in place of an echo server returns nothing: the check must fail.
        let server = Backend::start(any_port(), Kind::Sink { report: false }).expect("sink");
        let client = Arc::new(Counters::default());
        let err = echo_round_trip(server.addr, &pattern(1000, 1), &client).expect_err("no echo");
        assert!(format!("{err}").contains("got 0 back"), "{err}");
    }

    #[test]
    fn short_sink_count_is_detected() {
        // A plain (non-reporting) sink sends no count: a reporting push must fail.
        let server = Backend::start(any_port(), Kind::Sink { report: false }).expect("sink");
        let client = Arc::new(Counters::default());
        let deadline = Instant::now() + Duration::from_secs(20);
        let err = push_to_sink(server.addr, 1000, true, &client, deadline, &|| false)
            .expect_err("no count");
        assert!(format!("{err}").contains("8-byte count"), "{err}");
    }
}
