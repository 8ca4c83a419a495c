//! Helpers shared by the reload tests (`tests/reload.rs`, `tests/reload_safety.rs`):
//! configurations with a pidfile and a stats socket in the test's shared
//! directory, a steady loop of echo connections that tallies how each one
//! ended, and long-lived flows whose sides each write a known stream at a set
//! rate and check every byte they read.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::pattern;

// ------------------------------------------------------------ configurations

/// The global section of a reload test's configuration: two threads, the
/// pidfile `DIR/shunt.pid` and the stats socket `DIR/admin.sock` at level admin
/// (with `expose-fd listeners` when `expose`), then the `extra` lines.
pub fn reload_global(dir: &Path, expose: bool, extra: &str) -> String {
    let expose = if expose { " expose-fd listeners" } else { "" };
    format!(
        "global\n    nbthread 2\n    pidfile {d}/shunt.pid\n    stats socket {d}/admin.sock level admin{expose}\n{extra}\n",
        d = dir.display()
    )
}

/// A `defaults` section for TCP: connect timeout 2s, client and server
/// timeouts `timeout` (e.g. "30s").
pub fn tcp_defaults(timeout: &str) -> String {
    format!(
        "defaults\n    mode tcp\n    timeout connect 2s\n    timeout client {timeout}\n    timeout server {timeout}\n\n"
    )
}

/// `frontend NAME` bound to 127.0.0.1:`port`, with the `extra` lines, sending
/// everything to `backend`.
pub fn frontend(name: &str, port: u16, extra: &str, backend: &str) -> String {
    format!("frontend {name}\n    bind 127.0.0.1:{port}\n{extra}    default_backend {backend}\n\n")
}

/// `backend NAME` with the one server `s1` at `server`.
pub fn backend(name: &str, server: SocketAddr) -> String {
    format!("backend {name}\n    server s1 {server}\n")
}

/// Whether the BPF filesystem is mounted at /sys/fs/bpf, where a kernel-flow
/// hand-over pins its maps (`cargo xtask setup` mounts it when it is missing).
pub fn bpffs_mounted() -> bool {
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf") && l.contains(" bpf "))
}

/// Whether a test of kernel flows across a reload runs: BPF is wanted
/// (`crate::bpf_wanted`) and the BPF filesystem is mounted. With
/// `SHUNT_REQUIRE_BPF=1` a missing filesystem fails the test instead.
pub fn kernel_handover_wanted() -> bool {
    if !crate::bpf_wanted() {
        return false;
    }
    if !bpffs_mounted() {
        assert!(
            std::env::var("SHUNT_REQUIRE_BPF").as_deref() != Ok("1"),
            "the BPF filesystem is not mounted at /sys/fs/bpf (cargo xtask setup mounts it)"
        );
        eprintln!("!!!!! SKIPPED the kernel hand-over: no BPF filesystem at /sys/fs/bpf (cargo xtask setup mounts it)");
        return false;
    }
    true
}

// ----------------------------------------------------------- process helpers

/// A reload: a new process with `cfg` and `args` that takes the listeners
/// (and kernel flows) of `old` through the stats socket `sock` (`-x`) and
/// soft-stops it (`-sf`).
pub fn reload_over(old: &crate::Shunt, cfg: &str, sock: &Path, args: &[&str]) -> crate::Shunt {
    let sock = sock.display().to_string();
    let pid = old.pid().to_string();
    let mut all = args.to_vec();
    all.extend(["-x", sock.as_str(), "-sf", pid.as_str()]);
    crate::Shunt::start(cfg, &all)
}

/// The log without its ANSI colour sequences.
pub fn plain(log: &str) -> String {
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

/// The pid a pidfile holds; 0 when it is missing or holds no number.
pub fn pid_in(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0)
}

// --------------------------------------------------------- the connection loop

/// Bytes each connection of the loop sends and reads back.
pub const MSG_LEN: usize = 4096;

/// How the connections of the loop ended.
#[derive(Default)]
pub struct Tally {
    /// Echoed exactly and closed cleanly.
    pub ok: AtomicUsize,
    /// Refused at connect.
    pub refused: AtomicUsize,
    /// Reset (or a broken pipe) at any step.
    pub reset: AtomicUsize,
    /// Wrong bytes back (`InvalidData` from [`one_exchange`]).
    pub corrupted: AtomicUsize,
    /// Any other failure (a timeout, ...).
    pub other: AtomicUsize,
}

impl Tally {
    /// The counts so far: (ok, refused, reset, corrupted, other).
    pub fn counts(&self) -> (usize, usize, usize, usize, usize) {
        let get = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        (
            get(&self.ok),
            get(&self.refused),
            get(&self.reset),
            get(&self.corrupted),
            get(&self.other),
        )
    }
}

/// One connection of the loop: send [`MSG_LEN`] bytes, read them back, close
/// cleanly. Wrong bytes are `InvalidData`.
pub fn one_exchange(addr: SocketAddr, seed: u64) -> std::io::Result<()> {
    // Each failure names its step (what a reset interrupted tells its cause).
    let at = |step: &'static str| {
        move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{step}: {e}"))
    };
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(at("connect"))?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    c.set_write_timeout(Some(Duration::from_secs(10)))?;
    let msg = pattern(MSG_LEN, seed);
    c.write_all(&msg).map_err(at("send"))?;
    let mut back = vec![0u8; MSG_LEN];
    c.read_exact(&mut back).map_err(at("echo"))?;
    if back != msg {
        return Err(std::io::Error::new(ErrorKind::InvalidData, "echo differs"));
    }
    c.shutdown(Shutdown::Write).map_err(at("shutdown"))?;
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).map_err(at("eof"))?;
    if !rest.is_empty() {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            "bytes after the echo",
        ));
    }
    Ok(())
}

/// Run [`one_exchange`] against `addr` one after the other (seeds `id << 32`
/// and up), counting each outcome in `tally`, until `stop` is set or `limit`
/// has passed.
pub fn client_loop(
    addr: SocketAddr,
    id: u64,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    limit: Duration,
) {
    let t0 = Instant::now();
    let mut seed = id << 32;
    while !stop.load(Ordering::Relaxed) && t0.elapsed() < limit {
        seed += 1;
        match one_exchange(addr, seed) {
            Ok(()) => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                let slot = match e.kind() {
                    ErrorKind::ConnectionRefused => &tally.refused,
                    ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => &tally.reset,
                    ErrorKind::InvalidData => &tally.corrupted,
                    _ => &tally.other,
                };
                slot.fetch_add(1, Ordering::Relaxed);
                eprintln!("connection {seed:#x} failed: {e}");
            }
        }
        // Steady, not a flood: the machine has few cores shared with others.
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Start `clients` threads, each running a [`client_loop`] against `addr`
/// (ids 1 and up) into `tally` until `stop` is set or `limit` has passed.
pub fn spawn_clients(
    addr: SocketAddr,
    clients: usize,
    stop: &Arc<AtomicBool>,
    tally: &Arc<Tally>,
    limit: Duration,
) -> Vec<JoinHandle<()>> {
    (0..clients)
        .map(|i| {
            let (st, ta) = (stop.clone(), tally.clone());
            std::thread::spawn(move || client_loop(addr, i as u64 + 1, st, ta, limit))
        })
        .collect()
}

// --------------------------------------------------------- long-lived flows

/// Byte `i` of the stream one side of long-lived flow `id` writes (the
/// client-to-server stream when `to_server`).
pub fn stream_byte(id: u64, to_server: bool, i: u64) -> u8 {
    let x = i
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(id << 1 | u64::from(to_server));
    (x >> 29) as u8 ^ (i as u8)
}

/// One side of a long-lived flow: writes its stream, checks the peer's.
pub struct Side {
    /// The side's socket (non-blocking).
    pub sock: TcpStream,
    /// The flow's id (picks its streams, see [`stream_byte`]).
    pub id: u64,
    /// Whether this side writes the client-to-server stream.
    pub writes_to_server: bool,
    /// Bytes written so far.
    pub written: u64,
    /// Bytes read (and checked) so far.
    pub read: u64,
    /// SHA-256 of what was written.
    pub write_hash: sha2::Sha256,
    /// SHA-256 of what was read.
    pub read_hash: sha2::Sha256,
    /// Whether the peer's EOF was read.
    pub eof: bool,
    /// The first thing that went wrong; the side does nothing more after it.
    pub error: Option<String>,
}

impl Side {
    /// Side `writes_to_server` (client) or not (server) of flow `id` on
    /// `sock`, which is made non-blocking.
    pub fn new(sock: TcpStream, id: u64, writes_to_server: bool) -> Side {
        use sha2::Digest;
        sock.set_nonblocking(true).expect("nonblocking");
        Side {
            sock,
            id,
            writes_to_server,
            written: 0,
            read: 0,
            write_hash: sha2::Sha256::new(),
            read_hash: sha2::Sha256::new(),
            eof: false,
            error: None,
        }
    }

    /// "client" or "server".
    pub fn name(&self) -> &'static str {
        if self.writes_to_server {
            "client"
        } else {
            "server"
        }
    }

    /// Write the stream up to `due` bytes (what the rate allows by now).
    pub fn write_until(&mut self, due: u64) {
        use sha2::Digest;
        while self.error.is_none() && self.written < due {
            let n = (due - self.written).min(16 * 1024) as usize;
            let chunk: Vec<u8> = (0..n as u64)
                .map(|k| stream_byte(self.id, self.writes_to_server, self.written + k))
                .collect();
            match self.sock.write(&chunk) {
                Ok(0) => self.error = Some("write returned 0".into()),
                Ok(w) => {
                    self.write_hash.update(&chunk[..w]);
                    self.written += w as u64;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => self.error = Some(format!("write: {e}")),
            }
        }
    }

    /// Read what is there, checking every byte against the peer's stream.
    pub fn read_available(&mut self) {
        use sha2::Digest;
        let mut buf = [0u8; 64 * 1024];
        while self.error.is_none() && !self.eof {
            match self.sock.read(&mut buf) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    for (k, b) in buf[..n].iter().enumerate() {
                        let want =
                            stream_byte(self.id, !self.writes_to_server, self.read + k as u64);
                        if *b != want {
                            self.error = Some(format!(
                                "byte {} differs: got {b:#04x}, want {want:#04x}",
                                self.read + k as u64
                            ));
                            return;
                        }
                    }
                    self.read_hash.update(&buf[..n]);
                    self.read += n as u64;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => self.error = Some(format!("read: {e}")),
            }
        }
    }
}

/// How [`pump_sides`] drives long-lived flows.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Bytes per second each side writes.
    pub rate: usize,
    /// Most bytes one side writes in one round.
    pub burst: u64,
    /// Period of the rounds.
    pub tick: Duration,
    /// Upper bound on the writing, whatever happens.
    pub limit: Duration,
    /// Bound on the reading to EOF after every side closed its write side.
    pub drain_limit: Duration,
}

/// Drive `sides` on this thread until `stop` is set or `pace.limit` has
/// passed: every `pace.tick`, each side writes its stream up to what
/// `pace.rate` allows since the start (at most `pace.burst` more) and reads
/// what is there, then `report` sees them all. Then every side closes its
/// write side and reads to EOF (bounded by `pace.drain_limit`). Returns the
/// sides, for the final checks.
pub fn pump_sides(
    mut sides: Vec<Side>,
    pace: Pace,
    stop: &AtomicBool,
    mut report: impl FnMut(&[Side]),
) -> Vec<Side> {
    let t0 = Instant::now();
    while !stop.load(Ordering::Relaxed) && t0.elapsed() < pace.limit {
        let due = (t0.elapsed().as_secs_f64() * pace.rate as f64) as u64;
        for s in sides.iter_mut() {
            // At most a burst per side per round: a pump that fell behind
            // (a loaded machine) goes on at the rate it can keep, instead
            // of each round writing more than the last one could.
            s.write_until(due.min(s.written + pace.burst));
            s.read_available();
        }
        report(&sides);
        std::thread::sleep(pace.tick);
    }
    // Finish: every side closes its write side, then reads to EOF.
    for s in sides.iter_mut() {
        if let Err(e) = s.sock.shutdown(Shutdown::Write) {
            s.error.get_or_insert(format!("shutdown: {e}"));
        }
    }
    let t1 = Instant::now();
    while sides.iter().any(|s| !s.eof && s.error.is_none()) && t1.elapsed() < pace.drain_limit {
        for s in sides.iter_mut() {
            s.read_available();
        }
        std::thread::sleep(pace.tick);
    }
    sides
}

/// Where an instance's BPF maps are pinned: `proxy::bpf::pin_dir_for` of its
/// stats socket with `expose-fd listeners` (a copy of that naming rule: the
/// tests do not link the daemon).
pub fn pin_dir(sock: &std::path::Path) -> std::path::PathBuf {
    let name: String = sock
        .to_string_lossy()
        .chars()
        .map(|c| if c == '/' || c == '.' { '_' } else { c })
        .collect();
    std::path::Path::new("/sys/fs/bpf/shunt").join(name.trim_start_matches('_'))
}
