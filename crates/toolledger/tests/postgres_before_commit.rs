//! `EffectTx::execute_before_commit` on PostgreSQL: the queued write goes out with `COMMIT`
//! (or with the next statement), is committed with the rest of the transaction, runs before
//! any later statement, and when it fails the whole write fails and nothing of it is kept.
//! (`TOOLLEDGER_TEST_DATABASE_URL`; skipped with one loud line when unset, failing in CI.)

use toolledger::effect::{EffectTx, RowExt};
use toolledger::store::conformance::{fresh_schema_name, test_database_url, ServerLock};
use toolledger::store::postgres::{PgOptions, PgStore};
use toolledger::store::{Migration, Store};
use toolledger::{Error, ErrorCode};

const T: &[Migration] = &[Migration {
    namespace: "before_commit",
    version: 1,
    sql: "CREATE TABLE t(id BIGINT PRIMARY KEY, v BIGINT NOT NULL CHECK (v >= 0));",
}];

struct Db {
    url: String,
    schema: String,
    _lock: ServerLock,
}

impl Db {
    fn new() -> Option<Db> {
        let url = test_database_url()?;
        Some(Db {
            url,
            schema: fresh_schema_name(),
            _lock: ServerLock::acquire(false).unwrap(),
        })
    }

    fn open(&self) -> Store {
        let opts = PgOptions::new("before_commit")
            .with_migrations(T)
            .in_schema(self.schema.clone());
        Store::from(PgStore::open(&self.url, opts).unwrap())
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

async fn rows(store: &Store) -> Vec<(i64, i64)> {
    store
        .read(|tx: &mut dyn EffectTx| -> Result<Vec<(i64, i64)>, Error> {
            tx.query("SELECT id, v FROM t ORDER BY id", &[])?
                .into_iter()
                .map(|r| Ok((r.int(0)?, r.int(1)?)))
                .collect()
        })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_write_is_committed_with_the_transaction() {
    let Some(db) = Db::new() else { return };
    let store = db.open();
    let out = store
        .write(|tx: &mut dyn EffectTx| {
            tx.execute("INSERT INTO t(id, v) VALUES (1, 1)", &[])?;
            tx.execute_before_commit("UPDATE t SET v = ?1 WHERE id = ?2", &[5.into(), 1.into()])?;
            Ok::<_, Error>("done")
        })
        .await
        .unwrap();
    assert_eq!(out, "done");
    assert_eq!(rows(&store).await, vec![(1, 5)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_write_runs_before_the_next_statement() {
    let Some(db) = Db::new() else { return };
    let store = db.open();
    let seen = store
        .write(|tx: &mut dyn EffectTx| {
            tx.execute("INSERT INTO t(id, v) VALUES (1, 1)", &[])?;
            tx.execute_before_commit("UPDATE t SET v = 9 WHERE id = 1", &[])?;
            tx.query_opt("SELECT v FROM t WHERE id = ?1", &[1.into()])?
                .expect("row")
                .int(0)
        })
        .await
        .unwrap();
    assert_eq!(seen, 9);
    assert_eq!(rows(&store).await, vec![(1, 9)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_queued_write_rolls_the_whole_write_back() {
    let Some(db) = Db::new() else { return };
    let store = db.open();
    store
        .write(|tx: &mut dyn EffectTx| tx.execute("INSERT INTO t(id, v) VALUES (1, 1)", &[]))
        .await
        .unwrap();
    let before = rows(&store).await;
    let err = store
        .write(|tx: &mut dyn EffectTx| {
            tx.execute("INSERT INTO t(id, v) VALUES (2, 2)", &[])?;
            tx.execute("UPDATE t SET v = 3 WHERE id = 1", &[])?;
            // Violates the CHECK: detected only when it runs, together with COMMIT.
            tx.execute_before_commit(
                "UPDATE t SET v = ?1 WHERE id = ?2",
                &[(-1).into(), 2.into()],
            )?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Unavailable);
    assert!(!err.message.contains("UPDATE"), "{}", err.message);
    assert_eq!(rows(&store).await, before);
    // The connection is usable afterwards, outside any transaction.
    store
        .write(|tx: &mut dyn EffectTx| tx.execute("INSERT INTO t(id, v) VALUES (3, 3)", &[]))
        .await
        .unwrap();
    assert_eq!(rows(&store).await, vec![(1, 1), (3, 3)]);
}
