//! Unit tests of the pure parts: statuses, the rise/fall state machine, the agent's
//! words, expect matching and the messages, in HAProxy's wording.

use std::sync::Arc;
use std::time::Duration;

use super::agent::{self, AgentAdmin, AgentHealth};
use super::health::step;
use super::probe::{self, eval_expect, Eval};
use super::transition::{self, Cause};
use super::{Outcome, Status};
use crate::config::{ExpectKind, TcpCheckAction, TcpCheckRule, TcpExpect};
use crate::lb::status::status_word;
use crate::lb::{AdminState, Change, OpState, ServerRt};

fn server(cfg: &str) -> ServerRt {
    let text = format!("backend be\n server s1 127.0.0.1:80 {cfg}\n");
    let c = crate::config::parse_str("t.cfg", &text)
        .expect("config")
        .config;
    ServerRt::new(0, &c.backends[0].servers[0])
}

#[test]
fn rise_fall_follow_haproxy() {
    let (rise, fall) = (2, 3);
    // Start: health = rise, up; one failure takes it down.
    let s = step(rise, true, false, rise, fall);
    assert_eq!(
        (s.health, s.transition, s.counted_failure),
        (0, Some(false), true)
    );
    // Down at 0: failures are not counted again.
    let s = step(0, false, false, rise, fall);
    assert_eq!(
        (s.health, s.transition, s.counted_failure),
        (0, None, false)
    );
    // Down: rise passes bring it up, at full health.
    let s = step(0, false, true, rise, fall);
    assert_eq!((s.health, s.transition), (1, None));
    let s = step(1, false, true, rise, fall);
    assert_eq!((s.health, s.transition), (4, Some(true)));
    // Fully up: fall failures to go down.
    let mut h = 4;
    let mut downs = 0;
    for i in 0..fall {
        let s = step(h, true, false, rise, fall);
        h = s.health;
        if s.transition == Some(false) {
            downs += 1;
            assert_eq!(i, fall - 1, "down only at the fall-th failure");
        }
    }
    assert_eq!((h, downs), (0, 1));
    // A pass in between restores full health.
    assert_eq!(step(3, true, true, rise, fall).health, 4);
    // rise 1: one pass is enough.
    assert_eq!(step(0, false, true, 1, 1).transition, Some(true));
}

#[test]
fn status_words_and_intervals() {
    let s = server("check rise 2 fall 3");
    assert_eq!(status_word(&s, false), "UP 1/3", "start-up health is rise");
    let check = |passed| s.apply(Change::Check { passed });
    assert_eq!(check(true), None, "a pass while up moves nothing");
    assert_eq!((s.health(), status_word(&s, false).as_str()), (4, "UP"));
    assert_eq!(check(false), None);
    assert_eq!(status_word(&s, false), "UP 2/3");
    assert_eq!(check(false), None);
    let down = check(false).expect("the fall-th failure is a transition");
    assert_eq!(
        (down.was.op, down.op_moved()),
        (OpState::Up, Some(OpState::Down))
    );
    assert_eq!((s.health(), s.chkfail()), (0, 3));
    assert_eq!(status_word(&s, false), "DOWN");
    assert_eq!(check(true), None);
    assert_eq!(status_word(&s, false), "DOWN 1/2");
    assert_eq!(s.chkdown(), 1);
    let force = |health, to| s.apply(Change::Force { health, to });
    assert_eq!(force(1, OpState::Down), None, "already down");
    assert!(force(4, OpState::Up).is_some());
    assert_eq!(status_word(&s, true), "DRAIN");
    let maint = s.apply(Change::Admin(AdminState::Maint)).expect("maint");
    assert!(maint.marked_down(), "a running server put in maintenance");
    assert_eq!(status_word(&s, false), "MAINT");
    assert_eq!(
        force(0, OpState::Down),
        None,
        "forced changes wait in maintenance"
    );
    assert!(s.is_up());
    let plain = server("");
    assert_eq!(status_word(&plain, false), "no check");
    let ag = server("agent-check agent-port 1");
    assert!(ag.apply(Change::AgentDrain(true)).is_some());
    assert_eq!(status_word(&ag, false), "DRAIN (agent)");
    assert!(!ag.usable(), "an agent drain takes no traffic");
    let agent_down = ag.apply(Change::AgentHealth { up: false }).expect("down");
    assert_eq!(agent_down.op_moved(), Some(OpState::Down));
    assert_eq!(status_word(&ag, false), "DOWN (agent)");
    assert_eq!(
        ag.apply(Change::ForceAgent { up: false }),
        None,
        "the agent's verdict alone moves nothing the selection reads"
    );
    // The agent's `down` holds the server down whatever the checks say.
    let held = server("check agent-check agent-port 1");
    held.apply(Change::AgentHealth { up: false });
    for _ in 0..5 {
        assert_eq!(held.apply(Change::Check { passed: true }), None);
    }
    assert!(!held.is_up());
}

#[test]
fn status_table_is_haproxys() {
    assert_eq!(Status::L4Con.info(), "L4CON");
    assert_eq!(Status::L4Con.desc(), "Layer4 connection problem");
    assert_eq!(Status::L4Con.code(), 8);
    assert_eq!(Status::L4Ok.code(), 6);
    assert_eq!(Status::L7Rsp.desc(), "Layer7 invalid response");
    assert_eq!(Status::L7Sts.desc(), "Layer7 wrong status");
    assert_eq!(Status::L7Ok.info(), "L7OK");
    assert_eq!(Status::Checked.passed(), None);
    assert_eq!(Status::L4Tout.passed(), Some(false));
    // The TLS checks' layer 6, as HAProxy 2.6's show stat and state file print it.
    let l6 = [Status::L6Ok, Status::L6Tout, Status::L6Rsp];
    assert_eq!(l6.map(Status::info), ["L6OK", "L6TOUT", "L6RSP"]);
    assert_eq!(
        l6.map(Status::desc),
        [
            "Layer6 check passed",
            "Layer6 timeout",
            "Layer6 invalid response"
        ]
    );
    assert_eq!(l6.map(Status::code), [9, 10, 11]);
    assert_eq!(
        l6.map(Status::passed),
        [Some(true), Some(false), Some(false)]
    );
    assert!(!Status::L6Ok.has_code());
}

#[test]
fn handshake_errors_read_as_haproxys() {
    let io = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    let name = rustls::CertificateError::NotValidForName;
    assert_eq!(
        probe::handshake_error(&io(rustls::Error::InvalidCertificate(name))),
        "Server presented an SSL certificate different from the expected one"
    );
    let issuer = rustls::CertificateError::UnknownIssuer;
    assert_eq!(
        probe::handshake_error(&io(rustls::Error::InvalidCertificate(issuer))),
        "SSL handshake failure"
    );
    let eof = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "tls handshake eof");
    assert_eq!(probe::handshake_error(&eof), "SSL handshake failure");
    let reset = std::io::Error::from_raw_os_error(libc::ECONNRESET);
    assert_eq!(probe::handshake_error(&reset), "SSL handshake failure");
}

#[test]
fn transition_messages_are_haproxys() {
    let s1 = Arc::new(server("check"));
    let s2 = Arc::new(server("check"));
    let servers = [s1.clone(), s2.clone()];
    s1.apply(Change::Force {
        health: 0,
        to: OpState::Down,
    });
    let out = Outcome::new(Status::L4Con, "Connection refused");
    assert_eq!(
        transition::transition_message("be", &s1, &servers, OpState::Down, &Cause::Check(&out, Duration::from_millis(0))),
        "Server be/s1 is DOWN, reason: Layer4 connection problem, info: \"Connection refused\", check duration: 0ms. 1 active and 0 backup servers left. 0 sessions active, 0 requeued, 0 remaining in queue."
    );
    s1.apply(Change::Force {
        health: 4,
        to: OpState::Up,
    });
    let out = Outcome {
        status: Status::L7Ok,
        code: Some(0),
        desc: "(tcp-check)".into(),
    };
    assert_eq!(
        transition::transition_message("be", &s1, &servers, OpState::Up, &Cause::Check(&out, Duration::from_millis(3))),
        "Server be/s1 is UP, reason: Layer7 check passed, code: 0, info: \"(tcp-check)\", check duration: 3ms. 2 active and 0 backup servers online. 0 sessions requeued, 0 total in queue."
    );
    let b = Arc::new(server("check backup"));
    b.apply(Change::Force {
        health: 0,
        to: OpState::Down,
    });
    let out = Outcome::new(Status::L4Tout, "");
    assert_eq!(
        transition::transition_message("be", &b, std::slice::from_ref(&b), OpState::Down, &Cause::Check(&out, Duration::from_millis(2000))),
        "Backup Server be/s1 is DOWN, reason: Layer4 timeout, check duration: 2000ms. 0 active and 0 backup servers left. 0 sessions active, 0 requeued, 0 remaining in queue."
    );
    assert_eq!(transition::ascii_encode("a\"b\nc"), "a\\x22b\\x0Ac");
}

#[test]
fn agent_words() {
    let r = agent::parse("UP, 75% maxconn:30 # all good");
    assert_eq!(r.health.as_ref().map(|h| h.0), Some(AgentHealth::Up));
    assert_eq!(r.weight.as_deref(), Some("75%"));
    assert_eq!(r.maxconn.as_deref(), Some("30"));
    assert_eq!(r.desc, "all good");
    let r = agent::parse("drain\tready maint");
    assert_eq!(r.admin, Some(AgentAdmin::Maint), "the last of a kind wins");
    let r = agent::parse("bogus down");
    assert_eq!(r.error.as_deref(), Some("bogus"));
    assert_eq!(r.health.as_ref().map(|h| h.0), Some(AgentHealth::Down));
    for w in ["stopped", "fail"] {
        assert!(agent::parse(w)
            .health
            .is_some_and(|h| h.0 != AgentHealth::Up));
    }
    assert_eq!(agent::percent_weight("75%", 8), Ok(6));
    assert_eq!(agent::percent_weight("300%", 100), Ok(256));
    assert!(agent::percent_weight("5%x", 8).is_err());

    let s = server("weight 20 agent-check agent-port 1");
    let set = agent::apply_settings(&s, &agent::parse("drain 50% maxconn:7"), false);
    assert_eq!(set.warning, None);
    assert_eq!(set.transitions.len(), 2, "the drain and the weight");
    assert!(s.is_agent_drain());
    assert_eq!((s.weight(), s.agent_maxconn(), s.maxconn()), (10, 7, 7));
    agent::apply_settings(&s, &agent::parse("maint"), false);
    assert!(s.is_maint());
    agent::apply_settings(&s, &agent::parse("ready"), false);
    assert!(!s.is_maint() && !s.is_agent_drain());
    let d = server("disabled agent-check agent-port 1");
    agent::apply_settings(&d, &agent::parse("ready"), true);
    assert!(
        d.is_maint(),
        "ready does not undo the configuration's disabled"
    );

    let o = agent::outcome(&agent::parse("down # disk full"), None);
    assert_eq!(
        (o.status, o.desc.as_str()),
        (Status::L7Sts, "via agent : down (disk full)")
    );
    let o = agent::outcome(&agent::parse("up what"), None);
    assert_eq!(
        (o.status, o.desc.as_str()),
        (Status::L7Ok, "via agent : up (what)")
    );
    let o = agent::outcome(&agent::parse("what"), None);
    assert_eq!(
        (o.status, o.desc.as_str()),
        (Status::Checked, "agent reports an error : what")
    );
    let o = agent::outcome(
        &agent::parse("50%"),
        Some("Trailing garbage in weight string"),
    );
    assert_eq!(o.desc, "agent warns : Trailing garbage in weight string");
}

fn expect(kind: ExpectKind, pattern: &str, negate: bool, min_recv: Option<usize>) -> probe::Expect {
    let bytes = match kind {
        ExpectKind::String => pattern.as_bytes().to_vec(),
        ExpectKind::Binary => (0..pattern.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&pattern[i..i + 2], 16).expect("hex"))
            .collect(),
        _ => Vec::new(),
    };
    let rule = TcpCheckRule {
        action: TcpCheckAction::Expect(TcpExpect {
            kind,
            negate,
            pattern: pattern.to_string(),
            bytes,
            min_recv,
        }),
        comment: None,
    };
    match probe::compile(&[rule]).remove(0).action {
        probe::Action::Expect(e) => *e,
        other => panic!("not an expect: {other:?}"),
    }
}

#[test]
fn expect_matching() {
    let e = expect(ExpectKind::String, "+PONG", false, None);
    assert_eq!(eval_expect(&e, b"", false), Eval::Wait);
    assert_eq!(eval_expect(&e, b"+PO", false), Eval::Wait, "more may come");
    assert_eq!(eval_expect(&e, b"+PONG\r\n", false), Eval::Pass);
    assert_eq!(
        eval_expect(&e, b"-ERR", true),
        Eval::Fail { matched: false }
    );
    let neg = expect(ExpectKind::String, "ERR", true, None);
    assert_eq!(
        eval_expect(&neg, b"-ERR x", false),
        Eval::Fail { matched: true }
    );
    assert_eq!(eval_expect(&neg, b"+OK", true), Eval::Pass);
    let min = expect(ExpectKind::String, "abc", false, Some(5));
    assert_eq!(
        eval_expect(&min, b"abc", false),
        Eval::Wait,
        "min-recv not reached"
    );
    assert_eq!(
        eval_expect(&min, b"xxxxx", false),
        Eval::Fail { matched: false },
        "conclusive"
    );
    let re = expect(ExpectKind::Rstring, "^role:(master|slave)", false, None);
    assert_eq!(eval_expect(&re, b"role:master\r\n", false), Eval::Pass);
    let bin = expect(ExpectKind::Binary, "0D0A", false, None);
    assert_eq!(eval_expect(&bin, b"x\r\n", false), Eval::Pass);
    let rbin = expect(ExpectKind::Rbinary, "^2B50", false, None);
    assert_eq!(eval_expect(&rbin, b"+PONG", false), Eval::Pass);
    assert_eq!(probe::hex_upper(b"+\x0a"), "2B0A");

    let spec = &expect(ExpectKind::String, "+PONG", false, None).spec;
    assert_eq!(
        probe::expect_error(spec, false, 2, Some("redis")),
        "TCPCHK did not match content '+PONG' at step 2 comment: redis"
    );
    let spec = &expect(ExpectKind::Rstring, "x", true, None).spec;
    assert_eq!(
        probe::expect_error(spec, true, 3, None),
        "TCPCHK matched unwanted content (regex) at step 3"
    );
}

#[test]
fn timeouts_follow_timeout_check() {
    let inter = Duration::from_secs(2);
    let t = probe::Timeouts::new(inter, Some(Duration::from_secs(5)), None);
    assert_eq!((t.connect, t.read), (inter, inter));
    let t = probe::Timeouts::new(
        inter,
        Some(Duration::from_secs(1)),
        Some(Duration::from_secs(3)),
    );
    assert_eq!(
        (t.connect, t.read),
        (Duration::from_secs(1), Duration::from_secs(3))
    );
    let t = probe::Timeouts::new(inter, None, Some(Duration::from_millis(300)));
    assert_eq!((t.connect, t.read), (inter, Duration::from_millis(300)));
}

#[test]
fn operator_transitions_are_logged_haproxys_way() {
    let s1 = Arc::new(server("check"));
    let servers = [s1.clone()];
    let force = |health, to| s1.apply(Change::Force { health, to });
    force(2, OpState::Down);
    assert_eq!(
        transition::transition_message("be", &s1, &servers, OpState::Down, &Cause::Reason("changed from CLI")),
        "Server be/s1 is DOWN, changed from CLI. 0 active and 0 backup servers left. 0 sessions active, 0 requeued, 0 remaining in queue."
    );
    force(2, OpState::Up);
    let stopping = force(2, OpState::Stopping).expect("up to stopping");
    assert_eq!(stopping.op_moved(), Some(OpState::Stopping));
    assert!(!s1.usable(), "a stopping server takes no new traffic");
    assert_eq!(
        status_word(&s1, false),
        "NOLB 1/3",
        "health 2 of 4: going down"
    );
    assert_eq!(force(4, OpState::Stopping), None, "already stopping");
    assert_eq!(status_word(&s1, false), "NOLB");
    assert_eq!(
        transition::transition_message("be", &s1, &servers, OpState::Stopping, &Cause::Reason("changed from CLI")),
        "Server be/s1 is stopping, changed from CLI. 0 active and 0 backup servers online. 0 sessions requeued, 0 total in queue."
    );
    // Any UP/DOWN transition ends `stopping`.
    force(4, OpState::Down);
    assert!(!s1.is_stopping());
    // `disable health`: no check shown, the configuration unchanged.
    force(4, OpState::Up);
    s1.set_check_enabled(false);
    assert!(!s1.checked() && s1.check_configured());
    assert_eq!(status_word(&s1, false), "no check");
}

#[test]
fn set_addr_bumps_the_generation() {
    let s = server("");
    let g = s.addr_gen();
    s.set_addr("127.0.0.1:81".parse().expect("addr"));
    assert_eq!(s.addr_gen(), g + 1);
}

#[test]
fn state_file_parsing_follows_haproxy() {
    use super::state_file::{parse, validate, FileError};
    let head = "1\n# be_id be_name srv_id srv_name ...\n";
    let line = "3 b 1 s1 10.0.0.1 2 1 7 10 5 6 3 4 6 0 0 0 - 8080 - 0 0 - - 0\n";
    let lines = parse(&format!("{head}{line}"), "f").expect("parse");
    let p = &lines[&("b".to_string(), "s1".to_string())];
    let v = validate(p).expect("valid");
    assert_eq!(v.addr, Some("10.0.0.1".parse().expect("ip")));
    assert_eq!((v.op_state, v.admin, v.uweight, v.iweight), (2, 1, 7, 10));
    assert_eq!(v.port, Some(8080));
    assert_eq!(v.check_port, None);
    // Version and corruption refuse the whole file.
    assert_eq!(
        parse(&format!("2\n{line}"), "f"),
        Err(FileError::Version { path: "f".into() })
    );
    assert_eq!(
        parse(&format!("{head}3 b 1 s1 10.0.0.1 2\n"), "f"),
        Err(FileError::Corrupted {
            path: "f".into(),
            line: 2
        })
    );
    assert_eq!(
        parse(&format!("{head}{}", line.trim_end()), "f"),
        Err(FileError::Corrupted {
            path: "f".into(),
            line: 2
        }),
        "a truncated last line"
    );
    // A bad value refuses the line, naming every bad field.
    let bad: Vec<String> = "10.0.0.1 9 64 300 10 5 6 3 4 6 0 0 0 - 8080 - 0 0 - - 0"
        .split(' ')
        .map(str::to_owned)
        .collect();
    assert_eq!(
        validate(&bad),
        Err(", invalid srv_op_state value '9', invalid srv_uweight value '300'".to_string()),
        "HMAINT (64) is masked out, as HAProxy recomputes it"
    );
}
