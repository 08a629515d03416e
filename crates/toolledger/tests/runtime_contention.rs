//! Eight store handles (eight writer connections) contending for one scope and one event.
//! This proves local uniqueness in one database (a SQLite file, or a PostgreSQL schema); it says
//! nothing about distributed exactly-once delivery.

mod runtime_support;

use runtime_support::*;
use toolledger::outbox::ClaimOutcome;
use toolledger::runtime::{Accepted, RuntimeError};
use toolledger::ErrorCode;

async fn eight_handles_reserving_the_same_intent_create_one_intent(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    let runtimes: Vec<_> = (0..8).map(|_| h.second_runtime("v1")).collect();
    let tasks: Vec<_> = runtimes
        .into_iter()
        .map(|rt| {
            let call = call.clone();
            tokio::spawn(async move { rt.accept(&call).await })
        })
        .collect();
    let mut new = 0;
    let mut refs = std::collections::BTreeSet::new();
    for t in tasks {
        match t.await.unwrap().unwrap() {
            Accepted::New { status_ref, .. } => {
                new += 1;
                refs.insert(status_ref);
            }
            Accepted::Existing { status_ref, .. } => {
                refs.insert(status_ref);
            }
        }
    }
    assert_eq!(new, 1);
    assert_eq!(refs.len(), 1, "every caller sees the one status ref");
    assert_eq!(h.counts().await, (1, 1, 1, 0, 1));
}
both_drivers!(eight_handles_reserving_the_same_intent_create_one_intent);

async fn eight_different_intents_under_one_key_have_one_winner(db: &Harness) {
    let h = Fixture::new(db).await;
    let mut calls = Vec::new();
    for i in 0..8 {
        let mut call = h.call("alice", "refund-1", "ord-1", 100 + i);
        call.approval_id = Some(format!("approval-contender-{i}"));
        h.approve(&call, "bob").await.unwrap();
        calls.push(call);
    }
    let tasks: Vec<_> = calls
        .into_iter()
        .map(|call| {
            let rt = h.second_runtime("v1");
            tokio::spawn(async move { rt.accept(&call).await })
        })
        .collect();
    let (mut won, mut conflicts) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(Accepted::New { .. }) => won += 1,
            Err(RuntimeError::Refused(e)) if e.code == ErrorCode::OperationConflict => {
                conflicts += 1
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((won, conflicts), (1, 7));
    assert_eq!(
        h.counts().await,
        (1, 1, 1, 0, 1),
        "only the winner's approval is consumed"
    );
}
both_drivers!(eight_different_intents_under_one_key_have_one_winner);

async fn eight_workers_claiming_one_event_get_one_claim(db: &Harness) {
    let h = Fixture::new(db).await;
    let call = h.call("alice", "refund-1", "ord-1", 1250);
    h.approve(&call, "bob").await.unwrap();
    let Accepted::New { event_id, .. } = h.runtime.accept(&call).await.unwrap() else {
        panic!()
    };
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let rt = h.second_runtime("v1");
            tokio::spawn(async move { rt.claim(event_id, &format!("worker-{i}")).await })
        })
        .collect();
    let mut claimed = Vec::new();
    for t in tasks {
        if let ClaimOutcome::Claimed(lease) = t.await.unwrap().unwrap() {
            claimed.push(lease);
        }
    }
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].token, 1);
    assert_eq!(
        h.scalar_int("SELECT attempt_count FROM outbox").await,
        Some(1)
    );
}
both_drivers!(eight_workers_claiming_one_event_get_one_claim);
