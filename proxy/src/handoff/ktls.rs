//! kTLS: a client's TLS, terminated by rustls, handed to the kernel once the
//! handshake is done, so the flow is forwarded as plaintext on a plain
//! `TcpStream` (the kernel encrypts what is written to the client socket
//! and decrypts what is read from it).
//!
//! Owns: [`Framed`], the client's socket under rustls during the handshake,
//! which reads TLS records whole so that rustls never holds part of one
//! (the kernel, or shunt's records, must get the stream at a record
//! boundary); [`offload`], the decision (the kernel, else shunt's records in
//! `super::records`), the secrets' extraction and the socket options;
//! [`forward`], the two copy directions of an offloaded flow.
//! Must not: offload a flow whose server side is TLS too (`server ... ssl`:
//! `handoff::tls` copies those), or lose a byte at the switch.
//!
//! # The switch, and why no byte is lost or reordered
//! rustls' secrets can be taken only once, and the connection is unusable
//! after, so everything that could refuse is decided before: the kernel's
//! ciphers (probed at start, `tls::KernelTls`) include the negotiated one,
//! and [`Framed`] sits at a record boundary; and the `tls` ULP is attached,
//! which the kernel does only on an ESTABLISHED socket (`tls_init`: ENOTCONN
//! once the client's FIN is in, as when a client writes a few bytes and
//! closes right after its Finished). A socket with the ULP and no keys yet
//! is TCP (TLS_BASE both ways), so on a refusal shunt's records take the
//! flow instead, from the same switch; the keys themselves are taken in any TCP state (a FIN that
//! comes in after the ULP is read by the kernel as that side's EOF). Then:
//! rustls' pending output (TLS 1.3's NewSessionTickets, an answer to a
//! KeyUpdate) is flushed to the socket; every record rustls read is
//! processed (`Framed` hands it whole records only) and the plaintext it
//! decrypted is drained, to be written to the server first; the secrets
//! come out with their sequence numbers, and the TX and RX keys go on the
//! socket. Records the client sent after the last one rustls read are still
//! in the socket's receive queue, untouched, and the kernel decrypts them
//! from the sequence number rustls stopped at (setting TLS_RX parses what is
//! queued at once). A failure after the secrets are out cannot go back to
//! rustls: only that flow is closed, logged as such.
//!
//! # Forwarding
//! Copy in both directions, through the same driver (`super::drive`:
//! timeouts, half-close) and accounting (`Flow`, plaintext bytes) as a
//! plain flow. Not splice: the kernel (6.1) refuses to splice a non-data
//! record out of a kTLS RX socket (EINVAL), so the client's `close_notify`
//! would need a copy fallback anyway, and a splice into the TX socket with
//! `SPLICE_F_MORE` leaves the kernel's record open, holding a tail back
//! until more bytes come. Not the sockmap: its verdict would see records
//! whose framing the TLS layer owns. The client side reads with `recvmsg`
//! and the record type ([`crate::sys::ktls::recv`]): a `close_notify` is
//! that side's EOF (as a TCP FIN); any other alert, or a handshake message
//! (a TLS 1.3 KeyUpdate, which the kernel cannot follow), ends the flow
//! with an error. Toward the client, EOF is `close_notify` then FIN, as in
//! `handoff::tls`.
//!
//! Memory: a copy buffer per direction, held for the flow's life, as
//! `handoff::tls`; rustls' state is freed at the switch.

use std::io::{self, Read};
use std::os::fd::AsFd;
use std::pin::{pin, Pin};
use std::task::{ready, Context, Poll};

use rustls::{CipherSuite, ConnectionTrafficSecrets, ProtocolVersion};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::TcpStream;

use super::copy;
use super::flow::{DirError, Flow, CLIENT_TO_SERVER, SERVER_TO_CLIENT};
use super::{FlowTimeouts, Meter, Mode, Outcome, BURST_BYTES};
use crate::sys::ktls::{self as sys, Cipher, Ciphers, CryptoInfo, Direction, Received, Version};

/// A TLS record's header: type, version, length (RFC 8446 §5.1).
const RECORD_HEADER: usize = 5;

/// Copy buffer per direction of an offloaded flow: two records' plaintext,
/// and the plain copy's size for the reason given there (a 64 KiB write to
/// the server splits into a full loopback segment and a tiny tail).
const KTLS_COPY_BUF: usize = copy::COPY_BUF_SIZE;

/// The client's TCP socket under rustls. Until [`Framed::unframe`], each
/// read stops at a record boundary (a header, then its body), so that what
/// rustls has read is always whole records; after, reads pass through.
pub struct Framed {
    tcp: TcpStream,
    whole: bool,
    header: [u8; RECORD_HEADER],
    header_have: usize,
    body_left: usize,
}

impl Framed {
    /// Framed from the start: the flow may leave rustls after its handshake.
    pub fn new(tcp: TcpStream) -> Self {
        Self {
            tcp,
            whole: true,
            header: [0; RECORD_HEADER],
            header_have: 0,
            body_left: 0,
        }
    }

    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Reads pass through from now on (the flow stays in userspace).
    pub fn unframe(&mut self) {
        self.whole = false;
    }

    /// Everything read so far is whole records.
    fn at_boundary(&self) -> bool {
        self.whole && self.header_have == 0 && self.body_left == 0
    }

    /// How much the next read may take.
    fn limit(&self) -> usize {
        match self.body_left {
            0 => RECORD_HEADER - self.header_have,
            n => n,
        }
    }

    /// Accounts `got`, the bytes a read just took.
    fn took(&mut self, got: &[u8]) {
        if self.body_left > 0 {
            self.body_left -= got.len();
            return;
        }
        let end = self.header_have + got.len();
        if let Some(h) = self.header.get_mut(self.header_have..end) {
            h.copy_from_slice(got);
        }
        self.header_have = end;
        if end == RECORD_HEADER {
            self.header_have = 0;
            self.body_left = usize::from(u16::from_be_bytes([self.header[3], self.header[4]]));
        }
    }
}

impl AsyncRead for Framed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if !me.whole {
            return Pin::new(&mut me.tcp).poll_read(cx, buf);
        }
        let limit = me.limit().min(buf.remaining());
        let n = {
            let mut sub = ReadBuf::new(buf.initialize_unfilled_to(limit));
            ready!(Pin::new(&mut me.tcp).poll_read(cx, &mut sub))?;
            let got = sub.filled();
            me.took(got);
            got.len()
        };
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Framed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// A client stream whose TLS shunt terminated.
pub type Accepted = tokio_rustls::server::TlsStream<Framed>;

/// A flow the kernel took: the client socket now reads and writes plaintext.
pub struct Offloaded {
    pub client: TcpStream,
    /// Plaintext rustls had decrypted: the server gets it first.
    pub pending: Vec<u8>,
    /// rustls had read the client's `close_notify`: after `pending`, the
    /// client-to-server direction is at its end.
    pub client_closed: bool,
    pub cipher: Cipher,
    pub version: Version,
}

/// How [`offload`] went.
pub enum Offload {
    Kernel(Offloaded),
    /// The kernel cannot take it: shunt's own records carry it on
    /// (`super::records`).
    Records(Box<super::records::Switched>),
    /// Not attempted (the reason): rustls goes on, nothing was changed.
    Userspace(Box<Accepted>, &'static str),
    /// Failed once the secrets were out of rustls: the flow must close.
    Failed(io::Error),
}

/// The kTLS cipher and version of a negotiated suite, if kTLS has them.
fn kernel_suite(suite: CipherSuite) -> Option<(Cipher, Version)> {
    Some(match suite {
        CipherSuite::TLS13_AES_128_GCM_SHA256 => (Cipher::Aes128Gcm, Version::Tls13),
        CipherSuite::TLS13_AES_256_GCM_SHA384 => (Cipher::Aes256Gcm, Version::Tls13),
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => (Cipher::Chacha20Poly1305, Version::Tls13),
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => (Cipher::Aes128Gcm, Version::Tls12),
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
        | CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => (Cipher::Aes256Gcm, Version::Tls12),
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        | CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => {
            (Cipher::Chacha20Poly1305, Version::Tls12)
        }
        _ => return None,
    })
}

/// The nonce base the kernel's TX starts from. The kernel and rustls agree
/// on how nonces follow the sequence number (base XOR sequence) except for
/// TLS 1.2 AES-GCM, where rustls sent records `0..seq` with the explicit
/// part `base XOR i` and the kernel counts up from the explicit part it is
/// given: it must start above every value rustls used, which all lie in the
/// aligned block of `seq.next_power_of_two()` values around `base` (for
/// `seq` 1, the Finished alone, that is `base + 1`). It wraps back into the
/// block only after 2^64 records minus the block.
fn tx_nonce(cipher: Cipher, version: Version, base: [u8; 12], seq: u64) -> [u8; 12] {
    if version != Version::Tls12 || cipher == Cipher::Chacha20Poly1305 || seq == 0 {
        return base;
    }
    let mut explicit = [0u8; 8];
    explicit.copy_from_slice(&base[4..]);
    let block = seq.checked_next_power_of_two().unwrap_or(0).wrapping_sub(1);
    let start = (u64::from_be_bytes(explicit) | block).wrapping_add(1);
    let mut out = base;
    out[4..].copy_from_slice(&start.to_be_bytes());
    out
}

/// One direction's layout from rustls' secrets.
fn crypto_info(
    dir: Direction,
    version: Version,
    seq: u64,
    secrets: &ConnectionTrafficSecrets,
) -> io::Result<CryptoInfo> {
    let (cipher, key, iv) = match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (Cipher::Aes128Gcm, key, iv),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (Cipher::Aes256Gcm, key, iv),
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            (Cipher::Chacha20Poly1305, key, iv)
        }
        _ => {
            return Err(io::Error::other(
                "rustls gave secrets of a cipher kTLS lacks",
            ))
        }
    };
    let base: [u8; 12] = iv
        .as_ref()
        .try_into()
        .map_err(|_| io::Error::other("rustls gave an IV that is not 12 bytes"))?;
    let nonce = match dir {
        Direction::Tx => tx_nonce(cipher, version, base, seq),
        Direction::Rx => base,
    };
    CryptoInfo::new(cipher, version, key.as_ref(), &nonce, seq).map_err(io::Error::other)
}

/// What [`take_keys`] leaves: the client's socket (rustls gone), the
/// plaintext rustls had decrypted, whether that ended with the client's
/// `close_notify`, and the secrets with their sequence numbers.
struct Taken {
    tcp: TcpStream,
    pending: Vec<u8>,
    client_closed: bool,
    secrets: rustls::ExtractedSecrets,
}

/// The switch itself, once nothing can refuse: rustls' pending output
/// (TLS 1.3's NewSessionTickets, an answer to a KeyUpdate) flushed under
/// its keys, every record it read processed and its plaintext drained, then
/// the secrets taken. An error means rustls is unusable: the flow closes.
async fn take_keys(mut tls: Box<Accepted>) -> io::Result<Taken> {
    tls.flush().await?;
    let (io, mut conn) = tls.into_inner();
    conn.process_new_packets().map_err(io::Error::other)?;
    let mut pending = Vec::new();
    let mut client_closed = false;
    let mut chunk = [0u8; 4096];
    loop {
        match conn.reader().read(&mut chunk) {
            Ok(0) => {
                client_closed = true;
                break;
            }
            Ok(n) => pending.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            // The client closed TCP without close_notify (rustls saw EOF).
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                client_closed = true;
                break;
            }
            Err(e) => return Err(e),
        }
    }
    let secrets = conn
        .dangerous_extract_secrets()
        .map_err(|e| io::Error::other(format!("secret extraction: {e}")))?;
    Ok(Taken {
        tcp: io.tcp,
        pending,
        client_closed,
        secrets,
    })
}

/// Hand the client's TLS to the kernel if it can take it (`ciphers`, from
/// the start-up probe; see the module's "The switch"), else to shunt's own
/// records (`super::records`), which take every suite rustls negotiates.
pub async fn offload(tls: Box<Accepted>, ciphers: Ciphers) -> Offload {
    let (io, conn) = tls.get_ref();
    let suite = conn.negotiated_cipher_suite().map(|s| s.suite());
    let Some((cipher, version)) = suite.and_then(kernel_suite) else {
        return Offload::Userspace(tls, "negotiated cipher suite has no kTLS cipher");
    };
    let tls13 = conn.protocol_version() == Some(ProtocolVersion::TLSv1_3);
    if tls13 != (version == Version::Tls13) {
        return Offload::Userspace(tls, "protocol version does not match the suite");
    }
    if !io.at_boundary() {
        return Offload::Userspace(tls, "part of a TLS record is buffered");
    }
    // The ULP first, while rustls still has its secrets: the kernel attaches
    // it to an established socket only (ENOTCONN once the client's FIN came
    // in), and without keys it changes nothing (TLS_BASE: TCP's own reads
    // and writes), so a refusal leaves the flow to shunt's records.
    let kernel = ciphers.has(cipher)
        && match sys::set_ulp(io.tcp().as_fd()) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "TCP_ULP tls refused: shunt's records take the flow");
                false
            }
        };
    // From here on rustls is gone: any failure closes the flow.
    let taken = match take_keys(tls).await {
        Ok(t) => t,
        Err(e) => return Offload::Failed(e),
    };
    let Taken {
        tcp,
        pending,
        client_closed,
        secrets,
    } = taken;
    let (tx_seq, tx) = &secrets.tx;
    let (rx_seq, rx) = &secrets.rx;
    if !kernel {
        let keys = super::records::Keys::new(version, *rx_seq, rx)
            .and_then(|rx| super::records::Keys::new(version, *tx_seq, tx).map(|tx| (rx, tx)));
        return match keys {
            Ok((rx, tx)) => Offload::Records(Box::new(super::records::Switched {
                client: tcp,
                pending,
                client_closed,
                rx,
                tx,
            })),
            Err(e) => Offload::Failed(e),
        };
    }
    let install = || -> io::Result<()> {
        let tx = crypto_info(Direction::Tx, version, *tx_seq, tx)?;
        let rx = crypto_info(Direction::Rx, version, *rx_seq, rx)?;
        let fd = tcp.as_fd();
        sys::set_crypto(fd, Direction::Tx, &tx)
            .map_err(|e| io::Error::new(e.kind(), format!("TLS_TX: {e}")))?;
        sys::set_crypto(fd, Direction::Rx, &rx)
            .map_err(|e| io::Error::new(e.kind(), format!("TLS_RX: {e}")))
    };
    if let Err(e) = install() {
        return Offload::Failed(e);
    }
    Offload::Kernel(Offloaded {
        client: tcp,
        pending,
        client_closed,
        cipher,
        version,
    })
}

/// Forward an offloaded flow until both directions are finished
/// (`Outcome::mode` is `Copy`); resets and timeouts end it as a plain flow.
pub async fn forward(
    k: Offloaded,
    server: TcpStream,
    timeouts: FlowTimeouts,
    meter: &dyn Meter,
) -> Outcome {
    let Offloaded {
        client,
        pending,
        client_closed,
        ..
    } = k;
    super::nodelay(&client, &server);
    let flow = Flow::new(meter);
    let end = {
        let c2s = pin!(from_client(&flow, &client, &server, pending, client_closed));
        let s2c = pin!(to_client(&flow, &server, &client));
        super::drive_unpromoted(&flow, &timeouts, c2s, s2c).await
    };
    super::finish(&flow, &client, &server, Mode::Copy, end, None)
}

/// Client to server: `pending` first, then the kernel's plaintext until the
/// client's `close_notify` or FIN.
async fn from_client(
    flow: &Flow<'_>,
    client: &TcpStream,
    server: &TcpStream,
    pending: Vec<u8>,
    closed: bool,
) -> Result<(), DirError> {
    let dir = CLIENT_TO_SERVER;
    copy::write_all(flow, dir, server, &pending).await?;
    drop(pending);
    if !closed {
        let mut buf = vec![0u8; KTLS_COPY_BUF];
        let mut burst = 0usize;
        'read: loop {
            copy::wait_readable(flow, dir, client).await?;
            loop {
                let got = client.try_io(Interest::READABLE, || sys::recv(client.as_fd(), &mut buf));
                match got {
                    Ok(Received::Data(0)) => break 'read,
                    Ok(Received::Data(n)) => {
                        flow.read(dir.from, n, n < buf.len());
                        copy::write_all(flow, dir, server, buf.get(..n).unwrap_or_default())
                            .await?;
                        burst += n;
                        if burst >= BURST_BYTES {
                            burst = 0;
                            crate::scheduler::yield_now().await;
                            continue 'read;
                        }
                    }
                    Ok(Received::Control { kind, n }) => {
                        let payload = buf.get(..n).unwrap_or_default();
                        if kind == sys::RECORD_ALERT && payload == sys::CLOSE_NOTIFY {
                            break 'read;
                        }
                        let what = match kind {
                            sys::RECORD_ALERT => format!("TLS alert {payload:?} from the client"),
                            sys::RECORD_HANDSHAKE => {
                                "TLS handshake message (KeyUpdate?) after the kTLS switch".into()
                            }
                            k => format!("TLS record of type {k} from the client"),
                        };
                        return Err(DirError::new(dir.from, io::Error::other(what)));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        flow.drained(dir.from);
                        continue 'read;
                    }
                    Err(e) => return Err(DirError::new(dir.from, e)),
                }
            }
        }
    }
    flow.shut(dir.from);
    copy::propagate_eof(flow, dir, server)
}

/// Server to client: plaintext written to the kTLS socket (the kernel makes
/// the records); at the server's EOF, `close_notify` then FIN.
async fn to_client(
    flow: &Flow<'_>,
    server: &TcpStream,
    client: &TcpStream,
) -> Result<(), DirError> {
    let dir = SERVER_TO_CLIENT;
    let mut buf = vec![0u8; KTLS_COPY_BUF];
    let mut burst = 0usize;
    'read: loop {
        copy::wait_readable(flow, dir, server).await?;
        loop {
            match server.try_read(&mut buf) {
                Ok(0) => break 'read,
                Ok(n) => {
                    flow.read(dir.from, n, n < buf.len());
                    copy::write_all(flow, dir, client, buf.get(..n).unwrap_or_default()).await?;
                    burst += n;
                    if burst >= BURST_BYTES {
                        burst = 0;
                        crate::scheduler::yield_now().await;
                        continue 'read;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    flow.drained(dir.from);
                    continue 'read;
                }
                Err(e) => return Err(DirError::new(dir.from, e)),
            }
        }
    }
    flow.shut(dir.from);
    // Every byte read was written: now close_notify, then FIN.
    loop {
        let sent = client.try_io(Interest::WRITABLE, || {
            match sys::send_alert(client.as_fd(), &sys::CLOSE_NOTIFY) {
                // A kTLS socket takes a record whole or not at all.
                Ok(true) => Ok(()),
                Ok(false) => Err(io::Error::other("close_notify sent in part")),
                Err(e) => Err(e),
            }
        });
        match sent {
            Ok(()) => break,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => copy::write_ready(client)
                .await
                .map_err(|e| DirError::new(dir.to, e))?,
            Err(e) => return Err(DirError::new(dir.to, e)),
        }
    }
    copy::propagate_eof(flow, dir, client)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: [u8; 12] = [1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0x10, 0x03];

    #[test]
    fn tls13_and_chacha_nonces_are_rustls_own() {
        for (c, v) in [
            (Cipher::Aes128Gcm, Version::Tls13),
            (Cipher::Aes256Gcm, Version::Tls13),
            (Cipher::Chacha20Poly1305, Version::Tls12),
        ] {
            assert_eq!(tx_nonce(c, v, BASE, 5), BASE);
        }
    }

    #[test]
    fn tls12_gcm_tx_starts_above_every_nonce_rustls_used() {
        // seq 1: rustls used the base itself (the Finished).
        let n = tx_nonce(Cipher::Aes128Gcm, Version::Tls12, BASE, 1);
        assert_eq!(n[..4], BASE[..4], "salt kept");
        assert_eq!(n[4..], [0, 0, 0, 0, 0, 0, 0x10, 0x04]);
        // seq 3: rustls used base ^ 0, 1, 2 = ..03, ..02, ..01; the kernel
        // counts from ..04 (block of 4 above 0x1000).
        let n = tx_nonce(Cipher::Aes256Gcm, Version::Tls12, BASE, 3);
        assert_eq!(n[4..], [0, 0, 0, 0, 0, 0, 0x10, 0x04]);
        let used: Vec<u64> = (0..3).map(|i| 0x1003 ^ i).collect();
        let start = u64::from_be_bytes(n[4..].try_into().expect("8 bytes"));
        assert!(used.iter().all(|&u| u < start));
        // The all-ones explicit part wraps to zero (2^64 records away).
        let mut top = BASE;
        top[4..].copy_from_slice(&[0xff; 8]);
        let n = tx_nonce(Cipher::Aes128Gcm, Version::Tls12, top, 1);
        assert_eq!(n[4..], [0; 8]);
    }

    #[test]
    fn framed_reads_stop_at_record_boundaries() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let mut peer = TcpStream::connect(l.local_addr().expect("addr"))
                .await
                .expect("connect");
            let (s, _) = l.accept().await.expect("accept");
            // Two records: 3-byte and 2-byte bodies, sent at once.
            peer.write_all(&[23, 3, 3, 0, 3, b'a', b'b', b'c', 23, 3, 3, 0, 2, b'd', b'e'])
                .await
                .expect("write");
            let mut f = Framed::new(s);
            let mut buf = [0u8; 64];
            let mut reads = Vec::new();
            let mut total = 0;
            while total < 15 {
                let n = tokio::io::AsyncReadExt::read(&mut f, &mut buf)
                    .await
                    .expect("read");
                total += n;
                reads.push((n, f.at_boundary()));
            }
            assert_eq!(reads, [(5, false), (3, true), (5, false), (2, true)]);
        });
    }
}
