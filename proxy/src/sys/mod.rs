//! Thin syscall wrappers: the only place besides `handoff` with `unsafe`.
