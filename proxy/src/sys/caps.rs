//! Dropping root: switch to the configured user/group and keep only the
//! capabilities the caller names.
//!
//! Owns the privilege drop of the process ([`drop_to`]), a read of the
//! current effective set for logging ([`current_effective`]), and the probe
//! that tells whether `bpf(2)` on a descriptor already held needs CAP_BPF on
//! this kernel ([`held_bpf_fd_needs_cap`]). The capability
//! sets are read and written with the `caps` crate (capget/capset, prctl);
//! the uid/gid changes go through `nix` (glibc's setuid/setgid/setgroups).
//! Must not: decide which capabilities to keep (the daemon does), or log.
//!
//! Invariants:
//! - Nothing changes when neither a user nor a group is given.
//! - It runs while the process has a single thread. Capabilities and the
//!   keep-caps flag are per thread on Linux: glibc applies `setuid` to every
//!   thread, but only the calling thread would keep the capabilities. Threads
//!   started afterwards inherit the caller's sets, so the worker threads all
//!   have exactly the kept set. A second thread at call time is an error.
//! - On success the real, effective and saved uid are the user's (so root
//!   cannot be regained), the groups are exactly `[gid]`, and the permitted
//!   and effective sets are exactly `keep`; inheritable, ambient and the
//!   bounding set hold nothing outside `keep`, so an `execve` gains nothing.
//! - On error the process may be half-dropped; the caller must exit.

use std::collections::HashSet;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use caps::CapSet;
pub use caps::Capability as Cap;
use nix::unistd::{Gid, Group, Uid, User};

/// Where the kernel lists the threads of this process.
const TASK_DIR: &str = "/proc/self/task";
/// `bpf(2)` commands and the map type the probe uses (uapi/linux/bpf.h).
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_TYPE_ARRAY: u32 = 2;

/// Why [`drop_to`] failed.
#[derive(Debug, thiserror::Error)]
pub enum CapsError {
    /// The user is not in the password database.
    #[error("unknown user '{0}'")]
    UnknownUser(String),
    /// The group is not in the group database.
    #[error("unknown group '{0}'")]
    UnknownGroup(String),
    /// Looking a name up failed (NSS error).
    #[error("looking up {kind} '{name}': {source}")]
    Lookup {
        /// "user" or "group".
        kind: &'static str,
        /// The configured name.
        name: String,
        /// The errno.
        #[source]
        source: nix::Error,
    },
    /// A uid/gid syscall failed, e.g. `setgroups([65534])` without CAP_SETGID.
    #[error("{call}: {source}")]
    Id {
        /// The call with its argument, e.g. `setuid(65534)`.
        call: String,
        /// The errno.
        #[source]
        source: nix::Error,
    },
    /// Reading or writing a capability set failed.
    #[error("{op} ({caps}): {source}")]
    Caps {
        /// What was being done, e.g. "set effective".
        op: &'static str,
        /// The capabilities involved.
        caps: String,
        /// What the caps crate said (carries the errno text).
        #[source]
        source: caps::errors::CapsError,
    },
    /// More than one thread is running (see the module invariants).
    #[error(
        "privileges must be dropped before any other thread starts \
         ({threads} threads running; capabilities are per thread)"
    )]
    Threaded {
        /// Threads of this process at the time of the call.
        threads: usize,
    },
    /// The CAP_BPF probe could not run (e.g. not privileged enough to create
    /// its one-entry map).
    #[error("probing whether held BPF descriptors need CAP_BPF: {step}: {source}")]
    Probe {
        /// Which step failed.
        step: &'static str,
        /// The errno.
        #[source]
        source: std::io::Error,
    },
    /// After the drop, the process still had something it should not.
    #[error("after dropping to uid {uid}: {what}")]
    Verify {
        /// The target uid.
        uid: u32,
        /// What was found.
        what: String,
    },
}

/// The accounts a drop switches to, looked up once: a process that will
/// `chroot` must resolve them first (the password database is outside).
#[derive(Debug, Clone)]
pub struct Target {
    user: Option<User>,
    gid: Gid,
}

impl Target {
    /// The uid the drop switches to (`None`: only the group changes).
    pub fn uid(&self) -> Option<Uid> {
        self.user.as_ref().map(|u| u.uid)
    }

    /// The gid the drop switches to.
    pub fn gid(&self) -> Gid {
        self.gid
    }
}

/// Look `user` and `group` up, so that a start-up can fail on them before
/// it touches anything; `None` when neither is given (nothing to drop).
pub fn resolve(user: Option<&str>, group: Option<&str>) -> Result<Option<Target>, CapsError> {
    if user.is_none() && group.is_none() {
        return Ok(None);
    }
    let user = user.map(lookup_user).transpose()?;
    let gid = match (group, &user) {
        (Some(g), _) => lookup_group(g)?,
        (None, Some(u)) => u.gid,
        // Unreachable by the first check; keep the gid.
        (None, None) => Gid::current(),
    };
    Ok(Some(Target { user, gid }))
}

/// Switches to `user` and/or `group` and keeps exactly `keep` as permitted
/// and effective capabilities.
///
/// - `group`: `setgroups([gid])`, `setgid(gid)`. When only `user` is given,
///   the user's primary group is used, so no root group survives.
/// - `user`: `PR_SET_KEEPCAPS=1`, `setuid(uid)`, `PR_SET_KEEPCAPS=0`, then
///   permitted = effective = `keep`. When only `group` is given the uid stays
///   but the capability sets are still cut to `keep`.
/// - Inheritable and ambient are cleared; every capability not in `keep`
///   leaves the bounding set (while CAP_SETPCAP is still held).
///
/// Each capability of `keep` must be in the permitted set at the call (as
/// it is for root). Neither name given: nothing changes, `Ok(())`.
pub fn drop_to(user: Option<&str>, group: Option<&str>, keep: &[Cap]) -> Result<(), CapsError> {
    match resolve(user, group)? {
        Some(t) => drop_resolved(&t, keep),
        None => Ok(()),
    }
}

/// [`drop_to`] with the accounts already looked up ([`resolve`]).
pub fn drop_resolved(target: &Target, keep: &[Cap]) -> Result<(), CapsError> {
    let threads = thread_count();
    if threads > 1 {
        return Err(CapsError::Threaded { threads });
    }
    let (target_user, gid) = (&target.user, target.gid);
    let keep_set: HashSet<Cap> = keep.iter().copied().collect();

    nix::unistd::setgroups(&[gid]).map_err(|source| CapsError::Id {
        call: format!("setgroups([{gid}])"),
        source,
    })?;
    nix::unistd::setgid(gid).map_err(|source| CapsError::Id {
        call: format!("setgid({gid})"),
        source,
    })?;
    // Still privileged here: the bounding set needs CAP_SETPCAP.
    trim_bounding(&keep_set)?;
    caps::clear(None, CapSet::Ambient).map_err(|source| CapsError::Caps {
        op: "clear ambient",
        caps: String::new(),
        source,
    })?;

    if let Some(u) = target_user {
        caps::securebits::set_keepcaps(true).map_err(|source| CapsError::Caps {
            op: "PR_SET_KEEPCAPS 1",
            caps: String::new(),
            source,
        })?;
        let set = nix::unistd::setuid(u.uid).map_err(|source| CapsError::Id {
            call: format!("setuid({}) for user '{}'", u.uid, u.name),
            source,
        });
        // Reset even when setuid failed; its error is the one to report.
        let reset = caps::securebits::set_keepcaps(false);
        set?;
        reset.map_err(|source| CapsError::Caps {
            op: "PR_SET_KEEPCAPS 0",
            caps: String::new(),
            source,
        })?;
    }

    // Effective first: capset refuses an effective set outside permitted.
    set_caps("set effective", CapSet::Effective, &keep_set)?;
    set_caps("set permitted", CapSet::Permitted, &keep_set)?;
    set_caps("clear inheritable", CapSet::Inheritable, &HashSet::new())?;
    verify(target_user.as_ref().map(|u| u.uid), gid, &keep_set)
}

/// The calling thread's effective capabilities, in kernel order (for logs).
/// Empty if they cannot be read (capget on oneself does not fail in practice).
pub fn current_effective() -> Vec<Cap> {
    let mut v: Vec<Cap> = caps::read(None, CapSet::Effective)
        .map(|s| s.into_iter().collect())
        .unwrap_or_default();
    v.sort_by_key(|c| c.index());
    v
}

/// `CAP_A,CAP_B` in the given order, or `none`.
pub fn names(caps: &[Cap]) -> String {
    if caps.is_empty() {
        return "none".to_string();
    }
    caps.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether this kernel refuses `bpf(2)` on a map descriptor the process
/// already holds unless the caller has CAP_BPF (or CAP_SYS_ADMIN).
///
/// Kernels before 6.5 check `kernel.unprivileged_bpf_disabled` at the entry
/// of every `bpf(2)` command; since 6.5 only map creation and program load
/// are checked, and owning the descriptor is the permission for the rest.
/// Rather than trusting a version number (backports), this asks the kernel:
/// it creates a one-entry array map (needs the privileges of the caller,
/// normally root), empties the calling thread's effective set, looks the
/// entry up, and restores the effective set. `Ok(true)` means the lookup got
/// EPERM. Must be called before [`drop_to`]; it touches only the calling
/// thread and leaves its sets as they were.
pub fn held_bpf_fd_needs_cap() -> Result<bool, CapsError> {
    let map = create_probe_map()?;
    let saved = caps::read(None, CapSet::Effective).map_err(|source| CapsError::Caps {
        op: "read effective",
        caps: String::new(),
        source,
    })?;
    set_caps(
        "empty effective for the probe",
        CapSet::Effective,
        &HashSet::new(),
    )?;
    let lookup = probe_lookup(&map);
    set_caps(
        "restore effective after the probe",
        CapSet::Effective,
        &saved,
    )?;
    match lookup {
        Ok(()) => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(true),
        Err(source) => Err(CapsError::Probe {
            step: "BPF_MAP_LOOKUP_ELEM without capabilities",
            source,
        }),
    }
}

/// The head of `union bpf_attr` for BPF_MAP_CREATE; the kernel zero-fills
/// the fields after the size passed.
#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

fn create_probe_map() -> Result<OwnedFd, CapsError> {
    let attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
        map_flags: 0,
    };
    // SAFETY: bpf(2) reads `size_of::<MapCreateAttr>()` bytes of a valid,
    // initialised attr that lives for the whole call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            &attr as *const MapCreateAttr,
            std::mem::size_of::<MapCreateAttr>(),
        )
    };
    let fd = i32::try_from(rc).unwrap_or(-1);
    if fd < 0 {
        return Err(CapsError::Probe {
            step: "BPF_MAP_CREATE of a one-entry array",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: BPF_MAP_CREATE succeeded, so `fd` is a new descriptor owned by
    // no one else; it is wrapped exactly once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn probe_lookup(map: &OwnedFd) -> std::io::Result<()> {
    let key: u32 = 0;
    let mut value: u32 = 0;
    // The probe map has u32 keys and values (`create_probe_map`).
    super::bpf::lookup(map.as_fd(), &key, &mut value)
}

fn lookup_user(name: &str) -> Result<User, CapsError> {
    User::from_name(name)
        .map_err(|source| CapsError::Lookup {
            kind: "user",
            name: name.to_string(),
            source,
        })?
        .ok_or_else(|| CapsError::UnknownUser(name.to_string()))
}

fn lookup_group(name: &str) -> Result<Gid, CapsError> {
    Group::from_name(name)
        .map_err(|source| CapsError::Lookup {
            kind: "group",
            name: name.to_string(),
            source,
        })?
        .map(|g| g.gid)
        .ok_or_else(|| CapsError::UnknownGroup(name.to_string()))
}

/// Threads of this process; 1 if /proc cannot be read (then the check is
/// skipped rather than refusing to start). After a `chroot` /proc is gone,
/// so there the daemon's order (no thread starts before the drop) is what
/// holds the invariant, not this check.
fn thread_count() -> usize {
    std::fs::read_dir(TASK_DIR).map_or(1, |d| d.count().max(1))
}

fn sorted(set: &HashSet<Cap>) -> Vec<Cap> {
    let mut v: Vec<Cap> = set.iter().copied().collect();
    v.sort_by_key(|c| c.index());
    v
}

fn set_caps(op: &'static str, which: CapSet, set: &HashSet<Cap>) -> Result<(), CapsError> {
    caps::set(None, which, set).map_err(|source| CapsError::Caps {
        op,
        caps: names(&sorted(set)),
        source,
    })
}

/// Drops from the bounding set every capability this kernel knows that is not
/// in `keep`. Without CAP_SETPCAP (not root) it leaves the set as it is: the
/// bounding set only limits what a later `execve` could gain, and shunt
/// never executes anything.
fn trim_bounding(keep: &HashSet<Cap>) -> Result<(), CapsError> {
    if !caps::has_cap(None, CapSet::Effective, Cap::CAP_SETPCAP).unwrap_or(false) {
        return Ok(());
    }
    let bounding = caps::read(None, CapSet::Bounding).map_err(|source| CapsError::Caps {
        op: "read bounding",
        caps: String::new(),
        source,
    })?;
    for cap in sorted(&bounding) {
        if !keep.contains(&cap) {
            caps::drop(None, CapSet::Bounding, cap).map_err(|source| CapsError::Caps {
                op: "drop from bounding",
                caps: cap.to_string(),
                source,
            })?;
        }
    }
    Ok(())
}

/// Checks what the kernel now says against what was asked.
fn verify(uid: Option<Uid>, gid: Gid, keep: &HashSet<Cap>) -> Result<(), CapsError> {
    let target = uid.unwrap_or_else(Uid::current);
    let fail = |what: String| CapsError::Verify {
        uid: target.as_raw(),
        what,
    };
    let res = nix::unistd::getresuid().map_err(|source| CapsError::Id {
        call: "getresuid()".to_string(),
        source,
    })?;
    if uid.is_some() && (res.real != target || res.effective != target || res.saved != target) {
        return Err(fail(format!(
            "uids are real {} effective {} saved {}",
            res.real, res.effective, res.saved
        )));
    }
    let resg = nix::unistd::getresgid().map_err(|source| CapsError::Id {
        call: "getresgid()".to_string(),
        source,
    })?;
    if resg.real != gid || resg.effective != gid || resg.saved != gid {
        return Err(fail(format!(
            "gids are real {} effective {} saved {}, want {gid}",
            resg.real, resg.effective, resg.saved
        )));
    }
    for which in [CapSet::Permitted, CapSet::Effective] {
        let now = caps::read(None, which).map_err(|source| CapsError::Caps {
            op: "read back",
            caps: String::new(),
            source,
        })?;
        if &now != keep {
            return Err(fail(format!(
                "{which:?} set is [{}], want [{}]",
                names(&sorted(&now)),
                names(&sorted(keep))
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_configured_changes_nothing() {
        let before_uid = nix::unistd::getresuid().expect("getresuid");
        let before_caps = current_effective();
        drop_to(None, None, &[]).expect("no-op");
        let after_uid = nix::unistd::getresuid().expect("getresuid");
        assert_eq!(before_uid.real, after_uid.real);
        assert_eq!(before_uid.effective, after_uid.effective);
        assert_eq!(before_caps, current_effective());
    }

    #[test]
    fn refuses_with_other_threads_running() {
        // The test harness runs this on its own thread, next to the main one:
        // the drop must refuse before touching anything.
        let before = nix::unistd::getresuid().expect("getresuid");
        let err = drop_to(Some("nobody"), None, &[]).expect_err("must refuse");
        assert!(
            matches!(err, CapsError::Threaded { threads } if threads >= 2),
            "{err}"
        );
        assert_eq!(
            nix::unistd::getresuid().expect("getresuid").real,
            before.real
        );
    }

    /// The probe needs root (map creation); `SHUNT_REQUIRE_BPF=1` makes a
    /// probe that cannot run a failure instead of a loud skip.
    #[test]
    fn probe_answers_and_restores_the_effective_set() {
        use std::io::Write;
        let before = current_effective();
        let answer = match held_bpf_fd_needs_cap() {
            Ok(a) => a,
            Err(e) => {
                if std::env::var("SHUNT_REQUIRE_BPF").is_ok_and(|v| v == "1") {
                    panic!("probe failed with SHUNT_REQUIRE_BPF=1: {e}");
                }
                let _ = writeln!(
                    std::io::stderr(),
                    "\n!!!!! SKIPPED probe test: {e} (set SHUNT_REQUIRE_BPF=1 to make this fail)\n"
                );
                return;
            }
        };
        assert_eq!(current_effective(), before, "effective set not restored");
        let sysctl = std::fs::read_to_string("/proc/sys/kernel/unprivileged_bpf_disabled")
            .unwrap_or_default();
        if sysctl.trim() == "0" {
            assert!(!answer, "unprivileged bpf allowed, yet the probe got EPERM");
        }
        if kernel_at_least(6, 5) {
            // Since 6.5 the sysctl is checked only at map creation and
            // program load (measured on 6.18: map ops need no capability).
            assert!(!answer, "Linux >= 6.5 should not check held descriptors");
        }
    }

    fn kernel_at_least(major: u32, minor: u32) -> bool {
        let uts = nix::sys::utsname::uname().expect("uname");
        let release = uts.release().to_string_lossy().into_owned();
        let mut parts = release
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|p| p.parse::<u32>().ok());
        let (ma, mi) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        (ma, mi) >= (major, minor)
    }

    /// How long a forked child may take to drop and check.
    const CHILD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
    /// Privileged ports the kept-capability check tries to bind.
    const LOW_PORTS: std::ops::Range<u16> = 600..700;

    fn is_root_or_skip(test: &str) -> bool {
        use std::io::Write;
        if nix::unistd::geteuid().is_root() {
            return true;
        }
        if std::env::var("SHUNT_REQUIRE_BPF").is_ok_and(|v| v == "1") {
            panic!("{test} needs root and SHUNT_REQUIRE_BPF=1 is set");
        }
        let _ = writeln!(
            std::io::stderr(),
            "\n!!!!! SKIPPED {test}: needs root to drop privileges\n"
        );
        false
    }

    /// Runs `check` in a forked child (the only thread there, as in the
    /// daemon before its workers start) and returns its exit status and what
    /// it printed. The test process itself keeps its uid and capabilities.
    fn in_child(check: fn() -> Result<(), String>) -> (i32, String) {
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        use nix::unistd::{fork, ForkResult};
        use std::io::Read;
        let (rd, wr) = nix::unistd::pipe().expect("pipe");
        let (mut rd, wr) = (std::fs::File::from(rd), std::fs::File::from(wr));
        // SAFETY: the child only runs `check` (glibc's fork makes malloc and
        // NSS usable in the child) and leaves with `_exit`, never returning
        // into the test harness.
        match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                let code = match check() {
                    Ok(()) => 0,
                    Err(msg) => {
                        use std::io::Write;
                        let mut w = wr;
                        let _ = w.write_all(msg.as_bytes());
                        1
                    }
                };
                // SAFETY: _exit ends the child at once, without running the
                // parent's atexit handlers or destructors.
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => {
                drop(wr);
                let t0 = std::time::Instant::now();
                let code = loop {
                    match waitpid(child, Some(WaitPidFlag::WNOHANG)).expect("waitpid") {
                        WaitStatus::Exited(_, c) => break c,
                        WaitStatus::Signaled(_, sig, _) => break 128 + sig as i32,
                        _ if t0.elapsed() > CHILD_TIMEOUT => {
                            let _ = nix::sys::signal::kill(child, nix::sys::signal::SIGKILL);
                            let _ = waitpid(child, None);
                            panic!("child did not finish in {CHILD_TIMEOUT:?}");
                        }
                        _ => std::thread::sleep(std::time::Duration::from_millis(10)),
                    }
                };
                let mut msg = String::new();
                let _ = rd.read_to_string(&mut msg);
                (code, msg)
            }
        }
    }

    /// Binds the first free port of [`LOW_PORTS`]: Ok(port), or the errno
    /// of a refusal other than "in use".
    fn bind_low_port() -> Result<u16, std::io::Error> {
        for port in LOW_PORTS {
            match std::net::TcpListener::bind(("127.0.0.1", port)) {
                Ok(_) => return Ok(port),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::from(std::io::ErrorKind::AddrInUse))
    }

    fn check_dropped(keep: &[Cap]) -> Result<(), String> {
        drop_to(Some("nobody"), Some("nogroup"), keep).map_err(|e| format!("drop_to: {e}"))?;
        let r = nix::unistd::getresuid().map_err(|e| e.to_string())?;
        let g = nix::unistd::getresgid().map_err(|e| e.to_string())?;
        let ids = [r.real, r.effective, r.saved].map(|u| u.as_raw());
        let gids = [g.real, g.effective, g.saved].map(|g| g.as_raw());
        if ids != [65534; 3] || gids != [65534; 3] {
            return Err(format!("uids {ids:?} gids {gids:?}"));
        }
        let groups = nix::unistd::getgroups().map_err(|e| e.to_string())?;
        if groups.iter().map(|g| g.as_raw()).collect::<Vec<_>>() != [65534] {
            return Err(format!("groups {groups:?}"));
        }
        let mut want = keep.to_vec();
        want.sort_by_key(|c| c.index());
        if current_effective() != want {
            return Err(format!("effective {}", names(&current_effective())));
        }
        for set in [CapSet::Permitted, CapSet::Bounding] {
            let mut now: Vec<Cap> = caps::read(None, set)
                .map_err(|e| e.to_string())?
                .into_iter()
                .collect();
            now.sort_by_key(|c| c.index());
            if now != want {
                return Err(format!("{set:?} {}", names(&now)));
            }
        }
        if nix::unistd::setuid(Uid::from_raw(0)).is_ok() {
            return Err("setuid(0) succeeded after the drop".to_string());
        }
        // The kept set is real: a privileged port binds with
        // CAP_NET_BIND_SERVICE and is refused (EACCES) without it.
        let bind = bind_low_port();
        match (keep.contains(&Cap::CAP_NET_BIND_SERVICE), bind) {
            (true, Ok(_)) => Ok(()),
            (false, Err(e)) if e.kind() == std::io::ErrorKind::PermissionDenied => Ok(()),
            (kept, other) => Err(format!(
                "bind to a port below 1024 with CAP_NET_BIND_SERVICE kept={kept}: {other:?}"
            )),
        }
    }

    #[test]
    fn drop_keeps_exactly_the_named_capability() {
        if !is_root_or_skip("drop_keeps_exactly_the_named_capability") {
            return;
        }
        let (code, msg) = in_child(|| check_dropped(&[Cap::CAP_NET_BIND_SERVICE]));
        assert_eq!(code, 0, "child: {msg}");
    }

    #[test]
    fn drop_with_empty_keep_leaves_no_capability() {
        if !is_root_or_skip("drop_with_empty_keep_leaves_no_capability") {
            return;
        }
        let (code, msg) = in_child(|| check_dropped(&[]));
        assert_eq!(code, 0, "child: {msg}");
    }

    #[test]
    fn unknown_user_is_named() {
        if !is_root_or_skip("unknown_user_is_named") {
            return;
        }
        let (code, msg) = in_child(|| match drop_to(Some("no-such-user-shunt"), None, &[]) {
            Err(e @ CapsError::UnknownUser(_)) => Err(e.to_string()),
            other => Err(format!("unexpected: {other:?}")),
        });
        assert_eq!(code, 1);
        assert_eq!(msg, "unknown user 'no-such-user-shunt'");
    }

    #[test]
    fn names_are_kernel_spelling() {
        assert_eq!(names(&[]), "none");
        assert_eq!(
            names(&[Cap::CAP_NET_ADMIN, Cap::CAP_BPF]),
            "CAP_NET_ADMIN,CAP_BPF"
        );
    }
}
