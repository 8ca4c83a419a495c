//! `hash-type consistent`: the ring a hash-based `balance` (`source`) looks
//! a key up in, so that a server leaving or joining moves only its own keys.
//!
//! Each candidate server owns `static weight × POINTS_PER_WEIGHT` points on
//! a 32-bit ring; a point's position is a hash of the server's numeric id
//! (`id`, stable across reloads and independent of the other servers) and of
//! the point's number. A key belongs to the first point at or after it,
//! wrapping at the end. Removing a server deletes its points only: every
//! key that was on another server stays there; its own keys spread over
//! the others in proportion to their points. Adding it back restores the
//! same points, so the same keys come back.
//!
//! The ring is rebuilt only when the candidate set or a static weight
//! changes (as the map of `map.rs`); a lookup is a binary search.

use super::algo::Ctx;

/// Points per unit of weight: enough that four servers of weight 1 share
/// the ring within a few percent of a quarter each, few enough that a
/// weight of 256 stays a small table (8192 points).
const POINTS_PER_WEIGHT: u32 = 32;

#[derive(Debug, Default)]
pub(crate) struct Ring {
    /// (server index, static weight) the ring was built from.
    built_from: Vec<(usize, u32)>,
    /// (position, server index), sorted by position.
    points: Vec<(u32, usize)>,
}

impl Ring {
    /// Rebuild the ring if the candidate set (or a static weight) changed.
    /// Returns true when it was rebuilt.
    pub fn refresh(&mut self, ctx: &Ctx<'_>) -> bool {
        if !ctx.record_weights(&mut self.built_from) {
            return false;
        }
        self.points.clear();
        for &(s, w) in &self.built_from {
            let id = ctx.servers[s].id;
            for n in 0..w.saturating_mul(POINTS_PER_WEIGHT) {
                self.points.push((point(id, n), s));
            }
        }
        // Two points on one position (rare): the lower server index first,
        // so the order does not depend on the build order.
        self.points.sort_unstable();
        true
    }

    /// The server owning `key`: the first point at or after it (wrapping)
    /// whose server is not `exclude`. `None` when the ring is empty or holds
    /// only `exclude`.
    pub fn lookup(&self, key: u32, exclude: Option<usize>) -> Option<usize> {
        let start = self.points.partition_point(|&(p, _)| p < key);
        let len = self.points.len();
        (0..len)
            .map(|k| self.points[(start + k) % len].1)
            .find(|&s| Some(s) != exclude)
    }
}

/// The position of point `n` of the server with id `id`: a 64-bit mix of
/// both (splitmix64's finaliser), folded to 32 bits.
fn point(id: u32, n: u32) -> u32 {
    let mut x = (u64::from(id) << 32) | u64::from(n);
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    (x ^ (x >> 32)) as u32
}
