//! `req.ssl_sni`: the server name a TLS ClientHello asks for, read from the bytes a
//! client sent first (peeked, never consumed: they are forwarded untouched).
//!
//! Also `req.ssl_hello_type` and `req.ssl_ver` ([`hello_type`],
//! [`hello_version`]), read from the same first bytes.
//!
//! Owns the ClientHello walk and nothing else: pure, no I/O, no allocation beyond the
//! returned name. Every length is checked against what is left before it is used, so
//! no input can panic or read out of bounds (tested with random and truncated inputs).
//!
//! Scope, as HAProxy's `req.ssl_sni`: the ClientHello must sit in the first TLS record
//! (a handshake split over several records is treated as malformed, which routes to
//! the default); SSLv2-compatible hellos are malformed. Names are returned in ASCII
//! lower case, since DNS names compare case-insensitively.
//!
//! Why not a crate: the maintained parsers (`tls-parser` and friends) decode the whole
//! TLS grammar over `nom`; this needs one field from one message, and a hundred
//! audited lines bound the work better than a dependency tree.

/// TLS record header: type (1), version (2), length (2).
pub const RECORD_HEADER: usize = 5;
/// Largest TLS plaintext record (RFC 8446 §5.1: 2^14 bytes).
pub const MAX_RECORD: usize = 16 * 1024;
/// Most bytes a ClientHello can need: one full record with its header. Peek buffers
/// are sized by it.
pub const MAX_HELLO_BYTES: usize = RECORD_HEADER + MAX_RECORD;

/// Record content type `handshake`.
const CONTENT_HANDSHAKE: u8 = 0x16;
/// Handshake message type `client_hello`.
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
/// Extension `server_name` (RFC 6066 §3).
const EXT_SERVER_NAME: u16 = 0;
/// `NameType` `host_name`.
const NAME_HOST: u8 = 0;
/// Longest DNS name (RFC 1035: 255 octets on the wire, 253 as text).
const MAX_NAME: usize = 255;
/// Length of the ClientHello random.
const RANDOM_LEN: usize = 32;
/// Longest legacy session id.
const MAX_SESSION_ID: usize = 32;

/// Why no name could be read (yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SniError {
    /// The bytes so far are a valid prefix of a ClientHello; more are needed.
    #[error("incomplete TLS ClientHello")]
    NeedMore,
    /// The bytes are not a ClientHello shunt can read.
    #[error("malformed TLS ClientHello")]
    Malformed,
}

/// A bounds-checked cursor over a byte slice; every short read is `Malformed`.
struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SniError> {
        if n > self.buf.len() {
            return Err(SniError::Malformed);
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, SniError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, SniError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a 1-byte length prefix.
    fn vec8(&mut self) -> Result<&'a [u8], SniError> {
        let n = usize::from(self.u8()?);
        self.take(n)
    }

    /// A vector with a 2-byte length prefix.
    fn vec16(&mut self) -> Result<&'a [u8], SniError> {
        let n = usize::from(self.u16()?);
        self.take(n)
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// Bytes `req.ssl_hello_type` needs before it can answer: the record header
/// and the handshake header (type and 3-byte length).
const HELLO_TYPE_HEAD: usize = RECORD_HEADER + 4;
/// Bytes `req.ssl_ver` needs: the handshake header and the hello's version.
const HELLO_VERSION_HEAD: usize = HELLO_TYPE_HEAD + 2;
/// Record content types of TLS (change_cipher_spec, alert, handshake,
/// application_data), which HAProxy's `req.ssl_hello_type` takes as a TLS
/// record header.
const CONTENT_TYPES: std::ops::RangeInclusive<u8> = 0x14..=0x17;

/// `req.ssl_hello_type`: the handshake message type of the first TLS record
/// (1 for a ClientHello), once the whole message is there. `Malformed` for
/// bytes that are no TLS record (or a record too short to hold a handshake
/// header), `NeedMore` for a valid prefix.
pub fn hello_type(buf: &[u8]) -> Result<u8, SniError> {
    match buf.first() {
        None => return Err(SniError::NeedMore),
        Some(t) if CONTENT_TYPES.contains(t) => {}
        Some(_) => return Err(SniError::Malformed),
    }
    let Some(head) = buf.get(..HELLO_TYPE_HEAD) else {
        return Err(SniError::NeedMore);
    };
    if head[1] < 3 || usize::from(u16::from_be_bytes([head[3], head[4]])) < 4 {
        return Err(SniError::Malformed);
    }
    let hs_len = (usize::from(head[6]) << 16) | (usize::from(head[7]) << 8) | usize::from(head[8]);
    if buf.len() < HELLO_TYPE_HEAD + hs_len {
        return Err(SniError::NeedMore);
    }
    Ok(head[5])
}

/// `req.ssl_ver`: the version a TLS ClientHello announces (`client_version`,
/// `major << 8 | minor`; TLS 1.0 is 3.1, and a TLS 1.3 client says 3.3), or
/// the record's version for another handshake message.
pub fn hello_version(buf: &[u8]) -> Result<u16, SniError> {
    match buf.first() {
        None => return Err(SniError::NeedMore),
        Some(&CONTENT_HANDSHAKE) => {}
        Some(_) => return Err(SniError::Malformed),
    }
    let Some(head) = buf.get(..HELLO_VERSION_HEAD) else {
        return Err(SniError::NeedMore);
    };
    if head[1] != 3 {
        return Err(SniError::Malformed);
    }
    Ok(if head[5] == HANDSHAKE_CLIENT_HELLO {
        u16::from_be_bytes([head[9], head[10]])
    } else {
        u16::from_be_bytes([head[1], head[2]])
    })
}

/// The server name in the ClientHello at the start of `buf`: `Ok(Some(name))`,
/// `Ok(None)` for a complete hello without one, `Err(NeedMore)` while `buf` is a
/// valid but incomplete prefix, `Err(Malformed)` otherwise.
pub fn parse_sni(buf: &[u8]) -> Result<Option<String>, SniError> {
    // Record header, checked byte by byte so a short prefix can be judged early.
    match buf.first() {
        None => return Err(SniError::NeedMore),
        Some(&CONTENT_HANDSHAKE) => {}
        Some(_) => return Err(SniError::Malformed),
    }
    if let Some(&major) = buf.get(1) {
        if major != 3 {
            return Err(SniError::Malformed);
        }
    }
    if buf.len() < RECORD_HEADER {
        return Err(SniError::NeedMore);
    }
    let rec_len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if rec_len == 0 || rec_len > MAX_RECORD {
        return Err(SniError::Malformed);
    }
    // The handshake type is known as soon as the record's first byte arrives.
    if let Some(&t) = buf.get(RECORD_HEADER) {
        if t != HANDSHAKE_CLIENT_HELLO {
            return Err(SniError::Malformed);
        }
    }
    let Some(record) = buf.get(RECORD_HEADER..RECORD_HEADER + rec_len) else {
        return Err(SniError::NeedMore);
    };
    let mut rec = Cursor { buf: record };
    rec.u8()?; // handshake type, checked above
    let hs = rec.take(3)?;
    let hs_len = (usize::from(hs[0]) << 16) | (usize::from(hs[1]) << 8) | usize::from(hs[2]);
    // A hello larger than its record continues in the next one: not supported.
    let body = rec.take(hs_len)?;
    client_hello_sni(body)
}

/// Walk a ClientHello body (after the handshake header) to its `server_name`.
fn client_hello_sni(body: &[u8]) -> Result<Option<String>, SniError> {
    let mut c = Cursor { buf: body };
    let version = c.u16()?;
    if version >> 8 != 3 {
        return Err(SniError::Malformed);
    }
    c.take(RANDOM_LEN)?;
    if c.vec8()?.len() > MAX_SESSION_ID {
        return Err(SniError::Malformed);
    }
    let suites = c.vec16()?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(SniError::Malformed);
    }
    if c.vec8()?.is_empty() {
        return Err(SniError::Malformed);
    }
    if c.is_empty() {
        // No extensions at all (legal before TLS 1.3).
        return Ok(None);
    }
    let mut exts = Cursor { buf: c.vec16()? };
    if !c.is_empty() {
        return Err(SniError::Malformed);
    }
    let mut found = None;
    while !exts.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec16()?;
        if kind == EXT_SERVER_NAME {
            if found.is_some() {
                // RFC 8446 §4.2: one extension of each type at most.
                return Err(SniError::Malformed);
            }
            found = Some(server_name(data)?);
        }
    }
    Ok(found.flatten())
}

/// The `host_name` of a `server_name` extension body, lower-cased.
fn server_name(data: &[u8]) -> Result<Option<String>, SniError> {
    let mut c = Cursor { buf: data };
    let mut list = Cursor { buf: c.vec16()? };
    if !c.is_empty() {
        return Err(SniError::Malformed);
    }
    while !list.is_empty() {
        let kind = list.u8()?;
        let name = list.vec16()?;
        if kind != NAME_HOST {
            continue;
        }
        if name.is_empty() || name.len() > MAX_NAME || !name.iter().all(|b| b.is_ascii_graphic()) {
            return Err(SniError::Malformed);
        }
        let text = name.iter().map(|b| char::from(b.to_ascii_lowercase()));
        return Ok(Some(text.collect()));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A minimal TLS 1.2-style ClientHello, with a `server_name` for `sni` when given,
    /// plus one unrelated extension before it.
    pub fn client_hello(sni: Option<&str>) -> Vec<u8> {
        let mut exts = Vec::new();
        // supported_groups (10): x25519.
        exts.extend_from_slice(&[0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x1d]);
        if let Some(name) = sni {
            let n = name.len() as u16;
            exts.extend_from_slice(&0u16.to_be_bytes());
            exts.extend_from_slice(&(n + 5).to_be_bytes());
            exts.extend_from_slice(&(n + 3).to_be_bytes());
            exts.push(0);
            exts.extend_from_slice(&n.to_be_bytes());
            exts.extend_from_slice(name.as_bytes());
        }
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[0x42; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]); // one suite
        body.extend_from_slice(&[0x01, 0x00]); // null compression
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![HANDSHAKE_CLIENT_HELLO];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![CONTENT_HANDSHAKE, 0x03, 0x01];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn hello_type_and_version_as_haproxy_reads_them() {
        let h = client_hello(Some("a.example"));
        assert_eq!(hello_type(&h), Ok(HANDSHAKE_CLIENT_HELLO));
        // The hello's own version (3.3), not the record's (3.1).
        assert_eq!(hello_version(&h), Ok(0x0303));
        for cut in [0, 1, 5, 8, h.len() - 1] {
            assert_eq!(hello_type(&h[..cut]), Err(SniError::NeedMore), "cut {cut}");
        }
        assert_eq!(hello_version(&h[..10]), Err(SniError::NeedMore));
        assert_eq!(
            hello_version(&h[..11]),
            Ok(0x0303),
            "the version is known early"
        );
        assert_eq!(hello_type(b"GET / HTTP/1.1\r\n"), Err(SniError::Malformed));
        assert_eq!(
            hello_version(b"\x17\x03\x03\x00\x10xxxxxxxxxx"),
            Err(SniError::Malformed)
        );
        // A record too short to hold a handshake header is no hello.
        assert_eq!(
            hello_type(b"\x16\x03\x01\x00\x02\x01\x00\x00\x00"),
            Err(SniError::Malformed)
        );
    }

    #[test]
    fn reads_the_name_lower_cased() {
        let h = client_hello(Some("A.Example.COM"));
        assert_eq!(parse_sni(&h), Ok(Some("a.example.com".to_string())));
        // Trailing bytes (the next records) do not matter.
        let mut more = h.clone();
        more.extend_from_slice(b"\x17\x03\x03\x00\x01x");
        assert_eq!(parse_sni(&more), Ok(Some("a.example.com".to_string())));
    }

    #[test]
    fn complete_hello_without_name() {
        assert_eq!(parse_sni(&client_hello(None)), Ok(None));
    }

    #[test]
    fn every_strict_prefix_needs_more() {
        let h = client_hello(Some("b.test"));
        for n in 0..h.len() {
            assert_eq!(parse_sni(&h[..n]), Err(SniError::NeedMore), "prefix {n}");
        }
    }

    #[test]
    fn garbage_is_malformed_at_once() {
        assert_eq!(parse_sni(b"GET / HTTP/1.1\r\n"), Err(SniError::Malformed));
        assert_eq!(parse_sni(b"\x16\x02"), Err(SniError::Malformed));
        // A record longer than TLS allows.
        assert_eq!(parse_sni(b"\x16\x03\x01\xff\xff"), Err(SniError::Malformed));
        // Not a ClientHello (ServerHello = 2).
        assert_eq!(
            parse_sni(b"\x16\x03\x01\x00\x10\x02"),
            Err(SniError::Malformed)
        );
    }

    #[test]
    fn inner_lengths_are_checked() {
        let h = client_hello(Some("b.test"));
        // Handshake length larger than the record.
        let mut bad = h.clone();
        bad[8] = bad[8].wrapping_add(1);
        assert_eq!(parse_sni(&bad), Err(SniError::Malformed));
        // Name with a space.
        let bad = client_hello(Some("b test"));
        assert_eq!(parse_sni(&bad), Err(SniError::Malformed));
    }

    #[test]
    fn random_and_mutated_inputs_never_panic() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5e1);
        let good = client_hello(Some("fuzz.example.org"));
        let mut seen_ok = 0;
        for i in 0..20_000 {
            let input: Vec<u8> = if i % 2 == 0 {
                let n = rng.gen_range(0..300);
                let mut v: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                if i % 4 == 0 && !v.is_empty() {
                    v[0] = CONTENT_HANDSHAKE;
                }
                v
            } else {
                let mut v = good.clone();
                for _ in 0..rng.gen_range(1..4) {
                    let at = rng.gen_range(0..v.len());
                    v[at] = rng.gen();
                }
                let cut = rng.gen_range(0..=v.len());
                v.truncate(cut);
                v
            };
            if let Ok(Some(name)) = parse_sni(&input) {
                assert!(name.len() <= MAX_NAME);
                seen_ok += 1;
            }
        }
        // Some mutations leave the hello readable: the walk is exercised to the end.
        assert!(seen_ok > 0);
    }
}
