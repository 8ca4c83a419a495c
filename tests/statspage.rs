//! The stats web page over plain HTTP (real sockets, the real binary): status
//! codes and `stats auth`, the `;csv` export against `show stat`, the `;json`
//! export, `;up` and `;norefresh`, and the admin form (`stats admin`): a POST puts
//! a server in maintenance as `show servers state` then says, and a client
//! without admin rights is refused.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use shunt_tests::http::{basic, get, post, server_state, with_stats_page};
use shunt_tests::*;

/// Columns that move with the clock between two reads.
const LIVE_COLUMNS: [&str; 3] = ["lastchg", "lastsess", "downtime"];

struct Fixture {
    shunt: Shunt,
    fe: SocketAddr,
    page: SocketAddr,
    _servers: (Server, Server),
}

fn start(page_lines: &[&str]) -> Fixture {
    let servers = (Server::echo(), Server::echo());
    let (port, pport) = (free_port(), free_port());
    let cfg = with_stats_page(
        &simple_config(port, &[servers.0.addr, servers.1.addr], ""),
        pport,
        page_lines,
    );
    let shunt = Shunt::start(&cfg, &["--forward-mode", "copy"]);
    Fixture {
        shunt,
        fe: SocketAddr::from(([127, 0, 0, 1], port)),
        page: SocketAddr::from(([127, 0, 0, 1], pport)),
        _servers: servers,
    }
}

fn flow(addr: SocketAddr, n: usize) {
    let mut c = connect(addr);
    c.write_all(&vec![5u8; n]).expect("write");
    c.shutdown(std::net::Shutdown::Write).expect("shutdown");
    assert_eq!(read_to_end(&mut c).expect("read").len(), n);
}

/// Rows of a CSV `show stat` answer keyed by (pxname, svname), live columns out.
fn rows(csv: &str) -> HashMap<(String, String), Vec<(String, String)>> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines
        .next()
        .and_then(|h| h.strip_prefix("# "))
        .unwrap_or_else(|| panic!("not show stat CSV: {csv:?}"))
        .split(',')
        .collect();
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            let key = (cells[0].to_string(), cells[1].to_string());
            let kept = header
                .iter()
                .zip(&cells)
                .filter(|(h, _)| !LIVE_COLUMNS.contains(h))
                .map(|(h, c)| (h.to_string(), c.to_string()))
                .collect();
            (key, kept)
        })
        .collect()
}

/// Every field of a `show stat json` answer but the live ones, as text.
fn stable(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .expect("rows")
        .iter()
        .flat_map(|r| r.as_array().expect("fields").iter())
        .filter(|f| {
            !LIVE_COLUMNS
                .iter()
                .any(|c| f["field"]["name"].as_str() == Some(c))
        })
        .map(|f| f.to_string())
        .collect()
}

#[test]
fn status_codes_auth_and_refresh_are_haproxys() {
    let f = start(&[
        "stats enable",
        "stats uri /st",
        "stats refresh 7s",
        "stats auth admin:secret",
        "stats auth ops:pw",
        "stats realm Shunt\\ page",
    ]);
    let ok = basic("admin:secret");

    let none = get(f.page, "/st", None);
    assert_eq!(none.status, 401, "{none:?}");
    assert_eq!(
        none.header("www-authenticate"),
        Some("Basic realm=\"Shunt page\"")
    );
    assert!(none.body.contains("401 Unauthorized"), "{}", none.body);
    let wrong = get(f.page, "/st", Some(&basic("admin:nope")));
    assert_eq!(wrong.status, 401);
    assert_eq!(get(f.page, "/st", Some(&basic("ops:pw"))).status, 200);

    let page = get(f.page, "/st", Some(&ok));
    assert_eq!(page.status, 200, "{page:?}");
    assert_eq!(page.header("content-type"), Some("text/html"));
    assert_eq!(page.header("cache-control"), Some("no-cache"));
    assert_eq!(page.header("refresh"), Some("7"));
    for group in [
        "Queue",
        "Session rate",
        "Sessions",
        "Bytes",
        "Denied",
        "Errors",
        "Warnings",
        "Server",
        "Warm spares",
    ] {
        assert!(
            page.body.contains(&format!(">{group}</th>")),
            "no column group {group}"
        );
    }
    for id in ["fe/FRONTEND", "be/s1", "be/s2", "be/BACKEND"] {
        assert!(page.body.contains(&format!("id=\"{id}\"")), "no row {id}");
    }
    assert!(page.body.contains("kernel-forwarded bytes"));
    // No `stats admin`: no form.
    assert!(!page.body.contains("<form method=\"post\""));

    let norefresh = get(f.page, "/st;norefresh", Some(&ok));
    assert_eq!(norefresh.status, 200);
    assert_eq!(norefresh.header("refresh"), None);
    // What the URI does not cover has no server, as in HAProxy.
    let other = get(f.page, "/elsewhere", Some(&ok));
    assert_eq!(other.status, 503, "{other:?}");
    // The page's URI is a prefix: HAProxy serves `/st...` too.
    assert_eq!(get(f.page, "/st;csv", Some(&ok)).status, 200);
    let put = shunt_tests::http::request(f.page, "PUT", "/st", Some(&ok), Some("x"));
    assert_eq!(put.status, 405);
}

#[test]
fn csv_is_show_stat_and_json_parses() {
    let f = start(&["stats enable"]);
    for n in [100, 2000, 30] {
        flow(f.fe, n);
    }
    let sock = f.shunt.sock();
    eventually("flows closed", Duration::from_secs(5), || {
        stat(&sock, "fe", "FRONTEND", "scur") == 0
    });
    let csv = get(f.page, "/haproxy?stats;csv", None);
    assert_eq!(csv.status, 200);
    assert_eq!(csv.header("content-type"), Some("text/plain"));
    let cli_csv = cli(&sock, "show stat");
    assert_eq!(
        csv.body.lines().next(),
        cli_csv.lines().next(),
        "same header"
    );
    assert_eq!(rows(&csv.body), rows(&cli_csv));
    assert_eq!(stat(&sock, "fe", "FRONTEND", "stot"), 3);

    let json = get(f.page, "/haproxy?stats;json", None);
    assert_eq!(json.status, 200);
    assert_eq!(json.header("content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_str(&json.body).expect("valid JSON");
    let list = v.as_array().expect("an array of rows");
    assert_eq!(list.len(), rows(&cli_csv).len());
    // Each row is an array of fields; the frontend's `stot` says 3.
    let fe = list
        .iter()
        .find(|r| r[0]["objType"] == "Frontend")
        .expect("a frontend row");
    let stot = fe
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["field"]["name"] == "stot")
        .expect("stot");
    assert_eq!(stot["value"]["value"], 3);
    assert_eq!(stot["value"]["type"], "u64");
    assert_eq!(stot["tags"]["nature"], "Counter");
    // The CLI prints the same JSON (live values aside).
    let cli_json: serde_json::Value =
        serde_json::from_str(&cli(&sock, "show stat json")).expect("show stat json");
    assert_eq!(stable(&cli_json), stable(&v));
}

#[test]
fn admin_form_changes_state_through_the_cli_path() {
    let f = start(&[
        "stats enable",
        "stats auth admin:secret",
        "acl local src 127.0.0.1",
        "stats admin if local",
    ]);
    let auth = basic("admin:secret");
    let sock = f.shunt.sock();
    let page = get(f.page, "/haproxy?stats", Some(&auth));
    assert!(page.body.contains("<form method=\"post\">"), "admin form");
    assert!(page.body.contains("name=\"s\" value=\"s1\""));

    let done = post(
        f.page,
        "/haproxy?stats",
        Some(&auth),
        "s=s1&action=maint&b=%232",
    );
    assert_eq!(done.status, 303, "{done:?}");
    assert_eq!(done.header("location"), Some("/haproxy?stats;st=DONE"));
    let state = cli(&sock, "show servers state");
    assert_eq!(server_state(&state, "be", "s1").0, "1", "{state}");
    assert_eq!(server_state(&state, "be", "s2").0, "0", "{state}");
    assert_eq!(stat_row(&sock, "be", "s1")["status"], "MAINT");
    // The banner, and `;up` hides the server in maintenance.
    let banner = get(f.page, "/haproxy?stats;st=DONE", Some(&auth));
    assert!(banner.body.contains("Action processed successfully."));
    assert!(banner.body.contains("class=\"maintain\" id=\"be/s1\""));
    let up = get(f.page, "/haproxy?stats;up", Some(&auth));
    assert!(!up.body.contains("id=\"be/s1\"") && up.body.contains("id=\"be/s2\""));

    // Weight (shunt's action) and back to ready, by backend name.
    let w = post(
        f.page,
        "/haproxy?stats",
        Some(&auth),
        "s=s2&action=weight&weight=30&b=be",
    );
    assert_eq!(w.header("location"), Some("/haproxy?stats;st=DONE"));
    let r = post(
        f.page,
        "/haproxy?stats",
        Some(&auth),
        "s=s1&s=nosuch&action=ready&b=be",
    );
    assert_eq!(r.header("location"), Some("/haproxy?stats;st=PART"));
    let state = cli(&sock, "show servers state");
    assert_eq!(server_state(&state, "be", "s1").0, "0");
    assert_eq!(server_state(&state, "be", "s2").1, "30");

    // Bad parameters and an empty selection.
    let bad = post(
        f.page,
        "/haproxy?stats",
        Some(&auth),
        "s=s1&action=bogus&b=be",
    );
    assert_eq!(bad.header("location"), Some("/haproxy?stats;st=ERRP"));
    let unknown_be = post(
        f.page,
        "/haproxy?stats",
        Some(&auth),
        "s=s1&action=maint&b=%239",
    );
    assert_eq!(
        unknown_be.header("location"),
        Some("/haproxy?stats;st=ERRP")
    );
    let none = post(f.page, "/haproxy?stats", Some(&auth), "action=maint&b=be");
    assert_eq!(none.header("location"), Some("/haproxy?stats;st=NONE"));
    // Credentials come first: a POST without them is a 401.
    assert_eq!(
        post(f.page, "/haproxy?stats", None, "s=s1&action=maint&b=be").status,
        401
    );
    assert_eq!(
        server_state(&cli(&sock, "show servers state"), "be", "s1").0,
        "0"
    );
}

#[test]
fn a_client_without_admin_rights_never_sees_or_reaches_the_form() {
    for admin in [
        None,
        Some("stats admin if FALSE"),
        Some("stats admin unless LOCALHOST"),
    ] {
        let mut lines = vec!["stats enable"];
        lines.extend(admin);
        let f = start(&lines);
        let page = get(f.page, "/haproxy?stats", None);
        assert_eq!(page.status, 200);
        assert!(
            !page.body.contains("<form method=\"post\">") && !page.body.contains("name=\"s\""),
            "{admin:?}: form shown"
        );
        let denied = post(f.page, "/haproxy?stats", None, "s=s1&action=maint&b=be");
        assert_eq!(denied.status, 303, "{admin:?}");
        assert_eq!(
            denied.header("location"),
            Some("/haproxy?stats;st=DENY"),
            "{admin:?}"
        );
        let state = cli(&f.shunt.sock(), "show servers state");
        assert_eq!(
            server_state(&state, "be", "s1").0,
            "0",
            "{admin:?}: {state}"
        );
        let banner = get(f.page, "/haproxy?stats;st=DENY", None);
        assert!(banner.body.contains("Action denied."));
    }
}

#[test]
fn a_reload_hands_the_page_socket_to_the_successor() {
    use shunt_tests::reload::{plain, reload_global, tcp_defaults};
    let dir = TempDir::new("statspage-reload");
    let (port, pport) = (free_port(), free_port());
    let server = Server::echo();
    let cfg = format!(
        "{}{}frontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n\
         backend be\n    server s1 {}\n",
        reload_global(dir.path(), true, ""),
        tcp_defaults("30s"),
        server.addr
    );
    let cfg = with_stats_page(&cfg, pport, &["stats enable"]);
    let page = SocketAddr::from(([127, 0, 0, 1], pport));
    let mut old = Shunt::start(&cfg, &[]);
    assert_eq!(get(page, "/haproxy?stats", None).status, 200);
    let sock = dir.path().join("admin.sock").display().to_string();
    let old_pid = old.pid().to_string();
    let new = Shunt::start(&cfg, &["-x", sock.as_str(), "-sf", old_pid.as_str()]);
    let log = plain(&new.stderr());
    // Two frontend sockets (nbthread 2), the page's, the stats socket.
    assert!(
        log.contains("took the listening sockets of the old process") && log.contains("sockets=4"),
        "the successor did not take the page's socket:\n{log}"
    );
    assert!(
        !log.contains("not in the configuration"),
        "the successor left an inherited socket unclaimed:\n{log}"
    );
    assert_eq!(
        old.wait(Duration::from_secs(10)),
        Some(0),
        "{}",
        old.stderr()
    );
    let after = get(page, "/haproxy?stats;csv", None);
    assert_eq!(after.status, 200, "{after:?}");
    assert!(after.body.starts_with("# pxname,svname,"));
}
