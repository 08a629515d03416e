//! `toolledger demo lost-reply`: seed 003's story against the real server binary.
//!
//! On a fresh temporary SQLite file: the first round of `create_issue` returns
//! `input_required`; the continuation commits issue #1 and the server exits before replying
//! (`--fault drop-after-commit`, exit 70), so the client knows nothing; after a restart,
//! `get_operation_status` reads the stored result back and an exact replay returns it without
//! creating issue #2. The same story against `--unguarded` (no ledger) shows the duplicate the
//! guard prevents. Passes only when the database read-back matches.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;

use crate::cmd_demo::DemoReport;
use crate::common;

const BACKEND: &str = "sqlite:guarded-matrix";
const OPERATION: &str = "case-03";

struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: i64,
}

fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "toolledger-demo", "version": "1.0.0"},
    })
}

impl Session {
    fn start(exe: &Path, db: &Path, extra: &[&str]) -> Result<Session, &'static str> {
        let mut child = Command::new(exe)
            .arg("serve")
            .arg("--db")
            .arg(db)
            .args(["--backend-id", BACKEND, "--principal", "alice"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|_| "DEMO_SPAWN_ERROR")?;
        let stdout = child.stdout.take().ok_or("DEMO_SPAWN_ERROR")?;
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Session {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            next_id: 1,
        })
    }

    /// Sends one `tools/call`; `Ok(None)` when the server closed without replying.
    fn call(&mut self, params: Value) -> Result<Option<Value>, &'static str> {
        let id = self.next_id;
        self.next_id += 1;
        let mut params = params;
        params["_meta"] = meta();
        let line = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
        let stdin = self.stdin.as_mut().ok_or("DEMO_IO_ERROR")?;
        writeln!(stdin, "{line}").map_err(|_| "DEMO_IO_ERROR")?;
        stdin.flush().map_err(|_| "DEMO_IO_ERROR")?;
        match self.lines.recv_timeout(Duration::from_secs(60)) {
            Ok(reply) => {
                let v: Value = serde_json::from_str(&reply).map_err(|_| "DEMO_PROTOCOL_ERROR")?;
                Ok(Some(v["result"].clone()))
            }
            Err(_) => Ok(None),
        }
    }

    fn exit_code(mut self) -> Result<i32, &'static str> {
        self.stdin.take();
        let status = self.child.wait().map_err(|_| "DEMO_IO_ERROR")?;
        Ok(status.code().unwrap_or(-1))
    }
}

fn count(db: &Path, table: &str) -> Result<i64, &'static str> {
    let conn = rusqlite::Connection::open(db).map_err(|_| "SQLITE_ERROR")?;
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .map_err(|_| "SQLITE_ERROR")
}

fn prepare(db: &Path) -> Result<(), &'static str> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|_| "RUNTIME_ERROR")?;
    runtime.block_on(async {
        let store =
            common::open_store(db, Some(BACKEND.to_string()), false).map_err(|e| e.cli_code())?;
        PrincipalStore::new(store)
            .add("alice", "demo", &["editor".to_string()], &[], false)
            .await
            .map_err(|_| "SQLITE_ERROR")?;
        Ok(())
    })
}

/// One run of the story; returns its summary.
fn story(exe: &Path, db: &Path, unguarded: bool) -> Result<Value, &'static str> {
    prepare(db)?;
    let mode: &[&str] = if unguarded { &["--unguarded"] } else { &[] };
    let arguments = json!({"operation_id": OPERATION, "title": "spec"});

    let mut s = Session::start(exe, db, mode)?;
    let first = s
        .call(json!({"name": "create_issue", "arguments": arguments}))?
        .ok_or("DEMO_PROTOCOL_ERROR")?;
    let input_required = first["resultType"] == "input_required";
    let token = first["requestState"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    s.exit_code()?;

    let continuation = json!({
        "name": "create_issue",
        "arguments": arguments,
        "requestState": token,
        "inputResponses": {"body": {"action": "accept", "content": {"body": "alpha"}}},
    });
    let crashing = [mode, &["--fault", "drop-after-commit"]].concat();
    let mut s = Session::start(exe, db, &crashing)?;
    let lost = s.call(continuation.clone())?;
    let crash_code = s.exit_code()?;
    let transport = if lost.is_none() {
        "unknown; no reply"
    } else {
        "reply received"
    };

    let mut s = Session::start(exe, db, mode)?;
    let status = s
        .call(json!({"name": "get_operation_status", "arguments": {"operation_id": OPERATION}}))?
        .ok_or("DEMO_PROTOCOL_ERROR")?;
    let replay = s.call(continuation)?.ok_or("DEMO_PROTOCOL_ERROR")?;
    s.exit_code()?;

    Ok(json!({
        "input_required": input_required,
        "operation_id": OPERATION,
        "transport_after_commit": transport,
        "server_exit_after_commit": crash_code,
        "status": status["structuredContent"],
        "replay": replay["structuredContent"],
        "physical_issue_rows": count(db, "issues")?,
        "physical_operation_rows": count(db, "operations")?,
    }))
}

/// Runs the demo with the current executable as the server.
pub fn run() -> Result<DemoReport, &'static str> {
    let exe: PathBuf = std::env::current_exe().map_err(|_| "DEMO_SPAWN_ERROR")?;
    let dir = tempfile::tempdir().map_err(|_| "DEMO_IO_ERROR")?;
    let guarded = story(&exe, &dir.path().join("guarded.sqlite"), false)?;
    let control = story(&exe, &dir.path().join("unguarded.sqlite"), true)?;

    let st = &guarded["status"];
    let rp = &guarded["replay"];
    let checks = json!({
        "first_round_input_required": guarded["input_required"] == true,
        "reply_lost_after_commit": guarded["transport_after_commit"] == "unknown; no reply"
            && guarded["server_exit_after_commit"] == 70,
        "status_applied_with_stored_result": st["state"] == "applied"
            && st["authoritative"] == true
            && st["freshWriteAuthorized"] == false
            && st["matchingIds"] == json!([1])
            && st["storedResult"] == "created 1",
        "replay_returns_stored_result": rp["replayed"] == true
            && rp["effectId"] == 1
            && rp["result"] == "created 1",
        "one_issue_one_operation": guarded["physical_issue_rows"] == 1
            && guarded["physical_operation_rows"] == 1,
        "unguarded_duplicates": control["physical_issue_rows"] == 2
            && control["physical_operation_rows"] == 0
            && control["status"]["state"] == "unknown"
            && control["replay"]["replayed"] == false
            && control["replay"]["effectId"] == 2,
    });
    let ok = checks
        .as_object()
        .is_some_and(|m| m.values().all(|v| v == &Value::Bool(true)));
    let mut summary = guarded;
    summary["unguarded"] = control;
    summary["checks"] = checks;
    summary["ok"] = json!(ok);
    Ok(DemoReport { ok, summary })
}
