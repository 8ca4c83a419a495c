//! A minimal HTTP/1.1 client for the stats page tests: one request per
//! connection (`Connection: close`), the answer read to EOF and split into
//! status, headers and body. Test-side only; the page itself is served by hyper.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use base64::Engine as _;

/// How long a page request may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// One answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Header names lowercased, in order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    /// The first header named `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `Basic` credentials for `user:pass`.
pub fn basic(user_pass: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(user_pass)
    )
}

/// Send `method target` with an optional `Authorization` and form body.
pub fn request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    auth: Option<&str>,
    form: Option<&str>,
) -> Answer {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(HTTP_TIMEOUT)).expect("timeout");
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(a) = auth {
        req.push_str(&format!("Authorization: {a}\r\n"));
    }
    if let Some(f) = form {
        req.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{f}",
            f.len()
        ));
    } else {
        req.push_str("\r\n");
    }
    s.write_all(req.as_bytes()).expect("send request");
    let text = String::from_utf8_lossy(&read_answer(&mut s)).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {text:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_string(),
    }
}

/// The bytes of one answer: up to its `Content-Length` when it has one (some
/// servers keep the connection despite `Connection: close`), else to EOF.
fn read_answer(s: &mut TcpStream) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if let Some(len) = len {
                while raw.len() < end + 4 + len {
                    let n = s.read(&mut buf).expect("read answer body");
                    if n == 0 {
                        break;
                    }
                    raw.extend_from_slice(&buf[..n]);
                }
                return raw;
            }
            s.read_to_end(&mut raw).expect("read answer");
            return raw;
        }
        let n = s.read(&mut buf).expect("read answer head");
        if n == 0 {
            return raw;
        }
        raw.extend_from_slice(&buf[..n]);
    }
}

/// `GET target`.
pub fn get(addr: SocketAddr, target: &str, auth: Option<&str>) -> Answer {
    request(addr, "GET", target, auth, None)
}

/// `POST target` with a form body.
pub fn post(addr: SocketAddr, target: &str, auth: Option<&str>, form: &str) -> Answer {
    request(addr, "POST", target, auth, Some(form))
}

/// `cfg` with a `listen stats` page on `port` whose own lines are `lines`
/// (`stats enable`, `stats auth ...`), indented as the section's.
pub fn with_stats_page(cfg: &str, port: u16, lines: &[&str]) -> String {
    let mut out = cfg.to_string();
    out.push_str(&format!(
        "\nlisten stats\n    mode http\n    bind 127.0.0.1:{port}\n"
    ));
    for l in lines {
        out.push_str(&format!("    {l}\n"));
    }
    out
}

/// The `srv_admin_state` (and `srv_uweight`) of `be/srv` in `show servers state`.
pub fn server_state(answer: &str, be: &str, srv: &str) -> (String, String) {
    let mut lines = answer.lines().skip(1);
    let header: Vec<&str> = lines
        .next()
        .and_then(|h| h.strip_prefix("# "))
        .unwrap_or_else(|| panic!("no header in {answer:?}"))
        .split(' ')
        .collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no column {name}"))
    };
    let (admin, uweight) = (col("srv_admin_state"), col("srv_uweight"));
    for l in lines {
        let f: Vec<&str> = l.split(' ').collect();
        if f.get(1) == Some(&be) && f.get(3) == Some(&srv) {
            return (f[admin].to_string(), f[uweight].to_string());
        }
    }
    panic!("no server {be}/{srv} in {answer:?}")
}
