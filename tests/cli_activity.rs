//! `show activity`, `show profiling` and `set profiling tasks` against a real daemon
//! (two worker threads): every activity line carries a total and one value per
//! thread, the counters grow with traffic (loops, accepted), the profiling table
//! names shunt's tasks, and the profiling mode set over the CLI or by `profiling.tasks`
//! in the config shows in the header.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use shunt_tests::*;

const WAIT: Duration = Duration::from_secs(5);
/// Worker threads of `simple_config`.
const NBTHREAD: usize = 2;
/// Flows each round opens (each one echo round trip, then close).
const FLOWS: usize = 6;

/// `show activity` as `name → [total, t1, t2, ...]`, checking the line shapes.
fn activity(sock: &Path) -> Vec<(String, Vec<u64>)> {
    let out = cli(sock, "show activity");
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some(format!("thread_id: 1 (1..{NBTHREAD})").as_str()),
        "{out}"
    );
    let date = lines.next().unwrap_or_default();
    let (secs, usecs) = date
        .strip_prefix("date_now: ")
        .and_then(|d| d.split_once('.'))
        .unwrap_or_else(|| panic!("date_now line: {date:?}"));
    assert!(secs.parse::<u64>().expect("secs") > 1_600_000_000);
    assert_eq!(usecs.len(), 6, "{date}");
    let mut fields = Vec::new();
    for l in lines.take_while(|l| !l.is_empty()) {
        // `name: total [ t1 t2 ]`
        let (name, rest) = l.split_once(": ").unwrap_or_else(|| panic!("line {l:?}"));
        let words: Vec<&str> = rest.split(' ').collect();
        assert_eq!(words.len(), NBTHREAD + 3, "line {l:?}");
        assert_eq!((words[1], words[NBTHREAD + 2]), ("[", "]"), "line {l:?}");
        let nums: Vec<u64> = words
            .iter()
            .filter(|w| **w != "[" && **w != "]")
            .map(|w| w.parse().unwrap_or_else(|_| panic!("number in {l:?}")))
            .collect();
        fields.push((name.to_string(), nums));
    }
    fields
}

fn field(fields: &[(String, Vec<u64>)], name: &str) -> Vec<u64> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no {name} line"))
}

/// Open `n` flows through shunt, one echo round trip each, and close them.
fn run_flows(port: u16, n: usize) {
    for i in 0..n {
        let mut c = connect(([127, 0, 0, 1], port).into());
        c.set_read_timeout(Some(WAIT)).expect("timeout");
        let msg = [i as u8; 32];
        c.write_all(&msg).expect("write");
        let mut back = [0u8; 32];
        c.read_exact(&mut back).expect("echo");
        assert_eq!(back, msg);
    }
}

/// The profiling table rows as `(name, calls)`.
fn profiling_rows(out: &str) -> Vec<(String, u64)> {
    out.lines()
        .skip_while(|l| *l != "Tasks activity:")
        .skip(2)
        .take_while(|l| !l.is_empty())
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[0].to_string(), w[1].parse().expect("calls"))
        })
        .collect()
}

fn header_mode(sock: &Path) -> String {
    let out = cli(sock, "show profiling status");
    let first = out.lines().next().unwrap_or_default().to_string();
    assert!(
        first.starts_with("Per-task CPU profiling              : "),
        "{out}"
    );
    assert!(
        first.ends_with("# set profiling tasks {on|auto|off}"),
        "{out}"
    );
    first[38..46].trim_end().to_string()
}

#[test]
fn show_activity_counts_per_thread() {
    let echo = Server::echo();
    let port = free_port();
    let shunt = Shunt::start(&simple_config(port, &[echo.addr], ""), &[]);
    let sock = shunt.sock();

    let a1 = activity(&sock);
    let names: Vec<&str> = a1.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names.join(" "),
        "ctxsw tasksw empty_rq long_rq loops wake_tasks wake_signal poll_io poll_exp \
         poll_drop_fd poll_skip_fd conn_dead stream_calls pool_fail buf_wait cpust_ms_tot \
         cpust_ms_1s cpust_ms_15s avg_loop_us accepted accq_pushed accq_full accq_ring \
         fd_takeover"
    );
    // Totals are the sums of the per-thread values (avg_loop_us: their mean).
    for (name, v) in &a1 {
        let per: u64 = v[1..].iter().sum();
        if name == "avg_loop_us" {
            assert!(v[0] <= *v[1..].iter().max().unwrap_or(&0), "{name}: {v:?}");
        } else {
            assert_eq!(v[0], per, "{name}: {v:?}");
        }
    }
    assert_eq!(field(&a1, "accepted")[0], 0, "no flow yet");

    run_flows(port, FLOWS);
    // A flow's accept is counted before its echo comes back; wait for the flow
    // tasks to finish running (their calls are counted when they run).
    let t0 = Instant::now();
    let a2 = loop {
        let a = activity(&sock);
        if field(&a, "accepted")[0] == FLOWS as u64 || t0.elapsed() > WAIT {
            break a;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(field(&a2, "accepted")[0], FLOWS as u64, "{a2:?}");
    let (l1, l2) = (field(&a1, "loops"), field(&a2, "loops"));
    assert!(l2[0] > l1[0], "loops grow: {l1:?} -> {l2:?}");
    // The CLI's worker loops at least once per command it answers.
    assert!(l2[1] > l1[1], "worker 1 looped: {l1:?} -> {l2:?}");
    let sc = field(&a2, "stream_calls");
    assert!(sc[0] >= FLOWS as u64, "each flow task ran: {sc:?}");
    let (c1, c2) = (field(&a1, "ctxsw"), field(&a2, "ctxsw"));
    assert!(c2[0] > c1[0]);
    assert!(field(&a2, "tasksw")[0] <= c2[0]);
    assert!(field(&a2, "poll_io")[0] > 0, "the reactor woke tasks");
    assert!(field(&a2, "empty_rq")[0] > 0, "idle workers parked");
    // Counters shunt has no notion of stay at zero.
    for name in ["poll_exp", "accq_pushed", "fd_takeover"] {
        assert!(field(&a2, name).iter().all(|v| *v == 0), "{name}");
    }
}

#[test]
fn profiling_lists_tasks_and_follows_the_mode() {
    let echo = Server::echo();
    let port = free_port();
    let shunt = Shunt::start(&simple_config(port, &[echo.addr], ""), &[]);
    let sock = shunt.sock();

    // HAProxy's default: auto, off while loops are short.
    assert_eq!(header_mode(&sock), "auto-off");
    assert_eq!(cli(&sock, "set profiling tasks on"), "\n");
    assert_eq!(header_mode(&sock), "on");

    run_flows(port, FLOWS);
    let out = cli(&sock, "show profiling");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..4],
        [
            "Per-task CPU profiling              : on            # set profiling tasks {on|auto|off}",
            "Memory usage profiling              : off           # set profiling memory {on|off}",
            "Tasks activity:",
            "  function                      calls   cpu_tot   cpu_avg   lat_tot   lat_avg",
        ],
        "{out}"
    );
    let rows = profiling_rows(&out);
    let calls = |name: &str| rows.iter().find(|(n, _)| n == name).map(|(_, c)| *c);
    assert!(calls("session").unwrap_or(0) >= FLOWS as u64, "{out}");
    assert!(calls("accept").unwrap_or(0) > 0, "{out}");
    assert!(calls("cli-conn").unwrap_or(0) > 0, "{out}");
    // Most called first; every row is 2 + 35 + 4 x 10 columns wide.
    assert!(rows.windows(2).all(|w| w[0].1 >= w[1].1), "{out}");
    for l in out.lines().skip(4).take_while(|l| !l.is_empty()) {
        assert_eq!(l.len(), 2 + 35 + 4 * 10, "{l:?}");
    }

    // `show profiling tasks` has no status lines; `on` resets the table.
    let tasks = cli(&sock, "show profiling tasks");
    assert!(tasks.starts_with("Tasks activity:\n"), "{tasks}");
    assert_eq!(cli(&sock, "set profiling tasks on"), "\n");
    let after = cli(&sock, "show profiling tasks");
    assert_eq!(
        profiling_rows(&after).iter().find(|(n, _)| n == "session"),
        None,
        "no flow ran since the reset: {after}"
    );

    assert_eq!(cli(&sock, "set profiling tasks off"), "\n");
    assert_eq!(header_mode(&sock), "off");
    assert_eq!(cli(&sock, "set profiling tasks auto"), "\n");
    assert_eq!(header_mode(&sock), "auto-off");

    // HAProxy's errors and levels.
    assert_eq!(
        cli(&sock, "set profiling tasks maybe"),
        "Expects 'on', 'auto', or 'off'.\n\n"
    );
    assert_eq!(
        cli(&sock, "operator; show profiling"),
        "\nPermission denied\n\n"
    );
    assert!(cli(&sock, "user; show activity").contains("\nloops: "));
}

#[test]
fn profiling_tasks_in_the_config_sets_the_mode_at_start() {
    let echo = Server::echo();
    let port = free_port();
    let cfg = simple_config(port, &[echo.addr], "").replacen(
        "global\n",
        "global\n    profiling.tasks on\n",
        1,
    );
    let shunt = Shunt::start(&cfg, &[]);
    let sock = shunt.sock();
    assert_eq!(header_mode(&sock), "on");
    // Profiled from the first flow, with no `set profiling` in between.
    run_flows(port, FLOWS);
    let rows = profiling_rows(&cli(&sock, "show profiling tasks"));
    let session = rows.iter().find(|(n, _)| n == "session").map(|(_, c)| *c);
    assert!(session.unwrap_or(0) >= FLOWS as u64, "{rows:?}");

    let port = free_port();
    let cfg = simple_config(port, &[echo.addr], "").replacen(
        "global\n",
        "global\n    profiling.tasks off\n",
        1,
    );
    let off = Shunt::start(&cfg, &[]);
    assert_eq!(header_mode(&off.sock()), "off");
}

/// `show info` as `name → value`.
fn info(sock: &Path) -> Vec<(String, String)> {
    cli(sock, "show info")
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn info_num(fields: &[(String, String)], name: &str) -> u64 {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name} in show info"))
        .1
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn show_info_reports_tasks_run_queue_and_idle() {
    let echo = Server::echo();
    let port = free_port();
    let shunt = Shunt::start(&simple_config(port, &[echo.addr], ""), &[]);
    let sock = shunt.sock();
    let i1 = info(&sock);
    // At least the accept task of each worker, main of each, the CLI listener and
    // the connection answering.
    let tasks = info_num(&i1, "Tasks");
    assert!(tasks >= 2 * NBTHREAD as u64 + 2, "Tasks {tasks}");
    // The CLI connection itself was queued when its worker's loop started.
    assert!(info_num(&i1, "Run_queue") >= 1, "{i1:?}");
    assert!(info_num(&i1, "Idle_pct") <= 100);
    // Flows held open are live tasks: Tasks grows by one per open flow.
    let mut open = Vec::new();
    for _ in 0..FLOWS {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        c.write_all(b"ping").expect("write");
        let mut b = [0u8; 4];
        c.read_exact(&mut b).expect("echo");
        open.push(c);
    }
    let t0 = Instant::now();
    let grown = loop {
        let n = info_num(&info(&sock), "Tasks");
        if n >= tasks + FLOWS as u64 || t0.elapsed() > WAIT {
            break n;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(grown >= tasks + FLOWS as u64, "{tasks} -> {grown}");
    drop(open);
    // An idle daemon: after more than one 0.5 s sample, (nearly) all idle.
    std::thread::sleep(Duration::from_millis(1200));
    let idle = info_num(&info(&sock), "Idle_pct");
    assert!(idle >= 50, "Idle_pct {idle}");
}
