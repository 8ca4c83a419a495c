//! `cargo xtask bench`: shunt in every forwarding mode side by side with a direct
//! connection, HAProxy (plain and `option splice-auto`) and nginx stream.
//!
//! Owns the plan (which scenario runs how long, `--quick` or full), the backends (an
//! iperf3 server, a redis-server, an in-process echo server and idle server, all on
//! loopback), the interleaving, and the samples handed to `report`.
//!
//! Interleaving: for each scenario, round r measures every peer once, in the peer order
//! rotated by r, so slow drift of the machine (other load, thermal, page cache) lands on
//! every peer alike instead of on whichever ran last. The bulk, request/response,
//! connect and 64 KiB scenarios share one instance of each peer (one `listen` per
//! backend); the idle-flow and CLI scenarios start a fresh instance per measurement
//! (memory and map contents must start from zero); the cork probe runs instances with
//! `tune.pipesize 8192`.
//!
//! Invariants: every process started (peers, iperf3 and redis servers, load tools) is
//! started through `proc` with its pid appended to the pid file and is stopped by pid
//! on every exit path, SIGINT/SIGTERM included (`proc::catch_stop_signals`: the flag is
//! polled by every loop, guards stop their children when dropped); a failed measurement
//! is recorded as a note and the others still run; the command fails if any failed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::load::{self, IdleServer};
use crate::peers::{self, Extras, Kind, Peer, Running};
use crate::report::{self, quantile, Sample};
use shunt_testkit::{self as testkit, Backend};
use xtask::proc::{self, ChildGuard};

/// Rounds per scenario unless `--rounds` says otherwise (the issue asks for at least 3).
pub const DEFAULT_ROUNDS: usize = 3;
/// `tune.pipesize` of the cork probe.
const CORK_PIPESIZE: u32 = 8192;
/// Message sizes of the cork probe: around one 8 KiB pipe, and two pipes' worth.
pub const CORK_SIZES: [usize; 5] = [7000, 7372, 8192, 12000, 16384];
/// Bound of one cork-probe size for one peer (a corked pipe stalls ~200 ms a round trip).
const CORK_LIMIT: Duration = Duration::from_secs(5);
/// Size of the large request/response.
const BIG_RR: usize = 64 * 1024;
/// Bound of one redis-benchmark or echo run.
const TOOL_LIMIT: Duration = Duration::from_secs(60);
/// Bound of one `add map` stream.
const CLI_LIMIT: Duration = Duration::from_secs(180);
/// File descriptors asked for: the idle-flow scenario holds 2 per flow here (client and
/// idle server) and 2 per flow in the proxy, which inherits the limit.
const WANT_NOFILE: u64 = 1 << 17;
/// Descriptors a proxy keeps beyond two per connection (listeners, logs, pipes, eBPF
/// maps), subtracted before `maxconn` is derived from `RLIMIT_NOFILE`.
const NOFILE_MARGIN: u64 = 500;
/// Connections kept free below `maxconn` when the idle flows are capped by it.
const MAXCONN_SPARE: u64 = 250;
/// Fewest idle flows worth reporting.
const MIN_IDLE_FLOWS: usize = 1000;
/// Time for memory to settle after the last idle flow crossed the proxy.
const RSS_SETTLE: Duration = Duration::from_millis(300);
/// Connections redis-benchmark opens at once in the new-connection scenario.
const CONNECT_CLIENTS: u32 = 4;
/// Client threads of the TLS handshake run (two cores: enough to keep one proxy
/// worker busy while clients verify and sign).
const TLS_CLIENTS: usize = 4;
/// Bound of one TLS handshake run or push.
const TLS_LIMIT: Duration = Duration::from_secs(120);

/// Every scenario, in report order.
pub const SCENARIOS: [&str; 10] = [
    "bulk-1", "bulk-4", "rr-1", "rr-50", "connect", "rr-64k", "idle", "cork", "cli", "tls",
];

/// Scenarios run only when named (`--scenarios sched-latency`), never by default
/// (`pool-ttfb` needs root: it makes a network namespace).
pub const EXTRA_SCENARIOS: [&str; 2] = ["sched-latency", "pool-ttfb"];

/// How long and how much each scenario runs.
#[derive(Debug, Clone)]
pub struct Plan {
    pub quick: bool,
    pub rounds: usize,
    /// iperf3 `-t`.
    pub bulk_secs: u32,
    pub rr1_requests: u32,
    pub rr50_requests: u32,
    pub connect_requests: u32,
    pub big_count: usize,
    pub idle_flows: usize,
    /// Rounds of the idle and CLI scenarios (each starts fresh proxies).
    pub fresh_rounds: usize,
    pub cork_count: usize,
    pub cli_lines: usize,
    /// Full TLS handshakes per measurement of `tls`.
    pub tls_handshakes: usize,
    /// Plaintext bytes of the `tls` push.
    pub tls_bytes: u64,
}

impl Plan {
    pub fn new(quick: bool, rounds: Option<usize>) -> Self {
        let rounds = rounds.unwrap_or(DEFAULT_ROUNDS).max(1);
        if quick {
            Plan {
                quick,
                rounds,
                bulk_secs: 1,
                rr1_requests: 2_000,
                rr50_requests: 10_000,
                connect_requests: 500,
                big_count: 100,
                idle_flows: 2_000,
                fresh_rounds: 1,
                cork_count: 10,
                cli_lines: 100_000,
                tls_handshakes: 300,
                tls_bytes: 128 << 20,
            }
        } else {
            Plan {
                quick,
                rounds,
                bulk_secs: 5,
                rr1_requests: 20_000,
                rr50_requests: 100_000,
                connect_requests: 5_000,
                big_count: 1_000,
                idle_flows: 10_000,
                fresh_rounds: rounds,
                cork_count: 100,
                cli_lines: 1_000_000,
                tls_handshakes: 3_000,
                tls_bytes: 1 << 30,
            }
        }
    }
}

pub struct Options {
    pub quick: bool,
    pub rounds: Option<usize>,
    pub peers: Option<Vec<String>>,
    pub scenarios: Option<Vec<String>>,
    pub shunt: Option<PathBuf>,
    /// Where BENCHMARKS.md goes (charts and JSON under `docs/bench/` below it).
    pub out: Option<PathBuf>,
    pub pid_file: Option<PathBuf>,
}

/// Shared state of one bench run.
struct Ctx {
    plan: Plan,
    peers: Vec<Peer>,
    shunt: PathBuf,
    dir: PathBuf,
    /// `maxconn` of every proxy, from `RLIMIT_NOFILE`.
    maxconn: u32,
    samples: Vec<Sample>,
    notes: Vec<String>,
    failures: Vec<String>,
}

impl Ctx {
    fn push(&mut self, scenario: &str, peer: Peer, round: usize, metric: &str, value: f64) {
        self.samples.push(Sample {
            scenario: scenario.to_string(),
            metric: metric.to_string(),
            peer: peer.slug.to_string(),
            round,
            value,
        });
    }

    /// Prints one round's metrics of `peer` and records them.
    fn record(&mut self, scenario: &str, peer: Peer, round: usize, metrics: Vec<(&str, f64)>) {
        let shown: Vec<String> = metrics.iter().map(|(k, v)| format!("{k} {v:.3}")).collect();
        println!(
            "xtask:   {} r{}: {}",
            peer.label,
            round + 1,
            shown.join(", ")
        );
        for (k, v) in metrics {
            self.push(scenario, peer, round, k, v);
        }
    }

    /// Records a failed measurement; an interruption ends the run instead.
    fn fail(&mut self, scenario: &str, peer: Peer, round: usize, e: anyhow::Error) -> Result<()> {
        if proc::stop_requested() {
            bail!("interrupted");
        }
        let line = format!("{scenario} / {} / round {}: {e:#}", peer.label, round + 1);
        println!("xtask: FAILED {line}");
        self.failures.push(line);
        Ok(())
    }
}

pub fn run(opts: &Options) -> Result<()> {
    proc::catch_stop_signals()?;
    let plan = Plan::new(opts.quick, opts.rounds);
    let peers = peers::select(opts.peers.as_deref())?;
    let scenarios: Vec<String> = match &opts.scenarios {
        None => SCENARIOS.iter().map(|s| s.to_string()).collect(),
        Some(list) => {
            for s in list {
                ensure!(
                    SCENARIOS.contains(&s.as_str()) || EXTRA_SCENARIOS.contains(&s.as_str()),
                    "unknown scenario '{s}' (expected some of {},{})",
                    SCENARIOS.join(","),
                    EXTRA_SCENARIOS.join(",")
                );
            }
            list.clone()
        }
    };
    let (latency, scenarios): (Vec<String>, Vec<String>) = scenarios
        .into_iter()
        .partition(|s| EXTRA_SCENARIOS.contains(&s.as_str()));
    let dir = xtask::target_dir().join("xtask").join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let pid_file = opts
        .pid_file
        .clone()
        .unwrap_or_else(|| dir.join("pids.txt"));
    proc::set_pid_file(&pid_file)?;
    println!(
        "xtask: bench: pids of every process started go to {}",
        pid_file.display()
    );
    if !scenarios.is_empty() && !peers::tools_present(&peers) {
        xtask::setup::debian_packages()?;
    }
    let shunt = match &opts.shunt {
        Some(b) => b.clone(),
        None => xtask::build_release()?,
    };
    if !latency.is_empty() {
        if latency.iter().any(|s| s == "sched-latency") {
            let table = crate::latency::run(&shunt, &dir, opts.quick)?;
            println!("xtask: wrote {}", table.display());
        }
        if latency.iter().any(|s| s == "pool-ttfb") {
            let root = opts.out.clone().unwrap_or_else(xtask::workspace_root);
            let table = crate::poolbench::run(&shunt, &dir, &root, opts.quick)?;
            println!("xtask: wrote {}", table.display());
        }
        if scenarios.is_empty() {
            return Ok(());
        }
    }
    let out = match &opts.out {
        Some(o) => o.clone(),
        None if plan.quick => dir.join("quick"),
        None => xtask::workspace_root(),
    };
    // From here on every thread and process the bench starts (backends, load tools)
    // inherits the load CPU; `peers::start` puts each proxy on its own (`cpus`).
    let _pinned = crate::cpus::Pinned::load()?;
    let nofile = proc::raise_nofile(WANT_NOFILE);
    let (maxconn, flows) = limits(nofile, plan.idle_flows);
    let mut ctx = Ctx {
        plan,
        peers,
        shunt,
        dir,
        maxconn,
        samples: Vec::new(),
        notes: Vec::new(),
        failures: Vec::new(),
    };
    let idle_ok = flows >= MIN_IDLE_FLOWS;
    if scenarios.iter().any(|s| s == "idle") {
        if !idle_ok {
            ctx.notes.push(format!(
                "idle: skipped: RLIMIT_NOFILE is {nofile} and could not be raised to {} \
                 (2 descriptors per flow in xtask and in the proxy)",
                2 * ctx.plan.idle_flows as u64 + NOFILE_MARGIN
            ));
        } else if flows < ctx.plan.idle_flows {
            ctx.notes.push(format!(
                "idle: {flows} flows instead of {}: RLIMIT_NOFILE is {nofile} and its hard \
                 limit could not be raised (2 descriptors per flow in xtask and in the proxy)",
                ctx.plan.idle_flows
            ));
        }
        ctx.plan.idle_flows = flows;
    }
    let started = Instant::now();
    println!(
        "xtask: bench ({}): {} peer(s), scenarios {}, {} round(s)",
        if ctx.plan.quick { "quick" } else { "full" },
        ctx.peers.len(),
        scenarios.join(","),
        ctx.plan.rounds
    );
    run_scenarios(&mut ctx, &scenarios, idle_ok)?;
    let elapsed = started.elapsed();
    println!("xtask: bench: measured in {:.0}s", elapsed.as_secs_f64());
    let meta = report::Meta {
        date: proc::output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
            .unwrap_or_default()
            .trim()
            .to_string(),
        versions: peers::versions(&ctx.shunt),
        cpus: crate::cpus::online_cpus(),
        layout: crate::cpus::describe(),
        quick: ctx.plan.quick,
        rounds: ctx.plan.rounds,
        seconds: elapsed.as_secs_f64(),
        plan: format!("{:?}", ctx.plan),
    };
    let written = report::write(&out, &meta, &ctx.samples, &ctx.notes, &ctx.failures)?;
    for p in written {
        println!("xtask: wrote {}", p.display());
    }
    ensure!(
        ctx.failures.is_empty(),
        "{} measurement(s) failed:\n{}",
        ctx.failures.len(),
        ctx.failures.join("\n")
    );
    Ok(())
}

fn run_scenarios(ctx: &mut Ctx, scenarios: &[String], idle_ok: bool) -> Result<()> {
    let want = |s: &str| scenarios.iter().any(|x| x == s);
    let shared: Vec<&str> = ["bulk-1", "bulk-4", "rr-1", "rr-50", "connect", "rr-64k"]
        .into_iter()
        .filter(|s| want(s))
        .collect();
    if !shared.is_empty() {
        shared_scenarios(ctx, &shared)?;
    }
    if want("idle") && idle_ok {
        idle_scenario(ctx)?;
    }
    if want("cork") {
        cork_scenario(ctx)?;
    }
    if want("cli") {
        cli_scenario(ctx)?;
    }
    if want("tls") {
        tls_scenario(ctx)?;
    }
    Ok(())
}

/// The proxies' `maxconn` and the idle flows that fit in `nofile` descriptors (two per
/// connection and two per pipe in the proxy, two per flow in xtask: the client and the
/// idle server).
fn limits(nofile: u64, want_flows: usize) -> (u32, usize) {
    let pipes = 2 * u64::from(peers::PROXY_MAXPIPES);
    let maxconn =
        (nofile.saturating_sub(NOFILE_MARGIN + pipes) / 2).min(u64::from(peers::PROXY_MAXCONN));
    let flows = (want_flows as u64).min(maxconn.saturating_sub(MAXCONN_SPARE));
    (
        u32::try_from(maxconn).unwrap_or(peers::PROXY_MAXCONN),
        usize::try_from(flows).unwrap_or(0),
    )
}

/// The peers in round `r`'s order (rotated by r).
fn rotated(peers: &[Peer], r: usize) -> Vec<Peer> {
    let mut v = peers.to_vec();
    if !v.is_empty() {
        let n = r % v.len();
        v.rotate_left(n);
    }
    v
}

/// Bulk, request/response, connect and 64 KiB scenarios on one instance of each peer.
fn shared_scenarios(ctx: &mut Ctx, scenarios: &[&str]) -> Result<()> {
    let iperf_port = peers::free_port()?;
    let iperf_addr = SocketAddr::from(([127, 0, 0, 1], iperf_port));
    let mut iperf = ChildGuard::spawn(
        "iperf3 server",
        Path::new("iperf3"),
        &["-s", "-B", "127.0.0.1", "-p", &iperf_port.to_string()],
        &ctx.dir.join("iperf3-server.log"),
        true,
    )?;
    iperf.wait_for_port(iperf_addr, Duration::from_secs(10))?;
    let redis_port = peers::free_port()?;
    let redis_addr = SocketAddr::from(([127, 0, 0, 1], redis_port));
    let redis_dir = ctx.dir.display().to_string();
    let mut redis = ChildGuard::spawn(
        "redis-server",
        Path::new("redis-server"),
        &[
            "--port",
            &redis_port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
            "--dir",
            &redis_dir,
        ],
        &ctx.dir.join("redis-server.log"),
        true,
    )?;
    redis.wait_for_port(redis_addr, Duration::from_secs(10))?;
    let echo = Backend::start("127.0.0.1:0".parse()?, testkit::Kind::Echo)?;
    let mut routes = BTreeMap::new();
    routes.insert("iperf".to_string(), iperf_addr);
    routes.insert("redis".to_string(), redis_addr);
    routes.insert("echo".to_string(), echo.addr);
    let mut running: Vec<Running> = Vec::new();
    for p in ctx.peers.clone() {
        let extras = Extras {
            stats_socket: matches!(p.kind, Kind::Shunt(_))
                .then(|| peers::socket_path(&ctx.dir, &format!("{}.sock", p.slug))),
            maxconn: Some(ctx.maxconn),
            ..Extras::default()
        };
        running.push(peers::start(
            p, &routes, &extras, &ctx.shunt, &ctx.dir, "main",
        )?);
    }
    for &scenario in scenarios {
        println!("xtask: bench: {scenario}");
        for r in 0..ctx.plan.rounds {
            for p in rotated(&ctx.peers, r) {
                ensure!(!proc::stop_requested(), "interrupted");
                let Some(run) = running.iter_mut().find(|x| x.peer == p) else {
                    continue;
                };
                let got = with_steal(|| measure_shared(&ctx.plan, scenario, run))
                    .and_then(|m| run.check_alive().map(|()| m));
                match got {
                    Ok(metrics) => ctx.record(scenario, p, r, metrics),
                    Err(e) => ctx.fail(scenario, p, r, e)?,
                }
            }
        }
    }
    // Each shunt instance must have forwarded in the mode it was started with.
    for run in &running {
        if let (Kind::Shunt(mode), Some(sock)) = (run.peer.kind, &run.stats_socket) {
            match mode_check(sock, mode) {
                Ok(note) => ctx.notes.push(format!("{}: {note}", run.peer.label)),
                Err(e) => {
                    let p = run.peer;
                    ctx.fail("mode check", p, 0, e)?;
                }
            }
        }
    }
    for mut run in running {
        run.stop();
    }
    drop(echo);
    redis.stop();
    iperf.stop();
    Ok(())
}

/// `show info` of a shunt instance: flows were forwarded in the mode it was started
/// with (an error if none were). Flows the mode handed to another path (sockmap falls
/// back to splice or copy for a flow it cannot take) are reported, not failed.
fn mode_check(sock: &Path, mode: &str) -> Result<String> {
    let info = testkit::parse_show_info(&testkit::cli_command(sock, "show info")?);
    let mut counts = Vec::new();
    for (m, key) in [
        ("sockmap", "SockmapFlows"),
        ("splice", "SpliceFlows"),
        ("copy", "CopyFlows"),
    ] {
        counts.push((m, key, testkit::info_num(&info, key)?));
    }
    let summary = counts
        .iter()
        .map(|(_, k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    if mode == "auto" {
        // auto decides per flow: report the split and how many it promoted.
        let promoted = testkit::info_num(&info, "PromotedFlows")?;
        return Ok(format!(
            "auto forwarded {summary}; PromotedFlows {promoted} (promoted to the kernel)"
        ));
    }
    let own = counts
        .iter()
        .find(|(m, _, _)| *m == mode)
        .map_or(0, |c| c.2);
    ensure!(
        own > 0,
        "started with --forward-mode {mode}, but show info counts {summary}"
    );
    let others: u64 = counts
        .iter()
        .filter(|(m, _, _)| *m != mode)
        .map(|c| c.2)
        .sum();
    Ok(if others == 0 {
        format!("every flow forwarded in {mode} mode per show info ({summary})")
    } else {
        format!("{others} flow(s) not forwarded in {mode} mode per show info ({summary})")
    })
}

/// Run `load`, and the CPU seconds (utime+stime) the proxy `pid` used meanwhile
/// (`None` without a proxy: direct).
fn proxy_cpu<T>(pid: Option<u32>, load: impl FnOnce() -> Result<T>) -> Result<(T, Option<f64>)> {
    let before = pid.map(proc::cpu_seconds).transpose()?;
    let out = load()?;
    let after = pid.map(proc::cpu_seconds).transpose()?;
    Ok((out, before.zip(after).map(|(a, z)| z - a)))
}

/// A measurement with `steal_pct` added: the share of the CPUs' time the hypervisor
/// stole while it ran (/proc/stat). Not a figure of the peer's: it says how far the
/// machine under a sample was this machine, so the report can show it beside the ratios.
fn with_steal(
    measure: impl FnOnce() -> Result<Vec<(&'static str, f64)>>,
) -> Result<Vec<(&'static str, f64)>> {
    let before = crate::one_flow::host_steal_ticks()?;
    let mut m = measure()?;
    let after = crate::one_flow::host_steal_ticks()?;
    if let Some(pct) = crate::one_flow::steal_pct(before, after) {
        m.push((report::STEAL, pct));
    }
    Ok(m)
}

/// One measurement of one shared scenario: (metric, value) pairs.
fn measure_shared(
    plan: &Plan,
    scenario: &str,
    run: &mut Running,
) -> Result<Vec<(&'static str, f64)>> {
    let pid = run.pid();
    match scenario {
        "bulk-1" | "bulk-4" => {
            let streams = if scenario == "bulk-1" { 1 } else { 4 };
            let front = run.front("iperf")?;
            let host0 = crate::one_flow::host_busy_seconds()?;
            let (b, cpu) = proxy_cpu(pid, || load::iperf3(front, plan.bulk_secs, streams))?;
            let host1 = crate::one_flow::host_busy_seconds()?;
            let gb = b.bytes as f64 / 1e9;
            let mut m = vec![
                ("gbit_s", b.gbits()),
                ("host_cpu_s_per_gb", (host1 - host0) / gb),
            ];
            if let Some(c) = cpu {
                m.push(("proxy_cpu_s_per_gb", c / gb));
            }
            Ok(m)
        }
        "rr-1" | "rr-50" | "connect" => {
            let front = run.front("redis")?;
            let (n, c, new_conn) = match scenario {
                "rr-1" => (plan.rr1_requests, 1, false),
                "rr-50" => (plan.rr50_requests, 50, false),
                _ => (plan.connect_requests, CONNECT_CLIENTS, true),
            };
            let (rr, cpu) = proxy_cpu(pid, || {
                load::redis_benchmark(front, "ping_inline", n, c, new_conn, TOOL_LIMIT)
            })?;
            let mut m = vec![
                ("per_s", rr.rps),
                ("p50_ms", rr.p50_ms),
                ("p99_ms", rr.p99_ms),
            ];
            if let Some(c) = cpu {
                m.push(("proxy_cpu_us_per_op", c * 1e6 / n as f64));
            }
            Ok(m)
        }
        "rr-64k" => {
            let front = run.front("echo")?;
            let (mut t, cpu) = proxy_cpu(pid, || {
                load::echo_round_trips(front, BIG_RR, plan.big_count, TOOL_LIMIT)
            })?;
            let total: f64 = t.iter().map(Duration::as_secs_f64).sum();
            t.sort();
            let mut m = vec![
                ("p50_us", quantile(&t, 0.50).as_secs_f64() * 1e6),
                ("p99_us", quantile(&t, 0.99).as_secs_f64() * 1e6),
                ("per_s", t.len() as f64 / total.max(1e-9)),
            ];
            if let Some(c) = cpu {
                m.push(("proxy_cpu_us_per_op", c * 1e6 / t.len().max(1) as f64));
            }
            Ok(m)
        }
        other => bail!("no shared scenario '{other}'"),
    }
}

/// RSS of each proxy holding `idle_flows` idle flows; a fresh instance per measurement.
fn idle_scenario(ctx: &mut Ctx) -> Result<()> {
    let n = ctx.plan.idle_flows;
    println!("xtask: bench: idle ({n} idle flows)");
    let idle = IdleServer::start()?;
    let mut routes = BTreeMap::new();
    routes.insert("idle".to_string(), idle.addr);
    let proxies: Vec<Peer> = ctx
        .peers
        .iter()
        .copied()
        .filter(|p| p.kind != Kind::Direct)
        .collect();
    let extras = Extras {
        maxconn: Some(ctx.maxconn),
        ..Extras::default()
    };
    for r in 0..ctx.plan.fresh_rounds {
        for p in rotated(&proxies, r) {
            ensure!(!proc::stop_requested(), "interrupted");
            let got = (|| -> Result<(f64, f64)> {
                let mut run = peers::start(p, &routes, &extras, &ctx.shunt, &ctx.dir, "idle")?;
                let pid = run.pid().context("no pid")?;
                // The readiness probe's flow must be gone before the baseline.
                std::thread::sleep(RSS_SETTLE);
                let rss0 = proc::rss_bytes(pid)?;
                let flows = load::open_idle_flows(run.front("idle")?, &idle, n);
                std::thread::sleep(RSS_SETTLE);
                let rss1 = proc::rss_bytes(pid);
                idle.release();
                let flows = flows?;
                let rss1 = rss1?;
                run.check_alive()?;
                drop(flows);
                run.stop();
                Ok((
                    rss1 as f64 / f64::from(1 << 20),
                    rss1.saturating_sub(rss0) as f64 / 1024.0 / n as f64,
                ))
            })();
            idle.release();
            match got {
                Ok((mib, per_flow)) => {
                    println!(
                        "xtask:   {} r{}: RSS {mib:.1} MiB, {per_flow:.2} KiB per flow",
                        p.label,
                        r + 1
                    );
                    ctx.push("idle", p, r, "rss_mib", mib);
                    ctx.push("idle", p, r, "kib_per_flow", per_flow);
                }
                Err(e) => ctx.fail("idle", p, r, e)?,
            }
        }
    }
    Ok(())
}

/// Max round trip per message size with 8 KiB pipes: shunt splice vs HAProxy splice
/// (direct as the floor).
fn cork_scenario(ctx: &mut Ctx) -> Result<()> {
    println!("xtask: bench: cork probe (tune.pipesize {CORK_PIPESIZE})");
    let echo = Backend::start("127.0.0.1:0".parse()?, testkit::Kind::Echo)?;
    let mut routes = BTreeMap::new();
    routes.insert("echo".to_string(), echo.addr);
    let extras = Extras {
        pipesize: Some(CORK_PIPESIZE),
        maxconn: Some(ctx.maxconn),
        ..Extras::default()
    };
    let probed: Vec<Peer> = ctx
        .peers
        .iter()
        .copied()
        .filter(|p| {
            matches!(
                p.kind,
                Kind::Direct | Kind::Shunt("splice") | Kind::Haproxy { splice: true }
            )
        })
        .collect();
    let mut running = Vec::new();
    for p in &probed {
        running.push(peers::start(
            *p, &routes, &extras, &ctx.shunt, &ctx.dir, "cork",
        )?);
    }
    for r in 0..ctx.plan.rounds {
        for p in rotated(&probed, r) {
            ensure!(!proc::stop_requested(), "interrupted");
            let Some(run) = running.iter_mut().find(|x| x.peer == p) else {
                continue;
            };
            let front = run.front("echo")?;
            let mut line = Vec::new();
            for size in CORK_SIZES {
                match load::echo_round_trips(front, size, ctx.plan.cork_count, CORK_LIMIT) {
                    Ok(t) => {
                        let max = t.iter().max().copied().unwrap_or_default();
                        let ms = max.as_secs_f64() * 1e3;
                        line.push(format!("{size}: {ms:.2}"));
                        ctx.push("cork", p, r, cork_metric(size), ms);
                    }
                    Err(e) => ctx.fail("cork", p, r, e.context(format!("size {size}")))?,
                }
            }
            println!(
                "xtask:   {} r{}: max ms {}",
                p.label,
                r + 1,
                line.join(", ")
            );
        }
    }
    for mut run in running {
        run.stop();
    }
    Ok(())
}

/// The metric name of one cork-probe size.
pub fn cork_metric(size: usize) -> &'static str {
    match size {
        7000 => "max_ms_7000",
        7372 => "max_ms_7372",
        8192 => "max_ms_8192",
        12000 => "max_ms_12000",
        _ => "max_ms_16384",
    }
}

/// `add map` lines streamed in prompt mode: shunt vs HAProxy, a fresh instance each.
fn cli_scenario(ctx: &mut Ctx) -> Result<()> {
    let lines = ctx.plan.cli_lines;
    println!("xtask: bench: cli ({lines} add map lines)");
    let echo = Backend::start("127.0.0.1:0".parse()?, testkit::Kind::Echo)?;
    let mut routes = BTreeMap::new();
    routes.insert("echo".to_string(), echo.addr);
    // One shunt (the forwarding mode does not matter to the CLI) and plain HAProxy.
    let mut cli_peers: Vec<Peer> = Vec::new();
    if let Some(p) = ctx.peers.iter().find(|p| matches!(p.kind, Kind::Shunt(_))) {
        cli_peers.push(*p);
    }
    if let Some(p) = ctx
        .peers
        .iter()
        .find(|p| p.kind == Kind::Haproxy { splice: false })
    {
        cli_peers.push(*p);
    }
    for r in 0..ctx.plan.fresh_rounds {
        for p in rotated(&cli_peers, r) {
            ensure!(!proc::stop_requested(), "interrupted");
            let got = (|| -> Result<Duration> {
                let map = ctx.dir.join(format!("cli-{}.map", p.slug));
                std::fs::write(&map, "127.0.0.2 be\n")
                    .with_context(|| format!("cannot write {}", map.display()))?;
                let sock = peers::socket_path(&ctx.dir, &format!("cli-{}.sock", p.slug));
                let _ = std::fs::remove_file(&sock);
                let extras = Extras {
                    map_file: Some(map.clone()),
                    stats_socket: Some(sock.clone()),
                    maxconn: Some(ctx.maxconn),
                    ..Extras::default()
                };
                let mut run = peers::start(p, &routes, &extras, &ctx.shunt, &ctx.dir, "cli")?;
                let t = load::add_map_stream(&sock, &map.display().to_string(), lines, CLI_LIMIT);
                run.check_alive()?;
                run.stop();
                let _ = std::fs::remove_file(&sock);
                t
            })();
            match got {
                Ok(t) => {
                    let secs = t.as_secs_f64();
                    println!(
                        "xtask:   {} r{}: {lines} adds in {secs:.2}s ({:.0}/s)",
                        p.label,
                        r + 1,
                        lines as f64 / secs
                    );
                    ctx.push("cli", p, r, "seconds", secs);
                    ctx.push("cli", p, r, "adds_per_s", lines as f64 / secs.max(1e-9));
                }
                Err(e) => ctx.fail("cli", p, r, e)?,
            }
        }
    }
    Ok(())
}

/// TLS termination: full handshakes per second and bulk through a terminated flow, with
/// the proxy's CPU for each; one shunt (a TLS flow is forwarded in userspace whatever the
/// mode: the kernel here has no kTLS), plain HAProxy and nginx, each with `ssl crt`.
fn tls_scenario(ctx: &mut Ctx) -> Result<()> {
    println!(
        "xtask: bench: tls ({} handshakes, {} MiB push)",
        ctx.plan.tls_handshakes,
        ctx.plan.tls_bytes >> 20
    );
    let cert = crate::tls::Cert::make(&ctx.dir)?;
    let client = cert.client_config()?;
    let echo = Backend::start("127.0.0.1:0".parse()?, testkit::Kind::Echo)?;
    let sink = Backend::start("127.0.0.1:0".parse()?, testkit::Kind::Sink { report: true })?;
    let mut routes = BTreeMap::new();
    routes.insert("echo".to_string(), echo.addr);
    routes.insert("sink".to_string(), sink.addr);
    let mut peers: Vec<Peer> = Vec::new();
    if let Some(p) = ctx
        .peers
        .iter()
        .find(|p| p.kind == Kind::Shunt("auto"))
        .or_else(|| ctx.peers.iter().find(|p| matches!(p.kind, Kind::Shunt(_))))
    {
        peers.push(*p);
    }
    peers.extend(
        ctx.peers
            .iter()
            .filter(|p| matches!(p.kind, Kind::Haproxy { splice: false } | Kind::Nginx)),
    );
    let mut running = Vec::new();
    for p in &peers {
        let extras = Extras {
            tls_pem: Some(cert.pem.clone()),
            maxconn: Some(ctx.maxconn),
            ..Extras::default()
        };
        running.push(peers::start(
            *p, &routes, &extras, &ctx.shunt, &ctx.dir, "tls",
        )?);
    }
    let mut suite = String::new();
    for r in 0..ctx.plan.rounds {
        for p in rotated(&peers, r) {
            ensure!(!proc::stop_requested(), "interrupted");
            let Some(run) = running.iter_mut().find(|x| x.peer == p) else {
                continue;
            };
            let got = with_steal(|| -> Result<Vec<(&'static str, f64)>> {
                let pid = run.pid().context("no pid")?;
                let cpu0 = proc::cpu_seconds(pid)?;
                let hs = crate::tls::handshakes(
                    run.front("echo")?,
                    &client,
                    ctx.plan.tls_handshakes,
                    TLS_CLIENTS,
                    TLS_LIMIT,
                )?;
                let cpu1 = proc::cpu_seconds(pid)?;
                let t =
                    crate::tls::push(run.front("sink")?, &client, ctx.plan.tls_bytes, TLS_LIMIT)?;
                let cpu2 = proc::cpu_seconds(pid)?;
                run.check_alive()?;
                suite.clone_from(&hs.suite);
                let n = hs.times.len() as f64;
                let gb = ctx.plan.tls_bytes as f64 / 1e9;
                Ok(vec![
                    ("handshakes_per_s", n / hs.elapsed.as_secs_f64().max(1e-9)),
                    ("hs_p50_ms", quantile(&hs.times, 0.50).as_secs_f64() * 1e3),
                    ("hs_p99_ms", quantile(&hs.times, 0.99).as_secs_f64() * 1e3),
                    ("proxy_cpu_ms_per_hs", (cpu1 - cpu0) * 1e3 / n.max(1.0)),
                    ("gbit_s", gb * 8.0 / t.as_secs_f64().max(1e-9)),
                    ("proxy_cpu_s_per_gb", (cpu2 - cpu1) / gb),
                ])
            });
            match got {
                Ok(metrics) => ctx.record("tls", p, r, metrics),
                Err(e) => ctx.fail("tls", p, r, e)?,
            }
        }
    }
    if !suite.is_empty() {
        ctx.notes.push(format!(
            "tls: TLS 1.3 full handshakes (resumption off), ECDSA P-256 certificate, \
             {suite}, {TLS_CLIENTS} client threads"
        ));
    }
    for mut run in running {
        run.stop();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_rotate_the_peer_order() {
        let p = peers::ALL[..3].to_vec();
        let slugs = |v: Vec<Peer>| v.iter().map(|p| p.slug).collect::<Vec<_>>();
        assert_eq!(
            slugs(rotated(&p, 0)),
            ["direct", "shunt-auto", "shunt-sockmap"]
        );
        assert_eq!(
            slugs(rotated(&p, 1)),
            ["shunt-auto", "shunt-sockmap", "direct"]
        );
        assert_eq!(slugs(rotated(&p, 3)), slugs(rotated(&p, 0)));
        assert!(rotated(&[], 2).is_empty());
    }

    #[test]
    fn descriptor_limits_cap_maxconn_and_idle_flows() {
        assert_eq!(limits(1 << 17, 10_000), (30_000, 10_000));
        assert_eq!(limits(20_000, 10_000), (9_494, 9_244));
        assert_eq!(limits(1524, 10_000), (256, 6));
        assert_eq!(limits(100, 10_000), (0, 0));
    }

    #[test]
    fn plans_keep_at_least_three_rounds_and_quick_is_smaller() {
        let full = Plan::new(false, None);
        let quick = Plan::new(true, None);
        assert!(full.rounds >= 3 && quick.rounds >= 3);
        assert_eq!(full.idle_flows, 10_000);
        assert_eq!(full.cli_lines, 1_000_000);
        assert!(quick.bulk_secs < full.bulk_secs && quick.cli_lines < full.cli_lines);
        for s in CORK_SIZES {
            assert!(cork_metric(s).ends_with(&s.to_string()));
        }
    }
}
