//! A client of shunt's stats socket and the parsers of its answers, for the tests, the
//! demo and the bench.
//!
//! Owns: connecting with given timeouts (`connect`), one non-interactive command and
//! its answer read to EOF (`command`; `cli_command` with the demo's and bench's
//! bounds), `show stat` CSV parsed into rows by column name (`parse_show_stat`) and
//! `show info` into fields (`parse_show_info`, `info_num`).
//!
//! Invariants: an exchange never waits longer than its bounds say, nor reads more than
//! `Bounds::max_answer` bytes; a parse error names what was wrong (no header, too many
//! values, a field that is not a number) instead of yielding a figure.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

/// Bound of each way of a demo or bench exchange (connect, command, answer up to EOF).
const CLI_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer the demo or bench reads; their `show stat` is a few KiB.
const CLI_MAX_ANSWER: u64 = 4 << 20;

/// How long an exchange may block on each way, and how much of an answer is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Read timeout (None: wait as long as it takes).
    pub read: Option<Duration>,
    /// Write timeout (None: wait as long as it takes).
    pub write: Option<Duration>,
    /// Answer bytes read at most; the rest is left unread.
    pub max_answer: u64,
}

impl Bounds {
    /// The demo's and the bench's: 5 s each way, answers up to 4 MiB.
    pub const TOOL: Bounds = Bounds {
        read: Some(CLI_TIMEOUT),
        write: Some(CLI_TIMEOUT),
        max_answer: CLI_MAX_ANSWER,
    };

    /// `timeout` each way, the whole answer.
    pub const fn each_way(timeout: Duration) -> Bounds {
        Bounds {
            read: Some(timeout),
            write: Some(timeout),
            max_answer: u64::MAX,
        }
    }
}

/// A connection to the stats socket at `path` with these read and write timeouts
/// (None: none), for exchanges that are more than one command.
pub fn connect(path: &Path, read: Option<Duration>, write: Option<Duration>) -> Result<UnixStream> {
    let s = UnixStream::connect(path)
        .with_context(|| format!("cannot connect to the stats socket {}", path.display()))?;
    s.set_read_timeout(read)?;
    s.set_write_timeout(write)?;
    Ok(s)
}

/// Runs one command on a stats socket (non-interactive: the answer ends with EOF).
pub fn command(path: &Path, cmd: &str, bounds: Bounds) -> Result<String> {
    let mut s = connect(path, bounds.read, bounds.write)?;
    s.write_all(format!("{cmd}\n").as_bytes())
        .with_context(|| format!("stats socket {}: sending '{cmd}'", path.display()))?;
    let mut answer = String::new();
    s.take(bounds.max_answer)
        .read_to_string(&mut answer)
        .with_context(|| {
            format!(
                "stats socket {}: reading the answer to '{cmd}'",
                path.display()
            )
        })?;
    Ok(answer)
}

/// [`command`] with the demo's and the bench's bounds ([`Bounds::TOOL`]).
pub fn cli_command(path: &Path, cmd: &str) -> Result<String> {
    command(path, cmd, Bounds::TOOL)
}

/// One `show stat` row: column name → value (empty columns are present, as "").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatRow(pub BTreeMap<String, String>);

impl StatRow {
    /// The value of a column, "" when absent or empty.
    pub fn get(&self, column: &str) -> &str {
        self.0.get(column).map_or("", String::as_str)
    }

    /// A numeric column; absent or empty columns count as 0, garbage is an error.
    pub fn num(&self, column: &str) -> Result<u64> {
        match self.get(column) {
            "" => Ok(0),
            v => v.parse().with_context(|| {
                format!(
                    "show stat {}/{}: column {column} is '{v}', not a number",
                    self.get("pxname"),
                    self.get("svname")
                )
            }),
        }
    }
}

/// Parses `show stat` CSV: the `# pxname,svname,…` header, then one row per line.
pub fn parse_show_stat(csv: &str) -> Result<Vec<StatRow>> {
    let mut lines = csv.lines().filter(|l| !l.trim().is_empty());
    let header = lines
        .next()
        .and_then(|h| h.strip_prefix("# "))
        .with_context(|| format!("show stat: no '# pxname,…' header in {csv:?}"))?;
    let names: Vec<&str> = header.trim_end_matches(',').split(',').collect();
    ensure!(
        names.first() == Some(&"pxname") && names.get(1) == Some(&"svname"),
        "show stat: the header does not start with pxname,svname: {header:?}"
    );
    lines
        .map(|line| {
            let values: Vec<&str> = line.trim_end_matches(',').split(',').collect();
            ensure!(
                values.len() <= names.len(),
                "show stat: {} values for {} columns in {line:?}",
                values.len(),
                names.len()
            );
            Ok(StatRow(
                names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (n.to_string(), values.get(i).unwrap_or(&"").to_string()))
                    .collect(),
            ))
        })
        .collect()
}

/// Parses `show info`: `Name: value` lines (names may hold spaces, e.g. `Build info`).
pub fn parse_show_info(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// A numeric `show info` field; absent or garbage is an error naming the field.
pub fn info_num(info: &BTreeMap<String, String>, name: &str) -> Result<u64> {
    let v = info
        .get(name)
        .with_context(|| format!("show info has no '{name}' field"))?;
    v.parse()
        .with_context(|| format!("show info: {name} is '{v}', not a number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_stat_csv_parses_by_column_name() {
        let csv = "# pxname,svname,qcur,scur,stot,bin,bout,status,\n\
                   demo,FRONTEND,,1,10,123,456,OPEN,\n\
                   echo,echo1,0,0,5,100,,no check,\n\n";
        let rows = parse_show_stat(csv).expect("parse");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].get("svname"), "FRONTEND");
        assert_eq!(rows[0].num("bin").expect("bin"), 123);
        assert_eq!(rows[0].num("qcur").expect("empty is 0"), 0);
        assert_eq!(rows[1].get("status"), "no check");
        assert_eq!(rows[1].num("bout").expect("bout"), 0);
        assert!(rows[1].num("status").is_err());
        assert!(parse_show_stat("demo,FRONTEND\n").is_err(), "no header");
        assert!(
            parse_show_stat("# pxname,svname\na,b,c\n").is_err(),
            "too many values"
        );
    }

    #[test]
    fn show_info_parses_names_with_spaces() {
        let info = parse_show_info(
            "Name: shunt\nBuild info: 0.1.0\nSockmapFlows: 3\nBpf: not loaded: EPERM\n",
        );
        assert_eq!(info.get("Build info").map(String::as_str), Some("0.1.0"));
        assert_eq!(
            info.get("Bpf").map(String::as_str),
            Some("not loaded: EPERM")
        );
        assert_eq!(info_num(&info, "SockmapFlows").expect("n"), 3);
        assert!(info_num(&info, "Name").is_err());
        assert!(info_num(&info, "CopyFlows").is_err());
    }

    #[test]
    fn cli_command_sends_a_line_and_reads_to_eof() {
        let dir = std::env::temp_dir().join(format!("xtask-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().expect("accept");
            let mut line = Vec::new();
            let mut byte = [0u8; 1];
            while c.read(&mut byte).expect("read") == 1 && byte[0] != b'\n' {
                line.push(byte[0]);
            }
            c.write_all(format!("got {}\n\n", String::from_utf8_lossy(&line)).as_bytes())
                .expect("write");
        });
        let answer = cli_command(&path, "show info").expect("command");
        server.join().expect("server");
        assert_eq!(answer, "got show info\n\n");
        assert!(cli_command(&dir.join("absent.sock"), "show info").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
