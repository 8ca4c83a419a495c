//! balancing
