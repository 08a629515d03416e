//! `toolledger principal add|revoke|list` through the built binary (tokens: cli_principal_tokens.rs).

mod support;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{json, Value};
use sha2::Digest;
use toolledger_testkit::db::sqlite_count;

use support::BIN;

fn run(db: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("principal")
        .args(args)
        .arg("--db")
        .arg(db)
        .output()
        .unwrap()
}

fn ok(db: &Path, args: &[&str]) -> Value {
    let out = run(db, args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.trim().lines().count(), 1, "{stdout}");
    serde_json::from_str(stdout.trim()).unwrap()
}

fn fails(db: &Path, args: &[&str]) -> String {
    let out = run(db, args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).unwrap();
    let v: Value = serde_json::from_str(stderr.trim()).unwrap();
    assert!(!stderr.contains(&*db.to_string_lossy()), "{stderr}");
    v["error"]["code"].as_str().unwrap().to_string()
}

#[test]
fn add_list_revoke_round_trip_with_a_hashed_token() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.sqlite");
    let added = ok(
        &db,
        &[
            "add",
            "alice",
            "--tenant",
            "team-a",
            "--role",
            "editor",
            "--scope",
            "automation:write",
            "--scope",
            "issues:write",
            "--token",
        ],
    );
    let token = added["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("tl_") && token.len() == 67, "{token}");
    assert_eq!(
        added["principal"],
        json!({"name": "alice", "tenant": "team-a", "roles": ["editor"],
               "scopes": ["automation:write", "issues:write"], "active": true, "tokens": 1})
    );
    // Only the hash is stored.
    let stored: String = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT token_sha256 FROM principal_tokens", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(stored, hex::encode(sha2::Sha256::digest(token.as_bytes())));
    let mut bytes = std::fs::read(&db).unwrap();
    if let Ok(wal) = std::fs::read(dir.path().join("p.sqlite-wal")) {
        bytes.extend(wal);
    }
    assert!(
        !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
        "the token itself is never stored"
    );

    let listed = ok(&db, &["list"]);
    assert_eq!(listed["principals"][0]["name"], "alice");
    assert!(!listed.to_string().contains(&token));

    let revoked = ok(&db, &["revoke", "alice", "--scope", "automation:write"]);
    assert_eq!(revoked["principal"]["scopes"], json!(["issues:write"]));
    assert_eq!(revoked["principal"]["active"], true);

    let revoked = ok(&db, &["revoke", "alice", "--all"]);
    assert_eq!(revoked["principal"]["active"], false);
    assert_eq!(revoked["principal"]["tokens"], 0);
    assert_eq!(sqlite_count(&db, "principal_tokens"), 0);

    // Re-adding with other grants needs --replace, which replaces them and re-activates;
    // without --token no token is printed.
    assert_eq!(
        fails(&db, &["add", "alice", "--tenant", "team-b"]),
        "PRINCIPAL_EXISTS"
    );
    let again = ok(&db, &["add", "alice", "--tenant", "team-b", "--replace"]);
    assert_eq!(again["action"], "replaced");
    assert!(again.get("token").is_none());
    assert_eq!(
        again["principal"],
        json!({"name": "alice", "tenant": "team-b", "roles": [], "scopes": [],
               "active": true, "tokens": 0})
    );
}

#[test]
fn bad_input_exits_2_with_a_stable_code_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.sqlite");
    ok(&db, &["add", "alice", "--tenant", "team-a"]);
    for args in [
        &["add", "bad name", "--tenant", "t"][..],
        &["add", "bob", "--tenant", ""],
        &["add", "bob", "--tenant", "t", "--scope", ""],
        &["add", "bob", "--tenant", "t", "--role", "a\tb", "--token"],
        &["add", &"x".repeat(129), "--tenant", "t"],
    ] {
        assert_eq!(fails(&db, args), "INVALID_ARGUMENTS", "{args:?}");
    }
    assert_eq!(fails(&db, &["revoke", "ghost", "--all"]), "NOT_FOUND");
    assert_eq!(fails(&db, &["revoke", "alice"]), "INVALID_ARGUMENTS");
    assert_eq!(sqlite_count(&db, "principals"), 1);
    assert_eq!(sqlite_count(&db, "principal_tokens"), 0);
    // Usage errors (a missing --tenant) are exit 2 as well.
    let out = run(&db, &["add", "carol"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(sqlite_count(&db, "principals"), 1);
}

#[test]
fn an_unusable_database_is_a_stable_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("garbage.sqlite");
    std::fs::write(&db, vec![0x42u8; 8192]).unwrap();
    // `list` opens the ledger read-only: a file that is not a ledger is refused as such.
    assert_eq!(fails(&db, &["list"]), "NOT_A_LEDGER");
    let other = dir.path().join("bound.sqlite");
    assert_eq!(fails(&other, &["list"]), "DATABASE_NOT_FOUND");
    ok(&other, &["add", "alice", "--tenant", "acme"]);
    ok(&other, &["list"]);
    let out = Command::new(BIN)
        .args(["principal", "list", "--backend-id", "elsewhere", "--db"])
        .arg(&other)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(v["error"]["code"], "BACKEND_MISMATCH");
}
