//! The peers and probes shunt's integration tests (tests/, crate `shunt_tests`), the
//! demo (xtask) and the benchmark lab (xtask/bench) share, written once: loopback
//! servers on one accept loop (`Server`: echo, tagged echo, any handler), counted echo
//! and sink backends with their checked clients (`Backend`, `echo_round_trip`,
//! `push_to_sink`), the deterministic pattern streams they send (`pattern`), and the
//! stats socket client with the `show stat` / `show info` parsers (`stats`).
//!
//! Invariant: everything here returns errors (or, in the panicking conveniences the
//! tests use, panics with the cause); nothing keeps a thread or a socket alive past the
//! value that owns it.

mod backends;
mod server;
pub mod stats;

pub use backends::{echo_round_trip, push_to_sink, Backend, Counters, Kind, Push, Snapshot};
pub use server::{echo_until_eof, listen_deep, relay, Server};
pub use stats::{cli_command, info_num, parse_show_info, parse_show_stat, StatRow};

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::Mutex;

/// Deterministic pseudo-random bytes (xorshift, 8 bytes a step), cheap enough for
/// 64 MiB; shifted, dropped or misordered bytes show.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A loopback port free at the time of the call, outside the kernel's ephemeral
/// range and never one this process was given before.
///
/// Why not "bind to 0, read it, close": that port comes from the ephemeral range
/// (`net.ipv4.ip_local_port_range`), the same range every outgoing `connect()`
/// draws its local port from. Between the close and the moment a proxy binds
/// the port, a client or backend connection of a test running alongside could
/// take it as its local port (seen in CI: "Starting frontend fe: cannot bind
/// socket (Address already in use) [127.0.0.1:41157]"). Below the ephemeral
/// range only an explicit bind can take a port, and within this process the
/// ports given are remembered, so two asks before either bind never collide.
/// The walk starts at an offset drawn from the process id, so two test
/// processes at once start far apart.
pub fn free_port() -> std::io::Result<u16> {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let (lo, hi) = outside_ephemeral_range();
    let span = u32::from(hi - lo);
    let start = (std::process::id().wrapping_mul(2_654_435_761) >> 7) % span;
    for step in 0..span {
        let port = lo + ((start + step) % span) as u16;
        if given.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no free loopback port in {lo}..{hi}"),
    ))
}

/// The widest port range, of at least a few thousand ports, that outgoing
/// connections never take: below `ip_local_port_range` if it leaves room (the
/// default 32768-60999 leaves 10000-32767), else above it.
fn outside_ephemeral_range() -> (u16, u16) {
    let (low, high) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|v| v.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999));
    if low >= 14000 {
        (10000, low)
    } else if high <= 60000 {
        (high + 1, 65535)
    } else {
        // The whole range is ephemeral: nothing is safe, take the low ports.
        (2000, low.max(3000))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_never_given_twice() {
        let ports: Vec<u16> = (0..200).map(|_| free_port().expect("port")).collect();
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
    }

    #[test]
    fn pattern_is_deterministic_and_seeded() {
        assert_eq!(pattern(1000, 7), pattern(1000, 7));
        assert_ne!(pattern(1000, 7), pattern(1000, 8));
        assert_eq!(pattern(13, 3).len(), 13);
        assert_eq!(pattern(16, 3)[..13], pattern(13, 3)[..]);
        assert!(pattern(0, 1).is_empty());
    }

    #[test]
    fn free_port_is_a_port_outside_the_ephemeral_range() {
        let port = free_port().expect("free port");
        let (lo, hi) = outside_ephemeral_range();
        assert!(
            port != 0 && (lo..hi).contains(&port),
            "{port} not in {lo}..{hi}"
        );
        TcpListener::bind(("127.0.0.1", port)).expect("the port is bindable");
    }
}
