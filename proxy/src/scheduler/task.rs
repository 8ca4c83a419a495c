//! Task identity, wakers and handles.
//!
//! Owns: [`Header`] (the `Send + Sync` part of a task that its wakers and its
//! [`TaskHandle`] point to) and the wake routing. The future itself never leaves
//! its worker's slab; a header only names it by key.
//!
//! Invariants:
//! - `queued` is true from the moment an entry for the task is pushed until the
//!   worker takes it to run; a wake that finds it true does nothing, so a task
//!   woken many times before it runs is queued once.
//! - A key is `(generation << 32) | slot`; the generation changes when the task
//!   ends, so an entry or a stray waker of a finished task never reaches the
//!   task that reuses its slot.
//! - Wake classes: heavy task (spawned Heavy or marked heavy, unless
//!   `tune.sched.heavy-cap off`) → Heavy; on the owning thread with no task running
//!   (reactor, timers) → Urgent; while another task (or a remote job) runs →
//!   Normal; while the task itself runs → Bulk; from another thread → Urgent
//!   through the owner's inbox.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Wake;

use super::remote::{Inbox, Shared};
use super::worker;

/// Slot index and generation of a task, packed.
pub(crate) type TaskKey = u64;

pub(crate) fn make_key(slot: u32, generation: u32) -> TaskKey {
    (u64::from(generation) << 32) | u64::from(slot)
}

pub(crate) fn key_slot(key: TaskKey) -> usize {
    (key & u64::from(u32::MAX)) as usize
}

pub(crate) fn key_generation(key: TaskKey) -> u32 {
    (key >> 32) as u32
}

/// The shared, thread-safe part of a task.
pub(crate) struct Header {
    pub(crate) key: TaskKey,
    /// Spawned Heavy or marked heavy (`scheduler::enter_heavy`). Written only
    /// by the owning worker between two polls; a wake from another thread may
    /// read the value of the previous poll (it then lands one class off once).
    pub(crate) heavy: AtomicBool,
    pub(crate) queued: AtomicBool,
    pub(crate) aborted: AtomicBool,
    pub(crate) done: AtomicBool,
    pub(crate) owner: Arc<Shared>,
}

impl Header {
    pub(crate) fn new(key: TaskKey, heavy: bool, owner: Arc<Shared>) -> Self {
        Self {
            key,
            heavy: AtomicBool::new(heavy),
            // A new task is queued by `spawn` right away.
            queued: AtomicBool::new(true),
            aborted: AtomicBool::new(false),
            done: AtomicBool::new(false),
            owner,
        }
    }

    /// Claim the right to queue this task; false if it is already queued or over.
    fn claim(&self) -> bool {
        !self.done.load(Ordering::Acquire) && !self.queued.swap(true, Ordering::AcqRel)
    }
}

/// Route a wake by reference (the waker stays with the caller).
fn wake_ref(h: &Arc<Header>) {
    if !h.claim() {
        return;
    }
    if !worker::wake_on_owner(h) {
        h.owner.send(Inbox::Wake(Arc::clone(h)));
    }
}

impl Wake for Header {
    fn wake(self: Arc<Self>) {
        if !self.claim() {
            return;
        }
        if !worker::wake_on_owner(&self) {
            let owner = Arc::clone(&self.owner);
            owner.send(Inbox::Wake(self));
        }
    }

    fn wake_by_ref(self: &Arc<Self>) {
        wake_ref(self);
    }
}

/// Handle to a spawned task. Dropping it detaches the task.
pub struct TaskHandle {
    pub(crate) header: Arc<Header>,
}

impl TaskHandle {
    /// Cancel the task: its future is dropped on its own thread at the next
    /// chance (before it would be polled again). Works from any thread; a no-op
    /// once the task has finished.
    pub fn abort(&self) {
        if self.header.done.load(Ordering::Acquire) {
            return;
        }
        self.header.aborted.store(true, Ordering::Release);
        wake_ref(&self.header);
    }

    /// True once the task has completed or been aborted (its future dropped).
    pub fn is_finished(&self) -> bool {
        self.header.done.load(Ordering::Acquire)
    }
}

impl std::fmt::Debug for TaskHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskHandle")
            .field("thread", &self.header.owner.thread_id)
            .field("slot", &key_slot(self.header.key))
            .field("finished", &self.is_finished())
            .finish()
    }
}
