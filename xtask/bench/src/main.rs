//! The `shunt-bench` binary, which `cargo xtask bench` runs with its own arguments:
//! parses them (`shunt_bench::Args`), runs the bench, and exits non-zero when it failed.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    match shunt_bench::run(shunt_bench::Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
