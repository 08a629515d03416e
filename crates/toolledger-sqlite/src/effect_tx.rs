//! [`EffectTx`] over a SQLite connection that is already inside a transaction.

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::Connection;

use toolledger_core::effect::{refuse_transaction_control, Dialect, EffectTx, SqlValue};
use toolledger_core::model::Error;
use toolledger_core::store::StoreError;

/// Binds a [`SqlValue`] by reference: no copy of text or bytes.
pub(crate) struct Bind<'a>(pub(crate) &'a SqlValue);

impl rusqlite::ToSql for Bind<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self.0 {
            SqlValue::Null => ValueRef::Null,
            SqlValue::Integer(i) => ValueRef::Integer(*i),
            SqlValue::Text(s) => ValueRef::Text(s.as_bytes()),
            SqlValue::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

fn contract(what: &str) -> Error {
    StoreError::Contract(what.into()).caller_error()
}

fn from_ref(v: ValueRef<'_>) -> Result<SqlValue, Error> {
    Ok(match v {
        ValueRef::Null => SqlValue::Null,
        ValueRef::Integer(i) => SqlValue::Integer(i),
        ValueRef::Text(t) => SqlValue::Text(
            std::str::from_utf8(t)
                .map_err(|_| contract("stored text is not UTF-8"))?
                .to_string(),
        ),
        ValueRef::Blob(b) => SqlValue::Blob(b.to_vec()),
        ValueRef::Real(_) => {
            return Err(contract(
                "floating-point columns are outside the effect contract",
            ))
        }
    })
}

/// [`EffectTx`] over a SQLite connection that is already inside a transaction.
pub(crate) struct SqliteEffectTx<'c> {
    conn: &'c Connection,
    last_error: Option<StoreError>,
}

impl<'c> SqliteEffectTx<'c> {
    pub(crate) fn new(conn: &'c Connection) -> Self {
        SqliteEffectTx {
            conn,
            last_error: None,
        }
    }

    /// The caller-safe error of a failed statement; the storage error behind it is kept for
    /// [`EffectTx::take_store_error`].
    fn fail(&mut self, e: rusqlite::Error) -> Error {
        let mapped = crate::map_err(e);
        let safe = mapped.caller_error();
        self.last_error = Some(mapped);
        safe
    }
}

impl EffectTx for SqliteEffectTx<'_> {
    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<usize, Error> {
        refuse_transaction_control(sql)?;
        let conn = self.conn;
        let out = conn
            .prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute(rusqlite::params_from_iter(params.iter().map(Bind))));
        out.map_err(|e| self.fail(e))
    }

    fn insert_id(&mut self, sql: &str, params: &[SqlValue]) -> Result<Option<i64>, Error> {
        debug_assert!(
            !toolledger_core::effect::is_upsert(sql),
            "insert_id takes plain inserts only"
        );
        match self.execute(sql, params)? {
            0 => Ok(None),
            1 => Ok(Some(self.conn.last_insert_rowid())),
            _ => Err(Error::from(StoreError::Contract(
                "insert_id inserted more than one row".into(),
            ))),
        }
    }

    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Vec<SqlValue>>, Error> {
        refuse_transaction_control(sql)?;
        let conn = self.conn;
        let mut stmt = match conn.prepare_cached(sql) {
            Ok(s) => s,
            Err(e) => return Err(self.fail(e)),
        };
        let width = stmt.column_count();
        let collected = (|| -> Result<Result<Vec<Vec<SqlValue>>, Error>, rusqlite::Error> {
            let mut rows = stmt.query(rusqlite::params_from_iter(params.iter().map(Bind)))?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                let mut cols = Vec::with_capacity(width);
                for i in 0..width {
                    match from_ref(row.get_ref(i)?) {
                        Ok(v) => cols.push(v),
                        Err(e) => return Ok(Err(e)),
                    }
                }
                out.push(cols);
            }
            Ok(Ok(out))
        })();
        drop(stmt);
        match collected {
            Ok(inner) => inner,
            Err(e) => Err(self.fail(e)),
        }
    }

    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn execute_batch(&mut self, sql: &str) -> Result<(), Error> {
        refuse_transaction_control(sql)?;
        let conn = self.conn;
        conn.execute_batch(sql).map_err(|e| self.fail(e))
    }

    fn lock_key(&mut self, _key: &str) -> Result<(), Error> {
        // One write transaction at a time (the writer thread, `BEGIN IMMEDIATE` across
        // processes): every writer is already serialized.
        Ok(())
    }

    fn take_store_error(&mut self) -> Option<StoreError> {
        self.last_error.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolledger_core::model::ErrorCode;

    #[test]
    fn values_round_trip_and_errors_carry_no_sql() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE t(a INTEGER NOT NULL CHECK (a > 0), b TEXT, c BLOB) STRICT;",
        )
        .unwrap();
        let mut tx = SqliteEffectTx::new(&conn);
        let n = tx
            .execute(
                "INSERT INTO t(a, b, c) VALUES (?1, ?2, ?3)",
                &[7.into(), "x".into(), vec![1u8, 2].into()],
            )
            .unwrap();
        assert_eq!(n, 1);
        let rows = tx
            .query("SELECT a, b, c, NULL FROM t WHERE a = ?1", &[7.into()])
            .unwrap();
        assert_eq!(
            rows,
            vec![vec![
                SqlValue::Integer(7),
                SqlValue::Text("x".into()),
                SqlValue::Blob(vec![1, 2]),
                SqlValue::Null
            ]]
        );
        let err = tx
            .execute("INSERT INTO t(a) VALUES (?1)", &[0.into()])
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Unavailable);
        assert_eq!(err.message, "write refused by the database");
        assert!(matches!(
            tx.take_store_error(),
            Some(StoreError::Refused { backend: Dialect::Sqlite, ref reason }) if reason == "check constraint"
        ));
        let err = tx.execute("SELEC nonsense", &[]).unwrap_err();
        assert!(!err.message.contains("SELEC"), "{}", err.message);
        let kept = tx.take_store_error().unwrap();
        assert_eq!(kept.code(), "SQLITE_ERROR");
        assert!(!kept.to_string().contains("SELEC"), "{kept}");
        assert!(tx.execute("  commit", &[]).is_err());
        assert!(tx.query("SELECT 1.5", &[]).is_err());
    }
}
