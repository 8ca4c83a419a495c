//! The peers `cargo xtask bench` compares, and how each is configured and started.
//!
//! Owns: the peer list (direct, shunt in each forwarding mode, HAProxy plain and with
//! `option splice-auto`, nginx stream), the configuration text of each (one `listen` /
//! `server` block per backend route, every frontend on its own free loopback port), and
//! a `Running` peer: its frontend address per route and the guard of its process.
//!
//! Invariants: a peer's process is started through `proc::ChildGuard` (own process
//! group, pid logged), so it is stopped by pid when the `Running` value is dropped,
//! whatever path leaves the bench; every configuration is written under
//! `target/xtask/bench/`; proxies run one worker thread or process (`nbthread 1`,
//! `worker_processes 1` with `master_process off` so the pid measured is the one that
//! forwards), each on the proxy CPU of `cpus` (through `taskset`, which keeps the pid);
//! `direct` starts nothing and its frontends are the backends themselves.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use xtask::proc::ChildGuard;

/// How long a proxy gets to accept on every frontend.
const START_LIMIT: Duration = Duration::from_secs(20);
/// `maxconn` given to every proxy by default: the idle-flow scenario holds 10,000 flows
/// (two sockets each in the proxy) and must not hit a proxy's default limit first.
/// HAProxy refuses to start when 2 × maxconn exceeds the descriptors it may open, so the
/// bench lowers it to what `RLIMIT_NOFILE` allows (`Extras::maxconn`).
pub const PROXY_MAXCONN: u32 = 30_000;
/// `maxpipes` of shunt and HAProxy: bounds the descriptors splice pipes take (HAProxy
/// counts 2 per pipe into the descriptors it needs at start); the bench never has more
/// than a few flows splicing at once.
pub const PROXY_MAXPIPES: u32 = 256;
/// Where Debian's nginx keeps its stream module.
const NGINX_STREAM_MODULE: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";
/// Longest Unix socket path (sun_path is 108 bytes with its NUL; keep a margin).
pub(crate) const MAX_SOCK_PATH: usize = 100;

/// What kind of process a peer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Direct,
    /// shunt with `--forward-mode MODE`.
    Shunt(&'static str),
    Haproxy {
        splice: bool,
    },
    Nginx,
}

/// One column of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Short name used on the command line, in JSON and in file names.
    pub slug: &'static str,
    /// Name in tables and charts.
    pub label: &'static str,
    pub kind: Kind,
}

/// Every peer, in table order.
pub const ALL: [Peer; 8] = [
    Peer {
        slug: "direct",
        label: "direct",
        kind: Kind::Direct,
    },
    Peer {
        slug: "shunt-auto",
        label: "shunt auto",
        kind: Kind::Shunt("auto"),
    },
    Peer {
        slug: "shunt-sockmap",
        label: "shunt sockmap",
        kind: Kind::Shunt("sockmap"),
    },
    Peer {
        slug: "shunt-splice",
        label: "shunt splice",
        kind: Kind::Shunt("splice"),
    },
    Peer {
        slug: "shunt-copy",
        label: "shunt copy",
        kind: Kind::Shunt("copy"),
    },
    Peer {
        slug: "haproxy",
        label: "haproxy",
        kind: Kind::Haproxy { splice: false },
    },
    Peer {
        slug: "haproxy-splice",
        label: "haproxy splice",
        kind: Kind::Haproxy { splice: true },
    },
    Peer {
        slug: "nginx",
        label: "nginx",
        kind: Kind::Nginx,
    },
];

/// The peers named on the command line (all when none), in table order.
pub fn select(names: Option<&[String]>) -> Result<Vec<Peer>> {
    let Some(names) = names else {
        return Ok(ALL.to_vec());
    };
    for n in names {
        if !ALL.iter().any(|p| p.slug == n) {
            bail!(
                "unknown peer '{n}' (expected some of {})",
                ALL.iter().map(|p| p.slug).collect::<Vec<_>>().join(",")
            );
        }
    }
    Ok(ALL
        .iter()
        .filter(|p| names.iter().any(|n| n == p.slug))
        .copied()
        .collect())
}

/// Extra settings a scenario needs in a proxy's configuration.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// `tune.pipesize` (shunt and HAProxy only).
    pub pipesize: Option<u32>,
    /// A map file routing by source address (`use_backend %[src,map_ip(FILE)]`), for the
    /// CLI `add map` stream (shunt and HAProxy only).
    pub map_file: Option<PathBuf>,
    /// A stats socket at this path (shunt and HAProxy only).
    pub stats_socket: Option<PathBuf>,
    /// `maxconn` (nginx: `worker_connections`); None: `PROXY_MAXCONN`.
    pub maxconn: Option<u32>,
    /// Every frontend terminates TLS with this PEM file (chain and key): `bind ... ssl
    /// crt FILE` (shunt, HAProxy), `listen ... ssl` with `ssl_certificate(_key)` (nginx).
    pub tls_pem: Option<PathBuf>,
}

/// A peer that is running: where each route's frontend listens.
pub struct Running {
    pub peer: Peer,
    pub fronts: BTreeMap<String, SocketAddr>,
    pub stats_socket: Option<PathBuf>,
    guard: Option<ChildGuard>,
}

impl Running {
    /// The proxy's pid (None for `direct`).
    pub fn pid(&self) -> Option<u32> {
        self.guard.as_ref().map(ChildGuard::pid)
    }

    /// The frontend of a route.
    pub fn front(&self, route: &str) -> Result<SocketAddr> {
        self.fronts
            .get(route)
            .copied()
            .with_context(|| format!("{} has no frontend for {route}", self.peer.label))
    }

    /// Errors (quoting the log) if the proxy has died.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.guard.as_mut() {
            Some(g) => g.check_alive(),
            None => Ok(()),
        }
    }

    /// Stops the proxy now (SIGTERM, then SIGKILL), by its pid.
    pub fn stop(&mut self) {
        if let Some(mut g) = self.guard.take() {
            g.stop();
        }
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> Result<u16> {
    shunt_testkit::free_port().context("cannot bind a free port")
}

/// Starts `peer` with one frontend per route (`routes`: name → backend address), in
/// `dir`; `tag` tells this instance's files apart from other instances of the peer.
pub fn start(
    peer: Peer,
    routes: &BTreeMap<String, SocketAddr>,
    extras: &Extras,
    shunt: &Path,
    dir: &Path,
    tag: &str,
) -> Result<Running> {
    if peer.kind == Kind::Direct {
        return Ok(Running {
            peer,
            fronts: routes.clone(),
            stats_socket: None,
            guard: None,
        });
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut fronts = BTreeMap::new();
    for name in routes.keys() {
        fronts.insert(
            name.clone(),
            SocketAddr::from(([127, 0, 0, 1], free_port()?)),
        );
    }
    let base = format!("{}-{tag}", peer.slug);
    let log = dir.join(format!("{base}.log"));
    let cfg_path = dir.join(format!("{base}.cfg"));
    let stats_socket = extras.stats_socket.clone();
    let (program, args, text): (PathBuf, Vec<String>, String) = match peer.kind {
        Kind::Direct => unreachable!("handled above"),
        Kind::Shunt(mode) => (
            shunt.to_path_buf(),
            vec![
                "-f".into(),
                cfg_path.display().to_string(),
                "--forward-mode".into(),
                mode.into(),
            ],
            proxy_config(routes, &fronts, false, extras),
        ),
        Kind::Haproxy { splice } => (
            "haproxy".into(),
            vec!["-db".into(), "-f".into(), cfg_path.display().to_string()],
            proxy_config(routes, &fronts, splice, extras),
        ),
        Kind::Nginx => (
            "nginx".into(),
            vec![
                "-c".into(),
                cfg_path.display().to_string(),
                "-e".into(),
                dir.join(format!("{base}-error.log")).display().to_string(),
                "-g".into(),
                "daemon off;".into(),
            ],
            nginx_config(routes, &fronts, dir, &base, extras),
        ),
    };
    std::fs::write(&cfg_path, text)
        .with_context(|| format!("cannot write {}", cfg_path.display()))?;
    let (program, args) = crate::cpus::proxy_command(&program, &args);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut guard = ChildGuard::spawn(peer.label, &program, &args, &log, true)?;
    for addr in fronts.values() {
        guard.wait_for_port(*addr, START_LIMIT)?;
    }
    if let Some(sock) = &stats_socket {
        guard.wait_for_stats(sock, START_LIMIT)?;
    }
    Ok(Running {
        peer,
        fronts,
        stats_socket,
        guard: Some(guard),
    })
}

/// A stats socket path under `dir`, or under the temporary directory when that path is
/// too long for a Unix socket.
pub fn socket_path(dir: &Path, name: &str) -> PathBuf {
    let near = dir.join(name);
    if near.as_os_str().len() <= MAX_SOCK_PATH {
        near
    } else {
        std::env::temp_dir().join(format!("shunt-{}-{name}", std::process::id()))
    }
}

/// shunt's and HAProxy's configuration (the same text: shunt reads HAProxy's syntax).
pub fn proxy_config(
    routes: &BTreeMap<String, SocketAddr>,
    fronts: &BTreeMap<String, SocketAddr>,
    splice: bool,
    extras: &Extras,
) -> String {
    let maxconn = extras.maxconn.unwrap_or(PROXY_MAXCONN);
    let mut c = format!(
        "# generated by `cargo xtask bench`\nglobal\n    nbthread 1\n    maxconn {maxconn}\n    \
         maxpipes {PROXY_MAXPIPES}\n"
    );
    if let Some(p) = extras.pipesize {
        c.push_str(&format!("    tune.pipesize {p}\n"));
    }
    if let Some(s) = &extras.stats_socket {
        c.push_str(&format!(
            "    stats socket {} mode 600 level admin\n",
            s.display()
        ));
    }
    c.push_str(&format!(
        "\ndefaults\n    mode tcp\n    maxconn {maxconn}\n    timeout connect 5s\n    \
         timeout client 300s\n    timeout server 300s\n"
    ));
    for (name, back) in routes {
        let Some(front) = fronts.get(name) else {
            continue;
        };
        let ssl = extras
            .tls_pem
            .as_ref()
            .map_or(String::new(), |p| format!(" ssl crt {}", p.display()));
        c.push_str(&format!("\nlisten {name}\n    bind {front}{ssl}\n"));
        if splice {
            c.push_str("    option splice-auto\n");
        }
        if let Some(map) = &extras.map_file {
            c.push_str(&format!(
                "    use_backend %[src,map_ip({})]\n",
                map.display()
            ));
        }
        c.push_str(&format!("    server s {back}\n"));
    }
    if extras.map_file.is_some() {
        // The map's value names a backend; one that exists keeps both parsers happy.
        c.push_str("\nbackend be\n    server s 127.0.0.1:9\n");
    }
    c
}

/// nginx's configuration: the stream module, one worker in the foreground process (so
/// the pid we hold is the one forwarding), pid and logs under `dir`.
pub fn nginx_config(
    routes: &BTreeMap<String, SocketAddr>,
    fronts: &BTreeMap<String, SocketAddr>,
    dir: &Path,
    base: &str,
    extras: &Extras,
) -> String {
    let maxconn = extras.maxconn.unwrap_or(PROXY_MAXCONN);
    let mut c = format!(
        "# generated by `cargo xtask bench`\nload_module {NGINX_STREAM_MODULE};\n\
         worker_processes 1;\nmaster_process off;\npid {};\nerror_log {} warn;\n\
         worker_rlimit_nofile {};\nevents {{\n    worker_connections {};\n}}\nstream {{\n",
        dir.join(format!("{base}.pid")).display(),
        dir.join(format!("{base}-error.log")).display(),
        2 * maxconn + 100,
        // nginx counts both connections of a proxied stream in worker_connections.
        2 * maxconn + 100,
    );
    for (name, back) in routes {
        let Some(front) = fronts.get(name) else {
            continue;
        };
        let (ssl, certs) = match &extras.tls_pem {
            Some(p) => (
                " ssl",
                // The close_notify of a client that is done writing must reach the
                // server as a FIN, not end the session (the TLS push waits for the
                // sink's count).
                format!(
                    "        ssl_certificate {0};\n        ssl_certificate_key {0};\n        \
                     proxy_half_close on;\n",
                    p.display()
                ),
            ),
            None => ("", String::new()),
        };
        c.push_str(&format!(
            "    # {name}\n    server {{\n        listen {front}{ssl};\n{certs}        proxy_pass {back};\n        \
             proxy_connect_timeout 5s;\n        proxy_timeout 300s;\n    }}\n"
        ));
    }
    c.push_str("}\n");
    c
}

/// The version line of each tool, for the report (`-` when absent).
pub fn versions(shunt: &Path) -> BTreeMap<String, String> {
    let first = |program: &str, args: &[&str]| -> String {
        let out = std::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output();
        match out {
            Ok(o) => {
                let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
                text.push_str(&String::from_utf8_lossy(&o.stderr));
                text.lines().next().unwrap_or("-").trim().to_string()
            }
            Err(_) => "-".to_string(),
        }
    };
    let mut v = BTreeMap::new();
    v.insert(
        "shunt".to_string(),
        first(&shunt.display().to_string(), &["--version"]),
    );
    v.insert("haproxy".to_string(), first("haproxy", &["-v"]));
    v.insert("nginx".to_string(), first("nginx", &["-v"]));
    v.insert("redis".to_string(), first("redis-server", &["--version"]));
    v.insert("iperf3".to_string(), first("iperf3", &["--version"]));
    v.insert("kernel".to_string(), first("uname", &["-r"]));
    v
}

/// Whether every program the peers and load tools need is on PATH.
pub fn tools_present(peers: &[Peer]) -> bool {
    let mut need = vec!["iperf3", "redis-server", "redis-benchmark"];
    if peers.iter().any(|p| matches!(p.kind, Kind::Haproxy { .. })) {
        need.push("haproxy");
    }
    if peers.iter().any(|p| p.kind == Kind::Nginx) {
        need.push("nginx");
    }
    let nginx_module = !need.contains(&"nginx") || Path::new(NGINX_STREAM_MODULE).exists();
    nginx_module && need.iter().all(|p| which(p))
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(program).is_file()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> (BTreeMap<String, SocketAddr>, BTreeMap<String, SocketAddr>) {
        let mut r = BTreeMap::new();
        r.insert("echo".to_string(), "127.0.0.1:5001".parse().expect("a"));
        r.insert("iperf".to_string(), "127.0.0.1:5002".parse().expect("a"));
        let mut f = BTreeMap::new();
        f.insert("echo".to_string(), "127.0.0.1:6001".parse().expect("a"));
        f.insert("iperf".to_string(), "127.0.0.1:6002".parse().expect("a"));
        (r, f)
    }

    #[test]
    fn proxy_config_has_one_listen_per_route() {
        let (r, f) = routes();
        let extras = Extras {
            pipesize: Some(8192),
            ..Extras::default()
        };
        let cfg = proxy_config(&r, &f, true, &extras);
        let layout = xtask::layout::scan(&cfg);
        assert_eq!(layout.frontends.len(), 2, "{cfg}");
        assert!(cfg.contains("listen echo\n    bind 127.0.0.1:6001\n    option splice-auto\n"));
        assert!(cfg.contains("    server s 127.0.0.1:5002\n"));
        assert!(cfg.contains("    tune.pipesize 8192\n"));
        assert!(cfg.contains(&format!("    maxconn {PROXY_MAXCONN}\n")));
        let plain = proxy_config(&r, &f, false, &Extras::default());
        assert!(!plain.contains("splice") && !plain.contains("pipesize"));
    }

    #[test]
    fn nginx_config_loads_the_stream_module_and_stays_in_one_process() {
        let (r, f) = routes();
        let extras = Extras {
            maxconn: Some(900),
            ..Extras::default()
        };
        let cfg = nginx_config(&r, &f, Path::new("/t"), "nginx-x", &extras);
        assert!(cfg.starts_with("# generated"));
        assert!(cfg.contains(&format!("load_module {NGINX_STREAM_MODULE};")));
        assert!(cfg.contains("master_process off;"));
        assert!(cfg.contains("pid /t/nginx-x.pid;"));
        assert!(cfg.contains("listen 127.0.0.1:6001;\n        proxy_pass 127.0.0.1:5001;"));
        assert_eq!(cfg.matches("server {").count(), 2);
        assert!(cfg.contains("worker_connections 1900;"));
    }

    #[test]
    fn tls_frontends_terminate_with_the_pem_in_every_proxy() {
        let (r, f) = routes();
        let extras = Extras {
            tls_pem: Some(PathBuf::from("/t/c.pem")),
            ..Extras::default()
        };
        let cfg = proxy_config(&r, &f, false, &extras);
        assert!(
            cfg.contains("    bind 127.0.0.1:6001 ssl crt /t/c.pem\n"),
            "{cfg}"
        );
        assert_eq!(cfg.matches(" ssl crt ").count(), 2);
        let ng = nginx_config(&r, &f, Path::new("/t"), "nginx-x", &extras);
        assert!(ng.contains("listen 127.0.0.1:6001 ssl;\n        ssl_certificate /t/c.pem;\n        ssl_certificate_key /t/c.pem;\n        proxy_half_close on;\n"), "{ng}");
        let plain = nginx_config(&r, &f, Path::new("/t"), "nginx-x", &Extras::default());
        assert!(!plain.contains("ssl"));
    }

    #[test]
    fn peer_selection_keeps_table_order_and_rejects_unknown_names() {
        let all = select(None).expect("all");
        assert_eq!(all.len(), ALL.len());
        let some = select(Some(&["nginx".into(), "direct".into()])).expect("some");
        assert_eq!(
            some.iter().map(|p| p.slug).collect::<Vec<_>>(),
            ["direct", "nginx"]
        );
        assert!(select(Some(&["envoy".into()])).is_err());
    }
}
