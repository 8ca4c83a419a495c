//! The global `stats` keywords (`socket`, `timeout`, `maxconn`, `show-name`,
//! `prometheus`) and the option table of a `stats socket PATH ...` line.

use super::addr::parse_addr;
use super::global::GlobalDraft;
use super::model::*;
use super::units::parse_time;
use super::{bounded, int_arg, no_extra, options, registered, Args, Keyword, Line, Scope};
use super::{Sections, MAX_MAXCONN};

/// Largest `stats socket ... mode` (permission bits plus setuid/setgid/sticky).
pub const MAX_SOCKET_MODE: u32 = 0o7777;

impl Scope for StatsSocket {
    fn here(&self) -> Sections {
        Sections::STATS_SOCKET
    }
}

const S: Sections = Sections::STATS_SOCKET;

/// The keywords after `stats socket PATH`, each with one value.
#[rustfmt::skip]
pub const SOCKET: &[Keyword<StatsSocket>] = &[
    Keyword::new(&["mode"],      S, Args::Required, mode),
    Keyword::new(&["level"],     S, Args::Required, level),
    Keyword::new(&["user"],      S, Args::Required, user),
    Keyword::new(&["group"],     S, Args::Required, group),
    Keyword::new(&["expose-fd"], S, Args::Required, expose_fd),
];

/// `stats WORD` for a WORD no entry of the global table holds.
pub fn other(_: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    Err(format!(
        "'stats' only supports 'socket', 'maxconn' and 'timeout' (got '{}')",
        l.arg(1).unwrap_or("")
    ))
}

pub fn timeout(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(2)
        .ok_or_else(|| "'stats timeout' expects a time value.".to_string())?;
    let t = parse_time(v).map_err(|e| format!("'stats timeout' : {e}"))?;
    if t.is_zero() {
        return Err("'stats timeout' expects a positive value".to_string());
    }
    g.global.stats_timeout = t;
    no_extra(l.args, 3, l.kw())
}

pub fn show_name(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(2)
        .ok_or_else(|| "'stats show-name' expects a name.".to_string())?;
    g.global.stats_show_name = Some(v.to_string());
    no_extra(l.args, 3, l.kw())
}

pub fn maxconn(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    let n: usize = int_arg(l.arg(2), "stats maxconn")?;
    if n == 0 {
        return Err("'stats maxconn' expects a positive value".to_string());
    }
    g.global.stats_maxconn = bounded(n, 1, MAX_MAXCONN, "stats maxconn")?;
    no_extra(l.args, 3, l.kw())
}

/// `stats prometheus bind ADDR:PORT` (shunt's own: HAProxy serves its
/// exporter from an HTTP frontend, which shunt does not have).
pub fn prometheus(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    let addr = match (l.arg(2), l.arg(3)) {
        (Some("bind"), Some(a)) => a,
        _ => return Err("'stats prometheus' expects 'bind <addr>:<port>'.".to_string()),
    };
    let addrs = parse_addr(addr, false).map_err(|e| format!("'stats prometheus' : {e}"))?;
    g.global.prometheus = addrs.first().copied();
    no_extra(l.args, 4, l.kw())
}

/// `stats socket [unix@]PATH [KEYWORD VALUE]...`.
pub fn socket(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    let Some(path) = l.arg(2) else {
        return Err("'stats socket' in global section expects a path to a UNIX socket".to_string());
    };
    if path.contains('@') && !path.starts_with("unix@") {
        return Err(format!(
            "'stats socket' : only UNIX sockets are supported by shunt (got '{path}')"
        ));
    }
    let path = path.strip_prefix("unix@").unwrap_or(path);
    let mut sock = StatsSocket {
        path: path.into(),
        mode: 0o600,
        level: CliLevel::default(),
        user: None,
        group: None,
        expose_fd_listeners: false,
    };
    let args = l.args;
    options(SOCKET, &mut sock, &args[3..], l, &|kw| {
        format!(
            "'stats socket' : unknown keyword '{kw}'. Registered keywords : {}.",
            registered(SOCKET)
        )
    })?;
    g.global.stats_sockets.push(sock);
    Ok(())
}

fn mode(s: &mut StatsSocket, l: &mut Line<'_>) -> Result<(), String> {
    let v = l.arg(1);
    s.mode = v
        .and_then(|m| u32::from_str_radix(m, 8).ok())
        .filter(|m| *m <= MAX_SOCKET_MODE)
        .ok_or_else(|| {
            format!(
                "'stats socket' : 'mode' : missing or invalid mode '{}' (octal integer expected)",
                v.unwrap_or("")
            )
        })?;
    Ok(())
}

fn level(s: &mut StatsSocket, l: &mut Line<'_>) -> Result<(), String> {
    s.level = match l.arg(1) {
        Some("user") => CliLevel::User,
        Some("operator") => CliLevel::Operator,
        Some("admin") => CliLevel::Admin,
        other => {
            return Err(format!(
                "'stats socket' : 'level' only supports 'user', 'operator', and 'admin' (got '{}')",
                other.unwrap_or("")
            ))
        }
    };
    Ok(())
}

fn name_arg(l: &Line<'_>) -> Result<String, String> {
    let v = l
        .arg(1)
        .ok_or_else(|| format!("'stats socket' : '{}' expects a name.", l.kw()))?;
    Ok(v.to_string())
}

fn user(s: &mut StatsSocket, l: &mut Line<'_>) -> Result<(), String> {
    s.user = Some(name_arg(l)?);
    Ok(())
}

fn group(s: &mut StatsSocket, l: &mut Line<'_>) -> Result<(), String> {
    s.group = Some(name_arg(l)?);
    Ok(())
}

fn expose_fd(s: &mut StatsSocket, l: &mut Line<'_>) -> Result<(), String> {
    let v = l.arg(1);
    if v != Some("listeners") {
        return Err(format!(
            "'stats socket' : 'expose-fd' only supports 'listeners' (got '{}')",
            v.unwrap_or("")
        ));
    }
    s.expose_fd_listeners = true;
    Ok(())
}
