//! Maps that route, seen from outside: a `use_backend %[src,map_ip(FILE)]` frontend,
//! clients bound to chosen source addresses, map edits over the stats socket.
//!
//! Checks that the client address picks the mapped backend (longest prefix, default
//! otherwise), that after `set map`/`del map`/`add map` the next flow follows the change
//! while a flow already open keeps its server, and the batch: five `add map` on
//! one line from a client that closes at once are all applied, 200 times over. Also
//! HAProxy's versions: entries added to a prepared version route nothing until
//! `commit map` swaps the version in, and then the next flow follows it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use shunt_tests::*;

/// Connect from `127.0.0.<host>` and read the server's tag; the stream stays open.
fn open_from(addr: SocketAddr, host: u8) -> (TcpStream, u8) {
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    sock.bind(&SocketAddr::from(([127, 0, 0, host], 0)).into())
        .expect("bind client address");
    sock.connect(&addr.into()).expect("connect");
    let mut s = TcpStream::from(sock);
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut b = [0u8; 1];
    s.read_exact(&mut b).expect("server tag");
    (s, b[0])
}

fn tag_from(addr: SocketAddr, host: u8) -> u8 {
    open_from(addr, host).1
}

/// `entry_cnt` of map `#0` from `show map`.
fn entry_cnt(sock: &Path) -> usize {
    let out = cli(sock, "show map");
    let n = out
        .split("entry_cnt=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no entry_cnt in {out:?}"));
    n.parse().expect("entry_cnt")
}

const A: u8 = 0;
const B: u8 = 1;
const DEFAULT: u8 = 2;

struct Setup {
    shunt: Shunt,
    addr: SocketAddr,
    _servers: Vec<Server>,
    _maps: TempDir,
}

fn start(map: &str) -> Setup {
    let servers: Vec<Server> = (0..3).map(Server::tagged_echo).collect();
    let maps = TempDir::new("maps");
    let map_path = maps.path().join("src.map");
    std::fs::write(&map_path, map).expect("write map");
    let port = free_port();
    let cfg = format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n\ndefaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend fe\n    bind 127.0.0.1:{port}\n    use_backend %[src,map_ip({})]\n    default_backend dflt\n\n\
         backend a\n    server s {}\n\nbackend b\n    server s {}\n\nbackend dflt\n    server s {}\n",
        map_path.display(),
        servers[0].addr,
        servers[1].addr,
        servers[2].addr
    );
    let shunt = Shunt::start(&cfg, &["--forward-mode", "copy"]);
    Setup {
        shunt,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        _servers: servers,
        _maps: maps,
    }
}

#[test]
fn src_map_routes_and_changes_apply_to_the_next_flow_only() {
    let s = start("# clients\n127.0.0.2 a\n127.0.0.3 b\n127.0.0.9 nosuchbackend\n");
    let sock = s.shunt.sock();
    assert_eq!(tag_from(s.addr, 2), A);
    assert_eq!(tag_from(s.addr, 3), B);
    assert_eq!(tag_from(s.addr, 4), DEFAULT, "no key: default_backend");
    assert_eq!(tag_from(s.addr, 9), DEFAULT, "value naming no backend");
    let listed = cli(&sock, "show map");
    assert!(
        listed.starts_with("# id (file) description\n0 (") && listed.contains("entry_cnt=3\n"),
        "{listed:?}"
    );

    // A flow opened before the change keeps its server.
    let (mut open, tag) = open_from(s.addr, 2);
    assert_eq!(tag, A);

    assert_eq!(cli(&sock, "set map #0 127.0.0.2 b"), "\n");
    assert_eq!(tag_from(s.addr, 2), B, "next flow follows set map");
    assert_eq!(cli(&sock, "del map #0 127.0.0.3"), "\n");
    assert_eq!(tag_from(s.addr, 3), DEFAULT, "next flow follows del map");
    assert_eq!(cli(&sock, "add map #0 127.0.0.0/24 a"), "\n");
    assert_eq!(tag_from(s.addr, 3), A, "the /24 now matches");
    assert_eq!(tag_from(s.addr, 2), B, "the /32 still wins");
    assert_eq!(
        cli(&sock, "get map #0 127.0.0.77"),
        "type=ip, case=sensitive, found=yes, idx=tree, key=\"127.0.0.0/24\", value=\"a\", type=\"str\"\n\n"
    );
    assert_eq!(cli(&sock, "del map #0 127.0.0.3"), "Key not found.\n\n");

    // The open flow is untouched: still connected to A, still forwarding.
    open.write_all(b"still here")
        .expect("write on the open flow");
    let mut back = [0u8; 10];
    open.read_exact(&mut back).expect("echo on the open flow");
    assert_eq!(&back, b"still here");

    assert_eq!(cli(&sock, "clear map #0"), "\n");
    assert_eq!(tag_from(s.addr, 2), DEFAULT);
}

#[test]
fn five_add_maps_from_a_client_that_closes_at_once_are_all_applied_200_times() {
    let s = start("127.0.0.2 a\n");
    let sock = s.shunt.sock();
    let line = b"add map #0 10.0.0.1 1; add map #0 10.0.0.2 2; add map #0 10.0.0.3 3; add map #0 10.0.0.4 4; add map #0 10.0.0.5 5\n";
    for run in 1..=200usize {
        let mut c = UnixStream::connect(&sock).expect("connect stats socket");
        c.write_all(line).expect("write batch");
        // Close without reading a byte.
        drop(c);
        // The batch is applied once shunt has read it; wait for it, bounded.
        let want = 1 + 5 * run;
        let t0 = std::time::Instant::now();
        loop {
            let n = entry_cnt(&sock);
            if n == want {
                break;
            }
            assert!(
                n < want && t0.elapsed() < Duration::from_secs(5),
                "run {run}: entry_cnt {n}, want {want}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let shown = cli(&sock, "show map #0");
    for k in 1..=5 {
        let key = format!(" 10.0.0.{k} {k}\n");
        assert_eq!(shown.matches(&key).count(), 200, "entries of key {k}");
    }
    // The last added 10.0.0.5 routes nowhere (value "5" names no backend).
    assert_eq!(tag_from(s.addr, 2), A);
}

#[test]
fn prepared_version_routes_nothing_until_commit_swaps_it_in() {
    let s = start("127.0.0.2 a\n127.0.0.3 a\n");
    let sock = s.shunt.sock();
    assert_eq!(cli(&sock, "prepare map #0"), "New version created: 1\n\n");
    assert!(cli(&sock, "show map").contains(" curr_ver=0 next_ver=1 entry_cnt=2\n"));
    // Version 1: 127.0.0.2 goes to b, 127.0.0.0/24 to b; 127.0.0.3 has no key.
    assert_eq!(cli(&sock, "add map @1 #0 127.0.0.2 b"), "\n");
    assert_eq!(cli(&sock, "add map @1 #0 <<\n127.0.0.0/24 b\n"), "\n");
    let v1: Vec<String> = cli(&sock, "show map @1 #0")
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(_, kv)| kv.to_owned()))
        .collect();
    assert_eq!(v1, ["127.0.0.2 b", "127.0.0.0/24 b"]);
    // Flows still route by version 0.
    assert_eq!(tag_from(s.addr, 2), A, "prepared version is invisible");
    assert_eq!(tag_from(s.addr, 3), A);
    assert_eq!(tag_from(s.addr, 4), DEFAULT);
    let (mut open, tag) = open_from(s.addr, 2);
    assert_eq!(tag, A);

    assert_eq!(
        cli(&sock, "commit map @2 #0"),
        "Version number out of range.\n\n"
    );
    assert_eq!(cli(&sock, "commit map @1 #0"), "\n");
    assert!(cli(&sock, "show map").contains(" curr_ver=1 next_ver=1 entry_cnt=2\n"));
    assert_eq!(tag_from(s.addr, 2), B, "the next flow follows version 1");
    assert_eq!(tag_from(s.addr, 3), B, "old keys are gone, the /24 matches");
    assert_eq!(tag_from(s.addr, 4), B);
    assert_eq!(tag_from(s.addr, 5), B);

    // The flow opened before the commit still forwards to A.
    open.write_all(b"still here")
        .expect("write on the open flow");
    let mut back = [0u8; 10];
    open.read_exact(&mut back).expect("echo on the open flow");
    assert_eq!(&back, b"still here");
}
