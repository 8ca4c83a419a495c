//! One version of a map: a persistent, sharded hash table with longest-prefix match
//! (IP keys) and exact and domain-suffix match (string keys).
//!
//! Owns the entries of a map version and the longest-prefix lookup the flow path runs.
//!
//! Structure, and why: readers (every new flow) must never lock, so a map is published
//! as an immutable [`Table`] behind an `ArcSwap`; a CLI change builds the next version
//! and swaps it in. Copying a whole 1M-entry table per `add map` would make a stream of
//! adds quadratic, so a table is a fixed two-level radix of `Arc`s over the key's hash
//! ([`FANOUT`] × [`FANOUT`] leaves, each a small `HashMap`). A change copies only its
//! path — two arrays of [`FANOUT`] pointers and one leaf (about n / 65536 keys, one
//! reference count each: a key's entries are an `Arc<Vec<Entry>>`) — and
//! shares everything else with the previous version (`Arc::make_mut` copy-on-write).
//!
//! Longest-prefix match: entries are hashed by their normalised network; the table keeps
//! how many keys exist per prefix length and probes the present lengths from longest to
//! shortest. A lookup therefore costs one hash probe per distinct prefix length in use
//! (typically one to a handful), independent of the number of entries.
//!
//! String keys (`map`, `map_dom`): an exact lookup is one probe; a domain lookup probes
//! the whole name, then each suffix that follows a dot (`a.b.c`, `b.c`, `c`), so it
//! costs one probe per label.
//!
//! Duplicates: as in HAProxy, `add map` with a key already present adds a second entry
//! (shown by `show map`); lookups return the oldest one; `set map` changes all of them and
//! `del map` removes all of them.
//!
//! Invariants: `count[len]` is the number of distinct keys of that prefix length held in
//! the leaves; `lens_v4`/`lens_v6` list exactly the lengths with a non-zero count, longest
//! first; every key's entry list is non-empty and ordered by `seq`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use super::key::{MapKey, MapKind};
use super::net::{IpNet, V4_BITS, V6_BITS};

/// Bits of the key hash consumed per radix level: 256 × 256 leaves, so a leaf
/// of a 1M-entry map holds ~15 keys and the copy an `add map` makes of it is
/// small (with 64 × 64, ~244 keys: a stream of 1M adds spent 25 % of its time
/// cloning leaves and 16 % clearing the pages of those clones; 105–112k adds/s
/// against 157–166k with 256, and 420 against 306 bytes of RSS per entry
/// after the stream). Within a deferred batch (`maps`), the two nodes of a
/// path are copied once, so a larger node costs little.
const FANOUT_BITS: u32 = 8;
/// Most labels a domain lookup probes (a DNS name has at most 127).
const MAX_LABELS: usize = 128;
/// Children per radix node (256: a copied node is 2 KiB of pointers).
pub const FANOUT: usize = 1 << FANOUT_BITS;

/// One map entry as loaded or added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Process-wide insertion number: orders `show map` and makes the fake pointer.
    pub seq: u64,
    /// The key as written (shown by `show map` and `get map`).
    pub key: Arc<str>,
    pub value: Arc<str>,
    /// The backend the value names, resolved when the entry is written.
    pub target: Option<usize>,
}

/// A key's entries sit behind an `Arc` so copying a leaf (path copy) costs one
/// reference count per key, not one allocation per key.
type Leaf = HashMap<MapKey, Arc<Vec<Entry>>>;
type Mid = [Arc<Leaf>; FANOUT];

/// An immutable-once-published version of one map.
#[derive(Debug, Clone)]
pub struct Table {
    root: Arc<[Arc<Mid>; FANOUT]>,
    /// Keys per prefix length: 0..=32 for IPv4, 33.. for IPv6 (offset by 33).
    count: Arc<[u32; 33 + 129]>,
    lens_v4: Vec<u8>,
    lens_v6: Vec<u8>,
    /// Entries (not keys) held.
    entries: usize,
    kind: MapKind,
}

/// From this many entries, a table's last owner hands its contents to the
/// `shunt-drop` thread instead of freeing them itself (a worker must not spend
/// milliseconds freeing a map it happened to hold last).
pub const DROP_LATER_ENTRIES: usize = 1024;

impl Drop for Table {
    fn drop(&mut self) {
        // The last reference to a big version may be dropped anywhere: by a flow's
        // lookup guard after a commit swapped the version out, by a finished dump,
        // by a commit. Only the radix moves (one reference count); a root shared
        // with another version is merely released over there.
        if self.entries >= DROP_LATER_ENTRIES && !super::on_drop_thread() {
            let root = std::mem::replace(&mut self.root, empty_root());
            super::drop_later(Box::new(root));
        }
    }
}

/// The root of an empty table, shared (what a dropped table keeps meanwhile).
fn empty_root() -> Arc<[Arc<Mid>; FANOUT]> {
    // Process-wide because it is a constant, not state: built once, never
    // changed, and needed by `Table`'s `Drop`, which has no context.
    static EMPTY: std::sync::OnceLock<Arc<[Arc<Mid>; FANOUT]>> = std::sync::OnceLock::new();
    EMPTY
        .get_or_init(|| {
            let leaf = Arc::new(Leaf::new());
            let mid: Arc<Mid> = Arc::new(std::array::from_fn(|_| leaf.clone()));
            Arc::new(std::array::from_fn(|_| mid.clone()))
        })
        .clone()
}

impl Default for Table {
    /// An empty IP map.
    fn default() -> Self {
        Table::new(MapKind::Ip)
    }
}

impl Table {
    /// An empty map of this kind.
    pub fn new(kind: MapKind) -> Self {
        let leaf = Arc::new(Leaf::new());
        let mid: Arc<Mid> = Arc::new(std::array::from_fn(|_| leaf.clone()));
        Table {
            root: Arc::new(std::array::from_fn(|_| mid.clone())),
            count: Arc::new([0; 33 + 129]),
            lens_v4: Vec::new(),
            lens_v6: Vec::new(),
            entries: 0,
            kind,
        }
    }
}

/// The prefix-length counter of an IP key; string keys have none.
fn count_slot(key: &MapKey) -> Option<usize> {
    match key {
        MapKey::Ip(IpNet::V4 { len, .. }) => Some(usize::from(*len)),
        MapKey::Ip(IpNet::V6 { len, .. }) => Some(33 + usize::from(*len)),
        MapKey::Str(_) => None,
    }
}

fn shard(net: &MapKey) -> (usize, usize) {
    let h = net.shard_hash();
    let a = (h & (FANOUT as u64 - 1)) as usize;
    let b = ((h >> FANOUT_BITS) & (FANOUT as u64 - 1)) as usize;
    (a, b)
}

impl Table {
    /// What the keys are.
    pub fn kind(&self) -> MapKind {
        self.kind
    }

    /// Entries held (duplicates counted), as `entry_cnt` shows.
    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    fn leaf(&self, net: &MapKey) -> &Leaf {
        let (a, b) = shard(net);
        &self.root[a][b]
    }

    fn leaf_mut(&mut self, net: &MapKey) -> &mut Leaf {
        let (a, b) = shard(net);
        let mid = Arc::make_mut(&mut Arc::make_mut(&mut self.root)[a]);
        Arc::make_mut(&mut mid[b])
    }

    fn key_added(&mut self, net: &MapKey) {
        let Some(slot) = count_slot(net) else {
            return;
        };
        let count = Arc::make_mut(&mut self.count);
        count[slot] += 1;
        if count[slot] == 1 {
            self.rebuild_lens();
        }
    }

    fn key_removed(&mut self, net: &MapKey) {
        let Some(slot) = count_slot(net) else {
            return;
        };
        let count = Arc::make_mut(&mut self.count);
        count[slot] = count[slot].saturating_sub(1);
        if count[slot] == 0 {
            self.rebuild_lens();
        }
    }

    fn rebuild_lens(&mut self) {
        self.lens_v4 = (0..=V4_BITS)
            .rev()
            .filter(|l| self.count[usize::from(*l)] > 0)
            .collect();
        self.lens_v6 = (0..=V6_BITS)
            .rev()
            .filter(|l| self.count[33 + usize::from(*l)] > 0)
            .collect();
    }

    /// Add an entry (a duplicate key adds a second entry, as HAProxy does).
    pub fn add(&mut self, net: impl Into<MapKey>, entry: Entry) {
        let net = net.into();
        let leaf = self.leaf_mut(&net);
        let new_key = match leaf.get_mut(&net) {
            Some(list) => {
                Arc::make_mut(list).push(entry);
                false
            }
            None => {
                leaf.insert(net.clone(), Arc::new(vec![entry]));
                true
            }
        };
        self.entries += 1;
        if new_key {
            self.key_added(&net);
        }
    }

    /// Set the value (and target) of every entry of `net`. False when the key is absent.
    pub fn set(&mut self, net: impl Into<MapKey>, value: &Arc<str>, target: Option<usize>) -> bool {
        let net = &net.into();
        if !self.leaf(net).contains_key(net) {
            return false;
        }
        if let Some(list) = self.leaf_mut(net).get_mut(net) {
            for e in Arc::make_mut(list) {
                e.value = value.clone();
                e.target = target;
            }
        }
        true
    }

    /// Remove every entry of `net`. False when the key is absent.
    pub fn remove(&mut self, net: impl Into<MapKey>) -> bool {
        let net = &net.into();
        if !self.leaf(net).contains_key(net) {
            return false;
        }
        let removed = self.leaf_mut(net).remove(net).map_or(0, |l| l.len());
        self.entries -= removed;
        self.key_removed(net);
        true
    }

    /// Remove the one entry with this `seq` (`del map MAP #<ref>`). False when absent.
    pub fn remove_seq(&mut self, seq: u64) -> bool {
        let Some(net) = self
            .iter()
            .find(|(_, e)| e.seq == seq)
            .map(|(n, _)| n.clone())
        else {
            return false;
        };
        let leaf = self.leaf_mut(&net);
        let mut now_empty = false;
        if let Some(list) = leaf.get_mut(&net) {
            let list = Arc::make_mut(list);
            list.retain(|e| e.seq != seq);
            now_empty = list.is_empty();
        }
        if now_empty {
            leaf.remove(&net);
            self.key_removed(&net);
        }
        self.entries -= 1;
        true
    }

    /// The entry a key holds exactly (oldest of duplicates).
    pub fn get_exact(&self, net: impl Into<MapKey>) -> Option<&Entry> {
        let net = &net.into();
        self.leaf(net).get(net).and_then(|l| l.first())
    }

    /// `map`: the entry whose string key is exactly `name` (compared in lower case).
    pub fn lookup_str(&self, name: &str) -> Option<&Entry> {
        self.get_exact(MapKey::string(name))
    }

    /// `map_dom`: the entry whose string key is `name` or one of its dot-separated
    /// suffixes (`a.example.com`, `example.com`, `com`); of several, the first in
    /// insertion order, as HAProxy's list match (a file holding `example.com` before
    /// `api.example.com` sends `api.example.com` to the first).
    pub fn lookup_dom(&self, name: &str) -> Option<&Entry> {
        let name = name.to_ascii_lowercase();
        let mut rest = name.as_str();
        let mut best: Option<&Entry> = None;
        for _ in 0..MAX_LABELS {
            if rest.is_empty() {
                break;
            }
            if let Some(e) = self.get_exact(MapKey::Str(Arc::from(rest))) {
                if best.is_none_or(|b| e.seq < b.seq) {
                    best = Some(e);
                }
            }
            match rest.split_once('.') {
                Some((_, r)) => rest = r,
                None => break,
            }
        }
        best
    }

    /// `map_beg`: the entry whose string key `name` starts with (ASCII case
    /// ignored), the first in insertion order, as HAProxy's list match. A walk
    /// of every entry, without allocating: prefix maps are small.
    pub fn lookup_beg(&self, name: &str) -> Option<&Entry> {
        let name = name.as_bytes();
        self.iter()
            .map(|(_, e)| e)
            .filter(|e| {
                let k = e.key.as_bytes();
                k.len() <= name.len() && name[..k.len()].eq_ignore_ascii_case(k)
            })
            .min_by_key(|e| e.seq)
    }

    /// `get map` lookup of a CLI value: an address for IP maps, a string for string
    /// maps (exact). A value that is not an address matches nothing in an IP map.
    pub fn lookup_text(&self, value: &str) -> Option<&Entry> {
        match self.kind {
            MapKind::Ip => value.parse::<IpAddr>().ok().and_then(|ip| self.lookup(ip)),
            MapKind::Str => self.lookup_str(value),
        }
    }

    fn lpm(&self, addr: IpNet, lens: &[u8]) -> Option<&Entry> {
        lens.iter()
            .find_map(|&len| self.get_exact(addr.truncate(len)))
    }

    /// Longest-prefix match of a client address, following HAProxy's family rules: an
    /// IPv4 address is tried against IPv4 keys, then as `::ffff:a.b.c.d` against IPv6
    /// keys; an IPv6 address against IPv6 keys, then, if v4-mapped, as IPv4.
    pub fn lookup(&self, ip: IpAddr) -> Option<&Entry> {
        match ip {
            IpAddr::V4(a) => self.lpm(IpNet::host(ip), &self.lens_v4).or_else(|| {
                if self.lens_v6.is_empty() {
                    return None;
                }
                self.lpm(IpNet::host(IpAddr::V6(a.to_ipv6_mapped())), &self.lens_v6)
            }),
            IpAddr::V6(a) => self.lpm(IpNet::host(ip), &self.lens_v6).or_else(|| {
                let v4 = a.to_ipv4_mapped()?;
                self.lpm(IpNet::host(IpAddr::V4(v4)), &self.lens_v4)
            }),
        }
    }

    /// Every (key, entry), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&MapKey, &Entry)> + '_ {
        self.root
            .iter()
            .flat_map(|mid| mid.iter())
            .flat_map(|leaf| leaf.iter())
            .flat_map(|(net, list)| list.iter().map(move |e| (net, e)))
    }

    /// Every entry in insertion order. Holds a pointer per entry: for small maps and
    /// tests; `show map` pages through [`OrderedScan`] instead.
    pub fn entries_in_order(&self) -> Vec<&Entry> {
        let mut v: Vec<&Entry> = self.iter().map(|(_, e)| e).collect();
        v.sort_unstable_by_key(|e| e.seq);
        v
    }

    /// Entries of leaf number `i` (0..[`LEAVES`]), in no particular order.
    fn leaf_entries(&self, i: usize) -> impl Iterator<Item = &Entry> + '_ {
        self.root[i / FANOUT][i % FANOUT]
            .values()
            .flat_map(|list| list.iter())
    }
}

/// Leaves of a table (a step of [`OrderedScan`] visits whole leaves).
pub const LEAVES: usize = FANOUT * FANOUT;

/// One resumable pass over a table that collects, in insertion (`seq`) order, the
/// `max` oldest entries newer than `after`: how `show map` pages through a map of any
/// size without a pointer per entry.
///
/// Why a selection pass rather than a sorted index: a table is hashed, not ordered, and
/// keeping an order index would make every `add map` dearer. A pass visits every entry
/// and keeps the `max` oldest qualifying ones in a max-heap (clones: reference counts,
/// no copy of the text); once it is full, an entry replaces the newest kept one only
/// if it is older. A dump of n entries costs n / max passes. The cost of a step is
/// proportional to the entries it visits (no sort or selection of the whole buffer at
/// once), so the caller bounds each [`OrderedScan::step`] by entries visited and a
/// pass over a huge map yields part way; [`OrderedScan::into_oldest`] then hands the
/// selection out oldest first, one heap pop per entry, as the dump prints it.
#[derive(Debug)]
pub struct OrderedScan {
    after: Option<u64>,
    max: usize,
    next_leaf: usize,
    /// The oldest qualifying entries seen so far, newest on top.
    kept: BinaryHeap<BySeq>,
}

/// An entry ordered by its insertion number alone (unique within the process).
#[derive(Debug, Clone)]
pub struct BySeq(pub Entry);

impl PartialEq for BySeq {
    fn eq(&self, other: &Self) -> bool {
        self.0.seq == other.0.seq
    }
}

impl Eq for BySeq {}

impl PartialOrd for BySeq {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BySeq {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.seq.cmp(&other.0.seq)
    }
}

/// A finished selection, handed out oldest first: a min-heap of (seq, index)
/// pairs over the entries, so a pop moves 16 bytes, not entries.
#[derive(Debug, Default)]
pub struct Oldest {
    entries: Vec<Option<Entry>>,
    order: BinaryHeap<Reverse<(u64, u32)>>,
}

impl Oldest {
    /// The oldest entry not yet taken.
    pub fn pop(&mut self) -> Option<Entry> {
        let Reverse((_, i)) = self.order.pop()?;
        self.entries.get_mut(i as usize).and_then(Option::take)
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

impl OrderedScan {
    /// A pass for the `max` (at least one) oldest entries with `seq` above `after`.
    pub fn new(after: Option<u64>, max: usize) -> Self {
        OrderedScan {
            after,
            max: max.max(1),
            next_leaf: 0,
            kept: BinaryHeap::new(),
        }
    }

    /// Visit more leaves of `table` (always the same table for one pass), whole
    /// leaves (at least one), until about `budget` entries were visited. True when the
    /// pass has visited every leaf.
    pub fn step(&mut self, table: &Table, budget: usize) -> bool {
        let first = self.next_leaf;
        if first == 0 {
            // The selection's final size at most, allocated once (see into_oldest).
            self.kept.reserve(self.max.min(table.len()));
        }
        let mut visited = 0usize;
        while self.next_leaf < LEAVES && (self.next_leaf == first || visited < budget) {
            let i = self.next_leaf;
            self.next_leaf += 1;
            for e in table.leaf_entries(i) {
                visited += 1;
                if self.after.is_some_and(|a| e.seq <= a) {
                    continue;
                }
                if self.kept.len() < self.max {
                    self.kept.push(BySeq(e.clone()));
                } else if let Some(mut newest) = self.kept.peek_mut() {
                    if e.seq < newest.0.seq {
                        *newest = BySeq(e.clone());
                    }
                }
            }
        }
        self.next_leaf >= LEAVES
    }

    /// The newest entry selected (where the next pass starts after), and how many
    /// were selected (fewer than `max` means the table holds no more after them).
    pub fn newest(&self) -> (Option<u64>, usize) {
        (self.kept.peek().map(|e| e.0.seq), self.kept.len())
    }

    /// The selection, to be handed out oldest first (a linear-time heap rebuild).
    pub fn into_oldest(self) -> Oldest {
        let entries: Vec<Option<Entry>> = self
            .kept
            .into_vec()
            .into_iter()
            .map(|e| Some(e.0))
            .collect();
        // Sized up front: growing a large vector step by step costs far more than
        // its final size (reallocations of fresh pages, milliseconds in all).
        let mut order = Vec::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            if let (Some(e), Ok(i)) = (e, u32::try_from(i)) {
                order.push(Reverse((e.seq, i)));
            }
        }
        Oldest {
            entries,
            order: BinaryHeap::from(order),
        }
    }

    /// The collected entries, oldest first (at most `max`; fewer means the table holds
    /// no more after them).
    pub fn finish(self) -> Vec<Entry> {
        self.kept
            .into_sorted_vec()
            .into_iter()
            .map(|e| e.0)
            .collect()
    }
}
