//! Map files as configuration reads them: the keys (`key`: `map_ip`
//! networks, `map_str`/`map_beg`/`map_dom` strings; `net`: IPv4/IPv6 prefixes),
//! the line format (key, then value) and the loader, with HAProxy's error texts.
//! Here so that `config` stays a leaf; `crate::maps` builds its runtime tables
//! from these entries (and re-exports the names where it always had them).

pub mod key;
pub mod net;

pub use key::{MapKey, MapKind};
pub use net::{BadIpKey, IpNet};

/// One line of a map file, its key already checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// The key, normalised.
    pub pattern: MapKey,
    pub key: String,
    pub value: String,
}

/// A map file that cannot be loaded; texts follow HAProxy's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapFileError {
    #[error("failed to open pattern file <{path}>")]
    Open { path: String },
    #[error("{err} at line {line} of file '{path}'")]
    BadKey {
        err: BadIpKey,
        line: usize,
        path: String,
    },
}

/// Read and check a map file whose keys are of kind `kind`.
pub fn load_file(path: &str, kind: MapKind) -> Result<Vec<FileEntry>, MapFileError> {
    let text = std::fs::read(path).map_err(|_| MapFileError::Open {
        path: path.to_string(),
    })?;
    parse_text_as(path, &String::from_utf8_lossy(&text), kind)
}

/// Split one map line into key and value: the key is the first word, the value the
/// rest of the line with surrounding blanks removed. `None` for blank and comment lines.
pub fn split_entry(line: &str) -> Option<(&str, &str)> {
    let line = line.trim_end_matches(['\r', '\n']).trim_start();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let end = line.find([' ', '\t']).unwrap_or(line.len());
    let (key, rest) = line.split_at(end);
    Some((key, rest.trim_matches([' ', '\t'])))
}

/// Parse the text of a `map_ip` file named `path` (for messages).
pub fn parse_text(path: &str, text: &str) -> Result<Vec<FileEntry>, MapFileError> {
    parse_text_as(path, text, MapKind::Ip)
}

/// Parse the text of a map file named `path` whose keys are of kind `kind`.
pub fn parse_text_as(
    path: &str,
    text: &str,
    kind: MapKind,
) -> Result<Vec<FileEntry>, MapFileError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Some((key, value)) = split_entry(line) else {
            continue;
        };
        let pattern = MapKey::parse(kind, key).map_err(|err| MapFileError::BadKey {
            err,
            line: i + 1,
            path: path.to_string(),
        })?;
        out.push(FileEntry {
            pattern,
            key: key.to_string(),
            value: value.to_string(),
        });
    }
    Ok(out)
}
