//! The `shunt-log` thread: drains the workers' queues and delivers each line to
//! the frontend's targets: UDP datagrams, stderr/stdout writes, and `ring`s whose
//! servers are fed over TCP with RFC 6587 framing (`log-proto legacy`: a newline
//! after each message; `octet-count`: `LEN SP MSG`).
//!
//! Owns every log socket. Bounds: a ring server's backlog is the ring's `size` in
//! bytes; a line that does not fit is dropped and counted, and so is a line whose
//! datagram the kernel refused or whose TCP write failed. A ring server that is
//! down is retried every [`RECONNECT_DELAY`]; lines still in its backlog are sent
//! once it is back (as HAProxy's ring readers do).
//!
//! A UNIX datagram target (`/dev/log`) gets its own socket, connected to the
//! path when the destinations are opened at start, before a `chroot`: the
//! connected socket keeps reaching the syslog daemon from inside the chroot.
//! When a send finds the peer gone (the syslog daemon restarted and bound a
//! new socket) or it was not there at start, the socket is connected again
//! by path, at most once per [`RECONNECT_DELAY`]; in a chroot that path is
//! resolved inside it (Debian's rsyslog provides `/var/lib/haproxy/dev/log`
//! for HAProxy's chroot), as HAProxy's own sends are.
//!
//! Nothing here runs on a worker thread: a blocked write (stderr to a stuck pipe, a
//! slow TCP peer) delays only other log lines.

use std::collections::{HashMap, VecDeque};
use std::io::Write as _;
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};

use super::syslog::{frame, Framing};
use super::{Log, Msg};
use crate::config::{Config, LogDest, LogProto, Ring};

/// Pause between two connection attempts to a ring server that is down.
pub const RECONNECT_DELAY: Duration = Duration::from_millis(500);
/// Largest batch of framed messages written to a ring server at once.
const BATCH_MAX: usize = 64 << 10;

/// The backlog of one ring server: whole messages, at most `cap` bytes.
struct Backlog {
    q: Mutex<(VecDeque<Vec<u8>>, usize)>,
    cap: usize,
    ready: Notify,
}

impl Backlog {
    fn new(cap: usize) -> Self {
        Self {
            q: Mutex::new((VecDeque::new(), 0)),
            cap,
            ready: Notify::new(),
        }
    }

    /// Queue `msg`; false when it does not fit.
    fn push(&self, msg: Vec<u8>) -> bool {
        let mut g = self
            .q
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if g.1 + msg.len() > self.cap {
            return false;
        }
        g.1 += msg.len();
        g.0.push_back(msg);
        drop(g);
        self.ready.notify_one();
        true
    }

    /// Frame the queued messages into `out` (up to [`BATCH_MAX`]); the count taken.
    fn take(&self, proto: LogProto, out: &mut Vec<u8>) -> usize {
        let mut g = self
            .q
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut n = 0;
        while out.len() < BATCH_MAX {
            let Some(m) = g.0.pop_front() else { break };
            g.1 -= m.len();
            match proto {
                LogProto::Legacy => {
                    out.extend_from_slice(&m);
                    out.push(b'\n');
                }
                LogProto::OctetCount => {
                    out.extend_from_slice(format!("{} ", m.len()).as_bytes());
                    out.extend_from_slice(&m);
                }
            }
            n += 1;
        }
        n
    }
}

/// A ring and the backlog of each of its servers.
struct RingOut {
    ring: Ring,
    servers: Vec<Arc<Backlog>>,
}

/// Every destination, opened at start.
pub struct Dests {
    config: Arc<Config>,
    udp4: Option<UdpSocket>,
    udp6: Option<UdpSocket>,
    /// Behind a lock only because the queue tasks share `Dests`; they all run
    /// on this one thread, so it is never contended.
    unix: HashMap<PathBuf, Mutex<UnixTarget>>,
    rings: HashMap<String, RingOut>,
    hostname: String,
}

/// One UNIX datagram target's socket, connected to its path when it can be.
struct UnixTarget {
    sock: Option<UnixDatagram>,
    /// When the last connect was tried (reconnects are spaced by [`RECONNECT_DELAY`]).
    tried: Instant,
}

impl UnixTarget {
    fn open(path: &Path) -> Self {
        Self {
            sock: connect_unix(path).ok(),
            tried: Instant::now(),
        }
    }

    /// Send one datagram; on a socket whose peer went away (or none yet),
    /// connect again by path first, if the last try was long enough ago.
    fn send(&mut self, path: &Path, bytes: &[u8]) -> bool {
        if let Some(s) = &self.sock {
            match s.send(bytes) {
                Ok(_) => return true,
                // Full: the daemon lags; the line is lost, the socket is fine.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                Err(_) => self.sock = None,
            }
        }
        if self.tried.elapsed() < RECONNECT_DELAY {
            return false;
        }
        self.tried = Instant::now();
        self.sock = connect_unix(path).ok();
        self.sock.as_ref().is_some_and(|s| s.send(bytes).is_ok())
    }
}

fn connect_unix(path: &Path) -> std::io::Result<UnixDatagram> {
    let s = UnixDatagram::unbound()?;
    s.set_nonblocking(true)?;
    s.connect(path)?;
    Ok(s)
}

fn udp(bind: &str) -> std::io::Result<UdpSocket> {
    let s = UdpSocket::bind(bind)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

impl Dests {
    pub fn open(config: &Arc<Config>, hostname: String) -> std::io::Result<Self> {
        let targets = config
            .global
            .traffic_logs
            .iter()
            .flat_map(|l| l.targets.iter());
        let (mut v4, mut v6) = (false, false);
        let mut unix = HashMap::new();
        for t in targets {
            match &t.dest {
                LogDest::Udp(a) => {
                    v4 |= a.is_ipv4();
                    v6 |= a.is_ipv6();
                }
                LogDest::Unix(p) => {
                    unix.entry(p.clone())
                        .or_insert_with(|| Mutex::new(UnixTarget::open(p)));
                }
                _ => {}
            }
        }
        let rings = config
            .global
            .rings
            .iter()
            .map(|r| {
                let servers = r
                    .servers
                    .iter()
                    .map(|_| Arc::new(Backlog::new(r.size)))
                    .collect();
                (
                    r.name.clone(),
                    RingOut {
                        ring: r.clone(),
                        servers,
                    },
                )
            })
            .collect();
        Ok(Self {
            config: config.clone(),
            udp4: if v4 { Some(udp("0.0.0.0:0")?) } else { None },
            udp6: if v6 { Some(udp("[::]:0")?) } else { None },
            unix,
            rings,
            hostname,
        })
    }

    /// The host name read at start (rfc5424 headers, `%H`).
    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    /// Send `m` to every target of its frontend that takes its level; a line
    /// a target could not take counts in `log`'s dropped lines.
    fn deliver(&self, m: &Msg, log: &Log) {
        let Some(pl) = self.config.global.traffic_logs.get(m.fe) else {
            return;
        };
        for t in &pl.targets {
            if m.level > t.level {
                continue;
            }
            let level = m.level.max(t.minlevel);
            let mut fr = Framing {
                format: t.format,
                facility: t.facility,
                level,
                maxlen: t.maxlen,
            };
            match &t.dest {
                LogDest::Udp(a) => {
                    let sock = if a.is_ipv4() { &self.udp4 } else { &self.udp6 };
                    let bytes = frame(&fr, m.at, &self.hostname, &m.line, true);
                    let sent = sock.as_ref().map(|s| s.send_to(&bytes, a));
                    if !matches!(sent, Some(Ok(_))) {
                        log.drop_line();
                    }
                }
                LogDest::Unix(path) => {
                    let bytes = frame(&fr, m.at, &self.hostname, &m.line, true);
                    let sent = self.unix.get(path).is_some_and(|u| {
                        u.lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .send(path, &bytes)
                    });
                    if !sent {
                        log.drop_line();
                    }
                }
                LogDest::Stderr | LogDest::Stdout => {
                    let bytes = frame(&fr, m.at, &self.hostname, &m.line, true);
                    let r = if t.dest == LogDest::Stderr {
                        std::io::stderr().lock().write_all(&bytes)
                    } else {
                        std::io::stdout().lock().write_all(&bytes)
                    };
                    if r.is_err() {
                        log.drop_line();
                    }
                }
                LogDest::Ring(name) => {
                    let Some(out) = self.rings.get(name) else {
                        log.drop_line();
                        continue;
                    };
                    // The ring's format decides the header; both lengths bound it.
                    fr.format = out.ring.format;
                    fr.maxlen = fr.maxlen.min(out.ring.maxlen);
                    let bytes = frame(&fr, m.at, &self.hostname, &m.line, false);
                    let mut all = true;
                    for b in &out.servers {
                        all &= b.push(bytes.clone());
                    }
                    if !all {
                        log.drop_line();
                    }
                }
            }
        }
    }
}

/// The thread's body: a current-thread runtime running one forwarder per ring
/// server and one drain task per worker queue.
pub fn run(
    dests: Dests,
    mut register: mpsc::UnboundedReceiver<mpsc::Receiver<Msg>>,
    log: Arc<Log>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "log thread: cannot build its runtime; traffic logs are off");
            return;
        }
    };
    let dests = Arc::new(dests);
    rt.block_on(async move {
        for out in dests.rings.values() {
            for (srv, backlog) in out.ring.servers.iter().zip(&out.servers) {
                tokio::spawn(forward(
                    out.ring.name.clone(),
                    srv.addr,
                    srv.proto,
                    out.ring.timeout_connect,
                    out.ring.timeout_server,
                    backlog.clone(),
                    log.clone(),
                ));
            }
        }
        while let Some(mut rx) = register.recv().await {
            let (d, log) = (dests.clone(), log.clone());
            tokio::spawn(async move {
                while let Some(m) = rx.recv().await {
                    d.deliver(&m, &log);
                }
            });
        }
    });
}

/// Feed one ring server forever: connect, write the backlog as it fills,
/// reconnect after an error. A batch whose write failed is lost and counted.
async fn forward(
    ring: String,
    addr: SocketAddr,
    proto: LogProto,
    t_connect: Duration,
    t_server: Duration,
    backlog: Arc<Backlog>,
    log: Arc<Log>,
) {
    let mut buf = Vec::with_capacity(BATCH_MAX);
    loop {
        let mut stream = match tokio::time::timeout(t_connect, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(%ring, %addr, error = %e, "ring server unreachable");
                tokio::time::sleep(RECONNECT_DELAY).await;
                continue;
            }
            Err(_) => {
                tracing::debug!(%ring, %addr, "ring server connect timeout");
                tokio::time::sleep(RECONNECT_DELAY).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        loop {
            buf.clear();
            let n = backlog.take(proto, &mut buf);
            if n == 0 {
                // Idle: wait for lines, and notice a server that went away (a
                // syslog server sends nothing, so any read result ends the link).
                let mut probe = [0u8; 64];
                tokio::select! {
                    _ = backlog.ready.notified() => continue,
                    _ = stream.read(&mut probe) => {
                        tracing::debug!(%ring, %addr, "ring server closed the connection");
                        break;
                    }
                }
            }
            match tokio::time::timeout(t_server, stream.write_all(&buf)).await {
                Ok(Ok(())) => {}
                _ => {
                    tracing::debug!(%ring, %addr, lost = n, "ring server write failed; reconnecting");
                    for _ in 0..n {
                        log.drop_line();
                    }
                    break;
                }
            }
        }
    }
}
