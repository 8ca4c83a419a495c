//! The agent check: its reply words and what they do.
//!
//! The agent answers one line of words separated by spaces, tabs or commas, in any
//! order, the last of a kind winning, optionally ended by `#` and a description
//! (HAProxy's `agent-check` documentation):
//! - health: `up` (fully up), `down`, `stopped`, `fail` (DOWN at once, shown as
//!   `DOWN (agent)` until the agent says `up`);
//! - admin: `ready` (leave drain and maintenance), `drain` (no new traffic, the
//!   weight is kept), `maint` (maintenance);
//! - `N%`: the weight becomes N% of the configured weight;
//! - `maxconn:N`: becomes the server's connection limit (as `set maxconn server`);
//! - anything else is reported (`agent reports an error : WORD`).
//!
//! A failure to reach the agent changes nothing, as in HAProxy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::transition::{self, Cause};
use super::{probe, Outcome, Status, Target};
use crate::lb::{Change, ServerRt, Transition, MAX_WEIGHT};

/// The agent's health word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentHealth {
    Up,
    Down,
    Stopped,
    Fail,
}

/// The agent's admin word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentAdmin {
    Ready,
    Drain,
    Maint,
}

/// One parsed agent line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reply {
    /// With the word as the agent wrote it (for the info text).
    pub health: Option<(AgentHealth, String)>,
    pub admin: Option<AgentAdmin>,
    /// The last `N%` word, as written.
    pub weight: Option<String>,
    /// The value after the last `maxconn:`.
    pub maxconn: Option<String>,
    /// The first word not understood.
    pub error: Option<String>,
    /// The text after `#`.
    pub desc: String,
}

/// Parse one agent line (without its line end).
pub fn parse(line: &str) -> Reply {
    let mut r = Reply::default();
    let mut rest = line;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            break;
        }
        if let Some(d) = rest.strip_prefix('#') {
            r.desc = d.trim_start_matches([' ', '\t']).to_string();
            break;
        }
        let end = rest.find([' ', '\t', ',']).unwrap_or(rest.len());
        let (word, tail) = rest.split_at(end);
        rest = tail;
        let lower = word.to_ascii_lowercase();
        match lower.as_str() {
            "up" => r.health = Some((AgentHealth::Up, word.to_string())),
            "down" => r.health = Some((AgentHealth::Down, word.to_string())),
            "stopped" => r.health = Some((AgentHealth::Stopped, word.to_string())),
            "fail" => r.health = Some((AgentHealth::Fail, word.to_string())),
            "ready" => r.admin = Some(AgentAdmin::Ready),
            "drain" => r.admin = Some(AgentAdmin::Drain),
            "maint" => r.admin = Some(AgentAdmin::Maint),
            _ if word.starts_with(|c: char| c.is_ascii_digit()) && word.contains('%') => {
                r.weight = Some(word.to_string());
            }
            _ if lower.starts_with("maxconn:") => {
                r.maxconn = Some(word["maxconn:".len()..].to_string());
            }
            _ => {
                if r.error.is_none() {
                    r.error = Some(word.to_string());
                }
            }
        }
    }
    r
}

/// The weight `N%` asks for: N% of the configured weight, capped at 256. `Err` with
/// HAProxy's warning for a malformed value.
pub fn percent_weight(word: &str, initial: u32) -> Result<u32, &'static str> {
    let digits = word.trim_end_matches('%');
    if digits.len() + 1 != word.len() {
        return Err("Trailing garbage in weight string");
    }
    let pct: u64 = digits
        .parse()
        .map_err(|_| "Trailing garbage in weight string")?;
    let w = u64::from(initial) * pct / 100;
    Ok(u32::try_from(w.min(u64::from(MAX_WEIGHT))).unwrap_or(MAX_WEIGHT))
}

/// What applying a reply's settings did: the server's transitions, for the caller
/// to hand to [`super::transition::on`], and the first warning.
#[derive(Debug, Default)]
pub struct Settings {
    pub transitions: Vec<Transition>,
    pub warning: Option<String>,
}

/// Apply the admin, weight and maxconn words to `s` (the first two as
/// [`Change`]s).
pub fn apply_settings(s: &ServerRt, r: &Reply, config_disabled: bool) -> Settings {
    let mut out = Settings::default();
    let mut apply = |c| out.transitions.extend(s.apply(c));
    match r.admin {
        Some(AgentAdmin::Drain) => apply(Change::AgentDrain(true)),
        Some(AgentAdmin::Maint) => apply(Change::AgentMaint(true)),
        Some(AgentAdmin::Ready) => {
            apply(Change::AgentDrain(false));
            // `disabled` in the configuration stays (HAProxy's CMAINT).
            if !config_disabled {
                apply(Change::AgentMaint(false));
            }
        }
        None => {}
    }
    let mut warning = None;
    if let Some(w) = &r.weight {
        match percent_weight(w, s.initial_weight()) {
            Ok(w) => apply(Change::Weight(w)),
            Err(msg) => warning = Some(msg.to_string()),
        }
    }
    if let Some(m) = &r.maxconn {
        match m.parse::<usize>() {
            Ok(n) => {
                // HAProxy's agent sets the server's maxconn itself; the caller
                // rebalances so queued requests see raised room.
                s.set_agent_maxconn(n);
                s.set_maxconn(n);
            }
            Err(_) => {
                warning.get_or_insert_with(|| "Trailing garbage in maxconn string".to_string());
            }
        }
    }
    out.warning = warning;
    out
}

/// The status and info HAProxy records for a reply (`via agent : down (desc)`, ...).
pub fn outcome(r: &Reply, warning: Option<&str>) -> Outcome {
    if let Some((h, word)) = &r.health {
        let status = if *h == AgentHealth::Up {
            Status::L7Ok
        } else {
            Status::L7Sts
        };
        let mut msg = r.desc.as_str();
        if msg.is_empty() || status == Status::L7Ok {
            if let Some(e) = r.error.as_deref() {
                msg = e;
            } else if let Some(w) = warning {
                msg = w;
            }
        }
        let desc = if msg.is_empty() {
            format!("via agent : {word}")
        } else {
            format!("via agent : {word} ({msg})")
        };
        return Outcome {
            status,
            code: Some(0),
            desc,
        };
    }
    let desc = if let Some(e) = &r.error {
        format!("agent reports an error : {e}")
    } else if let Some(w) = warning {
        format!("agent warns : {w}")
    } else {
        String::new()
    };
    Outcome::new(Status::Checked, desc)
}

/// The agent loop of one server.
pub async fn run(t: Arc<Target>, first: Duration) {
    let Some(a) = t.agent.clone() else {
        return;
    };
    tokio::time::sleep(first).await;
    let disabled = t.state.config.backends[t.bi].servers[t.si].disabled;
    loop {
        // `disable agent` pauses the agent (maintenance does not: the agent's
        // `ready` is what ends the maintenance its `maint` started).
        if !t.server.agent_enabled() {
            tokio::time::sleep(a.inter).await;
            continue;
        }
        let started = Instant::now();
        match probe::agent_line(&t).await {
            Ok(line) => {
                let reply = parse(&line);
                let settings = apply_settings(&t.server, &reply, disabled);
                let out = outcome(&reply, settings.warning.as_deref());
                let took = started.elapsed();
                let cause = Cause::Check(&out, took);
                for tr in &settings.transitions {
                    transition::on(&t.site(), tr, &cause);
                }
                if let Some((h, _)) = reply.health {
                    let up = h == AgentHealth::Up;
                    transition::apply(&t.site(), Change::AgentHealth { up }, &cause);
                }
                // For a changed `maxconn:N` (raised room lets queued requests in).
                t.backend.rebalance();
                tracing::debug!(server = %t.server.name, reply = %line, desc = %out.desc, "agent check");
            }
            Err(why) => {
                tracing::debug!(server = %t.server.name, %why, "agent check: no usable reply");
            }
        }
        tokio::time::sleep(a.inter).await;
    }
}
