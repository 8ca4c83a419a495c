//! config: `shunt -c -f FILE` end to end. Malformed files must exit 1 with
//! the HAProxy-style `[ALERT]` line naming file and line; every shipped
//! example must be reported valid.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use shunt_tests::shunt_bin;

const DEFAULTS: &str = "defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n";

/// A fresh directory for this test's files, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("shunt-cfg-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("write config file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn check(files: &[&Path]) -> Output {
    let mut cmd = Command::new(shunt_bin());
    cmd.arg("-c");
    for f in files {
        cmd.arg("-f").arg(f);
    }
    cmd.output().expect("run shunt -c")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Each case: file name, contents, and the expected message with `{f}` standing
/// for the file's path as given on the command line.
const MALFORMED: &[(&str, &str, &str)] = &[
    (
        "typo.cfg",
        "frontend fe\n    bind 127.0.0.1:8080\n    bakend x\n",
        "parsing [{f}:3] : unknown keyword 'bakend' in 'frontend' section",
    ),
    ("outside.cfg", "\n# comment\nfoo bar\n", "parsing [{f}:3] : unknown keyword 'foo' out of section."),
    (
        "http.cfg",
        "defaults\n    mode http\nbackend be\n",
        "parsing [{f}:3] : backend 'be' inherits 'mode http' from the defaults section at [{f}:2], and shunt does not speak HTTP: add 'mode tcp'.",
    ),
    (
        "server_kw.cfg",
        "backend be\n    server s1 127.0.0.1:80 foo\n",
        "parsing [{f}:2] : 'server be/s1' : unknown keyword 'foo'. Registered keywords : ",
    ),
    (
        "server_args.cfg",
        "backend be\n    server s1\n",
        "parsing [{f}:2] : 'server' expects <name> and <addr>[:<port>] as arguments.",
    ),
    (
        "server_in_frontend.cfg",
        "frontend fe\n    bind :8080\n    server s1 127.0.0.1:80\n",
        "parsing [{f}:3] : 'server' not allowed because frontend 'fe' has no backend capability.",
    ),
    (
        "weight.cfg",
        "backend be\n    server s1 127.0.0.1:80 weight 300\n",
        "parsing [{f}:2] : 'server be/s1' : weight of server s1 is not within 0 and 256 (300).",
    ),
    (
        "dup_server.cfg",
        "backend be\n    server s1 127.0.0.1:80\n    server s1 127.0.0.1:81\n",
        "parsing [{f}:3] : backend 'be', another server named 's1' was already defined at line 2, please use distinct names.",
    ),
    (
        "timeout.cfg",
        "defaults\n    timeout client 10x\n",
        "parsing [{f}:2] : unexpected character 'x' in 'timeout client'",
    ),
    (
        "acl.cfg",
        "frontend fe\n    bind :8080\n    use_backend be if is_ok\nbackend be\n",
        "parsing [{f}:3] : error detected while parsing switching rule : no such ACL : 'is_ok'.",
    ),
    (
        "dup_bind.cfg",
        "frontend a\n    bind 127.0.0.1:8080\nfrontend b\n    bind 127.0.0.1:8080\n",
        "parsing [{f}:4] : 'bind' : address 127.0.0.1:8080 is already bound by frontend 'a' at {f}:2.",
    ),
    (
        "quote.cfg",
        "frontend fe\n    bind \"127.0.0.1:8080\n",
        "parsing [{f}:2] : unmatched quote at position 10",
    ),
];

#[test]
fn malformed_files_are_rejected_with_file_and_line() {
    let dir = TempDir::new("malformed");
    for (name, body, expected) in MALFORMED {
        let path = dir.write(name, body);
        let expected = expected.replace("{f}", &path.display().to_string());
        let out = check(&[&path]);
        let stderr = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{name}: exit status; stderr:\n{stderr}"
        );
        let alert = stderr
            .lines()
            .find(|l| l.starts_with("[ALERT]") && l.contains(&expected));
        assert!(
            alert.is_some(),
            "{name}: expected an [ALERT] line containing\n  {expected}\nstderr:\n{stderr}"
        );
        assert!(
            !text(&out.stdout).contains("Configuration file is valid"),
            "{name}: reported valid"
        );
    }
}

#[test]
fn unknown_backend_is_rejected() {
    let dir = TempDir::new("unknown-backend");
    let path = dir.write(
        "fe.cfg",
        &format!("{DEFAULTS}frontend fe\n    bind :8080\n    default_backend nope\n"),
    );
    let out = check(&[&path]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("Proxy 'fe': unable to find required default_backend: 'nope'."),
        "stderr:\n{}",
        text(&out.stderr)
    );
}

#[test]
fn every_error_is_reported() {
    let dir = TempDir::new("many");
    let path = dir.write(
        "many.cfg",
        "foo\nfrontend fe\n    bind :8080\n    bakend x\nbackend be\n    server s1\n",
    );
    let out = check(&[&path]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let f = path.display();
    for line in [1, 4, 6] {
        assert!(
            stderr.contains(&format!("parsing [{f}:{line}] : ")),
            "line {line} missing; stderr:\n{stderr}"
        );
    }
}

#[test]
fn missing_timeouts_is_a_warning_not_an_error() {
    let dir = TempDir::new("warn");
    let path = dir.write("warn.cfg", "frontend fe\n    bind 127.0.0.1:8080\n");
    let out = check(&[&path]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");
    assert!(text(&out.stdout).contains("Configuration file is valid"));
    assert!(
        stderr.lines().any(
            |l| l.starts_with("[WARNING]") && l.contains("missing timeouts for frontend 'fe'.")
        ),
        "stderr:\n{stderr}"
    );
}

#[test]
fn files_are_concatenated_in_order() {
    let dir = TempDir::new("multi");
    let a = dir.write("a.cfg", DEFAULTS);
    let b = dir.write("b.cfg", "frontend fe\n    bind 127.0.0.1:8080\n    default_backend be\nbackend be\n    server s1 127.0.0.1:8081\n");
    let out = check(&[&a, &b]);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("Configuration file is valid"));
    assert!(
        !text(&out.stderr).contains("[WARNING]"),
        "defaults from a.cfg apply to b.cfg"
    );
}

#[test]
fn every_example_is_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("read examples/") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_none_or(|e| e != "cfg") {
            continue;
        }
        let out = check(&[&path]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: stderr:\n{}",
            path.display(),
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).contains("Configuration file is valid"),
            "{}: stdout:\n{}",
            path.display(),
            text(&out.stdout)
        );
        checked += 1;
    }
    assert!(
        checked >= 3,
        "expected at least demo, basic and full examples, found {checked}"
    );
}
