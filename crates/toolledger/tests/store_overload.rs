//! Overload: every queue of a store is bounded. A job that finds its queue full, or waits in
//! it past the queue's wait limit, is answered `unavailable` without running (it changes
//! nothing), and the store serves normally right after. On PostgreSQL a connection older than
//! its maximum lifetime is replaced before its next transaction.
//!
//! Queues are filled deterministically: one job holds the only worker (the SQLite writer, a
//! single reader thread, a single PostgreSQL connection thread, a single batch writer) inside
//! its transaction until the test releases it, and the jobs behind it are queued by polling
//! each call once (a store call queues its job before its first `await`).
//! (PostgreSQL cases need `TOOLLEDGER_TEST_DATABASE_URL`; skipped with one loud line when
//! unset, failing in CI.)

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use serde_json::{json, Value};
use toolledger::clock::{SharedClock, SystemClock};
use toolledger::effect::{EffectTx, RowExt};
use toolledger::engine::{Engine, InlineEffect};
use toolledger::store::postgres::PgOptions;
use toolledger::store::sqlite::OpenOptions;
use toolledger::store::StoreOptions;
use toolledger::store::{Migration, QueueLimits, Store};
use toolledger::{Error, ErrorCode, Principal};
use toolledger_testkit::calls::{inline_call, principal};
use toolledger_testkit::db::{count, scalar, PgSchema, SqliteFile};

const SQLITE_T: &[Migration] = &[Migration {
    namespace: "overload",
    version: 1,
    sql: "CREATE TABLE t(k TEXT PRIMARY KEY NOT NULL) STRICT;",
}];

const PG_T: &[Migration] = &[Migration {
    namespace: "overload",
    version: 1,
    sql: "CREATE TABLE t(k TEXT PRIMARY KEY NOT NULL);",
}];

/// How long a held job waits for the test before it gives up, so a broken test fails instead
/// of hanging.
const PATIENCE: Duration = Duration::from_secs(60);

type Call<T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send>>;

/// Polls `call` once (which queues its job) and leaves the rest to a task.
fn queue<T: Send + 'static>(mut call: Call<T>) -> tokio::task::JoinHandle<Result<T, Error>> {
    let mut cx = Context::from_waker(Waker::noop());
    match call.as_mut().poll(&mut cx) {
        Poll::Ready(out) => tokio::spawn(async move { out }),
        Poll::Pending => tokio::spawn(call),
    }
}

/// Polls `call` once and expects it answered at once.
fn answered_at_once<T>(mut call: Call<T>) -> Result<T, Error> {
    let mut cx = Context::from_waker(Waker::noop());
    match call.as_mut().poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a call to a full queue must be answered at once"),
    }
}

/// A write of row `k`, counting its runs in `ran`.
fn insert(store: &Store, k: String, ran: &Arc<AtomicUsize>) -> Call<()> {
    let store = store.clone();
    let ran = ran.clone();
    Box::pin(async move {
        store
            .write(move |tx: &mut dyn EffectTx| {
                ran.fetch_add(1, Ordering::SeqCst);
                tx.execute("INSERT INTO t(k) VALUES (?1)", &[k.clone().into()])
                    .map(|_| ())
            })
            .await
    })
}

/// A read of the row count, counting its runs in `ran`.
fn read_count(store: &Store, ran: &Arc<AtomicUsize>) -> Call<i64> {
    let store = store.clone();
    let ran = ran.clone();
    Box::pin(async move {
        store
            .read(move |tx: &mut dyn EffectTx| {
                ran.fetch_add(1, Ordering::SeqCst);
                tx.query_opt("SELECT count(*) FROM t", &[])?
                    .expect("a row")
                    .int(0)
            })
            .await
    })
}

/// Holds the store's only worker of the write (or read) queue inside a job until `release`
/// is sent; returns once the job runs.
async fn hold(store: &Store, reads: bool) -> (mpsc::Sender<()>, tokio::task::JoinHandle<()>) {
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Arc::new(Mutex::new(release_rx));
    let s = store.clone();
    let task = tokio::spawn(async move {
        let wait = move || {
            let _ = entered_tx.send(());
            let _ = release_rx.lock().unwrap().recv_timeout(PATIENCE);
        };
        if reads {
            s.read(move |_tx: &mut dyn EffectTx| {
                wait();
                Ok::<_, Error>(())
            })
            .await
            .expect("the held read succeeds");
        } else {
            let mut wait = Some(wait);
            s.write(move |tx: &mut dyn EffectTx| {
                if let Some(w) = wait.take() {
                    w();
                }
                tx.execute("INSERT INTO t(k) VALUES ('held')", &[])
                    .map(|_| ())
            })
            .await
            .expect("the held write succeeds");
        }
    });
    tokio::task::spawn_blocking(move || entered_rx.recv_timeout(PATIENCE))
        .await
        .unwrap()
        .expect("the held job runs");
    (release_tx, task)
}

fn overloaded(e: &Error) {
    assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
    assert_eq!(e.message, "store unavailable", "{e:?}");
}

/// Fills the write queue of `store` (bounded at `depth`) past its bound: the call past it is
/// answered `unavailable` at once, never runs and writes nothing; the queued ones commit; the
/// store serves normally right after.
async fn writes_past_the_bound_are_refused(store: &Store, depth: usize) {
    let (release, held) = hold(store, false).await;
    let ran = Arc::new(AtomicUsize::new(0));
    let queued: Vec<_> = (0..depth)
        .map(|i| queue(insert(store, format!("q{i}"), &ran)))
        .collect();
    let refused = Arc::new(AtomicUsize::new(0));
    let err = answered_at_once(insert(store, "past".into(), &refused)).unwrap_err();
    overloaded(&err);
    release.send(()).unwrap();
    held.await.unwrap();
    for q in queued {
        q.await.unwrap().expect("a queued write commits");
    }
    assert_eq!(ran.load(Ordering::SeqCst), depth);
    assert_eq!(
        refused.load(Ordering::SeqCst),
        0,
        "the refused write never ran"
    );
    assert_eq!(count(store, "t").await, depth as i64 + 1);
    assert_eq!(
        scalar(store, "SELECT count(*) FROM t WHERE k = 'past'").await,
        0
    );
    // Normal service right after: the same write again, and a read.
    insert(store, "past".into(), &refused).await.unwrap();
    assert_eq!(count(store, "t").await, depth as i64 + 2);
}

/// Queued writes not started within the wait limit are answered `unavailable` without
/// running; the store serves normally right after.
async fn writes_waiting_too_long_are_refused(store: &Store, wait: Duration) {
    let (release, held) = hold(store, false).await;
    let ran = Arc::new(AtomicUsize::new(0));
    let queued: Vec<_> = (0..3)
        .map(|i| queue(insert(store, format!("w{i}"), &ran)))
        .collect();
    tokio::time::sleep(wait * 3).await;
    release.send(()).unwrap();
    held.await.unwrap();
    for q in queued {
        overloaded(&q.await.unwrap().unwrap_err());
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0, "expired writes never ran");
    assert_eq!(count(store, "t").await, 1, "only the held write");
    insert(store, "w0".into(), &ran).await.unwrap();
    assert_eq!(count(store, "t").await, 2);
}

/// The read queue past its bound: refused at once, never run; normal service right after.
async fn reads_past_the_bound_are_refused(store: &Store, depth: usize) {
    let rows = count(store, "t").await;
    let (release, held) = hold(store, true).await;
    let ran = Arc::new(AtomicUsize::new(0));
    let queued: Vec<_> = (0..depth).map(|_| queue(read_count(store, &ran))).collect();
    let refused = Arc::new(AtomicUsize::new(0));
    overloaded(&answered_at_once(read_count(store, &refused)).unwrap_err());
    release.send(()).unwrap();
    held.await.unwrap();
    for q in queued {
        assert_eq!(q.await.unwrap().unwrap(), rows);
    }
    assert_eq!(ran.load(Ordering::SeqCst), depth);
    assert_eq!(
        refused.load(Ordering::SeqCst),
        0,
        "the refused read never ran"
    );
    assert_eq!(read_count(store, &refused).await.unwrap(), rows);
}

fn limits(depth: usize, wait: Duration) -> QueueLimits {
    QueueLimits { depth, wait }
}

fn sqlite(file: &SqliteFile, queue: QueueLimits) -> Store {
    let mut opts: OpenOptions = SqliteFile::options(Some("overload"), SQLITE_T).with_queue(queue);
    opts.readers = 1;
    Store::from(file.open_with(opts).expect("open"))
}

fn postgres(db: &PgSchema, app: &str, tune: impl FnOnce(PgOptions) -> PgOptions) -> Store {
    let mut opts = db.options(Some("overload"), PG_T);
    opts.max_connections = 1;
    opts.batch_writers = 1;
    db.open_as(app, tune(opts))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writer_queue_is_bounded() {
    let file = SqliteFile::new("overload.sqlite");
    let store = sqlite(&file, limits(4, PATIENCE));
    writes_past_the_bound_are_refused(&store, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writer_queue_wait_is_bounded() {
    let file = SqliteFile::new("overload.sqlite");
    let wait = Duration::from_millis(100);
    let store = sqlite(&file, limits(64, wait));
    writes_waiting_too_long_are_refused(&store, wait).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reader_queue_is_bounded() {
    let file = SqliteFile::new("overload.sqlite");
    let store = sqlite(&file, limits(3, PATIENCE));
    reads_past_the_bound_are_refused(&store, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connection_queue_is_bounded() {
    let Some(db) = PgSchema::new() else { return };
    let store = postgres(&db, "tl_overload_full", |o| {
        o.with_queue(limits(4, PATIENCE))
    });
    writes_past_the_bound_are_refused(&store, 4).await;
    reads_past_the_bound_are_refused(&store, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connection_queue_wait_is_bounded() {
    let Some(db) = PgSchema::new() else { return };
    let wait = Duration::from_millis(100);
    let store = postgres(&db, "tl_overload_wait", |o| o.with_queue(limits(64, wait)));
    writes_waiting_too_long_are_refused(&store, wait).await;
}

/// Where a held effect says it entered, and what it waits for.
type Gate = (Mutex<mpsc::Sender<()>>, Mutex<mpsc::Receiver<()>>);

/// An inline effect that writes its key to `t`, counts its runs and, when `hold` is given,
/// waits inside the batch's transaction until released.
struct Probe {
    key: String,
    runs: Arc<AtomicUsize>,
    hold: Option<Gate>,
}

impl InlineEffect for Probe {
    fn apply(&self, tx: &mut dyn EffectTx, _p: &Principal) -> Result<Value, Error> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if let Some((entered, release)) = &self.hold {
            let _ = entered.lock().unwrap().send(());
            let _ = release.lock().unwrap().recv_timeout(PATIENCE);
        }
        tx.execute("INSERT INTO t(k) VALUES (?1)", &[self.key.clone().into()])?;
        Ok(json!({"k": self.key}))
    }
}

fn inline(engine: &Engine, key: &str, runs: &Arc<AtomicUsize>) -> Call<()> {
    let engine = engine.clone();
    let effect: Arc<dyn InlineEffect> = Arc::new(Probe {
        key: key.into(),
        runs: runs.clone(),
        hold: None,
    });
    let call = inline_call(&principal("t", "s"), "probe", key, json!({"k": key}));
    Box::pin(async move { engine.execute_inline(call, effect).await.map(|_| ()) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_inline_batch_queue_is_bounded() {
    let Some(db) = PgSchema::new() else { return };
    let store = postgres(&db, "tl_overload_batch", |o| {
        o.with_queue(limits(3, PATIENCE))
    });
    let clock: SharedClock = Arc::new(SystemClock);
    let engine = Engine::new(store.clone(), clock);
    // The gate call holds the only batch writer inside its effect.
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let gate: Arc<dyn InlineEffect> = Arc::new(Probe {
        key: "gate".into(),
        runs: Arc::default(),
        hold: Some((Mutex::new(entered_tx), Mutex::new(release_rx))),
    });
    let e = engine.clone();
    let gate_call = inline_call(&principal("t", "s"), "probe", "gate", json!({"k": "gate"}));
    let gate = tokio::spawn(async move { e.execute_inline(gate_call, gate).await });
    tokio::task::spawn_blocking(move || entered_rx.recv_timeout(PATIENCE))
        .await
        .unwrap()
        .expect("the gate call reached its effect");
    let runs = Arc::new(AtomicUsize::new(0));
    let queued: Vec<_> = (0..3)
        .map(|i| queue(inline(&engine, &format!("b{i}"), &runs)))
        .collect();
    let refused = Arc::new(AtomicUsize::new(0));
    overloaded(&answered_at_once(inline(&engine, "past", &refused)).unwrap_err());
    release_tx.send(()).unwrap();
    gate.await.unwrap().expect("the gate call succeeds");
    for q in queued {
        q.await.unwrap().expect("a queued call commits");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(
        refused.load(Ordering::SeqCst),
        0,
        "the refused call never ran"
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM operations WHERE idempotency_key = 'past'"
        )
        .await,
        0,
        "no ledger row for the refused call"
    );
    // Normal service right after: the refused call, retried with its key, runs once.
    inline(&engine, "past", &refused).await.unwrap();
    assert_eq!(refused.load(Ordering::SeqCst), 1);
    assert_eq!(count(&store, "t").await, 5);
}

/// The backend process id of the store's (only) connection.
async fn backend_pid(store: &Store) -> i64 {
    scalar(store, "SELECT pg_backend_pid()::bigint").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_are_replaced_past_their_lifetime() {
    let Some(db) = PgSchema::new() else { return };
    let lifetime = Duration::from_millis(300);
    let store = postgres(&db, "tl_lifetime", |o| o.with_max_lifetime(lifetime));
    let first = backend_pid(&store).await;
    assert_eq!(backend_pid(&store).await, first, "kept while young");
    tokio::time::sleep(lifetime * 2).await;
    let second = backend_pid(&store).await;
    assert_ne!(second, first, "replaced past its lifetime");
    let alive = scalar(
        &store,
        &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {first}"),
    )
    .await;
    assert_eq!(alive, 0, "the old session is closed");
    // The default lifetime keeps a connection across the same pause.
    let kept = postgres(&db, "tl_lifetime_default", |o| o);
    let pid = backend_pid(&kept).await;
    tokio::time::sleep(lifetime * 2).await;
    assert_eq!(backend_pid(&kept).await, pid);
}
