//! A worker's watch over the sockets of its kernel flows: an epoll instance of
//! its own, nested in the runtime's, where each socket is registered for
//! hang-up, errors and (only when asked) readability.
//!
//! Why: the psock signals "readable" on every segment its verdict takes,
//! redirected or not (`sk_psock_verdict_data_ready` calls the socket's saved
//! `sk_data_ready` after `read_skb`). Left in the runtime's epoll with
//! `EPOLLIN`, every request of a kernel flow woke the worker, which found
//! nothing to read: 9 µs of proxy CPU per redis request at `-c 1` (perf:
//! `finish_task_switch` under `epoll_wait`, `tcp_poll`, `sk_msg_is_readable`),
//! and an IPI on the CPU that forwards. epoll filters a wake-up by its event
//! mask (`ep_poll_callback`), so a socket registered without `EPOLLIN` costs
//! its waker nothing on those; a FIN (`sk_state_change`, unmasked), an error
//! or a reset still gets through.
//!
//! Owns: the per-thread epoll fd, a slot per registered socket (a reader and a
//! writer waiter), and the task that turns its events into wake-ups. Must not:
//! lose an event (registration and every mask change re-poll the socket:
//! `EPOLL_CTL_ADD`/`MOD` queue an edge when it is ready already, and a waiter
//! starts out fired), or keep a socket registered past its [`Watched`] (a
//! hand-over keeps a dup of the fd open, so the drop deletes explicitly).

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};

use slab::Slab;
use tokio::io::unix::AsyncFd;

/// Events taken from the watch's epoll per `epoll_wait`.
const EVENTS_PER_WAIT: usize = 64;
/// What every socket is registered for: edge-triggered, peer FIN. (`EPOLLERR`
/// and `EPOLLHUP` are always reported.)
const BASE: u32 = (libc::EPOLLET | libc::EPOLLRDHUP) as u32;
const IN: u32 = libc::EPOLLIN as u32;
const OUT: u32 = libc::EPOLLOUT as u32;
const FAIL: u32 = (libc::EPOLLERR | libc::EPOLLHUP) as u32;

thread_local! {
    static CURRENT: RefCell<Option<Arc<Watch>>> = const { RefCell::new(None) };
}

/// Every thread's watch, for [`wake_all`] (a watch whose thread is gone is
/// pruned when the next one is made).
static WATCHES: Mutex<Vec<Weak<Watch>>> = Mutex::new(Vec::new());

/// One thread's epoll and its registrations.
struct Watch {
    ep: AsyncFd<OwnedFd>,
    slots: Mutex<Slab<Slot>>,
    /// Cleared when the task that dispatches events is gone (its runtime
    /// ended: a test's), so the next registration builds a new watch.
    alive: AtomicBool,
    next_gen: AtomicU32,
}

/// A registered socket.
struct Slot {
    /// Tells a reused slab key from the registration an event was for.
    gen: u32,
    /// The mask registered now.
    events: u32,
    reader: Waiter,
    writer: Waiter,
}

#[derive(Default)]
struct Waiter {
    fired: bool,
    waker: Option<Waker>,
}

impl Waiter {
    fn fire(&mut self, wake: &mut Vec<Waker>) {
        self.fired = true;
        if let Some(w) = self.waker.take() {
            wake.push(w);
        }
    }
}

impl Watch {
    /// This thread's watch, made (with its dispatching task) on first use.
    fn current() -> io::Result<Arc<Watch>> {
        CURRENT.with(|c| {
            let mut c = c.borrow_mut();
            if let Some(w) = c.as_ref().filter(|w| w.alive.load(Ordering::Relaxed)) {
                return Ok(w.clone());
            }
            // SAFETY: epoll_create1 takes no pointers; a non-negative result
            // is a new fd that nothing else owns.
            let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `fd` was just created and is owned here only.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: the AsyncFd owns `fd`, an OwnedFd whose descriptor
            // stays open and the same until the AsyncFd drops it.
            let ep = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                .map_err(io::Error::other)?;
            let w = Arc::new(Watch {
                ep,
                slots: Mutex::new(Slab::new()),
                alive: AtomicBool::new(true),
                next_gen: AtomicU32::new(0),
            });
            spawn_dispatch(w.clone());
            {
                let mut all = WATCHES.lock().unwrap_or_else(|e| e.into_inner());
                all.retain(|w| w.strong_count() > 0);
                all.push(Arc::downgrade(&w));
            }
            *c = Some(w.clone());
            Ok(w)
        })
    }

    fn slots(&self) -> MutexGuard<'_, Slab<Slot>> {
        // A panic while the lock was held leaves only wakers and flags behind.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a valid epoll_event for the call's duration; both
        // fds are open (the caller holds the socket, `self` the epoll fd).
        if unsafe { libc::epoll_ctl(self.ep.get_ref().as_raw_fd(), op, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Take the events queued now and wake their waiters; true when there may
    /// be more (the buffer filled).
    fn dispatch(&self, wake: &mut Vec<Waker>) -> io::Result<bool> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_WAIT];
        // SAFETY: `evs` has room for EVENTS_PER_WAIT events; timeout 0.
        let n = unsafe {
            libc::epoll_wait(
                self.ep.get_ref().as_raw_fd(),
                evs.as_mut_ptr(),
                EVENTS_PER_WAIT as libc::c_int,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(true)
            } else {
                Err(e)
            };
        }
        let n = n as usize;
        {
            let mut slots = self.slots();
            for ev in &evs[..n] {
                let (key, gen) = untoken(ev.u64);
                let Some(slot) = slots.get_mut(key).filter(|s| s.gen == gen) else {
                    continue;
                };
                let got = ev.events;
                if got & (IN | libc::EPOLLRDHUP as u32 | FAIL) != 0 {
                    slot.reader.fire(wake);
                }
                if got & (OUT | FAIL) != 0 {
                    slot.writer.fire(wake);
                }
            }
        }
        Ok(n == EVENTS_PER_WAIT)
    }
}

/// Fire the reader and the writer of every socket in every thread's watch:
/// each kernel flow's task is polled again soon after (a spurious wake to its
/// directions, which read, meet `WouldBlock` and wait again). How a kernel
/// flow learns of a hand-over request without a wait of its own in its
/// future (`handover::Member::requested`): every kernel flow waits on its
/// sockets' slots here, or on its tick.
pub(crate) fn wake_all() {
    let watches: Vec<Arc<Watch>> = WATCHES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    let mut wake = Vec::new();
    for w in &watches {
        for (_, slot) in w.slots().iter_mut() {
            slot.reader.fire(&mut wake);
            slot.writer.fire(&mut wake);
        }
    }
    for waker in wake {
        waker.wake();
    }
}

fn token(key: usize, gen: u32) -> u64 {
    (u64::from(gen) << 32) | key as u64
}

fn untoken(t: u64) -> (usize, u32) {
    ((t & u64::from(u32::MAX)) as usize, (t >> 32) as u32)
}

/// Clears `alive` when the dispatching task is dropped.
struct AliveGuard(Arc<Watch>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::Relaxed);
    }
}

/// The task that turns the watch's events into wake-ups: a worker task of
/// class Urgent ("I/O callbacks") on a worker, a tokio task elsewhere (tests).
fn spawn_dispatch(w: Arc<Watch>) {
    let task = async move {
        let guard = AliveGuard(w);
        let w = &guard.0;
        let mut wake = Vec::new();
        loop {
            let mut ready = match w.ep.readable().await {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "sockmap watch: epoll readiness failed");
                    return;
                }
            };
            match w.dispatch(&mut wake) {
                Ok(more) => {
                    if !more {
                        ready.clear_ready();
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "sockmap watch: epoll_wait failed");
                    return;
                }
            }
            for waker in wake.drain(..) {
                waker.wake();
            }
        }
    };
    if crate::scheduler::try_thread_id().is_some() {
        crate::scheduler::spawn(crate::scheduler::Class::Urgent, "sockmap_watch", task);
    } else {
        tokio::spawn(task);
    }
}

/// A socket in this thread's watch; deregistered when dropped.
pub(crate) struct Watched {
    watch: Arc<Watch>,
    key: usize,
    gen: u32,
    fd: RawFd,
}

impl Watched {
    /// Register `fd` for hang-up and readability (see [`Self::want_data`]);
    /// both waiters start fired, so each side's first wait returns at once.
    pub(crate) fn new(fd: BorrowedFd<'_>) -> io::Result<Self> {
        let watch = Watch::current()?;
        let gen = watch.next_gen.fetch_add(1, Ordering::Relaxed);
        let fired = || Waiter {
            fired: true,
            waker: None,
        };
        let key = watch.slots().insert(Slot {
            gen,
            events: BASE | IN,
            reader: fired(),
            writer: fired(),
        });
        let raw = fd.as_raw_fd();
        if let Err(e) = watch.ctl(libc::EPOLL_CTL_ADD, raw, BASE | IN, token(key, gen)) {
            watch.slots().remove(key);
            return Err(e);
        }
        Ok(Self {
            watch,
            key,
            gen,
            fd: raw,
        })
    }

    /// Change the registered mask to `events` (one `EPOLL_CTL_MOD` when it
    /// differs; the kernel re-polls the socket, so a readiness already there
    /// is delivered).
    fn set_events(&self, events: u32) -> io::Result<()> {
        let mut slots = self.watch.slots();
        let slot = &mut slots[self.key];
        if slot.events == events {
            return Ok(());
        }
        self.watch.ctl(
            libc::EPOLL_CTL_MOD,
            self.fd,
            events,
            token(self.key, self.gen),
        )?;
        slot.events = events;
        Ok(())
    }

    /// Whether the reader is woken by bytes to read (`on`), or only by FIN,
    /// errors and hang-up.
    pub(crate) fn want_data(&self, on: bool) -> io::Result<()> {
        let now = self.watch.slots()[self.key].events;
        self.set_events(if on { now | IN } else { now & !IN })
    }

    /// Whether the reader is woken by bytes to read now.
    pub(crate) fn wants_data(&self) -> bool {
        self.watch.slots()[self.key].events & IN != 0
    }

    /// Until the reader's next event (consumed; spurious ones happen: retry
    /// the read, and wait again on `WouldBlock`).
    pub(crate) fn readable(&self) -> Wait<'_> {
        Wait {
            w: self,
            writer: false,
        }
    }

    /// Until the writer's next event; `EPOLLOUT` is in the mask only while a
    /// writer waits (a kworker's sends fill the buffer too, and each time it
    /// drains would be an event for nobody).
    pub(crate) async fn writable(&self) -> io::Result<()> {
        let now = self.watch.slots()[self.key].events;
        self.set_events(now | OUT)?;
        Wait {
            w: self,
            writer: true,
        }
        .await;
        let now = self.watch.slots()[self.key].events;
        self.set_events(now & !OUT)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        // Explicitly: a dup of the fd handed to a successor keeps the file
        // (and with it the registration) alive past this process's close.
        if let Err(e) = self
            .watch
            .ctl(libc::EPOLL_CTL_DEL, self.fd, 0, token(self.key, self.gen))
        {
            tracing::debug!(error = %e, "sockmap watch: EPOLL_CTL_DEL failed");
        }
        self.watch.slots().remove(self.key);
    }
}

/// The future of [`Watched::readable`] and [`Watched::writable`]: a borrow.
pub(crate) struct Wait<'a> {
    w: &'a Watched,
    writer: bool,
}

impl Future for Wait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut slots = self.w.watch.slots();
        let slot = &mut slots[self.w.key];
        let waiter = if self.writer {
            &mut slot.writer
        } else {
            &mut slot.reader
        };
        if waiter.fired {
            waiter.fired = false;
            return Poll::Ready(());
        }
        match &waiter.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => waiter.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// A kernel flow's socket: out of the runtime's epoll (its wake-ups on every
/// redirected segment are what this avoids), in the thread's watch instead.
/// Field order: the registration goes before the socket closes.
pub(crate) struct KSock {
    w: Watched,
    sock: std::net::TcpStream,
}

impl KSock {
    /// Take `s` out of the runtime's epoll and into the watch. On an error
    /// the socket is gone (tokio closes it when deregistering fails).
    pub(crate) fn new(s: tokio::net::TcpStream) -> io::Result<Self> {
        let sock = s.into_std()?;
        let w = Watched::new(sock.as_fd())?;
        Ok(Self { w, sock })
    }

    pub(crate) fn watch(&self) -> &Watched {
        &self.w
    }

    /// A non-blocking write (the socket stays in non-blocking mode).
    pub(crate) fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        io::Write::write(&mut &self.sock, data)
    }
}

impl AsFd for KSock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}
