//! The report of `cargo xtask bench`: summary statistics, BENCHMARKS.md, the raw JSON
//! and one PNG chart per scenario.
//!
//! Owns: what each scenario and metric is called and which direction is better, the
//! reduction of samples to median and min–max per (scenario, metric, peer), quantiles
//! by nearest rank (`quantile`, for the latency tables of every scenario), the ratios
//! to `direct` and to `haproxy` (plain), and the three outputs: `BENCHMARKS.md` in the
//! output directory, `docs/bench/results.json` (every sample, every summary row, the
//! machine and tool versions, the notes and failures) and `docs/bench/SCENARIO.png`.
//!
//! Charts use plotters' bitmap backend with text from a TrueType font read at run time
//! (DejaVu Sans, Debian's `fonts-dejavu-core`); without it the charts are skipped with a
//! note, never the tables. Invariant: nothing here measures or starts anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use serde_json::json;

use crate::peers;

/// Where charts look for a font (the first that exists is used).
const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];
/// Chart size in pixels (width; height grows with the rows).
const CHART_WIDTH: u32 = 900;
const CHART_ROW_PX: u32 = 34;
const CHART_EXTRA_PX: u32 = 110;

/// One measured value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub scenario: String,
    pub metric: String,
    pub peer: String,
    pub round: usize,
    pub value: f64,
}

/// The machine and the run.
#[derive(Debug, Clone)]
pub struct Meta {
    pub date: String,
    pub versions: BTreeMap<String, String>,
    pub cpus: usize,
    /// How the CPUs were shared between proxies and load (`cpus::describe`).
    pub layout: String,
    pub quick: bool,
    pub rounds: usize,
    pub seconds: f64,
    pub plan: String,
}

/// What a metric is.
#[derive(Debug, Clone, Copy)]
pub struct MetricInfo {
    pub scenario: &'static str,
    pub metric: &'static str,
    pub label: &'static str,
    pub higher_is_better: bool,
}

const fn m(
    scenario: &'static str,
    metric: &'static str,
    label: &'static str,
    higher_is_better: bool,
) -> MetricInfo {
    MetricInfo {
        scenario,
        metric,
        label,
        higher_is_better,
    }
}

/// Every metric in table order; the first of a scenario is the one charted (the cork
/// probe charts all of its sizes).
pub const METRICS: [MetricInfo; 37] = [
    m("bulk-1", "gbit_s", "Gbit/s", true),
    m("bulk-1", "proxy_cpu_s_per_gb", "proxy CPU s/GB", false),
    m("bulk-1", "host_cpu_s_per_gb", "host CPU s/GB", false),
    m("bulk-4", "gbit_s", "Gbit/s", true),
    m("bulk-4", "proxy_cpu_s_per_gb", "proxy CPU s/GB", false),
    m("bulk-4", "host_cpu_s_per_gb", "host CPU s/GB", false),
    m("rr-1", "per_s", "requests/s", true),
    m("rr-1", "p50_ms", "p50 ms", false),
    m("rr-1", "p99_ms", "p99 ms", false),
    m("rr-1", "proxy_cpu_us_per_op", "proxy CPU µs/request", false),
    m("rr-50", "per_s", "requests/s", true),
    m("rr-50", "p50_ms", "p50 ms", false),
    m("rr-50", "p99_ms", "p99 ms", false),
    m(
        "rr-50",
        "proxy_cpu_us_per_op",
        "proxy CPU µs/request",
        false,
    ),
    m("connect", "per_s", "connections/s", true),
    m("connect", "p50_ms", "p50 ms", false),
    m("connect", "p99_ms", "p99 ms", false),
    m(
        "connect",
        "proxy_cpu_us_per_op",
        "proxy CPU µs/connection",
        false,
    ),
    m("rr-64k", "p50_us", "p50 µs", false),
    m("rr-64k", "p99_us", "p99 µs", false),
    m("rr-64k", "per_s", "round trips/s", true),
    m(
        "rr-64k",
        "proxy_cpu_us_per_op",
        "proxy CPU µs/round trip",
        false,
    ),
    m("idle", "rss_mib", "RSS MiB", false),
    m("idle", "kib_per_flow", "KiB per flow", false),
    m("cork", "max_ms_7000", "7000 B max ms", false),
    m("cork", "max_ms_7372", "7372 B max ms", false),
    m("cork", "max_ms_8192", "8192 B max ms", false),
    m("cork", "max_ms_12000", "12000 B max ms", false),
    m("cork", "max_ms_16384", "16384 B max ms", false),
    m("cli", "seconds", "seconds", false),
    m("cli", "adds_per_s", "adds/s", true),
    m("tls", "handshakes_per_s", "handshakes/s", true),
    m("tls", "hs_p50_ms", "handshake p50 ms", false),
    m("tls", "hs_p99_ms", "handshake p99 ms", false),
    m(
        "tls",
        "proxy_cpu_ms_per_hs",
        "proxy CPU ms/handshake",
        false,
    ),
    m("tls", "gbit_s", "bulk Gbit/s", true),
    m("tls", "proxy_cpu_s_per_gb", "proxy CPU s/GB", false),
];

/// The metric every shared and TLS sample carries besides its own: the hypervisor's
/// steal during it, in percent (not in METRICS: not a figure of the peer's; the targets
/// section shows it).
pub const STEAL: &str = "steal_pct";

/// Title and one-line description of each scenario.
pub fn scenario_text(s: &str) -> (&'static str, &'static str) {
    match s {
        "bulk-1" => ("Bulk throughput, 1 stream", "iperf3 -P 1 through the peer to an iperf3 server; CPU per GB: the proxy process's utime+stime (/proc/PID/stat) and the whole machine's busy time (/proc/stat: every process, kworkers, softirq) over the run, divided by the GB the receiver counted."),
        "bulk-4" => ("Bulk throughput, 4 streams", "iperf3 -P 4, otherwise as above."),
        "rr-1" => ("Small request/response, 1 client", "redis-benchmark -t ping_inline -c 1 against redis-server (keep-alive); proxy CPU: the proxy process's utime+stime over the run per request (a sockmap flow's kernel work done in kworkers is not in it)."),
        "rr-50" => ("Small request/response, 50 clients", "redis-benchmark -t ping_inline -c 50 (keep-alive)."),
        "connect" => ("New connections", "redis-benchmark -t ping_inline -k 0 -c 4: one TCP connection per request."),
        "rr-64k" => ("64 KiB request/response", "64 KiB written, 64 KiB echoed back, over one connection; every echo checked byte for byte."),
        "idle" => ("Memory at idle flows", "VmRSS of the proxy process holding N idle flows to a server that accepts and never reads (a fresh proxy per measurement; kernel socket memory is not in RSS)."),
        "cork" => ("Splice cork probe", "tune.pipesize 8192; messages of each size echoed one at a time; the slowest round trip per size (a message stuck in a pipe shows as a ~200 ms stall). direct is the floor."),
        "cli" => ("CLI add map stream", "`prompt` then N `add map FILE 10.x.y.z be` lines through one stats-socket connection; time until every command is answered."),
        "tls" => ("TLS termination", "`bind ... ssl crt` (ECDSA P-256) in front of an echo and a sink: full TLS 1.3 handshakes from 4 client threads (connect, handshake, 16-byte echo, close; resumption off) and one TLS connection pushing the bulk to a sink that reports its byte count; proxy CPU is the process's utime+stime over each part."),
        _ => ("?", ""),
    }
}

/// Median and range of one (scenario, metric, peer).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub scenario: String,
    pub metric: String,
    pub peer: String,
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// median / direct's median.
    pub vs_direct: Option<f64>,
    /// median / haproxy's median.
    pub vs_haproxy: Option<f64>,
}

/// The value at quantile `q` of `sorted` (nearest rank); the default (0) when empty.
pub fn quantile<T: Copy + Default>(sorted: &[T], q: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The median of values (mean of the middle two for an even count).
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// Summary rows, in METRICS order then peer order.
pub fn summarize(samples: &[Sample]) -> Vec<Summary> {
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for info in METRICS {
        if !seen.insert((info.scenario, info.metric)) {
            continue;
        }
        let values = |peer: &str| -> Vec<f64> {
            samples
                .iter()
                .filter(|s| {
                    s.scenario == info.scenario && s.metric == info.metric && s.peer == peer
                })
                .map(|s| s.value)
                .collect()
        };
        let direct = median(&values("direct"));
        let haproxy = median(&values("haproxy"));
        for p in peers::ALL {
            let v = values(p.slug);
            let Some(med) = median(&v) else { continue };
            let ratio = |base: Option<f64>| base.filter(|b| *b > 0.0).map(|b| med / b);
            out.push(Summary {
                scenario: info.scenario.to_string(),
                metric: info.metric.to_string(),
                peer: p.slug.to_string(),
                n: v.len(),
                median: med,
                min: v.iter().copied().fold(f64::INFINITY, f64::min),
                max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                vs_direct: ratio(direct),
                vs_haproxy: ratio(haproxy),
            });
        }
    }
    out
}

/// A figure with 3 significant digits or so.
pub fn fmt(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn ratio_cell(r: Option<f64>) -> String {
    r.map_or("–".to_string(), |r| format!("{r:.2}×"))
}

fn label_of(slug: &str) -> &'static str {
    peers::ALL
        .iter()
        .find(|p| p.slug == slug)
        .map_or("?", |p| p.label)
}

/// The Markdown report.
pub fn markdown(
    meta: &Meta,
    rows: &[Summary],
    targets: &str,
    notes: &[String],
    failures: &[String],
    charts: &[(String, String)],
) -> String {
    let v = |k: &str| meta.versions.get(k).cloned().unwrap_or_else(|| "-".into());
    let mut md = String::from("# Benchmarks\n\n");
    md.push_str(&format!(
        "Generated by `cargo xtask bench{}` on {} ({} CPUs, Linux {}), {} round(s) per \
         scenario, interleaved (each round measures every peer once, in rotated order), \
         {:.0} s in all. Every peer forwards on 127.0.0.1 with one worker thread or process; \
         {}.\n\n",
        if meta.quick { " --quick" } else { "" },
        meta.date,
        meta.cpus,
        v("kernel"),
        meta.rounds,
        meta.seconds,
        meta.layout
    ));
    if meta.quick {
        md.push_str("**Quick run**: fewer and shorter measurements than the full set; figures are indicative only.\n\n");
    }
    md.push_str(&format!(
        "Versions: {}; {}; {}; {}; {}.\n\n",
        v("shunt"),
        v("haproxy"),
        v("nginx"),
        v("redis"),
        v("iperf3")
    ));
    md.push_str(
        "Cells are the median (min–max) over the rounds; ×direct and ×haproxy are the \
         median divided by direct's and by plain HAProxy's median (so above 1 is better for \
         rates and worse for times, CPU and memory). Raw samples: \
         [docs/bench/results.json](docs/bench/results.json).\n",
    );
    md.push_str(targets);
    let mut scenarios: Vec<&str> = Vec::new();
    for r in rows {
        if !scenarios.contains(&r.scenario.as_str()) {
            scenarios.push(&r.scenario);
        }
    }
    for s in scenarios {
        let (title, text) = scenario_text(s);
        md.push_str(&format!("\n## {title} (`{s}`)\n\n{text}\n\n"));
        let mut metrics: Vec<MetricInfo> = Vec::new();
        for info in METRICS.iter().filter(|i| i.scenario == s) {
            if rows
                .iter()
                .any(|r| r.scenario == s && r.metric == info.metric)
                && !metrics.iter().any(|m| m.metric == info.metric)
            {
                metrics.push(*info);
            }
        }
        md.push_str("| peer |");
        for info in &metrics {
            let arrow = if info.higher_is_better { "↑" } else { "↓" };
            md.push_str(&format!(" {} {arrow} | ×direct | ×haproxy |", info.label));
        }
        md.push_str("\n|---|");
        for _ in &metrics {
            md.push_str("---:|---:|---:|");
        }
        md.push('\n');
        for p in peers::ALL {
            if !rows.iter().any(|r| r.scenario == s && r.peer == p.slug) {
                continue;
            }
            md.push_str(&format!("| {} |", p.label));
            for info in &metrics {
                match rows
                    .iter()
                    .find(|r| r.scenario == s && r.metric == info.metric && r.peer == p.slug)
                {
                    Some(r) => md.push_str(&format!(
                        " {} ({}–{}) | {} | {} |",
                        fmt(r.median),
                        fmt(r.min),
                        fmt(r.max),
                        ratio_cell(r.vs_direct),
                        ratio_cell(r.vs_haproxy)
                    )),
                    None => md.push_str(" – | – | – |"),
                }
            }
            md.push('\n');
        }
        if let Some((_, file)) = charts.iter().find(|(sc, _)| sc == s) {
            md.push_str(&format!("\n![{title}](docs/bench/{file})\n"));
        }
    }
    if !notes.is_empty() {
        md.push_str("\n## Notes\n\n");
        for n in notes {
            md.push_str(&format!("- {n}\n"));
        }
    }
    if !failures.is_empty() {
        md.push_str("\n## Failed measurements\n\n");
        for f in failures {
            md.push_str(&format!("- {f}\n"));
        }
    }
    md.push_str(&format!("\nPlan: `{}`\n", meta.plan));
    md
}

/// The line in BENCHMARKS.md below which the text is people's, not the bench's: a
/// run keeps it (and everything after it) as it was.
pub const HAND_WRITTEN: &str = "<!-- Hand-written from here on: `cargo xtask bench` keeps it. -->";

/// Writes BENCHMARKS.md into `out`, results.json and the charts into `out/docs/bench`;
/// the hand-written part of an existing BENCHMARKS.md (from [`HAND_WRITTEN`]) is kept.
pub fn write(
    out: &Path,
    meta: &Meta,
    samples: &[Sample],
    notes: &[String],
    failures: &[String],
) -> Result<Vec<PathBuf>> {
    let docs = out.join("docs").join("bench");
    std::fs::create_dir_all(&docs).with_context(|| format!("cannot create {}", docs.display()))?;
    let rows = summarize(samples);
    let mut notes = notes.to_vec();
    let mut written = Vec::new();
    let mut charts = Vec::new();
    match load_font() {
        Some(()) => {
            let mut scenarios: Vec<&str> = rows.iter().map(|r| r.scenario.as_str()).collect();
            scenarios.dedup();
            for s in scenarios {
                let file = format!("{s}.png");
                let path = docs.join(&file);
                match chart(&path, s, &rows) {
                    Ok(()) => {
                        written.push(path);
                        charts.push((s.to_string(), file));
                    }
                    Err(e) => notes.push(format!("chart {s}: not drawn: {e:#}")),
                }
            }
        }
        None => notes.push(format!(
            "charts not drawn: no TrueType font at {} (install fonts-dejavu-core)",
            FONT_PATHS.join(" or ")
        )),
    }
    let json = json!({
        "date": meta.date,
        "quick": meta.quick,
        "rounds": meta.rounds,
        "cpus": meta.cpus,
        "cpu_layout": meta.layout,
        "seconds": meta.seconds,
        "versions": meta.versions,
        "plan": meta.plan,
        "notes": notes,
        "failures": failures,
        "summary": rows.iter().map(|r| json!({
            "scenario": r.scenario, "metric": r.metric, "peer": r.peer, "n": r.n,
            "median": r.median, "min": r.min, "max": r.max,
            "vs_direct": r.vs_direct, "vs_haproxy": r.vs_haproxy,
        })).collect::<Vec<_>>(),
        "samples": samples.iter().map(|s| json!({
            "scenario": s.scenario, "metric": s.metric, "peer": s.peer,
            "round": s.round + 1, "value": s.value,
        })).collect::<Vec<_>>(),
    });
    let json_path = docs.join("results.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    written.push(json_path);
    let md_path = out.join("BENCHMARKS.md");
    let targets = crate::targets::markdown(samples);
    let mut md = markdown(meta, &rows, &targets, &notes, failures, &charts);
    // What people wrote below the marker in the previous file stays.
    let before = std::fs::read_to_string(&md_path).unwrap_or_default();
    if let Some(at) = before.find(HAND_WRITTEN) {
        md.push('\n');
        md.push_str(&before[at..]);
    }
    std::fs::write(&md_path, md).with_context(|| format!("cannot write {}", md_path.display()))?;
    written.push(md_path);
    Ok(written)
}

/// Registers the first font of FONT_PATHS as plotters' "sans-serif".
fn load_font() -> Option<()> {
    static LOADED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *LOADED.get_or_init(|| {
        FONT_PATHS.iter().any(|p| {
            let Ok(bytes) = std::fs::read(p) else {
                return false;
            };
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
        })
    });
    ok.then_some(())
}

/// The colour of a peer's bars: shunt in blues, HAProxy in oranges, nginx green,
/// direct grey.
fn colour(slug: &str) -> RGBColor {
    match slug {
        "direct" => RGBColor(150, 150, 150),
        "shunt-sockmap" => RGBColor(31, 87, 180),
        "shunt-splice" => RGBColor(70, 130, 220),
        "shunt-copy" => RGBColor(130, 175, 235),
        "haproxy" => RGBColor(230, 120, 30),
        "haproxy-splice" => RGBColor(245, 170, 90),
        "nginx" => RGBColor(40, 150, 70),
        _ => RGBColor(0, 0, 0),
    }
}

/// One horizontal bar per (metric, peer) with its min–max range as a line: the first
/// metric of the scenario, or every size of the cork probe.
fn chart(path: &Path, scenario: &str, rows: &[Summary]) -> Result<()> {
    let metrics: Vec<MetricInfo> = if scenario == "cork" {
        METRICS
            .iter()
            .filter(|m| m.scenario == "cork")
            .copied()
            .collect()
    } else {
        METRICS
            .iter()
            .filter(|m| m.scenario == scenario)
            .take(1)
            .copied()
            .collect()
    };
    let mut bars: Vec<(String, &Summary)> = Vec::new();
    for info in &metrics {
        for r in rows
            .iter()
            .filter(|r| r.scenario == scenario && r.metric == info.metric)
        {
            let label = if metrics.len() > 1 {
                format!(
                    "{} {}",
                    info.label.split(' ').next().unwrap_or(""),
                    label_of(&r.peer)
                )
            } else {
                label_of(&r.peer).to_string()
            };
            bars.push((label, r));
        }
    }
    anyhow::ensure!(!bars.is_empty(), "no data");
    let (title, _) = scenario_text(scenario);
    let unit = if metrics.len() > 1 {
        "slowest round trip, ms".to_string()
    } else {
        let i = metrics[0];
        format!(
            "{} ({} is better)",
            i.label,
            if i.higher_is_better {
                "higher"
            } else {
                "lower"
            }
        )
    };
    let xmax = bars
        .iter()
        .map(|(_, r)| r.max.max(r.median))
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.18;
    let n = bars.len();
    let height = CHART_EXTRA_PX + CHART_ROW_PX * n as u32;
    let root = BitMapBackend::new(path, (CHART_WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut c = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(190)
        .build_cartesian_2d(0.0..xmax, (0..n).into_segmented())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let labels: Vec<String> = bars.iter().map(|(l, _)| l.clone()).collect();
    c.configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .x_desc(unit)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, (_, r)) in bars.iter().enumerate() {
        let col = colour(&r.peer);
        let mut rect = Rectangle::new(
            [
                (0.0, SegmentValue::Exact(i)),
                (r.median, SegmentValue::Exact(i + 1)),
            ],
            col.filled(),
        );
        rect.set_margin(5, 5, 0, 0);
        c.draw_series(std::iter::once(rect))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        c.draw_series(std::iter::once(PathElement::new(
            vec![
                (r.min, SegmentValue::CenterOf(i)),
                (r.max, SegmentValue::CenterOf(i)),
            ],
            BLACK.stroke_width(2),
        )))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        c.draw_series(std::iter::once(Text::new(
            format!(" {}", fmt(r.median)),
            (r.max.max(r.median), SegmentValue::Exact(i + 1)),
            ("sans-serif", 13),
        )))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(scenario: &str, metric: &str, peer: &str, value: f64) -> Sample {
        Sample {
            scenario: scenario.into(),
            metric: metric.into(),
            peer: peer.into(),
            round: 0,
            value,
        }
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(quantile(&v, 0.5), 500);
        assert_eq!(quantile(&v, 0.99), 990);
        assert_eq!(quantile(&v, 0.999), 999);
        assert_eq!(quantile(&v, 1.0), 1000);
        assert_eq!(quantile::<u64>(&[], 0.5), 0);
        use std::time::Duration;
        let t: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&t, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&t, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&t[..1], 0.99), Duration::from_millis(1));
        assert_eq!(quantile::<Duration>(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN]), None);
    }

    #[test]
    fn summary_ratios_are_to_direct_and_haproxy_medians() {
        let samples = vec![
            s("bulk-1", "gbit_s", "direct", 20.0),
            s("bulk-1", "gbit_s", "direct", 30.0),
            s("bulk-1", "gbit_s", "direct", 40.0),
            s("bulk-1", "gbit_s", "haproxy", 10.0),
            s("bulk-1", "gbit_s", "shunt-splice", 15.0),
            s("bulk-1", "gbit_s", "shunt-splice", 12.0),
            s("bulk-1", "gbit_s", "shunt-splice", 18.0),
        ];
        let rows = summarize(&samples);
        let sp = rows.iter().find(|r| r.peer == "shunt-splice").expect("row");
        assert_eq!((sp.n, sp.median, sp.min, sp.max), (3, 15.0, 12.0, 18.0));
        assert_eq!(sp.vs_direct, Some(0.5));
        assert_eq!(sp.vs_haproxy, Some(1.5));
        // Peers come out in table order, whatever order the samples came in.
        let order: Vec<&str> = rows.iter().map(|r| r.peer.as_str()).collect();
        assert_eq!(order, ["direct", "shunt-splice", "haproxy"]);
    }

    #[test]
    fn report_files_table_and_chart() {
        let dir = std::env::temp_dir().join(format!("xtask-report-{}", std::process::id()));
        let samples = vec![
            s("rr-1", "per_s", "direct", 30000.0),
            s("rr-1", "per_s", "haproxy", 15000.0),
            s("rr-1", "p50_ms", "direct", 0.02),
            s("rr-1", "p50_ms", "haproxy", 0.05),
        ];
        let meta = Meta {
            date: "2026-01-01".into(),
            versions: BTreeMap::new(),
            cpus: 2,
            layout: "one CPU".into(),
            quick: true,
            rounds: 1,
            seconds: 1.0,
            plan: "test".into(),
        };
        std::fs::create_dir_all(&dir).expect("dir");
        let mine = format!("{HAND_WRITTEN}\n\n## Reading these figures\n\nkept\n");
        std::fs::write(dir.join("BENCHMARKS.md"), format!("# old table\n\n{mine}")).expect("old");
        let written = write(&dir, &meta, &samples, &["a note".into()], &[]).expect("write");
        let md = std::fs::read_to_string(dir.join("BENCHMARKS.md")).expect("md");
        assert!(md.ends_with(&mine), "the hand-written part is kept: {md}");
        assert!(
            !md.contains("# old table"),
            "the generated part is replaced"
        );
        assert!(
            md.contains("| haproxy | 15000 (15000–15000) | 0.50× | 1.00× |"),
            "{md}"
        );
        assert!(md.contains("- a note"));
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("docs/bench/results.json")).expect("json"),
        )
        .expect("valid json");
        assert_eq!(json["samples"].as_array().map(Vec::len), Some(4));
        if load_font().is_some() {
            let png = dir.join("docs/bench/rr-1.png");
            assert!(written.contains(&png));
            let head = std::fs::read(&png).expect("png");
            assert_eq!(&head[1..4], b"PNG");
            assert!(md.contains("![Small request/response, 1 client](docs/bench/rr-1.png)"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
