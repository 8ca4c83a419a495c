//! `cargo xtask bench`: one-flow throughput and proxy CPU per forwarding mode.
//!
//! Owns the bench runs: for each mode, a generated configuration (one `listen` on a free
//! loopback port in front of an in-process sink, `nbthread 1`), shunt started with
//! `--forward-mode MODE`, SIZE bytes pushed through one flow, and the sink's own byte
//! count checked. Optionally the same through Debian's haproxy (plain, then with
//! `option splice-auto`). Throughput is SIZE over the time from connect to the sink's
//! EOF; proxy CPU is utime+stime from /proc/PID/stat before and after the push; host CPU
//! is the busy time of all CPUs from /proc/stat over the same window (it includes the
//! in-process client and sink, and kernel work done outside the proxy process: sockmap
//! redirects run in kworkers and softirq context, so proxy CPU alone flatters sockmap).
//!
//! Verification: shunt's generated configuration has a stats socket. Before the push
//! (once the readiness probe's flow has ended) and after it, `show info` gives the flows
//! per forwarding mode (`SockmapFlows`, `SpliceFlows`, `CopyFlows`); the push must add
//! exactly one flow, to the counter of the mode asked for (`auto`: any, and the row says
//! which), and `show stat` must count SIZE bytes in and the sink's 8-byte answer out on
//! the FRONTEND row. Otherwise the row fails: a figure for a mode that did not run is
//! worse than no figure.
//!
//! Invariants: runs one after another (never two proxies at once); each run is bounded
//! (`START_LIMIT` to accept, `--timeout` for the push, `SETTLE_LIMIT` for the counters, a
//! stop grace); a failed run is reported in its row and the others still run; the
//! command fails if any run failed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::peers;

use shunt_testkit::{self as testkit, Backend, Counters, Kind};
use xtask::proc::{self, ChildGuard};
use xtask::units::{gbits, human};

/// Default bound of one push, in seconds.
pub const DEFAULT_RUN_TIMEOUT_SECS: u64 = 120;
/// How long a proxy gets to accept on its bind address.
const START_LIMIT: Duration = Duration::from_secs(15);
/// How long shunt gets to end a flow and count it before the check gives up.
const SETTLE_LIMIT: Duration = Duration::from_secs(5);
/// Pause between two stats socket polls.
const SETTLE_POLL: Duration = Duration::from_millis(20);
/// Bytes a reporting sink answers after EOF (its count, big-endian u64).
const SINK_ANSWER: u64 = 8;
const MODES: &[&str] = &["auto", "sockmap", "splice", "copy"];
/// `show info` counters of the kernel path reported (as deltas) for a sockmap run:
/// segments passed to userspace for backpressure, redirects the kernel refused,
/// retransmitted segments whose repeated head the verdict trimmed.
const KERNEL_FIELDS: [&str; 3] = [
    "SockmapPauses",
    "SockmapRedirectErrors",
    "SockmapOverlapTrimmed",
];
/// Forwarding mode → the `show info` counter of flows forwarded that way.
const FLOW_COUNTERS: [(&str, &str); 3] = [
    ("sockmap", "SockmapFlows"),
    ("splice", "SpliceFlows"),
    ("copy", "CopyFlows"),
];

pub struct Options {
    pub size: String,
    pub modes: Vec<String>,
    pub haproxy: bool,
    pub timeout_secs: u64,
    pub shunt: Option<PathBuf>,
}

/// Parses `1G`, `512M`, `64k`, `1GiB`, `1000` (binary units, as HAProxy's sizes).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: u64 = num
        .trim()
        .parse()
        .with_context(|| format!("bad size '{s}' (expected e.g. 1G, 512M, 64K or bytes)"))?;
    let bytes = n
        .checked_mul(1u64 << shift)
        .with_context(|| format!("size '{s}' overflows"))?;
    ensure!(bytes > 0, "size must be more than 0 bytes");
    Ok(bytes)
}

/// One proxy to measure.
struct Target {
    label: String,
    program: PathBuf,
    /// Arguments after `-f CONFIG`.
    extra_args: Vec<String>,
    /// Config lines added to the `listen` section.
    listen_opts: &'static [&'static str],
    /// haproxy needs `-db` before `-f` to stay in the foreground.
    haproxy: bool,
    /// shunt: the forwarding mode asked for (`auto` accepts any), checked through the
    /// stats socket. None for haproxy (not checked).
    verify: Option<String>,
}

struct Measure {
    elapsed: Duration,
    proxy_cpu: f64,
    host_cpu: f64,
    /// The mode shunt's counters say the flow used (None: not checked).
    flow_mode: Option<&'static str>,
    /// For a sockmap flow: how the kernel path went (`show info` deltas).
    kernel_note: Option<String>,
}

pub fn run(opts: &Options) -> Result<()> {
    let size = parse_size(&opts.size)?;
    for m in &opts.modes {
        ensure!(
            MODES.contains(&m.as_str()),
            "unknown mode '{m}' (expected one of {})",
            MODES.join(", ")
        );
    }
    let shunt = match &opts.shunt {
        Some(b) => b.clone(),
        None => xtask::build_release()?,
    };
    let mut targets: Vec<Target> = opts
        .modes
        .iter()
        .map(|m| Target {
            label: format!("shunt {m}"),
            program: shunt.clone(),
            extra_args: vec!["--forward-mode".into(), m.clone()],
            listen_opts: &[],
            haproxy: false,
            verify: Some(m.clone()),
        })
        .collect();
    if opts.haproxy {
        if proc::output("haproxy", &["-v"]).is_none() {
            xtask::setup::debian_packages()?;
        }
        for (label, listen_opts) in [
            ("haproxy", &[][..]),
            ("haproxy splice", &["option splice-auto"][..]),
        ] {
            targets.push(Target {
                label: label.into(),
                program: "haproxy".into(),
                extra_args: Vec::new(),
                listen_opts,
                haproxy: true,
                verify: None,
            });
        }
    }
    proc::catch_stop_signals()?;
    let limit = Duration::from_secs(opts.timeout_secs);
    println!(
        "xtask: bench: {} through one flow per run, {} run(s), at most {}s each",
        human(size),
        targets.len(),
        limit.as_secs()
    );
    let mut results = Vec::new();
    for t in &targets {
        if proc::stop_requested() {
            bail!("interrupted");
        }
        let r = measure(t, size, limit);
        match &r {
            Ok(m) => println!(
                "xtask: {}: {:.2} Gbit/s, proxy CPU {:.2}s, host CPU {:.2}s{}",
                t.label,
                gbits(size, m.elapsed),
                m.proxy_cpu,
                m.host_cpu,
                m.flow_mode
                    .map(|f| format!(", flow forwarded with {f} (per shunt's show info)"))
                    .unwrap_or_default()
            ),
            Err(e) => println!("xtask: {}: FAILED: {e:#}", t.label),
        }
        results.push((t.label.clone(), r));
    }
    print_table(size, &results);
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(l, _)| l.as_str())
        .collect();
    ensure!(
        failed.is_empty(),
        "bench runs failed: {}",
        failed.join(", ")
    );
    Ok(())
}

fn print_table(size: u64, results: &[(String, Result<Measure>)]) {
    let base = results.iter().find_map(|(_, r)| r.as_ref().ok());
    println!("\nxtask bench: {} through one flow, loopback", human(size));
    println!(
        "{:<16} {:<8} {:>7} {:>7} {:>8} {:>8} {:>8} {:>9} {:>9}",
        "run", "flow", "time s", "Gbit/s", "proxy s", "host s", "Gbit/s x", "proxy x", "host x"
    );
    let ratio = |v: f64, b: f64| {
        if b > 0.0 {
            format!("{:.2}x", v / b)
        } else {
            "-".to_string()
        }
    };
    for (label, r) in results {
        match (r, base) {
            (Ok(m), Some(b)) => println!(
                "{label:<16} {:<8} {:>7.2} {:>7.2} {:>8.2} {:>8.2} {:>8} {:>9} {:>9}",
                m.flow_mode.unwrap_or("-"),
                m.elapsed.as_secs_f64(),
                gbits(size, m.elapsed),
                m.proxy_cpu,
                m.host_cpu,
                ratio(b.elapsed.as_secs_f64(), m.elapsed.as_secs_f64()),
                ratio(m.proxy_cpu, b.proxy_cpu),
                ratio(m.host_cpu, b.host_cpu)
            ),
            _ => println!("{label:<16} {:<8} {:>7}", "-", "failed"),
        }
    }
    for (label, r) in results {
        if let Ok(Measure {
            kernel_note: Some(note),
            ..
        }) = r
        {
            println!("{label}: {note}");
        }
    }
    if let Some((label, _)) = results.iter().find(|(_, r)| r.is_ok()) {
        println!(
            "(ratios relative to {label}; flow = the mode shunt's show info counted for the \
             flow; proxy = utime+stime of the proxy process; host = busy time of all CPUs over \
             the transfer, client and sink included, and the kworker/softirq time in which \
             sockmap redirects run)"
        );
    }
}

/// A loopback port nobody listens on right now.
/// The configuration of one run: one listen section in front of the sink, and a stats
/// socket when `stats` is given.
pub fn config_text(
    front: SocketAddr,
    sink: SocketAddr,
    listen_opts: &[&str],
    stats: Option<&Path>,
) -> String {
    let mut cfg = String::from("# generated by `cargo xtask bench`\nglobal\n    nbthread 1\n");
    if let Some(path) = stats {
        cfg.push_str(&format!(
            "    stats socket {} mode 600 level admin\n",
            path.display()
        ));
    }
    cfg.push_str(&format!(
        "\ndefaults\n    mode tcp\n    timeout connect 5s\n    timeout client 60s\n    \
         timeout server 60s\n\n\
         listen bench\n    bind {front}\n"
    ));
    for o in listen_opts {
        cfg.push_str(&format!("    {o}\n"));
    }
    cfg.push_str(&format!("    server sink {sink}\n"));
    cfg
}

fn measure(t: &Target, size: u64, limit: Duration) -> Result<Measure> {
    let sink = Backend::start("127.0.0.1:0".parse()?, Kind::Sink { report: true })?;
    let front = SocketAddr::from(([127, 0, 0, 1], peers::free_port()?));
    let dir = xtask::target_dir().join("xtask");
    std::fs::create_dir_all(&dir)?;
    let slug = t.label.replace(' ', "-");
    let cfg_path = dir.join(format!("bench-{slug}.cfg"));
    let cli = t.verify.as_ref().map(|_| socket_path(&dir, &slug));
    std::fs::write(
        &cfg_path,
        config_text(front, sink.addr, t.listen_opts, cli.as_deref()),
    )
    .with_context(|| format!("cannot write {}", cfg_path.display()))?;
    let cfg_arg = cfg_path.to_string_lossy().into_owned();
    let mut args: Vec<&str> = Vec::new();
    if t.haproxy {
        args.push("-db");
    }
    args.extend(["-f", &cfg_arg]);
    args.extend(t.extra_args.iter().map(String::as_str));
    let log = dir.join(format!("bench-{slug}.log"));
    let mut child = ChildGuard::spawn(&t.label, &t.program, &args, &log, false)?;
    child.wait_for_port(front, START_LIMIT)?;
    // The readiness probe was a flow too: wait until shunt has ended and counted it.
    let before = match &cli {
        Some(cli) => Some(settled(&mut child, cli, 1)?),
        None => None,
    };
    let pid = child.pid();
    let client = std::sync::Arc::new(Counters::default());
    let cpu0 = proc::cpu_seconds(pid)?;
    let host0 = host_busy_seconds()?;
    let push = testkit::push_to_sink(
        front,
        size,
        true,
        &client,
        Instant::now() + limit,
        &proc::stop_requested,
    );
    let cpu1 = proc::cpu_seconds(pid);
    let host1 = host_busy_seconds()?;
    let push = push.map_err(|e| {
        let alive = child.check_alive().err();
        match alive {
            Some(dead) => e.context(format!("{dead:#}")),
            None => e,
        }
    })?;
    child.check_alive()?;
    let cpu1 = cpu1?;
    let (flow_mode, kernel_note) = match (&cli, &before, &t.verify) {
        (Some(cli), Some(before), Some(want)) => {
            let (mode, note) = verify_flow(&mut child, cli, before, want, size)?;
            (Some(mode), note)
        }
        _ => (None, None),
    };
    child.stop();
    if let Some(cli) = &cli {
        let _ = std::fs::remove_file(cli);
    }
    Ok(Measure {
        elapsed: push.elapsed,
        proxy_cpu: cpu1 - cpu0,
        host_cpu: host1 - host0,
        flow_mode,
        kernel_note,
    })
}

/// The stats socket of a run: next to its configuration (or in the temporary directory
/// when that path is too long for a Unix socket).
fn socket_path(dir: &Path, slug: &str) -> PathBuf {
    peers::socket_path(dir, &format!("bench-{slug}.sock"))
}

/// What shunt had counted at one moment: `show info` and its FRONTEND bytes.
struct Counted {
    info: BTreeMap<String, String>,
    bin: u64,
    bout: u64,
}

/// shunt's counts once it holds no connection and has accepted at least `min_conns`
/// (`CumConns`), so every flow so far is counted in its mode's counter and its bytes.
fn settled(child: &mut ChildGuard, cli: &Path, min_conns: u64) -> Result<Counted> {
    let info = settled_info(child, cli, min_conns)?;
    let rows = testkit::parse_show_stat(&testkit::cli_command(cli, "show stat")?)?;
    let fe = rows
        .iter()
        .find(|r| r.get("svname") == "FRONTEND")
        .context("show stat has no FRONTEND row")?;
    Ok(Counted {
        info,
        bin: fe.num("bin")?,
        bout: fe.num("bout")?,
    })
}

/// `show info` once shunt holds no connection and has accepted at least `min_conns`.
fn settled_info(
    child: &mut ChildGuard,
    cli: &Path,
    min_conns: u64,
) -> Result<BTreeMap<String, String>> {
    let end = Instant::now() + SETTLE_LIMIT;
    loop {
        child.check_alive()?;
        let state = testkit::cli_command(cli, "show info").and_then(|text| {
            let info = testkit::parse_show_info(&text);
            let cum = testkit::info_num(&info, "CumConns")?;
            let cur = testkit::info_num(&info, "CurrConns")?;
            Ok((info, cum, cur))
        });
        match state {
            Ok((info, cum, 0)) if cum >= min_conns => return Ok(info),
            Ok((_, cum, cur)) if Instant::now() >= end => bail!(
                "shunt did not settle within {SETTLE_LIMIT:?}: CumConns {cum} \
                 (want >= {min_conns}), CurrConns {cur} (want 0)"
            ),
            Err(e) if Instant::now() >= end => {
                return Err(e.context(format!("stats socket {}", cli.display())))
            }
            _ => std::thread::sleep(SETTLE_POLL),
        }
    }
}

/// Checks through the stats socket that the push was one flow in the mode `want`
/// (`auto`: any mode) with SIZE bytes in and the sink's 8-byte answer out; returns the
/// mode it used and, for sockmap, the kernel-side deltas of `show info`.
fn verify_flow(
    child: &mut ChildGuard,
    cli: &Path,
    before: &Counted,
    want: &str,
    size: u64,
) -> Result<(&'static str, Option<String>)> {
    let conns = testkit::info_num(&before.info, "CumConns")?;
    let after = settled(child, cli, conns + 1)?;
    let mut deltas = Vec::new();
    for (mode, key) in FLOW_COUNTERS {
        let d = testkit::info_num(&after.info, key)?
            .checked_sub(testkit::info_num(&before.info, key)?)
            .with_context(|| format!("show info: {key} went down"))?;
        deltas.push((mode, key, d));
    }
    let used = used_mode(&deltas, want)?;
    let (bin, bout) = (after.bin - before.bin, after.bout - before.bout);
    ensure!(
        bin == size && bout == SINK_ANSWER,
        "shunt's FRONTEND counted bin +{bin} bout +{bout} for the push; it sent {size} \
         and got {SINK_ANSWER} back"
    );
    let note = if used == "sockmap" {
        let mut parts = Vec::new();
        for key in KERNEL_FIELDS {
            let d = testkit::info_num(&after.info, key)?
                .saturating_sub(testkit::info_num(&before.info, key)?);
            parts.push(format!("{key} +{d}"));
        }
        let peak = testkit::info_num(&after.info, "SockmapInflightPeak")?;
        parts.push(format!("SockmapInflightPeak {peak}"));
        Some(parts.join(", "))
    } else {
        None
    };
    Ok((used, note))
}

/// The one mode whose flow counter moved, if it is the one wanted.
fn used_mode(deltas: &[(&'static str, &str, u64)], want: &str) -> Result<&'static str> {
    let moved: Vec<_> = deltas.iter().filter(|(_, _, d)| *d > 0).collect();
    let summary = || {
        deltas
            .iter()
            .map(|(_, k, d)| format!("{k} +{d}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let [(mode, _, 1)] = moved.as_slice() else {
        bail!(
            "the push should be exactly one flow; shunt's show info counted {}",
            summary()
        );
    };
    ensure!(
        want == "auto" || *mode == want,
        "asked for {want}, but shunt forwarded the flow with {mode} ({})",
        summary()
    );
    Ok(mode)
}

/// Busy time of all CPUs (everything but idle and iowait) from /proc/stat, in seconds.
pub fn host_busy_seconds() -> Result<f64> {
    let text = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    let ticks = parse_host_busy(&text).context("unexpected /proc/stat")?;
    // /proc/stat counts in USER_HZ, the same unit as /proc/PID/stat.
    let one_tick = proc::cpu_seconds_per_tick();
    Ok(ticks as f64 * one_tick)
}

/// The aggregate `cpu` line of /proc/stat as (steal, all fields): time the hypervisor
/// ran something else while this machine's CPUs had work, against all time.
pub fn host_steal_ticks() -> Result<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    parse_host_steal(&text).context("unexpected /proc/stat")
}

/// The share of the CPUs' time the hypervisor stole between two readings of
/// [`host_steal_ticks`], in percent (`None` when no time passed).
pub fn steal_pct(before: (u64, u64), after: (u64, u64)) -> Option<f64> {
    let total = after.1.checked_sub(before.1).filter(|t| *t > 0)?;
    let steal = after.0.saturating_sub(before.0);
    Some(steal as f64 * 100.0 / total as f64)
}

/// The fields of the aggregate `cpu` line of /proc/stat, in ticks: user nice system
/// idle iowait irq softirq steal guest guest_nice.
fn cpu_line(stat: &str) -> Option<Vec<u64>> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    line.split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect()
}

/// (steal, total) of the aggregate `cpu` line: guest time is already in user, so the
/// total is the first eight fields.
fn parse_host_steal(stat: &str) -> Option<(u64, u64)> {
    let v = cpu_line(stat)?;
    Some((*v.get(7)?, v.iter().take(8).sum()))
}

/// user+nice+system+irq+softirq+steal of the aggregate `cpu` line.
fn parse_host_busy(stat: &str) -> Option<u64> {
    let v = cpu_line(stat)?;
    Some(v.first()? + v.get(1)? + v.get(2)? + v.get(5)? + v.get(6)? + v.get(7).unwrap_or(&0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_the_eighth_field_over_the_first_eight() {
        let a = "cpu  100 0 50 800 10 0 20 20 7 0\ncpu0 1 2 3\n";
        let b = "cpu  200 0 50 900 10 0 20 120 9 0\n";
        let (sa, ta) = parse_host_steal(a).expect("a");
        assert_eq!((sa, ta), (20, 1000));
        let sb = parse_host_steal(b).expect("b");
        assert_eq!(sb, (120, 1300));
        let pct = steal_pct((sa, ta), sb).expect("pct");
        assert!((pct - 100.0 / 3.0).abs() < 1e-9, "{pct}");
        assert_eq!(steal_pct(sb, sb), None);
        assert_eq!(parse_host_steal("cpu  1 2 3\n"), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1G").expect("1G"), 1 << 30);
        assert_eq!(parse_size("1GiB").expect("1GiB"), 1 << 30);
        assert_eq!(parse_size("512M").expect("512M"), 512 << 20);
        assert_eq!(parse_size("64k").expect("64k"), 64 << 10);
        assert_eq!(parse_size("1000").expect("1000"), 1000);
        assert!(parse_size("0").is_err());
        assert!(parse_size("1T").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999G").is_err());
    }

    #[test]
    fn generated_config_routes_front_to_sink() {
        let cfg = config_text(
            "127.0.0.1:4000".parse().expect("a"),
            "127.0.0.1:4001".parse().expect("a"),
            &["option splice-auto"],
            Some(Path::new("/tmp/b.sock")),
        );
        let layout = xtask::layout::scan(&cfg);
        assert_eq!(
            layout.frontends,
            vec![("bench".into(), vec![4000], Some("bench".into()))]
        );
        assert_eq!(
            layout.backends[0].1,
            vec![("sink".into(), "127.0.0.1:4001".parse().expect("a"))]
        );
        assert!(cfg.contains("    option splice-auto\n"));
        assert!(cfg.contains("mode tcp"));
        assert_eq!(layout.stats_socket, Some(PathBuf::from("/tmp/b.sock")));
        let plain = config_text(
            "127.0.0.1:4000".parse().expect("a"),
            "127.0.0.1:4001".parse().expect("a"),
            &[],
            None,
        );
        assert!(!plain.contains("stats socket"));
    }

    #[test]
    fn the_flow_must_be_one_flow_in_the_mode_asked_for() {
        let d = |s, p, c| {
            [
                ("sockmap", "SockmapFlows", s),
                ("splice", "SpliceFlows", p),
                ("copy", "CopyFlows", c),
            ]
        };
        assert_eq!(used_mode(&d(1, 0, 0), "sockmap").expect("ok"), "sockmap");
        assert_eq!(used_mode(&d(0, 1, 0), "splice").expect("ok"), "splice");
        assert_eq!(used_mode(&d(0, 0, 1), "auto").expect("ok"), "copy");
        let e = used_mode(&d(0, 1, 0), "sockmap").expect_err("fell back");
        assert!(format!("{e}").contains("with splice"), "{e}");
        assert!(used_mode(&d(0, 0, 0), "copy").is_err(), "nothing counted");
        assert!(used_mode(&d(1, 1, 0), "auto").is_err(), "two flows");
        assert!(used_mode(&d(2, 0, 0), "sockmap").is_err(), "two flows");
    }

    #[test]
    fn socket_paths_fit_sun_path() {
        let short = socket_path(Path::new("/tmp/x"), "shunt-sockmap");
        assert_eq!(short, PathBuf::from("/tmp/x/bench-shunt-sockmap.sock"));
        let long = socket_path(Path::new(&"/d".repeat(60)), "shunt-sockmap");
        assert!(
            long.as_os_str().len() <= peers::MAX_SOCK_PATH,
            "{}",
            long.display()
        );
    }

    #[test]
    fn host_busy_sums_the_busy_fields() {
        let stat = "cpu  10 1 5 100 7 2 3 4 0 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n";
        assert_eq!(parse_host_busy(stat), Some(10 + 1 + 5 + 2 + 3 + 4));
        assert!(host_busy_seconds().expect("/proc/stat") > 0.0);
    }
}
