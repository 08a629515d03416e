//! `toolledger prune` through the built binary on both backends: its JSON summary, a dry run,
//! a limit, the answers of a tombstone (replay, another intent), the horizon, and a SIGKILL
//! in the middle of pruning under load, after which `audit` passes and every acknowledged
//! operation is still answered.

#[macro_use]
mod support;

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::wire::{Db, Ledger};
use support::Run;
use toolledger::clock::{ManualClock, SharedClock};
use toolledger::effect::EffectTx;
use toolledger::engine::{Engine, InlineEffect};
use toolledger::{Error, Principal};
use toolledger_mcp::error_of;
use toolledger_mcp::reply::tool_result;
use toolledger_testkit::calls::{inline_call, principal};
use toolledger_testkit::history::{count_effects_store, Checker, LedgerCli, Recorder};

/// The tests' clock.
const T0: i64 = 1_800_000_000;

fn run(db: &Db, cmd: &str, args: &[&str]) -> Run {
    support::toolledger()
        .arg(cmd)
        .args(db.store_args())
        .args(args)
        .envs(db.key_env())
        .output()
        .unwrap()
        .into()
}

fn automation(db: &Db, key: &str, minutes: i64, at: i64, replay_ttl: i64) -> Value {
    let args = json!({"request_id": key, "interval_minutes": minutes}).to_string();
    let (at, ttl) = (at.to_string(), replay_ttl.to_string());
    let flags = [
        "create_automation",
        "--principal",
        "alice",
        "--args",
        &args,
        "--clock-epoch",
        &at,
        "--replay-ttl",
        &ttl,
        "--authority-ttl",
        "100000",
    ];
    run(db, "call", &flags).json()
}

fn prune(db: &Db, at: i64, extra: &[&str]) -> Value {
    let at = at.to_string();
    let mut args = vec!["--clock-epoch", &at];
    args.extend_from_slice(extra);
    let r = run(db, "prune", &args);
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    r.json()
}

fn audit_passes(db: &Db) {
    let r = run(db, "audit", &[]);
    assert_eq!(r.code, 0, "{}", r.stdout);
}

fn prune_compacts_answers_and_forgets(db: Db) {
    for key in ["r1", "r2", "r3"] {
        assert_eq!(automation(&db, key, 60, T0, 100)["replayed"], false);
    }
    assert_eq!(automation(&db, "r4", 60, T0, 100_000)["replayed"], false);
    let dry = prune(&db, T0 + 100, &["--dry-run"]);
    assert_eq!(
        (&dry["compacted"], &dry["dry_run"]),
        (&json!(3), &json!(true))
    );
    assert_eq!(dry["rows"], json!({"live": 4, "tombstones": 0}));
    let some = prune(&db, T0 + 100, &["--limit", "2", "--batch", "1"]);
    assert_eq!(some["compacted"], 2, "{some}");
    let rest = prune(&db, T0 + 100, &[]);
    assert_eq!(
        (&rest["compacted"], &rest["deleted"], &rest["busy"]),
        (&json!(1), &json!(0), &json!(false)),
        "{rest}"
    );
    assert_eq!(rest["rows"], json!({"live": 1, "tombstones": 3}));
    assert_eq!(rest["totals"]["compacted_total"], 3);
    let clock: SharedClock = Arc::new(ManualClock::new(T0 + 100));
    let metrics = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(toolledger_mcp::telemetry::render(&db.store(), &clock))
        .unwrap();
    for line in [
        "toolledger_operation_rows{kind=\"live\"} 1",
        "toolledger_operation_rows{kind=\"tombstone\"} 3",
        "toolledger_pruned_rows{kind=\"compacted\"} 3",
        "toolledger_unsettled_past_retention 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in {metrics}");
    }

    let replay = automation(&db, "r1", 60, T0 + 100, 100);
    assert_eq!(
        replay["error"]["code"], "operation_retention_expired",
        "{replay}"
    );
    let other = automation(&db, "r1", 61, T0 + 100, 100);
    assert_eq!(other["error"]["code"], "operation_conflict", "{other}");
    assert_eq!(
        automation(&db, "r4", 60, T0 + 100, 100_000)["replayed"],
        true
    );
    let tombstone =
        db.pairs("SELECT status_ref, state FROM operations WHERE idempotency_key = 'r1'");
    let status = run(&db, "status", &["--status-ref", &tombstone[0].0]).json();
    assert_eq!(
        (&status["status"], &status["result"]),
        (&json!("applied"), &Value::Null)
    );
    assert_eq!(status["compacted_at"], T0 + 100, "{status}");
    let args = json!({"operation_id": "r1"}).to_string();
    let mcp = [
        "get_operation_status",
        "--principal",
        "alice",
        "--args",
        &args,
    ];
    let mcp = run(&db, "call", &mcp).json();
    assert_eq!(
        (&mcp["state"], &mcp["storedResult"], &mcp["authoritative"]),
        (&json!("applied"), &Value::Null, &json!(false)),
        "{mcp}"
    );
    audit_passes(&db);

    let kept = prune(&db, T0 + 100, &["--tombstone-ttl", "never"]);
    assert_eq!(kept["deleted"], 0);
    let gone = prune(&db, T0 + 100 + 3_600, &["--tombstone-ttl", "1h"]);
    assert_eq!(gone["deleted"], 3, "{gone}");
    assert_eq!(gone["rows"], json!({"live": 1, "tombstones": 0}));
    let again = automation(&db, "r1", 61, T0 + 3_700, 100);
    assert_eq!(again["replayed"], false, "the key was forgotten: {again}");
    audit_passes(&db);
}

/// The kill test's effect table: one row per effect, keyed by the operation id, so the
/// history checker can count effects per operation.
const MARKS: &str = "CREATE TABLE prune_marks (key TEXT NOT NULL)";

/// An inline effect that writes one mark for its key.
struct Mark(String);

impl InlineEffect for Mark {
    fn apply(&self, tx: &mut dyn EffectTx, _: &Principal) -> Result<Value, Error> {
        tx.execute(
            "INSERT INTO prune_marks(key) VALUES (?1)",
            &[self.0.as_str().into()],
        )?;
        Ok(json!({"marked": self.0}))
    }
}

/// One call of the marking tool under `key`, its result kept until `retention`: the tool
/// result a client would see.
async fn mark(e: &Engine, key: &str, retention: Option<i64>) -> Value {
    let mut call = inline_call(&principal("acme", "alice"), "mark", key, json!({"k": key}));
    call.retention_deadline = retention;
    let result = e
        .execute_inline(call, Arc::new(Mark(key.to_string())))
        .await;
    serde_json::to_value(tool_result(result.map(|o| o.result))).unwrap()
}

/// One recorded call: registered, sent, and its reply kept in the history.
async fn recorded(rec: &Recorder, e: &Engine, key: &str, retention: Option<i64>) -> Value {
    rec.register(key, "mark", json!({"k": key}));
    rec.sent(key);
    let reply = mark(e, key, retention).await;
    rec.replied(key, reply.clone());
    reply
}

/// Recorded calls of `keys`, up to 256 at once (within the store's queue), all acknowledged.
async fn fresh(rec: &Recorder, e: &Engine, keys: Vec<String>, retention: Option<i64>) {
    for chunk in keys.chunks(256) {
        let tasks: Vec<_> = chunk
            .iter()
            .cloned()
            .map(|k| {
                let (e, rec) = (e.clone(), rec.clone());
                tokio::spawn(async move { recorded(&rec, &e, &k, retention).await })
            })
            .collect();
        for t in tasks {
            let reply = t.await.unwrap();
            assert_eq!(error_of(&reply), None, "{reply}");
        }
    }
}

fn sigkill_while_pruning_under_load_keeps_the_ledger_whole(db: Db) {
    // `toolledger prune` in batches of one row.
    sigkill_while_pruning_under_load(db, &["prune", "--batch", "1"], 400);
}

fn sigkill_while_a_worker_prunes_in_the_background_keeps_the_ledger_whole(db: Db) {
    // The background pruner of a worker: on SQLite steps its store's writer does alone, on
    // PostgreSQL paced batches of its own; many rows, so the kill lands in the middle.
    sigkill_while_pruning_under_load(db, &["worker", "--prune-interval", "1"], 3_000);
}

/// Fresh calls under load while the `toolledger` command `pruner` prunes `expired` operations
/// past their retention; the pruner is SIGKILLed once it has committed some. Then the history
/// checker, the audit and a last prune find the ledger whole.
fn sigkill_while_pruning_under_load(db: Db, pruner: &[&str], expired: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let clock = ManualClock::new(T0);
    let shared: SharedClock = Arc::new(clock.clone());
    let store = db.store();
    rt.block_on(store.write(|tx: &mut dyn EffectTx| tx.execute(MARKS, &[])))
        .unwrap();
    let e = Engine::new(store.clone(), shared);
    let rec = Recorder::new();
    let expired: Vec<String> = (0..expired).map(|i| format!("e{i}")).collect();
    let kept: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    rt.block_on(fresh(&rec, &e, expired.clone(), Some(T0 + 10)));
    rt.block_on(fresh(&rec, &e, kept.clone(), Some(T0 + 1_000_000)));
    clock.set(T0 + 100);

    // Load: fresh calls, each recorded with what it answered, while the pruner works; it is
    // killed once it has committed some, and before it has done them all.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (e, stop, rec) = (e.clone(), stop.clone(), rec.clone());
        rt.spawn(async move {
            let mut sent = Vec::new();
            while !stop.load(Ordering::SeqCst) && sent.len() < 5_000 {
                let key = format!("l{}", sent.len());
                recorded(&rec, &e, &key, None).await;
                sent.push(key);
            }
            sent
        })
    };
    let at = (T0 + 100).to_string();
    let mut child = support::toolledger()
        .arg(pruner[0])
        .args(db.store_args())
        .args(&pruner[1..])
        .args(["--clock-epoch", &at])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let compacted = "SELECT compacted_total FROM prune_state";
    while db.scalar(compacted) < 10 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the pruner ended early"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "killed mid-run: {status:?}");
    let at_kill = db.scalar(compacted);
    assert!(
        at_kill < expired.len() as i64,
        "killed after the pass: {at_kill}"
    );
    stop.store(true, Ordering::SeqCst);
    let sent = rt.block_on(load).unwrap();
    assert!(!sent.is_empty());

    // The history checker: no duplicate effect, no acknowledged operation lost, no stray
    // row, the audit passing, and every operation short of its retention deadline answering
    // a replay with its first answer. The expired ones answer `operation_retention_expired`.
    let mut replays = Vec::new();
    rt.block_on(async {
        for key in kept.iter().chain(&sent) {
            replays.push((key, mark(&e, key, None).await));
        }
        for key in &expired {
            let answer = mark(&e, key, Some(T0 + 10)).await;
            let code = error_of(&answer).map(|e| e["code"].clone());
            assert_eq!(code, Some(json!("operation_retention_expired")), "{key}");
        }
    });
    let cli = LedgerCli::new(support::BIN, db.store_args());
    let marks = "SELECT key, count(*) FROM prune_marks GROUP BY key";
    let history = rec.history();
    let mut checker = Checker::new(&history)
        .ledger(cli.rows().unwrap())
        .effects(count_effects_store(&store, marks).unwrap())
        .audit(cli.audit());
    for (key, reply) in replays {
        checker = checker.replay(key, reply);
    }
    let report = checker.check();
    report.assert_ok();
    assert_eq!(report.operations, expired.len() + 40 + sent.len());

    let rest = prune(&db, T0 + 100, &[]);
    let before = db.scalar("SELECT count(*) FROM operations WHERE compacted_at IS NOT NULL");
    assert_eq!(before, expired.len() as i64, "{rest}");
    assert_eq!(rest["totals"]["compacted_total"], expired.len(), "{rest}");
    audit_passes(&db);
}

#[test]
fn vacuum_switches_an_older_sqlite_file_to_incremental() {
    let db = Db::sqlite();
    automation(&db, "r1", 60, T0, 100);
    let Db::Sqlite(file) = &db else {
        unreachable!()
    };
    // A file from before `auto_vacuum = INCREMENTAL` was the default.
    let conn = rusqlite::Connection::open(file.path()).unwrap();
    conn.execute_batch("PRAGMA auto_vacuum = NONE; VACUUM;")
        .unwrap();
    let mode = |c: &rusqlite::Connection| {
        c.query_row("PRAGMA auto_vacuum", [], |r| r.get::<_, i64>(0))
            .unwrap()
    };
    assert_eq!(mode(&conn), 0);
    let r = prune(&db, T0 + 100, &["--vacuum"]);
    assert_eq!(r["compacted"], 1, "{r}");
    assert_eq!(r["vacuum"]["auto_vacuum"], "incremental", "{r}");
    let fresh = rusqlite::Connection::open(file.path()).unwrap();
    assert_eq!(mode(&fresh), 2);
    audit_passes(&db);
}

fn a_worker_prunes_in_the_background(db: Db) {
    automation(&db, "r1", 60, T0, 100);
    let at = (T0 + 100).to_string();
    let mut worker = support::toolledger()
        .arg("worker")
        .args(db.store_args())
        .args(["--clock-epoch", &at, "--prune-interval", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let compacted = "SELECT compacted_total FROM prune_state";
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while db.scalar(compacted) == 0 {
        assert!(std::time::Instant::now() < give_up, "no background pass");
        assert!(worker.try_wait().unwrap().is_none(), "the worker ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGTERM: the worker stops its pruner and exits cleanly.
    unsafe { libc::kill(worker.id() as i32, libc::SIGTERM) };
    assert!(worker.wait().unwrap().success());
    let rows = "SELECT count(*) FROM operations WHERE compacted_at IS NOT NULL";
    assert_eq!(db.scalar(rows), 1);
    audit_passes(&db);
}

on_both_backends!(
    prune_compacts_answers_and_forgets,
    sigkill_while_pruning_under_load_keeps_the_ledger_whole,
    sigkill_while_a_worker_prunes_in_the_background_keeps_the_ledger_whole,
    a_worker_prunes_in_the_background
);
