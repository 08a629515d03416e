//! Durable storage. Each backend commits the ledger's transactions with the same semantics;
//! [`sqlite`] is the embedded default, `postgres` (cargo feature `postgres`) serves many
//! hosts. [`Store`] is the backend-neutral handle the engine, the runtime and the principal
//! store run on: closures over an [`EffectTx`], so one piece of ledger code runs on both.
//! The `conformance` suite (cargo feature `conformance`) is what every backend must pass.

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod sqlite;

use crate::effect::{Dialect, EffectTx, SqliteEffectTx};
use crate::model::{Error, ErrorCode};
use sqlite::SqliteStore;

/// A backend-neutral handle to one ledger database. Cheap to clone.
///
/// - [`Store::write`] runs a closure in one write transaction and returns once it has
///   committed; returning `Err` rolls back everything the closure wrote. On SQLite the closure
///   runs on the writer thread in its own savepoint of a group-commit batch; on PostgreSQL in
///   its own `READ COMMITTED` transaction, run again (bounded) after a deadlock, a
///   serialization failure or a lost insert race — so write closures are `FnMut` and keep no
///   side effects outside the transaction.
/// - [`Store::read`] runs a closure in one read-only snapshot.
#[derive(Clone, Debug)]
pub enum Store {
    /// The embedded SQLite backend.
    Sqlite(SqliteStore),
    /// The PostgreSQL backend.
    #[cfg(feature = "postgres")]
    Postgres(postgres::PgStore),
}

impl From<SqliteStore> for Store {
    fn from(s: SqliteStore) -> Self {
        Store::Sqlite(s)
    }
}

#[cfg(feature = "postgres")]
impl From<postgres::PgStore> for Store {
    fn from(s: postgres::PgStore) -> Self {
        Store::Postgres(s)
    }
}

/// Runs `f` inside `BEGIN` … `COMMIT` on a SQLite read connection (one snapshot).
fn sqlite_snapshot<T, E>(
    conn: &rusqlite::Connection,
    f: impl FnOnce(&mut dyn EffectTx) -> Result<T, E>,
) -> Result<T, E>
where
    E: From<StoreError>,
{
    // Cached statements: a replay is a handful of statements, and parsing `BEGIN`/`COMMIT`
    // again on every call was a measurable share of it.
    let run = |sql: &str| conn.prepare_cached(sql).and_then(|mut s| s.execute([]));
    run("BEGIN").map_err(|e| E::from(sqlite::map_err(e)))?;
    let out = f(&mut SqliteEffectTx::new(conn));
    let _ = run("COMMIT");
    if !conn.is_autocommit() {
        let _ = run("ROLLBACK");
    }
    out
}

impl Store {
    /// The backend id the database is bound to.
    pub fn backend_id(&self) -> &str {
        match self {
            Store::Sqlite(s) => s.backend_id(),
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s.backend_id(),
        }
    }

    /// The SQL dialect of the backend.
    pub fn dialect(&self) -> Dialect {
        match self {
            Store::Sqlite(_) => Dialect::Sqlite,
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => Dialect::Postgres,
        }
    }

    /// The SQLite store, when this is one (for SQLite-only tools: `audit`'s file checks,
    /// benchmarks).
    pub fn as_sqlite(&self) -> Option<&SqliteStore> {
        match self {
            Store::Sqlite(s) => Some(s),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => None,
        }
    }

    /// Runs `f` in a write transaction and returns its result once committed (see the type's
    /// docs).
    pub async fn write<T, E, F>(&self, mut f: F) -> Result<T, E>
    where
        F: FnMut(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        match self {
            Store::Sqlite(s) => s.write(move |conn| f(&mut SqliteEffectTx::new(conn))).await,
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s.write(f).await,
        }
    }

    /// Blocking form of [`Store::write`]; never call it from async code.
    pub fn write_blocking<T, E, F>(&self, mut f: F) -> Result<T, E>
    where
        F: FnMut(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        match self {
            Store::Sqlite(s) => s.write_blocking(move |conn| f(&mut SqliteEffectTx::new(conn))),
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s.write_blocking(f),
        }
    }

    /// Runs `f` in one read-only snapshot.
    pub async fn read<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        match self {
            Store::Sqlite(s) => s.read(move |conn| sqlite_snapshot(conn, f)).await,
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s.read(f).await,
        }
    }

    /// Blocking form of [`Store::read`]; never call it from async code.
    pub fn read_blocking<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        match self {
            Store::Sqlite(s) => s.read_blocking(move |conn| sqlite_snapshot(conn, f)),
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s.read_blocking(f),
        }
    }
}

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
