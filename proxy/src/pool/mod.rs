//! The warm-spare tasks: per worker, refill this thread's lists of
//! pre-connected spares toward their share of the need; on worker 0, each
//! server's housekeeping (flushes, age-out, purge periods). The spares
//! themselves and their lists are the server's (`crate::lb::spares`), so that
//! `lb` depends on nothing above it; this module drives them from the runtime.

mod tasks;

pub use crate::lb::spares::*;
pub use tasks::{init, spawn_for_worker, WATCH_TICK};
