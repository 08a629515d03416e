//! A crash during PostgreSQL group commit loses only unacknowledged operations. A child
//! process runs many concurrent fresh operations against a schema of its own and prints each
//! key the moment its call returns (after its batch's `COMMIT`); the test SIGKILLs it mid-run,
//! checks that the server ended the killed process's sessions (no transaction of it is left
//! open holding locks), that every acknowledged key is in the ledger with its effect, and that
//! no operation is half-done. Done twice on one schema: the second run starts from the
//! crashed state and applies new keys. (`TOOLLEDGER_TEST_DATABASE_URL`; skipped with one loud
//! line when unset, failing in CI.) The SQLite run of the same test is `bench_crash.rs`.

mod support;

use std::collections::{HashMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use support::ack::read_acks;

use toolledger::effect::{EffectTx, RowExt, SqlValue};
use toolledger::store::postgres::{PgOptions, PgStore};
use toolledger::store::Store;
use toolledger_testkit::conformance::{fresh_schema_name, test_database_url, ServerLock};

const OPS: &str = "1000000";
const ACKS_BEFORE_KILL: usize = 400;
/// A run that has not reached its acknowledgements by then is stuck (e.g. behind locks a
/// killed process left); it is killed and the test fails instead of hanging.
const STALL_LIMIT: Duration = Duration::from_secs(300);
/// How long the server may take to notice that a killed client's connections are gone.
const SESSION_END_LIMIT: Duration = Duration::from_secs(60);

/// The test's schema, dropped when the test ends (passing or failing).
struct Db {
    url: String,
    schema: String,
    store: Store,
    _lock: ServerLock,
}

impl Db {
    fn new() -> Option<Db> {
        let url = test_database_url()?;
        let lock = ServerLock::acquire(false).unwrap();
        let schema = fresh_schema_name();
        // The test only reads, in a schema the child creates; nothing is checked at open.
        let mut opts = PgOptions::any_backend().in_schema(schema.clone());
        opts.max_connections = 1;
        opts.batch_writers = 1;
        let store = Store::from(PgStore::open_unchecked(&url, opts).unwrap());
        Some(Db {
            url,
            schema,
            store,
            _lock: lock,
        })
    }

    /// The URL a child uses: its sessions carry `app` as their `application_name`.
    fn url_for(&self, app: &str) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}application_name={app}", self.url)
    }

    fn query(&self, sql: &'static str, params: Vec<SqlValue>) -> Vec<Vec<SqlValue>> {
        self.store
            .read_blocking(move |tx: &mut dyn EffectTx| tx.query(sql, &params))
            .unwrap()
    }

    /// The server sessions (`state`, `xact_start`, `query`) of the client named `app`.
    fn sessions_of(&self, app: &str) -> Vec<String> {
        self.query(
            "SELECT coalesce(state, '') || ' xact_start=' || coalesce(xact_start::text, '-')
                    || ' query=' || coalesce(query, '')
             FROM pg_stat_activity WHERE application_name = ?1 AND pid <> pg_backend_pid()",
            vec![app.into()],
        )
        .iter()
        .map(|r| r.text(0).unwrap())
        .collect()
    }

    /// Waits until the server has ended every session of the killed client `app`; fails
    /// with the sessions still there (an open transaction of a dead process holds its locks).
    fn wait_for_sessions_to_end(&self, app: &str) {
        let deadline = Instant::now() + SESSION_END_LIMIT;
        loop {
            let left = self.sessions_of(app);
            if left.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sessions of the killed process are still open: {left:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let opts = PgOptions::any_backend().in_schema(self.schema.clone());
        if let Ok(s) = PgStore::open_unchecked(&self.url, opts) {
            let _ = s.drop_schema_blocking();
        }
    }
}

/// Kills the child (SIGKILL) and reaps it, when it is still around.
struct Reaper(Arc<Mutex<Child>>);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Ok(mut c) = self.0.lock() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs the acknowledgement stream as client `app`, kills it after `ACKS_BEFORE_KILL`
/// acknowledgements, waits until its server sessions are gone, and returns every key it
/// acknowledged (including lines already in the pipe at the kill).
fn run_and_kill(db: &Db, app: &str) -> HashSet<String> {
    let mut child = support::toolledger()
        .args(["bench", "--backend", "postgres", "--database-url"])
        .arg(db.url_for(app))
        .args(["--ack-schema", &db.schema])
        .args(["--concurrency", "64", "--ops", OPS])
        .env_remove("TOOLLEDGER_DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn toolledger bench --ack-schema");
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let child = Arc::new(Mutex::new(child));
    let reaper = Reaper(child.clone());

    // The stall guard: kills a run that does not reach its acknowledgements.
    let stalled = Arc::new(AtomicBool::new(false));
    let (done, wait) = mpsc::channel::<()>();
    let guard = {
        let child = child.clone();
        let stalled = stalled.clone();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(STALL_LIMIT) {
                stalled.store(true, Ordering::SeqCst);
                let _ = child.lock().unwrap().kill();
            }
        })
    };

    let (acked, killed) = read_acks(stdout, ACKS_BEFORE_KILL, || {
        // The filter below sees the process's sessions while it runs, so its finding
        // nothing after the kill means they ended.
        assert!(
            !db.sessions_of(app).is_empty(),
            "the running child has no sessions named {app}"
        );
        child.lock().unwrap().kill().unwrap(); // SIGKILL
    });
    let _ = done.send(());
    guard.join().unwrap();
    let status = child.lock().unwrap().wait().unwrap();
    drop(reaper);
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
    assert!(
        !stalled.load(Ordering::SeqCst),
        "the run stalled after {} acknowledgements: {err}",
        acked.len()
    );
    assert!(
        killed,
        "the child ended before it was killed: {status:?} {err}"
    );
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL mid-run");
    db.wait_for_sessions_to_end(app);
    acked
}

/// Checks the schema against `acked`; returns the committed keys.
fn check_consistent(db: &Db, acked: &HashSet<String>) -> HashSet<String> {
    // One snapshot for every query.
    let (operations, applied, effects, mismatched) = db
        .store
        .read_blocking(|tx: &mut dyn EffectTx| {
            let mut keys = |sql: &str| -> Result<HashSet<String>, toolledger::Error> {
                tx.query(sql, &[])?.iter().map(|r| r.text(0)).collect()
            };
            let operations =
                keys("SELECT idempotency_key FROM operations WHERE tool = 'bench_write'")?;
            let applied = keys(
                "SELECT idempotency_key FROM operations WHERE tool = 'bench_write'
                   AND state = 'applied' AND effect_kind = 'inline'
                   AND result IS NOT NULL AND result_digest IS NOT NULL",
            )?;
            let effects = keys("SELECT operation_key FROM bench_effects")?;
            // Each ledger result names its own effect row.
            let mismatched = keys(
                "SELECT o.idempotency_key FROM operations o
                   JOIN bench_effects e ON e.operation_key = o.idempotency_key
                  WHERE o.tool = 'bench_write'
                    AND ((o.result::jsonb ->> 'effect_id')::bigint IS DISTINCT FROM e.id
                         OR (o.result::jsonb ->> 'n')::bigint IS DISTINCT FROM e.n)",
            )?;
            Ok::<_, toolledger::Error>((operations, applied, effects, mismatched))
        })
        .unwrap();
    let others = db.query(
        "SELECT tool, count(*) FROM operations WHERE tool <> 'bench_write' GROUP BY tool",
        Vec::new(),
    );
    assert!(others.is_empty(), "unexpected ledger rows: {others:?}");

    assert_eq!(applied, operations, "no operation is left half-done");
    assert_eq!(
        effects, operations,
        "each operation has its effect and no effect is orphaned"
    );
    assert!(
        mismatched.is_empty(),
        "results of other effects: {mismatched:?}"
    );
    let lost: Vec<&String> = acked.difference(&operations).collect();
    assert!(lost.is_empty(), "acknowledged but lost: {lost:?}");
    operations
}

/// The run prefix of a key (`ack-<run>-<n>` → `ack-<run>`).
fn run_of(key: &str) -> &str {
    key.rsplit_once('-').map(|(run, _)| run).unwrap()
}

fn by_run(keys: &HashSet<String>) -> HashMap<&str, usize> {
    let mut runs = HashMap::new();
    for k in keys {
        *runs.entry(run_of(k)).or_insert(0) += 1;
    }
    runs
}

#[test]
fn sigkill_during_postgres_group_commit_loses_no_acknowledged_operation() {
    let Some(db) = Db::new() else { return };
    let app = |round: u32| format!("{}_crash{round}", db.schema);

    let first = run_and_kill(&db, &app(1));
    assert!(first.len() >= ACKS_BEFORE_KILL);
    assert_eq!(by_run(&first).len(), 1, "one run, one key prefix");
    let committed = check_consistent(&db, &first);
    assert!(committed.len() >= first.len());

    // The second run starts from the crashed schema and applies keys of its own.
    let second = run_and_kill(&db, &app(2));
    assert!(second.len() >= ACKS_BEFORE_KILL);
    assert_eq!(by_run(&second).len(), 1, "one run, one key prefix");
    assert!(
        second.is_disjoint(&committed),
        "the second run's keys are new"
    );
    let mut all = first.clone();
    all.extend(second.iter().cloned());
    let committed_after = check_consistent(&db, &all);
    assert!(
        committed.is_subset(&committed_after),
        "the second run kept every earlier operation"
    );
    let runs = by_run(&committed_after);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs[run_of(second.iter().next().unwrap())] >= second.len());
}
