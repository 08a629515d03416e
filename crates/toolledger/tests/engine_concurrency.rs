//! Racing calls on one scope: through one engine (group commit in one writer) and through
//! separate store handles (separate write connections serialized by SQLite's write lock).

use std::sync::{Arc, Barrier};

use serde_json::{json, Value};
use toolledger::clock::{SharedClock, SystemClock};
use toolledger::effect::EffectTx;
use toolledger::engine::{Engine, InlineCall, InlineEffect, Outcome};
use toolledger::store::sqlite::SqliteStore;
use toolledger::store::Migration;
use toolledger::{Error, ErrorCode, Principal};
use toolledger_testkit::calls::{inline_call, principal};
use toolledger_testkit::db::SqliteFile;

const WIDGETS: &[Migration] = &[Migration {
    namespace: "test.widgets",
    version: 1,
    sql: "CREATE TABLE widgets(id INTEGER PRIMARY KEY, name TEXT NOT NULL) STRICT;",
}];

const RACERS: usize = 16;

struct MakeWidget(String);

impl InlineEffect for MakeWidget {
    fn apply(&self, tx: &mut dyn EffectTx, _principal: &Principal) -> Result<Value, Error> {
        let rows = tx.query(
            "INSERT INTO widgets(name) VALUES (?1) RETURNING id",
            &[self.0.as_str().into()],
        )?;
        Ok(json!({ "id": rows[0][0].as_i64(), "name": self.0 }))
    }
}

/// A fresh database file, already created with the widget table.
fn temp() -> SqliteFile {
    let db = SqliteFile::new("race.sqlite");
    drop(open(&db));
    db
}

fn open(db: &SqliteFile) -> SqliteStore {
    db.open("race", WIDGETS)
}

fn engine(db: &SqliteFile) -> Engine {
    let clock: SharedClock = Arc::new(SystemClock);
    Engine::new(open(db), clock)
}

fn call(name: &str) -> InlineCall {
    inline_call(
        &principal("team-a", "alice"),
        "make_widget",
        "race-1",
        json!({ "name": name }),
    )
}

/// Runs `RACERS` calls from separate OS threads, each with its own store handle, released
/// together by a barrier.
fn race_separate_handles(
    db: &SqliteFile,
    name_of: impl Fn(usize) -> String,
) -> Vec<Result<Outcome, Error>> {
    let barrier = Arc::new(Barrier::new(RACERS));
    let threads: Vec<_> = (0..RACERS)
        .map(|i| {
            let db = db.clone();
            let barrier = barrier.clone();
            let name = name_of(i);
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let engine = engine(&db);
                barrier.wait();
                rt.block_on(engine.execute_inline(call(&name), Arc::new(MakeWidget(name.clone()))))
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_tasks_on_one_engine_produce_one_effect() {
    let db = temp();
    let engine = engine(&db);
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let mut handles = Vec::new();
    for _ in 0..RACERS {
        let engine = engine.clone();
        let barrier = barrier.clone();
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            engine
                .execute_inline(call("gear"), Arc::new(MakeWidget("gear".into())))
                .await
        }));
    }
    let mut outcomes = Vec::new();
    for h in handles {
        outcomes.push(h.await.unwrap().unwrap());
    }
    assert_eq!(outcomes.iter().filter(|o| !o.replayed).count(), 1);
    assert!(outcomes.iter().all(|o| o.result == outcomes[0].result));
    assert_eq!(db.scalar("SELECT count(*) FROM widgets"), 1);
    assert_eq!(db.scalar("SELECT count(*) FROM operations"), 1);
}

#[test]
fn racing_threads_with_separate_store_handles_produce_one_effect() {
    let db = temp();
    let outcomes: Vec<Outcome> = race_separate_handles(&db, |_| "gear".into())
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(outcomes.iter().filter(|o| !o.replayed).count(), 1);
    assert!(outcomes.iter().all(|o| o.result == outcomes[0].result));
    assert_eq!(db.scalar("SELECT count(*) FROM widgets"), 1);
    assert_eq!(db.scalar("SELECT count(*) FROM operations"), 1);
}

#[test]
fn racing_different_intents_have_one_winner_and_the_rest_conflict() {
    let db = temp();
    let results = race_separate_handles(&db, |i| format!("gear-{i}"));
    let winners: Vec<&Outcome> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1);
    assert!(!winners[0].replayed);
    for r in &results {
        if let Err(e) = r {
            assert_eq!(e.code, ErrorCode::OperationConflict, "{e}");
        }
    }
    let name = winners[0].result["name"].as_str().unwrap().to_string();
    assert_eq!(db.scalar("SELECT count(*) FROM widgets"), 1);
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM widgets WHERE name = '{name}'"
        )),
        1
    );
    assert_eq!(db.scalar("SELECT count(*) FROM operations"), 1);
}
