//! One flow, top to bottom: accept → `tcp-request connection` rules (with
//! `track-sc*`) → the PROXY header (`accept-proxy`, `expect-proxy`) → the
//! TLS handshake (`bind ... ssl`) → `tcp-request content` rules → route →
//! `stick` rules → pick a server (queue) → connect (retries, redispatch;
//! `send-proxy` writes the header; `server ... ssl` its handshake) → stick
//! stores → hand off → account → close.
//!
//! A flow with TLS on either side holds its sockets as `handoff::tls::Stream`
//! (the TLS state boxed, so a plain flow's future is no larger) and is
//! forwarded by `handoff::tls::forward_tls`, boxed (which hands a terminated
//! client with a plain server to kTLS where the kernel has it); a plain flow
//! takes `handoff::forward` as before.
//!
//! The client's address is `peer` and the address it reached `dst`, both
//! taken once, after the PROXY header if one is read; from then on every
//! reader (conditions, maps, `balance source`, the log, `show sess`, the
//! header sent to a server) gets them from here, never from the socket.
//!
//! Owns nothing beyond the flow's lifetime: the client socket, the server slot
//! and connection, and the gauges it opened (`scur` on frontend, backend and
//! server) and the stick-table entries it tracks (`stick::Tracker`), all
//! released by guards so every exit path, including the future being
//! dropped at hard stop, leaves counters, queues and tables consistent.

use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::config::acl::Request;
use crate::config::{
    AclCtx, Backend, ContentAction, ContentRule, ForwardMode, Frontend, KeyFetch, ProxyVersion,
    StickCtx, TcpConnAction, TrackSc, UseBackend,
};
use crate::handoff::tls::Stream;
use crate::handoff::{self, End, Meter, Mode, Plan, Promote};
use crate::inspect::Inspect;
use crate::lb::spares::{ConnectError, ConnectOpts};
use crate::lb::AcquireError;
use crate::log::format::{Cause, Phase as LogPhase};
use crate::log::FlowGuard;
use crate::proxy_proto::{self, Encoded, ParseError};
use crate::runtime::Runtime;
use crate::stats::{flows, Counters, Event};
use crate::stick::{Key, Tracker};

/// Upper bound on HAProxy's turn-around delay between two connection attempts.
const RETRY_TURNAROUND_MAX: Duration = Duration::from_secs(1);

/// Keeps a `scur` gauge open while alive.
struct Open<'a>(&'a Counters);

impl<'a> Open<'a> {
    fn new(c: &'a Counters) -> Self {
        c.open();
        Open(c)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Live byte accounting for one flow: frontend, backend and server counters.
struct FlowMeter<'a> {
    fe: &'a Counters,
    be: &'a Counters,
    srv: &'a Counters,
    route: handoff::FlowRoute,
    /// The flow's registry entry (`show sess`) and the process's mode counters.
    flow: u64,
    modes: &'a crate::stats::ModeCounters,
    /// The PROXY header's length, when the client sent one.
    consumed: u64,
}

impl Meter for FlowMeter<'_> {
    fn to_server(&self, n: u64) {
        self.fe.add_in(n);
        self.be.add_in(n);
        self.srv.add_in(n);
    }
    fn to_client(&self, n: u64) {
        self.fe.add_out(n);
        self.be.add_out(n);
        self.srv.add_out(n);
    }
    fn route(&self) -> Option<handoff::FlowRoute> {
        Some(self.route)
    }
    fn promoted(&self) {
        self.modes.promote();
        flows::promoted(self.flow);
    }
    fn ktls(&self) {
        self.modes.ktls();
    }
    fn client_consumed(&self) -> u64 {
        self.consumed
    }
}

/// The backend a flow from `peer` routes to: HAProxy's switching rules. The first
/// `use_backend` rule whose condition holds (or that has none) decides:
/// - `use_backend NAME` → that backend;
/// - `use_backend %[src,map_ip(FILE[,DEFAULT])]` → the backend the longest matching key's
///   value names, else the one DEFAULT names; a value that names no backend (or no match
///   and no DEFAULT) ends the rules and `default_backend` applies.
/// - `use_backend %[req.ssl_sni,map(FILE[,DEFAULT])]` / `map_dom` / `map_beg` → the
///   same with the TLS server name, read by peeking at the client's ClientHello; an
///   absent, malformed or late (after `tcp-request inspect-delay`) hello gives no name,
///   hence no backend name: `default_backend` (HAProxy's converter default only
///   answers a name the map does not hold).
///
/// No rule applies → `default_backend`. The hello is waited for once, when the first
/// rule that needs the name (an SNI map or a `req.ssl_sni` condition) is reached, up to
/// the inspect-delay from then; conditions see the request bytes as they are (HAProxy's
/// switching rules do not wait: the content rules do). The map lookup is one lock-free
/// load and a hash probe per prefix length in use, or per label for `map_dom`
/// (`maps/table.rs`); a condition is a walk of its compiled tree.
///
/// On a `bind ... ssl` listener the name is the one of the handshake shunt
/// terminated (nothing is peeked: the socket carries TLS records).
async fn route(
    state: &Runtime,
    fe: &Frontend,
    peer: SocketAddr,
    dst: Option<SocketAddr>,
    client: &mut Stream,
    inspect: &mut Inspect,
    stick: &dyn StickCtx,
) -> Option<usize> {
    let mut waited = false;
    // Terminated here: the handshake's name, and no peeking at TLS records.
    let tls_sni = match &*client {
        Stream::Accepted(t) => Some(t.get_ref().1.server_name().map(str::to_string)),
        _ => None,
    };
    if fe
        .use_backend_conds
        .iter()
        .flatten()
        .any(|c| c.reads_content())
    {
        // What has arrived by now, as HAProxy's buffer holds it (a TLS
        // client's plaintext).
        inspect.look(client);
    }
    for (rule, cond) in fe.use_backends.iter().zip(&fe.use_backend_conds) {
        let wants_sni = matches!(rule, UseBackend::SniMap { .. })
            || cond.as_ref().is_some_and(|c| c.uses_sni());
        if wants_sni && !waited && tls_sni.is_none() {
            waited = true;
            wait_hello(inspect, client, fe.timeouts.inspect_delay).await;
        }
        let sni = match &tls_sni {
            Some(name) => name.as_deref(),
            None => inspect.sni(),
        };
        if let Some(c) = cond {
            let ctx = AclCtx {
                src: peer,
                dst,
                sni,
                req: inspect.request(false),
                counts: state,
                stick: Some(stick),
            };
            if !c.eval(&ctx) {
                continue;
            }
        }
        let found = match rule {
            UseBackend::Static(be) => return Some(*be),
            UseBackend::SrcMap {
                map,
                default_target,
                ..
            } => state.maps.route(*map, peer.ip()).unwrap_or(*default_target),
            UseBackend::SniMap {
                map,
                how,
                default_target,
                ..
            } => match sni {
                // As HAProxy: no name, no sample, so no backend name at all
                // (the converter's default answers a lookup that misses).
                None => None,
                Some(n) => state
                    .maps
                    .route_name(*map, n, *how)
                    .unwrap_or(*default_target),
            },
        };
        return found.or(fe.default_backend);
    }
    fe.default_backend
}

/// Peek until the ClientHello is complete (or cannot be), up to `delay` from
/// now; `None` judges only what has already arrived.
async fn wait_hello(inspect: &mut Inspect, client: &mut Stream, delay: Option<Duration>) {
    let deadline = tokio::time::Instant::now() + delay.unwrap_or(Duration::ZERO);
    inspect.look(client);
    while !inspect.sni_decided() && tokio::time::Instant::now() < deadline {
        inspect.wait_more(client, deadline).await;
    }
    if !inspect.sni_decided() {
        tracing::debug!(
            have = inspect.bytes().len(),
            "incomplete TLS ClientHello at inspect-delay"
        );
    }
}

/// The verdict of a proxy's `tcp-request content` rules, HAProxy's
/// `tcp_inspect_request`: the rules run in order on the request bytes peeked
/// so far; the first `accept` or `reject` whose condition holds decides, and
/// none → accepted; a `track-scN` rule whose condition holds tracks (in
/// `tracker`, seen by the rules after it) and the walk goes on. A
/// condition that more bytes could still decide (`Miss`:
/// a payload shorter than asked, an incomplete ClientHello, `req.len` not
/// matching yet) stops the walk until bytes arrive, the client closes, the
/// buffer is full or `delay` (the proxy's `tcp-request inspect-delay`, from
/// now) ends; then they run again, the last time with every fetch final. No
/// delay → one final run on what is there. Nothing is consumed from a plain
/// client; a TLS client's plaintext is read into `inspect`, for the server
/// first.
async fn content_rules(
    state: &Runtime,
    tracker: &mut Tracker<'_>,
    rules: &[ContentRule],
    delay: Option<Duration>,
    (peer, dst): (SocketAddr, Option<SocketAddr>),
    client: &mut Stream,
    inspect: &mut Inspect,
) -> ContentAction {
    if rules.is_empty() {
        return ContentAction::Accept;
    }
    let deadline = tokio::time::Instant::now() + delay.unwrap_or(Duration::ZERO);
    inspect.look(client);
    loop {
        let more = tokio::time::Instant::now() < deadline;
        let mut undecided = false;
        for rule in rules {
            let ctx = AclCtx {
                src: peer,
                dst,
                sni: inspect.sni(),
                req: inspect.request(more),
                counts: state,
                stick: Some(&*tracker),
            };
            match rule.cond.as_ref().map_or(Some(true), |c| c.applies(&ctx)) {
                // Tracking twice is a no-op (a rerun after more bytes came).
                Some(true) => match &rule.action {
                    ContentAction::TrackSc(t) => track(tracker, t, peer, dst),
                    decided => return decided.clone(),
                },
                Some(false) => {}
                None => {
                    undecided = true;
                    break;
                }
            }
        }
        if !undecided {
            return ContentAction::Accept;
        }
        inspect.wait_more(client, deadline).await;
    }
}

/// The verdict of the frontend's `tcp-request connection` rules on a new
/// connection: `None` when refused, else whether an `expect-proxy` rule
/// asked for a PROXY header. As HAProxy's `tcp_exec_l4_rules`, the first
/// `accept` or `reject` whose condition holds ends the rules; `expect-proxy`
/// marks the connection and the rules go on. All of them run before the
/// header is read, so they see the real addresses. Nothing has been read
/// yet, so a `req.ssl_sni` term sees no name (the parser warned). A
/// `track-scN` rule tracks in `tracker`, and the rules after it see the
/// counters ([`track`]).
fn connection_rules(
    state: &Runtime,
    fe: &Frontend,
    peer: SocketAddr,
    dst: Option<SocketAddr>,
    tracker: &mut Tracker<'_>,
) -> Option<bool> {
    let mut expect_proxy = false;
    for rule in &fe.tcp_connection {
        let holds = rule.cond.as_ref().is_none_or(|c| {
            c.eval(&AclCtx {
                src: peer,
                dst,
                sni: None,
                req: Request::NONE,
                counts: state,
                stick: Some(&*tracker),
            })
        });
        if holds {
            match &rule.action {
                TcpConnAction::Accept => break,
                TcpConnAction::Reject => return None,
                TcpConnAction::ExpectProxy => expect_proxy = true,
                TcpConnAction::TrackSc(t) => track(tracker, t, peer, dst),
            }
        }
    }
    Some(expect_proxy)
}

/// `track-scN KEY [table T]`: counter N tracks the key's entry (created,
/// or evicting the oldest untracked one when full), counting the
/// connection in its `conn_*`. A key that cannot be made (no `dst`, an
/// IPv6 client in an `ip` table) tracks nothing, as HAProxy's failed fetch.
fn track(tracker: &mut Tracker<'_>, t: &TrackSc, peer: SocketAddr, dst: Option<SocketAddr>) {
    if let Some(ip) = key_addr(t.key, peer, dst) {
        tracker.track(t.sc, t.table.index, ip);
    }
}

/// The address a key is made from (`src`, `dst`); `None` without one.
fn key_addr(k: KeyFetch, peer: SocketAddr, dst: Option<SocketAddr>) -> Option<std::net::IpAddr> {
    match k {
        KeyFetch::Src => Some(peer.ip()),
        KeyFetch::Dst => dst.map(|d| d.ip()),
    }
}

/// The most `stick store-request` rules one flow applies (HAProxy keeps 8
/// keys per stream; a bit each here): a backend with more stores with the
/// first ones.
const MAX_STICK_STORES: usize = u32::BITS as usize;

/// What a backend's `stick` rules decided before the pick: the server a
/// `stick match` found (by index in the backend), and which store rules
/// held (bit `i`: rule `i`). The keys are made again from the addresses
/// when storing, so while it connects the flow's future holds two words,
/// not the keys.
struct Sticking {
    server: Option<usize>,
    stores: u32,
}

/// The backend's `stick` rules in order, as HAProxy's
/// `process_sticking_rules`: the first `match` that finds a server id of
/// this backend decides the server; every `store` whose condition holds
/// is marked. No allocation for an IP key.
fn stick_rules(
    state: &Runtime,
    be: &Backend,
    peer: SocketAddr,
    dst: Option<SocketAddr>,
    stick: &dyn StickCtx,
) -> Sticking {
    let mut out = Sticking {
        server: None,
        stores: 0,
    };
    let now = state.tables.now_ms();
    for (i, rule) in be.stick.iter().enumerate().take(MAX_STICK_STORES) {
        let ctx = AclCtx {
            src: peer,
            dst,
            sni: None,
            req: Request::NONE,
            counts: state,
            stick: Some(stick),
        };
        if !rule.cond.as_ref().is_none_or(|c| c.eval(&ctx)) {
            continue;
        }
        let Some(table) = state.tables.get(rule.table.index) else {
            continue;
        };
        let Some(key) =
            key_addr(rule.key, peer, dst).and_then(|ip| Key::of_addr(table.spec().key, ip))
        else {
            continue;
        };
        if rule.kind.matches() && out.server.is_none() {
            out.server = table.server_of(&key, now).and_then(|id| {
                be.servers
                    .iter()
                    .position(|s| i64::from(s.id) == i64::from(id))
            });
        }
        if rule.kind.stores() {
            out.stores |= 1 << i;
        }
    }
    out
}

/// The flow has its server: the key of every store rule that held now
/// points at it.
fn stick_store(
    state: &Runtime,
    be: &Backend,
    sticking: &Sticking,
    peer: SocketAddr,
    dst: Option<SocketAddr>,
    server: &crate::lb::ServerRt,
) {
    if sticking.stores == 0 {
        return;
    }
    let now = state.tables.now_ms();
    let id = i32::try_from(server.id).unwrap_or(i32::MAX);
    for (i, rule) in be.stick.iter().enumerate().take(MAX_STICK_STORES) {
        if sticking.stores & (1 << i) == 0 {
            continue;
        }
        let Some(table) = state.tables.get(rule.table.index) else {
            continue;
        };
        if let Some(key) =
            key_addr(rule.key, peer, dst).and_then(|ip| Key::of_addr(table.spec().key, ip))
        {
            table.store_server(&key, now, id, &server.name);
        }
    }
}

/// Bytes peeked for a PROXY header. HAProxy reads the header from one buffer
/// (`tune.bufsize`, 16 KiB by default), so a v2 header with more TLVs than
/// that is truncated there as here. On the stack of a synchronous call, never
/// in the flow's future.
const PROXY_PEEK_MAX: usize = 16 * 1024;

/// Bound on the wait for a PROXY header when the frontend has no `timeout
/// client` (HAProxy would wait for ever): long enough for any real sender,
/// which writes the header at once, short enough that silent connections do
/// not pile up.
const PROXY_WAIT_DEFAULT: Duration = Duration::from_secs(30);

/// Why no PROXY header was read; `Display` is HAProxy's log message.
#[derive(Debug, thiserror::Error)]
enum HeaderError {
    #[error("Connection closed while waiting for PROXY protocol header")]
    Empty,
    #[error("Connection error while waiting for PROXY protocol header")]
    Abort(#[source] std::io::Error),
    #[error("Timeout while waiting for PROXY protocol header")]
    Timeout,
    #[error(transparent)]
    Parse(#[from] ParseError),
}

impl HeaderError {
    /// The client sent nothing usable: not logged with `option dontlognull`
    /// (HAProxy's `CO_ER_PRX_EMPTY` and `CO_ER_PRX_ABORT`).
    fn null(&self) -> bool {
        matches!(self, HeaderError::Empty | HeaderError::Abort(_))
    }
}

/// Read the PROXY header the client starts with, within `limit` (the
/// frontend's `timeout client`, as HAProxy). Exactly the header's bytes are
/// consumed: they are peeked, judged, then read, so what follows stays queued
/// for the forwarding. As HAProxy, the whole header must be in the first
/// bytes that arrive (the protocol has the sender write it at once); a
/// prefix is `Truncated`, never waited on.
async fn read_proxy_header(
    client: &TcpStream,
    limit: Option<Duration>,
) -> Result<proxy_proto::Header, HeaderError> {
    let deadline = tokio::time::Instant::now() + limit.unwrap_or(PROXY_WAIT_DEFAULT);
    loop {
        match tokio::time::timeout_at(deadline, client.readable()).await {
            Err(_) => return Err(HeaderError::Timeout),
            Ok(Err(e)) => return Err(HeaderError::Abort(e)),
            Ok(Ok(())) => {}
        }
        match client.try_io(tokio::io::Interest::READABLE, || take_header(client)) {
            Ok(r) => return r,
            // Readiness was stale: wait again.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(HeaderError::Abort(e)),
        }
    }
}

/// One peek and, if it holds a whole header, the read of exactly that header.
/// The outer error is only the peek's `WouldBlock`, returned to `try_io` so
/// that tokio clears the socket's readiness.
fn take_header(client: &TcpStream) -> std::io::Result<Result<proxy_proto::Header, HeaderError>> {
    use crate::sys::sock::recv_nowait;
    let mut buf = [0u8; PROXY_PEEK_MAX];
    let n = match recv_nowait(client.as_fd(), &mut buf, true) {
        Ok(0) => return Ok(Err(HeaderError::Empty)),
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Err(e),
        Err(e) => return Ok(Err(HeaderError::Abort(e))),
    };
    let h = match proxy_proto::parse(&buf[..n]) {
        Ok(h) => h,
        Err(e) => return Ok(Err(e.into())),
    };
    // The bytes just peeked are queued; reading exactly `h.len` of them
    // consumes the header and nothing after it.
    Ok(
        match recv_nowait(client.as_fd(), &mut buf[..h.len], false) {
            Ok(got) if got == h.len => Ok(h),
            Ok(got) => Err(HeaderError::Abort(std::io::Error::other(format!(
                "read {got} of the {} header bytes peeked",
                h.len
            )))),
            Err(e) => Err(HeaderError::Abort(e)),
        },
    )
}

/// The client's TLS server name: from the handshake shunt terminated, else
/// from its peeked ClientHello ([`peek_sni`]).
async fn client_sni(client: &Stream, delay: Option<Duration>) -> Option<String> {
    match client {
        Stream::Accepted(t) => t.get_ref().1.server_name().map(str::to_string),
        other => peek_sni(other.tcp(), delay).await,
    }
}

/// Why a client's TLS handshake failed; `Display` is HAProxy's log message
/// (`CO_ER_SSL_*`).
#[derive(Debug, thiserror::Error)]
enum HandshakeError {
    #[error("Connection closed during SSL handshake")]
    Empty,
    #[error("Connection error during SSL handshake")]
    Abort(#[source] std::io::Error),
    #[error("Timeout during SSL handshake")]
    Timeout,
    #[error("SSL handshake failure")]
    Failure(#[source] std::io::Error),
}

impl HandshakeError {
    /// The client sent nothing usable: not logged with `option dontlognull`.
    fn null(&self) -> bool {
        matches!(self, HandshakeError::Empty | HandshakeError::Abort(_))
    }
}

/// Bound on a client's TLS handshake when the frontend has no `timeout
/// client` (HAProxy would wait for ever): as the PROXY header's.
const HANDSHAKE_WAIT_DEFAULT: Duration = PROXY_WAIT_DEFAULT;

/// Terminate the client's TLS within `limit` (`timeout client`, as HAProxy).
/// rustls reads whole records only (`handoff::ktls::Framed`), so that the
/// flow can leave it after the handshake, for kTLS or shunt's own records.
async fn accept_tls(
    acceptor: &tokio_rustls::TlsAcceptor,
    client: TcpStream,
    limit: Option<Duration>,
) -> Result<Stream, HandshakeError> {
    let limit = limit.unwrap_or(HANDSHAKE_WAIT_DEFAULT);
    let client = handoff::ktls::Framed::new(client);
    match tokio::time::timeout(limit, acceptor.accept(client)).await {
        Err(_) => Err(HandshakeError::Timeout),
        Ok(Ok(s)) => Ok(Stream::Accepted(Box::new(s))),
        Ok(Err(e)) => Err(match e.kind() {
            std::io::ErrorKind::UnexpectedEof => HandshakeError::Empty,
            std::io::ErrorKind::InvalidData => HandshakeError::Failure(e),
            _ => HandshakeError::Abort(e),
        }),
    }
}

/// [`connect_server`], then TLS on the connection (`server ... ssl`), spare or
/// fresh; `client` is the flow's, for `sni req.ssl_sni`.
async fn connect_server_tls(
    tc: &crate::tls::Connector,
    rt: &crate::lb::ServerRt,
    timeout: Option<Duration>,
    opts: ConnectOpts,
    header: Option<&Encoded>,
    client: (&Stream, Option<Duration>),
) -> Result<(Stream, SocketAddr), ConnectError> {
    let (conn, addr) = connect_server(rt, timeout, opts, header).await?;
    let tls = connect_tls(tc, conn, addr, client.0, client.1, timeout).await?;
    Ok((tls, addr))
}

/// Open TLS on `conn`, a fresh connection to a `server ... ssl`, within the
/// connect timeout (HAProxy counts the handshake as part of connecting): a
/// failure is a failed connect of that server, retried as one.
async fn connect_tls(
    tc: &crate::tls::Connector,
    conn: TcpStream,
    addr: SocketAddr,
    client: &Stream,
    inspect_delay: Option<Duration>,
    timeout: Option<Duration>,
) -> Result<Stream, ConnectError> {
    let sni = match tc.settings.sni {
        Some(crate::config::SniExpr::Client) => client_sni(client, inspect_delay).await,
        _ => None,
    };
    let name = crate::tls::server_name(&tc.settings, sni.as_deref(), addr.ip());
    let hs = tc.connector.connect(name, conn);
    let done = match timeout {
        Some(t) => tokio::time::timeout(t, hs)
            .await
            .map_err(|_| ConnectError::Timeout { addr, after: t })?,
        None => hs.await,
    };
    match done {
        Ok(s) => Ok(Stream::Connected(Box::new(s))),
        Err(e) => {
            tracing::warn!(server = %addr, error = %e, "SSL handshake failure with server");
            Err(ConnectError::Server {
                addr,
                source: std::io::Error::new(e.kind(), format!("SSL handshake failure: {e}")),
            })
        }
    }
}

/// Peek buffer for the ClientHello: one full TLS record with its header.
const SNI_PEEK_MAX: usize = crate::sni::MAX_HELLO_BYTES;
/// Pause between two peeks while a ClientHello is partly there: a socket with queued
/// bytes stays readable, so waiting for *more* bytes without consuming them is a poll.
/// Only split hellos (rare: one fits a segment) pay it, and never past inspect-delay.
const SNI_REPEEK_PAUSE: Duration = Duration::from_millis(5);

/// The server name of the ClientHello the client sent, without consuming any byte (the
/// hello is forwarded as sent). Waits for bytes while the hello is incomplete, up to
/// `delay` from now; `None` (no delay) judges only what has already arrived. `None` when
/// the hello is absent, malformed, has no name, or is late.
async fn peek_sni(client: &TcpStream, delay: Option<Duration>) -> Option<String> {
    use crate::sni::{parse_sni, SniError};
    let deadline = tokio::time::Instant::now() + delay.unwrap_or(Duration::ZERO);
    let mut buf = vec![0u8; SNI_PEEK_MAX];
    loop {
        // `timeout_at` polls the peek before the deadline, so bytes already queued are
        // judged even with no delay.
        let n = match tokio::time::timeout_at(deadline, client.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "peek for TLS ClientHello failed");
                return None;
            }
            Err(_) => {
                tracing::debug!("no TLS ClientHello within inspect-delay");
                return None;
            }
        };
        match parse_sni(&buf[..n]) {
            Ok(name) => return name,
            Err(SniError::Malformed) => return None,
            // Closed mid-hello, or a hello larger than the bound.
            Err(SniError::NeedMore) if n == 0 || n == SNI_PEEK_MAX => return None,
            Err(SniError::NeedMore) => {}
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::debug!(have = n, "incomplete TLS ClientHello at inspect-delay");
            return None;
        }
        tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + SNI_REPEEK_PAUSE))
            .await;
    }
}

/// How a flow is forwarded, from the global mode and the proxies' options:
/// `auto` starts in userspace (copy, splice for bulk) and, when the BPF
/// program loaded, promotes the flows that show they pay for the kernel
/// path (`handoff::promote`), except where `option splice-*` on the frontend
/// or backend asks for splice. A forced `sockmap` was checked at start-up
/// (BPF loaded).
fn choose_plan(state: &Runtime, fe: &Frontend, be: &Backend) -> Plan {
    match state.facts.forward_mode() {
        ForwardMode::Copy => Plan::Fixed(Mode::Copy),
        ForwardMode::Splice => Plan::Fixed(Mode::Splice),
        ForwardMode::Sockmap => Plan::Fixed(Mode::Sockmap),
        ForwardMode::Auto if fe.splice.any() || be.splice.any() => Plan::Fixed(Mode::Splice),
        ForwardMode::Auto => Plan::Auto(state.forwarding.kernel.as_ref().map(|_| Promote {
            bytes: state.config.global.sockmap_promote_bytes,
        })),
    }
}

/// A connection to the server of `rt` for a new flow: a warm spare of the pool
/// when one is good (a spare that a server-first greeting is waiting on keeps it
/// unread, so the forwarding delivers it to the client), else a fresh connect.
/// A dead spare is never an error: the pool discards it and takes another or
/// falls through to the connect.
///
/// `header` (`send-proxy`, `send-proxy-v2`) is written on the connection
/// before it is returned, spare or fresh alike: a spare has sent nothing
/// since it connected, so the header is still its first byte, and it carries
/// this flow's client (the rule for pools and `send-proxy`). A spare that
/// cannot take it is dropped for a fresh connect; a fresh one that cannot is
/// a failed connect (`ConnectError::Server`), retried as one.
///
/// Returned with the address the connection was made to, which `show sess`
/// and the TLS server name use (no getpeername per flow).
async fn connect_server(
    rt: &crate::lb::ServerRt,
    timeout: Option<Duration>,
    opts: ConnectOpts,
    header: Option<&Encoded>,
) -> Result<(TcpStream, SocketAddr), ConnectError> {
    let addr = rt.addr();
    if rt.pool.enabled() {
        let tid = crate::scheduler::try_thread_id().unwrap_or(0);
        let spare = rt.pool.take(tid, addr);
        // The spare is replaced (or the need re-estimated) at once.
        crate::lb::spares::kick();
        if let Some(sock) = spare {
            match TcpStream::from_std(sock) {
                Ok(mut s) => match write_header(&mut s, header, timeout).await {
                    Ok(()) => return Ok((s, addr)),
                    Err(e) => {
                        tracing::debug!(server = %rt.name, error = %e, "a spare refused the PROXY header")
                    }
                },
                Err(e) => tracing::debug!(server = %rt.name, error = %e, "cannot register a spare"),
            }
        }
    }
    // An address change while this connect was in flight (`set server addr`
    // answered meanwhile) makes it stale: connect again, to the new address, so
    // no flow that starts after the answer reaches the old one. Bounded: each
    // retry follows another change.
    let mut addr = addr;
    for _ in 0..MAX_ADDR_CHANGE_RETRIES {
        let gen = rt.addr_gen();
        let s = crate::lb::spares::connect(addr, timeout, opts).await?;
        if rt.addr_gen() == gen {
            return Ok((with_header(s, addr, header, timeout).await?, addr));
        }
        addr = rt.addr();
    }
    let s = crate::lb::spares::connect(addr, timeout, opts).await?;
    Ok((with_header(s, addr, header, timeout).await?, addr))
}

/// `s`, a fresh connection to `addr`, once `header` is written on it.
async fn with_header(
    mut s: TcpStream,
    addr: SocketAddr,
    header: Option<&Encoded>,
    timeout: Option<Duration>,
) -> Result<TcpStream, ConnectError> {
    match write_header(&mut s, header, timeout).await {
        Ok(()) => Ok(s),
        Err(source) => Err(ConnectError::Server { addr, source }),
    }
}

/// Write the PROXY header, the connection's first bytes, within `timeout`
/// (the connect timeout: HAProxy counts the header as part of connecting).
/// A connection that sent nothing yet has room for it, so this does not wait
/// in practice.
async fn write_header(
    s: &mut TcpStream,
    header: Option<&Encoded>,
    timeout: Option<Duration>,
) -> std::io::Result<()> {
    let Some(h) = header else {
        return Ok(());
    };
    let write = s.write_all(h.as_bytes());
    match timeout {
        Some(t) => tokio::time::timeout(t, write).await.map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "writing the PROXY header")
        })?,
        None => write.await,
    }
}

/// The header a `send-proxy(-v2)` server gets for a flow from `peer` that
/// reached `dst` (after any PROXY header the client sent: a chain passes the
/// first client on). On the stack; `None` without the option. An unknown
/// `dst` (the socket lost its address) sends v1 `UNKNOWN` / v2 `LOCAL`.
fn proxy_header(
    v: Option<ProxyVersion>,
    peer: SocketAddr,
    dst: Option<SocketAddr>,
) -> Option<Encoded> {
    let v = match v? {
        ProxyVersion::V1 => proxy_proto::Version::V1,
        ProxyVersion::V2 => proxy_proto::Version::V2,
    };
    Some(match dst {
        Some(d) => proxy_proto::encode(v, peer, d),
        None => proxy_proto::encode_unknown(v),
    })
}

/// Both sockets, when neither carries TLS.
#[allow(clippy::type_complexity)]
fn plain_pair(client: Stream, server: Stream) -> Result<(TcpStream, TcpStream), (Stream, Stream)> {
    match (client, server) {
        (Stream::Plain(c), Stream::Plain(s)) => Ok((c, s)),
        other => Err(other),
    }
}

/// Fresh connects restarted because the server's address changed under them.
const MAX_ADDR_CHANGE_RETRIES: usize = 3;

/// Run one client flow accepted on bind address `bind` of frontend `fe_idx`
/// (`client` as accepted: `Stream::Plain`; a `bind ... ssl` flow's handshake
/// replaces it in place, so no second socket slot is kept in the future);
/// `flow` is its id in this worker's registry (`stats::flows`), kept up to
/// date as the flow progresses.
///
/// Not an `async fn`: one would keep its arguments twice in the flow's
/// future (as arguments and as the body's locals).
/// The address a client of bind line `bind` reached: the line's own when it
/// names one address and port and is not `transparent` (every socket it
/// accepts has that local address), else the socket's (a getsockname, for
/// wildcard, port-0 and transparent binds).
fn reached(fe: &crate::config::Frontend, bind: usize, s: &TcpStream) -> Option<SocketAddr> {
    match (fe.binds.get(bind), fe.bind_opts.get(bind)) {
        (Some(a), Some(o)) if !a.ip().is_unspecified() && a.port() != 0 && !o.transparent => {
            Some(*a)
        }
        _ => s.local_addr().ok(),
    }
}

#[allow(clippy::manual_async_fn)]
pub fn run(
    state: Arc<Runtime>,
    fe_idx: usize,
    bind: usize,
    mut client: Stream,
    mut peer: SocketAddr,
    flow: u64,
) -> impl Future<Output = ()> {
    async move {
        let fe = &state.config.frontends[fe_idx];
        let fe_ctr = &state.stats.frontends[fe_idx];
        let accepted = SystemTime::now();
        let mut dst = reached(fe, bind, client.tcp());
        // Released (conn_cur, bytes) when the flow ends, whatever the path.
        let mut tracker = Tracker::new(&state.tables);
        let Some(expect_proxy) = connection_rules(&state, fe, peer, dst, &mut tracker) else {
            // As HAProxy: counted in the frontend's denied connections, never a
            // session, never logged; dropping the socket closes it.
            tracing::debug!(frontend = %fe.name, %peer, "rejected by tcp-request connection");
            fe_ctr.event(Event::Denied);
            return;
        };
        let mut consumed = 0;
        let opts = fe.bind_opts.get(bind);
        if expect_proxy || opts.is_some_and(|o| o.accept_proxy) {
            match read_proxy_header(client.tcp(), fe.timeouts.client).await {
                Ok(h) => {
                    consumed = h.len as u64;
                    if let Some((src, to)) = h.addrs {
                        peer = src;
                        dst = Some(to);
                        flows::update(flow, |f| f.client = src);
                    }
                }
                Err(e) => {
                    // As HAProxy's `session_kill_embryonic`: one log line with
                    // the real address, no session counted, closed with a reset.
                    let label = opts.map(|o| o.label()).unwrap_or_default();
                    tracing::debug!(frontend = %fe.name, %peer, error = %e, "no PROXY header");
                    crate::log::connection_error(
                        &state,
                        fe_idx,
                        peer,
                        accepted,
                        &label,
                        &e,
                        e.null(),
                    );
                    let _ = crate::sys::sock::set_linger_reset(client.tcp().as_fd());
                    return;
                }
            }
        }
        // `bind ... ssl`: terminate first. As HAProxy, a failed handshake is
        // no session, logged once with the listener (`session_kill_embryonic`).
        client = match (state.tls.acceptor(fe_idx, bind), client) {
            (None, c) | (_, c @ (Stream::Accepted(_) | Stream::Connected(_))) => c,
            (Some(acceptor), Stream::Plain(client)) => {
                let hs = Box::pin(accept_tls(acceptor, client, fe.timeouts.client));
                match hs.await {
                    Ok(s) => s,
                    Err(e) => {
                        let label = opts.map(|o| o.label()).unwrap_or_default();
                        tracing::debug!(frontend = %fe.name, %peer, error = %e, source = ?std::error::Error::source(&e), "TLS handshake failed");
                        crate::log::connection_error(
                            &state,
                            fe_idx,
                            peer,
                            accepted,
                            &label,
                            &e,
                            e.null(),
                        );
                        return;
                    }
                }
            }
        };
        // The traffic log line, emitted when this drops: declared before the
        // gauges so that it drops last (HAProxy's end-of-flow counts).
        let mut log = FlowGuard::accepted_at(&state, fe_idx, peer, dst, accepted);
        fe_ctr.event(Event::Session);
        tracker.session();
        let _fe_open = Open::new(fe_ctr);
        if fe.clitcpka {
            // `option clitcpka`: a failure only loses the probes, not the flow.
            if let Err(e) = socket2::SockRef::from(client.tcp()).set_keepalive(true) {
                tracing::debug!(frontend = %fe.name, %peer, error = %e, "cannot set SO_KEEPALIVE");
            }
        }

        // The request's first bytes, peeked for the content rules and the SNI
        // rules; the buffer is freed once the flow is routed.
        let mut inspect = Inspect::default();
        let delay = fe.timeouts.inspect_delay;
        let rules = &fe.tcp_content;
        // Boxed only where there are rules: most flows have none, and the
        // call would allocate for nothing.
        if !rules.is_empty()
            && Box::pin(content_rules(
                &state,
                &mut tracker,
                rules,
                delay,
                (peer, dst),
                &mut client,
                &mut inspect,
            ))
            .await
                == ContentAction::Reject
        {
            // As HAProxy: the frontend's `dreq`, logged `PR` (`<NOSRV>`).
            tracing::debug!(frontend = %fe.name, %peer, "rejected by tcp-request content");
            fe_ctr.event(Event::DeniedReq);
            log.end_at(Cause::Proxy, LogPhase::Request);
            inspect.discard(&client);
            return;
        }
        let Some(be_idx) = Box::pin(route(
            &state,
            fe,
            peer,
            dst,
            &mut client,
            &mut inspect,
            &tracker,
        ))
        .await
        else {
            tracing::debug!(frontend = %fe.name, %peer, "no backend to route to; closing");
            fe_ctr.event(Event::Denied);
            log.end_at(Cause::Proxy, LogPhase::Request);
            return;
        };
        log.routed(be_idx);
        let be = &state.config.backends[be_idx];
        let be_rt = &state.backends[be_idx];
        let be_ctr = &state.stats.backends[be_idx];
        flows::update(flow, |f| f.be = Some(be_idx));
        be_ctr.event(Event::Session);
        let _be_open = Open::new(be_ctr);
        let delay = be.timeouts.inspect_delay;
        // A listen section's rules ran as its frontend's: HAProxy runs a
        // backend's only when it is another proxy than the frontend.
        let rules: &[ContentRule] = if fe.own_backend == Some(be_idx) {
            &[]
        } else {
            &be.tcp_content
        };
        // Boxed only where there are rules: most flows have none, and the
        // call would allocate for nothing.
        if !rules.is_empty()
            && Box::pin(content_rules(
                &state,
                &mut tracker,
                rules,
                delay,
                (peer, dst),
                &mut client,
                &mut inspect,
            ))
            .await
                == ContentAction::Reject
        {
            // HAProxy counts it in the frontend's `dreq` only.
            tracing::debug!(backend = %be.name, %peer, "rejected by tcp-request content");
            fe_ctr.event(Event::DeniedReq);
            log.end_at(Cause::Proxy, LogPhase::Request);
            inspect.discard(&client);
            return;
        }
        // From here on only a TLS client's plaintext, read by the rules, is
        // kept: the server gets it first.
        inspect.keep_replay();

        // Acquire a server slot and connect, with HAProxy's retry and redispatch rules:
        // `retries` further attempts on the same server, after a failure the error
        // calls retryable (`ConnectError::retryable`: all but an internal one); the
        // last one goes elsewhere when `option redispatch` is set.
        // In a boxed future of its own: none of its locals is kept in the
        // flow's future while the flow is forwarded (the room every idle flow
        // pays for), and the connect is allocated only while it runs.
        let connected = Box::pin(async {
            let sticking = stick_rules(&state, be, peer, dst, &tracker);
            let mut exclude = None;
            let mut attempts_left = be.retries;
            let mut slot = None;
            let mut server = None;
            while server.is_none() {
                let s = match slot.take() {
                    Some(s) => s,
                    None => match be_rt
                        .acquire_sticky(
                            crate::lb::FlowKey { src: peer, dst },
                            sticking.server,
                            exclude,
                            be.timeouts.queue,
                        )
                        .await
                    {
                        Ok(s) => s,
                        Err(e) => {
                            match e {
                                AcquireError::QueueTimeout => be_ctr.event(Event::Timeout),
                                AcquireError::QueueFull | AcquireError::NoServer => {
                                    be_ctr.event(Event::Denied)
                                }
                            }
                            log.end_at(
                                match e {
                                    AcquireError::QueueTimeout => Cause::ServerTimeout,
                                    _ => Cause::ServerAbort,
                                },
                                match e {
                                    AcquireError::NoServer => LogPhase::Connect,
                                    _ => LogPhase::Queue,
                                },
                            );
                            tracing::debug!(backend = %be.name, %peer, error = %e, "no server for flow");
                            return None;
                        }
                    },
                };
                let srv_idx = s.index();
                let srv_ctr = &state.stats.servers[be_idx][srv_idx];
                log.assigned(srv_idx);
                let opts = ConnectOpts::of(be, &be.servers[s.index()]);

                let header = be
                    .servers
                    .get(srv_idx)
                    .and_then(|c| proxy_header(c.send_proxy.version(), peer, dst));
                let (rt, limit, header) = (s.server(), be.timeouts.connect, header.as_ref());
                // One await point for both (see `handoff::tls::Either`).
                let connecting = match state.tls.connector(be_idx, srv_idx) {
                    None => handoff::tls::Either::Plain {
                        f: connect_server(rt, limit, opts, header),
                    },
                    Some(tc) => handoff::tls::Either::Tls {
                        f: Box::pin(connect_server_tls(
                            tc,
                            rt,
                            limit,
                            opts,
                            header,
                            (&client, fe.timeouts.inspect_delay),
                        )),
                    },
                };
                let connected = match connecting.await {
                    handoff::tls::Which::Plain(r) => r.map(|(s, a)| (Stream::Plain(s), a)),
                    handoff::tls::Which::Tls(r) => r,
                };
                crate::checks::observe::report(&state, be_idx, srv_idx, connected.is_ok());
                match connected {
                    Ok((conn, addr)) => {
                        let tcp = conn.tcp();
                        log.connected(|| (Some(addr), tcp.local_addr().ok()));
                        srv_ctr.event(Event::Session);
                        server = Some((conn, addr));
                        slot = Some(s);
                    }
                    Err(e) => {
                        srv_ctr.event(Event::ConnError);
                        be_ctr.event(Event::ConnError);
                        tracing::debug!(backend = %be.name, server = %s.server().name, error = %e, origin = ?e.origin(), retryable = e.retryable(), "connect failed");
                        if attempts_left == 0 || !e.retryable() {
                            // A resource shortage that outlived the retries stays `S`, as
                            // every failure but a timeout was before errors had classes.
                            log.end(if e.timed_out() {
                                Cause::ServerTimeout
                            } else if e.retryable() {
                                Cause::ServerAbort
                            } else {
                                Cause::Internal
                            });
                            return None;
                        }
                        attempts_left -= 1;
                        log.retried(attempts_left == 0 && be.redispatch && be_rt.servers.len() > 1);
                        srv_ctr.event(Event::Retry);
                        be_ctr.event(Event::Retry);
                        if attempts_left == 0 && be.redispatch && be_rt.servers.len() > 1 {
                            srv_ctr.event(Event::Redispatch);
                            be_ctr.event(Event::Redispatch);
                            exclude = Some(srv_idx);
                            drop(s); // the slot is released; a new pick follows
                        } else {
                            let pause = be
                                .timeouts
                                .connect
                                .map_or(RETRY_TURNAROUND_MAX, |c| c.min(RETRY_TURNAROUND_MAX));
                            tokio::time::sleep(pause).await;
                            slot = Some(s);
                        }
                    }
                }
            }
            let (Some((server, addr)), Some(slot)) = (server, slot) else {
                return None;
            };
            // For `show sess`, here: a local of the flow's own future would
            // take room in it for as long as the flow lives.
            flows::update(flow, |f| f.server = Some(addr));
            stick_store(&state, be, &sticking, peer, dst, slot.server());
            Some((server, slot))
        })
        .await;
        let Some((server, slot)) = connected else {
            return;
        };
        let srv_idx = slot.index();
        let srv_ctr = &state.stats.servers[be_idx][srv_idx];
        let _srv_open = Open::new(srv_ctr);
        // Counts in the pool's sizing (`used_cur`) while the flow runs.
        let _used = slot.server().pool.used();

        let meter = FlowMeter {
            fe: fe_ctr,
            be: be_ctr,
            srv: srv_ctr,
            route: handoff::FlowRoute {
                fe: fe_idx,
                be: be_idx,
                srv: srv_idx,
            },
            flow,
            modes: &state.stats.modes,
            consumed,
        };
        // In a block, as the connect's: none of it is needed while forwarding.
        {
            let tls = !matches!((&client, &server), (Stream::Plain(_), Stream::Plain(_)));
            let plan = choose_plan(&state, fe, be);
            let fd_server = std::os::fd::AsRawFd::as_raw_fd(server.tcp());
            flows::update(flow, |f| {
                f.srv = Some(srv_idx);
                f.fd_server = fd_server;
                // A TLS flow is copied (by rustls, or by kTLS's copy loops: see
                // `handoff::ktls`).
                f.mode = Some(if tls { Mode::Copy.name() } else { plan.name() });
            });
        }
        // Plain or TLS (boxed, so a plain flow keeps no room for it), awaited
        // at one point.
        let fwd = match plain_pair(client, server) {
            Ok((client, server)) => {
                drop(inspect);
                handoff::tls::Either::Plain {
                    f: handoff::forward(
                        &state.forwarding,
                        client,
                        server,
                        Vec::new(),
                        choose_plan(&state, fe, be),
                        crate::runtime::flow::timeouts(fe, be),
                        &meter,
                    ),
                }
            }
            Err((client, server)) => handoff::tls::Either::Tls {
                f: Box::pin(handoff::tls::forward_tls(
                    client,
                    server,
                    inspect.into_replay(),
                    state.tls.kernel().ciphers(),
                    crate::runtime::flow::timeouts(fe, be),
                    &meter,
                )),
            },
        };
        let out = fwd.await.merge();
        if let End::Error { origin, source } = &out.end {
            tracing::debug!(?origin, error = %source, "flow ended with an error");
        }
        crate::runtime::flow::account_end(
            &state,
            &out,
            Some(&mut log),
            Some([fe_ctr, be_ctr, srv_ctr]),
        );
        tracker.set_bytes(out.to_server, out.to_client);
        tracing::debug!(
            frontend = %fe.name, backend = %be.name, server = %slot.server().name, %peer,
            to_server = out.to_server, to_client = out.to_client, mode = ?out.mode, end = ?out.end,
            promoted_after = ?out.promoted,
            origin = ?out.end.origin(),
            "flow closed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Room of a flow's future as built for a plain flow, measured in the
    /// build the test runs in (the release figures are in
    /// docs/architecture.md, "Memory of an idle flow").
    fn run_future_size() -> usize {
        let loaded = crate::config::parse_str(
            "t.cfg",
            "defaults\n mode tcp\n timeout client 1s\n timeout server 1s\n timeout connect 1s\n\
             listen l\n bind 127.0.0.1:1\n server s 127.0.0.1:2\n",
        )
        .expect("config");
        let (_tx, rx) = tokio::sync::watch::channel(crate::runtime::Phase::Running);
        let state = Arc::new(Runtime::new(
            Arc::new(loaded.config),
            crate::runtime::Facts::new(ForwardMode::Auto, "test".into(), 1),
            None,
            rx,
            0,
            false,
            Default::default(),
        ));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = l.local_addr().expect("addr");
            let c = TcpStream::connect(addr).await.expect("connect");
            let peer = c.local_addr().expect("local");
            let fut = run(state, 0, 0, Stream::Plain(c), peer, 0);
            std::mem::size_of_val(&fut)
        })
    }

    /// The flow future's room as measured once TLS termination, content
    /// inspection and stick tables were all in (TLS itself adds only the one
    /// word each of the client's and the server's socket enum, `Stream`):
    /// release and debug builds lay the future out differently. A change that
    /// grows it must say why here. 1272 B (1304 in debug) until the connect,
    /// the content rules and the routing got futures of their own, boxed, and
    /// the locals only the start of forwarding needs a block: the locals of
    /// stages the flow has left no longer take room while it forwards.
    #[cfg(not(debug_assertions))]
    const RUN_FUTURE_MAX: usize = 992;
    #[cfg(debug_assertions)]
    const RUN_FUTURE_MAX: usize = 1032;

    /// TLS must cost a plain flow nothing but the enum tags: its handshakes
    /// and forwarding are boxed behind the one await point of each stage.
    #[test]
    fn tls_leaves_a_plain_flows_future_as_it_was() {
        let n = run_future_size();
        eprintln!("session::run future: {n} B");
        assert!(
            n <= RUN_FUTURE_MAX,
            "session::run's future is {n} B, more than {RUN_FUTURE_MAX} B"
        );
    }
}
