//! The embedded SQLite backend.
//!
//! One dedicated writer thread owns the only write connection and is fed through a channel; a
//! small pool of read connections serves replays and status queries. Writes from concurrent
//! callers are gathered into one `BEGIN IMMEDIATE` transaction (group commit), each caller's
//! work in its own `SAVEPOINT` so a failing caller rolls back alone; every caller is answered
//! only after the batch's `COMMIT` has returned.
//!
//! Every connection runs with `journal_mode=WAL`, `synchronous=FULL`, `foreign_keys=ON` and
//! `busy_timeout=5000`; the write connection may be opened with `synchronous=NORMAL` instead
//! ([`Synchronous::Normal`], an opt-in that gives up durability on power failure). The file is bound to a backend id in `store_metadata`; opening it with
//! another id, or with a schema newer than this program knows, is refused.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension};
use tokio::sync::oneshot;

use toolledger_core::effect::{Dialect, EffectTx};
use toolledger_core::store::{Driver, Migration, ReadJob, Store, StoreError, WriteJob};

mod driver;
mod effect_tx;

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

/// How to open a [`SqliteStore`].
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// The backend id the file must be bound to. `None` adopts the id of an existing file and
    /// binds a new file to [`DEFAULT_BACKEND_ID`].
    pub backend_id: Option<String>,
    /// Extra migrations (application/reference tables) applied after the core ones.
    pub migrations: Vec<Migration>,
    /// Apply pending migrations to an existing database. A new database is always built to
    /// the current schema; an existing older one is refused unless this is set.
    pub migrate: bool,
    /// Number of read connections kept in the pool.
    pub readers: usize,
    /// The write connection's `synchronous` mode ([`Synchronous::Full`] unless opted out).
    pub synchronous: Synchronous,
}

impl OpenOptions {
    /// Options for `backend_id` with the core migrations only.
    pub fn new(backend_id: impl Into<String>) -> Self {
        OpenOptions {
            backend_id: Some(backend_id.into()),
            migrations: Vec::new(),
            migrate: false,
            readers: 4,
            synchronous: Synchronous::Full,
        }
    }

    /// Options that adopt whatever backend id an existing file is bound to.
    pub fn any_backend() -> Self {
        OpenOptions {
            backend_id: None,
            migrations: Vec::new(),
            migrate: false,
            readers: 4,
            synchronous: Synchronous::Full,
        }
    }

    /// Adds application migrations.
    pub fn with_migrations(mut self, migrations: &[Migration]) -> Self {
        self.migrations.extend_from_slice(migrations);
        self
    }

    /// Allows forward migration of an existing database.
    pub fn allow_migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Sets the write connection's `synchronous` mode.
    pub fn with_synchronous(mut self, synchronous: Synchronous) -> Self {
        self.synchronous = synchronous;
        self
    }
}

/// What a write job hands back to the writer: whether its savepoint is kept, and how to answer
/// its caller once the batch's fate is known.
struct Pending {
    keep: bool,
    deliver: Box<dyn FnOnce(Option<StoreError>) + Send>,
}

type Job = Box<dyn FnOnce(Option<&Connection>) -> Pending + Send>;

/// A read job for a reader thread: the thread's connection, or why it has none.
type ReadJobFn = Box<dyn FnOnce(Result<&Connection, StoreError>) + Send>;

/// The reader threads behind [`SqliteStore::read`], started on the first async read.
#[derive(Default)]
struct ReaderThreads {
    sender: Option<crossbeam_channel::Sender<ReadJobFn>>,
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
}

struct Inner {
    path: PathBuf,
    backend_id: String,
    sender: Mutex<Option<crossbeam_channel::Sender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    readers: Mutex<Vec<Connection>>,
    max_readers: usize,
    stats: Arc<StatCounters>,
    reader_threads: Mutex<ReaderThreads>,
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
                let _ = handle.join();
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

pub(crate) fn map_err(e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode as C;
    match &e {
        rusqlite::Error::SqliteFailure(f, msg) => match f.code {
            C::DatabaseBusy | C::DatabaseLocked => {
                StoreError::Unavailable("database is busy".into())
            }
            C::CannotOpen
            | C::PermissionDenied
            | C::ReadOnly
            | C::DiskFull
            | C::SystemIoFailure => StoreError::Io,
            C::NotADatabase | C::DatabaseCorrupt => {
                StoreError::Corrupt("file is not a database".into())
            }
            C::ConstraintViolation => StoreError::Refused(
                msg.clone()
                    .filter(|m| !m.contains('/'))
                    .unwrap_or_else(|| "constraint violation".into()),
            ),
            _ => StoreError::Database(e.to_string()),
        },
        _ => StoreError::Database(e.to_string()),
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

/// Opens a connection with the ledger's pragmas.
pub fn connect(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .map_err(|e| match map_err(e) {
        StoreError::Database(_) => StoreError::Io,
        other => other,
    })?;
    conn.busy_timeout(Duration::from_millis(5000))
        .map_err(map_err)?;
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

fn bootstrap(conn: &mut Connection, opts: &OpenOptions) -> Result<String, StoreError> {
    let mut all: Vec<Migration> = CORE_MIGRATIONS.to_vec();
    all.extend(opts.migrations.iter().copied());
    let mut known: BTreeMap<&str, u32> = BTreeMap::new();
    for m in &all {
        let e = known.entry(m.namespace).or_insert(0);
        *e = (*e).max(m.version);
    }

    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(map_err)?;
    let mut backend_id = opts
        .backend_id
        .clone()
        .unwrap_or_else(|| DEFAULT_BACKEND_ID.to_string());
    let has_meta: bool =
        tx.query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type='table' AND name='store_metadata'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(|e| match map_err(e) {
            StoreError::Database(_) => StoreError::Corrupt("unreadable schema".into()),
            other => other,
        })? > 0;
    let is_new = if has_meta {
        let bound: Option<String> = tx
            .query_row(
                "SELECT value FROM store_metadata WHERE key='backend_id'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(map_err)?;
        backend_id = match (bound, &opts.backend_id) {
            (Some(b), Some(want)) if &b == want => b,
            (Some(b), None) => b,
            (Some(_), Some(_)) => return Err(StoreError::BackendMismatch),
            (None, _) => return Err(StoreError::Corrupt("missing backend id".into())),
        };
        false
    } else {
        let other_tables: i64 = tx
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE type='table'",
                [],
                |r| r.get(0),
            )
            .map_err(map_err)?;
        if other_tables > 0 {
            return Err(StoreError::Corrupt("not a toolledger database".into()));
        }
        tx.execute_batch(
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
        tx.execute(
            "INSERT INTO store_metadata(key, value) VALUES ('backend_id', ?1), ('backend', 'sqlite')",
            [&backend_id],
        ).map_err(map_err)?;
        true
    };

    // Current versions per namespace.
    let mut applied: BTreeMap<String, u32> = BTreeMap::new();
    {
        let mut stmt = tx
            .prepare("SELECT namespace, max(version) FROM schema_migrations GROUP BY namespace")
            .map_err(map_err)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .map_err(map_err)?;
        for row in rows {
            let (ns, v) = row.map_err(map_err)?;
            applied.insert(ns, v as u32);
        }
    }
    for (ns, &have) in &applied {
        if let Some(&max) = known.get(ns.as_str()) {
            if have > max {
                return Err(StoreError::SchemaTooNew {
                    namespace: ns.clone(),
                    found: have,
                    supported: max,
                });
            }
        }
    }
    // A namespace never seen before (new application tables) is created without ceremony; a
    // namespace that exists at an older version needs an explicit migrate.
    for (ns, &max) in &known {
        let have = applied.get(*ns).copied().unwrap_or(0);
        if have > 0 && have < max && !is_new && !opts.migrate {
            return Err(StoreError::SchemaOutdated {
                namespace: (*ns).to_string(),
                found: have,
                current: max,
            });
        }
    }
    all.sort_by_key(|m| (m.namespace != "toolledger", m.namespace, m.version));
    for m in &all {
        let have = applied.get(m.namespace).copied().unwrap_or(0);
        if m.version > have {
            tx.execute_batch(m.sql).map_err(map_err)?;
            tx.execute(
                "INSERT INTO schema_migrations(namespace, version) VALUES (?1, ?2)",
                rusqlite::params![m.namespace, m.version],
            )
            .map_err(map_err)?;
        }
    }
    tx.commit().map_err(map_err)?;
    Ok(backend_id)
}

impl SqliteStore {
    /// Opens (creating if needed) the ledger at `path`. Bootstrap and migrations run in one
    /// `BEGIN IMMEDIATE` transaction, so two processes opening a new file at once do not race.
    pub fn open(path: impl AsRef<Path>, opts: OpenOptions) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        if let Some(fs) = detect_network_filesystem(&path) {
            return Err(StoreError::NetworkFilesystem(fs));
        }
        let mut conn = connect(&path)?;
        let backend_id = bootstrap(&mut conn, &opts)?;
        if opts.synchronous == Synchronous::Normal {
            conn.execute_batch("PRAGMA synchronous=NORMAL;")
                .map_err(map_err)?;
        }

        let (sender, receiver) = crossbeam_channel::unbounded::<Job>();
        let stats = Arc::new(StatCounters::default());
        let writer_stats = stats.clone();
        let writer = std::thread::Builder::new()
            .name("toolledger-sqlite-writer".into())
            .spawn(move || writer_loop(conn, receiver, &writer_stats))
            .map_err(|_| StoreError::Unavailable("cannot start writer thread".into()))?;

        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                backend_id,
                sender: Mutex::new(Some(sender)),
                writer: Mutex::new(Some(writer)),
                readers: Mutex::new(Vec::new()),
                max_readers: opts.readers.max(1),
                stats,
                reader_threads: Mutex::new(ReaderThreads::default()),
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

    fn submit(&self, job: Job) -> Result<(), StoreError> {
        self.submit_job(job).map_err(|(e, _)| e)
    }

    /// Sends `job` to the writer; on failure hands it back with the reason.
    fn submit_job(&self, job: Job) -> Result<(), (StoreError, Job)> {
        let Ok(guard) = self.inner.sender.lock() else {
            return Err((StoreError::Unavailable("writer poisoned".into()), job));
        };
        match guard.as_ref() {
            Some(s) => s.send(job).map_err(|crossbeam_channel::SendError(job)| {
                (StoreError::Unavailable("writer stopped".into()), job)
            }),
            None => Err((StoreError::Unavailable("store closed".into()), job)),
        }
    }

    fn make_job<T, E, F>(f: F, reply: oneshot::Sender<Result<T, E>>) -> Job
    where
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        Box::new(move |conn: Option<&Connection>| {
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
            let outcome = catch_unwind(AssertUnwindSafe(|| f(conn))).unwrap_or_else(|_| {
                Err(E::from(StoreError::Database("write job panicked".into())))
            });
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
        })
    }

    /// Runs `f` inside the writer's `BEGIN IMMEDIATE` transaction (in its own savepoint) and
    /// returns its result once the transaction has committed. If `f` returns `Err`, everything it
    /// wrote is rolled back and nothing else in the batch is affected.
    pub async fn write<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.submit(Self::make_job(f, tx)).map_err(E::from)?;
        rx.await
            .unwrap_or_else(|_| Err(E::from(StoreError::Unavailable("writer stopped".into()))))
    }

    /// Blocking form of [`SqliteStore::write`] for synchronous callers (never call it from an
    /// async task).
    pub fn write_blocking<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.submit(Self::make_job(f, tx)).map_err(E::from)?;
        rx.blocking_recv()
            .unwrap_or_else(|_| Err(E::from(StoreError::Unavailable("writer stopped".into()))))
    }

    fn take_reader(&self) -> Result<Connection, StoreError> {
        if let Some(c) = self
            .inner
            .readers
            .lock()
            .map_err(|_| StoreError::Unavailable("reader pool poisoned".into()))?
            .pop()
        {
            return Ok(c);
        }
        connect_reader(&self.inner.path)
    }

    fn return_reader(&self, conn: Connection) {
        if let Ok(mut pool) = self.inner.readers.lock() {
            if pool.len() < self.inner.max_readers {
                pool.push(conn);
            }
        }
    }

    fn submit_read(&self, job: ReadJobFn) -> Result<(), StoreError> {
        self.submit_read_job(job).map_err(|(e, _)| e)
    }

    /// Sends `job` to the reader threads (started on first use); on failure hands it back
    /// with the reason.
    fn submit_read_job(&self, job: ReadJobFn) -> Result<(), (StoreError, ReadJobFn)> {
        let Ok(mut threads) = self.inner.reader_threads.lock() else {
            return Err((StoreError::Unavailable("reader pool poisoned".into()), job));
        };
        if threads.sender.is_none() {
            let (sender, receiver) = crossbeam_channel::unbounded::<ReadJobFn>();
            for i in 0..self.inner.max_readers {
                let receiver = receiver.clone();
                let path = self.inner.path.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("toolledger-sqlite-reader-{i}"))
                    .spawn(move || reader_loop(&path, receiver));
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
            Some(s) => s.send(job).map_err(|crossbeam_channel::SendError(job)| {
                (StoreError::Unavailable("readers stopped".into()), job)
            }),
            None => Err((StoreError::Unavailable("store closed".into()), job)),
        }
    }

    /// Runs `f` on a read-only connection owned by one of the store's reader threads (never
    /// on the async runtime). At most [`OpenOptions::readers`] reads run at once; more wait
    /// in a queue, so a burst of callers never opens extra connections. Wrap several reads in
    /// `BEGIN`…`COMMIT` for one snapshot; a transaction left open is rolled back.
    pub async fn read<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: ReadJobFn = Box::new(move |conn| {
            let out = match conn {
                Ok(conn) => catch_unwind(AssertUnwindSafe(|| f(conn))).unwrap_or_else(|_| {
                    Err(E::from(StoreError::Database("read job panicked".into())))
                }),
                Err(e) => Err(E::from(e)),
            };
            let _ = tx.send(out);
        });
        self.submit_read(job).map_err(E::from)?;
        rx.await
            .unwrap_or_else(|_| Err(E::from(StoreError::Unavailable("readers stopped".into()))))
    }

    /// Blocking form of [`SqliteStore::read`].
    pub fn read_blocking<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&Connection) -> Result<T, E>,
        E: From<StoreError>,
    {
        let conn = self.take_reader().map_err(E::from)?;
        let out = f(&conn);
        if conn.is_autocommit() {
            self.return_reader(conn);
        }
        out
    }
}

/// Opens a read-only connection with the ledger's pragmas.
fn connect_reader(path: &Path) -> Result<Connection, StoreError> {
    let conn = connect(path)?;
    conn.execute_batch("PRAGMA query_only=ON;")
        .map_err(map_err)?;
    Ok(conn)
}

fn reader_loop(path: &Path, receiver: crossbeam_channel::Receiver<ReadJobFn>) {
    let mut conn: Option<Connection> = None;
    while let Ok(job) = receiver.recv() {
        if conn.is_none() {
            match connect_reader(path) {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    job(Err(e));
                    continue;
                }
            }
        }
        let Some(c) = conn.as_ref() else { continue };
        job(Ok(c));
        if !c.is_autocommit() && c.execute_batch("ROLLBACK").is_err() {
            // A connection stuck in a transaction is replaced.
            conn = None;
        }
    }
}

fn writer_loop(conn: Connection, receiver: crossbeam_channel::Receiver<Job>, stats: &StatCounters) {
    while let Ok(first) = receiver.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // Counted before the batch runs, so a caller that has been answered sees its batch.
        let n = batch.len() as u64;
        stats.batches.fetch_add(1, Ordering::Relaxed);
        stats.jobs.fetch_add(n, Ordering::Relaxed);
        stats.largest_batch.fetch_max(n, Ordering::Relaxed);
        run_batch(&conn, batch);
    }
}

/// Runs one statement through the connection's statement cache (transaction control is on
/// every job's path; parsing it again each time was measurable).
fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

fn run_batch(conn: &Connection, batch: Vec<Job>) {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let err = map_err(e);
        for job in batch {
            let pending = job(None);
            (pending.deliver)(Some(clone_err(&err)));
        }
        return;
    }
    let mut pendings = Vec::with_capacity(batch.len());
    for job in batch {
        if let Err(e) = exec_cached(conn, "SAVEPOINT job") {
            let err = map_err(e);
            let pending = job(None);
            (pending.deliver)(Some(err));
            continue;
        }
        let pending = job(Some(conn));
        let closed = if pending.keep {
            exec_cached(conn, "RELEASE job")
        } else {
            exec_cached(conn, "ROLLBACK TO job").and_then(|()| exec_cached(conn, "RELEASE job"))
        };
        if let Err(e) = closed {
            // The savepoint could not be closed: the whole transaction is suspect.
            let err = map_err(e);
            let _ = conn.execute_batch("ROLLBACK");
            (pending.deliver)(Some(clone_err(&err)));
            for p in pendings {
                let p: Pending = p;
                (p.deliver)(Some(clone_err(&err)));
            }
            return;
        }
        pendings.push(pending);
    }
    match conn.execute_batch("COMMIT") {
        Ok(()) => {
            for p in pendings {
                (p.deliver)(None);
            }
        }
        Err(e) => {
            let err = map_err(e);
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            for p in pendings {
                (p.deliver)(Some(clone_err(&err)));
            }
        }
    }
}

fn clone_err(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
        StoreError::Io => StoreError::Io,
        StoreError::Corrupt(m) => StoreError::Corrupt(m.clone()),
        StoreError::Refused(m) => StoreError::Refused(m.clone()),
        other => StoreError::Database(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            .read_blocking(|c| {
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

    /// One integer from `sql` on the writer's connection and on a reader's.
    fn on_writer_and_reader(store: &SqliteStore, sql: &'static str) -> (i64, i64) {
        let query = move |c: &Connection| c.query_row(sql, [], |r| r.get(0)).map_err(map_err);
        (
            store.write_blocking(query).unwrap(),
            store.read_blocking(query).unwrap(),
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
            .write_blocking(|c| {
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
            .read_blocking(|c| {
                c.query_row("SELECT count(*) FROM app_b", [], |r| r.get(0))
                    .map_err(map_err)
            })
            .unwrap();
        assert_eq!(n, 0);
    }

    #[test]
    fn a_foreign_file_is_not_adopted() {
        let (_d, path) = temp();
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch("CREATE TABLE other(x)").unwrap();
        }
        let err = SqliteStore::open(&path, OpenOptions::new("x")).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
        let (_d2, garbage) = temp();
        std::fs::write(&garbage, vec![0x42u8; 8192]).unwrap();
        let err = SqliteStore::open(&garbage, OpenOptions::new("x")).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_failing_job_in_a_batch_leaves_its_neighbours_committed() {
        let (_d, path) = temp();
        const APP: &[Migration] = &[Migration {
            namespace: "t",
            version: 1,
            sql: "CREATE TABLE t(x INTEGER NOT NULL UNIQUE) STRICT;",
        }];
        let store = SqliteStore::open(&path, OpenOptions::new("b").with_migrations(APP)).unwrap();
        let mut handles = Vec::new();
        for i in 0..200i64 {
            let s = store.clone();
            handles.push(tokio::spawn(async move {
                s.write(move |c| {
                    c.execute("INSERT INTO t(x) VALUES (?1)", [i])
                        .map_err(map_err)?;
                    if i % 7 == 0 {
                        // Fails after writing: its own insert must vanish.
                        return Err(StoreError::Refused("deliberate".into()));
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
            .read(|c| {
                let mut st = c.prepare("SELECT x FROM t ORDER BY x").map_err(map_err)?;
                let v = st
                    .query_map([], |r| r.get(0))
                    .map_err(map_err)?
                    .collect::<Result<Vec<i64>, _>>()
                    .map_err(map_err)?;
                Ok::<_, StoreError>(v)
            })
            .await
            .unwrap();
        assert_eq!(ok, rows.len());
        assert!(rows.iter().all(|x| x % 7 != 0));
        assert_eq!(rows.len(), 200 - 29);
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
