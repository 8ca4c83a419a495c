//! `stick-table`, `stick on|match|store-request` and the `track-scN` action
//! of `tcp-request` rules, with HAProxy 2.6's messages.
//!
//! Owns the words of those lines only: table names are resolved by
//! `validate` (a rule may name a table declared further down), which also
//! gives every table a stick rule writes to `server_id` and `server_key`.
//! `track_sc` is its own function so that each `tcp-request` ruleset
//! (`connection`, and `content` when it comes) calls the same parser.

use super::acl;
use super::model::{
    DataType, KeyFetch, KeyType, StickKind, StickRule, Store, TableRef, TableSpec, TrackSc,
    DEFAULT_STRING_LEN, MAX_TRACKERS,
};
use super::units::{parse_size, parse_time};
use super::{Kind, Line, ProxyDraft};

/// Largest `size`: entries are allocated as they come, but every index is
/// a `u32` and HAProxy's own limit is the same order.
const MAX_TABLE_SIZE: u64 = 1 << 30;
/// Largest string key `len`: a key is held inline in the entry, and HAProxy
/// bounds it by its buffer size.
const MAX_STRING_LEN: usize = 16 * 1024;

/// `stick-table type T [len N] size N [expire T] [nopurge] [store D,...]`.
pub fn stick_table(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    if d.kind == Kind::Defaults {
        return Err("'stick-table' is not supported in 'defaults' section.".to_string());
    }
    if let Some(prev) = &d.stick_table {
        return Err(format!(
            "stick-table name '{}' conflicts with table declared in {} '{}' at {}.",
            d.name,
            d.kind.type_str(),
            d.name,
            prev.line
        ));
    }
    let mut key = None;
    let mut size = 0u64;
    let mut expire = None;
    let mut nopurge = false;
    let mut store = Store::default();
    let mut i = 1;
    let missing = |kw: &str| format!("stick-table: missing argument after '{kw}'.");
    while let Some(w) = l.arg(i) {
        i += 1;
        match w {
            "type" => {
                let t = l.arg(i).ok_or_else(|| missing("type"))?;
                i += 1;
                key = Some(match t {
                    "ip" | "ipv4" => KeyType::Ip,
                    "ipv6" => KeyType::Ipv6,
                    "integer" => KeyType::Integer,
                    "string" => {
                        let mut len = DEFAULT_STRING_LEN;
                        if l.arg(i) == Some("len") {
                            let v = l.arg(i + 1).unwrap_or("");
                            len = v
                                .parse::<usize>()
                                .ok()
                                .filter(|n| (1..=MAX_STRING_LEN).contains(n))
                                .ok_or_else(|| format!("stick-table: unknown type '{v}'."))?;
                            i += 2;
                        }
                        KeyType::String { len }
                    }
                    "binary" => {
                        return Err(
                            "stick-table: type 'binary' is not supported by shunt.".to_string()
                        )
                    }
                    other => return Err(format!("stick-table: unknown type '{other}'.")),
                });
            }
            "size" => {
                let v = l.arg(i).ok_or_else(|| missing("size"))?;
                i += 1;
                size = parse_size(v)
                    .map_err(|e| format!("stick-table: {e} in argument of 'size'."))?;
                if size > MAX_TABLE_SIZE {
                    return Err(format!(
                        "stick-table: 'size' {size} is above shunt's limit of {MAX_TABLE_SIZE}."
                    ));
                }
            }
            "expire" => {
                let v = l.arg(i).ok_or_else(|| missing("expire"))?;
                i += 1;
                let t = parse_time(v)
                    .map_err(|e| format!("stick-table: {e} in argument of 'expire'."))?;
                expire = (!t.is_zero()).then_some(t);
            }
            "nopurge" => nopurge = true,
            "store" => {
                let Some(list) = l.arg(i) else { continue };
                i += 1;
                for item in list.split(',').filter(|s| !s.is_empty()) {
                    store_item(&mut store, item, l)?;
                }
            }
            "peers" => {
                return Err(format!(
                    "stick-table: 'peers' is not supported by shunt (no 'peers' section: tables are local to the process){}.",
                    l.arg(i).map(|p| format!("; remove 'peers {p}'")).unwrap_or_default()
                ))
            }
            other => return Err(format!("stick-table: unknown argument '{other}'.")),
        }
    }
    let key = key.ok_or_else(|| "stick-table: missing type.".to_string())?;
    if size == 0 {
        return Err("stick-table: missing size.".to_string());
    }
    d.stick_table = Some(TableSpec {
        name: d.name.clone(),
        key,
        size: usize::try_from(size).unwrap_or(usize::MAX),
        expire,
        nopurge,
        store,
        line: l.loc.clone(),
    });
    Ok(())
}

/// One item of a `store` list: `conn_cnt`, `conn_rate(10s)`.
fn store_item(store: &mut Store, item: &str, l: &mut Line<'_>) -> Result<(), String> {
    let (name, arg) = match item.split_once('(') {
        Some((n, rest)) => (n, Some(rest.strip_suffix(')').unwrap_or(rest))),
        None => (item, None),
    };
    let Some(t) = DataType::by_name(name).filter(|t| *t != DataType::ServerKey) else {
        if DataType::unsupported(name) {
            return Err(format!(
                "stick-table: store option '{name}' is not supported by shunt (TCP only; shunt stores server_id, gpt0, gpc0, gpc0_rate, gpc1, gpc1_rate, conn_cnt, conn_cur, conn_rate, sess_cnt, sess_rate, bytes_in_cnt, bytes_out_cnt)."
            ));
        }
        return Err(format!("stick-table: unknown store option '{name}'."));
    };
    let period = if t.is_rate() {
        let a =
            arg.ok_or_else(|| format!("stick-table: missing argument to store option '{name}'."))?;
        let p = parse_time(a)
            .ok()
            .and_then(|p| u32::try_from(p.as_millis()).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("stick-table: error when processing store option '{name}'."))?;
        p
    } else {
        0
    };
    if store.has(t) {
        l.warnings.push(format!(
            "parsing [{}]: stick-table: store option '{name}' already enabled, ignored.",
            l.loc
        ));
        return Ok(());
    }
    store.add(t, period);
    Ok(())
}

/// `stick on|match|store-request KEY [table T] [if|unless COND]`. In a
/// frontend the rule is ignored with HAProxy's warning.
pub fn stick(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let kind = match l.arg(1) {
        Some("on") => StickKind::On,
        Some("match") => StickKind::Match,
        Some("store-request") => StickKind::StoreRequest,
        Some("store-response") => {
            return Err(
                "'stick store-response' is not supported by shunt (it stores after the server's response; use 'stick on' or 'stick store-request')."
                    .to_string(),
            )
        }
        _ => return Err("'stick' expects 'on', 'match', or 'store'.".to_string()),
    };
    // The keyword table keeps `stick` out of `defaults`.
    if !d.kind.be() {
        l.warnings.push(format!(
            "parsing [{}] : 'stick' ignored because frontend '{}' has no backend capability.",
            l.loc, d.name
        ));
        return Ok(());
    }
    let f = l
        .arg(2)
        .ok_or_else(|| "'stick' expects a fetch method.".to_string())?;
    let key = KeyFetch::by_name(f).ok_or_else(|| format!("'stick': unknown fetch method '{f}'"))?;
    let mut i = 3;
    let mut table = TableRef::named(&d.name, l.loc);
    if l.arg(i) == Some("table") {
        table = TableRef::named(l.arg(i + 1).unwrap_or(""), l.loc);
        i += 2;
    }
    let cond = match l.arg(i) {
        None => None,
        Some("if" | "unless") => {
            Some(acl::parse_cond(&l.args[i..], &d.acls, l.loc).map_err(|e| {
                format!("'stick': error detected while parsing sticking condition : {e}")
            })?)
        }
        Some(w) => return Err(format!("'stick': unknown keyword '{w}'.")),
    };
    d.stick_rules.push(StickRule {
        kind,
        key,
        table,
        cond,
    });
    Ok(())
}

/// The action words `track-scN KEY [table T]` of a `tcp-request RULESET`
/// line, starting at `l.args[at]`: the action and the index of the first
/// word after it (a condition, or nothing).
pub fn track_sc(
    d: &ProxyDraft,
    l: &Line<'_>,
    at: usize,
    ruleset: &str,
) -> Result<(TrackSc, usize), String> {
    let act = l.arg(at).unwrap_or("");
    let n = act.strip_prefix("track-sc").unwrap_or("");
    let sc: u8 = n
        .parse()
        .map_err(|_| format!("'tcp-request {ruleset} {act}' : unknown action"))?;
    if usize::from(sc) >= MAX_TRACKERS {
        return Err(format!(
            "'tcp-request {ruleset} {act}' : {sc} track-sc number exceeding {} (MAX_SESS_STKCTR-1) value",
            MAX_TRACKERS - 1
        ));
    }
    let f = l
        .arg(at + 1)
        .ok_or_else(|| format!("'tcp-request {ruleset} {act}' : missing fetch method"))?;
    let key = KeyFetch::by_name(f)
        .ok_or_else(|| format!("'tcp-request {ruleset} {act}' : unknown fetch method '{f}'"))?;
    let mut next = at + 2;
    let mut table = TableRef::named(&d.name, l.loc);
    if l.arg(next) == Some("table") {
        table = TableRef::named(l.arg(next + 1).unwrap_or(""), l.loc);
        next += 2;
    }
    Ok((TrackSc { sc, key, table }, next))
}
