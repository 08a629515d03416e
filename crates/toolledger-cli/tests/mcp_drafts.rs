//! Editorial drafts over the MCP wire: `create_draft` needs the role editor and an approval from
//! `toolledger approve`, consumed once in the draft's transaction; the operation id decides
//! redelivery (replay never returns the text), the slug decides the document.

#[macro_use]
mod support;

use serde_json::{json, Value};
use support::wire::*;

const NOW: i64 = 1_800_000_000;

on_both_backends!(
    approved_draft_is_written_once_and_a_replay_never_returns_the_text,
    same_operation_with_changed_text_conflicts_and_keeps_the_original,
    another_operation_for_the_same_slug_is_refused_and_overwrites_nothing,
    missing_unknown_expired_changed_or_used_approvals_are_refused_without_writes,
    only_editors_may_create_drafts_even_on_replay,
);

fn setup(db: &Db) {
    add_principal(db, "ed", "acme", &["approver"], &[], false);
    add_principal(db, "viewer", "acme", &["reader"], &[], false);
}

fn payload(slug: &str, text: &str) -> Value {
    json!({"slug": slug, "title": "New draft", "text": text, "kind": "article"})
}

/// `toolledger approve` by `ed` for alice's `operation` with `payload`, valid from NOW for
/// `ttl` seconds; returns the approval id.
fn approve_draft(db: &Db, operation: &str, payload: &Value, ttl: i64) -> String {
    let (ttl, now) = (ttl.to_string(), NOW.to_string());
    approve(
        db,
        "create_draft",
        operation,
        payload,
        &["--ttl", &ttl, "--now", &now],
    )
}

fn call_args(operation: &str, payload: &Value, approval: Option<&str>) -> Value {
    let mut a = payload.clone();
    a["operation"] = json!(operation);
    if let Some(id) = approval {
        a["approval"] = json!(id);
    }
    a
}

fn server(db: &Db, who: &str, at: i64) -> Server {
    Server::start(db, who, &["--clock-epoch", &at.to_string()])
}

fn approved_draft_is_written_once_and_a_replay_never_returns_the_text(db: Db) {
    setup(&db);
    let p = payload("new-draft", "secret body text");
    let id = approve_draft(&db, "draft-request-17", &p, 600);
    let mut s = server(&db, "alice", NOW + 10);
    let first = s.call("create_draft", call_args("draft-request-17", &p, Some(&id)));
    assert_eq!(
        first["structuredContent"],
        json!({"slug": "new-draft", "draft": true, "replayed": false})
    );
    let again = s.call("create_draft", call_args("draft-request-17", &p, Some(&id)));
    assert_eq!(
        again["structuredContent"],
        json!({"slug": "new-draft", "draft": true, "replayed": true})
    );
    assert!(!again.to_string().contains("secret body text"), "{again}");
    let st = s.status("draft-request-17");
    assert_eq!(st["state"], "applied");
    assert_eq!(st["matchingIds"], json!([1]));
    assert!(!st.to_string().contains("secret body text"));
    assert_eq!(s.finish(), 0);

    // After the approval expired, the exact retry still replays; nothing new is written.
    let mut s = server(&db, "alice", NOW + 10_000);
    let late = s.call("create_draft", call_args("draft-request-17", &p, Some(&id)));
    assert_eq!(late["structuredContent"]["replayed"], true);
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "drafts"), 1);
    assert_eq!(count(&db, "operations"), 1);
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM approvals WHERE consumed_at IS NOT NULL"
        ),
        1
    );
}

fn same_operation_with_changed_text_conflicts_and_keeps_the_original(db: Db) {
    setup(&db);
    let p = payload("d1", "first text");
    let id = approve_draft(&db, "op-a", &p, 600);
    let mut s = server(&db, "alice", NOW + 1);
    s.call("create_draft", call_args("op-a", &p, Some(&id)));
    let changed = s.call(
        "create_draft",
        call_args("op-a", &payload("d1", "second text"), Some(&id)),
    );
    assert_eq!(error_code(&changed), "operation_conflict");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "drafts"), 1);
    assert_eq!(
        db.pairs("SELECT slug, text FROM drafts"),
        [("d1".to_string(), "first text".to_string())]
    );
}

fn another_operation_for_the_same_slug_is_refused_and_overwrites_nothing(db: Db) {
    setup(&db);
    let p = payload("shared-slug", "text A");
    let a = approve_draft(&db, "op-a", &p, 600);
    let b = approve_draft(&db, "op-b", &p, 600);
    let mut s = server(&db, "alice", NOW + 1);
    s.call("create_draft", call_args("op-a", &p, Some(&a)));
    let dup = s.call("create_draft", call_args("op-b", &p, Some(&b)));
    assert_eq!(error_code(&dup), "business_state_changed");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "drafts"), 1);
    assert_eq!(count(&db, "operations"), 1);
    // The refused call rolled back, so its approval is still unused.
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM approvals WHERE consumed_at IS NULL"
        ),
        1
    );
}

fn missing_unknown_expired_changed_or_used_approvals_are_refused_without_writes(db: Db) {
    setup(&db);
    let p = payload("d2", "text");
    let good = approve_draft(&db, "op-1", &p, 600);
    let mut s = server(&db, "alice", NOW + 1);
    let none = s.call("create_draft", call_args("op-1", &p, None));
    assert_eq!(error_code(&none), "approval_required");
    let unknown = s.call(
        "create_draft",
        call_args("op-1", &p, Some("appr_unknown_0001")),
    );
    assert_eq!(error_code(&unknown), "approval_invalid");
    let changed = s.call(
        "create_draft",
        call_args("op-1", &payload("d2", "other text"), Some(&good)),
    );
    assert_eq!(error_code(&changed), "approval_invalid");
    let other_op = s.call("create_draft", call_args("op-2", &p, Some(&good)));
    assert_eq!(error_code(&other_op), "approval_invalid");
    assert_eq!(s.finish(), 0);
    let mut s = server(&db, "alice", NOW + 600);
    let expired = s.call("create_draft", call_args("op-1", &p, Some(&good)));
    assert_eq!(error_code(&expired), "approval_invalid");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "drafts"), 0);
    assert_eq!(count(&db, "operations"), 0);

    let mut s = server(&db, "alice", NOW + 1);
    let ok = s.call("create_draft", call_args("op-1", &p, Some(&good)));
    assert_eq!(ok["structuredContent"]["replayed"], false);
    let p3 = payload("d3", "text");
    let used = s.call("create_draft", call_args("op-3", &p3, Some(&good)));
    assert_eq!(error_code(&used), "approval_invalid");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "drafts"), 1);
}

fn only_editors_may_create_drafts_even_on_replay(db: Db) {
    setup(&db);
    let p = payload("d4", "text");
    let id = approve_draft(&db, "op-e", &p, 600);
    let mut s = server(&db, "viewer", NOW + 1);
    let r = s.call("create_draft", call_args("op-e", &p, Some(&id)));
    assert_eq!(error_code(&r), "permission_denied");
    assert_eq!(s.finish(), 0);
    let mut s = server(&db, "alice", NOW + 1);
    s.call("create_draft", call_args("op-e", &p, Some(&id)));
    assert_eq!(s.finish(), 0);
    add_principal(&db, "alice", "acme", &["reader"], &[], false);
    let mut s = server(&db, "alice", NOW + 2);
    let replay = s.call("create_draft", call_args("op-e", &p, Some(&id)));
    assert_eq!(error_code(&replay), "permission_denied");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "drafts"), 1);
}
