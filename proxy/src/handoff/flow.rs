//! Per-flow shared state: byte counters, activity clocks and half-close
//! flags that both direction loops update and the driver reads.
//!
//! Invariants: one `Flow` lives inside one `forward` future (never shared
//! across threads, hence `Cell`); `seen(side)` moves forward whenever bytes
//! are read from that side or written to it; `half(side)` becomes true once
//! that side's socket is shut in either direction (EOF read from it, or
//! SHUT_WR sent to it) and never goes back.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::task::{Poll, Waker};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::promote::{Promote, Watch, MAX_PROMOTE_ATTEMPTS, PARK_LIMIT};
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

/// One source side's part in a promotion.
#[derive(Debug)]
struct SideState {
    /// Its last read emptied the receive queue (or nothing was read yet):
    /// every queued segment starts at or after the next byte to read.
    dry: Cell<bool>,
    /// Its direction holds no byte and waits (for bytes, or parked), so
    /// dropping the direction's future loses nothing.
    waiting: Cell<bool>,
}

/// `auto`'s promotion state of one flow.
#[derive(Debug)]
struct Promotion {
    watch: Option<Watch>,
    watching: Cell<bool>,
    /// Since when a promotion is asked for: the directions park once dry.
    parking: Cell<Option<Instant>>,
    attempts: Cell<u32>,
    client: SideState,
    server: SideState,
}

impl Promotion {
    fn new(promote: Option<Promote>) -> Self {
        let side = || SideState {
            dry: Cell::new(true),
            waiting: Cell::new(false),
        };
        Self {
            watching: Cell::new(promote.is_some()),
            watch: promote.map(Watch::new),
            parking: Cell::new(None),
            attempts: Cell::new(0),
            client: side(),
            server: side(),
        }
    }

    fn side(&self, side: Side) -> &SideState {
        match side {
            Side::Client => &self.client,
            Side::Server => &self.server,
        }
    }
}

/// A wake-up for the one future of a flow that waits for it (the driver):
/// a flag that stays set until that future sees it, and that future's
/// waker. What a `tokio::sync::Notify` does for one waiter on one thread,
/// without its lock and list: the driver polls it on every wake of the
/// flow, and its waiting future is one reference, not 64 bytes.
#[derive(Default)]
pub struct Signal {
    set: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Signal {
    /// Set the flag and wake the waiting future, if any (a permit for the
    /// next wait otherwise).
    pub fn notify(&self) {
        self.set.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Completes once the flag is set, and clears it.
    pub fn wait(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if self.set.replace(false) {
                return Poll::Ready(());
            }
            let w = match self.waker.take() {
                Some(w) if w.will_wake(cx.waker()) => w,
                _ => cx.waker().clone(),
            };
            self.waker.set(Some(w));
            Poll::Pending
        })
    }
}

impl std::fmt::Debug for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signal")
            .field("set", &self.set.get())
            .finish()
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
    /// Set when a direction began splicing (an `auto` flow copies its small
    /// messages and splices only bulk: see `handoff::Splicing::Auto`).
    pub spliced: Cell<bool>,
    /// `auto`'s promotion state (see `handoff`'s "Promotion").
    promo: Promotion,
    /// Signalled when the driver must look again: a half-close may have
    /// shortened a timeout, a promotion was asked for, or a direction may
    /// have become parkable.
    pub changed: Signal,
    /// Woken when a promotion is called off: parked directions go on.
    resumed: Notify,
}

impl<'m> Flow<'m> {
    pub fn new(meter: &'m dyn Meter) -> Self {
        Self::watched(meter, None)
    }

    /// A flow that `auto` may promote by `promote`'s rules.
    /// Where the flow is counted (see [`Meter::route`]).
    pub fn route(&self) -> Option<super::FlowRoute> {
        self.meter.route()
    }

    pub fn watched(meter: &'m dyn Meter, promote: Option<Promote>) -> Self {
        let now = crate::scheduler::now();
        Self {
            meter,
            to_server: Cell::new(0),
            to_client: Cell::new(0),
            client_seen: Cell::new(now),
            server_seen: Cell::new(now),
            client_half: Cell::new(false),
            server_half: Cell::new(false),
            fell_back: Cell::new(false),
            spliced: Cell::new(false),
            promo: Promotion::new(promote),
            changed: Signal::default(),
            resumed: Notify::new(),
        }
    }

    /// `n` bytes were read from `side` in userspace: touch it, and weigh the
    /// read as evidence for a promotion. `dry`: the read took less than it
    /// asked for, so the socket's receive queue was empty after it.
    pub fn read(&self, side: Side, n: usize, dry: bool) {
        self.touch(side);
        let p = &self.promo;
        p.side(side).dry.set(dry);
        let Some(w) = p.watch.as_ref().filter(|_| p.watching.get()) else {
            return;
        };
        let from = match side {
            Side::Client => 0,
            Side::Server => 1,
        };
        if w.read(from, n) && !self.client_half.get() && !self.server_half.get() {
            p.watching.set(false);
            p.parking.set(Some(Instant::now()));
            // The driver must learn the park deadline.
            tracing::debug!(?side, "promotion asked for");
            self.changed.notify();
        }
    }

    /// A read from `side` would block: its receive queue is empty.
    pub fn drained(&self, side: Side) {
        self.promo.side(side).dry.set(true);
    }

    /// A promotion is asked for.
    pub fn parking(&self) -> bool {
        self.promo.parking.get().is_some()
    }

    /// The direction reading `from` must stop reading and park: a promotion
    /// is asked for and its last read emptied the receive queue. A read that
    /// filled its buffer may have ended inside a queued segment, and the
    /// kernel hands the verdict whole segments (`tcp_read_skb`): bytes
    /// userspace already read would be forwarded twice. So a direction that
    /// is not dry goes on reading until it is.
    pub fn must_park(&self, from: Side) -> bool {
        self.parking() && self.promo.side(from).dry.get()
    }

    /// Both directions hold nothing, are dry and wait: the flow can be
    /// promoted.
    pub fn quiescent(&self) -> bool {
        let p = &self.promo;
        self.parking()
            && [&p.client, &p.server]
                .iter()
                .all(|s| s.waiting.get() && s.dry.get())
    }

    /// When the promotion asked for is given up if the directions have not
    /// become quiescent.
    pub fn park_deadline(&self) -> Option<Instant> {
        self.promo.parking.get().map(|t| t + PARK_LIMIT)
    }

    /// Call a promotion off: parked directions go on. With `retry` (it did
    /// not become quiescent in time) the flow is watched again from scratch,
    /// a bounded number of times; otherwise (a side half-closed, or the
    /// kernel refused the pair) never again.
    pub fn call_off(&self, retry: bool) {
        let p = &self.promo;
        let again = retry && p.attempts.get() < MAX_PROMOTE_ATTEMPTS;
        p.attempts.set(p.attempts.get() + 1);
        if again {
            if let Some(w) = &p.watch {
                w.reset();
            }
        }
        p.watching.set(again);
        if p.parking.take().is_some() {
            self.resumed.notify_waiters();
        }
    }

    /// The promotion goes ahead (the directions' futures are gone): nothing
    /// parks or is watched any more.
    pub fn promoting(&self) {
        let p = &self.promo;
        p.watching.set(false);
        p.parking.set(None);
        p.client.waiting.set(false);
        p.server.waiting.set(false);
    }

    /// The direction reading `from` holds no byte and is about to wait
    /// (`true`), or goes on (`false`).
    pub fn set_waiting(&self, from: Side, waiting: bool) {
        self.promo.side(from).waiting.set(waiting);
        if waiting && self.parking() {
            self.changed.notify();
        }
    }

    /// Park the direction reading `from` (it holds no byte and is dry) until
    /// the promotion is called off; if it goes ahead, this future is dropped.
    pub async fn park(&self, from: Side) {
        self.set_waiting(from, true);
        while self.parking() {
            let resumed = self.resumed.notified();
            tokio::pin!(resumed);
            resumed.as_mut().enable();
            if !self.parking() {
                break;
            }
            resumed.await;
        }
        self.set_waiting(from, false);
    }

    fn seen_cell(&self, side: Side) -> &Cell<Instant> {
        match side {
            Side::Client => &self.client_seen,
            Side::Server => &self.server_seen,
        }
    }

    /// `side` is half-closed: its EOF was read, or its write side shut.
    pub fn half(&self, side: Side) -> bool {
        self.half_cell(side).get()
    }

    fn half_cell(&self, side: Side) -> &Cell<bool> {
        match side {
            Side::Client => &self.client_half,
            Side::Server => &self.server_half,
        }
    }

    /// Bytes were read from `side` (stamped with the worker's clock of this
    /// pass: timeouts are seconds, a pass is well under a millisecond).
    pub fn touch(&self, side: Side) {
        self.seen_cell(side).set(crate::scheduler::now());
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
            self.changed.notify();
        }
    }

    pub fn to_server(&self) -> u64 {
        self.to_server.get()
    }

    /// See [`Meter::client_consumed`].
    pub fn client_consumed(&self) -> u64 {
        self.meter.client_consumed()
    }

    pub fn to_client(&self) -> u64 {
        self.to_client.get()
    }

    /// Nothing was written to `side` yet: its socket may be a connection that
    /// completed inside `connect()` (`lb::spares::connect`), whose writability
    /// tokio learns only at the poller's next turn. The first write to it is
    /// tried without asking tokio (HAProxy sends at once too); EAGAIN then
    /// takes the usual way through tokio's readiness, which the socket's next
    /// EPOLLOUT edge sets.
    pub fn nothing_written(&self, side: Side) -> bool {
        match side {
            Side::Server => self.to_server.get() == 0,
            Side::Client => self.to_client.get() == 0,
        }
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
