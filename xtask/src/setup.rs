//! `cargo xtask setup`: installs what building and testing shunt need.
//!
//! Owns the list of Debian packages the tests use (`DEBIAN_PACKAGES`, the only place it
//! is written), the Python packages (`PIP_PACKAGES`) and the Rust components the build
//! uses.
//!
//! Invariant: idempotent and quiet when everything is present — it asks rustup and dpkg
//! what is installed first and only then installs what is missing (no `apt-get update`
//! when nothing is missing), printing every command it runs.

use anyhow::{bail, Result};

use crate::proc;

/// Debian packages the tests and the bench use:
/// haproxy (comparison runs and config-compatibility checks), socat and iperf3 (traffic
/// tools), redis-server (a real TCP server behind the proxy), bpftool (inspecting the
/// loaded programs and maps), iproute2 (`ss`, `ip netns`), procps (`ps`, `pgrep`),
/// util-linux (`setpriv` for the unprivileged test, `script` for hatop's terminal),
/// hatop, prometheus-haproxy-exporter and python3-pip (the real stats-socket clients of
/// the `cli_clients` test; pip installs haproxyadmin), strace (the CLI write-count test);
/// nginx and libnginx-mod-stream (the nginx stream peer of `cargo xtask bench`, and the
/// `proxy_protocol` test's `listen ... proxy_protocol` far end); for `cargo xtask bench`:
/// redis-tools (redis-benchmark), sysstat (mpstat/pidstat to watch a run by hand) and
/// fonts-dejavu-core (the font of the PNG charts); rsyslog (the real syslog server the
/// `logs` test sends traffic logs to over UDP and TCP); chromium (the headless browser
/// of the `statspage_browser` test).
pub const DEBIAN_PACKAGES: &[&str] = &[
    "haproxy",
    "hatop",
    "prometheus-haproxy-exporter",
    "python3-pip",
    "socat",
    "iperf3",
    "redis-server",
    "bpftool",
    "iproute2",
    "procps",
    "util-linux",
    "strace",
    "nginx",
    "libnginx-mod-stream",
    "redis-tools",
    "sysstat",
    "fonts-dejavu-core",
    "rsyslog",
    "chromium",
];

/// The nightly toolchain builds the eBPF object (bpfel-unknown-none needs core from source).
const NIGHTLY: &str = "nightly";
/// Components of the nightly toolchain the eBPF build needs.
const NIGHTLY_COMPONENTS: &[&str] = &["rust-src", "llvm-tools"];
/// Components of the default toolchain `cargo xtask test` needs.
const STABLE_COMPONENTS: &[&str] = &["rustfmt", "clippy"];

/// Python packages the tests use, as (pip name, module to import):
/// haproxyadmin (a real stats-socket client of the `cli_clients` test), prometheus_client
/// (the reference OpenMetrics parser of the `metrics` test).
pub const PIP_PACKAGES: &[(&str, &str)] = &[
    ("haproxyadmin", "haproxyadmin"),
    ("prometheus_client", "prometheus_client"),
];

/// Everything: toolchain, then Debian packages, then Python packages.
pub fn all() -> Result<()> {
    toolchain()?;
    debian_packages()?;
    pip_packages()?;
    bpf_filesystem();
    Ok(())
}

/// Where the BPF filesystem is expected (shunt pins its maps below it so kernel
/// flows survive a reload).
const BPFFS: &str = "/sys/fs/bpf";

/// Mounts the BPF filesystem at [`BPFFS`] when it is not (systemd does it at boot;
/// bare VMs and containers may not). Needs root; without it, or if the mount fails,
/// one line says so and shunt runs without pinned maps (reloads then leave kernel
/// flows with the old process).
pub fn bpf_filesystem() {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    if is_bpffs_mounted(&mounts) {
        println!("xtask: BPF filesystem mounted at {BPFFS}");
        return;
    }
    match proc::run("mount", &["-t", "bpf", "bpf", BPFFS]) {
        Ok(()) => println!("xtask: mounted the BPF filesystem at {BPFFS}"),
        Err(e) => println!("xtask: BPF filesystem not mounted at {BPFFS} ({e:#}): reloads keep kernel flows in the old process"),
    }
}

/// Whether `/proc/mounts` lists a `bpf` filesystem at [`BPFFS`].
fn is_bpffs_mounted(mounts: &str) -> bool {
    mounts.lines().any(|l| {
        let mut f = l.split_whitespace();
        let (_, point, fstype) = (f.next(), f.next(), f.next());
        point == Some(BPFFS) && fstype == Some("bpf")
    })
}

/// Installs the missing ones of `PIP_PACKAGES` for the `python3` on PATH (the one the
/// tests run). Idempotent: a package whose module imports is left alone.
pub fn pip_packages() -> Result<()> {
    let missing: Vec<&str> = PIP_PACKAGES
        .iter()
        .filter(|(_, module)| {
            proc::output("python3", &["-c", &format!("import {module}")]).is_none()
        })
        .map(|(name, _)| *name)
        .collect();
    if missing.is_empty() {
        println!("xtask: Python packages present ({})", pip_names().join(" "));
        return Ok(());
    }
    let mut args = vec!["-m", "pip", "install", "--quiet"];
    args.extend(missing.iter().copied());
    if proc::run("python3", &args).is_ok() {
        return Ok(());
    }
    // Debian's own python3 refuses pip installs outside a venv (PEP 668) unless told.
    args.push("--break-system-packages");
    proc::run("python3", &args)
}

fn pip_names() -> Vec<&'static str> {
    PIP_PACKAGES.iter().map(|(n, _)| *n).collect()
}

/// The Rust part: nightly with rust-src and llvm-tools; rustfmt and clippy on the
/// toolchain cargo runs with.
pub fn toolchain() -> Result<()> {
    if proc::output("rustup", &["--version"]).is_none() {
        bail!("rustup not found: install Rust with rustup first (https://rustup.rs)");
    }
    let toolchains = proc::output("rustup", &["toolchain", "list"]).unwrap_or_default();
    let has_nightly = toolchains
        .lines()
        .any(|l| l.starts_with(&format!("{NIGHTLY}-")) || l.starts_with(NIGHTLY));
    if !has_nightly {
        let mut args = vec!["toolchain", "install", NIGHTLY, "--profile", "minimal"];
        for c in NIGHTLY_COMPONENTS {
            args.extend(["--component", c]);
        }
        proc::run("rustup", &args)?;
    } else {
        let missing = missing_components(Some(NIGHTLY), NIGHTLY_COMPONENTS);
        if !missing.is_empty() {
            let mut args = vec!["component", "add"];
            args.extend(missing.iter().copied());
            args.extend(["--toolchain", NIGHTLY]);
            proc::run("rustup", &args)?;
        }
    }
    let missing = missing_components(None, STABLE_COMPONENTS);
    if !missing.is_empty() {
        let mut args = vec!["component", "add"];
        args.extend(missing.iter().copied());
        proc::run("rustup", &args)?;
    }
    println!(
        "xtask: toolchain ready ({NIGHTLY}: {}; default: {})",
        NIGHTLY_COMPONENTS.join(", "),
        STABLE_COMPONENTS.join(", ")
    );
    Ok(())
}

/// Components of `wanted` that rustup does not list as installed on `toolchain`
/// (None = the active one).
fn missing_components<'a>(toolchain: Option<&str>, wanted: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["component", "list", "--installed"];
    if let Some(t) = toolchain {
        args.extend(["--toolchain", t]);
    }
    let installed = proc::output("rustup", &args).unwrap_or_default();
    wanted
        .iter()
        .copied()
        .filter(|w| !component_listed(&installed, w))
        .collect()
}

/// rustup lists components as `rust-src` or `clippy-x86_64-unknown-linux-gnu`: the name,
/// alone or followed by `-` and a target triple (which has at least two more dashes).
fn component_listed(installed: &str, name: &str) -> bool {
    installed.lines().any(|l| {
        let l = l.trim();
        l == name
            || l.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|triple| triple.matches('-').count() >= 2)
    })
}

/// Installs the missing ones of `DEBIAN_PACKAGES` with apt-get (needs root).
pub fn debian_packages() -> Result<()> {
    if proc::output("dpkg-query", &["--version"]).is_none() {
        println!("xtask: not a Debian system (no dpkg-query); skipping Debian packages");
        return Ok(());
    }
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .copied()
        .filter(|p| !deb_installed(p))
        .collect();
    if missing.is_empty() {
        println!(
            "xtask: Debian packages present ({})",
            DEBIAN_PACKAGES.join(" ")
        );
        return Ok(());
    }
    println!("xtask: missing Debian packages: {}", missing.join(" "));
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "installing Debian packages needs root: run `sudo apt-get install -y {}`",
            missing.join(" ")
        );
    }
    // Never prompt: CI has no terminal.
    std::env::set_var("DEBIAN_FRONTEND", "noninteractive");
    proc::run("apt-get", &["update"])?;
    let mut args = vec!["install", "-y", "--no-install-recommends"];
    args.extend(missing.iter().copied());
    proc::run("apt-get", &args)
}

fn deb_installed(package: &str) -> bool {
    proc::output("dpkg-query", &["-W", "-f=${Status}", package])
        .is_some_and(|s| s.trim() == "install ok installed")
}

#[cfg(test)]
mod tests {

    #[test]
    fn bpffs_is_recognised_in_proc_mounts() {
        let with = "sysfs /sys sysfs rw 0 0\nbpf /sys/fs/bpf bpf rw,nosuid 0 0\n";
        assert!(super::is_bpffs_mounted(with));
        let without = "sysfs /sys sysfs rw 0 0\nnone /sys/fs/bpf tmpfs rw 0 0\n";
        assert!(!super::is_bpffs_mounted(without));
    }

    use super::*;

    #[test]
    fn rustup_component_names_match_with_and_without_target() {
        let listed = "cargo-x86_64-unknown-linux-gnu\nclippy-x86_64-unknown-linux-gnu\n\
                      llvm-tools-x86_64-unknown-linux-gnu\nrust-src\n";
        assert!(component_listed(listed, "rust-src"));
        assert!(component_listed(listed, "clippy"));
        assert!(component_listed(listed, "llvm-tools"));
        assert!(!component_listed(listed, "rustfmt"));
        assert!(!component_listed(listed, "rust"));
    }

    #[test]
    fn package_list_has_no_duplicates() {
        let mut sorted = DEBIAN_PACKAGES.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), DEBIAN_PACKAGES.len());
    }
}
