//! The tombstone horizon and approvals, on each driver: the approval a compacted operation
//! consumed outlives its tombstone, still consumed (its id is never issued again), and the
//! tombstone's deletion only unlinks it.

mod runtime_support;

use std::sync::Arc;

use runtime_support::*;
use toolledger::clock::SharedClock;
use toolledger::prune::{self, PruneOptions};
use toolledger::runtime::{Answer, Deadlines};
use toolledger::OperationState;
use toolledger_testkit::db::{count, scalar};

async fn approvals_outlive_their_tombstones_consumed(db: &Harness) {
    let h = Fixture::new(db).await;
    let rt = h.runtime.clone().with_deadlines(Deadlines {
        authority_ttl: None,
        retention_ttl: Some(100),
    });
    let used = h.call("alice", "refund-1", "ord-1", 100);
    h.approve(&used, "bob").await.unwrap();
    let done = rt.dispatch(&used, None).await.unwrap();
    assert!(
        matches!(
            done,
            Answer::Done {
                state: OperationState::Succeeded,
                ..
            }
        ),
        "{done:?}"
    );
    let unused = h.call("alice", "refund-2", "ord-2", 100);
    h.approve(&unused, "bob").await.unwrap(); // valid for an hour, never consumed

    let clock: SharedClock = Arc::new(h.clock.clone());
    let ttl = PruneOptions {
        tombstone_ttl: Some(1_000),
        ..PruneOptions::default()
    };
    let at = |t: i64| {
        h.clock.set(T0 + t);
        prune::prune(&h.store, &clock, &ttl)
    };
    let r = at(100).await.unwrap();
    assert_eq!((r.compacted, r.deleted), (1, 0), "{r:?}");
    assert_eq!(at(1_099).await.unwrap().deleted, 0);
    assert_eq!(at(1_100).await.unwrap().deleted, 1);
    assert_eq!(at(9_999).await.unwrap().deleted, 0);
    assert_eq!(count(&h.store, "operations").await, 0);
    let kept = "SELECT count(*) FROM approvals
                WHERE consumed_at IS NOT NULL AND consumed_operation IS NULL";
    assert_eq!(scalar(&h.store, kept).await, 1, "consumed, unlinked, kept");
    assert_eq!(count(&h.store, "approvals").await, 2);
    // The consumed approval's id is still taken.
    assert!(h.approve(&used, "bob").await.is_err());
    let v = h
        .store
        .read(|tx: &mut dyn toolledger::effect::EffectTx| toolledger::audit::violations(tx))
        .await
        .unwrap();
    assert!(v.is_empty(), "{v:?}");
}

both_drivers!(approvals_outlive_their_tombstones_consumed);
