//! What a configuration says about traffic logs, as configuration parses it:
//! `log-format` strings compiled once into [`LogFormat`] (the `%` variables
//! shunt knows, HAProxy's `option tcplog` and "Connect from" formats), the
//! syslog header formats, facility and level names, and the `len` bounds.
//! Here so that `config` stays a leaf; `crate::log` renders and sends what this
//! describes (and re-exports these names where it always had them).

/// HAProxy's `option tcplog` format.
pub const TCPLOG_FORMAT: &str =
    "%ci:%cp [%t] %ft %b/%s %Tw/%Tc/%Tt %B %ts %ac/%fc/%bc/%sc/%rc %sq/%bq";
/// HAProxy's default format (no `option tcplog`, no `log-format`), logged when
/// the connection is accepted.
pub const CONNECT_FORMAT: &str = "Connect from %ci:%cp to %fi:%fp (%f/TCP)";

/// One `%` variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    ClientIp,
    ClientPort,
    FrontendIp,
    FrontendPort,
    /// `%t`: accept date, `dd/Mmm/yyyy:HH:MM:SS.mmm`.
    AcceptDate,
    /// `%Ts`: accept date, Unix seconds.
    AcceptTs,
    /// `%ms`: the milliseconds of the accept date, 3 digits.
    AcceptMs,
    /// `%f` / `%ft` (no TLS in shunt: the same).
    Frontend,
    Backend,
    Server,
    /// `%bi`/`%bp`: the local address of the server connection.
    BackendIp,
    BackendPort,
    /// `%si`/`%sp`: the server's address.
    ServerIp,
    ServerPort,
    Tw,
    Tc,
    Tt,
    /// `%B`: bytes from the server to the client.
    BytesRead,
    /// `%U`: bytes from the client to the server.
    BytesUploaded,
    TermState,
    ActConn,
    FeConn,
    BeConn,
    SrvConn,
    Retries,
    SrvQueue,
    BackendQueue,
    Pid,
    /// `%H`: the host name.
    Hostname,
    /// Not HAProxy's: the forwarding mode (`sockmap`, `splice`, `copy`, `-`).
    FwdMode,
}

const VARS: &[(&str, Var)] = &[
    ("ci", Var::ClientIp),
    ("cp", Var::ClientPort),
    ("fi", Var::FrontendIp),
    ("fp", Var::FrontendPort),
    ("t", Var::AcceptDate),
    ("Ts", Var::AcceptTs),
    ("ms", Var::AcceptMs),
    ("f", Var::Frontend),
    ("ft", Var::Frontend),
    ("b", Var::Backend),
    ("s", Var::Server),
    ("bi", Var::BackendIp),
    ("bp", Var::BackendPort),
    ("si", Var::ServerIp),
    ("sp", Var::ServerPort),
    ("Tw", Var::Tw),
    ("Tc", Var::Tc),
    ("Tt", Var::Tt),
    ("B", Var::BytesRead),
    ("U", Var::BytesUploaded),
    ("ts", Var::TermState),
    ("ac", Var::ActConn),
    ("fc", Var::FeConn),
    ("bc", Var::BeConn),
    ("sc", Var::SrvConn),
    ("rc", Var::Retries),
    ("sq", Var::SrvQueue),
    ("bq", Var::BackendQueue),
    ("pid", Var::Pid),
    ("H", Var::Hostname),
    ("fwd", Var::FwdMode),
];

/// One piece of a compiled format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Text(String),
    Var(Var),
}

/// A compiled `log-format`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFormat {
    pub nodes: Vec<Node>,
}

impl LogFormat {
    /// Compile `text` (already unquoted by the lexer). `%%` is a literal `%`;
    /// `%{flags}var` accepts and ignores HAProxy's flags (`+Q`, `-Q`, ...).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut nodes = Vec::new();
        let mut lit = String::new();
        let mut rest = text;
        while let Some(i) = rest.find('%') {
            lit.push_str(&rest[..i]);
            rest = &rest[i + 1..];
            if let Some(r) = rest.strip_prefix('%') {
                lit.push('%');
                rest = r;
                continue;
            }
            if let Some(r) = rest.strip_prefix('{') {
                let end = r
                    .find('}')
                    .ok_or_else(|| format!("missing '}}' after '%{{' in '{text}'"))?;
                rest = &r[end + 1..];
            }
            if rest.starts_with('[') {
                return Err(format!(
                    "sample fetch expressions ('%[...]') are not supported in log-format by shunt: '{text}'"
                ));
            }
            let n = rest
                .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .unwrap_or(rest.len());
            let name = &rest[..n];
            let Some(&(_, var)) = VARS.iter().find(|(k, _)| *k == name) else {
                return Err(format!("no such format variable '{name}'. If you wanted to emit the '%' character verbatim, you need to use '%%'"));
            };
            if !lit.is_empty() {
                nodes.push(Node::Text(std::mem::take(&mut lit)));
            }
            nodes.push(Node::Var(var));
            rest = &rest[n..];
        }
        lit.push_str(rest);
        if !lit.is_empty() {
            nodes.push(Node::Text(lit));
        }
        Ok(Self { nodes })
    }

    /// The TCP log format of `option tcplog`.
    pub fn tcplog() -> Self {
        Self::parse(TCPLOG_FORMAT).unwrap_or(Self { nodes: Vec::new() })
    }

    /// HAProxy's default connection line.
    pub fn connect() -> Self {
        Self::parse(CONNECT_FORMAT).unwrap_or(Self { nodes: Vec::new() })
    }
}

/// Syslog facilities by name (RFC 5424 numbering), as HAProxy accepts them.
pub const FACILITIES: [&str; 24] = [
    "kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron", "auth2",
    "ftp", "ntp", "audit", "alert", "cron2", "local0", "local1", "local2", "local3", "local4",
    "local5", "local6", "local7",
];

/// Syslog levels by name, most severe first.
pub const LEVELS: [&str; 8] = [
    "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
];

/// HAProxy's default `len`: longer lines are truncated.
pub const DEFAULT_MAXLEN: usize = 1024;
/// Bounds of `len`/`maxlen`: a header must fit; above 64 KiB no UDP datagram does.
pub const MIN_MAXLEN: usize = 80;
pub const MAX_MAXLEN: usize = 65_535;

/// A facility's number from its name.
pub fn facility(name: &str) -> Option<u8> {
    FACILITIES
        .iter()
        .position(|f| *f == name)
        .and_then(|i| u8::try_from(i).ok())
}

/// A level's number from its name.
pub fn level(name: &str) -> Option<u8> {
    LEVELS
        .iter()
        .position(|l| *l == name)
        .and_then(|i| u8::try_from(i).ok())
}

/// The header format of a log target or ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyslogFormat {
    /// `<PRI>Mmm dd HH:MM:SS TAG[PID]: MSG`.
    #[default]
    Rfc3164,
    /// `<PRI>1 TIMESTAMP HOSTNAME TAG PID - - MSG`.
    Rfc5424,
    /// `<PRI>MSG`.
    Short,
    /// `MSG`.
    Raw,
}

impl SyslogFormat {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "rfc3164" => Some(Self::Rfc3164),
            "rfc5424" => Some(Self::Rfc5424),
            "short" => Some(Self::Short),
            "raw" => Some(Self::Raw),
            _ => None,
        }
    }
}
