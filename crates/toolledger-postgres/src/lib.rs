//! The PostgreSQL driver of toolledger, for many server and worker processes on many hosts
//! sharing one database.
//!
//! # Threads and the async client
//!
//! Ledger code runs synchronous closures over an [`EffectTx`] (the same closures the SQLite
//! backend runs on its writer thread). A [`PgStore`] keeps a fixed set of connection threads
//! ([`PgOptions::max_connections`]); each owns one tokio-postgres connection and the
//! current-thread tokio runtime that drives it, so a statement's request, the connection task
//! and the reply all run on that one thread — no cross-thread wake-up per statement (a shared
//! pool on a multi-thread runtime cost two per statement and about 3× the latency of a
//! replay). Jobs reach a free thread through one channel; async callers await a oneshot reply
//! and never block their runtime; synchronous callers use the `_blocking` forms from any
//! thread that is not driving async tasks. A thread connects on first use and reconnects when
//! its connection has closed.
//!
//! # Transactions
//!
//! - Writes run at `READ COMMITTED`. Reservations are `INSERT … ON CONFLICT DO NOTHING` followed
//!   by reading the authoritative row back (the insert waits for a competing inserter to
//!   finish, and the next statement sees its commit); checks that span rows no unique
//!   constraint covers take a transaction-scoped advisory lock ([`EffectTx::lock_key`]);
//!   claims lock the outbox row with `FOR UPDATE SKIP LOCKED`; every later outbox transition is
//!   an `UPDATE … WHERE fencing_token = ?`, which PostgreSQL re-checks against the newest row
//!   version.
//! - A deadlock (`40P01`), serialization failure (`40001`) or unique violation (`23505`, a
//!   check-then-insert that lost a race) rolls the transaction back and runs the closure
//!   again, at most [`MAX_WRITE_ATTEMPTS`] times in all. Write closures are therefore `FnMut`
//!   and must not keep side effects outside the transaction.
//! - Reads run in one `REPEATABLE READ READ ONLY` transaction: one snapshot, like SQLite's
//!   `BEGIN … COMMIT` on a read connection.
//! - A transaction's `BEGIN` and a pending key lock go out pipelined with its first statement;
//!   statements of [`EffectTx::execute_unanswered`] (an event, a state mark, a receipt) wait,
//!   in order, and go out with the next statement or with `COMMIT`. A write transaction in
//!   which a statement failed on the server never commits, whatever its closure answers: the
//!   server aborted it.
//! - A write job that need not wait for the disk ([`WriteJob::waits_for_disk`]) commits with
//!   `SET LOCAL synchronous_commit TO OFF`, sent with its `COMMIT`; the log is flushed in
//!   order, so the next commit that waits carries it.
//! - Connection loss, a server shutting down or a connect timeout is
//!   [`StoreError::Unavailable`] (`unavailable` to callers, retryable); a write whose `COMMIT`
//!   was interrupted may or may not have committed, and a retry replays or redoes it under
//!   the same idempotency key. A thread whose connection broke connects again for its next job;
//!   a write whose first statement finds the connection dead runs again on a new one.
//! - Every session runs with `statement_timeout` (default 30 s); a statement that hits it
//!   fails with a clean `unavailable` error and its transaction rolls back.
//!
//! # Schema
//!
//! Migrations are numbered per namespace like SQLite's, written in PostgreSQL dialect
//! (`sql/pg_000N_*.sql`), and run in one transaction holding `pg_advisory_xact_lock`, so two
//! hosts opening a new database at once do not race. `store_metadata` binds the schema to one
//! backend id; a newer schema is refused and an older one needs `toolledger migrate`. The
//! policy is core's [`migrate::run`]; this driver gives it the hooks, with its own SQL and
//! locking. [`PgOptions::schema`] puts the ledger in a schema of its own (via `search_path`).
//!
//! # Errors
//!
//! Failures keep their kind and name PostgreSQL: a refused write is
//! [`StoreError::Refused`] and any other database error [`StoreError::Failed`], both
//! `POSTGRES_ERROR` on the command line; a statement timeout is [`StoreError::TimedOut`].
//!
//! # TLS
//!
//! TLS is rustls (ring) and follows libpq's `sslmode` in the URL: `disable`; `prefer` (the
//! default: TLS when the server offers it); `require` (always TLS, the certificate not
//! checked); `verify-ca` and `verify-full` (the chain, and for `verify-full` the host name,
//! checked against `sslrootcert` or, without it, the Mozilla roots). See `tls.rs`.

#![warn(missing_docs)]

mod driver;
mod tls;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::runtime::Runtime;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{IsNull, Kind, ToSql, Type};
use tokio_postgres::{Client, NoTls, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;
use toolledger_core::metric::QueueDepth;

use toolledger_core::effect::{refuse_transaction_control, Dialect, EffectTx, RowExt, SqlValue};
use toolledger_core::model::Error;
use toolledger_core::store::migrate::{self, Binding, MigrationHooks, MigrationRequest};
use toolledger_core::store::{
    queue_full, queue_wait_expired, AppliedRow, BatchDriver, BatchJob, BatchTx, BatchWriter,
    Driver, Migration, OperationRow, ReadJob, ScopeKey, Store, StoreError, WriteJob,
};

pub use toolledger_core::store::{QueueLimits, SharedOptions, StoreOptions};

/// The migrations of the library's own tables in PostgreSQL dialect (namespace `toolledger`):
/// versions 1–6 are those of the SQLite driver's `CORE_MIGRATIONS`; version 7 (the scope's
/// unique index reordered to serve the `(tool, idempotency_key)` lookups too) is PostgreSQL's
/// alone; version 8 is the re-plan guard's index; version 9 turns the single-column rules of
/// the tables every call writes into domains (the same rules, checked only where a value is
/// assigned, and not rebuilt from text for every statement).
pub const CORE_MIGRATIONS: &[Migration] = &[
    Migration {
        namespace: "toolledger",
        version: 1,
        sql: include_str!("sql/pg_0001_core.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 2,
        sql: include_str!("sql/pg_0002_runtime.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 3,
        sql: include_str!("sql/pg_0003_keys.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 4,
        sql: include_str!("sql/pg_0004_operator_index.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 5,
        sql: include_str!("sql/pg_0005_retention.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 6,
        sql: include_str!("sql/pg_0006_receipt_ids.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 7,
        sql: include_str!("sql/pg_0007_scope_index.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 8,
        sql: include_str!("sql/pg_0008_replan_index.sql"),
    },
    Migration {
        namespace: "toolledger",
        version: 9,
        sql: include_str!("sql/pg_0009_domains.sql"),
    },
];

/// The backend id a new database gets when none is requested.
pub const DEFAULT_BACKEND_ID: &str = "postgres:default";

/// Attempts a write transaction gets when it meets a deadlock, a serialization failure or a
/// lost insert race.
pub const MAX_WRITE_ATTEMPTS: u32 = 5;

/// How to open a [`PgStore`]: the options every driver shares ([`SharedOptions`], set with
/// [`StoreOptions`]) and PostgreSQL's own.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// The binding, migrations, read-only and queue bounds. A read-only open makes every
    /// transaction read-only (`default_transaction_read_only`); the queues are the
    /// connection threads' and the batch writers'. A new database without a backend id is
    /// bound to [`DEFAULT_BACKEND_ID`].
    pub shared: SharedOptions,
    /// Connection threads (each holds one connection).
    pub max_connections: usize,
    /// The schema the ledger lives in (created if missing); `None` uses the server default.
    pub schema: Option<String>,
    /// Per-statement time limit.
    pub statement_timeout: Duration,
    /// How long a connection attempt may take (the TCP connect and the start-up exchange)
    /// before the job that needed it is answered `unavailable`.
    pub connect_timeout: Duration,
    /// The longest a connection is used: an older one is closed and replaced before the next
    /// transaction on it (so connections move to a restarted or failed-over server, and no
    /// server-side session state grows without end).
    pub max_lifetime: Duration,
    /// Connection threads that run batched inline calls (group commit: concurrent
    /// [`toolledger_core::engine::Engine::execute_inline`] calls share one transaction, one round
    /// trip for their lookups and one multi-row ledger insert). At least 1. They come in
    /// addition to `max_connections`, so a store holds at most `max_connections +
    /// batch_writers` connections (each made on first use).
    pub batch_writers: usize,
}

impl StoreOptions for PgOptions {
    fn shared_mut(&mut self) -> &mut SharedOptions {
        &mut self.shared
    }
}

impl PgOptions {
    /// Options for `backend_id` with the core migrations only.
    pub fn new(backend_id: impl Into<String>) -> Self {
        Self::bound(Some(backend_id.into()))
    }

    /// Options that adopt whatever backend id the database is bound to.
    pub fn any_backend() -> Self {
        Self::bound(None)
    }

    fn bound(backend_id: Option<String>) -> Self {
        PgOptions {
            shared: SharedOptions::new(backend_id),
            max_connections: 16,
            schema: None,
            statement_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            max_lifetime: Duration::from_secs(30 * 60),
            batch_writers: 2,
        }
    }

    /// Sets the longest a connection is used before it is replaced.
    pub fn with_max_lifetime(mut self, max_lifetime: Duration) -> Self {
        self.max_lifetime = max_lifetime;
        self
    }

    /// Puts the ledger in `schema`.
    pub fn in_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }
}

/// Whether `name` is a plain, unquoted PostgreSQL identifier we accept as a schema name.
pub fn valid_schema_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Rewrites `?N` placeholders as `$N`, leaving string literals, quoted identifiers and
/// comments alone.
pub fn translate_placeholders(sql: &str) -> String {
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut i = 0;
    let mut start = 0;
    while i < bytes.len() {
        match bytes[i] {
            q @ (b'\'' | b'"') => {
                i += 1;
                while i < bytes.len() && bytes[i] != q {
                    i += 1;
                }
                i += 1;
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'?' if bytes.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                out.push_str(&sql[start..i]);
                out.push('$');
                i += 1;
                start = i;
            }
            _ => i += 1,
        }
    }
    out.push_str(&sql[start.min(sql.len())..]);
    out
}

fn is_retryable(state: &SqlState) -> bool {
    *state == SqlState::T_R_SERIALIZATION_FAILURE
        || *state == SqlState::T_R_DEADLOCK_DETECTED
        || *state == SqlState::UNIQUE_VIOLATION
}

/// Maps a PostgreSQL error to a [`StoreError`] that keeps its kind and names PostgreSQL,
/// without SQL text, values or host names (a SQLSTATE is the most it says).
pub(crate) fn map_pg_error(e: &tokio_postgres::Error) -> StoreError {
    let failed = |reason: String| StoreError::Failed {
        backend: Dialect::Postgres,
        reason,
    };
    let refused = |reason: &str| StoreError::Refused {
        backend: Dialect::Postgres,
        reason: reason.into(),
    };
    let Some(state) = e.code() else {
        // No SQLSTATE: the connection broke, or a parameter could not be encoded.
        if e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()) {
            return StoreError::Unavailable("database connection lost".into());
        }
        return failed("database error".into());
    };
    let code = state.code();
    if *state == SqlState::QUERY_CANCELED {
        return StoreError::TimedOut;
    }
    if code.starts_with("08")
        || code.starts_with("57P")
        || code.starts_with("53")
        || *state == SqlState::T_R_SERIALIZATION_FAILURE
        || *state == SqlState::T_R_DEADLOCK_DETECTED
        || *state == SqlState::LOCK_NOT_AVAILABLE
    {
        return StoreError::Unavailable("database unavailable or busy".into());
    }
    if *state == SqlState::UNIQUE_VIOLATION {
        return refused("unique constraint");
    }
    if *state == SqlState::CHECK_VIOLATION {
        return refused("check constraint");
    }
    if *state == SqlState::FOREIGN_KEY_VIOLATION {
        return refused("foreign key constraint");
    }
    if *state == SqlState::NOT_NULL_VIOLATION {
        return refused("not-null constraint");
    }
    if *state == SqlState::RAISE_EXCEPTION {
        return refused("refused by a trigger");
    }
    if code.starts_with("23") {
        return refused("constraint violation");
    }
    if code.starts_with("22") {
        return refused("a value out of range or malformed");
    }
    if *state == SqlState::UNDEFINED_TABLE || *state == SqlState::UNDEFINED_COLUMN {
        return StoreError::Corrupt("the database schema is not a toolledger schema".into());
    }
    failed(format!("database error {code}"))
}

/// One bound parameter.
#[derive(Debug)]
struct Param<'a>(&'a SqlValue);

impl ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        // A column of a domain (the schema's checked text and integer types) takes a value of
        // the domain's base type.
        let ty = match ty.kind() {
            Kind::Domain(base) => base,
            _ => ty,
        };
        match self.0 {
            SqlValue::Null => Ok(IsNull::Yes),
            SqlValue::Integer(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::BOOL => (*i != 0).to_sql(ty, out),
                _ => Err("an integer is bound to a non-integer parameter".into()),
            },
            SqlValue::Text(s) => match *ty {
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    s.as_str().to_sql(&Type::TEXT, out)
                }
                _ => Err("text is bound to a non-text parameter".into()),
            },
            SqlValue::Blob(b) => match *ty {
                Type::BYTEA => b.as_slice().to_sql(ty, out),
                _ => Err("bytes are bound to a non-bytea parameter".into()),
            },
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

fn column_value(row: &tokio_postgres::Row, i: usize) -> Result<SqlValue, tokio_postgres::Error> {
    let ty = row.columns()[i].type_().clone();
    Ok(match ty {
        Type::INT8 => row.try_get::<_, Option<i64>>(i)?.into(),
        Type::INT4 => row.try_get::<_, Option<i32>>(i)?.map(i64::from).into(),
        Type::INT2 => row.try_get::<_, Option<i16>>(i)?.map(i64::from).into(),
        Type::BOOL => row
            .try_get::<_, Option<bool>>(i)?
            .map(|b| if b { 1i64 } else { 0 })
            .into(),
        Type::BYTEA => match row.try_get::<_, Option<Vec<u8>>>(i)? {
            Some(b) => SqlValue::Blob(b),
            None => SqlValue::Null,
        },
        _ => row.try_get::<_, Option<String>>(i)?.into(),
    })
}

/// Every column of every row as [`SqlValue`]s.
fn row_values(rows: &[tokio_postgres::Row]) -> Result<Vec<Vec<SqlValue>>, Error> {
    rows.iter()
        .map(|row| {
            (0..row.len())
                .map(|i| {
                    column_value(row, i).map_err(|_| {
                        Error::unavailable("a column type is outside the effect contract")
                    })
                })
                .collect()
        })
        .collect()
}

/// One connection, owned by one worker thread together with the current-thread runtime that
/// drives it: a statement's request, the connection task and the reply all run on that thread,
/// with no cross-thread wake-up per statement.
struct Slot {
    rt: Runtime,
    config: Arc<tokio_postgres::Config>,
    tls: Option<MakeRustlsConnect>,
    client: Option<Client>,
    statements: HashMap<String, Statement>,
    /// When the current connection was made.
    connected_at: Instant,
    /// The longest a connection is used ([`PgOptions::max_lifetime`]).
    max_lifetime: Duration,
}

impl Slot {
    fn new(
        config: Arc<tokio_postgres::Config>,
        tls: Option<MakeRustlsConnect>,
        max_lifetime: Duration,
    ) -> Result<Slot, StoreError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|_| StoreError::Unavailable("cannot start a database thread".into()))?;
        Ok(Slot {
            rt,
            config,
            tls,
            client: None,
            statements: HashMap::new(),
            connected_at: Instant::now(),
            max_lifetime,
        })
    }

    /// The live connection, (re)connecting when there is none, it has closed or it is older
    /// than [`PgOptions::max_lifetime`].
    fn connect(&mut self) -> Result<(), StoreError> {
        if self.client.is_some() && self.connected_at.elapsed() > self.max_lifetime {
            // Dropping the client ends its connection task, which closes the session.
            self.client = None;
            self.statements.clear();
            metrics::counter!("toolledger_store_connections_recycled_total", "backend" => "postgres")
                .increment(1);
        }
        if self.client.is_some() {
            // Let the connection task read what arrived while the thread was idle (a server
            // that shut down has closed the socket), without a round trip.
            self.rt.block_on(tokio::task::yield_now());
        }
        if self.client.as_ref().is_some_and(|c| !c.is_closed()) {
            return Ok(());
        }
        self.client = None;
        self.statements.clear();
        let password = self.config.get_password().map(<[u8]>::to_vec);
        let unavailable = |e: tokio_postgres::Error| {
            StoreError::Unreachable(connect_error(&e, password.as_deref()))
        };
        let client = match self.tls.clone() {
            None => {
                let (client, connection) = self
                    .rt
                    .block_on(self.config.connect(NoTls))
                    .map_err(unavailable)?;
                self.rt.spawn(async move {
                    let _ = connection.await;
                });
                client
            }
            Some(tls) => {
                let (client, connection) = self
                    .rt
                    .block_on(self.config.connect(tls))
                    .map_err(unavailable)?;
                self.rt.spawn(async move {
                    let _ = connection.await;
                });
                client
            }
        };
        self.client = Some(client);
        self.connected_at = Instant::now();
        Ok(())
    }

    /// Forgets a connection that has closed (after an error).
    fn check_closed(&mut self) {
        if self.client.as_ref().is_some_and(Client::is_closed) {
            self.client = None;
            self.statements.clear();
        }
    }

    fn simple(&mut self, sql: &str) -> Result<(), tokio_postgres::Error> {
        let client = self.client.as_ref().expect("connected");
        self.rt.block_on(client.batch_execute(sql))
    }

    /// A transaction handle whose `BEGIN` (`begin`) goes out together with its first
    /// statement, saving a round trip.
    fn tx(&mut self, begin: &'static str) -> PgTx<'_> {
        let Slot {
            rt,
            client,
            statements,
            ..
        } = self;
        PgTx {
            rt,
            client: client.as_ref().expect("connected"),
            statements,
            pending: vec![begin],
            savepoint: Savepoint::None,
            lock: None,
            queued: Vec::new(),
            may_queue: begin == BEGIN_WRITE,
            aborted: None,
            began: false,
            succeeded: false,
            last_error: None,
            retry: false,
            committed: false,
            flights: 0,
        }
    }
}

/// Where the one call savepoint of a batched write stands ([`PgTx::savepoint`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Savepoint {
    None,
    /// `SAVEPOINT` is queued in `pending`, not sent.
    Queued,
    /// `SAVEPOINT` was sent.
    Open,
}

const SAVEPOINT: &str = "SAVEPOINT toolledger_call";
const RELEASE: &str = "RELEASE SAVEPOINT toolledger_call";
const ROLLBACK_TO: &str =
    "ROLLBACK TO SAVEPOINT toolledger_call; RELEASE SAVEPOINT toolledger_call";

/// [`EffectTx`] over the open transaction of one [`Slot`].
pub(crate) struct PgTx<'a> {
    rt: &'a Runtime,
    client: &'a Client,
    statements: &'a mut HashMap<String, Statement>,
    /// Transaction control not sent yet (`BEGIN …`, savepoints): it goes out, in order, in
    /// one flight with the next statement (or with `COMMIT`).
    pending: Vec<&'static str>,
    savepoint: Savepoint,
    /// A key lock not sent yet: it goes out, in order, with the next statement.
    lock: Option<(Statement, SqlValue)>,
    /// Statements of [`EffectTx::execute_unanswered`] not sent yet: they go out, in order,
    /// after the key lock and ahead of the next statement (or of `COMMIT`), in one flight.
    queued: Vec<(Statement, Vec<SqlValue>)>,
    /// Whether statements may wait in `queued` (a write transaction outside a savepoint).
    may_queue: bool,
    /// The failure that aborted the transaction on the server, unless a rollback to the call
    /// savepoint undid it: such a transaction cannot commit, whatever its closure answers.
    aborted: Option<StoreError>,
    /// Whether `BEGIN` was sent (so the transaction must be ended).
    began: bool,
    /// Whether any statement succeeded.
    succeeded: bool,
    last_error: Option<StoreError>,
    retry: bool,
    /// Whether [`PgTx::query_then_commit`] ended the transaction (committed).
    committed: bool,
    /// Flights sent to the server (each statement, with what went out ahead of it).
    flights: u64,
}

impl PgTx<'_> {
    fn fail(&mut self, e: tokio_postgres::Error) -> Error {
        // A deadlock, a serialization failure, a lost insert race — or a connection found dead
        // before anything ran: the transaction can simply run again.
        if e.code().is_some_and(is_retryable) || (!self.succeeded && self.client.is_closed()) {
            self.retry = true;
        }
        let mapped = map_pg_error(&e);
        let safe = mapped.caller_error();
        self.aborted = Some(mapped.clone());
        self.last_error = Some(mapped);
        safe
    }

    fn statement(&mut self, sql: &str) -> Result<Statement, Error> {
        refuse_transaction_control(sql)?;
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let translated = translate_placeholders(sql);
        // Pending transaction control goes first: after a failed call a `ROLLBACK TO
        // SAVEPOINT` may be queued, and an aborted transaction refuses even to prepare.
        let (control, lock, queued) = self.preamble();
        let client = self.client;
        match self.rt.block_on(pipelined(
            client,
            control,
            lock.as_ref(),
            &queued,
            client.prepare(&translated),
        )) {
            Ok(stmt) => {
                if self.statements.len() >= 512 {
                    self.statements.clear();
                }
                self.statements.insert(sql.to_string(), stmt.clone());
                Ok(stmt)
            }
            Err(e) => Err(self.fail(e)),
        }
    }
}

/// Sends pending transaction control (`BEGIN`, savepoints), a pending key lock and queued
/// statements ahead of `main` in one flight: the server runs them in order, in one round trip
/// instead of one each. The first failure in that order is the answer (after it the
/// server refuses the rest of the transaction).
async fn pipelined<R>(
    client: &Client,
    begin: Option<String>,
    lock: Option<&(Statement, SqlValue)>,
    queued: &[(Statement, Vec<SqlValue>)],
    main: impl std::future::Future<Output = Result<R, tokio_postgres::Error>>,
) -> Result<R, tokio_postgres::Error> {
    let begin = async {
        match begin {
            Some(b) => client.batch_execute(&b).await,
            None => Ok(()),
        }
    };
    let lock = async {
        match lock {
            Some((stmt, key)) => {
                let p = Param(key);
                client
                    .execute(stmt, &[&p as &(dyn ToSql + Sync)])
                    .await
                    .map(|_| ())
            }
            None => Ok(()),
        }
    };
    let queued = in_order(queued.iter().map(|(stmt, params)| async move {
        let bound: Vec<Param<'_>> = params.iter().map(Param).collect();
        let refs: Vec<&(dyn ToSql + Sync)> =
            bound.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
        client.execute(stmt, &refs).await.map(|_| ())
    }));
    let (began, locked, queued, out) = tokio::join!(begin, lock, queued, main);
    began?;
    locked?;
    queued?;
    out
}

/// The most statements [`EffectTx::execute_unanswered`] keeps waiting for the next flight.
const MAX_QUEUED: usize = 16;

/// Runs `futures` together, polling them in order (so requests go out in that order), and
/// answers the first failure in that order.
async fn in_order<F>(futures: impl Iterator<Item = F>) -> Result<(), tokio_postgres::Error>
where
    F: std::future::Future<Output = Result<(), tokio_postgres::Error>>,
{
    let mut futures: Vec<_> = futures.map(|f| Some(Box::pin(f))).collect();
    let mut outcomes: Vec<Option<Result<(), tokio_postgres::Error>>> =
        futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, outcome) in futures.iter_mut().zip(outcomes.iter_mut()) {
            if let Some(f) = slot {
                match std::future::Future::poll(f.as_mut(), cx) {
                    std::task::Poll::Ready(out) => {
                        *outcome = Some(out);
                        *slot = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outcomes.into_iter().flatten().collect()
}

/// How [`PgTx::send`] runs its statement.
#[derive(Clone, Copy)]
enum Mode {
    Execute,
    Query,
    /// The query, then `COMMIT`, in one flight.
    QueryThenCommit,
}

/// What [`PgTx::send`] got back.
enum Reply {
    Count(u64),
    Rows(Vec<tokio_postgres::Row>),
}

impl Reply {
    fn rows(self) -> Vec<tokio_postgres::Row> {
        match self {
            Reply::Rows(rows) => rows,
            Reply::Count(_) => Vec::new(),
        }
    }
}

impl PgTx<'_> {
    /// Takes what must precede the next statement.
    #[allow(clippy::type_complexity)]
    fn preamble(
        &mut self,
    ) -> (
        Option<String>,
        Option<(Statement, SqlValue)>,
        Vec<(Statement, Vec<SqlValue>)>,
    ) {
        self.flights += 1;
        let control = if self.pending.is_empty() {
            None
        } else {
            self.began = true;
            if self.savepoint == Savepoint::Queued {
                self.savepoint = Savepoint::Open;
            }
            let joined = self.pending.join("; ");
            self.pending.clear();
            Some(joined)
        };
        (control, self.lock.take(), std::mem::take(&mut self.queued))
    }

    /// Sends what waits for the next statement (transaction control, a key lock, queued
    /// statements) now, by itself.
    fn flush(&mut self) -> Result<(), Error> {
        if self.lock.is_none() && self.queued.is_empty() {
            return Ok(());
        }
        let (control, lock, queued) = self.preamble();
        let client = self.client;
        let out = self
            .rt
            .block_on(pipelined(client, control, lock.as_ref(), &queued, async {
                Ok::<(), tokio_postgres::Error>(())
            }));
        match out {
            Ok(()) => {
                self.succeeded = true;
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Takes the advisory locks of [`EffectTx::lock_key`] for every key of `keys`, in the
    /// order given, in one statement sent with the next one. Writers that lock several keys
    /// must give them in one global order (sorted) so two of them cannot deadlock.
    pub(crate) fn lock_keys(&mut self, keys: &[String]) -> Result<(), Error> {
        // A lock goes out ahead of a queued statement: send what was asked for earlier first.
        self.flush()?;
        let stmt = self.statement(
            "SELECT count(pg_advisory_xact_lock(hashtextextended(k, 0))) FROM (
                 SELECT 'toolledger.key' || chr(31) || k AS k
                 FROM jsonb_array_elements_text(?1::text::jsonb) WITH ORDINALITY AS a(k, n)
                 ORDER BY n) AS s",
        )?;
        let list = serde_json::to_string(keys)
            .map_err(|_| Error::unavailable("lock keys are not encodable"))?;
        self.lock = Some((stmt, SqlValue::Text(list)));
        Ok(())
    }

    /// Runs a last query and `COMMIT` in one flight (one round trip less than a query
    /// followed by the commit). On success the transaction is committed and the closure must
    /// return `Ok` without running anything else; on failure the server has rolled it back
    /// (a `COMMIT` after a failed statement rolls back), or the connection broke and the
    /// outcome is unknown, as with any interrupted `COMMIT`.
    pub(crate) fn query_then_commit(
        &mut self,
        sql: &str,
        params: &[SqlValue],
    ) -> Result<Vec<Vec<SqlValue>>, Error> {
        let rows = self.send(sql, params, Mode::QueryThenCommit)?.rows();
        self.committed = true;
        row_values(&rows)
    }

    /// Sends one statement (after pending transaction control and a pending key lock, in one
    /// flight) and waits for its reply.
    fn send(&mut self, sql: &str, params: &[SqlValue], mode: Mode) -> Result<Reply, Error> {
        let stmt = self.statement(sql)?;
        let bound: Vec<Param<'_>> = params.iter().map(Param).collect();
        let refs: Vec<&(dyn ToSql + Sync)> =
            bound.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
        let (control, lock, queued) = self.preamble();
        let client = self.client;
        let (lock, queued) = (lock.as_ref(), &queued[..]);
        let out = self.rt.block_on(async {
            match mode {
                Mode::Execute => {
                    pipelined(client, control, lock, queued, client.execute(&stmt, &refs))
                        .await
                        .map(Reply::Count)
                }
                Mode::Query => pipelined(client, control, lock, queued, client.query(&stmt, &refs))
                    .await
                    .map(Reply::Rows),
                Mode::QueryThenCommit => {
                    let (rows, commit) = tokio::join!(
                        pipelined(client, control, lock, queued, client.query(&stmt, &refs)),
                        client.batch_execute("COMMIT")
                    );
                    let rows = rows?;
                    commit.map(|()| Reply::Rows(rows))
                }
            }
        });
        match out {
            Ok(reply) => {
                self.succeeded = true;
                Ok(reply)
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Opens the call savepoint of a batched write (queued: it goes out with the next
    /// statement, so a call that runs no statement costs nothing). One at a time.
    pub(crate) fn savepoint(&mut self) -> Result<(), Error> {
        if self.savepoint != Savepoint::None {
            return Err(Error::unavailable("a call savepoint is already open"));
        }
        // Statements queued before the savepoint belong before it.
        if !self.queued.is_empty() {
            self.flush()?;
        }
        self.pending.push(SAVEPOINT);
        self.savepoint = Savepoint::Queued;
        Ok(())
    }

    /// How many flights of statements this transaction has sent so far (a batched call that
    /// sent none has changed nothing on the server).
    pub(crate) fn flights(&self) -> u64 {
        self.flights
    }

    /// Forgets a key lock that was asked for and not sent yet (the call that asked for it
    /// ended without running a statement).
    pub(crate) fn drop_unsent_lock(&mut self) {
        self.lock = None;
    }

    /// Whether the last failure was transient (deadlock, serialization failure, lost insert
    /// race), clearing the mark: the caller handles it, and [`PgWriter::write`] does not run
    /// the transaction again by itself.
    pub(crate) fn take_retry(&mut self) -> bool {
        std::mem::take(&mut self.retry)
    }

    /// Keeps what the call wrote since [`PgTx::savepoint`].
    pub(crate) fn release_savepoint(&mut self) {
        match self.savepoint {
            Savepoint::None => {}
            Savepoint::Queued => {
                self.pending.retain(|s| *s != SAVEPOINT);
            }
            Savepoint::Open => self.pending.push(RELEASE),
        }
        self.savepoint = Savepoint::None;
    }

    /// Undoes what the call wrote since [`PgTx::savepoint`] (the transaction stays usable,
    /// and locks taken since then are released). Returns whether the undone work failed on a
    /// transient conflict (deadlock, serialization failure, lost insert race) and may simply
    /// run again.
    pub(crate) fn rollback_to_savepoint(&mut self) -> bool {
        match self.savepoint {
            Savepoint::None => {}
            Savepoint::Queued => {
                self.pending.retain(|s| *s != SAVEPOINT);
            }
            Savepoint::Open => {
                self.pending.push(ROLLBACK_TO);
                self.aborted = None;
            }
        }
        self.savepoint = Savepoint::None;
        self.lock = None;
        self.last_error = None;
        std::mem::take(&mut self.retry)
    }
}

impl EffectTx for PgTx<'_> {
    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<usize, Error> {
        match self.send(sql, params, Mode::Execute)? {
            Reply::Count(n) => Ok(n as usize),
            Reply::Rows(rows) => Ok(rows.len()),
        }
    }

    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Vec<SqlValue>>, Error> {
        row_values(&self.send(sql, params, Mode::Query)?.rows())
    }

    fn execute_unanswered(&mut self, sql: &str, params: &[SqlValue]) -> Result<(), Error> {
        if !self.may_queue || self.savepoint != Savepoint::None {
            return self.execute(sql, params).map(|_| ());
        }
        let stmt = self.statement(sql)?;
        if self.queued.len() >= MAX_QUEUED {
            self.flush()?;
        }
        self.queued.push((stmt, params.to_vec()));
        Ok(())
    }

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn query_opt_locked(
        &mut self,
        sql: &str,
        params: &[SqlValue],
    ) -> Result<Option<Vec<SqlValue>>, Error> {
        self.query_opt(&format!("{sql} FOR UPDATE SKIP LOCKED"), params)
    }

    fn execute_batch(&mut self, sql: &str) -> Result<(), Error> {
        refuse_transaction_control(sql)?;
        let (begin, lock, queued) = self.preamble();
        let client = self.client;
        let out = self.rt.block_on(pipelined(
            client,
            begin,
            lock.as_ref(),
            &queued,
            client.batch_execute(sql),
        ));
        match out {
            Ok(()) => {
                self.succeeded = true;
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    fn lock_key(&mut self, key: &str) -> Result<(), Error> {
        // Two locks before any statement, or a statement queued before this lock: send what
        // was asked for earlier now (a lock goes out ahead of a queued statement).
        self.flush()?;
        let stmt = self.statement(
            "SELECT 1 FROM (SELECT pg_advisory_xact_lock(hashtextextended(?1, 0))) AS l",
        )?;
        self.lock = Some((stmt, SqlValue::Text(format!("toolledger.key\u{1f}{key}"))));
        Ok(())
    }

    fn take_store_error(&mut self) -> Option<StoreError> {
        self.last_error.take()
    }
}

/// A job for a connection thread: the thread's connection slot, or why the job does not run
/// (it waited in the queue too long).
type Job = Box<dyn FnOnce(Result<&mut Slot, StoreError>) + Send>;

/// A job for a batch writer's thread (the batcher bounds its own queue).
type BatchSlotJob = Box<dyn FnOnce(&mut Slot) + Send>;

struct Inner {
    sender: Mutex<Option<crossbeam_channel::Sender<(Instant, Job)>>>,
    /// One channel per batch writer thread (see [`PgOptions::batch_writers`]).
    batch_senders: Mutex<Vec<crossbeam_channel::Sender<BatchSlotJob>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    backend_id: String,
    schema: Option<String>,
    batch_writers: usize,
    limits: QueueLimits,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut s) = self.sender.lock() {
            s.take();
        }
        if let Ok(mut s) = self.batch_senders.lock() {
            s.clear();
        }
        if let Ok(mut threads) = self.threads.lock() {
            let me = std::thread::current().id();
            for t in threads.drain(..) {
                // The last handle may be dropped by a job on a worker thread itself.
                if t.thread().id() != me {
                    let _ = t.join();
                }
            }
        }
    }
}

/// A handle to one PostgreSQL ledger. Cheap to clone; its connections close when the last
/// handle is dropped.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("backend_id", &self.inner.backend_id)
            .field("schema", &self.inner.schema)
            .finish_non_exhaustive()
    }
}

/// What went wrong when connecting, in the server's words (`password authentication failed
/// for user "u"`, `database "x" does not exist`) or the operating system's (`Connection refused
/// (os error 111)`, a failed name lookup, a timeout): never the URL, and the password removed
/// should any message quote it.
fn connect_error(e: &tokio_postgres::Error, password: Option<&[u8]>) -> String {
    let mut text = match e.as_db_error() {
        Some(db) => db.message().to_string(),
        None => {
            // The innermost cause says what happened (the outer layers say "error connecting
            // to server" and the like).
            let mut cause: &dyn std::error::Error = e;
            while let Some(inner) = cause.source() {
                cause = inner;
            }
            cause.to_string()
        }
    };
    if let Some(password) = password.and_then(|p| std::str::from_utf8(p).ok()) {
        if !password.is_empty() {
            text = text.replace(password, "***");
        }
    }
    text.chars().take(300).collect()
}

/// Whether `url` names a PostgreSQL database (`postgres://` or `postgresql://`).
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

fn parse_config(
    url: &str,
    opts: &PgOptions,
) -> Result<(tokio_postgres::Config, Option<MakeRustlsConnect>), StoreError> {
    if !is_postgres_url(url) {
        return Err(StoreError::UrlInvalid(
            "it must start with postgres:// or postgresql://".into(),
        ));
    }
    let tls_url = tls::split_url(url)?;
    let mut config: tokio_postgres::Config = tls_url
        .url
        .parse()
        .map_err(|_| StoreError::UrlInvalid("it is malformed".into()))?;
    config.ssl_mode(tls_url.mode.negotiation());
    let tls = tls::connector(tls_url.mode, tls_url.root_cert.as_deref())?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(opts.connect_timeout);
    }
    let mut options = config.get_options().unwrap_or("").to_string();
    let ms = opts.statement_timeout.as_millis().max(1);
    if !options.contains("statement_timeout") {
        options.push_str(&format!(" -c statement_timeout={ms}"));
    }
    if opts.shared.read_only {
        options.push_str(" -c default_transaction_read_only=on");
    }
    if let Some(schema) = &opts.schema {
        if !valid_schema_name(schema) {
            return Err(StoreError::Database(
                "schema names are lowercase letters, digits and underscores".into(),
            ));
        }
        options.push_str(&format!(" -c search_path={schema}"));
    }
    config.options(options.trim().to_string());
    if config.get_application_name().is_none() {
        config.application_name("toolledger");
    }
    Ok((config, tls))
}

fn worker_loop(
    receiver: crossbeam_channel::Receiver<(Instant, Job)>,
    mut slot: Slot,
    limits: QueueLimits,
) {
    while let Ok((queued_at, job)) = receiver.recv() {
        JOBS_QUEUE.set(receiver.len());
        if limits.expired(queued_at, Instant::now()) {
            job(Err(queue_wait_expired()));
        } else {
            job(Ok(&mut slot));
        }
    }
}

fn batch_writer_loop(receiver: crossbeam_channel::Receiver<BatchSlotJob>, mut slot: Slot) {
    while let Ok(job) = receiver.recv() {
        BATCH_WRITER_QUEUE.set(receiver.len());
        job(&mut slot);
    }
}

/// `toolledger_store_queue_depth{backend="postgres",queue}`: the jobs waiting for a connection
/// thread (`jobs`: reads and writes other than batched inline calls) or for a batch writer's
/// thread (`batch_writer`), as last seen by a sender or by the thread taking work.
static JOBS_QUEUE: QueueDepth = QueueDepth::new("postgres", "jobs");
/// See [`JOBS_QUEUE`].
static BATCH_WRITER_QUEUE: QueueDepth = QueueDepth::new("postgres", "batch_writer");

impl PgStore {
    /// Connects to `url` (`postgres://user@host:port/db?options`), creates or checks the
    /// schema and binds it to a backend id. Migrations run in one transaction under an
    /// advisory lock.
    pub fn open(url: &str, opts: PgOptions) -> Result<Self, StoreError> {
        let mut store = Self::open_unchecked(url, opts.clone())?;
        let o = opts.clone();
        let backend_id = if opts.shared.read_only {
            store.run_blocking(move |slot| check_read_only(slot, &o))?
        } else {
            store.run_blocking(move |slot| bootstrap(slot, &o))?
        };
        match Arc::get_mut(&mut store.inner) {
            Some(inner) => inner.backend_id = backend_id,
            None => return Err(StoreError::Database("store handle shared too early".into())),
        }
        Ok(store)
    }

    /// A store for `url` without creating or checking any schema (maintenance and tests, e.g.
    /// [`PgStore::drop_schema_blocking`]); its backend id is empty. Connections are made on
    /// first use.
    pub fn open_unchecked(url: &str, opts: PgOptions) -> Result<Self, StoreError> {
        let (config, tls) = parse_config(url, &opts)?;
        let config = Arc::new(config);
        let limits = opts.shared.queue;
        let (sender, receiver) = crossbeam_channel::bounded::<(Instant, Job)>(limits.depth.max(1));
        let mut threads = Vec::new();
        for i in 0..opts.max_connections.max(1) {
            let slot = Slot::new(config.clone(), tls.clone(), opts.max_lifetime)?;
            let receiver = receiver.clone();
            let t = std::thread::Builder::new()
                .name(format!("toolledger-pg-{i}"))
                .spawn(move || worker_loop(receiver, slot, limits))
                .map_err(|_| StoreError::Unavailable("cannot start a database thread".into()))?;
            threads.push(t);
        }
        // The batch writers have threads (and connections, made on first use) of their own:
        // their statements stay prepared, and no other job can delay a batch.
        let batch_writers = opts.batch_writers.max(1);
        let mut batch_senders = Vec::with_capacity(batch_writers);
        for i in 0..batch_writers {
            let slot = Slot::new(config.clone(), tls.clone(), opts.max_lifetime)?;
            // The batcher sends a writer's thread one job at a time (it claims the writer
            // first), so this channel holds at most one.
            let (sender, receiver) = crossbeam_channel::unbounded::<BatchSlotJob>();
            let t = std::thread::Builder::new()
                .name(format!("toolledger-pg-batch-{i}"))
                .spawn(move || batch_writer_loop(receiver, slot))
                .map_err(|_| StoreError::Unavailable("cannot start a database thread".into()))?;
            threads.push(t);
            batch_senders.push(sender);
        }
        Ok(PgStore {
            inner: Arc::new(Inner {
                sender: Mutex::new(Some(sender)),
                batch_senders: Mutex::new(batch_senders),
                threads: Mutex::new(threads),
                backend_id: String::new(),
                schema: opts.schema.clone(),
                batch_writers,
                limits,
            }),
        })
    }

    /// The backend id the database is bound to.
    pub fn backend_id(&self) -> &str {
        &self.inner.backend_id
    }

    /// How many connection threads may run batched inline calls at once.
    pub(crate) fn batch_writers(&self) -> usize {
        self.inner.batch_writers
    }

    /// The bounds of the store's queues ([`PgOptions::queue`]).
    pub(crate) fn queue_limits(&self) -> QueueLimits {
        self.inner.limits
    }

    /// The schema the ledger lives in, if one was named.
    pub fn schema(&self) -> Option<&str> {
        self.inner.schema.as_deref()
    }

    /// Queues `job` for a connection thread. A job that cannot be queued (the queue is full,
    /// the store closed) is answered why, here, and the reason returned.
    fn submit(&self, job: Job) -> Result<(), StoreError> {
        let refused = |job: Job, err: StoreError| {
            job(Err(err.clone()));
            Err(err)
        };
        let Ok(guard) = self.inner.sender.lock() else {
            return refused(job, StoreError::Unavailable("store poisoned".into()));
        };
        match guard.as_ref() {
            Some(s) => match s.try_send((Instant::now(), job)) {
                Ok(()) => {
                    JOBS_QUEUE.set(s.len());
                    Ok(())
                }
                Err(crossbeam_channel::TrySendError::Full((_, job))) => {
                    drop(guard);
                    refused(job, queue_full())
                }
                Err(crossbeam_channel::TrySendError::Disconnected((_, job))) => {
                    drop(guard);
                    refused(job, StoreError::Unavailable("store closed".into()))
                }
            },
            None => {
                drop(guard);
                refused(job, StoreError::Unavailable("store closed".into()))
            }
        }
    }

    /// Runs `f` on a connection thread and waits for it (any thread, async or not).
    fn run_blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Slot) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.submit(Box::new(move |slot| {
            let _ = tx.send(slot.and_then(f));
        }))?;
        rx.recv()
            .unwrap_or_else(|_| Err(StoreError::Unavailable("database thread stopped".into())))
    }

    /// Runs `job` on the thread of batch writer `writer` (below [`PgStore::batch_writers`])
    /// without waiting for it. The job may run any number of write transactions through its
    /// [`PgWriter`]; it must answer its own callers.
    pub(crate) fn spawn_batch_job(
        &self,
        writer: usize,
        job: impl FnOnce(&mut PgWriter<'_>) + Send + 'static,
    ) -> Result<(), StoreError> {
        let closed = || StoreError::Unavailable("store closed".into());
        let senders = self
            .inner
            .batch_senders
            .lock()
            .map_err(|_| StoreError::Unavailable("store poisoned".into()))?;
        let sender = senders.get(writer).ok_or_else(closed)?;
        sender
            .send(Box::new(move |slot: &mut Slot| job(&mut PgWriter { slot })))
            .map_err(|_| closed())
    }

    /// Drops the schema this store lives in (with everything in it). For tests that create a
    /// schema of their own; refused when the store was opened without [`PgOptions::schema`].
    pub fn drop_schema_blocking(&self) -> Result<(), StoreError> {
        let Some(schema) = self.inner.schema.clone() else {
            return Err(StoreError::Database("no schema of its own to drop".into()));
        };
        self.run_blocking(move |slot| {
            slot.connect()?;
            slot.simple(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .map_err(|e| map_pg_error(&e))
        })
    }
}

/// A connection thread, lent to a job of [`PgStore::spawn_job`].
pub(crate) struct PgWriter<'a> {
    slot: &'a mut Slot,
}

impl PgWriter<'_> {
    /// Runs `f` in one `READ COMMITTED` write transaction, like [`toolledger_core::store::Store::write`], with the
    /// transaction's savepoint controls available.
    pub(crate) fn write<T, F>(&mut self, mut f: F) -> Result<T, Error>
    where
        F: FnMut(&mut PgTx<'_>) -> Result<T, Error>,
    {
        write_on(self.slot, true, &mut f)
    }

    /// Closes the connection (the server rolls back whatever is open on it); the next write
    /// connects again.
    pub(crate) fn discard_connection(&mut self) {
        self.slot.client = None;
        self.slot.statements.clear();
    }
}

fn end(slot: &mut Slot, sql: &str) -> Result<(), tokio_postgres::Error> {
    let out = slot.simple(sql);
    if out.is_err() {
        slot.check_closed();
    }
    out
}

const BEGIN_WRITE: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";
const BEGIN_READ: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

/// Runs `f` in a write transaction on `slot`, again after a transient conflict. `flush`:
/// whether its `COMMIT` waits for the log's flush; `false` commits it with
/// `synchronous_commit` off for that transaction, which the next commit that waits carries
/// to the disk (the log is sequential).
fn write_on<T, E, F>(slot: &mut Slot, flush: bool, f: &mut F) -> Result<T, E>
where
    F: FnMut(&mut PgTx<'_>) -> Result<T, E>,
    E: From<StoreError>,
{
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        slot.connect().map_err(E::from)?;
        let (out, retry, began, control, queued, aborted, committed) = {
            let mut tx = slot.tx(BEGIN_WRITE);
            let out = f(&mut tx);
            // What waits for the next statement goes out with the `COMMIT`, in order: pending
            // control (a `BEGIN` not sent yet, savepoint releases), then queued statements.
            let control = (!tx.pending.is_empty()).then(|| tx.pending.join("; "));
            let began = tx.began || (!tx.queued.is_empty() && control.is_some());
            (
                out,
                tx.retry,
                began,
                control,
                std::mem::take(&mut tx.queued),
                tx.aborted.take(),
                tx.committed,
            )
        };
        let (err, retry) = match (out, aborted) {
            (Ok(v), _) if committed || !began => return Ok(v),
            (Ok(v), None) => {
                let commit = if flush {
                    "COMMIT"
                } else {
                    "SET LOCAL synchronous_commit TO OFF; COMMIT"
                };
                match end_with(slot, control, &queued, commit) {
                    Ok(()) => return Ok(v),
                    Err(err) => (
                        E::from(map_pg_error(&err)),
                        err.code().is_some_and(is_retryable),
                    ),
                }
            }
            // A statement failed on the server and its closure answered anyway: the server
            // has aborted the transaction, which cannot commit.
            (Ok(_), Some(err)) => {
                let _ = end(slot, "ROLLBACK");
                slot.check_closed();
                (E::from(err), retry)
            }
            (Err(err), _) => {
                if began {
                    let _ = end(slot, "ROLLBACK");
                }
                slot.check_closed();
                (err, retry)
            }
        };
        if !retry || attempt >= MAX_WRITE_ATTEMPTS {
            return Err(err);
        }
        backoff(attempt);
    }
}

/// Ends the open transaction with `commit` (`COMMIT`, or what goes with it), sent in one
/// flight after pending transaction `control` and a `queued` statement; the first failure is
/// the answer (a `COMMIT` after a failed statement rolls the transaction back).
fn end_with(
    slot: &mut Slot,
    control: Option<String>,
    queued: &[(Statement, Vec<SqlValue>)],
    commit: &str,
) -> Result<(), tokio_postgres::Error> {
    let client = slot.client.as_ref().expect("connected");
    let out = slot.rt.block_on(pipelined(
        client,
        control,
        None,
        queued,
        client.batch_execute(commit),
    ));
    if out.is_err() {
        slot.check_closed();
    }
    out
}

fn read_on<T, E, F>(slot: &mut Slot, f: F) -> Result<T, E>
where
    F: FnOnce(&mut dyn EffectTx) -> Result<T, E>,
    E: From<StoreError>,
{
    slot.connect().map_err(E::from)?;
    let (out, began) = {
        let mut tx = slot.tx(BEGIN_READ);
        let out = f(&mut tx);
        (out, tx.began)
    };
    if began {
        let _ = end(slot, if out.is_ok() { "COMMIT" } else { "ROLLBACK" });
    }
    slot.check_closed();
    out
}

/// The migration hooks over PostgreSQL's bootstrap transaction (which holds the migration
/// advisory lock).
struct PgMigrator<'a, 't> {
    rt: &'a Runtime,
    tx: &'a tokio_postgres::Transaction<'t>,
}

impl MigrationHooks for PgMigrator<'_, '_> {
    fn binding(&mut self) -> Result<Binding, StoreError> {
        let e = |e: tokio_postgres::Error| map_pg_error(&e);
        let has_meta: bool = self
            .rt
            .block_on(
                self.tx
                    .query_one("SELECT to_regclass('store_metadata') IS NOT NULL", &[]),
            )
            .map_err(e)?
            .get(0);
        if has_meta {
            let bound: Option<String> = self
                .rt
                .block_on(self.tx.query_opt(
                    "SELECT value FROM store_metadata WHERE key = 'backend_id'",
                    &[],
                ))
                .map_err(e)?
                .map(|r| r.get(0));
            return Ok(Binding::Bound(bound));
        }
        let others: i64 = self
            .rt
            .block_on(self.tx.query_one(
                "SELECT count(*) FROM information_schema.tables
                 WHERE table_schema = current_schema()",
                &[],
            ))
            .map_err(e)?
            .get(0);
        Ok(if others > 0 {
            Binding::Foreign
        } else {
            Binding::Empty
        })
    }

    fn bind(&mut self, backend_id: &str) -> Result<(), StoreError> {
        let e = |e: tokio_postgres::Error| map_pg_error(&e);
        self.rt
            .block_on(self.tx.batch_execute(
                "CREATE TABLE store_metadata(
                     key TEXT PRIMARY KEY NOT NULL,
                     value TEXT NOT NULL
                 );
                 CREATE TABLE schema_migrations(
                     namespace TEXT NOT NULL CHECK (length(namespace) BETWEEN 1 AND 64),
                     version BIGINT NOT NULL CHECK (version > 0),
                     PRIMARY KEY (namespace, version)
                 );",
            ))
            .map_err(e)?;
        self.rt
            .block_on(self.tx.execute(
                "INSERT INTO store_metadata(key, value)
                 VALUES ('backend_id', $1), ('backend', 'postgres')",
                &[&backend_id],
            ))
            .map_err(e)?;
        Ok(())
    }

    fn applied_versions(&mut self) -> Result<Vec<(String, u32)>, StoreError> {
        self.rt
            .block_on(
                self.tx
                    .query("SELECT namespace, version FROM schema_migrations", &[]),
            )
            .map_err(|e| map_pg_error(&e))?
            .iter()
            .map(|row| {
                let version: i64 = row.get(1);
                let version = u32::try_from(version).map_err(|_| {
                    StoreError::Corrupt("a recorded migration version is out of range".into())
                })?;
                Ok((row.get(0), version))
            })
            .collect()
    }

    fn apply(&mut self, migration: &Migration) -> Result<(), StoreError> {
        self.rt
            .block_on(self.tx.batch_execute(migration.sql))
            .map_err(|e| map_pg_error(&e))
    }

    fn record(&mut self, migration: &Migration) -> Result<(), StoreError> {
        self.rt
            .block_on(self.tx.execute(
                "INSERT INTO schema_migrations(namespace, version) VALUES ($1, $2)",
                &[&migration.namespace, &i64::from(migration.version)],
            ))
            .map(|_| ())
            .map_err(|e| map_pg_error(&e))
    }
}

/// Creates the ledger's schema if one is named, then binds and migrates the database in one
/// transaction holding an advisory lock on the schema (so two hosts opening a new database at
/// once do not race), by the policy of [`migrate::run`].
fn bootstrap(slot: &mut Slot, opts: &PgOptions) -> Result<String, StoreError> {
    slot.connect()?;
    let e = |e: tokio_postgres::Error| map_pg_error(&e);
    let rt = &slot.rt;
    let client = slot.client.as_mut().expect("connected");
    if let Some(schema) = &opts.schema {
        // Validated by parse_config: a plain identifier. Concurrent `CREATE SCHEMA IF NOT
        // EXISTS` can collide in the catalog, so creators serialize on an advisory lock.
        let tx = rt.block_on(client.transaction()).map_err(e)?;
        rt.block_on(tx.execute(
            "SELECT 1 FROM (SELECT pg_advisory_xact_lock(hashtextextended('toolledger.schema.' || $1, 0))) AS l",
            &[schema],
        ))
        .map_err(e)?;
        rt.block_on(tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}")))
            .map_err(e)?;
        rt.block_on(tx.commit()).map_err(e)?;
    }
    let tx = rt.block_on(client.transaction()).map_err(e)?;
    rt.block_on(tx.execute(
        "SELECT 1 FROM (SELECT pg_advisory_xact_lock(hashtextextended('toolledger.migrate.' || current_schema(), 0))) AS l",
        &[],
    ))
    .map_err(e)?;
    let mut all: Vec<Migration> = CORE_MIGRATIONS.to_vec();
    all.extend(opts.shared.migrations.iter().copied());
    let report = migrate::run(
        &mut PgMigrator { rt, tx: &tx },
        &MigrationRequest {
            backend_id: opts.shared.backend_id.as_deref(),
            default_backend_id: DEFAULT_BACKEND_ID,
            migrations: &all,
            allow_migrate: opts.shared.migrate,
        },
    )?;
    rt.block_on(tx.commit()).map_err(e)?;
    Ok(report.backend_id)
}

/// Checks, in one read-only transaction, that the database (or the named schema) holds a
/// ledger at exactly the schema this program knows ([`migrate::check`]); creates nothing.
fn check_read_only(slot: &mut Slot, opts: &PgOptions) -> Result<String, StoreError> {
    slot.connect()?;
    let e = |e: tokio_postgres::Error| map_pg_error(&e);
    let rt = &slot.rt;
    let client = slot.client.as_mut().expect("connected");
    let tx = rt
        .block_on(client.build_transaction().read_only(true).start())
        .map_err(e)?;
    let mut all: Vec<Migration> = CORE_MIGRATIONS.to_vec();
    all.extend(opts.shared.migrations.iter().copied());
    let report = migrate::check(
        &mut PgMigrator { rt, tx: &tx },
        &MigrationRequest {
            backend_id: opts.shared.backend_id.as_deref(),
            default_backend_id: DEFAULT_BACKEND_ID,
            migrations: &all,
            allow_migrate: false,
        },
    );
    let _ = rt.block_on(tx.rollback());
    Ok(report?.backend_id)
}

fn backoff(attempt: u32) {
    let mut b = [0u8; 1];
    let jitter = if getrandom::fill(&mut b).is_ok() {
        u64::from(b[0] % 20)
    } else {
        7
    };
    std::thread::sleep(Duration::from_millis(5 * u64::from(attempt) + jitter));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_dollar_numbers_outside_literals() {
        assert_eq!(
            translate_placeholders("SELECT a FROM t WHERE b = ?1 AND c = ?12"),
            "SELECT a FROM t WHERE b = $1 AND c = $12"
        );
        assert_eq!(
            translate_placeholders("SELECT '?1', \"?2\" -- ?3\n, ?4"),
            "SELECT '?1', \"?2\" -- ?3\n, $4"
        );
        assert_eq!(translate_placeholders("SELECT ? , x"), "SELECT ? , x");
    }

    #[test]
    fn schema_names_are_plain_identifiers() {
        assert!(valid_schema_name("tl_abc123"));
        assert!(!valid_schema_name("Tl"));
        assert!(!valid_schema_name("a;drop"));
        assert!(!valid_schema_name(""));
        assert!(!valid_schema_name("1a"));
    }

    #[test]
    fn urls_are_checked_before_connecting() {
        assert!(is_postgres_url("postgres://u@h/db"));
        assert!(is_postgres_url("postgresql://u@h/db"));
        assert!(!is_postgres_url("/tmp/x.sqlite"));
        let err = PgStore::open("mysql://x", PgOptions::any_backend()).unwrap_err();
        assert!(matches!(err, StoreError::UrlInvalid(_)), "{err:?}");
        let err = PgStore::open(
            "postgres://u@127.0.0.1/db?sslmode=allow",
            PgOptions::any_backend(),
        )
        .unwrap_err();
        assert!(!err.to_string().contains("127.0.0.1"), "{err}");
    }
}
