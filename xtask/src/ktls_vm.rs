//! `cargo xtask ktls-vm`: shunt's kTLS path run for real, in a KVM guest
//! booted on a Debian kernel that has the `tls` ULP (the machines shunt is
//! built on may have none: CONFIG_TLS unset).
//!
//! Owns the steps: the tools (qemu, a static busybox) and the kernel package
//! (`apt-get download linux-image-6.1.0-N-amd64`, the newest apt offers, or
//! `--kernel-package`), unpacked under `target/ktls-vm/`; the host builds
//! (the debug `shunt`, the `tls` integration test binary); an initramfs
//! (busybox, the modules 9p, virtio and kTLS need with their dependencies
//! from each module's `depends=`, an `/init` script) written as a `newc`
//! cpio archive here, since the host may have no `cpio`; the boot, with the
//! host's root shared read-only over 9p. Inside, `/init` loads the modules,
//! mounts the host root and fresh /proc, /sys, /dev and /tmp over it, brings
//! up loopback and runs the chosen tests of the `tls` binary chrooted there
//! (so the host-built, dynamically linked binaries find their libraries).
//! Their output comes back on the serial console, which is saved to
//! `target/ktls-vm/console.log`; the command fails unless the guest reports
//! the tests' exit status 0.
//!
//! The guest runs under qemu's TCG emulator by default: slower (the bulk
//! test takes some 15 s there) but it boots anywhere, where KVM nested in
//! a Firecracker VM (this project's build machines) hung the guest kernel
//! right after its decompressor; `--kvm` asks for KVM.
//!
//! Under TCG the tests' bounds on start-up and on checks settling are
//! multiplied (`SHUNT_TEST_SLOWDOWN`, [`TCG_SLOWDOWN`]), and `--all` leaves
//! out the few tests that cannot hold on an emulated CPU ([`TCG_SKIPS`]),
//! each named with its reason on the console.
//!
//! Must not: touch the host's own kernel or modules, or leave qemu running
//! (it is killed at the time limit).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use xtask::proc;

/// The test run in the guest by default: several MiB both ways through a
/// terminated flow, half-closed, counted, with `show info`'s kTLS fields.
pub const DEFAULT_TEST: &str =
    "terminated_bytes_cross_exactly_both_ways_with_half_close_and_are_counted";

/// Modules the guest loads (their dependencies come along): the 9p share
/// over virtio-pci, the `tls` ULP, and the AEADs kTLS asks the crypto API
/// for (generic and x86 ones; a missing CPU feature only fails that insmod).
const ROOT_MODULES: &[&str] = &[
    "virtio_pci",
    "9pnet_virtio",
    "9p",
    "tls",
    "gcm",
    "ghash_generic",
    "ctr",
    "aesni_intel",
    "ghash_clmulni_intel",
    "chacha20poly1305",
    "chacha_generic",
    "poly1305_generic",
    "chacha_x86_64",
    "poly1305_x86_64",
];

/// The tests' `SHUNT_TEST_SLOWDOWN` under TCG: there a process takes seconds
/// to start (HAProxy some 6 s to open its stats socket, shunt's debug build
/// up to 10 s to load its BPF programs), where the tests' bounds on start-up
/// and on checks settling are 10 s.
const TCG_SLOWDOWN: &str = "5";

/// Tests `--all` leaves out under TCG (a named one still runs), each with
/// why, printed by the guest: what they check does not hold on an emulated
/// CPU, and is not kTLS's.
const TCG_SKIPS: &[(&str, &str)] = &[(
    "health_checks_speak_tls_as_haproxys_do",
    "HAProxy's TLS checks there take longer than their 200 ms inter (every \
     server stays L6TOUT); the test compares checks with HAProxy's, not kTLS, \
     and runs on the host",
)];

/// The line the guest prints last, with the tests' exit status.
const EXIT_MARK: &str = "ktls-vm: exit ";

pub struct Opts {
    pub kernel_package: Option<String>,
    /// Test names of the `tls` binary (exact); empty: [`DEFAULT_TEST`].
    pub tests: Vec<String>,
    /// All tests of the `tls` binary instead of named ones.
    pub all: bool,
    pub memory: String,
    pub limit: Duration,
    /// Boot under KVM instead of qemu's TCG emulator.
    pub kvm: bool,
}

pub fn run(opts: &Opts) -> Result<()> {
    let dir = xtask::target_dir().join("ktls-vm");
    fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    tools()?;
    let (vmlinuz, modules) = kernel(&dir, opts.kernel_package.as_deref())?;
    proc::cargo(&["build", "-p", "proxy"])?;
    let test_bin = tls_test_binary()?;
    let shunt = xtask::target_dir().join("debug").join("shunt");
    let script = guest_script(opts, &test_bin, &shunt);
    let initrd = dir.join("initrd.cpio");
    build_initrd(&initrd, &modules, &script)?;
    boot(&dir, &vmlinuz, &initrd, opts)
}

/// qemu and a static busybox, installed with apt-get when missing.
fn tools() -> Result<()> {
    let have = |p: &str| Path::new(p).exists();
    let mut missing = Vec::new();
    if !have("/usr/bin/qemu-system-x86_64") {
        missing.push("qemu-system-x86");
    }
    if !have("/bin/busybox")
        || !proc::output("file", &["-L", "/bin/busybox"]).is_none_or(|f| f.contains("static"))
    {
        missing.push("busybox-static");
    }
    if !missing.is_empty() {
        std::env::set_var("DEBIAN_FRONTEND", "noninteractive");
        let mut args = vec!["install", "-y", "--no-install-recommends"];
        args.extend(missing.iter().copied());
        proc::run("apt-get", &args)?;
    }
    Ok(())
}

/// The newest `linux-image-6.1.0-N-amd64` apt knows.
fn newest_kernel_package() -> Result<String> {
    let list = proc::output(
        "apt-cache",
        &[
            "search",
            "--names-only",
            "^linux-image-6\\.1\\.0-[0-9]+-amd64$",
        ],
    )
    .context("apt-cache search failed")?;
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|name| {
            let n: u32 = name
                .strip_prefix("linux-image-6.1.0-")?
                .strip_suffix("-amd64")?
                .parse()
                .ok()?;
            Some((n, name.to_string()))
        })
        .max()
        .map(|(_, name)| name)
        .context("apt offers no linux-image-6.1.0-N-amd64 package")
}

/// The kernel image and module tree of the package, downloaded and
/// unpacked once under `dir`.
fn kernel(dir: &Path, package: Option<&str>) -> Result<(PathBuf, PathBuf)> {
    let package = match package {
        Some(p) => p.to_string(),
        None => newest_kernel_package()?,
    };
    let release = package
        .strip_prefix("linux-image-")
        .context("kernel package name must start with linux-image-")?
        .to_string();
    let root = dir.join(format!("kernel-{release}"));
    let vmlinuz = root.join("boot").join(format!("vmlinuz-{release}"));
    let modules = root.join("lib/modules").join(&release);
    if !vmlinuz.is_file() {
        let debs = || -> Vec<PathBuf> {
            fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                        n.starts_with(&format!("{package}_")) && n.ends_with(".deb")
                    })
                })
                .collect()
        };
        if debs().is_empty() {
            println!("xtask: $ apt-get download {package} (in {})", dir.display());
            let st = Command::new("apt-get")
                .args(["download", &package])
                .current_dir(dir)
                .status()
                .context("cannot run apt-get")?;
            if !st.success() {
                bail!("apt-get download {package} failed: {st}");
            }
        }
        let deb = debs()
            .into_iter()
            .next()
            .context("the downloaded .deb is missing")?;
        let (deb, root_s) = (deb.display().to_string(), root.display().to_string());
        proc::run("dpkg-deb", &["-x", &deb, &root_s])?;
    }
    if !vmlinuz.is_file() || !modules.is_dir() {
        bail!(
            "{package} has no {} or {}",
            vmlinuz.display(),
            modules.display()
        );
    }
    let config = root.join("boot").join(format!("config-{release}"));
    if let Ok(c) = fs::read_to_string(&config) {
        if !c
            .lines()
            .any(|l| l == "CONFIG_TLS=m" || l == "CONFIG_TLS=y")
        {
            bail!("{package} is built without CONFIG_TLS");
        }
    }
    Ok((vmlinuz, modules))
}

/// The `tls` integration test binary, built on the host (its path is the
/// one cargo reports).
fn tls_test_binary() -> Result<PathBuf> {
    let args = [
        "test",
        "-p",
        "shunt-tests",
        "--test",
        "tls",
        "--no-run",
        "--message-format=json",
    ];
    println!("xtask: $ cargo {}", args.join(" "));
    let out = Command::new(proc::cargo_program())
        .args(args)
        .current_dir(xtask::workspace_root())
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run cargo")?;
    if !out.status.success() {
        bail!("building the tls test binary failed: {}", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let exe = text
        .lines()
        .filter(|l| l.contains("\"kind\":[\"test\"]") && l.contains("\"name\":\"tls\""))
        .find_map(|l| {
            let rest = l.split_once("\"executable\":\"")?.1;
            Some(PathBuf::from(rest.split_once('"')?.0))
        })
        .context("cargo reported no executable for the tls test")?;
    Ok(exe)
}

/// What the guest runs chrooted in the host's root.
fn guest_script(opts: &Opts, test_bin: &Path, shunt: &Path) -> String {
    let mut skipped = String::new();
    let filter = if opts.all {
        // `--exact`: each `--skip` names one test, whole.
        let mut f = String::from("--exact");
        for (name, why) in TCG_SKIPS.iter().filter(|_| !opts.kvm) {
            f.push_str(&format!(" --skip {name}"));
            skipped.push_str(&format!("echo \"ktls-vm: SKIPPED {name}: {why}\"\n"));
        }
        f
    } else if opts.tests.is_empty() {
        format!("--exact {DEFAULT_TEST}")
    } else {
        format!("--exact {}", opts.tests.join(" "))
    };
    // shunt's own log level in the tests (the host's choice, else info).
    let log = std::env::var("SHUNT_TEST_RUST_LOG").unwrap_or_else(|_| "info".into());
    // The host's choice, else the emulator's.
    let slowdown = std::env::var("SHUNT_TEST_SLOWDOWN").unwrap_or_else(|_| {
        match opts.kvm {
            true => "1",
            false => TCG_SLOWDOWN,
        }
        .into()
    });
    format!(
        "export HOME=/tmp PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
         SHUNT_BIN={shunt} RUST_BACKTRACE=1 SHUNT_TEST_LOG_DIR=/tmp/shunt-logs \
         SHUNT_TEST_RUST_LOG='{log}' SHUNT_TEST_SLOWDOWN={slowdown}\n\
         cd {root}\n\
         echo \"ktls-vm: kernel $(uname -r), ULPs: $(cat /proc/sys/net/ipv4/tcp_available_ulp)\"\n\
         echo \"ktls-vm: start-up and check bounds of the tests times {slowdown} (SHUNT_TEST_SLOWDOWN)\"\n\
         {skipped}\
         start=$(date +%s.%N)\n\
         {bin} {filter} --nocapture --test-threads=1\n\
         rc=$?\n\
         end=$(date +%s.%N)\n\
         echo \"ktls-vm: tests took $(awk \"BEGIN {{ print $end - $start }}\") s\"\n\
         if [ $rc -ne 0 ]; then for f in /tmp/shunt-logs/*; do \
         echo \"ktls-vm: == $f\"; tail -n 60 \"$f\"; done; fi\n\
         exit $rc\n",
        shunt = shunt.display(),
        root = xtask::workspace_root().display(),
        bin = test_bin.display(),
    )
}

/// The guest's `/init` (busybox sh).
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /host /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in /modules/*.ko; do
    insmod "$m" 2>/dev/null || echo "ktls-vm: insmod $m failed"
done
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro host /host; then
    echo "ktls-vm: cannot mount the host root"
    echo "ktls-vm: exit 125"
    poweroff -f
fi
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mount -t tmpfs tmp /host/tmp
mount -t bpf bpf /host/sys/fs/bpf 2>/dev/null
ifconfig lo 127.0.0.1 up
cp /run.sh /host/tmp/ktls-vm.sh
chroot /host /bin/sh /tmp/ktls-vm.sh
echo "ktls-vm: exit $?"
poweroff -f
"#;

/// A module's name as `depends=` spells it.
fn module_name(file: &Path) -> Option<String> {
    let n = file.file_name()?.to_str()?;
    let n = n.strip_suffix(".xz").unwrap_or(n);
    Some(n.strip_suffix(".ko")?.replace('-', "_"))
}

/// A module's bytes (decompressed when `.ko.xz`: busybox's insmod may not).
fn module_bytes(file: &Path) -> Result<Vec<u8>> {
    if file.extension().is_some_and(|e| e == "xz") {
        let out = Command::new("xz")
            .args(["-dc"])
            .arg(file)
            .output()
            .context("cannot run xz")?;
        if !out.status.success() {
            bail!("xz -dc {} failed", file.display());
        }
        return Ok(out.stdout);
    }
    fs::read(file).with_context(|| format!("read {}", file.display()))
}

/// The `depends=` of a module's `.modinfo`.
fn depends(ko: &[u8]) -> Vec<String> {
    let key = b"depends=";
    let Some(at) = ko.windows(key.len()).position(|w| w == key) else {
        return Vec::new();
    };
    let rest = &ko[at + key.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end])
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.replace('-', "_"))
        .collect()
}

fn all_modules(root: &Path, into: &mut BTreeMap<String, PathBuf>) {
    for e in fs::read_dir(root).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            all_modules(&p, into);
        } else if let Some(n) = module_name(&p) {
            into.insert(n, p);
        }
    }
}

/// `ROOT_MODULES` and their dependencies, each after what it depends on.
fn load_order(modules: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut index = BTreeMap::new();
    all_modules(modules, &mut index);
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    fn visit(
        name: &str,
        index: &BTreeMap<String, PathBuf>,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<(String, Vec<u8>)>,
    ) -> Result<()> {
        if !seen.insert(name.to_string()) {
            return Ok(());
        }
        // Built into this kernel, or absent: nothing to load.
        let Some(path) = index.get(name) else {
            return Ok(());
        };
        let bytes = module_bytes(path)?;
        for d in depends(&bytes) {
            visit(&d, index, seen, order)?;
        }
        order.push((name.to_string(), bytes));
        Ok(())
    }
    for m in ROOT_MODULES {
        visit(m, &index, &mut seen, &mut order)?;
    }
    for must in ["9p", "9pnet_virtio", "tls"] {
        if !order.iter().any(|(n, _)| n == must) {
            bail!("module {must} not found under {}", modules.display());
        }
    }
    Ok(order)
}

/// A `newc` cpio archive, the format the kernel unpacks as initramfs.
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn new() -> Self {
        Self {
            out: Vec::new(),
            ino: 1,
        }
    }

    fn pad4(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            0,
            0,
            name.len() as u32 + 1,
            0,
        ];
        self.ino += 1;
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad4();
        self.out.extend_from_slice(data);
        self.pad4();
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, &[]);
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, 0o100000 | mode, data);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

fn build_initrd(path: &Path, modules: &Path, script: &str) -> Result<()> {
    let busybox = fs::read("/bin/busybox").context("read /bin/busybox")?;
    let order = load_order(modules)?;
    let mut c = Cpio::new();
    for d in ["bin", "modules", "proc", "sys", "dev", "host", "tmp"] {
        c.dir(d);
    }
    c.file("bin/busybox", 0o755, &busybox);
    c.file("init", 0o755, INIT.as_bytes());
    c.file("run.sh", 0o644, script.as_bytes());
    let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
    for (i, (name, bytes)) in order.iter().enumerate() {
        c.file(&format!("modules/{i:02}-{name}.ko"), 0o644, bytes);
    }
    fs::write(path, c.finish()).with_context(|| format!("write {}", path.display()))?;
    println!(
        "xtask: initramfs {} with modules {}",
        path.display(),
        names.join(" ")
    );
    Ok(())
}

fn boot(dir: &Path, vmlinuz: &Path, initrd: &Path, opts: &Opts) -> Result<()> {
    let log_path = dir.join("console.log");
    let mut log = fs::File::create(&log_path).context("create console.log")?;
    let mut cmd = Command::new("qemu-system-x86_64");
    match opts.kvm {
        true => cmd.args(["-accel", "kvm", "-cpu", "host"]),
        false => cmd.args(["-accel", "tcg", "-cpu", "max"]),
    };
    cmd.args(["-smp", "2", "-m", &opts.memory])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args([
            "-append",
            "console=ttyS0 panic=-1 quiet",
            "-virtfs",
            "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    println!("xtask: booting {} in qemu", vmlinuz.display());
    let mut child = cmd.spawn().context("cannot start qemu-system-x86_64")?;
    let stdout = child.stdout.take().context("qemu stdout")?;
    let reader = std::thread::spawn(move || {
        let mut status = None;
        for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            let line = line.trim_end_matches('\r').to_string();
            println!("guest| {line}");
            let _ = writeln!(log, "{line}");
            if let Some(rc) = line.strip_prefix(EXIT_MARK) {
                status = rc.trim().parse::<i32>().ok();
            }
        }
        status
    });
    let deadline = Instant::now() + opts.limit;
    loop {
        if child.try_wait().context("wait for qemu")?.is_some() {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the guest did not finish in {:?} (console: {})",
                opts.limit,
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = reader.join().ok().flatten();
    match status {
        Some(0) => {
            println!(
                "xtask: kTLS guest run passed (console: {})",
                log_path.display()
            );
            Ok(())
        }
        Some(rc) => bail!(
            "the guest's tests exited {rc} (console: {})",
            log_path.display()
        ),
        None => bail!(
            "the guest reported no exit status (console: {})",
            log_path.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_are_read_from_modinfo() {
        let ko = b"\x7fELF...\0license=GPL\0depends=virtio,9pnet,virtio_ring\0vermagic=6.1\0";
        assert_eq!(depends(ko), ["virtio", "9pnet", "virtio_ring"]);
        assert!(depends(b"\0depends=\0").is_empty());
        assert_eq!(
            module_name(Path::new("/m/ghash-generic.ko.xz")).as_deref(),
            Some("ghash_generic")
        );
    }

    #[test]
    fn all_under_tcg_skips_by_name_and_says_why() {
        let mut opts = Opts {
            kernel_package: None,
            tests: Vec::new(),
            all: true,
            memory: "1G".into(),
            limit: Duration::from_secs(1),
            kvm: false,
        };
        let (bin, shunt) = (Path::new("/t/tls"), Path::new("/t/shunt"));
        let (name, _) = TCG_SKIPS[0];
        let tcg = guest_script(&opts, bin, shunt);
        assert!(tcg.contains(&format!("/t/tls --exact --skip {name} --nocapture")));
        assert!(tcg.contains(&format!("ktls-vm: SKIPPED {name}: ")));
        opts.kvm = true;
        let kvm = guest_script(&opts, bin, shunt);
        assert!(!kvm.contains("--skip") && !kvm.contains("SKIPPED"));
    }

    #[test]
    fn cpio_entries_are_newc_and_aligned() {
        let mut c = Cpio::new();
        c.file("init", 0o755, b"abc");
        let out = c.finish();
        assert!(out.starts_with(b"070701"));
        assert!(out.len().is_multiple_of(4));
        // Header (110) + "init\0" (5) padded to 116, data 3 padded to 4.
        assert_eq!(&out[110..115], b"init\0");
        assert_eq!(&out[116..119], b"abc");
        assert!(out.windows(10).any(|w| w == b"TRAILER!!!"));
    }
}
