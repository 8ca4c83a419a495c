//! The `stats` keywords of a `frontend` or `listen` section: the stats web page
//! (`stats enable`, `uri`, `refresh`, `auth`, `realm`, `admin`, `hide-version`,
//! `show-legends`, `show-node`), with HAProxy 2.6's errors.
//!
//! Owns [`StatsDraft`], the page's settings as parsed. Any `stats` line makes the
//! proxy a stats page, as in HAProxy; whether it may be one (`mode http`, nothing to
//! forward) is validation's rule (`validate.rs`), which builds the
//! [`crate::config::StatsPage`].

use super::acl;
use super::model::{Cond, Location, StatsUser, DEFAULT_STATS_REALM, DEFAULT_STATS_URI};
use super::proxy::ProxyDraft;
use super::units::parse_time;
use super::{no_extra, Line};

/// The `stats` parameters HAProxy lists when it meets an unknown one.
const UNKNOWN_STATS: &str = "expects 'admin', 'uri', 'realm', 'auth', 'scope', 'enable', 'hide-version', 'show-node', 'show-desc' or 'show-legends'";

/// A section's stats page settings as parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsDraft {
    /// The first `stats` line (where a misplaced page is reported).
    pub loc: Location,
    pub uri: String,
    pub refresh: Option<u64>,
    pub realm: String,
    pub users: Vec<StatsUser>,
    pub admin: Option<Cond>,
    pub hide_version: bool,
    pub show_legends: bool,
    pub show_node: Option<String>,
}

impl StatsDraft {
    fn new(loc: &Location) -> Self {
        Self {
            loc: loc.clone(),
            uri: DEFAULT_STATS_URI.to_string(),
            refresh: None,
            realm: DEFAULT_STATS_REALM.to_string(),
            users: Vec::new(),
            admin: None,
            hide_version: false,
            show_legends: false,
            show_node: None,
        }
    }
}

/// `stats PARAM ...` in a frontend or listen section.
pub fn stats(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let Some(param) = l.arg(1) else {
        return Err(format!("'stats' {UNKNOWN_STATS}."));
    };
    let args = l.args;
    let page = d.stats.get_or_insert_with(|| StatsDraft::new(l.loc));
    match param {
        "enable" => no_extra(args, 2, "stats enable")?,
        "uri" => {
            let uri = l.arg(2).ok_or("'uri' needs an URI prefix.")?;
            page.uri = uri.to_string();
        }
        "realm" => {
            let realm = l.arg(2).ok_or("'realm' needs an realm name.")?;
            page.realm = realm.to_string();
        }
        "refresh" => {
            let v = l.arg(2).ok_or("'refresh' needs a refresh delay.")?;
            // HAProxy reads a bare number as seconds.
            let with_unit = if v.ends_with(|c: char| c.is_ascii_digit()) {
                format!("{v}s")
            } else {
                v.to_string()
            };
            let t = parse_time(&with_unit).map_err(|e| format!("'stats refresh' : {e}"))?;
            page.refresh = (t.as_secs() > 0).then_some(t.as_secs());
        }
        "auth" => {
            let account = l.arg(2).ok_or("'auth' needs a user:password account.")?;
            // HAProxy takes a word without ':' as a user with an empty password.
            let (user, pass) = account.split_once(':').unwrap_or((account, ""));
            page.users.push(StatsUser {
                user: user.to_string(),
                pass: pass.to_string(),
            });
        }
        "admin" => {
            if !matches!(l.arg(2), Some("if" | "unless")) {
                return Err(
                    "'stats admin' requires either 'if' or 'unless' followed by a condition."
                        .to_string(),
                );
            }
            let cond = acl::parse_cond(&args[2..], &d.acls, l.loc)
                .map_err(|e| format!("error detected while parsing a 'stats admin' rule : {e}."))?;
            // HAProxy keeps the first rule that matches; shunt has one: refuse a second.
            if page.admin.is_some() {
                return Err("only one 'stats admin' rule is supported by shunt.".to_string());
            }
            page.admin = Some(cond);
        }
        "hide-version" => {
            no_extra(args, 2, "stats hide-version")?;
            page.hide_version = true;
        }
        "show-legends" => {
            no_extra(args, 2, "stats show-legends")?;
            page.show_legends = true;
        }
        "show-node" => {
            page.show_node = Some(l.arg(2).unwrap_or("").to_string());
            no_extra(args, 3, "stats show-node")?;
        }
        "scope" | "show-desc" | "http-request" | "show-modules" => {
            return Err(format!("'stats {param}' is not supported by shunt yet."));
        }
        other => {
            return Err(format!(
                "unknown stats parameter '{other}', {UNKNOWN_STATS}."
            ))
        }
    }
    Ok(())
}
