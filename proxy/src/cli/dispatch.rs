//! The one place a CLI command takes effect.
//!
//! `dispatch` (and `dispatch_workers`, for the commands the workers answer) checks the
//! session's level against the command's table entry, applies the command (to the
//! connection's [`Session`] or to the runtime state behind [`Ctx`]), and returns the
//! answer body. Parsing (`command.rs`) and formatting (`render.rs`) stay out of here;
//! nothing else in the CLI changes state. Answers are HAProxy's exact strings.
//!
//! Server commands (`set weight`, `set server`, `enable|disable server`) change the
//! [`ServerRt`] through its one `apply` (a `lb::Change`), which keeps the drain
//! weight and the time of the last change itself; admin state changes go through
//! `checks::set_admin`, over `checks::transition`, the one place that rebalances and
//! applies `shutdown-sessions` (the server-state file uses it too).
//!
//! `set server B/S health|agent` force a state through `checks::transition::apply`
//! (the same path as the checks: log, rebalance, `on-marked-down
//! shutdown-sessions`); `set weight` goes there too;
//! `check-*`/`agent-*` and `enable|disable health|agent` change the server's probe
//! targets and check flags, read by the check tasks at their next probe.
//!
//! Answers are either dumps ([`Output::Text`]: `show stat`, `show map`, ...) or
//! messages ([`Output::Msg`], HAProxy's `cli_msg`/`cli_err`: errors, `help`, `show
//! version`, `set server addr`'s report), and only messages carry the severity tag
//! that `set severity-output` asks for, as in HAProxy.

use std::borrow::Cow;
use std::net::IpAddr;

use crate::checks::transition::{self, Cause, Site};
use crate::config::{Balance, CliLevel};
use crate::lb::{Change, OpState, ServerRt, MAX_WEIGHT};
use crate::maps::{MapError, MapRt, Maps};

use super::command::{
    AdminState, Command, ForcedHealth, ParseError, Parsed, PromptMode, ProxySel, ServerOp,
    SeverityOutput, PROMPT_USAGE,
};
use super::render::{self, StatFilter};
use super::stream::Producer;
use super::{Ctx, Session};

/// `shutdown session` without an id.
pub const SESSION_POINTER_EXPECTED: &str = "Session pointer expected (use 'show sess').\n";
/// `shutdown session ID` naming no live flow.
pub const NO_SUCH_SESSION: &str = "No such session (use 'show sess').\n";

/// HAProxy's refusal text.
pub const PERMISSION_DENIED: &str = "Permission denied\n";
/// `show stat` naming a proxy that does not exist.
pub const NO_SUCH_PROXY: &str = "No such proxy.\n";
/// A map command naming no loaded map.
pub const UNKNOWN_MAP: &str = "Unknown map identifier. Please use #<id> or <file>.\n";

/// A server command naming no server (`get weight b`, `set server`).
pub const REQUIRE_BACKEND_SERVER: &str = "Require 'backend/server'.\n";
/// `B/S` naming no backend.
pub const NO_SUCH_BACKEND: &str = "No such backend.\n";
/// `B/S` naming no server of that backend.
pub const NO_SUCH_SERVER: &str = "No such server.\n";
/// `show servers state|conn BACKEND` naming no backend.
pub const CANT_FIND_BACKEND: &str = "Can't find backend.\n";
/// `set server B/S` without a known operation (HAProxy 2.6's list).
pub const SET_SERVER_USAGE: &str = "usage: set server <backend>/<server> addr | agent | agent-addr | agent-port | agent-send | check-addr | check-port | fqdn | health | ssl | state | weight\n";
/// `set server B/S state` with a bad word.
pub const STATE_EXPECTS: &str = "'set server <srv> state' expects 'ready', 'drain' and 'maint'.\n";
/// `set server B/S health` with a bad word.
pub const HEALTH_EXPECTS: &str = "'set server <srv> health' expects 'up', 'stopping', or 'down'.\n";
/// `set server B/S agent|agent-send` on a server without an enabled agent.
pub const AGENT_NOT_ENABLED: &str = "agent checks are not enabled on this server.\n";
/// `set server B/S agent` with a bad word.
pub const AGENT_EXPECTS: &str = "'set server <srv> agent' expects 'up' or 'down'.\n";
/// `set server B/S agent-addr|agent-port|check-addr|check-port` without a value.
pub const AGENT_ADDR_REQUIRED: &str =
    "set server <b>/<s> agent-addr requires an address and optionally a port.\n";
pub const AGENT_PORT_REQUIRED: &str = "set server <b>/<s> agent-port requires a port.\n";
pub const CHECK_ADDR_REQUIRED: &str =
    "set server <b>/<s> check-addr requires an address and optionally a port.\n";
pub const CHECK_PORT_REQUIRED: &str = "set server <b>/<s> check-port requires a port.\n";
/// `enable health|agent B/S` on a server without `check` / `agent-check`.
pub const HEALTH_NOT_CONFIGURED: &str =
    "Health check was not configured on this server, cannot enable.\n";
pub const AGENT_NOT_CONFIGURED: &str = "Agent was not configured on this server, cannot enable.\n";

/// Weight errors, HAProxy 2.6's `server_parse_weight_change_request` texts. Two of
/// them have no newline in HAProxy, which then also omits the empty line that ends
/// the answer; shunt keeps its framing and ends them with a newline.
pub const WEIGHT_MISSING: &str = "Require <weight> or <weight%>.\n";
pub const WEIGHT_GARBAGE_BEFORE: &str = "Empty weight string empty or preceded by garbage\n";
pub const WEIGHT_RELATIVE_NEGATIVE: &str = "Relative weight must be positive.\n";
pub const WEIGHT_ABSOLUTE_RANGE: &str =
    "Absolute weight can only be between 0 and 256 inclusive.\n";
pub const WEIGHT_TRAILING: &str = "Trailing garbage in weight string\n";
pub const WEIGHT_STATIC: &str =
    "Backend is using a static LB algorithm and only accepts weights '0%' and '100%'.\n";
/// Largest percentage a relative weight is read as (HAProxy's overflow guard).
const MAX_WEIGHT_PERCENT: i64 = 25_600;

/// `set maxconn frontend` naming nothing / no frontend (HAProxy's `cli_find_frontend`).
pub const FRONTEND_EXPECTED: &str = "A frontend name is expected.\n";
pub const NO_SUCH_FRONTEND: &str = "No such frontend.\n";
/// `set server B/S addr` without an address.
pub const ADDR_REQUIRED: &str =
    "set server <b>/<s> addr requires an address and optionally a port.\n";
/// `set server B/S addr IP port +N|-N`: HAProxy's refusal of a port map (its text
/// has no closing parenthesis).
const PORT_MAP_REFUSED: &str = "can't change <port> to port map because it is incompatible with current health check port configuration (use 'port' statement from the 'server' directive.";
/// Who `set server B/S addr` reports as the author of the change.
const ADDR_UPDATER: &str = "stats socket command";

/// Syslog severities HAProxy tags CLI messages with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// `cli_err`: every error.
    Err = 3,
    /// Reports of a change that may need attention (`set server addr`).
    Warning = 4,
    /// Informational messages (`help`, `show cli level`, `show version`).
    Info = 6,
}

impl Severity {
    /// The syslog name (`log_levels[]` in HAProxy).
    pub fn name(self) -> &'static str {
        match self {
            Severity::Err => "err",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// What a command answers. The body is empty or ends with `\n`; the framing adds the
/// empty line that ends every answer.
#[derive(Debug)]
pub enum Output {
    /// A dump: written as is.
    Text(String),
    /// A message: tagged with its severity when the session asks for it.
    Msg(Severity, String),
    /// A body too large to build whole (`show map MAP`, `show sess`): the connection
    /// loop drains it a chunk at a time (`stream.rs`).
    Stream(Producer),
}

impl Output {
    fn empty() -> Self {
        Output::Text(String::new())
    }

    /// Whether this is an error message.
    pub fn is_err(&self) -> bool {
        matches!(self, Output::Msg(Severity::Err, _))
    }

    /// An error message (HAProxy's `cli_err`).
    pub fn err(s: impl Into<String>) -> Self {
        Output::Msg(Severity::Err, s.into())
    }

    fn info(s: impl Into<String>) -> Self {
        Output::Msg(Severity::Info, s.into())
    }

    /// The body as text (empty for a stream, whose body the loop produces).
    pub fn as_str(&self) -> &str {
        match self {
            Output::Text(s) | Output::Msg(_, s) => s,
            Output::Stream(_) => "",
        }
    }

    /// The body as written to a session in severity-output `mode`: a message gets
    /// `[N]: ` or `[name]: ` in front (HAProxy's `cli_output_msg`); a dump never does.
    pub fn render(&self, mode: SeverityOutput) -> Cow<'_, str> {
        match (self, mode) {
            (Output::Msg(sev, s), SeverityOutput::Number) => {
                Cow::Owned(format!("[{}]: {s}", *sev as u8))
            }
            (Output::Msg(sev, s), SeverityOutput::String) => {
                Cow::Owned(format!("[{}]: {s}", sev.name()))
            }
            _ => Cow::Borrowed(self.as_str()),
        }
    }
}

/// Run one command whose table entry says the workers answer it
/// ([`Parsed::on_workers`]; `show sess` is a [`Producer`] the connection loop
/// drains): `shutdown session ID` / `shutdown sessions server B/S` make the owning
/// workers abort the flows' tasks, which closes both sockets; `show activity` and
/// `show profiling` gather every worker's scheduler counters.
pub async fn dispatch_workers(ctx: &Ctx, sess: &Session, p: Parsed) -> Output {
    use super::sessions;
    use crate::stats::flows;
    if !allowed(sess.level, p.level()) {
        return Output::err(PERMISSION_DENIED);
    }
    match p.cmd {
        Command::ShutdownSession(word) => {
            if word.is_empty() {
                return Output::err(SESSION_POINTER_EXPECTED);
            }
            let Some(id) = sessions::parse_id(&word) else {
                return Output::err(NO_SUCH_SESSION);
            };
            let Some(tid) = flows::thread_of(id) else {
                return Output::err(NO_SUCH_SESSION);
            };
            let remotes = ctx.state.workers.remotes();
            let Some(remote) = remotes.iter().find(|r| r.thread_id() == tid) else {
                return Output::err(NO_SUCH_SESSION);
            };
            if sessions::abort_where(remote, move |v| v.id == id).await == 0 {
                return Output::err(NO_SUCH_SESSION);
            }
            Output::empty()
        }
        Command::ShutdownSessionsServer(target) => match find_server(ctx, &target) {
            Err(msg) => Output::err(msg),
            Ok((bi, si)) => {
                for remote in ctx.state.workers.remotes() {
                    sessions::abort_where(&remote, move |v| v.be == Some(bi) && v.srv == Some(si))
                        .await;
                }
                Output::empty()
            }
        },
        Command::ShowActivity => {
            let threads = gather_thread_stats(ctx).await;
            let tid = crate::scheduler::try_thread_id().unwrap_or(0);
            Output::Text(render::show_activity(
                tid,
                std::time::SystemTime::now(),
                &threads,
            ))
        }
        Command::ShowProfiling(q) => {
            let threads = gather_thread_stats(ctx).await;
            Output::Text(render::show_profiling(
                crate::scheduler::profiling_status(),
                q.part,
                q.max_lines,
                q.by_name,
                &threads,
            ))
        }
        _ => Output::empty(),
    }
}

/// Every live worker's scheduler snapshot, in worker order (a worker that has
/// stopped is left out).
async fn gather_thread_stats(ctx: &Ctx) -> Vec<crate::scheduler::ThreadStats> {
    let mut out = Vec::new();
    for remote in ctx.state.workers.remotes() {
        if let Some(s) = remote.stats().await {
            out.push(s);
        }
    }
    out
}

/// Run one command for one CLI session, at the level its table entry says.
pub fn dispatch(ctx: &Ctx, sess: &mut Session, p: Parsed) -> Output {
    if !allowed(sess.level, p.level()) {
        return Output::err(PERMISSION_DENIED);
    }
    match p.cmd {
        Command::Empty => Output::empty(),
        Command::Help(words) => Output::info(render::help(&words)),
        Command::Prompt => {
            set_prompt(sess, None, false);
            Output::empty()
        }
        Command::Quit => {
            sess.quit = true;
            Output::empty()
        }
        Command::SetLevel(l) => {
            // Only lowering reaches here (raising was refused by the level check).
            sess.level = l;
            Output::empty()
        }
        Command::ShowCliLevel => Output::info(format!("{}\n", render::level_name(sess.level))),
        Command::ShowInfo(fmt) => Output::Text(render::show_info(ctx, fmt)),
        Command::ShowStat(q) => {
            let iid = match q.proxy {
                ProxySel::All => None,
                ProxySel::Id(n) => match u32::try_from(n) {
                    Ok(id) if id != 0 => Some(id),
                    _ => return Output::err(NO_SUCH_PROXY),
                },
                ProxySel::Name(name) => {
                    let found = render::proxies(ctx)
                        .into_iter()
                        .find(|p| render::proxy_name(ctx, p) == name);
                    match found {
                        Some(p) => Some(p.id),
                        None => return Output::err(NO_SUCH_PROXY),
                    }
                }
            };
            let csv = render::show_stat(
                ctx,
                StatFilter {
                    iid,
                    types: q.types,
                    sid: q.sid,
                },
            );
            Output::Text(if q.json {
                super::typed::stat_json(&csv)
            } else if q.typed {
                super::typed::stat_typed(&csv)
            } else {
                csv
            })
        }
        Command::SetTimeoutCli(d) => {
            sess.timeout = d;
            Output::empty()
        }
        Command::ShowMaps => Output::Text(render::show_maps(&ctx.state.maps)),
        Command::ShowMap { ver, map } => match ctx.state.maps.find(&map) {
            Some(map) => Output::Stream(Producer::map(match ver {
                Some(v) => map.table_at(v),
                None => map.table(),
            })),
            None => Output::err(UNKNOWN_MAP),
        },
        Command::GetMap { map, value } => match ctx.state.maps.find(&map) {
            Some(map) => Output::Text(render::get_map(&map.table(), &value)),
            None => Output::err(UNKNOWN_MAP),
        },
        Command::AddMap {
            ver,
            map,
            key,
            value,
        } => map_change(ctx, &map, |maps, m| maps.add_at(m, ver, &key, &value)),
        Command::AddMapPayload { ver, map, payload } => {
            map_change(ctx, &map, |maps, m| maps.add_payload_at(m, ver, &payload))
        }
        Command::SetMap { map, key, value } => {
            map_change(ctx, &map, |maps, m| maps.set(m, &key, &value))
        }
        Command::DelMap { map, key } => map_change(ctx, &map, |maps, m| maps.del(m, &key)),
        Command::ClearMap { ver, map } => map_change(ctx, &map, |maps, m| {
            match ver {
                Some(v) => maps.clear_at(m, v),
                None => maps.clear(m),
            }
            Ok(())
        }),
        Command::GetWeight(target) => match find_server(ctx, &target) {
            Ok((bi, si)) => {
                let srv = &ctx.state.backends[bi].servers[si];
                let w = srv.user_weight();
                Output::Text(format!("{w} (initial {})\n", srv.initial_weight()))
            }
            Err(e) => Output::err(e),
        },
        Command::SetWeight { target, weight } => match find_server(ctx, &target) {
            Ok((bi, si)) => set_weight(ctx, bi, si, &weight),
            Err(e) => Output::err(e),
        },
        Command::SetServer { target, op } => {
            let (bi, si) = match find_server(ctx, &target) {
                Ok(found) => found,
                Err(e) => return Output::err(e),
            };
            match op {
                ServerOp::State(st) => {
                    set_admin(ctx, bi, si, st);
                    Output::empty()
                }
                ServerOp::BadState => Output::err(STATE_EXPECTS),
                ServerOp::Weight(w) => set_weight(ctx, bi, si, &w),
                ServerOp::Health(h) => {
                    force_health(ctx, bi, si, h);
                    Output::empty()
                }
                ServerOp::BadHealth => Output::err(HEALTH_EXPECTS),
                ServerOp::Usage => Output::err(SET_SERVER_USAGE),
                ServerOp::Addr { addr, port } => {
                    let srv = &ctx.state.backends[bi].servers[si];
                    set_addr(srv, &addr, port.as_deref())
                }
                ServerOp::AddrMissing => Output::err(ADDR_REQUIRED),
                ServerOp::Agent(word) => force_agent(ctx, bi, si, word),
                ServerOp::AgentAddr { addr, port } => {
                    set_probe_target(ctx, bi, si, Probe::Agent, Some(&addr), port.as_deref())
                }
                ServerOp::AgentAddrMissing => Output::err(AGENT_ADDR_REQUIRED),
                ServerOp::AgentPort(port) => {
                    set_probe_target(ctx, bi, si, Probe::Agent, None, Some(&port))
                }
                ServerOp::AgentPortMissing => Output::err(AGENT_PORT_REQUIRED),
                ServerOp::AgentSend(text) => {
                    let srv = &ctx.state.backends[bi].servers[si];
                    if !srv.agent_enabled() {
                        return Output::err(AGENT_NOT_ENABLED);
                    }
                    srv.update_probe_targets(|p| p.agent_send = text.as_bytes().into());
                    Output::empty()
                }
                ServerOp::CheckAddr { addr, port } => {
                    set_probe_target(ctx, bi, si, Probe::Check, Some(&addr), port.as_deref())
                }
                ServerOp::CheckAddrMissing => Output::err(CHECK_ADDR_REQUIRED),
                ServerOp::CheckPort(port) => {
                    set_probe_target(ctx, bi, si, Probe::Check, None, Some(&port))
                }
                ServerOp::CheckPortMissing => Output::err(CHECK_PORT_REQUIRED),
            }
        }
        Command::EnableServer(target) => match find_server(ctx, &target) {
            Ok((bi, si)) => {
                set_admin(ctx, bi, si, AdminState::Ready);
                Output::empty()
            }
            Err(e) => Output::err(e),
        },
        Command::DisableServer(target) => match find_server(ctx, &target) {
            Ok((bi, si)) => {
                set_admin(ctx, bi, si, AdminState::Maint);
                Output::empty()
            }
            Err(e) => Output::err(e),
        },
        Command::ShowServersState(be) => match backend_list(ctx, be.as_deref()) {
            Some(list) => Output::Text(crate::checks::state_file::render(&ctx.state, &list)),
            None => Output::err(CANT_FIND_BACKEND),
        },
        Command::ShowServersConn(be) => match backend_list(ctx, be.as_deref()) {
            Some(list) => Output::Text(render::show_servers_conn(ctx, &list)),
            None => Output::err(CANT_FIND_BACKEND),
        },
        Command::ShowBackend => Output::Text(render::show_backend(ctx)),
        // The stats room has no reset yet: the command is accepted with HAProxy's
        // (empty) answer and its level checks, and the counters keep running.
        Command::ClearCounters { all } => {
            ctx.state.stats.clear(all);
            Output::empty()
        }
        Command::ShowSess => Output::Stream(Producer::sessions(ctx)),
        // Answered by `dispatch_workers` (their table entries say `on_workers`).
        Command::ShutdownSession(_) | Command::ShutdownSessionsServer(_) => Output::empty(),
        Command::Bad(err) => Output::err(format!("{err}\n")),
        Command::Unknown(words) => Output::info(render::unknown(&words)),
        Command::SetProfilingTasks(mode) => {
            crate::scheduler::set_profiling_mode(mode);
            Output::empty()
        }
        // Answered by `dispatch_workers` (their table entries say `on_workers`).
        Command::ShowActivity | Command::ShowProfiling(_) => Output::empty(),
        Command::ShowVersion => Output::info(format!("{}\n", env!("CARGO_PKG_VERSION"))),
        Command::SetSeverityOutput(mode) => {
            sess.severity = mode;
            Output::empty()
        }
        Command::PromptSet { mode, timed } => {
            set_prompt(sess, mode, timed);
            Output::empty()
        }
        Command::PromptHelp => Output::info(format!("{PROMPT_USAGE}\n")),
        Command::SetMaxconnServer { target, value } => {
            let (bi, si) = match find_server(ctx, &target) {
                Ok(found) => found,
                Err(e) => return Output::err(e),
            };
            match value {
                Ok(n) => {
                    let be = &ctx.state.backends[bi];
                    be.servers[si].set_maxconn(n);
                    // Raised room goes to queued requests at once.
                    be.rebalance();
                    Output::empty()
                }
                Err(e) => Output::err(format!("{e}\n")),
            }
        }
        Command::SetMaxconnFrontend { frontend, value } => {
            if frontend.is_empty() {
                return Output::err(FRONTEND_EXPECTED);
            }
            let cfg = &ctx.state.config;
            let Some(fi) = cfg.frontends.iter().position(|f| f.name == frontend) else {
                return Output::err(NO_SUCH_FRONTEND);
            };
            match value {
                Ok(n) => {
                    ctx.state.admission.set_frontend_limit(fi, n);
                    Output::empty()
                }
                Err(e) => Output::err(format!("{e}\n")),
            }
        }
        Command::SetMaxconnGlobal(v) => {
            // The configured value is HAProxy's hard limit: never above it, and
            // `<= 0` restores it.
            let hard = ctx.state.config.global.maxconn;
            let n = match usize::try_from(v) {
                Ok(n) if n > hard => {
                    return Output::err(format!("{}\n", ParseError::ValueOutOfRange))
                }
                Ok(n) if n > 0 => n,
                _ => hard,
            };
            ctx.state.admission.set_global_limit(n);
            Output::empty()
        }
        Command::PrepareMap(map) => match ctx.state.maps.find(&map) {
            Some(map) => Output::info(format!("New version created: {}\n", map.prepare())),
            None => Output::err(UNKNOWN_MAP),
        },
        Command::CommitMap { ver, map } => map_change(ctx, &map, |_, m| m.commit(ver)),
        Command::EnableHealth(target) => match find_server(ctx, &target) {
            Ok((bi, si)) => {
                let srv = &ctx.state.backends[bi].servers[si];
                if !srv.check_configured() {
                    return Output::err(HEALTH_NOT_CONFIGURED);
                }
                srv.set_check_enabled(true);
                Output::empty()
            }
            Err(e) => Output::err(e),
        },
        Command::DisableHealth(target) => match find_server(ctx, &target) {
            Ok((bi, si)) => {
                ctx.state.backends[bi].servers[si].set_check_enabled(false);
                Output::empty()
            }
            Err(e) => Output::err(e),
        },
        Command::EnableAgent(target) => match find_server(ctx, &target) {
            Ok((bi, si)) => {
                let srv = &ctx.state.backends[bi].servers[si];
                if !srv.agent_configured() {
                    return Output::err(AGENT_NOT_CONFIGURED);
                }
                srv.set_agent_enabled(true);
                Output::empty()
            }
            Err(e) => Output::err(e),
        },
        Command::DisableAgent(target) => match find_server(ctx, &target) {
            Ok((bi, si)) => {
                ctx.state.backends[bi].servers[si].set_agent_enabled(false);
                Output::empty()
            }
            Err(e) => Output::err(e),
        },
        Command::ShowTable(req) => super::tables::show(&ctx.state.tables, sess.level, &req),
        Command::ClearTable(req) => super::tables::clear(&ctx.state.tables, sess.level, &req),
        Command::SetTable(req) => super::tables::set(&ctx.state.tables, &req),
    }
}

/// The reason HAProxy logs for a change forced by the CLI.
pub const FROM_CLI: &str = "changed from CLI";

/// `set server B/S health up|stopping|down`: HAProxy forces the state (unless the
/// server is in maintenance) and resets the check's health counter, so the checks
/// then start from there: `up` and `stopping` at full health (down after `fall`
/// failures), `down` at 0 (up after `rise` passes).
fn force_health(ctx: &Ctx, bi: usize, si: usize, h: ForcedHealth) {
    let site = Site {
        state: &ctx.state,
        bi,
        si,
    };
    let srv = site.server();
    let full = srv.rise() + srv.fall() - 1;
    let (health, to) = match h {
        ForcedHealth::Up => (full, OpState::Up),
        ForcedHealth::Stopping => (full, OpState::Stopping),
        ForcedHealth::Down => (0, OpState::Down),
    };
    transition::apply(
        &site,
        Change::Force { health, to },
        &Cause::Reason(FROM_CLI),
    );
    srv.touch();
}

/// `set server B/S agent up|down`: as `health`, for the agent's own verdict.
fn force_agent(ctx: &Ctx, bi: usize, si: usize, word: Option<bool>) -> Output {
    let site = Site {
        state: &ctx.state,
        bi,
        si,
    };
    let srv = site.server();
    if !srv.agent_enabled() {
        return Output::err(AGENT_NOT_ENABLED);
    }
    let Some(up) = word else {
        return Output::err(AGENT_EXPECTS);
    };
    transition::apply(&site, Change::ForceAgent { up }, &Cause::Reason(FROM_CLI));
    srv.touch();
    Output::empty()
}

/// Which probe `check-addr|check-port` / `agent-addr|agent-port` changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    Check,
    Agent,
}

/// HAProxy's `srv_update_check_addr_port` / `srv_update_agent_addr_port`: all or
/// nothing; a refusal is a warning message without a final period.
fn set_probe_target(
    ctx: &Ctx,
    bi: usize,
    si: usize,
    which: Probe,
    addr: Option<&str>,
    port: Option<&str>,
) -> Output {
    let srv = &ctx.state.backends[bi].servers[si];
    let warn = |m: String| Output::Msg(Severity::Warning, format!("{m}\n"));
    let enabled = match which {
        Probe::Check => srv.checked(),
        Probe::Agent => srv.agent_enabled(),
    };
    if !enabled {
        return warn(
            match which {
                Probe::Check => "health checks are not enabled on this server",
                Probe::Agent => "agent checks are not enabled on this server",
            }
            .to_string(),
        );
    }
    let ip = match addr {
        None => None,
        Some(a) => match a.parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => return warn(format!("invalid addr '{a}'")),
        },
    };
    let port = match port {
        None => None,
        Some(p) => match strl2irc(p) {
            None => return warn("provided port is not an integer".to_string()),
            Some(n) => match u16::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => return warn("provided port is invalid".to_string()),
            },
        },
    };
    srv.update_probe_targets(|t| match which {
        Probe::Check => {
            if ip.is_some() {
                t.check_addr = ip;
            }
            if port.is_some() {
                t.check_port = port;
            }
        }
        Probe::Agent => {
            if ip.is_some() {
                t.agent_addr = ip;
            }
            if port.is_some() {
                t.agent_port = port;
            }
        }
    });
    Output::empty()
}

/// HAProxy's `strl2irc`: an optional `-` then digits only, within an `int`; `None`
/// for anything else (the empty word included).
fn strl2irc(word: &str) -> Option<i64> {
    let (neg, digits) = match word.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, word),
    };
    if word.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut v: i64 = 0;
    for b in digits.bytes() {
        v = v * 10 + i64::from(b - b'0');
        if v > i64::from(i32::MAX) + i64::from(neg) {
            return None;
        }
    }
    Some(if neg { -v } else { v })
}

/// `prompt [n|i|p] [timed]` as HAProxy 3.x: `timed` toggles the time and implies
/// `p`; a mode sets both flags; no mode toggles between prompt and non-interactive.
fn set_prompt(sess: &mut Session, mode: Option<PromptMode>, timed: bool) {
    let mode = if timed {
        sess.timed = !sess.timed;
        Some(mode.unwrap_or(PromptMode::Prompt))
    } else {
        mode
    };
    let (interactive, prompt) = match mode {
        Some(PromptMode::NonInteractive) => (false, false),
        Some(PromptMode::Interactive) => (true, false),
        Some(PromptMode::Prompt) => (true, true),
        None if sess.interactive && sess.prompt => (false, false),
        None => (true, true),
    };
    sess.interactive = interactive;
    sess.prompt = prompt;
}

/// `set server B/S addr IP [port P]`: HAProxy 2.6's `srv_update_addr_port`, its
/// report word for word. The address is applied even when the port then fails (as
/// HAProxy does); the next connection goes to the new address, open ones stay.
/// Port maps (`+N`/`-N`) are not supported by shunt and are refused with HAProxy's
/// text for a server that cannot switch to one.
fn set_addr(srv: &ServerRt, addr: &str, port: Option<&str>) -> Output {
    let report =
        |msg: String| Output::Msg(Severity::Warning, format!("{msg} by '{ADDR_UPDATER}'\n"));
    let Ok(ip) = addr.parse::<IpAddr>() else {
        return report(format!("Invalid addr '{addr}'"));
    };
    let cur = srv.addr();
    let mut next = cur;
    let mut msg = if ip == cur.ip() {
        "no need to change the addr".to_string()
    } else {
        next.set_ip(ip);
        format!("IP changed from '{}' to '{addr}'", cur.ip())
    };
    if let Some(port) = port {
        msg.push_str(", ");
        let signed = port.trim_start().starts_with(['+', '-']);
        match strtol_port(port) {
            None => msg.push_str(&format!("problem converting port '{port}' to an int")),
            Some(_) if signed => msg.push_str(PORT_MAP_REFUSED),
            Some(p) if p == cur.port() => msg.push_str("no need to change the port"),
            Some(p) => {
                msg.push_str(&format!("port changed from '{}' to '{p}'", cur.port()));
                next.set_port(p);
            }
        }
    }
    if next != cur {
        srv.set_addr(next);
    }
    report(msg)
}

/// A port as HAProxy reads it (`strtol` then a 16-bit store): leading blanks, an
/// optional sign, digits; `None` when there are no digits or the value overflows a
/// `long`. Out-of-range values wrap as the C store does.
fn strtol_port(word: &str) -> Option<u16> {
    let n = super::command::split_number(word, true);
    if n.digits.is_empty() {
        return None;
    }
    let v: i64 = n.digits.parse().ok()?;
    let v = if n.negative { -v } else { v };
    // Truncation to 16 bits is the point: HAProxy stores the long in a uint16_t.
    Some(v as u16)
}

/// Apply a change to the map named `name`: HAProxy's answers are empty on success,
/// the error text and a period otherwise.
fn map_change(
    ctx: &Ctx,
    name: &str,
    f: impl FnOnce(&Maps, &MapRt) -> Result<(), MapError>,
) -> Output {
    let maps = &ctx.state.maps;
    let Some(map) = maps.find(name) else {
        return Output::err(UNKNOWN_MAP);
    };
    match f(maps, map) {
        Ok(()) => Output::empty(),
        Err(e) => Output::err(format!("{e}.\n")),
    }
}

/// Whether `have` may run what needs `need` (user < operator < admin).
fn allowed(have: CliLevel, need: CliLevel) -> bool {
    have >= need
}

/// The backend whose name is `word`, or whose id is N for `#N` (HAProxy accepts both).
fn find_backend(ctx: &Ctx, word: &str) -> Option<usize> {
    let cfg = &ctx.state.config;
    if let Some(id) = word.strip_prefix('#').and_then(|n| n.parse::<u32>().ok()) {
        return cfg.backends.iter().position(|b| b.id == id);
    }
    cfg.backends.iter().position(|b| b.name == word)
}

/// Resolve `B/S` as HAProxy's CLI does: `(backend index, server index)` or its error.
pub fn find_server(ctx: &Ctx, target: &str) -> Result<(usize, usize), &'static str> {
    let Some((bname, sname)) = target.split_once('/') else {
        return Err(REQUIRE_BACKEND_SERVER);
    };
    let bi = find_backend(ctx, bname).ok_or(NO_SUCH_BACKEND)?;
    let servers = &ctx.state.config.backends[bi].servers;
    let si = match sname.strip_prefix('#').and_then(|n| n.parse::<u32>().ok()) {
        Some(id) => servers.iter().position(|s| s.id == id),
        None => servers.iter().position(|s| s.name == sname),
    };
    si.map(|si| (bi, si)).ok_or(NO_SUCH_SERVER)
}

/// Backends `show servers state|conn` covers: all, or the one named (None if unknown).
fn backend_list(ctx: &Ctx, word: Option<&str>) -> Option<Vec<usize>> {
    match word {
        None => Some((0..ctx.state.config.backends.len()).collect()),
        Some(w) => find_backend(ctx, w).map(|bi| vec![bi]),
    }
}

/// Whether HAProxy treats the algorithm as static (weights only 0% or 100%).
fn static_algo(b: Balance) -> bool {
    matches!(b, Balance::StaticRr | Balance::Source)
}

/// HAProxy's weight syntax: `N` (0..=256) or `N%` of the initial weight.
pub fn parse_weight(word: &str, iweight: u32, is_static: bool) -> Result<u32, &'static str> {
    if word.is_empty() {
        return Err(WEIGHT_MISSING);
    }
    // strtol: optional sign, then digits; `end` is what follows them.
    let (neg, unsigned) = match word.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, word.strip_prefix('+').unwrap_or(word)),
    };
    let ndigits = unsigned.bytes().take_while(u8::is_ascii_digit).count();
    if ndigits == 0 {
        return Err(WEIGHT_GARBAGE_BEFORE);
    }
    let (digits, end) = unsigned.split_at(ndigits);
    let mut w: i64 = digits.bytes().fold(0i64, |v, b| {
        v.saturating_mul(10).saturating_add(i64::from(b - b'0'))
    });
    if neg {
        w = -w;
    }
    let w = if end == "%" {
        if w < 0 {
            return Err(WEIGHT_RELATIVE_NEGATIVE);
        }
        let pct = w.min(MAX_WEIGHT_PERCENT);
        (i64::from(iweight) * pct / 100).min(i64::from(MAX_WEIGHT))
    } else if !(0..=i64::from(MAX_WEIGHT)).contains(&w) {
        return Err(WEIGHT_ABSOLUTE_RANGE);
    } else if !end.is_empty() {
        return Err(WEIGHT_TRAILING);
    } else {
        w
    };
    // In range by construction (0..=MAX_WEIGHT).
    let w = u32::try_from(w).unwrap_or(MAX_WEIGHT);
    if w != 0 && w != iweight && is_static {
        return Err(WEIGHT_STATIC);
    }
    Ok(w)
}

/// `set weight` / `set server B/S weight`: a drained server keeps draining and
/// remembers the new weight for when it is made ready.
fn set_weight(ctx: &Ctx, bi: usize, si: usize, word: &str) -> Output {
    let be = &ctx.state.backends[bi];
    let srv = &be.servers[si];
    let w = match parse_weight(word, srv.initial_weight(), static_algo(be.balance)) {
        Ok(w) => w,
        Err(e) => return Output::err(e),
    };
    let site = Site {
        state: &ctx.state,
        bi,
        si,
    };
    transition::apply(&site, Change::UserWeight(w), &Cause::Reason(FROM_CLI));
    Output::empty()
}

/// `set server B/S state ...`, `enable server`, `disable server`: HAProxy's admin
/// transitions (maint clears drain, drain clears maint, ready clears both).
///
/// Existing flows are kept, except that a running server entering maintenance is
/// marked down, which applies its `on-marked-down shutdown-sessions` (as HAProxy).
fn set_admin(ctx: &Ctx, bi: usize, si: usize, st: AdminState) {
    crate::checks::set_admin(&ctx.state, bi, si, st);
}
