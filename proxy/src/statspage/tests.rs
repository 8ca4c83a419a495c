//! Unit tests of the stats page's pure parts: options, credentials, row classes,
//! escaping, the admin status codes.

use super::*;

fn page(users: &[(&str, &str)]) -> StatsPage {
    StatsPage {
        name: "stats".into(),
        id: 1,
        binds: Vec::new(),
        uri: "/stats".into(),
        refresh: None,
        realm: "r".into(),
        users: users
            .iter()
            .map(|(u, p)| crate::config::StatsUser {
                user: (*u).into(),
                pass: (*p).into(),
            })
            .collect(),
        admin: None,
        hide_version: false,
        show_legends: false,
        show_node: None,
        timeout_client: None,
        line: Default::default(),
    }
}

fn basic(user_pass: &str) -> HeaderValue {
    let b64 = base64::engine::general_purpose::STANDARD.encode(user_pass);
    HeaderValue::from_str(&format!("Basic {b64}")).unwrap()
}

#[test]
fn options_after_the_uri_are_haproxys() {
    assert_eq!(Opts::parse(""), Opts::default());
    let o = Opts::parse(";csv;norefresh");
    assert!(o.csv && o.norefresh && !o.json && !o.up);
    let o = Opts::parse(";up;st=DONE;whatever");
    assert!(o.up);
    assert_eq!(o.st.as_deref(), Some("DONE"));
    assert!(Opts::parse(";json").json);
}

#[test]
fn credentials_must_match_one_account() {
    let p = page(&[("admin", "secret"), ("ops", "a:b")]);
    assert!(authorized(&p, Some(&basic("admin:secret"))));
    assert!(authorized(&p, Some(&basic("ops:a:b"))));
    assert!(!authorized(&p, Some(&basic("admin:wrong"))));
    assert!(!authorized(&p, Some(&basic("nobody:secret"))));
    assert!(!authorized(&p, None));
    assert!(!authorized(
        &p,
        Some(&HeaderValue::from_static("Bearer xyz"))
    ));
    assert!(!authorized(
        &p,
        Some(&HeaderValue::from_static("Basic !!!"))
    ));
    // No account: no authentication.
    assert!(authorized(&page(&[]), None));
}

#[test]
fn server_rows_take_haproxys_colour_classes() {
    use html::server_class;
    assert_eq!(server_class("UP", false), "active_up");
    assert_eq!(server_class("UP", true), "backup_up");
    assert_eq!(server_class("UP 1/3", false), "active_going_down");
    assert_eq!(server_class("DOWN", false), "active_down");
    assert_eq!(server_class("DOWN 1/2", true), "backup_going_up");
    assert_eq!(server_class("MAINT", true), "maintain");
    assert_eq!(server_class("DRAIN", false), "active_draining");
    assert_eq!(server_class("DRAIN (agent)", true), "backup_draining");
    assert_eq!(server_class("NOLB", false), "active_nolb");
    assert_eq!(server_class("no check", false), "active_no_check");
}

#[test]
fn html_text_is_escaped() {
    assert_eq!(
        html::esc("<a href=\"x\">'&'</a>"),
        "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
    );
}

#[test]
fn every_admin_status_has_a_banner() {
    use admin::Status;
    for st in [
        Status::Done,
        Status::Part,
        Status::None,
        Status::Errp,
        Status::Excd,
        Status::Deny,
    ] {
        assert!(Status::banner(st.code()).is_some(), "{st:?}");
    }
    assert!(Status::banner("BOGUS").is_none());
}
