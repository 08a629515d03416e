//! The MCP wire matrix's core cases against `toolledger serve --database-url` (PostgreSQL):
//! multi-round create_issue with replay, conflicts and token binding, deadlines, revocation,
//! crash faults, the watcher step and compensation, and seed 000's automation tools. The
//! SQLite runs of the same cases are in `mcp_stdio.rs` and `mcp_automations.rs`.
//! (`TOOLLEDGER_TEST_DATABASE_URL`; skipped with one loud line when unset, failing in CI.)

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde_json::{json, Value};
use toolledger::effect::{EffectTx, RowExt};
use toolledger::store::conformance::Harness;
use toolledger::store::Store;

const EPOCH: &str = "1800000000";
const STATE_KEY: &str = "77697265206d6174726978207374617465206b657920666f7220706f737467726573";
const FP_KEY: &str = "77697265206d61747269782066696e6765727072696e74206b657920666f72207067";

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_toolledger"))
}

struct Db {
    h: Harness,
    url: String,
    store: Store,
}

fn db() -> Option<Db> {
    let h = Harness::postgres()?;
    let store = h.open();
    let url = h.database_url().unwrap();
    let ok = |args: &[&str]| {
        let out = Command::new(bin())
            .args(args)
            .args(["--database-url", &url])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ok(&["migrate"]);
    for (name, tenant) in [("alice", "acme"), ("bob", "acme"), ("carol", "other")] {
        ok(&[
            "principal",
            "add",
            name,
            "--tenant",
            tenant,
            "--role",
            "editor",
            "--scope",
            "automation:write",
        ]);
    }
    Some(Db { h, url, store })
}

impl Db {
    fn scalar(&self, sql: &'static str) -> i64 {
        let store = self.store.clone();
        std::thread::spawn(move || {
            store
                .read_blocking(|tx: &mut dyn EffectTx| tx.query_opt(sql, &[])?.unwrap().int(0))
                .unwrap()
        })
        .join()
        .unwrap()
    }

    fn serve(&self, principal: &str, extra: &[&str]) -> Server {
        let _ = &self.h;
        Server::start(&self.url, principal, extra)
    }
}

struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next: i64,
}

impl Server {
    fn start(url: &str, principal: &str, extra: &[&str]) -> Server {
        let mut child = Command::new(bin())
            .args(["serve", "--principal", principal, "--database-url", url])
            .args(extra)
            .env("TOOLLEDGER_STATE_KEY_HEX", STATE_KEY)
            .env("TOOLLEDGER_FINGERPRINT_KEY_HEX", FP_KEY)
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
            next: 1,
        }
    }

    fn send(&mut self, params: Value) -> i64 {
        let id = self.next;
        self.next += 1;
        let mut params = params;
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
            "io.modelcontextprotocol/clientInfo": {"name": "pg-wire", "version": "1.0.0"},
        });
        let line = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        id
    }

    fn try_recv(&mut self) -> Option<Value> {
        let line = self.lines.recv_timeout(Duration::from_secs(60)).ok()?;
        Some(serde_json::from_str::<Value>(&line).unwrap()["result"].clone())
    }

    fn call(&mut self, name: &str, arguments: Value) -> Value {
        self.send(json!({"name": name, "arguments": arguments}));
        self.try_recv().expect("a reply")
    }

    fn resume(&mut self, name: &str, arguments: Value, state: &str, text: &str) -> Value {
        self.send(json!({
            "name": name, "arguments": arguments, "requestState": state,
            "inputResponses": {"body": {"action": "accept", "content": {"body": text}}},
        }));
        self.try_recv().expect("a reply")
    }

    fn status(&mut self, op: &str) -> Value {
        let r = self.call("get_operation_status", json!({"operation_id": op}));
        r["structuredContent"].clone()
    }

    fn finish(mut self) -> i32 {
        self.stdin.take();
        self.child.wait().unwrap().code().unwrap_or(-1)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn code(r: &Value) -> &str {
    assert_eq!(r["isError"], true, "{r}");
    r["structuredContent"]["error"]["code"].as_str().unwrap()
}

fn state_of(r: &Value) -> String {
    assert_eq!(r["resultType"], "input_required", "{r}");
    r["requestState"].as_str().unwrap().to_string()
}

fn args(op: &str) -> Value {
    json!({"operation_id": op, "title": "spec"})
}

#[test]
fn create_issue_replay_conflicts_and_token_binding() {
    let Some(db) = db() else { return };
    let mut s = db.serve("alice", &["--clock-epoch", EPOCH]);
    let token = state_of(&s.call("create_issue", args("case-1")));
    assert_eq!(
        db.scalar("SELECT count(*) FROM operations"),
        0,
        "round one writes nothing"
    );
    let done = s.resume("create_issue", args("case-1"), &token, "alpha");
    assert_eq!(
        done["structuredContent"],
        json!({"operationId": "case-1", "effectId": 1, "result": "created 1",
               "replayed": false, "state": "applied"})
    );
    let again = s.resume("create_issue", args("case-1"), &token, "alpha");
    assert_eq!(again["structuredContent"]["replayed"], true);
    assert_eq!(again["structuredContent"]["effectId"], 1);
    let changed = s.resume("create_issue", args("case-1"), &token, "beta");
    assert_eq!(code(&changed), "operation_conflict");
    let tampered = s.resume(
        "create_issue",
        args("case-1"),
        &format!("{token}x"),
        "alpha",
    );
    assert_eq!(code(&tampered), "request_state_invalid");
    let st = s.status("case-1");
    assert_eq!(st["state"], "applied");
    assert_eq!(st["matchingIds"], json!([1]));
    assert_eq!(st["freshWriteAuthorized"], false);
    assert_eq!(s.finish(), 0);

    let mut b = db.serve("bob", &["--clock-epoch", EPOCH]);
    let stolen = b.resume("create_issue", args("case-1"), &token, "alpha");
    assert_eq!(code(&stolen), "request_state_invalid");
    let bobs = state_of(&b.call("create_issue", args("case-1")));
    let taken = b.resume("create_issue", args("case-1"), &bobs, "alpha");
    assert_eq!(code(&taken), "operation_conflict");
    assert_eq!(b.finish(), 0);
    assert_eq!(db.scalar("SELECT count(*) FROM issues"), 1);
}

#[test]
fn deadlines_revocation_and_crash_faults() {
    let Some(db) = db() else { return };
    let mut s = db.serve("alice", &["--clock-epoch", EPOCH, "--authority-ttl", "60"]);
    let token = state_of(&s.call("create_issue", args("case-d")));
    s.resume("create_issue", args("case-d"), &token, "alpha");
    assert_eq!(s.finish(), 0);
    let mut late = db.serve(
        "alice",
        &[
            "--clock-epoch",
            "1800000060",
            "--authority-ttl",
            "60",
            "--request-state-ttl",
            "86400",
        ],
    );
    let replay = late.resume("create_issue", args("case-d"), &token, "alpha");
    assert_eq!(code(&replay), "operation_authority_expired");
    assert_eq!(
        late.status("case-d")["state"],
        "applied",
        "status still reads"
    );
    assert_eq!(late.finish(), 0);

    // A crash after the effect row, before COMMIT, leaves nothing.
    let mut s = db.serve(
        "alice",
        &[
            "--clock-epoch",
            EPOCH,
            "--fault",
            "exit-after-effect-insert",
        ],
    );
    let token = state_of(&s.call("create_issue", args("case-72")));
    s.send(
        json!({"name": "create_issue", "arguments": args("case-72"), "requestState": token,
                  "inputResponses": {"body": {"action": "accept", "content": {"body": "x"}}}}),
    );
    assert_eq!(s.try_recv(), None);
    assert_eq!(s.child.wait().unwrap().code(), Some(72));
    assert_eq!(db.scalar("SELECT count(*) FROM issues"), 1);
    assert_eq!(db.scalar("SELECT count(*) FROM operations"), 1);

    // A crash after a multi-step operation's first commit leaves it in progress.
    let a = json!({"operation_id": "case-73", "title": "spec", "watcher": "bob"});
    let mut s = db.serve(
        "alice",
        &[
            "--clock-epoch",
            EPOCH,
            "--fault",
            "exit-after-partial-first-commit",
        ],
    );
    let token = state_of(&s.call("create_issue", a.clone()));
    s.send(
        json!({"name": "create_issue", "arguments": a, "requestState": token,
                  "inputResponses": {"body": {"action": "accept", "content": {"body": "x"}}}}),
    );
    assert_eq!(s.try_recv(), None);
    assert_eq!(s.child.wait().unwrap().code(), Some(73));
    let mut s = db.serve("alice", &["--clock-epoch", EPOCH]);
    let replay = s.resume("create_issue", a, &token, "x");
    assert_eq!(code(&replay), "operation_in_progress");
    assert_eq!(s.status("case-73")["state"], "unknown");
    assert_eq!(s.finish(), 0);

    // Revocation: replay and status are refused.
    let out = Command::new(bin())
        .args([
            "principal",
            "revoke",
            "alice",
            "--all",
            "--database-url",
            &db.url,
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let mut s = db.serve("alice", &["--clock-epoch", EPOCH]);
    let st = s.call("get_operation_status", json!({"operation_id": "case-d"}));
    assert_eq!(code(&st), "permission_denied");
    assert_eq!(s.finish(), 0);
}

#[test]
fn watcher_failure_with_compensation_ends_partial() {
    let Some(db) = db() else { return };
    let mut s = db.serve(
        "alice",
        &["--clock-epoch", EPOCH, "--fault", "watcher-failure"],
    );
    let a = json!({"operation_id": "case-w", "title": "spec", "watcher": "bob"});
    let token = state_of(&s.call("create_issue", a.clone()));
    let done = s.resume("create_issue", a.clone(), &token, "alpha");
    assert_eq!(done["structuredContent"]["state"], "partial", "{done}");
    let replay = s.resume("create_issue", a, &token, "alpha");
    assert_eq!(replay["structuredContent"]["replayed"], true);
    assert_eq!(s.finish(), 0);
    assert_eq!(db.scalar("SELECT count(*) FROM issue_watchers"), 0);
    assert_eq!(db.scalar("SELECT count(*) FROM compensations"), 1);
    assert_eq!(
        db.scalar("SELECT count(*) FROM operation_events WHERE kind IN ('first_step', 'watcher_failed', 'compensation_applied')"),
        3
    );
}

#[test]
fn automations_replay_and_refuse_stale_versions() {
    let Some(db) = db() else { return };
    let mut s = db.serve("alice", &["--clock-epoch", EPOCH]);
    let created = s.call(
        "create_automation",
        json!({"request_id": "req-c1", "interval_minutes": 30}),
    );
    assert_eq!(created["isError"], false, "{created}");
    let id = created["structuredContent"]["id"].as_i64().unwrap();
    let set = json!({"request_id": "req-s1", "automation_id": id, "expected_version": 1,
                     "interval_minutes": 60});
    let first = s.call("set_interval", set.clone());
    assert_eq!(
        first["structuredContent"],
        json!({"id": id, "interval_minutes": 60, "version": 2, "replayed": false})
    );
    let again = s.call("set_interval", set);
    assert_eq!(again["structuredContent"]["replayed"], true);
    let stale = s.call(
        "set_interval",
        json!({"request_id": "req-s2", "automation_id": id, "expected_version": 1,
               "interval_minutes": 90}),
    );
    assert_eq!(code(&stale), "version_conflict");
    let reuse = s.call(
        "set_interval",
        json!({"request_id": "req-s1", "automation_id": id, "expected_version": 2,
               "interval_minutes": 90}),
    );
    assert_eq!(code(&reuse), "operation_conflict");
    assert_eq!(s.finish(), 0);
    let mut carol = db.serve("carol", &["--clock-epoch", EPOCH]);
    let foreign = carol.call(
        "set_interval",
        json!({"request_id": "req-x", "automation_id": id, "expected_version": 2,
               "interval_minutes": 90}),
    );
    assert_eq!(code(&foreign), "not_found");
    assert_eq!(carol.finish(), 0);
    assert_eq!(
        db.scalar("SELECT count(*) FROM automations WHERE version = 2 AND interval_minutes = 60"),
        1
    );
}

#[test]
fn approved_draft_is_written_once_and_its_approval_consumed_once() {
    let Some(db) = db() else { return };
    let out = Command::new(bin())
        .args([
            "principal",
            "add",
            "ed",
            "--tenant",
            "acme",
            "--role",
            "approver",
        ])
        .args(["--database-url", &db.url])
        .output()
        .unwrap();
    assert!(out.status.success());
    let payload = json!({"slug": "new-draft", "title": "New draft", "text": "secret body text",
                         "kind": "article"});
    let out = Command::new(bin())
        .args(["approve", "--approver", "ed", "--tool", "create_draft"])
        .args(["--requester", "alice", "--key", "draft-17"])
        .args(["--arguments", &payload.to_string()])
        .args(["--ttl", "600", "--now", EPOCH, "--database-url", &db.url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let approval: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut call = payload.clone();
    call["operation"] = json!("draft-17");
    call["approval"] = approval["approval_id"].clone();
    let mut s = db.serve("alice", &["--clock-epoch", "1800000010"]);
    let first = s.call("create_draft", call.clone());
    assert_eq!(
        first["structuredContent"],
        json!({"slug": "new-draft", "draft": true, "replayed": false})
    );
    let again = s.call("create_draft", call.clone());
    assert_eq!(again["structuredContent"]["replayed"], true);
    assert!(!again.to_string().contains("secret body text"));
    let mut other = call.clone();
    other["operation"] = json!("draft-18");
    assert_eq!(code(&s.call("create_draft", other)), "approval_invalid");
    assert_eq!(s.finish(), 0);
    assert_eq!(db.scalar("SELECT count(*) FROM drafts"), 1);
    assert_eq!(
        db.scalar("SELECT count(*) FROM approvals WHERE consumed_at IS NOT NULL"),
        1
    );
}
