//! The options of a `bind` line (`bind ADDR[,ADDR...] [KEYWORD [VALUE]]...`):
//! their draft ([`BindOpts`], in the model) and their keyword table.
//!
//! Only what a TCP listener can honour is here: the socket options and TLS
//! termination (`ssl`, `crt`, `alpn`, `ssl-min-ver`); HAProxy's other TLS and
//! HTTP options are not in the table, so they stay "unknown keyword" errors
//! that list the registered ones. Values are checked here; the socket
//! options themselves are set by `crate::listeners`, and the `crt` files
//! are read by validation (after `crt-base` is known).

use super::model::*;
use super::{
    bounded, first_words, int_arg, options, registered, suggest, with_hint, Args, Keyword, Line,
    Scope, Sections, MAX_MAXCONN,
};

/// Largest `backlog`: the kernel caps `listen(2)` at `net.core.somaxconn`
/// anyway; beyond the maxconn bound it is a typo.
const MAX_BACKLOG: usize = MAX_MAXCONN;
/// Longest interface name Linux accepts (`IFNAMSIZ` 16, with its NUL).
const MAX_IFNAME: usize = 15;

/// What the keywords of one `bind` line work on.
pub struct BindLine {
    pub opts: BindOpts,
}

impl Scope for BindLine {
    fn here(&self) -> Sections {
        Sections::BIND
    }
}

const B: Sections = Sections::BIND;

/// The keywords after `bind ADDR`, in the order "Registered keywords" lists them.
#[rustfmt::skip]
pub const BIND: &[Keyword<BindLine>] = &[
    Keyword::new(&["accept-proxy"], B, Args::None,     accept_proxy),
    Keyword::new(&["alpn"],         B, Args::Required, alpn),
    Keyword::new(&["backlog"],      B, Args::Required, backlog),
    Keyword::new(&["crt"],          B, Args::Required, crt),
    Keyword::new(&["defer-accept"], B, Args::None,     defer_accept),
    Keyword::new(&["interface"],    B, Args::Required, interface),
    Keyword::new(&["maxconn"],      B, Args::Required, maxconn),
    Keyword::new(&["name"],         B, Args::Required, name),
    Keyword::new(&["ssl"],          B, Args::None,     ssl),
    Keyword::new(&["ssl-min-ver"],  B, Args::Required, ssl_min_ver),
    Keyword::new(&["tfo"],          B, Args::None,     tfo),
    Keyword::new(&["transparent"],  B, Args::None,     transparent),
    Keyword::new(&["v4v6"],         B, Args::None,     v4v6),
    Keyword::new(&["v6only"],       B, Args::None,     v6only),
];

/// Parses the words after the address list of `bind LIST` (HAProxy's
/// message for an unknown one, with the keywords shunt registers).
/// A keyword's own error is prefixed as HAProxy's: `'bind LIST' in section
/// 'SECTION' : ...`.
pub fn parse(words: &[String], l: &mut Line<'_>, section: &str) -> Result<BindOpts, String> {
    let list = l.arg(1).unwrap_or("").to_string();
    let mut b = BindLine {
        opts: BindOpts::default(),
    };
    let was_unknown = std::cell::Cell::new(false);
    options(BIND, &mut b, words, l, &|unknown| {
        was_unknown.set(true);
        let msg = format!("'bind {list}' unknown keyword '{unknown}'");
        let msg = with_hint(msg, suggest(unknown, first_words(BIND)));
        format!("{msg}. Registered keywords : {}.", registered(BIND))
    })
    .map_err(|e| match was_unknown.get() {
        true => e,
        false => format!("'bind {list}' in section '{section}' : {e}"),
    })?;
    if b.opts.v4v6 && b.opts.v6only {
        return Err(format!(
            "'bind {list}' : 'v4v6' and 'v6only' cannot be used together."
        ));
    }
    Ok(b.opts)
}

fn accept_proxy(b: &mut BindLine, _: &mut Line<'_>) -> Result<(), String> {
    b.opts.accept_proxy = true;
    Ok(())
}

/// Longest ALPN protocol name (the wire's length byte).
const MAX_ALPN_NAME: usize = 255;

fn alpn(b: &mut BindLine, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| "'alpn' : missing the comma-delimited ALPN protocol suite".to_string())?;
    let names: Vec<String> = v.split(',').map(str::to_string).collect();
    if names
        .iter()
        .any(|n| n.is_empty() || n.len() > MAX_ALPN_NAME)
    {
        return Err(format!("'alpn' : invalid protocol suite '{v}'"));
    }
    b.opts.alpn = names;
    Ok(())
}

fn crt(b: &mut BindLine, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| "'crt' : missing certificate location".to_string())?;
    b.opts.crt.push(v.to_string());
    Ok(())
}

fn ssl(b: &mut BindLine, _: &mut Line<'_>) -> Result<(), String> {
    b.opts.ssl = true;
    Ok(())
}

fn ssl_min_ver(b: &mut BindLine, l: &mut Line<'_>) -> Result<(), String> {
    let v = l.arg(1).unwrap_or("");
    b.opts.ssl_min_ver = Some(TlsVersion::parse(v)?);
    Ok(())
}

fn backlog(b: &mut BindLine, l: &mut Line<'_>) -> Result<(), String> {
    let n = bounded(int_arg(l.arg(1), l.kw())?, 1, MAX_BACKLOG, l.kw())?;
    // Bounded by MAX_BACKLOG above, far below u32::MAX.
    b.opts.backlog = Some(n as u32);
    Ok(())
}

fn maxconn(b: &mut BindLine, l: &mut Line<'_>) -> Result<(), String> {
    let n = bounded(int_arg(l.arg(1), l.kw())?, 1, MAX_MAXCONN, l.kw())?;
    b.opts.maxconn = Some(n);
    Ok(())
}

fn name(b: &mut BindLine, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| "'name' : missing name".to_string())?;
    b.opts.name = Some(v.to_string());
    Ok(())
}

fn interface(b: &mut BindLine, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| "'interface' : missing interface name".to_string())?;
    if v.len() > MAX_IFNAME || v.contains(['/', ' ']) {
        return Err(format!("'interface' : invalid interface name '{v}'"));
    }
    b.opts.interface = Some(v.to_string());
    Ok(())
}

fn defer_accept(b: &mut BindLine, _: &mut Line<'_>) -> Result<(), String> {
    b.opts.defer_accept = true;
    Ok(())
}

fn tfo(b: &mut BindLine, _: &mut Line<'_>) -> Result<(), String> {
    b.opts.tfo = true;
    Ok(())
}

fn transparent(b: &mut BindLine, _: &mut Line<'_>) -> Result<(), String> {
    b.opts.transparent = true;
    Ok(())
}

fn v4v6(b: &mut BindLine, _: &mut Line<'_>) -> Result<(), String> {
    b.opts.v4v6 = true;
    Ok(())
}

fn v6only(b: &mut BindLine, _: &mut Line<'_>) -> Result<(), String> {
    b.opts.v6only = true;
    Ok(())
}
