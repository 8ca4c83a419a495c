//! Unit tests of ACL parsing and evaluation: each fetch, match method and
//! the boolean logic of conditions.

use super::*;
use crate::config::model::Location;

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

fn ctx<'a>(src: &str, dst: &str, sni: Option<&'a str>) -> AclCtx<'a> {
    AclCtx {
        src: src.parse().unwrap(),
        dst: Some(dst.parse().unwrap()),
        sni,
        req: Request::NONE,
        counts: &NoCounts,
        stick: None,
    }
}

/// `expr` (FETCH [flags] PATTERNS) evaluated in `c`.
fn m(expr: &str, c: &AclCtx<'_>) -> bool {
    parse_expr(&words(expr), &Location::default())
        .unwrap()
        .eval(c)
}

fn acls(lines: &[&str]) -> Vec<NamedAcl> {
    let mut v = Vec::new();
    for l in lines {
        parse_acl(&words(l), &mut v, &Location::default()).unwrap();
    }
    v
}

fn cond(s: &str, acls: &[NamedAcl]) -> Cond {
    parse_cond(&words(s), acls, &Location::default()).unwrap()
}

#[test]
fn src_and_dst_match_v4_and_v6_networks() {
    let c = ctx("10.1.2.3:40000", "[2001:db8::5]:443", None);
    assert!(m("src 10.1.2.3", &c));
    assert!(m("src 192.168.0.0/16 10.0.0.0/8", &c));
    assert!(m("src 10.1.0.0/255.255.0.0", &c));
    assert!(!m("src 10.1.2.4 11.0.0.0/8", &c));
    assert!(!m("src ::/0", &c), "a v6 network never holds a v4 client");
    assert!(m("dst 2001:db8::/32", &c));
    assert!(m("dst 2001:db8::5", &c));
    assert!(!m("dst 2001:db9::/32 0.0.0.0/0", &c));
    // A v4-mapped client is judged as its v4 address.
    let mapped = ctx("[::ffff:127.0.0.2]:1", "127.0.0.1:80", None);
    assert!(m("src 127.0.0.0/8", &mapped));
}

#[test]
fn ports_match_numbers_ranges_and_operators() {
    let c = ctx("127.0.0.1:1500", "127.0.0.1:443", None);
    assert!(m("dst_port 80 443", &c));
    assert!(!m("dst_port 80", &c));
    assert!(m("src_port 1024:65535", &c));
    assert!(!m("src_port 1:1024", &c));
    assert!(m("src_port 1500:", &c));
    assert!(m("dst_port :443", &c));
    assert!(m("dst_port lt 444", &c));
    assert!(!m("dst_port lt 443", &c));
    assert!(m("dst_port le 443", &c));
    assert!(m("dst_port gt 442", &c));
    assert!(!m("dst_port gt 443", &c));
    assert!(m("dst_port ge 443", &c));
    assert!(m("dst_port eq 443", &c));
    assert!(m("dst_port eq 1 443", &c), "an operator binds one number");
}

#[test]
fn sni_matches_strings_with_every_method() {
    let c = ctx("127.0.0.1:1", "127.0.0.1:2", Some("www.Example.com"));
    assert!(m("req.ssl_sni www.Example.com", &c));
    assert!(!m("req.ssl_sni www.example.com", &c));
    assert!(m("req_ssl_sni -i WWW.EXAMPLE.COM", &c));
    assert!(m("req.ssl_sni -m beg www.", &c));
    assert!(m("req.ssl_sni -m end -i .example.COM", &c));
    assert!(!m("req.ssl_sni -m end .example.org", &c));
    assert!(m("req.ssl_sni -m sub Exam", &c));
    assert!(!m("req.ssl_sni -m sub exam", &c));
    assert!(m("req.ssl_sni -m sub -i exam", &c));
    assert!(m("req.ssl_sni -m reg ^www\\.[A-Za-z]+\\.com$", &c));
    assert!(m("req.ssl_sni -m found", &c));
    let none = ctx("127.0.0.1:1", "127.0.0.1:2", None);
    assert!(!m("req.ssl_sni -m found", &none));
    assert!(!m("req.ssl_sni -m sub w", &none));
}

#[test]
fn regex_honours_case_flag() {
    let c = ctx("127.0.0.1:1", "127.0.0.1:2", Some("API.example.com"));
    assert!(m("req.ssl_sni -i -m reg ^api\\.", &c));
    assert!(!m("req.ssl_sni -m reg ^api\\.", &c));
}

#[test]
fn booleans_and_found() {
    let c = ctx("127.0.0.1:1", "127.0.0.1:2", None);
    assert!(m("always_true", &c));
    assert!(!m("always_false", &c));
    assert!(m("src -m found", &c));
    let no_dst = AclCtx { dst: None, ..c };
    assert!(!m("dst -m found", &no_dst));
    assert!(!m("dst_port 2", &no_dst));
}

#[test]
fn double_dash_ends_flags_and_files_hold_patterns() {
    let c = ctx("127.0.0.1:1", "127.0.0.1:2", Some("-odd"));
    assert!(m("req.ssl_sni -- -odd", &c));
    let dir = std::env::temp_dir().join(format!("shunt-acl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("allow.lst");
    std::fs::write(&f, "# allowed clients\n10.0.0.0/8\n\n  127.0.0.1  \n").unwrap();
    let expr = format!("src -f {}", f.display());
    assert!(m(&expr, &c));
    assert!(m(&expr, &ctx("10.9.9.9:1", "127.0.0.1:2", None)));
    assert!(!m(&expr, &ctx("127.0.0.2:1", "127.0.0.1:2", None)));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn conditions_and_or_not_unless() {
    let a = acls(&[
        "acl lo src 127.0.0.0/8",
        "acl tls dst_port 443",
        "acl web dst_port 80",
        "acl web dst_port 8080",
    ]);
    let c = ctx("127.0.0.1:1", "127.0.0.1:8080", None);
    assert!(cond("if lo", &a).eval(&c));
    assert!(!cond("unless lo", &a).eval(&c));
    assert!(cond("if web", &a).eval(&c), "repeated names OR their lines");
    assert!(!cond("if lo tls", &a).eval(&c), "implicit AND");
    assert!(cond("if tls || lo", &a).eval(&c));
    assert!(cond("if tls or web lo", &a).eval(&c));
    assert!(cond("if ! tls", &a).eval(&c));
    assert!(!cond("if !{ src 127.0.0.1 }", &a).eval(&c));
    assert!(cond("if { dst_port 8080 } lo", &a).eval(&c));
    assert!(cond("unless { src 10.0.0.0/8 } || tls", &a).eval(&c));
    assert!(!cond("if", &a).eval(&c), "an empty condition never matches");
    assert!(cond(
        "if always_false_acl_free || { always_true }",
        &acls(&["acl always_false_acl_free always_false"])
    )
    .eval(&c));
}

#[test]
fn uses_sni_finds_payload_fetches() {
    let a = acls(&["acl s req_ssl_sni a"]);
    assert!(cond("if { src 1.1.1.1 } || s", &a).uses_sni());
    assert!(!cond("if { src 1.1.1.1 }", &a).uses_sni());
}

#[test]
fn errors_have_haproxy_wording() {
    let err = |l: &str| {
        let mut v = Vec::new();
        parse_acl(&words(l), &mut v, &Location::default()).unwrap_err()
    };
    assert_eq!(
        err("acl bad bogus_fetch 1"),
        "error detected while parsing ACL 'bad' : unknown fetch method 'bogus_fetch' in ACL expression 'bogus_fetch'."
    );
    assert_eq!(
        err("acl p dst_port lt x"),
        "error detected while parsing ACL 'p' : 'x' is neither a number nor a supported operator."
    );
    assert_eq!(
        err("acl p dst_port x"),
        "error detected while parsing ACL 'p' : 'x' is neither a number nor a supported operator."
    );
    assert_eq!(
        err("acl c dst_port 10:5"),
        "error detected while parsing ACL 'c' : '10:5' is not a valid number range."
    );
    assert_eq!(
        err("acl q src 1.2.3.300"),
        "error detected while parsing ACL 'q' : '1.2.3.300' is not a valid IPv4 or IPv6 address."
    );
    assert_eq!(
        err("acl r src -m foo 1.2.3.4"),
        "error detected while parsing ACL 'r' : unknown matching method 'foo' when parsing ACL expression."
    );
    assert_eq!(
        err("acl b src -x 1.1.1.1"),
        "error detected while parsing ACL 'b' : '-x' is not a valid ACL option. Please use '--' before any pattern beginning with a '-'."
    );
    assert_eq!(
        err("acl t src -f /nonexistent/shunt.lst"),
        "error detected while parsing ACL 't' : failed to open pattern file </nonexistent/shunt.lst>."
    );
    assert_eq!(
        err("acl h$ src 1.1.1.1"),
        "character '$' is not permitted in acl name 'h$'."
    );
    assert_eq!(
        err("acl g"),
        "error detected while parsing ACL 'g' : missing fetch method in ACL expression ''."
    );
    let a = acls(&["acl x src 1.1.1.1"]);
    assert_eq!(
        parse_cond(&words("if x nosuch"), &a, &Location::default()).unwrap_err(),
        "no such ACL : 'nosuch'"
    );
    assert_eq!(
        parse_cond(&words("if { src 1.2.3.4"), &a, &Location::default()).unwrap_err(),
        "missing closing '}' in condition"
    );
}

/// A request of `bytes`, with more to come when `more`.
fn req_ctx<'a>(bytes: &'a [u8], more: bool, counts: &'a dyn Counts) -> AclCtx<'a> {
    AclCtx {
        req: Request {
            bytes,
            more,
            ..Request::NONE
        },
        counts,
        ..ctx("10.0.0.1:4000", "127.0.0.1:443", None)
    }
}

fn test(expr: &str, c: &AclCtx<'_>) -> Verdict {
    parse_expr(&words(expr), &Location::default())
        .unwrap()
        .test(c)
}

#[test]
fn payload_fetches_wait_while_the_bytes_could_still_change_them() {
    let n = NoCounts;
    let short = req_ctx(b"AB", true, &n);
    // Too few bytes for the block: undecided while more may come, then a miss.
    assert_eq!(
        test("req.payload(0,3) -m bin 414243", &short),
        Verdict::Miss
    );
    assert_eq!(
        test("req.payload(0,3) -m bin 414243", &req_ctx(b"AB", false, &n)),
        Verdict::Fail
    );
    let full = req_ctx(b"ABCD", true, &n);
    assert_eq!(test("req.payload(0,3) -m bin 414243", &full), Verdict::Pass);
    // A complete block that does not match is final.
    assert_eq!(test("req.payload(1,2) -m bin 4142", &full), Verdict::Fail);
    assert_eq!(test("req.payload(1,2) -m str BC", &full), Verdict::Pass);
    assert_eq!(test("req.payload(0,0) -m sub CD", &full), Verdict::Pass);
    assert_eq!(
        test("req.payload(0,0) -m sub XY", &full),
        Verdict::Miss,
        "length 0 takes what is there, which may grow"
    );
    // `req.len`: a match is final even with more to come; a non-match waits.
    assert_eq!(test("req.len ge 4", &full), Verdict::Pass);
    assert_eq!(test("req.len gt 10", &full), Verdict::Miss);
    assert_eq!(
        test("req.len 10:20", &req_ctx(b"ABCD", false, &n)),
        Verdict::Fail
    );
    assert_eq!(test("req_len 2", &short), Verdict::Pass);
    // `req.payload_lv`: a 1-byte length (3) at 0, the block just after it.
    let lv = req_ctx(b"\x03abcZ", true, &n);
    assert_eq!(test("req.payload_lv(0,1) -m str abc", &lv), Verdict::Pass);
    assert_eq!(test("req.payload_lv(0,1,2) -m str bcZ", &lv), Verdict::Pass);
    assert_eq!(
        test(
            "req.payload_lv(0,1) -m str abc",
            &req_ctx(b"\x03ab", true, &n)
        ),
        Verdict::Miss
    );
}

#[test]
fn tls_fetches_and_dotted_versions() {
    let n = NoCounts;
    let mut c = req_ctx(b"", true, &n);
    c.req.hello_type = Probe::Found(1);
    c.req.ssl_ver = Probe::Found((3 << 16) | 3);
    assert_eq!(test("req.ssl_hello_type 1", &c), Verdict::Pass);
    assert_eq!(test("req_ssl_hello_type 2", &c), Verdict::Fail);
    assert_eq!(test("req.ssl_ver 3.3", &c), Verdict::Pass);
    assert_eq!(test("req.ssl_ver ge 3.1", &c), Verdict::Pass);
    assert_eq!(test("req_ssl_ver 3:3.1", &c), Verdict::Fail);
    assert_eq!(test("req.ssl_ver gt 3", &c), Verdict::Pass, "3 is 3.0");
    c.req.hello_type = Probe::Pending;
    assert_eq!(test("req.ssl_hello_type 1", &c), Verdict::Miss);
    c.req.more = false;
    assert_eq!(test("req.ssl_hello_type 1", &c), Verdict::Fail);
    c.req.hello_type = Probe::Absent;
    c.req.more = true;
    assert_eq!(
        test("req.ssl_hello_type 1", &c),
        Verdict::Fail,
        "not TLS: final at once"
    );
    // SNI: pending while the hello is incomplete.
    c.req.sni_pending = true;
    assert_eq!(test("req.ssl_sni -m found", &c), Verdict::Miss);
}

#[test]
fn conditions_combine_three_valued_results_as_haproxy() {
    let n = NoCounts;
    let c = req_ctx(b"AB", true, &n);
    let a = acls(&[
        "acl short req.len lt 3",
        "acl long req.len gt 10",
        "acl lo src 10.0.0.0/8",
    ]);
    assert_eq!(cond("if long", &a).applies(&c), None, "a miss waits");
    assert_eq!(
        cond("unless long", &a).applies(&c),
        None,
        "unless does not turn a miss"
    );
    assert_eq!(cond("if !long", &a).applies(&c), None);
    assert_eq!(
        cond("if long || lo", &a).applies(&c),
        Some(true),
        "a pass decides an OR"
    );
    assert_eq!(
        cond("if long !lo", &a).applies(&c),
        Some(false),
        "a fail decides an AND"
    );
    assert_eq!(cond("if short", &a).applies(&c), Some(true));
}

/// Fixed counts: backend 1 has 2 usable servers and 5 sessions, frontend 0
/// holds 7.
struct Fixed;

impl Counts for Fixed {
    fn usable_servers(&self, be: usize) -> usize {
        if be == 1 {
            2
        } else {
            0
        }
    }
    fn backend_conns(&self, be: usize) -> usize {
        if be == 1 {
            5
        } else {
            0
        }
    }
    fn frontend_conns(&self, _: usize) -> usize {
        7
    }
}

#[test]
fn proxy_state_fetches_read_the_proxy_their_argument_names() {
    let f = Fixed;
    let c = req_ctx(b"", false, &f);
    let mut e = parse_expr(&words("nbsrv(be1) ge 2"), &Location::default()).unwrap();
    assert_eq!(e.px.as_ref().and_then(|p| p.name.as_deref()), Some("be1"));
    assert!(!e.eval(&c), "index 0 until resolved");
    if let Some(p) = e.px.as_mut() {
        p.idx = 1;
    }
    assert!(e.eval(&c));
    let mut e = parse_expr(&words("be_conn gt 4"), &Location::default()).unwrap();
    assert_eq!(e.px.as_ref().map(|p| p.name.clone()), Some(None));
    if let Some(p) = e.px.as_mut() {
        p.idx = 1;
    }
    assert!(e.eval(&c));
    assert!(m("fe_conn 7", &c));
    assert_eq!(
        parse_expr(&words("req.len(1) 3"), &Location::default()).unwrap_err(),
        "fetch method 'req.len' : no argument supported, but got '1' in ACL expression 'req.len(1)'"
    );
}
