//! `balance static-rr`: weighted round robin over the static weight map.
//!
//! Weights are those of the configuration; runtime changes only matter
//! through 0 / non-0 (a weight-0 server leaves the candidate set). There is
//! no limit on the number of servers. A full or excluded server's turn is
//! skipped, so over a full cycle the proportions are exact.

use super::algo::Ctx;
use super::map::WeightMap;

#[derive(Debug, Default)]
pub(crate) struct StaticRr {
    map: WeightMap,
    pos: usize,
}

impl StaticRr {
    pub fn pick(&mut self, ctx: &Ctx<'_>) -> Option<usize> {
        self.map.refresh(ctx);
        let table = self.map.table();
        let len = table.len();
        if len == 0 {
            return None;
        }
        for k in 0..len {
            let at = (self.pos + k) % len;
            let s = table[at];
            if ctx.eligible(s) {
                self.pos = (at + 1) % len;
                return Some(s);
            }
        }
        None
    }
}
