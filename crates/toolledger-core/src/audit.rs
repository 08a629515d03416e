//! The ledger's audit: the semantic rules every ledger database must satisfy, checked inside
//! one read snapshot, on any driver.
//!
//! [`violations`] runs every rule of [`RULES`] (each a query returning the opaque references of
//! the offending rows) and checks stored content: arguments, results and receipts that are not
//! canonical JSON or do not match their digests. Rows are named only by opaque references
//! (status refs, or a hash for receipts), never by their content. [`counts`] counts rows by
//! state. The statements on the `operations` table are the ledger's; a driver adds its own
//! physical checks ([`crate::store::Driver::physical_checks`]).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::digest::sha256_hex;
use crate::effect::{EffectTx, RowExt, SqlValue};
use crate::json as strict;
use crate::store::StoreError;

/// One broken rule and the opaque references of the rows that break it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule's stable name (`succeeded_operation_without_receipt`, …).
    pub rule: &'static str,
    /// Opaque references of the offending rows.
    pub refs: Vec<String>,
}

impl Violation {
    /// `{"rule", "refs"}`.
    pub fn to_json(&self) -> Value {
        json!({"rule": self.rule, "refs": self.refs})
    }
}

pub use crate::ledger::RULES;

/// The rule name of stored JSON that is not canonical or does not match its digest.
pub const CONTENT_RULE: &str = "stored_json_or_digest_mismatch";

/// Receipts are reported by an opaque hash of their row id, never by content or downstream id.
fn opaque(reference: String) -> String {
    match reference.strip_prefix("receipt:") {
        Some(id) => format!(
            "receipt-{}",
            &sha256_hex(format!("receipt:{id}").as_bytes())[..16]
        ),
        None => reference,
    }
}

fn failed(tx: &mut dyn EffectTx, e: crate::Error) -> StoreError {
    tx.store_error(e)
}

fn contract(e: crate::Error) -> StoreError {
    StoreError::Contract(e.message)
}

/// Every row of a parameterless query.
pub fn rows(tx: &mut dyn EffectTx, sql: &str) -> Result<Vec<Vec<SqlValue>>, StoreError> {
    tx.query(sql, &[]).map_err(|e| failed(tx, e))
}

/// The first column of every row, as text.
pub fn column(tx: &mut dyn EffectTx, sql: &str) -> Result<Vec<String>, StoreError> {
    rows(tx, sql)?
        .iter()
        .map(|r| r.text(0).map_err(contract))
        .collect()
}

fn counts_by(tx: &mut dyn EffectTx, sql: &str) -> Result<BTreeMap<String, i64>, StoreError> {
    rows(tx, sql)?
        .iter()
        .map(|r| Ok((r.text(0).map_err(contract)?, r.int(1).map_err(contract)?)))
        .collect()
}

/// The one integer a query returns.
pub fn scalar(tx: &mut dyn EffectTx, sql: &str) -> Result<i64, StoreError> {
    rows(tx, sql)?
        .first()
        .ok_or_else(|| StoreError::Contract("no row".into()))?
        .int(0)
        .map_err(contract)
}

/// Stored JSON that is not canonical, results or receipts that do not match their digests.
fn content_violations(tx: &mut dyn EffectTx) -> Result<Vec<String>, StoreError> {
    let mut bad = Vec::new();
    for p in crate::ledger::deferred_payloads(tx)? {
        let (sr, args, result, digest) = (p.status_ref, p.arguments, p.result, p.result_digest);
        let args_ok = strict::parse_canonical(args.as_bytes()).is_ok();
        let result_ok = match (&result, &digest) {
            (Some(t), Some(d)) => {
                strict::parse_canonical(t.as_bytes()).is_ok() && sha256_hex(t.as_bytes()) == *d
            }
            (None, None) => true,
            _ => false,
        };
        if !args_ok || !result_ok {
            bad.push(sr);
        }
    }
    for r in rows(tx, "SELECT id, receipt, receipt_digest FROM local_receipts")? {
        let id = r.int(0).map_err(contract)?;
        let receipt = r.text(1).map_err(contract)?;
        let digest = r.text(2).map_err(contract)?;
        if strict::parse_canonical(receipt.as_bytes()).is_err()
            || sha256_hex(receipt.as_bytes()) != digest
        {
            bad.push(opaque(format!("receipt:{id}")));
        }
    }
    Ok(bad)
}

/// Every semantic rule broken in the snapshot `tx` reads, and the content check.
pub fn violations(tx: &mut dyn EffectTx) -> Result<Vec<Violation>, StoreError> {
    let mut out = Vec::new();
    for (rule, sql) in RULES {
        let refs: Vec<String> = column(tx, sql)?.into_iter().map(opaque).collect();
        if !refs.is_empty() {
            out.push(Violation { rule, refs });
        }
    }
    let content = content_violations(tx)?;
    if !content.is_empty() {
        out.push(Violation {
            rule: CONTENT_RULE,
            refs: content,
        });
    }
    Ok(out)
}

/// Row counts: operations and outbox events by state, local receipts, approvals issued and
/// consumed, operation events.
pub fn counts(tx: &mut dyn EffectTx) -> Result<Value, StoreError> {
    Ok(json!({
        "operations": crate::ledger::counts_by_state(tx)?,
        "tombstones": crate::ledger::tombstone_count(tx)?,
        "outbox": counts_by(tx,
            "SELECT state, count(*) FROM outbox GROUP BY state ORDER BY state")?,
        "local_receipts": scalar(tx, "SELECT count(*) FROM local_receipts")?,
        "approvals": {
            "issued": scalar(tx, "SELECT count(*) FROM approvals")?,
            "consumed": scalar(tx,
                "SELECT count(*) FROM approvals WHERE consumed_at IS NOT NULL")?,
        },
        "operation_events": scalar(tx, "SELECT count(*) FROM operation_events")?,
    }))
}

/// How many rows of one table are in one state, and how long the oldest of them has been in
/// it (`now - min(updated_at)`, whole seconds, never negative).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StateCount {
    /// The state.
    pub state: String,
    /// Rows in that state.
    pub count: i64,
    /// Seconds since the oldest of them last changed.
    pub oldest_age_seconds: i64,
}

/// Operations and outbox events by state at `now`, for gauges (read-only).
pub fn state_counts(
    tx: &mut dyn EffectTx,
    now: i64,
) -> Result<(Vec<StateCount>, Vec<StateCount>), StoreError> {
    let count = |(state, count, oldest): (String, i64, i64)| StateCount {
        state,
        count,
        oldest_age_seconds: now.saturating_sub(oldest).max(0),
    };
    let operations = crate::ledger::states_and_oldest_change(tx)?;
    let outbox = rows(
        tx,
        "SELECT state, count(*), min(updated_at) FROM outbox GROUP BY state ORDER BY state",
    )?
    .iter()
    .map(|r| {
        Ok((
            r.text(0).map_err(contract)?,
            r.int(1).map_err(contract)?,
            r.int(2).map_err(contract)?,
        ))
    })
    .collect::<Result<Vec<_>, StoreError>>()?;
    Ok((
        operations.into_iter().map(count).collect(),
        outbox.into_iter().map(count).collect(),
    ))
}
