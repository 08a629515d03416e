//! The transaction handle an inline effect writes through.
//!
//! An inline effect runs inside the ledger's own write transaction, so the effect row and the
//! ledger row commit (or roll back) together. Effects get an [`EffectTx`] instead of a raw
//! database handle: SQL uses numbered `?1`-style placeholders and plain [`SqlValue`]s, which
//! every backend can translate, so the engine's public API is not tied to SQLite.
//!
//! A constraint or trigger failure inside the effect surfaces as an [`Error`] with code
//! `unavailable` (messages never carry SQL text or paths) and rolls back the whole call.

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::Connection;

use crate::model::{Error, ErrorCode};
use crate::store::StoreError;

/// A value bound to a placeholder or read from a column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SqlValue {
    /// SQL `NULL`.
    Null,
    /// A 64-bit signed integer.
    Integer(i64),
    /// UTF-8 text.
    Text(String),
    /// Raw bytes.
    Blob(Vec<u8>),
}

impl SqlValue {
    /// The integer, if this is one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            SqlValue::Integer(i) => Some(*i),
            _ => None,
        }
    }

    /// The text, if this is text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            SqlValue::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The bytes, if this is a blob.
    pub fn as_blob(&self) -> Option<&[u8]> {
        match self {
            SqlValue::Blob(b) => Some(b),
            _ => None,
        }
    }

    /// Whether this is `NULL`.
    pub fn is_null(&self) -> bool {
        matches!(self, SqlValue::Null)
    }
}

impl From<i64> for SqlValue {
    fn from(v: i64) -> Self {
        SqlValue::Integer(v)
    }
}

impl From<&str> for SqlValue {
    fn from(v: &str) -> Self {
        SqlValue::Text(v.to_string())
    }
}

impl From<String> for SqlValue {
    fn from(v: String) -> Self {
        SqlValue::Text(v)
    }
}

impl From<Vec<u8>> for SqlValue {
    fn from(v: Vec<u8>) -> Self {
        SqlValue::Blob(v)
    }
}

impl<T: Into<SqlValue>> From<Option<T>> for SqlValue {
    fn from(v: Option<T>) -> Self {
        v.map(Into::into).unwrap_or(SqlValue::Null)
    }
}

/// The SQL dialect behind an [`EffectTx`], for the rare statement that must differ between
/// backends (DDL, triggers, `FOR UPDATE SKIP LOCKED`). Portable statements need not ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// SQLite (the embedded backend).
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

impl Dialect {
    /// `sqlite` or `postgres`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }
}

/// The statements an inline effect may run inside the ledger's transaction.
///
/// Placeholders are numbered (`?1`, `?2`, …); PostgreSQL receives them as `$1`, `$2`, ….
/// Write SQL both backends accept: `INSERT … RETURNING` (or [`EffectTx::insert_id`] for the
/// new row's id), `ON CONFLICT … DO NOTHING/UPDATE`, `coalesce`, integer (64-bit) and text
/// columns, no `last_insert_rowid()`, no `INSERT OR …`,
/// and give every parameter a typed context (a column comparison or an insert target).
/// Never run `BEGIN`, `COMMIT`, `ROLLBACK` or `SAVEPOINT` through it: the engine owns the
/// transaction.
pub trait EffectTx {
    /// Runs one statement and returns the number of rows it changed.
    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<usize, Error>;

    /// Runs one query (including `… RETURNING`) and returns every row.
    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Vec<SqlValue>>, Error>;

    /// The dialect of the database behind this transaction.
    fn dialect(&self) -> Dialect;

    /// Runs a script of statements without parameters (DDL, e.g. a test's failure trigger).
    fn execute_batch(&mut self, sql: &str) -> Result<(), Error>;

    /// Serializes, until this transaction ends, every writer that locks the same `key`.
    /// SQLite already runs one write transaction at a time, so there it does nothing; on
    /// PostgreSQL it takes a transaction-scoped advisory lock. Use it where a check and the
    /// write that depends on it must not interleave with another transaction's (e.g. a
    /// "not yet taken" check across rows no unique constraint covers).
    fn lock_key(&mut self, key: &str) -> Result<(), Error>;

    /// The storage-level error behind the last failed statement, if the backend kept it
    /// (taken once). Lets store-level code report storage failures apart from refusals.
    fn take_store_error(&mut self) -> Option<StoreError> {
        None
    }

    /// Runs one single-row `INSERT` (written without `RETURNING`) into a table whose key is
    /// an integer column `id`, and returns that row's `id`, or `None` when no row was inserted
    /// (`ON CONFLICT … DO NOTHING`). PostgreSQL runs it with `RETURNING id` appended; SQLite
    /// (where `id` must be the `INTEGER PRIMARY KEY`) reads the connection's last rowid
    /// instead, since a `RETURNING` clause there builds a temporary table for each statement.
    /// Not for upserts (`ON CONFLICT … DO UPDATE`): SQLite's last rowid does not name an
    /// updated row; use `query` with `RETURNING` for those. (Debug builds assert it; checking
    /// the statement text on every call cost more than the `RETURNING` it saves.)
    fn insert_id(&mut self, sql: &str, params: &[SqlValue]) -> Result<Option<i64>, Error> {
        debug_assert!(!is_upsert(sql), "insert_id takes plain inserts only");
        let sql = format!("{sql} RETURNING id");
        match self.query_opt(&sql, params)? {
            Some(row) => row.int(0).map(Some),
            None => Ok(None),
        }
    }

    /// Runs a query expected to return at most one row.
    fn query_opt(
        &mut self,
        sql: &str,
        params: &[SqlValue],
    ) -> Result<Option<Vec<SqlValue>>, Error> {
        Ok(self.query(sql, params)?.into_iter().next())
    }
}

/// Whether `sql` has `DO UPDATE` in it ([`EffectTx::insert_id`] takes plain inserts only,
/// `… DO NOTHING` included).
fn is_upsert(sql: &str) -> bool {
    sql.split_ascii_whitespace()
        .zip(sql.split_ascii_whitespace().skip(1))
        .any(|(a, b)| a.eq_ignore_ascii_case("DO") && b.eq_ignore_ascii_case("UPDATE"))
}

/// Typed access to a row returned by [`EffectTx::query`]. A missing column or a value of
/// another type is a storage-contract error (`unavailable`), never a panic.
pub trait RowExt {
    /// The integer in column `i`.
    fn int(&self, i: usize) -> Result<i64, Error>;
    /// The integer in column `i`, or `None` for `NULL`.
    fn opt_int(&self, i: usize) -> Result<Option<i64>, Error>;
    /// The text in column `i`.
    fn text(&self, i: usize) -> Result<String, Error>;
    /// The text in column `i`, or `None` for `NULL`.
    fn opt_text(&self, i: usize) -> Result<Option<String>, Error>;
}

fn column_error() -> Error {
    Error::from(StoreError::Contract(
        "a column has an unexpected type".into(),
    ))
}

impl RowExt for [SqlValue] {
    fn int(&self, i: usize) -> Result<i64, Error> {
        self.get(i)
            .and_then(SqlValue::as_i64)
            .ok_or_else(column_error)
    }

    fn opt_int(&self, i: usize) -> Result<Option<i64>, Error> {
        match self.get(i) {
            Some(SqlValue::Null) => Ok(None),
            Some(SqlValue::Integer(v)) => Ok(Some(*v)),
            _ => Err(column_error()),
        }
    }

    fn text(&self, i: usize) -> Result<String, Error> {
        self.get(i)
            .and_then(SqlValue::as_str)
            .map(str::to_string)
            .ok_or_else(column_error)
    }

    fn opt_text(&self, i: usize) -> Result<Option<String>, Error> {
        match self.get(i) {
            Some(SqlValue::Null) => Ok(None),
            Some(SqlValue::Text(v)) => Ok(Some(v.clone())),
            _ => Err(column_error()),
        }
    }
}

impl RowExt for Vec<SqlValue> {
    fn int(&self, i: usize) -> Result<i64, Error> {
        self.as_slice().int(i)
    }
    fn opt_int(&self, i: usize) -> Result<Option<i64>, Error> {
        self.as_slice().opt_int(i)
    }
    fn text(&self, i: usize) -> Result<String, Error> {
        self.as_slice().text(i)
    }
    fn opt_text(&self, i: usize) -> Result<Option<String>, Error> {
        self.as_slice().opt_text(i)
    }
}

/// Maps a database error raised by ledger or effect SQL to a caller-safe [`Error`]: no SQL
/// text, no paths, no constraint expressions.
fn db_error_ref(e: &rusqlite::Error) -> Error {
    use rusqlite::ErrorCode as C;
    match e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            C::DatabaseBusy | C::DatabaseLocked => {
                Error::new(ErrorCode::Unavailable, "store unavailable")
            }
            C::ConstraintViolation => {
                Error::new(ErrorCode::Unavailable, "write refused by the database")
            }
            C::DiskFull | C::SystemIoFailure | C::ReadOnly | C::CannotOpen => {
                Error::new(ErrorCode::Unavailable, "store unavailable")
            }
            _ => Error::new(ErrorCode::Unavailable, "database error"),
        },
        _ => Error::new(ErrorCode::Unavailable, "database error"),
    }
}

/// Binds a value by reference: no copy of text or bytes.
impl rusqlite::ToSql for SqlValue {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            SqlValue::Null => ValueRef::Null,
            SqlValue::Integer(i) => ValueRef::Integer(*i),
            SqlValue::Text(s) => ValueRef::Text(s.as_bytes()),
            SqlValue::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

fn from_ref(v: ValueRef<'_>) -> Result<SqlValue, Error> {
    Ok(match v {
        ValueRef::Null => SqlValue::Null,
        ValueRef::Integer(i) => SqlValue::Integer(i),
        ValueRef::Text(t) => SqlValue::Text(
            std::str::from_utf8(t)
                .map_err(|_| Error::unavailable("stored text is not UTF-8"))?
                .to_string(),
        ),
        ValueRef::Blob(b) => SqlValue::Blob(b.to_vec()),
        ValueRef::Real(_) => {
            return Err(Error::unavailable(
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

    fn fail(&mut self, e: rusqlite::Error) -> Error {
        let safe = db_error_ref(&e);
        self.last_error = Some(crate::store::sqlite::map_err(e));
        safe
    }
}

fn refuse_transaction_control(sql: &str) -> Result<(), Error> {
    let head = sql
        .trim_start()
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("");
    if ["BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE"]
        .iter()
        .any(|word| head.eq_ignore_ascii_case(word))
    {
        return Err(Error::unavailable(
            "effects may not control the ledger's transaction",
        ));
    }
    Ok(())
}

impl EffectTx for SqliteEffectTx<'_> {
    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<usize, Error> {
        refuse_transaction_control(sql)?;
        let conn = self.conn;
        let out = conn
            .prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute(rusqlite::params_from_iter(params.iter())));
        out.map_err(|e| self.fail(e))
    }

    fn insert_id(&mut self, sql: &str, params: &[SqlValue]) -> Result<Option<i64>, Error> {
        debug_assert!(!is_upsert(sql), "insert_id takes plain inserts only");
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
            let mut rows = stmt.query(rusqlite::params_from_iter(params.iter()))?;
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

    #[test]
    fn upserts_are_recognised_for_insert_id() {
        assert!(is_upsert(
            "INSERT INTO t(id, v) VALUES (?1, ?2) ON CONFLICT (id) DO UPDATE SET v = excluded.v"
        ));
        assert!(is_upsert(
            "insert into t values (1)\n on conflict do\n  update set v = 2"
        ));
        assert!(!is_upsert(
            "INSERT INTO t(id) VALUES (?1) ON CONFLICT (id) DO NOTHING"
        ));
        assert!(!is_upsert("INSERT INTO updates(do_update) VALUES (1)"));
    }

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
        assert!(!err.message.contains("a > 0"), "{}", err.message);
        let err = tx.execute("SELEC nonsense", &[]).unwrap_err();
        assert!(!err.message.contains("SELEC"), "{}", err.message);
        assert!(tx.execute("  commit", &[]).is_err());
        assert!(tx.query("SELECT 1.5", &[]).is_err());
    }
}
