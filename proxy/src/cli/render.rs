//! CLI output formats: `show info`, `show stat` (HAProxy 2.6 CSV), `help` and the
//! unknown-command answer (both list the command table, `table.rs`).
//!
//! Owns the exact text that HAProxy tools parse: field names, column order (the 128
//! `show stat` columns of HAProxy 2.6, header included byte for byte), which columns a
//! FRONTEND / server / BACKEND row leaves empty. Reads runtime state, never changes it
//! (changes belong to `dispatch`). Every body returned here ends with `\n` or is empty;
//! the framing adds the answer's terminating empty line.

use std::fmt::{Display, Write as _};
use std::time::UNIX_EPOCH;

use crate::config::{Backend, Balance, CliLevel, Frontend};

use crate::maps::{Maps, Table};

use super::command::InfoFormat;
use super::table::{listing_order, Spec, COMMANDS};
use super::Ctx;

/// The `show stat` columns of HAProxy 2.6, in order (index = column number).
pub const STAT_FIELDS: [&str; 128] = [
    "pxname",
    "svname",
    "qcur",
    "qmax",
    "scur",
    "smax",
    "slim",
    "stot",
    "bin",
    "bout",
    "dreq",
    "dresp",
    "ereq",
    "econ",
    "eresp",
    "wretr",
    "wredis",
    "status",
    "weight",
    "act",
    "bck",
    "chkfail",
    "chkdown",
    "lastchg",
    "downtime",
    "qlimit",
    "pid",
    "iid",
    "sid",
    "throttle",
    "lbtot",
    "tracked",
    "type",
    "rate",
    "rate_lim",
    "rate_max",
    "check_status",
    "check_code",
    "check_duration",
    "hrsp_1xx",
    "hrsp_2xx",
    "hrsp_3xx",
    "hrsp_4xx",
    "hrsp_5xx",
    "hrsp_other",
    "hanafail",
    "req_rate",
    "req_rate_max",
    "req_tot",
    "cli_abrt",
    "srv_abrt",
    "comp_in",
    "comp_out",
    "comp_byp",
    "comp_rsp",
    "lastsess",
    "last_chk",
    "last_agt",
    "qtime",
    "ctime",
    "rtime",
    "ttime",
    "agent_status",
    "agent_code",
    "agent_duration",
    "check_desc",
    "agent_desc",
    "check_rise",
    "check_fall",
    "check_health",
    "agent_rise",
    "agent_fall",
    "agent_health",
    "addr",
    "cookie",
    "mode",
    "algo",
    "conn_rate",
    "conn_rate_max",
    "conn_tot",
    "intercepted",
    "dcon",
    "dses",
    "wrew",
    "connect",
    "reuse",
    "cache_lookups",
    "cache_hits",
    "srv_icur",
    "src_ilim",
    "qtime_max",
    "ctime_max",
    "rtime_max",
    "ttime_max",
    "eint",
    "idle_conn_cur",
    "safe_conn_cur",
    "used_conn_cur",
    "need_conn_est",
    "uweight",
    "agg_server_status",
    "agg_server_check_status",
    "agg_check_status",
    "-",
    "ssl_sess",
    "ssl_reused_sess",
    "ssl_failed_handshake",
    "h2_headers_rcvd",
    "h2_data_rcvd",
    "h2_settings_rcvd",
    "h2_rst_stream_rcvd",
    "h2_goaway_rcvd",
    "h2_detected_conn_protocol_errors",
    "h2_detected_strm_protocol_errors",
    "h2_rst_stream_resp",
    "h2_goaway_resp",
    "h2_open_connections",
    "h2_backend_open_streams",
    "h2_total_connections",
    "h2_backend_total_streams",
    "h1_open_connections",
    "h1_open_streams",
    "h1_total_connections",
    "h1_total_streams",
    "h1_bytes_in",
    "h1_bytes_out",
    "h1_spliced_bytes_in",
    "h1_spliced_bytes_out",
];

/// Column numbers used by name below.
mod col {
    pub const PXNAME: usize = 0;
    pub const SVNAME: usize = 1;
    pub const QCUR: usize = 2;
    pub const QMAX: usize = 3;
    pub const SCUR: usize = 4;
    pub const SMAX: usize = 5;
    pub const SLIM: usize = 6;
    pub const STOT: usize = 7;
    pub const BIN: usize = 8;
    pub const BOUT: usize = 9;
    pub const DREQ: usize = 10;
    pub const ECON: usize = 13;
    pub const ERESP: usize = 14;
    pub const WRETR: usize = 15;
    pub const WREDIS: usize = 16;
    pub const STATUS: usize = 17;
    pub const WEIGHT: usize = 18;
    pub const ACT: usize = 19;
    pub const BCK: usize = 20;
    pub const CHKFAIL: usize = 21;
    pub const CHKDOWN: usize = 22;
    pub const LASTCHG: usize = 23;
    pub const DOWNTIME: usize = 24;
    pub const PID: usize = 26;
    pub const IID: usize = 27;
    pub const SID: usize = 28;
    pub const LBTOT: usize = 30;
    pub const TYPE: usize = 32;
    pub const RATE: usize = 33;
    pub const RATE_LIM: usize = 34;
    pub const RATE_MAX: usize = 35;
    pub const CHECK_STATUS: usize = 36;
    pub const CHECK_CODE: usize = 37;
    pub const CHECK_DURATION: usize = 38;
    pub const HANAFAIL: usize = 45;
    pub const CLI_ABRT: usize = 49;
    pub const SRV_ABRT: usize = 50;
    pub const LASTSESS: usize = 55;
    pub const LAST_CHK: usize = 56;
    pub const CHECK_DESC: usize = 65;
    pub const CHECK_RISE: usize = 67;
    pub const CHECK_FALL: usize = 68;
    pub const CHECK_HEALTH: usize = 69;
    pub const ADDR: usize = 73;
    pub const MODE: usize = 75;
    pub const ALGO: usize = 76;
    pub const CONN_RATE: usize = 77;
    pub const CONN_RATE_MAX: usize = 78;
    pub const CONN_TOT: usize = 79;
    pub const DCON: usize = 81;
    pub const CONNECT: usize = 84;
    pub const SAFE_CONN_CUR: usize = 96;
    pub const USED_CONN_CUR: usize = 97;
    pub const NEED_CONN_EST: usize = 98;
    pub const UWEIGHT: usize = 99;
    pub const DASH: usize = 103;
}

/// Columns a FRONTEND row shows as `0` when shunt has nothing to count there.
const FE_ZERO: &[usize] = &[10, 11, 12, 46, 47, 48, 51, 52, 53, 54, 82, 83, 94];
/// Columns a server row shows as `0` when shunt has nothing to count there.
const SV_ZERO: &[usize] = &[
    11, 58, 59, 60, 61, 83, 85, 88, 90, 91, 92, 93, 94, 95, 96, 104, 105, 106,
];
/// Columns a BACKEND row shows as `0` when shunt has nothing to count there.
const BE_ZERO: &[usize] = &[
    10, 11, 22, 24, 51, 52, 53, 54, 58, 59, 60, 61, 83, 85, 90, 91, 92, 93, 94, 100, 101, 102,
];
/// The HTTP/2, HTTP/1 and SSL module columns that proxies (not servers) show as `0`.
const PX_MODULE_ZERO: std::ops::RangeInclusive<usize> = 104..=127;

/// `stot` type of each row, HAProxy's `type` column.
const TYPE_FRONTEND: u32 = 0;
const TYPE_BACKEND: u32 = 1;
const TYPE_SERVER: u32 = 2;

/// `show stat` type-filter bits.
pub const STAT_TYPE_FE: i64 = 1;
pub const STAT_TYPE_BE: i64 = 2;
pub const STAT_TYPE_SV: i64 = 4;

/// shunt's own `show stat` columns, after HAProxy's 128 (the warm-spare pool's
/// counters, `crate::pool`): set on server and BACKEND rows, empty on FRONTEND rows.
pub const SHUNT_STAT_FIELDS: [&str; 4] = ["warm_hit", "warm_miss", "warm_dead", "warm_purged"];

/// The `show stat` header line, `\n` included: HAProxy's columns, then shunt's.
pub fn stat_header() -> String {
    let mut s = String::with_capacity(1600);
    s.push_str("# ");
    for f in STAT_FIELDS.iter().chain(SHUNT_STAT_FIELDS.iter()) {
        s.push_str(f);
        s.push(',');
    }
    s.push('\n');
    s
}

/// One CSV row under construction: every column empty until set.
struct Row(Vec<String>);

impl Row {
    /// The session and byte columns every row type carries.
    fn sessions(&mut self, s: &crate::stats::Snapshot) {
        self.set(col::SCUR, s.scur);
        self.set(col::SMAX, s.smax);
        self.set(col::STOT, s.stot);
        self.set(col::BIN, s.bin);
        self.set(col::BOUT, s.bout);
    }

    /// The server-side error and retry columns of server and BACKEND rows.
    fn server_side(&mut self, s: &crate::stats::Snapshot) {
        self.set(col::ECON, s.econ);
        self.set(col::ERESP, s.eresp);
        self.set(col::WRETR, s.wretr);
        self.set(col::WREDIS, s.wredis);
    }

    fn new() -> Self {
        Row(vec![
            String::new();
            STAT_FIELDS.len() + SHUNT_STAT_FIELDS.len()
        ])
    }

    fn set(&mut self, i: usize, v: impl Display) {
        self.0[i] = v.to_string();
    }

    /// The warm-spare counters in shunt's columns.
    fn warm(&mut self, c: crate::lb::spares::Counters) {
        let base = STAT_FIELDS.len();
        for (i, v) in [c.hit, c.miss, c.dead, c.purged].into_iter().enumerate() {
            self.set(base + i, v);
        }
    }

    fn zeros(&mut self, cols: impl IntoIterator<Item = usize>) {
        for i in cols {
            self.0[i] = "0".to_string();
        }
    }
}

/// A proxy as `show stat` lists it: a frontend, a backend, or both (a `listen`).
#[derive(Debug, Clone, Copy)]
pub struct ProxyRef {
    pub id: u32,
    pub frontend: Option<usize>,
    pub backend: Option<usize>,
}

/// Every proxy, ordered by id (HAProxy's dump order); a frontend and a backend with the
/// same name and id are one proxy.
pub fn proxies(ctx: &Ctx) -> Vec<ProxyRef> {
    let cfg = &ctx.state.config;
    let mut list: Vec<ProxyRef> = cfg
        .frontends
        .iter()
        .enumerate()
        .map(|(i, fe)| ProxyRef {
            id: fe.id,
            frontend: Some(i),
            backend: None,
        })
        .collect();
    for (bi, be) in cfg.backends.iter().enumerate() {
        let twin = list.iter_mut().find(|p| {
            p.backend.is_none()
                && p.frontend
                    .is_some_and(|fi| cfg.frontends[fi].name == be.name && p.id == be.id)
        });
        match twin {
            Some(p) => p.backend = Some(bi),
            None => list.push(ProxyRef {
                id: be.id,
                frontend: None,
                backend: Some(bi),
            }),
        }
    }
    list.sort_by_key(|p| p.id);
    list
}

/// Name of a proxy.
pub fn proxy_name<'a>(ctx: &'a Ctx, p: &ProxyRef) -> &'a str {
    let cfg = &ctx.state.config;
    match (p.frontend, p.backend) {
        (Some(fi), _) => &cfg.frontends[fi].name,
        (None, Some(bi)) => &cfg.backends[bi].name,
        (None, None) => "",
    }
}

/// Resolved `show stat` filter: `iid` None = all proxies.
#[derive(Debug, Clone, Copy)]
pub struct StatFilter {
    pub iid: Option<u32>,
    pub types: i64,
    pub sid: i64,
}

impl StatFilter {
    pub const ALL: StatFilter = StatFilter {
        iid: None,
        types: -1,
        sid: -1,
    };
}

/// `show stat` in HAProxy 2.6's CSV: header, then per proxy its FRONTEND row, its
/// servers, its BACKEND row.
pub fn show_stat(ctx: &Ctx, filter: StatFilter) -> String {
    let mut out = stat_header();
    for r in stat_rows(ctx, filter) {
        write_row(&r, &mut out);
    }
    out
}

/// The rows of `show stat` (the stats page's table, CSV and JSON read the same):
/// per proxy its FRONTEND row, its servers, its BACKEND row; each row's cells in
/// [`STAT_FIELDS`] then [`SHUNT_STAT_FIELDS`] order, an empty cell for an empty
/// field.
pub fn stat_rows(ctx: &Ctx, filter: StatFilter) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let uptime = ctx.uptime_secs();
    for p in proxies(ctx) {
        if filter.iid.is_some_and(|id| id != p.id) {
            continue;
        }
        if let Some(fi) = p.frontend {
            if filter.types & STAT_TYPE_FE != 0 {
                out.push(frontend_row(ctx, fi, &ctx.state.config.frontends[fi]).0);
            }
        }
        if let Some(bi) = p.backend {
            let be = &ctx.state.config.backends[bi];
            if filter.types & STAT_TYPE_SV != 0 {
                for si in 0..be.servers.len() {
                    if filter.sid != -1 && i64::from(be.servers[si].id) != filter.sid {
                        continue;
                    }
                    out.push(server_row(ctx, bi, si, uptime).0);
                }
            }
            if filter.types & STAT_TYPE_BE != 0 {
                out.push(backend_row(ctx, bi, be, uptime).0);
            }
        }
    }
    out
}

/// The column of `show stat` field `name` (HAProxy's or shunt's).
pub fn stat_col(name: &str) -> Option<usize> {
    STAT_FIELDS
        .iter()
        .chain(SHUNT_STAT_FIELDS.iter())
        .position(|f| *f == name)
}

/// One row as a CSV line, `\n` included.
fn write_row(cells: &[String], out: &mut String) {
    for f in cells {
        out.push_str(f);
        out.push(',');
    }
    out.push('\n');
}

/// Frontend `slim`: its maxconn in force, else the global one in force.
fn frontend_slim(ctx: &Ctx, fi: usize) -> usize {
    match ctx.state.admission.limits().frontend(fi) {
        0 => ctx.state.admission.limits().global(),
        n => n,
    }
}

fn frontend_row(ctx: &Ctx, fi: usize, fe: &Frontend) -> Row {
    let s = ctx.state.stats.frontends[fi].snapshot();
    let stopping = ctx.state.lifecycle.stopping();
    let mut r = Row::new();
    r.zeros(FE_ZERO.iter().copied());
    r.zeros(PX_MODULE_ZERO);
    r.set(col::PXNAME, &fe.name);
    r.set(col::SVNAME, "FRONTEND");
    r.sessions(&s);
    r.set(col::SLIM, frontend_slim(ctx, fi));
    r.set(col::STATUS, if stopping { "STOP" } else { "OPEN" });
    r.set(col::PID, 1);
    r.set(col::IID, fe.id);
    r.set(col::SID, 0);
    r.set(col::TYPE, TYPE_FRONTEND);
    r.set(col::RATE, 0);
    r.set(col::RATE_LIM, 0);
    r.set(col::RATE_MAX, 0);
    r.set(col::MODE, "tcp");
    r.set(col::CONN_RATE, 0);
    r.set(col::CONN_RATE_MAX, 0);
    r.set(col::CONN_TOT, s.stot);
    r.set(col::DCON, s.dcon);
    r.set(col::DREQ, s.dreq);
    r.set(col::DASH, "-");
    r
}

/// HAProxy's server status word (`UP`, `DOWN 1/2`, `DRAIN`, `no check`, ...).
fn server_status(ctx: &Ctx, bi: usize, si: usize) -> String {
    let rt = &ctx.state.backends[bi].servers[si];
    let cli_drain = rt.admin_note().drain_weight.is_some();
    crate::lb::status::status_word(rt, cli_drain)
}

fn server_row(ctx: &Ctx, bi: usize, si: usize, uptime: u64) -> Row {
    let be = &ctx.state.config.backends[bi];
    let cfg = &be.servers[si];
    let rt = &ctx.state.backends[bi].servers[si];
    let s = ctx.state.stats.servers[bi][si].snapshot();
    let mut r = Row::new();
    r.zeros(SV_ZERO.iter().copied());
    r.set(col::PXNAME, &be.name);
    r.set(col::SVNAME, &cfg.name);
    r.set(col::QCUR, rt.queue_cur());
    r.set(col::QMAX, rt.queue_max());
    r.sessions(&s);
    r.server_side(&s);
    if rt.maxconn() > 0 {
        r.set(col::SLIM, rt.maxconn());
    }
    r.set(col::STATUS, server_status(ctx, bi, si));
    // A draining server runs with weight 0 but reports its user weight, as HAProxy.
    // The `weight` column is the effective weight (ramping during `slowstart`).
    let weight = rt.admin_note().drain_weight.unwrap_or_else(|| rt.eweight());
    r.set(col::WEIGHT, weight);
    if cfg.check.observe_layer4 {
        r.set(col::HANAFAIL, rt.hanafail());
    }
    r.set(col::ACT, u32::from(!cfg.backup));
    r.set(col::BCK, u32::from(cfg.backup));
    r.set(
        col::LASTCHG,
        if cfg.check.enabled || cfg.check.agent_check {
            rt.check_report().last_change.elapsed().as_secs()
        } else {
            uptime
        },
    );
    r.set(col::PID, 1);
    r.set(col::IID, be.id);
    r.set(col::SID, cfg.id);
    r.set(col::LBTOT, rt.selected());
    r.set(col::TYPE, TYPE_SERVER);
    r.set(col::RATE, 0);
    r.set(col::RATE_MAX, 0);
    r.set(col::CLI_ABRT, s.cli_abrt);
    r.set(col::SRV_ABRT, s.srv_abrt);
    r.set(col::LASTSESS, if s.stot == 0 { -1 } else { 0 });
    r.set(col::ADDR, rt.addr());
    r.set(col::MODE, "tcp");
    r.set(col::CONNECT, s.stot);
    r.set(col::USED_CONN_CUR, s.scur);
    r.set(col::NEED_CONN_EST, rt.pool.need());
    // `uweight`: the user weight (a draining server reports the one it keeps).
    let uweight = rt.admin_note().drain_weight.unwrap_or_else(|| rt.weight());
    r.set(col::UWEIGHT, uweight);
    r.warm(rt.pool.counters());
    r.set(col::SAFE_CONN_CUR, rt.pool.idle_cur());
    r.set(col::DASH, "-");
    if cfg.check.enabled {
        // The last health check, as HAProxy's stats show it: `INI` before the first,
        // and `* ` before the status while a check runs.
        let rep = rt.check_report();
        r.set(col::CHKFAIL, rt.chkfail());
        r.set(col::CHKDOWN, rt.chkdown());
        r.set(col::DOWNTIME, rt.downtime().as_secs());
        let running = if rep.in_progress { "* " } else { "" };
        match rep.status {
            None => {
                r.set(col::CHECK_STATUS, format!("{running}INI"));
                r.set(col::CHECK_DESC, "Initializing");
            }
            Some(st) => {
                r.set(col::CHECK_STATUS, format!("{running}{}", st.info()));
                r.set(col::CHECK_DESC, st.desc());
                if st.has_code() {
                    r.set(col::CHECK_CODE, rep.code.unwrap_or(0));
                }
                if let Some(d) = rep.duration {
                    r.set(col::CHECK_DURATION, d.as_millis());
                }
                r.set(col::LAST_CHK, csv_field(&rep.desc));
            }
        }
        r.set(col::CHECK_RISE, rt.rise());
        r.set(col::CHECK_FALL, rt.fall());
        r.set(
            col::CHECK_HEALTH,
            if rt.is_maint() { 0 } else { rt.health() },
        );
    }
    r
}

/// A free-text value made safe for one CSV field (HAProxy quotes such fields; shunt's
/// consumers split on commas, so commas and line ends become spaces).
fn csv_field(s: &str) -> String {
    s.chars()
        .map(|c| {
            if matches!(c, ',' | '\n' | '\r') {
                ' '
            } else {
                c
            }
        })
        .collect()
}

fn algo_name(b: Balance) -> &'static str {
    match b {
        Balance::RoundRobin => "roundrobin",
        Balance::StaticRr => "static-rr",
        Balance::LeastConn => "leastconn",
        Balance::First => "first",
        Balance::Source => "source",
        Balance::Random => "random",
        // HAProxy's `show backend`/`algo` name for `balance hash`.
        Balance::Hash(_) => "hash",
    }
}

/// Backend `slim`: its maxconn, else HAProxy's default fullconn (a tenth of the sum of
/// the configured maxconn of the frontends that route to it, rounded up; HAProxy
/// computes it once at start, so `set maxconn` does not move it).
fn backend_slim(ctx: &Ctx, bi: usize, be: &Backend) -> usize {
    if be.maxconn > 0 {
        return be.maxconn;
    }
    let sum: usize = ctx
        .state
        .config
        .frontends
        .iter()
        .filter(|fe| {
            fe.default_backend == Some(bi)
                || fe
                    .use_backends
                    .iter()
                    .any(|u| u.static_target() == Some(bi))
        })
        .map(|fe| match fe.maxconn {
            0 => ctx.state.config.global.maxconn,
            n => n,
        })
        .sum();
    sum.div_ceil(10)
}

fn backend_row(ctx: &Ctx, bi: usize, be: &Backend, uptime: u64) -> Row {
    let rt = &ctx.state.backends[bi];
    let s = ctx.state.stats.backends[bi].snapshot();
    let (mut act, mut bck, mut w_act, mut w_bck) = (0u32, 0u32, 0u32, 0u32);
    let mut lbtot = 0u64;
    for (si, srv) in rt.servers.iter().enumerate() {
        lbtot += srv.selected();
        if srv.is_maint() || !srv.is_up() {
            continue;
        }
        if be.servers[si].backup {
            bck += 1;
            w_bck += srv.weight();
        } else {
            act += 1;
            w_act += srv.weight();
        }
    }
    // HAProxy's backend weight counts the active servers, or the backups when none is up.
    let weight = if act > 0 { w_act } else { w_bck };
    let mut r = Row::new();
    r.zeros(BE_ZERO.iter().copied());
    r.zeros(PX_MODULE_ZERO);
    r.set(col::PXNAME, &be.name);
    r.set(col::SVNAME, "BACKEND");
    r.set(col::QCUR, rt.queue_cur());
    r.set(col::QMAX, rt.queue_max());
    r.sessions(&s);
    r.server_side(&s);
    r.set(col::SLIM, backend_slim(ctx, bi, be));
    r.set(col::STATUS, if act + bck > 0 { "UP" } else { "DOWN" });
    r.set(col::WEIGHT, weight);
    r.set(col::ACT, act);
    r.set(col::BCK, bck);
    r.set(col::LASTCHG, uptime);
    r.set(col::PID, 1);
    r.set(col::IID, be.id);
    r.set(col::SID, 0);
    r.set(col::LBTOT, lbtot);
    r.set(col::TYPE, TYPE_BACKEND);
    r.set(col::DREQ, s.dreq);
    r.set(col::RATE, 0);
    r.set(col::RATE_MAX, 0);
    r.set(col::CLI_ABRT, s.cli_abrt);
    r.set(col::SRV_ABRT, s.srv_abrt);
    r.set(col::LASTSESS, if s.stot == 0 { -1 } else { 0 });
    r.set(col::MODE, "tcp");
    r.set(col::ALGO, algo_name(be.balance));
    r.set(col::CONNECT, s.stot);
    r.set(col::UWEIGHT, weight);
    r.set(col::DASH, "-");
    r.warm(warm_totals(rt.servers.iter().map(|s| &**s)));
    r
}

/// The warm-spare counters summed over `servers`.
fn warm_totals<'a>(
    servers: impl Iterator<Item = &'a crate::lb::ServerRt>,
) -> crate::lb::spares::Counters {
    let mut c = crate::lb::spares::Counters::default();
    for s in servers {
        c += s.pool.counters();
    }
    c
}

/// One `show info` field: HAProxy's position, name, tags and type, and the value.
struct InfoField {
    pos: u32,
    name: &'static str,
    tags: &'static str,
    ty: &'static str,
    value: String,
}

/// `Nd Nh NNmNNs`, as HAProxy prints `Uptime`.
pub fn format_uptime(secs: u64) -> String {
    let (d, rem) = (secs / 86_400, secs % 86_400);
    format!(
        "{}d {}h{:02}m{:02}s",
        d,
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

fn info_fields(ctx: &Ctx) -> Vec<InfoField> {
    let st = &ctx.state;
    let cfg = &st.config;
    let uptime = ctx.uptime_secs();
    let start = st
        .facts
        .started()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let conns = st.admission.conns();
    let fe: Vec<_> = st.stats.frontends.iter().map(|c| c.snapshot()).collect();
    let cum_conns: u64 = fe.iter().map(|s| s.stot).sum();
    let bytes_out: u64 = fe.iter().map(|s| s.bout).sum();
    let listeners =
        cfg.frontends.iter().map(|f| f.binds.len()).sum::<usize>() + cfg.global.stats_sockets.len();
    let stopping = st.lifecycle.stopping();
    let nofile = crate::sys::nofile_limit();
    // Live tasks, queued entries and idle share, as each worker last published them.
    let load = crate::scheduler::load(&st.workers.remotes());
    let version = env!("CARGO_PKG_VERSION");
    let fields: Vec<(u32, &str, &str, &str, String)> = vec![
        (
            0,
            "Name",
            "POS",
            "str",
            ctx.state
                .config
                .global
                .stats_show_name
                .clone()
                .unwrap_or_else(|| ctx.name.clone()),
        ),
        (1, "Version", "POS", "str", version.to_string()),
        (2, "Release_date", "POS", "str", RELEASE_DATE.to_string()),
        (3, "Nbthread", "CGS", "u32", st.facts.nbthread().to_string()),
        (4, "Nbproc", "CGS", "u32", "1".into()),
        (5, "Process_num", "KGP", "u32", "1".into()),
        (6, "Pid", "SGP", "u32", std::process::id().to_string()),
        (7, "Uptime", "MDP", "str", format_uptime(uptime)),
        (8, "Uptime_sec", "MDP", "u32", uptime.to_string()),
        (9, "Memmax_MB", "CLP", "u32", "0".into()),
        (10, "PoolAlloc_MB", "MGP", "u32", "0".into()),
        (11, "PoolUsed_MB", "MGP", "u32", "0".into()),
        (12, "PoolFailed", "MCP", "u32", "0".into()),
        (13, "Ulimit-n", "CLP", "u32", nofile.to_string()),
        (14, "Maxsock", "CLP", "u32", nofile.to_string()),
        (
            15,
            "Maxconn",
            "CLP",
            "u32",
            st.admission.limits().global().to_string(),
        ),
        (
            16,
            "Hard_maxconn",
            "CLP",
            "u32",
            cfg.global.maxconn.to_string(),
        ),
        (17, "CurrConns", "MGP", "u32", conns.to_string()),
        (18, "CumConns", "MCP", "u32", cum_conns.to_string()),
        (19, "CumReq", "MCP", "u32", "0".into()),
        (20, "MaxSslConns", "MMP", "u32", "0".into()),
        (21, "CurrSslConns", "MGP", "u32", "0".into()),
        (22, "CumSslConns", "MCP", "u32", "0".into()),
        (
            23,
            "Maxpipes",
            "CLP",
            "u32",
            cfg.global.maxpipes.to_string(),
        ),
        (
            24,
            "PipesUsed",
            "MGP",
            "u32",
            st.forwarding.pipes.in_use().to_string(),
        ),
        (
            25,
            "PipesFree",
            "MGP",
            "u32",
            st.forwarding.pipes.free().to_string(),
        ),
        (26, "ConnRate", "MRP", "u32", "0".into()),
        (27, "ConnRateLimit", "CLP", "u32", "0".into()),
        (28, "MaxConnRate", "MMP", "u32", "0".into()),
        (29, "SessRate", "MRP", "u32", "0".into()),
        (30, "SessRateLimit", "CLP", "u32", "0".into()),
        (31, "MaxSessRate", "MRP", "u32", "0".into()),
        (32, "SslRate", "MRP", "u32", "0".into()),
        (33, "SslRateLimit", "CLP", "u32", "0".into()),
        (34, "MaxSslRate", "MMP", "u32", "0".into()),
        (35, "SslFrontendKeyRate", "MGP", "u32", "0".into()),
        (36, "SslFrontendMaxKeyRate", "MMP", "u32", "0".into()),
        (37, "SslFrontendSessionReuse_pct", "MGP", "u32", "0".into()),
        (38, "SslBackendKeyRate", "MRP", "u32", "0".into()),
        (39, "SslBackendMaxKeyRate", "MMP", "u32", "0".into()),
        (40, "SslCacheLookups", "MCP", "u32", "0".into()),
        (41, "SslCacheMisses", "MCP", "u32", "0".into()),
        (42, "CompressBpsIn", "MRP", "u32", "0".into()),
        (43, "CompressBpsOut", "MRP", "u32", "0".into()),
        (44, "CompressBpsRateLim", "CLP", "u32", "0".into()),
        (47, "Tasks", "MGP", "u32", load.tasks.to_string()),
        (48, "Run_queue", "MGP", "u32", load.run_queue.to_string()),
        (49, "Idle_pct", "MaP", "u32", load.idle_pct.to_string()),
        (50, "node", "COS", "str", ctx.node.clone()),
        (
            52,
            "Stopping",
            "MGP",
            "u32",
            u32::from(stopping).to_string(),
        ),
        (53, "Jobs", "MGP", "u32", (conns + listeners).to_string()),
        (54, "Unstoppable Jobs", "MGP", "u32", "0".into()),
        (55, "Listeners", "MGP", "u32", listeners.to_string()),
        (56, "ActivePeers", "MGP", "u32", "0".into()),
        (57, "ConnectedPeers", "MGP", "u32", "0".into()),
        (
            58,
            "DroppedLogs",
            "MGP",
            "u32",
            st.log.dropped().to_string(),
        ),
        (59, "BusyPolling", "MGP", "u32", "0".into()),
        (60, "FailedResolutions", "MGP", "u32", "0".into()),
        (61, "TotalBytesOut", "MGP", "u64", bytes_out.to_string()),
        (62, "TotalSplicdedBytesOut", "MGP", "u64", "0".into()),
        (63, "BytesOutRate", "MRP", "u64", "0".into()),
        (64, "DebugCommandsIssued", "MGP", "u32", "0".into()),
        (65, "CumRecvLogs", "MCP", "u32", "0".into()),
        (66, "Build info", "POS", "str", version.to_string()),
        (67, "Memmax_bytes", "CLP", "u32", "0".into()),
        (68, "PoolAlloc_bytes", "MGP", "u64", "0".into()),
        (69, "PoolUsed_bytes", "MGP", "u64", "0".into()),
        (70, "Start_time_sec", "MDP", "u32", start.to_string()),
        (71, "Tainted", "SGP", "str", "0".into()),
    ];
    let mut v: Vec<InfoField> = fields
        .into_iter()
        .map(|(pos, name, tags, ty, value)| InfoField {
            pos,
            name,
            tags,
            ty,
            value,
        })
        .collect();
    // shunt's own fields come after HAProxy's.
    v.push(InfoField {
        pos: 72,
        name: "Forward_mode",
        tags: "CGS",
        ty: "str",
        value: st.facts.forward_mode().as_str().to_string(),
    });
    v.push(InfoField {
        pos: 73,
        name: "Bpf",
        tags: "CGS",
        ty: "str",
        value: st.facts.bpf().to_string(),
    });
    let names = ["SockmapFlows", "SpliceFlows", "CopyFlows"];
    for (i, (name, mode)) in names.into_iter().zip(crate::handoff::Mode::ALL).enumerate() {
        v.push(InfoField {
            pos: 74 + i as u32,
            name,
            tags: "CGS",
            ty: "u64",
            value: st.stats.modes.flows(mode).to_string(),
        });
    }
    let k = crate::handoff::sockmap::KernelInfo::of(st.forwarding.kernel.as_deref());
    let kernel = [
        ("SockhashEntries", k.sockhash_entries as u64),
        ("SockmapFlowEntries", k.flow_entries as u64),
        ("SockmapPauses", k.pauses),
        ("SockmapInflightPeak", k.peak_inflight as u64),
        ("SockmapFallbacks", k.fallbacks),
        ("SockmapRedirectErrors", k.redirect_errors),
        ("SockmapOverlapTrimmed", k.overlap_trimmed),
        ("SockmapTrimFailed", k.trim_failed),
        ("SockmapSeqUnknown", k.seq_unknown),
    ];
    for (i, (name, value)) in kernel.into_iter().enumerate() {
        v.push(InfoField {
            pos: 77 + i as u32,
            name,
            tags: "CGS",
            ty: "u64",
            value: value.to_string(),
        });
    }
    // The warm-spare pool's counters, all servers (same names as in `show stat`).
    let w = warm_totals(
        st.backends
            .iter()
            .flat_map(|b| b.servers.iter().map(|s| &**s)),
    );
    let warm = [w.hit, w.miss, w.dead, w.purged];
    for (i, (name, value)) in SHUNT_STAT_FIELDS.into_iter().zip(warm).enumerate() {
        v.push(InfoField {
            pos: 84 + i as u32,
            name,
            tags: "MCP",
            ty: "u64",
            value: value.to_string(),
        });
    }
    for (i, (name, value)) in [
        ("SockmapEofCatchups", k.eof_catchups),
        ("SockmapTrimPassed", k.trim_passed),
        ("PromotedFlows", st.stats.modes.promoted()),
    ]
    .into_iter()
    .enumerate()
    {
        v.push(InfoField {
            pos: 88 + i as u32,
            name,
            tags: "CGS",
            ty: "u64",
            value: value.to_string(),
        });
    }
    // Whether TLS flows are handed to the kernel, and how many were.
    v.push(InfoField {
        pos: 91,
        name: "Ktls",
        tags: "CGS",
        ty: "str",
        value: st.tls.kernel().describe().to_string(),
    });
    v.push(InfoField {
        pos: 92,
        name: "KtlsFlows",
        tags: "CGS",
        ty: "u64",
        value: st.stats.modes.ktls_flows().to_string(),
    });
    v
}

/// Release date printed by `show info` (`Release_date`), updated with each release.
pub const RELEASE_DATE: &str = "2025/01/01";

/// `show info` as `Key: value` lines, or typed lines.
pub fn show_info(ctx: &Ctx, fmt: InfoFormat) -> String {
    let mut out = String::with_capacity(1600);
    if fmt == InfoFormat::Json {
        let elems: Vec<String> = info_fields(ctx)
            .iter()
            .map(|f| super::typed::info_json_element(f.pos, f.name, f.tags, f.ty, &f.value))
            .collect();
        out.push('[');
        out.push_str(&elems.join(","));
        out.push_str("]\n");
        return out;
    }
    for f in info_fields(ctx) {
        // Writing into a String cannot fail.
        let _ = match fmt {
            InfoFormat::Plain => writeln!(out, "{}: {}", f.name, f.value),
            InfoFormat::Typed | InfoFormat::Json => writeln!(
                out,
                "{}.{}.1:{}:{}:{}",
                f.pos, f.name, f.tags, f.ty, f.value
            ),
        };
    }
    out
}

/// Width of the syntax column in `help` listings.
const HELP_SYNTAX_WIDTH: usize = 40;

fn help_line(out: &mut String, e: &Spec) {
    let _ = writeln!(
        out,
        "  {:<width$}: {}",
        e.usage,
        e.help,
        width = HELP_SYNTAX_WIDTH
    );
}

/// `help [WORDS]`: every command of the table, or those whose words start with
/// WORDS, in HAProxy's listing order.
pub fn help(words: &[String]) -> String {
    let matching: Vec<&Spec> = COMMANDS
        .iter()
        .filter(|e| words.iter().zip(e.words.iter()).all(|(w, k)| w == k))
        .collect();
    let mut list = if matching.is_empty() {
        COMMANDS.iter().collect()
    } else {
        matching
    };
    list.sort_by(|a, b| listing_order(a, b));
    let mut out = String::from("The following commands are valid at this level:\n");
    for e in list {
        help_line(&mut out, e);
    }
    out
}

/// How many close matches an unknown command is answered with (HAProxy's CLI_MAX_MATCHES).
const MAX_MATCHES: usize = 5;

/// Bigram fingerprint of a word list: counts of each (previous byte, byte) pair, with
/// word starts and ends marked, over a 32-symbol alphabet.
fn fingerprint(words: &[&str]) -> Vec<i32> {
    fn sym(b: u8) -> usize {
        match b {
            b'a'..=b'z' => usize::from(b - b'a') + 1,
            b'A'..=b'Z' => usize::from(b - b'A') + 1,
            0 => 0,
            _ => 27 + usize::from(b % 5),
        }
    }
    let mut fp = vec![0i32; 32 * 32];
    for w in words {
        let mut prev = 0u8;
        for b in w.bytes().chain(std::iter::once(0)) {
            fp[sym(prev) * 32 + sym(b)] += 1;
            prev = b;
        }
    }
    fp
}

fn fp_distance(a: &[i32], b: &[i32]) -> i32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum()
}

/// The answer to an unknown command: the closest commands, then `help`, `prompt`, `quit`,
/// in listing order — HAProxy's "better match" listing.
pub fn unknown(words: &[String]) -> String {
    let typed: Vec<&str> = words.iter().map(String::as_str).collect();
    let fp = fingerprint(&typed);
    let mut scored: Vec<(i32, usize)> = COMMANDS
        .iter()
        .enumerate()
        .filter(|(_, e)| !e.always_listed())
        .map(|(i, e)| {
            let n = e.words.len().min(typed.len().max(1));
            (fp_distance(&fp, &fingerprint(&e.words[..n])), i)
        })
        .collect();
    scored.sort();
    let mut chosen: Vec<usize> = scored.iter().take(MAX_MATCHES).map(|&(_, i)| i).collect();
    chosen.extend(
        COMMANDS
            .iter()
            .enumerate()
            .filter(|(_, e)| e.always_listed())
            .map(|(i, _)| i),
    );
    chosen.sort_by(|&a, &b| listing_order(&COMMANDS[a], &COMMANDS[b]));
    let mut out =
        String::from("Unknown command, but maybe one of the following ones is a better match:\n");
    for i in chosen {
        help_line(&mut out, &COMMANDS[i]);
    }
    out
}

/// `show map`: one line per loaded map, under HAProxy's header.
pub fn show_maps(maps: &Maps) -> String {
    let mut out = String::from("# id (file) description\n");
    for m in maps.iter() {
        out.push_str(&m.describe());
        out.push('\n');
    }
    out
}

/// `get map MAP VALUE`: VALUE looked up as a flow's address would be (a value that is
/// not an address matches nothing, as HAProxy's failed cast).
pub fn get_map(table: &Table, value: &str) -> String {
    let ty = table.kind().type_name();
    match table.lookup_text(value) {
        Some(e) => format!(
            "type={ty}, case=sensitive, found=yes, idx=tree, key=\"{}\", value=\"{}\", type=\"str\"\n",
            e.key, e.value
        ),
        None => format!("type={ty}, case=sensitive, found=no\n"),
    }
}

/// `show cli level`.
pub fn level_name(l: CliLevel) -> &'static str {
    match l {
        CliLevel::User => "user",
        CliLevel::Operator => "operator",
        CliLevel::Admin => "admin",
    }
}

/// `show servers conn` for the backends at `bis`, in HAProxy's columns, filled from
/// the warm-spare pool (`crate::pool`): `purge_delay` is `pool-purge-delay` (ms),
/// `used_cur` the flows running on the server, `used_max` their peak in the current
/// period, `need_est` the spares wanted now, `safe_nb` and `idle_cur` the spares
/// held (a spare never carried a byte: "safe"), `idle_lim` `pool-max-conn` (-1 =
/// unlimited; HAProxy's default -1 too for a server without a pool, as HAProxy
/// prints it), `idle_per_thr` the spares of each thread.
pub fn show_servers_conn(ctx: &Ctx, bis: &[usize]) -> String {
    let nbthread = ctx.state.facts.nbthread().max(1);
    let mut out = format!(
        "# bkname/svname bkid/svid addr port - purge_delay used_cur used_max need_est unsafe_nb safe_nb idle_lim idle_cur idle_per_thr[{nbthread}]\n"
    );
    for &bi in bis {
        let be = &ctx.state.config.backends[bi];
        for (si, cfg) in be.servers.iter().enumerate() {
            let rt = &ctx.state.backends[bi].servers[si];
            let pool = &rt.pool;
            let params = pool.params();
            let idle = pool.idle_cur();
            let _ = write!(
                out,
                "{}/{} {}/{} {} {} - {} {} {} {} 0 {idle} {} {idle}",
                be.name,
                cfg.name,
                be.id,
                cfg.id,
                rt.addr().ip(),
                rt.addr().port(),
                params.purge_delay.as_millis(),
                pool.used_cur(),
                pool.used_max(),
                pool.need(),
                // HAProxy prints its default (-1) for a server without a pool.
                if pool.enabled() { params.max_conn } else { -1 },
            );
            for n in pool.idle_per_thr(nbthread) {
                let _ = write!(out, " {n}");
            }
            out.push('\n');
        }
    }
    out
}

/// `show backend`: every backend's name under HAProxy's header.
pub fn show_backend(ctx: &Ctx) -> String {
    let mut out = String::from("# name\n");
    for be in &ctx.state.config.backends {
        out.push_str(&be.name);
        out.push('\n');
    }
    out
}

/// HAProxy's `human_time`: at most two units, `0s` for zero (`1s`, `2m3s`, `1h5m`, `3d2h`).
pub fn human_time(secs: u64) -> String {
    let mut out = String::new();
    let mut units = 0;
    let mut t = secs;
    for (size, unit) in [(86_400, 'd'), (3_600, 'h'), (60, 'm')] {
        if units < 2 && t >= size {
            let _ = write!(out, "{}{unit}", t / size);
            t %= size;
            units += 1;
        }
    }
    if units < 2 && (t > 0 || units == 0) {
        let _ = write!(out, "{t}s");
    }
    out
}

/// One `show sess` line for a flow, in HAProxy 2.6's short format (stream fields a
/// tcp flow does not have are left at HAProxy's idle values) plus ` fwd=MODE`
/// (`sockmap`, `splice`, `copy`, `auto` while `auto` forwards it in userspace; `-`
/// before forwarding starts), and ` promoted=AGE` once `auto` moved it to the kernel
/// (its age then, in milliseconds).
pub fn sess_line(ctx: &Ctx, v: &crate::stats::flows::FlowView, out: &mut Vec<u8>) {
    let cfg = &ctx.state.config;
    let fe = cfg
        .frontends
        .get(v.fe)
        .map_or("<NONE>", |f| f.name.as_str());
    let be_cfg = v.be.and_then(|b| cfg.backends.get(b));
    let be = be_cfg.map_or("<NONE>", |b| b.name.as_str());
    let srv = match (be_cfg, v.srv) {
        (Some(b), Some(s)) => b.servers.get(s).map_or("<none>", |s| s.name.as_str()),
        _ => "<none>",
    };
    let proto = if v.client.is_ipv4() { "tcpv4" } else { "tcpv6" };
    let line = format!(
        "0x{:x}: proto={proto} src={} fe={fe} be={be} srv={srv} ts=00 epoch=0 age={} \
         calls=0 rate=0 cpu=0 lat=0 rq[f=0h,i=0,an=00h,rx=,wx=,ax=] \
         rp[f=0h,i=0,an=00h,rx=,wx=,ax=] scf=[8,0h,fd={}] scb=[8,1h,fd={}] exp= rc=0 \
         c_exp= fwd={}{}\n",
        v.id,
        v.client,
        human_time(v.age_secs),
        v.fd_client,
        v.fd_server,
        v.mode.unwrap_or("-"),
        v.promoted
            .map(|d| format!(" promoted={}ms", d.as_millis()))
            .unwrap_or_default(),
    );
    out.extend_from_slice(line.as_bytes());
}

// ---------------------------------------------------------------- activity, profiling

/// `show activity` fields that shunt has no notion of; each prints 0 on every thread:
/// - `wake_signal`: signals are handled by a task on one worker, as reactor I/O;
/// - `poll_exp`: tokio owns the timer wheel, and a timer that fires is not told
///   apart from I/O readiness (such wakes are in `poll_io`);
/// - `poll_drop_fd`, `poll_skip_fd`, `conn_dead`: no fd table shared between threads;
/// - `pool_fail`, `buf_wait`: no buffer pools (the kernel moves the bytes);
/// - `accq_pushed`, `accq_full`, `accq_ring`: every worker accepts on its own
///   SO_REUSEPORT listener, so there is no accept queue between threads;
fn activity_zero(_: &crate::scheduler::ThreadStats) -> u64 {
    0
}

/// One `show activity` field: its name and how a worker's snapshot gives its value.
type ActivityField = (&'static str, fn(&crate::scheduler::ThreadStats) -> u64);

/// The `show activity` lines of HAProxy 2.6, in order (after `thread_id` and
/// `date_now`); `avg_loop_us` is the one averaged rather than summed.
const ACTIVITY_FIELDS: [ActivityField; 24] = [
    // Every run: tasks and remote jobs (HAProxy: tasks and tasklets).
    ("ctxsw", |s| s.run.iter().sum()),
    // Task runs only (remote jobs are one-shot callbacks, like tasklets).
    ("tasksw", |s| {
        s.run.iter().sum::<u64>().saturating_sub(s.remote_jobs)
    }),
    ("empty_rq", |s| s.empty_rq),
    ("long_rq", |s| s.long_rq),
    // One per pass: a loop that ran tasks or one that parked.
    ("loops", |s| s.loops + s.empty_rq),
    ("wake_tasks", |s| s.wake_tasks),
    ("wake_signal", activity_zero),
    ("poll_io", |s| s.poll_io),
    ("poll_exp", activity_zero),
    ("poll_drop_fd", activity_zero),
    ("poll_skip_fd", activity_zero),
    ("conn_dead", activity_zero),
    ("stream_calls", |s| s.stream_calls),
    ("pool_fail", activity_zero),
    ("buf_wait", activity_zero),
    ("cpust_ms_tot", |s| s.cpust_ns / 1_000_000),
    ("cpust_ms_1s", |s| s.cpust_1s_ns / 1_000_000),
    ("cpust_ms_15s", |s| s.cpust_15s_ns / 1_000_000),
    ("avg_loop_us", |s| s.avg_loop_us()),
    ("accepted", |s| s.accepted),
    ("accq_pushed", activity_zero),
    ("accq_full", activity_zero),
    ("accq_ring", activity_zero),
    // Warm spares taken from a sibling thread's pool (`crate::pool`).
    ("fd_takeover", |s| s.fd_takeover),
];

/// `show activity`: `thread_id: T (1..N)`, `date_now: SECS.USECS`, then one line per
/// field, `name: total [ t1 t2 ... ]` (just `name: total` with one thread). `tid` is
/// the 0-based worker serving the CLI; `threads` are the workers' snapshots in order.
pub fn show_activity(
    tid: usize,
    now: std::time::SystemTime,
    threads: &[crate::scheduler::ThreadStats],
) -> String {
    let n = threads.len();
    let date = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(out, "thread_id: {} (1..{})", tid + 1, n);
    let _ = writeln!(
        out,
        "date_now: {}.{:06}",
        date.as_secs(),
        date.subsec_micros()
    );
    for (name, get) in ACTIVITY_FIELDS {
        let vals: Vec<u64> = threads.iter().map(get).collect();
        let sum: u64 = vals.iter().sum();
        let total = if name == "avg_loop_us" && n > 0 {
            (sum + n as u64 / 2) / n as u64
        } else {
            sum
        };
        let _ = write!(out, "{name}: {total}");
        if n > 1 {
            out.push_str(" [");
            for v in &vals {
                let _ = write!(out, " {v}");
            }
            out.push_str(" ]");
        }
        out.push('\n');
    }
    out
}

/// HAProxy's 7-character duration (`print_time_short`): four significant digits and
/// a unit (`726.0ns`, `2.096us`, `4.687ms`, `42.03s `, `4.265m `, `4.736h `), zero as
/// `   -   `. The unit is chosen before rounding, so 999.96 ns prints `1000.ns`.
pub fn time_short(ns: u64) -> String {
    const UNITS: [(u64, &str); 7] = [
        (86_400_000_000_000, "d "),
        (3_600_000_000_000, "h "),
        (60_000_000_000, "m "),
        (1_000_000_000, "s "),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    let Some(&(div, unit)) = UNITS.iter().find(|(div, _)| ns >= *div) else {
        return "   -   ".to_string();
    };
    let v = ns as f64 / div as f64;
    let int_digits = if v >= 1000.0 {
        4
    } else if v >= 100.0 {
        3
    } else if v >= 10.0 {
        2
    } else {
        1
    };
    let mut decimals: usize = 4 - int_digits;
    let mut digits = format!("{v:.decimals$}");
    // Rounding may add an integer digit (9.9996 -> "10.000"): keep four.
    if digits.len() > 5 && decimals > 0 {
        decimals -= 1;
        digits = format!("{v:.decimals$}");
    }
    if decimals == 0 {
        // C's `%#.4g` keeps the point.
        digits.push('.');
    }
    format!("{digits}{unit}")
}

/// Which parts `show profiling` prints (HAProxy's `all`, `status`, `tasks`, `memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProfilingPart {
    #[default]
    All,
    Status,
    Tasks,
    /// shunt has no memory profiling: nothing is printed for it.
    Memory,
}

/// `show profiling`: the status lines, then the per-task table merged over the
/// workers (calls, cpu_tot, cpu_avg, lat_tot, lat_avg), most called first (or by
/// name with `byaddr`: shunt's tasks have names, not addresses), at most
/// `max_lines` rows.
pub fn show_profiling(
    status: &str,
    part: ProfilingPart,
    max_lines: Option<usize>,
    by_name: bool,
    threads: &[crate::scheduler::ThreadStats],
) -> String {
    let mut out = String::new();
    if matches!(part, ProfilingPart::All | ProfilingPart::Status) {
        let _ = writeln!(
            out,
            "Per-task CPU profiling              : {status:<8}      # set profiling tasks {{on|auto|off}}"
        );
        let _ = writeln!(
            out,
            "Memory usage profiling              : {:<8}      # set profiling memory {{on|off}}",
            "off"
        );
    }
    if !matches!(part, ProfilingPart::All | ProfilingPart::Tasks) {
        return out;
    }
    let mut rows: Vec<crate::scheduler::TaskProfile> = Vec::new();
    for p in threads.iter().flat_map(|t| &t.profiling) {
        match rows.iter_mut().find(|r| r.name == p.name) {
            Some(r) => {
                r.calls += p.calls;
                r.cpu_ns = r.cpu_ns.saturating_add(p.cpu_ns);
                r.lat_ns = r.lat_ns.saturating_add(p.lat_ns);
            }
            None => rows.push(p.clone()),
        }
    }
    rows.retain(|r| r.calls > 0);
    if by_name {
        rows.sort_by(|a, b| a.name.cmp(b.name));
    } else {
        rows.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.name.cmp(b.name)));
    }
    rows.truncate(max_lines.unwrap_or(usize::MAX));
    out.push_str("Tasks activity:\n");
    out.push_str("  function                      calls   cpu_tot   cpu_avg   lat_tot   lat_avg\n");
    for r in rows {
        // Name and calls share 35 columns (at least one space between them).
        let width = PROFILING_NAME_CALLS_WIDTH
            .saturating_sub(r.name.len())
            .max(1);
        let _ = write!(out, "  {}{:>width$}", r.name, r.calls);
        for t in [r.cpu_ns, r.cpu_ns / r.calls, r.lat_ns, r.lat_ns / r.calls] {
            let _ = write!(out, "   {}", time_short(t));
        }
        out.push('\n');
    }
    out
}

/// Columns a `show profiling` row gives the task name and its call count.
const PROFILING_NAME_CALLS_WIDTH: usize = 35;

#[cfg(test)]
mod tests {
    use super::*;

    /// The header of `show stat` in shared/reference/haproxy-2.6-cli/02-show-stat-full.txt.
    const REFERENCE_HEADER: &str = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,weight,act,bck,chkfail,chkdown,lastchg,downtime,qlimit,pid,iid,sid,throttle,lbtot,tracked,type,rate,rate_lim,rate_max,check_status,check_code,check_duration,hrsp_1xx,hrsp_2xx,hrsp_3xx,hrsp_4xx,hrsp_5xx,hrsp_other,hanafail,req_rate,req_rate_max,req_tot,cli_abrt,srv_abrt,comp_in,comp_out,comp_byp,comp_rsp,lastsess,last_chk,last_agt,qtime,ctime,rtime,ttime,agent_status,agent_code,agent_duration,check_desc,agent_desc,check_rise,check_fall,check_health,agent_rise,agent_fall,agent_health,addr,cookie,mode,algo,conn_rate,conn_rate_max,conn_tot,intercepted,dcon,dses,wrew,connect,reuse,cache_lookups,cache_hits,srv_icur,src_ilim,qtime_max,ctime_max,rtime_max,ttime_max,eint,idle_conn_cur,safe_conn_cur,used_conn_cur,need_conn_est,uweight,agg_server_status,agg_server_check_status,agg_check_status,-,ssl_sess,ssl_reused_sess,ssl_failed_handshake,h2_headers_rcvd,h2_data_rcvd,h2_settings_rcvd,h2_rst_stream_rcvd,h2_goaway_rcvd,h2_detected_conn_protocol_errors,h2_detected_strm_protocol_errors,h2_rst_stream_resp,h2_goaway_resp,h2_open_connections,h2_backend_open_streams,h2_total_connections,h2_backend_total_streams,h1_open_connections,h1_open_streams,h1_total_connections,h1_total_streams,h1_bytes_in,h1_bytes_out,h1_spliced_bytes_in,h1_spliced_bytes_out,\n";

    /// HAProxy's header, then shunt's own columns.
    fn with_shunt_columns(haproxy: &str) -> String {
        format!(
            "{}{},\n",
            haproxy.trim_end_matches('\n'),
            SHUNT_STAT_FIELDS.join(",")
        )
    }

    #[test]
    fn stat_header_is_haproxy_26_byte_for_byte() {
        assert_eq!(stat_header(), with_shunt_columns(REFERENCE_HEADER));
        assert!(stat_header()
            .ends_with(",h1_spliced_bytes_out,warm_hit,warm_miss,warm_dead,warm_purged,\n"));
    }

    #[test]
    fn stat_header_matches_the_reference_transcript() {
        // A copy of shared/reference/haproxy-2.6-cli/02-show-stat-full.txt,
        // kept in the repository so the check runs everywhere.
        let text = include_str!("testdata/02-show-stat-full.txt");
        let line = text
            .lines()
            .find(|l| l.starts_with("# pxname"))
            .expect("transcript has a header");
        assert_eq!(stat_header(), with_shunt_columns(&format!("{line}\n")));
    }

    #[test]
    fn columns_indices_match_names() {
        assert_eq!(STAT_FIELDS[col::ADDR], "addr");
        assert_eq!(STAT_FIELDS[col::UWEIGHT], "uweight");
        assert_eq!(STAT_FIELDS[col::DASH], "-");
        assert_eq!(STAT_FIELDS[col::LBTOT], "lbtot");
        assert_eq!(STAT_FIELDS[col::DCON], "dcon");
        assert_eq!(STAT_FIELDS[col::CHECK_HEALTH], "check_health");
        assert_eq!(STAT_FIELDS[col::ALGO], "algo");
        assert_eq!(STAT_FIELDS[col::CONNECT], "connect");
        assert_eq!(STAT_FIELDS[col::NEED_CONN_EST], "need_conn_est");
    }

    #[test]
    fn uptime_format() {
        assert_eq!(format_uptime(6), "0d 0h00m06s");
        assert_eq!(format_uptime(90_061), "1d 1h01m01s");
    }

    #[test]
    fn help_lines_are_haproxy_shaped() {
        let h = help(&[]);
        assert!(h.starts_with("The following commands are valid at this level:\n"));
        assert!(h.contains(
            "  help [<command>]                        : list matching or all commands\n"
        ));
        assert!(h.ends_with("  quit                                    : disconnect\n"));
        let u = unknown(&["admin".to_string()]);
        assert!(u.starts_with(
            "Unknown command, but maybe one of the following ones is a better match:\n"
        ));
        assert!(u.contains(
            "  prompt                                  : toggle interactive mode with prompt\n"
        ));
        // `show stat` for a typo of it is among the proposals.
        assert!(unknown(&["show".into(), "stats".into()]).contains("  show stat "));
    }

    #[test]
    fn human_time_keeps_two_units() {
        assert_eq!(super::human_time(0), "0s");
        assert_eq!(super::human_time(59), "59s");
        assert_eq!(super::human_time(125), "2m5s");
        assert_eq!(super::human_time(3_600), "1h");
        assert_eq!(super::human_time(90_061), "1d1h");
    }
}

#[cfg(test)]
mod activity_tests {
    use super::*;
    use crate::scheduler::{TaskProfile, ThreadStats};

    #[test]
    fn time_short_matches_haproxy_transcripts() {
        // Values printed in 09-profiling.txt and the issue.
        for (ns, want) in [
            (726, "726.0ns"),
            (571, "571.0ns"),
            (952, "952.0ns"),
            (1_082, "1.082us"),
            (2_096, "2.096us"),
            (11_280, "11.28us"),
            (36_930, "36.93us"),
            (12_310, "12.31us"),
            (4_687_000, "4.687ms"),
            (2_359_450, "2.359ms"),
            (42_030_000_000, "42.03s "),
            (255_900_000_000, "4.265m "),
            (17_049_600_000_000, "4.736h "),
            (0, "   -   "),
        ] {
            assert_eq!(time_short(ns), want, "{ns} ns");
        }
        // Always seven characters, also where rounding adds a digit.
        assert_eq!(time_short(1), "1.000ns");
        assert_eq!(time_short(9_999_600), "10.00ms");
        assert_eq!(time_short(999_960_000_000), "16.67m ");
        assert_eq!(time_short(999), "999.0ns");
        for ns in [
            1,
            9,
            10,
            99,
            999,
            1_000,
            59_999_999_999,
            3_599_999_999_999,
            u64::MAX / 1000,
        ] {
            assert_eq!(time_short(ns).len(), 7, "{ns}: {:?}", time_short(ns));
        }
    }

    fn thread(id: usize, loops: u64, prof: &[(&'static str, u64, u64, u64)]) -> ThreadStats {
        ThreadStats {
            thread_id: id,
            loops,
            empty_rq: 2,
            run: [10, 5, 1, 0],
            remote_jobs: 3,
            accepted: id as u64 + 1,
            loop_us_sum: (20 + id as u64) * crate::scheduler::LOOP_AVG_SAMPLES,
            profiling: prof
                .iter()
                .map(|&(name, calls, cpu_ns, lat_ns)| TaskProfile {
                    name,
                    calls,
                    cpu_ns,
                    lat_ns,
                })
                .collect(),
            ..ThreadStats::default()
        }
    }

    #[test]
    fn show_activity_lines_are_haproxy_shaped() {
        let now = UNIX_EPOCH + std::time::Duration::from_micros(1_795_996_278_084_923);
        let out = show_activity(0, now, &[thread(0, 100, &[]), thread(1, 60, &[])]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "thread_id: 1 (1..2)");
        assert_eq!(lines[1], "date_now: 1795996278.084923");
        assert_eq!(lines[2], "ctxsw: 32 [ 16 16 ]");
        assert_eq!(lines[3], "tasksw: 26 [ 13 13 ]");
        assert_eq!(lines[6], "loops: 164 [ 102 62 ]");
        assert!(out.contains("\navg_loop_us: 21 [ 20 21 ]\n"), "{out}");
        assert!(out.contains("\naccepted: 3 [ 1 2 ]\n"));
        assert!(out.ends_with("fd_takeover: 0 [ 0 0 ]\n"));
        assert_eq!(lines.len(), 2 + ACTIVITY_FIELDS.len());
        // The field order of HAProxy 2.6 (08-show-activity.txt).
        let names: Vec<&str> = lines
            .iter()
            .map(|l| l.split(':').next().unwrap_or(""))
            .collect();
        assert_eq!(
            names[2..].join(" "),
            "ctxsw tasksw empty_rq long_rq loops wake_tasks wake_signal poll_io poll_exp \
             poll_drop_fd poll_skip_fd conn_dead stream_calls pool_fail buf_wait cpust_ms_tot \
             cpust_ms_1s cpust_ms_15s avg_loop_us accepted accq_pushed accq_full accq_ring \
             fd_takeover"
        );
        // One thread: no per-thread list.
        let one = show_activity(0, now, &[thread(0, 7, &[])]);
        assert!(one.contains("\nloops: 9\n"), "{one}");
    }

    #[test]
    fn show_profiling_merges_threads_and_sorts_by_calls() {
        let t0 = thread(
            0,
            1,
            &[("accept", 2, 21_920, 4_718_900), ("cli", 1, 0, 1_934)],
        );
        let t1 = thread(1, 1, &[("accept", 0, 0, 0), ("session", 3, 36_930, 2_856)]);
        let out = show_profiling("auto-off", ProfilingPart::All, None, false, &[t0, t1]);
        assert_eq!(
            out,
            "Per-task CPU profiling              : auto-off      # set profiling tasks {on|auto|off}\n\
             Memory usage profiling              : off           # set profiling memory {on|off}\n\
             Tasks activity:\n\
             \x20 function                      calls   cpu_tot   cpu_avg   lat_tot   lat_avg\n\
             \x20 session                           3   36.93us   12.31us   2.856us   952.0ns\n\
             \x20 accept                            2   21.92us   10.96us   4.719ms   2.359ms\n\
             \x20 cli                               1      -         -      1.934us   1.934us\n"
        );
        let tasks = show_profiling("on", ProfilingPart::Tasks, Some(1), false, &[]);
        assert!(tasks.starts_with("Tasks activity:\n"));
        let status = show_profiling("on", ProfilingPart::Status, None, false, &[]);
        assert_eq!(status.lines().count(), 2);
        assert!(status.starts_with("Per-task CPU profiling              : on            #"));
        assert_eq!(
            show_profiling("on", ProfilingPart::Memory, None, false, &[]),
            ""
        );
    }
}

/// `# table: NAME, type: ip, size:N, used:M` (`show table`), HAProxy's line.
pub fn table_header(out: &mut String, spec: &crate::config::TableSpec, used: usize) {
    use std::fmt::Write;
    let _ = writeln!(
        out,
        "# table: {}, type: {}, size:{}, used:{used}",
        spec.name,
        spec.key.name(),
        spec.size
    );
}

/// One `show table` entry, HAProxy 2.6's format: `0xID: key=K use=N exp=MS`
/// then each stored type in HAProxy's order, rates with their period
/// (`conn_rate(10000)=3`), `server_key=-` when no server was stored.
pub fn table_entry(
    out: &mut String,
    spec: &crate::config::TableSpec,
    e: &crate::stick::EntryView,
    now: u32,
) {
    use crate::config::DataType;
    use std::fmt::Write;
    let _ = write!(
        out,
        "0x{:x}: key={} use={} exp={}",
        e.id, e.key, e.refs, e.exp
    );
    for t in spec.store.types() {
        match t {
            DataType::ServerKey => {
                let _ = write!(
                    out,
                    " server_key={}",
                    e.data.server_key.as_deref().unwrap_or("-")
                );
            }
            DataType::ServerId => {
                let _ = write!(out, " server_id={}", e.data.server_id);
            }
            t if t.is_rate() => {
                let v = e.data.value(t, &spec.store, now).unwrap_or(0);
                let _ = write!(out, " {}({})={v}", t.name(), spec.store.period(t));
            }
            t => {
                let v = e.data.value(t, &spec.store, now).unwrap_or(0);
                let _ = write!(out, " {}={v}", t.name());
            }
        }
    }
    out.push('\n');
}
