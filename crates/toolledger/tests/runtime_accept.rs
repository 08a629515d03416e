//! Transaction A (accept), replay, conflict and approvals of the deferred runtime.

mod runtime_support;

use runtime_support::*;
use serde_json::json;
use toolledger::approval::MAX_PORTABLE_TIMESTAMP;
use toolledger::runtime::{Accepted, Answer, CrashPoint, Delivery, RuntimeError};
use toolledger::{ErrorCode, OperationState};

async fn a_fresh_dispatch_succeeds_with_one_receipt_on_each_side(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    let answer = h.runtime.dispatch(&call, None).await.unwrap();
    let Answer::Done {
        state,
        delivery,
        result,
        status_ref,
    } = answer
    else {
        panic!("expected Done");
    };
    assert_eq!(state, OperationState::Succeeded);
    assert_eq!(delivery, Delivery::Fresh);
    assert_eq!(result["amount_cents"], json!(1250));
    assert!(status_ref.starts_with("op_"));
    assert_eq!(h.counts().await, (1, 1, 1, 1, 1));
    assert_eq!(
        h.scalar_text("SELECT state FROM outbox").await.unwrap(),
        "delivered"
    );
    assert_eq!(h.downstream_receipts(), 1);
    assert_eq!(h.downstream.submits(), 1);
}
both_drivers!(a_fresh_dispatch_succeeds_with_one_receipt_on_each_side);

async fn the_same_intent_replays_locally_across_handles_and_after_restart(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    let first = h.runtime.dispatch(&call, None).await.unwrap();

    // A retry (new provider call id, same provider path) on another connection.
    let mut retry = call.clone();
    retry.provider.call_id = "call-retry".into();
    let second = h.second_runtime("v1").dispatch(&retry, None).await.unwrap();
    let Answer::Done {
        delivery, result, ..
    } = &second
    else {
        panic!("expected a replay");
    };
    assert_eq!(*delivery, Delivery::LocalReplay);
    assert_eq!(second.status_ref(), first.status_ref());
    let Answer::Done { result: r1, .. } = &first else {
        unreachable!()
    };
    assert_eq!(result, r1);

    // After a restart: a brand-new store handle and runtime on the same database.
    drop(h.runtime.clone());
    let reopened = Fixture::runtime_for(&h.open_store(), &h.clock, &h.downstream, "v1");
    let third = reopened.dispatch(&call, None).await.unwrap();
    assert_eq!(third, second);
    assert_eq!(
        h.downstream.submits(),
        1,
        "a replay never reaches the downstream"
    );
    assert_eq!(h.counts().await, (1, 1, 1, 1, 1));
}
both_drivers!(the_same_intent_replays_locally_across_handles_and_after_restart);

async fn a_different_intent_under_the_same_key_conflicts_and_writes_nothing(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    h.runtime.dispatch(&call, None).await.unwrap();
    let before = h.counts().await;
    let other = h.call("alice", "refund-1", "ord-1", 999);
    assert_eq!(
        code(h.runtime.dispatch(&other, None).await),
        ErrorCode::OperationConflict
    );
    assert_eq!(h.counts().await, before);
    assert_eq!(h.downstream.submits(), 1);
}
both_drivers!(a_different_intent_under_the_same_key_conflicts_and_writes_nothing);

async fn a_replay_from_another_provider_path_conflicts(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    h.runtime.dispatch(&call, None).await.unwrap();
    let before = h.counts().await;
    for change in 0..3 {
        let mut moved = call.clone();
        match change {
            0 => {
                moved.provider.provider = "anthropic".into();
                moved.provider.api_family = "messages".into();
            }
            1 => moved.provider.provider = "mcp".into(),
            _ => moved.provider.adapter_revision = "2026-07-28".into(),
        }
        let err = h.runtime.dispatch(&moved, None).await;
        // Unregistered combinations are refused as invalid; registered ones conflict.
        let c = code(err);
        assert!(
            c == ErrorCode::OperationConflict || c == ErrorCode::InvalidArguments,
            "{c:?}"
        );
    }
    let mut anthropic = call.clone();
    anthropic.provider.provider = "anthropic".into();
    anthropic.provider.api_family = "messages".into();
    assert_eq!(
        code(h.runtime.dispatch(&anthropic, None).await),
        ErrorCode::OperationConflict
    );
    assert_eq!(h.counts().await, before);
}
both_drivers!(a_replay_from_another_provider_path_conflicts);

async fn an_unregistered_provider_profile_is_refused_before_anything_is_written(db: &Harness) {
    let h = Fixture::new(db).await;
    let mut call = h.call("alice", "refund-1", "ord-1", 1250);
    call.provider.adapter_revision = "1999-01-01".into();
    assert_eq!(
        code(h.runtime.dispatch(&call, None).await),
        ErrorCode::InvalidArguments
    );
    assert_eq!(h.counts().await, (0, 0, 0, 0, 0));
}
both_drivers!(an_unregistered_provider_profile_is_refused_before_anything_is_written);

async fn a_status_query_identity_cannot_dispatch(db: &Harness) {
    let h = Fixture::new(db).await;
    let mut call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    call.provider.call_id =
        toolledger::runtime::query_identity(&call.provider, "op_0123456789abcdef");
    assert_eq!(
        code(h.runtime.dispatch(&call, None).await),
        ErrorCode::InvalidArguments
    );
    assert_eq!(h.counts().await.0, 0);
}
both_drivers!(a_status_query_identity_cannot_dispatch);

async fn an_injected_failure_in_transaction_a_leaves_neither_intent_nor_event(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    h.db.fail_inserts_into(&h.store, "outbox").await;
    let err = h.runtime.dispatch(&call, None).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Store(_)), "{err:?}");
    assert_eq!(h.counts().await, (0, 0, 0, 0, 0), "nothing of A remains");
    assert_eq!(h.count("operation_events").await, 0);
    assert_eq!(h.downstream.submits(), 0);
    // Once the fault is gone the same approval still works: it was never consumed.
    h.db.allow_inserts_into(&h.store, "outbox").await;
    assert!(matches!(
        h.runtime.dispatch(&call, None).await.unwrap(),
        Answer::Done { .. }
    ));
}
both_drivers!(an_injected_failure_in_transaction_a_leaves_neither_intent_nor_event);

async fn accept_reserves_once_and_reports_the_existing_row(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    let first = h.runtime.accept(&call).await.unwrap();
    let Accepted::New { status_ref, .. } = &first else {
        panic!("expected a new intent");
    };
    let again = h.runtime.accept(&call).await.unwrap();
    assert!(matches!(
        &again,
        Accepted::Existing { status_ref: s, state: OperationState::Accepted, .. } if s == status_ref
    ));
    assert_eq!(h.counts().await, (1, 1, 1, 0, 1));
    assert_eq!(
        h.scalar_text("SELECT state FROM outbox").await.unwrap(),
        "pending"
    );
}
both_drivers!(accept_reserves_once_and_reports_the_existing_row);

async fn a_missing_approval_is_required_and_writes_nothing(db: &Harness) {
    let h = Fixture::new(db).await;
    let mut call = h.call("alice", "refund-1", "ord-1", 1250);
    call.approval_id = None;
    assert_eq!(
        code(h.runtime.dispatch(&call, None).await),
        ErrorCode::ApprovalRequired
    );
    assert_eq!(h.counts().await, (0, 0, 0, 0, 0));
}
both_drivers!(a_missing_approval_is_required_and_writes_nothing);

async fn an_unknown_approval_is_invalid(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    assert_eq!(
        code(h.runtime.dispatch(&call, None).await),
        ErrorCode::ApprovalInvalid
    );
    assert_eq!(h.counts().await, (0, 0, 0, 0, 0));
}
both_drivers!(an_unknown_approval_is_invalid);

async fn approval_validity_is_half_open(db: &Harness) {
    let h = Fixture::new(db).await;
    let now = h.clock_now();
    // Valid from approved_at inclusive …
    let at_start = h.call("alice", "k-start", "ord-1", 10);
    h.approve_window(&at_start, "bob", now, now + 60)
        .await
        .unwrap();
    assert!(matches!(
        h.runtime.dispatch(&at_start, None).await.unwrap(),
        Answer::Done { .. }
    ));
    // … to expires_at exclusive.
    let at_end = h.call("alice", "k-end", "ord-1", 11);
    h.approve_window(&at_end, "bob", now - 60, now)
        .await
        .unwrap();
    assert_eq!(
        code(h.runtime.dispatch(&at_end, None).await),
        ErrorCode::ApprovalInvalid
    );
    // Not yet valid.
    let early = h.call("alice", "k-early", "ord-1", 12);
    h.approve_window(&early, "bob", now + 1, now + 60)
        .await
        .unwrap();
    assert_eq!(
        code(h.runtime.dispatch(&early, None).await),
        ErrorCode::ApprovalInvalid
    );
    // An empty window cannot even be issued.
    let empty = h.call("alice", "k-empty", "ord-1", 13);
    assert_eq!(
        h.approve_window(&empty, "bob", now, now)
            .await
            .unwrap_err()
            .code,
        ErrorCode::InvalidArguments
    );
    assert_eq!(h.counts().await.0, 1);
}
both_drivers!(approval_validity_is_half_open);

async fn a_substituted_approval_is_invalid(db: &Harness) {
    let h = Fixture::new(db).await;
    let approved = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&approved, "bob").await.unwrap();
    // Same approval id presented for another amount, another key, another provider call.
    let mut amount = h.call("alice", "refund-1", "ord-1", 4000);
    amount.approval_id = approved.approval_id.clone();
    let mut key = h.call("alice", "refund-2", "ord-1", 1250);
    key.approval_id = approved.approval_id.clone();
    let mut provider = approved.clone();
    provider.provider.call_id = "call-other".into();
    for c in [amount, key, provider] {
        assert_eq!(
            code(h.runtime.dispatch(&c, None).await),
            ErrorCode::ApprovalInvalid
        );
    }
    assert_eq!(h.counts().await, (0, 0, 0, 0, 0));
}
both_drivers!(a_substituted_approval_is_invalid);

async fn an_approval_is_consumed_once(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    h.runtime.dispatch(&call, None).await.unwrap();
    // Reusing it under a new key (a different execution identity) is refused; the binding
    // names the first key, and the approval is consumed.
    let mut reuse = h.call("alice", "refund-2", "ord-1", 1250);
    reuse.approval_id = call.approval_id.clone();
    assert_eq!(
        code(h.runtime.dispatch(&reuse, None).await),
        ErrorCode::ApprovalInvalid
    );
    let consumed = toolledger::approval::fetch(&h.store, call.approval_id.as_deref().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(consumed.consumed_at.is_some());
    assert_eq!(h.counts().await.0, 1);
}
both_drivers!(an_approval_is_consumed_once);

async fn approvers_must_be_eligible_distinct_and_still_eligible_at_use(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    // No approver role; the requester; another tenant's approver.
    for approver in ["erin", "alice", "gina", "nobody"] {
        assert_eq!(
            h.approve(&call, approver).await.unwrap_err().code,
            ErrorCode::PermissionDenied,
            "{approver}"
        );
    }
    assert_eq!(h.count("approvals").await, 0);
    // Eligible when issued, revoked before the intent is accepted.
    h.approve(&call, "bob").await.unwrap();
    h.principals
        .revoke("bob", &["approver".to_string()], &[], false)
        .await
        .unwrap();
    assert_eq!(
        code(h.runtime.dispatch(&call, None).await),
        ErrorCode::ApprovalInvalid
    );
    assert_eq!(h.counts().await, (0, 0, 0, 0, 0));
}
both_drivers!(approvers_must_be_eligible_distinct_and_still_eligible_at_use);

async fn owners_and_support_admins_only(db: &Harness) {
    let h = Fixture::new(db).await;
    // erin may not refund alice's order: same shape as an absent order.
    let erin = h.call("erin", "k1", "ord-1", 10);
    let absent = h.call("erin", "k2", "ord-404", 10);
    let e1 = refused(h.runtime.dispatch(&erin, None).await);
    let e2 = refused(h.runtime.dispatch(&absent, None).await);
    assert_eq!(e1, e2);
    assert_eq!(e1.code, ErrorCode::NotFound);
    // dave is support_admin in another tenant.
    let dave = h.call("dave", "k3", "ord-1", 10);
    assert_eq!(
        code(h.runtime.dispatch(&dave, None).await),
        ErrorCode::NotFound
    );
    // carol is support_admin in acme.
    let carol = h.call("carol", "k4", "ord-1", 10);
    h.approve(&carol, "bob").await.unwrap();
    assert!(matches!(
        h.runtime.dispatch(&carol, None).await.unwrap(),
        Answer::Done { .. }
    ));
    // An unknown principal is refused before anything else.
    let ghost = h.call("ghost", "k5", "ord-1", 10);
    assert_eq!(
        code(h.runtime.dispatch(&ghost, None).await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(h.counts().await.0, 1);
}
both_drivers!(owners_and_support_admins_only);

async fn a_clock_outside_the_portable_range_is_refused_before_reservation(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    h.clock.set(MAX_PORTABLE_TIMESTAMP + 1);
    assert_eq!(
        code(h.runtime.dispatch(&call, None).await),
        ErrorCode::InvalidArguments
    );
    assert_eq!(h.counts().await, (0, 0, 0, 0, 0));
    // A lease that would end past the range is refused before reservation too.
    h.clock.set(MAX_PORTABLE_TIMESTAMP - 5);
    assert_eq!(
        code(
            h.runtime
                .dispatch(&call, Some(CrashPoint::AfterIntentCommit))
                .await
        ),
        ErrorCode::InvalidArguments
    );
    assert_eq!(h.counts().await, (0, 0, 0, 0, 0));
}
both_drivers!(a_clock_outside_the_portable_range_is_refused_before_reservation);

async fn business_state_is_checked_at_acceptance(db: &Harness) {
    let h = Fixture::new(db).await;
    h.sql("UPDATE test_orders SET refundable = 0 WHERE id = 'ord-1';")
        .await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    assert_eq!(
        code(h.runtime.dispatch(&call, None).await),
        ErrorCode::BusinessStateChanged
    );
    let too_much = h.call("alice", "refund-2", "ord-1", 5001);
    assert_eq!(
        code(h.runtime.dispatch(&too_much, None).await),
        ErrorCode::BusinessStateChanged
    );
    assert_eq!(h.counts().await, (0, 0, 0, 0, 0));
}
both_drivers!(business_state_is_checked_at_acceptance);

async fn a_tampered_stored_row_is_a_storage_contract_error(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    h.runtime.dispatch(&call, None).await.unwrap();
    // Non-canonical stored arguments (extra whitespace).
    h.sql("UPDATE operations SET arguments = '{\"amount_cents\": 1250,\"order_id\":\"ord-1\"}';")
        .await;
    let err = h.runtime.dispatch(&call, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::Store(toolledger::store::StoreError::Contract(_))
        ),
        "{err:?}"
    );
    // Canonical but different arguments: the stored digest no longer matches its own intent.
    h.sql("UPDATE operations SET arguments = '{\"amount_cents\":1,\"order_id\":\"ord-1\"}';")
        .await;
    let err = h.runtime.dispatch(&call, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::Store(toolledger::store::StoreError::Contract(_))
        ),
        "{err:?}"
    );
}
both_drivers!(a_tampered_stored_row_is_a_storage_contract_error);

async fn access_is_checked_before_the_ledger_so_a_revoked_caller_learns_nothing(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("carol", "refund-1", "ord-2", 700);
    h.approve(&call, "bob").await.unwrap();
    h.runtime.dispatch(&call, None).await.unwrap();
    h.principals
        .revoke("carol", &["support_admin".to_string()], &[], false)
        .await
        .unwrap();
    let absent = refused(
        h.runtime
            .dispatch(&h.call("carol", "refund-2", "ord-404", 700), None)
            .await,
    );
    let replay = refused(h.runtime.dispatch(&call, None).await);
    let other_intent = refused(
        h.runtime
            .dispatch(&h.call("carol", "refund-1", "ord-2", 1), None)
            .await,
    );
    assert_eq!(absent.code, ErrorCode::NotFound);
    assert_eq!(replay, absent);
    assert_eq!(other_intent, absent, "not even a conflict is revealed");
}
both_drivers!(access_is_checked_before_the_ledger_so_a_revoked_caller_learns_nothing);
