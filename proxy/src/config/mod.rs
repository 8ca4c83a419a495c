//! Configuration: HAProxy syntax (TCP subset) parsed, then validated, into an
//! immutable [`Config`]. (Parser pending.)

mod model;
pub use model::*;

/// TEMPORARY stub (replaced by the parser).
pub struct Loaded { pub config: Config, pub warnings: Vec<String> }
pub fn load(_paths: &[std::path::PathBuf]) -> Result<Loaded, Vec<String>> { Err(vec!["parser pending".into()]) }
