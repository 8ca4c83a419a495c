//! Seamless reload: the listening sockets handed from the running process to its
//! successor over the stats socket, as HAProxy's `-x PATH` / `expose-fd listeners`.
//!
//! Owns the server side of `_getsocks` and the client side the successor runs
//! before it binds. The exported listener descriptors (dups of every listening
//! socket, kept while the process runs and closed at soft or hard stop) and the
//! hand-over flags are the runtime's `Handover`, which this module's
//! `_getflows` server moves.
//!
//! Protocol (HAProxy's, so either side may be HAProxy's tooling): the client
//! writes `_getsocks\n` on a stats socket configured with `expose-fd listeners`;
//! the server answers a native-endian `i32`, the number of descriptors, then
//! batches of at most [`MAX_SEND_FD`] descriptors, one `sendmsg` each with
//! `SCM_RIGHTS`, whose data holds per descriptor: a namespace name length byte and
//! name, an interface name length byte and name (both empty for shunt) and four
//! zero bytes. After every full batch the server waits for a 4-byte
//! acknowledgement. Then it closes the connection. On a socket without
//! `expose-fd listeners` it closes without a byte.
//!
//! Invariant: nothing here changes the sockets themselves; a successor holds the
//! same listening sockets (the same accept queues), so a client that connects
//! while the old process stops accepting waits in the queue for the new one,
//! and is never refused.
//!
//! # Kernel flows (`_getflows`)
//! Beyond HAProxy, kernel-forwarded flows move to the successor too, and the old
//! process exits without waiting for them. The successor, started with `-x PATH
//! -sf PID`, reuses the old process's BPF maps (pinned per instance, see
//! `crate::bpf` "Pinned maps"), runs every start-up step that can fail, starts
//! its workers with accepting held, then writes `_getflows ID commit` (ID: the
//! kernel's id of its SOCKHASH, `-` without BPF) on a connection it opened to
//! the old process during its start-up. The old process answers
//! [`COMMIT_PROTO`], holds its accept loops, then [`MAPS_DIFFER`] (and keeps
//! its flows) unless its SOCKHASH has that id; else it asks every kernel flow
//! to quiesce and sends a native-endian `i32` count, then per flow one
//! `sendmsg` whose `SCM_RIGHTS` carries the client and server sockets and
//! whose data is the fixed record of [`encode_flow`], followed by the record's
//! trailer (bytes read and not yet written, names). The successor answers
//! [`COMMIT`]; the old process [`COMMIT_ACK`], then soft-stops. Only after
//! the acknowledgement does the successor adopt each flow on a worker: the
//! same sockets (dups of the same open files), the same map entries, the
//! direction loops of `handoff::sockmap` continued from the handed state.
//! Without the commit within [`COMMIT_WAIT`], the old process takes its flows
//! back from the same snapshots and releases its accept loops.
//! `_getflows ID` without `commit` is the first protocol (the count at once,
//! flows given away as sent, soft stop first), still served for a successor
//! of that release; its answer tells a successor it speaks to such an old
//! process.
//!
//! # Hand-over: why no byte is lost, duplicated or reordered
//! The kernel side never stops: the SOCKHASH entries are never deleted, the
//! sockets never close (the old process's descriptors are dups; the files stay
//! open through the ones in flight and then the successor's), and each psock
//! keeps the verdict it got at insertion (`crate::bpf`, "Pinned maps"). So a
//! redirect goes on exactly as before, and the only question is userspace's
//! part of the protocol ("Race window" in `handoff::sockmap` and `crate::bpf`),
//! which has one owner at every instant:
//!
//! 1. **Quiesce.** A flow task answers the request only at its own select
//!    point, by dropping both direction futures (the request wakes it
//!    through the watch its sockets are in: `sockmap::watch::wake_all`).
//!    Every piece of a direction's state lives outside its future (`sockmap::DirState`: cells), and each
//!    field is updated right after the syscall it accounts for, with no await
//!    in between: `read` and `unsent` right after the `recv` that took passed
//!    bytes, `written` and `unsent` after each `write`, `ctl` after each
//!    `FlowCtl` update, `done` after the `SHUT_WR`. Dropping the future at any
//!    await leaves `read == written + unsent.len()` (bytes taken from the
//!    source = bytes delivered + bytes held), and `ctl` equal to what the map
//!    holds (the task is the map entry's only writer, Race window 6).
//! 2. **Single owner.** The old task snapshots the state after its futures are
//!    gone and never touches the flow again (its `Inserted` guard is disarmed:
//!    no deletion; its descriptors close, not the sockets). The successor's
//!    task starts from the snapshot only once it has been received. Between
//!    the two nobody reads a socket or writes `FlowCtl`, so the kernel's view
//!    (`passed_bytes` vs `passed_ack`) is frozen as far as userspace goes:
//!    if bytes were passed in between they wait in the psock's queue, counted
//!    in `passed_bytes` and not acknowledged, and the gate keeps the direction
//!    passing (never redirecting past them) until the new owner has read,
//!    written and acknowledged them.
//! 3. **Bytes held in userspace.** `unsent` travels with the state and the
//!    successor writes it first, before reading anything: the adopted loop
//!    starts with the same "drain, then write, then acknowledge" step the old
//!    loop would have taken (the drain is a monotonic condition on counters
//!    that persist in the maps and sockets, so repeating it is harmless). The
//!    acknowledgement `passed_ack = read` is only ever written when `unsent`
//!    is empty, by whichever process wrote the last byte of it. Hence no byte
//!    read is lost (it is written by exactly one process: bytes leave `unsent`
//!    only when written, and `unsent` is moved, not copied, between owners),
//!    none is written twice (`written` and `unsent` are updated per write, in
//!    the owner's own counts), and none is reordered (passed bytes are written
//!    in read order, after the drain, under the same gate as without reload).
//! 4. **Counts and baselines.** The drain and the redirect bound compare the
//!    destination's `tcpi_bytes_acked + SIOCOUTQ` against the baselines taken
//!    at insertion plus `written`; the baselines, `written`, `read`, `ctl` and
//!    the redirected bytes already accounted are all in the record, and the
//!    kernel counters are in the reused maps, so the successor computes the
//!    same numbers the old process would have.
//! 5. **EOF.** A FIN read by the old process stays in the socket (reading EOF
//!    consumes nothing): the successor reads it again and runs the drain
//!    check before `SHUT_WR`. A direction whose `SHUT_WR` was already sent is
//!    `done` and is not run again.
//! 6. **Failures.** A flow that cannot be dup'ed, or answers after the
//!    collection was taken, stays in the old process (registered flows are
//!    waited for, bounded by [`QUIESCE_LIMIT`]; flows starting after the
//!    request are never registered). If sending fails or no commit comes,
//!    the successor holds nothing it runs (it adopts only after the
//!    acknowledgement) and the old process continues the collected flows
//!    itself from the same snapshots, by the same argument, in a new
//!    hand-over generation (`sockmap::Registry::reopen`: a later request
//!    reaches them again). A successor that got no acknowledgement drops its
//!    copies, unless the old process is gone (then they are the only ones).
//!    A successor whose maps differ is told so before anything is quiesced.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::runtime::Handover;

/// Descriptors per `sendmsg` (HAProxy's value; the kernel's SCM_MAX_FD is 253).
pub const MAX_SEND_FD: usize = 253;
/// Bytes of per-descriptor data shunt sends: empty namespace, empty interface, 4 zeros.
const FD_INFO_LEN: usize = 1 + 1 + 4;
/// Largest per-descriptor data a peer may send (names up to 255 bytes each).
const FD_INFO_MAX: usize = 1 + 255 + 1 + 255 + 4;
/// Most descriptors a successor accepts (bounds its memory if the peer lies).
const MAX_FDS: usize = 65_536;
/// Bound on every blocking send or receive of the transfer.
const XFER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("cannot connect to the old process's stats socket '{path}': {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reload through the old process's stats socket '{path}': {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reload through the old process's stats socket '{path}': {reason}")]
    Protocol { path: PathBuf, reason: String },
}

fn set_blocking_with_timeouts(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let s = socket2::SockRef::from(&fd);
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(XFER_TIMEOUT))?;
    s.set_write_timeout(Some(XFER_TIMEOUT))
}

/// Serve `_getsocks` on `conn` (a CLI connection whose socket has `expose-fd
/// listeners`): send every descriptor `handover` exported. Blocking, each step
/// bounded by [`XFER_TIMEOUT`]; the caller closes the connection afterwards.
pub fn serve_getsocks(handover: &Handover, conn: BorrowedFd<'_>) -> std::io::Result<usize> {
    // Our own dups for the duration of the transfer: a concurrent stop may close
    // the exported ones meanwhile.
    let held: Vec<OwnedFd> = handover.exported_dups()?;
    if held.is_empty() {
        return Ok(0);
    }
    set_blocking_with_timeouts(conn)?;
    let total = i32::try_from(held.len()).unwrap_or(i32::MAX);
    let mut stream = UnixStream::from(conn.try_clone_to_owned()?);
    stream.write_all(&total.to_ne_bytes())?;
    let chunks: Vec<&[OwnedFd]> = held.chunks(MAX_SEND_FD).collect();
    let n_chunks = chunks.len();
    for (i, chunk) in chunks.into_iter().enumerate() {
        let raw: Vec<RawFd> = chunk.iter().map(AsRawFd::as_raw_fd).collect();
        let data = vec![0u8; chunk.len() * FD_INFO_LEN];
        let iov = [std::io::IoSlice::new(&data)];
        let cmsg = [ControlMessage::ScmRights(&raw)];
        let sent = sendmsg::<()>(stream.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
            .map_err(std::io::Error::from)?;
        if sent != data.len() {
            return Err(std::io::Error::other(format!(
                "short sendmsg: {sent} of {} bytes",
                data.len()
            )));
        }
        if chunk.len() == MAX_SEND_FD && i + 1 < n_chunks {
            let mut ack = [0u8; 4];
            stream.read_exact(&mut ack)?;
        }
    }
    Ok(held.len())
}

/// The successor's side: connect to the old process's stats socket at `path`,
/// run `_getsocks` and return the descriptors received (close-on-exec).
pub fn fetch_sockets(path: &Path) -> Result<Vec<OwnedFd>, ReloadError> {
    let io = |source: std::io::Error| ReloadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let proto = |reason: String| ReloadError::Protocol {
        path: path.to_path_buf(),
        reason,
    };
    let mut stream = UnixStream::connect(path).map_err(|source| ReloadError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    set_blocking_with_timeouts(stream.as_fd()).map_err(io)?;
    stream.write_all(b"_getsocks\n").map_err(io)?;
    let mut count = [0u8; 4];
    if let Err(e) = stream.read_exact(&mut count) {
        return Err(if e.kind() == std::io::ErrorKind::UnexpectedEof {
            proto(
                "no answer to _getsocks (is the socket configured with 'expose-fd listeners'?)"
                    .into(),
            )
        } else {
            io(e)
        });
    }
    let total = usize::try_from(i32::from_ne_bytes(count))
        .ok()
        .filter(|n| *n <= MAX_FDS)
        .ok_or_else(|| {
            proto(format!(
                "invalid descriptor count {}",
                i32::from_ne_bytes(count)
            ))
        })?;
    let mut got: Vec<OwnedFd> = Vec::with_capacity(total);
    let mut data = vec![0u8; MAX_SEND_FD * FD_INFO_MAX];
    while got.len() < total {
        let mut cmsg_buf = nix::cmsg_space!([RawFd; MAX_SEND_FD]);
        let mut iov = [std::io::IoSliceMut::new(&mut data)];
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_buf),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| io(e.into()))?;
        let mut batch = 0usize;
        for c in msg.cmsgs().map_err(|e| io(e.into()))? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for fd in fds {
                    // SAFETY: `fd` was just installed in this process by the kernel
                    // for this SCM_RIGHTS message; nothing else refers to it.
                    got.push(unsafe { OwnedFd::from_raw_fd(fd) });
                    batch += 1;
                }
            }
        }
        if msg.bytes == 0 && batch == 0 {
            return Err(proto(format!(
                "connection closed after {} of {total} descriptors",
                got.len()
            )));
        }
        if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
            return Err(proto("descriptors truncated (MSG_CTRUNC)".into()));
        }
        if batch == MAX_SEND_FD && got.len() < total {
            stream.write_all(&[0u8; 4]).map_err(io)?;
        }
    }
    Ok(got)
}

// ---------------------------------------------------------------------------
// Kernel flows across a reload (`_getflows`).
// ---------------------------------------------------------------------------

/// Tag of a flow record of the first layout (`SHUNTFL1`), which a predecessor
/// built before 2026-12-07 sends: read, its `read_before` estimated from the
/// totals. A peer speaking any other layout is refused instead of misread.
const FLOW_MAGIC_V1: u64 = 0x5348_554e_5446_4c31;
/// Tag of every flow record sent now (`SHUNTFL2`): the first layout and two
/// words more, each source's bytes read before insertion.
const FLOW_MAGIC: u64 = 0x5348_554e_5446_4c32;
/// 64-bit words of a record of the first layout, the first words of every record.
const RECORD_WORDS_V1: usize = 35;
/// 64-bit words of one flow record (see [`encode_flow`]).
const RECORD_WORDS: usize = RECORD_WORDS_V1 + 2;
/// Bytes of one flow record.
const RECORD_LEN: usize = RECORD_WORDS * 8;
/// Longest proxy or server name carried with a flow.
const NAME_MAX: usize = 1024;
/// Longest passed-but-unwritten tail of one direction (the pass buffer is smaller).
const UNSENT_MAX: usize = 4 << 20;
/// Most flows a successor accepts (two SOCKHASH entries per flow).
const MAX_FLOWS: usize = proxy_common::SOCKHASH_CAPACITY as usize / 2;
/// How long the old process waits for its kernel flows to quiesce.
const QUIESCE_LIMIT: Duration = Duration::from_secs(3);
/// Count sent instead of flows when the two processes do not share the maps.
const MAPS_DIFFER: i32 = -1;
/// The successor's word once it is ready to serve (`SHCM`): it takes over.
const COMMIT: u32 = 0x5348_434d;
/// The old process's answer to [`COMMIT`] (`SHAK`): the take-over holds.
const COMMIT_ACK: u32 = 0x5348_414b;
/// First word of the answer to `_getflows ID commit` (`SHV2`): this old
/// process waits for the commit. Never a valid flow count.
const COMMIT_PROTO: i32 = 0x5348_5632;
/// How long the old process waits for the commit after sending its flows.
/// The successor sends it as soon as the last flow arrived (every step that
/// could fail ran before it asked), so this only bounds a successor that
/// hangs or died: the old process holds its accepts that long at most.
const COMMIT_WAIT: Duration = Duration::from_secs(5);

/// A kernel flow received from the predecessor.
#[derive(Debug)]
pub struct AdoptedFlow {
    pub handed: crate::handoff::sockmap::Handed,
    /// Frontend, backend and server names in the predecessor's configuration.
    pub names: Option<[String; 3]>,
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_ne_bytes());
}

/// One flow's record (fixed size, sent with both sockets) and its trailer
/// (both directions' unsent bytes, then the three names).
///
/// Words: magic; both cookies; client and server baselines (acked, queued,
/// received); redirected bytes accounted per source; per direction
/// (client-to-server first) written, read, passed_ack, redirect_limit,
/// ready, paused, kicks, done, unsent length; the flow's byte totals;
/// whether names follow and their three lengths; then the bytes of each source
/// (client, server) read before insertion (`Snapshot::read_before`).
fn encode_flow(
    h: &crate::handoff::sockmap::Handed,
    names: Option<[&str; 3]>,
) -> (Vec<u8>, Vec<u8>) {
    let s = &h.snap;
    let mut rec = Vec::with_capacity(RECORD_LEN);
    let mut trailer = Vec::new();
    for v in [FLOW_MAGIC, s.cookie_client, s.cookie_server] {
        put_u64(&mut rec, v);
    }
    for b in [s.base_client, s.base_server] {
        for v in [b.acked, b.queued, b.received] {
            put_u64(&mut rec, v);
        }
    }
    for v in s.seen {
        put_u64(&mut rec, v);
    }
    for d in &s.dirs {
        for v in [
            d.written,
            d.read,
            d.ctl.passed_ack,
            d.ctl.redirect_limit,
            u64::from(d.ctl.ready),
            u64::from(d.ctl.paused),
            d.kicks,
            u64::from(d.done),
            d.unsent.len() as u64,
        ] {
            put_u64(&mut rec, v);
        }
        trailer.extend_from_slice(&d.unsent);
    }
    put_u64(&mut rec, h.to_server);
    put_u64(&mut rec, h.to_client);
    put_u64(&mut rec, u64::from(names.is_some()));
    let names = names.unwrap_or(["", "", ""]);
    for n in names {
        let n = &n.as_bytes()[..n.len().min(NAME_MAX)];
        put_u64(&mut rec, n.len() as u64);
        trailer.extend_from_slice(n);
    }
    for v in s.read_before {
        put_u64(&mut rec, v);
    }
    debug_assert_eq!(rec.len(), RECORD_LEN);
    (rec, trailer)
}

/// A decoded record: the snapshot, totals and the trailer's layout.
struct Record {
    snap: crate::handoff::sockmap::Snapshot,
    to_server: u64,
    to_client: u64,
    unsent: [usize; 2],
    names: Option<[usize; 3]>,
}

fn decode_record(rec: &[u8]) -> Result<Record, String> {
    use crate::handoff::sockmap::{DirSnapshot, Snapshot};
    use crate::sys::sock::SendState;
    let words: Vec<u64> = rec
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_ne_bytes(b)
        })
        .collect();
    let v1 = match (words.first(), words.len()) {
        (Some(&FLOW_MAGIC), RECORD_WORDS) => false,
        (Some(&FLOW_MAGIC_V1), RECORD_WORDS_V1) => true,
        _ => return Err("not a shunt flow record".into()),
    };
    let mut w = words[1..].iter().copied();
    let mut next = || w.next().unwrap_or(0);
    let (cookie_client, cookie_server) = (next(), next());
    let mut base = || SendState {
        acked: next(),
        queued: next(),
        received: next(),
    };
    let (base_client, base_server) = (base(), base());
    let seen = [next(), next()];
    let mut unsent = [0usize; 2];
    let mut dir = |i: usize| -> Result<DirSnapshot, String> {
        let d = DirSnapshot {
            written: next(),
            read: next(),
            ctl: proxy_common::FlowCtl {
                passed_ack: next(),
                redirect_limit: next(),
                ready: u32::try_from(next()).map_err(|_| "bad ready flag")?,
                paused: u32::try_from(next()).map_err(|_| "bad paused flag")?,
            },
            kicks: next(),
            done: next() != 0,
            unsent: Vec::new(),
        };
        unsent[i] = usize::try_from(next())
            .ok()
            .filter(|n| *n <= UNSENT_MAX)
            .ok_or("unsent bytes over the bound")?;
        Ok(d)
    };
    let dirs = [dir(0)?, dir(1)?];
    let (to_server, to_client) = (next(), next());
    let has_names = next() != 0;
    let mut lens = [0usize; 3];
    for l in &mut lens {
        *l = usize::try_from(next())
            .ok()
            .filter(|n| *n <= NAME_MAX)
            .ok_or("name over the bound")?;
    }
    let read_before = if v1 {
        // Not carried: what the flow forwarded less what went through the
        // verdict (redirected, and passed bytes written), short by what was
        // read and never forwarded (a PROXY header: the count check may warn).
        [0, 1].map(|i| {
            let written = dirs[i].read.saturating_sub(unsent[i] as u64);
            [to_server, to_client][i].saturating_sub(seen[i] + written)
        })
    } else {
        [next(), next()]
    };
    Ok(Record {
        snap: Snapshot {
            cookie_client,
            cookie_server,
            base_client,
            base_server,
            seen,
            dirs,
            read_before,
        },
        to_server,
        to_client,
        unsent,
        names: has_names.then_some(lens),
    })
}

/// Serve `_getflows ID` on `conn` (a CLI connection of a socket with
/// `expose-fd listeners`) for a successor whose SOCKHASH has id `ID` (`-`:
/// it has no BPF): the take-over, in two phases.
///
/// 1. Hold accepting (listeners stay open: clients wait in their queues),
///    quiesce every kernel flow when the maps are shared, send each with its
///    two sockets (or [`MAPS_DIFFER`]: the kernel flows stay here).
/// 2. Wait at most [`COMMIT_WAIT`] for the successor's [`COMMIT`], which it
///    sends once it is ready to serve. On it: acknowledge ([`COMMIT_ACK`]),
///    drop our copies of the sent flows, mark the process handed over and
///    soft-stop. On anything else (the successor failed to start, died,
///    timed out): take the flows back from the same snapshots, release the
///    accept hold, and go on as if nothing had been asked.
pub async fn serve_getflows(
    state: &std::sync::Arc<crate::runtime::Runtime>,
    conn: BorrowedFd<'_>,
    arg: Option<&str>,
    commit: bool,
) -> std::io::Result<usize> {
    let kernel = state.forwarding.kernel.as_deref();
    let ours = kernel.and_then(|k| k.bpf().sockhash_id());
    let theirs = arg.and_then(|a| a.parse::<u32>().ok());
    set_blocking_with_timeouts(conn)?;
    let mut stream = UnixStream::from(conn.try_clone_to_owned()?);
    if !commit {
        return serve_getflows_v1(state, &mut stream, ours, theirs).await;
    }
    stream.write_all(&COMMIT_PROTO.to_ne_bytes())?;
    state.handover.set_handing_over(true);
    // No new flow starts here while the successor decides (the accept loops
    // wait, their sockets open); ours to release if it does not commit.
    state.admission.hold_accepting(true);
    let shared = ours.is_some() && ours == theirs;
    let flows = match kernel {
        Some(k) if shared => k.handover().collect(QUIESCE_LIMIT).await,
        _ => {
            if ours.is_some() {
                tracing::warn!(
                    ?ours,
                    ?theirs,
                    "_getflows: the new process does not share this process's BPF maps; kernel flows stay here"
                );
            }
            Vec::new()
        }
    };
    let sent = if shared {
        send_flows(state, &mut stream, &flows)
    } else {
        stream.write_all(&MAPS_DIFFER.to_ne_bytes())
    };
    let committed = match sent {
        Ok(()) => await_commit(&stream).await,
        Err(e) => {
            tracing::warn!(error = %e, flows = flows.len(), "_getflows: transfer failed");
            false
        }
    };
    let n = flows.len();
    if committed {
        // Our copies close; the successor's descriptors hold the sockets.
        drop(flows);
        state.handover.mark_handed_over();
        if let Err(e) = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::SIGUSR1) {
            tracing::warn!(error = %e, "_getflows: cannot start the soft stop");
        }
    } else {
        tracing::warn!(
            flows = n,
            "the new process did not commit its take-over: this process goes on serving, with its kernel flows"
        );
        take_back(state, flows);
        state.admission.hold_accepting(false);
    }
    state.handover.set_handing_over(false);
    if committed {
        Ok(n)
    } else {
        Err(std::io::Error::other("the new process did not commit"))
    }
}

/// Continue here the collected flows of a hand-over that did not happen, in
/// a new hand-over generation (a later request reaches them again).
fn take_back(
    state: &std::sync::Arc<crate::runtime::Runtime>,
    flows: Vec<crate::handoff::sockmap::Handed>,
) {
    if let Some(k) = &state.forwarding.kernel {
        k.handover().reopen();
    }
    for handed in flows {
        spawn_adopted(
            state,
            AdoptedFlow {
                names: None,
                handed,
            },
        );
    }
}

/// `_getflows ID` from a successor of the first protocol (no commit): the
/// flows are its own once sent, so the soft stop starts first, as that
/// protocol did. Kept so that an upgrade from such a version to this one,
/// and back, never drops a kernel flow.
async fn serve_getflows_v1(
    state: &std::sync::Arc<crate::runtime::Runtime>,
    stream: &mut UnixStream,
    ours: Option<u32>,
    theirs: Option<u32>,
) -> std::io::Result<usize> {
    let kernel = match &state.forwarding.kernel {
        Some(k) if ours.is_some() && ours == theirs => k,
        _ => {
            stream.write_all(&MAPS_DIFFER.to_ne_bytes())?;
            return Ok(0);
        }
    };
    state.handover.set_handing_over(true);
    if let Err(e) = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::SIGUSR1) {
        tracing::warn!(error = %e, "_getflows: cannot start the soft stop");
    }
    let flows = kernel.handover().collect(QUIESCE_LIMIT).await;
    let result = match send_flows(state, stream, &flows) {
        Ok(()) => {
            state.handover.mark_handed_over();
            Ok(flows.len())
        }
        Err(e) => {
            take_back(state, flows);
            Err(e)
        }
    };
    state.handover.set_handing_over(false);
    result
}

/// Wait (without blocking the worker) for the successor's [`COMMIT`] and
/// acknowledge it. True only when both went through: from then on the
/// successor owns what it was sent.
async fn await_commit(stream: &UnixStream) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let dup = stream.try_clone()?;
        dup.set_nonblocking(true)?;
        let mut s = tokio::net::UnixStream::from_std(dup)?;
        let mut word = [0u8; 4];
        s.read_exact(&mut word).await?;
        if u32::from_ne_bytes(word) != COMMIT {
            return Err(std::io::Error::other("not a commit"));
        }
        s.write_all(&COMMIT_ACK.to_ne_bytes()).await?;
        s.flush().await
    };
    match tokio::time::timeout(COMMIT_WAIT, attempt).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "_getflows: no commit from the new process");
            false
        }
        Err(_) => {
            tracing::warn!(
                wait = ?COMMIT_WAIT,
                "_getflows: the new process did not commit in time"
            );
            false
        }
    }
}

fn send_flows(
    state: &crate::runtime::Runtime,
    stream: &mut UnixStream,
    flows: &[crate::handoff::sockmap::Handed],
) -> std::io::Result<()> {
    let total = i32::try_from(flows.len()).unwrap_or(i32::MAX);
    stream.write_all(&total.to_ne_bytes())?;
    let cfg = &state.config;
    for f in flows {
        let names = f.route.and_then(|r| {
            let fe = cfg.frontends.get(r.fe)?;
            let be = cfg.backends.get(r.be)?;
            let srv = be.servers.get(r.srv)?;
            Some([fe.name.as_str(), be.name.as_str(), srv.name.as_str()])
        });
        let (rec, trailer) = encode_flow(f, names);
        let raw = [f.client.as_raw_fd(), f.server.as_raw_fd()];
        let iov = [std::io::IoSlice::new(&rec)];
        let cmsg = [ControlMessage::ScmRights(&raw)];
        let sent = sendmsg::<()>(stream.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
            .map_err(std::io::Error::from)?;
        // The descriptors went with the first byte; the rest is plain data.
        stream.write_all(&rec[sent..])?;
        stream.write_all(&trailer)?;
    }
    stream.flush()
}

/// Connect to the old process's stats socket at `path` (for [`take_over`]).
pub fn connect(path: &Path) -> Result<UnixStream, ReloadError> {
    let stream = UnixStream::connect(path).map_err(|source| ReloadError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    set_blocking_with_timeouts(stream.as_fd()).map_err(|source| ReloadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(stream)
}

/// The successor's side of the take-over, run once every start-up step that
/// can fail is behind it: ask the old process (`stream`, from [`connect`] to
/// `path`) for its kernel flows (`_getflows`, with this process's SOCKHASH
/// id, `-` without BPF), receive them, commit and wait for the
/// acknowledgement. Returns the flows this process now owns: all of them
/// once the old process acknowledged; none when it kept them (it answered
/// that the maps differ, or it took them back for want of a timely commit).
/// A transfer that breaks before the commit is an error: the old process
/// takes its flows back and goes on serving, and this process must exit.
pub fn take_over(
    mut stream: UnixStream,
    path: &Path,
    sockhash_id: Option<u32>,
) -> Result<Vec<AdoptedFlow>, ReloadError> {
    let io = |source: std::io::Error| ReloadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let proto = |reason: String| ReloadError::Protocol {
        path: path.to_path_buf(),
        reason,
    };
    let id = sockhash_id.map_or_else(|| "-".to_string(), |i| i.to_string());
    stream
        .write_all(format!("_getflows {id} commit\n").as_bytes())
        .map_err(io)?;
    let mut word = [0u8; 4];
    if let Err(e) = stream.read_exact(&mut word) {
        tracing::warn!(error = %e, "the old process answered nothing to _getflows: its kernel flows stay with it");
        return Ok(Vec::new());
    }
    // An old process of the first protocol answers the count at once and
    // gives its flows away as it sends them: no commit to make.
    let two_phase = i32::from_ne_bytes(word) == COMMIT_PROTO;
    if two_phase {
        stream.read_exact(&mut word).map_err(io)?;
    }
    let count = i32::from_ne_bytes(word);
    let mut got = Vec::new();
    if count == MAPS_DIFFER {
        if sockhash_id.is_some() {
            tracing::warn!(
                "the old process does not share our BPF maps: its kernel flows stay with it"
            );
        }
    } else {
        let total = usize::try_from(count)
            .ok()
            .filter(|n| *n <= MAX_FLOWS)
            .ok_or_else(|| {
                proto(format!(
                    "invalid flow count {count} (an old process without _getflows?)"
                ))
            })?;
        got.reserve(total);
        for _ in 0..total {
            got.push(recv_flow(&mut stream).map_err(|e| match e {
                FlowRecvError::Io(e) => io(e),
                FlowRecvError::Proto(r) => proto(r),
            })?);
        }
    }
    if !two_phase {
        return Ok(got);
    }
    let old_pid = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .ok()
        .map(|c| c.pid());
    let acked = stream
        .write_all(&COMMIT.to_ne_bytes())
        .and_then(|()| {
            let mut word = [0u8; 4];
            stream.read_exact(&mut word).map(|()| word)
        })
        .map(u32::from_ne_bytes);
    match acked {
        Ok(COMMIT_ACK) => Ok(got),
        other => {
            // Without the acknowledgement the old process keeps the flows,
            // unless it is gone: then our descriptors are their only ones.
            let alive = old_pid.is_some_and(|p| {
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None).is_ok()
            });
            if alive || got.is_empty() {
                tracing::warn!(
                    answer = ?other,
                    flows = got.len(),
                    "the old process did not acknowledge the take-over: its kernel flows stay with it"
                );
                Ok(Vec::new())
            } else {
                tracing::warn!(
                    flows = got.len(),
                    "the old process exited during the take-over: its kernel flows go on here"
                );
                Ok(got)
            }
        }
    }
}

enum FlowRecvError {
    Io(std::io::Error),
    Proto(String),
}

fn recv_flow(stream: &mut UnixStream) -> Result<AdoptedFlow, FlowRecvError> {
    use crate::handoff::sockmap::Handed;
    let mut rec = vec![0u8; RECORD_LEN];
    let mut have = 0usize;
    let mut fds: Vec<OwnedFd> = Vec::new();
    // The first layout's length first (a prefix of the current one): the
    // magic then tells whether the record goes on.
    while have < RECORD_WORDS_V1 * 8 {
        let mut cmsg_buf = nix::cmsg_space!([RawFd; 2]);
        let mut iov = [std::io::IoSliceMut::new(
            &mut rec[have..RECORD_WORDS_V1 * 8],
        )];
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_buf),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| FlowRecvError::Io(e.into()))?;
        for c in msg.cmsgs().map_err(|e| FlowRecvError::Io(e.into()))? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for fd in raw {
                    // SAFETY: `fd` was just installed in this process by the
                    // kernel for this SCM_RIGHTS message; nothing else owns it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
            return Err(FlowRecvError::Proto(
                "descriptors truncated (MSG_CTRUNC)".into(),
            ));
        }
        if msg.bytes == 0 {
            return Err(FlowRecvError::Proto(
                "connection closed inside a flow record".into(),
            ));
        }
        have += msg.bytes;
    }
    // Only the current layout goes on; any other tag is refused below.
    if rec[..8] == FLOW_MAGIC.to_ne_bytes() {
        stream
            .read_exact(&mut rec[RECORD_WORDS_V1 * 8..])
            .map_err(FlowRecvError::Io)?;
    } else {
        rec.truncate(RECORD_WORDS_V1 * 8);
    }
    let r = decode_record(&rec).map_err(FlowRecvError::Proto)?;
    if fds.len() != 2 {
        return Err(FlowRecvError::Proto(format!(
            "a flow came with {} descriptors instead of 2",
            fds.len()
        )));
    }
    let mut snap = r.snap;
    for (d, n) in snap.dirs.iter_mut().zip(r.unsent) {
        d.unsent = vec![0u8; n];
        stream
            .read_exact(&mut d.unsent)
            .map_err(FlowRecvError::Io)?;
    }
    let names = match r.names {
        Some(lens) => {
            let mut out: [String; 3] = Default::default();
            for (o, n) in out.iter_mut().zip(lens) {
                let mut b = vec![0u8; n];
                stream.read_exact(&mut b).map_err(FlowRecvError::Io)?;
                *o = String::from_utf8_lossy(&b).into_owned();
            }
            Some(out)
        }
        None => None,
    };
    let server = fds
        .pop()
        .ok_or_else(|| FlowRecvError::Proto("no server socket".into()))?;
    let client = fds
        .pop()
        .ok_or_else(|| FlowRecvError::Proto("no client socket".into()))?;
    Ok(AdoptedFlow {
        handed: Handed {
            snap,
            client,
            server,
            to_server: r.to_server,
            to_client: r.to_client,
            route: None,
        },
        names,
    })
}

/// The route of an adopted flow in this process's configuration: by the
/// names the predecessor sent, else (a flow this process handed over and
/// took back) as it was.
fn route_of(
    config: &crate::config::Config,
    flow: &AdoptedFlow,
) -> Option<crate::handoff::FlowRoute> {
    let Some([fe, be, srv]) = &flow.names else {
        return flow.handed.route;
    };
    let fe = config.frontends.iter().position(|f| &f.name == fe)?;
    let bi = config.backends.iter().position(|b| &b.name == be)?;
    let srv = config.backends[bi]
        .servers
        .iter()
        .position(|s| &s.name == srv)?;
    Some(crate::handoff::FlowRoute { fe, be: bi, srv })
}

/// Live counting of an adopted flow (frontend, backend, server when known).
struct AdoptedMeter<'a> {
    ctrs: Option<[&'a crate::stats::Counters; 3]>,
    route: Option<crate::handoff::FlowRoute>,
}

impl crate::handoff::Meter for AdoptedMeter<'_> {
    fn to_server(&self, n: u64) {
        for c in self.ctrs.iter().flatten() {
            c.add_in(n);
        }
    }
    fn to_client(&self, n: u64) {
        for c in self.ctrs.iter().flatten() {
            c.add_out(n);
        }
    }
    fn route(&self) -> Option<crate::handoff::FlowRoute> {
        self.route
    }
}

/// Keeps the `scur` gauges of an adopted flow open while alive.
struct Gauges<'a>(Option<[&'a crate::stats::Counters; 3]>);

impl Drop for Gauges<'_> {
    fn drop(&mut self) {
        for c in self.0.iter().flatten() {
            c.close();
        }
    }
}

/// Run an adopted kernel flow on the current worker: registered for `show
/// sess` and `shutdown session`, counted in the global and proxy gauges and
/// in its frontend, backend and server counters, logged when it ends (its
/// log line's timers start at the adoption). It holds no server slot.
pub fn spawn_adopted(state: &std::sync::Arc<crate::runtime::Runtime>, flow: AdoptedFlow) {
    use crate::scheduler::{self, Class};
    use crate::stats::flows;
    let route = route_of(&state.config, &flow);
    let AdoptedFlow { handed, .. } = flow;
    let crate::handoff::sockmap::Handed {
        snap,
        client,
        server,
        to_server,
        to_client,
        ..
    } = handed;
    let client = std::net::TcpStream::from(client);
    let server = std::net::TcpStream::from(server);
    let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
    let peer = client.peer_addr().unwrap_or(unspecified);
    let reg = flows::Registered::new(route.map_or(0, |r| r.fe), peer, client.as_raw_fd());
    let id = reg.id();
    let server_addr = server.peer_addr().ok();
    let fd_server = server.as_raw_fd();
    flows::update(id, |f| {
        f.be = route.map(|r| r.be);
        f.srv = route.map(|r| r.srv);
        f.server = server_addr;
        f.fd_server = fd_server;
        f.mode = Some("sockmap");
    });
    let guard = crate::runtime::ConnGuard::new(state.clone());
    let st = state.clone();
    // A hard stop aborts the task through the registry, as an accepted flow's.
    let task = scheduler::spawn(Class::Normal, scheduler::FLOW_TASK, async move {
        let _guard = guard;
        let _reg = reg;
        run_adopted(
            st,
            client,
            server,
            peer,
            snap,
            (to_server, to_client),
            route,
        )
        .await;
    });
    flows::set_task(id, task);
}

async fn run_adopted(
    state: std::sync::Arc<crate::runtime::Runtime>,
    client: std::net::TcpStream,
    server: std::net::TcpStream,
    peer: SocketAddr,
    snap: crate::handoff::sockmap::Snapshot,
    prior: (u64, u64),
    route: Option<crate::handoff::FlowRoute>,
) {
    use crate::handoff::FlowTimeouts;
    let streams = client
        .set_nonblocking(true)
        .and_then(|()| server.set_nonblocking(true))
        .and_then(|()| {
            Ok((
                tokio::net::TcpStream::from_std(client)?,
                tokio::net::TcpStream::from_std(server)?,
            ))
        });
    let (client, server) = match streams {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot register an adopted flow's sockets: closing it");
            return;
        }
    };
    // Flows are only taken from a process sharing our maps, so loaded here.
    let Some(kernel) = &state.forwarding.kernel else {
        tracing::warn!("an adopted kernel flow reached a process without BPF: closing it");
        return;
    };
    let ctrs = route.and_then(|r| {
        Some([
            state.stats.frontends.get(r.fe)?,
            state.stats.backends.get(r.be)?,
            state.stats.servers.get(r.be)?.get(r.srv)?,
        ])
    });
    let mut log = route.map(|r| {
        let mut log = crate::log::FlowGuard::new(&state, r.fe, peer, client.local_addr().ok());
        log.routed(r.be);
        log.assigned(r.srv);
        log.connected(|| (server.peer_addr().ok(), server.local_addr().ok()));
        log
    });
    for c in ctrs.iter().flatten() {
        c.open();
    }
    let _gauges = Gauges(ctrs);
    let timeouts = match route {
        Some(r) => crate::runtime::flow::timeouts(
            &state.config.frontends[r.fe],
            &state.config.backends[r.be],
        ),
        None => FlowTimeouts::default(),
    };
    let meter = AdoptedMeter { ctrs, route };
    let out = crate::handoff::resume(kernel, client, server, snap, prior, timeouts, &meter).await;
    crate::runtime::flow::account_end(&state, &out, log.as_mut(), ctrs);
    tracing::debug!(%peer, to_server = out.to_server, to_client = out.to_client, end = ?out.end, "adopted flow closed");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::sockmap::{DirSnapshot, Handed, Snapshot};
    use crate::sys::sock::SendState;

    fn handed() -> Handed {
        let fd = || std::fs::File::open("/dev/null").expect("/dev/null").into();
        let dir = |w: u64, r: u64, unsent: &[u8]| DirSnapshot {
            written: w,
            read: r,
            ctl: proxy_common::FlowCtl {
                passed_ack: r,
                redirect_limit: 1 << 20,
                ready: 1,
                paused: 0,
            },
            kicks: 2,
            done: false,
            unsent: unsent.to_vec(),
        };
        Handed {
            snap: Snapshot {
                cookie_client: 11,
                cookie_server: 12,
                base_client: SendState {
                    acked: 1,
                    queued: 2,
                    received: 46,
                },
                base_server: SendState {
                    acked: 4,
                    queued: 5,
                    received: 6,
                },
                seen: [1000, 2000],
                dirs: [dir(7, 10, b"abc"), dir(0, 0, b"")],
                read_before: [46, 0],
            },
            client: fd(),
            server: fd(),
            to_server: 1012,
            to_client: 2000,
            route: None,
        }
    }

    #[test]
    fn a_flow_record_carries_what_was_read_before_insertion() {
        let h = handed();
        let (rec, trailer) = encode_flow(&h, Some(["fe", "be", "s1"]));
        assert_eq!(rec.len(), RECORD_LEN);
        let r = decode_record(&rec).expect("decode");
        let mut snap = r.snap;
        for (d, n) in snap.dirs.iter_mut().zip(r.unsent) {
            d.unsent = trailer[..n].to_vec();
        }
        assert_eq!(r.unsent, [3, 0]);
        assert_eq!(snap.dirs[0].unsent, b"abc");
        assert_eq!(snap, h.snap, "the snapshot, read_before included");
        assert_eq!((r.to_server, r.to_client), (h.to_server, h.to_client));
        assert_eq!(r.names, Some([2, 2, 2]));
    }

    /// A predecessor of the first layout: its record (without the two words)
    /// is read, and what went through userspace before insertion is estimated
    /// from the totals, short by what was never forwarded (here a 41-byte
    /// PROXY header: 46 read before, 5 of them forwarded).
    #[test]
    fn a_record_of_the_first_layout_is_read_with_the_estimate() {
        let h = handed();
        let (mut rec, _) = encode_flow(&h, None);
        rec.truncate(RECORD_WORDS_V1 * 8);
        rec[..8].copy_from_slice(&FLOW_MAGIC_V1.to_ne_bytes());
        let r = decode_record(&rec).expect("decode the first layout");
        // client: 1012 forwarded, 1000 redirected and 10 - 3 passed written.
        assert_eq!(r.snap.read_before, [5, 0]);
        assert_eq!(r.snap.seen, h.snap.seen);
        // Any other tag or length is refused.
        rec[..8].copy_from_slice(&FLOW_MAGIC.to_ne_bytes());
        assert!(decode_record(&rec).is_err());
        assert!(decode_record(&rec[..8]).is_err());
    }
}
