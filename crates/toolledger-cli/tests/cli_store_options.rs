//! Store options every command shares: `--sqlite-synchronous` is a SQLite setting, refused with
//! `--database-url`, and a server opened with `normal` serves calls.

#[macro_use]
mod support;

use std::process::{Command, Stdio};

use serde_json::json;
use support::wire::*;

fn toolledger() -> Command {
    let mut c = support::toolledger();
    c.env_remove("TOOLLEDGER_DATABASE_URL")
        .env_remove("TOOLLEDGER_SQLITE_SYNCHRONOUS");
    c
}

#[test]
fn sqlite_synchronous_is_refused_with_a_database_url() {
    for args in [
        &["serve", "--sqlite-synchronous", "normal"][..],
        &["worker", "--once", "--sqlite-synchronous", "normal"][..],
        &["audit", "--sqlite-synchronous", "normal"][..],
    ] {
        let out = toolledger()
            .args(args)
            .args(["--database-url", "postgres://u@127.0.0.1:1/db"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cannot be used with"), "{args:?}: {err}");
        assert!(!err.contains("u@127.0.0.1"), "no URL in the message: {err}");
    }
}

#[test]
fn an_unknown_synchronous_mode_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = toolledger()
        .args(["audit", "--sqlite-synchronous", "off", "--db"])
        .arg(dir.path().join("x.sqlite"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(!dir.path().join("x.sqlite").exists(), "nothing was created");
}

#[test]
fn a_server_with_synchronous_normal_answers_and_replays_calls() {
    let db = Db::sqlite();
    let mut s = Server::start(&db, "alice", &["--sqlite-synchronous", "normal"]);
    let args = json!({"request_id": "req-n1", "interval_minutes": 30});
    let created = s.call("create_automation", args.clone());
    assert_eq!(created["isError"], false, "{created}");
    assert_eq!(created["structuredContent"]["replayed"], false);
    let again = s.call("create_automation", args);
    assert_eq!(again["structuredContent"]["replayed"], true, "{again}");
    assert_eq!(
        again["structuredContent"]["id"],
        created["structuredContent"]["id"]
    );
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "operations"), 1);
    assert_eq!(count(&db, "automations"), 1);
}

/// A ledger and the payments stand-in's file hold arguments in plain text: whatever the umask,
/// the files a command creates (and SQLite's log beside them) are the owner's alone.
#[cfg(unix)]
#[test]
fn new_databases_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.sqlite");
    let out = toolledger()
        .args(["principal", "add", "alice", "--tenant", "acme", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = toolledger()
        .args(["worker", "--once", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".sqlite") || name.ends_with("-wal") || name.ends_with("-shm") {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{name} is {mode:o}");
            seen += 1;
        }
    }
    assert!(
        dir.path().join("ledger.sqlite.downstream.sqlite").exists(),
        "the worker opened the stand-in's file"
    );
    assert!(seen >= 2, "{seen}");
}
