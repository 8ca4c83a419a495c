//! The stats socket CLI: listeners, connections, and the per-connection loop.
//!
//! Owns the `stats socket` Unix listeners (bound at start-up, before privileges are
//! dropped, by [`Sockets::bind`]; files removed when [`Sockets`] drops) and each client
//! connection's life: read → split into requests (`frame`) → parse (`command`, against
//! the command table in `table`) → apply (`dispatch`, the only place state changes) →
//! render (`render`) → batched write.
//! Large answers (`show map MAP`, `show sess`) come back from `dispatch` as a
//! `stream::Producer` and are drained a chunk at a time ([`drain`]).
//!
//! Invariants:
//! - The listener and every connection are scheduler tasks of class `Bulk` on the worker
//!   that called [`serve`] (thread 0); no bare `tokio::spawn`. Heavy work runs from the
//!   scheduler's Heavy class (at most one heavy run per loop while flows have work): a
//!   connection marks itself heavy ([`scheduler::heavy`]) before a command that
//!   loads, clears or replaces a whole map or walks the kernel's BPF maps (its
//!   table entry's `heavy`, see `table`), and while it drains a streamed answer (from
//!   its first chunk for a large map dump, from its second otherwise). A large
//!   `add map <<` payload is applied in slices of [`PAYLOAD_SLICE`] bytes with a yield
//!   between two, so no single run of a connection applies thousands of entries.
//! - At most `stats maxconn` connections per socket; beyond that the listener stops
//!   accepting (clients wait in the kernel backlog), as HAProxy does.
//! - Output is held while the batch of input already received still has commands and
//!   written once the batch is exhausted or [`frame::OUT_FLUSH`] bytes are pending —
//!   never one answer per write. The loop yields every [`YIELD_EVERY`] commands (or
//!   [`RUN_BUDGET`] of work, whichever comes first) so a long
//!   batch does not starve flows on the same worker.
//! - A streamed answer never sits whole in memory: the loop asks its producer for lines
//!   until [`frame::OUT_FLUSH`] bytes are pending, writes them, yields, and goes on; the
//!   answer's final empty line is added after its last chunk, and what follows keeps the
//!   batching rule above.
//! - Map changes made by a connection are staged (`Maps::defer`) and published before
//!   any byte of output is written ([`send`]) and when the connection ends, so a batch
//!   of `add map` builds one map version per flush, and a flow routed after an
//!   acknowledgement always sees the acknowledged change.
//! - Non-interactive connections close after a line once no further input is buffered
//!   (so pipelined lines that arrived together are all answered, as HAProxy does);
//!   interactive ones (`prompt`) stay until `quit`, EOF or the idle timeout.

pub mod command;
pub mod dispatch;
pub mod frame;
pub mod render;
pub mod sessions;
pub mod stream;
pub mod table;
pub mod tables;
pub mod typed;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::sync::Semaphore;

use crate::config::{CliLevel, Config, StatsSocket};
use crate::runtime::Runtime;
use crate::scheduler::{self, Class, TaskHandle};

use frame::{Event, Input};

/// Bytes read from a CLI socket at once.
const READ_CHUNK: usize = 16 * 1024;
/// Commands run back to back before the connection task yields to the scheduler.
pub const YIELD_EVERY: usize = 64;
/// Longest stretch of commands one connection runs before it yields (measured after
/// each command, so one large command may exceed it once).
const RUN_BUDGET: Duration = Duration::from_micros(500);
/// Default `Name` in `show info`.
pub const DEFAULT_NAME: &str = "shunt";
/// Pause after a failed accept (EMFILE and friends) before trying again.
const ACCEPT_RETRY: Duration = Duration::from_millis(10);
/// An `add map <<` payload from this size on is heavy work (about 250 entries:
/// parsing and inserting them takes more than the ~50 µs a light run may cost).
pub const HEAVY_PAYLOAD: usize = 4 * 1024;
/// Bytes of an `add map <<` payload applied between two yields (about 250 entries,
/// a few hundred µs).
const PAYLOAD_SLICE: usize = 4 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("stats socket '{path}': a file that is not a socket is in the way")]
    NotASocket { path: PathBuf },
    #[error("stats socket '{path}': cannot remove the stale socket: {source}")]
    RemoveStale {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("stats socket '{path}': cannot bind: {source}")]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("stats socket '{path}': cannot set mode {mode:o}: {source}")]
    Chmod {
        path: PathBuf,
        mode: u32,
        source: std::io::Error,
    },
    #[error("stats socket '{path}': cannot set owner: {reason}")]
    Chown { path: PathBuf, reason: String },
}

/// What every CLI connection reads: the shared runtime plus the names `show
/// info` prints.
pub struct Ctx {
    pub state: Arc<Runtime>,
    /// `Name` in `show info`.
    pub name: String,
    /// `node` in `show info` (the host name).
    pub node: String,
}

impl Ctx {
    pub fn new(state: Arc<Runtime>) -> Self {
        Self {
            state,
            name: DEFAULT_NAME.to_string(),
            node: hostname(),
        }
    }

    /// The process's uptime (`runtime::Facts`, the exporter's too).
    pub fn uptime_secs(&self) -> u64 {
        self.state.facts.uptime_secs()
    }
}

fn hostname() -> String {
    crate::sys::hostname()
}

/// One CLI connection's own state.
#[derive(Debug, Clone)]
pub struct Session {
    pub level: CliLevel,
    /// Interactive: several lines, until `quit` (`prompt`, `prompt i|p`).
    pub interactive: bool,
    /// `quit` was run: close after flushing.
    pub quit: bool,
    /// Idle timeout (`stats timeout`, then `set timeout cli`).
    pub timeout: Duration,
    /// Show the `> ` prompt after each answer (`prompt`, `prompt p`).
    pub prompt: bool,
    /// The prompt shows the process uptime (`prompt timed`).
    pub timed: bool,
    /// `set severity-output`: how messages are tagged.
    pub severity: command::SeverityOutput,
    /// The connection's own socket when it came through a stats socket with
    /// `expose-fd listeners`: `_getsocks` sends the listening sockets over it.
    pub fd_passing: Option<Arc<std::os::fd::OwnedFd>>,
}

impl Session {
    pub fn new(level: CliLevel, timeout: Duration) -> Self {
        Self {
            level,
            interactive: false,
            quit: false,
            timeout,
            prompt: false,
            timed: false,
            severity: command::SeverityOutput::None,
            fd_passing: None,
        }
    }

    /// What follows each answer's empty line: nothing without a prompt, `> `, or
    /// with `timed` HAProxy 3.x's `[d:hh:mm:ss]> ` (the process uptime).
    pub fn prompt_bytes(&self, ctx: &Ctx) -> std::borrow::Cow<'static, [u8]> {
        match (self.prompt, self.timed) {
            (false, _) => std::borrow::Cow::Borrowed(b""),
            (true, false) => std::borrow::Cow::Borrowed(frame::PROMPT),
            (true, true) => std::borrow::Cow::Owned(frame::timed_prompt(ctx.uptime_secs())),
        }
    }
}

/// One bound stats socket, ready to be served.
pub struct Listener {
    pub listener: std::os::unix::net::UnixListener,
    pub level: CliLevel,
    pub path: PathBuf,
    /// `expose-fd listeners`: `_getsocks` is served on this socket.
    pub expose_fd: bool,
}

/// The stats sockets of the process: inherited from a predecessor (`-x`,
/// same path) or bound fresh at a temporary path next to the configured one
/// and moved into place by [`Sockets::publish`], so a start-up that fails
/// before then leaves the path (and a running predecessor's socket there)
/// as it was. Dropping it removes the files that are still this process's.
pub struct Sockets {
    listeners: Vec<Listener>,
    /// Fresh sockets not yet in place: (temporary path, configured path).
    pending: Vec<(PathBuf, PathBuf)>,
    /// Inherited sockets whose mode and owner are applied at publication.
    inherited: Vec<StatsSocket>,
    /// Each file in place with the (device, inode) it had then: a successor
    /// started by a reload may bind the same path, and its file must survive
    /// our exit.
    paths: Vec<(PathBuf, Option<(u64, u64)>)>,
    /// The files of inherited sockets: the predecessor's until this process
    /// serves ([`Sockets::own_inherited`]), so a start-up that fails removes
    /// none of them.
    inherited_paths: Vec<(PathBuf, Option<(u64, u64)>)>,
    /// Read when dropping: a successor that took the process over serves
    /// the same files.
    handover: Arc<crate::runtime::Handover>,
}

fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Where a fresh stats socket is bound before it is moved to `path`
/// (HAProxy's `PATH.PID.tmp`).
fn temp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(format!(".{}.tmp", std::process::id()));
    PathBuf::from(s)
}

impl Sockets {
    /// Every `stats socket` of the configuration: the predecessor's listener
    /// for the same path when it handed one over, else a fresh socket bound at
    /// a temporary path with its mode and owner set. Nothing at the
    /// configured paths changes until [`Sockets::publish`]. Call before
    /// dropping privileges.
    pub fn bind(
        config: &Config,
        inherited: &mut crate::listeners::Inherited,
        handover: Arc<crate::runtime::Handover>,
    ) -> Result<Self, CliError> {
        let mut s = Sockets {
            listeners: Vec::new(),
            pending: Vec::new(),
            inherited: Vec::new(),
            paths: Vec::new(),
            inherited_paths: Vec::new(),
            handover,
        };
        for sock in &config.global.stats_sockets {
            let l = match inherited.take_unix(&sock.path) {
                Some(listener) => {
                    tracing::info!(path = %sock.path.display(), "stats socket inherited");
                    s.inherited.push(sock.clone());
                    s.inherited_paths
                        .push((sock.path.clone(), file_id(&sock.path)));
                    listener
                }
                None => {
                    let tmp = temp_path(&sock.path);
                    // Bound at the temporary path, and that file is ours from now on.
                    let l = bind_one(sock, &tmp);
                    s.pending.push((tmp, sock.path.clone()));
                    l?
                }
            };
            l.set_nonblocking(true).map_err(|source| CliError::Bind {
                path: sock.path.clone(),
                source,
            })?;
            s.listeners.push(Listener {
                listener: l,
                level: sock.level,
                path: sock.path.clone(),
                expose_fd: sock.expose_fd_listeners,
            });
        }
        Ok(s)
    }

    /// Put every fresh socket at its configured path (an atomic rename over
    /// whatever socket was there: a client connecting meanwhile reaches the
    /// old socket or the new one, never nothing) and apply the configured
    /// mode and owner to the inherited ones.
    pub fn publish(&mut self) -> Result<(), CliError> {
        for sock in std::mem::take(&mut self.inherited) {
            set_mode_owner(&sock, &sock.path)?;
        }
        for (tmp, path) in std::mem::take(&mut self.pending) {
            if let Err(source) = std::fs::rename(&tmp, &path) {
                let _ = std::fs::remove_file(&tmp);
                return Err(CliError::Bind { path, source });
            }
            self.paths.push((path.clone(), file_id(&path)));
        }
        Ok(())
    }

    /// This process serves now (its predecessor committed the take-over): the
    /// inherited sockets' files are its own to remove when it stops.
    pub fn own_inherited(&mut self) {
        self.paths.append(&mut self.inherited_paths);
    }

    /// Dups of the listening sockets, for a successor (`_getsocks`).
    pub fn dups(&self) -> Vec<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd;
        self.listeners
            .iter()
            .filter_map(|l| l.listener.as_fd().try_clone_to_owned().ok())
            .collect()
    }

    /// The listeners, for the worker that serves them (leaves the file cleanup here).
    pub fn take_listeners(&mut self) -> Vec<Listener> {
        std::mem::take(&mut self.listeners)
    }
}

impl Drop for Sockets {
    fn drop(&mut self) {
        for (tmp, _) in &self.pending {
            let _ = std::fs::remove_file(tmp);
        }
        // A successor that took our sockets over serves the same files.
        if self.handover.handed_over() {
            return;
        }
        for (p, id) in &self.paths {
            if id.is_some() && file_id(p) == *id {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// Bind `sock` at `at` (its configured path, or the temporary one) with its
/// mode and owner. The configured path must not hold a file that is not a
/// socket (a stale socket there is replaced at publication).
fn bind_one(sock: &StatsSocket, at: &Path) -> Result<std::os::unix::net::UnixListener, CliError> {
    let path = &sock.path;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            return Err(CliError::NotASocket { path: path.clone() });
        }
    }
    // A stale socket of ours (same pid) at the temporary path, or at the
    // configured path when binding there directly.
    if std::fs::symlink_metadata(at).is_ok_and(|m| m.file_type().is_socket()) {
        std::fs::remove_file(at).map_err(|source| CliError::RemoveStale {
            path: at.to_path_buf(),
            source,
        })?;
    }
    let listener = std::os::unix::net::UnixListener::bind(at).map_err(|source| CliError::Bind {
        path: path.clone(),
        source,
    })?;
    set_mode_owner(sock, at)?;
    Ok(listener)
}

fn set_mode_owner(sock: &StatsSocket, at: &Path) -> Result<(), CliError> {
    std::fs::set_permissions(at, std::fs::Permissions::from_mode(sock.mode)).map_err(|source| {
        CliError::Chmod {
            path: sock.path.clone(),
            mode: sock.mode,
            source,
        }
    })?;
    chown(at, sock.user.as_deref(), sock.group.as_deref())
}

fn chown(path: &Path, user: Option<&str>, group: Option<&str>) -> Result<(), CliError> {
    use nix::unistd::{Group, User};
    if user.is_none() && group.is_none() {
        return Ok(());
    }
    let err = |reason: String| CliError::Chown {
        path: path.to_path_buf(),
        reason,
    };
    let uid = match user {
        Some(u) => Some(
            User::from_name(u)
                .map_err(|e| err(format!("user '{u}': {e}")))?
                .ok_or_else(|| err(format!("unknown user '{u}'")))?
                .uid,
        ),
        None => None,
    };
    let gid = match group {
        Some(g) => Some(
            Group::from_name(g)
                .map_err(|e| err(format!("group '{g}': {e}")))?
                .ok_or_else(|| err(format!("unknown group '{g}'")))?
                .gid,
        ),
        None => None,
    };
    nix::unistd::chown(path, uid, gid).map_err(|e| err(e.to_string()))
}

/// Serve the given listeners on the calling worker: one `Bulk` task per socket, one per
/// client connection. Returns the listener tasks (abort them to stop accepting).
pub fn serve(state: Arc<Runtime>, listeners: Vec<Listener>) -> Vec<TaskHandle> {
    if listeners.is_empty() {
        return Vec::new();
    }
    let ctx = Arc::new(Ctx::new(state));
    let mut tasks = Vec::with_capacity(listeners.len());
    for l in listeners {
        match UnixListener::from_std(l.listener) {
            Ok(ul) => {
                tracing::info!(path = %l.path.display(), "stats socket listening");
                tasks.push(scheduler::spawn(
                    Class::Bulk,
                    "cli",
                    accept_loop(ctx.clone(), ul, l.level, l.expose_fd),
                ));
            }
            Err(e) => {
                tracing::error!(path = %l.path.display(), error = %e, "cannot register stats socket")
            }
        }
    }
    tasks
}

/// Serve one stats socket. It starts accepting once the process serves (a
/// successor must not take the connection it opened to its predecessor), and
/// stops at the soft stop of a process whose successor took its sockets over
/// (the successor serves the same socket; an operator's command must reach
/// it, not us), as HAProxy's old processes stop their stats sockets.
async fn accept_loop(ctx: Arc<Ctx>, listener: UnixListener, level: CliLevel, expose_fd: bool) {
    let maxconn = ctx.state.config.global.stats_maxconn.max(1);
    let slots = Arc::new(Semaphore::new(maxconn));
    ctx.state.admission.serving().await;
    let mut phase = ctx.state.lifecycle.subscribe();
    loop {
        // Take a slot first: with `stats maxconn` clients connected, stop accepting.
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = phase.wait_for(|p| *p != crate::runtime::Phase::Running && ctx.state.handover.handed_over()) => {
                tracing::debug!("stats socket closed: the successor serves it");
                return;
            }
        };
        match accepted {
            Ok((stream, _)) => {
                let ctx = ctx.clone();
                let timeout = ctx.state.config.global.stats_timeout;
                let mut sess = Session::new(level, timeout);
                if expose_fd {
                    use std::os::fd::AsFd;
                    sess.fd_passing = stream.as_fd().try_clone_to_owned().ok().map(Arc::new);
                }
                scheduler::spawn(Class::Bulk, "cli-conn", async move {
                    let _permit = permit;
                    serve_conn(&ctx, stream, sess).await;
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "stats socket accept failed");
                drop(permit);
                tokio::time::sleep(ACCEPT_RETRY).await;
            }
        }
    }
}

/// Read without waiting: `Some(n)` when bytes (or EOF, `n == 0`) were ready, `None` when
/// the read would block.
async fn try_read<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut [u8],
) -> Option<std::io::Result<usize>> {
    tokio::select! {
        biased;
        r = stream.read(buf) => Some(r),
        _ = std::future::ready(()) => None,
    }
}

/// Most bytes read and discarded while closing on an error (see [`drain_and_close`]).
const CLOSE_DRAIN_MAX: usize = 256 * 1024;
/// How long closing on an error waits for the client's pending bytes.
const CLOSE_DRAIN_TIME: Duration = Duration::from_millis(200);

/// Close after an error without losing the answer: closing a socket with unread input
/// makes the kernel reset it, and the client may then never read our error text. So
/// shut our side, then read and discard what the client still sends, within bounds.
async fn drain_and_close<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, buf: &mut [u8]) {
    let _ = stream.shutdown().await;
    let drain = async {
        let mut total = 0usize;
        while total < CLOSE_DRAIN_MAX {
            match stream.read(buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(CLOSE_DRAIN_TIME, drain).await;
}

/// Write pending output, publishing staged map changes first (see the module header).
async fn send<S: AsyncWrite + Unpin>(ctx: &Ctx, stream: &mut S, out: &[u8]) -> std::io::Result<()> {
    ctx.state.maps.publish();
    if out.is_empty() {
        return Ok(());
    }
    stream.write_all(out).await
}

/// Drain a streamed answer's body into `out`, writing whenever [`frame::OUT_FLUSH`]
/// bytes are pending and yielding between chunks, so memory stays bounded whatever
/// the size of the answer. What remains under the bound stays in `out`, batched with
/// the answers that follow. An answer that needs more than one chunk is heavy work:
/// from the second chunk on, the connection runs from the Heavy class.
async fn drain<S: AsyncWrite + Unpin>(
    ctx: &Ctx,
    stream: &mut S,
    out: &mut Vec<u8>,
    producer: &mut stream::Producer,
) -> std::io::Result<()> {
    // A large dump is heavy from its first chunk: its first run would cost as
    // much as any other.
    let mut heavy = if producer.heavy_from_start() {
        Some(scheduler::heavy().await)
    } else {
        None
    };
    loop {
        let more = producer.fill(ctx, out, frame::OUT_FLUSH).await;
        if out.len() >= frame::OUT_FLUSH {
            send(ctx, stream, out).await?;
            out.clear();
        }
        if !more {
            return Ok(());
        }
        heavy.get_or_insert_with(scheduler::enter_heavy);
        scheduler::yield_now().await;
    }
}

/// `add map [@V] MAP <<` applied in slices of about [`PAYLOAD_SLICE`] bytes (whole
/// lines), yielding between two, so a payload of thousands of entries never runs in
/// one go. Same outcome as one pass: slices apply in order and the first error stops
/// the rest (entries before it stay, as HAProxy's payload loop leaves them).
async fn add_payload_sliced(
    ctx: &Ctx,
    sess: &mut Session,
    spec: Option<&'static table::Spec>,
    ver: Option<u32>,
    map: String,
    payload: String,
) -> dispatch::Output {
    let mut rest = payload.as_str();
    loop {
        let cut = match rest.get(PAYLOAD_SLICE..).and_then(|t| t.find('\n')) {
            Some(i) => PAYLOAD_SLICE + i + 1,
            None => rest.len(),
        };
        let (slice, tail) = rest.split_at(cut);
        let cmd = command::Command::AddMapPayload {
            ver,
            map: map.clone(),
            payload: slice.to_string(),
        };
        let out = dispatch::dispatch(ctx, sess, command::Parsed { spec, cmd });
        if tail.is_empty() || out.is_err() {
            return out;
        }
        rest = tail;
        scheduler::yield_now().await;
    }
}

/// `_getsocks`: send the listening sockets over the connection's own socket.
fn getsocks(ctx: &Ctx, sess: &Session) {
    let Some(fd) = &sess.fd_passing else {
        return;
    };
    use std::os::fd::AsFd;
    match crate::reload::serve_getsocks(&ctx.state.handover, fd.as_fd()) {
        Ok(n) => tracing::warn!(
            sockets = n,
            "_getsocks: listening sockets sent to a new process"
        ),
        Err(e) => tracing::warn!(error = %e, "_getsocks: transfer failed"),
    }
}

/// `_getflows ID [commit]`: hand the kernel flows over the connection's own socket.
async fn getflows(ctx: &Ctx, sess: &Session, arg: Option<&str>, commit: bool) {
    let Some(fd) = &sess.fd_passing else {
        return;
    };
    use std::os::fd::AsFd;
    match crate::reload::serve_getflows(&ctx.state, fd.as_fd(), arg, commit).await {
        Ok(n) => tracing::warn!(flows = n, "_getflows: kernel flows handed to a new process"),
        Err(e) => tracing::warn!(error = %e, "_getflows: transfer failed"),
    }
}

/// Drive one CLI connection until it closes. Generic over the stream so tests can use
/// socket pairs.
pub async fn serve_conn<S>(ctx: &Ctx, mut stream: S, mut sess: Session)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut input = Input::new();
    let mut out: Vec<u8> = Vec::with_capacity(frame::OUT_FLUSH);
    let mut rbuf = vec![0u8; READ_CHUNK];
    let mut eof = false;
    let mut since_yield = 0usize;
    let mut run_started = Instant::now();
    // Published before every write and, by its drop, when the connection ends.
    let _defer = ctx.state.maps.defer();
    loop {
        // Run everything the input already holds.
        loop {
            let ev = match input.next_event(eof) {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    // An overlong line or payload ends this connection only.
                    out.extend_from_slice(format!("{e}\n\n").as_bytes());
                    if send(ctx, &mut stream, &out).await.is_ok() {
                        drain_and_close(&mut stream, &mut rbuf).await;
                    }
                    return;
                }
            };
            match ev {
                Event::PayloadMore => {
                    if sess.prompt {
                        out.extend_from_slice(frame::PAYLOAD_PROMPT);
                    }
                }
                Event::Line(reqs) => {
                    if reqs.is_empty() && sess.interactive {
                        out.extend_from_slice(&sess.prompt_bytes(ctx));
                    }
                    for req in reqs {
                        if req.words.first().map(String::as_str) == Some("_getsocks") {
                            // HAProxy's seamless reload: answer with descriptors (or
                            // nothing without `expose-fd listeners`), then close.
                            let _ = send(ctx, &mut stream, &out).await;
                            getsocks(ctx, &sess);
                            return;
                        }
                        if req.words.first().map(String::as_str) == Some("_getflows") {
                            // shunt's reload of kernel flows: the flows and their
                            // sockets (nothing without `expose-fd listeners`).
                            let _ = send(ctx, &mut stream, &out).await;
                            let commit = req.words.get(2).map(String::as_str) == Some("commit");
                            getflows(ctx, &sess, req.words.get(1).map(String::as_str), commit)
                                .await;
                            return;
                        }
                        let parsed = command::parse(&req);
                        // Held to the end of this command (its streamed answer too).
                        let _heavy = if parsed.heavy(ctx.state.forwarding.kernel.is_some()) {
                            Some(scheduler::heavy().await)
                        } else {
                            None
                        };
                        let answer = match parsed {
                            command::Parsed {
                                spec,
                                cmd: command::Command::AddMapPayload { ver, map, payload },
                            } => add_payload_sliced(ctx, &mut sess, spec, ver, map, payload).await,
                            p if p.on_workers() => dispatch::dispatch_workers(ctx, &sess, p).await,
                            p => dispatch::dispatch(ctx, &mut sess, p),
                        };
                        if sess.quit {
                            // `quit` answers nothing, not even the empty line.
                            let _ = send(ctx, &mut stream, &out).await;
                            return;
                        }
                        if let dispatch::Output::Stream(mut producer) = answer {
                            if drain(ctx, &mut stream, &mut out, &mut producer)
                                .await
                                .is_err()
                            {
                                return;
                            }
                            frame::push_answer(&mut out, "", &sess.prompt_bytes(ctx));
                        } else {
                            frame::push_answer(
                                &mut out,
                                &answer.render(sess.severity),
                                &sess.prompt_bytes(ctx),
                            );
                        }
                        if out.len() >= frame::OUT_FLUSH {
                            if send(ctx, &mut stream, &out).await.is_err() {
                                return;
                            }
                            out.clear();
                        }
                        since_yield += 1;
                        // Yield by count and by time: a few large payloads (a
                        // thousand map entries each) must not hold the worker for
                        // tens of milliseconds in one run.
                        if since_yield >= YIELD_EVERY || run_started.elapsed() >= RUN_BUDGET {
                            since_yield = 0;
                            scheduler::yield_now().await;
                            run_started = Instant::now();
                        }
                    }
                    if !sess.interactive && !input.has_buffered() {
                        let _ = send(ctx, &mut stream, &out).await;
                        let _ = stream.shutdown().await;
                        return;
                    }
                }
            }
        }
        if eof {
            let _ = send(ctx, &mut stream, &out).await;
            return;
        }
        // The batch is exhausted. Extend it with whatever already arrived; flush only
        // when nothing more is ready.
        if !out.is_empty() {
            match try_read(&mut stream, &mut rbuf).await {
                Some(Ok(0)) => {
                    eof = true;
                    continue;
                }
                Some(Ok(n)) => {
                    input.push(&rbuf[..n]);
                    continue;
                }
                Some(Err(_)) => return,
                None => {
                    if send(ctx, &mut stream, &out).await.is_err() {
                        return;
                    }
                    out.clear();
                }
            }
        }
        // Nothing staged may wait for the client's next line.
        ctx.state.maps.publish();
        match tokio::time::timeout(sess.timeout, stream.read(&mut rbuf)).await {
            Err(_) => return, // idle timeout
            Ok(Err(_)) => return,
            Ok(Ok(0)) => eof = true,
            Ok(Ok(n)) => input.push(&rbuf[..n]),
        }
    }
}

#[cfg(test)]
mod tests;
