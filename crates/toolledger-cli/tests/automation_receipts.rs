//! The twelve automation-receipt behaviours, against the real engine, principal store and SQLite file.
//!
//! The automations' `receipts` table is the ledger's `operations` table; a receipt is keyed by
//! (tenant = workspace, subject = principal, tool, request_id).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;
use toolledger::clock::{SharedClock, SystemClock};
use toolledger::engine::Engine;
use toolledger::store::sqlite::SqliteStore;
use toolledger::{Error, ErrorCode};
use toolledger_cli::common::open_store;
use toolledger_reference::automations::{self, SCOPE, SET_INTERVAL};

struct World {
    _dir: tempfile::TempDir,
    path: PathBuf,
    handle: Handle,
}

/// One store handle (its own writer and read connections) with an engine and principal store.
struct Handle {
    engine: Engine,
    principals: PrincipalStore,
}

fn handle(path: &Path) -> Handle {
    let store: SqliteStore = open_store(path, Some("automations".into()), false).unwrap();
    let clock: SharedClock = Arc::new(SystemClock);
    Handle {
        engine: Engine::new(store.clone(), clock),
        principals: PrincipalStore::new(store),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo.sqlite");
    let handle = handle(&path);
    rt().block_on(async {
        let store = handle.engine.store();
        for (id, tenant) in [(1, "team-a"), (2, "team-a"), (20, "team-b")] {
            automations::seed_automation(store, Some(id), tenant, 15, 1)
                .await
                .unwrap();
        }
        for name in ["alice", "bob"] {
            handle
                .principals
                .add(name, "team-a", &[], &[SCOPE.to_string()], false)
                .await
                .unwrap();
        }
    });
    World {
        _dir: dir,
        path,
        handle,
    }
}

/// The automations' `call(key, who, target, version, minutes)`, with raw JSON values so invalid
/// input can be expressed.
fn args(key: Value, target: Value, version: Value, minutes: Value) -> Value {
    json!({"request_id": key, "automation_id": target, "expected_version": version,
           "interval_minutes": minutes})
}

fn edit(key: &str, target: i64, version: i64, minutes: i64) -> Value {
    args(json!(key), json!(target), json!(version), json!(minutes))
}

fn edit_42() -> Value {
    edit("edit-42", 1, 1, 30)
}

impl Handle {
    fn call_as(&self, who: &str, a: Value) -> Result<Value, Error> {
        rt().block_on(automations::call_tool(
            &self.engine,
            &self.principals,
            who,
            SET_INTERVAL,
            a,
        ))
    }
}

impl World {
    fn call(&self, a: Value) -> Result<Value, Error> {
        self.handle.call_as("alice", a)
    }

    fn call_as(&self, who: &str, a: Value) -> Result<Value, Error> {
        self.handle.call_as(who, a)
    }

    fn query(&self, sql: &str) -> Vec<Vec<i64>> {
        query(&self.path, sql)
    }

    fn receipts(&self) -> i64 {
        self.query("SELECT count(*) FROM operations")[0][0]
    }

    fn row(&self, id: i64) -> Vec<Vec<i64>> {
        self.query(&format!(
            "SELECT interval_minutes, version FROM automations WHERE id = {id}"
        ))
    }
}

fn side(path: &Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(path).unwrap();
    c.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    c
}

fn query(path: &Path, sql: &str) -> Vec<Vec<i64>> {
    let c = side(path);
    let mut stmt = c.prepare(sql).unwrap();
    let width = stmt.column_count();
    stmt.query_map([], |r| (0..width).map(|i| r.get::<_, i64>(i)).collect())
        .unwrap()
        .collect::<Result<Vec<Vec<i64>>, _>>()
        .unwrap()
}

fn code(r: Result<Value, Error>) -> ErrorCode {
    r.unwrap_err().code
}

fn result(id: i64, minutes: i64, version: i64, replayed: bool) -> Value {
    json!({"id": id, "interval_minutes": minutes, "version": version, "replayed": replayed})
}

#[test]
fn version_only_control_cannot_recover_its_own_result() {
    let w = world();
    let sql = "UPDATE automations SET interval_minutes = 30, version = version + 1
               WHERE id = 1 AND tenant = 'team-a' AND version = 1 RETURNING version";
    assert_eq!(w.query(sql), vec![vec![2]]);
    assert_eq!(
        w.query(sql),
        Vec::<Vec<i64>>::new(),
        "the same retry now conflicts"
    );
    assert_eq!(w.receipts(), 0);
}

#[test]
fn commit_then_lost_response_replays_from_a_fresh_store_handle() {
    let w = world();
    {
        // The handler commits and its store handle goes away; the reply is lost.
        let transient = handle(&w.path);
        let lost = transient.call_as("alice", edit_42()).unwrap();
        drop(lost);
    }
    let fresh = handle(&w.path);
    let reply = fresh.call_as("alice", edit_42()).unwrap();
    assert_eq!(reply, result(1, 30, 2, true));
    assert_eq!(w.row(1), vec![vec![30, 2]]);
    assert_eq!(w.receipts(), 1);
}

#[test]
fn replay_returns_the_historical_result_without_undoing_a_newer_edit() {
    let w = world();
    let original = w.call(edit_42()).unwrap();
    let later = w.call(edit("edit-43", 1, 2, 60)).unwrap();
    let retry = w.call(edit_42()).unwrap();
    assert_eq!(original, result(1, 30, 2, false));
    assert_eq!(retry, result(1, 30, 2, true));
    assert_eq!(later["version"], 3);
    assert_eq!(w.row(1), vec![vec![60, 3]]);
}

#[test]
fn same_key_cannot_change_target_version_or_value() {
    let w = world();
    w.call(edit_42()).unwrap();
    for changed in [
        edit("edit-42", 1, 1, 60),
        edit("edit-42", 1, 2, 30),
        edit("edit-42", 2, 1, 30),
    ] {
        assert_eq!(
            code(w.call(changed.clone())),
            ErrorCode::OperationConflict,
            "{changed}"
        );
    }
    assert_eq!(w.receipts(), 1);
    assert_eq!(w.row(2), vec![vec![15, 1]]);
    assert_eq!(w.row(1), vec![vec![30, 2]]);
}

#[test]
fn new_key_does_not_bypass_the_old_version() {
    let w = world();
    w.call(edit_42()).unwrap();
    assert_eq!(
        code(w.call(edit("another-key", 1, 1, 60))),
        ErrorCode::VersionConflict
    );
    assert_eq!(w.receipts(), 1);
    assert_eq!(w.row(1), vec![vec![30, 2]]);
}

#[test]
fn same_text_key_is_scoped_to_principal_and_workspace() {
    let w = world();
    w.call(edit_42()).unwrap();
    let bob = w.call_as("bob", edit("edit-42", 1, 2, 60)).unwrap();
    assert_eq!(bob["replayed"], false);
    // alice moves to team-b (the principal store is re-read at every call).
    rt().block_on(
        w.handle
            .principals
            .add("alice", "team-b", &[], &[SCOPE.to_string()], false),
    )
    .unwrap();
    let other_team = w.call(edit("edit-42", 20, 1, 30)).unwrap();
    assert_eq!(other_team, result(20, 30, 2, false));
    assert_eq!(w.receipts(), 3);
    let scopes = w.query(
        "SELECT count(DISTINCT tenant || '/' || subject) FROM operations
         WHERE idempotency_key = 'edit-42'",
    );
    assert_eq!(scopes, vec![vec![3]]);
}

#[test]
fn current_scope_is_checked_even_for_a_saved_receipt() {
    let w = world();
    w.call(edit_42()).unwrap();
    rt().block_on(
        w.handle
            .principals
            .revoke("alice", &[], &[SCOPE.to_string()], false),
    )
    .unwrap();
    assert_eq!(code(w.call(edit_42())), ErrorCode::PermissionDenied);
    // A principal removed altogether is refused the same way.
    rt().block_on(w.handle.principals.revoke("bob", &[], &[], true))
        .unwrap();
    assert_eq!(
        code(w.call_as("bob", edit("b-1", 2, 1, 30))),
        ErrorCode::PermissionDenied
    );
    assert_eq!(w.row(1), vec![vec![30, 2]]);
    assert_eq!(w.receipts(), 1);
}

#[test]
fn moved_or_deleted_resource_does_not_replay_or_resurrect() {
    let w = world();
    w.call(edit_42()).unwrap();
    side(&w.path)
        .execute("UPDATE automations SET tenant = 'team-b' WHERE id = 1", [])
        .unwrap();
    assert_eq!(code(w.call(edit_42())), ErrorCode::NotFound);
    side(&w.path)
        .execute("DELETE FROM automations WHERE id = 1", [])
        .unwrap();
    assert_eq!(code(w.call(edit_42())), ErrorCode::NotFound);
    assert_eq!(
        w.query("SELECT count(*) FROM automations WHERE id = 1"),
        vec![vec![0]]
    );
    assert_eq!(w.receipts(), 1);
}

#[test]
fn receipt_failure_rolls_back_the_row_change() {
    let w = world();
    // The receipt (the ledger row, written once with the result) is written after the row
    // update; refuse that write.
    side(&w.path)
        .execute_batch(
            "CREATE TRIGGER fail_receipt BEFORE INSERT ON operations
             BEGIN SELECT RAISE(ABORT, 'receipt store unavailable'); END;",
        )
        .unwrap();
    let err = w.call(edit_42()).unwrap_err();
    assert_eq!(err.code, ErrorCode::Unavailable);
    assert!(!err.message.contains("RAISE"), "{}", err.message);
    assert_eq!(w.row(1), vec![vec![15, 1]]);
    assert_eq!(w.receipts(), 0);
    side(&w.path)
        .execute_batch("DROP TRIGGER fail_receipt")
        .unwrap();
    assert_eq!(w.call(edit_42()).unwrap(), result(1, 30, 2, false));
}

/// Runs `calls` from separate threads, each with its own store handle, released together.
fn race(path: &Path, calls: Vec<Value>) -> Vec<Result<Value, Error>> {
    let barrier = Arc::new(Barrier::new(calls.len()));
    let threads: Vec<_> = calls
        .into_iter()
        .map(|a| {
            let path = path.to_path_buf();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let h = handle(&path);
                barrier.wait();
                h.call_as("alice", a)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn simultaneous_duplicate_calls_share_one_result() {
    let w = world();
    let replies: Vec<Value> = race(&w.path, vec![edit_42(), edit_42()])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let mut replayed: Vec<bool> = replies
        .iter()
        .map(|r| r["replayed"].as_bool().unwrap())
        .collect();
    replayed.sort();
    assert_eq!(replayed, [false, true]);
    let strip = |v: &Value| {
        let mut v = v.clone();
        v.as_object_mut().unwrap().remove("replayed");
        v
    };
    assert_eq!(strip(&replies[0]), strip(&replies[1]));
    assert_eq!(w.row(1), vec![vec![30, 2]]);
    assert_eq!(w.receipts(), 1);
}

#[test]
fn simultaneous_key_mismatch_has_one_winner() {
    let w = world();
    let outcomes = race(
        &w.path,
        vec![edit("edit-42", 1, 1, 30), edit("edit-42", 1, 1, 60)],
    );
    let winners: Vec<&Value> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1);
    let mismatches = outcomes
        .iter()
        .filter(|o| matches!(o, Err(e) if e.code == ErrorCode::OperationConflict))
        .count();
    assert_eq!(mismatches, 1);
    let minutes = winners[0]["interval_minutes"].as_i64().unwrap();
    assert_eq!(w.row(1), vec![vec![minutes, 2]]);
    assert_eq!(w.receipts(), 1);
}

#[test]
fn sixteen_threads_racing_one_key_make_exactly_one_effect_row() {
    let w = world();
    let barrier = Arc::new(Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let path = w.path.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let h = handle(&path);
                barrier.wait();
                rt().block_on(automations::call_tool(
                    &h.engine,
                    &h.principals,
                    "alice",
                    automations::CREATE_AUTOMATION,
                    json!({"request_id": "create-race", "interval_minutes": 45}),
                ))
            })
        })
        .collect();
    let replies: Vec<Value> = threads
        .into_iter()
        .map(|t| t.join().unwrap().unwrap())
        .collect();
    assert_eq!(replies.iter().filter(|r| r["replayed"] == false).count(), 1);
    let id = replies[0]["id"].as_i64().unwrap();
    assert!(replies.iter().all(|r| r["id"] == id));
    assert_eq!(
        w.query("SELECT count(*) FROM automations WHERE interval_minutes = 45"),
        vec![vec![1]]
    );
    assert_eq!(w.receipts(), 1);
}

#[test]
fn invalid_or_inaccessible_requests_do_not_write() {
    let w = world();
    let bad_values = [
        args(json!("edit-42"), json!(true), json!(1), json!(30)),
        args(json!("edit-42"), json!(1), json!(0), json!(30)),
        args(json!("edit-42"), json!(1), json!(1), json!(1)),
        args(json!("edit-42"), json!(1), json!(1), json!(true)),
        args(json!("edit-42"), json!("1 OR 1=1"), json!(1), json!(30)),
        args(json!("edit-42"), json!(1.5), json!(1), json!(30)),
        args(json!("edit-42"), json!(1), json!(-1), json!(30)),
        args(json!("edit-42"), json!(1), json!(1), json!(1441)),
    ];
    for a in bad_values {
        assert_eq!(code(w.call(a.clone())), ErrorCode::InvalidArguments, "{a}");
    }
    for key in [
        json!(""),
        json!("x".repeat(65)),
        Value::Null,
        json!("unsafe key"),
    ] {
        let a = args(key.clone(), json!(1), json!(1), json!(30));
        assert_eq!(code(w.call(a)), ErrorCode::InvalidArguments, "{key}");
    }
    let mut extra = edit_42();
    extra["workspace_id"] = json!("team-b");
    assert_eq!(code(w.call(extra)), ErrorCode::InvalidArguments);
    let mut missing = edit_42();
    missing.as_object_mut().unwrap().remove("expected_version");
    assert_eq!(code(w.call(missing)), ErrorCode::InvalidArguments);
    assert_eq!(code(w.call(json!("edit-42"))), ErrorCode::InvalidArguments);
    for target in [20, 999] {
        assert_eq!(
            code(w.call(edit("edit-42", target, 1, 30))),
            ErrorCode::NotFound,
            "{target}"
        );
    }
    assert_eq!(
        code(w.call_as("mallory", edit_42())),
        ErrorCode::PermissionDenied
    );
    assert_eq!(w.receipts(), 0);
    assert_eq!(
        w.query("SELECT version FROM automations ORDER BY id"),
        vec![vec![1], vec![1], vec![1]]
    );
}
