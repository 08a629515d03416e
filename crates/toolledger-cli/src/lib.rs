//! The library half of the `toolledger` binary: the shared command plumbing (which ledger a
//! command opens, and the one exit path), its logs and metrics, so the commands and the
//! integration tests use the same code. The reference tools live in `toolledger-reference`,
//! the demos and the fixture format in `toolledger-demo`.

pub mod common;
pub mod exit;
/// The runtime fixture format (`toolledger.fixture/v1`) of `dispatch`, `status` and `approve`.
pub use toolledger_demo::fixture;
pub mod log_line;
pub mod log_sink;
pub mod prune;
pub mod telemetry;
