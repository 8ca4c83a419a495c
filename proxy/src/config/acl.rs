//! ACLs: `acl NAME FETCH [flags] PATTERN...` and the `if|unless` conditions of
//! rules, parsed and compiled once at load into a small immutable tree.
//!
//! Owns the fetches shunt knows in tcp mode (addresses and ports, the
//! request's contents: `req.len`, `req.payload`, `req.payload_lv`,
//! `req.ssl_sni`, `req.ssl_ver`, `req.ssl_hello_type`; the proxies' state:
//! `nbsrv`, `be_conn`, `fe_conn`; the stick-table counters `scN_*`,
//! `sc_*(N)`, `src_*([table])`; `always_true`, `always_false`), the match
//! methods (`-m str|beg|end|sub|reg|bin|ip|int|found`, `-i`), pattern files
//! (`-f`), and the condition grammar (`!`, `||`/`or`, implicit AND, named
//! ACLs, anonymous `{ ... }` blocks). Errors are HAProxy 2.6's wording without
//! the `parsing [file:line] :` prefix, which the caller adds.
//!
//! Invariants: evaluation ([`Cond::test`], [`Cond::eval`], [`Expr::test`])
//! never allocates: patterns are pre-parsed (networks, integer ranges,
//! lowercased strings for `-i`, decoded hex for `-m bin`, compiled regexes),
//! and what the request holds is decoded by the caller ([`Request`]). It is
//! pure but for `scN_inc_gpc0`/`clr_gpc0`, which change the tracked entry
//! through the context's [`StickCtx`], as HAProxy's do; the tables themselves
//! are the runtime's, reached only through that trait (config imports
//! nothing). A condition may name only an ACL declared before it (as
//! HAProxy), and once the proxy is parsed holds a copy of all that ACL's
//! declarations ([`Cond::complete`]).
//!
//! Results are HAProxy's three-valued ones ([`Verdict`]): a fetch short of
//! request bytes while more may come makes its ACL `Miss` (HAProxy's
//! `SMP_F_MAY_CHANGE`) unless it already matched; `tcp-request content`
//! waits on a `Miss` and evaluates again when bytes arrive or the
//! inspect-delay ends ([`Request::more`] false: every fetch is final).

use std::net::{IpAddr, SocketAddr};

use super::mapfile::IpNet;
use super::model::Location;

/// What the proxy's state says to `nbsrv`, `be_conn` and `fe_conn`; the
/// runtime implements it (this module stays a leaf). Indexes are the
/// configuration's.
pub trait Counts {
    /// Servers of backend `be` that may take traffic now (HAProxy's
    /// `be_usable_srv`: the active ones, else the backups that would serve).
    fn usable_servers(&self, be: usize) -> usize;
    /// Sessions backend `be` holds now.
    fn backend_conns(&self, be: usize) -> usize;
    /// Sessions frontend `fe` holds now.
    fn frontend_conns(&self, fe: usize) -> usize;
}

/// [`Counts`] of a process that holds nothing: every count is 0 (tests,
/// `shunt -c`).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCounts;

impl Counts for NoCounts {
    fn usable_servers(&self, _: usize) -> usize {
        0
    }
    fn backend_conns(&self, _: usize) -> usize {
        0
    }
    fn frontend_conns(&self, _: usize) -> usize {
        0
    }
}

/// A value decoded from the request's first bytes: there, not there (ever),
/// or not yet decidable with the bytes so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Probe<T> {
    /// The bytes cannot hold it (not TLS, malformed, nothing read).
    #[default]
    Absent,
    /// The bytes so far are a valid prefix; more are needed.
    Pending,
    Found(T),
}

/// What the client sent so far, as `tcp-request content` sees it: the bytes
/// (peeked, never consumed) and what the caller decoded from them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request<'a> {
    pub bytes: &'a [u8],
    /// More bytes may still come (the inspect-delay runs, the buffer has
    /// room, the client did not close): a fetch short of data is a `Miss`.
    pub more: bool,
    /// The TLS handshake type of the first record (`req.ssl_hello_type`).
    pub hello_type: Probe<i64>,
    /// The ClientHello's version, `major << 16 | minor` (`req.ssl_ver`).
    pub ssl_ver: Probe<i64>,
    /// The ClientHello is incomplete: `req.ssl_sni` may still come.
    pub sni_pending: bool,
}

impl Request<'_> {
    /// Nothing read, nothing to come: connection rules and plain contexts.
    pub const NONE: Request<'static> = Request {
        bytes: &[],
        more: false,
        hello_type: Probe::Absent,
        ssl_ver: Probe::Absent,
        sni_pending: false,
    };
}

/// What a condition is evaluated against: the flow's addresses, the request
/// so far, the proxies' state.
#[derive(Clone, Copy)]
pub struct AclCtx<'a> {
    pub src: SocketAddr,
    /// The local address the client reached; `None` when unknown.
    pub dst: Option<SocketAddr>,
    /// The ClientHello's server name; `None` when absent or not peeked.
    pub sni: Option<&'a str>,
    pub req: Request<'a>,
    pub counts: &'a dyn Counts,
    /// The flow's tracked counters and the stick tables; `None` where the
    /// proxy uses none (every stick fetch then fails).
    pub stick: Option<&'a dyn StickCtx>,
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

impl std::fmt::Debug for AclCtx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclCtx")
            .field("src", &self.src)
            .field("dst", &self.dst)
            .field("sni", &self.sni)
            .field("req", &self.req)
            .finish_non_exhaustive()
    }
}

/// HAProxy's result of an ACL or a condition (`ACL_TEST_FAIL|MISS|PASS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Fail,
    /// Undecided until more request bytes arrive.
    Miss,
    Pass,
}

impl Verdict {
    fn or(self, o: Verdict) -> Verdict {
        match (self, o) {
            (Verdict::Pass, _) | (_, Verdict::Pass) => Verdict::Pass,
            (Verdict::Miss, _) | (_, Verdict::Miss) => Verdict::Miss,
            _ => Verdict::Fail,
        }
    }
    fn and(self, o: Verdict) -> Verdict {
        match (self, o) {
            (Verdict::Fail, _) | (_, Verdict::Fail) => Verdict::Fail,
            (Verdict::Miss, _) | (_, Verdict::Miss) => Verdict::Miss,
            _ => Verdict::Pass,
        }
    }
    fn not(self) -> Verdict {
        match self {
            Verdict::Pass => Verdict::Fail,
            Verdict::Fail => Verdict::Pass,
            Verdict::Miss => Verdict::Miss,
        }
    }
}

/// Most bytes `req.payload_lv` reads as a length (HAProxy reads up to an
/// int's worth; a longer field would be a length no buffer holds).
const MAX_LV_LEN_BYTES: usize = 4;

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
    /// `req.len` / `req_len`: bytes in the request buffer.
    ReqLen,
    /// `req.payload(off,len)`; `len` 0 takes every byte from `off`.
    Payload {
        off: usize,
        len: usize,
    },
    /// `req.payload_lv(off,len[,data])`: a block whose length is the
    /// big-endian `len`-byte field at `off`, at `data` (else just after).
    PayloadLv {
        off: usize,
        len: usize,
        data: Option<usize>,
    },
    /// `req.ssl_ver` / `req_ssl_ver`: the ClientHello's version.
    SslVer,
    /// `req.ssl_hello_type` / `req_ssl_hello_type`.
    SslHelloType,
    /// `nbsrv([backend])`: usable servers ([`Expr::px`] names the backend).
    Nbsrv,
    /// `be_conn([backend])`.
    BeConn,
    /// `fe_conn([frontend])`.
    FeConn,
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
    Bin,
    Bool,
}

/// Which proxy a `nbsrv`, `be_conn` or `fe_conn` reads: the name written as
/// its argument (`None`: the proxy the rule is in), resolved to an index of
/// the configuration's backends (or frontends, for `fe_conn`) once every
/// section is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyArg {
    pub name: Option<String>,
    pub idx: usize,
    /// The line of the ACL or rule, for the resolution's errors.
    pub at: Location,
}

impl Fetch {
    /// The fetch `s` names (`name` or `name(args)`), its keyword as a static
    /// string, and its proxy argument if it takes one.
    fn parse(s: &str) -> Result<(Self, &'static str, Option<Option<String>>), String> {
        let (name, args) = match s.split_once('(') {
            Some((n, rest)) => {
                let inner = rest.strip_suffix(')').ok_or_else(|| {
                    format!("missing closing ')' after arguments to fetch keyword '{n}' in ACL expression '{s}'")
                })?;
                (n, Some(inner))
            }
            None => (s, None),
        };
        let unknown = || format!("unknown fetch method '{name}' in ACL expression '{s}'");
        let (f, kw) = match name {
            "src" => (Fetch::Src, "src"),
            "src_port" => (Fetch::SrcPort, "src_port"),
            "dst" => (Fetch::Dst, "dst"),
            "dst_port" => (Fetch::DstPort, "dst_port"),
            "req.ssl_sni" => (Fetch::SslSni, "req.ssl_sni"),
            "req_ssl_sni" => (Fetch::SslSni, "req_ssl_sni"),
            "always_true" => (Fetch::AlwaysTrue, "always_true"),
            "always_false" => (Fetch::AlwaysFalse, "always_false"),
            "req.len" => (Fetch::ReqLen, "req.len"),
            "req_len" => (Fetch::ReqLen, "req_len"),
            "req.ssl_ver" => (Fetch::SslVer, "req.ssl_ver"),
            "req_ssl_ver" => (Fetch::SslVer, "req_ssl_ver"),
            "req.ssl_hello_type" => (Fetch::SslHelloType, "req.ssl_hello_type"),
            "req_ssl_hello_type" => (Fetch::SslHelloType, "req_ssl_hello_type"),
            "nbsrv" => (Fetch::Nbsrv, "nbsrv"),
            "be_conn" => (Fetch::BeConn, "be_conn"),
            "fe_conn" => (Fetch::FeConn, "fe_conn"),
            "req.payload" => (Fetch::Payload { off: 0, len: 0 }, "req.payload"),
            "req.payload_lv" => (
                Fetch::PayloadLv {
                    off: 0,
                    len: 0,
                    data: None,
                },
                "req.payload_lv",
            ),
            _ => return Err(unknown()),
        };
        let words: Vec<&str> = match args {
            Some(a) if !a.is_empty() => a.split(',').collect(),
            _ => Vec::new(),
        };
        let int = |i: usize, what: &str| -> Result<usize, String> {
            let w = words.get(i).copied().unwrap_or("");
            w.parse::<usize>().map_err(|_| {
                format!("invalid arg {} in fetch method '{name}' : failed to parse '{w}' as type {what} in ACL expression '{s}'", i + 1)
            })
        };
        let count = |lo: usize, hi: usize| -> Result<(), String> {
            if words.len() < lo {
                Err(format!("fetch method '{name}' : missing arguments (got {}/{lo}), type 'integer' expected in ACL expression '{s}'", words.len()))
            } else if words.len() > hi {
                Err(format!("fetch method '{name}' : end of arguments expected at position {}, but got ',{}' in ACL expression '{s}'", hi + 1, words[hi..].join(",")))
            } else {
                Ok(())
            }
        };
        let f = match f {
            Fetch::Payload { .. } => {
                count(2, 2)?;
                Fetch::Payload {
                    off: int(0, "integer")?,
                    len: int(1, "integer")?,
                }
            }
            Fetch::PayloadLv { .. } => {
                count(2, 3)?;
                let len = int(1, "integer")?;
                if len == 0 || len > MAX_LV_LEN_BYTES {
                    return Err(format!("fetch method '{name}' : the length field must be 1 to {MAX_LV_LEN_BYTES} bytes in ACL expression '{s}'"));
                }
                let data = match words.get(2) {
                    Some(w) if w.starts_with(['+', '-']) => {
                        return Err(format!("fetch method '{name}' : relative offset '{w}' is not supported by shunt in ACL expression '{s}'"))
                    }
                    Some(_) => Some(int(2, "integer")?),
                    None => None,
                };
                Fetch::PayloadLv {
                    off: int(0, "integer")?,
                    len,
                    data,
                }
            }
            Fetch::Nbsrv | Fetch::BeConn | Fetch::FeConn => {
                count(0, 1)?;
                return Ok((f, kw, Some(words.first().map(|w| w.to_string()))));
            }
            other => {
                if args.is_some() {
                    return Err(format!("fetch method '{name}' : no argument supported, but got '{}' in ACL expression '{s}'", args.unwrap_or("")));
                }
                other
            }
        };
        Ok((f, kw, None))
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
            Fetch::ReqLen => "req.len",
            Fetch::Payload { .. } => "req.payload",
            Fetch::PayloadLv { .. } => "req.payload_lv",
            Fetch::SslVer => "req.ssl_ver",
            Fetch::SslHelloType => "req.ssl_hello_type",
            Fetch::Nbsrv => "nbsrv",
            Fetch::BeConn => "be_conn",
            Fetch::FeConn => "fe_conn",
            Fetch::Sc { .. } => "sc",
            Fetch::SrcTable(_) => "src_*",
        }
    }

    /// The fetch reads the request's contents: it never matches in a
    /// `tcp-request connection` rule (nothing was read yet).
    pub fn reads_content(self) -> bool {
        matches!(
            self,
            Fetch::SslSni
                | Fetch::ReqLen
                | Fetch::Payload { .. }
                | Fetch::PayloadLv { .. }
                | Fetch::SslVer
                | Fetch::SslHelloType
        )
    }

    fn kind(self) -> Kind {
        match self {
            Fetch::Src | Fetch::Dst => Kind::Ip,
            Fetch::SrcPort
            | Fetch::DstPort
            | Fetch::ReqLen
            | Fetch::SslVer
            | Fetch::SslHelloType
            | Fetch::Nbsrv
            | Fetch::BeConn
            | Fetch::FeConn
            | Fetch::Sc { .. }
            | Fetch::SrcTable(_) => Kind::Int,
            Fetch::SslSni => Kind::Str,
            Fetch::Payload { .. } | Fetch::PayloadLv { .. } => Kind::Bin,
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
    /// `-m int` (and `req.ssl_ver`'s dotted versions): inclusive ranges.
    Int(Vec<(i64, i64)>),
    /// `-m str|beg|end|sub`; with `-i` the patterns are stored lowercased.
    Str {
        how: StrHow,
        icase: bool,
        pats: Vec<String>,
    },
    /// `-m reg`.
    Reg(Vec<Regex>),
    /// `-m bin`: the bytes the hex patterns spell, matched exactly.
    Bin(Vec<Vec<u8>>),
}

/// One `acl` declaration (or anonymous block): a fetch and its patterns.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    pub fetch: Fetch,
    /// The fetch's keyword as written (`req_ssl_sni` or `req.ssl_sni`,
    /// `src_conn_rate`), for messages.
    pub keyword: String,
    pub patterns: Patterns,
    /// The proxy `nbsrv`, `be_conn` and `fe_conn` read.
    pub px: Option<ProxyArg>,
    /// The table a `src_*` fetch reads: its argument, else (`None` name
    /// until validation) the proxy's own; resolved by validation.
    pub table: Option<super::stick::TableRef>,
}

/// A sample, borrowed from the context.
enum Sample<'a> {
    Ip(IpAddr),
    Int(i64),
    Str(&'a [u8]),
    Bool(bool),
}

/// A fetch's answer: the sample if there is one, and whether more request
/// bytes could change it (HAProxy's `SMP_F_MAY_CHANGE` outside a final
/// evaluation).
struct Got<'a> {
    sample: Option<Sample<'a>>,
    may_change: bool,
}

impl<'a> Got<'a> {
    fn sure(s: Sample<'a>) -> Self {
        Got {
            sample: Some(s),
            may_change: false,
        }
    }
    fn none(may_change: bool) -> Self {
        Got {
            sample: None,
            may_change,
        }
    }
    fn probe(p: Probe<i64>, more: bool) -> Self {
        match p {
            Probe::Found(v) => Got::sure(Sample::Int(v)),
            Probe::Pending => Got::none(more),
            Probe::Absent => Got::none(false),
        }
    }
}

impl Expr {
    fn sample<'a>(&self, ctx: &AclCtx<'a>) -> Got<'a> {
        let req = &ctx.req;
        let more = req.more;
        let px = self.px.as_ref().map_or(0, |p| p.idx);
        let int = |v: usize| Got::sure(Sample::Int(i64::try_from(v).unwrap_or(i64::MAX)));
        match self.fetch {
            Fetch::Src => Got::sure(Sample::Ip(ctx.src.ip().to_canonical())),
            Fetch::SrcPort => Got::sure(Sample::Int(i64::from(ctx.src.port()))),
            Fetch::Dst => match ctx.dst {
                Some(d) => Got::sure(Sample::Ip(d.ip().to_canonical())),
                None => Got::none(false),
            },
            Fetch::DstPort => match ctx.dst {
                Some(d) => Got::sure(Sample::Int(i64::from(d.port()))),
                None => Got::none(false),
            },
            Fetch::SslSni => match ctx.sni {
                Some(n) => Got::sure(Sample::Str(n.as_bytes())),
                None => Got::none(more && req.sni_pending),
            },
            Fetch::AlwaysTrue => Got::sure(Sample::Bool(true)),
            Fetch::AlwaysFalse => Got::sure(Sample::Bool(false)),
            Fetch::ReqLen => Got {
                sample: Some(Sample::Int(
                    i64::try_from(req.bytes.len()).unwrap_or(i64::MAX),
                )),
                may_change: more,
            },
            Fetch::Payload { off, len: 0 } => match req.bytes.get(off..) {
                Some(b) => Got {
                    sample: Some(Sample::Str(b)),
                    may_change: more,
                },
                None => Got::none(more),
            },
            Fetch::Payload { off, len } => match req.bytes.get(off..off.saturating_add(len)) {
                Some(b) => Got::sure(Sample::Str(b)),
                None => Got::none(more),
            },
            Fetch::PayloadLv { off, len, data } => {
                let Some(field) = req.bytes.get(off..off.saturating_add(len)) else {
                    return Got::none(more);
                };
                let n = field
                    .iter()
                    .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
                let start = data.unwrap_or(off + len);
                match req.bytes.get(start..start.saturating_add(n)) {
                    Some(b) => Got::sure(Sample::Str(b)),
                    None => Got::none(more),
                }
            }
            Fetch::SslVer => Got::probe(req.ssl_ver, more),
            Fetch::SslHelloType => Got::probe(req.hello_type, more),
            Fetch::Nbsrv => int(ctx.counts.usable_servers(px)),
            Fetch::BeConn => int(ctx.counts.backend_conns(px)),
            Fetch::FeConn => int(ctx.counts.frontend_conns(px)),
            Fetch::Sc { sc, what } => match ctx.stick.and_then(|s| s.tracked(sc, what)) {
                Some(v) => Got::sure(Sample::Int(v)),
                None => Got::none(false),
            },
            Fetch::SrcTable(what) => {
                let found = (self.table.as_ref().zip(ctx.stick))
                    .and_then(|(t, s)| s.lookup(t.index, ctx.src.ip().to_canonical(), what));
                match found {
                    Some(v) => Got::sure(Sample::Int(v)),
                    None => Got::none(false),
                }
            }
        }
    }

    /// Whether the fetch's sample matches one of the patterns, final: a
    /// sample that could still change is judged as it is.
    pub fn eval(&self, ctx: &AclCtx<'_>) -> bool {
        self.test(ctx) == Verdict::Pass
    }

    /// HAProxy's result for this declaration: a match is final (`Pass`); no
    /// match, or no sample, is `Miss` while more bytes could change it.
    pub fn test(&self, ctx: &AclCtx<'_>) -> Verdict {
        let got = self.sample(ctx);
        let hit = got.sample.is_some_and(|s| self.matches(s));
        match (hit, got.may_change) {
            (true, _) => Verdict::Pass,
            (false, true) => Verdict::Miss,
            (false, false) => Verdict::Fail,
        }
    }

    fn matches(&self, s: Sample<'_>) -> bool {
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
            (Patterns::Str { how, icase, pats }, Sample::Str(v)) => pats
                .iter()
                .any(|p| str_match(*how, *icase, v, p.as_bytes())),
            (Patterns::Reg(res), Sample::Str(v)) => res.iter().any(|r| r.re.is_match(v)),
            (Patterns::Bin(pats), Sample::Str(v)) => pats.iter().any(|p| p.as_slice() == v),
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
fn str_match(how: StrHow, icase: bool, v: &[u8], p: &[u8]) -> bool {
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
    fn test(&self, ctx: &AclCtx<'_>) -> Verdict {
        let mut v = Verdict::Fail;
        for e in &self.exprs {
            v = v.or(e.test(ctx));
            if v == Verdict::Pass {
                break;
            }
        }
        if self.neg {
            v.not()
        } else {
            v
        }
    }
}

/// An `if|unless` condition: OR of suites of ANDed terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Cond {
    pub unless: bool,
    pub suites: Vec<Vec<Term>>,
}

impl Cond {
    /// Whether the rule carrying this condition applies, final: what could
    /// still change is judged as it is.
    pub fn eval(&self, ctx: &AclCtx<'_>) -> bool {
        (self.test(ctx) == Verdict::Pass) != self.unless
    }

    /// Whether the rule applies, or `None` while more request bytes could
    /// decide it (HAProxy waits; `unless` does not turn a `Miss` around).
    pub fn applies(&self, ctx: &AclCtx<'_>) -> Option<bool> {
        match self.test(ctx) {
            Verdict::Miss => None,
            v => Some((v == Verdict::Pass) != self.unless),
        }
    }

    /// The condition's own result, before `unless` (HAProxy's
    /// `acl_exec_cond`).
    pub fn test(&self, ctx: &AclCtx<'_>) -> Verdict {
        let mut res = Verdict::Fail;
        for s in &self.suites {
            if s.is_empty() {
                continue;
            }
            let mut suite = Verdict::Pass;
            for t in s {
                suite = suite.and(t.test(ctx));
                if suite == Verdict::Fail {
                    break;
                }
            }
            res = res.or(suite);
            if res == Verdict::Pass {
                break;
            }
        }
        res
    }

    /// Some term fetches the TLS server name (the flow must peek for it).
    pub fn uses_sni(&self) -> bool {
        self.first_fetch(|f| f == Fetch::SslSni).is_some()
    }

    /// Some term reads the request's contents.
    pub fn reads_content(&self) -> bool {
        self.first_fetch(Fetch::reads_content).is_some()
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

    /// Every expression of the condition, to resolve their proxy arguments.
    pub fn exprs_mut(&mut self) -> impl Iterator<Item = &mut Expr> {
        self.suites
            .iter_mut()
            .flatten()
            .flat_map(|t| t.exprs.iter_mut())
    }

    /// Every table reference of its `src_*` fetches, to resolve.
    pub fn table_refs_mut(&mut self) -> impl Iterator<Item = (&str, &mut super::stick::TableRef)> {
        self.suites
            .iter_mut()
            .flatten()
            .flat_map(|t| t.exprs.iter_mut())
            .filter_map(|e| e.table.as_mut().map(|r| (e.keyword.as_str(), r)))
    }

    /// The first term with a fetch `pick` selects, and the expression that has it.
    pub fn first_fetch(&self, pick: impl Fn(Fetch) -> bool) -> Option<(&Term, &Expr)> {
        self.suites
            .iter()
            .flatten()
            .find_map(|t| t.exprs.iter().find(|e| pick(e.fetch)).map(|e| (t, e)))
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
pub fn parse_acl(args: &[String], acls: &mut Vec<NamedAcl>, at: &Location) -> Result<(), String> {
    let Some(name) = args.get(1) else {
        return Err("'acl' expects an ACL name.".to_string());
    };
    if let Some(c) = invalid_acl_char(name) {
        return Err(format!(
            "character '{c}' is not permitted in acl name '{name}'."
        ));
    }
    let expr = parse_expr(&args[2..], at)
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
    Bin,
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
        "bin" => Method::Bin,
        "bool" | "len" | "dir" | "dom" => {
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
fn parse_expr(words: &[String], at: &Location) -> Result<Expr, String> {
    let Some(fname) = words.first() else {
        return Err("missing fetch method in ACL expression ''".to_string());
    };
    let (fetch, keyword, px, table) = match stick_fetch(fname)? {
        Some((f, k, t)) => (f, k, None, t),
        None => {
            let (f, k, px) = Fetch::parse(fname)?;
            (f, k.to_string(), px, None)
        }
    };
    let px = px.map(|name| ProxyArg {
        name,
        idx: 0,
        at: at.clone(),
    });
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
            Kind::Bin => Method::Bin,
            Kind::Bool => {
                return Ok(Expr {
                    fetch,
                    keyword,
                    patterns: Patterns::Bool,
                    px,
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
        Method::Int if kind == Kind::Int => {
            Patterns::Int(int_patterns(&pats, fetch == Fetch::SslVer)?)
        }
        Method::Bin if kind == Kind::Bin => {
            Patterns::Bin(pats.iter().map(|p| hex(p)).collect::<Result<_, _>>()?)
        }
        Method::Str(how) if matches!(kind, Kind::Str | Kind::Bin) => Patterns::Str {
            how,
            icase,
            pats: pats
                .into_iter()
                .map(|p| if icase { p.to_ascii_lowercase() } else { p })
                .collect(),
        },
        Method::Reg if matches!(kind, Kind::Str | Kind::Bin) => Patterns::Reg(
            pats.iter()
                .map(|p| compile(p, icase))
                .collect::<Result<_, _>>()?,
        ),
        Method::Ip => return refuse("ip"),
        Method::Int => return refuse("int"),
        Method::Str(_) => return refuse("str"),
        Method::Reg => return refuse("reg"),
        Method::Bin => return refuse("bin"),
    };
    Ok(Expr {
        fetch,
        keyword,
        patterns,
        px,
        table,
    })
}

/// A `-m bin` pattern: hex digits, two per byte.
fn hex(p: &str) -> Result<Vec<u8>, String> {
    let bad = || format!("'{p}' is not a valid hex string");
    if !p.len().is_multiple_of(2) {
        return Err("an even number of hex digit is expected".to_string());
    }
    p.as_bytes()
        .chunks(2)
        .map(|c| {
            std::str::from_utf8(c)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
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
/// which apply to the next number. With `dotted` (`req.ssl_ver`, HAProxy's
/// `ver` match) a number is a version `MAJOR[.MINOR]`, `MAJOR << 16 | MINOR`.
fn int_patterns(pats: &[String], dotted: bool) -> Result<Vec<(i64, i64)>, String> {
    let digits = |s: &str| -> Option<i64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let num = |s: &str| -> Option<i64> {
        if !dotted {
            return digits(s);
        }
        let (major, minor) = s.split_once('.').unwrap_or((s, "0"));
        let (major, minor) = (digits(major)?, digits(minor)?);
        (major <= 0xffff && minor <= 0xffff).then_some((major << 16) | minor)
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
pub fn parse_cond(words: &[String], acls: &[NamedAcl], at: &Location) -> Result<Cond, String> {
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
                let expr = parse_expr(&words[i..i + len], at)?;
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
                let exprs = match acls.iter().find(|a| a.name == name) {
                    Some(acl) => acl.exprs.clone(),
                    None => predefined(name, at)?,
                };
                push(
                    &mut suites,
                    Term {
                        neg,
                        name: Some(name.to_string()),
                        exprs,
                    },
                );
                neg = false;
            }
        }
    }
    Ok(Cond { unless, suites })
}

/// HAProxy's predefined ACLs that make sense without HTTP (a declared ACL of the
/// same name wins, as in HAProxy), or the unknown-name error.
fn predefined(name: &str, at: &Location) -> Result<Vec<Expr>, String> {
    let words: &[&str] = match name {
        "TRUE" => &["always_true"],
        "FALSE" => &["always_false"],
        "LOCALHOST" => &["src", "127.0.0.1/8", "::1"],
        _ => return Err(format!("no such ACL : '{name}'")),
    };
    let words: Vec<String> = words.iter().map(|w| (*w).to_string()).collect();
    Ok(vec![parse_expr(&words, at)?])
}

fn push(suites: &mut [Vec<Term>], t: Term) {
    if let Some(last) = suites.last_mut() {
        last.push(t);
    }
}

#[cfg(test)]
mod tests;
