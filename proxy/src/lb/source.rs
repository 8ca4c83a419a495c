//! `balance source`: hash of the client IP address (`balance hash EXPR`: of
//! the flow's source or destination address or port), looked up in the static
//! weight map (`hash-type map-based`, the default: `hash % total weight`) or
//! on the consistent-hash ring (`hash-type consistent`, `chash.rs`), so a
//! client keeps its server for as long as the server set is unchanged (and,
//! with `consistent`, while other servers come and go).
//!
//! The chosen server is sticky: when it is full the request waits in that
//! server's own queue (bounded by its `maxqueue`) rather than going
//! elsewhere. When it is excluded (redispatch) the next map entry (or ring
//! point) that is not excluded is used.

use std::net::IpAddr;

use super::algo::{Choice, Ctx};
use super::backend::FlowKey;
use super::chash::Ring;
use super::map::WeightMap;
use crate::config::{HashKey, HashType};

#[derive(Debug)]
pub(crate) struct Source {
    table: Table,
    /// `balance hash`'s sample; `None`: `balance source` (the client's address).
    key: Option<HashKey>,
}

#[derive(Debug)]
enum Table {
    Map(WeightMap),
    Ring(Ring),
}

impl Source {
    pub fn new(hash_type: HashType, key: Option<HashKey>) -> Self {
        let table = match hash_type {
            HashType::MapBased => Table::Map(WeightMap::default()),
            HashType::Consistent => Table::Ring(Ring::default()),
        };
        Source { table, key }
    }

    /// The hash of the flow's sample. A destination that is unknown (the
    /// socket lost its address) hashes as 0: one server for all such flows.
    fn hash(&self, k: FlowKey) -> u32 {
        match self.key {
            None | Some(HashKey::Src) => hash_ip(k.src.ip()),
            Some(HashKey::SrcPort) => avalanche(u32::from(k.src.port())),
            Some(HashKey::Dst) => k.dst.map_or(0, |d| hash_ip(d.ip())),
            Some(HashKey::DstPort) => k.dst.map_or(0, |d| avalanche(u32::from(d.port()))),
        }
    }

    pub fn pick(&mut self, ctx: &Ctx<'_>, client: FlowKey) -> Option<Choice> {
        let h = self.hash(client);
        let s = match &mut self.table {
            Table::Map(map) => {
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
            Table::Ring(ring) => {
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
