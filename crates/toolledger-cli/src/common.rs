//! Shared plumbing for the commands: opening the store, printing one JSON object, and the
//! stable exit-2 error shape.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{json, Value};
use toolledger::store::sqlite::{OpenOptions, SqliteStore};
use toolledger::store::StoreError;

/// Options every command that opens a store accepts.
#[derive(clap::Args, Debug, Clone)]
pub struct StoreArgs {
    /// SQLite database file.
    #[arg(long, default_value = "toolledger.sqlite")]
    pub db: PathBuf,
    /// Backend id the database must be bound to (default: adopt the existing binding; a new
    /// file is bound to `sqlite:default`).
    #[arg(long)]
    pub backend_id: Option<String>,
}

impl StoreArgs {
    /// Opens the store with the reference tables; an older existing schema is migrated only
    /// when `migrate` is set (the `migrate` command), otherwise refused.
    pub fn open_with(&self, migrate: bool) -> Result<SqliteStore, StoreError> {
        open_store(&self.db, self.backend_id.clone(), migrate)
    }
}

/// Opens `db` with the core and reference migrations.
pub fn open_store(
    db: &Path,
    backend_id: Option<String>,
    migrate: bool,
) -> Result<SqliteStore, StoreError> {
    let mut opts = match backend_id {
        Some(id) => OpenOptions::new(id),
        None => OpenOptions::any_backend(),
    };
    opts = opts
        .with_migrations(crate::reference::MIGRATIONS)
        .allow_migrate(migrate);
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
