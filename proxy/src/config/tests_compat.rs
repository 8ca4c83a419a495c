//! Unit tests of what configurations written for HAProxy need (issue 15):
//! the TLS and HTTP keywords of a shared `global`/`defaults` accepted with
//! one warning wording, `mode http` in `defaults`, `option httplog`'s
//! fallback, `chroot`.

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

const TIMEOUTS: &str = " timeout connect 5s\n timeout client 30s\n timeout server 30s\n";

#[test]
fn tls_keywords_of_global_are_warnings_that_say_why() {
    let l = ok(
        "global\n ca-base /etc/ssl/certs\n crt-base /etc/ssl/private\n \
         ssl-default-bind-ciphers ECDHE-RSA-AES128-GCM-SHA256\n \
         ssl-default-bind-ciphersuites TLS_AES_128_GCM_SHA256\n \
         ssl-default-bind-options ssl-min-ver TLSv1.2 no-tls-tickets\n",
    );
    let kws = [
        "ssl-default-bind-ciphers",
        "ssl-default-bind-ciphersuites",
        "ssl-default-bind-options",
    ];
    let mut want: Vec<String> = kws
        .iter()
        .enumerate()
        .map(|(i, k)| {
            format!(
                "parsing [t.cfg:{}] : '{k}' ignored: shunt does not take OpenSSL settings (rustls picks its own).",
                i + 4
            )
        })
        .collect();
    // The bases are judged once every path is known: nothing used them.
    want.push(
        "parsing [t.cfg:3] : 'crt-base' ignored: no 'bind ... crt' path uses it.".to_string(),
    );
    want.push(
        "parsing [t.cfg:2] : 'ca-base' ignored: no 'server ... ca-file' path uses it.".to_string(),
    );
    assert_eq!(l.warnings, want);
}

#[test]
fn a_tls_keyword_without_its_argument_is_still_an_error() {
    let e = errs("global\n ca-base\n");
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(e[0].starts_with("parsing [t.cfg:2] : "), "{e:#?}");
}

#[test]
fn mode_http_in_defaults_is_overridden_by_mode_tcp() {
    let l = ok(&format!(
        "defaults\n mode http\n{TIMEOUTS}listen l\n mode tcp\n bind 127.0.0.1:1\n server s 127.0.0.1:2\n"
    ));
    assert_eq!(
        l.warnings,
        ["parsing [t.cfg:2] : 'mode http' ignored: shunt does not speak HTTP; a proxy that inherits it without 'mode tcp' is refused."]
    );
    assert_eq!(l.config.frontends.len(), 1);
}

#[test]
fn a_proxy_left_in_mode_http_is_refused_where_it_starts() {
    let e = errs(&format!(
        "defaults\n mode http\n{TIMEOUTS}frontend fe\n mode tcp\n bind 127.0.0.1:1\n default_backend be\nbackend be\n server s 127.0.0.1:2\n"
    ));
    assert_eq!(
        e,
        ["parsing [t.cfg:10] : backend 'be' inherits 'mode http' from the defaults section at [t.cfg:2], and shunt does not speak HTTP: add 'mode tcp'."]
    );
    // A second defaults section in TCP mode resets it for what follows.
    ok(&format!(
        "defaults\n mode http\ndefaults\n mode tcp\n{TIMEOUTS}backend be\n server s 127.0.0.1:2\n"
    ));
    // `mode http` in a proxy itself stays an error at its line.
    let e = errs("backend be\n mode http\n");
    assert_eq!(
        e,
        ["parsing [t.cfg:2] : 'mode http' is not supported by shunt (TCP only)."]
    );
}

#[test]
fn option_httplog_falls_back_to_tcplog_with_haproxys_warning() {
    let l = ok(&format!(
        "defaults\n mode tcp\n option httplog\n{TIMEOUTS}frontend fe\n bind 127.0.0.1:1\n default_backend be\n\
         backend be\n server s 127.0.0.1:2\nlisten l\n bind 127.0.0.1:3\n server s 127.0.0.1:4\n"
    ));
    assert_eq!(
        l.warnings,
        [
            "config : parsing [t.cfg:3] : 'option httplog' not usable with frontend 'fe' (needs 'mode http'). Falling back to 'option tcplog'.",
            "config : parsing [t.cfg:3] : 'option httplog' not usable with proxy 'l' (needs 'mode http'). Falling back to 'option tcplog'.",
        ],
        "backends log nothing, so they get no warning (as HAProxy)"
    );
    let tcplog = LogFormat::tcplog();
    for pl in &l.config.global.traffic_logs {
        assert_eq!(pl.format, tcplog);
        assert!(!pl.at_accept);
    }
    // `option tcplog` (or `no option httplog`) after it: no fallback to report.
    let l = ok(&format!(
        "defaults\n mode tcp\n option httplog clf\n{TIMEOUTS}listen l\n option tcplog\n bind 127.0.0.1:3\n server s 127.0.0.1:4\n"
    ));
    assert!(l.warnings.is_empty(), "{:#?}", l.warnings);
    let l = ok(&format!(
        "defaults\n mode tcp\n option httplog\n{TIMEOUTS}listen l\n no option httplog\n bind 127.0.0.1:3\n server s 127.0.0.1:4\n"
    ));
    assert!(l.warnings.is_empty(), "{:#?}", l.warnings);
    assert!(l.config.global.traffic_logs[0].at_accept);
    let e = errs("defaults\n option httplog common\n");
    assert_eq!(
        e,
        ["parsing [t.cfg:2] : 'option httplog' only supports optional argument 'clf' (got 'common')."]
    );
}

#[test]
fn http_options_and_error_pages_are_warnings_that_say_why() {
    let l = ok(&format!(
        "defaults\n mode tcp\n option forwardfor except 127.0.0.0/8\n option http-server-close\n no option httpclose\n\
         {TIMEOUTS}listen l\n bind 127.0.0.1:3\n errorfile 503 /etc/haproxy/errors/503.http\n server s 127.0.0.1:4\n"
    ));
    assert_eq!(
        l.warnings,
        [
            "parsing [t.cfg:3] : 'option forwardfor' ignored: shunt does not speak HTTP.",
            "parsing [t.cfg:4] : 'option http-server-close' ignored: shunt does not speak HTTP.",
            "parsing [t.cfg:5] : 'no option httpclose' ignored: shunt does not speak HTTP.",
            "parsing [t.cfg:11] : 'errorfile' ignored: shunt does not speak HTTP.",
        ]
    );
    // Options that would change what shunt does stay errors.
    let e = errs("backend be\n option httpchk GET /\n");
    assert_eq!(
        e,
        ["parsing [t.cfg:2] : 'option httpchk' is not supported by shunt (TCP only)."]
    );
    let e = errs("backend be\n option http-server-close now\n");
    assert_eq!(
        e,
        ["parsing [t.cfg:2] : 'option http-server-close' cannot handle unexpected argument 'now'."]
    );
}

#[test]
fn chroot_takes_one_directory_once() {
    let l = ok("global\n chroot /var/lib/haproxy\n");
    assert_eq!(
        l.config.global.chroot.as_deref(),
        Some(std::path::Path::new("/var/lib/haproxy"))
    );
    assert_eq!(
        errs("global\n chroot /a\n chroot /b\n"),
        ["parsing [t.cfg:3] : 'chroot' already specified. Continuing."]
    );
    assert_eq!(
        errs("global\n chroot /a /b\n"),
        ["parsing [t.cfg:2] : 'chroot' cannot handle unexpected argument '/b'."]
    );
}

fn sa(s: &str) -> std::net::SocketAddr {
    s.parse().expect("socket address")
}

#[test]
fn keepalive_backup_log_and_hash_options() {
    let c = ok(&format!(
        "defaults\n mode tcp\n option tcpka\n{TIMEOUTS}frontend fe\n bind 127.0.0.1:1\n default_backend be\n\
         backend be\n option allbackups\n option log-health-checks\n hash-type consistent\n balance source\n server s 127.0.0.1:2\n\
         listen l\n no option srvtcpka\n bind 127.0.0.1:3\n server s 127.0.0.1:4\n"
    ))
    .config;
    assert!(c.frontends[0].clitcpka);
    let be = &c.backends[0].opts;
    assert!(be.srvtcpka && be.allbackups && be.log_health_checks);
    assert_eq!(be.hash_type, HashType::Consistent);
    let l = &c.backends[1].opts;
    assert!(!l.srvtcpka, "no option srvtcpka");
    assert!(c.frontends[1].clitcpka, "tcpka from the defaults");
    assert!(!l.allbackups && !l.log_health_checks);
    assert_eq!(l.hash_type, HashType::MapBased);

    let c = ok(&format!(
        "defaults\n mode tcp\n option clitcpka\n{TIMEOUTS}listen l\n bind 127.0.0.1:3\n server s 127.0.0.1:4\n"
    ))
    .config;
    assert!(c.frontends[0].clitcpka && !c.backends[0].opts.srvtcpka);
}

#[test]
fn hash_type_functions_are_warnings_and_typos_errors() {
    let l = ok(&format!(
        "defaults\n mode tcp\n{TIMEOUTS}backend be\n hash-type consistent sdbm avalanche\n"
    ));
    assert_eq!(
        l.warnings,
        ["parsing [t.cfg:7] : 'sdbm avalanche' ignored: shunt does not choose the hash function of 'hash-type' (it uses its own)."]
    );
    assert_eq!(
        errs("backend be\n hash-type consistant\n"),
        ["parsing [t.cfg:2] : 'hash-type' expects 'map-based' or 'consistent' (got 'consistant')."]
    );
    assert_eq!(
        errs("backend be\n hash-type consistent md5\n"),
        ["parsing [t.cfg:2] : 'hash-type' : unknown hash function 'md5' (expects 'sdbm', 'djb2', 'wt6' or 'crc32')."]
    );
    assert_eq!(
        errs("frontend fe\n bind :1\n option srvtcpka\n"),
        ["parsing [t.cfg:3] : 'option srvtcpka' not allowed because frontend 'fe' has no backend capability."]
    );
}

#[test]
fn bind_options_parse_and_refuse_what_a_tcp_listener_cannot_do() {
    let c = ok(&format!(
        "defaults\n mode tcp\n{TIMEOUTS}frontend fe\n bind 127.0.0.1:1,127.0.0.1:2 name web backlog 64 maxconn 10 defer-accept tfo transparent interface lo\n \
         bind :::3 v6only\n bind :::4 v4v6\n default_backend be\nbackend be\n"
    ))
    .config;
    let fe = &c.frontends[0];
    assert_eq!(fe.binds.len(), 4);
    assert_eq!(fe.bind_opts.len(), 4);
    let web = BindOpts {
        name: Some("web".into()),
        backlog: Some(64),
        maxconn: Some(10),
        defer_accept: true,
        tfo: true,
        transparent: true,
        interface: Some("lo".into()),
        ..BindOpts::default()
    };
    // Each address is a listener of its own number (HAProxy's `luid`).
    assert_eq!(
        fe.bind_opts[0],
        BindOpts {
            id: 1,
            ..web.clone()
        }
    );
    assert_eq!(
        fe.bind_opts[1],
        BindOpts { id: 2, ..web },
        "one line's options apply to each address"
    );
    assert!(fe.bind_opts[2].v6only && !fe.bind_opts[2].v4v6);
    assert!(fe.bind_opts[3].v4v6);
    let one = |line: &str| {
        let e = errs(&format!("frontend fe\n bind {line}\n bind 127.0.0.1:9\n"));
        assert_eq!(e.len(), 1, "{line}: {e:#?}");
        e.into_iter().next().unwrap_or_default()
    };
    assert_eq!(
        one(":::1 v4v6 v6only"),
        "parsing [t.cfg:2] : 'bind :::1' : 'v4v6' and 'v6only' cannot be used together."
    );
    assert_eq!(
        one("127.0.0.1:1 backlog 0"),
        "parsing [t.cfg:2] : 'bind 127.0.0.1:1' in section 'frontend' : 'backlog' value must be between 1 and 4194304 (was 0)"
    );
    assert_eq!(
        one("127.0.0.1:1 interface averyveryverylongname"),
        "parsing [t.cfg:2] : 'bind 127.0.0.1:1' in section 'frontend' : 'interface' : invalid interface name 'averyveryverylongname'"
    );
    // The TLS options shunt does not implement stay unknown.
    for kw in ["npn", "ciphers"] {
        let e = one(&format!("127.0.0.1:1 {kw}"));
        assert!(
            e.starts_with(&format!("parsing [t.cfg:2] : 'bind 127.0.0.1:1' unknown keyword '{kw}'. Registered keywords : accept-proxy, alpn, backlog, crt, defer-accept,")),
            "{e}"
        );
    }
}

#[test]
fn source_applies_to_servers_without_their_own() {
    let c = ok(&format!(
        "defaults\n mode tcp\n source 127.0.0.2\n{TIMEOUTS}backend be\n server a 127.0.0.1:2\n server b 127.0.0.1:3 source 127.0.0.3:4000\n\
         backend other\n source [::1]\n default-server source 127.0.0.4\n server c 127.0.0.1:5\n"
    ))
    .config;
    let src = |b: usize, s: usize| c.backends[b].servers[s].source;
    assert_eq!(src(0, 0), Some(sa("127.0.0.2:0")));
    assert_eq!(src(0, 1), Some(sa("127.0.0.3:4000")));
    assert_eq!(
        src(1, 0),
        Some(sa("127.0.0.4:0")),
        "default-server wins over the section's"
    );
    let c = ok("backend be\n source ::1\n server a [::1]:2\n").config;
    assert_eq!(c.backends[0].servers[0].source, Some(sa("[::1]:0")));
    assert_eq!(
        errs("backend be\n source 127.0.0.1 usesrc clientip\n"),
        ["parsing [t.cfg:2] : 'source' : 'usesrc' is not supported by shunt (only 'source <addr>[:<port>]')."]
    );
    assert_eq!(
        errs("backend be\n source 127.0.0.1:1000-2000\n"),
        ["parsing [t.cfg:2] : 'source' : port ranges are not supported by shunt (got '127.0.0.1:1000-2000')."]
    );
    let e = errs("backend be\n server a 127.0.0.1:2 source nowhere\n");
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("parsing [t.cfg:2] : 'server be/a' : 'source' : "),
        "{e:#?}"
    );
}

#[test]
fn server_ssl_options_parse_inherit_and_check_verification() {
    let dir = std::env::temp_dir().join(format!("shunt-tls-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ca = dir.join("ca.pem");
    let c = rcgen::generate_simple_self_signed(vec!["ca.test".to_string()]).expect("cert");
    std::fs::write(&ca, c.cert.pem()).expect("write ca");
    let l = ok(&format!(
        "global\n ca-base {}\ndefaults\n{TIMEOUTS}backend be\n default-server ssl verify none\n \
         server a 127.0.0.1:1 sni str(A.Test)\n server b 127.0.0.1:2 no-ssl\n \
         server c 127.0.0.1:3 verify required ca-file ca.pem sni req.ssl_sni\n",
        dir.display()
    ));
    assert!(l.warnings.is_empty(), "{:#?}", l.warnings);
    let s = &l.config.backends[0].servers;
    let a = s[0].tls.as_ref().expect("a inherits ssl");
    assert!(!a.verify);
    assert_eq!(a.sni, Some(SniExpr::Str("a.test".into())));
    assert!(s[1].tls.is_none(), "no-ssl clears the default");
    let c = s[2].tls.as_ref().expect("c is ssl");
    assert!(c.verify && c.roots.len() == 1 && c.sni == Some(SniExpr::Client));
    // Verification without a CA file, and expressions shunt cannot evaluate.
    let e = errs(&format!(
        "defaults\n{TIMEOUTS}backend be\n server s 127.0.0.1:1 ssl\n"
    ));
    assert!(
        e[0].starts_with(
            "[t.cfg:6] : 'server be/s' : verify is enabled by default but no CA file specified."
        ),
        "{e:#?}"
    );
    let e = errs(&format!(
        "defaults\n{TIMEOUTS}backend be\n server s 127.0.0.1:1 ssl verify none sni hdr(host)\n"
    ));
    assert!(
        e[0].contains("'sni' : unsupported expression 'hdr(host)'"),
        "{e:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn checks_use_tls_by_haproxys_rule() {
    let l = ok(&format!(
        "defaults\n{TIMEOUTS}backend be\n default-server verify none check\n \
         server a 127.0.0.1:1 ssl\n server b 127.0.0.1:2 ssl port 9\n \
         server c 127.0.0.1:3 ssl addr 127.0.0.9\n server d 127.0.0.1:4 ssl no-check-ssl\n \
         server e 127.0.0.1:5 check-ssl\n \
         server f 127.0.0.1:6 ssl port 9 check-ssl check-sni Chk.Test\n \
         server g 127.0.0.1:7\n\
         backend be2\n default-server ssl verify none check-ssl check\n \
         server h 127.0.0.1:8 no-ssl\n server i 127.0.0.1:9 no-check-ssl\n"
    ));
    let all: Vec<&Server> = l.config.backends.iter().flat_map(|b| &b.servers).collect();
    let uses = |i: usize| all[i].check_ssl();
    // `ssl` carries the checks along unless they go to their own port or
    // addr; `check-ssl` forces TLS, `no-check-ssl` clear, from
    // `default-server` as well.
    assert_eq!(
        (0..all.len()).map(uses).collect::<Vec<_>>(),
        [true, false, false, false, true, true, false, true, false]
    );
    // The checks' TLS settings are the traffic's when the server has `ssl`
    // (one client configuration at run time), their own without it.
    let same = |i: usize| match (&all[i].tls, &all[i].check_tls) {
        (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
        _ => false,
    };
    assert!(same(0) && same(1) && same(3) && same(8));
    assert!(all[4].tls.is_none() && all[4].check_tls.as_ref().is_some_and(|t| !t.verify));
    assert!(
        all[7].tls.is_none() && all[7].check_tls.is_some(),
        "no-ssl, check-ssl kept"
    );
    assert!(all[6].check_tls.is_none());
    assert_eq!(all[5].check.sni.as_deref(), Some("chk.test"));
    assert_eq!(all[0].check.sni, None);
}

#[test]
fn check_tls_needs_verify_settings_as_traffic_tls_does() {
    let verify = "verify is enabled by default but no CA file specified.";
    for server in [
        "server s 127.0.0.1:1 check check-ssl",
        "option tcp-check\n tcp-check connect ssl\n server s 127.0.0.1:1 check",
    ] {
        let e = errs(&format!("defaults\n{TIMEOUTS}backend be\n {server}\n"));
        assert!(
            e.len() == 1 && e[0].contains("'server be/s' : ") && e[0].contains(verify),
            "{server}: {e:#?}"
        );
    }
    // `no-check-ssl` asks for nothing, so nothing is verified.
    ok(&format!(
        "defaults\n{TIMEOUTS}backend be\n server s 127.0.0.1:1 check check-ssl no-check-ssl\n"
    ));
    let l = ok(&format!(
        "defaults\n{TIMEOUTS}backend be\n option tcp-check\n tcp-check connect port 9 ssl\n \
         tcp-check connect\n server s 127.0.0.1:1 check verify none\n"
    ));
    let s = &l.config.backends[0].servers[0];
    assert!(s.tls.is_none() && s.check_tls.is_some() && !s.check_ssl());
    let rules = s.check.tcp_check.as_ref().expect("rules");
    assert!(matches!(
        rules[0].action,
        TcpCheckAction::Connect {
            port: Some(9),
            ssl: true,
            ..
        }
    ));
    assert!(matches!(
        rules[1].action,
        TcpCheckAction::Connect { ssl: false, .. }
    ));
    let l = ok(&format!(
        "defaults\n{TIMEOUTS}backend be\n option tcp-check\n tcp-check connect ssl sni Rule.Test\n \
         server s 127.0.0.1:1 check verify none check-sni chk.test\n"
    ));
    let rules = l.config.backends[0].servers[0].check.tcp_check.clone();
    let TcpCheckAction::Connect { ssl, sni, .. } = &rules.expect("rules")[0].action else {
        panic!("a connect rule")
    };
    assert!(*ssl && sni.as_deref() == Some("rule.test"));
    let e = errs(&format!(
        "defaults\n{TIMEOUTS}backend be\n server s 127.0.0.1:1 check check-sni\n"
    ));
    assert_eq!(
        e,
        ["parsing [t.cfg:6] : 'server be/s' : 'check-sni' : missing SNI."]
    );
}
