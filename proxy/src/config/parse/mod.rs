//! Section and keyword parsing: configuration lines in, drafts out.
//!
//! Owns the keyword table type ([`Keyword`]: the words, the sections it is
//! allowed in, a parse fn; looked up the way a CLI command table is), the
//! section state machine (`global`, `defaults`, `frontend`, `backend`,
//! `listen`, `ring`) that hands each line to its section's table, and the
//! helpers keyword parsers share. Each submodule owns one family of keywords
//! and its table. The result is drafts ([`GlobalDraft`], [`ProxyDraft`],
//! [`ServerDraft`]) plus located errors and warnings; names across proxies
//! are never resolved here (that is `validate`'s job). One bad line yields at
//! most one error and parsing goes on, so every error is reported.
//!
//! Invariants: a proxy draft is a copy of the defaults section in force when
//! its header was read (the last one, or the one named by `from`); a defaults
//! section never holds binds, servers or `use_backend` rules.

mod global;
mod log;
mod stats_socket;

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use super::addr::parse_addr;
use super::lexer::split_line;
use super::model::*;
use super::units::parse_time;
use super::ConfigError;
// For the submodules (`super::model::*` there).
use super::{addr, model, units};

pub use global::GlobalDraft;

/// Upper bound for any `maxconn`: far above what one host can hold, low
/// enough that per-connection tables sized from it stay allocatable.
pub const MAX_MAXCONN: usize = 1 << 22;
/// Server weights are 0..=256, as in HAProxy.
pub const MAX_WEIGHT: u32 = 256;
/// Default server weight.
pub const DEFAULT_WEIGHT: u32 = 1;
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
    /// Own `log` lines.
    pub logs: Vec<LogTarget>,
    /// `option tcplog`, `option dontlognull`, `log-format`.
    pub tcplog: bool,
    pub dontlognull: bool,
    pub log_format: Option<LogFormat>,
    pub default_backend: Option<(String, Location)>,
    pub use_backends: Vec<(UseBackendDraft, Location)>,
    pub binds: Vec<(SocketAddr, Location)>,
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
}

impl ProxyDraft {
    fn fresh(kind: Kind, name: &str, loc: &Location) -> Self {
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
            tcplog: false,
            dontlognull: false,
            log_format: None,
            default_backend: None,
            use_backends: Vec::new(),
            binds: Vec::new(),
            servers: Vec::new(),
            default_server: ServerOpts::default(),
            tcp_check: false,
            tcp_check_rules: Vec::new(),
            tcp_check_inherited: false,
            tcp_check_comment: None,
            load_server_state: false,
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
    /// `%[req.ssl_sni,map(PATH[,DEFAULT])]` or, with `dom`, `map_dom(…)`.
    SniMap {
        path: String,
        default: Option<String>,
        dom: bool,
    },
}

/// The log-format expressions shunt evaluates for a backend name: prefix, converter
/// name, and the draft kind (`None` = `map_ip`, `Some(dom)` = SNI `map`/`map_dom`).
/// `lower,` is accepted before the SNI converters because names are compared in
/// lower case anyway.
const DYNAMIC_NAMES: &[(&str, &str, Option<bool>)] = &[
    ("%[src,map_ip(", "map_ip", None),
    ("%[req.ssl_sni,map(", "map", Some(false)),
    ("%[req.ssl_sni,map_dom(", "map_dom", Some(true)),
    ("%[req.ssl_sni,lower,map(", "map", Some(false)),
    ("%[req.ssl_sni,lower,map_dom(", "map_dom", Some(true)),
];

/// Parse a `use_backend` argument: a plain name, `%[src,map_ip(FILE[,DEFAULT])]`,
/// `%[req.ssl_sni,map(FILE[,DEFAULT])]` or `%[req.ssl_sni,map_dom(FILE[,DEFAULT])]`.
pub fn parse_use_backend(arg: &str) -> Result<UseBackendDraft, String> {
    if !arg.contains("%[") {
        return Ok(UseBackendDraft::Name(arg.to_string()));
    }
    let unsupported = || {
        format!(
            "'use_backend' : unsupported dynamic backend name '{arg}' (shunt supports only '%[src,map_ip(<file>[,<default>])]', '%[req.ssl_sni,map(<file>[,<default>])]' and '%[req.ssl_sni,map_dom(<file>[,<default>])]')."
        )
    };
    let (inner, conv, sni) = DYNAMIC_NAMES
        .iter()
        .find_map(|(prefix, conv, sni)| {
            let inner = arg.strip_prefix(prefix)?.strip_suffix(")]")?;
            Some((inner, *conv, *sni))
        })
        .ok_or_else(unsupported)?;
    let (path, default) = match inner.split_once(',') {
        Some((p, d)) => (p, Some(d)),
        None => (inner, None),
    };
    if path.is_empty() {
        return Err(format!(
            "'use_backend' : converter '{conv}' : missing map file name."
        ));
    }
    if default.is_some_and(|d| d.is_empty() || d.contains([',', '(', ')', '[', ']'])) {
        return Err(unsupported());
    }
    if path.contains(['(', ')', '[', ']']) {
        return Err(unsupported());
    }
    let path = path.to_string();
    let default = default.map(str::to_string);
    Ok(match sni {
        None => UseBackendDraft::SrcMap { path, default },
        Some(dom) => UseBackendDraft::SniMap { path, default, dom },
    })
}

/// The one `tcp-request content` rule shunt accepts, as the words the lexer yields:
/// the TLS wait idiom HAProxy configurations carry next to SNI routing. shunt's SNI
/// rules already wait (up to `inspect-delay`) for a ClientHello, so it is a no-op.
const ACCEPT_HELLO: &[&[&str]] = &[
    &["accept", "if", "{", "req_ssl_hello_type", "1", "}"],
    &["accept", "if", "{", "req.ssl_hello_type", "1", "}"],
];

/// `tcp-request inspect-delay <time>` and the no-op
/// `tcp-request content accept if { req_ssl_hello_type 1 }`; anything else is refused.
fn tcp_request_line(d: &mut ProxyDraft, args: &[String]) -> Result<(), String> {
    match args.get(1).map(String::as_str) {
        Some("inspect-delay") => {
            let v = args.get(2).ok_or_else(|| {
                "'tcp-request inspect-delay' expects a positive delay in milliseconds.".to_string()
            })?;
            let t = parse_time(v).map_err(|e| format!("{e} in 'tcp-request inspect-delay'"))?;
            no_extra(args, 3, "tcp-request inspect-delay")?;
            d.timeouts.inspect_delay = (!t.is_zero()).then_some(t);
            Ok(())
        }
        Some("content") => {
            let rest: Vec<&str> = args[2..].iter().map(String::as_str).collect();
            if ACCEPT_HELLO.contains(&rest.as_slice()) {
                return Ok(());
            }
            Err(format!(
                "'tcp-request content {}' is not supported by shunt yet (only 'tcp-request content accept if {{ req_ssl_hello_type 1 }}' is accepted; ACLs come later).",
                rest.join(" ")
            ))
        }
        Some(sub @ ("connection" | "session")) => Err(format!(
            "'tcp-request {sub}' is not supported by shunt yet (ACLs come later)."
        )),
        Some(sub) => Err(format!(
            "'tcp-request' expects 'inspect-delay', 'connection', 'session' or 'content', got '{sub}'."
        )),
        None => Err(
            "'tcp-request' expects 'inspect-delay', 'connection', 'session' or 'content'."
                .to_string(),
        ),
    }
}

// ---------- keyword tables ----------

/// The places a keyword may appear: sections, and the option lists that
/// follow some keywords (`server NAME ADDR ...`, `stats socket PATH ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sections(u16);

impl Sections {
    pub const GLOBAL: Self = Self(1);
    pub const RING: Self = Self(1 << 4);
    /// The keywords after `stats socket PATH`.
    pub const STATS_SOCKET: Self = Self(1 << 7);

    /// The two sets share a place.
    pub const fn meets(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }
}

/// What a keyword takes after its words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Args {
    /// Nothing: a flag (`daemon`, `backup`, `option redispatch`).
    None,
    /// Any number of words, none included (`description`, `default-server`).
    Any,
    /// At least one word: a line that stops after the keyword is refused. In
    /// an option list, exactly one (the value).
    Required,
}

/// One keyword occurrence, as a parse fn sees it.
pub struct Line<'a> {
    /// In a line table, every word of the line (the keyword's first); in an
    /// option list, the keyword and its value when the line has one.
    pub args: &'a [String],
    pub loc: &'a Location,
    /// Warnings go here; errors are the parse fn's `Err`.
    pub warnings: &'a mut Vec<String>,
}

impl<'a> Line<'a> {
    pub fn new(args: &'a [String], loc: &'a Location, warnings: &'a mut Vec<String>) -> Self {
        Self {
            args,
            loc,
            warnings,
        }
    }

    /// The first word.
    pub fn kw(&self) -> &'a str {
        self.args[0].as_str()
    }

    /// Word `i`, if the line has it.
    pub fn arg(&self, i: usize) -> Option<&'a str> {
        self.args.get(i).map(String::as_str)
    }
}

/// Parses one keyword occurrence into the scope `C` it belongs to.
pub type ParseFn<C> = fn(&mut C, &mut Line<'_>) -> Result<(), String>;

/// One entry of a keyword table, the way a CLI command table holds commands.
pub struct Keyword<C> {
    /// The words that name it: `["maxconn"]`, `["stats", "socket"]`. A
    /// longer entry wins over a shorter one it starts with; the one-word
    /// entry then parses what no longer one names (`stats bogus`).
    pub words: &'static [&'static str],
    /// Where it is allowed. An entry is also refused wherever a shorter
    /// entry along its words is (`option redispatch` needs `option`).
    pub sections: Sections,
    pub args: Args,
    pub parse: ParseFn<C>,
}

impl<C> Keyword<C> {
    pub const fn new(
        words: &'static [&'static str],
        sections: Sections,
        args: Args,
        parse: ParseFn<C>,
    ) -> Self {
        Self {
            words,
            sections,
            args,
            parse,
        }
    }

    /// Its words start `args`.
    fn names(&self, args: &[String]) -> bool {
        self.words.len() <= args.len() && self.words.iter().zip(args).all(|(w, a)| w == a)
    }
}

/// What a table's parse fns work on, and where it stands.
pub trait Scope {
    /// The places a keyword must allow to be accepted here (a listen
    /// section stands in both a frontend and a backend: either will do).
    fn here(&self) -> Sections;

    /// The error for `kw`, a keyword of the table that is not allowed here.
    /// Scopes that stand in one place never refuse (the table tests check
    /// that every entry allows it).
    fn refuse(&self, kw: &str) -> String {
        format!("'{kw}' is not allowed here.")
    }
}

/// The entry of `table` that `args` names: the longest whose words all match.
pub fn find<'t, C>(table: &'t [Keyword<C>], args: &[String]) -> Option<&'t Keyword<C>> {
    table
        .iter()
        .filter(|k| k.names(args))
        .max_by_key(|k| k.words.len())
}

/// Refuses `kw` unless it, and every shorter entry along its words, is
/// allowed where `scope` stands.
fn allowed<C: Scope>(table: &[Keyword<C>], kw: &Keyword<C>, scope: &C) -> Result<(), String> {
    for n in 1..=kw.words.len() {
        let words = &kw.words[..n];
        if let Some(k) = table.iter().find(|k| k.words == words) {
            if !k.sections.meets(scope.here()) {
                return Err(scope.refuse(&words.join(" ")));
            }
        }
    }
    Ok(())
}

/// Parses one line through a section's table. `None`: the first word is no
/// keyword of the table (each section words "unknown keyword" its own way).
pub fn dispatch<C: Scope>(
    table: &[Keyword<C>],
    scope: &mut C,
    line: &mut Line<'_>,
) -> Option<Result<(), String>> {
    let kw = find(table, line.args)?;
    Some(allowed(table, kw, scope).and_then(|()| (kw.parse)(scope, line)))
}

/// Parses an option list (`weight 2 backup check ...`) through its table:
/// each keyword takes its value when its entry says [`Args::Required`].
/// `unknown` words the error for a word the table does not hold.
pub fn options<C: Scope>(
    table: &[Keyword<C>],
    scope: &mut C,
    words: &[String],
    outer: &mut Line<'_>,
    unknown: &dyn Fn(&str) -> String,
) -> Result<(), String> {
    let mut i = 0;
    while i < words.len() {
        let Some(kw) = find(table, &words[i..]) else {
            return Err(unknown(&words[i]));
        };
        allowed(table, kw, scope)?;
        let len = kw.words.len() + usize::from(kw.args != Args::None);
        let end = (i + len).min(words.len());
        let mut line = Line::new(&words[i..end], outer.loc, outer.warnings);
        (kw.parse)(scope, &mut line)?;
        i += len;
    }
    Ok(())
}

/// The distinct first words of `table`, in table order ("did you mean" candidates).
pub fn first_words<C>(table: &[Keyword<C>]) -> impl Iterator<Item = &'static str> + '_ {
    table
        .iter()
        .enumerate()
        .filter(|&(i, k)| !table[..i].iter().any(|p| p.words[0] == k.words[0]))
        .map(|(_, k)| k.words[0])
}

/// The keywords of an option list, as its "Registered keywords" list them.
pub fn registered<C>(table: &[Keyword<C>]) -> String {
    table
        .iter()
        .map(|k| k.words.join(" "))
        .collect::<Vec<_>>()
        .join(", ")
}

enum Section {
    None,
    Global,
    Defaults(usize),
    Proxy(usize),
    /// A section shunt does not support; its lines are skipped (one error was reported).
    Unsupported,
    /// A `ring` section (index into the global draft's rings).
    Ring(usize),
}

/// Everything parsed so far, across all files.
pub struct Parser<'e> {
    pub global: GlobalDraft,
    pub defaults: Vec<ProxyDraft>,
    current_defaults: Option<usize>,
    pub proxies: Vec<ProxyDraft>,
    section: Section,
    pub errors: Vec<ConfigError>,
    pub warnings: Vec<String>,
    env: &'e dyn Fn(&str) -> Option<String>,
}

const SECTIONS: &[&str] = &[
    "global", "defaults", "frontend", "backend", "listen", "ring",
];

/// HAProxy sections shunt knows about but does not implement.
const UNSUPPORTED_SECTIONS: &[&str] = &[
    "peers",
    "resolvers",
    "userlist",
    "mailers",
    "program",
    "http-errors",
    "cache",
    "fcgi-app",
];

// Capability bits of proxy keywords.
const DEF: u8 = 1;
const FE: u8 = 2;
const BE: u8 = 4;
const ALL: u8 = DEF | FE | BE;

const PROXY_KEYWORDS: &[(&str, u8)] = &[
    ("mode", ALL),
    ("bind", FE),
    ("default_backend", DEF | FE),
    ("use_backend", FE),
    ("maxconn", DEF | FE),
    ("fullconn", DEF | BE),
    ("balance", DEF | BE),
    ("server", BE),
    ("default-server", DEF | BE),
    ("timeout", ALL),
    ("tcp-request", DEF | FE),
    ("retries", DEF | BE),
    ("option", ALL),
    ("log", ALL),
    ("no", ALL),
    ("log-format", DEF | FE),
    ("tcp-check", DEF | BE),
    ("load-server-state-from-file", DEF | BE),
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
    "errorfile",
    "errorloc",
    "monitor-uri",
    "stats",
    "unique-id-format",
];

/// HAProxy proxy keywords that need ACLs, which shunt does not have yet.
const ACL_KEYWORDS: &[&str] = &["acl", "tcp-response", "stick", "stick-table"];

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

/// Levenshtein distance, for "did you mean" hints.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The closest candidate, if it is close enough to be a likely typo.
fn suggest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| (distance(word, c), c))
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

fn with_hint(msg: String, hint: Option<&str>) -> String {
    match hint {
        Some(h) => format!("{msg}; did you mean '{h}' maybe ?"),
        None => msg,
    }
}

/// The first character HAProxy would refuse in a proxy or server name.
fn invalid_name_char(name: &str) -> Option<char> {
    name.chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
}

fn no_extra(args: &[String], used: usize, kw: &str) -> Result<(), String> {
    match args.get(used) {
        Some(x) => Err(format!("'{kw}' cannot handle unexpected argument '{x}'.")),
        None => Ok(()),
    }
}

fn int_arg<T: FromStr>(val: Option<&str>, kw: &str) -> Result<T, String> {
    let v = val.ok_or_else(|| format!("'{kw}' expects an integer argument."))?;
    if !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("'{kw}' expects an integer argument (got '{v}')."));
    }
    v.parse()
        .map_err(|_| format!("'{kw}' value '{v}' is out of range."))
}

fn bounded(v: usize, min: usize, max: usize, kw: &str) -> Result<usize, String> {
    if (min..=max).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "'{kw}' value must be between {min} and {max} (was {v})"
        ))
    }
}

fn time_arg(val: Option<&str>, kw: &str) -> Result<Duration, String> {
    let v = val.ok_or_else(|| format!("'{kw}' expects <time> as argument."))?;
    parse_time(v).map_err(|e| format!("{e} in argument to '{kw}'."))
}

fn port_arg(val: Option<&str>, kw: &str) -> Result<u16, String> {
    let v = val.ok_or_else(|| format!("'{kw}' expects a port number."))?;
    match v.parse::<u16>() {
        Ok(p) if p > 0 && v.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(format!("'{kw}' expects a valid port number (got '{v}').")),
    }
}

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

impl<'e> Parser<'e> {
    pub fn new(env: &'e dyn Fn(&str) -> Option<String>) -> Self {
        Self {
            global: GlobalDraft::default(),
            defaults: Vec::new(),
            current_defaults: None,
            proxies: Vec::new(),
            section: Section::None,
            errors: Vec::new(),
            warnings: Vec::new(),
            env,
        }
    }

    fn error(&mut self, loc: &Location, msg: String) {
        self.errors.push(ConfigError::Parse {
            at: loc.clone(),
            msg,
        });
    }

    /// Parses one file. Each file starts outside any section (as in HAProxy);
    /// defaults sections carry over to the following files.
    pub fn feed(&mut self, file: &str, text: &str) {
        self.section = Section::None;
        for (n, raw) in text.lines().enumerate() {
            let loc = Location {
                file: file.to_string(),
                line: n + 1,
            };
            match split_line(raw, self.env) {
                Ok(words) if words.is_empty() => {}
                Ok(words) => self.line(&words, &loc),
                Err(e) => self.error(&loc, e.to_string()),
            }
        }
    }

    fn line(&mut self, args: &[String], loc: &Location) {
        let kw = args[0].as_str();
        match kw {
            "global" => {
                self.section = Section::Global;
                if let Err(msg) = no_extra(args, 1, kw) {
                    self.error(loc, msg);
                }
            }
            "defaults" => self.start_defaults(args, loc),
            "frontend" => self.start_proxy(Kind::Frontend, args, loc),
            "backend" => self.start_proxy(Kind::Backend, args, loc),
            "listen" => self.start_proxy(Kind::Listen, args, loc),
            "ring" => self.start_ring(args, loc),
            s if UNSUPPORTED_SECTIONS.contains(&s) => {
                self.section = Section::Unsupported;
                self.error(loc, format!("section '{s}' is not supported by shunt."));
            }
            _ => match self.section {
                Section::None => self.error(loc, format!("unknown keyword '{kw}' out of section.")),
                Section::Unsupported => {}
                Section::Global => {
                    let mut l = Line::new(args, loc, &mut self.warnings);
                    if let Err(msg) = global::line(&mut self.global, &mut l) {
                        self.error(loc, msg);
                    }
                }
                Section::Defaults(i) => {
                    let res = proxy_line(&mut self.defaults[i], args, loc, &mut self.warnings);
                    if let Err(msg) = res {
                        self.error(loc, msg);
                    }
                }
                Section::Proxy(i) => {
                    let res = proxy_line(&mut self.proxies[i], args, loc, &mut self.warnings);
                    if let Err(msg) = res {
                        self.error(loc, msg);
                    }
                }
                Section::Ring(i) => {
                    let mut l = Line::new(args, loc, &mut self.warnings);
                    if let Err(msg) = log::ring_line(&mut self.global.global.rings[i], &mut l) {
                        self.error(loc, msg);
                    }
                }
            },
        }
    }

    /// `ring NAME`: a new ring with HAProxy's defaults.
    fn start_ring(&mut self, args: &[String], loc: &Location) {
        let Some(name) = args.get(1).cloned() else {
            self.error(loc, "'ring' expects a name.".to_string());
            self.section = Section::Unsupported;
            return;
        };
        let rings = &self.global.global.rings;
        if let Some(prev) = rings.iter().find(|r| r.name == name) {
            let msg = format!("sink '{name}' already exists (declared at {}).", prev.line);
            self.error(loc, msg);
        }
        let rings = &mut self.global.global.rings;
        rings.push(log::new_ring(name, loc));
        self.section = Section::Ring(rings.len() - 1);
    }

    /// Finds the last defaults section named `name`.
    fn named_defaults(&self, name: &str) -> Option<usize> {
        self.defaults.iter().rposition(|d| d.name == name)
    }

    /// Parses `from NAME` at `args[at..]`; returns the template index (if any)
    /// or the error message.
    fn template_from(
        &self,
        kind: Kind,
        name: &str,
        args: &[String],
        at: usize,
    ) -> Result<Option<usize>, String> {
        match args.get(at).map(String::as_str) {
            None => Ok(self.current_defaults),
            Some("from") => {
                let Some(def) = args.get(at + 1) else {
                    return Err("'from' expects a defaults section name.".to_string());
                };
                no_extra(args, at + 2, kind.section())?;
                match self.named_defaults(def) {
                    Some(i) => Ok(Some(i)),
                    None => Err(format!(
                        "defaults section '{def}' not found for {} '{name}'.",
                        kind.type_str()
                    )),
                }
            }
            Some(_) => no_extra(args, at, kind.section()).map(|_| None),
        }
    }

    fn start_defaults(&mut self, args: &[String], loc: &Location) {
        // `defaults [NAME] [from OTHER]`
        let (name, from_at) = match args.get(1).map(String::as_str) {
            None | Some("from") => ("", 1),
            Some(n) => (n, 2),
        };
        if let Some(c) = invalid_name_char(name) {
            self.error(
                loc,
                format!("character '{c}' is not permitted in 'defaults' name '{name}'."),
            );
        }
        let template = match args.get(from_at) {
            // A defaults section without `from` starts from scratch.
            None => None,
            Some(_) => match self.template_from(Kind::Defaults, name, args, from_at) {
                Ok(t) => t,
                Err(msg) => {
                    self.error(loc, msg);
                    None
                }
            },
        };
        let mut draft = match template {
            Some(i) => self.defaults[i].clone(),
            None => ProxyDraft::fresh(Kind::Defaults, name, loc),
        };
        draft.tcp_check_inherited = true;
        draft.tcp_check_comment = None;
        draft.name = name.to_string();
        draft.loc = loc.clone();
        self.defaults.push(draft);
        let idx = self.defaults.len() - 1;
        self.current_defaults = Some(idx);
        self.section = Section::Defaults(idx);
    }

    fn start_proxy(&mut self, kind: Kind, args: &[String], loc: &Location) {
        let sec = kind.section();
        let Some(name) = args.get(1).cloned() else {
            self.error(loc, format!("'{sec}' expects an <id> argument"));
            self.section = Section::Unsupported;
            return;
        };
        if let Some(c) = invalid_name_char(&name) {
            self.error(
                loc,
                format!("character '{c}' is not permitted in '{sec}' name '{name}'."),
            );
        }
        let template = match self.template_from(kind, &name, args, 2) {
            Ok(t) => t,
            Err(msg) => {
                self.error(loc, msg);
                self.current_defaults
            }
        };
        if let Some(prev) = self
            .proxies
            .iter()
            .find(|p| p.name == name && ((kind.fe() && p.kind.fe()) || (kind.be() && p.kind.be())))
        {
            self.errors.push(ConfigError::DuplicateProxy {
                at: loc.clone(),
                kind: kind.type_str(),
                name: name.clone(),
                prev_kind: prev.kind.type_str(),
                prev: prev.loc.clone(),
            });
        }
        let mut draft = match template {
            Some(i) => self.defaults[i].clone(),
            None => ProxyDraft::fresh(kind, &name, loc),
        };
        draft.tcp_check_inherited = true;
        draft.tcp_check_comment = None;
        draft.kind = kind;
        draft.name = name;
        draft.loc = loc.clone();
        self.proxies.push(draft);
        self.section = Section::Proxy(self.proxies.len() - 1);
    }
}

/// Refuses `kw` in a section that lacks the capability it needs.
fn check_caps(d: &ProxyDraft, kw: &str, caps: u8) -> Result<(), String> {
    let ok = match d.kind {
        Kind::Defaults => caps & DEF != 0,
        Kind::Frontend => caps & FE != 0,
        Kind::Backend => caps & BE != 0,
        Kind::Listen => caps & (FE | BE) != 0,
    };
    if ok {
        return Ok(());
    }
    Err(match d.kind {
        Kind::Defaults => format!("'{kw}' not allowed in 'defaults' section."),
        Kind::Frontend => format!(
            "'{kw}' not allowed because frontend '{}' has no backend capability.",
            d.name
        ),
        Kind::Backend | Kind::Listen => format!(
            "'{kw}' not allowed because backend '{}' has no frontend capability.",
            d.name
        ),
    })
}

/// One line of a defaults/frontend/backend/listen section.
fn proxy_line(
    d: &mut ProxyDraft,
    args: &[String],
    loc: &Location,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
    let kw = args[0].as_str();
    let Some(&(_, caps)) = PROXY_KEYWORDS.iter().find(|(k, _)| *k == kw) else {
        if HTTP_ONLY_KEYWORDS.contains(&kw) {
            return Err(format!("'{kw}' is not supported by shunt (TCP only)."));
        }
        if ACL_KEYWORDS.contains(&kw) {
            return Err(format!(
                "'{kw}' is not supported by shunt yet (ACLs come later)."
            ));
        }
        let msg = format!("unknown keyword '{kw}' in '{}' section", d.kind.section());
        let candidates = PROXY_KEYWORDS
            .iter()
            .map(|(k, _)| *k)
            .chain(SECTIONS.iter().copied());
        return Err(with_hint(msg, suggest(kw, candidates)));
    };
    check_caps(d, kw, caps)?;
    let val = args.get(1).map(String::as_str);
    match kw {
        "mode" => {
            match val {
                Some("tcp") => {}
                Some(m @ ("http" | "health" | "log")) => {
                    return Err(format!("'mode {m}' is not supported by shunt (TCP only)."))
                }
                Some(m) => return Err(format!("unknown proxy mode '{m}'.")),
                None => return Err("'mode' expects 'tcp' as argument.".to_string()),
            }
            no_extra(args, 2, kw)
        }
        "bind" => {
            let Some(list) = val else {
                return Err(
                    "'bind' expects [addr1]:port1[-end1]{,[addr]:port[-end]}... as arguments."
                        .to_string(),
                );
            };
            if let Some(opt) = args.get(2) {
                return Err(format!(
                    "'bind {list}' in section '{}': unknown keyword '{opt}' (shunt supports no bind options yet).",
                    d.kind.section()
                ));
            }
            for one in list.split(',') {
                let addrs = parse_addr(one, true).map_err(|e| format!("'bind' : {e}"))?;
                d.binds.extend(addrs.into_iter().map(|a| (a, loc.clone())));
            }
            Ok(())
        }
        "default_backend" | "use_backend" => {
            let name = val.ok_or_else(|| format!("'{kw}' expects a backend name."))?;
            if let Some(cond @ ("if" | "unless")) = args.get(2).map(String::as_str) {
                return Err(format!(
                    "'{kw}' : conditions ('{cond}') are not supported by shunt yet (ACLs come later)."
                ));
            }
            no_extra(args, 2, kw)?;
            if kw == "default_backend" {
                d.default_backend = Some((name.to_string(), loc.clone()));
            } else {
                d.use_backends.push((parse_use_backend(name)?, loc.clone()));
            }
            Ok(())
        }
        "maxconn" => {
            d.maxconn = bounded(int_arg(val, kw)?, 0, MAX_MAXCONN, kw)?;
            no_extra(args, 2, kw)
        }
        "fullconn" => {
            d.fullconn = bounded(int_arg(val, kw)?, 0, MAX_MAXCONN, kw)?;
            no_extra(args, 2, kw)
        }
        "retries" => {
            let n: u32 = int_arg(val, kw)?;
            if n > MAX_RETRIES {
                return Err(format!(
                    "'retries' value must be between 0 and {MAX_RETRIES} (was {n})"
                ));
            }
            d.retries = n;
            no_extra(args, 2, kw)
        }
        "balance" => {
            d.balance = match val {
                Some("roundrobin") => Balance::RoundRobin,
                Some("static-rr") => Balance::StaticRr,
                Some("leastconn") => Balance::LeastConn,
                Some("first") => Balance::First,
                Some("source") => Balance::Source,
                Some("random") => Balance::Random,
                other => {
                    return Err(format!(
                        "'balance' only supports 'roundrobin', 'static-rr', 'leastconn', 'first', 'source' and 'random' (got '{}').",
                        other.unwrap_or("")
                    ))
                }
            };
            no_extra(args, 2, kw)
        }
        "timeout" => timeout_line(d, args, loc, warnings),
        "tcp-request" => tcp_request_line(d, args),
        "tcp-check" => tcp_check_line(d, args),
        "option" => option_line(d, &args[1..], false),
        "no" => match val {
            Some("option") => option_line(d, &args[2..], true),
            Some("log") => {
                d.log_global = false;
                d.logs.clear();
                no_extra(args, 2, "no log")
            }
            _ => Err("'no' is only supported before 'option' and 'log'.".to_string()),
        },
        "log" => match val {
            Some("global") => {
                d.log_global = true;
                no_extra(args, 2, "log global")
            }
            None => {
                Err("log : expects <address> and <facility> or global as arguments".to_string())
            }
            Some(_) => {
                d.logs.push(log::log_target(&args[1..])?);
                Ok(())
            }
        },
        "log-format" => {
            let f = val.ok_or_else(|| "'log-format' expects a format string.".to_string())?;
            no_extra(args, 2, kw)?;
            d.log_format = Some(LogFormat::parse(f).map_err(|e| format!("'log-format' : {e}"))?);
            Ok(())
        }
        "server" => server_line(d, args, loc),
        "default-server" => {
            server_keywords(&args[1..], "default-server", &mut d.default_server, None)
                .map_err(|e| format!("'default-server' : {e}"))
        }
        "load-server-state-from-file" => {
            d.load_server_state = match val {
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
            no_extra(args, 2, kw)
        }
        _ => unreachable_keyword(kw),
    }
}

/// Every keyword of [`PROXY_KEYWORDS`] is matched in [`proxy_line`]; reaching
/// this means the table and the match disagree.
fn unreachable_keyword(kw: &str) -> Result<(), String> {
    Err(format!("internal error: keyword '{kw}' has no handler"))
}

fn timeout_line(
    d: &mut ProxyDraft,
    args: &[String],
    loc: &Location,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
    let sub = args.get(1).map(String::as_str).unwrap_or("");
    let caps = match sub {
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
    let v = args
        .get(2)
        .ok_or_else(|| format!("'{name}' expects an integer value (in milliseconds)"))?;
    let t = parse_time(v).map_err(|e| format!("{e} in '{name}'"))?;
    no_extra(args, 3, &name)?;
    // Timeouts for the other side are harmless: HAProxy ignores them with a warning.
    if let Err(msg) = check_caps(d, &name, caps | DEF) {
        warnings.push(format!(
            "parsing [{loc}] : {}",
            msg.replacen("not allowed", "ignored", 1)
        ));
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

/// `option NAME` (`words[0]` is NAME); `negate` for `no option NAME`.
fn option_line(d: &mut ProxyDraft, words: &[String], negate: bool) -> Result<(), String> {
    let Some(name) = words.first().map(String::as_str) else {
        return Err("'option' expects an option name.".to_string());
    };
    let full = format!("option {name}");
    let on = !negate;
    match name {
        "redispatch" => {
            check_caps(d, &full, DEF | BE)?;
            d.redispatch = on;
        }
        "splice-auto" => d.splice.auto = on,
        "splice-request" => d.splice.request = on,
        "splice-response" => d.splice.response = on,
        "tcp-check" => {
            check_caps(d, &full, DEF | BE)?;
            d.tcp_check = on;
        }
        // Backends ignore both (the frontend logs its flows), as HAProxy does.
        "tcplog" => d.tcplog = on,
        "dontlognull" => d.dontlognull = on,
        n if n.starts_with("http") || n == "forwardfor" || n == "originalto" => {
            return Err(format!("'{full}' is not supported by shunt (TCP only)."));
        }
        _ => return Err(format!("unknown option '{name}'.")),
    }
    no_extra(words, 1, &full)
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
    "ssl",
    "sni",
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

/// `tcp-check comment|connect|send|send-binary|expect ...`.
fn tcp_check_line(d: &mut ProxyDraft, args: &[String]) -> Result<(), String> {
    let sub = args.get(1).map(String::as_str).unwrap_or("");
    let rest = args.get(2..).unwrap_or(&[]);
    let mut comment = None;
    let action = match sub {
        "comment" => {
            let c = rest.first().ok_or_else(|| "'tcp-check comment' expects a string as argument.".to_string())?;
            no_extra(rest, 1, "tcp-check comment")?;
            d.tcp_check_comment = Some(c.clone());
            return Ok(());
        }
        "connect" => {
            let (mut port, mut addr) = (None, None);
            let mut i = 0;
            while i < rest.len() {
                let kw = rest[i].as_str();
                let val = rest.get(i + 1).map(String::as_str);
                match kw {
                    "port" => port = Some(port_arg(val, "tcp-check connect port")?),
                    "addr" => {
                        let v = val.ok_or_else(|| "'tcp-check connect' : 'addr' expects an address as argument.".to_string())?;
                        addr = Some(v.parse::<IpAddr>().map_err(|_| {
                            format!("'tcp-check connect' : 'addr' : unexpected address '{v}' (shunt needs an IP address).")
                        })?);
                    }
                    "comment" => {
                        let v = val.ok_or_else(|| "'tcp-check connect' : 'comment' expects a string as argument.".to_string())?;
                        comment = Some(v.to_string());
                    }
                    k if TCP_CHECK_CONNECT_UNSUPPORTED.contains(&k) => {
                        return Err(format!("'tcp-check connect' : '{k}' is not supported by shunt."))
                    }
                    k => {
                        return Err(format!(
                            "'tcp-check connect' expects 'comment', 'port', 'addr', 'send-proxy', 'via-socks4', 'ssl', 'sni', 'alpn', 'proto', 'linger' or 'default' but got '{k}' as argument."
                        ))
                    }
                }
                i += 2;
            }
            TcpCheckAction::Connect { port, addr }
        }
        "send" | "send-binary" => {
            let kw = format!("tcp-check {sub}");
            let data = rest.first().ok_or_else(|| format!("'{kw}' expects a {} as argument.", if sub == "send" { "string" } else { "binary string" }))?;
            match rest.get(1).map(String::as_str) {
                None => {}
                Some("comment") => {
                    let v = rest.get(2).ok_or_else(|| format!("'{kw}' : 'comment' expects a string as argument."))?;
                    comment = Some(v.clone());
                    no_extra(rest, 3, &kw)?;
                }
                Some(k) => return Err(format!("'{kw}' expects 'comment' but got '{k}' as argument.")),
            }
            let bytes = if sub == "send" {
                data.as_bytes().to_vec()
            } else {
                parse_hex(data).ok_or_else(|| format!("'{kw}' : invalid hexadecimal string '{data}'."))?
            };
            TcpCheckAction::Send(bytes)
        }
        "expect" => {
            let (e, c) = tcp_check_expect(rest)?;
            comment = c;
            TcpCheckAction::Expect(e)
        }
        s @ ("send-lf" | "send-binary-lf" | "set-var" | "unset-var") => {
            return Err(format!("'tcp-check {s}' is not supported by shunt."))
        }
        other => {
            return Err(format!(
                "'tcp-check' only supports 'comment', 'connect', 'send', 'send-binary' and 'expect' (got '{other}')."
            ))
        }
    };
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
    Ok(())
}

/// `tcp-check expect [min-recv N] [comment C] [!] string|rstring|binary|rbinary PATTERN`,
/// options in any order as HAProxy accepts them.
fn tcp_check_expect(words: &[String]) -> Result<(TcpExpect, Option<String>), String> {
    const KW: &str = "tcp-check expect";
    let mut kind = None;
    let mut pattern = None;
    let mut negate = false;
    let mut min_recv = None;
    let mut comment = None;
    let mut i = 0;
    while i < words.len() {
        let w = words[i].as_str();
        let val = words.get(i + 1).map(String::as_str);
        match w {
            "!" => {
                negate = true;
                i += 1;
                continue;
            }
            "min-recv" => {
                let n: usize = int_arg(val, "tcp-check expect min-recv")?;
                min_recv = Some(bounded(n, 0, MAX_MIN_RECV, "tcp-check expect min-recv")?);
            }
            "comment" => {
                let v = val.ok_or_else(|| format!("'{KW}' : 'comment' expects a string as argument."))?;
                comment = Some(v.to_string());
            }
            "string" | "rstring" | "binary" | "rbinary" => {
                if kind.is_some() {
                    return Err(format!("'{KW}' : only one pattern expected ('{w}' is one too many)."));
                }
                let v = val.ok_or_else(|| format!("'{KW}' : '{w}' expects <pattern> as an argument."))?;
                kind = Some(match w {
                    "string" => ExpectKind::String,
                    "rstring" => ExpectKind::Rstring,
                    "binary" => ExpectKind::Binary,
                    _ => ExpectKind::Rbinary,
                });
                pattern = Some(v.to_string());
            }
            k if TCP_CHECK_EXPECT_UNSUPPORTED.contains(&k) => {
                return Err(format!("'{KW}' : '{k}' is not supported by shunt."))
            }
            k => {
                return Err(format!(
                    "'{KW}' only supports 'min-recv', 'comment', '!', 'string', 'rstring', 'binary' and 'rbinary' but got '{k}' as argument."
                ))
            }
        }
        i += 2;
    }
    let (Some(kind), Some(pattern)) = (kind, pattern) else {
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
    Ok((
        TcpExpect {
            kind,
            negate,
            pattern,
            bytes,
            min_recv,
        },
        comment,
    ))
}
