//! Per-thread executor with HAProxy's task classes. (API contract; implementation pending.)
//!
//! Contract used by the rest of the daemon:
//! - `run_worker(thread_id, SchedConfig, main)` builds a current_thread tokio runtime
//!   on the calling OS thread, runs the scheduler loop under it, spawns `main` as a
//!   Normal task, and returns when `main` completes (remaining tasks are dropped).
//! - `spawn(class, name, fut)` spawns on the current thread's scheduler (panics if
//!   the caller is not on a worker thread).
//! - `thread_id()` is the worker's index (0..nbthread).
//! - `Remote` (Send + Sync + Clone) runs a closure on another worker's thread.
