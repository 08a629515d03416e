//! The library half of the `toolledger` binary: the shared command plumbing (which ledger a
//! command opens, and the one exit path), its logs and metrics, so the commands and the
//! integration tests use the same code. The reference tools live in `toolledger-reference`,
//! the demos and the fixture format in `toolledger-demo`.

pub mod common;
pub mod exit;
/// The runtime fixture format (`toolledger.fixture/v1`) of `dispatch`, `status` and `approve`.
pub use toolledger_demo::fixture;
/// The buffered stderr of the log lines, and the secrets no line may show.
pub use toolledger_mcp::telemetry::log_sink;
pub mod prune;
pub mod telemetry;
