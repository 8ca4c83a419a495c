//! Who may come in: the count of flows in the process against the global and
//! frontend `maxconn` in force, each listener's flows against its `bind ...
//! maxconn`, the count of accept loops still running, and
//! the accept hold (no accept while a successor has not taken over, or while
//! this process hands itself over). The accept loops (`daemon`) and the CLI
//! (`set maxconn`) go through here; nothing else changes these counts.
//!
//! Race window: the room check and the count are not one atomic step, so two
//! workers passing the check at once can overshoot a limit by one each, as the
//! comment at the accept loop says; the count itself never drifts (every
//! increment has its [`ConnGuard`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{watch, Notify};

use crate::config::Config;

/// The connection limits the accept loops enforce: the configured `maxconn`s at
/// start, changed at run time by `set maxconn global|frontend` (through
/// [`Admission`], which wakes the accept loops). A change applies
/// to the next accept; flows already accepted are not disturbed.
#[derive(Debug)]
pub struct Limits {
    global: AtomicUsize,
    /// Per frontend, in config order; 0 = bounded by the global limit only.
    frontends: Vec<AtomicUsize>,
    /// Per frontend, per bind address: `bind ... maxconn` (0 = none).
    listeners: Vec<Vec<usize>>,
}

impl Limits {
    pub fn new(config: &Config) -> Self {
        Self {
            global: AtomicUsize::new(config.global.maxconn),
            frontends: config
                .frontends
                .iter()
                .map(|f| AtomicUsize::new(f.maxconn))
                .collect(),
            listeners: config
                .frontends
                .iter()
                .map(|f| {
                    (0..f.binds.len())
                        .map(|i| f.bind_opts.get(i).and_then(|o| o.maxconn).unwrap_or(0))
                        .collect()
                })
                .collect(),
        }
    }

    /// The process-wide limit in force.
    pub fn global(&self) -> usize {
        self.global.load(Ordering::Relaxed)
    }

    /// Frontend `fi`'s limit in force (0 = global only; unknown index = 0).
    pub fn frontend(&self, fi: usize) -> usize {
        self.frontends
            .get(fi)
            .map_or(0, |m| m.load(Ordering::Relaxed))
    }
}

/// Flow and accept-loop counts, limits and the accept hold.
#[derive(Debug)]
pub struct Admission {
    /// Current flows in the process (global maxconn).
    conns: AtomicUsize,
    /// Current flows per frontend per bind address (`bind ... maxconn`),
    /// shaped as `limits.listeners`.
    listener_conns: Vec<Vec<AtomicUsize>>,
    /// Accept loops not yet ended. A soft stop waits for them before it looks
    /// at `conns`: a client accepted as the stop began is counted by then.
    accepting: AtomicUsize,
    limits: Limits,
    /// Signalled whenever a flow ends, to resume paused accept loops.
    released: Notify,
    /// Accepting held: every accept loop waits, its socket open, while true.
    hold: watch::Sender<bool>,
}

impl Admission {
    /// `accept_loops` loops will run; accepting starts held when `held`.
    pub fn new(limits: Limits, accept_loops: usize, held: bool) -> Self {
        let listener_conns = limits
            .listeners
            .iter()
            .map(|l| l.iter().map(|_| AtomicUsize::new(0)).collect())
            .collect();
        Self {
            conns: AtomicUsize::new(0),
            listener_conns,
            accepting: AtomicUsize::new(accept_loops),
            limits,
            released: Notify::new(),
            hold: watch::channel(held).0,
        }
    }

    /// Flows in the process now.
    pub fn conns(&self) -> usize {
        self.conns.load(Ordering::Relaxed)
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// `set maxconn global`: the new limit, and accept loops paused at the
    /// old one re-check.
    pub fn set_global_limit(&self, n: usize) {
        self.limits.global.store(n, Ordering::Relaxed);
        self.released.notify_waiters();
    }

    /// `set maxconn frontend`: as [`Admission::set_global_limit`] for frontend `fi`.
    pub fn set_frontend_limit(&self, fi: usize, n: usize) {
        if let Some(m) = self.limits.frontends.get(fi) {
            m.store(n, Ordering::Relaxed);
        }
        self.released.notify_waiters();
    }

    /// Whether a new flow fits under the global limit and frontend `fe`'s,
    /// `fe_cur` being that frontend's current flows.
    pub fn has_room(&self, fe: usize, fe_cur: usize) -> bool {
        let fe_max = self.limits.frontend(fe);
        self.conns() < self.limits.global() && (fe_max == 0 || fe_cur < fe_max)
    }

    /// Whether listener `bind` of frontend `fe` is below its `maxconn` (always,
    /// without one).
    pub fn listener_has_room(&self, fe: usize, bind: usize) -> bool {
        let max = self
            .limits
            .listeners
            .get(fe)
            .and_then(|l| l.get(bind))
            .copied()
            .unwrap_or(0);
        max == 0 || self.listener_conns(fe, bind) < max
    }

    /// Flows accepted on listener `bind` of frontend `fe` and still running.
    pub fn listener_conns(&self, fe: usize, bind: usize) -> usize {
        self.listener_slot(fe, bind)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    fn listener_slot(&self, fe: usize, bind: usize) -> Option<&AtomicUsize> {
        self.listener_conns.get(fe).and_then(|l| l.get(bind))
    }

    /// Resolves when a flow ends (or at once if one ended since the last wait
    /// started: callers re-check their condition either way).
    pub async fn released(&self) {
        self.released.notified().await;
    }

    /// An accept loop ended (Release: its last count is visible to
    /// [`Admission::all_loops_ended`]).
    pub fn loop_ended(&self) {
        self.accepting.fetch_sub(1, Ordering::Release);
    }

    /// Every accept loop has ended and counted its last client.
    pub fn all_loops_ended(&self) -> bool {
        self.accepting.load(Ordering::Acquire) == 0
    }

    /// Hold (true) or release (false) every accept loop.
    pub fn hold_accepting(&self, hold: bool) {
        self.hold.send_replace(hold);
    }

    /// A receiver of the accept hold, to wait for changes.
    pub fn hold_watch(&self) -> watch::Receiver<bool> {
        self.hold.subscribe()
    }

    /// Resolves once accepting is not held (at once when it is not).
    pub async fn serving(&self) {
        let mut rx = self.hold.subscribe();
        // The sender lives in `self`: the wait ends only by the condition.
        let _ = rx.wait_for(|held| !*held).await;
    }
}

/// One flow counted in the process (and on its listener, when it was
/// accepted) until the guard drops.
pub struct ConnGuard {
    rt: Arc<super::Runtime>,
    /// (frontend, bind) of the listener that accepted the flow.
    listener: Option<(usize, usize)>,
}

impl ConnGuard {
    /// Count one more flow in the process until the guard drops.
    pub fn new(rt: Arc<super::Runtime>) -> Self {
        rt.admission.conns.fetch_add(1, Ordering::Relaxed);
        ConnGuard { rt, listener: None }
    }

    /// [`ConnGuard::new`] for a flow accepted on listener `bind` of frontend
    /// `fe`, counted on that listener too.
    pub fn accepted(rt: Arc<super::Runtime>, fe: usize, bind: usize) -> Self {
        if let Some(c) = rt.admission.listener_slot(fe, bind) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let mut g = Self::new(rt);
        g.listener = Some((fe, bind));
        g
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let a = &self.rt.admission;
        if let Some(c) = self
            .listener
            .and_then(|(fe, bind)| a.listener_slot(fe, bind))
        {
            c.fetch_sub(1, Ordering::Relaxed);
        }
        a.conns.fetch_sub(1, Ordering::Relaxed);
        a.released.notify_waiters();
    }
}
