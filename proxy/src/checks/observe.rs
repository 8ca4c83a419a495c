//! `observe layer4`: live traffic feeds the server's health (HAProxy's
//! `__health_adjust` for the L4 results).
//!
//! Owns the consecutive-error run of a server with `observe layer4`: each
//! connection result of a flow is reported here ([`report`]); a success clears the
//! run; `error-limit` consecutive errors (default 10) act as `on-error` says:
//! `fastinter` (only the next check comes sooner), `fail-check` (one failed check),
//! `sudden-death` (health set to one above DOWN, then one failed check) or
//! `mark-down` (DOWN at once). Every action records the `HANA` check status
//! ("Health analyze", `Detected N consecutive errors, last one was: ...`), counts in
//! `hanafail`, clears the run and brings the next health check forward to
//! `fastinter` from now.
//!
//! Must not: block or take a lock held across an await (called on the flow path).

use std::time::Duration;

use super::transition::{self, Cause, Site};
use super::{Outcome, Status};
use crate::config::OnError;
use crate::lb::Change;
use crate::runtime::Runtime;

/// HAProxy's default `error-limit`.
pub const DEFAULT_ERROR_LIMIT: u32 = 10;

/// HAProxy's description of an unsuccessful L4 connection.
pub const L4_ERROR: &str = "L4 unsuccessful connection";

/// One connection result of server `si` of backend `bi` on live traffic.
pub fn report(state: &Runtime, bi: usize, si: usize, ok: bool) {
    let cfg = &state.config.backends[bi].servers[si].check;
    if !cfg.observe_layer4 {
        return;
    }
    let s = &state.backends[bi].servers[si];
    if ok {
        s.observe_reset();
        return;
    }
    let n = s.observe_error();
    let limit = cfg.error_limit.unwrap_or(DEFAULT_ERROR_LIMIT).max(1);
    if n < limit {
        return;
    }
    let out = Outcome::new(
        Status::Hana,
        format!("Detected {n} consecutive errors, last one was: {L4_ERROR}"),
    );
    let failure = |from: u32| {
        s.record_check(out.status, None, Duration::ZERO, &out.desc);
        transition::apply(
            &Site { state, bi, si },
            Change::Observed { from },
            &Cause::Check(&out, Duration::ZERO),
        );
    };
    match cfg.on_error.unwrap_or_default() {
        OnError::Fastinter => {}
        OnError::FailCheck => failure(s.health()),
        OnError::SuddenDeath => failure(if s.health() > s.rise() {
            s.rise() + 1
        } else {
            s.health()
        }),
        OnError::MarkDown => failure(s.rise()),
    }
    s.observe_reset();
    s.count_hanafail();
    s.check_wake.notify_waiters();
}
