//! toolledger-core: the ledger without a database driver.
//!
//! A retry replays, it never repeats. A lost reply becomes a status query, never a second
//! effect. An effect that may have happened without a receipt is `outcome_unknown` until it is
//! reconciled.
//!
//! This crate holds the vocabulary ([`model`], [`clock`]), strict JSON and its canonical form
//! ([`json`]), the digests ([`digest`]), the inline path ([`engine`]), the deferred path
//! ([`runtime`], [`outbox`], [`approval`], [`downstream`]), the principal store ([`authz`]) and
//! the seam every database driver implements ([`store::Driver`], [`effect::EffectTx`]). Both
//! paths run over one internal `ledger` module, the only home of the `operations` table: its
//! columns and row decoder, its statements, the status-reference generator, the deadline
//! check, the event writer and the strict reader of stored JSON; operators read it through
//! [`operations`] (the list by state and age, one operation's timeline). The crate
//! knows no database library: the drivers are the `toolledger-sqlite` and
//! `toolledger-postgres` crates, and applications depend on the `toolledger` facade.

#![warn(missing_docs)]

pub mod approval;
pub mod audit;
pub mod authz;
pub mod clock;
pub mod digest;
pub mod downstream;
pub mod effect;
pub mod engine;
pub mod json;
pub mod key_ids;
mod ledger;
pub mod metric;
pub mod model;
pub mod operations;
pub mod outbox;
pub mod prune;
pub mod runtime;
pub mod store;
mod trace;

pub use model::{Error, ErrorCode, OperationState, Principal, Scope, ToolContract};
