//! Group commit through the engine: concurrent callers whose operations share one write
//! transaction. The writer is held busy while every call queues, so all of them are known to
//! run in one batch; the failing ones (a refused effect, a constraint violation, a panic) must
//! roll back alone and leave their neighbours committed with their effects.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use toolledger::clock::{SharedClock, SystemClock};
use toolledger::effect::EffectTx;
use toolledger::engine::{Engine, InlineCall, InlineEffect};
use toolledger::store::sqlite::{SqliteStore, MAX_BATCH};
use toolledger::store::{Migration, Store, StoreError};
use toolledger::{Error, ErrorCode, Principal};
use toolledger_testkit::calls::{inline_call, principal};
use toolledger_testkit::db::SqliteFile;

const ITEMS: &[Migration] = &[Migration {
    namespace: "test.items",
    version: 1,
    sql: "CREATE TABLE items(
              id INTEGER PRIMARY KEY,
              name TEXT NOT NULL UNIQUE,
              operation_key TEXT NOT NULL
          ) STRICT;",
}];

const CALLS: usize = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Ok,
    /// Inserts its row, then refuses: the row must vanish.
    Refuse,
    /// Inserts a name that already exists: SQLite refuses the statement.
    Duplicate,
    /// Inserts its row, then panics inside the writer.
    Panic,
}

fn fate(i: usize) -> Fate {
    match i % 10 {
        3 => Fate::Refuse,
        6 => Fate::Duplicate,
        9 => Fate::Panic,
        _ => Fate::Ok,
    }
}

struct Item {
    key: String,
    fate: Fate,
}

impl InlineEffect for Item {
    fn apply(&self, tx: &mut dyn EffectTx, _p: &Principal) -> Result<Value, Error> {
        let name = if self.fate == Fate::Duplicate {
            "taken".to_string()
        } else {
            format!("item-{}", self.key)
        };
        let rows = tx.query(
            "INSERT INTO items(name, operation_key) VALUES (?1, ?2) RETURNING id",
            &[name.into(), self.key.as_str().into()],
        )?;
        match self.fate {
            Fate::Refuse => Err(Error::new(ErrorCode::VersionConflict, "refused on purpose")),
            Fate::Panic => panic!("effect panicked on purpose"),
            _ => Ok(json!({"id": rows[0][0].as_i64()})),
        }
    }
}

fn call(key: &str) -> InlineCall {
    inline_call(&principal("t", "s"), "make_item", key, json!({"key": key}))
}

fn open(db: &SqliteFile) -> SqliteStore {
    db.open("gc", ITEMS)
}

fn keys_in(db: &SqliteFile, sql: &str) -> HashSet<String> {
    let conn = db.side();
    let mut stmt = conn.prepare(sql).unwrap();
    let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

/// Holds the writer inside a job until the returned sender is dropped or sent to.
async fn hold_writer(store: &SqliteStore) -> std::sync::mpsc::Sender<()> {
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let s = store.clone();
    tokio::spawn(async move {
        s.write(move |_c| {
            let _ = started_tx.send(());
            let _ = release_rx.recv();
            Ok::<_, StoreError>(())
        })
        .await
        .unwrap();
    });
    started_rx.await.unwrap();
    release_tx
}

async fn wait_queued(store: &SqliteStore, n: usize) {
    while store.queued_writes() < n {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failing_operations_in_one_batch_roll_back_alone() {
    const { assert!(CALLS <= MAX_BATCH, "all calls must fit one batch") };
    let db = SqliteFile::new("gc.sqlite");
    let store = open(&db);
    Store::from(store.clone())
        .write(|tx| {
            tx.execute(
                "INSERT INTO items(name, operation_key) VALUES ('taken', 'seed')",
                &[],
            )
        })
        .await
        .unwrap();
    let clock: SharedClock = Arc::new(SystemClock);
    let engine = Engine::new(store.clone(), clock);

    let release = hold_writer(&store).await;
    let before = store.writer_stats();
    let mut handles = Vec::new();
    for i in 0..CALLS {
        let engine = engine.clone();
        handles.push(tokio::spawn(async move {
            let key = format!("k{i:03}");
            let effect: Arc<dyn InlineEffect> = Arc::new(Item {
                key: key.clone(),
                fate: fate(i),
            });
            (i, engine.execute_inline(call(&key), effect).await)
        }));
    }
    // Every call has passed the read path and waits for the writer: one batch will take all.
    wait_queued(&store, CALLS).await;
    release.send(()).unwrap();

    let mut committed = HashSet::new();
    for h in handles {
        let (i, out) = h.await.unwrap();
        let key = format!("k{i:03}");
        match (fate(i), out) {
            (Fate::Ok, Ok(o)) => {
                assert!(!o.replayed, "{key}");
                committed.insert(key);
            }
            (Fate::Refuse, Err(e)) => assert_eq!(e.code, ErrorCode::VersionConflict, "{key}"),
            (Fate::Duplicate, Err(e)) => assert_eq!(e.code, ErrorCode::Unavailable, "{key}"),
            (Fate::Panic, Err(e)) => assert_eq!(e.code, ErrorCode::Unavailable, "{key}"),
            (f, out) => panic!("{key} ({f:?}) ended {out:?}"),
        }
    }
    let after = store.writer_stats();
    assert_eq!(
        after.batches - before.batches,
        1,
        "all calls shared one batch"
    );
    assert_eq!(after.jobs - before.jobs, CALLS as u64);
    assert_eq!(after.largest_batch, CALLS as u64);

    let expected: HashSet<String> = (0..CALLS)
        .filter(|&i| fate(i) == Fate::Ok)
        .map(|i| format!("k{i:03}"))
        .collect();
    assert_eq!(committed, expected);
    assert_eq!(
        keys_in(&db, "SELECT idempotency_key FROM operations"),
        expected,
        "exactly the successful calls have ledger rows"
    );
    let mut effects = keys_in(&db, "SELECT operation_key FROM items");
    assert!(effects.remove("seed"));
    assert_eq!(
        effects, expected,
        "exactly the successful calls have effects"
    );
    let applied = keys_in(
        &db,
        "SELECT idempotency_key FROM operations WHERE state = 'applied'",
    );
    assert_eq!(applied, expected);

    // Nothing of a failed call survived: the same key succeeds as a fresh call now.
    let effect: Arc<dyn InlineEffect> = Arc::new(Item {
        key: "k003".into(),
        fate: Fate::Ok,
    });
    let retry = engine.execute_inline(call("k003"), effect).await.unwrap();
    assert!(!retry.replayed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_first_attempts_in_one_batch_apply_once() {
    let db = SqliteFile::new("gc.sqlite");
    let store = open(&db);
    let clock: SharedClock = Arc::new(SystemClock);
    let engine = Engine::new(store.clone(), clock);

    let release = hold_writer(&store).await;
    let mut handles = Vec::new();
    for _ in 0..32 {
        let engine = engine.clone();
        handles.push(tokio::spawn(async move {
            let effect: Arc<dyn InlineEffect> = Arc::new(Item {
                key: "same".into(),
                fate: Fate::Ok,
            });
            engine.execute_inline(call("same"), effect).await
        }));
    }
    wait_queued(&store, 32).await;
    release.send(()).unwrap();
    let mut fresh = 0;
    let mut results = HashSet::new();
    for h in handles {
        let o = h.await.unwrap().unwrap();
        if !o.replayed {
            fresh += 1;
        }
        results.insert(o.result.to_string());
    }
    assert_eq!(
        fresh, 1,
        "one call applied, the rest replayed inside the batch"
    );
    assert_eq!(results.len(), 1, "every caller saw the same result");
    assert_eq!(keys_in(&db, "SELECT operation_key FROM items").len(), 1);
}
