//! The admin form of the stats page: `b` (the backend, `#ID` or a name), `s` (the
//! checked servers, repeated) and `action` (HAProxy's values: `ready`, `drain`,
//! `maint`, `dhlth`, `ehlth`, `hrunn`, `hnolb`, `hdown`, `dagent`, `eagent`,
//! `arunn`, `adown`, `shutdown`; and shunt's `weight`, with a `weight` field).
//!
//! Owns the mapping from an action to the CLI command it stands for and the
//! status the page reports. Must not change state itself: each command is parsed
//! by `cli::command` and run by `cli::dispatch` at the admin level, on worker 0,
//! exactly as if typed on the stats socket (`shutdown sessions server`, which the
//! workers answer, through `dispatch_workers`).

use std::sync::Arc;

use crate::cli::command::{self, Parsed};
use crate::cli::dispatch;
use crate::cli::frame::Request;
use crate::cli::{Ctx, Session};
use crate::config::CliLevel;

/// Servers one POST may name (HAProxy stops where its buffer ends: `EXCD`).
pub const MAX_SERVERS: usize = 1024;
/// The CLI session timeout a form's commands run with (they never wait for input).
const SESSION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the page says about the last action (`;st=...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Every checked server took the action.
    Done,
    /// Some did.
    Part,
    /// No server was checked.
    None,
    /// A bad action, backend or server names.
    Errp,
    /// The form was larger than the page reads.
    Excd,
    /// The client may not administer.
    Deny,
}

impl Status {
    pub fn code(self) -> &'static str {
        match self {
            Status::Done => "DONE",
            Status::Part => "PART",
            Status::None => "NONE",
            Status::Errp => "ERRP",
            Status::Excd => "EXCD",
            Status::Deny => "DENY",
        }
    }

    /// The banner for `;st=CODE`: its CSS class and text (`None` for an unknown code).
    pub fn banner(code: &str) -> Option<(&'static str, &'static str)> {
        Some(match code {
            "DONE" => ("active_up", "Action processed successfully."),
            "PART" => (
                "active_going_down",
                "Action partially processed: some server names are probably unknown.",
            ),
            "NONE" => ("active_going_up", "Nothing has changed."),
            "ERRP" => (
                "active_down",
                "Action not processed because of invalid parameters: an unknown action, backend or server.",
            ),
            "EXCD" => (
                "active_down",
                "Action not processed: the form was too large. Retry with fewer servers at a time.",
            ),
            "DENY" => ("active_down", "Action denied."),
            _ => return None,
        })
    }
}

/// The command words an action stands for, for server `target` (`B/S`).
fn command_words(action: &str, target: &str, weight: Option<&str>) -> Option<Vec<String>> {
    let words: Vec<&str> = match action {
        "ready" => vec!["set", "server", target, "state", "ready"],
        "drain" => vec!["set", "server", target, "state", "drain"],
        "maint" => vec!["set", "server", target, "state", "maint"],
        "dhlth" => vec!["disable", "health", target],
        "ehlth" => vec!["enable", "health", target],
        "hrunn" => vec!["set", "server", target, "health", "up"],
        "hnolb" => vec!["set", "server", target, "health", "stopping"],
        "hdown" => vec!["set", "server", target, "health", "down"],
        "dagent" => vec!["disable", "agent", target],
        "eagent" => vec!["enable", "agent", target],
        "arunn" => vec!["set", "server", target, "agent", "up"],
        "adown" => vec!["set", "server", target, "agent", "down"],
        "shutdown" => vec!["shutdown", "sessions", "server", target],
        "weight" => vec!["set", "server", target, "weight", weight?],
        _ => return None,
    };
    Some(words.into_iter().map(str::to_string).collect())
}

/// Apply a form's action to its servers; the status the page then shows.
pub async fn apply(ctx: &Arc<Ctx>, body: &[u8]) -> Status {
    let (mut backend, mut action, mut weight) = (None, None, None);
    let mut servers = Vec::new();
    for (k, v) in form_urlencoded::parse(body) {
        match &*k {
            "b" => backend = Some(v.into_owned()),
            "s" => servers.push(v.into_owned()),
            "action" => action = Some(v.into_owned()),
            "weight" => weight = Some(v.into_owned()),
            _ => {}
        }
    }
    let (Some(backend), Some(action)) = (backend, action) else {
        return Status::Errp;
    };
    if servers.len() > MAX_SERVERS {
        return Status::Excd;
    }
    if command_words(&action, "-", Some("0")).is_none() {
        return Status::Errp;
    }
    if servers.is_empty() {
        return Status::None;
    }
    let mut done = 0;
    for s in &servers {
        let target = format!("{backend}/{s}");
        let Some(words) = command_words(&action, &target, weight.as_deref()) else {
            continue;
        };
        let parsed = command::parse(&Request {
            words,
            payload: None,
        });
        if run(ctx, parsed).await {
            done += 1;
        }
    }
    match done {
        0 => Status::Errp,
        n if n == servers.len() => Status::Done,
        _ => Status::Part,
    }
}

/// Run one admin command as the stats socket would; whether it succeeded.
async fn run(ctx: &Arc<Ctx>, parsed: Parsed) -> bool {
    let sess = Session::new(CliLevel::Admin, SESSION_TIMEOUT);
    if parsed.on_workers() {
        return !dispatch::dispatch_workers(ctx, &sess, parsed)
            .await
            .is_err();
    }
    // State changes run on worker 0, where the scheduler lives (a transition may
    // start a `slowstart` task), as the stats socket's do.
    let Some(remote) = ctx.state.workers.remotes().into_iter().next() else {
        return false;
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let worker_ctx = Arc::clone(ctx);
    remote.run(Box::new(move || {
        let mut sess = sess;
        let ok = !dispatch::dispatch(&worker_ctx, &mut sess, parsed).is_err();
        let _ = tx.send(ok);
    }));
    rx.await.unwrap_or(false)
}
