//! Operator inspection of the ledger, read-only: the list of operations by state, tool and age
//! ([`list`]), and one operation's timeline ([`timeline`]) — its ledger row, every event, the
//! deferred intent's provider call and approval, the outbox event with its lease and fencing
//! token, every claim, the local receipt and an operator's resolution.
//!
//! Both run inside the caller's read transaction and never write. Arguments and results are
//! shown to the operator as stored, except that the value of every object member whose name
//! looks like a secret (`token`, `secret`, `password`, `passphrase`, `credential`,
//! `authorization`, `api_key`/`apikey`, `private_key`, in any case) is replaced by
//! `"[redacted]"` ([`redact_secrets`]), and where the stored result, an event or the receipt
//! echoes such an argument's value inside a string, that part of the string is masked too
//! ([`redact_echoes`]). Bearer tokens and keys are never stored in the ledger in the first
//! place (only token hashes, in the principal store, which is not shown).

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::effect::{EffectTx, RowExt};
use crate::ledger::{self, column, LedgerRow};
use crate::model::OperationState;
use crate::outbox;
use crate::store::StoreError;

pub use crate::ledger::IN_PROGRESS_EXPIRY_SECS;

/// The most rows one [`list`] returns.
pub const MAX_LIST_LIMIT: u32 = 10_000;

/// What [`list`] selects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Only operations in one of these states (every state when empty).
    pub states: Vec<OperationState>,
    /// Only operations of this tool.
    pub tool: Option<String>,
    /// Only operations created at least this many seconds before `now`.
    pub older_than: Option<i64>,
    /// The time ages are measured at (Unix seconds).
    pub now: i64,
    /// At most this many rows (1 to [`MAX_LIST_LIMIT`]).
    pub limit: u32,
    /// Oldest first (by creation order) instead of newest first.
    pub oldest_first: bool,
}

/// One operation in the operators' list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OperationSummary {
    /// The opaque status reference (what `operations show` and `resolve` take).
    pub status_ref: String,
    /// The tool.
    pub tool: String,
    /// The idempotency key.
    pub key: String,
    /// The principal's tenant.
    pub tenant: String,
    /// The principal's name.
    pub subject: String,
    /// `inline` or `deferred`.
    pub effect_kind: String,
    /// The state, in the ledger's one vocabulary.
    pub state: OperationState,
    /// When the operation was created (Unix seconds).
    pub created_at: i64,
    /// When it last changed (Unix seconds).
    pub updated_at: i64,
    /// `now - created_at`, never negative.
    pub age_seconds: i64,
    /// A `processing` operation's lease end (Unix seconds); absent in every other state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<i64>,
}

/// The operations [`ListQuery`] selects, newest first (or oldest first). Creation order is
/// the ledger row id, which grows with every new operation.
pub fn list(tx: &mut dyn EffectTx, q: &ListQuery) -> Result<Vec<OperationSummary>, StoreError> {
    let limit = i64::from(q.limit.clamp(1, MAX_LIST_LIMIT));
    let created_at_most = q.older_than.map(|s| q.now.saturating_sub(s));
    let rows = ledger::list_rows(
        tx,
        &q.states,
        q.tool.as_deref(),
        created_at_most,
        limit,
        q.oldest_first,
    )?;
    Ok(rows.into_iter().map(|r| summary(r, q.now)).collect())
}

/// A kind of unsure operation: one an operator may have to look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unsure {
    /// The effect may have happened without a local receipt (`outcome_unknown`).
    OutcomeUnknown,
    /// An inline operation `in_progress` past the in-progress expiry (unchanged for
    /// [`IN_PROGRESS_EXPIRY_SECS`]).
    Stuck,
    /// A multi-step inline operation whose later step failed (`partial`).
    Partial,
    /// A deferred operation whose outbox event exhausted its attempts (`dead`).
    Dead,
    /// A deferred operation accepted and not yet claimed by a worker (the backlog).
    Accepted,
    /// A deferred operation `processing` under a lease that has ended: the worker or proxy
    /// that held it is presumed gone, and its callers are told `outcome_unknown` (a worker
    /// with attempts left may still claim it again).
    LeaseExpired,
}

impl Unsure {
    /// Every kind, in the order the console shows them.
    pub const ALL: [Unsure; 6] = [
        Unsure::OutcomeUnknown,
        Unsure::LeaseExpired,
        Unsure::Stuck,
        Unsure::Partial,
        Unsure::Dead,
        Unsure::Accepted,
    ];

    /// The stable name (`outcome_unknown`, `lease_expired`, `stuck`, `partial`, `dead`,
    /// `accepted`).
    pub fn as_str(self) -> &'static str {
        match self {
            Unsure::OutcomeUnknown => "outcome_unknown",
            Unsure::Stuck => "stuck",
            Unsure::Partial => "partial",
            Unsure::Dead => "dead",
            Unsure::Accepted => "accepted",
            Unsure::LeaseExpired => "lease_expired",
        }
    }

    /// The kind named `s` ([`Unsure::as_str`]).
    pub fn parse(s: &str) -> Option<Unsure> {
        Unsure::ALL.into_iter().find(|u| u.as_str() == s)
    }

    /// The ledger state operations of this kind are in.
    pub fn state(self) -> OperationState {
        match self {
            Unsure::OutcomeUnknown => OperationState::OutcomeUnknown,
            Unsure::Stuck => OperationState::InProgress,
            Unsure::Partial => OperationState::Partial,
            Unsure::Dead => OperationState::Dead,
            Unsure::Accepted => OperationState::Accepted,
            Unsure::LeaseExpired => OperationState::Processing,
        }
    }

    fn of_state(state: OperationState) -> Option<Unsure> {
        Unsure::ALL.into_iter().find(|u| u.state() == state)
    }
}

/// The most rows one [`unsure`] page holds.
pub const MAX_PAGE: u32 = 500;

/// What [`unsure`] selects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnsureQuery {
    /// Only these kinds (every kind when empty).
    pub kinds: Vec<Unsure>,
    /// Only operations of this tenant (every tenant when `None`).
    pub tenant: Option<String>,
    /// Only operations of this tool.
    pub tool: Option<String>,
    /// Only operations created at least this many seconds before `now`.
    pub older_than: Option<i64>,
    /// The time ages and the in-progress expiry are measured at (Unix seconds).
    pub now: i64,
    /// At most this many rows (1 to [`MAX_PAGE`]).
    pub limit: u32,
    /// The page after the one that ended with this status reference (the first page when
    /// `None`).
    pub after: Option<String>,
}

/// One page of unsure operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsurePage {
    /// The operations, newest first.
    pub rows: Vec<OperationSummary>,
    /// The status reference to pass as [`UnsureQuery::after`] for the next page; `None` on
    /// the last page.
    pub next: Option<String>,
}

/// How many operations of one kind are unsure, and for how long the oldest has been.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnsureCount {
    /// The kind.
    #[serde(serialize_with = "unsure_name")]
    pub kind: Unsure,
    /// How many operations.
    pub count: i64,
    /// `now - created_at` of the oldest (`None` when there is none).
    pub oldest_age_seconds: Option<i64>,
}

fn unsure_name<S: serde::Serializer>(u: &Unsure, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(u.as_str())
}

fn kinds_states(kinds: &[Unsure]) -> Vec<OperationState> {
    let kinds = if kinds.is_empty() {
        &Unsure::ALL[..]
    } else {
        kinds
    };
    let mut states: Vec<OperationState> = kinds.iter().map(|k| k.state()).collect();
    states.sort_by_key(|s| s.as_str());
    states.dedup();
    states
}

fn summary(r: ledger::SummaryRow, now: i64) -> OperationSummary {
    OperationSummary {
        age_seconds: now.saturating_sub(r.created_at).max(0),
        status_ref: r.status_ref,
        tool: r.tool,
        key: r.key,
        tenant: r.tenant,
        subject: r.subject,
        effect_kind: r.effect_kind,
        state: r.state,
        created_at: r.created_at,
        updated_at: r.updated_at,
        lease_until: r.lease_until,
    }
}

/// One page of the unsure operations [`UnsureQuery`] selects, newest first (by creation
/// order). An `in_progress` operation is listed only once it is stuck, a `processing` one only
/// once its lease has ended.
pub fn unsure(tx: &mut dyn EffectTx, q: &UnsureQuery) -> Result<UnsurePage, StoreError> {
    let limit = q.limit.clamp(1, MAX_PAGE);
    let states = kinds_states(&q.kinds);
    let filter = ledger::UnsureFilter {
        states: &states,
        stuck_at_most: q.now.saturating_sub(ledger::IN_PROGRESS_EXPIRY_SECS),
        now: q.now,
        tenant: q.tenant.as_deref(),
        tool: q.tool.as_deref(),
        created_at_most: q.older_than.map(|s| q.now.saturating_sub(s)),
    };
    let mut rows = ledger::unsure_rows(tx, &filter, q.after.as_deref(), i64::from(limit) + 1)?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let rows: Vec<OperationSummary> = rows.into_iter().map(|r| summary(r, q.now)).collect();
    let next = if more {
        rows.last().map(|r| r.status_ref.clone())
    } else {
        None
    };
    Ok(UnsurePage { rows, next })
}

/// Every kind of unsure operation with its count and the age of its oldest, of `tenant`
/// when given, at `now` (kinds holding none have count 0).
pub fn unsure_counts(
    tx: &mut dyn EffectTx,
    tenant: Option<&str>,
    now: i64,
) -> Result<Vec<UnsureCount>, StoreError> {
    let states = kinds_states(&[]);
    let filter = ledger::UnsureFilter {
        states: &states,
        stuck_at_most: now.saturating_sub(ledger::IN_PROGRESS_EXPIRY_SECS),
        now,
        tenant,
        tool: None,
        created_at_most: None,
    };
    let found = ledger::unsure_counts(tx, &filter)?;
    Ok(Unsure::ALL
        .into_iter()
        .map(|kind| {
            let hit = found
                .iter()
                .find(|(state, _, _)| Unsure::of_state(*state) == Some(kind));
            UnsureCount {
                kind,
                count: hit.map_or(0, |h| h.1),
                oldest_age_seconds: hit.map(|h| now.saturating_sub(h.2).max(0)),
            }
        })
        .collect())
}

/// Which operation [`timeline`] shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    /// By its status reference.
    StatusRef(String),
    /// By tool and idempotency key, narrowed to one principal when several hold the key.
    ToolKey {
        /// The tool.
        tool: String,
        /// The idempotency key.
        key: String,
        /// Only the operation of this tenant.
        tenant: Option<String>,
        /// Only the operation of this principal.
        subject: Option<String>,
    },
}

/// What [`timeline`] found.
#[derive(Clone, Debug, PartialEq)]
pub enum Found {
    /// No operation matches.
    Absent,
    /// Several principals hold the key: name the tenant and subject.
    Ambiguous(usize),
    /// The operation's timeline.
    One(Box<Value>),
}

/// Whether an object member named `name` holds a secret whose value is never shown.
fn secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase().replace('-', "_");
    if n == "fencing_token" {
        // The ledger's own lease counter, not a credential.
        return false;
    }
    [
        "token",
        "secret",
        "password",
        "passphrase",
        "credential",
        "authorization",
        "api_key",
        "apikey",
        "private_key",
    ]
    .iter()
    .any(|s| n.contains(s))
}

/// `value` with the value of every object member whose name looks like a secret replaced by
/// `"[redacted]"`, at any depth.
pub fn redact_secrets(value: &Value) -> Value {
    match value {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let v = if secret_name(k) {
                        json!("[redacted]")
                    } else {
                        redact_secrets(v)
                    };
                    (k.clone(), v)
                })
                .collect::<Map<String, Value>>(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(redact_secrets).collect()),
        other => other.clone(),
    }
}

/// Secret values shorter than this are masked only where a string equals them: a short value
/// (`"1"`) inside longer text is more likely a coincidence than an echo.
pub const MIN_ECHOED_SECRET_CHARS: usize = 4;

/// The string values of every object member of `value` whose name looks like a secret (the
/// ones [`redact_secrets`] hides), at any depth, longest first, without duplicates.
pub fn secret_values(value: &Value) -> Vec<String> {
    fn strings(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) if !s.is_empty() => out.push(s.clone()),
            Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
            Value::Object(m) => m.values().for_each(|x| strings(x, out)),
            _ => {}
        }
    }
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if secret_name(k) {
                        strings(x, out);
                    } else {
                        walk(x, out);
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, &mut out);
    out.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    out.dedup();
    out
}

/// `value` as [`redact_secrets`] shows it, and with every occurrence of one of `secrets` (as
/// [`secret_values`] lists them) inside a string replaced by `[redacted]` — a value
/// shorter than [`MIN_ECHOED_SECRET_CHARS`] only where the whole string equals it.
pub fn redact_echoes(value: &Value, secrets: &[String]) -> Value {
    fn mask(v: &Value, secrets: &[String]) -> Value {
        match v {
            Value::String(s) => {
                let mut out = s.clone();
                for secret in secrets {
                    if out == *secret {
                        return json!("[redacted]");
                    }
                    if secret.chars().count() >= MIN_ECHOED_SECRET_CHARS
                        && out.contains(secret.as_str())
                    {
                        out = out.replace(secret.as_str(), "[redacted]");
                    }
                }
                Value::String(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(|x| mask(x, secrets)).collect()),
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| (k.clone(), mask(x, secrets)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    let redacted = redact_secrets(value);
    if secrets.is_empty() {
        redacted
    } else {
        mask(&redacted, secrets)
    }
}

/// The selected operation's timeline at `now` (see the module docs), as one JSON object:
/// `operation`, `events`, `claims`, `intent`, `outbox`, `receipt`, `resolution`.
pub fn timeline(tx: &mut dyn EffectTx, selector: &Selector, now: i64) -> Result<Found, StoreError> {
    let mut rows = match selector {
        Selector::StatusRef(r) => ledger::rows_by_status_ref(tx, r)?,
        Selector::ToolKey {
            tool,
            key,
            tenant,
            subject,
        } => ledger::rows_by_tool_key(tx, tool, key)?
            .into_iter()
            .filter(|r| tenant.as_ref().is_none_or(|t| *t == r.tenant))
            .filter(|r| subject.as_ref().is_none_or(|s| *s == r.subject))
            .collect(),
    };
    match rows.len() {
        0 => Ok(Found::Absent),
        1 => {
            let row = rows.pop().expect("one row");
            Ok(Found::One(Box::new(build(tx, &row, now)?)))
        }
        n => Ok(Found::Ambiguous(n)),
    }
}

fn stored(tx: &mut dyn EffectTx, e: crate::Error) -> StoreError {
    tx.store_error(e)
}

fn build(tx: &mut dyn EffectTx, row: &LedgerRow, now: i64) -> Result<Value, StoreError> {
    let c = &row.contract;
    let secrets = secret_values(&row.arguments);
    let mut operation = json!({
        "status_ref": row.status_ref,
        "tool": row.tool,
        "key": row.key,
        "tenant": row.tenant,
        "subject": row.subject,
        "effect_kind": row.effect_kind,
        "state": row.state.as_str(),
        "request_digest": row.request_digest,
        "contract": {
            "input_rev": c.input_rev, "output_rev": c.output_rev, "effect_rev": c.effect_rev,
            "handler_rev": c.handler_rev, "producer_rev": c.producer_rev,
            "policy_rev": c.policy_rev,
        },
        "arguments": redact_echoes(&row.arguments, &secrets),
        "result": row.result.as_ref().map(|r| redact_echoes(r, &secrets)),
        "authority_deadline": row.authority_deadline,
        "retention_deadline": row.retention_deadline,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "age_seconds": now.saturating_sub(row.created_at).max(0),
    });
    // A tombstone says so: its arguments and result were removed after its retention
    // deadline, not never stored.
    if let Some(at) = row.compacted_at {
        operation["compacted_at"] = json!(at);
    }
    let events = ledger::load_events(tx, row.id).map_err(|e| stored(tx, e))?;
    let mut claims = Vec::new();
    let mut resolution = Value::Null;
    let events: Vec<Value> = events
        .into_iter()
        .map(|(id, at, kind, detail)| {
            if kind == "claimed" {
                claims.push(json!({
                    "at": at,
                    "attempt": detail.get("attempt"),
                    "fencing_token": detail.get("fencing_token"),
                    "lease_owner": detail.get("lease_owner"),
                    "lease_until": detail.get("lease_until"),
                }));
            }
            if kind == "resolved" {
                let mut r = detail.clone();
                r["at"] = json!(at);
                resolution = r;
            }
            json!({"id": id, "at": at, "kind": kind, "detail": redact_echoes(&detail, &secrets)})
        })
        .collect();
    let outbox = match outbox::for_operation(tx, row.id)? {
        None => Value::Null,
        Some(ev) => json!({
            "state": ev.state.word(),
            "fencing_token": ev.fencing_token,
            "lease_owner": ev.lease_owner,
            "lease_until": ev.lease_until,
            "lease_live": ev.lease_until.is_some_and(|u| now < u),
            "attempt_count": ev.attempt_count,
            "max_attempts": ev.max_attempts,
            "last_error": ev.last_error,
            "delivered_at": ev.delivered_at,
        }),
    };
    let intent = intent(tx, row.id)?;
    let receipt = receipt(tx, row.id, &secrets)?;
    let mut out = json!({
        "operation": operation,
        "events": events,
        "claims": claims,
        "intent": intent,
        "outbox": outbox,
        "receipt": receipt,
        "resolution": resolution,
    });
    if row.state == OperationState::InProgress {
        out["operation"]["stuck"] = json!(ledger::in_progress_expired(row.updated_at, now));
    }
    Ok(out)
}

/// The provider call and approval a deferred intent stored (`null` for inline operations).
fn intent(tx: &mut dyn EffectTx, id: i64) -> Result<Value, StoreError> {
    let row = tx
        .query_opt(
            "SELECT provider, api_family, adapter_revision, turn_id, call_id, response_id,
                 downstream_key, approval_id, approver, approved_at, approval_expires_at,
                 created_at
             FROM deferred_intents WHERE operation_id = ?1",
            &[id.into()],
        )
        .map_err(|e| stored(tx, e))?;
    let Some(r) = row else {
        return Ok(Value::Null);
    };
    Ok(json!({
        "provider": column(r.text(0))?,
        "api_family": column(r.text(1))?,
        "adapter_revision": column(r.text(2))?,
        "turn_id": column(r.text(3))?,
        "call_id": column(r.text(4))?,
        "response_id": column(r.text(5))?,
        "downstream_key": column(r.text(6))?,
        "approval": match column(r.opt_text(7))? {
            None => Value::Null,
            Some(approval_id) => json!({
                "approval_id": approval_id,
                "approver": column(r.opt_text(8))?,
                "approved_at": column(r.opt_int(9))?,
                "expires_at": column(r.opt_int(10))?,
            }),
        },
        "created_at": column(r.int(11))?,
    }))
}

/// The local receipt reconciled for the operation (`null` when there is none).
fn receipt(tx: &mut dyn EffectTx, id: i64, secrets: &[String]) -> Result<Value, StoreError> {
    let row = tx
        .query_opt(
            "SELECT receipt_id, reconciled_via, fencing_token, query_identity, reconciled_at,
                 receipt, receipt_digest, call_binding_digest
             FROM local_receipts WHERE operation_id = ?1",
            &[id.into()],
        )
        .map_err(|e| stored(tx, e))?;
    let Some(r) = row else {
        return Ok(Value::Null);
    };
    let receipt = ledger::parse_stored(&column(r.text(5))?)?;
    Ok(json!({
        "receipt_id": column(r.text(0))?,
        "reconciled_via": column(r.text(1))?,
        "fencing_token": column(r.opt_int(2))?,
        "query_identity": column(r.opt_text(3))?,
        "reconciled_at": column(r.int(4))?,
        "receipt": redact_echoes(&receipt, secrets),
        "receipt_digest": column(r.text(6))?,
        "call_binding_digest": column(r.text(7))?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_at_any_depth_and_nothing_else() {
        let v = json!({
            "order_id": "ord-1",
            "api_token": "tl_abc",
            "nested": {"Password": "p", "list": [{"client-secret": "s", "n": 1}]},
            "amount_cents": 1250,
        });
        let r = redact_secrets(&v);
        assert_eq!(r["order_id"], "ord-1");
        assert_eq!(r["amount_cents"], 1250);
        assert_eq!(r["api_token"], "[redacted]");
        assert_eq!(r["nested"]["Password"], "[redacted]");
        assert_eq!(r["nested"]["list"][0]["client-secret"], "[redacted]");
        assert_eq!(r["nested"]["list"][0]["n"], 1);
        assert_eq!(
            redact_secrets(&json!({"fencing_token": 3}))["fencing_token"],
            3
        );
    }

    #[test]
    fn a_secret_argument_echoed_in_a_result_is_masked_there_too() {
        let args = json!({"to": "bob@example.com", "api_key": "sk-live-4242",
                          "auth": {"password": ["hunter22", "pw"]}});
        let secrets = secret_values(&args);
        assert_eq!(secrets, vec!["sk-live-4242", "hunter22", "pw"]);
        let result = json!({
            "content": [{"type": "text", "text": "sent with key sk-live-4242 to bob@example.com"}],
            "structuredContent": {"key": "sk-live-4242", "short": "pw", "word": "pwned", "n": 1},
        });
        let r = redact_echoes(&result, &secrets);
        assert_eq!(
            r["content"][0]["text"],
            "sent with key [redacted] to bob@example.com"
        );
        assert_eq!(r["structuredContent"]["key"], "[redacted]");
        assert_eq!(
            r["structuredContent"]["short"], "[redacted]",
            "a whole short value"
        );
        assert_eq!(
            r["structuredContent"]["word"], "pwned",
            "not inside other text"
        );
        assert_eq!(r["structuredContent"]["n"], 1);
        assert_eq!(redact_echoes(&args, &secrets)["to"], "bob@example.com");
        assert_eq!(redact_echoes(&result, &[]), result);
    }
}
