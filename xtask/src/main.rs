//! `cargo xtask`: everything about shunt that is not plain cargo.
//!
//! Owns the command line of the tool and the order of the steps of each command:
//! `setup` (toolchain and Debian packages), `build` (release binary with the eBPF
//! object), `test` (fmt, clippy, debug build, workspace tests), `demo` (shunt in front
//! of in-process echo/sink backends) and `bench` (one-flow throughput and proxy CPU per
//! forwarding mode). The steps themselves live in one module each.
//!
//! Invariants: every command is runnable on a fresh Debian machine as root (it installs
//! what it needs first); every command exits non-zero when any step failed; every child
//! process started here is stopped before exit (see `proc::ChildGuard`).

mod bench;
mod demo;
mod ebpf;
mod proc;
mod servers;
mod setup;
mod test;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Push SIZE bytes through one flow per forwarding mode; print Gbit/s and proxy CPU.
    Bench {
        /// Bytes per run; suffixes K, M, G (binary: 1G = 1 GiB).
        #[arg(long, default_value = "1G")]
        size: String,
        /// Forwarding modes to measure, in order; the first is the ratio baseline.
        #[arg(long, value_delimiter = ',', default_value = "copy,splice,sockmap")]
        modes: Vec<String>,
        /// Also measure Debian's haproxy (plain, then with `option splice-auto`).
        #[arg(long)]
        haproxy: bool,
        /// Give up on one run after this many seconds.
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
            size,
            modes,
            haproxy,
            timeout,
            shunt,
        } => bench::run(&bench::Options {
            size,
            modes,
            haproxy,
            timeout_secs: timeout,
            shunt,
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.clone())
}

/// Cargo's target directory, honouring CARGO_TARGET_DIR.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                workspace_root().join(dir)
            }
        }
        None => workspace_root().join("target"),
    }
}

/// `cargo xtask build`: toolchain, eBPF toolchain check, release build. Returns the path
/// of the built binary.
pub fn build_release() -> anyhow::Result<PathBuf> {
    setup::toolchain()?;
    ebpf::ensure_toolchain().map_err(|e| anyhow::anyhow!("eBPF toolchain: {e}"))?;
    proc::cargo(&["build", "--release", "-p", "proxy"])?;
    let bin = target_dir().join("release").join("shunt");
    anyhow::ensure!(
        bin.is_file(),
        "cargo build succeeded but {} is missing",
        bin.display()
    );
    println!("xtask: built {}", bin.display());
    Ok(bin)
}
