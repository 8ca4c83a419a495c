//! Stick tables at run time: the process's set of tables ([`Tables`], built
//! once from the configuration and held by the runtime), what one flow
//! tracks in them ([`Tracker`]), and the purge of expired entries.
//!
//! Owns the tables' clock (milliseconds since the set was built, wrapping
//! as HAProxy's `now_ms`), so every table, fetch and `show table` reads one
//! clock. Must not know servers or sockets: the flow passes keys and
//! server ids in, `lb` is never called from here. Sits beside `lb` and
//! `maps` in the layers: imports `config` and `scheduler` (the purge
//! task's yields) only.
//!
//! Invariants: a [`Tracker`] releases every entry it tracks when dropped,
//! whatever path ends the flow, so `conn_cur` and the entries' references
//! never leak; the purge task only removes entries nobody tracks.

pub mod freq;
pub mod table;

#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::config::{StickCtx, StickFetch, TableSpec, MAX_TRACKERS};

pub use table::{Data, EntryView, Key, KeyError, Table};

/// How often the purge task looks for expired entries: HAProxy's expire
/// task runs at each entry's expiry; a second of lateness is invisible
/// next to `expire` values of seconds to hours, and lookups skip expired
/// entries anyway.
pub const PURGE_INTERVAL: Duration = Duration::from_secs(1);
/// Entries one purge step removes from one table before yielding, so a
/// large expiry wave does not hold the table's lock (and the worker) long.
const PURGE_BATCH: usize = 1024;

/// Every stick table of the configuration, in declaration order (the
/// index is [`crate::config::TableRef::index`]).
#[derive(Debug)]
pub struct Tables {
    tables: Vec<Table>,
    epoch: Instant,
}

impl Tables {
    pub fn new(specs: &[TableSpec]) -> Self {
        Self {
            tables: specs
                .iter()
                .enumerate()
                .map(|(i, s)| Table::new(s, i))
                .collect(),
            epoch: Instant::now(),
        }
    }

    /// The tables' clock: ms since the set was built, wrapping at 2^32.
    pub fn now_ms(&self) -> u32 {
        // Wrapping is the point: freq counters and ages use wrapping deltas.
        self.epoch.elapsed().as_millis() as u32
    }

    pub fn get(&self, i: usize) -> Option<&Table> {
        self.tables.get(i)
    }

    /// The table called `name`.
    pub fn by_name(&self, name: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.spec().name == name)
    }

    /// In declaration order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Table> {
        self.tables.iter()
    }

    /// Some table has an `expire` (the purge task has work).
    pub fn expiring(&self) -> bool {
        self.tables.iter().any(Table::expires)
    }

    /// One pass of the purge over every table; true when some table had
    /// more expired entries than one batch.
    pub fn purge_step(&self) -> bool {
        let now = self.now_ms();
        let mut more = false;
        for t in &self.tables {
            more |= t.purge(now, PURGE_BATCH) == PURGE_BATCH;
        }
        more
    }
}

/// The purge task (one, on the first worker, class bulk): every
/// [`PURGE_INTERVAL`], expired entries leave their tables, a batch at a
/// time with a yield between two.
pub async fn purge_loop(tables: &Tables) {
    loop {
        tokio::time::sleep(PURGE_INTERVAL).await;
        while tables.purge_step() {
            crate::scheduler::yield_now().await;
        }
    }
}

/// What one flow tracks: up to [`MAX_TRACKERS`] entries (`track-sc0..2`),
/// each a table and a slot, released on drop with the flow's bytes.
pub struct Tracker<'a> {
    tables: &'a Tables,
    /// (table, slot) per counter; `u32` halves keep the flow's future small.
    slots: [Option<(u32, u32)>; MAX_TRACKERS],
    bytes_in: u64,
    bytes_out: u64,
}

impl<'a> Tracker<'a> {
    pub fn new(tables: &'a Tables) -> Self {
        Self {
            tables,
            slots: [None; MAX_TRACKERS],
            bytes_in: 0,
            bytes_out: 0,
        }
    }

    /// `track-scN`: counter `sc` tracks `ip`'s entry in table `table`,
    /// unless it already tracks one (HAProxy's first rule wins). A key the
    /// table cannot hold (wrong family, full table) is not tracked.
    pub fn track(&mut self, sc: u8, table: usize, ip: IpAddr) {
        let Some(place) = self.slots.get_mut(usize::from(sc)) else {
            return;
        };
        if place.is_some() {
            return;
        }
        let Some(t) = self.tables.get(table) else {
            return;
        };
        let Some(key) = Key::of_addr(t.spec().key, ip) else {
            return;
        };
        let Ok(table) = u32::try_from(table) else {
            return;
        };
        *place = t
            .track(&key, self.tables.now_ms())
            .map(|slot| (table, slot));
    }

    /// Whether some counter tracks an entry.
    pub fn any(&self) -> bool {
        self.slots.iter().any(Option::is_some)
    }

    /// The connection became a session: `sess_cnt`/`sess_rate` of each entry.
    pub fn session(&self) {
        let now = self.tables.now_ms();
        for (t, slot) in self.slots.iter().flatten() {
            if let Some(t) = self.tables.get(*t as usize) {
                t.session(*slot, now);
            }
        }
    }

    /// The flow's byte totals, counted into the entries when it ends.
    pub fn set_bytes(&mut self, from_client: u64, to_client: u64) {
        self.bytes_in = from_client;
        self.bytes_out = to_client;
    }
}

impl Drop for Tracker<'_> {
    fn drop(&mut self) {
        let now = self.tables.now_ms();
        for (t, slot) in self.slots.iter().flatten() {
            if let Some(t) = self.tables.get(*t as usize) {
                t.release(*slot, now, self.bytes_in, self.bytes_out);
            }
        }
    }
}

impl StickCtx for Tracker<'_> {
    fn tracked(&self, sc: u8, what: StickFetch) -> Option<i64> {
        let (t, slot) = (*self.slots.get(usize::from(sc))?)?;
        self.tables
            .get(t as usize)?
            .fetch(slot, what, self.tables.now_ms())
    }

    fn lookup(&self, table: usize, addr: IpAddr, what: StickFetch) -> Option<i64> {
        let t = self.tables.get(table)?;
        let key = Key::of_addr(t.spec().key, addr)?;
        t.fetch_key(&key, what, self.tables.now_ms())
    }
}
