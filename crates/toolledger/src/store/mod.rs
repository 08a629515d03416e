//! Durable storage. Each backend commits the ledger's transactions with the same semantics;
//! [`sqlite`] is the embedded default.

pub mod sqlite;

use crate::model::{Error, ErrorCode};

/// A numbered schema migration. Migrations are grouped by `namespace` so a library, an
/// application and its reference tools can each own their tables; within a namespace versions
/// are applied in order, each exactly once.
#[derive(Clone, Copy, Debug)]
pub struct Migration {
    /// Owner of the migration, e.g. `toolledger` or `reference.issues`.
    pub namespace: &'static str,
    /// Version within the namespace, starting at 1 with no gaps.
    pub version: u32,
    /// The DDL to run (inside the bootstrap/migration transaction).
    pub sql: &'static str,
}

/// Why a store operation failed. Display strings are safe to show: no paths, no SQL.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database is busy, locked, unreachable or closed; the call may be retried.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The database belongs to another backend id.
    #[error("database is bound to another backend id")]
    BackendMismatch,
    /// The database has a schema newer than this program knows.
    #[error("database schema {namespace} v{found} is newer than supported v{supported}")]
    SchemaTooNew {
        /// Namespace of the offending migrations.
        namespace: String,
        /// Version found in the database.
        found: u32,
        /// Highest version this program knows.
        supported: u32,
    },
    /// The database has an older schema; run `toolledger migrate`.
    #[error(
        "database schema {namespace} v{found} is older than v{current}; run `toolledger migrate`"
    )]
    SchemaOutdated {
        /// Namespace of the outdated migrations.
        namespace: String,
        /// Version found in the database.
        found: u32,
        /// Version this program needs.
        current: u32,
    },
    /// The file is not a toolledger database (or is damaged).
    #[error("not a toolledger database or damaged: {0}")]
    Corrupt(String),
    /// Stored data violates the storage contract (non-canonical JSON, digest mismatch…).
    #[error("storage contract violated: {0}")]
    Contract(String),
    /// A constraint or trigger refused the write; the transaction was rolled back.
    #[error("write refused by the database: {0}")]
    Refused(String),
    /// The file lives on a network filesystem, where SQLite's WAL locking does not coordinate
    /// processes on different hosts. Use PostgreSQL for multi-host deployments.
    #[error("database file is on a network filesystem ({0}); use a local disk or PostgreSQL")]
    NetworkFilesystem(&'static str),
    /// The file could not be opened or created.
    #[error("database file could not be opened")]
    Io,
    /// Any other database error.
    #[error("database error")]
    Database(String),
}

impl StoreError {
    /// A stable upper-case code for CLI exit-2 output (`SQLITE_ERROR`, …).
    pub fn cli_code(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) => "STORE_UNAVAILABLE",
            StoreError::BackendMismatch => "BACKEND_MISMATCH",
            StoreError::SchemaTooNew { .. } => "SCHEMA_TOO_NEW",
            StoreError::SchemaOutdated { .. } => "SCHEMA_OUTDATED",
            StoreError::Corrupt(_) => "DATABASE_CORRUPT",
            StoreError::Contract(_) => "PERSISTENCE_CONTRACT_ERROR",
            StoreError::Refused(_) => "SQLITE_ERROR",
            StoreError::Io => "DATABASE_IO_ERROR",
            StoreError::NetworkFilesystem(_) => "NETWORK_FILESYSTEM",
            StoreError::Database(_) => "SQLITE_ERROR",
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(_) => Error::new(ErrorCode::Unavailable, "store unavailable"),
            other => Error::new(ErrorCode::Unavailable, other.to_string()),
        }
    }
}
