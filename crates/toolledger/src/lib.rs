//! toolledger: a durable ledger for side-effecting tool calls.
//!
//! A retry replays, it never repeats. A lost reply becomes a status query, never a second
//! effect. An effect that may have happened without a receipt is `outcome_unknown` until it is
//! reconciled.
//!
//! This is the crate applications depend on. It re-exports the ledger (`toolledger-core`) and
//! the database drivers behind cargo features — `sqlite` (default, the embedded store) and
//! `postgres` — and opens either from one string with [`Ledger::open`]:
//!
//! ```no_run
//! # async fn demo() -> Result<(), toolledger::store::StoreError> {
//! let ledger = toolledger::Ledger::open("ledger.sqlite")?; // or "postgres://…"
//! let clock = std::sync::Arc::new(toolledger::clock::SystemClock);
//! let engine = toolledger::engine::Engine::new(ledger.store(), clock);
//! # let _ = engine; Ok(()) }
//! ```
//!
//! See `ARCHITECTURE.md` for the map of the workspace.

#![warn(missing_docs)]

pub use toolledger_core::{
    approval, audit, authz, clock, digest, downstream, effect, engine, json, model, operations,
    outbox, prune, runtime,
};
pub use toolledger_core::{Error, ErrorCode, OperationState, Principal, Scope, ToolContract};

/// Durable storage: the backend-neutral [`Store`](store::Store), its errors, migrations of your
/// own tables, and the drivers. What a driver implements is in [`driver`].
pub mod store {
    pub use toolledger_core::store::{
        migrate, Migration, QueueLimits, SharedOptions, Store, StoreError, StoreErrorKind,
        StoreOptions,
    };

    /// The embedded SQLite driver (feature `sqlite`, on by default).
    #[cfg(feature = "sqlite")]
    pub use toolledger_sqlite as sqlite;

    /// The PostgreSQL driver (feature `postgres`).
    #[cfg(feature = "postgres")]
    pub use toolledger_postgres as postgres;
}

/// For driver authors: the seam a database driver implements ([`Driver`](driver::Driver), its
/// jobs and the batch writer's transaction) and the metric handles the drivers share.
/// Applications do not need it: they open a ledger with [`Ledger::open`] or a driver's own
/// constructor and hand its [`Store`](store::Store) to the engine.
pub mod driver {
    pub use toolledger_core::metric;
    pub use toolledger_core::store::{
        database_error_code, queue_full, queue_wait_expired, AppliedRow, BackgroundRefused,
        BackgroundWork, BatchDriver, BatchJob, BatchTx, BatchWriter, Driver, OperationRow, ReadJob,
        ScopeKey, WriteJob,
    };
}

mod ledger;

pub use ledger::{is_postgres_url, Ledger, LedgerOptions};
