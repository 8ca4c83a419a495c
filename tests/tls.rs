//! TLS termination (placeholder until the tests land in this branch).
