//! shunt: an eBPF-assisted TCP proxy and load balancer.
//!
//! One folder per room (see the README's architecture section): `config`
//! (parse, validate), `scheduler` (per-thread executor with task classes),
//! `lb` (server selection and queues), `handoff` (splice/copy forwarding),
//! `stats` (per-thread counters), `sys` (thin syscall wrappers), and
//! `session` (one flow, top to bottom).

pub mod bpf;
pub mod checks;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod handoff;
pub mod lb;
pub mod listeners;
pub mod log;
pub mod maps;
pub mod metrics;
pub mod notify;
pub mod pool;
pub mod reload;
pub mod runtime;
pub mod scheduler;
pub mod session;
pub mod sni;
pub mod stats;
pub mod sys;
