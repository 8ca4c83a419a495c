//! The request's first bytes as `tcp-request content` rules and SNI routing
//! see them: peeked from the client socket (`MSG_PEEK`), never consumed, so
//! the forwarding sends them to the server as the client sent them.
//!
//! Owns one flow's inspection buffer, taken on the first look and freed with
//! the value (before the hand-off), and what is decoded from it once per new
//! bytes (the TLS hello's type, version and server name), so that evaluating
//! a condition against [`Inspect::request`] allocates nothing. A flow that
//! never inspects allocates nothing and holds one pointer.
//!
//! Must not: read a byte off the socket (but for a rejected flow's, [`Inspect::discard`]), or wait past the deadline it is
//! given. Bounded by [`INSPECT_MAX`], HAProxy's `tune.bufsize`: once that
//! many bytes are queued the buffer is full and every fetch is final, as
//! HAProxy's `channel_full`.

use std::os::fd::AsFd;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::config::acl::{Probe, Request};
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
    hello_type: Probe<i64>,
    ssl_ver: Probe<i64>,
    /// The ClientHello's server name: `Pending` while the hello is incomplete.
    sni: Probe<String>,
}

impl Peeked {
    fn new() -> Box<Peeked> {
        let mut p = Box::new(Peeked {
            buf: vec![0u8; INSPECT_MAX],
            len: 0,
            closed: false,
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

    /// Peek what is queued now, without waiting. Bytes the reactor has not
    /// reported yet are seen on the next look, as HAProxy sees only what its
    /// buffer holds.
    pub fn look(&mut self, client: &TcpStream) {
        let p = self.0.get_or_insert_with(Peeked::new);
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
    pub async fn wait_more(&mut self, client: &TcpStream, deadline: Instant) {
        let before = self.bytes().len();
        while self.can_grow() && self.bytes().len() == before && Instant::now() < deadline {
            if before == 0 {
                // Nothing queued: readiness means new bytes or the close.
                match tokio::time::timeout_at(deadline, client.ready(Interest::READABLE)).await {
                    Err(_) => return,
                    Ok(Err(_)) => self.mark_closed(),
                    Ok(Ok(_)) => {}
                }
            } else {
                tokio::time::sleep_until(deadline.min(Instant::now() + REPEEK_PAUSE)).await;
                // Queued bytes keep the socket readable, so this answers at
                // once and says whether the client's FIN came behind them.
                if let Ok(Ok(r)) =
                    tokio::time::timeout_at(deadline, client.ready(Interest::READABLE)).await
                {
                    if r.is_read_closed() {
                        self.mark_closed();
                    }
                }
            }
            self.look(client);
        }
    }

    fn mark_closed(&mut self) {
        if let Some(p) = self.0.as_mut() {
            p.closed = true;
        }
    }

    /// Read off the bytes peeked so far, for a rejected flow: closing a
    /// socket with unread bytes resets the connection, where HAProxy, which
    /// had read them, closes it cleanly.
    pub fn discard(&mut self, client: &TcpStream) {
        if let Some(p) = self.0.as_mut().filter(|p| p.len > 0) {
            let _ = crate::sys::sock::recv_nowait(client.as_fd(), &mut p.buf[..p.len], false);
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
