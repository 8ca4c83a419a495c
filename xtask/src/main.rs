//! `cargo xtask`: everything about shunt that is not plain cargo.
//!
//! Owns the command line of the tool and the order of the steps of each command:
//! `setup` (toolchain and Debian packages), `build` (release binary with the eBPF
//! object), `test` (fmt, clippy, debug build, workspace tests), `demo` (shunt in front
//! of in-process echo/sink backends) and `bench`, which hands its arguments to the
//! benchmark lab, the `shunt-bench` crate in xtask/bench (shunt in every forwarding mode
//! side by side with a direct connection, HAProxy and nginx; `--one-flow`: one-flow
//! throughput and proxy CPU per forwarding mode), and `ktls-vm` (the `tls` tests in a
//! KVM guest booted on a Debian kernel with kTLS, for hosts whose kernel has none). The steps themselves live in one
//! module each, here or in the xtask library (src/lib.rs) the bench crate shares.
//!
//! Invariants: every command is runnable on a fresh Debian machine as root (it installs
//! what it needs first); every command exits non-zero when any step failed; every child
//! process started here is stopped before exit (see `proc::ChildGuard`).

mod bench;
mod demo;
mod ktls_vm;
mod test;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use xtask::{build_release, setup};

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
    /// Boot a KVM guest on a Debian 6.1 kernel with the `tls` ULP and run `tls`
    /// integration tests there (kTLS in effect); downloads the kernel package with apt.
    KtlsVm {
        /// The kernel package (default: the newest linux-image-6.1.0-N-amd64).
        #[arg(long)]
        kernel_package: Option<String>,
        /// Run every test of the `tls` binary, not only the named ones.
        #[arg(long)]
        all: bool,
        /// Guest memory (qemu -m).
        #[arg(long, default_value = "1G")]
        memory: String,
        /// Seconds before the guest is killed.
        #[arg(long, default_value_t = 900)]
        timeout: u64,
        /// Boot under KVM (default: qemu's TCG emulator, which boots where nested KVM hangs).
        #[arg(long)]
        kvm: bool,
        /// Exact names of tests of the `tls` binary (default: the bulk half-close test).
        tests: Vec<String>,
    },
    /// The benchmark lab (crate xtask/bench, package `shunt-bench`), run with these
    /// arguments: `cargo xtask bench --help` lists its flags.
    #[command(disable_help_flag = true)]
    Bench {
        /// Passed unchanged to shunt-bench (--quick, --scenarios, --peers, --rounds,
        /// --out, --pid-file, --one-flow, --size, --modes, --haproxy, --timeout, --shunt).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_parser = clap::value_parser!(OsString))]
        args: Vec<OsString>,
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
        Cmd::Bench { args } => Err(bench::exec(&args)),
        Cmd::KtlsVm {
            kernel_package,
            all,
            memory,
            timeout,
            kvm,
            tests,
        } => ktls_vm::run(&ktls_vm::Opts {
            kernel_package,
            tests,
            all,
            memory,
            limit: std::time::Duration::from_secs(timeout),
            kvm,
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
