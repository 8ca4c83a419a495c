//! Builds the eBPF object and hands it to the `proxy` crate for embedding.
//!
//! The pipeline is `xtask/src/ebpf.rs` (one implementation for `cargo xtask
//! build` and for this script). Invariants:
//! - a build never silently ships without the object: a missing toolchain
//!   fails the build with the set-up command, unless `SHUNT_NO_BPF=1` asks for
//!   a build without it, which sets `cfg(shunt_no_bpf)` so shunt says so;
//! - the nested cargo uses its own target directory (`target/ebpf`), so it
//!   never waits on the lock the outer cargo holds;
//! - it reruns only when the eBPF sources, the shared types, the pipeline or
//!   `SHUNT_NO_BPF` change; a rerun with nothing changed costs one fresh
//!   nested cargo check plus a sub-second link.

#[path = "../xtask/src/ebpf.rs"]
mod ebpf;

use std::path::PathBuf;

/// Set to `1` to build shunt without the BPF object (no nightly needed).
const NO_BPF_ENV: &str = "SHUNT_NO_BPF";

fn main() {
    let manifest_dir = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let root = manifest_dir
        .parent()
        .expect("proxy/ lives in the workspace root")
        .to_path_buf();
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    println!("cargo::rustc-check-cfg=cfg(shunt_no_bpf)");
    println!("cargo::rerun-if-env-changed={NO_BPF_ENV}");
    println!("cargo::rerun-if-env-changed=CARGO_TARGET_DIR");
    for path in [
        "proxy-ebpf/src",
        "proxy-ebpf/Cargo.toml",
        "proxy-ebpf/Cargo.lock",
        "proxy-common/src",
        "proxy-common/Cargo.toml",
        "xtask/src/ebpf.rs",
    ] {
        println!("cargo::rerun-if-changed={}", root.join(path).display());
    }

    if std::env::var(NO_BPF_ENV).is_ok_and(|v| v == "1") {
        println!("cargo::rustc-cfg=shunt_no_bpf");
        println!("cargo::warning=building shunt without the BPF object ({NO_BPF_ENV}=1)");
        return;
    }

    if let Err(e) = ebpf::build_ebpf(&root, &out_dir) {
        // Cargo shows a failing build script's stderr; exit 1 fails the build.
        eprintln!(
            "\n\nshunt's BPF object could not be built:\n{e}\n\n\
             Set up the toolchain with `cargo xtask setup` (or `{}`),\n\
             or build without kernel forwarding with {NO_BPF_ENV}=1.\n",
            ebpf::SETUP_COMMAND
        );
        std::process::exit(1);
    }
}
