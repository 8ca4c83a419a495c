//! Transcript tests: HAProxy 2.6's real CLI sessions (tests/testdata/haproxy-2.6-cli/, a
//! copy of shared/reference/haproxy-2.6-cli/) replayed against shunt, answer by answer.
//!
//! Each transcript file is a sequence of `$ echo 'CMD' | socat ...` exchanges captured
//! against one HAProxy with `haproxy.cfg` (frontend `fe`, backend `b`, servers `s1`/`s2`,
//! the string map `be.map`). A fresh shunt with the equivalent configuration replays the
//! file's commands in order, so state-changing commands (weights, maintenance, map edits)
//! leave the same state for the answers that follow. Answers are compared by *shape*:
//! every run of digits becomes `9` and every `0x…` pointer `0x_`, so counters, ports,
//! ages and addresses may differ but headers, column lists, field names, framing (the
//! empty line that ends each answer) and error strings must match exactly.
//!
//! Per command the comparison is one of [`Policy`]: exact lines (the default), the
//! reference's keys as a prefix of ours (`show info`, typed output: shunt appends its own
//! fields), the CSV header and row keys (`show stat`), or per-line prefixes where the
//! payload is shunt's own (`show sess`). Commands outside shunt's scope are skipped
//! with the reason, listed in [`SKIPPED`]; a skipped command that shunt starts to
//! support shows up as a stale skip (the test checks the reasons are not "not yet").

use std::path::{Path, PathBuf};

use shunt_tests::*;

const DATA: &str = "testdata/haproxy-2.6-cli";
/// The reference's map path, replaced by the test's own copy.
const REF_MAP: &str = "/run/haproxy/be.map";
/// HAProxy 2.6 numbers user maps after its two built-in ACL references (`#0`, `#1`), so
/// the reference's only map is `#2`; shunt's is `#0`.
const REF_MAP_ID: &str = "#2";
const OUR_MAP_ID: &str = "#0";

/// Commands the replay does not compare, and why. Matched as prefixes of the command.
const SKIPPED: &[(&str, &str)] = &[
    ("show table", "no stick tables in shunt"),
    (
        "show errors",
        "no protocol error capture in a TCP-only proxy",
    ),
    ("show acl", "no ACLs in shunt"),
    (
        "show tasks",
        "HAProxy debugging command, not in the CLI issue",
    ),
    (
        "show threads",
        "HAProxy debugging command, not in the CLI issue",
    ),
    (
        "expert-mode",
        "HAProxy debugging modes, not in the CLI issue",
    ),
    (
        "experimental-mode",
        "HAProxy debugging modes, not in the CLI issue",
    ),
    (
        "show sess 0x",
        "names a flow of the HAProxy session (its pointer)",
    ),
    (
        "shutdown session 0x56537e054a80",
        "names a flow of the HAProxy session",
    ),
    (
        "add map #0",
        "#0 is one of HAProxy's built-in ACL references, not a map",
    ),
];

/// How an answer is compared (after shape normalisation, see [`shape`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// Same number of lines, each equal.
    Lines,
    /// `Key: value` or typed (`…:TAGS:type:value`) lines: the reference's keys, in its
    /// order, are a prefix of ours (shunt appends its own fields at the end).
    KeysPrefix,
    /// `show stat` CSV: the header's first 103 columns equal, the same rows (pxname,
    /// svname) in the same order, each row with at least that many fields.
    Csv,
    /// `show sess`: one line per flow, each `0x…: proto=… src=… fe=… be=… srv=…`.
    Sess,
    /// `show info json`: the same field names in the same order (ours may add more).
    Json,
    /// `show version`: one non-empty line (HAProxy's is Debian's package version).
    OneLine,
    /// `show profiling`: the header lines equal; the task rows name shunt's own tasks,
    /// so each row is checked for the table's fixed width instead.
    Profiling,
    /// `show map ID`: one `0x… key value` line per entry. The transcripts are not a
    /// complete record of the HAProxy session (entries were added between captures),
    /// so the entries themselves are checked by tests/maps.rs, not here.
    MapDump,
}

fn policy(cmd: &str) -> Policy {
    let c = cmd.trim();
    if c == "show info json" {
        Policy::Json
    } else if c.starts_with("show info") || (c.starts_with("show stat") && c.contains("typed")) {
        Policy::KeysPrefix
    } else if c.starts_with("show stat") {
        Policy::Csv
    } else if c == "show version" {
        Policy::OneLine
    } else if c.starts_with("show profiling") {
        Policy::Profiling
    } else if c.starts_with("show activity") {
        Policy::KeysPrefix
    } else if c == "show sess" {
        Policy::Sess
    } else if c.starts_with("show map ") || c.starts_with("add map") && c.contains("show map") {
        Policy::MapDump
    } else {
        Policy::Lines
    }
}

/// One exchange of a transcript: the command line as sent and the answer's lines.
#[derive(Debug)]
struct Exchange {
    cmd: String,
    answer: Vec<String>,
}

/// Parse a transcript file. Files captured with `cat -A`-style line ends mark each
/// answer line with a trailing `$`; the others hold the lines as they are.
fn parse(text: &str) -> Vec<Exchange> {
    let dollar = text
        .lines()
        .any(|l| l.ends_with('$') && !l.starts_with("$ "));
    let mut out = Vec::new();
    let mut cur: Option<Exchange> = None;
    for line in text.lines() {
        if let Some(ex) = cur.as_mut() {
            if line.starts_with("[exit=") {
                out.extend(cur.take());
                continue;
            }
            let l = if dollar {
                line.strip_suffix('$').unwrap_or(line)
            } else {
                line
            };
            ex.answer.push(l.to_owned());
        } else if let Some(cmd) = command_of(line) {
            cur = Some(Exchange {
                cmd,
                answer: Vec::new(),
            });
        }
    }
    out
}

/// The CLI input of a `$ echo '…' | socat` or `$ printf '…' | socat` line.
fn command_of(line: &str) -> Option<String> {
    let rest = line
        .strip_prefix("$ echo '")
        .map(|r| (r, false))
        .or_else(|| line.strip_prefix("$ printf '").map(|r| (r, true)))?;
    let (body, printf) = rest;
    let end = body.find("' |")?;
    let cmd = &body[..end];
    Some(if printf {
        cmd.replace("\\n", "\n").trim_end_matches('\n').to_owned()
    } else {
        cmd.to_owned()
    })
}

/// Shape of a line: digit runs become `9`, `0x…` pointers `0x_`.
fn shape(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'0' && i + 2 < b.len() + 1 && b.get(i + 1) == Some(&b'x') {
            let mut j = i + 2;
            while j < b.len() && b[j].is_ascii_hexdigit() {
                j += 1;
            }
            if j > i + 2 {
                out.push_str("0x_");
                i = j;
                continue;
            }
        }
        if b[i].is_ascii_digit() {
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            out.push('9');
            continue;
        }
        let ch = line[i..].chars().next().unwrap_or('?');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// The key part of a `Key: value` or typed line (everything before the value).
fn key_of(line: &str) -> String {
    if let Some((k, _)) = line.split_once(": ") {
        return k.to_owned();
    }
    // Typed: `F.pos.name.proc:TAGS:type:value` (info) or `S.…` (stat).
    let mut parts = line.splitn(4, ':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(a), Some(b), Some(c)) => format!("{a}:{b}:{c}"),
        _ => line.to_owned(),
    }
}

/// Split an answer into the answers of its `;`-separated commands: each ends with
/// its empty line (no answer holds an empty line inside).
fn segments(lines: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    for l in lines {
        cur.push(l.clone());
        if l.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Compare the answer to a command line, command by command when both answers split
/// into one answer per command, else as a whole.
fn compare_line(cmd: &str, theirs: &[String], ours: &[String]) -> Result<(), String> {
    let cmds: Vec<&str> = cmd.split(';').collect();
    let (ts, os) = (segments(theirs), segments(ours));
    if cmds.len() > 1 && ts.len() == cmds.len() && os.len() == cmds.len() {
        for ((c, t), o) in cmds.iter().zip(&ts).zip(&os) {
            compare(policy(c), t, o).map_err(|e| format!("in '{}': {e}", c.trim()))?;
        }
        return Ok(());
    }
    compare(policy(cmds.last().copied().unwrap_or(cmd)), theirs, ours)
}

/// HAProxy's answer to an unknown command: the first line, then suggestions in its
/// `  usage (padded) : description` layout. Which commands it suggests depends on the
/// command table (shunt has no ACL commands), so only the layout is compared.
fn is_suggestions(lines: &[String]) -> bool {
    lines.first().map(String::as_str)
        == Some("Unknown command, but maybe one of the following ones is a better match:")
}

fn suggestion_layout(lines: &[String]) -> Vec<bool> {
    lines
        .iter()
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(|l| l.starts_with("  ") && l.len() > 42 && &l[42..44] == ": ")
        .collect()
}

/// Field names of a `show info json` answer, in order.
fn json_names(lines: &[String]) -> Vec<String> {
    let text = lines.join("\n");
    text.split("\"name\":\"")
        .skip(1)
        .filter_map(|p| p.split('"').next().map(str::to_owned))
        .collect()
}

/// Compare one answer; `Err` explains the first difference.
fn compare(policy: Policy, theirs: &[String], ours: &[String]) -> Result<(), String> {
    if is_suggestions(theirs) {
        if !is_suggestions(ours) {
            return Err(format!(
                "expected HAProxy's unknown-command answer, got {ours:?}"
            ));
        }
        let (t, o) = (suggestion_layout(theirs), suggestion_layout(ours));
        if t.len() != o.len() || o.iter().any(|ok| !ok) {
            return Err(format!(
                "suggestion lines of another layout:\n  {theirs:?}\n  {ours:?}"
            ));
        }
        return Ok(());
    }
    let (t, o): (Vec<String>, Vec<String>) = (
        theirs.iter().map(|l| shape(l)).collect(),
        ours.iter().map(|l| shape(l)).collect(),
    );
    // Framing first: both end with exactly one empty line.
    if o.last().map(String::as_str) != Some("") {
        return Err("shunt's answer does not end with an empty line".into());
    }
    match policy {
        Policy::Lines => {
            if t != o {
                return Err(format!("lines differ:\n  HAProxy: {t:?}\n  shunt:   {o:?}"));
            }
        }
        Policy::KeysPrefix => {
            let tk: Vec<String> = t
                .iter()
                .filter(|l| !l.is_empty())
                .map(|l| key_of(l))
                .collect();
            let ok: Vec<String> = o
                .iter()
                .filter(|l| !l.is_empty())
                .map(|l| key_of(l))
                .collect();
            // HAProxy's keys, in its order, must be a subsequence of ours.
            let mut next = 0;
            for k in &ok {
                if next < tk.len() && *k == tk[next] {
                    next += 1;
                }
            }
            if next < tk.len() {
                return Err(format!(
                    "shunt's answer lacks '{}' (HAProxy's key {} of {}), or has it out of order",
                    tk[next],
                    next + 1,
                    tk.len()
                ));
            }
        }
        Policy::Csv => {
            let (Some(th), Some(oh)) = (t.first(), o.first()) else {
                return Err("no header".into());
            };
            if th.starts_with("# pxname") {
                let tc: Vec<&str> = th.split(',').take(103).collect();
                let oc: Vec<&str> = oh.split(',').take(103).collect();
                if tc != oc {
                    return Err(format!("CSV header differs:\n  {th}\n  {oh}"));
                }
                let rows = |v: &[String]| -> Vec<(String, usize)> {
                    v.iter()
                        .skip(1)
                        .filter(|l| !l.is_empty())
                        .map(|l| {
                            let f: Vec<&str> = l.split(',').collect();
                            (
                                f.iter().take(2).copied().collect::<Vec<_>>().join(","),
                                f.len(),
                            )
                        })
                        .collect()
                };
                let (tr, or) = (rows(&t), rows(&o));
                let names =
                    |r: &[(String, usize)]| r.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
                if names(&tr) != names(&or) {
                    return Err(format!(
                        "rows differ: HAProxy {:?}, shunt {:?}",
                        names(&tr),
                        names(&or)
                    ));
                }
                if let Some(short) = or.iter().find(|(_, n)| *n < 103) {
                    return Err(format!("row {} has only {} fields", short.0, short.1));
                }
            } else if t != o {
                // An error message instead of CSV.
                return Err(format!("lines differ:\n  HAProxy: {t:?}\n  shunt:   {o:?}"));
            }
        }
        Policy::OneLine => {
            if o.len() != 2 || o[0].is_empty() || t.len() != 2 {
                return Err(format!("expected one line: {o:?}"));
            }
        }
        Policy::Profiling => {
            let head = |v: &[String]| -> usize {
                v.iter()
                    .position(|l| l.trim_start().starts_with("function"))
                    .map_or(v.len(), |i| i + 1)
            };
            let (th, oh) = (head(&t), head(&o));
            if t[..th] != o[..oh] {
                return Err(format!(
                    "profiling header differs:\n  HAProxy: {:?}\n  shunt:   {:?}",
                    &t[..th],
                    &o[..oh]
                ));
            }
            if let Some(width) = ours[..oh].last().map(String::len) {
                if let Some(bad) = ours[oh..]
                    .iter()
                    .find(|l| !l.is_empty() && (l.len() != width || !l.starts_with("  ")))
                {
                    return Err(format!("task row not {width} wide: {bad:?}"));
                }
            }
        }
        Policy::Json => {
            let (tn, on) = (json_names(theirs), json_names(ours));
            if tn.is_empty() || on.len() < tn.len() || on[..tn.len()] != tn[..] {
                return Err(format!("JSON field names differ:\n  {tn:?}\n  {on:?}"));
            }
        }
        Policy::MapDump => {
            let entry = |l: &String| l.starts_with("0x_ ") && l.split(' ').count() >= 3;
            let bad: Vec<&String> = o.iter().filter(|l| !l.is_empty() && !entry(l)).collect();
            let t_entries = t.iter().any(entry);
            let o_entries = o.iter().any(entry);
            if (!bad.is_empty() || t_entries != o_entries) && t != o {
                return Err(format!("lines differ:\n  HAProxy: {t:?}\n  shunt:   {o:?}"));
            }
        }
        Policy::Sess if !t.iter().any(|l| l.starts_with("0x_")) => {
            if t != o {
                return Err(format!("lines differ:\n  HAProxy: {t:?}\n  shunt:   {o:?}"));
            }
        }
        Policy::Sess => {
            for l in o.iter().filter(|l| !l.is_empty()) {
                let fields = ["proto=", " src=", " fe=", " be=", " srv="];
                if !l.starts_with("0x_: ") || fields.iter().any(|f| !l.contains(f)) {
                    return Err(format!("show sess line of another shape: {l}"));
                }
            }
        }
    }
    Ok(())
}

struct Replay {
    shunt: Shunt,
    map: PathBuf,
    _servers: Vec<Server>,
    _maps: TempDir,
}

/// shunt with the reference configuration's equivalent: the string map on the
/// frontend (shunt keys string maps by the TLS server name), `b` with `s1`, `s2`.
fn start() -> Replay {
    let servers = vec![Server::echo(), Server::echo()];
    let maps = TempDir::new("transcripts");
    let map = maps.path().join("be.map");
    std::fs::copy(Path::new(DATA).join("be.map"), &map).expect("copy map");
    let cfg = format!(
        "global\n    nbthread 2\n    stats socket @DIR@/admin.sock level admin mode 600\n    \
         stats timeout 30s\n\ndefaults\n    mode tcp\n    timeout connect 5s\n    \
         timeout client 30s\n    timeout server 30s\n\nfrontend fe\n    bind 127.0.0.1:{}\n    \
         use_backend %[req.ssl_sni,map({},b)]\n    default_backend b\n\nbackend b\n    \
         balance roundrobin\n    server s1 {} check inter 2s\n    server s2 {} check inter 2s\n",
        free_port(),
        map.display(),
        servers[0].addr,
        servers[1].addr
    );
    let shunt = Shunt::start(&cfg, &[]);
    // The reference was captured with both checks passed: wait (bounded) for the
    // first check of each server (they start spread over one `inter`).
    let t0 = std::time::Instant::now();
    while ["s1", "s2"].iter().any(|s| {
        show_stat(&shunt.sock()).iter().all(|r| {
            r.get("svname").map(String::as_str) != Some(*s)
                || r.get("check_status").map(String::as_str) != Some("L4OK")
        })
    }) {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(15),
            "checks did not pass: {:?}",
            show_stat(&shunt.sock())
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Replay {
        shunt,
        map,
        _servers: servers,
        _maps: maps,
    }
}

fn skip_reason(cmd: &str) -> Option<&'static str> {
    cmd.split(';').map(str::trim).find_map(|c| {
        SKIPPED
            .iter()
            .find(|(p, _)| c.starts_with(p))
            .map(|(_, why)| *why)
    })
}

/// Replay one transcript file against `r`; returns (compared, skipped, failures).
fn replay(r: &Replay, file: &str) -> (usize, usize, Vec<String>) {
    let text = std::fs::read_to_string(Path::new(DATA).join(file)).expect("transcript");
    let map = r.map.display().to_string();
    let cfg_path = r.shunt.dir().join("shunt.cfg").display().to_string();
    let (mut compared, mut skipped, mut failures) = (0, 0, Vec::new());
    for ex in parse(&text) {
        if skip_reason(&ex.cmd).is_some() {
            skipped += 1;
            continue;
        }
        let cmd = ex
            .cmd
            .replace(REF_MAP, &map)
            .replace(REF_MAP_ID, OUR_MAP_ID);
        let ours: Vec<String> = cli(&r.shunt.sock(), &cmd)
            .replace(&cfg_path, "haproxy.cfg")
            .split('\n')
            .map(str::to_owned)
            .collect();
        // `cli` returns the raw answer: it ends with "\n\n", i.e. one empty line then
        // the end of input; drop that final piece.
        let ours = match ours.split_last() {
            Some((last, rest)) if last.is_empty() => rest.to_vec(),
            _ => ours,
        };
        let theirs: Vec<String> = ex.answer.iter().map(|l| l.replace(REF_MAP, &map)).collect();
        compared += 1;
        if let Err(e) = compare_line(&ex.cmd, &theirs, &ours) {
            failures.push(format!("{file}: '{}': {e}", ex.cmd));
        }
    }
    (compared, skipped, failures)
}

/// The transcripts in the order they were captured against one HAProxy: later files
/// see the state earlier ones left (a weight, a maxconn, map edits).
const FILES: [&str; 11] = [
    "01-show-info.txt",
    "03-show-servers-state.txt",
    "04-maps.txt",
    "07-server-state.txt",
    "08-show-activity.txt",
    "09-profiling.txt",
    "10-show-sess.txt",
    "13-misc.txt",
    "14-levels.txt",
    "19-severity-output.txt",
    "20-scheduler-misc.txt",
];

#[test]
fn transcript_parser_reads_both_line_end_conventions() {
    let plain =
        "$ echo 'show map #99' | socat stdio X\nUnknown map identifier.\n\n[exit=0]\n# note\n";
    let ex = parse(plain);
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0].cmd, "show map #99");
    assert_eq!(ex[0].answer, ["Unknown map identifier.", ""]);
    let dollar = "$ printf 'a\\nb\\n' | socat stdio X\nx$\n$\n[exit=0]\n";
    let ex = parse(dollar);
    assert_eq!(ex[0].cmd, "a\nb");
    assert_eq!(ex[0].answer, ["x", ""]);
    assert_eq!(shape("0x56537e172d80 127.0.0.1 b"), "0x_ 9.9.9.9 b");
    // The comparison can fail: a changed error string is caught.
    let t = vec!["No such server.".to_owned(), String::new()];
    let o = vec!["No such backend.".to_owned(), String::new()];
    assert!(compare(Policy::Lines, &t, &o).is_err());
    assert!(compare(Policy::Lines, &t, &t).is_ok());
    assert!(compare(Policy::Lines, &t, &t[..1]).is_err(), "framing");
}

#[test]
fn haproxys_sessions_replayed_in_order_have_the_same_shape() {
    let r = start();
    let mut failures = Vec::new();
    let mut counts = Vec::new();
    for f in FILES {
        let (c, s, fail) = replay(&r, f);
        assert!(c > 0, "{f}: no exchange compared");
        counts.push(format!("{f}: {c} compared, {s} skipped"));
        failures.extend(fail);
    }
    eprintln!("{}", counts.join("\n"));
    assert!(
        failures.is_empty(),
        "{} answers differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
