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
        // Checks pause while the server is in maintenance (HAProxy's CHK_ST_PAUSED).
        if !t.server.is_maint() {
            let started = Instant::now();
            let out = match &t.rules {
                Some(rules) => probe::tcp_check(&t, rules).await,
                None => probe::connect_check(&t).await,
            };
            apply(&t, &out, started.elapsed());
        }
        tokio::time::sleep(t.next_inter()).await;
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
    let s = &t.server;
    if !s.transition(up) {
        return;
    }
    t.backend.rebalance();
    let be = &t.state.config.backends[t.bi].name;
    tracing::warn!(
        "{}",
        transition_message(be, s, &t.backend.servers, up, out, duration)
    );
    if !up && !t.backend.servers.iter().any(|x| x.usable()) {
        tracing::error!("{} {} has no server available!", t.px_type, be);
    }
    if !up && t.on_marked_down_shutdown {
        shut_flows(t, vec![t.si]);
    }
    if up && !s.backup && t.on_marked_up_shutdown_backup {
        let backups = t
            .backend
            .servers
            .iter()
            .filter(|x| x.backup)
            .map(|x| x.idx)
            .collect();
        shut_flows(t, backups);
    }
}

/// Close the flows of servers `sis` of the target's backend, on every worker.
fn shut_flows(t: &Target, sis: Vec<usize>) {
    if sis.is_empty() {
        return;
    }
    let bi = t.bi;
    let sis: Arc<[usize]> = sis.into();
    for remote in t.state.remotes() {
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
pub fn transition_message(
    be: &str,
    s: &ServerRt,
    servers: &[Arc<ServerRt>],
    up: bool,
    out: &Outcome,
    duration: Duration,
) -> String {
    let mut msg = format!(
        "{}Server {be}/{} is {}, reason: {}",
        if s.backup { "Backup " } else { "" },
        s.name,
        if up { "UP" } else { "DOWN" },
        out.status.desc()
    );
    if out.status.has_code() {
        msg.push_str(&format!(", code: {}", out.code.unwrap_or(0)));
    }
    if !out.desc.is_empty() {
        msg.push_str(&format!(", info: \"{}\"", ascii_encode(&out.desc)));
    }
    msg.push_str(&format!(", check duration: {}ms", duration.as_millis()));
    let act = servers.iter().filter(|x| !x.backup && x.usable()).count();
    let bck = servers.iter().filter(|x| x.backup && x.usable()).count();
    let on_backup = if bck > 0 && act == 0 {
        " Running on backup."
    } else {
        ""
    };
    if up {
        msg.push_str(&format!(
            ". {act} active and {bck} backup servers online.{on_backup} 0 sessions requeued, {} total in queue.",
            s.queue_cur()
        ));
    } else {
        msg.push_str(&format!(
            ". {act} active and {bck} backup servers left.{on_backup} {} sessions active, 0 requeued, {} remaining in queue.",
            s.cur_conns(),
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
