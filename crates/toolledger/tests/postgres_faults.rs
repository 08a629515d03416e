//! PostgreSQL faults: a statement timeout is a clean error, a deadlock is retried a bounded
//! number of times, and connections killed under an in-flight write answer `unavailable`,
//! leave nothing half-written, and the pool reconnects for the next call.
//! (`TOOLLEDGER_TEST_DATABASE_URL`; skipped with one loud line when unset, failing in CI.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use toolledger::effect::{EffectTx, RowExt};
use toolledger::store::postgres::PgOptions;
use toolledger::store::{Migration, Store};
use toolledger::{Error, ErrorCode};
use toolledger_testkit::db::{count, PgSchema};

const T: &[Migration] = &[Migration {
    namespace: "faults",
    version: 1,
    sql: "CREATE TABLE t(id BIGINT PRIMARY KEY, v BIGINT NOT NULL);
          INSERT INTO t(id, v) VALUES (1, 0), (2, 0);",
}];

/// A store over `db` whose sessions are named `app`, its options tuned by `tune`.
fn open(db: &PgSchema, app: &str, tune: impl FnOnce(&mut PgOptions)) -> Store {
    let mut opts = db.options(Some("faults"), T);
    tune(&mut opts);
    db.open_as(app, opts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_is_a_clean_unavailable_error() {
    let Some(db) = PgSchema::new() else { return };
    let store = open(&db, "tl_timeout", |o| {
        o.statement_timeout = Duration::from_millis(200)
    });
    let err = store
        .read(|tx: &mut dyn EffectTx| tx.query("SELECT 1 FROM pg_sleep(3)", &[]))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Unavailable);
    assert_eq!(err.message, "statement timed out");
    let err = store
        .write(|tx: &mut dyn EffectTx| {
            tx.execute("UPDATE t SET v = 7 WHERE id = 1", &[])?;
            tx.query("SELECT 1 FROM pg_sleep(3)", &[])
        })
        .await
        .unwrap_err();
    assert_eq!(err.message, "statement timed out");
    let v = store
        .read(|tx: &mut dyn EffectTx| {
            tx.query_opt("SELECT v FROM t WHERE id = 1", &[])?
                .unwrap()
                .int(0)
        })
        .await
        .unwrap();
    assert_eq!(v, 0, "the timed-out write rolled back");
}

#[test]
fn a_deadlock_is_retried_and_both_writers_succeed() {
    let Some(db) = PgSchema::new() else { return };
    let store = open(&db, "tl_deadlock", |_| {});
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(2));
    let writer = |first: i64, second: i64| {
        let store = store.clone();
        let runs = runs.clone();
        let barrier = barrier.clone();
        std::thread::spawn(move || {
            let mut attempt = 0;
            store.write_blocking(move |tx: &mut dyn EffectTx| {
                attempt += 1;
                runs.fetch_add(1, Ordering::SeqCst);
                tx.execute("UPDATE t SET v = v + 1 WHERE id = ?1", &[first.into()])?;
                if attempt == 1 {
                    // Both hold their first row before either asks for the second.
                    barrier.wait();
                }
                tx.execute("UPDATE t SET v = v + 1 WHERE id = ?1", &[second.into()])?;
                Ok::<_, Error>(())
            })
        })
    };
    let a = writer(1, 2);
    let b = writer(2, 1);
    a.join().unwrap().unwrap();
    b.join().unwrap().unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "exactly one deadlock victim ran again"
    );
    let sum = store
        .read_blocking(|tx: &mut dyn EffectTx| {
            tx.query_opt("SELECT sum(v)::BIGINT FROM t", &[])?
                .unwrap()
                .int(0)
        })
        .unwrap();
    assert_eq!(sum, 4, "each writer's two updates landed once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_answer_unavailable_write_nothing_and_the_pool_reconnects() {
    let Some(db) = PgSchema::new() else { return };
    let app = format!("tl_victim_{}", std::process::id());
    let store = open(&db, &app, |_| {});
    let admin = open(&db, "tl_admin", |_| {});
    store
        .write(|tx: &mut dyn EffectTx| tx.execute("CREATE TABLE marks(x BIGINT NOT NULL)", &[]))
        .await
        .unwrap();
    let victim = store.clone();
    let in_flight = tokio::spawn(async move {
        victim
            .write(|tx: &mut dyn EffectTx| {
                tx.execute("INSERT INTO marks(x) VALUES (1)", &[])?;
                tx.query("SELECT 1 FROM pg_sleep(5)", &[])?;
                tx.execute("INSERT INTO marks(x) VALUES (2)", &[])
            })
            .await
    });
    // Wait until the write is inside pg_sleep, then kill every connection of the store.
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}' AND query LIKE '%pg_sleep%' AND state = 'active'"
    );
    for _ in 0..100 {
        let sql = sql.clone();
        let n = admin
            .read(move |tx: &mut dyn EffectTx| tx.query_opt(&sql, &[])?.unwrap().int(0))
            .await
            .unwrap();
        if n > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let kill = format!(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{app}') AS k"
    );
    let killed = admin
        .read(move |tx: &mut dyn EffectTx| tx.query_opt(&kill, &[])?.unwrap().int(0))
        .await
        .unwrap();
    assert!(killed >= 1);
    let err = in_flight.await.unwrap().unwrap_err();
    assert_eq!(err.code, ErrorCode::Unavailable, "{err:?}");
    assert!(!err.message.contains("marks"), "{}", err.message);
    assert_eq!(count(&admin, "marks").await, 0, "nothing half-written");
    // The pool drops the dead connections and makes new ones.
    store
        .write(|tx: &mut dyn EffectTx| tx.execute("INSERT INTO marks(x) VALUES (3)", &[]))
        .await
        .unwrap();
    assert_eq!(count(&store, "marks").await, 1);
}
