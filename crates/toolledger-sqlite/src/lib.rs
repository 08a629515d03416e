//! The embedded SQLite backend.
//!
//! One dedicated writer thread owns the only write connection and is fed through a channel; a
//! small pool of read connections serves replays and status queries. Writes from concurrent
//! callers are gathered into one `BEGIN IMMEDIATE` transaction (group commit); a failing caller
//! rolls back alone (the batch runs again with each caller's work in its own `SAVEPOINT`, see
//! `run_batch`); every caller is answered only after the batch's `COMMIT` has returned.
//!
//! Every connection runs with `journal_mode=WAL`, `synchronous=FULL`, `foreign_keys=ON` and
//! `busy_timeout=5000`; the write connection may be opened with `synchronous=NORMAL` instead
//! ([`Synchronous::Normal`], an opt-in that gives up durability on power failure). A batch
//! whose every job need not wait for the disk ([`WriteJob::waits_for_disk`]) commits without
//! the flush; the next batch that waits carries it. The file is bound to a backend id in `store_metadata`; opening it with
//! another id, or with a schema newer than this program knows, is refused — the policy is
//! core's [`migrate::run`], which this driver runs inside one `BEGIN IMMEDIATE` transaction.
//!
//! The store's own API takes closures over an [`EffectTx`] like every backend's; the one
//! escape hatch to a raw `rusqlite` connection, for tools that measure SQLite itself, is
//! [`raw`].

#![warn(missing_docs)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use toolledger_core::effect::{Dialect, EffectTx};
use toolledger_core::metric::{BatchSize, QueueDepth};
use toolledger_core::store::migrate::{self, Binding, MigrationHooks, MigrationRequest};
use toolledger_core::store::{
    queue_full, queue_wait_expired, BackgroundRefused, BackgroundWork, Driver, Migration, ReadJob,
    Store, StoreError, WriteJob,
};

pub use toolledger_core::store::{QueueLimits, SharedOptions, StoreOptions};

mod driver;
mod effect_tx;
mod read_only;

pub use read_only::ReadMode;

/// Direct access to a SQLite file, for driver-specific tools only.
///
/// Everything the ledger does goes through [`Store`] over an [`EffectTx`], the same on every
/// backend. A few tools measure
/// or inspect SQLite itself and need a connection of their own: the benchmark that measures
/// the raw commit ceiling of the file, with the ledger's pragmas and without the ledger. This
/// module is that escape hatch; it is the only place a `rusqlite` type crosses the driver's
/// public API, and using it ties the caller to this driver and to `rusqlite`.
pub mod raw {
    use std::path::Path;

    use toolledger_core::store::StoreError;

    /// Opens a new connection to the file at `path` with the ledger's pragmas
    /// (`journal_mode=WAL`, `synchronous=FULL`, `foreign_keys=ON`, `busy_timeout=5000`). It is
    /// outside the store's writer and readers: its writes serialize with the store's through
    /// SQLite's file locks only, and it neither creates nor checks the ledger's schema.
    pub fn connect(path: &Path) -> Result<rusqlite::Connection, StoreError> {
        super::connect(path)
    }
}

use effect_tx::SqliteEffectTx;

/// The migrations of the library's own tables (namespace `toolledger`).
pub const CORE_MIGRATIONS: &[Migration] = &[
    Migration {
        namespace: "toolledger",
        version: 1,
        sql: include_str!("sql/sqlite_0001_core.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 2,
        sql: include_str!("sql/sqlite_0002_runtime.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 3,
        sql: include_str!("sql/sqlite_0003_keys.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 4,
        sql: include_str!("sql/sqlite_0004_operator_index.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 5,
        sql: include_str!("sql/sqlite_0005_retention.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 6,
        sql: include_str!("sql/sqlite_0006_receipt_ids.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 7,
        sql: include_str!("sql/sqlite_0007_replan_index.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 8,
        sql: include_str!("sql/sqlite_0008_replan_index_by_result.sql"),
    },
];

/// The backend id a new file gets when none is requested.
pub const DEFAULT_BACKEND_ID: &str = "sqlite:default";

/// Most jobs committed in one group-commit transaction.
pub const MAX_BATCH: usize = 128;

/// How far a commit of the write connection waits for the disk (SQLite's `synchronous`
/// pragma in WAL mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Synchronous {
    /// `synchronous=FULL`, the default: the write-ahead log is flushed to the disk (`fsync`)
    /// at every commit, so an operation answered as committed survives a crash of the process,
    /// of the operating system and a power failure.
    #[default]
    Full,
    /// `synchronous=NORMAL`: commits only write the log; it is flushed at checkpoints. An
    /// operation answered as committed survives a crash of the process (the log is in the
    /// operating system's cache), but a power failure or an operating-system crash may lose
    /// the operations committed since the last checkpoint — the database stays consistent, as
    /// if they had never been called, and a retry of one of them runs its effect again. Opt-in
    /// only; see BENCHMARKS.md ("Durability").
    Normal,
}

impl Synchronous {
    /// The pragma's value: `full` or `normal`.
    pub fn as_str(self) -> &'static str {
        match self {
            Synchronous::Full => "full",
            Synchronous::Normal => "normal",
        }
    }
}

/// How long the writer may hold a small batch for more jobs before it commits it (off unless
/// set): fewer, larger commits for a ledger whose jobs arrive one by one from independent
/// callers, as a proxy's do.
///
/// The writer waits only when the batch it took holds fewer than half the jobs of its largest
/// recent batch (the largest of the last one to two seconds). A writer busy enough to fill its
/// batches never waits, and neither does one serving a single caller. The wait ends when the
/// batch reaches that half, when no job arrived for [`CommitWait::gap`], or after
/// [`CommitWait::most`]; just after a burst, a lone caller's job may so wait one gap.
/// Nothing is answered before its commit, so durability is unchanged: only when a commit
/// happens moves. In front of an upstream on the same two cores, it cut a proxied call's CPU
/// by about a fifth at 32 calls in flight. It costs a writer whose few callers cycle through
/// it without pause, so it is for the proxy, not a default (BENCHMARKS.md, "What bounds the
/// proxy's fresh calls").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitWait {
    /// The longest a batch waits.
    pub most: Duration,
    /// The wait ends once no job arrived for this long.
    pub gap: Duration,
}

impl CommitWait {
    /// The wait `toolledger proxy` uses: at most 300 µs, ending at a 30 µs gap.
    pub const PROXY: CommitWait = CommitWait {
        most: Duration::from_micros(300),
        gap: Duration::from_micros(30),
    };
}

/// The writer's estimate of how many jobs a batch can hold: its largest batch of the current
/// and the previous window of [`RecentPeak::WINDOW`], so a burst is forgotten within two.
#[derive(Clone, Copy, Debug)]
struct RecentPeak {
    current: usize,
    previous: usize,
    since: Instant,
}

impl RecentPeak {
    const WINDOW: Duration = Duration::from_secs(1);

    fn new(now: Instant) -> Self {
        RecentPeak {
            current: 0,
            previous: 0,
            since: now,
        }
    }

    /// Counts a batch of `len` jobs taken at `now`.
    fn saw(&mut self, len: usize, now: Instant) {
        if now.saturating_duration_since(self.since) >= Self::WINDOW {
            self.previous = self.current;
            self.current = 0;
            self.since = now;
        }
        self.current = self.current.max(len);
    }

    /// Whether a batch of `len` jobs is small enough to wait for more: under half the peak.
    fn wants_more(&self, len: usize) -> bool {
        len > 0 && len < self.current.max(self.previous) / 2
    }
}

/// How to open a [`SqliteStore`]: the options every driver shares ([`SharedOptions`], set with
/// [`StoreOptions`]) and SQLite's own.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// The binding, migrations, read-only and queue bounds. A read-only open has no write
    /// connection and creates no file (see [`ReadMode`]); the queues are the writer's and the
    /// readers'. A new file without a backend id is bound to [`DEFAULT_BACKEND_ID`].
    pub shared: SharedOptions,
    /// Number of read connections kept in the pool.
    pub readers: usize,
    /// The write connection's `synchronous` mode ([`Synchronous::Full`] unless opted out).
    pub synchronous: Synchronous,
    /// Whether the writer may hold a small batch for more jobs ([`CommitWait`]); `None`, the
    /// default, commits at once.
    pub commit_wait: Option<CommitWait>,
}

impl StoreOptions for OpenOptions {
    fn shared_mut(&mut self) -> &mut SharedOptions {
        &mut self.shared
    }
}

impl OpenOptions {
    /// Options for `backend_id` with the core migrations only.
    pub fn new(backend_id: impl Into<String>) -> Self {
        Self::bound(Some(backend_id.into()))
    }

    /// Options that adopt whatever backend id an existing file is bound to.
    pub fn any_backend() -> Self {
        Self::bound(None)
    }

    fn bound(backend_id: Option<String>) -> Self {
        OpenOptions {
            shared: SharedOptions::new(backend_id),
            readers: 4,
            synchronous: Synchronous::Full,
            commit_wait: None,
        }
    }

    /// Sets the write connection's `synchronous` mode.
    pub fn with_synchronous(mut self, synchronous: Synchronous) -> Self {
        self.synchronous = synchronous;
        self
    }

    /// The same options with the writer's [`CommitWait`] (`None`: commit at once).
    pub fn with_commit_wait(mut self, wait: Option<CommitWait>) -> Self {
        self.commit_wait = wait;
        self
    }
}

/// What a write job hands back to the writer: whether its savepoint is kept, and how to answer
/// its caller once the batch's fate is known.
struct Pending {
    keep: bool,
    deliver: Box<dyn FnOnce(Option<StoreError>) + Send>,
}

/// A job of the crate's tests, run once on the writer's connection (or refused, `None`).
#[cfg(test)]
type OnceJob = Box<dyn FnOnce(Option<&Connection>) -> Pending + Send>;

/// Work for the writer thread.
enum Job {
    /// A job of the crate's tests, given the writer's connection itself, in a savepoint of
    /// its own.
    #[cfg(test)]
    Once(OnceJob),
    /// The ledger's jobs ([`WriteJob`]): they may run again after a rollback, and answer
    /// with their last run.
    Again(Box<dyn WriteJob>),
    /// Background work ([`BackgroundWork`]), done a step at a time by the writer.
    Background(Box<dyn BackgroundWork>),
}

impl Job {
    /// Runs the job on `conn` (or, with `None`, only prepares its refusal).
    fn start(self, conn: Option<&Connection>) -> Pending {
        match self {
            #[cfg(test)]
            Job::Once(job) => job(conn),
            Job::Background(work) => Pending {
                keep: false,
                deliver: Box::new(move |err| {
                    work.finish(Some(
                        err.unwrap_or_else(|| StoreError::Unavailable("not run".into())),
                    ))
                }),
            },
            Job::Again(mut job) => {
                let keep = match conn {
                    Some(conn) => job.run(&mut SqliteEffectTx::new(conn) as &mut dyn EffectTx),
                    None => false,
                };
                let ran = conn.is_some();
                Pending {
                    keep,
                    deliver: Box::new(move |err| {
                        let err = match (ran, err) {
                            (false, None) => Some(StoreError::Unavailable("batch failed".into())),
                            (_, err) => err,
                        };
                        job.finish(err)
                    }),
                }
            }
        }
    }

    /// Answers the job with `err` without running it (nothing was written).
    fn refuse(self, err: StoreError) {
        (self.start(None).deliver)(Some(err));
    }
}

/// The most snapshot jobs one reader runs in one read transaction.
const MAX_SHARED_SNAPSHOT: usize = 8;

/// Work queued for the reader threads: a job run in a read snapshot. Jobs that wait in the
/// queue together may share one snapshot (see [`reader_loop`]).
type ReadWork = Box<dyn ReadJob>;

/// A job in a queue, with when it was queued (see [`QueueLimits::wait`]).
type Queued<J> = (Instant, J);

/// The reader threads behind the store's reads, started on the first read.
#[derive(Default)]
struct ReaderThreads {
    sender: Option<crossbeam_channel::Sender<Queued<ReadWork>>>,
    handles: Vec<JoinHandle<()>>,
}

/// Counters kept by the writer thread since the store was opened (for benchmarks and tests
/// that check batching).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Write transactions the writer has started.
    pub batches: u64,
    /// Write jobs those transactions carried.
    pub jobs: u64,
    /// The most jobs one transaction carried.
    pub largest_batch: u64,
}

#[derive(Default)]
struct StatCounters {
    batches: AtomicU64,
    jobs: AtomicU64,
    largest_batch: AtomicU64,
    /// Whether background work was handed to the writer and is not over yet.
    background: std::sync::atomic::AtomicBool,
}

struct Inner {
    path: PathBuf,
    backend_id: String,
    sender: Mutex<Option<crossbeam_channel::Sender<Queued<Job>>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    max_readers: usize,
    stats: Arc<StatCounters>,
    reader_threads: Mutex<ReaderThreads>,
    /// How the connections read, when the store was opened read-only.
    read_only: Option<ReadMode>,
    /// The bounds of the writer's and the readers' queues.
    limits: QueueLimits,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut threads) = self.reader_threads.lock() {
            threads.sender.take();
            let me = std::thread::current().id();
            for handle in threads.handles.drain(..) {
                // The last handle may be dropped by a read job on a reader thread itself.
                if handle.thread().id() != me {
                    let _ = handle.join();
                }
            }
        }
        if let Ok(mut s) = self.sender.lock() {
            s.take();
        }
        if let Ok(mut w) = self.writer.lock() {
            if let Some(handle) = w.take() {
                // The last handle may be dropped by a write job on the writer thread itself
                // (a value it captured); the writer then ends when its channel closes.
                if handle.thread().id() != std::thread::current().id() {
                    let _ = handle.join();
                }
            }
        }
    }
}

/// A handle to one SQLite ledger file. Cheap to clone; the writer thread stops when the last
/// handle is dropped.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("backend_id", &self.inner.backend_id)
            .finish_non_exhaustive()
    }
}

/// Maps a SQLite error to a [`StoreError`] that keeps its kind and names SQLite, without SQL
/// text, values, constraint expressions or paths.
pub(crate) fn map_err(e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode as C;
    let failed = |reason: &str| StoreError::Failed {
        backend: Dialect::Sqlite,
        reason: reason.into(),
    };
    match &e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            C::DatabaseBusy | C::DatabaseLocked => {
                StoreError::Unavailable("database is busy".into())
            }
            // A full disk ends when space returns: the same call may simply be retried.
            C::DiskFull => StoreError::Unavailable("the disk is full".into()),
            C::CannotOpen | C::PermissionDenied | C::ReadOnly | C::SystemIoFailure => {
                StoreError::Io
            }
            C::NotADatabase => StoreError::NotALedger("file is not a database".into()),
            C::DatabaseCorrupt => StoreError::Corrupt("the database file is damaged".into()),
            C::ConstraintViolation => StoreError::Refused {
                backend: Dialect::Sqlite,
                reason: constraint_kind(f.extended_code).into(),
            },
            C::SchemaChanged => StoreError::Unavailable("the schema changed meanwhile".into()),
            _ => failed("database error"),
        },
        _ => failed("database error"),
    }
}

/// Which kind of constraint an extended `SQLITE_CONSTRAINT_*` code names.
fn constraint_kind(extended: std::os::raw::c_int) -> &'static str {
    use rusqlite::ffi;
    match extended {
        ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY => "unique constraint",
        ffi::SQLITE_CONSTRAINT_CHECK => "check constraint",
        ffi::SQLITE_CONSTRAINT_FOREIGNKEY => "foreign key constraint",
        ffi::SQLITE_CONSTRAINT_NOTNULL => "not-null constraint",
        ffi::SQLITE_CONSTRAINT_TRIGGER => "refused by a trigger",
        ffi::SQLITE_CONSTRAINT_DATATYPE => "a value of the wrong type",
        _ => "constraint violation",
    }
}

/// Names the network filesystem a filesystem magic number (from `statfs`) belongs to, if any.
pub fn network_filesystem_name(magic: i64) -> Option<&'static str> {
    match magic {
        0x6969 => Some("nfs"),
        0x517b => Some("smb"),
        0xff53_4d42 => Some("cifs"),
        0xfe53_4d42 => Some("smb2"),
        0x0102_1997 => Some("9p"),
        0x00c3_6400 => Some("ceph"),
        0x5346_414f => Some("afs"),
        0x6b41_4653 => Some("afs"),
        0x0bd0_0bd0 => Some("lustre"),
        0x4750_4653 => Some("gpfs"),
        0x7461_636f => Some("ocfs2"),
        0x0116_1970 => Some("gfs2"),
        _ => None,
    }
}

/// Detects whether the directory holding `path` is on a network filesystem.
#[cfg(target_os = "linux")]
pub fn detect_network_filesystem(path: &Path) -> Option<&'static str> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `buf` a properly sized out-parameter.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut buf) };
    if rc != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)]
    network_filesystem_name(buf.f_type as i64 & 0xffff_ffff)
}

/// Detects whether the directory holding `path` is on a network filesystem.
#[cfg(not(target_os = "linux"))]
pub fn detect_network_filesystem(_path: &Path) -> Option<&'static str> {
    None
}

/// Creates the database file at `path`, empty and readable by its owner only (mode 0600 on
/// Unix, whatever the umask), unless it exists: a ledger holds arguments and results in plain
/// text. SQLite gives the write-ahead log and shared-memory files it creates beside it the
/// same mode. A path SQLite reads as a URI or `:memory:` is left alone.
pub fn create_private_file(path: &Path) -> std::io::Result<()> {
    let text = path.to_string_lossy();
    if text.starts_with("file:") || text == ":memory:" || text.is_empty() {
        return Ok(());
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Opens a connection with the ledger's pragmas (creating the file, private, when missing).
pub(crate) fn connect(path: &Path) -> Result<Connection, StoreError> {
    create_private_file(path).map_err(|_| StoreError::Io)?;
    // Read from the file system, not through SQLite: a read before the switch to WAL changes
    // how a file on a read-only mount is opened.
    let new_file = std::fs::metadata(path).is_ok_and(|m| m.len() == 0);
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .map_err(|e| match map_err(e) {
        StoreError::Failed { .. } => StoreError::Io,
        other => other,
    })?;
    conn.busy_timeout(Duration::from_millis(5000))
        .map_err(map_err)?;
    // A new file gives the pages pruning frees back with `PRAGMA incremental_vacuum`. The
    // mode must be asked for before the switch to WAL writes the file's first page, and only
    // then: asked of an existing file, SQLite rewrites its header. An existing file keeps its
    // own mode until a `VACUUM` on a connection that asked for it (`toolledger prune
    // --vacuum`, through `raw::connect`).
    if new_file {
        conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL")
            .map_err(map_err)?;
    }
    // Switching to WAL can itself meet a busy file when several processes create it at once.
    let mut tries = 0;
    loop {
        match conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0)) {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => break,
            Ok(_) => return Err(StoreError::Corrupt("journal mode cannot be WAL".into())),
            Err(e) => {
                let err = map_err(e);
                if matches!(err, StoreError::Unavailable(_)) && tries < 50 {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                return Err(err);
            }
        }
    }
    conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;")
        .map_err(map_err)?;
    // Query planner stability: without it SQLite may mark a cached statement for
    // re-preparation whenever a newly bound value could change its plan (it did so on every
    // execution of the runtime's operation/intent join, most of a delivery's CPU). The ledger
    // has no statistics or partial indexes for bound values to matter.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .map_err(map_err)?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// The migration hooks over SQLite's bootstrap transaction.
struct SqliteMigrator<'t> {
    tx: &'t Connection,
}

impl MigrationHooks for SqliteMigrator<'_> {
    fn binding(&mut self) -> Result<Binding, StoreError> {
        let tables = |sql: &str| {
            self.tx
                .query_row(sql, [], |r| r.get::<_, i64>(0))
                .map_err(|e| match map_err(e) {
                    // A file SQLite cannot read a schema from is not a ledger.
                    StoreError::Failed { .. } => StoreError::Corrupt("unreadable schema".into()),
                    other => other,
                })
        };
        if tables(
            "SELECT count(*) FROM sqlite_schema WHERE type='table' AND name='store_metadata'",
        )? > 0
        {
            let bound = self
                .tx
                .query_row(
                    "SELECT value FROM store_metadata WHERE key='backend_id'",
                    [],
                    |r| r.get(0),
                )
                .optional()
                .map_err(map_err)?;
            return Ok(Binding::Bound(bound));
        }
        if tables("SELECT count(*) FROM sqlite_schema WHERE type='table'")? > 0 {
            return Ok(Binding::Foreign);
        }
        Ok(Binding::Empty)
    }

    fn bind(&mut self, backend_id: &str) -> Result<(), StoreError> {
        self.tx
            .execute_batch(
                "CREATE TABLE store_metadata(
                     key TEXT PRIMARY KEY NOT NULL,
                     value TEXT NOT NULL
                 ) STRICT;
                 CREATE TABLE schema_migrations(
                     namespace TEXT NOT NULL CHECK (length(namespace) BETWEEN 1 AND 64),
                     version INTEGER NOT NULL CHECK (version > 0),
                     PRIMARY KEY (namespace, version)
                 ) STRICT;",
            )
            .map_err(map_err)?;
        self.tx
            .execute(
                "INSERT INTO store_metadata(key, value)
                 VALUES ('backend_id', ?1), ('backend', 'sqlite')",
                [backend_id],
            )
            .map_err(map_err)?;
        Ok(())
    }

    fn applied_versions(&mut self) -> Result<Vec<(String, u32)>, StoreError> {
        let mut stmt = self
            .tx
            .prepare("SELECT namespace, version FROM schema_migrations")
            .map_err(map_err)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .map_err(map_err)?;
        rows.map(|row| {
            let (ns, v) = row.map_err(map_err)?;
            let v = u32::try_from(v).map_err(|_| {
                StoreError::Corrupt("a recorded migration version is out of range".into())
            })?;
            Ok((ns, v))
        })
        .collect()
    }

    fn apply(&mut self, migration: &Migration) -> Result<(), StoreError> {
        self.tx.execute_batch(migration.sql).map_err(map_err)
    }

    fn record(&mut self, migration: &Migration) -> Result<(), StoreError> {
        self.tx
            .execute(
                "INSERT INTO schema_migrations(namespace, version) VALUES (?1, ?2)",
                rusqlite::params![migration.namespace, migration.version],
            )
            .map(|_| ())
            .map_err(map_err)
    }
}

/// Binds and migrates the file in one `BEGIN IMMEDIATE` transaction (so two processes opening
/// a new file at once do not race), by the policy of [`migrate::run`].
fn bootstrap(conn: &mut Connection, opts: &OpenOptions) -> Result<String, StoreError> {
    let mut all: Vec<Migration> = CORE_MIGRATIONS.to_vec();
    all.extend(opts.shared.migrations.iter().copied());
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(map_err)?;
    let report = migrate::run(
        &mut SqliteMigrator { tx: &tx },
        &MigrationRequest {
            backend_id: opts.shared.backend_id.as_deref(),
            default_backend_id: DEFAULT_BACKEND_ID,
            migrations: &all,
            allow_migrate: opts.shared.migrate,
        },
    )?;
    tx.commit().map_err(map_err)?;
    Ok(report.backend_id)
}

impl SqliteStore {
    /// Opens (creating if needed) the ledger at `path`. Bootstrap and migrations run in one
    /// `BEGIN IMMEDIATE` transaction, so two processes opening a new file at once do not race.
    pub fn open(path: impl AsRef<Path>, opts: OpenOptions) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        if opts.shared.read_only {
            return read_only::open(path, &opts);
        }
        if let Some(fs) = detect_network_filesystem(&path) {
            return Err(StoreError::NetworkFilesystem(fs));
        }
        read_only::refuse_foreign(&path)?;
        let mut conn = connect(&path)?;
        let backend_id = bootstrap(&mut conn, &opts)?;
        // Each job of a group-commit batch runs in its own savepoint, whose sub-journal holds
        // the original of every page the job changes. SQLite keeps a sub-journal in memory only
        // up to 64 KiB and then spills it to a temporary file for the rest of the batch: a
        // `pwrite` per page changed, a tenth of a delivery's CPU. In memory, a batch's
        // sub-journal is bounded by the pages the batch changes (`MAX_BATCH` jobs).
        conn.execute_batch("PRAGMA temp_store = MEMORY;")
            .map_err(map_err)?;
        if opts.synchronous == Synchronous::Normal {
            conn.execute_batch("PRAGMA synchronous=NORMAL;")
                .map_err(map_err)?;
        }

        let limits = opts.shared.queue;
        let (sender, receiver) = crossbeam_channel::bounded::<Queued<Job>>(limits.depth.max(1));
        let stats = Arc::new(StatCounters::default());
        let writer_stats = stats.clone();
        let writer = std::thread::Builder::new()
            .name("toolledger-sqlite-writer".into())
            .spawn(move || {
                writer_loop(
                    conn,
                    receiver,
                    &writer_stats,
                    limits,
                    opts.synchronous,
                    opts.commit_wait,
                )
            })
            .map_err(|_| StoreError::Unavailable("cannot start writer thread".into()))?;

        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                backend_id,
                sender: Mutex::new(Some(sender)),
                writer: Mutex::new(Some(writer)),
                max_readers: opts.readers.max(1),
                stats,
                reader_threads: Mutex::new(ReaderThreads::default()),
                read_only: None,
                limits,
            }),
        })
    }

    /// The backend id the file is bound to.
    pub fn backend_id(&self) -> &str {
        &self.inner.backend_id
    }

    /// The database file path (for opening side connections in tests and tools; never shown to
    /// callers).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// What the writer thread has done since the store was opened.
    pub fn writer_stats(&self) -> WriterStats {
        let c = &self.inner.stats;
        WriterStats {
            batches: c.batches.load(Ordering::Relaxed),
            jobs: c.jobs.load(Ordering::Relaxed),
            largest_batch: c.largest_batch.load(Ordering::Relaxed),
        }
    }

    /// Write jobs submitted and not yet taken by the writer thread.
    pub fn queued_writes(&self) -> usize {
        match self.inner.sender.lock() {
            Ok(guard) => guard.as_ref().map_or(0, |s| s.len()),
            Err(_) => 0,
        }
    }

    /// Sends `job` to the writer; on failure hands it back with the reason.
    fn submit_job(&self, job: Job) -> Result<(), (StoreError, Job)> {
        if self.inner.read_only.is_some() {
            return Err((read_only::refused_write(), job));
        }
        let Ok(guard) = self.inner.sender.lock() else {
            return Err((StoreError::Unavailable("writer poisoned".into()), job));
        };
        match guard.as_ref() {
            Some(s) => {
                s.try_send((Instant::now(), job)).map_err(|e| match e {
                    crossbeam_channel::TrySendError::Full((_, job)) => (queue_full(), job),
                    crossbeam_channel::TrySendError::Disconnected((_, job)) => {
                        (StoreError::Unavailable("writer stopped".into()), job)
                    }
                })?;
                WRITER_QUEUE.set(s.len());
                Ok(())
            }
            None => Err((StoreError::Unavailable("store closed".into()), job)),
        }
    }

    /// Sends `job` to the reader threads (started on first use); on failure hands it back
    /// with the reason.
    fn submit_read_job(&self, job: ReadWork) -> Result<(), (StoreError, ReadWork)> {
        let Ok(mut threads) = self.inner.reader_threads.lock() else {
            return Err((StoreError::Unavailable("reader pool poisoned".into()), job));
        };
        if threads.sender.is_none() {
            let limits = self.inner.limits;
            let (sender, receiver) =
                crossbeam_channel::bounded::<Queued<ReadWork>>(limits.depth.max(1));
            let readers = self.inner.max_readers;
            for i in 0..readers {
                let receiver = receiver.clone();
                let path = self.inner.path.clone();
                let mode = self.inner.read_only;
                let spawned = std::thread::Builder::new()
                    .name(format!("toolledger-sqlite-reader-{i}"))
                    .spawn(move || reader_loop(&path, mode, receiver, limits, readers));
                match spawned {
                    Ok(handle) => threads.handles.push(handle),
                    Err(_) => {
                        let err = StoreError::Unavailable("cannot start reader thread".into());
                        return Err((err, job));
                    }
                }
            }
            threads.sender = Some(sender);
        }
        match threads.sender.as_ref() {
            Some(s) => {
                s.try_send((Instant::now(), job)).map_err(|e| match e {
                    crossbeam_channel::TrySendError::Full((_, job)) => (queue_full(), job),
                    crossbeam_channel::TrySendError::Disconnected((_, job)) => {
                        (StoreError::Unavailable("readers stopped".into()), job)
                    }
                })?;
                READER_QUEUE.set(s.len());
                Ok(())
            }
            None => Err((StoreError::Unavailable("store closed".into()), job)),
        }
    }
}

/// The crate's tests' way to the connections themselves (their pragmas, their handles).
#[cfg(test)]
impl SqliteStore {
    fn submit(&self, job: Job) -> Result<(), StoreError> {
        self.submit_job(job).map_err(|(e, _)| e)
    }

    fn make_job<T, E, F>(f: F, reply: tokio::sync::oneshot::Sender<Result<T, E>>) -> Job
    where
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        Job::Once(Box::new(move |conn: Option<&Connection>| {
            let Some(conn) = conn else {
                return Pending {
                    keep: false,
                    deliver: Box::new(move |err| {
                        let err =
                            err.unwrap_or_else(|| StoreError::Unavailable("batch failed".into()));
                        let _ = reply.send(Err(E::from(err)));
                    }),
                };
            };
            let outcome = catch_unwind(AssertUnwindSafe(|| f(conn)))
                .unwrap_or_else(|_| Err(E::from(panicked("write job panicked"))));
            let keep = outcome.is_ok();
            Pending {
                keep,
                deliver: Box::new(move |batch_err| {
                    let result = match (outcome, batch_err) {
                        (Ok(_), Some(err)) => Err(E::from(err)),
                        (outcome, _) => outcome,
                    };
                    let _ = reply.send(result);
                }),
            }
        }))
    }

    /// Runs `f` on the writer's connection in its own savepoint of a batch, once.
    async fn write_conn<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(Self::make_job(f, tx)).map_err(E::from)?;
        rx.await
            .unwrap_or_else(|_| Err(E::from(StoreError::Unavailable("writer stopped".into()))))
    }

    /// Blocking form of [`SqliteStore::write_conn`].
    fn write_conn_blocking<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(Self::make_job(f, tx)).map_err(E::from)?;
        rx.blocking_recv()
            .unwrap_or_else(|_| Err(E::from(StoreError::Unavailable("writer stopped".into()))))
    }

    /// Runs `f` on a new read connection opened as the readers' are.
    fn read_conn_blocking<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&Connection) -> Result<T, E>,
        E: From<StoreError>,
    {
        let conn = connect_reader(&self.inner.path, self.inner.read_only).map_err(E::from)?;
        f(&conn)
    }
}

/// Opens a read-only connection with the ledger's pragmas.
fn connect_reader(path: &Path, mode: Option<ReadMode>) -> Result<Connection, StoreError> {
    if let Some(mode) = mode {
        return read_only::connect(path, mode);
    }
    let conn = connect(path)?;
    conn.execute_batch("PRAGMA query_only=ON;")
        .map_err(map_err)?;
    Ok(conn)
}

/// A reader thread: takes one job at a time from the readers' queue. A snapshot job takes
/// along the snapshot jobs queued behind it — its share of the queue (the queue's length over
/// the number of readers), at most [`MAX_SHARED_SNAPSHOT`] in all — and they run one after
/// the other in one read transaction, which saves each of them the transaction's start and
/// end (SQLite's read locks). Every one of them was queued before the snapshot begins (at the
/// first job's first read), so each still sees every write committed before it was queued.
fn reader_loop(
    path: &Path,
    mode: Option<ReadMode>,
    receiver: crossbeam_channel::Receiver<Queued<ReadWork>>,
    limits: QueueLimits,
    readers: usize,
) {
    let mut conn: Option<Connection> = None;
    while let Ok((queued_at, work)) = receiver.recv() {
        READER_QUEUE.set(receiver.len());
        if limits.expired(queued_at, Instant::now()) {
            work.run(Err(queue_wait_expired()));
            continue;
        }
        let conn_now = reader_connection(&mut conn, path, mode);
        let mut jobs = vec![work];
        let share = receiver.len().div_ceil(readers.max(1));
        while jobs.len() <= share.min(MAX_SHARED_SNAPSHOT - 1) {
            match receiver.try_recv() {
                Ok((at, job)) => {
                    if limits.expired(at, Instant::now()) {
                        job.run(Err(queue_wait_expired()));
                    } else {
                        jobs.push(job);
                    }
                }
                Err(_) => break,
            }
        }
        match conn_now {
            Ok(c) => snapshots(c, jobs),
            Err(e) => {
                for job in jobs {
                    job.run(Err(e.clone()));
                }
            }
        }
        let Some(c) = conn.as_ref() else { continue };
        if !c.is_autocommit() && c.execute_batch("ROLLBACK").is_err() {
            // A connection stuck in a transaction is replaced.
            conn = None;
        }
    }
}

/// The reader thread's connection, opened on first use: an error when the ledger can no longer
/// be read as it was opened, or the connection cannot be opened.
fn reader_connection<'c>(
    conn: &'c mut Option<Connection>,
    path: &Path,
    mode: Option<ReadMode>,
) -> Result<&'c Connection, StoreError> {
    read_only::still_readable(path, mode)?;
    if conn.is_none() {
        *conn = Some(connect_reader(path, mode)?);
    }
    conn.as_ref()
        .ok_or_else(|| StoreError::Unavailable("no reader connection".into()))
}

/// Runs `jobs` one after the other in one read transaction (`BEGIN` … `COMMIT`) on `conn`;
/// should a job's failure end the transaction, the next job begins another. A transaction
/// left open is rolled back by the reader loop.
fn snapshots(conn: &Connection, jobs: Vec<Box<dyn ReadJob>>) {
    // Cached statements: a replay is a handful of statements, and parsing `BEGIN`/`COMMIT`
    // again on every call was a measurable share of it.
    let run = |sql: &str| conn.prepare_cached(sql).and_then(|mut s| s.execute([]));
    for job in jobs {
        if conn.is_autocommit() {
            if let Err(e) = run("BEGIN") {
                job.run(Err(map_err(e)));
                continue;
            }
        }
        job.run(Ok(&mut SqliteEffectTx::new(conn)));
    }
    if !conn.is_autocommit() {
        let _ = run("COMMIT");
    }
}

/// `toolledger_store_queue_depth{backend="sqlite",queue}`: the jobs waiting for the writer
/// (`writer`) or for a reader thread (`reader`), as last seen by a sender or by the thread
/// taking work.
static WRITER_QUEUE: QueueDepth = QueueDepth::new("sqlite", "writer");
/// See [`WRITER_QUEUE`].
static READER_QUEUE: QueueDepth = QueueDepth::new("sqlite", "reader");
/// Jobs per writer transaction.
static BATCH_SIZE: BatchSize = BatchSize::new("sqlite");

fn writer_loop(
    conn: Connection,
    receiver: crossbeam_channel::Receiver<Queued<Job>>,
    stats: &StatCounters,
    limits: QueueLimits,
    synchronous: Synchronous,
    commit_wait: Option<CommitWait>,
) {
    // Batches left to run with a savepoint per job after one whose job failed.
    let mut savepoints_only = 0u32;
    let mut peak = RecentPeak::new(Instant::now());
    let mut background = Background::new(&stats.background, synchronous);
    loop {
        let first = if background.work.is_some() {
            match receiver.recv_timeout(BACKGROUND_IDLE) {
                Ok(first) => first,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    // Nothing waits for the writer: a step of the background work alone.
                    background.alone(&conn);
                    continue;
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match receiver.recv() {
                Ok(first) => first,
                Err(_) => break,
            }
        };
        let now = Instant::now();
        let mut batch = Vec::with_capacity(receiver.len().min(MAX_BATCH) + 1);
        let mut next = Some(first);
        while let Some(queued) = next.take() {
            gather(queued, now, &mut batch, &mut background, limits);
            if batch.len() < MAX_BATCH {
                next = receiver.try_recv().ok();
            }
        }
        if let Some(wait) = commit_wait {
            let until = now + wait.most;
            while peak.wants_more(batch.len()) {
                let left = until
                    .saturating_duration_since(Instant::now())
                    .min(wait.gap);
                let Ok(queued) = receiver.recv_timeout(left) else {
                    break;
                };
                gather(queued, Instant::now(), &mut batch, &mut background, limits);
            }
            peak.saw(batch.len(), now);
        }
        WRITER_QUEUE.set(receiver.len());
        if batch.is_empty() {
            continue;
        }
        // Counted before the batch runs, so a caller that has been answered sees its batch.
        let n = batch.len() as u64;
        BATCH_SIZE.record(batch.len());
        stats.batches.fetch_add(1, Ordering::Relaxed);
        stats.jobs.fetch_add(n, Ordering::Relaxed);
        stats.largest_batch.fetch_max(n, Ordering::Relaxed);
        let flush = synchronous == Synchronous::Full
            && batch
                .iter()
                .any(|j| !matches!(j, Job::Again(w) if !w.waits_for_disk()));
        savepoints_only = without_flush(&conn, synchronous, !flush, || {
            run_batch(&conn, batch, savepoints_only, &mut background)
        });
    }
    background.end(Some(StoreError::Unavailable("the store closed".into())));
}

/// Puts one job taken from the writer's queue at `now` where it belongs: background work to
/// `background`, a job that waited too long answered without running (it changed nothing),
/// any other into `batch`.
fn gather(
    (queued_at, job): Queued<Job>,
    now: Instant,
    batch: &mut Vec<Job>,
    background: &mut Background<'_>,
    limits: QueueLimits,
) {
    if let Job::Background(work) = job {
        background.take(work);
    } else if limits.expired(queued_at, now) {
        job.refuse(queue_wait_expired());
    } else {
        batch.push(job);
    }
}

/// How long the writer waits for a job before it does a step of its background work alone.
const BACKGROUND_IDLE: Duration = Duration::from_millis(2);

/// The writer's background work ([`BackgroundWork`]), if it holds any.
struct Background<'a> {
    work: Option<Box<dyn BackgroundWork>>,
    /// The store's mark that background work was handed over and is not over yet.
    mark: &'a std::sync::atomic::AtomicBool,
    /// Whether the step run in the current transaction said work is left.
    more: bool,
    /// Whether a step ran in the current transaction.
    stepped: bool,
    /// The write connection's own `synchronous` mode, which steps alone do without.
    synchronous: Synchronous,
}

impl<'a> Background<'a> {
    fn new(mark: &'a std::sync::atomic::AtomicBool, synchronous: Synchronous) -> Self {
        Background {
            work: None,
            mark,
            more: false,
            stepped: false,
            synchronous,
        }
    }

    /// Takes `work` on (the store lets only one be handed over at a time).
    fn take(&mut self, work: Box<dyn BackgroundWork>) {
        match self.work {
            Some(_) => work.finish(Some(StoreError::Unavailable("background work busy".into()))),
            None => self.work = Some(work),
        }
    }

    /// Ends the work held, `failure` saying why; the store then takes new work.
    fn end(&mut self, failure: Option<StoreError>) {
        self.stepped = false;
        if let Some(work) = self.work.take() {
            self.mark.store(false, Ordering::Release);
            work.finish(failure);
        }
    }

    /// Runs one step in the open transaction (holding `callers` callers' jobs; 0: none), in a
    /// savepoint of its own. Returns `false` when SQLite ended the transaction under the step
    /// (what the batch wrote is gone).
    fn step(&mut self, conn: &Connection, callers: usize) -> bool {
        self.stepped = false;
        let Some(work) = self.work.as_mut() else {
            return true;
        };
        if work.abandoned() {
            self.end(None);
            return true;
        }
        if let Err(e) = exec_cached(conn, "SAVEPOINT background") {
            self.end(Some(map_err(e)));
            return !conn.is_autocommit();
        }
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            work.step(&mut SqliteEffectTx::new(conn) as &mut dyn EffectTx, callers)
        }));
        if conn.is_autocommit() {
            self.end(Some(StoreError::Unavailable(
                "background step failed".into(),
            )));
            return false;
        }
        match outcome {
            Ok(Ok(more)) => {
                if let Err(e) = exec_cached(conn, "RELEASE background") {
                    self.end(Some(map_err(e)));
                    return false;
                }
                (self.more, self.stepped) = (more, true);
            }
            failed => {
                let err = match failed {
                    Ok(Err(e)) => e,
                    _ => panicked("background work panicked"),
                };
                let closed = exec_cached(conn, "ROLLBACK TO background")
                    .and_then(|()| exec_cached(conn, "RELEASE background"));
                self.end(Some(err));
                if closed.is_err() {
                    return false;
                }
            }
        }
        true
    }

    /// Tells the step run in the transaction that just ended how it ended.
    fn settled(&mut self, failure: Option<&StoreError>) {
        if !std::mem::take(&mut self.stepped) {
            return;
        }
        let Some(work) = self.work.as_mut() else {
            return;
        };
        work.settled(failure);
        if failure.is_none() && !self.more {
            self.end(None);
        }
    }

    /// A step alone, in a transaction of its own.
    ///
    /// Its commit does not wait for the disk (`synchronous=NORMAL` for that one transaction):
    /// nobody waits for it, and nothing has been acknowledged on it. It stays atomic (the
    /// write-ahead log's frames are checksummed), so a crash before the next commit of a live
    /// batch, which flushes the log with everything before it, at worst undoes the step; the
    /// work is then done again by a later pass. The callers' commits keep the connection's
    /// own mode.
    fn alone(&mut self, conn: &Connection) {
        without_flush(conn, self.synchronous, true, || {
            if conn.execute_batch("BEGIN IMMEDIATE").is_ok() {
                if self.step(conn, 0) {
                    let failure = commit_or_roll_back(conn);
                    self.settled(failure.as_ref());
                } else {
                    self.settled(Some(&StoreError::Unavailable(
                        "background step failed".into(),
                    )));
                }
            }
            // Else another process holds the file's write lock: the next idle moment tries
            // again.
        })
    }
}

/// Runs `f`, whose commits do not wait for the disk (`synchronous=NORMAL`) when `relax` and
/// the write connection's own mode (`synchronous`) waits; the own mode is set back after.
/// A commit that does not wait stays atomic (the log's frames are checksummed) and survives
/// the process's crash; the next commit that waits flushes the log with it.
fn without_flush<T>(
    conn: &Connection,
    synchronous: Synchronous,
    relax: bool,
    f: impl FnOnce() -> T,
) -> T {
    let relaxed = relax
        && synchronous == Synchronous::Full
        // If the mode cannot be set, the commits wait as usual.
        && exec_cached(conn, "PRAGMA synchronous=NORMAL").is_ok();
    let out = f();
    if relaxed {
        // Setting the mode back touches no file and cannot fail outside a transaction; if it
        // ever did, a commit acknowledged without its flush would follow, so the writer stops
        // instead (its callers are then answered `unavailable`).
        exec_cached(conn, "PRAGMA synchronous=FULL")
            .expect("the write connection's synchronous mode is restored");
    }
    out
}

/// Runs one statement through the connection's statement cache (transaction control is on
/// every job's path; parsing it again each time was measurable).
fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Batches run with a savepoint per job after a batch in which a job failed: a workload whose
/// jobs often fail does not pay for each batch twice.
const SAVEPOINT_BATCHES_AFTER_A_FAILURE: u32 = 64;

/// Runs one batch in one transaction and answers its jobs once it committed; returns how many
/// of the next batches are to run with a savepoint per job.
///
/// A job's savepoint costs the writer a copy of every page the job changes (the savepoint's
/// sub-journal) and its release: a sixth of a delivery's writer time. So a batch of jobs that
/// may run again ([`Job::Again`]) first runs without savepoints; if every job keeps its
/// writes, that one transaction commits. If one asks for its rollback (or panics), the whole
/// transaction is rolled back, nothing is answered, and the batch runs again with a savepoint
/// per job, each job answering with that last run.
fn run_batch(
    conn: &Connection,
    batch: Vec<Job>,
    savepoints_only: u32,
    background: &mut Background<'_>,
) -> u32 {
    if savepoints_only > 0 || batch.iter().any(|j| !matches!(j, Job::Again(_))) {
        run_with_savepoints(conn, batch, background);
        return savepoints_only.saturating_sub(1);
    }
    let jobs: Vec<Box<dyn WriteJob>> = batch
        .into_iter()
        .filter_map(|j| match j {
            Job::Again(job) => Some(job),
            _ => None,
        })
        .collect();
    match run_without_savepoints(conn, jobs, background) {
        None => 0,
        Some(jobs) => {
            run_with_savepoints(conn, jobs.into_iter().map(Job::Again).collect(), background);
            SAVEPOINT_BATCHES_AFTER_A_FAILURE
        }
    }
}

/// Runs `jobs` in one transaction without savepoints and answers them after its `COMMIT`;
/// hands them back unanswered, their writes rolled back, when one of them did not keep its
/// writes or the transaction could not begin.
fn run_without_savepoints(
    conn: &Connection,
    mut jobs: Vec<Box<dyn WriteJob>>,
    background: &mut Background<'_>,
) -> Option<Vec<Box<dyn WriteJob>>> {
    if conn.execute_batch("BEGIN IMMEDIATE").is_err() {
        return Some(jobs);
    }
    for job in jobs.iter_mut() {
        let keep = job.run(&mut SqliteEffectTx::new(conn) as &mut dyn EffectTx);
        if keep && !conn.is_autocommit() {
            continue;
        }
        if !keep {
            let _ = conn.execute_batch("ROLLBACK");
            if conn.is_autocommit() {
                return Some(jobs);
            }
        }
        // Either SQLite ended the transaction under a job that went on (a full disk, an I/O
        // error), so what the batch wrote is gone, or the transaction could not be rolled
        // back. Answer everyone, as the savepoint path does when it cannot close a savepoint;
        // nothing more runs.
        let err = StoreError::Unavailable("batch failed".into());
        for job in jobs {
            job.finish(Some(err.clone()));
        }
        return None;
    }
    let failure = commit(conn, background, jobs.len());
    for job in jobs {
        job.finish(failure.clone());
    }
    None
}

/// Runs a step of the background work at the end of the open transaction, then commits it;
/// the reason when the transaction did not commit (it is then rolled back).
fn commit(
    conn: &Connection,
    background: &mut Background<'_>,
    callers: usize,
) -> Option<StoreError> {
    let failure = if !background.step(conn, callers) {
        // SQLite ended the transaction under the step: what the batch wrote is gone.
        Some(StoreError::Unavailable("batch failed".into()))
    } else {
        commit_or_roll_back(conn)
    };
    background.settled(failure.as_ref());
    failure
}

/// Commits the open transaction; the reason when it did not commit (it is then rolled back).
fn commit_or_roll_back(conn: &Connection) -> Option<StoreError> {
    match conn.execute_batch("COMMIT") {
        Ok(()) => None,
        Err(e) => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            Some(map_err(e))
        }
    }
}

/// Runs `batch` in one transaction, each job in its own savepoint (a job that fails is rolled
/// back alone), and answers every job after the `COMMIT`.
fn run_with_savepoints(conn: &Connection, batch: Vec<Job>, background: &mut Background<'_>) {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let err = map_err(e);
        for job in batch {
            job.refuse(err.clone());
        }
        return;
    }
    let mut pendings = Vec::with_capacity(batch.len());
    for job in batch {
        if let Err(e) = exec_cached(conn, "SAVEPOINT job") {
            job.refuse(map_err(e));
            continue;
        }
        let pending = job.start(Some(conn));
        let closed = if pending.keep {
            exec_cached(conn, "RELEASE job")
        } else {
            exec_cached(conn, "ROLLBACK TO job").and_then(|()| exec_cached(conn, "RELEASE job"))
        };
        if let Err(e) = closed {
            // The savepoint could not be closed: the whole transaction is suspect.
            let err = map_err(e);
            let _ = conn.execute_batch("ROLLBACK");
            (pending.deliver)(Some(err.clone()));
            for p in pendings {
                let p: Pending = p;
                (p.deliver)(Some(err.clone()));
            }
            return;
        }
        pendings.push(pending);
    }
    let failure = commit(conn, background, pendings.len());
    for p in pendings {
        (p.deliver)(failure.clone());
    }
}

/// A job that panicked inside a SQLite transaction.
fn panicked(what: &str) -> StoreError {
    StoreError::Failed {
        backend: Dialect::Sqlite,
        reason: what.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    fn temp() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.sqlite");
        (dir, path)
    }

    #[test]
    fn bootstrap_binds_backend_id_and_refuses_another() {
        let (_d, path) = temp();
        let store = SqliteStore::open(&path, OpenOptions::new("alpha")).unwrap();
        drop(store);
        assert!(SqliteStore::open(&path, OpenOptions::new("alpha")).is_ok());
        let adopted = SqliteStore::open(&path, OpenOptions::any_backend()).unwrap();
        assert_eq!(adopted.backend_id(), "alpha");
        drop(adopted);
        let err = SqliteStore::open(&path, OpenOptions::new("beta")).unwrap_err();
        assert!(matches!(err, StoreError::BackendMismatch), "{err:?}");
    }

    #[test]
    fn pragmas_are_wal_full_and_foreign_keys() {
        let (_d, path) = temp();
        let store = SqliteStore::open(&path, OpenOptions::new("p")).unwrap();
        let (mode, sync, fk): (String, i64, i64) = store
            .read_conn_blocking(|c| {
                Ok::<_, StoreError>((
                    c.query_row("PRAGMA journal_mode", [], |r| r.get(0))
                        .map_err(map_err)?,
                    c.query_row("PRAGMA synchronous", [], |r| r.get(0))
                        .map_err(map_err)?,
                    c.query_row("PRAGMA foreign_keys", [], |r| r.get(0))
                        .map_err(map_err)?,
                ))
            })
            .unwrap();
        assert_eq!(mode, "wal");
        assert_eq!(sync, 2, "synchronous=FULL");
        assert_eq!(fk, 1);
    }

    /// A read job for the driver's queue that runs `f` in its snapshot.
    struct TestRead<F>(F);

    impl<F: FnOnce(&mut dyn EffectTx) + Send> ReadJob for TestRead<F> {
        fn run(self: Box<Self>, tx: Result<&mut dyn EffectTx, StoreError>) {
            (self.0)(tx.expect("a snapshot"));
        }
    }

    fn count_rows(tx: &mut dyn EffectTx) -> i64 {
        use toolledger_core::effect::RowExt;
        tx.query("SELECT count(*) FROM t", &[]).unwrap()[0]
            .int(0)
            .unwrap()
    }

    #[test]
    fn snapshot_jobs_queued_together_share_one_snapshot_and_later_ones_see_later_commits() {
        use std::sync::mpsc;
        let (_d, path) = temp();
        let mut opts = OpenOptions::new("shared");
        opts.readers = 1;
        let store = SqliteStore::open(&path, opts).unwrap();
        let create = |c: &Connection| {
            c.execute_batch("CREATE TABLE t(x INTEGER); INSERT INTO t VALUES (1);")
                .map_err(map_err)
        };
        store.write_conn_blocking(create).unwrap();
        let insert = || {
            Store::from(store.clone())
                .write_blocking(|tx: &mut dyn EffectTx| {
                    tx.execute("INSERT INTO t VALUES (2)", &[]).map(|_| ())
                })
                .unwrap()
        };

        // The one reader is held by a connection job while three snapshot jobs queue.
        let (hold, held) = mpsc::channel::<()>();
        let (release, released) = mpsc::channel::<()>();
        Driver::submit_read(
            &store,
            Box::new(TestRead(move |_: &mut dyn EffectTx| {
                hold.send(()).unwrap();
                released.recv().unwrap();
            })),
        );
        held.recv().unwrap();
        let (seen, counts) = mpsc::channel::<(char, i64)>();
        let (first_read, read_once) = mpsc::channel::<()>();
        let (written, write_done) = mpsc::channel::<()>();
        let first = seen.clone();
        Driver::submit_read(
            &store,
            Box::new(TestRead(move |tx: &mut dyn EffectTx| {
                first.send(('a', count_rows(tx))).unwrap();
                first_read.send(()).unwrap();
                write_done.recv().unwrap();
            })),
        );
        for name in ['b', 'c'] {
            let seen = seen.clone();
            Driver::submit_read(
                &store,
                Box::new(TestRead(move |tx: &mut dyn EffectTx| {
                    seen.send((name, count_rows(tx))).unwrap();
                })),
            );
        }
        release.send(()).unwrap();
        // The first snapshot job has read; a write commits before the others run.
        read_once.recv().unwrap();
        insert();
        written.send(()).unwrap();
        let got: Vec<(char, i64)> = (0..3).map(|_| counts.recv().unwrap()).collect();
        assert_eq!(
            got,
            [('a', 1), ('b', 1), ('c', 1)],
            "the jobs queued together read one snapshot, taken after all of them were queued"
        );
        // A job queued after the commit sees it.
        let later = seen.clone();
        Driver::submit_read(
            &store,
            Box::new(TestRead(move |tx: &mut dyn EffectTx| {
                later.send(('d', count_rows(tx))).unwrap();
            })),
        );
        assert_eq!(counts.recv().unwrap(), ('d', 2));
    }

    /// One integer from `sql` on the writer's connection and on a reader's.
    fn on_writer_and_reader(store: &SqliteStore, sql: &'static str) -> (i64, i64) {
        let query = move |c: &Connection| c.query_row(sql, [], |r| r.get(0)).map_err(map_err);
        (
            store.write_conn_blocking(query).unwrap(),
            store.read_conn_blocking(query).unwrap(),
        )
    }

    #[test]
    fn synchronous_normal_is_opt_in_and_only_on_the_write_connection() {
        let (_d, path) = temp();
        let full = SqliteStore::open(&path, OpenOptions::new("s")).unwrap();
        assert_eq!(
            on_writer_and_reader(&full, "PRAGMA synchronous"),
            (2, 2),
            "FULL unless asked"
        );
        drop(full);
        let normal = SqliteStore::open(
            &path,
            OpenOptions::new("s").with_synchronous(Synchronous::Normal),
        )
        .unwrap();
        assert_eq!(
            on_writer_and_reader(&normal, "PRAGMA synchronous"),
            (1, 2),
            "NORMAL on the writer only"
        );
        // A write still commits and is read back.
        normal
            .write_conn_blocking(|c| {
                c.execute_batch("CREATE TABLE t(x INTEGER) STRICT; INSERT INTO t VALUES (1);")
                    .map_err(map_err)
            })
            .unwrap();
        assert_eq!(
            on_writer_and_reader(&normal, "SELECT count(*) FROM t"),
            (1, 1)
        );
    }

    #[test]
    fn newer_schema_is_refused_and_older_needs_migrate() {
        let (_d, path) = temp();
        drop(SqliteStore::open(&path, OpenOptions::new("s")).unwrap());
        {
            let c = connect(&path).unwrap();
            c.execute(
                "INSERT INTO schema_migrations(namespace, version) VALUES ('toolledger', 999)",
                [],
            )
            .unwrap();
        }
        let err = SqliteStore::open(&path, OpenOptions::new("s")).unwrap_err();
        assert!(
            matches!(err, StoreError::SchemaTooNew { found: 999, .. }),
            "{err:?}"
        );

        const APP_V1: &[Migration] = &[Migration {
            namespace: "app",
            version: 1,
            sql: "CREATE TABLE app_a(x INTEGER NOT NULL) STRICT;",
        }];
        const APP_V2: &[Migration] = &[
            APP_V1[0],
            Migration {
                namespace: "app",
                version: 2,
                sql: "CREATE TABLE app_b(x INTEGER NOT NULL) STRICT;",
            },
        ];
        let (_d2, path2) = temp();
        drop(SqliteStore::open(&path2, OpenOptions::new("s").with_migrations(APP_V1)).unwrap());
        let err =
            SqliteStore::open(&path2, OpenOptions::new("s").with_migrations(APP_V2)).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::SchemaOutdated {
                    found: 1,
                    current: 2,
                    ..
                }
            ),
            "{err:?}"
        );
        let store = SqliteStore::open(
            &path2,
            OpenOptions::new("s")
                .with_migrations(APP_V2)
                .allow_migrate(true),
        )
        .unwrap();
        let n: i64 = store
            .read_conn_blocking(|c| {
                c.query_row("SELECT count(*) FROM app_b", [], |r| r.get(0))
                    .map_err(map_err)
            })
            .unwrap();
        assert_eq!(n, 0);
    }

    /// Tables in the file (none after a bootstrap that was rolled back).
    fn tables(path: &Path) -> i64 {
        connect(path)
            .unwrap()
            .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn a_refused_bootstrap_leaves_a_new_file_empty() {
        let (_d, path) = temp();
        const GAP: &[Migration] = &[Migration {
            namespace: "app",
            version: 2,
            sql: "CREATE TABLE g(x INTEGER) STRICT;",
        }];
        let err = SqliteStore::open(&path, OpenOptions::new("m").with_migrations(GAP)).unwrap_err();
        assert!(
            matches!(err, StoreError::MigrationsInvalid { .. }),
            "{err:?}"
        );
        assert_eq!(tables(&path), 0);
        const BROKEN: &[Migration] = &[Migration {
            namespace: "app",
            version: 1,
            sql: "CREATE TABLE ok(x INTEGER) STRICT; CREATE TABLE broken(",
        }];
        let err =
            SqliteStore::open(&path, OpenOptions::new("m").with_migrations(BROKEN)).unwrap_err();
        assert_eq!(err.code(), "SQLITE_ERROR", "{err:?}");
        assert!(!err.to_string().contains("broken"), "{err}");
        assert_eq!(
            tables(&path),
            0,
            "bound, built and recorded together or not at all"
        );
    }

    #[test]
    fn a_foreign_file_is_not_adopted() {
        let (_d, path) = temp();
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch("CREATE TABLE other(x)").unwrap();
        }
        let before = std::fs::read(&path).unwrap();
        let err = SqliteStore::open(&path, OpenOptions::new("x")).unwrap_err();
        assert!(matches!(err, StoreError::NotALedger(_)), "{err:?}");
        assert_eq!(std::fs::read(&path).unwrap(), before, "left as it was");
        let (_d2, garbage) = temp();
        std::fs::write(&garbage, vec![0x42u8; 8192]).unwrap();
        let err = SqliteStore::open(&garbage, OpenOptions::new("x")).unwrap_err();
        assert!(matches!(err, StoreError::NotALedger(_)), "{err:?}");
    }

    /// A store at `path` with an application table `t(x UNIQUE)`.
    fn with_table_t(path: &Path) -> SqliteStore {
        over_table_t(path, None)
    }

    /// A store over table `t` whose writer waits as `wait` says.
    fn over_table_t(path: &Path, wait: Option<CommitWait>) -> SqliteStore {
        const APP: &[Migration] = &[Migration {
            namespace: "t",
            version: 1,
            sql: "CREATE TABLE t(x INTEGER NOT NULL UNIQUE) STRICT;",
        }];
        let opts = OpenOptions::new("b")
            .with_migrations(APP)
            .with_commit_wait(wait);
        SqliteStore::open(path, opts).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_failing_job_in_a_batch_leaves_its_neighbours_committed() {
        let (_d, path) = temp();
        let store = with_table_t(&path);
        let mut handles = Vec::new();
        for i in 0..200i64 {
            let s = store.clone();
            handles.push(tokio::spawn(async move {
                s.write_conn(move |c| {
                    c.execute("INSERT INTO t(x) VALUES (?1)", [i])
                        .map_err(map_err)?;
                    if i % 7 == 0 {
                        // Fails after writing: its own insert must vanish.
                        return Err(StoreError::Contract("deliberate".into()));
                    }
                    Ok(i)
                })
                .await
            }));
        }
        let mut ok = 0;
        for h in handles {
            if h.await.unwrap().is_ok() {
                ok += 1;
            }
        }
        let rows: Vec<i64> = store
            .read_conn_blocking(|c| {
                let mut st = c.prepare("SELECT x FROM t ORDER BY x").map_err(map_err)?;
                let v = st
                    .query_map([], |r| r.get(0))
                    .map_err(map_err)?
                    .collect::<Result<Vec<i64>, _>>()
                    .map_err(map_err)?;
                Ok::<_, StoreError>(v)
            })
            .unwrap();
        assert_eq!(ok, rows.len());
        assert!(rows.iter().all(|x| x % 7 != 0));
        assert_eq!(rows.len(), 200 - 29);
    }

    /// A ledger job for the writer: inserts `x`, then fails when `fail`; counts its runs and
    /// reports how it was answered.
    struct Insert {
        x: i64,
        fail: bool,
        runs: Arc<AtomicU64>,
        answered: std::sync::mpsc::Sender<(i64, Option<StoreError>)>,
    }

    impl WriteJob for Insert {
        fn run(&mut self, tx: &mut dyn EffectTx) -> bool {
            self.runs.fetch_add(1, Ordering::SeqCst);
            tx.execute("INSERT INTO t(x) VALUES (?1)", &[self.x.into()])
                .is_ok()
                && !self.fail
        }

        fn finish(self: Box<Self>, failure: Option<StoreError>) {
            let _ = self.answered.send((self.x, failure));
        }
    }

    /// A ledger job during which SQLite ends the writer's transaction (as it may on a full
    /// disk or an I/O error), and which carries on as if nothing happened. `EffectTx` refuses
    /// transaction control, so the rollback goes through the writer connection's handle.
    struct EndsTheTransaction {
        /// The writer connection's `sqlite3*`, as an address (read on the writer thread).
        handle: usize,
    }

    impl WriteJob for EndsTheTransaction {
        fn run(&mut self, _: &mut dyn EffectTx) -> bool {
            let db = self.handle as *mut rusqlite::ffi::sqlite3;
            // SAFETY: the handle is the writer connection's, and this runs on the writer
            // thread, inside that connection's batch, while the store is open.
            unsafe {
                rusqlite::ffi::sqlite3_exec(
                    db,
                    c"ROLLBACK".as_ptr(),
                    None,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                );
            }
            true
        }

        fn finish(self: Box<Self>, _: Option<StoreError>) {}
    }

    /// The writer connection's `sqlite3*` as an address.
    fn writer_handle(store: &SqliteStore) -> usize {
        let (tx, rx) = std::sync::mpsc::channel();
        store
            .submit(SqliteStore::make_job(
                move |c: &Connection| {
                    // SAFETY: only the address is taken here.
                    let _ = tx.send(unsafe { c.handle() } as usize);
                    Ok::<_, StoreError>(())
                },
                oneshot::channel().0,
            ))
            .unwrap();
        rx.recv().unwrap()
    }

    #[test]
    fn a_transaction_ended_under_a_batch_answers_every_job_with_an_error_and_writes_nothing() {
        let (_d, path) = temp();
        let store = with_table_t(&path);
        let (answered, answers) = std::sync::mpsc::channel();
        let runs: Vec<Arc<AtomicU64>> = (0..2).map(|_| Arc::default()).collect();
        let insert = |x: i64, runs: &Arc<AtomicU64>| {
            Job::Again(Box::new(Insert {
                x,
                fail: false,
                runs: runs.clone(),
                answered: answered.clone(),
            }))
        };
        let handle = writer_handle(&store);
        let release = hold_the_writer(&store);
        assert!(store.submit(insert(30, &runs[0])).is_ok());
        assert!(store
            .submit(Job::Again(Box::new(EndsTheTransaction { handle })))
            .is_ok());
        assert!(store.submit(insert(31, &runs[1])).is_ok());
        release.send(()).unwrap();
        let mut got: Vec<(i64, Option<StoreError>)> =
            (0..2).map(|_| answers.recv().unwrap()).collect();
        got.sort_by_key(|(x, _)| *x);
        assert!(got.iter().all(|(_, failure)| failure.is_some()), "{got:?}");
        assert_eq!(runs[1].load(Ordering::SeqCst), 0, "nothing runs after it");
        let c = connect(store.path()).unwrap();
        let n: i64 = c
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 0);
    }

    /// A ledger job that reports the write connection's `synchronous` mode inside its
    /// transaction (1: `NORMAL`, the commit does not wait for the disk; 2: `FULL`), and says
    /// whether it waits for the disk.
    struct SeesSynchronous {
        flush: bool,
        mode: Option<i64>,
        answered: std::sync::mpsc::Sender<(bool, Option<i64>, Option<StoreError>)>,
    }

    impl WriteJob for SeesSynchronous {
        fn run(&mut self, tx: &mut dyn EffectTx) -> bool {
            self.mode = tx
                .query("PRAGMA synchronous", &[])
                .ok()
                .and_then(|rows| toolledger_core::effect::RowExt::int(&rows[0], 0).ok());
            true
        }

        fn waits_for_disk(&self) -> bool {
            self.flush
        }

        fn finish(self: Box<Self>, failure: Option<StoreError>) {
            let _ = self.answered.send((self.flush, self.mode, failure));
        }
    }

    /// The modes the jobs `flushes` saw, queued together behind a held writer when
    /// `together` (one batch), else one at a time.
    fn modes_seen(store: &SqliteStore, flushes: &[bool], together: bool) -> Vec<(bool, i64)> {
        let (answered, answers) = std::sync::mpsc::channel();
        let release = together.then(|| hold_the_writer(store));
        let mut seen = Vec::new();
        for &flush in flushes {
            let job = SeesSynchronous {
                flush,
                mode: None,
                answered: answered.clone(),
            };
            assert!(store.submit(Job::Again(Box::new(job))).is_ok());
            if !together {
                seen.push(answers.recv().unwrap());
            }
        }
        if let Some(release) = release {
            release.send(()).unwrap();
            seen.extend((0..flushes.len()).map(|_| answers.recv().unwrap()));
        }
        seen.into_iter()
            .map(|(flush, mode, failure)| {
                assert!(failure.is_none(), "{failure:?}");
                (flush, mode.expect("the job read the mode"))
            })
            .collect()
    }

    #[test]
    fn a_batch_of_jobs_that_need_not_wait_for_the_disk_commits_without_the_flush_and_only_it() {
        let (_d, path) = temp();
        let store = with_table_t(&path);
        // Alone: the unflushed job's transaction runs with `NORMAL`, and the mode is set back
        // for the next one.
        assert_eq!(
            modes_seen(&store, &[false, true, false, true], false),
            vec![(false, 1), (true, 2), (false, 1), (true, 2)]
        );
        // In one batch with a job that waits, every job's commit waits.
        let mut mixed = modes_seen(&store, &[false, true, false], true);
        mixed.sort();
        assert_eq!(mixed, vec![(false, 2), (false, 2), (true, 2)]);
        // A batch of unflushed jobs only: one commit without the flush.
        assert_eq!(
            modes_seen(&store, &[false, false], true),
            vec![(false, 1), (false, 1)]
        );
        assert_eq!(modes_seen(&store, &[true], false), vec![(true, 2)]);
        // A connection opened with `NORMAL` keeps it for every job.
        let (_d, path) = temp();
        let opts = OpenOptions::new("b").with_synchronous(Synchronous::Normal);
        let store = SqliteStore::open(&path, opts).unwrap();
        assert_eq!(
            modes_seen(&store, &[false, true], false),
            vec![(false, 1), (true, 1)]
        );
    }

    /// What [`Steps`] reports.
    #[derive(Debug, PartialEq)]
    enum Seen {
        /// A step inserted `x`, `alone` or not, and saw these rows of `t` in its transaction.
        Step { x: i64, alone: bool, rows: Vec<i64> },
        /// The transaction of the last step committed (`true`) or not.
        Settled(bool),
        /// The work ended, with or without an error.
        Finished(bool),
    }

    /// Background work inserting `next..=last` into `t`, one row per step; the step of
    /// `fail_at` inserts its row and then fails.
    struct Steps {
        next: i64,
        last: i64,
        fail_at: Option<i64>,
        seen: std::sync::mpsc::Sender<Seen>,
    }

    impl BackgroundWork for Steps {
        fn step(&mut self, tx: &mut dyn EffectTx, callers: usize) -> Result<bool, StoreError> {
            let (x, alone) = (self.next, callers == 0);
            tx.execute("INSERT INTO t(x) VALUES (?1)", &[x.into()])
                .map_err(|e| StoreError::Contract(e.message))?;
            if self.fail_at == Some(x) {
                return Err(StoreError::Contract("this step fails".into()));
            }
            let rows = tx
                .query("SELECT x FROM t ORDER BY x", &[])
                .map_err(|e| StoreError::Contract(e.message))?
                .iter()
                .map(|r| toolledger_core::effect::RowExt::int(r, 0).unwrap())
                .collect();
            let _ = self.seen.send(Seen::Step { x, alone, rows });
            self.next += 1;
            Ok(self.next <= self.last)
        }

        fn settled(&mut self, failure: Option<&StoreError>) {
            let _ = self.seen.send(Seen::Settled(failure.is_none()));
        }

        fn abandoned(&self) -> bool {
            false
        }

        fn finish(self: Box<Self>, failure: Option<StoreError>) {
            let _ = self.seen.send(Seen::Finished(failure.is_none()));
        }
    }

    fn rows_of_t(store: &SqliteStore) -> Vec<i64> {
        let c = connect(store.path()).unwrap();
        let mut st = c.prepare("SELECT x FROM t ORDER BY x").unwrap();
        let v = st.query_map([], |r| r.get(0)).unwrap();
        v.collect::<Result<Vec<i64>, _>>().unwrap()
    }

    /// [`Steps`] inserting `next..=last` (failing at `fail_at`), and what it reports.
    fn steps(
        next: i64,
        last: i64,
        fail_at: Option<i64>,
    ) -> (Steps, std::sync::mpsc::Receiver<Seen>) {
        let (seen, reports) = std::sync::mpsc::channel();
        let work = Steps {
            next,
            last,
            fail_at,
            seen,
        };
        (work, reports)
    }

    /// Queues a ledger job inserting `x`; its answer comes on the returned receiver.
    fn insert_job(
        store: &SqliteStore,
        x: i64,
    ) -> std::sync::mpsc::Receiver<(i64, Option<StoreError>)> {
        let (answered, answers) = std::sync::mpsc::channel();
        let insert = Insert {
            x,
            fail: false,
            runs: Arc::default(),
            answered,
        };
        assert!(store.submit(Job::Again(Box::new(insert))).is_ok());
        answers
    }

    /// The writer, its last background work over, takes new work: a step alone inserting `x`
    /// sees `rows`.
    fn takes_new_work(store: &SqliteStore, x: i64, rows: Vec<i64>) {
        let (next, reports) = steps(x, x, None);
        assert!(Driver::background(store, Box::new(next)).is_ok());
        let alone = true;
        assert_eq!(reports.recv().unwrap(), Seen::Step { x, alone, rows });
    }

    #[test]
    fn background_work_steps_at_the_end_of_a_batch_then_alone_and_one_at_a_time() {
        let (_d, path) = temp();
        let store = with_table_t(&path);
        let release = hold_the_writer(&store);
        let (work, reports) = steps(1, 3, None);
        assert!(Driver::background(&store, Box::new(work)).is_ok());
        // One at a time: another is refused while the first is held.
        let (other, _) = steps(50, 50, None);
        assert_eq!(
            Driver::background(&store, Box::new(other)),
            Err(BackgroundRefused::Busy)
        );
        let answers = insert_job(&store, 100);
        release.send(()).unwrap();
        let got: Vec<Seen> = (0..7).map(|_| reports.recv().unwrap()).collect();
        let step = |x, alone, rows: &[i64]| Seen::Step {
            x,
            alone,
            rows: rows.to_vec(),
        };
        assert_eq!(
            got,
            [
                // At the end of the live job's transaction: it sees the job's row.
                step(1, false, &[1, 100]),
                Seen::Settled(true),
                // Then alone, the writer having nothing else to do.
                step(2, true, &[1, 2, 100]),
                Seen::Settled(true),
                step(3, true, &[1, 2, 3, 100]),
                Seen::Settled(true),
                Seen::Finished(true),
            ]
        );
        assert!(matches!(answers.recv().unwrap(), (100, None)));
        assert_eq!(rows_of_t(&store), [1, 2, 3, 100]);
        takes_new_work(&store, 4, vec![1, 2, 3, 4, 100]);
    }

    /// Background work of `left` steps, each reporting how many callers' jobs its transaction
    /// held (0: alone) and the write connection's `synchronous` mode in it.
    struct Modes {
        left: u32,
        seen: std::sync::mpsc::Sender<(usize, i64)>,
    }

    impl BackgroundWork for Modes {
        fn step(&mut self, tx: &mut dyn EffectTx, callers: usize) -> Result<bool, StoreError> {
            let mode = toolledger_core::audit::scalar(tx, "PRAGMA synchronous")?;
            let _ = self.seen.send((callers, mode));
            self.left -= 1;
            Ok(self.left > 0)
        }

        fn settled(&mut self, _: Option<&StoreError>) {}

        fn abandoned(&self) -> bool {
            false
        }

        fn finish(self: Box<Self>, _: Option<StoreError>) {}
    }

    /// Hands [`Modes`] of `left` steps to the held writer, queues a live job, releases the
    /// writer; the `(callers, synchronous)` of every step.
    fn modes_of_steps(store: &SqliteStore, left: u32, x: i64) -> Vec<(usize, i64)> {
        let release = hold_the_writer(store);
        let (seen, modes) = std::sync::mpsc::channel();
        assert!(Driver::background(store, Box::new(Modes { left, seen })).is_ok());
        let answers = insert_job(store, x);
        release.send(()).unwrap();
        let got = (0..left).map(|_| modes.recv().unwrap()).collect();
        assert!(matches!(answers.recv().unwrap(), (y, None) if y == x));
        got
    }

    #[test]
    fn a_background_step_alone_does_not_wait_for_the_disk_and_live_commits_still_do() {
        let (_d, path) = temp();
        let store = with_table_t(&path);
        const FULL: i64 = 2;
        const NORMAL: i64 = 1;
        // Along a live batch of one job: the batch's own FULL commit. Alone: NORMAL.
        assert_eq!(
            modes_of_steps(&store, 3, 100),
            [(1, FULL), (0, NORMAL), (0, NORMAL)]
        );
        // The live commit after steps alone is FULL again.
        assert_eq!(modes_of_steps(&store, 1, 101), [(1, FULL)]);
        assert_eq!(rows_of_t(&store), [100, 101]);
    }

    #[test]
    fn a_failing_background_step_is_rolled_back_alone_and_ends_the_work() {
        let (_d, path) = temp();
        let store = with_table_t(&path);
        let release = hold_the_writer(&store);
        let (work, reports) = steps(1, 5, Some(1));
        assert!(Driver::background(&store, Box::new(work)).is_ok());
        let answers = insert_job(&store, 200);
        release.send(()).unwrap();
        assert_eq!(reports.recv().unwrap(), Seen::Finished(false));
        assert!(matches!(answers.recv().unwrap(), (200, None)));
        // The live job's row committed; the failed step's row did not.
        assert_eq!(rows_of_t(&store), [200]);
        takes_new_work(&store, 7, vec![7, 200]);
    }

    /// Holds the writer busy until the returned sender is used, so that the jobs queued
    /// meanwhile make up its next batch.
    fn hold_the_writer(store: &SqliteStore) -> std::sync::mpsc::Sender<()> {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (started, running) = std::sync::mpsc::channel::<()>();
        store
            .submit(SqliteStore::make_job(
                move |_: &Connection| {
                    let _ = started.send(());
                    let _ = held.recv();
                    Ok::<_, StoreError>(())
                },
                oneshot::channel().0,
            ))
            .unwrap();
        running.recv().unwrap();
        release
    }

    /// A store over table `t` whose writer waits up to [`LONG`], ending at a `gap` without a
    /// job (no wait at all when `None`), with a peak of eight jobs: eight inserts (`-8..0`)
    /// queued behind a held writer make one batch.
    fn waiting_store(path: &Path, gap: Option<Duration>) -> SqliteStore {
        let store = over_table_t(path, gap.map(|gap| CommitWait { most: LONG, gap }));
        let release = hold_the_writer(&store);
        let answers: Vec<_> = (-8..0).map(|x| insert_job(&store, x)).collect();
        release.send(()).unwrap();
        for a in answers {
            assert!(matches!(a.recv().unwrap(), (_, None)));
        }
        assert_eq!(store.writer_stats().largest_batch, 8);
        store
    }

    /// Longer than any test waits for an answer: a job answered within the test was not held
    /// to [`CommitWait::most`].
    const LONG: Duration = Duration::from_secs(600);

    #[test]
    fn a_small_batch_waits_for_more_jobs_and_commits_with_them_once_it_holds_half_the_peak() {
        let (_d, path) = temp();
        let store = waiting_store(&path, Some(LONG));
        let before = store.writer_stats();
        let first = insert_job(&store, 1);
        assert!(
            first.recv_timeout(Duration::from_millis(300)).is_err(),
            "one job, under half the peak of eight, waits for more"
        );
        let rest: Vec<_> = (2..5).map(|x| insert_job(&store, x)).collect();
        assert!(matches!(first.recv_timeout(LONG), Ok((1, None))));
        for a in rest {
            assert!(matches!(a.recv_timeout(LONG), Ok((_, None))));
        }
        let after = store.writer_stats();
        assert_eq!(
            after.batches - before.batches,
            1,
            "the four jobs share one commit"
        );
        assert_eq!(after.jobs - before.jobs, 4);
        assert_eq!(
            rows_of_t(&store),
            [-8, -7, -6, -5, -4, -3, -2, -1, 1, 2, 3, 4]
        );
    }

    #[test]
    fn a_commit_wait_ends_when_no_job_arrives_for_its_gap() {
        let (_d, path) = temp();
        let store = waiting_store(&path, Some(Duration::from_millis(50)));
        let before = store.writer_stats();
        let lone = insert_job(&store, 1);
        assert!(matches!(lone.recv_timeout(LONG / 2), Ok((1, None))));
        let after = store.writer_stats();
        assert_eq!(
            (after.batches - before.batches, after.jobs - before.jobs),
            (1, 1)
        );
    }

    #[test]
    fn without_a_commit_wait_and_with_one_caller_a_job_commits_at_once() {
        // No wait set: a lone job after a batch of eight is committed alone.
        let (_d, path) = temp();
        let store = waiting_store(&path, None);
        let lone = insert_job(&store, 1);
        assert!(matches!(lone.recv_timeout(LONG / 2), Ok((1, None))));

        // A wait set, but one caller at a time: the peak stays at one job and nothing waits.
        let (_d2, path2) = temp();
        let single = over_table_t(
            &path2,
            Some(CommitWait {
                most: LONG,
                gap: LONG,
            }),
        );
        for x in 0..20 {
            let answer = insert_job(&single, x);
            assert!(matches!(answer.recv_timeout(LONG / 2), Ok((y, None)) if y == x));
        }
        assert_eq!(single.writer_stats().largest_batch, 1);
    }

    #[test]
    fn the_recent_peak_is_the_largest_batch_of_the_last_one_to_two_windows() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut peak = RecentPeak::new(start);
        peak.saw(32, at(10));
        assert!(peak.wants_more(15) && !peak.wants_more(16) && !peak.wants_more(0));
        // The next window still remembers the burst.
        peak.saw(2, at(1_100));
        assert!(peak.wants_more(15));
        // The one after has forgotten it: batches of two are the peak now.
        peak.saw(2, at(2_200));
        assert!(
            !peak.wants_more(1),
            "small batches alone never make a writer wait"
        );
        peak.saw(6, at(2_300));
        assert!(peak.wants_more(2) && !peak.wants_more(3));
    }

    #[test]
    fn a_batch_of_ledger_jobs_runs_without_savepoints_and_again_with_them_when_one_fails() {
        let (_d, path) = temp();
        let store = with_table_t(&path);
        let rows = |store: &SqliteStore| -> Vec<i64> {
            let c = connect(store.path()).unwrap();
            let mut st = c.prepare("SELECT x FROM t ORDER BY x").unwrap();
            let v = st.query_map([], |r| r.get(0)).unwrap();
            v.collect::<Result<Vec<i64>, _>>().unwrap()
        };
        // Queues `xs` as one batch (failing those in `failing`); returns each job's runs and
        // answer, in order.
        let batch = |xs: std::ops::Range<i64>, failing: &[i64]| {
            let before = store.writer_stats();
            let release = hold_the_writer(&store);
            let (answered, answers) = std::sync::mpsc::channel();
            let mut runs = Vec::new();
            for x in xs.clone() {
                let counter = Arc::new(AtomicU64::new(0));
                runs.push(counter.clone());
                let job = Insert {
                    x,
                    fail: failing.contains(&x),
                    runs: counter,
                    answered: answered.clone(),
                };
                assert!(store.submit(Job::Again(Box::new(job))).is_ok());
            }
            release.send(()).unwrap();
            let mut got: Vec<(i64, Option<StoreError>)> =
                xs.map(|_| answers.recv().unwrap()).collect();
            got.sort_by_key(|(x, _)| *x);
            let after = store.writer_stats();
            assert_eq!(
                after.batches - before.batches,
                2,
                "the hold, then one batch"
            );
            let runs: Vec<u64> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
            (runs, got)
        };

        // Every job keeps its writes: one run each, all committed.
        let (runs, answers) = batch(0..6, &[]);
        assert_eq!(runs, vec![1; 6]);
        assert!(answers.iter().all(|(_, failure)| failure.is_none()));
        assert_eq!(rows(&store), (0..6).collect::<Vec<_>>());

        // Job 13 fails after its insert: the first pass stops there and is rolled back; the
        // batch runs again with a savepoint per job, and only 13's insert is undone.
        let (runs, answers) = batch(10..16, &[13]);
        assert_eq!(runs, vec![2, 2, 2, 2, 1, 1]);
        assert!(answers.iter().all(|(_, failure)| failure.is_none()));
        let mut expected: Vec<i64> = (0..6).chain([10, 11, 12, 14, 15]).collect();
        assert_eq!(rows(&store), expected);

        // The batches after a failure run with savepoints at once: one run each, a failing
        // job rolled back alone.
        let (runs, _) = batch(20..24, &[21]);
        assert_eq!(runs, vec![1; 4]);
        expected.extend([20, 22, 23]);
        assert_eq!(rows(&store), expected);
    }

    #[test]
    fn cached_statements_are_not_re_prepared_for_new_bindings() {
        let (_d, path) = temp();
        drop(SqliteStore::open(&path, OpenOptions::new("q")).unwrap());
        let c = connect(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE side(op INTEGER PRIMARY KEY REFERENCES operations(id), v TEXT) STRICT;",
        )
        .unwrap();
        let sql = "SELECT o.id, s.v FROM operations o LEFT JOIN side s ON s.op = o.id
                   WHERE o.id = ?1";
        for id in 1..=20i64 {
            let mut stmt = c.prepare_cached(sql).unwrap();
            let mut rows = stmt.query([id]).unwrap();
            while rows.next().unwrap().is_some() {}
        }
        let stmt = c.prepare_cached(sql).unwrap();
        assert_eq!(stmt.get_status(rusqlite::StatementStatus::Run), 20);
        assert_eq!(
            stmt.get_status(rusqlite::StatementStatus::RePrepare),
            0,
            "a new binding must not re-plan the statement"
        );
    }

    #[test]
    fn state_checks_refuse_values_outside_their_lists() {
        let (_d, path) = temp();
        drop(SqliteStore::open(&path, OpenOptions::new("c")).unwrap());
        let c = connect(&path).unwrap();
        let insert = |state: &str, result: Option<&str>, key: &str| {
            c.execute(
                "INSERT INTO operations(tenant, subject, tool, idempotency_key, request_digest,
                     input_rev, output_rev, effect_rev, handler_rev, producer_rev, policy_rev,
                     arguments, effect_kind, state, result, result_digest, status_ref,
                     created_at, updated_at)
                 VALUES ('t', 's', 'tool', ?1, ?2, '1', '1', '1', '1', '1', '1', '{}',
                     'inline', ?3, ?4, ?5, ?6, 0, 0)",
                rusqlite::params![
                    key,
                    "a".repeat(64),
                    state,
                    result,
                    result.map(|_| "b".repeat(64)),
                    format!("op_{key}_ref"),
                ],
            )
        };
        assert!(insert("bogus", None, "k1").is_err());
        assert!(
            insert("applied", None, "k2").is_err(),
            "applied needs a result"
        );
        assert!(
            insert("failed", None, "k3").is_err(),
            "failed needs a result"
        );
        insert("in_progress", None, "k4").unwrap();
        insert("outcome_unknown", None, "k5").unwrap();
        insert("applied", Some("{}"), "k6").unwrap();
        let n: i64 = c
            .query_row("SELECT count(*) FROM operations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 3);
        let id: i64 = c
            .query_row(
                "SELECT id FROM operations WHERE idempotency_key = 'k4'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        let outbox = |state: &str| {
            c.execute(
                "INSERT INTO outbox(operation_id, state, fencing_token, attempt_count,
                     max_attempts, created_at, updated_at)
                 VALUES (?1, ?2, 0, 0, 5, 0, 0)",
                rusqlite::params![id, state],
            )
        };
        assert!(outbox("bogus").is_err());
        outbox("pending").unwrap();
    }

    #[test]
    fn a_full_disk_is_transient_and_other_io_failures_are_io() {
        let sqlite = |code: std::os::raw::c_int| {
            map_err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(code),
                Some("/some/path/ledger.sqlite".into()),
            ))
        };
        let full = sqlite(rusqlite::ffi::SQLITE_FULL);
        assert!(matches!(full, StoreError::Unavailable(_)), "{full:?}");
        assert!(full.is_transient());
        assert!(!format!("{full:?}").contains("/some/path"));
        for code in [
            rusqlite::ffi::SQLITE_IOERR_FSYNC,
            rusqlite::ffi::SQLITE_IOERR_WRITE,
            rusqlite::ffi::SQLITE_READONLY,
        ] {
            let err = sqlite(code);
            assert!(matches!(err, StoreError::Io), "{code}: {err:?}");
            assert_eq!(err.code(), "DATABASE_IO_ERROR");
        }
    }

    #[test]
    fn network_filesystems_are_recognised_and_local_disks_are_not() {
        assert_eq!(network_filesystem_name(0x6969), Some("nfs"));
        assert_eq!(network_filesystem_name(0xff53_4d42), Some("cifs"));
        assert_eq!(network_filesystem_name(0xef53), None, "ext4 is local");
        let (_d, path) = temp();
        assert_eq!(detect_network_filesystem(&path), None);
    }

    #[test]
    fn concurrent_first_opens_do_not_race() {
        let (_d, path) = temp();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let p = path.clone();
                std::thread::spawn(move || {
                    SqliteStore::open(&p, OpenOptions::new("race")).map(|_| ())
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap().unwrap();
        }
        let c = connect(&path).unwrap();
        let n: i64 = c
            .query_row("SELECT count(*) FROM schema_migrations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n as usize, CORE_MIGRATIONS.len());
    }
}
