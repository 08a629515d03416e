//! `failed` as a terminal, replayable state; operator resolution of unknown outcomes; and the
//! authority/retention deadlines of deferred operations.

mod runtime_support;

use std::sync::Arc;

use runtime_support::*;
use serde_json::{json, Value};
use toolledger::downstream::{BoxFuture, Downstream, DownstreamError};
use toolledger::outbox::ClaimOutcome;
use toolledger::runtime::{
    Accepted, Answer, Deadlines, Delivery, Registry, Resolution, ResolveAs, Runtime, RuntimeConfig,
    RuntimeError,
};
use toolledger::{ErrorCode, OperationState, Scope};
use toolledger_testkit::downstream::{SqliteDownstream, REFUND_EXCEEDS_CAPTURED};

fn code(r: Result<Answer, RuntimeError>) -> ErrorCode {
    match r {
        Err(RuntimeError::Refused(e)) => e.code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn refused_result() -> Value {
    json!({"code": REFUND_EXCEEDS_CAPTURED,
        "message": "the refund would exceed the amount captured for the order"})
}

async fn a_downstream_refusal_is_recorded_as_failed_and_replayed_never_resubmitted(db: &Harness) {
    let h = Fixture::new(db).await;
    h.downstream
        .inner
        .set_captured("acme", "ord-1", 150)
        .unwrap();
    let first = h.call("alice", "refund-1", "ord-1", 100);
    h.approve(&first, "bob").await.unwrap();
    let a = h.runtime.dispatch(&first, None).await.unwrap();
    assert!(matches!(
        a,
        Answer::Done {
            state: OperationState::Succeeded,
            ..
        }
    ));

    let second = h.call("alice", "refund-2", "ord-1", 100);
    h.approve(&second, "bob").await.unwrap();
    let failed = h.runtime.dispatch(&second, None).await.unwrap();
    let Answer::Done {
        status_ref,
        state,
        delivery,
        result,
    } = failed
    else {
        panic!("{failed:?}")
    };
    assert_eq!(
        (state, delivery, &result),
        (OperationState::Failed, Delivery::Fresh, &refused_result())
    );
    let sql = format!("SELECT state FROM operations WHERE status_ref = '{status_ref}'");
    assert_eq!(h.scalar_text(&sql).await.unwrap(), "failed");
    let sql = format!(
        "SELECT e.state FROM outbox e JOIN operations o ON o.id = e.operation_id
         WHERE o.status_ref = '{status_ref}'"
    );
    assert_eq!(h.scalar_text(&sql).await.unwrap(), "delivered");
    assert_eq!(h.count("local_receipts").await, 1);
    let submits = h.downstream.submits();

    // A replay and a status query return the stored failure; nothing goes downstream again.
    for answer in [
        h.runtime.dispatch(&second, None).await.unwrap(),
        h.runtime
            .status(&h.query(&second, &status_ref))
            .await
            .unwrap(),
    ] {
        assert_eq!(
            answer,
            Answer::Done {
                status_ref: status_ref.clone(),
                state: OperationState::Failed,
                delivery: Delivery::LocalReplay,
                result: refused_result(),
            }
        );
    }
    assert_eq!(h.downstream.submits(), submits);
    assert_eq!(h.downstream.statuses(), 0);
    // Nothing is ready for a worker.
    assert!(h.runtime.ready(10).await.unwrap().is_empty());
}
both_drivers!(a_downstream_refusal_is_recorded_as_failed_and_replayed_never_resubmitted);

async fn a_stale_worker_cannot_record_a_failure(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 100);
    h.approve(&call, "bob").await.unwrap();
    let Accepted::New { event_id, .. } = h.runtime.accept(&call).await.unwrap() else {
        panic!()
    };
    let ClaimOutcome::Claimed(old) = h.runtime.claim(event_id, "w1").await.unwrap() else {
        panic!()
    };
    h.clock.set(T0 + 30);
    let ClaimOutcome::Claimed(_new) = h.runtime.claim(event_id, "w2").await.unwrap() else {
        panic!()
    };
    let before = h.counts().await;
    let r = h.runtime.fail(&old, refused_result()).await;
    assert!(matches!(r, Err(RuntimeError::Fenced(_))), "{r:?}");
    assert_eq!(h.counts().await, before);
    assert_eq!(
        h.scalar_text("SELECT state FROM operations").await.unwrap(),
        "processing"
    );
}
both_drivers!(a_stale_worker_cannot_record_a_failure);

/// A payments service whose reply is lost: it commits the receipt (or not) and then the call
/// fails as if the connection dropped.
#[derive(Debug)]
struct LostReply {
    inner: SqliteDownstream,
    commit: bool,
}

impl Downstream for LostReply {
    fn submit<'a>(
        &'a self,
        scope: &'a Scope,
        request: &'a Value,
    ) -> BoxFuture<'a, Result<Value, DownstreamError>> {
        Box::pin(async move {
            if self.commit {
                self.inner.submit(scope, request).await?;
            }
            Err(DownstreamError::Unavailable("connection reset".into()))
        })
    }

    fn status<'a>(
        &'a self,
        status_ref: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, DownstreamError>> {
        self.inner.status(status_ref)
    }
}

fn runtime_with(h: &Fixture<'_>, downstream: Arc<dyn Downstream>) -> Runtime {
    let registry = Registry::new()
        .register(Arc::new(TestRefund::v("v1")), downstream)
        .allow_profile(toolledger::runtime::ProviderProfile::new(
            "openai",
            "responses",
            "2026-07-01",
        ));
    Runtime::new(h.store.clone(), Arc::new(h.clock.clone()), registry).with_config(RuntimeConfig {
        lease_seconds: 30,
        max_attempts: 3,
    })
}

async fn unknown_operation(h: &Fixture<'_>, rt: &Runtime, key: &str) -> String {
    let call = h.call("alice", key, "ord-1", 100);
    h.approve(&call, "bob").await.unwrap();
    match rt.dispatch(&call, None).await.unwrap() {
        Answer::Unknown {
            status_ref,
            state: OperationState::OutcomeUnknown,
        } => status_ref,
        other => panic!("{other:?}"),
    }
}

fn resolution(status_ref: &str, outcome: ResolveAs, operator: &str) -> Resolution {
    Resolution {
        status_ref: status_ref.into(),
        outcome,
        reason: "checked the payments dashboard".into(),
        operator: operator.into(),
        evidence: None,
    }
}

async fn events(h: &Fixture<'_>) -> i64 {
    h.count("operation_events").await
}

/// Row counts of the runtime tables plus the operation events.
async fn unchanged(h: &Fixture<'_>) -> ((i64, i64, i64, i64, i64), i64) {
    (h.counts().await, events(h).await)
}

async fn an_operator_resolves_an_unknown_outcome_without_receipt_as_failed(db: &Harness) {
    let h = Fixture::new(db).await;
    h.principals
        .add("olga", "acme", &["operator".to_string()], &[], false)
        .await
        .unwrap();
    h.principals
        .add("omar", "globex", &["operator".to_string()], &[], false)
        .await
        .unwrap();
    let rt = runtime_with(
        &h,
        Arc::new(LostReply {
            inner: h.downstream.inner.clone(),
            commit: false,
        }),
    );
    let sr = unknown_operation(&h, &rt, "refund-1").await;
    let before = unchanged(&h).await;
    // A live lease: a worker may still be calling the downstream.
    assert_eq!(
        code(
            rt.resolve(&resolution(&sr, ResolveAs::Failed, "olga"))
                .await
        ),
        ErrorCode::OperationInProgress
    );
    h.clock.set(T0 + 30);
    // Not an operator; an operator of another tenant; success without a receipt.
    assert_eq!(
        code(
            rt.resolve(&resolution(&sr, ResolveAs::Failed, "alice"))
                .await
        ),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        code(
            rt.resolve(&resolution(&sr, ResolveAs::Failed, "omar"))
                .await
        ),
        ErrorCode::NotFound
    );
    assert_eq!(
        code(
            rt.resolve(&resolution(&sr, ResolveAs::Succeeded, "olga"))
                .await
        ),
        ErrorCode::OutcomeUnknown
    );
    // What the downstream holds, for the operator of the tenant only: no receipt.
    assert_eq!(rt.downstream_evidence("olga", &sr).await.unwrap(), None);
    let evidence_code = |r: Result<Option<Value>, RuntimeError>| match r {
        Err(RuntimeError::Refused(e)) => e.code,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        evidence_code(rt.downstream_evidence("alice", &sr).await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        evidence_code(rt.downstream_evidence("omar", &sr).await),
        ErrorCode::NotFound
    );
    assert_eq!(
        evidence_code(rt.downstream_evidence("olga", "op_nonexistent").await),
        ErrorCode::NotFound
    );
    assert_eq!(unchanged(&h).await, before);

    let done = rt
        .resolve(&resolution(&sr, ResolveAs::Failed, "olga"))
        .await
        .unwrap();
    let Answer::Done { state, result, .. } = &done else {
        panic!("{done:?}")
    };
    assert_eq!(*state, OperationState::Failed);
    assert_eq!(result["code"], "resolved_failed");
    let detail = h
        .scalar_text("SELECT detail FROM operation_events WHERE kind = 'resolved'")
        .await
        .unwrap();
    let detail: Value = serde_json::from_str(&detail).unwrap();
    assert_eq!(detail["operator"], "olga");
    assert_eq!(detail["reason"], "checked the payments dashboard");
    assert_eq!(detail["as"], "failed");
    assert_eq!(detail["previous_state"], "outcome_unknown");
    assert_eq!(
        h.scalar_text("SELECT state FROM outbox").await.unwrap(),
        "delivered"
    );
    // Replays return the stored failure; resolving again is refused and changes nothing.
    let call = h.call("alice", "refund-1", "ord-1", 100);
    let replay = rt.dispatch(&call, None).await.unwrap();
    assert!(matches!(
        replay,
        Answer::Done {
            state: OperationState::Failed,
            delivery: Delivery::LocalReplay,
            ..
        }
    ));
    let after = unchanged(&h).await;
    assert_eq!(
        code(
            rt.resolve(&resolution(&sr, ResolveAs::Failed, "olga"))
                .await
        ),
        ErrorCode::InvalidArguments
    );
    assert_eq!(unchanged(&h).await, after);
}
both_drivers!(an_operator_resolves_an_unknown_outcome_without_receipt_as_failed);

async fn a_receipt_refuses_resolving_as_failed_and_resolving_as_succeeded_reconciles_it(
    db: &Harness,
) {
    let h = Fixture::new(db).await;
    h.principals
        .add("olga", "acme", &["operator".to_string()], &[], false)
        .await
        .unwrap();
    let rt = runtime_with(
        &h,
        Arc::new(LostReply {
            inner: h.downstream.inner.clone(),
            commit: true,
        }),
    );
    let sr = unknown_operation(&h, &rt, "refund-1").await;
    h.clock.set(T0 + 30);
    let before = (h.counts().await, events(&h).await);
    // The downstream holds the receipt; asking for it records nothing.
    let receipt = rt.downstream_evidence("olga", &sr).await.unwrap().unwrap();
    assert_eq!(receipt["status_ref"], sr.as_str(), "{receipt}");
    assert_eq!((h.counts().await, events(&h).await), before);
    assert_eq!(
        code(
            rt.resolve(&resolution(&sr, ResolveAs::Failed, "olga"))
                .await
        ),
        ErrorCode::OperationConflict
    );
    assert_eq!((h.counts().await, events(&h).await), before);
    let done = rt
        .resolve(&resolution(&sr, ResolveAs::Succeeded, "olga"))
        .await
        .unwrap();
    assert!(
        matches!(
            done,
            Answer::Done {
                state: OperationState::Succeeded,
                delivery: Delivery::ReceiptReconciled,
                ..
            }
        ),
        "{done:?}"
    );
    assert_eq!(h.count("local_receipts").await, 1);
    let detail = h
        .scalar_text("SELECT detail FROM operation_events WHERE kind = 'resolved'")
        .await
        .unwrap();
    assert!(detail.contains("\"evidence\":\"receipt\""), "{detail}");
}
both_drivers!(a_receipt_refuses_resolving_as_failed_and_resolving_as_succeeded_reconciles_it);

fn with_deadlines(h: &Fixture<'_>, authority: Option<i64>, retention: Option<i64>) -> Runtime {
    Fixture::runtime_for(&h.store, &h.clock, &h.downstream, "v1").with_deadlines(Deadlines {
        authority_ttl: authority,
        retention_ttl: retention,
    })
}

async fn replays_check_the_conflict_then_authority_then_retention(db: &Harness) {
    let h = Fixture::new(db).await;
    let rt = with_deadlines(&h, Some(100), Some(50));
    let call = h.call("alice", "refund-1", "ord-1", 100);
    h.approve(&call, "bob").await.unwrap();
    let Answer::Done { status_ref, .. } = rt.dispatch(&call, None).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        h.scalar_int("SELECT authority_deadline FROM operations")
            .await,
        Some(T0 + 100)
    );
    assert_eq!(
        h.scalar_int("SELECT retention_deadline FROM operations")
            .await,
        Some(T0 + 50)
    );
    h.clock.set(T0 + 49);
    assert!(matches!(
        rt.dispatch(&call, None).await.unwrap(),
        Answer::Done {
            delivery: Delivery::LocalReplay,
            ..
        }
    ));
    let before = h.counts().await;
    // Retention passed at its deadline; the authority deadline has not.
    h.clock.set(T0 + 50);
    assert_eq!(
        code(rt.dispatch(&call, None).await),
        ErrorCode::OperationRetentionExpired
    );
    // Both passed: authority first.
    h.clock.set(T0 + 100);
    assert_eq!(
        code(rt.dispatch(&call, None).await),
        ErrorCode::OperationAuthorityExpired
    );
    // The key stays a tombstone: another intent under it is a conflict, before any deadline.
    let other = h.call("alice", "refund-1", "ord-1", 99);
    assert_eq!(
        code(rt.dispatch(&other, None).await),
        ErrorCode::OperationConflict
    );
    assert_eq!(h.counts().await, before);
    // An explicit status query never checks deadlines.
    assert!(matches!(
        rt.status(&h.query(&call, &status_ref)).await.unwrap(),
        Answer::Done {
            delivery: Delivery::LocalReplay,
            ..
        }
    ));
}
both_drivers!(replays_check_the_conflict_then_authority_then_retention);

async fn the_worker_does_not_call_the_downstream_after_the_authority_deadline(db: &Harness) {
    let h = Fixture::new(db).await;
    let rt = with_deadlines(&h, Some(100), None);
    let call = h.call("alice", "refund-1", "ord-1", 100);
    h.approve(&call, "bob").await.unwrap();
    let Accepted::New { event_id, .. } = rt.accept(&call).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        h.scalar_int("SELECT count(*) FROM operations WHERE retention_deadline IS NULL")
            .await,
        Some(1)
    );
    h.clock.set(T0 + 100);
    let r = rt.process(event_id, "w1", None).await;
    assert!(
        matches!(&r, Err(RuntimeError::Refused(e)) if e.code == ErrorCode::OperationAuthorityExpired),
        "{r:?}"
    );
    assert_eq!(h.downstream.submits(), 0);
    assert_eq!(h.count("local_receipts").await, 0);
}
both_drivers!(the_worker_does_not_call_the_downstream_after_the_authority_deadline);

async fn an_invalid_ttl_is_refused_and_nothing_is_written(db: &Harness) {
    let h = Fixture::new(db).await;
    for (a, r) in [(Some(0), None), (None, Some(-5)), (Some(i64::MAX), None)] {
        let rt = with_deadlines(&h, a, r);
        let call = h.call("alice", "refund-1", "ord-1", 100);
        h.approve(&call, "bob").await.ok();
        let before = h.counts().await;
        assert_eq!(
            code(rt.dispatch(&call, None).await),
            ErrorCode::InvalidArguments
        );
        assert_eq!(h.counts().await, before);
    }
}
both_drivers!(an_invalid_ttl_is_refused_and_nothing_is_written);
