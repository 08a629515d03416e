//! Test databases: a fresh SQLite file in a temporary directory ([`SqliteFile`]) or a fresh
//! schema of its own in the test PostgreSQL database ([`PgSchema`]), opened with whatever
//! migrations a test needs. The conformance [`Harness`](crate::conformance::Harness) and the
//! workspace's driver tests all open their databases through these.
//!
//! PostgreSQL tests read [`DATABASE_URL_ENV`]; without it they are skipped with one loud line
//! on stderr, except under [`CI_ENV`], where they fail. Every [`PgSchema`] holds the
//! [`ServerLock`] shared, so a test that restarts the server (holding it exclusively) never
//! hits another test's database.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};
use std::time::Duration;

use toolledger::effect::{EffectTx, RowExt};
use toolledger::store::postgres::{PgOptions, PgStore};
use toolledger::store::sqlite::{OpenOptions, SqliteStore};
use toolledger::store::StoreOptions;
use toolledger::store::{Migration, Store, StoreError};

/// The environment variable naming the PostgreSQL server tests use.
pub const DATABASE_URL_ENV: &str = "TOOLLEDGER_TEST_DATABASE_URL";

/// When set, PostgreSQL tests fail instead of skipping without a database URL.
pub const CI_ENV: &str = "TOOLLEDGER_CI";

/// The lock file tests that restart the PostgreSQL server hold exclusively; every PostgreSQL
/// test database holds it shared, so a restart never hits another test's database.
pub const SERVER_LOCK_PATH: &str = "/tmp/toolledger-test-postgres.lock";

/// A held `flock` on [`SERVER_LOCK_PATH`] (released on drop).
#[derive(Debug)]
pub struct ServerLock {
    _file: std::fs::File,
}

impl ServerLock {
    /// Takes the lock, shared or exclusive, waiting as long as it takes.
    pub fn acquire(exclusive: bool) -> std::io::Result<ServerLock> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(SERVER_LOCK_PATH)?;
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::io::AsRawFd;
            let op = if exclusive {
                libc::LOCK_EX
            } else {
                libc::LOCK_SH
            };
            // SAFETY: a valid open file descriptor and a plain flock operation.
            if unsafe { libc::flock(file.as_raw_fd(), op) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = exclusive;
        Ok(ServerLock { _file: file })
    }
}

/// The version of the one local PostgreSQL cluster (`/etc/postgresql/VERSION`).
fn cluster_version() -> Option<String> {
    std::fs::read_dir("/etc/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
}

/// Whether the local PostgreSQL server accepts connections on 127.0.0.1:5432 (`pg_isready`).
pub fn server_answers() -> bool {
    std::process::Command::new("pg_isready")
        .args(["-h", "127.0.0.1", "-p", "5432", "-q"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn pg_ctlcluster(action: &str) -> Result<(), String> {
    let version = cluster_version().ok_or("no PostgreSQL cluster in /etc/postgresql")?;
    let status = std::process::Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", action])
        .status()
        .map_err(|e| format!("pg_ctlcluster does not run: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("pg_ctlcluster {action} failed: {status}"))
    }
}

/// Restarts the local PostgreSQL server (`pg_ctlcluster --skip-systemctl-redirect VERSION
/// main restart`). Only for a test holding the [`ServerLock`] exclusively, with a
/// [`RestoreServer`] alive.
pub fn restart_server() -> Result<(), String> {
    pg_ctlcluster("restart")
}

/// Starts the local PostgreSQL server again, whatever happened to the test, when dropped
/// (waiting up to 60 s until it answers).
#[derive(Debug)]
pub struct RestoreServer;

impl Drop for RestoreServer {
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !server_answers() && std::time::Instant::now() < deadline {
            let _ = pg_ctlcluster("start");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

static SKIP_NOTICE: Once = Once::new();

/// The PostgreSQL URL tests use; `None` (after one loud line on stderr) when unset outside CI.
/// Panics when unset in CI.
pub fn test_database_url() -> Option<String> {
    match std::env::var(DATABASE_URL_ENV) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            if std::env::var_os(CI_ENV).is_some() {
                panic!("{DATABASE_URL_ENV} is not set in CI: PostgreSQL tests cannot be skipped");
            }
            SKIP_NOTICE.call_once(|| {
                // Straight to the stderr handle: the test harness does not capture it.
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "!!! PostgreSQL tests SKIPPED: set {DATABASE_URL_ENV}=postgres://user@host:port/db to run them !!!"
                );
            });
            None
        }
    }
}

/// A fresh random schema name (`tl_` + 16 hex digits).
pub fn fresh_schema_name() -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("randomness");
    format!("tl_{}", hex::encode(b))
}

/// `url` with one more query parameter (`name=value`).
pub fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// A schema of its own (`tl_<random>`) in the test PostgreSQL database, dropped with
/// everything in it when this value is dropped.
#[derive(Debug)]
pub struct PgSchema {
    url: String,
    schema: String,
    _lock: Option<ServerLock>,
}

impl PgSchema {
    /// A fresh schema, holding the [`ServerLock`] shared; `None` when PostgreSQL tests are
    /// skipped (see [`test_database_url`]).
    pub fn new() -> Option<PgSchema> {
        let url = test_database_url()?;
        Some(PgSchema {
            url,
            schema: fresh_schema_name(),
            _lock: Some(ServerLock::acquire(false).expect("test server lock")),
        })
    }

    /// Like [`PgSchema::new`], for a test that already holds the server lock exclusively (it
    /// restarts the server).
    pub fn while_holding(_exclusive: &ServerLock) -> Option<PgSchema> {
        let url = test_database_url()?;
        Some(PgSchema {
            url,
            schema: fresh_schema_name(),
            _lock: None,
        })
    }

    /// The test database's URL (without the schema).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The schema's name.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Options for a handle on this schema bound to `backend_id` (`None`: adopt whatever the
    /// schema is bound to), with `migrations` on top of the ledger's own.
    pub fn options(&self, backend_id: Option<&str>, migrations: &[Migration]) -> PgOptions {
        let opts = match backend_id {
            Some(id) => PgOptions::new(id),
            None => PgOptions::any_backend(),
        };
        opts.with_migrations(migrations)
            .in_schema(self.schema.clone())
    }

    /// Opens a new handle with `opts` (from [`PgSchema::options`]).
    pub fn open(&self, opts: PgOptions) -> Result<Store, StoreError> {
        PgStore::open(&self.url, opts).map(Store::from)
    }

    /// Opens a new handle with `opts` whose sessions carry `application_name = app`, so a test
    /// can find (and kill) them in `pg_stat_activity`. Panics when the open fails.
    pub fn open_as(&self, app: &str, opts: PgOptions) -> Store {
        let url = with_param(&self.url, &format!("application_name={app}"));
        Store::from(PgStore::open(&url, opts).expect("open the test schema"))
    }

    /// The URL another process (e.g. the `toolledger` binary) uses to reach this schema
    /// (`options=-c search_path=…`).
    pub fn session_url(&self) -> String {
        with_param(
            &self.url,
            &format!("options=-c%20search_path%3D{}", self.schema),
        )
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let opts = PgOptions::any_backend().in_schema(self.schema.clone());
        if let Ok(s) = PgStore::open_unchecked(&self.url, opts) {
            let _ = s.drop_schema_blocking();
        }
    }
}

/// A SQLite database file in a temporary directory of its own (removed when the last clone is
/// dropped). The file does not exist until the first [`SqliteFile::open`].
#[derive(Clone, Debug)]
pub struct SqliteFile {
    dir: Arc<tempfile::TempDir>,
    path: PathBuf,
}

impl SqliteFile {
    /// A fresh temporary directory for the file `file_name`.
    pub fn new(file_name: &str) -> SqliteFile {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join(file_name);
        SqliteFile {
            dir: Arc::new(dir),
            path,
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The temporary directory holding it (room for files of the test's own).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Options for a handle bound to `backend_id` (`None`: adopt whatever the file is bound
    /// to), with `migrations` on top of the ledger's own.
    pub fn options(backend_id: Option<&str>, migrations: &[Migration]) -> OpenOptions {
        let opts = match backend_id {
            Some(id) => OpenOptions::new(id),
            None => OpenOptions::any_backend(),
        };
        opts.with_migrations(migrations)
    }

    /// Opens a new handle with `opts` (from [`SqliteFile::options`]).
    pub fn open_with(&self, opts: OpenOptions) -> Result<SqliteStore, StoreError> {
        SqliteStore::open(&self.path, opts)
    }

    /// Opens a new handle bound to `backend_id` with `migrations` on top of the ledger's own.
    /// Panics when the open fails.
    pub fn open(&self, backend_id: &str, migrations: &[Migration]) -> SqliteStore {
        self.open_with(SqliteFile::options(Some(backend_id), migrations))
            .expect("open the test database file")
    }

    /// A plain connection on the side of the ledger (reads behind its back, tampering), that
    /// waits up to five seconds for the write lock.
    pub fn side(&self) -> rusqlite::Connection {
        let c = rusqlite::Connection::open(&self.path).expect("a side connection");
        c.busy_timeout(Duration::from_secs(5))
            .expect("busy timeout");
        c
    }

    /// The integer one query answers, read on a [`sqlite_read_only`] connection.
    pub fn scalar(&self, sql: &str) -> i64 {
        sqlite_scalar(&self.path, sql)
    }

    /// The rows of `table`, counted on a [`sqlite_read_only`] connection.
    pub fn count(&self, table: &str) -> i64 {
        sqlite_count(&self.path, table)
    }
}

/// A read-only connection to the SQLite file at `path` (a ledger or a stand-in's own file,
/// read from outside whatever writes it), waiting up to five seconds on a busy database.
/// Panics when the file does not open.
pub fn sqlite_read_only(path: &Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap_or_else(|e| panic!("open {} read-only: {e}", path.display()));
    c.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    c
}

/// The integer one query (without parameters) answers, read on a [`sqlite_read_only`]
/// connection to the SQLite file at `path`.
pub fn sqlite_scalar(path: &Path, sql: &str) -> i64 {
    sqlite_read_only(path)
        .query_row(sql, [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Counts the rows of `table` in the SQLite file at `path` ([`sqlite_scalar`]).
pub fn sqlite_count(path: &Path, table: &str) -> i64 {
    sqlite_scalar(path, &format!("SELECT count(*) FROM {table}"))
}

/// The integer one query (without parameters) answers, read in one snapshot of `store`.
pub async fn scalar(store: &Store, sql: &str) -> i64 {
    let sql = sql.to_string();
    store
        .read(move |tx: &mut dyn EffectTx| tx.query_opt(&sql, &[])?.expect("a row").int(0))
        .await
        .expect("a scalar")
}

/// Counts the rows of `table` in one snapshot of `store`.
pub async fn count(store: &Store, table: &str) -> i64 {
    scalar(store, &format!("SELECT count(*) FROM {table}")).await
}

/// [`scalar`] for synchronous code: read on a thread of its own, so a caller inside a tokio
/// runtime may use it too.
pub fn scalar_blocking(store: &Store, sql: &str) -> i64 {
    let (store, sql) = (store.clone(), sql.to_string());
    std::thread::spawn(move || {
        store
            .read_blocking(move |tx: &mut dyn EffectTx| {
                tx.query_opt(&sql, &[])?.expect("a row").int(0)
            })
            .expect("a scalar")
    })
    .join()
    .expect("the reading thread")
}

/// The text one query (without parameters) answers, read in one snapshot of `store`; `None`
/// when it answers no row, or NULL.
pub async fn opt_text(store: &Store, sql: &str) -> Option<String> {
    let sql = sql.to_string();
    store
        .read(
            move |tx: &mut dyn EffectTx| match tx.query_opt(&sql, &[])? {
                Some(row) => row.opt_text(0),
                None => Ok(None),
            },
        )
        .await
        .expect("a text or nothing")
}

/// The integer one query (without parameters) answers, read in one snapshot of `store`;
/// `None` when it answers no row, or NULL.
pub async fn opt_int(store: &Store, sql: &str) -> Option<i64> {
    let sql = sql.to_string();
    store
        .read(
            move |tx: &mut dyn EffectTx| match tx.query_opt(&sql, &[])? {
                Some(row) => row.opt_int(0),
                None => Ok(None),
            },
        )
        .await
        .expect("an integer or nothing")
}

/// Runs `sql`, statements without parameters (DDL, tampering with stored rows, changing a
/// test's business state), in one write transaction of `store`. Panics when it fails.
pub async fn execute_batch(store: &Store, sql: &str) {
    let sql = sql.to_string();
    store
        .write(move |tx: &mut dyn EffectTx| tx.execute_batch(&sql))
        .await
        .expect("the SQL batch");
}
