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

/// A loopback port free at the time of the call (bind to 0, read it, close),
/// and never one this process was given before: the kernel may hand the same
/// ephemeral port to two binds in a row once the first is closed, and a test
/// that asks for two ports before binding either would get one twice (seen:
/// "address 127.0.0.1:45177 is already bound by frontend 'l'").
pub fn free_port() -> std::io::Result<u16> {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if given.insert(port) {
            return Ok(port);
        }
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
    fn free_port_is_a_port() {
        assert_ne!(free_port().expect("free port"), 0);
    }
}
