//! Runtime state of one backend: its servers, the selection algorithm, and
//! the FIFO queue of requests waiting for a connection slot.
//!
//! Owns: [`BackendRt`], [`Slot`] and [`AcquireError`]. A [`Slot`] is the
//! right to hold one connection on one server; its `Drop` gives the slot to
//! the oldest waiter that server may serve, or frees it.
//!
//! Invariants (all under `state`, the one lock of a backend, taken only at
//! connection setup and teardown, never per byte):
//! - `cur_conns` of a server equals the number of live slots on it plus the
//!   grants sent to waiters that have not yet turned them into slots;
//! - never more than `maxconn` slots of a server are out (a `maxconn`
//!   lowered at run time leaves the excess out until it is released: a
//!   release while over the limit frees the slot instead of handing it on);
//! - after any acquire or release, no server with a free slot has a waiter
//!   it may serve (so a newcomer taking a free slot never overtakes anyone);
//! - each queued waiter is counted once: in its server's `queue_cur` when it
//!   is pinned (`source`), else in the backend's `queue_cur`.
//!
//! # Race window
//! A waiter is granted a slot by removing its entry from the queue and
//! sending it the server index, both under the lock. A waiter that gives up
//! (timeout, or its future dropped) takes the lock and removes its entry; if
//! the entry is already gone a grant was sent before, and it is now sitting in
//! the waiter's channel, so the waiter turns it into a [`Slot`] (timeout) or
//! releases it to the next waiter (drop). Nothing that can re-enter the lock
//! (a `Slot` drop) ever runs while the lock is held: the channel carries a
//! plain index and slots are only created and dropped outside the lock.
//!
//! Queue bounds: a request pinned to a server waits in that server's queue,
//! refused when `maxqueue` is reached. HAProxy's backend queue is unbounded;
//! shunt bounds it by the sum of the candidates' `maxqueue` when every
//! candidate sets one (so `maxqueue` on all servers limits waiting whatever
//! the algorithm), and leaves it unbounded otherwise.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

use super::algo::{Choice, Ctx};
use super::leastconn::LeastConn;
use super::roundrobin::RoundRobin;
use super::server::ServerRt;
use super::source::Source;
use super::static_rr::StaticRr;
use super::{first, random};
use crate::config::Balance;

/// Why no connection slot was obtained.
#[derive(thiserror::Error, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireError {
    /// No server is usable (all down, in maintenance, weight 0, or excluded).
    #[error("no server available")]
    NoServer,
    /// The queue this request would wait in is at its `maxqueue` bound.
    #[error("queue full")]
    QueueFull,
    /// Waited `timeout queue` without getting a slot.
    #[error("timed out in queue")]
    QueueTimeout,
}

/// The selection algorithm with its state.
#[derive(Debug)]
enum Algo {
    RoundRobin(RoundRobin),
    StaticRr(StaticRr),
    LeastConn(LeastConn),
    First,
    Source(Source),
    Random,
}

/// A request waiting for a slot.
#[derive(Debug)]
struct Waiter {
    id: u64,
    /// Server this request must use (`source`), else any candidate.
    pin: Option<usize>,
    exclude: Option<usize>,
    /// Receives the index of the server whose slot is granted.
    grant: oneshot::Sender<usize>,
}

#[derive(Debug)]
struct State {
    algo: Algo,
    waiters: VecDeque<Waiter>,
    next_id: u64,
}

/// One backend's runtime state, shared by all worker threads.
#[derive(Debug)]
pub struct BackendRt {
    pub name: String,
    pub balance: Balance,
    /// `option allbackups`: with no active server left, every usable backup
    /// is a candidate, not only the first.
    allbackups: bool,
    /// In config order; `servers[i].idx == i`.
    pub servers: Vec<Arc<ServerRt>>,
    state: Mutex<State>,
    /// Requests in the backend queue (not pinned to a server).
    queue_cur: AtomicUsize,
    queue_max: AtomicUsize,
}

/// A held connection slot on one server. Dropping it frees the slot or hands
/// it to the head of the queue.
#[derive(Debug)]
pub struct Slot {
    backend: Arc<BackendRt>,
    idx: usize,
}

impl Slot {
    pub fn server(&self) -> &Arc<ServerRt> {
        &self.backend.servers[self.idx]
    }

    /// Index of the server in its backend.
    pub fn index(&self) -> usize {
        self.idx
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.backend.release(self.idx);
    }
}

/// Removes a waiter that gives up, and passes on a grant it got too late.
struct Wait<'a> {
    backend: &'a Arc<BackendRt>,
    id: u64,
    rx: oneshot::Receiver<usize>,
    /// Set once the outcome is settled; the guard then has nothing to do.
    done: bool,
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let removed = {
            let mut st = self.backend.lock();
            self.backend.remove_waiter(&mut st, self.id)
        };
        if !removed {
            // Granted right before we gave up: the slot is ours; pass it on.
            if let Ok(idx) = self.rx.try_recv() {
                self.backend.release(idx);
            }
        }
    }
}

/// What the hash-based algorithms may read of a flow: its client, and the
/// address it reached when known (`balance hash dst|dst_port`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowKey {
    pub src: SocketAddr,
    pub dst: Option<SocketAddr>,
}

impl From<SocketAddr> for FlowKey {
    fn from(src: SocketAddr) -> Self {
        FlowKey { src, dst: None }
    }
}

impl BackendRt {
    pub fn new(cfg: &crate::config::Backend) -> Arc<BackendRt> {
        let servers: Vec<Arc<ServerRt>> = cfg
            .servers
            .iter()
            .enumerate()
            .map(|(i, s)| Arc::new(ServerRt::new(i, s)))
            .collect();
        let algo = match cfg.balance {
            Balance::RoundRobin => Algo::RoundRobin(RoundRobin::new(servers.len())),
            Balance::StaticRr => Algo::StaticRr(StaticRr::default()),
            Balance::LeastConn => Algo::LeastConn(LeastConn::default()),
            Balance::First => Algo::First,
            Balance::Source => Algo::Source(Source::new(cfg.opts.hash_type, None)),
            Balance::Hash(k) => Algo::Source(Source::new(cfg.opts.hash_type, Some(k))),
            Balance::Random => Algo::Random,
        };
        Arc::new(BackendRt {
            name: cfg.name.clone(),
            balance: cfg.balance,
            allbackups: cfg.opts.allbackups,
            servers,
            state: Mutex::new(State {
                algo,
                waiters: VecDeque::new(),
                next_id: 0,
            }),
            queue_cur: AtomicUsize::new(0),
            queue_max: AtomicUsize::new(0),
        })
    }

    /// Requests waiting in the backend queue (not pinned to one server).
    pub fn queue_cur(&self) -> usize {
        self.queue_cur.load(Ordering::Relaxed)
    }

    /// Peak of [`Self::queue_cur`].
    pub fn queue_max(&self) -> usize {
        self.queue_max.load(Ordering::Relaxed)
    }

    /// The server called `name`, if any.
    /// `nbsrv`: the servers that may take traffic now, as HAProxy's
    /// `be_usable_srv` counts them: the usable active ones; with none, the
    /// usable backups under `option allbackups`, else one if any backup is
    /// usable (only the first serves).
    pub fn usable_servers(&self) -> usize {
        let (mut act, mut bck) = (0, 0);
        for s in self.servers.iter().filter(|s| s.usable()) {
            if s.backup {
                bck += 1;
            } else {
                act += 1;
            }
        }
        match (act, self.allbackups) {
            (0, true) => bck,
            (0, false) => bck.min(1),
            (n, _) => n,
        }
    }

    pub fn server_by_name(&self, name: &str) -> Option<&Arc<ServerRt>> {
        self.servers.iter().find(|s| s.name == name)
    }

    /// Pure selection (no slot taken): the server a connection would go to
    /// now, or `None` when there is no usable server or it would have to
    /// queue. Advances the algorithm (round-robin position) like a real pick.
    pub fn pick(&self, client: impl Into<FlowKey>, exclude: Option<usize>) -> Option<usize> {
        let mut st = self.lock();
        match self.select(&mut st, client.into(), exclude) {
            Some(Choice::Server(i)) => Some(i),
            _ => None,
        }
    }

    /// Pick a server and take a connection slot on it honouring maxconn; if
    /// every candidate is full, wait FIFO in the queue (bounded as the module
    /// doc says) up to `queue_timeout` (`None` = wait forever).
    ///
    /// Cancel-safe: dropping the future while queued removes the request
    /// from the queue, and a slot granted at that moment goes to the next
    /// waiter.
    pub async fn acquire(
        self: &Arc<Self>,
        client: impl Into<FlowKey>,
        exclude: Option<usize>,
        queue_timeout: Option<Duration>,
    ) -> Result<Slot, AcquireError> {
        self.acquire_sticky(client, None, exclude, queue_timeout)
            .await
    }

    /// [`Self::acquire`] for a flow a stick table sends to server `sticky`
    /// (`stick match`): that server when it takes persistent traffic (up,
    /// not in maintenance; draining is fine, as HAProxy's) and is not
    /// `exclude`d, waiting in its own queue while it is full; else the
    /// algorithm's pick. The algorithm's state does not move for a sticky
    /// pick.
    pub async fn acquire_sticky(
        self: &Arc<Self>,
        client: impl Into<FlowKey>,
        sticky: Option<usize>,
        exclude: Option<usize>,
        queue_timeout: Option<Duration>,
    ) -> Result<Slot, AcquireError> {
        let client: FlowKey = client.into();
        let sticky = sticky.filter(|&i| {
            Some(i) != exclude && self.servers.get(i).is_some_and(|s| s.takes_sticky())
        });
        let (id, rx) = {
            let mut st = self.lock();
            self.grant_waiting(&mut st);
            let choice = match sticky {
                Some(i) if self.servers[i].has_room() => Some(Choice::Server(i)),
                Some(i) => Some(Choice::Pinned(i)),
                None => self.select(&mut st, client, exclude),
            };
            let pin = match choice {
                None => return Err(AcquireError::NoServer),
                Some(Choice::Server(i)) => {
                    self.servers[i].take_slot();
                    self.servers[i].count_selected();
                    drop(st);
                    return Ok(self.slot(i));
                }
                Some(Choice::Full) => {
                    if let Some(limit) = self.backend_queue_limit(exclude) {
                        if self.queue_cur() >= limit {
                            return Err(AcquireError::QueueFull);
                        }
                    }
                    None
                }
                Some(Choice::Pinned(i)) => {
                    let s = &self.servers[i];
                    if s.maxqueue > 0 && s.queue_cur() >= s.maxqueue {
                        return Err(AcquireError::QueueFull);
                    }
                    Some(i)
                }
            };
            let (tx, rx) = oneshot::channel();
            let id = st.next_id;
            st.next_id = st.next_id.wrapping_add(1);
            st.waiters.push_back(Waiter {
                id,
                pin,
                exclude,
                grant: tx,
            });
            self.count_queued(pin);
            (id, rx)
        };

        let mut wait = Wait {
            backend: self,
            id,
            rx,
            done: false,
        };
        let got = match queue_timeout {
            None => Some((&mut wait.rx).await),
            Some(t) => tokio::time::timeout(t, &mut wait.rx).await.ok(),
        };
        match got {
            Some(Ok(idx)) => {
                wait.done = true;
                Ok(self.slot(idx))
            }
            // The sender vanished without a grant; cannot happen while we
            // hold `self`, but the honest answer is that no server took us.
            Some(Err(_)) => {
                wait.done = true;
                Err(AcquireError::NoServer)
            }
            None => {
                wait.done = true;
                let removed = {
                    let mut st = self.lock();
                    self.remove_waiter(&mut st, id)
                };
                if removed {
                    return Err(AcquireError::QueueTimeout);
                }
                // A grant raced with the timer: take it rather than waste it.
                match wait.rx.try_recv() {
                    Ok(idx) => Ok(self.slot(idx)),
                    Err(_) => Err(AcquireError::QueueTimeout),
                }
            }
        }
    }

    /// Give free slots to queued requests after a server state change
    /// (up, maintenance, weight). Acquire and release also do this, so
    /// calling it only makes the hand-over prompt.
    pub fn rebalance(self: &Arc<Self>) {
        let mut st = self.lock();
        self.grant_waiting(&mut st);
    }

    fn slot(self: &Arc<Self>, idx: usize) -> Slot {
        Slot {
            backend: Arc::clone(self),
            idx,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves counters that are still
        // consistent enough to go on; refusing all traffic would be worse.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Servers that may take a request avoiding `exclude`: the usable active
    /// servers when at least one of them is not excluded, else the first
    /// usable backup that is not excluded (every one with `option
    /// allbackups`). Sorted by server index.
    fn candidates(&self, exclude: Option<usize>) -> Vec<usize> {
        let active: Vec<usize> = self
            .servers
            .iter()
            .filter(|s| !s.backup && s.usable())
            .map(|s| s.idx)
            .collect();
        if active.iter().any(|&i| Some(i) != exclude) {
            return active;
        }
        let mut backups = self
            .servers
            .iter()
            .filter(|s| s.backup && s.usable() && Some(s.idx) != exclude)
            .map(|s| s.idx);
        if self.allbackups {
            backups.collect()
        } else {
            backups.next().into_iter().collect()
        }
    }

    /// Run the algorithm; `None` when no server is usable.
    fn select(&self, st: &mut State, client: FlowKey, exclude: Option<usize>) -> Option<Choice> {
        let cands = self.candidates(exclude);
        if cands.is_empty() {
            return None;
        }
        let ctx = Ctx {
            servers: &self.servers,
            cands: &cands,
            exclude,
        };
        let picked = match &mut st.algo {
            Algo::RoundRobin(rr) => rr.pick(&ctx),
            Algo::StaticRr(srr) => srr.pick(&ctx),
            Algo::LeastConn(lc) => lc.pick(&ctx),
            Algo::First => first::pick(&ctx),
            Algo::Random => random::pick(&ctx),
            Algo::Source(src) => return src.pick(&ctx, client),
        };
        Some(picked.map_or(Choice::Full, Choice::Server))
    }

    /// Bound of the backend queue for a request avoiding `exclude`.
    fn backend_queue_limit(&self, exclude: Option<usize>) -> Option<usize> {
        let cands = self.candidates(exclude);
        let mut sum = 0usize;
        for i in cands {
            match self.servers[i].maxqueue {
                0 => return None,
                q => sum = sum.saturating_add(q),
            }
        }
        Some(sum)
    }

    /// May server `i` serve waiter `w` now (ignoring its free slots)?
    /// `plain` is `candidates(None)`, shared by the many waiters without
    /// an exclusion.
    fn serves(&self, i: usize, w: &Waiter, plain: &[usize]) -> bool {
        if w.exclude == Some(i) {
            return false;
        }
        match (w.pin, w.exclude) {
            (Some(p), _) => p == i && self.servers[i].usable(),
            (None, None) => plain.binary_search(&i).is_ok(),
            (None, ex) => self.candidates(ex).binary_search(&i).is_ok(),
        }
    }

    fn count_queued(&self, pin: Option<usize>) {
        match pin {
            Some(p) => self.servers[p].queue_inc(),
            None => {
                let now = self.queue_cur.fetch_add(1, Ordering::Relaxed) + 1;
                self.queue_max.fetch_max(now, Ordering::Relaxed);
            }
        }
    }

    fn count_dequeued(&self, pin: Option<usize>) {
        match pin {
            Some(p) => self.servers[p].queue_dec(),
            None => {
                let _ = self
                    .queue_cur
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                        Some(c.saturating_sub(1))
                    });
            }
        }
    }

    /// Remove waiter `id` if still queued; false when it was already granted.
    fn remove_waiter(&self, st: &mut State, id: u64) -> bool {
        let Some(pos) = st.waiters.iter().position(|w| w.id == id) else {
            return false;
        };
        if let Some(w) = st.waiters.remove(pos) {
            self.count_dequeued(w.pin);
        }
        true
    }

    /// Hand server `i`'s slot (already counted in its `cur_conns`) to the
    /// oldest waiter it may serve. False when nobody took it.
    fn hand_over(&self, st: &mut State, i: usize) -> bool {
        if st.waiters.is_empty() {
            return false;
        }
        let plain = self.candidates(None);
        loop {
            let Some(pos) = st.waiters.iter().position(|w| self.serves(i, w, &plain)) else {
                return false;
            };
            let Some(w) = st.waiters.remove(pos) else {
                return false;
            };
            self.count_dequeued(w.pin);
            // A send only fails if the receiver is gone, and a receiver is
            // only dropped after its entry left the queue (see `Wait`); try
            // the next waiter anyway rather than lose the slot.
            if w.grant.send(i).is_ok() {
                self.servers[i].count_selected();
                return true;
            }
        }
    }

    /// Restore the "no free slot with an eligible waiter" invariant.
    fn grant_waiting(&self, st: &mut State) {
        if st.waiters.is_empty() {
            return;
        }
        // A pinned server that went away releases its waiters to the
        // backend queue (HAProxy redistributes them likewise).
        for w in st.waiters.iter_mut() {
            if let Some(p) = w.pin {
                if !self.servers[p].usable() {
                    w.pin = None;
                    self.servers[p].queue_dec();
                    self.count_queued(None);
                }
            }
        }
        for i in 0..self.servers.len() {
            while self.servers[i].has_room() && !st.waiters.is_empty() {
                self.servers[i].take_slot();
                if !self.hand_over(st, i) {
                    self.servers[i].drop_slot();
                    break;
                }
            }
        }
    }

    /// A slot on server `i` is given back.
    fn release(&self, i: usize) {
        let mut st = self.lock();
        let srv = &self.servers[i];
        // Above a maxconn lowered at run time the slot is freed, not handed on.
        let over = srv.maxconn() != 0 && srv.cur_conns() > srv.maxconn();
        if !over && self.hand_over(&mut st, i) {
            // The slot stays counted in cur_conns: it changed holder.
            return;
        }
        srv.drop_slot();
    }
}
