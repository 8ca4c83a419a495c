//! The `global` section: its draft and its keyword table.
//!
//! Owns every global keyword but the `stats` family ([`super::stats_socket`])
//! and the syntax of a log target ([`super::log`]), which its entries call.

use super::model::*;
use super::units::parse_size;
use super::{
    bounded, dispatch, first_words, int_arg, no_extra, section_names, stats_socket, suggest,
    time_arg, with_hint, Args, Keyword, Line, Scope, Sections, MAX_MAXCONN,
};

/// HAProxy's MAX_THREADS on 64-bit builds.
pub const MAX_NBTHREAD: usize = 64;
/// Smallest useful pipe: one page, the kernel's own minimum.
pub const MIN_PIPESIZE: u64 = 4096;
/// Largest `tune.pipesize` accepted (the kernel may still refuse beyond
/// /proc/sys/fs/pipe-max-size for unprivileged processes).
pub const MAX_PIPESIZE: u64 = 256 << 20;
/// Bounds of `tune.sockmap.max-inflight`: below 256 KiB a bulk flow would
/// pause on every burst; above 1 GiB the bound no longer protects memory.
const MIN_SOCKMAP_INFLIGHT: u64 = 256 << 10;
const MAX_SOCKMAP_INFLIGHT: u64 = 1 << 30;

/// The global section as parsed.
#[derive(Debug, Default)]
pub struct GlobalDraft {
    pub global: Global,
    /// `maxpipes` was given (otherwise validation derives it from `maxconn`).
    pub maxpipes_set: bool,
    /// The line of each of `global.logs`, same index (for the checks that
    /// validation runs on them).
    pub log_locs: Vec<Location>,
    /// `crt-base DIR` and `ca-base DIR` with their lines: validation applies
    /// them to `bind ... crt` and `server ... ca-file` paths, and warns at
    /// the line when nothing uses them.
    pub crt_base: Option<(std::path::PathBuf, Location)>,
    pub ca_base: Option<(std::path::PathBuf, Location)>,
}

impl Scope for GlobalDraft {
    fn here(&self) -> Sections {
        Sections::GLOBAL
    }
}

const G: Sections = Sections::GLOBAL;

/// The global keywords, in the order "did you mean" hints consider them.
#[rustfmt::skip]
pub const GLOBAL: &[Keyword<GlobalDraft>] = &[
    Keyword::new(&["nbthread"],                  G, Args::Required, nbthread),
    Keyword::new(&["maxconn"],                   G, Args::Required, maxconn),
    Keyword::new(&["user"],                      G, Args::Required, user),
    Keyword::new(&["group"],                     G, Args::Required, group),
    Keyword::new(&["pidfile"],                   G, Args::Required, pidfile),
    Keyword::new(&["chroot"],                    G, Args::Required, chroot),
    Keyword::new(&["hard-stop-after"],           G, Args::Required, hard_stop_after),
    Keyword::new(&["stats"],                     G, Args::Required, stats_socket::other),
    Keyword::new(&["stats", "socket"],           G, Args::Required, stats_socket::socket),
    Keyword::new(&["stats", "timeout"],          G, Args::Required, stats_socket::timeout),
    Keyword::new(&["stats", "maxconn"],          G, Args::Required, stats_socket::maxconn),
    Keyword::new(&["stats", "show-name"],        G, Args::Required, stats_socket::show_name),
    Keyword::new(&["stats", "prometheus"],       G, Args::Required, stats_socket::prometheus),
    Keyword::new(&["forward-mode"],              G, Args::Required, forward_mode),
    Keyword::new(&["tune.pipesize"],             G, Args::Required, pipesize),
    Keyword::new(&["tune.sockmap.max-inflight"], G, Args::Required, sockmap_max_inflight),
    Keyword::new(&["tune.sockmap.promote-bytes"], G, Args::Required, sockmap_promote_bytes),
    Keyword::new(&["maxpipes"],                  G, Args::Required, maxpipes),
    Keyword::new(&["tune.runqueue-depth"],       G, Args::Required, runqueue_depth),
    Keyword::new(&["tune.sched.low-latency"],    G, Args::Required, sched_low_latency),
    Keyword::new(&["tune.sched.heavy-cap"],      G, Args::Required, sched_heavy_cap),
    Keyword::new(&["profiling.tasks"],           G, Args::Required, profiling_tasks),
    Keyword::new(&["log"],                       G, Args::Required, log),
    Keyword::new(&["daemon"],                    G, Args::None,     daemon),
    Keyword::new(&["server-state-file"],         G, Args::Required, server_state_file),
    Keyword::new(&["server-state-base"],         G, Args::Required, server_state_base),
    Keyword::new(&["tune.idle-pool.shared"],     G, Args::Required, idle_pool_shared),
    Keyword::new(&["ca-base"],                   G, Args::Required, ca_base),
    Keyword::new(&["crt-base"],                  G, Args::Required, crt_base),
    Keyword::new(&["key-base"],                  G, Args::Required, not_tls),
    Keyword::new(&["ssl-default-bind-ciphers"],  G, Args::Required, not_tls),
    Keyword::new(&["ssl-default-bind-ciphersuites"], G, Args::Required, not_tls),
    Keyword::new(&["ssl-default-bind-options"],  G, Args::Required, not_tls),
    Keyword::new(&["ssl-default-server-ciphers"], G, Args::Required, not_tls),
    Keyword::new(&["ssl-default-server-ciphersuites"], G, Args::Required, not_tls),
    Keyword::new(&["ssl-default-server-options"], G, Args::Required, not_tls),
    Keyword::new(&["ssl-dh-param-file"],         G, Args::Required, not_tls),
    Keyword::new(&["ssl-server-verify"],         G, Args::Required, not_tls),
    Keyword::new(&["tune.ssl.default-dh-param"], G, Args::Required, not_tls),
];

/// One line of the global section.
pub fn line(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    if let Some(res) = dispatch(GLOBAL, g, l) {
        return res;
    }
    let kw = l.kw();
    if kw == "nbproc" {
        return Err("nbproc is not supported any more since HAProxy 2.5. Threads will automatically be used on multi-processor machines if available.".to_string());
    }
    let msg = format!("unknown keyword '{kw}' in 'global' section");
    let hint = suggest(kw, first_words(GLOBAL).chain(section_names()));
    Err(with_hint(msg, hint))
}

fn nbthread(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    let val = l.arg(1);
    let n: usize = val
        .filter(|v| v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            format!(
                "'nbthread' passed a missing or unparsable integer value in '{}'",
                val.unwrap_or("")
            )
        })?;
    g.global.nbthread = Some(bounded(n, 1, MAX_NBTHREAD, l.kw())?);
    no_extra(l.args, 2, l.kw())
}

fn maxconn(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    g.global.maxconn = bounded(int_arg(l.arg(1), l.kw())?, 1, MAX_MAXCONN, l.kw())?;
    no_extra(l.args, 2, l.kw())
}

fn maxpipes(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    g.global.maxpipes = bounded(int_arg(l.arg(1), l.kw())?, 0, MAX_MAXCONN, l.kw())?;
    g.maxpipes_set = true;
    no_extra(l.args, 2, l.kw())
}

fn runqueue_depth(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    let n = bounded(int_arg(l.arg(1), l.kw())?, 1, MAX_MAXCONN, l.kw())?;
    g.global.runqueue_depth = Some(n);
    no_extra(l.args, 2, l.kw())
}

/// `user NAME` and `group NAME`.
fn name_arg(l: &Line<'_>) -> Result<String, String> {
    let kw = l.kw();
    let v = l
        .arg(1)
        .ok_or_else(|| format!("'{kw}' expects a {kw} name as argument."))?;
    Ok(v.to_string())
}

fn user(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    g.global.user = Some(name_arg(l)?);
    no_extra(l.args, 2, l.kw())
}

fn group(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    g.global.group = Some(name_arg(l)?);
    no_extra(l.args, 2, l.kw())
}

fn pidfile(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .ok_or_else(|| "'pidfile' expects a file name as an argument.".to_string())?;
    g.global.pidfile = Some(v.into());
    no_extra(l.args, 2, l.kw())
}

fn chroot(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    if g.global.chroot.is_some() {
        return Err("'chroot' already specified. Continuing.".to_string());
    }
    let v = l
        .arg(1)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| "'chroot' expects a directory as an argument.".to_string())?;
    g.global.chroot = Some(v.into());
    no_extra(l.args, 2, l.kw())
}

fn hard_stop_after(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    g.global.hard_stop_after = Some(time_arg(l.arg(1), l.kw())?);
    no_extra(l.args, 2, l.kw())
}

fn forward_mode(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    let v = l.arg(1).ok_or_else(|| {
        "'forward-mode' expects 'auto', 'sockmap', 'splice' or 'copy'.".to_string()
    })?;
    g.global.forward_mode = v.parse().map_err(|e| format!("'forward-mode' : {e}"))?;
    no_extra(l.args, 2, l.kw())
}

fn sockmap_max_inflight(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .ok_or_else(|| "'tune.sockmap.max-inflight' expects a size argument.".to_string())?;
    let n =
        parse_size(v).map_err(|e| format!("{e} in argument to 'tune.sockmap.max-inflight'."))?;
    if !(MIN_SOCKMAP_INFLIGHT..=MAX_SOCKMAP_INFLIGHT).contains(&n) {
        return Err(format!(
            "'tune.sockmap.max-inflight' value must be between {MIN_SOCKMAP_INFLIGHT} and {MAX_SOCKMAP_INFLIGHT} (was {n})"
        ));
    }
    g.global.sockmap_max_inflight = Some(n as usize);
    no_extra(l.args, 2, l.kw())
}

fn sockmap_promote_bytes(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    let kw = "tune.sockmap.promote-bytes";
    let v = l
        .arg(1)
        .ok_or_else(|| format!("'{kw}' expects a size argument."))?;
    let n = parse_size(v).map_err(|e| format!("{e} in argument to '{kw}'."))?;
    g.global.sockmap_promote_bytes = Some(n);
    no_extra(l.args, 2, l.kw())
}

fn pipesize(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    let v = l
        .arg(1)
        .ok_or_else(|| "'tune.pipesize' expects a size argument.".to_string())?;
    let n = parse_size(v).map_err(|e| format!("{e} in argument to 'tune.pipesize'."))?;
    if !(MIN_PIPESIZE..=MAX_PIPESIZE).contains(&n) {
        return Err(format!(
            "'tune.pipesize' value must be between {MIN_PIPESIZE} and {MAX_PIPESIZE} (was {n})"
        ));
    }
    // Bounded by MAX_PIPESIZE above, so it fits any usize >= 32 bits.
    g.global.pipesize = Some(n as usize);
    no_extra(l.args, 2, l.kw())
}

/// `KEYWORD on|off`.
fn on_off(l: &Line<'_>) -> Result<bool, String> {
    match l.arg(1) {
        Some("on") => Ok(true),
        Some("off") => Ok(false),
        other => Err(format!(
            "'{}' expects either 'on' or 'off' but got '{}'.",
            l.kw(),
            other.unwrap_or("")
        )),
    }
}

fn idle_pool_shared(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    g.global.idle_pool_shared = on_off(l)?;
    no_extra(l.args, 2, l.kw())
}

fn sched_low_latency(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    g.global.sched_low_latency = on_off(l)?;
    no_extra(l.args, 2, l.kw())
}

fn sched_heavy_cap(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    g.global.sched_heavy_cap = on_off(l)?;
    no_extra(l.args, 2, l.kw())
}

/// `profiling.tasks on|auto|off`, with HAProxy's message for anything else.
fn profiling_tasks(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    g.global.profiling_tasks = match l.arg(1) {
        Some("on") => ProfilingTasks::On,
        Some("auto") => ProfilingTasks::Auto,
        Some("off") => ProfilingTasks::Off,
        other => {
            return Err(format!(
                "'{}' expects either 'on', 'auto', or 'off' but got '{}'.",
                l.kw(),
                other.unwrap_or("")
            ))
        }
    };
    no_extra(l.args, 2, l.kw())
}

/// `log TARGET [len N] [format F] FACILITY [LEVEL [MINLEVEL]]`.
fn log(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    if l.args.len() < 3 {
        return Err("log : expects <address> and <facility> as arguments".to_string());
    }
    g.global.logs.push(super::log::log_target(&l.args[1..])?);
    g.log_locs.push(l.loc.clone());
    Ok(())
}

fn daemon(_: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    l.warnings.push(format!(
        "parsing [{}] : 'daemon' ignored: shunt always runs in the foreground.",
        l.loc
    ));
    no_extra(l.args, 1, l.kw())
}

/// An OpenSSL tuning keyword of a shared `global` section (Debian's stock
/// file has several): accepted with a warning, since shunt's TLS (rustls)
/// has its own suites and options.
fn not_tls(_: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    if l.arg(1).is_none() {
        return Err(format!("'{}' expects an argument.", l.kw()));
    }
    l.warnings.push(super::not_applicable(
        l.loc,
        l.kw(),
        "take OpenSSL settings (rustls picks its own)",
    ));
    Ok(())
}

/// The directory of `crt-base DIR` / `ca-base DIR` (HAProxy's messages).
fn base_dir(
    slot: &mut Option<(std::path::PathBuf, Location)>,
    l: &mut Line<'_>,
) -> Result<(), String> {
    let kw = l.kw();
    if slot.is_some() {
        return Err(format!("'{kw}' already specified."));
    }
    let v = l
        .arg(1)
        .ok_or_else(|| format!("'{kw}' expects a directory path as an argument."))?;
    *slot = Some((v.into(), l.loc.clone()));
    no_extra(l.args, 2, kw)
}

fn crt_base(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    base_dir(&mut g.crt_base, l)
}

fn ca_base(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    base_dir(&mut g.ca_base, l)
}

fn server_state_file(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    let kw = l.kw();
    if g.global.server_state.file.is_some() {
        return Err(format!("'{kw}' already specified."));
    }
    let v = l
        .arg(1)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("'{kw}' expect one argument: a file path."))?;
    g.global.server_state.file = Some(v.into());
    no_extra(l.args, 2, kw)
}

fn server_state_base(g: &mut GlobalDraft, l: &mut Line<'_>) -> Result<(), String> {
    let kw = l.kw();
    if g.global.server_state.base.is_some() {
        return Err(format!("'{kw}' already specified."));
    }
    let v = l
        .arg(1)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("'{kw}' expects one argument: a directory path."))?;
    g.global.server_state.base = Some(v.into());
    no_extra(l.args, 2, kw)
}
