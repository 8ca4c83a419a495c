//! shunt: an eBPF-assisted TCP proxy and load balancer.
//!
//! One folder or file per room (see docs/architecture.md, which also gives the
//! layer rule the modules follow and what does not follow it yet):
//!
//! - `config`: parse, validate, the immutable `Config`;
//! - `daemon`: start-up in three stages, accept loops, signals, stop;
//! - `runtime`: the running process's shared state, as owned parts;
//! - `listeners`: every listening socket, bound fresh or inherited (`-x`);
//! - `reload`: `_getsocks` and `_getflows`, the hand-over to a successor;
//! - `notify`: systemd's readiness protocol;
//! - `session`: one flow, top to bottom;
//! - `sni`: the server name of a peeked TLS ClientHello;
//! - `proxy_proto`: the PROXY protocol header, v1 and v2 (encode, parse);
//! - `scheduler`: per-thread executor with task classes;
//! - `lb`: server selection, server runtime state, queues;
//! - `checks`: health and agent checks, the server-state file;
//! - `pool`: warm server connections;
//! - `maps`: routing maps, changed at run time by the CLI;
//! - `stick`: stick tables, tracked counters, their purge;
//! - `handoff`: forwarding behind one seam (sockmap, splice, copy);
//! - `bpf`: the eBPF object, its maps and pins;
//! - `cli`: the stats socket (frame, command, dispatch, render);
//! - `stats`: per-thread counters and each worker's flow registry;
//! - `log`: traffic logs;
//! - `metrics`: the Prometheus exporter;
//! - `statspage`: the stats web page (HTML, `;csv`, `;json`, admin form);
//! - `sys`: thin syscall wrappers.

pub mod bpf;
pub mod checks;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod handoff;
pub mod inspect;
pub mod lb;
pub mod listeners;
pub mod log;
pub mod maps;
pub mod metrics;
pub mod notify;
pub mod pool;
pub mod proxy_proto;
pub mod reload;
pub mod runtime;
pub mod scheduler;
pub mod session;
pub mod sni;
pub mod stats;
pub mod statspage;
pub mod stick;
pub mod sys;
pub mod tls;
