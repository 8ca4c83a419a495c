//! Forwarding of a flow with TLS on one side or both (a `bind ... ssl`
//! client, a `server ... ssl` server): the decrypted bytes are copied in
//! userspace, since without the kernel's `tls` ULP (kTLS) neither splice nor
//! the sockmap can see plaintext. A terminated client with a plain server
//! leaves rustls once its handshake is done: for the kernel where it has
//! kTLS (`super::ktls`), else for shunt's own records (`super::records`),
//! which decrypt in place where rustls copies; only a flow neither takes (a
//! suite outside their list, none of rustls' today) is copied here.
//!
//! Owns: [`Stream`], one side of such a flow (plain TCP, or a TLS stream over
//! it), and [`forward_tls`], the two copy directions driven by the same
//! driver as every userspace flow (`super::drive`: HAProxy's inactivity
//! timeouts, `*-fin` once half-closed) with the same accounting (`Flow`,
//! the `Meter`: decrypted payload bytes, as HAProxy counts at the stream
//! layer).
//! Must not: touch plain flows (they never come here, so their futures and
//! buffers are what they were) or spawn tasks.
//! Invariants: bytes are written in the order read, each exactly once (a
//! chunk is written whole, then flushed, before the next read; plaintext
//! sent from rustls' buffer leaves it only as far as the socket took it); a
//! side's EOF (a TLS `close_notify`, or a TCP FIN, which a TLS peer may send
//! without one) becomes a shutdown of the peer only after every byte read
//! from that side was written: `close_notify` then FIN on a TLS peer, FIN on
//! a plain one; the other direction goes on (half-close).
//!
//! The client-to-server direction of a terminated client with a plain
//! server (`bind ... ssl` in front of plain servers, the common case) sends
//! the plaintext straight from rustls' buffer ([`send_plaintext`]); every
//! other direction copies through a buffer taken from the worker's cache
//! (`copy`'s) once its source has bytes, and given back after each chunk.
//!
//! Memory: a TLS flow holds rustls' record buffers for as long as it lives;
//! a direction waiting for bytes holds no buffer of ours. Idle TLS flows
//! hold 11.4 KiB each, 19.4 when the server-to-client direction kept a 16
//! KiB buffer for the flow's life, HAProxy's 17.5 with OpenSSL (RSS over
//! 2000 flows, 2026-12-07). The flow's future is boxed by the caller, so
//! plain flows pay nothing for it.

use std::cell::RefCell;
use std::io;
use std::pin::{pin, Pin};
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncBufRead, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::flow::{Dir, DirError, Flow, CLIENT_TO_SERVER, SERVER_TO_CLIENT};
use super::{End, FlowTimeouts, Meter, Mode, Outcome, BURST_BYTES};
use crate::sys::sock;

/// One side of a flow that has TLS somewhere.
pub enum Stream {
    Plain(TcpStream),
    /// A client whose TLS shunt terminated (`bind ... ssl`), over
    /// [`super::ktls::Framed`] so that kTLS may take it after the handshake.
    Accepted(Box<super::ktls::Accepted>),
    /// A server shunt speaks TLS to (`server ... ssl`).
    Connected(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Stream {
    /// Ready when a read would not wait: bytes, the end or an error on a
    /// plain socket; plaintext or the end in rustls on a TLS one (which
    /// reads and decrypts records for it, into rustls' own buffers). No
    /// buffer of the caller's is needed to wait.
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Plain(s) => s.poll_read_ready(cx),
            Stream::Accepted(s) => Pin::new(&mut **s).poll_fill_buf(cx).map_ok(|_| ()),
            Stream::Connected(s) => Pin::new(&mut **s).poll_fill_buf(cx).map_ok(|_| ()),
        }
    }

    /// The TCP socket under the stream.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Accepted(s) => s.get_ref().0.tcp(),
            Stream::Connected(s) => s.get_ref().0,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Accepted(s) => Pin::new(&mut **s).poll_read(cx, buf),
            Stream::Connected(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Accepted(s) => Pin::new(&mut **s).poll_write(cx, buf),
            Stream::Connected(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Accepted(s) => Pin::new(&mut **s).poll_flush(cx),
            Stream::Connected(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Accepted(s) => Pin::new(&mut **s).poll_shutdown(cx),
            Stream::Connected(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

pin_project_lite::pin_project! {
    /// One of two futures, awaited at one point: the session's plain path
    /// and its TLS path (boxed) as one future, since a second await point
    /// would keep the flow's locals apart in its future for every plain
    /// flow too.
    #[project = EitherProj]
    pub enum Either<P, T> {
        Plain { #[pin] f: P },
        Tls { #[pin] f: T },
    }
}

/// What an [`Either`] gave: which path, and its output.
pub enum Which<A, B> {
    Plain(A),
    Tls(B),
}

impl<A> Which<A, A> {
    /// The output, whichever path gave it.
    pub fn merge(self) -> A {
        match self {
            Which::Plain(a) | Which::Tls(a) => a,
        }
    }
}

impl<P: std::future::Future, T: std::future::Future> std::future::Future for Either<P, T> {
    type Output = Which<P::Output, T::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            EitherProj::Plain { f } => f.poll(cx).map(Which::Plain),
            EitherProj::Tls { f } => f.poll(cx).map(Which::Tls),
        }
    }
}

/// Forward until both directions are finished; `Outcome::mode` is `Copy`
/// (the bytes went through userspace buffers, or kTLS's copy loops). Resets
/// and timeouts end the flow as on a plain one, a reset propagated as a
/// reset.
///
/// A terminated client with a plain server leaves rustls first
/// (`super::ktls::offload`): to the kernel when it has the flow's cipher
/// (`ktls`, probed at start), forwarded by `ktls::forward`, else to shunt's
/// records, forwarded by `records::forward`; one whose switch failed once
/// rustls' secrets were out ends here, closed.
///
/// `replay` is plaintext the content rules read off the client
/// (`crate::inspect`): the server gets it before anything else.
pub async fn forward_tls(
    client: Stream,
    server: Stream,
    replay: Vec<u8>,
    ktls: crate::sys::ktls::Ciphers,
    timeouts: FlowTimeouts,
    meter: &dyn Meter,
) -> Outcome {
    let (mut client, server) = match (client, server) {
        (Stream::Accepted(tls), Stream::Plain(server)) => {
            match super::ktls::offload(tls, ktls).await {
                super::ktls::Offload::Kernel(mut k) => {
                    k.pending = before(replay, k.pending);
                    tracing::debug!(cipher = k.cipher.name(), version = ?k.version, pending = k.pending.len(), "TLS flow handed to the kernel (kTLS)");
                    meter.ktls();
                    return super::ktls::forward(k, server, timeouts, meter).await;
                }
                super::ktls::Offload::Records(mut r) => {
                    r.pending = before(replay, std::mem::take(&mut r.pending));
                    tracing::debug!(
                        pending = r.pending.len(),
                        "TLS flow carried on by shunt's records"
                    );
                    return super::records::forward(*r, server, timeouts, meter).await;
                }
                super::ktls::Offload::Userspace(tls, why) => {
                    tracing::debug!(reason = why, "TLS flow stays in userspace");
                    (Stream::Accepted(tls), Stream::Plain(server))
                }
                super::ktls::Offload::Failed(e) => {
                    tracing::warn!(error = %e, "switch from rustls failed after the session keys left it: closing the flow");
                    return Outcome {
                        to_server: 0,
                        to_client: 0,
                        mode: Mode::Copy,
                        end: End::internal(e),
                        handed_over: false,
                        promoted: None,
                    };
                }
            }
        }
        other => other,
    };
    if let Stream::Accepted(t) = &mut client {
        t.get_mut().0.unframe();
    }
    super::nodelay(client.tcp(), server.tcp());
    let flow = Flow::new(meter);
    // One task polls both directions in turn, and each borrows a side only
    // within one poll, so the borrows never meet: each direction owns what
    // it uses (reads of one side, writes of the other).
    let client = RefCell::new(client);
    let server = RefCell::new(server);
    let end = {
        let c2s = pin!(async {
            // Written and flushed before the first read of the client.
            if !replay.is_empty() {
                let mut w = Half(&server);
                w.write_all(&replay)
                    .await
                    .map_err(|e| DirError::new(CLIENT_TO_SERVER.to, e))?;
                w.flush()
                    .await
                    .map_err(|e| DirError::new(CLIENT_TO_SERVER.to, e))?;
                flow.wrote(CLIENT_TO_SERVER.to, replay.len());
            }
            // Moved in and freed here: not held for the flow's life.
            drop(replay);
            from_client(&flow, &client, &server).await
        });
        let s2c = pin!(direction(&flow, SERVER_TO_CLIENT, &server, &client));
        super::drive_unpromoted(&flow, &timeouts, c2s, s2c).await
    };
    let client = client.into_inner();
    let server = server.into_inner();
    let reset_peer = match end {
        End::ClientReset => Some(server.tcp()),
        End::ServerReset => Some(client.tcp()),
        _ => None,
    };
    if let Some(s) = reset_peer {
        if let Err(e) = sock::set_linger_reset(std::os::fd::AsFd::as_fd(s)) {
            tracing::debug!(error = %e, "SO_LINGER reset failed");
        }
    }
    Outcome {
        to_server: flow.to_server(),
        to_client: flow.to_client(),
        mode: Mode::Copy,
        end,
        handed_over: false,
        promoted: None,
    }
}

/// `first`, then `then`, as one buffer.
fn before(mut first: Vec<u8>, then: Vec<u8>) -> Vec<u8> {
    if first.is_empty() {
        return then;
    }
    first.extend_from_slice(&then);
    first
}

/// One direction: wait until `from` has bytes, read a chunk into a buffer
/// taken from the worker's cache, write it whole and flush it (a TLS writer
/// holds records until flushed), give the buffer back; until EOF, then shut
/// the peer down. A direction waiting for bytes holds no buffer.
async fn direction(
    flow: &Flow<'_>,
    dir: Dir,
    from: &RefCell<Stream>,
    to: &RefCell<Stream>,
) -> Result<(), DirError> {
    let mut burst = 0usize;
    loop {
        match std::future::poll_fn(|cx| from.borrow_mut().poll_readable(cx)).await {
            Ok(()) => {}
            // A TLS peer that closed TCP without `close_notify`: for a TCP
            // proxy that is the end of its stream, as HAProxy takes it.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(DirError::new(dir.from, e)),
        }
        let mut buf = super::copy::Buf::take();
        let n = match Half(from).read(&mut buf).await {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => 0,
            Err(e) => return Err(DirError::new(dir.from, e)),
        };
        if n == 0 {
            break;
        }
        flow.touch(dir.from);
        let chunk = buf.get(..n).unwrap_or_default();
        let mut w = Half(to);
        w.write_all(chunk)
            .await
            .map_err(|e| DirError::new(dir.to, e))?;
        w.flush().await.map_err(|e| DirError::new(dir.to, e))?;
        drop(buf);
        flow.wrote(dir.to, n);
        burst += n;
        if burst >= BURST_BYTES {
            burst = 0;
            crate::scheduler::yield_now().await;
        }
    }
    flow.shut(dir.from);
    // Every byte read was written and flushed above: now close_notify (TLS)
    // and FIN.
    Half(to)
        .shutdown()
        .await
        .map_err(|e| DirError::new(dir.to, e))?;
    flow.shut(dir.to);
    Ok(())
}

/// One side of a TLS flow as one direction sees it: reads (or writes)
/// through a borrow that lasts one poll.
struct Half<'a>(&'a RefCell<Stream>);

impl AsyncRead for Half<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_read(cx, buf)
    }
}

impl AsyncWrite for Half<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_shutdown(cx)
    }
}

/// Client to server. A terminated client with a plain server sends the
/// plaintext rustls decrypted straight from rustls' buffer
/// ([`send_plaintext`]); anything else copies through a buffer
/// ([`direction`]).
async fn from_client(
    flow: &Flow<'_>,
    client: &RefCell<Stream>,
    server: &RefCell<Stream>,
) -> Result<(), DirError> {
    let dir = CLIENT_TO_SERVER;
    let direct = matches!(
        (&*client.borrow(), &*server.borrow()),
        (Stream::Accepted(_), Stream::Plain(_))
    );
    if !direct {
        return direction(flow, dir, client, server).await;
    }
    loop {
        match std::future::poll_fn(|cx| send_plaintext(flow, client, server, cx)).await? {
            Sent::Eof => break,
            Sent::Burst => crate::scheduler::yield_now().await,
        }
    }
    flow.shut(dir.from);
    // Every byte rustls decrypted was written: now FIN.
    let mut server = Half(server);
    server
        .shutdown()
        .await
        .map_err(|e| DirError::new(dir.to, e))?;
    flow.shut(dir.to);
    Ok(())
}

/// What [`send_plaintext`] stopped at.
enum Sent {
    /// The client's `close_notify`, or its FIN without one.
    Eof,
    /// [`BURST_BYTES`] were sent: the caller yields to the worker's other
    /// tasks.
    Burst,
}

/// Sends the plaintext rustls holds (reading records as needed) to the
/// plain server until the client's end or a burst. Each chunk is sent from
/// rustls' own buffer and consumed only as far as the server took it, so a
/// byte leaves once, in order; while the server cannot take more, the
/// plaintext waits in rustls, which reads no further record until then.
/// Sending straight from rustls spares a copy of every byte into a buffer
/// of our own: with it, `memmove` took 21-28 % of the proxy's CPU in the
/// slow bulk flows of `cargo xtask bench --scenarios tls` (perf,
/// 2026-12-07; see "two speeds" in BENCHMARKS.md), 2 % without it.
fn send_plaintext(
    flow: &Flow<'_>,
    client: &RefCell<Stream>,
    server: &RefCell<Stream>,
    cx: &mut Context<'_>,
) -> Poll<Result<Sent, DirError>> {
    let dir = CLIENT_TO_SERVER;
    let mut burst = 0usize;
    loop {
        let mut client = client.borrow_mut();
        let Stream::Accepted(tls) = &mut *client else {
            return Poll::Ready(Err(DirError::new(
                dir.from,
                io::Error::other("the client is no longer a TLS stream"),
            )));
        };
        let chunk = match ready!(Pin::new(&mut **tls).poll_fill_buf(cx)) {
            Ok(chunk) => chunk,
            // A TLS peer that closed TCP without `close_notify`: the end of
            // its stream, as in `direction`.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => &[],
            Err(e) => return Poll::Ready(Err(DirError::new(dir.from, e))),
        };
        if chunk.is_empty() {
            return Poll::Ready(Ok(Sent::Eof));
        }
        flow.touch(dir.from);
        let server = server.borrow();
        let to = server.tcp();
        let sent = match to.try_write(chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                drop(client);
                match to.poll_write_ready(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(())) => continue,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(DirError::new(dir.to, e))),
                }
            }
            Err(e) => return Poll::Ready(Err(DirError::new(dir.to, e))),
        };
        Pin::new(&mut **tls).consume(sent);
        flow.wrote(dir.to, sent);
        burst += sent;
        if burst >= BURST_BYTES {
            return Poll::Ready(Ok(Sent::Burst));
        }
    }
}
