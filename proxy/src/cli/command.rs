//! CLI command parsing: the words of one request → a typed [`Command`].
//!
//! Owns the [`Command`] type, [`parse`] (which picks the command's entry in the
//! table, `table.rs`, and runs its parser) and the syntax of each command's
//! arguments. Pure: it never reads runtime state, so names (proxies, servers) stay
//! strings here and are resolved by `dispatch`. A known command with bad arguments
//! becomes [`Command::Bad`]; its [`Parsed::spec`] still says the level the command
//! needs, so a user-level session is told `Permission denied` before it is told about
//! its syntax (as HAProxy does).

use std::time::Duration;

use crate::config::{CliLevel, MAX_MAXCONN};

use super::frame::Request;
use super::table::{self, Spec};

/// Longest `set timeout cli` accepted (HAProxy's tick arithmetic stops near 24.8 days).
pub const MAX_CLI_TIMEOUT: Duration = Duration::from_secs(24 * 86_400);

/// Output format of `show info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InfoFormat {
    #[default]
    Plain,
    /// `N.Name.1:TAGS:type:value` lines.
    Typed,
    /// One JSON array of `{"field":…,"tags":…,"value":…}` elements.
    Json,
}

/// Which proxy `show stat` is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxySel {
    /// `-1`: every proxy.
    All,
    /// A numeric proxy id (`iid`).
    Id(i64),
    /// A proxy name, or a word that is neither (resolved, or refused, by dispatch).
    Name(String),
}

/// `show stat [IID TYPE SID]`: HAProxy's filter. `types` is the bitmask
/// 1 = frontends, 2 = backends, 4 = servers (`-1` = all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatQuery {
    pub proxy: ProxySel,
    pub types: i64,
    /// Server id, `-1` = all.
    pub sid: i64,
    /// `typed` among the words: HAProxy's typed output instead of CSV.
    pub typed: bool,
    /// `json` among the words: HAProxy's JSON output (it wins over `typed`).
    pub json: bool,
}

impl Default for StatQuery {
    fn default() -> Self {
        Self {
            proxy: ProxySel::All,
            types: -1,
            sid: -1,
            typed: false,
            json: false,
        }
    }
}

/// Argument errors; the text is HAProxy's, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("Expects an integer value.")]
    ExpectsInteger,
    #[error("Invalid timeout value.")]
    InvalidTimeout,
    #[error("'set timeout' only supports 'cli'.")]
    TimeoutOnlyCli,
    // The map texts below are HAProxy 2.6's (map.c), byte for byte; note the first has
    // no final period there either.
    #[error("'add map' expects three parameters (map identifier, key and value) or one parameter (map identifier) and a payload")]
    AddMapArgs,
    #[error("'set map' expects three parameters: map identifier, key and value.")]
    SetMapArgs,
    #[error("This command expects two parameters: map identifier and key.")]
    DelMapArgs,
    #[error("Missing map identifier.")]
    MissingMapId,
    #[error("Missing map identifier and/or key.")]
    GetMapArgs,
    // HAProxy 2.6's activity.c texts.
    #[error("Expects either 'all', 'status', 'tasks', 'memory', 'byaddr' or a max number of output lines.")]
    ShowProfilingArgs,
    #[error("Expects either 'tasks' or 'memory'.")]
    SetProfilingWhat,
    #[error("Expects 'on', 'auto', or 'off'.")]
    SetProfilingTasksMode,
    #[error("Memory profiling not compiled in.")]
    NoMemoryProfiling,
    // The texts below are HAProxy 2.6's (cli.c, proxy.c, server.c). The two
    // "garbage" ones have no newline in HAProxy either (see WEIGHT_* in dispatch).
    #[error("one of 'none', 'number', 'string' is a required argument")]
    SeverityOutputArgs,
    #[error("Integer value expected.")]
    IntegerExpected,
    #[error("Value out of range.")]
    ValueOutOfRange,
    #[error("Require <maxconn>.")]
    MaxconnMissing,
    #[error("maxconn string empty or preceded by garbage")]
    MaxconnGarbageBefore,
    #[error("Trailing garbage in maxconn string")]
    MaxconnTrailing,
    /// `prompt` with an unknown word: HAProxy 3.x answers its usage as an error.
    #[error("{PROMPT_USAGE}")]
    PromptArgs,
    #[error("Missing version number.")]
    MissingVersion,
}

/// `prompt help` (and the error for a bad `prompt` word): HAProxy 3.x's text,
/// without the final newline (the renderer adds it).
pub const PROMPT_USAGE: &str = "Usage: prompt [help | n | i | p | timed]*\n\
Changes the default prompt and interactive mode. Available options:\n  \
help    display this help\n  \
n       set to single-command mode (no prompt, single command)\n  \
i       set to interactive mode only (no prompt, multi-command)\n  \
p       set to prompt+interactive mode (prompt + multi-command)\n  \
timed   toggle displaying the current date in the prompt\n\
Without any argument, toggles between n/i->p, p->n.";

/// `set severity-output`: how messages (not dumps) are tagged with their severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SeverityOutput {
    /// No tag (the default).
    #[default]
    None,
    /// `[3]: ` (the syslog number).
    Number,
    /// `[err]: ` (the syslog name).
    String,
}

/// `prompt n|i|p`: the mode asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptMode {
    /// Non-interactive: close after the current line.
    NonInteractive,
    /// Interactive without a prompt.
    Interactive,
    /// Interactive with the `> ` prompt.
    Prompt,
}

/// `show profiling [all|status|tasks|memory|byaddr|N]*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProfilingQuery {
    pub part: super::render::ProfilingPart,
    /// `byaddr`: shunt sorts by task name instead of call count.
    pub by_name: bool,
    /// A number: at most this many task rows.
    pub max_lines: Option<usize>,
}

/// What `set server B/S ...` asks for. The server is looked up before the operation
/// is checked (HAProxy answers `No such server.` before a bad state word).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerOp {
    /// `state ready|drain|maint`
    State(AdminState),
    /// `state` with a missing or unknown word.
    BadState,
    /// `weight W[%]` (the raw word; empty when missing).
    Weight(String),
    /// `health up|stopping|down`
    Health(ForcedHealth),
    /// `health` with a missing or unknown word.
    BadHealth,
    /// No known operation: HAProxy prints the usage line.
    Usage,
    /// `addr IP [port P]` (the raw words; `port` is `Some("")` when the word
    /// `port` has no value, which HAProxy reports as a bad port).
    Addr { addr: String, port: Option<String> },
    /// `addr` without an address.
    AddrMissing,
    /// `agent up|down`: `Some(up)`, `None` for another word (refused after the
    /// check that the agent is enabled, as HAProxy does).
    Agent(Option<bool>),
    /// `agent-addr IP [port P]` (raw words, as `Addr`).
    AgentAddr { addr: String, port: Option<String> },
    /// `agent-addr` without an address.
    AgentAddrMissing,
    /// `agent-port P` (the raw word).
    AgentPort(String),
    /// `agent-port` without a port.
    AgentPortMissing,
    /// `agent-send STRING` (empty when missing: the agent is then sent nothing).
    AgentSend(String),
    /// `check-addr IP [port P]` (raw words, as `Addr`).
    CheckAddr { addr: String, port: Option<String> },
    /// `check-addr` without an address.
    CheckAddrMissing,
    /// `check-port P` (the raw word).
    CheckPort(String),
    /// `check-port` without a port.
    CheckPortMissing,
}

/// What `set server B/S health` forces (HAProxy's RUNNING, STOPPING, STOPPED).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForcedHealth {
    Up,
    Stopping,
    Down,
}

/// Administrative state set by `set server B/S state` (the server's own type).
pub use crate::lb::AdminState;

/// `show|clear|set table [NAME [ARGS...]]`: the words as given. Their
/// meaning depends on the table (its key type, what it stores), so they
/// are checked against it when the command runs (`cli::tables`), in
/// HAProxy's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableReq {
    /// `None`: no table named (`show table` lists them all).
    pub table: Option<String>,
    pub args: Vec<String>,
}

/// `show|clear|set table ...`.
pub(super) fn parse_table_req(a: Args<'_>) -> TableReq {
    TableReq {
        table: a.words.first().map(|s| s.to_string()),
        args: a.words.iter().skip(1).map(|s| s.to_string()).collect(),
    }
}

/// One parsed CLI command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `show table [NAME [key K | data.T OP V ...]]`
    ShowTable(TableReq),
    /// `clear table NAME [key K | data.T OP V ...]`
    ClearTable(TableReq),
    /// `set table NAME key K [data.T V]...`
    SetTable(TableReq),
    /// `help [WORDS...]`
    Help(Vec<String>),
    /// `prompt`: toggle interactive mode.
    Prompt,
    /// `quit`
    Quit,
    /// `operator` / `user`: lower this session's level.
    SetLevel(CliLevel),
    /// `show cli level`
    ShowCliLevel,
    /// `show info [typed]`
    ShowInfo(InfoFormat),
    /// `show stat [IID TYPE SID]`
    ShowStat(StatQuery),
    /// `set timeout cli DELAY`
    SetTimeoutCli(Duration),
    /// `show map`: the list of maps.
    ShowMaps,
    /// `show map [@VER] MAP`: one map's entries (of version VER, default the current).
    ShowMap { ver: Option<u32>, map: String },
    /// `get map MAP VALUE`: look VALUE up as a flow would.
    GetMap { map: String, value: String },
    /// `add map [@VER] MAP KEY VALUE`
    AddMap {
        ver: Option<u32>,
        map: String,
        key: String,
        value: String,
    },
    /// `add map [@VER] MAP <<` and its payload of `key value` lines.
    AddMapPayload {
        ver: Option<u32>,
        map: String,
        payload: String,
    },
    /// `set map MAP KEY|#REF VALUE`
    SetMap {
        map: String,
        key: String,
        value: String,
    },
    /// `del map MAP KEY|#REF`
    DelMap { map: String, key: String },
    /// `clear map [@VER] MAP`
    ClearMap { ver: Option<u32>, map: String },
    /// `get weight B/S` (the raw `B/S` word, empty when missing).
    GetWeight(String),
    /// `set weight B/S W[%]`
    SetWeight { target: String, weight: String },
    /// `set server B/S OP...`
    SetServer { target: String, op: ServerOp },
    /// `enable server B/S`
    EnableServer(String),
    /// `disable server B/S`
    DisableServer(String),
    /// `show servers state [BACKEND]`
    ShowServersState(Option<String>),
    /// `show servers conn [BACKEND]`
    ShowServersConn(Option<String>),
    /// `show backend`
    ShowBackend,
    /// `clear counters [all]`
    ClearCounters { all: bool },
    /// `show sess`: one line per live flow.
    ShowSess,
    /// `shutdown session ID` (the raw id word, empty when missing).
    ShutdownSession(String),
    /// `shutdown sessions server B/S` (the raw `B/S` word, empty when missing).
    ShutdownSessionsServer(String),
    /// A known command with bad arguments (refused with the level its entry needs:
    /// a user-level session is told `Permission denied` before it is told about its
    /// syntax, as HAProxy does).
    Bad(ParseError),
    /// No command matches these words.
    Unknown(Vec<String>),
    /// A blank line: nothing to run.
    Empty,
    /// `show activity`: per-thread scheduler counters.
    ShowActivity,
    /// `show profiling [...]`
    ShowProfiling(ProfilingQuery),
    /// `set profiling tasks on|auto|off`
    SetProfilingTasks(crate::scheduler::ProfilingMode),
    /// `show version`
    ShowVersion,
    /// `set severity-output none|number|string`
    SetSeverityOutput(SeverityOutput),
    /// `prompt` with words: `n|i|p` sets the mode, `timed` toggles the time in the
    /// prompt (and implies `p` unless a mode is given).
    PromptSet {
        mode: Option<PromptMode>,
        timed: bool,
    },
    /// `prompt help`
    PromptHelp,
    /// `set maxconn server B/S N` (the value parsed; its error is reported after
    /// the server lookup, as HAProxy does).
    SetMaxconnServer {
        target: String,
        value: Result<usize, ParseError>,
    },
    /// `set maxconn frontend F N` (the value's error comes after the lookup).
    SetMaxconnFrontend {
        frontend: String,
        value: Result<usize, ParseError>,
    },
    /// `set maxconn global N`: HAProxy's `atoi` of the word (checked against the
    /// configured limit by dispatch; `<= 0` means the configured limit).
    SetMaxconnGlobal(i64),
    /// `prepare map MAP`: reserve a new version (the raw map word, empty when missing).
    PrepareMap(String),
    /// `commit map @VER MAP`: make version VER the live one.
    CommitMap { ver: u32, map: String },
    /// `enable health B/S` (the raw `B/S` word, empty when missing).
    EnableHealth(String),
    /// `disable health B/S`
    DisableHealth(String),
    /// `enable agent B/S`
    EnableAgent(String),
    /// `disable agent B/S`
    DisableAgent(String),
}

/// The words after a command's own words, and the request's payload: what a
/// [`Spec::parse`] reads.
#[derive(Debug, Clone, Copy)]
pub struct Args<'a> {
    pub words: &'a [&'a str],
    /// The `<<` payload, if the request has one.
    pub payload: Option<&'a str>,
}

/// One request read against the command table: the command and the entry it came
/// from, which says who may run it, whether it is heavy and where it runs.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// The entry whose words matched; `None` for a blank line or unknown words.
    pub spec: Option<&'static Spec>,
    pub cmd: Command,
}

impl Parsed {
    /// The level a session needs to run this: the entry's. A blank line and unknown
    /// words (answered with the list of commands) need none; a command built without
    /// its entry has nothing saying who may run it, and needs admin.
    pub fn level(&self) -> CliLevel {
        match (self.spec, &self.cmd) {
            (Some(s), cmd) => s.level.of(cmd),
            (None, Command::Empty | Command::Unknown(_)) => CliLevel::User,
            (None, _) => CliLevel::Admin,
        }
    }

    /// Whether running this is heavy work in a process where the kernel handoff
    /// is loaded (`kernel_loaded`) or not. A command refused for its arguments
    /// does no work.
    pub fn heavy(&self, kernel_loaded: bool) -> bool {
        match self.spec {
            Some(s) if !matches!(self.cmd, Command::Bad(_)) => s.heavy.of(&self.cmd, kernel_loaded),
            _ => false,
        }
    }

    /// Whether the workers answer it (`dispatch::dispatch_workers`). A command
    /// refused for its arguments is answered by `dispatch`.
    pub fn on_workers(&self) -> bool {
        match self.spec {
            Some(s) if !matches!(self.cmd, Command::Bad(_)) => s.on_workers,
            _ => false,
        }
    }
}

/// Parse one request. Never fails: unknown input becomes [`Command::Unknown`].
/// The entry is the one whose words are the longest prefix of the request's.
pub fn parse(req: &Request) -> Parsed {
    let w: Vec<&str> = req.words.iter().map(String::as_str).collect();
    if w.is_empty() {
        return Parsed {
            spec: None,
            cmd: Command::Empty,
        };
    }
    match table::find(&w) {
        Some(spec) => Parsed {
            spec: Some(spec),
            cmd: (spec.parse)(Args {
                words: &w[spec.words.len()..],
                payload: req.payload.as_deref(),
            }),
        },
        None => Parsed {
            spec: None,
            cmd: Command::Unknown(req.words.clone()),
        },
    }
}

/// `show info [typed|json]`.
pub(super) fn parse_show_info(a: Args<'_>) -> Command {
    Command::ShowInfo(if a.words.contains(&"json") {
        InfoFormat::Json
    } else if a.words.contains(&"typed") {
        InfoFormat::Typed
    } else {
        InfoFormat::Plain
    })
}

/// `show map` alone lists the maps; with words, `[@VER] MAP` dumps one.
pub(super) fn parse_show_map(a: Args<'_>) -> Command {
    if a.words.is_empty() {
        return Command::ShowMaps;
    }
    let (ver, rest) = split_version(a.words);
    Command::ShowMap {
        ver,
        map: first(rest),
    }
}

/// `get map MAP VALUE`.
pub(super) fn parse_get_map(a: Args<'_>) -> Command {
    match a.words {
        [map, value, ..] => Command::GetMap {
            map: map.to_string(),
            value: value.to_string(),
        },
        _ => Command::Bad(ParseError::GetMapArgs),
    }
}

/// `add map [@VER] MAP KEY VALUE`, or `add map [@VER] MAP` with a payload.
pub(super) fn parse_add_map(a: Args<'_>) -> Command {
    match (split_version(a.words), a.payload) {
        ((ver, [map, ..]), Some(payload)) => Command::AddMapPayload {
            ver,
            map: map.to_string(),
            payload: payload.to_string(),
        },
        ((ver, [map, key, value, ..]), None) => Command::AddMap {
            ver,
            map: map.to_string(),
            key: key.to_string(),
            value: value.to_string(),
        },
        _ => Command::Bad(ParseError::AddMapArgs),
    }
}

/// `set map MAP KEY|#REF VALUE`.
pub(super) fn parse_set_map(a: Args<'_>) -> Command {
    match a.words {
        [map, key, value, ..] => Command::SetMap {
            map: map.to_string(),
            key: key.to_string(),
            value: value.to_string(),
        },
        _ => Command::Bad(ParseError::SetMapArgs),
    }
}

/// `del map MAP KEY|#REF`.
pub(super) fn parse_del_map(a: Args<'_>) -> Command {
    match a.words {
        [map, key, ..] => Command::DelMap {
            map: map.to_string(),
            key: key.to_string(),
        },
        _ => Command::Bad(ParseError::DelMapArgs),
    }
}

/// `clear map [@VER] MAP`.
pub(super) fn parse_clear_map(a: Args<'_>) -> Command {
    match split_version(a.words) {
        (ver, [map, ..]) => Command::ClearMap {
            ver,
            map: map.to_string(),
        },
        _ => Command::Bad(ParseError::MissingMapId),
    }
}

/// `commit map @VER MAP`.
pub(super) fn parse_commit_map(a: Args<'_>) -> Command {
    match split_version(a.words) {
        (Some(ver), [map, ..]) => Command::CommitMap {
            ver,
            map: map.to_string(),
        },
        (Some(_), []) => Command::Bad(ParseError::MissingMapId),
        (None, _) => Command::Bad(ParseError::MissingVersion),
    }
}

/// `set timeout cli DELAY` (HAProxy knows no other timeout here).
pub(super) fn parse_set_timeout(a: Args<'_>) -> Command {
    match a.words {
        ["cli", delay, ..] => match parse_delay_secs(delay) {
            Ok(d) => Command::SetTimeoutCli(d),
            Err(err) => Command::Bad(err),
        },
        ["cli"] => Command::Bad(ParseError::ExpectsInteger),
        _ => Command::Bad(ParseError::TimeoutOnlyCli),
    }
}

/// `show profiling [all|status|tasks|memory|byaddr|N]*`.
pub(super) fn parse_show_profiling(a: Args<'_>) -> Command {
    match parse_profiling_query(a.words) {
        Ok(q) => Command::ShowProfiling(q),
        Err(err) => Command::Bad(err),
    }
}

/// `set profiling tasks on|auto|off`.
pub(super) fn parse_set_profiling(a: Args<'_>) -> Command {
    match parse_profiling_mode(a.words) {
        Ok(mode) => Command::SetProfilingTasks(mode),
        Err(err) => Command::Bad(err),
    }
}

/// `set severity-output none|number|string`.
pub(super) fn parse_severity_output(a: Args<'_>) -> Command {
    match a.words.first().copied() {
        Some("none") => Command::SetSeverityOutput(SeverityOutput::None),
        Some("number") => Command::SetSeverityOutput(SeverityOutput::Number),
        Some("string") => Command::SetSeverityOutput(SeverityOutput::String),
        _ => Command::Bad(ParseError::SeverityOutputArgs),
    }
}

/// `set maxconn server B/S N` (the value's error is reported after the lookup).
pub(super) fn parse_maxconn_server(a: Args<'_>) -> Command {
    Command::SetMaxconnServer {
        target: first(a.words),
        value: parse_server_maxconn(a.words.get(1).copied().unwrap_or("")),
    }
}

/// `set maxconn frontend F N`: HAProxy's `atoi`, negative refused.
pub(super) fn parse_maxconn_frontend(a: Args<'_>) -> Command {
    Command::SetMaxconnFrontend {
        frontend: first(a.words),
        value: match a.words.get(1) {
            None => Err(ParseError::IntegerExpected),
            Some(w) => usize::try_from(atoi(w))
                .map(|n| n.min(MAX_MAXCONN))
                .map_err(|_| ParseError::ValueOutOfRange),
        },
    }
}

/// `set maxconn global N`.
pub(super) fn parse_maxconn_global(a: Args<'_>) -> Command {
    match a.words.first() {
        Some(v) => Command::SetMaxconnGlobal(atoi(v)),
        None => Command::Bad(ParseError::ExpectsInteger),
    }
}

/// `show profiling` arguments, HAProxy's way: each word selects a part, the sort or
/// a row count; the last part named wins.
fn parse_profiling_query(args: &[&str]) -> Result<ProfilingQuery, ParseError> {
    use super::render::ProfilingPart;
    let mut q = ProfilingQuery::default();
    for a in args {
        match *a {
            "all" => q.part = ProfilingPart::All,
            "status" => q.part = ProfilingPart::Status,
            "tasks" => q.part = ProfilingPart::Tasks,
            "memory" => q.part = ProfilingPart::Memory,
            "byaddr" => q.by_name = true,
            w if w.starts_with(|c: char| c.is_ascii_digit()) => {
                // atoi: 0 means "no limit", as in HAProxy.
                let n = usize::try_from(atoi(w)).unwrap_or(0);
                q.max_lines = (n > 0).then_some(n);
            }
            _ => return Err(ParseError::ShowProfilingArgs),
        }
    }
    Ok(q)
}

/// `set profiling tasks on|auto|off` (`memory` is not compiled in, as in builds
/// without USE_MEMORY_PROFILING).
fn parse_profiling_mode(args: &[&str]) -> Result<crate::scheduler::ProfilingMode, ParseError> {
    use crate::scheduler::ProfilingMode;
    match args {
        ["memory", ..] => Err(ParseError::NoMemoryProfiling),
        ["tasks", mode, ..] => match *mode {
            "on" => Ok(ProfilingMode::On),
            "auto" => Ok(ProfilingMode::Auto),
            "off" => Ok(ProfilingMode::Off),
            _ => Err(ParseError::SetProfilingTasksMode),
        },
        ["tasks"] => Err(ParseError::SetProfilingTasksMode),
        _ => Err(ParseError::SetProfilingWhat),
    }
}

/// `prompt [help | n | i | p | timed]*`, read word by word as HAProxy 3.x does:
/// the last of `n|i|p` wins; `help` or an unknown word stops the reading.
pub(super) fn parse_prompt(words: &[&str]) -> Command {
    if words.is_empty() {
        return Command::Prompt;
    }
    let mut mode = None;
    let mut timed = false;
    for w in words {
        match *w {
            "n" => mode = Some(PromptMode::NonInteractive),
            "i" => mode = Some(PromptMode::Interactive),
            "p" => mode = Some(PromptMode::Prompt),
            "timed" => timed = true,
            "help" => return Command::PromptHelp,
            _ => return Command::Bad(ParseError::PromptArgs),
        }
    }
    Command::PromptSet { mode, timed }
}

/// The value of `set maxconn server`: HAProxy's `strtol` checks. A negative limit
/// never fills in HAProxy, so it is read as 0 (unlimited); large ones are clamped
/// to [`MAX_MAXCONN`], the configuration's bound.
fn parse_server_maxconn(word: &str) -> Result<usize, ParseError> {
    if word.is_empty() {
        return Err(ParseError::MaxconnMissing);
    }
    let n = split_number(word, true);
    if n.digits.is_empty() {
        return Err(ParseError::MaxconnGarbageBefore);
    }
    if !n.rest.is_empty() {
        return Err(ParseError::MaxconnTrailing);
    }
    if n.negative {
        return Ok(0);
    }
    let v = n.digits.bytes().fold(0usize, |v, b| {
        v.saturating_mul(10).saturating_add(usize::from(b - b'0'))
    });
    Ok(v.min(MAX_MAXCONN))
}

/// An optional leading `@VER` word (HAProxy's map version) and the words after it.
fn split_version<'a, 'b>(words: &'a [&'b str]) -> (Option<u32>, &'a [&'b str]) {
    match words.split_first() {
        Some((w, rest)) if w.starts_with('@') => (Some(crate::maps::parse_version(&w[1..])), rest),
        _ => (None, words),
    }
}

/// The first argument word, or an empty string when there is none.
pub(super) fn first(rest: &[&str]) -> String {
    rest.first().map_or_else(String::new, |w| w.to_string())
}

/// The operation words after `set server B/S`.
pub(super) fn parse_server_op(words: &[&str]) -> ServerOp {
    match words {
        ["state", w, ..] => match *w {
            "ready" => ServerOp::State(AdminState::Ready),
            "drain" => ServerOp::State(AdminState::Drain),
            "maint" => ServerOp::State(AdminState::Maint),
            _ => ServerOp::BadState,
        },
        ["state"] => ServerOp::BadState,
        ["weight", rest @ ..] => ServerOp::Weight(first(rest)),
        ["health", w, ..] => match *w {
            "up" => ServerOp::Health(ForcedHealth::Up),
            "stopping" => ServerOp::Health(ForcedHealth::Stopping),
            "down" => ServerOp::Health(ForcedHealth::Down),
            _ => ServerOp::BadHealth,
        },
        ["health"] => ServerOp::BadHealth,
        ["addr", addr, rest @ ..] => ServerOp::Addr {
            addr: addr.to_string(),
            port: match rest {
                ["port", rest @ ..] => Some(first(rest)),
                _ => None,
            },
        },
        ["addr"] => ServerOp::AddrMissing,
        ["agent", rest @ ..] => ServerOp::Agent(match rest.first() {
            Some(&"up") => Some(true),
            Some(&"down") => Some(false),
            _ => None,
        }),
        ["agent-addr", addr, rest @ ..] if !addr.is_empty() => ServerOp::AgentAddr {
            addr: addr.to_string(),
            port: port_words(rest),
        },
        ["agent-addr", ..] => ServerOp::AgentAddrMissing,
        ["agent-port", p, ..] if !p.is_empty() => ServerOp::AgentPort(p.to_string()),
        ["agent-port", ..] => ServerOp::AgentPortMissing,
        ["agent-send", rest @ ..] => ServerOp::AgentSend(first(rest)),
        ["check-addr", addr, rest @ ..] if !addr.is_empty() => ServerOp::CheckAddr {
            addr: addr.to_string(),
            port: port_words(rest),
        },
        ["check-addr", ..] => ServerOp::CheckAddrMissing,
        ["check-port", p, ..] if !p.is_empty() => ServerOp::CheckPort(p.to_string()),
        ["check-port", ..] => ServerOp::CheckPortMissing,
        _ => ServerOp::Usage,
    }
}

/// `port P` after an address: `Some(P)` (`Some("")` when the word `port` has no
/// value, which HAProxy reports as a bad port).
fn port_words(rest: &[&str]) -> Option<String> {
    match rest {
        ["port", rest @ ..] => Some(first(rest)),
        _ => None,
    }
}

/// `show stat` arguments as HAProxy reads them: the filter applies only when three
/// positional words are present; anything else (`typed`, `json`, ...) is a format flag.
pub(super) fn parse_stat_query(args: &[&str]) -> StatQuery {
    let typed = args.contains(&"typed");
    let json = args.contains(&"json");
    let [px, ty, sid, ..] = args else {
        return StatQuery {
            typed,
            json,
            ..StatQuery::default()
        };
    };
    let proxy = match px.parse::<i64>() {
        Ok(-1) => ProxySel::All,
        Ok(n) => ProxySel::Id(n),
        Err(_) => ProxySel::Name(px.to_string()),
    };
    StatQuery {
        proxy,
        types: atoi(ty),
        sid: atoi(sid),
        typed,
        json,
    }
}

/// C `atoi`: leading sign and digits, anything else stops; no digits gives 0.
fn atoi(s: &str) -> i64 {
    let n = split_number(s, false);
    let v = n.digits.bytes().fold(0i64, |v, b| {
        v.saturating_mul(10).saturating_add(i64::from(b - b'0'))
    });
    if n.negative {
        -v
    } else {
        v
    }
}

/// A number word cut the way C's `strtol`/`atoi` read it: an optional sign, the
/// decimal digits, and what follows them.
pub(super) struct NumberWord<'a> {
    pub negative: bool,
    pub digits: &'a str,
    pub rest: &'a str,
}

/// Cut `s` into [`NumberWord`]; `skip_blanks`: leading white space first, as
/// `strtol` does (HAProxy's `atoi` call sites never see any).
pub(super) fn split_number(s: &str, skip_blanks: bool) -> NumberWord<'_> {
    let body = if skip_blanks {
        s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c'])
    } else {
        s
    };
    let (negative, unsigned) = match body.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, body.strip_prefix('+').unwrap_or(body)),
    };
    let n = unsigned.bytes().take_while(u8::is_ascii_digit).count();
    let (digits, rest) = unsigned.split_at(n);
    NumberWord {
        negative,
        digits,
        rest,
    }
}

/// A delay in seconds by default, with HAProxy's unit suffixes (`us ms s m h d`).
/// Must round to at least one second.
fn parse_delay_secs(s: &str) -> Result<Duration, ParseError> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| ParseError::InvalidTimeout)?;
    let ms = match unit {
        "us" => n / 1_000_000 * 1000,
        "ms" => n,
        "" | "s" => n.saturating_mul(1000),
        "m" => n.saturating_mul(60_000),
        "h" => n.saturating_mul(3_600_000),
        "d" => n.saturating_mul(86_400_000),
        _ => return Err(ParseError::InvalidTimeout),
    };
    if ms < 1000 {
        return Err(ParseError::InvalidTimeout);
    }
    Ok(Duration::from_millis(ms).min(MAX_CLI_TIMEOUT))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(line: &str) -> Parsed {
        let reqs = super::super::frame::split_line(line.as_bytes());
        parse(reqs.first().unwrap_or(&Request::default()))
    }

    fn p(line: &str) -> Command {
        parsed(line).cmd
    }

    /// The level its table entry says `line` needs.
    fn level(line: &str) -> CliLevel {
        parsed(line).level()
    }

    #[test]
    fn known_commands() {
        assert_eq!(p("show info"), Command::ShowInfo(InfoFormat::Plain));
        assert_eq!(p("show info typed"), Command::ShowInfo(InfoFormat::Typed));
        assert_eq!(p("show stat"), Command::ShowStat(StatQuery::default()));
        assert_eq!(p("prompt"), Command::Prompt);
        assert_eq!(p("quit"), Command::Quit);
        assert_eq!(p("user"), Command::SetLevel(CliLevel::User));
        assert_eq!(level("operator"), CliLevel::Operator);
        assert_eq!(p("show cli level"), Command::ShowCliLevel);
        assert_eq!(p(""), Command::Empty);
        assert_eq!(p("admin"), Command::Unknown(vec!["admin".to_string()]));
    }

    #[test]
    fn levels_come_from_the_table_and_fail_closed_without_it() {
        assert_eq!(level(""), CliLevel::User);
        assert_eq!(level("no such command"), CliLevel::User);
        assert_eq!(level("set server b/s1 state maint"), CliLevel::Admin);
        // A command built by hand, without its entry, is not open to everyone.
        let orphan = Parsed {
            spec: None,
            cmd: Command::DisableServer("b/s1".into()),
        };
        assert_eq!(orphan.level(), CliLevel::Admin);
        assert!(!orphan.heavy(true) && !orphan.on_workers());
    }

    #[test]
    fn stat_filter_is_positional_like_haproxy() {
        assert_eq!(
            p("show stat -1 2 -1"),
            Command::ShowStat(StatQuery {
                proxy: ProxySel::All,
                types: 2,
                sid: -1,
                typed: false,
                json: false,
            })
        );
        assert_eq!(
            p("show stat b 4 -1 typed"),
            Command::ShowStat(StatQuery {
                proxy: ProxySel::Name("b".into()),
                types: 4,
                sid: -1,
                typed: true,
                json: false,
            })
        );
        // `typed` in first position is read as a proxy name (HAProxy then says "No such proxy.").
        assert_eq!(
            p("show stat typed -1 2 -1"),
            Command::ShowStat(StatQuery {
                proxy: ProxySel::Name("typed".into()),
                types: -1,
                sid: 2,
                typed: true,
                json: false,
            })
        );
        assert_eq!(
            p("show stat typed"),
            Command::ShowStat(StatQuery {
                typed: true,
                ..StatQuery::default()
            })
        );
        assert_eq!(
            p("show stat json"),
            Command::ShowStat(StatQuery {
                json: true,
                ..StatQuery::default()
            })
        );
        assert_eq!(
            p("show stat 3 6 1"),
            Command::ShowStat(StatQuery {
                proxy: ProxySel::Id(3),
                types: 6,
                sid: 1,
                typed: false,
                json: false,
            })
        );
    }

    #[test]
    fn set_timeout_cli() {
        assert_eq!(
            p("set timeout cli 60"),
            Command::SetTimeoutCli(Duration::from_secs(60))
        );
        assert_eq!(
            p("set timeout cli 2m"),
            Command::SetTimeoutCli(Duration::from_secs(120))
        );
        assert_eq!(
            p("set timeout cli 1500ms"),
            Command::SetTimeoutCli(Duration::from_millis(1500))
        );
        assert_eq!(
            p("set timeout cli 100d"),
            Command::SetTimeoutCli(MAX_CLI_TIMEOUT)
        );
        for bad in [
            "set timeout cli 0",
            "set timeout cli 10x",
            "set timeout cli 500ms",
            "set timeout cli -1",
        ] {
            assert!(
                matches!(p(bad), Command::Bad(ParseError::InvalidTimeout)),
                "{bad}"
            );
        }
        assert!(matches!(
            p("set timeout cli"),
            Command::Bad(ParseError::ExpectsInteger)
        ));
        assert!(matches!(
            p("set timeout server 5"),
            Command::Bad(ParseError::TimeoutOnlyCli)
        ));
    }

    #[test]
    fn server_management_commands() {
        let op = |line: &str| match p(line) {
            Command::SetServer { op, .. } => op,
            other => panic!("{line}: {other:?}"),
        };
        assert_eq!(
            op("set server b/s1 health stopping"),
            ServerOp::Health(ForcedHealth::Stopping)
        );
        assert_eq!(
            op("set server b/s1 health down"),
            ServerOp::Health(ForcedHealth::Down)
        );
        assert_eq!(op("set server b/s1 health"), ServerOp::BadHealth);
        assert_eq!(op("set server b/s1 agent up"), ServerOp::Agent(Some(true)));
        assert_eq!(
            op("set server b/s1 agent down"),
            ServerOp::Agent(Some(false))
        );
        assert_eq!(op("set server b/s1 agent maybe"), ServerOp::Agent(None));
        assert_eq!(op("set server b/s1 agent"), ServerOp::Agent(None));
        assert_eq!(
            op("set server b/s1 agent-addr 10.0.0.1 port 5555"),
            ServerOp::AgentAddr {
                addr: "10.0.0.1".into(),
                port: Some("5555".into())
            }
        );
        assert_eq!(op("set server b/s1 agent-addr"), ServerOp::AgentAddrMissing);
        assert_eq!(
            op("set server b/s1 agent-port 1"),
            ServerOp::AgentPort("1".into())
        );
        assert_eq!(op("set server b/s1 agent-port"), ServerOp::AgentPortMissing);
        assert_eq!(
            op("set server b/s1 agent-send"),
            ServerOp::AgentSend(String::new())
        );
        assert_eq!(
            op("set server b/s1 check-addr ::1"),
            ServerOp::CheckAddr {
                addr: "::1".into(),
                port: None
            }
        );
        assert_eq!(op("set server b/s1 check-port"), ServerOp::CheckPortMissing);
        assert_eq!(
            op("set server b/s1 check-port 80"),
            ServerOp::CheckPort("80".into())
        );
        assert_eq!(op("set server b/s1 maxconn 10"), ServerOp::Usage);
        for (line, cmd) in [
            ("enable health b/s1", Command::EnableHealth("b/s1".into())),
            ("disable health b/s1", Command::DisableHealth("b/s1".into())),
            ("enable agent b/s1", Command::EnableAgent("b/s1".into())),
            ("disable agent", Command::DisableAgent(String::new())),
        ] {
            assert_eq!(p(line), cmd);
            assert_eq!(level(line), CliLevel::Admin, "{line}");
        }
    }

    #[test]
    fn profiling_commands() {
        use crate::cli::render::ProfilingPart;
        use crate::scheduler::ProfilingMode;
        assert_eq!(p("show activity"), Command::ShowActivity);
        assert_eq!(p("show activity 0"), Command::ShowActivity);
        assert_eq!(
            p("show profiling"),
            Command::ShowProfiling(ProfilingQuery::default())
        );
        assert_eq!(
            p("show profiling tasks 5 byaddr"),
            Command::ShowProfiling(ProfilingQuery {
                part: ProfilingPart::Tasks,
                by_name: true,
                max_lines: Some(5)
            })
        );
        assert_eq!(
            p("show profiling bogus"),
            Command::Bad(ParseError::ShowProfilingArgs)
        );
        assert_eq!(level("show profiling bogus"), CliLevel::Admin);
        for (line, mode) in [
            ("set profiling tasks on", ProfilingMode::On),
            ("set profiling tasks auto", ProfilingMode::Auto),
            ("set profiling tasks off", ProfilingMode::Off),
        ] {
            assert_eq!(p(line), Command::SetProfilingTasks(mode));
        }
        for (line, err) in [
            (
                "set profiling tasks maybe",
                ParseError::SetProfilingTasksMode,
            ),
            ("set profiling cpu on", ParseError::SetProfilingWhat),
            ("set profiling memory on", ParseError::NoMemoryProfiling),
        ] {
            assert_eq!(p(line), Command::Bad(err), "{line}");
            assert_eq!(level(line), CliLevel::Admin, "{line}");
        }
        assert_eq!(level("show profiling"), CliLevel::Admin);
        assert_eq!(level("set profiling tasks on"), CliLevel::Admin);
        assert_eq!(level("show activity"), CliLevel::User);
    }
}
