//! `cargo xtask test`: the whole suite, as CI runs it.
//!
//! Owns the order of the checks: setup (toolchain and Debian packages), `cargo fmt
//! --check`, clippy with warnings denied, the debug build of `shunt` the integration
//! tests start (they find it at target/debug/shunt or $SHUNT_BIN), then `cargo test
//! --workspace` with few test threads for a 2-core machine, and last the README's demo
//! command, run non-interactively (`--duration`) against the same debug binary.
//!
//! Invariants: every check runs even when an earlier one failed (one run shows every
//! problem), except the tests when the binary they need did not build; the command
//! exits non-zero if any check failed or was skipped.

use std::time::Instant;

use anyhow::{bail, Result};

use xtask::{ebpf, proc, setup};

/// How long the demo step runs: long enough for one periodic tick.
const DEMO_SECS: &str = "6";

/// Test threads for `cargo test`: the integration tests push real traffic, and the
/// machines this runs on have 2 cores.
pub const DEFAULT_TEST_THREADS: usize = 2;

enum Outcome {
    Ok,
    Failed(String),
    Skipped(&'static str),
}

pub fn run(test_threads: usize) -> Result<()> {
    setup::all()?;
    ebpf::ensure_toolchain().map_err(|e| anyhow::anyhow!("eBPF toolchain: {e}"))?;

    let threads = test_threads.max(1).to_string();
    let bin = xtask::target_dir().join("debug").join("shunt");
    if std::env::var_os("SHUNT_BIN").is_none() {
        // Inherited by the cargo test child below.
        std::env::set_var("SHUNT_BIN", &bin);
    }
    let mut results: Vec<(&str, Outcome, f64)> = Vec::new();
    let mut step = |name: &'static str, args: &[&str]| -> bool {
        let started = Instant::now();
        // Every step goes through cargo. The demo is this very tool, run again by
        // cargo rather than by the running executable's path, which a build in an
        // earlier step may have replaced.
        let run = proc::cargo(args);
        let outcome = match run {
            Ok(()) => Outcome::Ok,
            Err(e) => Outcome::Failed(format!("{e:#}")),
        };
        let ok = matches!(outcome, Outcome::Ok);
        results.push((name, outcome, started.elapsed().as_secs_f64()));
        ok
    };

    step("fmt", &["fmt", "--all", "--", "--check"]);
    step(
        "clippy",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    );
    let built = step("build", &["build", "-p", "proxy"]);
    if built {
        step(
            "test",
            &[
                "test",
                "--workspace",
                "--no-fail-fast",
                "--",
                "--test-threads",
                &threads,
            ],
        );
        let bin = bin.to_string_lossy().into_owned();
        step(
            "demo",
            &[
                "run",
                "-q",
                "-p",
                "xtask",
                "--",
                "demo",
                "--duration",
                DEMO_SECS,
                "--shunt",
                &bin,
            ],
        );
    } else {
        for name in ["test", "demo"] {
            results.push((name, Outcome::Skipped("shunt did not build"), 0.0));
        }
    }

    println!("\nxtask test summary:");
    let mut bad = Vec::new();
    for (name, outcome, secs) in &results {
        let text = match outcome {
            Outcome::Ok => "ok".to_string(),
            Outcome::Failed(e) => {
                bad.push(*name);
                format!("FAILED ({e})")
            }
            Outcome::Skipped(why) => {
                bad.push(*name);
                format!("SKIPPED ({why})")
            }
        };
        println!("  {name:<7} {text}  [{secs:.0} s]");
    }
    if bad.is_empty() {
        println!("xtask test: all checks ok");
        Ok(())
    } else {
        bail!("checks not ok: {}", bad.join(", "))
    }
}
