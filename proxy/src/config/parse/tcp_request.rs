//! `tcp-request` lines of proxy sections: `inspect-delay`, and the one
//! `content` rule shunt accepts; everything else is refused with a reason.

use super::no_extra;
use super::units::parse_time;
use super::{Line, ProxyDraft};

/// The one `tcp-request content` rule shunt accepts, as the words the lexer yields:
/// the TLS wait idiom HAProxy configurations carry next to SNI routing. shunt's SNI
/// rules already wait (up to `inspect-delay`) for a ClientHello, so it is a no-op.
const ACCEPT_HELLO: &[&[&str]] = &[
    &["accept", "if", "{", "req_ssl_hello_type", "1", "}"],
    &["accept", "if", "{", "req.ssl_hello_type", "1", "}"],
];

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

/// `tcp-request content accept if { req_ssl_hello_type 1 }`, a no-op.
pub fn content(_: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    let rest: Vec<&str> = l.args[2..].iter().map(String::as_str).collect();
    if ACCEPT_HELLO.contains(&rest.as_slice()) {
        return Ok(());
    }
    Err(format!(
        "'tcp-request content {}' is not supported by shunt yet (only 'tcp-request content accept if {{ req_ssl_hello_type 1 }}' is accepted; ACLs come later).",
        rest.join(" ")
    ))
}

/// `tcp-request WORD` for a WORD no entry holds, or no WORD at all.
pub fn other(_: &mut ProxyDraft, l: &mut Line<'_>) -> Result<(), String> {
    match l.arg(1) {
        Some(sub @ ("connection" | "session")) => Err(format!(
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
