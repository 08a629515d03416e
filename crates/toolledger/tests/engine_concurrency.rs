//! Racing calls on one scope: through one engine (group commit in one writer) and through
//! separate store handles (separate write connections serialized by SQLite's write lock).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use serde_json::{json, Value};
use toolledger::clock::{SharedClock, SystemClock};
use toolledger::effect::EffectTx;
use toolledger::engine::{Engine, InlineCall, InlineEffect, Outcome};
use toolledger::store::sqlite::{OpenOptions, SqliteStore};
use toolledger::store::Migration;
use toolledger::{Error, ErrorCode, Principal, ToolContract};

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

fn temp() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.sqlite");
    drop(open(&path));
    (dir, path)
}

fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path, OpenOptions::new("race").with_migrations(WIDGETS)).unwrap()
}

fn engine(path: &Path) -> Engine {
    let clock: SharedClock = Arc::new(SystemClock);
    Engine::new(open(path), clock)
}

fn call(name: &str) -> InlineCall {
    InlineCall {
        principal: Principal {
            tenant: "team-a".into(),
            subject: "alice".into(),
            roles: BTreeSet::new(),
            scopes: BTreeSet::new(),
        },
        contract: ToolContract::uniform("make_widget", "1"),
        key: "race-1".into(),
        arguments: json!({ "name": name }),
        fingerprint: None,
        authority_deadline: None,
        retention_deadline: None,
        shared_key_namespace: false,
    }
}

fn count(path: &Path, sql: &str) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap()
}

/// Runs `RACERS` calls from separate OS threads, each with its own store handle, released
/// together by a barrier.
fn race_separate_handles(
    path: &Path,
    name_of: impl Fn(usize) -> String,
) -> Vec<Result<Outcome, Error>> {
    let barrier = Arc::new(Barrier::new(RACERS));
    let threads: Vec<_> = (0..RACERS)
        .map(|i| {
            let path = path.to_path_buf();
            let barrier = barrier.clone();
            let name = name_of(i);
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let engine = engine(&path);
                barrier.wait();
                rt.block_on(engine.execute_inline(call(&name), Arc::new(MakeWidget(name.clone()))))
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_tasks_on_one_engine_produce_one_effect() {
    let (_d, path) = temp();
    let engine = engine(&path);
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
    assert_eq!(count(&path, "SELECT count(*) FROM widgets"), 1);
    assert_eq!(count(&path, "SELECT count(*) FROM operations"), 1);
}

#[test]
fn racing_threads_with_separate_store_handles_produce_one_effect() {
    let (_d, path) = temp();
    let outcomes: Vec<Outcome> = race_separate_handles(&path, |_| "gear".into())
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(outcomes.iter().filter(|o| !o.replayed).count(), 1);
    assert!(outcomes.iter().all(|o| o.result == outcomes[0].result));
    assert_eq!(count(&path, "SELECT count(*) FROM widgets"), 1);
    assert_eq!(count(&path, "SELECT count(*) FROM operations"), 1);
}

#[test]
fn racing_different_intents_have_one_winner_and_the_rest_conflict() {
    let (_d, path) = temp();
    let results = race_separate_handles(&path, |i| format!("gear-{i}"));
    let winners: Vec<&Outcome> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1);
    assert!(!winners[0].replayed);
    for r in &results {
        if let Err(e) = r {
            assert_eq!(e.code, ErrorCode::OperationConflict, "{e}");
        }
    }
    let name = winners[0].result["name"].as_str().unwrap().to_string();
    assert_eq!(count(&path, "SELECT count(*) FROM widgets"), 1);
    assert_eq!(
        count(
            &path,
            &format!("SELECT count(*) FROM widgets WHERE name = '{name}'")
        ),
        1
    );
    assert_eq!(count(&path, "SELECT count(*) FROM operations"), 1);
}
