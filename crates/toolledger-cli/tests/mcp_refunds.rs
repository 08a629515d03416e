//! `refund_order` over the MCP wire: approval from `toolledger approve`, delivery
//! through the outbox to the payments stand-in, replay by idempotency key, owner-only access.

#[macro_use]
mod support;

use serde_json::json;
use support::wire::*;
use toolledger_testkit::reference::add_order;

on_both_backends!(
    an_approved_refund_is_delivered_once_and_replayed_by_key,
    refunds_need_an_approval_and_the_owner,
    the_payments_stand_in_keeps_its_receipts_where_downstream_db_says,
);

fn an_approved_refund_is_delivered_once_and_replayed_by_key(db: Db) {
    add_principal(&db, "ed", "acme", &["approver"], &[], false);
    add_order(&db.store(), "acme", "o-1", "alice", 5000);
    let business = json!({"order_id": "o-1", "amount_cents": 1200});
    let approval = approve(&db, "refund_order", "refund-1", &business, &[]);
    let args = json!({"idempotency_key": "refund-1", "order_id": "o-1", "amount_cents": 1200,
                      "approval": approval});
    let mut s = Server::start(&db, "alice", &[]);
    let first = s.call("refund_order", args.clone());
    assert_eq!(first["isError"], false, "{first}");
    let f = &first["structuredContent"];
    assert_eq!(f["code"], "OK");
    assert_eq!(f["status"], "succeeded");
    assert_eq!(f["delivery"], "fresh");
    assert_eq!(f["result"]["refund"], "completed");
    let again = s.call("refund_order", args);
    let a = &again["structuredContent"];
    assert_eq!(a["delivery"], "local_replay");
    assert_eq!(a["status_ref"], f["status_ref"]);
    assert_eq!(a["result"], f["result"]);

    // The status tool answers for the deferred tool too: the receipt was reconciled.
    let st = s.status("refund-1");
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(st["ledgerState"], "succeeded", "{st}");
    assert_eq!(st["authoritative"], true);
    assert_eq!(st["tool"], "refund_order");
    assert_eq!(st["ledgerState"], "succeeded");
    assert_eq!(st["statusRef"], f["status_ref"]);
    let elsewhere = s.call(
        "get_operation_status",
        json!({"operation_id": "refund-1", "tool": "create_issue"}),
    );
    assert_eq!(elsewhere["structuredContent"]["state"], "unknown");
    let foreign = s.call(
        "get_operation_status",
        json!({"operation_id": "refund-1", "tool": "no_such_tool"}),
    );
    assert_eq!(error_code(&foreign), "invalid_arguments");

    let changed = s.call(
        "refund_order",
        json!({"idempotency_key": "refund-1", "order_id": "o-1", "amount_cents": 1300,
               "approval": approval}),
    );
    assert_eq!(error_code(&changed), "operation_conflict");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "operations"), 1);
}

fn refunds_need_an_approval_and_the_owner(db: Db) {
    add_principal(&db, "ed", "acme", &["approver"], &[], false);
    add_order(&db.store(), "acme", "o-2", "alice", 5000);
    let mut s = Server::start(&db, "alice", &[]);
    let none = s.call(
        "refund_order",
        json!({"idempotency_key": "r-2", "order_id": "o-2", "amount_cents": 100}),
    );
    assert_eq!(error_code(&none), "approval_required");
    assert_eq!(s.finish(), 0);
    let mut s = Server::start(&db, "bob", &[]);
    let other = s.call(
        "refund_order",
        json!({"idempotency_key": "r-3", "order_id": "o-2", "amount_cents": 100,
               "approval": "appr_whatever_1"}),
    );
    assert_eq!(error_code(&other), "not_found");
    let bad = s.call(
        "refund_order",
        json!({"idempotency_key": "r-4", "order_id": "o-2", "amount_cents": 0}),
    );
    assert_eq!(error_code(&bad), "invalid_arguments");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "operations"), 0);
}

/// `serve --downstream-db FILE` puts the payments stand-in's receipts in FILE, not beside
/// `--db` (with `--database-url` that default would be a file in the working directory).
fn the_payments_stand_in_keeps_its_receipts_where_downstream_db_says(db: Db) {
    add_principal(&db, "ed", "acme", &["approver"], &[], false);
    add_order(&db.store(), "acme", "o-9", "alice", 5000);
    let business = json!({"order_id": "o-9", "amount_cents": 700});
    let approval = approve(&db, "refund_order", "refund-9", &business, &[]);
    let elsewhere = tempfile::tempdir().unwrap();
    let payments = elsewhere.path().join("payments.sqlite");
    let payments_arg = payments.display().to_string();
    let mut s = Server::start(&db, "alice", &["--downstream-db", &payments_arg]);
    let out = s.call(
        "refund_order",
        json!({"idempotency_key": "refund-9", "order_id": "o-9", "amount_cents": 700,
               "approval": approval}),
    );
    assert_eq!(out["structuredContent"]["status"], "succeeded", "{out}");
    assert_eq!(s.finish(), 0);

    let receipts = toolledger_testkit::db::sqlite_count(&payments, "downstream_receipts");
    assert_eq!(receipts, 1, "the delivery's receipt is in the named file");
    let args = db.store_args();
    let ledger = args
        .iter()
        .position(|a| a == "--db")
        .map(|i| args[i + 1].clone())
        .expect("a --db argument");
    let default = format!("{ledger}.downstream.sqlite");
    assert!(
        !std::path::Path::new(&default).exists(),
        "nothing was written at the default place {default}"
    );
}
