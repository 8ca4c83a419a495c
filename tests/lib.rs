//! Helpers for shunt's integration tests: run the real `shunt` binary on a
//! generated configuration, and small in-process peers (echo, sink, scripted
//! servers) on 127.0.0.1 port 0.
//!
//! Tests find the binary with [`shunt_bin`]: `$SHUNT_BIN`, else the workspace's
//! `target/debug/shunt` (built by `cargo xtask test` before the tests run).
//!
//! The servers, the pattern streams, the stats socket client and the `show stat` /
//! `show info` parsers are the ones the demo and the bench use too (crate
//! `shunt_testkit`, tests/kit); here they are re-exported, or wrapped into the
//! panicking form a test wants. The reload tests' helpers (configurations, the
//! connection loop, long-lived flows) are in [`reload`].

#[path = "harness/http.rs"]
pub mod http;
#[path = "harness/reload.rs"]
pub mod reload;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use shunt_testkit::stats;
pub use shunt_testkit::{echo_until_eof, listen_deep, pattern, Server};

/// How long shunt may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shunt may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `cli` waits for each read of an answer.
const CLI_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest `SHUNT_TEST_SLOWDOWN`: past it a bound no longer bounds anything.
const MAX_SLOWDOWN: u32 = 20;

/// `d` times `SHUNT_TEST_SLOWDOWN` (1 when unset; at most [`MAX_SLOWDOWN`]):
/// the bounds on starting a process or on health checks settling were set
/// on the machines CI runs on, and a much slower one sets the factor (the
/// emulated guest of `cargo xtask ktls-vm`, where HAProxy takes some 6 s to
/// open its stats socket). Bounds on the proxy's own behaviour stay as
/// they are.
pub fn slow(d: Duration) -> Duration {
    let factor = match std::env::var("SHUNT_TEST_SLOWDOWN") {
        Err(_) => 1,
        Ok(v) => v
            .parse::<u32>()
            .ok()
            .filter(|f| (1..=MAX_SLOWDOWN).contains(f))
            .unwrap_or_else(|| {
                panic!("SHUNT_TEST_SLOWDOWN={v:?}: want a whole factor from 1 to {MAX_SLOWDOWN}")
            }),
    };
    d * factor
}

/// Path of the shunt binary under test.
pub fn shunt_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SHUNT_BIN") {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/shunt");
    assert!(
        p.exists(),
        "shunt binary not found at {} (run `cargo build -p proxy` or set SHUNT_BIN)",
        p.display()
    );
    p
}

/// A port free at the time of the call (bind to 0, read it, close).
pub fn free_port() -> u16 {
    shunt_testkit::free_port().expect("bind 127.0.0.1:0")
}

/// A loopback address where nobody listens, reserved while this lives: a TCP
/// socket is bound to it and never listens, so connections are refused and no
/// other test (in this binary or another one running at once) can take the
/// port meanwhile, as it could after [`free_port`] released it.
pub struct DeadAddr {
    pub addr: SocketAddr,
    _held: socket2::Socket,
}

pub fn dead_addr() -> DeadAddr {
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    sock.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind 127.0.0.1:0");
    let addr = sock
        .local_addr()
        .expect("local_addr")
        .as_socket()
        .expect("an inet address");
    DeadAddr { addr, _held: sock }
}

/// A scratch directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "shunt-test-{}-{}-{}",
            tag,
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run `shunt -c -f FILE...`; returns (exit code, stdout, stderr).
pub fn check_config(files: &[&Path]) -> (i32, String, String) {
    let mut cmd = Command::new(shunt_bin());
    cmd.arg("-c");
    for f in files {
        cmd.arg("-f").arg(f);
    }
    let out = cmd.output().expect("run shunt -c");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A running shunt process, stopped (SIGTERM) on drop.
pub struct Shunt {
    child: Option<Child>,
    dir: TempDir,
}

impl Shunt {
    /// Start shunt with `cfg` and extra arguments; wait until it has bound its
    /// listeners (it logs "shunt started").
    pub fn start(cfg: &str, args: &[&str]) -> Shunt {
        Self::start_with(&[], cfg, args)
    }

    /// [`Shunt::start`] with `cmd_prefix` run in front of the binary (e.g.
    /// `setpriv --reuid=65534 ...`); see [`Shunt::spawn_with`].
    pub fn start_with(cmd_prefix: &[&str], cfg: &str, args: &[&str]) -> Shunt {
        let mut s = Self::spawn_with(cmd_prefix, cfg, args);
        let t0 = Instant::now();
        while !s.stderr().contains("shunt started") {
            if let Some(st) = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("shunt exited early ({st}); stderr:\n{}", s.stderr());
            }
            let limit = slow(START_TIMEOUT);
            assert!(
                t0.elapsed() < limit,
                "shunt did not start in {limit:?}; stderr:\n{}",
                s.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    /// Spawn `cmd_prefix... shunt -f CFG args...` without waiting for it to
    /// start (for runs expected to fail; see [`Shunt::wait`]). The scratch
    /// directory is made mode 0777 and the config 0644 so that a shunt run as
    /// another user can read its config and create its stats socket; with a
    /// prefix, the binary is reached through a link (or copy) in the scratch
    /// directory, since the build tree may not be searchable by that user.
    pub fn spawn_with(cmd_prefix: &[&str], cfg: &str, args: &[&str]) -> Shunt {
        use std::os::unix::fs::PermissionsExt;
        let dir = TempDir::new("shunt");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod scratch dir");
        let cfg_path = dir.path().join("shunt.cfg");
        let cfg = cfg.replace("@DIR@", &dir.path().display().to_string());
        std::fs::write(&cfg_path, cfg).expect("write config");
        std::fs::set_permissions(&cfg_path, std::fs::Permissions::from_mode(0o644))
            .expect("chmod config");
        let log = std::fs::File::create(dir.path().join("stderr")).expect("log file");
        let mut cmd = match cmd_prefix.split_first() {
            None => Command::new(shunt_bin()),
            Some((first, rest)) => {
                let bin = dir.path().join("shunt");
                if std::fs::hard_link(shunt_bin(), &bin).is_err() {
                    std::fs::copy(shunt_bin(), &bin).expect("copy shunt binary");
                }
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
        };
        let child = cmd
            .arg("-f")
            .arg(&cfg_path)
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("SHUNT_TEST_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn shunt");
        Shunt {
            child: Some(child),
            dir,
        }
    }

    /// The scratch directory (`@DIR@` in the config).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `@DIR@/admin.sock`, the stats socket of configs made by [`simple_config`].
    pub fn sock(&self) -> PathBuf {
        self.dir.path().join("admin.sock")
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// Send a signal to shunt.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) with a pid we spawned and still own; no memory involved.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    /// Wait for exit (bounded); returns the exit code.
    pub fn wait(&mut self, limit: Duration) -> Option<i32> {
        let t0 = Instant::now();
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                self.child = None;
                return Some(st.code().unwrap_or(-1));
            }
            if t0.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Shunt {
    fn drop(&mut self) {
        // Debugging aid: keep shunt's log when SHUNT_TEST_LOG_DIR is set.
        if let Some(dir) = std::env::var_os("SHUNT_TEST_LOG_DIR") {
            let _ = std::fs::create_dir_all(&dir);
            let name = format!("shunt-{}.log", self.pid());
            let _ = std::fs::copy(self.dir.path().join("stderr"), Path::new(&dir).join(name));
        }
        if self.child.is_some() {
            self.signal(libc::SIGTERM);
            if self.wait(STOP_TIMEOUT).is_none() {
                if let Some(c) = self.child.as_mut() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
        }
    }
}

/// Connect with a bounded retry (shunt may be just starting).
pub fn connect(addr: SocketAddr) -> TcpStream {
    let t0 = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return s,
            Err(e) if t0.elapsed() > Duration::from_secs(5) => panic!("connect {addr}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// SHA-256 hex of a byte slice.
/// Resident size of process `pid`, in bytes (`VmRSS` of `/proc/PID/status`).
pub fn vm_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {status}"));
    kb * 1024
}

pub fn sha256(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(data);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Write `data` in random-sized chunks (1..=max) then optionally shut down writes.
pub fn write_random_chunks(s: &mut TcpStream, data: &[u8], max: usize, seed: u64) {
    let mut x = seed | 1;
    let mut off = 0;
    while off < data.len() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = (1 + (x as usize) % max).min(data.len() - off);
        s.write_all(&data[off..off + n]).expect("write chunk");
        off += n;
    }
}

/// Read until EOF; returns the bytes.
pub fn read_to_end(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut v = Vec::new();
    s.read_to_end(&mut v)?;
    Ok(v)
}

/// The modes every forwarding test runs in.
pub const USERSPACE_MODES: [&str; 2] = ["copy", "splice"];

/// A minimal config: one frontend on `port` to one backend with `servers`.
pub fn simple_config(port: u16, servers: &[SocketAddr], extra_backend: &str) -> String {
    let mut cfg = format!(
        "global\n    nbthread 2\n    stats socket @DIR@/admin.sock level admin\n\ndefaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\nfrontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n\nbackend be\n{extra_backend}"
    );
    for (i, s) in servers.iter().enumerate() {
        cfg.push_str(&format!("    server s{} {}\n", i + 1, s));
    }
    cfg
}

/// Ask a stats socket one command (non-interactive) and return the answer; waits up
/// to `CLI_READ_TIMEOUT` for each read, as long as it takes to write, and reads the
/// whole answer.
pub fn cli(sock: &Path, cmd: &str) -> String {
    let bounds = stats::Bounds {
        read: Some(CLI_READ_TIMEOUT),
        write: None,
        max_answer: u64::MAX,
    };
    stats::command(sock, cmd, bounds).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `show stat` as rows of (pxname, svname) → column → value. `check_status`
/// comes without the `* ` that marks a check running at that instant (HAProxy's
/// marker, which [`show_stat_raw`] keeps): tests wait for a status, whether or
/// not the next check has started.
pub fn show_stat(sock: &Path) -> Vec<HashMap<String, String>> {
    let mut rows = show_stat_raw(sock);
    for r in &mut rows {
        if let Some(v) = r.get_mut("check_status") {
            if let Some(rest) = v.strip_prefix("* ") {
                *v = rest.to_string();
            }
        }
    }
    rows
}

/// `show stat` as rows of (pxname, svname) → column → value, as sent.
pub fn show_stat_raw(sock: &Path) -> Vec<HashMap<String, String>> {
    stats::parse_show_stat(&cli(sock, "show stat"))
        .unwrap_or_else(|e| panic!("{e:#}"))
        .into_iter()
        .map(|row| row.0.into_iter().collect())
        .collect()
}

/// The `show stat` row of (pxname, svname), column → value; panics when absent.
pub fn stat_row(sock: &Path, px: &str, sv: &str) -> HashMap<String, String> {
    show_stat(sock)
        .into_iter()
        .find(|r| {
            r.get("pxname").map(String::as_str) == Some(px)
                && r.get("svname").map(String::as_str) == Some(sv)
        })
        .unwrap_or_else(|| panic!("no stat row {px}/{sv}"))
}

/// One numeric `show stat` value for (pxname, svname, column).
pub fn stat(sock: &Path, px: &str, sv: &str, col: &str) -> u64 {
    stat_row(sock, px, sv)
        .get(col)
        .unwrap_or_else(|| panic!("no column {col}"))
        .parse()
        .unwrap_or(0)
}

/// Poll `f` every 20 ms until it holds; panic naming `what` after `limit`.
pub fn eventually(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `show info` as key → value.
pub fn show_info(sock: &Path) -> HashMap<String, String> {
    stats::parse_show_info(&cli(sock, "show info"))
        .into_iter()
        .collect()
}

/// One numeric `show info` field.
pub fn info_u64(sock: &Path, key: &str) -> u64 {
    show_info(sock)
        .get(key)
        .unwrap_or_else(|| panic!("no show info field {key}"))
        .parse()
        .unwrap_or_else(|_| panic!("show info field {key} is not a number"))
}

/// Whether tests may use the BPF path. Under `SHUNT_REQUIRE_BPF=1` (CI) it is
/// required: a shunt that cannot load BPF fails the test. Otherwise, without
/// root, the BPF part is skipped loudly.
pub fn bpf_wanted() -> bool {
    if std::env::var("SHUNT_REQUIRE_BPF").as_deref() == Ok("1") {
        return true;
    }
    // SAFETY: geteuid has no preconditions and touches no memory.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("!!!!! SKIPPED the sockmap mode: not root and SHUNT_REQUIRE_BPF is not 1");
    }
    root
}

/// The modes every forwarding test runs in: copy, splice, and sockmap where BPF is wanted.
pub fn forwarding_modes() -> Vec<&'static str> {
    let mut m = USERSPACE_MODES.to_vec();
    if bpf_wanted() {
        m.push("sockmap");
    }
    m
}

/// Assert that flows of `shunt` were forwarded in `mode` and no other, and
/// that the kernel path (if used) is loaded.
pub fn assert_mode(sock: &Path, mode: &str) {
    // A flow is counted when its session ends, just after its sockets close:
    // wait (bounded) until no flow is open so the last one is counted.
    let t0 = Instant::now();
    while show_info(sock).get("CurrConns").map(String::as_str) != Some("0")
        && t0.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let info = show_info(sock);
    let get = |k: &str| -> u64 { info.get(k).and_then(|v| v.parse().ok()).unwrap_or(0) };
    let (s, p, c) = (get("SockmapFlows"), get("SpliceFlows"), get("CopyFlows"));
    let want = match mode {
        "sockmap" => {
            assert_eq!(
                info.get("Bpf").map(String::as_str),
                Some("loaded"),
                "BPF must be loaded"
            );
            // A client that sent FIN before insertion is spliced instead;
            // every such flow is counted as a fallback.
            let fallbacks = get("SockmapFallbacks");
            (
                s > 0 && p == fallbacks && c == 0,
                "sockmap (splice only as counted fallback)",
            )
        }
        "splice" => (p > 0 && s == 0 && c == 0, "splice"),
        _ => (c > 0 && s == 0 && p == 0, "copy"),
    };
    assert!(
        want.0,
        "flows must use {}: sockmap {s}, splice {p}, copy {c}",
        want.1
    );
}

/// What to look at when a kernel flow delivered the wrong bytes: shunt's warnings and
/// errors (the EOF byte-count check, the verdict's aya-log records) and the kernel
/// path's counters.
pub fn kernel_diagnostics(shunt: &Shunt) -> String {
    let log: Vec<String> = shunt
        .stderr()
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("trim"))
        .map(str::to_owned)
        .collect();
    let counters: Vec<String> = show_info(&shunt.sock())
        .into_iter()
        .filter(|(k, _)| k.starts_with("Sockmap"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    format!("counters {counters:?}; log:\n{}", log.join("\n"))
}

/// A minimal TLS 1.2 ClientHello in one record, with a `server_name` extension for
/// `sni` when given (after a `supported_groups` extension).
pub fn client_hello(sni: Option<&str>) -> Vec<u8> {
    let mut exts = vec![0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x1d];
    if let Some(name) = sni {
        let n = u16::try_from(name.len()).expect("short name");
        exts.extend_from_slice(&[0x00, 0x00]);
        exts.extend_from_slice(&(n + 5).to_be_bytes());
        exts.extend_from_slice(&(n + 3).to_be_bytes());
        exts.push(0x00);
        exts.extend_from_slice(&n.to_be_bytes());
        exts.extend_from_slice(name.as_bytes());
    }
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[0x5a; 32]);
    body.push(0x00);
    body.extend_from_slice(&[0x00, 0x02, 0xc0, 0x2f]);
    body.extend_from_slice(&[0x01, 0x00]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![0x01];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}
