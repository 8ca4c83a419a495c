//! Kernel forwarding: both sockets of an established flow go into the BPF
//! SOCKHASH and the `sk_skb` stream verdict moves the bytes; userspace only
//! watches (activity, half-close, backpressure) and forwards the few bytes the
//! verdict passes to it.
//!
//! Owns: the per-flow protocol around the loaded [`Kernel`]:
//! insertion, the pass/acknowledge gate, the drain check before FIN, pause and
//! resume, and teardown. Must not: splice or copy a socket while it is in the
//! SOCKHASH except through the gate below, or leave a map entry behind.
//!
//! # Race window
//! Reordering is impossible by construction, not unlikely:
//!
//! * **Before insertion** userspace writes every byte it already holds
//!   (`pending`) to the server and waits until the write completed, so those
//!   bytes are in the server socket's send queue ahead of anything the kernel
//!   can redirect later. Bytes that arrived after userspace's last read are
//!   still in the receive queue; nobody reads them here.
//! * **Insertion** ([`crate::bpf::Bpf::insert_pair`]) creates the flow entries with
//!   `ready = 0`, inserts both sockets crosswise, then we set `ready = 1`
//!   with `passed_ack = 0` and kick each socket with `SO_RCVLOWAT`, which runs
//!   the verdict over the queued bytes, in order, under the socket lock. A
//!   segment that reached the verdict between insertion and `ready` was
//!   passed and counted; the gate below then keeps the direction in pass mode
//!   until userspace has forwarded it.
//! * **The gate.** The verdict redirects a segment only when `ready`, not
//!   `paused`, within the redirect limit, and its own count of passed bytes
//!   equals `passed_ack`, which userspace writes only after it has *written*
//!   the passed bytes to the peer. The verdicts of one socket run one at a
//!   time, and the run that decides "pass" is the run that bumps the count,
//!   so a redirect can only follow passed bytes that are already in the
//!   peer's send queue. Userspace reads only what the verdict passed (see
//!   `read_passed`).
//! * **Every byte once.** A retransmission that overlaps bytes TCP already
//!   received is queued whole and handed to the verdict whole; the verdict
//!   trims the head it already saw (proxy-ebpf `trim_overlap`), so neither
//!   path forwards a byte twice. `check_totals` verifies it at EOF.
//! * **Passed bytes never overtake redirected ones.** Before writing passed
//!   bytes, userspace waits until the peer's send queue has absorbed every
//!   byte the kernel redirected to it (`acked + SIOCOUTQ` of the peer, from a
//!   baseline taken before insertion, has reached `redirected + written`).
//!   While passed bytes are unacknowledged nothing is redirected, so the
//!   redirected count is final during that wait.
//! * **Half-close.** The kernel does not propagate FIN. When the source reads
//!   EOF, userspace first waits until the verdict has seen every byte TCP
//!   received since insertion (the FIN can be readable before the verdict ran
//!   over the data ahead of it: `verdict_behind`), then runs the same drain
//!   check, and only then shuts the peer's write side, because shutting it
//!   earlier drops the psock backlog.
//! * **Teardown.** Both SOCKHASH keys and both flow entries are deleted when
//!   the flow ends, on every path (a guard's `Drop`), before the sockets
//!   close. A clean end has drained both directions first.
//! * **Reload.** A flow may instead be handed to a successor process with its
//!   entries kept (the guard disarmed) and its directions' state moved in a
//!   [`Snapshot`]; the argument that this loses, repeats and reorders nothing
//!   is "Hand-over" in `crate::reload`.
//!
//! * **Wake-ups.** The pair's sockets wait in the worker's own epoll
//!   (`watch`), not the runtime's; a direction's reader listens for readable
//!   bytes only while the verdict may pass it some (`quiet_if_steady`, and the
//!   tick's check in [`Ticker::tick`]). FIN, errors and resets always wake it.
//!
//! # Backpressure
//! A redirect consumes the source's receive queue, so TCP flow control stops
//! working. Userspace measures the bytes the flow holds in the kernel per
//! direction (redirected + written by us − acknowledged by the peer) and sets
//! `paused` above the bound: the verdict passes again, userspace forwards
//! through its own bounded buffer, and the source's receive window closes as
//! with any proxy. Below half the bound it clears `paused`; the gate resumes
//! redirection once userspace has caught up. The passed bytes userspace
//! writes count against the same bound (`forward_unsent`): without that, a
//! destination that does not read let them fill its send queue on top of the
//! redirected bytes (6.7 MB held against a 4 MiB bound in one test run under
//! load).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use proxy_common::{FlowCtl, SockKey};
use tokio::net::TcpStream;

use super::copy;
use super::flow::{Dir, DirError, Flow, Side};
use crate::sys::sock::{self, SendState};

mod handover;
mod kernel;
mod watch;

pub(crate) use handover::Member;
pub use handover::Registry;
pub use kernel::{Kernel, KernelInfo, DEFAULT_MAX_INFLIGHT, MIN_MAX_INFLIGHT};
pub(crate) use watch::KSock;

/// Most passed bytes one read takes into a direction's `unsent` (bounded: the
/// rest waits in the kernel, where it closes the source's receive window).
/// `unsent` grows only when the verdict passes bytes, so an idle flow holds
/// none.
const PASS_BUF: usize = 256 * 1024;
/// Poll period while bytes are moving (counters, backpressure), in ms.
const TICK_ACTIVE_MS: u16 = 2;
/// Poll period while a direction moves a quarter of its bound or more per
/// tick (see [`FAST_SHARE`]), in ms.
const TICK_FAST_MS: u16 = 1;
/// A direction that moved `max_inflight() / FAST_SHARE` bytes since the last
/// tick ticks at [`TICK_FAST_MS`]: the bound is raised only at ticks, so a
/// flow that moves the whole bound between two of them is passed to
/// userspace though its destination keeps up. The 64 KiB echo at 2.8 GB/s
/// each way did so every 8 MiB (tokio's timer fires 2-3 ms apart at a 2 ms
/// period), each pass one 250 µs round trip in 128.
const FAST_SHARE: usize = 4;
/// Active ticks without progress before the period starts to grow.
const IDLE_TICKS_BEFORE_BACKOFF: u32 = 100;
/// Poll period once a direction has been idle for a while, in ms.
const TICK_IDLE_MS: u16 = 200;
/// The bound is raised in steps of `max_inflight() / LIMIT_STEPS` bytes (a
/// map update per step; the lag is what a tick may not move, see
/// [`FAST_SHARE`]).
const LIMIT_STEPS: usize = 32;
/// Poll period of the drain check.
const DRAIN_POLL: Duration = Duration::from_millis(1);
/// Polls (of [`DRAIN_POLL`]) at EOF waiting for the verdict to catch up with
/// the bytes received before the FIN, before going on regardless.
const EOF_CATCHUP_POLLS: u32 = 1000;

/// Why a flow could not be handed to the kernel.
#[derive(Debug)]
pub enum NotEligible {
    /// Nothing was changed: forward the flow another way.
    Fallback(String),
    /// The flow's state is unknown (a rollback may have dropped bytes): close it.
    Abort(io::Error),
}

/// A flow inserted in the maps; deletes its entries when dropped.
pub struct Inserted {
    kernel: Arc<Kernel>,
    pub cookie_client: SockKey,
    pub cookie_server: SockKey,
    base_client: SendState,
    base_server: SendState,
    /// Redirected bytes already accounted, per source (client, server).
    seen: [Cell<u64>; 2],
    /// Cleared when the flow was handed to another process: the entries stay.
    armed: Cell<bool>,
    /// Bytes each socket (client, server) had received and userspace had
    /// read before insertion (they never meet the verdict), or `None` for a
    /// flow adopted from another process, whose counts stayed there.
    pre_read: Option<[u64; 2]>,
    /// Bytes userspace read from each socket (client, server) and forwarded
    /// before insertion, exactly: none for a flow forwarded in the kernel from
    /// its start, what `auto` forwarded before promoting it otherwise.
    read_before: [u64; 2],
}

impl Drop for Inserted {
    fn drop(&mut self) {
        if self.armed.get() {
            self.kernel
                .bpf()
                .remove_pair(self.cookie_client, self.cookie_server);
        }
    }
}

fn is_established(s: &TcpStream) -> bool {
    // A peer that already sent FIN makes insertion fail (EOPNOTSUPP); check
    // first so the common case never reaches the rollback path.
    let mut probe = [0u8; 1];
    !matches!(
        nix::sys::socket::recv(
            std::os::fd::AsRawFd::as_raw_fd(s),
            &mut probe,
            nix::sys::socket::MsgFlags::MSG_PEEK | nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        ),
        Ok(0)
    )
}

/// Insert the pair and switch it on (see "Race window"). `pending` must have
/// been written to the server already; `read_before` is what userspace read
/// from the client and the server and forwarded before (promotion).
pub fn insert(
    kernel: &Arc<Kernel>,
    client: &TcpStream,
    server: &TcpStream,
    read_before: [u64; 2],
) -> Result<Inserted, NotEligible> {
    let bpf = kernel.bpf();
    if !is_established(client) || !is_established(server) {
        kernel.note_fallback();
        return Err(NotEligible::Fallback("peer already half-closed".into()));
    }
    // Unread bytes first, totals second: a byte arriving in between counts
    // as read before insertion, which only weakens `verdict_behind`'s bound.
    let unread = |s: &TcpStream| sock::inq(s.as_fd()).map(|n| n as u64).unwrap_or(0);
    let (unread_client, unread_server) = (unread(client), unread(server));
    let base_client =
        sock::send_state(client.as_fd()).map_err(|e| NotEligible::Fallback(e.to_string()))?;
    let base_server =
        sock::send_state(server.as_fd()).map_err(|e| NotEligible::Fallback(e.to_string()))?;
    let pre_read = [
        base_client.received.saturating_sub(unread_client),
        base_server.received.saturating_sub(unread_server),
    ];
    let (cookie_client, cookie_server) = match bpf.insert_pair(client, server) {
        Ok(c) => c,
        Err(e) if e.rolled_back_client() => {
            return Err(NotEligible::Abort(io::Error::other(e.to_string())))
        }
        // EOPNOTSUPP (CLOSE_WAIT), EBUSY, map full, ...: nothing was kept.
        Err(e) => {
            kernel.note_fallback();
            return Err(NotEligible::Fallback(e.to_string()));
        }
    };
    let ins = Inserted {
        kernel: kernel.clone(),
        cookie_client,
        cookie_server,
        base_client,
        base_server,
        seen: [Cell::new(0), Cell::new(0)],
        armed: Cell::new(true),
        pre_read: Some(pre_read),
        read_before,
    };
    // Switch each direction on: ready, nothing passed yet, and the
    // kernel-kept bound. Then kick the socket so queued bytes meet the verdict.
    for (cookie, s, base_to) in [
        (cookie_client, client, base_server),
        (cookie_server, server, base_client),
    ] {
        let on = bpf
            .set_ctl(cookie, initial_ctl(kernel.max_inflight(), base_to))
            .map_err(|e| io::Error::other(e.to_string()))
            .and_then(|()| sock::set_rcvlowat(s.as_fd(), 1));
        if let Err(e) = on {
            // Bytes may already have been passed to a psock that the drop
            // below frees: the flow cannot continue safely.
            return Err(NotEligible::Abort(e));
        }
    }
    Ok(ins)
}

/// The control a direction starts with once inserted.
fn initial_ctl(max_inflight: usize, base_to: SendState) -> FlowCtl {
    FlowCtl {
        passed_ack: 0,
        redirect_limit: redirect_limit(max_inflight, base_to, 0, 0),
        ready: 1,
        paused: 0,
    }
}

/// The kernel's redirect bound for a direction: the kernel may hold at most
/// `max_inflight` bytes for the destination (redirected or written by us
/// and not yet acknowledged by the destination's peer), counted from the
/// baseline. Never 0 (0 means "no limit" to the verdict).
fn redirect_limit(max_inflight: usize, base_to: SendState, acked_since: u64, written: u64) -> u64 {
    (max_inflight as u64 + acked_since)
        .saturating_sub(written + base_to.queued)
        .max(1)
}

impl Inserted {
    /// The kernel the pair is in.
    pub fn kernel(&self) -> &Arc<Kernel> {
        &self.kernel
    }

    fn cookie(&self, side: Side) -> SockKey {
        match side {
            Side::Client => self.cookie_client,
            Side::Server => self.cookie_server,
        }
    }

    fn base(&self, side: Side) -> SendState {
        match side {
            Side::Client => self.base_client,
            Side::Server => self.base_server,
        }
    }

    fn seen(&self, from: Side) -> &Cell<u64> {
        match from {
            Side::Client => &self.seen[0],
            Side::Server => &self.seen[1],
        }
    }

    /// Bytes `side` had received and userspace had read before insertion
    /// (`None` for an adopted flow).
    fn pre_read(&self, side: Side) -> Option<u64> {
        self.pre_read.map(|[client, server]| match side {
            Side::Client => client,
            Side::Server => server,
        })
    }

    /// Bytes the kernel redirected from `from` so far.
    fn redirected(&self, from: Side) -> Result<u64, io::Error> {
        self.kernel
            .bpf()
            .stats(self.cookie(from))
            .map(|s| s.redirected_bytes)
            .map_err(|e| io::Error::other(e.to_string()))
    }

    /// Account kernel-forwarded bytes of direction `dir` into the flow's
    /// counters (live stats and activity). Returns the redirected total.
    fn account(&self, flow: &Flow<'_>, dir: Dir) -> Result<u64, io::Error> {
        let total = self.redirected(dir.from)?;
        let seen = self.seen(dir.from);
        if total > seen.get() {
            let delta = total - seen.get();
            seen.set(total);
            flow.touch(dir.from);
            flow.wrote(dir.to, delta as usize);
        }
        Ok(total)
    }

    /// Log both directions' kernel and socket state (abnormal ends only).
    pub(crate) fn debug_state(&self, client: &KSock, server: &KSock) {
        for (side, s) in [(Side::Client, client), (Side::Server, server)] {
            let mut inq: libc::c_int = 0;
            // SAFETY: FIONREAD writes one c_int into `inq`; the fd is open.
            unsafe {
                libc::ioctl(
                    std::os::fd::AsRawFd::as_raw_fd(&s.as_fd()),
                    libc::FIONREAD,
                    &mut inq,
                )
            };
            tracing::debug!(
                ?side,
                stats = ?self.kernel.bpf().stats(self.cookie(side)).ok(),
                ctl = ?self.kernel.bpf().ctl(self.cookie(side)).ok(),
                send = ?sock::send_state(s.as_fd()).ok(),
                base = ?self.base(side),
                inq,
                "sockmap flow state at abnormal end"
            );
        }
    }

    /// Account both directions (before a timeout is judged, and once more
    /// before the maps go).
    pub fn account_all(&self, flow: &Flow<'_>) {
        for dir in [super::flow::CLIENT_TO_SERVER, super::flow::SERVER_TO_CLIENT] {
            let _ = self.account(flow, dir);
        }
    }
}

/// Bytes the kernel passed to userspace from `dir.from` so far.
fn passed(ins: &Inserted, dir: Dir) -> Result<u64, DirError> {
    ins.kernel
        .bpf()
        .stats(ins.cookie(dir.from))
        .map(|s| s.passed_bytes)
        .map_err(|e| DirError::new(dir.from, io::Error::other(e.to_string())))
}

/// Per-direction userspace state. Every field lives outside the direction's
/// future (cells), so dropping that future at any await point leaves a state
/// another task (or process) can continue from: see "Hand-over".
pub(crate) struct DirState {
    /// Bytes userspace wrote to `to` since the baseline (passed bytes only).
    written: Cell<u64>,
    /// Bytes userspace read from `from` (passed by the verdict); it becomes
    /// the acknowledgement (`passed_ack`) once `unsent` is empty.
    read: Cell<u64>,
    /// This direction's control as last written (this task is its only writer).
    ctl: Cell<FlowCtl>,
    /// Times unprocessed bytes were found in the TCP receive queue (diagnostics).
    kicks: Cell<u64>,
    /// Bytes read from `from` and not yet written to `to` (`read - written`),
    /// oldest first. Never borrowed across an await.
    unsent: RefCell<Vec<u8>>,
    /// EOF was propagated to `to`: the direction is finished.
    done: Cell<bool>,
    /// Passed bytes read and discarded because they repeated bytes already
    /// forwarded (an overlap the verdict could not trim: `FlowStats::skip_at`).
    /// Not carried over a hand-over: after one it only offsets `check_totals`.
    skipped: Cell<u64>,
    /// This direction's tick period in ms ([`TICK_ACTIVE`] while bytes move,
    /// growing to [`TICK_IDLE`]); the flow ticks at the shorter of its two.
    tick_ms: Cell<u16>,
    /// Ticks without progress since the last progress.
    idle_ticks: Cell<u32>,
}

impl DirState {
    /// A freshly inserted direction.
    pub(crate) fn new(ins: &Inserted, dir: Dir) -> Self {
        Self {
            written: Cell::new(0),
            read: Cell::new(0),
            ctl: Cell::new(initial_ctl(ins.kernel.max_inflight(), ins.base(dir.to))),
            kicks: Cell::new(0),
            unsent: RefCell::new(Vec::new()),
            done: Cell::new(false),
            skipped: Cell::new(0),
            tick_ms: Cell::new(TICK_ACTIVE_MS),
            idle_ticks: Cell::new(0),
        }
    }

    /// A direction continued from a snapshot taken by another process.
    pub(crate) fn from_snapshot(s: DirSnapshot) -> Self {
        Self {
            written: Cell::new(s.written),
            read: Cell::new(s.read),
            ctl: Cell::new(s.ctl),
            kicks: Cell::new(s.kicks),
            unsent: RefCell::new(s.unsent),
            done: Cell::new(s.done),
            skipped: Cell::new(0),
            tick_ms: Cell::new(TICK_ACTIVE_MS),
            idle_ticks: Cell::new(0),
        }
    }

    /// Bytes move: tick at [`TICK_ACTIVE`] again, waking the flow's driver
    /// when it was sleeping for a longer period.
    fn activate(&self, flow: &Flow<'_>) {
        self.idle_ticks.set(0);
        if self.tick_ms.get() > TICK_ACTIVE_MS {
            self.tick_ms.set(TICK_ACTIVE_MS);
            flow.changed.notify();
        }
    }

    /// The state to hand over (the direction's future must be gone).
    pub(crate) fn snapshot(&self) -> DirSnapshot {
        DirSnapshot {
            written: self.written.get(),
            read: self.read.get(),
            ctl: self.ctl.get(),
            kicks: self.kicks.get(),
            done: self.done.get(),
            unsent: self.unsent.borrow().clone(),
        }
    }

    /// Bytes of the source's stream the verdict has handled, given its
    /// redirected count: redirected, or passed and read, minus the repeated
    /// bytes userspace dropped.
    fn through_verdict(&self, redirected: u64) -> u64 {
        redirected + self.read.get() - self.skipped.get()
    }

    fn push(&self, ins: &Inserted, dir: Dir) -> Result<(), DirError> {
        ins.kernel
            .bpf()
            .set_ctl(ins.cookie(dir.from), self.ctl.get())
            .map_err(|e| DirError::new(dir.from, io::Error::other(e.to_string())))
    }
}

/// One direction's userspace state as handed from a process to its successor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirSnapshot {
    pub written: u64,
    pub read: u64,
    pub ctl: FlowCtl,
    pub kicks: u64,
    pub done: bool,
    /// Passed bytes read and not yet written to the destination.
    pub unsent: Vec<u8>,
}

/// Everything a successor needs to continue a kernel-forwarded flow, besides
/// its two sockets: the pair's keys and baselines and both directions' state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub cookie_client: SockKey,
    pub cookie_server: SockKey,
    pub base_client: SendState,
    pub base_server: SendState,
    /// Redirected bytes already accounted, per source (client, server).
    pub seen: [u64; 2],
    /// Client-to-server, then server-to-client.
    pub dirs: [DirSnapshot; 2],
    /// Bytes of each source's stream (client, server) that never met the
    /// verdict: read by userspace before the pair was inserted, forwarded or
    /// not (a PROXY header is read and never forwarded). What the count check
    /// at EOF takes off what TCP received (`check_totals`).
    pub read_before: [u64; 2],
}

impl Inserted {
    /// Continue a pair another process inserted (its entries are in the
    /// pinned maps): checks that the sockets are the ones the keys name and
    /// that the maps hold the pair.
    pub(crate) fn adopt(
        kernel: &Arc<Kernel>,
        client: &TcpStream,
        server: &TcpStream,
        snap: &Snapshot,
    ) -> Result<Inserted, io::Error> {
        let bpf = kernel.bpf();
        let cc = crate::bpf::socket_cookie(client.as_fd())?;
        let cs = crate::bpf::socket_cookie(server.as_fd())?;
        if (cc, cs) != (snap.cookie_client, snap.cookie_server) {
            return Err(io::Error::other(
                "socket cookies differ from the handed state",
            ));
        }
        for c in [cc, cs] {
            bpf.ctl(c).map_err(|e| io::Error::other(e.to_string()))?;
        }
        Ok(Inserted {
            kernel: kernel.clone(),
            cookie_client: cc,
            cookie_server: cs,
            base_client: snap.base_client,
            base_server: snap.base_server,
            seen: [Cell::new(snap.seen[0]), Cell::new(snap.seen[1])],
            armed: Cell::new(true),
            pre_read: None,
            // As the inserting process counted it (carried by every hand-over).
            read_before: snap.read_before,
        })
    }

    /// Keep the map entries when this guard drops: the flow now belongs to
    /// another process.
    pub(crate) fn disarm(&self) {
        self.armed.set(false);
    }

    /// The pair's part of a hand-over snapshot; the directions' futures must
    /// be gone.
    pub(crate) fn snapshot(&self, c2s: &DirState, s2c: &DirState) -> Snapshot {
        Snapshot {
            cookie_client: self.cookie_client,
            cookie_server: self.cookie_server,
            base_client: self.base_client,
            base_server: self.base_server,
            seen: [self.seen[0].get(), self.seen[1].get()],
            dirs: [c2s.snapshot(), s2c.snapshot()],
            read_before: self.read_before,
        }
    }
}

/// Sent-to-`to` progress since the baseline.
fn progress(ins: &Inserted, dir: Dir, to: &KSock) -> Result<SendState, DirError> {
    let now = sock::send_state(to.as_fd()).map_err(|e| DirError::new(dir.to, e))?;
    let base = ins.base(dir.to);
    Ok(SendState {
        acked: now.acked.saturating_sub(base.acked),
        queued: now.queued,
        received: now.received.saturating_sub(base.received),
    })
}

/// Wait until every byte destined to `to` (redirected by the kernel or
/// written by us) has entered `to`'s send queue.
async fn drain(
    flow: &Flow<'_>,
    ins: &Inserted,
    dir: Dir,
    to: &KSock,
    st: &DirState,
) -> Result<(), DirError> {
    loop {
        let redirected = ins
            .account(flow, dir)
            .map_err(|e| DirError::new(dir.from, e))?;
        let p = progress(ins, dir, to)?;
        // `progress` counts from the baseline: acked since then plus what is
        // queued now, and the queue at baseline time was already acked or is
        // still queued, so compare against what was queued at baseline too.
        let entered = p.acked + p.queued;
        let owed = redirected + st.written.get() + ins.base(dir.to).queued;
        if entered >= owed {
            return Ok(());
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

/// Raise the kernel's redirect bound as the destination drains, and record
/// the peak of bytes held in the kernel.
fn regulate(
    ins: &Inserted,
    dir: Dir,
    to: &KSock,
    st: &DirState,
    redirected: u64,
) -> Result<(), DirError> {
    let p = progress(ins, dir, to)?;
    let base = ins.base(dir.to);
    let sent = redirected + st.written.get() + base.queued;
    ins.kernel
        .note_inflight(sent.saturating_sub(p.acked) as usize);
    let limit = redirect_limit(ins.kernel.max_inflight(), base, p.acked, st.written.get());
    let mut ctl = st.ctl.get();
    // Only raise it, and in steps, so a busy flow costs few map updates.
    if limit >= ctl.redirect_limit + (ins.kernel.max_inflight() / LIMIT_STEPS) as u64 {
        ctl.redirect_limit = limit;
        st.ctl.set(ctl);
        st.push(ins, dir)?;
    }
    Ok(())
}

/// At EOF, compare what the verdict saw and what entered the peer's send
/// queue with what TCP received: any difference is a kernel-side duplicate
/// or loss, reported loudly (it never happened by design of this module).
fn check_totals(ins: &Inserted, dir: Dir, from: &KSock, to: &KSock, st: &DirState) {
    // Everything the source ever received goes through the verdict but what
    // userspace forwarded before insertion; minus one for the FIN.
    // (`pre_read` is an upper estimate, good for `verdict_behind`'s bound,
    // not for this check.)
    let before = match dir.from {
        Side::Client => ins.read_before[0],
        Side::Server => ins.read_before[1],
    };
    let received = sock::send_state(from.as_fd())
        .map(|s| s.received)
        .unwrap_or(0)
        .saturating_sub(1)
        .saturating_sub(before);
    let seen = st.through_verdict(ins.seen(dir.from).get());
    let entered = progress(ins, dir, to)
        .map(|p| p.acked + p.queued)
        .unwrap_or(0)
        .saturating_sub(ins.base(dir.to).queued);
    if seen != received || entered != seen {
        tracing::warn!(
            ?dir,
            received,
            verdict_and_passed = seen,
            entered_peer = entered,
            redirected = ins.seen(dir.from).get(),
            passed = st.read.get(),
            kernel = ?ins.kernel.bpf().stats(ins.cookie(dir.from)).ok(),
            kicks = st.kicks.get(),
            "sockmap byte counts disagree at EOF"
        );
    }
}

/// The part `[a, b)` of a read of `n` passed bytes starting at passed-stream
/// offset `at` that falls in the repeated range `[skip_at, skip_at + skip_len)`
/// (`a == b` when they do not meet).
fn skip_within(at: u64, n: usize, skip_at: u64, skip_len: u64) -> (usize, usize) {
    let end = at + n as u64;
    let lo = skip_at.max(at);
    let hi = (skip_at + skip_len).min(end);
    if skip_len == 0 || lo >= hi {
        return (n, n);
    }
    ((lo - at) as usize, (hi - at) as usize)
}

/// Whether the verdict has yet to see bytes TCP received on `dir.from` before
/// its FIN. Every byte the socket ever received goes through the verdict
/// (redirected, or passed and read) except what userspace read before
/// insertion; for an adopted flow, whose pre-insertion count stayed with the
/// first process, only the bytes received since insertion are known to.
fn verdict_behind(
    ins: &Inserted,
    flow: &Flow<'_>,
    dir: Dir,
    from: &KSock,
    st: &DirState,
) -> Result<bool, DirError> {
    let not_through_verdict = ins
        .pre_read(dir.from)
        .unwrap_or_else(|| ins.base(dir.from).received);
    let received = sock::send_state(from.as_fd())
        .map_err(|e| DirError::new(dir.from, e))?
        .received
        .saturating_sub(1)
        .saturating_sub(not_through_verdict);
    let redirected = ins
        .account(flow, dir)
        .map_err(|e| DirError::new(dir.from, e))?;
    Ok(st.through_verdict(redirected) < received)
}

/// What a socket in the SOCKHASH has for userspace.
enum Passed {
    /// Bytes the verdict passed, appended to the direction's `unsent`.
    Data(usize),
    /// The peer's FIN, with nothing passed left to read.
    Eof,
    /// Bytes in the TCP receive queue that the verdict has not seen yet.
    Unprocessed,
}

/// Read only what the verdict passed to userspace (the psock's queue, which
/// `FIONREAD` reports), never the TCP receive queue: the kernel's `recvmsg`
/// falls back to that queue when the psock's is empty, and a segment read
/// partly there would later meet the verdict whole and be sent twice. EOF
/// and unprocessed bytes are told apart with a peek, which consumes nothing.
/// `WouldBlock` when there is nothing at all (so readiness is cleared).
///
/// The bytes go straight to the end of `unsent` (at most [`PASS_BUF`] per
/// read): no buffer of the direction's own, which every kernel flow's future
/// would hold room for.
fn read_passed(from: &KSock, unsent: &RefCell<Vec<u8>>) -> io::Result<Passed> {
    let fd = from.as_fd();
    let queued = sock::inq(fd)?;
    if queued > 0 {
        let mut unsent = unsent.borrow_mut();
        let at = unsent.len();
        unsent.resize(at + queued.min(PASS_BUF), 0);
        let got = sock::recv_nowait(fd, &mut unsent[at..], false);
        unsent.truncate(at + *got.as_ref().unwrap_or(&0));
        let n = got?;
        return Ok(if n == 0 { Passed::Eof } else { Passed::Data(n) });
    }
    match sock::recv_nowait(fd, &mut [0u8; 1], true)? {
        0 => Ok(Passed::Eof),
        _ => Ok(Passed::Unprocessed),
    }
}

/// Write the passed bytes userspace holds, then acknowledge them: once the
/// verdict's passed count equals the acknowledgement, the next segment is
/// redirected again. Before the first write every byte the kernel redirected
/// to `to` must have entered `to`'s send queue (passed bytes never overtake).
/// Progress is recorded in `st` write by write, so the future may be dropped
/// at any await (a hand-over) without losing or repeating a byte.
async fn forward_unsent(
    flow: &Flow<'_>,
    ins: &Inserted,
    dir: Dir,
    to: &KSock,
    st: &DirState,
) -> Result<(), DirError> {
    drain(flow, ins, dir, to, st).await?;
    // Final while these bytes are unacknowledged: the gate redirects nothing.
    let redirected = ins.seen(dir.from).get();
    let mut backoff = DRAIN_POLL;
    loop {
        if st.unsent.borrow().is_empty() {
            break;
        }
        // The bound holds for what we write too: the bytes the kernel holds
        // for `to` (redirected or written, not acknowledged) stay within
        // `max_inflight`, so a destination that does not read closes the
        // source's window through our bounded buffer, not through `to`'s
        // send queue on top of the bound.
        let p = progress(ins, dir, to)?;
        let held =
            (redirected + st.written.get() + ins.base(dir.to).queued).saturating_sub(p.acked);
        let room = (ins.kernel.max_inflight() as u64).saturating_sub(held);
        if room == 0 {
            // Nothing wakes us for an acknowledgement: poll, less often the
            // longer the destination holds on, and notice a reset meanwhile.
            if let Some(e) = socket2::SockRef::from(&to.as_fd())
                .take_error()
                .map_err(|e| DirError::new(dir.to, e))?
            {
                return Err(DirError::new(dir.to, e));
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(TICK_IDLE_MS.into()));
            continue;
        }
        let wrote = {
            let unsent = st.unsent.borrow();
            let n = unsent
                .len()
                .min(usize::try_from(room).unwrap_or(usize::MAX));
            to.try_write(&unsent[..n])
        };
        match wrote {
            Ok(0) => return Err(DirError::new(dir.to, io::ErrorKind::WriteZero.into())),
            Ok(n) => {
                st.unsent.borrow_mut().drain(..n);
                st.written.set(st.written.get() + n as u64);
                flow.wrote(dir.to, n);
                backoff = DRAIN_POLL;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                to.watch()
                    .writable()
                    .await
                    .map_err(|e| DirError::new(dir.to, e))?;
            }
            Err(e) => return Err(DirError::new(dir.to, e)),
        }
    }
    // What we wrote left the kernel's hands with the drain above, so the
    // bound moves up with the destination's acks.
    let p = progress(ins, dir, to)?;
    let mut ctl = st.ctl.get();
    ctl.passed_ack = st.read.get();
    ctl.redirect_limit = ctl.redirect_limit.max(redirect_limit(
        ins.kernel.max_inflight(),
        ins.base(dir.to),
        p.acked,
        st.written.get(),
    ));
    st.ctl.set(ctl);
    st.push(ins, dir)
}

/// Watch one direction of an inserted flow until EOF was propagated. Its
/// state lives in `st` (see [`DirState`]); a direction already finished
/// returns at once.
///
/// Not an `async fn`: it would store its arguments twice in every kernel
/// flow's future, once per direction (see "Memory of an idle flow" in
/// docs/architecture.md).
#[allow(clippy::manual_async_fn)]
pub(crate) fn run<'a, 'm>(
    flow: &'a Flow<'m>,
    ins: &'a Inserted,
    dir: Dir,
    from: &'a KSock,
    to: &'a KSock,
    st: &'a DirState,
) -> impl Future<Output = Result<(), DirError>> + use<'a, 'm> {
    async move {
        if st.done.get() {
            return Ok(());
        }
        let mut eof_waits = 0u32;
        loop {
            if !st.unsent.borrow().is_empty() {
                // Passed bytes: never ahead of redirected ones.
                // Boxed, as the drain below: rare, and not every idle flow's room.
                Box::pin(forward_unsent(flow, ins, dir, to, st)).await?;
                st.activate(flow);
                continue;
            }
            // The counters and the bound are the flow's tick's ([`Ticker`]).
            // Read first, wait only on `WouldBlock`: the watch is edge-triggered.
            // `unsent` is empty here: the bytes read are at its start.
            match read_passed(from, &st.unsent) {
                Ok(Passed::Eof) => {
                    // EOF can be visible before the last passed bytes: a
                    // passed segment queues behind the psock's backlog and
                    // a kworker moves it to the socket later. No verdict
                    // runs after FIN, so the kernel's passed count is final.
                    if passed(ins, dir)? > st.read.get() {
                        pause().await;
                        continue;
                    }
                    // The FIN can also be visible before the verdict has
                    // run over the data TCP received ahead of it (seen in
                    // tests: half a flow's bytes redirected only after
                    // EOF was read). Draining then would compare against
                    // a redirected count that is not final yet, and the
                    // FIN would overtake redirected bytes.
                    if verdict_behind(ins, flow, dir, from, st)? {
                        if eof_waits == 0 {
                            ins.kernel.note_eof_catchup();
                        }
                        eof_waits += 1;
                        if eof_waits <= EOF_CATCHUP_POLLS {
                            pause().await;
                            continue;
                        }
                        tracing::warn!(
                        ?dir,
                        "sockmap: the verdict did not catch up with the bytes received before EOF"
                    );
                    }
                    flow.shut(dir.from);
                    Box::pin(drain(flow, ins, dir, to, st)).await?;
                    tracing::debug!(
                        ?dir,
                        redirected = ins.seen(dir.from).get(),
                        passed = st.read.get(),
                        written = st.written.get(),
                        kicks = st.kicks.get(),
                        "sockmap direction drained at EOF"
                    );
                    check_totals(ins, dir, from, to, st);
                    copy::propagate_eof(flow, dir, to)?;
                    st.done.set(true);
                    return Ok(());
                }
                Ok(Passed::Unprocessed) => {
                    // Bytes in the TCP receive queue that no verdict has
                    // seen yet: never read them (the verdict would later
                    // take the same segment whole); make it run instead.
                    st.kicks.set(st.kicks.get() + 1);
                    sock::set_rcvlowat(from.as_fd(), 1).map_err(|e| DirError::new(dir.from, e))?;
                    pause().await;
                }
                Ok(Passed::Data(n)) => {
                    // Held in `st` until written: a hand-over between the
                    // read and the write carries them along. A range the
                    // verdict marked as repeated is dropped here (the
                    // marking precedes the bytes: it is written before
                    // the verdict hands the segment over).
                    flow.touch(dir.from);
                    let at = st.read.get();
                    let (a, b) = match ins.kernel.bpf().stats(ins.cookie(dir.from)) {
                        Ok(k) => skip_within(at, n, k.skip_at, k.skip_len),
                        Err(_) => (n, n),
                    };
                    if b > a {
                        st.unsent.borrow_mut().drain(a..b);
                        st.skipped.set(st.skipped.get() + (b - a) as u64);
                        tracing::debug!(
                            ?dir,
                            bytes = b - a,
                            "sockmap: repeated bytes the verdict passed were dropped"
                        );
                    }
                    st.read.set(at + n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Nothing to read: the psock signals every segment its
                    // verdict takes, redirected ones too (see `watch`). Bytes
                    // move, so the tick is the fast one; and a direction in its
                    // steady state stops listening for data.
                    st.activate(flow);
                    quiet_if_steady(flow, ins, dir, from, st)?;
                    from.watch().readable().await;
                }
                Err(e) => return Err(DirError::new(dir.from, e)),
            }
        }
    }
}

/// Whether the kernel may redirect at least half the bound more from this
/// direction before it passes a segment for exceeding it.
fn roomy(ins: &Inserted, ctl: FlowCtl, redirected: u64) -> bool {
    ctl.redirect_limit.saturating_sub(redirected) >= (ins.kernel.max_inflight() / 2) as u64
}

/// Stop waking the direction's reader for readable bytes when the verdict
/// has nothing to pass it: ready, not paused, every passed byte read and
/// acknowledged, and room under the bound. From then on a FIN, an error or
/// the tick wakes it: the tick listens again as soon as it sees passed
/// bytes, the room shrink below half, or the flow go idle (the first byte
/// after a pause then wakes the direction and the fast tick with it).
fn quiet_if_steady(
    flow: &Flow<'_>,
    ins: &Inserted,
    dir: Dir,
    from: &KSock,
    st: &DirState,
) -> Result<(), DirError> {
    if !from.watch().wants_data() {
        return Ok(());
    }
    let ctl = st.ctl.get();
    if ctl.ready == 0 || ctl.paused != 0 || ctl.passed_ack != st.read.get() {
        return Ok(());
    }
    if !st.unsent.borrow().is_empty() || passed(ins, dir)? != st.read.get() {
        return Ok(());
    }
    let redirected = ins
        .account(flow, dir)
        .map_err(|e| DirError::new(dir.from, e))?;
    if roomy(ins, ctl, redirected) {
        from.watch()
            .want_data(false)
            .map_err(|e| DirError::new(dir.from, e))?;
    }
    Ok(())
}

/// One [`DRAIN_POLL`] wait, boxed: rare, and not every idle flow's room.
async fn pause() {
    Box::pin(tokio::time::sleep(DRAIN_POLL)).await;
}

/// The periodic part of a kernel flow, one per flow rather than per
/// direction (each timer is room every idle flow holds): account the bytes
/// the kernel forwarded, regulate each direction's bound, and back the
/// period off while nothing moves. Driven by the flow's driver (`drive`).
pub(crate) struct Ticker<'a, 'm> {
    pub flow: &'a Flow<'m>,
    pub ins: &'a Inserted,
    pub client: &'a KSock,
    pub server: &'a KSock,
    pub st: &'a [DirState; 2],
}

impl Ticker<'_, '_> {
    /// The period until the next tick: the shorter of the live directions'.
    pub(crate) fn period(&self) -> Duration {
        let ms = self
            .st
            .iter()
            .filter(|d| !d.done.get())
            .map(|d| d.tick_ms.get())
            .min()
            .unwrap_or(TICK_IDLE_MS);
        Duration::from_millis(u64::from(ms))
    }

    /// One tick over both directions.
    pub(crate) fn tick(&self) -> Result<(), DirError> {
        let dirs = [
            (
                super::flow::CLIENT_TO_SERVER,
                self.client,
                self.server,
                &self.st[0],
            ),
            (
                super::flow::SERVER_TO_CLIENT,
                self.server,
                self.client,
                &self.st[1],
            ),
        ];
        for (dir, from, to, st) in dirs {
            if st.done.get() {
                continue;
            }
            let ins = self.ins;
            let before = ins.seen(dir.from).get();
            let redirected = ins
                .account(self.flow, dir)
                .map_err(|e| DirError::new(dir.from, e))?;
            regulate(ins, dir, to, st, redirected)?;
            let passing = passed(ins, dir)? > st.read.get();
            let fast = redirected - before >= (ins.kernel.max_inflight() / FAST_SHARE) as u64;
            if fast {
                st.idle_ticks.set(0);
                st.tick_ms.set(TICK_FAST_MS);
            } else if redirected > before || passing {
                st.idle_ticks.set(0);
                st.tick_ms.set(TICK_ACTIVE_MS);
            } else {
                // Back off only after a while: a burst right after a
                // quiet start must still find the bound being raised.
                let idle = st.idle_ticks.get().saturating_add(1);
                st.idle_ticks.set(idle);
                if idle > IDLE_TICKS_BEFORE_BACKOFF {
                    st.tick_ms
                        .set(st.tick_ms.get().saturating_mul(2).min(TICK_IDLE_MS));
                }
            }
            // A quiet reader (`quiet_if_steady`) listens again before the
            // verdict needs it to, or before the tick slows down.
            if !from.watch().wants_data()
                && (passing
                    || !roomy(ins, st.ctl.get(), redirected)
                    || st.idle_ticks.get() >= IDLE_TICKS_BEFORE_BACKOFF)
            {
                from.watch()
                    .want_data(true)
                    .map_err(|e| DirError::new(dir.from, e))?;
            }
        }
        Ok(())
    }
}

/// A kernel-forwarded flow handed over: its state and dups of its sockets.
#[derive(Debug)]
pub struct Handed {
    pub snap: Snapshot,
    pub client: OwnedFd,
    pub server: OwnedFd,
    /// Bytes forwarded each way over the flow's whole life so far.
    pub to_server: u64,
    pub to_client: u64,
    /// Where the flow's bytes were counted (frontend, backend, server).
    pub route: Option<super::FlowRoute>,
}

#[cfg(test)]
mod tests {
    use super::skip_within;

    #[test]
    fn a_repeated_range_is_cut_from_the_reads_that_cover_it() {
        // No range recorded, or one elsewhere: nothing is cut.
        assert_eq!(skip_within(0, 100, 0, 0), (100, 100));
        assert_eq!(skip_within(100, 50, 0, 100), (50, 50));
        assert_eq!(skip_within(0, 100, 100, 20), (100, 100));
        // Inside one read.
        assert_eq!(skip_within(1000, 500, 1100, 50), (100, 150));
        // From the start of a read, and to its end.
        assert_eq!(skip_within(1000, 500, 1000, 10), (0, 10));
        assert_eq!(skip_within(1000, 500, 1490, 100), (490, 500));
        // Spanning two reads: each cuts its own part, together the whole range.
        assert_eq!(skip_within(0, 300, 200, 250), (200, 300));
        assert_eq!(skip_within(300, 300, 200, 250), (0, 150));
    }
}
