//! Unit tests of the stick-table configuration: what a table stores, how
//! rules and fetches name their table, the cross-proxy checks, and the
//! conditions that read counters through [`StickCtx`].

use std::net::IpAddr;

use super::*;

fn ok(text: &str) -> Loaded {
    match parse_str("t.cfg", text) {
        Ok(l) => l,
        Err(errs) => panic!(
            "unexpected errors: {:#?}",
            errs.iter().map(|e| e.to_string()).collect::<Vec<_>>()
        ),
    }
}

fn errs(text: &str) -> Vec<String> {
    match parse_str("t.cfg", text) {
        Ok(l) => panic!("expected errors, got {:#?}", l.config),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

const HEAD: &str =
    "defaults\n mode tcp\n timeout connect 5s\n timeout client 30s\n timeout server 30s\n";

#[test]
fn a_table_keeps_its_type_size_expiry_and_stores() {
    let l = ok(&format!(
        "{HEAD}backend b\n stick-table type string len 8 size 2k expire 1m nopurge store conn_rate(10s),gpc0\n server s 127.0.0.1:1\n"
    ));
    let t = &l.config.tables[0];
    assert_eq!(t.name, "b");
    assert_eq!(t.key, KeyType::String { len: 8 });
    assert_eq!(t.size, 2048);
    assert_eq!(t.expire, Some(std::time::Duration::from_secs(60)));
    assert!(t.nopurge);
    assert!(t.store.has(DataType::Gpc0));
    assert_eq!(t.store.period(DataType::ConnRate), 10_000);
    assert!(
        !t.store.has(DataType::ServerId),
        "no stick rule writes to it"
    );
    assert_eq!(
        t.store.types().map(DataType::name).collect::<Vec<_>>(),
        ["gpc0", "conn_rate"],
        "HAProxy's order, not the line's"
    );
}

#[test]
fn stick_rules_and_trackers_resolve_their_tables() {
    let l = ok(&format!(
        "{HEAD}frontend f\n bind 127.0.0.1:1\n tcp-request connection track-sc1 src table t\n \
         tcp-request connection reject if {{ src_conn_cur gt 3 }}\n default_backend b\n\
         stick-table type ip size 10 store conn_cur\n\
         backend t\n stick-table type ipv6 size 10\n\
         backend b\n stick match dst table t\n stick store-request src if {{ always_true }}\n \
         stick-table type ip size 1\n server s 127.0.0.1:1\n"
    ));
    let c = &l.config;
    let [f_t, t_t, b_t] = [0, 1, 2].map(|i| &c.tables[i].name);
    assert_eq!([f_t, t_t, b_t], ["f", "t", "b"]);
    let fe = &c.frontends[0];
    assert!(fe.tcp_connection[1]
        .cond
        .as_ref()
        .is_some_and(|c| c.uses_tables()));
    match &fe.tcp_connection[0].action {
        TcpConnAction::TrackSc(t) => {
            assert_eq!((t.sc, t.key, t.table.index), (1, KeyFetch::Src, 1));
        }
        a => panic!("not a track-sc: {a:?}"),
    }
    let cond = fe.tcp_connection[1].cond.as_ref().expect("cond");
    let e = &cond.suites[0][0].exprs[0];
    let r = e.table.as_ref().expect("src_* names a table");
    assert_eq!(
        (r.name.as_str(), r.index),
        ("f", 0),
        "the proxy's own table"
    );
    let be = &c.backends[1];
    assert_eq!(be.stick.len(), 2);
    assert_eq!(be.stick[0].table.index, 1);
    assert_eq!(be.stick[1].table.index, 2);
    for i in [1, 2] {
        assert!(c.tables[i].store.has(DataType::ServerId));
        assert!(c.tables[i].store.has(DataType::ServerKey));
    }
}

#[test]
fn a_missing_table_is_an_error_at_the_rule_that_names_it() {
    let e = errs(&format!(
        "{HEAD}frontend f\n bind 127.0.0.1:1\n tcp-request connection track-sc2 src table gone\n default_backend b\n\
         backend b\n stick on src\n server s 127.0.0.1:1\n"
    ));
    assert_eq!(
        e,
        [
            "parsing [t.cfg:11] : Proxy 'b': unable to find stick-table 'b'.",
            "parsing [t.cfg:8] : Proxy 'f': unable to find table 'gone' referenced by track-sc2.",
        ]
    );
}

#[test]
fn stick_keyword_errors() {
    let cases = [
        (
            " stick-table type ip size 1 store http_req_cnt",
            "stick-table: store option 'http_req_cnt' is not supported by shunt",
        ),
        (
            " stick-table type ip size 1 store conn_rate(0)",
            "stick-table: error when processing store option 'conn_rate'.",
        ),
        (
            " stick-table type ip size 1 peers p",
            "stick-table: 'peers' is not supported by shunt",
        ),
        (
            " stick-table type ip size 2g",
            "stick-table: 'size' 2147483648 is above shunt's limit",
        ),
        (
            " stick store-response src",
            "'stick store-response' is not supported by shunt",
        ),
        (
            " stick on src table",
            "Proxy 'b': unable to find stick-table ''.",
        ),
    ];
    for (line, want) in cases {
        let e = errs(&format!("{HEAD}backend b\n{line}\n server s 127.0.0.1:1\n"));
        assert_eq!(e.len(), 1, "{line}: {e:?}");
        assert!(
            e[0].starts_with("parsing [t.cfg:7] : ") && e[0].contains(want),
            "{line}: {e:?}"
        );
    }
}

/// Counters as a flow would offer them: sc0 tracks an entry with a fixed
/// conn_rate; any src_* lookup finds 7 connections.
struct Fixed;

impl StickCtx for Fixed {
    fn tracked(&self, sc: u8, what: StickFetch) -> Option<i64> {
        (sc == 0 && what == StickFetch::ConnRate).then_some(11)
    }
    fn lookup(&self, _: usize, _: IpAddr, what: StickFetch) -> Option<i64> {
        (what == StickFetch::ConnCnt).then_some(7)
    }
}

#[test]
fn conditions_read_counters_with_integer_operators() {
    let l = ok(&format!(
        "{HEAD}frontend f\n bind 127.0.0.1:1\n stick-table type ip size 1\n\
         tcp-request connection reject if {{ sc0_conn_rate gt 10 }}\n\
         tcp-request connection reject if {{ sc_conn_rate(0) le 10 }}\n\
         tcp-request connection reject if {{ sc1_conn_rate ge 0 }}\n\
         tcp-request connection reject if {{ src_conn_cnt(f) -m int 7 }}\n\
         tcp-request connection reject if {{ src_conn_cur lt 100 }}\n default_backend b\n\
         backend b\n server s 127.0.0.1:1\n"
    ));
    let fe = &l.config.frontends[0];
    let ctx = AclCtx {
        src: "127.0.0.1:5".parse().expect("addr"),
        dst: None,
        sni: None,
        req: crate::config::acl::Request::NONE,
        counts: &crate::config::acl::NoCounts,
        stick: Some(&Fixed),
    };
    let holds: Vec<bool> = fe
        .tcp_connection
        .iter()
        .map(|r| r.cond.as_ref().expect("cond").eval(&ctx))
        .collect();
    assert_eq!(
        holds,
        [true, false, false, true, false],
        "sc1 tracks nothing and conn_cur is not offered: those fetches fail"
    );
    let none = AclCtx { stick: None, ..ctx };
    assert!(!fe.tcp_connection[0]
        .cond
        .as_ref()
        .expect("cond")
        .eval(&none));
}

#[test]
fn stick_fetch_errors_are_haproxys() {
    let e = errs(&format!(
        "{HEAD}frontend f\n bind 127.0.0.1:1\n\
         tcp-request connection reject if {{ sc_conn_rate gt 1 }}\n\
         tcp-request connection reject if {{ sc3_conn_rate gt 1 }}\n\
         tcp-request connection reject if {{ src_conn_rate gt 1 }}\n default_backend b\n\
         backend b\n server s 127.0.0.1:1\n"
    ));
    assert_eq!(
        e,
        [
            "parsing [t.cfg:8] : 'tcp-request connection reject' : error detected in frontend 'f' while parsing 'if' condition : fetch method 'sc_conn_rate' : expected type 'integer' at position 1, but got nothing in ACL expression 'sc_conn_rate'",
            "parsing [t.cfg:9] : 'tcp-request connection reject' : error detected in frontend 'f' while parsing 'if' condition : unknown fetch method 'sc3_conn_rate' in ACL expression 'sc3_conn_rate'",
            "parsing [t.cfg:10]: unable to find table 'f' referenced in arg 1 of ACL keyword 'src_conn_rate' in proxy 'f'.",
        ]
    );
}
