//! Health checks and agent checks (HAProxy's `check`, `option tcp-check`, `agent-check`).
//!
//! Owns: one scheduler task per checked server (and one per agent), spread over
//! the workers (server `k` of the process runs on worker `k % nbthread`); the check
//! statuses ([`Status`]) with HAProxy's names and descriptions; the health-check
//! loop ([`health`]; the rise/fall machine it feeds is the server's, in `lb`); what
//! a transition does ([`transition`]); the probes ([`probe`]: plain connect, tcp-check rules, the
//! agent's line) and the agent's reply words ([`agent`]).
//!
//! A check only ever changes a server through `ServerRt::apply` (a
//! [`crate::lb::Change`]: a check result, the agent's words, ...), and what a
//! returned transition does is [`transition::on`]'s, for the CLI and the
//! server-state file too: the HAProxy log line (`Server be/s1 is DOWN, reason:
//! ...`), the backend's `rebalance` (queued requests see the change at once) and
//! the `shutdown-sessions` options.
//!
//! Must not: block a worker (every probe is async and bounded by the check
//! timeouts); hold a lock across an await.
//!
//! The server-state file (`server-state-file`, `load-server-state-from-file`) is
//! read once at start by [`state_file`].
//!
//! `slowstart`: a server coming back UP ramps its effective weight from 1 to its
//! user weight over the period ([`transition::on`] starts the ramp). `observe
//! layer4`: connection results of live traffic feed [`observe::report`], which acts
//! on `error-limit` consecutive errors as `on-error` says.
//!
//! TLS checks (`check-ssl`, and `ssl` on a server whose checks have no `port`
//! or `addr` of their own; `tcp-check connect ssl`): the handshake follows the
//! connect within the same deadline and is the layer-6 part of the check
//! (`L6OK`, `L6RSP`, `L6TOUT`); `tcp-check` rules then run over the TLS
//! stream. The client configuration is the server's, built once at start
//! (`crate::tls::Contexts::check_connector`).
//!
//! `check-send-proxy`, and `send-proxy(-v2)` on a server whose checks have no
//! `port` or `addr` of their own: health-check connections (not the agent's)
//! begin with a PROXY header, as HAProxy's: v1 names the check connection's own
//! addresses, v2 is the `LOCAL` command (`config::Server::check_proxy_header`).

pub mod agent;
pub mod health;
pub mod observe;
pub mod probe;
pub mod state_file;
pub mod transition;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, TcpCheckRule};
use crate::lb::{BackendRt, ServerRt};
use crate::runtime::Runtime;
use crate::scheduler::{self, Class, TaskHandle};

/// HAProxy's default `inter`.
pub const DEFAULT_INTER: Duration = Duration::from_secs(2);
/// Bytes a check reads at most (HAProxy's check buffer is one `tune.bufsize`).
pub const CHECK_BUF: usize = 16 * 1024;

pub use crate::lb::status::{Status, DEFAULT_FALL, DEFAULT_RISE};

/// Set server `si` of backend `bi` to admin state `st` (`set server B/S
/// state`, `enable|disable server`, the server-state file), through
/// [`transition::apply`]: the backend is rebalanced, and a running server
/// entering maintenance is marked down, which applies its `on-marked-down
/// shutdown-sessions` (as HAProxy). Existing flows are kept otherwise.
pub fn set_admin(state: &Runtime, bi: usize, si: usize, st: crate::lb::AdminState) {
    let site = transition::Site { state, bi, si };
    transition::apply(
        &site,
        crate::lb::Change::Admin(st),
        &transition::Cause::Reason(""),
    );
}

/// The result of one probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub status: Status,
    pub code: Option<u32>,
    /// The information string (`Connection refused`, `(tcp-check)`, ...).
    pub desc: String,
}

impl Outcome {
    pub fn new(status: Status, desc: impl Into<String>) -> Self {
        Self {
            status,
            code: None,
            desc: desc.into(),
        }
    }
}

/// Where and how one server is checked, resolved from the configuration.
pub struct Target {
    pub state: Arc<Runtime>,
    pub bi: usize,
    pub si: usize,
    pub backend: Arc<BackendRt>,
    pub server: Arc<ServerRt>,
    /// `backend`, or `proxy` for a `listen` section (HAProxy's proxy type word).
    pub px_type: &'static str,
    pub inter: Duration,
    pub fastinter: Duration,
    pub downinter: Duration,
    pub timeouts: probe::Timeouts,
    /// `option tcp-check` rules (compiled), or `None` for a plain connect check.
    pub rules: Option<Arc<[probe::Rule]>>,
    pub agent: Option<AgentTarget>,
    pub on_marked_down_shutdown: bool,
    pub on_marked_up_shutdown_backup: bool,
    /// Health-check connections start with a PROXY header of this version.
    pub send_proxy: Option<crate::proxy_proto::Version>,
    /// The server's `source`: checks and the agent connect from there too.
    pub source: Option<SocketAddr>,
    /// `option log-health-checks`: every change of check result is logged.
    pub log_health_checks: bool,
    /// TLS of the checks, when any check connection of the server can use it.
    pub tls: Option<CheckTls>,
}

/// How one server's checks speak TLS.
#[derive(Clone)]
pub struct CheckTls {
    /// The server's client configuration (built once at start, not per check).
    pub connector: crate::tls::Connector,
    /// The check's own connection is TLS (a plain `check`, and the implicit
    /// first connection of `tcp-check`): [`crate::config::Server::check_ssl`].
    pub default: bool,
    /// `check-sni`: the server name the check's own connection sends (none
    /// without it); a `tcp-check connect ssl` rule sends its own `sni` only.
    pub sni: Option<String>,
}

/// The agent of one server (where it listens and what it is sent live in the
/// server's [`crate::lb::ProbeTargets`], which the CLI may change).
#[derive(Debug, Clone)]
pub struct AgentTarget {
    pub inter: Duration,
}

impl Target {
    fn new(state: &Arc<Runtime>, bi: usize, si: usize) -> Self {
        let cfg: &Config = &state.config;
        let be = &cfg.backends[bi];
        let srv = &be.servers[si];
        let c = &srv.check;
        let inter = c.inter.unwrap_or(DEFAULT_INTER);
        let rules = c
            .tcp_check
            .as_ref()
            .map(|r: &Vec<TcpCheckRule>| probe::compile(r).into());
        Self {
            state: Arc::clone(state),
            bi,
            si,
            backend: Arc::clone(&state.backends[bi]),
            server: Arc::clone(&state.backends[bi].servers[si]),
            px_type: px_type(cfg, bi),
            inter,
            fastinter: c.fastinter.unwrap_or(inter),
            downinter: c.downinter.unwrap_or(inter),
            timeouts: probe::Timeouts::new(inter, be.timeouts.connect, be.timeouts.check),
            rules,
            agent: c.agent_check.then(|| AgentTarget {
                inter: c.agent_inter.unwrap_or(DEFAULT_INTER),
            }),
            on_marked_down_shutdown: c.on_marked_down_shutdown,
            on_marked_up_shutdown_backup: c.on_marked_up_shutdown_backup,
            send_proxy: srv.check_proxy_header().map(|v| match v {
                crate::config::ProxyVersion::V1 => crate::proxy_proto::Version::V1,
                crate::config::ProxyVersion::V2 => crate::proxy_proto::Version::V2,
            }),
            source: srv.source,
            log_health_checks: be.opts.log_health_checks,
            tls: state.tls.check_connector(bi, si).map(|connector| CheckTls {
                connector: connector.clone(),
                default: srv.check_ssl(),
                sni: c.sni.clone(),
            }),
        }
    }

    /// The server as a transition reaches it.
    pub fn site(&self) -> transition::Site<'_> {
        transition::Site {
            state: &self.state,
            bi: self.bi,
            si: self.si,
        }
    }

    /// The interval before the next health check (HAProxy's `srv_getinter`): `inter`
    /// when fully up, `downinter` when down, `fastinter` while changing.
    pub fn next_inter(&self) -> Duration {
        let s = &self.server;
        let max = s.rise() + s.fall() - 1;
        let h = s.health();
        if h >= max {
            self.inter
        } else if h == 0 && !s.is_up() {
            self.downinter
        } else {
            self.fastinter
        }
    }
}

/// HAProxy's proxy type word for backend `bi`: `proxy` for a `listen` section.
pub fn px_type(cfg: &Config, bi: usize) -> &'static str {
    let be = &cfg.backends[bi];
    if cfg
        .frontends
        .iter()
        .any(|f| f.name == be.name && f.id == be.id)
    {
        "proxy"
    } else {
        "backend"
    }
}

/// Spawn, on the calling worker, the check tasks of the servers this worker owns
/// (the `k`-th checked server of the process goes to worker `k % nbthread`). The
/// first checks are spread over one interval, as HAProxy spreads them.
pub fn spawn_for_worker(
    state: &Arc<Runtime>,
    thread_id: usize,
    nbthread: usize,
) -> Vec<TaskHandle> {
    let nbthread = nbthread.max(1);
    let mut all = Vec::new();
    for (bi, be) in state.config.backends.iter().enumerate() {
        for (si, s) in be.servers.iter().enumerate() {
            if s.check.enabled || s.check.agent_check {
                all.push((bi, si));
            }
        }
    }
    let total = all.len().max(1) as u32;
    let mut tasks = Vec::new();
    for (k, &(bi, si)) in all.iter().enumerate() {
        if k % nbthread != thread_id {
            continue;
        }
        let t = Arc::new(Target::new(state, bi, si));
        let nth = u32::try_from(k).unwrap_or(u32::MAX);
        if state.config.backends[bi].servers[si].check.enabled {
            let first = t.inter * nth / total;
            tasks.push(scheduler::spawn(
                Class::Normal,
                "check",
                health::run(Arc::clone(&t), first),
            ));
        }
        if let Some(a) = &t.agent {
            let first = a.inter * nth / total;
            tasks.push(scheduler::spawn(
                Class::Normal,
                "agent-check",
                agent::run(Arc::clone(&t), first),
            ));
        }
    }
    if !tasks.is_empty() {
        tracing::debug!(thread_id, checks = tasks.len(), "health checks started");
    }
    tasks
}

/// The OS reason of an I/O error without Rust's ` (os error N)` suffix, as HAProxy
/// prints `strerror`.
pub fn os_reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}
