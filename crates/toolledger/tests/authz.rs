//! The principal store on each driver (SQLite and PostgreSQL, through the conformance
//! [`Harness`]): principals, roles and scopes re-read on every check, bearer tokens stored
//! hashed.

use std::collections::BTreeSet;

use toolledger::authz::*;
use toolledger::model::ErrorCode;
use toolledger_testkit::both_drivers;
use toolledger_testkit::conformance::Harness;

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

async fn add_resolve_revoke_and_tokens(h: &Harness) {
    let ps = PrincipalStore::new(h.open());
    let token = ps
        .add(
            "alice",
            "team-a",
            &s(&["editor"]),
            &s(&["automation:write", "x"]),
            true,
        )
        .await
        .unwrap()
        .unwrap();
    assert!(token.starts_with("tl_") && token.len() == 67);
    let p = ps.resolve("alice").await.unwrap().unwrap();
    assert_eq!(p.tenant, "team-a");
    assert_eq!(p.subject, "alice");
    assert!(p.has_scope("automation:write") && p.has_role("editor"));
    let (name, via_token) = ps.resolve_token(&token).await.unwrap().unwrap();
    assert_eq!(name, "alice");
    assert_eq!(via_token, p);
    assert!(ps.resolve_token("tl_00").await.unwrap().is_none());
    assert!(ps.resolve("bob").await.unwrap().is_none());

    let e = ps
        .revoke("alice", &[], &s(&["automation:write"]), false)
        .await
        .unwrap();
    assert_eq!(e.scopes, BTreeSet::from(["x".to_string()]));
    assert!(e.active);
    assert!(!ps
        .resolve("alice")
        .await
        .unwrap()
        .unwrap()
        .has_scope("automation:write"));

    let e = ps.revoke("alice", &[], &[], true).await.unwrap();
    assert!(!e.active);
    assert_eq!(e.tokens, 0);
    assert!(ps.resolve("alice").await.unwrap().is_none());
    assert!(ps.resolve_token(&token).await.unwrap().is_none());

    // Re-adding replaces the sets and re-activates.
    assert!(ps
        .add("alice", "team-b", &[], &s(&["y"]), false)
        .await
        .unwrap()
        .is_none());
    let p = ps.resolve("alice").await.unwrap().unwrap();
    assert_eq!(p.tenant, "team-b");
    assert_eq!(p.scopes, BTreeSet::from(["y".to_string()]));
    assert!(p.roles.is_empty());
    assert_eq!(ps.list().await.unwrap().len(), 1);
}

async fn bad_input_is_refused_and_writes_nothing(h: &Harness) {
    let ps = PrincipalStore::new(h.open());
    for (name, tenant, scope) in [
        ("", "t", "s"),
        ("a b", "t", "s"),
        ("a", "", "s"),
        ("a", "t", ""),
        ("a", "t", "bad\nscope"),
    ] {
        let err = ps
            .add(name, tenant, &[], &s(&[scope]), true)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArguments, "{name:?} {tenant:?}");
    }
    assert!(ps.list().await.unwrap().is_empty());
    let err = ps.revoke("ghost", &[], &[], true).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::NotFound);
    ps.add("a", "t", &[], &[], false).await.unwrap();
    let err = ps.revoke("a", &[], &[], false).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidArguments);
}

both_drivers!(
    add_resolve_revoke_and_tokens,
    bad_input_is_refused_and_writes_nothing,
);
