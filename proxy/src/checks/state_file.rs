//! HAProxy's server-state file: `show servers state` saved by the operator (e.g.
//! before a restart), read once at start by the backends that say
//! `load-server-state-from-file global`, to restore what the CLI and the checks
//! changed: operational state, admin state (maintenance, drain), user weight,
//! address and port, disabled checks, check and agent ports/addresses.
//!
//! Owns the file's parsing ([`parse`]) and its application ([`apply`]), with
//! HAProxy 2.6's rules (`server_state.c`):
//! - the first line is the format version (`1`); a missing or bad version, or a
//!   line with fewer than 20 or more than 25 fields, makes the whole file ignored
//!   (`corrupted global server state file`);
//! - lines are matched by backend and server *names*; a duplicate is dropped;
//! - a line with a bad value is not applied at all (`server-state application
//!   failed for server 'b/s', invalid srv_... value '...'`);
//! - the configuration wins over the file when they disagree about `disabled`
//!   (CMAINT) and about the configured weight (the user weight is restored only
//!   when the file's `srv_iweight` equals the configured one).
//!
//! One deviation: HAProxy 2.6 restores the address only for servers named by a
//! host name (its `init-addr last`); shunt has no resolver, so it restores the
//! address and port of every server: an address changed with `set server addr`
//! survives a restart.
//!
//! Must not: run once workers forward (it is called before they start; the state
//! it sets is then what the first checks and flows see).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use super::transition::{self, Cause, Site};
use crate::lb::{AdminState, Change, OpState, MAX_WEIGHT};
use crate::runtime::Runtime;

/// The one format version HAProxy 2.6 writes and reads.
pub const VERSION: u32 = 1;
/// Fields of a version-1 line: the 20 of HAProxy 1.8, up to the 25 of 2.6.
pub const MIN_FIELDS: usize = 20;
pub const MAX_FIELDS: usize = 25;
/// Longest line read (HAProxy's SRV_STATE_LINE_MAXLEN).
pub const MAX_LINE: usize = 512;
/// Largest file read: bounds start-up memory for a file that is not one.
pub const MAX_FILE: u64 = 64 * 1024 * 1024;
/// The reason logged for a state change the file makes.
pub const FROM_FILE: &str = "changed from server-state after a reload";

// HAProxy's values (`srv_op_state`, `srv_admin_state` bits, `srv_check_state` bits).
const SRV_ST_STOPPED: i64 = 0;
const SRV_ST_STARTING: i64 = 1;
const SRV_ST_RUNNING: i64 = 2;
const SRV_ST_STOPPING: i64 = 3;
const ADMF_FMAINT: i64 = 0x01;
const ADMF_IMAINT: i64 = 0x02;
const ADMF_CMAINT: i64 = 0x04;
const ADMF_FDRAIN: i64 = 0x08;
const ADMF_IDRAIN: i64 = 0x10;
const ADMF_RMAINT: i64 = 0x20;
const ADMF_HMAINT: i64 = 0x40;
const CHK_ST_CONFIGURED: i64 = 0x02;
const CHK_ST_ENABLED: i64 = 0x04;
const CHK_ST_ALL: i64 = 0x1f;
const CHK_ST_PAUSED: i64 = 0x08;
/// Check status code before the first check (HCHK_STATUS_INI); the others come
/// from `lb::status::Status::code`.
const HCHK_STATUS_INI: i64 = 1;
/// Check results (CHK_RES_*).
const CHK_RES_UNKNOWN: i64 = 0;
const CHK_RES_NEUTRAL: i64 = 1;
const CHK_RES_FAILED: i64 = 2;
const CHK_RES_PASSED: i64 = 3;

/// The format's header (version 1, HAProxy 2.6's 25 columns): what `show
/// servers state` prints and the file this module reads starts with.
pub const HEADER: &str = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n";

/// `show servers state` for the backends at `bis` (config indexes): the
/// format this module's loader reads back (HAProxy's `server-state-file`).
pub fn render(state: &Runtime, bis: &[usize]) -> String {
    use std::fmt::Write;
    let mut out = String::from(HEADER);
    let uptime = state.facts.uptime_secs();
    for &bi in bis {
        let be = &state.config.backends[bi];
        for (si, cfg) in be.servers.iter().enumerate() {
            let rt = &state.backends[bi].servers[si];
            let n = rt.admin_note();
            let maint = rt.is_maint();
            let running = !maint && rt.is_up();
            let mut admin = 0;
            if maint {
                // Never touched by the CLI: still the configuration's `disabled`.
                admin |= if cfg.disabled && n.changed.is_none() {
                    ADMF_FMAINT | ADMF_CMAINT
                } else {
                    ADMF_FMAINT
                };
            }
            if n.drain_weight.is_some() {
                admin |= ADMF_FDRAIN;
            }
            let rise = cfg.check.rise.unwrap_or(crate::lb::status::DEFAULT_RISE);
            let (status, result, health, state) = if cfg.check.enabled {
                let mut state = CHK_ST_CONFIGURED;
                if rt.checked() {
                    state |= CHK_ST_ENABLED;
                }
                if maint {
                    state |= CHK_ST_PAUSED;
                }
                let (status, result) = match rt.check_report().status {
                    None => (HCHK_STATUS_INI, CHK_RES_UNKNOWN),
                    Some(st) => (
                        i64::from(st.code()),
                        match st.passed() {
                            Some(true) => CHK_RES_PASSED,
                            Some(false) => CHK_RES_FAILED,
                            None => CHK_RES_NEUTRAL,
                        },
                    ),
                };
                // Maintenance resets the health, as HAProxy does.
                (
                    status,
                    result,
                    if maint { 0 } else { i64::from(rt.health()) },
                    state,
                )
            } else {
                let state = if admin & ADMF_CMAINT != 0 {
                    CHK_ST_PAUSED
                } else {
                    0
                };
                (
                    HCHK_STATUS_INI,
                    0,
                    if running { i64::from(rise) } else { 0 },
                    state,
                )
            };
            let since = match n.changed {
                Some(t) => t.elapsed().as_secs(),
                None if cfg.check.enabled || cfg.check.agent_check => {
                    rt.check_report().last_change.elapsed().as_secs()
                }
                None => uptime,
            };
            let _ = writeln!(
                out,
                "{} {} {} {} {} {} {} {} {} {} {} {} {} {} 0 0 0 - {} - 0 {} - - 0",
                be.id,
                be.name,
                cfg.id,
                cfg.name,
                rt.addr().ip(),
                if running && rt.is_stopping() {
                    SRV_ST_STOPPING
                } else if running {
                    SRV_ST_RUNNING
                } else {
                    SRV_ST_STOPPED
                },
                admin,
                n.drain_weight.unwrap_or_else(|| rt.weight()),
                rt.initial_weight(),
                since,
                status,
                result,
                health,
                state,
                rt.addr().port(),
                rt.probe_targets().check_port.unwrap_or(0),
            );
        }
    }
    out
}

/// Why the file as a whole is ignored.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FileError {
    #[error("config: Can't open global server state file '{path}': {reason}")]
    Open { path: String, reason: String },
    #[error("config: Can't get version of the global server state file '{path}'.")]
    Version { path: String },
    #[error("config: corrupted global server state file '{path}' at line {line}.")]
    Corrupted { path: String, line: usize },
}

/// The fields of one server line, by name (`be_name srv_name` → the 21 fields
/// after the server name, missing optional ones as `None`).
pub type Lines = HashMap<(String, String), Vec<String>>;

/// Parse the file's text. `path` is only for the messages.
pub fn parse(text: &str, path: &str) -> Result<Lines, FileError> {
    let mut it = text.split_inclusive('\n');
    let version = it
        .next()
        .and_then(|l| l.strip_suffix('\n'))
        .and_then(|l| l.parse::<u32>().ok());
    if version != Some(VERSION) {
        return Err(FileError::Version {
            path: path.to_string(),
        });
    }
    let mut out = Lines::new();
    for (n, raw) in it.enumerate() {
        let corrupted = || FileError::Corrupted {
            path: path.to_string(),
            line: n + 1,
        };
        // A truncated line (no line end, or longer than HAProxy reads) is corruption.
        let Some(line) = raw.strip_suffix('\n') else {
            return Err(corrupted());
        };
        if raw.len() >= MAX_LINE {
            return Err(corrupted());
        }
        let body = line.trim_start_matches([' ', '\t']);
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = body.split([' ', '\t']).filter(|f| !f.is_empty()).collect();
        if !(MIN_FIELDS..=MAX_FIELDS).contains(&fields.len()) {
            return Err(corrupted());
        }
        let key = (fields[1].to_string(), fields[3].to_string());
        // A duplicate (a hand-made file) is dropped: the first line stays.
        out.entry(key)
            .or_insert_with(|| fields[4..].iter().map(|f| f.to_string()).collect());
    }
    Ok(out)
}

/// C `strtol` base 10 of a whole field: `None` when it has no digits.
fn num(f: &str) -> Option<i64> {
    let (neg, d) = match f.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, f.strip_prefix('+').unwrap_or(f)),
    };
    let n = d.bytes().take_while(u8::is_ascii_digit).count();
    if n == 0 {
        return None;
    }
    let v: i64 = d[..n].parse().ok()?;
    Some(if neg { -v } else { v })
}

/// What one line asks for, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub addr: Option<IpAddr>,
    pub op_state: i64,
    pub admin: i64,
    pub uweight: u32,
    pub iweight: u32,
    pub health: i64,
    pub check_state: i64,
    pub agent_state: i64,
    pub port: Option<u16>,
    pub check_port: Option<u16>,
    pub check_addr: Option<IpAddr>,
    pub agent_addr: Option<IpAddr>,
    pub agent_port: Option<u16>,
}

/// Validate the fields of one line (those after the server name); `Err` lists the
/// bad values in HAProxy's words (`, invalid srv_op_state value 'x'`...).
pub fn validate(p: &[String]) -> Result<Saved, String> {
    let mut msg = String::new();
    let get = |i: usize| p.get(i).map(String::as_str);
    let mut field = |i: usize, name: &str, ok: &dyn Fn(i64) -> bool| -> i64 {
        match get(i).and_then(num) {
            Some(v) if ok(v) => v,
            _ => {
                msg.push_str(&format!(
                    ", invalid {name} value '{}'",
                    get(i).unwrap_or("")
                ));
                0
            }
        }
    };
    let op_state = field(1, "srv_op_state", &|v| (0..=3).contains(&v));
    // Inherited and resolver-made states are recomputed, not restored.
    let admin = field(2, "srv_admin_state", &|v| {
        let v = v & !(ADMF_IDRAIN | ADMF_IMAINT | ADMF_HMAINT | ADMF_RMAINT);
        [
            0,
            ADMF_FMAINT,
            ADMF_CMAINT,
            ADMF_CMAINT | ADMF_FMAINT,
            ADMF_CMAINT | ADMF_FDRAIN,
            ADMF_FDRAIN,
        ]
        .contains(&v)
    }) & !(ADMF_IDRAIN | ADMF_IMAINT | ADMF_HMAINT | ADMF_RMAINT);
    let wok = |v: i64| (0..=i64::from(MAX_WEIGHT)).contains(&v);
    let uweight = field(3, "srv_uweight", &wok);
    let iweight = field(4, "srv_iweight", &wok);
    field(5, "srv_last_time_change", &|_| true);
    field(6, "srv_check_status", &|v| (0..32).contains(&v));
    field(7, "srv_check_result", &|v| (0..=4).contains(&v));
    let health = field(8, "srv_check_health", &|_| true);
    let check_state = field(9, "srv_check_state", &|v| v & !CHK_ST_ALL == 0);
    let agent_state = field(10, "srv_agent_state", &|v| v & !CHK_ST_ALL == 0);
    field(11, "bk_f_forced_id", &|v| v == 0 || v == 1);
    field(12, "srv_f_forced_id", &|v| v == 0 || v == 1);
    let port = match get(14) {
        None => None,
        Some(w) => match w.parse::<u32>() {
            Ok(n) => match u16::try_from(n) {
                Ok(0) => None,
                Ok(n) => Some(n),
                Err(_) => {
                    msg.push_str(&format!(", invalid srv_port value '{w}'"));
                    None
                }
            },
            // HAProxy's strl2uic reads a non-number as 0: no port change.
            Err(_) => None,
        },
    };
    if !msg.is_empty() {
        return Err(msg);
    }
    let ip = |i: usize| get(i).filter(|a| *a != "-").and_then(|a| a.parse().ok());
    let opt_port = |i: usize| {
        get(i)
            .filter(|w| *w != "0")
            .and_then(|w| w.parse::<u16>().ok())
    };
    let w = |v: i64| u32::try_from(v).unwrap_or(0);
    Ok(Saved {
        addr: ip(0),
        op_state,
        admin,
        uweight: w(uweight),
        iweight: w(iweight),
        health,
        check_state,
        agent_state,
        port,
        check_port: opt_port(17),
        check_addr: ip(18),
        agent_addr: ip(19),
        agent_port: opt_port(20),
    })
}

/// Read the configured file and apply it to the backends that load it. Problems
/// are logged as HAProxy words them; none stops the start.
pub fn load(state: &Runtime) {
    let ss = &state.config.global.server_state;
    let Some(path) = ss.path() else {
        return;
    };
    if ss.backends.is_empty() {
        return;
    }
    match read(&path).and_then(|text| parse(&text, &path.display().to_string())) {
        Ok(lines) => {
            let n = apply(state, &lines);
            tracing::info!(file = %path.display(), servers = n, "server state loaded");
        }
        Err(e) => tracing::warn!("{e}"),
    }
}

fn read(path: &Path) -> Result<String, FileError> {
    use std::io::Read;
    let open_err = |e: std::io::Error| FileError::Open {
        path: path.display().to_string(),
        reason: super::os_reason(&e),
    };
    let f = std::fs::File::open(path).map_err(open_err)?;
    let mut text = String::new();
    f.take(MAX_FILE)
        .read_to_string(&mut text)
        .map_err(open_err)?;
    Ok(text)
}

/// Apply `lines` to the servers of the backends that load the file; returns how
/// many servers had a line applied.
pub fn apply(state: &Runtime, lines: &Lines) -> usize {
    let cfg = &state.config;
    let mut applied = 0;
    for (bi, be) in cfg.backends.iter().enumerate() {
        if !cfg.global.server_state.backends.contains(&be.name) {
            continue;
        }
        for (si, srv) in be.servers.iter().enumerate() {
            let Some(p) = lines.get(&(be.name.clone(), srv.name.clone())) else {
                continue;
            };
            match validate(p) {
                Ok(saved) => {
                    apply_one(state, bi, si, &saved);
                    applied += 1;
                }
                Err(msg) => tracing::warn!(
                    "server-state application failed for server '{}/{}'{msg}",
                    be.name,
                    srv.name
                ),
            }
        }
    }
    applied
}

/// Apply one validated line to server `si` of backend `bi`.
fn apply_one(state: &Runtime, bi: usize, si: usize, v: &Saved) {
    let site = Site { state, bi, si };
    let rt = site.server();
    let cfg_srv = &state.config.backends[bi].servers[si];
    let (rise, fall) = (rt.rise(), rt.fall());
    let full = rise + fall - 1;
    let cause = Cause::Reason(FROM_FILE);

    // Address first: the state changes below may log it.
    let mut addr: SocketAddr = rt.addr();
    if let Some(ip) = v.addr {
        addr.set_ip(ip);
    }
    if let Some(port) = v.port {
        addr.set_port(port);
    }
    if addr != rt.addr() {
        rt.set_addr(addr);
    }

    // Operational state (HAProxy keeps no STARTING without slowstart: as RUNNING).
    // A server the configuration puts in maintenance keeps its state (HAProxy
    // ignores forced changes in maintenance).
    let op_state = if rt.is_maint() { -1 } else { v.op_state };
    let forced = match op_state {
        SRV_ST_STOPPED => Some((0, OpState::Down)),
        SRV_ST_STOPPING if fall == 1 => Some((0, OpState::Down)),
        SRV_ST_STOPPING => {
            let h = u32::try_from(v.health).unwrap_or(0);
            let h = if h < rise || h > full.saturating_sub(1) {
                rise
            } else {
                h
            };
            Some((h, OpState::Stopping))
        }
        SRV_ST_RUNNING | SRV_ST_STARTING => Some((full, OpState::Up)),
        _ => None,
    };
    if let Some((health, to)) = forced {
        transition::apply(&site, Change::Force { health, to }, &cause);
    }

    // The user weight, when the configured weight did not change.
    if v.iweight == rt.initial_weight() {
        transition::apply(&site, Change::Weight(v.uweight), &cause);
    }

    // Admin state: the configuration's `disabled` wins when they disagree.
    let cmaint = cfg_srv.disabled;
    let file_cmaint = v.admin & ADMF_CMAINT != 0;
    let set = |st| super::set_admin(state, bi, si, st);
    if file_cmaint != cmaint {
        set(if cmaint {
            AdminState::Maint
        } else {
            AdminState::Ready
        });
    } else if v.admin & ADMF_FMAINT != 0 && !cmaint {
        set(AdminState::Maint);
    } else if v.admin & ADMF_FMAINT == 0 && cmaint {
        set(AdminState::Ready);
    }
    // Drain, unless it came from a zero configured weight that is no longer zero.
    if !rt.is_maint() && v.admin & ADMF_FDRAIN != 0 && (v.iweight > 0 || rt.initial_weight() == 0) {
        set(AdminState::Drain);
    }

    // Checks disabled on the CLI stay disabled.
    let disabled = |st: i64| st & CHK_ST_CONFIGURED != 0 && st & CHK_ST_ENABLED == 0;
    if rt.check_configured() && disabled(v.check_state) {
        rt.set_check_enabled(false);
    }
    if rt.agent_configured() && disabled(v.agent_state) {
        rt.set_agent_enabled(false);
    }
    // Check and agent targets (applied only to enabled checks, as HAProxy).
    rt.update_probe_targets(|t| {
        if rt.checked() {
            t.check_addr = v.check_addr.or(t.check_addr);
            t.check_port = v.check_port.or(t.check_port);
        }
        if rt.agent_enabled() {
            t.agent_addr = v.agent_addr.or(t.agent_addr);
            t.agent_port = v.agent_port.or(t.agent_port);
        }
    });
}
