//! One stick table: entries by key, each with the data its table stores,
//! bounded by `size`, least recently used first out.
//!
//! Owns [`Table`], [`Key`] and the entries' [`Data`]. Must not know flows,
//! servers or the CLI: callers pass keys, slots and the time (`now`, in
//! ms on the table set's clock) and get values back.
//!
//! # Concurrency
//! One `Mutex` per table. Flows of every worker thread touch a table at
//! accept (track: a hash probe, a few counter updates, an LRU relink), in
//! fetches, and at their end: short critical sections, no allocation for a
//! key already present, no I/O and no `await` under the lock. A sharded map
//! would lower contention but split the LRU order `size` eviction needs; at
//! proxy accept rates on a few threads a single lock is not the bottleneck
//! (the connect syscalls are). `show table` copies the entries out under the
//! lock, so a very large table stalls its flows for the copy.
//!
//! # Invariants (under the lock)
//! - `index` maps each live key to its slot, and every live slot is in the
//!   LRU list exactly once, most recently touched at `head`;
//! - an entry with `refs > 0` (tracked by a live flow) is never removed:
//!   not by eviction, expiry or `clear table`, so a flow's slot stays its
//!   entry until it releases it;
//! - `used() <= size`: a new key in a full table evicts the least recently
//!   touched entry nobody tracks, or is refused (`nopurge`, or every entry
//!   tracked).
//! - with a uniform `expire`, LRU order is expiry order: the expired
//!   entries are all at the tail.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard};

use super::freq::FreqCtr;
use crate::config::{DataType, KeyType, StickFetch, Store, TableSpec};

/// End of the LRU list.
const NIL: u32 = u32::MAX;
/// Entries looked at from the LRU tail for one eviction: tracked entries
/// sit there only when flows outlive the table's traffic, and a bounded
/// walk keeps a new key's cost flat (past it the key is not stored, as
/// HAProxy's when it cannot trash an entry).
const EVICT_SCAN_MAX: usize = 256;

/// A table key, as HAProxy stores it (IPv4 and IPv6 addresses as bytes in
/// network order, so the derived order is `show table`'s).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    V4([u8; 4]),
    V6([u8; 16]),
    Int(u32),
    Str(Box<str>),
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::V4(b) => Ipv4Addr::from(*b).fmt(f),
            Key::V6(b) => Ipv6Addr::from(*b).fmt(f),
            Key::Int(n) => n.fmt(f),
            Key::Str(s) => f.write_str(s),
        }
    }
}

/// Why a key's text does not fit a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("Invalid key")]
    Invalid,
}

impl Key {
    /// The key address `ip` makes in a table of type `t`: IPv4 stays, a
    /// v4-mapped IPv6 becomes IPv4 and another IPv6 fits no `ip` table; an
    /// `ipv6` table maps IPv4; an integer table takes an IPv4 as its number;
    /// a string table its text, cut to `len` (the one key made with an
    /// allocation per flow). `None`: no key (no tracking).
    pub fn of_addr(t: KeyType, ip: IpAddr) -> Option<Key> {
        let ip = ip.to_canonical();
        Some(match (t, ip) {
            (KeyType::Ip, IpAddr::V4(a)) => Key::V4(a.octets()),
            (KeyType::Ip, IpAddr::V6(_)) => return None,
            (KeyType::Ipv6, IpAddr::V4(a)) => Key::V6(a.to_ipv6_mapped().octets()),
            (KeyType::Ipv6, IpAddr::V6(a)) => Key::V6(a.octets()),
            (KeyType::Integer, IpAddr::V4(a)) => Key::Int(u32::from(a)),
            (KeyType::Integer, IpAddr::V6(_)) => return None,
            (KeyType::String { len }, ip) => Key::Str(cut(&ip.to_string(), len).into()),
        })
    }

    /// The key the CLI's `key K` names. As HAProxy 2.6, text that is no
    /// IPv4 address reads as `0.0.0.0` in an `ip` table.
    pub fn parse(t: KeyType, s: &str) -> Result<Key, KeyError> {
        Ok(match t {
            KeyType::Ip => Key::V4(
                s.parse::<Ipv4Addr>()
                    .unwrap_or(Ipv4Addr::UNSPECIFIED)
                    .octets(),
            ),
            KeyType::Ipv6 => Key::V6(
                s.parse::<Ipv6Addr>()
                    .map_err(|_| KeyError::Invalid)?
                    .octets(),
            ),
            KeyType::Integer => Key::Int(s.parse().map_err(|_| KeyError::Invalid)?),
            KeyType::String { len } => Key::Str(cut(s, len).into()),
        })
    }
}

/// `s` cut to at most `len` bytes, at a character boundary.
fn cut(s: &str, len: usize) -> &str {
    if s.len() <= len {
        return s;
    }
    let mut end = len;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Everything an entry may store; a table's [`Store`] says which of it
/// exists (is shown, updated and fetched).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Data {
    pub server_id: i32,
    /// The name of the server `server_id` is, for `show table`.
    pub server_key: Option<Arc<str>>,
    pub gpt0: u32,
    pub gpc0: u32,
    pub gpc0_rate: FreqCtr,
    pub gpc1: u32,
    pub gpc1_rate: FreqCtr,
    pub conn_cnt: u32,
    pub conn_rate: FreqCtr,
    pub conn_cur: u32,
    pub sess_cnt: u32,
    pub sess_rate: FreqCtr,
    pub bytes_in_cnt: u64,
    pub bytes_out_cnt: u64,
}

impl Data {
    /// The value of data type `t` at `now` as `show table` prints and
    /// filters it (`server_key` has none).
    pub fn value(&self, t: DataType, store: &Store, now: u32) -> Option<u64> {
        let rate = |f: &FreqCtr| u64::from(f.read(now, store.period(t)));
        Some(match t {
            DataType::ServerId => {
                return Some(u64::from(u32::from_ne_bytes(self.server_id.to_ne_bytes())))
            }
            DataType::Gpt0 => u64::from(self.gpt0),
            DataType::Gpc0 => u64::from(self.gpc0),
            DataType::Gpc0Rate => rate(&self.gpc0_rate),
            DataType::Gpc1 => u64::from(self.gpc1),
            DataType::Gpc1Rate => rate(&self.gpc1_rate),
            DataType::ConnCnt => u64::from(self.conn_cnt),
            DataType::ConnRate => rate(&self.conn_rate),
            DataType::ConnCur => u64::from(self.conn_cur),
            DataType::SessCnt => u64::from(self.sess_cnt),
            DataType::SessRate => rate(&self.sess_rate),
            DataType::BytesInCnt => self.bytes_in_cnt,
            DataType::BytesOutCnt => self.bytes_out_cnt,
            DataType::ServerKey => return None,
        })
    }

    /// `set table ... data.T V`: counters take `v` as HAProxy stores it
    /// (32-bit ones wrap, `server_id` is signed), a rate restarts at `v`.
    pub fn set(&mut self, t: DataType, v: i64, now: u32) {
        // Truncation to the stored width is HAProxy's own behaviour.
        let v32 = v as u32;
        match t {
            DataType::ServerId => self.server_id = v as i32,
            DataType::Gpt0 => self.gpt0 = v32,
            DataType::Gpc0 => self.gpc0 = v32,
            DataType::Gpc0Rate => self.gpc0_rate.set(now, v32),
            DataType::Gpc1 => self.gpc1 = v32,
            DataType::Gpc1Rate => self.gpc1_rate.set(now, v32),
            DataType::ConnCnt => self.conn_cnt = v32,
            DataType::ConnRate => self.conn_rate.set(now, v32),
            DataType::ConnCur => self.conn_cur = v32,
            DataType::SessCnt => self.sess_cnt = v32,
            DataType::SessRate => self.sess_rate.set(now, v32),
            DataType::BytesInCnt => self.bytes_in_cnt = v as u64,
            DataType::BytesOutCnt => self.bytes_out_cnt = v as u64,
            DataType::ServerKey => {}
        }
    }
}

/// One entry as `show table` sees it.
#[derive(Debug, Clone)]
pub struct EntryView {
    /// Stable while the entry lives (its slot and table).
    pub id: u64,
    pub key: Key,
    /// Flows tracking it (`use=`).
    pub refs: u32,
    /// ms until it expires (`exp=`), 0 without `expire`.
    pub exp: u32,
    pub data: Data,
}

#[derive(Debug)]
struct Entry {
    key: Key,
    data: Data,
    refs: u32,
    touched: u32,
    prev: u32,
    next: u32,
}

#[derive(Debug, Default)]
struct Inner {
    index: HashMap<Key, u32>,
    /// Slots; `None` when free (listed in `free`).
    slots: Vec<Option<Entry>>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
}

/// A stick table shared by every worker thread.
#[derive(Debug)]
pub struct Table {
    spec: TableSpec,
    /// Its position in the table set (part of each entry's id).
    pos: usize,
    expire_ms: u32,
    inner: Mutex<Inner>,
}

impl Table {
    pub fn new(spec: &TableSpec, pos: usize) -> Self {
        Self {
            spec: spec.clone(),
            pos,
            expire_ms: spec
                .expire
                .map_or(0, |e| u32::try_from(e.as_millis()).unwrap_or(u32::MAX)),
            inner: Mutex::new(Inner {
                head: NIL,
                tail: NIL,
                ..Inner::default()
            }),
        }
    }

    pub fn spec(&self) -> &TableSpec {
        &self.spec
    }

    pub fn expires(&self) -> bool {
        self.expire_ms > 0
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic under the lock leaves entries that are still entries;
        // refusing every flow that tracks would be worse.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Entries in the table.
    pub fn used(&self) -> usize {
        self.lock().index.len()
    }

    fn expired(&self, e: &Entry, now: u32) -> bool {
        self.expire_ms > 0 && e.refs == 0 && now.wrapping_sub(e.touched) >= self.expire_ms
    }

    /// The live slot of `key`, an expired entry being removed on the way.
    fn find(&self, inner: &mut Inner, key: &Key, now: u32) -> Option<u32> {
        let slot = *inner.index.get(key)?;
        let e = inner.entry(slot)?;
        if self.expired(e, now) {
            inner.remove(slot);
            return None;
        }
        Some(slot)
    }

    /// The slot of `key`, created (evicting if full) when absent, touched.
    fn get_or_create(&self, inner: &mut Inner, key: &Key, now: u32) -> Option<u32> {
        if let Some(slot) = self.find(inner, key, now) {
            inner.touch(slot, now);
            return Some(slot);
        }
        if inner.index.len() >= self.spec.size && !self.make_room(inner, now) {
            return None;
        }
        Some(inner.insert(key.clone(), now))
    }

    /// Frees one entry of a full table: an expired one, else the least
    /// recently touched untracked one. False when none may go.
    fn make_room(&self, inner: &mut Inner, now: u32) -> bool {
        if self.spec.nopurge {
            // Expired entries go even so: they are no longer in the table.
            let tail = inner.tail;
            return match inner.entry(tail) {
                Some(e) if self.expired(e, now) => {
                    inner.remove(tail);
                    true
                }
                _ => false,
            };
        }
        let mut at = inner.tail;
        for _ in 0..EVICT_SCAN_MAX {
            let Some(e) = inner.entry(at) else {
                return false;
            };
            if e.refs == 0 {
                inner.remove(at);
                return true;
            }
            at = e.prev;
        }
        false
    }

    /// A new flow tracks `key`: the entry is created if needed and
    /// referenced, its `conn_cnt`, `conn_cur` and `conn_rate` count the
    /// connection. `None` when the table cannot hold the key.
    pub fn track(&self, key: &Key, now: u32) -> Option<u32> {
        let st = &self.spec.store;
        let mut inner = self.lock();
        let slot = self.get_or_create(&mut inner, key, now)?;
        let e = inner.entry_mut(slot)?;
        e.refs += 1;
        let d = &mut e.data;
        if st.has(DataType::ConnCnt) {
            d.conn_cnt = d.conn_cnt.wrapping_add(1);
        }
        if st.has(DataType::ConnCur) {
            d.conn_cur = d.conn_cur.wrapping_add(1);
        }
        if st.has(DataType::ConnRate) {
            d.conn_rate.add(now, st.period(DataType::ConnRate), 1);
        }
        Some(slot)
    }

    /// The tracked connection became a session: `sess_cnt`, `sess_rate`.
    pub fn session(&self, slot: u32, now: u32) {
        let st = &self.spec.store;
        let mut inner = self.lock();
        let Some(e) = inner.entry_mut(slot) else {
            return;
        };
        if st.has(DataType::SessCnt) {
            e.data.sess_cnt = e.data.sess_cnt.wrapping_add(1);
        }
        if st.has(DataType::SessRate) {
            e.data.sess_rate.add(now, st.period(DataType::SessRate), 1);
        }
    }

    /// The flow tracking `slot` ends, having moved `bytes_in` from the
    /// client and `bytes_out` to it: `conn_cur` drops, the bytes count, the
    /// reference goes and the entry is touched (its `expire` runs from now).
    pub fn release(&self, slot: u32, now: u32, bytes_in: u64, bytes_out: u64) {
        let st = &self.spec.store;
        let mut inner = self.lock();
        let Some(e) = inner.entry_mut(slot) else {
            return;
        };
        e.refs = e.refs.saturating_sub(1);
        let d = &mut e.data;
        if st.has(DataType::ConnCur) {
            d.conn_cur = d.conn_cur.saturating_sub(1);
        }
        if st.has(DataType::BytesInCnt) {
            d.bytes_in_cnt = d.bytes_in_cnt.wrapping_add(bytes_in);
        }
        if st.has(DataType::BytesOutCnt) {
            d.bytes_out_cnt = d.bytes_out_cnt.wrapping_add(bytes_out);
        }
        inner.touch(slot, now);
    }

    /// A fetch on the entry in `slot`: `None` when the table does not store
    /// what it reads (the fetch fails, as HAProxy's).
    pub fn fetch(&self, slot: u32, what: StickFetch, now: u32) -> Option<i64> {
        let mut inner = self.lock();
        let e = inner.entry_mut(slot)?;
        self.fetch_in(&mut e.data, what, now)
    }

    /// A `src_*` fetch: the entry of `key`, 0 when there is none.
    pub fn fetch_key(&self, key: &Key, what: StickFetch, now: u32) -> Option<i64> {
        let mut inner = self.lock();
        let Some(slot) = self.find(&mut inner, key, now) else {
            let t = fetch_type(what);
            return self.spec.store.has(t).then_some(0);
        };
        let e = inner.entry_mut(slot)?;
        self.fetch_in(&mut e.data, what, now)
    }

    fn fetch_in(&self, d: &mut Data, what: StickFetch, now: u32) -> Option<i64> {
        let st = &self.spec.store;
        let t = fetch_type(what);
        match what {
            // HAProxy's `inc_gpc0` counts in the rate too, and works when
            // only one of the two is stored.
            StickFetch::IncGpc0 => {
                if !st.has(DataType::Gpc0) && !st.has(DataType::Gpc0Rate) {
                    return None;
                }
                if st.has(DataType::Gpc0Rate) {
                    d.gpc0_rate.add(now, st.period(DataType::Gpc0Rate), 1);
                }
                if st.has(DataType::Gpc0) {
                    d.gpc0 = d.gpc0.wrapping_add(1);
                }
                return Some(i64::from(d.gpc0));
            }
            StickFetch::ClrGpc0 => {
                if !st.has(DataType::Gpc0) {
                    return None;
                }
                return Some(i64::from(std::mem::take(&mut d.gpc0)));
            }
            _ => {}
        }
        if !st.has(t) {
            return None;
        }
        d.value(t, st, now)
            .map(|v| i64::try_from(v).unwrap_or(i64::MAX))
    }

    /// `stick match`: the server id stored for `key`, when there is one.
    pub fn server_of(&self, key: &Key, now: u32) -> Option<i32> {
        let mut inner = self.lock();
        let slot = self.find(&mut inner, key, now)?;
        let id = inner.entry(slot)?.data.server_id;
        (id > 0).then_some(id)
    }

    /// `stick store-request`: `key` goes to server `id` named `name`. A
    /// full `nopurge` table keeps what it has. The name is copied only when
    /// it changes, so a flow that sticks where it was allocates nothing.
    pub fn store_server(&self, key: &Key, now: u32, id: i32, name: &str) {
        let mut inner = self.lock();
        let Some(slot) = self.get_or_create(&mut inner, key, now) else {
            return;
        };
        if let Some(e) = inner.entry_mut(slot) {
            e.data.server_id = id;
            if e.data.server_key.as_deref() != Some(name) {
                e.data.server_key = Some(name.into());
            }
        }
    }

    /// `set table`: `key`'s entry (created if absent) gets `values`. False
    /// when the table is full and nothing may go.
    pub fn set(&self, key: &Key, values: &[(DataType, i64)], now: u32) -> bool {
        let mut inner = self.lock();
        let Some(slot) = self.get_or_create(&mut inner, key, now) else {
            return false;
        };
        if let Some(e) = inner.entry_mut(slot) {
            for (t, v) in values {
                e.data.set(*t, *v, now);
            }
        }
        true
    }

    /// Entries in key order, those `keep` accepts, expired ones left out.
    pub fn snapshot(&self, now: u32, keep: &dyn Fn(&Key, &Data) -> bool) -> Vec<EntryView> {
        let inner = self.lock();
        let mut out: Vec<EntryView> = inner
            .index
            .values()
            .filter_map(|&slot| inner.entry(slot).map(|e| (slot, e)))
            .filter(|(_, e)| !self.expired(e, now) && keep(&e.key, &e.data))
            .map(|(slot, e)| EntryView {
                id: self.entry_id(slot),
                key: e.key.clone(),
                refs: e.refs,
                exp: if self.expire_ms == 0 {
                    0
                } else {
                    self.expire_ms.saturating_sub(now.wrapping_sub(e.touched))
                },
                data: e.data.clone(),
            })
            .collect();
        drop(inner);
        out.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// An id for `show table` (HAProxy prints the entry's address): stable
    /// while the entry lives, distinct across tables.
    fn entry_id(&self, slot: u32) -> u64 {
        const BASE: u64 = 0x5600_0000_0000;
        BASE + ((self.pos as u64) << 32) + (u64::from(slot) << 6)
    }

    /// `clear table`: removes the untracked entries `pick` accepts; the
    /// number removed.
    pub fn clear(&self, now: u32, pick: &dyn Fn(&Key, &Data) -> bool) -> usize {
        let mut inner = self.lock();
        let doomed: Vec<u32> = inner
            .index
            .values()
            .copied()
            .filter(|&s| {
                inner
                    .entry(s)
                    .is_some_and(|e| e.refs == 0 && (self.expired(e, now) || pick(&e.key, &e.data)))
            })
            .collect();
        for s in &doomed {
            inner.remove(*s);
        }
        doomed.len()
    }

    /// Removes up to `max` expired entries from the LRU tail; how many went.
    pub fn purge(&self, now: u32, max: usize) -> usize {
        if self.expire_ms == 0 {
            return 0;
        }
        let mut inner = self.lock();
        let mut n = 0;
        let mut at = inner.tail;
        let mut looked = 0;
        while n < max && looked < max.saturating_mul(2) {
            let Some(e) = inner.entry(at) else { break };
            let prev = e.prev;
            if now.wrapping_sub(e.touched) < self.expire_ms {
                // Everything nearer the head was touched later.
                break;
            }
            if e.refs == 0 {
                inner.remove(at);
                n += 1;
            }
            looked += 1;
            at = prev;
        }
        n
    }
}

/// The data type a fetch reads.
fn fetch_type(what: StickFetch) -> DataType {
    match what {
        StickFetch::ConnCnt => DataType::ConnCnt,
        StickFetch::ConnCur => DataType::ConnCur,
        StickFetch::ConnRate => DataType::ConnRate,
        StickFetch::SessCnt => DataType::SessCnt,
        StickFetch::SessRate => DataType::SessRate,
        StickFetch::GetGpc0 | StickFetch::IncGpc0 | StickFetch::ClrGpc0 => DataType::Gpc0,
        StickFetch::Gpc0Rate => DataType::Gpc0Rate,
        StickFetch::GetGpt0 => DataType::Gpt0,
    }
}

impl Inner {
    fn entry(&self, slot: u32) -> Option<&Entry> {
        self.slots.get(slot as usize)?.as_ref()
    }

    fn entry_mut(&mut self, slot: u32) -> Option<&mut Entry> {
        self.slots.get_mut(slot as usize)?.as_mut()
    }

    fn unlink(&mut self, slot: u32) {
        let Some((prev, next)) = self.entry(slot).map(|e| (e.prev, e.next)) else {
            return;
        };
        match self.entry_mut(prev) {
            Some(p) => p.next = next,
            None => self.head = next,
        }
        match self.entry_mut(next) {
            Some(n) => n.prev = prev,
            None => self.tail = prev,
        }
    }

    fn push_front(&mut self, slot: u32) {
        let old = self.head;
        if let Some(e) = self.entry_mut(slot) {
            e.prev = NIL;
            e.next = old;
        }
        match self.entry_mut(old) {
            Some(h) => h.prev = slot,
            None => self.tail = slot,
        }
        self.head = slot;
    }

    fn touch(&mut self, slot: u32, now: u32) {
        if self.head != slot {
            self.unlink(slot);
            self.push_front(slot);
        }
        if let Some(e) = self.entry_mut(slot) {
            e.touched = now;
        }
    }

    fn insert(&mut self, key: Key, now: u32) -> u32 {
        let e = Entry {
            key: key.clone(),
            data: Data::default(),
            refs: 0,
            touched: now,
            prev: NIL,
            next: NIL,
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(e);
                s
            }
            None => {
                // `size` is bounded far below u32::MAX by the parser.
                self.slots.push(Some(e));
                u32::try_from(self.slots.len() - 1).unwrap_or(NIL)
            }
        };
        self.index.insert(key, slot);
        self.push_front(slot);
        slot
    }

    fn remove(&mut self, slot: u32) {
        self.unlink(slot);
        if let Some(e) = self.slots.get_mut(slot as usize).and_then(Option::take) {
            self.index.remove(&e.key);
            self.free.push(slot);
        }
    }
}
