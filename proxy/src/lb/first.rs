//! `balance first`: the server with the lowest id that still has a free
//! connection slot takes the connection. Weights are ignored (beyond 0 making
//! a server unusable); a server without maxconn is never full, so it takes
//! everything.

use super::algo::Ctx;

pub(crate) fn pick(ctx: &Ctx<'_>) -> Option<usize> {
    ctx.cands
        .iter()
        .copied()
        .filter(|&i| ctx.eligible(i))
        .min_by_key(|&i| ctx.servers[i].id)
}
