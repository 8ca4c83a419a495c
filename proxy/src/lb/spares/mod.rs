//! Warm server connections: per-thread pools of pre-connected spares.
//!
//! Owns: every spare connection (connected to a server ahead of need, never
//! used), the per-thread lists holding them, their sizing (`sizing.rs`), and the
//! counters `show servers conn`, `show stat` and `show info` print. Kept with
//! the server (`ServerRt::pool`) in `lb`; the per-worker task that refills,
//! ages and purges them is `crate::pool`, which wakes through [`kick`].
//!
//! HAProxy has no idle pool in TCP mode, since a connection that carried a
//! client's bytes can never be reused. A spare carried none: a new flow takes one
//! instead of waiting a connect round trip, and the pool follows HAProxy 2.2's
//! thread-aware discipline:
//!
//! - one list per thread, each in its own [`Padded`] block (no cache line shared
//!   between threads; `tests.rs` measures the difference);
//! - a thread takes its own newest spare first; a sibling's only while the
//!   server's total spare count is at least `pool-low-conn` and
//!   `tune.idle-pool.shared` is on, scanning siblings round-robin from the one
//!   after the last it took from (first: after itself); each such take counts in
//!   the thread's `fd_takeover`;
//! - a spare is checked at take time with `recv(MSG_PEEK | MSG_DONTWAIT)`: EOF or
//!   an error → discarded (`warm_dead`) and the next one tried; no data → good;
//!   data → a server-first greeting, left unread in the socket so the forwarding
//!   path delivers it to the client (every mode reads the socket itself);
//! - spares older than [`SPARE_MAX_AGE`], of an older address, or of a server
//!   that stopped taking traffic are discarded (`warm_purged`).
//!
//! Invariants:
//! - a spare is never read or written by userspace before a client owns it, and
//!   a connection that carried a byte never enters a list (nothing is returned);
//! - `reserved` (spares listed + connects in flight) never exceeds
//!   `pool-max-conn`: a connect starts only after a successful reservation;
//! - spares are stored as `std::net::TcpStream`, registered with no reactor, so
//!   any worker may take any spare and register it with its own runtime.
//!
//! # Race window
//! A flush (maintenance, DOWN, address change, weight 0, stop) bumps `gen` and
//! empties the lists, while a connect may be in flight towards the old address:
//! [`ServerPool::push`] drops a spare whose generation or address is stale, and
//! [`ServerPool::take`] compares the spare's address with the server's current one,
//! so no flow after an address change reaches the old address.

mod connect;
mod sizing;
#[cfg(test)]
mod tests;

use std::cell::RefCell;
use std::rc::Rc;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::config::PoolParams;

pub use connect::{connect, socket, ConnectError, ConnectOpts};
pub use sizing::{per_thread_target, Sizing};

thread_local! {
    /// Wakes this worker's pool task (a take or a new flow changed the need).
    static KICK: RefCell<Option<Rc<tokio::sync::Notify>>> = const { RefCell::new(None) };
}

/// Wake the current worker's pool task; a no-op where none runs.
pub fn kick() {
    KICK.with(|k| {
        if let Some(n) = k.borrow().as_ref() {
            n.notify_one();
        }
    });
}

/// The current worker's pool task, woken by [`kick`] (set once by that task).
pub fn set_kick(notify: Rc<tokio::sync::Notify>) {
    KICK.with(|k| *k.borrow_mut() = Some(notify));
}

/// Oldest a spare may be when taken or kept: below the shortest common
/// pre-authentication timeout (MySQL's `connect_timeout`, 10 s), so a server
/// never times out a spare just before a client gets it.
pub const SPARE_MAX_AGE: Duration = Duration::from_secs(8);

/// Spares a take may discard (dead, stale) before it gives up and connects:
/// bounds the added latency when a server closed all of them.
pub const TAKE_SCAN_MAX: usize = 64;

/// A failed spare connect pauses refilling on that thread for this long, so a
/// dead server is not hammered by the pool (flows still connect themselves).
pub const REFILL_BACKOFF: Duration = Duration::from_secs(1);

/// A value alone on its pair of cache lines (x86's adjacent-line prefetcher
/// pulls lines in pairs, hence 128 bytes, as crossbeam's `CachePadded`).
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// One pre-connected connection.
#[derive(Debug)]
struct Spare {
    sock: std::net::TcpStream,
    born: Instant,
    addr: SocketAddr,
    gen: u64,
}

/// One thread's spares for one server.
#[derive(Debug, Default)]
struct ThreadList {
    /// Oldest at the front; takes pop the back (freshest), purges the front.
    spares: Mutex<VecDeque<Spare>>,
    /// `spares.len()`, readable without the lock (`idle_per_thr`).
    count: AtomicUsize,
    /// Connects in flight for this list (written by the owner thread only).
    connecting: AtomicUsize,
    /// Where the owner's next sibling scan starts (owner thread only).
    next_victim: AtomicUsize,
    /// No refill before this instant (after a failed connect).
    retry_at: Mutex<Option<Instant>>,
}

impl ThreadList {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Spare>> {
        self.spares.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug)]
struct Threads {
    lists: Box<[Padded<ThreadList>]>,
    shared: bool,
}

/// Why spares are dropped (for the log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushReason {
    /// Maintenance, DOWN, weight 0 or drain.
    NotUsable,
    /// `set server addr`.
    AddrChanged,
    /// The process stops.
    Stopping,
}

/// A server's warm-spare pool. Disabled (`pool-max-conn 0`, or never
/// [`ServerPool::init`]ed) it holds nothing and every call is a no-op.
#[derive(Debug)]
pub struct ServerPool {
    params: PoolParams,
    threads: OnceLock<Threads>,
    /// Spares in the lists (`idle_cur`).
    spares: AtomicUsize,
    /// Spares in the lists plus connects in flight: the `pool-max-conn` bound.
    reserved: AtomicUsize,
    /// Flows running on a connection to this server (`used_cur`).
    used_cur: AtomicUsize,
    /// Peak of `used_cur` in the current period (`used_max`).
    max_used: AtomicUsize,
    /// The rest of the sizing state, updated once per period.
    sizing: Mutex<Sizing>,
    /// Bumped by every flush: spares of an older generation are stale.
    gen: AtomicU64,
    /// The address the listed spares were made for (watched for changes).
    addr_seen: Mutex<Option<SocketAddr>>,
    next_purge: Mutex<Option<Instant>>,
    hit: AtomicU64,
    miss: AtomicU64,
    dead: AtomicU64,
    purged: AtomicU64,
}

/// Holds `used_cur` up while a flow runs on the server.
#[derive(Debug)]
pub struct Used<'a>(Option<&'a ServerPool>);

impl Drop for Used<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.0 {
            let _ = p
                .used_cur
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                    Some(c.saturating_sub(1))
                });
        }
    }
}

/// The pool's counters as the CLI prints them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub hit: u64,
    pub miss: u64,
    pub dead: u64,
    pub purged: u64,
}

impl std::ops::AddAssign for Counters {
    fn add_assign(&mut self, o: Self) {
        self.hit += o.hit;
        self.miss += o.miss;
        self.dead += o.dead;
        self.purged += o.purged;
    }
}

/// What a peek at a spare found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peek {
    /// Open, nothing received.
    Idle,
    /// Open with bytes waiting (a server-first greeting).
    Greeting,
    /// Closed or reset by the server.
    Dead,
}

/// Look at a spare without consuming anything.
pub fn peek(sock: &std::net::TcpStream) -> Peek {
    let mut b = [0u8; 1];
    // The spare is non-blocking (tokio's `into_std` keeps it so): `peek` is
    // recv(MSG_PEEK) and answers at once.
    match sock.peek(&mut b) {
        Ok(0) => Peek::Dead,
        Ok(_) => Peek::Greeting,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Peek::Idle,
        Err(_) => Peek::Dead,
    }
}

impl ServerPool {
    pub fn new(params: PoolParams) -> Self {
        Self {
            params,
            threads: OnceLock::new(),
            spares: AtomicUsize::new(0),
            reserved: AtomicUsize::new(0),
            used_cur: AtomicUsize::new(0),
            max_used: AtomicUsize::new(0),
            sizing: Mutex::new(Sizing::default()),
            gen: AtomicU64::new(0),
            addr_seen: Mutex::new(None),
            next_purge: Mutex::new(None),
            hit: AtomicU64::new(0),
            miss: AtomicU64::new(0),
            dead: AtomicU64::new(0),
            purged: AtomicU64::new(0),
        }
    }

    /// Create the per-thread lists (once, before the workers start); `shared` is
    /// `tune.idle-pool.shared`. A pool with `pool-max-conn 0` stays disabled.
    pub fn init(&self, nbthread: usize, shared: bool) {
        if self.params.max_conn == 0 {
            return;
        }
        let _ = self.threads.get_or_init(|| Threads {
            lists: (0..nbthread.max(1))
                .map(|_| Padded(ThreadList::default()))
                .collect(),
            shared,
        });
    }

    /// Spares are kept for this server.
    pub fn enabled(&self) -> bool {
        self.threads.get().is_some()
    }

    pub fn params(&self) -> PoolParams {
        self.params
    }

    /// A flow starts on this server; the guard ends it.
    pub fn used(&self) -> Used<'_> {
        if !self.enabled() {
            return Used(None);
        }
        let now = self.used_cur.fetch_add(1, Ordering::Relaxed) + 1;
        self.max_used.fetch_max(now, Ordering::Relaxed);
        // The need may have grown: let this thread's pool task refill.
        kick();
        Used(Some(self))
    }

    /// Take a spare for a new flow on thread `tid` whose server now lives at
    /// `addr`. `None` when the pool is off or has no usable spare (the caller
    /// connects; counted in `warm_miss` when the pool is on).
    pub fn take(&self, tid: usize, addr: SocketAddr) -> Option<std::net::TcpStream> {
        let th = self.threads.get()?;
        let n = th.lists.len();
        let own = tid % n;
        let gen = self.gen.load(Ordering::Acquire);
        let mut discarded = 0;
        while discarded < TAKE_SCAN_MAX {
            let Some((spare, from)) = self.pop_for(th, own) else {
                break;
            };
            if spare.gen != gen || spare.addr != addr || spare.born.elapsed() >= SPARE_MAX_AGE {
                self.purged.fetch_add(1, Ordering::Relaxed);
                discarded += 1;
                continue;
            }
            if peek(&spare.sock) == Peek::Dead {
                self.dead.fetch_add(1, Ordering::Relaxed);
                discarded += 1;
                continue;
            }
            if from != own {
                th.lists[own].next_victim.store(from + 1, Ordering::Relaxed);
                crate::scheduler::note_takeover();
            }
            self.hit.fetch_add(1, Ordering::Relaxed);
            return Some(spare.sock);
        }
        self.miss.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Pop the freshest spare of `own`, else (sharing allowed and the total at
    /// least `pool-low-conn`) of a sibling, round-robin. The reservation it held
    /// is released.
    fn pop_for(&self, th: &Threads, own: usize) -> Option<(Spare, usize)> {
        if let Some(s) = self.pop_back(&th.lists[own]) {
            return Some((s, own));
        }
        let n = th.lists.len();
        if !th.shared || n < 2 || self.spares.load(Ordering::Relaxed) < self.params.low_conn {
            return None;
        }
        let start = th.lists[own].next_victim.load(Ordering::Relaxed);
        (0..n)
            .map(|k| (start + k) % n)
            .filter(|&v| v != own)
            .find_map(|v| self.pop_back(&th.lists[v]).map(|s| (s, v)))
    }

    fn pop_back(&self, list: &ThreadList) -> Option<Spare> {
        if list.count.load(Ordering::Relaxed) == 0 {
            return None; // not even the lock for an empty list
        }
        let s = list.lock().pop_back()?;
        self.forget(list, 1);
        Some(s)
    }

    /// `k` spares left `list` (popped or dropped).
    fn forget(&self, list: &ThreadList, k: usize) {
        list.count.fetch_sub(k, Ordering::Relaxed);
        self.spares.fetch_sub(k, Ordering::Relaxed);
        self.reserved.fetch_sub(k, Ordering::Relaxed);
    }

    /// How many connects thread `tid` should start now to reach its share of the
    /// need; each returned unit is a reservation that [`Self::push`] or
    /// [`Self::connect_failed`] must settle. `maxconn` (0 = none) also bounds the
    /// spares, counting the flows already running.
    pub fn plan_refill(&self, tid: usize, usable: bool, maxconn: usize) -> usize {
        let Some(th) = self.threads.get() else {
            return 0;
        };
        if !usable {
            return 0;
        }
        let list = &th.lists[tid % th.lists.len()];
        let blocked = list
            .retry_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|t| Instant::now() < t);
        if blocked {
            return 0;
        }
        let mut need = self.need();
        if maxconn > 0 {
            need = need.min(maxconn.saturating_sub(self.used_cur.load(Ordering::Relaxed)));
        }
        let target = per_thread_target(need, self.params.max_conn, th.lists.len());
        let have = list.count.load(Ordering::Relaxed) + list.connecting.load(Ordering::Relaxed);
        let mut started = 0;
        while have + started < target && self.reserve() {
            started += 1;
        }
        list.connecting.fetch_add(started, Ordering::Relaxed);
        started
    }

    /// One slot under `pool-max-conn`.
    fn reserve(&self) -> bool {
        let max = self.params.max_conn;
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |r| {
                (max < 0 || (r as i64) < max).then_some(r + 1)
            })
            .is_ok()
    }

    /// The generation a connect started now belongs to.
    pub fn generation(&self) -> u64 {
        self.gen.load(Ordering::Acquire)
    }

    /// A planned connect of thread `tid` succeeded: list the spare, unless it is
    /// stale (flushed meanwhile, or the server moved or stopped taking traffic).
    pub fn push(
        &self,
        tid: usize,
        sock: std::net::TcpStream,
        addr: SocketAddr,
        gen: u64,
        current: SocketAddr,
        usable: bool,
    ) {
        let Some(th) = self.threads.get() else {
            return;
        };
        let list = &th.lists[tid % th.lists.len()];
        list.connecting.fetch_sub(1, Ordering::Relaxed);
        let mut q = list.lock();
        if gen != self.gen.load(Ordering::Acquire) || addr != current || !usable {
            drop(q);
            self.reserved.fetch_sub(1, Ordering::Relaxed);
            self.purged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.push_back(Spare {
            sock,
            born: Instant::now(),
            addr,
            gen,
        });
        list.count.fetch_add(1, Ordering::Relaxed);
        self.spares.fetch_add(1, Ordering::Relaxed);
    }

    /// A planned connect of thread `tid` failed: release the slot, pause refills.
    pub fn connect_failed(&self, tid: usize) {
        let Some(th) = self.threads.get() else {
            return;
        };
        let list = &th.lists[tid % th.lists.len()];
        list.connecting.fetch_sub(1, Ordering::Relaxed);
        self.reserved.fetch_sub(1, Ordering::Relaxed);
        *list.retry_at.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(Instant::now() + REFILL_BACKOFF);
    }

    /// Drop every spare (closing them now); returns how many.
    pub fn flush(&self, why: FlushReason) -> usize {
        let Some(th) = self.threads.get() else {
            return 0;
        };
        self.gen.fetch_add(1, Ordering::AcqRel);
        let mut n = 0;
        for list in th.lists.iter() {
            let dropped: Vec<Spare> = list.lock().drain(..).collect();
            self.forget(list, dropped.len());
            n += dropped.len();
        }
        self.purged.fetch_add(n as u64, Ordering::Relaxed);
        if n > 0 {
            tracing::debug!(spares = n, reason = ?why, "warm spares flushed");
        }
        n
    }

    /// Drop the spares older than `max_age` (oldest are at each list's front).
    pub fn expire(&self, max_age: Duration) -> usize {
        let Some(th) = self.threads.get() else {
            return 0;
        };
        let mut n = 0;
        for list in th.lists.iter() {
            let mut q = list.lock();
            let mut k = 0;
            while q.front().is_some_and(|s| s.born.elapsed() >= max_age) {
                q.pop_front();
                k += 1;
            }
            drop(q);
            self.forget(list, k);
            n += k;
        }
        self.purged.fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    /// Periodic care on one worker, every tick: flush when the server stopped
    /// taking traffic or moved, expire old spares, and at each purge period run
    /// the sizing step and kill its excess, oldest first across threads.
    pub fn housekeep(&self, usable: bool, addr: SocketAddr, now: Instant) {
        if !self.enabled() {
            return;
        }
        {
            let mut seen = self
                .addr_seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if seen.is_some_and(|a| a != addr) {
                self.flush(FlushReason::AddrChanged);
            }
            *seen = Some(addr);
        }
        if !usable {
            self.flush(FlushReason::NotUsable);
        }
        self.expire(SPARE_MAX_AGE);
        let due = {
            let mut next = self
                .next_purge
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match *next {
                None => {
                    *next = Some(now + self.params.purge_delay);
                    false
                }
                Some(t) if now >= t => {
                    *next = Some(now + self.params.purge_delay);
                    true
                }
                Some(_) => false,
            }
        };
        if due {
            self.purge_period();
        }
    }

    /// One purge period: the sizing step, then kill its excess, oldest first.
    pub fn purge_period(&self) -> usize {
        let used_now = self.used_cur.load(Ordering::Relaxed);
        let kill = {
            let mut s = self.sizing.lock().unwrap_or_else(PoisonError::into_inner);
            // The period's peak lives in the atomic; the next period starts at
            // the flows running now.
            s.max_used = self.max_used.swap(used_now, Ordering::Relaxed);
            s.period_end(self.spares.load(Ordering::Relaxed), used_now)
        };
        self.kill_oldest(kill)
    }

    /// Kill up to `k` spares, each time the oldest among all threads' fronts.
    fn kill_oldest(&self, k: usize) -> usize {
        let Some(th) = self.threads.get() else {
            return 0;
        };
        let mut killed = 0;
        while killed < k {
            let oldest = th
                .lists
                .iter()
                .enumerate()
                .filter_map(|(i, l)| l.lock().front().map(|s| (s.born, i)))
                .min();
            let Some((_, i)) = oldest else { break };
            let list = &th.lists[i];
            if list.lock().pop_front().is_some() {
                self.forget(list, 1);
                killed += 1;
            }
        }
        self.purged.fetch_add(killed as u64, Ordering::Relaxed);
        killed
    }

    /// The spares wanted now (`need_est` as `show servers conn` prints it).
    pub fn need(&self) -> usize {
        let mut s = *self.sizing.lock().unwrap_or_else(PoisonError::into_inner);
        s.note_used(self.max_used.load(Ordering::Relaxed));
        s.need()
    }

    pub fn used_cur(&self) -> usize {
        self.used_cur.load(Ordering::Relaxed)
    }

    /// Peak of concurrent flows in the current period.
    pub fn used_max(&self) -> usize {
        self.max_used.load(Ordering::Relaxed)
    }

    /// HAProxy's `est_need` as of the last period.
    pub fn est_need(&self) -> usize {
        self.sizing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .est_need
    }

    /// Spares held now, all threads (`idle_cur`).
    pub fn idle_cur(&self) -> usize {
        self.spares.load(Ordering::Relaxed)
    }

    /// Spares per thread (`idle_per_thr`); zeros when disabled.
    pub fn idle_per_thr(&self, nbthread: usize) -> Vec<usize> {
        match self.threads.get() {
            Some(th) => th
                .lists
                .iter()
                .map(|l| l.count.load(Ordering::Relaxed))
                .collect(),
            None => vec![0; nbthread],
        }
    }

    pub fn counters(&self) -> Counters {
        Counters {
            hit: self.hit.load(Ordering::Relaxed),
            miss: self.miss.load(Ordering::Relaxed),
            dead: self.dead.load(Ordering::Relaxed),
            purged: self.purged.load(Ordering::Relaxed),
        }
    }
}
