//! Issue 14's targets, read off one run's samples: `shunt auto` against the best of
//! shunt's forced modes and against HAProxy in each scenario, the proxy's CPU per GB
//! against HAProxy's, idle memory per flow in every mode, one bulk stream against
//! direct.
//!
//! Owns: which metric stands for each scenario, the goals, and the two ways a ratio is
//! taken. **Paired**: within each round, `auto`'s sample against the other peer's sample
//! of the same round (against the forced mode with the best median), then the median of
//! those ratios over the rounds. A round measures every peer within seconds of each
//! other, so drift of the machine between rounds (here: hypervisor steal, shown beside
//! each row) cancels in the pair, where the ratio of two medians taken from different
//! rounds keeps it. **Of medians**: the ratio of the medians in the scenario tables,
//! shown beside it. A goal holds or not on the paired median.
//!
//! Invariant: nothing here measures; it reads `Sample`s and writes Markdown.

use std::collections::BTreeMap;

use crate::report::{fmt, median, Sample, STEAL};

const AUTO: &str = "shunt-auto";
const FORCED: [&str; 3] = ["shunt-sockmap", "shunt-splice", "shunt-copy"];
const HAPROXY: &str = "haproxy";
const DIRECT: &str = "direct";

/// Which way a goal points.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Goal {
    AtLeast(f64),
    AtMost(f64),
    /// Shown for context only.
    None,
}

impl Goal {
    fn holds(self, v: f64) -> Option<bool> {
        match self {
            Goal::AtLeast(g) => Some(v >= g),
            Goal::AtMost(g) => Some(v <= g),
            Goal::None => None,
        }
    }

    fn cell(self) -> String {
        match self {
            Goal::AtLeast(g) => format!("≥ {g:.2}"),
            Goal::AtMost(g) => format!("≤ {g:.2}"),
            Goal::None => "–".into(),
        }
    }
}

/// What a row compares `auto` (or a mode) against.
#[derive(Debug, Clone, Copy)]
enum Base {
    BestForced,
    Peer(&'static str),
    /// An absolute value of the peer itself (no ratio).
    Absolute,
}

/// One row of the targets table.
#[derive(Debug, Clone, Copy)]
struct Target {
    scenario: &'static str,
    metric: &'static str,
    what: &'static str,
    peer: &'static str,
    base: Base,
    higher_is_better: bool,
    goal: Goal,
    /// The aim rather than its target: shown, not counted as missed.
    aim: bool,
}

const fn t(
    scenario: &'static str,
    metric: &'static str,
    what: &'static str,
    base: Base,
    higher_is_better: bool,
    goal: Goal,
) -> Target {
    Target {
        scenario,
        metric,
        what,
        peer: AUTO,
        base,
        higher_is_better,
        goal,
        aim: false,
    }
}

/// The headline figure of each scenario `auto` must match the best forced mode in
/// (scenario, metric, label, higher is better); against HAProxy, these and
/// [`VS_HAPROXY_ONLY`].
const VS_FORCED: [(&str, &str, &str, bool); 7] = [
    ("bulk-1", "gbit_s", "Gbit/s", true),
    ("bulk-4", "gbit_s", "Gbit/s", true),
    ("rr-1", "per_s", "requests/s", true),
    ("rr-50", "per_s", "requests/s", true),
    ("connect", "per_s", "connections/s", true),
    ("rr-64k", "per_s", "round trips/s", true),
    ("idle", "kib_per_flow", "KiB per flow", false),
];

/// Scenarios only HAProxy is compared in (shunt runs them in `auto` alone).
const VS_HAPROXY_ONLY: [(&str, &str, &str, bool); 3] = [
    ("cli", "adds_per_s", "adds/s", true),
    ("tls", "handshakes_per_s", "handshakes/s", true),
    ("tls", "gbit_s", "bulk Gbit/s", true),
];

/// The proxy's own CPU per unit of work against HAProxy's (steal is not in a process's
/// utime+stime, so these move less with the machine than the rates do).
const CPU_VS_HAPROXY: [(&str, &str, &str, Goal); 7] = [
    (
        "bulk-1",
        "proxy_cpu_s_per_gb",
        "proxy CPU s/GB",
        Goal::AtMost(0.5),
    ),
    (
        "bulk-4",
        "proxy_cpu_s_per_gb",
        "proxy CPU s/GB",
        Goal::AtMost(0.5),
    ),
    (
        "rr-1",
        "proxy_cpu_us_per_op",
        "proxy CPU µs/request",
        Goal::None,
    ),
    (
        "rr-50",
        "proxy_cpu_us_per_op",
        "proxy CPU µs/request",
        Goal::None,
    ),
    (
        "connect",
        "proxy_cpu_us_per_op",
        "proxy CPU µs/connection",
        Goal::None,
    ),
    (
        "rr-64k",
        "proxy_cpu_us_per_op",
        "proxy CPU µs/round trip",
        Goal::None,
    ),
    (
        "tls",
        "proxy_cpu_ms_per_hs",
        "proxy CPU ms/handshake",
        Goal::None,
    ),
];

/// Idle memory per flow, the ceiling.
const IDLE_KIB_MAX: f64 = 4.0;
/// One bulk stream against direct: the long-term aim.
const BULK1_VS_DIRECT: f64 = 0.80;

fn targets() -> Vec<Target> {
    let mut v = Vec::new();
    for (s, m, what, hib) in VS_FORCED {
        v.push(t(s, m, what, Base::BestForced, hib, Goal::AtLeast(0.95)));
    }
    for (s, m, what, hib) in VS_FORCED.into_iter().chain(VS_HAPROXY_ONLY) {
        v.push(Target {
            // Idle memory: at most 4 KiB is the target, HAProxy's figure the aim.
            aim: s == "idle",
            ..t(s, m, what, Base::Peer(HAPROXY), hib, Goal::AtLeast(1.0))
        });
    }
    for (s, m, what, goal) in CPU_VS_HAPROXY {
        // A ratio of costs: below 1 is better, and the goal is a ceiling.
        v.push(t(s, m, what, Base::Peer(HAPROXY), true, goal));
    }
    for peer in std::iter::once(AUTO).chain(FORCED) {
        v.push(Target {
            peer,
            ..t(
                "idle",
                "kib_per_flow",
                "KiB per flow",
                Base::Absolute,
                false,
                Goal::AtMost(IDLE_KIB_MAX),
            )
        });
    }
    v.push(Target {
        aim: true,
        ..t(
            "bulk-1",
            "gbit_s",
            "Gbit/s",
            Base::Peer(DIRECT),
            true,
            Goal::AtLeast(BULK1_VS_DIRECT),
        )
    });
    v
}

/// (peer, round) -> value of one scenario's metric.
type ByRound = BTreeMap<(String, usize), f64>;

fn by_round(samples: &[Sample], scenario: &str, metric: &str) -> ByRound {
    samples
        .iter()
        .filter(|s| s.scenario == scenario && s.metric == metric && s.value.is_finite())
        .map(|s| ((s.peer.clone(), s.round), s.value))
        .collect()
}

fn rounds_of(m: &ByRound) -> Vec<usize> {
    let mut r: Vec<usize> = m.keys().map(|(_, r)| *r).collect();
    r.sort_unstable();
    r.dedup();
    r
}

fn peer_values(m: &ByRound, peer: &str) -> Vec<f64> {
    m.iter()
        .filter(|((p, _), _)| p == peer)
        .map(|(_, v)| *v)
        .collect()
}

/// `v / base`, or `base / v` where `invert` (a cost against the best forced mode, so
/// that every row of that kind reads "above 1: auto is better").
fn oriented(v: f64, base: f64, invert: bool) -> Option<f64> {
    if base <= 0.0 || v <= 0.0 {
        return None;
    }
    Some(if invert { base / v } else { v / base })
}

/// Paired ratios (one per round with both samples) and the ratio of medians.
#[derive(Debug, Clone, PartialEq)]
pub struct Ratio {
    /// The peer compared against (`None`: the value itself).
    pub base: Option<&'static str>,
    pub paired: Vec<f64>,
    pub of_medians: Option<f64>,
}

/// The forced mode with the best median of a scenario's metric: "the best of shunt's
/// forced modes" is a mode, chosen once over all rounds (the best sample of each round
/// would be the maximum of three noisy draws, biased against `auto`).
fn best_forced(m: &ByRound, higher_is_better: bool) -> Option<&'static str> {
    FORCED
        .iter()
        .filter_map(|p| median(&peer_values(m, p)).map(|v| (*p, v)))
        .reduce(|a, b| {
            if (b.1 > a.1) == higher_is_better {
                b
            } else {
                a
            }
        })
        .map(|(p, _)| p)
}

fn ratio(samples: &[Sample], tg: &Target) -> Option<Ratio> {
    let m = by_round(samples, tg.scenario, tg.metric);
    let invert = !tg.higher_is_better;
    let base = match tg.base {
        Base::Absolute => None,
        Base::Peer(p) => Some(p),
        Base::BestForced => Some(best_forced(&m, tg.higher_is_better)?),
    };
    let mut paired = Vec::new();
    for r in rounds_of(&m) {
        let Some(&mine) = m.get(&(tg.peer.to_string(), r)) else {
            continue;
        };
        match base {
            None => paired.push(mine),
            Some(b) => {
                if let Some(x) = m
                    .get(&(b.to_string(), r))
                    .and_then(|&v| oriented(mine, v, invert))
                {
                    paired.push(x);
                }
            }
        }
    }
    if paired.is_empty() {
        return None;
    }
    let mine = median(&peer_values(&m, tg.peer));
    let of_medians = match base {
        None => mine,
        Some(b) => mine
            .zip(median(&peer_values(&m, b)))
            .and_then(|(a, v)| oriented(a, v, invert)),
    };
    Some(Ratio {
        base,
        paired,
        of_medians,
    })
}

fn spread(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    match median(v) {
        Some(m) => format!("{} ({}–{})", fmt(m), fmt(lo), fmt(hi)),
        None => "–".into(),
    }
}

fn peer_label(slug: &str) -> &str {
    crate::peers::ALL
        .iter()
        .find(|p| p.slug == slug)
        .map_or(slug, |p| p.label)
}

/// The targets section of BENCHMARKS.md, or nothing when the run had no `auto` samples
/// to compare.
pub fn markdown(samples: &[Sample]) -> String {
    let mut rows = String::new();
    let (mut held, mut missed) = (0, 0);
    for tg in targets() {
        let Some(r) = ratio(samples, &tg) else {
            continue;
        };
        let base = match (tg.base, r.base) {
            (Base::BestForced, Some(p)) => format!("÷ {} (best forced mode)", peer_label(p)),
            (_, Some(p)) => format!("÷ {}", peer_label(p)),
            (_, None) => "itself".to_string(),
        };
        let holds = median(&r.paired).and_then(|m| tg.goal.holds(m));
        match holds {
            _ if tg.aim => {}
            Some(true) => held += 1,
            Some(false) => missed += 1,
            None => {}
        }
        let steal: Vec<f64> = by_round(samples, tg.scenario, STEAL)
            .into_values()
            .collect();
        rows.push_str(&format!(
            "| `{}` {} | {} {} | {} | {} | {} | {} | {} |\n",
            tg.scenario,
            tg.what,
            peer_label(tg.peer),
            base,
            spread(&r.paired),
            r.of_medians.map_or("–".into(), fmt),
            if tg.aim {
                format!("{} (aim)", tg.goal.cell())
            } else {
                tg.goal.cell()
            },
            match holds {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "–",
            },
            if steal.is_empty() {
                "–".into()
            } else {
                spread(&steal)
            },
        ));
    }
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "\n## Targets (issue 14)\n\n\
         Paired: per round, `auto`'s sample over the other peer's sample of the same round \
         (the best forced mode is the forced mode with the best median), median (min–max) over the \
         rounds; the goal is judged on it. Of medians: the same quotient of the medians in \
         the tables below. Rates read above 1 as better for `auto`, CPU costs below 1; \
         against the best forced mode a cost is inverted, so above 1 is better there too. \
         Steal: the share of the machine's CPU time the hypervisor took during the \
         scenario's samples (/proc/stat), median (min–max) over all its samples. \
         Targets (aims not counted): {held} held, {missed} missed.\n\n\
         | measure | ratio | paired | of medians | goal | holds | steal % |\n\
         |---|---|---:|---:|---:|---|---:|\n{rows}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(scenario: &str, metric: &str, peer: &str, round: usize, value: f64) -> Sample {
        Sample {
            scenario: scenario.into(),
            metric: metric.into(),
            peer: peer.into(),
            round,
            value,
        }
    }

    fn tg(scenario: &'static str, metric: &'static str, base: Base, hib: bool) -> Target {
        t(scenario, metric, "x", base, hib, Goal::AtLeast(1.0))
    }

    #[test]
    fn paired_ratios_pair_each_round_with_the_best_forced_mode() {
        // Round 0: the machine is fast for everyone, round 1 slow for everyone.
        let samples = vec![
            s("bulk-1", "gbit_s", AUTO, 0, 20.0),
            s("bulk-1", "gbit_s", "shunt-splice", 0, 19.0),
            s("bulk-1", "gbit_s", "shunt-copy", 0, 21.0),
            s("bulk-1", "gbit_s", AUTO, 1, 10.0),
            s("bulk-1", "gbit_s", "shunt-splice", 1, 12.5),
            s("bulk-1", "gbit_s", "shunt-copy", 1, 8.0),
        ];
        let r = ratio(&samples, &tg("bulk-1", "gbit_s", Base::BestForced, true)).expect("ratio");
        // Medians: auto 15, splice 15.75, copy 14.5: splice is the best forced mode,
        // and each round pairs auto with splice's sample (not the round's best draw).
        assert_eq!(r.base, Some("shunt-splice"));
        assert_eq!(r.paired, [20.0 / 19.0, 10.0 / 12.5]);
        assert_eq!(r.of_medians, Some(15.0 / 15.75));
    }

    #[test]
    fn costs_invert_against_forced_modes_and_rounds_without_a_pair_are_skipped() {
        let samples = vec![
            s("idle", "kib_per_flow", AUTO, 0, 4.0),
            s("idle", "kib_per_flow", "shunt-copy", 0, 3.0),
            s("idle", "kib_per_flow", "shunt-sockmap", 0, 5.0),
            s("idle", "kib_per_flow", AUTO, 1, 4.0),
        ];
        let r = ratio(
            &samples,
            &tg("idle", "kib_per_flow", Base::BestForced, false),
        )
        .expect("ratio");
        assert_eq!(r.paired, [0.75]);
        let cpu = vec![
            s("rr-50", "proxy_cpu_us_per_op", AUTO, 0, 20.0),
            s("rr-50", "proxy_cpu_us_per_op", HAPROXY, 0, 25.0),
        ];
        let r = ratio(
            &cpu,
            &tg("rr-50", "proxy_cpu_us_per_op", Base::Peer(HAPROXY), true),
        )
        .expect("ratio");
        assert_eq!(r.paired, [0.8]);
        assert_eq!(
            ratio(&cpu, &tg("rr-1", "per_s", Base::Peer(HAPROXY), true)),
            None
        );
    }

    #[test]
    fn the_section_judges_goals_on_the_paired_median_and_shows_steal() {
        let mut samples = Vec::new();
        for (r, (a, h, steal)) in [(10.0, 9.0, 30.0), (5.0, 4.0, 50.0), (30.0, 40.0, 10.0)]
            .into_iter()
            .enumerate()
        {
            samples.push(s("rr-50", "per_s", AUTO, r, a));
            samples.push(s("rr-50", "per_s", HAPROXY, r, h));
            samples.push(s("rr-50", STEAL, AUTO, r, steal));
        }
        let md = markdown(&samples);
        // Paired 1.11, 1.25, 0.75: median 1.11 holds; of medians 10/9.
        assert!(
            md.contains(
                "| `rr-50` requests/s | shunt auto ÷ haproxy | 1.11 (0.750–1.25) | 1.11 | ≥ 1.00 | yes | 30.00 (10.00–50.00) |"
            ),
            "{md}"
        );
        assert!(md.contains("1 held, 0 missed"), "{md}");
        assert_eq!(markdown(&[]), "");
    }

    #[test]
    fn idle_memory_is_judged_per_mode_as_an_absolute() {
        let samples = vec![
            s("idle", "kib_per_flow", AUTO, 0, 3.75),
            s("idle", "kib_per_flow", "shunt-sockmap", 0, 4.2),
        ];
        let md = markdown(&samples);
        assert!(
            md.contains("| `idle` KiB per flow | shunt auto itself | 3.75 (3.75–3.75) | 3.75 | ≤ 4.00 | yes |"),
            "{md}"
        );
        assert!(
            md.contains("| `idle` KiB per flow | shunt sockmap itself | 4.20 (4.20–4.20) | 4.20 | ≤ 4.00 | **no** |"),
            "{md}"
        );
    }
}
