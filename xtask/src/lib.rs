//! The library half of xtask: what the `xtask` binary and the bench crate
//! (xtask/bench, package `shunt-bench`) both use.
//!
//! Owns: the workspace's paths (`workspace_root`, `target_dir`), the release build
//! (`build_release`), the set-up steps (`setup`), the eBPF pipeline (`ebpf`, also
//! included by proxy/build.rs), child processes and signals (`proc`), the configuration
//! scan (`layout`) and the units of the printed figures (`units`). The in-process
//! backends and the stats socket client are shared with the tests too, in
//! `shunt_testkit` (tests/kit).
//!
//! Invariant: nothing here parses xtask's command line or decides the order of a
//! command's steps; that stays in the binaries.

pub mod ebpf;
pub mod layout;
pub mod proc;
pub mod setup;
pub mod units;

use std::path::PathBuf;

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
