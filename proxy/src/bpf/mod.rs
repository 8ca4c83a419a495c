//! Userspace side of the kernel handoff: loads the embedded eBPF object,
//! attaches the stream verdict to the SOCKHASH and offers thin map handles.
//!
//! Owns the one `aya::Ebpf` of the process (program, attach link, maps) and
//! the process-wide [`status`]. Every map operation is one or two `bpf(2)`
//! syscalls on a map fd, so [`Bpf`] is `Send + Sync` and usable from any
//! worker thread without a userspace lock. It does not forward bytes, decide
//! eligibility or run the drain checks: that is the handoff room's job, which
//! must follow the protocol written under "Race window" below.
//!
//! Map layouts, names and counter indices come from `proxy-common` only.
//!
//! # Kernel log records
//! The program logs rare diagnostic events with aya-log (ring buffer
//! `AYA_LOGS`). [`Bpf::load`] sets the kernel-side level from `tracing`'s
//! maximum level at that moment (so install the subscriber first) and
//! keeps the ring buffer; [`Bpf::take_logger`] hands out the future that
//! drains it into `tracing` events with target [`EBPF_LOG_TARGET`]. No
//! thread is started here: the caller polls that future on its own runtime
//! (the privilege drop refuses to run with more than one thread). Records
//! not drained in time are dropped by the program (the ring is full), never
//! segments.
//!
//! # Race window
//! The verdict (`proxy-ebpf`) redirects a segment received by socket `S` only
//! when `FlowCtl[cookie(S)]` says `ready && !paused` **and** the kernel's
//! `FlowStats[cookie(S)].passed_bytes == FlowCtl.passed_ack`. Otherwise it
//! returns SK_PASS: the bytes stay readable in `S` and userspace forwards them.
//! The kernel runs the verdicts of one socket one at a time (under that
//! socket's lock), and the same run that decides "pass" adds the bytes to
//! `passed_bytes`, so the comparison is the only switch point. The concerns:
//!
//! 1. **Insertion.** Bytes read by userspace before [`Bpf::insert_pair`] are
//!    forwarded by userspace first. Bytes that arrived after the last read but
//!    before insertion sit in the receive queue and stall until the next
//!    segment: kick them with `setsockopt(SO_RCVLOWAT, 1)` right after the
//!    insertion, which runs the verdict over the whole receive queue under the
//!    socket lock. Do not read `S` between insertion and the kick: such a read
//!    could take bytes the verdict never counted. After the kick every
//!    readable byte of `S` has gone through the verdict and was counted as
//!    passed (not ready yet), so "bytes userspace read since the kick" and
//!    `passed_bytes` count the same bytes.
//! 2. **Switching on.** Userspace forwards what it read, then writes
//!    `FlowCtl { ready: 1, passed_ack: <bytes it read since the kick> }` (its
//!    own count, never the kernel's: a passed skb can be queued to the socket
//!    by a kworker a little after it was counted, when the psock has a
//!    backlog). If the kernel passed more meanwhile, the counts differ and it
//!    keeps passing; userspace reads, forwards and acknowledges again. A
//!    redirect therefore only ever follows bytes userspace has already
//!    written to the peer, which are ahead of it in the peer's send queue.
//! 3. **Pause and resume.** [`Bpf::set_paused`] makes later segments pass (TCP
//!    flow control applies again). Redirected bytes may still sit in the
//!    destination's psock backlog (sent by a kworker): before writing passed
//!    bytes to the destination, userspace must wait until that backlog has
//!    left (`tcpi_bytes_acked + SIOCOUTQ` of the destination has caught up with
//!    `redirected_bytes` plus what userspace wrote), or its bytes overtake
//!    the kernel's. Resume with `ready`, `!paused` and a fresh `passed_ack`.
//! 4. **Teardown.** Deleting a socket's SOCKHASH entry drops its psock, which
//!    frees both bytes passed to it and not yet read and bytes redirected to
//!    it and not yet sent. [`Bpf::remove_pair`] is for flows whose directions
//!    were drained (the drain check before FIN, "Half-close" in the "Race
//!    window" of `crate::handoff::sockmap`) or are being aborted. A verdict
//!    already running when the entries go may still bump a counter after the
//!    final read: final counters can miss one segment.
//! 5. **Failed insertion.** The client (most likely to fail: CLOSE_WAIT gives
//!    EOPNOTSUPP) is inserted first; if the server's insertion fails after
//!    that, the client's entry is deleted again, and bytes the verdict passed
//!    to the client in that window (microseconds) are lost with its psock.
//!    [`InsertError::rolled_back_client`] tells the caller; such a flow must
//!    be closed rather than continued with splice, or bytes could be missing.
//! 6. **Single owner.** [`Bpf::set_ready`], [`Bpf::set_paused`] and
//!    [`Bpf::ack_passed`] read-modify-write `FlowCtl`; only the task that owns
//!    the flow may call them. The kernel never writes `FlowCtl`, and userspace
//!    never writes `FlowStats` after creating it, so no update is lost.
//!
//! Cookies are never reused within a boot, so a stale entry cannot alias a
//! new socket.
//!
//! # Pinned maps
//! With [`Pins`], the four data maps (SOCKHASH, control, counters, per-CPU
//! counters) are pinned as `DIR/<map name>` on the BPF filesystem, DIR being
//! one directory per instance under [`PIN_ROOT`] ([`pin_dir_for`]). A fresh
//! start replaces what it finds there; a reload (`reuse`) opens the pinned
//! maps instead of creating new ones, so the SOCKHASH entries and flow state
//! of its predecessor's flows are the ones it works on. Its own program is
//! then attached to that SOCKHASH, which replaces the map's program for
//! sockets inserted *later* only: a psock takes its own reference to the
//! verdict when the socket is inserted, so the predecessor's sockets keep
//! running the predecessor's program (identical code over the same maps)
//! for their whole life, even after that process exits, and no segment meets
//! a socket without a verdict. The log ring buffer is not pinned: records of
//! the old program are dropped once nobody drains them, never segments.

use std::future::Future;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use aya::maps::{HashMap as AyaHashMap, IterableMap, MapData, MapError, PerCpuArray, SockHash};
use aya::Ebpf;

use crate::sys::bpf as bpf_sys;
use aya_log::EbpfLogger;
use proxy_common::{
    FlowCtl, FlowState, FlowStats, SockKey, COUNTERS_LEN, COUNTERS_NAME, FLOW_CAPACITY,
    FLOW_CTL_NAME, FLOW_STATS_NAME, SOCKHASH_CAPACITY, SOCKHASH_NAME, VERDICT_PROGRAM,
};
use tracing::level_filters::LevelFilter;

#[cfg(test)]
mod tests;

/// The object `proxy/build.rs` built and checked (`xtask/src/ebpf.rs`).
#[cfg(not(shunt_no_bpf))]
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/shunt.bpf.o"));

/// Whether this binary carries the BPF object.
pub const BUILT_WITH_BPF: bool = cfg!(not(shunt_no_bpf));
/// What [`status`] says in a binary built with `SHUNT_NO_BPF=1`.
pub const NO_BPF_REASON: &str = "built without BPF object (SHUNT_NO_BPF=1)";

/// Update flags of `bpf(2)`.
const BPF_NOEXIST: u64 = 1;
const BPF_EXIST: u64 = 2;

/// `tracing` target of the events forwarded from the program's log records.
pub const EBPF_LOG_TARGET: &str = "proxy::bpf::kernel";

/// Where each instance's pinned maps live (one directory per instance).
pub const PIN_ROOT: &str = "/sys/fs/bpf/shunt";
/// The maps pinned and reused across reloads (the verdict's whole state).
pub const PINNED_MAPS: [&str; 4] = [SOCKHASH_NAME, FLOW_CTL_NAME, FLOW_STATS_NAME, COUNTERS_NAME];
/// Longest instance directory name (a path component is at most 255 bytes).
const PIN_NAME_MAX: usize = 200;

/// Where the maps are pinned, and whether pins found there are reused (a
/// reload) or replaced (a fresh start: they belong to a process that is gone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pins {
    pub dir: PathBuf,
    pub reuse: bool,
}

/// The pin directory of the instance whose reload socket (the stats socket
/// with `expose-fd listeners`, the same for every generation) is `socket`:
/// `PIN_ROOT/<the path with '/' and '.' as '_'>` (the BPF filesystem refuses
/// names with a dot). Two instances cannot bind the same socket, so they
/// never share maps.
pub fn pin_dir_for(socket: &Path) -> PathBuf {
    let mut name: String = socket
        .to_string_lossy()
        .chars()
        .map(|c| {
            if c == '/' || c == '.' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    let trimmed = name.trim_start_matches('_').to_string();
    name = if trimmed.is_empty() {
        "default".into()
    } else {
        trimmed
    };
    if name.len() > PIN_NAME_MAX {
        let mut cut = name.len() - PIN_NAME_MAX;
        while !name.is_char_boundary(cut) {
            cut += 1;
        }
        name = name[cut..].to_string();
    }
    Path::new(PIN_ROOT).join(name)
}

/// Why [`Bpf::load`] failed.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// The binary was built with `SHUNT_NO_BPF=1`.
    #[error("{NO_BPF_REASON}")]
    NotBuilt,
    /// Creating the maps or parsing the object failed.
    #[error("loading the BPF object: {0}")]
    Load(#[from] aya::EbpfError),
    /// Loading or attaching the verdict failed.
    #[error("program {VERDICT_PROGRAM}: {0}")]
    Program(#[from] aya::programs::ProgramError),
    /// A map is missing from the object or has the wrong type.
    #[error("map {name}: {source}")]
    Map {
        /// The map's name (a `proxy-common` const).
        name: &'static str,
        /// What aya said.
        #[source]
        source: MapError,
    },
    /// A map or program the loader needs is not in the object.
    #[error("{0} missing from the BPF object")]
    Missing(&'static str),
}

impl BpfError {
    /// One-line reason for operators: the errno name and what it usually
    /// means first, then the full error.
    pub fn reason(&self) -> String {
        let errno = io_errno(self);
        let hint = match errno {
            Some(libc::EPERM) => Some("EPERM: missing CAP_BPF (and CAP_NET_ADMIN)"),
            Some(libc::EACCES) => Some("EACCES: refused by the verifier or a security module"),
            Some(libc::ENOMEM) => Some("ENOMEM: locked-memory or memcg limit"),
            Some(libc::ENOSYS) => Some("ENOSYS: kernel without bpf(2)"),
            Some(libc::EINVAL) => Some("EINVAL: kernel rejected the program or a map"),
            _ => None,
        };
        match hint {
            Some(h) => format!("{h} ({self})"),
            None => self.to_string(),
        }
    }
}

/// First `io::Error` errno in an error's source chain.
fn io_errno(err: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(code) = io.raw_os_error() {
                return Some(code);
            }
        }
        cur = e.source();
    }
    None
}

/// Why [`Bpf::insert_pair`] did not insert a pair. Every variant means the
/// flow stays with userspace forwarding (splice or copy).
#[derive(Debug, thiserror::Error)]
pub enum InsertError {
    /// `SO_COOKIE` failed (not a socket?).
    #[error("SO_COOKIE on fd {fd}: {source}")]
    Cookie {
        /// The descriptor.
        fd: i32,
        /// The errno.
        #[source]
        source: std::io::Error,
    },
    /// EOPNOTSUPP: the socket is not in a state sockmap accepts (e.g.
    /// CLOSE_WAIT: the peer already sent FIN) or not TCP.
    #[error("fd {fd} cannot enter the SOCKHASH (EOPNOTSUPP: not established, e.g. CLOSE_WAIT)")]
    NotSupported {
        /// The descriptor that was refused.
        fd: i32,
        /// The client entry had been inserted and was deleted again.
        rolled_back_client: bool,
    },
    /// EBUSY: the socket is already in a verdict-attached map; or EEXIST:
    /// its cookie already keys an entry (it is part of a live pair).
    #[error("fd {fd} is already in a verdict-attached map (errno {errno})")]
    Busy {
        /// The descriptor that was refused.
        fd: i32,
        /// EBUSY or EEXIST.
        errno: i32,
        /// The client entry had been inserted and was deleted again.
        rolled_back_client: bool,
    },
    /// A map is full (E2BIG/ENOSPC/ENOMEM).
    #[error("{map} is full ({source})")]
    MapFull {
        /// Which map.
        map: &'static str,
        /// The errno.
        #[source]
        source: std::io::Error,
        /// The client entry had been inserted and was deleted again.
        rolled_back_client: bool,
    },
    /// Any other `bpf(2)` failure.
    #[error("{op} on {map}: {source}")]
    Other {
        /// The syscall command.
        op: &'static str,
        /// Which map.
        map: &'static str,
        /// The errno.
        #[source]
        source: std::io::Error,
        /// The client entry had been inserted and was deleted again.
        rolled_back_client: bool,
    },
}

impl InsertError {
    /// True when the client socket had been attached and was detached again,
    /// which may have dropped bytes passed to it meanwhile (Race window, 5).
    pub fn rolled_back_client(&self) -> bool {
        match self {
            InsertError::Cookie { .. } => false,
            InsertError::NotSupported {
                rolled_back_client, ..
            }
            | InsertError::Busy {
                rolled_back_client, ..
            }
            | InsertError::MapFull {
                rolled_back_client, ..
            }
            | InsertError::Other {
                rolled_back_client, ..
            } => *rolled_back_client,
        }
    }
}

/// A failed map operation other than an insertion.
#[derive(Debug, thiserror::Error)]
pub enum MapOpError {
    /// No entry for that cookie (flow unknown or already removed).
    #[error("no {map} entry for cookie {cookie}")]
    NotFound {
        /// Which map.
        map: &'static str,
        /// The key.
        cookie: SockKey,
    },
    /// The syscall failed.
    #[error("{op} on {map}: {source}")]
    Sys {
        /// The syscall command.
        op: &'static str,
        /// Which map.
        map: &'static str,
        /// The errno.
        #[source]
        source: std::io::Error,
    },
    /// aya failed reading a map.
    #[error("reading {map}: {source}")]
    Aya {
        /// Which map.
        map: &'static str,
        /// What aya said.
        #[source]
        source: MapError,
    },
}

/// Final counters of both directions of a removed pair (zero when an entry
/// was already gone).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PairStats {
    /// Bytes the client sent (keyed by the client's cookie).
    pub from_client: FlowStats,
    /// Bytes the server sent (keyed by the server's cookie).
    pub from_server: FlowStats,
}

/// The loaded program and handles on its maps. `Send + Sync`.
pub struct Bpf {
    /// Owns the program and its attachment (attached late by a successor).
    ebpf: Mutex<Ebpf>,
    socks: SockHash<MapData, SockKey>,
    flow_ctl: AyaHashMap<MapData, SockKey, FlowCtl>,
    flow_stats: AyaHashMap<MapData, SockKey, FlowStats>,
    counters: PerCpuArray<MapData, u64>,
    /// The program's log ring buffer until [`Bpf::take_logger`] takes it;
    /// `None` from the start when the object logs nothing.
    logger: Mutex<Option<EbpfLogger<TracingForward>>>,
    /// Where the maps are pinned (`None`: not pinned).
    pinned: Option<PathBuf>,
    /// The pin directory and its parent, held open from the load: the pins
    /// are removed through them, so a final stop inside a `chroot`, where
    /// `pinned` resolves elsewhere, still removes them.
    pin_dirs: Option<(std::fs::File, std::fs::File)>,
    /// The maps were a predecessor's (opened from their pins).
    reused: bool,
    /// The verdict is attached to the SOCKHASH (deferred for reused maps).
    attached: std::sync::atomic::AtomicBool,
}

const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Bpf>();
};

impl std::fmt::Debug for Bpf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bpf")
            .field("socks_fd", &raw_fd(&self.socks))
            .field("flow_ctl_fd", &raw_fd(&self.flow_ctl))
            .field("flow_stats_fd", &raw_fd(&self.flow_stats))
            .finish_non_exhaustive()
    }
}

impl Bpf {
    /// Loads the embedded object and attaches the verdict to the SOCKHASH.
    pub fn load() -> Result<Bpf, BpfError> {
        Self::load_pinned(None)
    }

    /// [`Bpf::load`] with the data maps pinned (and reused) as `pins` says.
    /// If the pin directory cannot be made (no BPF filesystem), the maps are
    /// not pinned: a warning, and kernel flows will not survive a reload.
    pub fn load_pinned(pins: Option<&Pins>) -> Result<Bpf, BpfError> {
        Self::load_inner(pins.and_then(prepare_pins))
    }

    #[cfg(shunt_no_bpf)]
    fn load_inner(_pins: Option<(PathBuf, bool)>) -> Result<Bpf, BpfError> {
        Err(BpfError::NotBuilt)
    }

    #[cfg(not(shunt_no_bpf))]
    fn load_inner(pins: Option<(PathBuf, bool)>) -> Result<Bpf, BpfError> {
        raise_memlock_limit();
        let level = kernel_log_level(LevelFilter::current());
        let mut loader = aya::EbpfLoader::new();
        // must_exist false: an object without log records has no level.
        loader.override_global(aya_log::LEVEL, &level, false);
        let pin_paths: Vec<(&'static str, PathBuf)> = match &pins {
            Some((dir, _)) => PINNED_MAPS.iter().map(|m| (*m, dir.join(m))).collect(),
            None => Vec::new(),
        };
        for (name, path) in &pin_paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = loader.load(OBJECT)?;
        let socks: SockHash<MapData, SockKey> = take(&mut ebpf, SOCKHASH_NAME)?;
        let flow_ctl = take(&mut ebpf, FLOW_CTL_NAME)?;
        let flow_stats = take(&mut ebpf, FLOW_STATS_NAME)?;
        let counters = take(&mut ebpf, COUNTERS_NAME)?;
        let program: &mut aya::programs::SkSkb = ebpf
            .program_mut(VERDICT_PROGRAM)
            .ok_or(BpfError::Missing(VERDICT_PROGRAM))?
            .try_into()?;
        program.load()?;
        // A successor attaches only once it is sure to start (see
        // [`Bpf::attach_verdict`]): attaching changes the predecessor's map.
        let reused = pins.as_ref().is_some_and(|(_, reused)| *reused);
        if !reused {
            program.attach(socks.fd())?;
        }
        // After the program load (it holds its own reference to the ring
        // buffer by then). A logger that cannot start costs only the records.
        let logger = match EbpfLogger::init_with_logger(&mut ebpf, TracingForward) {
            Ok(logger) => Some(logger),
            Err(aya_log::Error::MapNotFound) => None,
            Err(e) => {
                tracing::warn!(error = %e, "BPF log records unavailable");
                None
            }
        };
        Ok(Bpf {
            ebpf: Mutex::new(ebpf),
            socks,
            flow_ctl,
            flow_stats,
            counters,
            logger: Mutex::new(logger),
            reused,
            attached: std::sync::atomic::AtomicBool::new(!reused),
            pin_dirs: pins.as_ref().and_then(|(dir, _)| open_pin_dirs(dir)),
            pinned: pins.map(|(dir, _)| dir),
        })
    }

    /// Attach the verdict to the SOCKHASH if the load left it detached (maps
    /// reused from a predecessor). Until then the predecessor's map keeps the
    /// program it had: a reload that fails before this step changed nothing
    /// in the kernel. After it, sockets inserted later (by either process)
    /// run this program, identical code over the same maps, whose log records
    /// only this process drains.
    pub fn attach_verdict(&self) -> Result<(), BpfError> {
        use std::sync::atomic::Ordering;
        if self.attached.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut ebpf = self
            .ebpf
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let program: &mut aya::programs::SkSkb = ebpf
            .program_mut(VERDICT_PROGRAM)
            .ok_or(BpfError::Missing(VERDICT_PROGRAM))?
            .try_into()?;
        program.attach(self.socks.fd())?;
        self.attached.store(true, Ordering::Release);
        Ok(())
    }

    /// Where the maps are pinned, if they are.
    pub fn pin_dir(&self) -> Option<&Path> {
        self.pinned.as_deref()
    }

    /// Remove the pins (the process stops for good: no successor took its
    /// maps). The maps go when their last holder closes them.
    pub fn unpin(&self) {
        use nix::unistd::{unlinkat, UnlinkatFlags};
        use std::os::fd::AsRawFd;
        let Some(dir) = &self.pinned else {
            return;
        };
        let Some((fd, parent)) = &self.pin_dirs else {
            for m in PINNED_MAPS {
                let _ = std::fs::remove_file(dir.join(m));
            }
            let _ = std::fs::remove_dir(dir);
            return;
        };
        for m in PINNED_MAPS {
            let _ = unlinkat(Some(fd.as_raw_fd()), m, UnlinkatFlags::NoRemoveDir);
        }
        if let Some(name) = dir.file_name() {
            let _ = unlinkat(Some(parent.as_raw_fd()), name, UnlinkatFlags::RemoveDir);
        }
    }

    /// Give the pin directory to `uid`/`gid` before the process drops to
    /// them, so that [`Bpf::unpin`] can still remove the pins in it (their
    /// directory is root's otherwise). The directory itself stays: removing
    /// it needs write access to [`PIN_ROOT`], which is not handed out; a
    /// fresh start reuses it.
    pub fn hand_pins_to(
        &self,
        uid: Option<nix::unistd::Uid>,
        gid: nix::unistd::Gid,
    ) -> nix::Result<()> {
        match &self.pinned {
            Some(dir) => nix::unistd::chown(dir, uid, Some(gid)),
            None => Ok(()),
        }
    }

    /// Whether the maps were opened from a predecessor's pins.
    pub fn reused_pins(&self) -> bool {
        self.reused
    }

    /// The kernel's id of the SOCKHASH: two processes share their maps when
    /// their ids are equal.
    pub fn sockhash_id(&self) -> Option<u32> {
        self.socks.map().info().ok().map(|i| i.id())
    }

    /// The task that forwards the program's log records into `tracing`
    /// (target [`EBPF_LOG_TARGET`]), at most once per load (`None` after the
    /// first call, or when the object logs nothing). It never ends on its
    /// own; dropping it stops the forwarding (the program keeps working and
    /// drops records once the ring is full).
    ///
    /// It must be polled inside a tokio runtime with I/O enabled (it waits
    /// on the ring buffer's fd with `AsyncFd`); it starts no thread, so the
    /// daemon can spawn it on a worker after the privilege drop.
    pub fn take_logger(&self) -> Option<impl Future<Output = ()> + Send + 'static> {
        let logger = match self.logger.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        }?;
        Some(forward_log_records(logger))
    }

    /// Inserts a pair crosswise: `cookie(client) -> server`,
    /// `cookie(server) -> client`, after creating both directions' flow
    /// entries (not ready: the verdict passes until [`Bpf::set_ctl`] says
    /// otherwise). Returns `(cookie(client), cookie(server))`. On error
    /// nothing stays in any map.
    pub fn insert_pair(
        &self,
        client: impl AsFd,
        server: impl AsFd,
    ) -> Result<(SockKey, SockKey), InsertError> {
        let (client, server) = (client.as_fd(), server.as_fd());
        let cc = cookie_of(client)?;
        let cs = cookie_of(server)?;
        // NOEXIST everywhere: a cookie already present belongs to a live pair
        // whose entries must survive this failed attempt untouched.
        self.create_flow(cc, client)?;
        if let Err(e) = self.create_flow(cs, server) {
            self.forget_flow(cc);
            return Err(e);
        }
        // Client first (see Race window, 5): it is the likelier to be refused.
        if let Err(source) =
            bpf_sys::update(raw_fd(&self.socks), &cs, &fd_value(client), BPF_NOEXIST)
        {
            self.forget_flow(cc);
            self.forget_flow(cs);
            return Err(insert_error(source, client, SOCKHASH_NAME, false));
        }
        if let Err(source) =
            bpf_sys::update(raw_fd(&self.socks), &cc, &fd_value(server), BPF_NOEXIST)
        {
            let _ = bpf_sys::delete(raw_fd(&self.socks), &cs);
            self.forget_flow(cc);
            self.forget_flow(cs);
            return Err(insert_error(source, server, SOCKHASH_NAME, true));
        }
        Ok((cc, cs))
    }

    /// Creates one direction's entries (not ready, zero counters); on error
    /// nothing it created stays.
    fn create_flow(&self, cookie: SockKey, sock: BorrowedFd<'_>) -> Result<(), InsertError> {
        bpf_sys::update(
            raw_fd(&self.flow_stats),
            &cookie,
            &FlowStats::default(),
            BPF_NOEXIST,
        )
        .map_err(|e| insert_error(e, sock, FLOW_STATS_NAME, false))?;
        bpf_sys::update(
            raw_fd(&self.flow_ctl),
            &cookie,
            &FlowCtl::default(),
            BPF_NOEXIST,
        )
        .map_err(|e| {
            let _ = bpf_sys::delete(raw_fd(&self.flow_stats), &cookie);
            insert_error(e, sock, FLOW_CTL_NAME, false)
        })
    }

    fn forget_flow(&self, cookie: SockKey) {
        let _ = bpf_sys::delete(raw_fd(&self.flow_ctl), &cookie);
        let _ = bpf_sys::delete(raw_fd(&self.flow_stats), &cookie);
    }

    /// Deletes both SOCKHASH keys and both directions' flow entries; returns
    /// the final counters. Missing entries are not an error (idempotent).
    /// Read Race window, 4, before calling it on a live flow.
    pub fn remove_pair(&self, cookie_client: SockKey, cookie_server: SockKey) -> PairStats {
        let _ = bpf_sys::delete(raw_fd(&self.socks), &cookie_client);
        let _ = bpf_sys::delete(raw_fd(&self.socks), &cookie_server);
        let stats = PairStats {
            from_client: self.stats(cookie_client).unwrap_or_default(),
            from_server: self.stats(cookie_server).unwrap_or_default(),
        };
        self.forget_flow(cookie_client);
        self.forget_flow(cookie_server);
        stats
    }

    /// Writes one direction's control (only if the direction exists).
    pub fn set_ctl(&self, cookie: SockKey, ctl: FlowCtl) -> Result<(), MapOpError> {
        bpf_sys::update(raw_fd(&self.flow_ctl), &cookie, &ctl, BPF_EXIST).map_err(|source| {
            if source.raw_os_error() == Some(libc::ENOENT) {
                MapOpError::NotFound {
                    map: FLOW_CTL_NAME,
                    cookie,
                }
            } else {
                MapOpError::Sys {
                    op: "BPF_MAP_UPDATE_ELEM",
                    map: FLOW_CTL_NAME,
                    source,
                }
            }
        })
    }

    /// Reads one direction's control as userspace last wrote it.
    pub fn ctl(&self, cookie: SockKey) -> Result<FlowCtl, MapOpError> {
        self.flow_ctl
            .get(&cookie, 0)
            .map_err(|e| map_read_error(e, FLOW_CTL_NAME, cookie))
    }

    /// Reads one direction's kernel counters.
    pub fn stats(&self, cookie: SockKey) -> Result<FlowStats, MapOpError> {
        self.flow_stats
            .get(&cookie, 0)
            .map_err(|e| map_read_error(e, FLOW_STATS_NAME, cookie))
    }

    /// Sets `ready`, keeping `paused` and `passed_ack` (single owner: Race window, 6).
    pub fn set_ready(&self, cookie: SockKey, ready: bool) -> Result<(), MapOpError> {
        let ctl = self.ctl(cookie)?;
        self.set_ctl(
            cookie,
            FlowCtl {
                ready: u32::from(ready),
                ..ctl
            },
        )
    }

    /// Sets `paused`, keeping `ready` and `passed_ack` (single owner).
    pub fn set_paused(&self, cookie: SockKey, paused: bool) -> Result<(), MapOpError> {
        let ctl = self.ctl(cookie)?;
        self.set_ctl(
            cookie,
            FlowCtl {
                paused: u32::from(paused),
                ..ctl
            },
        )
    }

    /// Acknowledges that userspace read and forwarded `passed_ack` passed
    /// bytes of this direction (its own count, Race window, 2).
    pub fn ack_passed(&self, cookie: SockKey, passed_ack: u64) -> Result<(), MapOpError> {
        let ctl = self.ctl(cookie)?;
        self.set_ctl(cookie, FlowCtl { passed_ack, ..ctl })
    }

    /// Control and counters of one direction, `None` if it is not in the maps.
    pub fn flow_state(&self, cookie: SockKey) -> Option<FlowState> {
        let ctl = self.ctl(cookie).ok()?;
        let stats = self.stats(cookie).unwrap_or_default();
        Some(FlowState { ctl, stats })
    }

    /// Number of SOCKHASH entries (two per inserted pair).
    pub fn sockhash_len(&self) -> usize {
        bounded_count(self.socks.keys(), SOCKHASH_CAPACITY)
    }

    /// Number of directions in the control map (two per inserted pair).
    pub fn flow_map_len(&self) -> usize {
        bounded_count(self.flow_ctl.keys(), FLOW_CAPACITY)
    }

    /// Number of directions in the counters map (two per inserted pair).
    pub fn flow_stats_len(&self) -> usize {
        bounded_count(self.flow_stats.keys(), FLOW_CAPACITY)
    }

    /// The per-CPU error and pass-reason counters summed over CPUs, indexed
    /// by `proxy_common::CTR_*` (names in `proxy_common::COUNTER_NAMES`).
    pub fn error_counters(&self) -> Result<[u64; COUNTERS_LEN as usize], MapOpError> {
        let mut sums = [0u64; COUNTERS_LEN as usize];
        for (index, sum) in (0..COUNTERS_LEN).zip(sums.iter_mut()) {
            let per_cpu = self
                .counters
                .get(&index, 0)
                .map_err(|source| MapOpError::Aya {
                    map: COUNTERS_NAME,
                    source,
                })?;
            *sum = per_cpu.iter().fold(0u64, |acc, v| acc.wrapping_add(*v));
        }
        Ok(sums)
    }

    /// Inserts `sock` under an arbitrary key: a building block for tests of
    /// the miss path (a socket whose own cookie has no entry).
    #[cfg(test)]
    fn insert_raw(&self, key: SockKey, sock: BorrowedFd<'_>) -> std::io::Result<()> {
        bpf_sys::update(raw_fd(&self.socks), &key, &fd_value(sock), BPF_NOEXIST)
    }

    #[cfg(test)]
    fn delete_raw(&self, key: SockKey) -> std::io::Result<()> {
        bpf_sys::delete(raw_fd(&self.socks), &key)
    }
}

/// The pin directory `dir` and its parent, opened (read-only, close-on-exec)
/// for [`Bpf::unpin`]; `None` (the paths are used then) if either fails.
fn open_pin_dirs(dir: &Path) -> Option<(std::fs::File, std::fs::File)> {
    let parent = dir.parent()?;
    Some((
        std::fs::File::open(dir).ok()?,
        std::fs::File::open(parent).ok()?,
    ))
}

/// Make the pin directory and, unless reusing, remove stale pins. Returns the
/// directory and whether every map is already pinned there (to be reused).
fn prepare_pins(pins: &Pins) -> Option<(PathBuf, bool)> {
    if let Err(e) = std::fs::create_dir_all(&pins.dir) {
        tracing::warn!(
            dir = %pins.dir.display(),
            error = %e,
            "cannot make the BPF pin directory (is the BPF filesystem mounted at /sys/fs/bpf?): \
             maps not pinned, kernel flows will not survive a reload"
        );
        return None;
    }
    let present = PINNED_MAPS
        .iter()
        .filter(|m| pins.dir.join(m).exists())
        .count();
    if pins.reuse && present == PINNED_MAPS.len() {
        return Some((pins.dir.clone(), true));
    }
    // A fresh start, or an incomplete set: the pins belong to no live
    // predecessor we could continue; a new set replaces them.
    for m in PINNED_MAPS {
        match std::fs::remove_file(pins.dir.join(m)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(map = m, error = %e, "cannot remove a stale BPF pin: maps not pinned");
                return None;
            }
        }
    }
    Some((pins.dir.clone(), false))
}

/// Drains the ring buffer whenever it becomes readable, until an error.
async fn forward_log_records(logger: EbpfLogger<TracingForward>) {
    use tokio::io::{unix::AsyncFd, Interest};
    // SAFETY: the fd is the ring buffer map's, owned by `logger.ring_buf`'s
    // `MapData` for the logger's whole life and never replaced; the AsyncFd
    // owns the logger, so the fd stays open and the same until it is dropped.
    let registered = unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) };
    let mut ring = match registered {
        Ok(ring) => ring,
        Err(e) => {
            tracing::warn!(error = %e, "BPF log records unavailable (epoll registration)");
            return;
        }
    };
    loop {
        let mut ready = match ring.readable_mut().await {
            Ok(ready) => ready,
            Err(e) => {
                tracing::warn!(error = %e, "BPF log forwarding stopped");
                return;
            }
        };
        ready.get_inner_mut().flush();
        // Cleared only if no new readiness arrived since the wait returned,
        // so a record committed during the flush is not missed.
        ready.clear_ready();
    }
}

/// aya-log's record level for the most verbose `tracing` level enabled:
/// records the subscriber would drop are not even written by the program.
#[cfg(any(test, not(shunt_no_bpf)))]
fn kernel_log_level(max: LevelFilter) -> u8 {
    let level = match max.into_level() {
        None => return 0,
        Some(tracing::Level::ERROR) => aya_log::Level::Error,
        Some(tracing::Level::WARN) => aya_log::Level::Warn,
        Some(tracing::Level::INFO) => aya_log::Level::Info,
        Some(tracing::Level::DEBUG) => aya_log::Level::Debug,
        Some(tracing::Level::TRACE) => aya_log::Level::Trace,
    };
    level as u8
}

/// The `log::Log` aya-log writes records to: turns each into a `tracing`
/// event (target [`EBPF_LOG_TARGET`], message prefixed `bpf: `), so the
/// records follow the subscriber's filter and format (`shunt -v`) without a
/// process-wide `log` logger.
#[derive(Debug, Clone, Copy)]
struct TracingForward;

impl log::Log for TracingForward {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        let level = match metadata.level() {
            log::Level::Error => LevelFilter::ERROR,
            log::Level::Warn => LevelFilter::WARN,
            log::Level::Info => LevelFilter::INFO,
            log::Level::Debug => LevelFilter::DEBUG,
            log::Level::Trace => LevelFilter::TRACE,
        };
        level <= LevelFilter::current()
    }

    fn log(&self, record: &log::Record<'_>) {
        let msg = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: EBPF_LOG_TARGET, "bpf: {msg}"),
            log::Level::Warn => tracing::warn!(target: EBPF_LOG_TARGET, "bpf: {msg}"),
            log::Level::Info => tracing::info!(target: EBPF_LOG_TARGET, "bpf: {msg}"),
            log::Level::Debug => tracing::debug!(target: EBPF_LOG_TARGET, "bpf: {msg}"),
            log::Level::Trace => tracing::trace!(target: EBPF_LOG_TARGET, "bpf: {msg}"),
        }
    }

    fn flush(&self) {}
}

/// Counts the keys of an aya key iterator, at most `capacity + 1` steps: a
/// map changing under the walk can restart it, and a count must end.
fn bounded_count<K>(keys: impl Iterator<Item = Result<K, MapError>>, capacity: u32) -> usize {
    let limit = usize::try_from(capacity)
        .unwrap_or(usize::MAX)
        .saturating_add(1);
    keys.take(limit).filter(Result::is_ok).count()
}

fn map_read_error(e: MapError, map: &'static str, cookie: SockKey) -> MapOpError {
    match e {
        MapError::KeyNotFound => MapOpError::NotFound { map, cookie },
        source => MapOpError::Aya { map, source },
    }
}

#[cfg(not(shunt_no_bpf))]
fn take<M>(ebpf: &mut Ebpf, name: &'static str) -> Result<M, BpfError>
where
    M: TryFrom<aya::maps::Map, Error = MapError>,
{
    let map = ebpf.take_map(name).ok_or(BpfError::Missing(name))?;
    M::try_from(map).map_err(|source| BpfError::Map { name, source })
}

/// Raises RLIMIT_MEMLOCK for kernels that still charge BPF memory to it
/// (< 5.11); newer kernels use memcg and ignore it. Failure is not fatal:
/// the map creation that needs it reports ENOMEM/EPERM itself.
#[cfg(not(shunt_no_bpf))]
fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid, initialised rlimit struct we own.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
    if rc != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "could not raise RLIMIT_MEMLOCK (fine on kernels >= 5.11)"
        );
    }
}

/// The socket cookie (`SO_COOKIE`), the key of every map.
pub fn socket_cookie(fd: BorrowedFd<'_>) -> std::io::Result<SockKey> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `fd` is a live descriptor for the borrow; the kernel writes at
    // most `len` (8) bytes into `cookie`, a u64 we own, and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(cookie)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn cookie_of(fd: BorrowedFd<'_>) -> Result<SockKey, InsertError> {
    socket_cookie(fd).map_err(|source| InsertError::Cookie {
        fd: fd.as_raw_fd(),
        source,
    })
}

/// SOCKHASH value for an update: the socket's descriptor (value size 4).
fn fd_value(fd: BorrowedFd<'_>) -> u32 {
    // A live descriptor is never negative.
    fd.as_raw_fd().unsigned_abs()
}

fn insert_error(
    source: std::io::Error,
    fd: BorrowedFd<'_>,
    map: &'static str,
    rolled_back_client: bool,
) -> InsertError {
    let fd = fd.as_raw_fd();
    match source.raw_os_error() {
        Some(libc::EOPNOTSUPP) => InsertError::NotSupported {
            fd,
            rolled_back_client,
        },
        Some(errno @ (libc::EBUSY | libc::EEXIST)) => InsertError::Busy {
            fd,
            errno,
            rolled_back_client,
        },
        Some(libc::E2BIG) | Some(libc::ENOSPC) | Some(libc::ENOMEM) => InsertError::MapFull {
            map,
            source,
            rolled_back_client,
        },
        _ => InsertError::Other {
            op: "BPF_MAP_UPDATE_ELEM",
            map,
            source,
            rolled_back_client,
        },
    }
}

fn raw_fd<K, V>(map: &impl IterableMap<K, V>) -> BorrowedFd<'_>
where
    K: aya::Pod,
{
    map.map().fd().as_fd()
}
