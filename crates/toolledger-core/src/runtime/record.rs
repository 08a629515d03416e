//! The deferred view of the ledger: [`DeferredRecord`], a ledger row (decoded by the
//! ledger's one row decoder) joined with its intent context (provider call, downstream key,
//! approval binding), the loaders by scope, status reference and id, the event writer for
//! canonical details, and the bindings derived from a record (the approval target, the
//! downstream request, the purpose-bound identity of a status query).

use super::*;
use crate::ledger::{self, OperationRow};

/// The approval fields a deferred intent stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IntentApproval {
    /// Approval id.
    pub approval_id: String,
    /// Approver principal name.
    pub approver: String,
    /// Approval digest at acceptance.
    pub approval_digest: String,
    /// Granted at.
    pub approved_at: i64,
    /// Expired from.
    pub expires_at: i64,
}

/// One deferred operation, read back and checked against the storage contract.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeferredRecord {
    /// Operation row id.
    pub id: i64,
    /// Scope.
    pub scope: Scope,
    /// Accepted request digest.
    pub request_digest: String,
    /// Contract revisions at acceptance.
    pub contract: ToolContract,
    /// Canonical business arguments.
    pub arguments: Value,
    /// Canonical text of the arguments, as stored.
    #[serde(skip)]
    pub arguments_text: String,
    /// Current state.
    pub state: OperationState,
    /// Stored result.
    pub result: Option<Value>,
    /// Opaque reference.
    pub status_ref: String,
    /// Provider context of the first call.
    pub provider: ProviderContext,
    /// SHA-256 of the canonical scope (the downstream's key).
    pub downstream_key: String,
    /// Approval binding, if the intent was approved.
    pub approval: Option<IntentApproval>,
    /// First second at which no write is allowed any more (not even an exact replay).
    pub authority_deadline: Option<i64>,
    /// First second at which a replay is refused; the row stays as a tombstone.
    pub retention_deadline: Option<i64>,
    /// When the operation was compacted to a tombstone after its retention deadline. A
    /// tombstone keeps no arguments (JSON `null`), result, intent context or events: its
    /// provider context and downstream key are empty.
    pub compacted_at: Option<i64>,
}

/// The deferred view of a ledger row and its intent context; `None` for an inline row.
fn decode(stored: OperationRow, row: Vec<SqlValue>) -> Result<Option<DeferredRecord>, StoreError> {
    use crate::ledger::{column, contract};
    if stored.effect_kind != "deferred" {
        return Ok(None);
    }
    let r = ledger::decode(stored)?;
    if r.compacted_at.is_some() {
        return Ok(Some(tombstone(r)));
    }
    if column(row.opt_int(0))?.is_none() {
        return Err(contract("deferred operation has no intent context"));
    }
    let text = |k: usize| column(row.text(k));
    let approval = match (
        column(row.opt_text(8))?,
        column(row.opt_text(9))?,
        column(row.opt_text(10))?,
        column(row.opt_int(11))?,
        column(row.opt_int(12))?,
    ) {
        (None, None, None, None, None) => None,
        (Some(approval_id), Some(approver), Some(approval_digest), Some(at), Some(exp)) => {
            Some(IntentApproval {
                approval_id,
                approver,
                approval_digest,
                approved_at: at,
                expires_at: exp,
            })
        }
        _ => return Err(contract("approval binding is incomplete")),
    };
    let provider = ProviderContext {
        provider: text(1)?,
        api_family: text(2)?,
        adapter_revision: text(3)?,
        turn_id: text(4)?,
        call_id: text(5)?,
        response_id: text(6)?,
    };
    Ok(Some(record(r, provider, text(7)?, approval)))
}

/// The deferred view of a tombstone: no intent context remains (empty provider context and
/// downstream key, no approval).
fn tombstone(r: ledger::LedgerRow) -> DeferredRecord {
    let none = String::new;
    let provider = ProviderContext {
        provider: none(),
        api_family: none(),
        adapter_revision: none(),
        turn_id: none(),
        call_id: none(),
        response_id: none(),
    };
    record(r, provider, none(), None)
}

/// A ledger row with its intent context.
fn record(
    r: ledger::LedgerRow,
    provider: ProviderContext,
    downstream_key: String,
    approval: Option<IntentApproval>,
) -> DeferredRecord {
    DeferredRecord {
        id: r.id,
        scope: Scope {
            tenant: r.tenant,
            subject: r.subject,
            tool: r.tool,
            key: r.key,
        },
        request_digest: r.request_digest,
        contract: r.contract,
        arguments: r.arguments,
        arguments_text: r.arguments_text,
        state: r.state,
        result: r.result,
        status_ref: r.status_ref,
        provider,
        downstream_key,
        approval,
        authority_deadline: r.authority_deadline,
        retention_deadline: r.retention_deadline,
        compacted_at: r.compacted_at,
    }
}

/// Outcome of loading a scope's row: absent, an inline operation under the same scope, or a
/// checked deferred record.
pub(super) enum Loaded {
    Absent,
    NotDeferred,
    Deferred(Box<DeferredRecord>),
}

/// The deferred row `by` names.
fn load(tx: &mut dyn EffectTx, by: ledger::RowBy<'_>) -> Result<Loaded, RuntimeError> {
    let Some((row, intent)) = ledger::row_with_intent(tx, by)? else {
        return Ok(Loaded::Absent);
    };
    match decode(row, intent)? {
        None => Ok(Loaded::NotDeferred),
        Some(r) => Ok(Loaded::Deferred(Box::new(r))),
    }
}

/// The row of one scope.
pub(super) fn load_scope(tx: &mut dyn EffectTx, scope: &Scope) -> Result<Loaded, RuntimeError> {
    load(tx, ledger::RowBy::Scope(scope))
}

/// The row with one status reference.
pub(super) fn load_status_ref(
    tx: &mut dyn EffectTx,
    status_ref: &str,
) -> Result<Loaded, RuntimeError> {
    load(tx, ledger::RowBy::StatusRef(status_ref))
}

/// The deferred operation an outbox event belongs to.
pub(super) fn load_id(tx: &mut dyn EffectTx, id: i64) -> Result<DeferredRecord, RuntimeError> {
    match load(tx, ledger::RowBy::Id(id))? {
        Loaded::Deferred(r) => Ok(*r),
        _ => Err(contract_violation(
            "outbox event without a deferred operation",
        )),
    }
}

/// Takes operation `id`'s lock: the closing transactions of a worker, a status query and an
/// operator's resolution serialize on it (a no-op where writes are already serialized).
pub(super) fn lock_operation(tx: &mut dyn EffectTx, id: i64) -> Result<(), RuntimeError> {
    tx.lock_key(&operation_lock(id)).map_err(|e| stored(tx, e))
}

/// Operation `id` under its lock ([`lock_operation`]), read after the lock was taken.
pub(super) fn load_locked(tx: &mut dyn EffectTx, id: i64) -> Result<DeferredRecord, RuntimeError> {
    lock_operation(tx, id)?;
    load_id(tx, id)
}

/// The outbox event of a deferred operation (every one has exactly one).
pub(super) fn outbox_event(
    tx: &mut dyn EffectTx,
    operation_id: i64,
) -> Result<outbox::OutboxEvent, RuntimeError> {
    outbox::for_operation(tx, operation_id)?
        .ok_or_else(|| contract_violation("deferred operation without outbox event"))
}

/// Appends an event with a canonical `detail` to a deferred operation's history.
pub(super) fn insert_event(
    tx: &mut dyn EffectTx,
    operation_id: i64,
    now: i64,
    kind: &str,
    detail: &Value,
) -> Result<(), RuntimeError> {
    let text = json::canonical_string(detail)
        .map_err(|_| contract_violation("event detail is not canonical"))?;
    ledger::insert_event(tx, operation_id, now, kind, &text).map_err(|e| stored(tx, e))
}

/// The approval binding of a deferred intent: request digest, the six revisions and the full
/// provider context. The worker rebuilds it from durable identities before any downstream call.
pub fn approval_target(
    scope: &Scope,
    contract: &ToolContract,
    request_digest: &str,
    provider: &ProviderContext,
) -> ApprovalTarget {
    ApprovalTarget {
        tenant: scope.tenant.clone(),
        subject: scope.subject.clone(),
        tool: scope.tool.clone(),
        idempotency_key: scope.key.clone(),
        binding: json!({
            "provider": provider.to_value(),
            "request_digest": request_digest,
            "revisions": {
                "effect_rev": contract.effect_rev,
                "handler_rev": contract.handler_rev,
                "input_rev": contract.input_rev,
                "output_rev": contract.output_rev,
                "policy_rev": contract.policy_rev,
                "producer_rev": contract.producer_rev,
            },
        }),
    }
}

/// A request sent downstream for a deferred operation, read back from its JSON form (what
/// [`downstream_request`] builds and [`Downstream::submit`] is given).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct DownstreamRequest {
    /// The call's canonical arguments.
    pub arguments: Value,
    /// The request digest.
    pub request_digest: String,
    /// The scope digest: the key the downstream deduplicates on.
    pub scope_digest: String,
    /// The operation's opaque status reference.
    pub status_ref: String,
    /// The tool's name.
    pub tool: String,
}

impl DownstreamRequest {
    /// The request whose JSON form is `request`; `None` when `request` is not one.
    pub fn from_json(request: &Value) -> Option<DownstreamRequest> {
        DownstreamRequest::deserialize(request).ok()
    }
}

/// The request sent downstream for a record, in its JSON form: scope digest, status ref,
/// request digest, tool and canonical arguments ([`DownstreamRequest`]).
pub fn downstream_request(record: &DeferredRecord) -> Value {
    json!({
        "arguments": record.arguments,
        "request_digest": record.request_digest,
        "scope_digest": record.downstream_key,
        "status_ref": record.status_ref,
        "tool": record.scope.tool,
    })
}

/// A receipt for `request` (a [`downstream_request`]) that binds it as the runtime checks: its
/// status ref, scope digest, the SHA-256 of its canonical form and the request itself, with
/// `receipt_id` and the `result` to record.
pub fn bound_receipt(request: &Value, receipt_id: &str, result: Value) -> Value {
    let text = json::canonical_string(request).unwrap_or_default();
    json!({
        "receipt_id": receipt_id,
        "status_ref": request["status_ref"],
        "scope_digest": request["scope_digest"],
        "request_sha256": crate::digest::sha256_hex(text.as_bytes()),
        "request": request,
        "result": result,
    })
}

/// The purpose-bound identity of a status query: derived from the original call and the
/// status ref, fixed to the purpose `query_status`, never usable for dispatch.
pub fn query_identity(provider: &ProviderContext, status_ref: &str) -> String {
    let v = json!({
        "call_id": provider.call_id,
        "purpose": "query_status",
        "response_id": provider.response_id,
        "status_ref": status_ref,
        "turn_id": provider.turn_id,
    });
    let text = json::canonical_string(&v).unwrap_or_default();
    format!(
        "{QUERY_IDENTITY_PREFIX}{}",
        &digest::sha256_hex(text.as_bytes())[..48]
    )
}
