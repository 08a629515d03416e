//! toolledger-testkit: what every toolledger driver and server is tested with.
//!
//! - [`conformance`]: the driver conformance suite — every store-level behaviour of the
//!   ledger, written once, run against every driver ([`conformance_suite!`]);
//! - [`downstream`]: an offline stand-in for a downstream system (a payments service whose
//!   receipts live in their own SQLite file), idempotent under the ledger's key and able to
//!   answer status queries.
//!
//! PostgreSQL tests read `TOOLLEDGER_TEST_DATABASE_URL`; without it they are skipped with one
//! loud line, except under `TOOLLEDGER_CI`, where they fail.

#![warn(missing_docs)]

pub mod conformance;
pub mod downstream;
