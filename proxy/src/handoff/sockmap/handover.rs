//! The process's hand-over of its kernel flows to a successor (see
//! "Hand-over" in the module doc of `crate::reload`): which flows answer a
//! request, the request itself, and the collection of their states.
//!
//! Owns: the registry of one loaded kernel ([`super::Kernel`] holds it, so
//! there is one per process and none without BPF). Must not: touch a flow's
//! sockets or map entries (the flow does that itself when asked).
//!
//! A hand-over that did not commit is undone by [`Registry::reopen`], which
//! starts a new generation: members of an earlier one can no longer answer
//! or be counted.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::Duration;

use super::Handed;

/// Poll period of [`Registry::collect`] while flows quiesce.
const HANDOVER_POLL: Duration = Duration::from_millis(1);

#[derive(Debug, Default)]
struct Reg {
    /// Current generation (one per hand-over attempt).
    generation: u64,
    /// Flows of this generation registered to answer a request and not
    /// answered or ended yet.
    live: usize,
    /// A request was made: flows starting later are not registered.
    requested: bool,
    /// The collection was taken: later offers are refused.
    closed: bool,
    items: Vec<Handed>,
}

/// Members, the request and the collection of one process's kernel flows.
#[derive(Debug, Default)]
pub struct Registry {
    reg: Mutex<Reg>,
    /// The generation whose members are asked to hand themselves over, plus
    /// one (0: none). Beside the lock so a waiting member reads it alone.
    /// Members are woken through the watch their sockets are in (see
    /// [`Member::requested`]).
    asked: AtomicU64,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Reg> {
        // A panic while holding it leaves counts only: still usable.
        self.reg.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Register a kernel flow starting now (unregistered once a request was
    /// made: it finishes in this process).
    pub(crate) fn join(&self) -> Member<'_> {
        let mut reg = self.lock();
        let registered = !reg.requested;
        if registered {
            reg.live += 1;
        }
        Member {
            registry: self,
            registered,
            generation: reg.generation,
        }
    }

    /// Ask every registered kernel flow to quiesce and hand itself over; wait
    /// (at most `limit`) until each has answered or ended, then take the
    /// collection. Flows starting from now on are not registered.
    pub async fn collect(&self, limit: Duration) -> Vec<Handed> {
        let gen = {
            let mut reg = self.lock();
            reg.requested = true;
            reg.generation
        };
        // Stored before the wake: a flow that meets a fired slot after it
        // (the slot's lock orders them) reads the request.
        self.asked.store(gen + 1, Ordering::Release);
        super::watch::wake_all();
        let t0 = tokio::time::Instant::now();
        loop {
            {
                let mut reg = self.lock();
                if reg.live == 0 || t0.elapsed() >= limit {
                    if reg.live > 0 {
                        tracing::warn!(
                            flows = reg.live,
                            "kernel flows did not quiesce in time: they stay in this process"
                        );
                    }
                    reg.closed = true;
                    return std::mem::take(&mut reg.items);
                }
            }
            tokio::time::sleep(HANDOVER_POLL).await;
        }
    }

    /// Undo a hand-over that did not commit: a new generation, with no request
    /// pending, so the flows this process takes back (and every flow starting
    /// from now on) answer the next request. Call before taking them back.
    pub fn reopen(&self) {
        {
            let mut reg = self.lock();
            reg.generation += 1;
            reg.live = 0;
            reg.requested = false;
            reg.closed = false;
            reg.items.clear();
        }
        // The members of the generation asked can no longer match.
        self.asked.store(0, Ordering::Release);
    }

    /// Kernel flows registered for a hand-over (diagnostics and tests).
    pub fn live(&self) -> usize {
        self.lock().live
    }
}

/// A kernel flow's membership in the hand-over: registered flows answer a
/// request; a flow that started after the request is not registered and
/// finishes in this process.
#[derive(Debug)]
pub(crate) struct Member<'k> {
    registry: &'k Registry,
    registered: bool,
    generation: u64,
}

impl Member<'_> {
    /// Resolves once a hand-over is requested (never for an unregistered flow).
    ///
    /// Registers no waker: a request fires every slot of every thread's watch
    /// ([`super::watch::wake_all`]), where each kernel flow's directions wait,
    /// and the flow polls this after them (`handoff::run_kernel`), so it reads
    /// the request on that wake; one whose directions were elsewhere (a short
    /// pause) reads it at its next wake, its tick at the latest. What it saves:
    /// a `Notify` wait in every kernel flow's future (112 B against 8).
    pub(crate) fn requested(&self) -> impl Future<Output = ()> + use<'_> {
        std::future::poll_fn(move |_| {
            let asked = self.registry.asked.load(Ordering::Acquire);
            if self.registered && asked == self.generation + 1 {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }

    /// Give the flow to the collection. Refused (false: `handed` is dropped,
    /// closing only its dups, and the flow goes on here) when the collection
    /// was already taken; either way this flow is no longer registered.
    pub(crate) fn offer(&mut self, handed: Handed) -> bool {
        let mut reg = self.registry.lock();
        if !std::mem::replace(&mut self.registered, false) || reg.generation != self.generation {
            return false;
        }
        reg.live = reg.live.saturating_sub(1);
        if reg.closed {
            return false;
        }
        reg.items.push(handed);
        true
    }

    /// Stop answering requests (the flow keeps running here).
    pub(crate) fn leave(&mut self) {
        if std::mem::replace(&mut self.registered, false) {
            let mut reg = self.registry.lock();
            if reg.generation == self.generation {
                reg.live = reg.live.saturating_sub(1);
            }
        }
    }
}

impl Drop for Member<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::Registry;
    use std::time::Duration;

    #[tokio::test(flavor = "current_thread")]
    async fn a_request_counts_only_the_members_of_its_generation() {
        let reg = Registry::default();
        let mut a = reg.join();
        let b = reg.join();
        assert_eq!(reg.live(), 2);
        drop(b);
        assert_eq!(reg.live(), 1);
        // Nobody answers: the collection is taken at the limit, empty.
        assert!(reg.collect(Duration::from_millis(5)).await.is_empty());
        // Joined after the request: not registered.
        let late = reg.join();
        assert_eq!(reg.live(), 1);
        drop(late);
        // Undone: a new generation, where the old member no longer counts.
        reg.reopen();
        assert_eq!(reg.live(), 0);
        a.leave();
        assert_eq!(reg.live(), 0);
        let _c = reg.join();
        assert_eq!(reg.live(), 1);
    }

    /// A kernel flow waits on its sockets' watch slots and polls the request
    /// after them: a request wakes it through the watch. The flow is a task of
    /// its own, so nothing but a wake polls it again.
    #[tokio::test(flavor = "current_thread")]
    async fn a_request_wakes_the_members_through_their_watch() {
        use std::os::fd::AsFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (_b, _) = l.accept().expect("accept");
        let reg: &'static Registry = Box::leak(Box::default());
        let polls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = polls.clone();
        let flow = tokio::spawn(async move {
            let w = super::super::watch::Watched::new(a.as_fd()).expect("watch");
            let mut m = reg.join();
            // A direction: waits again after every wake, spurious or not.
            let direction = async {
                loop {
                    w.readable().await;
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            };
            tokio::select! {
                biased;
                () = direction => {}
                () = m.requested() => {}
            }
            m.leave();
        });
        // Until the flow waits: its first wait returns at once (a new slot
        // starts fired), the second one waits.
        while polls.load(std::sync::atomic::Ordering::Relaxed) == 0 || reg.live() == 0 {
            tokio::task::yield_now().await;
        }
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!flow.is_finished(), "the flow answered before any request");
        // Asked: it wakes and leaves without answering, so the collection
        // is taken empty.
        assert!(reg.collect(Duration::from_secs(5)).await.is_empty());
        tokio::time::timeout(Duration::from_secs(5), flow)
            .await
            .expect("a requested member was not woken")
            .expect("flow task");
        assert_eq!(reg.live(), 0);
    }

    /// An unregistered member (started after a request) never answers one.
    #[tokio::test(flavor = "current_thread")]
    async fn a_member_joined_after_the_request_is_never_asked() {
        let reg = Registry::default();
        let _first = reg.join();
        assert!(reg.collect(Duration::from_millis(5)).await.is_empty());
        let late = reg.join();
        let mut asked = std::pin::pin!(late.requested());
        assert!(futures_poll_once(asked.as_mut()).await.is_none());
    }

    /// Poll `f` once: its output if it was ready.
    async fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
        let mut f = f;
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }
}
