//! The principal store: re-read on every check, revocations that race, and the worker's
//! recheck of the principal before it calls the downstream.

use toolledger::model::{ErrorCode, OperationState};

use super::harness::{accept_new, refused, ship, Harness, World};
use crate::db::{count, scalar};

/// The principal store re-reads every check: revocation takes effect at the next call.
pub async fn principal_store_is_reread(h: &Harness) {
    let ps = toolledger::authz::PrincipalStore::new(h.open());
    let token = ps
        .add(
            "alice",
            "t1",
            &["editor".to_string()],
            &["a:w".to_string()],
            true,
        )
        .await
        .unwrap()
        .unwrap();
    let other = toolledger::authz::PrincipalStore::new(h.open());
    assert!(other
        .resolve("alice")
        .await
        .unwrap()
        .unwrap()
        .has_scope("a:w"));
    assert_eq!(
        other.resolve_token(&token).await.unwrap().unwrap().0,
        "alice"
    );
    ps.revoke("alice", &[], &["a:w".to_string()], false)
        .await
        .unwrap();
    assert!(!other
        .resolve("alice")
        .await
        .unwrap()
        .unwrap()
        .has_scope("a:w"));
    ps.revoke("alice", &[], &[], true).await.unwrap();
    assert!(other.resolve("alice").await.unwrap().is_none());
    assert!(other.resolve_token(&token).await.unwrap().is_none());
    assert_eq!(other.list().await.unwrap().len(), 1);
}

/// Eight handles each revoking a different scope of one principal at once: every scope is
/// gone afterwards (no lost update).
pub async fn concurrent_revocations_lose_nothing(h: &Harness) {
    let ps = toolledger::authz::PrincipalStore::new(h.open());
    let scopes: Vec<String> = (0..8).map(|i| format!("s{i}")).collect();
    ps.add("alice", "t1", &[], &scopes, false).await.unwrap();
    let mut tasks = Vec::new();
    for scope in scopes {
        let other = toolledger::authz::PrincipalStore::new(h.open());
        tasks.push(tokio::spawn(async move {
            other.revoke("alice", &[], &[scope], false).await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let entry = ps.entry("alice").await.unwrap().unwrap();
    assert!(entry.scopes.is_empty(), "{:?}", entry.scopes);
    assert!(entry.active);
}

/// Before the downstream effect the worker re-reads the principal: after revocation there is
/// no downstream call, no receipt, and the refusal is recorded.
pub async fn worker_rechecks_the_principal_before_the_downstream(h: &Harness) {
    let w = World::new(h).await;
    let rt = w.runtime(h);
    let (event_id, status_ref) = accept_new(&rt, &ship("k1", "p1")).await;
    toolledger::authz::PrincipalStore::new(h.open())
        .revoke("alice", &[], &[], true)
        .await
        .unwrap();
    let err = rt.process(event_id, "w", None).await.unwrap_err();
    assert_eq!(refused(err), ErrorCode::PermissionDenied);
    assert_eq!(w.downstream.submits(), 0);
    assert_eq!(count(rt.store(), "local_receipts").await, 0);
    let rec = rt.inspect(&status_ref).await.unwrap().unwrap();
    assert_eq!(rec.state, OperationState::Processing);
    let refusals = scalar(
        rt.store(),
        "SELECT count(*) FROM operation_events WHERE kind = 'attempt_refused'",
    )
    .await;
    assert_eq!(refusals, 1);
}
