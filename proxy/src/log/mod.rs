//! Traffic logs: one line per flow, sent to syslog (UDP, or TCP through a `ring`),
//! stderr or stdout, as HAProxy's `log` / `option tcplog` / `log-format`.
//!
//! Owns the process's log system ([`Log`]: the `DroppedLogs` counter and, once
//! [`Opened::start`] ran, the way to the log thread; the runtime holds it) and
//! the per-flow record kept by the session ([`FlowGuard`]).
//!
//! Logging never blocks forwarding. A worker renders the line and `try_send`s it
//! into its own bounded queue ([`QUEUE_DEPTH`] lines); a full queue drops the line
//! and counts it. Everything slow (syscalls, TCP to the log server, reconnects)
//! happens on the `shunt-log` thread (see [`sender`]), whose own buffers are
//! bounded too (a ring's `size`): a slow or dead log server costs dropped lines,
//! never latency on a worker.
//!
//! Race window: the log thread starts after the workers may have accepted their
//! first flow; a worker that logs before [`Opened::start`] ran finds no system and its
//! line is counted as dropped (start-up order in `daemon.rs` makes it unreachable).
//!
//! Each worker's queue is a thread-local of its executor thread (the one kind
//! of process-wide state the layering allows), made on first use and
//! registered with the process's one started [`Log`].

pub mod format;
mod sender;
pub mod syslog;
mod time;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime};

use tokio::sync::mpsc;

use crate::config::Config;
use format::{Cause, FlowLog, Names, Phase};

/// Lines one worker may have waiting for the log thread; more are dropped.
pub const QUEUE_DEPTH: usize = 4096;

thread_local! {
    /// This worker's queue to the log thread, made on first use.
    static QUEUE: RefCell<Option<mpsc::Sender<Msg>>> = const { RefCell::new(None) };
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("cannot start the log thread: {0}")]
    Thread(std::io::Error),
    #[error("cannot open a UDP socket for the log targets: {0}")]
    Socket(std::io::Error),
}

/// One line on its way to the log thread.
#[derive(Debug)]
struct Msg {
    fe: usize,
    level: u8,
    at: SystemTime,
    line: String,
}

struct System {
    /// New workers' queues, handed to the log thread.
    register: mpsc::UnboundedSender<mpsc::Receiver<Msg>>,
    /// The host name (rfc5424 headers, `%H`), read once at start.
    hostname: String,
}

/// The process's log system, held by the runtime: the count of dropped lines
/// and, once started, the way to the log thread.
#[derive(Default)]
pub struct Log {
    /// Log lines dropped since start (queue full, ring full, send failed).
    dropped: AtomicU64,
    /// Set by [`Opened::start`]; unset, every line is dropped and counted.
    system: OnceLock<System>,
}

impl Log {
    /// Log lines dropped since start (`show info` `DroppedLogs`).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn drop_line(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// The host name read at start ("" before it).
    fn hostname(&self) -> &str {
        self.system.get().map_or("", |s| s.hostname.as_str())
    }
}

/// The host name for rfc5424 headers and `%H`.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The log targets, opened (sockets made) but not yet served: see [`open`].
pub struct Opened(sender::Dests);

/// Open the log targets when any frontend logs: the step that can fail, run
/// at start-up before anything of a running predecessor is touched.
pub fn open(config: &Arc<Config>) -> Result<Option<Opened>, LogError> {
    if !config
        .global
        .traffic_logs
        .iter()
        .any(|l| !l.targets.is_empty())
    {
        return Ok(None);
    }
    let dests = sender::Dests::open(config, hostname()).map_err(LogError::Socket)?;
    Ok(Some(Opened(dests)))
}

impl Opened {
    /// Start the log thread serving `log`. Call once, after privileges were
    /// dropped (the thread must not keep capabilities).
    pub fn start(self, log: &Arc<Log>) -> Result<(), LogError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let dests = self.0;
        let hostname = dests.hostname().to_string();
        let thread_log = log.clone();
        std::thread::Builder::new()
            .name("shunt-log".to_string())
            .spawn(move || sender::run(dests, rx, thread_log))
            .map_err(LogError::Thread)?;
        // A second start keeps the first system.
        let _ = log.system.set(System {
            register: tx,
            hostname,
        });
        Ok(())
    }
}

/// Queue `line` of frontend `fe` at `level` from this thread.
fn emit(log: &Log, fe: usize, level: u8, line: String) {
    let Some(sys) = log.system.get() else {
        log.drop_line();
        return;
    };
    let msg = Msg {
        fe,
        level,
        at: SystemTime::now(),
        line,
    };
    QUEUE.with(|q| {
        let mut q = q.borrow_mut();
        let tx = q.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
            let _ = sys.register.send(rx);
            tx
        });
        if tx.try_send(msg).is_err() {
            log.drop_line();
        }
    });
}

/// The log record of one flow, emitted when it drops (every exit path of the
/// session, including a hard stop that cancels the flow: `K` then).
pub struct FlowGuard {
    /// Boxed: the guard lives in the flow's future for the whole flow, and a flow
    /// whose frontend logs nothing (or logged at accept) should carry 8 bytes, not
    /// the whole record.
    inner: Option<Box<Inner>>,
}

/// What a flow's log line reads from the running process when it is sent:
/// the configuration, the gauges and the log system. Implemented by the
/// runtime, so that this module needs nothing above it nor `stats` beside it.
pub trait Process: Send + Sync {
    fn config(&self) -> &Config;
    fn log(&self) -> &Log;
    /// Flows in the process now (`%ac`).
    fn conns(&self) -> usize;
    /// Current flows of frontend `fe` (`%fc`; 0 for an unknown index).
    fn frontend_conns(&self, fe: usize) -> usize;
    /// Current flows of backend `be` (`%bc`; 0 for an unknown index).
    fn backend_conns(&self, be: usize) -> usize;
    /// Current flows of server `srv` of backend `be` (`%sc`; 0 for an unknown index).
    fn server_conns(&self, be: usize, srv: usize) -> usize;
}

struct Inner {
    state: Arc<dyn Process>,
    rec: FlowLog,
    start: Instant,
    /// When the flow started waiting for a server slot / connecting.
    mark: Instant,
}

impl FlowGuard {
    /// A record for a flow accepted on `fe`; inert when that frontend logs nothing.
    /// With the default format, the "Connect from" line is emitted now (at the
    /// end with `option dontlognull`, and only if the client sent data).
    pub fn new(
        state: &Arc<impl Process + 'static>,
        fe: usize,
        peer: SocketAddr,
        local: Option<SocketAddr>,
    ) -> Self {
        Self::accepted_at(state, fe, peer, local, SystemTime::now())
    }

    /// [`FlowGuard::new`] for a flow accepted at `accept` (`%t`), earlier than
    /// now when the session read a PROXY header first.
    pub fn accepted_at(
        state: &Arc<impl Process + 'static>,
        fe: usize,
        peer: SocketAddr,
        local: Option<SocketAddr>,
        accept: SystemTime,
    ) -> Self {
        let Some(pl) = state.config().global.traffic_logs.get(fe) else {
            return Self { inner: None };
        };
        if pl.targets.is_empty() {
            return Self { inner: None };
        }
        let mut rec = FlowLog::new(fe, peer, local);
        rec.accept = accept;
        rec.cause = Cause::Killed;
        let now = Instant::now();
        let inner = Inner {
            state: state.clone() as Arc<dyn Process>,
            rec,
            start: now,
            mark: now,
        };
        // With `option dontlognull` the line waits for the flow's end: only
        // then is it known whether the client sent anything (HAProxy logs no
        // connection without data, such as a port probe).
        if pl.at_accept && !pl.dontlognull {
            inner.send();
            return Self { inner: None };
        }
        Self {
            inner: Some(Box::new(inner)),
        }
    }

    fn with(&mut self, f: impl FnOnce(&mut Inner)) {
        if let Some(i) = self.inner.as_mut() {
            f(i);
        }
    }

    /// The flow was routed to backend `be` and waits for a server slot.
    pub fn routed(&mut self, be: usize) {
        self.with(|i| {
            i.rec.be = Some(be);
            i.rec.phase = Phase::Queue;
            i.mark = Instant::now();
        });
    }

    /// A server slot was granted: queueing is over, connecting starts.
    pub fn assigned(&mut self, srv: usize) {
        self.with(|i| {
            if i.rec.tw < 0 {
                i.rec.tw = ms(i.mark.elapsed());
                i.mark = Instant::now();
            }
            i.rec.srv = Some(srv);
            i.rec.phase = Phase::Connect;
        });
    }

    /// A connection attempt failed and another one follows.
    pub fn retried(&mut self, redispatched: bool) {
        self.with(|i| {
            i.rec.retries += 1;
            i.rec.redispatched |= redispatched;
        });
    }

    /// Connected to the server: data phase. `addrs` gives the server's
    /// address and the connection's own (`%si:%sp`, `%bi:%bp`); it is called
    /// only when the flow is logged, so an unlogged flow makes no
    /// getpeername/getsockname for them.
    pub fn connected(&mut self, addrs: impl FnOnce() -> (Option<SocketAddr>, Option<SocketAddr>)) {
        self.with(|i| {
            i.rec.tc = ms(i.mark.elapsed());
            (i.rec.server_addr, i.rec.backend_addr) = addrs();
            i.rec.phase = Phase::Data;
        });
    }

    /// The flow ended with `cause` in its current phase.
    pub fn end(&mut self, cause: Cause) {
        self.with(|i| i.rec.cause = cause);
    }

    /// The flow ended with `cause` in `phase`.
    pub fn end_at(&mut self, cause: Cause, phase: Phase) {
        self.with(|i| {
            i.rec.cause = cause;
            i.rec.phase = phase;
        });
    }

    /// No line for this flow here: it goes on in another process (a reload
    /// handed it over), which logs it when it ends.
    pub fn discard(&mut self) {
        self.inner = None;
    }

    /// The data phase ended: bytes each way and the mode used.
    pub fn forwarded(&mut self, up: u64, down: u64, mode: &'static str, cause: Cause) {
        self.with(|i| {
            i.rec.bytes_up = up;
            i.rec.bytes_down = down;
            i.rec.mode = Some(mode);
            i.rec.cause = cause;
            if cause == Cause::Normal {
                i.rec.phase = Phase::Closed;
            }
        });
    }
}

fn ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Inner {
    /// Render and queue the line (gauges read now, minus this flow as HAProxy's
    /// end-of-flow lines show them).
    fn send(&self) {
        let st = &self.state;
        let cfg = st.config();
        let fe = self.rec.fe;
        let Some(pl) = cfg.global.traffic_logs.get(fe) else {
            return;
        };
        if pl.dontlognull && self.rec.bytes_up == 0 {
            return;
        }
        let mut rec = self.rec.clone();
        if !pl.at_accept {
            rec.tt = ms(self.start.elapsed());
        }
        // This flow still holds the process gauge (released after the session).
        rec.actconn = st.conns().saturating_sub(1);
        rec.feconn = st.frontend_conns(fe);
        if let Some(be) = rec.be {
            rec.beconn = st.backend_conns(be);
            if let Some(srv) = rec.srv {
                rec.srvconn = st.server_conns(be, srv);
            }
        }
        let backend = rec.be.and_then(|b| cfg.backends.get(b));
        let hostname = st.log().hostname();
        let names = Names {
            frontend: cfg.frontends.get(fe).map_or("", |f| f.name.as_str()),
            backend: backend.map(|b| b.name.as_str()),
            server: rec
                .srv
                .and_then(|s| backend.and_then(|b| b.servers.get(s)))
                .map(|s| s.name.as_str()),
            hostname,
        };
        let mut line = String::with_capacity(160);
        pl.format.render(&rec, &names, &mut line);
        emit(st.log(), fe, syslog::LEVEL_INFO, line);
    }
}

impl Drop for FlowGuard {
    fn drop(&mut self) {
        if let Some(i) = self.inner.take() {
            i.send();
        }
    }
}

/// HAProxy's line for a connection that failed before it became a session
/// (`session_kill_embryonic`: a bad or missing PROXY header), at level info:
/// `CLIENT:PORT [ACCEPT DATE] FRONTEND/LISTENER: MESSAGE`, the client being
/// the connection's real one. `silent_if_null`: the client sent nothing (it
/// closed, or the read failed), which `option dontlognull` does not log.
pub fn connection_error(
    state: &Arc<impl Process + 'static>,
    fe: usize,
    client: SocketAddr,
    accept: SystemTime,
    listener: &str,
    msg: &dyn std::fmt::Display,
    silent_if_null: bool,
) {
    use std::fmt::Write;
    let cfg = state.config();
    let Some(pl) = cfg.global.traffic_logs.get(fe) else {
        return;
    };
    if pl.targets.is_empty() || (pl.dontlognull && silent_if_null) {
        return;
    }
    let name = cfg.frontends.get(fe).map_or("", |f| f.name.as_str());
    let mut line = String::with_capacity(128);
    let _ = write!(line, "{}:{} [", client.ip(), client.port());
    format::write_accept_date(accept, &mut line);
    let _ = write!(line, "] {name}/{listener}: {msg}");
    emit(state.log(), fe, syslog::LEVEL_INFO, line);
}

/// Map a forwarding end to the `%ts` cause.
pub fn cause_of(end: &crate::handoff::End) -> Cause {
    use crate::handoff::{End, Origin};
    match end {
        End::Done => Cause::Normal,
        End::ClientReset => Cause::ClientAbort,
        End::ServerReset
        | End::Error {
            origin: Origin::Server,
            ..
        } => Cause::ServerAbort,
        End::Error {
            origin: Origin::Client,
            ..
        } => Cause::ClientAbort,
        // shunt's own failure: HAProxy's 'P' (proxy) termination cause.
        End::Error {
            origin: Origin::Internal,
            ..
        } => Cause::Proxy,
        End::ClientTimeout => Cause::ClientTimeout,
        End::ServerTimeout => Cause::ServerTimeout,
    }
}

#[cfg(test)]
mod tests;
