//! Durable storage: the one seam between the ledger and a database driver.
//!
//! The ledger's code (inline effects, the deferred runtime, the outbox, approvals, the
//! principal store) runs on a [`Store`]: closures over an [`EffectTx`], so one piece of ledger
//! code runs on every backend. A backend implements [`Driver`] (and, to group inline calls of
//! parallel writers into shared transactions, [`BatchDriver`]); this crate knows no driver
//! type and no database library. The drivers are separate crates: `toolledger-sqlite` (the
//! embedded default) and `toolledger-postgres` (many hosts); the `toolledger` facade opens
//! either from a path or a URL. Every driver passes the conformance suite in
//! `toolledger-testkit`.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::effect::{Dialect, EffectTx, SqlValue};
use crate::model::{Error, ErrorCode};

/// A unit of write work handed to a [`Driver`]: the driver runs it inside a write
/// transaction (possibly more than once, after a transient conflict, each time in a fresh
/// transaction) and then tells it how the transaction ended.
pub trait WriteJob: Send {
    /// Runs the work on `tx`. Returns whether its writes are to be kept (`false`: roll back
    /// what this job wrote, and only that).
    fn run(&mut self, tx: &mut dyn EffectTx) -> bool;

    /// Answers the job's caller. `failure` is `None` when the transaction holding the job's
    /// last run committed (or when the job asked for its own rollback), and the reason when
    /// the job could not run or its transaction did not commit.
    fn finish(self: Box<Self>, failure: Option<StoreError>);
}

/// A unit of read work handed to a [`Driver`]: run once, in one read-only snapshot.
pub trait ReadJob: Send {
    /// Runs the work on `tx`, or reports why there is no snapshot to run it in, and answers
    /// the job's caller.
    fn run(self: Box<Self>, tx: Result<&mut dyn EffectTx, StoreError>);
}

/// A database backend: where [`Store`] sends its transactions.
///
/// A driver owns its connections and the threads that use them (blocking database work never
/// runs on the async runtime), its SQL dialect, and its bootstrap. It must
/// - run every [`WriteJob`] in a write transaction and call [`WriteJob::finish`] exactly once,
///   only after the transaction that holds the job's kept writes has committed (or failed);
/// - run every [`ReadJob`] in one read-only snapshot;
/// - keep the error kinds of [`StoreError`] (unavailable, refused, corrupt, contract…) and
///   never put SQL text, paths or secrets into them.
pub trait Driver: Send + Sync + std::fmt::Debug + 'static {
    /// The backend id the database is bound to.
    fn backend_id(&self) -> &str;

    /// The SQL dialect of the backend.
    fn dialect(&self) -> Dialect;

    /// Queues `job` for a write transaction (see the trait docs).
    fn submit_write(&self, job: Box<dyn WriteJob>);

    /// Queues `job` for a read-only snapshot.
    fn submit_read(&self, job: Box<dyn ReadJob>);

    /// Whether the ledger should look for a scope in a read snapshot before writing. Drivers
    /// with one writer (SQLite) say yes, so replays never queue behind writes; drivers whose
    /// writers run in parallel and send the lookup with the write say no.
    fn reads_first(&self) -> bool {
        true
    }

    /// Group commit of inline calls across parallel writers, when the driver offers it.
    fn batching(&self) -> Option<Arc<dyn BatchDriver>> {
        None
    }

    /// The driver itself, for driver-specific tools (a file's checks, benchmark counters).
    fn as_any(&self) -> &dyn Any;
}

/// Group commit of inline calls for a driver whose writers run in parallel: the ledger's
/// inline path queues concurrent calls and runs up to a batch of them in one transaction on
/// one of the driver's batch writers. The ledger decides everything about the calls; the
/// driver gives the transaction, its savepoints and the two statements a batch needs.
pub trait BatchDriver: Send + Sync + 'static {
    /// How many batch writers run at once.
    fn batch_writers(&self) -> usize;

    /// Runs `job` on batch writer `writer` (below [`BatchDriver::batch_writers`]) without
    /// waiting for it. The job may run any number of transactions through its
    /// [`BatchWriter`] and answers its own callers.
    fn spawn_batch_job(&self, writer: usize, job: BatchJob) -> Result<(), StoreError>;
}

/// A job for one batch writer (see [`BatchDriver::spawn_batch_job`]).
pub type BatchJob = Box<dyn FnOnce(&mut dyn BatchWriter) + Send>;

/// A batch writer's connection, lent to one batch job.
pub trait BatchWriter {
    /// Runs `f` in one write transaction and commits it (`Err` rolls it back); run again
    /// (bounded) after a transient conflict the transaction recorded.
    fn write(
        &mut self,
        f: &mut dyn FnMut(&mut dyn BatchTx) -> Result<(), Error>,
    ) -> Result<(), Error>;

    /// Closes the connection (the server rolls back whatever is open on it); the next write
    /// connects again.
    fn discard_connection(&mut self);
}

/// One batch transaction: the effects' statements plus what a batch needs around them.
pub trait BatchTx {
    /// The transaction as the handle effects and ledger code write through.
    fn effect_tx(&mut self) -> &mut dyn EffectTx;

    /// Serializes, until the transaction ends, every writer that locks one of `keys` (sorted
    /// by the caller, so two batches never deadlock on them). May be sent with the next
    /// statement.
    fn lock_keys(&mut self, keys: &[String]) -> Result<(), Error>;

    /// Every ledger row of the given `(tool, idempotency_key)` pairs, a JSON array of
    /// `{"tool", "k"}` objects, with the columns of [`crate::operation_columns!`] in that
    /// order.
    fn lookup_scopes(&mut self, pairs_json: &str) -> Result<Vec<Vec<SqlValue>>, Error>;

    /// Inserts the ledger rows of the batch's fresh calls (a JSON array of objects, one per
    /// row: `tenant`, `subject`, `tool`, `k` (the idempotency key), `request_digest`, the six
    /// revisions `input_rev` … `policy_rev`, `arguments`, `fingerprint`, `status_ref`,
    /// `authority_deadline`, `retention_deadline`, `result`, `result_digest`) as `inline`
    /// and `applied`, created and updated at `now`, and commits. Returns `(id, status_ref)` of every inserted row.
    fn insert_applied_then_commit(
        &mut self,
        rows_json: &str,
        now: i64,
    ) -> Result<Vec<(i64, String)>, Error>;

    /// Opens a savepoint around the next call.
    fn savepoint(&mut self) -> Result<(), Error>;

    /// Releases the savepoint of the call that just ended (may be sent with the next
    /// statement).
    fn release_savepoint(&mut self);

    /// Rolls back to the savepoint of the call that just failed. Returns whether the failure
    /// was a transient conflict (the call may be queued again).
    fn rollback_to_savepoint(&mut self) -> bool;

    /// How many statements have been sent to the server so far in this transaction: a call
    /// that failed without raising it changed nothing.
    fn flights(&self) -> u64;

    /// Forgets a key lock that has not been sent yet (the call that asked for it failed
    /// before sending anything).
    fn drop_unsent_lock(&mut self);

    /// Takes the transaction's "run me again" mark (a transient conflict was met).
    fn take_retry(&mut self) -> bool;
}

/// The generic write job behind [`Store::write`].
struct Write<T, E, F> {
    f: F,
    out: Option<Result<T, E>>,
    reply: Option<oneshot::Sender<Result<T, E>>>,
}

impl<T, E, F> WriteJob for Write<T, E, F>
where
    F: FnMut(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: From<StoreError> + Send + 'static,
{
    fn run(&mut self, tx: &mut dyn EffectTx) -> bool {
        let f = &mut self.f;
        let out = catch_unwind(AssertUnwindSafe(|| f(tx)))
            .unwrap_or_else(|_| Err(E::from(StoreError::Database("write job panicked".into()))));
        let keep = out.is_ok();
        self.out = Some(out);
        keep
    }

    fn finish(mut self: Box<Self>, failure: Option<StoreError>) {
        let result = match (self.out.take(), failure) {
            (Some(Ok(_)), Some(err)) | (None, Some(err)) => Err(E::from(err)),
            (Some(out), _) => out,
            (None, None) => Err(E::from(StoreError::Unavailable(
                "the write did not run".into(),
            ))),
        };
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(result);
        }
    }
}

/// The generic read job behind [`Store::read`].
struct Read<T, E, F> {
    f: F,
    reply: oneshot::Sender<Result<T, E>>,
}

impl<T, E, F> ReadJob for Read<T, E, F>
where
    F: FnOnce(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: From<StoreError> + Send + 'static,
{
    fn run(self: Box<Self>, tx: Result<&mut dyn EffectTx, StoreError>) {
        let Read { f, reply } = *self;
        let out = match tx {
            Ok(tx) => catch_unwind(AssertUnwindSafe(|| f(tx)))
                .unwrap_or_else(|_| Err(E::from(StoreError::Database("read job panicked".into())))),
            Err(e) => Err(E::from(e)),
        };
        let _ = reply.send(out);
    }
}

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
pub struct Store {
    driver: Arc<dyn Driver>,
}

impl Store {
    /// A store over `driver`.
    pub fn new(driver: impl Driver) -> Self {
        Store {
            driver: Arc::new(driver),
        }
    }

    /// The backend id the database is bound to.
    pub fn backend_id(&self) -> &str {
        self.driver.backend_id()
    }

    /// The SQL dialect of the backend.
    pub fn dialect(&self) -> Dialect {
        self.driver.dialect()
    }

    /// The driver behind this store.
    pub fn driver(&self) -> &dyn Driver {
        self.driver.as_ref()
    }

    /// The driver as its own type `D`, when it is one (for driver-specific tools: a SQLite
    /// file's checks, benchmark counters).
    pub fn driver_as<D: Driver>(&self) -> Option<&D> {
        self.driver.as_any().downcast_ref::<D>()
    }

    fn write_job<T, E, F>(f: F) -> (Box<dyn WriteJob>, oneshot::Receiver<Result<T, E>>)
    where
        F: FnMut(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job = Write {
            f,
            out: None,
            reply: Some(reply),
        };
        (Box::new(job), rx)
    }

    fn read_job<T, E, F>(f: F) -> (Box<dyn ReadJob>, oneshot::Receiver<Result<T, E>>)
    where
        F: FnOnce(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        (Box::new(Read { f, reply }), rx)
    }

    /// Runs `f` in a write transaction and returns its result once committed (see the type's
    /// docs).
    pub async fn write<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnMut(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (job, rx) = Self::write_job(f);
        self.driver.submit_write(job);
        rx.await.unwrap_or_else(|_| Err(E::from(stopped())))
    }

    /// Blocking form of [`Store::write`]; never call it from async code.
    pub fn write_blocking<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnMut(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (job, rx) = Self::write_job(f);
        self.driver.submit_write(job);
        rx.blocking_recv()
            .unwrap_or_else(|_| Err(E::from(stopped())))
    }

    /// Runs `f` in one read-only snapshot.
    pub async fn read<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (job, rx) = Self::read_job(f);
        self.driver.submit_read(job);
        rx.await.unwrap_or_else(|_| Err(E::from(stopped())))
    }

    /// Blocking form of [`Store::read`]; never call it from async code.
    pub fn read_blocking<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (job, rx) = Self::read_job(f);
        self.driver.submit_read(job);
        rx.blocking_recv()
            .unwrap_or_else(|_| Err(E::from(stopped())))
    }
}

fn stopped() -> StoreError {
    StoreError::Unavailable("the database thread stopped".into())
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
