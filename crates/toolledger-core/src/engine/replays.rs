//! Settled operations kept in memory for their exact retries.
//!
//! A settled operation (`applied`, `succeeded`, `failed`) never changes again until the pruner
//! compacts it, and the pruner compacts only after the retention deadline. So once a call has
//! read a settled row of its scope from the store, the engine keeps a copy, and a later call of
//! the same scope is answered from the copy without a round trip to the store's threads. The
//! answer runs the same checks in the same order as a read of the store: the effect's access
//! check, conflict, deadlines (authority before retention), the effect's replay check.
//!
//! What keeps it exact:
//! - only rows read from the store are kept (a committed row: replays read a snapshot or lock
//!   the scope, and two calls of one scope never share a transaction), never a fresh call's own
//!   row, so a stored row the store's checks refuse is refused again on every read;
//! - a row is kept only when the effect's checks of the call that read it sent no statement,
//!   and an answer from memory runs them against a transaction that answers none: an effect
//!   whose [`InlineEffect::authorize`] or [`InlineEffect::check_replay`] reads the store (or
//!   panics) is answered from the store, whatever the checks returned;
//! - a copy answers only while its retention deadline is more than [`RETENTION_MARGIN`] ahead
//!   of the latest time this engine has seen (a clock set back does not revive it, and a
//!   pruner whose clock runs up to the margin ahead has not compacted it);
//! - calls in a shared key namespace always read the store (another principal's row of the
//!   same key is a conflict only the store can see).
//!
//! It is bounded by the bytes its copies hold ([`CAPACITY`]); rows above a sixteenth of that
//! are not kept.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use serde_json::Value;

use super::{InlineEffect, OperationRecord, Prepared};
use crate::effect::{Dialect, EffectTx, SqlValue};
use crate::model::Error;

/// A kept row answers while its retention deadline lies more than this many seconds ahead of
/// the latest time seen.
pub(crate) const RETENTION_MARGIN: i64 = 60;

/// The bytes (about) the kept rows may hold together.
pub(crate) const CAPACITY: u64 = 8 << 20;

/// A kept row and its size.
#[derive(Debug)]
pub(crate) struct Kept {
    pub(crate) record: OperationRecord,
    weight: u64,
}

#[derive(Clone)]
struct ByWeight;

impl quick_cache::Weighter<u64, Arc<Kept>> for ByWeight {
    fn weight(&self, _key: &u64, kept: &Arc<Kept>) -> u64 {
        kept.weight
    }
}

/// The settled rows recently read, by scope.
pub(crate) struct Replays {
    rows: quick_cache::sync::Cache<u64, Arc<Kept>, ByWeight>,
    hasher: RandomState,
    /// The latest `now` seen by a lookup or a keep.
    latest: AtomicI64,
}

impl std::fmt::Debug for Replays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replays")
            .field("rows", &self.rows.len())
            .field("bytes", &self.rows.weight())
            .finish()
    }
}

impl Replays {
    pub(crate) fn new() -> Self {
        Replays {
            rows: quick_cache::sync::Cache::with_weighter(4096, CAPACITY, ByWeight),
            hasher: RandomState::new(),
            latest: AtomicI64::new(i64::MIN),
        }
    }

    fn scope(&self, tenant: &str, subject: &str, tool: &str, key: &str) -> u64 {
        self.hasher.hash_one((tenant, subject, tool, key))
    }

    /// The latest time seen, `now` included.
    fn seen(&self, now: i64) -> i64 {
        self.latest.fetch_max(now, Ordering::Relaxed).max(now)
    }

    /// The kept row of `p`'s scope, while it may still answer.
    pub(crate) fn get(&self, p: &Prepared, now: i64) -> Option<Arc<Kept>> {
        let latest = self.seen(now);
        let (pr, tool) = (&p.principal, &p.contract.name);
        let scope = self.scope(&pr.tenant, &pr.subject, tool, &p.key);
        let kept = self.rows.get(&scope)?;
        let r = &kept.record;
        if r.tenant != pr.tenant || r.subject != pr.subject || &r.tool != tool || r.key != p.key {
            return None;
        }
        if !answers_at(r.retention_deadline, latest) {
            self.rows.remove(&scope);
            return None;
        }
        Some(kept)
    }

    /// Keeps `record`, just read from the store at `now`, if it is settled and far enough
    /// from its retention deadline.
    pub(crate) fn keep(&self, record: OperationRecord, now: i64) {
        if !record.state.is_settled()
            || record.compacted_at.is_some()
            || !answers_at(record.retention_deadline, self.seen(now))
        {
            return;
        }
        let weight = weight(&record);
        if weight > CAPACITY / 16 {
            return;
        }
        let scope = self.scope(&record.tenant, &record.subject, &record.tool, &record.key);
        self.rows.insert(scope, Arc::new(Kept { record, weight }));
    }

    /// Rows kept now (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }
}

/// Whether a row with `retention_deadline` may answer from memory at `latest`.
fn answers_at(retention_deadline: Option<i64>, latest: i64) -> bool {
    retention_deadline.is_none_or(|d| latest < d.saturating_sub(RETENTION_MARGIN))
}

/// About the bytes a kept row holds.
fn weight(r: &OperationRecord) -> u64 {
    let texts = [
        &r.tenant,
        &r.subject,
        &r.tool,
        &r.key,
        &r.request_digest,
        &r.effect_kind,
        &r.status_ref,
        &r.contract.name,
        &r.contract.input_rev,
        &r.contract.output_rev,
        &r.contract.effect_rev,
        &r.contract.handler_rev,
        &r.contract.producer_rev,
        &r.contract.policy_rev,
    ];
    let mut n: u64 = 256 + texts.iter().map(|s| s.len() as u64).sum::<u64>();
    n += r.fingerprint.as_ref().map_or(0, |s| s.len() as u64);
    n += r.result_digest.as_ref().map_or(0, |s| s.len() as u64);
    n + value_weight(&r.arguments) + r.result.as_ref().map_or(0, value_weight)
}

/// About the bytes a JSON value holds in memory.
fn value_weight(v: &Value) -> u64 {
    32 + match v {
        Value::String(s) => s.len() as u64,
        Value::Array(a) => a.iter().map(value_weight).sum(),
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| 32 + k.len() as u64 + value_weight(v))
            .sum(),
        _ => 0,
    }
}

/// A transaction that answers no statement, and tells whether one was tried: the effect's
/// checks of an answer from memory run against it.
pub(crate) struct NoStatements {
    dialect: Dialect,
    pub(crate) tried: bool,
}

impl NoStatements {
    pub(crate) fn new(dialect: Dialect) -> Self {
        NoStatements {
            dialect,
            tried: false,
        }
    }

    fn refuse<T>(&mut self) -> Result<T, Error> {
        self.tried = true;
        Err(Error::unavailable("no statement runs here"))
    }
}

impl EffectTx for NoStatements {
    fn execute(&mut self, _sql: &str, _params: &[SqlValue]) -> Result<usize, Error> {
        self.refuse()
    }

    fn query(&mut self, _sql: &str, _params: &[SqlValue]) -> Result<Vec<Vec<SqlValue>>, Error> {
        self.refuse()
    }

    fn dialect(&self) -> Dialect {
        self.dialect
    }

    fn execute_batch(&mut self, _sql: &str) -> Result<(), Error> {
        self.refuse()
    }

    fn lock_key(&mut self, _key: &str) -> Result<(), Error> {
        self.refuse()
    }
}

/// A transaction that passes everything on to `inner` and tells whether a statement was sent:
/// a row read from the store is kept only when the effect's checks of that call sent none.
pub(crate) struct Watched<'a> {
    inner: &'a mut dyn EffectTx,
    pub(crate) sent: bool,
}

impl<'a> Watched<'a> {
    pub(crate) fn new(inner: &'a mut dyn EffectTx) -> Self {
        Watched { inner, sent: false }
    }
}

impl EffectTx for Watched<'_> {
    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<usize, Error> {
        self.sent = true;
        self.inner.execute(sql, params)
    }

    fn execute_unanswered(&mut self, sql: &str, params: &[SqlValue]) -> Result<(), Error> {
        self.sent = true;
        self.inner.execute_unanswered(sql, params)
    }

    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Vec<SqlValue>>, Error> {
        self.sent = true;
        self.inner.query(sql, params)
    }

    fn dialect(&self) -> Dialect {
        self.inner.dialect()
    }

    fn execute_batch(&mut self, sql: &str) -> Result<(), Error> {
        self.sent = true;
        self.inner.execute_batch(sql)
    }

    fn lock_key(&mut self, key: &str) -> Result<(), Error> {
        self.sent = true;
        self.inner.lock_key(key)
    }

    fn take_store_error(&mut self) -> Option<crate::store::StoreError> {
        self.inner.take_store_error()
    }

    fn insert_id(&mut self, sql: &str, params: &[SqlValue]) -> Result<Option<i64>, Error> {
        self.sent = true;
        self.inner.insert_id(sql, params)
    }

    fn query_opt_locked(
        &mut self,
        sql: &str,
        params: &[SqlValue],
    ) -> Result<Option<Vec<SqlValue>>, Error> {
        self.sent = true;
        self.inner.query_opt_locked(sql, params)
    }

    fn query_opt(
        &mut self,
        sql: &str,
        params: &[SqlValue],
    ) -> Result<Option<Vec<SqlValue>>, Error> {
        self.sent = true;
        self.inner.query_opt(sql, params)
    }
}

/// Whether `effect`'s checks ran without a statement, and what they and the checks on the
/// kept row answered; `None` when the store must answer.
pub(crate) fn answer(
    kept: &Kept,
    p: &Prepared,
    effect: &dyn InlineEffect,
    dialect: Dialect,
    now: i64,
) -> Option<Result<super::Outcome, Error>> {
    let mut tx = NoStatements::new(dialect);
    let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        effect.authorize(&mut tx, &p.principal)?;
        super::judge(&mut tx, p, effect, &kept.record, now)
    }))
    .ok()?;
    (!tx.tried).then_some(answered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{OperationState, ToolContract};

    fn settled_row(key: &str, result: Value, retention_deadline: Option<i64>) -> OperationRecord {
        OperationRecord {
            id: 1,
            tenant: "t".into(),
            subject: "s".into(),
            tool: "tool".into(),
            key: key.into(),
            request_digest: "d".repeat(64),
            fingerprint: None,
            effect_kind: "inline".into(),
            state: OperationState::Applied,
            result: Some(result),
            result_digest: Some("r".repeat(64)),
            status_ref: "ref".into(),
            authority_deadline: None,
            retention_deadline,
            created_at: 0,
            updated_at: 0,
            contract: ToolContract::uniform("tool", "1"),
            arguments: Value::Null,
            compacted_at: None,
        }
    }

    #[test]
    fn only_settled_small_rows_far_from_their_retention_deadline_are_kept() {
        let replays = Replays::new();
        replays.keep(settled_row("a", Value::from("x"), None), 100);
        assert_eq!(replays.len(), 1);
        let big = "x".repeat((CAPACITY / 16) as usize);
        replays.keep(settled_row("b", Value::from(big), None), 100);
        assert_eq!(
            replays.len(),
            1,
            "a row above a sixteenth of the capacity is not kept"
        );
        let mut open = settled_row("c", Value::from("x"), None);
        open.state = OperationState::Partial;
        replays.keep(open, 100);
        assert_eq!(replays.len(), 1, "a partial row is not kept");
        replays.keep(
            settled_row("d", Value::from("x"), Some(100 + RETENTION_MARGIN)),
            100,
        );
        assert_eq!(replays.len(), 1, "a row within the margin is not kept");
        replays.keep(
            settled_row("e", Value::from("x"), Some(101 + RETENTION_MARGIN)),
            100,
        );
        assert_eq!(replays.len(), 2);
    }

    #[test]
    fn the_kept_rows_stay_within_their_capacity() {
        let replays = Replays::new();
        let result = Value::from("x".repeat(64 << 10));
        for i in 0..1000 {
            replays.keep(settled_row(&format!("k{i}"), result.clone(), None), 0);
        }
        assert!(
            replays.rows.weight() <= CAPACITY,
            "{}",
            replays.rows.weight()
        );
        assert!(replays.len() < 1000);
    }
}
