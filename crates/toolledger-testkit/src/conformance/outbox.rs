//! The outbox: claims, leases and fencing tokens, racing claims, draining a backlog, and events
//! whose attempts run out.

use toolledger::model::OperationState;
use toolledger::outbox::ClaimOutcome;
use toolledger::runtime::{Answer, Delivery, Processed, RuntimeError};

use super::harness::{accept_new, ship, Harness, World};
use crate::db::count;

/// Claims take a lease and a strictly increasing fencing token; an unexpired lease is not
/// taken over, an expired one is; the stale holder's writes are fenced and change nothing.
pub async fn claims_leases_and_fencing(h: &Harness) {
    let w = World::new(h).await;
    let rt = w.runtime(h);
    let (event_id, status_ref) = accept_new(&rt, &ship("k1", "p1")).await;
    let ClaimOutcome::Claimed(first) = rt.claim(event_id, "w1").await.unwrap() else {
        panic!("first claim");
    };
    assert!(matches!(
        rt.claim(event_id, "w2").await.unwrap(),
        ClaimOutcome::Leased { .. }
    ));
    w.clock.set(first.until);
    let other = w.runtime(h);
    let ClaimOutcome::Claimed(second) = other.claim(event_id, "w2").await.unwrap() else {
        panic!("reclaim after expiry");
    };
    assert!(second.token > first.token);
    assert_eq!(second.attempt, 2);
    assert!(matches!(
        rt.renew(&first).await,
        Err(RuntimeError::Fenced(_))
    ));
    let receipt = w.submit_directly(&rt, &status_ref).await;
    assert!(matches!(
        rt.complete(&first, receipt.clone()).await,
        Err(RuntimeError::Fenced(_))
    ));
    assert_eq!(count(rt.store(), "local_receipts").await, 0);
    let done = other.complete(&second, receipt).await.unwrap();
    assert!(matches!(
        done,
        Answer::Done {
            delivery: Delivery::Fresh,
            ..
        }
    ));
    assert_eq!(count(rt.store(), "local_receipts").await, 1);
    assert!(matches!(
        rt.claim(event_id, "w3").await.unwrap(),
        ClaimOutcome::Finished { .. }
    ));
}

/// Eight workers on eight handles claiming one event: exactly one claim.
pub async fn eight_workers_claim_one_event(h: &Harness) {
    let w = World::new(h).await;
    let rt = w.runtime(h);
    let (event_id, _) = accept_new(&rt, &ship("k1", "p1")).await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let rt = w.runtime(h);
        tasks.push(tokio::spawn(async move {
            rt.claim(event_id, &format!("w{i}")).await
        }));
    }
    let mut claimed = 0;
    for t in tasks {
        match t.await.unwrap().unwrap() {
            ClaimOutcome::Claimed(lease) => {
                assert_eq!(lease.token, 1);
                claimed += 1;
            }
            ClaimOutcome::Leased { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(claimed, 1);
}

/// Two workers draining one backlog deliver every event exactly once.
pub async fn worker_pass_delivers_the_backlog(h: &Harness) {
    let w = World::new(h).await;
    let rt = w.runtime(h);
    for i in 1..=6 {
        rt.accept(&ship(&format!("k{i}"), &format!("p{i}")))
            .await
            .unwrap();
    }
    let a = w.runtime(h);
    let b = w.runtime(h);
    let (ra, rb) = tokio::join!(a.run_pass("wa", 100), b.run_pass("wb", 100));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra.delivered + rb.delivered, 6, "{ra:?} {rb:?}");
    assert_eq!(w.downstream.receipts(), 6);
    assert_eq!(count(rt.store(), "local_receipts").await, 6);
    let again = rt.run_pass("wc", 100).await.unwrap();
    assert_eq!(again.ready, 0);
    let processed = rt.process(1, "wc", None).await.unwrap();
    assert!(matches!(
        processed,
        Processed::NotClaimed(ClaimOutcome::Finished { .. })
    ));
}

/// Claims beyond `max_attempts` move the event and its operation to `dead`.
pub async fn attempts_exhausted_go_dead(h: &Harness) {
    let w = World::new(h).await;
    let rt = w
        .runtime(h)
        .with_config(toolledger::runtime::RuntimeConfig {
            lease_seconds: 10,
            max_attempts: 2,
        });
    let (event_id, status_ref) = accept_new(&rt, &ship("k1", "p1")).await;
    for round in 1..=2 {
        let ClaimOutcome::Claimed(lease) = rt.claim(event_id, "w").await.unwrap() else {
            panic!("claim {round}");
        };
        assert_eq!(lease.attempt, round);
        w.clock.set(lease.until);
    }
    assert_eq!(
        rt.claim(event_id, "w").await.unwrap(),
        ClaimOutcome::Exhausted
    );
    let rec = rt.inspect(&status_ref).await.unwrap().unwrap();
    assert_eq!(rec.state, OperationState::Dead);
    assert!(matches!(
        rt.claim(event_id, "w").await.unwrap(),
        ClaimOutcome::Finished { .. }
    ));
    assert_eq!(w.downstream.submits(), 0);
}
