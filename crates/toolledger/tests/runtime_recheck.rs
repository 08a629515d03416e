//! Before any downstream effect the worker rechecks contract, principal, business state and
//! the approval from durable identities; every drift fails closed.

mod runtime_support;

use runtime_support::*;
use toolledger::outbox::ClaimOutcome;
use toolledger::runtime::{Accepted, Processed, Runtime, RuntimeError};
use toolledger::ErrorCode;

/// Accepts one intent by carol (support_admin) for erin's order and returns its event id.
async fn accepted(h: &Fixture<'_>) -> i64 {
    let call = h.call("carol", "refund-1", "ord-2", 700);
    h.approve(&call, "bob").await.unwrap();
    match h.runtime.accept(&call).await.unwrap() {
        Accepted::New { event_id, .. } => event_id,
        other => panic!("{other:?}"),
    }
}

/// Processes the event with `rt` and asserts it failed closed with `expected`: no downstream
/// call, no receipt anywhere, the lease held, the refusal recorded.
async fn assert_fails_closed(h: &Fixture<'_>, rt: &Runtime, event: i64, expected: ErrorCode) {
    let err = rt.process(event, "worker", None).await.unwrap_err();
    match &err {
        RuntimeError::Refused(e) => assert_eq!(e.code, expected, "{e:?}"),
        other => panic!("expected {expected:?}, got {other:?}"),
    }
    assert_eq!(h.downstream.submits(), 0, "no downstream call");
    assert_eq!(h.downstream_receipts(), 0);
    assert_eq!(h.count("local_receipts").await, 0);
    assert_eq!(
        h.scalar_text("SELECT state || ':' || last_error FROM outbox")
            .await
            .unwrap(),
        format!("processing:{}", expected.as_str())
    );
    assert_eq!(
        h.scalar_text("SELECT state FROM operations").await.unwrap(),
        "processing"
    );
    assert_eq!(
        h.scalar_int("SELECT count(*) FROM operation_events WHERE kind = 'attempt_refused'")
            .await,
        Some(1)
    );
}

/// After the cause is repaired and the lease has expired, the same event is delivered.
async fn recovers(h: &Fixture<'_>, rt: &Runtime, event: i64) {
    h.clock.set(T0 + 31);
    let done = rt.process(event, "worker-2", None).await.unwrap();
    assert!(matches!(done, Processed::Delivered(_)), "{done:?}");
    assert_eq!(h.downstream_receipts(), 1);
}

async fn contract_drift_fails_closed(db: &Harness) {
    let h = Fixture::new(db).await;
    let event = accepted(&h).await;
    let drifted = h.second_runtime("v2");
    assert_fails_closed(&h, &drifted, event, ErrorCode::ContractDrift).await;
    recovers(&h, &h.runtime, event).await;
}
both_drivers!(contract_drift_fails_closed);

async fn a_revoked_role_fails_closed_and_recovers_when_restored(db: &Harness) {
    let h = Fixture::new(db).await;
    let event = accepted(&h).await;
    h.principals
        .revoke("carol", &["support_admin".to_string()], &[], false)
        .await
        .unwrap();
    assert_fails_closed(&h, &h.runtime, event, ErrorCode::NotFound).await;
    h.principals
        .add("carol", "acme", &["support_admin".to_string()], &[], false)
        .await
        .unwrap();
    recovers(&h, &h.runtime, event).await;
}
both_drivers!(a_revoked_role_fails_closed_and_recovers_when_restored);

async fn a_deactivated_principal_fails_closed(db: &Harness) {
    let h = Fixture::new(db).await;
    let event = accepted(&h).await;
    h.principals.revoke("carol", &[], &[], true).await.unwrap();
    assert_fails_closed(&h, &h.runtime, event, ErrorCode::PermissionDenied).await;
}
both_drivers!(a_deactivated_principal_fails_closed);

async fn an_order_that_is_no_longer_refundable_fails_closed(db: &Harness) {
    let h = Fixture::new(db).await;
    let event = accepted(&h).await;
    h.sql("UPDATE test_orders SET refundable = 0 WHERE id = 'ord-2';")
        .await;
    assert_fails_closed(&h, &h.runtime, event, ErrorCode::BusinessStateChanged).await;
    h.sql("UPDATE test_orders SET refundable = 1 WHERE id = 'ord-2';")
        .await;
    recovers(&h, &h.runtime, event).await;
}
both_drivers!(an_order_that_is_no_longer_refundable_fails_closed);

async fn tampered_persisted_fields_fail_closed(db: &Harness) {
    let cases: &[(&str, ErrorCode)] = &[
        // Provider identity substituted in the intent row.
        (
            "UPDATE deferred_intents SET adapter_revision = '2026-07-28', provider = 'mcp',
                 api_family = 'tools/call'",
            ErrorCode::ApprovalInvalid,
        ),
        (
            "UPDATE deferred_intents SET call_id = 'call-other'",
            ErrorCode::ApprovalInvalid,
        ),
        (
            "UPDATE deferred_intents SET approval_digest =
                 CASE WHEN substr(approval_digest, 1, 1) = 'f' THEN 'e' ELSE 'f' END
                 || substr(approval_digest, 2)",
            ErrorCode::ApprovalInvalid,
        ),
        (
            "UPDATE deferred_intents SET approver = 'carol'",
            ErrorCode::ApprovalInvalid,
        ),
        (
            "UPDATE deferred_intents SET approval_expires_at = approval_expires_at + 1",
            ErrorCode::ApprovalInvalid,
        ),
        // The approval row rebound to another digest (consistent with itself).
        (
            "UPDATE approvals SET binding_digest = (SELECT request_digest FROM operations)",
            ErrorCode::ApprovalInvalid,
        ),
        // A well-formed, canonical argument substitution.
        (
            "UPDATE operations SET arguments = '{\"amount_cents\":9,\"order_id\":\"ord-2\"}'",
            ErrorCode::ContractDrift,
        ),
        (
            "UPDATE operations SET policy_rev = 'v0'",
            ErrorCode::ContractDrift,
        ),
        (
            "UPDATE operations SET request_digest = (SELECT binding_digest FROM approvals)",
            ErrorCode::ContractDrift,
        ),
    ];
    for (sql, expected) in cases {
        let fresh = another(db);
        let h = Fixture::new(&fresh).await;
        let event = accepted(&h).await;
        h.sql(sql).await;
        let err = h.runtime.process(event, "worker", None).await.unwrap_err();
        match &err {
            RuntimeError::Refused(e) => assert_eq!(e.code, *expected, "{sql}"),
            other => panic!("{sql}: {other:?}"),
        }
        assert_eq!(h.downstream.submits(), 0, "{sql}");
        assert_eq!(h.downstream_receipts(), 0, "{sql}");
        assert_eq!(h.count("local_receipts").await, 0, "{sql}");
    }
}
both_drivers!(tampered_persisted_fields_fail_closed);

async fn a_missing_intent_approval_is_refused_for_a_tool_that_requires_one(db: &Harness) {
    let h = Fixture::new(db).await;
    let event = accepted(&h).await;
    h.sql(
        "UPDATE deferred_intents SET approval_id = NULL, approver = NULL, approval_digest = NULL,
             approved_at = NULL, approval_expires_at = NULL",
    )
    .await;
    assert_fails_closed(&h, &h.runtime, event, ErrorCode::ApprovalRequired).await;
}
both_drivers!(a_missing_intent_approval_is_refused_for_a_tool_that_requires_one);

async fn a_non_canonical_stored_argument_is_a_storage_contract_error_before_any_effect(
    db: &Harness,
) {
    let h = Fixture::new(db).await;
    let event = accepted(&h).await;
    h.sql("UPDATE operations SET arguments = '{ \"amount_cents\":700,\"order_id\":\"ord-2\"}'")
        .await;
    let err = h.runtime.process(event, "worker", None).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Store(_)), "{err:?}");
    assert_eq!(h.downstream.submits(), 0);
    assert_eq!(
        h.scalar_text("SELECT last_error FROM outbox")
            .await
            .unwrap(),
        "storage_contract"
    );
    // Still held by the lease: not claimable until it expires.
    assert!(matches!(
        h.runtime.claim(event, "other").await.unwrap(),
        ClaimOutcome::Leased { .. }
    ));
}
both_drivers!(a_non_canonical_stored_argument_is_a_storage_contract_error_before_any_effect);
