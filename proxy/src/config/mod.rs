//! Configuration: HAProxy syntax (TCP subset) parsed, then validated, into an
//! immutable [`Config`]. (Parser pending.)

mod model;
pub use model::*;
