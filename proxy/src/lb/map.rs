//! The static weight map shared by `static-rr` and `source` (HAProxy's
//! map-based algorithms).
//!
//! The map is a table of W = sum(static weights) entries in which every
//! candidate appears as many times as its weight, interleaved smoothly.
//! It is rebuilt only when the candidate set changes, so the position of a
//! client hash or of the round-robin cursor means the same server for as long
//! as the server set is unchanged.

use super::algo::Ctx;

#[derive(Debug, Default)]
pub(crate) struct WeightMap {
    /// (server, static weight) the table was built from.
    built_from: Vec<(usize, u32)>,
    table: Vec<usize>,
}

impl WeightMap {
    /// Rebuild the table if the candidate set (or a static weight) changed.
    /// Returns true when it was rebuilt.
    pub fn refresh(&mut self, ctx: &Ctx<'_>) -> bool {
        if !ctx.record_weights(&mut self.built_from) {
            return false;
        }
        self.table = interleave(&self.built_from);
        true
    }

    pub fn table(&self) -> &[usize] {
        &self.table
    }
}

/// Lay out `weights` so each server appears `weight` times, spread evenly:
/// at each step every server earns its weight and the richest one is placed
/// and pays the total back.
fn interleave(weights: &[(usize, u32)]) -> Vec<usize> {
    let total: i64 = weights.iter().map(|&(_, w)| i64::from(w)).sum();
    let mut credit = vec![0i64; weights.len()];
    let mut table = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    for _ in 0..total {
        let mut best = 0;
        for (k, &(_, w)) in weights.iter().enumerate() {
            credit[k] += i64::from(w);
            if credit[k] > credit[best] {
                best = k;
            }
        }
        credit[best] -= total;
        table.push(weights[best].0);
    }
    table
}
