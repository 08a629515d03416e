//! The transaction handle an inline effect writes through.
//!
//! An inline effect runs inside the ledger's own write transaction, so the effect row and the
//! ledger row commit (or roll back) together. Effects get an [`EffectTx`] instead of a raw
//! database handle: SQL uses numbered `?1`-style placeholders and plain [`SqlValue`]s, which
//! every backend can translate, so the engine's public API is not tied to SQLite.
//!
//! A constraint or trigger failure inside the effect surfaces as an [`Error`] with code
//! `unavailable` (messages never carry SQL text or paths) and rolls back the whole call.

use crate::model::Error;
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

    /// Runs one statement whose answer the caller does not need before its next statement
    /// (an append such as an event row): it must succeed, and its row count is not wanted.
    /// PostgreSQL may send it together with the next statement or with `COMMIT`, one round
    /// trip fewer; its failure then fails that later statement (or the commit), and the
    /// transaction is rolled back either way. By default (SQLite) it runs at once.
    fn execute_unanswered(&mut self, sql: &str, params: &[SqlValue]) -> Result<(), Error> {
        self.execute(sql, params).map(|_| ())
    }

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

    /// The storage error behind `e`, a failed statement's error: the backend's, when it kept
    /// one ([`EffectTx::take_store_error`]); otherwise a storage-contract error (e.g. a column
    /// of the wrong type). What a `Store::write`/`read` closure returns for a statement that
    /// failed.
    fn store_error(&mut self, e: Error) -> StoreError {
        self.take_store_error()
            .unwrap_or(StoreError::Contract(e.message))
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

    /// Runs a single-row `SELECT` (without a locking clause) that also locks the row it
    /// returns until this transaction ends, and answers `None` for a row another transaction
    /// holds locked instead of waiting for it. PostgreSQL appends `FOR UPDATE SKIP LOCKED`;
    /// by default (SQLite, whose one write transaction at a time already holds every row) it
    /// is [`EffectTx::query_opt`].
    fn query_opt_locked(
        &mut self,
        sql: &str,
        params: &[SqlValue],
    ) -> Result<Option<Vec<SqlValue>>, Error> {
        self.query_opt(sql, params)
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
pub fn is_upsert(sql: &str) -> bool {
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

/// Refuses transaction control (`BEGIN`, `START`, `COMMIT`, `END`, `ROLLBACK`, `ABORT`,
/// `SAVEPOINT`, `RELEASE`) in a statement an effect sends: the ledger owns the transaction. Every
/// driver's [`EffectTx`] calls it before sending a statement.
pub fn refuse_transaction_control(sql: &str) -> Result<(), Error> {
    let head = sql
        .trim_start()
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("");
    if [
        "BEGIN",
        "COMMIT",
        "END",
        "ROLLBACK",
        "SAVEPOINT",
        "RELEASE",
        "START",
        "ABORT",
    ]
    .iter()
    .any(|word| head.eq_ignore_ascii_case(word))
    {
        return Err(Error::unavailable(
            "effects may not control the ledger's transaction",
        ));
    }
    Ok(())
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
}
