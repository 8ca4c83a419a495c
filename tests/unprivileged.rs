//! shunt without root: started as `nobody` (no capabilities at all), and
//! started as root with `user`/`group` so that it drops privileges itself.
//!
//! The BPF wording checked here is the daemon's contract:
//! - `forward-mode auto` and the load fails: exactly one warning line
//!   `BPF unavailable (<reason>); forwarding in userspace`, and shunt runs;
//! - `forward-mode sockmap` and the load fails: exit 1 with
//!   `[ALERT]    (pid) : forward-mode sockmap: BPF unavailable (<reason>)`.
//!
//! Every test needs root (to run `setpriv`, or to drop privileges). Without
//! root or `setpriv` a test prints a loud skip, unless `SHUNT_REQUIRE_BPF=1`,
//! which turns the skip into a failure (CI runs as root with it set).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use shunt_tests::{
    assert_mode, connect, free_port, pattern, sha256, show_info, simple_config, Server, Shunt,
};

/// The unprivileged user and group every test runs as.
const NOBODY_UID: u32 = 65534;
const NOBODY: &str = "nobody";
const NOGROUP: &str = "nogroup";
/// Bytes echoed through shunt in each working run.
const ECHO_BYTES: usize = 1 << 20;
/// How long a shunt that must refuse to start may take to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bit of CAP_BPF in /proc/PID/status masks (capability number 39).
const CAP_BPF_BIT: u64 = 1 << 39;

/// `setpriv` as `nobody`: no groups, no capabilities (the uid change from
/// root clears them), as a service manager would start it.
const AS_NOBODY: [&str; 4] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
];

fn require() -> bool {
    std::env::var("SHUNT_REQUIRE_BPF").is_ok_and(|v| v == "1")
}

/// True when the test can run; otherwise a loud skip (or a failure under
/// `SHUNT_REQUIRE_BPF=1`).
fn can_run(test: &str, needs_setpriv: bool) -> bool {
    // SAFETY: geteuid has no preconditions and touches no memory.
    let root = unsafe { libc::geteuid() } == 0;
    let setpriv = !needs_setpriv
        || Command::new("setpriv")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
    let why = match (root, setpriv) {
        (true, true) => return true,
        (false, _) => "needs root",
        (true, false) => "needs setpriv (util-linux)",
    };
    if require() {
        panic!("{test}: {why}, and SHUNT_REQUIRE_BPF=1 forbids skipping");
    }
    let _ = writeln!(
        std::io::stderr(),
        "\n!!!!! SKIPPED {test}: {why} (set SHUNT_REQUIRE_BPF=1 to make this fail)\n"
    );
    false
}

/// Sends [`ECHO_BYTES`] through shunt to an echo server and checks they come
/// back intact.
fn echo_round_trip(port: u16) {
    let data = pattern(ECHO_BYTES, 0x5eed);
    let mut c = connect(SocketAddr::from(([127, 0, 0, 1], port)));
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut w = c.try_clone().expect("clone");
    let payload = data.clone();
    let writer = std::thread::spawn(move || {
        w.write_all(&payload).expect("write through shunt");
        w.shutdown(std::net::Shutdown::Write).expect("shutdown");
    });
    let mut back = Vec::with_capacity(ECHO_BYTES);
    c.read_to_end(&mut back).expect("read echo through shunt");
    writer.join().expect("writer");
    assert_eq!(back.len(), data.len(), "echo length");
    assert_eq!(sha256(&back), sha256(&data), "echo content");
}

/// One `Key:\tv1\tv2...` line of /proc/PID/status, split in fields.
fn status_fields(pid: i32, key: &str) -> Vec<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"));
    line.split_whitespace().skip(1).map(str::to_owned).collect()
}

fn cap_mask(pid: i32, key: &str) -> u64 {
    let v = status_fields(pid, key);
    u64::from_str_radix(&v[0], 16).unwrap_or_else(|e| panic!("{key} {v:?}: {e}"))
}

/// Real, effective, saved and filesystem ids are all nobody's; the
/// supplementary groups are exactly `groups`.
fn assert_runs_as_nobody(pid: i32, groups: &[&str]) {
    for key in ["Uid", "Gid"] {
        let ids = status_fields(pid, key);
        assert_eq!(ids, vec![NOBODY_UID.to_string(); 4], "{key} of shunt");
    }
    assert_eq!(status_fields(pid, "Groups"), groups, "Groups of shunt");
}

/// shunt's stderr without the ANSI colour sequences tracing adds.
fn plain_stderr(shunt: &Shunt) -> String {
    shunt_tests::reload::plain(&shunt.stderr())
}

/// Lines of `stderr` containing every one of `parts`.
fn lines_with<'a>(stderr: &'a str, parts: &[&str]) -> Vec<&'a str> {
    stderr
        .lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .collect()
}

/// The text between `BPF unavailable (` and the matching last `)`.
fn unavailable_reason<'a>(line: &'a str, tail: &str) -> &'a str {
    let start = line
        .find("BPF unavailable (")
        .map(|i| i + "BPF unavailable (".len())
        .unwrap_or_else(|| panic!("no reason in {line:?}"));
    let end = line
        .rfind(&format!("){tail}"))
        .unwrap_or_else(|| panic!("no closing parenthesis in {line:?}"));
    assert!(end > start, "empty reason in {line:?}");
    &line[start..end]
}

/// The reason an unprivileged load gives: EPERM (map creation needs
/// CAP_BPF + CAP_NET_ADMIN), or a binary built without BPF when that is
/// allowed.
fn assert_unprivileged_reason(reason: &str) {
    let eperm = reason.contains("EPERM");
    let not_built = reason.contains("SHUNT_NO_BPF");
    assert!(
        eperm || (not_built && !require()),
        "unexpected BPF-unavailable reason: {reason:?}"
    );
}

/// (a) Started as nobody in `auto`: one warning, then a working proxy.
#[test]
fn nobody_auto_warns_once_and_forwards_with_splice() {
    if !can_run("nobody_auto_warns_once_and_forwards_with_splice", true) {
        return;
    }
    let server = Server::echo();
    let port = free_port();
    let shunt = Shunt::start_with(
        &AS_NOBODY,
        &simple_config(port, &[server.addr], ""),
        &["--forward-mode", "auto"],
    );
    echo_round_trip(port);
    // setpriv --clear-groups: no supplementary group at all.
    assert_runs_as_nobody(shunt.pid(), &[]);
    assert_eq!(
        cap_mask(shunt.pid(), "CapEff"),
        0,
        "nobody has no capability"
    );
    let stderr = plain_stderr(&shunt);
    let warnings = lines_with(&stderr, &["BPF unavailable (", "; forwarding in userspace"]);
    assert_eq!(
        warnings.len(),
        1,
        "want exactly one BPF warning line; stderr:\n{stderr}"
    );
    assert_unprivileged_reason(unavailable_reason(warnings[0], "; forwarding in userspace"));
    assert_eq!(
        lines_with(&stderr, &["BPF unavailable"]).len(),
        1,
        "the BPF failure must be reported once; stderr:\n{stderr}"
    );
}

/// (b) Started as nobody with forced sockmap: a start-up error naming why.
#[test]
fn nobody_forced_sockmap_exits_1_with_reason() {
    if !can_run("nobody_forced_sockmap_exits_1_with_reason", true) {
        return;
    }
    let server = Server::echo();
    let port = free_port();
    let mut shunt = Shunt::spawn_with(
        &AS_NOBODY,
        &simple_config(port, &[server.addr], ""),
        &["--forward-mode", "sockmap"],
    );
    let code = shunt.wait(EXIT_TIMEOUT);
    let stderr = plain_stderr(&shunt);
    assert_eq!(code, Some(1), "exit status; stderr:\n{stderr}");
    assert!(
        !stderr.contains("shunt started"),
        "must not start; stderr:\n{stderr}"
    );
    let alerts = lines_with(
        &stderr,
        &["[ALERT]", ": forward-mode sockmap: BPF unavailable ("],
    );
    assert_eq!(alerts.len(), 1, "want one ALERT line; stderr:\n{stderr}");
    assert!(
        alerts[0].starts_with("[ALERT]    ("),
        "HAProxy-style prefix: {:?}",
        alerts[0]
    );
    assert_unprivileged_reason(unavailable_reason(alerts[0], ""));
}

/// Config with `user nobody` / `group nogroup` in the global section.
fn config_dropping_to_nobody(port: u16, server: SocketAddr) -> String {
    simple_config(port, &[server], "").replacen(
        "global\n",
        &format!("global\n    user {NOBODY}\n    group {NOGROUP}\n"),
        1,
    )
}

/// What shunt logged as kept ("kept=CAP_BPF" or "kept=none"), as a mask.
fn logged_kept_mask(stderr: &str) -> u64 {
    let lines = lines_with(stderr, &["dropped privileges"]);
    assert_eq!(lines.len(), 1, "want one drop log line; stderr:\n{stderr}");
    let kept = lines[0]
        .split_whitespace()
        .find_map(|w| w.strip_prefix("kept="))
        .unwrap_or_else(|| panic!("no kept= in {:?}", lines[0]));
    match kept {
        "none" => 0,
        "CAP_BPF" => CAP_BPF_BIT,
        other => panic!("shunt kept more than it may: {other}"),
    }
}

/// Checks the dropped process: ids, and capabilities equal to what it logged
/// (nothing, or CAP_BPF alone on kernels that check it on every bpf(2) call).
fn assert_dropped(shunt: &Shunt) {
    let pid = shunt.pid();
    // setgroups([gid of nogroup]).
    assert_runs_as_nobody(pid, &["65534"]);
    let kept = logged_kept_mask(&plain_stderr(shunt));
    for key in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(cap_mask(pid, key), kept, "{key} of shunt");
    }
    for key in ["CapInh", "CapAmb"] {
        assert_eq!(cap_mask(pid, key), 0, "{key} of shunt");
    }
}

/// (c) Started as root with user/group: binds, loads BPF, drops, forwards.
#[test]
fn root_drops_to_configured_user_and_forwards() {
    if !can_run("root_drops_to_configured_user_and_forwards", false) {
        return;
    }
    let server = Server::echo();
    let port = free_port();
    let shunt = Shunt::start_with(
        &[],
        &config_dropping_to_nobody(port, server.addr),
        &["--forward-mode", "auto"],
    );
    assert_dropped(&shunt);
    echo_round_trip(port);
    echo_round_trip(port);
    assert_dropped(&shunt);
    if require() {
        let stderr = plain_stderr(&shunt);
        assert!(
            !stderr.contains("BPF unavailable"),
            "root must load BPF with SHUNT_REQUIRE_BPF=1; stderr:\n{stderr}"
        );
    }
}

/// (d) As (c) with forced sockmap: the per-flow map operations run after the
/// drop with only the kept capabilities, so this is the runtime check of the
/// kept set. Skips loudly if BPF cannot load here (fails under
/// `SHUNT_REQUIRE_BPF=1`).
#[test]
fn root_dropped_forwards_with_sockmap() {
    if !can_run("root_dropped_forwards_with_sockmap", false) {
        return;
    }
    let server = Server::echo();
    let port = free_port();
    let cfg = config_dropping_to_nobody(port, server.addr);
    let mut shunt = Shunt::spawn_with(&[], &cfg, &["--forward-mode", "sockmap"]);
    let t0 = std::time::Instant::now();
    while !shunt.stderr().contains("shunt started") {
        if let Some(code) = shunt.wait(Duration::from_millis(20)) {
            let stderr = plain_stderr(&shunt);
            assert!(
                !require() && stderr.contains("BPF unavailable ("),
                "shunt exited ({code}); stderr:\n{stderr}"
            );
            let _ = writeln!(
                std::io::stderr(),
                "\n!!!!! SKIPPED root_dropped_forwards_with_sockmap: BPF unavailable here \
                 (set SHUNT_REQUIRE_BPF=1 to make this fail)\n"
            );
            return;
        }
        assert!(
            t0.elapsed() < EXIT_TIMEOUT,
            "shunt did not start; stderr:\n{}",
            shunt.stderr()
        );
    }
    assert_dropped(&shunt);
    echo_round_trip(port);
    echo_round_trip(port);
    assert_dropped(&shunt);
    // The flows really went through the kernel, after the drop.
    assert_mode(&shunt.sock(), "sockmap");
    let info = show_info(&shunt.sock());
    assert_eq!(info.get("SockhashEntries").map(String::as_str), Some("0"));
}
