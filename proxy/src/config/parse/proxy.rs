//! Proxy sections (`defaults`, `frontend`, `backend`, `listen`): their draft,
//! their keyword table and the keywords of their own.
//!
//! The table also holds the `tcp-request` ([`super::tcp_request`]),
//! `tcp-check` ([`super::tcp_check`]) and `server`/`default-server`
//! ([`super::server`]) families, whose parse fns live with them.

use std::net::SocketAddr;

use super::acl::{self, NamedAcl};
use super::addr::parse_addr;
use super::log::log_target;
use super::model::*;
use super::server::{self, ServerDraft, ServerOpts};
use super::units::parse_time;
use super::{
    bounded, dispatch, first_words, int_arg, no_extra, not_applicable, section_names, suggest,
    tcp_check, tcp_request, with_hint, Args, Keyword, Line, Scope, Sections, MAX_MAXCONN,
};

/// Default `retries`, as in HAProxy.
pub const DEFAULT_RETRIES: u32 = 3;
/// Each retry is a new connect attempt; more than this is a typo, not a policy.
pub const MAX_RETRIES: u32 = 100;

/// The kind of section a draft comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Defaults,
    Frontend,
    Backend,
    Listen,
}

impl Kind {
    /// Has frontend capability (accepts connections).
    pub fn fe(self) -> bool {
        matches!(self, Kind::Frontend | Kind::Listen)
    }
    /// Has backend capability (holds servers).
    pub fn be(self) -> bool {
        matches!(self, Kind::Backend | Kind::Listen)
    }
    /// The section keyword.
    pub fn section(self) -> &'static str {
        match self {
            Kind::Defaults => "defaults",
            Kind::Frontend => "frontend",
            Kind::Backend => "backend",
            Kind::Listen => "listen",
        }
    }
    /// How HAProxy names a proxy of this kind in messages (`proxy_type_str`).
    pub fn type_str(self) -> &'static str {
        match self {
            Kind::Defaults => "defaults",
            Kind::Frontend => "frontend",
            Kind::Backend => "backend",
            Kind::Listen => "proxy",
        }
    }
}
/// A `defaults`, `frontend`, `backend` or `listen` section as parsed.
#[derive(Debug, Clone)]
pub struct ProxyDraft {
    pub kind: Kind,
    /// Empty for an unnamed defaults section.
    pub name: String,
    pub loc: Location,
    pub timeouts: Timeouts,
    pub retries: u32,
    pub balance: Balance,
    /// Frontend `maxconn`.
    pub maxconn: usize,
    /// Backend `fullconn`.
    pub fullconn: usize,
    pub redispatch: bool,
    pub splice: SpliceOpts,
    pub log_global: bool,
    /// Own `log` lines, and the line of each (same index).
    pub logs: Vec<LogTarget>,
    pub log_locs: Vec<Location>,
    /// `option tcplog`, `option dontlognull`, `log-format`.
    pub tcplog: bool,
    pub dontlognull: bool,
    pub log_format: Option<LogFormat>,
    pub default_backend: Option<(String, Location)>,
    /// Each rule with its condition.
    pub use_backends: Vec<(UseBackendDraft, Option<Cond>, Location)>,
    /// Named ACLs declared so far (never in a defaults section).
    pub acls: Vec<NamedAcl>,
    /// `tcp-request connection` rules, in order.
    pub tcp_connection: Vec<TcpConnRule>,
    /// `tcp-request content` rules, in order.
    pub tcp_content: Vec<ContentRule>,
    /// The line of each `tcp_connection` rule (same index).
    pub tcp_connection_locs: Vec<Location>,
    /// `stick-table`: the proxy's own table.
    pub stick_table: Option<TableSpec>,
    /// `stick on|match|store-request` rules, in order.
    pub stick_rules: Vec<StickRule>,
    /// Each address of each `bind` line, with that line's options.
    pub binds: Vec<(SocketAddr, BindOpts, Location)>,
    pub servers: Vec<ServerDraft>,
    pub default_server: ServerOpts,
    /// `option tcp-check`.
    pub tcp_check: bool,
    /// `tcp-check` rules, in order.
    pub tcp_check_rules: Vec<TcpCheckRule>,
    /// The rules came from a defaults section: the proxy's first own rule replaces
    /// them (HAProxy does not merge the two lists).
    pub tcp_check_inherited: bool,
    /// A `tcp-check comment` waiting for the rule it describes.
    pub tcp_check_comment: Option<String>,
    /// `load-server-state-from-file global` (true) or `none` (false, the default).
    pub load_server_state: bool,
    /// Where a `defaults` section said `mode http` (a proxy that inherits it
    /// without its own `mode tcp` is refused by validation).
    pub mode_http: Option<Location>,
    /// Where the section itself said `mode http` (a frontend or listen: allowed
    /// only for the stats page, `validate.rs`).
    pub mode_http_own: Option<Location>,
    /// `stats ...` lines: the section is a stats page.
    pub stats: Option<super::stats::StatsDraft>,
    /// Where `option httplog` was set: a frontend logs with `option tcplog`
    /// instead, and validation warns as HAProxy does for a TCP frontend.
    pub httplog: Option<Location>,
    /// `option clitcpka` / `option srvtcpka` (`option tcpka` sets both).
    pub clitcpka: bool,
    pub srvtcpka: bool,
    /// `option allbackups`, `option log-health-checks`, `hash-type`.
    pub allbackups: bool,
    pub log_health_checks: bool,
    pub hash_type: HashType,
    /// `source ADDR[:PORT]` of the section, for servers without their own.
    pub source: Option<SocketAddr>,
}

impl ProxyDraft {
    pub fn fresh(kind: Kind, name: &str, loc: &Location) -> Self {
        Self {
            kind,
            name: name.to_string(),
            loc: loc.clone(),
            timeouts: Timeouts::default(),
            retries: DEFAULT_RETRIES,
            balance: Balance::default(),
            maxconn: 0,
            fullconn: 0,
            redispatch: false,
            splice: SpliceOpts::default(),
            log_global: false,
            logs: Vec::new(),
            log_locs: Vec::new(),
            tcplog: false,
            dontlognull: false,
            log_format: None,
            default_backend: None,
            use_backends: Vec::new(),
            acls: Vec::new(),
            tcp_connection: Vec::new(),
            tcp_content: Vec::new(),
            tcp_connection_locs: Vec::new(),
            stick_table: None,
            stick_rules: Vec::new(),
            binds: Vec::new(),
            servers: Vec::new(),
            default_server: ServerOpts::default(),
            tcp_check: false,
            tcp_check_rules: Vec::new(),
            tcp_check_inherited: false,
            tcp_check_comment: None,
            load_server_state: false,
            mode_http: None,
            mode_http_own: None,
            stats: None,
            httplog: None,
            clitcpka: false,
            srvtcpka: false,
            allbackups: false,
            log_health_checks: false,
            hash_type: HashType::MapBased,
            source: None,
        }
    }
}

/// A `use_backend` target before names and files are resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UseBackendDraft {
    /// A backend name.
    Name(String),
    /// `%[src,map_ip(PATH[,DEFAULT])]`.
    SrcMap {
        path: String,
        default: Option<String>,
    },
    /// `%[req.ssl_sni[,lower|upper],map|map_str|map_dom|map_beg(PATH[,DEFAULT])]`.
    SniMap {
        path: String,
        default: Option<String>,
        how: NameMatch,
    },
}

/// The fetches a dynamic backend name may start with, and whether each is
/// the TLS server name (else the client address).
const NAME_FETCHES: &[(&str, bool)] =
    &[("src", false), ("req.ssl_sni", true), ("req_ssl_sni", true)];

/// Case converters allowed between the server name and its map: shunt's string
/// maps compare in ASCII lower case, so either leaves the lookup as it was.
const CASE_CONVERTERS: &[&str] = &["lower", "upper"];

/// One link of a sample expression: a name and its parenthesised arguments.
fn chain(expr: &str) -> Option<Vec<(&str, Option<&str>)>> {
    let mut out = Vec::new();
    let mut rest = expr;
    while !rest.is_empty() {
        let end = rest.find(['(', ',']).unwrap_or(rest.len());
        let name = &rest[..end];
        rest = &rest[end..];
        let mut args = None;
        if let Some(r) = rest.strip_prefix('(') {
            let close = r.find(')')?;
            args = Some(&r[..close]);
            rest = &r[close + 1..];
        }
        if name.is_empty() {
            return None;
        }
        out.push((name, args));
        match rest.strip_prefix(',') {
            Some(r) if !r.is_empty() => rest = r,
            Some(_) => return None,
            None if rest.is_empty() => {}
            None => return None,
        }
    }
    Some(out)
}

/// Parse a `use_backend` argument: a plain name, or `%[FETCH,...,MAP(FILE[,DEFAULT])]`
/// with FETCH `src` and MAP `map_ip`, or FETCH `req.ssl_sni` (or `req_ssl_sni`), any
/// `lower`/`upper`, and MAP `map`, `map_str`, `map_dom` or `map_beg`.
pub fn parse_use_backend(arg: &str) -> Result<UseBackendDraft, String> {
    if !arg.contains("%[") {
        return Ok(UseBackendDraft::Name(arg.to_string()));
    }
    let unsupported = || {
        format!(
            "'use_backend' : unsupported dynamic backend name '{arg}' (shunt supports only '%[src,map_ip(<file>[,<default>])]' and '%[req.ssl_sni[,lower|upper],map|map_str|map_dom|map_beg(<file>[,<default>])]')."
        )
    };
    let links = arg
        .strip_prefix("%[")
        .and_then(|r| r.strip_suffix(']'))
        .and_then(chain)
        .ok_or_else(unsupported)?;
    let (Some(&(fetch, None)), Some(&(conv, Some(inner)))) = (links.first(), links.last()) else {
        return Err(unsupported());
    };
    let sni = NAME_FETCHES
        .iter()
        .find(|(f, _)| *f == fetch)
        .map(|(_, sni)| *sni)
        .ok_or_else(unsupported)?;
    let middle = &links[1..links.len() - 1];
    if links.len() < 2
        || middle
            .iter()
            .any(|(c, a)| !sni || a.is_some() || !CASE_CONVERTERS.contains(c))
    {
        return Err(unsupported());
    }
    let how = match (sni, conv) {
        (false, "map_ip") => None,
        (true, "map" | "map_str") => Some(NameMatch::Exact),
        (true, "map_dom") => Some(NameMatch::Dom),
        (true, "map_beg") => Some(NameMatch::Beg),
        _ => return Err(unsupported()),
    };
    let (path, default) = match inner.split_once(',') {
        Some((p, d)) => (p, Some(d)),
        None => (inner, None),
    };
    if path.is_empty() {
        return Err(format!(
            "'use_backend' : converter '{conv}' : missing map file name."
        ));
    }
    if default.is_some_and(|d| d.is_empty() || d.contains(',')) {
        return Err(unsupported());
    }
    let path = path.to_string();
    let default = default.map(str::to_string);
    Ok(match how {
        None => UseBackendDraft::SrcMap { path, default },
        Some(how) => UseBackendDraft::SniMap { path, default, how },
    })
}

impl Scope for ProxyDraft {
    fn here(&self) -> Sections {
        match self.kind {
            Kind::Defaults => Sections::DEFAULTS,
            Kind::Frontend => Sections::FRONTEND,
            Kind::Backend => Sections::BACKEND,
            Kind::Listen => Sections::FRONTEND.or(Sections::BACKEND),
        }
    }

    fn refuse(&self, kw: &str) -> String {
        match self.kind {
            Kind::Defaults => format!("'{kw}' not allowed in 'defaults' section."),
            Kind::Frontend => format!(
                "'{kw}' not allowed because frontend '{}' has no backend capability.",
                self.name
            ),
            Kind::Backend | Kind::Listen => format!(
                "'{kw}' not allowed because backend '{}' has no frontend capability.",
                self.name
            ),
        }
    }
}

pub const DEF: Sections = Sections::DEFAULTS;
pub const FE: Sections = Sections::FRONTEND;
pub const BE: Sections = Sections::BACKEND;
pub const DEF_FE: Sections = DEF.or(FE);
pub const DEF_BE: Sections = DEF.or(BE);
pub const ALL: Sections = Sections::PROXIES;
pub const FE_BE: Sections = FE.or(BE);

/// The keywords of proxy sections, in the order "did you mean" hints
/// consider them.
#[rustfmt::skip]
pub const PROXY: &[Keyword<ProxyDraft>] = &[
    Keyword::new(&["mode"],                         ALL,    Args::Required, mode),
    Keyword::new(&["bind"],                         FE,     Args::Required, bind),
    Keyword::new(&["default_backend"],              DEF_FE, Args::Required, default_backend),
    Keyword::new(&["use_backend"],                  FE,     Args::Required, use_backend),
    Keyword::new(&["maxconn"],                      DEF_FE, Args::Required, maxconn),
    Keyword::new(&["fullconn"],                     DEF_BE, Args::Required, fullconn),
    Keyword::new(&["balance"],                      DEF_BE, Args::Required, balance),
    Keyword::new(&["server"],                       BE,     Args::Required, server::server),
    Keyword::new(&["default-server"],               DEF_BE, Args::Any,      server::default_server),
    Keyword::new(&["timeout"],                      ALL,    Args::Required, timeout),
    Keyword::new(&["tcp-request"],                  ALL,    Args::Required, tcp_request::other),
    Keyword::new(&["tcp-request", "inspect-delay"], ALL,    Args::Required, tcp_request::inspect_delay),
    Keyword::new(&["tcp-request", "content"],       ALL,    Args::Required, tcp_request::content),
    Keyword::new(&["tcp-request", "connection"],    FE,     Args::Required, tcp_request::connection),
    Keyword::new(&["acl"],                          FE_BE,  Args::Required, acl_line),
    Keyword::new(&["stick-table"],                  ALL,    Args::Required, super::stick::stick_table),
    Keyword::new(&["stick"],                        FE_BE,  Args::Required, super::stick::stick),
    Keyword::new(&["retries"],                      DEF_BE, Args::Required, retries),
    Keyword::new(&["option"],                       ALL,    Args::Required, option_other),
    Keyword::new(&["option", "redispatch"],         DEF_BE, Args::None,     redispatch),
    Keyword::new(&["option", "splice-auto"],        ALL,    Args::None,     splice_auto),
    Keyword::new(&["option", "splice-request"],     ALL,    Args::None,     splice_request),
    Keyword::new(&["option", "splice-response"],    ALL,    Args::None,     splice_response),
    Keyword::new(&["option", "tcp-check"],          DEF_BE, Args::None,     option_tcp_check),
    Keyword::new(&["option", "tcplog"],             ALL,    Args::None,     tcplog),
    Keyword::new(&["option", "httplog"],            ALL,    Args::None,     httplog),
    Keyword::new(&["option", "tcpka"],              ALL,    Args::None,     tcpka),
    Keyword::new(&["option", "clitcpka"],           DEF_FE, Args::None,     clitcpka),
    Keyword::new(&["option", "srvtcpka"],           DEF_BE, Args::None,     srvtcpka),
    Keyword::new(&["option", "allbackups"],         DEF_BE, Args::None,     allbackups),
    Keyword::new(&["option", "log-health-checks"],  DEF_BE, Args::None,     log_health_checks),
    Keyword::new(&["hash-type"],                    DEF_BE, Args::Required, hash_type),
    Keyword::new(&["source"],                       DEF_BE, Args::Required, source),
    Keyword::new(&["option", "http-server-close"],  ALL,    Args::None,     http_option),
    Keyword::new(&["option", "httpclose"],          ALL,    Args::None,     http_option),
    Keyword::new(&["option", "http-keep-alive"],    ALL,    Args::None,     http_option),
    Keyword::new(&["option", "http-buffer-request"], ALL,   Args::None,     http_option),
    Keyword::new(&["option", "http-ignore-probes"], ALL,    Args::None,     http_option),
    Keyword::new(&["option", "http-no-delay"],      ALL,    Args::None,     http_option),
    Keyword::new(&["option", "http-pretend-keepalive"], ALL, Args::None,    http_option),
    Keyword::new(&["option", "forwardfor"],         ALL,    Args::None,     http_option),
    Keyword::new(&["option", "originalto"],         ALL,    Args::None,     http_option),
    Keyword::new(&["option", "dontlognull"],        ALL,    Args::None,     dontlognull),
    Keyword::new(&["log"],                          ALL,    Args::Required, log),
    Keyword::new(&["log", "global"],                ALL,    Args::None,     log_global),
    Keyword::new(&["no"],                           ALL,    Args::Required, no),
    Keyword::new(&["log-format"],                   DEF_FE, Args::Required, log_format),
    Keyword::new(&["tcp-check"],                    DEF_BE, Args::Required, tcp_check::other),
    Keyword::new(&["tcp-check", "comment"],         DEF_BE, Args::Required, tcp_check::comment),
    Keyword::new(&["tcp-check", "connect"],         DEF_BE, Args::Any,      tcp_check::connect),
    Keyword::new(&["tcp-check", "send"],            DEF_BE, Args::Required, tcp_check::send),
    Keyword::new(&["tcp-check", "send-binary"],     DEF_BE, Args::Required, tcp_check::send_binary),
    Keyword::new(&["tcp-check", "expect"],          DEF_BE, Args::Required, tcp_check::expect),
    Keyword::new(&["stats"],                        FE,     Args::Required, super::stats::stats),
    Keyword::new(&["load-server-state-from-file"],  DEF_BE, Args::Required, load_server_state),
    Keyword::new(&["errorfile"],                    ALL,    Args::Required, not_http),
    Keyword::new(&["errorfiles"],                   ALL,    Args::Required, not_http),
    Keyword::new(&["errorloc"],                     ALL,    Args::Required, not_http),
    Keyword::new(&["errorloc302"],                  ALL,    Args::Required, not_http),
    Keyword::new(&["errorloc303"],                  ALL,    Args::Required, not_http),
];

/// HAProxy proxy keywords that only make sense for HTTP.
const HTTP_ONLY_KEYWORDS: &[&str] = &[
    "http-request",
    "http-response",
    "http-after-response",
    "http-check",
    "http-reuse",
    "redirect",
    "cookie",
    "capture",
    "compression",
    "monitor-uri",
    "unique-id-format",
];

/// HAProxy proxy keywords built on ACLs or stick tables that shunt does not have yet.
const ACL_KEYWORDS: &[&str] = &["tcp-response"];

/// One line of a defaults/frontend/backend/listen section.
pub fn line(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    if let Some(res) = dispatch(PROXY, d, l) {
        return res;
    }
    let kw = l.kw();
    if HTTP_ONLY_KEYWORDS.contains(&kw) {
        return Err(format!("'{kw}' is not supported by shunt (TCP only)."));
    }
    if ACL_KEYWORDS.contains(&kw) {
        return Err(format!(
            "'{kw}' is not supported by shunt yet (ACLs come later)."
        ));
    }
    let msg = format!("unknown keyword '{kw}' in '{}' section", d.kind.section());
    let candidates = first_words(PROXY).chain(section_names());
    Err(with_hint(msg, suggest(kw, candidates)))
}

fn mode(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    match l.arg(1) {
        Some("tcp") => {
            d.mode_http = None;
            d.mode_http_own = None;
        }
        // The stats page's own mode; validation refuses a frontend or listen
        // in `mode http` that is not a stats page.
        Some("http") if d.kind.fe() => {
            d.mode_http = Some(l.loc.clone());
            d.mode_http_own = Some(l.loc.clone());
        }
        // Debian's stock `defaults` says `mode http`: the TCP proxies that
        // follow it override it, and validation refuses the others.
        Some("http") if d.kind == Kind::Defaults => {
            no_extra(l.args, 2, l.kw())?;
            d.mode_http = Some(l.loc.clone());
            l.warnings.push(not_applicable(
                l.loc,
                "mode http",
                "speak HTTP; a proxy that inherits it without 'mode tcp' is refused",
            ));
        }
        Some(m @ ("http" | "health" | "log")) => {
            return Err(format!("'mode {m}' is not supported by shunt (TCP only)."))
        }
        Some(m) => return Err(format!("unknown proxy mode '{m}'.")),
        None => return Err("'mode' expects 'tcp' as argument.".to_string()),
    }
    no_extra(l.args, 2, l.kw())
}

/// `bind ADDR[,ADDR...] [OPTION...]`: the options shunt knows are
/// `accept-proxy` and `name NAME`; they apply to every address of the line.
fn bind(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let Some(list) = l.arg(1) else {
        return Err(
            "'bind' expects [addr1]:port1[-end1]{,[addr]:port[-end]}... as arguments.".to_string(),
        );
    };
    let args = l.args;
    let opts = super::bind::parse(&args[2..], l, d.kind.section())?;
    for one in list.split(',') {
        let addrs = parse_addr(one, true).map_err(|e| format!("'bind' : {e}"))?;
        d.binds
            .extend(addrs.into_iter().map(|a| (a, opts.clone(), l.loc.clone())));
    }
    Ok(())
}

/// The backend name of `default_backend NAME` (which takes no condition).
fn backend_name<'a>(l: &Line<'a>) -> Result<&'a str, String> {
    let kw = l.kw();
    let name = l
        .arg(1)
        .ok_or_else(|| format!("'{kw}' expects a backend name."))?;
    no_extra(l.args, 2, kw)?;
    Ok(name)
}

fn default_backend(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let name = backend_name(l)?;
    d.default_backend = Some((name.to_string(), l.loc.clone()));
    Ok(())
}

/// `use_backend NAME [if|unless COND]`.
fn use_backend(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let name = l
        .arg(1)
        .ok_or_else(|| "'use_backend' expects a backend name.".to_string())?;
    let cond = match l.arg(2) {
        None => None,
        Some(w) if w != "if" && w != "unless" => {
            return Err(format!(
                "unexpected keyword '{w}' after switching rule, only 'if' and 'unless' are allowed."
            ))
        }
        Some(_) => Some(
            acl::parse_cond(&l.args[2..], &d.acls, l.loc)
                .map_err(|e| format!("error detected while parsing switching rule : {e}."))?,
        ),
    };
    d.use_backends
        .push((parse_use_backend(name)?, cond, l.loc.clone()));
    Ok(())
}

/// `acl NAME FETCH [flags] PATTERN...`.
fn acl_line(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    acl::parse_acl(l.args, &mut d.acls, l.loc)
}

fn maxconn(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.maxconn = bounded(int_arg(l.arg(1), l.kw())?, 0, MAX_MAXCONN, l.kw())?;
    no_extra(l.args, 2, l.kw())
}

fn fullconn(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.fullconn = bounded(int_arg(l.arg(1), l.kw())?, 0, MAX_MAXCONN, l.kw())?;
    no_extra(l.args, 2, l.kw())
}

fn retries(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let n: u32 = int_arg(l.arg(1), l.kw())?;
    if n > MAX_RETRIES {
        return Err(format!(
            "'retries' value must be between 0 and {MAX_RETRIES} (was {n})"
        ));
    }
    d.retries = n;
    no_extra(l.args, 2, l.kw())
}

fn balance(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.balance = match l.arg(1) {
        Some("roundrobin") => Balance::RoundRobin,
        Some("static-rr") => Balance::StaticRr,
        Some("leastconn") => Balance::LeastConn,
        Some("first") => Balance::First,
        Some("source") => Balance::Source,
        Some("random") => Balance::Random,
        Some("hash") => {
            let Some(expr) = l.arg(2) else {
                return Err("balance hash requires a sample expression.".to_string());
            };
            let key = HashKey::by_name(expr).ok_or_else(|| {
                format!("'balance hash' : shunt hashes only the samples 'src', 'src_port', 'dst' and 'dst_port' (got '{expr}').")
            })?;
            d.balance = Balance::Hash(key);
            return no_extra(l.args, 3, l.kw());
        }
        other => {
            return Err(format!(
                "'balance' only supports 'roundrobin', 'static-rr', 'leastconn', 'first', 'source', 'random' and 'hash' (got '{}').",
                other.unwrap_or("")
            ))
        }
    };
    no_extra(l.args, 2, l.kw())
}

/// `timeout NAME TIME`. A timeout for the side a section lacks is harmless:
/// HAProxy ignores it with a warning, and so does shunt.
fn timeout(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let sub = l.arg(1).unwrap_or("");
    let side = match sub {
        "client" | "client-fin" => FE,
        "connect" | "server" | "server-fin" | "tunnel" | "queue" | "check" => BE,
        "http-request" | "http-keep-alive" | "tarpit" => {
            return Err(format!("'timeout {sub}' is not supported by shunt (TCP only)."))
        }
        _ => {
            return Err(format!(
                "'timeout' supports 'client', 'server', 'connect', 'check', 'queue', 'tunnel', 'client-fin' and 'server-fin' (got '{sub}')"
            ))
        }
    };
    let name = format!("timeout {sub}");
    let v = l
        .arg(2)
        .ok_or_else(|| format!("'{name}' expects an integer value (in milliseconds)"))?;
    let t = parse_time(v).map_err(|e| format!("{e} in '{name}'"))?;
    no_extra(l.args, 3, &name)?;
    if !side.or(DEF).meets(d.here()) {
        let msg = d.refuse(&name).replacen("not allowed", "ignored", 1);
        l.warnings.push(format!("parsing [{}] : {msg}", l.loc));
        return Ok(());
    }
    // 0 means "no timeout", as in HAProxy.
    let t = (!t.is_zero()).then_some(t);
    let to = &mut d.timeouts;
    match sub {
        "client" => to.client = t,
        "client-fin" => to.client_fin = t,
        "connect" => to.connect = t,
        "server" => to.server = t,
        "server-fin" => to.server_fin = t,
        "tunnel" => to.tunnel = t,
        "queue" => to.queue = t,
        _ => to.check = t,
    }
    Ok(())
}

/// `option NAME` for a NAME no entry holds, or no NAME at all.
fn option_other(_: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let Some(name) = l.arg(1) else {
        return Err("'option' expects an option name.".to_string());
    };
    if name.starts_with("http") {
        return Err(format!(
            "'option {name}' is not supported by shunt (TCP only)."
        ));
    }
    Err(format!("unknown option '{name}'."))
}

/// An option's flag: on, or off after `no`.
fn option_value(l: &Line<'_>) -> bool {
    !l.negate
}

/// Refuses words after `option NAME`.
fn option_end(l: &Line<'_>) -> Result<(), String> {
    no_extra(l.args, 2, &l.args[..2].join(" "))
}

fn redispatch(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.redispatch = option_value(l);
    option_end(l)
}

fn splice_auto(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.splice.auto = option_value(l);
    option_end(l)
}

fn splice_request(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.splice.request = option_value(l);
    option_end(l)
}

fn splice_response(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.splice.response = option_value(l);
    option_end(l)
}

fn tcpka(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.clitcpka = option_value(l);
    d.srvtcpka = option_value(l);
    option_end(l)
}

fn clitcpka(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.clitcpka = option_value(l);
    option_end(l)
}

fn srvtcpka(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.srvtcpka = option_value(l);
    option_end(l)
}

fn allbackups(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.allbackups = option_value(l);
    option_end(l)
}

fn log_health_checks(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.log_health_checks = option_value(l);
    option_end(l)
}

/// The hash functions of HAProxy's `hash-type METHOD [FUNCTION [avalanche]]`.
const HASH_FUNCTIONS: &[&str] = &["sdbm", "djb2", "wt6", "crc32"];

/// `hash-type map-based|consistent [FUNCTION [avalanche]]`. shunt hashes
/// with one function of its own whatever is named (a warning says so): the
/// method is what decides which keys move when the servers change.
fn hash_type(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.hash_type = match l.arg(1) {
        Some("map-based") => HashType::MapBased,
        Some("consistent") => HashType::Consistent,
        other => {
            return Err(format!(
                "'hash-type' expects 'map-based' or 'consistent' (got '{}').",
                other.unwrap_or("")
            ))
        }
    };
    let mut used = 2;
    if let Some(f) = l.arg(2) {
        if !HASH_FUNCTIONS.contains(&f) {
            return Err(format!(
                "'hash-type' : unknown hash function '{f}' (expects 'sdbm', 'djb2', 'wt6' or 'crc32')."
            ));
        }
        used = 3;
        if l.arg(3) == Some("avalanche") {
            used = 4;
        }
        no_extra(l.args, used, "hash-type")?;
        let words = l.args[2..used].join(" ");
        l.warnings.push(not_applicable(
            l.loc,
            &words,
            "choose the hash function of 'hash-type' (it uses its own)",
        ));
    }
    no_extra(l.args, used, "hash-type")
}

/// `source ADDR[:PORT]` in a backend or defaults section (see
/// [`server::source_addr`]); HAProxy's `usesrc` and `interface` are refused.
fn source(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let v = l.arg(1).unwrap_or("");
    d.source = Some(server::source_addr(v).map_err(|e| format!("'source' : {e}"))?);
    if let Some(x) = l.arg(2) {
        return Err(format!(
            "'source' : '{x}' is not supported by shunt (only 'source <addr>[:<port>]')."
        ));
    }
    Ok(())
}

fn option_tcp_check(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.tcp_check = option_value(l);
    option_end(l)
}

// Backends ignore `tcplog` and `dontlognull` (the frontend logs its flows),
// as HAProxy does.
fn tcplog(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.tcplog = option_value(l);
    d.httplog = None;
    option_end(l)
}

/// `option httplog [clf]`: HAProxy falls back to `option tcplog` in a TCP
/// frontend, and so does shunt, where every frontend is one.
fn httplog(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    match l.arg(2) {
        None | Some("clf") => no_extra(l.args, 3, "option httplog")?,
        Some(x) => {
            return Err(format!(
                "'option httplog' only supports optional argument 'clf' (got '{x}')."
            ))
        }
    }
    d.tcplog = option_value(l);
    d.httplog = option_value(l).then(|| l.loc.clone());
    Ok(())
}

/// An HTTP-only `option` (a shared `defaults` section often sets them): it
/// changes nothing in a TCP proxy, so it is accepted with a warning.
fn http_option(_: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    // `forwardfor` and `originalto` take their own words (`except NET`,
    // `header NAME`, `if-none`), moot here; the other entries are flags.
    if !matches!(l.arg(1), Some("forwardfor" | "originalto")) {
        option_end(l)?;
    }
    let kw = l.args[..2].join(" ");
    let kw = if l.negate { format!("no {kw}") } else { kw };
    l.warnings.push(not_applicable(l.loc, &kw, "speak HTTP"));
    Ok(())
}

/// `errorfile` and its kin: HTTP error pages, which a TCP proxy never sends.
fn not_http(_: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    if l.arg(1).is_none() {
        return Err(format!("'{}' expects an argument.", l.kw()));
    }
    l.warnings.push(not_applicable(l.loc, l.kw(), "speak HTTP"));
    Ok(())
}

fn dontlognull(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.dontlognull = option_value(l);
    option_end(l)
}

/// `no option NAME` and `no log`; nothing else takes `no`.
fn no(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    match l.arg(1) {
        Some("option") => {
            let args = l.args;
            let mut rest = Line::new(&args[1..], l.loc, l.warnings);
            rest.negate = true;
            // `option` is in the table, so the lookup cannot miss.
            dispatch(PROXY, d, &mut rest).unwrap_or_else(|| option_other(d, &mut rest))
        }
        Some("log") => {
            d.log_global = false;
            d.logs.clear();
            d.log_locs.clear();
            no_extra(l.args, 2, "no log")
        }
        _ => Err("'no' is only supported before 'option' and 'log'.".to_string()),
    }
}

/// `log TARGET ...` (see [`log_target`]).
fn log(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    if l.args.len() < 2 {
        return Err("log : expects <address> and <facility> or global as arguments".to_string());
    }
    d.logs.push(log_target(&l.args[1..])?);
    d.log_locs.push(l.loc.clone());
    Ok(())
}

fn log_global(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    d.log_global = true;
    no_extra(l.args, 2, "log global")
}

fn log_format(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let f = l
        .arg(1)
        .ok_or_else(|| "'log-format' expects a format string.".to_string())?;
    no_extra(l.args, 2, l.kw())?;
    d.log_format = Some(LogFormat::parse(f).map_err(|e| format!("'log-format' : {e}"))?);
    d.httplog = None;
    Ok(())
}

fn load_server_state(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let kw = l.kw();
    d.load_server_state = match l.arg(1) {
        Some("global") => true,
        Some("none") => false,
        Some("local") => {
            return Err(format!(
                "'{kw} local' is not supported by shunt (use 'global' and 'server-state-file')."
            ))
        }
        other => {
            return Err(format!(
                "'{kw}' expects 'global', 'local' or 'none'. Got '{}'",
                other.unwrap_or("")
            ))
        }
    };
    no_extra(l.args, 2, kw)
}
