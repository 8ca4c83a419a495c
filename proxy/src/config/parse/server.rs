//! Server lines of proxy sections: `server NAME ADDR [KEYWORD [VALUE]]...`
//! and `default-server [KEYWORD [VALUE]]...`, their drafts and keywords.

use std::net::{IpAddr, SocketAddr};

use super::addr::parse_addr;
use super::model::*;
use super::{
    bounded, int_arg, invalid_name_char, port_arg, suggest, time_arg, with_hint, Line, ProxyDraft,
    MAX_MAXCONN,
};

/// Server weights are 0..=256, as in HAProxy.
pub const MAX_WEIGHT: u32 = 256;
/// Default server weight.
pub const DEFAULT_WEIGHT: u32 = 1;

/// Server settings that `default-server` can preset.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerOpts {
    pub weight: u32,
    pub maxconn: usize,
    pub maxqueue: usize,
    pub backup: bool,
    pub disabled: bool,
    pub check: CheckParams,
    pub pool: PoolParams,
}

impl Default for ServerOpts {
    fn default() -> Self {
        Self {
            weight: DEFAULT_WEIGHT,
            maxconn: 0,
            maxqueue: 0,
            backup: false,
            disabled: false,
            check: CheckParams::default(),
            pool: PoolParams::default(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServerDraft {
    pub name: String,
    pub addr: SocketAddr,
    pub id: Option<u32>,
    pub opts: ServerOpts,
    pub loc: Location,
}

const SERVER_KEYWORDS: &[&str] = &[
    "addr",
    "agent-addr",
    "agent-check",
    "agent-inter",
    "agent-port",
    "agent-send",
    "backup",
    "check",
    "check-send-proxy",
    "disabled",
    "downinter",
    "enabled",
    "error-limit",
    "fall",
    "fastinter",
    "id",
    "inter",
    "maxconn",
    "maxqueue",
    "no-agent-check",
    "no-backup",
    "no-check",
    "no-check-send-proxy",
    "observe",
    "on-error",
    "on-marked-down",
    "on-marked-up",
    "port",
    "rise",
    "slowstart",
    "weight",
    "pool-max-conn",
    "pool-low-conn",
    "pool-purge-delay",
];

/// Parses the keywords after `server NAME ADDR` or `default-server`.
/// `id` is `None` for `default-server`, which cannot carry an id.
fn server_keywords(
    words: &[String],
    who: &str,
    opts: &mut ServerOpts,
    mut id: Option<&mut Option<u32>>,
) -> Result<(), String> {
    let mut i = 0;
    while i < words.len() {
        let kw = words[i].as_str();
        let val = words.get(i + 1).map(String::as_str);
        let mut takes_value = true;
        match kw {
            "weight" => {
                let w: u32 = int_arg(val, kw)?;
                if w > MAX_WEIGHT {
                    return Err(format!(
                        "weight of server {who} is not within 0 and {MAX_WEIGHT} ({w})."
                    ));
                }
                opts.weight = w;
            }
            "maxconn" => opts.maxconn = bounded(int_arg(val, kw)?, 0, MAX_MAXCONN, kw)?,
            "maxqueue" => opts.maxqueue = bounded(int_arg(val, kw)?, 0, MAX_MAXCONN, kw)?,
            "id" => {
                let Some(slot) = id.as_deref_mut() else {
                    return Err("'id' is not allowed on 'default-server'.".to_string());
                };
                let n: u32 = int_arg(val, kw)?;
                if n == 0 {
                    return Err("'id' : custom id has to be > 0.".to_string());
                }
                *slot = Some(n);
            }
            "slowstart" => {
                // 0 disables it, as in HAProxy.
                let t = time_arg(val, kw)?;
                opts.check.slowstart = (!t.is_zero()).then_some(t);
            }
            "agent-addr" => {
                let v =
                    val.ok_or_else(|| "'agent-addr' expects an address as argument.".to_string())?;
                if v.parse::<IpAddr>().is_err() {
                    return Err(format!(
                        "'agent-addr' : unexpected address '{v}' (shunt needs an IP address)."
                    ));
                }
                opts.check.agent_addr = Some(v.to_string());
            }
            "agent-send" => {
                let v =
                    val.ok_or_else(|| "'agent-send' expects a string as argument.".to_string())?;
                opts.check.agent_send = Some(v.to_string());
            }
            "observe" => match val {
                Some("layer4") => opts.check.observe_layer4 = true,
                Some("layer7") => {
                    return Err("'observe layer7' is not supported by shunt (TCP only).".to_string())
                }
                other => {
                    return Err(format!(
                        "'observe' expects one of 'none', 'layer4', 'layer7' but got '{}'",
                        other.unwrap_or("")
                    ))
                }
            },
            "error-limit" => {
                let n: u32 = int_arg(val, kw)?;
                if n == 0 {
                    return Err(format!("'{kw}' has to be > 0."));
                }
                opts.check.error_limit = Some(n);
            }
            "on-error" => {
                opts.check.on_error = Some(match val {
                    Some("fastinter") => OnError::Fastinter,
                    Some("fail-check") => OnError::FailCheck,
                    Some("sudden-death") => OnError::SuddenDeath,
                    Some("mark-down") => OnError::MarkDown,
                    other => {
                        return Err(format!(
                            "'on-error' expects one of 'fastinter', 'fail-check', 'sudden-death' or 'mark-down' but got '{}'",
                            other.unwrap_or("")
                        ))
                    }
                });
            }
            "on-marked-up" => match val {
                Some("shutdown-backup-sessions") => opts.check.on_marked_up_shutdown_backup = true,
                other => {
                    return Err(format!(
                        "'on-marked-up' expects 'shutdown-backup-sessions' but got '{}'.",
                        other.unwrap_or("")
                    ))
                }
            },
            "inter" | "fastinter" | "downinter" | "agent-inter" => {
                let t = time_arg(val, kw)?;
                if t.is_zero() {
                    return Err(format!(
                        "invalid value 0 for argument '{kw}' of server {who}."
                    ));
                }
                let c = &mut opts.check;
                match kw {
                    "inter" => c.inter = Some(t),
                    "fastinter" => c.fastinter = Some(t),
                    "downinter" => c.downinter = Some(t),
                    _ => c.agent_inter = Some(t),
                }
            }
            "rise" | "fall" => {
                let n: u32 = int_arg(val, kw)?;
                if n == 0 {
                    return Err(format!("'{kw}' has to be > 0."));
                }
                if kw == "rise" {
                    opts.check.rise = Some(n);
                } else {
                    opts.check.fall = Some(n);
                }
            }
            "port" => opts.check.port = Some(port_arg(val, kw)?),
            "agent-port" => opts.check.agent_port = Some(port_arg(val, kw)?),
            "addr" => {
                let v = val.ok_or_else(|| "'addr' expects an IP address.".to_string())?;
                if v.parse::<IpAddr>().is_err() {
                    return Err(format!("'addr' expects an IP address (got '{v}')."));
                }
                opts.check.addr = Some(v.to_string());
            }
            "on-marked-down" => match val {
                Some("shutdown-sessions") => opts.check.on_marked_down_shutdown = true,
                other => {
                    return Err(format!(
                        "'on-marked-down' expects 'shutdown-sessions' but got '{}'.",
                        other.unwrap_or("")
                    ))
                }
            },
            "pool-max-conn" => {
                // -1 = unlimited; otherwise a count within the maxconn bound.
                opts.pool.max_conn = match val {
                    Some("-1") => -1,
                    _ => bounded(int_arg(val, kw)?, 0, MAX_MAXCONN, kw)? as i64,
                };
            }
            "pool-low-conn" => opts.pool.low_conn = bounded(int_arg(val, kw)?, 0, MAX_MAXCONN, kw)?,
            "pool-purge-delay" => opts.pool.purge_delay = time_arg(val, kw)?,
            flag => {
                takes_value = false;
                match flag {
                    "backup" => opts.backup = true,
                    "no-backup" => opts.backup = false,
                    "disabled" => opts.disabled = true,
                    "enabled" => opts.disabled = false,
                    "check" => opts.check.enabled = true,
                    "no-check" => opts.check.enabled = false,
                    "agent-check" => opts.check.agent_check = true,
                    "check-send-proxy" => opts.check.send_proxy = true,
                    "no-check-send-proxy" => opts.check.send_proxy = false,
                    "no-agent-check" => opts.check.agent_check = false,
                    unknown => {
                        let msg = format!("unknown keyword '{unknown}'");
                        let msg = with_hint(msg, suggest(unknown, SERVER_KEYWORDS.iter().copied()));
                        return Err(format!(
                            "{msg}. Registered keywords : {}.",
                            SERVER_KEYWORDS.join(", ")
                        ));
                    }
                }
            }
        }
        i += if takes_value { 2 } else { 1 };
    }
    Ok(())
}

fn server_line(d: &mut ProxyDraft, args: &[String], loc: &Location) -> Result<(), String> {
    let (Some(name), Some(addr)) = (args.get(1), args.get(2)) else {
        return Err("'server' expects <name> and <addr>[:<port>] as arguments.".to_string());
    };
    if let Some(c) = invalid_name_char(name) {
        return Err(format!(
            "character '{c}' is not permitted in server name '{name}'."
        ));
    }
    if let Some(prev) = d.servers.iter().find(|s| s.name == *name) {
        return Err(format!(
            "{} '{}', another server named '{name}' was already defined at line {}, please use distinct names.",
            d.kind.type_str(),
            d.name,
            prev.loc.line
        ));
    }
    let who = format!("'server {}/{name}'", d.name);
    let sockaddr = parse_addr(addr, false)
        .map_err(|e| format!("{who} : {e}"))?
        .into_iter()
        .next()
        .ok_or_else(|| format!("{who} : no address in '{addr}'"))?;
    let mut opts = d.default_server.clone();
    let mut id = None;
    server_keywords(&args[3..], name, &mut opts, Some(&mut id))
        .map_err(|e| format!("{who} : {e}"))?;
    d.servers.push(ServerDraft {
        name: name.clone(),
        addr: sockaddr,
        id,
        opts,
        loc: loc.clone(),
    });
    Ok(())
}

/// `server NAME ADDR [KEYWORD [VALUE]]...`.
pub fn server(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    server_line(d, l.args, l.loc)
}

/// `default-server [KEYWORD [VALUE]]...`.
pub fn default_server(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    server_keywords(&l.args[1..], "default-server", &mut d.default_server, None)
        .map_err(|e| format!("'default-server' : {e}"))
}
