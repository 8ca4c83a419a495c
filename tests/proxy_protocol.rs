//! The PROXY protocol end to end (issue 15): `send-proxy` / `send-proxy-v2`
//! headers as a server receives them, then the payload byte-exact, in every
//! forwarding mode (sockmap and `auto`'s promotion where BPF is wanted); warm
//! spares that carry each client's own header; the header on health checks;
//! `accept-proxy` and `expect-proxy` changing what the ACLs and the logs see,
//! in HAProxy's rule order; a malformed header closing only its connection;
//! a shunt → shunt chain, shunt → HAProxy `accept-proxy` and shunt → nginx
//! `listen ... proxy_protocol`; and sample
//! configurations judged alike by `shunt -c` and `haproxy -c`.
//!
//! The expected headers are built here from the protocol's text, not with
//! shunt's encoder, so the two are checked against each other.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use shunt_tests::*;

/// The v2 signature, from the protocol's text.
const SIG: &[u8] = b"\r\n\r\n\x00\r\nQUIT\n";
/// Bound on every wait of these tests.
const WAIT: Duration = Duration::from_secs(10);

fn v1(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    format!(
        "PROXY TCP4 {} {} {} {}\r\n",
        src.ip(),
        dst.ip(),
        src.port(),
        dst.port()
    )
    .into_bytes()
}

fn v2(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let ip = |a: SocketAddr| match a {
        SocketAddr::V4(a) => a.ip().octets(),
        SocketAddr::V6(_) => panic!("IPv4 only in these tests"),
    };
    let mut h = SIG.to_vec();
    h.extend_from_slice(&[0x21, 0x11, 0, 12]);
    h.extend_from_slice(&ip(src));
    h.extend_from_slice(&ip(dst));
    h.extend_from_slice(&src.port().to_be_bytes());
    h.extend_from_slice(&dst.port().to_be_bytes());
    h
}

/// A server that reads each connection to its end, hands the bytes to the
/// test and answers `ok`.
fn capture() -> (Server, mpsc::Receiver<Vec<u8>>) {
    let (tx, rx) = mpsc::channel();
    let server = Server::start(move |mut s| {
        let mut got = Vec::new();
        if s.read_to_end(&mut got).is_ok() {
            let _ = tx.send(got);
            let _ = s.write_all(b"ok");
        }
    });
    (server, rx)
}

/// A connection from loopback address `src` (port chosen by the kernel).
fn connect_from(src: [u8; 4], to: SocketAddr) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    s.bind(&SocketAddr::from((src, 0)).into())
        .expect("bind client to a loopback address");
    s.connect(&to.into()).expect("connect");
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    s
}

/// Send `data` from `src`, half-close, and expect the capture server's `ok`.
fn send_all(src: [u8; 4], to: SocketAddr, data: &[u8]) -> SocketAddr {
    let mut c = connect_from(src, to);
    let me = c.local_addr().expect("local addr");
    c.write_all(data).expect("send");
    c.shutdown(Shutdown::Write).expect("shutdown");
    let mut back = Vec::new();
    c.read_to_end(&mut back).expect("answer");
    assert_eq!(back, b"ok", "the server's answer reaches the client");
    me
}

fn frontend(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn config(port: u16, bind_opts: &str, fe_extra: &str, global: &str, backend: &str) -> String {
    format!(
        "global\n    nbthread 2\n    stats socket @DIR@/admin.sock level admin\n{global}\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend fe\n    bind 127.0.0.1:{port}{bind_opts}\n{fe_extra}    default_backend be\n\n\
         backend be\n{backend}"
    )
}

/// The modes of the send-proxy test: every forced mode, and `auto` with a low
/// promotion threshold where BPF is wanted (the flow is promoted mid-stream).
fn modes() -> Vec<&'static str> {
    let mut m = forwarding_modes();
    if m.contains(&"sockmap") {
        m.push("auto");
    }
    m
}

/// Large enough to be promoted by `auto` (threshold 64 KiB) and to keep a
/// sockmap flow busy after insertion.
const PAYLOAD: usize = 3 << 20;

fn no_kernel_disagreement(shunt: &Shunt) {
    let log = shunt.stderr();
    assert!(
        !log.contains("sockmap byte counts disagree"),
        "the kernel path's totals count the header as client bytes:\n{}",
        kernel_diagnostics(shunt)
    );
}

/// A server that reads the PROXY header a connection starts with (v1 to its
/// CRLF, v2 by its length field), hands it to the test, then echoes the rest.
fn header_then_echo() -> (Server, mpsc::Receiver<Vec<u8>>) {
    let (tx, rx) = mpsc::channel();
    let server = Server::start(move |mut s| {
        let mut h = vec![0u8; 16];
        if s.read_exact(&mut h).is_err() {
            return;
        }
        if h.starts_with(b"PROXY ") {
            while !h.ends_with(b"\r\n") && h.len() < 200 {
                let mut b = [0u8; 1];
                if s.read_exact(&mut b).is_err() {
                    return;
                }
                h.push(b[0]);
            }
        } else {
            let mut rest = vec![0u8; usize::from(u16::from_be_bytes([h[14], h[15]]))];
            if s.read_exact(&mut rest).is_err() {
                return;
            }
            h.extend_from_slice(&rest);
        }
        let _ = tx.send(h);
        echo_until_eof(&mut s);
    });
    (server, rx)
}

/// Turns of `chunk` bytes each way: write one, read its echo, compare.
fn echo_turns(c: &mut TcpStream, payload: &[u8], chunk: usize) {
    let mut back = vec![0u8; chunk];
    for (i, part) in payload.chunks(chunk).enumerate() {
        c.write_all(part).expect("send");
        c.read_exact(&mut back[..part.len()]).expect("echo");
        assert!(back[..part.len()] == *part, "turn {i}: the echo differs");
    }
    c.shutdown(Shutdown::Write).expect("shutdown");
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).expect("eof");
    assert!(rest.is_empty(), "nothing after the echo");
}

#[test]
fn send_proxy_headers_then_the_payload_byte_exact_in_every_mode() {
    let payload = pattern(PAYLOAD, 15);
    for mode in modes() {
        for (opt, make) in [
            ("send-proxy", v1 as fn(SocketAddr, SocketAddr) -> Vec<u8>),
            ("send-proxy-v2", v2),
        ] {
            let (server, rx) = header_then_echo();
            let port = free_port();
            let cfg = config(
                port,
                "",
                "",
                "    tune.sockmap.promote-bytes 64k\n",
                &format!("    server s1 {} {opt}\n", server.addr),
            );
            let shunt = Shunt::start(&cfg, &["--forward-mode", mode]);
            let mut c = connect_from([127, 0, 0, 2], frontend(port));
            let me = c.local_addr().expect("addr");
            // Request/response turns: what `auto` promotes a lone flow on.
            echo_turns(&mut c, &payload, 4096);
            let got = rx.recv_timeout(WAIT).expect("the server got the flow");
            assert_eq!(
                got,
                make(me, frontend(port)),
                "{mode} {opt}: the header comes first"
            );
            eventually("the flow's counters", WAIT, || {
                stat(&shunt.sock(), "fe", "FRONTEND", "bin") == PAYLOAD as u64
            });
            if mode == "auto" {
                assert_eq!(
                    info_u64(&shunt.sock(), "PromotedFlows"),
                    1,
                    "auto promoted the flow: {}",
                    kernel_diagnostics(&shunt)
                );
            } else {
                assert_mode(&shunt.sock(), mode);
            }
            no_kernel_disagreement(&shunt);
        }
    }
}

/// Spares of `be/s1` kept now (`show servers conn`'s `idle_cur`).
fn idle_spares(sock: &Path) -> usize {
    let out = cli(sock, "show servers conn be");
    let line = out
        .lines()
        .find(|l| l.starts_with("be/s1 "))
        .unwrap_or_else(|| panic!("no be/s1 in:\n{out}"));
    line.split(' ')
        .nth(12)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no idle_cur in {line:?}"))
}

#[test]
fn warm_spares_carry_each_clients_own_header() {
    let (server, rx) = capture();
    let port = free_port();
    let cfg = config(
        port,
        "",
        "",
        "",
        &format!(
            "    server s1 {} send-proxy-v2 pool-max-conn 8\n",
            server.addr
        ),
    )
    .replace("nbthread 2", "nbthread 1");
    let shunt = Shunt::start(&cfg, &["--forward-mode", "copy"]);
    let sock = shunt.sock();
    // Three flows at once make the pool's estimate three spares.
    let held: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut c = connect_from([127, 0, 0, 1], frontend(port));
            c.write_all(b"warm-up").expect("send");
            c
        })
        .collect();
    eventually("three flows", WAIT, || stat(&sock, "be", "s1", "scur") == 3);
    drop(held);
    for _ in 0..3 {
        rx.recv_timeout(WAIT).expect("warm-up flow");
    }
    eventually("3 spares", WAIT, || idle_spares(&sock) == 3);
    for (i, src) in [[127, 0, 0, 2], [127, 0, 0, 3], [127, 0, 0, 4]]
        .into_iter()
        .enumerate()
    {
        let hits = stat(&sock, "be", "s1", "warm_hit");
        let data = format!("client {i}");
        let me = send_all(src, frontend(port), data.as_bytes());
        let got = rx.recv_timeout(WAIT).expect("the server got the flow");
        let want = [v2(me, frontend(port)), data.into_bytes()].concat();
        assert_eq!(got, want, "flow {i}: its own header, then its bytes");
        assert_eq!(
            stat(&sock, "be", "s1", "warm_hit"),
            hits + 1,
            "flow {i} was served by a spare"
        );
        eventually("refill", WAIT, || idle_spares(&sock) == 3);
    }
}

#[test]
fn health_checks_send_the_servers_header_as_haproxy() {
    let (tx, rx) = mpsc::channel();
    let server = Server::start(move |mut s| {
        s.set_read_timeout(Some(Duration::from_millis(500))).ok();
        let mut first = [0u8; 16];
        if s.read_exact(&mut first).is_ok() {
            let _ = tx.send(first);
        }
    });
    let port = free_port();
    let cfg = config(
        port,
        "",
        "",
        "",
        &format!(
            "    server s1 {} send-proxy-v2 check inter 200ms\n",
            server.addr
        ),
    );
    let _shunt = Shunt::start(&cfg, &[]);
    let first = rx.recv_timeout(WAIT).expect("a check connection");
    // HAProxy 2.6: the v2 LOCAL command with no address.
    assert_eq!(&first[..12], SIG);
    assert_eq!(&first[12..], &[0x20, 0x00, 0x00, 0x00]);
}

/// A tagged echo server's tag for a connection that starts with `hello`,
/// or `None` when the proxy closed it.
fn tag_after(to: SocketAddr, hello: &[u8]) -> Option<u8> {
    let mut c = connect_from([127, 0, 0, 1], to);
    c.write_all(hello).expect("send");
    let mut b = [0u8; 1];
    match c.read(&mut b) {
        Ok(1) => Some(b[0]),
        _ => None,
    }
}

#[test]
fn accepted_headers_change_what_acls_and_logs_see() {
    let (a, b) = (Server::tagged_echo(1), Server::tagged_echo(2));
    let (port, plain) = (free_port(), free_port());
    let cfg = format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend fe\n    bind 127.0.0.1:{port} accept-proxy name pp\n    bind 127.0.0.1:{plain}\n\
         \x20   log stderr format raw local0\n    log-format \"LOG %ci:%cp %fi:%fp %b\"\n\
         \x20   tcp-request connection expect-proxy layer4 if {{ dst_port {plain} }}\n\
         \x20   tcp-request connection reject if {{ src 10.9.0.0/16 }}\n\
         \x20   use_backend b if {{ src 10.9.0.0/16 }}\n    default_backend a\n\n\
         backend a\n    server s {}\n\nbackend b\n    server s {}\n",
        a.addr, b.addr
    );
    let shunt = Shunt::start(&cfg, &[]);
    let v1_hdr = b"PROXY TCP4 10.9.1.1 192.0.2.7 5555 80\r\n";
    let v2_hdr = v2(
        "10.8.1.1:4660".parse().unwrap(),
        "192.0.2.8:443".parse().unwrap(),
    );
    // accept-proxy, v1 then v2; then a rule's expect-proxy on the plain bind:
    // the reject before it sees the real address (HAProxy runs every
    // `tcp-request connection` rule before it reads the header), the
    // use_backend condition the header's.
    assert_eq!(tag_after(frontend(port), v1_hdr), Some(2));
    assert_eq!(tag_after(frontend(port), &v2_hdr), Some(1));
    assert_eq!(tag_after(frontend(plain), v1_hdr), Some(2));
    // `show sess` lists the header's client while the flow is open.
    let mut held = connect_from([127, 0, 0, 1], frontend(port));
    held.write_all(b"PROXY TCP4 10.9.3.3 192.0.2.7 4242 80\r\n")
        .expect("send");
    held.read_exact(&mut [0u8; 1]).expect("tag");
    let sess = cli(&shunt.sock(), "show sess");
    assert!(sess.contains(" src=10.9.3.3:4242 fe=fe be=b "), "{sess}");
    drop(held);
    // LOCAL keeps the real addresses.
    let local = [SIG, &[0x20, 0x00, 0x00, 0x00]].concat();
    assert_eq!(tag_after(frontend(port), &local), Some(1));
    eventually("five log lines", WAIT, || {
        shunt.stderr().matches("LOG ").count() >= 5
    });
    let log = shunt.stderr();
    for line in [
        "LOG 10.9.1.1:5555 192.0.2.7:80 b",
        "LOG 10.8.1.1:4660 192.0.2.8:443 a",
    ] {
        assert!(log.contains(line), "no {line:?} in:\n{log}");
    }
    let local = format!(" 127.0.0.1:{port} a");
    assert!(
        log.lines()
            .any(|l| l.contains("LOG 127.0.0.1:") && l.ends_with(&local)),
        "LOCAL: the real addresses in:\n{log}"
    );
    assert_eq!(
        log.matches("LOG 10.9.1.1:5555 192.0.2.7:80 b").count(),
        2,
        "both binds took the header:\n{log}"
    );
}

#[test]
fn maps_and_balance_source_use_the_headers_client() {
    let (a, b) = (Server::tagged_echo(1), Server::tagged_echo(2));
    let (c1, c2) = (Server::tagged_echo(3), Server::tagged_echo(4));
    let port = free_port();
    let cfg = format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend fe\n    bind 127.0.0.1:{port} accept-proxy\n\
         \x20   use_backend %[src,map_ip(testdata/proxy-protocol/src.map)]\n    default_backend c\n\n\
         backend a\n    server s {}\n\nbackend b\n    server s {}\n\n\
         backend c\n    balance source\n    server s1 {}\n    server s2 {}\n",
        a.addr, b.addr, c1.addr, c2.addr
    );
    let _shunt = Shunt::start(&cfg, &[]);
    let hdr = |src: &str| format!("PROXY TCP4 {src} 192.0.2.1 1000 80\r\n").into_bytes();
    assert_eq!(
        tag_after(frontend(port), &hdr("10.9.4.4")),
        Some(2),
        "map_ip on the header's src"
    );
    // balance source: one header address, one server, whatever the real
    // client port; different header addresses spread over both servers (the
    // real address is the same for all of them).
    let first = tag_after(frontend(port), &hdr("10.1.0.1"));
    for _ in 0..5 {
        assert_eq!(tag_after(frontend(port), &hdr("10.1.0.1")), first);
    }
    let tags: std::collections::BTreeSet<Option<u8>> = (1..=16)
        .map(|i| tag_after(frontend(port), &hdr(&format!("10.2.{i}.{i}"))))
        .collect();
    assert_eq!(
        tags,
        [Some(3), Some(4)].into_iter().collect(),
        "balance source hashes the header's address"
    );
}

#[test]
fn a_bad_header_closes_only_its_own_connection() {
    let server = Server::echo();
    let port = free_port();
    let cfg = config(
        port,
        " accept-proxy",
        "    log stderr format raw local0\n    option tcplog\n",
        "",
        &format!("    server s1 {}\n", server.addr),
    );
    let shunt = Shunt::start(&cfg, &[]);
    let fe = frontend(port);
    // A good flow stays open across the bad one.
    let mut good = connect_from([127, 0, 0, 1], fe);
    good.write_all(b"PROXY TCP4 10.1.1.1 10.2.2.2 1 2\r\nfirst")
        .expect("send");
    let mut b = [0u8; 5];
    good.read_exact(&mut b).expect("echo");
    assert_eq!(&b, b"first");

    let mut bad = connect_from([127, 0, 0, 3], fe);
    let bad_addr = bad.local_addr().expect("addr");
    bad.write_all(b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")
        .expect("send");
    let mut rest = Vec::new();
    let closed = matches!(bad.read_to_end(&mut rest), Ok(0) | Err(_));
    assert!(
        closed && rest.is_empty(),
        "the bad connection is closed, nothing forwarded"
    );
    let line = format!("{}:{} [", bad_addr.ip(), bad_addr.port());
    eventually("the log line", WAIT, || {
        shunt.stderr().lines().any(|l| {
            l.starts_with(&line)
                && l.ends_with(
                    "] fe/1: Received something which does not look like a PROXY protocol header",
                )
        })
    });

    // The good one still works, and a new one too.
    good.write_all(b"again").expect("send");
    good.read_exact(&mut b).expect("echo");
    assert_eq!(&b, b"again");
    let mut next = connect_from([127, 0, 0, 1], fe);
    next.write_all(b"PROXY TCP4 10.1.1.2 10.2.2.2 1 2\r\nnext!")
        .expect("send");
    next.read_exact(&mut b).expect("echo");
    assert_eq!(&b, b"next!");
    // As HAProxy: the failed one is no session and no denied connection.
    assert_eq!(stat(&shunt.sock(), "fe", "FRONTEND", "stot"), 2);
    assert_eq!(stat(&shunt.sock(), "fe", "FRONTEND", "dcon"), 0);
    // A truncated header, and a connection closed before sending anything.
    let mut t = connect_from([127, 0, 0, 4], fe);
    t.write_all(b"PROXY TCP4 10.1").expect("send");
    let _ = t.read_to_end(&mut Vec::new());
    drop(connect_from([127, 0, 0, 5], fe));
    eventually("both logged", WAIT, || {
        let log = shunt.stderr();
        log.contains("fe/1: Truncated PROXY protocol header received")
            && log.contains("fe/1: Connection closed while waiting for PROXY protocol header")
    });
}

#[test]
fn a_silent_client_is_closed_at_timeout_client() {
    let server = Server::echo();
    let port = free_port();
    let cfg = config(
        port,
        " accept-proxy",
        "    log stderr format raw local0\n    timeout client 400ms\n",
        "",
        &format!("    server s1 {}\n", server.addr),
    );
    let shunt = Shunt::start(&cfg, &[]);
    let mut c = connect_from([127, 0, 0, 1], frontend(port));
    let t0 = Instant::now();
    let n = c.read(&mut [0u8; 1]);
    let waited = t0.elapsed();
    assert!(matches!(n, Ok(0) | Err(_)), "closed, nothing sent: {n:?}");
    assert!(
        waited >= Duration::from_millis(350) && waited < Duration::from_secs(5),
        "closed after timeout client (400 ms), not {waited:?}"
    );
    eventually("the log line", WAIT, || {
        shunt
            .stderr()
            .contains("fe/1: Timeout while waiting for PROXY protocol header")
    });
    assert_eq!(stat(&shunt.sock(), "fe", "FRONTEND", "stot"), 0);
}

#[test]
fn payload_in_the_headers_segment_arrives_byte_exact_in_every_mode() {
    let payload = pattern(PAYLOAD, 16);
    for mode in forwarding_modes() {
        let server = Server::echo();
        let port = free_port();
        let cfg = config(
            port,
            " accept-proxy",
            "",
            "",
            &format!("    server s1 {}\n", server.addr),
        );
        let shunt = Shunt::start(&cfg, &["--forward-mode", mode]);
        let mut c = connect_from([127, 0, 0, 1], frontend(port));
        // One write: the header and the first payload bytes share a segment.
        let first = [
            &b"PROXY TCP4 10.1.1.1 10.2.2.2 1 2\r\n"[..],
            &payload[..1000],
        ]
        .concat();
        c.write_all(&first).expect("send");
        let reader = {
            let mut c = c.try_clone().expect("clone");
            std::thread::spawn(move || read_to_end(&mut c).expect("echo"))
        };
        c.write_all(&payload[1000..]).expect("send");
        c.shutdown(Shutdown::Write).expect("shutdown");
        let echoed = reader.join().expect("reader");
        assert!(
            echoed.len() == payload.len() && sha256(&echoed) == sha256(&payload),
            "{mode}: the payload comes back byte-exact, without the header ({} bytes)",
            echoed.len()
        );
        assert_mode(&shunt.sock(), mode);
        assert_eq!(
            stat(&shunt.sock(), "fe", "FRONTEND", "bin"),
            PAYLOAD as u64,
            "{mode}: the header is not counted as client bytes"
        );
        // A header and the FIN at once: nothing to forward, a clean close.
        let mut c = connect_from([127, 0, 0, 1], frontend(port));
        c.write_all(b"PROXY TCP4 10.1.1.1 10.2.2.2 1 2\r\n")
            .expect("send");
        c.shutdown(Shutdown::Write).expect("shutdown");
        assert!(read_to_end(&mut c).expect("eof").is_empty(), "{mode}");
        eventually("two sessions", WAIT, || {
            stat(&shunt.sock(), "be", "BACKEND", "stot") == 2
                && info_u64(&shunt.sock(), "CurrConns") == 0
        });
        for col in ["eresp", "cli_abrt", "srv_abrt"] {
            assert_eq!(
                stat(&shunt.sock(), "be", "BACKEND", col),
                0,
                "{mode}: {col}"
            );
        }
        no_kernel_disagreement(&shunt);
    }
}

#[test]
fn a_shunt_chain_passes_the_first_client_on() {
    let (server, rx) = capture();
    let (near, far) = (free_port(), free_port());
    let far_cfg = config(
        far,
        " accept-proxy",
        "",
        "",
        &format!("    server s1 {} send-proxy\n", server.addr),
    );
    let near_cfg = config(
        near,
        "",
        "",
        "",
        &format!("    server far 127.0.0.1:{far} send-proxy-v2\n"),
    );
    let _far = Shunt::start(&far_cfg, &[]);
    let _near = Shunt::start(&near_cfg, &[]);
    let me = send_all([127, 0, 0, 2], frontend(near), b"through two proxies");
    let got = rx.recv_timeout(WAIT).expect("the server got the flow");
    assert_eq!(
        got,
        [v1(me, frontend(near)), b"through two proxies".to_vec()].concat(),
        "the far end sees the first client and the near frontend"
    );
}

/// Whether `tool` (a path) is installed; loud when not, and a failure under
/// `SHUNT_REQUIRE_BPF=1` (CI: `cargo xtask setup` installs `package`).
fn installed(tool: &str, package: &str) -> bool {
    let there = Path::new(tool).exists();
    if !there {
        assert!(
            std::env::var("SHUNT_REQUIRE_BPF").as_deref() != Ok("1"),
            "{tool} is required under SHUNT_REQUIRE_BPF=1 (apt-get install {package})"
        );
        eprintln!("!!!!! SKIPPED: no {tool} (apt-get install {package})");
    }
    there
}

fn haproxy_installed() -> bool {
    installed("/usr/sbin/haproxy", "haproxy")
}

/// Debian's nginx stream module, loaded by the test's own configuration.
const NGINX_STREAM: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// A peer process (HAProxy, nginx) writing into its scratch directory's
/// `out`, killed on drop.
struct Peer(std::process::Child, TempDir);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Peer {
    /// Run `cmd` with `cfg` written to `NAME` in a fresh scratch directory;
    /// `@DIR@` in `cfg` and in `args` is that directory.
    fn start(cmd: &str, name: &str, cfg: &str, args: &[&str]) -> Peer {
        let dir = TempDir::new(cmd.rsplit('/').next().unwrap_or("peer"));
        let d = dir.path().display().to_string();
        std::fs::write(dir.path().join(name), cfg.replace("@DIR@", &d)).expect("write config");
        let out = std::fs::File::create(dir.path().join("out")).expect("out");
        let child = Command::new(cmd)
            .args(args.iter().map(|a| a.replace("@DIR@", &d)))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {cmd}: {e}"));
        Peer(child, dir)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.1.path().join("out")).unwrap_or_default()
    }

    /// Wait until it accepts on `addr`.
    fn ready(&self, addr: SocketAddr) {
        let t0 = Instant::now();
        while TcpStream::connect(addr).is_err() {
            assert!(
                t0.elapsed() < WAIT,
                "the peer did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn nginx_proxy_protocol_sees_shunts_client() {
    if !installed("/usr/sbin/nginx", "nginx") || !installed(NGINX_STREAM, "libnginx-mod-stream") {
        return;
    }
    for opt in ["send-proxy", "send-proxy-v2"] {
        let (near, ngx) = (free_port(), free_port());
        // nginx answers each connection with the addresses its PROXY header gave.
        let n = Peer::start(
            "/usr/sbin/nginx",
            "n.conf",
            &format!(
                "load_module {NGINX_STREAM};\ndaemon off;\nmaster_process off;\n\
                 error_log @DIR@/out;\npid @DIR@/n.pid;\nevents {{}}\n\
                 stream {{ server {{ listen 127.0.0.1:{ngx} proxy_protocol;\n\
                 return \"$proxy_protocol_addr:$proxy_protocol_port $proxy_protocol_server_addr:$proxy_protocol_server_port\\n\"; }} }}\n"
            ),
            &["-p", "@DIR@", "-c", "@DIR@/n.conf"],
        );
        n.ready(frontend(ngx));
        let cfg = config(
            near,
            "",
            "",
            "",
            &format!("    server ngx 127.0.0.1:{ngx} {opt}\n"),
        );
        let _shunt = Shunt::start(&cfg, &[]);
        let mut c = connect_from([127, 0, 0, 2], frontend(near));
        let me = c.local_addr().expect("addr");
        let mut seen = String::new();
        c.read_to_string(&mut seen).expect("nginx's answer");
        assert_eq!(
            seen,
            format!("{}:{} 127.0.0.1:{near}\n", me.ip(), me.port()),
            "{opt}: nginx saw the client and shunt's frontend ({})",
            n.log()
        );
    }
}

#[test]
fn haproxy_accept_proxy_sees_shunts_client() {
    if !haproxy_installed() {
        return;
    }
    for opt in ["send-proxy", "send-proxy-v2"] {
        let server = Server::echo();
        let (near, hap) = (free_port(), free_port());
        let h = Peer::start(
            "/usr/sbin/haproxy",
            "h.cfg",
            &format!(
                "defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 30s\n  timeout server 30s\n\
                 frontend fe\n  bind 127.0.0.1:{hap} accept-proxy\n  log stdout format raw local0\n\
                 \x20 log-format \"SEEN %ci:%cp %fi:%fp\"\n  default_backend be\n\
                 backend be\n  server s {}\n",
                server.addr
            ),
            &["-db", "-f", "@DIR@/h.cfg"],
        );
        let cfg = config(
            near,
            "",
            "",
            "",
            &format!("    server hap 127.0.0.1:{hap} {opt}\n"),
        );
        let _shunt = Shunt::start(&cfg, &[]);
        h.ready(frontend(hap));
        let mut c = connect_from([127, 0, 0, 2], frontend(near));
        let me = c.local_addr().expect("addr");
        c.write_all(b"hello").expect("send");
        let mut b = [0u8; 5];
        c.read_exact(&mut b).expect("echo through haproxy");
        assert_eq!(&b, b"hello");
        drop(c);
        let want = format!("SEEN {}:{} 127.0.0.1:{near}", me.ip(), me.port());
        eventually("haproxy's log line", WAIT, || h.log().contains(&want));
    }
}

#[test]
fn sample_configs_get_haproxys_verdict() {
    let cases = [
        ("testdata/proxy-protocol/valid.cfg", true),
        ("testdata/proxy-protocol/expect_layer7.cfg", false),
        ("testdata/proxy-protocol/content_expect.cfg", false),
    ];
    let haproxy = haproxy_installed();
    for (file, valid) in cases {
        let path = Path::new(file);
        let (code, _, err) = check_config(&[path]);
        assert_eq!(code == 0, valid, "shunt -c -f {file}: {err}");
        let ours = parsing_lines(&err);
        assert!(valid || !ours.is_empty(), "{file}: no located error: {err}");
        if haproxy {
            let out = Command::new("haproxy")
                .args(["-c", "-f"])
                .arg(path)
                .output()
                .expect("run haproxy -c");
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.success(), valid, "haproxy -c -f {file}: {text}");
            assert_eq!(ours, parsing_lines(&text), "{file}: the same messages");
        }
    }
}

/// The `parsing [file:line] : ...` messages of a checker's output, prefixes cut.
fn parsing_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.find("parsing [").map(|i| l[i..].to_string()))
        .collect()
}
