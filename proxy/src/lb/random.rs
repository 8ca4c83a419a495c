//! `balance random`: weighted random with two draws ("power of two
//! choices"): two servers are drawn in proportion to their weights and the
//! less loaded of the two (connections per unit of weight) wins; on a tie
//! the first draw wins, so an idle farm is served in weight proportions.

use rand::Rng;

use super::algo::Ctx;

/// Number of draws, as HAProxy's default `random(2)`.
const DRAWS: usize = 2;

pub(crate) fn pick(ctx: &Ctx<'_>) -> Option<usize> {
    let eligible: Vec<usize> = ctx
        .cands
        .iter()
        .copied()
        .filter(|&i| ctx.eligible(i))
        .collect();
    let total: u64 = eligible.iter().map(|&i| ctx.weight(i)).sum();
    if total == 0 {
        return None;
    }
    let mut rng = rand::thread_rng();
    let mut best: Option<usize> = None;
    for _ in 0..DRAWS {
        let mut at = rng.gen_range(0..total);
        let mut drawn = None;
        for &i in &eligible {
            let w = ctx.weight(i);
            if at < w {
                drawn = Some(i);
                break;
            }
            at -= w;
        }
        let Some(d) = drawn else { continue };
        if best.is_none_or(|b| ctx.less_loaded(d, b)) {
            best = Some(d);
        }
    }
    best
}
