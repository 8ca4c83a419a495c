//! Builds shunt's eBPF object without bpf-linker (plain std Rust, no deps).
//!
//! Used twice: as a module of `xtask` (`cargo xtask build`), and textually
//! included by `proxy/build.rs`, which embeds the object in `shunt`. It must
//! therefore stay dependency-free and must never install anything on its own
//! except through [`ensure_toolchain`], which only the xtask calls.
//!
//! # The pipeline (overview and the callers: docs/ebpf-build.md)
//! 1. `rustup run nightly cargo build --release --target bpfel-unknown-none
//!    -Z build-std=core` on `proxy-ebpf/`, with its own `--target-dir` (so a
//!    nested build from `build.rs` never waits on the outer cargo's lock). On
//!    that target every object rustc writes is LLVM bitcode, so the rlibs of
//!    the crate and of its dependencies (core included) hold bitcode.
//! 2. The bitcode members are extracted with the nightly's `llvm-ar` and linked
//!    with its `llvm-link --only-needed`, the eBPF crate's module first.
//!    `--only-needed` pulls from a module only what is undefined when that
//!    module is reached, so a dependency listed before the module that uses
//!    it (aya-ebpf-bindings' ring-buffer helpers, used by aya-ebpf) would be
//!    missed: the link is repeated with the modules that define a symbol still
//!    undefined until none does (at most [`MAX_LINK_ROUNDS`] rounds).
//! 3. `opt`: internalize everything but the crate's unmangled exports (programs,
//!    maps, `LICENSE`), the library globals the loader looks up by name
//!    ([`KEEP_LIBRARY_GLOBALS`]: aya-log's ring buffer and level) and the mem*
//!    builtins, `-cold-callsite-rel-freq=0` so forced inlining really happens,
//!    O3, drop dead globals and debug info.
//! 4. `llc -march=bpfel -mcpu=v3 -bpf-expand-memcpy-in-order
//!    -bpf-disable-trap-unreachable` (LLVM 22 otherwise emits `__bpf_trap`
//!    calls that no loader accepts).
//! 5. The object is checked with `llvm-readobj` before it is copied to the
//!    output directory: no undefined symbol, no `__bpf_trap`, the sections
//!    `license`, `maps` and `sk_skb/stream_verdict` present and non-empty, and
//!    every kept name the linked module defined still a defined global symbol
//!    (so a map or global the loader needs was not internalized away).
//!
//! Invariant: [`build_ebpf`] either returns the path of an object that passed
//! the check, or an error that says which step failed and what to do.

// Two users (xtask, proxy/build.rs) each call a subset of this module.
#![allow(dead_code)]

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// File name of the checked object in the output directory.
pub const OBJECT_NAME: &str = "shunt.bpf.o";
/// Toolchain that builds the eBPF crate (build-std needs nightly).
pub const NIGHTLY: &str = "nightly";
/// The one command that installs what the pipeline needs.
pub const SETUP_COMMAND: &str = "rustup component add rust-src llvm-tools --toolchain nightly";
/// Rust target of the eBPF crate.
const BPF_TARGET: &str = "bpfel-unknown-none";
/// BPF ISA level: v3 (ALU32, JMP32) is loadable on every kernel >= 5.1.
const BPF_CPU: &str = "v3";
/// The eBPF crate, relative to the workspace root.
const EBPF_CRATE: &str = "proxy-ebpf";
/// File stem of the eBPF crate's rlib (`libproxy_ebpf.rlib` as cargo uplifts
/// it, or `libproxy_ebpf-<hash>.rlib`); its module is linked first.
const EBPF_RLIB_STEM: &str = "libproxy_ebpf";
/// Sections the object must have for the loader and the kernel to accept it.
pub const REQUIRED_SECTIONS: [&str; 3] = ["license", "maps", "sk_skb/stream_verdict"];
/// Builtins kept exported even when unused, as bpf-linker does.
const KEEP_BUILTINS: [&str; 5] = ["memcpy", "memmove", "memset", "memcmp", "bcmp"];
/// Unmangled globals defined by dependencies (not the eBPF crate) that the
/// loader finds by name: aya-log-ebpf's ring buffer map (`AYA_LOGS`, taken by
/// `aya_log::EbpfLogger`) and its level (`AYA_LOG_LEVEL`, overridden at load).
/// Kept exported when the linked module defines them (i.e. a log macro is used).
pub const KEEP_LIBRARY_GLOBALS: [&str; 2] = ["AYA_LOGS", "AYA_LOG_LEVEL"];
/// LLVM tools the pipeline runs, all from the nightly's `llvm-tools` component.
const LLVM_TOOLS: [&str; 6] = [
    "llvm-ar",
    "llvm-link",
    "opt",
    "llc",
    "llvm-nm",
    "llvm-readobj",
];
/// Environment passed to the nested cargo; everything else (RUSTC,
/// RUSTFLAGS, CARGO_TARGET_DIR, jobserver fds, ... from an outer cargo) is
/// dropped so the nested build uses the nightly and only its own settings.
const ENV_KEEP: [&str; 15] = [
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "RUSTUP_HOME",
    "CARGO_HOME",
    "CARGO_NET_OFFLINE",
    "CARGO_HTTP_PROXY",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "NO_PROXY",
];
/// Bound on the relink rounds of step 2 (each round resolves at least one
/// more level of the dependency graph; the graph here is a few levels deep).
const MAX_LINK_ROUNDS: usize = 16;
/// Longest tail of a failing tool's stderr quoted in an error.
const STDERR_TAIL: usize = 4000;

/// Where the nightly toolchain and its LLVM tools live.
#[derive(Debug, Clone)]
pub struct Toolchain {
    /// `rustc +nightly --print sysroot`.
    pub sysroot: PathBuf,
    /// Directory holding `llvm-link`, `opt`, `llc`, ...
    pub llvm_bin: PathBuf,
}

impl Toolchain {
    fn tool(&self, name: &str) -> PathBuf {
        self.llvm_bin.join(name)
    }
}

/// Finds the nightly toolchain, its `rust-src` and its LLVM tools, without
/// installing anything. The error names what is missing and the set-up command.
pub fn check_toolchain() -> Result<Toolchain, String> {
    let out = run_output(
        clean_command("rustup").args(["run", NIGHTLY, "rustc", "--print", "sysroot"]),
        "rustup run nightly rustc --print sysroot",
    )
    .map_err(|e| format!("the nightly toolchain is not usable ({e}); run `{SETUP_COMMAND}`"))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let host = host_triple(&sysroot)?;
    let llvm_bin = sysroot.join("lib/rustlib").join(host).join("bin");
    let mut missing = Vec::new();
    if !sysroot
        .join("lib/rustlib/src/rust/library/core/Cargo.toml")
        .is_file()
    {
        missing.push("rust-src".to_string());
    }
    for tool in LLVM_TOOLS {
        if !llvm_bin.join(tool).is_file() {
            missing.push(format!("llvm-tools ({tool})"));
        }
    }
    if missing.is_empty() {
        Ok(Toolchain { sysroot, llvm_bin })
    } else {
        Err(format!(
            "nightly toolchain at {} lacks {}; run `{SETUP_COMMAND}` \
             (or build with SHUNT_NO_BPF=1 to ship without the BPF object)",
            sysroot.display(),
            missing.join(", ")
        ))
    }
}

/// Makes sure the nightly toolchain has `rust-src` and `llvm-tools`,
/// running [`SETUP_COMMAND`] when they are missing.
pub fn ensure_toolchain() -> Result<(), String> {
    if check_toolchain().is_ok() {
        return Ok(());
    }
    let installed = clean_command("rustup")
        .args(["toolchain", "list"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.starts_with("nightly"))
        })
        .unwrap_or(false);
    if !installed {
        run_output(
            clean_command("rustup").args(["toolchain", "install", NIGHTLY, "--profile", "minimal"]),
            "rustup toolchain install nightly --profile minimal",
        )?;
    }
    run_output(
        clean_command("rustup").args([
            "component",
            "add",
            "rust-src",
            "llvm-tools",
            "--toolchain",
            NIGHTLY,
        ]),
        SETUP_COMMAND,
    )?;
    check_toolchain().map(|_| ())
}

/// Default directory of the nested build: `$CARGO_TARGET_DIR/ebpf` or
/// `<workspace>/target/ebpf`, shared by every profile of the outer build so
/// `core` is compiled for BPF once.
pub fn default_target_dir(workspace_root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            let dir = if dir.is_absolute() {
                dir
            } else {
                workspace_root.join(dir)
            };
            dir.join("ebpf")
        }
        _ => workspace_root.join("target").join("ebpf"),
    }
}

/// Builds, links and checks the eBPF object; returns `out_dir/shunt.bpf.o`.
pub fn build_ebpf(workspace_root: &Path, out_dir: &Path) -> Result<PathBuf, String> {
    build_ebpf_in(workspace_root, out_dir, &default_target_dir(workspace_root))
}

/// [`build_ebpf`] with an explicit target directory for the nested cargo.
pub fn build_ebpf_in(
    workspace_root: &Path,
    out_dir: &Path,
    target_dir: &Path,
) -> Result<PathBuf, String> {
    let tc = check_toolchain()?;
    let rlibs = cargo_build(workspace_root, target_dir)?;
    // Per output directory: two outer builds (say `cargo test` and a release
    // build) may run this at once; the nested cargo serializes on its own
    // lock, but the link steps must not share a scratch directory.
    let work = out_dir.join("ebpf-link");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| format!("mkdir {}: {e}", work.display()))?;

    let (main_bc, dep_bcs) = extract_bitcode(&tc, &rlibs, &work)?;
    let exports = exported_symbols(&tc, &main_bc)?;
    if exports.is_empty() {
        return Err(format!("{} exports no unmangled symbol", main_bc.display()));
    }

    let linked = link_bitcode(&tc, &main_bc, &dep_bcs, &work)?;

    // Library globals present after linking (absent when nothing uses them).
    let linked_defs = defined_symbols(&tc, &linked)?;
    let mut must_define: Vec<&str> = exports.iter().map(String::as_str).collect();
    must_define.extend(
        KEEP_LIBRARY_GLOBALS
            .into_iter()
            .filter(|name| linked_defs.iter().any(|d| d == name)),
    );

    let optimized = work.join("opt.bc");
    let mut keep = must_define.clone();
    keep.extend(KEEP_BUILTINS);
    let mut opt = Command::new(tc.tool("opt"));
    opt.arg("-cold-callsite-rel-freq=0")
        .arg("-strip-debug")
        .arg(format!("-internalize-public-api-list={}", keep.join(",")))
        .arg("-passes=internalize,default<O3>,globaldce,strip-dead-prototypes")
        .arg(&linked)
        .arg("-o")
        .arg(&optimized);
    run_output(&mut opt, "opt")?;

    let object = work.join(OBJECT_NAME);
    let mut llc = Command::new(tc.tool("llc"));
    llc.args(["-march=bpfel", "-filetype=obj", "-O3"])
        .arg(format!("-mcpu={BPF_CPU}"))
        .arg("-bpf-expand-memcpy-in-order")
        .arg("-bpf-disable-trap-unreachable")
        .arg(&optimized)
        .arg("-o")
        .arg(&object);
    run_output(&mut llc, "llc")?;

    check_object(&tc, &object, &must_define)?;
    fs::create_dir_all(out_dir).map_err(|e| format!("mkdir {}: {e}", out_dir.display()))?;
    let dest = out_dir.join(OBJECT_NAME);
    fs::copy(&object, &dest)
        .map_err(|e| format!("copy {} -> {}: {e}", object.display(), dest.display()))?;
    Ok(dest)
}

/// Step 2: links the crate's module with what it needs of `deps`, relinking
/// until no symbol left undefined is defined by one of them.
fn link_bitcode(
    tc: &Toolchain,
    main_bc: &Path,
    deps: &[PathBuf],
    work: &Path,
) -> Result<PathBuf, String> {
    let mut dep_defs = Vec::with_capacity(deps.len());
    for dep in deps {
        dep_defs.push(defined_symbols(tc, dep)?);
    }
    let mut input = main_bc.to_path_buf();
    let mut round_deps: Vec<&PathBuf> = deps.iter().collect();
    for round in 0..MAX_LINK_ROUNDS {
        let linked = work.join(format!("linked{round}.bc"));
        let mut link = Command::new(tc.tool("llvm-link"));
        link.arg("--only-needed")
            .arg(&input)
            .args(&round_deps)
            .arg("-o")
            .arg(&linked);
        run_output(&mut link, "llvm-link")?;
        let undefined = undefined_symbols(tc, &linked)?;
        round_deps = deps
            .iter()
            .zip(&dep_defs)
            .filter(|(_, defs)| defs.iter().any(|d| undefined.contains(d)))
            .map(|(dep, _)| dep)
            .collect();
        if round_deps.is_empty() {
            return Ok(linked);
        }
        input = linked;
    }
    Err(format!(
        "llvm-link: symbols still unresolved after {MAX_LINK_ROUNDS} rounds"
    ))
}

/// Checks an object: no undefined symbols, no `__bpf_trap`, every
/// [`REQUIRED_SECTIONS`] present and non-empty, every name of `globals`
/// a defined `GLOBAL` symbol.
pub fn check_object(tc: &Toolchain, object: &Path, globals: &[&str]) -> Result<(), String> {
    let mut readobj = Command::new(tc.tool("llvm-readobj"));
    readobj
        .args(["--elf-output-style=GNU", "--sections", "--symbols"])
        .arg(object);
    let out = run_output(&mut readobj, "llvm-readobj")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut problems = Vec::new();
    if text.contains("__bpf_trap") {
        problems.push("references __bpf_trap".to_string());
    }
    let mut defined_globals = Vec::new();
    for line in text.lines() {
        // Symbol rows: "Num: Value Size Type Bind Vis Ndx Name"; row 0 is the
        // null symbol, which is UND by definition and has no name.
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() >= 8 && cols[0].ends_with(':') {
            if cols[6] == "UND" {
                problems.push(format!("undefined symbol {}", cols[7]));
            } else if cols[4] == "GLOBAL" {
                defined_globals.push(cols[7]);
            }
        }
    }
    for name in globals {
        if !defined_globals.contains(name) {
            problems.push(format!(
                "{name} is not a defined global symbol (internalized?)"
            ));
        }
    }
    for section in REQUIRED_SECTIONS {
        match section_size(&text, section) {
            Some(size) if size > 0 => {}
            Some(_) => problems.push(format!("section {section} is empty")),
            None => problems.push(format!("section {section} is missing")),
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} failed the check: {}",
            object.display(),
            problems.join("; ")
        ))
    }
}

/// Size of a section from `llvm-readobj --elf-output-style=GNU --sections`.
fn section_size(readobj: &str, name: &str) -> Option<u64> {
    readobj.lines().find_map(|line| {
        // "  [ 5] license   PROGBITS  <addr> <off> <size> ..."
        let rest = line.trim_start().strip_prefix('[')?;
        let rest = rest.split_once(']')?.1;
        let cols: Vec<&str> = rest.split_whitespace().collect();
        if cols.first() == Some(&name) && cols.len() >= 5 {
            u64::from_str_radix(cols[4], 16).ok()
        } else {
            None
        }
    })
}

/// Runs the nested nightly cargo and returns the BPF-target rlibs it produced
/// (fresh or rebuilt), from its JSON artifact messages.
fn cargo_build(workspace_root: &Path, target_dir: &Path) -> Result<Vec<PathBuf>, String> {
    let manifest = workspace_root.join(EBPF_CRATE).join("Cargo.toml");
    let mut cargo = clean_command("rustup");
    cargo
        .args(["run", NIGHTLY, "cargo", "build", "--release", "--locked"])
        .args(["--target", BPF_TARGET, "-Z", "build-std=core"])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(target_dir)
        .arg("--message-format=json-render-diagnostics")
        // Debug info would become BTF the kernel rejects unsanitized.
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("-C\x1fdebuginfo=0\x1f-C\x1ftarget-cpu={BPF_CPU}"),
        );
    let out = run_output(&mut cargo, "nightly cargo build of proxy-ebpf")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut rlibs = Vec::new();
    for line in stdout
        .lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\""))
    {
        for file in json_string_array(line, "\"filenames\":[") {
            let path = PathBuf::from(file);
            let is_rlib = path.extension().is_some_and(|e| e == "rlib");
            if is_rlib && path.components().any(|c| c.as_os_str() == BPF_TARGET) {
                rlibs.push(path);
            }
        }
    }
    if rlibs.is_empty() {
        return Err("nightly cargo reported no BPF rlib (see its output)".to_string());
    }
    Ok(rlibs)
}

/// The strings of a flat JSON string array that follows `key` on `line`.
/// Cargo's paths need no unescaping on Linux except `\\` and `\"`.
fn json_string_array(line: &str, key: &str) -> Vec<String> {
    let Some(start) = line.find(key) else {
        return Vec::new();
    };
    let rest = &line[start + key.len()..];
    let Some(end) = rest.find(']') else {
        return Vec::new();
    };
    rest[..end]
        .split("\",\"")
        .map(|s| {
            s.trim_matches('"')
                .replace("\\\\", "\\")
                .replace("\\\"", "\"")
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// Extracts the bitcode members of every rlib into `work`; returns the eBPF
/// crate's module and the others.
fn extract_bitcode(
    tc: &Toolchain,
    rlibs: &[PathBuf],
    work: &Path,
) -> Result<(PathBuf, Vec<PathBuf>), String> {
    let mut main = None;
    let mut deps = Vec::new();
    for (i, rlib) in rlibs.iter().enumerate() {
        let dir = work.join(format!("rlib{i}"));
        fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let mut ar = Command::new(tc.tool("llvm-ar"));
        ar.arg("x")
            .arg(format!("--output={}", dir.display()))
            .arg(rlib);
        run_output(&mut ar, "llvm-ar x")?;
        let is_main = rlib.file_stem().is_some_and(|n| {
            let n = n.to_string_lossy();
            n == EBPF_RLIB_STEM || n.starts_with(&format!("{EBPF_RLIB_STEM}-"))
        });
        let entries = fs::read_dir(&dir).map_err(|e| format!("read {}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry
                .map_err(|e| format!("read {}: {e}", dir.display()))?
                .path();
            if path.extension().is_some_and(|e| e == "o") && is_bitcode(&path) {
                if is_main && main.is_none() {
                    main = Some(path);
                } else {
                    deps.push(path);
                }
            }
        }
    }
    let main = main.ok_or_else(|| format!("no bitcode found in {EBPF_RLIB_STEM}.rlib"))?;
    deps.sort();
    Ok((main, deps))
}

/// True when the file starts with LLVM's raw or wrapped bitcode magic.
fn is_bitcode(path: &Path) -> bool {
    let Ok(bytes) = fs::read(path) else {
        return false;
    };
    bytes.starts_with(b"BC\xC0\xDE") || bytes.starts_with(&[0xDE, 0xC0, 0x17, 0x0B])
}

/// Unmangled symbols the eBPF crate defines: its programs, maps and LICENSE.
fn exported_symbols(tc: &Toolchain, main_bc: &Path) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = defined_symbols(tc, main_bc)?
        .into_iter()
        .filter(|s| !s.starts_with("_ZN") && !s.starts_with("_R"))
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// Every external symbol a bitcode module defines (`llvm-nm`).
fn defined_symbols(tc: &Toolchain, module: &Path) -> Result<Vec<String>, String> {
    nm_symbols(tc, module, "--defined-only")
}

/// Every symbol a bitcode module references without defining it.
fn undefined_symbols(tc: &Toolchain, module: &Path) -> Result<Vec<String>, String> {
    nm_symbols(tc, module, "--undefined-only")
}

fn nm_symbols(tc: &Toolchain, module: &Path, which: &str) -> Result<Vec<String>, String> {
    let mut nm = Command::new(tc.tool("llvm-nm"));
    nm.args([which, "--extern-only", "--format=just-symbols"])
        .arg(module);
    let out = run_output(&mut nm, "llvm-nm")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect())
}

/// Host triple of the toolchain (where its `llvm-tools` binaries live).
fn host_triple(sysroot: &Path) -> Result<String, String> {
    let out = run_output(
        clean_command("rustup").args(["run", NIGHTLY, "rustc", "-vV"]),
        "rustup run nightly rustc -vV",
    )?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .ok_or_else(|| format!("no host triple from the rustc at {}", sysroot.display()))
}

/// A command whose environment holds only [`ENV_KEEP`] and `CARGO_REGISTRIES_*`.
fn clean_command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear();
    for (key, value) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if ENV_KEEP.contains(&k.as_ref()) || k.starts_with("CARGO_REGISTRIES_") {
            cmd.env(&key, &value);
        }
    }
    cmd
}

/// Runs a command to completion; a spawn failure or a non-zero exit becomes
/// an error naming `what` with the tail of its stderr.
fn run_output(cmd: &mut Command, what: &str) -> Result<Output, String> {
    let out = cmd.output().map_err(|e| {
        let program: OsString = cmd.get_program().to_os_string();
        format!("{what}: cannot run {}: {e}", program.to_string_lossy())
    })?;
    if out.status.success() {
        return Ok(out);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail_start = stderr.len().saturating_sub(STDERR_TAIL);
    let tail_start = (tail_start..stderr.len())
        .find(|&i| stderr.is_char_boundary(i))
        .unwrap_or(0);
    Err(format!(
        "{what} failed ({}):\n{}",
        out.status,
        &stderr[tail_start..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_section_sizes_from_readobj_output() {
        let text = "  [ 3] sk_skb/stream_verdict PROGBITS    0000000000000000 000040 0003d0 00  AX  0   0  8\n\
                    \x20 [ 5] license           PROGBITS        0000000000000000 000410 000004 00   A  0   0  1\n";
        assert_eq!(section_size(text, "sk_skb/stream_verdict"), Some(0x3d0));
        assert_eq!(section_size(text, "license"), Some(4));
        assert_eq!(section_size(text, "maps"), None);
    }

    #[test]
    fn parses_cargo_filenames() {
        let line = r#"{"reason":"compiler-artifact","filenames":["/t/a.rlib","/t/a.rmeta"],"x":1}"#;
        assert_eq!(
            json_string_array(line, "\"filenames\":["),
            vec!["/t/a.rlib", "/t/a.rmeta"]
        );
        assert!(json_string_array(line, "\"nope\":[").is_empty());
    }
}
