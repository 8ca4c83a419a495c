//! What every flow of the process shares, whether `session` accepted it or
//! `reload` adopted it from a predecessor: its timeouts from the
//! configuration, and the one mapping from how it ended to the mode
//! counters, its log line and the frontend, backend and server counters.
//!
//! Here rather than in either user so that `session` and `reload` need not
//! import each other; it reads the configuration and writes counters and the
//! log record it is given, nothing else.

use crate::config::{Backend, Frontend};
use crate::handoff::{End, FlowTimeouts, Origin, Outcome};
use crate::log::FlowGuard;
use crate::stats::{Counters, Event};

use super::Runtime;

/// The timeouts of a flow from frontend `fe` to backend `be`: the
/// configuration's, as the direction loops of `handoff` apply them.
pub fn timeouts(fe: &Frontend, be: &Backend) -> FlowTimeouts {
    FlowTimeouts {
        client: fe.timeouts.client,
        server: be.timeouts.server,
        tunnel: be.timeouts.tunnel.or(fe.timeouts.tunnel),
        client_fin: fe.timeouts.client_fin,
        server_fin: be.timeouts.server_fin,
    }
}

/// How a flow ended, into the mode counters, its log line and the
/// frontend, backend and server counters: the one mapping for flows accepted
/// by `session` and flows adopted in a reload. A flow handed to a successor is
/// neither logged nor counted here (the successor does it when it ends).
pub fn account_end(
    state: &Runtime,
    out: &Outcome,
    log: Option<&mut FlowGuard>,
    ctrs: Option<[&Counters; 3]>,
) {
    if out.handed_over {
        if let Some(l) = log {
            l.discard();
        }
        return;
    }
    state
        .stats
        .modes
        .done(out.mode, out.to_server + out.to_client);
    if let Some(l) = log {
        l.forwarded(
            out.to_server,
            out.to_client,
            out.mode.name(),
            crate::log::cause_of(&out.end),
        );
    }
    let Some([fe, be, srv]) = ctrs else {
        return;
    };
    match &out.end {
        End::Done => {}
        End::ClientReset => {
            for c in [fe, be, srv] {
                c.event(Event::ClientAbort);
            }
        }
        End::ServerReset => {
            be.event(Event::ServerAbort);
            srv.event(Event::ServerAbort);
            srv.event(Event::RespError);
        }
        End::ClientTimeout | End::ServerTimeout => {
            fe.event(Event::Timeout);
            be.event(Event::Timeout);
        }
        // As the resets of the same side: the peer broke the flow.
        End::Error {
            origin: Origin::Client,
            ..
        } => {
            for c in [fe, be, srv] {
                c.event(Event::ClientAbort);
            }
        }
        End::Error {
            origin: Origin::Server,
            ..
        } => {
            be.event(Event::ServerAbort);
            srv.event(Event::ServerAbort);
            srv.event(Event::RespError);
        }
        End::Error {
            origin: Origin::Internal,
            ..
        } => be.event(Event::RespError),
    }
}
