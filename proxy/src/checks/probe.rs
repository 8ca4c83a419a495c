//! The probes: a plain connect, a `tcp-check` rule list, and the agent's line.
//!
//! Timeouts follow HAProxy's `timeout check` rule: with it, a connect waits at most
//! `min(timeout connect, inter)` and each read after it `timeout check`; without it,
//! `inter` bounds the connect and the reads. Every socket is closed with a reset
//! (SO_LINGER 0) so that thousands of checks leave no TIME_WAIT behind.
//!
//! A TLS check connection (`check-ssl`, `tcp-check connect ssl`) is established
//! when its handshake is: the TCP connect, the PROXY header and the handshake
//! share one deadline, the connect's, as HAProxy arms one expiry for all of
//! them. A handshake that fails is `L6RSP` with HAProxy's connection error text,
//! one that does not finish in time `L6TOUT`, one that completes with nothing
//! else to do `L6OK`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

use super::{os_reason, CheckTls, Outcome, Status, Target, CHECK_BUF};
use crate::config::{ExpectKind, TcpCheckAction, TcpCheckRule, TcpExpect};
use crate::handoff::tls::Stream;

/// The time limits of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    pub read: Duration,
}

impl Timeouts {
    pub fn new(inter: Duration, connect: Option<Duration>, check: Option<Duration>) -> Self {
        match check {
            Some(read) => Self {
                connect: connect.map_or(inter, |c| c.min(inter)),
                read,
            },
            None => Self {
                connect: inter,
                read: inter,
            },
        }
    }
}

/// A `tcp-check expect` with its regular expression compiled.
#[derive(Debug, Clone)]
pub struct Expect {
    pub spec: TcpExpect,
    pub regex: Option<regex_automata::meta::Regex>,
}

/// One compiled `tcp-check` rule.
#[derive(Debug, Clone)]
pub enum Action {
    Connect {
        port: Option<u16>,
        addr: Option<IpAddr>,
        ssl: bool,
        sni: Option<String>,
    },
    Send(Vec<u8>),
    Expect(Box<Expect>),
}

#[derive(Debug, Clone)]
pub struct Rule {
    pub action: Action,
    pub comment: Option<String>,
}

/// Compile the configured rules (the config already refused bad regexes; one that
/// fails here anyway never matches).
pub fn compile(rules: &[TcpCheckRule]) -> Vec<Rule> {
    rules
        .iter()
        .map(|r| Rule {
            comment: r.comment.clone(),
            action: match &r.action {
                TcpCheckAction::Connect {
                    port,
                    addr,
                    ssl,
                    sni,
                } => Action::Connect {
                    port: *port,
                    addr: *addr,
                    ssl: *ssl,
                    sni: sni.clone(),
                },
                TcpCheckAction::Send(b) => Action::Send(b.clone()),
                TcpCheckAction::Expect(e) => Action::Expect(Box::new(Expect {
                    regex: match e.kind {
                        ExpectKind::Rstring | ExpectKind::Rbinary => {
                            regex_automata::meta::Regex::new(&e.pattern).ok()
                        }
                        ExpectKind::String | ExpectKind::Binary => None,
                    },
                    spec: e.clone(),
                })),
            },
        })
        .collect()
}

/// What an expect rule decides on the bytes received so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eval {
    Pass,
    /// Failed; `matched` when a negated pattern was found.
    Fail {
        matched: bool,
    },
    /// Need more bytes.
    Wait,
}

/// Upper-case hex of `b` (what `rbinary` matches against).
pub fn hex_upper(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02X}")).collect()
}

/// Evaluate `e` against `buf`; `last_read`: no more bytes will come (EOF or full).
pub fn eval_expect(e: &Expect, buf: &[u8], last_read: bool) -> Eval {
    let s = &e.spec;
    if !last_read && (buf.is_empty() || s.min_recv.is_some_and(|m| buf.len() < m)) {
        return Eval::Wait;
    }
    let matched = match s.kind {
        ExpectKind::String | ExpectKind::Binary => contains(buf, &s.bytes),
        ExpectKind::Rstring => e.regex.as_ref().is_some_and(|r| r.is_match(buf)),
        ExpectKind::Rbinary => e
            .regex
            .as_ref()
            .is_some_and(|r| r.is_match(hex_upper(buf).as_bytes())),
    };
    // Without min-recv a mismatch is not conclusive while more may come.
    if !matched && !last_read && s.min_recv.is_none() {
        return Eval::Wait;
    }
    if matched != s.negate {
        Eval::Pass
    } else {
        Eval::Fail { matched }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

/// HAProxy's info text of a failed expect (`tcpcheck_expect_onerror_message`).
pub fn expect_error(e: &TcpExpect, matched: bool, step: usize, comment: Option<&str>) -> String {
    let mut m = String::from(if matched {
        "TCPCHK matched unwanted content"
    } else {
        "TCPCHK did not match content"
    });
    match e.kind {
        ExpectKind::String => m.push_str(&format!(" '{}' at step {step}", e.pattern)),
        ExpectKind::Binary => m.push_str(&format!(" (binary) at step {step}")),
        ExpectKind::Rstring => m.push_str(&format!(" (regex) at step {step}")),
        ExpectKind::Rbinary => m.push_str(&format!(" (binary regex) at step {step}")),
    }
    if let Some(c) = comment {
        m.push_str(" comment: ");
        m.push_str(c);
    }
    m
}

/// HAProxy's suffix of a connection error during a tcp-check (`chk_report_conn_err`).
pub fn step_suffix(step: usize, rule: Option<&Rule>) -> String {
    let Some(rule) = rule.filter(|_| step > 0) else {
        return " at initial connection step of tcp-check".to_string();
    };
    let mut m = format!(" at step {step} of tcp-check");
    match &rule.action {
        Action::Connect { port: Some(p), .. } => m.push_str(&format!(" (connect port {p})")),
        Action::Connect { port: None, .. } => m.push_str(" (connect)"),
        Action::Send(_) => m.push_str(" (send)"),
        Action::Expect(e) => match e.spec.kind {
            ExpectKind::String => m.push_str(&format!(" (expect string '{}')", e.spec.pattern)),
            ExpectKind::Binary => m.push_str(&format!(" (expect binary '{}')", e.spec.pattern)),
            ExpectKind::Rstring => m.push_str(" (expect regex)"),
            ExpectKind::Rbinary => m.push_str(" (expect binary regex)"),
        },
    }
    if let Some(c) = &rule.comment {
        m.push_str(&format!(" comment: '{c}'"));
    }
    m
}

/// Where a check connects: the rule's `addr`/`port`, else the server line's (as
/// the CLI may have changed them), else the server's address.
fn check_addr(t: &Target, addr: Option<IpAddr>, port: Option<u16>) -> SocketAddr {
    let srv = t.server.addr();
    let p = t.server.probe_targets();
    SocketAddr::new(
        addr.or(p.check_addr).unwrap_or_else(|| srv.ip()),
        port.or(p.check_port).unwrap_or_else(|| srv.port()),
    )
}

/// Connect with a deadline, from the server's `source` if it has one; errors
/// as (status, reason).
async fn connect(
    addr: SocketAddr,
    limit: Duration,
    source: Option<SocketAddr>,
) -> Result<TcpStream, (Status, String)> {
    let opts = crate::lb::spares::ConnectOpts {
        source,
        keepalive: false,
    };
    let sock = crate::lb::spares::socket(addr, opts).map_err(|e| (Status::L4Con, os_reason(&e)))?;
    match timeout_at(Instant::now() + limit, sock.connect(addr)).await {
        Err(_) => Err((Status::L4Tout, String::new())),
        Ok(Err(e)) => Err((Status::L4Con, os_reason(&e))),
        Ok(Ok(s)) => {
            // Close with a reset: no TIME_WAIT per check.
            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
            Ok(s)
        }
    }
}

/// What a check connection speaks once connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over<'a> {
    Clear,
    /// TLS, its handshake sending this server name (none: no SNI).
    Tls(Option<&'a str>),
}

/// A health-check connection: [`connect`], then the PROXY header when the
/// server's checks send one (`Target::send_proxy`), then the TLS handshake
/// when `over` says so; all within `limit` of the start.
async fn check_connect(
    t: &Target,
    addr: SocketAddr,
    limit: Duration,
    over: Over<'_>,
) -> Result<Stream, (Status, String)> {
    let deadline = Instant::now() + limit;
    let mut s = connect(addr, limit, t.source).await?;
    if let Some(v) = t.send_proxy {
        let header = match (s.local_addr(), s.peer_addr()) {
            (Ok(l), Ok(p)) => crate::proxy_proto::encode_local(v, l, p),
            _ => crate::proxy_proto::encode_unknown(v),
        };
        match timeout_at(deadline, s.write_all(header.as_bytes())).await {
            Err(_) => return Err((Status::L4Tout, String::new())),
            Ok(Err(e)) => return Err((Status::Sockerr, os_reason(&e))),
            Ok(Ok(())) => {}
        }
    }
    let Over::Tls(sni) = over else {
        return Ok(Stream::Plain(s));
    };
    // The configuration gives every server whose checks ask for TLS its settings.
    let Some(tls) = &t.tls else {
        return Err((Status::Sockerr, "no TLS settings for the check".to_string()));
    };
    handshake(tls, s, addr, sni, deadline).await
}

/// The TLS handshake of a check connection to `addr`, by `deadline`.
async fn handshake(
    tls: &CheckTls,
    s: TcpStream,
    addr: SocketAddr,
    sni: Option<&str>,
    deadline: Instant,
) -> Result<Stream, (Status, String)> {
    let name = crate::tls::check_server_name(sni, addr.ip());
    match timeout_at(deadline, tls.connector.connector.connect(name, s)).await {
        Err(_) => Err((Status::L6Tout, String::new())),
        Ok(Err(e)) => Err((Status::L6Rsp, handshake_error(&e).to_string())),
        Ok(Ok(s)) => Ok(Stream::Connected(Box::new(s))),
    }
}

/// HAProxy's text for a check's failed handshake (its connection error
/// strings): a certificate that does not match `check-sni` has its own, every
/// other failure (refused certificate, garbage, a peer that closes or resets)
/// is the generic one. HAProxy sometimes adds the socket's error after a
/// reset (` (Connection reset by peer)`), depending on whether its poller saw
/// the reset before its read did; shunt never does, so the text is stable.
pub fn handshake_error(e: &std::io::Error) -> &'static str {
    let rustls_error = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match rustls_error {
        Some(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName
            | rustls::CertificateError::NotValidForNameContext { .. },
        )) => "Server presented an SSL certificate different from the expected one",
        _ => "SSL handshake failure",
    }
}

/// The status of a check whose last step was a connection: layer 6 when it
/// was TLS, layer 4 otherwise.
fn connected(s: &Stream) -> Status {
    match s {
        Stream::Plain(_) => Status::L4Ok,
        _ => Status::L6Ok,
    }
}

/// What the check's own connection speaks: TLS with `check-sni` for
/// `check-ssl` or a `ssl` server's checks, else clear.
fn default_over(t: &Target) -> Over<'_> {
    match &t.tls {
        Some(tls) if tls.default => Over::Tls(tls.sni.as_deref()),
        _ => Over::Clear,
    }
}

/// A plain `check`: the connection (and its handshake, with TLS) is the test.
pub async fn connect_check(t: &Target) -> Outcome {
    let addr = check_addr(t, None, None);
    match check_connect(t, addr, t.timeouts.connect, default_over(t)).await {
        Ok(s) => Outcome::new(connected(&s), ""),
        Err((status, reason)) => Outcome::new(status, reason),
    }
}

/// Run the `tcp-check` rules. A list that does not start with `connect` gets an
/// implicit one (step 0), TLS as the check's own connection is; an explicit
/// `connect` is TLS only with its `ssl` option, and sends its own `sni` only
/// (`check-sni` is the implicit connection's). The last rule decides the
/// success status.
pub async fn tcp_check(t: &Target, rules: &[Rule]) -> Outcome {
    let mut conn: Option<Stream> = None;
    let mut buf: Vec<u8> = Vec::new();
    let mut eof = false;
    let implicit = !matches!(
        rules.first().map(|r| &r.action),
        Some(Action::Connect { .. })
    );
    if implicit {
        let addr = check_addr(t, None, None);
        match check_connect(t, addr, t.timeouts.connect, default_over(t)).await {
            Ok(s) => conn = Some(s),
            Err((status, reason)) => {
                return Outcome::new(status, format!("{reason}{}", step_suffix(0, None)))
            }
        }
    }
    for (i, rule) in rules.iter().enumerate() {
        let step = i + 1;
        let fail = |status: Status, reason: &str| {
            Outcome::new(status, format!("{reason}{}", step_suffix(step, Some(rule))))
        };
        match &rule.action {
            Action::Connect {
                port,
                addr,
                ssl,
                sni,
            } => {
                drop(conn.take());
                buf.clear();
                eof = false;
                let to = check_addr(t, *addr, *port);
                let over = match ssl {
                    true => Over::Tls(sni.as_deref()),
                    false => Over::Clear,
                };
                match check_connect(t, to, t.timeouts.connect, over).await {
                    Ok(s) => conn = Some(s),
                    Err((status, reason)) => return fail(status, &reason),
                }
            }
            Action::Send(data) => {
                let Some(s) = conn.as_mut() else {
                    return fail(Status::Sockerr, "");
                };
                buf.clear();
                eof = false;
                // A TLS stream may hold the records until flushed.
                let sent = async {
                    s.write_all(data).await?;
                    s.flush().await
                };
                match timeout_at(Instant::now() + t.timeouts.read, sent).await {
                    Err(_) => return fail(Status::L7Tout, ""),
                    Ok(Err(e)) => return fail(Status::Sockerr, &os_reason(&e)),
                    Ok(Ok(())) => {}
                }
            }
            Action::Expect(e) => {
                let Some(s) = conn.as_mut() else {
                    return fail(Status::Sockerr, "");
                };
                let deadline = Instant::now() + t.timeouts.read;
                loop {
                    let last = eof || buf.len() >= CHECK_BUF;
                    match eval_expect(e, &buf, last) {
                        Eval::Pass => break,
                        Eval::Fail { matched } => {
                            return Outcome::new(
                                Status::L7Rsp,
                                expect_error(&e.spec, matched, step, rule.comment.as_deref()),
                            )
                        }
                        Eval::Wait => {}
                    }
                    let mut chunk = [0u8; 4096];
                    let room = (CHECK_BUF - buf.len()).min(chunk.len());
                    match timeout_at(deadline, s.read(&mut chunk[..room])).await {
                        Err(_) => return fail(Status::L7Tout, ""),
                        Ok(Err(e)) => return fail(Status::Sockerr, &os_reason(&e)),
                        Ok(Ok(0)) => eof = true,
                        Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            }
        }
    }
    let layer = conn.as_ref().map_or(Status::L4Ok, connected);
    match rules.last().map(|r| &r.action) {
        None => Outcome::new(layer, ""),
        Some(Action::Connect { .. }) => Outcome::new(layer, "(tcp-check)"),
        Some(_) => Outcome {
            status: Status::L7Ok,
            code: Some(0),
            desc: "(tcp-check)".to_string(),
        },
    }
}

/// Connect to the agent, send `agent-send`, and read its first line. `Err` when the
/// agent could not be reached or said nothing usable (no state change follows).
pub async fn agent_line(t: &Target) -> Result<String, String> {
    let srv = t.server.addr();
    let p = t.server.probe_targets();
    let addr = SocketAddr::new(
        p.agent_addr.unwrap_or_else(|| srv.ip()),
        p.agent_port.unwrap_or_else(|| srv.port()),
    );
    let mut s = connect(addr, t.timeouts.connect, t.source)
        .await
        .map_err(|(st, reason)| format!("{}: {reason}", st.info()))?;
    let deadline = Instant::now() + t.timeouts.read;
    if !p.agent_send.is_empty() {
        match timeout_at(deadline, s.write_all(&p.agent_send)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(os_reason(&e)),
            Err(_) => return Err("timeout".to_string()),
        }
    }
    let mut buf = Vec::new();
    loop {
        if let Some(end) = buf.iter().position(|&b| b == b'\n' || b == b'\r') {
            return Ok(String::from_utf8_lossy(&buf[..end]).into_owned());
        }
        if buf.len() >= CHECK_BUF {
            return Err("Ignoring incomplete line from agent".to_string());
        }
        let mut chunk = [0u8; 1024];
        match timeout_at(deadline, s.read(&mut chunk)).await {
            Err(_) => return Err("timeout".to_string()),
            Ok(Err(e)) => return Err(os_reason(&e)),
            Ok(Ok(0)) => return Err("Ignoring incomplete line from agent".to_string()),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}
