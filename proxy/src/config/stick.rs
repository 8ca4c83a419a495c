//! Stick tables as configured: `stick-table` declarations, the data types a
//! table stores, `track-sc*` actions and `stick on|match|store-request`
//! rules, as the rest of the daemon reads them (`crate::stick` builds the
//! runtime tables from [`TableSpec`]).
//!
//! Owns the data type catalogue ([`DataType`], in HAProxy 2.6's order, which
//! is the order `show table` prints them in) and the names of key types.
//! Must not hold runtime state: no entry, no counter lives here.
//!
//! Invariants: a [`TableRef`] leaving validation has `index` pointing into
//! [`super::Config::tables`]; a table's `store` holds a period for every
//! rate it stores.

use std::time::Duration;

use super::model::{Cond, Location};

/// The key type of a table (`type ip|ipv6|integer|string [len N]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    Ip,
    Ipv6,
    Integer,
    /// Keys longer than `len` bytes are cut to it (HAProxy's default 32).
    String {
        len: usize,
    },
}

/// HAProxy's default `len` of a string key.
pub const DEFAULT_STRING_LEN: usize = 32;

impl KeyType {
    /// The name `show table` prints (`type: ip`).
    pub fn name(self) -> &'static str {
        match self {
            KeyType::Ip => "ip",
            KeyType::Ipv6 => "ipv6",
            KeyType::Integer => "integer",
            KeyType::String { .. } => "string",
        }
    }
}

/// A data type a table may store. The discriminants are HAProxy 2.6's
/// `STKTABLE_DT_*` positions among the types shunt has, and the order of
/// `show table`'s columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DataType {
    ServerId,
    Gpt0,
    Gpc0,
    Gpc0Rate,
    ConnCnt,
    ConnRate,
    ConnCur,
    SessCnt,
    SessRate,
    BytesInCnt,
    BytesOutCnt,
    Gpc1,
    Gpc1Rate,
    /// Stored with `server_id` for every table a `stick` rule writes to.
    ServerKey,
}

/// Every data type, in `show table` order.
pub const DATA_TYPES: [DataType; 14] = [
    DataType::ServerId,
    DataType::Gpt0,
    DataType::Gpc0,
    DataType::Gpc0Rate,
    DataType::ConnCnt,
    DataType::ConnRate,
    DataType::ConnCur,
    DataType::SessCnt,
    DataType::SessRate,
    DataType::BytesInCnt,
    DataType::BytesOutCnt,
    DataType::Gpc1,
    DataType::Gpc1Rate,
    DataType::ServerKey,
];

/// HAProxy 2.6 data types shunt does not store (HTTP counters, arrays,
/// byte rates): refused by name rather than called unknown.
const UNSUPPORTED_TYPES: &[&str] = &[
    "http_req_cnt",
    "http_req_rate",
    "http_err_cnt",
    "http_err_rate",
    "http_fail_cnt",
    "http_fail_rate",
    "bytes_in_rate",
    "bytes_out_rate",
    "gpt",
    "gpc",
    "gpc_rate",
];

impl DataType {
    /// The type called `name` in `store` lists and `data.NAME` filters.
    pub fn by_name(name: &str) -> Option<Self> {
        DATA_TYPES.into_iter().find(|t| t.name() == name)
    }

    /// Whether HAProxy knows `name` but shunt does not store it.
    pub fn unsupported(name: &str) -> bool {
        UNSUPPORTED_TYPES.contains(&name)
    }

    pub fn name(self) -> &'static str {
        match self {
            DataType::ServerId => "server_id",
            DataType::Gpt0 => "gpt0",
            DataType::Gpc0 => "gpc0",
            DataType::Gpc0Rate => "gpc0_rate",
            DataType::ConnCnt => "conn_cnt",
            DataType::ConnRate => "conn_rate",
            DataType::ConnCur => "conn_cur",
            DataType::SessCnt => "sess_cnt",
            DataType::SessRate => "sess_rate",
            DataType::BytesInCnt => "bytes_in_cnt",
            DataType::BytesOutCnt => "bytes_out_cnt",
            DataType::Gpc1 => "gpc1",
            DataType::Gpc1Rate => "gpc1_rate",
            DataType::ServerKey => "server_key",
        }
    }

    /// A frequency counter: it takes a period (`conn_rate(10s)`).
    pub fn is_rate(self) -> bool {
        matches!(
            self,
            DataType::Gpc0Rate | DataType::ConnRate | DataType::SessRate | DataType::Gpc1Rate
        )
    }

    fn bit(self) -> u32 {
        1 << self as u32
    }
}

/// The data types a table stores, with the period of each rate (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Store {
    mask: u32,
    periods: [u32; DATA_TYPES.len()],
}

impl Store {
    pub fn has(&self, t: DataType) -> bool {
        self.mask & t.bit() != 0
    }

    /// Adds `t`; `period_ms` is the rate's period (ignored for counters).
    pub fn add(&mut self, t: DataType, period_ms: u32) {
        self.mask |= t.bit();
        self.periods[t as usize] = period_ms;
    }

    /// The period of rate `t` in ms (0 when not stored or not a rate).
    pub fn period(&self, t: DataType) -> u32 {
        self.periods[t as usize]
    }

    /// The stored types, in `show table` order.
    pub fn types(&self) -> impl Iterator<Item = DataType> + '_ {
        DATA_TYPES.into_iter().filter(|t| self.has(*t))
    }
}

/// One `stick-table` line: the table of the proxy it is declared in,
/// named after it.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSpec {
    pub name: String,
    pub key: KeyType,
    /// `size`: entries at most.
    pub size: usize,
    /// `expire`: an entry not touched for this long goes; `None` = never.
    pub expire: Option<Duration>,
    /// `nopurge`: a full table refuses new keys instead of evicting old ones.
    pub nopurge: bool,
    pub store: Store,
    pub line: Location,
}

/// A table named by a rule (`table NAME`, or the rule's own proxy), and
/// where.
#[derive(Debug, Clone, PartialEq)]
pub struct TableRef {
    pub name: String,
    /// Index into [`super::Config::tables`]; set by validation.
    pub index: usize,
    pub at: Location,
}

impl TableRef {
    /// An unresolved reference to table `name` made at `at`.
    pub fn named(name: &str, at: &Location) -> Self {
        Self {
            name: name.to_string(),
            index: usize::MAX,
            at: at.clone(),
        }
    }
}

/// The sample a key is built from: shunt's stick rules and `track-sc`
/// take the client's or the reached address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFetch {
    Src,
    Dst,
}

impl KeyFetch {
    pub fn by_name(s: &str) -> Option<Self> {
        match s {
            "src" => Some(KeyFetch::Src),
            "dst" => Some(KeyFetch::Dst),
            _ => None,
        }
    }
}

/// Tracked counters a flow may hold (`track-sc0..2`, HAProxy's
/// `MAX_SESS_STKCTR`).
pub const MAX_TRACKERS: usize = 3;

/// `track-scN KEY [table T]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TrackSc {
    /// 0..[`MAX_TRACKERS`].
    pub sc: u8,
    pub key: KeyFetch,
    pub table: TableRef,
}

/// What a `stick` rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StickKind {
    /// `stick match`: look the key up; a server found there is used.
    Match,
    /// `stick store-request`: remember the server the flow went to.
    StoreRequest,
    /// `stick on`: both.
    On,
}

impl StickKind {
    pub fn matches(self) -> bool {
        matches!(self, StickKind::Match | StickKind::On)
    }
    pub fn stores(self) -> bool {
        matches!(self, StickKind::StoreRequest | StickKind::On)
    }
}

/// `stick on|match|store-request KEY [table T] [if|unless COND]` of a backend.
#[derive(Debug, Clone, PartialEq)]
pub struct StickRule {
    pub kind: StickKind,
    pub key: KeyFetch,
    pub table: TableRef,
    pub cond: Option<Cond>,
}
