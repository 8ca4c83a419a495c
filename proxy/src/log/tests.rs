//! Unit tests of the log room: format compilation, line rendering, `%ts`.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use super::format::{term_state, Cause, FlowLog, LogFormat, Names, Phase};

fn rec() -> FlowLog {
    let client: SocketAddr = "10.0.1.2:33313".parse().unwrap();
    let mut r = FlowLog::new(0, client, Some("10.0.3.31:8012".parse().unwrap()));
    r.accept = SystemTime::UNIX_EPOCH + Duration::from_millis(1_234_567_890_443);
    r
}

fn names() -> Names<'static> {
    Names {
        frontend: "fnt",
        backend: Some("bck"),
        server: Some("srv1"),
        hostname: "host",
    }
}

#[test]
fn tcplog_line_has_haproxy_shape() {
    let mut r = rec();
    r.tw = 0;
    r.tc = 0;
    r.tt = 5007;
    r.bytes_down = 212;
    r.bytes_up = 9;
    r.retries = 3;
    r.cause = Cause::Normal;
    r.phase = Phase::Closed;
    let mut out = String::new();
    LogFormat::tcplog().render(&r, &names(), &mut out);
    // The date is local time: check everything around it exactly.
    let (head, tail) = out.split_once("] ").unwrap();
    assert!(head.starts_with("10.0.1.2:33313 ["), "{out}");
    let date = &head["10.0.1.2:33313 [".len()..];
    assert_eq!(date.len(), "13/Feb/2009:23:31:30.443".len(), "{date}");
    assert!(date.ends_with(":30.443"), "{date}");
    assert_eq!(tail, "fnt bck/srv1 0/0/5007 212 -- 0/0/0/0/3 0/0");
}

#[test]
fn no_server_and_redispatch_render_as_haproxy() {
    let mut r = rec();
    r.cause = Cause::ServerAbort;
    r.phase = Phase::Connect;
    r.retries = 1;
    r.redispatched = true;
    let n = Names {
        backend: None,
        server: None,
        ..names()
    };
    let f = LogFormat::parse("%b/%s %Tw/%Tc %ts %rc").unwrap();
    let mut out = String::new();
    f.render(&r, &n, &mut out);
    assert_eq!(out, "fnt/<NOSRV> -1/-1 SC +1");
}

#[test]
fn format_parse_literals_flags_and_errors() {
    let f = LogFormat::parse("100%% %{+Q}ci:%cp %fwd end").unwrap();
    let mut out = String::new();
    f.render(&rec(), &names(), &mut out);
    assert_eq!(out, "100% 10.0.1.2:33313 - end");
    assert!(LogFormat::parse("%zz").unwrap_err().contains("'zz'"));
    assert!(LogFormat::parse("%[src]").is_err());
    assert!(LogFormat::parse("%{+Q").is_err());
    let mut out = String::new();
    LogFormat::connect().render(&rec(), &names(), &mut out);
    assert_eq!(
        out,
        "Connect from 10.0.1.2:33313 to 10.0.3.31:8012 (fnt/TCP)"
    );
}

#[test]
fn termination_states() {
    assert_eq!(&term_state(Cause::Normal, Phase::Closed), b"--");
    assert_eq!(&term_state(Cause::Normal, Phase::Data), b"--");
    assert_eq!(&term_state(Cause::ClientAbort, Phase::Data), b"CD");
    assert_eq!(&term_state(Cause::ServerAbort, Phase::Data), b"SD");
    assert_eq!(&term_state(Cause::ServerAbort, Phase::Connect), b"SC");
    assert_eq!(&term_state(Cause::ServerTimeout, Phase::Connect), b"sC");
    assert_eq!(&term_state(Cause::ServerTimeout, Phase::Queue), b"sQ");
    assert_eq!(&term_state(Cause::ClientTimeout, Phase::Data), b"cD");
    assert_eq!(&term_state(Cause::Killed, Phase::Data), b"KD");
    assert_eq!(&term_state(Cause::Proxy, Phase::Request), b"PR");
}
