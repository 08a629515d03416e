//! [`Ledger::open`]: one string picks the driver.

use crate::store::StoreOptions;
use crate::store::{Migration, Store, StoreError};

/// How [`Ledger::open_with`] opens a ledger database.
#[derive(Clone, Debug, Default)]
pub struct LedgerOptions {
    /// The backend id the database must be bound to; `None` adopts an existing binding and
    /// binds a new database to the driver's default id.
    pub backend_id: Option<String>,
    /// The application's own migrations for SQLite, applied after the ledger's.
    pub sqlite_migrations: Vec<Migration>,
    /// The same migrations in PostgreSQL's dialect.
    pub postgres_migrations: Vec<Migration>,
    /// Apply pending migrations to an existing database (a new one is always built to the
    /// current schema; an older one is refused without this).
    pub migrate: bool,
    /// PostgreSQL only: the schema the ledger lives in (created if missing).
    pub schema: Option<String>,
}

/// An open ledger database: the [`Store`] the engine, the runtime and the principal store
/// run on.
#[derive(Clone, Debug)]
pub struct Ledger {
    store: Store,
}

impl Ledger {
    /// Opens `target`: a `postgres://` or `postgresql://` URL selects PostgreSQL (feature
    /// `postgres`), anything else is a SQLite file path (feature `sqlite`, the default),
    /// created with the current schema when it does not exist.
    pub fn open(target: &str) -> Result<Self, StoreError> {
        Self::open_with(target, LedgerOptions::default())
    }

    /// [`Ledger::open`] with options.
    pub fn open_with(target: &str, opts: LedgerOptions) -> Result<Self, StoreError> {
        if is_postgres_url(target) {
            return open_postgres(target, opts);
        }
        open_sqlite(target, opts)
    }

    /// The store the ledger's components run on.
    pub fn store(&self) -> Store {
        self.store.clone()
    }
}

/// Whether [`Ledger::open`] takes `target` for a PostgreSQL URL (`postgres://` or
/// `postgresql://`) rather than a SQLite file path, with or without the `postgres` feature.
pub fn is_postgres_url(target: &str) -> bool {
    target.starts_with("postgres://") || target.starts_with("postgresql://")
}

impl From<Ledger> for Store {
    fn from(l: Ledger) -> Self {
        l.store
    }
}

#[cfg(feature = "postgres")]
fn open_postgres(url: &str, opts: LedgerOptions) -> Result<Ledger, StoreError> {
    use crate::store::postgres::{PgOptions, PgStore};
    let mut o = PgOptions::any_backend()
        .with_migrations(&opts.postgres_migrations)
        .allow_migrate(opts.migrate);
    o.shared.backend_id = opts.backend_id;
    o.schema = opts.schema;
    Ok(Ledger {
        store: PgStore::open(url, o)?.into(),
    })
}

#[cfg(not(feature = "postgres"))]
fn open_postgres(_url: &str, _opts: LedgerOptions) -> Result<Ledger, StoreError> {
    Err(StoreError::Database(
        "this build has no PostgreSQL driver (cargo feature `postgres`)".into(),
    ))
}

#[cfg(feature = "sqlite")]
fn open_sqlite(path: &str, opts: LedgerOptions) -> Result<Ledger, StoreError> {
    use crate::store::sqlite::{OpenOptions, SqliteStore};
    if opts.schema.is_some() {
        return Err(StoreError::Database(
            "a schema applies to PostgreSQL only".into(),
        ));
    }
    let mut o = OpenOptions::any_backend()
        .with_migrations(&opts.sqlite_migrations)
        .allow_migrate(opts.migrate);
    o.shared.backend_id = opts.backend_id;
    Ok(Ledger {
        store: SqliteStore::open(path, o)?.into(),
    })
}

#[cfg(not(feature = "sqlite"))]
fn open_sqlite(_path: &str, _opts: LedgerOptions) -> Result<Ledger, StoreError> {
    Err(StoreError::Database(
        "this build has no SQLite driver (cargo feature `sqlite`)".into(),
    ))
}
