//! TEMPORARY stub with the contract's signatures (replaced by the real scheduler).
use std::future::Future;
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Urgent,
    Normal,
    Bulk,
    Heavy,
}
pub struct SchedConfig {
    pub nbthread: usize,
    pub runqueue_depth: Option<usize>,
    pub low_latency: bool,
}
thread_local!(static ID: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) });
pub fn run_worker<F: Future<Output = ()> + 'static>(thread_id: usize, _cfg: SchedConfig, main: F) {
    ID.with(|c| c.set(thread_id));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ls = tokio::task::LocalSet::new();
    ls.block_on(&rt, main);
}
pub struct TaskHandle(tokio::task::JoinHandle<()>);
impl TaskHandle {
    pub fn abort(&self) {
        self.0.abort()
    }
}
pub fn spawn<F: Future<Output = ()> + 'static>(
    _class: Class,
    _name: &'static str,
    fut: F,
) -> TaskHandle {
    TaskHandle(tokio::task::spawn_local(fut))
}
pub fn thread_id() -> usize {
    ID.with(|c| c.get())
}
pub fn try_thread_id() -> Option<usize> {
    let i = ID.with(|c| c.get());
    (i != usize::MAX).then_some(i)
}
impl TaskHandle {
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}
