//! Shared helpers for the MCP wire tests: spawn the built `toolledger serve`, speak raw
//! JSON-RPC lines over its stdio, and read the database back.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde_json::{json, Value};

/// The built binary.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_toolledger"))
}

/// Backend id every wire test binds its database to.
pub const BACKEND: &str = "sqlite:mcp-wire";

/// A fresh database with principals `alice` and `bob` (tenant `acme`, role editor, scope
/// automation:write) and `carol` in tenant `other`. Returns the temp dir and the db path.
pub fn fresh_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.sqlite");
    add_principal(
        &db,
        "alice",
        "acme",
        &["editor"],
        &["automation:write"],
        false,
    );
    add_principal(
        &db,
        "bob",
        "acme",
        &["editor"],
        &["automation:write"],
        false,
    );
    add_principal(
        &db,
        "carol",
        "other",
        &["editor"],
        &["automation:write"],
        false,
    );
    (dir, db)
}

/// Adds (or replaces) a principal; returns its bearer token when `token` is set.
pub fn add_principal(
    db: &Path,
    name: &str,
    tenant: &str,
    roles: &[&str],
    scopes: &[&str],
    token: bool,
) -> Option<String> {
    let (db, name, tenant) = (db.to_path_buf(), name.to_string(), tenant.to_string());
    let roles: Vec<String> = roles.iter().map(|s| s.to_string()).collect();
    let scopes: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
    // A thread of its own, so callers inside a tokio runtime can use it too.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let store =
                toolledger_cli::common::open_store(&db, Some(BACKEND.to_string()), false).unwrap();
            toolledger::authz::PrincipalStore::new(store)
                .add(&name, &tenant, &roles, &scopes, token)
                .await
                .unwrap()
        })
    })
    .join()
    .unwrap()
}

/// Counts rows of `table` (read on a fresh connection).
pub fn count(db: &Path, table: &str) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

/// Runs one query returning a single i64.
pub fn scalar(db: &Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// Operation events of the first ledger row, as (kind, detail JSON).
pub fn events(db: &Path) -> Vec<(String, Value)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare("SELECT kind, detail FROM operation_events ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            serde_json::from_str(&r.get::<_, String>(1)?).unwrap(),
        ))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// One running `toolledger serve` on stdio.
pub struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: i64,
}

/// Extra `serve` flags.
pub fn serve_args(db: &Path, principal: &str, extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        "serve".to_string(),
        "--db".into(),
        db.display().to_string(),
        "--backend-id".into(),
        BACKEND.into(),
        "--principal".into(),
        principal.into(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

impl Server {
    /// Starts the server as `principal` with `extra` flags.
    pub fn start(db: &Path, principal: &str, extra: &[&str]) -> Server {
        Server::start_with_env(db, principal, extra, &[])
    }

    /// Starts the server with key variables from `env` (others from the key file).
    pub fn start_with_env(
        db: &Path,
        principal: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Server {
        let mut command = Command::new(bin());
        command
            .args(serve_args(db, principal, extra))
            .env_remove("TOOLLEDGER_STATE_KEY_HEX")
            .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX");
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Server {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            next_id: 1,
        }
    }

    /// Writes one raw line.
    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    /// Sends `message` as one JSON line.
    pub fn send(&mut self, message: &Value) {
        self.send_line(&message.to_string());
    }

    /// The next line from the server, parsed (panics after 60 s without one).
    pub fn recv(&mut self) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(60))
            .expect("no reply from the server");
        serde_json::from_str(&line).unwrap()
    }

    /// The next line, or `None` if stdout closes first.
    pub fn try_recv(&mut self) -> Option<Value> {
        match self.lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => Some(serde_json::from_str(&line).unwrap()),
            Err(_) => None,
        }
    }

    fn id(&mut self) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Sends a 2026-07-28 `tools/call` (no initialize; per-request `_meta`) and returns the
    /// whole JSON-RPC response.
    pub fn call_raw(&mut self, params: Value) -> Value {
        let id = self.id();
        let mut params = params;
        params["_meta"] = meta();
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}));
        let reply = self.recv();
        assert_eq!(reply["id"], id, "reply to another request: {reply}");
        reply
    }

    /// `tools/call` returning the `result` object.
    pub fn call(&mut self, name: &str, arguments: Value) -> Value {
        let r = self.call_raw(json!({"name": name, "arguments": arguments}));
        r["result"].clone()
    }

    /// A continuation: same arguments plus `requestState` and `inputResponses`.
    pub fn resume(&mut self, name: &str, arguments: Value, state: &str, responses: Value) -> Value {
        let r = self.call_raw(json!({
            "name": name,
            "arguments": arguments,
            "requestState": state,
            "inputResponses": responses,
        }));
        r["result"].clone()
    }

    /// `get_operation_status` structured content.
    pub fn status(&mut self, operation_id: &str) -> Value {
        let r = self.call(
            "get_operation_status",
            json!({"operation_id": operation_id}),
        );
        assert_eq!(r["isError"], false, "{r}");
        r["structuredContent"].clone()
    }

    /// Closes stdin and waits for the exit code.
    pub fn finish(mut self) -> i32 {
        self.stdin.take();
        self.child.wait().unwrap().code().unwrap_or(-1)
    }

    /// Waits for the process to exit by itself (e.g. a fault) and returns its exit code.
    pub fn wait_exit(mut self) -> i32 {
        self.child.wait().unwrap().code().unwrap_or(-1)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Per-request metadata of MCP 2026-07-28.
pub fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "wire-test", "version": "1.0.0"},
    })
}

/// `inputResponses` answering the body request.
pub fn body(text: &str) -> Value {
    json!({"body": {"action": "accept", "content": {"body": text}}})
}

/// The `requestState` of an `input_required` result (asserting its shape).
pub fn request_state(result: &Value) -> String {
    assert_eq!(result["resultType"], "input_required", "{result}");
    result["requestState"].as_str().unwrap().to_string()
}

/// The error code of an in-band tool error.
pub fn error_code(result: &Value) -> String {
    assert_eq!(result["isError"], true, "{result}");
    result["structuredContent"]["error"]["code"]
        .as_str()
        .unwrap()
        .to_string()
}
