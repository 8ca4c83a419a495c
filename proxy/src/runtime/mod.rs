//! The running process's state as owned parts, built once by `daemon` and
//! shared (`Arc<Runtime>`) by every worker, check, CLI connection and the
//! exporter.
//!
//! Owns nothing itself but the composition: the immutable configuration,
//! the process's [`Facts`], the backends' runtime state (`lb`), the runtime
//! maps, the stick tables, the traffic counters (`stats`), [`Admission`] (flow counts, limits,
//! the accept hold), the [`Lifecycle`] phase, the running [`Workers`] and
//! the process's part in a reload ([`Handover`]).
//! Each part keeps its fields private and changes only through its own
//! methods, so holding the runtime does not mean being able to change
//! anything. Beside the state, [`flow`] holds what accepted and adopted flows
//! share (their timeouts, the accounting of their end). Layering: `runtime`
//! sits above `{config, lb, stats, maps, log, listeners}` and below
//! `{checks, pool, reload, metrics}`, `{session, cli}` and `daemon`; it must
//! not import any of those.

pub mod admission;
pub mod facts;
pub mod flow;
pub mod handover;
pub mod lifecycle;
pub mod workers;

use std::sync::Arc;

pub use admission::{Admission, ConnGuard, Limits};
pub use facts::Facts;
pub use handover::Handover;
pub use lifecycle::{Lifecycle, Phase};
pub use workers::Workers;

use crate::config::Config;
use crate::lb::BackendRt;
use crate::stats::Stats;

/// What every worker shares.
pub struct Runtime {
    pub config: Arc<Config>,
    pub facts: Facts,
    pub backends: Vec<Arc<BackendRt>>,
    /// Runtime maps (routing by `map_ip`, edited by the CLI).
    pub maps: crate::maps::Maps,
    /// Stick tables (`stick-table`), shared by every worker's flows.
    pub tables: crate::stick::Tables,
    pub stats: Arc<Stats>,
    pub admission: Admission,
    pub lifecycle: Lifecycle,
    pub workers: Workers,
    /// The exported listeners and the hand-over flags (`reload`); shared
    /// with the pidfile and the stats sockets, which read it when they drop.
    pub handover: Arc<Handover>,
    /// The log system: dropped lines, the way to the log thread once started.
    pub log: Arc<crate::log::Log>,
    /// What flows are forwarded with: splice's bounded pipe pool
    /// (`tune.pipesize`, `maxpipes`) and the kernel handoff when BPF loaded,
    /// shared by every worker's flows.
    pub forwarding: crate::handoff::Forwarding,
    /// The TLS acceptors and connectors of the `ssl` listeners and servers,
    /// and the kernel's kTLS status; `daemon` sets them before sharing the
    /// runtime (none until then).
    pub tls: crate::tls::Contexts,
}

impl Runtime {
    /// The runtime of a process starting with `config`: backends, maps and
    /// counters built from it, `accept_loops` accept loops to come, accepting
    /// held until [`Admission::hold_accepting`]`(false)` when `held`,
    /// forwarding in the kernel too when `kernel` (BPF loaded).
    pub fn new(
        config: Arc<Config>,
        facts: Facts,
        kernel: Option<Arc<crate::handoff::Kernel>>,
        phase: tokio::sync::watch::Receiver<Phase>,
        accept_loops: usize,
        held: bool,
        handover: Arc<Handover>,
    ) -> Self {
        let nbthread = facts.nbthread();
        Self {
            backends: config.backends.iter().map(BackendRt::new).collect(),
            maps: crate::maps::Maps::new(&config),
            tables: crate::stick::Tables::new(&config.tables),
            stats: Stats::new(&config, nbthread),
            admission: Admission::new(Limits::new(&config), accept_loops, held),
            lifecycle: Lifecycle::new(phase),
            workers: Workers::new(nbthread),
            handover,
            log: Arc::default(),
            forwarding: crate::handoff::Forwarding {
                pipes: crate::handoff::PipePool::configured(
                    config.global.pipesize,
                    config.global.maxpipes,
                ),
                kernel,
            },
            tls: crate::tls::Contexts::none(),
            facts,
            config,
        }
    }
}

impl crate::log::Process for Runtime {
    fn config(&self) -> &Config {
        &self.config
    }
    fn log(&self) -> &crate::log::Log {
        &self.log
    }
    fn conns(&self) -> usize {
        self.admission.conns()
    }
    fn frontend_conns(&self, fe: usize) -> usize {
        self.stats.frontends.get(fe).map_or(0, |c| c.scur())
    }
    fn backend_conns(&self, be: usize) -> usize {
        self.stats.backends.get(be).map_or(0, |c| c.scur())
    }
    fn server_conns(&self, be: usize, srv: usize) -> usize {
        self.stats
            .servers
            .get(be)
            .and_then(|v| v.get(srv))
            .map_or(0, |c| c.scur())
    }
}

/// What `nbsrv`, `be_conn` and `fe_conn` read: the backends' server states
/// and the proxies' session gauges. An index the configuration does not hold
/// counts 0 (the parser resolved every index, so none reaches here).
impl crate::config::acl::Counts for Runtime {
    fn usable_servers(&self, be: usize) -> usize {
        self.backends.get(be).map_or(0, |b| b.usable_servers())
    }
    fn backend_conns(&self, be: usize) -> usize {
        self.stats.backends.get(be).map_or(0, |c| c.scur())
    }
    fn frontend_conns(&self, fe: usize) -> usize {
        self.stats.frontends.get(fe).map_or(0, |c| c.scur())
    }
}
