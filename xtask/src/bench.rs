//! `cargo xtask bench`: one-flow throughput and proxy CPU per forwarding mode.
//!
//! Owns the bench runs: for each mode, a generated configuration (one `listen` on a free
//! loopback port in front of an in-process sink, `nbthread 1`), shunt started with
//! `--forward-mode MODE`, SIZE bytes pushed through one flow, and the sink's own byte
//! count checked. Optionally the same through Debian's haproxy (plain, then with
//! `option splice-auto`). Throughput is SIZE over the time from connect to the sink's
//! EOF; proxy CPU is utime+stime from /proc/PID/stat before and after the push; host CPU
//! is the busy time of all CPUs from /proc/stat over the same window (it includes the
//! in-process client and sink, and kernel work done outside the proxy, e.g. sockmap
//! redirects that run in the sender's context).
//!
//! Invariants: runs one after another (never two proxies at once); each run is bounded
//! (`START_LIMIT` to accept, `--timeout` for the push, a stop grace); a failed run is
//! reported in its row and the others still run; the command fails if any run failed.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::demo::{gbits, human};
use crate::proc::{self, ChildGuard};
use crate::servers::{self, Counters, Kind, Server};

/// Default bound of one push, in seconds.
pub const DEFAULT_RUN_TIMEOUT_SECS: u64 = 120;
/// How long a proxy gets to accept on its bind address.
const START_LIMIT: Duration = Duration::from_secs(15);
const MODES: &[&str] = &["auto", "sockmap", "splice", "copy"];

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
}

struct Measure {
    elapsed: Duration,
    proxy_cpu: f64,
    host_cpu: f64,
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
        None => crate::build_release()?,
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
        })
        .collect();
    if opts.haproxy {
        if proc::output("haproxy", &["-v"]).is_none() {
            crate::setup::debian_packages()?;
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
                "xtask: {}: {:.2} Gbit/s, proxy CPU {:.2}s",
                t.label,
                gbits(size, m.elapsed),
                m.proxy_cpu
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
        "{:<16} {:>8} {:>8} {:>11} {:>10} {:>12} {:>15}",
        "run", "time s", "Gbit/s", "proxy CPU s", "host CPU s", "Gbit/s ratio", "proxy CPU ratio"
    );
    for (label, r) in results {
        match (r, base) {
            (Ok(m), Some(b)) => println!(
                "{label:<16} {:>8.2} {:>8.2} {:>11.2} {:>10.2} {:>11.2}x {:>15}",
                m.elapsed.as_secs_f64(),
                gbits(size, m.elapsed),
                m.proxy_cpu,
                m.host_cpu,
                b.elapsed.as_secs_f64() / m.elapsed.as_secs_f64().max(1e-9),
                if b.proxy_cpu > 0.0 {
                    format!("{:.2}x", m.proxy_cpu / b.proxy_cpu)
                } else {
                    "-".to_string()
                }
            ),
            _ => println!("{label:<16} {:>8}", "failed"),
        }
    }
    if let Some((label, _)) = results.iter().find(|(_, r)| r.is_ok()) {
        println!("(ratios relative to {label}; proxy CPU = utime+stime of the proxy process)");
    }
}

/// A loopback port nobody listens on right now.
fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("cannot bind a free port")?;
    Ok(l.local_addr()?.port())
}

/// The configuration of one run: one listen section in front of the sink.
pub fn config_text(front: SocketAddr, sink: SocketAddr, listen_opts: &[&str]) -> String {
    let mut cfg = format!(
        "# generated by `cargo xtask bench`\n\
         global\n    nbthread 1\n\n\
         defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 60s\n    \
         timeout server 60s\n\n\
         listen bench\n    bind {front}\n"
    );
    for o in listen_opts {
        cfg.push_str(&format!("    {o}\n"));
    }
    cfg.push_str(&format!("    server sink {sink}\n"));
    cfg
}

fn measure(t: &Target, size: u64, limit: Duration) -> Result<Measure> {
    let sink = Server::start("127.0.0.1:0".parse()?, Kind::Sink { report: true })?;
    let front = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let dir = crate::target_dir().join("xtask");
    std::fs::create_dir_all(&dir)?;
    let slug = t.label.replace(' ', "-");
    let cfg_path = dir.join(format!("bench-{slug}.cfg"));
    std::fs::write(&cfg_path, config_text(front, sink.addr, t.listen_opts))
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
    let pid = child.pid();
    let client = std::sync::Arc::new(Counters::default());
    let cpu0 = proc::cpu_seconds(pid)?;
    let host0 = host_busy_seconds()?;
    let push = servers::push_to_sink(
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
    child.stop();
    Ok(Measure {
        elapsed: push.elapsed,
        proxy_cpu: cpu1 - cpu0,
        host_cpu: host1 - host0,
    })
}

/// Busy time of all CPUs (everything but idle and iowait) from /proc/stat, in seconds.
fn host_busy_seconds() -> Result<f64> {
    let text = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    let ticks = parse_host_busy(&text).context("unexpected /proc/stat")?;
    // /proc/stat counts in USER_HZ, the same unit as /proc/PID/stat.
    let one_tick = proc::cpu_seconds_per_tick();
    Ok(ticks as f64 * one_tick)
}

/// user+nice+system+irq+softirq+steal of the aggregate `cpu` line.
fn parse_host_busy(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal …
    Some(v.first()? + v.get(1)? + v.get(2)? + v.get(5)? + v.get(6)? + v.get(7).unwrap_or(&0))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        );
        let layout = crate::demo::scan(&cfg);
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
    }

    #[test]
    fn host_busy_sums_the_busy_fields() {
        let stat = "cpu  10 1 5 100 7 2 3 4 0 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n";
        assert_eq!(parse_host_busy(stat), Some(10 + 1 + 5 + 2 + 3 + 4));
        assert!(host_busy_seconds().expect("/proc/stat") > 0.0);
    }
}
