//! Traffic log lines: `log-format` strings compiled once at configuration time,
//! then rendered per flow from a [`FlowLog`] record.
//!
//! Owns the rendering of the `%` variables shunt knows (HAProxy's names and
//! meanings, TCP subset; the variables, `option tcplog`'s format and the "Connect
//! from" line are compiled by `config::logspec`) and the two-letter termination
//! state (`%ts`).
//!
//! Invariant: rendering never fails and never allocates more than the line itself;
//! a value that does not exist for a flow (no server, never connected) renders as
//! HAProxy does (`<NOSRV>`, `-1`, `-`).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::SystemTime;

use super::time::{Tm, MONTHS};

pub use crate::config::logspec::{LogFormat, Node, Var, CONNECT_FORMAT, TCPLOG_FORMAT};

/// Rendering a compiled format (its compilation is configuration's:
/// `config::logspec`).
impl LogFormat {
    /// Render the line for `f` into `out`.
    pub fn render(&self, f: &FlowLog, names: &Names<'_>, out: &mut String) {
        for n in &self.nodes {
            match n {
                Node::Text(t) => out.push_str(t),
                Node::Var(v) => render_var(*v, f, names, out),
            }
        }
    }
}

/// How a flow ended, as the first letter of `%ts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cause {
    /// Normal end (`-`).
    #[default]
    Normal,
    /// The client aborted (reset) (`C`).
    ClientAbort,
    /// The server aborted, refused or failed (`S`).
    ServerAbort,
    /// The client-side timeout struck (`c`).
    ClientTimeout,
    /// The server-side or queue or connect timeout struck (`s`).
    ServerTimeout,
    /// Denied by the proxy (no route) (`P`).
    Proxy,
    /// A local resource ran out (`R`).
    Resource,
    /// An internal error (`I`).
    Internal,
    /// Killed by a hard stop of the process (`K`).
    Killed,
}

/// Where the flow was when it ended, as the second letter of `%ts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// Before a server was chosen (`R`).
    Request,
    /// Waiting in a queue (`Q`).
    Queue,
    /// Connecting to the server (`C`).
    Connect,
    /// Exchanging data (`D`).
    Data,
    /// Closed normally (`-`).
    #[default]
    Closed,
}

/// The two-letter termination state.
pub fn term_state(cause: Cause, phase: Phase) -> [u8; 2] {
    let c = match cause {
        Cause::Normal => b'-',
        Cause::ClientAbort => b'C',
        Cause::ServerAbort => b'S',
        Cause::ClientTimeout => b'c',
        Cause::ServerTimeout => b's',
        Cause::Proxy => b'P',
        Cause::Resource => b'R',
        Cause::Internal => b'I',
        Cause::Killed => b'K',
    };
    // A normal end needs no phase; an abnormal one always names one.
    let p = match (cause, phase) {
        (Cause::Normal, _) => b'-',
        (_, Phase::Request) => b'R',
        (_, Phase::Queue) => b'Q',
        (_, Phase::Connect) => b'C',
        (_, Phase::Data | Phase::Closed) => b'D',
    };
    [c, p]
}

/// Everything a traffic log line can say about one flow.
#[derive(Debug, Clone)]
pub struct FlowLog {
    pub accept: SystemTime,
    pub client: SocketAddr,
    /// The listening address the client reached.
    pub frontend_addr: Option<SocketAddr>,
    pub fe: usize,
    pub be: Option<usize>,
    pub srv: Option<usize>,
    pub server_addr: Option<SocketAddr>,
    /// The local address of the server connection.
    pub backend_addr: Option<SocketAddr>,
    /// Milliseconds in the queue, to connect, in total; -1 = not reached.
    pub tw: i64,
    pub tc: i64,
    pub tt: i64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub cause: Cause,
    pub phase: Phase,
    pub actconn: usize,
    pub feconn: usize,
    pub beconn: usize,
    pub srvconn: usize,
    pub retries: u32,
    pub redispatched: bool,
    pub srv_queue: usize,
    pub backend_queue: usize,
    pub mode: Option<&'static str>,
}

impl FlowLog {
    /// A record for a flow just accepted on frontend `fe`.
    pub fn new(fe: usize, client: SocketAddr, frontend_addr: Option<SocketAddr>) -> Self {
        Self {
            accept: SystemTime::now(),
            client,
            frontend_addr,
            fe,
            be: None,
            srv: None,
            server_addr: None,
            backend_addr: None,
            tw: -1,
            tc: -1,
            tt: -1,
            bytes_up: 0,
            bytes_down: 0,
            cause: Cause::Normal,
            phase: Phase::Request,
            actconn: 0,
            feconn: 0,
            beconn: 0,
            srvconn: 0,
            retries: 0,
            redispatched: false,
            srv_queue: 0,
            backend_queue: 0,
            mode: None,
        }
    }
}

/// The names a line refers to, resolved by the caller from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Names<'a> {
    pub frontend: &'a str,
    /// `None`: no backend was chosen (HAProxy then prints the frontend's name).
    pub backend: Option<&'a str>,
    pub server: Option<&'a str>,
    pub hostname: &'a str,
}

fn ip_or_dash(a: Option<SocketAddr>, out: &mut String) {
    match a {
        Some(a) => {
            let _ = write!(out, "{}", a.ip());
        }
        None => out.push('-'),
    }
}

fn port_or_dash(a: Option<SocketAddr>, out: &mut String) {
    match a {
        Some(a) => {
            let _ = write!(out, "{}", a.port());
        }
        None => out.push('-'),
    }
}

/// `dd/Mmm/yyyy:HH:MM:SS.mmm`, HAProxy's accept date.
pub fn write_accept_date(t: SystemTime, out: &mut String) {
    let tm = Tm::local(t);
    let _ = write!(
        out,
        "{:02}/{}/{:04}:{:02}:{:02}:{:02}.{:03}",
        tm.mday,
        MONTHS[tm.mon],
        tm.year,
        tm.hour,
        tm.min,
        tm.sec,
        tm.nanos / 1_000_000
    );
}

fn render_var(v: Var, f: &FlowLog, names: &Names<'_>, out: &mut String) {
    let _ = match v {
        Var::ClientIp => write!(out, "{}", f.client.ip()),
        Var::ClientPort => write!(out, "{}", f.client.port()),
        Var::FrontendIp => {
            ip_or_dash(f.frontend_addr, out);
            Ok(())
        }
        Var::FrontendPort => {
            port_or_dash(f.frontend_addr, out);
            Ok(())
        }
        Var::AcceptDate => {
            write_accept_date(f.accept, out);
            Ok(())
        }
        Var::AcceptTs => write!(
            out,
            "{}",
            f.accept
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        ),
        Var::AcceptMs => write!(
            out,
            "{:03}",
            f.accept
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_millis())
        ),
        Var::Frontend => {
            out.push_str(names.frontend);
            Ok(())
        }
        Var::Backend => {
            out.push_str(names.backend.unwrap_or(names.frontend));
            Ok(())
        }
        Var::Server => {
            out.push_str(names.server.unwrap_or("<NOSRV>"));
            Ok(())
        }
        Var::BackendIp => {
            ip_or_dash(f.backend_addr, out);
            Ok(())
        }
        Var::BackendPort => {
            port_or_dash(f.backend_addr, out);
            Ok(())
        }
        Var::ServerIp => {
            ip_or_dash(f.server_addr, out);
            Ok(())
        }
        Var::ServerPort => {
            port_or_dash(f.server_addr, out);
            Ok(())
        }
        Var::Tw => write!(out, "{}", f.tw),
        Var::Tc => write!(out, "{}", f.tc),
        Var::Tt => write!(out, "{}", f.tt),
        Var::BytesRead => write!(out, "{}", f.bytes_down),
        Var::BytesUploaded => write!(out, "{}", f.bytes_up),
        Var::TermState => {
            let ts = term_state(f.cause, f.phase);
            out.push(char::from(ts[0]));
            out.push(char::from(ts[1]));
            Ok(())
        }
        Var::ActConn => write!(out, "{}", f.actconn),
        Var::FeConn => write!(out, "{}", f.feconn),
        Var::BeConn => write!(out, "{}", f.beconn),
        Var::SrvConn => write!(out, "{}", f.srvconn),
        Var::Retries => {
            if f.redispatched {
                out.push('+');
            }
            write!(out, "{}", f.retries)
        }
        Var::SrvQueue => write!(out, "{}", f.srv_queue),
        Var::BackendQueue => write!(out, "{}", f.backend_queue),
        Var::Pid => write!(out, "{}", std::process::id()),
        Var::Hostname => {
            out.push_str(names.hostname);
            Ok(())
        }
        Var::FwdMode => {
            out.push_str(f.mode.unwrap_or("-"));
            Ok(())
        }
    };
}
