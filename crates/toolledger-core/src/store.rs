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

use crate::effect::{Dialect, EffectTx};
use crate::model::{Error, ErrorCode};

pub use crate::ledger::OperationRow;

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

    /// Whether the job's caller may be answered only once its transaction is on the disk
    /// (the default). `false`: the commit may return once the transaction is in the
    /// database's log, where it survives the process's crash but not yet the machine's; the
    /// caller promises that nobody is told of what it wrote before a later write that does
    /// wait for the disk has committed. Both logs are sequential, so that write's flush
    /// carries this one. A driver may always wait anyway.
    fn waits_for_disk(&self) -> bool {
        true
    }
}

/// A unit of read work handed to a [`Driver`]: run once, in one read-only snapshot.
pub trait ReadJob: Send {
    /// Runs the work on `tx`, or reports why there is no snapshot to run it in, and answers
    /// the job's caller.
    fn run(self: Box<Self>, tx: Result<&mut dyn EffectTx, StoreError>);
}

/// Background work a store's writer does a little at a time ([`Driver::background`]): maintenance
/// (pruning) that must not hold the writer while calls wait for it.
///
/// The writer runs one step at the end of each transaction it commits for others, in a savepoint
/// of its own, and one step alone, in a transaction of its own, when nothing else waits. A step
/// whose savepoint fails is rolled back alone; the others' writes are not affected.
pub trait BackgroundWork: Send {
    /// Does one step inside `tx`: at the end of a transaction holding the writes of `callers`
    /// callers' jobs, or, with `callers == 0`, in a transaction of its own (the writer has
    /// nothing else to do). Returns whether work is left after this step.
    fn step(&mut self, tx: &mut dyn EffectTx, callers: usize) -> Result<bool, StoreError>;

    /// The transaction holding the last step committed (`None`) or did not (the reason): what
    /// that step did is then undone.
    fn settled(&mut self, failure: Option<&StoreError>);

    /// Whether whoever waits for this work is gone; the writer then drops it.
    fn abandoned(&self) -> bool;

    /// The work is over: done (`None`), or stopped by the reason.
    fn finish(self: Box<Self>, failure: Option<StoreError>);
}

/// Why [`Driver::background`] did not take background work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackgroundRefused {
    /// The driver has no single writer to hand it to: do the work in transactions of its own.
    NoWriter,
    /// The writer holds other background work (one at a time), or its queue is full.
    Busy,
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

    /// The driver's physical integrity checks, run by the audit inside its read snapshot `tx`
    /// (SQLite: `integrity_check`, foreign keys, WAL and `synchronous=FULL`; PostgreSQL:
    /// validated constraints, enabled foreign-key triggers, `fsync`, `synchronous_commit`,
    /// B-tree checks when `amcheck` is installed). Returns whether they pass and what they
    /// found, as one JSON object.
    fn physical_checks(
        &self,
        tx: &mut dyn EffectTx,
    ) -> Result<(bool, serde_json::Value), StoreError>;

    /// The query of the operations compaction takes next ([`crate::prune`]), in this driver's
    /// dialect: the `id` of live, settled operations whose retention deadline is at or before
    /// `?1`, oldest deadline first, at most `?2`. Default: the portable query.
    fn compactable_operations(&self) -> &'static str {
        crate::ledger::COMPACTABLE
    }

    /// Gives at most `max_pages` free pages of the database back to the file system, inside
    /// the write transaction `tx`, after rows were deleted, keeping free pages up to
    /// `keep_free_percent` of the pages in use; returns how many it gave back.
    /// SQLite: `PRAGMA incremental_vacuum` on a file in `auto_vacuum = INCREMENTAL` mode (its
    /// free pages are otherwise reused by later writes). Default (PostgreSQL, whose space
    /// autovacuum makes reusable): nothing.
    fn reclaim_space(
        &self,
        tx: &mut dyn EffectTx,
        max_pages: i64,
        keep_free_percent: u8,
    ) -> Result<i64, StoreError> {
        let _ = (tx, max_pages, keep_free_percent);
        Ok(0)
    }

    /// Hands `work` to the store's writer, to be done a step at a time beside the writes it
    /// commits ([`BackgroundWork`]). Refused (and `work` dropped unstarted) when this driver
    /// has no such writer (default: PostgreSQL, whose writers run in parallel), or when its
    /// writer already holds background work or cannot take more now.
    fn background(&self, work: Box<dyn BackgroundWork>) -> Result<(), BackgroundRefused> {
        drop(work);
        Err(BackgroundRefused::NoWriter)
    }

    /// The driver itself, for driver-specific tools (a file's checks, benchmark counters).
    fn as_any(&self) -> &dyn Any;
}

/// What every driver's open options share: the binding, the migrations, read-only, the queue
/// bounds. A driver's options type holds one in its field `shared` and implements
/// [`StoreOptions`] for the setters.
#[derive(Clone, Debug, Default)]
pub struct SharedOptions {
    /// The backend id the database must be bound to. `None` adopts the existing binding and
    /// binds a new database to the driver's default id.
    pub backend_id: Option<String>,
    /// Application migrations (in the driver's dialect), applied after the core ones.
    pub migrations: Vec<Migration>,
    /// Apply pending migrations to an existing database (`toolledger migrate`). A new
    /// database is always built to the current schema; an existing older one is refused
    /// unless this is set.
    pub migrate: bool,
    /// Open an existing ledger read-only: nothing is created or migrated and every
    /// transaction is read-only; a database that holds no ledger is
    /// [`StoreError::NotALedger`].
    pub read_only: bool,
    /// The bounds of the store's queues: a job that finds its queue full, or waits in it too
    /// long, is answered [`StoreError::Unavailable`] without running (see [`QueueLimits`]).
    pub queue: QueueLimits,
}

impl SharedOptions {
    /// Options bound to `backend_id` (`None`: adopt the existing binding).
    pub fn new(backend_id: Option<String>) -> Self {
        SharedOptions {
            backend_id,
            ..SharedOptions::default()
        }
    }
}

/// The setters every driver's open options have, over its [`SharedOptions`]. Bring it into
/// scope to chain them: `OpenOptions::new("id").with_migrations(APP).allow_migrate(true)`.
pub trait StoreOptions: Sized {
    /// The shared part of these options.
    fn shared_mut(&mut self) -> &mut SharedOptions;

    /// Opens the ledger read-only ([`SharedOptions::read_only`]).
    fn with_read_only(mut self, read_only: bool) -> Self {
        self.shared_mut().read_only = read_only;
        self
    }

    /// Adds application migrations (in the driver's dialect).
    fn with_migrations(mut self, migrations: &[Migration]) -> Self {
        self.shared_mut().migrations.extend_from_slice(migrations);
        self
    }

    /// Allows forward migration of an existing database.
    fn allow_migrate(mut self, migrate: bool) -> Self {
        self.shared_mut().migrate = migrate;
        self
    }

    /// Sets the bounds of the store's queues.
    fn with_queue(mut self, queue: QueueLimits) -> Self {
        self.shared_mut().queue = queue;
        self
    }
}

/// How many jobs may wait in one of a store's queues (a writer's, the readers', the
/// connection threads', the inline batch queue) and for how long.
///
/// A job that finds its queue holding `depth` jobs is answered [`StoreError::Unavailable`]
/// at once; a queued job not started within `wait` is answered the same way without running.
/// Either way it changed nothing, and the same call may simply be retried: under overload the
/// store sheds the calls it cannot serve in time instead of queueing them without limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLimits {
    /// The most jobs waiting in one queue (at least 1).
    pub depth: usize,
    /// The longest a job waits in the queue before it is answered `unavailable`.
    pub wait: std::time::Duration,
}

impl QueueLimits {
    /// The default depth of a queue: 1024 jobs.
    pub const DEFAULT_DEPTH: usize = 1024;
    /// The default longest wait in a queue: 5 seconds (as long as SQLite's `busy_timeout`).
    pub const DEFAULT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

    /// Whether a job queued at `queued_at` has waited past [`QueueLimits::wait`] by `now`.
    pub fn expired(&self, queued_at: std::time::Instant, now: std::time::Instant) -> bool {
        now.saturating_duration_since(queued_at) > self.wait
    }
}

impl Default for QueueLimits {
    fn default() -> Self {
        QueueLimits {
            depth: Self::DEFAULT_DEPTH,
            wait: Self::DEFAULT_WAIT,
        }
    }
}

/// The error of a job refused because its queue is full (see [`QueueLimits`]).
pub fn queue_full() -> StoreError {
    overload_count("full");
    StoreError::Unavailable("the store is overloaded: its queue is full".into())
}

/// The error of a job that waited in its queue past [`QueueLimits::wait`].
pub fn queue_wait_expired() -> StoreError {
    overload_count("wait");
    StoreError::Unavailable("the store is overloaded: a queued job waited too long".into())
}

/// `toolledger_store_overload_total{reason}`: jobs answered `unavailable` because their queue
/// was full (`full`) or they waited in it too long (`wait`).
fn overload_count(reason: &'static str) {
    metrics::counter!("toolledger_store_overload_total", "reason" => reason).increment(1);
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

    /// The bounds of the queue of calls waiting for a batch writer.
    fn queue_limits(&self) -> QueueLimits {
        QueueLimits::default()
    }
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

/// A `(tool, idempotency_key)` pair a batch looks up ([`BatchTx::lookup_scopes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScopeKey<'a> {
    /// The tool's name.
    pub tool: &'a str,
    /// The idempotency key.
    pub key: &'a str,
}

/// A ledger row a batch inserts as `inline` and `applied` ([`BatchTx::insert_applied_then_commit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppliedRow<'a> {
    /// The caller's tenant.
    pub tenant: &'a str,
    /// The caller's subject.
    pub subject: &'a str,
    /// The tool's contract: its name and six revisions.
    pub contract: &'a crate::model::ToolContract,
    /// The idempotency key.
    pub key: &'a str,
    /// The request digest.
    pub request_digest: &'a str,
    /// The canonical arguments' text.
    pub arguments: &'a str,
    /// The keyed request fingerprint, when the call has one.
    pub fingerprint: Option<&'a str>,
    /// The status reference.
    pub status_ref: &'a str,
    /// The authority deadline (Unix seconds), if any.
    pub authority_deadline: Option<i64>,
    /// The retention deadline (Unix seconds), if any.
    pub retention_deadline: Option<i64>,
    /// The stored result's canonical text.
    pub result: &'a str,
    /// The stored result's digest.
    pub result_digest: &'a str,
}

/// One batch transaction: the effects' statements plus what a batch needs around them.
pub trait BatchTx {
    /// The transaction as the handle effects and ledger code write through.
    fn effect_tx(&mut self) -> &mut dyn EffectTx;

    /// Serializes, until the transaction ends, every writer that locks one of `keys` (sorted
    /// by the caller, so two batches never deadlock on them). May be sent with the next
    /// statement.
    fn lock_keys(&mut self, keys: &[String]) -> Result<(), Error>;

    /// Every ledger row of the given scopes (each tenant's and subject's included).
    fn lookup_scopes(&mut self, scopes: &[ScopeKey<'_>]) -> Result<Vec<OperationRow>, Error>;

    /// Inserts the ledger rows of the batch's fresh calls as `inline` and `applied`, created
    /// and updated at `now`, and commits. Returns `(id, status_ref)` of every inserted row.
    fn insert_applied_then_commit(
        &mut self,
        rows: &[AppliedRow<'_>],
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
    /// See [`WriteJob::waits_for_disk`].
    flush: bool,
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
            .unwrap_or_else(|_| Err(E::from(panicked(tx.dialect(), "write job panicked"))));
        let keep = out.is_ok();
        self.out = Some(out);
        keep
    }

    fn waits_for_disk(&self) -> bool {
        self.flush
    }

    fn finish(self: Box<Self>, failure: Option<StoreError>) {
        let Write { f, out, reply, .. } = *self;
        // What the closure captured (often a handle on this very store) goes before the
        // caller hears back: once answered, the caller may drop its own handle, and the last
        // one must not be dropped on the driver's thread.
        drop(f);
        let result = match (out, failure) {
            (Some(Ok(_)), Some(err)) | (None, Some(err)) => Err(E::from(err)),
            (Some(out), _) => out,
            (None, None) => Err(E::from(StoreError::Unavailable(
                "the write did not run".into(),
            ))),
        };
        if let Some(reply) = reply {
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
                .unwrap_or_else(|_| Err(E::from(panicked(tx.dialect(), "read job panicked")))),
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

    /// Hands `f` to the driver as a write job (`flush`: see [`WriteJob::waits_for_disk`]);
    /// its answer comes on the receiver.
    fn submit_write_job<T, E, F>(&self, f: F, flush: bool) -> oneshot::Receiver<Result<T, E>>
    where
        F: FnMut(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        self.driver.submit_write(Box::new(Write {
            f,
            out: None,
            reply: Some(reply),
            flush,
        }));
        rx
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
        self.write_flushed_or_not(f, true).await
    }

    /// [`Store::write`] whose commit need not wait for the disk: it returns once the
    /// transaction is in the database's log, where the process's crash cannot undo it but the
    /// machine's could, until the next write that waits for the disk commits and carries it
    /// (see [`WriteJob::waits_for_disk`]). For a write nobody is told of before such a write
    /// follows: the intent of a call its own caller forwards next, whose claim is flushed
    /// before anything is sent.
    pub async fn write_unflushed<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnMut(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        self.write_flushed_or_not(f, false).await
    }

    async fn write_flushed_or_not<T, E, F>(&self, f: F, flush: bool) -> Result<T, E>
    where
        F: FnMut(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        self.submit_write_job(f, flush)
            .await
            .unwrap_or_else(|_| Err(E::from(stopped())))
    }

    /// Blocking form of [`Store::write`]; never call it from async code.
    pub fn write_blocking<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnMut(&mut dyn EffectTx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        self.submit_write_job(f, true)
            .blocking_recv()
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

/// A job that panicked inside a transaction of `backend` (the transaction's writes of that job
/// are rolled back).
fn panicked(backend: Dialect, what: &str) -> StoreError {
    StoreError::Failed {
        backend,
        reason: what.into(),
    }
}

/// A numbered schema migration. Migrations are grouped by `namespace` so a library, an
/// application and its reference tools can each own their tables; within a namespace versions
/// are applied in order, each exactly once (the policy is [`migrate::run`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migration {
    /// Owner of the migration, e.g. `toolledger` or `reference.issues`.
    pub namespace: &'static str,
    /// Version within the namespace, starting at 1 with no gaps.
    pub version: u32,
    /// The DDL to run (inside the bootstrap/migration transaction).
    pub sql: &'static str,
}

impl Migration {
    /// Migration `version` of `namespace`, running `sql`.
    pub const fn new(namespace: &'static str, version: u32, sql: &'static str) -> Self {
        Migration {
            namespace,
            version,
            sql,
        }
    }
}

#[path = "migrate.rs"]
pub mod migrate;

/// What kind of failure a [`StoreError`] is. The kind decides whether a caller may simply
/// retry ([`StoreErrorKind::is_transient`]) and which CLI code it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreErrorKind {
    /// The database is busy, locked, unreachable, closed or a statement timed out: transient.
    Unavailable,
    /// The database is bound to another backend id.
    Binding,
    /// The schema is newer or older than this program, or the migration list is malformed.
    Schema,
    /// The database is damaged or is not a toolledger database.
    Corrupt,
    /// Stored data violates the storage contract.
    Contract,
    /// A constraint or trigger refused a write.
    Refused,
    /// The database file could not be opened, read or written, or lives where it must not.
    Io,
    /// Any other failure.
    Other,
}

impl StoreErrorKind {
    /// Whether the failure may go away by itself, so the same call may simply be retried.
    pub fn is_transient(self) -> bool {
        self == StoreErrorKind::Unavailable
    }
}

/// The CLI code of a database failure of `backend` that has no code of its own:
/// `SQLITE_ERROR` or `POSTGRES_ERROR` (what [`StoreError::code`] gives a refused write or
/// any other failure of that backend's database).
pub fn database_error_code(backend: Dialect) -> &'static str {
    match backend {
        Dialect::Sqlite => "SQLITE_ERROR",
        Dialect::Postgres => "POSTGRES_ERROR",
    }
}

/// Why a store operation failed. Display strings are safe to show: no paths, no SQL, no
/// values, no host names.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// The database is busy, locked, unreachable or closed; the call may be retried.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A statement ran longer than the store's time limit and was cancelled (its transaction
    /// rolled back); the call may be retried.
    #[error("statement timed out")]
    TimedOut,
    /// The database is bound to another backend id.
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
    /// The migrations this program was given are malformed (a gap, a duplicate version with
    /// other SQL, a version 0); nothing was applied.
    #[error("migrations of {namespace} are malformed: {reason}")]
    MigrationsInvalid {
        /// Namespace of the malformed migrations.
        namespace: String,
        /// What is wrong with them.
        reason: String,
    },
    /// The ledger is damaged: the database reports corruption, or its recorded migrations
    /// have a gap.
    #[error("the database is damaged: {0}")]
    Corrupt(String),
    /// The database holds no ledger: a file that is not SQLite, a database or schema of
    /// another application (or, for a read-only open, an empty file or database). Nothing
    /// was created or changed.
    #[error("not a toolledger ledger: {0}")]
    NotALedger(String),
    /// Stored data violates the storage contract (non-canonical JSON, digest mismatch…).
    #[error("storage contract violated: {0}")]
    Contract(String),
    /// A constraint or trigger of `backend` refused the write; the transaction was rolled
    /// back.
    #[error("write refused by the database: {reason}")]
    Refused {
        /// The backend whose constraint refused the write.
        backend: Dialect,
        /// Which kind of constraint (`unique constraint`, `check constraint`, …), never its
        /// text.
        reason: String,
    },
    /// The file lives on a network filesystem, where SQLite's WAL locking does not coordinate
    /// processes on different hosts. Use PostgreSQL for multi-host deployments.
    #[error("database file is on a network filesystem ({0}); use a local disk or PostgreSQL")]
    NetworkFilesystem(&'static str),
    /// The file could not be opened, created, read or written.
    #[error("database file could not be opened, read or written")]
    Io,
    /// Any other error of `backend`'s database.
    #[error("database error")]
    Failed {
        /// The backend that failed.
        backend: Dialect,
        /// A safe description (never shown to callers).
        reason: String,
    },
    /// Any other failure not tied to one backend (a store this build cannot open, a job that
    /// panicked).
    #[error("database error")]
    Database(String),
    /// The database URL cannot be used: not a `postgres://` URL, malformed, or naming TLS
    /// settings that cannot be used. The reason is this program's own words, never the URL.
    #[error("the database URL is not valid: {0}")]
    UrlInvalid(String),
    /// No connection to the database server could be made: the connection error (refused,
    /// no such host, authentication failed, no such database, a timeout), in the server's or
    /// the operating system's words, never the URL or its password. Transient like
    /// [`StoreError::Unavailable`].
    #[error("cannot connect to the database: {0}")]
    Unreachable(String),
}

impl StoreError {
    /// The kind of failure.
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            StoreError::Unavailable(_) | StoreError::TimedOut | StoreError::Unreachable(_) => {
                StoreErrorKind::Unavailable
            }
            StoreError::BackendMismatch => StoreErrorKind::Binding,
            StoreError::SchemaTooNew { .. }
            | StoreError::SchemaOutdated { .. }
            | StoreError::MigrationsInvalid { .. } => StoreErrorKind::Schema,
            StoreError::Corrupt(_) | StoreError::NotALedger(_) => StoreErrorKind::Corrupt,
            StoreError::Contract(_) => StoreErrorKind::Contract,
            StoreError::Refused { .. } => StoreErrorKind::Refused,
            StoreError::NetworkFilesystem(_) | StoreError::Io => StoreErrorKind::Io,
            StoreError::Failed { .. } | StoreError::Database(_) | StoreError::UrlInvalid(_) => {
                StoreErrorKind::Other
            }
        }
    }

    /// Whether the same call may simply be retried (see [`StoreErrorKind::is_transient`]).
    pub fn is_transient(&self) -> bool {
        self.kind().is_transient()
    }

    /// The backend the failure came from, when it came from one backend's database.
    pub fn backend(&self) -> Option<Dialect> {
        match self {
            StoreError::Refused { backend, .. } | StoreError::Failed { backend, .. } => {
                Some(*backend)
            }
            _ => None,
        }
    }

    /// A stable upper-case code naming the failure (the code `toolledger` prints when it exits
    /// with status 2). A refused write and any other database failure name their backend:
    /// `SQLITE_ERROR` or `POSTGRES_ERROR`; a failure tied to no backend is `STORE_ERROR`.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) | StoreError::TimedOut => "STORE_UNAVAILABLE",
            StoreError::BackendMismatch => "BACKEND_MISMATCH",
            StoreError::SchemaTooNew { .. } => "SCHEMA_TOO_NEW",
            StoreError::SchemaOutdated { .. } => "SCHEMA_OUTDATED",
            StoreError::MigrationsInvalid { .. } => "MIGRATIONS_INVALID",
            StoreError::Corrupt(_) => "DATABASE_CORRUPT",
            StoreError::NotALedger(_) => "NOT_A_LEDGER",
            StoreError::Contract(_) => "PERSISTENCE_CONTRACT_ERROR",
            StoreError::Refused { backend, .. } | StoreError::Failed { backend, .. } => {
                database_error_code(*backend)
            }
            StoreError::Io => "DATABASE_IO_ERROR",
            StoreError::NetworkFilesystem(_) => "NETWORK_FILESYSTEM",
            StoreError::Database(_) => "STORE_ERROR",
            StoreError::UrlInvalid(_) => "DATABASE_URL_INVALID",
            StoreError::Unreachable(_) => "DATABASE_UNREACHABLE",
        }
    }

    /// The error a caller sees for this failure: a safe message that keeps the kind
    /// (`store unavailable`, `statement timed out`, `write refused by the database`,
    /// `storage contract violated: …`, …).
    ///
    /// The code is [`ErrorCode::Unavailable`] for every kind: the contract's code table has no
    /// code for a damaged store, a violated storage contract or a refused write, and pins
    /// `unavailable` for them on the wire. Whether a retry can help is
    /// [`StoreError::is_transient`], for callers that hold the `StoreError`.
    pub fn caller_error(&self) -> Error {
        let message = match self {
            StoreError::Unavailable(_) | StoreError::Unreachable(_) => {
                "store unavailable".to_string()
            }
            StoreError::Refused { .. } => "write refused by the database".to_string(),
            StoreError::Corrupt(_) => "the database is damaged".into(),
            StoreError::NotALedger(_) => "the database is not a toolledger ledger".into(),
            other => other.to_string(),
        };
        Error::new(ErrorCode::Unavailable, message)
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        e.caller_error()
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;

    #[test]
    fn codes_name_the_backend_and_keep_the_kind() {
        let refused = |backend| StoreError::Refused {
            backend,
            reason: "check constraint".into(),
        };
        let failed = |backend| StoreError::Failed {
            backend,
            reason: "x".into(),
        };
        assert_eq!(refused(Dialect::Sqlite).code(), "SQLITE_ERROR");
        assert_eq!(failed(Dialect::Sqlite).code(), "SQLITE_ERROR");
        assert_eq!(refused(Dialect::Postgres).code(), "POSTGRES_ERROR");
        assert_eq!(failed(Dialect::Postgres).code(), "POSTGRES_ERROR");
        assert_eq!(StoreError::Database("x".into()).code(), "STORE_ERROR");
        assert_eq!(StoreError::TimedOut.code(), "STORE_UNAVAILABLE");
        assert_eq!(
            refused(Dialect::Postgres).backend(),
            Some(Dialect::Postgres)
        );
        assert_eq!(StoreError::Io.backend(), None);
        assert_eq!(refused(Dialect::Sqlite).kind(), StoreErrorKind::Refused);
        assert_eq!(
            StoreError::Contract("x".into()).kind(),
            StoreErrorKind::Contract
        );
        assert!(StoreError::Unavailable("busy".into()).is_transient());
        assert!(StoreError::TimedOut.is_transient());
        for permanent in [
            refused(Dialect::Sqlite),
            StoreError::Contract("x".into()),
            StoreError::Corrupt("x".into()),
            StoreError::BackendMismatch,
            StoreError::Io,
            failed(Dialect::Postgres),
        ] {
            assert!(!permanent.is_transient(), "{permanent:?}");
        }
    }

    #[test]
    fn caller_errors_keep_the_kind_in_a_safe_message() {
        let msg = |e: StoreError| Error::from(e).message;
        assert_eq!(
            msg(StoreError::Unavailable("database is busy".into())),
            "store unavailable"
        );
        assert_eq!(msg(StoreError::TimedOut), "statement timed out");
        assert_eq!(
            msg(StoreError::Refused {
                backend: Dialect::Postgres,
                reason: "check constraint".into()
            }),
            "write refused by the database"
        );
        assert_eq!(
            msg(StoreError::Contract("result digest mismatch".into())),
            "storage contract violated: result digest mismatch"
        );
        assert_eq!(
            msg(StoreError::Failed {
                backend: Dialect::Sqlite,
                reason: "near \"SELEC\": syntax error".into()
            }),
            "database error"
        );
        assert_eq!(msg(StoreError::Database("secret".into())), "database error");
        assert_eq!(
            Error::from(StoreError::Corrupt("x".into())).code,
            ErrorCode::Unavailable
        );
    }
}
