//! `toolledger call` for every reference tool, through the built binary: the multi-round
//! `create_issue` (both rounds, then an exact replay), `get_operation_status`, the approval
//! tools' refusals, the automation tools, and an unknown tool.

mod support;

use serde_json::{json, Value};
use support::runtime::*;

fn call(d: &Db, tool: &str, args: &Value, extra: &[&str]) -> Run {
    let args = args.to_string();
    let mut all = vec![
        "call",
        tool,
        "--principal",
        "alice",
        "--args",
        &args,
        "--db",
        d.db(),
    ];
    all.extend_from_slice(extra);
    run(&all)
}

fn alice(d: &Db) {
    let r = run(&[
        "principal",
        "add",
        "alice",
        "--tenant",
        "team-a",
        "--role",
        "editor",
        "--scope",
        "automation:write",
        "--db",
        d.db(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
}

#[test]
fn create_issue_takes_two_rounds_and_replays_and_status_reads_it_back() {
    let d = Db::new();
    alice(&d);
    let args = json!({"operation_id": "issue-1", "title": "spec"});
    let first = call(&d, "create_issue", &args, &[]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let round = first.json();
    assert_eq!(round["resultType"], "input_required");
    assert!(round["inputRequests"]["body"].is_object(), "{round}");
    let state = round["requestState"].as_str().unwrap().to_string();
    assert_eq!(d.int("SELECT count(*) FROM issues"), 0);

    let body = r#"{"body":{"action":"accept","content":{"body":"alpha"}}}"#;
    let second = call(
        &d,
        "create_issue",
        &args,
        &["--request-state", &state, "--input-responses", body],
    );
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert_eq!(
        second.json(),
        json!({"operationId": "issue-1", "effectId": 1, "result": "created 1",
               "replayed": false, "state": "applied"})
    );
    let replay = call(
        &d,
        "create_issue",
        &args,
        &["--request-state", &state, "--input-responses", body],
    );
    assert_eq!(replay.code, 0);
    assert_eq!(replay.json()["replayed"], true);
    assert_eq!(d.int("SELECT count(*) FROM issues"), 1);
    assert_eq!(d.int("SELECT count(*) FROM operations"), 1);

    let status = call(
        &d,
        "get_operation_status",
        &json!({"operation_id": "issue-1"}),
        &[],
    );
    assert_eq!(status.code, 0, "{}", status.stderr);
    let s = status.json();
    assert_eq!(s["state"], "applied");
    assert_eq!(s["tool"], "create_issue");
    assert_eq!(s["storedResult"], "created 1");
}

#[test]
fn the_approval_tools_refuse_in_band_without_an_approval() {
    let d = Db::new();
    alice(&d);
    let draft = call(
        &d,
        "create_draft",
        &json!({"operation": "draft-1", "slug": "launch", "title": "Launch", "text": "soon",
                "kind": "note"}),
        &[],
    );
    assert_eq!(draft.code, 1, "{} {}", draft.stdout, draft.stderr);
    assert_eq!(
        draft.json()["error"]["code"],
        "approval_required",
        "{}",
        draft.stdout
    );
    assert_eq!(d.int("SELECT count(*) FROM drafts"), 0);
    let refund = call(
        &d,
        "refund_order",
        &json!({"idempotency_key": "r-1", "order_id": "ord-9", "amount_cents": 5}),
        &[],
    );
    assert_eq!(refund.code, 1, "{} {}", refund.stdout, refund.stderr);
    // alice owns no order ord-9: the same answer as for an order that does not exist.
    assert_eq!(
        refund.json()["error"]["code"],
        "not_found",
        "{}",
        refund.stdout
    );
    assert_eq!(d.int("SELECT count(*) FROM outbox"), 0);
}

#[test]
fn the_automation_tools_still_run_on_the_engine() {
    let d = Db::new();
    alice(&d);
    let created = call(
        &d,
        "create_automation",
        &json!({"request_id": "create-1", "interval_minutes": 15}),
        &[],
    );
    assert_eq!(created.code, 0, "{}", created.stderr);
    assert_eq!(created.json()["interval_minutes"], 15);
}

#[test]
fn an_unknown_tool_names_the_tools_call_knows() {
    let d = Db::new();
    alice(&d);
    let r = call(&d, "delete_everything", &json!({}), &[]);
    assert_eq!(r.code, 1);
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    for tool in [
        "create_issue",
        "get_operation_status",
        "create_automation",
        "set_interval",
        "create_draft",
        "refund_order",
    ] {
        assert!(message.contains(tool), "{message}");
    }
}
