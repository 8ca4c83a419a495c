//! Per-worker registry of live flows, for `show sess` and `shutdown session(s)`.
//!
//! Owns one thread-local table per worker thread: each worker registers, updates
//! and removes only its own flows, so the forwarding path takes no lock and
//! touches no shared cache line. Other threads (the CLI) reach a worker's table
//! only by sending it a job (`scheduler::Remote::run`) that reads or aborts
//! entries on the owning thread.
//!
//! Invariants:
//! - A flow id is unique in the process and never reused while the process runs:
//!   the worker index lives in the high bits, a per-worker sequence below, and the
//!   low [`ID_SEQ_SHIFT`] bits are zero, so it reads like HAProxy's stream pointer.
//! - An entry lives exactly as long as its [`Registered`] guard, which the flow
//!   task's future owns: finishing or aborting the task removes the entry.
//! - Aborting a flow aborts its task (the future is dropped on its own thread:
//!   both sockets close and the sockmap guard deletes its map entries).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;

use crate::scheduler::{self, TaskHandle};

/// Low bits of an id left at zero (ids look like aligned pointers).
pub const ID_SEQ_SHIFT: u32 = 4;
/// Bit where the worker index (plus one) starts in an id.
pub const ID_THREAD_SHIFT: u32 = 40;
/// Most flows one gather job returns: bounds the memory of `show sess` and how long
/// one job holds the worker that owns the flows.
pub const GATHER_CHUNK: usize = 256;

/// What the CLI sees of one flow (a copy, `Send`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowView {
    pub id: u64,
    pub fe: usize,
    pub be: Option<usize>,
    pub srv: Option<usize>,
    pub client: SocketAddr,
    pub server: Option<SocketAddr>,
    /// Seconds since the flow was accepted.
    pub age_secs: u64,
    /// `sockmap`, `splice`, `copy` or `auto` once forwarding started.
    pub mode: Option<&'static str>,
    /// `auto` moved the flow to the kernel this long after it was accepted.
    pub promoted: Option<std::time::Duration>,
    /// Client-side and server-side descriptors (-1 when none).
    pub fd_client: i32,
    pub fd_server: i32,
}

struct Entry {
    view: FlowView,
    started: Instant,
    task: Option<TaskHandle>,
}

#[derive(Default)]
struct Registry {
    next_seq: u64,
    flows: BTreeMap<u64, Entry>,
}

thread_local! {
    static REG: RefCell<Registry> = RefCell::new(Registry::default());
}

/// The id of sequence number `seq` on worker `thread`.
pub fn make_id(thread: usize, seq: u64) -> u64 {
    ((thread as u64 + 1) << ID_THREAD_SHIFT) | (seq << ID_SEQ_SHIFT)
}

/// The worker that owns flow `id`, if the id is well formed.
pub fn thread_of(id: u64) -> Option<usize> {
    let t = id >> ID_THREAD_SHIFT;
    if t == 0 || id & ((1 << ID_SEQ_SHIFT) - 1) != 0 {
        return None;
    }
    usize::try_from(t - 1).ok()
}

/// Keeps a flow registered on the current worker while alive.
#[derive(Debug)]
pub struct Registered(u64);

impl Registered {
    /// Register a flow accepted on frontend `fe` from `client` (descriptor `fd`).
    pub fn new(fe: usize, client: SocketAddr, fd: i32) -> Self {
        let tid = scheduler::try_thread_id().unwrap_or(0);
        let id = REG.with(|r| {
            let mut r = r.borrow_mut();
            r.next_seq += 1;
            let id = make_id(tid, r.next_seq);
            r.flows.insert(
                id,
                Entry {
                    view: FlowView {
                        id,
                        fe,
                        be: None,
                        srv: None,
                        client,
                        server: None,
                        age_secs: 0,
                        mode: None,
                        promoted: None,
                        fd_client: fd,
                        fd_server: -1,
                    },
                    started: Instant::now(),
                    task: None,
                },
            );
            id
        });
        Registered(id)
    }

    pub fn id(&self) -> u64 {
        self.0
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        // At thread exit the table may already be gone; then there is nothing to do.
        let _ = REG.try_with(|r| {
            if let Ok(mut r) = r.try_borrow_mut() {
                r.flows.remove(&self.0);
            }
        });
    }
}

/// Attach the task that runs flow `id` (so it can be aborted).
pub fn set_task(id: u64, task: TaskHandle) {
    REG.with(|r| {
        if let Some(e) = r.borrow_mut().flows.get_mut(&id) {
            e.task = Some(task);
        }
    });
}

/// Change what is known of flow `id` (routing, server, mode).
pub fn update(id: u64, f: impl FnOnce(&mut FlowView)) {
    REG.with(|r| {
        if let Some(e) = r.borrow_mut().flows.get_mut(&id) {
            f(&mut e.view);
        }
    });
}

/// `auto` moved flow `id` to the kernel: it shows as `sockmap`, with when.
pub fn promoted(id: u64) {
    REG.with(|r| {
        if let Some(e) = r.borrow_mut().flows.get_mut(&id) {
            e.view.mode = Some("sockmap");
            e.view.promoted = Some(e.started.elapsed());
        }
    });
}

/// Up to `max` flows of this worker with ids above `after`, in id order.
pub fn gather(after: Option<u64>, max: usize) -> Vec<FlowView> {
    REG.with(|r| {
        let r = r.borrow();
        let range = match after {
            Some(a) => r.flows.range(a.saturating_add(1)..),
            None => r.flows.range(..),
        };
        range
            .take(max)
            .map(|(_, e)| {
                let mut v = e.view.clone();
                v.age_secs = e.started.elapsed().as_secs();
                v
            })
            .collect()
    })
}

/// Number of flows registered on this worker.
pub fn count() -> usize {
    REG.with(|r| r.borrow().flows.len())
}

/// Abort the flows of this worker that `pick` selects; returns how many.
pub fn abort_where(pick: impl Fn(&FlowView) -> bool) -> usize {
    // Take the handles out first: aborting wakes tasks, never under the borrow.
    let handles: Vec<TaskHandle> = REG.with(|r| {
        let mut r = r.borrow_mut();
        r.flows
            .values_mut()
            .filter(|e| pick(&e.view))
            .filter_map(|e| e.task.take())
            .collect()
    });
    for h in &handles {
        h.abort();
    }
    handles.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_reject_junk() {
        let id = make_id(3, 77);
        assert_eq!(thread_of(id), Some(3));
        assert_eq!(thread_of(0xdead_beef), None);
        assert_eq!(thread_of(id | 1), None);
        assert_ne!(make_id(0, 1), make_id(1, 1));
    }

    #[test]
    fn entries_follow_their_guard_and_gather_pages() {
        let peer: SocketAddr = "127.0.0.1:1000".parse().unwrap();
        let guards: Vec<Registered> = (0..5).map(|_| Registered::new(0, peer, -1)).collect();
        update(guards[1].id(), |v| v.mode = Some("copy"));
        let first = gather(None, 3);
        assert_eq!(first.len(), 3);
        assert_eq!(first[1].mode, Some("copy"));
        let rest = gather(Some(first[2].id), 3);
        assert_eq!(rest.len(), 2);
        assert_eq!(count(), 5);
        drop(guards);
        assert_eq!(count(), 0);
    }
}
