//! `balance roundrobin`: dynamic weighted round robin.
//!
//! Each pick adds every eligible server's *current* weight to its credit and
//! takes the server with the most credit, which then pays back the sum of the
//! weights. Over any window of W = sum(weights) picks each server is chosen
//! in proportion to its weight, and a heavy server's turns are spread out
//! instead of bunched together. Weight changes apply on the next pick.
//!
//! Invariant: credits of eligible servers sum to zero after each pick; a
//! server that leaves the candidate set loses its credit so it rejoins fresh.

use super::algo::Ctx;

#[derive(Debug)]
pub(crate) struct RoundRobin {
    credit: Vec<i64>,
}

impl RoundRobin {
    pub fn new(nservers: usize) -> Self {
        Self {
            credit: vec![0; nservers],
        }
    }

    /// Next server with a free slot, or `None` when all candidates are full.
    pub fn pick(&mut self, ctx: &Ctx<'_>) -> Option<usize> {
        // `cands` is sorted by index: walk it alongside the credits.
        let mut next_cand = ctx.cands.iter().peekable();
        for (i, c) in self.credit.iter_mut().enumerate() {
            if next_cand.peek() == Some(&&i) {
                next_cand.next();
            } else {
                *c = 0;
            }
        }
        let mut total: i64 = 0;
        let mut best: Option<usize> = None;
        for &i in ctx.cands {
            if !ctx.eligible(i) {
                continue;
            }
            let w = ctx.weight(i) as i64;
            self.credit[i] += w;
            total += w;
            if best.is_none_or(|b| self.credit[i] > self.credit[b]) {
                best = Some(i);
            }
        }
        let b = best?;
        self.credit[b] -= total;
        Some(b)
    }
}
