//! TLS termination seen from outside (issue 17): `bind ... ssl crt` in front of
//! plain and TLS servers, through the real binary.
//!
//! Checks that the decrypted bytes cross byte-exact both ways with a client
//! half-close (close_notify, then FIN) and are what `show stat` counts; that
//! `server ... ssl verify required ca-file` reaches a TLS echo server and that a
//! server whose certificate the CA did not sign fails the flow (logged); that the
//! SNI of the terminated handshake picks the certificate and the backend; that
//! ALPN is negotiated; that a bad certificate is a configuration error at its
//! line; and that a reload (a new process) serves a certificate file's new
//! contents. Health checks over TLS (`check-ssl`, a `ssl` server's checks,
//! `tcp-check connect ssl`) report HAProxy 2.6's layer-6 statuses and texts,
//! compared with HAProxy's own `show stat` on the same configuration when it
//! is installed. Certificates are made per test with rcgen; the clients and
//! the TLS echo server are tokio-rustls.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use shunt_tests::reload::{pid_in, plain, reload_global};
use shunt_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// Bytes each way in the bulk test: many TLS records, several socket buffers.
const BULK: usize = 8 << 20;
/// Bound on any one client operation.
const IO_LIMIT: Duration = Duration::from_secs(30);

/// A test CA and the leaf certificates it signs.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(cn: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, cn);
        let cert = p.self_signed(&key).expect("self-sign CA");
        Ca { cert, key }
    }

    /// A leaf for `names`: (PEM of certificate then key, the certificate's DER).
    fn leaf(&self, names: &[&str]) -> (String, Vec<u8>) {
        let key = KeyPair::generate().expect("leaf key");
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let p = CertificateParams::new(names).expect("leaf params");
        let cert = p.signed_by(&key, &self.cert, &self.key).expect("sign leaf");
        (
            format!("{}{}", cert.pem(), key.serialize_pem()),
            cert.der().to_vec(),
        )
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }

    fn der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS client trusting `ca`, offering `alpn`.
fn client_config(ca: &Ca, alpn: &[&str]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der()).expect("add root");
    let mut c = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    c.alpn_protocols = alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
    Arc::new(c)
}

type Client = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// Connect to shunt at `addr` and finish the handshake for `sni`.
async fn tls_connect(addr: SocketAddr, sni: &str, cfg: Arc<rustls::ClientConfig>) -> Client {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to shunt");
    let name = ServerName::try_from(sni.to_string()).expect("server name");
    tokio::time::timeout(
        IO_LIMIT,
        tokio_rustls::TlsConnector::from(cfg).connect(name, tcp),
    )
    .await
    .expect("handshake in time")
    .expect("handshake with shunt")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Send `data`, close (close_notify + FIN), and read until EOF, concurrently.
async fn exchange(s: Client, data: &[u8]) -> Vec<u8> {
    let (mut rd, mut wr) = tokio::io::split(s);
    let write = async {
        for chunk in data.chunks(100_000) {
            wr.write_all(chunk).await.expect("write through shunt");
        }
        wr.shutdown().await.expect("close_notify + FIN");
    };
    let read = async {
        let mut got = Vec::with_capacity(data.len());
        rd.read_to_end(&mut got).await.expect("read until EOF");
        got
    };
    let ((), got) = tokio::time::timeout(IO_LIMIT, async { tokio::join!(write, read) })
        .await
        .expect("exchange in time");
    got
}

/// The one byte a tagged echo server starts with, then an echo of `msg`.
async fn tag_and_echo(mut s: Client, msg: &[u8]) -> (u8, Vec<u8>) {
    let mut tag = [0u8; 1];
    s.read_exact(&mut tag).await.expect("server tag");
    s.write_all(msg).await.expect("write");
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).await.expect("echo");
    (tag[0], back)
}

/// Writes `pem` to `dir/name`; returns the path.
fn write(dir: &Path, name: &str, pem: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, pem).expect("write pem");
    p.display().to_string()
}

const DEFAULTS: &str = "defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n";

/// A TLS echo server on 127.0.0.1 port 0 serving `pem` (certificate + key).
struct TlsEcho {
    addr: SocketAddr,
    _thread: std::thread::JoinHandle<()>,
}

impl TlsEcho {
    fn start(pem: &str) -> TlsEcho {
        let certs: Vec<CertificateDer<'static>> =
            rustls::pki_types::pem::PemObject::pem_slice_iter(pem.as_bytes())
                .collect::<Result<_, _>>()
                .expect("certs");
        let key: PrivateKeyDer<'static> =
            rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes()).expect("key");
        let cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server cert");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind TLS echo");
        l.set_nonblocking(true).expect("nonblocking");
        let addr = l.local_addr().expect("addr");
        let thread = std::thread::spawn(move || {
            rt().block_on(async move {
                let l = tokio::net::TcpListener::from_std(l).expect("listener");
                let local = tokio::task::LocalSet::new();
                local
                    .run_until(async move {
                        loop {
                            let Ok((s, _)) = l.accept().await else { return };
                            let acceptor = acceptor.clone();
                            tokio::task::spawn_local(async move {
                                let Ok(tls) = acceptor.accept(s).await else {
                                    return;
                                };
                                let (mut r, mut w) = tokio::io::split(tls);
                                if tokio::io::copy(&mut r, &mut w).await.is_ok() {
                                    let _ = w.shutdown().await;
                                }
                            });
                        }
                    })
                    .await;
            })
        });
        TlsEcho {
            addr,
            _thread: thread,
        }
    }
}

/// shunt terminating TLS for `a.test` on one port (frontend `fe`, backend
/// `be` with server `s1`: an echo server), with an admin stats socket.
struct Terminating {
    ca: Ca,
    port: u16,
    shunt: Shunt,
    _certs: TempDir,
    _echo: Option<Server>,
}

impl Terminating {
    fn start(name: &str) -> Self {
        let echo = Server::echo();
        let mut t = Self::to(name, echo.addr);
        t._echo = Some(echo);
        t
    }

    /// As [`Terminating::start`], in front of `backend` instead of an echo.
    fn to(name: &str, backend: SocketAddr) -> Self {
        let ca = Ca::new("shunt test CA");
        let certs = TempDir::new(name);
        let (pem, _) = ca.leaf(&["a.test"]);
        let crt = write(certs.path(), "a.pem", &pem);
        let port = free_port();
        let cfg = format!(
            "global\n    stats socket @DIR@/admin.sock level admin\n\n{DEFAULTS}\
             frontend fe\n    bind 127.0.0.1:{port} ssl crt {crt}\n    default_backend be\n\n\
             backend be\n    server s1 {backend}\n"
        );
        let shunt = Shunt::start(&cfg, &[]);
        Self {
            ca,
            port,
            shunt,
            _certs: certs,
            _echo: None,
        }
    }
}

#[test]
fn terminated_bytes_cross_exactly_both_ways_with_half_close_and_are_counted() {
    let t = Terminating::start("tls-bulk");
    let (ca, port, shunt) = (&t.ca, t.port, &t.shunt);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let data = pattern(BULK, 17);
    let got = rt().block_on(async {
        let s = tls_connect(addr, "a.test", client_config(ca, &[])).await;
        exchange(s, &data).await
    });
    assert_eq!(got.len(), data.len(), "bytes echoed back");
    assert_eq!(sha256(&got), sha256(&data), "echoed bytes differ");
    // HAProxy counts the decrypted stream: exactly the payload each way.
    let sock = shunt.sock();
    eventually("bin/bout counted", Duration::from_secs(10), || {
        stat(&sock, "fe", "FRONTEND", "bin") == BULK as u64
            && stat(&sock, "fe", "FRONTEND", "bout") == BULK as u64
    });
    assert_eq!(stat(&sock, "be", "s1", "bin"), BULK as u64);
    let info = show_info(&sock);
    let (ktls, flows, notice) = expected_ktls();
    assert_eq!(
        info.get("Ktls").map(String::as_str),
        Some(ktls),
        "show info: {info:?}"
    );
    assert_eq!(
        info.get("KtlsFlows").map(String::as_str),
        Some(flows),
        "show info: {info:?}"
    );
    assert!(
        shunt.stderr().contains(notice),
        "start-up notice missing:\n{}",
        shunt.stderr()
    );
    println!("Ktls: {ktls}; KtlsFlows: {flows}; {BULK} bytes each way, SHA-256 equal");
}

/// Through shunt at `addr` (a `bind ... ssl` listener that rejects a
/// request starting `QUIT`, in front of an echo server): a `QUIT` in one
/// record and one split over two records 300 ms apart are closed without a
/// byte; 1 MiB, and `PA` alone for 300 ms then 1 MiB, come back exactly.
async fn judged_then_passed(addr: SocketAddr, ca: &Ca, data: &[u8]) {
    async fn rejected(addr: SocketAddr, ca: &Ca, parts: &[&[u8]]) -> Vec<u8> {
        let mut s = tls_connect(addr, "a.test", client_config(ca, &[])).await;
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            s.write_all(part).await.expect("write");
            s.flush().await.expect("flush");
        }
        let mut got = Vec::new();
        let _ = tokio::time::timeout(IO_LIMIT, s.read_to_end(&mut got))
            .await
            .expect("closed in time");
        got
    }
    let whole = rejected(addr, ca, &[b"QUIT now\r\n"]).await;
    assert!(whole.is_empty(), "a rejected client got {whole:?}");
    let split = rejected(addr, ca, &[b"QU", b"IT\r\n"]).await;
    assert!(split.is_empty(), "a rejected client (split) got {split:?}");

    let s = tls_connect(addr, "a.test", client_config(ca, &[])).await;
    let passed = exchange(s, data).await;
    assert_eq!(passed.len(), data.len(), "bytes echoed back");
    assert_eq!(sha256(&passed), sha256(data), "echoed bytes differ");

    let s = tls_connect(addr, "a.test", client_config(ca, &[])).await;
    let (mut rd, mut wr) = tokio::io::split(s);
    let write = async {
        wr.write_all(b"PA").await.expect("write");
        wr.flush().await.expect("flush");
        tokio::time::sleep(Duration::from_millis(300)).await;
        wr.write_all(data).await.expect("write");
        wr.shutdown().await.expect("close_notify + FIN");
    };
    let read = async {
        let mut got = Vec::new();
        rd.read_to_end(&mut got).await.expect("read until EOF");
        got
    };
    let ((), split_passed) = tokio::time::timeout(IO_LIMIT, async { tokio::join!(write, read) })
        .await
        .expect("exchange in time");
    let mut want = b"PA".to_vec();
    want.extend_from_slice(data);
    assert_eq!(split_passed.len(), want.len(), "bytes echoed back (split)");
    assert_eq!(
        sha256(&split_passed),
        sha256(&want),
        "echoed bytes differ (split)"
    );
}

/// `tcp-request content` on a `bind ... ssl` listener judges the decrypted
/// request, as HAProxy's rules judge its buffer, and waits within the
/// inspect-delay for bytes that come in a later record; the bytes it read
/// reach the server first, then the rest, each once: in front of a plain
/// server (the flow leaves rustls for shunt's records, or kTLS) and of a
/// TLS server (the flow stays in rustls).
#[test]
fn content_rules_on_a_terminated_listener_judge_the_plaintext_and_lose_no_byte() {
    let ca = Ca::new("shunt test CA");
    let dir = TempDir::new("tls-content");
    let (front, _) = ca.leaf(&["a.test"]);
    let crt = write(dir.path(), "front.pem", &front);
    let (back, _) = ca.leaf(&["backend.test"]);
    let tls_echo = TlsEcho::start(&back);
    let echo = Server::echo();
    let (p1, p2) = (free_port(), free_port());
    let rules = "    tcp-request inspect-delay 3s\n    \
                 tcp-request content reject if { req.payload(0,4) -m str QUIT }\n";
    let cfg = format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n\n{DEFAULTS}\
         frontend plain\n    bind 127.0.0.1:{p1} ssl crt {crt}\n{rules}    default_backend plain\n\n\
         frontend tls\n    bind 127.0.0.1:{p2} ssl crt {crt}\n{rules}    default_backend tls\n\n\
         backend plain\n    server s {}\n\n\
         backend tls\n    server s {} ssl verify none\n",
        echo.addr, tls_echo.addr
    );
    let shunt = Shunt::start(&cfg, &[]);
    let data = pattern(1 << 20, 29);
    let sock = shunt.sock();
    for (fe, port) in [("plain", p1), ("tls", p2)] {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        rt().block_on(judged_then_passed(addr, &ca, &data));
        assert_eq!(
            stat(&sock, fe, "FRONTEND", "dreq"),
            2,
            "{fe}: both rejects counted"
        );
        eventually("bin counted", Duration::from_secs(10), || {
            stat(&sock, fe, "FRONTEND", "bin") == (2 * data.len() + 2) as u64
        });
        println!("{fe}: 2 rejects, 2 MiB passed byte-exact");
    }
}

/// A server that takes nothing for a while: the plaintext shunt decrypted
/// waits (in rustls, on the direct path) and every byte still arrives once,
/// in order, then the FIN; the server's answer (its count and digest) comes
/// back.
#[test]
fn a_server_that_reads_late_still_gets_every_terminated_byte_in_order() {
    use std::io::{Read, Write};
    const SIZE: usize = 24 << 20;
    const LATE: Duration = Duration::from_millis(800);
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind late reader");
    let backend = l.local_addr().expect("addr");
    let reader = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(IO_LIMIT)).expect("timeout");
        std::thread::sleep(LATE);
        let mut got = Vec::with_capacity(SIZE);
        s.read_to_end(&mut got).expect("read until FIN");
        let answer = format!("{} {}", got.len(), sha256(&got));
        s.write_all(answer.as_bytes()).expect("answer");
    });
    let t = Terminating::to("tls-late-reader", backend);
    let (ca, shunt) = (&t.ca, &t.shunt);
    let port = t.port;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let data = pattern(SIZE, 29);
    let started = Instant::now();
    let got = rt().block_on(async {
        let s = tls_connect(addr, "a.test", client_config(ca, &[])).await;
        exchange(s, &data).await
    });
    reader.join().expect("late reader");
    assert!(started.elapsed() >= LATE, "the server read late");
    assert_eq!(
        String::from_utf8_lossy(&got),
        format!("{SIZE} {}", sha256(&data)),
        "what the server received"
    );
    let sock = shunt.sock();
    eventually("bin counted", Duration::from_secs(10), || {
        stat(&sock, "fe", "FRONTEND", "bin") == SIZE as u64
    });
}

/// Idle terminated TLS flows hold neither rustls' state (they left it after
/// the handshake for shunt's records, or kTLS) nor a copy buffer: after
/// bytes crossed both ways, each of `FLOWS` idle flows adds under `BOUND` to
/// shunt's resident size. Measured 2026-12-07: 8.4 KiB per flow; 11.5
/// while rustls kept the flow, 19.4 when a direction also kept a 16 KiB
/// buffer for the flow's life (HAProxy with OpenSSL: 17.5).
#[test]
fn idle_tls_flows_hold_neither_rustls_state_nor_a_copy_buffer() {
    use std::io::{Read, Write};
    const FLOWS: usize = 400;
    const BOUND: u64 = 10 * 1024;
    // Two descriptors per flow here (client, backend) and in shunt.
    // SAFETY: plain getrlimit/setrlimit on this process's own limit.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    // Deep: a burst of FLOWS connects must not overflow the accept queue.
    let l = listen_deep("127.0.0.1:0".parse().expect("addr")).expect("bind holding backend");
    let backend = l.local_addr().expect("addr");
    // Accepts every flow, reads its 5 bytes, answers 2, then holds it.
    let holder = std::thread::spawn(move || {
        let mut held = Vec::with_capacity(FLOWS);
        for _ in 0..FLOWS {
            let (mut s, _) = l.accept().expect("accept");
            s.set_read_timeout(Some(IO_LIMIT)).expect("timeout");
            let mut hello = [0u8; 5];
            s.read_exact(&mut hello).expect("the client's bytes");
            s.write_all(b"hi").expect("answer");
            held.push(s);
        }
        held
    });
    let t = Terminating::to("tls-idle", backend);
    let (ca, shunt) = (&t.ca, &t.shunt);
    let port = t.port;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let rt = rt();
    let cfg = client_config(ca, &[]);
    // One flow first, so that what every flow shares (the worker's buffer
    // cache, rustls' session state) is in the base.
    let first = rt.block_on(async {
        let mut s = tls_connect(addr, "a.test", cfg.clone()).await;
        s.write_all(b"hello").await.expect("write");
        let mut hi = [0u8; 2];
        s.read_exact(&mut hi).await.expect("answer");
        s
    });
    std::thread::sleep(Duration::from_millis(300));
    let base = vm_rss(shunt.pid());
    let clients = rt.block_on(async {
        let mut all = Vec::with_capacity(FLOWS);
        for _ in 1..FLOWS {
            let mut s = tls_connect(addr, "a.test", cfg.clone()).await;
            s.write_all(b"hello").await.expect("write");
            let mut hi = [0u8; 2];
            s.read_exact(&mut hi).await.expect("answer");
            all.push(s);
        }
        all
    });
    let held = holder.join().expect("holding backend");
    std::thread::sleep(Duration::from_millis(300));
    let grown = vm_rss(shunt.pid()).saturating_sub(base);
    let per_flow = grown / (FLOWS as u64 - 1);
    println!(
        "{} idle TLS flows: shunt grew by {} KiB, {per_flow} B per flow",
        FLOWS - 1,
        grown / 1024
    );
    assert!(
        per_flow < BOUND,
        "an idle TLS flow holds {per_flow} B (bound {BOUND}): still in rustls, or a copy buffer kept while idle?"
    );
    drop((first, clients, held));
}

/// What `show info` (`Ktls`, `KtlsFlows` after one flow) and the start-up
/// notice must say about kTLS on this kernel: read after shunt started, whose
/// probe may have loaded a modular `tls` (then listed). With it, the flow is
/// the kernel's (`cargo xtask ktls-vm` runs this test on such a kernel).
fn expected_ktls() -> (&'static str, &'static str, &'static str) {
    let ulps = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp").unwrap_or_default();
    if ulps.split_whitespace().any(|u| u == "tls") {
        (
            "available (TLS flows handed to the kernel)",
            "1",
            "TLS flows are handed to the kernel (kTLS)",
        )
    } else {
        (
            "no tls ULP (TLS flows forwarded in userspace)",
            "0",
            "TLS flows are forwarded in userspace",
        )
    }
}

/// When [`closing_client`] sends its data, close_notify and FIN.
#[derive(Clone, Copy, Debug)]
enum Closing {
    /// With its last handshake flight (TLS 1.3: its Finished), as a client
    /// that writes a few bytes and closes at once: shunt has barely finished
    /// its handshake when the FIN is in, the moment it would hand the flow
    /// to kTLS (which the kernel then refuses: the flow stays in rustls).
    WithFinished,
    /// Once shunt is switching: TLS 1.3, as the server's NewSessionTickets
    /// come in (shunt sends them after attaching the ULP, before the keys);
    /// TLS 1.2, which has none, 100 ms after the handshake. The records and
    /// FIN then reach a kTLS socket, or one about to be.
    AfterTickets,
}

/// A client that sends `data`, its close_notify and its FIN together (one
/// write, then SHUT_WR) at the moment `when` says, then reads to the end.
/// `Err` says what broke: a reset, a close without close_notify, a TLS error.
fn closing_client(
    addr: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
    data: &[u8],
    when: Closing,
) -> Result<Vec<u8>, String> {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    tcp.set_read_timeout(Some(IO_LIMIT))
        .map_err(|e| format!("read timeout: {e}"))?;
    let name = ServerName::try_from("a.test").expect("server name");
    let mut c = rustls::ClientConnection::new(cfg, name).map_err(|e| format!("client: {e}"))?;
    while c.is_handshaking() {
        if c.wants_write() {
            c.write_tls(&mut tcp)
                .map_err(|e| format!("handshake write: {e}"))?;
        } else {
            let n = c
                .read_tls(&mut tcp)
                .map_err(|e| format!("handshake read: {e}"))?;
            if n == 0 {
                return Err("shunt closed during the handshake".into());
            }
            c.process_new_packets()
                .map_err(|e| format!("handshake: {e}"))?;
        }
    }
    if let Closing::AfterTickets = when {
        while c.wants_write() {
            c.write_tls(&mut tcp)
                .map_err(|e| format!("Finished: {e}"))?;
        }
        if c.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3) {
            let n = c.read_tls(&mut tcp).map_err(|e| format!("tickets: {e}"))?;
            if n == 0 {
                return Err("shunt closed before its tickets".into());
            }
            c.process_new_packets()
                .map_err(|e| format!("tickets: {e}"))?;
        } else {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // WithFinished, TLS 1.3: the Finished is still queued, ahead of the data.
    c.writer()
        .write_all(data)
        .map_err(|e| format!("plaintext: {e}"))?;
    c.send_close_notify();
    let mut out = Vec::new();
    while c.wants_write() {
        c.write_tls(&mut out).map_err(|e| format!("records: {e}"))?;
    }
    tcp.write_all(&out)
        .map_err(|e| format!("write all at once: {e}"))?;
    tcp.shutdown(std::net::Shutdown::Write)
        .map_err(|e| format!("FIN: {e}"))?;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    'records: loop {
        let n = c
            .read_tls(&mut tcp)
            .map_err(|e| format!("read after {} of {} bytes: {e}", got.len(), data.len()))?;
        c.process_new_packets()
            .map_err(|e| format!("TLS after {} bytes: {e}", got.len()))?;
        loop {
            match c.reader().read(&mut buf) {
                Ok(0) => break 'records,
                Ok(k) => got.extend_from_slice(&buf[..k]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(format!("plaintext after {} bytes: {e}", got.len())),
            }
        }
        if n == 0 {
            return Err(format!(
                "TCP EOF without close_notify after {} of {} bytes",
                got.len(),
                data.len()
            ));
        }
    }
    // After close_notify, the TCP stream must end with FIN, not RST.
    match tcp.read(&mut buf) {
        Ok(0) => Ok(got),
        Ok(k) => Err(format!("{k} bytes after close_notify")),
        Err(e) => Err(format!("after close_notify, not FIN: {e}")),
    }
}

/// A client trusting `ca` that speaks TLS 1.2 only.
fn client_config_tls12(ca: &Ca) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der()).expect("add root");
    let c = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS12])
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(c)
}

/// Rounds per TLS version and [`Closing`] of the early-closing client: the
/// instant its FIN lands against shunt's switch to kTLS varies, so several
/// are tried.
const CLOSING_ROUNDS: usize = 6;

#[test]
fn a_client_that_closes_right_after_its_handshake_gets_every_byte_and_a_fin() {
    let t = Terminating::start("tls-closing");
    let (ca, port, shunt) = (&t.ca, t.port, &t.shunt);
    let sock = shunt.sock();
    let ktls_flows = || -> u64 {
        show_info(&sock)
            .get("KtlsFlows")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut sent = 0u64;
    for when in [Closing::WithFinished, Closing::AfterTickets] {
        let before = ktls_flows();
        for (version, cfg) in [
            ("TLS 1.3", client_config(ca, &[])),
            ("TLS 1.2", client_config_tls12(ca)),
        ] {
            for round in 0..CLOSING_ROUNDS {
                // One byte, one record, two records (above 2^14).
                let len = [1, 700, 20_000][round % 3];
                let data = pattern(len, round as u64);
                let got = closing_client(addr, cfg.clone(), &data, when).unwrap_or_else(|e| {
                    panic!(
                        "{when:?} {version} round {round} ({len} bytes): {e}\nshunt:\n{}",
                        plain(&shunt.stderr())
                    )
                });
                assert!(
                    got == data,
                    "{when:?} {version} round {round}: {} bytes back, not the {len} sent",
                    got.len()
                );
                sent += len as u64;
            }
        }
        // Which flows the kernel took depends on when each FIN came in:
        // shown, not asserted (the bulk test asserts that its flow was).
        println!(
            "{when:?}: {} flows, {} of them taken by kTLS",
            2 * CLOSING_ROUNDS,
            ktls_flows() - before
        );
    }
    eventually("bin counted", Duration::from_secs(10), || {
        stat(&sock, "fe", "FRONTEND", "bin") == sent
    });
    assert_eq!(stat(&sock, "fe", "FRONTEND", "bout"), sent);
}

#[test]
fn alpn_is_negotiated_in_the_listeners_order() {
    let ca = Ca::new("shunt test CA");
    let certs = TempDir::new("tls-alpn");
    let (pem, _) = ca.leaf(&["a.test"]);
    let crt = write(certs.path(), "a.pem", &pem);
    let echo = Server::echo();
    let port = free_port();
    let cfg = format!(
        "{DEFAULTS}frontend fe\n    bind 127.0.0.1:{port} ssl crt {crt} alpn h2,http/1.1 ssl-min-ver TLSv1.2\n    default_backend be\n\n\
         backend be\n    server s1 {}\n",
        echo.addr
    );
    let _shunt = Shunt::start(&cfg, &[]);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    rt().block_on(async {
        let both = tls_connect(addr, "a.test", client_config(&ca, &["http/1.1", "h2"])).await;
        assert_eq!(both.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let old = tls_connect(addr, "a.test", client_config(&ca, &["http/1.1"])).await;
        assert_eq!(old.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
        // And the flow still forwards.
        let got = exchange(old, b"ping").await;
        assert_eq!(got, b"ping");
    });
}

#[test]
fn sni_of_the_terminated_handshake_picks_certificate_and_backend() {
    let ca = Ca::new("shunt test CA");
    let certs = TempDir::new("tls-sni");
    let (a, _) = ca.leaf(&["a.test"]);
    let (b, _) = ca.leaf(&["b.test", "*.w.test"]);
    let crt_a = write(certs.path(), "a.pem", &a);
    let crt_b = write(certs.path(), "b.pem", &b);
    let servers: Vec<Server> = (0..2).map(Server::tagged_echo).collect();
    let port = free_port();
    let cfg = format!(
        "{DEFAULTS}frontend fe\n    bind 127.0.0.1:{port} ssl crt {crt_a} crt {crt_b}\n\
         \x20   use_backend bb if {{ req.ssl_sni -i b.test }} || {{ req.ssl_sni -m end .w.test }}\n\
         \x20   default_backend aa\n\n\
         backend aa\n    server s {}\n\nbackend bb\n    server s {}\n",
        servers[0].addr, servers[1].addr
    );
    let _shunt = Shunt::start(&cfg, &[]);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // The client checks the name: a handshake for b.test succeeds only with
    // certificate b, so each line also proves the certificate chosen.
    rt().block_on(async {
        for (sni, tag) in [("a.test", 0u8), ("b.test", 1), ("x.w.test", 1)] {
            let s = tls_connect(addr, sni, client_config(&ca, &[])).await;
            let (got, back) = tag_and_echo(s, sni.as_bytes()).await;
            assert_eq!(got, tag, "SNI {sni} reached the wrong backend");
            assert_eq!(back, sni.as_bytes());
        }
    });
}

#[test]
fn server_ssl_verify_required_reaches_a_tls_server_and_refuses_a_wrong_ca() {
    let ca = Ca::new("shunt test CA");
    let other = Ca::new("some other CA");
    let dir = TempDir::new("tls-upstream");
    let (front, _) = ca.leaf(&["a.test"]);
    let crt = write(dir.path(), "front.pem", &front);
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let (good, _) = ca.leaf(&["backend.test"]);
    let (bad, _) = other.leaf(&["backend.test"]);
    let good_srv = TlsEcho::start(&good);
    let bad_srv = TlsEcho::start(&bad);
    let (p1, p2) = (free_port(), free_port());
    let cfg = format!(
        "{DEFAULTS}frontend good\n    bind 127.0.0.1:{p1} ssl crt {crt}\n    default_backend good\n\n\
         frontend bad\n    bind 127.0.0.1:{p2}\n    default_backend bad\n\n\
         backend good\n    server s {} ssl verify required ca-file {ca_file} sni str(backend.test)\n\n\
         backend bad\n    retries 0\n    server s {} ssl verify required ca-file {ca_file} sni str(backend.test)\n",
        good_srv.addr, bad_srv.addr
    );
    let shunt = Shunt::start(&cfg, &[]);
    let data = pattern(1 << 20, 5);
    // TLS on both sides: decrypted by shunt, encrypted again to the server.
    let got = rt().block_on(async {
        let s = tls_connect(
            SocketAddr::from(([127, 0, 0, 1], p1)),
            "a.test",
            client_config(&ca, &[]),
        )
        .await;
        exchange(s, &data).await
    });
    assert_eq!(sha256(&got), sha256(&data), "through a TLS server");
    // A plain client to a server whose certificate the CA did not sign: the
    // flow ends without a byte from the server.
    let mut c = connect(SocketAddr::from(([127, 0, 0, 1], p2)));
    c.set_read_timeout(Some(IO_LIMIT)).expect("timeout");
    std::io::Write::write_all(&mut c, b"hello").expect("write");
    let back = read_to_end(&mut c).unwrap_or_default();
    assert!(
        back.is_empty(),
        "a server that failed verification answered"
    );
    let t0 = Instant::now();
    while !shunt.stderr().contains("SSL handshake failure with server") {
        assert!(
            t0.elapsed() < IO_LIMIT,
            "the failed verification is not logged:\n{}",
            shunt.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_bad_certificate_is_a_configuration_error_at_its_bind_line() {
    let dir = TempDir::new("tls-badcrt");
    let bad = write(dir.path(), "bad.pem", "not a certificate\n");
    let cfg = dir.path().join("t.cfg");
    std::fs::write(
        &cfg,
        format!(
            "{DEFAULTS}frontend fe\n    bind 127.0.0.1:1 ssl crt {bad}\n    default_backend be\n\nbackend be\n    server s 127.0.0.1:2\n"
        ),
    )
    .expect("write cfg");
    let (code, _, err) = check_config(&[&cfg]);
    assert_eq!(code, 1, "{err}");
    let want = format!(
        "parsing [{}:8] : 'bind 127.0.0.1:1' in section 'frontend' : unable to load certificate from file '{bad}'.",
        cfg.display()
    );
    assert!(err.contains(&want), "want {want}\ngot {err}");
}

/// `shunt -c` and `haproxy -c` agree (valid or not) on the sample configurations.
#[test]
fn shunt_and_haproxy_agree_on_the_tls_samples() {
    let haproxy = Path::new("/usr/sbin/haproxy");
    if !haproxy.exists() {
        eprintln!("SKIPPED: /usr/sbin/haproxy is not installed; nothing to compare with");
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/tls");
    let mut seen = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .expect("testdata/tls")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cfg"))
        .collect();
    entries.sort();
    for cfg in entries {
        let name = cfg.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let run = |bin: &Path| {
            std::process::Command::new(bin)
                .arg("-c")
                .arg("-f")
                .arg(name)
                .current_dir(&dir)
                .output()
                .expect("run -c")
        };
        let s = run(&shunt_bin());
        let h = run(haproxy);
        assert_eq!(
            s.status.success(),
            h.status.success(),
            "{name}: shunt says {}, haproxy says {}",
            String::from_utf8_lossy(&s.stderr),
            String::from_utf8_lossy(&h.stderr)
        );
        let want_ok = name.starts_with("ok_");
        assert_eq!(s.status.success(), want_ok, "{name}: {:?}", s);
        if !want_ok {
            // The same words: HAProxy's first alert, after its "config : ".
            let h_err = String::from_utf8_lossy(&h.stderr);
            let first = h_err
                .lines()
                .find_map(|l| l.split_once("config : ").map(|(_, m)| m.to_string()))
                .expect("haproxy's alert");
            let s_err = String::from_utf8_lossy(&s.stderr);
            assert!(
                s_err.contains(&first),
                "{name}: haproxy: {first}\nshunt: {s_err}"
            );
        }
        seen += 1;
    }
    assert!(seen >= 4, "only {seen} samples in {}", dir.display());
}

#[test]
fn a_reload_serves_the_new_contents_of_the_certificate_file() {
    let ca = Ca::new("shunt test CA");
    let shared = TempDir::new("tls-reload");
    let (a, der_a) = ca.leaf(&["a.test"]);
    let (b, der_b) = ca.leaf(&["a.test"]);
    let crt = write(shared.path(), "site.pem", &a);
    let echo = Server::echo();
    let port = free_port();
    let cfg = format!(
        "{}{DEFAULTS}frontend fe\n    bind 127.0.0.1:{port} ssl crt {crt}\n    default_backend be\n\nbackend be\n    server s1 {}\n",
        reload_global(shared.path(), true, ""),
        echo.addr
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let served = || {
        rt().block_on(async {
            let s = tls_connect(addr, "a.test", client_config(&ca, &[])).await;
            let der = s
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.to_vec())
                .expect("peer certificate");
            assert_eq!(exchange(s, b"x").await, b"x");
            der
        })
    };
    let mut old = Shunt::start(&cfg, &[]);
    assert!(served() == der_a, "the first process does not serve A");
    std::fs::write(&crt, &b).expect("replace certificate");
    // The running process read its certificates at start: still A.
    assert!(
        served() == der_a,
        "the certificate changed without a reload"
    );
    let sock = shared.path().join("admin.sock").display().to_string();
    let old_pid = pid_in(&shared.path().join("shunt.pid")).to_string();
    let new = Shunt::start(&cfg, &["-x", &sock, "-sf", &old_pid]);
    assert!(
        old.wait(slow(Duration::from_secs(10))).is_some(),
        "old process did not exit:\n{}",
        plain(&old.stderr())
    );
    assert!(
        served() == der_b,
        "after the reload, not B:\n{}",
        plain(&new.stderr())
    );
}

#[test]
fn a_failed_handshake_closes_only_its_connection_and_is_logged() {
    let ca = Ca::new("shunt test CA");
    let certs = TempDir::new("tls-hsfail");
    let (pem, _) = ca.leaf(&["a.test"]);
    let crt = write(certs.path(), "a.pem", &pem);
    let echo = Server::echo();
    let (port, slow_port) = (free_port(), free_port());
    let cfg = format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n\n{DEFAULTS}\
         frontend fe\n    log stderr format raw local0\n    bind 127.0.0.1:{port} ssl crt {crt}\n    default_backend be\n\n\
         frontend slow\n    log stderr format raw local0\n    timeout client 500ms\n    bind 127.0.0.1:{slow_port} ssl crt {crt}\n    default_backend be\n\n\
         backend be\n    server s1 {}\n",
        echo.addr
    );
    let shunt = Shunt::start(&cfg, &[]);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let slow = SocketAddr::from(([127, 0, 0, 1], slow_port));
    rt().block_on(async {
        // A flow in the middle of its life while the bad ones come and go.
        let mut good = tls_connect(addr, "a.test", client_config(&ca, &[])).await;
        // Not TLS at all.
        let mut junk = tokio::net::TcpStream::connect(addr).await.expect("connect");
        junk.write_all(b"GET / HTTP/1.0\r\n\r\n")
            .await
            .expect("write junk");
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(IO_LIMIT, junk.read_to_end(&mut rest)).await;
        // Silent: closed at `timeout client` (of its own frontend).
        let t0 = Instant::now();
        let mut silent = tokio::net::TcpStream::connect(slow).await.expect("connect");
        let n = tokio::time::timeout(IO_LIMIT, silent.read(&mut [0u8; 1]))
            .await
            .expect("closed in time");
        assert!(matches!(n, Ok(0) | Err(_)), "nothing sent: {n:?}");
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(400),
            "closed before timeout client: {waited:?}"
        );
        // The good flow still works.
        good.write_all(b"still here").await.expect("write");
        let mut back = [0u8; 10];
        good.read_exact(&mut back).await.expect("echo");
        assert_eq!(&back, b"still here");
    });
    eventually("the log lines", Duration::from_secs(10), || {
        let log = shunt.stderr();
        log.contains("fe/1: SSL handshake failure")
            && log.contains("slow/1: Timeout during SSL handshake")
    });
    // As HAProxy: an embryonic connection is no session.
    assert_eq!(stat(&shunt.sock(), "fe", "FRONTEND", "stot"), 1);
}

/// Longest wait for a check result a few 200 ms intervals should give.
const CHECK_WAIT: Duration = Duration::from_secs(10);

/// What a check of each server of [`check_ssl_config`] reports, as HAProxy
/// 2.6 reports it: (backend, server, check_status, last_chk, UP).
const CHECK_CASES: &[(&str, &str, &str, &str, bool)] = &[
    ("chk", "tls", "L6OK", "", true),
    ("chk", "garbage", "L6RSP", "SSL handshake failure", false),
    ("chk", "closes", "L6RSP", "SSL handshake failure", false),
    ("chk", "resets", "L6RSP", "SSL handshake failure", false),
    ("chk", "silent", "L6TOUT", "", false),
    ("chk", "wrongca", "L6RSP", "SSL handshake failure", false),
    ("chk", "rightca", "L6OK", "", true),
    (
        "chk",
        "wrongsni",
        "L6RSP",
        "Server presented an SSL certificate different from the expected one",
        false,
    ),
    ("chk", "clear", "L4OK", "", true),
    ("chk", "portclear", "L4OK", "", true),
    ("chk", "checkssl", "L6OK", "", true),
    ("rules", "tls", "L7OK", "(tcp-check)", true),
    (
        "rules",
        "garbage",
        "L6RSP",
        "SSL handshake failure at initial connection step of tcp-check",
        false,
    ),
    // `check-sni nope.test` is the implicit connection's: not this rule's.
    ("connect", "tls", "L7OK", "(tcp-check)", true),
    (
        "connectsni",
        "tls",
        "L6RSP",
        "Server presented an SSL certificate different from the expected one at step 1 of tcp-check (connect)",
        false,
    ),
    ("explicit", "tls", "L4OK", "(tcp-check)", true),
];

/// The servers TLS checks meet: a TLS echo signed by `ca`, and plain ones.
struct CheckPeers {
    tls: TlsEcho,
    /// A plain echo: what `no-check-ssl` and a check `port` reach in clear.
    plain: Server,
    /// Answers a ClientHello with a line of text.
    garbage: Server,
    /// Closes (FIN) once the ClientHello is read.
    closes: Server,
    /// Resets once the ClientHello is read.
    resets: Server,
    /// Holds every connection without a byte until the checker closes it.
    silent: Server,
}

impl CheckPeers {
    fn start(leaf_pem: &str) -> CheckPeers {
        CheckPeers {
            tls: TlsEcho::start(leaf_pem),
            plain: Server::echo(),
            // Each reads the ClientHello first: what the checker then sees
            // (garbage, a FIN, a reset) does not depend on when it arrived.
            garbage: Server::start(|mut s| {
                read_hello(&mut s);
                let _ = std::io::Write::write_all(&mut s, b"garbage, not TLS\n");
            }),
            closes: Server::start(|mut s| read_hello(&mut s)),
            resets: Server::start(|mut s| {
                read_hello(&mut s);
                let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
            }),
            silent: Server::start(|mut s| {
                let mut b = [0u8; 1024];
                while matches!(std::io::Read::read(&mut s, &mut b), Ok(n) if n > 0) {}
            }),
        }
    }
}

/// Reads what a TLS client sends first (its ClientHello, one segment on
/// loopback), within a bound.
fn read_hello(s: &mut std::net::TcpStream) {
    let _ = s.set_read_timeout(Some(IO_LIMIT));
    let mut b = [0u8; 4096];
    let _ = std::io::Read::read(s, &mut b);
}

/// One configuration for shunt and HAProxy alike: every case of
/// [`CHECK_CASES`], checked every 200 ms.
fn check_ssl_config(port: u16, sock: &str, p: &CheckPeers, ca: &str, other_ca: &str) -> String {
    let (tls, plain) = (p.tls.addr, p.plain.addr);
    let every = "check inter 200ms";
    format!(
        "global\n    stats socket {sock} level admin\n\n{DEFAULTS}\
         frontend fe\n    bind 127.0.0.1:{port}\n    default_backend chk\n\n\
         backend chk\n\
         \x20   server tls {tls} ssl verify none {every}\n\
         \x20   server garbage {} ssl verify none {every}\n\
         \x20   server closes {} ssl verify none {every}\n\
         \x20   server resets {} ssl verify none {every}\n\
         \x20   server silent {} ssl verify none {every}\n\
         \x20   server wrongca {tls} ssl verify required ca-file {other_ca} {every}\n\
         \x20   server rightca {tls} ssl verify required ca-file {ca} check-sni backend.test {every}\n\
         \x20   server wrongsni {tls} ssl verify required ca-file {ca} check-sni nope.test {every}\n\
         \x20   server clear {plain} ssl verify none no-check-ssl {every}\n\
         \x20   server portclear {tls} ssl verify none port {} {every}\n\
         \x20   server checkssl {tls} check-ssl verify none {every}\n\n\
         backend rules\n    option tcp-check\n    tcp-check send hello\\n\n    tcp-check expect string hello\n\
         \x20   server tls {tls} ssl verify none {every}\n\
         \x20   server garbage {} ssl verify none {every}\n\n\
         backend connect\n    option tcp-check\n    tcp-check connect ssl\n\
         \x20   tcp-check send hello\\n\n    tcp-check expect string hello\n\
         \x20   server tls {tls} verify required ca-file {ca} check-sni nope.test {every}\n\n\
         backend connectsni\n    option tcp-check\n    tcp-check connect ssl sni nope.test\n\
         \x20   server tls {tls} verify required ca-file {ca} {every}\n\n\
         backend explicit\n    option tcp-check\n    tcp-check connect\n\
         \x20   server tls {tls} ssl verify none {every}\n",
        p.garbage.addr,
        p.closes.addr,
        p.resets.addr,
        p.silent.addr,
        plain.port(),
        p.garbage.addr,
    )
}

/// Waits until every case of [`CHECK_CASES`] has shown its status in the
/// `show stat` of `sock`; returns each case's (check_status, last_chk,
/// status) as first seen so. HAProxy marks a check in progress with `* `
/// and blanks its `last_chk` meanwhile: such a row is not a result yet.
fn check_results(
    who: &str,
    sock: &Path,
    log: &dyn Fn() -> String,
) -> Vec<(String, String, String)> {
    let t0 = Instant::now();
    let mut seen: Vec<Option<(String, String, String)>> = vec![None; CHECK_CASES.len()];
    loop {
        let rows = show_stat_raw(sock);
        let mut last = Vec::new();
        for (c, slot) in CHECK_CASES.iter().zip(seen.iter_mut()) {
            let (px, sv, status, _, up) = *c;
            let r = rows
                .iter()
                .find(|r| r["pxname"] == px && r["svname"] == sv)
                .unwrap_or_else(|| panic!("{who}: no row {px}/{sv}"));
            let got = (
                r["check_status"].clone(),
                r["last_chk"].clone(),
                r["status"].clone(),
            );
            if slot.is_none() && got.0 == status && (got.2 == "UP") == up {
                *slot = Some(got.clone());
            }
            last.push(got);
        }
        if seen.iter().all(Option::is_some) {
            return seen.into_iter().flatten().collect();
        }
        assert!(
            t0.elapsed() < slow(CHECK_WAIT),
            "{who}: the checks did not settle; (case, last row):\n{:#?}\nlog:\n{}",
            CHECK_CASES.iter().zip(&last).collect::<Vec<_>>(),
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// HAProxy 2.6 run on a configuration, killed on drop.
struct Haproxy(std::process::Child, TempDir);

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn health_checks_speak_tls_as_haproxys_do() {
    let ca = Ca::new("shunt test CA");
    let other = Ca::new("some other CA");
    let dir = TempDir::new("tls-checks");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let other_ca = write(dir.path(), "other.pem", &other.pem());
    let (leaf, _) = ca.leaf(&["backend.test"]);
    let peers = CheckPeers::start(&leaf);
    let sh_sock = dir.path().join("shunt.sock");
    let cfg = check_ssl_config(
        free_port(),
        &sh_sock.display().to_string(),
        &peers,
        &ca_file,
        &other_ca,
    );
    let shunt = Shunt::start(&cfg, &[]);
    let ours = check_results("shunt", &sh_sock, &|| shunt.stderr());
    for (c, g) in CHECK_CASES.iter().zip(&ours) {
        assert_eq!(g.1, c.3, "shunt's last_chk of {}/{}", c.0, c.1);
    }
    let desc = |px: &str, sv: &str| stat_row(&sh_sock, px, sv)["check_desc"].clone();
    assert_eq!(desc("chk", "tls"), "Layer6 check passed");
    assert_eq!(desc("chk", "garbage"), "Layer6 invalid response");
    assert_eq!(desc("chk", "silent"), "Layer6 timeout");
    // A server that went down logs HAProxy's line, with the layer-6 reason.
    let want = "Server chk/garbage is DOWN, reason: Layer6 invalid response, info: \"SSL handshake failure\"";
    eventually("the DOWN line of chk/garbage", slow(CHECK_WAIT), || {
        shunt.stderr().contains(want)
    });

    // The same configuration through HAProxy 2.6 gives the same columns.
    let haproxy = Path::new("/usr/sbin/haproxy");
    if !haproxy.exists() {
        assert!(
            std::env::var("SHUNT_REQUIRE_BPF").as_deref() != Ok("1"),
            "/usr/sbin/haproxy is required under SHUNT_REQUIRE_BPF=1 (apt-get install haproxy)"
        );
        eprintln!("!!!!! SKIPPED the HAProxy half: no /usr/sbin/haproxy (apt-get install haproxy)");
        return;
    }
    let hdir = TempDir::new("tls-checks-haproxy");
    let h_sock = hdir.path().join("h.sock");
    let h_cfg = hdir.path().join("h.cfg");
    let text = check_ssl_config(
        free_port(),
        &h_sock.display().to_string(),
        &peers,
        &ca_file,
        &other_ca,
    );
    std::fs::write(&h_cfg, text).expect("write haproxy config");
    let out = std::fs::File::create(hdir.path().join("out")).expect("out");
    let child = std::process::Command::new(haproxy)
        .arg("-db")
        .arg("-f")
        .arg(&h_cfg)
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().expect("dup"))
        .stderr(out)
        .spawn()
        .expect("start haproxy");
    let mut h = Haproxy(child, hdir);
    let out_path = h.1.path().join("out");
    let h_log = || std::fs::read_to_string(&out_path).unwrap_or_default();
    let (t0, limit) = (Instant::now(), slow(CHECK_WAIT));
    while !h_sock.exists() {
        if let Ok(Some(st)) = h.0.try_wait() {
            panic!(
                "haproxy exited ({st}) before its stats socket was up; its output:\n{}",
                h_log()
            );
        }
        assert!(
            t0.elapsed() < limit,
            "haproxy's stats socket did not appear in {limit:?}; its output:\n{}",
            h_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let theirs = check_results("haproxy", &h_sock, &h_log);
    for ((c, g), t) in CHECK_CASES.iter().zip(&ours).zip(&theirs) {
        // After a reset HAProxy adds the socket's error to the text or not,
        // as its poller or its read saw the reset first (either, over many
        // checks of one server); shunt's text is the one without.
        let their_text = t.1.replace(" (Connection reset by peer)", "");
        assert_eq!(
            (&g.0, &g.1, &g.2),
            (&t.0, &their_text, &t.2),
            "{}/{}: shunt (left) and haproxy (right) differ",
            c.0,
            c.1
        );
    }
}
