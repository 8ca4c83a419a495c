//! The stick-table commands once parsed: `show table`, `clear table`, `set
//! table`, their arguments checked against the named table in HAProxy
//! 2.6's order and with its messages, then applied to `stick::Table`.
//!
//! Owns the argument grammar (`key K`, up to [`MAX_FILTERS`] `data.T OP V`
//! filters, `data.T V` pairs) and its errors; `dispatch` calls in here (the
//! level of each command is its table entry's), the text is `render`'s.
//! Must not change anything but the named table's entries.

use crate::config::{CliLevel, DataType};
use crate::stick::{Data, Key, Table, Tables};

use super::command::TableReq;
use super::dispatch::Output;
use super::render;

/// HAProxy's `STKTABLE_FILTERLEN`: data filters one command takes.
pub const MAX_FILTERS: usize = 4;

pub const NO_SUCH_TABLE: &str = "No such table\n";
pub const KEY_EXPECTED: &str = "Key value expected\n";
const SHOW_OPTIONAL: &str =
    "Optional argument only supports \"data.<store_data_type>\" <operator> <value> and key <key>\n";
const CLEAR_REQUIRED: &str = "Required arguments: <table> \"data.<store_data_type>\" <operator> <value> or <table> key <key>\n";
const SET_REQUIRED: &str =
    "Required arguments: <table> key <key> [data.<store_data_type> <value>]*\n";
const CONTENT_LOOKUP: &str =
    "content-based lookup is only supported with the \"show\" and \"clear\" actions\n";
const DATA_EXPECTED: &str = "\"data.<type>\" followed by a value expected\n";
const UNKNOWN_TYPE: &str = "Unknown data type\n";
const NOT_STORED: &str = "Data type not stored in this table\n";
const BAD_VALUE: &str = "Require a valid integer value to store\n";
const IN_USE: &str = "Entry currently in use, cannot remove\n";
const NO_CONTENTS: &str = "# contents not dumped due to insufficient privileges\n";

/// A data filter's operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Le,
    Ge,
    Lt,
    Gt,
}

impl Op {
    fn by_name(s: &str) -> Option<Self> {
        Some(match s {
            "eq" => Op::Eq,
            "ne" => Op::Ne,
            "le" => Op::Le,
            "ge" => Op::Ge,
            "lt" => Op::Lt,
            "gt" => Op::Gt,
            _ => return None,
        })
    }

    fn holds(self, v: i128, than: i128) -> bool {
        match self {
            Op::Eq => v == than,
            Op::Ne => v != than,
            Op::Le => v <= than,
            Op::Ge => v >= than,
            Op::Lt => v < than,
            Op::Gt => v > than,
        }
    }
}

/// `data.T OP V`.
#[derive(Debug, Clone, Copy)]
struct Filter {
    t: DataType,
    op: Op,
    v: i64,
}

/// What the arguments after the table name select.
enum Sel {
    All,
    Key(Key),
    Filters(Vec<Filter>),
}

/// The table `req` names; `Err` with HAProxy's message when none is named
/// (`need`) or none has the name.
fn table<'t>(tables: &'t Tables, req: &TableReq, need: &str) -> Result<&'t Table, Output> {
    match req.table.as_deref() {
        None | Some("") => Err(Output::err(need)),
        Some(n) => tables.by_name(n).ok_or_else(|| Output::err(NO_SUCH_TABLE)),
    }
}

/// The key of `key K` (`args[0]` is `key`).
fn key_arg(t: &Table, args: &[String]) -> Result<Key, Output> {
    let k = args
        .get(1)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| Output::err(KEY_EXPECTED))?;
    Key::parse(t.spec().key, k).map_err(|e| Output::err(format!("{e}\n")))
}

/// Data type `name` when table `t` stores it, else HAProxy's message: a
/// type HAProxy knows (shunt's tables never store the HTTP ones) is "not
/// stored", any other "unknown".
fn stored_type(t: &Table, name: &str) -> Result<DataType, &'static str> {
    match DataType::by_name(name) {
        Some(dt) if t.spec().store.has(dt) => Ok(dt),
        Some(_) => Err(NOT_STORED),
        None if DataType::unsupported(name) => Err(NOT_STORED),
        None => Err(UNKNOWN_TYPE),
    }
}

/// `data.T OP V` filters from `args`, HAProxy's "Filter entry #N: " errors.
fn filters(t: &Table, args: &[String]) -> Result<Vec<Filter>, Output> {
    let mut out = Vec::new();
    for (i, f) in args.chunks(3).take(MAX_FILTERS).enumerate() {
        let err = |m: &str| Output::err(format!("Filter entry #{}: {m}", i + 1));
        // HAProxy skips the five characters of `data.` without checking them.
        let name = f[0].get(5..).unwrap_or("");
        let dt = stored_type(t, name).map_err(&err)?;
        let op = f.get(1).and_then(|o| Op::by_name(o)).ok_or_else(|| {
            err("Require and operator among \"eq\", \"ne\", \"le\", \"ge\", \"lt\", \"gt\"\n")
        })?;
        let v = f
            .get(2)
            .and_then(|v| v.parse::<i64>().ok())
            .ok_or_else(|| err("Require a valid integer value to compare against\n"))?;
        out.push(Filter { t: dt, op, v });
    }
    Ok(out)
}

/// The selection of `show`/`clear` (`bad`: the message for another word).
fn selection(t: &Table, args: &[String], bad: &str) -> Result<Sel, Output> {
    match args.first().map(String::as_str) {
        None => Ok(Sel::All),
        Some("key") => key_arg(t, args).map(Sel::Key),
        Some(w) if w.starts_with("data.") => filters(t, args).map(Sel::Filters),
        Some(_) => Err(Output::err(bad)),
    }
}

/// Whether `d` passes every filter at `now`.
fn passes(t: &Table, fs: &[Filter], d: &Data, now: u32) -> bool {
    fs.iter().all(|f| {
        // A value without a number (`server_key`) matches nothing, as HAProxy.
        d.value(f.t, &t.spec().store, now).is_some_and(|v| {
            let v = if f.t == DataType::ServerId {
                i128::from(d.server_id)
            } else {
                i128::from(v)
            };
            f.op.holds(v, i128::from(f.v))
        })
    })
}

/// `show table [NAME [key K | data.T OP V...]]`.
pub fn show(tables: &Tables, level: CliLevel, req: &TableReq) -> Output {
    let Some(name) = req.table.as_deref().filter(|n| !n.is_empty()) else {
        // The list, in HAProxy's order: the last declared first.
        let mut out = String::new();
        for t in tables.iter().rev() {
            render::table_header(&mut out, t.spec(), t.used());
        }
        return Output::Text(out);
    };
    let Some(t) = tables.by_name(name) else {
        return Output::err(NO_SUCH_TABLE);
    };
    let sel = match selection(t, &req.args, SHOW_OPTIONAL) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let now = tables.now_ms();
    let entries = match &sel {
        Sel::All => t.snapshot(now, &|_, _| true),
        Sel::Key(k) => {
            let found = t.snapshot(now, &|key, _| key == k);
            if found.is_empty() {
                // HAProxy prints nothing at all for an absent key.
                return Output::Text(String::new());
            }
            found
        }
        Sel::Filters(fs) => t.snapshot(now, &|_, d| passes(t, fs, d, now)),
    };
    let mut out = String::new();
    render::table_header(&mut out, t.spec(), t.used());
    if level < CliLevel::Operator {
        out.push_str(NO_CONTENTS);
        return Output::Text(out);
    }
    for e in &entries {
        render::table_entry(&mut out, t.spec(), e, now);
    }
    Output::Text(out)
}

/// `clear table NAME [key K | data.T OP V...]`: the untracked entries
/// selected go (all of them without a selection). Below operator, as
/// HAProxy 2.6: a key is refused, anything else does nothing.
pub fn clear(tables: &Tables, level: CliLevel, req: &TableReq) -> Output {
    let t = match table(tables, req, CLEAR_REQUIRED) {
        Ok(t) => t,
        Err(e) => return e,
    };
    let now = tables.now_ms();
    let sel = selection(t, &req.args, CLEAR_REQUIRED);
    if level < CliLevel::Operator {
        return match sel {
            Err(e) => e,
            Ok(Sel::Key(_)) => Output::err(super::dispatch::PERMISSION_DENIED),
            Ok(_) => Output::Text(String::new()),
        };
    }
    match sel {
        Err(e) => e,
        Ok(Sel::All) => {
            t.clear(now, &|_, _| true);
            Output::Text(String::new())
        }
        Ok(Sel::Key(k)) => {
            let e = t.snapshot(now, &|key, _| *key == k);
            match e.first() {
                None => Output::Text(String::new()),
                Some(e) if e.refs > 0 => Output::err(IN_USE),
                Some(_) => {
                    t.clear(now, &|key, _| *key == k);
                    Output::Text(String::new())
                }
            }
        }
        Ok(Sel::Filters(fs)) => {
            t.clear(now, &|_, d| passes(t, &fs, d, now));
            Output::Text(String::new())
        }
    }
}

/// `set table NAME key K [data.T V]...`: the entry is created if absent.
pub fn set(tables: &Tables, req: &TableReq) -> Output {
    let t = match table(tables, req, SET_REQUIRED) {
        Ok(t) => t,
        Err(e) => return e,
    };
    match req.args.first().map(String::as_str) {
        Some("key") => {}
        Some(w) if w.starts_with("data.") => return Output::err(CONTENT_LOOKUP),
        _ => return Output::err(SET_REQUIRED),
    }
    let key = match key_arg(t, &req.args) {
        Ok(k) => k,
        Err(e) => return e,
    };
    let mut values = Vec::new();
    let mut failed = None;
    for pair in req.args[2..].chunks(2) {
        let Some(name) = pair[0].strip_prefix("data.") else {
            failed = Some(DATA_EXPECTED);
            break;
        };
        let dt = match stored_type(t, name) {
            Ok(dt) => dt,
            Err(m) => {
                failed = Some(m);
                break;
            }
        };
        let Some(v) = pair.get(1).and_then(|v| v.parse::<i64>().ok()) else {
            failed = Some(BAD_VALUE);
            break;
        };
        values.push((dt, v));
    }
    // As HAProxy, the entry exists and the pairs before a bad one apply.
    t.set(&key, &values, tables.now_ms());
    match failed {
        Some(m) => Output::err(m),
        None => Output::Text(String::new()),
    }
}
