//! Approvals: one approval is consumed once, however many handles race for it.

use serde_json::json;

use toolledger::effect::EffectTx;
use toolledger::model::ErrorCode;

use super::harness::{Harness, T0};

/// Eight handles consuming one approval at once: exactly one consumption.
pub async fn an_approval_is_consumed_once_under_contention(h: &Harness) {
    let store = h.open();
    let ps = toolledger::authz::PrincipalStore::new(store.clone());
    ps.add("alice", "t1", &[], &[], false).await.unwrap();
    ps.add(
        "bob",
        "t1",
        &[toolledger::approval::APPROVER_ROLE.to_string()],
        &[],
        false,
    )
    .await
    .unwrap();
    let target = toolledger::approval::ApprovalTarget {
        tenant: "t1".into(),
        subject: "alice".into(),
        tool: "ship_parcel".into(),
        idempotency_key: "k1".into(),
        binding: json!({"request_digest": "d"}),
    };
    toolledger::approval::grant(&store, "approval-0001", &target, "bob", T0, T0 + 600)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let s = h.open();
        let target = target.clone();
        tasks.push(tokio::spawn(async move {
            s.write(move |tx: &mut dyn EffectTx| {
                toolledger::approval::consume(
                    tx,
                    Some("approval-0001"),
                    &target,
                    T0 + 1,
                    None,
                    &mut |tx, name| toolledger::authz::resolve_in(tx, name),
                )
            })
            .await
        }));
    }
    let mut consumed = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => consumed += 1,
            Err(e) => assert_eq!(e.code, ErrorCode::ApprovalInvalid, "{e:?}"),
        }
    }
    assert_eq!(consumed, 1);
    let a = toolledger::approval::fetch(&store, "approval-0001")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.consumed_at, Some(T0 + 1));
}
