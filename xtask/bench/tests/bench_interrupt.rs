//! Acceptance 4 of the benchmarks issue: nothing the bench started outlives it, also
//! after Ctrl-C. Starts the bench (`shunt-bench --quick`, the binary `cargo xtask bench`
//! execs with its arguments) as a child with a pid file, waits until it has started its
//! servers and proxies, sends it SIGINT, and checks that it exits within a bound and
//! that no process listed in the pid file (haproxy, nginx, redis-server, iperf3, shunt,
//! load tools) is still alive.
//!
//! Needs a shunt binary ($SHUNT_BIN as `cargo xtask test` sets it, or a release or
//! debug build) and the bench's Debian packages (`cargo xtask setup`); without them
//! the test is skipped loudly, except under SHUNT_REQUIRE_BPF=1 (CI), where it fails.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Processes the bench must have started before the interrupt (iperf3 and redis
/// servers and at least two peers).
const STARTED_BEFORE_SIGINT: usize = 4;
/// Bound of the wait for those starts.
const START_BOUND: Duration = Duration::from_secs(120);
/// Bound of the bench's exit after SIGINT (each child gets a 5 s stop grace).
const EXIT_BOUND: Duration = Duration::from_secs(60);

/// The workspace root: this crate lives in xtask/bench.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("workspace root")
        .to_path_buf()
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Alive and not a zombie.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

#[test]
fn sigint_stops_everything_the_bench_started() {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    // Any shunt binary does for this test (it checks process cleanup, not speed):
    // the one `cargo xtask test` built ($SHUNT_BIN), else a release or debug build.
    let shunt = std::env::var_os("SHUNT_BIN")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .unwrap_or_else(|| {
            let release = target.join("release").join("shunt");
            if release.is_file() {
                release
            } else {
                target.join("debug").join("shunt")
            }
        });
    let missing: Vec<&str> = [
        "haproxy",
        "nginx",
        "redis-server",
        "redis-benchmark",
        "iperf3",
    ]
    .into_iter()
    .filter(|p| !on_path(p))
    .collect();
    if !shunt.is_file() || !missing.is_empty() {
        // CI (SHUNT_REQUIRE_BPF=1) installs everything: a missing piece there fails.
        assert!(
            std::env::var_os("SHUNT_REQUIRE_BPF").is_none(),
            "needs {} and {missing:?} (cargo xtask setup)",
            shunt.display()
        );
        eprintln!(
            "!!!!! SKIPPED: needs {} (cargo xtask build) and {:?} (cargo xtask setup)",
            shunt.display(),
            missing
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("xtask-bench-int-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let pid_file = dir.join("pids.txt");
    let mut child = Command::new(env!("CARGO_BIN_EXE_shunt-bench"))
        .args(["--quick", "--shunt"])
        .arg(&shunt)
        .arg("--out")
        .arg(&dir)
        .arg("--pid-file")
        .arg(&pid_file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn shunt-bench");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let t0 = Instant::now();
    let mut started = 0;
    let mut transcript = Vec::new();
    while started < STARTED_BEFORE_SIGINT {
        let left = START_BOUND.saturating_sub(t0.elapsed());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if line.starts_with("xtask: started ") {
                    started += 1;
                }
                transcript.push(line);
            }
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the bench started {started} processes within {START_BOUND:?}:\n{}",
                    transcript.join("\n")
                );
            }
        }
    }
    // Let it get into a measurement.
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let t1 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t1.elapsed() > EXIT_BOUND {
            let _ = child.kill();
            panic!("the bench did not exit within {EXIT_BOUND:?} of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(2)) {
        transcript.push(line);
    }
    reader.join().ok();
    assert!(
        !status.success(),
        "an interrupted bench must not report success"
    );
    let pids: Vec<(i32, String)> = std::fs::read_to_string(&pid_file)
        .expect("pid file")
        .lines()
        .filter_map(|l| {
            let (pid, name) = l.split_once(' ')?;
            Some((pid.parse().ok()?, name.to_string()))
        })
        .collect();
    assert!(
        pids.len() >= STARTED_BEFORE_SIGINT,
        "pid file lists {} processes: {pids:?}",
        pids.len()
    );
    let left: Vec<&(i32, String)> = pids.iter().filter(|(pid, _)| alive(*pid)).collect();
    assert!(
        left.is_empty(),
        "still running after the bench exited: {left:?}\n{}",
        transcript.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
