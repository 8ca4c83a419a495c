//! The stats page in a real browser: headless Chromium driven over the DevTools
//! protocol loads the page with credentials, its table is checked against `show
//! stat`, a screenshot is written to `target/stats-page.png`, a server is put in
//! maintenance by ticking its box, choosing "Set state to MAINT" and pressing
//! Apply on the page's own form (then `show servers state` says so), and a wrong
//! password gets a 401.
//!
//! Without Chromium the test fails when `SHUNT_REQUIRE_BPF=1` (CI, whose set-up
//! installs the `chromium` package) and is skipped loudly otherwise.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use shunt_tests::http::{basic, get, server_state, with_stats_page};
use shunt_tests::*;
use tungstenite::{Message, WebSocket};

/// How long Chromium may take to open its DevTools endpoint.
const BROWSER_START: Duration = Duration::from_secs(30);
/// How long a page may take to load (or a form to come back).
const PAGE_LOAD: Duration = Duration::from_secs(20);
/// How long one DevTools call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// The browser window: wide enough for the whole table.
const WINDOW: &str = "1600,1000";

/// The Chromium binary: `$SHUNT_CHROMIUM`, else the first on `PATH`.
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SHUNT_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| {
            ["chromium", "chromium-browser", "google-chrome"]
                .into_iter()
                .map(move |n| d.join(n))
        })
        .find(|p| p.is_file())
}

/// A child process killed (and reaped) when dropped, a failed start included.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A headless Chromium with its DevTools endpoint; killed when dropped.
struct Browser {
    _child: KillOnDrop,
    _profile: TempDir,
    ws: WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    next_id: u64,
    /// DevTools events received so far (`Network.responseReceived`, ...).
    events: Vec<Value>,
}

impl Browser {
    fn launch(bin: &Path) -> Browser {
        let profile = TempDir::new("chromium");
        let port = free_port();
        let child = Command::new(bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--disable-breakpad",
                &format!("--window-size={WINDOW}"),
                &format!("--remote-debugging-port={port}"),
                &format!("--user-data-dir={}", profile.path().display()),
                "about:blank",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
        // Guarded before anything may fail, so a failed start leaves no browser.
        let child = KillOnDrop(child);
        let ws = Self::page_socket(SocketAddr::from(([127, 0, 0, 1], port)));
        let mut b = Browser {
            _child: child,
            _profile: profile,
            ws,
            next_id: 0,
            events: Vec::new(),
        };
        b.call("Page.enable", json!({}));
        b.call("Network.enable", json!({}));
        b
    }

    /// The WebSocket of the browser's first page.
    fn page_socket(
        devtools: SocketAddr,
    ) -> WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>> {
        let t0 = Instant::now();
        let url = loop {
            let found = TcpStream::connect(devtools).ok().and_then(|_| {
                let list: Value =
                    serde_json::from_str(&get(devtools, "/json/list", None).body).ok()?;
                list.as_array()?
                    .iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(str::to_string))
            });
            if let Some(u) = found {
                break u;
            }
            assert!(
                t0.elapsed() < BROWSER_START,
                "chromium opened no DevTools page at {devtools} in {BROWSER_START:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let (ws, _) = tungstenite::connect(url.as_str())
            .unwrap_or_else(|e| panic!("DevTools WebSocket {url}: {e}"));
        if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_ref() {
            s.set_read_timeout(Some(CALL_TIMEOUT)).expect("timeout");
        }
        ws
    }

    /// One DevTools call; its result (events in between are skipped).
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"id": id, "method": method, "params": params});
        self.ws
            .send(Message::text(msg.to_string()))
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        loop {
            let m = self
                .ws
                .read()
                .unwrap_or_else(|e| panic!("{method}: no answer: {e}"));
            let Message::Text(t) = m else { continue };
            let v: Value = serde_json::from_str(t.as_str()).expect("DevTools JSON");
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
            if v.get("method").is_some() {
                self.events.push(v);
            }
        }
    }

    /// The HTTP status and headers of the last document response for `url`,
    /// waiting for it (an answer Chromium does not display, such as a 401 it would
    /// ask credentials for, still has one).
    fn document_response(&mut self, url: &str) -> (u64, Value) {
        let t0 = Instant::now();
        loop {
            let found = self.events.iter().rev().find(|e| {
                e["method"] == "Network.responseReceived"
                    && e["params"]["type"] == "Document"
                    && e["params"]["response"]["url"] == url
            });
            if let Some(e) = found {
                let status = e["params"]["response"]["status"].as_u64().unwrap_or(0);
                return (status, e["params"]["response"]["headers"].clone());
            }
            assert!(
                t0.elapsed() < PAGE_LOAD,
                "no response for {url} in {PAGE_LOAD:?}"
            );
            // Any call lets the events that arrived meanwhile in.
            self.eval("1");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The value of a JavaScript expression in the page.
    fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expr}: {r}");
        r["result"]["value"].clone()
    }

    /// Wait until the document at an address containing `want` has loaded.
    fn wait_loaded(&mut self, want: &str) {
        let t0 = Instant::now();
        let probe = format!(
            "document.readyState === 'complete' && location.href.includes({})",
            json!(want)
        );
        while self.eval(&probe) != Value::Bool(true) {
            assert!(
                t0.elapsed() < PAGE_LOAD,
                "no page at *{want}* after {PAGE_LOAD:?} (at {})",
                self.eval("location.href")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Load `url` with `authorization` sent on every request.
    fn open(&mut self, url: &str, authorization: &str) {
        self.call(
            "Network.setExtraHTTPHeaders",
            json!({"headers": {"Authorization": authorization}}),
        );
        // A blank page first, so that the wait below cannot see the previous load.
        self.call("Page.navigate", json!({"url": "about:blank"}));
        self.wait_loaded("about:blank");
        self.call("Page.navigate", json!({"url": url}));
        self.wait_loaded(url);
    }

    /// The HTTP status of the current document.
    fn status(&mut self) -> u64 {
        self.eval("performance.getEntriesByType('navigation')[0].responseStatus")
            .as_u64()
            .expect("a response status")
    }

    /// Every table row with an id: (id, class, cell texts).
    fn rows(&mut self) -> Vec<(String, String, Vec<String>)> {
        let v = self.eval(
            "[...document.querySelectorAll('tr[id]')].map(tr => \
             [tr.id, tr.className, [...tr.cells].map(c => c.innerText.trim())])",
        );
        v.as_array()
            .expect("rows")
            .iter()
            .map(|r| {
                let cells = r[2]
                    .as_array()
                    .expect("cells")
                    .iter()
                    .map(|c| c.as_str().unwrap_or("").to_string())
                    .collect();
                (
                    r[0].as_str().unwrap_or("").to_string(),
                    r[1].as_str().unwrap_or("").to_string(),
                    cells,
                )
            })
            .collect()
    }

    fn screenshot(&mut self, to: &Path) {
        let r = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("screenshot data"))
            .expect("base64 PNG");
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(to, png).unwrap_or_else(|e| panic!("write {}: {e}", to.display()));
    }
}

fn flow(addr: SocketAddr, n: usize) {
    let mut c = connect(addr);
    c.write_all(&vec![9u8; n]).expect("write");
    c.shutdown(std::net::Shutdown::Write).expect("shutdown");
    assert_eq!(read_to_end(&mut c).expect("read").len(), n);
}

/// The cells of a server row the test compares with `show stat` (column index in
/// the page's row: name, sessions cur and total, LbTot, bytes in and out, weight).
const SERVER_CELLS: [(usize, &str); 6] = [
    (1, "svname"),
    (8, "scur"),
    (11, "stot"),
    (12, "lbtot"),
    (14, "bin"),
    (15, "bout"),
];
/// The page's column of a server's status and weight.
const STATUS_CELL: usize = 23;
const WEIGHT_CELL: usize = 25;

#[test]
fn the_page_in_a_browser_matches_show_stat_and_its_form_works() {
    let Some(bin) = chromium() else {
        assert!(
            std::env::var("SHUNT_REQUIRE_BPF").as_deref() != Ok("1"),
            "chromium not found (SHUNT_REQUIRE_BPF=1 requires the browser test; \
             `cargo xtask setup` installs the Debian package `chromium`, or set SHUNT_CHROMIUM)"
        );
        eprintln!("!!!!! SKIPPED the stats page browser test: no chromium on PATH (apt-get install chromium)");
        return;
    };
    let servers = (Server::echo(), Server::echo());
    let (port, pport) = (free_port(), free_port());
    let cfg = simple_config(port, &[], "")
        + &format!(
            "    server s1 {} check inter 500ms\n    server s2 {} weight 50\n",
            servers.0.addr, servers.1.addr
        );
    let cfg = with_stats_page(
        &cfg,
        pport,
        &[
            "stats enable",
            "stats uri /stats",
            "stats auth admin:secret",
            "stats admin if LOCALHOST",
            "stats show-legends",
        ],
    );
    let shunt = Shunt::start(&cfg, &["--forward-mode", "copy"]);
    let sock = shunt.sock();
    let fe = SocketAddr::from(([127, 0, 0, 1], port));
    for n in [300, 4000, 20, 7] {
        flow(fe, n);
    }
    eventually("flows closed", Duration::from_secs(5), || {
        stat(&sock, "fe", "FRONTEND", "scur") == 0
    });
    eventually("s1 UP", Duration::from_secs(10), || {
        stat_row(&sock, "be", "s1")["status"] == "UP"
    });
    let url = format!("http://127.0.0.1:{pport}/stats");
    let mut b = Browser::launch(&bin);

    // The table, against `show stat`.
    b.open(&url, &basic("admin:secret"));
    assert_eq!(b.status(), 200);
    let rows = b.rows();
    for sv in ["s1", "s2"] {
        let want = stat_row(&sock, "be", sv);
        let (_, class, cells) = rows
            .iter()
            .find(|(id, _, _)| *id == format!("be/{sv}"))
            .unwrap_or_else(|| panic!("no row be/{sv} in {rows:?}"));
        for (i, col) in SERVER_CELLS {
            assert_eq!(cells[i], want[col], "be/{sv} {col}: {cells:?}");
        }
        assert!(
            cells[STATUS_CELL].ends_with(want["status"].as_str()),
            "be/{sv} status {:?} vs {}",
            cells[STATUS_CELL],
            want["status"]
        );
        assert_eq!(
            cells[WEIGHT_CELL],
            format!("{}/{}", want["weight"], want["uweight"])
        );
        let expected_class = if sv == "s1" {
            "active_up"
        } else {
            "active_no_check"
        };
        assert_eq!(class, expected_class, "be/{sv}");
    }
    let (_, _, fe_cells) = rows
        .iter()
        .find(|(id, _, _)| id == "fe/FRONTEND")
        .expect("frontend row");
    let fe_row = stat_row(&sock, "fe", "FRONTEND");
    assert_eq!(fe_cells[9], fe_row["stot"], "frontend total: {fe_cells:?}");
    assert_eq!(fe_cells[12], fe_row["bin"], "frontend bytes in");
    assert_eq!(fe_cells[13], fe_row["bout"], "frontend bytes out");
    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/stats-page.png");
    b.screenshot(&shot);

    // Maintenance through the page's own form.
    b.eval(
        "(() => { const box = document.querySelector('input[name=s][value=s2]'); \
         box.checked = true; box.form.querySelector('select[name=action]').value = 'maint'; \
         box.form.querySelector('input[type=submit]').click(); return true; })()",
    );
    b.wait_loaded("st=DONE");
    let text = b.eval("document.body.innerText");
    assert!(
        text.as_str()
            .is_some_and(|t| t.contains("Action processed successfully.")),
        "{text}"
    );
    let state = cli(&sock, "show servers state");
    assert_eq!(server_state(&state, "be", "s2").0, "1", "{state}");
    assert_eq!(stat_row(&sock, "be", "s2")["status"], "MAINT");
    let rows = b.rows();
    assert!(
        rows.iter()
            .any(|(id, class, _)| id == "be/s2" && class == "maintain"),
        "{rows:?}"
    );
    b.screenshot(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/stats-page-maint.png"));

    // A wrong password: Chromium gets HAProxy's 401 (headless, it then shows its
    // own error page instead of asking for credentials).
    b.call(
        "Network.setExtraHTTPHeaders",
        json!({"headers": {"Authorization": basic("admin:wrong")}}),
    );
    b.events.clear();
    b.call("Page.navigate", json!({"url": url}));
    let (status, headers) = b.document_response(&url);
    assert_eq!(status, 401, "{headers}");
    let challenge = headers
        .as_object()
        .and_then(|h| {
            h.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("www-authenticate"))
        })
        .and_then(|(_, v)| v.as_str().map(str::to_string));
    assert_eq!(
        challenge.as_deref(),
        Some("Basic realm=\"HAProxy Statistics\""),
        "{headers}"
    );
}
