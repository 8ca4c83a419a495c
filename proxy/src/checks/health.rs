//! The rise/fall state machine, the health-check loop of one server, and what a
//! transition does (log, rebalance, shut flows down).
//!
//! HAProxy's rules: health runs from 0 to `rise + fall - 1`; the server is UP from
//! `rise` on. A pass adds one and, on reaching `rise`, jumps to the top; a failure
//! takes one away and, below `rise`, drops to 0 (DOWN). A failure counts in
//! `chkfail` only while health is above 0. A server starts at `rise`: up, but down
//! at the first failure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{probe, Outcome, Target};
use crate::lb::ServerRt;
use crate::runtime::Runtime;

/// What one result does to the health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub health: u32,
    /// `Some(up)` when the server changes state.
    pub transition: Option<bool>,
    /// The failure counts in `chkfail`.
    pub counted_failure: bool,
}

/// Apply one check result (`passed`) to `health` of a server that is `up`.
pub fn step(health: u32, up: bool, passed: bool, rise: u32, fall: u32) -> Step {
    let max = (rise + fall).saturating_sub(1);
    let mut h = health.min(max);
    let mut counted_failure = false;
    if passed {
        if h < max {
            h += 1;
            if h >= rise {
                h = max;
            }
        }
    } else if h > 0 {
        counted_failure = true;
        h -= 1;
        if h < rise {
            h = 0;
        }
    }
    let transition = if !up && passed && h >= rise {
        Some(true)
    } else if up && !passed && h < rise {
        Some(false)
    } else {
        None
    };
    Step {
        health: h,
        transition,
        counted_failure,
    }
}

/// The health-check loop of one server: wait, probe, apply; forever (aborted at stop).
pub async fn run(t: Arc<Target>, first: Duration) {
    tokio::time::sleep(first).await;
    loop {
        // Checks pause while the server is in maintenance (HAProxy's CHK_ST_PAUSED)
        // and after `disable health`.
        if !t.server.is_maint() && t.server.checked() {
            let started = Instant::now();
            let out = match &t.rules {
                Some(rules) => probe::tcp_check(&t, rules).await,
                None => probe::connect_check(&t).await,
            };
            apply(&t, &out, started.elapsed());
        }
        // `observe layer4` may cut the wait short: the next check then runs at
        // `fastinter` from now, as HAProxy reschedules its check task.
        tokio::select! {
            () = tokio::time::sleep(t.next_inter()) => {}
            () = t.server.check_wake.notified() => {
                tokio::time::sleep(t.fastinter).await;
            }
        }
    }
}

/// Record one health-check result and act on it.
pub fn apply(t: &Target, out: &Outcome, duration: Duration) {
    let s = &t.server;
    s.record_check(out.status, out.code, duration, &out.desc);
    let Some(passed) = out.status.passed() else {
        return;
    };
    let st = step(s.health(), s.is_up(), passed, s.rise(), s.fall());
    s.set_health(st.health);
    if st.counted_failure {
        s.count_chkfail();
    }
    if let Some(up) = st.transition {
        // The agent's `down` keeps the server down whatever the health check says.
        if up && s.is_agent_down() {
            return;
        }
        set_state(t, up, out, duration);
    }
}

/// Mark the server UP or DOWN for `out`, log it HAProxy's way, and apply the effects.
pub fn set_state(t: &Target, up: bool, out: &Outcome, duration: Duration) {
    let change = if up { Change::Up } else { Change::Down };
    mark(&t.site(), change, &Cause::Check(out, duration));
}

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

/// The operational states a server moves between (HAProxy's RUNNING, STOPPED,
/// STOPPING).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Up,
    Down,
    /// Up, but no new traffic (`set server B/S health stopping`).
    Stopping,
}

impl Change {
    fn word(self) -> &'static str {
        match self {
            Change::Up => "UP",
            Change::Down => "DOWN",
            Change::Stopping => "stopping",
        }
    }
}

/// Move the server of `site` to `change` for `cause`: log it HAProxy's way, rebalance,
/// and apply `on-marked-down shutdown-sessions` / `on-marked-up
/// shutdown-backup-sessions`. False (and nothing done) when it already was there.
/// The caller checks maintenance (HAProxy ignores forced changes then).
pub fn mark(site: &Site, change: Change, cause: &Cause) -> bool {
    let be_rt = &site.state.backends[site.bi];
    let s = site.server();
    let changed = match change {
        Change::Up => {
            let was_stopping = s.is_stopping();
            s.set_stopping(false);
            s.transition(true) || was_stopping
        }
        Change::Down => s.transition(false),
        Change::Stopping => {
            if s.is_up() && s.is_stopping() {
                false
            } else {
                s.transition(true);
                s.set_stopping(true);
                true
            }
        }
    };
    if !changed {
        return false;
    }
    let slowstart = site.state.config.backends[site.bi].servers[site.si]
        .check
        .slowstart;
    match (change, slowstart) {
        (Change::Up, Some(period)) if !period.is_zero() => start_slowstart(s, be_rt, period),
        // Down (or no slowstart): the next ramp starts from scratch.
        _ => {
            s.next_ramp_gen();
            s.set_ramp(100);
        }
    }
    be_rt.rebalance();
    let cfg = &site.state.config;
    let be = &cfg.backends[site.bi].name;
    tracing::warn!(
        "{}",
        transition_message(be, s, &be_rt.servers, change, cause)
    );
    if change != Change::Up && !be_rt.servers.iter().any(|x| x.usable()) {
        tracing::error!(
            "{} {} has no server available!",
            super::px_type(cfg, site.bi),
            be
        );
    }
    let c = &cfg.backends[site.bi].servers[site.si].check;
    if change == Change::Down && c.on_marked_down_shutdown {
        shut_flows(site.state, site.bi, vec![site.si]);
    }
    if change == Change::Up && !s.backup && c.on_marked_up_shutdown_backup {
        let backups = be_rt
            .servers
            .iter()
            .filter(|x| x.backup)
            .map(|x| x.idx)
            .collect();
        shut_flows(site.state, site.bi, backups);
    }
    true
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

/// `Server be/s1 is DOWN, reason: ..., info: "...", check duration: 0ms. 1 active
/// and 0 backup servers left. 0 sessions active, 0 requeued, 0 remaining in queue.`
/// (HAProxy's `srv_update_status` + `srv_append_status`; an operator's cause is
/// written `, changed from CLI`).
pub fn transition_message(
    be: &str,
    s: &ServerRt,
    servers: &[Arc<ServerRt>],
    change: Change,
    cause: &Cause,
) -> String {
    let mut msg = format!(
        "{}Server {be}/{} is {}",
        if s.backup { "Backup " } else { "" },
        s.name,
        change.word()
    );
    match cause {
        Cause::Check(out, duration) => {
            msg.push_str(&format!(", reason: {}", out.status.desc()));
            if out.status.has_code() {
                msg.push_str(&format!(", code: {}", out.code.unwrap_or(0)));
            }
            if !out.desc.is_empty() {
                msg.push_str(&format!(", info: \"{}\"", ascii_encode(&out.desc)));
            }
            msg.push_str(&format!(", check duration: {}ms", duration.as_millis()));
        }
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
    if change == Change::Down {
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

/// A failure as the agent's `down` reports it: health to 0 at once.
pub fn agent_down(t: &Target, out: &Outcome, duration: Duration) {
    let s = &t.server;
    if s.health() > 0 {
        s.count_chkfail();
    }
    s.set_health(0);
    if s.is_up() {
        set_state(t, false, out, duration);
    }
}

/// The agent's `up`: health to the top, and UP.
pub fn agent_up(t: &Target, out: &Outcome, duration: Duration) {
    let s = &t.server;
    s.set_health(s.rise() + s.fall());
    if !s.is_up() {
        set_state(t, true, out, duration);
    }
}
