//! Unit tests of the stats page's configuration: the `stats` keywords, `mode
//! http` allowed only for the page, and the page's admin condition.

use std::net::SocketAddr;

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

const DEFAULTS: &str = "defaults\n timeout connect 5s\n timeout client 30s\n timeout server 30s\n";

fn ctx(src: &str) -> AclCtx<'static> {
    AclCtx {
        src: src.parse::<SocketAddr>().unwrap(),
        dst: None,
        sni: None,
        req: crate::config::acl::Request::NONE,
        counts: &crate::config::acl::NoCounts,
        stick: None,
    }
}

#[test]
fn a_stats_listen_becomes_a_page_and_neither_a_frontend_nor_a_backend() {
    let l = ok(&format!(
        "{DEFAULTS}backend be\n server s 127.0.0.1:2\n\
         listen stats\n mode http\n bind 127.0.0.1:8404\n stats enable\n stats uri /st\n \
         stats refresh 10s\n stats auth admin:secret\n stats auth ops:pw:with:colons\n \
         stats realm Shunt\\ stats\n acl local src 127.0.0.1\n stats admin if local\n \
         stats hide-version\n stats show-legends\n stats show-node edge1\n"
    ));
    assert!(l.warnings.is_empty(), "{:#?}", l.warnings);
    let c = &l.config;
    assert_eq!(c.frontends.len(), 0);
    assert_eq!(c.backends.len(), 1);
    let p = &c.stats_pages[0];
    assert_eq!(p.name, "stats");
    assert_eq!(p.id, 2, "counted like any proxy, as HAProxy");
    assert_eq!(p.binds, ["127.0.0.1:8404".parse::<SocketAddr>().unwrap()]);
    assert_eq!(p.uri, "/st");
    assert_eq!(p.refresh, Some(10));
    assert_eq!(p.realm, "Shunt stats");
    assert_eq!(
        p.users,
        [
            StatsUser {
                user: "admin".into(),
                pass: "secret".into()
            },
            StatsUser {
                user: "ops".into(),
                pass: "pw:with:colons".into()
            }
        ]
    );
    assert!(p.hide_version && p.show_legends);
    assert_eq!(p.show_node.as_deref(), Some("edge1"));
    assert_eq!(p.timeout_client, Some(std::time::Duration::from_secs(30)));
    let admin = p.admin.as_ref().expect("stats admin");
    assert!(admin.eval(&ctx("127.0.0.1:5000")));
    assert!(!admin.eval(&ctx("10.0.0.1:5000")));
}

#[test]
fn page_defaults_are_haproxys() {
    let l = ok(&format!(
        "{DEFAULTS}frontend st\n mode http\n bind 127.0.0.1:8404\n stats enable\n"
    ));
    let p = &l.config.stats_pages[0];
    assert_eq!(p.uri, "/haproxy?stats");
    assert_eq!(p.realm, "HAProxy Statistics");
    assert_eq!(p.refresh, None);
    assert!(p.users.is_empty() && p.admin.is_none() && p.show_node.is_none());
    assert!(!p.hide_version && !p.show_legends);
}

#[test]
fn refresh_reads_a_bare_number_as_seconds_and_zero_as_none() {
    let page = |r: &str| {
        ok(&format!(
            "{DEFAULTS}listen st\n mode http\n bind 127.0.0.1:8404\n stats refresh {r}\n"
        ))
        .config
        .stats_pages[0]
            .refresh
    };
    assert_eq!(page("5"), Some(5));
    assert_eq!(page("2m"), Some(120));
    assert_eq!(page("0"), None);
    let e = errs(&format!(
        "{DEFAULTS}listen st\n mode http\n bind 127.0.0.1:8404\n stats refresh 5x\n"
    ));
    assert!(
        e[0].starts_with("parsing [t.cfg:8] : 'stats refresh' : "),
        "{e:#?}"
    );
}

#[test]
fn admin_conditions_use_the_acl_engine() {
    let admin = |cond: &str| {
        ok(&format!(
            "{DEFAULTS}listen st\n mode http\n bind 127.0.0.1:8404\n stats admin {cond}\n"
        ))
        .config
        .stats_pages[0]
            .admin
            .clone()
            .unwrap()
    };
    let local = ctx("127.0.0.1:1");
    let far = ctx("192.0.2.7:1");
    assert!(admin("if TRUE").eval(&far));
    assert!(!admin("if FALSE").eval(&local));
    assert!(admin("if { always_true }").eval(&far));
    assert!(admin("if LOCALHOST").eval(&local) && !admin("if LOCALHOST").eval(&far));
    let block = admin("if { src 192.0.2.0/24 }");
    assert!(block.eval(&far) && !block.eval(&local));
    assert!(admin("unless { src 192.0.2.0/24 }").eval(&local));
}

#[test]
fn stats_errors_are_haproxys() {
    let line = |l: &str| {
        errs(&format!(
            "{DEFAULTS}listen st\n mode http\n bind 127.0.0.1:8404\n {l}\n"
        ))
    };
    assert_eq!(
        line("stats admin TRUE"),
        ["parsing [t.cfg:8] : 'stats admin' requires either 'if' or 'unless' followed by a condition."]
    );
    assert_eq!(
        line("stats bogus"),
        ["parsing [t.cfg:8] : unknown stats parameter 'bogus', expects 'admin', 'uri', 'realm', 'auth', 'scope', 'enable', 'hide-version', 'show-node', 'show-desc' or 'show-legends'."]
    );
    assert_eq!(
        line("stats realm"),
        ["parsing [t.cfg:8] : 'realm' needs an realm name."]
    );
    assert_eq!(
        line("stats admin if nosuch"),
        ["parsing [t.cfg:8] : error detected while parsing a 'stats admin' rule : no such ACL : 'nosuch'."]
    );
}

#[test]
fn mode_http_is_only_for_the_stats_page() {
    // A frontend in `mode http` without a stats line: refused at the mode line.
    let e = errs(&format!(
        "{DEFAULTS}frontend web\n mode http\n bind 127.0.0.1:80\n default_backend be\nbackend be\n server s 127.0.0.1:2\n"
    ));
    assert_eq!(
        e,
        ["parsing [t.cfg:6] : 'mode http' is supported by shunt only for the stats page ('stats enable'), and frontend 'web' has no 'stats' line: use 'mode tcp'."]
    );
    // A page that would forward: refused.
    let e = errs(&format!(
        "{DEFAULTS}listen st\n mode http\n bind 127.0.0.1:8404\n stats enable\n server s 127.0.0.1:2\n"
    ));
    assert_eq!(
        e,
        ["parsing [t.cfg:5] : proxy 'st' is a stats page ('mode http' with 'stats'): shunt does not forward HTTP, so 'server' is not allowed there."]
    );
    // A backend in `mode http` stays an error at its line.
    assert_eq!(
        errs("backend be\n mode http\n"),
        ["parsing [t.cfg:2] : 'mode http' is not supported by shunt (TCP only)."]
    );
    // `stats` in a backend is refused (a page listens).
    let e = errs(&format!("{DEFAULTS}backend be\n stats enable\n"));
    assert_eq!(
        e,
        ["parsing [t.cfg:6] : 'stats' not allowed because backend 'be' has no frontend capability."]
    );
}

#[test]
fn a_page_may_inherit_mode_http_from_defaults() {
    let l = ok(
        "defaults\n mode http\n timeout connect 5s\n timeout client 30s\n timeout server 30s\n\
         listen st\n bind 127.0.0.1:8404\n stats enable\n\
         listen tcp\n mode tcp\n bind 127.0.0.1:1\n server s 127.0.0.1:2\n",
    );
    assert_eq!(l.config.stats_pages.len(), 1);
    assert_eq!(l.config.frontends.len(), 1);
}

#[test]
fn stats_in_a_tcp_proxy_is_ignored_with_haproxys_warning() {
    let l = ok(&format!(
        "{DEFAULTS}listen st\n mode tcp\n bind 127.0.0.1:8404\n stats enable\n server s 127.0.0.1:2\n"
    ));
    assert_eq!(
        l.warnings,
        ["config : 'stats' statement ignored for proxy 'st' as it requires HTTP mode."]
    );
    assert!(l.config.stats_pages.is_empty());
    assert_eq!(l.config.frontends.len(), 1);
}

#[test]
fn a_page_and_a_frontend_cannot_share_an_address() {
    let e = errs(&format!(
        "{DEFAULTS}listen st\n mode http\n bind 127.0.0.1:8404\n stats enable\n\
         listen tcp\n bind 127.0.0.1:8404\n server s 127.0.0.1:2\n"
    ));
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(e[0].contains("already bound by frontend 'st'"), "{e:#?}");
}
