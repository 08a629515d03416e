//! Group commit of inline calls on PostgreSQL: concurrent `execute_inline` calls share one
//! write transaction (one multi-row ledger insert, one commit). A batch runs without
//! savepoints first; when a call fails after sending statements, the attempt is rolled back and
//! the batch runs again with one savepoint per call, where the failing call rolls back alone.
//!
//! Batching is forced and proven: a "gate" call blocks inside its effect to keep the batch
//! writer busy while the other calls queue in a known order, and every effect returns
//! `txid_current()`, so calls that shared a batch report the same transaction id. The failing
//! calls of a batch must roll back alone, a key never runs twice, a conflicting key is refused
//! alone, fresh results carry their own ledger ids, a panicking effect keeps nothing and the
//! writer recovers, and a deadlocked call goes back to the queue and commits later.
//! (`TOOLLEDGER_TEST_DATABASE_URL`; skipped with one loud line when unset, failing in CI.)

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::task::JoinHandle;
use toolledger::clock::{SharedClock, SystemClock};
use toolledger::effect::{EffectTx, RowExt};
use toolledger::engine::{Engine, InlineCall, InlineEffect, Outcome};
use toolledger::store::{Migration, Store};
use toolledger::{Error, ErrorCode, OperationState, Principal};
use toolledger_testkit::calls::{inline_call, principal};
use toolledger_testkit::db::PgSchema;

const T: &[Migration] = &[Migration {
    namespace: "batch",
    version: 1,
    sql: "CREATE TABLE effects(
              id BIGSERIAL PRIMARY KEY,
              op_key TEXT NOT NULL,
              amount BIGINT NOT NULL CHECK (amount >= 0)
          );
          CREATE TABLE t(id BIGINT PRIMARY KEY, v BIGINT NOT NULL);
          INSERT INTO t(id, v) VALUES (1, 0), (2, 0);",
}];

const TOOL: &str = "batch_probe";

/// How long an effect waits for the test (or a partner) before it gives up with an error, so
/// a broken test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(60);

/// A store with `writers` batch writers over `db`, whose sessions are named `app`, and an
/// engine over it.
fn open(db: &PgSchema, app: &str, writers: usize) -> (Store, Engine) {
    let mut opts = db.options(Some("batch"), T);
    opts.batch_writers = writers;
    let store = db.open_as(app, opts);
    let clock: SharedClock = Arc::new(SystemClock);
    (store.clone(), Engine::new(store, clock))
}

fn call(key: &str, arguments: Value) -> InlineCall {
    inline_call(&principal("t", "s"), TOOL, key, arguments)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Inserts its effect row and answers.
    Ok,
    /// Inserts its effect row, then refuses: the row must vanish.
    Refuse,
    /// Inserts a row the table's CHECK constraint rejects: PostgreSQL fails the statement.
    Check,
}

/// Keeps the batch writer inside an effect until the test releases it.
struct Hold {
    entered: tokio::sync::mpsc::UnboundedSender<()>,
    release: Mutex<mpsc::Receiver<()>>,
}

/// Inserts one row into `effects` and answers its key and `txid_current()`.
struct Probe {
    key: String,
    fate: Fate,
    hold: Option<Hold>,
    runs: Arc<AtomicUsize>,
}

impl Probe {
    fn new(key: &str, fate: Fate) -> Arc<Probe> {
        Probe::counted(key, fate, Arc::default())
    }

    fn counted(key: &str, fate: Fate, runs: Arc<AtomicUsize>) -> Arc<Probe> {
        Arc::new(Probe {
            key: key.into(),
            fate,
            hold: None,
            runs,
        })
    }
}

fn txid(tx: &mut dyn EffectTx) -> Result<i64, Error> {
    tx.query_opt("SELECT txid_current()", &[])?
        .expect("one row")
        .int(0)
}

impl InlineEffect for Probe {
    fn apply(&self, tx: &mut dyn EffectTx, _p: &Principal) -> Result<Value, Error> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let amount: i64 = if self.fate == Fate::Check { -1 } else { 1 };
        tx.execute(
            "INSERT INTO effects(op_key, amount) VALUES (?1, ?2)",
            &[self.key.as_str().into(), amount.into()],
        )?;
        let txid = txid(tx)?;
        if let Some(hold) = &self.hold {
            let _ = hold.entered.send(());
            let release = hold.release.lock().unwrap();
            if release.recv_timeout(PATIENCE).is_err() {
                return Err(Error::unavailable("the gate was never released"));
            }
        }
        if self.fate == Fate::Refuse {
            return Err(Error::invalid("refused on purpose"));
        }
        Ok(json!({"key": self.key, "txid": txid}))
    }
}

fn txid_of(o: &Outcome) -> i64 {
    o.result["txid"].as_i64().expect("a txid in the result")
}

type Pending = JoinHandle<Result<Outcome, Error>>;

/// Runs a gate call that holds the single batch writer inside its effect, queues `calls`
/// behind it, then releases the gate. Returns the gate's outcome and each call's, in order.
async fn behind_gate(
    engine: &Engine,
    gate_key: &str,
    calls: Vec<(InlineCall, Arc<dyn InlineEffect>)>,
) -> (Outcome, Vec<Result<Outcome, Error>>) {
    let (entered_tx, mut entered_rx) = tokio::sync::mpsc::unbounded_channel();
    let (release_tx, release_rx) = mpsc::channel();
    let gate: Arc<dyn InlineEffect> = Arc::new(Probe {
        key: gate_key.into(),
        fate: Fate::Ok,
        hold: Some(Hold {
            entered: entered_tx,
            release: Mutex::new(release_rx),
        }),
        runs: Arc::default(),
    });
    let e = engine.clone();
    let gate_call = call(gate_key, json!({"gate": true}));
    let gate: Pending = tokio::spawn(async move { e.execute_inline(gate_call, gate).await });
    entered_rx
        .recv()
        .await
        .expect("the gate call reached its effect");

    let handles = queue_all(engine, calls).await;
    release_tx.send(()).unwrap();
    let gate = gate.await.unwrap().expect("the gate call succeeds");
    let mut outs = Vec::new();
    for h in handles {
        outs.push(h.await.unwrap());
    }
    (gate, outs)
}

/// Queues every call, in the order given, and leaves it to run as its own task. Each call's
/// future is polled once here first: `execute_inline` queues the call before its first
/// `await`, so the queue order is the order given, whatever the scheduler does.
async fn queue_all(
    engine: &Engine,
    calls: Vec<(InlineCall, Arc<dyn InlineEffect>)>,
) -> Vec<Pending> {
    let mut handles = Vec::new();
    for (c, effect) in calls {
        let e = engine.clone();
        let mut call = Box::pin(async move { e.execute_inline(c, effect).await });
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        handles.push(match call.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(out) => tokio::spawn(async move { out }),
            std::task::Poll::Pending => tokio::spawn(call),
        });
    }
    handles
}

async fn effect_rows(store: &Store, key: &str) -> i64 {
    let key = key.to_string();
    store
        .read(move |tx: &mut dyn EffectTx| {
            tx.query_opt(
                "SELECT count(*) FROM effects WHERE op_key = ?1",
                &[key.into()],
            )?
            .expect("a row")
            .int(0)
        })
        .await
        .unwrap()
}

/// The ledger rows of `key`: `(id, status_ref, state)`.
async fn ledger_rows(store: &Store, key: &str) -> Vec<(i64, String, String)> {
    let key = key.to_string();
    store
        .read(move |tx: &mut dyn EffectTx| {
            tx.query(
                "SELECT id, status_ref, state FROM operations
                 WHERE tool = ?1 AND idempotency_key = ?2 ORDER BY id",
                &[TOOL.into(), key.into()],
            )?
            .iter()
            .map(|r| Ok((r.int(0)?, r.text(1)?, r.text(2)?)))
            .collect::<Result<Vec<_>, Error>>()
        })
        .await
        .unwrap()
}

/// Asserts the one `applied` ledger row of `key` is the outcome's.
async fn assert_own_row(store: &Store, key: &str, o: &Outcome) {
    let rows = ledger_rows(store, key).await;
    assert_eq!(rows.len(), 1, "{key}: one ledger row");
    let (id, status_ref, state) = &rows[0];
    assert_eq!(state, "applied", "{key}");
    assert_eq!(*id, o.operation_id, "{key}: the outcome carries its row id");
    assert_eq!(
        *status_ref, o.status_ref,
        "{key}: the outcome carries its status ref"
    );
}

fn fate(i: usize) -> Fate {
    match i {
        0 | 5 | 9 => Fate::Check,
        2 | 7 | 11 => Fate::Refuse,
        _ => Fate::Ok,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_call_in_a_batch_rolls_back_alone() {
    let Some(db) = PgSchema::new() else { return };
    let (store, engine) = open(&db, "tl_batch_fail", 1);
    let keys: Vec<String> = (0..12).map(|i| format!("f{i:02}")).collect();
    let runs: Vec<Arc<AtomicUsize>> = keys.iter().map(|_| Arc::default()).collect();
    let calls = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let effect: Arc<dyn InlineEffect> = Probe::counted(k, fate(i), runs[i].clone());
            (call(k, json!({"k": k})), effect)
        })
        .collect();
    let (gate, outs) = behind_gate(&engine, "gate-1", calls).await;

    let mut batch_txids = HashSet::new();
    let mut fresh = Vec::new();
    for (i, out) in outs.into_iter().enumerate() {
        let key = &keys[i];
        match (fate(i), out) {
            (Fate::Ok, Ok(o)) => {
                assert!(!o.replayed, "{key}");
                assert_eq!(o.state, OperationState::Applied, "{key}");
                assert_eq!(o.result["key"], json!(key));
                batch_txids.insert(txid_of(&o));
                fresh.push((i, o));
            }
            (Fate::Refuse, Err(e)) => {
                assert_eq!(e.code, ErrorCode::InvalidArguments, "{key}: {e:?}");
                assert_eq!(e.message, "refused on purpose");
            }
            (Fate::Check, Err(e)) => {
                assert_eq!(e.code, ErrorCode::Unavailable, "{key}: {e:?}");
                assert_eq!(e.message, "write refused by the database");
            }
            (f, out) => panic!("{key} ({f:?}) ended {out:?}"),
        }
        // f00 fails first, after its insert: the attempt without savepoints ends there and
        // the batch runs again with savepoints, where every call runs once.
        assert_eq!(
            runs[i].load(Ordering::SeqCst),
            if i == 0 { 2 } else { 1 },
            "{key}: how often its effect ran (no call went back to the queue)"
        );
    }
    assert_eq!(fresh.len(), 6);
    assert_eq!(
        batch_txids.len(),
        1,
        "the successful calls shared one transaction: {batch_txids:?}"
    );
    assert!(
        !batch_txids.contains(&txid_of(&gate)),
        "the queued calls ran after the gate's batch, not in it"
    );

    for (i, key) in keys.iter().enumerate() {
        if fate(i) == Fate::Ok {
            assert_eq!(effect_rows(&store, key).await, 1, "{key}: one effect row");
        } else {
            assert_eq!(
                effect_rows(&store, key).await,
                0,
                "{key}: its effect rolled back"
            );
            assert!(
                ledger_rows(&store, key).await.is_empty(),
                "{key}: no ledger row"
            );
        }
    }
    for (i, o) in &fresh {
        assert_own_row(&store, &keys[*i], o).await;
    }

    // A neighbour's retry replays its stored result without running the effect again.
    let (i, first) = &fresh[0];
    let key = &keys[*i];
    let again = engine
        .execute_inline(call(key, json!({"k": key})), Probe::new(key, Fate::Ok))
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.result, first.result);
    assert_eq!(again.operation_id, first.operation_id);
    assert_eq!(again.status_ref, first.status_ref);
    assert_eq!(effect_rows(&store, key).await, 1);

    // Nothing of a failed call survived: its key runs as a fresh call now.
    for i in [0, 2] {
        let key = &keys[i];
        let o = engine
            .execute_inline(call(key, json!({"k": key})), Probe::new(key, Fate::Ok))
            .await
            .unwrap();
        assert!(!o.replayed, "{key}");
        assert_eq!(effect_rows(&store, key).await, 1, "{key}");
        assert_own_row(&store, key, &o).await;
    }
}

/// A batch runs without savepoints until a call fails after writing; then the attempt is
/// rolled back and the batch runs again with savepoints, and the writer's next batch starts
/// with savepoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failure_after_writing_reruns_the_batch_with_savepoints() {
    let Some(db) = PgSchema::new() else { return };
    let (store, engine) = open(&db, "tl_batch_careful", 1);
    let runs: Vec<Arc<AtomicUsize>> = (0..4).map(|_| Arc::default()).collect();
    // One call per key in a batch: c and d wait for the batches after b's.
    let plan = [
        ("k1", Fate::Ok),
        ("k2", Fate::Refuse),
        ("k2", Fate::Refuse),
        ("k2", Fate::Ok),
    ];
    let calls = plan
        .iter()
        .enumerate()
        .map(|(i, (k, f))| {
            let effect: Arc<dyn InlineEffect> = Probe::counted(k, *f, runs[i].clone());
            (call(k, json!({"k": k})), effect)
        })
        .collect();
    let (_gate, outs) = behind_gate(&engine, "gate-2", calls).await;
    let ran: Vec<usize> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    assert_eq!(
        ran,
        vec![2, 2, 1, 1],
        "a and b ran without savepoints, then again with them; c's batch started with them"
    );
    let a = outs[0].as_ref().expect("a commits");
    assert_own_row(&store, "k1", a).await;
    assert_eq!(effect_rows(&store, "k1").await, 1, "a's effect landed once");
    for out in &outs[1..3] {
        assert_eq!(out.as_ref().unwrap_err().message, "refused on purpose");
    }
    let d = outs[3].as_ref().expect("d commits");
    assert!(!d.replayed);
    assert_own_row(&store, "k2", d).await;
    assert_eq!(
        effect_rows(&store, "k2").await,
        1,
        "only d's effect row is kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_key_twice_in_flight_runs_once() {
    let Some(db) = PgSchema::new() else { return };
    let (store, engine) = open(&db, "tl_batch_same", 1);
    let runs: Arc<AtomicUsize> = Arc::default();
    let mut calls: Vec<(InlineCall, Arc<dyn InlineEffect>)> = Vec::new();
    for _ in 0..6 {
        calls.push((
            call("same", json!({"n": 1})),
            Probe::counted("same", Fate::Ok, runs.clone()),
        ));
    }
    // Distinct neighbours queue beside them.
    for i in 0..4 {
        let key = format!("other{i}");
        calls.push((call(&key, json!({"n": i})), Probe::new(&key, Fate::Ok)));
    }
    let (_gate, outs) = behind_gate(&engine, "gate-3", calls).await;
    let outs: Vec<Outcome> = outs.into_iter().map(|r| r.unwrap()).collect();
    let same = &outs[..6];
    let fresh: Vec<&Outcome> = same.iter().filter(|o| !o.replayed).collect();
    assert_eq!(fresh.len(), 1, "exactly one call applied: {same:?}");
    let first = fresh[0];
    for o in same {
        assert_eq!(o.result, first.result);
        assert_eq!(o.operation_id, first.operation_id);
        assert_eq!(o.status_ref, first.status_ref);
        assert_eq!(o.state, OperationState::Applied);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the effect ran once");
    assert_eq!(effect_rows(&store, "same").await, 1);
    assert_own_row(&store, "same", first).await;
    for (i, o) in outs[6..].iter().enumerate() {
        let key = format!("other{i}");
        assert!(!o.replayed, "{key}");
        assert_own_row(&store, &key, o).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_conflicting_key_in_a_batch_is_refused_alone() {
    let Some(db) = PgSchema::new() else { return };
    let (store, engine) = open(&db, "tl_batch_conflict", 1);
    let before = engine
        .execute_inline(call("used", json!({"n": 1})), Probe::new("used", Fate::Ok))
        .await
        .unwrap();
    assert!(!before.replayed);

    let conflict_runs: Arc<AtomicUsize> = Arc::default();
    let mut calls: Vec<(InlineCall, Arc<dyn InlineEffect>)> = Vec::new();
    let keys: Vec<String> = (0..8).map(|i| format!("c{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        if i == 4 {
            calls.push((
                call("used", json!({"n": 2})),
                Probe::counted("used", Fate::Ok, conflict_runs.clone()),
            ));
        }
        calls.push((call(key, json!({"n": i})), Probe::new(key, Fate::Ok)));
    }
    let (gate, mut outs) = behind_gate(&engine, "gate-4", calls).await;
    let err = outs.remove(4).unwrap_err();
    assert_eq!(err.code, ErrorCode::OperationConflict, "{err:?}");
    assert_eq!(conflict_runs.load(Ordering::SeqCst), 0, "no effect for it");

    let mut txids = HashSet::new();
    for (key, out) in keys.iter().zip(outs) {
        let o = out.unwrap();
        assert!(!o.replayed, "{key}");
        assert_eq!(o.result["key"], json!(key));
        txids.insert(txid_of(&o));
        assert_eq!(effect_rows(&store, key).await, 1, "{key}");
        assert_own_row(&store, key, &o).await;
    }
    assert_eq!(txids.len(), 1, "the neighbours shared one batch: {txids:?}");
    assert!(!txids.contains(&txid_of(&gate)));

    // The applied key is untouched and still replays its first result.
    assert_eq!(effect_rows(&store, "used").await, 1);
    assert_own_row(&store, "used", &before).await;
    let again = engine
        .execute_inline(call("used", json!({"n": 1})), Probe::new("used", Fate::Ok))
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.result, before.result);
    assert_eq!(again.operation_id, before.operation_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fresh_results_carry_their_own_operation_ids() {
    let Some(db) = PgSchema::new() else { return };
    let (store, engine) = open(&db, "tl_batch_ids", 1);
    // More calls than one batch holds (32): two batches, each inserting its ledger rows at
    // once, must still hand every caller its own row.
    let keys: Vec<String> = (0..40).map(|i| format!("id{i:02}")).collect();
    let calls = keys
        .iter()
        .map(|k| {
            let effect: Arc<dyn InlineEffect> = Probe::new(k, Fate::Ok);
            (call(k, json!({"k": k})), effect)
        })
        .collect();
    let (gate, outs) = behind_gate(&engine, "gate-5", calls).await;
    let mut batches: HashMap<i64, usize> = HashMap::new();
    let mut ids = HashSet::new();
    let mut refs = HashSet::new();
    for (key, out) in keys.iter().zip(outs) {
        let o = out.unwrap();
        assert!(!o.replayed, "{key}");
        assert_eq!(o.result["key"], json!(key), "{key}: its own result");
        *batches.entry(txid_of(&o)).or_default() += 1;
        assert!(ids.insert(o.operation_id), "{key}: a distinct id");
        assert!(refs.insert(o.status_ref.clone()), "{key}: a distinct ref");
        assert_own_row(&store, key, &o).await;
    }
    let mut sizes: Vec<usize> = batches.values().copied().collect();
    sizes.sort_unstable();
    assert_eq!(
        sizes,
        vec![8, 32],
        "two batches, the first full: {batches:?}"
    );
    assert!(!batches.contains_key(&txid_of(&gate)));
    assert_own_row(&store, "gate-5", &gate).await;
}

/// Inserts its row, then panics on the batch writer's thread.
struct Panics;

impl InlineEffect for Panics {
    fn apply(&self, tx: &mut dyn EffectTx, _p: &Principal) -> Result<Value, Error> {
        tx.execute(
            "INSERT INTO effects(op_key, amount) VALUES ('boom', 1)",
            &[],
        )?;
        panic!("effect panicked on purpose");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panicking_effect_keeps_nothing_and_the_writer_recovers() {
    let Some(db) = PgSchema::new() else { return };
    let (store, engine) = open(&db, "tl_batch_panic", 1);
    let keys = ["p0", "p1", "p2", "p3"];
    let mut calls: Vec<(InlineCall, Arc<dyn InlineEffect>)> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        if i == 2 {
            calls.push((call("boom", json!({})), Arc::new(Panics)));
        }
        calls.push((call(key, json!({})), Probe::new(key, Fate::Ok)));
    }
    // A second call of `p0` cannot share the batch of the first: it is still queued when
    // that batch panics, and must find a writer all the same. (The timeout turns a stuck
    // queue into a failure.)
    calls.push((call("p0", json!({})), Probe::new("p0", Fate::Ok)));
    let (gate, mut outs) = tokio::time::timeout(
        Duration::from_secs(120),
        behind_gate(&engine, "gate-6", calls),
    )
    .await
    .expect("every queued call was answered");
    assert!(!gate.replayed);

    let last_p0 = outs.pop().unwrap();
    let err = outs.remove(2).unwrap_err();
    assert_eq!(err.code, ErrorCode::Unavailable, "{err:?}");
    assert_eq!(
        effect_rows(&store, "boom").await,
        0,
        "the panicking effect rolled back"
    );
    assert!(ledger_rows(&store, "boom").await.is_empty());

    // Each neighbour's answer agrees with the database: committed with its effect, or
    // refused with nothing kept.
    let mut refused = Vec::new();
    let mut p0 = vec![last_p0];
    for (key, out) in keys.iter().zip(outs) {
        if *key == "p0" {
            p0.push(out);
            continue;
        }
        match out {
            Ok(o) => {
                assert!(!o.replayed, "{key}");
                assert_eq!(effect_rows(&store, key).await, 1, "{key}");
                assert_own_row(&store, key, &o).await;
            }
            Err(e) => {
                assert_eq!(e.code, ErrorCode::Unavailable, "{key}: {e:?}");
                assert_eq!(effect_rows(&store, key).await, 0, "{key}");
                assert!(ledger_rows(&store, key).await.is_empty(), "{key}");
                refused.push(*key);
            }
        }
    }
    // `p0` ran once in all: the call that waited in the queue while the other's batch
    // panicked applied it (the other was refused) or replayed it (the other committed).
    let p0: Vec<Outcome> = p0
        .into_iter()
        .filter_map(|r| match r {
            Ok(o) => Some(o),
            Err(e) => {
                assert_eq!(e.code, ErrorCode::Unavailable, "p0: {e:?}");
                None
            }
        })
        .collect();
    assert!(
        !p0.is_empty(),
        "the p0 call queued behind the panic was answered"
    );
    let fresh: Vec<&Outcome> = p0.iter().filter(|o| !o.replayed).collect();
    assert_eq!(fresh.len(), 1, "p0 applied once: {p0:?}");
    assert!(p0.iter().all(|o| o.operation_id == fresh[0].operation_id));
    assert_eq!(effect_rows(&store, "p0").await, 1);
    assert_own_row(&store, "p0", fresh[0]).await;

    // The single batch writer was not lost with the panic: later calls run, including the
    // refused neighbours again.
    for key in refused.into_iter().chain(["after"]) {
        let o = tokio::time::timeout(
            Duration::from_secs(60),
            engine.execute_inline(call(key, json!({})), Probe::new(key, Fate::Ok)),
        )
        .await
        .expect("a batch writer takes the call")
        .unwrap();
        assert!(!o.replayed, "{key}");
        assert_eq!(effect_rows(&store, key).await, 1, "{key}");
        assert_own_row(&store, key, &o).await;
    }
}

/// Updates two rows of `t` in the given order; on its first run it meets its partner
/// between the two updates so the two transactions deadlock. Records each run's txid.
struct Crossing {
    key: String,
    first: i64,
    second: i64,
    /// First run: told once this effect holds its first row.
    holding: Option<tokio::sync::mpsc::UnboundedSender<()>>,
    /// First run: waits for the partner to hold its row and then to wait for this effect's
    /// first row, then sleeps `lag`.
    partner: Option<Mutex<mpsc::Receiver<()>>>,
    /// First run: tells the partner it holds its first row.
    tell: Option<Mutex<mpsc::Sender<()>>>,
    lag: Duration,
    txids: Mutex<Vec<i64>>,
}

impl InlineEffect for Crossing {
    fn apply(&self, tx: &mut dyn EffectTx, _p: &Principal) -> Result<Value, Error> {
        let run = {
            let mut txids = self.txids.lock().unwrap();
            txids.push(txid(tx)?);
            txids.len()
        };
        tx.execute("UPDATE t SET v = v + 1 WHERE id = ?1", &[self.first.into()])?;
        if run == 1 {
            if let Some(h) = &self.holding {
                let _ = h.send(());
            }
            if let Some(t) = &self.tell {
                let _ = t.lock().unwrap().send(());
            }
            if let Some(p) = &self.partner {
                if p.lock().unwrap().recv_timeout(PATIENCE).is_err() {
                    return Err(Error::unavailable("the partner never came"));
                }
                wait_for_a_waiter(tx)?;
                std::thread::sleep(self.lag);
            }
        }
        tx.execute(
            "UPDATE t SET v = v + 1 WHERE id = ?1",
            &[self.second.into()],
        )?;
        tx.execute(
            "INSERT INTO effects(op_key, amount) VALUES (?1, 1)",
            &[self.key.as_str().into()],
        )?;
        let txid = txid(tx)?;
        Ok(json!({"key": self.key, "txid": txid}))
    }
}

/// Returns once another transaction waits for a lock this transaction holds. The partner's
/// "I hold my row" comes before its request for this one's row reaches the server; on a busy
/// machine that request can come late, and whichever transaction waited first is the one
/// PostgreSQL's deadlock check aborts. Waiting for the partner's wait makes it that one.
fn wait_for_a_waiter(tx: &mut dyn EffectTx) -> Result<(), Error> {
    let end = std::time::Instant::now() + PATIENCE;
    loop {
        let waiting = tx
            .query_opt(
                "SELECT count(*) FROM pg_locks WHERE NOT granted \
                 AND locktype = 'transactionid' AND transactionid = pg_current_xact_id()::xid",
                &[],
            )?
            .expect("one row")
            .int(0)?;
        if waiting > 0 {
            return Ok(());
        }
        if std::time::Instant::now() > end {
            return Err(Error::unavailable("the partner never waited"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Two batches deadlock on rows of `t`: `a` (alone in a batch on one writer) holds row 1 and
/// waits for `b`; `b` (first in a batch with neighbours on the other writer, queued behind a
/// gate) takes row 2 and then asks for row 1, and `a` asks for row 2 a moment after `b` waits,
/// so `b` has waited longest and PostgreSQL's deadlock check aborts `b`'s statement. Nothing
/// of `b`'s first run may commit; `b` must run again and commit once, its neighbours must
/// commit together, and `a` must commit having run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deadlocked_call_is_retried_and_commits() {
    let Some(db) = PgSchema::new() else { return };
    let (store, engine) = open(&db, "tl_batch_deadlock", 2);
    let (a_holding_tx, mut a_holding_rx) = tokio::sync::mpsc::unbounded_channel();
    let (b_holds_tx, b_holds_rx) = mpsc::channel();
    let a = Arc::new(Crossing {
        key: "a".into(),
        first: 1,
        second: 2,
        holding: Some(a_holding_tx),
        partner: Some(Mutex::new(b_holds_rx)),
        tell: None,
        lag: Duration::from_millis(100),
        txids: Mutex::default(),
    });
    let b = Arc::new(Crossing {
        key: "b".into(),
        first: 2,
        second: 1,
        holding: None,
        partner: None,
        tell: Some(Mutex::new(b_holds_tx)),
        lag: Duration::ZERO,
        txids: Mutex::default(),
    });

    // `a` takes the first writer and holds row 1.
    let e = engine.clone();
    let a_effect: Arc<dyn InlineEffect> = a.clone();
    let a_task: Pending =
        tokio::spawn(async move { e.execute_inline(call("a", json!({})), a_effect).await });
    a_holding_rx.recv().await.expect("a holds row 1");

    // `b` and then its neighbours queue behind a gate on the second writer.
    let neighbours: Vec<String> = (0..4).map(|i| format!("n{i}")).collect();
    let mut calls: Vec<(InlineCall, Arc<dyn InlineEffect>)> =
        vec![(call("b", json!({})), b.clone())];
    for key in &neighbours {
        calls.push((call(key, json!({})), Probe::new(key, Fate::Ok)));
    }
    let (gate, outs) = behind_gate(&engine, "gate-7", calls).await;
    let a_out = a_task.await.unwrap().expect("a succeeds");
    assert!(!a_out.replayed);

    let mut outs = outs.into_iter();
    let b_out = outs
        .next()
        .unwrap()
        .expect("b succeeds after going back to the queue");
    assert!(!b_out.replayed);
    let mut batch = HashSet::new();
    for (key, out) in neighbours.iter().zip(outs) {
        let o = out.unwrap();
        assert!(!o.replayed, "{key}");
        batch.insert(txid_of(&o));
        assert_eq!(effect_rows(&store, key).await, 1, "{key}");
        assert_own_row(&store, key, &o).await;
    }
    assert_eq!(batch.len(), 1, "the neighbours shared one batch: {batch:?}");
    assert!(!batch.contains(&txid_of(&gate)));

    let a_txids = a.txids.lock().unwrap().clone();
    let b_txids = b.txids.lock().unwrap().clone();
    assert_eq!(a_txids.len(), 1, "a ran once: {a_txids:?}");
    // The deadlock ended the batch's first attempt (no savepoints): it was rolled back whole
    // and run again with a savepoint per call, where b, now unopposed, normally commits with
    // its neighbours. (A busy machine may add another transient retry; what must hold is that
    // the first run did not commit and the last one did.)
    assert!(
        b_txids.len() >= 2,
        "b, the deadlock victim, ran again: {b_txids:?}"
    );
    assert!(
        !batch.contains(&b_txids[0]),
        "b's first run was in an attempt that did not commit"
    );
    assert_eq!(
        Some(&txid_of(&b_out)),
        b_txids.last(),
        "b's last run committed"
    );
    assert_eq!(txid_of(&a_out), a_txids[0]);

    for key in ["a", "b"] {
        assert_eq!(effect_rows(&store, key).await, 1, "{key}: applied once");
    }
    assert_own_row(&store, "a", &a_out).await;
    assert_own_row(&store, "b", &b_out).await;
    let v = store
        .read(|tx: &mut dyn EffectTx| {
            tx.query("SELECT v FROM t ORDER BY id", &[])?
                .iter()
                .map(|r| r.int(0))
                .collect::<Result<Vec<_>, Error>>()
        })
        .await
        .unwrap();
    assert_eq!(v, vec![2, 2], "each call's two updates landed once");
}

/// An effect whose statement no other effect of these tests uses, so it is not yet prepared.
struct Unprepared(String);

impl InlineEffect for Unprepared {
    fn apply(&self, tx: &mut dyn EffectTx, _p: &Principal) -> Result<Value, Error> {
        tx.execute(
            "INSERT INTO effects(amount, op_key) VALUES (2, ?1)",
            &[self.0.as_str().into()],
        )?;
        Ok(json!({"key": self.0}))
    }
}

/// A neighbour whose statement is not prepared yet runs after a call whose statement failed
/// (PostgreSQL refuses even to prepare in an aborted transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_neighbour_after_a_database_error_runs_its_own_statements() {
    let Some(db) = PgSchema::new() else { return };
    let (store, engine) = open(&db, "tl_batch_parse1", 1);
    let calls: Vec<(InlineCall, Arc<dyn InlineEffect>)> = vec![
        (call("chk", json!({})), Probe::new("chk", Fate::Check)),
        (call("oth", json!({})), Arc::new(Unprepared("oth".into()))),
    ];
    let (_gate, outs) = behind_gate(&engine, "gate-8", calls).await;
    assert_eq!(
        outs[0].as_ref().unwrap_err().message,
        "write refused by the database"
    );
    let o = outs[1].as_ref().expect("the neighbour commits");
    assert_own_row(&store, "oth", o).await;
}

/// A failing last call does not cost its neighbours their commit (the ledger insert is not
/// sent into an aborted transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_error_in_the_last_call_keeps_the_batch() {
    let Some(db) = PgSchema::new() else { return };
    let (store, engine) = open(&db, "tl_batch_parse2", 1);
    let calls: Vec<(InlineCall, Arc<dyn InlineEffect>)> = vec![
        (call("ok1", json!({})), Probe::new("ok1", Fate::Ok)),
        (call("ok2", json!({})), Probe::new("ok2", Fate::Ok)),
        (call("chk", json!({})), Probe::new("chk", Fate::Check)),
    ];
    let (_gate, outs) = behind_gate(&engine, "gate-9", calls).await;
    for (key, out) in ["ok1", "ok2"].iter().zip(&outs) {
        let o = out.as_ref().expect("the neighbour commits");
        assert_own_row(&store, key, o).await;
    }
    assert!(outs[2].is_err());
}
