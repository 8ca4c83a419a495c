//! The TLS termination scenario's load (`tls`): a self-signed certificate for the
//! proxies' `bind ... ssl crt`, full handshakes from a few client threads, and a bulk
//! push through a terminated flow to a sink that reports what it received.
//!
//! Owns: the certificate (ECDSA P-256, rcgen, written as one PEM file holding the chain
//! and the key, as HAProxy's `crt` and nginx's `ssl_certificate`/`_key` both read it),
//! the rustls client configuration (that certificate as the only root, session
//! resumption off so every connection pays a full handshake), and the two load loops.
//! Invariants: every handshake is checked by a 16-byte echo through the flow, every push
//! by the sink's byte count; every loop is bounded by a deadline and by its count.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rustls::pki_types::{CertificateDer, ServerName};

use xtask::proc;

/// The name the certificate is for and the clients ask for (SNI).
const NAME: &str = "bench.shunt.test";
/// Payload of the echo that checks each handshake's flow.
const PING: &[u8; 16] = b"shunt-bench-tls\n";
/// Plaintext written per TLS write of the push (rustls splits it into 16 KiB records).
const PUSH_CHUNK: usize = 256 * 1024;
/// Socket timeout of every client connection.
const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// The certificate the proxies serve.
pub struct Cert {
    /// Chain and key in one PEM file.
    pub pem: PathBuf,
    der: CertificateDer<'static>,
}

impl Cert {
    /// A fresh self-signed ECDSA P-256 certificate for [`NAME`], written under `dir`.
    pub fn make(dir: &Path) -> Result<Self> {
        let key = rcgen::KeyPair::generate().context("cannot generate a key")?;
        let params = rcgen::CertificateParams::new(vec![NAME.to_string()])
            .context("certificate parameters")?;
        let cert = params.self_signed(&key).context("cannot sign")?;
        let pem = dir.join("tls-bench.pem");
        std::fs::write(&pem, format!("{}{}", cert.pem(), key.serialize_pem()))
            .with_context(|| format!("cannot write {}", pem.display()))?;
        Ok(Cert {
            pem,
            der: cert.der().clone(),
        })
    }

    /// The clients' configuration: this certificate as the only root, every
    /// connection a full handshake (no tickets, no session IDs).
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.der.clone())
            .context("the certificate as a root")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.resumption = rustls::client::Resumption::disabled();
        Ok(Arc::new(cfg))
    }
}

type Client = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

fn connect(front: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> Result<Client> {
    let tcp = TcpStream::connect_timeout(&front, IO_TIMEOUT)
        .with_context(|| format!("cannot connect to {front}"))?;
    tcp.set_read_timeout(Some(IO_TIMEOUT))?;
    tcp.set_write_timeout(Some(IO_TIMEOUT))?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(NAME).context("server name")?;
    let conn = rustls::ClientConnection::new(cfg.clone(), name).context("TLS client")?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn
            .complete_io(&mut s.sock)
            .with_context(|| format!("TLS handshake through {front}"))?;
    }
    Ok(s)
}

/// What one handshake run measured.
pub struct Handshakes {
    /// Each connection's time from connect to its echo, sorted.
    pub times: Vec<Duration>,
    pub elapsed: Duration,
    /// The cipher suite the last connection agreed on.
    pub suite: String,
}

/// `count` connections from `clients` threads through `front` to an echo backend: each
/// connects, completes a full handshake, echoes [`PING`] and closes.
pub fn handshakes(
    front: SocketAddr,
    cfg: &Arc<rustls::ClientConfig>,
    count: usize,
    clients: usize,
    limit: Duration,
) -> Result<Handshakes> {
    let started = Instant::now();
    let deadline = started + limit;
    let clients = clients.max(1);
    let per = count.div_ceil(clients);
    let results: Vec<Result<(Vec<Duration>, String)>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..clients)
            .map(|_| {
                s.spawn(move || -> Result<(Vec<Duration>, String)> {
                    let mut times = Vec::with_capacity(per);
                    let mut suite = String::new();
                    for _ in 0..per {
                        ensure!(!proc::stop_requested(), "interrupted");
                        ensure!(
                            Instant::now() < deadline,
                            "{} of {per} handshakes through {front} within {limit:?}",
                            times.len()
                        );
                        let t0 = Instant::now();
                        let mut c = connect(front, cfg)?;
                        c.write_all(PING).context("TLS write")?;
                        let mut back = [0u8; PING.len()];
                        c.read_exact(&mut back).context("TLS read of the echo")?;
                        ensure!(&back == PING, "the echo through {front} differs");
                        times.push(t0.elapsed());
                        if let Some(cs) = c.conn.negotiated_cipher_suite() {
                            suite = format!("{:?}", cs.suite());
                        }
                        c.conn.send_close_notify();
                        let _ = c.flush();
                        let _ = c.sock.shutdown(Shutdown::Both);
                    }
                    Ok((times, suite))
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("client thread panicked")))
            })
            .collect()
    });
    let elapsed = started.elapsed();
    let mut times = Vec::with_capacity(per * clients);
    let mut suite = String::new();
    for r in results {
        let (t, s) = r?;
        times.extend(t);
        suite = s;
    }
    times.sort();
    Ok(Handshakes {
        times,
        elapsed,
        suite,
    })
}

/// Writes `size` bytes over one TLS connection through `front` to a reporting sink,
/// closes (close_notify, FIN) and waits for the sink's count through the flow; the
/// time from the end of the handshake to that count.
pub fn push(
    front: SocketAddr,
    cfg: &Arc<rustls::ClientConfig>,
    size: u64,
    limit: Duration,
) -> Result<Duration> {
    let deadline = Instant::now() + limit;
    let mut c = connect(front, cfg)?;
    let chunk: Vec<u8> = (0..PUSH_CHUNK).map(|i| (i * 7 + 3) as u8).collect();
    let started = Instant::now();
    let mut left = size;
    while left > 0 {
        ensure!(!proc::stop_requested(), "interrupted");
        ensure!(
            Instant::now() < deadline,
            "TLS push through {front}: {left} of {size} bytes unsent within {limit:?}"
        );
        let n = usize::try_from(left).unwrap_or(PUSH_CHUNK).min(PUSH_CHUNK);
        c.write_all(&chunk[..n]).context("TLS write")?;
        left -= n as u64;
    }
    c.conn.send_close_notify();
    c.flush().context("TLS flush")?;
    c.sock.shutdown(Shutdown::Write).context("FIN")?;
    let mut answer = Vec::new();
    match c.read_to_end(&mut answer) {
        Ok(_) => {}
        // A peer that closes without its own close_notify after the count.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && answer.len() >= 8 => {}
        Err(e) => return Err(e).context(format!("TLS push through {front}: the count")),
    }
    let elapsed = started.elapsed();
    let Ok(got) = <[u8; 8]>::try_from(answer.as_slice()) else {
        bail!(
            "TLS push through {front}: expected an 8-byte count, got {} bytes",
            answer.len()
        );
    };
    let got = u64::from_be_bytes(got);
    ensure!(
        got == size,
        "TLS push through {front}: sent {size} bytes, the sink received {got}"
    );
    Ok(elapsed)
}
