//! toolledger-testkit: what every toolledger driver and server is tested with.
//!
//! - [`conformance`]: the driver conformance suite — every store-level behaviour of the
//!   ledger, written once, run against every driver ([`conformance_suite!`]), one module per
//!   area;
//! - [`db`]: test databases — a fresh SQLite file or a fresh PostgreSQL schema, opened with the
//!   migrations a test needs — and the lock that keeps server restarts away from them;
//! - [`calls`]: builders for principals and inline calls;
//! - [`downstream`]: an offline stand-in for a downstream system (a payments service whose
//!   receipts live in their own SQLite file), idempotent under the ledger's key and able to
//!   answer status queries, and a wrapper counting the calls into it;
//! - [`reference`]: the reference domain's state as tests set it up — an order to refund and an
//!   approval recorded by `toolledger approve`;
//! - [`machine`]: what a test needs from the machine (an interpreter named by a variable, a
//!   program): without it the test skips loudly, except in CI, where it fails;
//! - [`mutate`]: random edits of a byte string, for property tests of what reads untrusted
//!   bytes;
//! - [`replies`]: a tool's result as an MCP client of a guarded server reads it;
//! - [`stdio`]: the one server spawner — a spawned stdio MCP server driven with raw JSON-RPC
//!   lines — and the reader of the `{"listening": URL}` line a server on HTTP prints;
//! - [`tools`]: tools for tests of what serves a tool rather than of business rules (a
//!   deferred tool over no business state);
//! - [`history`]: the history checker — what every client sent and saw against what the
//!   ledger and the effect tables hold (at most one effect per operation id, no acknowledged
//!   operation lost, no changed result, nothing undecided, audit passes);
//! - [`kill`]: the kill harness — supervised processes SIGKILLed at seeded random moments and
//!   started again, and clients that resend every unanswered call under the same operation id
//!   until it is definitive, recording into a history.
//!
//! PostgreSQL tests read `TOOLLEDGER_TEST_DATABASE_URL`; without it they are skipped with one
//! loud line, except under `TOOLLEDGER_CI`, where they fail.

#![warn(missing_docs)]

pub mod calls;
pub mod conformance;
pub mod db;
/// The payments service stand-in, which the reference domain ships (re-exported for tests).
pub use toolledger_reference::downstream;
pub mod history;
pub mod kill;
pub mod machine;
pub mod mutate;
pub mod reference;
pub mod replies;
pub mod stdio;
pub mod tools;
