//! ACLs: `acl NAME FETCH [flags] PATTERN...` and the `if|unless` conditions of
//! rules, parsed and compiled once at load into a small immutable tree.
//!
//! Owns the fetches shunt knows in tcp mode (`src`, `src_port`, `dst`,
//! `dst_port`, `req.ssl_sni`/`req_ssl_sni`, `always_true`, `always_false`,
//! and the stick-table counters `scN_*`, `sc_*(N)`, `src_*([table])`),
//! the match methods (`-m str|beg|end|sub|reg|ip|int|found`, `-i`), pattern
//! files (`-f`), and the condition grammar (`!`, `||`/`or`, implicit AND,
//! named ACLs, anonymous `{ ... }` blocks). Errors are HAProxy 2.6's wording
//! without the `parsing [file:line] :` prefix, which the caller adds.
//!
//! Invariants: evaluation ([`Cond::eval`], [`Expr::eval`]) never allocates:
//! patterns are pre-parsed (networks, integer ranges, lowercased strings for
//! `-i`, compiled regexes). It is pure but for `scN_inc_gpc0`/`clr_gpc0`,
//! which change the tracked entry through the context's [`StickCtx`], as
//! HAProxy's do; the tables themselves are the runtime's, reached only
//! through that trait (config imports nothing). A condition may name only an ACL
//! declared before it (as HAProxy), and once the proxy is parsed holds a copy
//! of all that ACL's declarations ([`Cond::complete`]).

use std::net::{IpAddr, SocketAddr};

use super::mapfile::IpNet;

/// What a condition is evaluated against: the flow's addresses and, once
/// peeked, the TLS server name.
#[derive(Clone, Copy)]
pub struct AclCtx<'a> {
    pub src: SocketAddr,
    /// The local address the client reached; `None` when unknown.
    pub dst: Option<SocketAddr>,
    /// The ClientHello's server name; `None` when absent or not peeked.
    pub sni: Option<&'a str>,
    /// The flow's tracked counters and the stick tables; `None` where the
    /// proxy uses none (every stick fetch then fails).
    pub stick: Option<&'a dyn StickCtx>,
}

impl std::fmt::Debug for AclCtx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclCtx")
            .field("src", &self.src)
            .field("dst", &self.dst)
            .field("sni", &self.sni)
            .field("stick", &self.stick.is_some())
            .finish()
    }
}

/// What a stick fetch reads (or, for `inc_gpc0`/`clr_gpc0`, changes) in an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StickFetch {
    ConnCnt,
    ConnCur,
    ConnRate,
    SessCnt,
    SessRate,
    GetGpc0,
    IncGpc0,
    ClrGpc0,
    Gpc0Rate,
    GetGpt0,
}

/// The stick fetches by the name after their `scN_`/`sc_`/`src_` prefix.
const STICK_FETCHES: &[(&str, StickFetch)] = &[
    ("conn_cnt", StickFetch::ConnCnt),
    ("conn_cur", StickFetch::ConnCur),
    ("conn_rate", StickFetch::ConnRate),
    ("sess_cnt", StickFetch::SessCnt),
    ("sess_rate", StickFetch::SessRate),
    ("get_gpc0", StickFetch::GetGpc0),
    ("inc_gpc0", StickFetch::IncGpc0),
    ("clr_gpc0", StickFetch::ClrGpc0),
    ("gpc0_rate", StickFetch::Gpc0Rate),
    ("get_gpt0", StickFetch::GetGpt0),
];

/// The `src_*` fetches that only read (HAProxy's `src_inc_gpc0` and
/// `src_clr_gpc0` create the entry; shunt does not have them).
fn src_reads(f: StickFetch) -> bool {
    !matches!(f, StickFetch::IncGpc0 | StickFetch::ClrGpc0)
}

/// The stick tables as a condition sees them, implemented by the flow.
pub trait StickCtx {
    /// `scN_*`: the value in the entry counter `sc` tracks; `None` when it
    /// tracks none (the fetch fails, as HAProxy's).
    fn tracked(&self, sc: u8, what: StickFetch) -> Option<i64>;
    /// `src_*(table)`: the value in `table`'s entry for `addr`, 0 when the
    /// table has no such entry; `None` when `addr` cannot be a key of it.
    fn lookup(&self, table: usize, addr: IpAddr, what: StickFetch) -> Option<i64>;
}

/// A sample fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetch {
    Src,
    SrcPort,
    Dst,
    DstPort,
    /// `req.ssl_sni` / `req_ssl_sni`: the TLS server name (needs the peek).
    SslSni,
    AlwaysTrue,
    AlwaysFalse,
    /// `scN_WHAT` / `sc_WHAT(N)`: the entry tracked by counter N.
    Sc {
        sc: u8,
        what: StickFetch,
    },
    /// `src_WHAT([table])`: the client address's entry ([`Expr::table`]).
    SrcTable(StickFetch),
}

/// The type of a fetch's sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ip,
    Int,
    Str,
    Bool,
}

impl Fetch {
    /// The fetch `s` names, and its keyword as a static string.
    fn by_name(s: &str) -> Option<(Self, &'static str)> {
        let f = match s {
            "src" => Fetch::Src,
            "src_port" => Fetch::SrcPort,
            "dst" => Fetch::Dst,
            "dst_port" => Fetch::DstPort,
            "req.ssl_sni" | "req_ssl_sni" => Fetch::SslSni,
            "always_true" => Fetch::AlwaysTrue,
            "always_false" => Fetch::AlwaysFalse,
            _ => return None,
        };
        Some((
            f,
            if s == "req_ssl_sni" {
                "req_ssl_sni"
            } else {
                f.name()
            },
        ))
    }

    /// The name HAProxy gives the fetch in messages.
    pub fn name(self) -> &'static str {
        match self {
            Fetch::Src => "src",
            Fetch::SrcPort => "src_port",
            Fetch::Dst => "dst",
            Fetch::DstPort => "dst_port",
            Fetch::SslSni => "req.ssl_sni",
            Fetch::AlwaysTrue => "always_true",
            Fetch::AlwaysFalse => "always_false",
            Fetch::Sc { .. } => "sc",
            Fetch::SrcTable(_) => "src_*",
        }
    }

    fn kind(self) -> Kind {
        match self {
            Fetch::Src | Fetch::Dst => Kind::Ip,
            Fetch::SrcPort | Fetch::DstPort | Fetch::Sc { .. } | Fetch::SrcTable(_) => Kind::Int,
            Fetch::SslSni => Kind::Str,
            Fetch::AlwaysTrue | Fetch::AlwaysFalse => Kind::Bool,
        }
    }
}

/// How a string pattern matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrHow {
    Exact,
    Beg,
    End,
    Sub,
}

/// A compiled `-m reg` pattern; equal when the source text is.
#[derive(Debug, Clone)]
pub struct Regex {
    pub source: String,
    re: regex_automata::meta::Regex,
}

impl PartialEq for Regex {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// The patterns of one ACL declaration, typed by match method.
#[derive(Debug, Clone, PartialEq)]
pub enum Patterns {
    /// `-m found`: the fetch yields a sample.
    Found,
    /// A boolean fetch (`always_true`): its own value, patterns ignored.
    Bool,
    /// `-m ip`: networks, v4 and v6.
    Ip(Vec<IpNet>),
    /// `-m int`: inclusive ranges.
    Int(Vec<(i64, i64)>),
    /// `-m str|beg|end|sub`; with `-i` the patterns are stored lowercased.
    Str {
        how: StrHow,
        icase: bool,
        pats: Vec<String>,
    },
    /// `-m reg`.
    Reg(Vec<Regex>),
}

/// One `acl` declaration (or anonymous block): a fetch and its patterns.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    pub fetch: Fetch,
    /// The fetch's keyword as written (`req_ssl_sni` or `req.ssl_sni`,
    /// `src_conn_rate`), for messages.
    pub keyword: String,
    pub patterns: Patterns,
    /// The table a `src_*` fetch reads: its argument, else (`None` name
    /// until validation) the proxy's own; resolved by validation.
    pub table: Option<super::stick::TableRef>,
}

/// A sample, borrowed from the context.
enum Sample<'a> {
    Ip(IpAddr),
    Int(i64),
    Str(&'a str),
    Bool(bool),
}

impl Expr {
    fn sample<'a>(&self, ctx: &AclCtx<'a>) -> Option<Sample<'a>> {
        Some(match self.fetch {
            Fetch::Src => Sample::Ip(ctx.src.ip().to_canonical()),
            Fetch::SrcPort => Sample::Int(i64::from(ctx.src.port())),
            Fetch::Dst => Sample::Ip(ctx.dst?.ip().to_canonical()),
            Fetch::DstPort => Sample::Int(i64::from(ctx.dst?.port())),
            Fetch::SslSni => Sample::Str(ctx.sni?),
            Fetch::AlwaysTrue => Sample::Bool(true),
            Fetch::AlwaysFalse => Sample::Bool(false),
            Fetch::Sc { sc, what } => Sample::Int(ctx.stick?.tracked(sc, what)?),
            Fetch::SrcTable(what) => {
                let table = self.table.as_ref()?.index;
                Sample::Int(
                    ctx.stick?
                        .lookup(table, ctx.src.ip().to_canonical(), what)?,
                )
            }
        })
    }

    /// Whether the fetch's sample matches one of the patterns.
    pub fn eval(&self, ctx: &AclCtx<'_>) -> bool {
        let Some(s) = self.sample(ctx) else {
            return false;
        };
        match (&self.patterns, s) {
            (Patterns::Found, _) => true,
            (Patterns::Bool, Sample::Bool(b)) => b,
            (Patterns::Ip(nets), Sample::Ip(ip)) => {
                let host = IpNet::host(ip);
                nets.iter()
                    .any(|n| host.truncate(n.prefix_len()) == *n && same_family(host, *n))
            }
            (Patterns::Int(ranges), Sample::Int(v)) => {
                ranges.iter().any(|&(lo, hi)| lo <= v && v <= hi)
            }
            (Patterns::Str { how, icase, pats }, Sample::Str(v)) => {
                pats.iter().any(|p| str_match(*how, *icase, v, p))
            }
            (Patterns::Reg(res), Sample::Str(v)) => res.iter().any(|r| r.re.is_match(v)),
            // The parser only builds patterns of the fetch's type.
            _ => false,
        }
    }
}

fn same_family(a: IpNet, b: IpNet) -> bool {
    matches!(
        (a, b),
        (IpNet::V4 { .. }, IpNet::V4 { .. }) | (IpNet::V6 { .. }, IpNet::V6 { .. })
    )
}

/// `v` against pattern `p` (already lowercased when `icase`), without allocating.
fn str_match(how: StrHow, icase: bool, v: &str, p: &str) -> bool {
    let (v, p) = (v.as_bytes(), p.as_bytes());
    let eq = |a: &[u8], b: &[u8]| {
        if icase {
            a.eq_ignore_ascii_case(b)
        } else {
            a == b
        }
    };
    match how {
        StrHow::Exact => eq(v, p),
        StrHow::Beg => v.len() >= p.len() && eq(&v[..p.len()], p),
        StrHow::End => v.len() >= p.len() && eq(&v[v.len() - p.len()..], p),
        StrHow::Sub => p.is_empty() || v.windows(p.len()).any(|w| eq(w, p)),
    }
}

/// A named ACL: every `acl NAME ...` line with that name, in order (any one
/// matching makes the ACL match, as in HAProxy).
#[derive(Debug, Clone, PartialEq)]
pub struct NamedAcl {
    pub name: String,
    pub exprs: Vec<Expr>,
}

/// One term of a condition: an ACL, possibly negated.
#[derive(Debug, Clone, PartialEq)]
pub struct Term {
    pub neg: bool,
    /// The ACL's name, `None` for an anonymous block.
    pub name: Option<String>,
    pub exprs: Vec<Expr>,
}

impl Term {
    fn eval(&self, ctx: &AclCtx<'_>) -> bool {
        self.exprs.iter().any(|e| e.eval(ctx)) != self.neg
    }
}

/// An `if|unless` condition: OR of suites of ANDed terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Cond {
    pub unless: bool,
    pub suites: Vec<Vec<Term>>,
}

impl Cond {
    /// Whether the rule carrying this condition applies.
    pub fn eval(&self, ctx: &AclCtx<'_>) -> bool {
        let any = self
            .suites
            .iter()
            .any(|s| !s.is_empty() && s.iter().all(|t| t.eval(ctx)));
        any != self.unless
    }

    /// Some term fetches the TLS server name (the flow must peek for it).
    pub fn uses_sni(&self) -> bool {
        self.first_fetch(Fetch::SslSni).is_some()
    }

    /// Gives every named term all the declarations of its ACL in the proxy, the
    /// lines after the rule included (HAProxy's rules share the ACL). Run once
    /// the proxy's section is over; the parser already refused unknown names.
    pub fn complete(&mut self, acls: &[NamedAcl]) {
        for t in self.suites.iter_mut().flatten() {
            if let Some(a) = t
                .name
                .as_ref()
                .and_then(|n| acls.iter().find(|a| a.name == *n))
            {
                t.exprs.clone_from(&a.exprs);
            }
        }
    }

    /// Some term reads a stick table (the flow must offer its [`StickCtx`]).
    pub fn uses_tables(&self) -> bool {
        self.suites
            .iter()
            .flatten()
            .flat_map(|t| &t.exprs)
            .any(|e| matches!(e.fetch, Fetch::Sc { .. } | Fetch::SrcTable(_)))
    }

    /// Every table reference of its `src_*` fetches, to resolve.
    pub fn table_refs_mut(&mut self) -> impl Iterator<Item = (&str, &mut super::stick::TableRef)> {
        self.suites
            .iter_mut()
            .flatten()
            .flat_map(|t| t.exprs.iter_mut())
            .filter_map(|e| e.table.as_mut().map(|r| (e.keyword.as_str(), r)))
    }

    /// The first term that uses `fetch`, and the expression that does.
    pub fn first_fetch(&self, fetch: Fetch) -> Option<(&Term, &Expr)> {
        self.suites
            .iter()
            .flatten()
            .find_map(|t| t.exprs.iter().find(|e| e.fetch == fetch).map(|e| (t, e)))
    }
}

// ---------- parsing ----------

/// The characters HAProxy allows in an ACL name.
fn invalid_acl_char(name: &str) -> Option<char> {
    name.chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
}

/// Parses `acl NAME FETCH [flags] PATTERN...` (`args[0]` is `acl`) and adds
/// it to `acls`.
pub fn parse_acl(args: &[String], acls: &mut Vec<NamedAcl>) -> Result<(), String> {
    let Some(name) = args.get(1) else {
        return Err("'acl' expects an ACL name.".to_string());
    };
    if let Some(c) = invalid_acl_char(name) {
        return Err(format!(
            "character '{c}' is not permitted in acl name '{name}'."
        ));
    }
    let expr = parse_expr(&args[2..])
        .map_err(|e| format!("error detected while parsing ACL '{name}' : {e}."))?;
    match acls.iter_mut().find(|a| a.name == *name) {
        Some(a) => a.exprs.push(expr),
        None => acls.push(NamedAcl {
            name: name.clone(),
            exprs: vec![expr],
        }),
    }
    Ok(())
}

/// Match methods by `-m` name.
enum Method {
    Found,
    Ip,
    Int,
    Str(StrHow),
    Reg,
}

fn method(name: &str) -> Result<Method, String> {
    Ok(match name {
        "found" => Method::Found,
        "ip" => Method::Ip,
        "int" => Method::Int,
        "str" => Method::Str(StrHow::Exact),
        "beg" => Method::Str(StrHow::Beg),
        "end" => Method::Str(StrHow::End),
        "sub" => Method::Str(StrHow::Sub),
        "reg" => Method::Reg,
        "bool" | "bin" | "len" | "dir" | "dom" => {
            return Err(format!(
                "matching method '{name}' is not supported by shunt"
            ))
        }
        _ => {
            return Err(format!(
                "unknown matching method '{name}' when parsing ACL expression"
            ))
        }
    })
}

/// `FETCH [flags] PATTERN...`: the words of one ACL expression.
fn parse_expr(words: &[String]) -> Result<Expr, String> {
    let Some(fname) = words.first() else {
        return Err("missing fetch method in ACL expression ''".to_string());
    };
    let (fetch, keyword, table) = match Fetch::by_name(fname) {
        Some((f, k)) => (f, k.to_string(), None),
        None => stick_fetch(fname)?
            .ok_or_else(|| format!("unknown fetch method '{fname}' in ACL expression '{fname}'"))?,
    };
    let mut icase = false;
    let mut how: Option<Method> = None;
    let mut pats: Vec<String> = Vec::new();
    let mut i = 1;
    while let Some(w) = words.get(i) {
        if !w.starts_with('-') {
            break;
        }
        i += 1;
        match w.as_str() {
            "--" => break,
            "-i" => icase = true,
            "-m" => {
                let m = words.get(i).ok_or_else(|| {
                    "missing matching method when parsing ACL expression".to_string()
                })?;
                how = Some(method(m)?);
                i += 1;
            }
            "-f" => {
                let path = words
                    .get(i)
                    .ok_or_else(|| "missing pattern file name".to_string())?;
                pats.extend(pattern_file(path)?);
                i += 1;
            }
            "-n" | "-u" | "-M" => {
                return Err(format!("ACL option '{w}' is not supported by shunt"))
            }
            _ => {
                return Err(format!(
                    "'{w}' is not a valid ACL option. Please use '--' before any pattern beginning with a '-'"
                ))
            }
        }
    }
    pats.extend(words[i..].iter().cloned());
    let how = match how {
        Some(m) => m,
        None => match fetch.kind() {
            Kind::Ip => Method::Ip,
            Kind::Int => Method::Int,
            Kind::Str => Method::Str(StrHow::Exact),
            Kind::Bool => {
                return Ok(Expr {
                    fetch,
                    keyword,
                    patterns: Patterns::Bool,
                    table,
                })
            }
        },
    };
    let kind = fetch.kind();
    let refuse = |m: &str| {
        Err(format!(
            "matching method '{m}' on fetch '{}' is not supported by shunt",
            fetch.name()
        ))
    };
    let patterns = match how {
        Method::Found => Patterns::Found,
        Method::Ip if kind == Kind::Ip => Patterns::Ip(
            pats.iter()
                .map(|p| IpNet::parse(p).map_err(|e| e.to_string()))
                .collect::<Result<_, _>>()?,
        ),
        Method::Int if kind == Kind::Int => Patterns::Int(int_patterns(&pats)?),
        Method::Str(how) if kind == Kind::Str => Patterns::Str {
            how,
            icase,
            pats: pats
                .into_iter()
                .map(|p| if icase { p.to_ascii_lowercase() } else { p })
                .collect(),
        },
        Method::Reg if kind == Kind::Str => Patterns::Reg(
            pats.iter()
                .map(|p| compile(p, icase))
                .collect::<Result<_, _>>()?,
        ),
        Method::Ip => return refuse("ip"),
        Method::Int => return refuse("int"),
        Method::Str(_) => return refuse("str"),
        Method::Reg => return refuse("reg"),
    };
    Ok(Expr {
        fetch,
        keyword,
        patterns,
        table,
    })
}

/// A stick fetch (`sc0_conn_rate`, `sc_conn_rate(0)`, `src_conn_cur(t)`):
/// `Ok(None)` when `word` names none. A `src_*` fetch without a table
/// argument reads its proxy's table, named by validation.
type StickParsed = (Fetch, String, Option<super::stick::TableRef>);
fn stick_fetch(word: &str) -> Result<Option<StickParsed>, String> {
    let (name, args) = match word.split_once('(') {
        Some((n, rest)) => (n, Some(rest.strip_suffix(')').unwrap_or(rest))),
        None => (word, None),
    };
    let what_of = |suffix: &str| {
        STICK_FETCHES
            .iter()
            .find(|(n, _)| *n == suffix)
            .map(|(_, w)| *w)
    };
    let unsupported_arg = || {
        format!("fetch method '{name}' : a table argument is not supported by shunt in ACL expression '{word}'")
    };
    if let Some(rest) = name.strip_prefix("src_") {
        let Some(what) = what_of(rest).filter(|w| src_reads(*w)) else {
            return Ok(None);
        };
        // The location is the rule's, filled in with the name by validation.
        let table = super::stick::TableRef::named(args.unwrap_or(""), &Default::default());
        return Ok(Some((Fetch::SrcTable(what), name.to_string(), Some(table))));
    }
    if let Some(rest) = name.strip_prefix("sc_") {
        let Some(what) = what_of(rest) else {
            return Ok(None);
        };
        let n = args.filter(|a| !a.is_empty()).ok_or_else(|| {
            format!("fetch method '{name}' : expected type 'integer' at position 1, but got nothing in ACL expression '{word}'")
        })?;
        if n.contains(',') {
            return Err(unsupported_arg());
        }
        let sc = n
            .parse::<u8>()
            .ok()
            .filter(|s| usize::from(*s) < super::stick::MAX_TRACKERS)
            .ok_or_else(|| {
                format!("fetch method '{name}' : invalid stick counter '{n}' in ACL expression '{word}'")
            })?;
        return Ok(Some((Fetch::Sc { sc, what }, name.to_string(), None)));
    }
    for sc in 0..super::stick::MAX_TRACKERS {
        let prefix = format!("sc{sc}_");
        let Some(what) = name.strip_prefix(prefix.as_str()).and_then(what_of) else {
            continue;
        };
        if args.is_some() {
            return Err(unsupported_arg());
        }
        let sc = u8::try_from(sc).unwrap_or(0);
        return Ok(Some((Fetch::Sc { sc, what }, name.to_string(), None)));
    }
    Ok(None)
}

fn compile(p: &str, icase: bool) -> Result<Regex, String> {
    let re = regex_automata::meta::Regex::builder()
        .syntax(regex_automata::util::syntax::Config::new().case_insensitive(icase))
        .build(p)
        .map_err(|e| format!("regex '{p}' is invalid: {e}"))?;
    Ok(Regex {
        source: p.to_string(),
        re,
    })
}

/// Patterns from a file: one per line, surrounding blanks trimmed, empty lines
/// and `#` comments skipped.
fn pattern_file(path: &str) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|_| format!("failed to open pattern file <{path}>"))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect())
}

/// Integer patterns: `N`, `N:M`, `:M`, `N:`, and the operators `eq|lt|le|gt|ge`
/// which apply to the next number.
fn int_patterns(pats: &[String]) -> Result<Vec<(i64, i64)>, String> {
    let num = |s: &str| -> Option<i64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let mut out = Vec::with_capacity(pats.len());
    let mut op: Option<&str> = None;
    for p in pats {
        if let Some(o) = op.take() {
            let n = num(p)
                .ok_or_else(|| format!("'{p}' is neither a number nor a supported operator"))?;
            out.push(match o {
                "eq" => (n, n),
                "lt" => (i64::MIN, n - 1),
                "le" => (i64::MIN, n),
                "gt" => (n + 1, i64::MAX),
                _ => (n, i64::MAX),
            });
            continue;
        }
        if matches!(p.as_str(), "eq" | "lt" | "le" | "gt" | "ge") {
            op = Some(p.as_str());
            continue;
        }
        if let Some(n) = num(p) {
            out.push((n, n));
            continue;
        }
        let Some((a, b)) = p.split_once(':') else {
            return Err(format!(
                "'{p}' is neither a number nor a supported operator"
            ));
        };
        let bad = || format!("'{p}' is not a valid number range");
        let lo = if a.is_empty() { Some(i64::MIN) } else { num(a) }.ok_or_else(bad)?;
        let hi = if b.is_empty() { Some(i64::MAX) } else { num(b) }.ok_or_else(bad)?;
        if lo > hi {
            return Err(bad());
        }
        out.push((lo, hi));
    }
    if let Some(o) = op {
        return Err(format!("missing value after operator '{o}'"));
    }
    Ok(out)
}

/// Parses a condition: `words[0]` is `if` or `unless`, the rest its terms.
/// Errors are HAProxy's inner text (no final period).
pub fn parse_cond(words: &[String], acls: &[NamedAcl]) -> Result<Cond, String> {
    let unless = match words.first().map(String::as_str) {
        Some("if") => false,
        Some("unless") => true,
        _ => return Err("expects 'if' or 'unless'".to_string()),
    };
    let mut suites = vec![Vec::new()];
    let mut neg = false;
    let mut i = 1;
    while let Some(w) = words.get(i) {
        i += 1;
        if w == "||" || w == "or" {
            suites.push(Vec::new());
            continue;
        }
        // `!` negates, alone or glued to what follows (`!{`, `!name`).
        let bare = w.trim_start_matches('!');
        if (w.len() - bare.len()) % 2 == 1 {
            neg = !neg;
        }
        match bare {
            "" => {}
            "{" => {
                let len = words[i..]
                    .iter()
                    .position(|w| w == "}")
                    .ok_or_else(|| "missing closing '}' in condition".to_string())?;
                let expr = parse_expr(&words[i..i + len])?;
                i += len + 1;
                push(
                    &mut suites,
                    Term {
                        neg,
                        name: None,
                        exprs: vec![expr],
                    },
                );
                neg = false;
            }
            name => {
                let acl = acls
                    .iter()
                    .find(|a| a.name == name)
                    .ok_or_else(|| format!("no such ACL : '{name}'"))?;
                push(
                    &mut suites,
                    Term {
                        neg,
                        name: Some(name.to_string()),
                        exprs: acl.exprs.clone(),
                    },
                );
                neg = false;
            }
        }
    }
    Ok(Cond { unless, suites })
}

fn push(suites: &mut [Vec<Term>], t: Term) {
    if let Some(last) = suites.last_mut() {
        last.push(t);
    }
}

#[cfg(test)]
mod tests;
