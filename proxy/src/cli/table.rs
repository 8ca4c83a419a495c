//! The CLI command table: the one place a command's facts live.
//!
//! Owns [`COMMANDS`], one [`Spec`] per command: its words, its `help` line (HAProxy's
//! text), the level a session needs ([`Level`]), whether it is heavy work
//! ([`Heavy`]), whether it runs on the workers, and its argument parser. Everything
//! else reads from here: `command::parse` picks the entry whose words are the longest
//! prefix of the request ([`find`]) and runs its parser; `dispatch` checks the level;
//! the connection loop asks for the heavy and workers decisions; `render` lists the
//! entries for `help` and for an unknown command.
//!
//! Invariants (the first two are checked by the table walk in `cli/tests.rs`):
//! - Every field of an entry is stated: [`Spec`] has no default, and neither has
//!   [`Level`], so an entry without a level does not compile.
//! - No two entries have the same words; every entry has a usage and a description.
//! - The entries are in registration order, new commands at the end: as HAProxy
//!   walks its keyword lists, the search for the commands closest to an unknown one
//!   gives a tie to the earlier entry (`render::unknown`). `help` lists them in
//!   HAProxy's listing order instead ([`listing_order`]).
//!
//! ```compile_fail
//! // An entry must say who may run it: leaving `level` out does not compile.
//! use proxy::cli::{command::Command, table::{Heavy, Spec}};
//! static S: Spec = Spec {
//!     words: &["show", "nothing"],
//!     usage: "show nothing",
//!     help: "show nothing",
//!     heavy: Heavy::Never,
//!     on_workers: false,
//!     parse: |_| Command::ShowBackend,
//! };
//! ```

use crate::config::CliLevel;

use super::command::{self as c, Args, Command};

/// Who may run a command (user < operator < admin). Deliberately without a
/// default: each entry says it.
#[derive(Debug, Clone, Copy)]
pub enum Level {
    User,
    Operator,
    Admin,
    /// The arguments decide (`clear counters` needs operator, `clear counters all`
    /// admin): the parsed command's level.
    ByArgs(fn(&Command) -> CliLevel),
}

impl Level {
    /// The level a session needs to run `cmd`.
    pub fn of(self, cmd: &Command) -> CliLevel {
        match self {
            Level::User => CliLevel::User,
            Level::Operator => CliLevel::Operator,
            Level::Admin => CliLevel::Admin,
            Level::ByArgs(f) => f(cmd),
        }
    }
}

/// Whether a command is heavy work, run from the scheduler's Heavy class (it loads,
/// clears or replaces a whole map, or walks the kernel's BPF maps).
#[derive(Debug, Clone, Copy)]
pub enum Heavy {
    Never,
    Always,
    /// Decided from the parsed command (a large payload).
    When(fn(&Command) -> bool),
    /// While the kernel handoff is loaded (the command walks its BPF maps).
    WithKernel,
}

impl Heavy {
    /// Whether `cmd` is heavy in a process where the kernel handoff is
    /// loaded (`kernel_loaded`) or not.
    pub fn of(self, cmd: &Command, kernel_loaded: bool) -> bool {
        match self {
            Heavy::Never => false,
            Heavy::Always => true,
            Heavy::When(f) => f(cmd),
            Heavy::WithKernel => kernel_loaded,
        }
    }
}

/// One CLI command.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The words that select it (`["show", "servers", "state"]`).
    pub words: &'static [&'static str],
    /// Its syntax, as `help` shows it (HAProxy's text).
    pub usage: &'static str,
    /// What it does, as `help` shows it after the usage (HAProxy's text).
    pub help: &'static str,
    /// The level a session needs.
    pub level: Level,
    /// Run from the scheduler's Heavy class.
    pub heavy: Heavy,
    /// Answered by the workers (it reads or changes their flow registries or
    /// scheduler counters): `dispatch::dispatch_workers`.
    pub on_workers: bool,
    /// The words after [`Spec::words`] (and the payload) → the command.
    pub parse: fn(Args<'_>) -> Command,
}

/// The entry whose words are the longest prefix of `words`.
pub fn find(words: &[&str]) -> Option<&'static Spec> {
    COMMANDS
        .iter()
        .filter(|s| words.starts_with(s.words))
        .max_by_key(|s| s.words.len())
}

/// An `add map <<` payload from [`super::HEAVY_PAYLOAD`] bytes on.
fn large_payload(cmd: &Command) -> bool {
    matches!(cmd, Command::AddMapPayload { payload, .. } if payload.len() >= super::HEAVY_PAYLOAD)
}

/// A stick-table command that walks a whole table under its lock (a dump,
/// a clear without a key): heavy work, as a large map's.
fn walks_table(cmd: &Command) -> bool {
    let whole =
        |r: &c::TableReq| r.table.is_some() && r.args.first().map(String::as_str) != Some("key");
    match cmd {
        Command::ShowTable(r) | Command::ClearTable(r) => whole(r),
        _ => false,
    }
}

/// `clear counters all` resets every counter: admin; the maxima alone, operator.
fn clear_counters_level(cmd: &Command) -> CliLevel {
    match cmd {
        Command::ClearCounters { all: true } => CliLevel::Admin,
        _ => CliLevel::Operator,
    }
}

/// Every command, in registration order (see the module header).
pub static COMMANDS: &[Spec] = &[
    Spec {
        words: &["add", "map"],
        usage: "add map [@<ver>] <map> <key> <val>",
        help: "add a map entry (payload supported instead of key/val)",
        level: Level::Operator,
        heavy: Heavy::When(large_payload),
        on_workers: false,
        parse: c::parse_add_map,
    },
    Spec {
        words: &["clear", "counters"],
        usage: "clear counters [all]",
        help: "clear max statistics counters (or all counters)",
        level: Level::ByArgs(clear_counters_level),
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::ClearCounters {
            all: a.words.first() == Some(&"all"),
        },
    },
    Spec {
        words: &["clear", "map"],
        usage: "clear map [@<ver>] <map>",
        help: "clear the contents of this map",
        level: Level::Operator,
        heavy: Heavy::Always,
        on_workers: false,
        parse: c::parse_clear_map,
    },
    Spec {
        words: &["commit", "map"],
        usage: "commit map @<ver> <map>",
        help: "commit the map at this version",
        level: Level::Operator,
        heavy: Heavy::Always,
        on_workers: false,
        parse: c::parse_commit_map,
    },
    Spec {
        words: &["del", "map"],
        usage: "del map <map> [<key>|#<ref>]",
        help: "delete map entries matching <key>",
        level: Level::Operator,
        heavy: Heavy::Never,
        on_workers: false,
        parse: c::parse_del_map,
    },
    Spec {
        words: &["disable", "server"],
        usage: "disable server (DEPRECATED)",
        help: "disable a server for maintenance (use 'set server' instead)",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::DisableServer(c::first(a.words)),
    },
    Spec {
        words: &["enable", "server"],
        usage: "enable server  (DEPRECATED)",
        help: "enable a disabled server (use 'set server' instead)",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::EnableServer(c::first(a.words)),
    },
    Spec {
        words: &["get", "map"],
        usage: "get map <map> <value>",
        help: "report the keys and values matching a sample for a map",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: c::parse_get_map,
    },
    Spec {
        words: &["get", "weight"],
        usage: "get weight <bk>/<srv>",
        help: "report a server's current weight",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::GetWeight(c::first(a.words)),
    },
    Spec {
        words: &["operator"],
        usage: "operator",
        help: "lower the level of the current CLI session to operator",
        // Only a session at operator or above may "lower" itself to operator.
        level: Level::Operator,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |_| Command::SetLevel(CliLevel::Operator),
    },
    Spec {
        words: &["prepare", "map"],
        usage: "prepare map <acl>",
        help: "prepare a new version for atomic map replacement",
        level: Level::Operator,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::PrepareMap(c::first(a.words)),
    },
    Spec {
        words: &["set", "map"],
        usage: "set map <map> [<key>|#<ref>] <value>",
        help: "modify a map entry",
        level: Level::Operator,
        heavy: Heavy::Never,
        on_workers: false,
        parse: c::parse_set_map,
    },
    Spec {
        words: &["set", "server"],
        usage: "set server <bk>/<srv> [opts]",
        help: "change a server's state, weight, address or ssl",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::SetServer {
            target: c::first(a.words),
            op: c::parse_server_op(a.words.get(1..).unwrap_or_default()),
        },
    },
    Spec {
        words: &["set", "timeout"],
        usage: "set timeout [cli] <delay>",
        help: "change a timeout setting",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: c::parse_set_timeout,
    },
    Spec {
        words: &["set", "weight"],
        usage: "set weight <bk>/<srv>  (DEPRECATED)",
        help: "change a server's weight (use 'set server' instead)",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::SetWeight {
            target: c::first(a.words),
            weight: c::first(a.words.get(1..).unwrap_or_default()),
        },
    },
    Spec {
        words: &["show", "backend"],
        usage: "show backend",
        help: "list backends in the current running config",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |_| Command::ShowBackend,
    },
    Spec {
        words: &["show", "cli", "level"],
        usage: "show cli level",
        help: "display the level of the current CLI session",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |_| Command::ShowCliLevel,
    },
    Spec {
        words: &["show", "info"],
        usage: "show info [desc|json|typed|float]*",
        help: "report information about the running process",
        level: Level::User,
        heavy: Heavy::WithKernel,
        on_workers: false,
        parse: c::parse_show_info,
    },
    Spec {
        words: &["show", "map"],
        usage: "show map [@ver] [map]",
        help: "report available maps or dump a map's contents",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: c::parse_show_map,
    },
    Spec {
        words: &["show", "servers", "conn"],
        usage: "show servers conn [<backend>]",
        help: "dump server connections status (all or for a single backend)",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::ShowServersConn(a.words.first().map(|b| b.to_string())),
    },
    Spec {
        words: &["show", "servers", "state"],
        usage: "show servers state [<backend>]",
        help: "dump volatile server information (all or for a single backend)",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::ShowServersState(a.words.first().map(|b| b.to_string())),
    },
    Spec {
        words: &["show", "sess"],
        usage: "show sess [id]",
        help: "report the list of current sessions or dump this exact session",
        level: Level::Operator,
        heavy: Heavy::Never,
        // A `Producer` the connection loop drains; it asks the workers itself.
        on_workers: false,
        parse: |_| Command::ShowSess,
    },
    Spec {
        words: &["show", "stat"],
        usage: "show stat [desc|json|no-maint|typed|up]*",
        help: "report counters for each proxy and server",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::ShowStat(c::parse_stat_query(a.words)),
    },
    Spec {
        words: &["shutdown", "session"],
        usage: "shutdown session [id]",
        help: "kill a specific session",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: true,
        parse: |a| Command::ShutdownSession(c::first(a.words)),
    },
    Spec {
        words: &["shutdown", "sessions", "server"],
        usage: "shutdown sessions server <bk>/<srv>",
        help: "kill sessions on a server",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: true,
        parse: |a| Command::ShutdownSessionsServer(c::first(a.words)),
    },
    Spec {
        words: &["user"],
        usage: "user",
        help: "lower the level of the current CLI session to user",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |_| Command::SetLevel(CliLevel::User),
    },
    // Scheduler commands.
    Spec {
        words: &["set", "profiling"],
        usage: "set profiling <what> {auto|on|off}",
        help: "enable/disable resource profiling (tasks,memory)",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: false,
        parse: c::parse_set_profiling,
    },
    Spec {
        words: &["show", "activity"],
        usage: "show activity",
        help: "show per-thread activities",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: true,
        parse: |_| Command::ShowActivity,
    },
    Spec {
        words: &["show", "profiling"],
        usage: "show profiling [<what>|<#lines>|byaddr]*",
        help: "show profiling state (all,status,tasks,memory)",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: true,
        parse: c::parse_show_profiling,
    },
    // HAProxy's own first registrations (`help` lists them last, in this order).
    Spec {
        words: &["help"],
        usage: "help [<command>]",
        help: "list matching or all commands",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::Help(a.words.iter().map(|s| s.to_string()).collect()),
    },
    Spec {
        words: &["prompt"],
        usage: "prompt",
        help: "toggle interactive mode with prompt",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| c::parse_prompt(a.words),
    },
    Spec {
        words: &["quit"],
        usage: "quit",
        help: "disconnect",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |_| Command::Quit,
    },
    // Later additions.
    Spec {
        words: &["show", "version"],
        usage: "show version",
        help: "show version of the current process",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |_| Command::ShowVersion,
    },
    Spec {
        words: &["set", "severity-output"],
        usage: "set severity-output [none|number|string]",
        help: "set presence of severity level in feedback information",
        level: Level::User,
        heavy: Heavy::Never,
        on_workers: false,
        parse: c::parse_severity_output,
    },
    Spec {
        words: &["set", "maxconn", "frontend"],
        usage: "set maxconn frontend <frontend> <value>",
        help: "change a frontend's maxconn setting",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: false,
        parse: c::parse_maxconn_frontend,
    },
    Spec {
        words: &["set", "maxconn", "global"],
        usage: "set maxconn global <value>",
        help: "change the per-process maxconn setting",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: false,
        parse: c::parse_maxconn_global,
    },
    Spec {
        words: &["set", "maxconn", "server"],
        usage: "set maxconn server <bk>/<srv>",
        help: "change a server's maxconn setting",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: false,
        parse: c::parse_maxconn_server,
    },
    Spec {
        words: &["disable", "agent"],
        usage: "disable agent",
        help: "disable agent checks",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::DisableAgent(c::first(a.words)),
    },
    Spec {
        words: &["disable", "health"],
        usage: "disable health",
        help: "disable health checks",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::DisableHealth(c::first(a.words)),
    },
    Spec {
        words: &["enable", "agent"],
        usage: "enable agent",
        help: "enable agent checks",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::EnableAgent(c::first(a.words)),
    },
    Spec {
        words: &["enable", "health"],
        usage: "enable health",
        help: "enable health checks",
        level: Level::Admin,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::EnableHealth(c::first(a.words)),
    },
    // Stick tables: the contents need operator, `show table`'s list does
    // not (`cli::tables` says "contents not dumped" below operator), and
    // as HAProxy's a `clear table` below operator is refused for a key and
    // does nothing otherwise, so its level is checked there.
    Spec {
        words: &["clear", "table"],
        usage: "clear table <table> [<filter>]*",
        help: "remove an entry from a table (filter: data/key)",
        level: Level::User,
        heavy: Heavy::When(walks_table),
        on_workers: false,
        parse: |a| Command::ClearTable(c::parse_table_req(a)),
    },
    Spec {
        words: &["set", "table"],
        usage: "set table <table> key <k> [data.* <v>]*",
        help: "update or create a table entry's data",
        level: Level::Operator,
        heavy: Heavy::Never,
        on_workers: false,
        parse: |a| Command::SetTable(c::parse_table_req(a)),
    },
    Spec {
        words: &["show", "table"],
        usage: "show table <table> [<filter>]*",
        help: "report table usage stats or dump this table's contents (filter: data/key)",
        level: Level::User,
        heavy: Heavy::When(walks_table),
        on_workers: false,
        parse: |a| Command::ShowTable(c::parse_table_req(a)),
    },
];

/// The commands HAProxy lists after all others, in this order.
const ALWAYS_LAST: [&str; 3] = ["help", "prompt", "quit"];

impl Spec {
    /// `help`, `prompt` and `quit`: listed after all others, and proposed for every
    /// unknown command.
    pub fn always_listed(&self) -> bool {
        self.words.len() == 1 && ALWAYS_LAST.contains(&self.words[0])
    }
}

/// HAProxy's listing order: by usage text (`strcmp`), then `help`, `prompt`, `quit`.
pub fn listing_order(a: &Spec, b: &Spec) -> std::cmp::Ordering {
    let last = |e: &Spec| {
        ALWAYS_LAST
            .iter()
            .position(|k| e.always_listed() && *k == e.words[0])
    };
    match (last(a), last(b)) {
        (None, None) => a.usage.cmp(b.usage),
        (x, y) => x.is_some().cmp(&y.is_some()).then(x.cmp(&y)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_words_win() {
        let pick = |line: &str| {
            let words: Vec<&str> = line.split(' ').collect();
            find(&words).map(|s| s.words.join(" "))
        };
        assert_eq!(
            pick("show servers state b").as_deref(),
            Some("show servers state")
        );
        assert_eq!(
            pick("shutdown sessions server b/s1").as_deref(),
            Some("shutdown sessions server")
        );
        assert_eq!(
            pick("shutdown session 0x1").as_deref(),
            Some("shutdown session")
        );
        assert_eq!(
            pick("set maxconn global 5").as_deref(),
            Some("set maxconn global")
        );
        assert_eq!(pick("set maxconn bogus 5"), None);
        assert_eq!(pick("show servers"), None);
        assert_eq!(pick("show"), None);
        assert_eq!(pick("help show stat").as_deref(), Some("help"));
    }

    #[test]
    fn table_walks_are_heavy_key_lookups_are_not() {
        let heavy = |line: &str| {
            let words: Vec<&str> = line.split(' ').collect();
            let spec = find(&words).expect("a command");
            let cmd = (spec.parse)(Args {
                words: &words[spec.words.len()..],
                payload: None,
            });
            spec.heavy.of(&cmd, false)
        };
        assert!(heavy("show table fe"));
        assert!(heavy("show table fe data.conn_cnt gt 1"));
        assert!(heavy("clear table fe"));
        assert!(!heavy("show table"), "the list");
        assert!(!heavy("show table fe key 10.0.0.1"));
        assert!(!heavy("clear table fe key 10.0.0.1"));
        assert!(!heavy("set table fe key 10.0.0.1 data.gpc0 1"));
    }
}
