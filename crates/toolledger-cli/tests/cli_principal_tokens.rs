//! `principal add` on an existing principal, and `principal token add|list|revoke`, through the
//! built binary: grants change only with `--replace`, tokens only through `principal token`,
//! listings never show a token or its hash, and every refused command leaves the ledger file
//! byte-identical.

mod support;

use serde_json::{json, Value};
use sha2::Digest;
use toolledger::authz::PrincipalStore;

use support::runtime::{run, Db};
use support::Run;

/// `principal ARGS… --db <ledger>`.
fn principal(d: &Db, args: &[&str]) -> Run {
    let mut all = vec!["principal"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--db", d.db()]);
    run(&all)
}

fn ok(d: &Db, args: &[&str]) -> Value {
    let r = principal(d, args);
    assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
    assert_eq!(r.stderr, "");
    r.json()
}

/// The `(code, message)` of a refused command (exit 2, nothing on stdout, path-free).
fn refused(d: &Db, args: &[&str]) -> (String, String) {
    let r = principal(d, args);
    assert_eq!(r.code, 2, "{args:?}: {}", r.stdout);
    assert_eq!(r.stdout, "");
    assert!(!r.stderr.contains(d.dir.path().to_str().unwrap()));
    let v: Value = serde_json::from_str(r.stderr.trim()).unwrap();
    (
        v["error"]["code"].as_str().unwrap().to_string(),
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// SHA-256 of the ledger file (the WAL is checkpointed into it when the last connection
/// closes).
fn file_hash(d: &Db) -> String {
    hex::encode(sha2::Sha256::digest(std::fs::read(&d.db).unwrap()))
}

fn alice(d: &Db) -> Value {
    ok(
        d,
        &[
            "add",
            "alice",
            "--tenant",
            "team-a",
            "--role",
            "editor",
            "--scope",
            "automation:write",
            "--token",
        ],
    )
}

/// Whether `token` authenticates a principal of the ledger now.
fn authenticates(d: &Db, token: &str) -> bool {
    let store = toolledger_cli::common::open_store(&d.db, None, false).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(PrincipalStore::new(store).resolve_token(token))
        .unwrap()
        .is_some()
}

#[test]
fn add_on_an_existing_principal_changes_nothing_unless_replace_and_never_touches_tokens() {
    let d = Db::new();
    let first = alice(&d);
    assert_eq!(first["action"], "created");
    assert!(first["token_id"].as_str().unwrap().starts_with("tok_"));
    let before = file_hash(&d);
    // The step that used to drop automation:write silently: another token for alice.
    let (code, message) = refused(
        &d,
        &[
            "add", "alice", "--tenant", "team-a", "--role", "editor", "--token",
        ],
    );
    assert_eq!(code, "PRINCIPAL_EXISTS");
    assert!(message.contains("principal token add alice"), "{message}");
    // Other roles, scopes or tenant.
    for args in [
        &["add", "alice", "--tenant", "team-a", "--role", "editor"][..],
        &[
            "add",
            "alice",
            "--tenant",
            "team-b",
            "--role",
            "editor",
            "--scope",
            "automation:write",
        ],
        &[
            "add",
            "alice",
            "--tenant",
            "team-a",
            "--role",
            "admin",
            "--scope",
            "automation:write",
        ],
    ] {
        let (code, message) = refused(&d, args);
        assert_eq!(code, "PRINCIPAL_EXISTS", "{args:?}");
        assert!(message.contains("--replace"), "{message}");
    }
    // --replace with --token is a usage error: replacing grants never issues tokens.
    let r = principal(
        &d,
        &["add", "alice", "--tenant", "team-a", "--replace", "--token"],
    );
    assert_eq!(r.code, 2);
    assert_eq!(
        serde_json::from_str::<Value>(r.stderr.trim()).unwrap()["error"]["code"],
        "USAGE_ERROR"
    );
    assert_eq!(
        file_hash(&d),
        before,
        "refused commands leave the file byte-identical"
    );

    // The same grants again: nothing to do.
    let same = ok(
        &d,
        &[
            "add",
            "alice",
            "--tenant",
            "team-a",
            "--role",
            "editor",
            "--scope",
            "automation:write",
        ],
    );
    assert_eq!(same["action"], "unchanged");
    assert_eq!(same["principal"]["tokens"], 1);

    // --replace replaces exactly the grants; the token stays and still authenticates.
    let replaced = ok(
        &d,
        &[
            "add",
            "alice",
            "--tenant",
            "team-a",
            "--role",
            "viewer",
            "--replace",
        ],
    );
    assert_eq!(replaced["action"], "replaced");
    assert_eq!(
        replaced["principal"],
        json!({"name": "alice", "tenant": "team-a", "roles": ["viewer"], "scopes": [],
               "active": true, "tokens": 1})
    );
    assert!(replaced.get("token").is_none());
    assert!(authenticates(&d, first["token"].as_str().unwrap()));
}

#[test]
fn a_deactivated_principal_comes_back_with_the_same_grants_and_no_tokens() {
    let d = Db::new();
    let first = alice(&d);
    ok(&d, &["revoke", "alice", "--all"]);
    let before = file_hash(&d);
    let (code, message) = refused(&d, &["token", "add", "alice"]);
    assert_eq!(code, "PRINCIPAL_INACTIVE");
    assert!(message.contains("principal add"), "{message}");
    assert_eq!(file_hash(&d), before);
    let back = ok(
        &d,
        &[
            "add",
            "alice",
            "--tenant",
            "team-a",
            "--role",
            "editor",
            "--scope",
            "automation:write",
        ],
    );
    assert_eq!(back["action"], "reactivated");
    assert_eq!(back["principal"]["active"], true);
    assert_eq!(back["principal"]["tokens"], 0);
    assert!(!authenticates(&d, first["token"].as_str().unwrap()));
}

#[test]
fn tokens_are_added_listed_by_id_and_revoked_one_at_a_time() {
    let d = Db::new();
    let first = alice(&d);
    let second = ok(&d, &["token", "add", "alice"]);
    let (t1, t2) = (
        first["token"].as_str().unwrap().to_string(),
        second["token"].as_str().unwrap().to_string(),
    );
    assert!(t2.starts_with("tl_") && t2.len() == 67, "{t2}");
    assert_ne!(t1, t2);
    assert_eq!(second["principal"], "alice");
    assert!(second["created_at"].is_i64());
    let (id1, id2) = (
        first["token_id"].as_str().unwrap().to_string(),
        second["token_id"].as_str().unwrap().to_string(),
    );
    assert_ne!(id1, id2);
    // The scope the README's HTTP step needs is still there.
    let entry = ok(&d, &["list"]);
    assert_eq!(
        entry["principals"][0]["scopes"],
        json!(["automation:write"])
    );
    assert_eq!(entry["principals"][0]["tokens"], 2);

    let listed = principal(&d, &["token", "list", "alice"]);
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let v = listed.json();
    assert_eq!(v["principal"], "alice");
    let tokens = v["tokens"].as_array().unwrap();
    let mut ids: Vec<&str> = tokens.iter().map(|t| t["id"].as_str().unwrap()).collect();
    ids.sort();
    let mut expected = vec![id1.as_str(), id2.as_str()];
    expected.sort();
    assert_eq!(ids, expected);
    for t in tokens {
        let keys: Vec<&String> = t.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["created_at", "id"]);
    }
    // Neither the tokens nor their stored hashes are ever listed.
    for token in [&t1, &t2] {
        let hash = hex::encode(sha2::Sha256::digest(token.as_bytes()));
        assert!(!listed.stdout.contains(token.as_str()));
        assert!(!listed.stdout.contains(&hash));
        assert!(!listed.stdout.contains(&hash[..16]));
    }

    assert!(authenticates(&d, &t1) && authenticates(&d, &t2));
    let revoked = ok(&d, &["token", "revoke", "alice", &id1]);
    assert_eq!(
        revoked,
        json!({"principal": "alice", "revoked": id1, "tokens": 1})
    );
    assert!(!authenticates(&d, &t1), "a revoked token stops at once");
    assert!(authenticates(&d, &t2), "the other token keeps working");
    let after = principal(&d, &["token", "list", "alice"]).json();
    assert_eq!(after["tokens"].as_array().unwrap().len(), 1);
    assert_eq!(after["tokens"][0]["id"], id2.as_str());

    let before = file_hash(&d);
    let (code, message) = refused(&d, &["token", "revoke", "alice", &id1]);
    assert_eq!(code, "TOKEN_NOT_FOUND");
    assert!(message.contains("principal token list alice"), "{message}");
    assert_eq!(
        refused(&d, &["token", "revoke", "bob", &id2]).0,
        "NOT_FOUND"
    );
    assert_eq!(refused(&d, &["token", "list", "bob"]).0, "NOT_FOUND");
    assert_eq!(refused(&d, &["token", "add", "bob"]).0, "NOT_FOUND");
    assert_eq!(
        file_hash(&d),
        before,
        "refused commands leave the file byte-identical"
    );
}

#[test]
fn token_commands_on_a_missing_ledger_create_nothing() {
    let d = Db::new();
    for args in [
        &["token", "add", "alice"][..],
        &["token", "list", "alice"],
        &["token", "revoke", "alice", "tok_0000000000000000"],
        &["revoke", "alice", "--all"],
    ] {
        let (code, message) = refused(&d, args);
        assert_eq!(code, "DATABASE_NOT_FOUND", "{args:?}");
        assert!(message.contains("--db"), "{message}");
        assert!(!d.db.exists(), "{args:?}: no ledger is created");
    }
}
