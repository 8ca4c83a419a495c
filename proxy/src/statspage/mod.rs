//! The stats web page: a `listen`/`frontend` section in `mode http` with `stats
//! enable` serves HAProxy's statistics page over HTTP/1.1 (hyper), its `;csv` and
//! `;json` exports, and, where `stats admin` holds, the per-backend admin form.
//!
//! Owns the `shunt-stats` thread (one current-thread tokio runtime for every page's
//! listeners, as the Prometheus exporter has its own), request routing, `stats auth`
//! (HTTP Basic, `401` with the realm), the `stats admin` decision and the redirects
//! after a POST (`;st=DONE|PART|NONE|ERRP|EXCD|DENY`, HAProxy's). The HTML is
//! `html.rs`, the admin actions `admin.rs`.
//!
//! Must not: keep numbers of its own or change server state itself. The table is
//! built from `cli::render::stat_rows`, the rows `show stat` prints, so the page,
//! its CSV and `show stat` agree; an admin action becomes the CLI command it stands
//! for (`set server B/S state maint`, ...) and runs through `cli::dispatch` on
//! worker 0 (`Remote::run`), the one place CLI commands change state (`ServerRt::
//! apply` under `checks::transition`), on a thread where the scheduler exists for
//! what a transition may start (`slowstart`).
//!
//! Bounds: [`MAX_CLIENTS`] connections at once (more wait in the listen backlog),
//! [`MAX_FORM`] bytes of POST body, [`DEFAULT_IDLE`] without `timeout client`.
//!
//! Layer: after `cli` (it reads the CLI's renderer and dispatcher), before `daemon`.

mod admin;
mod html;

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::cli::render::{self, StatFilter};
use crate::cli::Ctx;
use crate::config::{AclCtx, StatsPage};
use crate::runtime::Runtime;

/// Page connections served at once; more wait in the listen backlog.
pub const MAX_CLIENTS: usize = 64;
/// Largest admin form body read (HAProxy's 16 kB buffer: `;st=EXCD` beyond).
pub const MAX_FORM: usize = 16 * 1024;
/// How long a client may take to send a request's head without `timeout client`.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(30);
/// Pause after a failed accept (EMFILE and friends) before trying again.
const ACCEPT_RETRY: Duration = Duration::from_millis(10);

/// HAProxy's bodies for the answers that are not the page.
const BODY_401: &str = "<html><body><h1>401 Unauthorized</h1>\nYou need a valid user and password to access this content.\n</body></html>\n";
const BODY_503: &str = "<html><body><h1>503 Service Unavailable</h1>\nNo server is available to handle this request.\n</body></html>\n";
const BODY_405: &str = "<html><body><h1>405 Method Not Allowed</h1>\nA request method is not allowed for the requested resource.\n</body></html>\n";

#[derive(Debug, thiserror::Error)]
pub enum StatsPageError {
    #[error("cannot start the stats page thread: {0}")]
    Thread(std::io::Error),
}

/// One page's listener: the index of its page in `Config::stats_pages`.
pub struct PageListener {
    pub page: usize,
    pub listener: StdListener,
}

/// Serve every page's listeners from a thread of their own until the process exits.
pub fn serve(listeners: Vec<PageListener>, state: Arc<Runtime>) -> Result<(), StatsPageError> {
    if listeners.is_empty() {
        return Ok(());
    }
    std::thread::Builder::new()
        .name("shunt-stats".to_string())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "stats page thread: cannot build its runtime");
                    return;
                }
            };
            let ctx = Arc::new(Ctx::new(state));
            let busy = Arc::new(AtomicUsize::new(0));
            rt.block_on(async move {
                let mut loops = Vec::new();
                for l in listeners {
                    loops.push(tokio::spawn(accept_loop(l, ctx.clone(), busy.clone())));
                }
                for l in loops {
                    let _ = l.await;
                }
            });
        })
        .map(|_| ())
        .map_err(StatsPageError::Thread)
}

async fn accept_loop(l: PageListener, ctx: Arc<Ctx>, busy: Arc<AtomicUsize>) {
    let page = l.page;
    let listener = match TcpListener::from_std(l.listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot register a stats page listener");
            return;
        }
    };
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(_) => {
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        if busy.load(Ordering::Relaxed) >= MAX_CLIENTS {
            drop(sock);
            continue;
        }
        busy.fetch_add(1, Ordering::Relaxed);
        let local = sock.local_addr().ok();
        let (ctx, b) = (ctx.clone(), busy.clone());
        tokio::spawn(async move {
            let idle = ctx.state.config.stats_pages[page]
                .timeout_client
                .unwrap_or(DEFAULT_IDLE);
            let svc_ctx = ctx.clone();
            let svc = hyper::service::service_fn(move |req| {
                let ctx = svc_ctx.clone();
                async move {
                    let conn = Conn { page, peer, local };
                    Ok::<_, Infallible>(handle(&ctx, conn, req).await)
                }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(idle)
                .serve_connection(TokioIo::new(sock), svc)
                .await;
            if let Err(e) = served {
                tracing::debug!(error = %e, "stats page connection ended");
            }
            b.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Where a request came from, and which page it reached.
#[derive(Debug, Clone, Copy)]
struct Conn {
    page: usize,
    peer: SocketAddr,
    local: Option<SocketAddr>,
}

/// The `;`-separated options after the page's URI (HAProxy's).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Opts {
    pub csv: bool,
    pub json: bool,
    /// `;up`: hide the servers that are not UP.
    pub up: bool,
    pub norefresh: bool,
    /// `;st=XXXX`: the status of the last admin action, shown as a banner.
    pub st: Option<String>,
}

impl Opts {
    /// The options in `rest`, what follows the page's URI (unknown ones ignored,
    /// as HAProxy does).
    pub fn parse(rest: &str) -> Self {
        let mut o = Opts::default();
        for word in rest.split(';') {
            match word {
                "csv" => o.csv = true,
                "json" => o.json = true,
                "up" => o.up = true,
                "norefresh" => o.norefresh = true,
                w => {
                    if let Some(st) = w.strip_prefix("st=") {
                        o.st = Some(st.to_string());
                    }
                }
            }
        }
        o
    }
}

async fn handle(ctx: &Arc<Ctx>, conn: Conn, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let page = &ctx.state.config.stats_pages[conn.page];
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    // HAProxy serves the page for every request whose URI starts with the prefix.
    let Some(rest) = target.strip_prefix(page.uri.as_str()) else {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "text/html", BODY_503);
    };
    if !authorized(page, req.headers().get(header::AUTHORIZATION)) {
        let mut r = plain(StatusCode::UNAUTHORIZED, "text/html", BODY_401);
        let realm = format!("Basic realm=\"{}\"", page.realm.replace('"', "'"));
        if let Ok(v) = HeaderValue::from_str(&realm) {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        return r;
    }
    let opts = Opts::parse(rest);
    let admin = page.admin.as_ref().is_some_and(|c| {
        c.eval(&AclCtx {
            src: conn.peer,
            dst: conn.local,
            sni: None,
            req: crate::config::acl::Request::NONE,
            counts: &*ctx.state,
            stick: None,
        })
    });
    match *req.method() {
        Method::GET | Method::HEAD => {
            let (ctype, body) = if opts.csv {
                ("text/plain", render::show_stat(ctx, StatFilter::ALL))
            } else if opts.json {
                let csv = render::show_stat(ctx, StatFilter::ALL);
                ("application/json", crate::cli::typed::stat_json(&csv))
            } else {
                ("text/html", html::page(ctx, page, &opts, admin))
            };
            let mut r = plain(StatusCode::OK, ctype, body);
            if let (Some(secs), false) = (page.refresh, opts.norefresh) {
                r.headers_mut()
                    .insert(header::REFRESH, HeaderValue::from(secs));
            }
            r
        }
        Method::POST => {
            // A user without admin rights never reaches an action (HAProxy's DENY).
            let st = if !admin {
                admin::Status::Deny
            } else {
                match Limited::new(req.into_body(), MAX_FORM).collect().await {
                    Ok(body) => admin::apply(ctx, &body.to_bytes()).await,
                    Err(_) => admin::Status::Excd,
                }
            };
            see_other(&format!("{};st={}", page.uri, st.code()))
        }
        _ => {
            let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "text/html", BODY_405);
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD, POST"));
            r
        }
    }
}

/// Whether the request's credentials match a `stats auth` account (or the page
/// has none).
fn authorized(page: &StatsPage, auth: Option<&HeaderValue>) -> bool {
    if page.users.is_empty() {
        return true;
    }
    let Some(given) = auth.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some((scheme, b64)) = given.trim().split_once(' ') else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case("basic") {
        return false;
    }
    let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(b64.trim()) else {
        return false;
    };
    let Ok(text) = std::str::from_utf8(&raw) else {
        return false;
    };
    let (user, pass) = text.split_once(':').unwrap_or((text, ""));
    page.users.iter().any(|u| u.user == user && u.pass == pass)
}

/// An answer with a body, `Cache-Control: no-cache` as HAProxy's.
fn plain(status: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

/// `303 See Other` to `location`, HAProxy's answer to an admin POST.
fn see_other(location: &str) -> Response<Full<Bytes>> {
    let mut r = plain(StatusCode::SEE_OTHER, "text/plain", Bytes::new());
    if let Ok(v) = HeaderValue::from_str(location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

#[cfg(test)]
mod tests;
