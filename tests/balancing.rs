//! Load balancing seen from outside: real connections through shunt to
//! counting servers. The exhaustive 10,000-selection checks of every algorithm
//! live in the `lb` unit tests; these confirm the daemon wires them up.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use shunt_tests::*;

/// Servers that answer each connection with their own index byte.
fn tagged_servers(n: u8) -> Vec<Server> {
    (0..n)
        .map(|i| {
            Server::start(move |mut s| {
                let _ = s.write_all(&[i]);
            })
        })
        .collect()
}

fn which_server(addr: SocketAddr, from: Option<[u8; 4]>) -> u8 {
    let s = match from {
        None => connect(addr),
        Some(ip) => {
            let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                .expect("socket");
            sock.bind(&SocketAddr::from((ip, 0)).into())
                .expect("bind client address");
            sock.connect(&addr.into()).expect("connect");
            TcpStream::from(sock)
        }
    };
    let mut s = s;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("t");
    let mut b = [0u8; 1];
    s.read_exact(&mut b).expect("server tag");
    b[0]
}

#[test]
fn weighted_roundrobin_end_to_end() {
    let servers = tagged_servers(3);
    let port = free_port();
    let mut cfg = simple_config(port, &[], "    balance roundrobin\n");
    for (i, s) in servers.iter().enumerate() {
        cfg += &format!("    server s{} {} weight {}\n", i + 1, s.addr, i + 1);
    }
    let _shunt = Shunt::start(&cfg, &["--forward-mode", "copy"]);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut counts = [0usize; 3];
    for _ in 0..600 {
        counts[which_server(addr, None) as usize] += 1;
    }
    for (i, c) in counts.iter().enumerate() {
        let want = 100 * (i + 1);
        assert!(
            c.abs_diff(want) <= want * 3 / 100,
            "server {i}: {c} of 600, want {want}; all {counts:?}"
        );
    }
}

#[test]
fn source_hash_is_stable_per_client_address() {
    let servers = tagged_servers(4);
    let port = free_port();
    let mut cfg = simple_config(port, &[], "    balance source\n");
    for (i, s) in servers.iter().enumerate() {
        cfg += &format!("    server s{} {}\n", i + 1, s.addr);
    }
    let _shunt = Shunt::start(&cfg, &["--forward-mode", "copy"]);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut seen = std::collections::HashSet::new();
    for host in 2..34u8 {
        let first = which_server(addr, Some([127, 0, 0, host]));
        seen.insert(first);
        for _ in 0..4 {
            assert_eq!(
                which_server(addr, Some([127, 0, 0, host])),
                first,
                "client 127.0.0.{host} moved"
            );
        }
    }
    assert!(
        seen.len() >= 3,
        "32 client addresses should spread over the servers: {seen:?}"
    );
}
