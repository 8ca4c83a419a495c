//! Server selection and queues: which server of a backend takes a new
//! connection (HAProxy `balance` algorithms, one per file), the runtime
//! state of servers (health, maintenance, weight, counters), and the FIFO
//! queue of requests waiting while every candidate is at its `maxconn`.
//!
//! Owns: [`ServerRt`], [`BackendRt`], [`Slot`], [`AcquireError`]. It opens no
//! socket and does no I/O; callers connect to `slot.server().addr()` and keep
//! the [`Slot`] alive for the life of the server connection.
//!
//! Candidate set of a pick: the usable (up, not in maintenance, weight > 0)
//! non-backup servers; if there is none, the first usable backup server
//! (HAProxy without `option allbackups`), or every usable backup with it. Servers at their `maxconn` take no
//! new connection; when all candidates are full the request queues.

mod algo;
mod backend;
mod chash;
mod first;
mod leastconn;
mod map;
mod random;
mod roundrobin;
mod server;
mod source;
pub mod spares;
mod static_rr;
pub mod status;

pub use backend::{AcquireError, BackendRt, FlowKey, Slot};
pub use server::{
    AdminNote, AdminState, Change, Effective, OpState, ProbeTargets, ServerRt, Transition,
    MAX_WEIGHT,
};

#[cfg(test)]
mod tests;
