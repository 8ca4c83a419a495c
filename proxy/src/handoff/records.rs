//! The record layer in userspace: a client's TLS, terminated by rustls,
//! carried on after the handshake by shunt's own records over the keys
//! rustls negotiated, where the kernel has no kTLS to take them
//! (`super::ktls`), so that every byte is decrypted in the buffer it was
//! read into and sent to the server from there.
//!
//! Why: rustls (0.23) decrypts a record in its receive buffer, then copies
//! the plaintext into a `Vec` of its own (`Payload::into_vec`), and reads
//! the socket 4 KiB at a time. In the slow bulk flows of `cargo xtask bench
//! --scenarios tls` that copy took 29 % of the proxy's CPU (perf with DWARF
//! call graphs, 2026-12-07), where OpenSSL under HAProxy makes none. rustls'
//! unbuffered API would avoid it, but it cannot take over a connection
//! whose handshake the buffered API made, and the switch below is the one
//! kTLS already makes: only the cryptography moves, to ring (rustls' own
//! provider) instead of the kernel.
//!
//! Owns: [`Keys`], one direction's AEAD, IV and sequence number, and the
//! framing of records (RFC 8446 §5.2-5.4; TLS 1.2's RFC 5246 §6.2.3.3 with
//! RFC 5288's explicit nonce for AES-GCM and RFC 7905's for ChaCha20);
//! [`forward`], the two directions of a switched flow.
//! Must not: take a flow whose server side is TLS (`handoff::tls` copies
//! those) or lose a byte at the switch, which is `ktls::take_keys`'s (the
//! same as kTLS's: rustls stops at a record boundary, its output flushed
//! and its plaintext drained, to be written to the server first).
//!
//! # Nonces
//! Each direction's nonce is its IV XOR the record's sequence number, as
//! rustls made them, continued from the sequence number rustls stopped at;
//! on TLS 1.2 AES-GCM the explicit part written in each record is that
//! nonce's last 8 bytes, as rustls writes it. So no nonce repeats under a
//! key. The sequence number stops the flow before it wraps.
//!
//! # What ends a flow
//! The client's `close_notify` is its EOF (then FIN toward the server); a
//! TCP FIN without one too, as in `handoff::tls`, unless it cuts a record in
//! two. A record that fails to decrypt, any other alert, or a handshake
//! message ends the flow with an error: a TLS 1.3 KeyUpdate cannot be
//! followed, since rustls gives the traffic keys but not the secrets they
//! derive from (kTLS has the same limit). A rustls client sends one on its
//! own only near AES-GCM's confidentiality limit, after 2^23 full records
//! (128 GiB) in a direction; OpenSSL's and Go's clients do not.
//!
//! # Forwarding and memory
//! Client to server: records are read into a copy buffer of the worker's
//! cache (`copy::Buf`), each read sized to end at a record boundary once a
//! record's size is known (so a partial record is rarely moved), opened in
//! place, their plaintext made contiguous and written to the server in one
//! write. Server to client: a read of at most one record's plaintext, put
//! where the record's body goes, sealed in place and written. A direction
//! holds a buffer only while bytes move (or while part of a record waits for
//! its rest); an idle flow holds its two keys, and rustls' state is freed at
//! the switch.

use std::io;
use std::ops::Range;
use std::pin::pin;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::ConnectionTrafficSecrets;
use tokio::net::TcpStream;

use super::copy::{self, Read};
use super::flow::{Dir, DirError, Flow, CLIENT_TO_SERVER, SERVER_TO_CLIENT};
use super::{FlowTimeouts, Meter, Mode, Outcome, BURST_BYTES};
use crate::sys::ktls::{Cipher, Version, CLOSE_NOTIFY, RECORD_ALERT, RECORD_DATA};

/// A record's header: type, legacy version, length.
const HEADER: usize = 5;
/// Largest plaintext of a record (2^14).
const MAX_PLAIN: usize = 16 * 1024;
/// Largest body of a record read: TLS 1.2's bound (2^14 + 2048), above TLS
/// 1.3's (2^14 + 256).
const MAX_BODY: usize = MAX_PLAIN + 2048;
/// The AEAD tag of every suite here.
const TAG: usize = 16;
/// TLS 1.2 AES-GCM's explicit nonce, sent in each record.
const EXPLICIT: usize = 8;
/// The legacy version every record's header carries.
const WIRE_VERSION: [u8; 2] = [3, 3];

/// One direction's record protection.
pub struct Keys {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
    version: Version,
    explicit: bool,
}

impl Keys {
    /// The keys rustls gave for one direction, from sequence number `seq`.
    pub fn new(version: Version, seq: u64, secrets: &ConnectionTrafficSecrets) -> io::Result<Self> {
        let (cipher, alg, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
                (Cipher::Aes128Gcm, &aead::AES_128_GCM, key, iv)
            }
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
                (Cipher::Aes256Gcm, &aead::AES_256_GCM, key, iv)
            }
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (Cipher::Chacha20Poly1305, &aead::CHACHA20_POLY1305, key, iv)
            }
            _ => return Err(io::Error::other("rustls gave secrets of an unknown cipher")),
        };
        let key = UnboundKey::new(alg, key.as_ref())
            .map_err(|_| io::Error::other("rustls gave a key of the wrong length"))?;
        let iv: [u8; 12] = iv
            .as_ref()
            .try_into()
            .map_err(|_| io::Error::other("rustls gave an IV that is not 12 bytes"))?;
        Ok(Self {
            key: LessSafeKey::new(key),
            iv,
            seq,
            version,
            explicit: version == Version::Tls12 && cipher != Cipher::Chacha20Poly1305,
        })
    }

    /// This record's nonce: the IV XOR the sequence number.
    fn nonce(&self) -> [u8; 12] {
        let mut n = self.iv;
        for (b, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        n
    }

    /// The next record's sequence number; none past the last.
    fn advance(&mut self) -> io::Result<()> {
        self.seq = self
            .seq
            .checked_add(1)
            .filter(|&s| s < u64::MAX)
            .ok_or_else(|| io::Error::other("TLS sequence number exhausted"))?;
        Ok(())
    }

    /// TLS 1.2's additional data: sequence number, type, version, length.
    fn aad12(&self, kind: u8, len: usize) -> [u8; 13] {
        let mut a = [0u8; 13];
        a[..8].copy_from_slice(&self.seq.to_be_bytes());
        a[8] = kind;
        a[9..11].copy_from_slice(&WIRE_VERSION);
        a[11..].copy_from_slice(&(len as u16).to_be_bytes());
        a
    }

    /// Where the plaintext of a record this side seals starts.
    fn head(&self) -> usize {
        HEADER + if self.explicit { EXPLICIT } else { 0 }
    }

    /// Seals the `n` bytes of plaintext at `buf[self.head()..]` as one record
    /// of type `kind` in place; its length (from `buf[0]`).
    fn seal(&mut self, kind: u8, buf: &mut [u8], n: usize) -> io::Result<usize> {
        let head = self.head();
        let nonce = self.nonce();
        let (outer, body, sealed) = match self.version {
            Version::Tls13 => {
                *buf.get_mut(head + n).ok_or_else(small)? = kind;
                (RECORD_DATA, n + 1 + TAG, n + 1)
            }
            Version::Tls12 => (kind, head - HEADER + n + TAG, n),
        };
        let mut header = [outer, WIRE_VERSION[0], WIRE_VERSION[1], 0, 0];
        header[3..].copy_from_slice(&(body as u16).to_be_bytes());
        buf.get_mut(..HEADER)
            .ok_or_else(small)?
            .copy_from_slice(&header);
        let total = HEADER + body;
        let in_out = buf.get_mut(head..head + sealed).ok_or_else(small)?;
        let tag = match self.version {
            Version::Tls13 => self.key.seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(header),
                in_out,
            ),
            Version::Tls12 => self.key.seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.aad12(kind, n)),
                in_out,
            ),
        }
        .map_err(|_| io::Error::other("TLS record sealing failed"))?;
        if self.explicit {
            buf.get_mut(HEADER..head)
                .ok_or_else(small)?
                .copy_from_slice(&nonce[4..]);
        }
        buf.get_mut(head + sealed..total)
            .ok_or_else(small)?
            .copy_from_slice(tag.as_ref());
        self.advance()?;
        Ok(total)
    }

    /// Opens `rec`, one whole record (header and body), in place.
    fn open(&mut self, rec: &mut [u8]) -> io::Result<Opened> {
        let header: [u8; HEADER] = rec
            .get(..HEADER)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(small)?;
        let skip = HEADER + if self.explicit { EXPLICIT } else { 0 };
        let Some(plain_len) = rec.len().checked_sub(skip + TAG) else {
            return Err(bad("TLS record shorter than its tag"));
        };
        let nonce = if self.explicit {
            let mut n = self.iv;
            n[4..].copy_from_slice(&rec[HEADER..skip]);
            n
        } else {
            self.nonce()
        };
        let body = &mut rec[skip..];
        let opened = match self.version {
            Version::Tls13 => {
                if header[0] != RECORD_DATA {
                    return Err(bad(format!(
                        "TLS record of type {} after the handshake",
                        header[0]
                    )));
                }
                self.key
                    .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(header), body)
            }
            Version::Tls12 => self.key.open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.aad12(header[0], plain_len)),
                body,
            ),
        }
        .map_err(|_| bad("TLS record failed to decrypt (bad_record_mac)"))?;
        self.advance()?;
        let (kind, content) = match self.version {
            Version::Tls13 => {
                // The content, its type, then zeros (padding).
                let Some(at) = opened.iter().rposition(|&b| b != 0) else {
                    return Err(bad("TLS 1.3 record without a content type"));
                };
                (opened[at], skip..skip + at)
            }
            Version::Tls12 => (header[0], skip..skip + plain_len),
        };
        match kind {
            RECORD_DATA => Ok(Opened::Data(content)),
            // Its level is not looked at (RFC 8446 §6: it is implicit).
            RECORD_ALERT if matches!(rec.get(content.clone()), Some([_, 0])) => {
                Ok(Opened::CloseNotify)
            }
            RECORD_ALERT => Err(bad(format!(
                "TLS alert {:?} from the client",
                rec.get(content).unwrap_or_default()
            ))),
            crate::sys::ktls::RECORD_HANDSHAKE => Err(bad(
                "TLS handshake message (KeyUpdate?) after the switch to shunt's records",
            )),
            k => Err(bad(format!("TLS record of type {k} from the client"))),
        }
    }
}

/// What an opened record held.
#[derive(Debug, PartialEq)]
enum Opened {
    /// Application data, at this range of the record.
    Data(Range<usize>),
    /// The peer's `close_notify`.
    CloseNotify,
}

fn small() -> io::Error {
    io::Error::other("buffer too small for a TLS record")
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// The whole length of the record `buf` starts with, once its header is in.
fn record_len(buf: &[u8]) -> io::Result<Option<usize>> {
    let Some(h) = buf.get(..HEADER) else {
        return Ok(None);
    };
    let body = usize::from(u16::from_be_bytes([h[3], h[4]]));
    if body > MAX_BODY {
        return Err(bad(format!("TLS record of {body} bytes (record_overflow)")));
    }
    Ok(Some(HEADER + body))
}

/// How much the next read may take into `space` bytes, after `partial` (a
/// record's start): the rest of that record, then as many records of the
/// last whole record's size (`last`) as fit, so that a read of a client
/// writing records of one size ends at a boundary and nothing is left to
/// move. Without that knowledge, all the space.
fn read_limit(partial: &[u8], last: usize, space: usize) -> usize {
    let need = match record_len(partial) {
        Ok(Some(len)) => len - partial.len(),
        _ if !partial.is_empty() => return space,
        _ => 0,
    };
    if last == 0 || need > space {
        return space;
    }
    need + (space - need) / last * last
}

/// Opens every whole record at the start of `buf` in place and gathers
/// their plaintext into one run (moving each record's after the first's,
/// which stays). Returns the run, the bytes of whole records consumed, and
/// whether a `close_notify` ended them; `last` becomes the size of the last
/// whole record.
fn open_records(
    keys: &mut Keys,
    buf: &mut [u8],
    last: &mut usize,
) -> io::Result<(Range<usize>, usize, bool)> {
    let mut pos = 0;
    let mut run: Option<Range<usize>> = None;
    while let Some(len) = record_len(&buf[pos..])? {
        let Some(rec) = buf.get_mut(pos..pos + len) else {
            break;
        };
        let opened = keys.open(rec)?;
        *last = len;
        let Opened::Data(r) = opened else {
            return Ok((run.unwrap_or(0..0), pos + len, true));
        };
        let (from, to) = (pos + r.start, pos + r.end);
        run = Some(match run {
            None => from..to,
            Some(run) => {
                buf.copy_within(from..to, run.end);
                run.start..run.end + (to - from)
            }
        });
        pos += len;
    }
    Ok((run.unwrap_or(0..0), pos, false))
}

/// A flow switched to shunt's records: the client socket, plaintext rustls
/// had decrypted (for the server first), whether it had read the client's
/// `close_notify`, and both directions' keys.
pub struct Switched {
    pub client: TcpStream,
    pub pending: Vec<u8>,
    pub client_closed: bool,
    pub rx: Keys,
    pub tx: Keys,
}

/// Forward a switched flow until both directions are finished
/// (`Outcome::mode` is `Copy`); resets and timeouts end it as a plain flow.
pub async fn forward(
    s: Switched,
    server: TcpStream,
    timeouts: FlowTimeouts,
    meter: &dyn Meter,
) -> Outcome {
    let Switched {
        client,
        pending,
        client_closed,
        mut rx,
        mut tx,
    } = s;
    super::nodelay(&client, &server);
    let flow = Flow::new(meter);
    let end = {
        let c2s = pin!(from_client(
            &flow,
            &client,
            &server,
            &mut rx,
            pending,
            client_closed
        ));
        let s2c = pin!(to_client(&flow, &server, &client, &mut tx));
        super::drive_unpromoted(&flow, &timeouts, c2s, s2c).await
    };
    super::finish(&flow, &client, &server, Mode::Copy, end, None)
}

/// Client to server: `pending` first, then the plaintext of the client's
/// records until its `close_notify` or FIN.
async fn from_client(
    flow: &Flow<'_>,
    client: &TcpStream,
    server: &TcpStream,
    rx: &mut Keys,
    pending: Vec<u8>,
    closed: bool,
) -> Result<(), DirError> {
    let dir = CLIENT_TO_SERVER;
    copy::write_all(flow, dir, server, &pending).await?;
    drop(pending);
    if !closed {
        read_records(flow, dir, client, server, rx).await?;
    }
    flow.shut(dir.from);
    copy::propagate_eof(flow, dir, server)
}

/// The records of `from` until its end, their plaintext written to `to`.
async fn read_records(
    flow: &Flow<'_>,
    dir: Dir,
    from: &TcpStream,
    to: &TcpStream,
    keys: &mut Keys,
) -> Result<(), DirError> {
    let err = |e| DirError::new(dir.from, e);
    // A buffer is held from readable to dry, and while part of a record
    // waits (`have` bytes at its front).
    let mut held: Option<copy::Buf> = None;
    let mut have = 0usize;
    let mut last = 0usize;
    let mut burst = 0usize;
    loop {
        copy::wait_readable(flow, dir, from).await?;
        let mut buf = held.take().unwrap_or_else(copy::Buf::take);
        let dry = loop {
            let want = read_limit(&buf[..have], last, buf.len() - have);
            let (n, dry) = match copy::read_once(from, &mut buf[have..have + want]) {
                Ok(Read::Eof) if have == 0 => return Ok(()),
                Ok(Read::Eof) => return Err(err(bad("the client's FIN cut a TLS record"))),
                Ok(Read::Dry(n)) => (n, true),
                Ok(Read::More(n)) => (n, false),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    flow.drained(dir.from);
                    break true;
                }
                Err(e) => return Err(err(e)),
            };
            flow.read(dir.from, n, dry);
            have += n;
            let (run, used, closed) =
                open_records(keys, &mut buf[..have], &mut last).map_err(err)?;
            copy::write_all(flow, dir, to, &buf[run.clone()]).await?;
            if closed {
                return Ok(());
            }
            buf.copy_within(used..have, 0);
            have -= used;
            burst += run.len();
            if dry || burst >= BURST_BYTES {
                break dry;
            }
        };
        if have > 0 {
            held = Some(buf);
        } else {
            drop(buf);
        }
        burst = 0;
        if !dry {
            crate::scheduler::yield_now().await;
        }
    }
}

/// Server to client: each read of the server (one record's plaintext at
/// most) sealed in place and written; at the server's EOF, `close_notify`
/// then FIN.
async fn to_client(
    flow: &Flow<'_>,
    server: &TcpStream,
    client: &TcpStream,
    tx: &mut Keys,
) -> Result<(), DirError> {
    let dir = SERVER_TO_CLIENT;
    let head = tx.head();
    let mut burst = 0usize;
    'wait: loop {
        copy::wait_readable(flow, dir, server).await?;
        let mut buf = copy::Buf::take();
        loop {
            let (n, dry) = match copy::read_once(server, &mut buf[head..head + MAX_PLAIN]) {
                Ok(Read::Eof) => break 'wait,
                Ok(Read::Dry(n)) => (n, true),
                Ok(Read::More(n)) => (n, false),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    flow.drained(dir.from);
                    continue 'wait;
                }
                Err(e) => return Err(DirError::new(dir.from, e)),
            };
            flow.read(dir.from, n, dry);
            let len = tx
                .seal(RECORD_DATA, &mut buf, n)
                .map_err(|e| DirError::new(dir.to, e))?;
            send_record(flow, dir, client, &buf[..len], n).await?;
            burst += n;
            if dry {
                burst = 0;
                continue 'wait;
            }
            if burst >= BURST_BYTES {
                burst = 0;
                drop(buf);
                crate::scheduler::yield_now().await;
                continue 'wait;
            }
        }
    }
    flow.shut(dir.from);
    // Every byte read was written: now close_notify, then FIN.
    let mut rec = [0u8; 64];
    let alert = rec
        .get_mut(head..head + CLOSE_NOTIFY.len())
        .ok_or_else(|| DirError::new(dir.to, small()))?;
    alert.copy_from_slice(&CLOSE_NOTIFY);
    let len = tx
        .seal(RECORD_ALERT, &mut rec, CLOSE_NOTIFY.len())
        .map_err(|e| DirError::new(dir.to, e))?;
    send_record(flow, dir, client, &rec[..len], 0).await?;
    copy::propagate_eof(flow, dir, client)
}

/// Writes the record `rec` whole to `to`, waiting for room as needed, and
/// accounts its `plain` bytes of plaintext (as HAProxy counts, at the
/// stream layer).
async fn send_record(
    flow: &Flow<'_>,
    dir: Dir,
    to: &TcpStream,
    mut rec: &[u8],
    plain: usize,
) -> Result<(), DirError> {
    while !rec.is_empty() {
        match to.try_write(rec) {
            Ok(0) => return Err(DirError::new(dir.to, io::ErrorKind::WriteZero.into())),
            Ok(n) => rec = &rec[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => copy::write_ready(to)
                .await
                .map_err(|e| DirError::new(dir.to, e))?,
            Err(e) => return Err(DirError::new(dir.to, e)),
        }
    }
    flow.wrote(dir.to, plain);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::ring::cipher_suite as cs;
    use rustls::{ClientConnection, Connection, ServerConnection, SupportedCipherSuite};
    use std::io::{Read as _, Write as _};
    use std::sync::Arc;

    /// Moves every record `from` has to write into `to`, which processes them.
    fn pass(from: &mut Connection, to: &mut Connection) {
        let mut wire = Vec::new();
        while from.wants_write() {
            from.write_tls(&mut wire).expect("write_tls");
        }
        let mut rd = &wire[..];
        while !rd.is_empty() {
            to.read_tls(&mut rd).expect("read_tls");
            to.process_new_packets().expect("process");
        }
    }

    /// A rustls client and server that finished a handshake on `suite`
    /// (the server's tickets delivered), in memory.
    fn handshake(suite: SupportedCipherSuite) -> (Connection, ServerConnection) {
        let mut provider = rustls::crypto::ring::default_provider();
        provider.cipher_suites = vec![suite];
        let provider = Arc::new(provider);
        let cert = rcgen::generate_simple_self_signed(vec!["a.test".to_string()]).expect("cert");
        let der = rustls::pki_types::CertificateDer::from(cert.cert.der().to_vec());
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.key_pair.serialize_der()).expect("key");
        let mut sc = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![der.clone()], key)
            .expect("server config");
        sc.enable_secret_extraction = true;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).expect("root");
        let cc = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("a.test").expect("name");
        let mut client =
            Connection::Client(ClientConnection::new(Arc::new(cc), name).expect("client"));
        let mut server = Connection::Server(ServerConnection::new(Arc::new(sc)).expect("server"));
        for _ in 0..8 {
            pass(&mut client, &mut server);
            pass(&mut server, &mut client);
        }
        assert!(!client.is_handshaking() && !server.is_handshaking());
        let Connection::Server(server) = server else {
            unreachable!()
        };
        (client, server)
    }

    const SUITES: [(SupportedCipherSuite, Version); 6] = [
        (cs::TLS13_AES_128_GCM_SHA256, Version::Tls13),
        (cs::TLS13_AES_256_GCM_SHA384, Version::Tls13),
        (cs::TLS13_CHACHA20_POLY1305_SHA256, Version::Tls13),
        (cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, Version::Tls12),
        (cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, Version::Tls12),
        (
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            Version::Tls12,
        ),
    ];

    /// The server's keys, taken from rustls after `before` bytes crossed
    /// each way under rustls (so that the sequence numbers are not zero).
    fn switched(suite: SupportedCipherSuite, version: Version) -> (Connection, Keys, Keys) {
        let (mut client, server) = handshake(suite);
        let mut server = Connection::Server(server);
        client.writer().write_all(b"before").expect("write");
        pass(&mut client, &mut server);
        server.writer().write_all(b"before").expect("write");
        pass(&mut server, &mut client);
        let mut got = [0u8; 6];
        server.reader().read_exact(&mut got).expect("server read");
        client.reader().read_exact(&mut got).expect("client read");
        let Connection::Server(server) = server else {
            unreachable!()
        };
        let secrets = server.dangerous_extract_secrets().expect("secrets");
        let rx = Keys::new(version, secrets.rx.0, &secrets.rx.1).expect("rx keys");
        let tx = Keys::new(version, secrets.tx.0, &secrets.tx.1).expect("tx keys");
        (client, rx, tx)
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// The client's records, fed in `step`-byte reads as `read_records` does
    /// (a partial record moved to the front), give its bytes back in order,
    /// then its `close_notify`.
    fn open_all(rx: &mut Keys, wire: &[u8], step: usize) -> (Vec<u8>, bool) {
        let mut buf = vec![0u8; copy::COPY_BUF_SIZE];
        let (mut have, mut last, mut at) = (0, 0, 0);
        let mut out = Vec::new();
        while at < wire.len() {
            let want = read_limit(&buf[..have], last, buf.len() - have).min(step);
            let n = want.min(wire.len() - at);
            buf[have..have + n].copy_from_slice(&wire[at..at + n]);
            at += n;
            have += n;
            let (run, used, closed) = open_records(rx, &mut buf[..have], &mut last).expect("open");
            out.extend_from_slice(&buf[run]);
            if closed {
                return (out, true);
            }
            buf.copy_within(used..have, 0);
            have -= used;
        }
        assert_eq!(have, 0, "a record left partial");
        (out, false)
    }

    #[test]
    fn records_from_a_rustls_client_open_in_order_in_every_suite() {
        for (suite, version) in SUITES {
            for step in [1, 700, 16 * 1024 + 22, usize::MAX] {
                let (mut client, mut rx, _) = switched(suite, version);
                let data = pattern(70_000);
                let mut wire = Vec::new();
                for chunk in data.chunks(10_000) {
                    client.writer().write_all(chunk).expect("write");
                    while client.wants_write() {
                        client.write_tls(&mut wire).expect("write_tls");
                    }
                }
                client.send_close_notify();
                while client.wants_write() {
                    client.write_tls(&mut wire).expect("write_tls");
                }
                let (got, closed) = open_all(&mut rx, &wire, step);
                assert!(got == data, "{suite:?} step {step}: bytes differ");
                assert!(closed, "{suite:?} step {step}: no close_notify");
            }
        }
    }

    #[test]
    fn records_sealed_here_are_read_by_a_rustls_client_in_every_suite() {
        for (suite, version) in SUITES {
            let (mut client, _, mut tx) = switched(suite, version);
            let data = pattern(3 * MAX_PLAIN + 5);
            let mut wire = Vec::new();
            let mut buf = vec![0u8; copy::COPY_BUF_SIZE];
            let head = tx.head();
            for chunk in data.chunks(MAX_PLAIN).chain([&[][..]]) {
                buf[head..head + chunk.len()].copy_from_slice(chunk);
                let len = tx.seal(RECORD_DATA, &mut buf, chunk.len()).expect("seal");
                wire.extend_from_slice(&buf[..len]);
            }
            buf[head..head + 2].copy_from_slice(&CLOSE_NOTIFY);
            let len = tx.seal(RECORD_ALERT, &mut buf, 2).expect("seal");
            wire.extend_from_slice(&buf[..len]);
            let mut rd = &wire[..];
            let mut got = Vec::new();
            let mut closed = false;
            while !closed {
                assert!(!rd.is_empty(), "{suite:?}: no close_notify");
                client.read_tls(&mut rd).expect("read_tls");
                client
                    .process_new_packets()
                    .expect("the client opens our records");
                let mut b = [0u8; 4096];
                loop {
                    match client.reader().read(&mut b) {
                        Ok(0) => closed = true,
                        Ok(n) => got.extend_from_slice(&b[..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => panic!("{suite:?}: {e}"),
                    }
                    if closed {
                        break;
                    }
                }
            }
            assert!(rd.is_empty(), "{suite:?}: bytes after close_notify");
            assert!(got == data, "{suite:?}: bytes differ");
        }
    }

    #[test]
    fn a_changed_byte_or_a_key_update_ends_the_flow() {
        for (suite, version) in SUITES {
            let (mut client, mut rx, _) = switched(suite, version);
            client.writer().write_all(b"hello").expect("write");
            let mut wire = Vec::new();
            client.write_tls(&mut wire).expect("write_tls");
            let last = wire.len() - 1;
            wire[last] ^= 1;
            let mut l = 0;
            let e = open_records(&mut rx, &mut wire, &mut l).expect_err("tampered");
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{suite:?}");
        }
        let (mut client, mut rx, _) = switched(SUITES[0].0, Version::Tls13);
        client.refresh_traffic_keys().expect("key update");
        let mut wire = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut wire).expect("write_tls");
        }
        let mut l = 0;
        let e = open_records(&mut rx, &mut wire, &mut l).expect_err("KeyUpdate");
        assert!(e.to_string().contains("KeyUpdate"), "{e}");
    }

    #[test]
    fn reads_end_at_record_boundaries_once_a_size_is_known() {
        // Nothing known: all the space.
        assert_eq!(read_limit(&[], 0, 32768), 32768);
        // 16406-byte records: one whole record per read.
        assert_eq!(read_limit(&[], 16406, 32768), 16406);
        // A record's first 100 bytes are in: its rest, then whole records.
        let mut partial = vec![23, 3, 3, 0x40, 0x11];
        partial.resize(100, 0);
        assert_eq!(read_limit(&partial, 16406, 32668), 16306);
        assert_eq!(read_limit(&partial, 1000, 32668), 16306 + 16000);
        // Part of a header: all the space.
        assert_eq!(read_limit(&[23, 3], 16406, 32766), 32766);
    }
}
