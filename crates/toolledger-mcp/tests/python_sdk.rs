//! An independent client: the official MCP Python SDK (`mcp==2.3.0`; its python is named by
//! `TOOLLEDGER_PYTHON`) drives `examples/guarded_tool.rs` as a stdio server, on a fresh
//! SQLite file and on a fresh schema of the test PostgreSQL database
//! (`TOOLLEDGER_TEST_DATABASE_URL`). The rows are read back here.
//!
//! Without `TOOLLEDGER_PYTHON`, or for PostgreSQL without `TOOLLEDGER_TEST_DATABASE_URL`, a
//! test says so loudly and skips — except under CI (`TOOLLEDGER_CI` set), where it fails.

#[allow(dead_code)]
#[path = "../examples/guarded_tool.rs"]
mod example;
mod support;

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};
use toolledger::effect::EffectTx;
use toolledger::store::postgres::{PgOptions, PgStore};
use toolledger_mcp::{KeyMaterial, LedgerGuard};
use toolledger_testkit::db::scalar_blocking;
use toolledger_testkit::machine::program;

const STATE_KEY: &str = "67756172646564207475726e2073746174652d6b65792c20666f722074657374";
const FP_KEY: &str = "67756172646564207475726e2066696e6765727072696e74206b657920746573";

fn python() -> Option<PathBuf> {
    program("TOOLLEDGER_PYTHON", "Python SDK (mcp==2.3.0)")
}

/// Runs the script against the example serving `database` (`TOOLLEDGER_DATABASE_URL`), with
/// `env` for the server too.
fn run_script(python: &PathBuf, database: &str, mut env: Value) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/guarded_tool.py");
    let exe = support::guarded_tool_binary();
    env["TOOLLEDGER_DATABASE_URL"] = json!(database);
    let spec = json!({
        "command": [exe],
        "env": env,
    });
    let out = Command::new(python)
        .arg(script)
        .arg(spec.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "guarded_tool.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A handle on the database the example served, for reading rows back.
fn open_ledger(database: &str) -> LedgerGuard {
    let keys = KeyMaterial::from_values(Some(STATE_KEY.into()), Some(FP_KEY.into()), None).unwrap();
    LedgerGuard::builder()
        .database(database)
        .migrations(&[example::NOTES])
        .keys(keys)
        .open()
        .unwrap()
}

/// What the client must have seen and the database must hold, on either backend.
fn check(v: &Value, ledger: &LedgerGuard) {
    assert_eq!(v["tools"], json!(["create_note", "get_operation_status"]));
    let input = &v["create_note_input_schema"];
    assert_eq!(input["additionalProperties"], false, "{input}");
    assert_eq!(v["create_note_has_output_schema"], true);

    let first = &v["first"];
    assert_eq!(first["is_error"], false, "{first}");
    assert_eq!(
        first["structured"],
        json!({"operationId": "py-note-1", "effectId": 1, "replayed": false, "state": "applied"})
    );
    let replay = &v["replay"];
    assert_eq!(replay["is_error"], false, "{replay}");
    assert_eq!(
        replay["structured"],
        json!({"operationId": "py-note-1", "effectId": 1, "replayed": true, "state": "applied"})
    );
    let conflict = &v["conflict"];
    assert_eq!(conflict["is_error"], true, "{conflict}");
    assert_eq!(
        conflict["structured"],
        Value::Null,
        "errors carry no structured content"
    );
    let error = |r: &Value| -> Value {
        serde_json::from_str::<Value>(r["text"].as_str().unwrap()).unwrap()["error"].clone()
    };
    assert_eq!(error(conflict)["code"], "operation_conflict");
    let extra = &v["extra_argument"];
    assert_eq!(extra["is_error"], true, "{extra}");
    assert_eq!(extra["structured"], Value::Null, "{extra}");
    assert_eq!(error(extra)["code"], "invalid_arguments");
    let message = error(extra)["message"].as_str().unwrap().to_string();
    assert!(message.contains("priority"), "{message}");

    let status = &v["status"];
    assert_eq!(status["is_error"], false, "{status}");
    let st = &status["structured"];
    assert_eq!(st["state"], "applied", "{st}");
    assert_eq!(st["authoritative"], true);
    assert_eq!(st["freshWriteAuthorized"], false);
    assert_eq!(st["principal"], "alice");
    assert_eq!(st["backend"], ledger.guard().backend_id());
    assert_eq!(st["matchingIds"], json!([1]));
    assert_eq!(st["storedResult"], json!({"effectId": 1}));
    // The refused call left nothing behind: no ledger row to find.
    assert_eq!(v["status_of_refused"]["structured"]["state"], "unknown");

    // One note and one ledger row although the call was sent twice (and once more with other
    // arguments); none for the refused call.
    assert_eq!(
        scalar_blocking(ledger.store(), "SELECT count(*) FROM notes"),
        1
    );
    assert_eq!(
        scalar_blocking(ledger.store(), "SELECT count(*) FROM operations"),
        1
    );
    assert_eq!(
        scalar_blocking(
            ledger.store(),
            "SELECT count(*) FROM operations WHERE idempotency_key = 'py-note-2'"
        ),
        0
    );
}

#[test]
fn python_sdk_drives_the_example_on_sqlite() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("notes.sqlite").display().to_string();
    // SQLite keeps its keys in a key file beside the database; pass the test's keys anyway so
    // the read-back handle below opens with the same ones.
    let env = json!({"TOOLLEDGER_STATE_KEY_HEX": STATE_KEY,
        "TOOLLEDGER_FINGERPRINT_KEY_HEX": FP_KEY, "TOOLLEDGER_PRINCIPAL": "alice"});
    let v = run_script(&py, &db, env);
    check(&v, &open_ledger(&db));
}

#[test]
fn python_sdk_drives_the_example_on_postgres() {
    let Some(py) = python() else { return };
    let Some(url) = toolledger_testkit::db::test_database_url() else {
        return;
    };
    // A schema of its own: created here, named in the URL the server gets, dropped at the end.
    let schema = toolledger_testkit::db::fresh_schema_name();
    let admin =
        PgStore::open_unchecked(&url, PgOptions::any_backend().in_schema(schema.clone())).unwrap();
    let create = format!("CREATE SCHEMA {schema}");
    toolledger::store::Store::from(admin.clone())
        .write_blocking(move |tx: &mut dyn EffectTx| tx.execute_batch(&create))
        .unwrap();
    let scoped =
        toolledger_testkit::db::with_param(&url, &format!("options=-c%20search_path%3D{schema}"));
    let env = json!({"TOOLLEDGER_STATE_KEY_HEX": STATE_KEY,
        "TOOLLEDGER_FINGERPRINT_KEY_HEX": FP_KEY, "TOOLLEDGER_PRINCIPAL": "alice"});
    let v = run_script(&py, &scoped, env);
    let ledger = open_ledger(&scoped);
    check(&v, &ledger);
    drop(ledger);
    admin.drop_schema_blocking().unwrap();
}
