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
    t.server
        .record_check(out.status, out.code, duration, &out.desc);
    if let Some(passed) = out.status.passed() {
        transition::apply(
            &t.site(),
            Change::Check { passed },
            &Cause::Check(out, duration),
        );
    }
}
