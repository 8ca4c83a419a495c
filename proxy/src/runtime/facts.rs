//! What the process is, fixed at start-up: forwarding mode, BPF status,
//! thread count, start time. Set once by `daemon` and only read afterwards,
//! so `show info`, the Prometheus exporter and the prompt can never disagree
//! (each fact is kept here and nowhere else).

use std::time::{Instant, SystemTime};

use crate::config::ForwardMode;

/// The process's fixed facts.
#[derive(Debug)]
pub struct Facts {
    forward_mode: ForwardMode,
    bpf: String,
    nbthread: usize,
    started: SystemTime,
    started_mono: Instant,
}

impl Facts {
    /// The facts of a process starting now. `bpf` is "loaded" or why not.
    pub fn new(forward_mode: ForwardMode, bpf: String, nbthread: usize) -> Self {
        Self {
            forward_mode,
            bpf,
            nbthread: nbthread.max(1),
            started: SystemTime::now(),
            started_mono: Instant::now(),
        }
    }

    /// The forwarding mode in force (command line over configuration).
    pub fn forward_mode(&self) -> ForwardMode {
        self.forward_mode
    }

    /// BPF status for `show info` and logs: "loaded" or why not.
    pub fn bpf(&self) -> &str {
        &self.bpf
    }

    /// Worker threads.
    pub fn nbthread(&self) -> usize {
        self.nbthread
    }

    /// Wall-clock start (`Start_time_sec`, `process_start_time_seconds`).
    pub fn started(&self) -> SystemTime {
        self.started
    }

    /// Whole seconds since the start (`Uptime_sec`, the timed prompt).
    pub fn uptime_secs(&self) -> u64 {
        self.started_mono.elapsed().as_secs()
    }
}
