//! The request's first bytes as `tcp-request content` rules and SNI routing
//! see them. From a plain client they are peeked (`MSG_PEEK`), never
//! consumed, so the forwarding sends them to the server as the client sent
//! them. From a client whose TLS shunt terminated (`bind ... ssl`) they are
//! the plaintext, as HAProxy's rules see its decrypted buffer: read out of
//! rustls, which cannot peek past one record, and given to the forwarding
//! ([`Inspect::into_replay`]) to be written to the server before anything
//! else.
//!
//! Owns one flow's inspection buffer, taken on the first look and freed with
//! the value (before the hand-off), and what is decoded from it once per new
//! bytes (the TLS hello's type, version and server name), so that evaluating
//! a condition against [`Inspect::request`] allocates nothing. A flow that
//! never inspects allocates nothing and holds one pointer.
//!
//! Must not: read a byte off a plain client's socket (but for a rejected
//! flow's, [`Inspect::discard`]), lose a byte read from a TLS client (all of
//! it is the replay), or wait past the deadline it is
//! given. Bounded by [`INSPECT_MAX`], HAProxy's `tune.bufsize`: once that
//! many bytes are queued the buffer is full and every fetch is final, as
//! HAProxy's `channel_full`.

use std::os::fd::AsFd;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::config::acl::{Probe, Request};
use crate::handoff::tls::Stream;
use crate::sni::{self, SniError};

/// Bytes a flow may hold for inspection: HAProxy's default `tune.bufsize`
/// (16 KiB), which also holds the largest ClientHello record with its header.
pub const INSPECT_MAX: usize = crate::sni::MAX_HELLO_BYTES;

/// Pause between two peeks while some bytes are queued: a socket with queued
/// bytes stays readable, so waiting for *more* without consuming them is a
/// poll. Only requests that arrive in pieces pay it, never past the deadline.
const REPEEK_PAUSE: Duration = Duration::from_millis(5);

/// One flow's inspection: nothing until the first look, then all of it on the
/// heap, so a flow that never inspects holds one pointer in its future.
#[derive(Debug, Default)]
pub struct Inspect(Option<Box<Peeked>>);

/// The peeked request bytes and what they decode to.
#[derive(Debug)]
struct Peeked {
    /// `INSPECT_MAX` long, `len` of it peeked.
    buf: Vec<u8>,
    len: usize,
    /// The client closed its side (or the socket failed): nothing more comes.
    closed: bool,
    /// The bytes were read off a TLS client (its plaintext), not peeked:
    /// the server must get them first.
    consumed: bool,
    hello_type: Probe<i64>,
    ssl_ver: Probe<i64>,
    /// The ClientHello's server name: `Pending` while the hello is incomplete.
    sni: Probe<String>,
}

impl Peeked {
    fn new(consumed: bool) -> Box<Peeked> {
        let mut p = Box::new(Peeked {
            buf: vec![0u8; INSPECT_MAX],
            len: 0,
            closed: false,
            consumed,
            hello_type: Probe::Pending,
            ssl_ver: Probe::Pending,
            sni: Probe::Pending,
        });
        // Nothing peeked yet is a prefix of everything: every TLS fetch is
        // pending, not absent.
        p.decode();
        p
    }

    fn can_grow(&self) -> bool {
        !self.closed && self.len < INSPECT_MAX
    }

    /// What the bytes say now, for the fetches that decode them.
    fn decode(&mut self) {
        let b = &self.buf[..self.len];
        self.hello_type = probe(sni::hello_type(b).map(i64::from));
        self.ssl_ver =
            probe(sni::hello_version(b).map(|v| (i64::from(v >> 8) << 16) | i64::from(v & 0xff)));
        if self.sni == Probe::Pending {
            self.sni = match sni::parse_sni(b) {
                Ok(Some(name)) => Probe::Found(name),
                Ok(None) | Err(SniError::Malformed) => Probe::Absent,
                Err(SniError::NeedMore) => Probe::Pending,
            };
        }
    }
}

impl Inspect {
    /// The bytes peeked so far.
    pub fn bytes(&self) -> &[u8] {
        self.0.as_ref().map_or(&[], |p| &p.buf[..p.len])
    }

    /// More bytes may still be queued: the client did not close and the
    /// buffer has room.
    pub fn can_grow(&self) -> bool {
        self.0.as_ref().is_none_or(|p| p.can_grow())
    }

    /// The request as a condition sees it; `more` says whether bytes may
    /// still come before the rules must decide (the deadline did not pass).
    pub fn request(&self, more: bool) -> Request<'_> {
        let more = more && self.can_grow();
        match &self.0 {
            None => Request {
                bytes: &[],
                more,
                hello_type: Probe::Pending,
                ssl_ver: Probe::Pending,
                sni_pending: true,
            },
            Some(p) => Request {
                bytes: &p.buf[..p.len],
                more,
                hello_type: p.hello_type,
                ssl_ver: p.ssl_ver,
                sni_pending: p.sni == Probe::Pending,
            },
        }
    }

    /// The ClientHello's server name, once known.
    pub fn sni(&self) -> Option<&str> {
        match self.0.as_ref().map(|p| &p.sni) {
            Some(Probe::Found(s)) => Some(s),
            _ => None,
        }
    }

    /// The ClientHello is complete or will never be: its name is decided.
    /// Never before the first look.
    pub fn sni_decided(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|p| p.sni != Probe::Pending || !p.can_grow())
    }

    /// Take what is queued now, without waiting: peeked from a plain
    /// client, the plaintext rustls can give from a TLS one. Bytes the
    /// reactor has not reported yet are seen on the next look, as HAProxy
    /// sees only what its buffer holds.
    pub fn look(&mut self, client: &mut Stream) {
        match client {
            Stream::Plain(tcp) => self.peek(tcp),
            tls => {
                let p = self.0.get_or_insert_with(|| Peeked::new(true));
                // One poll per read, with a waker that wakes nothing: a
                // `Pending` leaves rustls and tokio's readiness as they were,
                // and the next real wait registers its own waker.
                let mut cx = Context::from_waker(Waker::noop());
                while p.can_grow() {
                    let mut rb = ReadBuf::new(&mut p.buf[p.len..]);
                    match Pin::new(&mut *tls).poll_read(&mut cx, &mut rb) {
                        Poll::Pending => break,
                        Poll::Ready(r) => {
                            let n = rb.filled().len();
                            p.took(r.map(|()| n));
                        }
                    }
                }
            }
        }
    }

    fn peek(&mut self, client: &TcpStream) {
        let p = self.0.get_or_insert_with(|| Peeked::new(false));
        // Through `try_io`, so that a `WouldBlock` clears tokio's readiness and
        // the next `ready()` waits for new bytes instead of answering at once.
        let buf = &mut p.buf;
        let peeked = client.try_io(Interest::READABLE, || {
            crate::sys::sock::recv_nowait(client.as_fd(), buf, true)
        });
        match peeked {
            Ok(0) => p.closed = true,
            Ok(n) if n != p.len => {
                p.len = n;
                p.decode();
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                tracing::debug!(error = %e, "peek of the request failed");
                p.closed = true;
            }
        }
    }

    /// Wait until more bytes than now are queued, the client closes, or
    /// `deadline`; then look again. Returns at once when nothing can grow.
    pub async fn wait_more(&mut self, client: &mut Stream, deadline: Instant) {
        let before = self.bytes().len();
        while self.can_grow() && self.bytes().len() == before && Instant::now() < deadline {
            let tcp = match &mut *client {
                Stream::Plain(tcp) => tcp,
                tls => {
                    // Read off a TLS client: a read waits for new plaintext.
                    let p = self.0.get_or_insert_with(|| Peeked::new(true));
                    let read = tls.read(&mut p.buf[p.len..]);
                    match tokio::time::timeout_at(deadline, read).await {
                        Err(_) => return,
                        Ok(r) => p.took(r),
                    }
                    self.look(client);
                    continue;
                }
            };
            if before == 0 {
                // Nothing queued: readiness means new bytes or the close.
                match tokio::time::timeout_at(deadline, tcp.ready(Interest::READABLE)).await {
                    Err(_) => return,
                    Ok(Err(_)) => self.mark_closed(),
                    Ok(Ok(_)) => {}
                }
            } else {
                tokio::time::sleep_until(deadline.min(Instant::now() + REPEEK_PAUSE)).await;
                // Queued bytes keep the socket readable, so this answers at
                // once and says whether the client's FIN came behind them.
                if let Ok(Ok(r)) =
                    tokio::time::timeout_at(deadline, tcp.ready(Interest::READABLE)).await
                {
                    if r.is_read_closed() {
                        self.mark_closed();
                    }
                }
            }
            self.peek(tcp);
        }
    }

    fn mark_closed(&mut self) {
        if let Some(p) = self.0.as_mut() {
            p.closed = true;
        }
    }

    /// Read off the bytes peeked so far, for a rejected flow: closing a
    /// socket with unread bytes resets the connection, where HAProxy, which
    /// had read them, closes it cleanly. A TLS client's were read already.
    pub fn discard(&mut self, client: &Stream) {
        if let (Some(p), Stream::Plain(tcp)) = (self.0.as_mut(), client) {
            if p.len > 0 && !p.consumed {
                let _ = crate::sys::sock::recv_nowait(tcp.as_fd(), &mut p.buf[..p.len], false);
            }
        }
    }

    /// Keep only what the forwarding needs once the flow is routed: the
    /// plaintext read off a TLS client; a plain client's peek buffer is
    /// freed (those bytes are still in its socket).
    pub fn keep_replay(&mut self) {
        if self.0.as_ref().is_some_and(|p| !p.consumed || p.len == 0) {
            self.0 = None;
        }
    }

    /// The bytes read off a TLS client, in order: the server must get them
    /// before anything else the client sends. Empty for a plain client.
    pub fn into_replay(self) -> Vec<u8> {
        match self.0 {
            Some(p) if p.consumed => {
                let mut buf = p.buf;
                buf.truncate(p.len);
                buf
            }
            _ => Vec::new(),
        }
    }
}

impl Peeked {
    /// Accounts a read off a TLS client: `n` more bytes, or its end (a
    /// `close_notify`, a FIN, or an error the forwarding will meet again).
    fn took(&mut self, r: std::io::Result<usize>) {
        match r {
            Ok(0) => self.closed = true,
            Ok(n) => {
                self.len += n;
                self.decode();
            }
            Err(e) => {
                if e.kind() != std::io::ErrorKind::UnexpectedEof {
                    tracing::debug!(error = %e, "read of the TLS request failed");
                }
                self.closed = true;
            }
        }
    }
}

fn probe<T>(r: Result<T, SniError>) -> Probe<T> {
    match r {
        Ok(v) => Probe::Found(v),
        Err(SniError::NeedMore) => Probe::Pending,
        Err(SniError::Malformed) => Probe::Absent,
    }
}
