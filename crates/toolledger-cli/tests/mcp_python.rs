//! An independent client: the official MCP Python SDK (`mcp==2.3.0`, from the virtualenv
//! that `.ci/run` creates; its python is named by `TOOLLEDGER_PYTHON`) drives the lost-reply
//! story in 2026-07-28 mode, and `set_interval` plus `create_issue` (body by elicitation) in
//! legacy (initialize) mode. Each case runs on both backends: a fresh SQLite file
//! (`sqlite::…`) and a fresh schema of the test PostgreSQL database (`postgres::…`, skipped
//! loudly without `TOOLLEDGER_TEST_DATABASE_URL`, failing in CI). The script gets the binary,
//! the `serve` flags that select the ledger and the key variables the server needs; the
//! rows are read back here.
//!
//! Without `TOOLLEDGER_PYTHON` the tests say so loudly and skip, except under CI
//! (`TOOLLEDGER_CI` set), where a missing interpreter is a failure.

#[macro_use]
mod support;

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};
use support::clients::python;
use support::wire::*;

on_both_backends!(
    python_sdk_lost_reply_story_in_2026_07_28_mode,
    python_sdk_set_interval_in_legacy_mode,
);

/// Runs `script` with one JSON argument: the binary, the `serve` flags selecting `db` and the
/// environment the server is to get (the SDK passes on only a small default set of its own).
fn run_script(python: &PathBuf, script: &str, db: &Db) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(script);
    let env: serde_json::Map<String, Value> = db
        .key_env()
        .into_iter()
        .map(|(k, v)| (k.to_string(), Value::from(v)))
        .collect();
    let spec = json!({
        "binary": bin(),
        "store_args": db.store_args(),
        "env": env,
    });
    let out = Command::new(python)
        .arg(path)
        .arg(spec.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn python_sdk_lost_reply_story_in_2026_07_28_mode(db: Db) {
    let Some(py) = python() else { return };
    let v = run_script(&py, "lost_reply.py", &db);
    assert_eq!(v["first_round"], "InputRequiredResult");
    assert_eq!(v["input_request_keys"], json!(["body"]));
    assert_eq!(v["transport_after_commit"], "unknown; no reply");
    let st = &v["status"];
    assert_eq!(st["state"], "applied");
    assert_eq!(st["principal"], "alice");
    assert_eq!(st["backend"], db.backend());
    assert_eq!(st["authoritative"], true);
    assert_eq!(st["freshWriteAuthorized"], false);
    assert_eq!(st["matchingIds"], json!([1]));
    assert_eq!(st["storedResult"], "created 1");
    assert_eq!(
        v["replay"],
        json!({"operationId": "py-case-03", "effectId": 1, "result": "created 1",
               "replayed": true, "state": "applied"})
    );
    // One issue and one ledger row, although the commit's reply was lost and the
    // continuation was sent again.
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "operations"), 1);
}

fn python_sdk_set_interval_in_legacy_mode(db: Db) {
    let Some(py) = python() else { return };
    let v = run_script(&py, "legacy_set_interval.py", &db);
    assert_eq!(v["protocol_version"], "2025-11-25");
    let tools = v["tools"].as_array().unwrap();
    for name in [
        "create_issue",
        "get_operation_status",
        "set_interval",
        "create_automation",
    ] {
        assert!(
            tools.iter().any(|t| t == name),
            "{name} missing from {tools:?}"
        );
    }
    let id = v["created"]["id"].clone();
    assert_eq!(
        v["set_interval"],
        json!([
            {"id": id, "interval_minutes": 60, "version": 2, "replayed": false},
            {"id": id, "interval_minutes": 60, "version": 2, "replayed": true},
        ])
    );
    assert_eq!(
        v["create_issue_legacy"],
        json!([
            {"operationId": "py-l", "effectId": 1, "result": "created 1", "replayed": false,
             "state": "applied"},
            {"operationId": "py-l", "effectId": 1, "result": "created 1", "replayed": true,
             "state": "applied"},
        ])
    );
    assert_eq!(count(&db, "automations"), 1);
    assert_eq!(count(&db, "issues"), 1);
}
