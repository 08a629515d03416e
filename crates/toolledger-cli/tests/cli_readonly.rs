//! Read-only inspection: `audit`, `operations list|show`, `principal list` and `status
//! --status-ref` (without a fixture) open the ledger read-only. They refuse a file that holds no
//! ledger (`NOT_A_LEDGER`) or none at all (`DATABASE_NOT_FOUND`), work on a read-only copy and
//! on a ledger a server holds open, never create a file, never migrate and never add the
//! reference tools' tables: every directory is hashed before and after.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use support::runtime::*;
use toolledger::effect::{EffectTx, RowExt};
use toolledger::store::postgres::PgStore;
use toolledger_testkit::db::PgSchema;

/// Every file under `dir` (recursively) with the SHA-256 of its bytes, sorted by path.
fn snapshot(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                out.push((p, hex::encode(Sha256::digest(&bytes))));
            }
        }
    }
    out.sort();
    out
}

/// The read-only commands, each as the arguments before `--db PATH`.
const READ_ONLY: &[&[&str]] = &[
    &["audit"],
    &["operations", "list"],
    &["operations", "show", "op_00000000000000000000000000000000"],
    &["principal", "list"],
    &[
        "status",
        "--status-ref",
        "op_00000000000000000000000000000000",
    ],
];

fn run_on(db: &Path, cmd: &[&str]) -> Run {
    let mut args: Vec<&str> = cmd.to_vec();
    args.extend(["--db", db.to_str().unwrap()]);
    run(&args)
}

/// Asserts exit 2 with `{"error":{"code":CODE,"message":…}}` on stderr and nothing on stdout.
fn assert_refused(r: &Run, code: &str, what: &str) {
    assert_eq!(r.code, 2, "{what}: {} / {}", r.stdout, r.stderr);
    assert_eq!(r.stdout, "", "{what}");
    let err: serde_json::Value = serde_json::from_str(r.stderr.trim()).unwrap();
    assert_eq!(err["error"]["code"], code, "{what}: {err}");
}

#[test]
fn a_missing_ledger_is_refused_and_nothing_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.sqlite");
    for cmd in READ_ONLY {
        assert_refused(&run_on(&db, cmd), "DATABASE_NOT_FOUND", &cmd.join(" "));
        assert_eq!(snapshot(dir.path()), vec![], "{cmd:?} created a file");
    }
}

#[test]
fn a_file_that_holds_no_ledger_is_refused_and_left_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.sqlite");
    std::fs::write(&empty, b"").unwrap();
    let text = dir.path().join("notes.sqlite");
    std::fs::write(&text, "not a database\n".repeat(300)).unwrap();
    let foreign = dir.path().join("other-app.sqlite");
    {
        let c = rusqlite::Connection::open(&foreign).unwrap();
        c.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE notes(body TEXT);")
            .unwrap();
    }
    let before = snapshot(dir.path());
    for db in [&empty, &text, &foreign] {
        for cmd in READ_ONLY {
            let what = format!("{cmd:?} on {:?}", db.file_name().unwrap());
            let r = run_on(db, cmd);
            assert_refused(&r, "NOT_A_LEDGER", &what);
            assert!(!r.stderr.contains(dir.path().to_str().unwrap()), "{what}");
            assert_eq!(snapshot(dir.path()), before, "{what} changed the directory");
        }
    }
}

/// A ledger with one refund left `processing` by a crash after the downstream commit, and
/// an operator; every process that wrote it has exited.
fn ledger_with_an_unsure_refund() -> (Db, String) {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    let r = d.dispatch(&f, &["--failure", "after_downstream_commit"]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    let sr = r.json()["status_ref"].as_str().unwrap().to_string();
    let add = run(&[
        "principal",
        "add",
        "olga",
        "--tenant",
        "acme",
        "--role",
        "operator",
        "--db",
        d.db(),
    ]);
    assert_eq!(add.code, 0);
    (d, sr)
}

#[test]
fn a_read_only_copy_in_a_read_only_directory_is_inspected_without_creating_a_file() {
    let (d, sr) = ledger_with_an_unsure_refund();
    let copy_dir = tempfile::tempdir().unwrap();
    let ro = copy_dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let db = ro.join("ledger.sqlite");
    std::fs::copy(d.path(), &db).unwrap();
    std::fs::copy(d.downstream(), ro.join("ledger.sqlite.downstream.sqlite")).unwrap();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(
        ro.join("ledger.sqlite.downstream.sqlite"),
        std::fs::Permissions::from_mode(0o444),
    )
    .unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let before = snapshot(copy_dir.path());

    let audit = run_on(&db, &["audit"]);
    assert_eq!(audit.code, 0, "{} / {}", audit.stdout, audit.stderr);
    let a = audit.json();
    assert_eq!(a["gate"], "PASS");
    assert_eq!(a["checks"]["journal_mode"], "wal");
    assert_eq!(a["counts"]["operations"]["processing"], 1);
    assert_eq!(a["downstream"]["receipts"], 1);

    let list = run_on(&db, &["operations", "list", "--state", "processing"]);
    assert_eq!(list.code, 0, "{}", list.stderr);
    assert_eq!(list.stdout.lines().count(), 1);
    assert!(list.stdout.contains(&sr));

    let show = run_on(&db, &["operations", "show", &sr]);
    assert_eq!(show.code, 0, "{}", show.stderr);
    assert_eq!(show.json()["operation"]["state"], "processing");

    let principals = run_on(&db, &["principal", "list"]);
    assert_eq!(principals.code, 0, "{}", principals.stderr);
    let names: Vec<String> = principals.json()["principals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["alice", "bob", "olga"]);

    let status = run_on(&db, &["status", "--status-ref", &sr]);
    assert_eq!(status.code, 1, "{}", status.stderr);
    assert_eq!(status.json()["code"], "OUTCOME_UNKNOWN");
    assert_eq!(status.json()["status"], "processing");

    assert_eq!(
        snapshot(copy_dir.path()),
        before,
        "nothing created or changed"
    );
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_ledger_held_open_by_a_writer_is_read_through_its_log_without_new_files() {
    let (d, sr) = ledger_with_an_unsure_refund();
    // A writer's connection keeps the write-ahead log and its index beside the file.
    let writer = d.ledger();
    writer
        .execute_batch("BEGIN IMMEDIATE; UPDATE principals SET updated_at = updated_at; COMMIT;")
        .unwrap();
    let names = |dir: &Path| -> Vec<PathBuf> { snapshot(dir).into_iter().map(|e| e.0).collect() };
    let before = names(d.dir.path());
    assert!(
        before.iter().any(|p| p.to_string_lossy().ends_with("-wal")),
        "{before:?}"
    );
    let ledger_bytes = std::fs::read(d.path()).unwrap();
    for cmd in READ_ONLY {
        let r = run_on(d.path(), cmd);
        assert_ne!(r.code, 2, "{cmd:?}: {}", r.stderr);
    }
    let list = run_on(d.path(), &["operations", "list"]);
    assert!(list.stdout.contains(&sr));
    assert_eq!(names(d.dir.path()), before, "no file created");
    assert_eq!(std::fs::read(d.path()).unwrap(), ledger_bytes);
    drop(writer);
}

#[test]
fn a_ledger_without_the_reference_tables_is_inspected_and_never_given_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.sqlite");
    // A user's own server: the core schema only.
    drop(
        toolledger::store::sqlite::SqliteStore::open(
            &db,
            toolledger::store::sqlite::OpenOptions::new("sqlite:default"),
        )
        .unwrap(),
    );
    let before = snapshot(dir.path());
    let audit = run_on(&db, &["audit"]);
    assert_eq!(audit.code, 0, "{} / {}", audit.stdout, audit.stderr);
    let list = run_on(&db, &["principal", "list"]);
    assert_eq!(list.code, 0, "{}", list.stderr);
    assert_eq!(list.json()["principals"], serde_json::json!([]));
    let ops = run_on(&db, &["operations", "list"]);
    assert_eq!((ops.code, ops.stdout.as_str()), (0, ""));
    assert_eq!(snapshot(dir.path()), before);
    let reference = toolledger_testkit::db::sqlite_scalar(
        &db,
        "SELECT count(*) FROM sqlite_schema WHERE type = 'table'
           AND name IN ('issues', 'orders', 'automations', 'drafts')",
    );
    assert_eq!(reference, 0, "no reference table was added");
}

#[test]
fn an_older_or_newer_schema_is_refused_read_only_and_never_migrated() {
    let d = Db::new();
    assert_eq!(d.run("migrate", &[]).code, 0);
    d.ledger()
        .execute_batch(
            "DROP INDEX operations_unsettled_by_digest;
             DROP INDEX operations_live_by_retention;
             DROP INDEX operations_tombstones_by_retention; DROP TABLE prune_state;
             ALTER TABLE operations DROP COLUMN compacted_at;
             DELETE FROM schema_migrations WHERE namespace = 'toolledger' AND version >= 5;",
        )
        .unwrap();
    let before = snapshot(d.dir.path());
    for cmd in READ_ONLY {
        assert_refused(&run_on(d.path(), cmd), "SCHEMA_OUTDATED", &cmd.join(" "));
    }
    assert_eq!(snapshot(d.dir.path()), before, "never migrated");
    assert_eq!(d.run("migrate", &[]).code, 0);
    d.ledger()
        .execute_batch("INSERT INTO schema_migrations VALUES ('toolledger', 99)")
        .unwrap();
    let before = snapshot(d.dir.path());
    for cmd in READ_ONLY {
        assert_refused(&run_on(d.path(), cmd), "SCHEMA_TOO_NEW", &cmd.join(" "));
    }
    assert_eq!(snapshot(d.dir.path()), before);
}

/// Tables of `schema`, and whether it exists, read over a connection of its own.
fn pg_schema_tables(schema: &PgSchema) -> (bool, i64) {
    let store = PgStore::open_unchecked(
        schema.url(),
        toolledger::store::postgres::PgOptions::any_backend(),
    )
    .unwrap();
    let name = schema.schema().to_string();
    let store = toolledger::store::Store::from(store);
    std::thread::spawn(move || {
        store
            .read_blocking(move |tx: &mut dyn EffectTx| {
                let exists = tx
                    .query_opt(
                        "SELECT count(*) FROM pg_namespace WHERE nspname = ?1",
                        &[name.as_str().into()],
                    )?
                    .expect("a row")
                    .int(0)?;
                let tables = tx
                    .query_opt(
                        "SELECT count(*) FROM information_schema.tables WHERE table_schema = ?1",
                        &[name.as_str().into()],
                    )?
                    .expect("a row")
                    .int(0)?;
                Ok::<_, toolledger::Error>((exists == 1, tables))
            })
            .unwrap()
    })
    .join()
    .unwrap()
}

fn pg_run(url: &str, cmd: &[&str], dir: &Path) -> Run {
    let mut args: Vec<&str> = cmd.to_vec();
    let db = dir.join("ledger.sqlite");
    args.extend(["--database-url", url, "--db", db.to_str().unwrap()]);
    run(&args)
}

#[test]
fn postgres_read_only_commands_create_no_schema_and_no_table() {
    let Some(schema) = PgSchema::new() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = schema.session_url();
    // No schema at all: not a ledger, and the schema is not created.
    for cmd in READ_ONLY {
        assert_refused(
            &pg_run(&url, cmd, dir.path()),
            "NOT_A_LEDGER",
            &cmd.join(" "),
        );
    }
    assert_eq!(pg_schema_tables(&schema), (false, 0));
    // Another application's schema: not a ledger, nothing added to it.
    let admin = PgStore::open_unchecked(
        schema.url(),
        toolledger::store::postgres::PgOptions::any_backend(),
    )
    .unwrap();
    let ddl = format!(
        "CREATE SCHEMA {s}; CREATE TABLE {s}.notes(body TEXT)",
        s = schema.schema()
    );
    let admin = toolledger::store::Store::from(admin);
    std::thread::spawn(move || {
        admin
            .write_blocking(move |tx: &mut dyn EffectTx| tx.execute_batch(&ddl))
            .unwrap()
    })
    .join()
    .unwrap();
    for cmd in READ_ONLY {
        assert_refused(
            &pg_run(&url, cmd, dir.path()),
            "NOT_A_LEDGER",
            &cmd.join(" "),
        );
    }
    assert_eq!(pg_schema_tables(&schema), (true, 1));
    assert_eq!(
        snapshot(dir.path()),
        vec![],
        "no SQLite file beside it either"
    );
}

#[test]
fn postgres_read_only_commands_read_a_ledger_and_add_nothing() {
    let Some(schema) = PgSchema::new() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = schema.session_url();
    // The core schema only (a user's own server).
    drop(schema.open(schema.options(None, &[])).unwrap());
    let tables = pg_schema_tables(&schema);
    let audit = pg_run(&url, &["audit"], dir.path());
    assert_eq!(audit.code, 0, "{} / {}", audit.stdout, audit.stderr);
    assert_eq!(audit.json()["backend"], "postgres");
    let list = pg_run(&url, &["principal", "list"], dir.path());
    assert_eq!(list.code, 0, "{}", list.stderr);
    let ops = pg_run(&url, &["operations", "list"], dir.path());
    assert_eq!((ops.code, ops.stdout.as_str()), (0, ""));
    let status = pg_run(&url, &["status", "--status-ref", "op_nope"], dir.path());
    assert_eq!(status.code, 1);
    assert_eq!(status.json()["code"], "NOT_FOUND");
    assert_eq!(
        pg_schema_tables(&schema),
        tables,
        "no reference table was added"
    );
    assert_eq!(snapshot(dir.path()), vec![]);
}
