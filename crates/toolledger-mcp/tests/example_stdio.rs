//! `examples/guarded_tool.rs` as a process, configured from the environment as a user runs it
//! (`LedgerGuardBuilder::from_env`, `LedgerGuard::serve_stdio`): without a database it
//! refuses to start and creates nothing; without `TOOLLEDGER_PRINCIPAL` it acts for the
//! principal `local`, created on first use; a deactivated principal is refused before
//! anything is served.

#[allow(dead_code)]
#[path = "../examples/guarded_tool.rs"]
mod example;
mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;
use toolledger_mcp::LedgerGuard;

/// Runs the example with `env` (and nothing else of this process's `TOOLLEDGER_*`), sends
/// `lines` on its stdin, closes it and waits for the process to end.
fn run(env: &[(&str, &str)], lines: &[Value]) -> Output {
    let mut command = Command::new(support::guarded_tool_binary());
    for (name, _) in std::env::vars() {
        if name.starts_with("TOOLLEDGER_") {
            command.env_remove(name);
        }
    }
    let mut child = command
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for line in lines {
        // A server that refused to start has closed its end: nothing more to send.
        if writeln!(stdin, "{line}").is_err() {
            break;
        }
    }
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// A session of the initialize lifecycle that creates note `op` and asks for its status.
fn session(op: &str) -> Vec<Value> {
    vec![
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "example-stdio-test", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "create_note", "arguments": {"operation_id": op, "text": "hello"}}}),
    ]
}

/// The structured content of the answer to request `id`.
fn answer(out: &Output, id: i64) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let reply = stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("no answer to {id}: {stdout}"));
    reply["result"]["structuredContent"].clone()
}

fn ledger(db: &Path) -> LedgerGuard {
    LedgerGuard::builder()
        .database(db.to_str().unwrap())
        .migrations(&[example::NOTES])
        .open()
        .unwrap()
}

#[test]
fn without_a_database_the_example_refuses_to_start_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&[("HOME", dir.path().to_str().unwrap())], &session("n-1"));
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("TOOLLEDGER_DB"), "{stderr}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn without_a_principal_the_example_acts_for_the_local_one_created_on_first_use() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("notes.sqlite");
    let out = run(&[("TOOLLEDGER_DB", db.to_str().unwrap())], &session("n-1"));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        answer(&out, 2),
        json!({"operationId": "n-1", "effectId": 1, "replayed": false, "state": "applied"})
    );
    let ledger = ledger(&db);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let local = rt.block_on(ledger.principals().entry("local")).unwrap();
    let local = local.expect("the local principal was created");
    assert_eq!(local.tenant, "local");
    assert!(local.active && local.roles.is_empty() && local.scopes.is_empty());
    // A second process finds it and replays the note it wrote.
    let again = run(&[("TOOLLEDGER_DB", db.to_str().unwrap())], &session("n-1"));
    assert_eq!(answer(&again, 2)["replayed"], true);
    assert_eq!(
        toolledger_testkit::db::scalar_blocking(ledger.store(), "SELECT count(*) FROM notes"),
        1
    );
}

#[test]
fn a_deactivated_principal_is_refused_before_anything_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("notes.sqlite");
    let ledger = ledger(&db);
    let principals: &PrincipalStore = ledger.principals();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        principals
            .add("erin", "team", &[], &[], false)
            .await
            .unwrap();
        principals.revoke("erin", &[], &[], true).await.unwrap();
    });
    let env = [
        ("TOOLLEDGER_DB", db.to_str().unwrap()),
        ("TOOLLEDGER_PRINCIPAL", "erin"),
    ];
    let out = run(&env, &session("n-1"));
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("deactivated"), "{stderr}");
    assert!(!stderr.contains(dir.path().to_str().unwrap()), "{stderr}");
    // Still deactivated, and nothing was written.
    assert!(rt.block_on(principals.resolve("erin")).unwrap().is_none());
    assert_eq!(
        toolledger_testkit::db::scalar_blocking(ledger.store(), "SELECT count(*) FROM operations"),
        0
    );
}
