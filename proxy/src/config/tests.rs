//! Unit tests of the configuration room: lexer, units, every keyword, defaults
//! inheritance, listen expansion and every cross-check with its exact message.

use std::net::SocketAddr;
use std::time::Duration;

use super::lexer::{split_line, LexError};
use super::*;

const DEFAULTS: &str =
    "defaults\n mode tcp\n timeout connect 5s\n timeout client 30s\n timeout server 30s\n";

fn ok(text: &str) -> Loaded {
    match parse_str("t.cfg", text) {
        Ok(l) => l,
        Err(errs) => panic!(
            "unexpected errors: {:#?}",
            errs.iter().map(|e| e.to_string()).collect::<Vec<_>>()
        ),
    }
}

/// Parses DEFAULTS + `body` and expects success.
fn okd(body: &str) -> Config {
    ok(&format!("{DEFAULTS}{body}")).config
}

fn errs(text: &str) -> Vec<String> {
    match parse_str("t.cfg", text) {
        Ok(l) => panic!("expected errors, got {:#?}", l.config),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

/// Parses `text` and expects exactly one error, returned as text.
fn err1(text: &str) -> String {
    let e = errs(text);
    assert_eq!(e.len(), 1, "expected one error, got {e:#?}");
    e.into_iter().next().unwrap_or_default()
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn words(line: &str) -> Vec<String> {
    split_line(line, &|k| match k {
        "FOO" => Some("bar".to_string()),
        "SP" => Some("a b".to_string()),
        _ => None,
    })
    .unwrap()
}

// ---------- units ----------

#[test]
fn time_units() {
    assert_eq!(parse_time("10"), Ok(Duration::from_millis(10)));
    assert_eq!(parse_time("10ms"), Ok(Duration::from_millis(10)));
    assert_eq!(parse_time("250us"), Ok(Duration::from_micros(250)));
    assert_eq!(parse_time("5s"), Ok(Duration::from_secs(5)));
    assert_eq!(parse_time("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_time("3h"), Ok(Duration::from_secs(3 * 3600)));
    assert_eq!(parse_time("1d"), Ok(Duration::from_secs(86400)));
    assert_eq!(parse_time("0"), Ok(Duration::ZERO));
}

#[test]
fn time_errors() {
    assert_eq!(parse_time(""), Err(UnitError::Empty));
    assert_eq!(parse_time("x"), Err(UnitError::UnexpectedChar('x')));
    assert_eq!(parse_time("1x"), Err(UnitError::UnexpectedChar('x')));
    assert_eq!(parse_time("1S"), Err(UnitError::UnexpectedChar('S')));
    assert_eq!(parse_time("1.5s"), Err(UnitError::UnexpectedChar('.')));
    assert_eq!(parse_time("-1"), Err(UnitError::UnexpectedChar('-')));
    assert_eq!(parse_time("1ms5"), Err(UnitError::UnexpectedChar('5')));
    assert_eq!(parse_time("1sx"), Err(UnitError::UnexpectedChar('x')));
    assert_eq!(
        parse_time("30d"),
        Err(UnitError::TimerOverflow("30d".into()))
    );
    assert_eq!(
        parse_time("2147483647"),
        Ok(Duration::from_millis(2147483647))
    );
    assert!(parse_time("2147483648").is_err());
    assert!(parse_time("99999999999999999999999").is_err());
}

#[test]
fn size_units() {
    assert_eq!(parse_size("512"), Ok(512));
    assert_eq!(parse_size("16k"), Ok(16384));
    assert_eq!(parse_size("16K"), Ok(16384));
    assert_eq!(parse_size("1m"), Ok(1 << 20));
    assert_eq!(parse_size("1M"), Ok(1 << 20));
    assert_eq!(parse_size("2g"), Ok(2 << 30));
    assert_eq!(parse_size("2G"), Ok(2 << 30));
    assert_eq!(parse_size(""), Err(UnitError::Empty));
    assert_eq!(parse_size("1t"), Err(UnitError::UnexpectedChar('t')));
    assert_eq!(parse_size("1kb"), Err(UnitError::UnexpectedChar('b')));
    assert!(parse_size("99999999999999999g").is_err());
}

// ---------- lexer ----------

#[test]
fn lexer_words_and_comments() {
    assert_eq!(words("  bind\t:80   # a comment"), ["bind", ":80"]);
    assert_eq!(words("bind :81#x"), ["bind", ":81"]);
    assert_eq!(words("# only a comment"), Vec::<String>::new());
    assert_eq!(words(""), Vec::<String>::new());
}

#[test]
fn lexer_quotes() {
    assert_eq!(words(r#"a "b c" d"#), ["a", "b c", "d"]);
    assert_eq!(words(r#"a 'b # c' d"#), ["a", "b # c", "d"]);
    assert_eq!(words(r#"x"y z"w"#), ["xy zw"]);
    assert_eq!(words(r#"a "" b"#), ["a", "", "b"]);
    assert_eq!(words(r#""it's""#), ["it's"]);
    assert_eq!(words(r#"'say "hi"'"#), [r#"say "hi""#]);
}

#[test]
fn lexer_escapes() {
    assert_eq!(words(r"a\ b"), ["a b"]);
    assert_eq!(words(r"a\#b"), ["a#b"]);
    assert_eq!(words(r"a\\b"), [r"a\b"]);
    assert_eq!(words(r#"a\"b"#), [r#"a"b"#]);
    assert_eq!(words(r"\x41b"), ["Ab"]);
    assert_eq!(words(r"a\tb"), ["a\tb"]);
    assert_eq!(words(r"a\zb"), [r"a\zb"]);
    assert_eq!(words(r"'a\ b'"), [r"a\ b"]);
    assert_eq!(words(r#""a\"b""#), [r#"a"b"#]);
    assert_eq!(words(r#""\$FOO""#), ["$FOO"]);
}

#[test]
fn lexer_env_expansion() {
    assert_eq!(words(r#""${FOO}""#), ["bar"]);
    assert_eq!(words(r#""$FOO""#), ["bar"]);
    assert_eq!(words(r#""x${FOO}y""#), ["xbary"]);
    assert_eq!(words(r#""$FOO.x""#), ["bar.x"]);
    assert_eq!(words(r#""${NOPE}x""#), ["x"]);
    assert_eq!(words(r#""${NOPE-def}x""#), ["defx"]);
    assert_eq!(words(r#""${FOO-def}x""#), ["barx"]);
    assert_eq!(words(r#""${SP}""#), ["a b"]);
    // Not expanded outside double quotes.
    assert_eq!(words("$FOO"), ["$FOO"]);
    assert_eq!(words("'${FOO}'"), ["${FOO}"]);
    assert_eq!(words(r#""a$""#), ["a$"]);
}

#[test]
fn lexer_errors() {
    let env = |_: &str| None;
    assert_eq!(
        split_line(r#" bind "1.2.3.4:80"#, &env),
        Err(LexError::UnmatchedQuote { pos: 7 })
    );
    assert_eq!(
        split_line("a 'b", &env),
        Err(LexError::UnmatchedQuote { pos: 3 })
    );
    assert!(matches!(
        split_line(r"\xZZ", &env),
        Err(LexError::BadHexEscape { .. })
    ));
    let many = vec!["w"; MAX_LINE_ARGS + 1].join(" ");
    assert_eq!(split_line(&many, &env), Err(LexError::TooManyWords));
    let max = vec!["w"; MAX_LINE_ARGS].join(" ");
    assert_eq!(split_line(&max, &env).map(|w| w.len()), Ok(MAX_LINE_ARGS));
}

#[test]
fn env_expansion_in_config() {
    let text = "frontend \"${FE_NAME}\"\n bind \"127.0.0.1:${PORT}\"\n timeout client 1s\n";
    let env = |k: &str| match k {
        "FE_NAME" => Some("web".to_string()),
        "PORT" => Some("8443".to_string()),
        _ => None,
    };
    let files = [("t.cfg".to_string(), text.to_string())];
    let l = parse_files(&files, &env).unwrap();
    assert_eq!(l.config.frontends[0].name, "web");
    assert_eq!(l.config.frontends[0].binds, [sa("127.0.0.1:8443")]);
}

#[test]
fn unmatched_quote_in_config() {
    assert_eq!(
        errs("frontend fe\n bind \"1.2.3.4:80\n")[0],
        "parsing [t.cfg:2] : unmatched quote at position 7"
    );
}

// ---------- global ----------

#[test]
fn global_defaults() {
    let c = ok("").config;
    assert_eq!(c.global, Global::default());
    assert_eq!(c.global.maxpipes, DEFAULT_MAXCONN / 4);
    assert!(c.frontends.is_empty() && c.backends.is_empty());
}

#[test]
fn global_keywords() {
    let c = ok("global
  nbthread 4
  maxconn 20000
  user haproxy
  group haproxy
  pidfile /run/shunt.pid
  hard-stop-after 30s
  stats socket /run/shunt.sock mode 660 level admin user root group adm expose-fd listeners
  stats socket /run/shunt-ro.sock
  stats timeout 2m
  stats maxconn 20
  forward-mode splice
  tune.pipesize 256k
  tune.runqueue-depth 40
  tune.sched.low-latency on
  log 127.0.0.1:514 local0 info
")
    .config;
    let g = &c.global;
    assert_eq!(g.nbthread, Some(4));
    assert_eq!(g.maxconn, 20000);
    assert_eq!(g.maxpipes, 5000, "maxpipes defaults to maxconn/4");
    assert_eq!(g.user.as_deref(), Some("haproxy"));
    assert_eq!(g.group.as_deref(), Some("haproxy"));
    assert_eq!(g.pidfile, Some("/run/shunt.pid".into()));
    assert_eq!(g.hard_stop_after, Some(Duration::from_secs(30)));
    assert_eq!(
        g.stats_sockets,
        [
            StatsSocket {
                path: "/run/shunt.sock".into(),
                mode: 0o660,
                level: CliLevel::Admin,
                user: Some("root".into()),
                group: Some("adm".into()),
                expose_fd_listeners: true,
            },
            StatsSocket {
                path: "/run/shunt-ro.sock".into(),
                mode: 0o600,
                level: CliLevel::Operator,
                user: None,
                group: None,
                expose_fd_listeners: false,
            },
        ]
    );
    assert_eq!(g.stats_timeout, Duration::from_secs(120));
    assert_eq!(g.stats_maxconn, 20);
    assert_eq!(g.forward_mode, ForwardMode::Splice);
    assert_eq!(g.pipesize, Some(256 * 1024));
    assert_eq!(g.runqueue_depth, Some(40));
    assert!(g.sched_low_latency);
    assert_eq!(
        g.logs,
        [LogTarget {
            dest: LogDest::Udp("127.0.0.1:514".parse().unwrap()),
            maxlen: 1024,
            format: SyslogFormat::Rfc3164,
            facility: 16,
            level: 6,
            minlevel: 0,
        }]
    );
}

#[test]
fn global_maxpipes_explicit_and_low_latency_off() {
    let g = ok("global\n maxconn 100\n maxpipes 7\n tune.sched.low-latency off\n")
        .config
        .global;
    assert_eq!(g.maxpipes, 7);
    assert!(!g.sched_low_latency);
    assert!(
        g.sched_heavy_cap,
        "the one-heavy-per-loop rule is on by default"
    );
    let g = ok("global\n tune.sched.heavy-cap off\n").config.global;
    assert!(!g.sched_heavy_cap);
    let g = ok("global\n tune.sched.heavy-cap on\n").config.global;
    assert!(g.sched_heavy_cap);
    for (m, want) in [
        ("auto", ForwardMode::Auto),
        ("sockmap", ForwardMode::Sockmap),
        ("copy", ForwardMode::Copy),
    ] {
        assert_eq!(
            ok(&format!("global\n forward-mode {m}\n"))
                .config
                .global
                .forward_mode,
            want
        );
    }
}

#[test]
fn global_profiling_tasks_takes_haproxy_words_and_defaults_to_auto() {
    assert_eq!(
        ok("global\n nbthread 1\n").config.global.profiling_tasks,
        ProfilingTasks::Auto
    );
    for (w, want) in [
        ("on", ProfilingTasks::On),
        ("auto", ProfilingTasks::Auto),
        ("off", ProfilingTasks::Off),
    ] {
        let g = ok(&format!("global\n profiling.tasks {w}\n")).config.global;
        assert_eq!(g.profiling_tasks, want, "profiling.tasks {w}");
    }
}

#[test]
fn global_daemon_is_a_warning() {
    let l = ok("global\n daemon\n");
    assert_eq!(
        l.warnings,
        ["parsing [t.cfg:2] : 'daemon' ignored: shunt always runs in the foreground."]
    );
}

#[test]
fn global_errors() {
    let cases: &[(&str, &str)] = &[
        ("foo bar", "unknown keyword 'foo' in 'global' section"),
        ("nbthred 2", "unknown keyword 'nbthred' in 'global' section; did you mean 'nbthread' maybe ?"),
        ("nbthread", "'nbthread' passed a missing or unparsable integer value in ''"),
        ("nbthread x", "'nbthread' passed a missing or unparsable integer value in 'x'"),
        ("nbthread 0", "'nbthread' value must be between 1 and 64 (was 0)"),
        ("nbthread 5000", "'nbthread' value must be between 1 and 64 (was 5000)"),
        ("nbthread 2 3", "'nbthread' cannot handle unexpected argument '3'."),
        ("maxconn", "'maxconn' expects an integer argument."),
        ("maxconn x", "'maxconn' expects an integer argument (got 'x')."),
        ("maxconn 0", "'maxconn' value must be between 1 and 4194304 (was 0)"),
        ("user", "'user' expects a user name as argument."),
        ("pidfile", "'pidfile' expects a file name as an argument."),
        ("hard-stop-after", "'hard-stop-after' expects <time> as argument."),
        ("hard-stop-after x", "unexpected character 'x' in argument to 'hard-stop-after'."),
        ("stats socket", "'stats socket' in global section expects a path to a UNIX socket"),
        ("stats socket /tmp/x.sock mode abc", "'stats socket' : 'mode' : missing or invalid mode 'abc' (octal integer expected)"),
        ("stats socket /tmp/x.sock mode 99", "'stats socket' : 'mode' : missing or invalid mode '99' (octal integer expected)"),
        ("stats socket /tmp/x.sock level foo", "'stats socket' : 'level' only supports 'user', 'operator', and 'admin' (got 'foo')"),
        ("stats socket /tmp/x.sock expose-fd all", "'stats socket' : 'expose-fd' only supports 'listeners' (got 'all')"),
        ("stats socket /tmp/x.sock bogus 1", "'stats socket' : unknown keyword 'bogus'. Registered keywords : mode, level, user, group, expose-fd."),
        ("stats socket ipv4@127.0.0.1:9999", "'stats socket' : only UNIX sockets are supported by shunt (got 'ipv4@127.0.0.1:9999')"),
        ("stats timeout 1S", "'stats timeout' : unexpected character 'S'"),
        ("stats maxconn 0", "'stats maxconn' expects a positive value"),
        ("stats foo", "'stats' only supports 'socket', 'maxconn' and 'timeout' (got 'foo')"),
        ("forward-mode fast", "'forward-mode' : unknown forward mode 'fast' (expected auto, sockmap, splice or copy)"),
        ("tune.pipesize 1k", "'tune.pipesize' value must be between 4096 and 268435456 (was 1024)"),
        ("tune.pipesize 1q", "unexpected character 'q' in argument to 'tune.pipesize'."),
        ("tune.runqueue-depth 0", "'tune.runqueue-depth' value must be between 1 and 4194304 (was 0)"),
        ("tune.sched.low-latency maybe", "'tune.sched.low-latency' expects either 'on' or 'off' but got 'maybe'."),
        ("tune.sched.heavy-cap", "'tune.sched.heavy-cap' expects either 'on' or 'off' but got ''."),
        ("profiling.tasks yes", "'profiling.tasks' expects either 'on', 'auto', or 'off' but got 'yes'."),
        ("profiling.tasks", "'profiling.tasks' expects either 'on', 'auto', or 'off' but got ''."),
        ("profiling.tasks on off", "'profiling.tasks' cannot handle unexpected argument 'off'."),
        ("log", "log : expects <address> and <facility> as arguments"),
        ("nbproc 2", "nbproc is not supported any more since HAProxy 2.5. Threads will automatically be used on multi-processor machines if available."),
        ("mode tcp", "unknown keyword 'mode' in 'global' section"),
    ];
    for (line, msg) in cases {
        assert_eq!(
            err1(&format!("global\n {line}\n")),
            format!("parsing [t.cfg:2] : {msg}"),
            "line: {line}"
        );
    }
}

#[test]
fn out_of_section_and_unsupported_sections() {
    assert_eq!(
        err1("foo\n"),
        "parsing [t.cfg:1] : unknown keyword 'foo' out of section."
    );
    // Lines of an unsupported section are skipped after one error.
    assert_eq!(
        err1("peers p\n peer a 1.2.3.4:1\n"),
        "parsing [t.cfg:1] : section 'peers' is not supported by shunt."
    );
    assert_eq!(
        err1("global extra\n"),
        "parsing [t.cfg:1] : 'global' cannot handle unexpected argument 'extra'."
    );
}

// ---------- proxies ----------

#[test]
fn frontend_backend_basic() {
    let c = okd("frontend fe
  bind 127.0.0.1:8080
  default_backend be
backend be
  balance leastconn
  server s1 10.0.0.1:80
  server s2 10.0.0.2:80 weight 3
");
    assert_eq!(c.frontends.len(), 1);
    let fe = &c.frontends[0];
    assert_eq!(fe.name, "fe");
    assert_eq!(fe.id, 1);
    assert_eq!(fe.binds, [sa("127.0.0.1:8080")]);
    assert_eq!(fe.default_backend, Some(0));
    assert_eq!(
        fe.line,
        Location {
            file: "t.cfg".into(),
            line: 6
        }
    );
    assert_eq!(fe.timeouts.client, Some(Duration::from_secs(30)));
    let be = &c.backends[0];
    assert_eq!(be.name, "be");
    assert_eq!(be.id, 2);
    assert_eq!(be.balance, Balance::LeastConn);
    assert_eq!(be.retries, 3);
    assert_eq!(be.timeouts.connect, Some(Duration::from_secs(5)));
    assert_eq!(be.servers.len(), 2);
    assert_eq!((be.servers[0].id, be.servers[0].weight), (1, 1));
    assert_eq!((be.servers[1].id, be.servers[1].weight), (2, 3));
    assert_eq!(be.servers[1].addr, sa("10.0.0.2:80"));
    assert_eq!(be.servers[1].line.line, 12);
    assert_eq!(c.backend_by_name("be"), Some(0));
}

#[test]
fn bind_address_forms() {
    let c = okd("frontend fe
  bind :80,*:81,0.0.0.0:82
  bind [::1]:83
  bind :::84
  bind ipv6@:85
  bind ipv4@127.0.0.2:86
  bind 127.0.0.1:90-92
");
    assert_eq!(
        c.frontends[0].binds,
        [
            sa("0.0.0.0:80"),
            sa("0.0.0.0:81"),
            sa("0.0.0.0:82"),
            sa("[::1]:83"),
            sa("[::]:84"),
            sa("[::]:85"),
            sa("127.0.0.2:86"),
            sa("127.0.0.1:90"),
            sa("127.0.0.1:91"),
            sa("127.0.0.1:92"),
        ]
    );
}

#[test]
fn hostnames_resolve() {
    let c = okd("backend be\n server s1 localhost:6379\n");
    assert!(c.backends[0].servers[0].addr.ip().is_loopback());
}

#[test]
fn bind_errors() {
    let cases: &[(&str, &str)] = &[
        ("bind", "'bind' expects [addr1]:port1[-end1]{,[addr]:port[-end]}... as arguments."),
        ("bind :80 npn", "'bind :80' unknown keyword 'npn'. Registered keywords : accept-proxy, alpn, backlog, crt, defer-accept, interface, maxconn, name, ssl, ssl-min-ver, tfo, transparent, v4v6, v6only."),
        ("bind :80 ssl", "Proxy 'fe': no SSL certificate specified for bind '0.0.0.0:80' at [t.cfg:8] (use 'crt')."),
        ("bind :80 ssl crt /nonexistent/x.pem", "'bind 0.0.0.0:80' in section 'frontend' : unable to stat SSL certificate from file '/nonexistent/x.pem' : No such file or directory."),
        ("bind :80 ssl-min-ver TLSv9", "'bind :80' in section 'frontend' : 'TLSv9' : unknown ssl/tls version"),
        ("bind 1.2.3.4", "'bind' : missing port specification in '1.2.3.4'"),
        ("bind 1.2.3.4:", "'bind' : missing port specification in '1.2.3.4:'"),
        ("bind :abc", "'bind' : invalid port 'abc'"),
        ("bind :0", "'bind' : invalid port '0'"),
        ("bind :99999", "'bind' : invalid port '99999'"),
        ("bind :82-80", "'bind' : invalid port range '82-80'"),
        ("bind :1-2000", "'bind' : port range '1-2000' spans 2000 ports, more than 1024"),
        ("bind /tmp/sock", "'bind' : UNIX sockets are not supported by shunt (got '/tmp/sock')"),
        ("bind udp@:53", "'bind' : address family 'udp@' is not supported by shunt (got 'udp@:53')"),
        ("bind [::1:80", "'bind' : invalid address '[::1:80' (missing ']')"),
        ("bind ipv4@[::1]:80", "'bind' : address family mismatch in 'ipv4@[::1]:80'"),
        ("bind no-such-host.invalid:80", "'bind' : could not resolve address 'no-such-host.invalid'"),
    ];
    for (line, msg) in cases {
        assert_eq!(
            err1(&format!("{DEFAULTS}frontend fe\n bind :1\n {line}\n")),
            match msg.starts_with("Proxy ") {
                // A check of the whole configuration: no location prefix.
                true => msg.to_string(),
                false => format!("parsing [t.cfg:8] : {msg}"),
            },
            "line: {line}"
        );
    }
}

#[test]
fn server_keywords_all() {
    let c = okd("backend be
  server s1 10.0.0.1:80 weight 0 maxconn 100 maxqueue 10 backup disabled id 7 check inter 2s fastinter 500 downinter 5s rise 3 fall 2 port 8080 addr 10.0.0.9 agent-check agent-port 9999 agent-inter 10s on-marked-down shutdown-sessions
  server s2 10.0.0.2:80
");
    let s = &c.backends[0].servers[0];
    assert_eq!(s.name, "s1");
    assert_eq!(s.id, 7);
    assert_eq!(s.weight, 0);
    assert_eq!(s.maxconn, 100);
    assert_eq!(s.maxqueue, 10);
    assert!(s.backup && s.disabled);
    assert_eq!(
        s.check,
        CheckParams {
            enabled: true,
            inter: Some(Duration::from_secs(2)),
            fastinter: Some(Duration::from_millis(500)),
            downinter: Some(Duration::from_secs(5)),
            rise: Some(3),
            fall: Some(2),
            port: Some(8080),
            addr: Some("10.0.0.9".into()),
            agent_check: true,
            agent_port: Some(9999),
            agent_inter: Some(Duration::from_secs(10)),
            on_marked_down_shutdown: true,
            ..CheckParams::default()
        }
    );
    let s2 = &c.backends[0].servers[1];
    assert_eq!(s2.id, 1, "auto ids take the smallest free id");
    assert_eq!(s2.check, CheckParams::default());
    assert!(!s2.backup && !s2.disabled);
    assert_eq!(s2.weight, 1);
}

#[test]
fn server_ids_skip_explicit_ones() {
    let c = okd("backend be\n server a 1.1.1.1:1\n server b 1.1.1.1:2 id 2\n server c 1.1.1.1:3\n server d 1.1.1.1:4\n");
    let ids: Vec<u32> = c.backends[0].servers.iter().map(|s| s.id).collect();
    assert_eq!(ids, [1, 2, 3, 4]);
    let c = okd(
        "backend be\n server a 1.1.1.1:1 id 1\n server b 1.1.1.1:2\n server c 1.1.1.1:3 id 2\n",
    );
    let ids: Vec<u32> = c.backends[0].servers.iter().map(|s| s.id).collect();
    assert_eq!(ids, [1, 3, 2]);
}

#[test]
fn default_server_applies_to_following_servers() {
    let c = okd("backend be
  default-server weight 5 check inter 3s maxconn 50
  server a 1.1.1.1:1
  server b 1.1.1.1:2 weight 2 no-check
  default-server weight 9
  server c 1.1.1.1:3
");
    let s = &c.backends[0].servers;
    assert_eq!(
        (
            s[0].weight,
            s[0].check.enabled,
            s[0].check.inter,
            s[0].maxconn
        ),
        (5, true, Some(Duration::from_secs(3)), 50)
    );
    assert_eq!((s[1].weight, s[1].check.enabled), (2, false));
    assert_eq!(
        (s[2].weight, s[2].check.enabled, s[2].maxconn),
        (9, true, 50)
    );
}

#[test]
fn server_errors() {
    let kws = "addr, agent-addr, agent-check, agent-inter, agent-port, agent-send, backup, ca-file, check, check-send-proxy, check-sni, check-ssl, disabled, downinter, enabled, error-limit, fall, fastinter, id, inter, maxconn, maxqueue, no-agent-check, no-backup, no-check, no-check-send-proxy, no-check-ssl, no-send-proxy, no-send-proxy-v2, no-ssl, observe, on-error, on-marked-down, on-marked-up, port, rise, send-proxy, send-proxy-v2, slowstart, sni, source, ssl, verify, weight, pool-max-conn, pool-low-conn, pool-purge-delay";
    let foo = format!("'server be/s1' : unknown keyword 'foo'. Registered keywords : {kws}.");
    let wieght = format!("'server be/s1' : unknown keyword 'wieght'; did you mean 'weight' maybe ?. Registered keywords : {kws}.");
    let cases: Vec<(&str, String)> = vec![
        (
            "server",
            "'server' expects <name> and <addr>[:<port>] as arguments.".into(),
        ),
        (
            "server s1",
            "'server' expects <name> and <addr>[:<port>] as arguments.".into(),
        ),
        ("server s1 1.2.3.4:80 foo", foo),
        ("server s1 1.2.3.4:80 wieght 2", wieght),
        (
            "server s1 1.2.3.4:80 weight 300",
            "'server be/s1' : weight of server s1 is not within 0 and 256 (300).".into(),
        ),
        (
            "server s1 1.2.3.4:80 weight",
            "'server be/s1' : 'weight' expects an integer argument.".into(),
        ),
        (
            "server s1 1.2.3.4:80 weight x",
            "'server be/s1' : 'weight' expects an integer argument (got 'x').".into(),
        ),
        (
            "server s1 1.2.3.4:80 inter x",
            "'server be/s1' : unexpected character 'x' in argument to 'inter'.".into(),
        ),
        (
            "server s1 1.2.3.4:80 inter 0",
            "'server be/s1' : invalid value 0 for argument 'inter' of server s1.".into(),
        ),
        (
            "server s1 1.2.3.4:80 rise 0",
            "'server be/s1' : 'rise' has to be > 0.".into(),
        ),
        (
            "server s1 1.2.3.4:80 fall 0",
            "'server be/s1' : 'fall' has to be > 0.".into(),
        ),
        (
            "server s1 1.2.3.4:80 id 0",
            "'server be/s1' : 'id' : custom id has to be > 0.".into(),
        ),
        (
            "server s1 1.2.3.4:80 port 0",
            "'server be/s1' : 'port' expects a valid port number (got '0').".into(),
        ),
        (
            "server s1 1.2.3.4:80 agent-port",
            "'server be/s1' : 'agent-port' expects a port number.".into(),
        ),
        (
            "server s1 1.2.3.4:80 addr nope",
            "'server be/s1' : 'addr' expects an IP address (got 'nope').".into(),
        ),
        (
            "server s1 1.2.3.4:80 on-marked-down foo",
            "'server be/s1' : 'on-marked-down' expects 'shutdown-sessions' but got 'foo'.".into(),
        ),
        (
            "server s1 1.2.3.4",
            "'server be/s1' : missing port specification in '1.2.3.4'".into(),
        ),
        (
            "server s1 1.2.3.4:80-81",
            "'server be/s1' : port ranges are not allowed here (got '1.2.3.4:80-81')".into(),
        ),
        (
            "server s1 1.2.3.4:+1",
            "'server be/s1' : port offsets are not supported by shunt (got '1.2.3.4:+1')".into(),
        ),
        (
            "server s/1 1.2.3.4:80",
            "character '/' is not permitted in server name 's/1'.".into(),
        ),
        (
            "default-server id 3",
            "'default-server' : 'id' is not allowed on 'default-server'.".into(),
        ),
        (
            "default-server bogus",
            format!("'default-server' : unknown keyword 'bogus'. Registered keywords : {kws}."),
        ),
    ];
    for (line, msg) in cases {
        assert_eq!(
            err1(&format!("{DEFAULTS}backend be\n {line}\n")),
            format!("parsing [t.cfg:7] : {msg}"),
            "line: {line}"
        );
    }
}

#[test]
fn duplicate_server_name_and_id() {
    assert_eq!(
        err1(&format!("{DEFAULTS}backend be\n server s1 1.2.3.4:80\n server s1 1.2.3.4:81\n")),
        "parsing [t.cfg:8] : backend 'be', another server named 's1' was already defined at line 7, please use distinct names."
    );
    assert_eq!(
        err1(&format!("{DEFAULTS}listen l\n bind :80\n server a 1.1.1.1:1\n server a 1.1.1.1:2\n")),
        "parsing [t.cfg:9] : proxy 'l', another server named 'a' was already defined at line 8, please use distinct names."
    );
    assert_eq!(
        err1(&format!("{DEFAULTS}backend be\n server s1 1.2.3.4:80 id 3\n server s2 1.2.3.4:80 id 3\n")),
        "parsing [t.cfg:8] : 'server be/s2' : 'id' : custom id 3 already used at t.cfg:7 ('server s1')."
    );
    // The same server name in two backends is fine.
    okd("backend a\n server s1 1.1.1.1:1\nbackend b\n server s1 1.1.1.1:1\n");
}

#[test]
fn timeouts_all() {
    let c = okd("backend be
  timeout connect 1s
  timeout server 2s
  timeout tunnel 1h
  timeout server-fin 3s
  timeout queue 4s
  timeout check 5s
frontend fe
  bind :80
  timeout client 6s
  timeout client-fin 7s
");
    let t = c.backends[0].timeouts;
    assert_eq!(t.connect, Some(Duration::from_secs(1)));
    assert_eq!(t.server, Some(Duration::from_secs(2)));
    assert_eq!(t.tunnel, Some(Duration::from_secs(3600)));
    assert_eq!(t.server_fin, Some(Duration::from_secs(3)));
    assert_eq!(t.queue, Some(Duration::from_secs(4)));
    assert_eq!(t.check, Some(Duration::from_secs(5)));
    let t = c.frontends[0].timeouts;
    assert_eq!(t.client, Some(Duration::from_secs(6)));
    assert_eq!(t.client_fin, Some(Duration::from_secs(7)));
}

#[test]
fn timeout_zero_means_unset() {
    let l = ok(&format!(
        "{DEFAULTS}frontend fe\n bind :80\n timeout client 0\n"
    ));
    assert_eq!(l.config.frontends[0].timeouts.client, None);
    assert_eq!(l.warnings.len(), 1);
    assert!(
        l.warnings[0].starts_with("config : missing timeouts for frontend 'fe'."),
        "{:?}",
        l.warnings
    );
}

#[test]
fn timeout_for_the_other_side_is_a_warning() {
    let l = ok(&format!(
        "{DEFAULTS}frontend fe\n bind :80\n timeout server 9s\nbackend be\n timeout client 9s\n"
    ));
    assert_eq!(
        l.warnings,
        [
            "parsing [t.cfg:8] : 'timeout server' ignored because frontend 'fe' has no backend capability.",
            "parsing [t.cfg:10] : 'timeout client' ignored because backend 'be' has no frontend capability.",
        ]
    );
    assert_eq!(
        l.config.frontends[0].timeouts.server,
        Some(Duration::from_secs(30))
    );
}

#[test]
fn timeout_errors() {
    let cases: &[(&str, &str)] = &[
        ("timeout", "'timeout' supports 'client', 'server', 'connect', 'check', 'queue', 'tunnel', 'client-fin' and 'server-fin' (got '')"),
        ("timeout foo 3s", "'timeout' supports 'client', 'server', 'connect', 'check', 'queue', 'tunnel', 'client-fin' and 'server-fin' (got 'foo')"),
        ("timeout connect", "'timeout connect' expects an integer value (in milliseconds)"),
        ("timeout client 1x", "unexpected character 'x' in 'timeout client'"),
        ("timeout client 30d", "timer overflow in argument '30d' (maximum value is 2147483647 ms or ~24.8 days) in 'timeout client'"),
        ("timeout client 1s 2s", "'timeout client' cannot handle unexpected argument '2s'."),
        ("timeout http-request 5s", "'timeout http-request' is not supported by shunt (TCP only)."),
    ];
    for (line, msg) in cases {
        assert_eq!(
            err1(&format!("{DEFAULTS} {line}\n")),
            format!("parsing [t.cfg:6] : {msg}"),
            "line: {line}"
        );
    }
}

#[test]
fn options_and_misc() {
    let c = okd("backend be
  option redispatch
  option splice-auto
  option splice-request
  option splice-response
  option tcplog
  log global
  retries 5
  fullconn 300
  server s 1.1.1.1:1
frontend fe
  bind :80
  maxconn 1000
  option dontlognull
  option splice-request
  log global
  use_backend be
  use_backend be
");
    let be = &c.backends[0];
    assert!(be.redispatch && be.log_global);
    assert_eq!(
        be.splice,
        SpliceOpts {
            auto: true,
            request: true,
            response: true
        }
    );
    assert_eq!((be.retries, be.maxconn), (5, 300));
    let fe = &c.frontends[0];
    assert_eq!(fe.maxconn, 1000);
    assert_eq!(
        fe.splice,
        SpliceOpts {
            auto: false,
            request: true,
            response: false
        }
    );
    assert!(fe.log_global);
    assert_eq!(
        fe.use_backends,
        [UseBackend::Static(0), UseBackend::Static(0)]
    );
    assert_eq!(fe.default_backend, None);
}

#[test]
fn balance_algorithms() {
    for (name, want) in [
        ("roundrobin", Balance::RoundRobin),
        ("static-rr", Balance::StaticRr),
        ("leastconn", Balance::LeastConn),
        ("first", Balance::First),
        ("source", Balance::Source),
        ("random", Balance::Random),
        ("hash src", Balance::Hash(HashKey::Src)),
        ("hash src_port", Balance::Hash(HashKey::SrcPort)),
        ("hash dst", Balance::Hash(HashKey::Dst)),
        ("hash dst_port", Balance::Hash(HashKey::DstPort)),
    ] {
        assert_eq!(
            okd(&format!("backend be\n balance {name}\n")).backends[0].balance,
            want
        );
    }
}

#[test]
fn proxy_keyword_errors() {
    let cases: &[(&str, &str)] = &[
        ("bakend x", "unknown keyword 'bakend' in 'backend' section; did you mean 'backend' maybe ?"),
        ("foo", "unknown keyword 'foo' in 'backend' section"),
        ("mode http", "'mode http' is not supported by shunt (TCP only)."),
        ("mode foo", "unknown proxy mode 'foo'."),
        ("mode", "'mode' expects 'tcp' as argument."),
        ("balance uri", "'balance' only supports 'roundrobin', 'static-rr', 'leastconn', 'first', 'source', 'random' and 'hash' (got 'uri')."),
        ("balance", "'balance' only supports 'roundrobin', 'static-rr', 'leastconn', 'first', 'source', 'random' and 'hash' (got '')."),
        ("balance hash", "balance hash requires a sample expression."),
        ("balance hash req.ssl_sni", "'balance hash' : shunt hashes only the samples 'src', 'src_port', 'dst' and 'dst_port' (got 'req.ssl_sni')."),
        ("balance hash src x", "'balance' cannot handle unexpected argument 'x'."),
        ("retries x", "'retries' expects an integer argument (got 'x')."),
        ("retries", "'retries' expects an integer argument."),
        ("retries 1000", "'retries' value must be between 0 and 100 (was 1000)"),
        ("fullconn -1", "'fullconn' expects an integer argument (got '-1')."),
        ("option", "'option' expects an option name."),
        ("option foo", "unknown option 'foo'."),
        ("option httpchk", "'option httpchk' is not supported by shunt (TCP only)."),
        ("option httplog x", "'option httplog' only supports optional argument 'clf' (got 'x')."),
        ("option redispatch x", "'option redispatch' cannot handle unexpected argument 'x'."),
        ("no foo", "'no' is only supported before 'option' and 'log'."),
        ("log", "log : expects <address> and <facility> or global as arguments"),
        ("log 127.0.0.1:514 nofac", "log : unknown facility 'nofac'"),
        ("log 127.0.0.1:514 len 10 local0", "'log len' value must be between 80 and 65535 (was 10)"),
        ("log 127.0.0.1 format json local0", "log : unknown log format 'json' (shunt supports rfc3164, rfc5424, short and raw)"),
        ("log 127.0.0.1 local0 info notice x", "'log' cannot handle unexpected argument 'x'."),
        ("log-format %zz", "'log-format' not allowed because backend 'be' has no frontend capability."),
        ("http-request deny", "'http-request' is not supported by shunt (TCP only)."),
        ("acl a bogus 1", "error detected while parsing ACL 'a' : unknown fetch method 'bogus' in ACL expression 'bogus'."),
        ("bind :80", "'bind' not allowed because backend 'be' has no frontend capability."),
        ("use_backend x", "'use_backend' not allowed because backend 'be' has no frontend capability."),
        ("default_backend x", "'default_backend' not allowed because backend 'be' has no frontend capability."),
        ("maxconn 10", "'maxconn' not allowed because backend 'be' has no frontend capability."),
    ];
    for (line, msg) in cases {
        assert_eq!(
            err1(&format!("{DEFAULTS}backend be\n {line}\n")),
            format!("parsing [t.cfg:7] : {msg}"),
            "line: {line}"
        );
    }
}

#[test]
fn frontend_only_errors() {
    let cases: &[(&str, &str)] = &[
        (
            "server s1 1.2.3.4:80",
            "'server' not allowed because frontend 'fe' has no backend capability.",
        ),
        (
            "default-server weight 2",
            "'default-server' not allowed because frontend 'fe' has no backend capability.",
        ),
        (
            "balance roundrobin",
            "'balance' not allowed because frontend 'fe' has no backend capability.",
        ),
        (
            "retries 3",
            "'retries' not allowed because frontend 'fe' has no backend capability.",
        ),
        (
            "fullconn 3",
            "'fullconn' not allowed because frontend 'fe' has no backend capability.",
        ),
        (
            "option redispatch",
            "'option redispatch' not allowed because frontend 'fe' has no backend capability.",
        ),
        ("use_backend", "'use_backend' expects a backend name."),
        (
            "default_backend",
            "'default_backend' expects a backend name.",
        ),
        (
            "use_backend be if x",
            "error detected while parsing switching rule : no such ACL : 'x'.",
        ),
        (
            "use_backend be unless { src 1.2.3.4",
            "error detected while parsing switching rule : missing closing '}' in condition.",
        ),
        (
            "use_backend be x",
            "unexpected keyword 'x' after switching rule, only 'if' and 'unless' are allowed.",
        ),
        (
            "default_backend be if x",
            "'default_backend' cannot handle unexpected argument 'if'.",
        ),
        (
            "maxconn x",
            "'maxconn' expects an integer argument (got 'x').",
        ),
    ];
    for (line, msg) in cases {
        assert_eq!(
            err1(&format!(
                "{DEFAULTS}backend be\nfrontend fe\n bind :80\n {line}\n"
            )),
            format!("parsing [t.cfg:9] : {msg}"),
            "line: {line}"
        );
    }
}

#[test]
fn defaults_only_errors() {
    let cases: &[(&str, &str)] = &[
        ("bind :80", "'bind' not allowed in 'defaults' section."),
        (
            "server s1 1.2.3.4:80",
            "'server' not allowed in 'defaults' section.",
        ),
        (
            "use_backend x",
            "'use_backend' not allowed in 'defaults' section.",
        ),
        // `mode http` in defaults is a warning: tests_compat.rs.
    ];
    for (line, msg) in cases {
        assert_eq!(
            err1(&format!("defaults\n {line}\n")),
            format!("parsing [t.cfg:2] : {msg}"),
            "line: {line}"
        );
    }
}

#[test]
fn no_option_and_no_log() {
    let c = okd("defaults
  option redispatch
  option splice-auto
  log global
backend a
backend b
  no option redispatch
  no option splice-auto
  no log
");
    assert!(c.backends[0].redispatch && c.backends[0].splice.auto && c.backends[0].log_global);
    assert!(!c.backends[1].redispatch && !c.backends[1].splice.auto && !c.backends[1].log_global);
}

#[test]
fn section_header_errors() {
    assert_eq!(
        err1("frontend\n"),
        "parsing [t.cfg:1] : 'frontend' expects an <id> argument"
    );
    assert_eq!(
        err1("backend\n"),
        "parsing [t.cfg:1] : 'backend' expects an <id> argument"
    );
    assert_eq!(
        err1("backend a/b\n"),
        "parsing [t.cfg:1] : character '/' is not permitted in 'backend' name 'a/b'."
    );
    assert_eq!(
        err1("backend \"a b\"\n"),
        "parsing [t.cfg:1] : character ' ' is not permitted in 'backend' name 'a b'."
    );
    assert_eq!(
        err1("backend be extra\n"),
        "parsing [t.cfg:1] : 'backend' cannot handle unexpected argument 'extra'."
    );
    assert_eq!(
        err1("backend be from nope\n"),
        "parsing [t.cfg:1] : defaults section 'nope' not found for backend 'be'."
    );
    assert_eq!(
        err1("backend be from\n"),
        "parsing [t.cfg:1] : 'from' expects a defaults section name."
    );
}

// ---------- defaults inheritance ----------

#[test]
fn defaults_are_inherited_and_reset() {
    let c = ok("defaults
  mode tcp
  timeout connect 1s
  timeout client 2s
  timeout server 3s
  retries 7
  balance source
  maxconn 500
  fullconn 99
  option redispatch
  option splice-auto
  log global
  default-server weight 4 check
frontend fe
  bind :80
  default_backend be
backend be
  server s 1.1.1.1:1
defaults
  timeout connect 9s
backend plain
")
    .config;
    let fe = &c.frontends[0];
    assert_eq!(fe.maxconn, 500);
    assert_eq!(fe.timeouts.client, Some(Duration::from_secs(2)));
    assert!(fe.splice.auto && fe.log_global);
    let be = &c.backends[0];
    assert_eq!(be.retries, 7);
    assert_eq!(be.balance, Balance::Source);
    assert_eq!(be.maxconn, 99);
    assert!(be.redispatch && be.splice.auto && be.log_global);
    assert_eq!(be.timeouts.connect, Some(Duration::from_secs(1)));
    assert_eq!(
        (be.servers[0].weight, be.servers[0].check.enabled),
        (4, true)
    );
    // A new defaults section starts from scratch.
    let plain = &c.backends[1];
    assert_eq!(plain.retries, 3);
    assert_eq!(plain.balance, Balance::RoundRobin);
    assert!(!plain.redispatch && !plain.log_global);
    assert_eq!(plain.timeouts.connect, Some(Duration::from_secs(9)));
    assert_eq!(plain.timeouts.server, None);
}

#[test]
fn named_defaults_and_from() {
    let c = ok("defaults slow
  timeout connect 10s
  timeout server 10s
  timeout client 10s
  retries 1
defaults fast from slow
  timeout connect 1s
defaults
  timeout connect 5s
  timeout server 5s
  timeout client 5s
backend a from slow
backend b from fast
backend c
")
    .config;
    let b = &c.backends;
    assert_eq!(
        (b[0].timeouts.connect, b[0].retries),
        (Some(Duration::from_secs(10)), 1)
    );
    assert_eq!(
        (b[1].timeouts.connect, b[1].timeouts.server, b[1].retries),
        (
            Some(Duration::from_secs(1)),
            Some(Duration::from_secs(10)),
            1
        )
    );
    assert_eq!(
        (b[2].timeouts.connect, b[2].retries),
        (Some(Duration::from_secs(5)), 3)
    );
}

#[test]
fn default_backend_from_defaults() {
    let c = okd("defaults\n timeout client 1s\n default_backend be\nfrontend fe\n bind :80\nbackend be\n timeout connect 1s\n timeout server 1s\n");
    assert_eq!(c.frontends[0].default_backend, Some(0));
}

// ---------- listen ----------

#[test]
fn listen_expands_to_frontend_and_backend() {
    let c = okd("frontend first
  bind :79
  default_backend l
listen l
  bind 127.0.0.1:80
  maxconn 10
  fullconn 20
  balance first
  server s1 1.1.1.1:1
backend last
");
    assert_eq!(c.frontends.len(), 2);
    assert_eq!(c.backends.len(), 2);
    let (fe, be) = (&c.frontends[1], &c.backends[0]);
    assert_eq!((fe.name.as_str(), be.name.as_str()), ("l", "l"));
    assert_eq!((fe.id, be.id), (2, 2), "a listen counts once");
    assert_eq!(c.backends[1].id, 3);
    assert_eq!(fe.default_backend, Some(0));
    assert_eq!(c.frontends[0].default_backend, Some(0));
    assert_eq!((fe.maxconn, be.maxconn), (10, 20));
    assert_eq!(be.balance, Balance::First);
    assert_eq!(be.servers[0].name, "s1");
}

#[test]
fn listen_with_explicit_default_backend() {
    let c = okd("listen l\n bind :80\n default_backend other\nbackend other\n");
    assert_eq!(c.frontends[0].default_backend, c.backend_by_name("other"));
}

// ---------- cross-checks ----------

#[test]
fn unknown_backends() {
    assert_eq!(
        err1(&format!(
            "{DEFAULTS}frontend fe\n bind :80\n default_backend nope\n"
        )),
        "parsing [t.cfg:8] : Proxy 'fe': unable to find required default_backend: 'nope'."
    );
    assert_eq!(
        err1(&format!(
            "{DEFAULTS}frontend fe\n bind :80\n use_backend nope\n"
        )),
        "parsing [t.cfg:8] : Proxy 'fe': unable to find required use_backend: 'nope'."
    );
    // A frontend is not a backend.
    assert_eq!(
        err1(&format!(
            "{DEFAULTS}frontend other\n bind :81\nfrontend fe\n bind :80\n default_backend other\n"
        )),
        "parsing [t.cfg:10] : Proxy 'fe': unable to find required default_backend: 'other'."
    );
}

#[test]
fn duplicate_proxies() {
    assert_eq!(
        err1(&format!("{DEFAULTS}backend be\nbackend be\n")),
        "Parsing [t.cfg:7]: backend 'be' has the same name as backend 'be' declared at t.cfg:6."
    );
    assert_eq!(
        err1(&format!(
            "{DEFAULTS}frontend fe\n bind :80\nfrontend fe\n bind :81\n"
        )),
        "Parsing [t.cfg:8]: frontend 'fe' has the same name as frontend 'fe' declared at t.cfg:6."
    );
    assert_eq!(
        err1(&format!(
            "{DEFAULTS}listen l\n bind :80\nfrontend l\n bind :81\n"
        )),
        "Parsing [t.cfg:8]: frontend 'l' has the same name as proxy 'l' declared at t.cfg:6."
    );
    assert_eq!(
        err1(&format!("{DEFAULTS}backend l\nlisten l\n bind :81\n")),
        "Parsing [t.cfg:7]: proxy 'l' has the same name as backend 'l' declared at t.cfg:6."
    );
    // A frontend and a backend may share a name.
    let c = okd("frontend web\n bind :80\n default_backend web\nbackend web\n");
    assert_eq!(c.frontends[0].default_backend, Some(0));
    // Duplicate defaults names are allowed; the last one wins for `from`.
    okd("defaults d\ndefaults d\n");
}

#[test]
fn duplicate_bind() {
    assert_eq!(
        err1(&format!("{DEFAULTS}frontend a\n bind 127.0.0.1:80\nfrontend b\n bind 127.0.0.1:81,127.0.0.1:80\n")),
        "parsing [t.cfg:9] : 'bind' : address 127.0.0.1:80 is already bound by frontend 'a' at t.cfg:7."
    );
    assert_eq!(
        err1(&format!("{DEFAULTS}frontend a\n bind :80\n bind 0.0.0.0:80\n")),
        "parsing [t.cfg:8] : 'bind' : address 0.0.0.0:80 is already bound by frontend 'a' at t.cfg:7."
    );
    // Different addresses on the same port are distinct listeners.
    okd("frontend a\n bind 127.0.0.1:80\nfrontend b\n bind 127.0.0.2:80\n bind [::1]:80\n");
}

#[test]
fn frontend_without_bind() {
    assert_eq!(
        err1(&format!("{DEFAULTS}frontend fe\n")),
        "parsing [t.cfg:6] : frontend 'fe' has no 'bind' directive. Please declare it as a backend if this was intended."
    );
    assert_eq!(
        err1(&format!("{DEFAULTS}listen l\n server s 1.1.1.1:1\n")),
        "parsing [t.cfg:6] : frontend 'l' has no 'bind' directive. Please declare it as a backend if this was intended."
    );
}

#[test]
fn backend_without_server_is_fine() {
    let c = okd("backend empty\n");
    assert!(c.backends[0].servers.is_empty());
}

#[test]
fn missing_timeouts_warnings() {
    let l = ok("frontend fe\n bind :80\nbackend be\n timeout connect 1s\nlisten l\n bind :81\n timeout client 1s\n timeout connect 1s\n timeout server 1s\n");
    let expect = |kind: &str, name: &str| {
        format!(
            "config : missing timeouts for {kind} '{name}'.\n   | While not properly invalid, you will certainly encounter various problems\n   | with such a configuration. To fix this, please ensure that all following\n   | timeouts are set to a non-zero value: 'client', 'connect', 'server'."
        )
    };
    assert_eq!(
        l.warnings,
        [expect("frontend", "fe"), expect("backend", "be")]
    );
    let l = ok("listen l\n bind :81\n timeout client 1s\n");
    assert_eq!(l.warnings, [expect("proxy", "l")]);
    assert!(ok(&format!("{DEFAULTS}frontend fe\n bind :80\n"))
        .warnings
        .is_empty());
}

#[test]
fn all_errors_are_collected() {
    let text = format!(
        "{DEFAULTS}frontend fe
  bakend x
  bind :8080
  server s1 1.2.3.4:80
  default_backend nope
backend be
  server s1 1.2.3.4:80 foo
  server s2
  mode http
qux
"
    );
    let e = errs(&text);
    let lines: Vec<String> = e
        .iter()
        .map(|s| s.split(" : ").next().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        lines,
        [
            "parsing [t.cfg:7]",
            "parsing [t.cfg:9]",
            "parsing [t.cfg:12]",
            "parsing [t.cfg:13]",
            "parsing [t.cfg:14]",
            "parsing [t.cfg:15]",
            "parsing [t.cfg:10]",
        ],
        "{e:#?}"
    );
}

#[test]
fn crlf_and_line_numbers() {
    let c = ok("defaults\r\n timeout client 1s\r\n\r\n# c\r\nfrontend fe\r\n bind :80\r\n").config;
    assert_eq!(c.frontends[0].line.line, 5);
    assert_eq!(c.frontends[0].binds, [sa("0.0.0.0:80")]);
}

// ---------- files ----------

#[test]
fn load_concatenates_files_in_order() {
    let dir = std::env::temp_dir().join(format!("shunt-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = dir.join("a.cfg");
    let b = dir.join("b.cfg");
    std::fs::write(&a, DEFAULTS).unwrap();
    // Each file starts out of section; defaults carry over.
    std::fs::write(
        &b,
        "frontend fe\n bind :80\n default_backend be\nbackend be\n server s 1.1.1.1:1\n",
    )
    .unwrap();
    let l = load(&[a.clone(), b.clone()]).unwrap();
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    assert_eq!(
        l.config.frontends[0].line,
        Location {
            file: b.display().to_string(),
            line: 1
        }
    );

    std::fs::write(&b, " bind :81\n").unwrap();
    let e = load(&[a.clone(), b.clone()]).unwrap_err();
    assert_eq!(
        e[0].to_string(),
        format!(
            "parsing [{}:1] : unknown keyword 'bind' out of section.",
            b.display()
        )
    );

    let missing = dir.join("missing.cfg");
    let e = load(std::slice::from_ref(&missing)).unwrap_err();
    assert_eq!(
        e[0].to_string(),
        format!(
            "Cannot open configuration file/directory {} : No such file or directory",
            missing.display()
        )
    );
    assert_eq!(load(&[]).unwrap_err(), [ConfigError::NoFile]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn shipped_examples_are_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "cfg") {
            let l = load(std::slice::from_ref(&path))
                .unwrap_or_else(|e| panic!("{}: {e:#?}", path.display()));
            assert!(
                l.warnings.is_empty(),
                "{}: {:?}",
                path.display(),
                l.warnings
            );
            seen.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    for must in ["basic.cfg", "demo.cfg", "full.cfg"] {
        assert!(
            seen.iter().any(|s| s == must),
            "{must} missing from {seen:?}"
        );
    }
}

#[test]
fn demo_example_shape() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/demo.cfg");
    let c = load(&[path]).unwrap().config;
    assert_eq!(c.global.nbthread, Some(2));
    let names: Vec<&str> = c.frontends.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["demo", "sink"]);
    let echo = &c.backends[c.frontends[0].default_backend.unwrap()];
    assert_eq!(echo.name, "echo");
    assert_eq!(echo.balance, Balance::RoundRobin);
    let addrs: Vec<SocketAddr> = echo.servers.iter().map(|s| s.addr).collect();
    assert_eq!(addrs, [sa("127.0.0.1:10081"), sa("127.0.0.1:10082")]);
    assert_eq!(c.frontends[1].binds, [sa("127.0.0.1:10090")]);
    let sink = &c.backends[c.frontends[1].default_backend.unwrap()];
    assert_eq!(sink.servers[0].addr, sa("127.0.0.1:10091"));
}

#[test]
fn full_example_details() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/full.cfg");
    let c = load(&[path]).unwrap().config;
    let app = &c.backends[c.backend_by_name("app").unwrap()];
    let ids: Vec<u32> = app.servers.iter().map(|s| s.id).collect();
    assert_eq!(ids, [10, 1, 2, 3, 4]);
    assert_eq!(
        app.servers[1].check.rise,
        Some(2),
        "default-server from defaults"
    );
    assert!(!app.splice.auto && app.splice.response);
    let archive = &c.backends[c.backend_by_name("archive").unwrap()];
    assert_eq!(archive.retries, 5);
    assert_eq!(archive.servers[0].addr, sa("[2001:db8::1]:9000"));
    assert_eq!(c.frontends[0].binds.len(), 7);
    assert_eq!(c.global.maxpipes, 10000);
}

/// A map file in a fresh temporary directory.
fn map_file(tag: &str, text: &str) -> String {
    let dir = std::env::temp_dir().join(format!("shunt-cfgmap-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("src.map");
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn use_backend_src_map_ip_loads_each_file_once_in_order() {
    let m1 = map_file("ok1", "# k v\n127.0.0.2 a\n10.0.0.0/8 b\n");
    let m2 = map_file("ok2", "::1 b\n");
    let c = okd(&format!(
        "frontend fe\n bind 127.0.0.1:8080\n use_backend %[src,map_ip({m1},b)]\n default_backend a\n\
         listen li\n bind 127.0.0.1:8081\n use_backend %[src,map_ip({m2})]\n server s 127.0.0.1:1\n\
         frontend fe2\n bind 127.0.0.1:8082\n use_backend %[src,map_ip({m1})]\n\
         backend a\nbackend b\n"
    ));
    assert_eq!(c.maps.len(), 2);
    assert_eq!(c.maps[0].path, m1);
    assert_eq!(c.maps[0].entries.len(), 2);
    assert_eq!(c.maps[0].used_at.line, 8);
    assert_eq!(c.maps[1].path, m2);
    let b = c.backend_by_name("b");
    assert_eq!(
        c.frontends[0].use_backends,
        [UseBackend::SrcMap {
            map: 0,
            default: Some("b".into()),
            default_target: b,
        }]
    );
    assert_eq!(
        c.frontends[1].use_backends,
        [UseBackend::SrcMap {
            map: 1,
            default: None,
            default_target: None,
        }]
    );
    // The same file is the same map.
    assert!(matches!(
        c.frontends[2].use_backends[..],
        [UseBackend::SrcMap { map: 0, .. }]
    ));
}

#[test]
fn use_backend_map_errors_name_file_and_line() {
    let e = err1(&format!(
        "{DEFAULTS}frontend fe\n bind :8080\n use_backend %[src,map_ip(/nonexistent/x.map)]\n"
    ));
    assert_eq!(
        e,
        "parsing [t.cfg:8] : error detected in frontend 'fe' while parsing 'use_backend' rule : map_ip: failed to open pattern file </nonexistent/x.map>."
    );
    let m = map_file("bad", "10.0.0.1 a\n\nk v\n");
    let e = err1(&format!(
        "{DEFAULTS}frontend fe\n bind :8080\n use_backend %[src,map_ip({m},a)]\nbackend a\n"
    ));
    assert_eq!(
        e,
        format!("parsing [t.cfg:8] : error detected in frontend 'fe' while parsing 'use_backend' rule : map_ip: 'k' is not a valid IPv4 or IPv6 address at line 3 of file '{m}'.")
    );
    let e = err1(&format!(
        "{DEFAULTS}frontend fe\n bind :8080\n use_backend %[req.ssl_sni,map_reg(/x.map)]\n"
    ));
    assert_eq!(
        e,
        "parsing [t.cfg:8] : 'use_backend' : unsupported dynamic backend name '%[req.ssl_sni,map_reg(/x.map)]' (shunt supports only '%[src,map_ip(<file>[,<default>])]' and '%[req.ssl_sni[,lower|upper],map|map_str|map_dom|map_beg(<file>[,<default>])]')."
    );
    let e = err1(&format!(
        "{DEFAULTS}frontend fe\n bind :8080\n use_backend %[src,map_ip()]\n"
    ));
    assert_eq!(
        e,
        "parsing [t.cfg:8] : 'use_backend' : converter 'map_ip' : missing map file name."
    );
}

#[test]
fn use_backend_sni_maps_and_inspect_delay() {
    let m1 = map_file("sni1", "Example.COM a\nb.test b\n");
    let c = okd(&format!(
        "defaults\n mode tcp\n tcp-request inspect-delay 2s\n\
         frontend fe\n bind 127.0.0.1:8080\n tcp-request content accept if {{ req_ssl_hello_type 1 }}\n use_backend %[req.ssl_sni,map_dom({m1},b)]\n\
         frontend fe2\n bind 127.0.0.1:8081\n tcp-request inspect-delay 0\n use_backend %[req.ssl_sni,lower,map({m1})]\n\
         backend a\nbackend b\n"
    ));
    assert_eq!(c.maps.len(), 1, "one file, one map");
    assert_eq!(c.map_kind(0), super::mapfile::MapKind::Str);
    // String keys are kept lower-cased.
    assert_eq!(
        c.maps[0].entries[0].pattern,
        super::mapfile::MapKey::string("example.com")
    );
    assert_eq!(c.maps[0].entries[0].key, "Example.COM");
    assert_eq!(
        c.frontends[0].use_backends,
        [UseBackend::SniMap {
            map: 0,
            how: NameMatch::Dom,
            default: Some("b".into()),
            default_target: c.backend_by_name("b"),
        }]
    );
    assert!(matches!(
        c.frontends[1].use_backends[..],
        [UseBackend::SniMap {
            map: 0,
            how: NameMatch::Exact,
            default: None,
            ..
        }]
    ));
    // Inherited from defaults; `0` = do not wait.
    assert_eq!(
        c.frontends[0].timeouts.inspect_delay,
        Some(Duration::from_secs(2))
    );
    assert_eq!(c.frontends[1].timeouts.inspect_delay, None);
}

#[test]
fn tcp_request_errors() {
    let cases: &[(&str, &str)] = &[
        ("tcp-request inspect-delay", "'tcp-request inspect-delay' expects a positive delay in milliseconds."),
        ("tcp-request inspect-delay 5s x", "'tcp-request inspect-delay' cannot handle unexpected argument 'x'."),
        ("tcp-request content track-sc0 src table nope", "Proxy 'fe': unable to find table 'nope' referenced by track-sc0."),
        ("tcp-request content bogus", "'tcp-request content' expects 'accept', 'reject' or 'track-sc0'..'track-sc2' in frontend 'fe' (got 'bogus'; shunt supports no other action)."),
        ("tcp-request content reject when", "'tcp-request content reject' only accepts 'if' or 'unless', in frontend 'fe' (got 'when')"),
        ("tcp-request content reject if { req.payload(0) -m bin 41 }", "'tcp-request content reject' : error detected in frontend 'fe' while parsing 'if' condition : fetch method 'req.payload' : missing arguments (got 1/2), type 'integer' expected in ACL expression 'req.payload(0)'"),
        ("tcp-request content reject if { req.payload(0,1) -m bin 4 }", "'tcp-request content reject' : error detected in frontend 'fe' while parsing 'if' condition : an even number of hex digit is expected"),
        ("tcp-request connection bogus", "'tcp-request connection' expects 'accept', 'reject', 'expect-proxy' or 'track-sc0'..'track-sc2' in frontend 'fe' (got 'bogus'; shunt supports no other action)."),
        ("tcp-request connection reject x", "'tcp-request connection reject' only accepts 'if' or 'unless', in frontend 'fe' (got 'x')"),
        ("tcp-request connection accept if !x", "'tcp-request connection accept' : error detected in frontend 'fe' while parsing 'if' condition : no such ACL : 'x'"),
        ("tcp-request foo", "'tcp-request' expects 'inspect-delay', 'connection', 'session' or 'content', got 'foo'."),
        ("tcp-request", "'tcp-request' expects 'inspect-delay', 'connection', 'session' or 'content'."),
    ];
    for (line, msg) in cases {
        assert_eq!(
            err1(&format!(
                "{DEFAULTS}frontend fe\n bind :8080\n {line}\n default_backend b\nbackend b\n"
            )),
            format!("parsing [t.cfg:8] : {msg}"),
            "line: {line}"
        );
    }
    let e = err1(&format!(
        "{DEFAULTS}frontend fe\n bind :8080\n tcp-request inspect-delay x\n"
    ));
    assert!(
        e.starts_with("parsing [t.cfg:8] : ") && e.ends_with("in 'tcp-request inspect-delay'"),
        "{e}"
    );
    let e = err1(&format!(
        "{DEFAULTS}backend b\n tcp-request inspect-delay 1s\n tcp-request connection reject\n"
    ));
    assert_eq!(e, "parsing [t.cfg:8] : 'tcp-request connection' not allowed because backend 'b' has no frontend capability.");
    let e = err1("defaults\n mode tcp\n tcp-request content reject\n");
    assert_eq!(
        e,
        "parsing [t.cfg:3] : tcp-request content is not allowed in anonymous 'defaults' sections"
    );
}

#[test]
fn dynamic_backend_names_chain_case_converters_and_map_converters() {
    use super::parse::UseBackendDraft as D;
    let sni = |path: &str, default: Option<&str>, how| D::SniMap {
        path: path.into(),
        default: default.map(Into::into),
        how,
    };
    let ok = |s: &str| super::parse::parse_use_backend(s).unwrap();
    assert_eq!(
        ok("%[req.ssl_sni,lower,map_dom(/m,be_x)]"),
        sni("/m", Some("be_x"), NameMatch::Dom)
    );
    assert_eq!(
        ok("%[req_ssl_sni,upper,lower,map_str(/m)]"),
        sni("/m", None, NameMatch::Exact)
    );
    assert_eq!(
        ok("%[req.ssl_sni,map_beg(/m,d)]"),
        sni("/m", Some("d"), NameMatch::Beg)
    );
    assert_eq!(
        ok("%[src,map_ip(/ips)]"),
        D::SrcMap {
            path: "/ips".into(),
            default: None
        }
    );
    for bad in [
        "%[src,lower,map_ip(/m)]",
        "%[src,map(/m)]",
        "%[req.ssl_sni,map_ip(/m)]",
        "%[req.ssl_sni,lower]",
        "%[req.ssl_sni,base64,map(/m)]",
        "%[req.ssl_sni,map(/m,a,b)]",
        "%[req.ssl_sni,map(/m)",
        "%[req.ssl_sni,,map(/m)]",
    ] {
        let e = super::parse::parse_use_backend(bad).unwrap_err();
        assert!(e.contains("unsupported dynamic backend name"), "{bad}: {e}");
    }
}

#[test]
fn a_map_file_holds_one_kind_of_key() {
    let m = map_file("mixed", "10.0.0.1 a\n");
    let e = err1(&format!(
        "{DEFAULTS}frontend fe\n bind :8080\n use_backend %[src,map_ip({m})]\n\
         frontend fe2\n bind :8081\n use_backend %[req.ssl_sni,map_dom({m})]\nbackend a\n"
    ));
    assert_eq!(
        e,
        format!("parsing [t.cfg:11] : error detected in frontend 'fe2' while parsing 'use_backend' rule : map_dom: map file '{m}' is already used with ip keys at [t.cfg:8] (a map file holds one kind of key).")
    );
    let e = err1(&format!(
        "{DEFAULTS}frontend fe\n bind :8080\n use_backend %[req.ssl_sni,map()]\n"
    ));
    assert_eq!(
        e,
        "parsing [t.cfg:8] : 'use_backend' : converter 'map' : missing map file name."
    );
}

// ---------- health checks: new server keywords and tcp-check ----------

#[test]
fn check_keywords_and_agent_options() {
    let c = okd("backend be
  server s1 10.0.0.1:80 check agent-check agent-addr 10.0.0.2 agent-port 9999 agent-send \"hello\\n\" slowstart 30s on-marked-up shutdown-backup-sessions observe layer4 error-limit 5 on-error mark-down check-send-proxy
");
    let c0 = &c.backends[0].servers[0].check;
    assert_eq!(c0.agent_addr.as_deref(), Some("10.0.0.2"));
    assert_eq!(c0.agent_send.as_deref(), Some("hello\n"));
    assert_eq!(c0.slowstart, Some(Duration::from_secs(30)));
    assert!(c0.on_marked_up_shutdown_backup && c0.observe_layer4 && c0.send_proxy);
    assert_eq!(
        (c0.error_limit, c0.on_error),
        (Some(5), Some(OnError::MarkDown))
    );
    assert_eq!(
        c0.tcp_check, None,
        "no option tcp-check: a plain connect check"
    );
    let cases = [
        ("observe layer9", "'observe' expects one of 'none', 'layer4', 'layer7' but got 'layer9'"),
        ("on-error boom", "'on-error' expects one of 'fastinter', 'fail-check', 'sudden-death' or 'mark-down' but got 'boom'"),
        ("on-marked-up x", "'on-marked-up' expects 'shutdown-backup-sessions' but got 'x'."),
        ("error-limit 0", "'error-limit' has to be > 0."),
        ("agent-addr", "'agent-addr' expects an address as argument."),
    ];
    for (kw, msg) in cases {
        assert_eq!(
            err1(&format!(
                "{DEFAULTS}backend be\n server s1 1.1.1.1:1 {kw}\n"
            )),
            format!("parsing [t.cfg:7] : 'server be/s1' : {msg}"),
            "{kw}"
        );
    }
}

#[test]
fn tcp_check_rules_parse_and_inherit() {
    let c = okd("backend be
  option tcp-check
  tcp-check comment ping
  tcp-check send PING\\r\\n
  tcp-check expect min-recv 5 ! string -ERR comment no-error
  tcp-check send-binary 0d0a
  tcp-check connect port 6380 addr 127.0.0.2
  tcp-check expect rstring ^\\+PONG
  tcp-check expect binary 2B
  tcp-check expect rbinary ^2B
  server s1 10.0.0.1:80 check
");
    let rules = c.backends[0].servers[0]
        .check
        .tcp_check
        .clone()
        .expect("rules");
    assert_eq!(rules.len(), 7);
    assert_eq!(rules[0].action, TcpCheckAction::Send(b"PING\r\n".to_vec()));
    assert_eq!(rules[0].comment.as_deref(), Some("ping"));
    let TcpCheckAction::Expect(e) = &rules[1].action else {
        panic!("expect")
    };
    assert_eq!(
        (e.kind, e.negate, e.min_recv, e.pattern.as_str()),
        (ExpectKind::String, true, Some(5), "-ERR")
    );
    assert_eq!(rules[1].comment.as_deref(), Some("no-error"));
    assert_eq!(rules[2].action, TcpCheckAction::Send(vec![13, 10]));
    assert_eq!(
        rules[3].action,
        TcpCheckAction::Connect {
            port: Some(6380),
            addr: Some("127.0.0.2".parse().unwrap()),
            ssl: false,
            sni: None,
        }
    );
    let TcpCheckAction::Expect(e) = &rules[5].action else {
        panic!("expect")
    };
    assert_eq!(
        (e.kind, e.bytes.as_slice()),
        (ExpectKind::Binary, &[0x2b][..])
    );

    // Rules in defaults go to backends with none of their own; own rules replace them.
    let c = ok("defaults
  mode tcp
  option tcp-check
  tcp-check send PING\\r\\n
  tcp-check expect string +PONG
backend inherits
  server s1 10.0.0.1:80 check
backend own
  tcp-check expect string hello
  server s1 10.0.0.1:80 check
backend off
  no option tcp-check
  server s1 10.0.0.1:80 check
")
    .config;
    let n = |b: usize| {
        c.backends[b].servers[0]
            .check
            .tcp_check
            .as_ref()
            .map(Vec::len)
    };
    assert_eq!((n(0), n(1), n(2)), (Some(2), Some(1), None));
}

#[test]
fn tcp_check_errors() {
    let cases = [
        ("tcp-check bogus", "'tcp-check' only supports 'comment', 'connect', 'send', 'send-binary' and 'expect' (got 'bogus')."),
        ("tcp-check expect", "'tcp-check expect' : expects a pattern type ('string', 'rstring', 'binary' or 'rbinary')."),
        ("tcp-check expect string", "'tcp-check expect' : 'string' expects <pattern> as an argument."),
        ("tcp-check expect foo bar", "'tcp-check expect' only supports 'min-recv', 'comment', '!', 'string', 'rstring', 'binary' and 'rbinary' but got 'foo' as argument."),
        ("tcp-check expect binary 0g", "'tcp-check expect' : invalid hexadecimal string '0g'."),
        ("tcp-check send-binary abc", "'tcp-check send-binary' : invalid hexadecimal string 'abc'."),
        ("tcp-check connect alpn h2", "'tcp-check connect' : 'alpn' is not supported by shunt."),
        ("tcp-check connect ssl sni", "'tcp-check connect' : 'sni' expects a string as argument."),
        ("tcp-check connect port 0", "'tcp-check connect port' expects a valid port number (got '0')."),
        ("tcp-check expect ok-status L7OK string x", "'tcp-check expect' : 'ok-status' is not supported by shunt."),
        ("tcp-check send-lf x", "'tcp-check send-lf' is not supported by shunt."),
    ];
    for (line, msg) in cases {
        assert_eq!(
            err1(&format!("{DEFAULTS}backend be\n {line}\n")),
            format!("parsing [t.cfg:7] : {msg}"),
            "{line}"
        );
    }
    let e = err1(&format!(
        "{DEFAULTS}backend be\n tcp-check expect rstring (\n"
    ));
    assert!(
        e.starts_with("parsing [t.cfg:7] : 'tcp-check expect' : regex '(' : "),
        "{e}"
    );
    assert_eq!(
        err1(&format!("{DEFAULTS}frontend fe\n bind :1\n tcp-check send x\n")),
        "parsing [t.cfg:8] : 'tcp-check' not allowed because frontend 'fe' has no backend capability."
    );
    assert_eq!(
        err1(&format!("{DEFAULTS}frontend fe\n bind :1\n option tcp-check\n")),
        "parsing [t.cfg:8] : 'option tcp-check' not allowed because frontend 'fe' has no backend capability."
    );
}

#[test]
fn server_state_file_keywords() {
    let c = ok(&format!(
        "global\n server-state-base /var/lib/shunt\n server-state-file st\n{DEFAULTS} load-server-state-from-file global\nbackend a\n server s1 127.0.0.1:80\nbackend b\n load-server-state-from-file none\n server s1 127.0.0.1:80\n"
    ))
    .config;
    let ss = &c.global.server_state;
    assert_eq!(
        ss.backends,
        vec!["a".to_string()],
        "inherited from defaults, 'none' wins"
    );
    assert_eq!(ss.path(), Some("/var/lib/shunt/st".into()));
    let abs = ok("global\n server-state-base /x\n server-state-file /abs/st\n").config;
    assert_eq!(abs.global.server_state.path(), Some("/abs/st".into()));
    assert!(err1("global\n server-state-file\n")
        .contains("'server-state-file' expect one argument: a file path."));
    assert!(err1("global\n server-state-file a\n server-state-file b\n")
        .contains("'server-state-file' already specified."));
    assert!(err1(&format!(
        "{DEFAULTS}backend b\n load-server-state-from-file maybe\n"
    ))
    .contains("'load-server-state-from-file' expects 'global', 'local' or 'none'. Got 'maybe'"));
    assert!(err1(&format!(
        "{DEFAULTS}backend b\n load-server-state-from-file local\n"
    ))
    .contains("not supported by shunt"));
    assert!(err1(&format!(
        "{DEFAULTS}frontend f\n bind :1\n load-server-state-from-file global\n"
    ))
    .contains("'load-server-state-from-file' not allowed"));
}

#[test]
fn traffic_logs_rings_and_prometheus() {
    let c = ok(r#"global
  log 127.0.0.1:5514 len 200 format rfc5424 local1 notice err
  log ring@r1 local0
  stats prometheus bind 127.0.0.1:9101
ring r1
  description "to rsyslog"
  format rfc3164
  maxlen 512
  size 32768
  timeout connect 2s
  timeout server 3s
  server syslog 127.0.0.1:6514 log-proto octet-count
defaults
  mode tcp
  timeout client 1s
  timeout connect 1s
  timeout server 1s
frontend tcplog
  bind 127.0.0.1:20001
  log global
  option tcplog
  option dontlognull
  default_backend be
frontend custom
  bind 127.0.0.1:20002
  log stderr format raw daemon
  log-format "%ci %b/%s %ts %fwd"
  default_backend be
frontend plain
  bind 127.0.0.1:20003
  log stdout local7
  default_backend be
frontend silent
  bind 127.0.0.1:20004
  default_backend be
backend be
  option tcplog
  server s 127.0.0.1:1
"#)
    .config;
    let g = &c.global;
    assert_eq!(g.prometheus, Some("127.0.0.1:9101".parse().unwrap()));
    assert_eq!(
        g.logs[0],
        LogTarget {
            dest: LogDest::Udp("127.0.0.1:5514".parse().unwrap()),
            maxlen: 200,
            format: SyslogFormat::Rfc5424,
            facility: 17,
            level: 5,
            minlevel: 3,
        }
    );
    assert_eq!(g.logs[1].dest, LogDest::Ring("r1".into()));
    assert_eq!(g.logs[1].level, 7);
    let r = &g.rings[0];
    assert_eq!((r.name.as_str(), r.maxlen, r.size), ("r1", 512, 32768));
    assert_eq!(r.format, SyslogFormat::Rfc3164);
    assert_eq!(r.timeout_connect, Duration::from_secs(2));
    assert_eq!(r.timeout_server, Duration::from_secs(3));
    assert_eq!(
        r.servers,
        [RingServer {
            name: "syslog".into(),
            addr: "127.0.0.1:6514".parse().unwrap(),
            proto: LogProto::OctetCount,
        }]
    );
    let tl = &g.traffic_logs;
    assert_eq!(tl.len(), 4);
    assert_eq!(tl[0].targets, g.logs);
    assert_eq!(tl[0].format, LogFormat::tcplog());
    assert!(tl[0].dontlognull && !tl[0].at_accept);
    assert_eq!(tl[1].targets[0].dest, LogDest::Stderr);
    assert_eq!(
        tl[1].format,
        LogFormat::parse("%ci %b/%s %ts %fwd").unwrap()
    );
    assert_eq!(tl[2].format, LogFormat::connect());
    assert!(tl[2].at_accept);
    assert_eq!(tl[2].targets[0].facility, 23);
    assert!(tl[3].targets.is_empty());
}

#[test]
fn log_and_ring_errors() {
    let cases: &[(&str, &str)] = &[
        ("global\n log ring@nope local0\n", "parsing [t.cfg:2] : global section: log: unknown ring 'nope'."),
        ("ring r\n server s 127.0.0.1\n", "parsing [t.cfg:2] : 'server s' : missing port specification in '127.0.0.1'"),
        ("ring r\n server s 127.0.0.1:1 log-proto x\n", "parsing [t.cfg:2] : 'log-proto' expects one of 'legacy' or 'octet-count' (got 'x')."),
        ("ring r\n size 10\n", "parsing [t.cfg:2] : 'size' value must be between 1024 and 67108864 (was 10)"),
        ("ring r\n bogus\n", "parsing [t.cfg:2] : unknown keyword 'bogus' in 'ring' section"),
        ("ring r\nring r\n", "parsing [t.cfg:2] : sink 'r' already exists (declared at t.cfg:1)."),
        ("global\n stats prometheus 1.2.3.4:5\n", "parsing [t.cfg:2] : 'stats prometheus' expects 'bind <addr>:<port>'."),
        ("global\n log tcp@1.2.3.4:514 local0\n", "parsing [t.cfg:2] : log : 'tcp@1.2.3.4:514' : TCP targets go through a 'ring' section in shunt (log ring@<name>)."),
    ];
    for (text, msg) in cases {
        assert_eq!(err1(text), *msg, "config: {text}");
    }
}

#[test]
fn pool_keywords_defaults_and_errors() {
    let c = okd("backend be\n default-server pool-low-conn 2\n \
         server a 127.0.0.1:1 pool-max-conn -1 pool-purge-delay 300ms\n \
         server b 127.0.0.1:2 pool-max-conn 8\n server c 127.0.0.1:3\n");
    let s = &c.backends[0].servers;
    assert_eq!(
        s[0].pool,
        PoolParams {
            max_conn: -1,
            low_conn: 2,
            purge_delay: Duration::from_millis(300)
        }
    );
    assert_eq!((s[1].pool.max_conn, s[1].pool.low_conn), (8, 2));
    assert_eq!(s[2].pool.max_conn, 0, "no pool by default");
    assert_eq!(s[2].pool.purge_delay, DEFAULT_POOL_PURGE_DELAY);
    assert!(c.global.idle_pool_shared);
    assert!(
        !ok("global\n tune.idle-pool.shared off\n")
            .config
            .global
            .idle_pool_shared
    );
    assert_eq!(
        err1("global\n tune.idle-pool.shared maybe\n"),
        "parsing [t.cfg:2] : 'tune.idle-pool.shared' expects either 'on' or 'off' but got 'maybe'."
    );
    assert!(err1(&format!(
        "{DEFAULTS}backend be\n server a 127.0.0.1:1 pool-max-conn -2\n"
    ))
    .contains("'pool-max-conn' expects an integer argument (got '-2')"),);
}

#[test]
fn acls_build_conditions_on_rules() {
    let c = okd(
        "frontend fe\n bind :8080\n acl lo src 127.0.0.0/8\n acl tls dst_port 443\n \
         tcp-request connection accept if lo\n tcp-request connection reject\n \
         use_backend a if tls !lo\n use_backend b unless { dst_port 80 }\n use_backend a\n \
         default_backend b\nbackend a\nbackend b\n",
    );
    let fe = &c.frontends[0];
    assert_eq!(
        fe.use_backends,
        vec![
            UseBackend::Static(0),
            UseBackend::Static(1),
            UseBackend::Static(0)
        ]
    );
    assert_eq!(fe.use_backend_conds.len(), 3);
    assert!(fe.use_backend_conds[2].is_none());
    let ctx = |src: &str, dst: &str| AclCtx {
        src: sa(src),
        dst: Some(sa(dst)),
        sni: None,
        req: crate::config::acl::Request::NONE,
        counts: &crate::config::acl::NoCounts,
        stick: None,
    };
    let first = fe.use_backend_conds[0].as_ref().unwrap();
    assert!(first.eval(&ctx("10.0.0.1:5", "127.0.0.1:443")));
    assert!(!first.eval(&ctx("127.0.0.1:5", "127.0.0.1:443")));
    let second = fe.use_backend_conds[1].as_ref().unwrap();
    assert!(second.unless);
    assert!(!second.eval(&ctx("10.0.0.1:5", "127.0.0.1:80")));
    assert_eq!(fe.tcp_connection.len(), 2);
    assert_eq!(fe.tcp_connection[0].action, TcpConnAction::Accept);
    assert_eq!(
        fe.tcp_connection[1],
        TcpConnRule {
            action: TcpConnAction::Reject,
            cond: None
        }
    );
}

#[test]
fn acls_are_refused_in_defaults_and_resolved_per_proxy() {
    assert_eq!(
        err1("defaults\n acl x src 1.1.1.1\n"),
        "parsing [t.cfg:2] : 'acl' not allowed in 'defaults' section."
    );
    assert_eq!(
        err1(&format!(
            "{DEFAULTS}defaults\n tcp-request connection reject\n"
        )),
        "parsing [t.cfg:7] : 'tcp-request connection' not allowed in 'defaults' section."
    );
    // An ACL belongs to its proxy, and must be declared before a rule names it.
    assert_eq!(
        err1(&format!(
            "{DEFAULTS}frontend a\n bind :1\n acl x src 1.1.1.1\nfrontend b\n bind :2\n use_backend c if x\nbackend c\n"
        )),
        "parsing [t.cfg:11] : error detected while parsing switching rule : no such ACL : 'x'."
    );
    assert_eq!(
        err1(&format!(
            "{DEFAULTS}frontend a\n bind :1\n use_backend c if x\n acl x src 1.1.1.1\nbackend c\n"
        )),
        "parsing [t.cfg:8] : error detected while parsing switching rule : no such ACL : 'x'."
    );
    // A listen section and a backend take `acl` too.
    okd("listen l\n bind :3\n acl ok src 127.0.0.1\n tcp-request connection reject unless ok\n server s 127.0.0.1:4\nbackend b\n acl x dst_port 1\n");
}

#[test]
fn conditional_use_backend_keeps_unknown_backend_check() {
    let e = errs(&format!(
        "{DEFAULTS}frontend fe\n bind :1\n use_backend nope if {{ always_true }}\n default_backend b\nbackend b\n"
    ));
    assert_eq!(
        e,
        vec![
            "parsing [t.cfg:8] : Proxy 'fe': unable to find required use_backend: 'nope'."
                .to_string()
        ]
    );
}

#[test]
fn sni_in_tcp_request_connection_warns_as_haproxy() {
    let l = ok(&format!(
        "{DEFAULTS}frontend fe\n bind :1\n acl s req.ssl_sni a\n tcp-request connection reject if s\n tcp-request connection reject if {{ req_ssl_sni b }}\n default_backend b\nbackend b\n"
    ));
    let w: Vec<&String> = l
        .warnings
        .iter()
        .filter(|w| w.contains("never match"))
        .collect();
    assert_eq!(w, [
        "parsing [t.cfg:9] : acl 's' will never match in 'tcp-request connection' because it only involves keywords that are incompatible with 'frontend tcp-request connection rule'",
        "parsing [t.cfg:10] : anonymous acl will never match in 'tcp-request connection' because it uses keyword 'req_ssl_sni' which is incompatible with 'frontend tcp-request connection rule'",
    ]);
}

#[test]
fn tcp_request_after_use_backend_warns_as_haproxy() {
    let l = ok(&format!(
        "{DEFAULTS}frontend fe\n bind :1\n use_backend b\n tcp-request connection accept\nbackend b\n"
    ));
    assert!(
        l.warnings.contains(&"parsing [t.cfg:9] : a 'tcp-request' rule placed after a 'use_backend' rule will still be processed before.".to_string()),
        "{:#?}",
        l.warnings
    );
}

#[test]
fn a_named_acl_gathers_lines_declared_after_the_rule() {
    let c = okd(
        "frontend fe\n bind :1\n acl lan src 10.0.0.0/8\n tcp-request connection reject unless lan\n \
         use_backend b if lan\n acl lan src 192.168.0.0/16\n default_backend b\nbackend b\n",
    );
    let fe = &c.frontends[0];
    let ctx = AclCtx {
        src: sa("192.168.1.1:5"),
        dst: None,
        sni: None,
        req: crate::config::acl::Request::NONE,
        counts: &crate::config::acl::NoCounts,
        stick: None,
    };
    assert!(fe.use_backend_conds[0].as_ref().unwrap().eval(&ctx));
    assert!(!fe.tcp_connection[0].cond.as_ref().unwrap().eval(&ctx));
}

// ---------- PROXY protocol ----------

#[test]
fn send_proxy_keywords_and_default_server() {
    let c = okd(
        "backend b\n default-server send-proxy\n server s1 127.0.0.1:1\n server s2 127.0.0.1:2 send-proxy-v2\n server s3 127.0.0.1:3 no-send-proxy\n server s4 127.0.0.1:4 send-proxy-v2 no-send-proxy-v2\n server s5 127.0.0.1:5 no-send-proxy check-send-proxy\n server s6 127.0.0.1:6 send-proxy-v2 port 99\n",
    );
    let v = |i: usize| c.backends[0].servers[i].send_proxy.version();
    // v2 wins over the inherited v1; clearing v2 leaves v1.
    assert_eq!(
        (0..5).map(v).collect::<Vec<_>>(),
        [
            Some(ProxyVersion::V1),
            Some(ProxyVersion::V2),
            None,
            Some(ProxyVersion::V1),
            None
        ]
    );
    let chk = |i: usize| c.backends[0].servers[i].check_proxy_header();
    // As HAProxy: checks inherit the server's header unless they have their
    // own port or addr; `check-send-proxy` alone sends v1.
    assert_eq!(chk(0), Some(ProxyVersion::V1));
    assert_eq!(chk(1), Some(ProxyVersion::V2));
    assert_eq!(chk(2), None);
    assert_eq!(chk(4), Some(ProxyVersion::V1));
    assert_eq!(chk(5), None);
}

#[test]
fn bind_options_accept_proxy_and_name() {
    let c = okd(
        "frontend fe\n bind 127.0.0.1:1,127.0.0.1:2 accept-proxy name pp\n bind 127.0.0.1:3\n default_backend b\nbackend b\n",
    );
    let o = &c.frontends[0].bind_opts;
    assert_eq!(o.len(), 3);
    assert!(o[0].accept_proxy && o[1].accept_proxy && !o[2].accept_proxy);
    assert_eq!((o[0].label(), o[2].label()), ("pp".into(), "3".into()));
    assert_eq!(o.iter().map(|b| b.id).collect::<Vec<_>>(), [1, 2, 3]);
    let e = err1(&format!(
        "{DEFAULTS}frontend fe\n bind :2\n bind :1 accept-proxy name\n"
    ));
    assert_eq!(
        e,
        "parsing [t.cfg:8] : 'bind :1' in section 'frontend' : 'name' : missing name"
    );
}

#[test]
fn tcp_request_connection_expect_proxy() {
    let c = okd(
        "frontend fe\n bind :1\n tcp-request connection reject if { src 10.0.0.0/8 }\n tcp-request connection expect-proxy layer4 if { src 127.0.0.1 }\n default_backend b\nbackend b\n",
    );
    let r = &c.frontends[0].tcp_connection;
    assert_eq!(r[1].action, TcpConnAction::ExpectProxy);
    assert!(r[1].cond.is_some());
    let cases: &[(&str, &str)] = &[
        ("tcp-request connection expect-proxy", "'tcp-request connection expect-proxy' only supports 'layer4' in frontend 'fe' (got '')"),
        ("tcp-request connection expect-proxy layer7", "'tcp-request connection expect-proxy' only supports 'layer4' in frontend 'fe' (got 'layer7')"),
        ("tcp-request connection expect-proxy layer4 foo", "'tcp-request connection expect-proxy' only accepts 'if' or 'unless', in frontend 'fe' (got 'foo')"),
        ("tcp-request content expect-proxy layer4", "'expect-proxy layer4' is not allowed in 'tcp-request content' rules in frontend 'fe'"),
    ];
    for (line, msg) in cases {
        assert_eq!(
            err1(&format!(
                "{DEFAULTS}frontend fe\n bind :8080\n {line}\n default_backend b\nbackend b\n"
            )),
            format!("parsing [t.cfg:8] : {msg}"),
            "line: {line}"
        );
    }
}

// ---------- content rules ----------

#[test]
fn content_rules_land_in_their_proxy_and_resolve_proxy_arguments() {
    let c = okd(
        "frontend fe\n bind :1\n tcp-request inspect-delay 2s\n acl down nbsrv(b) lt 1\n \
         tcp-request content reject if down\n tcp-request content accept if { fe_conn lt 5 }\n default_backend b\n\
         backend other\n server s 127.0.0.1:2\n\
         backend b\n tcp-request inspect-delay 1s\n tcp-request content reject if { be_conn gt 9 }\n server s 127.0.0.1:1\n\
         listen l\n bind :3\n tcp-request content accept if { nbsrv ge 1 }\n server s 127.0.0.1:3\n",
    );
    let fe = &c.frontends[0];
    assert_eq!(fe.timeouts.inspect_delay, Some(Duration::from_secs(2)));
    let actions: Vec<_> = fe.tcp_content.iter().map(|r| r.action.clone()).collect();
    assert_eq!(actions, [ContentAction::Reject, ContentAction::Accept]);
    let px = |r: &ContentRule| {
        r.cond
            .as_ref()
            .and_then(|c| c.suites[0][0].exprs[0].px.as_ref())
            .map(|p| p.idx)
    };
    let b = c.backend_by_name("b");
    assert_eq!(px(&fe.tcp_content[0]), b, "nbsrv(b)");
    assert_eq!(px(&fe.tcp_content[1]), Some(0), "fe_conn: this frontend");
    let be = &c.backends[b.unwrap_or_default()];
    assert_eq!(be.timeouts.inspect_delay, Some(Duration::from_secs(1)));
    assert_eq!(px(&be.tcp_content[0]), b, "be_conn: this backend");
    let l = &c.frontends[1];
    assert_eq!(
        px(&l.tcp_content[0]),
        c.backend_by_name("l"),
        "a listen's own half"
    );
    assert_eq!(l.own_backend, c.backend_by_name("l"));
    assert_eq!(fe.own_backend, None);
}

#[test]
fn proxy_arguments_that_name_nothing_are_haproxys_errors() {
    let e = errs(&format!(
        "{DEFAULTS}frontend fe\n bind :1\n acl x nbsrv(zz) gt 1\n \
         tcp-request content reject if x\n tcp-request content reject if {{ nbsrv lt 1 }}\n default_backend b\n\
         backend b\n tcp-request content reject if {{ fe_conn gt 1 }}\n server s 127.0.0.1:1\n"
    ));
    assert_eq!(
        e,
        [
            "parsing [t.cfg:8] : unable to find backend 'zz' referenced in arg 1 of ACL keyword 'nbsrv' in proxy 'fe'.",
            "parsing [t.cfg:10] : proxy 'fe', referenced in arg 1 of ACL keyword 'nbsrv' in proxy 'fe', has not backend capability.",
            "parsing [t.cfg:13] : proxy 'b', referenced in arg 1 of ACL keyword 'fe_conn' in proxy 'b', has not frontend capability.",
        ]
    );
}

#[test]
fn content_fetches_in_connection_rules_get_haproxys_warning() {
    let l = ok(&format!(
        "{DEFAULTS}frontend fe\n bind :1\n tcp-request connection reject if {{ req.len gt 3 }}\n default_backend b\nbackend b\n"
    ));
    assert!(
        l.warnings.iter().any(|w| w.contains(
            "anonymous acl will never match in 'tcp-request connection' because it uses keyword 'req.len'"
        )),
        "{:#?}",
        l.warnings
    );
}
