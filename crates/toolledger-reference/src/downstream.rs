//! An offline stand-in for a downstream system: a payments service whose receipts live in
//! their **own** SQLite file, committed separately from the ledger — exactly the gap the
//! ledger's `outcome_unknown` state exists for.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension};
use serde_json::{json, Value};

use toolledger::clock::SharedClock;
use toolledger::digest::sha256_hex;
use toolledger::downstream::{scope_digest, BoxFuture, Downstream, DownstreamError};
use toolledger::json;
use toolledger::model::Scope;

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS downstream_receipts (
    scope_digest   TEXT    PRIMARY KEY NOT NULL CHECK (length(scope_digest) = 64),
    status_ref     TEXT    NOT NULL UNIQUE CHECK (length(status_ref) BETWEEN 8 AND 128),
    request        TEXT    NOT NULL CHECK (json_valid(request) AND json_type(request) = 'object'),
    request_sha256 TEXT    NOT NULL CHECK (length(request_sha256) = 64),
    receipt_id     TEXT    NOT NULL UNIQUE CHECK (length(receipt_id) BETWEEN 8 AND 128),
    receipt        TEXT    NOT NULL CHECK (json_valid(receipt) AND json_type(receipt) = 'object'),
    committed_at   INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS downstream_captures (
    tenant         TEXT    NOT NULL CHECK (length(tenant) BETWEEN 1 AND 128),
    order_id       TEXT    NOT NULL CHECK (length(order_id) BETWEEN 1 AND 128),
    captured_cents INTEGER NOT NULL CHECK (captured_cents >= 0),
    PRIMARY KEY (tenant, order_id)
) STRICT;
CREATE TABLE IF NOT EXISTS downstream_refunds (
    scope_digest   TEXT    PRIMARY KEY NOT NULL REFERENCES downstream_receipts(scope_digest),
    tenant         TEXT    NOT NULL,
    order_id       TEXT    NOT NULL,
    amount_cents   INTEGER NOT NULL CHECK (amount_cents > 0)
) STRICT;
CREATE INDEX IF NOT EXISTS downstream_refunds_by_order ON downstream_refunds(tenant, order_id);
CREATE TABLE IF NOT EXISTS downstream_refusals (
    scope_digest   TEXT    PRIMARY KEY NOT NULL CHECK (length(scope_digest) = 64),
    status_ref     TEXT    NOT NULL UNIQUE CHECK (length(status_ref) BETWEEN 8 AND 128),
    request_sha256 TEXT    NOT NULL CHECK (length(request_sha256) = 64),
    code           TEXT    NOT NULL CHECK (length(code) BETWEEN 1 AND 64),
    message        TEXT    NOT NULL CHECK (length(message) BETWEEN 1 AND 256),
    refused_at     INTEGER NOT NULL
) STRICT;";

/// The refusal code of the stand-in when a refund would exceed what was captured.
pub const REFUND_EXCEEDS_CAPTURED: &str = "refund_exceeds_captured";

/// The offline stand-in: a payments service whose receipts live in their own SQLite file.
///
/// It knows what it captured per order ([`SqliteDownstream::set_captured`]) and what it has
/// refunded under every key, which the ledger's order row does not: a refund request
/// `{arguments: {order_id, amount_cents}}` that would take an order's refunded total above its
/// captured amount is refused definitively ([`DownstreamError::Refused`] with code
/// [`REFUND_EXCEEDS_CAPTURED`]); the refusal is stored, so the same scope gets it again.
/// Orders without a captured amount are not limited.
#[derive(Clone)]
pub struct SqliteDownstream {
    conn: Arc<Mutex<Connection>>,
    clock: SharedClock,
}

impl std::fmt::Debug for SqliteDownstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteDownstream").finish_non_exhaustive()
    }
}

fn unavailable(e: rusqlite::Error) -> DownstreamError {
    let _ = e;
    DownstreamError::Unavailable("downstream store error".into())
}

impl SqliteDownstream {
    /// Opens (creating if needed) the stand-in's file at `path` (WAL, `synchronous=FULL`).
    pub fn open(path: impl AsRef<Path>, clock: SharedClock) -> Result<Self, DownstreamError> {
        toolledger::store::sqlite::create_private_file(path.as_ref())
            .map_err(|_| DownstreamError::Unavailable("downstream store error".into()))?;
        let conn = Connection::open(path.as_ref()).map_err(unavailable)?;
        conn.busy_timeout(Duration::from_millis(5000))
            .map_err(unavailable)?;
        let mut tries = 0;
        loop {
            match conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0)) {
                Ok(_) => break,
                Err(_) if tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(unavailable(e)),
            }
        }
        conn.execute_batch("PRAGMA synchronous=FULL;")
            .map_err(unavailable)?;
        conn.execute_batch(SCHEMA).map_err(unavailable)?;
        Ok(SqliteDownstream {
            conn: Arc::new(Mutex::new(conn)),
            clock,
        })
    }

    fn with_conn<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, DownstreamError>,
    ) -> Result<T, DownstreamError> {
        let mut guard = self
            .conn
            .lock()
            .map_err(|_| DownstreamError::Unavailable("downstream poisoned".into()))?;
        f(&mut guard)
    }

    /// Blocking form of [`Downstream::submit`].
    pub fn submit_blocking(
        &self,
        scope: &Scope,
        request: &Value,
    ) -> Result<Value, DownstreamError> {
        let status_ref = request
            .get("status_ref")
            .and_then(Value::as_str)
            .ok_or_else(|| DownstreamError::Rejected("request needs a status_ref".into()))?
            .to_string();
        let request_text = json::canonical_string(request)
            .map_err(|_| DownstreamError::Rejected("request is not canonical JSON".into()))?;
        if !request.is_object() {
            return Err(DownstreamError::Rejected(
                "request must be an object".into(),
            ));
        }
        let key = scope_digest(scope);
        let request_sha = sha256_hex(request_text.as_bytes());
        let now = self.clock.now();
        self.with_conn(|conn| {
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(unavailable)?;
            let existing: Option<(String, String)> = tx
                .query_row(
                    "SELECT request_sha256, receipt FROM downstream_receipts
                     WHERE scope_digest = ?1",
                    [&key],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(unavailable)?;
            if let Some((sha, receipt)) = existing {
                if sha != request_sha {
                    return Err(DownstreamError::Conflict);
                }
                return serde_json::from_str(&receipt)
                    .map_err(|_| DownstreamError::Unavailable("stored receipt unreadable".into()));
            }
            let refused: Option<(String, String, String)> = tx
                .query_row(
                    "SELECT request_sha256, code, message FROM downstream_refusals
                     WHERE scope_digest = ?1",
                    [&key],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()
                .map_err(unavailable)?;
            if let Some((sha, code, message)) = refused {
                if sha != request_sha {
                    return Err(DownstreamError::Conflict);
                }
                return Err(DownstreamError::Refused { code, message });
            }
            let refund = request.get("arguments").and_then(|a| {
                Some((
                    a.get("order_id")?.as_str()?.to_string(),
                    a.get("amount_cents")?.as_i64()?,
                ))
            });
            if let Some((order_id, amount)) = &refund {
                let captured: Option<i64> = tx
                    .query_row(
                        "SELECT captured_cents FROM downstream_captures
                         WHERE tenant = ?1 AND order_id = ?2",
                        rusqlite::params![scope.tenant, order_id],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(unavailable)?;
                let refunded: i64 = tx
                    .query_row(
                        "SELECT coalesce(sum(amount_cents), 0) FROM downstream_refunds
                         WHERE tenant = ?1 AND order_id = ?2",
                        rusqlite::params![scope.tenant, order_id],
                        |r| r.get(0),
                    )
                    .map_err(unavailable)?;
                if captured.is_some_and(|c| refunded.saturating_add(*amount) > c) {
                    let message = "the refund would exceed the amount captured for the order";
                    tx.execute(
                        "INSERT INTO downstream_refusals (scope_digest, status_ref,
                             request_sha256, code, message, refused_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                        rusqlite::params![
                            key,
                            status_ref,
                            request_sha,
                            REFUND_EXCEEDS_CAPTURED,
                            message,
                            now
                        ],
                    )
                    .map_err(unavailable)?;
                    tx.commit().map_err(unavailable)?;
                    return Err(DownstreamError::Refused {
                        code: REFUND_EXCEEDS_CAPTURED.into(),
                        message: message.into(),
                    });
                }
            }
            let receipt_id = format!(
                "rcpt_{}",
                &sha256_hex(format!("{key}:{request_sha}").as_bytes())[..32]
            );
            let receipt = json!({
                "receipt_id": receipt_id,
                "scope_digest": key,
                "status_ref": status_ref,
                "request_sha256": request_sha,
                "request": request,
                "committed_at": now,
            });
            let receipt_text = json::canonical_string(&receipt)
                .map_err(|_| DownstreamError::Rejected("receipt is not canonical".into()))?;
            tx.execute(
                "INSERT INTO downstream_receipts (scope_digest, status_ref, request,
                     request_sha256, receipt_id, receipt, committed_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                rusqlite::params![
                    key,
                    status_ref,
                    request_text,
                    request_sha,
                    receipt_id,
                    receipt_text,
                    now
                ],
            )
            .map_err(|e| match e {
                rusqlite::Error::SqliteFailure(f, _)
                    if f.code == rusqlite::ErrorCode::ConstraintViolation =>
                {
                    DownstreamError::Conflict
                }
                other => unavailable(other),
            })?;
            if let Some((order_id, amount)) = &refund {
                if *amount > 0 {
                    tx.execute(
                        "INSERT INTO downstream_refunds (scope_digest, tenant, order_id,
                             amount_cents)
                         VALUES (?1, ?2, ?3, ?4)",
                        rusqlite::params![key, scope.tenant, order_id, amount],
                    )
                    .map_err(unavailable)?;
                }
            }
            tx.commit().map_err(unavailable)?;
            Ok(receipt)
        })
    }

    /// Blocking form of [`Downstream::status`].
    pub fn status_blocking(&self, status_ref: &str) -> Result<Option<Value>, DownstreamError> {
        self.with_conn(|conn| {
            let text: Option<String> = conn
                .query_row(
                    "SELECT receipt FROM downstream_receipts WHERE status_ref = ?1",
                    [status_ref],
                    |r| r.get(0),
                )
                .optional()
                .map_err(unavailable)?;
            match text {
                None => Ok(None),
                Some(t) => serde_json::from_str(&t)
                    .map(Some)
                    .map_err(|_| DownstreamError::Unavailable("stored receipt unreadable".into())),
            }
        })
    }

    /// Records that `captured_cents` were captured for `order_id` in `tenant`, unless a
    /// captured amount is already recorded (existing rows are never changed). From then on
    /// refunds of that order are limited to it in total, across idempotency keys.
    pub fn set_captured(
        &self,
        tenant: &str,
        order_id: &str,
        captured_cents: i64,
    ) -> Result<(), DownstreamError> {
        self.with_conn(|conn| {
            conn.execute(
                "INSERT INTO downstream_captures (tenant, order_id, captured_cents)
                 VALUES (?1, ?2, ?3) ON CONFLICT (tenant, order_id) DO NOTHING",
                rusqlite::params![tenant, order_id, captured_cents],
            )
            .map_err(unavailable)?;
            Ok(())
        })
    }

    /// Number of refusals the stand-in has stored.
    pub fn refusal_count(&self) -> Result<i64, DownstreamError> {
        self.with_conn(|conn| {
            conn.query_row("SELECT count(*) FROM downstream_refusals", [], |r| r.get(0))
                .map_err(unavailable)
        })
    }

    /// Number of receipts the stand-in holds (for audits and tests).
    pub fn receipt_count(&self) -> Result<i64, DownstreamError> {
        self.with_conn(|conn| {
            conn.query_row("SELECT count(*) FROM downstream_receipts", [], |r| r.get(0))
                .map_err(unavailable)
        })
    }

    /// The number of receipts the stand-in's file at `path` holds, read without creating or
    /// changing any file (for an audit beside a read-only ledger): `None` when there is no
    /// such file or it holds no receipts table. Without a write-ahead log beside the file it
    /// is read as immutable (a connection to a WAL file would otherwise create its
    /// shared-memory index).
    pub fn receipt_count_read_only(path: &Path) -> Option<i64> {
        if !path.is_file() {
            return None;
        }
        let mut wal = path.as_os_str().to_os_string();
        wal.push("-wal");
        // A `file:` URI: bytes outside the unreserved set percent-encoded.
        let mut uri = String::from("file:");
        for &b in path.as_os_str().as_encoded_bytes() {
            if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
                uri.push(b as char);
            } else {
                uri.push_str(&format!("%{b:02X}"));
            }
        }
        uri.push_str(if Path::new(&wal).exists() {
            "?mode=ro"
        } else {
            "?mode=ro&immutable=1"
        });
        let flags =
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI;
        let conn = Connection::open_with_flags(uri, flags).ok()?;
        conn.query_row("SELECT count(*) FROM downstream_receipts", [], |r| r.get(0))
            .ok()
    }

    /// Every `status_ref` the stand-in holds a receipt for.
    pub fn status_refs(&self) -> Result<Vec<String>, DownstreamError> {
        self.with_conn(|conn| {
            let mut stmt = conn
                .prepare("SELECT status_ref FROM downstream_receipts ORDER BY status_ref")
                .map_err(unavailable)?;
            let rows = stmt
                .query_map([], |r| r.get(0))
                .map_err(unavailable)?
                .collect::<Result<Vec<String>, _>>()
                .map_err(unavailable)?;
            Ok(rows)
        })
    }
}

impl Downstream for SqliteDownstream {
    fn submit<'a>(
        &'a self,
        scope: &'a Scope,
        request: &'a Value,
    ) -> BoxFuture<'a, Result<Value, DownstreamError>> {
        let this = self.clone();
        let scope = scope.clone();
        let request = request.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || this.submit_blocking(&scope, &request))
                .await
                .unwrap_or_else(|_| {
                    Err(DownstreamError::Unavailable(
                        "downstream task failed".into(),
                    ))
                })
        })
    }

    fn status<'a>(
        &'a self,
        status_ref: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, DownstreamError>> {
        let this = self.clone();
        let status_ref = status_ref.to_string();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || this.status_blocking(&status_ref))
                .await
                .unwrap_or_else(|_| {
                    Err(DownstreamError::Unavailable(
                        "downstream task failed".into(),
                    ))
                })
        })
    }
}

/// A [`SqliteDownstream`] that counts the calls made into it, so a test can prove a
/// downstream was never called (or never queried).
#[derive(Debug, Clone)]
pub struct CountingDownstream {
    /// The stand-in the calls go to (a test may also call it directly, uncounted).
    pub inner: SqliteDownstream,
    /// Submissions so far (shared by every clone).
    pub submits: Arc<AtomicUsize>,
    /// Status queries so far (shared by every clone).
    pub statuses: Arc<AtomicUsize>,
}

impl CountingDownstream {
    /// Counts the calls into `inner`, from zero.
    pub fn new(inner: SqliteDownstream) -> CountingDownstream {
        CountingDownstream {
            inner,
            submits: Arc::default(),
            statuses: Arc::default(),
        }
    }

    /// Submissions so far.
    pub fn submits(&self) -> usize {
        self.submits.load(Ordering::SeqCst)
    }

    /// Status queries so far.
    pub fn statuses(&self) -> usize {
        self.statuses.load(Ordering::SeqCst)
    }

    /// Receipts the downstream holds.
    pub fn receipts(&self) -> i64 {
        self.inner.receipt_count().expect("downstream receipts")
    }
}

impl Downstream for CountingDownstream {
    fn submit<'a>(
        &'a self,
        scope: &'a Scope,
        request: &'a Value,
    ) -> BoxFuture<'a, Result<Value, DownstreamError>> {
        self.submits.fetch_add(1, Ordering::SeqCst);
        self.inner.submit(scope, request)
    }

    fn status<'a>(
        &'a self,
        status_ref: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, DownstreamError>> {
        self.statuses.fetch_add(1, Ordering::SeqCst);
        self.inner.status(status_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolledger::clock::ManualClock;

    fn scope(key: &str) -> Scope {
        Scope {
            tenant: "t".into(),
            subject: "alice".into(),
            tool: "refund_order".into(),
            key: key.into(),
        }
    }

    #[test]
    fn submit_is_idempotent_under_the_scope_and_refuses_another_request() {
        let dir = tempfile::tempdir().unwrap();
        let d = SqliteDownstream::open(dir.path().join("d.sqlite"), Arc::new(ManualClock::new(5)))
            .unwrap();
        let req = json!({"status_ref": "op_00000001", "amount_cents": 5});
        let first = d.submit_blocking(&scope("k1"), &req).unwrap();
        let again = d.submit_blocking(&scope("k1"), &req).unwrap();
        assert_eq!(first, again);
        assert_eq!(d.receipt_count().unwrap(), 1);
        let other = json!({"status_ref": "op_00000001", "amount_cents": 6});
        assert_eq!(
            d.submit_blocking(&scope("k1"), &other).unwrap_err(),
            DownstreamError::Conflict
        );
        assert_eq!(d.receipt_count().unwrap(), 1);
        assert_eq!(d.status_blocking("op_00000001").unwrap(), Some(first));
        assert_eq!(d.status_blocking("op_00000002").unwrap(), None);
    }

    #[test]
    fn a_refund_above_the_captured_amount_is_refused_once_and_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let d = SqliteDownstream::open(dir.path().join("d.sqlite"), Arc::new(ManualClock::new(5)))
            .unwrap();
        d.set_captured("t", "ord-1", 1000).unwrap();
        let req = |sr: &str, amount: i64| json!({"status_ref": sr, "arguments": {"order_id": "ord-1", "amount_cents": amount}});
        d.submit_blocking(&scope("k1"), &req("op_00000001", 600))
            .unwrap();
        let refused = DownstreamError::Refused {
            code: REFUND_EXCEEDS_CAPTURED.into(),
            message: "the refund would exceed the amount captured for the order".into(),
        };
        let second = req("op_00000002", 500);
        assert_eq!(
            d.submit_blocking(&scope("k2"), &second).unwrap_err(),
            refused
        );
        // The same scope gets the same refusal; another request under it is a conflict.
        assert_eq!(
            d.submit_blocking(&scope("k2"), &second).unwrap_err(),
            refused
        );
        assert_eq!(
            d.submit_blocking(&scope("k2"), &req("op_00000002", 400))
                .unwrap_err(),
            DownstreamError::Conflict
        );
        assert_eq!(d.receipt_count().unwrap(), 1);
        assert_eq!(d.refusal_count().unwrap(), 1);
        assert_eq!(d.status_blocking("op_00000002").unwrap(), None);
        // Within the captured amount another key still succeeds; other tenants are unlimited.
        d.submit_blocking(&scope("k3"), &req("op_00000003", 400))
            .unwrap();
        let other = Scope {
            tenant: "u".into(),
            ..scope("k4")
        };
        d.submit_blocking(&other, &req("op_00000004", 5000))
            .unwrap();
    }

    #[test]
    fn receipts_survive_reopening_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sqlite");
        let clock: SharedClock = Arc::new(ManualClock::new(5));
        let req = json!({"status_ref": "op_00000009"});
        let first = SqliteDownstream::open(&path, clock.clone())
            .unwrap()
            .submit_blocking(&scope("k"), &req)
            .unwrap();
        let reopened = SqliteDownstream::open(&path, clock).unwrap();
        assert_eq!(
            reopened.status_blocking("op_00000009").unwrap(),
            Some(first)
        );
    }
}
