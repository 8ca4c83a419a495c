//! `cargo xtask demo`: shunt in front of in-process backends, with live counters.
//!
//! Owns the demo's layout: echo servers on 127.0.0.1:10081 and :10082 and a sink on
//! 127.0.0.1:10091, started in this process; which frontends and backends lead to them
//! is read from the demo configuration (examples/demo.cfg) by a small scan of its
//! `frontend`/`backend`/`listen`, `bind`, `default_backend` and `server` lines.
//!
//! Counting: shunt has no stats socket yet, so the `show stat`-like table is counted
//! here — FRONTEND rows on the client side (what the demo sent and received through each
//! bind address), server rows by the backends themselves, BACKEND rows as the sum of
//! their servers. When shunt serves `show stat` on a stats socket, the demo can print
//! that instead.
//!
//! Invariants: the demo never leaves shunt running (SIGINT/SIGTERM stop it with SIGTERM
//! and exit 0); every echo is checked byte for byte and every sink push is checked
//! against the sink's own count; traffic goes only to 127.0.0.1.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use crate::proc::{self, ChildGuard};
use crate::servers::{self, Counters, Kind, Server, Snapshot};

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
/// How long shunt gets to accept on its bind addresses.
const START_LIMIT: Duration = Duration::from_secs(15);
/// Bound of one push or round trip.
const PUSH_LIMIT: Duration = Duration::from_secs(60);

/// What the demo configuration declares, as far as the demo needs it.
#[derive(Debug, Default, PartialEq)]
pub struct Layout {
    /// (name, bind ports, backend name)
    pub frontends: Vec<(String, Vec<u16>, Option<String>)>,
    /// (name, servers as (name, address))
    pub backends: Vec<(String, Vec<(String, SocketAddr)>)>,
}

/// Reads the sections of a HAProxy-style file that route traffic. Tolerant: lines the
/// demo does not need are ignored (shunt itself validates the file).
pub fn scan(text: &str) -> Layout {
    let mut layout = Layout::default();
    // Index into frontends / backends of the current section, if any.
    let mut fe: Option<usize> = None;
    let mut be: Option<usize> = None;
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(&kw) = words.first() else { continue };
        let arg = words.get(1).map(|s| s.trim_matches('"').to_string());
        match kw {
            "global" | "defaults" => {
                fe = None;
                be = None;
            }
            "frontend" | "backend" | "listen" => {
                let name = arg.unwrap_or_default();
                fe = None;
                be = None;
                if kw != "backend" {
                    let backend = (kw == "listen").then(|| name.clone());
                    layout.frontends.push((name.clone(), Vec::new(), backend));
                    fe = Some(layout.frontends.len() - 1);
                }
                if kw != "frontend" {
                    layout.backends.push((name, Vec::new()));
                    be = Some(layout.backends.len() - 1);
                }
            }
            "bind" => {
                if let (Some(i), Some(addrs)) = (fe, arg) {
                    let ports = addrs
                        .split(',')
                        .filter_map(|a| a.rsplit(':').next()?.parse::<u16>().ok());
                    layout.frontends[i].1.extend(ports);
                }
            }
            "default_backend" | "use_backend" => {
                if let (Some(i), Some(name)) = (fe, arg) {
                    if kw == "default_backend" || layout.frontends[i].2.is_none() {
                        layout.frontends[i].2 = Some(name);
                    }
                }
            }
            "server" => {
                let addr = words.get(2).and_then(|a| a.parse().ok());
                if let (Some(i), Some(name), Some(addr)) = (be, arg, addr) {
                    layout.backends[i].1.push((name, addr));
                }
            }
            _ => {}
        }
    }
    layout
}

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
    servers: BTreeMap<SocketAddr, Server>,
}

pub fn run(config: &Path, duration: Option<u64>, shunt: Option<PathBuf>) -> Result<()> {
    let config = resolve(config);
    let text = std::fs::read_to_string(&config)
        .with_context(|| format!("cannot read the demo configuration {}", config.display()))?;
    let demo = Demo::new(scan(&text))?;
    let bin = match shunt {
        Some(b) => b,
        None => crate::build_release()?,
    };
    proc::catch_stop_signals()?;
    let config_arg = config.to_string_lossy().into_owned();
    let log = crate::target_dir().join("xtask").join("demo-shunt.log");
    let mut shunt = ChildGuard::spawn("shunt", &bin, &["-f", &config_arg], &log, true)?;
    for f in &demo.fronts {
        shunt.wait_for_port(f.addr, START_LIMIT)?;
    }
    // The readiness probes were real connections; count them as the frontends saw them.
    for f in &demo.fronts {
        f.client.session();
    }
    println!("xtask: shunt (pid {}) is accepting", shunt.pid());

    demo.first_burst()?;
    demo.print_table();
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
        demo.tick(started.elapsed());
    }
    demo.print_table();
    let status = shunt.stop();
    println!(
        "xtask: shunt stopped{}",
        status.map(|s| format!(" ({s})")).unwrap_or_default()
    );
    Ok(())
}

fn resolve(config: &Path) -> PathBuf {
    if config.is_absolute() || config.exists() {
        return config.to_path_buf();
    }
    crate::workspace_root().join(config)
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
                let server = Server::start(*addr, kind).with_context(|| {
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
        Ok(Self {
            layout,
            fronts,
            servers,
        })
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
                        let payload = servers::pattern(size, i as u64);
                        let took = servers::echo_round_trip(f.addr, &payload, &f.client)?;
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

    fn push(&self, f: &Front, bytes: u64) -> Result<servers::Push> {
        servers::push_to_sink(
            f.addr,
            bytes,
            false,
            &f.client,
            Instant::now() + PUSH_LIMIT,
            &proc::stop_requested,
        )
    }

    /// One periodic round: a small echo and a 1 MiB push per frontend, then a status line.
    fn tick(&self, elapsed: Duration) {
        let mut parts = Vec::new();
        for f in &self.fronts {
            let result = match f.kind {
                Kind::Echo => {
                    let payload = servers::pattern(TICK_ECHO_BYTES, elapsed.as_secs());
                    servers::echo_round_trip(f.addr, &payload, &f.client)
                }
                Kind::Sink { .. } => self.push(f, TICK_SINK_BYTES).map(|p| p.elapsed),
            };
            let c = f.client.snapshot();
            parts.push(match result {
                Ok(took) => format!(
                    "{} ok {:.1}ms stot={} bin={}",
                    f.name,
                    took.as_secs_f64() * 1e3,
                    c.stot,
                    human(c.bin)
                ),
                Err(e) => format!("{} FAILED: {e:#}", f.name),
            });
        }
        println!("[{:>5}s] {}", elapsed.as_secs(), parts.join(" | "));
    }

    /// A `show stat`-like table: pxname, svname, scur, stot, bin, bout.
    fn print_table(&self) {
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
        for (name, _, _) in &self.layout.frontends {
            let sum = self
                .fronts
                .iter()
                .filter(|f| &f.name == name)
                .fold(Snapshot::default(), |acc, f| acc.add(f.client.snapshot()));
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
                sum = sum.add(s);
                row(name, sv, s);
            }
            row(name, "BACKEND", sum);
        }
    }
}

pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

pub fn gbits(bytes: u64, d: Duration) -> f64 {
    bytes as f64 * 8.0 / d.as_secs_f64().max(1e-9) / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
global
    nbthread 2   # comment
defaults
    mode tcp
frontend fe_echo
    bind 127.0.0.1:10080
    default_backend be_echo
backend be_echo
    balance roundrobin
    server e1 127.0.0.1:10081 weight 1
    server e2 127.0.0.1:10082
listen sink
    bind :10090,127.0.0.1:10095
    server s1 127.0.0.1:10091 maxconn 10
";

    #[test]
    fn scan_finds_routes_binds_and_servers() {
        let l = scan(SAMPLE);
        assert_eq!(
            l.frontends,
            vec![
                ("fe_echo".into(), vec![10080], Some("be_echo".into())),
                ("sink".into(), vec![10090, 10095], Some("sink".into())),
            ]
        );
        assert_eq!(l.backends.len(), 2);
        assert_eq!(l.backends[0].0, "be_echo");
        assert_eq!(
            l.backends[0].1,
            vec![
                ("e1".into(), "127.0.0.1:10081".parse().expect("addr")),
                ("e2".into(), "127.0.0.1:10082".parse().expect("addr")),
            ]
        );
        assert_eq!(l.backends[1].1[0].0, "s1");
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

    #[test]
    fn human_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(8 << 20), "8.0 MiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}
