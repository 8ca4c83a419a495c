//! Server lines of proxy sections: `server NAME ADDR [KEYWORD [VALUE]]...`
//! and `default-server [KEYWORD [VALUE]]...`: their drafts and the keyword
//! table both share (`id` is the one `default-server` refuses).

use std::net::{IpAddr, SocketAddr};

use super::addr::parse_addr;
use super::model::*;
use super::{
    bounded, first_words, int_arg, invalid_name_char, options, port_arg, registered, suggest,
    time_arg, with_hint, Args, Keyword, Line, ProxyDraft, Scope, Sections, MAX_MAXCONN,
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
    pub send_proxy: SendProxy,
    /// `source ADDR[:PORT]`.
    pub source: Option<SocketAddr>,
    /// `ssl` (cleared by `no-ssl`): connections to the server are TLS.
    pub ssl: bool,
    /// `verify none|required`; `None`: HAProxy's default, required.
    pub verify: Option<bool>,
    /// `ca-file FILE` as written (resolved under `ca-base` by validation).
    pub ca_file: Option<String>,
    /// `sni EXPR`.
    pub sni: Option<SniExpr>,
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
            send_proxy: SendProxy::default(),
            source: None,
            ssl: false,
            verify: None,
            ca_file: None,
            sni: None,
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

/// What the keywords of one `server` or `default-server` line work on.
pub struct ServerLine {
    /// How messages name the server: its name, or `default-server`.
    who: String,
    opts: ServerOpts,
    id: Option<u32>,
    default_server: bool,
}

impl Scope for ServerLine {
    fn here(&self) -> Sections {
        if self.default_server {
            Sections::DEFAULT_SERVER
        } else {
            Sections::SERVER
        }
    }

    /// Only `default-server` refuses a keyword (`id`).
    fn refuse(&self, kw: &str) -> String {
        format!("'{kw}' is not allowed on 'default-server'.")
    }
}

const S: Sections = Sections::SERVER;
const SD: Sections = Sections::SERVER.or(Sections::DEFAULT_SERVER);

/// The keywords of `server` and `default-server` lines, in the order their
/// "Registered keywords" list them.
#[rustfmt::skip]
pub const SERVER: &[Keyword<ServerLine>] = &[
    Keyword::new(&["addr"],                SD, Args::Required, addr),
    Keyword::new(&["agent-addr"],          SD, Args::Required, agent_addr),
    Keyword::new(&["agent-check"],         SD, Args::None,     agent_check),
    Keyword::new(&["agent-inter"],         SD, Args::Required, agent_inter),
    Keyword::new(&["agent-port"],          SD, Args::Required, agent_port),
    Keyword::new(&["agent-send"],          SD, Args::Required, agent_send),
    Keyword::new(&["backup"],              SD, Args::None,     backup),
    Keyword::new(&["ca-file"],             SD, Args::Required, ca_file),
    Keyword::new(&["check"],               SD, Args::None,     check),
    Keyword::new(&["check-send-proxy"],    SD, Args::None,     check_send_proxy),
    Keyword::new(&["check-sni"],           SD, Args::Required, check_sni),
    Keyword::new(&["check-ssl"],           SD, Args::None,     check_ssl),
    Keyword::new(&["disabled"],            SD, Args::None,     disabled),
    Keyword::new(&["downinter"],           SD, Args::Required, downinter),
    Keyword::new(&["enabled"],             SD, Args::None,     enabled),
    Keyword::new(&["error-limit"],         SD, Args::Required, error_limit),
    Keyword::new(&["fall"],                SD, Args::Required, fall),
    Keyword::new(&["fastinter"],           SD, Args::Required, fastinter),
    Keyword::new(&["id"],                  S,  Args::Required, id),
    Keyword::new(&["inter"],               SD, Args::Required, inter),
    Keyword::new(&["maxconn"],             SD, Args::Required, maxconn),
    Keyword::new(&["maxqueue"],            SD, Args::Required, maxqueue),
    Keyword::new(&["no-agent-check"],      SD, Args::None,     no_agent_check),
    Keyword::new(&["no-backup"],           SD, Args::None,     no_backup),
    Keyword::new(&["no-check"],            SD, Args::None,     no_check),
    Keyword::new(&["no-check-send-proxy"], SD, Args::None,     no_check_send_proxy),
    Keyword::new(&["no-check-ssl"],        SD, Args::None,     no_check_ssl),
    Keyword::new(&["no-send-proxy"],       SD, Args::None,     no_send_proxy),
    Keyword::new(&["no-send-proxy-v2"],    SD, Args::None,     no_send_proxy_v2),
    Keyword::new(&["no-ssl"],              SD, Args::None,     no_ssl),
    Keyword::new(&["observe"],             SD, Args::Required, observe),
    Keyword::new(&["on-error"],            SD, Args::Required, on_error),
    Keyword::new(&["on-marked-down"],      SD, Args::Required, on_marked_down),
    Keyword::new(&["on-marked-up"],        SD, Args::Required, on_marked_up),
    Keyword::new(&["port"],                SD, Args::Required, port),
    Keyword::new(&["rise"],                SD, Args::Required, rise),
    Keyword::new(&["send-proxy"],          SD, Args::None,     send_proxy),
    Keyword::new(&["send-proxy-v2"],       SD, Args::None,     send_proxy_v2),
    Keyword::new(&["slowstart"],           SD, Args::Required, slowstart),
    Keyword::new(&["sni"],                 SD, Args::Required, sni),
    Keyword::new(&["source"],              SD, Args::Required, source),
    Keyword::new(&["ssl"],                 SD, Args::None,     ssl),
    Keyword::new(&["verify"],              SD, Args::Required, verify),
    Keyword::new(&["weight"],              SD, Args::Required, weight),
    Keyword::new(&["pool-max-conn"],       SD, Args::Required, pool_max_conn),
    Keyword::new(&["pool-low-conn"],       SD, Args::Required, pool_low_conn),
    Keyword::new(&["pool-purge-delay"],    SD, Args::Required, pool_purge_delay),
];

/// Parses the keywords after `server NAME ADDR` or `default-server`.
fn keywords(s: &mut ServerLine, words: &[String], l: &mut Line<'_>) -> Result<(), String> {
    options(SERVER, s, words, l, &|unknown| {
        let msg = format!("unknown keyword '{unknown}'");
        let msg = with_hint(msg, suggest(unknown, first_words(SERVER)));
        format!("{msg}. Registered keywords : {}.", registered(SERVER))
    })
}

/// `server NAME ADDR [KEYWORD [VALUE]]...`: a server preset by the
/// `default-server` line in force.
pub fn server(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let args = l.args;
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
    let mut s = ServerLine {
        who: name.clone(),
        opts: d.default_server.clone(),
        id: None,
        default_server: false,
    };
    keywords(&mut s, &args[3..], l).map_err(|e| format!("{who} : {e}"))?;
    d.servers.push(ServerDraft {
        name: name.clone(),
        addr: sockaddr,
        id: s.id,
        opts: s.opts,
        loc: l.loc.clone(),
    });
    Ok(())
}

/// `default-server [KEYWORD [VALUE]]...`: presets for the servers that
/// follow. Keywords before a bad one still apply, as they always have.
pub fn default_server(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let mut s = ServerLine {
        who: "default-server".to_string(),
        opts: std::mem::take(&mut d.default_server),
        id: None,
        default_server: true,
    };
    let args = l.args;
    let res = keywords(&mut s, &args[1..], l);
    d.default_server = s.opts;
    res.map_err(|e| format!("'default-server' : {e}"))
}

fn weight(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    let w: u32 = int_arg(l.arg(1), l.kw())?;
    if w > MAX_WEIGHT {
        return Err(format!(
            "weight of server {} is not within 0 and {MAX_WEIGHT} ({w}).",
            s.who
        ));
    }
    s.opts.weight = w;
    Ok(())
}

fn maxconn(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.maxconn = bounded(int_arg(l.arg(1), l.kw())?, 0, MAX_MAXCONN, l.kw())?;
    Ok(())
}

fn maxqueue(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.maxqueue = bounded(int_arg(l.arg(1), l.kw())?, 0, MAX_MAXCONN, l.kw())?;
    Ok(())
}

fn id(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    let n: u32 = int_arg(l.arg(1), l.kw())?;
    if n == 0 {
        return Err("'id' : custom id has to be > 0.".to_string());
    }
    s.id = Some(n);
    Ok(())
}

fn slowstart(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    // 0 disables it, as in HAProxy.
    let t = time_arg(l.arg(1), l.kw())?;
    s.opts.check.slowstart = (!t.is_zero()).then_some(t);
    Ok(())
}

fn agent_addr(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .ok_or_else(|| "'agent-addr' expects an address as argument.".to_string())?;
    if v.parse::<IpAddr>().is_err() {
        return Err(format!(
            "'agent-addr' : unexpected address '{v}' (shunt needs an IP address)."
        ));
    }
    s.opts.check.agent_addr = Some(v.to_string());
    Ok(())
}

fn agent_send(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .ok_or_else(|| "'agent-send' expects a string as argument.".to_string())?;
    s.opts.check.agent_send = Some(v.to_string());
    Ok(())
}

fn observe(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    match l.arg(1) {
        Some("layer4") => s.opts.check.observe_layer4 = true,
        Some("layer7") => {
            return Err("'observe layer7' is not supported by shunt (TCP only).".to_string())
        }
        other => {
            return Err(format!(
                "'observe' expects one of 'none', 'layer4', 'layer7' but got '{}'",
                other.unwrap_or("")
            ))
        }
    }
    Ok(())
}

/// A count that must be positive (`error-limit`, `rise`, `fall`).
fn positive(l: &Line<'_>) -> Result<u32, String> {
    let n: u32 = int_arg(l.arg(1), l.kw())?;
    if n == 0 {
        return Err(format!("'{}' has to be > 0.", l.kw()));
    }
    Ok(n)
}

fn error_limit(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.error_limit = Some(positive(l)?);
    Ok(())
}

fn rise(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.rise = Some(positive(l)?);
    Ok(())
}

fn fall(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.fall = Some(positive(l)?);
    Ok(())
}

fn on_error(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.on_error = Some(match l.arg(1) {
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
    Ok(())
}

fn on_marked_up(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    match l.arg(1) {
        Some("shutdown-backup-sessions") => s.opts.check.on_marked_up_shutdown_backup = true,
        other => {
            return Err(format!(
                "'on-marked-up' expects 'shutdown-backup-sessions' but got '{}'.",
                other.unwrap_or("")
            ))
        }
    }
    Ok(())
}

fn on_marked_down(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    match l.arg(1) {
        Some("shutdown-sessions") => s.opts.check.on_marked_down_shutdown = true,
        other => {
            return Err(format!(
                "'on-marked-down' expects 'shutdown-sessions' but got '{}'.",
                other.unwrap_or("")
            ))
        }
    }
    Ok(())
}

/// A check interval (`inter`, `fastinter`, `downinter`, `agent-inter`): 0 is refused.
fn interval(s: &ServerLine, l: &Line<'_>) -> Result<std::time::Duration, String> {
    let kw = l.kw();
    let t = time_arg(l.arg(1), kw)?;
    if t.is_zero() {
        return Err(format!(
            "invalid value 0 for argument '{kw}' of server {}.",
            s.who
        ));
    }
    Ok(t)
}

fn inter(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.inter = Some(interval(s, l)?);
    Ok(())
}

fn fastinter(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.fastinter = Some(interval(s, l)?);
    Ok(())
}

fn downinter(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.downinter = Some(interval(s, l)?);
    Ok(())
}

fn agent_inter(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.agent_inter = Some(interval(s, l)?);
    Ok(())
}

fn port(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.port = Some(port_arg(l.arg(1), l.kw())?);
    Ok(())
}

fn agent_port(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.agent_port = Some(port_arg(l.arg(1), l.kw())?);
    Ok(())
}

/// `source ADDR[:PORT]`: an IP address, with an optional port (0 or none:
/// the kernel picks one). HAProxy's port ranges (`ADDR:LOW-HIGH`) are refused.
pub fn source_addr(v: &str) -> Result<SocketAddr, String> {
    if v.is_empty() {
        return Err("expects <addr>[:<port>] as argument.".to_string());
    }
    if let Ok(ip) = v.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, 0));
    }
    if let Some(ip) = v
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .and_then(|r| r.parse::<IpAddr>().ok())
    {
        return Ok(SocketAddr::new(ip, 0));
    }
    if v.rsplit_once(':').is_some_and(|(_, p)| p.contains('-')) {
        return Err(format!(
            "port ranges are not supported by shunt (got '{v}')."
        ));
    }
    let addrs = parse_addr(v, false)?;
    match addrs.as_slice() {
        [a] if !a.ip().is_multicast() => Ok(*a),
        _ => Err(format!("invalid source address '{v}'.")),
    }
}

fn source(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    let v = l.arg(1).unwrap_or("");
    s.opts.source = Some(source_addr(v).map_err(|e| format!("'source' : {e}"))?);
    Ok(())
}

fn ssl(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.ssl = true;
    Ok(())
}

fn no_ssl(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.ssl = false;
    Ok(())
}

fn verify(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.verify = Some(match l.arg(1).unwrap_or("") {
        "none" => false,
        "required" => true,
        other => {
            return Err(format!(
            "'verify' : unknown verify method '{other}', only 'none' and 'required' are supported."
        ))
        }
    });
    Ok(())
}

fn ca_file(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| "'ca-file' : missing CAfile path".to_string())?;
    s.opts.ca_file = Some(v.to_string());
    Ok(())
}

/// `sni EXPR`: the sample expressions shunt can evaluate for a server's
/// handshake; HAProxy takes any, so others are named in the error.
fn sni(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    let v = l.arg(1).unwrap_or("");
    s.opts.sni = Some(match v {
        "req.ssl_sni" | "ssl_fc_sni" => SniExpr::Client,
        _ => match v.strip_prefix("str(").and_then(|r| r.strip_suffix(')')) {
            Some(name) if !name.is_empty() => SniExpr::Str(name.to_ascii_lowercase()),
            _ => {
                return Err(format!(
                    "'sni' : unsupported expression '{v}' (shunt evaluates str(NAME), req.ssl_sni and ssl_fc_sni)."
                ))
            }
        },
    });
    Ok(())
}

fn addr(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .ok_or_else(|| "'addr' expects an IP address.".to_string())?;
    if v.parse::<IpAddr>().is_err() {
        return Err(format!("'addr' expects an IP address (got '{v}')."));
    }
    s.opts.check.addr = Some(v.to_string());
    Ok(())
}

fn pool_max_conn(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    // -1 = unlimited; otherwise a count within the maxconn bound.
    s.opts.pool.max_conn = match l.arg(1) {
        Some("-1") => -1,
        val => bounded(int_arg(val, l.kw())?, 0, MAX_MAXCONN, l.kw())? as i64,
    };
    Ok(())
}

fn pool_low_conn(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.pool.low_conn = bounded(int_arg(l.arg(1), l.kw())?, 0, MAX_MAXCONN, l.kw())?;
    Ok(())
}

fn pool_purge_delay(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    s.opts.pool.purge_delay = time_arg(l.arg(1), l.kw())?;
    Ok(())
}

fn backup(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.backup = true;
    Ok(())
}

fn no_backup(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.backup = false;
    Ok(())
}

fn disabled(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.disabled = true;
    Ok(())
}

fn enabled(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.disabled = false;
    Ok(())
}

fn check(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.enabled = true;
    Ok(())
}

fn no_check(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.enabled = false;
    Ok(())
}

fn agent_check(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.agent_check = true;
    Ok(())
}

fn no_agent_check(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.agent_check = false;
    Ok(())
}

fn check_send_proxy(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.send_proxy = true;
    Ok(())
}

fn no_check_send_proxy(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.send_proxy = false;
    Ok(())
}

fn check_ssl(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.ssl = Some(true);
    Ok(())
}

fn no_check_ssl(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.check.ssl = Some(false);
    Ok(())
}

/// `check-sni NAME`: a plain string, as HAProxy's (no sample expression).
fn check_sni(s: &mut ServerLine, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| "'check-sni' : missing SNI.".to_string())?;
    s.opts.check.sni = Some(v.to_ascii_lowercase());
    Ok(())
}

fn send_proxy(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.send_proxy.v1 = true;
    Ok(())
}

fn no_send_proxy(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.send_proxy.v1 = false;
    Ok(())
}

fn send_proxy_v2(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.send_proxy.v2 = true;
    Ok(())
}

fn no_send_proxy_v2(s: &mut ServerLine, _: &mut Line<'_>) -> Result<(), String> {
    s.opts.send_proxy.v2 = false;
    Ok(())
}
