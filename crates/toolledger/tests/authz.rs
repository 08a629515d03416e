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

async fn ensure_creates_a_missing_principal_and_never_reactivates_one(h: &Harness) {
    let ps = PrincipalStore::new(h.open());
    assert_eq!(ps.ensure("carol", "local").await.unwrap(), Ensured::Created);
    let created = ps.entry("carol").await.unwrap().unwrap();
    assert_eq!(created.tenant, "local");
    assert!(created.active && created.roles.is_empty() && created.scopes.is_empty());
    assert_eq!(created.tokens, 0);
    // An existing principal is used as it is, whatever its grants and tenant.
    ps.add("dave", "team-a", &s(&["editor"]), &[], false)
        .await
        .unwrap();
    assert_eq!(ps.ensure("dave", "local").await.unwrap(), Ensured::Active);
    let dave = ps.entry("dave").await.unwrap().unwrap();
    assert_eq!(dave.tenant, "team-a");
    assert!(dave.roles.contains("editor"));
    // A deactivated one stays deactivated: only an operator re-activates it.
    ps.revoke("dave", &[], &[], true).await.unwrap();
    assert_eq!(ps.ensure("dave", "local").await.unwrap(), Ensured::Inactive);
    assert!(ps.resolve("dave").await.unwrap().is_none());
    // Its name is checked like any other.
    let bad = ps.ensure("bad name", "local").await.unwrap_err();
    assert_eq!(bad.code, ErrorCode::InvalidArguments);
    assert!(ps.entry("bad name").await.unwrap().is_none());
}

both_drivers!(
    add_resolve_revoke_and_tokens,
    bad_input_is_refused_and_writes_nothing,
    ensure_creates_a_missing_principal_and_never_reactivates_one,
);
