//! shunt's kernel side: one `sk_skb/stream_verdict` program over one SOCKHASH.
//!
//! Owns the map definitions (names, types, capacities all come from
//! `proxy-common`) and the verdict. Invariants:
//! - it never drops a byte: every path that does not redirect returns
//!   SK_PASS, so the bytes stay readable in the receiving socket and userspace
//!   forwards them (fail open). SK_DROP is only for segments that carry no
//!   new byte: a bare FIN, or (never seen) a segment wholly repeated;
//! - it forwards every byte once: a retransmitted segment whose head repeats
//!   bytes already seen is trimmed first (`trim_overlap`);
//! - it redirects only when userspace marked the direction ready, not paused,
//!   and acknowledged every byte passed so far (`FlowCtl` doc), so a
//!   redirected byte never overtakes one userspace still has to forward;
//! - it writes only the `FlowStats` entry of the socket it runs for and the
//!   per-CPU counters; `FlowCtl` is read-only here;
//! - it logs (aya-log, ring buffer `AYA_LOGS`) only rare diagnostic events,
//!   never on the redirect fast path: a redirect failure, a missing flow
//!   entry, and (debug) the first segment a direction passes because it went
//!   over its redirect limit. A full ring buffer drops the record, never the
//!   segment; userspace caps the level at load (`AYA_LOG_LEVEL`).
//!
//! Built by `xtask/src/ebpf.rs` (nightly, bitcode, llvm-link/opt/llc), never
//! by the stable workspace build.
#![no_std]

use aya_ebpf::{
    bindings::{
        __sk_buff,
        sk_action::{SK_DROP, SK_PASS},
    },
    helpers::bpf_get_socket_cookie,
    macros::{map, stream_verdict},
    maps::{HashMap, PerCpuArray, SockHash},
    programs::SkBuffContext,
    EbpfContext as _,
};
use aya_log_ebpf::{debug, error, info};
use proxy_common::{
    str_eq, FlowCtl, FlowStats, SockKey, COUNTERS_LEN, COUNTERS_NAME, CTR_NO_FLOW_CTL,
    CTR_NO_FLOW_STATS, CTR_OVERLAP_TRIMMED, CTR_PASS_EMPTY, CTR_PASS_NOT_READY, CTR_PASS_PAUSED,
    CTR_PASS_UNACKED, CTR_REDIRECT_FAILED, CTR_SEQ_UNKNOWN, CTR_TRIM_FAILED, CTR_TRIM_PASSED,
    CTR_VERDICT_FAILED,
    CTR_WHOLE_OVERLAP, FLOW_CAPACITY, FLOW_CTL_NAME, FLOW_MAP_FLAGS, FLOW_STATS_NAME,
    SOCKHASH_CAPACITY, SOCKHASH_NAME,
};

// The `#[map]` attribute needs string literals; these checks make a drift
// from the names in proxy-common a compile error instead of a load failure.
const _: () = assert!(str_eq(SOCKHASH_NAME, "SHUNT_SOCKS"));
const _: () = assert!(str_eq(FLOW_CTL_NAME, "SHUNT_FLOW_CTL"));
const _: () = assert!(str_eq(FLOW_STATS_NAME, "SHUNT_FLOW_STAT"));
const _: () = assert!(str_eq(COUNTERS_NAME, "SHUNT_COUNTERS"));

/// `cookie(receiver) -> peer socket`.
#[map(name = "SHUNT_SOCKS")]
static SOCKS: SockHash<SockKey> = SockHash::with_max_entries(SOCKHASH_CAPACITY, 0);

/// `cookie(receiver) -> FlowCtl`, written by userspace only.
#[map(name = "SHUNT_FLOW_CTL")]
static FLOW_CTL: HashMap<SockKey, FlowCtl> =
    HashMap::with_max_entries(FLOW_CAPACITY, FLOW_MAP_FLAGS);

/// `cookie(receiver) -> FlowStats`, written by this program only.
#[map(name = "SHUNT_FLOW_STAT")]
static FLOW_STATS: HashMap<SockKey, FlowStats> =
    HashMap::with_max_entries(FLOW_CAPACITY, FLOW_MAP_FLAGS);

/// Per-CPU failure and pass-reason counters, indices `CTR_*`.
#[map(name = "SHUNT_COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTERS_LEN, 0);

/// GPL: `bpf_sk_redirect_hash` and friends are GPL-only helpers.
#[unsafe(no_mangle)]
#[unsafe(link_section = "license")]
pub static LICENSE: [u8; 4] = *b"GPL\0";

/// Why a segment was not redirected (the `Err` of [`try_verdict`]).
enum Miss {
    /// No control entry for this socket (cookie): count it and pass.
    NoCtl(SockKey),
    /// Control but no counters entry (cookie): count it and pass.
    NoStats(SockKey),
}

/// Stream verdict: redirect to the peer stored under our own cookie, or pass.
#[stream_verdict]
pub fn shunt_verdict(ctx: SkBuffContext) -> u32 {
    match try_verdict(&ctx) {
        Ok(action) => action,
        Err(Miss::NoCtl(cookie)) => {
            bump(CTR_NO_FLOW_CTL);
            // Info, not warn: a verdict that started just before a teardown
            // deleted the entries lands here too.
            info!(
                &ctx,
                "no flow entry for cookie {}: passing to userspace", cookie
            );
            SK_PASS
        }
        Err(Miss::NoStats(cookie)) => {
            bump(CTR_NO_FLOW_STATS);
            bump(CTR_VERDICT_FAILED);
            // Userspace creates the counters before the control entry and
            // deletes them after it: this is a broken invariant.
            error!(
                &ctx,
                "flow control without counters for cookie {}: passing", cookie
            );
            SK_PASS
        }
    }
}

#[inline(always)]
fn try_verdict(ctx: &SkBuffContext) -> Result<u32, Miss> {
    let skb: *mut __sk_buff = ctx.as_ptr().cast();
    // SAFETY: `skb` is the context pointer the kernel handed to this sk_skb
    // program; bpf_get_socket_cookie accepts it and only reads skb->sk.
    let cookie: SockKey = unsafe { bpf_get_socket_cookie(skb.cast()) };
    let len = u64::from(ctx.len());
    if len == 0 {
        // A bare FIN: consume it here (see CTR_PASS_EMPTY). No byte is lost,
        // TCP already recorded the FIN, and the pass/ack counts are untouched.
        bump(CTR_PASS_EMPTY);
        return Ok(SK_DROP);
    }

    // SAFETY: the value is a plain-old-data FlowCtl copied out at once; only
    // userspace replaces entries, and a replaced element stays readable (RCU).
    let ctl = match unsafe { FLOW_CTL.get(cookie) } {
        Some(ctl) => *ctl,
        None => return Err(Miss::NoCtl(cookie)),
    };
    let stats = FLOW_STATS
        .get_ptr_mut(cookie)
        .ok_or(Miss::NoStats(cookie))?;

    // SAFETY (all dereferences of `stats` below): the pointer comes from a
    // successful map lookup, stays valid for this invocation (RCU), and this
    // program is the entry's only writer; the kernel runs the verdict of one
    // socket under that socket's lock, so the increments do not race.
    let (len, must_pass) = match trim_overlap(ctx, stats, &ctl, len) {
        Some(t) => t,
        // Nothing new in it: consume it (see CTR_WHOLE_OVERLAP).
        None => return Ok(SK_DROP),
    };
    // SAFETY: see above.
    let passed_bytes = unsafe { (*stats).passed_bytes };
    let pass_reason = if must_pass {
        // Its head repeats bytes already seen and could not be trimmed: only
        // userspace can drop them (counted in trim_overlap).
        Some(CTR_TRIM_PASSED)
    } else if ctl.ready == 0 {
        Some(CTR_PASS_NOT_READY)
    } else if ctl.paused != 0 {
        Some(CTR_PASS_PAUSED)
    } else if ctl.redirect_limit != 0
        // SAFETY: see above.
        && unsafe { (*stats).redirected_bytes } + len > ctl.redirect_limit
    {
        // Everything passed so far was acknowledged, so the segments before
        // this one were redirected: this is the first pass over the limit
        // (until userspace catches up again), not one per segment.
        if passed_bytes == ctl.passed_ack {
            debug!(
                ctx,
                "cookie {} over its redirect limit of {} bytes: passing",
                cookie,
                ctl.redirect_limit
            );
        }
        Some(CTR_PASS_PAUSED)
    } else if passed_bytes != ctl.passed_ack {
        Some(CTR_PASS_UNACKED)
    } else {
        None
    };
    if let Some(reason) = pass_reason {
        if !must_pass {
            bump(reason);
        }
        // SAFETY: see above.
        unsafe {
            (*stats).passed_bytes = passed_bytes + len;
            (*stats).passed_segs += 1;
        }
        return Ok(SK_PASS);
    }

    let action = SOCKS.redirect_skb(ctx, cookie, 0);
    if action == i64::from(SK_PASS) {
        // SAFETY: see above.
        unsafe {
            (*stats).redirected_bytes += len;
            (*stats).redirected_segs += 1;
        }
        // SK_PASS with the redirect recorded in the skb means "redirect".
        Ok(SK_PASS)
    } else {
        // A miss makes the helper answer SK_DROP; pass instead so no byte is
        // lost: it stays in this socket for userspace.
        bump(CTR_REDIRECT_FAILED);
        // Info: a pair being torn down (one key already deleted) lands here.
        info!(
            ctx,
            "redirect failed for cookie {} ({} bytes): no peer, passing to userspace", cookie, len
        );
        // SAFETY: see above.
        unsafe {
            (*stats).redirect_failures += 1;
            (*stats).passed_bytes = passed_bytes + len;
            (*stats).passed_segs += 1;
        }
        Ok(SK_PASS)
    }
}

/// Largest head `bpf_skb_adjust_room` removes in one call (the kernel's bound).
const TRIM_STEP: u32 = 0xfff;
/// Calls needed for the largest segment (64 KiB) in steps of `TRIM_STEP`.
const TRIM_CALLS: u32 = 17;

/// Sequence bookkeeping and the retransmission fix. TCP queues a segment
/// that overlaps bytes already received (a retransmission cut differently
/// from the original) whole, with `seq` before the receive point; readers
/// skip the old part by sequence number, but the kernel hands this verdict
/// the whole segment. The socket's own sequence range sits in the control
/// block (`TCP_SKB_CB`: `seq`, `end_seq`, which `__sk_buff.cb[0..2]` map to
/// for sk_skb programs): remove the head this verdict already saw, so every
/// byte is forwarded once. Trimming pulls the head into the linear area, an
/// atomic allocation that can fail when memory is fragmented; then the
/// segment must be passed (the second value, `true`) with the repeated range
/// recorded in `skip_at`/`skip_len` for userspace to discard, unless an
/// earlier range is still unacknowledged (then it goes on whole, counted in
/// CTR_TRIM_FAILED). Returns the segment's new length, or `None` when
/// nothing in it is new.
#[inline(always)]
fn trim_overlap(
    ctx: &SkBuffContext,
    stats: *mut FlowStats,
    ctl: &FlowCtl,
    len: u64,
) -> Option<(u64, bool)> {
    let cb = ctx.cb();
    let (seq, end_seq) = (cb[0], cb[1]);
    let span = u64::from(end_seq.wrapping_sub(seq));
    if span != len && span != len + 1 {
        // Not a TCP receive control block as expected: leave it alone.
        bump(CTR_SEQ_UNKNOWN);
        return Some((len, false));
    }
    let end = seq.wrapping_add(len as u32);
    // SAFETY: `stats` comes from a successful lookup (see try_verdict).
    let (known, next) = unsafe { ((*stats).seq_known, (*stats).next_seq) };
    let mut new_len = len;
    let mut must_pass = false;
    if known != 0 {
        let seen = next.wrapping_sub(seq) as i32;
        if seen > 0 {
            let seen = seen as u32;
            if u64::from(seen) >= len {
                bump(CTR_WHOLE_OVERLAP);
                error!(ctx, "segment of {} bytes already seen whole: consumed", len);
                return None;
            }
            let mut left = seen;
            let mut calls = 0;
            while left > 0 && calls < TRIM_CALLS {
                let step = if left > TRIM_STEP { TRIM_STEP } else { left };
                if ctx.adjust_room(-(step as i32), 0, 0).is_err() {
                    break;
                }
                left -= step;
                calls += 1;
            }
            new_len = u64::from(ctx.len());
            // SAFETY: as above.
            unsafe { (*stats).overlap_bytes += u64::from(seen - left) };
            if left == 0 {
                bump(CTR_OVERLAP_TRIMMED);
            } else {
                // SAFETY: as above.
                let (at, pending) = unsafe { ((*stats).skip_at, (*stats).skip_len) };
                if pending == 0 || ctl.passed_ack >= at + pending {
                    bump(CTR_TRIM_PASSED);
                    // SAFETY: as above.
                    unsafe {
                        (*stats).skip_at = (*stats).passed_bytes;
                        (*stats).skip_len = u64::from(left);
                        (*stats).skips += 1;
                    }
                    must_pass = true;
                } else {
                    bump(CTR_TRIM_FAILED);
                    error!(
                        ctx,
                        "could not trim {} repeated bytes: forwarding them", left
                    );
                }
            }
        }
    }
    if known == 0 || end.wrapping_sub(next) as i32 > 0 {
        // SAFETY: as above.
        unsafe {
            (*stats).next_seq = end;
            (*stats).seq_known = 1;
        }
    }
    Some((new_len, must_pass))
}

/// Adds one to a per-CPU counter; a bad index is ignored (nothing to count it in).
#[inline(always)]
fn bump(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: the pointer is this CPU's slot of a per-CPU array; BPF
        // programs run with migration disabled and sk_skb verdicts do not nest
        // on one CPU, so nothing else writes it meanwhile.
        unsafe { *slot += 1 };
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the program has no panicking path the verifier would accept
    // anyway (bounds are checked explicitly); this is only a symbol to satisfy
    // `no_std`, and the object check rejects any call left to it.
    unsafe { core::hint::unreachable_unchecked() }
}
