//! kTLS's raw calls: attaching the `tls` ULP to a TCP socket, handing it one
//! direction's keys (`SOL_TLS`/`TLS_TX`|`TLS_RX`), and the two record-typed
//! calls a kTLS socket needs beside plain `read`/`write`: a `recvmsg` that
//! learns each record's content type (`TLS_GET_RECORD_TYPE`), so an alert is
//! read rather than failing the read with EIO, and a `sendmsg` of an alert
//! record (`TLS_SET_RECORD_TYPE`), for `close_notify`.
//!
//! Owns: the `tls12_crypto_info_*` layouts (libc's structs, sizes asserted
//! here) built from plain bytes; which key, IV and sequence number go where
//! is the caller's (`handoff::ktls`), which knows the TLS library.
//! Must not: keep state, log, or decide policy (as the rest of `sys`).

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::sock::setsockopt_raw;

/// TLS record content types (RFC 8446 §5.1) the kTLS socket reports.
pub const RECORD_ALERT: u8 = 21;
pub const RECORD_HANDSHAKE: u8 = 22;
pub const RECORD_DATA: u8 = 23;

/// An alert's payload: warning level (1), `close_notify` (0).
pub const CLOSE_NOTIFY: [u8; 2] = [1, 0];

/// The AEADs kTLS takes from rustls' suites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cipher {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

impl Cipher {
    pub const ALL: [Cipher; 3] = [
        Cipher::Aes128Gcm,
        Cipher::Aes256Gcm,
        Cipher::Chacha20Poly1305,
    ];

    /// The key length the kernel's layout holds.
    pub const fn key_len(self) -> usize {
        match self {
            Cipher::Aes128Gcm => libc::TLS_CIPHER_AES_GCM_128_KEY_SIZE,
            Cipher::Aes256Gcm => libc::TLS_CIPHER_AES_GCM_256_KEY_SIZE,
            Cipher::Chacha20Poly1305 => libc::TLS_CIPHER_CHACHA20_POLY1305_KEY_SIZE,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Cipher::Aes128Gcm => "AES-128-GCM",
            Cipher::Aes256Gcm => "AES-256-GCM",
            Cipher::Chacha20Poly1305 => "CHACHA20-POLY1305",
        }
    }

    const fn bit(self) -> u8 {
        match self {
            Cipher::Aes128Gcm => 1,
            Cipher::Aes256Gcm => 2,
            Cipher::Chacha20Poly1305 => 4,
        }
    }
}

/// A set of [`Cipher`]s (the ones the kernel accepted when probed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ciphers(u8);

impl Ciphers {
    pub const NONE: Ciphers = Ciphers(0);

    pub fn with(self, c: Cipher) -> Self {
        Ciphers(self.0 | c.bit())
    }

    pub fn has(self, c: Cipher) -> bool {
        self.0 & c.bit() != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// The TLS versions kTLS knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Tls12,
    Tls13,
}

impl Version {
    const fn raw(self) -> u16 {
        match self {
            Version::Tls12 => libc::TLS_1_2_VERSION,
            Version::Tls13 => libc::TLS_1_3_VERSION,
        }
    }
}

/// Which half of a socket's TLS a [`CryptoInfo`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Tx,
    Rx,
}

// The kernel reads these layouts byte for byte: no padding anywhere (two u16
// then byte arrays), so a size mismatch would mean another layout.
const _: () = assert!(mem::size_of::<libc::tls12_crypto_info_aes_gcm_128>() == 40);
const _: () = assert!(mem::size_of::<libc::tls12_crypto_info_aes_gcm_256>() == 56);
const _: () = assert!(mem::size_of::<libc::tls12_crypto_info_chacha20_poly1305>() == 56);

/// One direction's `crypto_info`, as `setsockopt(SOL_TLS, TLS_TX|TLS_RX)`
/// takes it.
pub enum CryptoInfo {
    Aes128Gcm(libc::tls12_crypto_info_aes_gcm_128),
    Aes256Gcm(libc::tls12_crypto_info_aes_gcm_256),
    Chacha20Poly1305(libc::tls12_crypto_info_chacha20_poly1305),
}

/// A key or salt of the wrong length for the cipher.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{cipher} wants a {want}-byte key, got {got}")]
pub struct KeyLength {
    pub cipher: &'static str,
    pub want: usize,
    pub got: usize,
}

/// Copies `from` into a fixed array (lengths checked by the caller).
fn arr<const N: usize>(from: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(from);
    a
}

impl CryptoInfo {
    /// The layout for `cipher` in `version`: `key`, the 12-byte `nonce` base
    /// the kernel derives its nonces from (AES-GCM: the first 4 bytes are the
    /// salt, the last 8 the IV field; ChaCha20-Poly1305: all 12 are the IV)
    /// and `seq`, the next record's sequence number (big-endian, as on the
    /// wire's AAD).
    pub fn new(
        cipher: Cipher,
        version: Version,
        key: &[u8],
        nonce: &[u8; 12],
        seq: u64,
    ) -> Result<Self, KeyLength> {
        if key.len() != cipher.key_len() {
            return Err(KeyLength {
                cipher: cipher.name(),
                want: cipher.key_len(),
                got: key.len(),
            });
        }
        let info = libc::tls_crypto_info {
            version: version.raw(),
            cipher_type: match cipher {
                Cipher::Aes128Gcm => libc::TLS_CIPHER_AES_GCM_128,
                Cipher::Aes256Gcm => libc::TLS_CIPHER_AES_GCM_256,
                Cipher::Chacha20Poly1305 => libc::TLS_CIPHER_CHACHA20_POLY1305,
            },
        };
        let rec_seq = seq.to_be_bytes();
        let (salt, iv) = nonce.split_at(4);
        Ok(match cipher {
            Cipher::Aes128Gcm => Self::Aes128Gcm(libc::tls12_crypto_info_aes_gcm_128 {
                info,
                iv: arr(iv),
                key: arr(key),
                salt: arr(salt),
                rec_seq,
            }),
            Cipher::Aes256Gcm => Self::Aes256Gcm(libc::tls12_crypto_info_aes_gcm_256 {
                info,
                iv: arr(iv),
                key: arr(key),
                salt: arr(salt),
                rec_seq,
            }),
            Cipher::Chacha20Poly1305 => {
                Self::Chacha20Poly1305(libc::tls12_crypto_info_chacha20_poly1305 {
                    info,
                    iv: *nonce,
                    key: arr(key),
                    salt: [],
                    rec_seq,
                })
            }
        })
    }

    /// The bytes the kernel reads.
    pub fn as_bytes(&self) -> &[u8] {
        let (ptr, len): (*const u8, usize) = match self {
            Self::Aes128Gcm(c) => (
                (c as *const libc::tls12_crypto_info_aes_gcm_128).cast(),
                mem::size_of_val(c),
            ),
            Self::Aes256Gcm(c) => (
                (c as *const libc::tls12_crypto_info_aes_gcm_256).cast(),
                mem::size_of_val(c),
            ),
            Self::Chacha20Poly1305(c) => (
                (c as *const libc::tls12_crypto_info_chacha20_poly1305).cast(),
                mem::size_of_val(c),
            ),
        };
        // SAFETY: `ptr` points to the live struct borrowed from `self` for the
        // returned slice's lifetime, `len` is its size, and every one of its
        // bytes is initialized: it is two u16 and byte arrays with no padding
        // (the sizes are asserted above).
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }
}

impl Drop for CryptoInfo {
    /// The keys do not outlive their handing to the kernel in this memory.
    fn drop(&mut self) {
        match self {
            Self::Aes128Gcm(c) => c.key.fill(0),
            Self::Aes256Gcm(c) => c.key.fill(0),
            Self::Chacha20Poly1305(c) => c.key.fill(0),
        }
    }
}

/// `setsockopt(TCP_ULP, "tls")`: the socket must be established; ENOENT
/// when the kernel has no `tls` module.
pub fn set_ulp(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_raw(fd, libc::IPPROTO_TCP, libc::TCP_ULP, &b"tls"[..])
}

/// Hands one direction's keys to the kernel (after [`set_ulp`]); from then
/// on that direction's reads (or writes) are plaintext. Once per direction.
pub fn set_crypto(fd: BorrowedFd<'_>, dir: Direction, info: &CryptoInfo) -> io::Result<()> {
    let name = match dir {
        Direction::Tx => libc::TLS_TX,
        Direction::Rx => libc::TLS_RX,
    };
    setsockopt_raw(fd, libc::SOL_TLS, name, info.as_bytes())
}

/// What one [`recv`] read.
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// `n` plaintext bytes of data records (0: TCP EOF).
    Data(usize),
    /// The whole payload (`n` bytes, at the start of the buffer) of one
    /// record of another content type: an alert, a handshake message.
    Control { kind: u8, n: usize },
}

/// Room for one `TLS_GET_RECORD_TYPE` control message (a `cmsghdr` and one
/// byte, aligned): 24 bytes on 64-bit Linux; over-sized for safety.
const CMSG_ROOM: usize = 64;

/// `recvmsg(MSG_DONTWAIT)` on a kTLS RX socket, with room for the record
/// type: a data read never runs into the next non-data record (the kernel
/// stops before it), and a non-data record is returned alone.
pub fn recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    // u64 elements: `cmsghdr` alignment.
    let mut cbuf = [0u64; CMSG_ROOM / 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is a valid one (no name, no iov yet).
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = mem::size_of_val(&cbuf) as _;
    // SAFETY: `fd` is borrowed, hence open; `msg` points to `iov` (which
    // describes `buf`) and to `cbuf`, all live and writable for the call,
    // with their exact lengths.
    let rc = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = rc as usize;
    let mut kind = None;
    // SAFETY: `msg` was filled by the kernel: CMSG_FIRSTHDR/NXTHDR walk
    // `cbuf` within `msg_controllen`, and a header they return is inside it,
    // with its data (one byte for TLS_GET_RECORD_TYPE) after it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_TLS && (*c).cmsg_type == libc::TLS_GET_RECORD_TYPE {
                kind = Some(*libc::CMSG_DATA(c));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(match kind {
        Some(k) if k != RECORD_DATA => Received::Control { kind: k, n },
        _ => Received::Data(n),
    })
}

/// Sends one alert record carrying `payload` (`MSG_DONTWAIT`: EAGAIN when
/// the send buffer is full); true once the kernel took it whole.
pub fn send_alert(fd: BorrowedFd<'_>, payload: &[u8; 2]) -> io::Result<bool> {
    let mut cbuf = [0u64; CMSG_ROOM / 8];
    let mut data = *payload;
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: an all-zero msghdr is a valid one (no name, no iov yet).
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a length.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(1) } as _;
    // SAFETY: `cbuf` is CMSG_ROOM bytes, more than CMSG_SPACE(1), so the
    // first header and its one data byte are inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_TLS;
        (*c).cmsg_type = libc::TLS_SET_RECORD_TYPE;
        (*c).cmsg_len = libc::CMSG_LEN(1) as _;
        *libc::CMSG_DATA(c) = RECORD_ALERT;
    }
    // SAFETY: `fd` is borrowed, hence open; `msg` points to `iov` (over
    // `data`) and `cbuf`, live for the call, with their lengths; the kernel
    // only reads them.
    let rc = unsafe {
        libc::sendmsg(
            fd.as_raw_fd(),
            &msg,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize == payload.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY16: [u8; 16] = [
        0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e,
        0x0f,
    ];
    const NONCE: [u8; 12] = [
        0xa0, 0xa1, 0xa2, 0xa3, 0xb0, 0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7,
    ];

    #[test]
    fn aes128_tls13_layout_is_the_kernels() {
        let c = CryptoInfo::new(Cipher::Aes128Gcm, Version::Tls13, &KEY16, &NONCE, 0x0102)
            .expect("key length");
        let mut want = Vec::new();
        want.extend_from_slice(&0x0304u16.to_ne_bytes());
        want.extend_from_slice(&51u16.to_ne_bytes());
        want.extend_from_slice(&NONCE[4..]); // iv
        want.extend_from_slice(&KEY16); // key
        want.extend_from_slice(&NONCE[..4]); // salt
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x01, 0x02]); // rec_seq
        assert_eq!(c.as_bytes(), &want[..]);
    }

    #[test]
    fn aes256_tls12_layout_is_the_kernels() {
        let key = [7u8; 32];
        let c = CryptoInfo::new(Cipher::Aes256Gcm, Version::Tls12, &key, &NONCE, 1)
            .expect("key length");
        let b = c.as_bytes();
        assert_eq!(b.len(), 56);
        assert_eq!(&b[..2], &0x0303u16.to_ne_bytes());
        assert_eq!(&b[2..4], &52u16.to_ne_bytes());
        assert_eq!(&b[4..12], &NONCE[4..]);
        assert_eq!(&b[12..44], &key);
        assert_eq!(&b[44..48], &NONCE[..4]);
        assert_eq!(&b[48..], &1u64.to_be_bytes());
    }

    #[test]
    fn chacha_takes_the_whole_nonce_as_iv() {
        let key = [9u8; 32];
        let c = CryptoInfo::new(Cipher::Chacha20Poly1305, Version::Tls13, &key, &NONCE, 5)
            .expect("key length");
        let b = c.as_bytes();
        assert_eq!(b.len(), 56);
        assert_eq!(&b[2..4], &54u16.to_ne_bytes());
        assert_eq!(&b[4..16], &NONCE);
        assert_eq!(&b[16..48], &key);
        assert_eq!(&b[48..], &5u64.to_be_bytes());
    }

    #[test]
    fn a_key_of_the_wrong_length_is_refused() {
        let e = CryptoInfo::new(Cipher::Aes256Gcm, Version::Tls13, &KEY16, &NONCE, 0)
            .err()
            .expect("refused");
        assert_eq!((e.want, e.got), (32, 16));
    }

    #[test]
    fn cipher_sets() {
        let s = Ciphers::NONE.with(Cipher::Aes256Gcm);
        assert!(s.has(Cipher::Aes256Gcm) && !s.has(Cipher::Aes128Gcm) && !s.is_empty());
        assert!(Ciphers::NONE.is_empty());
    }
}
