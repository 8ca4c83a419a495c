//! `cargo xtask bench ARGS…`: the benchmark lab lives in its own crate (xtask/bench,
//! package `shunt-bench`); this runs it with ARGS unchanged.
//!
//! Owns only the hand-over: `cargo run -p shunt-bench -- ARGS…` (the workspace's
//! manifest, so relative paths in ARGS keep meaning what they meant from the caller's
//! directory; the profile xtask itself was built in), exec'd in place of xtask. So the
//! bench is the process the caller started: Ctrl-C and SIGTERM reach it directly, its
//! output and exit status are the command's, and nothing is left to forward or reap.
//!
//! Invariant: returns only when the exec failed.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The cargo command line that builds and runs the bench with `args`.
fn command(args: &[OsString]) -> Command {
    let mut cmd = Command::new(xtask::proc::cargo_program());
    cmd.args(["run", "--quiet", "--manifest-path"])
        .arg(xtask::workspace_root().join("Cargo.toml"))
        .args(["--package", "shunt-bench"]);
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    cmd.arg("--").args(args);
    cmd
}

/// Replaces this process with the bench; the error says why that failed.
pub fn exec(args: &[OsString]) -> anyhow::Error {
    let mut cmd = command(args);
    let err = cmd.exec();
    anyhow::anyhow!("cannot run {cmd:?}: {err}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_reach_the_bench_crate_unchanged() {
        let args: Vec<OsString> = ["--quick", "--scenarios", "cork", "--out", "rel/dir"]
            .map(OsString::from)
            .to_vec();
        let cmd = command(&args);
        let argv: Vec<&std::ffi::OsStr> = cmd.get_args().collect();
        let dashes = argv.iter().position(|a| *a == "--").expect("--");
        assert_eq!(
            argv[dashes + 1..],
            args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>()[..]
        );
        assert!(argv[..dashes]
            .windows(2)
            .any(|w| w[0] == "--package" && w[1] == "shunt-bench"));
        let manifest = argv
            .iter()
            .position(|a| *a == "--manifest-path")
            .expect("manifest");
        assert_eq!(
            std::path::Path::new(argv[manifest + 1]),
            xtask::workspace_root().join("Cargo.toml")
        );
        // The caller's directory stays: `--out rel/dir` means what it meant there.
        assert!(cmd.get_current_dir().is_none());
    }
}
