//! forwarding
