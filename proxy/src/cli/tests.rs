//! CLI tests: connection loop over real Unix socket pairs, `show stat`/`show info`
//! against a constructed `State`, and end to end through `daemon::run`.

use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener as StdTcpListener, TcpStream as StdTcpStream};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::UnixStream;
use tokio::sync::watch;

use super::*;
use crate::config::{
    Backend, BackendOpts, Balance, BindOpts, CheckParams, Config, ForwardMode, Frontend, Global,
    Location, MapSource, Server, Timeouts,
};
use crate::runtime::Phase;
use crate::stats::Event as StatEvent;

/// Fixed test timeout for any socket wait.
const WAIT: Duration = Duration::from_secs(5);

fn server(name: &str, id: u32, port: u16, check: bool) -> Server {
    Server {
        name: name.into(),
        id,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        weight: 1,
        maxconn: 0,
        maxqueue: 0,
        backup: false,
        disabled: false,
        check: CheckParams {
            enabled: check,
            ..CheckParams::default()
        },
        line: Location::default(),
        pool: Default::default(),
        send_proxy: Default::default(),
        source: None,
        tls: None,
        check_tls: None,
    }
}

/// The reference config of shared/reference/haproxy-2.6-cli/haproxy.cfg: `fe` (iid 2)
/// → `b` (iid 3) with s1, s2 checked; global maxconn 9985.
fn reference_config(fe_bind: SocketAddr, s_ports: [u16; 2]) -> Config {
    Config {
        global: Global {
            maxconn: 9985,
            nbthread: Some(2),
            ..Global::default()
        },
        frontends: vec![Frontend {
            name: "fe".into(),
            id: 2,
            binds: vec![fe_bind],
            bind_opts: vec![BindOpts::default()],
            clitcpka: false,
            default_backend: Some(0),
            use_backends: vec![],
            use_backend_conds: vec![],
            tcp_connection: vec![],
            tcp_content: Vec::new(),
            own_backend: None,
            maxconn: 0,
            timeouts: Timeouts::default(),
            splice: Default::default(),
            log_global: false,
            line: Location::default(),
        }],
        backends: vec![Backend {
            name: "b".into(),
            id: 3,
            balance: Balance::RoundRobin,
            servers: vec![
                server("s1", 1, s_ports[0], true),
                server("s2", 2, s_ports[1], true),
            ],
            timeouts: Timeouts {
                connect: Some(Duration::from_secs(5)),
                ..Timeouts::default()
            },
            retries: 3,
            redispatch: false,
            splice: Default::default(),
            maxconn: 0,
            log_global: false,
            line: Location::default(),
            opts: BackendOpts::default(),
            tcp_content: Vec::new(),
            stick: vec![],
        }],
        stats_pages: vec![],
        maps: vec![],
        tables: vec![],
    }
}

fn make_ctx(config: Config) -> (Ctx, watch::Sender<Phase>) {
    let (tx, rx) = watch::channel(Phase::Running);
    let config = Arc::new(config);
    let state = Arc::new(crate::runtime::Runtime::new(
        config,
        crate::runtime::Facts::new(ForwardMode::Auto, "not loaded (test)".to_string(), 2),
        None,
        rx,
        0,
        false,
        Default::default(),
    ));
    (Ctx::new(state), tx)
}

fn ctx() -> (Ctx, watch::Sender<Phase>) {
    make_ctx(reference_config(
        "127.0.0.1:18080".parse().unwrap(),
        [19001, 19002],
    ))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Send `input` (then close the write side if `close`), run the connection, return all
/// the server wrote.
fn converse(ctx: &Ctx, sess: Session, input: &[u8], close: bool) -> String {
    rt().block_on(async {
        let (mut client, server) = UnixStream::pair().unwrap();
        client.write_all(input).await.unwrap();
        if close {
            client.shutdown().await.unwrap();
        }
        let serve = serve_conn(ctx, server, sess);
        let read = async {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        };
        let (_, got) = tokio::time::timeout(WAIT, async { tokio::join!(serve, read) })
            .await
            .expect("connection did not finish");
        String::from_utf8(got).unwrap()
    })
}

fn op_session() -> Session {
    Session::new(CliLevel::Operator, Duration::from_secs(10))
}

#[test]
fn five_commands_in_one_write_with_immediate_close_are_all_answered() {
    let (ctx, _tx) = ctx();
    for _ in 0..20 {
        let got = converse(
            &ctx,
            op_session(),
            b"show cli level; show cli level; show cli level; show cli level; show cli level\n",
            true,
        );
        assert_eq!(got, "operator\n\n".repeat(5));
    }
}

#[test]
fn command_without_output_answers_one_newline() {
    let (ctx, _tx) = ctx();
    assert_eq!(
        converse(&ctx, op_session(), b"set timeout cli 60\n", true),
        "\n"
    );
}

#[test]
fn non_interactive_closes_after_the_line_but_answers_pipelined_lines() {
    let (ctx, _tx) = ctx();
    // Two lines in one write: both answered (HAProxy does the same).
    assert_eq!(
        converse(
            &ctx,
            op_session(),
            b"show cli level\nuser;show cli level\n",
            true
        ),
        "operator\n\n\nuser\n\n"
    );
    // Without closing our side: the server closes after the first line anyway.
    assert_eq!(
        converse(&ctx, op_session(), b"show cli level\n", false),
        "operator\n\n"
    );
}

#[test]
fn prompt_mode_matches_hatop_wire_capture() {
    let (ctx, _tx) = ctx();
    // hatop: `prompt` → 3 bytes, `set timeout cli 60` → 3 bytes, then `quit`.
    let got = converse(
        &ctx,
        op_session(),
        b"prompt\nset timeout cli 60\nshow cli level\nquit\n",
        false,
    );
    assert_eq!(got, "\n> \n> operator\n\n> ");
    // `prompt` twice switches back to non-interactive: the connection closes.
    assert_eq!(
        converse(&ctx, op_session(), b"prompt;prompt\n", false),
        "\n> \n"
    );
    // Empty line in prompt mode re-prompts only.
    assert_eq!(
        converse(&ctx, op_session(), b"prompt\n\nquit\n", true),
        "\n> > "
    );
}

#[test]
fn payload_lines_get_plus_prompts_in_interactive_mode() {
    let (ctx, _tx) = ctx();
    let got = converse(
        &ctx,
        op_session(),
        b"prompt\nshow cli level <<\np1 v1\np2 v2\n\nquit\n",
        false,
    );
    assert_eq!(got, "\n> + + + operator\n\n> ");
}

#[test]
fn levels_and_permission_denied() {
    let (ctx, _tx) = ctx();
    assert_eq!(
        converse(&ctx, op_session(), b"operator; show cli level\n", true),
        "\noperator\n\n"
    );
    let user = Session::new(CliLevel::User, Duration::from_secs(10));
    assert_eq!(
        converse(&ctx, user, b"operator; show cli level\n", true),
        "Permission denied\n\nuser\n\n"
    );
    let admin = Session::new(CliLevel::Admin, Duration::from_secs(10));
    assert_eq!(
        converse(
            &ctx,
            admin,
            b"show cli level; user; show cli level; operator\n",
            true
        ),
        "admin\n\n\nuser\n\nPermission denied\n\n"
    );
}

#[test]
fn unknown_command_answers_like_haproxy() {
    let (ctx, _tx) = ctx();
    let got = converse(&ctx, op_session(), b"admin\n", true);
    assert!(
        got.starts_with(
            "Unknown command, but maybe one of the following ones is a better match:\n"
        ),
        "{got}"
    );
    assert!(got.contains("  quit                                    : disconnect\n\n"));
    assert!(got.ends_with("\n\n"));
    let got = converse(&ctx, op_session(), b"set timeout server 3\n", true);
    assert_eq!(got, "'set timeout' only supports 'cli'.\n\n");
}

#[test]
fn overlong_line_gets_an_error_and_closes_only_that_connection() {
    let (ctx, _tx) = ctx();
    let mut junk = vec![b'x'; frame::MAX_LINE + 10];
    junk.push(b'\n');
    let got = converse(&ctx, op_session(), &junk, false);
    assert!(got.starts_with("Line too long"), "{got}");
    // The next connection works.
    assert_eq!(
        converse(&ctx, op_session(), b"show cli level\n", true),
        "operator\n\n"
    );
}

#[test]
fn idle_timeout_closes_an_interactive_connection() {
    let (ctx, _tx) = ctx();
    let sess = Session::new(CliLevel::Operator, Duration::from_millis(200));
    let start = std::time::Instant::now();
    let got = converse(&ctx, sess, b"prompt\n", false);
    assert_eq!(got, "\n> ");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

/// Counts `poll_write` calls that wrote bytes.
struct CountWrites<S> {
    inner: S,
    writes: Rc<Cell<usize>>,
}

impl<S: AsyncRead + Unpin> AsyncRead for CountWrites<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for CountWrites<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.writes.set(self.writes.get() + 1);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[test]
fn prompt_stream_is_answered_in_batches_not_one_write_per_ack() {
    const N: usize = 5000;
    let (ctx, _tx) = ctx();
    let writes = Rc::new(Cell::new(0));
    let got = rt().block_on(async {
        let (mut client, server) = UnixStream::pair().unwrap();
        let server = CountWrites {
            inner: server,
            writes: writes.clone(),
        };
        let feed = async move {
            let mut input = b"prompt\n".to_vec();
            for _ in 0..N {
                input.extend_from_slice(b"set timeout cli 60\n");
            }
            input.extend_from_slice(b"quit\n");
            // Feed in socat-sized pieces while reading the answers.
            let (mut rd, mut wr) = client.split();
            let w = async {
                for chunk in input.chunks(8192) {
                    wr.write_all(chunk).await.unwrap();
                }
            };
            let r = async {
                let mut got = Vec::new();
                rd.read_to_end(&mut got).await.unwrap();
                got
            };
            tokio::join!(w, r).1
        };
        let (_, got) = tokio::time::timeout(WAIT, async {
            tokio::join!(serve_conn(&ctx, server, op_session()), feed)
        })
        .await
        .expect("stream did not finish");
        got
    });
    assert_eq!(got.len(), 3 * (N + 1), "every command answered \\n> ");
    let w = writes.get();
    eprintln!("{N} commands answered in {w} writes");
    assert!(
        w <= N / 100,
        "{w} writes for {N} commands: acks are not batched"
    );
}

// ---- show stat / show info against a constructed State ----

/// Column numbers that are non-empty in a CSV row.
fn filled(row: &str) -> Vec<usize> {
    row.split(',')
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .map(|(i, _)| i)
        .collect()
}

fn reference_rows() -> Vec<String> {
    // A copy of shared/reference/haproxy-2.6-cli/02-show-stat-full.txt.
    let text = include_str!("testdata/02-show-stat-full.txt");
    text.lines()
        .skip_while(|l| !l.starts_with("# pxname"))
        .skip(1)
        .take(4)
        .map(str::to_string)
        .collect()
}

#[test]
fn show_stat_rows_have_haproxy_shape_and_live_counters() {
    let (ctx, _tx) = ctx();
    passed_checks(&ctx);
    let st = &ctx.state;
    // Two sessions through fe → b → s1, bytes both ways.
    for _ in 0..2 {
        for c in [
            &st.stats.frontends[0],
            &st.stats.backends[0],
            &st.stats.servers[0][0],
        ] {
            c.event(StatEvent::Session);
            c.add_in(14);
            c.add_out(7);
        }
    }
    st.stats.frontends[0].open();
    st.stats.servers[0][0].event(StatEvent::ConnError);
    let out = render::show_stat(&ctx, render::StatFilter::ALL);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    assert_eq!(format!("{}\n", lines[0]), render::stat_header());
    let f = |l: &str| l.split(',').map(str::to_string).collect::<Vec<_>>();
    let (fe, s1, s2, be) = (f(lines[1]), f(lines[2]), f(lines[3]), f(lines[4]));
    // HAProxy's 128 columns, shunt's 4 warm-spare counters, the trailing comma.
    assert_eq!(fe.len(), 133);
    assert_eq!(fe[132], "", "trailing comma");
    assert_eq!(
        (
            &fe[0][..],
            &fe[1][..],
            &fe[4][..],
            &fe[6][..],
            &fe[7][..],
            &fe[8][..],
            &fe[9][..]
        ),
        ("fe", "FRONTEND", "1", "9985", "2", "28", "14")
    );
    assert_eq!((&fe[17][..], &fe[27][..], &fe[32][..]), ("OPEN", "2", "0"));
    assert_eq!(
        (
            &s1[0][..],
            &s1[1][..],
            &s1[7][..],
            &s1[8][..],
            &s1[13][..],
            &s1[17][..]
        ),
        ("b", "s1", "2", "28", "1", "UP")
    );
    assert_eq!((&s1[27][..], &s1[28][..], &s1[32][..]), ("3", "1", "2"));
    assert_eq!(&s1[73], "127.0.0.1:19001");
    assert_eq!(&s2[28], "2");
    assert_eq!(
        (&be[1][..], &be[6][..], &be[18][..], &be[19][..]),
        ("BACKEND", "999", "2", "2")
    );
    assert_eq!((&be[32][..], &be[76][..]), ("1", "roundrobin"));
    // Same filled columns as HAProxy's rows for the same config.
    let reference = reference_rows();
    assert_eq!(reference.len(), 4, "the transcript has 4 rows");
    for (ours, theirs) in lines[1..].iter().zip(&reference) {
        // shunt's own columns (after HAProxy's) are not in the transcript.
        let ours_haproxy: Vec<usize> = filled(ours)
            .into_iter()
            .filter(|&c| c < render::STAT_FIELDS.len())
            .collect();
        assert_eq!(
            ours_haproxy,
            filled(theirs),
            "\nours:   {ours}\ntheirs: {theirs}"
        );
    }
    // Maintenance / down servers and a down backend.
    for s in &st.backends[0].servers[..2] {
        s.apply(crate::lb::Change::Force {
            health: 0,
            to: crate::lb::OpState::Down,
        });
    }
    let out = render::show_stat(&ctx, render::StatFilter::ALL);
    let be = f(out.lines().nth(4).unwrap());
    assert_eq!((&be[17][..], &be[18][..], &be[19][..]), ("DOWN", "0", "0"));
    assert!(out.lines().nth(2).unwrap().contains(",DOWN,"));
}

#[test]
fn show_stat_filters_like_haproxy() {
    let (ctx, _tx) = ctx();
    let run = |line: &str| converse(&ctx, op_session(), format!("{line}\n").as_bytes(), true);
    let svnames = |out: &str| -> Vec<String> {
        out.lines()
            .skip(1)
            .filter(|l| !l.is_empty())
            .map(|l| l.split(',').nth(1).unwrap_or("").to_string())
            .collect()
    };
    let all = run("show stat");
    assert!(all.starts_with("# pxname,svname,"));
    assert!(all.ends_with(",\n\n"));
    assert_eq!(svnames(&all), ["FRONTEND", "s1", "s2", "BACKEND"]);
    assert_eq!(svnames(&run("show stat -1 1 -1")), ["FRONTEND"]);
    assert_eq!(svnames(&run("show stat -1 2 -1")), ["BACKEND"]);
    assert_eq!(svnames(&run("show stat 3 6 1")), ["s1", "BACKEND"]);
    assert_eq!(svnames(&run("show stat b 4 -1")), ["s1", "s2"]);
    assert_eq!(svnames(&run("show stat 2 -1 -1")), ["FRONTEND"]);
    assert_eq!(run("show stat typed -1 2 -1"), "No such proxy.\n\n");
    assert_eq!(run("show stat 0 -1 -1"), "No such proxy.\n\n");
    // user level may read stats.
    let user = Session::new(CliLevel::User, Duration::from_secs(10));
    assert!(converse(&ctx, user, b"show stat\n", true).starts_with("# pxname"));
}

/// The key order of shared/reference/haproxy-2.6-cli/01-show-info.txt.
const INFO_KEYS: &[&str] = &[
    "Name",
    "Version",
    "Release_date",
    "Nbthread",
    "Nbproc",
    "Process_num",
    "Pid",
    "Uptime",
    "Uptime_sec",
    "Memmax_MB",
    "PoolAlloc_MB",
    "PoolUsed_MB",
    "PoolFailed",
    "Ulimit-n",
    "Maxsock",
    "Maxconn",
    "Hard_maxconn",
    "CurrConns",
    "CumConns",
    "CumReq",
    "MaxSslConns",
    "CurrSslConns",
    "CumSslConns",
    "Maxpipes",
    "PipesUsed",
    "PipesFree",
    "ConnRate",
    "ConnRateLimit",
    "MaxConnRate",
    "SessRate",
    "SessRateLimit",
    "MaxSessRate",
    "SslRate",
    "SslRateLimit",
    "MaxSslRate",
    "SslFrontendKeyRate",
    "SslFrontendMaxKeyRate",
    "SslFrontendSessionReuse_pct",
    "SslBackendKeyRate",
    "SslBackendMaxKeyRate",
    "SslCacheLookups",
    "SslCacheMisses",
    "CompressBpsIn",
    "CompressBpsOut",
    "CompressBpsRateLim",
    "Tasks",
    "Run_queue",
    "Idle_pct",
    "node",
    "Stopping",
    "Jobs",
    "Unstoppable Jobs",
    "Listeners",
    "ActivePeers",
    "ConnectedPeers",
    "DroppedLogs",
    "BusyPolling",
    "FailedResolutions",
    "TotalBytesOut",
    "TotalSplicdedBytesOut",
    "BytesOutRate",
    "DebugCommandsIssued",
    "CumRecvLogs",
    "Build info",
    "Memmax_bytes",
    "PoolAlloc_bytes",
    "PoolUsed_bytes",
    "Start_time_sec",
    "Tainted",
];

fn info_map(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l.split_once(": ").unwrap_or((l, ""));
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[test]
fn show_info_has_haproxy_keys_in_order_then_shunt_fields() {
    let (ctx, _tx) = ctx();
    ctx.state.stats.frontends[0].event(StatEvent::Session);
    ctx.state.stats.frontends[0].add_out(56);
    let _flow = crate::runtime::ConnGuard::new(ctx.state.clone());
    let out = converse(&ctx, op_session(), b"show info\n", true);
    assert!(out.ends_with("\n\n"));
    let kv = info_map(&out);
    let keys: Vec<&str> = kv.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(&keys[..INFO_KEYS.len()], INFO_KEYS);
    assert_eq!(
        &keys[INFO_KEYS.len()..],
        [
            "Forward_mode",
            "Bpf",
            "SockmapFlows",
            "SpliceFlows",
            "CopyFlows",
            "SockhashEntries",
            "SockmapFlowEntries",
            "SockmapPauses",
            "SockmapInflightPeak",
            "SockmapFallbacks",
            "SockmapRedirectErrors",
            "SockmapOverlapTrimmed",
            "SockmapTrimFailed",
            "SockmapSeqUnknown",
            "warm_hit",
            "warm_miss",
            "warm_dead",
            "warm_purged",
            "SockmapEofCatchups",
            "SockmapTrimPassed",
            "PromotedFlows",
            "Ktls",
            "KtlsFlows",
        ]
    );
    let get = |k: &str| kv.iter().find(|(kk, _)| kk == k).unwrap().1.clone();
    assert_eq!(get("Name"), "shunt");
    // The test's runtime has no TLS contexts built: no ULP detected.
    assert_eq!(get("Ktls"), "no tls ULP (TLS flows forwarded in userspace)");
    assert_eq!(get("KtlsFlows"), "0");
    assert_eq!(get("Nbthread"), "2");
    assert_eq!(get("Pid"), std::process::id().to_string());
    assert_eq!(get("Maxconn"), "9985");
    assert_eq!(get("CurrConns"), "1");
    assert_eq!(get("CumConns"), "1");
    assert_eq!(get("TotalBytesOut"), "56");
    assert_eq!(get("Uptime"), "0d 0h00m00s");
    assert_eq!(get("Forward_mode"), "auto");
    assert!(get("Ulimit-n").parse::<u64>().unwrap() > 0);

    let typed = converse(&ctx, op_session(), b"show info typed\n", true);
    let first: Vec<&str> = typed.lines().take(4).collect();
    assert_eq!(first[0], "0.Name.1:POS:str:shunt");
    assert_eq!(first[3], "3.Nbthread.1:CGS:u32:2");
    assert!(typed.contains("\n47.Tasks.1:MGP:u32:"));
    assert!(typed.contains("\n54.Unstoppable Jobs.1:MGP:u32:0\n"));
}

#[test]
fn sockets_bind_with_mode_replace_stale_files_and_clean_up() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = test_dir("bind");
    let path = dir.join("s.sock");
    // A stale socket file from a previous run.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let mut cfg = Config::default();
    cfg.global.stats_sockets.push(crate::config::StatsSocket {
        path: path.clone(),
        mode: 0o640,
        level: CliLevel::Admin,
        user: None,
        group: None,
        expose_fd_listeners: false,
    });
    let stale = std::fs::metadata(&path).unwrap();
    let mut socks = Sockets::bind(&cfg, &mut Default::default(), Default::default()).expect("bind");
    // Nothing at the configured path changes before publication.
    let before = std::fs::metadata(&path).unwrap();
    assert_eq!(
        (before.dev(), before.ino()),
        (stale.dev(), stale.ino()),
        "the stale file was replaced before publication"
    );
    socks.publish().expect("publish over a stale socket");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    let ls = socks.take_listeners();
    assert_eq!(ls.len(), 1);
    assert_eq!(ls[0].level, CliLevel::Admin);
    drop(ls);
    drop(socks);
    assert!(!path.exists(), "socket file left behind");
    // A start-up that fails before publication leaves the path alone and
    // removes its temporary file.
    let held = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let socks = Sockets::bind(&cfg, &mut Default::default(), Default::default()).expect("bind");
    drop(socks);
    assert!(path.exists(), "an unpublished start-up removed the path");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        1,
        "temporary file left"
    );
    drop(held);
    std::fs::remove_file(&path).unwrap();
    // A regular file in the way is not deleted.
    std::fs::write(&path, b"keep").unwrap();
    assert!(matches!(
        Sockets::bind(&cfg, &mut Default::default(), Default::default()),
        Err(CliError::NotASocket { .. })
    ));
    assert_eq!(std::fs::read(&path).unwrap(), b"keep");
    let _ = std::fs::remove_dir_all(&dir);
}

fn test_dir(tag: &str) -> std::path::PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "shunt-cli-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

// ---- end to end: daemon::run with a stats socket ----

/// A free port on 127.0.0.1 (bound then released; daemon::run does not report the
/// port it picked for port 0).
fn free_port() -> u16 {
    StdTcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An echo server on port 0, one thread per connection, bounded to a few connections.
fn echo_server() -> u16 {
    let l = StdTcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming().take(16) {
            let Ok(mut c) = c else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 || c.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

fn cli(path: &std::path::Path, cmd: &str) -> String {
    let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(cmd.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn end_to_end_daemon_serves_stats_socket_with_live_counters() {
    let dir = test_dir("e2e");
    let sock = dir.join("admin.sock");
    let fe_port = free_port();
    let s1 = echo_server();
    let s2 = echo_server();
    let mut cfg = reference_config(SocketAddr::from(([127, 0, 0, 1], fe_port)), [s1, s2]);
    cfg.global.stats_sockets.push(crate::config::StatsSocket {
        path: sock.clone(),
        mode: 0o600,
        level: CliLevel::Admin,
        user: None,
        group: None,
        expose_fd_listeners: false,
    });
    std::thread::spawn(move || {
        let _ = crate::daemon::run(cfg, crate::daemon::Options::default());
    });
    // Wait for the socket.
    let deadline = std::time::Instant::now() + WAIT;
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "stats socket never came up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(cli(&sock, "show cli level\n"), "admin\n\n");

    // Push bytes through the frontend: 4 flows of 7 bytes each way.
    for _ in 0..4 {
        let mut c = StdTcpStream::connect(("127.0.0.1", fe_port)).unwrap();
        c.set_read_timeout(Some(WAIT)).unwrap();
        c.write_all(b"abcdefg").unwrap();
        let mut buf = [0u8; 7];
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"abcdefg");
    }
    // Counters are summed when flows end; wait for the last one to be accounted.
    let deadline = std::time::Instant::now() + WAIT;
    let stat = loop {
        let out = cli(&sock, "show stat\n");
        let fe: Vec<String> = out
            .lines()
            .nth(1)
            .unwrap()
            .split(',')
            .map(String::from)
            .collect();
        if fe[8] == "28" && fe[9] == "28" && fe[4] == "0" {
            break out;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "counters never settled:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let rows: Vec<Vec<&str>> = stat
        .lines()
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 4);
    assert_eq!((rows[0][1], rows[0][7]), ("FRONTEND", "4"));
    assert_eq!((rows[3][1], rows[3][7], rows[3][8]), ("BACKEND", "4", "28"));
    let lbtot: u64 = rows[1][30].parse::<u64>().unwrap() + rows[2][30].parse::<u64>().unwrap();
    assert_eq!(lbtot, 4, "lbtot of s1 + s2");

    let info = cli(&sock, "show info\n");
    let kv = info_map(&info);
    let get = |k: &str| kv.iter().find(|(kk, _)| kk == k).unwrap().1.clone();
    assert_eq!(get("Name"), "shunt");
    assert_eq!(get("Nbthread"), "2");
    assert_eq!(get("CumConns"), "4");
    assert_eq!(get("TotalBytesOut"), "28");
    assert_eq!(get("Listeners"), "2");
    assert_eq!(get("Pid"), std::process::id().to_string());
    // The daemon thread keeps running until the test process exits; its socket
    // file is removed by `Sockets` on a normal stop (tested above).
    let _ = std::fs::remove_dir_all(&dir);
}

/// The reference config plus map `#0` (`/run/haproxy/be.map` of the transcript, with
/// map_ip keys) used by `use_backend` at `haproxy.cfg:16`.
fn map_ctx() -> (Ctx, watch::Sender<Phase>) {
    let mut c = reference_config("127.0.0.1:18080".parse().unwrap(), [19001, 19002]);
    c.maps = vec![MapSource {
        path: "/run/haproxy/be.map".into(),
        used_at: Location {
            file: "haproxy.cfg".into(),
            line: 16,
        },
        entries: crate::maps::parse_text("be.map", "# key value\n127.0.0.1 b\n10.0.0.1 b\n")
            .unwrap(),
    }];
    make_ctx(c)
}

fn admin_session() -> Session {
    Session::new(CliLevel::Admin, Duration::from_secs(10))
}

/// `show map MAP` lines without their pointers, and the pointers apart.
fn map_lines(out: &str) -> (Vec<String>, Vec<String>) {
    let mut kv = Vec::new();
    let mut ptrs = Vec::new();
    for l in out.lines().filter(|l| !l.is_empty()) {
        let (p, rest) = l.split_once(' ').unwrap();
        assert!(p.starts_with("0x"), "{l}");
        ptrs.push(p.to_string());
        kv.push(rest.to_string());
    }
    (kv, ptrs)
}

#[test]
fn map_commands_answer_like_the_haproxy_transcript() {
    let (ctx, _tx) = map_ctx();
    let run = |cmd: &str| converse(&ctx, admin_session(), format!("{cmd}\n").as_bytes(), true);
    assert_eq!(
        run("show map"),
        "# id (file) description\n0 (/run/haproxy/be.map) pattern loaded from file '/run/haproxy/be.map' used by map at file 'haproxy.cfg' line 16. curr_ver=0 next_ver=0 entry_cnt=2\n\n"
    );
    assert_eq!(
        run("add map #0 k v; show map #9"),
        "'k' is not a valid IPv4 or IPv6 address.\n\nUnknown map identifier. Please use #<id> or <file>.\n\n"
    );
    assert_eq!(run("add map #0 10.0.0.0/8 v"), "\n");
    let before = run("show map #0");
    let (kv, ptrs) = map_lines(&before);
    assert_eq!(kv, ["127.0.0.1 b", "10.0.0.1 b", "10.0.0.0/8 v"]);
    assert!(before.ends_with("\n\n"));
    // The file name works as well as the id; pointers are stable.
    assert_eq!(run("show map /run/haproxy/be.map"), before);
    assert_eq!(
        run("get map #0 10.2.3.4"),
        "type=ip, case=sensitive, found=yes, idx=tree, key=\"10.0.0.0/8\", value=\"v\", type=\"str\"\n\n"
    );
    assert_eq!(
        run("get map #0 192.0.2.1"),
        "type=ip, case=sensitive, found=no\n\n"
    );
    assert_eq!(run("get map #0 k"), "type=ip, case=sensitive, found=no\n\n");
    assert_eq!(run("set map #0 10.0.0.0/8 v9"), "\n");
    let (kv, ptrs2) = map_lines(&run("show map #0"));
    assert_eq!(kv, ["127.0.0.1 b", "10.0.0.1 b", "10.0.0.0/8 v9"]);
    assert_eq!(ptrs, ptrs2);
    assert_eq!(run("set map #0 10.9.9.9 x"), "entry not found.\n\n");
    assert_eq!(run("del map #0 10.0.0.0/8"), "\n");
    assert_eq!(run("del map #0 nosuchkey"), "Key not found.\n\n");
    // Delete by reference.
    assert_eq!(run(&format!("del map #0 #{}", ptrs[1])), "\n");
    assert_eq!(map_lines(&run("show map #0")).0, ["127.0.0.1 b"]);
    assert_eq!(run("add map /run/haproxy/be.map 10.0.0.3 v3"), "\n");
    assert_eq!(run("clear map #0"), "\n");
    assert_eq!(run("show map #0"), "\n");
    assert!(run("show map").contains("entry_cnt=0\n"));
    for (cmd, err) in [
        ("show map nosuch", "Unknown map identifier. Please use #<id> or <file>.\n"),
        ("add map #1 10.0.0.1 v", "Unknown map identifier. Please use #<id> or <file>.\n"),
        ("set map x 10.0.0.1 v", "Unknown map identifier. Please use #<id> or <file>.\n"),
        ("del map #7 10.0.0.1", "Unknown map identifier. Please use #<id> or <file>.\n"),
        ("clear map #7", "Unknown map identifier. Please use #<id> or <file>.\n"),
        ("get map #7 10.0.0.1", "Unknown map identifier. Please use #<id> or <file>.\n"),
        ("add map #0 10.0.0.1", "'add map' expects three parameters (map identifier, key and value) or one parameter (map identifier) and a payload\n"),
        ("set map #0 10.0.0.1", "'set map' expects three parameters: map identifier, key and value.\n"),
        ("del map #0", "This command expects two parameters: map identifier and key.\n"),
        ("clear map", "Missing map identifier.\n"),
        ("get map #0", "Missing map identifier and/or key.\n"),
    ] {
        assert_eq!(run(cmd), format!("{err}\n"), "{cmd}");
    }
}

#[test]
fn map_changes_need_operator_level() {
    let (ctx, _tx) = map_ctx();
    let user = || Session::new(CliLevel::User, Duration::from_secs(10));
    for cmd in [
        "add map #0 10.0.0.9 b",
        "add map #0 10.0.0.9",
        "set map #0 10.0.0.1 x",
        "del map #0 10.0.0.1",
        "clear map #0",
    ] {
        assert_eq!(
            converse(&ctx, user(), format!("{cmd}\n").as_bytes(), true),
            "Permission denied\n\n",
            "{cmd}"
        );
    }
    // Reading is allowed to users; nothing was changed.
    let got = converse(&ctx, user(), b"show map #0\n", true);
    assert_eq!(map_lines(&got).0, ["127.0.0.1 b", "10.0.0.1 b"]);
    assert_eq!(
        converse(&ctx, user(), b"get map #0 10.0.0.1\n", true),
        "type=ip, case=sensitive, found=yes, idx=tree, key=\"10.0.0.1\", value=\"b\", type=\"str\"\n\n"
    );
    // Operators may change maps.
    assert_eq!(
        converse(&ctx, op_session(), b"add map #0 10.0.0.9 b\n", true),
        "\n"
    );
}

#[test]
fn add_map_payload_in_prompt_mode() {
    let (ctx, _tx) = map_ctx();
    let got = converse(
        &ctx,
        admin_session(),
        b"prompt\nadd map #0 <<\n10.1.0.1 v1\n10.1.0.2   v2 with spaces\n\nshow map #0\nquit\n",
        false,
    );
    let (head, rest) = got.split_at(got.find("> 0x").unwrap() + 2);
    assert_eq!(head, "\n> + + + \n> ");
    assert_eq!(
        map_lines(rest.trim_end_matches("> ")).0,
        [
            "127.0.0.1 b",
            "10.0.0.1 b",
            "10.1.0.1 v1",
            "10.1.0.2 v2 with spaces"
        ]
    );
    assert!(rest.ends_with("\n\n> "));
    // A bad payload line: the lines before it stay, the error names it.
    assert_eq!(
        converse(
            &ctx,
            admin_session(),
            b"add map #0 <<\n10.2.0.1 a\nzz b\n10.2.0.2 c\n",
            true
        ),
        "'zz' is not a valid IPv4 or IPv6 address.\n\n"
    );
    let got = converse(&ctx, admin_session(), b"show map #0\n", true);
    assert!(got.contains(" 10.2.0.1 a\n") && !got.contains("10.2.0.2"));
}

#[test]
fn a_large_payload_is_applied_in_slices_with_the_same_outcome() {
    let (ctx, _tx) = map_ctx();
    // About 20 slices of PAYLOAD_SLICE bytes: every entry lands, in order.
    let n = 6000u32;
    let mut cmd = String::from("add map #0 <<\n");
    for i in 0..n {
        cmd.push_str(&format!(
            "10.{}.{}.{} v{i}\n",
            100 + i / 65536,
            (i / 256) % 256,
            i % 256
        ));
    }
    assert!(cmd.len() > 10 * PAYLOAD_SLICE);
    assert_eq!(converse(&ctx, admin_session(), cmd.as_bytes(), true), "\n");
    let got = converse(&ctx, admin_session(), b"show map #0\n", true);
    let (lines, _) = map_lines(&got);
    assert_eq!(lines.len(), 2 + n as usize);
    assert_eq!(lines[2], "10.100.0.0 v0");
    assert_eq!(
        lines[2 + n as usize - 1],
        format!("10.100.23.111 v{}", n - 1)
    );
    // A bad line in a late slice: what came before it stays (earlier slices
    // included), nothing after it is applied, and the error is the answer.
    let mut cmd = String::from("add map #0 <<\n");
    for i in 0..3000u32 {
        cmd.push_str(&format!("10.200.{}.{} w\n", i / 256, i % 256));
    }
    cmd.push_str("zz w\n10.201.0.1 w\n");
    assert_eq!(
        converse(&ctx, admin_session(), cmd.as_bytes(), true),
        "'zz' is not a valid IPv4 or IPv6 address.\n\n"
    );
    let got = converse(&ctx, admin_session(), b"show map #0\n", true);
    assert_eq!(got.matches(" w\n").count(), 3000);
    assert!(got.contains(" 10.200.11.183 w\n") && !got.contains("10.201.0.1"));
}

#[test]
fn five_add_maps_then_immediate_close_are_all_applied() {
    let (ctx, _tx) = map_ctx();
    for run in 0..200 {
        let got = converse(
            &ctx,
            admin_session(),
            b"add map #0 10.0.0.1 1; add map #0 10.0.0.2 2; add map #0 10.0.0.3 3; add map #0 10.0.0.4 4; add map #0 10.0.0.5 5\n",
            true,
        );
        assert_eq!(got, "\n\n\n\n\n", "run {run}");
    }
    // The file's 2 entries plus 200 × 5 (duplicates are kept, as HAProxy does).
    assert_eq!(ctx.state.maps.get(0).unwrap().table().len(), 2 + 200 * 5);
}

/// The reference config plus a static-rr backend `st` (iid 4) with server `a`.
fn servers_ctx() -> (Ctx, watch::Sender<Phase>) {
    let mut c = reference_config("127.0.0.1:18080".parse().unwrap(), [19001, 19002]);
    let mut st = c.backends[0].clone();
    st.name = "st".into();
    st.id = 4;
    st.balance = Balance::StaticRr;
    st.servers = vec![server("a", 1, 19004, false)];
    c.backends.push(st);
    let (ctx, tx) = make_ctx(c);
    passed_checks(&ctx);
    (ctx, tx)
}

/// Every checked server as after one passed connect check (no check task runs in
/// these tests), as in the HAProxy transcripts.
fn passed_checks(ctx: &Ctx) {
    for s in ctx.state.backends.iter().flat_map(|b| b.servers.iter()) {
        if s.checked() {
            s.record_check(crate::checks::Status::L4Ok, None, Duration::ZERO, "");
            s.apply(crate::lb::Change::Check { passed: true });
        }
    }
}

/// `show servers state` rows with column 9 (seconds since the last change) blanked.
fn state_rows(out: &str) -> Vec<String> {
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("1"), "{out}");
    assert_eq!(
        lines.next(),
        Some(crate::checks::state_file::HEADER.lines().nth(1).unwrap()),
        "{out}"
    );
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 25, "{l}");
            f[9] = "T";
            f.join(" ")
        })
        .collect()
}

#[test]
fn server_state_commands_answer_like_haproxy_2_6() {
    let (ctx, _tx) = servers_ctx();
    let run = |cmd: &str| converse(&ctx, admin_session(), format!("{cmd}\n").as_bytes(), true);
    let out = run("show servers state");
    assert!(out.starts_with(crate::checks::state_file::HEADER));
    assert!(out.ends_with("\n\n"));
    assert_eq!(
        state_rows(&out),
        [
            "3 b 1 s1 127.0.0.1 2 0 1 1 T 6 3 4 6 0 0 0 - 19001 - 0 0 - - 0",
            "3 b 2 s2 127.0.0.1 2 0 1 1 T 6 3 4 6 0 0 0 - 19002 - 0 0 - - 0",
            "4 st 1 a 127.0.0.1 2 0 1 1 T 1 0 2 0 0 0 0 - 19004 - 0 0 - - 0",
        ]
    );
    assert_eq!(state_rows(&run("show servers state b")).len(), 2);
    assert_eq!(state_rows(&run("show servers state #4")).len(), 1);
    assert_eq!(run("show servers state nosuch"), "Can't find backend.\n\n");

    // The transcript's maintenance row, byte for byte (time since change is 0).
    assert_eq!(run("set server b/s1 state maint"), "\n");
    let out = run("show servers state b");
    assert!(
        out.contains("\n3 b 1 s1 127.0.0.1 0 1 1 1 0 6 3 0 14 0 0 0 - 19001 - 0 0 - - 0\n"),
        "{out}"
    );
    let b = &ctx.state.backends[0];
    assert!(b.servers[0].is_maint());
    assert_eq!(run("set server b/s1 state ready"), "\n");
    assert!(!b.servers[0].is_maint());
    assert_eq!(run("disable server b/s2"), "\n");
    assert!(b.servers[1].is_maint());
    assert_eq!(run("enable server b/s2"), "\n");
    assert!(!b.servers[1].is_maint());

    // Weights: absolute, relative to the initial weight, the two spellings.
    assert_eq!(run("set server b/s1 weight 50"), "\n");
    assert_eq!(run("get weight b/s1"), "50 (initial 1)\n\n");
    assert_eq!(run("set server b/s1 weight 50%"), "\n");
    assert_eq!(run("get weight b/s1"), "0 (initial 1)\n\n");
    assert_eq!(run("set weight b/s1 10"), "\n");
    assert_eq!(run("get weight b/s1"), "10 (initial 1)\n\n");
    assert_eq!(b.servers[0].weight(), 10);
    assert_eq!(run("set weight #3/#1 300%"), "\n");
    assert_eq!(run("get weight b/s1"), "3 (initial 1)\n\n");
    assert_eq!(run("set weight b/s1 10"), "\n");

    // Drain: no new traffic, the user weight is kept and comes back on ready.
    assert_eq!(run("set server b/s1 state drain"), "\n");
    assert_eq!(b.servers[0].weight(), 0);
    assert!(!b.servers[0].usable());
    assert_eq!(run("get weight b/s1"), "10 (initial 1)\n\n");
    assert_eq!(run("set weight b/s1 7"), "\n");
    assert_eq!(b.servers[0].weight(), 0);
    let out = run("show servers state b");
    assert!(
        out.contains("\n3 b 1 s1 127.0.0.1 2 8 7 1 0 6 3 4 6 0 0 0 - 19001 - 0 0 - - 0\n"),
        "{out}"
    );
    assert_eq!(run("set server b/s1 state ready"), "\n");
    assert_eq!(b.servers[0].weight(), 7);
    assert!(b.servers[0].usable());

    // Health.
    assert_eq!(run("set server b/s2 health down"), "\n");
    assert!(!b.servers[1].is_up());
    assert_eq!(run("set server b/s2 health up"), "\n");
    assert!(b.servers[1].is_up());

    // HAProxy 2.6's error strings (checked against haproxy 2.6.12).
    for (cmd, want) in [
        ("get weight", "Require 'backend/server'.\n"),
        ("get weight b", "Require 'backend/server'.\n"),
        ("get weight nosuch/s1", "No such backend.\n"),
        ("get weight b/nosuch", "No such server.\n"),
        ("set weight b", "Require 'backend/server'.\n"),
        ("set weight b/s1", "Require <weight> or <weight%>.\n"),
        (
            "set weight b/s1 abc",
            "Empty weight string empty or preceded by garbage\n",
        ),
        (
            "set weight b/s1 300",
            "Absolute weight can only be between 0 and 256 inclusive.\n",
        ),
        (
            "set weight b/s1 -1",
            "Absolute weight can only be between 0 and 256 inclusive.\n",
        ),
        ("set weight b/s1 5x", "Trailing garbage in weight string\n"),
        ("set weight b/s1 5%x", "Trailing garbage in weight string\n"),
        ("set weight b/s1 -5%", "Relative weight must be positive.\n"),
        (
            "set weight st/a 5",
            "Backend is using a static LB algorithm and only accepts weights '0%' and '100%'.\n",
        ),
        ("set server", "Require 'backend/server'.\n"),
        ("set server b", "Require 'backend/server'.\n"),
        ("set server b/nosuch state ready", "No such server.\n"),
        (
            "set server b/s1 state bogus",
            "'set server <srv> state' expects 'ready', 'drain' and 'maint'.\n",
        ),
        (
            "set server b/s1 state",
            "'set server <srv> state' expects 'ready', 'drain' and 'maint'.\n",
        ),
        (
            "set server b/s1 health bogus",
            "'set server <srv> health' expects 'up', 'stopping', or 'down'.\n",
        ),
        ("set server b/s1 weight", "Require <weight> or <weight%>.\n"),
        (
            "set server b/s1 maxconn 100",
            "usage: set server <backend>/<server> addr | agent | agent-addr | agent-port | agent-send | check-addr | check-port | fqdn | health | ssl | state | weight\n",
        ),
        ("disable server b", "Require 'backend/server'.\n"),
        ("disable server b/zz", "No such server.\n"),
        ("enable server nosuch/s1", "No such backend.\n"),
    ] {
        assert_eq!(run(cmd), format!("{want}\n"), "{cmd}");
    }
    assert_eq!(run("set weight st/a 0"), "\n");
    assert_eq!(run("set weight st/a 100%"), "\n");
    assert_eq!(run("get weight st/a"), "1 (initial 1)\n\n");
}

#[test]
fn server_commands_take_effect_on_balancing() {
    let (ctx, _tx) = servers_ctx();
    let run = |cmd: &str| converse(&ctx, admin_session(), format!("{cmd}\n").as_bytes(), true);
    let b = &ctx.state.backends[0];
    let client: SocketAddr = "127.0.0.1:5000".parse().unwrap();
    let picks = || {
        (0..8)
            .filter_map(|_| b.pick(client, None))
            .collect::<Vec<_>>()
    };
    assert!(picks().contains(&0) && picks().contains(&1));
    assert_eq!(run("disable server b/s1"), "\n");
    assert!(picks().iter().all(|&i| i == 1), "{:?}", picks());
    assert_eq!(run("enable server b/s1"), "\n");
    assert_eq!(run("set server b/s2 state drain"), "\n");
    assert!(picks().iter().all(|&i| i == 0), "{:?}", picks());
    assert_eq!(run("set server b/s2 state ready"), "\n");
    assert_eq!(run("set weight b/s1 0"), "\n");
    assert!(picks().iter().all(|&i| i == 1), "{:?}", picks());
}

#[test]
fn server_commands_need_admin_and_reads_need_user() {
    let (ctx, _tx) = servers_ctx();
    let as_level = |level: CliLevel, cmd: &str| {
        converse(
            &ctx,
            Session::new(level, Duration::from_secs(10)),
            format!("{cmd}\n").as_bytes(),
            true,
        )
    };
    for cmd in [
        "set weight b/s1 3",
        "set server b/s1 state maint",
        "set server b/s1 weight 3",
        "disable server b/s1",
        "enable server b/s1",
        "clear counters all",
    ] {
        assert_eq!(
            as_level(CliLevel::Operator, cmd),
            "Permission denied\n\n",
            "{cmd}"
        );
    }
    assert_eq!(ctx.state.backends[0].servers[0].weight(), 1);
    assert!(!ctx.state.backends[0].servers[0].is_maint());
    assert_eq!(
        as_level(CliLevel::User, "clear counters"),
        "Permission denied\n\n"
    );
    assert_eq!(as_level(CliLevel::Operator, "clear counters"), "\n");
    assert_eq!(as_level(CliLevel::Admin, "clear counters all"), "\n");
    assert_eq!(
        as_level(CliLevel::User, "get weight b/s1"),
        "1 (initial 1)\n\n"
    );
    assert!(as_level(CliLevel::User, "show servers state").starts_with("1\n# be_id"));
    assert!(as_level(CliLevel::User, "show servers conn").starts_with("# bkname"));
    assert_eq!(
        as_level(CliLevel::User, "show backend"),
        "# name\nb\nst\n\n"
    );
}

#[test]
fn show_servers_conn_has_haproxy_columns() {
    let (ctx, _tx) = servers_ctx();
    let out = converse(&ctx, admin_session(), b"show servers conn b\n", true);
    assert_eq!(
        out,
        "# bkname/svname bkid/svid addr port - purge_delay used_cur used_max need_est unsafe_nb safe_nb idle_lim idle_cur idle_per_thr[2]\n\
         b/s1 3/1 127.0.0.1 19001 - 5000 0 0 0 0 0 -1 0 0 0\n\
         b/s2 3/2 127.0.0.1 19002 - 5000 0 0 0 0 0 -1 0 0 0\n\n"
    );
    let out = converse(&ctx, admin_session(), b"show servers conn\n", true);
    assert_eq!(out.lines().filter(|l| !l.is_empty()).count(), 4, "{out}");
    let out = converse(&ctx, admin_session(), b"show servers conn zz\n", true);
    assert_eq!(out, "Can't find backend.\n\n");
}

#[test]
fn weight_syntax_follows_haproxy() {
    use dispatch::parse_weight;
    assert_eq!(parse_weight("0", 1, false), Ok(0));
    assert_eq!(parse_weight("256", 1, false), Ok(256));
    assert_eq!(parse_weight("+7", 1, false), Ok(7));
    assert_eq!(parse_weight("50%", 10, false), Ok(5));
    assert_eq!(parse_weight("100000%", 10, false), Ok(256));
    assert_eq!(parse_weight("100%", 3, true), Ok(3));
    assert_eq!(parse_weight("0%", 3, true), Ok(0));
    assert_eq!(parse_weight("2", 3, true), Err(dispatch::WEIGHT_STATIC));
    assert_eq!(parse_weight("", 1, false), Err(dispatch::WEIGHT_MISSING));
    assert_eq!(
        parse_weight("300x", 1, false),
        Err(dispatch::WEIGHT_ABSOLUTE_RANGE)
    );
    assert_eq!(
        parse_weight("%", 1, false),
        Err(dispatch::WEIGHT_GARBAGE_BEFORE)
    );
    assert_eq!(
        parse_weight("99999999999999999999999", 1, false),
        Err(dispatch::WEIGHT_ABSOLUTE_RANGE)
    );
}

#[test]
fn show_name_sets_the_name_in_show_info() {
    let (ctx, _tx) = ctx();
    let out = converse(&ctx, op_session(), b"show info\n", true);
    assert!(out.starts_with("Name: shunt\n"), "{out}");
    let mut c = reference_config("127.0.0.1:18080".parse().unwrap(), [19001, 19002]);
    c.global.stats_show_name = Some("HAProxy".into());
    let (ctx, _tx) = make_ctx(c);
    let out = converse(&ctx, op_session(), b"show info\n", true);
    assert!(out.starts_with("Name: HAProxy\n"), "{out}");
    let out = converse(&ctx, op_session(), b"show info typed\n", true);
    assert!(out.starts_with("0.Name.1:POS:str:HAProxy\n"), "{out}");
}

/// `show stat typed` never has to drop a value: every non-empty cell shunt prints has
/// HAProxy's tags for its kind of row.
#[test]
fn every_stat_cell_shunt_prints_has_typed_tags() {
    let (ctx, _tx) = ctx();
    let csv = render::show_stat(&ctx, render::StatFilter::ALL);
    let mut rows = 0;
    for row in csv.lines().skip(1).filter(|l| !l.is_empty()) {
        let cells: Vec<&str> = row.split(',').collect();
        let (_, k) = super::typed::kind(cells[32]).expect("row type");
        for (col, v) in cells.iter().enumerate() {
            // 103 is the `-` separator; shunt's own columns (warm_*) come after
            // HAProxy's and have no typed position.
            if !v.is_empty() && col != 103 && col < render::STAT_FIELDS.len() {
                assert!(
                    super::typed::field(col, k).is_some(),
                    "{}/{}: column {col} = {v:?} has no typed tags",
                    cells[0],
                    cells[1]
                );
            }
        }
        rows += 1;
    }
    assert!(rows >= 3, "{csv}");
}

// ---- show version, severity-output, prompt modes, set maxconn, set server addr ----

fn parse_line(line: &str) -> command::Command {
    parsed_line(line).cmd
}

fn parsed_line(line: &str) -> command::Parsed {
    let reqs = frame::split_line(line.as_bytes());
    command::parse(reqs.first().unwrap_or(&frame::Request::default()))
}

/// The level the table entry of `line` says it needs.
fn level_of(line: &str) -> CliLevel {
    parsed_line(line).level()
}

#[test]
fn misc_commands_parse() {
    use command::{Command as C, ParseError as E, PromptMode as M, SeverityOutput as S};
    assert_eq!(parse_line("show version"), C::ShowVersion);
    assert_eq!(level_of("show version"), CliLevel::User);
    assert_eq!(
        parse_line("set severity-output number"),
        C::SetSeverityOutput(S::Number)
    );
    assert_eq!(
        parse_line("set severity-output string"),
        C::SetSeverityOutput(S::String)
    );
    assert_eq!(
        parse_line("set severity-output none"),
        C::SetSeverityOutput(S::None)
    );
    for bad in ["set severity-output", "set severity-output Number"] {
        assert_eq!(parse_line(bad), C::Bad(E::SeverityOutputArgs), "{bad}");
        assert_eq!(level_of(bad), CliLevel::User, "{bad}");
    }

    assert_eq!(parse_line("prompt"), C::Prompt);
    let set = |mode, timed| C::PromptSet { mode, timed };
    assert_eq!(parse_line("prompt n"), set(Some(M::NonInteractive), false));
    assert_eq!(parse_line("prompt i"), set(Some(M::Interactive), false));
    assert_eq!(parse_line("prompt p"), set(Some(M::Prompt), false));
    assert_eq!(parse_line("prompt timed"), set(None, true));
    assert_eq!(
        parse_line("prompt p i timed"),
        set(Some(M::Interactive), true)
    );
    assert_eq!(parse_line("prompt help"), C::PromptHelp);
    assert_eq!(parse_line("prompt i help x"), C::PromptHelp);
    assert_eq!(parse_line("prompt x help"), C::Bad(E::PromptArgs));

    let srv = |target: &str, value| C::SetMaxconnServer {
        target: target.into(),
        value,
    };
    assert_eq!(
        parse_line("set maxconn server b/s1 200"),
        srv("b/s1", Ok(200))
    );
    assert_eq!(parse_line("set maxconn server b/s1 0"), srv("b/s1", Ok(0)));
    assert_eq!(parse_line("set maxconn server b/s1 -3"), srv("b/s1", Ok(0)));
    assert_eq!(
        parse_line("set maxconn server b/s1 99999999999999999999"),
        srv("b/s1", Ok(crate::config::MAX_MAXCONN))
    );
    assert_eq!(
        parse_line("set maxconn server b/s1"),
        srv("b/s1", Err(E::MaxconnMissing))
    );
    assert_eq!(
        parse_line("set maxconn server b/s1 x1"),
        srv("b/s1", Err(E::MaxconnGarbageBefore))
    );
    assert_eq!(
        parse_line("set maxconn server b/s1 12x"),
        srv("b/s1", Err(E::MaxconnTrailing))
    );
    assert_eq!(level_of("set maxconn server b/s1 1"), CliLevel::Admin);

    let fe = |f: &str, value| C::SetMaxconnFrontend {
        frontend: f.into(),
        value,
    };
    assert_eq!(parse_line("set maxconn frontend fe 50"), fe("fe", Ok(50)));
    // HAProxy's atoi: junk reads as 0.
    assert_eq!(parse_line("set maxconn frontend fe abc"), fe("fe", Ok(0)));
    assert_eq!(
        parse_line("set maxconn frontend fe -1"),
        fe("fe", Err(E::ValueOutOfRange))
    );
    assert_eq!(
        parse_line("set maxconn frontend fe"),
        fe("fe", Err(E::IntegerExpected))
    );
    assert_eq!(
        parse_line("set maxconn frontend"),
        fe("", Err(E::IntegerExpected))
    );
    assert_eq!(level_of("set maxconn frontend fe 5"), CliLevel::Admin);

    assert_eq!(
        parse_line("set maxconn global 100"),
        C::SetMaxconnGlobal(100)
    );
    assert_eq!(parse_line("set maxconn global -5"), C::SetMaxconnGlobal(-5));
    assert_eq!(parse_line("set maxconn global"), C::Bad(E::ExpectsInteger));
    assert_eq!(level_of("set maxconn global"), CliLevel::Admin);
    assert!(matches!(parse_line("set maxconn bogus 1"), C::Unknown(_)));

    let addr = |a: &str, p: Option<&str>| C::SetServer {
        target: "b/s1".into(),
        op: command::ServerOp::Addr {
            addr: a.into(),
            port: p.map(str::to_string),
        },
    };
    assert_eq!(
        parse_line("set server b/s1 addr 127.0.0.2"),
        addr("127.0.0.2", None)
    );
    assert_eq!(
        parse_line("set server b/s1 addr ::1 port 8081"),
        addr("::1", Some("8081"))
    );
    assert_eq!(
        parse_line("set server b/s1 addr 10.0.0.1 port"),
        addr("10.0.0.1", Some(""))
    );
    // A word other than `port` after the address is ignored, as in HAProxy.
    assert_eq!(
        parse_line("set server b/s1 addr 10.0.0.1 prot 1"),
        addr("10.0.0.1", None)
    );
    assert_eq!(
        parse_line("set server b/s1 addr"),
        C::SetServer {
            target: "b/s1".into(),
            op: command::ServerOp::AddrMissing
        }
    );
}

#[test]
fn show_version_is_one_line() {
    let (ctx, _tx) = ctx();
    assert_eq!(
        converse(&ctx, op_session(), b"show version\n", true),
        format!("{}\n\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn severity_output_tags_messages_not_dumps() {
    let (ctx, _tx) = servers_ctx();
    let run = |line: &str| converse(&ctx, admin_session(), format!("{line}\n").as_bytes(), true);
    // 19-severity-output.txt, byte for byte.
    assert_eq!(
        run("set severity-output number;set server b/nosuch state ready"),
        "\n[3]: No such server.\n\n"
    );
    assert_eq!(
        run("set severity-output number;set server b/s1 state ready"),
        "\n\n"
    );
    assert_eq!(
        run("set severity-output string;set server b/nosuch state ready"),
        "\n[err]: No such server.\n\n"
    );
    // Dumps are never tagged.
    let out = run("set severity-output number;show servers state b");
    assert!(out.starts_with("\n1\n# be_id "), "{out}");
    let out = run("set severity-output number;show stat");
    assert!(out.starts_with("\n# pxname,"), "{out}");
    assert_eq!(
        run("set severity-output number;get weight b/s2"),
        "\n1 (initial 1)\n\n"
    );
    // Messages: info (6) and errors (3), with the level check's refusal too.
    assert_eq!(
        run("set severity-output string;show version"),
        format!("\n[info]: {}\n\n", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        run("set severity-output number;show cli level"),
        "\n[6]: admin\n\n"
    );
    assert_eq!(
        run("set severity-output number;user;set weight b/s1 1"),
        "\n\n[3]: Permission denied\n\n"
    );
    assert_eq!(
        run("set severity-output number;set timeout cli x"),
        "\n[3]: Invalid timeout value.\n\n"
    );
    assert!(run("set severity-output string;help")
        .starts_with("\n[info]: The following commands are valid at this level:\n"));
    // Back to none; and the error for a bad word.
    assert_eq!(
        run("set severity-output number;set severity-output none;show version"),
        format!("\n\n{}\n\n", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        run("set severity-output loud"),
        "one of 'none', 'number', 'string' is a required argument\n\n"
    );
    // The setting is per connection.
    assert_eq!(
        run("set server b/nosuch state ready"),
        "No such server.\n\n"
    );
}

#[test]
fn prompt_modes_follow_haproxy_3() {
    let (ctx, _tx) = ctx();
    let talk = |input: &str| converse(&ctx, op_session(), input.as_bytes(), true);
    // `i`: interactive without a prompt; each answer ends with its empty line only.
    assert_eq!(
        talk("prompt i\nshow cli level\nshow cli level\nquit\n"),
        "\noperator\n\noperator\n\n"
    );
    // `p`: the usual prompt; `prompt` in prompt mode goes back to non-interactive.
    assert_eq!(
        talk("prompt p\nshow cli level\nquit\n"),
        "\n> operator\n\n> "
    );
    // (Without closing our side: the server closes, after answering the lines that
    // arrived with this one, as in non-interactive mode.)
    let open = |input: &str| converse(&ctx, op_session(), input.as_bytes(), false);
    assert_eq!(
        open("prompt p\nprompt\nshow cli level\n"),
        "\n> \noperator\n\n"
    );
    // `prompt` from `i` enters prompt mode (n/i -> p).
    assert_eq!(talk("prompt i\nprompt\nquit\n"), "\n\n> ");
    // `n` closes after the current line, from any mode.
    assert_eq!(
        open("prompt p\nprompt n;show cli level\n"),
        "\n> \noperator\n\n"
    );
    assert_eq!(open("prompt i\nprompt n\n"), "\n\n");
    // `timed`: prompt mode with the uptime, `[d:hh:mm:ss]> `; twice toggles it off.
    let out = talk("prompt timed\nshow cli level\nquit\n");
    let re_ok = |s: &str| {
        s.len() == "[0:00:00:00]> ".len()
            && s.starts_with("[0:00:")
            && s.ends_with("]> ")
            && s[1..s.len() - 3]
                .split(':')
                .all(|f| f.bytes().all(|b| b.is_ascii_digit()))
    };
    let (first, rest) = out[1..].split_at("[0:00:00:00]> ".len());
    assert!(out.starts_with('\n') && re_ok(first), "{out:?}");
    assert!(
        rest.starts_with("operator\n\n") && re_ok(&rest["operator\n\n".len()..]),
        "{out:?}"
    );
    assert_eq!(
        talk("prompt timed\nprompt timed\nquit\n")[..1].to_string(),
        "\n"
    );
    assert!(talk("prompt timed\nprompt timed\nquit\n").ends_with("\n> "));
    // Payload prompts only in prompt mode.
    assert_eq!(
        talk("prompt i\nshow cli level <<\na b\n\nquit\n"),
        "\noperator\n\n"
    );
    // help, and a bad word (an error, mode unchanged: the connection closes).
    let usage = format!("{}\n", command::PROMPT_USAGE);
    assert_eq!(talk("prompt help\n"), format!("{usage}\n"));
    assert!(usage.starts_with("Usage: prompt [help | n | i | p | timed]*\n"));
    assert!(usage.ends_with("Without any argument, toggles between n/i->p, p->n.\n"));
    assert_eq!(open("prompt x\n"), format!("{usage}\n"));
    assert_eq!(
        talk("prompt p\nprompt x\nquit\n"),
        format!("\n> {usage}\n> ")
    );
}

#[test]
fn set_server_addr_answers_like_haproxy_and_moves_the_server() {
    let (ctx, _tx) = servers_ctx();
    let run = |cmd: &str| converse(&ctx, admin_session(), format!("{cmd}\n").as_bytes(), true);
    let s1 = &ctx.state.backends[0].servers[0];
    // 07-server-state.txt, byte for byte.
    assert_eq!(
        run("set server b/s1 addr 127.0.0.1 port 19002"),
        "no need to change the addr, port changed from '19001' to '19002' by 'stats socket command'\n\n"
    );
    assert_eq!(s1.addr(), "127.0.0.1:19002".parse().unwrap());
    assert_eq!(
        run("set server b/s1 addr 127.0.0.1 port 19001"),
        "no need to change the addr, port changed from '19002' to '19001' by 'stats socket command'\n\n"
    );
    assert_eq!(
        run("set server b/s1 addr 127.0.0.2"),
        "IP changed from '127.0.0.1' to '127.0.0.2' by 'stats socket command'\n\n"
    );
    assert_eq!(
        run("set server b/s1 addr 127.0.0.3 port 8081"),
        "IP changed from '127.0.0.2' to '127.0.0.3', port changed from '19001' to '8081' by 'stats socket command'\n\n"
    );
    assert_eq!(
        run("set server b/s1 addr 127.0.0.4 port 8081"),
        "IP changed from '127.0.0.3' to '127.0.0.4', no need to change the port by 'stats socket command'\n\n"
    );
    assert_eq!(
        run("set server b/s1 addr 127.0.0.4 port 8081"),
        "no need to change the addr, no need to change the port by 'stats socket command'\n\n"
    );
    assert_eq!(
        run("set server b/s1 addr 127.0.0.4"),
        "no need to change the addr by 'stats socket command'\n\n"
    );
    assert_eq!(s1.addr(), "127.0.0.4:8081".parse().unwrap());
    // Errors: the address, then the port (the address change still applies).
    assert_eq!(
        run("set server b/s1 addr nosuch.example"),
        "Invalid addr 'nosuch.example' by 'stats socket command'\n\n"
    );
    assert_eq!(
        run("set server b/s1 addr 127.0.0.5 port x"),
        "IP changed from '127.0.0.4' to '127.0.0.5', problem converting port 'x' to an int by 'stats socket command'\n\n"
    );
    assert_eq!(
        run("set server b/s1 addr 127.0.0.5 port"),
        "no need to change the addr, problem converting port '' to an int by 'stats socket command'\n\n"
    );
    assert!(run("set server b/s1 addr 127.0.0.5 port +1").contains("to port map"));
    assert_eq!(s1.addr(), "127.0.0.5:8081".parse().unwrap());
    assert_eq!(
        run("set server b/s1 addr"),
        "set server <b>/<s> addr requires an address and optionally a port.\n\n"
    );
    // IPv6, then back.
    assert_eq!(
        run("set server b/s1 addr ::1 port 19001"),
        "IP changed from '127.0.0.5' to '::1', port changed from '8081' to '19001' by 'stats socket command'\n\n"
    );
    assert_eq!(s1.addr(), "[::1]:19001".parse().unwrap());
    let out = run("show servers state b");
    assert!(out.contains("\n3 b 1 s1 ::1 2 0 1 1 "), "{out}");
    assert!(out.contains(" - 19001 - 0 0 - - 0\n"), "{out}");
    assert_eq!(
        run("set severity-output number;set server b/s1 addr 127.0.0.1"),
        "\n[4]: IP changed from '::1' to '127.0.0.1' by 'stats socket command'\n\n"
    );
    // `show stat` and `show servers conn` print the address in force.
    run("set server b/s2 addr 127.0.0.9 port 9");
    let out = run("show stat");
    assert!(out.contains(",127.0.0.9:9,"), "{out}");
    assert!(run("show servers conn b").contains("\nb/s2 3/2 127.0.0.9 9 - "));
    // Admin only.
    let op = converse(
        &ctx,
        op_session(),
        b"set server b/s1 addr 127.0.0.7\n",
        true,
    );
    assert_eq!(op, "Permission denied\n\n");
    assert_eq!(s1.addr(), "127.0.0.1:19001".parse().unwrap());
}

#[test]
fn set_maxconn_changes_limits_and_their_stats() {
    let (ctx, _tx) = servers_ctx();
    let run = |cmd: &str| converse(&ctx, admin_session(), format!("{cmd}\n").as_bytes(), true);
    let row = |px: &str, sv: &str| -> Vec<String> {
        let out = run("show stat");
        out.lines()
            .find(|l| l.starts_with(&format!("{px},{sv},")))
            .unwrap_or_else(|| panic!("no row {px}/{sv} in {out}"))
            .split(',')
            .map(str::to_string)
            .collect()
    };
    const SLIM: usize = 6;
    // Server: 14-levels.txt shows slim 200 after `set maxconn server b/s1 200`.
    assert_eq!(row("b", "s1")[SLIM], "");
    assert_eq!(run("set maxconn server b/s1 200"), "\n");
    assert_eq!(ctx.state.backends[0].servers[0].maxconn(), 200);
    assert_eq!(row("b", "s1")[SLIM], "200");
    assert_eq!(run("set maxconn server b/s1 0"), "\n");
    assert_eq!(row("b", "s1")[SLIM], "");
    assert_eq!(run("set maxconn server b/nosuch 1"), "No such server.\n\n");
    assert_eq!(run("set maxconn server b/s1"), "Require <maxconn>.\n\n");
    assert_eq!(
        run("set maxconn server b/s1 x"),
        "maxconn string empty or preceded by garbage\n\n"
    );
    assert_eq!(
        run("set maxconn server b/s1 5x"),
        "Trailing garbage in maxconn string\n\n"
    );
    // The lookup is reported before the value.
    assert_eq!(
        run("set maxconn server nosuch/s1 x"),
        "No such backend.\n\n"
    );

    // Frontend: slim follows; errors as proxy.c.
    assert_eq!(row("fe", "FRONTEND")[SLIM], "9985");
    assert_eq!(run("set maxconn frontend fe 50"), "\n");
    assert_eq!(ctx.state.admission.limits().frontend(0), 50);
    assert_eq!(row("fe", "FRONTEND")[SLIM], "50");
    assert_eq!(
        run("set maxconn frontend"),
        "A frontend name is expected.\n\n"
    );
    assert_eq!(
        run("set maxconn frontend nosuch 5"),
        "No such frontend.\n\n"
    );
    assert_eq!(run("set maxconn frontend nosuch"), "No such frontend.\n\n");
    assert_eq!(
        run("set maxconn frontend fe"),
        "Integer value expected.\n\n"
    );
    assert_eq!(run("set maxconn frontend fe -2"), "Value out of range.\n\n");
    assert_eq!(ctx.state.admission.limits().frontend(0), 50);

    // Global: never above the configured (hard) value; <= 0 restores it.
    let info = |k: &str| {
        info_map(&run("show info"))
            .into_iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v)
            .unwrap()
    };
    assert_eq!(run("set maxconn global 100"), "\n");
    assert_eq!(ctx.state.admission.limits().global(), 100);
    assert_eq!(info("Maxconn"), "100");
    assert_eq!(info("Hard_maxconn"), "9985");
    assert_eq!(run("set maxconn global 9986"), "Value out of range.\n\n");
    assert_eq!(run("set maxconn global"), "Expects an integer value.\n\n");
    assert_eq!(ctx.state.admission.limits().global(), 100);
    assert_eq!(run("set maxconn frontend fe 0"), "\n");
    assert_eq!(row("fe", "FRONTEND")[SLIM], "100");
    assert_eq!(run("set maxconn global 0"), "\n");
    assert_eq!(info("Maxconn"), "9985");

    // All three are admin commands.
    for cmd in [
        "set maxconn server b/s1 5\n",
        "set maxconn frontend fe 5\n",
        "set maxconn global 5\n",
    ] {
        assert_eq!(
            converse(&ctx, op_session(), cmd.as_bytes(), true),
            "Permission denied\n\n",
            "{cmd}"
        );
    }
}

#[test]
fn help_lists_new_commands_in_haproxy_order() {
    let (ctx, _tx) = ctx();
    let h = converse(&ctx, op_session(), b"help\n", true);
    let pos = |s: &str| {
        h.find(s)
            .unwrap_or_else(|| panic!("help lacks '{s}':\n{h}"))
    };
    assert!(h.contains("  set severity-output [none|number|string]: set presence of severity level in feedback information\n"));
    assert!(h.contains(
        "  set maxconn frontend <frontend> <value> : change a frontend's maxconn setting\n"
    ));
    assert!(h.contains(
        "  show version                            : show version of the current process\n"
    ));
    assert!(pos("  set map ") < pos("  set maxconn frontend "));
    assert!(pos("  set maxconn frontend ") < pos("  set maxconn global "));
    assert!(pos("  set maxconn server ") < pos("  set server "));
    assert!(pos("  set server ") < pos("  set severity-output "));
    assert!(pos("  show stat ") < pos("  show version "));
    assert!(pos("  show version ") < pos("  shutdown session "));
    assert!(h.ends_with("  help [<command>]                        : list matching or all commands\n  prompt                                  : toggle interactive mode with prompt\n  quit                                    : disconnect\n\n"));
}

#[test]
fn map_versions_prepare_add_show_commit_like_haproxy() {
    let (ctx, _tx) = map_ctx();
    let run = |cmd: &str| converse(&ctx, admin_session(), format!("{cmd}\n").as_bytes(), true);
    let unknown = "Unknown map identifier. Please use #<id> or <file>.\n\n";
    assert_eq!(
        run("add map @1 #0 10.9.0.1 b"),
        "Version number in the future, please use 'prepare map' before.\n\n"
    );
    assert_eq!(run("prepare map #0"), "New version created: 1\n\n");
    assert_eq!(run("prepare map"), unknown);
    assert_eq!(run("prepare map #5"), unknown);
    assert!(run("show map").contains(" curr_ver=0 next_ver=1 entry_cnt=2\n"));
    assert_eq!(run("add map @1 #0 10.9.0.1 b"), "\n");
    assert_eq!(run("add map @1 #0 <<\n10.9.0.2 b2\n"), "\n");
    assert_eq!(
        map_lines(&run("show map @1 #0")).0,
        ["10.9.0.1 b", "10.9.0.2 b2"]
    );
    // The current version is untouched and still shown by default and as @0.
    let current = run("show map #0");
    assert_eq!(map_lines(&current).0, ["127.0.0.1 b", "10.0.0.1 b"]);
    assert_eq!(run("show map @0 #0"), current);
    assert_eq!(run("show map @9 #0"), "\n");
    assert_eq!(run("show map @1"), unknown);
    assert!(run("show map").contains(" curr_ver=0 next_ver=1 entry_cnt=2\n"));
    for (cmd, err) in [
        ("commit map #0", "Missing version number.\n"),
        ("commit map", "Missing version number.\n"),
        ("commit map @1", "Missing map identifier.\n"),
        (
            "commit map @1 #5",
            "Unknown map identifier. Please use #<id> or <file>.\n",
        ),
        ("commit map @0 #0", "Version number out of range.\n"),
        ("commit map @2 #0", "Version number out of range.\n"),
        ("clear map @1", "Missing map identifier.\n"),
    ] {
        assert_eq!(run(cmd), format!("{err}\n"), "{cmd}");
    }
    assert_eq!(run("commit map @1 #0"), "\n");
    assert!(run("show map").contains(" curr_ver=1 next_ver=1 entry_cnt=2\n"));
    assert_eq!(
        map_lines(&run("show map #0")).0,
        ["10.9.0.1 b", "10.9.0.2 b2"]
    );
    assert_eq!(
        run("get map #0 127.0.0.1"),
        "type=ip, case=sensitive, found=no\n\n"
    );
    // clear map @VER of a prepared version, then commit: an empty map.
    assert_eq!(
        run("prepare map /run/haproxy/be.map"),
        "New version created: 2\n\n"
    );
    assert_eq!(
        run("add map @2 #0 10.1.1.1 x; clear map @2 #0; show map @2 #0"),
        "\n\n\n"
    );
    assert_eq!(run("commit map @2 #0; show map #0"), "\n\n");
    // Versions need operator level; show map @VER does not.
    let user = || Session::new(CliLevel::User, Duration::from_secs(10));
    for cmd in [
        "prepare map #0",
        "commit map @3 #0",
        "add map @2 #0 10.0.0.1 a",
    ] {
        assert_eq!(
            converse(&ctx, user(), format!("{cmd}\n").as_bytes(), true),
            "Permission denied\n\n",
            "{cmd}"
        );
    }
    assert_eq!(converse(&ctx, user(), b"show map @2 #0\n", true), "\n");
}

/// A config whose map `#0` holds `n` entries `10.x.y.z/32 -> v<i>` in order.
fn big_map_ctx(n: u32) -> (Ctx, watch::Sender<Phase>) {
    let mut text = String::new();
    for i in 0..n {
        let a = std::net::Ipv4Addr::from(0x0a00_0000 + i);
        text.push_str(&format!("{a} v{i}\n"));
    }
    let mut c = reference_config("127.0.0.1:18080".parse().unwrap(), [19001, 19002]);
    c.maps = vec![MapSource {
        path: "/big.map".into(),
        used_at: Location::default(),
        entries: crate::maps::parse_text("big.map", &text).unwrap(),
    }];
    make_ctx(c)
}

#[test]
fn show_map_of_a_large_map_streams_in_order_and_keeps_batching() {
    const N: u32 = 40_000;
    let (ctx, _tx) = big_map_ctx(N);
    let writes = Rc::new(Cell::new(0));
    let got = rt().block_on(async {
        let (mut client, server) = UnixStream::pair().unwrap();
        let server = CountWrites {
            inner: server,
            writes: writes.clone(),
        };
        client
            .write_all(b"show cli level; show map #0; show cli level\n")
            .await
            .unwrap();
        client.shutdown().await.unwrap();
        let read = async {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        };
        let (_, got) = tokio::time::timeout(WAIT * 4, async {
            tokio::join!(serve_conn(&ctx, server, op_session()), read)
        })
        .await
        .expect("dump did not finish");
        String::from_utf8(got).unwrap()
    });
    let body = got
        .strip_prefix("operator\n\n")
        .and_then(|r| r.strip_suffix("\noperator\n\n"))
        .unwrap_or_else(|| panic!("answers out of order: {:?}", &got[..200.min(got.len())]));
    let (kv, ptrs) = map_lines(body);
    assert_eq!(kv.len(), N as usize, "every entry once");
    for (i, l) in kv.iter().enumerate() {
        let a = std::net::Ipv4Addr::from(0x0a00_0000 + i as u32);
        assert_eq!(l, &format!("{a} v{i}"), "line {i}");
    }
    let mut uniq = ptrs.clone();
    uniq.dedup();
    assert_eq!(uniq.len(), ptrs.len(), "pointers distinct and increasing");
    // Chunks of about OUT_FLUSH bytes, not one write per line nor one huge write.
    let w = writes.get();
    let chunks = got.len() / frame::OUT_FLUSH;
    eprintln!("{} bytes in {w} writes", got.len());
    assert!(
        w >= chunks && w <= 2 * chunks + 2,
        "{w} writes for {chunks} chunks"
    );
}

// ---- the command table ----

#[test]
fn the_command_table_is_complete_unique_guarded_and_listed_by_help() {
    use std::collections::HashSet;
    use table::{Level, COMMANDS};
    let (ctx, _tx) = ctx();

    // Every entry has a usage and a description, and no two share their words.
    let mut seen = HashSet::new();
    for spec in COMMANDS {
        let line = spec.words.join(" ");
        assert!(!spec.words.is_empty(), "an entry without words");
        assert!(!spec.usage.trim().is_empty(), "'{line}' has no usage");
        assert!(!spec.help.trim().is_empty(), "'{line}' has no description");
        assert!(seen.insert(spec.words), "two entries for '{line}'");
        // The words alone select the entry (longest match).
        let parsed = parsed_line(&line);
        assert!(
            parsed.spec.is_some_and(|s| std::ptr::eq(s, spec)),
            "'{line}' selects {:?}",
            parsed.spec.map(|s| s.words)
        );
    }

    // Every command above user level is refused on a user-level session with
    // HAProxy's text, and an admin-only one on an operator-level session too; the
    // refusal changes nothing (the session keeps its level).
    let denied = format!("{}\n", dispatch::PERMISSION_DENIED);
    assert_eq!(denied, "Permission denied\n\n");
    let mut admin_only = 0;
    for spec in COMMANDS {
        let line = spec.words.join(" ");
        let need = parsed_line(&line).level();
        if matches!(spec.level, Level::Admin) {
            assert_eq!(need, CliLevel::Admin, "{line}");
            admin_only += 1;
        }
        for have in [CliLevel::User, CliLevel::Operator] {
            if have >= need {
                continue;
            }
            let got = converse(
                &ctx,
                Session::new(have, Duration::from_secs(10)),
                format!("{line}; show cli level\n").as_bytes(),
                true,
            );
            let shown = render::level_name(have);
            assert_eq!(got, format!("{denied}{shown}\n\n"), "'{line}' at {shown}");
        }
    }
    assert!(admin_only > 0);
    // A level decided by the arguments: `clear counters all` needs admin.
    assert_eq!(level_of("clear counters"), CliLevel::Operator);
    assert_eq!(level_of("clear counters all"), CliLevel::Admin);

    // `help` lists exactly the table's commands, each once, in HAProxy's order: by
    // usage text, then `help`, `prompt`, `quit`.
    let out = converse(&ctx, op_session(), b"help\n", true);
    let body = out
        .strip_prefix("The following commands are valid at this level:\n")
        .and_then(|b| b.strip_suffix("\n\n"))
        .unwrap_or_else(|| panic!("{out}"));
    let lines: Vec<&str> = body.split('\n').collect();
    assert_eq!(lines.len(), COMMANDS.len(), "{body}");
    let listed: Vec<&table::Spec> = lines
        .iter()
        .map(|l| {
            let found: Vec<&table::Spec> = COMMANDS
                .iter()
                .filter(|s| *l == format!("  {:<40}: {}", s.usage, s.help))
                .collect();
            assert_eq!(found.len(), 1, "help line '{l}' is not one entry");
            found[0]
        })
        .collect();
    let (rest, last) = listed.split_at(listed.len() - 3);
    let last: Vec<&[&str]> = last.iter().map(|s| s.words).collect();
    assert_eq!(last, [["help"], ["prompt"], ["quit"]]);
    for pair in rest.windows(2) {
        assert!(
            pair[0].usage.as_bytes() < pair[1].usage.as_bytes(),
            "help lists '{}' before '{}'",
            pair[0].usage,
            pair[1].usage
        );
    }
}
