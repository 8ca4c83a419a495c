//! Maps: files of `key value` lines that route flows (`use_backend %[src,map_ip(FILE)]`,
//! `use_backend %[req.ssl_sni,map(FILE)]` / `map_dom`) and that the CLI edits at run time.
//!
//! A map's kind ([`MapKind`]: IP or string keys) is fixed by the rules that use it; the
//! configuration refuses a file used as both. Every key the CLI sends is read as that
//! kind (`config::mapfile::key`).
//!
//! The map file format (HAProxy's: one `key value` per line, blank lines and lines
//! starting with `#` ignored, the value is the rest of the line) is read by
//! configuration (`config::mapfile`, re-exported here). Owns the registry of loaded
//! maps with their ids (`#0`, `#1`… in load order, one per distinct file) and every
//! runtime change to them. The CLI's dispatch is the only caller of the changing methods.
//!
//! Concurrency: each map's current version is an `Arc<Table>` in an `ArcSwap`. A flow
//! reads it with one lock-free load; a change takes the map's writer lock (CLI only,
//! never the flow path), builds the next version from the current one (path copy, see
//! `table.rs`) and stores it. Race window: a flow that loaded the previous version just
//! before the store routes by it; the next flow sees the change. Flows already
//! forwarding never look at maps again, so a change never disturbs them.
//!
//! Deferred publication (batches): while a [`Deferred`] guard from [`Maps::defer`] is
//! alive, changes go to a private staged version of the map, which only its writer
//! touches, so a run of `add map` copies each radix path once instead of once per add.
//! The staged version is published by [`Maps::publish`] (the CLI calls it before it
//! writes any acknowledgement), by any CLI read ([`MapRt::table`]), after
//! [`PUBLISH_EVERY`] staged changes, and when the last guard drops. So a change is
//! visible to flows at the latest when its acknowledgement leaves the process, and
//! no staged change outlives its guard. Without a guard every change publishes at once.
//!
//! Versions (HAProxy 2.6's atomic replacement): a map has a current version number
//! `curr_ver` (what flows use) and the last number handed out, `next_ver`, both 0 at
//! start and wrapping at 2^32 as HAProxy's generations do. `prepare map` reserves the
//! next number; `add map @V` / `clear map @V` / `show map @V` work on version V, which
//! is the live table when V is current and otherwise a private [`Table`] no flow ever
//! reads; `commit map @V` (curr_ver < V <= next_ver) makes V's table the live one with
//! one `ArcSwap` store and discards V's predecessors (the old live table included,
//! with any change staged for it). Versions prepared after V survive the commit.

pub mod table;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwap;

use crate::config::{Config, MapSource, NameMatch};

pub use crate::config::mapfile::{
    key, load_file, net, parse_text, parse_text_as, split_entry, BadIpKey, FileEntry, IpNet,
    MapFileError, MapKey, MapKind,
};
pub use table::{Entry, Table};

/// Base of the fake entry addresses `show map` prints (HAProxy prints a pointer there).
const PTR_BASE: u64 = 0x55d0_0000_0000;
/// Distance between two fake entry addresses (the size of HAProxy's element, roughly).
const PTR_STRIDE: u64 = 0x90;
/// Most staged changes of one map before they are published even mid-batch, which
/// bounds how far flows can lag behind an acknowledged-soon batch.
pub const PUBLISH_EVERY: usize = 64 * 1024;

/// A refused runtime change; texts are HAProxy's (the CLI adds the final `.` and `\n`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error("{0}")]
    BadKey(#[from] BadIpKey),
    /// `set map` on a key that has no entry.
    #[error("entry not found")]
    EntryNotFound,
    /// `del map` on a key that has no entry.
    #[error("Key not found")]
    KeyNotFound,
    /// A payload line without a value.
    #[error("Missing value for key '{0}'")]
    MissingValue(String),
    /// `add map @V` with V beyond the last `prepare map`.
    #[error("Version number in the future, please use 'prepare map' before")]
    VersionInFuture,
    /// `commit map @V` with V not in curr_ver+1..=next_ver.
    #[error("Version number out of range")]
    VersionOutOfRange,
}

/// One loaded map.
#[derive(Debug)]
pub struct MapRt {
    /// `#id` as `show map` lists it.
    pub id: usize,
    /// What the keys are.
    pub kind: MapKind,
    /// The file name, as written in the configuration.
    pub path: String,
    /// Where the configuration first uses it, for `show map`.
    pub used_file: String,
    pub used_line: usize,
    current: ArcSwap<Table>,
    /// Serialises writers (CLI connections) and holds the staged version; the flow path
    /// never takes it.
    write: Mutex<Staged>,
}

/// The writer side of a map: the next version while publication is deferred, and the
/// prepared versions.
#[derive(Debug, Default)]
struct Staged {
    next: Option<Table>,
    /// Changes in `next` not yet published.
    changes: usize,
    /// Version number of the live table.
    curr_ver: u32,
    /// Last version number `prepare map` handed out.
    next_ver: u32,
    /// Tables of versions other than the current one that received entries (or a
    /// `clear`), by number. Never read by flows.
    versions: BTreeMap<u32, Table>,
}

/// Whether version `a` comes after version `b` (HAProxy's wrapping comparison).
fn ver_after(a: u32, b: u32) -> bool {
    // Reinterpreting the wrapped difference as signed is the comparison itself.
    (a.wrapping_sub(b) as i32) > 0
}

/// A map version as the CLI names it, `@N`: HAProxy reads the leading digits and
/// ignores the rest (no digits reads as 0), wrapping as its `str2uic` does.
pub fn parse_version(word: &str) -> u32 {
    word.bytes()
        .take_while(u8::is_ascii_digit)
        .fold(0u32, |v, b| {
            v.wrapping_mul(10).wrapping_add(u32::from(b - b'0'))
        })
}

impl MapRt {
    /// The current version, with any staged change published first (so a CLI read
    /// sees every change made before it).
    pub fn table(&self) -> Arc<Table> {
        self.publish();
        self.current.load_full()
    }

    /// Publish the staged version, if any.
    pub fn publish(&self) {
        let mut w = self.write.lock().unwrap_or_else(|e| e.into_inner());
        self.publish_locked(&mut w);
    }

    fn publish_locked(&self, w: &mut Staged) {
        if let Some(next) = w.next.take() {
            self.current.store(Arc::new(next));
        }
        w.changes = 0;
    }

    /// The line `show map` prints for this map (without the final `\n`).
    pub fn describe(&self) -> String {
        let (curr, next) = self.versions();
        format!(
            "{} ({}) pattern loaded from file '{}' used by map at file '{}' line {}. curr_ver={curr} next_ver={next} entry_cnt={}",
            self.id,
            self.path,
            self.path,
            self.used_file,
            self.used_line,
            self.table().len()
        )
    }

    /// `(curr_ver, next_ver)`.
    pub fn versions(&self) -> (u32, u32) {
        let w = self.write.lock().unwrap_or_else(|e| e.into_inner());
        (w.curr_ver, w.next_ver)
    }

    /// Version `ver` of the map: the live table (staged changes published first) when
    /// it is the current version, else that version's private table (empty if nothing
    /// was added to it).
    pub fn table_at(&self, ver: u32) -> Arc<Table> {
        let mut w = self.write.lock().unwrap_or_else(|e| e.into_inner());
        if ver == w.curr_ver {
            self.publish_locked(&mut w);
            return self.current.load_full();
        }
        Arc::new(
            w.versions
                .get(&ver)
                .cloned()
                .unwrap_or_else(|| Table::new(self.kind)),
        )
    }

    /// Apply `f` to version `ver`: the live table (see [`MapRt::update`]) when current,
    /// else the version's private table, created empty on first use.
    /// Refuse a version beyond `next_ver`, as HAProxy's `add map @V` does.
    fn check_version(&self, ver: Option<u32>) -> Result<(), MapError> {
        match ver {
            Some(v) if ver_after(v, self.versions().1) => Err(MapError::VersionInFuture),
            _ => Ok(()),
        }
    }

    /// A version beyond `next_ver` is refused (checked again under the lock).
    fn update_at<R>(
        &self,
        ver: Option<u32>,
        defer: bool,
        f: impl FnOnce(&mut Table) -> R,
    ) -> Result<R, MapError> {
        let mut w = self.write.lock().unwrap_or_else(|e| e.into_inner());
        match ver {
            Some(v) if ver_after(v, w.next_ver) => Err(MapError::VersionInFuture),
            Some(v) if v != w.curr_ver => {
                let t = w.versions.entry(v).or_insert_with(|| Table::new(self.kind));
                Ok(f(t))
            }
            _ => Ok(self.update_locked(&mut w, defer, f)),
        }
    }

    /// Apply `f` to the next version and publish it, unless publication is deferred
    /// (`defer`); `f`'s result is returned.
    fn update<R>(&self, defer: bool, f: impl FnOnce(&mut Table) -> R) -> R {
        let mut w = self.write.lock().unwrap_or_else(|e| e.into_inner());
        self.update_locked(&mut w, defer, f)
    }

    fn update_locked<R>(&self, w: &mut Staged, defer: bool, f: impl FnOnce(&mut Table) -> R) -> R {
        let next = w
            .next
            .get_or_insert_with(|| Table::clone(&self.current.load()));
        let r = f(next);
        w.changes += 1;
        if !defer || w.changes >= PUBLISH_EVERY {
            self.publish_locked(w);
        }
        r
    }

    /// `prepare map`: reserve the next version number.
    pub fn prepare(&self) -> u32 {
        let mut w = self.write.lock().unwrap_or_else(|e| e.into_inner());
        w.next_ver = w.next_ver.wrapping_add(1);
        w.next_ver
    }

    /// `commit map @ver`: make version `ver` (curr_ver < ver <= next_ver) the live
    /// table in one store, and drop every version before it.
    pub fn commit(&self, ver: u32) -> Result<(), MapError> {
        let mut w = self.write.lock().unwrap_or_else(|e| e.into_inner());
        // HAProxy's window test, in wrapping arithmetic: curr < ver <= next.
        let window = w.next_ver.wrapping_sub(w.curr_ver);
        if ver.wrapping_sub(w.curr_ver.wrapping_add(1)) >= window {
            return Err(MapError::VersionOutOfRange);
        }
        let table = w
            .versions
            .remove(&ver)
            .unwrap_or_else(|| Table::new(self.kind));
        // Changes staged for the outgoing table die with it. The outgoing table and
        // the older versions are freed off the worker: with large maps (and many
        // prepared versions) that is tens of milliseconds of work.
        let staged = w.next.take();
        w.changes = 0;
        let old = self.current.swap(Arc::new(table));
        w.curr_ver = ver;
        let (keep, stale): (BTreeMap<u32, Table>, BTreeMap<u32, Table>) =
            std::mem::take(&mut w.versions)
                .into_iter()
                .partition(|&(v, _)| ver_after(v, ver));
        w.versions = keep;
        drop_later(Box::new((old, stale, staged)));
        Ok(())
    }
}

thread_local! {
    /// Set on the `shunt-drop` thread: what it drops is not sent again.
    static DROP_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Give the calling thread the lowest CPU priority: `SCHED_IDLE` (a worker that
/// wakes takes the CPU back at once; a nice-19 thread could still hold it for a
/// scheduler slice, milliseconds), or nice 19 where that is refused. Freeing
/// garbage must only use what the workers leave. Best effort.
fn lowest_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler(0, ...) changes the calling thread's policy only;
    // it reads `param`, a valid struct on our stack.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0 {
        return;
    }
    // SAFETY: setpriority with PRIO_PROCESS and who 0 changes the calling thread's
    // nice value only (on Linux the "process" is the calling thread); it reads no
    // memory of ours.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, DROP_NICE) };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "shunt-drop: cannot lower priority");
    }
}

/// Nice value of the `shunt-drop` thread where `SCHED_IDLE` is refused.
const DROP_NICE: libc::c_int = 19;

/// Most garbage items waiting for the `shunt-drop` thread. At the lowest priority
/// it may fall behind on a saturated machine; beyond this the caller frees its
/// own garbage, so memory stays bounded.
const DROP_BACKLOG_MAX: usize = 256;

/// Garbage items sent to the `shunt-drop` thread and not yet freed.
///
/// Process-wide, with the thread's sender in [`drop_later`], because the
/// caller that needs both is `Table`'s `Drop`: the last reference to a large
/// version drops wherever it happens to be (a flow's lookup guard, a finished
/// dump, a commit), with no runtime or `Maps` in reach to carry a handle, and
/// every `Maps` of the process shares the one low-priority thread.
static DROP_BACKLOG: AtomicUsize = AtomicUsize::new(0);

/// Whether this thread is the `shunt-drop` thread.
pub fn on_drop_thread() -> bool {
    DROP_THREAD.with(std::cell::Cell::get)
}

/// Free `garbage` on a background thread (`shunt-drop`) instead of the calling
/// worker: dropping a large table walks every entry. Falls back to dropping here if
/// the thread cannot be started.
pub fn drop_later(garbage: Box<dyn Send>) {
    type Dropper = Option<Mutex<std::sync::mpsc::Sender<Box<dyn Send>>>>;
    // Process-wide for the reason given at `DROP_BACKLOG`: reached from a
    // `Drop` with no context; started on first use.
    static DROPPER: OnceLock<Dropper> = OnceLock::new();
    let tx = DROPPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Box<dyn Send>>();
        std::thread::Builder::new()
            .name("shunt-drop".into())
            .spawn(move || {
                DROP_THREAD.with(|d| d.set(true));
                lowest_priority();
                for g in rx {
                    drop(g);
                    DROP_BACKLOG.fetch_sub(1, Ordering::Relaxed);
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    });
    let Some(tx) = tx else {
        return;
    };
    if DROP_BACKLOG.fetch_add(1, Ordering::Relaxed) >= DROP_BACKLOG_MAX {
        // The thread is behind: free it here (bounded memory beats latency).
        DROP_BACKLOG.fetch_sub(1, Ordering::Relaxed);
        drop(garbage);
        return;
    }
    let tx = tx.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(back) = tx.send(garbage) {
        DROP_BACKLOG.fetch_sub(1, Ordering::Relaxed);
        drop(back.0);
    }
}

/// While alive, map changes are staged rather than published one by one (see the
/// module header). Dropping the last guard publishes everything staged.
#[must_use = "publication is deferred only while the guard lives"]
pub struct Deferred<'a> {
    maps: &'a Maps,
}

impl Drop for Deferred<'_> {
    fn drop(&mut self) {
        self.maps.deferring.fetch_sub(1, Ordering::AcqRel);
        self.maps.publish();
    }
}

/// The fake address `show map` prints for an entry: stable for the entry's life.
pub fn entry_ptr(e: &Entry) -> u64 {
    PTR_BASE + e.seq * PTR_STRIDE
}

/// Every loaded map, and the backend names their values may designate.
#[derive(Debug, Default)]
pub struct Maps {
    maps: Vec<MapRt>,
    backends: HashMap<String, usize>,
    seq: AtomicU64,
    /// Live [`Deferred`] guards.
    deferring: AtomicUsize,
}

impl Maps {
    /// The maps the configuration loaded, with their initial entries.
    pub fn new(config: &Config) -> Self {
        let mut maps = Maps {
            maps: Vec::with_capacity(config.maps.len()),
            backends: config
                .backends
                .iter()
                .enumerate()
                .map(|(i, b)| (b.name.clone(), i))
                .collect(),
            seq: AtomicU64::new(0),
            deferring: AtomicUsize::new(0),
        };
        for (id, src) in config.maps.iter().enumerate() {
            let rt = maps.build(id, src, config.map_kind(id));
            maps.maps.push(rt);
        }
        maps
    }

    fn build(&self, id: usize, src: &MapSource, kind: MapKind) -> MapRt {
        let mut table = Table::new(kind);
        for e in &src.entries {
            let entry = self.entry(&e.key, &e.value);
            table.add(&e.pattern, entry);
        }
        MapRt {
            id,
            kind,
            path: src.path.clone(),
            used_file: src.used_at.file.clone(),
            used_line: src.used_at.line,
            current: ArcSwap::from_pointee(table),
            write: Mutex::new(Staged::default()),
        }
    }

    fn entry(&self, key: &str, value: &str) -> Entry {
        Entry {
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            key: Arc::from(key),
            value: Arc::from(value),
            target: self.backends.get(value).copied(),
        }
    }

    /// Defer publication of changes while the guard lives (a CLI connection holds one
    /// and calls [`Maps::publish`] before writing acknowledgements).
    pub fn defer(&self) -> Deferred<'_> {
        self.deferring.fetch_add(1, Ordering::AcqRel);
        Deferred { maps: self }
    }

    /// Publish every map's staged changes.
    pub fn publish(&self) {
        for m in &self.maps {
            m.publish();
        }
    }

    fn deferred(&self) -> bool {
        self.deferring.load(Ordering::Acquire) > 0
    }

    /// Every map, by id.
    pub fn iter(&self) -> impl Iterator<Item = &MapRt> {
        self.maps.iter()
    }

    /// A map by index (its id).
    pub fn get(&self, id: usize) -> Option<&MapRt> {
        self.maps.get(id)
    }

    /// A map named as the CLI names it: `#ID` or its file name.
    pub fn find(&self, name: &str) -> Option<&MapRt> {
        match name.strip_prefix('#') {
            Some(id) => id.parse::<usize>().ok().and_then(|i| self.maps.get(i)),
            None => self.maps.iter().find(|m| m.path == name),
        }
    }

    /// Route lookup for a flow: `None` when no key matches `ip`, else the matched
    /// entry's backend (`Some(None)` when its value names no backend). Lock-free.
    pub fn route(&self, id: usize, ip: IpAddr) -> Option<Option<usize>> {
        let map = self.maps.get(id)?;
        let t = map.current.load();
        t.lookup(ip).map(|e| e.target)
    }

    /// Route lookup by TLS server name in string map `id`: exact (`map`), by domain
    /// suffix (`map_dom`) or by prefix (`map_beg`). Same answers as [`Maps::route`].
    /// Lock-free.
    pub fn route_name(&self, id: usize, name: &str, how: NameMatch) -> Option<Option<usize>> {
        let map = self.maps.get(id)?;
        let t = map.current.load();
        let hit = match how {
            NameMatch::Dom => t.lookup_dom(name),
            NameMatch::Exact => t.lookup_str(name),
            NameMatch::Beg => t.lookup_beg(name),
        };
        hit.map(|e| e.target)
    }

    /// `add map`: one entry.
    pub fn add(&self, map: &MapRt, key: &str, value: &str) -> Result<(), MapError> {
        self.add_at(map, None, key, value)
    }

    /// `add map [@ver]`: one entry, to version `ver` (the current one when `None`).
    pub fn add_at(
        &self,
        map: &MapRt,
        ver: Option<u32>,
        key: &str,
        value: &str,
    ) -> Result<(), MapError> {
        // HAProxy refuses a future version before it looks at the key.
        map.check_version(ver)?;
        let net = MapKey::parse(map.kind, key)?;
        let entry = self.entry(key, value);
        map.update_at(ver, self.deferred(), |t| t.add(net, entry))
    }

    /// `add map MAP <<` payload: `key value` lines, applied in one version. Lines before
    /// a bad one stay applied (as HAProxy, which stops at the first error).
    pub fn add_payload(&self, map: &MapRt, payload: &str) -> Result<(), MapError> {
        self.add_payload_at(map, None, payload)
    }

    /// `add map [@ver] MAP <<`: [`Maps::add_payload`] to version `ver`.
    pub fn add_payload_at(
        &self,
        map: &MapRt,
        ver: Option<u32>,
        payload: &str,
    ) -> Result<(), MapError> {
        // HAProxy checks the version before reading the payload.
        map.check_version(ver)?;
        let mut err = None;
        let mut batch = Vec::new();
        for line in payload.lines() {
            let Some((key, value)) = split_entry(line) else {
                continue;
            };
            if value.is_empty() {
                err = Some(MapError::MissingValue(key.to_string()));
                break;
            }
            match MapKey::parse(map.kind, key) {
                Ok(net) => batch.push((net, self.entry(key, value))),
                Err(e) => {
                    err = Some(e.into());
                    break;
                }
            }
        }
        if !batch.is_empty() {
            map.update_at(ver, self.deferred(), |t| {
                for (net, e) in batch {
                    t.add(net, e);
                }
            })?;
        }
        err.map_or(Ok(()), Err)
    }

    /// `set map`: change the value of every entry of `key` (or of the entry `#<ref>`).
    pub fn set(&self, map: &MapRt, key: &str, value: &str) -> Result<(), MapError> {
        let value: Arc<str> = Arc::from(value);
        let target = self.backends.get(&*value).copied();
        if let Some(seq) = parse_ref(key) {
            let found = map
                .table()
                .iter()
                .find(|(_, e)| e.seq == seq)
                .map(|(n, _)| n.clone());
            let Some(net) = found else {
                return Err(MapError::EntryNotFound);
            };
            // The referenced entry's key is set (its duplicates with it).
            return map.update(self.deferred(), |t| {
                if t.set(&net, &value, target) {
                    Ok(())
                } else {
                    Err(MapError::EntryNotFound)
                }
            });
        }
        let net = MapKey::parse(map.kind, key).map_err(|_| MapError::EntryNotFound)?;
        map.update(self.deferred(), |t| {
            if t.set(&net, &value, target) {
                Ok(())
            } else {
                Err(MapError::EntryNotFound)
            }
        })
    }

    /// `del map`: remove every entry of `key`, or the one entry `#<ref>`.
    pub fn del(&self, map: &MapRt, key: &str) -> Result<(), MapError> {
        if let Some(seq) = parse_ref(key) {
            return map.update(self.deferred(), |t| {
                if t.remove_seq(seq) {
                    Ok(())
                } else {
                    Err(MapError::KeyNotFound)
                }
            });
        }
        let net = MapKey::parse(map.kind, key).map_err(|_| MapError::KeyNotFound)?;
        map.update(self.deferred(), |t| {
            if t.remove(&net) {
                Ok(())
            } else {
                Err(MapError::KeyNotFound)
            }
        })
    }

    /// `clear map`: remove every entry.
    pub fn clear(&self, map: &MapRt) {
        map.update(self.deferred(), |t| *t = Table::new(map.kind));
    }

    /// `clear map @ver`: remove every entry of version `ver` (the live table when it
    /// is the current version). Any version may be cleared, as in HAProxy.
    pub fn clear_at(&self, map: &MapRt, ver: u32) {
        let mut w = map.write.lock().unwrap_or_else(|e| e.into_inner());
        if ver == w.curr_ver {
            map.update_locked(&mut w, self.deferred(), |t| *t = Table::new(map.kind));
        } else {
            w.versions.remove(&ver);
        }
    }
}

/// `#0x…` (a pointer `show map` printed) → the entry's `seq`.
fn parse_ref(key: &str) -> Option<u64> {
    let hex = key.strip_prefix("#0x").or_else(|| key.strip_prefix("#"))?;
    let ptr = u64::from_str_radix(hex, 16).ok()?;
    let off = ptr.checked_sub(PTR_BASE)?;
    (off % PTR_STRIDE == 0).then_some(off / PTR_STRIDE)
}
