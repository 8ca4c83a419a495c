//! Unit tests of the scheduler: budget arithmetic, per-loop amounts, heavy cap,
//! wake classification (real sockets, timers, tasks, other threads), remote jobs,
//! idling without spinning, real async I/O, teardown.
//!
//! Every wait is bounded (timeouts / deadlines); sockets are on 127.0.0.1 port 0.

use std::cell::{Cell, RefCell};
use std::future::{pending, poll_fn};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::{sleep, timeout};

use super::*;

const WAIT: Duration = Duration::from_secs(5);

/// Serialises the tests that change the process-wide profiling mode or read the
/// tables (`set_profiling_mode(On)` resets every worker's table).
static PROF_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn prof_lock() -> std::sync::MutexGuard<'static, ()> {
    PROF_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn cfg() -> SchedConfig {
    SchedConfig::default()
}

fn run<F: std::future::Future<Output = ()> + 'static>(main: F) {
    run_worker(0, cfg(), main);
}

async fn wait_finished(h: &TaskHandle) {
    let deadline = Instant::now() + WAIT;
    while !h.is_finished() {
        assert!(Instant::now() < deadline, "task did not finish: {h:?}");
        sleep(Duration::from_millis(1)).await;
    }
}

/// utime + stime of the calling thread, in clock ticks (1/100 s).
fn thread_cpu_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/stat").expect("read stat");
    let rest = &s[s.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After "pid (comm) ", field 3 (state) is f[0]; utime = field 14, stime = 15.
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

struct SetOnDrop(Arc<AtomicBool>);
impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------- arithmetic

#[test]
fn budgets_follow_weights() {
    assert_eq!(budgets(280, [1000, 1000, 1000, 0]), [140, 105, 35, 0]);
    // All four: 64+48+16+1 = 129; heavy capped to one.
    assert_eq!(budgets(280, [1000; 4]), [139, 105, 35, 1]);
    // A single class gets the whole depth.
    assert_eq!(budgets(280, [0, 0, 5000, 0]), [0, 0, 280, 0]);
    assert_eq!(budgets(186, [0, 1, 0, 0]), [0, 186, 0, 0]);
    assert_eq!(budgets(280, [0; 4]), [0; 4]);
}

#[test]
fn budgets_halve_between_depth_and_twice_depth() {
    assert_eq!(budgets(280, [280, 0, 0, 0]), [280, 0, 0, 0]); // == depth: untouched
    assert_eq!(budgets(280, [281, 0, 0, 0]), [140, 0, 0, 0]); // just above: halves
    assert_eq!(budgets(280, [400, 0, 0, 0]), [200, 0, 0, 0]);
    assert_eq!(budgets(280, [560, 0, 0, 0]), [280, 0, 0, 0]); // == 2*depth: 560/2
    assert_eq!(budgets(280, [561, 0, 0, 0]), [280, 0, 0, 0]); // above: depth
    assert_eq!(budgets(280, [200, 200, 0, 0]), [115, 86, 0, 0]); // 200 * 64/112, 200 * 48/112
}

#[test]
fn budgets_cap_heavy_at_one() {
    assert_eq!(budgets(280, [0, 0, 0, 50]), [0, 0, 0, 1]);
    assert_eq!(budgets(280, [10, 0, 0, 10]), [276, 0, 0, 1]);
    assert_eq!(budgets(1, [0, 0, 0, 3]), [0, 0, 0, 1]);
}

#[test]
fn default_depth_formula() {
    assert_eq!(default_runqueue_depth(1), 280);
    assert_eq!(default_runqueue_depth(2), 186);
    assert_eq!(default_runqueue_depth(3), 140);
    assert_eq!(default_runqueue_depth(4), 112);
    assert_eq!(default_runqueue_depth(0), 280);
    assert_eq!(default_runqueue_depth(64), RUNQUEUE_DEPTH_MIN);
    let c = |d| SchedConfig {
        runqueue_depth: Some(d),
        ..cfg()
    };
    assert_eq!(c(0).depth(), 1);
    assert_eq!(c(77).depth(), 77);
    assert_eq!(c(usize::MAX).depth(), RUNQUEUE_DEPTH_MAX);
    assert_eq!(Class::ALL.map(Class::index), [0, 1, 2, 3]);
}

// ---------------------------------------------------------------- loop amounts

#[test]
fn first_loops_run_the_weighted_amounts() {
    run(async {
        set_loop_trace(true);
        for _ in 0..1000 {
            spawn(Class::Urgent, "u", async {});
            spawn(Class::Normal, "n", async {});
            spawn(Class::Bulk, "b", async {});
        }
        sleep(Duration::from_millis(50)).await;
        let trace = take_loop_trace();
        // Loop 1: only `main` was queued (Normal, budget 280): main plus the
        // first 279 Normal tasks it spawned, which landed in a class with budget.
        assert_eq!(trace[0], [0, 280, 0, 0]);
        // Loop 2 is the first with three non-empty classes.
        assert_eq!(trace[1], [140, 105, 35, 0]);
        // Every later loop matches the pure model of a loop's rounds applied to
        // what was left (once a class runs dry, later rounds share what remains).
        let mut q = [1000usize, 721, 1000, 0];
        let mut i = 1;
        while q.iter().sum::<usize>() > 0 {
            let b = budget::plan_loop(280, q, Rules::default());
            let expect: [u32; 4] = std::array::from_fn(|c| b[c] as u32);
            assert_eq!(trace[i], expect, "loop {} (queued {q:?})", i + 1);
            for c in 0..4 {
                q[c] -= expect[c] as usize;
            }
            i += 1;
        }
        let st = stats();
        assert_eq!(st.run[0], 1000);
        assert_eq!(st.run[2], 1000);
        assert!(st.run[1] >= 1001, "{:?}", st.run);
        assert_eq!(st.tasks, 1, "only main is left");
    });
}

#[test]
fn heavy_runs_at_most_one_per_loop() {
    run(async {
        set_loop_trace(true);
        let loops0 = stats().loops;
        let done = Rc::new(Cell::new(0usize));
        let all = Rc::new(Notify::new());
        for _ in 0..50 {
            let (done, all) = (done.clone(), all.clone());
            spawn(Class::Heavy, "heavy", async move {
                assert_eq!(current_class(), Some(Class::Heavy));
                done.set(done.get() + 1);
                if done.get() == 50 {
                    all.notify_one();
                }
            });
        }
        for _ in 0..500 {
            spawn(Class::Normal, "n", async {});
            spawn(Class::Bulk, "b", async {});
        }
        timeout(WAIT, all.notified())
            .await
            .expect("heavy tasks ran");
        // `main` may run in the loop of the last heavy task: let that loop end.
        sleep(Duration::from_millis(5)).await;
        let trace = take_loop_trace();
        assert!(trace.iter().all(|l| l[3] <= 1), "{trace:?}");
        assert_eq!(trace.iter().map(|l| l[3]).sum::<u32>(), 50);
        assert!(stats().loops - loops0 >= 50);
    });
}

#[test]
fn low_latency_jumps_back_to_a_higher_class() {
    fn order(low_latency: bool) -> Vec<&'static str> {
        let order = Rc::new(RefCell::new(Vec::new()));
        let o = order.clone();
        let cfg = SchedConfig {
            low_latency,
            ..cfg()
        };
        run_worker(0, cfg, async move {
            // Spawned from a Bulk task so that u0, n1, n2 are all queued at the
            // start of the same loop (classes empty at loop start get no budget).
            spawn(Class::Bulk, "setup", async move {
                let push = |o: &Rc<RefCell<Vec<_>>>, s| o.borrow_mut().push(s);
                let o1 = o.clone();
                spawn(Class::Urgent, "u0", async move { push(&o1, "u0") });
                let o2 = o.clone();
                spawn(Class::Normal, "n1", async move {
                    push(&o2, "n1");
                    let o3 = o2.clone();
                    spawn(Class::Urgent, "u1", async move { push(&o3, "u1") });
                });
                let o4 = o.clone();
                spawn(Class::Normal, "n2", async move { push(&o4, "n2") });
            });
            sleep(Duration::from_millis(20)).await;
        });
        let v = order.borrow().clone();
        v
    }
    assert_eq!(order(false), ["u0", "n1", "n2", "u1"]);
    assert_eq!(order(true), ["u0", "n1", "u1", "n2"]);
}

// ---------------------------------------------------------------- wake classes

#[test]
fn io_and_timer_wakes_are_urgent() {
    run(async {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let mut client = TcpStream::connect(l.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (server, _) = l.accept().await.expect("accept");
        let seen = Rc::new(Cell::new(None));
        let s2 = seen.clone();
        let reader = spawn(Class::Bulk, "reader", async move {
            assert_eq!(current_class(), Some(Class::Bulk)); // spawned class
                                                            // `readable()` may report a false positive: only a byte counts.
            let mut b = [0u8; 8];
            loop {
                server.readable().await.expect("readable");
                match server.try_read(&mut b) {
                    Ok(n) => {
                        assert_eq!(n, 1);
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("read: {e}"),
                }
            }
            s2.set(current_class());
        });
        sleep(Duration::from_millis(20)).await;
        assert_eq!(seen.get(), None, "reader must still wait");
        client.write_all(b"x").await.expect("write");
        wait_finished(&reader).await;
        assert_eq!(seen.get(), Some(Class::Urgent));

        let t = Rc::new(Cell::new(None));
        let t2 = t.clone();
        let sleeper = spawn(Class::Normal, "sleeper", async move {
            sleep(Duration::from_millis(5)).await;
            t2.set(current_class());
        });
        wait_finished(&sleeper).await;
        assert_eq!(t.get(), Some(Class::Urgent));
    });
}

#[test]
fn task_to_task_wake_is_normal_and_heavy_stays_heavy() {
    run(async {
        let n = Rc::new(Notify::new());
        let seen = Rc::new(Cell::new(None));
        let (n2, s2) = (n.clone(), seen.clone());
        let waiter = spawn(Class::Urgent, "waiter", async move {
            n2.notified().await;
            s2.set(current_class());
        });
        let h = Rc::new(Notify::new());
        let heavy_seen = Rc::new(Cell::new(None));
        let (h2, hs2) = (h.clone(), heavy_seen.clone());
        let heavy = spawn(Class::Heavy, "heavy-waiter", async move {
            h2.notified().await;
            hs2.set(current_class());
        });
        sleep(Duration::from_millis(10)).await;
        // `main` is running: these wakes come from a task.
        n.notify_one();
        h.notify_one();
        wait_finished(&waiter).await;
        wait_finished(&heavy).await;
        assert_eq!(seen.get(), Some(Class::Normal));
        assert_eq!(heavy_seen.get(), Some(Class::Heavy));
    });
}

#[test]
fn self_wake_is_bulk() {
    run(async {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let s2 = seen.clone();
        let t = spawn(Class::Urgent, "yielder", async move {
            s2.borrow_mut().push(current_class());
            yield_now().await;
            s2.borrow_mut().push(current_class());
            let mut once = false;
            poll_fn(|cx| {
                if once {
                    return Poll::Ready(());
                }
                once = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            })
            .await;
            s2.borrow_mut().push(current_class());
            // tokio's own yield_now defers its wake past the reactor turn: it
            // arrives from outside any task, hence Urgent (documented in mod.rs).
            tokio::task::yield_now().await;
            s2.borrow_mut().push(current_class());
        });
        wait_finished(&t).await;
        let c = |c| Some(c);
        assert_eq!(
            *seen.borrow(),
            [
                c(Class::Urgent),
                c(Class::Bulk),
                c(Class::Bulk),
                c(Class::Urgent)
            ]
        );
    });
}

#[test]
fn cross_thread_waker_wake_is_urgent() {
    run(async {
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let seen = Rc::new(Cell::new(None));
        let s2 = seen.clone();
        let t = spawn(Class::Normal, "oneshot-waiter", async move {
            let v = rx.await.expect("value");
            assert_eq!(v, 7);
            s2.set(current_class());
        });
        let other = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            tx.send(7).expect("send");
        });
        wait_finished(&t).await;
        other.join().expect("join");
        assert_eq!(seen.get(), Some(Class::Urgent));
        assert!(stats().remote_wakes >= 1);
    });
}

#[test]
fn multiple_wakes_queue_once() {
    run(async {
        let polls = Rc::new(Cell::new(0u32));
        let slot: Rc<RefCell<Option<Waker>>> = Rc::new(RefCell::new(None));
        let (p2, w2) = (polls.clone(), slot.clone());
        let t = spawn(
            Class::Normal,
            "counted",
            poll_fn(move |cx| {
                p2.set(p2.get() + 1);
                *w2.borrow_mut() = Some(cx.waker().clone());
                if p2.get() >= 3 {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }),
        );
        sleep(Duration::from_millis(10)).await;
        assert_eq!(polls.get(), 1);
        let w = slot.borrow().clone().expect("waker");
        for _ in 0..5 {
            w.wake_by_ref();
        }
        sleep(Duration::from_millis(10)).await;
        assert_eq!(polls.get(), 2, "five local wakes, one run");
        let w = slot.borrow().clone().expect("waker");
        std::thread::spawn(move || {
            for _ in 0..5 {
                w.wake_by_ref();
            }
        })
        .join()
        .expect("join");
        sleep(Duration::from_millis(10)).await;
        assert_eq!(polls.get(), 3, "five remote wakes, one run");
        assert!(t.is_finished());
        assert_eq!(stats().remote_wakes, 1, "one inbox message for five wakes");
    });
}

#[test]
fn inner_polls_are_not_throttled_by_tokio_coop() {
    // tokio's budget is 128 resource polls per `block_on` poll; without
    // `unconstrained` the later receivers would return Pending, be woken after
    // the reactor turn (Urgent) and run twice.
    const N: usize = 300;
    run(async {
        let classes = Rc::new(RefCell::new(Vec::new()));
        // Polls counted by the tasks themselves (the profiling table is process-wide
        // state that other tests switch and reset).
        let polls = Rc::new(Cell::new(0usize));
        for i in 0..N {
            let (tx, rx) = tokio::sync::oneshot::channel::<usize>();
            tx.send(i).expect("fill");
            let c = classes.clone();
            let p = polls.clone();
            let mut body = Box::pin(async move {
                assert_eq!(rx.await.expect("value"), i);
                c.borrow_mut().push(current_class());
            });
            spawn(
                Class::Normal,
                "coop-rx",
                poll_fn(move |cx| {
                    p.set(p.get() + 1);
                    body.as_mut().poll(cx)
                }),
            );
        }
        sleep(Duration::from_millis(20)).await;
        assert_eq!(classes.borrow().len(), N);
        assert!(classes.borrow().iter().all(|c| *c == Some(Class::Normal)));
        assert_eq!(polls.get(), N, "each receiver polled once");
    });
}

// ---------------------------------------------------------------- remote

#[test]
fn remote_run_between_two_workers() {
    let (rtx, rrx) = std::sync::mpsc::channel::<Remote>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let w1 = std::thread::spawn(move || {
        run_worker(1, cfg(), async move {
            rtx.send(remote()).expect("hand out remote");
            timeout(WAIT, stop_rx).await.expect("stop").expect("stop");
            assert_eq!(stats().remote_jobs, 1);
        });
    });
    let r1 = rrx.recv_timeout(WAIT).expect("remote of worker 1");
    assert_eq!(r1.thread_id(), 1);
    assert!(r1.is_alive());
    let r1b = r1.clone();
    run(async move {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let caller = std::thread::current().id();
        // Register this task's waker before the job can answer, so the answer
        // always arrives as a wake from worker 1 (not already there at first poll).
        poll_fn(|cx| {
            assert!(std::pin::Pin::new(&mut rx).poll(cx).is_pending());
            Poll::Ready(())
        })
        .await;
        r1.run(Box::new(move || {
            let in_job = (
                thread_id(),
                current_class(),
                std::thread::current().id() != caller,
            );
            spawn(Class::Normal, "from-remote", async move {
                let _ = tx.send((in_job, current_class(), thread_id()));
            });
        }));
        let (in_job, cls, tid) = timeout(WAIT, &mut rx)
            .await
            .expect("answer")
            .expect("answer");
        assert_eq!(in_job, (1, Some(Class::Urgent), true));
        assert_eq!(cls, Some(Class::Normal));
        assert_eq!(tid, 1);
        assert_eq!(thread_id(), 0);
        // The answer may have arrived during this poll; its wake is counted when
        // the inbox is drained, before this task runs again.
        yield_now().await;
        assert!(
            stats().remote_wakes >= 1,
            "the oneshot woke us from worker 1"
        );
        stop_tx.send(()).expect("stop worker 1");
    });
    w1.join().expect("worker 1");
    // A Remote of a finished worker drops the job without running it.
    assert!(!r1b.is_alive());
    let ran = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicBool::new(false));
    let (ran2, guard) = (ran.clone(), SetOnDrop(dropped.clone()));
    r1b.run(Box::new(move || {
        let _g = guard;
        ran2.store(true, Ordering::SeqCst);
    }));
    assert!(!ran.load(Ordering::SeqCst));
    assert!(dropped.load(Ordering::SeqCst));
}

// ---------------------------------------------------------------- idle, I/O, lifecycle

#[test]
fn idle_worker_does_not_spin() {
    run(async {
        spawn(Class::Normal, "pending", pending::<()>());
        let n = Rc::new(Notify::new());
        let n2 = n.clone();
        spawn(Class::Normal, "waiter", async move { n2.notified().await });
        sleep(Duration::from_millis(5)).await;
        let (l0, c0) = (stats().loops, thread_cpu_ticks());
        sleep(Duration::from_millis(200)).await;
        let (l1, c1) = (stats().loops, thread_cpu_ticks());
        assert!(l1 - l0 <= 3, "{} loops in 200 ms idle", l1 - l0);
        assert!(c1 - c0 <= 5, "{} cpu ticks in 200 ms idle", c1 - c0);
    });
}

#[test]
fn real_async_io_echo() {
    const LEN: usize = 256 * 1024;
    run(async {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        spawn(Class::Normal, "accept", async move {
            let (mut s, _) = l.accept().await.expect("accept");
            spawn(Class::Normal, "echo", async move {
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    let n = s.read(&mut buf).await.expect("read");
                    if n == 0 {
                        break;
                    }
                    s.write_all(&buf[..n]).await.expect("write");
                }
                s.shutdown().await.expect("shutdown");
            });
        });
        let c = TcpStream::connect(addr).await.expect("connect");
        let (mut rd, mut wr) = c.into_split();
        let data: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
        let sent = data.clone();
        spawn(Class::Normal, "writer", async move {
            for chunk in sent.chunks(LEN / 4) {
                wr.write_all(chunk).await.expect("write");
                sleep(Duration::from_millis(2)).await;
            }
            wr.shutdown().await.expect("shutdown");
        });
        let mut got = Vec::with_capacity(LEN);
        timeout(WAIT, rd.read_to_end(&mut got))
            .await
            .expect("echo in time")
            .expect("read");
        assert_eq!(got.len(), LEN);
        assert!(got == data, "echoed bytes differ");
    });
}

#[test]
fn main_completion_returns_and_drops_the_rest() {
    let dropped = Arc::new(AtomicBool::new(false));
    let guard = SetOnDrop(dropped.clone());
    let t0 = Instant::now();
    run(async move {
        spawn(Class::Normal, "forever", async move {
            let _g = guard;
            pending::<()>().await
        });
        spawn(Class::Bulk, "long-sleeper", async {
            sleep(Duration::from_secs(10)).await
        });
        // A task that never stops yielding must not starve main's timer.
        spawn(Class::Urgent, "spinner", async {
            loop {
                yield_now().await
            }
        });
        sleep(Duration::from_millis(20)).await;
    });
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(
        dropped.load(Ordering::SeqCst),
        "remaining tasks are dropped"
    );
    assert_eq!(try_thread_id(), None);
    // The thread can host a worker again.
    let ran = Rc::new(Cell::new(false));
    let r2 = ran.clone();
    run_worker(3, cfg(), async move {
        assert_eq!(thread_id(), 3);
        r2.set(true)
    });
    assert!(ran.get());
}

#[test]
fn abort_drops_the_future_from_any_thread() {
    run(async {
        let d1 = Arc::new(AtomicBool::new(false));
        let g1 = SetOnDrop(d1.clone());
        let h = spawn(Class::Normal, "victim", async move {
            let _g = g1;
            pending::<()>().await
        });
        sleep(Duration::from_millis(5)).await;
        assert!(!h.is_finished());
        h.abort();
        wait_finished(&h).await;
        assert!(d1.load(Ordering::SeqCst));

        let d2 = Arc::new(AtomicBool::new(false));
        let g2 = SetOnDrop(d2.clone());
        let h2 = spawn(Class::Normal, "victim2", async move {
            let _g = g2;
            pending::<()>().await
        });
        sleep(Duration::from_millis(5)).await;
        std::thread::spawn(move || h2.abort()).join().expect("join");
        let deadline = Instant::now() + WAIT;
        while !d2.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "remote abort not applied");
            sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(stats().tasks, 1, "only main is left");
    });
}

#[test]
fn profiling_counts_calls_cpu_and_latency() {
    let _lock = prof_lock();
    set_profiling_mode(ProfilingMode::On);
    run(async {
        let busy = spawn(Class::Normal, "prof-busy", async {
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(3) {
                std::hint::spin_loop();
            }
        });
        let sleeper = spawn(Class::Normal, "prof-sleeper", async {
            for _ in 0..3 {
                sleep(Duration::from_millis(1)).await;
            }
        });
        wait_finished(&busy).await;
        wait_finished(&sleeper).await;
        let st = stats();
        let get = |n| {
            st.profiling
                .iter()
                .find(|p| p.name == n)
                .cloned()
                .unwrap_or_else(|| panic!("no profile for {n}"))
        };
        let b = get("prof-busy");
        assert_eq!(b.calls, 1);
        assert!(b.cpu_ns >= 3_000_000, "{b:?}");
        let s = get("prof-sleeper");
        assert_eq!(s.calls, 4, "{s:?}");
        assert!(s.lat_ns > 0, "{s:?}");
        assert!(get("main").calls >= 2);
    });
}

#[test]
fn nested_run_worker_is_an_error() {
    run(async {
        match try_run_worker(1, cfg(), async {}) {
            Err(SchedError::Nested { thread_id, running }) => {
                assert_eq!((thread_id, running), (1, 0));
            }
            other => panic!("expected Nested, got {other:?}"),
        }
    });
}

#[test]
#[should_panic(expected = "called off a worker thread")]
fn spawn_off_worker_panics() {
    let _ = spawn(Class::Normal, "nowhere", async {});
}

#[test]
#[should_panic(expected = "called off a worker thread")]
fn thread_id_off_worker_panics() {
    let _ = thread_id();
}

/// Rough cost numbers (`cargo test --release -p proxy --lib scheduler::tests::bench -- --ignored --nocapture`).
#[test]
#[ignore = "timing report, not a check"]
fn bench_overhead() {
    const N: u32 = 200_000;
    run(async {
        let t = Instant::now();
        for _ in 0..N {
            spawn(Class::Normal, "noop", async {});
        }
        while stats().tasks > 1 {
            yield_now().await;
        }
        let spawn_ns = t.elapsed().as_nanos() / u128::from(N);
        let t = Instant::now();
        let h = spawn(Class::Normal, "yielder", async {
            for _ in 0..N {
                yield_now().await;
            }
        });
        wait_finished(&h).await;
        let yield_ns = t.elapsed().as_nanos() / u128::from(N);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
        let t = Instant::now();
        let h = spawn(Class::Normal, "ping", async move {
            for i in 0..N {
                tx.send(i).expect("send");
                yield_now().await;
            }
        });
        let r = spawn(Class::Normal, "pong", async move {
            for _ in 0..N {
                rx.recv().await.expect("recv");
            }
        });
        wait_finished(&h).await;
        wait_finished(&r).await;
        let pingpong_ns = t.elapsed().as_nanos() / u128::from(N);
        eprintln!(
            "spawn+run no-op: {spawn_ns} ns; self-yield round: {yield_ns} ns; \
             channel ping-pong step: {pingpong_ns} ns; loops {}",
            stats().loops
        );
    });
}

// ---------------------------------------------------------------- activity

#[test]
fn swrate_converges_to_a_constant_input() {
    let mut sum = 0;
    for _ in 0..20 * LOOP_AVG_SAMPLES {
        sum = swrate_add(sum, LOOP_AVG_SAMPLES, 1000);
    }
    assert_eq!(swrate_avg(sum, LOOP_AVG_SAMPLES), 1000);
    // A step down moves the average by about 63% after one window of samples.
    for _ in 0..LOOP_AVG_SAMPLES {
        sum = swrate_add(sum, LOOP_AVG_SAMPLES, 0);
    }
    let avg = swrate_avg(sum, LOOP_AVG_SAMPLES);
    assert!((300..=420).contains(&avg), "{avg}");
    // One slow loop barely moves it.
    let one = swrate_avg(swrate_add(sum, LOOP_AVG_SAMPLES, 100_000), LOOP_AVG_SAMPLES);
    assert!(one < avg + 200, "{one} vs {avg}");
}

#[test]
fn auto_profiling_switches_with_hysteresis() {
    use ProfilingMode::*;
    assert_eq!((AUTO_ON_US, AUTO_OFF_US), (1000, 990));
    // Off → on only at the "up" threshold.
    assert!(!profiling_active(Auto, false, 999));
    assert!(profiling_active(Auto, false, 1000));
    // On → off only below the "down" threshold.
    assert!(profiling_active(Auto, true, 995));
    assert!(profiling_active(Auto, true, 990));
    assert!(!profiling_active(Auto, true, 989));
    // Forced modes ignore the load.
    assert!(profiling_active(On, false, 0));
    assert!(!profiling_active(Off, true, 1_000_000));

    // Fed with loop times, the switch follows the sliding average.
    let (mut sum, mut active) = (0, false);
    let feed = |us: u64, n: u64, sum: &mut u64, active: &mut bool| {
        for _ in 0..n {
            *sum = swrate_add(*sum, LOOP_AVG_SAMPLES, us);
            *active = profiling_active(Auto, *active, swrate_avg(*sum, LOOP_AVG_SAMPLES));
        }
    };
    feed(500, 5000, &mut sum, &mut active);
    assert!(!active, "500 us loops stay off");
    feed(2000, 5000, &mut sum, &mut active);
    assert!(active, "2 ms loops switch it on");
    feed(995, 5000, &mut sum, &mut active);
    assert!(active, "995 us is inside the hysteresis band");
    feed(900, 5000, &mut sum, &mut active);
    assert!(!active, "900 us loops switch it off");
}

#[test]
fn freq_ctr_reads_the_last_period() {
    const P: u64 = 1_000_000_000;
    let mut f = FreqCtr::new(P);
    f.add(0, 10);
    assert_eq!(f.read(P / 2), 10);
    f.add(P / 2, 10);
    assert_eq!(f.read(P - 1), 20);
    // Half-way into the next period, half of the previous one still counts.
    assert_eq!(f.read(P + P / 2), 10);
    f.add(P + P / 2, 4);
    assert_eq!(f.read(P + P / 2), 14);
    // Two idle periods later, nothing is left.
    assert_eq!(f.read(4 * P), 0);
    f.add(10 * P, 1);
    assert_eq!(f.read(10 * P), 1);
}

#[test]
fn activity_counters_are_measured() {
    run(async {
        let before = stats();
        // Three sleeps: three parks with nothing queued, woken by a timer.
        for _ in 0..3 {
            sleep(Duration::from_millis(2)).await;
        }
        let flows: Vec<_> = (0..4)
            .map(|_| {
                spawn(Class::Normal, FLOW_TASK, async {
                    yield_now().await;
                })
            })
            .collect();
        for f in &flows {
            wait_finished(f).await;
        }
        note_accepted();
        note_accepted();
        let after = stats();
        assert!(after.loops > before.loops);
        assert!(after.empty_rq >= before.empty_rq + 3, "{after:?}");
        assert!(after.poll_io >= before.poll_io + 3, "{after:?}");
        assert_eq!(
            after.stream_calls - before.stream_calls,
            8,
            "two runs per flow task"
        );
        assert_eq!(after.accepted - before.accepted, 2);
        assert!(after.avg_loop_us() < 1_000_000);
    });
}

#[test]
fn long_rq_and_wake_tasks_count_leftover_work() {
    run(async {
        let before = stats();
        // More self-yielding tasks than a loop's budget: loops end with work queued.
        let depth = cfg().depth();
        let tasks: Vec<_> = (0..depth * 3)
            .map(|_| {
                spawn(Class::Normal, "busy", async {
                    for _ in 0..3 {
                        yield_now().await;
                    }
                })
            })
            .collect();
        for t in &tasks {
            wait_finished(t).await;
        }
        let after = stats();
        assert!(after.long_rq > before.long_rq, "{after:?}");
        assert!(after.wake_tasks >= after.long_rq - before.long_rq);
    });
}

#[test]
fn remote_stats_reach_another_worker() {
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        run_worker(1, cfg(), async move {
            note_accepted();
            let _ = tx.send(remote());
            // Stay alive long enough to answer.
            sleep(Duration::from_millis(500)).await;
        });
    });
    let r = rx.recv_timeout(WAIT).expect("remote");
    run(async move {
        let s = timeout(WAIT, r.stats())
            .await
            .expect("answer")
            .expect("alive");
        assert_eq!(s.thread_id, 1);
        assert_eq!(s.accepted, 1);
        assert!(s.remote_jobs <= 1);
    });
    worker.join().expect("worker");
}

// ---------------------------------------------------------------- heavy class, rounds

#[test]
fn heavy_budget_is_capped_carried_and_never_refilled() {
    let r = Rules::default();
    // Other work queued: one heavy task, whatever its weighted share.
    assert_eq!(round_budgets(280, [10, 0, 0, 5], 1, r), [276, 0, 0, 1]);
    // Unused, it carries over as the next round's weight; used, nothing is left.
    assert_eq!(round_budgets(50, [0, 4, 0, 3], 1, r), [0, 49, 0, 1]);
    assert_eq!(round_budgets(50, [0, 4, 0, 3], 0, r), [0, 50, 0, 0]);
    // Heavy work alone drains faster: 1 + queued / HEAVY_ALONE_BATCH.
    assert_eq!(
        heavy_limit([0, 0, 0, 1000], r),
        1 + 1000 / HEAVY_ALONE_BATCH
    );
    assert_eq!(round_budgets(280, [0, 0, 0, 1000], 1, r), [0, 0, 0, 8]);
    assert_eq!(heavy_limit([1, 0, 0, 1000], r), HEAVY_PER_LOOP);
    // Low latency: always one.
    let ll = Rules {
        low_latency: true,
        ..r
    };
    assert_eq!(heavy_limit([0, 0, 0, 1000], ll), 1);
    // Without the rule: the weighted share, uncapped.
    let off = Rules {
        heavy_cap: false,
        ..r
    };
    assert_eq!(round_budgets(280, [0, 0, 0, 1000], 1, off), [0, 0, 0, 280]);
    assert_eq!(round_budgets(280, [10, 0, 0, 5], 1, off), [276, 0, 0, 5]);
    assert_eq!(max_processed(280, 400), 200);
    assert_eq!(max_processed(280, 100), 280);
}

#[test]
fn loop_rounds_share_what_a_dry_class_left() {
    let r = Rules::default();
    // Round 1: [160, 120]; Urgent runs dry at 10, so round 2 gives Normal the
    // remaining 150: all 210 run in one loop.
    assert_eq!(budget::plan_loop(280, [10, 200, 0, 0], r), [10, 200, 0, 0]);
    // The heavy class is not refilled by later rounds.
    assert_eq!(budget::plan_loop(280, [10, 0, 0, 5], r), [10, 0, 0, 1]);
    assert_eq!(budget::plan_loop(280, [0, 0, 0, 1000], r), [0, 0, 0, 8]);
    let off = Rules {
        heavy_cap: false,
        ..r
    };
    assert_eq!(budget::plan_loop(280, [10, 0, 0, 5], off), [10, 0, 0, 5]);
    // Depth still bounds the loop.
    assert_eq!(
        budget::plan_loop(280, [1000, 1000, 1000, 0], r)
            .iter()
            .sum::<usize>(),
        280
    );
}

/// Class of each run of a task that marks itself heavy, yields, sleeps, and
/// drops the mark (with the rule on or off).
fn heavy_mark_classes(heavy_cap: bool) -> Vec<Option<Class>> {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s = seen.clone();
    let cfg = SchedConfig { heavy_cap, ..cfg() };
    run_worker(0, cfg, async move {
        let t = spawn(Class::Normal, "marker", async move {
            let push = |s: &Rc<RefCell<Vec<_>>>| s.borrow_mut().push(current_class());
            push(&s);
            let g = heavy().await; // self-wake while marked
            push(&s);
            sleep(Duration::from_millis(2)).await; // timer wake while marked
            push(&s);
            drop(g);
            yield_now().await; // self-wake, unmarked
            push(&s);
            sleep(Duration::from_millis(2)).await; // timer wake, unmarked
            push(&s);
        });
        wait_finished(&t).await;
    });
    let v = seen.borrow().clone();
    v
}

#[test]
fn marked_heavy_wakes_land_in_heavy_until_the_guard_drops() {
    let c = Some;
    assert_eq!(
        heavy_mark_classes(true),
        [
            c(Class::Normal),
            c(Class::Heavy),
            c(Class::Heavy),
            c(Class::Bulk),
            c(Class::Urgent)
        ]
    );
    // Without the rule the mark is ignored: ordinary wake classes.
    assert_eq!(
        heavy_mark_classes(false),
        [
            c(Class::Normal),
            c(Class::Bulk),
            c(Class::Urgent),
            c(Class::Bulk),
            c(Class::Urgent)
        ]
    );
    // Outside a task, marking does nothing (and does not panic).
    drop(enter_heavy());
}

/// Most runs of marked-heavy work seen in one loop while 200 light self-waking
/// tasks keep the other classes busy.
fn max_heavy_runs_per_loop(heavy_cap: bool) -> usize {
    let per_loop = Rc::new(RefCell::new(std::collections::HashMap::<u64, usize>::new()));
    let p = per_loop.clone();
    let cfg = SchedConfig { heavy_cap, ..cfg() };
    run_worker(0, cfg, async move {
        let mut all = Vec::new();
        for _ in 0..200 {
            all.push(spawn(Class::Normal, "light", async {
                for _ in 0..20 {
                    yield_now().await;
                }
            }));
        }
        for _ in 0..20 {
            let p = p.clone();
            all.push(spawn(Class::Normal, "heavy-chunks", async move {
                let _g = heavy().await;
                for _ in 0..5 {
                    *p.borrow_mut().entry(stats().loops).or_default() += 1;
                    yield_now().await;
                }
            }));
        }
        for t in &all {
            wait_finished(t).await;
        }
    });
    let m = per_loop.borrow().values().copied().max().unwrap_or(0);
    m
}

#[test]
fn one_heavy_run_per_loop_unless_the_rule_is_off() {
    assert_eq!(max_heavy_runs_per_loop(true), 1);
    // Without the rule, the marked tasks are Bulk self-wakers: many per loop.
    assert!(max_heavy_runs_per_loop(false) > 1);
}

#[test]
fn a_task_runs_at_most_once_per_loop() {
    run(async {
        set_loop_trace(true);
        let t = spawn(Class::Normal, "spinner", async {
            for _ in 0..50 {
                yield_now().await;
            }
        });
        wait_finished(&t).await;
        let trace = take_loop_trace();
        // Rounds would otherwise run the self-waker again and again in one loop.
        assert!(trace.iter().all(|l| l[2] <= 1), "{trace:?}");
        assert!(trace.iter().map(|l| l[2]).sum::<u32>() >= 50);
    });
}

#[test]
fn low_latency_preempts_a_heavy_backlog() {
    // Low latency: a heavy backlog alone still runs one task per loop, and an
    // Urgent wake made by a running Normal task runs before the next Normal one.
    let ll = Rules {
        low_latency: true,
        ..Rules::default()
    };
    assert_eq!(budget::plan_loop(280, [0, 0, 0, 1000], ll), [0, 0, 0, 1]);
    let cfg = SchedConfig {
        low_latency: true,
        ..cfg()
    };
    run_worker(0, cfg, async {
        set_loop_trace(true);
        let hs: Vec<_> = (0..20)
            .map(|_| spawn(Class::Heavy, "heavy", async {}))
            .collect();
        for h in &hs {
            wait_finished(h).await;
        }
        let trace = take_loop_trace();
        assert!(trace.iter().all(|l| l[3] <= 1), "{trace:?}");
    });
}

// ---------------------------------------------------------------- acceptance 2

#[test]
fn profiling_reports_cpu_avg_latency_and_resets_on_on() {
    let _lock = prof_lock();
    set_profiling_mode(ProfilingMode::On);
    run(async {
        // A task that spins 2 ms per run, three runs; it times its runs itself
        // (on a loaded machine a run may be preempted and last longer).
        let own = Rc::new(Cell::new(0u64));
        let own2 = own.clone();
        let spin = spawn(Class::Normal, "spin-2ms", async move {
            for _ in 0..3 {
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(2) {
                    std::hint::spin_loop();
                }
                own2.set(own2.get() + t.elapsed().as_nanos() as u64);
                yield_now().await;
            }
        });
        wait_finished(&spin).await;
        // A task queued behind 1000 others (each a little work).
        for _ in 0..1000 {
            spawn(Class::Normal, "ahead", async {
                std::hint::black_box((0..200u32).sum::<u32>());
            });
        }
        let behind = spawn(Class::Normal, "behind", async {});
        wait_finished(&behind).await;
        let st = stats();
        let get = |n| {
            st.profiling
                .iter()
                .find(|p| p.name == n)
                .cloned()
                .unwrap_or_else(|| panic!("no profile for {n}"))
        };
        let s = get("spin-2ms");
        assert_eq!(s.calls, 4, "{s:?}");
        // Three runs of 2 ms and a last one that only returns: the profile
        // matches the task's own timing of its runs to within scheduler overhead.
        let avg3 = s.cpu_ns / 3;
        let own_avg = own.get() / 3;
        assert!(avg3 >= 2_000_000, "{s:?}");
        assert!(
            avg3.abs_diff(own_avg) < 200_000,
            "profiled {avg3} ns per run, measured {own_avg} ns: {s:?}"
        );
        if own_avg < 2_050_000 {
            let shown = crate::cli::render::time_short(avg3);
            assert!(shown.starts_with("2.0") && shown.ends_with("ms"), "{shown}");
        } else {
            eprintln!("spin runs were preempted ({own_avg} ns each): format not checked");
        }
        let b = get("behind");
        assert_eq!(b.calls, 1);
        assert!(b.lat_ns > 0, "{b:?}");
        // It waited at least for the 1000 ahead of it to run.
        assert!(b.lat_ns >= get("ahead").cpu_ns, "{b:?}");
        // `set profiling tasks on` resets the counters (at the worker's next loop).
        set_profiling_mode(ProfilingMode::On);
        yield_now().await;
        let st = stats();
        let calls = |n| st.profiling.iter().find(|p| p.name == n).map(|p| p.calls);
        assert_eq!(calls("spin-2ms"), Some(0));
        assert_eq!(calls("behind"), Some(0));
    });
}

// ---------------------------------------------------------------- show info load

#[test]
fn load_publishes_tasks_run_queue_and_idle() {
    let (rtx, rrx) = std::sync::mpsc::channel::<Remote>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (busy_tx, busy_rx) = std::sync::mpsc::channel::<()>();
    let w = std::thread::spawn(move || {
        run_worker(3, cfg(), async move {
            rtx.send(remote()).expect("hand out remote");
            for _ in 0..5 {
                spawn(Class::Normal, "idler", pending::<()>());
            }
            // Busy for more than one idle sample: spin in 1 ms runs.
            let t = Instant::now();
            while t.elapsed() < Duration::from_nanos(IDLE_WINDOW_NS * 3 / 2) {
                let r = Instant::now();
                while r.elapsed() < Duration::from_millis(1) {
                    std::hint::spin_loop();
                }
                yield_now().await;
            }
            busy_tx.send(()).expect("busy done");
            timeout(WAIT * 2, stop_rx)
                .await
                .expect("stop")
                .expect("stop");
        });
    });
    let r = rrx.recv_timeout(WAIT).expect("remote");
    busy_rx.recv_timeout(WAIT).expect("busy phase");
    let busy = load(std::slice::from_ref(&r));
    assert_eq!(busy.tasks, 6, "main and 5 idlers: {busy:?}");
    assert!(busy.idle_pct < 50, "{busy:?}");
    // Parked for more than a sample: idle, nothing queued.
    std::thread::sleep(Duration::from_nanos(IDLE_WINDOW_NS * 3 / 2));
    let idle = load(std::slice::from_ref(&r));
    assert_eq!(idle.idle_pct, 100, "{idle:?}");
    assert_eq!(idle.run_queue, 0, "{idle:?}");
    stop_tx.send(()).expect("stop");
    w.join().expect("worker");
    // No live worker: nothing counted.
    assert_eq!(load(&[r]).tasks, 0);
}

/// A task's `now()` is the worker's clock as of its pass: never ahead of the
/// real clock, caught up after the task waits; off a worker it is tokio's clock,
/// and a worker that ended leaves no stale reading on its thread.
#[test]
fn now_is_the_passs_clock_and_no_older_than_the_pass() {
    run(async {
        let before = std::time::Instant::now();
        yield_now().await;
        let t = super::now().into_std();
        assert!(t >= before, "a reading from before the pass");
        assert!(t <= std::time::Instant::now(), "a reading from the future");
        sleep(Duration::from_millis(20)).await;
        let later = super::now().into_std();
        assert!(
            later >= t + Duration::from_millis(20),
            "the pass after a 20 ms wait reads the clock again"
        );
    });
    // The worker has ended on this thread: what follows reads the clock.
    std::thread::sleep(Duration::from_millis(20));
    let before = std::time::Instant::now();
    let t = super::now().into_std();
    assert!(t >= before, "a stale reading left by the worker");
    assert!(t <= std::time::Instant::now());
}
