//! The userspace copy loop of one direction.
//!
//! Invariants: bytes are written in the order read, each exactly once;
//! partial writes resume where they stopped; the peer gets SHUT_WR only
//! after every byte read before EOF has been written.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::os::fd::AsFd;

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::flow::{Dir, DirError, Flow};
use super::BURST_BYTES;
use crate::sys::sock;

/// Userspace buffer per direction: large enough to amortise syscalls on a
/// bulk flow, and below loopback's MSS (65483 bytes with timestamps), so a
/// full buffer goes out as one segment. A 64 KiB buffer wrote one full
/// segment and a 53-byte tail per write, which TCP_NODELAY sends on its own:
/// twice the segments, twice the receive work. Measured 2026-12-03, iperf3
/// -P 1 through `nbthread 1` in copy mode, two runs each (Gbit/s, proxy
/// CPU s/GB): 8 KiB 15.0/0.38, 16 KiB 16.3/0.32, 32 KiB 17.0/0.31, 48 KiB
/// 16.9/0.30, 64 KiB 11.9/0.60; HAProxy (16 KiB buffers) 16.5/0.32. With
/// -P 4: 32 KiB 15.4/0.39, 64 KiB 10.4/0.76.
pub const COPY_BUF_SIZE: usize = 32 * 1024;

/// Waits until `s` is readable. `poll_read_ready` keeps the waker in the
/// socket's own reader slot, so the waiting future holds only the borrow
/// (tokio's `readable()` future is 152 bytes, in every idle flow twice). Each
/// socket of a flow has one reader and one writer: its two directions.
pub fn read_ready(s: &TcpStream) -> impl Future<Output = io::Result<()>> + use<'_> {
    std::future::poll_fn(move |cx| s.poll_read_ready(cx))
}

/// Waits until `s` is writable (the writer's slot; see [`read_ready`]).
pub fn write_ready(s: &TcpStream) -> impl Future<Output = io::Result<()>> + use<'_> {
    std::future::poll_fn(move |cx| s.poll_write_ready(cx))
}

/// Writes all of `data` to `to`, waiting for writability as needed.
///
/// Not an `async fn`: it would store its arguments twice in every flow's
/// future (see "Memory of an idle flow" in docs/architecture.md).
#[allow(clippy::manual_async_fn)]
pub fn write_all<'a, 'm>(
    flow: &'a Flow<'m>,
    dir: Dir,
    to: &'a TcpStream,
    mut data: &'a [u8],
) -> impl Future<Output = Result<(), DirError>> + use<'a, 'm> {
    async move {
        // Once only: after an EAGAIN, tokio's readiness decides.
        let mut eager = flow.nothing_written(dir.to);
        while !data.is_empty() {
            let r = if std::mem::take(&mut eager) {
                socket2::SockRef::from(to).send(data)
            } else {
                to.try_write(data)
            };
            match r {
                Ok(0) => return Err(DirError::new(dir.to, io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    data = &data[n..];
                    flow.wrote(dir.to, n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    write_ready(to)
                        .await
                        .map_err(|e| DirError::new(dir.to, e))?;
                }
                Err(e) => return Err(DirError::new(dir.to, e)),
            }
        }
        Ok(())
    }
}

/// Propagates EOF: SHUT_WR on `to`, and marks both sockets half-closed.
pub fn propagate_eof(flow: &Flow<'_>, dir: Dir, to: &impl AsFd) -> Result<(), DirError> {
    sock::shutdown_write(to.as_fd()).map_err(|e| DirError::new(dir.to, e))?;
    flow.shut(dir.to);
    Ok(())
}

/// EOF was read from `dir.from` after every earlier byte was written: the
/// peer `to` gets its FIN. When `from` was already half-closed, the other
/// direction has ended (it read `to`'s EOF and shut `from`), so the flow
/// closes both sockets as soon as this direction returns, and that close
/// sends `to` its FIN (its receive queue is empty: its EOF was read), as
/// HAProxy closes without a last shutdown: one syscall less per flow.
fn eof_read(flow: &Flow<'_>, dir: Dir, to: &TcpStream) -> Result<(), DirError> {
    let last = flow.half(dir.from);
    flow.shut(dir.from);
    if last {
        flow.shut(dir.to);
        return Ok(());
    }
    propagate_eof(flow, dir, to)
}

/// What one read of a copy direction got.
pub(super) enum Read {
    /// The peer's FIN.
    Eof,
    /// Bytes, and the read took less than it asked for.
    Dry(usize),
    /// Bytes that filled the buffer: more may be queued.
    More(usize),
}

/// One read of `from` into `buf`. A read that took less than `buf` emptied
/// the receive queue (`tcp_recvmsg` returns early only when the queue and
/// its backlog are empty), so the read that would follow only to meet
/// EAGAIN is skipped: tokio's read readiness is cleared here, as that
/// EAGAIN would have cleared it (HAProxy too stops at a short read). This
/// is as safe as the EAGAIN: readiness is cleared only if no event arrived
/// since it was observed (tokio's tick), and a segment arriving later
/// raises a new edge-triggered event; a FIN already seen stays ready
/// (tokio never clears a closed state).
pub(super) fn read_once(from: &TcpStream, buf: &mut [u8]) -> io::Result<Read> {
    let mut got = None;
    let r = from.try_io(Interest::READABLE, || {
        let n = std::io::Read::read(&mut &*socket2::SockRef::from(from), buf)?;
        if n > 0 && n < buf.len() {
            got = Some(n);
            // Clears the readiness observed before this read.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match (r, got) {
        (_, Some(n)) => Ok(Read::Dry(n)),
        (Ok(0), None) => Ok(Read::Eof),
        (Ok(n), None) => Ok(Read::More(n)),
        (Err(e), None) => Err(e),
    }
}

/// Wait, holding nothing, until `from` is readable; while a promotion is
/// asked for and the direction is dry, park first (the direction's future
/// may then be dropped here: see `Flow::park`).
///
/// Not an `async fn`: it would store its arguments twice in every flow's
/// future (see "Memory of an idle flow" in docs/architecture.md).
#[allow(clippy::manual_async_fn)]
pub fn wait_readable<'a, 'm>(
    flow: &'a Flow<'m>,
    dir: Dir,
    from: &'a TcpStream,
) -> impl Future<Output = Result<(), DirError>> + use<'a, 'm> {
    async move {
        while flow.must_park(dir.from) {
            // Parking and reading dry are rare (once per promotion): boxed, so
            // their states are not in every direction's future.
            Box::pin(flow.park(dir.from)).await;
        }
        flow.set_waiting(dir.from, true);
        let ready = read_ready(from).await;
        flow.set_waiting(dir.from, false);
        ready.map_err(|e| DirError::new(dir.from, e))
    }
}

/// What a read that must empty the receive queue asks for beyond what the
/// queue holds, for bytes arriving meanwhile.
const DRY_SLACK: usize = 64 * 1024;
/// Largest such read: above the kernel's largest receive buffer
/// (`tcp_rmem` max, 6 MiB by default), so one read always can.
const DRY_MAX: usize = 32 << 20;

/// One read of everything `from` holds (and write of it), so that the
/// receive queue is empty afterwards and a promotion can proceed (see
/// `Flow::must_park`): a read asked for more than the queue holds takes
/// every queued segment whole. The buffer is transient. True at EOF (then
/// propagated).
pub async fn read_dry(
    flow: &Flow<'_>,
    dir: Dir,
    from: &TcpStream,
    to: &TcpStream,
) -> Result<bool, DirError> {
    let queued = sock::inq(from.as_fd()).map_err(|e| DirError::new(dir.from, e))?;
    let want = (queued + DRY_SLACK).min(DRY_MAX);
    let mut buf = vec![0u8; want];
    match from.try_read(&mut buf) {
        Ok(0) => {
            flow.shut(dir.from);
            propagate_eof(flow, dir, to)?;
            Ok(true)
        }
        Ok(n) => {
            flow.read(dir.from, n, n < want);
            buf.truncate(n);
            write_all(flow, dir, to, &buf).await?;
            Ok(false)
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            flow.drained(dir.from);
            Ok(false)
        }
        Err(e) => Err(DirError::new(dir.from, e)),
    }
}

/// Free copy buffers a worker keeps for its flows' next reads.
const CACHED_BUFS: usize = 16;

thread_local! {
    /// Each worker's free copy buffers: a direction holds one only from a
    /// readable socket to the read that would block, so an idle flow holds
    /// none (HAProxy's buffers, taken when bytes move).
    static BUFS: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
}

/// A copy buffer borrowed from the worker's cache; given back on drop.
pub(super) struct Buf(Option<Box<[u8]>>);

impl Buf {
    pub(super) fn take() -> Self {
        let cached = BUFS.try_with(|b| b.borrow_mut().pop()).ok().flatten();
        Buf(Some(cached.unwrap_or_else(|| {
            vec![0u8; COPY_BUF_SIZE].into_boxed_slice()
        })))
    }
}

impl std::ops::Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.as_deref().unwrap_or_default()
    }
}

impl std::ops::DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().unwrap_or_default()
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Some(b) = self.0.take() {
            // At thread exit the cache may be gone; the buffer is freed then.
            let _ = BUFS.try_with(|c| {
                let mut c = c.borrow_mut();
                if c.len() < CACHED_BUFS {
                    c.push(b);
                }
            });
        }
    }
}

/// Copies `from` -> `to` until EOF (propagated; `Ok(true)`) or an error.
/// With `until_bulk`, returns `Ok(false)` once a read filled the buffer and
/// was written out, holding nothing (`auto` copies small messages and
/// splices bulk: see `handoff::Splicing::Auto`). Parks, holding nothing,
/// while a promotion is asked for.
///
/// Not an `async fn`: it would store its arguments twice in every flow's
/// future (see "Memory of an idle flow" in docs/architecture.md).
#[allow(clippy::manual_async_fn)]
pub fn run<'a, 'm>(
    flow: &'a Flow<'m>,
    dir: Dir,
    from: &'a TcpStream,
    to: &'a TcpStream,
    until_bulk: bool,
) -> impl Future<Output = Result<bool, DirError>> + use<'a, 'm> {
    async move {
        let mut burst = 0usize;
        loop {
            wait_readable(flow, dir, from).await?;
            let mut buf = Buf::take();
            loop {
                if flow.must_park(dir.from) {
                    break;
                }
                if flow.parking() {
                    // Not dry: read the whole queue at once (see `read_dry`).
                    drop(buf);
                    if Box::pin(read_dry(flow, dir, from, to)).await? {
                        return Ok(true);
                    }
                    break;
                }
                match read_once(from, &mut buf) {
                    Ok(Read::Eof) => {
                        eof_read(flow, dir, to)?;
                        return Ok(true);
                    }
                    Ok(Read::Dry(n)) => {
                        flow.read(dir.from, n, true);
                        write_all(flow, dir, to, &buf[..n]).await?;
                        burst = 0;
                        break;
                    }
                    Ok(Read::More(n)) => {
                        flow.read(dir.from, n, false);
                        write_all(flow, dir, to, &buf[..n]).await?;
                        if until_bulk {
                            return Ok(false);
                        }
                        burst += n;
                        if burst >= BURST_BYTES {
                            burst = 0;
                            drop(buf);
                            crate::scheduler::yield_now().await;
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        flow.drained(dir.from);
                        burst = 0;
                        break;
                    }
                    Err(e) => return Err(DirError::new(dir.from, e)),
                }
            }
        }
    }
}
