//! Seamless reload: the listening sockets handed from the running process to its
//! successor over the stats socket, as HAProxy's `-x PATH` / `expose-fd listeners`.
//!
//! Owns the process's exported listener descriptors (dups of every listening
//! socket, kept while the process runs and closed at soft or hard stop), the
//! server side of `_getsocks` and the client side the successor runs before it binds.
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

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

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
    #[error("fetching the listening sockets from '{path}': {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("fetching the listening sockets from '{path}': {reason}")]
    Protocol { path: PathBuf, reason: String },
}

/// Dups of the process's listening sockets, for `_getsocks`.
static EXPORTED: Mutex<Vec<OwnedFd>> = Mutex::new(Vec::new());
/// Set once a successor fetched the sockets: this process no longer speaks for
/// the service (no `STOPPING=1` to systemd when it stops).
static HANDED_OVER: AtomicBool = AtomicBool::new(false);

fn exported() -> std::sync::MutexGuard<'static, Vec<OwnedFd>> {
    EXPORTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Keep `fds` (dups of the listening sockets) for a successor.
pub fn export(fds: Vec<OwnedFd>) {
    *exported() = fds;
}

/// Close the exported dups (the process stops listening: at soft or hard stop the
/// sockets must close with the listeners, unless a successor holds them).
pub fn close_exported() {
    exported().clear();
}

/// Whether a successor took this process's listening sockets.
pub fn handed_over() -> bool {
    HANDED_OVER.load(Ordering::Relaxed)
}

fn set_blocking_with_timeouts(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let s = socket2::SockRef::from(&fd);
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(XFER_TIMEOUT))?;
    s.set_write_timeout(Some(XFER_TIMEOUT))
}

/// Serve `_getsocks` on `conn` (a CLI connection whose socket has `expose-fd
/// listeners`): send every exported descriptor. Blocking, each step bounded by
/// [`XFER_TIMEOUT`]; the caller closes the connection afterwards.
pub fn serve_getsocks(conn: BorrowedFd<'_>) -> std::io::Result<usize> {
    // Our own dups for the duration of the transfer: a concurrent stop may close
    // the exported ones meanwhile.
    let held: Vec<OwnedFd> = {
        let g = exported();
        g.iter()
            .map(|f| f.try_clone())
            .collect::<std::io::Result<_>>()?
    };
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
    HANDED_OVER.store(true, Ordering::Relaxed);
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
