//! `tcp-check` lines of proxy sections (`comment`, `connect`, `send`,
//! `send-binary`, `expect`), with the option tables of `connect` and `expect`.
//!
//! Invariant: a proxy's first own rule replaces the rules its defaults
//! section gave (HAProxy does not merge the two lists), and a pending
//! `tcp-check comment` goes to the next rule.

use std::net::IpAddr;

use super::model::*;
use super::{bounded, int_arg, no_extra, options, port_arg, Args, Keyword, Line, Scope};
use super::{ProxyDraft, Sections};

/// Largest `min-recv` accepted: what one check buffer holds (see `crate::checks`).
pub const MAX_MIN_RECV: usize = 16 * 1024;

/// Decodes the hex digits of `send-binary` and `expect binary`.
pub fn parse_hex(s: &str) -> Option<Vec<u8>> {
    if s.is_empty() || !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Options of `tcp-check connect` shunt does not implement (HAProxy's list).
const TCP_CHECK_CONNECT_UNSUPPORTED: &[&str] = &[
    "send-proxy",
    "via-socks4",
    "alpn",
    "proto",
    "linger",
    "default",
];

/// Options of `tcp-check expect` shunt does not implement.
const TCP_CHECK_EXPECT_UNSUPPORTED: &[&str] = &[
    "ok-status",
    "error-status",
    "tout-status",
    "on-success",
    "on-error",
    "status-code",
    "string-lf",
    "binary-lf",
    "custom",
];

/// Appends a rule, replacing inherited ones and taking a pending comment.
fn push_rule(d: &mut ProxyDraft, action: TcpCheckAction, comment: Option<String>) {
    if d.tcp_check_inherited {
        // The first own rule replaces the list a defaults section gave.
        d.tcp_check_rules.clear();
        d.tcp_check_inherited = false;
    }
    let pending = d.tcp_check_comment.take();
    d.tcp_check_rules.push(TcpCheckRule {
        action,
        comment: comment.or(pending),
    });
}

/// `tcp-check WORD` for a WORD no entry holds, or no WORD at all.
pub fn other(_: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    match l.arg(1).unwrap_or("") {
        s @ ("send-lf" | "send-binary-lf" | "set-var" | "unset-var") => {
            Err(format!("'tcp-check {s}' is not supported by shunt."))
        }
        other => Err(format!(
            "'tcp-check' only supports 'comment', 'connect', 'send', 'send-binary' and 'expect' (got '{other}')."
        )),
    }
}

/// `tcp-check comment TEXT`: the next rule's comment.
pub fn comment(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let rest = &l.args[2..];
    let c = rest
        .first()
        .ok_or_else(|| "'tcp-check comment' expects a string as argument.".to_string())?;
    no_extra(rest, 1, "tcp-check comment")?;
    d.tcp_check_comment = Some(c.clone());
    Ok(())
}

/// `tcp-check send STRING [comment C]`.
pub fn send(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let (data, comment) = send_words(l, "string")?;
    push_rule(d, TcpCheckAction::Send(data.as_bytes().to_vec()), comment);
    Ok(())
}

/// `tcp-check send-binary HEX [comment C]`.
pub fn send_binary(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let (data, comment) = send_words(l, "binary string")?;
    let bytes = parse_hex(data)
        .ok_or_else(|| format!("'tcp-check send-binary' : invalid hexadecimal string '{data}'."))?;
    push_rule(d, TcpCheckAction::Send(bytes), comment);
    Ok(())
}

/// The data and comment of `tcp-check send|send-binary DATA [comment C]`.
fn send_words<'a>(l: &Line<'a>, what: &str) -> Result<(&'a str, Option<String>), String> {
    let kw = format!("tcp-check {}", l.args[1]);
    let rest = &l.args[2..];
    let data = rest
        .first()
        .ok_or_else(|| format!("'{kw}' expects a {what} as argument."))?;
    let mut comment = None;
    match rest.get(1).map(String::as_str) {
        None => {}
        Some("comment") => {
            let v = rest
                .get(2)
                .ok_or_else(|| format!("'{kw}' : 'comment' expects a string as argument."))?;
            comment = Some(v.clone());
            no_extra(rest, 3, &kw)?;
        }
        Some(k) => {
            return Err(format!(
                "'{kw}' expects 'comment' but got '{k}' as argument."
            ))
        }
    }
    Ok((data.as_str(), comment))
}

/// What `tcp-check connect` options set.
#[derive(Default)]
pub struct Connect {
    port: Option<u16>,
    addr: Option<IpAddr>,
    ssl: bool,
    sni: Option<String>,
    comment: Option<String>,
}

impl Scope for Connect {
    fn here(&self) -> Sections {
        Sections::TCP_CHECK_CONNECT
    }
}

const C: Sections = Sections::TCP_CHECK_CONNECT;

/// The options of `tcp-check connect`, each with one value.
#[rustfmt::skip]
pub const CONNECT: &[Keyword<Connect>] = &[
    Keyword::new(&["port"],    C, Args::Required, connect_port),
    Keyword::new(&["addr"],    C, Args::Required, connect_addr),
    Keyword::new(&["comment"], C, Args::Required, connect_comment),
    Keyword::new(&["ssl"],     C, Args::None,     connect_ssl),
    Keyword::new(&["sni"],     C, Args::Required, connect_sni),
];

/// `tcp-check connect [port N] [addr A] [ssl] [sni NAME] [comment C]`.
pub fn connect(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let mut c = Connect::default();
    let args = l.args;
    options(CONNECT, &mut c, &args[2..], l, &|k| {
        if TCP_CHECK_CONNECT_UNSUPPORTED.contains(&k) {
            format!("'tcp-check connect' : '{k}' is not supported by shunt.")
        } else {
            format!(
                "'tcp-check connect' expects 'comment', 'port', 'addr', 'send-proxy', 'via-socks4', 'ssl', 'sni', 'alpn', 'proto', 'linger' or 'default' but got '{k}' as argument."
            )
        }
    })?;
    let action = TcpCheckAction::Connect {
        port: c.port,
        addr: c.addr,
        ssl: c.ssl,
        sni: c.sni,
    };
    push_rule(d, action, c.comment);
    Ok(())
}

fn connect_port(c: &mut Connect, l: &mut Line<'_>) -> Result<(), String> {
    c.port = Some(port_arg(l.arg(1), "tcp-check connect port")?);
    Ok(())
}

fn connect_addr(c: &mut Connect, l: &mut Line<'_>) -> Result<(), String> {
    let v = l.arg(1).ok_or_else(|| {
        "'tcp-check connect' : 'addr' expects an address as argument.".to_string()
    })?;
    c.addr = Some(v.parse::<IpAddr>().map_err(|_| {
        format!(
            "'tcp-check connect' : 'addr' : unexpected address '{v}' (shunt needs an IP address)."
        )
    })?);
    Ok(())
}

/// `ssl`: the connection is TLS, with the server's TLS settings.
fn connect_ssl(c: &mut Connect, _: &mut Line<'_>) -> Result<(), String> {
    c.ssl = true;
    Ok(())
}

/// `sni NAME`: a plain string, as `check-sni`.
fn connect_sni(c: &mut Connect, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| "'tcp-check connect' : 'sni' expects a string as argument.".to_string())?;
    c.sni = Some(v.to_ascii_lowercase());
    Ok(())
}

fn connect_comment(c: &mut Connect, l: &mut Line<'_>) -> Result<(), String> {
    let v = l.arg(1).ok_or_else(|| {
        "'tcp-check connect' : 'comment' expects a string as argument.".to_string()
    })?;
    c.comment = Some(v.to_string());
    Ok(())
}

const KW: &str = "tcp-check expect";

/// What `tcp-check expect` options set.
#[derive(Default)]
pub struct Expect {
    kind: Option<ExpectKind>,
    pattern: Option<String>,
    negate: bool,
    min_recv: Option<usize>,
    comment: Option<String>,
}

impl Scope for Expect {
    fn here(&self) -> Sections {
        Sections::TCP_CHECK_EXPECT
    }
}

const E: Sections = Sections::TCP_CHECK_EXPECT;

/// The options of `tcp-check expect`, in any order as HAProxy accepts them.
#[rustfmt::skip]
pub const EXPECT: &[Keyword<Expect>] = &[
    Keyword::new(&["!"],        E, Args::None,     expect_not),
    Keyword::new(&["min-recv"], E, Args::Required, expect_min_recv),
    Keyword::new(&["comment"],  E, Args::Required, expect_comment),
    Keyword::new(&["string"],   E, Args::Required, expect_pattern),
    Keyword::new(&["rstring"],  E, Args::Required, expect_pattern),
    Keyword::new(&["binary"],   E, Args::Required, expect_pattern),
    Keyword::new(&["rbinary"],  E, Args::Required, expect_pattern),
];

/// `tcp-check expect [min-recv N] [comment C] [!] string|rstring|binary|rbinary PATTERN`.
pub fn expect(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let mut e = Expect::default();
    let args = l.args;
    options(EXPECT, &mut e, &args[2..], l, &|k| {
        if TCP_CHECK_EXPECT_UNSUPPORTED.contains(&k) {
            format!("'{KW}' : '{k}' is not supported by shunt.")
        } else {
            format!(
                "'{KW}' only supports 'min-recv', 'comment', '!', 'string', 'rstring', 'binary' and 'rbinary' but got '{k}' as argument."
            )
        }
    })?;
    let (Some(kind), Some(pattern)) = (e.kind, e.pattern) else {
        return Err(format!(
            "'{KW}' : expects a pattern type ('string', 'rstring', 'binary' or 'rbinary')."
        ));
    };
    let bytes = match kind {
        ExpectKind::String => pattern.as_bytes().to_vec(),
        ExpectKind::Binary => parse_hex(&pattern)
            .ok_or_else(|| format!("'{KW}' : invalid hexadecimal string '{pattern}'."))?,
        ExpectKind::Rstring | ExpectKind::Rbinary => {
            if let Err(e) = regex_automata::meta::Regex::new(&pattern) {
                return Err(format!("'{KW}' : regex '{pattern}' : {e}."));
            }
            Vec::new()
        }
    };
    let expect = TcpExpect {
        kind,
        negate: e.negate,
        pattern,
        bytes,
        min_recv: e.min_recv,
    };
    push_rule(d, TcpCheckAction::Expect(expect), e.comment);
    Ok(())
}

fn expect_not(e: &mut Expect, _: &mut Line<'_>) -> Result<(), String> {
    e.negate = true;
    Ok(())
}

fn expect_min_recv(e: &mut Expect, l: &mut Line<'_>) -> Result<(), String> {
    let n: usize = int_arg(l.arg(1), "tcp-check expect min-recv")?;
    e.min_recv = Some(bounded(n, 0, MAX_MIN_RECV, "tcp-check expect min-recv")?);
    Ok(())
}

fn expect_comment(e: &mut Expect, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .ok_or_else(|| format!("'{KW}' : 'comment' expects a string as argument."))?;
    e.comment = Some(v.to_string());
    Ok(())
}

/// `string|rstring|binary|rbinary PATTERN`: one per rule.
fn expect_pattern(e: &mut Expect, l: &mut Line<'_>) -> Result<(), String> {
    let w = l.kw();
    if e.kind.is_some() {
        return Err(format!(
            "'{KW}' : only one pattern expected ('{w}' is one too many)."
        ));
    }
    let v = l
        .arg(1)
        .ok_or_else(|| format!("'{KW}' : '{w}' expects <pattern> as an argument."))?;
    e.kind = Some(match w {
        "string" => ExpectKind::String,
        "rstring" => ExpectKind::Rstring,
        "binary" => ExpectKind::Binary,
        _ => ExpectKind::Rbinary,
    });
    e.pattern = Some(v.to_string());
    Ok(())
}
