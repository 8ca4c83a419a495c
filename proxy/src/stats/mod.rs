//! Traffic counters per frontend, backend and server.
//!
//! Owns the counters the CLI renders (`show stat`). Byte and event counters are
//! sharded per worker thread, each shard on its own cache line, and only the
//! owning thread writes its shard (relaxed atomics, no lock, no false sharing);
//! readers sum the shards. Current-session gauges are shared atomics because a
//! maximum (`smax`) needs the global value at the moment it is reached; they are
//! touched once per session, never per byte.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::config::Config;

pub mod flows;

/// The event counters of one shard. Field names follow `show stat` columns.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Shard {
    stot: AtomicU64,
    bin: AtomicU64,
    bout: AtomicU64,
    econ: AtomicU64,
    eresp: AtomicU64,
    wretr: AtomicU64,
    wredis: AtomicU64,
    dcon: AtomicU64,
    /// Requests denied by a `tcp-request content` rule.
    dreq: AtomicU64,
    /// Sessions that ended on a client or server timeout.
    etimeout: AtomicU64,
    /// Sessions aborted by the client (reset) / by the server.
    cli_abrt: AtomicU64,
    srv_abrt: AtomicU64,
}

/// Which event counter to bump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A session was accepted (frontend) or assigned (backend, server).
    Session,
    /// A connection to a server failed.
    ConnError,
    /// A connection attempt was retried.
    Retry,
    /// A session was redispatched to another server.
    Redispatch,
    /// A session was refused (queue full, no server, maxconn).
    Denied,
    /// A request was denied by a `tcp-request content` rule (`dreq`).
    DeniedReq,
    /// An error on the server side after connect (reset, error).
    RespError,
    Timeout,
    ClientAbort,
    ServerAbort,
}

/// Summed view of one proxy's or server's counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    pub scur: usize,
    pub smax: usize,
    pub stot: u64,
    pub bin: u64,
    pub bout: u64,
    pub econ: u64,
    pub eresp: u64,
    pub wretr: u64,
    pub wredis: u64,
    pub dcon: u64,
    pub dreq: u64,
    pub etimeout: u64,
    pub cli_abrt: u64,
    pub srv_abrt: u64,
}

/// Counters of one frontend, backend or server.
#[derive(Debug)]
pub struct Counters {
    shards: Box<[Shard]>,
    scur: AtomicUsize,
    smax: AtomicUsize,
}

impl Counters {
    pub fn new(nbthread: usize) -> Self {
        Self {
            shards: (0..nbthread.max(1)).map(|_| Shard::default()).collect(),
            scur: AtomicUsize::new(0),
            smax: AtomicUsize::new(0),
        }
    }

    /// The calling worker's shard; off a worker (tests, the main thread) shard 0.
    fn shard(&self) -> &Shard {
        let id = crate::scheduler::try_thread_id().unwrap_or(0);
        &self.shards[id % self.shards.len()]
    }

    pub fn add_in(&self, n: u64) {
        self.shard().bin.fetch_add(n, Ordering::Relaxed);
    }

    pub fn add_out(&self, n: u64) {
        self.shard().bout.fetch_add(n, Ordering::Relaxed);
    }

    pub fn event(&self, ev: Event) {
        let s = self.shard();
        let c = match ev {
            Event::Session => &s.stot,
            Event::ConnError => &s.econ,
            Event::Retry => &s.wretr,
            Event::Redispatch => &s.wredis,
            Event::Denied => &s.dcon,
            Event::DeniedReq => &s.dreq,
            Event::RespError => &s.eresp,
            Event::Timeout => &s.etimeout,
            Event::ClientAbort => &s.cli_abrt,
            Event::ServerAbort => &s.srv_abrt,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// A session starts using this proxy/server: `scur += 1`, `smax` follows.
    pub fn open(&self) {
        let now = self.scur.fetch_add(1, Ordering::Relaxed) + 1;
        self.smax.fetch_max(now, Ordering::Relaxed);
    }

    /// The matching end of [`Counters::open`].
    pub fn close(&self) {
        self.scur.fetch_sub(1, Ordering::Relaxed);
    }

    /// `clear counters`: maxima restart from the current values.
    pub fn clear_max(&self) {
        self.smax
            .store(self.scur.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// `clear counters all`: every cumulative counter back to zero, maxima to the
    /// current values (gauges such as `scur` are state, not counters, and stay).
    pub fn clear_all(&self) {
        for sh in self.shards.iter() {
            for a in [
                &sh.stot,
                &sh.bin,
                &sh.bout,
                &sh.econ,
                &sh.eresp,
                &sh.wretr,
                &sh.wredis,
                &sh.dcon,
                &sh.dreq,
                &sh.etimeout,
                &sh.cli_abrt,
                &sh.srv_abrt,
            ] {
                a.store(0, Ordering::Relaxed);
            }
        }
        self.clear_max();
    }

    pub fn scur(&self) -> usize {
        self.scur.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot {
            scur: self.scur.load(Ordering::Relaxed),
            smax: self.smax.load(Ordering::Relaxed),
            ..Snapshot::default()
        };
        for sh in self.shards.iter() {
            let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
            s.stot += g(&sh.stot);
            s.bin += g(&sh.bin);
            s.bout += g(&sh.bout);
            s.econ += g(&sh.econ);
            s.eresp += g(&sh.eresp);
            s.wretr += g(&sh.wretr);
            s.wredis += g(&sh.wredis);
            s.dcon += g(&sh.dcon);
            s.dreq += g(&sh.dreq);
            s.etimeout += g(&sh.etimeout);
            s.cli_abrt += g(&sh.cli_abrt);
            s.srv_abrt += g(&sh.srv_abrt);
        }
        s
    }
}

/// Every counter of the process, indexed like [`Config`]'s proxies and servers.
#[derive(Debug)]
pub struct Stats {
    pub frontends: Vec<Counters>,
    pub backends: Vec<Counters>,
    /// `servers[backend][server]`.
    pub servers: Vec<Vec<Counters>>,
    /// Flows and bytes per forwarding mode.
    pub modes: ModeCounters,
}

/// Flows forwarded and their bytes (both ways), per forwarding mode, counted
/// when a flow ends (the flows `auto` promoted to the kernel when they are
/// promoted); read by `show info` and the exporter.
#[derive(Debug, Default)]
pub struct ModeCounters {
    flows: [AtomicU64; 3],
    bytes: [AtomicU64; 3],
    promoted: AtomicU64,
    ktls: AtomicU64,
}

impl ModeCounters {
    /// A flow forwarded in `mode` ended, having moved `bytes`.
    pub fn done(&self, mode: crate::handoff::Mode, bytes: u64) {
        self.flows[mode.index()].fetch_add(1, Ordering::Relaxed);
        self.bytes[mode.index()].fetch_add(bytes, Ordering::Relaxed);
    }

    /// `auto` moved a flow to the kernel.
    pub fn promote(&self) {
        self.promoted.fetch_add(1, Ordering::Relaxed);
    }

    /// A terminated TLS flow was handed to the kernel (kTLS).
    pub fn ktls(&self) {
        self.ktls.fetch_add(1, Ordering::Relaxed);
    }

    /// TLS flows handed to kTLS (live or ended).
    pub fn ktls_flows(&self) -> u64 {
        self.ktls.load(Ordering::Relaxed)
    }

    /// Flows `auto` moved to the kernel (live or ended).
    pub fn promoted(&self) -> u64 {
        self.promoted.load(Ordering::Relaxed)
    }

    /// Flows forwarded in `mode` that ended.
    pub fn flows(&self, mode: crate::handoff::Mode) -> u64 {
        self.flows[mode.index()].load(Ordering::Relaxed)
    }

    /// Bytes those flows moved.
    pub fn bytes(&self, mode: crate::handoff::Mode) -> u64 {
        self.bytes[mode.index()].load(Ordering::Relaxed)
    }
}

impl Stats {
    pub fn new(cfg: &Config, nbthread: usize) -> Arc<Self> {
        Arc::new(Self {
            frontends: cfg
                .frontends
                .iter()
                .map(|_| Counters::new(nbthread))
                .collect(),
            backends: cfg
                .backends
                .iter()
                .map(|_| Counters::new(nbthread))
                .collect(),
            servers: cfg
                .backends
                .iter()
                .map(|b| b.servers.iter().map(|_| Counters::new(nbthread)).collect())
                .collect(),
            modes: ModeCounters::default(),
        })
    }
}

impl Stats {
    fn all(&self) -> impl Iterator<Item = &Counters> {
        self.frontends
            .iter()
            .chain(self.backends.iter())
            .chain(self.servers.iter().flatten())
    }

    /// HAProxy's `clear counters` (`all == false`: maxima only) and
    /// `clear counters all` (every counter).
    pub fn clear(&self, all: bool) {
        for c in self.all() {
            if all {
                c.clear_all();
            } else {
                c.clear_max();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_sum_and_smax_tracks_peak() {
        let c = Counters::new(4);
        c.add_in(10);
        c.add_out(3);
        c.event(Event::Session);
        c.open();
        c.open();
        c.close();
        let s = c.snapshot();
        assert_eq!((s.bin, s.bout, s.stot), (10, 3, 1));
        assert_eq!((s.scur, s.smax), (1, 2));
    }

    #[test]
    fn clear_max_keeps_totals_and_clear_all_zeroes_them() {
        let c = Counters::new(2);
        c.add_in(5);
        c.event(Event::Retry);
        c.open();
        c.open();
        c.close();
        c.clear_max();
        let s = c.snapshot();
        assert_eq!((s.bin, s.wretr, s.scur, s.smax), (5, 1, 1, 1));
        c.clear_all();
        let s = c.snapshot();
        assert_eq!((s.bin, s.wretr, s.stot, s.scur, s.smax), (0, 0, 0, 1, 1));
    }
}
