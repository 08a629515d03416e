//! toolledger: a durable ledger for side-effecting tool calls.
//!
//! A retry replays, it never repeats. A lost reply becomes a status query, never a second
//! effect. An effect that may have happened without a receipt is `outcome_unknown` until it is
//! reconciled. See `ARCHITECTURE.md` for the map of this crate.

#![warn(missing_docs)]

pub mod approval;
pub mod authz;
pub mod clock;
pub mod digest;
pub mod downstream;
pub mod effect;
pub mod engine;
pub mod json;
pub mod model;
pub mod outbox;
pub mod runtime;
pub mod store;

pub use model::{Error, ErrorCode, OperationState, Principal, Scope, ToolContract};
