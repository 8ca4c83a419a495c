//! What a server's transition does: the one place that logs HAProxy's `Server
//! be/srv is DOWN|UP|stopping ...` lines, rebalances the backend and shuts flows
//! down (`on-marked-down shutdown-sessions`, `on-marked-up
//! shutdown-backup-sessions`, and the former for a running server put in
//! maintenance), for every source of change: the checks, the agent, `observe
//! layer4`, the CLI and the server-state file.
//!
//! The server decides whether anything moved (`ServerRt::apply` returns a
//! [`Transition`]); this module only acts on it. Callers go through [`apply`]
//! (or hand a transition they already have to [`on`]).
//!
//! Must not: block (it runs on a worker, on the flow path for `observe layer4`)
//! or hold a lock across an await.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Outcome;
use crate::lb::{Change, OpState, ServerRt, Transition};
use crate::runtime::Runtime;

/// One server of the process, as a transition reaches it: the configuration (its
/// `on-marked-*` keywords), the backend to rebalance, the workers whose flows it
/// may shut.
#[derive(Clone, Copy)]
pub struct Site<'a> {
    pub state: &'a Runtime,
    pub bi: usize,
    pub si: usize,
}

impl Site<'_> {
    pub fn server(&self) -> &Arc<ServerRt> {
        &self.state.backends[self.bi].servers[self.si]
    }
}

/// Why a server changes state: a check's result, or an operator's words
/// (`changed from CLI`, `changed from server-state after a reload`).
#[derive(Debug, Clone, Copy)]
pub enum Cause<'a> {
    Check(&'a Outcome, Duration),
    Reason(&'a str),
}

/// Make `change` to the server of `site` and act on what it did ([`on`]). The
/// transition, if anything moved.
pub fn apply(site: &Site, change: Change, cause: &Cause) -> Option<Transition> {
    let tr = site.server().apply(change)?;
    on(site, &tr, cause);
    Some(tr)
}

/// Act on a transition of the server of `site` for `cause`: when the operational
/// state moved, restart or end the `slowstart` ramp, log it HAProxy's way (and
/// that the backend has no server left), and apply `on-marked-down
/// shutdown-sessions` / `on-marked-up shutdown-backup-sessions`; a running
/// server put in maintenance is marked down, which applies `on-marked-down
/// shutdown-sessions` too. The backend is rebalanced in every case, so queued
/// requests see the change at once.
pub fn on(site: &Site, tr: &Transition, cause: &Cause) {
    let be_rt = &site.state.backends[site.bi];
    let s = site.server();
    let cfg = &site.state.config;
    let c = &cfg.backends[site.bi].servers[site.si].check;
    let Some(now) = tr.op_moved() else {
        be_rt.rebalance();
        if tr.marked_down() && c.on_marked_down_shutdown {
            shut_flows(site.state, site.bi, vec![site.si]);
        }
        return;
    };
    match (now, c.slowstart) {
        (OpState::Up, Some(period)) if !period.is_zero() => start_slowstart(s, be_rt, period),
        // Down (or no slowstart): the next ramp starts from scratch.
        _ => {
            s.next_ramp_gen();
            s.set_ramp(100);
        }
    }
    be_rt.rebalance();
    let be = &cfg.backends[site.bi].name;
    tracing::warn!("{}", transition_message(be, s, &be_rt.servers, now, cause));
    if now != OpState::Up && !be_rt.servers.iter().any(|x| x.usable()) {
        tracing::error!(
            "{} {} has no server available!",
            super::px_type(cfg, site.bi),
            be
        );
    }
    if now == OpState::Down && c.on_marked_down_shutdown {
        shut_flows(site.state, site.bi, vec![site.si]);
    }
    if now == OpState::Up && !s.backup && c.on_marked_up_shutdown_backup {
        let backups = be_rt
            .servers
            .iter()
            .filter(|x| x.backup)
            .map(|x| x.idx)
            .collect();
        shut_flows(site.state, site.bi, backups);
    }
}

/// Ramp a server that came back UP from 1 to its full weight over `period`
/// (HAProxy's `slowstart`): the effective weight is recomputed every
/// `max(period / 20, RAMP_STEP_MIN)` (HAProxy: every `max(1 s, period / 20)`;
/// shunt steps faster so short periods ramp smoothly). A newer ramp, or the server
/// going down, ends this one.
fn start_slowstart(s: &Arc<ServerRt>, be: &Arc<crate::lb::BackendRt>, period: Duration) {
    let gen = s.next_ramp_gen();
    s.set_ramp(1);
    let (s, be) = (Arc::clone(s), Arc::clone(be));
    let step = (period / 20).max(RAMP_STEP_MIN);
    let started = Instant::now();
    crate::scheduler::spawn(crate::scheduler::Class::Normal, "slowstart", async move {
        loop {
            tokio::time::sleep(step).await;
            if s.ramp_gen() != gen || !s.is_up() {
                return;
            }
            let pct = (started.elapsed().as_millis() * 100 / period.as_millis().max(1)) as u32;
            s.set_ramp(pct.max(1));
            be.rebalance();
            if pct >= 100 {
                return;
            }
        }
    });
}

/// Shortest step of a `slowstart` ramp.
const RAMP_STEP_MIN: Duration = Duration::from_millis(100);

/// Close the flows of servers `sis` of backend `bi`, on every worker: each worker
/// aborts the flows' tasks, which closes both sockets of userspace flows and
/// deletes the sockmap entries of kernel-forwarded ones before closing them.
pub fn shut_flows(state: &Runtime, bi: usize, sis: Vec<usize>) {
    if sis.is_empty() {
        return;
    }
    let sis: Arc<[usize]> = sis.into();
    for remote in state.workers.remotes() {
        let sis = Arc::clone(&sis);
        remote.run(Box::new(move || {
            crate::stats::flows::abort_where(|v| {
                v.be == Some(bi) && v.srv.is_some_and(|x| sis.contains(&x))
            });
        }));
    }
}

/// HAProxy's `chunk_asciiencode`: non-printable bytes and `"` as `\xHH`.
pub fn ascii_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'"' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\x{b:02X}"));
        }
    }
    out
}

/// `, reason: ..., code: N, info: "...", check duration: Nms`: how a check's
/// result is told (HAProxy's `srv_append_status` for a check).
pub fn check_status(out: &Outcome, duration: Duration) -> String {
    let mut msg = format!(", reason: {}", out.status.desc());
    if out.status.has_code() {
        msg.push_str(&format!(", code: {}", out.code.unwrap_or(0)));
    }
    if !out.desc.is_empty() {
        msg.push_str(&format!(", info: \"{}\"", ascii_encode(&out.desc)));
    }
    msg.push_str(&format!(", check duration: {}ms", duration.as_millis()));
    msg
}

/// `Server be/s1 is DOWN, reason: ..., info: "...", check duration: 0ms. 1 active
/// and 0 backup servers left. 0 sessions active, 0 requeued, 0 remaining in queue.`
/// (HAProxy's `srv_update_status` + `srv_append_status`; an operator's cause is
/// written `, changed from CLI`).
pub fn transition_message(
    be: &str,
    s: &ServerRt,
    servers: &[Arc<ServerRt>],
    change: OpState,
    cause: &Cause,
) -> String {
    let mut msg = format!(
        "{}Server {be}/{} is {}",
        if s.backup { "Backup " } else { "" },
        s.name,
        change.word()
    );
    match cause {
        Cause::Check(out, duration) => msg.push_str(&check_status(out, *duration)),
        Cause::Reason(r) if !r.is_empty() => msg.push_str(&format!(", {r}")),
        Cause::Reason(_) => {}
    }
    let act = servers.iter().filter(|x| !x.backup && x.usable()).count();
    let bck = servers.iter().filter(|x| x.backup && x.usable()).count();
    let on_backup = if bck > 0 && act == 0 {
        " Running on backup."
    } else {
        ""
    };
    if change == OpState::Down {
        msg.push_str(&format!(
            ". {act} active and {bck} backup servers left.{on_backup} {} sessions active, 0 requeued, {} remaining in queue.",
            s.cur_conns(),
            s.queue_cur()
        ));
    } else {
        msg.push_str(&format!(
            ". {act} active and {bck} backup servers online.{on_backup} 0 sessions requeued, {} total in queue.",
            s.queue_cur()
        ));
    }
    msg
}
