//! The library half of the `toolledger` binary: the shared command plumbing (which ledger a
//! command opens, and the one exit path) and the fixtures, so the server, the demos and
//! integration tests use the same code. The reference tools live in `toolledger-reference`.

pub mod common;
pub mod exit;
pub mod fixture;
pub mod log_line;
pub mod log_sink;
pub mod prune;
pub mod telemetry;
