//! One worker thread's executor: task slab, per-class run queues, the loop.
//!
//! Owns: everything thread-local about a worker (the [`Worker`] reachable through
//! the `CURRENT` thread-local while `run_worker` runs), the scheduler future that
//! `block_on` drives, and teardown.
//!
//! Must not: hold a `RefCell` borrow while user code runs (polling a future,
//! dropping one, running a remote job, waking a foreign waker): user code may
//! spawn or wake, which borrows again. Every borrow below is a short push/pop.
//!
//! The loop (HAProxy `process_runnable_tasks`, one pass):
//! 1. drain the cross-thread inbox into Urgent (Heavy for heavy tasks);
//! 2. compute `max_processed` and the per-class budgets of a round from the queue
//!    lengths (`budget::round_budgets`);
//! 3. run classes in order Urgent, Normal, Bulk, Heavy, each up to its budget or
//!    until empty (with low-latency, go back before each task to a higher class
//!    that became non-empty and still has budget); a task that already ran in
//!    this loop ends its class's turn for the round (it waits for the next loop:
//!    a self-waking task cannot hold the worker away from its reactor);
//! 4. while `max_processed` is not used up and work was queued meanwhile, run
//!    another round (the heavy class keeps what it left, never refilled);
//! 5. give the reactor a turn with `tokio::task::yield_now()` (its wake is
//!    deferred until the driver has been polled without blocking), or, if nothing
//!    is queued, park: return `Pending` until a waker of ours fires.
//!
//! Activity counters (`show activity`) are taken around that cycle: the awake
//! time of each pass (from the reactor's return to the next reactor turn) feeds
//! the sliding loop-time average, which also drives `set profiling tasks auto`;
//! a pass that parks counts in `empty_rq`, a loop that leaves work queued in
//! `long_rq`, a reactor turn taken with work pending in `wake_tasks`, and a turn
//! during which the reactor woke a task (a wake with no task running) in `poll_io`.
//! The time spent parked feeds `Idle_pct` (per [`IDLE_WINDOW_NS`] sample), and
//! each loop publishes the live tasks and the queue length for `show info`.
//!
//! Heavy marking: `current_heavy` holds the running task's heavy flag while it
//! runs (so `enter_heavy` needs no access to the task's header); the flag is
//! copied back to the header when the poll returns, where wakes from the reactor,
//! other tasks and other threads read it.
//!
//! # Race window
//! Parking: `park` stores the `block_on` waker, then checks the queues and the
//! inbox flag, then sets `idle`. A local wake after that sees `idle` and wakes
//! `block_on`; a local wake before it left an entry that the check sees. Remote
//! wakes follow the protocol described in `remote.rs`.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tokio::runtime::Runtime;

use super::budget::{max_processed, round_budgets, Rules, CLASS_WEIGHTS};
use super::remote::{Inbox, Job, Shared, IDLE_WINDOW_NS};
use super::stats::{self, FreqCtr, ProfTable, ThreadStats};
use super::task::{key_generation, key_slot, make_key, Header, TaskHandle, TaskKey};
use super::{Class, SchedConfig, FLOW_TASK};

/// Most inbox messages taken per loop: a flood from other threads cannot keep
/// the worker from its own queues and its reactor.
const INBOX_DRAIN_MAX: usize = 4096;

/// Teardown drops tasks in rounds (a dropped future may spawn); after this many
/// rounds whatever was spawned last is dropped with the worker.
const TEARDOWN_ROUNDS: usize = 16;

/// Cap of the per-loop trace kept for tests (entries of 16 bytes).
#[cfg(test)]
const LOOP_TRACE_MAX: usize = 1 << 20;

/// "A remote job is running" in `Worker::current`; never a task key (it would
/// need 2^32 slots).
const JOB_KEY: TaskKey = u64::MAX;

/// Name under which remote jobs are profiled (one word: `show profiling` rows are
/// split on blanks by tools).
const JOB_NAME: &str = "remote-job";

thread_local! {
    static CURRENT: RefCell<Option<Rc<Worker>>> = const { RefCell::new(None) };
    /// The worker's latest clock reading (each pass's start, and the end of
    /// every task run while profiling): the time its tasks see through
    /// [`now`]. `None` off a worker.
    static LAST_CLOCK: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// This worker's latest clock reading (`None` off a worker); see
/// [`crate::scheduler::now`].
pub(crate) fn last_clock() -> Option<Instant> {
    LAST_CLOCK.try_with(Cell::get).ok().flatten()
}

/// Run `f` with this thread's worker, if the thread is a worker.
pub(crate) fn with_current<R>(f: impl FnOnce(&Worker) -> R) -> Option<R> {
    CURRENT
        .try_with(|c| c.borrow().as_deref().map(f))
        .ok()
        .flatten()
}

/// Queue a woken task if this thread owns it; false means "send it home".
pub(crate) fn wake_on_owner(h: &Arc<Header>) -> bool {
    with_current(|w| {
        if Arc::ptr_eq(&w.shared, &h.owner) {
            w.wake_local(h);
            true
        } else {
            false
        }
    })
    .unwrap_or(false)
}

/// Clock readings at the start of one pass of the scheduler loop.
#[derive(Clone, Copy)]
pub(crate) struct PassStart {
    /// ns since the worker's epoch.
    wall: u64,
    /// Thread CPU time (ns), or `None` when stolen time is not measured this pass.
    cpu: Option<u64>,
}

/// Stolen CPU time of one worker (`cpust_ms_*`).
#[derive(Clone, Copy)]
struct Cpust {
    total_ns: u64,
    last_1s: FreqCtr,
    last_15s: FreqCtr,
}

/// A queued task, with its wake time (ns since the worker's epoch; 0 = unknown).
struct Entry {
    key: TaskKey,
    t: u64,
}

struct JobEntry {
    job: Job,
    t: u64,
}

enum Item {
    Task(Entry),
    Job(JobEntry),
}

/// Per-class queues; remote jobs belong to the Urgent class.
#[derive(Default)]
struct RunQueues {
    q: [VecDeque<Entry>; 4],
    jobs: VecDeque<JobEntry>,
}

impl RunQueues {
    fn len(&self, class: usize) -> usize {
        self.q[class].len() + if class == 0 { self.jobs.len() } else { 0 }
    }

    fn lens(&self) -> [usize; 4] {
        [self.len(0), self.len(1), self.len(2), self.len(3)]
    }

    fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.q.iter().all(VecDeque::is_empty)
    }

    fn pop(&mut self, class: usize) -> Option<Item> {
        if class == 0 {
            if let Some(j) = self.jobs.pop_front() {
                return Some(Item::Job(j));
            }
        }
        self.q[class].pop_front().map(Item::Task)
    }
}

/// A task's future and what polling it needs.
struct Task {
    fut: Pin<Box<dyn Future<Output = ()>>>,
    waker: Waker,
    header: Arc<Header>,
    prof: u32,
    /// Loop in which the task last ran (`u64::MAX`: never).
    last_run: u64,
}

struct Slot {
    generation: u32,
    /// `None` when free, or while the task is being polled.
    task: Option<Task>,
}

#[derive(Default)]
struct Slab {
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
}

enum Outcome {
    Stale,
    /// The task already ran in this loop: it was put back at the head of its queue.
    Again,
    Ran,
    MainDone,
}

pub(crate) struct Worker {
    pub(crate) shared: Arc<Shared>,
    pub(crate) thread_id: usize,
    depth: usize,
    rules: Rules,
    inbox: mpsc::Receiver<Inbox>,
    rq: RefCell<RunQueues>,
    slab: RefCell<Slab>,
    /// What runs now: a task (key, class it was queued in) or a remote job.
    current: Cell<Option<(TaskKey, Class)>>,
    /// Heavy flag of the running task (see the module header).
    current_heavy: Cell<bool>,
    /// The scheduler future is parked and must be woken by the next local wake.
    idle: Cell<bool>,
    sched_waker: RefCell<Option<Waker>>,
    main_key: Cell<Option<TaskKey>>,
    epoch: Instant,
    /// Cached clock (ns since `epoch`): start of the running task, or end of the
    /// last run. Only maintained while profiling is on.
    now_ns: Cell<u64>,
    loops: Cell<u64>,
    run: Cell<[u64; 4]>,
    last_loop: Cell<[u32; 4]>,
    remote_wakes: Cell<u64>,
    remote_jobs: Cell<u64>,
    prof: RefCell<ProfTable>,
    job_prof: u32,
    /// Profiling index of [`FLOW_TASK`] (its runs are `stream_calls`).
    flow_prof: u32,
    /// Whether task profiling is active on this worker (see `stats.rs`).
    prof_active: Cell<bool>,
    /// Last profiling reset epoch seen.
    prof_epoch: Cell<u64>,
    empty_rq: Cell<u64>,
    long_rq: Cell<u64>,
    wake_tasks: Cell<u64>,
    poll_io: Cell<u64>,
    stream_calls: Cell<u64>,
    accepted: Cell<u64>,
    /// Warm spares this worker took from a sibling thread's pool (`fd_takeover`).
    fd_takeover: Cell<u64>,
    /// Wakes made on this thread with no task running (the reactor's, mostly).
    reactor_wakes: Cell<u64>,
    /// Sliding sum of the awake µs per pass (`stats::swrate_add`).
    loop_us_sum: Cell<u64>,
    cpust: Cell<Cpust>,
    /// Start of the current idle sample (ns since `epoch`) and the time parked in it.
    idle_sample_start: Cell<u64>,
    idle_ns: Cell<u64>,
    #[cfg(test)]
    trace: RefCell<Option<Vec<[u32; 4]>>>,
}

impl Worker {
    pub(crate) fn new(thread_id: usize, cfg: &SchedConfig) -> Rc<Self> {
        let (shared, inbox) = Shared::new(thread_id);
        let mut prof = ProfTable::default();
        let job_prof = prof.intern(JOB_NAME);
        let flow_prof = prof.intern(FLOW_TASK);
        let active = stats::profiling_active(stats::profiling_mode(), false, 0);
        if active {
            stats::note_active(true);
        }
        Rc::new(Self {
            shared,
            thread_id,
            depth: cfg.depth(),
            rules: cfg.rules(),
            inbox,
            rq: RefCell::new(RunQueues::default()),
            slab: RefCell::new(Slab::default()),
            current: Cell::new(None),
            current_heavy: Cell::new(false),
            idle: Cell::new(false),
            sched_waker: RefCell::new(None),
            main_key: Cell::new(None),
            epoch: Instant::now(),
            now_ns: Cell::new(0),
            loops: Cell::new(0),
            run: Cell::new([0; 4]),
            last_loop: Cell::new([0; 4]),
            remote_wakes: Cell::new(0),
            remote_jobs: Cell::new(0),
            prof: RefCell::new(prof),
            job_prof,
            flow_prof,
            prof_active: Cell::new(active),
            prof_epoch: Cell::new(stats::reset_epoch()),
            empty_rq: Cell::new(0),
            long_rq: Cell::new(0),
            wake_tasks: Cell::new(0),
            poll_io: Cell::new(0),
            stream_calls: Cell::new(0),
            accepted: Cell::new(0),
            fd_takeover: Cell::new(0),
            reactor_wakes: Cell::new(0),
            loop_us_sum: Cell::new(0),
            cpust: Cell::new(Cpust {
                total_ns: 0,
                last_1s: FreqCtr::new(stats::CPUST_PERIOD_1S_NS),
                last_15s: FreqCtr::new(stats::CPUST_PERIOD_15S_NS),
            }),
            idle_sample_start: Cell::new(0),
            idle_ns: Cell::new(0),
            #[cfg(test)]
            trace: RefCell::new(None),
        })
    }

    fn clock(&self) -> u64 {
        let now = Instant::now();
        let _ = LAST_CLOCK.try_with(|c| c.set(Some(now)));
        u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Wake time for an entry queued now (see `stats.rs` for the approximation).
    fn stamp(&self) -> u64 {
        if !self.prof_active.get() {
            0
        } else if self.current.get().is_some() {
            self.now_ns.get()
        } else {
            self.clock()
        }
    }

    pub(crate) fn current_class(&self) -> Option<Class> {
        self.current.get().map(|(_, c)| c)
    }

    pub(crate) fn spawn_local<F>(&self, class: Class, name: &'static str, fut: F) -> TaskHandle
    where
        F: Future<Output = ()> + 'static,
    {
        let prof = self.prof.borrow_mut().intern(name);
        let fut: Pin<Box<dyn Future<Output = ()>>> = Box::pin(fut);
        let header = {
            let mut slab = self.slab.borrow_mut();
            let idx = match slab.free.pop() {
                Some(i) => i as usize,
                None => {
                    slab.slots.push(Slot {
                        generation: 0,
                        task: None,
                    });
                    slab.slots.len() - 1
                }
            };
            let slot = &mut slab.slots[idx];
            let key = make_key(idx as u32, slot.generation);
            let header = Arc::new(Header::new(
                key,
                class == Class::Heavy,
                Arc::clone(&self.shared),
            ));
            slot.task = Some(Task {
                fut,
                waker: Waker::from(Arc::clone(&header)),
                header: Arc::clone(&header),
                prof,
                last_run: u64::MAX,
            });
            slab.live += 1;
            header
        };
        self.enqueue(header.key, class);
        TaskHandle { header }
    }

    pub(crate) fn spawn_main<F>(&self, main: F)
    where
        F: Future<Output = ()> + 'static,
    {
        let h = self.spawn_local(Class::Normal, "main", main);
        self.main_key.set(Some(h.header.key));
    }

    fn enqueue(&self, key: TaskKey, class: Class) {
        let t = self.stamp();
        self.rq.borrow_mut().q[class.index()].push_back(Entry { key, t });
        self.kick();
    }

    /// Wake the scheduler future if it is parked.
    fn kick(&self) {
        if self.idle.replace(false) {
            if let Some(w) = self.sched_waker.borrow().as_ref() {
                w.wake_by_ref();
            }
        }
    }

    /// A task of this worker was woken on this thread: classify and queue it.
    pub(crate) fn wake_local(&self, h: &Header) {
        if self.current.get().is_none() {
            self.reactor_wakes.set(self.reactor_wakes.get() + 1);
        }
        let running = self.current.get();
        let own = matches!(running, Some((k, _)) if k == h.key);
        let heavy = if own {
            self.current_heavy.get()
        } else {
            h.heavy.load(Ordering::Relaxed)
        };
        let class = match running {
            _ if heavy && self.rules.heavy_cap => Class::Heavy,
            None => Class::Urgent,
            Some(_) if own => Class::Bulk,
            Some(_) => Class::Normal,
        };
        self.enqueue(h.key, class);
    }

    fn drain_inbox(&self) {
        if !self.shared.take_notified() {
            return;
        }
        let t = self.stamp();
        for _ in 0..INBOX_DRAIN_MAX {
            match self.inbox.try_recv() {
                Ok(Inbox::Wake(h)) => {
                    self.remote_wakes.set(self.remote_wakes.get() + 1);
                    let heavy = h.heavy.load(Ordering::Relaxed) && self.rules.heavy_cap;
                    let class = if heavy { Class::Heavy } else { Class::Urgent };
                    self.rq.borrow_mut().q[class.index()].push_back(Entry { key: h.key, t });
                }
                Ok(Inbox::Run(job)) => {
                    self.rq.borrow_mut().jobs.push_back(JobEntry { job, t });
                }
                Err(_) => return,
            }
        }
        self.shared.renotify();
    }

    fn has_work(&self) -> bool {
        !self.rq.borrow().is_empty()
    }

    fn register_waker(&self, w: &Waker) {
        let mut slot = self.sched_waker.borrow_mut();
        if !slot.as_ref().is_some_and(|old| old.will_wake(w)) {
            *slot = Some(w.clone());
            self.shared.set_waker(w);
        }
    }

    fn park(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.register_waker(cx.waker());
        if self.has_work() || self.shared.is_notified() {
            self.idle.set(false);
            Poll::Ready(())
        } else {
            self.idle.set(true);
            Poll::Pending
        }
    }

    /// Start of one pass: clock readings, and the profiling reset if one was asked.
    fn pass_begin(&self) -> PassStart {
        let wall = self.clock();
        self.note_idle(wall, 0);
        let epoch = stats::reset_epoch();
        if epoch != self.prof_epoch.get() {
            self.prof_epoch.set(epoch);
            self.prof.borrow_mut().reset();
        }
        // Two CPU-clock reads per pass (a syscall each): only while profiling.
        let cpu = self
            .prof_active
            .get()
            .then(crate::sys::thread_cpu_ns)
            .filter(|&c| c != 0);
        PassStart { wall, cpu }
    }

    /// End of one pass, just before the reactor turn: loop-time average, stolen
    /// time, and the `auto` profiling decision.
    fn pass_end(&self, start: PassStart) {
        let end = self.clock();
        let wall = end.saturating_sub(start.wall);
        let sum = stats::swrate_add(self.loop_us_sum.get(), stats::LOOP_AVG_SAMPLES, wall / 1000);
        self.loop_us_sum.set(sum);
        if let Some(cpu0) = start.cpu {
            let cpu = crate::sys::thread_cpu_ns().saturating_sub(cpu0);
            let stolen = wall.saturating_sub(cpu);
            if stolen >= stats::STOLEN_MIN_NS {
                let mut c = self.cpust.get();
                c.total_ns = c.total_ns.saturating_add(stolen);
                c.last_1s.add(end, stolen);
                c.last_15s.add(end, stolen);
                self.cpust.set(c);
            }
        }
        let was = self.prof_active.get();
        let now = stats::profiling_active(
            stats::profiling_mode(),
            was,
            stats::swrate_avg(sum, stats::LOOP_AVG_SAMPLES),
        );
        if now != was {
            self.prof_active.set(now);
            stats::note_active(now);
        }
    }

    /// Leave the active-worker count at exit.
    fn retire_profiling(&self) {
        if self.prof_active.replace(false) {
            stats::note_active(false);
        }
    }

    /// One pass over the classes, in rounds (see the module header). Returns
    /// true when `main` has completed.
    fn run_loop(&self, start: &PassStart) -> bool {
        let prof = self.prof_active.get();
        if prof {
            self.now_ns.set(start.wall);
        }
        let loop_id = self.loops.get();
        let queued = self.rq.borrow().lens();
        let mut left = max_processed(self.depth, queued.iter().sum());
        let mut heavy_weight = if queued[3] > 0 { CLASS_WEIGHTS[3] } else { 0 };
        let mut ran = [0u32; 4];
        let mut main_done = false;
        loop {
            let lens = self.rq.borrow().lens();
            if !self.rules.heavy_cap {
                heavy_weight = CLASS_WEIGHTS[3];
            }
            let mut budget = round_budgets(left, lens, heavy_weight, self.rules);
            let mut done = 0usize;
            let mut class = 0usize;
            loop {
                let item = {
                    let mut rq = self.rq.borrow_mut();
                    if self.rules.low_latency && class > 0 {
                        if let Some(c) = (0..class).find(|&c| budget[c] > 0 && rq.len(c) > 0) {
                            class = c;
                        }
                    }
                    while class < 4 && (budget[class] == 0 || rq.len(class) == 0) {
                        class += 1;
                    }
                    if class == 4 {
                        break;
                    }
                    budget[class] -= 1;
                    rq.pop(class)
                };
                let outcome = match item {
                    Some(Item::Job(j)) => {
                        self.run_job(j, prof);
                        Outcome::Ran
                    }
                    Some(Item::Task(e)) => self.run_task(e, Class::ALL[class], prof, loop_id),
                    None => Outcome::Stale,
                };
                match outcome {
                    // A stale entry (finished task) costs no budget.
                    Outcome::Stale => budget[class] += 1,
                    Outcome::Again => budget[class] = 0,
                    Outcome::Ran => {
                        ran[class] += 1;
                        done += 1;
                    }
                    Outcome::MainDone => {
                        ran[class] += 1;
                        main_done = true;
                        break;
                    }
                }
            }
            // The heavy class is not refilled: what it left is its next weight.
            heavy_weight = budget[3];
            left = left.saturating_sub(done);
            if main_done || done == 0 || left == 0 || !self.has_work() {
                break;
            }
        }
        self.loops.set(loop_id + 1);
        if !self.rq.borrow().is_empty() {
            self.long_rq.set(self.long_rq.get() + 1);
        }
        let mut run = self.run.get();
        for (total, n) in run.iter_mut().zip(ran) {
            *total += u64::from(n);
        }
        self.run.set(run);
        self.last_loop.set(ran);
        #[cfg(test)]
        if let Some(t) = self.trace.borrow_mut().as_mut() {
            if t.len() < LOOP_TRACE_MAX {
                t.push(ran);
            }
        }
        main_done
    }

    fn run_task(&self, e: Entry, class: Class, prof: bool, loop_id: u64) -> Outcome {
        let mut task = {
            let mut slab = self.slab.borrow_mut();
            match slab.slots.get_mut(key_slot(e.key)) {
                Some(slot) if slot.generation == key_generation(e.key) => {
                    if slot.task.as_ref().is_some_and(|t| t.last_run == loop_id) {
                        drop(slab);
                        self.rq.borrow_mut().q[class.index()].push_front(e);
                        return Outcome::Again;
                    }
                    match slot.task.take() {
                        Some(t) => t,
                        None => return Outcome::Stale,
                    }
                }
                _ => return Outcome::Stale,
            }
        };
        task.last_run = loop_id;
        // Cleared before the poll so a wake during it queues the task again;
        // AcqRel pairs with the waker's swap (its writes are visible to the poll).
        task.header.queued.swap(false, Ordering::AcqRel);
        if task.header.aborted.load(Ordering::Acquire) {
            return self.finish(e.key, task);
        }
        let start = if prof { self.now_ns.get() } else { 0 };
        if task.prof == self.flow_prof {
            self.stream_calls.set(self.stream_calls.get() + 1);
        }
        self.current.set(Some((e.key, class)));
        self.current_heavy
            .set(task.header.heavy.load(Ordering::Relaxed));
        let poll = task
            .fut
            .as_mut()
            .poll(&mut Context::from_waker(&task.waker));
        self.current.set(None);
        task.header
            .heavy
            .store(self.current_heavy.get(), Ordering::Relaxed);
        if prof {
            let end = self.clock();
            self.now_ns.set(end);
            let lat = if e.t == 0 {
                0
            } else {
                start.saturating_sub(e.t)
            };
            self.prof
                .borrow_mut()
                .record(task.prof, lat, end.saturating_sub(start));
        }
        if poll.is_ready() || task.header.aborted.load(Ordering::Acquire) {
            return self.finish(e.key, task);
        }
        let leftover = {
            let mut slab = self.slab.borrow_mut();
            match slab.slots.get_mut(key_slot(e.key)) {
                Some(slot) => {
                    slot.task = Some(task);
                    None
                }
                None => Some(task),
            }
        };
        drop(leftover);
        Outcome::Ran
    }

    /// The task is over (completed or aborted): free its slot, then drop it.
    fn finish(&self, key: TaskKey, task: Task) -> Outcome {
        task.header.done.store(true, Ordering::Release);
        {
            let mut slab = self.slab.borrow_mut();
            let idx = key_slot(key);
            if let Some(slot) = slab.slots.get_mut(idx) {
                slot.generation = slot.generation.wrapping_add(1);
                slab.free.push(idx as u32);
                slab.live -= 1;
            }
        }
        drop(task);
        if self.main_key.get() == Some(key) {
            Outcome::MainDone
        } else {
            Outcome::Ran
        }
    }

    fn run_job(&self, j: JobEntry, prof: bool) {
        let start = if prof { self.now_ns.get() } else { 0 };
        self.current.set(Some((JOB_KEY, Class::Urgent)));
        (j.job)();
        self.current.set(None);
        self.remote_jobs.set(self.remote_jobs.get() + 1);
        if prof {
            let end = self.clock();
            self.now_ns.set(end);
            let lat = if j.t == 0 {
                0
            } else {
                start.saturating_sub(j.t)
            };
            self.prof
                .borrow_mut()
                .record(self.job_prof, lat, end.saturating_sub(start));
        }
    }

    /// Drop every task and queued job (rounds: a dropped future may spawn).
    fn teardown(&self) {
        for _ in 0..TEARDOWN_ROUNDS {
            let (tasks, jobs) = {
                let mut slab = self.slab.borrow_mut();
                let mut tasks = Vec::new();
                for slot in &mut slab.slots {
                    if let Some(t) = slot.task.take() {
                        t.header.done.store(true, Ordering::Release);
                        slot.generation = slot.generation.wrapping_add(1);
                        tasks.push(t);
                    }
                }
                slab.free = (0..slab.slots.len() as u32).collect();
                slab.live = 0;
                let mut rq = self.rq.borrow_mut();
                for q in &mut rq.q {
                    q.clear();
                }
                (tasks, std::mem::take(&mut rq.jobs))
            };
            if tasks.is_empty() && jobs.is_empty() {
                return;
            }
            drop(jobs);
            drop(tasks);
        }
    }

    pub(crate) fn snapshot(&self) -> ThreadStats {
        let now = self.clock();
        let cpust = self.cpust.get();
        ThreadStats {
            thread_id: self.thread_id,
            loops: self.loops.get(),
            run: self.run.get(),
            queued: self.rq.borrow().lens(),
            last_loop: self.last_loop.get(),
            tasks: self.slab.borrow().live,
            remote_wakes: self.remote_wakes.get(),
            remote_jobs: self.remote_jobs.get(),
            empty_rq: self.empty_rq.get(),
            long_rq: self.long_rq.get(),
            wake_tasks: self.wake_tasks.get(),
            poll_io: self.poll_io.get(),
            stream_calls: self.stream_calls.get(),
            accepted: self.accepted.get(),
            fd_takeover: self.fd_takeover.get(),
            loop_us_sum: self.loop_us_sum.get(),
            profiling_active: self.prof_active.get(),
            cpust_ns: cpust.total_ns,
            cpust_1s_ns: cpust.last_1s.read(now),
            cpust_15s_ns: cpust.last_15s.read(now),
            profiling: self.prof.borrow().entries.clone(),
        }
    }

    /// Mark the running task heavy; its key and previous marking, or `None`
    /// outside a task (or in a remote job).
    pub(crate) fn mark_current_heavy(&self) -> Option<(TaskKey, bool)> {
        match self.current.get() {
            Some((key, _)) if key != JOB_KEY => Some((key, self.current_heavy.replace(true))),
            _ => None,
        }
    }

    /// Restore the marking of task `key` if it is the one running (a guard
    /// dropped with its future outside a poll changes nothing: the task is over).
    pub(crate) fn set_current_heavy(&self, key: TaskKey, heavy: bool) {
        if matches!(self.current.get(), Some((k, _)) if k == key) {
            self.current_heavy.set(heavy);
        }
    }

    /// Start of a loop: publish the load figures for `show info`.
    fn publish_running(&self) {
        let queued: usize = self.rq.borrow().lens().iter().sum();
        self.shared.load.running(self.slab.borrow().live, queued);
    }

    /// Count `parked` ns of idle time ending at `now`; close the sample when it
    /// is [`IDLE_WINDOW_NS`] long.
    fn note_idle(&self, now: u64, parked: u64) {
        let idle = self.idle_ns.get().saturating_add(parked);
        let span = now.saturating_sub(self.idle_sample_start.get());
        if span >= IDLE_WINDOW_NS {
            let pct =
                u32::try_from(idle.min(span).saturating_mul(100) / span.max(1)).unwrap_or(100);
            self.shared.load.idle_pct(pct);
            self.idle_sample_start.set(now);
            self.idle_ns.set(0);
        } else {
            self.idle_ns.set(idle);
        }
    }

    /// A listener of this worker accepted a connection.
    pub(crate) fn note_accepted(&self) {
        self.accepted.set(self.accepted.get() + 1);
    }

    /// This worker took a warm spare from a sibling thread's pool.
    pub(crate) fn note_takeover(&self) {
        self.fd_takeover.set(self.fd_takeover.get() + 1);
    }

    #[cfg(test)]
    pub(crate) fn set_trace(&self, on: bool) {
        *self.trace.borrow_mut() = on.then(Vec::new);
    }

    #[cfg(test)]
    pub(crate) fn take_trace(&self) -> Vec<[u32; 4]> {
        self.trace
            .borrow_mut()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

/// The scheduler future `block_on` drives (under `coop::unconstrained`).
pub(crate) async fn sched_main(w: Rc<Worker>) {
    std::future::poll_fn(|cx| {
        w.register_waker(cx.waker());
        Poll::Ready(())
    })
    .await;
    loop {
        let start = w.pass_begin();
        w.drain_inbox();
        w.publish_running();
        let reactor_wakes = if w.has_work() {
            if w.run_loop(&start) {
                return;
            }
            if w.has_work() || w.shared.is_notified() {
                w.wake_tasks.set(w.wake_tasks.get() + 1);
            }
            w.pass_end(start);
            let before = w.reactor_wakes.get();
            tokio::task::yield_now().await;
            w.reactor_wakes.get() - before
        } else {
            w.empty_rq.set(w.empty_rq.get() + 1);
            w.pass_end(start);
            let before = w.reactor_wakes.get();
            w.shared.load.parking(w.slab.borrow().live);
            let parked = w.clock();
            std::future::poll_fn(|cx| w.park(cx)).await;
            let now = w.clock();
            w.note_idle(now, now.saturating_sub(parked));
            w.reactor_wakes.get() - before
        };
        if reactor_wakes > 0 {
            w.poll_io.set(w.poll_io.get() + 1);
        }
    }
}

/// Makes a worker this thread's current one; on drop (normal return or unwind)
/// refuses further remote messages, drops every task inside the runtime's
/// context, and clears the thread-local.
pub(crate) struct Installed<'rt> {
    worker: Rc<Worker>,
    rt: &'rt Runtime,
}

impl<'rt> Installed<'rt> {
    /// The caller has checked that this thread has no worker.
    pub(crate) fn new(worker: Rc<Worker>, rt: &'rt Runtime) -> Self {
        let w = Rc::clone(&worker);
        let _ = CURRENT.try_with(move |c| *c.borrow_mut() = Some(w));
        Self { worker, rt }
    }
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        self.worker.shared.close();
        self.worker.retire_profiling();
        {
            let _ctx = self.rt.enter();
            self.worker.teardown();
        }
        let old = CURRENT.try_with(|c| c.borrow_mut().take()).ok().flatten();
        drop(old);
        let _ = LAST_CLOCK.try_with(|c| c.set(None));
    }
}
