//! The validated, immutable configuration that the rest of the daemon reads.
//!
//! Produced only by [`super::load`] (parse, then validate). Nothing here is
//! mutated at run time; runtime state (server health, weights set by the CLI,
//! counters) lives elsewhere and refers to these items by index.

pub use super::acl::{AclCtx, Cond, StickCtx, StickFetch};
pub use super::stick::*;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use super::tls::{CertKey, TlsVersion};

/// `profiling.tasks`: whether the scheduler profiles its tasks from the start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfilingTasks {
    On,
    /// Profile while a worker's loops average 1 ms or more (HAProxy's default).
    Auto,
    Off,
}

/// How established flows are forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardMode {
    /// sockmap when BPF is loaded and the flow is eligible, else splice, else copy.
    #[default]
    Auto,
    Sockmap,
    Splice,
    Copy,
}

impl ForwardMode {
    /// The keyword, as written in the configuration and shown by `show info`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Sockmap => "sockmap",
            Self::Splice => "splice",
            Self::Copy => "copy",
        }
    }
}

impl std::str::FromStr for ForwardMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "sockmap" => Ok(Self::Sockmap),
            "splice" => Ok(Self::Splice),
            "copy" => Ok(Self::Copy),
            _ => Err(format!(
                "unknown forward mode '{s}' (expected auto, sockmap, splice or copy)"
            )),
        }
    }
}

/// `stats socket` line of the global section (served by the CLI issue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsSocket {
    pub path: PathBuf,
    /// File mode; 0o600 unless configured.
    pub mode: u32,
    pub level: CliLevel,
    pub user: Option<String>,
    pub group: Option<String>,
    /// `expose-fd listeners`: `_getsocks` on this socket hands the listening
    /// sockets to a new process started with `-x PATH` (seamless reload).
    pub expose_fd_listeners: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum CliLevel {
    User,
    #[default]
    Operator,
    Admin,
}

pub use super::logspec::LogFormat;
pub use super::logspec::SyslogFormat;

/// Where a `log` line sends its messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogDest {
    /// `ADDR[:PORT]` (`udp@`, `ipv4@`, `ipv6@` prefixes accepted), port 514 by default.
    Udp(SocketAddr),
    /// `ring@NAME`: the `ring` section NAME, which forwards over TCP.
    Ring(String),
    Stderr,
    Stdout,
    /// A UNIX datagram socket path (`/dev/log`, `unix@PATH`).
    Unix(PathBuf),
}

/// A `log` line: `log TARGET [len N] [format F] FACILITY [LEVEL [MINLEVEL]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogTarget {
    pub dest: LogDest,
    /// `len`: longer lines are truncated (default 1024).
    pub maxlen: usize,
    pub format: SyslogFormat,
    pub facility: u8,
    /// Messages less severe than this are not sent (default `debug`: all).
    pub level: u8,
    /// Messages more severe than this are sent at this level (default `emerg`: unchanged).
    pub minlevel: u8,
}

/// `log-proto` of a ring server: RFC 6587 framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogProto {
    /// Non-transparent framing: each message ends with a newline.
    #[default]
    Legacy,
    /// Octet counting: `LEN SP MSG`.
    OctetCount,
}

/// A `server` line of a `ring` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingServer {
    pub name: String,
    pub addr: SocketAddr,
    pub proto: LogProto,
}

/// A `ring NAME` section: a bounded buffer of log messages forwarded over TCP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    pub name: String,
    pub format: SyslogFormat,
    /// `maxlen`: messages are truncated to this (default 1024).
    pub maxlen: usize,
    /// `size`: bytes of messages the ring holds while the servers lag (default 16384).
    pub size: usize,
    pub timeout_connect: Duration,
    pub timeout_server: Duration,
    pub servers: Vec<RingServer>,
    pub line: Location,
}

/// What one frontend logs about its flows: its targets (own lines, plus the
/// global ones with `log global`) and the line format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyLog {
    pub targets: Vec<LogTarget>,
    /// The line: `log-format`, else `option tcplog`, else HAProxy's "Connect from".
    pub format: LogFormat,
    /// The line is logged when the flow is accepted (the default format), not at its end.
    pub at_accept: bool,
    /// `option dontlognull`: no line for a flow whose client sent nothing.
    pub dontlognull: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Global {
    /// `nbthread`; `None` means one per available CPU.
    pub nbthread: Option<usize>,
    /// Global `maxconn`; HAProxy's default without a ulimit hint is 4096-ish; we use 4096.
    pub maxconn: usize,
    pub user: Option<String>,
    pub group: Option<String>,
    pub pidfile: Option<PathBuf>,
    /// `chroot DIR`: the process's root once every socket is open, before
    /// the privilege drop (`crate::daemon`).
    pub chroot: Option<PathBuf>,
    pub hard_stop_after: Option<Duration>,
    pub stats_sockets: Vec<StatsSocket>,
    /// `stats timeout`, default 10 s.
    pub stats_timeout: Duration,
    /// `stats maxconn`, default 10.
    pub stats_maxconn: usize,
    /// `stats show-name NAME`: the `Name` of `show info` (default `shunt`). Tools that
    /// insist on talking to `HAProxy` can be pointed at shunt with `stats show-name HAProxy`.
    pub stats_show_name: Option<String>,
    pub forward_mode: ForwardMode,
    /// `tune.pipesize` in bytes; `None` keeps the kernel default (64 KiB).
    pub pipesize: Option<usize>,
    /// `tune.sockmap.max-inflight`: bytes one direction of a kernel-forwarded
    /// flow may hold in the kernel before it is paused; `None` = default (8 MiB).
    pub sockmap_max_inflight: Option<usize>,
    /// `tune.sockmap.promote-bytes`: bytes a bulk flow moves in userspace
    /// before `auto` promotes it to the kernel; `None` = default (never:
    /// bulk flows stay in userspace, see `handoff::promote`).
    pub sockmap_promote_bytes: Option<u64>,
    /// `maxpipes`; default maxconn / 4 as HAProxy.
    pub maxpipes: usize,
    /// `tune.runqueue-depth`; `None` means HAProxy's default for the thread count.
    pub runqueue_depth: Option<usize>,
    /// `tune.sched.low-latency on|off`.
    pub sched_low_latency: bool,
    /// `tune.sched.heavy-cap on|off` (benchmark knob, default on): off disables
    /// the one-heavy-task-per-loop rule.
    pub sched_heavy_cap: bool,
    /// `profiling.tasks on|auto|off`: per-task CPU profiling at start
    /// (HAProxy's default `auto`; `set profiling tasks` changes it later).
    pub profiling_tasks: ProfilingTasks,
    pub logs: Vec<LogTarget>,
    /// `server-state-file`, `server-state-base` and the backends that load it.
    pub server_state: ServerStateConfig,
    /// `ring` sections, in declaration order.
    pub rings: Vec<Ring>,
    /// Per frontend (indexed like [`Config::frontends`]): its traffic log settings.
    /// Kept here rather than in [`Frontend`] so the proxies' shape stays stable.
    pub traffic_logs: Vec<ProxyLog>,
    /// `stats prometheus bind ADDR:PORT`: where the Prometheus exporter listens.
    pub prometheus: Option<SocketAddr>,
    /// `tune.idle-pool.shared on|off`: whether a thread may take a sibling
    /// thread's warm spare (default on, as HAProxy).
    pub idle_pool_shared: bool,
}

/// HAProxy's server-state file: `show servers state` saved by the operator, read
/// at start to restore weights, admin states and addresses.
///
/// The backends that load it (`load-server-state-from-file global`) are listed
/// here by name rather than flagged in [`Backend`], so that the many places that
/// build a `Backend` need not change.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerStateConfig {
    /// `server-state-file FILE` (relative to `base` unless absolute).
    pub file: Option<PathBuf>,
    /// `server-state-base DIR`.
    pub base: Option<PathBuf>,
    /// Names of the backends with `load-server-state-from-file global`.
    pub backends: Vec<String>,
}

impl ServerStateConfig {
    /// The file to read, if one is configured.
    pub fn path(&self) -> Option<PathBuf> {
        let f = self.file.as_ref()?;
        Some(match &self.base {
            Some(b) if f.is_relative() => b.join(f),
            _ => f.clone(),
        })
    }
}

impl Default for Global {
    fn default() -> Self {
        Self {
            nbthread: None,
            maxconn: DEFAULT_MAXCONN,
            user: None,
            group: None,
            pidfile: None,
            chroot: None,
            hard_stop_after: None,
            stats_sockets: Vec::new(),
            stats_timeout: Duration::from_secs(10),
            stats_maxconn: 10,
            stats_show_name: None,
            forward_mode: ForwardMode::Auto,
            pipesize: None,
            sockmap_max_inflight: None,
            sockmap_promote_bytes: None,
            maxpipes: DEFAULT_MAXCONN / 4,
            runqueue_depth: None,
            sched_low_latency: false,
            sched_heavy_cap: true,
            profiling_tasks: ProfilingTasks::Auto,
            logs: Vec::new(),
            server_state: ServerStateConfig::default(),
            rings: Vec::new(),
            traffic_logs: Vec::new(),
            prometheus: None,
            idle_pool_shared: true,
        }
    }
}

/// Global maxconn when none is configured.
pub const DEFAULT_MAXCONN: usize = 4096;

/// All `timeout` values of a proxy. `None` = not set (infinite).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Timeouts {
    pub connect: Option<Duration>,
    pub client: Option<Duration>,
    pub server: Option<Duration>,
    pub tunnel: Option<Duration>,
    pub client_fin: Option<Duration>,
    pub server_fin: Option<Duration>,
    pub queue: Option<Duration>,
    /// `timeout check`: extra read timeout of a health check once connected.
    pub check: Option<Duration>,
    /// `tcp-request inspect-delay`: how long a frontend waits for the TLS ClientHello
    /// an SNI rule reads. `None` (the default) = do not wait: whatever has arrived
    /// when the flow is accepted decides.
    pub inspect_delay: Option<Duration>,
}

/// Which splice options a proxy carries (`option splice-auto|splice-request|splice-response`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpliceOpts {
    pub auto: bool,
    pub request: bool,
    pub response: bool,
}

impl SpliceOpts {
    pub fn any(&self) -> bool {
        self.auto || self.request || self.response
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Balance {
    #[default]
    RoundRobin,
    StaticRr,
    LeastConn,
    First,
    Source,
    Random,
    /// `balance hash EXPR`: the hash of one layer-4 sample of the flow.
    Hash(HashKey),
}

/// What `balance hash` hashes: the layer-4 samples (HAProxy takes any sample
/// expression; shunt the ones a TCP flow has before its first byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashKey {
    Src,
    SrcPort,
    Dst,
    DstPort,
}

impl HashKey {
    /// The sample by its fetch name.
    pub fn by_name(name: &str) -> Option<Self> {
        Some(match name {
            "src" => HashKey::Src,
            "src_port" => HashKey::SrcPort,
            "dst" => HashKey::Dst,
            "dst_port" => HashKey::DstPort,
            _ => return None,
        })
    }
}

/// `on-error` of `observe layer4`: what a run of `error-limit` consecutive
/// connection errors on live traffic does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Run the checks at `fastinter` (HAProxy's default).
    #[default]
    Fastinter,
    /// Count one failed check.
    FailCheck,
    /// Fail the checks down to the last one before DOWN.
    SuddenDeath,
    /// Mark the server DOWN at once.
    MarkDown,
}

/// Health-check related server keywords (`check`, `inter`, the agent, ...).
/// `None` fields take HAProxy's defaults (see `crate::checks`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckParams {
    pub enabled: bool,
    pub inter: Option<Duration>,
    pub fastinter: Option<Duration>,
    pub downinter: Option<Duration>,
    pub rise: Option<u32>,
    pub fall: Option<u32>,
    pub port: Option<u16>,
    pub addr: Option<String>,
    pub agent_check: bool,
    pub agent_port: Option<u16>,
    pub agent_inter: Option<Duration>,
    pub on_marked_down_shutdown: bool,
    /// `agent-addr`: where the agent listens (default: the server's address).
    pub agent_addr: Option<String>,
    /// `agent-send`: the bytes sent to the agent once connected.
    pub agent_send: Option<String>,
    /// `check-send-proxy`: health checks start with a PROXY v1 line.
    pub send_proxy: bool,
    /// `slowstart`: a server coming back UP ramps to its weight over this period.
    pub slowstart: Option<Duration>,
    /// `on-marked-up shutdown-backup-sessions`.
    pub on_marked_up_shutdown_backup: bool,
    /// `check-ssl` (`Some(true)`) or `no-check-ssl` (`Some(false)`); `None`:
    /// the checks follow the server's `ssl` ([`Server::check_ssl`]).
    pub ssl: Option<bool>,
    /// `check-sni NAME`: the server name TLS checks send (they send none
    /// without it; the server's `sni` expression is the traffic's only).
    pub sni: Option<String>,
    /// `observe layer4`: live connection results feed the server's health.
    pub observe_layer4: bool,
    /// `error-limit` (HAProxy's default 10).
    pub error_limit: Option<u32>,
    pub on_error: Option<OnError>,
    /// The backend's `option tcp-check` rules (its own, else its defaults'), copied
    /// to each server when the configuration is built; `None` = a plain connect check.
    pub tcp_check: Option<Vec<TcpCheckRule>>,
}

/// How a `tcp-check expect` rule matches what the server sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpectKind {
    /// The bytes contain the string.
    String,
    /// The bytes match the regular expression.
    Rstring,
    /// The bytes contain the binary pattern (given in hex).
    Binary,
    /// The hex form of the bytes (upper case) matches the regular expression.
    Rbinary,
}

impl ExpectKind {
    pub fn keyword(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Rstring => "rstring",
            Self::Binary => "binary",
            Self::Rbinary => "rbinary",
        }
    }
}

/// One `tcp-check expect` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpExpect {
    pub kind: ExpectKind,
    /// `!`: the rule passes when the pattern is absent.
    pub negate: bool,
    /// The pattern as written (a string, hex digits, or a regular expression).
    pub pattern: String,
    /// `string`: its bytes; `binary`: the decoded hex; regexes: empty.
    pub bytes: Vec<u8>,
    /// `min-recv`: bytes to wait for before matching (`None`: match as data arrives).
    pub min_recv: Option<usize>,
}

/// What one `tcp-check` rule does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TcpCheckAction {
    /// `connect [port N] [addr A] [ssl] [sni NAME]`.
    Connect {
        port: Option<u16>,
        addr: Option<std::net::IpAddr>,
        /// `ssl`: TLS on this connection (without it a `connect` rule is
        /// plain, whatever `check-ssl` says: that is the implicit one's).
        ssl: bool,
        /// `sni NAME`: the server name of this connection's handshake (the
        /// server's `check-sni` is the implicit connection's only).
        sni: Option<String>,
    },
    /// `send STR` / `send-binary HEX`.
    Send(Vec<u8>),
    Expect(TcpExpect),
}

/// One `tcp-check` rule with its comment (`comment C`, or a preceding `tcp-check comment`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpCheckRule {
    pub action: TcpCheckAction,
    pub comment: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    pub name: String,
    /// Numeric id (`id` keyword or position, starting at 1).
    pub id: u32,
    pub addr: SocketAddr,
    /// 0..=256, default 1.
    pub weight: u32,
    /// 0 = unlimited.
    pub maxconn: usize,
    /// 0 = unlimited.
    pub maxqueue: usize,
    pub backup: bool,
    pub disabled: bool,
    pub check: CheckParams,
    /// Config line for messages.
    pub line: Location,
    /// Warm spare connections (`pool-max-conn`, `pool-low-conn`, `pool-purge-delay`).
    pub pool: PoolParams,
    /// `send-proxy` / `send-proxy-v2`: a PROXY header starts every connection.
    pub send_proxy: SendProxy,
    /// `source ADDR[:PORT]` (the server's own, else its backend's): the local
    /// address connections to it bind before connecting (port 0: any).
    pub source: Option<SocketAddr>,
    /// `ssl`: connections to the server are TLS (`None`: plain TCP).
    pub tls: Option<std::sync::Arc<ServerTls>>,
    /// The TLS settings of the server's TLS checks (`verify`, `ca-file`):
    /// `tls` itself on a `ssl` server, else built for the checks alone when
    /// `check-ssl` or a `tcp-check connect ssl` rule asks for TLS; `None`:
    /// no check can use TLS.
    pub check_tls: Option<std::sync::Arc<ServerTls>>,
}

/// Which PROXY protocol version a header is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyVersion {
    V1,
    V2,
}

/// A server's `send-proxy` and `send-proxy-v2` (each cleared by its `no-`
/// form): HAProxy keeps both flags and v2 wins when both are set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendProxy {
    pub v1: bool,
    pub v2: bool,
}

impl SendProxy {
    /// The version the server's connections start with, if any.
    pub fn version(self) -> Option<ProxyVersion> {
        if self.v2 {
            Some(ProxyVersion::V2)
        } else if self.v1 {
            Some(ProxyVersion::V1)
        } else {
            None
        }
    }
}

impl Server {
    /// Whether the health checks start with a PROXY header, and which: as
    /// HAProxy, `check-send-proxy` asks for one, and a server with
    /// `send-proxy(-v2)` has its checks send one too unless they go to their
    /// own `port` or `addr`. The version is the server's (v1 without one).
    pub fn check_proxy_header(&self) -> Option<ProxyVersion> {
        let inherits = self.check.port.is_none() && self.check.addr.is_none();
        match self.send_proxy.version() {
            Some(v) if inherits || self.check.send_proxy => Some(v),
            _ if self.check.send_proxy => Some(ProxyVersion::V1),
            _ => None,
        }
    }

    /// Whether the health check's own connection (not a `tcp-check connect`
    /// rule's) is TLS, HAProxy's rule: `check-ssl` says yes and
    /// `no-check-ssl` no; otherwise the checks of a `ssl` server are TLS too
    /// unless they go to their own `port` or `addr`.
    pub fn check_ssl(&self) -> bool {
        match self.check.ssl {
            Some(forced) => forced,
            None => self.tls.is_some() && self.check.port.is_none() && self.check.addr.is_none(),
        }
    }

    /// Whether the checks ask for TLS whatever `ssl` says: `check-ssl`, or a
    /// `tcp-check connect ssl` rule. HAProxy then prepares the server's TLS
    /// settings (`verify` and its CA rule included) even without `ssl`.
    pub fn check_wants_tls(&self) -> bool {
        let rule_ssl = self.check.tcp_check.as_ref().is_some_and(|rules| {
            rules
                .iter()
                .any(|r| matches!(r.action, TcpCheckAction::Connect { ssl: true, .. }))
        });
        self.check.ssl == Some(true) || rule_ssl
    }
}

/// A server's warm-spare pool settings (`crate::pool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolParams {
    /// `pool-max-conn`: spares kept for the server; 0 = no pool, -1 = unlimited.
    pub max_conn: i64,
    /// `pool-low-conn`: below this many spares in total, a thread does not take a
    /// sibling thread's spare.
    pub low_conn: usize,
    /// `pool-purge-delay`: the sizing period (HAProxy's default 5 s).
    pub purge_delay: Duration,
}

/// HAProxy's default `pool-purge-delay`.
pub const DEFAULT_POOL_PURGE_DELAY: Duration = Duration::from_secs(5);

impl Default for PoolParams {
    fn default() -> Self {
        Self {
            max_conn: 0,
            low_conn: 0,
            purge_delay: DEFAULT_POOL_PURGE_DELAY,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Location {
    pub file: String,
    pub line: usize,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// The options of one `bind` line (`crate::listeners` sets them on each of
/// its sockets). All off by default: the listener is what it was before.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BindOpts {
    /// `name NAME`: how messages name the listener (HAProxy's logs name an
    /// unnamed listener by its number, `id`).
    pub name: Option<String>,
    /// The listener's number in its frontend, from 1 (HAProxy's `luid`).
    pub id: u32,
    /// `accept-proxy`: every connection starts with a PROXY header (v1 or v2).
    pub accept_proxy: bool,
    /// `v4v6`: an IPv6 socket also accepts IPv4 (`IPV6_V6ONLY` 0, shunt's
    /// default anyway); `v6only`: it does not.
    pub v4v6: bool,
    pub v6only: bool,
    /// `backlog N`: the `listen(2)` queue (default 1024), and the `tfo` queue.
    pub backlog: Option<u32>,
    /// `maxconn N`: flows this listener holds at once, over all its sockets.
    pub maxconn: Option<usize>,
    /// `interface IFACE`: `SO_BINDTODEVICE`.
    pub interface: Option<String>,
    /// `transparent`: `IP_TRANSPARENT` / `IPV6_TRANSPARENT` (needs CAP_NET_ADMIN).
    pub transparent: bool,
    /// `defer-accept`: `TCP_DEFER_ACCEPT` (accept once the client sent data).
    pub defer_accept: bool,
    /// `tfo`: `TCP_FASTOPEN` on the listener, its queue as long as the backlog.
    pub tfo: bool,
    /// `ssl`: connections are TLS, terminated here with the `crt` certificates.
    pub ssl: bool,
    /// `crt FILE|DIR` words as written (resolved under `crt-base` and read
    /// when the configuration is validated, into `tls`).
    pub crt: Vec<String>,
    /// `alpn LIST`: the protocols offered, in preference order.
    pub alpn: Vec<String>,
    /// `ssl-min-ver VERSION`.
    pub ssl_min_ver: Option<TlsVersion>,
    /// What `ssl` terminates with, once loaded (`None` without `ssl`).
    pub tls: Option<std::sync::Arc<BindTls>>,
}

/// A `bind ... ssl` listener's TLS settings, loaded.
#[derive(Debug, PartialEq, Eq)]
pub struct BindTls {
    /// Every certificate of the line's `crt` words, in order; the first is
    /// the default one (no SNI, or a name no certificate has).
    pub certs: Vec<CertKey>,
    /// `alpn`, as the wire carries the names.
    pub alpn: Vec<Vec<u8>>,
    pub min_ver: Option<TlsVersion>,
}

/// What a `server ... ssl` sends as SNI (`sni EXPR`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SniExpr {
    /// `str(NAME)`.
    Str(String),
    /// `req.ssl_sni` / `ssl_fc_sni`: the client's own server name (from the
    /// terminated handshake, or the peeked ClientHello on a plain bind).
    Client,
}

/// A `server ... ssl` line's TLS settings, loaded.
#[derive(Debug, PartialEq, Eq)]
pub struct ServerTls {
    /// `verify required` (the default, as `ssl-server-verify required`).
    pub verify: bool,
    /// The `ca-file` certificates (empty with `verify none`).
    pub roots: Vec<rustls_pki_types::CertificateDer<'static>>,
    pub sni: Option<SniExpr>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Frontend {
    pub name: String,
    pub id: u32,
    pub binds: Vec<SocketAddr>,
    /// The options of each of `binds` (same index).
    pub bind_opts: Vec<BindOpts>,
    /// `option clitcpka` (or `tcpka`): SO_KEEPALIVE on client sockets.
    pub clitcpka: bool,
    /// Index into [`Config::backends`].
    pub default_backend: Option<usize>,
    /// `use_backend` rules, in order (HAProxy's switching rules).
    pub use_backends: Vec<UseBackend>,
    /// The `if|unless` condition of each `use_backends` rule, same index; `None`
    /// for an unconditional rule.
    pub use_backend_conds: Vec<Option<Cond>>,
    /// `tcp-request connection` rules, in order, evaluated at accept.
    pub tcp_connection: Vec<TcpConnRule>,
    /// `tcp-request content` rules, in order, evaluated on the request's
    /// first bytes within `timeouts.inspect_delay`.
    pub tcp_content: Vec<ContentRule>,
    /// The backend half of a `listen` section (index into [`Config::backends`]):
    /// its content rules are this frontend's.
    pub own_backend: Option<usize>,
    /// 0 = limited only by global maxconn.
    pub maxconn: usize,
    pub timeouts: Timeouts,
    pub splice: SpliceOpts,
    pub log_global: bool,
    pub line: Location,
}

/// HAProxy's default `stats uri`.
pub const DEFAULT_STATS_URI: &str = "/haproxy?stats";
/// HAProxy's default `stats realm`.
pub const DEFAULT_STATS_REALM: &str = "HAProxy Statistics";

/// One `stats auth USER:PASS` account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsUser {
    pub user: String,
    pub pass: String,
}

/// A `listen`/`frontend` section in `mode http` serving the stats page
/// (`stats enable`, `stats uri`, ...): where it listens and what it shows.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsPage {
    pub name: String,
    /// The proxy's id (HAProxy counts the section like any other).
    pub id: u32,
    pub binds: Vec<SocketAddr>,
    /// `stats uri`: the page answers requests whose path starts with it.
    pub uri: String,
    /// `stats refresh`: seconds between two reloads of the page (`None`: none).
    pub refresh: Option<u64>,
    /// `stats realm`.
    pub realm: String,
    /// `stats auth`: no account means no authentication.
    pub users: Vec<StatsUser>,
    /// `stats admin if|unless COND`: who gets the admin forms (`None`: nobody).
    pub admin: Option<Cond>,
    pub hide_version: bool,
    pub show_legends: bool,
    /// `stats show-node [NAME]`: `Some("")` shows the host name.
    pub show_node: Option<String>,
    /// `timeout client`: how long a page client may stay idle.
    pub timeout_client: Option<Duration>,
    pub line: Location,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Backend {
    pub name: String,
    pub id: u32,
    pub balance: Balance,
    pub servers: Vec<Server>,
    pub timeouts: Timeouts,
    /// `retries`, default 3.
    pub retries: u32,
    pub redispatch: bool,
    pub splice: SpliceOpts,
    /// Backend `fullconn`/maxconn: 0 = none.
    pub maxconn: usize,
    pub log_global: bool,
    pub line: Location,
    pub opts: BackendOpts,
    /// `tcp-request content` rules, run once the flow is routed here, within
    /// this backend's `timeouts.inspect_delay`.
    pub tcp_content: Vec<ContentRule>,
    /// `stick on|match|store-request` rules, in order.
    pub stick: Vec<StickRule>,
}

/// `hash-type`: how a hash-based `balance` (`source`) maps a hash to a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashType {
    /// `map-based` (HAProxy's default): hash modulo the total weight; a server
    /// set change moves most keys.
    #[default]
    MapBased,
    /// `consistent`: a ring of points per server; a server going away moves
    /// only its own keys.
    Consistent,
}

/// A backend's options that are neither timeouts nor servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BackendOpts {
    /// `option srvtcpka` (or `tcpka`): SO_KEEPALIVE on server sockets.
    pub srvtcpka: bool,
    /// `option allbackups`: every usable backup server takes traffic when no
    /// active one is up, not only the first.
    pub allbackups: bool,
    /// `option log-health-checks`: every check result change is logged.
    pub log_health_checks: bool,
    pub hash_type: HashType,
}

impl BindOpts {
    /// How HAProxy's connection-error log lines name the listener.
    pub fn label(&self) -> std::borrow::Cow<'_, str> {
        match &self.name {
            Some(n) => n.as_str().into(),
            None => self.id.to_string().into(),
        }
    }
}

/// What a `tcp-request connection` rule does when its condition holds.
#[derive(Debug, Clone, PartialEq)]
pub enum TcpConnAction {
    /// Stop evaluating the rules; the connection goes on.
    Accept,
    /// Close the connection at once (counted in the frontend's `dcon`).
    Reject,
    /// `expect-proxy layer4`: the connection starts with a PROXY header, read
    /// once the rules are done; the rules go on.
    ExpectProxy,
    /// `track-scN KEY [table T]`: the flow tracks the key's entry (unless
    /// that counter already tracks one); the rules go on.
    TrackSc(TrackSc),
}

/// `tcp-request connection accept|reject [if|unless COND]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpConnRule {
    pub action: TcpConnAction,
    pub cond: Option<Cond>,
}

/// What a `tcp-request content` rule does when its condition holds. Open for
/// more actions (`track-sc*`): a new variant is one arm in the parser and
/// one in `session::content_rules`.
#[derive(Debug, Clone, PartialEq)]
pub enum ContentAction {
    /// Stop evaluating the content rules; the flow goes on to routing.
    Accept,
    /// Close the flow (counted in `dreq`, logged `PR`).
    Reject,
    /// `track-scN KEY [table T]`: start tracking (the first rule for a
    /// counter wins, here or in the connection rules) and go on.
    TrackSc(TrackSc),
}

/// `tcp-request content accept|reject [if|unless COND]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ContentRule {
    pub action: ContentAction,
    pub cond: Option<Cond>,
}

/// How a string map converter matches a name with its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameMatch {
    /// `map`, `map_str`: the whole name.
    Exact,
    /// `map_dom`: the name or one of its dot-separated suffixes, the first in file
    /// order.
    Dom,
    /// `map_beg`: a key the name starts with, the first in file order.
    Beg,
}

/// The target of one `use_backend` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UseBackend {
    /// `use_backend NAME` (index into [`Config::backends`]).
    Static(usize),
    /// `use_backend %[src,map_ip(FILE[,DEFAULT])]`: the client address looked up in
    /// map `map` (index into [`Config::maps`]); its value names the backend.
    SrcMap {
        map: usize,
        /// The converter's default value, used when no key matches.
        default: Option<String>,
        /// The backend `default` names, when one does.
        default_target: Option<usize>,
    },
    /// `use_backend %[req.ssl_sni,map(FILE[,DEFAULT])]` (exact), `map_dom` (the key
    /// is the name or a dot-separated suffix of it) or `map_beg` (a prefix): the TLS
    /// server name looked up in string map `map`. A missing or malformed ClientHello
    /// takes the default.
    SniMap {
        map: usize,
        how: NameMatch,
        default: Option<String>,
        default_target: Option<usize>,
    },
}

impl UseBackend {
    /// The backend this rule names statically, if any.
    pub fn static_target(&self) -> Option<usize> {
        match self {
            UseBackend::Static(i) => Some(*i),
            UseBackend::SrcMap { default_target, .. }
            | UseBackend::SniMap { default_target, .. } => *default_target,
        }
    }
}

/// A map file referenced by the configuration, loaded and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapSource {
    /// The file name as written.
    pub path: String,
    /// The first rule that uses it.
    pub used_at: Location,
    pub entries: Vec<super::mapfile::FileEntry>,
}

/// The whole validated configuration.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    pub global: Global,
    pub frontends: Vec<Frontend>,
    pub backends: Vec<Backend>,
    /// `mode http` proxies with `stats enable`: the stats web page, the one HTTP
    /// application shunt serves (they are neither frontends nor backends).
    pub stats_pages: Vec<StatsPage>,
    /// Map files, in load order (index = the map's `#id`).
    pub maps: Vec<MapSource>,
    /// Stick tables, in declaration order (index = [`TableRef::index`]).
    pub tables: Vec<TableSpec>,
}

impl Config {
    pub fn backend_by_name(&self, name: &str) -> Option<usize> {
        self.backends.iter().position(|b| b.name == name)
    }

    /// The key kind of map `id`: strings when an SNI rule uses it, else IP (validation
    /// refuses a file used both ways).
    pub fn map_kind(&self, id: usize) -> super::mapfile::MapKind {
        let by_name = self
            .frontends
            .iter()
            .flat_map(|f| f.use_backends.iter())
            .any(|u| matches!(u, UseBackend::SniMap { map, .. } if *map == id));
        if by_name {
            super::mapfile::MapKind::Str
        } else {
            super::mapfile::MapKind::Ip
        }
    }
}
