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
//!   meanwhile build new versions and do not show) and at most
//!   `2 * MAP_CHUNK` entry clones (reference counts, not text) while it selects the
//!   next [`MAP_CHUNK`] entries in insertion order (`maps::table::OrderedScan`). One
//!   call of `fill` visits about [`SCAN_BUDGET`] entries at most, so a pass over a huge
//!   map yields part way (and a small map is dumped in one call).
//! - A sessions dump holds one gather of at most `flows::GATHER_CHUNK` flows and the
//!   last id it printed per worker; flows opened or closed meanwhile may or may not
//!   show, and none shows twice (ids only grow within a worker).
//! - Output is whole lines; a `fill` call may overshoot the limit by one line.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::maps::table::OrderedScan;
use crate::maps::{self, Entry, Table};
use crate::scheduler::Remote;
use crate::stats::flows::{FlowView, GATHER_CHUNK};

use super::{render, sessions, Ctx};

/// Entries selected per pass over the map: each pass visits the whole map, so a dump
/// costs n / MAP_CHUNK passes (31 for 1M entries); the selection holds up to twice
/// this many entry clones (56 bytes each, about 3.7 MB), the "few MB" a dump may cost.
pub const MAP_CHUNK: usize = 32 * 1024;
/// Entries a `fill` call visits, selecting, before the loop may yield (a few
/// milliseconds of work).
pub const SCAN_BUDGET: usize = 16 * 1024;

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
            pending: Vec::new(),
            pos: 0,
        })
    }

    /// `show sess`: every worker's flows.
    pub fn sessions(ctx: &Ctx) -> Self {
        Producer::Sessions(SessDump {
            remotes: ctx.state.remotes(),
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
    /// Selected entries, oldest first, printed up to `pos`.
    pending: Vec<Entry>,
    pos: usize,
}

impl MapDump {
    fn fill(&mut self, out: &mut Vec<u8>, limit: usize) -> bool {
        loop {
            while self.pos < self.pending.len() && out.len() < limit {
                let e = &self.pending[self.pos];
                map_line(out, e);
                self.pos += 1;
            }
            if out.len() >= limit {
                return true;
            }
            let Some(scan) = self.scan.as_mut() else {
                return false;
            };
            if !scan.step(&self.table, SCAN_BUDGET) {
                // Part of a pass done: let the loop yield before the rest.
                return true;
            }
            let done = self
                .scan
                .take()
                .map(OrderedScan::finish)
                .unwrap_or_default();
            if done.len() == MAP_CHUNK {
                self.scan = Some(OrderedScan::new(done.last().map(|e| e.seq), MAP_CHUNK));
            }
            // A short selection is the end of the map (`scan` stays `None`).
            self.pending = done;
            self.pos = 0;
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
