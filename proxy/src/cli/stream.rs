//! Answers too large to build whole: `show map MAP` and `show sess`, produced a chunk
//! at a time by the connection loop (`mod.rs`), which writes each chunk and yields to
//! the scheduler before asking for the next.
//!
//! Owns the cursors of those dumps. A [`Producer`] is created by `dispatch` (so level
//! checks and name resolution stay there) and drained by [`Producer::fill`], which
//! appends whole lines to the connection's output buffer until it holds at least the
//! caller's limit, and returns whether more remains.
//!
//! Invariants (memory stays bounded whatever the size of the answer):
//! - A map dump holds the map version it started from (`Arc<Table>`: changes made
//!   meanwhile build new versions and do not show) and at most [`MAP_CHUNK`] entry
//!   clones (reference counts, not text) while it selects the next chunk in insertion
//!   order (`maps::table::OrderedScan`), then hands them out oldest first.
//! - A map dump's `fill` works for about [`FILL_BUDGET`] at most (it looks at the
//!   clock every [`SCAN_STEP`] entries visited and every 64 lines printed), so a dump
//!   of any size is a series of short runs; a dump of more than [`LIGHT_DUMP`] entries
//!   runs from the Heavy class from its first chunk. What a dump still holds when it
//!   ends early is released on the `shunt-drop` thread.
//! - A sessions dump holds one gather of at most `flows::GATHER_CHUNK` flows and the
//!   last id it printed per worker; flows opened or closed meanwhile may or may not
//!   show, and none shows twice (ids only grow within a worker).
//! - Output is whole lines; a `fill` call may overshoot the limit by one line.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::maps::table::{Oldest, OrderedScan};
use crate::maps::{self, Entry, Table};
use crate::scheduler::Remote;
use crate::stats::flows::{FlowView, GATHER_CHUNK};

use super::{render, sessions, Ctx};

/// Entries selected per pass over the map: each pass visits the whole map, so a dump
/// costs n / MAP_CHUNK passes (31 for 1M entries); the selection holds up to this many
/// entry clones (56 bytes each, about 1.8 MB), the "few MB" a dump may cost.
pub const MAP_CHUNK: usize = 32 * 1024;
/// Entries a scan step visits between two looks at the clock.
pub const SCAN_STEP: usize = 1024;
/// Lines printed between two looks at the clock.
const LINES_PER_CHECK: usize = 64;
/// Longest a `fill` call of a map dump works before it returns (the connection then
/// writes what it has if enough is pending, and yields): with the heavy class's one
/// task per loop, this bounds what a dump adds to every other task's latency.
pub const FILL_BUDGET: Duration = Duration::from_micros(200);
/// A dump of more entries than this is heavy work from its first chunk (a smaller
/// one is answered in one short run).
pub const LIGHT_DUMP: usize = 1024;

/// A large answer being produced.
#[derive(Debug)]
pub enum Producer {
    Map(MapDump),
    Sessions(SessDump),
}

impl Producer {
    /// `show map MAP` of this map version.
    pub fn map(table: Arc<Table>) -> Self {
        Producer::Map(MapDump {
            table,
            scan: Some(OrderedScan::new(None, MAP_CHUNK)),
            pending: Oldest::default(),
        })
    }

    /// Whether this answer is heavy work from its first chunk.
    pub fn heavy_from_start(&self) -> bool {
        match self {
            Producer::Map(m) => m.table.len() > LIGHT_DUMP,
            Producer::Sessions(_) => false,
        }
    }

    /// `show sess`: every worker's flows.
    pub fn sessions(ctx: &Ctx) -> Self {
        Producer::Sessions(SessDump {
            remotes: ctx.state.workers.remotes(),
            worker: 0,
            after: None,
            worker_done: false,
            chunk: Vec::new(),
            pos: 0,
        })
    }

    /// Append lines to `out` until it holds at least `limit` bytes or this step's work
    /// is done; false once the answer is complete (its body, without the final empty
    /// line the framing adds).
    pub async fn fill(&mut self, ctx: &Ctx, out: &mut Vec<u8>, limit: usize) -> bool {
        match self {
            Producer::Map(m) => m.fill(out, limit),
            Producer::Sessions(s) => s.fill(ctx, out, limit).await,
        }
    }
}

/// Cursor of `show map MAP`.
#[derive(Debug)]
pub struct MapDump {
    table: Arc<Table>,
    /// The selection pass under way; `None` once the map is exhausted.
    scan: Option<OrderedScan>,
    /// Selected entries not printed yet, handed out oldest first.
    pending: Oldest,
}

impl MapDump {
    /// Print and select for at most [`FILL_BUDGET`] (at least one line or one scan
    /// step), until `out` holds `limit` bytes; false once the dump is complete.
    fn fill(&mut self, out: &mut Vec<u8>, limit: usize) -> bool {
        let deadline = Instant::now() + FILL_BUDGET;
        loop {
            let mut printed = 0usize;
            while out.len() < limit {
                let Some(e) = self.pending.pop() else {
                    break;
                };
                map_line(out, &e);
                printed += 1;
                if printed.is_multiple_of(LINES_PER_CHECK) && Instant::now() >= deadline {
                    return true;
                }
            }
            if out.len() >= limit {
                return true;
            }
            let Some(scan) = self.scan.as_mut() else {
                return false;
            };
            if scan.step(&self.table, SCAN_STEP) {
                // The pass is complete: its selection is what prints next, and a
                // full selection means another pass starts after its newest entry.
                let (newest, n) = scan.newest();
                let done = self.scan.take().map(OrderedScan::into_oldest);
                if n == MAP_CHUNK {
                    self.scan = Some(OrderedScan::new(newest, MAP_CHUNK));
                }
                self.pending = done.unwrap_or_default();
            }
            if Instant::now() >= deadline {
                return true;
            }
        }
    }
}

impl Drop for MapDump {
    /// A dump closed part way may hold thousands of entry clones: released off the
    /// worker, as tables are.
    fn drop(&mut self) {
        if self.pending.len() + self.scan.as_ref().map_or(0, |s| s.newest().1) > LIGHT_DUMP {
            let garbage = (std::mem::take(&mut self.pending), self.scan.take());
            maps::drop_later(Box::new(garbage));
        }
    }
}

/// One `show map MAP` line: `0x<ref> key value`.
fn map_line(out: &mut Vec<u8>, e: &Entry) {
    let mut line = String::with_capacity(e.key.len() + e.value.len() + 20);
    let _ = writeln!(line, "0x{:x} {} {}", maps::entry_ptr(e), e.key, e.value);
    out.extend_from_slice(line.as_bytes());
}

/// Cursor of `show sess`: worker by worker, flows in id order.
#[derive(Debug)]
pub struct SessDump {
    remotes: Vec<Remote>,
    /// Index in `remotes` of the worker being listed.
    worker: usize,
    /// Last flow id fetched from that worker.
    after: Option<u64>,
    /// The worker answered a short chunk: it has nothing after `after`.
    worker_done: bool,
    chunk: Vec<FlowView>,
    pos: usize,
}

impl SessDump {
    async fn fill(&mut self, ctx: &Ctx, out: &mut Vec<u8>, limit: usize) -> bool {
        loop {
            while self.pos < self.chunk.len() && out.len() < limit {
                render::sess_line(ctx, &self.chunk[self.pos], out);
                self.pos += 1;
            }
            if out.len() >= limit {
                return true;
            }
            // The chunk is printed: fetch the next one, from the next worker once this
            // one answered a short chunk.
            if self.worker_done {
                self.worker += 1;
                self.after = None;
                self.worker_done = false;
            }
            let Some(remote) = self.remotes.get(self.worker) else {
                return false;
            };
            let chunk = sessions::gather(remote, self.after, GATHER_CHUNK).await;
            self.worker_done = chunk.len() < GATHER_CHUNK;
            if let Some(last) = chunk.last() {
                self.after = Some(last.id);
            }
            self.chunk = chunk;
            self.pos = 0;
        }
    }
}
