//! Forwarding of a flow with TLS on one side or both (a `bind ... ssl`
//! client, a `server ... ssl` server): the decrypted bytes are copied in
//! userspace, since without the kernel's `tls` ULP (kTLS) neither splice nor
//! the sockmap can see plaintext. Where the kernel has kTLS, a terminated
//! client with a plain server is first offered to it (`super::ktls`), and
//! only a flow it does not take is copied here.
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
//! chunk is written whole, then flushed, before the next read); a side's EOF
//! (a TLS `close_notify`, or a TCP FIN, which a TLS peer may send without
//! one) becomes a shutdown of the peer only after every byte read from that
//! side was written: `close_notify` then FIN on a TLS peer, FIN on a plain
//! one; the other direction goes on (half-close).
//!
//! Memory: a TLS flow holds a copy buffer per direction and rustls' own
//! record buffers for as long as it lives (the TLS stream cannot give its
//! buffers back between reads as the plain copy path does); the flow's
//! future is boxed by the caller, so plain flows pay nothing for it.

use std::io;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::flow::{Dir, DirError, Flow, CLIENT_TO_SERVER, SERVER_TO_CLIENT};
use super::{Driven, End, FlowTimeouts, Meter, Mode, NoPace, Outcome, BURST_BYTES};
use crate::sys::sock;

/// Copy buffer per direction: one TLS record's plaintext (2^14 bytes, the
/// protocol's maximum), so a read takes a whole record when one is there.
pub const TLS_COPY_BUF: usize = 16 * 1024;

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
/// A terminated client with a plain server is first offered to the kernel
/// (`super::ktls`) when it has kTLS ciphers (`ktls`, probed at start); a
/// flow the kernel takes is forwarded by `ktls::forward`, and one whose
/// offload failed once rustls' secrets were out ends here, closed.
pub async fn forward_tls(
    client: Stream,
    server: Stream,
    ktls: crate::sys::ktls::Ciphers,
    timeouts: FlowTimeouts,
    meter: &dyn Meter,
) -> Outcome {
    let (mut client, server) = match (client, server) {
        (Stream::Accepted(tls), Stream::Plain(server)) if !ktls.is_empty() => {
            match super::ktls::offload(tls, ktls).await {
                super::ktls::Offload::Kernel(k) => {
                    tracing::debug!(cipher = k.cipher.name(), version = ?k.version, pending = k.pending.len(), "TLS flow handed to the kernel (kTLS)");
                    meter.ktls();
                    return super::ktls::forward(k, server, timeouts, meter).await;
                }
                super::ktls::Offload::Userspace(tls, why) => {
                    tracing::debug!(reason = why, "TLS flow stays in userspace");
                    (Stream::Accepted(tls), Stream::Plain(server))
                }
                super::ktls::Offload::Failed(e) => {
                    tracing::warn!(error = %e, "kTLS offload failed after the session keys left rustls: closing the flow");
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
    for s in [client.tcp(), server.tcp()] {
        if let Err(e) = sock::set_nodelay(std::os::fd::AsFd::as_fd(s)) {
            tracing::debug!(error = %e, "TCP_NODELAY at flow start failed");
        }
    }
    let flow = Flow::new(meter);
    // One task polls both halves of a stream in turn, so their lock is
    // never contended: it only lets each direction own what it uses.
    let (mut client_rd, mut client_wr) = tokio::io::split(client);
    let (mut server_rd, mut server_wr) = tokio::io::split(server);
    let end = {
        let c2s = pin!(direction(
            &flow,
            CLIENT_TO_SERVER,
            &mut client_rd,
            &mut server_wr
        ));
        let s2c = pin!(direction(
            &flow,
            SERVER_TO_CLIENT,
            &mut server_rd,
            &mut client_wr
        ));
        match super::drive(&flow, &timeouts, c2s, s2c, &NoPace).await {
            Driven::End(end) => end,
            // Only a promotion parks, and nothing promotes a TLS flow.
            Driven::Quiescent => End::Done,
        }
    };
    let client = client_rd.unsplit(client_wr);
    let server = server_rd.unsplit(server_wr);
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

/// One direction: read a chunk, write it whole and flush it (a TLS writer
/// holds records until flushed), until EOF; then shut the peer down.
async fn direction<R, W>(
    flow: &Flow<'_>,
    dir: Dir,
    from: &mut R,
    to: &mut W,
) -> Result<(), DirError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; TLS_COPY_BUF];
    let mut burst = 0usize;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(n) => n,
            // A TLS peer that closed TCP without `close_notify`: for a TCP
            // proxy that is the end of its stream, as HAProxy takes it.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => 0,
            Err(e) => return Err(DirError::new(dir.from, e)),
        };
        if n == 0 {
            break;
        }
        flow.touch(dir.from);
        let chunk = buf.get(..n).unwrap_or_default();
        to.write_all(chunk)
            .await
            .map_err(|e| DirError::new(dir.to, e))?;
        to.flush().await.map_err(|e| DirError::new(dir.to, e))?;
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
    to.shutdown().await.map_err(|e| DirError::new(dir.to, e))?;
    flow.shut(dir.to);
    Ok(())
}
