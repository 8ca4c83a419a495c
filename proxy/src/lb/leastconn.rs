//! `balance leastconn`: the server with the fewest connections per unit of
//! weight; servers tied for the lowest load take turns (round robin).
//!
//! Invariant: `next` is the server index the tie-break starts from; after a
//! pick it points just past the chosen server.

use super::algo::Ctx;

#[derive(Debug, Default)]
pub(crate) struct LeastConn {
    next: usize,
}

impl LeastConn {
    pub fn pick(&mut self, ctx: &Ctx<'_>) -> Option<usize> {
        let n = ctx.cands.len();
        // Start the scan at the first candidate at or after `next`, so the
        // first of several equally loaded servers in that order wins.
        let start = ctx.cands.iter().position(|&i| i >= self.next).unwrap_or(0);
        let mut best: Option<usize> = None;
        for k in 0..n {
            let i = ctx.cands[(start + k) % n];
            if !ctx.eligible(i) {
                continue;
            }
            if best.is_none_or(|b| ctx.less_loaded(i, b)) {
                best = Some(i);
            }
        }
        let b = best?;
        self.next = b + 1;
        Some(b)
    }
}
