//! SNI routing seen from outside: `use_backend %[req.ssl_sni,map_dom(FILE,DEFAULT)]`
//! and `map(FILE,DEFAULT)` frontends, clients that send a hand-built TLS ClientHello.
//!
//! Checks that the server name picks the mapped backend (domain suffix for `map_dom`,
//! exact for `map`), that unknown names, garbage, a hello without a name and a silent
//! client (after `tcp-request inspect-delay`) take default_backend, that `set map`/`add map`/
//! `del map` on the SNI map steer the next flow, and that the peeked bytes (the hello
//! and what follows it) reach the server intact in every forwarding mode.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use shunt_tests::*;

/// The inspect-delay the test configuration sets (in `defaults`).
const DELAY: Duration = Duration::from_millis(600);

const A: u8 = 0;
const B: u8 = 1;
const DEFAULT: u8 = 2;

struct Setup {
    shunt: Shunt,
    /// The `map_dom` frontend.
    dom: SocketAddr,
    /// The `map` (exact) frontend.
    exact: SocketAddr,
    exact_map: String,
    _servers: Vec<Server>,
    _maps: TempDir,
}

fn start(mode: &str) -> Setup {
    let servers: Vec<Server> = (0..3).map(Server::tagged_echo).collect();
    let maps = TempDir::new("sni");
    let dom_map = maps.path().join("dom.map");
    let exact_map = maps.path().join("exact.map");
    std::fs::write(
        &dom_map,
        "# domains\nnoback.example.com nosuch\nexample.com a\n",
    )
    .expect("write map");
    std::fs::write(&exact_map, "B.test b\n").expect("write map");
    let (p1, p2) = (free_port(), free_port());
    let cfg = format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n    tcp-request inspect-delay {}ms\n\n\
         frontend fe_dom\n    bind 127.0.0.1:{p1}\n    tcp-request content accept if {{ req_ssl_hello_type 1 }}\n    use_backend %[req.ssl_sni,map_dom({},dflt)]\n    default_backend dflt\n\n\
         frontend fe_exact\n    bind 127.0.0.1:{p2}\n    use_backend %[req.ssl_sni,map({},dflt)]\n    default_backend dflt\n\n\
         backend a\n    server s {}\n\nbackend b\n    server s {}\n\nbackend dflt\n    server s {}\n",
        DELAY.as_millis(),
        dom_map.display(),
        exact_map.display(),
        servers[0].addr,
        servers[1].addr,
        servers[2].addr
    );
    let shunt = Shunt::start(&cfg, &["--forward-mode", mode]);
    Setup {
        shunt,
        dom: SocketAddr::from(([127, 0, 0, 1], p1)),
        exact: SocketAddr::from(([127, 0, 0, 1], p2)),
        exact_map: exact_map.display().to_string(),
        _servers: servers,
        _maps: maps,
    }
}

/// Send `first` on a new connection and read the server's tag.
fn open_with(addr: SocketAddr, first: &[u8]) -> (TcpStream, u8) {
    let mut s = connect(addr);
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(first).expect("send hello");
    let mut b = [0u8; 1];
    s.read_exact(&mut b).expect("server tag");
    (s, b[0])
}

fn tag(addr: SocketAddr, first: &[u8]) -> u8 {
    open_with(addr, first).1
}

fn sni(name: &str) -> Vec<u8> {
    client_hello(Some(name))
}

#[test]
fn server_name_picks_the_backend() {
    let s = start("copy");
    assert_eq!(tag(s.dom, &sni("a.example.com")), A, "map_dom: suffix");
    assert_eq!(tag(s.dom, &sni("Deep.A.Example.COM")), A, "map_dom: case");
    assert_eq!(tag(s.dom, &sni("example.com")), A, "map_dom: whole name");
    assert_eq!(
        tag(s.dom, &sni("badexample.com")),
        DEFAULT,
        "map_dom: labels only"
    );
    assert_eq!(tag(s.dom, &sni("unknown.org")), DEFAULT, "map_dom: no key");
    assert_eq!(
        tag(s.dom, &sni("noback.example.com")),
        DEFAULT,
        "value names no backend (its key comes first in the file)"
    );
    assert_eq!(tag(s.exact, &sni("b.test")), B, "map: exact");
    assert_eq!(
        tag(s.exact, &sni("x.b.test")),
        DEFAULT,
        "map: no suffix match"
    );
    assert_eq!(
        tag(s.exact, &client_hello(None)),
        DEFAULT,
        "hello without a name"
    );
    assert_eq!(tag(s.exact, b"GET / HTTP/1.0\r\n\r\n"), DEFAULT, "garbage");
    let mut bad = sni("b.test");
    bad[9] ^= 0xff; // ClientHello length now exceeds the record
    assert_eq!(tag(s.exact, &bad), DEFAULT, "malformed hello");
    // Garbage is judged at once, not after inspect-delay.
    let t0 = Instant::now();
    assert_eq!(tag(s.dom, b"\x00\x01junk"), DEFAULT);
    assert!(t0.elapsed() < DELAY, "garbage waited {:?}", t0.elapsed());
}

#[test]
fn split_hello_is_awaited_and_silence_times_out() {
    let s = start("copy");
    // A hello in two pieces, the second one well within inspect-delay.
    let hello = sni("b.test");
    let mut c = connect(s.exact);
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    c.write_all(&hello[..20]).expect("first half");
    std::thread::sleep(Duration::from_millis(100));
    c.write_all(&hello[20..]).expect("second half");
    let mut b = [0u8; 1];
    c.read_exact(&mut b).expect("tag");
    assert_eq!(b[0], B);

    // A client that sends nothing gets DEFAULT once inspect-delay has passed.
    let t0 = Instant::now();
    let mut c = connect(s.exact);
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    c.read_exact(&mut b).expect("tag");
    let waited = t0.elapsed();
    assert_eq!(b[0], DEFAULT);
    assert!(
        waited >= DELAY - Duration::from_millis(50) && waited < DELAY * 5,
        "routed after {waited:?}, inspect-delay {DELAY:?}"
    );
}

#[test]
fn map_changes_steer_the_next_flow() {
    let s = start("copy");
    let sock = s.shunt.sock();
    let listed = cli(&sock, "show map");
    assert!(
        listed.contains("entry_cnt=2\n")
            && listed.contains("exact.map) ")
            && listed.contains("entry_cnt=1\n"),
        "{listed:?}"
    );
    assert_eq!(tag(s.exact, &sni("b.test")), B);
    let (mut open, t) = open_with(s.exact, &sni("b.test"));
    assert_eq!(t, B);

    assert_eq!(
        cli(&sock, &format!("set map {} b.test a", s.exact_map)),
        "\n"
    );
    assert_eq!(tag(s.exact, &sni("b.test")), A, "after set map");
    assert_eq!(cli(&sock, "add map #1 new.test b"), "\n");
    assert_eq!(tag(s.exact, &sni("new.test")), B, "after add map");
    assert_eq!(cli(&sock, "del map #1 b.test"), "\n");
    assert_eq!(tag(s.exact, &sni("b.test")), DEFAULT, "after del map");
    assert_eq!(cli(&sock, "del map #1 b.test"), "Key not found.\n\n");
    assert_eq!(
        cli(&sock, "set map #1 nothere.test a"),
        "entry not found.\n\n"
    );
    let shown = cli(&sock, "show map #1");
    assert!(
        shown.contains(" new.test b\n") && !shown.contains("b.test a"),
        "{shown:?}"
    );
    // map_dom follows too.
    assert_eq!(cli(&sock, "add map #0 org b"), "\n");
    assert_eq!(tag(s.dom, &sni("unknown.org")), B, "map_dom after add map");

    // The flow opened before the changes still reaches its server (B echoes the
    // hello, then what follows).
    let hello = sni("b.test");
    let mut echoed = vec![0u8; hello.len()];
    open.read_exact(&mut echoed).expect("echoed hello");
    assert_eq!(echoed, hello);
    open.write_all(b"still here").expect("write");
    let mut back = [0u8; 10];
    open.read_exact(&mut back).expect("echo");
    assert_eq!(&back, b"still here");
}

#[test]
fn peeked_bytes_reach_the_server_intact() {
    for mode in forwarding_modes() {
        let s = start(mode);
        let mut sent = sni("a.example.com");
        sent.extend_from_slice(&pattern(256 * 1024, 7));
        let mut c = connect(s.dom);
        c.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let writer = {
            let mut w = c.try_clone().expect("clone");
            let data = sent.clone();
            std::thread::spawn(move || {
                write_random_chunks(&mut w, &data, 16 * 1024, 3);
                w.shutdown(Shutdown::Write).expect("shutdown");
            })
        };
        let got = read_to_end(&mut c).expect("read");
        writer.join().expect("writer");
        assert_eq!(got.first(), Some(&A), "{mode}: routed to A");
        assert_eq!(got.len(), sent.len() + 1, "{mode}: length");
        assert_eq!(sha256(&got[1..]), sha256(&sent), "{mode}: bytes differ");
        assert_mode(&s.shunt.sock(), mode);
    }
}
