//! Section and keyword parsing: configuration lines in, drafts out.
//!
//! Owns the keyword table type ([`Keyword`]: the words, the sections it is
//! allowed in, a parse fn; looked up the way a CLI command table is), the
//! section state machine (`global`, `defaults`, `frontend`, `backend`,
//! `listen`, `ring`) that hands each line to its section's table, and the
//! helpers keyword parsers share. Each submodule owns one family of keywords
//! and its table. The result is drafts ([`GlobalDraft`], [`ProxyDraft`]
//! holding `ServerDraft`s) plus located errors and warnings; names across proxies
//! are never resolved here (that is `validate`'s job). One bad line yields at
//! most one error and parsing goes on, so every error is reported.
//!
//! Invariants: a proxy draft is a copy of the defaults section in force when
//! its header was read (the last one, or the one named by `from`); a defaults
//! section never holds binds, servers, `acl`s, `use_backend` or `tcp-request
//! connection` rules.

mod bind;
mod global;
mod log;
mod proxy;
mod server;
mod stats;
mod stats_socket;
mod stick;
mod tcp_check;
mod tcp_request;

#[cfg(test)]
mod tests;

use std::str::FromStr;
use std::time::Duration;

use super::lexer::split_line;
use super::model::*;
use super::units::parse_time;
use super::ConfigError;
// The submodules reach these as `super::model` and so on.
use super::{acl, addr, model, units};

pub use global::GlobalDraft;
#[cfg(test)]
pub use proxy::parse_use_backend;
pub use proxy::{Kind, ProxyDraft, UseBackendDraft};
pub use server::ServerDraft;

/// Upper bound for any `maxconn`: far above what one host can hold, low
/// enough that per-connection tables sized from it stay allocatable.
pub const MAX_MAXCONN: usize = 1 << 22;

// ---------- keyword tables ----------

/// The places a keyword may appear: sections, and the option lists that
/// follow some keywords (`server NAME ADDR ...`, `stats socket PATH ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sections(u16);

impl Sections {
    pub const GLOBAL: Self = Self(1);
    pub const DEFAULTS: Self = Self(1 << 1);
    pub const FRONTEND: Self = Self(1 << 2);
    pub const BACKEND: Self = Self(1 << 3);
    pub const RING: Self = Self(1 << 4);
    /// The keywords after `server NAME ADDR`.
    pub const SERVER: Self = Self(1 << 5);
    /// The keywords after `default-server`.
    pub const DEFAULT_SERVER: Self = Self(1 << 6);
    /// The keywords after `stats socket PATH`.
    pub const STATS_SOCKET: Self = Self(1 << 7);
    /// The keywords after `tcp-check connect`.
    pub const TCP_CHECK_CONNECT: Self = Self(1 << 8);
    /// The keywords after `tcp-check expect`.
    pub const TCP_CHECK_EXPECT: Self = Self(1 << 9);
    /// The keywords after `bind ADDR`.
    pub const BIND: Self = Self(1 << 10);
    /// Every kind of proxy section (a listen section is a frontend and a backend).
    pub const PROXIES: Self = Self::DEFAULTS.or(Self::FRONTEND).or(Self::BACKEND);

    pub const fn or(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

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
    /// The line began with `no` (HAProxy's KWM_NO; only `option` entries are
    /// reached that way).
    pub negate: bool,
}

impl<'a> Line<'a> {
    pub fn new(args: &'a [String], loc: &'a Location, warnings: &'a mut Vec<String>) -> Self {
        Self {
            args,
            loc,
            warnings,
            negate: false,
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

// ---------- section dispatch ----------

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

/// A section header: its keyword and what starts the section.
struct Header {
    name: &'static str,
    start: fn(&mut Parser<'_>, &[String], &Location),
}

/// The sections shunt parses, in the order "did you mean" hints consider them.
#[rustfmt::skip]
const HEADERS: &[Header] = &[
    Header { name: "global",   start: |p, args, loc| p.start_global(args, loc) },
    Header { name: "defaults", start: |p, args, loc| p.start_defaults(args, loc) },
    Header { name: "frontend", start: |p, args, loc| p.start_proxy(Kind::Frontend, args, loc) },
    Header { name: "backend",  start: |p, args, loc| p.start_proxy(Kind::Backend, args, loc) },
    Header { name: "listen",   start: |p, args, loc| p.start_proxy(Kind::Listen, args, loc) },
    Header { name: "ring",     start: |p, args, loc| p.start_ring(args, loc) },
];

/// The section keywords, which "did you mean" hints offer after a table's own.
fn section_names() -> impl Iterator<Item = &'static str> {
    HEADERS.iter().map(|h| h.name)
}

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
        if let Some(h) = HEADERS.iter().find(|h| h.name == kw) {
            return (h.start)(self, args, loc);
        }
        match kw {
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
                    let mut l = Line::new(args, loc, &mut self.warnings);
                    if let Err(msg) = proxy::line(&mut self.defaults[i], &mut l) {
                        self.error(loc, msg);
                    }
                }
                Section::Proxy(i) => {
                    let mut l = Line::new(args, loc, &mut self.warnings);
                    if let Err(msg) = proxy::line(&mut self.proxies[i], &mut l) {
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

    fn start_global(&mut self, args: &[String], loc: &Location) {
        self.section = Section::Global;
        if let Err(msg) = no_extra(args, 1, "global") {
            self.error(loc, msg);
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

// ---------- helpers keyword parsers share ----------

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

/// The one wording of a keyword shunt accepts but does nothing with (a TLS or
/// HTTP setting of a shared section): `parsing [FILE:LINE] : 'KEYWORD'
/// ignored: shunt does not WHAT.` `what` says what shunt does not do.
fn not_applicable(loc: &Location, kw: &str, what: &str) -> String {
    format!("parsing [{loc}] : '{kw}' ignored: shunt does not {what}.")
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
