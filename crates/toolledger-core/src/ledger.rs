//! The ledger: the one home of the `operations` table and its `operation_events` history.
//!
//! The inline path ([`crate::engine`]) and the deferred path ([`crate::runtime`]) are two
//! paths over what this module owns:
//!
//! - a ledger row as stored ([`OperationRow`], its columns and their one reader) and the one
//!   decoder of it into a [`LedgerRow`], which checks every row against the storage contract
//!   (canonical stored JSON, the result against its digest, a well-formed request digest, a
//!   known state);
//!   the inline [`OperationRecord`](crate::engine::OperationRecord) and the deferred
//!   [`DeferredRecord`](crate::runtime::DeferredRecord) are views built on it;
//! - the statements that read rows (by scope, by `(tool, key)`, by status reference, with
//!   their intent context for the deferred view), insert them and settle them, and the event
//!   writer and reader;
//! - the statements of the operators' list, the pruner (compaction, the tombstone horizon, the
//!   counts; the driver gives the query of the next rows to compact,
//!   [`crate::store::Driver::compactable_operations`]) and the audit (its rules, the stored
//!   payloads it checks, the counts by state);
//! - the status-reference generator ([`new_status_ref`]): `op_` and 32 hex digits, the first
//!   48 bits the creation time in milliseconds, the other 80 random — for inline and deferred
//!   operations alike, so a new reference lands at the end of the `status_ref` index;
//! - the deadline check ([`check_deadlines`]): authority before retention, a deadline has
//!   passed when `now >= deadline`, one code and one message each;
//! - the strict reader of stored JSON ([`parse_stored`]) and [`is_hex64`].
//!
//! Every error it returns is a [`StoreError::Contract`] (or the backend's own storage error),
//! never SQL text.

use serde_json::Value;

use crate::digest::sha256_hex;
use crate::effect::{EffectTx, RowExt, SqlValue};
use crate::model::{Error, ErrorCode, OperationState, ToolContract};
use crate::store::StoreError;

/// The columns of a ledger row, in [`OperationRow`]'s order, as one string literal (for
/// `concat!`).
macro_rules! operation_columns {
    () => {
        "id, tenant, subject, tool, idempotency_key, request_digest,
    input_rev, output_rev, effect_rev, handler_rev, producer_rev, policy_rev, arguments,
    fingerprint, effect_kind, state, result, result_digest, status_ref, authority_deadline,
    retention_deadline, created_at, updated_at, compacted_at"
    };
}

/// One row of the `operations` table as stored: every column, typed, not yet checked against
/// the storage contract (the ledger checks it before any use). A driver's own query of ledger
/// rows (a batch's [`crate::store::BatchTx::lookup_scopes`]) selects
/// [`OperationRow::COLUMNS`] and reads each row with [`OperationRow::from_values`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationRow {
    /// `id`.
    pub id: i64,
    /// `tenant`.
    pub tenant: String,
    /// `subject`.
    pub subject: String,
    /// `tool`.
    pub tool: String,
    /// `idempotency_key`.
    pub idempotency_key: String,
    /// `request_digest`.
    pub request_digest: String,
    /// `input_rev`.
    pub input_rev: String,
    /// `output_rev`.
    pub output_rev: String,
    /// `effect_rev`.
    pub effect_rev: String,
    /// `handler_rev`.
    pub handler_rev: String,
    /// `producer_rev`.
    pub producer_rev: String,
    /// `policy_rev`.
    pub policy_rev: String,
    /// `arguments`: the canonical arguments' text.
    pub arguments: String,
    /// `fingerprint`.
    pub fingerprint: Option<String>,
    /// `effect_kind`: `inline` or `deferred`.
    pub effect_kind: String,
    /// `state`.
    pub state: String,
    /// `result`: the stored result's canonical text.
    pub result: Option<String>,
    /// `result_digest`.
    pub result_digest: Option<String>,
    /// `status_ref`.
    pub status_ref: String,
    /// `authority_deadline` (Unix seconds).
    pub authority_deadline: Option<i64>,
    /// `retention_deadline` (Unix seconds).
    pub retention_deadline: Option<i64>,
    /// `created_at` (Unix seconds).
    pub created_at: i64,
    /// `updated_at` (Unix seconds).
    pub updated_at: i64,
    /// `compacted_at` (Unix seconds): set once the row is a tombstone.
    pub compacted_at: Option<i64>,
}

impl OperationRow {
    /// The columns [`OperationRow::from_values`] reads, in its order.
    pub const COLUMNS: &'static str = operation_columns!();

    /// How many columns [`OperationRow::COLUMNS`] names.
    pub const WIDTH: usize = 24;

    /// Reads a row selected with [`OperationRow::COLUMNS`]: its first [`OperationRow::WIDTH`]
    /// values, moved out (any after them are ignored). A value of the wrong type, or a row too
    /// short, is a [`StoreError::Contract`].
    pub fn from_values(values: impl IntoIterator<Item = SqlValue>) -> Result<Self, StoreError> {
        Self::take(&mut values.into_iter())
    }

    /// Reads the next [`OperationRow::WIDTH`] values of `values`, leaving the ones after them.
    pub(crate) fn take(values: &mut impl Iterator<Item = SqlValue>) -> Result<Self, StoreError> {
        let mut next = || values.next().ok_or_else(wrong_type);
        Ok(OperationRow {
            id: int(next()?)?,
            tenant: text(next()?)?,
            subject: text(next()?)?,
            tool: text(next()?)?,
            idempotency_key: text(next()?)?,
            request_digest: text(next()?)?,
            input_rev: text(next()?)?,
            output_rev: text(next()?)?,
            effect_rev: text(next()?)?,
            handler_rev: text(next()?)?,
            producer_rev: text(next()?)?,
            policy_rev: text(next()?)?,
            arguments: text(next()?)?,
            fingerprint: opt_text(next()?)?,
            effect_kind: text(next()?)?,
            state: text(next()?)?,
            result: opt_text(next()?)?,
            result_digest: opt_text(next()?)?,
            status_ref: text(next()?)?,
            authority_deadline: opt_int(next()?)?,
            retention_deadline: opt_int(next()?)?,
            created_at: int(next()?)?,
            updated_at: int(next()?)?,
            compacted_at: opt_int(next()?)?,
        })
    }
}

fn wrong_type() -> StoreError {
    contract("a column has an unexpected type")
}

fn int(v: SqlValue) -> Result<i64, StoreError> {
    v.as_i64().ok_or_else(wrong_type)
}

fn opt_int(v: SqlValue) -> Result<Option<i64>, StoreError> {
    match v {
        SqlValue::Null => Ok(None),
        v => int(v).map(Some),
    }
}

fn text(v: SqlValue) -> Result<String, StoreError> {
    match v {
        SqlValue::Text(t) => Ok(t),
        _ => Err(wrong_type()),
    }
}

fn opt_text(v: SqlValue) -> Result<Option<String>, StoreError> {
    match v {
        SqlValue::Null => Ok(None),
        v => text(v).map(Some),
    }
}

/// The columns of a ledger row, followed by a `WHERE` clause given as a literal.
macro_rules! select_rows {
    ($where:literal) => {
        concat!("SELECT ", operation_columns!(), " FROM operations ", $where)
    };
}

/// The rows of one scope (at most one).
pub(crate) const BY_SCOPE: &str =
    select_rows!("WHERE tenant = ?1 AND subject = ?2 AND tool = ?3 AND idempotency_key = ?4");
/// The rows of one `(tool, key)` under any principal.
pub(crate) const BY_TOOL_KEY: &str =
    select_rows!("WHERE tool = ?1 AND idempotency_key = ?2 ORDER BY id");
/// The row with one status reference.
pub(crate) const BY_STATUS_REF: &str = select_rows!("WHERE status_ref = ?1");

/// One ledger row, decoded and checked against the storage contract: what every view of an
/// operation is built on.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LedgerRow {
    pub(crate) id: i64,
    pub(crate) tenant: String,
    pub(crate) subject: String,
    pub(crate) tool: String,
    pub(crate) key: String,
    pub(crate) request_digest: String,
    pub(crate) contract: ToolContract,
    pub(crate) arguments: Value,
    pub(crate) arguments_text: String,
    pub(crate) fingerprint: Option<String>,
    pub(crate) effect_kind: String,
    pub(crate) state: OperationState,
    pub(crate) result: Option<Value>,
    pub(crate) result_digest: Option<String>,
    pub(crate) status_ref: String,
    pub(crate) authority_deadline: Option<i64>,
    pub(crate) retention_deadline: Option<i64>,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
    /// When the row was compacted to a tombstone (its arguments and result removed).
    pub(crate) compacted_at: Option<i64>,
}

/// A storage-contract error saying `what`.
pub(crate) fn contract(what: &str) -> StoreError {
    StoreError::Contract(what.to_string())
}

/// A column read that failed: the only failure of [`RowExt`] is a column of the wrong type.
pub(crate) fn column<T>(read: Result<T, Error>) -> Result<T, StoreError> {
    read.map_err(|_| contract("a column has an unexpected type"))
}

/// Checks a stored row against the storage contract. A tombstone (`compacted_at` set)
/// decodes with JSON `null` arguments and no result.
pub(crate) fn decode(row: OperationRow) -> Result<LedgerRow, StoreError> {
    let state =
        OperationState::parse(&row.state).ok_or_else(|| contract("unknown operation state"))?;
    let arguments_text = row.arguments;
    let arguments = parse_stored(&arguments_text)?;
    let result_text = row.result;
    let result_digest = row.result_digest;
    let compacted_at = row.compacted_at;
    if compacted_at.is_some() {
        let removed = Some(TOMBSTONE_JSON);
        if arguments_text != TOMBSTONE_JSON
            || result_text.as_deref() != removed
            || !state.is_settled()
        {
            return Err(contract("a tombstone keeps a payload or is not settled"));
        }
    }
    let result = match (&result_text, &result_digest) {
        _ if compacted_at.is_some() => None,
        (Some(text), Some(digest)) => {
            let value = parse_stored(text)?;
            if sha256_hex(text.as_bytes()) != *digest {
                return Err(contract("stored result does not match its digest"));
            }
            Some(value)
        }
        (None, None) => None,
        _ => return Err(contract("result and result digest disagree")),
    };
    if !is_hex64(&row.request_digest) {
        return Err(contract("malformed request digest"));
    }
    Ok(LedgerRow {
        id: row.id,
        contract: ToolContract {
            name: row.tool.clone(),
            input_rev: row.input_rev,
            output_rev: row.output_rev,
            effect_rev: row.effect_rev,
            handler_rev: row.handler_rev,
            producer_rev: row.producer_rev,
            policy_rev: row.policy_rev,
        },
        tenant: row.tenant,
        subject: row.subject,
        tool: row.tool,
        key: row.idempotency_key,
        request_digest: row.request_digest,
        fingerprint: row.fingerprint,
        effect_kind: row.effect_kind,
        state,
        result,
        result_digest,
        status_ref: row.status_ref,
        authority_deadline: row.authority_deadline,
        retention_deadline: row.retention_deadline,
        created_at: row.created_at,
        updated_at: row.updated_at,
        compacted_at,
        arguments,
        arguments_text,
    })
}

/// What a tombstone keeps in place of its arguments and its result: JSON `null`.
pub(crate) const TOMBSTONE_JSON: &str = "null";

/// Reads stored JSON strictly: anything but byte-identical canonical text is a
/// storage-contract error.
pub(crate) fn parse_stored(text: &str) -> Result<Value, StoreError> {
    crate::json::parse_canonical(text.as_bytes())
        .map_err(|_| contract("stored JSON is not canonical"))
}

/// The canonical text of a value to store, and its SHA-256; `None` outside the canonical
/// domain.
pub(crate) fn encode_stored(value: &Value) -> Option<(String, String)> {
    let text = crate::json::canonical_string(value).ok()?;
    let digest = sha256_hex(text.as_bytes());
    Some((text, digest))
}

/// Whether `s` is 64 lowercase hex digits (a SHA-256 digest as stored).
pub(crate) fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A new status reference: `op_` and 32 hex digits. The first 48 bits are the creation time in
/// milliseconds and the other 80 are random, so new references land at the end of the
/// `status_ref` index instead of on a random page of it (a batch of random references dirtied
/// one index page per operation, each written to the log at commit).
pub(crate) fn new_status_ref() -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    bytes[..6].copy_from_slice(&millis.to_be_bytes()[2..]);
    getrandom::fill(&mut bytes[6..])
        .map_err(|_| Error::unavailable("no randomness available for a status reference"))?;
    Ok(format!("op_{}", hex::encode(bytes)))
}

fn deadline_passed(deadline: Option<i64>, now: i64) -> bool {
    deadline.is_some_and(|d| now >= d)
}

/// Refuses a write or a replay at `now` once a deadline has passed (`now >= deadline`):
/// the authority deadline first (`operation_authority_expired`), then the retention deadline
/// (`operation_retention_expired`).
pub(crate) fn check_deadlines(
    authority: Option<i64>,
    retention: Option<i64>,
    now: i64,
) -> Result<(), Error> {
    if deadline_passed(authority, now) {
        return Err(Error::new(
            ErrorCode::OperationAuthorityExpired,
            "the operation's authority deadline has passed",
        ));
    }
    if deadline_passed(retention, now) {
        return Err(retention_expired());
    }
    Ok(())
}

/// The refusal of a replay after the retention deadline (`operation_retention_expired`).
pub(crate) fn retention_expired() -> Error {
    Error::new(
        ErrorCode::OperationRetentionExpired,
        "the operation's retention deadline has passed; it can no longer be replayed",
    )
}

/// The columns of a new ledger row that do not depend on how it starts: scope, digest,
/// revisions, arguments, fingerprint, status reference, deadlines and time.
pub(crate) struct NewRow<'a> {
    pub(crate) tenant: &'a str,
    pub(crate) subject: &'a str,
    pub(crate) key: &'a str,
    pub(crate) contract: &'a ToolContract,
    pub(crate) request_digest: &'a str,
    pub(crate) arguments_text: &'a str,
    pub(crate) fingerprint: Option<&'a str>,
    pub(crate) status_ref: &'a str,
    pub(crate) authority_deadline: Option<i64>,
    pub(crate) retention_deadline: Option<i64>,
    pub(crate) now: i64,
}

impl NewRow<'_> {
    /// Parameters `?1`–`?17` of the insert statements.
    fn params(&self) -> Vec<SqlValue> {
        let c = self.contract;
        vec![
            self.tenant.into(),
            self.subject.into(),
            c.name.as_str().into(),
            self.key.into(),
            self.request_digest.into(),
            c.input_rev.as_str().into(),
            c.output_rev.as_str().into(),
            c.effect_rev.as_str().into(),
            c.handler_rev.as_str().into(),
            c.producer_rev.as_str().into(),
            c.policy_rev.as_str().into(),
            self.arguments_text.into(),
            self.fingerprint.map(str::to_string).into(),
            self.status_ref.into(),
            self.authority_deadline.into(),
            self.retention_deadline.into(),
            self.now.into(),
        ]
    }
}

/// Reserves a scope with an unfinished row of `effect_kind` in `state`
/// (`INSERT … ON CONFLICT DO NOTHING`). `None` when the scope is already taken.
pub(crate) fn insert_open(
    tx: &mut dyn EffectTx,
    row: &NewRow<'_>,
    effect_kind: &str,
    state: OperationState,
) -> Result<Option<i64>, Error> {
    let mut params = row.params();
    params.push(effect_kind.into());
    params.push(state.as_str().into());
    tx.insert_id(
        "INSERT INTO operations(tenant, subject, tool, idempotency_key, request_digest,
             input_rev, output_rev, effect_rev, handler_rev, producer_rev, policy_rev,
             arguments, fingerprint, status_ref, authority_deadline, retention_deadline,
             created_at, updated_at, effect_kind, state)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
             ?17, ?18, ?19)
         ON CONFLICT (tenant, subject, tool, idempotency_key) DO NOTHING",
        &params,
    )
}

/// Inserts a fresh inline row, already `applied` with its canonical result and digest.
/// `None` when the scope is already taken.
pub(crate) fn insert_applied(
    tx: &mut dyn EffectTx,
    row: &NewRow<'_>,
    result_text: &str,
    result_digest: &str,
) -> Result<Option<i64>, Error> {
    let mut params = row.params();
    params.push(result_text.into());
    params.push(result_digest.into());
    tx.insert_id(
        "INSERT INTO operations(tenant, subject, tool, idempotency_key, request_digest,
             input_rev, output_rev, effect_rev, handler_rev, producer_rev, policy_rev,
             arguments, fingerprint, effect_kind, state, status_ref, authority_deadline,
             retention_deadline, created_at, updated_at, result, result_digest)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, 'inline',
             'applied', ?14, ?15, ?16, ?17, ?17, ?18, ?19)
         ON CONFLICT (tenant, subject, tool, idempotency_key) DO NOTHING",
        &params,
    )
}

/// The states an operation may be in while its effect is unsure or not yet done: a new key
/// with the same intent may be a re-plan of it (see [`unsettled_twin`]). The partial index
/// `operations_unsettled_by_digest` holds these states' rows: on PostgreSQL by this list, on
/// SQLite as the rows without a result (these states and `dead`), so that a claim, which
/// moves a row between two of them, leaves the index alone.
pub(crate) const UNSETTLED_STATES_SQL: &str =
    "('in_progress', 'accepted', 'processing', 'outcome_unknown')";

/// The newest operation of `scope`'s caller and tool, under another key, with the same
/// request digest (the same intent), created at `since` or later and still unsettled: what a
/// call under `scope` may be a re-plan of.
pub(crate) fn unsettled_twin(
    tx: &mut dyn EffectTx,
    scope: &crate::model::Scope,
    request_digest: &str,
    since: i64,
) -> Result<Option<crate::model::EarlierOperation>, Error> {
    let sql = format!(
        "SELECT idempotency_key, status_ref, state FROM operations
          WHERE request_digest = ?1 AND result IS NULL AND state IN {UNSETTLED_STATES_SQL}
            AND tenant = ?2 AND subject = ?3 AND tool = ?4 AND idempotency_key <> ?5
            AND created_at >= ?6
          ORDER BY id DESC LIMIT 1"
    );
    let row = tx.query_opt(
        &sql,
        &[
            request_digest.into(),
            scope.tenant.as_str().into(),
            scope.subject.as_str().into(),
            scope.tool.as_str().into(),
            scope.key.as_str().into(),
            since.into(),
        ],
    )?;
    let Some(r) = row else {
        return Ok(None);
    };
    Ok(Some(crate::model::EarlierOperation {
        operation_id: r.text(0)?,
        status_ref: r.text(1)?,
        state: r.text(2)?,
    }))
}

/// Whether `(tool, key)` is held by a principal other than `(tenant, subject)`.
pub(crate) fn key_held_elsewhere(
    tx: &mut dyn EffectTx,
    tool: &str,
    key: &str,
    tenant: &str,
    subject: &str,
) -> Result<bool, Error> {
    Ok(tx
        .query_opt(
            "SELECT 1 FROM operations WHERE tool = ?1 AND idempotency_key = ?2
               AND (tenant <> ?3 OR subject <> ?4) LIMIT 1",
            &[tool.into(), key.into(), tenant.into(), subject.into()],
        )?
        .is_some())
}

/// Which unfinished states a settling update may leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unfinished {
    /// A multi-step inline operation: `in_progress`.
    Inline,
    /// A deferred operation: `accepted`, `processing`, `outcome_unknown` or `dead`.
    Deferred,
}

/// Moves operation `id` out of its unfinished states to `state` with its canonical result.
/// Returns how many rows changed (0 when it had already left them).
pub(crate) fn settle(
    tx: &mut dyn EffectTx,
    id: i64,
    from: Unfinished,
    state: OperationState,
    result_text: &str,
    result_digest: &str,
    now: i64,
) -> Result<usize, Error> {
    let sql = match from {
        Unfinished::Inline => {
            "UPDATE operations SET state = ?1, result = ?2, result_digest = ?3, updated_at = ?4
             WHERE id = ?5 AND state = 'in_progress'"
        }
        Unfinished::Deferred => {
            "UPDATE operations SET state = ?1, result = ?2, result_digest = ?3, updated_at = ?4
             WHERE id = ?5 AND state IN ('accepted', 'processing', 'outcome_unknown', 'dead')"
        }
    };
    let changed = tx.execute(
        sql,
        &[
            state.as_str().into(),
            result_text.into(),
            result_digest.into(),
            now.into(),
            id.into(),
        ],
    )?;
    Ok(changed)
}

/// Marks an unfinished deferred operation `state` without a result (an attempt that ended
/// without one); a finished operation is left as it is.
pub(crate) fn mark_deferred(
    tx: &mut dyn EffectTx,
    id: i64,
    state: OperationState,
    now: i64,
) -> Result<(), Error> {
    tx.execute_unanswered(
        "UPDATE operations SET state = ?1, updated_at = ?2
         WHERE id = ?3 AND state IN ('accepted', 'processing', 'outcome_unknown')",
        &[state.as_str().into(), now.into(), id.into()],
    )
}

/// The state and status reference of operation `id`, if it exists.
pub(crate) fn state_of(tx: &mut dyn EffectTx, id: i64) -> Result<Option<(String, String)>, Error> {
    match tx.query_opt(
        "SELECT state, status_ref FROM operations WHERE id = ?1",
        &[id.into()],
    )? {
        Some(row) => Ok(Some((row.text(0)?, row.text(1)?))),
        None => Ok(None),
    }
}

/// Whether operation `id` exists.
pub(crate) fn exists(tx: &mut dyn EffectTx, id: i64) -> Result<bool, Error> {
    Ok(tx
        .query_opt("SELECT 1 FROM operations WHERE id = ?1", &[id.into()])?
        .is_some())
}

/// Appends one event (`detail` already canonical) to an operation's history. Nothing waits
/// for its answer ([`EffectTx::execute_unanswered`]): a failure fails the transaction.
pub(crate) fn insert_event(
    tx: &mut dyn EffectTx,
    operation_id: i64,
    at: i64,
    kind: &str,
    detail: &str,
) -> Result<(), Error> {
    tx.execute_unanswered(
        "INSERT INTO operation_events(operation_id, at, kind, detail) VALUES (?1, ?2, ?3, ?4)",
        &[operation_id.into(), at.into(), kind.into(), detail.into()],
    )
}

/// One stored event: id, time, kind and its checked canonical detail.
pub(crate) type StoredEvent = (i64, i64, String, Value);

/// An operation's history, oldest first.
pub(crate) fn load_events(
    tx: &mut dyn EffectTx,
    operation_id: i64,
) -> Result<Vec<StoredEvent>, Error> {
    let rows = tx.query(
        "SELECT id, at, kind, detail FROM operation_events
         WHERE operation_id = ?1 ORDER BY id",
        &[operation_id.into()],
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        out.push((
            row.int(0)?,
            row.int(1)?,
            row.text(2)?,
            parse_stored(&row.text(3)?)?,
        ));
    }
    Ok(out)
}

/// Seconds after its last change at which an inline operation still `in_progress` is *stuck*:
/// the process that committed its first step is presumed gone. From then on a replay's
/// `operation_in_progress` answer says the operation is stuck and names `toolledger resolve`,
/// and an operator may settle it; before, resolving is refused (its later steps may still be
/// running).
pub const IN_PROGRESS_EXPIRY_SECS: i64 = 300;

/// Whether an `in_progress` operation last changed at `updated_at` is stuck at `now`
/// (`now >= updated_at + IN_PROGRESS_EXPIRY_SECS`).
pub(crate) fn in_progress_expired(updated_at: i64, now: i64) -> bool {
    now >= updated_at.saturating_add(IN_PROGRESS_EXPIRY_SECS)
}

/// The replay answer's message for an `in_progress` operation at `now`: unfinished, or stuck
/// past the in-progress expiry and to be settled by an operator.
pub(crate) fn in_progress_message(status_ref: &str, updated_at: i64, now: i64) -> String {
    if in_progress_expired(updated_at, now) {
        format!(
            "the operation is stuck in progress (unchanged for {IN_PROGRESS_EXPIRY_SECS} seconds \
             or more); an operator settles it with `toolledger resolve --status-ref {status_ref}`"
        )
    } else {
        format!("the operation has not finished; query status {status_ref}")
    }
}

/// Changes a `partial` operation to `applied` (an operator completed its remaining steps);
/// its result stays. Returns how many rows changed (0 when it is no longer `partial`).
pub(crate) fn partial_to_applied(tx: &mut dyn EffectTx, id: i64, now: i64) -> Result<usize, Error> {
    tx.execute(
        "UPDATE operations SET state = 'applied', updated_at = ?1 WHERE id = ?2 AND state = 'partial'",
        &[now.into(), id.into()],
    )
}

/// The summary columns of the operators' list, in the order [`list_rows`] reads them.
const SUMMARY_COLUMNS: &str = "id, status_ref, tool, idempotency_key, tenant, subject, \
    effect_kind, state, created_at, updated_at, CASE WHEN state = 'processing' THEN \
    (SELECT lease_until FROM outbox WHERE outbox.operation_id = operations.id) END";

/// One row of the operators' list: who, what, which state, when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SummaryRow {
    pub(crate) id: i64,
    pub(crate) status_ref: String,
    pub(crate) tool: String,
    pub(crate) key: String,
    pub(crate) tenant: String,
    pub(crate) subject: String,
    pub(crate) effect_kind: String,
    pub(crate) state: OperationState,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
    pub(crate) lease_until: Option<i64>,
}

/// Operations in any of `states` (every state when empty), of `tool` when given, created at
/// or before `created_at_most` when given; newest first by id (oldest first when
/// `oldest_first`), at most `limit`. A state filter is served by the `operations_by_state`
/// index, so a few unsure operations are found among many finished ones without a scan.
pub(crate) fn list_rows(
    tx: &mut dyn EffectTx,
    states: &[OperationState],
    tool: Option<&str>,
    created_at_most: Option<i64>,
    limit: i64,
    oldest_first: bool,
) -> Result<Vec<SummaryRow>, StoreError> {
    let mut clauses = Vec::new();
    let mut params: Vec<SqlValue> = Vec::new();
    if !states.is_empty() {
        let mut marks = Vec::with_capacity(states.len());
        for st in states {
            params.push(st.as_str().into());
            marks.push(format!("?{}", params.len()));
        }
        clauses.push(format!("state IN ({})", marks.join(", ")));
    }
    if let Some(t) = tool {
        params.push(t.into());
        clauses.push(format!("tool = ?{}", params.len()));
    }
    if let Some(c) = created_at_most {
        params.push(c.into());
        clauses.push(format!("created_at <= ?{}", params.len()));
    }
    params.push(limit.into());
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS} FROM operations {filter} ORDER BY id {} LIMIT ?{}",
        if oldest_first { "ASC" } else { "DESC" },
        params.len()
    );
    summary_rows(tx, &sql, &params)
}

/// Runs `sql`, which selects [`SUMMARY_COLUMNS`], and decodes its rows.
fn summary_rows(
    tx: &mut dyn EffectTx,
    sql: &str,
    params: &[SqlValue],
) -> Result<Vec<SummaryRow>, StoreError> {
    let rows = tx.query(sql, params).map_err(|e| tx.store_error(e))?;
    rows.iter()
        .map(|row| {
            Ok(SummaryRow {
                id: column(row.int(0))?,
                status_ref: column(row.text(1))?,
                tool: column(row.text(2))?,
                key: column(row.text(3))?,
                tenant: column(row.text(4))?,
                subject: column(row.text(5))?,
                effect_kind: column(row.text(6))?,
                state: OperationState::parse(&column(row.text(7))?)
                    .ok_or_else(|| contract("unknown operation state"))?,
                created_at: column(row.int(8))?,
                updated_at: column(row.int(9))?,
                lease_until: column(row.opt_int(10))?,
            })
        })
        .collect()
}

/// The unsure operations an operator looks at: rows in one of `states` where an
/// `in_progress` row counts only once it is stuck (last changed at or before
/// `stuck_at_most`) and a `processing` row only once its lease has ended (at or before
/// `now`), of `tenant` and `tool` when given, created at or before `created_at_most` when
/// given.
pub(crate) struct UnsureFilter<'a> {
    pub(crate) states: &'a [OperationState],
    pub(crate) stuck_at_most: i64,
    pub(crate) now: i64,
    pub(crate) tenant: Option<&'a str>,
    pub(crate) tool: Option<&'a str>,
    pub(crate) created_at_most: Option<i64>,
}

impl UnsureFilter<'_> {
    /// The `WHERE` clause and its parameters.
    fn sql(&self) -> (String, Vec<SqlValue>) {
        let mut params: Vec<SqlValue> = Vec::new();
        let mut marks = Vec::with_capacity(self.states.len());
        for st in self.states {
            params.push(st.as_str().into());
            marks.push(format!("?{}", params.len()));
        }
        params.push(self.stuck_at_most.into());
        let mut clauses = vec![
            format!("state IN ({})", marks.join(", ")),
            format!(
                "(state <> 'in_progress' OR updated_at <= ?{})",
                params.len()
            ),
        ];
        params.push(self.now.into());
        clauses.push(format!(
            "(state <> 'processing' OR id IN (SELECT operation_id FROM outbox \
             WHERE state = 'processing' AND lease_until <= ?{}))",
            params.len()
        ));
        // `tenant || ''` and `tool || ''`: the unique scope index leads with the tenant (and
        // another with the tool), and without statistics SQLite would take one of them for an
        // equality on its first column and walk every operation of the tenant or tool; the
        // few unsure rows are found through `operations_by_state` instead.
        if let Some(t) = self.tenant {
            params.push(t.into());
            clauses.push(format!("tenant || '' = ?{}", params.len()));
        }
        if let Some(t) = self.tool {
            params.push(t.into());
            clauses.push(format!("tool || '' = ?{}", params.len()));
        }
        if let Some(c) = self.created_at_most {
            params.push(c.into());
            clauses.push(format!("created_at <= ?{}", params.len()));
        }
        (clauses.join(" AND "), params)
    }
}

/// One page of the unsure operations `f` selects, newest first: the rows created before the
/// operation `before` (a status reference; from the newest when `None`), at most `limit`.
/// Served by the `operations_by_state` index.
pub(crate) fn unsure_rows(
    tx: &mut dyn EffectTx,
    f: &UnsureFilter<'_>,
    before: Option<&str>,
    limit: i64,
) -> Result<Vec<SummaryRow>, StoreError> {
    let (mut filter, mut params) = f.sql();
    if let Some(r) = before {
        params.push(r.into());
        filter.push_str(&format!(
            " AND id < (SELECT id FROM operations WHERE status_ref = ?{})",
            params.len()
        ));
    }
    params.push(limit.into());
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS} FROM operations WHERE {filter} ORDER BY id DESC LIMIT ?{}",
        params.len()
    );
    summary_rows(tx, &sql, &params)
}

/// How many unsure operations `f` selects in each state, with the creation time of the
/// oldest: `(state, count, oldest created_at)` for the states that hold any.
pub(crate) fn unsure_counts(
    tx: &mut dyn EffectTx,
    f: &UnsureFilter<'_>,
) -> Result<Vec<(OperationState, i64, i64)>, StoreError> {
    let (filter, params) = f.sql();
    let sql = format!(
        "SELECT state, count(*), min(created_at) FROM operations WHERE {filter} \
         GROUP BY state ORDER BY state"
    );
    let rows = tx.query(&sql, &params).map_err(|e| tx.store_error(e))?;
    rows.iter()
        .map(|row| {
            Ok((
                OperationState::parse(&column(row.text(0))?)
                    .ok_or_else(|| contract("unknown operation state"))?,
                column(row.int(1))?,
                column(row.int(2))?,
            ))
        })
        .collect()
}

/// The ledger rows with this status reference (at most one), decoded and checked.
pub(crate) fn rows_by_status_ref(
    tx: &mut dyn EffectTx,
    status_ref: &str,
) -> Result<Vec<LedgerRow>, StoreError> {
    decode_all(tx, BY_STATUS_REF, &[status_ref.into()])
}

/// The ledger rows of `(tool, key)` under any principal, oldest first, decoded and checked.
pub(crate) fn rows_by_tool_key(
    tx: &mut dyn EffectTx,
    tool: &str,
    key: &str,
) -> Result<Vec<LedgerRow>, StoreError> {
    decode_all(tx, BY_TOOL_KEY, &[tool.into(), key.into()])
}

fn decode_all(
    tx: &mut dyn EffectTx,
    sql: &str,
    params: &[SqlValue],
) -> Result<Vec<LedgerRow>, StoreError> {
    let rows = tx.query(sql, params).map_err(|e| tx.store_error(e))?;
    rows.into_iter()
        .map(|r| decode(OperationRow::from_values(r)?))
        .collect()
}

/// A ledger row ([`OperationRow::COLUMNS`]) followed by its intent context
/// ([`row_with_intent`]). The intent columns come through a derived table so that the
/// ledger's unqualified column names stay unambiguous.
const SELECT_DEFERRED: &str = concat!(
    "SELECT ",
    operation_columns!(),
    ", d.operation_id, d.provider, d.api_family, d.adapter_revision, d.turn_id, d.call_id,
    d.response_id, d.downstream_key, d.approval_id, d.approver, d.approval_digest,
    d.approved_at, d.approval_expires_at
    FROM operations o LEFT JOIN (SELECT operation_id, provider, api_family, adapter_revision,
        turn_id, call_id, response_id, downstream_key, approval_id, approver, approval_digest,
        approved_at, approval_expires_at FROM deferred_intents) d ON d.operation_id = o.id"
);

/// Which operation [`row_with_intent`] reads.
pub(crate) enum RowBy<'a> {
    /// The operation of one scope.
    Scope(&'a crate::model::Scope),
    /// The operation with one status reference.
    StatusRef(&'a str),
    /// The operation with one id.
    Id(i64),
}

/// The ledger row `by` names, and after it the columns of its intent context
/// (`deferred_intents`: `operation_id`, `provider`, `api_family`, `adapter_revision`,
/// `turn_id`, `call_id`, `response_id`, `downstream_key`, `approval_id`, `approver`,
/// `approval_digest`, `approved_at`, `approval_expires_at`), all `NULL` when it has none.
pub(crate) fn row_with_intent(
    tx: &mut dyn EffectTx,
    by: RowBy<'_>,
) -> Result<Option<(OperationRow, Vec<SqlValue>)>, StoreError> {
    let (clause, args): (&str, Vec<SqlValue>) = match by {
        RowBy::Scope(scope) => (
            "o.tenant = ?1 AND o.subject = ?2 AND o.tool = ?3 AND o.idempotency_key = ?4",
            vec![
                scope.tenant.as_str().into(),
                scope.subject.as_str().into(),
                scope.tool.as_str().into(),
                scope.key.as_str().into(),
            ],
        ),
        RowBy::StatusRef(status_ref) => ("o.status_ref = ?1", vec![status_ref.into()]),
        RowBy::Id(id) => ("o.id = ?1", vec![id.into()]),
    };
    let sql = format!("{SELECT_DEFERRED} WHERE {clause}");
    let row = tx.query_opt(&sql, &args).map_err(|e| tx.store_error(e))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let mut values = row.into_iter();
    let operation = OperationRow::take(&mut values)?;
    Ok(Some((operation, values.collect())))
}

/// The audit's semantic rules ([`crate::audit`]), by name, with the query returning the
/// offending rows' opaque references.
pub const RULES: &[(&str, &str)] = &[
    (
        "succeeded_operation_without_receipt",
        "SELECT o.status_ref FROM operations o
         WHERE o.effect_kind = 'deferred' AND o.state = 'succeeded' AND o.compacted_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM local_receipts r WHERE r.operation_id = o.id)",
    ),
    (
        "delivered_event_without_succeeded_operation",
        "SELECT o.status_ref FROM outbox e JOIN operations o ON o.id = e.operation_id
         WHERE e.state = 'delivered' AND o.state <> 'succeeded' AND o.state <> 'failed'",
    ),
    (
        "failed_operation_not_closed",
        "SELECT o.status_ref FROM operations o JOIN outbox e ON e.operation_id = o.id
         WHERE o.effect_kind = 'deferred' AND o.state = 'failed' AND e.state <> 'delivered'",
    ),
    (
        "succeeded_operation_not_delivered",
        "SELECT o.status_ref FROM operations o JOIN outbox e ON e.operation_id = o.id
         WHERE o.state = 'succeeded' AND e.state <> 'delivered'",
    ),
    (
        "deferred_operation_without_event_or_context",
        "SELECT o.status_ref FROM operations o
         WHERE o.effect_kind = 'deferred' AND o.compacted_at IS NULL
           AND (NOT EXISTS (SELECT 1 FROM outbox e WHERE e.operation_id = o.id)
             OR NOT EXISTS (SELECT 1 FROM deferred_intents d WHERE d.operation_id = o.id))",
    ),
    (
        "orphan_receipt",
        "SELECT 'receipt:' || r.id FROM local_receipts r JOIN operations o ON o.id = r.operation_id
         LEFT JOIN outbox e ON e.operation_id = o.id
         WHERE o.state <> 'succeeded' OR e.state IS DISTINCT FROM 'delivered'",
    ),
    (
        "approval_not_consumed_by_its_operation",
        "SELECT o.status_ref FROM deferred_intents d JOIN operations o ON o.id = d.operation_id
         LEFT JOIN approvals a ON a.approval_id = d.approval_id
         WHERE d.approval_id IS NOT NULL
           AND (a.consumed_operation IS DISTINCT FROM o.id
             OR a.binding_digest IS DISTINCT FROM d.approval_digest)",
    ),
    (
        "tombstone_before_retention_or_with_payload",
        "SELECT o.status_ref FROM operations o
         WHERE o.compacted_at IS NOT NULL
           AND (o.retention_deadline IS NULL OR o.retention_deadline > o.compacted_at
             OR EXISTS (SELECT 1 FROM operation_events v WHERE v.operation_id = o.id)
             OR EXISTS (SELECT 1 FROM outbox e WHERE e.operation_id = o.id)
             OR EXISTS (SELECT 1 FROM deferred_intents d WHERE d.operation_id = o.id)
             OR EXISTS (SELECT 1 FROM local_receipts r WHERE r.operation_id = o.id))",
    ),
];

/// Every row of a parameterless audit query, its failure the store's.
fn audit_rows(tx: &mut dyn EffectTx, sql: &str) -> Result<Vec<Vec<SqlValue>>, StoreError> {
    tx.query(sql, &[]).map_err(|e| tx.store_error(e))
}

/// A column of an audit query that has an unexpected type.
fn audit_column(e: Error) -> StoreError {
    StoreError::Contract(e.message)
}

/// One deferred operation's stored payload, for the audit's content check.
pub(crate) struct StoredPayload {
    pub(crate) status_ref: String,
    pub(crate) arguments: String,
    pub(crate) result: Option<String>,
    pub(crate) result_digest: Option<String>,
}

/// The stored payload of every deferred operation.
pub(crate) fn deferred_payloads(tx: &mut dyn EffectTx) -> Result<Vec<StoredPayload>, StoreError> {
    audit_rows(
        tx,
        "SELECT status_ref, arguments, result, result_digest FROM operations
         WHERE effect_kind = 'deferred'",
    )?
    .into_iter()
    .map(|r| {
        Ok(StoredPayload {
            status_ref: r.text(0).map_err(audit_column)?,
            arguments: r.text(1).map_err(audit_column)?,
            result: r.opt_text(2).map_err(audit_column)?,
            result_digest: r.opt_text(3).map_err(audit_column)?,
        })
    })
    .collect()
}

/// How many operations are in each state.
pub(crate) fn counts_by_state(
    tx: &mut dyn EffectTx,
) -> Result<std::collections::BTreeMap<String, i64>, StoreError> {
    audit_rows(
        tx,
        "SELECT state, count(*) FROM operations GROUP BY state ORDER BY state",
    )?
    .iter()
    .map(|r| {
        Ok((
            r.text(0).map_err(audit_column)?,
            r.int(1).map_err(audit_column)?,
        ))
    })
    .collect()
}

/// How many operations are tombstones.
pub(crate) fn tombstone_count(tx: &mut dyn EffectTx) -> Result<i64, StoreError> {
    audit_rows(
        tx,
        "SELECT count(*) FROM operations WHERE compacted_at IS NOT NULL",
    )?
    .first()
    .ok_or_else(|| StoreError::Contract("no row".into()))?
    .int(0)
    .map_err(audit_column)
}

/// For each state that holds operations: `(state, count, oldest updated_at)`.
pub(crate) fn states_and_oldest_change(
    tx: &mut dyn EffectTx,
) -> Result<Vec<(String, i64, i64)>, StoreError> {
    audit_rows(
        tx,
        "SELECT state, count(*), min(updated_at) FROM operations GROUP BY state ORDER BY state",
    )?
    .iter()
    .map(|r| {
        Ok((
            r.text(0).map_err(audit_column)?,
            r.int(1).map_err(audit_column)?,
            r.int(2).map_err(audit_column)?,
        ))
    })
    .collect()
}

/// The live, settled operations past their retention deadline (`?1`), oldest deadline first,
/// at most `?2`: the portable form of [`crate::store::Driver::compactable_operations`].
pub(crate) const COMPACTABLE: &str = "SELECT id FROM operations
     WHERE compacted_at IS NULL AND retention_deadline IS NOT NULL AND retention_deadline <= ?1
       AND (state = 'applied' OR state = 'succeeded' OR state = 'failed')
     ORDER BY retention_deadline LIMIT ?2";

/// The tombstones whose retention deadline is at or before `?1` (now minus the horizon),
/// oldest first, at most `?2`.
pub(crate) const EXPIRED_TOMBSTONES: &str = "SELECT id FROM operations
     WHERE compacted_at IS NOT NULL AND retention_deadline <= ?1
     ORDER BY retention_deadline LIMIT ?2";

/// How many live operations past their retention deadline at `now` are not settled, and the
/// creation time of the oldest.
pub(crate) fn kept_unsettled(tx: &mut dyn EffectTx, now: i64) -> Result<(i64, Option<i64>), Error> {
    let row = tx
        .query_opt(
            "SELECT count(*), min(created_at) FROM operations
     WHERE compacted_at IS NULL AND retention_deadline IS NOT NULL AND retention_deadline <= ?1
       AND state <> 'applied' AND state <> 'succeeded' AND state <> 'failed'",
            &[now.into()],
        )?
        .ok_or_else(|| Error::unavailable("no count"))?;
    Ok((row.int(0)?, row.opt_int(1)?))
}

/// How many rows a query of ids of `(?1, ?2)` ([`COMPACTABLE`], [`EXPIRED_TOMBSTONES`])
/// selects with `at` and `limit`.
pub(crate) fn count_of(
    tx: &mut dyn EffectTx,
    ids_query: &str,
    at: i64,
    limit: i64,
) -> Result<i64, Error> {
    let sql = format!("SELECT count(*) FROM ({ids_query}) AS c");
    tx.query_opt(&sql, &[at.into(), limit.into()])?
        .ok_or_else(|| Error::unavailable("no count"))?
        .int(0)
}

/// The ids a query of `(?1, ?2)` selects with `at` and `n`, and as many `NULL`s after them as
/// make `n` values: the statements that take them as an `IN` list ([`marks`]) then have one
/// text per batch size (a `NULL` matches no row), so the store's statement cache keeps them
/// however many rows were due. Also how many ids were found.
pub(crate) fn ids_of(
    tx: &mut dyn EffectTx,
    ids_query: &str,
    at: i64,
    n: i64,
) -> Result<(Vec<SqlValue>, usize), Error> {
    let mut ids = tx
        .query(ids_query, &[at.into(), n.into()])?
        .into_iter()
        .map(|r| {
            r.into_iter()
                .next()
                .ok_or_else(|| Error::unavailable("no id"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let found = ids.len();
    ids.resize(n.max(0) as usize, SqlValue::Null);
    Ok((ids, found))
}

/// `?{from}, ?{from+1}, …` for `n` parameters.
pub(crate) fn marks(from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Compacts the live operations among `ids` ([`ids_of`]) to tombstones at `now`: their
/// arguments and result become [`TOMBSTONE_JSON`]. Returns how many changed.
pub(crate) fn compact(tx: &mut dyn EffectTx, ids: Vec<SqlValue>, now: i64) -> Result<usize, Error> {
    let k = ids.len();
    let list = marks(1, k);
    let mut params = ids;
    params.push(TOMBSTONE_JSON.into());
    params.push(sha256_hex(TOMBSTONE_JSON.as_bytes()).into());
    params.push(now.into());
    tx.execute(
        &format!(
            "UPDATE operations SET arguments = ?{a}, result = ?{a}, result_digest = ?{d},
                 compacted_at = ?{t}
             WHERE id IN ({list}) AND compacted_at IS NULL",
            a = k + 1,
            d = k + 2,
            t = k + 3,
        ),
        &params,
    )
}

/// Deletes the tombstones among `ids` ([`ids_of`]). Returns how many were deleted.
pub(crate) fn delete_tombstones(tx: &mut dyn EffectTx, ids: &[SqlValue]) -> Result<usize, Error> {
    let list = marks(1, ids.len());
    tx.execute(
        &format!("DELETE FROM operations WHERE id IN ({list}) AND compacted_at IS NOT NULL"),
        ids,
    )
}

/// How many operation rows there are, and how many of them are tombstones.
pub(crate) fn row_counts(tx: &mut dyn EffectTx) -> Result<(i64, i64), Error> {
    let row = tx
        .query_opt("SELECT count(*), count(compacted_at) FROM operations", &[])?
        .ok_or_else(|| Error::unavailable("no count"))?;
    Ok((row.int(0)?, row.int(1)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_json_must_be_canonical() {
        assert_eq!(parse_stored(r#"{"a":1,"b":[true]}"#).unwrap()["a"], 1);
        for bad in [
            r#"{"b":1,"a":2}"#,
            r#"{"a":1.0}"#,
            r#"{"a":1,"a":2}"#,
            r#"{ "a":1}"#,
            r#"{"a":"\u0041"}"#,
            "not json",
        ] {
            let err = Error::from(parse_stored(bad).unwrap_err());
            assert_eq!(err.code, ErrorCode::Unavailable, "{bad}");
        }
    }

    #[test]
    fn status_refs_are_opaque_and_distinct() {
        let a = new_status_ref().unwrap();
        let b = new_status_ref().unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with("op_") && a.len() == 35);
    }

    #[test]
    fn status_refs_sort_by_creation_time() {
        let a = new_status_ref().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = new_status_ref().unwrap();
        assert!(a[..15] < b[..15], "{a} then {b}");
        assert_ne!(a[15..], b[15..]);
    }

    #[test]
    fn deadlines_pass_at_the_deadline_authority_first() {
        assert!(check_deadlines(Some(10), Some(10), 9).is_ok());
        assert!(check_deadlines(None, None, i64::MAX).is_ok());
        let both = check_deadlines(Some(10), Some(10), 10).unwrap_err();
        assert_eq!(both.code, ErrorCode::OperationAuthorityExpired);
        let retention = check_deadlines(Some(20), Some(10), 10).unwrap_err();
        assert_eq!(retention.code, ErrorCode::OperationRetentionExpired);
    }

    #[test]
    fn an_in_progress_operation_is_stuck_from_its_expiry_on() {
        let t = 1_000;
        assert!(!in_progress_expired(t, t + IN_PROGRESS_EXPIRY_SECS - 1));
        assert!(in_progress_expired(t, t + IN_PROGRESS_EXPIRY_SECS));
        assert!(!in_progress_expired(i64::MAX - 1, i64::MAX - 1));
        let live = in_progress_message("op_x", t, t);
        assert!(live.contains("has not finished"), "{live}");
        let stuck = in_progress_message("op_x", t, t + IN_PROGRESS_EXPIRY_SECS);
        assert!(
            stuck.contains("stuck") && stuck.contains("toolledger resolve --status-ref op_x"),
            "{stuck}"
        );
    }

    #[test]
    fn hex64_is_lowercase_hex_of_length_64() {
        assert!(is_hex64(&"a".repeat(64)));
        assert!(!is_hex64(&"A".repeat(64)));
        assert!(!is_hex64(&"a".repeat(63)));
        assert!(!is_hex64(&"g".repeat(64)));
    }
}
