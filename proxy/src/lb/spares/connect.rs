//! A fresh server connection (a flow's own connect and a spare's alike), and what
//! its failure says: which side it came from and whether another attempt may help.
//!
//! Owns: [`connect`], [`ConnectOpts`] (what the configuration asks of a
//! server socket: `source`, `option srvtcpka`) and [`ConnectError`]. The retry loop (`session.rs`,
//! `retries`, `option redispatch`) asks [`ConnectError::retryable`], never the
//! errno itself. The classes are HAProxy's `SF_ERR_*` of `tcp_connect_server`.

use std::io;
use std::net::SocketAddr;
use std::os::fd::FromRawFd;
use std::time::Duration;

use crate::handoff::Origin;

/// Why a connect to a server failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The server refused, reset or could not be reached (HAProxy's
    /// `SF_ERR_SRVCL`).
    #[error("connect to {addr}: {source}")]
    Server { addr: SocketAddr, source: io::Error },
    /// `timeout connect` passed (`SF_ERR_SRVTO`).
    #[error("connect to {addr}: connect timeout after {after:?}")]
    Timeout { addr: SocketAddr, after: Duration },
    /// No local resource for the socket: file descriptors, memory, a free
    /// source port (`SF_ERR_RESOURCE`). They come back as flows end.
    #[error("no local resource to connect to {addr}: {source}")]
    Resource { addr: SocketAddr, source: io::Error },
    /// The socket could not be made or set up for another reason (an address
    /// family this host does not have, a refused socket option:
    /// `SF_ERR_INTERNAL`). It would fail the same way again.
    #[error("cannot set up a socket to {addr}: {source}")]
    Internal { addr: SocketAddr, source: io::Error },
}

impl ConnectError {
    /// Another attempt may succeed: every failure but an internal one (HAProxy
    /// retries all others, within `retries`, and aborts on `SF_ERR_INTERNAL`).
    pub fn retryable(&self) -> bool {
        !matches!(self, ConnectError::Internal { .. })
    }

    /// A timeout: `timeout connect`, or the kernel's own SYN retries running out
    /// without one (logged `s`, not `S`).
    pub fn timed_out(&self) -> bool {
        match self {
            ConnectError::Timeout { .. } => true,
            ConnectError::Server { source, .. } => source.kind() == io::ErrorKind::TimedOut,
            _ => false,
        }
    }

    /// Which side the failure came from: the server's, or shunt's own.
    pub fn origin(&self) -> Origin {
        match self {
            ConnectError::Server { .. } | ConnectError::Timeout { .. } => Origin::Server,
            ConnectError::Resource { .. } | ConnectError::Internal { .. } => Origin::Internal,
        }
    }

    /// Setting up the local socket failed with `e`.
    fn local(addr: SocketAddr, source: io::Error) -> Self {
        // HAProxy's resource errnos of socket() and connect().
        let resource = matches!(
            source.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EAGAIN)
                | Some(libc::EADDRINUSE | libc::EADDRNOTAVAIL)
        );
        if resource {
            ConnectError::Resource { addr, source }
        } else {
            ConnectError::Internal { addr, source }
        }
    }
}

/// What the configuration asks of a socket to one server, for every
/// connection to it: a flow's, a warm spare's and a health check's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnectOpts {
    /// `source ADDR[:PORT]`: bind there before connecting.
    pub source: Option<SocketAddr>,
    /// `option srvtcpka`: SO_KEEPALIVE.
    pub keepalive: bool,
}

impl ConnectOpts {
    /// The options of server `srv` of backend `be`.
    pub fn of(be: &crate::config::Backend, srv: &crate::config::Server) -> Self {
        Self {
            source: srv.source,
            keepalive: be.opts.srvtcpka,
        }
    }
}

/// A socket for a connection to `addr` with `opts` applied, not connected
/// yet. A `source` of the other address family than `addr` is refused by
/// the kernel's bind (an internal error: it would fail again).
pub fn socket(addr: SocketAddr, opts: ConnectOpts) -> io::Result<tokio::net::TcpSocket> {
    let sock = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }?;
    if opts.keepalive {
        sock.set_keepalive(true)?;
    }
    if let Some(src) = opts.source {
        // A fixed source port may be reused while its last connection sits in
        // TIME_WAIT (HAProxy sets the same flag on its outgoing sockets).
        if src.port() != 0 {
            sock.set_reuseaddr(true)?;
        }
        sock.bind(src)?;
    }
    Ok(sock)
}

/// A fresh connection to `addr` (TCP_NODELAY, `opts`), bounded by `timeout
/// connect`: a flow's own connect and a spare's alike.
///
/// To a near server (loopback, a host next to this one) the handshake has
/// usually completed inside `connect()` itself, which one `getpeername`
/// tells at once (it fails with ENOTCONN while the SYN is unanswered), so
/// the flow goes on without waiting a turn of the poller for the writable
/// event, as HAProxy learns it by sending at once. Otherwise it waits for
/// that event and reads SO_ERROR, as tokio's own connect does.
pub async fn connect(
    addr: SocketAddr,
    timeout: Option<Duration>,
    opts: ConnectOpts,
) -> Result<tokio::net::TcpStream, ConnectError> {
    let sock = socket(addr, opts).map_err(|e| ConnectError::local(addr, e))?;
    sock.set_nodelay(true)
        .map_err(|e| ConnectError::local(addr, e))?;
    let failed = |source: io::Error| match source.raw_os_error() {
        Some(libc::EADDRINUSE | libc::EADDRNOTAVAIL | libc::EAGAIN) => {
            ConnectError::Resource { addr, source }
        }
        _ => ConnectError::Server { addr, source },
    };
    // The socket is non-blocking (tokio made it so).
    let done = match socket2::SockRef::from(&sock).connect(&addr.into()) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => false,
        Err(e) => return Err(failed(e)),
    };
    // SAFETY: `into_raw_fd` gave up the descriptor, open and owned by nobody
    // else now; the std stream takes it over and closes it.
    let std =
        unsafe { std::net::TcpStream::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(sock)) };
    let done = done || std.peer_addr().is_ok();
    let stream = tokio::net::TcpStream::from_std(std).map_err(|e| ConnectError::local(addr, e))?;
    if done {
        return Ok(stream);
    }
    let established = async {
        // Not `writable()`: its future is 152 B, in the connect of every flow
        // (kept small: flows connecting at once hold it together).
        std::future::poll_fn(|cx| stream.poll_write_ready(cx)).await?;
        match stream.take_error()? {
            Some(e) => Err(e),
            None => Ok(()),
        }
    };
    match timeout {
        Some(after) => tokio::time::timeout(after, established)
            .await
            .map_err(|_| ConnectError::Timeout { addr, after })?,
        None => established.await,
    }
    .map_err(failed)?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 9))
    }

    /// A runtime of one thread, with the reactor and the timer.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn local_failures_are_resource_or_internal() {
        let err = |errno| ConnectError::local(addr(), io::Error::from_raw_os_error(errno));
        for errno in [
            libc::EMFILE,
            libc::ENFILE,
            libc::ENOBUFS,
            libc::EADDRNOTAVAIL,
        ] {
            let e = err(errno);
            assert!(matches!(e, ConnectError::Resource { .. }), "{e}");
            assert!(e.retryable() && !e.timed_out());
            assert_eq!(e.origin(), Origin::Internal);
        }
        let e = err(libc::EAFNOSUPPORT);
        assert!(matches!(e, ConnectError::Internal { .. }), "{e}");
        assert!(!e.retryable(), "it would fail the same way again");
        assert_eq!(e.origin(), Origin::Internal);
    }

    #[test]
    fn options_bind_the_source_and_set_keepalive() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let to = l.local_addr().expect("addr");
        let rt = runtime();
        let opts = ConnectOpts {
            source: Some(SocketAddr::from(([127, 0, 0, 2], 0))),
            keepalive: true,
        };
        let s = rt
            .block_on(connect(to, Some(Duration::from_secs(5)), opts))
            .expect("connect from 127.0.0.2");
        let (_, peer) = l.accept().expect("accept");
        assert_eq!(peer.ip(), opts.source.map(|a| a.ip()).expect("source"));
        assert!(socket2::SockRef::from(&s)
            .keepalive()
            .expect("SO_KEEPALIVE"));
        let plain = rt
            .block_on(connect(to, None, ConnectOpts::default()))
            .expect("connect");
        let (_, peer) = l.accept().expect("accept");
        assert_eq!(peer.ip(), std::net::Ipv4Addr::LOCALHOST);
        assert!(!socket2::SockRef::from(&plain)
            .keepalive()
            .expect("SO_KEEPALIVE"));
        // A source of the other family cannot be bound for this address.
        let v6 = ConnectOpts {
            source: Some("[::1]:0".parse().expect("v6")),
            keepalive: false,
        };
        let e = rt
            .block_on(connect(to, None, v6))
            .expect_err("v6 source for a v4 server");
        assert!(matches!(e, ConnectError::Internal { .. }), "{e}");
        assert!(!e.retryable());
    }

    #[test]
    fn a_loopback_connect_is_done_at_its_first_poll() {
        // The handshake completes inside connect() on loopback: the future is
        // ready at once, with no turn of the poller (tokio's TcpSocket::connect
        // is pending there until the writable event comes).
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let to = l.local_addr().expect("addr");
        let rt = runtime();
        let first = rt.block_on(async {
            let mut fut = std::pin::pin!(connect(to, None, ConnectOpts::default()));
            std::future::poll_fn(|cx| {
                std::task::Poll::Ready(std::future::Future::poll(fut.as_mut(), cx))
            })
            .await
        });
        let s = match first {
            std::task::Poll::Ready(r) => r.expect("connect"),
            std::task::Poll::Pending => panic!("the connect waited for the poller"),
        };
        let (_, peer) = l.accept().expect("accept");
        assert_eq!(s.local_addr().expect("local"), peer);
        assert_eq!(s.peer_addr().expect("peer"), to);
        assert!(s.nodelay().expect("TCP_NODELAY"));
    }

    /// The connect's room, inside every flow's boxed connect: flows that
    /// connect at once hold it together, and the idle bench's RSS per flow
    /// moved with it (3.17 KiB per flow in copy and `auto` at 328 B, as
    /// tokio's `TcpSocket::connect` gave it; 3.40 at 440 B with `writable()`'s
    /// future in it, 2026-12-04). Release and debug builds differ a little.
    const CONNECT_FUTURE_MAX: usize = 304;

    #[test]
    fn the_connect_future_stays_small() {
        let f = connect(addr(), Some(Duration::from_secs(1)), ConnectOpts::default());
        let n = std::mem::size_of_val(&f);
        eprintln!("connect future: {n} B");
        assert!(
            n <= CONNECT_FUTURE_MAX,
            "the connect future is {n} B, more than {CONNECT_FUTURE_MAX} B"
        );
    }

    #[test]
    fn a_refused_connect_is_the_servers_and_retryable() {
        // A port nobody listens on: bound, its address taken, then closed.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind a port");
        let rt = runtime();
        let e = rt
            .block_on(connect(
                closed,
                Some(Duration::from_secs(5)),
                ConnectOpts::default(),
            ))
            .expect_err("nothing listens there");
        assert!(matches!(e, ConnectError::Server { .. }), "{e}");
        assert!(e.retryable() && !e.timed_out());
        assert_eq!(e.origin(), Origin::Server);
        let t = ConnectError::Timeout {
            addr: closed,
            after: Duration::from_millis(5),
        };
        assert!(t.retryable() && t.timed_out());
        assert_eq!(t.origin(), Origin::Server);
    }
}
