//! Claims, leases, fencing tokens, heartbeats, attempts and the worker pass.

mod runtime_support;

use runtime_support::*;
use toolledger::outbox::{ClaimOutcome, EventState};
use toolledger::runtime::{Accepted, Answer, CrashPoint, Processed, RuntimeError};
use toolledger::OperationState;

async fn accepted(h: &Fixture<'_>, key: &str) -> (i64, String) {
    let mut call = h.call("alice", key, "ord-1", 100);
    // Several refunds of one order for one amount, each its own intent: the re-plan guard
    // would take the second for a re-plan of the first while it is unsettled.
    call.new_intent = true;
    h.approve(&call, "bob").await.unwrap();
    match h.runtime.accept(&call).await.unwrap() {
        Accepted::New {
            event_id,
            status_ref,
            ..
        } => (event_id, status_ref),
        other => panic!("{other:?}"),
    }
}

fn lease(out: ClaimOutcome) -> toolledger::outbox::Lease {
    match out {
        ClaimOutcome::Claimed(l) => l,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// Claims `event` as w1 and runs it until the downstream has applied the effect, stopping
/// before transaction C; the lease and the downstream's receipt.
async fn stalled_after_the_downstream(
    h: &Fixture<'_>,
    event: i64,
) -> (toolledger::outbox::Lease, serde_json::Value) {
    let w1 = lease(h.runtime.claim(event, "w1").await.unwrap());
    let stalled = h
        .runtime
        .execute(&w1, Some(CrashPoint::AfterDownstreamCommit))
        .await
        .unwrap();
    let Processed::Unknown(Answer::Unknown { status_ref, .. }) = stalled else {
        panic!("{stalled:?}");
    };
    let receipt = h
        .downstream
        .inner
        .status_blocking(&status_ref)
        .unwrap()
        .unwrap();
    (w1, receipt)
}

async fn an_unexpired_lease_is_not_claimable_and_an_expired_one_is_with_a_higher_token(
    db: &Harness,
) {
    let h = Fixture::new(db).await;
    let (event, _) = accepted(&h, "refund-1").await;
    let first = lease(h.runtime.claim(event, "w1").await.unwrap());
    assert_eq!(first.token, 1);
    assert_eq!(first.until, T0 + 30);
    assert_eq!(
        h.scalar_text("SELECT state FROM operations").await.unwrap(),
        "processing"
    );
    // One second before expiry: held.
    h.clock.set(T0 + 29);
    assert_eq!(
        h.runtime.claim(event, "w2").await.unwrap(),
        ClaimOutcome::Leased { until: T0 + 30 }
    );
    assert!(h.runtime.ready(10).await.unwrap().is_empty());
    // At expiry (`now >= lease_until`): claimable, with a new token.
    h.clock.set(T0 + 30);
    assert_eq!(h.runtime.ready(10).await.unwrap(), vec![event]);
    let second = lease(h.runtime.claim(event, "w2").await.unwrap());
    assert_eq!(second.token, 2);
    assert_eq!(second.attempt, 2);
    assert_eq!(second.owner, "w2");
}
both_drivers!(an_unexpired_lease_is_not_claimable_and_an_expired_one_is_with_a_higher_token);

async fn a_stale_worker_completion_is_fenced_and_changes_nothing(db: &Harness) {
    let h = Fixture::new(db).await;
    let (event, _) = accepted(&h, "refund-1").await;
    // Worker 1 claims, reaches the downstream, and stalls before transaction C.
    let (w1, receipt) = stalled_after_the_downstream(&h, event).await;
    // Its lease expires; worker 2 (another connection) reclaims.
    h.clock.set(T0 + 31);
    let other = h.second_runtime("v1");
    let w2 = lease(other.claim(event, "w2").await.unwrap());
    assert!(w2.token > w1.token);
    let before = (
        h.counts().await,
        h.scalar_text("SELECT state || ':' || fencing_token || ':' || lease_owner FROM outbox")
            .await,
    );
    // Worker 1 wakes up and tries to complete with its old token.
    let err = h.runtime.complete(&w1, receipt.clone()).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Fenced(_)), "{err:?}");
    // Its heartbeat is fenced too.
    assert!(matches!(
        h.runtime.renew(&w1).await.unwrap_err(),
        RuntimeError::Fenced(_)
    ));
    let after = (
        h.counts().await,
        h.scalar_text("SELECT state || ':' || fencing_token || ':' || lease_owner FROM outbox")
            .await,
    );
    assert_eq!(before, after, "a stale completion changes nothing");
    assert_eq!(
        h.scalar_text("SELECT state FROM operations").await.unwrap(),
        "processing"
    );
    // Worker 2 finishes; the idempotent downstream hands back the same receipt.
    let done = other.execute(&w2, None).await.unwrap();
    let Processed::Delivered(Answer::Done { result, .. }) = done else {
        panic!("{done:?}");
    };
    assert_eq!(result["receipt_id"], receipt["receipt_id"]);
    assert_eq!(h.downstream_receipts(), 1);
    assert_eq!(h.downstream.submits(), 2, "the reclaim delivered again");
    assert_eq!(
        h.scalar_int("SELECT fencing_token FROM local_receipts")
            .await,
        Some(w2.token)
    );
}
both_drivers!(a_stale_worker_completion_is_fenced_and_changes_nothing);

async fn a_worker_whose_lease_is_taken_over_during_the_call_is_fenced_at_transaction_c(
    db: &Harness,
) {
    let h = Fixture::new(db).await;
    let (rt, gate, waiting) = gated_runtime(&h, 30);
    let (event, _) = accepted(&h, "refund-1").await;
    let worker = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.process(event, "w1", None).await })
    };
    while waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // w1's lease runs out inside its downstream call, and w2 takes the event over.
    h.clock.set(T0 + 31);
    let w2 = lease(h.second_runtime("v1").claim(event, "w2").await.unwrap());
    assert_eq!(w2.token, 2);
    gate.add_permits(1);
    let err = worker.await.unwrap().unwrap_err();
    assert!(matches!(err, RuntimeError::Fenced(_)), "{err:?}");
    assert_eq!(
        h.downstream_receipts(),
        1,
        "w1's call reached the downstream"
    );
    // Nothing of w1's transaction C was written: no local receipt, the operation still
    // `processing`, the event held by w2.
    assert_eq!(h.count("local_receipts").await, 0);
    assert_eq!(
        h.scalar_text("SELECT state FROM operations").await.unwrap(),
        "processing"
    );
    assert_eq!(
        h.scalar_text("SELECT state || ':' || fencing_token || ':' || lease_owner FROM outbox")
            .await
            .unwrap(),
        "processing:2:w2"
    );
}
both_drivers!(a_worker_whose_lease_is_taken_over_during_the_call_is_fenced_at_transaction_c);

async fn receipts_of_two_operations_may_carry_the_same_receipt_id(db: &Harness) {
    let h = Fixture::new(db).await;
    let mut closed = Vec::new();
    for key in ["refund-1", "refund-2"] {
        let (event, _) = accepted(&h, key).await;
        let (w, mut receipt) = stalled_after_the_downstream(&h, event).await;
        // A downstream that labels two effects alike: each receipt still binds its own
        // operation (status reference, scope, request).
        receipt["receipt_id"] = "rcpt-shared".into();
        closed.push(h.runtime.complete(&w, receipt).await);
    }
    for answer in closed {
        let Ok(Answer::Done { result, .. }) = answer else {
            panic!("{answer:?}");
        };
        assert_eq!(result["receipt_id"], "rcpt-shared");
    }
    assert_eq!(
        h.scalar_int("SELECT count(*) FROM local_receipts WHERE receipt_id = 'rcpt-shared'")
            .await,
        Some(2)
    );
    assert_eq!(
        h.scalar_int("SELECT count(*) FROM operations WHERE state = 'succeeded'")
            .await,
        Some(2)
    );
}
both_drivers!(receipts_of_two_operations_may_carry_the_same_receipt_id);

async fn a_heartbeat_extends_the_lease_until_someone_else_claims(db: &Harness) {
    let h = Fixture::new(db).await;
    let (event, _) = accepted(&h, "refund-1").await;
    let w1 = lease(h.runtime.claim(event, "w1").await.unwrap());
    h.clock.set(T0 + 20);
    let renewed = h.runtime.renew(&w1).await.unwrap();
    assert_eq!(renewed.until, T0 + 50);
    h.clock.set(T0 + 40);
    assert!(matches!(
        h.runtime.claim(event, "w2").await.unwrap(),
        ClaimOutcome::Leased { until } if until == T0 + 50
    ));
    h.clock.set(T0 + 50);
    let w2 = lease(h.runtime.claim(event, "w2").await.unwrap());
    assert!(matches!(
        h.runtime.renew(&renewed).await.unwrap_err(),
        RuntimeError::Fenced(_)
    ));
    assert!(h.runtime.renew(&w2).await.is_ok());
}
both_drivers!(a_heartbeat_extends_the_lease_until_someone_else_claims);

async fn exhausted_attempts_make_the_event_and_operation_dead(db: &Harness) {
    let h = Fixture::new(db).await;
    let (event, status_ref) = accepted(&h, "refund-1").await;
    // max_attempts is 3 in the harness: three claims that never finish.
    for i in 0..3 {
        h.clock.set(T0 + i * 31);
        lease(h.runtime.claim(event, "w").await.unwrap());
    }
    h.clock.set(T0 + 3 * 31);
    assert_eq!(
        h.runtime.claim(event, "w").await.unwrap(),
        ClaimOutcome::Exhausted
    );
    assert_eq!(
        h.scalar_text("SELECT state FROM outbox").await.unwrap(),
        "dead"
    );
    assert_eq!(
        h.scalar_text("SELECT state FROM operations").await.unwrap(),
        "dead"
    );
    assert_eq!(
        h.runtime.claim(event, "w").await.unwrap(),
        ClaimOutcome::Finished {
            state: EventState::Dead
        }
    );
    assert!(h.runtime.ready(10).await.unwrap().is_empty());
    // A dispatch of the dead operation still only reports outcome_unknown.
    let call = h.call("alice", "refund-1", "ord-1", 100);
    assert_eq!(
        h.runtime.dispatch(&call, None).await.unwrap(),
        Answer::Unknown {
            status_ref,
            state: OperationState::Dead
        }
    );
    assert_eq!(h.downstream.submits(), 0);
}
both_drivers!(exhausted_attempts_make_the_event_and_operation_dead);

async fn a_worker_pass_enumerates_pending_events_and_expired_leases(db: &Harness) {
    let h = Fixture::new(db).await;
    let (e1, _) = accepted(&h, "refund-1").await;
    let (e2, _) = accepted(&h, "refund-2").await;
    let (e3, _) = accepted(&h, "refund-3").await;
    // e2 is held by a live lease, e3 by one that will have expired.
    lease(h.runtime.claim(e3, "crashed").await.unwrap());
    h.clock.set(T0 + 10);
    lease(h.runtime.claim(e2, "busy").await.unwrap());
    h.clock.set(T0 + 30);
    assert_eq!(h.runtime.ready(10).await.unwrap(), vec![e1, e3]);
    let summary = h.runtime.run_pass("worker-1", 10).await.unwrap();
    assert_eq!(summary.ready, 2);
    assert_eq!(summary.delivered, 2);
    assert_eq!(
        h.scalar_int("SELECT count(*) FROM outbox WHERE state = 'delivered'")
            .await,
        Some(2)
    );
    assert_eq!(
        h.scalar_text(&format!("SELECT state FROM outbox WHERE id = {e2}"))
            .await
            .unwrap(),
        "processing"
    );
    h.clock.set(T0 + 40);
    let summary = h.runtime.run_pass("worker-1", 10).await.unwrap();
    assert_eq!(summary.delivered, 1);
    assert_eq!(h.count("local_receipts").await, 3);
    assert_eq!(h.downstream_receipts(), 3);
}
both_drivers!(a_worker_pass_enumerates_pending_events_and_expired_leases);

/// A downstream that waits at a gate before delegating, so a test can hold a worker inside
/// its downstream call.
#[derive(Debug)]
struct Gated {
    inner: toolledger_testkit::downstream::SqliteDownstream,
    gate: std::sync::Arc<tokio::sync::Semaphore>,
    waiting: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl toolledger::downstream::Downstream for Gated {
    fn submit<'a>(
        &'a self,
        scope: &'a toolledger::Scope,
        request: &'a serde_json::Value,
    ) -> toolledger::downstream::BoxFuture<
        'a,
        Result<serde_json::Value, toolledger::downstream::DownstreamError>,
    > {
        Box::pin(async move {
            self.waiting
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _permit = self.gate.acquire().await.unwrap();
            self.inner.submit(scope, request).await
        })
    }

    fn status<'a>(
        &'a self,
        status_ref: &'a str,
    ) -> toolledger::downstream::BoxFuture<
        'a,
        Result<Option<serde_json::Value>, toolledger::downstream::DownstreamError>,
    > {
        self.inner.status(status_ref)
    }
}

/// A runtime over the fixture's ledger whose downstream waits at a gate (closed), with leases
/// of `lease_seconds`; and the gate, and the count of calls waiting at it.
fn gated_runtime(
    h: &Fixture<'_>,
    lease_seconds: i64,
) -> (
    toolledger::runtime::Runtime,
    std::sync::Arc<tokio::sync::Semaphore>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::Arc;
    use toolledger::runtime::{ProviderProfile, Registry, Runtime, RuntimeConfig};
    let gated = Gated {
        inner: h.downstream.inner.clone(),
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
        waiting: Arc::default(),
    };
    let (gate, waiting) = (gated.gate.clone(), gated.waiting.clone());
    let registry = Registry::new()
        .register(Arc::new(TestRefund::v("v1")), Arc::new(gated))
        .allow_profile(ProviderProfile::new("openai", "responses", "2026-07-01"));
    let rt = Runtime::new(h.store.clone(), Arc::new(h.clock.clone()), registry).with_config(
        RuntimeConfig {
            lease_seconds,
            max_attempts: 3,
        },
    );
    (rt, gate, waiting)
}

async fn the_lease_is_renewed_while_the_downstream_call_runs(db: &Harness) {
    let h = Fixture::new(db).await;
    let (rt, gate, waiting) = gated_runtime(&h, 3);
    let (event, _) = accepted(&h, "refund-1").await;
    let lease = lease(rt.claim(event, "w1").await.unwrap());
    assert_eq!(lease.until, T0 + 3);
    let worker = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.execute(&lease, None).await })
    };
    while waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // Time passes inside the downstream call; only the heartbeat can move the lease now.
    h.clock.set(T0 + 2);
    while h.scalar_int("SELECT lease_until FROM outbox").await != Some(T0 + 5) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(matches!(
        rt.claim(event, "w2").await.unwrap(),
        ClaimOutcome::Leased { .. }
    ));
    gate.add_permits(1);
    assert!(matches!(
        worker.await.unwrap().unwrap(),
        Processed::Delivered(_)
    ));
}
both_drivers!(the_lease_is_renewed_while_the_downstream_call_runs);

async fn a_processing_operation_is_unsure_once_its_lease_has_ended(db: &Harness) {
    use toolledger::operations::{unsure, unsure_counts, Unsure, UnsureQuery};
    let h = Fixture::new(db).await;
    let (event, status_ref) = accepted(&h, "refund-1").await;
    lease(h.runtime.claim(event, "w1").await.unwrap());
    let store = h.store.clone();
    let look = |now: i64| {
        let store = store.clone();
        async move {
            store
                .read(move |tx| {
                    let q = UnsureQuery {
                        kinds: vec![Unsure::LeaseExpired],
                        now,
                        limit: 10,
                        ..UnsureQuery::default()
                    };
                    let page = unsure(tx, &q)?;
                    let counts = unsure_counts(tx, None, now)?;
                    Ok::<_, toolledger::store::StoreError>((page, counts))
                })
                .await
                .unwrap()
        }
    };
    let count_of = |counts: &[toolledger::operations::UnsureCount]| {
        counts
            .iter()
            .find(|c| c.kind == Unsure::LeaseExpired)
            .map(|c| c.count)
    };
    // A live lease: someone may be calling the downstream right now; not unsure.
    let (page, counts) = look(T0 + 29).await;
    assert!(page.rows.is_empty(), "{page:?}");
    assert_eq!(count_of(&counts), Some(0));
    // Once it has ended: listed, with the lease's end.
    let (page, counts) = look(T0 + 30).await;
    assert_eq!(page.rows.len(), 1);
    assert_eq!(page.rows[0].status_ref, status_ref);
    assert_eq!(page.rows[0].state, OperationState::Processing);
    assert_eq!(page.rows[0].lease_until, Some(T0 + 30));
    assert_eq!(count_of(&counts), Some(1));
    assert_eq!(Unsure::parse("lease_expired"), Some(Unsure::LeaseExpired));
}
both_drivers!(a_processing_operation_is_unsure_once_its_lease_has_ended);
