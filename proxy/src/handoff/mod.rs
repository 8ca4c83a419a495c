//! Forwarding of an established flow (client <-> server) behind one seam.
//!
//! Owns: moving bytes both ways until both directions are finished, in copy
//! mode (userspace buffers from a per-worker cache), splice mode
//! (per-direction pipes from the bounded process-wide pool, held only while
//! bytes move, falling back to copy), sockmap mode (`sockmap`), and `auto`'s
//! promotion of a flow from userspace to the kernel (`promote`), half-close
//! propagation, reset propagation, HAProxy-style inactivity timeouts and
//! live byte accounting through `Meter`.
//! Must not: spawn tasks (`forward` is one future driving both directions;
//! the daemon polls it on its own current_thread runtime), log per packet,
//! or touch a socket after the future is dropped (dropping it closes both).
//! Invariants: no byte lost, duplicated or reordered; `pending` reaches the
//! server before any byte read from the client here; a side's EOF becomes
//! SHUT_WR on the peer only after all that side's bytes were written; an
//! idle direction holds no buffer and no pipe.

mod copy;
mod flow;
pub mod ktls;
mod pool;
pub mod promote;
pub mod records;
pub mod sockmap;
mod splice;
#[cfg(test)]
mod tests;
pub mod tls;

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::{pin, Pin};
use std::time::Duration;

use tokio::net::TcpStream;

use crate::sys::sock;
use flow::{Dir, DirError, Flow, CLIENT_TO_SERVER, SERVER_TO_CLIENT};
use pool::Lease;
pub use pool::PipePool;

pub use copy::COPY_BUF_SIZE;
pub use pool::{MAX_PIPE_SIZE, MIN_PIPE_SIZE};
pub use promote::Promote;
pub use sockmap::Kernel;

/// A direction yields to the scheduler after moving this many bytes without
/// waiting, so one bulk direction cannot starve its twin, the timeout or
/// the other flows on the thread.
pub const BURST_BYTES: usize = 1 << 20;

/// What a process forwards with: splice's bounded pipe pool (`tune.pipesize`,
/// `maxpipes`) and, when BPF loaded, the kernel handoff. The runtime holds
/// one and lends it to every flow; tests make their own.
#[derive(Debug)]
pub struct Forwarding {
    pub pipes: PipePool,
    pub kernel: Option<std::sync::Arc<Kernel>>,
}

impl Forwarding {
    /// Userspace forwarding only (no BPF), with `pipes`.
    pub const fn userspace(pipes: PipePool) -> Self {
        Self {
            pipes,
            kernel: None,
        }
    }
}

/// How bytes are moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Copy,
    Splice,
    /// The kernel redirects the bytes (BPF SOCKHASH + sk_skb verdict).
    Sockmap,
}

impl Mode {
    /// Every mode, in the order `show info` and the exporter list them.
    pub const ALL: [Mode; 3] = [Mode::Sockmap, Mode::Splice, Mode::Copy];

    /// The mode's name in logs (`%fwd`), `show sess` and the exporter's labels.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sockmap => "sockmap",
            Mode::Splice => "splice",
            Mode::Copy => "copy",
        }
    }

    /// Position in [`Mode::ALL`].
    pub fn index(self) -> usize {
        match self {
            Mode::Sockmap => 0,
            Mode::Splice => 1,
            Mode::Copy => 2,
        }
    }
}

/// Whether a userspace flow's directions splice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Splicing {
    /// Copy through a userspace buffer.
    No,
    /// Splice through a pipe (`forward-mode splice`, `option splice-*`).
    Yes,
    /// `auto`: copy while messages are small, splice from the first read
    /// that fills the copy buffer, and copy again from the first small
    /// message ([`splice::SMALL_READ`]) after the socket ran dry: HAProxy's
    /// `splice-auto` splices streamers only, for the same reason. A small
    /// message copies in a read and a write, where splice takes two splices,
    /// a third to meet EAGAIN (a splice that empties the socket cannot tell
    /// it from a full pipe; a short copy read can) and a pipe lease; bulk
    /// splices at about half of copy's proxy CPU per byte. `cargo xtask
    /// bench`, 2026-12-07, 5 rounds, medians of proxy CPU: redis -c50 copy
    /// 15.6 µs/request, splice 18.7 (HAProxy 16.4); new connections copy
    /// 108 µs, splice 110; one iperf3 stream copy 0.485 s/GB, splice 0.247
    /// (HAProxy 0.710), at 13.2 and 12.9 Gbit/s. Until 2026-12-07 `auto`
    /// did the opposite (splice small messages, copy bulk), from a quieter
    /// host's 2026-12-04 figures: redis -c50 spliced 7 % faster, one bulk
    /// stream copied at 19.1 Gbit/s against splice's 15.1, at copy's CPU.
    Auto,
}

/// How a flow is to be forwarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// One mode for the whole flow (a forced `forward-mode`, or `auto` where
    /// a proxy asks for splice). Splice takes a pipe only while bytes move
    /// and copies when the pool has none.
    Fixed(Mode),
    /// `forward-mode auto`: copy small messages, splice bulk
    /// ([`Splicing::Auto`]); with `Some`,
    /// promoted to the kernel once the flow shows it pays (see `promote`).
    Auto(Option<Promote>),
}

impl Plan {
    /// The plan's name in `show sess` until the flow is promoted.
    pub fn name(self) -> &'static str {
        match self {
            Plan::Fixed(m) => m.name(),
            Plan::Auto(_) => "auto",
        }
    }
}

/// Inactivity timeouts (HAProxy `timeout client|server|tunnel|client-fin|
/// server-fin`, TCP mode). `None` = not set (infinite).
#[derive(Clone, Copy, Debug, Default)]
pub struct FlowTimeouts {
    pub client: Option<Duration>,
    pub server: Option<Duration>,
    pub tunnel: Option<Duration>,
    pub client_fin: Option<Duration>,
    pub server_fin: Option<Duration>,
}

/// Live byte accounting: called as bytes are written to the peer (so stats
/// are current while the flow runs).
pub trait Meter {
    fn to_server(&self, n: u64);
    fn to_client(&self, n: u64);
    /// Where the flow is counted, so a successor adopting it counts it there too.
    fn route(&self) -> Option<FlowRoute> {
        None
    }
    /// `auto` moved the flow to the kernel (its pair is in the SOCKHASH).
    fn promoted(&self) {}
    /// The client's TLS was handed to the kernel (`ktls`).
    fn ktls(&self) {}
    /// Bytes the session consumed from the client socket before the handoff
    /// and that the stream does not carry (a PROXY header the client sent):
    /// TCP received them, so the kernel path's totals (`read_before`) count
    /// them as read by userspace; the byte counters never see them.
    /// Not handed to a reload's successor (the `_getflows` record carries the
    /// flow's byte counts only): there, an adopted flow's EOF totals check of
    /// the client side is short by the header and warns.
    fn client_consumed(&self) -> u64 {
        0
    }
}

/// Indexes of the proxies a flow is counted in (this process's configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowRoute {
    pub fe: usize,
    pub be: usize,
    pub srv: usize,
}

/// Which party an error came from (pingora's error source): the client's
/// socket, the server's, or shunt itself (a kernel handoff that could not be
/// set up or resumed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Client,
    Server,
    Internal,
}

/// Why a flow ended.
#[derive(Debug)]
pub enum End {
    /// Both directions finished cleanly.
    Done,
    ClientReset,
    ServerReset,
    ClientTimeout,
    ServerTimeout,
    /// Any other I/O failure, with the side it came from.
    Error {
        origin: Origin,
        source: io::Error,
    },
}

impl End {
    /// A failure of shunt's own (not of either peer).
    pub fn internal(source: io::Error) -> Self {
        End::Error {
            origin: Origin::Internal,
            source,
        }
    }

    /// Which party ended the flow abnormally (`None`: it ended cleanly).
    pub fn origin(&self) -> Option<Origin> {
        match self {
            End::Done => None,
            End::ClientReset | End::ClientTimeout => Some(Origin::Client),
            End::ServerReset | End::ServerTimeout => Some(Origin::Server),
            End::Error { origin, .. } => Some(*origin),
        }
    }
}

/// The result of one `forward`.
#[derive(Debug)]
pub struct Outcome {
    pub to_server: u64,
    pub to_client: u64,
    /// Mode actually used: `Copy` when splice fell back (no pipes, or
    /// splice unsupported mid-flow in either direction).
    pub mode: Mode,
    pub end: End,
    /// The flow was handed to a successor process (a reload) and goes on
    /// there: this process must neither log nor count its end.
    pub handed_over: bool,
    /// `auto` moved the flow to the kernel this long after forwarding began.
    pub promoted: Option<std::time::Duration>,
}

/// Forward until both directions are finished, taking splice's pipes and the
/// kernel handoff from `fwd` (the runtime's; tests use private ones). `pending` = bytes
/// userspace already read from the client while routing; they are written to
/// the server FIRST.
///
/// # Promotion
/// In `Plan::Auto` with a promotion policy, the flow starts in userspace and
/// its reads are weighed (`Flow::read`). When they tip the balance the flow
/// asks its directions to park: each writes out what it holds (copy buffer
/// or pipe, with the cork pushed), reads its socket's queue empty with one
/// read larger than it (`copy::read_dry`: the kernel hands the verdict whole
/// segments, so a segment read in part would be forwarded twice), and waits
/// holding nothing without reading again. Once both wait so, their futures
/// are dropped, and the pair is inserted exactly as a new flow's (`sockmap`'s
/// "Race window"): every byte userspace read is in the peer's send queue,
/// every byte it did not read is in whole segments in its socket's receive
/// queue, where the verdict meets them. Directions that do not get there in
/// `promote::PARK_LIMIT` call the promotion off (the flow is watched again,
/// a bounded number of times); a pair the kernel refuses goes on in
/// userspace, never watched again.
///
/// Not an `async fn`: one would keep its arguments twice in the future (as
/// arguments and as the body's locals), room every flow pays for.
#[allow(clippy::manual_async_fn)]
pub fn forward<'a>(
    fwd: &'a Forwarding,
    client: TcpStream,
    server: TcpStream,
    mut pending: Vec<u8>,
    plan: Plan,
    timeouts: FlowTimeouts,
    meter: &'a dyn Meter,
) -> impl Future<Output = Outcome> + use<'a> {
    async move {
        // TCP_NODELAY is already on both sockets: the client inherited it from
        // its listener (`listeners::bind_tcp_with`), the server got it at
        // connect (`lb::spares`), an adopted flow's sockets kept theirs.
        let (mut mode, promote) = match plan {
            Plan::Fixed(m) => (m, None),
            Plan::Auto(p) => (Mode::Copy, p),
        };
        let auto = matches!(plan, Plan::Auto(_));
        let flow = Flow::watched(meter, promote);
        let pool = &fwd.pipes;
        let started = tokio::time::Instant::now();
        let mut promoted = None;
        loop {
            if mode == Mode::Sockmap {
                let pending = std::mem::take(&mut pending);
                let (ins, st) = match Box::pin(insert_kernel(fwd, &flow, &client, &server, pending))
                    .await
                {
                    Ok(i) => i,
                    Err(KernelFallback::Splice(why)) => {
                        tracing::debug!(reason = %why, "flow not eligible for sockmap; forwarding in userspace");
                        flow.call_off(false);
                        mode = if auto { Mode::Copy } else { Mode::Splice };
                        promoted = None;
                        continue;
                    }
                    Err(KernelFallback::Failed(end)) => {
                        return finish(&flow, &client, &server, Mode::Sockmap, end, promoted)
                    }
                };
                if promoted.is_some() {
                    meter.promoted();
                }
                // Boxed: see `userspace` below. The sockets go with it.
                let kernel = Box::pin(run_kernel(
                    &flow,
                    client,
                    server,
                    ins,
                    st,
                    &timeouts,
                    (0, 0),
                ));
                return match kernel.await {
                    KernelEnd::Ended(end) => outcome(&flow, Mode::Sockmap, end, promoted),
                    KernelEnd::HandedOver => handed_over(&flow),
                };
            }
            let splice = match mode {
                Mode::Splice => Splicing::Yes,
                _ if auto => Splicing::Auto,
                _ => Splicing::No,
            };
            // Boxed like the kernel stage: the flow's own future keeps only what
            // both stages share, and each flow holds the room of the stage it is in.
            let driven = Box::pin(userspace(
                pool,
                &flow,
                &client,
                &server,
                std::mem::take(&mut pending),
                splice,
                &timeouts,
            ))
            .await;
            match driven {
                Driven::End(end) => {
                    let spliced = match splice {
                        Splicing::No => false,
                        Splicing::Yes => true,
                        Splicing::Auto => flow.spliced.get(),
                    };
                    let used = if spliced && !flow.fell_back.get() {
                        Mode::Splice
                    } else {
                        Mode::Copy
                    };
                    return finish(&flow, &client, &server, used, end, None);
                }
                Driven::Quiescent => {
                    flow.promoting();
                    promoted = Some(started.elapsed());
                    mode = Mode::Sockmap;
                }
            }
        }
    }
}

/// The userspace stage of a flow: both directions until the flow ends or
/// both are quiescent for a promotion (their futures are dropped on return:
/// each then holds nothing, parked or waiting for bytes).
///
/// Not an `async fn`: it would store its arguments twice in every flow's
/// future (see "Memory of an idle flow" in docs/architecture.md).
#[allow(clippy::manual_async_fn)]
fn userspace<'a, 'm>(
    pool: &'a PipePool,
    flow: &'a Flow<'m>,
    client: &'a TcpStream,
    server: &'a TcpStream,
    pending: Vec<u8>,
    splice: Splicing,
    timeouts: &'a FlowTimeouts,
) -> impl Future<Output = Driven> + use<'a, 'm> {
    async move {
        // Pinned where they are made: a future moved into `drive` would be stored
        // twice in this one (see `drive`).
        let c2s = pin!(direction(
            flow,
            CLIENT_TO_SERVER,
            client,
            server,
            pending,
            pool,
            splice,
        ));
        let s2c = pin!(direction(
            flow,
            SERVER_TO_CLIENT,
            server,
            client,
            Vec::new(),
            pool,
            splice,
        ));
        drive(flow, timeouts, c2s, s2c, &NoPace).await
    }
}

/// Why `insert_kernel` did not insert the pair.
enum KernelFallback {
    /// Not inserted, nothing changed: forward in userspace instead.
    Splice(String),
    /// The flow ended (or must end) before or during insertion.
    Failed(End),
}

/// How the kernel part of a flow ended in this process.
enum KernelEnd {
    Ended(End),
    /// Handed to a successor: the sockets and the map entries live on there.
    HandedOver,
}

/// Sockmap mode: flush `pending` and insert the pair (see `sockmap`'s "Race
/// window"); `run_kernel` then watches both directions.
async fn insert_kernel(
    fwd: &Forwarding,
    flow: &Flow<'_>,
    client: &TcpStream,
    server: &TcpStream,
    pending: Vec<u8>,
) -> Result<(sockmap::Inserted, [sockmap::DirState; 2]), KernelFallback> {
    if let Err(e) = copy::write_all(flow, CLIENT_TO_SERVER, server, &pending).await {
        return Err(KernelFallback::Failed(e.into_end()));
    }
    let Some(kernel) = &fwd.kernel else {
        return Err(KernelFallback::Splice("BPF not loaded".into()));
    };
    // The session read a PROXY header, exactly its bytes, from the client's
    // first segment: the rest of that segment is still queued, in a segment
    // read in part, which the verdict would be handed whole (the header
    // again). Read the queue dry first, as a promotion does. Only when bytes
    // are queued: with none there is no such segment, and a FIN already
    // there is left for the path every early FIN takes (`insert` refuses a
    // half-closed client, which is then forwarded in userspace and propagates
    // it once).
    let queued = || sock::inq(client.as_fd()).map_or(true, |n| n > 0);
    if flow.client_consumed() > 0 && flow.to_server() == 0 && queued() {
        if let Err(e) = Box::pin(copy::read_dry(flow, CLIENT_TO_SERVER, client, server)).await {
            return Err(KernelFallback::Failed(e.into_end()));
        }
    }
    let read_before = [flow.to_server() + flow.client_consumed(), flow.to_client()];
    let ins = match sockmap::insert(kernel, client, server, read_before) {
        Ok(i) => i,
        Err(sockmap::NotEligible::Fallback(why)) => return Err(KernelFallback::Splice(why)),
        Err(sockmap::NotEligible::Abort(e)) => {
            return Err(KernelFallback::Failed(End::internal(e)))
        }
    };
    let st = [
        sockmap::DirState::new(&ins, CLIENT_TO_SERVER),
        sockmap::DirState::new(&ins, SERVER_TO_CLIENT),
    ];
    Ok((ins, st))
}

/// Watch an inserted pair until it ends, or until a reload asks for it
/// (`sockmap::Member`): then the directions are dropped where they wait
/// (their state is in `st`, see `sockmap::DirState`), the state and dups of
/// both sockets go to the collection, and the map entries stay. `prior` is
/// what the flow forwarded in earlier processes (client to server, server
/// to client).
///
/// Not an `async fn`: the future of one would keep its arguments twice (as
/// arguments and as the body's locals), here `ins` and `st`, in every
/// kernel flow's room; the `async move` block uses them where they are. The
/// sockets move into the worker's watch here, before the block, so that it
/// holds them once (moved inside it, the emptied `TcpStream`s, the pair as
/// made and the pair as used would each keep a slot: 112 B per flow).
#[allow(clippy::manual_async_fn)]
fn run_kernel<'a, 'm>(
    flow: &'a Flow<'m>,
    client: TcpStream,
    server: TcpStream,
    ins: sockmap::Inserted,
    st: [sockmap::DirState; 2],
    timeouts: &'a FlowTimeouts,
    prior: (u64, u64),
) -> impl Future<Output = KernelEnd> + use<'a, 'm> {
    // Out of the runtime's epoll, into the worker's watch (`sockmap::watch`:
    // no wake-up per redirected segment). Every path below drops `ins` first,
    // so the sockets close after its drop has deleted the map entries.
    let socks = sockmap::KSock::new(client).and_then(|c| Ok((c, sockmap::KSock::new(server)?)));
    async move {
        let (client, server) = match socks {
            Ok((ref c, ref s)) => (c, s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch a kernel flow's sockets: closing it");
                drop(ins);
                return KernelEnd::Ended(End::internal(e));
            }
        };
        // Borrows `ins` (no `Arc` clone of the kernel in every flow's room):
        // `member` is dropped before `ins` on every path.
        let mut member = ins.kernel().handover().join();
        let end = loop {
            let asked = {
                let c2s = pin!(sockmap::run(
                    flow,
                    &ins,
                    CLIENT_TO_SERVER,
                    client,
                    server,
                    &st[0]
                ));
                let s2c = pin!(sockmap::run(
                    flow,
                    &ins,
                    SERVER_TO_CLIENT,
                    server,
                    client,
                    &st[1]
                ));
                let ticker = sockmap::Ticker {
                    flow,
                    ins: &ins,
                    client,
                    server,
                    st: &st,
                };
                // Pinned here and mapped in the arm: an async block around it
                // would keep its own copy of the references (48 B per flow).
                let driven = pin!(drive(flow, timeouts, c2s, s2c, &ticker));
                tokio::select! {
                    // In order: no thread-local RNG draw per wake (see `drive`).
                    biased;
                    d = driven => Err(match d {
                        Driven::End(end) => end,
                        // Never asked for here: the flow is already in the kernel.
                        Driven::Quiescent => End::Done,
                    }),
                    () = member.requested() => Ok(()),
                }
                // Both directions' futures are dropped here, wherever they waited.
            };
            match asked {
                Err(end) => break end,
                Ok(()) => {
                    if hand_over(flow, client, server, &ins, &st, prior, &mut member) {
                        return KernelEnd::HandedOver;
                    }
                }
            }
        };
        drop(member);
        ins.account_all(flow);
        if !matches!(end, End::Done) {
            ins.debug_state(client, server);
        }
        // Dropping `ins` deletes both SOCKHASH keys and flow entries before the
        // sockets close.
        drop(ins);
        reset_peer(&end, client.as_fd(), server.as_fd());
        KernelEnd::Ended(end)
    }
}

/// Offer a quiesced kernel flow to the hand-over collection: true when it
/// was taken (the map entries stay for the successor), false when it goes
/// on here (dups failed, or too late for the collection). Not async: what it
/// builds is never part of the flow's future.
fn hand_over(
    flow: &Flow<'_>,
    client: &sockmap::KSock,
    server: &sockmap::KSock,
    ins: &sockmap::Inserted,
    st: &[sockmap::DirState; 2],
    prior: (u64, u64),
    member: &mut sockmap::Member<'_>,
) -> bool {
    ins.account_all(flow);
    let dups = client
        .as_fd()
        .try_clone_to_owned()
        .and_then(|c| Ok((c, server.as_fd().try_clone_to_owned()?)));
    let (c, s) = match dups {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "cannot hand a kernel flow over; it stays here");
            member.leave();
            return false;
        }
    };
    let handed = sockmap::Handed {
        snap: ins.snapshot(&st[0], &st[1]),
        client: c,
        server: s,
        to_server: prior.0 + flow.to_server(),
        to_client: prior.1 + flow.to_client(),
        route: flow.route(),
    };
    if member.offer(handed) {
        ins.disarm();
        return true;
    }
    // Too late for the collection: go on here.
    false
}

/// Continue a kernel flow a predecessor handed over (see `crate::reload`):
/// its pair is still in the pinned maps and its directions go on from the
/// handed state. Counts and totals include what earlier processes forwarded.
pub async fn resume(
    kernel: &std::sync::Arc<Kernel>,
    client: TcpStream,
    server: TcpStream,
    handed: sockmap::Snapshot,
    prior: (u64, u64),
    timeouts: FlowTimeouts,
    meter: &dyn Meter,
) -> Outcome {
    let flow = Flow::new(meter);
    let ins = match sockmap::Inserted::adopt(kernel, &client, &server, &handed) {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!(error = %e, "cannot adopt a kernel flow: closing it");
            let mut out = finish(
                &flow,
                &client,
                &server,
                Mode::Sockmap,
                End::internal(e),
                None,
            );
            out.to_server += prior.0;
            out.to_client += prior.1;
            return out;
        }
    };
    let [c2s, s2c] = handed.dirs;
    let st = [
        sockmap::DirState::from_snapshot(c2s),
        sockmap::DirState::from_snapshot(s2c),
    ];
    let end = run_kernel(&flow, client, server, ins, st, &timeouts, prior).await;
    let mut out = match end {
        KernelEnd::Ended(end) => outcome(&flow, Mode::Sockmap, end, None),
        KernelEnd::HandedOver => handed_over(&flow),
    };
    out.to_server += prior.0;
    out.to_client += prior.1;
    out
}

/// The outcome of a flow handed to a successor.
fn handed_over(flow: &Flow<'_>) -> Outcome {
    Outcome {
        to_server: flow.to_server(),
        to_client: flow.to_client(),
        mode: Mode::Sockmap,
        end: End::Done,
        handed_over: true,
        promoted: None,
    }
}

/// Propagate a reset to the other side and build the outcome.
fn finish(
    flow: &Flow<'_>,
    client: &TcpStream,
    server: &TcpStream,
    used: Mode,
    end: End,
    promoted: Option<std::time::Duration>,
) -> Outcome {
    reset_peer(&end, client.as_fd(), server.as_fd());
    outcome(flow, used, end, promoted)
}

/// One side reset: reset the other too (SO_LINGER {on,0}; closing it, which
/// the caller's drop does, then sends RST).
fn reset_peer(end: &End, client: BorrowedFd<'_>, server: BorrowedFd<'_>) {
    let peer = match end {
        End::ClientReset => server,
        End::ServerReset => client,
        _ => return,
    };
    if let Err(e) = sock::set_linger_reset(peer) {
        tracing::debug!(error = %e, "SO_LINGER reset failed");
    }
}

/// A flow's outcome, its sockets dealt with.
fn outcome(
    flow: &Flow<'_>,
    used: Mode,
    end: End,
    promoted: Option<std::time::Duration>,
) -> Outcome {
    Outcome {
        to_server: flow.to_server(),
        to_client: flow.to_client(),
        mode: used,
        end,
        handed_over: false,
        promoted,
    }
}

/// One direction: flush `initial`, then splice (with `splice`) or copy. A
/// direction whose splice falls back copies to its end.
///
/// Not an `async fn`: it would store its arguments twice in every flow's
/// future (see "Memory of an idle flow" in docs/architecture.md).
#[allow(clippy::manual_async_fn)]
fn direction<'a, 'm>(
    flow: &'a Flow<'m>,
    dir: Dir,
    from: &'a TcpStream,
    to: &'a TcpStream,
    initial: Vec<u8>,
    pool: &'a PipePool,
    splice: Splicing,
) -> impl Future<Output = Result<(), DirError>> + use<'a, 'm> {
    async move {
        copy::write_all(flow, dir, to, &initial).await?;
        drop(initial);
        if splice != Splicing::No {
            let auto = splice == Splicing::Auto;
            loop {
                if auto && copy::run(flow, dir, from, to, true).await? {
                    return Ok(());
                }
                flow.spliced.set(true);
                let rest = {
                    let mut lease = Lease::lazy(pool);
                    loop {
                        match splice::run(flow, dir, from, to, &mut lease, auto).await? {
                            splice::Exit::Done => return Ok(()),
                            splice::Exit::ReadDry => {
                                // Boxed, as in `copy::run`.
                                if Box::pin(copy::read_dry(flow, dir, from, to)).await? {
                                    return Ok(());
                                }
                            }
                            splice::Exit::Small => break None,
                            splice::Exit::Fallback => {
                                flow.fell_back.set(true);
                                // The pipe is empty afterwards, and goes back
                                // (the lease's scope ends) before copying.
                                break Some(
                                    splice::drain(&mut lease)
                                        .map_err(|e| DirError::new(dir.to, e))?,
                                );
                            }
                        }
                    }
                };
                if let Some(rest) = rest {
                    copy::write_all(flow, dir, to, &rest).await?;
                    break;
                }
            }
        }
        copy::run(flow, dir, from, to, false).await.map(|_| ())
    }
}

/// TCP_NODELAY on both sockets of a flow whose bytes a TLS layer frames
/// (kTLS, shunt's records, rustls): a record's tail must not wait on Nagle.
/// A failure is only logged.
fn nodelay(client: &TcpStream, server: &TcpStream) {
    for s in [client, server] {
        if let Err(e) = sock::set_nodelay(s.as_fd()) {
            tracing::debug!(error = %e, "TCP_NODELAY at flow start failed");
        }
    }
}

/// [`drive`] for a flow nothing promotes (TLS in every form): no pacing,
/// and no park, which only a promotion asks for.
///
/// Not an `async fn`: it would store its arguments twice in the flow's
/// future (see "Memory of an idle flow" in docs/architecture.md).
#[allow(clippy::manual_async_fn)]
fn drive_unpromoted<'a, 'm, A, B>(
    flow: &'a Flow<'m>,
    t: &'a FlowTimeouts,
    c2s: Pin<&'a mut A>,
    s2c: Pin<&'a mut B>,
) -> impl Future<Output = End> + use<'a, 'm, A, B>
where
    A: Future<Output = Result<(), DirError>>,
    B: Future<Output = Result<(), DirError>>,
{
    async move {
        match drive(flow, t, c2s, s2c, &NoPace).await {
            Driven::End(end) => end,
            Driven::Quiescent => End::Done,
        }
    }
}

/// How `drive` returned.
enum Driven {
    End(End),
    /// A promotion was asked for and both directions hold nothing.
    Quiescent,
}

/// A flow's periodic work besides its timeouts, run by its driver.
trait Pace {
    /// The time from the last tick to the next (`None`: no ticks).
    fn period(&self) -> Option<Duration>;
    /// One tick; also run before a timeout is judged.
    fn tick(&self) -> Result<(), DirError>;
}

/// A userspace flow: nothing periodic, the directions see every byte.
struct NoPace;

impl Pace for NoPace {
    fn period(&self) -> Option<Duration> {
        None
    }
    fn tick(&self) -> Result<(), DirError> {
        Ok(())
    }
}

impl Pace for sockmap::Ticker<'_, '_> {
    fn period(&self) -> Option<Duration> {
        Some(sockmap::Ticker::period(self))
    }
    fn tick(&self) -> Result<(), DirError> {
        sockmap::Ticker::tick(self)
    }
}

/// Polls both directions and the inactivity deadline until both directions
/// are done, one fails, or a side times out.
///
/// `pace` is the flow's periodic work besides its timeouts (a kernel flow's
/// accounting and bounds, `sockmap::Ticker`), one timer for both: its tick
/// also runs before a timeout is declared, bringing activity seen elsewhere
/// (the kernel's counters) into `flow`, so a late poll of those counters can
/// never expire an active flow.
///
/// The directions come pinned by the caller, made in place: a future taken by
/// value and pinned here would be stored twice in the flow's state (the argument
/// and the pinned local), which every idle flow pays for in memory.
///
/// Not an `async fn`: it would store its arguments twice in every flow's
/// future (see "Memory of an idle flow" in docs/architecture.md).
#[allow(clippy::manual_async_fn)]
fn drive<'a, 'm, A, B>(
    flow: &'a Flow<'m>,
    t: &'a FlowTimeouts,
    c2s: Pin<&'a mut A>,
    s2c: Pin<&'a mut B>,
    pace: &'a dyn Pace,
) -> impl Future<Output = Driven> + use<'a, 'm, A, B>
where
    A: Future<Output = Result<(), DirError>>,
    B: Future<Output = Result<(), DirError>>,
{
    async move {
        let (mut c2s, mut s2c) = (c2s, s2c);
        let (mut up_done, mut down_done) = (false, false);
        let mut last_tick = tokio::time::Instant::now();
        loop {
            if up_done && down_done {
                return Driven::End(End::Done);
            }
            if flow.parking() {
                if up_done || down_done {
                    // Half-closed meanwhile: the kernel would refuse the pair.
                    flow.call_off(false);
                } else if flow.quiescent() {
                    tracing::debug!("both directions parked: promoting the flow");
                    return Driven::Quiescent;
                } else if flow
                    .park_deadline()
                    .is_some_and(|d| d <= tokio::time::Instant::now())
                {
                    // A direction could not read its socket dry in time
                    // (backpressure): go on in userspace, try again later.
                    tracing::debug!("directions not parkable in time: promotion called off");
                    flow.call_off(true);
                }
            }
            // Activity only pushes deadlines later, so sleeping until the
            // earliest one computed now and re-checking on wake is exact; a
            // half-close can bring one closer, and it wakes us to recompute.
            let tick_at = pace.period().map(|p| last_tick + p);
            let deadline = [flow.deadline(t), flow.park_deadline(), tick_at]
                .into_iter()
                .flatten()
                .min();
            let sleep = async move {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending::<()>().await,
                }
            };
            // In order, without tokio's random start (a thread-local RNG draw on
            // every wake of every flow): each direction yields after a burst, so
            // neither starves the other, and the signal and the timer are only
            // looked at after both directions.
            tokio::select! {
                biased;
                r = &mut c2s, if !up_done => match r {
                    Ok(()) => up_done = true,
                    Err(e) => {
                        tracing::debug!(error = %e, "client-to-server direction failed");
                        return Driven::End(e.into_end());
                    }
                },
                r = &mut s2c, if !down_done => match r {
                    Ok(()) => down_done = true,
                    Err(e) => {
                        tracing::debug!(error = %e, "server-to-client direction failed");
                        return Driven::End(e.into_end());
                    }
                },
                // A half-close, a promotion asked for, or a direction that became
                // parkable: recheck at the top (a spurious wake only loops once).
                () = flow.changed.wait() => {}
                () = sleep => {
                    if let Err(e) = pace.tick() {
                        tracing::debug!(error = %e, "kernel flow tick failed");
                        return Driven::End(e.into_end());
                    }
                    last_tick = tokio::time::Instant::now();
                    if let Some(end) = flow.expired(t, tokio::time::Instant::now()) {
                        return Driven::End(end);
                    }
                }
            }
        }
    }
}
