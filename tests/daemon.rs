//! The daemon's life cycle through the real binary: pidfile, SIGUSR1
//! soft-stop (listeners close, open flows finish, then exit), hard-stop-after,
//! and SIGTERM closing open flows.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use shunt_tests::*;

fn config(port: u16, server: SocketAddr, global: &str) -> String {
    simple_config(port, &[server], "").replacen(
        "global\n",
        &format!("global\n    pidfile @DIR@/shunt.pid\n{global}"),
        1,
    )
}

fn round_trip(c: &mut TcpStream, msg: &[u8]) {
    c.write_all(msg).expect("send");
    let mut back = vec![0u8; msg.len()];
    c.read_exact(&mut back).expect("echo");
    assert_eq!(back, msg);
}

#[test]
fn soft_stop_finishes_open_flows_then_exits_and_removes_the_pidfile() {
    let server = Server::echo();
    let port = free_port();
    let mut shunt = Shunt::start(&config(port, server.addr, ""), &["--forward-mode", "copy"]);
    let pidfile = shunt.dir().join("shunt.pid");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .expect("pidfile written")
        .trim()
        .parse()
        .expect("pid");
    assert_eq!(pid, shunt.pid(), "pidfile holds shunt's pid");

    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut open = connect(addr);
    open.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("t");
    round_trip(&mut open, b"before");

    shunt.signal(libc::SIGUSR1);
    // Listeners close: new connections are refused soon.
    let t0 = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Err(_) => break,
            Ok(_) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(5),
                    "listener still open after SIGUSR1"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    // The open flow keeps working, and shunt waits for it.
    round_trip(&mut open, b"during soft-stop");
    assert_eq!(
        shunt.wait(Duration::from_millis(300)),
        None,
        "exited with a flow open"
    );
    drop(open);
    assert_eq!(
        shunt.wait(Duration::from_secs(10)),
        Some(0),
        "exit 0 after the last flow"
    );
    assert!(!pidfile.exists(), "pidfile removed at exit");
}

#[test]
fn hard_stop_after_bounds_the_soft_stop() {
    let server = Server::echo();
    let port = free_port();
    let mut shunt = Shunt::start(
        &config(port, server.addr, "    hard-stop-after 1s\n"),
        &["--forward-mode", "splice"],
    );
    let mut open = connect(SocketAddr::from(([127, 0, 0, 1], port)));
    open.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("t");
    round_trip(&mut open, b"hello");
    let t0 = Instant::now();
    shunt.signal(libc::SIGUSR1);
    assert_eq!(
        shunt.wait(Duration::from_secs(10)),
        Some(0),
        "exits after hard-stop-after"
    );
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(5),
        "hard-stop-after 1s, took {took:?}"
    );
    // The held flow was closed.
    let r = open.read(&mut [0u8; 1]);
    assert!(
        matches!(r, Ok(0) | Err(_)),
        "flow closed at hard stop, got {r:?}"
    );
}

#[test]
fn sigterm_closes_open_flows_and_exits() {
    let server = Server::echo();
    let port = free_port();
    let mut shunt = Shunt::start(&config(port, server.addr, ""), &["--forward-mode", "copy"]);
    let mut open = connect(SocketAddr::from(([127, 0, 0, 1], port)));
    open.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("t");
    round_trip(&mut open, b"hello");
    shunt.signal(libc::SIGTERM);
    assert_eq!(shunt.wait(Duration::from_secs(10)), Some(0));
    let r = open.read(&mut [0u8; 1]);
    assert!(
        matches!(r, Ok(0) | Err(_)),
        "flow closed by SIGTERM, got {r:?}"
    );
}
