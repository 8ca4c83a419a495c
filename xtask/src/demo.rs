//! `cargo xtask demo`: shunt in front of in-process backends, with live counters.
//!
//! Owns the demo's layout: echo servers on 127.0.0.1:10081 and :10082 and a sink on
//! 127.0.0.1:10091, started in this process; which frontends and backends lead to them,
//! and where shunt's stats socket is, is read from the demo configuration
//! (examples/demo.cfg) by a small scan of its `frontend`/`backend`/`listen`, `bind`,
//! `default_backend`, `server` and global `stats socket` lines.
//!
//! Counting: the counters printed are shunt's own, read over its stats socket
//! (`show stat`: pxname, svname, scur, smax, stot, bin, bout, status, lbtot; `show info`:
//! `Forward_mode`, `Bpf` and the flows per forwarding mode). The demo also counts for
//! itself — FRONTEND rows on the client side (what it sent and received through each
//! bind address), server rows by the backends themselves — and after every burst checks
//! that shunt's bin/bout agree with those counts, once shunt has closed the burst's
//! flows (`SETTLE_LIMIT`). A configuration without a stats socket gets the demo's own
//! counts only, and says so.
//!
//! Invariants: the demo never leaves shunt running (SIGINT/SIGTERM stop it with SIGTERM
//! and exit 0); every echo is checked byte for byte and every sink push is checked
//! against the sink's own count; a disagreement between shunt's counters and the demo's
//! ends the demo with an error (exit 1); traffic goes only to 127.0.0.1.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use shunt_testkit::{self as testkit, Backend, Counters, Kind, Snapshot, StatRow};
use xtask::layout::{scan, Layout};
use xtask::proc::{self, ChildGuard};
use xtask::units::{gbits, human};

pub const DEFAULT_CONFIG: &str = "examples/demo.cfg";
/// Ports of the echo servers the demo starts.
const ECHO_PORTS: [u16; 2] = [10081, 10082];
/// Port of the sink the demo starts.
const SINK_PORT: u16 = 10091;
/// Echo round trips per echo frontend in the first burst (sizes 1 KiB … 64 KiB).
const ECHO_ROUNDS: usize = 8;
/// Bytes pushed to the sink per sink frontend in the first burst.
const SINK_BYTES: u64 = 8 << 20;
/// Bytes per sink push and per echo in each periodic tick.
const TICK_SINK_BYTES: u64 = 1 << 20;
const TICK_ECHO_BYTES: usize = 4096;
/// Time between two status lines.
const TICK: Duration = Duration::from_secs(5);
/// Bound of the check that nothing accepts on a frontend address before shunt starts.
const PORT_PROBE: Duration = Duration::from_millis(300);
/// How long shunt gets to accept on its bind addresses.
const START_LIMIT: Duration = Duration::from_secs(15);
/// Bound of one push or round trip.
const PUSH_LIMIT: Duration = Duration::from_secs(60);
/// How long shunt gets, after a burst, to close its flows and fold their bytes into the
/// counters before a disagreement with the demo's counts is an error.
const SETTLE_LIMIT: Duration = Duration::from_secs(5);
/// Pause between two stats socket polls while settling.
const SETTLE_POLL: Duration = Duration::from_millis(50);
/// `show info` fields printed with the counters: mode, BPF state, flows per mode.
const INFO_FIELDS: [&str; 5] = [
    "Forward_mode",
    "Bpf",
    "SockmapFlows",
    "SpliceFlows",
    "CopyFlows",
];
/// Kernel handoff fields printed after them when BPF is loaded.
const SOCKMAP_FIELDS: [&str; 4] = [
    "SockmapFallbacks",
    "SockmapPauses",
    "SockmapInflightPeak",
    "SockmapRedirectErrors",
];

fn role(addr: &SocketAddr) -> Option<Kind> {
    if !addr.ip().is_loopback() {
        return None;
    }
    if ECHO_PORTS.contains(&addr.port()) {
        Some(Kind::Echo)
    } else if addr.port() == SINK_PORT {
        Some(Kind::Sink { report: false })
    } else {
        None
    }
}

/// One frontend the demo drives.
struct Front {
    name: String,
    addr: SocketAddr,
    kind: Kind,
    client: Arc<Counters>,
}

struct Demo {
    layout: Layout,
    fronts: Vec<Front>,
    servers: BTreeMap<SocketAddr, Backend>,
    /// shunt's stats socket, when the configuration declares one.
    cli: Option<PathBuf>,
}

/// What shunt says about itself over its stats socket.
struct ShuntView {
    rows: Vec<StatRow>,
    info: BTreeMap<String, String>,
}

impl ShuntView {
    fn query(cli: &Path) -> Result<Self> {
        let rows = testkit::parse_show_stat(&testkit::cli_command(cli, "show stat")?)?;
        let info = testkit::parse_show_info(&testkit::cli_command(cli, "show info")?);
        Ok(Self { rows, info })
    }

    fn row(&self, px: &str, sv: &str) -> Option<&StatRow> {
        self.rows
            .iter()
            .find(|r| r.get("pxname") == px && r.get("svname") == sv)
    }

    fn info(&self, name: &str) -> &str {
        self.info.get(name).map_or("?", String::as_str)
    }

    /// Sessions shunt still holds on its frontends.
    fn open_sessions(&self) -> Result<u64> {
        self.rows
            .iter()
            .filter(|r| r.get("svname") == "FRONTEND")
            .map(|r| r.num("scur"))
            .sum()
    }
}

pub fn run(config: &Path, duration: Option<u64>, shunt: Option<PathBuf>) -> Result<()> {
    let config = resolve(config);
    let text = std::fs::read_to_string(&config)
        .with_context(|| format!("cannot read the demo configuration {}", config.display()))?;
    let demo = Demo::new(scan(&text))?;
    let bin = match shunt {
        Some(b) => b,
        None => xtask::build_release()?,
    };
    proc::catch_stop_signals()?;
    demo.ports_free()?;
    let config_arg = config.to_string_lossy().into_owned();
    let log = xtask::target_dir().join("xtask").join("demo-shunt.log");
    let mut shunt = ChildGuard::spawn("shunt", &bin, &["-f", &config_arg], &log, true)?;
    for f in &demo.fronts {
        shunt.wait_for_port(f.addr, START_LIMIT)?;
    }
    // The readiness probes were real connections; count them as the frontends saw them.
    for f in &demo.fronts {
        f.client.session();
    }
    println!("xtask: shunt (pid {}) is accepting", shunt.pid());
    match &demo.cli {
        Some(cli) => {
            let info = shunt.wait_for_stats(cli, START_LIMIT)?;
            let field = |k: &str| info.get(k).cloned().unwrap_or_else(|| "?".into());
            println!(
                "xtask: stats socket {} answers: Forward_mode: {}, Bpf: {}",
                cli.display(),
                field("Forward_mode"),
                field("Bpf")
            );
        }
        None => println!(
            "xtask: {} declares no `stats socket`: only the demo's own counts are shown",
            config.display()
        ),
    }

    demo.first_burst()?;
    demo.report()?;
    println!(
        "\nxtask: demo running; a line every {}s{}",
        TICK.as_secs(),
        match duration {
            Some(d) => format!(", stopping after {d}s"),
            None => ", Ctrl-C to stop".to_string(),
        }
    );
    let started = Instant::now();
    let end = duration.map(|d| started + Duration::from_secs(d));
    loop {
        let wait = match end {
            Some(end) => TICK.min(end.saturating_duration_since(Instant::now())),
            None => TICK,
        };
        if !proc::sleep_unless_stopped(wait) {
            println!("\nxtask: interrupted; stopping shunt");
            break;
        }
        shunt.check_alive()?;
        if end.is_some_and(|end| Instant::now() >= end) {
            println!(
                "\nxtask: {}s elapsed; stopping shunt",
                started.elapsed().as_secs()
            );
            break;
        }
        demo.tick(started.elapsed())?;
    }
    let checked = demo.report();
    let status = shunt.stop();
    println!(
        "xtask: shunt stopped{}",
        status.map(|s| format!(" ({s})")).unwrap_or_default()
    );
    checked
}

fn resolve(config: &Path) -> PathBuf {
    if config.is_absolute() || config.exists() {
        return config.to_path_buf();
    }
    xtask::workspace_root().join(config)
}

impl Demo {
    fn new(layout: Layout) -> Result<Self> {
        let mut servers = BTreeMap::new();
        for (_, list) in &layout.backends {
            for (name, addr) in list {
                if servers.contains_key(addr) {
                    continue;
                }
                let Some(kind) = role(addr) else {
                    println!("xtask: server {name} {addr}: not a demo backend, not started");
                    continue;
                };
                let server = Backend::start(*addr, kind).with_context(|| {
                    format!("cannot start the demo backend {name} on {addr} (port in use?)")
                })?;
                servers.insert(*addr, server);
            }
        }
        let mut fronts = Vec::new();
        for (name, ports, backend) in &layout.frontends {
            let Some(list) = layout
                .backends
                .iter()
                .find(|(b, _)| Some(b) == backend.as_ref())
                .map(|(_, l)| l)
            else {
                continue;
            };
            let kinds: Vec<Kind> = list.iter().filter_map(|(_, a)| role(a)).collect();
            let Some(&kind) = kinds.first() else { continue };
            if kinds.iter().any(|k| *k != kind) || kinds.len() != list.len() {
                println!(
                    "xtask: frontend {name}: its servers are not all of one demo kind; skipped"
                );
                continue;
            }
            for port in ports {
                fronts.push(Front {
                    name: name.clone(),
                    addr: SocketAddr::from(([127, 0, 0, 1], *port)),
                    kind,
                    client: Arc::new(Counters::default()),
                });
            }
        }
        ensure!(
            !fronts.is_empty(),
            "the demo configuration routes no frontend to the demo backends \
             (echo on 127.0.0.1:{:?}, sink on 127.0.0.1:{SINK_PORT})",
            ECHO_PORTS
        );
        for f in &fronts {
            println!(
                "xtask: frontend {} on {} → {} servers",
                f.name,
                f.addr,
                if f.kind == Kind::Echo { "echo" } else { "sink" }
            );
        }
        let cli = layout.stats_socket.clone();
        Ok(Self {
            layout,
            fronts,
            servers,
            cli,
        })
    }

    /// Fails if something already accepts on a frontend address: shunt binds with
    /// SO_REUSEPORT, so a leftover proxy there would silently take part of the traffic.
    fn ports_free(&self) -> Result<()> {
        for f in &self.fronts {
            if std::net::TcpStream::connect_timeout(&f.addr, PORT_PROBE).is_ok() {
                bail!(
                    "something already accepts on {} (frontend {}): a shunt left running? \
                     (`ss -ltnp | grep {}`)",
                    f.addr,
                    f.name,
                    f.addr.port()
                );
            }
        }
        Ok(())
    }

    fn sink_bytes(&self) -> u64 {
        self.servers
            .values()
            .filter(|s| role(&s.addr) == Some(Kind::Sink { report: false }))
            .map(|s| s.counters.snapshot().bin)
            .sum()
    }

    /// Traffic that shows the proxy works: checked echoes and a few MB to the sink.
    fn first_burst(&self) -> Result<()> {
        for f in &self.fronts {
            match f.kind {
                Kind::Echo => {
                    for i in 0..ECHO_ROUNDS {
                        let size = 1024 << (i % 7);
                        let payload = testkit::pattern(size, i as u64);
                        let took = testkit::echo_round_trip(f.addr, &payload, &f.client)?;
                        println!(
                            "xtask: echo via {} ({}): {size} bytes back intact in {:.2} ms",
                            f.addr,
                            f.name,
                            took.as_secs_f64() * 1e3
                        );
                    }
                }
                Kind::Sink { .. } => {
                    let before = self.sink_bytes();
                    let push = self.push(f, SINK_BYTES)?;
                    let arrived = self.sink_bytes() - before;
                    ensure!(
                        arrived == SINK_BYTES,
                        "sink via {}: sent {SINK_BYTES} bytes, the sink counted {arrived}",
                        f.addr
                    );
                    println!(
                        "xtask: sink via {} ({}): {} delivered in {:.1} ms ({:.2} Gbit/s)",
                        f.addr,
                        f.name,
                        human(SINK_BYTES),
                        push.elapsed.as_secs_f64() * 1e3,
                        gbits(SINK_BYTES, push.elapsed)
                    );
                }
            }
        }
        Ok(())
    }

    fn push(&self, f: &Front, bytes: u64) -> Result<testkit::Push> {
        testkit::push_to_sink(
            f.addr,
            bytes,
            false,
            &f.client,
            Instant::now() + PUSH_LIMIT,
            &proc::stop_requested,
        )
    }

    /// One periodic round: a small echo and a 1 MiB push per frontend, then a status
    /// line, with shunt's view when there is a stats socket. Fails only when shunt's
    /// counters disagree with the demo's (the tables are printed first).
    fn tick(&self, elapsed: Duration) -> Result<()> {
        let mut parts = Vec::new();
        for f in &self.fronts {
            let result = match f.kind {
                Kind::Echo => {
                    let payload = testkit::pattern(TICK_ECHO_BYTES, elapsed.as_secs());
                    testkit::echo_round_trip(f.addr, &payload, &f.client)
                }
                Kind::Sink { .. } => self.push(f, TICK_SINK_BYTES).map(|p| p.elapsed),
            };
            parts.push(match result {
                Ok(took) => format!("{} ok {:.1}ms", f.name, took.as_secs_f64() * 1e3),
                Err(e) => format!("{} FAILED: {e:#}", f.name),
            });
        }
        let Some(cli) = &self.cli else {
            for f in &self.fronts {
                let c = f.client.snapshot();
                parts.push(format!("{} stot={} bin={}", f.name, c.stot, human(c.bin)));
            }
            println!("[{:>5}s] {}", elapsed.as_secs(), parts.join(" | "));
            return Ok(());
        };
        let (view, diffs) = self.settle(cli)?;
        let mut shunt = Vec::new();
        for (name, _) in self.frontend_counts() {
            if let Some(r) = view.row(name, "FRONTEND") {
                shunt.push(format!(
                    "{name} stot={} bin={} bout={}",
                    r.get("stot"),
                    human(r.num("bin")?),
                    human(r.num("bout")?)
                ));
            }
        }
        println!(
            "[{:>5}s] {} | shunt: {}; flows sockmap={} splice={} copy={}; {}",
            elapsed.as_secs(),
            parts.join(" | "),
            shunt.join(", "),
            view.info("SockmapFlows"),
            view.info("SpliceFlows"),
            view.info("CopyFlows"),
            if diffs.is_empty() {
                "counters agree"
            } else {
                "COUNTERS DISAGREE"
            }
        );
        if diffs.is_empty() {
            Ok(())
        } else {
            self.report()
        }
    }

    /// The demo's own counts per driven frontend (client side), in layout order.
    fn frontend_counts(&self) -> Vec<(&str, Snapshot)> {
        self.layout
            .frontends
            .iter()
            .filter(|(name, _, _)| self.fronts.iter().any(|f| &f.name == name))
            .map(|(name, _, _)| {
                let sum = self
                    .fronts
                    .iter()
                    .filter(|f| &f.name == name)
                    .fold(Snapshot::default(), |acc, f| acc + f.client.snapshot());
                (name.as_str(), sum)
            })
            .collect()
    }

    /// The backends' own counts per server row, for servers whose address appears once
    /// in the layout (a backend started here that two rows share cannot be split).
    fn server_counts(&self) -> Vec<(&str, &str, Snapshot)> {
        let all = || self.layout.backends.iter().flat_map(|(_, l)| l.iter());
        let mut out = Vec::new();
        for (px, list) in &self.layout.backends {
            for (sv, addr) in list {
                let Some(server) = self.servers.get(addr) else {
                    continue;
                };
                if all().filter(|(_, a)| a == addr).count() == 1 {
                    out.push((px.as_str(), sv.as_str(), server.counters.snapshot()));
                }
            }
        }
        out
    }

    /// Where shunt's bin/bout differ from the demo's counts, one line per row.
    fn mismatches(&self, view: &ShuntView) -> Result<Vec<String>> {
        let mut diffs = Vec::new();
        let fronts = self
            .frontend_counts()
            .into_iter()
            .map(|(px, s)| (px, "FRONTEND", s, "the demo's clients"));
        let servers = self
            .server_counts()
            .into_iter()
            .map(|(px, sv, s)| (px, sv, s, "the backend itself"));
        for (px, sv, ours, who) in fronts.chain(servers) {
            let Some(row) = view.row(px, sv) else {
                diffs.push(format!("{px}/{sv}: no such row in shunt's show stat"));
                continue;
            };
            let (bin, bout) = (row.num("bin")?, row.num("bout")?);
            if (bin, bout) != (ours.bin, ours.bout) {
                diffs.push(format!(
                    "{px}/{sv}: shunt counted bin={bin} bout={bout}, {who} bin={} bout={}",
                    ours.bin, ours.bout
                ));
            }
        }
        Ok(diffs)
    }

    /// Polls shunt until its frontends hold no session and its counters agree with the
    /// demo's, or `SETTLE_LIMIT` passes; returns the last view and what still differs.
    fn settle(&self, cli: &Path) -> Result<(ShuntView, Vec<String>)> {
        let end = Instant::now() + SETTLE_LIMIT;
        loop {
            let view = ShuntView::query(cli)?;
            let mut diffs = self.mismatches(&view)?;
            let open = view.open_sessions()?;
            if open > 0 {
                diffs.push(format!(
                    "shunt still holds {open} session(s) on its frontends"
                ));
            }
            if diffs.is_empty() || Instant::now() >= end {
                return Ok((view, diffs));
            }
            std::thread::sleep(SETTLE_POLL);
        }
    }

    /// Prints shunt's counters and the cross-check with the demo's own counts (or, with
    /// no stats socket, the demo's counts alone); fails when shunt and the demo disagree.
    fn report(&self) -> Result<()> {
        let Some(cli) = &self.cli else {
            self.print_own_table();
            return Ok(());
        };
        let (view, diffs) = self.settle(cli)?;
        print_shunt(cli, &view);
        self.print_cross_check(&view)?;
        if !diffs.is_empty() {
            bail!(
                "shunt's counters disagree with the demo's {SETTLE_LIMIT:?} after the burst:\n  {}",
                diffs.join("\n  ")
            );
        }
        println!("xtask: shunt's bin/bout agree with the demo's own counts");
        Ok(())
    }

    /// shunt's bytes next to the demo's, row by row.
    fn print_cross_check(&self, view: &ShuntView) -> Result<()> {
        println!(
            "\n# cross-check: bytes counted by shunt vs by the demo \
             (client side for FRONTEND, the backends themselves for servers)"
        );
        println!(
            "{:<12} {:<10} {:>12} {:>12} {:>12} {:>12}  ok",
            "# pxname", "svname", "shunt bin", "demo bin", "shunt bout", "demo bout"
        );
        let fronts = self
            .frontend_counts()
            .into_iter()
            .map(|(px, s)| (px, "FRONTEND", s));
        for (px, sv, ours) in fronts.chain(self.server_counts()) {
            let (bin, bout) = match view.row(px, sv) {
                Some(r) => (r.num("bin")?.to_string(), r.num("bout")?.to_string()),
                None => ("-".into(), "-".into()),
            };
            let ok = bin == ours.bin.to_string() && bout == ours.bout.to_string();
            println!(
                "{px:<12} {sv:<10} {bin:>12} {:>12} {bout:>12} {:>12}  {}",
                ours.bin,
                ours.bout,
                if ok { "yes" } else { "NO" }
            );
        }
        Ok(())
    }

    /// A `show stat`-like table counted by the demo: pxname, svname, scur, stot, bin, bout.
    fn print_own_table(&self) {
        println!("\n# counted by xtask (client side for FRONTEND, by the backends for servers)");
        println!(
            "{:<12} {:<10} {:>5} {:>6} {:>12} {:>12}",
            "# pxname", "svname", "scur", "stot", "bin", "bout"
        );
        let row = |px: &str, sv: &str, s: Snapshot| {
            println!(
                "{px:<12} {sv:<10} {:>5} {:>6} {:>12} {:>12}",
                s.scur, s.stot, s.bin, s.bout
            );
        };
        for (name, sum) in self.frontend_counts() {
            row(name, "FRONTEND", sum);
        }
        for (name, list) in &self.layout.backends {
            let mut sum = Snapshot::default();
            for (sv, addr) in list {
                let s = self
                    .servers
                    .get(addr)
                    .map(|s| s.counters.snapshot())
                    .unwrap_or_default();
                sum = sum + s;
                row(name, sv, s);
            }
            row(name, "BACKEND", sum);
        }
    }
}

/// shunt's own table (`show stat` columns the demo cares about) and `show info` fields.
fn print_shunt(cli: &Path, view: &ShuntView) {
    println!("\n# shunt's counters: show stat on {}", cli.display());
    const COLS: [&str; 7] = ["scur", "smax", "stot", "bin", "bout", "status", "lbtot"];
    println!(
        "{:<12} {:<10} {:>5} {:>5} {:>6} {:>12} {:>12} {:>9} {:>6}",
        "# pxname", "svname", COLS[0], COLS[1], COLS[2], COLS[3], COLS[4], COLS[5], COLS[6]
    );
    for r in &view.rows {
        let c = COLS.map(|k| r.get(k));
        println!(
            "{:<12} {:<10} {:>5} {:>5} {:>6} {:>12} {:>12} {:>9} {:>6}",
            r.get("pxname"),
            r.get("svname"),
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            c[6]
        );
    }
    println!("# shunt's show info");
    let line = |names: &[&str]| {
        names
            .iter()
            .map(|n| format!("{n}: {}", view.info(n)))
            .collect::<Vec<_>>()
            .join("   ")
    };
    println!("{}", line(&INFO_FIELDS[..2]));
    println!("{}", line(&INFO_FIELDS[2..]));
    if view.info("Bpf") == "loaded" {
        println!("{}", line(&SOCKMAP_FIELDS));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_config_has_a_stats_socket() {
        let path = xtask::workspace_root().join(DEFAULT_CONFIG);
        let text = std::fs::read_to_string(&path).expect("examples/demo.cfg");
        let l = scan(&text);
        assert!(l.stats_socket.is_some(), "{}", path.display());
        assert!(!l.frontends.is_empty());
    }

    #[test]
    fn roles_follow_ports() {
        assert_eq!(
            role(&"127.0.0.1:10081".parse().expect("a")),
            Some(Kind::Echo)
        );
        assert_eq!(
            role(&"127.0.0.1:10091".parse().expect("a")),
            Some(Kind::Sink { report: false })
        );
        assert_eq!(role(&"127.0.0.1:9".parse().expect("a")), None);
        assert_eq!(role(&"10.0.0.1:10081".parse().expect("a")), None);
    }

    /// A demo wired by hand: one frontend `fe` on an unused address, one backend `be`
    /// with server `s1` = a sink started on port 0.
    fn tiny_demo() -> Demo {
        let sink = Backend::start(
            "127.0.0.1:0".parse().expect("a"),
            Kind::Sink { report: false },
        )
        .expect("sink");
        let text = format!(
            "frontend fe\n    bind 127.0.0.1:9\n    default_backend be\n\
             backend be\n    server s1 {}\n",
            sink.addr
        );
        let layout = scan(&text);
        let client = Arc::new(Counters::default());
        client.add_in(1000);
        let fronts = vec![Front {
            name: "fe".into(),
            addr: "127.0.0.1:9".parse().expect("a"),
            kind: Kind::Sink { report: false },
            client,
        }];
        let mut servers = BTreeMap::new();
        sink.counters.add_in(1000);
        servers.insert(sink.addr, sink);
        Demo {
            layout,
            fronts,
            servers,
            cli: None,
        }
    }

    fn view(fe_bin: u64, s1_bin: u64, fe_scur: u64) -> ShuntView {
        let csv = format!(
            "# pxname,svname,scur,bin,bout,\nfe,FRONTEND,{fe_scur},{fe_bin},0,\n\
             be,s1,0,{s1_bin},0,\nbe,BACKEND,0,{s1_bin},0,\n"
        );
        ShuntView {
            rows: testkit::parse_show_stat(&csv).expect("csv"),
            info: BTreeMap::new(),
        }
    }

    #[test]
    fn cross_check_agrees_and_catches_every_difference() {
        let demo = tiny_demo();
        assert_eq!(
            demo.mismatches(&view(1000, 1000, 0)).expect("ok"),
            Vec::<String>::new()
        );
        let d = demo.mismatches(&view(999, 1000, 0)).expect("ok");
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(
            d[0].starts_with("fe/FRONTEND: shunt counted bin=999"),
            "{d:?}"
        );
        let d = demo.mismatches(&view(1000, 0, 0)).expect("ok");
        assert!(d[0].starts_with("be/s1:"), "{d:?}");
        assert_eq!(view(1000, 1000, 2).open_sessions().expect("n"), 2);
        let mut missing = view(1000, 1000, 0);
        missing.rows.retain(|r| r.get("svname") != "FRONTEND");
        let d = demo.mismatches(&missing).expect("ok");
        assert!(d[0].contains("no such row"), "{d:?}");
    }
}
