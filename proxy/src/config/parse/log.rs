//! Log targets and `ring` sections: the syntax of the words after `log`
//! (global and proxy alike), and the `ring` section's keyword table.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::addr::parse_addr;
use super::model::*;
use super::units::{parse_size, parse_time};
use super::{bounded, dispatch, int_arg, no_extra, Args, Keyword, Line, Scope, Sections};
use crate::config::logspec::{facility, level, DEFAULT_MAXLEN, MAX_MAXLEN, MIN_MAXLEN};

/// `size` of a ring when not configured (HAProxy's BUFSIZE).
pub const DEFAULT_RING_SIZE: usize = 16_384;
/// Bounds of a ring's `size`: one message must fit; beyond 64 MiB it is no longer a buffer.
pub const MIN_RING_SIZE: u64 = 1024;
pub const MAX_RING_SIZE: u64 = 64 << 20;
/// A ring's `timeout connect` when not configured.
pub const DEFAULT_RING_TIMEOUT_CONNECT: Duration = Duration::from_secs(1);
/// A ring's `timeout server` when not configured: a write stalled this long
/// drops the connection (and the ring reconnects).
pub const DEFAULT_RING_TIMEOUT_SERVER: Duration = Duration::from_secs(5);
/// Default syslog port of a `log ADDR` without one.
pub const SYSLOG_PORT: u16 = 514;

/// The words after `log` (global or proxy): `TARGET [len N] [format F] FACILITY [LEVEL [MINLEVEL]]`.
pub fn log_target(words: &[String]) -> Result<LogTarget, String> {
    let Some(target) = words.first() else {
        return Err("log : expects <address> and <facility> as arguments".to_string());
    };
    let dest = match target.as_str() {
        "stderr" | "fd@2" => LogDest::Stderr,
        "stdout" | "fd@1" => LogDest::Stdout,
        t if t.starts_with("ring@") => LogDest::Ring(t["ring@".len()..].to_string()),
        t if t.starts_with('/') || t.starts_with("unix@") => {
            LogDest::Unix(t.strip_prefix("unix@").unwrap_or(t).into())
        }
        t if t.starts_with("tcp@") => {
            return Err(format!(
                "log : '{t}' : TCP targets go through a 'ring' section in shunt (log ring@<name>)."
            ))
        }
        t => {
            let a = t
                .strip_prefix("udp@")
                .or_else(|| t.strip_prefix("ipv4@"))
                .or_else(|| t.strip_prefix("ipv6@"))
                .unwrap_or(t);
            // An address without a port: the syslog port (IPv6 needs brackets then).
            let with_port = match parse_addr(a, false) {
                Ok(v) => v,
                Err(_) if a.parse::<IpAddr>().is_ok() => {
                    vec![SocketAddr::new(
                        a.parse().map_err(|_| String::new())?,
                        SYSLOG_PORT,
                    )]
                }
                Err(e) => return Err(format!("log : {e}")),
            };
            match with_port.first() {
                Some(sa) if sa.port() == 0 => LogDest::Udp(SocketAddr::new(sa.ip(), SYSLOG_PORT)),
                Some(sa) => LogDest::Udp(*sa),
                None => return Err(format!("log : invalid address '{t}'")),
            }
        }
    };
    let mut t = LogTarget {
        dest,
        maxlen: DEFAULT_MAXLEN,
        format: SyslogFormat::default(),
        facility: 0,
        level: 7,
        minlevel: 0,
    };
    let mut i = 1;
    loop {
        match words.get(i).map(String::as_str) {
            Some("len") => {
                let n: usize = int_arg(words.get(i + 1).map(String::as_str), "log len")?;
                t.maxlen = bounded(n, MIN_MAXLEN, MAX_MAXLEN, "log len")?;
                i += 2;
            }
            Some("format") => {
                let f = words.get(i + 1).map(String::as_str).unwrap_or("");
                t.format = SyslogFormat::parse(f).ok_or_else(|| {
                    format!("log : unknown log format '{f}' (shunt supports rfc3164, rfc5424, short and raw)")
                })?;
                i += 2;
            }
            Some("sample") => return Err("log : 'sample' is not supported by shunt.".to_string()),
            _ => break,
        }
    }
    let fac = words
        .get(i)
        .ok_or_else(|| "log : expects <address> and <facility> as arguments".to_string())?;
    t.facility = facility(fac).ok_or_else(|| format!("log : unknown facility '{fac}'"))?;
    if let Some(l) = words.get(i + 1) {
        t.level = level(l).ok_or_else(|| format!("log : unknown optional log level '{l}'"))?;
    }
    if let Some(l) = words.get(i + 2) {
        t.minlevel =
            level(l).ok_or_else(|| format!("log : unknown optional minimum log level '{l}'"))?;
    }
    no_extra(words, i + 3, "log")?;
    Ok(t)
}

/// A new `ring NAME` with HAProxy's defaults.
pub fn new_ring(name: String, loc: &Location) -> Ring {
    Ring {
        name,
        format: SyslogFormat::Raw,
        maxlen: DEFAULT_MAXLEN,
        size: DEFAULT_RING_SIZE,
        timeout_connect: DEFAULT_RING_TIMEOUT_CONNECT,
        timeout_server: DEFAULT_RING_TIMEOUT_SERVER,
        servers: Vec::new(),
        line: loc.clone(),
    }
}

impl Scope for Ring {
    fn here(&self) -> Sections {
        Sections::RING
    }
}

const R: Sections = Sections::RING;

/// The keywords of a `ring` section.
#[rustfmt::skip]
pub const RING: &[Keyword<Ring>] = &[
    Keyword::new(&["description"], R, Args::Any,      description),
    Keyword::new(&["format"],      R, Args::Required, format),
    Keyword::new(&["maxlen"],      R, Args::Required, maxlen),
    Keyword::new(&["size"],        R, Args::Required, size),
    Keyword::new(&["timeout"],     R, Args::Required, timeout),
    Keyword::new(&["server"],      R, Args::Required, server),
];

/// One line of a `ring` section.
pub fn ring_line(r: &mut Ring, l: &mut Line<'_>) -> Result<(), String> {
    dispatch(RING, r, l)
        .unwrap_or_else(|| Err(format!("unknown keyword '{}' in 'ring' section", l.kw())))
}

fn description(_: &mut Ring, _: &mut Line<'_>) -> Result<(), String> {
    Ok(())
}

fn format(r: &mut Ring, l: &mut Line<'_>) -> Result<(), String> {
    let f = l.arg(1).unwrap_or("");
    r.format = SyslogFormat::parse(f).ok_or_else(|| {
        format!("unknown ring format '{f}' (shunt supports rfc3164, rfc5424, short and raw)")
    })?;
    no_extra(l.args, 2, l.kw())
}

fn maxlen(r: &mut Ring, l: &mut Line<'_>) -> Result<(), String> {
    r.maxlen = bounded(int_arg(l.arg(1), l.kw())?, MIN_MAXLEN, MAX_MAXLEN, l.kw())?;
    no_extra(l.args, 2, l.kw())
}

fn size(r: &mut Ring, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .ok_or_else(|| "'size' expects a size in bytes.".to_string())?;
    let n = parse_size(v).map_err(|e| format!("{e} in argument to 'size'."))?;
    if !(MIN_RING_SIZE..=MAX_RING_SIZE).contains(&n) {
        return Err(format!(
            "'size' value must be between {MIN_RING_SIZE} and {MAX_RING_SIZE} (was {n})"
        ));
    }
    r.size = usize::try_from(n).unwrap_or(DEFAULT_RING_SIZE);
    no_extra(l.args, 2, l.kw())
}

/// `timeout connect|server TIME`.
fn timeout(r: &mut Ring, l: &mut Line<'_>) -> Result<(), String> {
    let which = l.arg(1).unwrap_or("");
    let v = l
        .arg(2)
        .ok_or_else(|| format!("'timeout {which}' expects a time value."))?;
    let t = parse_time(v).map_err(|e| format!("{e} in 'timeout {which}'"))?;
    match which {
        "connect" => r.timeout_connect = t,
        "server" => r.timeout_server = t,
        _ => {
            return Err(format!(
                "'timeout' in a ring supports 'connect' and 'server' (got '{which}')"
            ))
        }
    }
    no_extra(l.args, 3, "timeout")
}

/// `server NAME [tcp@]ADDR:PORT [log-proto legacy|octet-count]`.
fn server(r: &mut Ring, l: &mut Line<'_>) -> Result<(), String> {
    let args = l.args;
    let (Some(name), Some(addr)) = (args.get(1), args.get(2)) else {
        return Err("'server' expects <name> and <addr>:<port> as arguments.".to_string());
    };
    let a = addr.strip_prefix("tcp@").unwrap_or(addr);
    let addr = parse_addr(a, false)
        .map_err(|e| format!("'server {name}' : {e}"))?
        .into_iter()
        .next()
        .filter(|a| a.port() != 0)
        .ok_or_else(|| format!("'server {name}' : a port is required ({addr})"))?;
    let mut proto = LogProto::Legacy;
    let mut i = 3;
    while i < args.len() {
        match args[i].as_str() {
            "log-proto" => {
                proto = match args.get(i + 1).map(String::as_str) {
                    Some("legacy") => LogProto::Legacy,
                    Some("octet-count") => LogProto::OctetCount,
                    other => {
                        return Err(format!(
                            "'log-proto' expects one of 'legacy' or 'octet-count' (got '{}').",
                            other.unwrap_or("")
                        ))
                    }
                };
                i += 2;
            }
            other => {
                return Err(format!(
                    "'server {name}' : unknown keyword '{other}' in a ring (shunt supports 'log-proto')."
                ))
            }
        }
    }
    r.servers.push(RingServer {
        name: name.clone(),
        addr,
        proto,
    });
    Ok(())
}
