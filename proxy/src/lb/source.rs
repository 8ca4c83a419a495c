//! `balance source`: hash of the client IP address, looked up in the static
//! weight map (`hash-type map-based`, the default: `hash % total weight`) or
//! on the consistent-hash ring (`hash-type consistent`, `chash.rs`), so a
//! client keeps its server for as long as the server set is unchanged (and,
//! with `consistent`, while other servers come and go).
//!
//! The chosen server is sticky: when it is full the request waits in that
//! server's own queue (bounded by its `maxqueue`) rather than going
//! elsewhere. When it is excluded (redispatch) the next map entry (or ring
//! point) that is not excluded is used.

use std::net::{IpAddr, SocketAddr};

use super::algo::{Choice, Ctx};
use super::chash::Ring;
use super::map::WeightMap;
use crate::config::HashType;

#[derive(Debug)]
pub(crate) enum Source {
    Map(WeightMap),
    Ring(Ring),
}

impl Source {
    pub fn new(hash_type: HashType) -> Self {
        match hash_type {
            HashType::MapBased => Source::Map(WeightMap::default()),
            HashType::Consistent => Source::Ring(Ring::default()),
        }
    }

    pub fn pick(&mut self, ctx: &Ctx<'_>, client: SocketAddr) -> Option<Choice> {
        let h = hash_ip(client.ip());
        let s = match self {
            Source::Map(map) => {
                map.refresh(ctx);
                let table = map.table();
                let len = table.len();
                if len == 0 {
                    return None;
                }
                let start = h as usize % len;
                (0..len)
                    .map(|k| table[(start + k) % len])
                    .find(|&s| ctx.exclude != Some(s))?
            }
            Source::Ring(ring) => {
                ring.refresh(ctx);
                ring.lookup(h, ctx.exclude)?
            }
        };
        Some(if ctx.servers[s].has_room() {
            Choice::Server(s)
        } else {
            Choice::Pinned(s)
        })
    }
}
/// A well-mixed 32-bit hash of an address (the port is not part of it).
pub(crate) fn hash_ip(ip: IpAddr) -> u32 {
    // On the stack: a pick allocates nothing.
    let mut buf = [0u8; 16];
    let bytes: &[u8] = match ip {
        IpAddr::V4(v4) => {
            buf[..4].copy_from_slice(&v4.octets());
            &buf[..4]
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            // A v4-mapped client hashes like its plain v4 form.
            Some(v4) => {
                buf[..4].copy_from_slice(&v4.octets());
                &buf[..4]
            }
            None => {
                buf.copy_from_slice(&v6.octets());
                &buf[..]
            }
        },
    };
    let mut h: u32 = 0;
    for chunk in bytes.chunks(4) {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        h = avalanche(h ^ u32::from_be_bytes(word));
    }
    h
}

/// Integer finaliser: every input bit flips about half the output bits, so
/// neighbouring addresses land far apart in the map.
fn avalanche(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}
