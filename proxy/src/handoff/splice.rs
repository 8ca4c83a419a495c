//! The splice loop of one direction: socket -> pipe -> socket, zero copy.
//!
//! Invariants:
//! - `lease.pending` is exactly the number of bytes in the pipe.
//! - Read readiness is cleared only when a read-splice returns EAGAIN with
//!   an EMPTY pipe: with bytes in the pipe, EAGAIN may mean "pipe full" (the
//!   pipe counts pages, not bytes) while the socket still holds data.
//! - SPLICE_F_MORE is set on a write-splice only when the read that filled
//!   the pipe took >= 90% of its capacity (bulk). Whenever the loop is about
//!   to wait with the pipe drained after such a write, TCP_NODELAY is set
//!   again on the writer, which pushes the sub-MSS tail MSG_MORE held back:
//!   without it the tail waits for the zero-window probe (~200 ms).
//! - EOF is propagated (SHUT_WR) only once the pipe has drained.
//! - ENOSYS/EINVAL/EBADF from splice mean "this flow cannot splice": the
//!   loop exits with `Exit::Fallback` and the caller drains the pipe into
//!   userspace before copying, so no byte is lost.
//! - splice to a socket does not pass MSG_NOSIGNAL: a write to a reset peer
//!   raises SIGPIPE, which Rust programs ignore by default (the daemon must
//!   keep it ignored); the call then fails with EPIPE -> reset handling.

use std::future::Future;
use std::io;
use std::os::fd::AsFd;

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::copy::{propagate_eof, read_ready, wait_readable, write_ready};
use super::flow::{Dir, DirError, Flow};
use super::pool::Lease;
use super::BURST_BYTES;
use crate::sys::{pipe as sys_pipe, sock};

/// A read of fewer bytes than this into an empty pipe is a small message:
/// with `until_small`, the direction goes back to copying once it is
/// written and the socket is dry (copying a small message costs a read and
/// a write; splicing it two splices, a third to meet EAGAIN, and a pipe).
/// A bulk stream's reads on loopback are tens of KiB.
pub const SMALL_READ: usize = 4096;

/// A read filling at least MORE_NUM/MORE_DEN of the pipe marks bulk data:
/// its write-splice carries SPLICE_F_MORE (90%, as pasta does).
const MORE_NUM: usize = 9;
const MORE_DEN: usize = 10;

/// Largest chunk read from a pipe per `read(2)` while draining it for the
/// copy fallback (pipes hold at most `pool::MAX_PIPE_SIZE`).
const DRAIN_CHUNK: usize = 64 * 1024;

/// The size class of a direction's last read (one byte in every splicing
/// direction's future, not two flags).
#[derive(Clone, Copy, PartialEq, Eq)]
enum ReadSize {
    /// A small message into an empty pipe ([`SMALL_READ`]).
    Small,
    Mid,
    /// At least MORE_NUM/MORE_DEN of the pipe.
    Bulk,
}

/// How a splice loop ended without error.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    /// EOF read, pipe drained, SHUT_WR sent.
    Done,
    /// splice is not usable here: drain the pipe and copy instead.
    Fallback,
    /// A direction that splices only bulk (`until_small`) read a small
    /// message and wrote it out: the pipe is empty and back in the pool,
    /// the cork pushed; the caller copies until the next bulk read.
    Small,
    /// A promotion is asked for and the socket may hold a segment a splice
    /// read took in part: the pipe is empty, the cork pushed; the caller
    /// reads the queue dry (`copy::read_dry`) and splices on.
    ReadDry,
}

#[cfg(test)]
thread_local! {
    /// Test hook: once a direction has written this many bytes, its write
    /// splice fails with EINVAL (exercises drain-then-copy).
    pub static FAIL_WRITE_AFTER: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

#[cfg(test)]
fn injected_einval(written: u64) -> bool {
    FAIL_WRITE_AFTER.with(|c| matches!(c.get(), Some(n) if written >= n))
}

#[cfg(not(test))]
fn injected_einval(_written: u64) -> bool {
    false
}

fn must_fall_back(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS | libc::EINVAL | libc::EBADF)
    )
}

/// Splices `from` -> `to` through the leased pipe. The lease holds a pipe
/// only while bytes move: it is taken when the socket is readable and given
/// back whenever the loop waits with it empty; when the pool has none to
/// give, the loop exits with [`Exit::Fallback`]. Parks, holding nothing,
/// while a promotion is asked for.
///
/// Not an `async fn`: it would store its arguments twice in every flow's
/// future (see "Memory of an idle flow" in docs/architecture.md).
#[allow(clippy::manual_async_fn)]
pub fn run<'a, 'm, 'p>(
    flow: &'a Flow<'m>,
    dir: Dir,
    from: &'a TcpStream,
    to: &'a TcpStream,
    lease: &'a mut Lease<'p>,
    until_small: bool,
) -> impl Future<Output = Result<Exit, DirError>> + use<'a, 'm, 'p> {
    async move {
        let (from_fd, to_fd) = (from.as_fd(), to.as_fd());

        let mut eof = false;
        // At EOF: the other direction had already ended (see `copy::eof_read`),
        // so the flow's close sends `to` its FIN and no shutdown is needed.
        let mut last = false;
        // The last read's size: a bulk read (>= 90% of the pipe) marks the
        // bytes in the pipe for SPLICE_F_MORE; a small one may end splicing.
        let mut last_read = ReadSize::Mid;
        // A write-splice with SPLICE_F_MORE happened since the last push.
        let mut corked = false;
        let mut burst = 0usize;
        let mut written = 0u64;
        // The first write may skip tokio's readiness (`Flow::nothing_written`).
        let mut eager = true;
        loop {
            if flow.parking() && !flow.must_park(dir.from) && lease.pending == 0 && !eof {
                return Ok(fall_back(to, corked, Exit::ReadDry));
            }
            if lease.pipe.is_none() && !eof {
                // Nothing held: wait for bytes before taking a pipe.
                wait_readable(flow, dir, from).await?;
                if flow.must_park(dir.from) {
                    continue;
                }
                if !lease.fill() {
                    return Ok(fall_back(to, corked, Exit::Fallback));
                }
            }
            let reading = !eof && !flow.must_park(dir.from);
            let cap = lease.pipe.as_ref().map_or(0, |p| p.cap);
            let mut progressed = false;
            // EAGAIN with bytes in the pipe: readiness kept, don't wait on it.
            let mut read_ambiguous = false;
            // This read filled the pipe: a bulk transfer, which a larger pipe
            // moves cheaper (`Lease::grow`).
            let mut filled = false;

            if let Some(pipe) = lease.pipe.as_ref() {
                let (pipe_rd, pipe_wr) = (pipe.rd.as_fd(), pipe.wr.as_fd());
                if reading && lease.pending < cap {
                    let room = cap - lease.pending;
                    let held = lease.pending;
                    let r = from.try_io(Interest::READABLE, || {
                        match sys_pipe::splice(from_fd, pipe_wr, room, false) {
                            // Returning Ok keeps tokio's read readiness set.
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock && held > 0 => Ok(None),
                            other => other.map(Some),
                        }
                    });
                    match r {
                        Ok(Some(0)) => {
                            eof = true;
                            last = flow.half(dir.from);
                            flow.shut(dir.from);
                            progressed = true;
                        }
                        Ok(Some(n)) => {
                            last_read = if n >= cap * MORE_NUM / MORE_DEN {
                                ReadSize::Bulk
                            } else if held == 0 && n < SMALL_READ {
                                ReadSize::Small
                            } else {
                                ReadSize::Mid
                            };
                            lease.pending += n;
                            filled = lease.pending >= cap;
                            // A short splice may mean a full pipe, not an empty
                            // socket: only EAGAIN with an empty pipe is dry.
                            flow.read(dir.from, n, false);
                            burst += n;
                            progressed = true;
                        }
                        Ok(None) => read_ambiguous = true,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => flow.drained(dir.from),
                        Err(e) if must_fall_back(&e) => {
                            return Ok(fall_back(to, corked, Exit::Fallback))
                        }
                        Err(e) => return Err(DirError::new(dir.from, e)),
                    }
                }

                if lease.pending > 0 {
                    let len = lease.pending;
                    let more = last_read == ReadSize::Bulk;
                    let write = || {
                        if injected_einval(written) {
                            return Err(io::Error::from_raw_os_error(libc::EINVAL));
                        }
                        sys_pipe::splice(pipe_rd, to_fd, len, more)
                    };
                    // Once only: after an EAGAIN, tokio's readiness decides.
                    let r = if std::mem::take(&mut eager) && flow.nothing_written(dir.to) {
                        write()
                    } else {
                        to.try_io(Interest::WRITABLE, write)
                    };
                    match r {
                        Ok(0) => {
                            return Err(DirError::new(dir.to, io::ErrorKind::WriteZero.into()))
                        }
                        Ok(n) => {
                            lease.pending -= n;
                            written += n as u64;
                            flow.wrote(dir.to, n);
                            corked |= more;
                            progressed = true;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) if must_fall_back(&e) => {
                            return Ok(fall_back(to, corked, Exit::Fallback))
                        }
                        Err(e) => return Err(DirError::new(dir.to, e)),
                    }
                }
            }

            if filled {
                lease.grow();
            }
            if eof && lease.pending == 0 {
                if last {
                    // The close follows at once and pushes any corked tail
                    // with the FIN, as SHUT_WR would.
                    flow.shut(dir.to);
                    return Ok(Exit::Done);
                }
                // SHUT_WR pushes any corked tail itself.
                propagate_eof(flow, dir, to)?;
                return Ok(Exit::Done);
            }
            if progressed {
                if burst >= BURST_BYTES {
                    burst = 0;
                    crate::scheduler::yield_now().await;
                }
                continue;
            }
            burst = 0;

            // Leaving the loop to wait: push a MSG_MORE tail now (cork fix).
            if lease.pending == 0 && corked {
                sock::set_nodelay(to_fd).map_err(|e| DirError::new(dir.to, e))?;
                corked = false;
            }

            if lease.pending == 0 {
                // Nothing held: the pipe goes back to the pool, and the top of
                // the loop waits for bytes (or parks).
                lease.idle();
                if until_small && last_read == ReadSize::Small && !eof {
                    return Ok(Exit::Small);
                }
                continue;
            } else if eof || read_ambiguous || lease.pending >= cap || !reading {
                write_ready(to)
                    .await
                    .map_err(|e| DirError::new(dir.to, e))?;
            } else {
                tokio::select! {
                    biased;
                    r = read_ready(from) => r.map_err(|e| DirError::new(dir.from, e))?,
                    r = write_ready(to) => r.map_err(|e| DirError::new(dir.to, e))?,
                }
            }
        }
    }
}

/// Before leaving the loop for a copy (`exit`), release any tail MSG_MORE
/// may hold (the copy path might not write again for a while).
fn fall_back(to: &TcpStream, corked: bool, exit: Exit) -> Exit {
    if corked {
        if let Err(e) = sock::set_nodelay(to.as_fd()) {
            tracing::debug!(error = %e, "TCP_NODELAY push before copy fallback failed");
        }
    }
    exit
}

/// Reads everything left in the leased pipe into userspace (copy fallback).
/// Afterwards `lease.pending == 0`, so the pipe may be pooled again.
pub fn drain(lease: &mut Lease<'_>) -> io::Result<Vec<u8>> {
    let mut out = vec![0u8; lease.pending];
    let Some(pipe) = lease.pipe.as_ref() else {
        return Ok(Vec::new());
    };
    let mut got = 0;
    while got < out.len() {
        let end = out.len().min(got + DRAIN_CHUNK);
        match sys_pipe::read(pipe.rd.as_fd(), &mut out[got..end]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                got += n;
                lease.pending -= n;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}
