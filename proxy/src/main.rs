//! `shunt`: command line, logging, configuration check, then the daemon.
//!
//! Only wiring lives here: parse arguments, set up tracing, load and validate
//! the configuration, and map start-up errors to exit codes (1 for a bad
//! configuration or a start-up failure, as HAProxy).
//!
//! HAProxy spells its reload options `-sf PID...` and `-st PID...` with one
//! dash; they are rewritten to `--sf`/`--st` before clap sees them (clap's short
//! options are one letter).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use proxy::config::{self, ForwardMode};
use proxy::daemon::{self, Options};

#[derive(Parser, Debug)]
#[command(
    name = "shunt",
    version,
    about = "eBPF-assisted TCP proxy and load balancer"
)]
struct Args {
    /// Configuration file (repeatable; files are read in order).
    #[arg(short = 'f', value_name = "FILE", required = true)]
    files: Vec<PathBuf>,
    /// Check the configuration only, then exit.
    #[arg(short = 'c')]
    check: bool,
    /// Forwarding mode, overriding the configuration's `forward-mode`.
    #[arg(long = "forward-mode", value_name = "auto|sockmap|splice|copy")]
    forward_mode: Option<ForwardMode>,
    /// More verbose logging (-v: debug, -vv: trace).
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    verbose: u8,
    /// Quiet: warnings and errors only.
    #[arg(short = 'q')]
    quiet: bool,
    /// Take the listening sockets from the process serving this stats socket
    /// (`expose-fd listeners`) before binding: seamless reload.
    #[arg(short = 'x', value_name = "PATH")]
    xfer_socket: Option<PathBuf>,
    /// `-sf PID...`: once started, send these processes SIGUSR1 (soft stop: they
    /// stop accepting, finish their flows and exit).
    #[arg(long = "sf", value_name = "PID", num_args = 1.., conflicts_with = "hard_stop_pids")]
    soft_stop_pids: Vec<i32>,
    /// `-st PID...`: once started, send these processes SIGTERM (hard stop).
    #[arg(long = "st", value_name = "PID", num_args = 1..)]
    hard_stop_pids: Vec<i32>,
}

/// The arguments with HAProxy's `-sf`/`-st` turned into `--sf`/`--st`.
fn haproxy_style_args() -> Vec<std::ffi::OsString> {
    std::env::args_os()
        .map(|a| match a.to_str() {
            Some("-sf") => "--sf".into(),
            Some("-st") => "--st".into(),
            _ => a,
        })
        .collect()
}

fn init_logging(args: &Args) {
    use tracing_subscriber::EnvFilter;
    let default = match (args.quiet, args.verbose) {
        (true, _) => "warn",
        (false, 0) => "info",
        (false, 1) => "debug",
        (false, _) => "trace",
    };
    let filter = if args.verbose > 0 || args.quiet {
        EnvFilter::new(default)
    } else {
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

/// glibc's malloc parks small freed blocks in "fast bins" and merges all of them at
/// once on the next large allocation (`malloc_consolidate`). The `shunt-drop`
/// thread frees old map versions (hundreds of thousands of small blocks a second
/// under map reloads) into the workers' arenas, so a worker's next large
/// allocation paid milliseconds for them. Without fast bins, blocks merge as they
/// are freed, a little at a time.
fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes the allocator's parameters; called first thing
    // in main, before any thread exists.
    unsafe {
        libc::mallopt(libc::M_MXFAST, 0);
    }
}

fn main() -> ExitCode {
    tune_allocator();
    let args = Args::parse_from(haproxy_style_args());
    let pid = std::process::id();
    let loaded = match config::load(&args.files) {
        Ok(l) => l,
        Err(errors) => {
            for e in &errors {
                eprintln!("[ALERT]    ({pid}) : {e}");
            }
            eprintln!("[ALERT]    ({pid}) : Fatal errors found in configuration.");
            return ExitCode::from(1);
        }
    };
    for w in &loaded.warnings {
        eprintln!("[WARNING]  ({pid}) : {w}");
    }
    if args.check {
        println!("Configuration file is valid");
        return ExitCode::SUCCESS;
    }
    init_logging(&args);
    let old_pids_hard = !args.hard_stop_pids.is_empty();
    let opts = Options {
        forward_mode: args.forward_mode,
        xfer_socket: args.xfer_socket.clone(),
        old_pids: if old_pids_hard {
            args.hard_stop_pids.clone()
        } else {
            args.soft_stop_pids.clone()
        },
        old_pids_hard,
    };
    match daemon::run(loaded.config, opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("[ALERT]    ({pid}) : {e}");
            ExitCode::from(1)
        }
    }
}
