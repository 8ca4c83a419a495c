//! `map_ip` keys: an IPv4 or IPv6 address or network, parsed as HAProxy reads them.
//!
//! Owns the key syntax (`A.B.C.D`, `A.B.C.D/LEN`, `A.B.C.D/M.M.M.M`, `X:Y::Z`,
//! `X:Y::Z/LEN`) and its normal form. Pure; no I/O.
//!
//! Invariant: an [`IpNet`] is always normalised: the host bits below its prefix length
//! are zero, so two spellings of one network compare (and hash) equal.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest IPv4 prefix.
pub const V4_BITS: u8 = 32;
/// Longest IPv6 prefix.
pub const V6_BITS: u8 = 128;

/// A key HAProxy refuses for an `ip` pattern; the text is HAProxy's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a valid IPv4 or IPv6 address")]
pub struct BadIpKey(pub String);

/// A network: address with its host bits cleared, and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpNet {
    V4 { addr: u32, len: u8 },
    V6 { addr: u128, len: u8 },
}

/// The `len` leading bits of a 32-bit word set.
fn mask32(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (V4_BITS - len.min(V4_BITS))
    }
}

/// The `len` leading bits of a 128-bit word set.
fn mask128(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (V6_BITS - len.min(V6_BITS))
    }
}

impl IpNet {
    /// An IPv4 network (host bits cleared).
    pub fn v4(addr: u32, len: u8) -> Self {
        let len = len.min(V4_BITS);
        IpNet::V4 {
            addr: addr & mask32(len),
            len,
        }
    }

    /// An IPv6 network (host bits cleared).
    pub fn v6(addr: u128, len: u8) -> Self {
        let len = len.min(V6_BITS);
        IpNet::V6 {
            addr: addr & mask128(len),
            len,
        }
    }

    /// Parse a `map_ip` key. Non-contiguous IPv4 masks are refused (HAProxy keeps them
    /// out of its prefix tree; shunt does not support them).
    pub fn parse(s: &str) -> Result<Self, BadIpKey> {
        let bad = || BadIpKey(s.to_string());
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        if let Ok(a) = addr.parse::<Ipv4Addr>() {
            let len = match len {
                None => V4_BITS,
                Some(l) if l.bytes().all(|b| b.is_ascii_digit()) && !l.is_empty() => {
                    let n: u8 = l.parse().map_err(|_| bad())?;
                    if n > V4_BITS {
                        return Err(bad());
                    }
                    n
                }
                Some(l) => {
                    let m = u32::from(l.parse::<Ipv4Addr>().map_err(|_| bad())?);
                    let n = m.leading_ones() as u8;
                    if mask32(n) != m {
                        return Err(bad());
                    }
                    n
                }
            };
            return Ok(IpNet::v4(u32::from(a), len));
        }
        if let Ok(a) = addr.parse::<Ipv6Addr>() {
            let len = match len {
                None => V6_BITS,
                Some(l) => {
                    let n: u8 = l.parse().map_err(|_| bad())?;
                    if n > V6_BITS || l.starts_with('+') {
                        return Err(bad());
                    }
                    n
                }
            };
            return Ok(IpNet::v6(u128::from(a), len));
        }
        Err(bad())
    }

    /// The host address `ip` as a full-length network.
    pub fn host(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(a) => IpNet::v4(u32::from(a), V4_BITS),
            IpAddr::V6(a) => IpNet::v6(u128::from(a), V6_BITS),
        }
    }

    /// Prefix length.
    pub fn prefix_len(&self) -> u8 {
        match *self {
            IpNet::V4 { len, .. } | IpNet::V6 { len, .. } => len,
        }
    }

    /// The same network family and address cut to `len` bits.
    pub fn truncate(&self, len: u8) -> Self {
        match *self {
            IpNet::V4 { addr, .. } => IpNet::v4(addr, len),
            IpNet::V6 { addr, .. } => IpNet::v6(addr, len),
        }
    }

    /// A 64-bit mix of the network, used to pick a shard (not a security boundary).
    pub fn shard_hash(&self) -> u64 {
        let (hi, lo, len) = match *self {
            IpNet::V4 { addr, len } => (0u64, u64::from(addr), len),
            IpNet::V6 { addr, len } => ((addr >> 64) as u64, addr as u64, len),
        };
        let mut h = lo ^ hi.rotate_left(29) ^ (u64::from(len) << 56);
        // splitmix64 finaliser: spreads nearby addresses over all shards.
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^ (h >> 31)
    }
}

impl std::fmt::Display for IpNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            IpNet::V4 { addr, len } => write!(f, "{}/{len}", Ipv4Addr::from(addr)),
            IpNet::V6 { addr, len } => write!(f, "{}/{len}", Ipv6Addr::from(addr)),
        }
    }
}
