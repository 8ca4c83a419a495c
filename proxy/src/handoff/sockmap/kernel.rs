//! The loaded kernel handoff of one process: the BPF handle, the bound on
//! what a direction may hold in the kernel, the counters `show info` reads,
//! and the registry of a reload's hand-over.
//!
//! Owns: the [`Kernel`] value `daemon` loads once and the runtime shares
//! (`handoff::Forwarding`); every inserted flow holds it, so the handle
//! outlives the last map entry. Must not: be reached through a static (a
//! flow finds the kernel through what forwards it, a test can load its own).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use super::handover::Registry;
use crate::bpf::{Bpf, Pins};

/// Default bound on bytes one direction of a flow may hold in the kernel.
pub const DEFAULT_MAX_INFLIGHT: usize = 8 << 20;
/// Smallest accepted bound: below this, flows would pause on every burst.
pub const MIN_MAX_INFLIGHT: usize = 256 << 10;

/// The process's kernel forwarding, once BPF loaded.
#[derive(Debug)]
pub struct Kernel {
    bpf: Bpf,
    /// The per-direction bound in bytes (`tune.sockmap.max-inflight`).
    max_inflight: usize,
    /// Largest in-kernel byte count one direction was seen holding.
    peak_inflight: AtomicUsize,
    /// Flows that were not eligible and were forwarded in userspace instead.
    fallbacks: AtomicU64,
    /// Directions whose EOF was seen before the verdict had run over every
    /// byte received ahead of the FIN (userspace waited for it).
    eof_catchups: AtomicU64,
    /// The kernel flows' part in a reload.
    handover: Registry,
}

/// Process-wide sockmap figures for `show info` (all zero without BPF).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelInfo {
    pub sockhash_entries: usize,
    pub flow_entries: usize,
    /// Segments the verdict passed for backpressure (paused or over the bound).
    pub pauses: u64,
    pub peak_inflight: usize,
    pub fallbacks: u64,
    pub redirect_errors: u64,
    /// Retransmitted segments whose already-seen head the verdict trimmed.
    pub overlap_trimmed: u64,
    /// Overlaps the verdict could not trim (forwarded whole: a duplicate).
    pub trim_failed: u64,
    /// Segments whose control block held no consistent sequence range.
    pub seq_unknown: u64,
    /// EOFs seen before the verdict caught up (see `verdict_behind`).
    pub eof_catchups: u64,
    /// Overlaps the verdict could not trim and passed for userspace to drop.
    pub trim_passed: u64,
}

impl KernelInfo {
    /// The figures of `kernel`, or zeros when BPF is not loaded.
    pub fn of(kernel: Option<&Kernel>) -> Self {
        kernel.map(Kernel::info).unwrap_or_default()
    }
}

impl Kernel {
    /// Load the BPF program, with the maps pinned (and reused on a reload)
    /// when `pins` says where (see `crate::bpf`'s "Pinned maps"). On failure
    /// the reason is one line for operators.
    pub fn load(max_inflight: Option<usize>, pins: Option<&Pins>) -> Result<Arc<Kernel>, String> {
        let bpf = Bpf::load_pinned(pins).map_err(|e| e.reason())?;
        Ok(Arc::new(Kernel {
            bpf,
            max_inflight: max_inflight
                .unwrap_or(DEFAULT_MAX_INFLIGHT)
                .max(MIN_MAX_INFLIGHT),
            peak_inflight: AtomicUsize::new(0),
            fallbacks: AtomicU64::new(0),
            eof_catchups: AtomicU64::new(0),
            handover: Registry::default(),
        }))
    }

    /// The BPF handle (maps, attachment, pins, the program's log).
    pub fn bpf(&self) -> &Bpf {
        &self.bpf
    }

    /// The per-direction bound in bytes.
    pub fn max_inflight(&self) -> usize {
        self.max_inflight
    }

    /// The registry of a reload's hand-over of kernel flows.
    pub fn handover(&self) -> &Registry {
        &self.handover
    }

    pub(super) fn note_fallback(&self) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn note_eof_catchup(&self) {
        self.eof_catchups.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn note_inflight(&self, bytes: usize) {
        self.peak_inflight.fetch_max(bytes, Ordering::Relaxed);
    }

    /// Current figures (map sizes are counted by walking the keys: cheap
    /// enough for a CLI command, never used on the forwarding path).
    pub fn info(&self) -> KernelInfo {
        let mut k = KernelInfo {
            peak_inflight: self.peak_inflight.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            eof_catchups: self.eof_catchups.load(Ordering::Relaxed),
            sockhash_entries: self.bpf.sockhash_len(),
            flow_entries: self.bpf.flow_map_len(),
            ..KernelInfo::default()
        };
        if let Ok(c) = self.bpf.error_counters() {
            k.redirect_errors = c[proxy_common::CTR_REDIRECT_FAILED as usize];
            k.pauses = c[proxy_common::CTR_PASS_PAUSED as usize];
            k.overlap_trimmed = c[proxy_common::CTR_OVERLAP_TRIMMED as usize];
            k.trim_failed = c[proxy_common::CTR_TRIM_FAILED as usize];
            k.trim_passed = c[proxy_common::CTR_TRIM_PASSED as usize];
            k.seq_unknown = c[proxy_common::CTR_SEQ_UNKNOWN as usize];
        }
        k
    }
}
