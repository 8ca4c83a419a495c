//! shunt integration test helpers.
