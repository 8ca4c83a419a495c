//! `cargo xtask`: everything about shunt that is not plain cargo.
//!
//! Owns the command line of the tool and the order of the steps of each command:
//! `setup` (toolchain and Debian packages), `build` (release binary with the eBPF
//! object), `test` (fmt, clippy, debug build, workspace tests), `demo` (shunt in front
//! of in-process echo/sink backends) and `bench` (shunt in every forwarding mode side by
//! side with a direct connection, HAProxy and nginx; `--one-flow`: one-flow throughput
//! and proxy CPU per forwarding mode). The steps themselves live in one module each.
//!
//! Invariants: every command is runnable on a fresh Debian machine as root (it installs
//! what it needs first); every command exits non-zero when any step failed; every child
//! process started here is stopped before exit (see `proc::ChildGuard`).

mod bench;
mod delay;
mod demo;
mod latency;
mod load;
mod peers;
mod poolbench;
mod report;
mod suite;
mod test;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use xtask::{build_release, proc, servers, setup, target_dir, workspace_root};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Build, test, demo and bench shunt")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what builds and tests need: nightly rust-src/llvm-tools, rustfmt, clippy
    /// and the Debian packages the tests use (idempotent; apt needs root).
    Setup {
        /// Only the Rust toolchain part, no Debian packages.
        #[arg(long)]
        toolchain_only: bool,
    },
    /// Build target/release/shunt (with the embedded eBPF object).
    Build,
    /// Setup, then `cargo fmt --check`, clippy, debug build and `cargo test --workspace`.
    Test {
        /// Passed to `cargo test -- --test-threads`.
        #[arg(long, default_value_t = test::DEFAULT_TEST_THREADS)]
        test_threads: usize,
    },
    /// Build, start echo/sink backends and shunt with examples/demo.cfg, push traffic,
    /// print counters; runs until Ctrl-C.
    Demo {
        /// Configuration given to shunt.
        #[arg(long, default_value = demo::DEFAULT_CONFIG)]
        config: PathBuf,
        /// Exit by itself after this many seconds (for non-interactive runs).
        #[arg(long)]
        duration: Option<u64>,
        /// Use this proxy binary instead of building target/release/shunt.
        #[arg(long)]
        shunt: Option<PathBuf>,
    },
    /// shunt (sockmap, splice, copy) side by side with a direct connection, HAProxy
    /// (plain and splice-auto) and nginx stream: bulk, request/response, connect, 64 KiB,
    /// idle-flow memory, splice cork probe, CLI add-map stream. Writes BENCHMARKS.md,
    /// docs/bench/results.json and docs/bench/*.png (`--quick`: under
    /// target/xtask/bench/quick unless --out is given).
    Bench {
        /// A reduced set (under 3 minutes).
        #[arg(long)]
        quick: bool,
        /// Rounds per scenario (default 3).
        #[arg(long)]
        rounds: Option<usize>,
        /// Peers to compare (default: all): direct, shunt-sockmap, shunt-splice,
        /// shunt-copy, haproxy, haproxy-splice, nginx.
        #[arg(long, value_delimiter = ',')]
        peers: Option<Vec<String>>,
        /// Scenarios to run (default: all): bulk-1, bulk-4, rr-1, rr-50, connect,
        /// rr-64k, idle, cork, cli; and, only when named, sched-latency (new-flow
        /// latency under heavy CLI work, with and without the one-heavy-per-loop rule)
        /// and pool-ttfb (warm spares with a server 1 ms away: time to first byte and
        /// takeover rate; writes docs/bench/pool-ttfb.md).
        #[arg(long, value_delimiter = ',')]
        scenarios: Option<Vec<String>>,
        /// Directory that receives BENCHMARKS.md and docs/bench/.
        #[arg(long)]
        out: Option<PathBuf>,
        /// File listing the pid of every process the bench starts (default:
        /// target/xtask/bench/pids.txt).
        #[arg(long)]
        pid_file: Option<PathBuf>,
        /// The former bench: SIZE bytes through one flow per forwarding mode.
        #[arg(long)]
        one_flow: bool,
        /// --one-flow: bytes per run; suffixes K, M, G (binary: 1G = 1 GiB).
        #[arg(long, default_value = "1G")]
        size: String,
        /// --one-flow: forwarding modes to measure, in order; the first is the baseline.
        #[arg(long, value_delimiter = ',', default_value = "copy,splice,sockmap")]
        modes: Vec<String>,
        /// --one-flow: also measure Debian's haproxy (plain, then `option splice-auto`).
        #[arg(long)]
        haproxy: bool,
        /// --one-flow: give up on one run after this many seconds.
        #[arg(long, default_value_t = bench::DEFAULT_RUN_TIMEOUT_SECS)]
        timeout: u64,
        /// Use this proxy binary instead of building target/release/shunt.
        #[arg(long)]
        shunt: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Setup { toolchain_only } => {
            if toolchain_only {
                setup::toolchain()
            } else {
                setup::all()
            }
        }
        Cmd::Build => build_release().map(|_| ()),
        Cmd::Test { test_threads } => test::run(test_threads),
        Cmd::Demo {
            config,
            duration,
            shunt,
        } => demo::run(&config, duration, shunt),
        Cmd::Bench {
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
        } => {
            if one_flow {
                bench::run(&bench::Options {
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
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
