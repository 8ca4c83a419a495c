//! ACLs seen from outside: `tcp-request connection reject` as an IP allow-list
//! (a client bound to a second loopback address is refused and counted in the
//! frontend's `dcon`), `use_backend ... if { dst_port N }` routing, and sample
//! configurations (tests/testdata/acl/) that `shunt -c` judges as HAProxy 2.6's
//! `haproxy -c` does, with the same error and warning lines.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use shunt_tests::*;

/// A connection from `src` (a loopback address, port chosen by the kernel) to `to`.
fn connect_from(src: [u8; 4], to: SocketAddr) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    let from = SocketAddr::from((src, 0));
    s.bind(&from.into())
        .expect("bind client to a loopback address");
    s.connect(&to.into()).expect("connect");
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s
}

/// The tag byte the server writes first, or `None` when the proxy closed the
/// connection without one.
fn tag_of(mut s: TcpStream) -> Option<u8> {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(1) => {
            s.write_all(b"x").expect("echo");
            Some(b[0])
        }
        _ => None,
    }
}

#[test]
fn allow_list_rejects_other_sources_and_counts_dcon() {
    let server = Server::tagged_echo(7);
    let port = free_port();
    let cfg = simple_config(port, &[server.addr], "").replace(
        "    default_backend be\n",
        "    tcp-request connection reject if !{ src 127.0.0.1 }\n    default_backend be\n",
    );
    let shunt = Shunt::start(&cfg, &[]);
    let fe = SocketAddr::from(([127, 0, 0, 1], port));
    assert_eq!(tag_of(connect_from([127, 0, 0, 1], fe)), Some(7), "allowed");
    assert_eq!(tag_of(connect_from([127, 0, 0, 2], fe)), None, "refused");
    assert_eq!(tag_of(connect_from([127, 0, 0, 2], fe)), None, "refused");
    assert_eq!(tag_of(connect_from([127, 0, 0, 1], fe)), Some(7), "allowed");
    eventually("two denied connections", Duration::from_secs(5), || {
        stat(&shunt.sock(), "fe", "FRONTEND", "dcon") == 2
    });
    assert_eq!(
        stat(&shunt.sock(), "fe", "FRONTEND", "stot"),
        2,
        "refused connections are no sessions"
    );
    assert_eq!(stat(&shunt.sock(), "be", "BACKEND", "stot"), 2);
}

#[test]
fn first_matching_connection_rule_decides() {
    let server = Server::tagged_echo(9);
    let port = free_port();
    let cfg = simple_config(port, &[server.addr], "").replace(
        "    default_backend be\n",
        "    acl two src 127.0.0.2\n    tcp-request connection accept if two\n\
         \x20   tcp-request connection reject if { src 127.0.0.0/8 }\n    default_backend be\n",
    );
    let shunt = Shunt::start(&cfg, &[]);
    let fe = SocketAddr::from(([127, 0, 0, 1], port));
    assert_eq!(
        tag_of(connect_from([127, 0, 0, 2], fe)),
        Some(9),
        "accept stops the rules"
    );
    assert_eq!(
        tag_of(connect_from([127, 0, 0, 3], fe)),
        None,
        "the reject applies"
    );
    eventually("one denied connection", Duration::from_secs(5), || {
        stat(&shunt.sock(), "fe", "FRONTEND", "dcon") == 1
    });
}

#[test]
fn dst_port_and_named_acls_pick_the_backend() {
    let servers: Vec<Server> = (0..3).map(Server::tagged_echo).collect();
    let (p1, p2, p3) = (free_port(), free_port(), free_port());
    let cfg = format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend fe\n    bind 127.0.0.1:{p1}\n    bind 127.0.0.1:{p2}\n    bind 127.0.0.1:{p3}\n\
         \x20   acl second dst_port {p2}\n    acl local src 127.0.0.0/8\n\
         \x20   use_backend a if {{ dst_port {p1} }}\n    use_backend b if second local\n\
         \x20   use_backend a unless local\n    default_backend c\n\n\
         backend a\n    server s {}\n\nbackend b\n    server s {}\n\nbackend c\n    server s {}\n",
        servers[0].addr, servers[1].addr, servers[2].addr
    );
    let _shunt = Shunt::start(&cfg, &[]);
    let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    assert_eq!(tag_of(connect_from([127, 0, 0, 1], at(p1))), Some(0));
    assert_eq!(tag_of(connect_from([127, 0, 0, 1], at(p2))), Some(1));
    assert_eq!(tag_of(connect_from([127, 0, 0, 2], at(p2))), Some(1));
    assert_eq!(
        tag_of(connect_from([127, 0, 0, 1], at(p3))),
        Some(2),
        "no rule: default_backend"
    );
}

/// `haproxy -c -f FILE` from this directory: (exit code, its `parsing [...]` lines).
fn haproxy_check(cfg: &Path) -> Option<(i32, Vec<String>)> {
    let out = Command::new("haproxy")
        .arg("-c")
        .arg("-f")
        .arg(cfg)
        .output()
        .ok()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Some((out.status.code().unwrap_or(-1), parsing_lines(&text)))
}

/// The `parsing [file:line] : ...` messages of a checker's output, prefixes cut.
fn parsing_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.find("parsing [").map(|i| l[i..].to_string()))
        .collect()
}

#[test]
fn sample_configs_get_haproxys_verdict() {
    let cases = [
        ("testdata/acl/valid.cfg", true),
        ("testdata/acl/invalid.cfg", false),
        ("testdata/acl/no_such_acl.cfg", false),
        ("testdata/acl/warnings.cfg", true),
    ];
    let haproxy = Command::new("haproxy").arg("-v").output().is_ok();
    if !haproxy {
        eprintln!("SKIP the HAProxy half of sample_configs_get_haproxys_verdict: no haproxy binary (apt-get install haproxy); shunt's verdicts are still checked");
    }
    for (file, valid) in cases {
        let path = Path::new(file);
        let (code, _, err) = check_config(&[path]);
        assert_eq!(code == 0, valid, "shunt -c -f {file}: {err}");
        let ours = parsing_lines(&err);
        assert!(valid || !ours.is_empty(), "{file}: no located error: {err}");
        if haproxy {
            let (hcode, theirs) = haproxy_check(path).expect("run haproxy -c");
            assert_eq!(hcode == 0, valid, "haproxy -c -f {file}: {theirs:#?}");
            assert_eq!(
                ours, theirs,
                "{file}: shunt and HAProxy word the errors and warnings alike"
            );
        }
    }
}

#[test]
fn sni_conditions_route_with_one_peek() {
    let servers: Vec<Server> = (0..3).map(Server::tagged_echo).collect();
    let port = free_port();
    let cfg = format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n    tcp-request inspect-delay 2s\n\n\
         frontend fe\n    bind 127.0.0.1:{port}\n    acl shop req.ssl_sni -i -m beg shop.\n\
         \x20   use_backend a if {{ req_ssl_sni -m end .example.com }} !shop\n\
         \x20   use_backend b if shop || {{ req.ssl_sni -m reg ^b[0-9]+\\.test$ }}\n    default_backend c\n\n\
         backend a\n    server s {}\n\nbackend b\n    server s {}\n\nbackend c\n    server s {}\n",
        servers[0].addr, servers[1].addr, servers[2].addr
    );
    let _shunt = Shunt::start(&cfg, &[]);
    let fe = SocketAddr::from(([127, 0, 0, 1], port));
    let tag = |hello: Vec<u8>| {
        let mut s = connect_from([127, 0, 0, 1], fe);
        s.write_all(&hello).expect("send hello");
        let mut b = [0u8; 1];
        s.read_exact(&mut b).expect("server tag");
        // The peeked hello reaches the server whole (after the tag, echoed back).
        let mut echo = vec![0u8; hello.len()];
        s.read_exact(&mut echo).expect("echoed hello");
        assert_eq!(echo, hello, "hello forwarded intact");
        b[0]
    };
    assert_eq!(tag(client_hello(Some("www.example.com"))), 0);
    assert_eq!(tag(client_hello(Some("SHOP.example.com"))), 1);
    assert_eq!(tag(client_hello(Some("b42.test"))), 1);
    assert_eq!(tag(client_hello(Some("b42.test.org"))), 2);
    assert_eq!(tag(client_hello(None)), 2, "no name: no SNI term matches");
}
