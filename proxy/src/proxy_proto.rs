//! The PROXY protocol (HAProxy's `doc/proxy-protocol.txt`, versions 1 and 2):
//! the header a proxy writes first on a server connection to say which client
//! and which local address the connection is for.
//!
//! Owns the header's two wire forms and nothing else: [`encode`] writes one
//! into a stack buffer ([`Encoded`], at most [`V1_MAX`] bytes), [`parse`]
//! reads one from the start of peeked bytes and says how long it is, so the
//! caller consumes exactly the header and not a byte of what follows. Pure:
//! no I/O, no allocation; every length is checked before it is used, so no
//! input can panic or read out of bounds.
//!
//! Reading follows HAProxy 2.6's `conn_recv_proxy`: the header must be whole
//! in the first bytes received (the protocol requires a sender to write it
//! at once, and it is smaller than any TCP segment), so a prefix is
//! [`ParseError::Truncated`] rather than a reason to wait; the errors and
//! their messages are HAProxy's. Two deliberate differences: a v1 line must
//! end within [`V1_MAX`] bytes (the specification's bound; HAProxy scans its
//! whole buffer), and `PROXY UNKNOWN` may carry anything up to its CRLF, as
//! the specification allows (HAProxy accepts only `PROXY UNKNOWN\r\n`).
//! v2 TLVs are checked for framing and skipped; v2 `LOCAL`, v1 `UNKNOWN` and
//! v2 families other than TCP over IPv4/IPv6 keep the connection's own
//! addresses ([`Header::addrs`] is `None`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The v2 signature: the 12 bytes every v2 header starts with.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Longest v1 line, CRLF included (the specification's worst case: `UNKNOWN`
/// followed by two full-length IPv6 addresses and two 5-digit ports).
pub const V1_MAX: usize = 107;
/// The fixed part of a v2 header: signature, version/command, family, length.
pub const V2_FIXED: usize = 16;
/// v2 address block of TCP over IPv4: two addresses, two ports.
const V2_ADDR_INET: usize = 12;
/// v2 address block of TCP over IPv6.
const V2_ADDR_INET6: usize = 36;
/// A TLV's own header: type (1) and length (2).
const TLV_HEADER: usize = 3;
/// Version 2 in the high nibble of the 13th byte.
const V2_VERSION: u8 = 0x20;
const V2_CMD_LOCAL: u8 = 0x00;
const V2_CMD_PROXY: u8 = 0x01;
/// Address family and transport byte: TCP over IPv4, TCP over IPv6, unspecified.
const V2_TCP4: u8 = 0x11;
const V2_TCP6: u8 = 0x21;
const V2_UNSPEC: u8 = 0x00;
/// The shortest v1 line the parser can judge (`PROXY ` and 3 more bytes), as HAProxy.
const V1_SHORTEST: usize = 9;
/// Bytes before a v1 line's first field.
const V1_PREFIX: &[u8] = b"PROXY ";
/// Room for any header [`encode`] writes: a v1 `TCP6` line is at most 104
/// bytes, a v2 TCP6 header 52; the v1 bound covers both.
pub const MAX_ENCODED: usize = V1_MAX;

/// Why bytes are not a PROXY header; `Display` is HAProxy's log message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A prefix of a header, or too few bytes to tell (`CO_ER_PRX_TRUNCATED`).
    #[error("Truncated PROXY protocol header received")]
    Truncated,
    /// Neither `PROXY ` nor the v2 signature (`CO_ER_PRX_NOT_HDR`).
    #[error("Received something which does not look like a PROXY protocol header")]
    NotHeader,
    /// A header whose fields do not parse (`CO_ER_PRX_BAD_HDR`).
    #[error("Received an invalid PROXY protocol header")]
    Invalid,
    /// A v1 protocol other than TCP4, TCP6, UNKNOWN (`CO_ER_PRX_BAD_PROTO`).
    #[error("Received an unhandled protocol in the PROXY protocol header")]
    BadProto,
}

/// A header read from the start of a byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Its length: the bytes to consume before the payload.
    pub len: usize,
    /// The client (source) and the address it reached (destination); `None`
    /// for v2 `LOCAL`, v1 `UNKNOWN` and unsupported families: the connection's
    /// own addresses apply.
    pub addrs: Option<(SocketAddr, SocketAddr)>,
}

/// Which version [`encode`] writes (`send-proxy` / `send-proxy-v2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// An encoded header, on the stack.
#[derive(Clone, Copy)]
pub struct Encoded {
    buf: [u8; MAX_ENCODED],
    len: usize,
}

impl Encoded {
    fn new() -> Self {
        Self {
            buf: [0; MAX_ENCODED],
            len: 0,
        }
    }

    fn push(&mut self, b: &[u8]) {
        // Callers write at most MAX_ENCODED bytes (see `encode`); the bound
        // keeps a mistake from panicking.
        let end = (self.len + b.len()).min(MAX_ENCODED);
        let n = end - self.len;
        self.buf[self.len..end].copy_from_slice(&b[..n]);
        self.len = end;
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for Encoded {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.len + s.len() > MAX_ENCODED {
            return Err(std::fmt::Error);
        }
        self.push(s.as_bytes());
        Ok(())
    }
}

impl std::fmt::Debug for Encoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Encoded({:?})", self.as_bytes())
    }
}

/// The header for a connection from `src` that reached `dst`, as HAProxy's
/// `make_proxy_line`: the same family on both sides gives `TCP4`/`TCP6`;
/// mixed families give `PROXY UNKNOWN` in v1 and, in v2, both addresses as
/// IPv6 (an IPv4 one mapped, `::ffff:a.b.c.d`).
pub fn encode(v: Version, src: SocketAddr, dst: SocketAddr) -> Encoded {
    let mut out = Encoded::new();
    match v {
        Version::V1 => {
            use std::fmt::Write;
            let fam = match (src.ip(), dst.ip()) {
                (IpAddr::V4(_), IpAddr::V4(_)) => "TCP4",
                (IpAddr::V6(_), IpAddr::V6(_)) => "TCP6",
                _ => {
                    out.push(b"PROXY UNKNOWN\r\n");
                    return out;
                }
            };
            // At most V1_MAX bytes by the protocol's own arithmetic.
            let _ = write!(
                out,
                "PROXY {fam} {} {} {} {}\r\n",
                src.ip(),
                dst.ip(),
                src.port(),
                dst.port()
            );
        }
        Version::V2 => {
            out.push(&V2_SIGNATURE);
            out.push(&[V2_VERSION | V2_CMD_PROXY]);
            match (src.ip(), dst.ip()) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    out.push(&[V2_TCP4]);
                    out.push(&(V2_ADDR_INET as u16).to_be_bytes());
                    out.push(&s.octets());
                    out.push(&d.octets());
                }
                (s, d) => {
                    out.push(&[V2_TCP6]);
                    out.push(&(V2_ADDR_INET6 as u16).to_be_bytes());
                    out.push(&as_v6(s).octets());
                    out.push(&as_v6(d).octets());
                }
            }
            out.push(&src.port().to_be_bytes());
            out.push(&dst.port().to_be_bytes());
        }
    }
    out
}

/// The header of a connection made for no client (a health check): v1 the
/// connection's own addresses (`local` → `peer`), as HAProxy's checks send;
/// v2 the `LOCAL` command with no address.
pub fn encode_local(v: Version, local: SocketAddr, peer: SocketAddr) -> Encoded {
    match v {
        Version::V1 => encode(Version::V1, local, peer),
        Version::V2 => encode_unknown(Version::V2),
    }
}

/// The header of a connection whose addresses are unknown: v1 `PROXY
/// UNKNOWN`, v2 `LOCAL`.
pub fn encode_unknown(v: Version) -> Encoded {
    let mut out = Encoded::new();
    match v {
        Version::V1 => out.push(b"PROXY UNKNOWN\r\n"),
        Version::V2 => {
            out.push(&V2_SIGNATURE);
            out.push(&[V2_VERSION | V2_CMD_LOCAL, V2_UNSPEC, 0, 0]);
        }
    }
    out
}

fn as_v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// The header at the start of `buf` (the bytes received so far), v1 or v2 by
/// its first bytes.
pub fn parse(buf: &[u8]) -> Result<Header, ParseError> {
    if buf.len() < V1_PREFIX.len() {
        return Err(ParseError::Truncated);
    }
    if buf.starts_with(V1_PREFIX) {
        return parse_v1(buf);
    }
    parse_v2(buf)
}

fn parse_v1(buf: &[u8]) -> Result<Header, ParseError> {
    if buf.len() < V1_SHORTEST {
        return Err(ParseError::Truncated);
    }
    let window = &buf[..buf.len().min(V1_MAX)];
    let Some(cr) = window.windows(2).position(|w| w == b"\r\n") else {
        return Err(if buf.len() >= V1_MAX {
            ParseError::Invalid
        } else {
            ParseError::Truncated
        });
    };
    let len = cr + 2;
    let line = &buf[V1_PREFIX.len()..cr];
    let (proto, rest) = match line.iter().position(|&b| b == b' ') {
        Some(i) => (&line[..i], Some(&line[i + 1..])),
        None => (line, None),
    };
    let v6 = match proto {
        b"TCP4" => false,
        b"TCP6" => true,
        b"UNKNOWN" => return Ok(Header { len, addrs: None }),
        _ => return Err(ParseError::BadProto),
    };
    let rest = rest.ok_or(ParseError::Invalid)?;
    let text = std::str::from_utf8(rest).map_err(|_| ParseError::Invalid)?;
    let mut f = text.split(' ');
    let (Some(s), Some(d), Some(sp), Some(dp), None) =
        (f.next(), f.next(), f.next(), f.next(), f.next())
    else {
        return Err(ParseError::Invalid);
    };
    let ip = |t: &str| -> Result<IpAddr, ParseError> {
        if v6 {
            t.parse::<Ipv6Addr>().map(IpAddr::V6)
        } else {
            t.parse::<Ipv4Addr>().map(IpAddr::V4)
        }
        .map_err(|_| ParseError::Invalid)
    };
    let src = SocketAddr::new(ip(s)?, port(sp)?);
    let dst = SocketAddr::new(ip(d)?, port(dp)?);
    Ok(Header {
        len,
        addrs: Some((src, dst)),
    })
}

/// A v1 port: decimal digits only, 0..=65535.
fn port(t: &str) -> Result<u16, ParseError> {
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::Invalid);
    }
    t.parse().map_err(|_| ParseError::Invalid)
}

fn parse_v2(buf: &[u8]) -> Result<Header, ParseError> {
    if buf.len() < V2_FIXED {
        return Err(ParseError::Truncated);
    }
    if buf[..12] != V2_SIGNATURE || buf[12] & 0xf0 != V2_VERSION {
        return Err(ParseError::NotHeader);
    }
    let body = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    let len = V2_FIXED + body;
    if buf.len() < len {
        return Err(ParseError::Truncated);
    }
    let block = &buf[V2_FIXED..len];
    match buf[12] & 0x0f {
        V2_CMD_LOCAL => Ok(Header { len, addrs: None }),
        V2_CMD_PROXY => {
            let (addrs, used) = match buf[13] {
                V2_TCP4 => {
                    let a = block.get(..V2_ADDR_INET).ok_or(ParseError::Invalid)?;
                    let ip =
                        |o: usize| IpAddr::V4(Ipv4Addr::new(a[o], a[o + 1], a[o + 2], a[o + 3]));
                    let pt = |o: usize| u16::from_be_bytes([a[o], a[o + 1]]);
                    (
                        Some((
                            SocketAddr::new(ip(0), pt(8)),
                            SocketAddr::new(ip(4), pt(10)),
                        )),
                        V2_ADDR_INET,
                    )
                }
                V2_TCP6 => {
                    let a = block.get(..V2_ADDR_INET6).ok_or(ParseError::Invalid)?;
                    let ip = |o: usize| {
                        let mut b = [0u8; 16];
                        b.copy_from_slice(&a[o..o + 16]);
                        IpAddr::V6(Ipv6Addr::from(b))
                    };
                    let pt = |o: usize| u16::from_be_bytes([a[o], a[o + 1]]);
                    (
                        Some((
                            SocketAddr::new(ip(0), pt(32)),
                            SocketAddr::new(ip(16), pt(34)),
                        )),
                        V2_ADDR_INET6,
                    )
                }
                // UNIX, UDP, unspecified: the connection's own addresses, and
                // the block (whatever it holds) is skipped whole.
                _ => return Ok(Header { len, addrs: None }),
            };
            skip_tlvs(&block[used..])?;
            Ok(Header { len, addrs })
        }
        _ => Err(ParseError::Invalid),
    }
}

/// The TLVs after the addresses must tile the rest of the block exactly.
fn skip_tlvs(mut rest: &[u8]) -> Result<(), ParseError> {
    while !rest.is_empty() {
        let Some(h) = rest.get(..TLV_HEADER) else {
            return Err(ParseError::Invalid);
        };
        let n = TLV_HEADER + usize::from(u16::from_be_bytes([h[1], h[2]]));
        rest = rest.get(n..).ok_or(ParseError::Invalid)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn v1_lines_are_haproxys() {
        let e = encode(Version::V1, sa("10.1.2.3:5555"), sa("192.168.0.1:80"));
        assert_eq!(e.as_bytes(), b"PROXY TCP4 10.1.2.3 192.168.0.1 5555 80\r\n");
        let e = encode(Version::V1, sa("[2001:db8::1]:1"), sa("[::1]:443"));
        assert_eq!(e.as_bytes(), b"PROXY TCP6 2001:db8::1 ::1 1 443\r\n");
        let e = encode(Version::V1, sa("10.0.0.1:1"), sa("[::1]:2"));
        assert_eq!(e.as_bytes(), b"PROXY UNKNOWN\r\n");
    }

    #[test]
    fn the_longest_v1_lines() {
        let a = sa("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535");
        let e = encode(Version::V1, a, a);
        assert_eq!(e.as_bytes().len(), 104);
        let h = parse(e.as_bytes()).expect("parses");
        assert_eq!(
            h,
            Header {
                len: 104,
                addrs: Some((a, a))
            }
        );
        // The specification's worst case, 107 bytes, is an UNKNOWN line.
        let f = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";
        let line = format!("PROXY UNKNOWN {f} {f} 65535 65535\r\n");
        assert_eq!(line.len(), V1_MAX);
        assert_eq!(
            parse(line.as_bytes()),
            Ok(Header {
                len: V1_MAX,
                addrs: None
            })
        );
        // One byte more and the CRLF is past the bound.
        let line = format!("PROXY UNKNOWN {f} {f} 65535 655350\r\n");
        assert_eq!(parse(line.as_bytes()), Err(ParseError::Invalid));
    }

    #[test]
    fn v2_headers_have_the_right_lengths_and_round_trip() {
        let (s4, d4) = (sa("10.1.2.3:5555"), sa("192.168.0.1:80"));
        let e = encode(Version::V2, s4, d4);
        let b = e.as_bytes();
        assert_eq!(b.len(), V2_FIXED + V2_ADDR_INET);
        assert_eq!(&b[..12], &V2_SIGNATURE);
        assert_eq!(&b[12..16], &[0x21, 0x11, 0, 12]);
        assert_eq!(&b[16..20], &[10, 1, 2, 3]);
        assert_eq!(&b[24..26], &5555u16.to_be_bytes());
        assert_eq!(
            parse(b),
            Ok(Header {
                len: 28,
                addrs: Some((s4, d4))
            })
        );

        let (s6, d6) = (sa("[2001:db8::1]:1"), sa("[::1]:443"));
        let e = encode(Version::V2, s6, d6);
        assert_eq!(e.as_bytes().len(), V2_FIXED + V2_ADDR_INET6);
        assert_eq!(&e.as_bytes()[12..16], &[0x21, 0x21, 0, 36]);
        assert_eq!(
            parse(e.as_bytes()),
            Ok(Header {
                len: 52,
                addrs: Some((s6, d6))
            })
        );

        // Mixed families: both as IPv6.
        let e = encode(Version::V2, sa("10.0.0.1:7"), d6);
        let h = parse(e.as_bytes()).expect("parses");
        assert_eq!(h.addrs, Some((sa("[::ffff:10.0.0.1]:7"), d6)));
    }

    #[test]
    fn local_headers() {
        let (l, p) = (sa("127.0.0.1:4000"), sa("127.0.0.1:80"));
        let e = encode_local(Version::V2, l, p);
        assert_eq!(&e.as_bytes()[12..], &[0x20, 0, 0, 0]);
        assert_eq!(
            parse(e.as_bytes()),
            Ok(Header {
                len: 16,
                addrs: None
            })
        );
        let e = encode_local(Version::V1, l, p);
        assert_eq!(e.as_bytes(), b"PROXY TCP4 127.0.0.1 127.0.0.1 4000 80\r\n");
        let e = encode_unknown(Version::V1);
        assert_eq!(
            parse(e.as_bytes()),
            Ok(Header {
                len: 15,
                addrs: None
            })
        );
    }

    #[test]
    fn only_the_header_is_claimed_payload_stays() {
        let mut b = b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\nPROXY TCP4 9.9.9.9".to_vec();
        assert_eq!(parse(&b).map(|h| h.len), Ok(32));
        let e = encode(Version::V2, sa("1.2.3.4:1"), sa("5.6.7.8:2"));
        b = [e.as_bytes(), b"payload"].concat();
        assert_eq!(parse(&b).map(|h| h.len), Ok(28));
    }

    #[test]
    fn every_prefix_of_a_header_is_truncated() {
        let v1 = encode(Version::V1, sa("10.1.2.3:5555"), sa("192.168.0.1:80"));
        let v2 = encode(Version::V2, sa("10.1.2.3:5555"), sa("192.168.0.1:80"));
        for e in [v1, v2] {
            let b = e.as_bytes();
            for n in 0..b.len() {
                assert_eq!(
                    parse(&b[..n]),
                    Err(ParseError::Truncated),
                    "{n} bytes of {b:?}"
                );
            }
        }
    }

    #[test]
    fn wrong_signatures_and_garbage() {
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            Err(ParseError::NotHeader)
        );
        let mut e = encode(Version::V2, sa("1.2.3.4:1"), sa("5.6.7.8:2"))
            .as_bytes()
            .to_vec();
        e[3] ^= 1;
        assert_eq!(parse(&e), Err(ParseError::NotHeader));
        // Version 1 in the v2 nibble.
        let mut e = encode(Version::V2, sa("1.2.3.4:1"), sa("5.6.7.8:2"))
            .as_bytes()
            .to_vec();
        e[12] = 0x11;
        assert_eq!(parse(&e), Err(ParseError::NotHeader));
        // An unknown command.
        e[12] = 0x2f;
        assert_eq!(parse(&e), Err(ParseError::Invalid));
        // Lower case is not the prefix.
        assert_eq!(
            parse(b"proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n"),
            Err(ParseError::NotHeader)
        );
    }

    #[test]
    fn bad_v1_lines() {
        for bad in [
            &b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n"[..],
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
            b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.256 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 ::1 ::1 1 2\r\n",
            b"PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n",
            b"PROXY TCP4\r\n",
        ] {
            assert_eq!(
                parse(bad),
                Err(ParseError::Invalid),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            parse(b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n"),
            Err(ParseError::BadProto)
        );
        // No CRLF within 107 bytes.
        let long = [b"PROXY TCP4 ".as_slice(), &[b'1'; 120]].concat();
        assert_eq!(parse(&long), Err(ParseError::Invalid));
    }

    #[test]
    fn unknown_keeps_the_real_addresses() {
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\nabc"),
            Ok(Header {
                len: 15,
                addrs: None
            })
        );
        let with = b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n";
        assert_eq!(
            parse(with),
            Ok(Header {
                len: with.len(),
                addrs: None
            })
        );
    }

    #[test]
    fn v2_tlvs_are_skipped_and_their_framing_checked() {
        let e = encode(Version::V2, sa("1.2.3.4:1"), sa("5.6.7.8:2"));
        let tlvs: &[u8] = &[0x01, 0, 2, b'h', b'2', 0xe0, 0, 0];
        let mut b = e.as_bytes().to_vec();
        b[15] = (12 + tlvs.len()) as u8;
        b.extend_from_slice(tlvs);
        b.extend_from_slice(b"data");
        let h = parse(&b).expect("parses");
        assert_eq!(h.len, 28 + tlvs.len());
        assert_eq!(h.addrs, Some((sa("1.2.3.4:1"), sa("5.6.7.8:2"))));
        // A TLV longer than the block.
        let mut bad = e.as_bytes().to_vec();
        bad[15] = 12 + 4;
        bad.extend_from_slice(&[0x01, 0, 9, 0]);
        assert_eq!(parse(&bad), Err(ParseError::Invalid));
        // An address block too short for its family.
        let mut short = e.as_bytes()[..16].to_vec();
        short[15] = 4;
        short.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(parse(&short), Err(ParseError::Invalid));
    }

    #[test]
    fn v2_unsupported_families_keep_the_real_addresses() {
        // UNIX stream (0x31) with a 216-byte block.
        let mut b = V2_SIGNATURE.to_vec();
        b.extend_from_slice(&[0x21, 0x31, 0, 216]);
        b.extend_from_slice(&[0u8; 216]);
        assert_eq!(
            parse(&b),
            Ok(Header {
                len: 232,
                addrs: None
            })
        );
    }

    #[test]
    fn haproxys_messages() {
        assert_eq!(
            ParseError::NotHeader.to_string(),
            "Received something which does not look like a PROXY protocol header"
        );
        assert_eq!(
            ParseError::Truncated.to_string(),
            "Truncated PROXY protocol header received"
        );
    }
}
