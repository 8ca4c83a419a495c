//! Configuration: HAProxy syntax (TCP subset) parsed, then validated, into an
//! immutable [`Config`].
//!
//! Pipeline: [`lexer`] splits lines into words, [`parse`] turns sections and
//! keywords into drafts, [`validate`] resolves names across proxies, runs the
//! cross-checks and builds the [`Config`]. Every error carries its file and
//! line where one exists, and all errors are collected, not just the first.
//! Library code never prints: the binary formats [`ConfigError`] and the
//! warning strings (`[ALERT]`/`[WARNING]` prefixes are its job).

pub mod acl;
mod addr;
mod lexer;
pub mod logspec;
pub mod mapfile;
mod model;
mod parse;
mod stick;
mod tls;
mod units;
mod validate;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_compat;
#[cfg(test)]
mod tests_stats;
#[cfg(test)]
mod tests_stick;

pub use lexer::MAX_LINE_ARGS;
pub use model::*;
pub use parse::MAX_MAXCONN;
pub use units::{parse_size, parse_time, UnitError, MAX_TIMER_MS};

use std::path::PathBuf;

/// A validated configuration and the warnings found on the way.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    /// HAProxy-style warning texts, without the `[WARNING] (pid) :` prefix.
    pub warnings: Vec<String>,
}

/// A configuration error. `Display` is the HAProxy-style message without the
/// `[ALERT] (pid) :` prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("no configuration file given (use -f <file>)")]
    NoFile,
    #[error("Cannot open configuration file/directory {path} : {reason}")]
    Open { path: String, reason: String },
    /// A line-level error: syntax, unknown keyword, bad value, or a cross-check
    /// that points at one line.
    #[error("parsing [{at}] : {msg}")]
    Parse { at: Location, msg: String },
    #[error("Parsing [{at}]: {kind} '{name}' has the same name as {prev_kind} '{name}' declared at {prev}.")]
    DuplicateProxy {
        at: Location,
        kind: &'static str,
        name: String,
        prev_kind: &'static str,
        prev: Location,
    },
    /// `rule` is `default_backend` or `use_backend`; `at` the line that names
    /// the backend (HAProxy's own message has no location; shunt adds it).
    #[error("parsing [{at}] : Proxy '{proxy}': unable to find required {rule}: '{target}'.")]
    UnknownBackend {
        at: Location,
        proxy: String,
        rule: &'static str,
        target: String,
    },
    /// `at`: the section's header line.
    /// A check of the whole configuration that HAProxy words without a
    /// location prefix (the location, if any, is in the message).
    #[error("{msg}")]
    Check { msg: String },
    /// A post-parse check of one line, HAProxy's `[file:line] : ...` form.
    #[error("[{at}] : {msg}")]
    At { at: Location, msg: String },
    #[error("parsing [{at}] : frontend '{name}' has no 'bind' directive. Please declare it as a backend if this was intended.")]
    NoBind { at: Location, name: String },
    /// A `src_*` fetch naming no table (HAProxy's wording, its location
    /// without the space before the colon).
    #[error("parsing [{at}]: unable to find table '{table}' referenced in arg 1 of ACL keyword '{keyword}' in proxy '{proxy}'.")]
    AclTable {
        at: Location,
        table: String,
        keyword: String,
        proxy: String,
    },
}

/// Reads `paths` in order and parses them as one configuration, like
/// `haproxy -f a.cfg -f b.cfg`. File names in messages are the paths as given.
pub fn load(paths: &[PathBuf]) -> Result<Loaded, Vec<ConfigError>> {
    if paths.is_empty() {
        return Err(vec![ConfigError::NoFile]);
    }
    let mut files = Vec::with_capacity(paths.len());
    let mut errors = Vec::new();
    for p in paths {
        let name = p.display().to_string();
        match std::fs::read_to_string(p) {
            Ok(text) => files.push((name, text)),
            Err(e) => errors.push(ConfigError::Open {
                path: name,
                reason: io_reason(&e),
            }),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    parse_files(&files, &|k| std::env::var(k).ok())
}

/// Parses one configuration held in memory; `name` is used as the file name
/// in messages. Environment variables are read from the process environment.
pub fn parse_str(name: &str, text: &str) -> Result<Loaded, Vec<ConfigError>> {
    parse_files(&[(name.to_string(), text.to_string())], &|k| {
        std::env::var(k).ok()
    })
}

/// The shared pipeline, with an injectable environment (tests).
fn parse_files(
    files: &[(String, String)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, Vec<ConfigError>> {
    let mut parser = parse::Parser::new(env);
    for (name, text) in files {
        parser.feed(name, text);
    }
    validate::build(parser)
}

/// The OS reason without Rust's " (os error N)" suffix, as HAProxy prints it.
fn io_reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}
