//! The running process: listeners, worker threads, signals, pidfile, stop.
//!
//! Builds the [`Runtime`] every worker shares (`crate::runtime`) and drives
//! the life cycle:
//! `Running` → (`SIGUSR1`) `SoftStop` → (last flow ends or `hard-stop-after`)
//! exit; `SIGTERM`/`SIGINT` → `HardStop`: listeners close and every flow is
//! closed at once. All listening sockets are bound before any thread starts,
//! so a bind error is a start-up error and nothing half-runs.
//!
//! Reload (HAProxy's `-x PATH -sf PID...`): a successor takes dups of every
//! listening socket of the running process over its stats socket
//! ([`crate::reload`], [`crate::listeners`]), runs every start-up step that
//! can fail, starts its workers with accepting held, and only then takes the
//! running process over: `_getflows ... commit` hands the kernel flows and
//! commits; without the commit the old process undoes its side and serves on
//! (see [`run`] for the three stages). Then it sends the old processes SIGUSR1
//! (`-sf`, soft stop) or SIGTERM (`-st`). Both hold the same sockets in
//! between, so a client is never refused. Under systemd the successor says
//! `RELOADING=1` when it starts and `READY=1` with its `MAINPID=` once it
//! serves; a process taken over never says `STOPPING=1`.
//!
//! Kernel flows survive a reload: the BPF maps are pinned per instance
//! (`crate::bpf`, "Pinned maps") and a successor started with `-x` reuses
//! them, and spreads the adopted flows over its workers. The old process
//! soft-stops on the commit and exits as soon as the flows it still runs in
//! userspace end: the handed-over ones are no longer its own.

use std::path::PathBuf;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::signal::unix::Signal;
use tokio::sync::watch;

use crate::config::{Config, ForwardMode};
use crate::handoff::Kernel;
use crate::runtime::{ConnGuard, Facts, Phase, Runtime};
use crate::scheduler::{self, Class, SchedConfig};
use crate::stats::Event;

/// How long start-up waits for every worker thread to be up.
const WORKERS_START: Duration = Duration::from_secs(5);
/// How often a paused accept loop (maxconn reached) re-checks, in case a wake was missed.
const ACCEPT_PAUSE_RECHECK: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Listen(#[from] crate::listeners::ListenError),
    #[error("cannot write pidfile '{path}': {source}")]
    Pidfile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start worker thread {thread}: {source}")]
    Thread {
        thread: usize,
        source: std::io::Error,
    },
    #[error("forward-mode sockmap: BPF unavailable ({0})")]
    BpfRequired(String),
    #[error("cannot install the signal handlers: {0}")]
    Signals(std::io::Error),
    /// HAProxy's wording: `[haproxy.main()] Cannot chroot(DIR).`
    #[error("Cannot chroot({}): {source}", dir.display())]
    Chroot {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot drop privileges: {0}")]
    Privileges(String),
    #[error("cannot attach the BPF verdict to the reused maps: {0}")]
    Attach(String),
    #[error(transparent)]
    Cli(#[from] crate::cli::CliError),
    #[error(transparent)]
    Reload(#[from] crate::reload::ReloadError),
    #[error(transparent)]
    Log(#[from] crate::log::LogError),
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error(transparent)]
    StatsPage(#[from] crate::statspage::StatsPageError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
}

/// Options from the command line that override the configuration.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub forward_mode: Option<ForwardMode>,
    /// `-x PATH`: take the listening sockets from the process serving this stats socket.
    pub xfer_socket: Option<PathBuf>,
    /// `-sf PID...` / `-st PID...`: processes told to stop once this one serves.
    pub old_pids: Vec<i32>,
    /// `-st` rather than `-sf`: the old processes get SIGTERM (hard stop), not SIGUSR1.
    pub old_pids_hard: bool,
}

impl Options {
    /// Whether this process replaces running ones (a reload).
    fn reloading(&self) -> bool {
        self.xfer_socket.is_some() || !self.old_pids.is_empty()
    }
}

fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The pidfile: opened (created if missing) at start-up while privileges
/// allow, written once the process serves — a reload that fails before then
/// leaves the old process's pid in it (and a fresh start that fails leaves
/// no empty file).
struct PidFile {
    file: Option<OpenPidFile>,
    /// Read when dropping: a successor that took the process over owns the file.
    handover: Arc<crate::runtime::Handover>,
}

struct OpenPidFile {
    path: PathBuf,
    file: std::fs::File,
    /// The file did not exist before we opened it.
    created: bool,
    written: bool,
}

impl PidFile {
    fn open(
        path: Option<&PathBuf>,
        handover: Arc<crate::runtime::Handover>,
    ) -> Result<Self, DaemonError> {
        let Some(p) = path else {
            return Ok(PidFile {
                file: None,
                handover,
            });
        };
        let created = std::fs::symlink_metadata(p).is_err();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(p)
            .map_err(|source| DaemonError::Pidfile {
                path: p.clone(),
                source,
            })?;
        Ok(PidFile {
            file: Some(OpenPidFile {
                path: p.clone(),
                file,
                created,
                written: false,
            }),
            handover,
        })
    }

    /// Replace the file's content with our pid (a failure is logged: the
    /// process serves already).
    fn write_pid(&mut self) {
        use std::io::{Seek, Write};
        let Some(f) = &mut self.file else {
            return;
        };
        let line = format!("{}\n", std::process::id());
        let done = f
            .file
            .set_len(0)
            .and_then(|()| f.file.rewind())
            .and_then(|()| f.file.write_all(line.as_bytes()));
        match done {
            Ok(()) => f.written = true,
            Err(e) => {
                tracing::warn!(path = %f.path.display(), error = %e, "cannot write the pidfile")
            }
        }
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let Some(f) = &self.file else {
            return;
        };
        // A successor that took us over owns the file, even before it wrote
        // its pid there (we may exit first).
        if self.handover.handed_over() {
            return;
        }
        // Only our own: after a reload the file holds the successor's pid.
        let ours = if f.written {
            std::fs::read_to_string(&f.path)
                .is_ok_and(|s| s.trim() == std::process::id().to_string())
        } else {
            f.created && std::fs::metadata(&f.path).is_ok_and(|m| m.len() == 0)
        };
        if ours {
            let _ = std::fs::remove_file(&f.path);
        }
    }
}

/// Drop to `user`/`group` from the global section, after binding and after
/// the BPF load, before any worker thread starts (capabilities are per
/// thread; the workers inherit the main thread's sets).
///
/// Keeps only what the runtime needs: with BPF loaded, the per-flow map
/// operations (SOCKHASH insert/delete with socket fds, flow map
/// update/lookup/delete, key walks) are `bpf(2)` calls on descriptors the
/// process already holds. Since Linux 6.5 those need no capability; older
/// kernels with `kernel.unprivileged_bpf_disabled` set check CAP_BPF on every
/// call, so the kernel is asked ([`crate::sys::caps::held_bpf_fd_needs_cap`])
/// and CAP_BPF is kept only if it says so. Everything else (binding, the
/// stats socket, the pidfile, map creation and program load) happened before.
///
/// The accounts were looked up in stage 1 (`target`), before a `chroot`
/// hid the password database.
fn drop_privileges(
    target: Option<&crate::sys::caps::Target>,
    kernel_loaded: bool,
) -> Result<(), DaemonError> {
    use crate::sys::caps::{self, Cap};
    let Some(target) = target else {
        return Ok(());
    };
    // The one fact of whether BPF loaded is the loaded handle itself.
    let (keep, why): (Vec<Cap>, String) = match kernel_loaded {
        true => match caps::held_bpf_fd_needs_cap() {
            Ok(false) => (
                Vec::new(),
                "BPF loaded; map operations on held descriptors need no capability on this kernel"
                    .to_string(),
            ),
            Ok(true) => (
                vec![Cap::CAP_BPF],
                "BPF loaded; this kernel checks CAP_BPF on every bpf(2) call \
                 (unprivileged_bpf_disabled, Linux < 6.5)"
                    .to_string(),
            ),
            Err(e) => (
                vec![Cap::CAP_BPF],
                format!("BPF loaded; keeping CAP_BPF since the probe failed: {e}"),
            ),
        },
        false => (
            Vec::new(),
            "BPF not loaded; userspace forwarding needs no capability".to_string(),
        ),
    };
    caps::drop_resolved(target, &keep).map_err(|e| DaemonError::Privileges(e.to_string()))?;
    tracing::info!(
        uid = %nix::unistd::getuid(),
        gid = %nix::unistd::getgid(),
        kept = %caps::names(&caps::current_effective()),
        "dropped privileges: {why}"
    );
    Ok(())
}

/// `chroot DIR`: after every socket and file of the start is open (listeners,
/// stats sockets in place, log sockets, the pidfile, the server-state file
/// read, BPF loaded and pinned) and before the privilege drop, as HAProxy.
/// What the process still opens by path afterwards resolves inside DIR:
/// docs/configuration.md ("chroot") lists it. `jail` is DIR opened in stage 1
/// ([`open_chroot`]), so that a missing DIR fails before anything is published.
fn enter_chroot(config: &Config, jail: Option<&std::os::fd::OwnedFd>) -> Result<(), DaemonError> {
    let (Some(dir), Some(jail)) = (&config.global.chroot, jail) else {
        return Ok(());
    };
    crate::sys::root::enter(jail).map_err(|source| DaemonError::Chroot {
        dir: dir.clone(),
        source,
    })?;
    tracing::info!(dir = %dir.display(), "chrooted");
    Ok(())
}

/// The `chroot` directory, opened in stage 1 (see [`enter_chroot`]).
fn open_chroot(config: &Config) -> Result<Option<std::os::fd::OwnedFd>, DaemonError> {
    let Some(dir) = &config.global.chroot else {
        return Ok(None);
    };
    crate::sys::root::open(dir)
        .map(Some)
        .map_err(|source| DaemonError::Chroot {
            dir: dir.clone(),
            source,
        })
}

/// Load the BPF program when the mode may use it: the kernel handoff, or
/// none, with the status `show info` gives. `auto` without BPF warns once
/// and runs on splice; a forced `sockmap` without BPF is a start-up error.
fn load_bpf(
    config: &Config,
    mode: ForwardMode,
    reloading: bool,
) -> Result<(Option<Arc<Kernel>>, String), DaemonError> {
    if matches!(mode, ForwardMode::Splice | ForwardMode::Copy) {
        return Ok((None, format!("not loaded (forward-mode {})", mode.as_str())));
    }
    // Pinned only where a successor can find us: the reload socket names the instance.
    let pins = config
        .global
        .stats_sockets
        .iter()
        .find(|s| s.expose_fd_listeners)
        .map(|s| crate::bpf::Pins {
            dir: crate::bpf::pin_dir_for(&s.path),
            reuse: reloading,
        });
    match Kernel::load(config.global.sockmap_max_inflight, pins.as_ref()) {
        Ok(kernel) => {
            let how = if mode == ForwardMode::Sockmap {
                "forwarding with sockmap"
            } else {
                "flows that show they pay go to sockmap (auto)"
            };
            tracing::info!(
                max_inflight = kernel.max_inflight(),
                pins = ?kernel.bpf().pin_dir(),
                reused = kernel.bpf().reused_pins(),
                "BPF loaded: stream verdict attached to the SOCKHASH; {how}"
            );
            Ok((Some(kernel), "loaded".to_string()))
        }
        Err(reason) if mode == ForwardMode::Sockmap => Err(DaemonError::BpfRequired(reason)),
        Err(reason) => {
            tracing::warn!(
                "BPF unavailable ({reason}); forwarding in userspace (copy; splice where a proxy asks for it)"
            );
            Ok((None, format!("unavailable ({reason})")))
        }
    }
}

/// Run the daemon until it is stopped. Returns when every worker has exited.
///
/// Start-up runs in three stages, so that a reload which fails leaves the
/// process it replaces exactly as it was (still listening, still owning its
/// stats sockets and its kernel flows):
///
/// 1. **Prepare** — everything that can fail, nothing the old process or
///    the outside world sees: take dups of the old process's listening
///    sockets (`-x`, `_getsocks`: it keeps its own), bind or inherit every
///    listening socket the configuration names (frontends, the Prometheus
///    exporter, stats sockets at temporary paths), load BPF (a successor
///    leaves the shared SOCKHASH's verdict as it is), open the log targets,
///    look the user and group up (before a `chroot` hides their database), connect to the old process for the
///    take-over, open the pidfile, build the runtime state.
/// 2. **Publish** — move fresh stats sockets into place (atomic renames),
///    attach the verdict, give the BPF pin directory to `user`, enter the
///    `chroot`, drop privileges, start the log, metrics and
///    worker threads with accepting held. Only steps that do not fail in
///    practice remain here; the old process is still untouched.
/// 3. **Take over** — ask the old process for its kernel flows and commit
///    (`crate::reload::take_over`), hand the flows to the workers, release
///    accepting, then signal `-sf`/`-st`. This is the only step the old
///    process takes part in, and it undoes its side unless the commit
///    arrives.
pub fn run(config: Config, opts: Options) -> Result<(), DaemonError> {
    let config = Arc::new(config);
    let nbthread = config.global.nbthread.unwrap_or_else(available_cpus).max(1);
    let forward_mode = opts.forward_mode.unwrap_or(config.global.forward_mode);
    scheduler::set_profiling_mode(match config.global.profiling_tasks {
        crate::config::ProfilingTasks::On => scheduler::ProfilingMode::On,
        crate::config::ProfilingTasks::Auto => scheduler::ProfilingMode::Auto,
        crate::config::ProfilingTasks::Off => scheduler::ProfilingMode::Off,
    });

    if opts.reloading() {
        crate::notify::notify_or_warn(&format!(
            "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=Reloading: new process {} starting",
            crate::notify::monotonic_usec(),
            std::process::id()
        ));
    }
    let signals = Signals::install()?;

    // 1. Prepare.
    let mut inherited = match &opts.xfer_socket {
        Some(path) => {
            let fds = crate::reload::fetch_sockets(path)?;
            tracing::info!(sockets = fds.len(), path = %path.display(), "took the listening sockets of the old process");
            crate::listeners::Inherited::sort(fds)
        }
        None => crate::listeners::Inherited::default(),
    };
    let (kernel, bpf_status) = load_bpf(&config, forward_mode, opts.xfer_socket.is_some())?;
    // Before any chroot: the kernel's ULP list is under /proc.
    let tls = crate::tls::Contexts::build(&config, crate::tls::KernelTls::detect())?;
    if tls.any() {
        match tls.kernel() {
            crate::tls::KernelTls::Available(_) => tracing::info!(
                "TLS flows are handed to the kernel (kTLS) after their handshakes"
            ),
            crate::tls::KernelTls::NoCiphers => tracing::warn!(
                "TLS flows are forwarded in userspace: the kernel's 'tls' ULP refused every cipher (kTLS crypto modules missing?)"
            ),
            crate::tls::KernelTls::Missing => tracing::warn!(
                "TLS flows are forwarded in userspace: the kernel has no 'tls' ULP (kTLS, CONFIG_TLS)"
            ),
        }
    }
    let listeners = crate::listeners::bind_frontends(&config, nbthread, &mut inherited)?;
    let prometheus = crate::listeners::bind_prometheus(&config, &mut inherited)?;
    let stats_pages = crate::listeners::bind_stats_pages(&config, &mut inherited)?;
    if opts.old_pids.is_empty() {
        inherited.drop_unix();
    }
    // The process's part in a reload: read by the stats sockets and the
    // pidfile when they drop, so made before them.
    let handover = Arc::new(crate::runtime::Handover::default());
    let mut cli_sockets = crate::cli::Sockets::bind(&config, &mut inherited, handover.clone())?;
    inherited.close_rest();
    let log = crate::log::open(&config)?;
    let drop_to = crate::sys::caps::resolve(
        config.global.user.as_deref(),
        config.global.group.as_deref(),
    )
    .map_err(|e| DaemonError::Privileges(e.to_string()))?;
    let jail = open_chroot(&config)?;
    // Opened while we may still connect (the socket's mode may exclude the
    // user we become); used in stage 3.
    let takeover_conn = match (&opts.xfer_socket, opts.old_pids.is_empty()) {
        (Some(path), false) => Some(crate::reload::connect(path)?),
        _ => None,
    };
    let pidfile = PidFile::open(config.global.pidfile.as_ref(), handover.clone())?;
    if config
        .global
        .stats_sockets
        .iter()
        .any(|s| s.expose_fd_listeners)
    {
        // Every listening socket we own travels to a successor.
        let mut dups: Vec<std::os::fd::OwnedFd> = listeners
            .iter()
            .flatten()
            .map(|(_, _, l)| l)
            .chain(prometheus.iter())
            .chain(stats_pages.iter().map(|(_, l)| l))
            .filter_map(|l| std::os::fd::AsFd::as_fd(l).try_clone_to_owned().ok())
            .collect();
        dups.extend(cli_sockets.dups());
        handover.export(dups);
    }
    let (phase_tx, phase_rx) = watch::channel(Phase::Running);
    // Accepting held until the take-over (stage 3) is done.
    let mut runtime = Runtime::new(
        config.clone(),
        Facts::new(forward_mode, bpf_status, nbthread),
        kernel,
        phase_rx,
        listeners.iter().map(Vec::len).sum(),
        true,
        handover,
    );
    runtime.tls = tls;
    let state = Arc::new(runtime);
    // Before any worker starts: the first checks and flows see the restored state.
    crate::checks::state_file::load(&state);
    crate::pool::init(&state);

    // 2. Publish.
    cli_sockets.publish()?;
    let kernel = state.forwarding.kernel.as_deref();
    if let Some(k) = kernel {
        k.bpf()
            .attach_verdict()
            .map_err(|e| DaemonError::Attach(e.to_string()))?;
    }
    if let (Some(b), Some(t)) = (kernel, &drop_to) {
        // Not fatal: the pins would only outlive a final stop.
        if let Err(e) = b.bpf().hand_pins_to(t.uid(), t.gid()) {
            tracing::warn!(error = %e, "cannot give the BPF pin directory to the configured user: a final stop will leave the pins");
        }
    }
    enter_chroot(&config, jail.as_ref())?;
    drop_privileges(drop_to.as_ref(), kernel.is_some())?;
    // Threads started after the drop hold no capability.
    if let Some(log) = log {
        log.start(&state.log)?;
    }
    if let Some(l) = prometheus {
        crate::metrics::serve(l, state.clone())?;
    }
    let pages = stats_pages
        .into_iter()
        .map(|(page, listener)| crate::statspage::PageListener { page, listener })
        .collect();
    crate::statspage::serve(pages, state.clone())?;
    // Worker 0 runs on this thread, in the runtime the signals were
    // registered with; the others get threads of their own. In steady state
    // a process of `nbthread 1` is then one thread, as HAProxy's is: a
    // second one, even idle, makes the kernel count references on every
    // descriptor a syscall uses (its table is shared). HAProxy given an
    // idle thread of its own (LD_PRELOAD) made 3 % fewer connections a
    // second in `redis-benchmark -k 0` (4 alternating pairs, 2026-12-07).
    let mut threads = Vec::with_capacity(nbthread);
    let mut handoffs = Vec::with_capacity(nbthread);
    let mut main_worker = None;
    for (tid, ls) in listeners.into_iter().enumerate() {
        let state = state.clone();
        let cli = if tid == 0 {
            cli_sockets.take_listeners()
        } else {
            Vec::new()
        };
        let cfg = SchedConfig {
            nbthread,
            runqueue_depth: config.global.runqueue_depth,
            low_latency: config.global.sched_low_latency,
            heavy_cap: config.global.sched_heavy_cap,
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        handoffs.push(tx);
        if tid == 0 {
            main_worker = Some((cfg, worker_main(state, ls, cli, rx)));
            continue;
        }
        let h = std::thread::Builder::new()
            .name(format!("shunt-worker-{tid}"))
            .spawn(move || scheduler::run_worker(tid, cfg, worker_main(state, ls, cli, rx)))
            .map_err(|source| DaemonError::Thread {
                thread: tid,
                source,
            })?;
        threads.push(h);
    }
    let phase_tx = Arc::new(phase_tx);

    // 3. Take over and announce, on a thread of its own that ends there
    // (its waits block, and worker 0 must run meanwhile).
    let start = {
        let state = state.clone();
        let opts = opts.clone();
        let phase = phase_tx.clone();
        let mut cli_sockets = cli_sockets;
        let mut pidfile = pidfile;
        std::thread::Builder::new()
            .name("shunt-start".into())
            .spawn(move || -> Result<_, DaemonError> {
                let started = announce(
                    &state,
                    &opts,
                    nbthread,
                    forward_mode,
                    takeover_conn,
                    handoffs,
                    &mut cli_sockets,
                    &mut pidfile,
                );
                if started.is_err() {
                    let _ = phase.send(Phase::HardStop);
                }
                started.map(|()| (cli_sockets, pidfile))
            })
            .map_err(|source| DaemonError::Thread { thread: 0, source })?
    };

    let Some((cfg, worker0)) = main_worker else {
        return Err(DaemonError::Thread {
            thread: 0,
            source: std::io::Error::other("no listeners for worker 0"),
        });
    };
    let Signals {
        rt,
        term,
        int,
        usr1,
    } = signals;
    let control = {
        let state = state.clone();
        let phase = phase_tx.clone();
        let hard_stop_after = config.global.hard_stop_after;
        async move {
            scheduler::spawn(Class::Bulk, "signals", async move {
                wait_for_signals((term, int, usr1), &phase, &state, hard_stop_after).await;
            });
            worker0.await;
        }
    };
    if let Err(e) = scheduler::try_run_worker_in(rt, 0, cfg, control) {
        let _ = phase_tx.send(Phase::HardStop);
        tracing::error!(error = %e, "worker 0 failed to start");
    }
    // The start thread ends soon after the phase leaves Running (its waits
    // are bounded), so this join does not hang a stop.
    let started = start.join().unwrap_or_else(|_| {
        Err(DaemonError::Thread {
            thread: 0,
            source: std::io::Error::other("the start-up thread panicked"),
        })
    });
    state.handover.close_exported();
    // Stopping for good: nobody will reuse the maps. Not after a start that
    // failed (a take-over refused): the old process goes on with the pins,
    // which its next successor needs.
    if started.is_ok() && !state.handover.handed_over() {
        if let Some(k) = &state.forwarding.kernel {
            k.bpf().unpin();
        }
    }
    for t in threads {
        let _ = t.join();
    }
    let (cli_sockets, pidfile) = started?;
    drop(pidfile);
    drop(cli_sockets);
    tracing::info!("shunt stopped");
    Ok(())
}

/// Stage 3 of [`run`], once every worker runs: take the old process's kernel
/// flows over (a reload), give each worker its share, let the workers
/// accept, write the pidfile, tell the old processes to stop and systemd
/// that we are ready. Nothing is announced once the phase left Running (a
/// stop came in during the take-over).
#[allow(clippy::too_many_arguments)]
fn announce(
    state: &Runtime,
    opts: &Options,
    nbthread: usize,
    forward_mode: ForwardMode,
    takeover_conn: Option<std::os::unix::net::UnixStream>,
    mut handoffs: Vec<tokio::sync::oneshot::Sender<Vec<crate::reload::AdoptedFlow>>>,
    cli_sockets: &mut crate::cli::Sockets,
    pidfile: &mut PidFile,
) -> Result<(), DaemonError> {
    if !state.workers.wait_for(nbthread, WORKERS_START) {
        tracing::warn!(nbthread, "not every worker started in time");
    }
    if let (Some(conn), Some(path)) = (takeover_conn, &opts.xfer_socket) {
        let id = state
            .forwarding
            .kernel
            .as_deref()
            .and_then(|k| k.bpf().sockhash_id());
        let flows = crate::reload::take_over(conn, path, id)?;
        if !flows.is_empty() {
            tracing::info!(
                flows = flows.len(),
                "took the kernel flows of the old process"
            );
        }
        let mut per_worker: Vec<Vec<crate::reload::AdoptedFlow>> =
            (0..nbthread).map(|_| Vec::new()).collect();
        for (i, f) in flows.into_iter().enumerate() {
            per_worker[i % nbthread].push(f);
        }
        for (tx, flows) in handoffs.drain(..).zip(per_worker) {
            let _ = tx.send(flows);
        }
    }
    drop(handoffs);
    cli_sockets.own_inherited();
    pidfile.write_pid();
    if state.lifecycle.stopping() {
        return Ok(());
    }
    state.admission.hold_accepting(false);
    tracing::info!(nbthread, mode = ?forward_mode, "shunt started");
    signal_old_processes(opts);
    let ready = if opts.reloading() {
        format!(
            "READY=1\nMAINPID={}\nSTATUS=Ready (reloaded).",
            std::process::id()
        )
    } else {
        "READY=1\nSTATUS=Ready.".to_string()
    };
    crate::notify::notify_or_warn(&ready);
    Ok(())
}

/// `-sf`/`-st`: tell the processes this one replaces to stop. A pid that is
/// gone is only logged (it may have exited already).
fn signal_old_processes(opts: &Options) {
    use nix::sys::signal::{kill, Signal};
    let sig = if opts.old_pids_hard {
        Signal::SIGTERM
    } else {
        Signal::SIGUSR1
    };
    for &pid in &opts.old_pids {
        match kill(nix::unistd::Pid::from_raw(pid), sig) {
            Ok(()) => tracing::info!(pid, signal = %sig, "old process told to stop"),
            Err(e) => tracing::warn!(pid, signal = %sig, error = %e, "cannot signal old process"),
        }
    }
}

/// Tell systemd the service stops, unless a successor took our sockets (it speaks
/// for the service now: a `STOPPING=1` from us would stop the unit).
fn notify_stopping(handover: &crate::runtime::Handover) {
    if !handover.handed_over() {
        crate::notify::notify_or_warn("STOPPING=1\nSTATUS=Stopping.");
    }
}

/// The signals the daemon obeys, installed before anything announces that
/// shunt started (a SIGUSR1 or SIGTERM sent right after "shunt started" must
/// find the handlers in place, not the default action).
struct Signals {
    rt: tokio::runtime::Runtime,
    term: Signal,
    int: Signal,
    usr1: Signal,
}

impl Signals {
    fn install() -> Result<Self, DaemonError> {
        use tokio::signal::unix::{signal, SignalKind};
        // Worker 0's runtime: the streams wake its reactor.
        let rt = scheduler::worker_runtime().map_err(DaemonError::Signals)?;
        let (term, int, usr1) = {
            let _guard = rt.enter();
            (
                signal(SignalKind::terminate()).map_err(DaemonError::Signals)?,
                signal(SignalKind::interrupt()).map_err(DaemonError::Signals)?,
                signal(SignalKind::user_defined1()).map_err(DaemonError::Signals)?,
            )
        };
        Ok(Self {
            rt,
            term,
            int,
            usr1,
        })
    }
}

/// The signals, as a task of worker 0 (whose runtime they were registered
/// with), driving the phase changes.
async fn wait_for_signals(
    (mut term, mut int, mut usr1): (Signal, Signal, Signal),
    phase: &watch::Sender<Phase>,
    state: &Runtime,
    hard_stop_after: Option<Duration>,
) {
    let hard = tokio::select! {
        _ = term.recv() => Some("SIGTERM"),
        _ = int.recv() => Some("SIGINT"),
        _ = usr1.recv() => None,
    };
    if let Some(signal) = hard {
        tracing::warn!("Proxy stopping ({signal}): closing listeners and flows");
        notify_stopping(&state.handover);
        let _ = phase.send(Phase::HardStop);
        state.handover.close_exported();
        return;
    }
    notify_stopping(&state.handover);
    tracing::warn!(
        flows = state.admission.conns(),
        "soft-stop (SIGUSR1): listeners closed, waiting for flows to end"
    );
    let _ = phase.send(Phase::SoftStop);
    // The listeners close with their accept loops; our dups must not keep
    // the sockets open (a successor that fetched them holds its own).
    state.handover.close_exported();
    let deadline = hard_stop_after.map(|d| tokio::time::Instant::now() + d);
    loop {
        // Every accept loop has counted its last client (Acquire pairs with
        // the loop's Release on exit); a hand-over in progress holds the
        // descriptors it sends.
        if state.admission.all_loops_ended()
            && state.admission.conns() == 0
            && !state.handover.handing_over()
        {
            break;
        }
        let tick = tokio::time::sleep(Duration::from_millis(50));
        tokio::select! {
            _ = tick => {}
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            tracing::warn!("hard-stop-after expired: closing remaining flows");
            break;
        }
    }
    let _ = phase.send(Phase::HardStop);
}

/// How soon each worker's standing timer is due (see `worker_main`): below
/// any `timeout connect` worth setting, rare enough to cost nothing.
const TIMER_FLOOR: Duration = Duration::from_secs(1);

/// One worker: an accept task per listener, then wait for the stop.
async fn worker_main(
    state: Arc<Runtime>,
    listeners: crate::listeners::ThreadListeners,
    cli: Vec<crate::cli::Listener>,
    adopted: tokio::sync::oneshot::Receiver<Vec<crate::reload::AdoptedFlow>>,
) {
    let mut phase = state.lifecycle.subscribe();
    state.workers.register(scheduler::remote());
    let mut tasks = crate::cli::serve(state.clone(), cli);
    // The predecessor's kernel flows for this worker, once the take-over
    // committed (the sender is dropped when there are none).
    let st = state.clone();
    tasks.push(scheduler::spawn(Class::Normal, "adopt", async move {
        if let Ok(flows) = adopted.await {
            for f in flows {
                crate::reload::spawn_adopted(&st, f);
            }
        }
    }));
    // A timer always due within TIMER_FLOOR: tokio wakes its own driver (an
    // eventfd write, then an epoll_wait that returns at once) whenever a
    // timer is armed earlier than every pending one, which on a worker with
    // no nearer timer is each new flow's `timeout connect`. With this one
    // pending, flows' timers are never the earliest.
    tasks.push(scheduler::spawn(Class::Bulk, "timer-floor", async {
        loop {
            tokio::time::sleep(TIMER_FLOOR).await;
        }
    }));
    // The kernel program's aya-log records, forwarded into tracing by one
    // task on the first worker (started after the privilege drop: no thread).
    if scheduler::thread_id() == 0 {
        if let Some(fut) = (state.forwarding.kernel.as_ref()).and_then(|k| k.bpf().take_logger()) {
            tasks.push(scheduler::spawn(Class::Bulk, "bpf-log", fut));
        }
    }
    // Stick tables' expired entries: one purge task, on the first worker.
    if scheduler::thread_id() == 0 && state.tables.expiring() {
        let st = state.clone();
        tasks.push(scheduler::spawn(Class::Bulk, "stick-purge", async move {
            crate::stick::purge_loop(&st.tables).await
        }));
    }
    // Health and agent checks: this worker's share of the checked servers.
    tasks.extend(crate::checks::spawn_for_worker(
        &state,
        scheduler::thread_id(),
        state.facts.nbthread(),
    ));
    // Warm server spares: this worker's refills (and, on worker 0, the purges).
    tasks.extend(crate::pool::spawn_for_worker(
        &state,
        scheduler::thread_id(),
    ));
    for (fi, bi, l) in listeners {
        match TcpListener::from_std(l) {
            Ok(l) => {
                let st = state.clone();
                tasks.push(scheduler::spawn(
                    Class::Normal,
                    "accept",
                    accept_loop(st, fi, bi, l),
                ));
            }
            Err(e) => {
                state.admission.loop_ended();
                tracing::error!(error = %e, "cannot register listener");
            }
        }
    }
    // Wait for hard stop; the soft stop only closes listeners (accept loops see it).
    let _ = phase.wait_for(|p| *p == Phase::HardStop).await;
    for t in &tasks {
        t.abort();
    }
    // Then this worker's flows, accepted or adopted: each is registered with
    // its task from the moment it was spawned (no flow waits on the phase
    // itself, which would be a watch future in every flow).
    let closed = crate::stats::flows::abort_where(|_| true);
    if closed > 0 {
        tracing::debug!(closed, "hard stop: flows closed");
    }
}

/// Wait until a new flow fits (true), or the process stops running (false):
/// the global, frontend and listener (`bind ... maxconn`) limits.
async fn wait_for_room(
    state: &Runtime,
    fe_idx: usize,
    bind: usize,
    phase: &mut watch::Receiver<Phase>,
) -> bool {
    loop {
        if *phase.borrow() != Phase::Running {
            return false;
        }
        let a = &state.admission;
        if a.has_room(fe_idx, state.stats.frontends[fe_idx].scur())
            && a.listener_has_room(fe_idx, bind)
        {
            return true;
        }
        tokio::select! {
            _ = state.admission.released() => {}
            _ = tokio::time::sleep(ACCEPT_PAUSE_RECHECK) => {}
            _ = phase.changed() => {}
        }
    }
}

/// Ends one accept loop in the admission counts, also when its task is aborted.
struct AcceptingGuard(Arc<Runtime>);

impl Drop for AcceptingGuard {
    fn drop(&mut self) {
        self.0.admission.loop_ended();
    }
}

/// Accept the clients of bind address `bind` of frontend `fe_idx`.
async fn accept_loop(state: Arc<Runtime>, fe_idx: usize, bind: usize, listener: TcpListener) {
    let _accepting = AcceptingGuard(state.clone());
    let mut phase = state.lifecycle.subscribe();
    let mut hold = state.admission.hold_watch();
    loop {
        // Held (before this process serves, or while it hands itself over):
        // the socket stays open and clients wait in its queue.
        if *hold.borrow_and_update() {
            if *phase.borrow() != Phase::Running {
                break;
            }
            tokio::select! {
                r = hold.changed() => if r.is_err() { break },
                _ = phase.changed() => {}
            }
            continue;
        }
        // Stop accepting while full: the kernel keeps new clients in the backlog.
        if !wait_for_room(&state, fe_idx, bind, &mut phase).await {
            break;
        }
        // `biased` (no RNG draw per client), the accept first: a client that
        // is there is taken without registering a wait on the phase and hold
        // watches (a `Notify` entry each, locked in and out per client: 0.4 %
        // of the proxy's CPU per connection in a `redis-benchmark -k 0`
        // profile). A flood cannot hide a soft stop or a hold: every turn of
        // this loop reads both first (above, and in `wait_for_room`); the
        // watches only wake a loop that has no client to take.
        let accepted = tokio::select! {
            biased;
            r = listener.accept() => r,
            _ = phase.changed() => continue,
            _ = hold.changed() => continue,
        };
        match accepted {
            Ok((sock, peer)) => {
                scheduler::note_accepted();
                // An accept armed while there was room can complete after the
                // limit was reached (a flow of another worker, or a lower limit
                // from `set maxconn`): hold this client, as the backlog would,
                // until it fits. Two workers passing the check at once can still
                // overshoot by one each: the check and the count are not atomic.
                // A client accepted just as a soft stop (a reload) began is served
                // all the same: dropping it would reset a connection the kernel
                // already completed.
                if !wait_for_room(&state, fe_idx, bind, &mut phase).await
                    && *phase.borrow() == Phase::HardStop
                {
                    break;
                }
                let guard = ConnGuard::accepted(state.clone(), fe_idx, bind);
                let st = state.clone();
                // Owned by the future: aborting the task unregisters the flow.
                // A hard stop aborts it through the registry (`worker_main`).
                let reg = crate::stats::flows::Registered::new(
                    fe_idx,
                    peer,
                    std::os::fd::AsRawFd::as_raw_fd(&sock),
                );
                let id = reg.id();
                let task = scheduler::spawn(Class::Normal, scheduler::FLOW_TASK, async move {
                    let _guard = guard;
                    let _reg = reg;
                    let sock = crate::handoff::tls::Stream::Plain(sock);
                    crate::session::run(st, fe_idx, bind, sock, peer, id).await;
                });
                crate::stats::flows::set_task(id, task);
            }
            Err(e) => {
                // EMFILE and friends: count, back off briefly, keep serving.
                state.stats.frontends[fe_idx].event(Event::Denied);
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    drop(listener);
    tracing::debug!(frontend = %state.config.frontends[fe_idx].name, "listener closed");
}
