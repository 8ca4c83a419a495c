//! The Prometheus exporter: `stats prometheus bind ADDR:PORT` serves `GET /metrics`
//! in the OpenMetrics text format (encoded by the `prometheus-client` crate).
//!
//! Owns the listener, the `shunt-metrics` thread that serves it, and the mapping
//! from shunt's counters to HAProxy's exporter names (`addons/promex`):
//! `haproxy_process_*`, `haproxy_frontend_*`, `haproxy_backend_*` and
//! `haproxy_server_*` for the fields shunt has, with the same labels (`proxy`,
//! `server`), plus shunt's own `shunt_*` (flows and bytes per forwarding mode, BPF
//! redirect errors, scheduler loop time per worker).
//!
//! Every scrape reads the same counters `show stat`/`show info` read, so the two
//! agree. Serving runs off the workers on its own thread: a slow scraper delays
//! only other scrapes. Bounds: [`MAX_REQUEST`] bytes of request head,
//! [`REQUEST_TIMEOUT`] to send it, [`MAX_SCRAPERS`] scrapes at once.

use std::net::TcpListener as StdListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::runtime::Runtime;

/// Largest request head read before answering (a scrape's is ~200 bytes).
pub const MAX_REQUEST: usize = 8192;
/// Time a scraper has to send its request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Scrapes served at once; more wait in the listen backlog.
pub const MAX_SCRAPERS: usize = 16;
/// OpenMetrics content type, as `prometheus-client` encodes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot start the metrics thread: {0}")]
    Thread(std::io::Error),
}

/// Serve scrapes on `l` from a thread of their own until the process exits.
pub fn serve(l: StdListener, state: Arc<Runtime>) -> Result<(), MetricsError> {
    std::thread::Builder::new()
        .name("shunt-metrics".to_string())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "metrics thread: cannot build its runtime");
                    return;
                }
            };
            rt.block_on(accept_loop(l, state));
        })
        .map(|_| ())
        .map_err(MetricsError::Thread)
}

async fn accept_loop(l: StdListener, state: Arc<Runtime>) {
    let l = match TcpListener::from_std(l) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot register the prometheus listener");
            return;
        }
    };
    let busy = Arc::new(AtomicUsize::new(0));
    loop {
        let Ok((sock, _)) = l.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if busy.load(Ordering::Relaxed) >= MAX_SCRAPERS {
            drop(sock);
            continue;
        }
        busy.fetch_add(1, Ordering::Relaxed);
        let (st, b) = (state.clone(), busy.clone());
        tokio::spawn(async move {
            if let Err(e) = scrape(sock, &st).await {
                tracing::debug!(error = %e, "prometheus scrape failed");
            }
            b.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Read one request head and answer it.
async fn scrape(mut sock: TcpStream, state: &Runtime) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
            let n = sock.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, read).await {
        Ok(r) => r?,
        Err(_) => return Ok(()),
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", CONTENT_TYPE, render(state).await),
        ("GET" | "HEAD", _) => ("404 Not Found", "text/plain", "Not Found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "Method Not Allowed\n".to_string(),
        ),
    };
    let mut resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        resp.extend_from_slice(body.as_bytes());
    }
    sock.write_all(&resp).await?;
    sock.shutdown().await
}

type Labels = Vec<(String, String)>;
/// One counter of a [`crate::stats::Snapshot`].
type Field = fn(&crate::stats::Snapshot) -> u64;

/// Families registered by name; counters take their value at registration.
struct Builder {
    reg: Registry,
}

impl Builder {
    fn gauges(&mut self, name: &str, help: &str, rows: Vec<(Labels, i64)>) {
        let fam = Family::<Labels, Gauge>::default();
        for (l, v) in rows {
            fam.get_or_create(&l).set(v);
        }
        self.reg.register(name, help, fam);
    }

    /// `name` without `_total` (the encoder appends it, as OpenMetrics wants).
    fn counters(&mut self, name: &str, help: &str, rows: Vec<(Labels, u64)>) {
        let fam = Family::<Labels, Counter>::default();
        for (l, v) in rows {
            fam.get_or_create(&l).inc_by(v);
        }
        self.reg.register(name, help, fam);
    }

    fn gauge(&mut self, name: &str, help: &str, v: i64) {
        self.gauges(name, help, vec![(Vec::new(), v)]);
    }

    fn counter(&mut self, name: &str, help: &str, v: u64) {
        self.counters(name, help, vec![(Vec::new(), v)]);
    }
}

fn i(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn px(name: &str) -> Labels {
    vec![("proxy".to_string(), name.to_string())]
}

fn sv(proxy: &str, server: &str) -> Labels {
    vec![
        ("proxy".to_string(), proxy.to_string()),
        ("server".to_string(), server.to_string()),
    ]
}

/// The whole exposition, from the counters as they are now.
pub async fn render(state: &Runtime) -> String {
    let mut b = Builder {
        reg: Registry::default(),
    };
    process_metrics(&mut b, state);
    proxy_metrics(&mut b, state);
    shunt_metrics(&mut b, state).await;
    let mut out = String::with_capacity(16 << 10);
    if encode(&mut out, &b.reg).is_err() {
        out.clear();
    }
    out
}

fn process_metrics(b: &mut Builder, st: &Runtime) {
    let started = st.facts.started();
    let start = started
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let uptime = st.facts.uptime_secs();
    let fe: Vec<_> = st.stats.frontends.iter().map(|c| c.snapshot()).collect();
    let cum_conns: u64 = fe.iter().map(|s| s.stot).sum();
    let bytes_out: u64 = fe.iter().map(|s| s.bout).sum();
    let stopping = st.lifecycle.stopping();
    let conns = st.admission.conns();
    b.gauge(
        "haproxy_process_nbthread",
        "Number of started threads.",
        i(st.facts.nbthread()),
    );
    b.gauge(
        "haproxy_process_uptime_seconds",
        "How long ago this worker process was started (seconds).",
        i64::try_from(uptime).unwrap_or(i64::MAX),
    );
    b.gauge(
        "haproxy_process_start_time_seconds",
        "Start time in seconds.",
        i64::try_from(start).unwrap_or(i64::MAX),
    );
    b.gauge(
        "haproxy_process_max_connections",
        "Maximum number of concurrent connections.",
        i(st.admission.limits().global()),
    );
    b.gauge(
        "haproxy_process_current_connections",
        "Number of active sessions.",
        i(conns),
    );
    b.counter(
        "haproxy_process_connections",
        "Total number of created sessions.",
        cum_conns,
    );
    b.gauge(
        "haproxy_process_max_pipes",
        "Configured maximum number of pipes.",
        i(st.config.global.maxpipes),
    );
    b.counter(
        "haproxy_process_pipes_used",
        "Number of pipes in used.",
        u64::try_from(st.forwarding.pipes.in_use()).unwrap_or(0),
    );
    b.gauge(
        "haproxy_process_stopping",
        "Non zero means stopping in progress.",
        i64::from(stopping),
    );
    b.gauge(
        "haproxy_process_jobs",
        "Number of active jobs (listeners, sessions, open devices).",
        i(conns),
    );
    b.counter(
        "haproxy_process_dropped_logs",
        "Total number of dropped logs.",
        st.log.dropped(),
    );
    b.counter(
        "haproxy_process_bytes_out",
        "Total number of bytes emitted by current worker process since started.",
        bytes_out,
    );
}

fn proxy_metrics(b: &mut Builder, st: &Runtime) {
    let cfg = &st.config;
    let fe: Vec<_> = cfg
        .frontends
        .iter()
        .zip(&st.stats.frontends)
        .enumerate()
        .map(|(fi, (f, c))| {
            let slim = match st.admission.limits().frontend(fi) {
                0 => st.admission.limits().global(),
                n => n,
            };
            (px(&f.name), c.snapshot(), slim)
        })
        .collect();
    let be: Vec<_> = cfg
        .backends
        .iter()
        .zip(&st.stats.backends)
        .map(|(p, c)| (px(&p.name), c.snapshot()))
        .collect();
    let mut srv = Vec::new();
    for (bi, p) in cfg.backends.iter().enumerate() {
        for (si, s) in p.servers.iter().enumerate() {
            if let Some(c) = st.stats.servers.get(bi).and_then(|v| v.get(si)) {
                srv.push((sv(&p.name, &s.name), c.snapshot()));
            }
        }
    }
    // Frontends.
    let f = |g: fn(&crate::stats::Snapshot) -> u64| -> Vec<(Labels, u64)> {
        fe.iter().map(|(l, s, _)| (l.clone(), g(s))).collect()
    };
    b.gauges(
        "haproxy_frontend_current_sessions",
        "Number of current sessions.",
        fe.iter().map(|(l, s, _)| (l.clone(), i(s.scur))).collect(),
    );
    b.gauges(
        "haproxy_frontend_max_sessions",
        "Maximum observed number of active sessions.",
        fe.iter().map(|(l, s, _)| (l.clone(), i(s.smax))).collect(),
    );
    b.gauges(
        "haproxy_frontend_limit_sessions",
        "Configured session limit.",
        fe.iter().map(|(l, _, m)| (l.clone(), i(*m))).collect(),
    );
    b.counters(
        "haproxy_frontend_sessions",
        "Total number of sessions.",
        f(|s| s.stot),
    );
    b.counters(
        "haproxy_frontend_bytes_in",
        "Current total of incoming bytes.",
        f(|s| s.bin),
    );
    b.counters(
        "haproxy_frontend_bytes_out",
        "Current total of outgoing bytes.",
        f(|s| s.bout),
    );
    b.counters(
        "haproxy_frontend_connections",
        "Total number of connections.",
        f(|s| s.stot),
    );
    b.counters(
        "haproxy_frontend_denied_connections",
        "Total number of requests denied by \"tcp-request connection\" rules.",
        f(|s| s.dcon),
    );
    // Backends and servers share the per-session field names.
    for (kind, rows) in [("backend", &be), ("server", &srv)] {
        let g = |get: fn(&crate::stats::Snapshot) -> u64| -> Vec<(Labels, u64)> {
            rows.iter().map(|(l, s)| (l.clone(), get(s))).collect()
        };
        b.gauges(
            &format!("haproxy_{kind}_current_sessions"),
            "Number of current sessions.",
            rows.iter().map(|(l, s)| (l.clone(), i(s.scur))).collect(),
        );
        b.gauges(
            &format!("haproxy_{kind}_max_sessions"),
            "Maximum observed number of active sessions.",
            rows.iter().map(|(l, s)| (l.clone(), i(s.smax))).collect(),
        );
        let counters: [(&str, &str, Field); 9] = [
            ("sessions", "Total number of sessions.", |s| s.stot),
            ("bytes_in", "Current total of incoming bytes.", |s| s.bin),
            ("bytes_out", "Current total of outgoing bytes.", |s| s.bout),
            (
                "connection_errors",
                "Total number of connection errors.",
                |s| s.econ,
            ),
            ("response_errors", "Total number of response errors.", |s| {
                s.eresp
            }),
            ("retry_warnings", "Total number of retry warnings.", |s| {
                s.wretr
            }),
            (
                "redispatch_warnings",
                "Total number of redispatch warnings.",
                |s| s.wredis,
            ),
            (
                "client_aborts",
                "Total number of data transfers aborted by the client.",
                |s| s.cli_abrt,
            ),
            (
                "server_aborts",
                "Total number of data transfers aborted by the server.",
                |s| s.srv_abrt,
            ),
        ];
        for (name, help, get) in counters {
            b.counters(&format!("haproxy_{kind}_{name}"), help, g(get));
        }
    }
}

async fn shunt_metrics(b: &mut Builder, st: &Runtime) {
    use crate::handoff::Mode;
    let mode_label = |m: Mode| vec![("mode".to_string(), m.name().to_string())];
    let modes = &st.stats.modes;
    b.counters(
        "shunt_flows",
        "Flows forwarded, per forwarding mode (counted when the flow ends).",
        Mode::ALL
            .iter()
            .map(|&m| (mode_label(m), modes.flows(m)))
            .collect(),
    );
    b.counters(
        "shunt_bytes",
        "Bytes forwarded both ways, per forwarding mode (counted when the flow ends).",
        Mode::ALL
            .iter()
            .map(|&m| (mode_label(m), modes.bytes(m)))
            .collect(),
    );
    b.counter(
        "shunt_promoted_flows",
        "Flows forward-mode auto promoted from userspace forwarding to the kernel.",
        modes.promoted(),
    );
    let k = crate::handoff::sockmap::KernelInfo::of(st.forwarding.kernel.as_deref());
    b.counter(
        "shunt_bpf_redirect_errors",
        "Segments the BPF verdict failed to redirect.",
        k.redirect_errors,
    );
    b.counter(
        "shunt_sockmap_fallbacks",
        "Flows not eligible for sockmap, forwarded with splice instead.",
        k.fallbacks,
    );
    b.gauge(
        "shunt_sockmap_flows",
        "Flows held in the kernel's SOCKHASH now (two sockets each).",
        i(k.sockhash_entries / 2),
    );
    // Warm spare pools, per server (`warm_*` of `show stat`).
    let mut warm: [Vec<(Labels, u64)>; 4] = Default::default();
    let mut idle = Vec::new();
    for (be, rt) in st.config.backends.iter().zip(&st.backends) {
        for (s, srv) in be.servers.iter().zip(&rt.servers) {
            let c = srv.pool.counters();
            for (v, n) in warm.iter_mut().zip([c.hit, c.miss, c.dead, c.purged]) {
                v.push((sv(&be.name, &s.name), n));
            }
            let spares: usize = srv.pool.idle_per_thr(st.facts.nbthread()).iter().sum();
            idle.push((sv(&be.name, &s.name), i(spares)));
        }
    }
    let [hit, miss, dead, purged] = warm;
    b.counters(
        "shunt_server_warm_hits",
        "New flows served on a warm spare connection.",
        hit,
    );
    b.counters(
        "shunt_server_warm_misses",
        "New flows that found no usable spare and connected afresh.",
        miss,
    );
    b.counters(
        "shunt_server_warm_dead",
        "Spares found closed or reset at take time and discarded.",
        dead,
    );
    b.counters(
        "shunt_server_warm_purged",
        "Spares closed by the purge (excess, age, server state).",
        purged,
    );
    b.gauges(
        "shunt_server_warm_idle_connections",
        "Warm spare connections held now.",
        idle,
    );
    let mut loop_us = Vec::new();
    let mut loops = Vec::new();
    for r in st.workers.remotes() {
        let label = vec![("thread".to_string(), r.thread_id().to_string())];
        let stats = tokio::time::timeout(Duration::from_secs(1), r.stats()).await;
        if let Ok(Some(s)) = stats {
            loop_us.push((label.clone(), i64::try_from(s.avg_loop_us()).unwrap_or(0)));
            loops.push((label, s.loops));
        }
    }
    b.gauges(
        "shunt_scheduler_loop_avg_microseconds",
        "Average awake time of one scheduler loop per worker (the latency a woken task waits at most).",
        loop_us,
    );
    b.counters(
        "shunt_scheduler_loops",
        "Scheduler loops run per worker.",
        loops,
    );
}
