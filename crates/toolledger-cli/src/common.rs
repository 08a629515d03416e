//! Shared plumbing for the commands: opening the store, printing one JSON object, and the
//! stable exit-2 error shape.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{json, Value};
use toolledger::store::postgres::{PgOptions, PgStore};
use toolledger::store::sqlite::{OpenOptions, SqliteStore, Synchronous};
use toolledger::store::{Store, StoreError};

/// Options every command that opens a store accepts.
#[derive(clap::Args, Debug, Clone)]
pub struct StoreArgs {
    /// SQLite database file (ignored with --database-url).
    #[arg(long, default_value = "toolledger.sqlite")]
    pub db: PathBuf,
    /// PostgreSQL database (`postgres://user@host:port/db`) instead of the SQLite file; many
    /// servers and workers on many hosts may share it.
    #[arg(long, env = "TOOLLEDGER_DATABASE_URL", value_name = "URL")]
    pub database_url: Option<String>,
    /// Backend id the database must be bound to (default: adopt the existing binding; a new
    /// database is bound to `sqlite:default` or `postgres:default`).
    #[arg(long)]
    pub backend_id: Option<String>,
    /// How far a SQLite commit waits for the disk. `full` (default): an answered operation
    /// survives power failure. `normal`: faster commits; an answered operation survives a
    /// crash of the process but may be lost on power failure or an operating-system crash
    /// (see BENCHMARKS.md, "Durability"). SQLite only.
    #[arg(
        long,
        value_enum,
        default_value = "full",
        env = "TOOLLEDGER_SQLITE_SYNCHRONOUS",
        conflicts_with = "database_url"
    )]
    pub sqlite_synchronous: SyncMode,
}

/// `--sqlite-synchronous` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncMode {
    /// `synchronous=FULL`: every commit is flushed to the disk.
    #[default]
    Full,
    /// `synchronous=NORMAL`: commits are flushed at checkpoints only.
    Normal,
}

impl From<SyncMode> for Synchronous {
    fn from(m: SyncMode) -> Self {
        match m {
            SyncMode::Full => Synchronous::Full,
            SyncMode::Normal => Synchronous::Normal,
        }
    }
}

impl StoreArgs {
    /// Opens the store (SQLite file, or PostgreSQL with `--database-url`) with the reference
    /// tables; an older existing schema is migrated only when `migrate` is set (the `migrate`
    /// command), otherwise refused.
    pub fn open_with(&self, migrate: bool) -> Result<Store, StoreError> {
        match &self.database_url {
            Some(url) => open_postgres(url, self.backend_id.clone(), migrate),
            None => open_store_with(
                &self.db,
                self.backend_id.clone(),
                migrate,
                self.sqlite_synchronous.into(),
            )
            .map(Store::from),
        }
    }

    /// Whether the store is PostgreSQL (`--database-url` given).
    pub fn is_postgres(&self) -> bool {
        self.database_url.is_some()
    }

    /// Whether the store exists: always for PostgreSQL (the server answers for itself),
    /// otherwise whether the SQLite file does.
    pub fn exists(&self) -> bool {
        self.is_postgres() || self.db.exists()
    }
}

/// Opens the PostgreSQL database at `url` with the core and reference migrations.
pub fn open_postgres(
    url: &str,
    backend_id: Option<String>,
    migrate: bool,
) -> Result<Store, StoreError> {
    let mut opts = match backend_id {
        Some(id) => PgOptions::new(id),
        None => PgOptions::any_backend(),
    };
    opts = opts
        .with_migrations(crate::reference::PG_MIGRATIONS)
        .allow_migrate(migrate);
    PgStore::open(url, opts).map(Store::from)
}

/// Opens `db` with the core and reference migrations.
pub fn open_store(
    db: &Path,
    backend_id: Option<String>,
    migrate: bool,
) -> Result<SqliteStore, StoreError> {
    open_store_with(db, backend_id, migrate, Synchronous::Full)
}

/// [`open_store`] with the write connection's `synchronous` mode.
pub fn open_store_with(
    db: &Path,
    backend_id: Option<String>,
    migrate: bool,
    synchronous: Synchronous,
) -> Result<SqliteStore, StoreError> {
    let mut opts = match backend_id {
        Some(id) => OpenOptions::new(id),
        None => OpenOptions::any_backend(),
    };
    opts = opts
        .with_migrations(crate::reference::MIGRATIONS)
        .allow_migrate(migrate)
        .with_synchronous(synchronous);
    SqliteStore::open(db, opts)
}

/// Prints one JSON object on stdout.
pub fn print_json(value: &Value) {
    println!("{value}");
}

/// Prints `{"error":{"code":CODE}}` on stderr and returns exit code 2. `code` must be a stable,
/// path-free identifier.
pub fn fail(code: &str) -> ExitCode {
    eprintln!("{}", json!({"error": {"code": code}}));
    ExitCode::from(2)
}

/// [`fail`] for a store error.
pub fn fail_store(e: &StoreError) -> ExitCode {
    fail(e.cli_code())
}
