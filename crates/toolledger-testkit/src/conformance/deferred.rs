//! The deferred-effect runtime end to end: the intent and its outbox event committing together,
//! dispatch of an unfinished operation, transaction C, racing accepts, and a worker racing a
//! status query.

use toolledger::effect::{EffectTx, RowExt};
use toolledger::model::{Error, ErrorCode, OperationState};
use toolledger::outbox::ClaimOutcome;
use toolledger::runtime::{Accepted, Answer, Delivery, RuntimeError, StatusQuery};

use super::harness::{accept_new, refused, ship, Harness, World};
use crate::db::{count, scalar};

/// Transaction A writes the operation, its intent context and its outbox event together; an
/// injected failure on the outbox insert leaves none of them.
pub async fn intent_and_outbox_commit_together(h: &Harness) {
    let w = World::new(h).await;
    let rt = w.runtime(h);
    h.fail_inserts_into(rt.store(), "outbox").await;
    let err = rt.accept(&ship("k1", "p1")).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Store(_)), "{err:?}");
    for table in [
        "operations",
        "deferred_intents",
        "outbox",
        "operation_events",
    ] {
        assert_eq!(count(rt.store(), table).await, 0, "{table}");
    }
    h.allow_inserts_into(rt.store(), "outbox").await;
    let (_, status_ref) = accept_new(&rt, &ship("k1", "p1")).await;
    let rec = rt.inspect(&status_ref).await.unwrap().unwrap();
    assert_eq!(rec.state, OperationState::Accepted);
    assert_eq!(count(rt.store(), "outbox").await, 1);
    assert!(matches!(
        rt.accept(&ship("k1", "p1")).await.unwrap(),
        Accepted::Existing { .. }
    ));
    assert_eq!(
        refused(rt.accept(&ship("k1", "p2")).await.unwrap_err()),
        ErrorCode::OperationConflict
    );
    assert_eq!(count(rt.store(), "outbox").await, 1);
    assert_eq!(w.downstream.submits(), 0);
}

/// A crash after the downstream committed leaves `outcome_unknown`; dispatching again only
/// observes (no worker, no downstream call); an explicit status query reconciles the receipt
/// (`receipt_reconciled`) and later replays are local.
pub async fn dispatch_of_unfinished_only_observes_and_status_reconciles(h: &Harness) {
    let w = World::new(h).await;
    let rt = w.runtime(h);
    let call = ship("k1", "p1");
    let first = rt
        .dispatch(
            &call,
            Some(toolledger::runtime::CrashPoint::AfterDownstreamCommit),
        )
        .await
        .unwrap();
    let Answer::Unknown { status_ref, .. } = first else {
        panic!("expected outcome_unknown");
    };
    assert_eq!((w.downstream.submits(), w.downstream.receipts()), (1, 1));
    let again = w.runtime(h).dispatch(&call, None).await.unwrap();
    assert!(matches!(&again, Answer::Unknown { status_ref: s, .. } if *s == status_ref));
    assert_eq!((w.downstream.submits(), w.downstream.statuses()), (1, 0));
    let query = StatusQuery {
        principal: "alice".into(),
        tool: "ship_parcel".into(),
        key: "k1".into(),
        arguments: call.arguments.clone(),
        provider: call.provider.clone(),
        status_ref: status_ref.clone(),
    };
    let answer = rt.status(&query).await.unwrap();
    assert!(matches!(
        answer,
        Answer::Done {
            delivery: Delivery::ReceiptReconciled,
            state: OperationState::Succeeded,
            ..
        }
    ));
    assert_eq!(count(rt.store(), "local_receipts").await, 1);
    let replay = rt.dispatch(&call, None).await.unwrap();
    assert!(matches!(
        replay,
        Answer::Done {
            delivery: Delivery::LocalReplay,
            ..
        }
    ));
    assert_eq!(w.downstream.submits(), 1);
}

/// Transaction C (receipt + succeeded + delivered) rolls back as a unit.
pub async fn transaction_c_rolls_back_as_a_unit(h: &Harness) {
    let w = World::new(h).await;
    let rt = w.runtime(h);
    let (event_id, status_ref) = accept_new(&rt, &ship("k1", "p1")).await;
    h.fail_inserts_into(rt.store(), "local_receipts").await;
    let err = rt.process(event_id, "w1", None).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Store(_)), "{err:?}");
    let rec = rt.inspect(&status_ref).await.unwrap().unwrap();
    assert_eq!(rec.state, OperationState::Processing);
    assert_eq!(count(rt.store(), "local_receipts").await, 0);
    let delivered = scalar(
        rt.store(),
        "SELECT count(*) FROM outbox WHERE state = 'delivered'",
    )
    .await;
    assert_eq!(delivered, 0);
    h.allow_inserts_into(rt.store(), "local_receipts").await;
}

/// Eight handles accepting one intent: one new intent, the rest see it; different intents
/// under one key: one winner, the rest conflict. One outbox event each time.
pub async fn eight_handles_accept_one_intent(h: &Harness) {
    let w = World::new(h).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let rt = w.runtime(h);
        tasks.push(tokio::spawn(
            async move { rt.accept(&ship("same", "p1")).await },
        ));
    }
    let mut new = 0;
    for t in tasks {
        if let Accepted::New { .. } = t.await.unwrap().unwrap() {
            new += 1;
        }
    }
    assert_eq!(new, 1);
    let mut tasks = Vec::new();
    for i in 1..=8 {
        let rt = w.runtime(h);
        tasks.push(tokio::spawn(async move {
            // Contention on one key, not a re-plan: each says it is a new intent, so the
            // re-plan guard (tested on its own) does not compare it with the first intent.
            let mut call = ship("contested", &format!("p{i}"));
            call.new_intent = true;
            rt.accept(&call).await
        }));
    }
    let (mut won, mut conflicts) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(Accepted::New { .. }) => won += 1,
            Ok(other) => panic!("unexpected {other:?}"),
            Err(e) => {
                assert_eq!(refused(e), ErrorCode::OperationConflict);
                conflicts += 1;
            }
        }
    }
    assert_eq!((won, conflicts), (1, 7));
    let store = h.open();
    assert_eq!(count(&store, "outbox").await, 2);
    assert_eq!(count(&store, "operations").await, 2);
}

/// The re-plan guard: while an intent is unsettled (here `accepted`, not sent), the same
/// intent under a new key is `possible_duplicate` naming it, and nothing is recorded; a new
/// intent flag, other arguments, an earlier operation older than the window, or the guard
/// turned off let it through.
pub async fn a_replan_of_an_unsettled_intent_is_a_possible_duplicate(h: &Harness) {
    let w = World::new(h).await;
    let rt = w.runtime(h);
    let first = rt.accept(&ship("first", "p2")).await.unwrap();
    assert!(matches!(first, Accepted::New { .. }), "{first:?}");
    let store = h.open();
    let e = Error::from(rt.accept(&ship("second", "p2")).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::PossibleDuplicate, "{e}");
    let earlier = e.earlier.expect("the earlier operation is named");
    assert_eq!(earlier.operation_id, "first");
    assert_eq!(earlier.state, "accepted");
    assert!(earlier.status_ref.starts_with("op_"), "{earlier:?}");
    assert_eq!(count(&store, "operations").await, 1, "nothing recorded");
    assert_eq!(count(&store, "outbox").await, 1);
    let mut again = ship("second", "p2");
    again.new_intent = true;
    assert!(matches!(
        rt.accept(&again).await.unwrap(),
        Accepted::New { .. }
    ));
    assert!(matches!(
        rt.accept(&ship("third", "p3")).await.unwrap(),
        Accepted::New { .. }
    ));
    // Off: the same intent under yet another key is accepted.
    let off = w.runtime(h).with_replan_window(None);
    assert!(matches!(
        off.accept(&ship("fourth", "p3")).await.unwrap(),
        Accepted::New { .. }
    ));
    // Older than the window: the earlier operations no longer block.
    let narrow = w.runtime(h).with_replan_window(Some(60));
    let e = Error::from(narrow.accept(&ship("fifth", "p2")).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::PossibleDuplicate, "{e}");
    w.clock.advance(61);
    assert!(matches!(
        narrow.accept(&ship("fifth", "p2")).await.unwrap(),
        Accepted::New { .. }
    ));
    assert_eq!(count(&store, "operations").await, 5);
}

/// A worker's transaction C and an explicit status query racing for one operation: one local
/// receipt; the status query answers succeeded either way.
pub async fn worker_and_status_query_reconcile_once(h: &Harness) {
    let w = World::new(h).await;
    let rt = w.runtime(h);
    for round in 1..=4 {
        let key = format!("race-{round}");
        let call = ship(&key, &format!("p{round}"));
        let (event_id, status_ref) = accept_new(&rt, &call).await;
        let ClaimOutcome::Claimed(lease) = rt.claim(event_id, "w").await.unwrap() else {
            panic!("claim");
        };
        let receipt = w.submit_directly(&rt, &status_ref).await;
        let query = StatusQuery {
            principal: "alice".into(),
            tool: "ship_parcel".into(),
            key: key.clone(),
            arguments: call.arguments.clone(),
            provider: call.provider.clone(),
            status_ref: status_ref.clone(),
        };
        let worker = w.runtime(h);
        let observer = w.runtime(h);
        let (done, answered) = tokio::join!(
            tokio::spawn(async move { worker.complete(&lease, receipt).await }),
            tokio::spawn(async move { observer.status(&query).await })
        );
        match done.unwrap() {
            Ok(_) | Err(RuntimeError::Fenced(_)) => {}
            Err(other) => panic!("worker: {other:?}"),
        }
        let answered = answered.unwrap().unwrap();
        assert!(
            matches!(
                answered,
                Answer::Done {
                    state: OperationState::Succeeded,
                    ..
                }
            ),
            "{answered:?}"
        );
        let receipts = rt
            .store()
            .read(move |tx: &mut dyn EffectTx| {
                tx.query_opt(
                    "SELECT count(*) FROM local_receipts r JOIN operations o ON o.id = r.operation_id
                     WHERE o.status_ref = ?1",
                    &[status_ref.as_str().into()],
                )?
                .expect("row")
                .int(0)
            })
            .await
            .unwrap();
        assert_eq!(receipts, 1);
    }
}
