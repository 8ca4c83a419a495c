//! `cargo xtask bench --scenarios sched-latency`: new-flow latency under heavy CLI work
//! (the experiment behind HAProxy 2.4's one-heavy-task-per-loop rule), not part of the
//! default scenario set.
//!
//! Owns the scenario: one shunt (`nbthread 1`, so flows and the stats socket share one
//! worker, `forward-mode copy`, a map of `map_entries` entries used by the frontend's
//! routing rule), an echo backend, a flow generator and the heavy CLI load, for four
//! setups measured one after the other on a fresh shunt each:
//! - `no heavy load`: flows only;
//! - `heavy, rule on`: flows while `cli_clients` stats-socket clients loop on
//!   `show map` (a streamed dump) and a full reload (`prepare map`, the entries in
//!   `add map @V <<` payloads of `PAYLOAD_ENTRIES`, `commit map @V`);
//! - `heavy, rule off`: the same with `tune.sched.heavy-cap off` (heavy work is then
//!   queued by the ordinary wake rules, as before the rule);
//! - `heavy, low-latency`: rule on and `tune.sched.low-latency on`.
//!
//! Flows arrive open-loop at a fixed rate (`flow_rate`): flow k is due at
//! `start + k / rate`, and its latency runs from that due time (not from when a client
//! thread got to it) to the end of its echo, so a stalled proxy is charged for every
//! flow that waited behind it. A flow is: connect, write `FLOW_BYTES`, read them back,
//! close. The report gives p50 / p99 / p99.5 / p99.9 / max per setup, the CLI work
//! done, and the profile of the CLI task (its `cpu_avg` is the cost of one heavy run).
//!
//! CPUs: on a machine with two or more, shunt runs on CPU 1 (through `taskset`) and
//! every load generator of the scenario (flow clients, echo server, CLI clients: the
//! threads of this process started after [`run`] pins itself) on CPU 0, as the seed
//! experiment ran them on other machines; the report says which layout was used.
//!
//! Invariants: shunt is started through `proc::ChildGuard` (pid in the pid file, stopped
//! on every exit path); every loop here is bounded by the measurement window and polls
//! `proc::stop_requested`; traffic stays on 127.0.0.1.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use crate::cpus::{self, Pinned, LOAD_CPU, PROXY_CPU};
use crate::peers;
use crate::report::quantile;
use shunt_testkit::{relay, stats, Server};
use xtask::proc::{self, ChildGuard};

/// Bytes each flow sends and reads back.
const FLOW_BYTES: usize = 64;
/// Client threads issuing the flows (each takes every n-th due time).
const FLOW_THREADS: usize = 64;
/// Flows still undone this long after the window are not started (counted as
/// skipped): with a stalled proxy the client threads fall behind without bound.
const FLOW_GRACE: Duration = Duration::from_secs(10);
/// Map entries per `add map @V <<` payload (about 15 bytes each).
const PAYLOAD_ENTRIES: usize = 1000;
/// Time the heavy load runs before flows are measured.
const WARMUP: Duration = Duration::from_secs(2);
/// Bound of one CLI exchange, and of one flow.
const IO_LIMIT: Duration = Duration::from_secs(20);
/// A CLI exchange: `IO_LIMIT` each way, the whole answer.
const CLI_BOUNDS: stats::Bounds = stats::Bounds::each_way(IO_LIMIT);
/// Bound of shunt's start.
const START_LIMIT: Duration = Duration::from_secs(10);

/// Sizes of the scenario.
#[derive(Debug, Clone)]
pub struct Plan {
    pub flow_rate: u32,
    pub measure: Duration,
    pub cli_clients: usize,
    pub map_entries: usize,
}

impl Plan {
    pub fn new(quick: bool) -> Self {
        if quick {
            Plan {
                flow_rate: 500,
                measure: Duration::from_secs(8),
                cli_clients: 20,
                map_entries: 20_000,
            }
        } else {
            Plan {
                flow_rate: 1000,
                measure: Duration::from_secs(15),
                cli_clients: 50,
                map_entries: 50_000,
            }
        }
    }
}

/// One setup: its label and the global lines it adds.
struct Setup {
    label: &'static str,
    heavy_load: bool,
    global: &'static str,
}

const SETUPS: [Setup; 4] = [
    Setup {
        label: "no heavy load",
        heavy_load: false,
        global: "",
    },
    Setup {
        label: "heavy, rule on",
        heavy_load: true,
        global: "",
    },
    Setup {
        label: "heavy, rule off",
        heavy_load: true,
        global: "    tune.sched.heavy-cap off\n",
    },
    Setup {
        label: "heavy, low-latency",
        heavy_load: true,
        global: "    tune.sched.low-latency on\n",
    },
];

/// What one setup measured.
struct Outcome {
    label: &'static str,
    /// Flow latencies, µs, sorted.
    lat_us: Vec<u64>,
    failed_flows: u64,
    dumps: u64,
    reloads: u64,
    cli_errors: u64,
    /// `show profiling tasks` rows of the CLI task and the flow task.
    profile: Vec<String>,
    /// The first failed CLI exchange.
    cli_error: Option<String>,
}

/// Runs the four setups and prints (and writes) the table.
pub fn run(shunt: &Path, dir: &Path, quick: bool) -> Result<PathBuf> {
    let plan = Plan::new(quick);
    println!("xtask: sched-latency: {plan:?}");
    // Threads started from here on (echo server, flow and CLI clients) inherit it.
    let _pinned = Pinned::load()?;
    let echo = start_echo()?;
    let map_path = dir.join("sched-latency.map");
    let mut text = String::with_capacity(plan.map_entries * 16);
    for i in 0..plan.map_entries {
        text.push_str(&format!("{} be\n", entry_ip(i)));
    }
    std::fs::write(&map_path, text)
        .with_context(|| format!("cannot write {}", map_path.display()))?;
    let mut results = Vec::new();
    for setup in &SETUPS {
        ensure!(!proc::stop_requested(), "interrupted");
        results.push(run_setup(shunt, dir, &map_path, echo.addr, &plan, setup)?);
    }
    let table = render(&plan, &results);
    println!("{table}");
    let out = dir.join("sched-latency.md");
    std::fs::write(&out, &table).with_context(|| format!("cannot write {}", out.display()))?;
    Ok(out)
}

fn entry_ip(i: usize) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff)
}

fn config(front: SocketAddr, back: SocketAddr, sock: &Path, map: &Path, extra: &str) -> String {
    format!(
        "# generated by `cargo xtask bench --scenarios sched-latency`\n\
         global\n    nbthread 1\n    maxconn 20000\n    stats socket {} mode 600 level admin\n    stats maxconn 200\n\
         {extra}\n\
         defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 30s\n    \
         timeout server 30s\n\n\
         frontend fe\n    bind {front}\n    use_backend %[src,map_ip({})]\n    \
         default_backend be\n\n\
         backend be\n    server echo {back}\n",
        sock.display(),
        map.display()
    )
}

fn run_setup(
    shunt: &Path,
    dir: &Path,
    map: &Path,
    back: SocketAddr,
    plan: &Plan,
    setup: &Setup,
) -> Result<Outcome> {
    let front = SocketAddr::from(([127, 0, 0, 1], peers::free_port()?));
    let sock = peers::socket_path(dir, "sched-latency.sock");
    let cfg_path = dir.join("sched-latency.cfg");
    std::fs::write(&cfg_path, config(front, back, &sock, map, setup.global))
        .with_context(|| format!("cannot write {}", cfg_path.display()))?;
    let cfg_arg = cfg_path.display().to_string();
    let args: Vec<String> = ["-f", cfg_arg.as_str(), "--forward-mode", "copy"]
        .map(String::from)
        .into();
    let (program, argv) = cpus::proxy_command(shunt, &args);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut guard = ChildGuard::spawn(
        "shunt (sched-latency)",
        &program,
        &argv,
        &dir.join("sched-latency-shunt.log"),
        true,
    )?;
    guard.wait_for_port(front, START_LIMIT)?;
    guard.wait_for_stats(&sock, START_LIMIT)?;
    cli(&sock, "set profiling tasks on")?;

    let stop = Arc::new(AtomicBool::new(false));
    let load = CliLoad::default();
    let mut clients = Vec::new();
    if setup.heavy_load {
        for c in 0..plan.cli_clients {
            let (stop, load, sock) = (stop.clone(), load.clone(), sock.clone());
            let entries = plan.map_entries;
            let map = map.display().to_string();
            clients.push(
                std::thread::Builder::new()
                    .name(format!("xtask-cli-{c}"))
                    .spawn(move || cli_client(&sock, &map, entries, &stop, &load))?,
            );
        }
        proc::sleep_unless_stopped(WARMUP);
    }
    let before = load.snapshot();
    // Counters reset: the profile covers the measurement only.
    let measured = (|| {
        cli(&sock, "set profiling tasks on")?;
        let flows = flows(front, plan.flow_rate, plan.measure)?;
        let profile = cli(&sock, "show profiling tasks")?;
        Ok::<_, anyhow::Error>((flows, profile))
    })();
    let after = load.snapshot();
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.join();
    }
    guard.check_alive()?;
    guard.stop();
    let ((mut lat_us, failed_flows), profile) = measured?;
    lat_us.sort_unstable();
    ensure!(!lat_us.is_empty(), "{}: no flow completed", setup.label);
    Ok(Outcome {
        label: setup.label,
        lat_us,
        failed_flows,
        dumps: after.0 - before.0,
        reloads: after.1 - before.1,
        cli_errors: after.2,
        cli_error: load.1.lock().ok().and_then(|e| e.clone()),
        profile: profile
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("cli-conn ") || l.starts_with("session "))
            .map(str::to_string)
            .collect(),
    })
}

/// Nice this thread to 19. The CLI load generators share this 2-core machine with
/// shunt and the flow generator (in the seed experiment they would be other
/// machines): at the lowest priority they still keep shunt's CLI busy, but no longer
/// starve shunt's own thread of CPU, which would measure the OS, not the scheduler.
fn lower_own_priority() {
    // SAFETY: gettid and setpriority take plain integers; setpriority on this
    // thread's id only changes this thread's nice value (Linux threads are tasks).
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, LOAD_NICE);
    }
}

/// Nice value of the CLI load threads (the lowest priority).
const LOAD_NICE: libc::c_int = 19;

/// Dumps, reloads and failed exchanges of the CLI clients, and the first failure.
#[derive(Clone, Default)]
struct CliLoad(Arc<[AtomicU64; 3]>, Arc<Mutex<Option<String>>>);

impl CliLoad {
    fn failed(&self, e: &anyhow::Error) {
        self.0[2].fetch_add(1, Ordering::Relaxed);
        if let Ok(mut first) = self.1.lock() {
            first.get_or_insert_with(|| format!("{e:#}"));
        }
    }

    fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.0[0].load(Ordering::Relaxed),
            self.0[1].load(Ordering::Relaxed),
            self.0[2].load(Ordering::Relaxed),
        )
    }
}

/// One CLI client: `show map`, then a full reload through a new version, until stopped.
fn cli_client(sock: &Path, map: &str, entries: usize, stop: &AtomicBool, load: &CliLoad) {
    lower_own_priority();
    while !stop.load(Ordering::Relaxed) && !proc::stop_requested() {
        match dump(sock, map) {
            Ok(()) => {
                load.0[0].fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => load.failed(&e),
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        match reload(sock, map, entries) {
            Ok(()) => {
                load.0[1].fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => load.failed(&e),
        }
    }
}

fn connect_cli(sock: &Path) -> Result<UnixStream> {
    stats::connect(sock, Some(IO_LIMIT), Some(IO_LIMIT))
}

/// One non-interactive command; the answer (read to EOF).
fn cli(sock: &Path, cmd: &str) -> Result<String> {
    stats::command(sock, cmd, CLI_BOUNDS)
}

/// `show map MAP`, read to EOF and dropped.
fn dump(sock: &Path, map: &str) -> Result<()> {
    let mut s = connect_cli(sock)?;
    s.write_all(format!("show map {map}\n").as_bytes())?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads one prompted answer (it ends with `\n> `, or is just `> `).
fn read_answer(s: &mut UnixStream, acc: &mut Vec<u8>) -> Result<String> {
    let mut buf = [0u8; 4096];
    loop {
        if acc.ends_with(b"> ") {
            let text = String::from_utf8_lossy(&acc[..acc.len() - 2]).into_owned();
            acc.clear();
            return Ok(text);
        }
        let n = s.read(&mut buf)?;
        ensure!(n > 0, "stats socket closed mid-answer");
        acc.extend_from_slice(&buf[..n]);
    }
}

/// `prepare map`, the entries in payloads to the new version, `commit map`.
fn reload(sock: &Path, map: &str, entries: usize) -> Result<()> {
    let mut s = connect_cli(sock)?;
    let mut acc = Vec::new();
    s.write_all(b"prompt\n")?;
    read_answer(&mut s, &mut acc)?;
    s.write_all(format!("prepare map {map}\n").as_bytes())?;
    let answer = read_answer(&mut s, &mut acc)?;
    let ver: u32 = answer
        .trim()
        .strip_prefix("New version created: ")
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("prepare map answered {answer:?}"))?;
    let mut i = 0;
    while i < entries {
        let end = (i + PAYLOAD_ENTRIES).min(entries);
        let mut cmd = format!("add map @{ver} {map} <<\n");
        for k in i..end {
            cmd.push_str(&entry_ip(k));
            cmd.push_str(" be\n");
        }
        cmd.push('\n');
        s.write_all(cmd.as_bytes())?;
        // A payload answers its `+ ` continuation prompts, then the final prompt.
        let a = read_answer(&mut s, &mut acc)?;
        ensure!(
            a.trim_matches(|c| c == '\n' || c == '+' || c == ' ')
                .is_empty(),
            "add map answered {a:?}"
        );
        i = end;
    }
    s.write_all(format!("commit map @{ver} {map}\n").as_bytes())?;
    let a = read_answer(&mut s, &mut acc)?;
    // Another client committed a later version first: this one is discarded, as
    // HAProxy does; the reload's work was done all the same.
    ensure!(
        a.trim().is_empty() || a.trim() == "Version number out of range.",
        "commit map answered {a:?}"
    );
    s.write_all(b"quit\n")?;
    Ok(())
}

/// Flows at `rate` per second for `window`; latencies (µs, from each flow's due time)
/// and the count of failed flows (errors, and flows skipped past [`FLOW_GRACE`]).
fn flows(front: SocketAddr, rate: u32, window: Duration) -> Result<(Vec<u64>, u64)> {
    let total = (f64::from(rate) * window.as_secs_f64()) as u64;
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let start = Instant::now() + Duration::from_millis(50);
    let out = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let failed = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for t in 0..FLOW_THREADS as u64 {
        let (out, failed) = (out.clone(), failed.clone());
        threads.push(std::thread::spawn(move || {
            let mut mine = Vec::new();
            let payload = [0x5au8; FLOW_BYTES];
            let mut k = t;
            while k < total && !proc::stop_requested() {
                let due = start + interval * u32::try_from(k).unwrap_or(u32::MAX);
                let now = Instant::now();
                if now > start + window + FLOW_GRACE {
                    failed.fetch_add(1, Ordering::Relaxed);
                    k += FLOW_THREADS as u64;
                    continue;
                }
                if due > now {
                    std::thread::sleep(due - now);
                }
                match one_flow(front, &payload) {
                    Ok(()) => mine.push(due.elapsed().as_micros() as u64),
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                k += FLOW_THREADS as u64;
            }
            if let Ok(mut o) = out.lock() {
                o.extend(mine);
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    let v = std::mem::take(&mut *out.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    Ok((v, failed.load(Ordering::Relaxed)))
}

fn one_flow(front: SocketAddr, payload: &[u8]) -> Result<()> {
    let mut s = TcpStream::connect_timeout(&front, IO_LIMIT)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(IO_LIMIT))?;
    s.write_all(payload)?;
    let mut back = [0u8; FLOW_BYTES];
    s.read_exact(&mut back[..payload.len()])?;
    ensure!(back[..payload.len()] == *payload, "echo differs");
    let _ = s.shutdown(Shutdown::Both);
    Ok(())
}

/// An echo backend: one thread per connection (flows are short and few at once).
fn start_echo() -> Result<Server> {
    let l = TcpListener::bind("127.0.0.1:0").context("echo: bind")?;
    let echo = Server::try_serve(l, |mut c| {
        let _ = c.set_read_timeout(Some(IO_LIMIT));
        let _ = relay(&mut c, &mut [0u8; 4096], true, None);
    })?;
    Ok(echo)
}

/// Microseconds as milliseconds with three decimals.
pub(crate) fn ms(us: u64) -> String {
    format!("{:.3}", us as f64 / 1000.0)
}

fn render(plan: &Plan, results: &[Outcome]) -> String {
    let mut t = format!(
        "## New-flow latency under heavy CLI work (ms)\n\n\
         shunt `nbthread 1`, `forward-mode copy`; {} flows/s (connect, {FLOW_BYTES} B echoed, \
         close) for {} s per setup; heavy load: {} stats-socket clients looping on \
         `show map` and a reload of the {}-entry map (`prepare map`, `add map @V <<` \
         payloads of {PAYLOAD_ENTRIES} entries, `commit map`).\n\n\
         {}\n\n\
         `failed` counts errors and flows not started {} s after the window (the \
         client threads had fallen that far behind).\n\n\
         | setup | flows | failed | p50 | p99 | p99.5 | p99.9 | max | dumps | reloads |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        plan.flow_rate,
        plan.measure.as_secs(),
        plan.cli_clients,
        plan.map_entries,
        if cpus::pinning() {
            format!("shunt pinned to CPU {PROXY_CPU}, every load generator (flow clients, echo server, CLI clients) to CPU {LOAD_CPU}, as if on another machine.")
        } else {
            "One CPU: shunt and the load generators share it.".to_string()
        },
        FLOW_GRACE.as_secs()
    );
    for r in results {
        let v = &r.lat_us;
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.label,
            v.len(),
            r.failed_flows,
            ms(quantile(v, 0.50)),
            ms(quantile(v, 0.99)),
            ms(quantile(v, 0.995)),
            ms(quantile(v, 0.999)),
            ms(v.last().copied().unwrap_or(0)),
            r.dumps,
            r.reloads,
        ));
    }
    t.push_str("\nProfile of the measurement window (`show profiling tasks`):\n\n```\n");
    for r in results {
        for line in &r.profile {
            t.push_str(&format!("{:<20} {line}\n", r.label));
        }
        if r.cli_errors > 0 {
            t.push_str(&format!(
                "{:<20} cli errors: {} (first: {})\n",
                r.label,
                r.cli_errors,
                r.cli_error.as_deref().unwrap_or("?")
            ));
        }
    }
    t.push_str("```\n");
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_routes_through_the_map_and_sets_the_knob() {
        let c = config(
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
            Path::new("/tmp/s.sock"),
            Path::new("/tmp/m.map"),
            SETUPS[2].global,
        );
        assert!(c.contains("tune.sched.heavy-cap off\n"));
        assert!(c.contains("use_backend %[src,map_ip(/tmp/m.map)]"));
        assert!(c.contains("nbthread 1"));
    }
}
