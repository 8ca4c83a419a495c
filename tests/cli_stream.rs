//! Large CLI answers stream with bounded memory, seen from outside a real daemon.
//!
//! `show map MAP` of a map of [`MAP_ENTRIES`] entries is read through the stats socket
//! slowly (small reads with pauses, so shunt has to wait on a full socket many times)
//! while shunt's `VmRSS` is sampled from `/proc/PID/status`. Every entry line must
//! arrive exactly once, in insertion order, and the resident size may not grow by more
//! than [`MAX_RSS_GROWTH`] during the dump. `show sess` with [`FLOWS`] open flows on
//! one worker (more than one gather chunk) must list every flow exactly once.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use shunt_tests::*;

/// Entries of the big map.
const MAP_ENTRIES: u32 = 300_000;
/// Padding that makes each value long, so the answer (about 28 MB) dwarfs the bound.
const VALUE_PAD: usize = 60;
/// How much shunt's resident size may grow while it dumps the map. What the dump may
/// hold: the selection of the next entries (at most 2 × 32k entry clones, about
/// 3.7 MB), the output buffer (64 KiB and a line), allocator slack. Building the
/// answer whole, as before, costs the answer's size at least twice (the text, then
/// the output buffer it is copied into): over 56 MB here.
const MAX_RSS_GROWTH: u64 = 32 << 20;
/// Bytes read from the socket at a time, and the pause after each read.
const READ_SIZE: usize = 32 * 1024;
const READ_PAUSE: Duration = Duration::from_millis(1);
/// Reads between two RSS samples.
const SAMPLE_EVERY: usize = 16;
/// Bound on the whole slow read.
const DUMP_LIMIT: Duration = Duration::from_secs(120);
/// Open flows listed by `show sess`: more than one gather chunk (256) on one worker.
const FLOWS: usize = 300;
const WAIT: Duration = Duration::from_secs(10);

fn key_of(i: u32) -> String {
    Ipv4Addr::from(0x0a00_0000 + i).to_string()
}

fn value_of(i: u32) -> String {
    format!("v{i}-{}", "x".repeat(VALUE_PAD))
}

fn config(port: u16, map: &Path, server: SocketAddr, extra_global: &str) -> String {
    format!(
        "global\n    stats socket @DIR@/admin.sock level admin\n{extra_global}\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 60s\n    timeout server 60s\n\n\
         frontend fe\n    bind 127.0.0.1:{port}\n    use_backend %[src,map_ip({})]\n    default_backend be\n\n\
         backend be\n    server s {server}\n",
        map.display()
    )
}

#[test]
fn show_map_of_a_large_map_streams_with_bounded_memory() {
    let dir = TempDir::new("cli-stream");
    let map_path = dir.path().join("big.map");
    let mut text = String::with_capacity(MAP_ENTRIES as usize * 90);
    for i in 0..MAP_ENTRIES {
        text.push_str(&format!("{} {}\n", key_of(i), value_of(i)));
    }
    std::fs::write(&map_path, text).expect("write map");
    let server = Server::echo();
    let cfg = config(free_port(), &map_path, server.addr, "");
    let shunt = Shunt::start(&cfg, &["--forward-mode", "copy"]);
    let sock = shunt.sock();
    let pid = shunt.pid();
    let listed = cli(&sock, "show map");
    assert!(
        listed.contains(&format!("entry_cnt={MAP_ENTRIES}\n")),
        "{listed}"
    );
    // Settle, then take the baseline.
    std::thread::sleep(Duration::from_millis(200));
    let base = vm_rss(pid);

    let mut c = UnixStream::connect(&sock).expect("connect stats socket");
    c.set_read_timeout(Some(WAIT)).expect("timeout");
    c.write_all(b"show map #0\n").expect("write");
    let t0 = Instant::now();
    let mut got = Vec::with_capacity(MAP_ENTRIES as usize * 100);
    let mut buf = vec![0u8; READ_SIZE];
    let mut peak = base;
    let mut reads = 0usize;
    loop {
        let n = c.read(&mut buf).expect("read dump");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        reads += 1;
        if reads.is_multiple_of(SAMPLE_EVERY) {
            peak = peak.max(vm_rss(pid));
        }
        assert!(
            t0.elapsed() < DUMP_LIMIT,
            "dump too slow: {} bytes",
            got.len()
        );
        std::thread::sleep(READ_PAUSE);
    }
    peak = peak.max(vm_rss(pid));
    let growth = peak.saturating_sub(base);
    eprintln!(
        "show map: {} bytes in {reads} reads, {:?}; VmRSS {} MB, peak growth {} KB",
        got.len(),
        t0.elapsed(),
        base >> 20,
        growth >> 10
    );

    let text = String::from_utf8(got).expect("utf-8 answer");
    let body = text
        .strip_suffix("\n\n")
        .expect("answer ends with an empty line");
    let mut count = 0u32;
    let mut ptrs = HashSet::new();
    for (i, line) in body.split('\n').enumerate() {
        let i = u32::try_from(i).expect("index");
        let mut words = line.splitn(3, ' ');
        let (ptr, key, value) = (
            words.next().unwrap_or(""),
            words.next().unwrap_or(""),
            words.next().unwrap_or(""),
        );
        assert!(ptr.starts_with("0x"), "line {i}: {line:?}");
        assert!(ptrs.insert(ptr.to_string()), "line {i}: pointer repeated");
        assert_eq!(
            (key, value),
            (key_of(i).as_str(), value_of(i).as_str()),
            "line {i}: every entry once, in insertion order"
        );
        count += 1;
    }
    assert_eq!(count, MAP_ENTRIES, "entry lines");
    assert!(
        growth < MAX_RSS_GROWTH,
        "VmRSS grew by {} KB during the dump (bound {} KB)",
        growth >> 10,
        MAX_RSS_GROWTH >> 10
    );
    // The daemon still answers and routes.
    assert!(cli(&sock, "show map").contains(&format!("entry_cnt={MAP_ENTRIES}\n")));
}

#[test]
fn show_sess_lists_every_open_flow_once() {
    let dir = TempDir::new("cli-stream-sess");
    let map_path = dir.path().join("empty.map");
    std::fs::write(&map_path, "").expect("write map");
    // A server that accepts and holds connections, one thread in all. Its
    // backlog holds every flow: with the default (128), a burst of connects
    // from shunt while this thread waits for a CPU can overflow the accept
    // queue, and the kernel then drops the handshake's last ACK of a
    // SYN-cookie connection, which appears only when shunt sends something:
    // its FIN at `timeout server` (60 s), after every flow ended. That is
    // the likeliest reading of a CI failure (no flow listed, 71 s in).
    let listener = listen_deep("127.0.0.1:0".parse().expect("addr")).expect("bind server");
    let server_addr = listener.local_addr().expect("addr");
    let holder = std::thread::spawn(move || {
        let mut held = Vec::with_capacity(FLOWS);
        while held.len() < FLOWS {
            match listener.accept() {
                Ok((s, _)) => held.push(s),
                Err(_) => break,
            }
        }
        held
    });
    let port = free_port();
    // One worker, so its flows span two gather chunks.
    let cfg = config(port, &map_path, server_addr, "    nbthread 1\n");
    let shunt = Shunt::start(&cfg, &["--forward-mode", "copy"]);
    let sock = shunt.sock();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let t_start = Instant::now();
    let clients: Vec<TcpStream> = (0..FLOWS).map(|_| connect(addr)).collect();
    let t_clients = t_start.elapsed();
    let held = holder.join().expect("holder");
    let t_held = t_start.elapsed();
    assert_eq!(held.len(), FLOWS, "every flow reached the server");

    let srcs: HashSet<String> = clients
        .iter()
        .map(|c| format!(" src={} ", c.local_addr().expect("local addr")))
        .collect();
    let t0 = Instant::now();
    let lines = loop {
        let out = cli(&sock, "show sess");
        assert!(out.ends_with("\n\n") || out == "\n", "{out}");
        let lines: Vec<String> = out
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
        if lines.len() >= FLOWS || t0.elapsed() > WAIT {
            break lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        lines.len(),
        FLOWS,
        "one line per flow (clients connected in {t_clients:?}, the server held them all \
         at {t_held:?}, listed at {:?})",
        t_start.elapsed()
    );
    let ids: HashSet<&str> = lines
        .iter()
        .map(|l| l.split(':').next().unwrap_or(""))
        .collect();
    assert_eq!(ids.len(), FLOWS, "ids distinct");
    for src in &srcs {
        let n = lines.iter().filter(|l| l.contains(src.as_str())).count();
        assert_eq!(n, 1, "flow{src}listed {n} times");
    }
    assert!(lines.iter().all(|l| l.ends_with(" fwd=copy")), "{lines:?}");
    drop(clients);
    drop(held);
}
