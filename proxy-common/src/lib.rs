//! Types shared by the kernel programs (`proxy-ebpf`) and the daemon (`proxy`).
//!
//! Everything both sides agree on lives here and only here: map names and
//! capacities, keys, values and counter indices. `#![no_std]` so the eBPF
//! crate can use it; every value is `#[repr(C)]`, has no padding and has its
//! size asserted at compile time, so the kernel and the daemon read the same
//! bytes. With feature `user` the values implement `aya::Pod`.
//!
//! # The maps
//! - [`SOCKHASH_NAME`]: SOCKHASH, key = the *receiving* socket's cookie
//!   ([`SockKey`]), value = the *peer* socket. Crosswise insertion:
//!   `cookie(client) -> server`, `cookie(server) -> client`.
//! - [`FLOW_CTL_NAME`]: HASH, key = socket cookie, value [`FlowCtl`]. Written
//!   only by userspace (the verdict only reads it).
//! - [`FLOW_STATS_NAME`]: HASH, key = socket cookie, value [`FlowStats`].
//!   Created zeroed and deleted by userspace; between the two only the verdict
//!   of that one socket writes it.
//! - [`COUNTERS_NAME`]: PERCPU_ARRAY of `u64`, indices `CTR_*`, [`COUNTERS_LEN`]
//!   slots: failures and pass reasons not attributable to one flow.
//!
//! # Why control and counters are two maps
//! A userspace `BPF_MAP_UPDATE_ELEM` on a HASH map replaces the whole value
//! (a fresh element is linked in, the old one unlinked). If the flags and the
//! counters shared one value, setting `paused` would race with the verdict
//! bumping counters in the old element and lose increments. Splitting them
//! gives every value exactly one writer. [`FlowState`] is the combined
//! userspace view of one direction.
//!
//! # Directions
//! Each socket cookie names one direction: the bytes that socket *receives*.
//! The entries under `cookie(client)` describe client -> server, the entries
//! under `cookie(server)` describe server -> client.
#![no_std]

/// Name of the stream verdict program (the eBPF function's symbol).
pub const VERDICT_PROGRAM: &str = "shunt_verdict";
/// ELF section of the verdict program (`sk_skb/stream_verdict`, no parser).
pub const VERDICT_SECTION: &str = "sk_skb/stream_verdict";

/// Name of the SOCKHASH (`cookie(receiver) -> peer socket`).
pub const SOCKHASH_NAME: &str = "SHUNT_SOCKS";
/// SOCKHASH capacity: two entries per kernel-forwarded flow. Past it an insert
/// fails with E2BIG/ENOSPC and that flow falls back to splice.
pub const SOCKHASH_CAPACITY: u32 = 65_536;

/// Name of the per-direction control map ([`FlowCtl`]).
pub const FLOW_CTL_NAME: &str = "SHUNT_FLOW_CTL";
/// Name of the per-direction counters map ([`FlowStats`]).
pub const FLOW_STATS_NAME: &str = "SHUNT_FLOW_STAT";
/// Capacity of both flow maps: one entry per SOCKHASH entry.
pub const FLOW_CAPACITY: u32 = SOCKHASH_CAPACITY;
/// Map flag for both flow maps: `BPF_F_NO_PREALLOC`, so kernel memory follows
/// the number of live flows instead of the capacity (only userspace inserts).
pub const FLOW_MAP_FLAGS: u32 = 1;

/// Name of the per-CPU error/event counters array.
pub const COUNTERS_NAME: &str = "SHUNT_COUNTERS";
/// Verdict's `try_` body returned an error (the wrapper failed open: SK_PASS).
pub const CTR_VERDICT_FAILED: u32 = 0;
/// A socket in the SOCKHASH had no [`FlowCtl`] entry (map miss): SK_PASS.
pub const CTR_NO_FLOW_CTL: u32 = 1;
/// A socket had a [`FlowCtl`] but no [`FlowStats`] entry (map miss): SK_PASS.
pub const CTR_NO_FLOW_STATS: u32 = 2;
/// `bpf_sk_redirect_hash` failed (own cookie not in the SOCKHASH): SK_PASS.
pub const CTR_REDIRECT_FAILED: u32 = 3;
/// Segments passed because the direction was not ready yet.
pub const CTR_PASS_NOT_READY: u32 = 4;
/// Segments passed because the direction was paused or over its redirect limit.
pub const CTR_PASS_PAUSED: u32 = 5;
/// Segments passed because userspace had not acknowledged every passed byte.
pub const CTR_PASS_UNACKED: u32 = 6;
/// Segments without payload (a bare FIN) consumed by the verdict (SK_DROP of
/// zero bytes). Redirected, or passed while the psock has a backlog, such a
/// segment reaches the kernel's backlog worker, which takes a zero-length
/// transfer for a broken pipe: EPIPE on the socket and transmission stopped
/// for good. The FIN itself is already recorded by TCP (the socket reads
/// EOF) and userspace propagates it.
pub const CTR_PASS_EMPTY: u32 = 7;
/// Segments whose head repeated bytes the verdict had already seen (a TCP
/// retransmission overlapping data already received), trimmed before they
/// were forwarded. TCP queues such a segment whole and ordinary readers skip
/// the old part by sequence number, but the kernel hands the verdict the
/// whole segment: untrimmed, the old bytes would be delivered twice.
pub const CTR_OVERLAP_TRIMMED: u32 = 8;
/// Trimming an overlap failed (`bpf_skb_adjust_room`, e.g. no memory to pull
/// the head) while an earlier skip (see [`CTR_TRIM_PASSED`]) was still
/// outstanding: the segment went on whole. A broken invariant, logged.
pub const CTR_TRIM_FAILED: u32 = 9;
/// Segments whose control block did not hold a consistent TCP sequence range
/// (`end_seq - seq` is neither the length nor the length plus a FIN): the
/// overlap check was skipped for them.
pub const CTR_SEQ_UNKNOWN: u32 = 10;
/// Segments made only of bytes already seen (TCP never queues those; counted
/// and consumed if it ever does).
pub const CTR_WHOLE_OVERLAP: u32 = 11;
/// Trimming an overlap failed (the head pull needs an atomic allocation that
/// can fail when memory is fragmented); the segment was passed to userspace
/// instead, with the repeated range recorded in `FlowStats::skip_at` /
/// `skip_len` for userspace to discard.
pub const CTR_TRIM_PASSED: u32 = 12;
/// Number of slots in the counters array (spare slots keep room to grow).
pub const COUNTERS_LEN: u32 = 16;
/// Human names of the counter slots, indexed by `CTR_*`.
pub const COUNTER_NAMES: [&str; COUNTERS_LEN as usize] = [
    "verdict_failed",
    "no_flow_ctl",
    "no_flow_stats",
    "redirect_failed",
    "pass_not_ready",
    "pass_paused",
    "pass_unacked",
    "empty_consumed",
    "overlap_trimmed",
    "trim_failed",
    "seq_unknown",
    "whole_overlap",
    "trim_passed",
    "spare_13",
    "spare_14",
    "spare_15",
];

/// Key of the SOCKHASH and of both flow maps: a socket cookie
/// (`SO_COOKIE` / `bpf_get_socket_cookie`), never 0 for a live socket.
pub type SockKey = u64;

/// Userspace-owned control of one direction (the bytes one socket receives).
///
/// The verdict redirects a segment only when `ready != 0`, `paused == 0` and
/// the direction's `FlowStats::passed_bytes == passed_ack`; otherwise it
/// returns SK_PASS and counts the bytes as passed. `passed_ack` is how
/// userspace says "I have read and forwarded exactly this many passed bytes":
/// if the kernel passed one more segment after userspace looked, the counts
/// differ and the kernel keeps passing until userspace catches up, so a
/// redirected byte can never overtake a passed one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowCtl {
    /// `FlowStats::passed_bytes` value userspace has consumed and forwarded.
    pub passed_ack: u64,
    /// Backpressure bound kept by the kernel itself: a segment is redirected
    /// only while `redirected_bytes + len <= redirect_limit`; past it the
    /// verdict passes (so TCP flow control applies again) until userspace
    /// raises the limit as the destination drains. 0 = no limit.
    pub redirect_limit: u64,
    /// Non-zero once userspace flushed what it held before the handoff.
    pub ready: u32,
    /// Non-zero: backpressure, pass to userspace so TCP flow control applies.
    pub paused: u32,
}

/// Kernel-owned counters of one direction. Only the verdict running for the
/// receiving socket writes them; the kernel runs that verdict under the
/// socket's lock, so plain increments do not race.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// Bytes handed to `bpf_sk_redirect_hash` successfully.
    pub redirected_bytes: u64,
    /// Segments (skbs) redirected.
    pub redirected_segs: u64,
    /// Bytes left to userspace (SK_PASS) while the direction was known.
    pub passed_bytes: u64,
    /// Segments left to userspace.
    pub passed_segs: u64,
    /// Redirects that failed (peer missing from the SOCKHASH); passed instead.
    pub redirect_failures: u64,
    /// Bytes trimmed off segment heads because the verdict had already seen
    /// them (see [`CTR_OVERLAP_TRIMMED`]); counted in no other field.
    pub overlap_bytes: u64,
    /// Where in this direction's passed stream (a `passed_bytes` offset) the
    /// latest range of repeated bytes starts that the verdict could not trim
    /// and passed for userspace to discard (see [`CTR_TRIM_PASSED`]).
    pub skip_at: u64,
    /// Length of that range (0: none yet). The verdict records a new range only
    /// once userspace acknowledged past the previous one
    /// (`FlowCtl::passed_ack >= skip_at + skip_len`).
    pub skip_len: u64,
    /// Ranges recorded so far.
    pub skips: u64,
    /// TCP sequence number just past the last byte the verdict saw.
    pub next_seq: u32,
    /// Non-zero once `next_seq` holds a value.
    pub seq_known: u32,
}

/// Userspace view of one direction: its control and its counters.
/// Never stored in a map (see the crate doc); shared so both sides name it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowState {
    /// Control as userspace last wrote it.
    pub ctl: FlowCtl,
    /// Counters as the kernel last wrote them.
    pub stats: FlowStats,
}

/// Size of [`FlowCtl`] in bytes, as the map definition on both sides uses it.
pub const FLOW_CTL_SIZE: usize = 24;
/// Size of [`FlowStats`] in bytes.
pub const FLOW_STATS_SIZE: usize = 80;
/// Size of [`FlowState`] in bytes.
pub const FLOW_STATE_SIZE: usize = FLOW_CTL_SIZE + FLOW_STATS_SIZE;

const _: () = assert!(core::mem::size_of::<SockKey>() == 8);
const _: () = assert!(core::mem::size_of::<FlowCtl>() == FLOW_CTL_SIZE);
const _: () = assert!(core::mem::align_of::<FlowCtl>() == 8);
const _: () = assert!(core::mem::size_of::<FlowStats>() == FLOW_STATS_SIZE);
const _: () = assert!(core::mem::align_of::<FlowStats>() == 8);
const _: () = assert!(core::mem::size_of::<FlowState>() == FLOW_STATE_SIZE);
// Kernel map names are at most 15 bytes plus NUL (BPF_OBJ_NAME_LEN).
const _: () = assert!(SOCKHASH_NAME.len() <= 15);
const _: () = assert!(FLOW_CTL_NAME.len() <= 15);
const _: () = assert!(FLOW_STATS_NAME.len() <= 15);
const _: () = assert!(COUNTERS_NAME.len() <= 15);
const _: () = assert!(CTR_TRIM_PASSED < COUNTERS_LEN);

/// Compile-time string equality, so the eBPF crate can check that the literal
/// names its `#[map]` attributes need are the ones defined here.
pub const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(feature = "user")]
mod pod {
    use super::{FlowCtl, FlowState, FlowStats};

    // SAFETY: #[repr(C)], only integer fields, no padding (sizes asserted
    // above equal the sum of the fields), so every bit pattern is valid.
    unsafe impl aya::Pod for FlowCtl {}
    // SAFETY: as above: #[repr(C)] integers without padding.
    unsafe impl aya::Pod for FlowStats {}
    // SAFETY: #[repr(C)] of two padding-free Pod structs, size asserted.
    unsafe impl aya::Pod for FlowState {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_asserted_layout() {
        assert_eq!(core::mem::size_of::<FlowCtl>(), FLOW_CTL_SIZE);
        assert_eq!(core::mem::size_of::<FlowStats>(), FLOW_STATS_SIZE);
        assert_eq!(core::mem::size_of::<FlowState>(), FLOW_STATE_SIZE);
        assert_eq!(core::mem::offset_of!(FlowCtl, redirect_limit), 8);
        assert_eq!(core::mem::offset_of!(FlowCtl, ready), 16);
        assert_eq!(core::mem::offset_of!(FlowCtl, paused), 20);
        assert_eq!(core::mem::offset_of!(FlowStats, redirect_failures), 32);
        assert_eq!(core::mem::offset_of!(FlowStats, skip_at), 48);
        assert_eq!(core::mem::offset_of!(FlowStats, next_seq), 72);
        assert_eq!(core::mem::offset_of!(FlowState, stats), FLOW_CTL_SIZE);
    }

    #[test]
    fn counter_names_cover_every_slot() {
        assert_eq!(COUNTER_NAMES.len(), COUNTERS_LEN as usize);
        assert_eq!(
            COUNTER_NAMES[CTR_REDIRECT_FAILED as usize],
            "redirect_failed"
        );
        assert!(str_eq(SOCKHASH_NAME, "SHUNT_SOCKS"));
        assert!(!str_eq(SOCKHASH_NAME, "SHUNT_SOCKX"));
    }
}
