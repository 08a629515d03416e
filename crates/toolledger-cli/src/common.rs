//! Which ledger a command opens: the store flags every such command shares ([`StoreArgs`];
//! with [`DownstreamArgs`] as [`RuntimeStoreArgs`] for the reference demo's commands that
//! reach the payments stand-in; the operator commands name no demo and take the stand-in's
//! file from [`DOWNSTREAM_DB_ENV`] only), resolved once by
//! [`resolve`] into a [`StoreConfig`] that the command opens; and printing one JSON object.
//!
//! The flags are checked in two steps. The command-line parser refuses what can be said about
//! the flags alone (an unknown `--sqlite-synchronous` value; `--sqlite-synchronous` given, on
//! the command line or through its environment variable, together with `--database-url`),
//! with its usual message and exit 2. [`resolve`] then decides everything that depends on the
//! combination, without touching the disk or the network, and [`StoreConfig::open`] does the
//! I/O (and refuses a missing ledger when the command needs an existing one).

use std::path::{Path, PathBuf};

use serde_json::Value;
use toolledger::store::postgres::{PgOptions, PgStore};
use toolledger::store::sqlite::{CommitWait, OpenOptions, SqliteStore, Synchronous};
use toolledger::store::{Store, StoreError};

use toolledger_reference::ledger::{open_sqlite, sqlite_options};

use crate::exit::Failure;
use toolledger::store::StoreOptions;

/// The ledger flags of every command that opens the ledger.
#[derive(clap::Args, Debug, Clone)]
pub struct StoreArgs {
    /// SQLite database file (ignored with --database-url). Default: `toolledger/ledger.sqlite`
    /// in the platform data directory, whatever the working directory: e.g.
    /// ~/.local/share/toolledger/ledger.sqlite on Linux ($XDG_DATA_HOME/toolledger/… when
    /// that is set), ~/Library/Application Support/toolledger/ledger.sqlite on macOS.
    #[arg(long, env = DB_ENV, value_name = "PATH")]
    pub db: Option<PathBuf>,
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

/// The environment variable naming the payments stand-in's own SQLite file: the reference
/// server's refunds demo keeps its receipts there. The demo's commands also take it as
/// `--downstream-db`; the operator commands (`resolve`, `console`) name no demo and read only
/// this variable, so they find the receipts wherever the demo keeps them.
pub const DOWNSTREAM_DB_ENV: &str = "TOOLLEDGER_DOWNSTREAM_DB";

/// Where the payments stand-in keeps its receipts (the commands of the deferred runtime).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DownstreamArgs {
    /// The payments stand-in's own SQLite file (default: `<db>.downstream.sqlite` beside the
    /// ledger file, also with `--database-url`, where `--db` names no ledger but still places
    /// this file).
    #[arg(long, env = DOWNSTREAM_DB_ENV)]
    pub downstream_db: Option<PathBuf>,
}

impl DownstreamArgs {
    /// The stand-in's file as the environment names it ([`DOWNSTREAM_DB_ENV`]), for the
    /// operator commands, which take no flag for it.
    pub fn from_env() -> DownstreamArgs {
        DownstreamArgs {
            downstream_db: std::env::var_os(DOWNSTREAM_DB_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
        }
    }
}

/// The flags of the deferred runtime's commands: the ledger and the payments stand-in's file.
#[derive(clap::Args, Debug, Clone)]
pub struct RuntimeStoreArgs {
    /// The ledger.
    #[command(flatten)]
    pub store: StoreArgs,
    /// The payments stand-in's file.
    #[command(flatten)]
    pub downstream: DownstreamArgs,
}

impl RuntimeStoreArgs {
    /// [`resolve`] for a command of the deferred runtime.
    pub fn resolve(&self, access: Access) -> Result<StoreConfig, Failure> {
        resolve(&self.store, Some(&self.downstream), access)
    }
}

pub use toolledger_reference::ledger::SyncMode;

/// The environment variable that names the SQLite ledger when `--db` is not given.
pub const DB_ENV: &str = "TOOLLEDGER_DB";

/// The default SQLite ledger: `toolledger/ledger.sqlite` in the platform data directory
/// (`$XDG_DATA_HOME`, else `~/.local/share`, on Linux; `~/Library/Application Support` on
/// macOS), so a command finds the same ledger from any working directory; `None` when no such
/// directory can be determined (no home directory).
pub fn default_db_path() -> Option<PathBuf> {
    dirs::data_dir().map(|d| d.join("toolledger").join("ledger.sqlite"))
}

/// Creates `dir` and any missing parents, readable by the owner only on Unix (0700).
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// What a command needs of the ledger when it opens it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Open it, creating a new ledger when there is none; an older schema is refused
    /// (`SCHEMA_OUTDATED`).
    OpenOrCreate,
    /// Open an existing ledger only: a missing SQLite file is `DATABASE_NOT_FOUND` (a
    /// PostgreSQL server answers for itself); an older schema is refused.
    Existing,
    /// Create the ledger, or migrate an existing one forward (`toolledger migrate`).
    Migrate,
    /// Inspect an existing ledger read-only (`audit`, `operations`, `principal list`,
    /// `status --status-ref`): SQLite opens the file with `mode=ro` (or `immutable=1` when no
    /// write-ahead log exists) and creates no file; PostgreSQL runs read-only transactions.
    /// Nothing is created, migrated or added (not even the reference tools' tables); a
    /// missing SQLite file is `DATABASE_NOT_FOUND`, a file or schema that holds no ledger
    /// `NOT_A_LEDGER`, an older schema `SCHEMA_OUTDATED`.
    ReadOnly,
}

/// The database behind a [`StoreConfig`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file.
    Sqlite {
        /// The ledger file.
        path: PathBuf,
        /// The write connection's `synchronous` mode.
        synchronous: Synchronous,
    },
    /// A PostgreSQL database (its server's default schema).
    Postgres {
        /// The connection URL. It may carry a password: never print it.
        url: String,
    },
}

/// One command's resolved ledger: which database, bound to which backend id, opened how, and
/// where the files kept beside it are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// The database.
    pub backend: Backend,
    /// The backend id the database must be bound to; `None` adopts the existing binding.
    pub backend_id: Option<String>,
    /// What the command needs of the ledger.
    pub access: Access,
    /// `--db` (or `TOOLLEDGER_DB`, or [`default_db_path`]): the SQLite ledger, and with
    /// PostgreSQL still the place the defaults of the files kept beside the ledger derive
    /// from. Empty only with PostgreSQL when no default could be determined and the command
    /// keeps no file beside the ledger.
    pub db: PathBuf,
    /// The default location's directory when the command keeps a file there (no `--db`, no
    /// `TOOLLEDGER_DB`; the SQLite ledger, or on PostgreSQL a runtime command's payments
    /// stand-in without `--downstream-db`): created (0700 on Unix) before a command that may
    /// write opens the ledger.
    pub default_dir: Option<PathBuf>,
    /// The payments stand-in's own SQLite file.
    pub downstream: PathBuf,
    /// How long the SQLite writer may hold a small batch for more jobs (`None`: it commits
    /// at once). `proxy` sets [`CommitWait::PROXY`]; PostgreSQL ignores it.
    pub commit_wait: Option<CommitWait>,
}

/// Resolves the store flags of one command into its [`StoreConfig`]; `downstream` is `None`
/// for the commands without `--downstream-db` (their stand-in file is the default one).
///
/// Pure: nothing is opened or created. Refuses `--sqlite-synchronous normal` with
/// `--database-url` (`INVALID_ARGUMENTS`), which the command line already refuses when parsed,
/// and a SQLite ledger (or a payments stand-in's file placed beside it) that would need the
/// default location when there is none (`DATA_DIR_UNKNOWN`).
pub fn resolve(
    store: &StoreArgs,
    downstream: Option<&DownstreamArgs>,
    access: Access,
) -> Result<StoreConfig, Failure> {
    resolve_with(store, downstream, access, default_db_path)
}

/// [`resolve`] with the default location given by `default_db`.
fn resolve_with(
    store: &StoreArgs,
    downstream: Option<&DownstreamArgs>,
    access: Access,
    default_db: impl FnOnce() -> Option<PathBuf>,
) -> Result<StoreConfig, Failure> {
    let explicit_downstream = downstream.and_then(|d| d.downstream_db.clone());
    // The default is needed for a SQLite ledger, and for the payments stand-in's file of a
    // runtime command that does not name it; the other commands on PostgreSQL keep no file.
    let needs_db =
        store.database_url.is_none() || (downstream.is_some() && explicit_downstream.is_none());
    let (db, default_dir) = match &store.db {
        Some(db) => (db.clone(), None),
        None => match default_db() {
            Some(db) => {
                let dir = db.parent().map(Path::to_path_buf).filter(|_| needs_db);
                (db, dir)
            }
            None if needs_db => return Err(Failure::code("DATA_DIR_UNKNOWN")),
            None => (PathBuf::new(), None),
        },
    };
    let backend = match &store.database_url {
        Some(url) => {
            if store.sqlite_synchronous != SyncMode::Full {
                return Err(Failure::explained(
                    "INVALID_ARGUMENTS",
                    "--sqlite-synchronous applies to SQLite only",
                ));
            }
            Backend::Postgres { url: url.clone() }
        }
        None => Backend::Sqlite {
            path: db.clone(),
            synchronous: store.sqlite_synchronous.into(),
        },
    };
    let downstream = explicit_downstream.unwrap_or_else(|| {
        if db.as_os_str().is_empty() {
            PathBuf::new()
        } else {
            toolledger_reference::refunds::default_downstream_path(&db)
        }
    });
    Ok(StoreConfig {
        backend,
        backend_id: store.backend_id.clone(),
        access,
        db,
        default_dir,
        downstream,
        commit_wait: None,
    })
}

impl StoreArgs {
    /// [`resolve`] for a command without `--downstream-db`.
    pub fn resolve(&self, access: Access) -> Result<StoreConfig, Failure> {
        resolve(self, None, access)
    }

    /// [`resolve`] for an operator command that runs the deferred runtime (`resolve`,
    /// `console`): the payments stand-in's file is the one [`DOWNSTREAM_DB_ENV`] names, else
    /// the default beside the ledger.
    pub fn resolve_operator(&self, access: Access) -> Result<StoreConfig, Failure> {
        resolve(self, Some(&DownstreamArgs::from_env()), access)
    }
}

impl StoreConfig {
    /// Whether the ledger is PostgreSQL.
    pub fn is_postgres(&self) -> bool {
        matches!(self.backend, Backend::Postgres { .. })
    }

    /// The SQLite ledger file, which the server's key file sits beside; `None` on
    /// PostgreSQL, where the servers of a deployment share their keys through the
    /// environment.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Sqlite { path, .. } => Some(path),
            Backend::Postgres { .. } => None,
        }
    }

    /// Opens the ledger with the reference tables, as [`StoreConfig::access`] says.
    pub fn open(&self) -> Result<Store, Failure> {
        if self.access == Access::ReadOnly {
            return self.open_read_only();
        }
        let migrate = self.access == Access::Migrate;
        match &self.backend {
            Backend::Postgres { url } => {
                self.create_default_dir()?;
                Ok(open_postgres(url, self.backend_id.clone(), migrate)?)
            }
            Backend::Sqlite { path, synchronous } => {
                if self.access == Access::Existing {
                    match std::fs::metadata(path) {
                        Err(_) => return Err(Failure::code("DATABASE_NOT_FOUND")),
                        // An empty file is a ledger yet to be created: not for a command that
                        // needs an existing one.
                        Ok(m) if m.is_file() && m.len() == 0 => {
                            return Err(Failure::code("NOT_A_LEDGER"))
                        }
                        Ok(_) => {}
                    }
                }
                self.create_default_dir()?;
                let opts = sqlite_options(self.backend_id.clone(), migrate, *synchronous)
                    .with_commit_wait(self.commit_wait);
                Ok(SqliteStore::open(path, opts).map(Store::from)?)
            }
        }
    }
}

impl StoreConfig {
    /// Creates [`StoreConfig::default_dir`] when it is missing (0700 on Unix), for a command
    /// that may write. A `--db` in a missing directory is left alone: that is the caller's
    /// mistake to see (`DATABASE_IO_ERROR`), not a directory to make up.
    fn create_default_dir(&self) -> Result<(), Failure> {
        match &self.default_dir {
            Some(dir) if self.access != Access::ReadOnly && !dir.is_dir() => {
                create_private_dir(dir).map_err(|_| {
                    Failure::explained(
                        "DATABASE_IO_ERROR",
                        "the default ledger's directory (toolledger/ in the platform data \
                         directory) could not be created; pass --db PATH or set TOOLLEDGER_DB",
                    )
                })
            }
            _ => Ok(()),
        }
    }

    /// [`StoreConfig::open`] for [`Access::ReadOnly`].
    fn open_read_only(&self) -> Result<Store, Failure> {
        match &self.backend {
            Backend::Postgres { url } => {
                let opts = match self.backend_id.clone() {
                    Some(id) => PgOptions::new(id),
                    None => PgOptions::any_backend(),
                }
                .with_migrations(toolledger_reference::PG_MIGRATIONS)
                .with_read_only(true);
                Ok(PgStore::open(url, opts).map(Store::from)?)
            }
            Backend::Sqlite { path, .. } => {
                if !path.exists() {
                    return Err(Failure::code("DATABASE_NOT_FOUND"));
                }
                let opts = match self.backend_id.clone() {
                    Some(id) => OpenOptions::new(id),
                    None => OpenOptions::any_backend(),
                }
                .with_migrations(toolledger_reference::MIGRATIONS)
                .with_read_only(true);
                Ok(SqliteStore::open(path, opts).map(Store::from)?)
            }
        }
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
        .with_migrations(toolledger_reference::PG_MIGRATIONS)
        .allow_migrate(migrate);
    PgStore::open(url, opts).map(Store::from)
}

/// Opens the SQLite ledger `db` with the core and reference migrations (`synchronous=FULL`).
pub fn open_store(
    db: &Path,
    backend_id: Option<String>,
    migrate: bool,
) -> Result<SqliteStore, StoreError> {
    open_sqlite(db, backend_id, migrate, Synchronous::Full)
}

/// The value parser of a JSON-valued flag (`call --args`, `approve --arguments`, `resolve
/// --evidence`, …): the strict parser the ledger reads arguments with. A value that is not
/// JSON is refused by the command-line parser, so it is a usage error like any other
/// (`USAGE_ERROR`, exit 2, naming the flag), in every command alike.
pub fn json_value(text: &str) -> Result<Value, String> {
    toolledger::json::parse(text.as_bytes(), &toolledger::json::Limits::DEFAULT)
        .map_err(|e| format!("not valid JSON ({})", e.message))
}

/// [`json_value`] for a flag that takes a JSON object.
pub fn json_object(text: &str) -> Result<Value, String> {
    let value = json_value(text)?;
    if value.is_object() {
        Ok(value)
    } else {
        Err("expected a JSON object".into())
    }
}

/// The value parser of a flag naming a JSON file (`resolve --output-schema FILE`): its JSON,
/// read strictly. A file that cannot be read or holds no JSON is a usage error naming the
/// flag, never the path.
pub fn json_file(path: &str) -> Result<Value, String> {
    let bytes = std::fs::read(path).map_err(|_| "the file cannot be read".to_string())?;
    toolledger::json::parse(&bytes, &toolledger::json::Limits::DEFAULT)
        .map_err(|e| format!("the file is not valid JSON ({})", e.message))
}

/// Prints one JSON object on stdout.
pub fn print_json(value: &Value) {
    println!("{value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(url: Option<&str>, sync: SyncMode) -> StoreArgs {
        StoreArgs {
            db: Some(PathBuf::from("dir/ledger.sqlite")),
            database_url: url.map(str::to_string),
            backend_id: Some("sqlite:x".into()),
            sqlite_synchronous: sync,
        }
    }

    #[test]
    fn sqlite_is_the_default_and_carries_its_synchronous_mode() {
        let c = args(None, SyncMode::Normal)
            .resolve(Access::Existing)
            .unwrap();
        assert_eq!(
            c.backend,
            Backend::Sqlite {
                path: "dir/ledger.sqlite".into(),
                synchronous: Synchronous::Normal
            }
        );
        assert_eq!(c.sqlite_path(), Some(Path::new("dir/ledger.sqlite")));
        assert_eq!(c.backend_id.as_deref(), Some("sqlite:x"));
        assert_eq!(c.access, Access::Existing);
        assert_eq!(
            c.downstream,
            PathBuf::from("dir/ledger.sqlite.downstream.sqlite")
        );
    }

    #[test]
    fn a_database_url_selects_postgres_and_the_stand_in_still_follows_db() {
        let d = DownstreamArgs {
            downstream_db: Some("pay.sqlite".into()),
        };
        let a = args(Some("postgres://u@h/db"), SyncMode::Full);
        let c = resolve(&a, Some(&d), Access::Migrate).unwrap();
        assert!(c.is_postgres());
        assert_eq!(c.sqlite_path(), None);
        assert_eq!(c.downstream, PathBuf::from("pay.sqlite"));
        let c = resolve(&a, None, Access::OpenOrCreate).unwrap();
        assert_eq!(
            c.downstream,
            PathBuf::from("dir/ledger.sqlite.downstream.sqlite")
        );
    }

    #[test]
    fn a_sqlite_synchronous_mode_with_a_database_url_is_refused_without_the_url() {
        let a = args(Some("postgres://secret@h/db"), SyncMode::Normal);
        match a.resolve(Access::OpenOrCreate) {
            Err(Failure::Explained { code, message }) => {
                assert_eq!(code, "INVALID_ARGUMENTS");
                assert!(!message.contains("secret"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_existing_ledger_is_required_when_the_command_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = args(None, SyncMode::Full);
        let db = dir.path().join("missing.sqlite");
        a.db = Some(db.clone());
        a.backend_id = None;
        match a.resolve(Access::Existing).unwrap().open() {
            Err(Failure::Code(c)) => assert_eq!(c, "DATABASE_NOT_FOUND"),
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("opened a missing ledger"),
        }
        assert!(!db.exists(), "nothing was created");
        a.resolve(Access::OpenOrCreate).unwrap().open().unwrap();
        assert!(db.exists());
    }

    #[test]
    fn without_db_the_default_location_is_used_and_its_directory_created_private() {
        let dir = tempfile::tempdir().unwrap();
        let default = dir.path().join("data/toolledger/ledger.sqlite");
        let mut a = args(None, SyncMode::Full);
        a.db = None;
        a.backend_id = None;
        let c = resolve_with(&a, None, Access::ReadOnly, || Some(default.clone())).unwrap();
        assert_eq!(c.sqlite_path(), Some(default.as_path()));
        assert_eq!(c.default_dir.as_deref(), default.parent());
        assert_eq!(
            c.downstream,
            dir.path()
                .join("data/toolledger/ledger.sqlite.downstream.sqlite")
        );
        assert!(c.open().is_err(), "read-only opens no missing ledger");
        assert!(
            !default.parent().unwrap().exists(),
            "and creates no directory"
        );
        let c = resolve_with(&a, None, Access::OpenOrCreate, || Some(default.clone())).unwrap();
        c.open().unwrap();
        assert!(default.exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(default.parent().unwrap())
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700);
        }
    }

    #[test]
    fn no_default_location_is_refused_only_where_one_is_needed() {
        let mut a = args(None, SyncMode::Full);
        a.db = None;
        match resolve_with(&a, None, Access::OpenOrCreate, || None) {
            Err(Failure::Code(c)) => assert_eq!(c, "DATA_DIR_UNKNOWN"),
            other => panic!("{other:?}"),
        }
        // PostgreSQL keeps no file beside the ledger for a command without the stand-in ...
        a.database_url = Some("postgres://u@h/db".into());
        let c = resolve_with(&a, None, Access::OpenOrCreate, || None).unwrap();
        assert!(c.is_postgres());
        let c = resolve_with(&a, None, Access::OpenOrCreate, || {
            Some("/d/toolledger/ledger.sqlite".into())
        })
        .unwrap();
        assert_eq!(c.default_dir, None, "so it makes no directory");
        // ... while a runtime command's stand-in file needs a place, or --downstream-db.
        let none = DownstreamArgs::default();
        match resolve_with(&a, Some(&none), Access::OpenOrCreate, || None) {
            Err(Failure::Code(c)) => assert_eq!(c, "DATA_DIR_UNKNOWN"),
            other => panic!("{other:?}"),
        }
        let named = DownstreamArgs {
            downstream_db: Some("pay.sqlite".into()),
        };
        let c = resolve_with(&a, Some(&named), Access::OpenOrCreate, || None).unwrap();
        assert_eq!(c.downstream, PathBuf::from("pay.sqlite"));
    }
}
