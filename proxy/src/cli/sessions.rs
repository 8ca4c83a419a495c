//! The CLI's door to the workers' flow registries (`stats::flows`).
//!
//! Owns the cross-thread round trips of `show sess` and `shutdown session(s)`: each
//! request is a job sent with `scheduler::Remote::run` to the worker that owns the
//! flows; the job reads or aborts entries there and answers through a oneshot
//! channel. Nothing here touches a registry from another thread.
//!
//! Invariants: a gather returns at most `flows::GATHER_CHUNK` flows, so a dump of
//! any number of flows holds one chunk at a time; a worker that has stopped answers
//! nothing (its job is dropped, the channel closes) and counts as having no flows.

use crate::scheduler::Remote;
use crate::stats::flows::{self, FlowView};

/// Up to `max` flows of the worker behind `remote` with ids above `after`.
pub async fn gather(remote: &Remote, after: Option<u64>, max: usize) -> Vec<FlowView> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    remote.run(Box::new(move || {
        let _ = tx.send(flows::gather(after, max));
    }));
    rx.await.unwrap_or_default()
}

/// Abort the flows of the worker behind `remote` that `pick` selects; how many.
pub async fn abort_where<F>(remote: &Remote, pick: F) -> usize
where
    F: Fn(&FlowView) -> bool + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    remote.run(Box::new(move || {
        let _ = tx.send(flows::abort_where(pick));
    }));
    rx.await.unwrap_or(0)
}

/// Parse a `shutdown session` id as HAProxy prints it (`0x…`, hex).
pub fn parse_id(word: &str) -> Option<u64> {
    let hex = word
        .strip_prefix("0x")
        .or_else(|| word.strip_prefix("0X"))
        .unwrap_or(word);
    u64::from_str_radix(hex, 16).ok()
}
