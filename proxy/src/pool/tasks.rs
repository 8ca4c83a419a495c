//! The per-worker pool task: refills this thread's lists toward their share of
//! the need, and on worker 0 runs every server's housekeeping (flush on
//! maintenance / DOWN / weight 0 / address change, age-out, purge periods).
//!
//! Owns: the task loop and the spare connects it starts. Must not: block, or
//! take spares (only flows take). A take kicks its thread's task (`lb::spares::kick`) so a
//! consumed spare is replaced at once rather than at the next tick. At soft or
//! hard stop the task flushes every pool and ends.

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::runtime::{Phase, Runtime};
use crate::scheduler::{self, Class, TaskHandle};

use crate::lb::spares::FlushReason;

/// Housekeeping period: a server that stops taking traffic or moves has its
/// spares closed within this delay (or its `pool-purge-delay` if shorter).
pub const WATCH_TICK: Duration = Duration::from_millis(100);

/// `(backend, server)` indexes of the servers that keep spares.
fn pooled(state: &Runtime) -> Vec<(usize, usize)> {
    state
        .backends
        .iter()
        .enumerate()
        .flat_map(|(bi, be)| {
            be.servers
                .iter()
                .enumerate()
                .filter(|(_, s)| s.pool.enabled())
                .map(move |(si, _)| (bi, si))
        })
        .collect()
}

/// Create every server's per-thread lists; call once before the workers start.
pub fn init(state: &Runtime) {
    for be in &state.backends {
        for s in &be.servers {
            s.pool
                .init(state.facts.nbthread(), state.config.global.idle_pool_shared);
        }
    }
}

/// The pool task of worker `tid`, when some server keeps spares.
pub fn spawn_for_worker(state: &Arc<Runtime>, tid: usize) -> Vec<TaskHandle> {
    let servers = pooled(state);
    if servers.is_empty() {
        return Vec::new();
    }
    let notify = Rc::new(Notify::new());
    crate::lb::spares::set_kick(notify.clone());
    vec![scheduler::spawn(
        Class::Normal,
        "pool",
        maintain(state.clone(), tid, servers, notify),
    )]
}

async fn maintain(
    state: Arc<Runtime>,
    tid: usize,
    servers: Vec<(usize, usize)>,
    notify: Rc<Notify>,
) {
    let mut phase = state.lifecycle.subscribe();
    let tick = servers
        .iter()
        .map(|&(bi, si)| state.backends[bi].servers[si].pool.params().purge_delay)
        .fold(WATCH_TICK, Duration::min)
        .max(Duration::from_millis(1));
    loop {
        if *phase.borrow() != Phase::Running {
            for &(bi, si) in &servers {
                state.backends[bi].servers[si]
                    .pool
                    .flush(FlushReason::Stopping);
            }
            return;
        }
        if tid == 0 {
            let now = Instant::now();
            for &(bi, si) in &servers {
                let rt = &state.backends[bi].servers[si];
                rt.pool.housekeep(rt.usable(), rt.addr(), now);
            }
        }
        for &(bi, si) in &servers {
            refill(&state, tid, bi, si);
        }
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(tick) => {}
            _ = phase.changed() => {}
        }
    }
}

/// Start the connects this thread's list of server `si` needs.
fn refill(state: &Arc<Runtime>, tid: usize, bi: usize, si: usize) {
    let rt = &state.backends[bi].servers[si];
    let n = rt.pool.plan_refill(tid, rt.usable(), rt.maxconn());
    for _ in 0..n {
        let st = state.clone();
        let addr = rt.addr();
        let gen = rt.pool.generation();
        let be = &state.config.backends[bi];
        let timeout = be.timeouts.connect;
        let opts = crate::lb::spares::ConnectOpts::of(be, &be.servers[si]);
        let _ = scheduler::spawn(Class::Normal, "pool-connect", async move {
            let rt = &st.backends[bi].servers[si];
            let made = match crate::lb::spares::connect(addr, timeout, opts).await {
                Ok(s) => s.into_std().map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match made {
                Ok(sock) => rt.pool.push(tid, sock, addr, gen, rt.addr(), rt.usable()),
                Err(e) => {
                    tracing::debug!(server = %rt.name, %addr, error = %e, "spare connect failed");
                    rt.pool.connect_failed(tid);
                }
            }
        });
    }
}
