//! Types shared by the kernel programs (`proxy-ebpf`) and the daemon (`proxy`).
//!
//! Everything both sides agree on lives here and only here: map names, keys,
//! values. `#![no_std]` so the eBPF crate can use it; `#[repr(C)]` with sizes
//! asserted at compile time. The kernel handoff issue fills this in.
#![no_std]
