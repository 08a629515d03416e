//! The call path an MCP server uses for `refund_order`: `toolledger approve --tool …` issues
//! the approval, `refunds::mcp_call` + `Runtime::dispatch` run the call, `answer_json` is the
//! tool result.

mod support;

use std::sync::Arc;

use serde_json::json;
use support::runtime::*;
use toolledger::clock::SystemClock;
use toolledger::runtime::Answer;
use toolledger_cli::common::open_store;
use toolledger_reference::refunds;

#[test]
fn approve_by_flags_then_dispatch_through_the_library() {
    let d = Db::new();
    for (name, role) in [("alice", None), ("bob", Some("approver"))] {
        let mut args = vec!["principal", "add", name, "--tenant", "acme", "--db", d.db()];
        if let Some(r) = role {
            args.extend_from_slice(&["--role", r]);
        }
        assert_eq!(run(&args).code, 0);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = open_store(&d.db, None, false).unwrap();
    rt.block_on(refunds::ensure_order(
        &store, "acme", "ord-7", "alice", 900, true,
    ))
    .unwrap();

    let approved = d.run(
        "approve",
        &[
            "--tool",
            "refund_order",
            "--requester",
            "alice",
            "--key",
            "op-7",
            "--arguments",
            r#"{"order_id":"ord-7","amount_cents":300}"#,
            "--approver",
            "bob",
        ],
    );
    assert_eq!(approved.code, 0, "{}", approved.stderr);
    let approval_id = approved.json()["approval_id"].as_str().unwrap().to_string();
    assert!(approval_id.starts_with("apr_"));

    let runtime = refunds::runtime(&store, &d.downstream(), Arc::new(SystemClock)).unwrap();
    let call = refunds::mcp_call(
        "alice",
        &json!({"idempotency_key": "op-7", "order_id": "ord-7", "amount_cents": 300,
                "approval": approval_id}),
    )
    .unwrap();
    let first = rt.block_on(runtime.dispatch(&call, None)).unwrap();
    let v = refunds::answer_json(&first);
    assert_eq!(v["code"], "OK");
    assert_eq!(v["delivery"], "fresh");
    assert_eq!(v["status"], "succeeded");
    assert_eq!(v["result"]["refund"], "completed");
    // The MCP retry (same key, no approval needed any more) replays.
    let retry = refunds::mcp_call(
        "alice",
        &json!({"idempotency_key": "op-7", "order_id": "ord-7", "amount_cents": 300}),
    )
    .unwrap();
    let second = rt.block_on(runtime.dispatch(&retry, None)).unwrap();
    assert!(matches!(second, Answer::Done { .. }));
    assert_eq!(refunds::answer_json(&second)["delivery"], "local_replay");
    assert_eq!(d.downstream_receipts(), 1);

    // An approval for other arguments does not fit this call.
    let other = d.run(
        "approve",
        &[
            "--tool",
            "refund_order",
            "--requester",
            "alice",
            "--key",
            "op-8",
            "--arguments",
            r#"{"order_id":"ord-7","amount_cents":1}"#,
            "--approver",
            "bob",
        ],
    );
    let other_id = other.json()["approval_id"].as_str().unwrap().to_string();
    let mismatched = refunds::mcp_call(
        "alice",
        &json!({"idempotency_key": "op-8", "order_id": "ord-7", "amount_cents": 2,
                "approval": other_id}),
    )
    .unwrap();
    let err = rt
        .block_on(runtime.dispatch(&mismatched, None))
        .unwrap_err();
    assert_eq!(err.code(), toolledger::ErrorCode::ApprovalInvalid);
    // Unknown tools take no approvals.
    let none = d.run(
        "approve",
        &[
            "--tool",
            "create_issue",
            "--requester",
            "alice",
            "--key",
            "k",
            "--arguments",
            "{}",
            "--approver",
            "bob",
        ],
    );
    assert_eq!(none.code, 1);
    assert_eq!(none.json()["code"], "INVALID_ARGUMENTS");
}
