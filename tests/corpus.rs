//! The tcp-mode corpus (tests/testdata/corpus/, its README says the format):
//! configurations from HAProxy's documentation and common uses. For each one,
//! `haproxy -c` and `shunt -c` must give the same verdict, the one the file
//! states; for each valid one, its `# probe:` clients are run against a real
//! HAProxy 2.6 and against shunt, and each client must reach the same server
//! (or be closed) on both, as the file expects. Configurations listed in
//! `PENDING` need stick tables: they are checked with `haproxy -c` and listed
//! as pending; one that shunt starts accepting fails the test until it leaves
//! the list (its probes are then run like the others').
//!
//! Without a `haproxy` binary the HAProxy half is skipped, loudly, and shunt
//! is still held to the expected outcomes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shunt_tests::*;

/// How long a probe waits for the server's tag byte: above the corpus's
/// longest inspect-delay (5 s), so a client is judged only once its proxy has.
const PROBE_READ_TIMEOUT: Duration = Duration::from_secs(8);
/// How long HAProxy may take to start listening.
const HAPROXY_START: Duration = Duration::from_secs(10);
/// Echo servers a configuration may name (`@S1@`..`@S9@`).
const MAX_SERVERS: u8 = 9;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/corpus")
}

/// What a probe's client sends first.
#[derive(Debug, Clone)]
enum Send {
    Nothing,
    Bytes(Vec<u8>),
}

/// One `# probe:` line.
#[derive(Debug, Clone)]
struct Probe {
    line: String,
    from: Option<[u8; 4]>,
    /// Which `@Pn@` to connect to (1-based).
    port: usize,
    send: Send,
    expect: Outcome,
}

/// What a client saw: the tag of the server it reached, or a close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Server(u8),
    Closed,
    /// Nothing within `PROBE_READ_TIMEOUT`.
    Silent,
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex '{s}'");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or_else(|_| panic!("bad hex '{s}'")))
        .collect()
}

fn unescape(s: &str) -> Vec<u8> {
    s.replace("\\r", "\r")
        .replace("\\n", "\n")
        .replace("\\s", " ")
        .into_bytes()
}

/// A ClientHello without SNI announcing `major.minor`.
fn hello_version(v: &str) -> Vec<u8> {
    let (major, minor) = v.split_once('.').expect("MAJOR.MINOR");
    let mut h = client_hello(None);
    // Record header (5) and handshake header (4), then the hello's version.
    h[9] = major.parse().expect("major");
    h[10] = minor.parse().expect("minor");
    h
}

fn parse_probe(line: &str) -> Probe {
    let body = line.trim_start_matches("# probe:").trim();
    let (lhs, rhs) = body
        .split_once("=>")
        .unwrap_or_else(|| panic!("probe without '=>': {line}"));
    let expect = match rhs.trim() {
        "closed" => Outcome::Closed,
        s => Outcome::Server(
            s.strip_prefix('s')
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("bad outcome in {line}")),
        ),
    };
    let mut p = Probe {
        line: line.to_string(),
        from: None,
        port: 1,
        send: Send::Nothing,
        expect,
    };
    for w in lhs.split_whitespace() {
        let (k, v) = w
            .split_once('=')
            .unwrap_or_else(|| panic!("bad word '{w}' in {line}"));
        match k {
            "from" => {
                let ip: std::net::Ipv4Addr = v.parse().expect("from=IPv4");
                p.from = Some(ip.octets());
            }
            "port" => p.port = v.parse().expect("port=N"),
            "send" => {
                p.send = match v.split_once(':') {
                    None if v == "none" => Send::Nothing,
                    None if v == "hello" => Send::Bytes(client_hello(None)),
                    Some(("sni", name)) => Send::Bytes(client_hello(Some(name))),
                    Some(("hello-ver", ver)) => Send::Bytes(hello_version(ver)),
                    Some(("hex", h)) => Send::Bytes(hex(h)),
                    Some(("text", t)) => Send::Bytes(unescape(t)),
                    _ => panic!("bad send in {line}"),
                }
            }
            _ => panic!("unknown probe word '{k}' in {line}"),
        }
    }
    p
}

/// One corpus file, read.
struct Case {
    name: String,
    text: String,
    valid: bool,
    probes: Vec<Probe>,
}

fn load_cases() -> Vec<Case> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("read corpus dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cfg"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read cfg");
            let valid = !text.lines().any(|l| l.trim() == "# verdict: invalid");
            let probes = text
                .lines()
                .filter(|l| l.starts_with("# probe:"))
                .map(parse_probe)
                .collect();
            Case {
                name: p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                text,
                valid,
                probes,
            }
        })
        .collect()
}

fn pending() -> Vec<String> {
    std::fs::read_to_string(corpus_dir().join("PENDING"))
        .expect("read PENDING")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// The servers, ports and paths one run of a configuration uses.
struct Rig {
    servers: Vec<Server>,
    ports: Vec<u16>,
}

impl Rig {
    fn new(text: &str) -> Rig {
        let servers = (1..=MAX_SERVERS)
            .filter(|n| text.contains(&format!("@S{n}@")))
            .map(Server::tagged_echo)
            .collect::<Vec<_>>();
        let ports = (1..=2)
            .filter(|n| text.contains(&format!("@P{n}@")))
            .map(|_| free_port())
            .collect();
        Rig { servers, ports }
    }

    fn render(&self, text: &str) -> String {
        let mut out = text.replace("@CORPUS@", &corpus_dir().to_string_lossy());
        for (i, p) in self.ports.iter().enumerate() {
            out = out.replace(&format!("@P{}@", i + 1), &p.to_string());
        }
        // Servers are started for @S1@.. in order; each tags with its number.
        let mut it = self.servers.iter();
        for n in 1..=MAX_SERVERS {
            let ph = format!("@S{n}@");
            if out.contains(&ph) {
                let s = it.next().expect("a server per placeholder");
                out = out.replace(&ph, &s.addr.to_string());
            }
        }
        out
    }

    fn addr(&self, port: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[port - 1]))
    }
}

/// Run one probe against the proxy listening at `rig`'s ports.
fn run_probe(rig: &Rig, p: &Probe) -> Outcome {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    if let Some(from) = p.from {
        s.bind(&SocketAddr::from((from, 0)).into())
            .expect("bind client");
    }
    if s.connect(&rig.addr(p.port).into()).is_err() {
        return Outcome::Closed;
    }
    let mut s: TcpStream = s.into();
    s.set_read_timeout(Some(PROBE_READ_TIMEOUT))
        .expect("timeout");
    if let Send::Bytes(b) = &p.send {
        if s.write_all(b).is_err() {
            return Outcome::Closed;
        }
    }
    let mut tag = [0u8; 1];
    match s.read(&mut tag) {
        Ok(1) => Outcome::Server(tag[0]),
        Ok(_) => Outcome::Closed,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Outcome::Silent
        }
        Err(_) => Outcome::Closed,
    }
}

/// `haproxy -c -f FILE`: whether it is valid, and its output.
fn haproxy_check(path: &Path) -> (bool, String) {
    let out = Command::new("haproxy")
        .arg("-c")
        .arg("-f")
        .arg(path)
        .output()
        .expect("run haproxy -c");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// A running HAProxy, killed on drop.
struct Haproxy(Child);

impl Haproxy {
    fn start(path: &Path, listen: SocketAddr) -> Haproxy {
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn haproxy");
        let h = Haproxy(child);
        let t0 = Instant::now();
        while TcpStream::connect_timeout(&listen, Duration::from_millis(200)).is_err() {
            assert!(
                t0.elapsed() < HAPROXY_START,
                "haproxy did not listen on {listen}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        h
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The outcomes of every probe of `case` on one proxy, started by `start`.
fn outcomes<P>(rig: &Rig, case: &Case, start: impl FnOnce() -> P) -> Vec<Outcome> {
    let proxy = start();
    let out = case.probes.iter().map(|p| run_probe(rig, p)).collect();
    drop(proxy);
    out
}

#[test]
fn corpus_verdicts_and_routing_match_haproxy() {
    let cases = load_cases();
    let pending = pending();
    assert!(
        cases.len() >= 25,
        "the corpus holds {} configurations, fewer than 25",
        cases.len()
    );
    for p in &pending {
        assert!(
            cases.iter().any(|c| c.name == *p),
            "PENDING names '{p}', which is not in the corpus"
        );
    }
    let haproxy = Command::new("haproxy").arg("-v").output().is_ok();
    if !haproxy {
        eprintln!("SKIP the HAProxy half of the corpus test: no haproxy binary (apt-get install haproxy); shunt is still held to the expected outcomes");
    }
    let scratch = TempDir::new("corpus");
    let mut failures = Vec::new();
    let mut ran = 0;
    for case in &cases {
        let rig = Rig::new(&case.text);
        let cfg = rig.render(&case.text);
        let path = scratch.path().join(&case.name);
        std::fs::write(&path, &cfg).expect("write rendered cfg");
        if haproxy {
            let (ok, out) = haproxy_check(&path);
            if ok != case.valid {
                failures.push(format!(
                    "{}: haproxy -c says valid={ok}, the file says {}:\n{out}",
                    case.name, case.valid
                ));
                continue;
            }
        }
        let (code, _, err) = check_config(&[&path]);
        let shunt_ok = code == 0;
        if pending.contains(&case.name) {
            if shunt_ok {
                failures.push(format!(
                    "{}: shunt now accepts it: take it out of PENDING so its probes run",
                    case.name
                ));
            } else {
                let why = err
                    .lines()
                    .find(|l| l.contains("parsing ["))
                    .unwrap_or("")
                    .trim();
                eprintln!(
                    "PENDING stick tables: {} (haproxy -c: valid; shunt -c: {why})",
                    case.name
                );
            }
            continue;
        }
        if shunt_ok != case.valid {
            failures.push(format!(
                "{}: shunt -c says valid={shunt_ok}, the file says {}:\n{err}",
                case.name, case.valid
            ));
            continue;
        }
        if !case.valid {
            continue;
        }
        if case.probes.is_empty() {
            failures.push(format!(
                "{}: a valid configuration without probes",
                case.name
            ));
            continue;
        }
        let listen = rig.addr(1);
        let theirs = haproxy.then(|| outcomes(&rig, case, || Haproxy::start(&path, listen)));
        let ours = outcomes(&rig, case, || Shunt::start(&cfg, &[]));
        ran += 1;
        for (i, p) in case.probes.iter().enumerate() {
            if let Some(t) = &theirs {
                if t[i] != p.expect {
                    failures.push(format!(
                        "{}: HAProxy gave {:?} for '{}'",
                        case.name, t[i], p.line
                    ));
                }
            }
            if ours[i] != p.expect {
                failures.push(format!(
                    "{}: shunt gave {:?} for '{}'",
                    case.name, ours[i], p.line
                ));
            }
        }
    }
    eprintln!(
        "corpus: {} configurations, {ran} run against {}, {} pending stick tables",
        cases.len(),
        if haproxy {
            "HAProxy and shunt"
        } else {
            "shunt"
        },
        pending.len()
    );
    assert!(
        failures.is_empty(),
        "{} corpus failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
