//! `cargo xtask bench --scenarios pool-ttfb`: warm server spares (issue 6) against a
//! server 1 ms away, not part of the default scenario set.
//!
//! Owns the scenario. The server is an echo server inside the namespace of the delay
//! wire (`delay::Wire`, 500 µs each way: the kernel has no netem); shunt runs in the
//! root namespace with its frontend on 127.0.0.1. Two measurements:
//! - time to first response byte of sequential new flows (connect to the frontend,
//!   write `REQUEST`, read the first echoed byte; the server answers one request and
//!   closes), with [`FLOW_PAUSE`] between flows
//!   so the pool refills: directly to the server (the floor), through shunt without a
//!   pool, and through shunt with `pool-max-conn 8` (measured only once `show servers
//!   conn` shows a spare); p50 / p99 / max of each;
//! - the takeover rate under a connection storm: shunt `nbthread 2`, `pool-max-conn
//!   16`, `pool-low-conn 0` vs `pool-low-conn 4` (2 × nbthread), [`STORM_THREADS`]
//!   clients looping on whole flows for a bounded time; `fd_takeover` (`show activity`,
//!   total) and `warm_hit`/`warm_miss`/`warm_dead` (`show info`) per 100 flows.
//!
//! Invariants: the wire's round trip is checked first (median TCP connect across it
//! within [`RTT_MIN`]..[`RTT_MAX`], or the scenario fails); shunt is started through
//! `proc::ChildGuard`; every loop is bounded in time and count and polls
//! `proc::stop_requested`; the namespace is gone when `run` returns, whatever the path.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use crate::delay::{self, Wire};
use crate::latency::ms;
use crate::peers;
use crate::report::quantile;
use shunt_testkit::{self as testkit, Server};
use xtask::proc::{self, ChildGuard};

/// What each flow writes (and reads back).
const REQUEST: &[u8] = b"ping\n";
/// Pause between two measured flows (the pool refills in one round trip).
const FLOW_PAUSE: Duration = Duration::from_millis(5);
/// Client threads of the connection storm.
const STORM_THREADS: usize = 8;
/// Flows per storm thread at most.
const STORM_CAP: u64 = 20_000;
/// Connects of the wire's self-check.
const RTT_PROBES: usize = 50;
/// Accepted range of the self-check's median round trip.
const RTT_MIN: Duration = Duration::from_micros(800);
const RTT_MAX: Duration = Duration::from_millis(5);
/// Bound of one flow's I/O and of shunt's start.
const IO_LIMIT: Duration = Duration::from_secs(10);
/// Bound of the wait for the first spare.
const SPARE_LIMIT: Duration = Duration::from_secs(10);
/// Concurrent flows held once so the pool learns a need (spares follow the recent
/// peak of concurrent flows).
const TEACH_FLOWS: usize = 2;
/// How long they are held.
const TEACH_HOLD: Duration = Duration::from_millis(200);
/// `pool-max-conn` of the time-to-first-byte run.
const TTFB_POOL: u32 = 8;
/// `pool-max-conn` and threads of the storm.
const STORM_POOL: u32 = 16;
const STORM_NBTHREAD: u32 = 2;

/// Sizes of the scenario.
#[derive(Debug, Clone)]
pub struct Plan {
    pub ttfb_flows: usize,
    pub storm: Duration,
    /// Storm rounds; each measures `pool-low-conn 0` then `2 * nbthread`.
    pub storm_rounds: usize,
}

impl Plan {
    pub fn new(quick: bool) -> Self {
        if quick {
            Plan {
                ttfb_flows: 200,
                storm: Duration::from_secs(2),
                storm_rounds: 1,
            }
        } else {
            Plan {
                ttfb_flows: 500,
                storm: Duration::from_secs(3),
                storm_rounds: 3,
            }
        }
    }
}

/// One time-to-first-byte row.
struct Ttfb {
    label: String,
    /// µs, sorted.
    us: Vec<u64>,
    /// Warm hits and misses during the run (none for the direct row).
    warm: Option<(u64, u64)>,
    /// The wire during the measurement: see `Wire::window`.
    late: (Duration, u64),
}

/// One storm row.
#[derive(Clone, Copy)]
struct Storm {
    /// 1-based; 0 on a sum over rounds.
    round: usize,
    low: u32,
    flows: u64,
    failed: u64,
    takeovers: u64,
    hit: u64,
    miss: u64,
    dead: u64,
    late: (Duration, u64),
}

/// Bench state shared by every run.
struct Env<'a> {
    shunt: &'a Path,
    dir: &'a Path,
    back: SocketAddr,
    wire: &'a Wire,
}

/// Runs the scenario, prints the tables and writes `out_root/docs/bench/pool-ttfb.md`.
pub fn run(shunt: &Path, dir: &Path, out_root: &Path, quick: bool) -> Result<PathBuf> {
    let plan = Plan::new(quick);
    println!("xtask: pool-ttfb: {plan:?}");
    let wire = Wire::start(delay::DEFAULT_DELAY)?;
    let echo = start_far_echo()?;
    let rtt = Wire::connect_rtt(echo.addr, RTT_PROBES)?;
    println!(
        "xtask: pool-ttfb: self-check: median TCP connect to {} is {:.3} ms",
        echo.addr,
        rtt.as_secs_f64() * 1e3
    );
    ensure!(
        (RTT_MIN..=RTT_MAX).contains(&rtt),
        "the delay wire's round trip is {rtt:?}, outside {RTT_MIN:?}..{RTT_MAX:?}"
    );
    let self_check_late = wire.window().0;
    let env = Env {
        shunt,
        dir,
        back: echo.addr,
        wire: &wire,
    };
    let mut ttfb = vec![Ttfb {
        label: "direct to the server".into(),
        us: measure_ttfb(echo.addr, plan.ttfb_flows)?,
        warm: None,
        late: wire.window(),
    }];
    for pool in [0, TTFB_POOL] {
        ensure!(!proc::stop_requested(), "interrupted");
        ttfb.push(ttfb_run(&env, pool, plan.ttfb_flows)?);
    }
    let mut storms = Vec::new();
    for round in 1..=plan.storm_rounds {
        for low in [0, 2 * STORM_NBTHREAD] {
            ensure!(!proc::stop_requested(), "interrupted");
            storms.push(storm_run(&env, round, low, plan.storm)?);
        }
    }
    let (packets, drops) = wire.totals();
    let errno = wire.first_errno();
    let check = WireCheck {
        rtt,
        late: self_check_late,
        packets,
        drops,
        realtime: wire.realtime(),
    };
    drop(echo);
    drop(wire);
    let table = render(&plan, &check, &ttfb, &storms);
    println!("{table}");
    let docs = out_root.join("docs").join("bench");
    std::fs::create_dir_all(&docs).with_context(|| format!("cannot create {}", docs.display()))?;
    let out = docs.join("pool-ttfb.md");
    std::fs::write(&out, &table).with_context(|| format!("cannot write {}", out.display()))?;
    ensure!(
        drops == 0,
        "the delay wire dropped {drops} packet(s) (first write errno: {errno:?})"
    );
    Ok(out)
}

fn config(front: SocketAddr, back: SocketAddr, sock: &Path, nbthread: u32, kw: &str) -> String {
    format!(
        "# generated by `cargo xtask bench --scenarios pool-ttfb`\n\
         global\n    nbthread {nbthread}\n    maxconn 20000\n    \
         stats socket {} mode 600 level admin\n\n\
         defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 30s\n    \
         timeout server 30s\n\n\
         frontend fe\n    bind {front}\n    default_backend be\n\n\
         backend be\n    server s1 {back} {kw}\n",
        sock.display()
    )
}

/// A shunt for one run, with its frontend and stats socket.
struct Proxy {
    guard: ChildGuard,
    front: SocketAddr,
    sock: PathBuf,
}

fn start_shunt(env: &Env, nbthread: u32, kw: &str) -> Result<Proxy> {
    let (shunt, dir, back) = (env.shunt, env.dir, env.back);
    let front = SocketAddr::from(([127, 0, 0, 1], peers::free_port()?));
    let sock = peers::socket_path(dir, "pool-ttfb.sock");
    let _ = std::fs::remove_file(&sock);
    let cfg = dir.join("pool-ttfb.cfg");
    std::fs::write(&cfg, config(front, back, &sock, nbthread, kw))
        .with_context(|| format!("cannot write {}", cfg.display()))?;
    let cfg_arg = cfg.display().to_string();
    let mut guard = ChildGuard::spawn(
        "shunt (pool-ttfb)",
        shunt,
        &["-f", &cfg_arg],
        &dir.join("pool-ttfb-shunt.log"),
        true,
    )?;
    guard.wait_for_port(front, IO_LIMIT)?;
    guard.wait_for_stats(&sock, IO_LIMIT)?;
    Ok(Proxy { guard, front, sock })
}

/// Holds [`TEACH_FLOWS`] served flows at once, then waits for a spare.
fn wait_for_spare(p: &Proxy) -> Result<()> {
    // Silent flows: the server answers (and closes) only after a request.
    let held: Vec<TcpStream> = (0..TEACH_FLOWS)
        .map(|_| TcpStream::connect_timeout(&p.front, IO_LIMIT))
        .collect::<std::io::Result<_>>()?;
    std::thread::sleep(TEACH_HOLD);
    drop(held);
    let end = Instant::now() + SPARE_LIMIT;
    loop {
        let text = testkit::cli_command(&p.sock, "show servers conn be")?;
        if idle_cur(&text, "be/s1").is_some_and(|n| n > 0) {
            return Ok(());
        }
        ensure!(!proc::stop_requested(), "interrupted");
        ensure!(
            Instant::now() < end,
            "no warm spare within {SPARE_LIMIT:?}; show servers conn be:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `idle_cur` (the 13th field) of server `name` (`be/s1`) in `show servers conn`.
fn idle_cur(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(' ').next() == Some(name))?;
    line.split(' ').nth(12)?.parse().ok()
}

/// `warm_hit`, `warm_miss`, `warm_dead` of `show info` (the same names as `show stat`).
fn warm_counters(sock: &Path) -> Result<(u64, u64, u64)> {
    let info = testkit::parse_show_info(&testkit::cli_command(sock, "show info")?);
    Ok((
        testkit::info_num(&info, WARM_FIELDS[0])?,
        testkit::info_num(&info, WARM_FIELDS[1])?,
        testkit::info_num(&info, WARM_FIELDS[2])?,
    ))
}

/// `show info` names of the warm-spare totals.
const WARM_FIELDS: [&str; 3] = ["warm_hit", "warm_miss", "warm_dead"];

/// The total (first number) of `fd_takeover:` in `show activity`.
fn fd_takeover(activity: &str) -> Option<u64> {
    let line = activity
        .lines()
        .find_map(|l| l.trim().strip_prefix("fd_takeover:"))?;
    line.split_whitespace().next()?.parse().ok()
}

fn ttfb_run(env: &Env, pool: u32, n: usize) -> Result<Ttfb> {
    let kw = if pool == 0 {
        String::new()
    } else {
        format!("pool-max-conn {pool}")
    };
    let label = if pool == 0 {
        "shunt, no pool".to_string()
    } else {
        format!("shunt, `{kw}`")
    };
    println!("xtask: pool-ttfb: {label}");
    let mut p = start_shunt(env, 1, &kw)?;
    if pool > 0 {
        wait_for_spare(&p)?;
    }
    let before = warm_counters(&p.sock)?;
    env.wire.window();
    let us = measure_ttfb(p.front, n)?;
    let late = env.wire.window();
    let after = warm_counters(&p.sock)?;
    p.guard.check_alive()?;
    p.guard.stop();
    Ok(Ttfb {
        label,
        us,
        warm: Some((after.0 - before.0, after.1 - before.1)),
        late,
    })
}

/// Time to first byte of `n` sequential new flows to `addr`, µs, sorted.
fn measure_ttfb(addr: SocketAddr, n: usize) -> Result<Vec<u64>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        ensure!(!proc::stop_requested(), "interrupted");
        v.push(one_ttfb(addr)?.as_micros() as u64);
        std::thread::sleep(FLOW_PAUSE);
    }
    v.sort_unstable();
    Ok(v)
}

fn one_ttfb(addr: SocketAddr) -> Result<Duration> {
    let t = Instant::now();
    let mut c = TcpStream::connect_timeout(&addr, IO_LIMIT)?;
    c.set_nodelay(true)?;
    c.set_read_timeout(Some(IO_LIMIT))?;
    c.write_all(REQUEST)?;
    let mut b = [0u8; REQUEST.len()];
    c.read_exact(&mut b[..1])?;
    let e = t.elapsed();
    c.read_exact(&mut b[1..])?;
    ensure!(b == REQUEST, "echo differs: {b:?}");
    // The server closed after its answer; wait for that EOF, then reset instead of a
    // FIN: no TIME_WAIT in the root namespace on either side (see `start_far_echo`).
    let mut rest = [0u8; 64];
    while c.read(&mut rest)? > 0 {}
    reset_on_close(&c);
    Ok(e)
}

fn storm_run(env: &Env, round: usize, low: u32, d: Duration) -> Result<Storm> {
    let kw = format!("pool-max-conn {STORM_POOL} pool-low-conn {low}");
    println!("xtask: pool-ttfb: storm, nbthread {STORM_NBTHREAD}, {kw}");
    let mut p = start_shunt(env, STORM_NBTHREAD, &kw)?;
    wait_for_spare(&p)?;
    let take0 = fd_takeover(&testkit::cli_command(&p.sock, "show activity")?)
        .context("show activity has no fd_takeover line")?;
    let w0 = warm_counters(&p.sock)?;
    env.wire.window();
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicU64::new(0));
    let front = p.front;
    let workers: Vec<_> = (0..STORM_THREADS)
        .map(|_| {
            let (stop, failed) = (stop.clone(), failed.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) && !proc::stop_requested() && n < STORM_CAP {
                    if one_ttfb(front).is_err() {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    proc::sleep_unless_stopped(d);
    stop.store(true, Ordering::Relaxed);
    let flows: u64 = workers.into_iter().map(|w| w.join().unwrap_or(0)).sum();
    let late = env.wire.window();
    ensure!(!proc::stop_requested(), "interrupted");
    let take1 = fd_takeover(&testkit::cli_command(&p.sock, "show activity")?)
        .context("show activity has no fd_takeover line")?;
    let w1 = warm_counters(&p.sock)?;
    p.guard.check_alive()?;
    p.guard.stop();
    Ok(Storm {
        round,
        low,
        flows,
        failed: failed.load(Ordering::Relaxed),
        takeovers: take1 - take0,
        hit: w1.0 - w0.0,
        miss: w1.1 - w0.1,
        dead: w1.2 - w0.2,
        late,
    })
}

/// Makes the next close of `c` send a reset (`SO_LINGER` 0).
fn reset_on_close(c: &TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on our open socket with a valid linger struct of the given size.
    unsafe {
        libc::setsockopt(
            c.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// An echo server listening inside the wire's namespace; a thread per connection.
/// It answers one request (the bytes of its first read) and closes: the server end
/// closes first, so the TIME_WAIT of the server leg stays in the namespace, and the
/// client, which then resets, leaves none on the client leg. Otherwise tens of
/// thousands of flows per run fill the root namespace's ephemeral ports with
/// TIME_WAIT and every later connect (shunt's included) slows down.
fn start_far_echo() -> Result<Server> {
    let echo = Server::try_serve(delay::listen_far()?, |mut c| {
        let _ = c.set_nodelay(true);
        let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
        let mut buf = [0u8; 4096];
        if let Ok(n) = c.read(&mut buf) {
            let _ = c.write_all(&buf[..n]);
        }
        let _ = c.shutdown(Shutdown::Both);
    })?;
    Ok(echo)
}

fn per_100(n: u64, flows: u64) -> String {
    format!("{:.1}", n as f64 * 100.0 / flows.max(1) as f64)
}

/// What the run says about the wire itself.
struct WireCheck {
    /// Median TCP connect round trip.
    rtt: Duration,
    /// The latest packet of the self-check, past its due time.
    late: Duration,
    packets: u64,
    drops: u64,
    realtime: bool,
}

fn us(d: Duration) -> u128 {
    d.as_micros()
}

/// `N (max µs)` of a `Wire::window` reading.
fn late((max, n): (Duration, u64)) -> String {
    format!("{n} ({})", us(max))
}

/// One row summing the rounds of one `pool-low-conn` (round 0).
fn sum_rounds(low: u32, rows: &[&Storm]) -> Storm {
    let sum = |f: fn(&Storm) -> u64| rows.iter().map(|s| f(s)).sum();
    Storm {
        round: 0,
        low,
        flows: sum(|s| s.flows),
        failed: sum(|s| s.failed),
        takeovers: sum(|s| s.takeovers),
        hit: sum(|s| s.hit),
        miss: sum(|s| s.miss),
        dead: sum(|s| s.dead),
        late: (
            rows.iter().map(|s| s.late.0).max().unwrap_or_default(),
            rows.iter().map(|s| s.late.1).sum(),
        ),
    }
}

fn render(plan: &Plan, w: &WireCheck, ttfb: &[Ttfb], storms: &[Storm]) -> String {
    let mut t = format!(
        "## Warm spares with a server 1 ms away\n\n\
         Server: an echo server in network namespace `{}`, reached through a TUN \
         \"delay wire\" run by xtask that holds every packet {} µs each way (the kernel \
         has no `sch_netem`; delay threads {}). Self-check: median TCP connect round \
         trip across the wire {:.3} ms ({RTT_PROBES} connects, latest packet {} µs past \
         due); the wire forwarded {} packets in all and dropped {}. `wire late` \
         columns: packets the wire wrote more than {} µs past their due time during \
         that row's measurement, and the latest one (µs): a busy machine adds that to \
         the delay.\n\n\
         ### Time to first response byte of a new flow (ms)\n\n\
         {} sequential flows per row (connect, write {} B, read the first echoed byte), \
         {} ms apart; shunt `nbthread 1`, default forwarding mode; the pooled run \
         starts once `show servers conn` shows a spare.\n\n\
         | setup | flows | p50 | p99 | max | warm hits | warm misses | wire late (max µs) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
        delay::NETNS,
        delay::DEFAULT_DELAY.as_micros(),
        if w.realtime {
            "`SCHED_FIFO`"
        } else {
            "at normal priority"
        },
        w.rtt.as_secs_f64() * 1e3,
        us(w.late),
        w.packets,
        w.drops,
        delay::LATE_MARK.as_micros(),
        plan.ttfb_flows,
        REQUEST.len(),
        FLOW_PAUSE.as_millis(),
    );
    for r in ttfb {
        let (hit, miss) = r.warm.map_or(("-".into(), "-".into()), |(h, m)| {
            (h.to_string(), m.to_string())
        });
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {hit} | {miss} | {} |\n",
            r.label,
            r.us.len(),
            ms(quantile(&r.us, 0.50)),
            ms(quantile(&r.us, 0.99)),
            ms(r.us.last().copied().unwrap_or(0)),
            late(r.late),
        ));
    }
    t.push_str(&format!(
        "\n### Takeovers under a connection storm\n\n\
         shunt `nbthread {STORM_NBTHREAD}`, `pool-max-conn {STORM_POOL}`; {STORM_THREADS} \
         client threads looping on whole flows for {} s (at most {STORM_CAP} flows each). \
         Takeovers: `fd_takeover` of `show activity` (total); warm counters: `show info`.\n\n\
         | pool-low-conn | round | flows | failed | takeovers | takeovers / 100 flows | warm hits / 100 | warm misses / 100 | warm dead | wire late (max µs) |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        plan.storm.as_secs(),
    ));
    let mut rows: Vec<Storm> = Vec::new();
    for low in [0, 2 * STORM_NBTHREAD] {
        let mine: Vec<&Storm> = storms.iter().filter(|s| s.low == low).collect();
        rows.extend(mine.iter().map(|s| **s));
        if mine.len() > 1 {
            rows.push(sum_rounds(low, &mine));
        }
    }
    for s in &rows {
        let round = if s.round == 0 {
            "**all**".to_string()
        } else {
            s.round.to_string()
        };
        t.push_str(&format!(
            "| {} | {round} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            s.low,
            s.flows,
            s.failed,
            s.takeovers,
            per_100(s.takeovers, s.flows),
            per_100(s.hit, s.flows),
            per_100(s.miss, s.flows),
            s.dead,
            late(s.late),
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_idle_cur_and_fd_takeover() {
        let conn = "# bkname/svname bkid/svid addr port - purge_delay used_cur used_max \
                    need_est unsafe_nb safe_nb idle_lim idle_cur idle_per_thr[2]\n\
                    be/s1 3/1 10.203.0.2 4000 - 5000 0 2 2 0 3 16 3 2 1\n";
        assert_eq!(idle_cur(conn, "be/s1"), Some(3));
        assert_eq!(idle_cur(conn, "be/s2"), None);
        let act = "thread_id: 1 (1..2)\nfd_takeover: 17 [ 9 8 ]\n";
        assert_eq!(fd_takeover(act), Some(17));
        assert_eq!(fd_takeover("ctxsw: 1\n"), None);
    }

    #[test]
    fn rounds_sum_into_an_all_row_and_rates_are_per_100_flows() {
        let row = |round, flows, takeovers| Storm {
            round,
            low: 4,
            flows,
            failed: 0,
            takeovers,
            hit: flows,
            miss: 0,
            dead: 0,
            late: (Duration::from_micros(round as u64 * 10), 1),
        };
        let (a, b) = (row(1, 1000, 10), row(2, 3000, 50));
        let s = sum_rounds(4, &[&a, &b]);
        assert_eq!((s.round, s.flows, s.takeovers), (0, 4000, 60));
        assert_eq!(s.late, (Duration::from_micros(20), 2));
        assert_eq!(per_100(s.takeovers, s.flows), "1.5");
        assert_eq!(per_100(3, 0), "300.0");
        let w = WireCheck {
            rtt: Duration::from_micros(1050),
            late: Duration::ZERO,
            packets: 1,
            drops: 0,
            realtime: true,
        };
        let text = render(&Plan::new(true), &w, &[], &[a, b]);
        assert!(
            text.contains("| 4 | **all** | 4000 | 0 | 60 | 1.5 |"),
            "{text}"
        );
        assert!(text.contains("1.050 ms"), "{text}");
    }

    #[test]
    fn config_names_the_pool_keywords() {
        let c = config(
            "127.0.0.1:1".parse().unwrap(),
            "10.203.0.2:2".parse().unwrap(),
            Path::new("/tmp/s.sock"),
            2,
            "pool-max-conn 16 pool-low-conn 4",
        );
        assert!(c.contains("server s1 10.203.0.2:2 pool-max-conn 16 pool-low-conn 4\n"));
        assert!(c.contains("nbthread 2"));
    }
}
