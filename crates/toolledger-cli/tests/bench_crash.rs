//! A crash during group commit loses only unacknowledged operations. A child process runs many
//! concurrent fresh operations and prints each key the moment its call returns (after its
//! batch's COMMIT); the test SIGKILLs it mid-run, then checks that every acknowledged key is in
//! the database with its effect, and that the database is consistent. Done twice on one file,
//! so the second run also starts from a crashed database; and once more with the opt-in
//! `--sqlite-synchronous normal`, which gives up durability on power failure but not on a
//! crash of the process.

mod support;

use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;

use support::ack::read_acks;

const OPS: &str = "1000000";
const ACKS_BEFORE_KILL: usize = 400;

/// Runs the acknowledgement stream, kills it after `ACKS_BEFORE_KILL` acknowledgements, and
/// returns every key it acknowledged (including lines already in the pipe at the kill).
fn run_and_kill(db: &Path, extra: &[&str]) -> HashSet<String> {
    let mut child = support::toolledger()
        .args(["bench", "--concurrency", "64", "--ops", OPS])
        .args(extra)
        .arg("--ack-db")
        .arg(db)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn toolledger bench --ack-db");
    let stdout = child.stdout.take().unwrap();
    let (acked, killed) = read_acks(stdout, ACKS_BEFORE_KILL, || {
        child.kill().unwrap(); // SIGKILL
    });
    let status = child.wait().unwrap();
    assert!(killed, "the child ended before it was killed: {status:?}");
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL mid-run");
    acked
}

fn keys(conn: &rusqlite::Connection, sql: &str) -> HashSet<String> {
    let mut stmt = conn.prepare(sql).unwrap();
    let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

fn check_consistent(db: &Path, acked: &HashSet<String>) -> usize {
    let conn = rusqlite::Connection::open(db).unwrap();
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    let fk_problems: i64 = conn
        .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(fk_problems, 0);

    let operations = keys(
        &conn,
        "SELECT idempotency_key FROM operations WHERE tool = 'bench_write'",
    );
    let applied = keys(
        &conn,
        "SELECT idempotency_key FROM operations WHERE tool = 'bench_write' AND state = 'applied'
           AND result IS NOT NULL AND result_digest IS NOT NULL",
    );
    let effects = keys(&conn, "SELECT operation_key FROM bench_effects");
    assert_eq!(applied, operations, "no operation is left half-done");
    assert_eq!(
        effects, operations,
        "each operation has its effect and no effect is orphaned"
    );
    let lost: Vec<&String> = acked.difference(&operations).collect();
    assert!(lost.is_empty(), "acknowledged but lost: {lost:?}");
    operations.len()
}

#[test]
fn sigkill_during_group_commit_loses_no_acknowledged_operation() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.sqlite");

    let first = run_and_kill(&db, &[]);
    assert!(first.len() >= ACKS_BEFORE_KILL);
    let committed = check_consistent(&db, &first);
    assert!(committed >= first.len());

    // The second run starts from the crashed file with keys of its own, so its operations
    // are all new ones committed by group commit on top of the crashed state.
    let second = run_and_kill(&db, &[]);
    assert!(
        second.is_disjoint(&first),
        "each run acknowledges new operations"
    );
    let mut all = first.clone();
    all.extend(second);
    let committed_now = check_consistent(&db, &all);
    assert!(committed_now >= all.len());
    assert!(
        committed_now > committed,
        "the second run committed new operations"
    );
}

#[test]
fn sigkill_with_synchronous_normal_loses_no_acknowledged_operation() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash-normal.sqlite");
    let acked = run_and_kill(&db, &["--sqlite-synchronous", "normal"]);
    assert!(acked.len() >= ACKS_BEFORE_KILL);
    let committed = check_consistent(&db, &acked);
    assert!(committed >= acked.len());
}
