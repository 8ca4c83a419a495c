//! Child processes, signals and /proc readings for xtask.
//!
//! Owns: running a command with its line echoed, the `ChildGuard` that stops a daemon
//! (SIGTERM, then SIGKILL after `STOP_GRACE`) whatever path leaves the scope, the
//! SIGINT/SIGTERM flag that interactive commands poll, waiting for a port to accept or a
//! stats socket to answer, and
//! a process's CPU time from /proc/PID/stat, bounded runs of load tools
//! (`run_bounded`), the pid file that lists every process started (`set_pid_file`) and
//! raising `RLIMIT_NOFILE`.
//!
//! Invariant: a daemon started through `ChildGuard::spawn` never outlives xtask's
//! normal return or error return; its stderr goes to a log file whose tail is quoted
//! when it dies early.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How long a stopped daemon gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often loops waiting on a child or a port look again.
const POLL: Duration = Duration::from_millis(50);
/// How often `run_bounded` looks at its tool.
const TOOL_POLL: Duration = Duration::from_millis(20);
/// How much of a dead daemon's log is quoted in the error.
const LOG_TAIL_BYTES: usize = 4096;

/// Where every started process's pid is appended (`PID name` lines), when set.
static PID_FILE: Mutex<Option<PathBuf>> = Mutex::new(None);

/// From now on, append the pid and name of every process started through this module
/// to `path` (truncated first), so a watcher can check they are all gone at the end.
pub fn set_pid_file(path: &Path) -> Result<()> {
    std::fs::write(path, "").with_context(|| format!("cannot write {}", path.display()))?;
    if let Ok(mut slot) = PID_FILE.lock() {
        *slot = Some(path.to_path_buf());
    }
    Ok(())
}

fn note_pid(name: &str, pid: u32) {
    let Ok(slot) = PID_FILE.lock() else { return };
    if let Some(path) = slot.as_ref() {
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(path) {
            use std::io::Write;
            let _ = writeln!(f, "{pid} {name}");
        }
    }
}

/// Runs a load tool (`program args…`) in its own process group with stdout captured,
/// bounded by `limit`; a stop request or the limit kills it (by its pid) and is an
/// error. Returns stdout; a non-zero exit is an error quoting stderr's tail.
pub fn run_bounded(program: &str, args: &[&str], limit: Duration) -> Result<String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot run {program}"))?;
    note_pid(program, child.id());
    let mut out = child.stdout.take().context("no stdout pipe")?;
    let mut err = child.stderr.take().context("no stderr pipe")?;
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if stop_requested() || Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(TOOL_POLL);
    };
    let out = out_reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    let line = format!("{program} {}", args.join(" "));
    let Some(status) = status else {
        if stop_requested() {
            bail!("interrupted during `{line}`");
        }
        bail!("`{line}` did not finish within {limit:?}");
    };
    let out = String::from_utf8_lossy(&out).into_owned();
    if !status.success() {
        let err = String::from_utf8_lossy(&err);
        let tail: String = err.chars().rev().take(LOG_TAIL_BYTES).collect();
        let tail: String = tail.chars().rev().collect();
        let out_tail: String = out.chars().take(LOG_TAIL_BYTES).collect();
        bail!(
            "`{line}` failed ({status}): {}{}",
            tail.trim(),
            out_tail.trim()
        );
    }
    Ok(out)
}

/// Raises this process's `RLIMIT_NOFILE` (soft, and hard when needed: root can) to at
/// least `want`; children started afterwards inherit it. Returns the soft limit now in
/// force, which may be lower than `want` when the hard limit cannot be raised.
pub fn raise_nofile(want: u64) -> u64 {
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the valid struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut cur) } != 0 {
        return 0;
    }
    if cur.rlim_cur >= want {
        return cur.rlim_cur;
    }
    let both = libc::rlimit {
        rlim_cur: want,
        rlim_max: cur.rlim_max.max(want),
    };
    // SAFETY: setrlimit reads the valid, initialised struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &both) } == 0 {
        return want;
    }
    // Not allowed past the hard limit: take what the hard limit gives.
    let soft = libc::rlimit {
        rlim_cur: cur.rlim_max,
        rlim_max: cur.rlim_max,
    };
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &soft) } == 0 {
        cur.rlim_max
    } else {
        cur.rlim_cur
    }
}

/// VmRSS of a process, from /proc/PID/status, in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    parse_vm_rss(&text).with_context(|| format!("no VmRSS in {path}"))
}

/// The `VmRSS:   1234 kB` line of /proc/PID/status, in bytes.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Runs `program args…` with inherited stdio, echoing the command line first.
pub fn run(program: &str, args: &[&str]) -> Result<()> {
    println!("xtask: $ {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .current_dir(crate::workspace_root())
        .status()
        .with_context(|| format!("cannot run {program}"))?;
    check_status(program, args, status)
}

/// The cargo that runs xtask (per $CARGO), else `cargo` from PATH.
pub fn cargo_program() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string())
}

/// Runs cargo (the one that runs xtask, per $CARGO) in the workspace root.
pub fn cargo(args: &[&str]) -> Result<()> {
    run(&cargo_program(), args)
}

fn check_status(program: &str, args: &[&str], status: ExitStatus) -> Result<()> {
    if status.success() {
        Ok(())
    } else {
        bail!("`{program} {}` failed: {status}", args.join(" "))
    }
}

/// Runs a command quietly and returns its stdout, or `None` if it could not run or failed.
pub fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// Routes SIGINT and SIGTERM to a flag (`stop_requested`) instead of killing xtask, so
/// the caller can stop its daemons and exit cleanly.
pub fn catch_stop_signals() -> Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe;
        // `sigaction` is given valid, fully initialised structures.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            bail!(
                "sigaction({sig}) failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

/// True once SIGINT or SIGTERM arrived (after `catch_stop_signals`).
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Sleeps up to `d`, returning early (false) when a stop was requested.
pub fn sleep_unless_stopped(d: Duration) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stop_requested() {
            return false;
        }
        std::thread::sleep(POLL.min(end.saturating_duration_since(Instant::now())));
    }
    !stop_requested()
}

/// A daemon child that is stopped (SIGTERM, then SIGKILL) when the guard is dropped.
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl ChildGuard {
    /// Starts `program args…` with stdout and stderr appended to `log`. With
    /// `own_group`, the child gets its own process group so a terminal's Ctrl-C reaches
    /// only xtask, which then stops the child with SIGTERM.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[&str],
        log: &Path,
        own_group: bool,
    ) -> Result<Self> {
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let out = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone()?;
        println!(
            "xtask: starting {name}: {} {} (log: {})",
            program.display(),
            args.join(" "),
            log.display()
        );
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir(crate::workspace_root())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if own_group {
            cmd.process_group(0);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        println!("xtask: started {name} (pid {})", child.id());
        note_pid(name, child.id());
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Errors (quoting the log's tail) if the child has already exited.
    pub fn check_alive(&mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            bail!("{} was already stopped", self.name);
        };
        if let Some(status) = child.try_wait()? {
            self.child = None;
            bail!(
                "{} exited early ({status}); last lines of {}:\n{}",
                self.name,
                self.log.display(),
                self.log_tail()
            );
        }
        Ok(())
    }

    /// Waits until `addr` accepts a TCP connection, failing if the child dies, a stop is
    /// requested, or `limit` passes.
    pub fn wait_for_port(&mut self, addr: SocketAddr, limit: Duration) -> Result<()> {
        let end = Instant::now() + limit;
        loop {
            self.check_alive()?;
            if TcpStream::connect_timeout(&addr, POLL).is_ok() {
                return Ok(());
            }
            if stop_requested() {
                bail!("interrupted while waiting for {} on {addr}", self.name);
            }
            if Instant::now() >= end {
                bail!(
                    "{} did not accept on {addr} within {limit:?}; last lines of {}:\n{}",
                    self.name,
                    self.log.display(),
                    self.log_tail()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until the stats socket at `path` answers `show info` (shunt binds it just
    /// after its listeners, so a frontend that accepts does not mean it is there yet),
    /// failing if the child dies, a stop is requested, or `limit` passes. Returns the
    /// fields of the answer.
    pub fn wait_for_stats(
        &mut self,
        path: &Path,
        limit: Duration,
    ) -> Result<BTreeMap<String, String>> {
        let end = Instant::now() + limit;
        loop {
            self.check_alive()?;
            match shunt_testkit::cli_command(path, "show info") {
                Ok(text) => return Ok(shunt_testkit::parse_show_info(&text)),
                Err(e) if Instant::now() >= end => {
                    return Err(e.context(format!("no answer within {limit:?}")))
                }
                Err(_) if stop_requested() => bail!(
                    "interrupted while waiting for the stats socket {} of {}",
                    path.display(),
                    self.name
                ),
                Err(_) => std::thread::sleep(POLL),
            }
        }
    }

    /// The last `LOG_TAIL_BYTES` of the child's log.
    pub fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let mut start = text.len().saturating_sub(LOG_TAIL_BYTES);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text[start..].to_string()
    }

    /// SIGTERM, wait up to `STOP_GRACE`, then SIGKILL. Returns the exit status if the
    /// child was still running.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) with the pid of our own child, not yet reaped, so the pid
            // cannot have been reused.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let end = Instant::now() + STOP_GRACE;
        while Instant::now() < end {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => std::thread::sleep(POLL),
                Err(_) => break,
            }
        }
        eprintln!(
            "xtask: {} ignored SIGTERM for {STOP_GRACE:?}; killing it",
            self.name
        );
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// utime + stime of a process, from /proc/PID/stat, in seconds.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let ticks = parse_stat_cpu_ticks(&text).with_context(|| format!("unexpected {path}"))?;
    Ok(ticks as f64 * cpu_seconds_per_tick())
}

/// Seconds per USER_HZ tick, the unit of /proc/PID/stat and /proc/stat.
pub fn cpu_seconds_per_tick() -> f64 {
    1.0 / clock_ticks_per_second() as f64
}

/// utime + stime (fields 14 and 15) of a /proc/PID/stat line. The command name (field 2)
/// may hold spaces and parentheses, so fields are counted after its last ')'.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state), so field N is at index N - 3.
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&hz| hz > 0).unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_fields_after_command_name_with_spaces() {
        let line = "1234 (my (odd) prog) S 1 2 3 4 5 6 7 8 9 10 250 17 0 0 20 0 1 0";
        assert_eq!(parse_stat_cpu_ticks(line), Some(267));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn vm_rss_is_parsed_in_bytes() {
        let status = "Name:\tx\nVmPeak:\t  9 kB\nVmRSS:\t    1234 kB\nThreads: 1\n";
        assert_eq!(parse_vm_rss(status), Some(1234 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert!(rss_bytes(std::process::id()).expect("own rss") > 0);
    }

    #[test]
    fn bounded_tool_output_failure_and_timeout() {
        let out = run_bounded("/bin/sh", &["-c", "echo hi"], Duration::from_secs(10)).expect("ok");
        assert_eq!(out, "hi\n");
        let e = run_bounded(
            "/bin/sh",
            &["-c", "echo bad >&2; exit 2"],
            Duration::from_secs(10),
        )
        .expect_err("exit 2");
        assert!(format!("{e}").contains("bad"), "{e}");
        let t0 = Instant::now();
        let e = run_bounded("/bin/sleep", &["30"], Duration::from_millis(300)).expect_err("slow");
        assert!(format!("{e}").contains("did not finish"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn own_cpu_time_is_readable() {
        let secs = cpu_seconds(std::process::id()).expect("own /proc stat");
        assert!(secs >= 0.0);
    }

    #[test]
    fn guard_reports_early_exit_and_stops_a_live_child() {
        let dir = std::env::temp_dir().join(format!("xtask-proc-{}", std::process::id()));
        let log = dir.join("false.log");
        let mut dead = ChildGuard::spawn(
            "sh",
            Path::new("/bin/sh"),
            &["-c", "echo boom >&2; exit 3"],
            &log,
            false,
        )
        .expect("spawn");
        std::thread::sleep(Duration::from_millis(300));
        let err = dead.check_alive().expect_err("child exited");
        assert!(format!("{err:#}").contains("boom"), "{err:#}");

        let mut live = ChildGuard::spawn(
            "sleep",
            Path::new("/bin/sleep"),
            &["30"],
            &dir.join("sleep.log"),
            true,
        )
        .expect("spawn");
        live.check_alive().expect("alive");
        let started = Instant::now();
        let status = live.stop().expect("status");
        assert!(!status.success());
        assert!(started.elapsed() < STOP_GRACE, "SIGTERM stops sleep");
        let _ = std::fs::remove_dir_all(dir);
    }
}
