//! Runtime state of one configured server: health, admin state, user weight
//! and the counters the stats page and the CLI read.
//!
//! Owns: the atomics of a [`ServerRt`], and the rules by which its health, admin
//! state and weight move: every such change is a [`Change`] given to
//! [`ServerRt::apply`], which returns the [`Transition`] when what the selection
//! or the log sees moved. The setters behind it are private (the selection tests
//! in `lb` use three of them). What a transition *does* (the HAProxy log line,
//! the rebalance, `shutdown-sessions`) is `crate::checks::transition::on`'s, not
//! this file's. The selection algorithms and the queue in [`super::backend`] read
//! these values.
//!
//! Invariants:
//! - `cur_conns` and the queue counters only change under the owning
//!   backend's state lock (see `backend.rs`); readers outside it (stats, CLI)
//!   see a value that was true at some recent instant.
//! - the user weight is always within `0..=MAX_WEIGHT`.
//! - the address and `maxconn` may change at run time (CLI `set server B/S addr`,
//!   `set maxconn server`): readers take them through [`ServerRt::addr`] and
//!   [`ServerRt::maxconn`] at each use, so the next connection sees the new value
//!   and connections already made keep the one they were made with.
//! - health-check state (the fields after `queue_max`) is written by the server's
//!   check tasks (`crate::checks`); `health` stays within `0..rise + fall`.
//! - the live-management state (the fields after `report`) is written by the CLI
//!   (`set server B/S health|agent|check-port|agent-*`, `enable|disable health|agent`)
//!   and the server-state file; the check tasks read the probe targets at each probe,
//!   so a change applies from the next check on.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::status::Status;

/// What the last health check found and when the server last changed state, as
/// the stats page shows them.
#[derive(Debug, Clone)]
pub struct CheckReport {
    /// `None` until the first check completes (HAProxy's `INI`).
    pub status: Option<Status>,
    /// A layer-7 code (agent checks); shown only for layer-7 statuses.
    pub code: Option<u32>,
    pub duration: Option<Duration>,
    /// The check's information string (`Connection refused`, `via agent : drain`, ...).
    pub desc: String,
    /// When the last check completed.
    pub last_check: Option<Instant>,
    /// When the operational state (UP/DOWN) last changed (start-up at first).
    pub last_change: Instant,
    /// Since when the server is DOWN, if it is.
    pub down_since: Option<Instant>,
    /// Total time spent DOWN in earlier periods.
    pub downtime: Duration,
    /// A health check is running now (HAProxy's `CHK_ST_INPROGRESS`: `show
    /// stat` puts `* ` before the last status meanwhile).
    pub in_progress: bool,
}

use arc_swap::ArcSwap;

/// Administrative state set by `set server B/S state`, `enable|disable
/// server` and the server-state file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminState {
    Ready,
    Drain,
    Maint,
}

/// A server's administrative facts beyond its flags: whether it drains (and
/// the user weight it gets back when made ready) and when it last changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdminNote {
    /// Some(user weight) while draining: the server runs with weight 0 meanwhile.
    pub drain_weight: Option<u32>,
    /// Last administrative change.
    pub changed: Option<Instant>,
}

/// HAProxy's operational state of a server: RUNNING, STOPPING (up, but no new
/// traffic: `NOLB`), STOPPED. Maintenance is admin state and sits beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpState {
    Up,
    Stopping,
    Down,
}

impl OpState {
    /// The word HAProxy's transition log line uses (`Server be/s1 is UP`).
    pub fn word(self) -> &'static str {
        match self {
            OpState::Up => "UP",
            OpState::Down => "DOWN",
            OpState::Stopping => "stopping",
        }
    }
}

/// Every way a server's health, admin state or weight changes: the one argument
/// of [`ServerRt::apply`]. Who sends which: the check loop `Check`, `observe
/// layer4` `Observed`, the agent `AgentHealth`, `AgentDrain`, `AgentMaint` and
/// `Weight`, the CLI and the server-state file `Force`, `ForceAgent`, `Admin`,
/// `UserWeight` and `Weight`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// One health-check result through HAProxy's rise/fall machine
    /// ([`super::status::step`]): DOWN at the fall, UP at the rise unless the
    /// agent holds the server down.
    Check { passed: bool },
    /// `observe layer4` reached its limit: the health starts `from` this value,
    /// then one failed check; DOWN at the fall, except in maintenance.
    Observed { from: u32 },
    /// The agent's health word: `up` (health to the top, UP) or `down`,
    /// `stopped`, `fail` (health to 0, DOWN, held down until `up`).
    AgentHealth { up: bool },
    /// The agent's `drain` (true) or `ready` (false).
    AgentDrain(bool),
    /// The agent's `maint` (true) or `ready` (false). Not an admin change: no
    /// admin note, no `on-marked-down` (as before this type existed).
    AgentMaint(bool),
    /// The operator's or the server-state file's forced state: the health set to
    /// `health`, then the state to `to` unless in maintenance (HAProxy ignores
    /// forced changes then).
    Force { health: u32, to: OpState },
    /// `set server B/S agent up|down`: the agent's verdict, then UP or DOWN unless
    /// in maintenance.
    ForceAgent { up: bool },
    /// `set server B/S state`, `enable|disable server`, the server-state file.
    Admin(AdminState),
    /// `set weight`: a draining server keeps draining and gets it back when ready.
    UserWeight(u32),
    /// The weight itself (the agent's `N%`, the server-state file's user weight).
    Weight(u32),
}

/// What the load balancer and the log see of a server: what [`ServerRt::usable`]
/// reads, and the operational state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effective {
    pub op: OpState,
    pub maint: bool,
    pub weight: u32,
    pub agent_drain: bool,
}

impl Effective {
    /// Taking traffic as far as the admin state goes: up (or stopping), not in
    /// maintenance (HAProxy marks such a server down when it enters maintenance).
    pub fn running(&self) -> bool {
        self.op != OpState::Down && !self.maint
    }
}

/// A change that moved a server's [`Effective`] state, as [`ServerRt::apply`]
/// returns it; `crate::checks::transition::on` acts on it (log, rebalance,
/// shut flows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub change: Change,
    pub was: Effective,
    pub now: Effective,
}

impl Transition {
    /// The new operational state, when it moved (the log line's word).
    pub fn op_moved(&self) -> Option<OpState> {
        (self.was.op != self.now.op).then_some(self.now.op)
    }

    /// An admin change put a running server in maintenance: HAProxy marks it
    /// down, which applies `on-marked-down shutdown-sessions`.
    pub fn marked_down(&self) -> bool {
        matches!(self.change, Change::Admin(AdminState::Maint))
            && self.was.running()
            && self.now.maint
    }
}

/// Largest user weight HAProxy accepts (`weight` keyword and `set weight`).
pub const MAX_WEIGHT: u32 = 256;

/// One configured server, shared by every worker thread through an `Arc`.
#[derive(Debug)]
pub struct ServerRt {
    /// Position in the backend's server list (config order).
    pub idx: usize,
    pub name: String,
    /// Numeric id (`id` keyword or position, from 1).
    pub id: u32,
    /// Where new connections go; swapped whole by [`Self::set_addr`].
    addr: ArcSwap<SocketAddr>,
    pub backup: bool,
    /// Concurrent connection limit; 0 = unlimited.
    maxconn: AtomicUsize,
    /// Limit of requests queued on this very server; 0 = unlimited.
    pub maxqueue: usize,
    /// The configured weight, used by the static (map based) algorithms.
    initial_weight: u32,
    weight: AtomicU32,
    up: AtomicBool,
    maint: AtomicBool,
    cur_conns: AtomicUsize,
    max_conns: AtomicUsize,
    selected: AtomicU64,
    queue_cur: AtomicUsize,
    queue_max: AtomicUsize,
    // ---- health and agent checks (crate::checks) ----
    /// `check` is configured.
    checked: bool,
    /// `agent-check` is configured.
    agent: bool,
    rise: u32,
    fall: u32,
    /// HAProxy's check health: UP at `rise` and above, `rise + fall - 1` when fully up.
    health: AtomicU32,
    /// The agent answered `drain`: no new traffic, the user weight is kept.
    agent_drain: AtomicBool,
    /// The agent answered `down`, `stopped` or `fail`.
    agent_down: AtomicBool,
    /// Failed checks (`chkfail`) and UP→DOWN transitions (`chkdown`).
    chkfail: AtomicU64,
    chkdown: AtomicU64,
    /// The agent's `maxconn:N` (0 = none received). Recorded; `has_room` does not
    /// read it yet (`maxconn` becomes runtime-settable in another change).
    agent_maxconn: AtomicUsize,
    report: Mutex<CheckReport>,
    /// Drain weight and last administrative change (`set server`, `set
    /// weight`, the server-state file).
    admin: Mutex<AdminNote>,
    // ---- live management (CLI, server-state file) ----
    /// `set server B/S health stopping`: up, but takes no new traffic (HAProxy's
    /// SRV_ST_STOPPING, shown as `NOLB`). Cleared by any UP/DOWN transition.
    stopping: AtomicBool,
    /// `disable health` / `disable agent`: configured, but the probes pause.
    check_disabled: AtomicBool,
    agent_disabled: AtomicBool,
    /// Where the health check and the agent connect (changed by the CLI).
    probe: Mutex<ProbeTargets>,
    /// Bumped by every address change, so that anything prepared for the old
    /// address (a queued connect, a warm spare) can tell it is stale.
    addr_gen: AtomicU64,
    // ---- warm spare connections (crate::pool) ----
    /// This server's per-thread lists of pre-connected spares and their sizing.
    pub pool: super::spares::ServerPool,
    // ---- slowstart and observe layer4 (crate::checks) ----
    /// `slowstart` ramp in percent of the weight (100 = not ramping).
    ramp_pct: AtomicU32,
    /// Bumped by every ramp start, so an older ramp task stops.
    ramp_gen: AtomicU64,
    /// `observe layer4`: consecutive connection errors seen on live traffic.
    observe_errors: AtomicU32,
    /// `observe layer4`: times the error limit was reached (`hanafail`).
    hanafail: AtomicU64,
    /// Cuts the health check's current wait short (`observe layer4` forces the
    /// next check at `fastinter`, as HAProxy reschedules its check task).
    pub check_wake: tokio::sync::Notify,
}

/// Where the checks of one server connect, and what the agent is sent: the
/// configuration's `addr`, `port`, `agent-addr`, `agent-port`, `agent-send`, as
/// the CLI may have changed them. `None` = the server's own address or port.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProbeTargets {
    pub check_addr: Option<IpAddr>,
    pub check_port: Option<u16>,
    pub agent_addr: Option<IpAddr>,
    pub agent_port: Option<u16>,
    pub agent_send: Arc<[u8]>,
}

impl ServerRt {
    /// Runtime state for `cfg`, at position `idx` of its backend.
    pub fn new(idx: usize, cfg: &crate::config::Server) -> Self {
        let weight = cfg.weight.min(MAX_WEIGHT);
        Self {
            idx,
            name: cfg.name.clone(),
            id: cfg.id,
            addr: ArcSwap::from_pointee(cfg.addr),
            backup: cfg.backup,
            maxconn: AtomicUsize::new(cfg.maxconn),
            maxqueue: cfg.maxqueue,
            initial_weight: weight,
            weight: AtomicU32::new(weight),
            up: AtomicBool::new(true),
            maint: AtomicBool::new(cfg.disabled),
            cur_conns: AtomicUsize::new(0),
            max_conns: AtomicUsize::new(0),
            selected: AtomicU64::new(0),
            queue_cur: AtomicUsize::new(0),
            queue_max: AtomicUsize::new(0),
            checked: cfg.check.enabled,
            agent: cfg.check.agent_check,
            rise: cfg.check.rise.unwrap_or(super::status::DEFAULT_RISE),
            fall: cfg.check.fall.unwrap_or(super::status::DEFAULT_FALL),
            // Up, but down at the first failure (HAProxy's start-up health).
            health: AtomicU32::new(cfg.check.rise.unwrap_or(super::status::DEFAULT_RISE)),
            agent_drain: AtomicBool::new(false),
            agent_down: AtomicBool::new(false),
            chkfail: AtomicU64::new(0),
            chkdown: AtomicU64::new(0),
            agent_maxconn: AtomicUsize::new(0),
            admin: Mutex::new(AdminNote::default()),
            report: Mutex::new(CheckReport {
                status: None,
                code: None,
                duration: None,
                desc: String::new(),
                last_check: None,
                last_change: Instant::now(),
                down_since: None,
                downtime: Duration::ZERO,
                in_progress: false,
            }),
            stopping: AtomicBool::new(false),
            check_disabled: AtomicBool::new(false),
            agent_disabled: AtomicBool::new(false),
            probe: Mutex::new(ProbeTargets {
                check_addr: cfg.check.addr.as_deref().and_then(|a| a.parse().ok()),
                check_port: cfg.check.port,
                agent_addr: cfg.check.agent_addr.as_deref().and_then(|a| a.parse().ok()),
                agent_port: cfg.check.agent_port,
                agent_send: cfg
                    .check
                    .agent_send
                    .as_deref()
                    .unwrap_or_default()
                    .as_bytes()
                    .into(),
            }),
            addr_gen: AtomicU64::new(0),
            pool: super::spares::ServerPool::new(cfg.pool),
            ramp_pct: AtomicU32::new(100),
            ramp_gen: AtomicU64::new(0),
            observe_errors: AtomicU32::new(0),
            hanafail: AtomicU64::new(0),
            check_wake: tokio::sync::Notify::new(),
        }
    }

    /// The address a new connection to this server goes to.
    pub fn addr(&self) -> SocketAddr {
        **self.addr.load()
    }

    /// Send the next connections to `addr` (open ones are not disturbed) and
    /// bump [`Self::addr_gen`].
    pub fn set_addr(&self, addr: SocketAddr) {
        self.addr.store(Arc::new(addr));
        self.addr_gen.fetch_add(1, Ordering::Release);
    }

    /// How many times the address changed: a connection prepared under another
    /// value was made for an old address and must not be used.
    pub fn addr_gen(&self) -> u64 {
        self.addr_gen.load(Ordering::Acquire)
    }

    /// Concurrent connection limit; 0 = unlimited.
    pub fn maxconn(&self) -> usize {
        self.maxconn.load(Ordering::Relaxed)
    }

    /// Change the connection limit (0 = unlimited). Call the backend's
    /// `rebalance` afterwards so queued requests can use raised room; slots
    /// already out above a lowered limit stay until released.
    pub fn set_maxconn(&self, maxconn: usize) {
        self.maxconn.store(maxconn, Ordering::Relaxed);
    }

    /// Current user weight (0..=256).
    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// Effective weight, what the dynamic algorithms use: the user weight, scaled
    /// down during a `slowstart` ramp (never to 0 while the user weight is not 0,
    /// as HAProxy's `server_recalc_eweight`).
    pub fn eweight(&self) -> u32 {
        let w = self.weight();
        let pct = self.ramp_pct.load(Ordering::Relaxed);
        if pct >= 100 || w == 0 {
            w
        } else {
            (w * pct).div_ceil(100).max(1)
        }
    }

    /// The `slowstart` ramp, in percent (100 = full weight).
    pub fn ramp(&self) -> u32 {
        self.ramp_pct.load(Ordering::Relaxed)
    }

    /// Set the ramp (clamped to 100).
    pub fn set_ramp(&self, pct: u32) {
        self.ramp_pct.store(pct.min(100), Ordering::Relaxed);
    }

    /// Start a new ramp: returns its generation (older ramps see theirs is stale).
    pub fn next_ramp_gen(&self) -> u64 {
        self.ramp_gen.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The generation of the latest ramp.
    pub fn ramp_gen(&self) -> u64 {
        self.ramp_gen.load(Ordering::Acquire)
    }

    /// `observe layer4`: one more consecutive error; returns the count.
    pub fn observe_error(&self) -> u32 {
        self.observe_errors.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// `observe layer4`: a success (or the limit acted on) clears the run.
    pub fn observe_reset(&self) {
        self.observe_errors.store(0, Ordering::Release);
    }

    /// `observe layer4`: the limit was reached once more.
    pub fn count_hanafail(&self) {
        self.hanafail.fetch_add(1, Ordering::Relaxed);
    }

    /// Times `observe layer4` reached its error limit (`hanafail`).
    pub fn hanafail(&self) -> u64 {
        self.hanafail.load(Ordering::Relaxed)
    }

    /// The weight from the configuration (what `static-rr` and `source` use).
    pub fn initial_weight(&self) -> u32 {
        self.initial_weight
    }

    /// Set the user weight; values above [`MAX_WEIGHT`] are clamped.
    pub(super) fn set_weight(&self, w: u32) {
        self.weight.store(w.min(MAX_WEIGHT), Ordering::Relaxed);
    }

    /// What the load balancer and the log see of the server now.
    pub fn effective(&self) -> Effective {
        let op = if !self.is_up() {
            OpState::Down
        } else if self.is_stopping() {
            OpState::Stopping
        } else {
            OpState::Up
        };
        Effective {
            op,
            maint: self.is_maint(),
            weight: self.weight(),
            agent_drain: self.is_agent_drain(),
        }
    }

    /// Make `change`: the one way the server's health, admin state and weight
    /// change. Returns the [`Transition`] when what the load balancer or the log
    /// sees moved (`None`: at most the health counter or the agent's verdict did);
    /// the caller hands it to `crate::checks::transition::on`, which logs,
    /// rebalances and shuts flows as HAProxy does.
    pub fn apply(&self, change: Change) -> Option<Transition> {
        let was = self.effective();
        match change {
            Change::Check { passed } => {
                if let Some(up) = self.check_result(passed) {
                    // The agent's `down` keeps the server down whatever the check says.
                    if !(up && self.is_agent_down()) {
                        self.move_to(if up { OpState::Up } else { OpState::Down });
                    }
                }
            }
            Change::Observed { from } => {
                self.set_health(from);
                if self.check_result(false) == Some(false) && !self.is_maint() {
                    self.move_to(OpState::Down);
                }
            }
            Change::AgentHealth { up: true } => {
                self.set_agent_down(false);
                self.set_health(self.rise + self.fall);
                if !self.is_up() {
                    self.move_to(OpState::Up);
                }
            }
            Change::AgentHealth { up: false } => {
                self.set_agent_down(true);
                if self.health() > 0 {
                    self.count_chkfail();
                }
                self.set_health(0);
                if self.is_up() {
                    self.move_to(OpState::Down);
                }
            }
            Change::AgentDrain(on) => self.set_agent_drain(on),
            Change::AgentMaint(on) => self.set_maint(on),
            Change::Force { health, to } => {
                self.set_health(health);
                if !self.is_maint() {
                    self.move_to(to);
                }
            }
            Change::ForceAgent { up } => {
                self.set_agent_down(!up);
                if !self.is_maint() {
                    self.move_to(if up { OpState::Up } else { OpState::Down });
                }
            }
            Change::Admin(st) => self.set_admin(st),
            Change::UserWeight(w) => self.set_user_weight(w),
            Change::Weight(w) => self.set_weight(w),
        }
        let now = self.effective();
        (was != now).then_some(Transition { change, was, now })
    }

    /// One check result through the rise/fall machine: the new health and
    /// `chkfail`; `Some(up)` when it says the state changes.
    fn check_result(&self, passed: bool) -> Option<bool> {
        let st = super::status::step(self.health(), self.is_up(), passed, self.rise, self.fall);
        self.set_health(st.health);
        if st.counted_failure {
            self.count_chkfail();
        }
        st.transition
    }

    /// Move the operational state to `to` (nothing when already there): UP and
    /// DOWN through [`Self::transition`] (which ends `stopping`), STOPPING as up
    /// and not taking new traffic.
    fn move_to(&self, to: OpState) {
        match to {
            OpState::Up => {
                self.set_stopping(false);
                self.transition(true);
            }
            OpState::Down => {
                self.transition(false);
            }
            OpState::Stopping => {
                self.transition(true);
                self.set_stopping(true);
            }
        }
    }

    fn admin_note_mut<R>(&self, f: impl FnOnce(&mut AdminNote) -> R) -> R {
        let mut n = self.admin.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut n)
    }

    /// Drain weight and last administrative change.
    pub fn admin_note(&self) -> AdminNote {
        *self.admin.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The user weight as the operator set it: the saved one while draining.
    pub fn user_weight(&self) -> u32 {
        self.admin_note()
            .drain_weight
            .unwrap_or_else(|| self.weight())
    }

    /// HAProxy's admin transitions: maintenance clears drain, drain clears
    /// maintenance, ready clears both; a drain keeps the user weight to give
    /// back.
    fn set_admin(&self, st: AdminState) {
        self.admin_note_mut(|n| {
            n.changed = Some(Instant::now());
            match st {
                AdminState::Drain => {
                    if n.drain_weight.is_none() {
                        n.drain_weight = Some(self.weight());
                        self.set_weight(0);
                    }
                    self.set_maint(false);
                }
                AdminState::Ready | AdminState::Maint => {
                    if let Some(w) = n.drain_weight.take() {
                        self.set_weight(w);
                    }
                    self.set_maint(st == AdminState::Maint);
                }
            }
        });
    }

    /// `set weight`: a draining server keeps draining and gets `w` back when
    /// made ready.
    fn set_user_weight(&self, w: u32) {
        self.admin_note_mut(|n| {
            n.changed = Some(Instant::now());
            match n.drain_weight.as_mut() {
                Some(saved) => *saved = w,
                None => self.set_weight(w),
            }
        });
    }

    /// Record an administrative change made now (`srv_time_since_last_change`).
    pub fn touch(&self) {
        self.admin_note_mut(|n| n.changed = Some(Instant::now()));
    }

    /// Health state (true unless a check marked the server down).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    pub(super) fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
    }

    /// Administrative maintenance (`disabled` in the config, `disable server`).
    pub fn is_maint(&self) -> bool {
        self.maint.load(Ordering::Relaxed)
    }

    pub(super) fn set_maint(&self, maint: bool) {
        self.maint.store(maint, Ordering::Relaxed);
    }

    /// Connection slots currently held on this server.
    pub fn cur_conns(&self) -> usize {
        self.cur_conns.load(Ordering::Relaxed)
    }

    /// Peak of [`Self::cur_conns`] since start.
    pub fn max_conns(&self) -> usize {
        self.max_conns.load(Ordering::Relaxed)
    }

    /// How many times a connection slot was given to this server (lbconn).
    pub fn selected(&self) -> u64 {
        self.selected.load(Ordering::Relaxed)
    }

    /// Requests waiting for this very server (only `source` pins requests).
    pub fn queue_cur(&self) -> usize {
        self.queue_cur.load(Ordering::Relaxed)
    }

    /// Peak of [`Self::queue_cur`].
    pub fn queue_max(&self) -> usize {
        self.queue_max.load(Ordering::Relaxed)
    }

    /// May take new traffic: healthy, not in maintenance nor stopping, weight above 0.
    pub fn usable(&self) -> bool {
        self.is_up()
            && !self.is_maint()
            && self.weight() > 0
            && !self.is_agent_drain()
            && !self.is_stopping()
    }

    /// May take a flow that sticks to it (`stick match`): HAProxy sends
    /// persistent traffic to a server that is up and not in maintenance,
    /// whatever its weight or drain state.
    pub fn takes_sticky(&self) -> bool {
        self.is_up() && !self.is_maint()
    }

    /// Below its maxconn (always true when maxconn is 0).
    pub fn has_room(&self) -> bool {
        let max = self.maxconn();
        max == 0 || self.cur_conns() < max
    }

    /// Weight used by the static algorithms: the configured one while the
    /// server is usable (HAProxy ignores runtime changes other than to/from 0).
    pub(crate) fn static_weight(&self) -> u32 {
        if self.initial_weight > 0 {
            self.initial_weight
        } else {
            self.weight()
        }
    }

    /// Count one more held slot. Called under the backend state lock.
    pub(crate) fn take_slot(&self) {
        let now = self.cur_conns.fetch_add(1, Ordering::Relaxed) + 1;
        self.max_conns.fetch_max(now, Ordering::Relaxed);
    }

    /// Count a slot given to a request (new, or handed on from the queue).
    pub(crate) fn count_selected(&self) {
        self.selected.fetch_add(1, Ordering::Relaxed);
    }

    /// Forget one held slot. Called under the backend state lock.
    pub(crate) fn drop_slot(&self) {
        // Saturating: a release can never precede its take, but a wrapped
        // counter would make the server look full forever.
        let _ = self
            .cur_conns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(1))
            });
    }

    pub(crate) fn queue_inc(&self) {
        let now = self.queue_cur.fetch_add(1, Ordering::Relaxed) + 1;
        self.queue_max.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn queue_dec(&self) {
        let _ = self
            .queue_cur
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(1))
            });
    }

    // ---- health and agent checks ----

    /// `check` is configured on this server and not disabled (`disable health`).
    pub fn checked(&self) -> bool {
        self.checked && !self.check_disabled.load(Ordering::Relaxed)
    }

    /// `agent-check` is configured on this server and not disabled (`disable agent`).
    pub fn agent_enabled(&self) -> bool {
        self.agent && !self.agent_disabled.load(Ordering::Relaxed)
    }

    /// `check` is configured (whether or not disabled now).
    pub fn check_configured(&self) -> bool {
        self.checked
    }

    /// `agent-check` is configured (whether or not disabled now).
    pub fn agent_configured(&self) -> bool {
        self.agent
    }

    pub fn rise(&self) -> u32 {
        self.rise
    }

    pub fn fall(&self) -> u32 {
        self.fall
    }

    /// HAProxy's check health (`check_health`).
    pub fn health(&self) -> u32 {
        self.health.load(Ordering::Relaxed)
    }

    /// Set the health, clamped to `0..rise + fall`.
    fn set_health(&self, h: u32) {
        let max = (self.rise + self.fall).saturating_sub(1);
        self.health.store(h.min(max), Ordering::Relaxed);
    }

    /// The agent asked for drain.
    pub fn is_agent_drain(&self) -> bool {
        self.agent_drain.load(Ordering::Relaxed)
    }

    fn set_agent_drain(&self, on: bool) {
        self.agent_drain.store(on, Ordering::Relaxed);
    }

    /// The agent reported the server down.
    pub fn is_agent_down(&self) -> bool {
        self.agent_down.load(Ordering::Relaxed)
    }

    fn set_agent_down(&self, on: bool) {
        self.agent_down.store(on, Ordering::Relaxed);
    }

    /// The last `maxconn:N` the agent sent (0 = none).
    pub fn agent_maxconn(&self) -> usize {
        self.agent_maxconn.load(Ordering::Relaxed)
    }

    pub fn set_agent_maxconn(&self, n: usize) {
        self.agent_maxconn.store(n, Ordering::Relaxed);
    }

    /// Failed checks since start (`chkfail`).
    pub fn chkfail(&self) -> u64 {
        self.chkfail.load(Ordering::Relaxed)
    }

    fn count_chkfail(&self) {
        self.chkfail.fetch_add(1, Ordering::Relaxed);
    }

    /// UP→DOWN transitions since start (`chkdown`).
    pub fn chkdown(&self) -> u64 {
        self.chkdown.load(Ordering::Relaxed)
    }

    /// A copy of the last check's report.
    pub fn check_report(&self) -> CheckReport {
        self.report
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Record a completed check.
    pub fn record_check(&self, status: Status, code: Option<u32>, duration: Duration, desc: &str) {
        let mut r = self.report.lock().unwrap_or_else(PoisonError::into_inner);
        r.status = Some(status);
        r.code = code;
        r.duration = Some(duration);
        r.desc.clear();
        r.desc.push_str(desc);
        r.last_check = Some(Instant::now());
        r.in_progress = false;
    }

    /// A health check starts; [`Self::record_check`] ends it (a check aborted
    /// with its task leaves it set: the server is gone then).
    pub fn check_started(&self) {
        self.report
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .in_progress = true;
    }

    /// Change the operational state (UP/DOWN) as a check decided: sets the health
    /// flag, the last-change time, the downtime and `chkdown`. Returns false when the
    /// server already was in that state.
    fn transition(&self, up: bool) -> bool {
        let mut r = self.report.lock().unwrap_or_else(PoisonError::into_inner);
        if self.is_up() == up {
            return false;
        }
        let now = Instant::now();
        r.last_change = now;
        if up {
            if let Some(since) = r.down_since.take() {
                r.downtime += now.saturating_duration_since(since);
            }
        } else {
            r.down_since = Some(now);
            self.chkdown.fetch_add(1, Ordering::Relaxed);
        }
        self.set_stopping(false);
        self.set_up(up);
        true
    }

    /// Total time DOWN, the current period included (`downtime`).
    pub fn downtime(&self) -> Duration {
        let r = self.report.lock().unwrap_or_else(PoisonError::into_inner);
        r.downtime
            + r.down_since.map_or(Duration::ZERO, |s| {
                Instant::now().saturating_duration_since(s)
            })
    }

    // ---- live management ----

    /// Up but taking no new traffic (`set server B/S health stopping`).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    fn set_stopping(&self, on: bool) {
        self.stopping.store(on, Ordering::Relaxed);
    }

    /// Enable or pause the health checks (no effect on an unchecked server).
    pub fn set_check_enabled(&self, on: bool) {
        self.check_disabled.store(!on, Ordering::Relaxed);
    }

    /// Enable or pause the agent (no effect without `agent-check`).
    pub fn set_agent_enabled(&self, on: bool) {
        self.agent_disabled.store(!on, Ordering::Relaxed);
    }

    /// A copy of where the checks connect now.
    pub fn probe_targets(&self) -> ProbeTargets {
        self.probe
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Change where the checks connect; the next probe uses the new values.
    pub fn update_probe_targets(&self, f: impl FnOnce(&mut ProbeTargets)) {
        f(&mut self.probe.lock().unwrap_or_else(PoisonError::into_inner));
    }
}
