//! Opening a SQLite ledger with the reference tables, as `toolledger serve`, the demos and the
//! benchmarks do.

use std::path::Path;

use toolledger::store::sqlite::{OpenOptions, SqliteStore, Synchronous};
use toolledger::store::StoreError;
use toolledger::store::StoreOptions;

/// SQLite's `synchronous` mode for a ledger file, as a command-line value
/// (`--sqlite-synchronous full|normal`).
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

/// Opens the SQLite ledger `db` with the core and reference migrations ([`crate::MIGRATIONS`]).
/// `backend_id` `None` accepts the file's own; `migrate` allows creating or upgrading it.
pub fn open_sqlite(
    db: &Path,
    backend_id: Option<String>,
    migrate: bool,
    synchronous: Synchronous,
) -> Result<SqliteStore, StoreError> {
    SqliteStore::open(db, sqlite_options(backend_id, migrate, synchronous))
}

/// The options [`open_sqlite`] opens with, for a caller that sets more of them.
pub fn sqlite_options(
    backend_id: Option<String>,
    migrate: bool,
    synchronous: Synchronous,
) -> OpenOptions {
    let opts = match backend_id {
        Some(id) => OpenOptions::new(id),
        None => OpenOptions::any_backend(),
    };
    opts.with_migrations(crate::MIGRATIONS)
        .allow_migrate(migrate)
        .with_synchronous(synchronous)
}
