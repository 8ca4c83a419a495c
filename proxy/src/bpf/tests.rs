//! Tests of the loader and the verdict on the real kernel.
//!
//! Each test loads its own program and maps (so counts are exact and tests
//! may run in parallel), and uses TCP pairs on 127.0.0.1 port 0. With
//! `SHUNT_REQUIRE_BPF=1` a load failure fails the test; without it the test
//! prints a loud skip reason and returns.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use super::*;
use proxy_common::{
    CTR_NO_FLOW_CTL, CTR_PASS_NOT_READY, CTR_PASS_UNACKED, CTR_REDIRECT_FAILED, FLOW_CTL_SIZE,
    FLOW_STATE_SIZE, FLOW_STATS_SIZE,
};

/// How long a test waits for bytes that should arrive.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes sent through the kernel path in the main test.
const BULK: usize = 1 << 20;
/// Bytes of the small writes in the pass/miss tests.
const SMALL: usize = 4096;
/// How long "nothing arrived" is given to be wrong.
const QUIET: Duration = Duration::from_millis(200);

fn load_or_skip(test: &str) -> Option<Bpf> {
    match Bpf::load() {
        Ok(bpf) => Some(bpf),
        Err(e) => {
            if std::env::var("SHUNT_REQUIRE_BPF").is_ok_and(|v| v == "1") {
                panic!(
                    "{test}: BPF load failed with SHUNT_REQUIRE_BPF=1: {}",
                    e.reason()
                );
            }
            // Written to the stderr handle, not with eprintln!, so libtest's
            // capture does not hide the skip of a passing test.
            let _ = writeln!(
                std::io::stderr(),
                "\n!!!!! SKIPPED {test}: BPF unavailable: {} \
                 (set SHUNT_REQUIRE_BPF=1 to make this fail)\n",
                e.reason()
            );
            None
        }
    }
}

/// A connected pair `(connector, acceptor)` on 127.0.0.1.
fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local_addr");
    let connector = TcpStream::connect(addr).expect("connect");
    let (acceptor, _) = listener.accept().expect("accept");
    for s in [&connector, &acceptor] {
        s.set_read_timeout(Some(IO_TIMEOUT)).expect("SO_RCVTIMEO");
        s.set_nodelay(true).expect("TCP_NODELAY");
    }
    (connector, acceptor)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn read_exactly(s: &mut TcpStream, n: usize, what: &str) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut got = 0;
    while got < n {
        assert!(
            Instant::now() < deadline,
            "{what}: only {got} of {n} bytes within {IO_TIMEOUT:?}"
        );
        match s.read(&mut buf[got..]) {
            Ok(0) => panic!("{what}: EOF after {got} of {n} bytes"),
            Ok(k) => got += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("{what}: read failed after {got} of {n} bytes: {e}"),
        }
    }
    buf
}

fn assert_quiet(s: &mut TcpStream, what: &str) {
    std::thread::sleep(QUIET);
    s.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("{what}: expected nothing readable, got {other:?}"),
    }
    s.set_nonblocking(false).expect("blocking");
}

#[test]
fn shared_type_sizes_are_the_asserted_ones() {
    assert_eq!(std::mem::size_of::<FlowCtl>(), FLOW_CTL_SIZE);
    assert_eq!(std::mem::size_of::<FlowStats>(), FLOW_STATS_SIZE);
    assert_eq!(std::mem::size_of::<FlowState>(), FLOW_STATE_SIZE);
    assert_eq!(std::mem::size_of::<SockKey>(), 8);
}

#[test]
fn kernel_maps_use_the_shared_layouts() {
    let Some(bpf) = load_or_skip("kernel_maps_use_the_shared_layouts") else {
        return;
    };
    let ctl = bpf.flow_ctl.map().info().expect("FLOW_CTL info");
    assert_eq!(ctl.key_size() as usize, std::mem::size_of::<SockKey>());
    assert_eq!(ctl.value_size() as usize, FLOW_CTL_SIZE);
    assert_eq!(ctl.max_entries(), FLOW_CAPACITY);
    let stats = bpf.flow_stats.map().info().expect("FLOW_STATS info");
    assert_eq!(stats.value_size() as usize, FLOW_STATS_SIZE);
    let socks = bpf.socks.map().info().expect("SOCKHASH info");
    assert_eq!(socks.max_entries(), SOCKHASH_CAPACITY);
    assert_eq!(
        bpf.error_counters().expect("counters"),
        [0; COUNTERS_LEN as usize]
    );
}

/// a <-> b and c <-> d; the proxy holds b and c. With the pair inserted and
/// ready, bytes from a reach d (and d's reach a) while nobody reads b or c.
#[test]
fn redirects_both_ways_then_removes_cleanly() {
    let Some(bpf) = load_or_skip("redirects_both_ways_then_removes_cleanly") else {
        return;
    };
    let (mut a, mut b) = tcp_pair();
    let (mut c, mut d) = tcp_pair();

    let (cb, cc) = bpf
        .insert_pair(b.as_fd(), c.as_fd())
        .expect("insert_pair(b, c)");
    assert_ne!(cb, cc);
    assert_eq!(bpf.sockhash_len(), 2);
    assert_eq!(bpf.flow_map_len(), 2);
    assert_eq!(bpf.flow_stats_len(), 2);
    bpf.set_ready(cb, true).expect("ready b");
    bpf.set_ready(cc, true).expect("ready c");

    let up = pattern(BULK, 7);
    a.write_all(&up).expect("write a");
    assert_eq!(read_exactly(&mut d, BULK, "a->d"), up, "bytes a->d differ");
    let down = pattern(BULK / 2, 99);
    d.write_all(&down).expect("write d");
    assert_eq!(
        read_exactly(&mut a, BULK / 2, "d->a"),
        down,
        "bytes d->a differ"
    );

    // Userspace never saw a byte: the proxy's sockets have nothing to read.
    assert_quiet(&mut b, "b (redirected)");
    assert_quiet(&mut c, "c (redirected)");

    let from_client = bpf.flow_state(cb).expect("state of b").stats;
    let from_server = bpf.flow_state(cc).expect("state of c").stats;
    assert_eq!(from_client.redirected_bytes, BULK as u64);
    assert!(from_client.redirected_segs >= 1);
    assert_eq!(from_client.passed_bytes, 0);
    assert_eq!(from_server.redirected_bytes, (BULK / 2) as u64);
    assert_eq!(from_server.passed_bytes, 0);
    assert_eq!(
        from_client.redirect_failures + from_server.redirect_failures,
        0
    );

    let last = bpf.remove_pair(cb, cc);
    assert_eq!(last.from_client, from_client);
    assert_eq!(last.from_server, from_server);
    assert_eq!(bpf.sockhash_len(), 0);
    assert_eq!(bpf.flow_map_len(), 0);
    assert_eq!(bpf.flow_stats_len(), 0);
    assert!(bpf.flow_state(cb).is_none());

    // Out of the map, the sockets are plain sockets again.
    a.write_all(b"after").expect("write a after removal");
    assert_eq!(read_exactly(&mut b, 5, "a->b after removal"), b"after");
    let errors = bpf.error_counters().expect("counters");
    assert_eq!(errors[CTR_REDIRECT_FAILED as usize], 0);
    assert_eq!(errors[CTR_NO_FLOW_CTL as usize], 0);
}

/// Before `ready` the verdict passes; after `ready` with an outdated ack it
/// still passes; once userspace acknowledges what it forwarded, the kernel
/// takes over, and the peer sees userspace's bytes before the kernel's.
#[test]
fn passes_until_ready_and_acknowledged_in_order() {
    let Some(bpf) = load_or_skip("passes_until_ready_and_acknowledged_in_order") else {
        return;
    };
    let (mut a, mut b) = tcp_pair();
    let (mut c, mut d) = tcp_pair();
    let (cb, _cc) = bpf
        .insert_pair(b.as_fd(), c.as_fd())
        .expect("insert_pair(b, c)");

    // Not ready: SK_PASS, userspace reads at b and forwards to c.
    let first = pattern(SMALL, 1);
    a.write_all(&first).expect("write a (1)");
    assert_eq!(read_exactly(&mut b, SMALL, "passed at b (1)"), first);
    assert_quiet(&mut d, "d before forwarding");
    c.write_all(&first).expect("forward (1)");
    let state = bpf.flow_state(cb).expect("state");
    assert_eq!(state.stats.passed_bytes, SMALL as u64);
    assert_eq!(state.stats.redirected_bytes, 0);

    // Ready but not acknowledged: still passes.
    bpf.set_ready(cb, true).expect("ready");
    let second = pattern(SMALL, 2);
    a.write_all(&second).expect("write a (2)");
    assert_eq!(read_exactly(&mut b, SMALL, "passed at b (2)"), second);
    c.write_all(&second).expect("forward (2)");
    assert_eq!(bpf.flow_state(cb).expect("state").stats.redirected_bytes, 0);

    // Acknowledge exactly what userspace read: the kernel takes over.
    bpf.ack_passed(cb, 2 * SMALL as u64).expect("ack");
    let third = pattern(SMALL, 3);
    a.write_all(&third).expect("write a (3)");
    let mut expected = first.clone();
    expected.extend_from_slice(&second);
    expected.extend_from_slice(&third);
    assert_eq!(
        read_exactly(&mut d, 3 * SMALL, "d in order"),
        expected,
        "order at d"
    );
    assert_quiet(&mut b, "b after takeover");
    let state = bpf.flow_state(cb).expect("state");
    assert_eq!(state.stats.redirected_bytes, SMALL as u64);
    assert_eq!(state.stats.passed_bytes, 2 * SMALL as u64);

    // Paused: passes again.
    bpf.set_paused(cb, true).expect("pause");
    a.write_all(b"paused").expect("write a (paused)");
    assert_eq!(read_exactly(&mut b, 6, "passed while paused"), b"paused");

    let errors = bpf.error_counters().expect("counters");
    assert!(errors[CTR_PASS_NOT_READY as usize] >= 1, "{errors:?}");
    assert!(errors[CTR_PASS_UNACKED as usize] >= 1, "{errors:?}");
    assert!(
        errors[proxy_common::CTR_PASS_PAUSED as usize] >= 1,
        "{errors:?}"
    );
    bpf.remove_pair(cb, _cc);
    assert_eq!(
        bpf.sockhash_len() + bpf.flow_map_len() + bpf.flow_stats_len(),
        0
    );
}

/// A socket whose own cookie has no SOCKHASH entry (ready flow state, but a
/// redirect miss), and one without any flow state: both pass to userspace,
/// nothing is dropped, and the failures are counted.
#[test]
fn misses_pass_to_userspace() {
    let Some(bpf) = load_or_skip("misses_pass_to_userspace") else {
        return;
    };

    // Redirect miss: x is in the SOCKHASH, but under a key that is not its
    // cookie; its flow state says ready.
    let (mut peer_x, x) = tcp_pair();
    let cx = socket_cookie(x.as_fd()).expect("cookie x");
    bpf.create_flow(cx, x.as_fd()).expect("flow entries for x");
    bpf.set_ready(cx, true).expect("ready x");
    bpf.insert_raw(cx ^ 0x5a5a, x.as_fd())
        .expect("insert x under a foreign key");
    let data = pattern(SMALL, 5);
    peer_x.write_all(&data).expect("write to x");
    let mut x = x;
    assert_eq!(
        read_exactly(&mut x, SMALL, "passed at x"),
        data,
        "miss must not drop"
    );
    let state = bpf.flow_state(cx).expect("state x");
    assert!(state.stats.redirect_failures >= 1, "{state:?}");
    assert_eq!(state.stats.passed_bytes, SMALL as u64);
    assert_eq!(state.stats.redirected_bytes, 0);

    // No flow state at all: y is in the SOCKHASH under its own cookie.
    let (mut peer_y, mut y) = tcp_pair();
    let cy = socket_cookie(y.as_fd()).expect("cookie y");
    bpf.insert_raw(cy, y.as_fd()).expect("insert y");
    peer_y.write_all(&data).expect("write to y");
    assert_eq!(
        read_exactly(&mut y, SMALL, "passed at y"),
        data,
        "no-state must not drop"
    );

    let errors = bpf.error_counters().expect("counters");
    assert!(errors[CTR_REDIRECT_FAILED as usize] >= 1, "{errors:?}");
    assert!(errors[CTR_NO_FLOW_CTL as usize] >= 1, "{errors:?}");

    bpf.delete_raw(cx ^ 0x5a5a).expect("delete x");
    bpf.delete_raw(cy).expect("delete y");
    bpf.forget_flow(cx);
    assert_eq!(
        bpf.sockhash_len() + bpf.flow_map_len() + bpf.flow_stats_len(),
        0
    );
}

/// A socket that cannot enter the map (CLOSE_WAIT: its peer sent FIN before
/// the insertion) is refused with a typed error and leaves nothing behind.
#[test]
fn refused_insert_leaves_maps_empty() {
    let Some(bpf) = load_or_skip("refused_insert_leaves_maps_empty") else {
        return;
    };
    let (closer, close_wait) = tcp_pair();
    closer
        .shutdown(std::net::Shutdown::Write)
        .expect("shutdown");
    let mut probe = [0u8; 1];
    let mut cw = close_wait.try_clone().expect("clone");
    assert_eq!(
        cw.read(&mut probe).expect("read EOF"),
        0,
        "FIN must have arrived"
    );
    let (_a, b) = tcp_pair();

    let err = bpf
        .insert_pair(close_wait.as_fd(), b.as_fd())
        .expect_err("CLOSE_WAIT client");
    assert!(
        matches!(
            err,
            InsertError::NotSupported {
                rolled_back_client: false,
                ..
            }
        ),
        "{err:?}"
    );
    let err = bpf
        .insert_pair(b.as_fd(), close_wait.as_fd())
        .expect_err("CLOSE_WAIT server");
    assert!(
        matches!(
            err,
            InsertError::NotSupported {
                rolled_back_client: true,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        bpf.sockhash_len() + bpf.flow_map_len() + bpf.flow_stats_len(),
        0
    );

    // EBUSY: a socket can be in one verdict-attached map only once.
    let (_c, d) = tcp_pair();
    let (cb, cd) = bpf.insert_pair(b.as_fd(), d.as_fd()).expect("insert");
    let before = bpf.flow_state(cb).expect("state of the live pair");
    let (_e, f) = tcp_pair();
    let err = bpf
        .insert_pair(f.as_fd(), b.as_fd())
        .expect_err("b's cookie twice");
    assert!(
        matches!(
            err,
            InsertError::Busy {
                errno: libc::EEXIST,
                ..
            }
        ),
        "{err:?}"
    );
    // The same socket in a second verdict-attached map: the kernel says EBUSY.
    let other = Bpf::load().expect("second load");
    let (_g, h) = tcp_pair();
    let err = other
        .insert_pair(b.as_fd(), h.as_fd())
        .expect_err("b in a second map");
    assert!(
        matches!(
            err,
            InsertError::Busy {
                errno: libc::EBUSY,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        other.sockhash_len() + other.flow_map_len() + other.flow_stats_len(),
        0
    );
    assert_eq!(
        bpf.sockhash_len(),
        2,
        "the refused pairs left nothing behind"
    );
    assert_eq!(bpf.flow_map_len(), 2);
    assert_eq!(
        bpf.flow_state(cb),
        Some(before),
        "the live pair's state survived"
    );
    bpf.remove_pair(cb, cd);
    assert_eq!(
        bpf.sockhash_len() + bpf.flow_map_len() + bpf.flow_stats_len(),
        0
    );
}

/// A `tracing` writer appending everything to one shared buffer.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        let bytes = self.0.lock().expect("capture lock").clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("capture lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn kernel_log_level_follows_the_tracing_level() {
    assert_eq!(kernel_log_level(LevelFilter::OFF), 0);
    assert_eq!(kernel_log_level(LevelFilter::ERROR), 1);
    assert_eq!(kernel_log_level(LevelFilter::INFO), 3);
    assert_eq!(kernel_log_level(LevelFilter::DEBUG), 4);
    assert_eq!(kernel_log_level(LevelFilter::TRACE), 5);
}

/// The program's records (a redirect miss, a missing flow entry, the first
/// pass over a redirect limit) reach a `tracing` subscriber, formatted as
/// `shunt -v` prints them, with the cookies in them, through the future of
/// [`Bpf::take_logger`] polled on a current-thread runtime (no extra thread).
#[test]
fn kernel_log_records_reach_tracing_with_the_cookie() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .finish();
    // Before the load: the kernel-side level is taken from it.
    let _guard = tracing::subscriber::set_default(subscriber);
    let Some(bpf) = load_or_skip("kernel_log_records_reach_tracing_with_the_cookie") else {
        return;
    };

    // Redirect miss (x under a foreign key), as in misses_pass_to_userspace.
    let (mut peer_x, mut x) = tcp_pair();
    let cx = socket_cookie(x.as_fd()).expect("cookie x");
    bpf.create_flow(cx, x.as_fd()).expect("flow entries for x");
    bpf.set_ready(cx, true).expect("ready x");
    bpf.insert_raw(cx ^ 0x5a5a, x.as_fd()).expect("insert x");
    let data = pattern(SMALL, 9);
    peer_x.write_all(&data).expect("write to x");
    assert_eq!(read_exactly(&mut x, SMALL, "passed at x"), data);

    // No flow entry: y under its own cookie, without flow state.
    let (mut peer_y, mut y) = tcp_pair();
    let cy = socket_cookie(y.as_fd()).expect("cookie y");
    bpf.insert_raw(cy, y.as_fd()).expect("insert y");
    peer_y.write_all(&data).expect("write to y");
    assert_eq!(read_exactly(&mut y, SMALL, "passed at y"), data);

    // Over the redirect limit: a -> b redirected to c -> d up to SMALL
    // bytes, then the next write passes at b (one debug record).
    let (mut a, mut b) = tcp_pair();
    let (c, mut d) = tcp_pair();
    let (cb, cc) = bpf.insert_pair(b.as_fd(), c.as_fd()).expect("insert b, c");
    let limited = FlowCtl {
        ready: 1,
        redirect_limit: SMALL as u64,
        ..FlowCtl::default()
    };
    bpf.set_ctl(cb, limited).expect("limit b");
    a.write_all(&data).expect("write a");
    assert_eq!(read_exactly(&mut d, SMALL, "redirected to d"), data);
    a.write_all(&data).expect("write a again");
    assert_eq!(read_exactly(&mut b, SMALL, "passed at b"), data);

    let forward = bpf.take_logger().expect("the object logs: a logger");
    assert!(bpf.take_logger().is_none(), "the logger is handed out once");
    let expected = [
        format!("INFO proxy::bpf::kernel: bpf: redirect failed for cookie {cx} ({SMALL} bytes)"),
        format!("INFO proxy::bpf::kernel: bpf: no flow entry for cookie {cy}"),
        format!(
            "DEBUG proxy::bpf::kernel: bpf: cookie {cb} over its redirect limit of {SMALL} bytes"
        ),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("current-thread runtime");
    runtime.block_on(async {
        let task = tokio::spawn(forward);
        let deadline = Instant::now() + IO_TIMEOUT;
        while !expected
            .iter()
            .all(|e| captured.text().contains(e.as_str()))
        {
            assert!(
                Instant::now() < deadline,
                "log records missing after {IO_TIMEOUT:?}; expected {expected:#?}, got:\n{}",
                captured.text()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        task.abort();
    });
    // One record per event, not one per segment.
    let text = captured.text();
    assert_eq!(text.matches("over its redirect limit").count(), 1, "{text}");

    bpf.remove_pair(cb, cc);
    bpf.delete_raw(cx ^ 0x5a5a).expect("delete x");
    bpf.delete_raw(cy).expect("delete y");
    bpf.forget_flow(cx);
}
