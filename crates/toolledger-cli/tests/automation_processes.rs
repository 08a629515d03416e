//! Request-id receipts across separate OS processes: `toolledger call` invocations racing on one SQLite
//! file, lost replies recovered by a new process, the command's output contract, and
//! `toolledger demo receipts`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use serde_json::{json, Value};
use toolledger_cli::common::open_store;
use toolledger_reference::automations::{self, SCOPE};
use toolledger_testkit::db::sqlite_scalar;

use support::BIN;

struct World {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("procs.sqlite");
    let store = open_store(&path, None, false).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        automations::seed_automation(&store, Some(1), "team-a", 15, 1)
            .await
            .unwrap();
        toolledger::authz::PrincipalStore::new(store.clone())
            .add("alice", "team-a", &[], &[SCOPE.to_string()], false)
            .await
            .unwrap();
    });
    drop(store);
    World { _dir: dir, path }
}

fn spawn_call(path: &Path, tool: &str, args: &Value, extra: &[&str]) -> Child {
    Command::new(BIN)
        .arg("call")
        .arg(tool)
        .args(["--principal", "alice", "--args", &args.to_string(), "--db"])
        .arg(path)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(child: Child) -> (i32, Value) {
    let out: Output = child.wait_with_output().unwrap();
    let code = out.status.code().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let value = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "stdout is not one JSON object: {stdout:?}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, value)
}

fn call(path: &Path, tool: &str, args: &Value, extra: &[&str]) -> (i32, Value) {
    finish(spawn_call(path, tool, args, extra))
}

fn edit(key: &str, version: i64, minutes: i64) -> Value {
    json!({"request_id": key, "automation_id": 1, "expected_version": version,
           "interval_minutes": minutes})
}

fn row(path: &Path) -> (i64, i64) {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT interval_minutes, version FROM automations WHERE id = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
}

#[test]
fn a_lost_reply_is_recovered_by_a_new_process_as_a_replay() {
    let w = world();
    let (code, first) = call(&w.path, "set_interval", &edit("edit-42", 1, 30), &[]);
    assert_eq!(code, 0);
    drop(first); // the reply is lost
    let (code, retry) = call(&w.path, "set_interval", &edit("edit-42", 1, 30), &[]);
    assert_eq!(code, 0);
    assert_eq!(
        retry,
        json!({"id": 1, "interval_minutes": 30, "version": 2, "replayed": true})
    );
    assert_eq!(row(&w.path), (30, 2));
    assert_eq!(sqlite_scalar(&w.path, "SELECT count(*) FROM operations"), 1);
}

#[test]
fn simultaneous_identical_processes_yield_one_fresh_result_and_one_replay() {
    let w = world();
    let children: Vec<Child> = (0..2)
        .map(|_| spawn_call(&w.path, "set_interval", &edit("edit-42", 1, 30), &[]))
        .collect();
    let outcomes: Vec<(i32, Value)> = children.into_iter().map(finish).collect();
    assert!(outcomes.iter().all(|(c, _)| *c == 0), "{outcomes:?}");
    let mut replayed: Vec<bool> = outcomes
        .iter()
        .map(|(_, v)| v["replayed"].as_bool().unwrap())
        .collect();
    replayed.sort();
    assert_eq!(replayed, [false, true]);
    assert_eq!(outcomes[0].1["version"], outcomes[1].1["version"]);
    assert_eq!(row(&w.path), (30, 2));
    assert_eq!(sqlite_scalar(&w.path, "SELECT count(*) FROM operations"), 1);
}

#[test]
fn simultaneous_processes_with_different_payloads_have_one_winner() {
    let w = world();
    let children: Vec<Child> = [30, 60]
        .into_iter()
        .map(|m| spawn_call(&w.path, "set_interval", &edit("edit-42", 1, m), &[]))
        .collect();
    let outcomes: Vec<(i32, Value)> = children.into_iter().map(finish).collect();
    let winners: Vec<&Value> = outcomes
        .iter()
        .filter(|(c, _)| *c == 0)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(winners.len(), 1, "{outcomes:?}");
    let losers: Vec<&Value> = outcomes
        .iter()
        .filter(|(c, _)| *c == 1)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(losers.len(), 1, "{outcomes:?}");
    assert_eq!(losers[0]["error"]["code"], "operation_conflict");
    let minutes = winners[0]["interval_minutes"].as_i64().unwrap();
    assert_eq!(row(&w.path), (minutes, 2));
    assert_eq!(sqlite_scalar(&w.path, "SELECT count(*) FROM operations"), 1);
}

#[test]
fn eight_processes_racing_one_key_create_exactly_one_row() {
    let w = world();
    let args = json!({"request_id": "create-race", "interval_minutes": 45});
    let children: Vec<Child> = (0..8)
        .map(|_| spawn_call(&w.path, "create_automation", &args, &[]))
        .collect();
    let outcomes: Vec<(i32, Value)> = children.into_iter().map(finish).collect();
    assert!(outcomes.iter().all(|(c, _)| *c == 0), "{outcomes:?}");
    assert_eq!(
        outcomes
            .iter()
            .filter(|(_, v)| v["replayed"] == false)
            .count(),
        1
    );
    assert_eq!(
        sqlite_scalar(
            &w.path,
            "SELECT count(*) FROM automations WHERE interval_minutes = 45"
        ),
        1
    );
    assert_eq!(sqlite_scalar(&w.path, "SELECT count(*) FROM operations"), 1);
}

#[test]
fn tool_errors_are_one_json_object_with_exit_1_and_write_nothing() {
    let w = world();
    for (tool, args) in [
        (
            "set_interval",
            json!({"request_id": "x", "automation_id": true}),
        ),
        ("set_interval", json!("not an object")),
        ("no_such_tool", json!({})),
    ] {
        let (code, out) = call(&w.path, tool, &args, &[]);
        assert_eq!(code, 1, "{out}");
        assert_eq!(out["error"]["code"], "invalid_arguments", "{out}");
        assert!(out["error"]["message"].is_string());
    }
    // Malformed JSON in --args is a command-line failure: exit 2, on stderr.
    let out = Command::new(BIN)
        .args(["call", "set_interval", "--principal", "alice"])
        .args([
            "--args",
            r#"{"request_id": "a", "request_id": "b"}"#,
            "--db",
        ])
        .arg(&w.path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let v: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(v["error"]["code"], "USAGE_ERROR");
    // A missing required option is a usage error (exit 2), not a tool call.
    let out = Command::new(BIN)
        .args(["call", "set_interval", "--args", "{}", "--db"])
        .arg(&w.path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(sqlite_scalar(&w.path, "SELECT count(*) FROM operations"), 0);
    assert_eq!(row(&w.path), (15, 1));
}

#[test]
fn an_unusable_database_exits_2_without_leaking_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.sqlite");
    std::fs::write(&path, vec![0x42u8; 8192]).unwrap();
    let out = Command::new(BIN)
        .args([
            "call",
            "set_interval",
            "--principal",
            "alice",
            "--args",
            "{}",
        ])
        .arg("--db")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).unwrap();
    let v: Value = serde_json::from_str(stderr.trim()).unwrap();
    assert!(v["error"]["code"].is_string(), "{stderr}");
    assert!(!stderr.contains("garbage"), "{stderr}");
}

#[test]
fn clock_epoch_drives_the_authority_deadline() {
    let w = world();
    fn at(epoch: &'static str) -> [&'static str; 4] {
        ["--clock-epoch", epoch, "--authority-ttl", "10"]
    }
    let (code, _) = call(
        &w.path,
        "set_interval",
        &edit("edit-42", 1, 30),
        &at("1000"),
    );
    assert_eq!(code, 0);
    let (code, out) = call(
        &w.path,
        "set_interval",
        &edit("edit-42", 1, 30),
        &at("1009"),
    );
    assert_eq!((code, out["replayed"].clone()), (0, json!(true)));
    let (code, out) = call(
        &w.path,
        "set_interval",
        &edit("edit-42", 1, 30),
        &at("1010"),
    );
    assert_eq!(code, 1);
    assert_eq!(out["error"]["code"], "operation_authority_expired");
    assert_eq!(row(&w.path), (30, 2));
}

#[test]
fn demo_receipts_reads_back_the_story_and_exits_0() {
    let out = Command::new(BIN)
        .args(["demo", "receipts"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "one JSON object: {stdout}"
    );
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["read_back"]["operations"], 3);
    assert_eq!(v["read_back"]["edit_42_receipts"], 1);
    assert_eq!(
        v["read_back"]["automation"],
        json!({"id": 1, "interval_minutes": 60, "version": 3})
    );
    let checks = v["checks"].as_object().unwrap();
    assert!(checks.len() >= 5);
    assert!(checks.values().all(|c| c == &json!(true)), "{v}");
}
