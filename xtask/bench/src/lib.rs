//! shunt's benchmark lab, the crate behind `cargo xtask bench` (package `shunt-bench`).
//!
//! Owns the bench's command line (`Args`, the flags `cargo xtask bench` has always had)
//! and which of the two benches runs: the suite (`suite`: shunt in every forwarding mode
//! side by side with a direct connection, HAProxy and nginx, with the load generators of
//! `load`, the peers of `peers`, the report of `report`, and the scenarios named only on
//! request: `latency` (sched-latency) and `poolbench` (pool-ttfb, across the delay wire
//! of `delay`)), or `--one-flow` (`one_flow`: one flow per forwarding mode).
//!
//! What it shares with the xtask binary (paths, the release build, Debian packages,
//! child processes and signals, the in-process backends and the stats socket client)
//! comes from the `xtask` library; nothing here is needed to build or test shunt.
//!
//! Invariants: every process the bench starts is stopped before it returns, Ctrl-C
//! included (`xtask::proc::ChildGuard`, the pid file); it fails when any run failed.

mod cpus;
mod delay;
mod latency;
mod load;
mod one_flow;
mod peers;
mod poolbench;
mod report;
mod suite;
mod targets;
mod tls;

use std::path::PathBuf;

use clap::Parser;

/// shunt (auto, sockmap, splice, copy) side by side with a direct connection, HAProxy
/// (plain and splice-auto) and nginx stream: bulk, request/response, connect, 64 KiB,
/// idle-flow memory, splice cork probe, CLI add-map stream. Writes BENCHMARKS.md,
/// docs/bench/results.json and docs/bench/*.png (`--quick`: under
/// target/xtask/bench/quick unless --out is given).
#[derive(Parser, Debug, PartialEq)]
#[command(name = "cargo xtask bench", bin_name = "cargo xtask bench")]
pub struct Args {
    /// A reduced set (under 3 minutes).
    #[arg(long)]
    pub quick: bool,
    /// Rounds per scenario (default 3).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Peers to compare (default: all): direct, shunt-auto, shunt-sockmap, shunt-splice,
    /// shunt-copy, haproxy, haproxy-splice, nginx.
    #[arg(long, value_delimiter = ',')]
    pub peers: Option<Vec<String>>,
    /// Scenarios to run (default: all): bulk-1, bulk-4, rr-1, rr-50, connect,
    /// rr-64k, idle, cork, cli, tls; and, only when named, sched-latency (new-flow
    /// latency under heavy CLI work, with and without the one-heavy-per-loop rule)
    /// and pool-ttfb (warm spares with a server 1 ms away: time to first byte and
    /// takeover rate; writes docs/bench/pool-ttfb.md).
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Option<Vec<String>>,
    /// Directory that receives BENCHMARKS.md and docs/bench/.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// File listing the pid of every process the bench starts (default:
    /// target/xtask/bench/pids.txt).
    #[arg(long)]
    pub pid_file: Option<PathBuf>,
    /// The former bench: SIZE bytes through one flow per forwarding mode.
    #[arg(long)]
    pub one_flow: bool,
    /// --one-flow: bytes per run; suffixes K, M, G (binary: 1G = 1 GiB).
    #[arg(long, default_value = "1G")]
    pub size: String,
    /// --one-flow: forwarding modes to measure, in order; the first is the baseline.
    #[arg(long, value_delimiter = ',', default_value = "copy,splice,sockmap")]
    pub modes: Vec<String>,
    /// --one-flow: also measure Debian's haproxy (plain, then `option splice-auto`).
    #[arg(long)]
    pub haproxy: bool,
    /// --one-flow: give up on one run after this many seconds.
    #[arg(long, default_value_t = one_flow::DEFAULT_RUN_TIMEOUT_SECS)]
    pub timeout: u64,
    /// Use this proxy binary instead of building target/release/shunt.
    #[arg(long)]
    pub shunt: Option<PathBuf>,
}

/// Runs the bench `args` ask for.
pub fn run(args: Args) -> anyhow::Result<()> {
    let Args {
        quick,
        rounds,
        peers,
        scenarios,
        out,
        pid_file,
        one_flow,
        size,
        modes,
        haproxy,
        timeout,
        shunt,
    } = args;
    if one_flow {
        one_flow::run(&one_flow::Options {
            size,
            modes,
            haproxy,
            timeout_secs: timeout,
            shunt,
        })
    } else {
        suite::run(&suite::Options {
            quick,
            rounds,
            peers,
            scenarios,
            shunt,
            out,
            pid_file,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_as_cargo_xtask_bench_took_them() {
        let a = Args::try_parse_from([
            "cargo xtask bench",
            "--quick",
            "--scenarios",
            "cork,rr-1",
            "--peers=direct,shunt-copy",
            "--out",
            "o",
            "--pid-file",
            "p.txt",
            "--rounds",
            "5",
            "--shunt",
            "target/debug/shunt",
        ])
        .expect("suite flags");
        assert!(a.quick && !a.one_flow);
        assert_eq!(a.scenarios, Some(vec!["cork".into(), "rr-1".into()]));
        assert_eq!(a.peers, Some(vec!["direct".into(), "shunt-copy".into()]));
        assert_eq!(a.out, Some(PathBuf::from("o")));
        assert_eq!(a.pid_file, Some(PathBuf::from("p.txt")));
        assert_eq!(a.rounds, Some(5));
        assert_eq!(a.shunt, Some(PathBuf::from("target/debug/shunt")));
        let d = Args::try_parse_from(["cargo xtask bench", "--one-flow"]).expect("defaults");
        assert_eq!(d.size, "1G");
        assert_eq!(d.modes, ["copy", "splice", "sockmap"]);
        assert_eq!(d.timeout, one_flow::DEFAULT_RUN_TIMEOUT_SECS);
        assert!(!d.haproxy && d.scenarios.is_none());
        assert!(Args::try_parse_from(["cargo xtask bench", "--no-such-flag"]).is_err());
    }
}
