//! The three crash points (injected in process), dispatch of unfinished operations, explicit
//! status queries and transaction C.

mod runtime_support;

use runtime_support::*;
use toolledger::effect::Dialect;
use toolledger::outbox::ClaimOutcome;
use toolledger::runtime::{Answer, CrashPoint, Delivery, RuntimeError};
use toolledger::{ErrorCode, OperationState};

async fn outbox_row(h: &Fixture<'_>) -> String {
    h.scalar_text(
        "SELECT state || ':' || fencing_token || ':' || coalesce(CAST(lease_until AS TEXT), '-')
         FROM outbox",
    )
    .await
    .unwrap()
}

async fn after_intent_commit_leaves_a_pending_event_and_dispatch_only_reports_unknown(
    db: &Harness,
) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    let answer = h
        .runtime
        .dispatch(&call, Some(CrashPoint::AfterIntentCommit))
        .await
        .unwrap();
    let Answer::Unknown { status_ref, state } = answer.clone() else {
        panic!("{answer:?}");
    };
    assert_eq!(state, OperationState::Accepted);
    assert_eq!(h.counts().await, (1, 1, 1, 0, 1));
    assert_eq!(outbox_row(&h).await, "pending:0:-");
    assert_eq!(h.downstream_receipts(), 0);
    // A retry only reports: no worker, no downstream, no new rows.
    let again = h.second_runtime("v1").dispatch(&call, None).await.unwrap();
    assert_eq!(again, answer);
    assert_eq!(outbox_row(&h).await, "pending:0:-");
    assert_eq!(h.downstream.submits(), 0);
    assert_eq!(h.downstream.statuses(), 0);
    // The status query observes (nothing downstream yet: still unknown).
    let q = h.query(&call, &status_ref);
    assert!(matches!(
        h.runtime.status(&q).await.unwrap(),
        Answer::Unknown {
            state: OperationState::Accepted,
            ..
        }
    ));
    // A worker delivers it; then dispatch replays.
    let pass = h.runtime.run_pass("w", 10).await.unwrap();
    assert_eq!(pass.delivered, 1);
    assert!(matches!(
        h.runtime.dispatch(&call, None).await.unwrap(),
        Answer::Done {
            delivery: Delivery::LocalReplay,
            ..
        }
    ));
}
both_drivers!(after_intent_commit_leaves_a_pending_event_and_dispatch_only_reports_unknown);

async fn after_claim_leaves_an_unexpired_lease_that_is_reclaimed_only_after_expiry(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    let answer = h
        .runtime
        .dispatch(&call, Some(CrashPoint::AfterClaim))
        .await
        .unwrap();
    assert!(matches!(
        answer,
        Answer::Unknown {
            state: OperationState::Processing,
            ..
        }
    ));
    assert_eq!(outbox_row(&h).await, format!("processing:1:{}", T0 + 30));
    assert_eq!(h.downstream.submits(), 0);
    assert_eq!(h.runtime.dispatch(&call, None).await.unwrap(), answer);
    assert_eq!(h.runtime.run_pass("w", 10).await.unwrap().ready, 0);
    let event = h.scalar_int("SELECT id FROM outbox").await.unwrap();
    assert!(matches!(
        h.runtime.claim(event, "w").await.unwrap(),
        ClaimOutcome::Leased { .. }
    ));
    h.clock.set(T0 + 30);
    assert_eq!(h.runtime.run_pass("w", 10).await.unwrap().delivered, 1);
    assert_eq!(h.counts().await, (1, 1, 1, 1, 1));
}
both_drivers!(after_claim_leaves_an_unexpired_lease_that_is_reclaimed_only_after_expiry);

async fn after_downstream_commit_stays_unknown_until_an_explicit_status_query_reconciles(
    db: &Harness,
) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    let answer = h
        .runtime
        .dispatch(&call, Some(CrashPoint::AfterDownstreamCommit))
        .await
        .unwrap();
    let Answer::Unknown { status_ref, .. } = answer.clone() else {
        panic!("{answer:?}");
    };
    assert_eq!(h.downstream_receipts(), 1, "the downstream committed");
    assert_eq!(h.count("local_receipts").await, 0, "we did not");
    // dispatch never queries the downstream nor reconciles.
    let statuses = h.downstream.statuses();
    assert_eq!(h.runtime.dispatch(&call, None).await.unwrap(), answer);
    assert_eq!(h.downstream.statuses(), statuses);
    assert_eq!(h.downstream.submits(), 1);
    // The explicit status query reconciles (transaction C).
    let q = h.query(&call, &status_ref);
    let Answer::Done {
        delivery, state, ..
    } = h.runtime.status(&q).await.unwrap()
    else {
        panic!("expected reconciliation");
    };
    assert_eq!(delivery, Delivery::ReceiptReconciled);
    assert_eq!(state, OperationState::Succeeded);
    assert_eq!(h.counts().await, (1, 1, 1, 1, 1));
    assert_eq!(
        h.scalar_text("SELECT reconciled_via FROM local_receipts")
            .await
            .unwrap(),
        "status_query"
    );
    assert!(h
        .scalar_text("SELECT query_identity FROM local_receipts")
        .await
        .unwrap()
        .starts_with("query_status:"));
    assert_eq!(
        h.scalar_text("SELECT state FROM outbox").await.unwrap(),
        "delivered"
    );
    // Now both dispatch and status replay locally; the downstream was submitted to once.
    assert!(matches!(
        h.runtime.dispatch(&call, None).await.unwrap(),
        Answer::Done {
            delivery: Delivery::LocalReplay,
            ..
        }
    ));
    assert!(matches!(
        h.runtime.status(&q).await.unwrap(),
        Answer::Done {
            delivery: Delivery::LocalReplay,
            ..
        }
    ));
    assert_eq!(h.downstream.submits(), 1);
    // A worker holding the old lease is fenced out after reconciliation.
    assert!(h.runtime.ready(10).await.unwrap().is_empty());
}
both_drivers!(after_downstream_commit_stays_unknown_until_an_explicit_status_query_reconciles);

async fn transaction_c_rolls_back_as_a_unit(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    let answer = h
        .runtime
        .dispatch(&call, Some(CrashPoint::AfterDownstreamCommit))
        .await
        .unwrap();
    let q = h.query(&call, answer.status_ref());
    // Fail the last write of C (the success update of the operation).
    h.sql(match h.db.dialect() {
        Dialect::Sqlite => {
            "CREATE TRIGGER fail_c BEFORE UPDATE OF state ON operations
             WHEN NEW.state = 'succeeded'
             BEGIN SELECT RAISE(ABORT, 'injected reconcile failure'); END;"
        }
        Dialect::Postgres => {
            "CREATE FUNCTION fail_c() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN RAISE EXCEPTION 'injected reconcile failure'; END $$;
             CREATE TRIGGER fail_c BEFORE UPDATE OF state ON operations
             FOR EACH ROW WHEN (NEW.state = 'succeeded') EXECUTE FUNCTION fail_c();"
        }
    })
    .await;
    let before = (h.counts().await, outbox_row(&h).await);
    let err = h.runtime.status(&q).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Store(_)), "{err:?}");
    assert_eq!((h.counts().await, outbox_row(&h).await), before);
    assert_eq!(
        h.count("operation_events WHERE kind = 'receipt_reconciled'")
            .await,
        0
    );
    h.sql(match h.db.dialect() {
        Dialect::Sqlite => "DROP TRIGGER fail_c;",
        Dialect::Postgres => "DROP TRIGGER fail_c ON operations; DROP FUNCTION fail_c();",
    })
    .await;
    assert!(matches!(
        h.runtime.status(&q).await.unwrap(),
        Answer::Done {
            delivery: Delivery::ReceiptReconciled,
            ..
        }
    ));

    // The worker path's C rolls back as a unit too.
    let call2 = h.call("alice", "refund-2", "ord-1", 10);
    h.approve(&call2, "bob").await.unwrap();
    h.db.fail_inserts_into(&h.store, "local_receipts").await;
    let err = h.runtime.dispatch(&call2, None).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Store(_)), "{err:?}");
    assert_eq!(
        h.scalar_text("SELECT state FROM outbox ORDER BY id DESC LIMIT 1")
            .await
            .unwrap(),
        "processing"
    );
    assert_eq!(
        h.scalar_text("SELECT state FROM operations ORDER BY id DESC LIMIT 1")
            .await
            .unwrap(),
        "processing"
    );
    assert_eq!(h.count("local_receipts").await, 1);
}
both_drivers!(transaction_c_rolls_back_as_a_unit);

async fn status_follows_the_secure_order_and_hides_what_the_caller_may_not_see(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("carol", "refund-1", "ord-2", 700);
    h.approve(&call, "bob").await.unwrap();
    let answer = h.runtime.dispatch(&call, None).await.unwrap();
    let sr = answer.status_ref().to_string();
    let q = h.query(&call, &sr);
    assert!(matches!(
        h.runtime.status(&q).await.unwrap(),
        Answer::Done {
            delivery: Delivery::LocalReplay,
            ..
        }
    ));
    // A nonexistent status ref, another principal's query, and a query after revocation all
    // give the identical not_found.
    let absent = refused(
        h.runtime
            .status(&h.query(&call, "op_ffffffffffffffffffffffffffffffff"))
            .await,
    );
    let mut erin = q.clone();
    erin.principal = "erin".into();
    let other_subject = refused(h.runtime.status(&erin).await);
    h.principals
        .revoke("carol", &["support_admin".to_string()], &[], false)
        .await
        .unwrap();
    let revoked = refused(h.runtime.status(&q).await);
    let replay_after_revocation = refused(h.runtime.dispatch(&call, None).await);
    assert_eq!(absent.code, ErrorCode::NotFound);
    assert_eq!(absent, other_subject);
    assert_eq!(absent, revoked);
    assert_eq!(absent, replay_after_revocation);
    // Restored role: visible again (nothing was frozen at creation).
    h.principals
        .add("carol", "acme", &["support_admin".to_string()], &[], false)
        .await
        .unwrap();
    assert!(h.runtime.status(&q).await.is_ok());
    // A different intent or key for this status ref conflicts; another provider path too.
    let mut amount = q.clone();
    amount.arguments["amount_cents"] = 1.into();
    assert_eq!(
        code(h.runtime.status(&amount).await),
        ErrorCode::OperationConflict
    );
    let mut key = q.clone();
    key.key = "refund-9".into();
    assert_eq!(
        code(h.runtime.status(&key).await),
        ErrorCode::OperationConflict
    );
    let mut provider = q.clone();
    provider.provider.provider = "anthropic".into();
    provider.provider.api_family = "messages".into();
    assert_eq!(
        code(h.runtime.status(&provider).await),
        ErrorCode::OperationConflict
    );
    // A fully deactivated principal gets the same not_found.
    h.principals.revoke("carol", &[], &[], true).await.unwrap();
    assert_eq!(refused(h.runtime.status(&q).await), absent);
}
both_drivers!(status_follows_the_secure_order_and_hides_what_the_caller_may_not_see);
