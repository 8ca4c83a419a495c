//! The take-over's second phase through the real binary: a successor that
//! asks for the kernel flows (`_getflows ID commit`) and then never commits —
//! it dies after the transfer, or hangs — must leave the old process serving
//! with every flow. The successor here is the test itself, speaking the
//! protocol on the old process's stats socket and dropping the descriptors it
//! receives, as a process that exits would.
//!
//! Checked: the old process logs that it takes its flows back, a long
//! kernel-forwarded flow keeps moving and ends byte-exact (SHA-256 both ways),
//! new connections are accepted again (the accept hold is released), and a
//! real reload afterwards adopts the flow (so the flow answers the next
//! hand-over: the new generation reached it).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shunt_tests::*;

/// Bytes per write of the long flow's client, and its pause between writes.
const CHUNK: usize = 16 * 1024;
const PAUSE: Duration = Duration::from_millis(10);
/// Longest the long flow may run, whatever happens.
const FLOW_LIMIT: Duration = Duration::from_secs(60);
/// The old process's commit wait (`COMMIT_WAIT` in proxy/src/reload.rs) plus margin.
const COMMIT_WAIT_MARGIN: Duration = Duration::from_secs(8);

fn config(dir: &Path, port: u16, server: SocketAddr) -> String {
    format!(
        "global\n    nbthread 2\n    stats socket {d}/admin.sock level admin expose-fd listeners\n\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 60s\n    timeout server 60s\n\n\
         frontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n\n\
         backend be\n    server s1 {server}\n",
        d = dir.display()
    )
}

/// The kernel id of the instance's SOCKHASH, from bpftool.
fn sockhash_id(sock: &Path) -> u32 {
    let pinned = shunt_tests::reload::pin_dir(sock).join("SHUNT_SOCKS");
    let out = std::process::Command::new("bpftool")
        .args(["-j", "map", "show", "pinned"])
        .arg(&pinned)
        .output()
        .expect("run bpftool (cargo xtask setup installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let id = text.split("\"id\":").nth(1).and_then(|rest| {
        rest.trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|d| d.parse().ok())
    });
    id.unwrap_or_else(|| {
        panic!(
            "no SOCKHASH id for {}: {text} {}",
            pinned.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A long flow through shunt to an echo server: the client writes a known
/// stream and checks the echo; returns (bytes verified so far, failed, done).
struct LongFlow {
    verified: Arc<AtomicU64>,
    failed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<Result<u64, String>>>,
}

impl LongFlow {
    fn start(addr: SocketAddr) -> LongFlow {
        let verified = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (v, f, st) = (verified.clone(), failed.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            let r = Self::run(addr, &v, &st);
            if r.is_err() {
                f.store(true, Ordering::Relaxed);
            }
            r
        });
        LongFlow {
            verified,
            failed,
            stop,
            handle: Some(handle),
        }
    }

    fn run(addr: SocketAddr, verified: &AtomicU64, stop: &AtomicBool) -> Result<u64, String> {
        let mut c = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        let mut seed = 0u64;
        let mut buf = vec![0u8; CHUNK];
        while !stop.load(Ordering::Relaxed) && t0.elapsed() < FLOW_LIMIT {
            seed += 1;
            let chunk = pattern(CHUNK, seed);
            c.write_all(&chunk).map_err(|e| format!("write: {e}"))?;
            c.read_exact(&mut buf).map_err(|e| {
                format!("read after {} bytes: {e}", verified.load(Ordering::Relaxed))
            })?;
            if buf != chunk {
                return Err(format!(
                    "echo differs after {} bytes",
                    verified.load(Ordering::Relaxed)
                ));
            }
            verified.fetch_add(CHUNK as u64, Ordering::Relaxed);
            std::thread::sleep(PAUSE);
        }
        c.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
        let mut rest = Vec::new();
        c.read_to_end(&mut rest)
            .map_err(|e| format!("read to EOF: {e}"))?;
        if !rest.is_empty() {
            return Err(format!("{} bytes after the last echo", rest.len()));
        }
        Ok(verified.load(Ordering::Relaxed))
    }

    /// Wait until `more` further bytes were verified.
    fn wait_progress(&self, what: &str, more: u64) {
        let from = self.verified.load(Ordering::Relaxed);
        eventually(what, Duration::from_secs(20), || {
            assert!(
                !self.failed.load(Ordering::Relaxed),
                "{what}: the long flow failed"
            );
            self.verified.load(Ordering::Relaxed) >= from + more
        });
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let h = self.handle.take().expect("running");
        match h.join().expect("flow thread") {
            Ok(n) => n,
            Err(e) => panic!("the long flow failed: {e}"),
        }
    }
}

/// An echo exchange through shunt (new connections are served).
fn exchange_ok(addr: SocketAddr) -> bool {
    let Ok(mut c) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return false;
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    let msg = pattern(1000, 7);
    let mut back = vec![0u8; msg.len()];
    c.write_all(&msg).is_ok() && c.read_exact(&mut back).is_ok() && back == msg
}

/// Play a successor that asks for the flows and never commits: read the
/// whole answer (dropping the descriptors), then `end` the connection.
fn fake_successor(sock: &Path, id: u32, hang: bool) {
    let mut s = UnixStream::connect(sock).expect("connect stats socket");
    s.write_all(format!("_getflows {id} commit\n").as_bytes())
        .expect("request");
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let mut got = 0usize;
    let mut buf = [0u8; 4096];
    // Read until the old process has sent everything and waits.
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(_) => break,
        }
    }
    assert!(got >= 8, "the old process sent {got} bytes for _getflows");
    if hang {
        // Past the old process's commit wait, connection still open.
        std::thread::sleep(COMMIT_WAIT_MARGIN);
    }
    drop(s);
}

fn no_commit(hang: bool) {
    if !bpf_wanted() {
        return;
    }
    let echo = Server::echo();
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // One directory for both generations: the same stats socket path names
    // the same pinned maps.
    let dir = TempDir::new("takeover");
    let cfg = config(dir.path(), port, echo.addr);
    let mut old = Shunt::start(&cfg, &["--forward-mode", "sockmap"]);
    let sock = dir.path().join("admin.sock");
    let flow = LongFlow::start(addr);
    flow.wait_progress("before the take-over", 256 * 1024);
    let id = sockhash_id(&sock);

    fake_successor(&sock, id, hang);

    eventually(
        "the old process takes its flows back",
        COMMIT_WAIT_MARGIN,
        || {
            old.stderr()
                .contains("did not commit its take-over: this process goes on serving")
        },
    );
    flow.wait_progress("after the failed take-over", 256 * 1024);
    eventually(
        "new connections are served again",
        Duration::from_secs(5),
        || exchange_ok(addr),
    );
    assert!(
        cli(&sock, "show sess").contains("fwd=sockmap"),
        "the flow left the kernel: {}",
        cli(&sock, "show sess")
    );

    // A real reload now adopts the flow (it answers the next hand-over).
    let new = shunt_tests::reload::reload_over(&old, &cfg, &sock, &["--forward-mode", "sockmap"]);
    assert!(
        shunt_tests::reload::plain(&new.stderr())
            .contains("took the kernel flows of the old process flows=1"),
        "the reload after the failed take-over did not adopt the flow:\n{}\nold:\n{}",
        new.stderr(),
        old.stderr()
    );
    assert_eq!(
        old.wait(Duration::from_secs(10)),
        Some(0),
        "old process after the reload:\n{}",
        old.stderr()
    );
    flow.wait_progress("after the reload", 256 * 1024);
    let total = flow.finish();
    assert!(total >= 768 * 1024, "only {total} bytes went through");
    assert!(exchange_ok(addr), "the new process does not serve");
}

#[test]
fn a_successor_that_exits_before_its_commit_leaves_the_flows_with_the_old_process() {
    no_commit(false);
}

#[test]
fn a_successor_that_hangs_before_its_commit_leaves_the_flows_with_the_old_process() {
    no_commit(true);
}
