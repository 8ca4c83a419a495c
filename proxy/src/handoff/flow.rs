//! Per-flow shared state: byte counters, activity clocks and half-close
//! flags that both direction loops update and the driver reads.
//!
//! Invariants: one `Flow` lives inside one `forward` future (never shared
//! across threads, hence `Cell`); `seen(side)` moves forward whenever bytes
//! are read from that side or written to it; `half(side)` becomes true once
//! that side's socket is shut in either direction (EOF read from it, or
//! SHUT_WR sent to it) and never goes back.

use std::cell::Cell;
use std::io;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{End, FlowTimeouts, Meter};

/// Which socket of the flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

/// One direction: bytes read from `from` are written to `to`.
#[derive(Clone, Copy, Debug)]
pub struct Dir {
    pub from: Side,
    pub to: Side,
}

pub const CLIENT_TO_SERVER: Dir = Dir {
    from: Side::Client,
    to: Side::Server,
};
pub const SERVER_TO_CLIENT: Dir = Dir {
    from: Side::Server,
    to: Side::Client,
};

/// An I/O failure of a direction loop, tagged with the socket it came from.
#[derive(Debug, thiserror::Error)]
#[error("{side:?} socket: {source}")]
pub struct DirError {
    pub side: Side,
    #[source]
    pub source: io::Error,
}

impl DirError {
    pub fn new(side: Side, source: io::Error) -> Self {
        Self { side, source }
    }

    /// Resets (and broken pipes) become `*Reset`; anything else is `Error` with
    /// the side it came from.
    pub fn into_end(self) -> End {
        let reset = matches!(
            self.source.raw_os_error(),
            Some(libc::ECONNRESET | libc::EPIPE | libc::ECONNABORTED | libc::ENOTCONN)
        );
        let origin = match self.side {
            Side::Client => super::Origin::Client,
            Side::Server => super::Origin::Server,
        };
        match (reset, origin) {
            (true, super::Origin::Client) => End::ClientReset,
            (true, _) => End::ServerReset,
            (false, origin) => End::Error {
                origin,
                source: self.source,
            },
        }
    }
}

pub struct Flow<'m> {
    meter: &'m dyn Meter,
    to_server: Cell<u64>,
    to_client: Cell<u64>,
    client_seen: Cell<Instant>,
    server_seen: Cell<Instant>,
    client_half: Cell<bool>,
    server_half: Cell<bool>,
    /// Set when a splice direction switched to copying mid-flow.
    pub fell_back: Cell<bool>,
    /// Signalled when a half-close may have shortened a timeout.
    pub shut_changed: Notify,
}

impl<'m> Flow<'m> {
    pub fn new(meter: &'m dyn Meter) -> Self {
        let now = Instant::now();
        Self {
            meter,
            to_server: Cell::new(0),
            to_client: Cell::new(0),
            client_seen: Cell::new(now),
            server_seen: Cell::new(now),
            client_half: Cell::new(false),
            server_half: Cell::new(false),
            fell_back: Cell::new(false),
            shut_changed: Notify::new(),
        }
    }

    fn seen_cell(&self, side: Side) -> &Cell<Instant> {
        match side {
            Side::Client => &self.client_seen,
            Side::Server => &self.server_seen,
        }
    }

    fn half_cell(&self, side: Side) -> &Cell<bool> {
        match side {
            Side::Client => &self.client_half,
            Side::Server => &self.server_half,
        }
    }

    /// Bytes were read from `side`.
    pub fn touch(&self, side: Side) {
        self.seen_cell(side).set(Instant::now());
    }

    /// `n` bytes were written to `side`: account them live and touch it.
    pub fn wrote(&self, side: Side, n: usize) {
        let n = n as u64;
        match side {
            Side::Server => {
                self.to_server.set(self.to_server.get() + n);
                self.meter.to_server(n);
            }
            Side::Client => {
                self.to_client.set(self.to_client.get() + n);
                self.meter.to_client(n);
            }
        }
        self.touch(side);
    }

    /// `side`'s socket got shut in one direction.
    pub fn shut(&self, side: Side) {
        if !self.half_cell(side).replace(true) {
            self.shut_changed.notify_one();
        }
    }

    pub fn to_server(&self) -> u64 {
        self.to_server.get()
    }

    pub fn to_client(&self) -> u64 {
        self.to_client.get()
    }

    /// The inactivity timeout in force for `side` (HAProxy TCP semantics):
    /// `*_fin` once that side is half-closed (when set), else `tunnel` when
    /// set, else the side's own timeout.
    fn timeout(&self, side: Side, t: &FlowTimeouts) -> Option<Duration> {
        let (base, fin) = match side {
            Side::Client => (t.client, t.client_fin),
            Side::Server => (t.server, t.server_fin),
        };
        match fin {
            Some(f) if self.half_cell(side).get() => Some(f),
            _ => t.tunnel.or(base),
        }
    }

    fn side_deadline(&self, side: Side, t: &FlowTimeouts) -> Option<Instant> {
        let d = self.timeout(side, t)?;
        self.seen_cell(side).get().checked_add(d)
    }

    /// The earliest instant at which a side could expire.
    pub fn deadline(&self, t: &FlowTimeouts) -> Option<Instant> {
        match (
            self.side_deadline(Side::Client, t),
            self.side_deadline(Side::Server, t),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The side whose timeout has expired at `now`, if any (earliest first).
    pub fn expired(&self, t: &FlowTimeouts, now: Instant) -> Option<End> {
        let c = self.side_deadline(Side::Client, t).filter(|d| *d <= now);
        let s = self.side_deadline(Side::Server, t).filter(|d| *d <= now);
        match (c, s) {
            (Some(c), Some(s)) if s < c => Some(End::ServerTimeout),
            (Some(_), _) => Some(End::ClientTimeout),
            (None, Some(_)) => Some(End::ServerTimeout),
            (None, None) => None,
        }
    }
}
