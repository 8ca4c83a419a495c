//! What every selection algorithm sees: the servers, the candidate set of
//! this pick and the server to avoid, plus the shared eligibility rule.
//!
//! Owns: [`Ctx`] and [`Choice`]. Invariant: `cands` is never empty when an
//! algorithm runs, and at least one candidate differs from `exclude`
//! (`backend.rs` builds it that way).

use std::sync::Arc;

use super::server::ServerRt;

/// Inputs of one pick.
pub(crate) struct Ctx<'a> {
    pub servers: &'a [Arc<ServerRt>],
    /// Usable servers that may take this request, in config order: the
    /// active ones, or the first usable backup (every usable one with
    /// `option allbackups`) when no active one is left.
    /// Sorted by server index.
    pub cands: &'a [usize],
    /// Server to avoid (redispatch after a failed connect).
    pub exclude: Option<usize>,
}

impl Ctx<'_> {
    /// Record the candidates and their static weights in `built_from`, the
    /// set a weight table or a ring was built from; false when they are
    /// already what it holds (nothing to rebuild).
    pub fn record_weights(&self, built_from: &mut Vec<(usize, u32)>) -> bool {
        let same = built_from.len() == self.cands.len()
            && built_from
                .iter()
                .zip(self.cands)
                .all(|(&(s, w), &c)| s == c && w == self.servers[c].static_weight());
        if same {
            return false;
        }
        built_from.clear();
        built_from.extend(
            self.cands
                .iter()
                .map(|&c| (c, self.servers[c].static_weight())),
        );
        true
    }

    /// May take this connection right now: not excluded and below maxconn.
    pub fn eligible(&self, i: usize) -> bool {
        self.exclude != Some(i) && self.servers[i].has_room()
    }

    /// Current effective weight of server `i` (the user weight, scaled during a
    /// `slowstart` ramp) as a wide integer.
    pub fn weight(&self, i: usize) -> u64 {
        u64::from(self.servers[i].eweight())
    }

    /// True when server `a` is strictly less loaded than `b`, load being
    /// connections per unit of weight (compared by cross-multiplying).
    pub fn less_loaded(&self, a: usize, b: usize) -> bool {
        let la = self.servers[a].cur_conns() as u64;
        let lb = self.servers[b].cur_conns() as u64;
        // Weights are at most 256 and usable servers have weight > 0, so
        // these products cannot overflow for any realistic connection count.
        la.saturating_mul(self.weight(b)) < lb.saturating_mul(self.weight(a))
    }
}

/// Outcome of an algorithm's pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    /// This server has a free slot.
    Server(usize),
    /// Every eligible candidate is full: wait in the backend queue.
    Full,
    /// The algorithm insists on this (full) server: wait in its own queue.
    Pinned(usize),
}
