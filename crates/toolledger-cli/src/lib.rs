//! The library half of the `toolledger` binary: the shared command plumbing (which ledger a
//! command opens, and the one exit path) and the reference tools, so the server, the demos
//! and integration tests use the same code.

pub mod common;
pub mod exit;
pub mod fixture;
pub mod reference;
