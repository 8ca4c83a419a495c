//! The health-check loop of one server: probe, record, and hand the result to the
//! server as a `Change::Check` (what a transition then does is
//! [`super::transition`]'s).
//!
//! HAProxy's rules, which the server runs (`crate::lb::status::step`): health runs from 0 to `rise + fall - 1`; the server is UP from
//! `rise` on. A pass adds one and, on reaching `rise`, jumps to the top; a failure
//! takes one away and, below `rise`, drops to 0 (DOWN). A failure counts in
//! `chkfail` only while health is above 0. A server starts at `rise`: up, but down
//! at the first failure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::transition::{self, Cause};
use super::{probe, Outcome, Target};
use crate::lb::Change;

pub use crate::lb::status::{step, Step};

/// The health-check loop of one server: wait, probe, apply; forever (aborted at stop).
pub async fn run(t: Arc<Target>, first: Duration) {
    tokio::time::sleep(first).await;
    loop {
        // Checks pause while the server is in maintenance (HAProxy's CHK_ST_PAUSED)
        // and after `disable health`.
        if !t.server.is_maint() && t.server.checked() {
            let started = Instant::now();
            t.server.check_started();
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
    let prev = t.server.check_report().status;
    t.server
        .record_check(out.status, out.code, duration, &out.desc);
    if let Some(passed) = out.status.passed() {
        if t.log_health_checks {
            let s = &t.server;
            let was = Health {
                health: s.health(),
                up: s.is_up(),
                rise: s.rise(),
                fall: s.fall(),
            };
            if let Some(line) = health_log_line(t, out, duration, prev, was, passed) {
                // Before the transition's own line, as HAProxy logs them.
                tracing::warn!("{line}");
            }
        }
        transition::apply(
            &t.site(),
            Change::Check { passed },
            &Cause::Check(out, duration),
        );
    }
}

/// A server's rise/fall position before a check result is applied.
#[derive(Debug, Clone, Copy)]
pub struct Health {
    pub health: u32,
    pub up: bool,
    pub rise: u32,
    pub fall: u32,
}

/// `option log-health-checks`: HAProxy's line for a check result, when it is
/// worth one: the result moved the health (a failure while above 0, a pass
/// while below the top) or its status differs from the previous check's.
/// `Health check for [backup ]server BE/SRV succeeded|failed, reason: ...,
/// check duration: Nms, status: X/Y UP|DOWN.`, where X/Y is how far the
/// server is along `fall` (UP) or `rise` (DOWN) after this result.
pub fn health_log_line(
    t: &Target,
    out: &Outcome,
    duration: Duration,
    prev: Option<super::Status>,
    was: Health,
    passed: bool,
) -> Option<String> {
    let top = (was.rise + was.fall).saturating_sub(1);
    let moved = if passed {
        was.health != top
    } else {
        was.health != 0
    };
    if !moved && prev == Some(out.status) {
        return None;
    }
    let h = step(was.health, was.up, passed, was.rise, was.fall).health;
    let (at, of, word) = if h >= was.rise {
        let word = if t.server.weight() == 0 {
            "DRAIN"
        } else {
            "UP"
        };
        (h - was.rise + 1, was.fall, word)
    } else {
        (h, was.rise, "DOWN")
    };
    let be = &t.state.config.backends[t.bi].name;
    Some(format!(
        "Health check for {}server {be}/{} {}{}, status: {at}/{of} {word}.",
        if t.server.backup { "backup " } else { "" },
        t.server.name,
        if passed { "succeeded" } else { "failed" },
        transition::check_status(out, duration),
    ))
}
