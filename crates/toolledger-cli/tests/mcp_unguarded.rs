//! The control: the same wire sequences against `serve --unguarded` (no ledger) produce the
//! duplicate effects the guard exists to prevent.

#[macro_use]
mod support;

use serde_json::{json, Value};
use support::wire::*;

const EPOCH: &str = "1800000000";

on_both_backends!(
    identical_retry_creates_a_second_issue,
    lost_reply_then_blind_replay_duplicates_and_status_knows_nothing,
    changed_input_and_second_tokens_are_accepted_as_new_effects,
    two_processes_sending_the_same_continuation_make_two_issues,
    the_control_offers_only_create_issue_and_status,
);

fn args(op: &str) -> Value {
    json!({"operation_id": op, "title": "spec"})
}

fn unguarded(db: &Db, extra: &[&str]) -> Server {
    Server::start(
        db,
        "alice",
        &[&["--unguarded", "--clock-epoch", EPOCH][..], extra].concat(),
    )
}

fn identical_retry_creates_a_second_issue(db: Db) {
    let mut s = unguarded(&db, &[]);
    let token = request_state(&s.call("create_issue", args("u-1")));
    let a = s.resume("create_issue", args("u-1"), &token, body("alpha"));
    let b = s.resume("create_issue", args("u-1"), &token, body("alpha"));
    assert_eq!(a["structuredContent"]["effectId"], 1);
    assert_eq!(b["structuredContent"]["effectId"], 2);
    assert_eq!(b["structuredContent"]["replayed"], false);
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 2);
    assert_eq!(count(&db, "operations"), 0);
}

fn lost_reply_then_blind_replay_duplicates_and_status_knows_nothing(db: Db) {
    let mut s = unguarded(&db, &["--fault", "drop-after-commit"]);
    let token = request_state(&s.call("create_issue", args("u-3")));
    s.send(
        &json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "create_issue", "arguments": args("u-3"), "requestState": token,
        "inputResponses": body("alpha"), "_meta": meta()}}),
    );
    assert_eq!(s.try_recv(), None);
    assert_eq!(s.wait_exit(), 70);
    let mut s = unguarded(&db, &[]);
    let st = s.status("u-3");
    assert_eq!(st["state"], "unknown");
    assert_eq!(st["matchingIds"], json!([]));
    let replay = s.resume("create_issue", args("u-3"), &token, body("alpha"));
    assert_eq!(replay["structuredContent"]["result"], "created 2");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 2);
    assert_eq!(count(&db, "operations"), 0);
}

fn changed_input_and_second_tokens_are_accepted_as_new_effects(db: Db) {
    let mut s = unguarded(&db, &[]);
    let t1 = request_state(&s.call("create_issue", args("u-4")));
    let t2 = request_state(&s.call("create_issue", args("u-4")));
    s.resume("create_issue", args("u-4"), &t1, body("alpha"));
    let changed = s.resume("create_issue", args("u-4"), &t1, body("beta"));
    assert_eq!(changed["isError"], false);
    let second = s.resume("create_issue", args("u-4"), &t2, body("alpha"));
    assert_eq!(second["isError"], false);
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 3);
    assert_eq!(count(&db, "operations"), 0);
}

fn two_processes_sending_the_same_continuation_make_two_issues(db: Db) {
    let mut s = unguarded(&db, &[]);
    let token = request_state(&s.call("create_issue", args("u-8")));
    assert_eq!(s.finish(), 0);
    let mut a = unguarded(&db, &[]);
    let mut b = unguarded(&db, &[]);
    assert_eq!(a.status("u-8")["state"], "unknown");
    assert_eq!(b.status("u-8")["state"], "unknown");
    let line = json!({"jsonrpc": "2.0", "id": 50, "method": "tools/call", "params": {
        "name": "create_issue", "arguments": args("u-8"), "requestState": token,
        "inputResponses": body("alpha"), "_meta": meta()}})
    .to_string();
    a.send_line(&line);
    b.send_line(&line);
    let ra = a.recv();
    let rb = b.recv();
    assert_eq!(ra["result"]["structuredContent"]["replayed"], false);
    assert_eq!(rb["result"]["structuredContent"]["replayed"], false);
    assert_ne!(
        ra["result"]["structuredContent"]["effectId"],
        rb["result"]["structuredContent"]["effectId"]
    );
    assert_eq!(a.finish(), 0);
    assert_eq!(b.finish(), 0);
    assert_eq!(count(&db, "issues"), 2);
}

#[test]
fn the_demo_reads_back_one_guarded_issue_and_two_unguarded() {
    let out = std::process::Command::new(bin())
        .args(["demo", "lost-reply"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["operation_id"], "new-issue-1");
    let g = &v["guarded"];
    assert_eq!(g["asked_for_body"], true);
    assert_eq!(g["reply_lost"], true);
    assert_eq!(
        g["status"],
        json!({"state": "applied", "authoritative": true, "stored_result": "created 1",
               "issue_ids": [1], "new_write_allowed": false})
    );
    assert_eq!(
        g["replay"],
        json!({"replayed": true, "issue_id": 1, "result": "created 1"})
    );
    assert_eq!(g["rows"], json!({"issues": 1, "operations": 1}));
    let u = &v["unguarded"];
    assert_eq!(u["status"]["state"], "unknown");
    assert_eq!(
        u["retry"],
        json!({"replayed": false, "issue_id": 2, "result": "created 2"}),
        "without the ledger the second call is a retry that creates a second issue"
    );
    assert!(u.get("replay").is_none());
    assert_eq!(u["rows"], json!({"issues": 2, "operations": 0}));
    assert_eq!(v["ok"], true);
}

fn the_control_offers_only_create_issue_and_status(db: Db) {
    let mut s = unguarded(&db, &[]);
    s.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                   "params": {"_meta": meta()}}));
    let list = s.recv();
    let mut names: Vec<String> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["create_issue", "get_operation_status"]);
    assert_eq!(s.finish(), 0);
}
