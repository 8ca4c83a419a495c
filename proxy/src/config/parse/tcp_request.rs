//! `tcp-request` lines of proxy sections: `inspect-delay`, `connection
//! accept|reject|expect-proxy layer4 [if|unless COND]` and `content
//! accept|reject [if|unless COND]`; everything else is refused with a reason.

use super::acl::{self, Fetch};
use super::model::{ContentAction, ContentRule, TcpConnAction, TcpConnRule};
use super::no_extra;
use super::proxy::Kind;
use super::units::parse_time;
use super::{Line, ProxyDraft};

/// `tcp-request inspect-delay <time>`.
pub fn inspect_delay(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let v = l.arg(2).ok_or_else(|| {
        "'tcp-request inspect-delay' expects a positive delay in milliseconds.".to_string()
    })?;
    let t = parse_time(v).map_err(|e| format!("{e} in 'tcp-request inspect-delay'"))?;
    no_extra(l.args, 3, "tcp-request inspect-delay")?;
    d.timeouts.inspect_delay = (!t.is_zero()).then_some(t);
    Ok(())
}

/// `tcp-request content accept|reject [if|unless COND]` (frontend, listen,
/// backend). Refused in `defaults`: HAProxy forbids it in an anonymous one,
/// and shunt does not inherit rules from a named one.
pub fn content(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    if d.kind == Kind::Defaults {
        return Err(if d.name.is_empty() {
            "tcp-request content is not allowed in anonymous 'defaults' sections".to_string()
        } else {
            "'tcp-request content' in a 'defaults' section is not supported by shunt (write the rules in the proxies)".to_string()
        });
    }
    let mut at = 3;
    let action = match l.arg(2) {
        Some("accept") => ContentAction::Accept,
        Some("reject") => ContentAction::Reject,
        Some(a) if a.starts_with("track-sc") => {
            let (t, next) = super::stick::track_sc(d, l, 2, "content")?;
            at = next;
            ContentAction::TrackSc(t)
        }
        Some("expect-proxy") => {
            return Err(format!(
                "'expect-proxy layer4' is not allowed in 'tcp-request content' rules in {} '{}'",
                d.kind.type_str(),
                d.name
            ))
        }
        got => {
            return Err(format!(
                "'tcp-request content' expects 'accept', 'reject' or 'track-sc0'..'track-sc2' in {} '{}' (got '{}'; shunt supports no other action).",
                d.kind.type_str(),
                d.name,
                got.unwrap_or("")
            ))
        }
    };
    let act = l.args[2].as_str();
    let cond = match l.arg(at) {
        None => None,
        Some("if" | "unless") => Some(acl::parse_cond(&l.args[at..], &d.acls, l.loc).map_err(|e| {
            format!(
                "'tcp-request content {act}' : error detected in {} '{}' while parsing '{}' condition : {e}",
                d.kind.type_str(),
                d.name,
                l.args[at]
            )
        })?),
        Some(w) => {
            return Err(format!(
                "'tcp-request content {act}' only accepts 'if' or 'unless', in {} '{}' (got '{w}')",
                d.kind.type_str(),
                d.name
            ))
        }
    };
    if d.kind.fe() && !d.use_backends.is_empty() {
        l.warnings.push(format!(
            "parsing [{}] : a 'tcp-request' rule placed after a 'use_backend' rule will still be processed before.",
            l.loc
        ));
    }
    d.tcp_content.push(ContentRule { action, cond });
    Ok(())
}

/// `tcp-request connection accept|reject|expect-proxy layer4|track-scN KEY
/// [table T] [if|unless COND]`. A condition that fetches the TLS server name
/// can never hold this early: HAProxy's warning.
pub fn connection(d: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    // The words of the action: `expect-proxy` takes `layer4`, `track-scN` its key.
    let mut at = 3;
    let action = match l.arg(2) {
        Some("accept") => TcpConnAction::Accept,
        Some("reject") => TcpConnAction::Reject,
        Some("expect-proxy") => TcpConnAction::ExpectProxy,
        Some(a) if a.starts_with("track-sc") => {
            let (t, next) = super::stick::track_sc(d, l, 2, "connection")?;
            at = next;
            TcpConnAction::TrackSc(t)
        }
        got => {
            return Err(format!(
                "'tcp-request connection' expects 'accept', 'reject', 'expect-proxy' or 'track-sc0'..'track-sc2' in frontend '{}' (got '{}'; shunt supports no other action).",
                d.name,
                got.unwrap_or("")
            ))
        }
    };
    if action == TcpConnAction::ExpectProxy {
        if l.arg(3) != Some("layer4") {
            return Err(format!(
                "'tcp-request connection expect-proxy' only supports 'layer4' in {} '{}' (got '{}')",
                d.kind.type_str(),
                d.name,
                l.arg(3).unwrap_or("")
            ));
        }
        at = 4;
    }
    let act = l.args[2].as_str();
    let cond = match l.arg(at) {
        None => None,
        Some("if" | "unless") => Some(acl::parse_cond(&l.args[at..], &d.acls, l.loc).map_err(|e| {
            format!(
                "'tcp-request connection {act}' : error detected in frontend '{}' while parsing '{}' condition : {e}",
                d.name, l.args[at]
            )
        })?),
        Some(w) => {
            return Err(format!(
                "'tcp-request connection {act}' only accepts 'if' or 'unless', in frontend '{}' (got '{w}')",
                d.name
            ))
        }
    };
    // HAProxy's order: the placement warning, then the condition's.
    if !d.use_backends.is_empty() {
        l.warnings.push(format!(
            "parsing [{}] : a 'tcp-request' rule placed after a 'use_backend' rule will still be processed before.",
            l.loc
        ));
    }
    if let Some((t, e)) = cond
        .as_ref()
        .and_then(|c| c.first_fetch(Fetch::reads_content))
    {
        let why = match &t.name {
            Some(n) => format!("acl '{n}' will never match in 'tcp-request connection' because it only involves keywords that are"),
            None => format!("anonymous acl will never match in 'tcp-request connection' because it uses keyword '{}' which is", e.keyword),
        };
        l.warnings.push(format!(
            "parsing [{}] : {why} incompatible with 'frontend tcp-request connection rule'",
            l.loc
        ));
    }
    d.tcp_connection.push(TcpConnRule { action, cond });
    d.tcp_connection_locs.push(l.loc.clone());
    Ok(())
}

/// `tcp-request WORD` for a WORD no entry holds, or no WORD at all.
pub fn other(_: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    match l.arg(1) {
        Some(sub @ "session") => Err(format!(
            "'tcp-request {sub}' is not supported by shunt yet (ACLs come later)."
        )),
        Some(sub) => Err(format!(
            "'tcp-request' expects 'inspect-delay', 'connection', 'session' or 'content', got '{sub}'."
        )),
        None => Err(
            "'tcp-request' expects 'inspect-delay', 'connection', 'session' or 'content'."
                .to_string(),
        ),
    }
}
