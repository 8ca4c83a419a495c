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

use std::net::TcpListener;

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

/// A loopback port free at the time of the call (bind to 0, read it, close).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

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
