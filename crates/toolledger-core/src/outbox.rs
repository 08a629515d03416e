//! The outbox: pending deliveries of accepted deferred operations, claimed under a lease with a
//! fencing token.
//!
//! - `enqueue` writes the event in the same transaction as its operation (transaction A).
//! - `claim` moves a `pending` event, or a `processing` one whose lease has expired
//!   (`lease_until <= now`), to `processing` under a new lease and increments the fencing
//!   token. An unexpired lease is never taken over. The claiming worker's attempt limit
//!   applies: a claim of an event that was already claimed that many times moves it to `dead`
//!   instead, and the limit applied is written into the event's `max_attempts`.
//! - `renew`, `record_attempt_error` and `complete` are conditional on the fencing token:
//!   a worker whose lease was reclaimed by someone else gets [`Fenced`] and changes nothing.
//!
//! A lease alone does not make a worker safe: after expiry the old holder may still be running.
//! The fencing token is what stops its late writes. The downstream must still be idempotent
//! under our key, because a reclaim can deliver again.
//!
//! These functions run inside a caller's write transaction ([`crate::store::Store::write`]),
//! on any backend. On PostgreSQL a claim first locks the event row with
//! `FOR UPDATE SKIP LOCKED`: a row another worker is claiming right now is reported as leased
//! instead of waited for.
//!
//! The outbox owns the `outbox` table only; the operation state a claim moves (`processing`,
//! `dead`) is written through the ledger.

use serde::Serialize;

use crate::effect::{EffectTx, RowExt, SqlValue};
use crate::model::{Error, OperationState};
use crate::store::StoreError;

/// Default lease length in seconds.
pub const DEFAULT_LEASE_SECONDS: i64 = 30;

/// Default number of claims before an event is declared dead.
///
/// Limits are 1 to [`MAX_ATTEMPTS_LIMIT`].
pub const DEFAULT_MAX_ATTEMPTS: i64 = 5;

/// The largest attempt limit an event may have.
pub const MAX_ATTEMPTS_LIMIT: i64 = 1000;

/// The state of an outbox event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventState {
    /// Waiting for a worker.
    Pending,
    /// Claimed under a lease.
    Processing,
    /// Delivered; its receipt is reconciled.
    Delivered,
    /// Attempts exhausted; an operator decides.
    Dead,
}

impl EventState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventState::Pending => "pending",
            EventState::Processing => "processing",
            EventState::Delivered => "delivered",
            EventState::Dead => "dead",
        }
    }

    /// What an operator is told (`operations show`): the stored name, except `leased` for a
    /// claimed event, so the outbox never says `processing` — an operation's state — beside
    /// an operation that is, say, `outcome_unknown` while the lease of its last attempt runs
    /// out. The stored name stays `processing` (the table, `audit`'s counts, the metrics).
    pub fn word(self) -> &'static str {
        match self {
            EventState::Processing => "leased",
            other => other.as_str(),
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        [
            EventState::Pending,
            EventState::Processing,
            EventState::Delivered,
            EventState::Dead,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }
}

/// One outbox row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OutboxEvent {
    /// Event id.
    pub id: i64,
    /// The operation it delivers.
    pub operation_id: i64,
    /// Current state.
    pub state: EventState,
    /// Fencing token of the latest claim (0 before the first).
    pub fencing_token: i64,
    /// Holder of the current lease.
    pub lease_owner: Option<String>,
    /// First second at which the current lease has expired.
    pub lease_until: Option<i64>,
    /// Claims so far.
    pub attempt_count: i64,
    /// Claims allowed before the event is dead: the limit of the latest claim (at enqueue,
    /// the accepting runtime's).
    pub max_attempts: i64,
    /// Code of the last attempt's failure, if any.
    pub last_error: Option<String>,
    /// When it was delivered.
    pub delivered_at: Option<i64>,
}

/// A held lease: the right to work on one event until `until`, proven by `token`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Lease {
    /// Event id.
    pub event_id: i64,
    /// The operation it delivers.
    pub operation_id: i64,
    /// Lease holder.
    pub owner: String,
    /// Fencing token; strictly greater than every earlier claim's token for this event.
    pub token: i64,
    /// First second at which the lease has expired.
    pub until: i64,
    /// Which claim this is (1 for the first).
    pub attempt: i64,
}

/// What a claim found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "claim", rename_all = "snake_case")]
pub enum ClaimOutcome {
    /// The caller now holds the lease.
    Claimed(Lease),
    /// Someone holds an unexpired lease.
    Leased {
        /// When that lease expires.
        until: i64,
    },
    /// The event is delivered or dead.
    Finished {
        /// Its state.
        state: EventState,
    },
    /// Attempts were exhausted; the event (and its operation) are now dead.
    Exhausted,
    /// No such event.
    Missing,
}

/// A write conditional on a fencing token found that the lease was taken over (or the event
/// finished) in the meantime. Nothing was changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the lease was taken over by a newer claim; nothing was changed")]
pub struct Fenced;

/// Why a write conditional on a fencing token did not happen: the lease was taken over
/// ([`Fenced`], nothing changed) or the store failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum OutboxError {
    /// The lease was taken over (or the event finished) in the meantime.
    #[error(transparent)]
    Fenced(#[from] Fenced),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

const SELECT_EVENT: &str = "SELECT id, operation_id, state, fencing_token, lease_owner,
    lease_until, attempt_count, max_attempts, last_error, delivered_at FROM outbox";

fn event_from_row(row: &[SqlValue]) -> Result<OutboxEvent, Error> {
    let state = row.text(2)?;
    Ok(OutboxEvent {
        id: row.int(0)?,
        operation_id: row.int(1)?,
        state: EventState::parse(&state)
            .ok_or_else(|| Error::from(StoreError::Contract("unknown outbox state".into())))?,
        fencing_token: row.int(3)?,
        lease_owner: row.opt_text(4)?,
        lease_until: row.opt_int(5)?,
        attempt_count: row.int(6)?,
        max_attempts: row.int(7)?,
        last_error: row.opt_text(8)?,
        delivered_at: row.opt_int(9)?,
    })
}

fn query_event(
    tx: &mut dyn EffectTx,
    sql: &str,
    params: &[SqlValue],
) -> Result<Option<OutboxEvent>, StoreError> {
    let row = tx.query_opt(sql, params).map_err(|e| tx.store_error(e))?;
    match row {
        None => Ok(None),
        Some(row) => event_from_row(&row)
            .map(Some)
            .map_err(|e| StoreError::Contract(e.message)),
    }
}

fn exec(tx: &mut dyn EffectTx, sql: &str, params: &[SqlValue]) -> Result<usize, StoreError> {
    tx.execute(sql, params).map_err(|e| tx.store_error(e))
}

/// Moves the event's unfinished operation to `state` (through the ledger).
fn mark_operation(
    tx: &mut dyn EffectTx,
    operation_id: i64,
    state: OperationState,
    now: i64,
) -> Result<(), StoreError> {
    crate::ledger::mark_deferred(tx, operation_id, state, now).map_err(|e| tx.store_error(e))
}

/// Writes the pending event of a newly accepted operation. Runs in transaction A.
pub(crate) fn enqueue(
    tx: &mut dyn EffectTx,
    operation_id: i64,
    now: i64,
    max_attempts: i64,
) -> Result<i64, StoreError> {
    tx.insert_id(
        "INSERT INTO outbox (operation_id, state, fencing_token, attempt_count, max_attempts,
             created_at, updated_at)
         VALUES (?1, 'pending', 0, 0, ?2, ?3, ?3)",
        &[operation_id.into(), max_attempts.into(), now.into()],
    )
    .map_err(|e| tx.store_error(e))?
    .ok_or_else(|| StoreError::Contract("outbox insert returned no id".into()))
}

/// Loads one event.
pub(crate) fn load(
    tx: &mut dyn EffectTx,
    event_id: i64,
) -> Result<Option<OutboxEvent>, StoreError> {
    query_event(
        tx,
        &format!("{SELECT_EVENT} WHERE id = ?1"),
        &[event_id.into()],
    )
}

/// Loads the event of an operation.
pub(crate) fn for_operation(
    tx: &mut dyn EffectTx,
    operation_id: i64,
) -> Result<Option<OutboxEvent>, StoreError> {
    query_event(
        tx,
        &format!("{SELECT_EVENT} WHERE operation_id = ?1"),
        &[operation_id.into()],
    )
}

/// Events a worker may claim at `now`: pending ones and those whose lease has expired, oldest
/// first, at most `limit`.
pub(crate) fn ready(tx: &mut dyn EffectTx, now: i64, limit: i64) -> Result<Vec<i64>, StoreError> {
    let rows = tx
        .query(
            "SELECT id FROM outbox
             WHERE state = 'pending' OR (state = 'processing' AND lease_until <= ?1)
             ORDER BY id LIMIT ?2",
            &[now.into(), limit.into()],
        )
        .map_err(|e| tx.store_error(e))?;
    rows.iter()
        .map(|r| r.int(0).map_err(|e| StoreError::Contract(e.message)))
        .collect()
}

/// How many events are held under a live lease at `now` (claimed by a worker whose lease has
/// not expired): a worker pass skips them.
pub(crate) fn held(tx: &mut dyn EffectTx, now: i64) -> Result<i64, StoreError> {
    let row = tx
        .query_opt(
            "SELECT count(*) FROM outbox WHERE state = 'processing' AND lease_until > ?1",
            &[now.into()],
        )
        .map_err(|e| tx.store_error(e))?;
    match row {
        Some(row) => row.int(0).map_err(|e| StoreError::Contract(e.message)),
        None => Ok(0),
    }
}

/// Checks a lease window: positive length, no overflow past the portable range.
pub(crate) fn lease_until(now: i64, lease_seconds: i64) -> Result<i64, StoreError> {
    if !(1..=86_400).contains(&lease_seconds) {
        return Err(StoreError::Contract(
            "lease length must be 1 to 86400 seconds".into(),
        ));
    }
    match now.checked_add(lease_seconds) {
        Some(t) if now >= 0 && t <= crate::approval::MAX_PORTABLE_TIMESTAMP => Ok(t),
        _ => Err(StoreError::Contract(
            "lease would end outside the portable time range".into(),
        )),
    }
}

/// Claims `event_id` for `owner` at `now` for `lease_seconds`, allowing `max_attempts` claims
/// of the event in all (the claiming worker's limit, 1 to [`MAX_ATTEMPTS_LIMIT`]; it is
/// written into the event). Also moves the operation to `processing` (or, when the event was
/// already claimed `max_attempts` times, `dead`) in the same transaction.
pub(crate) fn claim(
    tx: &mut dyn EffectTx,
    event_id: i64,
    owner: &str,
    now: i64,
    lease_seconds: i64,
    max_attempts: i64,
) -> Result<ClaimOutcome, StoreError> {
    if owner.is_empty() || owner.len() > 128 {
        return Err(StoreError::Contract(
            "lease owner must be 1 to 128 bytes".into(),
        ));
    }
    if !(1..=MAX_ATTEMPTS_LIMIT).contains(&max_attempts) {
        return Err(StoreError::Contract(
            "the attempt limit must be 1 to 1000 claims".into(),
        ));
    }
    let until = lease_until(now, lease_seconds)?;
    let locked = tx
        .query_opt_locked(&format!("{SELECT_EVENT} WHERE id = ?1"), &[event_id.into()])
        .map_err(|e| tx.store_error(e))?
        .map(|row| event_from_row(&row).map_err(|e| StoreError::Contract(e.message)))
        .transpose()?;
    let Some(ev) = locked else {
        // Absent, or (PostgreSQL) locked by a worker claiming or completing it right now.
        return Ok(match load(tx, event_id)? {
            None => ClaimOutcome::Missing,
            Some(ev) => ClaimOutcome::Leased {
                until: ev.lease_until.unwrap_or(until),
            },
        });
    };
    match ev.state {
        EventState::Delivered | EventState::Dead => {
            return Ok(ClaimOutcome::Finished { state: ev.state })
        }
        EventState::Processing => {
            let held_until = ev.lease_until.unwrap_or(i64::MAX);
            if now < held_until {
                return Ok(ClaimOutcome::Leased { until: held_until });
            }
        }
        EventState::Pending => {}
    }
    if ev.attempt_count >= max_attempts {
        // An event claimed more often than this worker allows (an earlier worker had a higher
        // limit) keeps its count: the stored limit never falls below it.
        let limit = max_attempts.max(ev.attempt_count);
        let n = exec(
            tx,
            "UPDATE outbox SET state = 'dead', lease_owner = NULL, lease_until = NULL,
                 last_error = 'attempts_exhausted', max_attempts = ?4, updated_at = ?1
             WHERE id = ?2 AND fencing_token = ?3 AND state IN ('pending', 'processing')",
            &[
                now.into(),
                event_id.into(),
                ev.fencing_token.into(),
                limit.into(),
            ],
        )?;
        if n != 1 {
            return Err(StoreError::Contract(
                "outbox event changed under a claim".into(),
            ));
        }
        mark_operation(tx, ev.operation_id, OperationState::Dead, now)?;
        return Ok(ClaimOutcome::Exhausted);
    }
    // Conditional on the token we read: a concurrent claim (another connection, another
    // process) that got there first makes this one change nothing.
    let claimed = tx
        .query_opt(
            "UPDATE outbox SET state = 'processing', lease_owner = ?1, lease_until = ?2,
                 fencing_token = fencing_token + 1, attempt_count = attempt_count + 1,
                 max_attempts = ?6, updated_at = ?3
             WHERE id = ?4 AND fencing_token = ?5
               AND (state = 'pending' OR (state = 'processing' AND lease_until <= ?3))
             RETURNING fencing_token, attempt_count",
            &[
                owner.into(),
                until.into(),
                now.into(),
                event_id.into(),
                ev.fencing_token.into(),
                max_attempts.into(),
            ],
        )
        .map_err(|e| tx.store_error(e))?;
    let Some(row) = claimed else {
        return Ok(ClaimOutcome::Leased { until });
    };
    let contract = |e: Error| StoreError::Contract(e.message);
    let (token, attempt) = (row.int(0).map_err(contract)?, row.int(1).map_err(contract)?);
    mark_operation(tx, ev.operation_id, OperationState::Processing, now)?;
    Ok(ClaimOutcome::Claimed(Lease {
        event_id,
        operation_id: ev.operation_id,
        owner: owner.to_string(),
        token,
        until,
        attempt,
    }))
}

/// Extends a held lease to `now + lease_seconds` (heartbeat). Conditional on the token: it
/// works as long as nobody reclaimed the event, even if the lease has just run out.
pub(crate) fn renew(
    tx: &mut dyn EffectTx,
    lease: &Lease,
    now: i64,
    lease_seconds: i64,
) -> Result<Lease, OutboxError> {
    let until = lease_until(now, lease_seconds)?;
    let n = exec(
        tx,
        "UPDATE outbox SET lease_until = ?1, updated_at = ?2
         WHERE id = ?3 AND fencing_token = ?4 AND state = 'processing' AND lease_owner = ?5",
        &[
            until.into(),
            now.into(),
            lease.event_id.into(),
            lease.token.into(),
            lease.owner.as_str().into(),
        ],
    )?;
    if n != 1 {
        return Err(Fenced.into());
    }
    Ok(Lease {
        until,
        ..lease.clone()
    })
}

/// Records why the current attempt did not finish (`code` is a stable error code). The lease
/// stays held until it expires, so the event is retried only after that — except after the
/// last attempt the event allows, when no claim can follow: the lease then ends now (nothing
/// is in flight any more, so an operator may resolve the operation at once).
pub(crate) fn record_attempt_error(
    tx: &mut dyn EffectTx,
    lease: &Lease,
    code: &str,
    now: i64,
) -> Result<(), OutboxError> {
    let n = exec(
        tx,
        "UPDATE outbox SET last_error = ?1, updated_at = ?2,
             lease_until = CASE WHEN attempt_count >= max_attempts THEN ?2 ELSE lease_until END
         WHERE id = ?3 AND fencing_token = ?4 AND state = 'processing'",
        &[
            code.into(),
            now.into(),
            lease.event_id.into(),
            lease.token.into(),
        ],
    )?;
    fenced_unless_one(n)
}

/// Gives the event claimed under `lease` back: the attempt ended without an effect because
/// the downstream asked to be called again with more input (a multi-round upstream's
/// `input_required`), so the claim does not count as an attempt. The event is pending again
/// with its lease ended and `code` as its last error; the fencing token stays, so the next
/// claim's is higher. Conditional on the token.
pub(crate) fn rearm(
    tx: &mut dyn EffectTx,
    lease: &Lease,
    code: &str,
    now: i64,
) -> Result<(), OutboxError> {
    let n = exec(
        tx,
        "UPDATE outbox SET state = 'pending', lease_owner = NULL, lease_until = NULL,
             last_error = ?1, updated_at = ?2, attempt_count = attempt_count - 1
         WHERE id = ?3 AND fencing_token = ?4 AND state = 'processing' AND attempt_count > 0",
        &[
            code.into(),
            now.into(),
            lease.event_id.into(),
            lease.token.into(),
        ],
    )?;
    fenced_unless_one(n)
}

/// Marks the event delivered under `lease` (part of transaction C).
pub(crate) fn complete(tx: &mut dyn EffectTx, lease: &Lease, now: i64) -> Result<(), OutboxError> {
    let n = exec(
        tx,
        "UPDATE outbox SET state = 'delivered', lease_owner = NULL, lease_until = NULL,
             last_error = NULL, delivered_at = ?1, updated_at = ?1
         WHERE id = ?2 AND fencing_token = ?3 AND state = 'processing'",
        &[now.into(), lease.event_id.into(), lease.token.into()],
    )?;
    fenced_unless_one(n)
}

/// Marks the event delivered because an explicit status query reconciled its receipt (part of
/// transaction C on the status path). Any lease is void afterwards: a worker still holding one
/// gets [`Fenced`] on its next conditional write.
pub(crate) fn complete_by_reconciliation(
    tx: &mut dyn EffectTx,
    event_id: i64,
    expected_token: i64,
    now: i64,
) -> Result<(), OutboxError> {
    let n = exec(
        tx,
        "UPDATE outbox SET state = 'delivered', lease_owner = NULL, lease_until = NULL,
             last_error = NULL, fencing_token = fencing_token + 1, delivered_at = ?1,
             updated_at = ?1
         WHERE id = ?2 AND fencing_token = ?3 AND state IN ('pending', 'processing', 'dead')",
        &[now.into(), event_id.into(), expected_token.into()],
    )?;
    fenced_unless_one(n)
}

/// A conditional write that changed one row went through; one that changed none was fenced.
fn fenced_unless_one(changed: usize) -> Result<(), OutboxError> {
    if changed == 1 {
        Ok(())
    } else {
        Err(Fenced.into())
    }
}
