//! Map keys: what a map's patterns are, by the converter that reads the map.
//!
//! Owns the key kinds and their normal forms: `map_ip` keys are networks ([`IpNet`]);
//! `map` / `map_dom` keys are strings. String keys are kept in ASCII lower case: shunt
//! only looks strings up by TLS server name, and DNS names compare case-insensitively
//! (so `add map`, `set map`, `del map` and routing agree on one spelling).
//!
//! Invariant: a [`MapKey::Str`] never holds an ASCII upper-case letter.

use std::sync::Arc;

use super::net::{BadIpKey, IpNet};

/// What a map's keys are, fixed when the configuration loads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MapKind {
    /// `map_ip`: addresses and networks, longest-prefix match.
    #[default]
    Ip,
    /// `map` / `map_dom`: strings (TLS server names).
    Str,
}

impl MapKind {
    /// The pattern type `get map` names (`type=ip`, `type=str`).
    pub fn type_name(self) -> &'static str {
        match self {
            MapKind::Ip => "ip",
            MapKind::Str => "str",
        }
    }
}

/// One normalised key of a map.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MapKey {
    Ip(IpNet),
    Str(Arc<str>),
}

impl MapKey {
    /// Parse `s` as a key of a map of kind `kind`.
    pub fn parse(kind: MapKind, s: &str) -> Result<Self, BadIpKey> {
        match kind {
            MapKind::Ip => IpNet::parse(s).map(MapKey::Ip),
            MapKind::Str => Ok(Self::string(s)),
        }
    }

    /// A string key (lower-cased).
    pub fn string(s: &str) -> Self {
        MapKey::Str(Arc::from(s.to_ascii_lowercase()))
    }

    /// A 64-bit mix of the key, used to pick a shard (not a security boundary).
    pub fn shard_hash(&self) -> u64 {
        match self {
            MapKey::Ip(net) => net.shard_hash(),
            MapKey::Str(s) => {
                // FNV-1a: deterministic and cheap for short names.
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for b in s.bytes() {
                    h ^= u64::from(b);
                    h = h.wrapping_mul(0x0100_0000_01b3);
                }
                h ^ (h >> 29)
            }
        }
    }
}

impl From<IpNet> for MapKey {
    fn from(n: IpNet) -> Self {
        MapKey::Ip(n)
    }
}

impl From<&IpNet> for MapKey {
    fn from(n: &IpNet) -> Self {
        MapKey::Ip(*n)
    }
}

impl From<&MapKey> for MapKey {
    fn from(k: &MapKey) -> Self {
        k.clone()
    }
}
