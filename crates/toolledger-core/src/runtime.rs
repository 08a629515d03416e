//! The deferred-effect runtime: durable intent + outbox, leases with fencing tokens,
//! honest `outcome_unknown`, and reconciliation by an explicit status query.
//!
//! # Three commit points
//!
//! | point | durable fact | after a crash |
//! |---|---|---|
//! | **A** [`Runtime::accept`] | operation (`accepted`) + pending outbox event + consumed approval | not a success; a worker or status query takes over |
//! | **B** the downstream's own commit | the effect may have happened | `outcome_unknown` until a receipt is reconciled |
//! | **C** [`Runtime::complete`] / [`Runtime::status`] | local receipt + operation `succeeded` + event `delivered` | replays return the stored result after re-authorization |
//!
//! # Transaction A
//!
//! The principal is re-read through the principal store *inside* the write transaction, the
//! tool's current resource and business checks run there too, then the scope is reserved with
//! `INSERT … ON CONFLICT DO NOTHING` and the authoritative row is read back and compared item by
//! item (request digest, the six revisions, canonical arguments, tenant/subject/tool/key,
//! provider/API family/adapter revision). A mismatch is `operation_conflict`; a row that does not
//! agree with itself is a storage-contract error. Only for a new row are the approval consumed,
//! the deferred intent context and the outbox event written — all in the same transaction.
//!
//! # The worker
//!
//! [`Runtime::process`] claims an event (lease + fencing token), then — before any downstream
//! call — recomputes the request digest and the current revisions from the registry,
//! re-resolves the principal, re-runs the tool's authorization and business checks and
//! recomputes the approval digest from the durable identities. Any drift fails closed: no
//! downstream call, no receipt, the lease stays until it expires and the refusal is recorded as
//! an operation event. Every write after the claim is conditional on the fencing token.
//!
//! # dispatch never observes
//!
//! [`Runtime::dispatch`] of an operation that is not finished returns its `status_ref` and
//! `outcome_unknown`: it never runs the worker, never queries the downstream. Observing is
//! [`Runtime::status`], an explicit call with its own purpose-bound identity.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::approval::{self, ApprovalTarget, MAX_PORTABLE_TIMESTAMP};
use crate::authz;
use crate::clock::SharedClock;
use crate::digest::{self, CallBinding};
use crate::downstream::{scope_digest, BoxFuture, Downstream, DownstreamError};
use crate::effect::{EffectTx, RowExt, SqlValue};
use crate::json;
use crate::model::{Error, ErrorCode, OperationState, Principal, Scope, ToolContract};
use crate::outbox::{self, ClaimOutcome, Fenced, Lease};
use crate::store::{Store, StoreError};

/// Prefix of the purpose-bound identity a status query derives. Provider ids carrying it are
/// refused by [`Runtime::dispatch`], so a status query's identity can never start a write.
pub const QUERY_IDENTITY_PREFIX: &str = "query_status:";

/// Why a runtime call did not produce an answer.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A typed refusal the caller can act on (`operation_conflict`, `not_found`,
    /// `approval_invalid`, `contract_drift`, …). Nothing was written except, for worker
    /// refusals, the recorded attempt.
    #[error("{0}")]
    Refused(Error),
    /// The store failed or stored data violates the storage contract.
    #[error("{0}")]
    Store(StoreError),
    /// The lease was taken over by a newer claim; the stale worker changed nothing.
    #[error("{0}")]
    Fenced(Fenced),
}

impl RuntimeError {
    /// The stable error code a caller sees (`unavailable` for store failures).
    pub fn code(&self) -> ErrorCode {
        match self {
            RuntimeError::Refused(e) => e.code,
            RuntimeError::Store(_) | RuntimeError::Fenced(_) => ErrorCode::Unavailable,
        }
    }
}

impl From<StoreError> for RuntimeError {
    fn from(e: StoreError) -> Self {
        RuntimeError::Store(e)
    }
}

impl From<Error> for RuntimeError {
    fn from(e: Error) -> Self {
        RuntimeError::Refused(e)
    }
}

impl From<RuntimeError> for Error {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::Refused(e) => e,
            RuntimeError::Store(s) => Error::from(s),
            RuntimeError::Fenced(f) => Error::unavailable(f.to_string()),
        }
    }
}

fn contract_violation(what: &str) -> RuntimeError {
    RuntimeError::Store(StoreError::Contract(what.to_string()))
}

/// A failed ledger statement: the backend's storage error (or a storage-contract error).
fn stored(tx: &mut dyn EffectTx, e: Error) -> RuntimeError {
    RuntimeError::Store(outbox::store_error(tx, e))
}

/// The provider call a deferred intent came from. Replays and status queries must come from
/// the same provider, API family and adapter revision; the ids bind the approval.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderContext {
    /// Provider, e.g. `mcp`, `openai`.
    pub provider: String,
    /// API family, e.g. `tools/call`, `responses`.
    pub api_family: String,
    /// Revision of the adapter that translated the provider call.
    pub adapter_revision: String,
    /// Provider turn id.
    pub turn_id: String,
    /// Provider call id.
    pub call_id: String,
    /// Provider response id.
    pub response_id: String,
}

/// A registered `(provider, api_family, adapter_revision)` triple.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProviderProfile {
    /// Provider.
    pub provider: String,
    /// API family.
    pub api_family: String,
    /// Adapter revision.
    pub adapter_revision: String,
}

impl ProviderProfile {
    /// A profile from its three parts.
    pub fn new(provider: &str, api_family: &str, adapter_revision: &str) -> Self {
        ProviderProfile {
            provider: provider.into(),
            api_family: api_family.into(),
            adapter_revision: adapter_revision.into(),
        }
    }

    /// The profile the reference MCP server uses for `tools/call` (MCP 2026-07-28).
    pub fn mcp() -> Self {
        ProviderProfile::new("mcp", "tools/call", "2026-07-28")
    }
}

fn check_id(what: &str, s: &str, max: usize) -> Result<(), Error> {
    let n = s.chars().count();
    if n == 0 || n > max || s.chars().any(|c| c.is_control()) {
        return Err(Error::invalid(format!(
            "{what} must be 1 to {max} characters without control characters"
        )));
    }
    Ok(())
}

impl ProviderContext {
    /// The MCP context for one guarded call: the idempotency key stands for turn, call and
    /// response id, because an MCP server does not see the model's own call ids and a retry
    /// carries a new JSON-RPC id.
    pub fn mcp(key: &str) -> Self {
        let p = ProviderProfile::mcp();
        ProviderContext {
            provider: p.provider,
            api_family: p.api_family,
            adapter_revision: p.adapter_revision,
            turn_id: key.into(),
            call_id: key.into(),
            response_id: key.into(),
        }
    }

    /// The registered-profile part.
    pub fn profile(&self) -> ProviderProfile {
        ProviderProfile {
            provider: self.provider.clone(),
            api_family: self.api_family.clone(),
            adapter_revision: self.adapter_revision.clone(),
        }
    }

    fn check(&self) -> Result<(), Error> {
        check_id("provider", &self.provider, 64)?;
        check_id("api_family", &self.api_family, 64)?;
        check_id("adapter_revision", &self.adapter_revision, 64)?;
        check_id("turn_id", &self.turn_id, 128)?;
        check_id("call_id", &self.call_id, 128)?;
        check_id("response_id", &self.response_id, 128)?;
        Ok(())
    }

    fn to_value(&self) -> Value {
        json!({
            "adapter_revision": self.adapter_revision,
            "api_family": self.api_family,
            "call_id": self.call_id,
            "provider": self.provider,
            "response_id": self.response_id,
            "turn_id": self.turn_id,
        })
    }
}

/// A tool whose effect is delivered through the outbox to a downstream system.
///
/// The checks receive the caller's open transaction as an [`EffectTx`] and must only read.
pub trait DeferredTool: Send + Sync + 'static {
    /// The current contract (name and six revisions).
    fn contract(&self) -> ToolContract;

    /// Validates the business arguments (no idempotency key, no approval) against the input
    /// schema and returns them in canonical shape. `invalid_arguments` on failure.
    fn validate(&self, arguments: &Value) -> Result<Value, Error>;

    /// Current resource authorization: may `principal` see the resource the arguments name?
    /// Refuse with `not_found` (same shape as an absent resource). Used at replay and status.
    fn check_access(
        &self,
        tx: &mut dyn EffectTx,
        principal: &Principal,
        arguments: &Value,
    ) -> Result<(), Error>;

    /// Access plus the current business state (e.g. the order is still refundable), used at
    /// reservation and before the worker's downstream effect. `business_state_changed` when
    /// the state no longer allows the effect.
    fn check(
        &self,
        tx: &mut dyn EffectTx,
        principal: &Principal,
        arguments: &Value,
    ) -> Result<(), Error>;

    /// Whether a new intent needs an approval.
    fn requires_approval(&self) -> bool;

    /// Checks a downstream receipt against the per-tool output contract and the accepted
    /// arguments, and returns the tool result. Generic bindings (status ref, scope, request
    /// digest) are already checked by the runtime.
    fn accept_receipt(&self, arguments: &Value, receipt: &Value) -> Result<Value, Error>;
}

type ToolEntry = (Arc<dyn DeferredTool>, Arc<dyn Downstream>);

/// The registered deferred tools, their downstreams and the accepted provider profiles.
#[derive(Clone, Default)]
pub struct Registry {
    tools: BTreeMap<String, ToolEntry>,
    profiles: BTreeSet<ProviderProfile>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .field("profiles", &self.profiles)
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// Registers `tool`, delivered to `downstream`.
    pub fn register(
        mut self,
        tool: Arc<dyn DeferredTool>,
        downstream: Arc<dyn Downstream>,
    ) -> Self {
        self.tools
            .insert(tool.contract().name.clone(), (tool, downstream));
        self
    }

    /// Accepts calls from `profile`.
    pub fn allow_profile(mut self, profile: ProviderProfile) -> Self {
        self.profiles.insert(profile);
        self
    }

    /// Whether `profile` is registered.
    pub fn has_profile(&self, profile: &ProviderProfile) -> bool {
        self.profiles.contains(profile)
    }

    /// The tool called `name`.
    pub fn tool(&self, name: &str) -> Option<&Arc<dyn DeferredTool>> {
        self.tools.get(name).map(|(t, _)| t)
    }

    fn entry(&self, name: &str) -> Option<ToolEntry> {
        self.tools.get(name).cloned()
    }
}

/// One call of a deferred tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeferredCall {
    /// Principal name; resolved through the principal store at every check.
    pub principal: String,
    /// Tool name.
    pub tool: String,
    /// Idempotency key.
    pub key: String,
    /// Business arguments (without key and approval).
    pub arguments: Value,
    /// Approval id, if the caller has one.
    pub approval_id: Option<String>,
    /// The provider call context.
    pub provider: ProviderContext,
}

/// An explicit status query for one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusQuery {
    /// Principal name.
    pub principal: String,
    /// Tool name.
    pub tool: String,
    /// Idempotency key of the original call.
    pub key: String,
    /// Business arguments of the original call.
    pub arguments: Value,
    /// The original call's provider context (the query derives its own identity from it).
    pub provider: ProviderContext,
    /// The opaque reference dispatch returned.
    pub status_ref: String,
}

/// A named point where a crash is injected (in process) or a test holds the process to kill it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CrashPoint {
    /// Transaction A committed; nothing claimed.
    AfterIntentCommit,
    /// The claim committed; the downstream was not called.
    AfterClaim,
    /// The downstream committed its receipt; transaction C has not run.
    AfterDownstreamCommit,
}

impl CrashPoint {
    /// Every point, in path order.
    pub const ALL: [CrashPoint; 3] = [
        CrashPoint::AfterIntentCommit,
        CrashPoint::AfterClaim,
        CrashPoint::AfterDownstreamCommit,
    ];

    /// The stable name (`after_intent_commit`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            CrashPoint::AfterIntentCommit => "after_intent_commit",
            CrashPoint::AfterClaim => "after_claim",
            CrashPoint::AfterDownstreamCommit => "after_downstream_commit",
        }
    }

    /// Parses the stable name.
    pub fn parse(s: &str) -> Option<Self> {
        CrashPoint::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// A hook awaited at each [`CrashPoint`] on a fresh path (tests hold the process there).
pub type PointHook = Arc<dyn Fn(CrashPoint) -> BoxFuture<'static, ()> + Send + Sync>;

/// How a result reached the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Produced by this call.
    Fresh,
    /// Read back from the ledger.
    LocalReplay,
    /// Reconciled from a downstream receipt by a status query.
    ReceiptReconciled,
}

impl Delivery {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Fresh => "fresh",
            Delivery::LocalReplay => "local_replay",
            Delivery::ReceiptReconciled => "receipt_reconciled",
        }
    }
}

/// The answer to a dispatch or status query.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Answer {
    /// The operation finished (`succeeded`, or `failed` with its stored refusal).
    Done {
        /// Opaque reference.
        status_ref: String,
        /// Final state.
        state: OperationState,
        /// How the result reached the caller.
        delivery: Delivery,
        /// The stored result.
        result: Value,
    },
    /// The effect may or may not have happened: `outcome_unknown`.
    Unknown {
        /// Opaque reference for a later status query.
        status_ref: String,
        /// The ledger state (`accepted`, `processing`, `outcome_unknown`, `dead`).
        state: OperationState,
    },
}

impl Answer {
    /// The status reference.
    pub fn status_ref(&self) -> &str {
        match self {
            Answer::Done { status_ref, .. } | Answer::Unknown { status_ref, .. } => status_ref,
        }
    }
}

/// What transaction A did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// A new intent and its outbox event were committed.
    New {
        /// Operation row id.
        operation_id: i64,
        /// Outbox event id.
        event_id: i64,
        /// Opaque reference.
        status_ref: String,
    },
    /// The scope already held the same intent.
    Existing {
        /// Operation row id.
        operation_id: i64,
        /// Opaque reference.
        status_ref: String,
        /// Its state.
        state: OperationState,
    },
}

/// Tunables of the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Lease length in seconds.
    pub lease_seconds: i64,
    /// Claims before an event is dead.
    pub max_attempts: i64,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            lease_seconds: outbox::DEFAULT_LEASE_SECONDS,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        }
    }
}

/// Deadlines a deferred operation gets at acceptance (transaction A), as lengths in seconds
/// from the acceptance time. `None` leaves the deadline unset (no limit).
///
/// On a replay by `dispatch`/`accept` the order is: scope lookup and conflict check first, then
/// the authority deadline (`operation_authority_expired`: no write, not even an exact replay),
/// then the retention deadline (`operation_retention_expired`; the row stays as a tombstone, so
/// the key can never be reused). A deadline has passed when `now >= deadline`. The worker does
/// not call the downstream after the authority deadline. An explicit status query never checks
/// deadlines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deadlines {
    /// Seconds from acceptance to the authority deadline.
    pub authority_ttl: Option<i64>,
    /// Seconds from acceptance to the retention deadline.
    pub retention_ttl: Option<i64>,
}

/// Longest deadline length accepted: ten years.
pub const MAX_TTL_SECONDS: i64 = 10 * 366 * 86_400;

impl Deadlines {
    /// The absolute deadlines for an operation accepted at `now`.
    fn at(&self, now: i64) -> Result<(Option<i64>, Option<i64>), Error> {
        let one = |ttl: Option<i64>, what: &str| -> Result<Option<i64>, Error> {
            match ttl {
                None => Ok(None),
                Some(t) if (1..=MAX_TTL_SECONDS).contains(&t) => match now.checked_add(t) {
                    Some(d) if d <= MAX_PORTABLE_TIMESTAMP => Ok(Some(d)),
                    _ => Err(Error::invalid(format!(
                        "the {what} deadline would fall outside the portable time range"
                    ))),
                },
                Some(_) => Err(Error::invalid(format!(
                    "the {what} TTL must be 1 to {MAX_TTL_SECONDS} seconds"
                ))),
            }
        };
        Ok((
            one(self.authority_ttl, "authority")?,
            one(self.retention_ttl, "retention")?,
        ))
    }
}

/// Refuses a replay whose deadlines have passed: authority first, then retention.
fn check_deadlines(record: &DeferredRecord, now: i64) -> Result<(), Error> {
    if record.authority_deadline.is_some_and(|d| now >= d) {
        return Err(Error::new(
            ErrorCode::OperationAuthorityExpired,
            "the operation's authority deadline has passed",
        ));
    }
    if record.retention_deadline.is_some_and(|d| now >= d) {
        return Err(Error::new(
            ErrorCode::OperationRetentionExpired,
            "the operation's retention deadline has passed; the key cannot be reused",
        ));
    }
    Ok(())
}

/// How an operator settles an unknown outcome with [`Runtime::resolve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolveAs {
    /// The effect happened: requires the downstream's receipt, reconciled like a status query.
    Succeeded,
    /// The effect did not happen: refused when the downstream holds a receipt.
    Failed,
}

impl ResolveAs {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            ResolveAs::Succeeded => "succeeded",
            ResolveAs::Failed => "failed",
        }
    }
}

/// An operator's resolution of an `outcome_unknown` (or `dead`) operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    /// The operation's opaque reference.
    pub status_ref: String,
    /// The outcome the operator asserts.
    pub outcome: ResolveAs,
    /// Why (recorded in the operation's events).
    pub reason: String,
    /// The operator's principal name: must currently hold [`OPERATOR_ROLE`] in the
    /// operation's tenant.
    pub operator: String,
}

/// The role a principal needs to resolve unknown outcomes.
pub const OPERATOR_ROLE: &str = "operator";

/// The stored result of an operation an operator resolved as failed.
pub const RESOLVED_FAILED_CODE: &str = "resolved_failed";

/// The stored result of a `failed` operation: `{code, message}`.
pub fn failure_result(code: &str, message: &str) -> Value {
    json!({"code": code, "message": message})
}

fn valid_refusal(code: &str, message: &str) -> bool {
    (1..=64).contains(&code.len())
        && code
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && (1..=256).contains(&message.len())
        && !message.chars().any(char::is_control)
}

/// What [`Runtime::process`] did with one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Processed {
    /// The event is closed: transaction C committed (`succeeded`), or the downstream refused
    /// definitively and the operation is `failed` with its stored refusal.
    Delivered(Answer),
    /// The attempt stopped where the outcome is unknown (crash point, downstream unavailable).
    Unknown(Answer),
    /// The event was not claimed (leased by someone else, finished, exhausted, missing).
    NotClaimed(ClaimOutcome),
}

/// Summary of one worker pass.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PassSummary {
    /// Events found ready.
    pub ready: usize,
    /// Delivered in this pass.
    pub delivered: usize,
    /// Refused definitively by the downstream in this pass (now `failed`).
    pub failed: usize,
    /// Stopped with an unknown outcome.
    pub unknown: usize,
    /// Refused before the downstream call, by error code.
    pub refused: BTreeMap<String, usize>,
    /// Not claimed (someone else holds the lease, or it finished meanwhile).
    pub skipped: usize,
    /// Declared dead (attempts exhausted).
    pub dead: usize,
}

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
}

const SELECT_DEFERRED: &str = "SELECT o.id, o.tenant, o.subject, o.tool, o.idempotency_key,
    o.request_digest, o.input_rev, o.output_rev, o.effect_rev, o.handler_rev, o.producer_rev,
    o.policy_rev, o.arguments, o.effect_kind, o.state, o.result, o.result_digest, o.status_ref,
    d.operation_id, d.provider, d.api_family, d.adapter_revision, d.turn_id, d.call_id,
    d.response_id, d.downstream_key, d.approval_id, d.approver, d.approval_digest,
    d.approved_at, d.approval_expires_at, o.authority_deadline, o.retention_deadline
    FROM operations o LEFT JOIN deferred_intents d ON d.operation_id = o.id";

type RawRow = (Vec<Option<String>>, Vec<Option<i64>>);

fn raw_row(r: &[SqlValue]) -> Result<RawRow, Error> {
    // Text columns and integer columns, by position.
    let text_cols = [
        1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 19, 20, 21, 22, 23, 24, 25, 26,
        27, 28,
    ];
    let int_cols = [0, 18, 29, 30, 31, 32];
    let mut texts = Vec::with_capacity(text_cols.len());
    for i in text_cols {
        texts.push(r.opt_text(i)?);
    }
    let mut ints = Vec::with_capacity(int_cols.len());
    for i in int_cols {
        ints.push(r.opt_int(i)?);
    }
    Ok((texts, ints))
}

fn parse_stored(text: &str) -> Result<Value, RuntimeError> {
    json::parse_canonical(text.as_bytes())
        .map_err(|_| contract_violation("stored JSON is not canonical"))
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn check_record((t, i): RawRow) -> Result<Option<DeferredRecord>, RuntimeError> {
    let req = |k: usize| -> Result<String, RuntimeError> {
        t[k].clone()
            .ok_or_else(|| contract_violation("deferred operation row is incomplete"))
    };
    // t: 0 tenant,1 subject,2 tool,3 key,4 digest,5..10 revs,11 args,12 kind,13 state,
    // 14 result,15 result_digest,16 status_ref,17 provider,18 api_family,19 adapter,20 turn,
    // 21 call,22 response,23 downstream_key,24 approval_id,25 approver,26 approval_digest
    if req(12)? != "deferred" {
        return Ok(None);
    }
    let id = i[0].ok_or_else(|| contract_violation("operation id missing"))?;
    if i[1].is_none() {
        return Err(contract_violation(
            "deferred operation has no intent context",
        ));
    }
    let state = OperationState::parse(&req(13)?)
        .ok_or_else(|| contract_violation("unknown operation state"))?;
    let arguments_text = req(11)?;
    let arguments = parse_stored(&arguments_text)?;
    let result = match (&t[14], &t[15]) {
        (Some(text), Some(d)) => {
            let v = parse_stored(text)?;
            if digest::sha256_hex(text.as_bytes()) != *d {
                return Err(contract_violation(
                    "stored result does not match its digest",
                ));
            }
            Some(v)
        }
        (None, None) => None,
        _ => return Err(contract_violation("result and result digest disagree")),
    };
    let request_digest = req(4)?;
    if !is_hex64(&request_digest) {
        return Err(contract_violation("malformed request digest"));
    }
    let approval = match (&t[24], &t[25], &t[26], i[2], i[3]) {
        (None, None, None, None, None) => None,
        (Some(a), Some(b), Some(c), Some(at), Some(exp)) => Some(IntentApproval {
            approval_id: a.clone(),
            approver: b.clone(),
            approval_digest: c.clone(),
            approved_at: at,
            expires_at: exp,
        }),
        _ => return Err(contract_violation("approval binding is incomplete")),
    };
    let tool = req(2)?;
    Ok(Some(DeferredRecord {
        id,
        scope: Scope {
            tenant: req(0)?,
            subject: req(1)?,
            tool: tool.clone(),
            key: req(3)?,
        },
        request_digest,
        contract: ToolContract {
            name: tool,
            input_rev: req(5)?,
            output_rev: req(6)?,
            effect_rev: req(7)?,
            handler_rev: req(8)?,
            producer_rev: req(9)?,
            policy_rev: req(10)?,
        },
        arguments,
        arguments_text,
        state,
        result,
        status_ref: req(16)?,
        provider: ProviderContext {
            provider: req(17)?,
            api_family: req(18)?,
            adapter_revision: req(19)?,
            turn_id: req(20)?,
            call_id: req(21)?,
            response_id: req(22)?,
        },
        downstream_key: req(23)?,
        approval,
        authority_deadline: i[4],
        retention_deadline: i[5],
    }))
}

/// Outcome of loading a scope's row: absent, an inline operation under the same scope, or a
/// checked deferred record.
enum Loaded {
    Absent,
    NotDeferred,
    Deferred(Box<DeferredRecord>),
}

fn load_where(
    tx: &mut dyn EffectTx,
    clause: &str,
    args: &[SqlValue],
) -> Result<Loaded, RuntimeError> {
    let sql = format!("{SELECT_DEFERRED} WHERE {clause}");
    let row = tx.query_opt(&sql, args).map_err(|e| stored(tx, e))?;
    let raw = match row {
        None => return Ok(Loaded::Absent),
        Some(row) => raw_row(&row).map_err(|e| contract_violation(&e.message))?,
    };
    match check_record(raw)? {
        None => Ok(Loaded::NotDeferred),
        Some(r) => Ok(Loaded::Deferred(Box::new(r))),
    }
}

fn load_scope(tx: &mut dyn EffectTx, scope: &Scope) -> Result<Loaded, RuntimeError> {
    load_where(
        tx,
        "o.tenant = ?1 AND o.subject = ?2 AND o.tool = ?3 AND o.idempotency_key = ?4",
        &[
            scope.tenant.as_str().into(),
            scope.subject.as_str().into(),
            scope.tool.as_str().into(),
            scope.key.as_str().into(),
        ],
    )
}

fn load_status_ref(tx: &mut dyn EffectTx, status_ref: &str) -> Result<Loaded, RuntimeError> {
    load_where(tx, "o.status_ref = ?1", &[status_ref.into()])
}

fn load_id(tx: &mut dyn EffectTx, id: i64) -> Result<DeferredRecord, RuntimeError> {
    match load_where(tx, "o.id = ?1", &[id.into()])? {
        Loaded::Deferred(r) => Ok(*r),
        _ => Err(contract_violation(
            "outbox event without a deferred operation",
        )),
    }
}

fn insert_event(
    tx: &mut dyn EffectTx,
    operation_id: i64,
    now: i64,
    kind: &str,
    detail: &Value,
) -> Result<(), RuntimeError> {
    let text = json::canonical_string(detail)
        .map_err(|_| contract_violation("event detail is not canonical"))?;
    tx.execute(
        "INSERT INTO operation_events (operation_id, at, kind, detail) VALUES (?1, ?2, ?3, ?4)",
        &[operation_id.into(), now.into(), kind.into(), text.into()],
    )
    .map_err(|e| stored(tx, e))?;
    Ok(())
}

/// The key transaction C locks, so a worker's completion and a status query's
/// reconciliation of one operation never interleave.
fn operation_lock(operation_id: i64) -> String {
    format!("deferred-operation\u{1f}{operation_id}")
}

/// Any authorization refusal becomes the generic `not_found`; a store failure stays what it is.
fn hide_refusal(e: Error) -> Error {
    if e.code == ErrorCode::Unavailable {
        e
    } else {
        Error::not_found()
    }
}

/// Runs `f` in the transaction it is given: [`Store::read`] is already one snapshot.
fn snapshot<T>(
    tx: &mut dyn EffectTx,
    f: impl FnOnce(&mut dyn EffectTx) -> Result<T, RuntimeError>,
) -> Result<T, RuntimeError> {
    f(tx)
}

fn new_status_ref() -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|_| Error::unavailable("no randomness available for a status reference"))?;
    Ok(format!("op_{}", hex::encode(bytes)))
}

fn check_now(now: i64) -> Result<(), Error> {
    if !(0..=MAX_PORTABLE_TIMESTAMP).contains(&now) {
        return Err(Error::invalid(
            "the clock is outside the portable time range",
        ));
    }
    Ok(())
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

/// The request sent downstream for a record: scope digest, status ref, request digest, tool
/// and canonical arguments.
pub fn downstream_request(record: &DeferredRecord) -> Value {
    json!({
        "arguments": record.arguments,
        "request_digest": record.request_digest,
        "scope_digest": record.downstream_key,
        "status_ref": record.status_ref,
        "tool": record.scope.tool,
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

/// A validated call, digested.
#[derive(Clone, Debug)]
struct Prepared {
    scope: Scope,
    contract: ToolContract,
    arguments: Value,
    arguments_text: String,
    request_digest: String,
    provider: ProviderContext,
    approval_id: Option<String>,
}

/// The deferred-effect runtime over one store. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    store: Store,
    clock: SharedClock,
    registry: Arc<Registry>,
    config: RuntimeConfig,
    deadlines: Deadlines,
    hook: Option<PointHook>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("store", &self.store)
            .field("registry", &self.registry)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Resolves `name` in the given transaction; `None` when absent or inactive.
fn resolve(tx: &mut dyn EffectTx, name: &str) -> Result<Option<Principal>, RuntimeError> {
    Ok(authz::resolve_in(tx, name)?)
}

impl Runtime {
    /// A runtime over `store` (a [`Store`] or a backend handle) with the tools in `registry`.
    pub fn new(store: impl Into<Store>, clock: SharedClock, registry: Registry) -> Self {
        Runtime {
            store: store.into(),
            clock,
            registry: Arc::new(registry),
            config: RuntimeConfig::default(),
            deadlines: Deadlines::default(),
            hook: None,
        }
    }

    /// Replaces the tunables.
    pub fn with_config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets the deadlines new operations get at acceptance.
    pub fn with_deadlines(mut self, deadlines: Deadlines) -> Self {
        self.deadlines = deadlines;
        self
    }

    /// The deadlines new operations get at acceptance.
    pub fn deadlines(&self) -> Deadlines {
        self.deadlines
    }

    /// Installs a hook awaited at each [`CrashPoint`].
    pub fn with_hook(mut self, hook: PointHook) -> Self {
        self.hook = Some(hook);
        self
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The clock.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    async fn point(&self, point: CrashPoint, failure: Option<CrashPoint>) -> bool {
        if let Some(h) = &self.hook {
            h(point).await;
        }
        failure == Some(point)
    }

    fn tool(&self, name: &str) -> Result<ToolEntry, Error> {
        self.registry
            .entry(name)
            .ok_or_else(|| Error::invalid("unknown tool"))
    }

    /// Shape checks and digest: tool, provider profile, key, arguments.
    fn prepare(
        &self,
        principal: &Principal,
        tool_name: &str,
        key: &str,
        arguments: &Value,
        provider: &ProviderContext,
        approval_id: Option<&str>,
    ) -> Result<Prepared, RuntimeError> {
        let (tool, _) = self.tool(tool_name)?;
        provider.check()?;
        if !self.registry.has_profile(&provider.profile()) {
            return Err(Error::invalid("unregistered provider profile").into());
        }
        check_id("idempotency key", key, 256)?;
        let contract = tool.contract();
        let arguments = tool.validate(arguments)?;
        let arguments_text = json::canonical_string(&arguments)
            .map_err(|e| Error::invalid(format!("arguments: {}", e.message)))?;
        let request_digest =
            digest::request_digest(&principal.tenant, &principal.subject, &contract, &arguments)
                .map_err(|e| Error::invalid(format!("arguments: {}", e.message)))?;
        if let Some(a) = approval_id {
            approval::check_approval_id(a)
                .map_err(|_| Error::new(ErrorCode::ApprovalInvalid, "approval is not valid"))?;
        }
        Ok(Prepared {
            scope: Scope {
                tenant: principal.tenant.clone(),
                subject: principal.subject.clone(),
                tool: contract.name.clone(),
                key: key.to_string(),
            },
            contract,
            arguments,
            arguments_text,
            request_digest,
            provider: provider.clone(),
            approval_id: approval_id.map(str::to_string),
        })
    }

    /// Compares every bound item of an authoritative row with a new request. Self-inconsistent
    /// rows are storage-contract errors; differences are `operation_conflict`.
    fn compare(record: &DeferredRecord, p: &Prepared) -> Result<(), RuntimeError> {
        if record.scope != p.scope {
            return Err(contract_violation(
                "row does not belong to the scope it was read by",
            ));
        }
        let recomputed = digest::request_digest(
            &record.scope.tenant,
            &record.scope.subject,
            &record.contract,
            &record.arguments,
        )
        .map_err(|_| contract_violation("stored arguments are outside the canonical domain"))?;
        if recomputed != record.request_digest {
            return Err(contract_violation(
                "stored request digest does not match the stored intent",
            ));
        }
        let conflict = |what: &str| -> RuntimeError {
            Error::conflict(format!(
                "the idempotency key was used for a different {what}"
            ))
            .into()
        };
        if record.request_digest != p.request_digest || record.arguments_text != p.arguments_text {
            return Err(conflict("request"));
        }
        if record.contract != p.contract {
            return Err(conflict("contract revision"));
        }
        if record.provider.profile() != p.provider.profile() {
            return Err(conflict("provider, API family or adapter revision"));
        }
        if let (Some(given), Some(stored)) = (&p.approval_id, &record.approval) {
            if *given != stored.approval_id {
                return Err(conflict("approval"));
            }
        }
        Ok(())
    }

    /// Answer for an existing, matching row after re-authorization (`not_found` otherwise).
    fn answer_existing(record: &DeferredRecord) -> Result<Answer, RuntimeError> {
        match record.state {
            OperationState::Succeeded | OperationState::Failed => Ok(Answer::Done {
                status_ref: record.status_ref.clone(),
                state: record.state,
                delivery: Delivery::LocalReplay,
                result: record
                    .result
                    .clone()
                    .ok_or_else(|| contract_violation("finished operation without result"))?,
            }),
            state => Ok(Answer::Unknown {
                status_ref: record.status_ref.clone(),
                state,
            }),
        }
    }

    /// Reads the scope in one snapshot: authenticate, shape, digest, scope lookup and compare,
    /// and for an existing row the current access check.
    async fn examine(
        &self,
        call: &DeferredCall,
    ) -> Result<(Prepared, Option<Answer>), RuntimeError> {
        let this = self.clone();
        let call = call.clone();
        self.store
            .read(move |tx: &mut dyn EffectTx| {
                snapshot(tx, |tx| {
                    let Some(principal) = resolve(tx, &call.principal)? else {
                        return Err(Error::denied("unknown or inactive principal").into());
                    };
                    let p = this.prepare(
                        &principal,
                        &call.tool,
                        &call.key,
                        &call.arguments,
                        &call.provider,
                        call.approval_id.as_deref(),
                    )?;
                    if [
                        &p.provider.turn_id,
                        &p.provider.call_id,
                        &p.provider.response_id,
                    ]
                    .iter()
                    .any(|id| id.starts_with(QUERY_IDENTITY_PREFIX))
                    {
                        return Err(Error::invalid(
                            "a status query identity cannot be used to dispatch",
                        )
                        .into());
                    }
                    // Current resource authorization before the ledger is consulted, so a
                    // stored result or a conflict never tells a caller more than `not_found`.
                    let (tool, _) = this.tool(&p.scope.tool)?;
                    tool.check_access(tx, &principal, &p.arguments)
                        .map_err(hide_refusal)?;
                    match load_scope(tx, &p.scope)? {
                        Loaded::Absent => Ok((p, None)),
                        Loaded::NotDeferred => Err(Error::conflict(
                            "the idempotency key was used for a different effect",
                        )
                        .into()),
                        Loaded::Deferred(record) => {
                            Self::compare(&record, &p)?;
                            check_deadlines(&record, this.clock.now())?;
                            let answer = Self::answer_existing(&record)?;
                            Ok((p, Some(answer)))
                        }
                    }
                })
            })
            .await
    }

    /// Transaction A: re-resolve the principal, re-run the tool's checks, reserve the scope,
    /// compare the authoritative row, and for a new intent consume the approval and write the
    /// intent context and the outbox event. All or nothing.
    pub async fn accept(&self, call: &DeferredCall) -> Result<Accepted, RuntimeError> {
        let (prepared, existing) = self.examine(call).await?;
        if let Some(answer) = existing {
            return self.existing_accepted(&prepared, answer).await;
        }
        self.write_intent(call.principal.clone(), prepared).await
    }

    async fn existing_accepted(
        &self,
        prepared: &Prepared,
        answer: Answer,
    ) -> Result<Accepted, RuntimeError> {
        let scope = prepared.scope.clone();
        let record = self
            .store
            .read(move |tx: &mut dyn EffectTx| match load_scope(tx, &scope)? {
                Loaded::Deferred(r) => Ok(*r),
                _ => Err(contract_violation("operation vanished")),
            })
            .await?;
        let state = match &answer {
            Answer::Done { state, .. } | Answer::Unknown { state, .. } => *state,
        };
        Ok(Accepted::Existing {
            operation_id: record.id,
            status_ref: answer.status_ref().to_string(),
            state,
        })
    }

    async fn write_intent(
        &self,
        principal_name: String,
        p: Prepared,
    ) -> Result<Accepted, RuntimeError> {
        let this = self.clone();
        let status_ref = new_status_ref()?;
        self.store
            .write(
                move |tx: &mut dyn EffectTx| -> Result<Accepted, RuntimeError> {
                    let now = this.clock.now();
                    check_now(now)?;
                    let (authority_deadline, retention_deadline) = this.deadlines.at(now)?;
                    // A lease taken right after acceptance must end inside the portable range.
                    outbox::lease_until(now, this.config.lease_seconds).map_err(|_| {
                        Error::invalid("a lease would end outside the portable time range")
                    })?;
                    // The same resolver, re-read inside the reservation transaction.
                    let Some(principal) = resolve(tx, &principal_name)? else {
                        return Err(Error::denied("unknown or inactive principal").into());
                    };
                    if principal.tenant != p.scope.tenant || principal.subject != p.scope.subject {
                        return Err(Error::denied("the principal changed during the call").into());
                    }
                    let (tool, _) = this.tool(&p.scope.tool)?;
                    tool.check(tx, &principal, &p.arguments)?;
                    let inserted = tx
                        .insert_id(
                            "INSERT INTO operations (tenant, subject, tool, idempotency_key,
                             request_digest, input_rev, output_rev, effect_rev, handler_rev,
                             producer_rev, policy_rev, arguments, effect_kind, state,
                             status_ref, authority_deadline, retention_deadline, created_at,
                             updated_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, 'deferred',
                             'accepted', ?13, ?15, ?16, ?14, ?14)
                         ON CONFLICT (tenant, subject, tool, idempotency_key) DO NOTHING",
                            &[
                                p.scope.tenant.as_str().into(),
                                p.scope.subject.as_str().into(),
                                p.scope.tool.as_str().into(),
                                p.scope.key.as_str().into(),
                                p.request_digest.as_str().into(),
                                p.contract.input_rev.as_str().into(),
                                p.contract.output_rev.as_str().into(),
                                p.contract.effect_rev.as_str().into(),
                                p.contract.handler_rev.as_str().into(),
                                p.contract.producer_rev.as_str().into(),
                                p.contract.policy_rev.as_str().into(),
                                p.arguments_text.as_str().into(),
                                status_ref.as_str().into(),
                                now.into(),
                                authority_deadline.into(),
                                retention_deadline.into(),
                            ],
                        )
                        .map_err(|e| stored(tx, e))?;
                    let operation_id = if let Some(operation_id) = inserted {
                        let approval = if tool.requires_approval() {
                            let target = approval_target(
                                &p.scope,
                                &p.contract,
                                &p.request_digest,
                                &p.provider,
                            );
                            Some(approval::consume(
                                tx,
                                p.approval_id.as_deref(),
                                &target,
                                now,
                                Some(operation_id),
                                &mut |tx, name| authz::resolve_in(tx, name),
                            )?)
                        } else {
                            None
                        };
                        tx.execute(
                            "INSERT INTO deferred_intents (operation_id, provider, api_family,
                             adapter_revision, turn_id, call_id, response_id, downstream_key,
                             approval_id, approver, approval_digest, approved_at,
                             approval_expires_at, created_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
                            &[
                                operation_id.into(),
                                p.provider.provider.as_str().into(),
                                p.provider.api_family.as_str().into(),
                                p.provider.adapter_revision.as_str().into(),
                                p.provider.turn_id.as_str().into(),
                                p.provider.call_id.as_str().into(),
                                p.provider.response_id.as_str().into(),
                                scope_digest(&p.scope).into(),
                                approval.as_ref().map(|a| a.approval_id.clone()).into(),
                                approval.as_ref().map(|a| a.approver.clone()).into(),
                                approval.as_ref().map(|a| a.binding_digest.clone()).into(),
                                approval.as_ref().map(|a| a.approved_at).into(),
                                approval.as_ref().map(|a| a.expires_at).into(),
                                now.into(),
                            ],
                        )
                        .map_err(|e| stored(tx, e))?;
                        Some(operation_id)
                    } else {
                        None
                    };
                    // Read the authoritative row back and compare every bound item, whoever wrote it.
                    let record = match load_scope(tx, &p.scope)? {
                        Loaded::Deferred(r) => *r,
                        Loaded::NotDeferred => {
                            return Err(Error::conflict(
                                "the idempotency key was used for a different effect",
                            )
                            .into())
                        }
                        Loaded::Absent => {
                            return Err(contract_violation("reserved row is missing"))
                        }
                    };
                    Self::compare(&record, &p)?;
                    match operation_id {
                        Some(id) => {
                            let event_id = outbox::enqueue(tx, id, now, this.config.max_attempts)?;
                            insert_event(
                                tx,
                                id,
                                now,
                                "intent_accepted",
                                &json!({"event_id": event_id}),
                            )?;
                            Ok(Accepted::New {
                                operation_id: id,
                                event_id,
                                status_ref: record.status_ref,
                            })
                        }
                        None => Ok(Accepted::Existing {
                            operation_id: record.id,
                            status_ref: record.status_ref,
                            state: record.state,
                        }),
                    }
                },
            )
            .await
    }

    /// `dispatch`: a new intent is accepted (transaction A) and processed at once by
    /// this caller acting as a worker; an existing finished one is replayed (`local_replay`,
    /// after current re-authorization); an existing unfinished one answers `outcome_unknown`
    /// with its status ref and nothing else happens. `failure` stops the fresh path at a crash
    /// point as if the process died there.
    pub async fn dispatch(
        &self,
        call: &DeferredCall,
        failure: Option<CrashPoint>,
    ) -> Result<Answer, RuntimeError> {
        let (prepared, existing) = self.examine(call).await?;
        if let Some(answer) = existing {
            return Ok(answer);
        }
        match self.write_intent(call.principal.clone(), prepared).await? {
            Accepted::Existing { .. } => {
                // Someone else accepted the same intent first: observe only.
                let (_, existing) = self.examine(call).await?;
                existing.ok_or_else(|| contract_violation("accepted operation vanished"))
            }
            Accepted::New {
                event_id,
                status_ref,
                ..
            } => {
                if self.point(CrashPoint::AfterIntentCommit, failure).await {
                    return Ok(Answer::Unknown {
                        status_ref,
                        state: OperationState::Accepted,
                    });
                }
                let owner = format!("dispatch-{}", std::process::id());
                match self.process(event_id, &owner, failure).await? {
                    Processed::Delivered(a) | Processed::Unknown(a) => Ok(a),
                    Processed::NotClaimed(_) => Ok(Answer::Unknown {
                        status_ref,
                        state: OperationState::Accepted,
                    }),
                }
            }
        }
    }

    /// Claims `event_id` for `owner` now.
    pub async fn claim(&self, event_id: i64, owner: &str) -> Result<ClaimOutcome, RuntimeError> {
        let this = self.clone();
        let owner = owner.to_string();
        self.store
            .write(
                move |tx: &mut dyn EffectTx| -> Result<ClaimOutcome, RuntimeError> {
                    let now = this.clock.now();
                    check_now(now)?;
                    let out = outbox::claim(tx, event_id, &owner, now, this.config.lease_seconds)?;
                    match &out {
                        ClaimOutcome::Claimed(lease) => insert_event(
                            tx,
                            lease.operation_id,
                            now,
                            "claimed",
                            &json!({"attempt": lease.attempt, "fencing_token": lease.token,
                                "lease_owner": lease.owner, "lease_until": lease.until}),
                        )?,
                        ClaimOutcome::Exhausted => {
                            if let Some(ev) = outbox::load(tx, event_id)? {
                                insert_event(
                                    tx,
                                    ev.operation_id,
                                    now,
                                    "dead",
                                    &json!({
                                "attempts": ev.attempt_count}),
                                )?;
                            }
                        }
                        _ => {}
                    }
                    Ok(out)
                },
            )
            .await
    }

    /// Extends a held lease (heartbeat). [`RuntimeError::Fenced`] if it was taken over.
    pub async fn renew(&self, lease: &Lease) -> Result<Lease, RuntimeError> {
        let this = self.clone();
        let lease = lease.clone();
        self.store
            .write(
                move |tx: &mut dyn EffectTx| -> Result<Lease, RuntimeError> {
                    let now = this.clock.now();
                    check_now(now)?;
                    outbox::renew(tx, &lease, now, this.config.lease_seconds)?
                        .map_err(RuntimeError::Fenced)
                },
            )
            .await
    }

    /// Records a failed attempt (conditional on the token); the lease stays until it expires.
    async fn record_attempt(
        &self,
        lease: &Lease,
        code: &str,
        state: Option<OperationState>,
    ) -> Result<(), RuntimeError> {
        let this = self.clone();
        let lease = lease.clone();
        let code = code.to_string();
        self.store
            .write(move |tx: &mut dyn EffectTx| -> Result<(), RuntimeError> {
                let now = this.clock.now();
                outbox::record_attempt_error(tx, &lease, &code, now)?
                    .map_err(RuntimeError::Fenced)?;
                if let Some(state) = state {
                    tx.execute(
                        "UPDATE operations SET state = ?1, updated_at = ?2
                         WHERE id = ?3 AND state IN ('accepted', 'processing', 'outcome_unknown')",
                        &[state.as_str().into(), now.into(), lease.operation_id.into()],
                    )
                    .map_err(|e| stored(tx, e))?;
                }
                insert_event(
                    tx,
                    lease.operation_id,
                    now,
                    "attempt_refused",
                    &json!({"code": code, "attempt": lease.attempt, "fencing_token": lease.token}),
                )
            })
            .await
    }

    /// The worker's checks before any downstream effect, in one read snapshot.
    async fn preflight(&self, lease: &Lease) -> Result<DeferredRecord, RuntimeError> {
        let this = self.clone();
        let operation_id = lease.operation_id;
        self.store
            .read(move |tx: &mut dyn EffectTx| {
                snapshot(tx, |tx| {
                    let record = load_id(tx, operation_id)?;
                    if record
                        .authority_deadline
                        .is_some_and(|d| this.clock.now() >= d)
                    {
                        return Err(Error::new(
                            ErrorCode::OperationAuthorityExpired,
                            "the operation's authority deadline has passed",
                        )
                        .into());
                    }
                    let Some(tool) = this.registry.tool(&record.scope.tool).cloned() else {
                        return Err(Error::new(
                            ErrorCode::ContractDrift,
                            "tool is no longer registered",
                        )
                        .into());
                    };
                    let current = tool.contract();
                    if current != record.contract {
                        return Err(Error::new(
                            ErrorCode::ContractDrift,
                            "the tool contract changed since the intent was accepted",
                        )
                        .into());
                    }
                    let validated = tool.validate(&record.arguments).map_err(|_| {
                        Error::new(
                            ErrorCode::ContractDrift,
                            "stored arguments fail the input schema",
                        )
                    })?;
                    let recomputed = digest::request_digest(
                        &record.scope.tenant,
                        &record.scope.subject,
                        &current,
                        &validated,
                    )
                    .map_err(|_| contract_violation("stored arguments are not canonical"))?;
                    if recomputed != record.request_digest || validated != record.arguments {
                        return Err(Error::new(
                            ErrorCode::ContractDrift,
                            "the request digest does not match the accepted intent",
                        )
                        .into());
                    }
                    let Some(principal) = resolve(tx, &record.scope.subject)? else {
                        return Err(Error::denied("the principal is no longer active").into());
                    };
                    if principal.tenant != record.scope.tenant {
                        return Err(Error::denied("the principal moved to another tenant").into());
                    }
                    tool.check(tx, &principal, &record.arguments)?;
                    Self::verify_durable_approval(tx, &record, tool.requires_approval())?;
                    Ok(record)
                })
            })
            .await
    }

    /// Recomputes the approval digest from the durable identities and compares it with the
    /// intent row and the approval row.
    fn verify_durable_approval(
        tx: &mut dyn EffectTx,
        record: &DeferredRecord,
        required: bool,
    ) -> Result<(), RuntimeError> {
        let invalid = || -> RuntimeError {
            Error::new(
                ErrorCode::ApprovalInvalid,
                "the stored approval no longer matches the accepted intent",
            )
            .into()
        };
        let Some(stored) = &record.approval else {
            if required {
                return Err(
                    Error::new(ErrorCode::ApprovalRequired, "the intent has no approval").into(),
                );
            }
            return Ok(());
        };
        let target = approval_target(
            &record.scope,
            &record.contract,
            &record.request_digest,
            &record.provider,
        );
        let digest = target.digest()?;
        if digest != stored.approval_digest || stored.approved_at >= stored.expires_at {
            return Err(invalid());
        }
        let row = approval::load(tx, &stored.approval_id)
            .map_err(|_| invalid())?
            .ok_or_else(invalid)?;
        if row.binding_digest != digest
            || row.target.digest()? != digest
            || row.approver != stored.approver
            || row.approved_at != stored.approved_at
            || row.expires_at != stored.expires_at
            || row.consumed_operation != Some(record.id)
        {
            return Err(invalid());
        }
        Ok(())
    }

    /// Checks a downstream receipt against the record (generic bindings) and the tool's
    /// output contract. Returns the tool result and the receipt id.
    fn check_receipt(
        tool: &dyn DeferredTool,
        record: &DeferredRecord,
        receipt: &Value,
    ) -> Result<(Value, String), RuntimeError> {
        let bad = |what: &str| -> RuntimeError {
            Error::new(
                ErrorCode::OutcomeUnknown,
                format!("the downstream receipt does not bind this operation: {what}"),
            )
            .into()
        };
        let request = downstream_request(record);
        let request_text = json::canonical_string(&request)
            .map_err(|_| contract_violation("request not canonical"))?;
        let field = |k: &str| receipt.get(k).and_then(Value::as_str);
        let receipt_id = field("receipt_id")
            .ok_or_else(|| bad("receipt id"))?
            .to_string();
        check_id("receipt id", &receipt_id, 128).map_err(|_| bad("receipt id"))?;
        if field("status_ref") != Some(record.status_ref.as_str()) {
            return Err(bad("status ref"));
        }
        if field("scope_digest") != Some(record.downstream_key.as_str()) {
            return Err(bad("scope"));
        }
        if field("request_sha256") != Some(digest::sha256_hex(request_text.as_bytes()).as_str()) {
            return Err(bad("request digest"));
        }
        if receipt.get("request") != Some(&request) {
            return Err(bad("request"));
        }
        let result = tool
            .accept_receipt(&record.arguments, receipt)
            .map_err(|e| bad(&e.message))?;
        json::canonical_string(&result).map_err(|_| bad("result is not canonical"))?;
        Ok((result, receipt_id))
    }

    fn binding_digest(
        record: &DeferredRecord,
        provider: &ProviderContext,
        result_digest: &str,
        receipt_id: &str,
    ) -> Result<String, RuntimeError> {
        let request = downstream_request(record);
        let request_text = json::canonical_string(&request)
            .map_err(|_| contract_violation("request not canonical"))?;
        digest::call_binding_digest(&CallBinding {
            provider: provider.provider.clone(),
            api_family: provider.api_family.clone(),
            adapter_rev: provider.adapter_revision.clone(),
            turn_id: Some(provider.turn_id.clone()),
            call_id: provider.call_id.clone(),
            response_id: Some(provider.response_id.clone()),
            operation_id: record.id.to_string(),
            idempotency_key: record.scope.key.clone(),
            contract: record.contract.clone(),
            request_digest: record.request_digest.clone(),
            result_digest: Some(result_digest.to_string()),
            downstream_request_ref: Some(digest::sha256_hex(request_text.as_bytes())),
            downstream_receipt_ref: Some(receipt_id.to_string()),
            downstream_status_ref: Some(record.status_ref.clone()),
        })
        .map_err(|_| contract_violation("call binding is not canonical"))
    }

    /// Writes the local receipt and the `succeeded` result (part of transaction C).
    #[allow(clippy::too_many_arguments)]
    fn write_success(
        tx: &mut dyn EffectTx,
        record: &DeferredRecord,
        provider: &ProviderContext,
        receipt: &Value,
        receipt_id: &str,
        result: &Value,
        via: (&str, Option<i64>, Option<&str>),
        now: i64,
    ) -> Result<(), RuntimeError> {
        let result_text = json::canonical_string(result)
            .map_err(|_| contract_violation("result not canonical"))?;
        let result_digest = digest::sha256_hex(result_text.as_bytes());
        let receipt_text = json::canonical_string(receipt)
            .map_err(|_| contract_violation("receipt not canonical"))?;
        let binding = Self::binding_digest(record, provider, &result_digest, receipt_id)?;
        tx.execute(
            "INSERT INTO local_receipts (operation_id, receipt_id, receipt, receipt_digest,
                 call_binding_digest, reconciled_via, fencing_token, query_identity, reconciled_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            &[
                record.id.into(),
                receipt_id.into(),
                receipt_text.as_str().into(),
                digest::sha256_hex(receipt_text.as_bytes()).into(),
                binding.into(),
                via.0.into(),
                via.1.into(),
                via.2.into(),
                now.into(),
            ],
        )
        .map_err(|e| stored(tx, e))?;
        Self::settle_row(
            tx,
            record.id,
            OperationState::Succeeded,
            result_text,
            result_digest,
            now,
        )?;
        insert_event(
            tx,
            record.id,
            now,
            "receipt_reconciled",
            &json!({"receipt_id": receipt_id, "via": via.0}),
        )
    }

    /// Transaction C for a worker holding `lease`: local receipt + operation `succeeded` +
    /// event `delivered`, conditional on the fencing token. A stale lease gets
    /// [`RuntimeError::Fenced`] and nothing changes.
    pub async fn complete(&self, lease: &Lease, receipt: Value) -> Result<Answer, RuntimeError> {
        let this = self.clone();
        let lease = lease.clone();
        self.store
            .write(
                move |tx: &mut dyn EffectTx| -> Result<Answer, RuntimeError> {
                    let now = this.clock.now();
                    // Transaction C of a worker and of a status query serialize on the
                    // operation (a no-op where writes are already serialized).
                    tx.lock_key(&operation_lock(lease.operation_id))
                        .map_err(|e| stored(tx, e))?;
                    outbox::complete(tx, &lease, now)?.map_err(RuntimeError::Fenced)?;
                    let record = load_id(tx, lease.operation_id)?;
                    let (tool, _) = this.tool(&record.scope.tool)?;
                    let (result, receipt_id) =
                        Self::check_receipt(tool.as_ref(), &record, &receipt)?;
                    Self::write_success(
                        tx,
                        &record,
                        &record.provider,
                        &receipt,
                        &receipt_id,
                        &result,
                        ("worker", Some(lease.token), None),
                        now,
                    )?;
                    Ok(Answer::Done {
                        status_ref: record.status_ref,
                        state: OperationState::Succeeded,
                        delivery: Delivery::Fresh,
                        result,
                    })
                },
            )
            .await
    }

    /// Writes the `failed` result of a definitive refusal (part of the closing transaction).
    fn write_failure(
        tx: &mut dyn EffectTx,
        record: &DeferredRecord,
        result: &Value,
        detail: &Value,
        now: i64,
    ) -> Result<(), RuntimeError> {
        let result_text = json::canonical_string(result)
            .map_err(|_| contract_violation("result not canonical"))?;
        let result_digest = digest::sha256_hex(result_text.as_bytes());
        Self::settle_row(
            tx,
            record.id,
            OperationState::Failed,
            result_text,
            result_digest,
            now,
        )?;
        insert_event(tx, record.id, now, "failed", detail)
    }

    /// Moves an unfinished deferred operation to its terminal `state` with its canonical
    /// result; a row that already left the unfinished states is a storage-contract violation.
    fn settle_row(
        tx: &mut dyn EffectTx,
        operation_id: i64,
        state: OperationState,
        result_text: String,
        result_digest: String,
        now: i64,
    ) -> Result<(), RuntimeError> {
        let n = tx
            .execute(
                "UPDATE operations SET state = ?1, result = ?2, result_digest = ?3,
                     updated_at = ?4
                 WHERE id = ?5 AND state IN ('accepted', 'processing', 'outcome_unknown', 'dead')",
                &[
                    state.as_str().into(),
                    result_text.into(),
                    result_digest.into(),
                    now.into(),
                    operation_id.into(),
                ],
            )
            .map_err(|e| stored(tx, e))?;
        if n != 1 {
            return Err(contract_violation("operation left the unfinished states"));
        }
        Ok(())
    }

    /// The closing transaction of a definitive downstream refusal, for a worker holding
    /// `lease`: event `delivered` (closed) + operation `failed` with `result` (`{code,
    /// message}`), conditional on the fencing token. A stale lease gets
    /// [`RuntimeError::Fenced`] and nothing changes.
    pub async fn fail(&self, lease: &Lease, result: Value) -> Result<Answer, RuntimeError> {
        let this = self.clone();
        let lease = lease.clone();
        self.store
            .write(
                move |tx: &mut dyn EffectTx| -> Result<Answer, RuntimeError> {
                    let now = this.clock.now();
                    tx.lock_key(&operation_lock(lease.operation_id))
                        .map_err(|e| stored(tx, e))?;
                    outbox::complete(tx, &lease, now)?.map_err(RuntimeError::Fenced)?;
                    let record = load_id(tx, lease.operation_id)?;
                    Self::write_failure(
                        tx,
                        &record,
                        &result,
                        &json!({"code": result["code"], "fencing_token": lease.token,
                            "via": "worker"}),
                        now,
                    )?;
                    Ok(Answer::Done {
                        status_ref: record.status_ref,
                        state: OperationState::Failed,
                        delivery: Delivery::Fresh,
                        result: result.clone(),
                    })
                },
            )
            .await
    }

    /// An operator settles an `outcome_unknown` or `dead` operation.
    ///
    /// The operator must currently hold [`OPERATOR_ROLE`] in the operation's tenant
    /// (`permission_denied` otherwise; a reference outside the tenant is `not_found`). Only
    /// `outcome_unknown` and `dead` operations without a live lease can be resolved
    /// (`operation_in_progress` for `accepted`/`processing` or a live lease, `invalid_arguments`
    /// for a finished one). The downstream is asked first: with a receipt, `failed` is refused
    /// (`operation_conflict`: the evidence says it happened) and `succeeded` reconciles it like a
    /// status query (transaction C, delivery `receipt_reconciled`); without one, `succeeded` is
    /// refused (`outcome_unknown`: no result to record) and `failed` stores
    /// `{code: "resolved_failed", message}`. Every resolution appends a `resolved` operation
    /// event with the operator and the reason; the event closes as `delivered` with a new
    /// fencing token, so a worker still holding an old lease changes nothing.
    pub async fn resolve(&self, resolution: &Resolution) -> Result<Answer, RuntimeError> {
        let r = resolution.clone();
        let n = r.reason.chars().count();
        if n == 0 || n > 512 || r.reason.chars().any(|c| c.is_control() && c != '\n') {
            return Err(Error::invalid("reason must be 1 to 512 characters").into());
        }
        check_id("operator", &r.operator, 128)?;
        check_id("status_ref", &r.status_ref, 128).map_err(|_| Error::not_found())?;
        let this = self.clone();
        let q = r.clone();
        let (record, token) = self
            .store
            .read(
                move |tx: &mut dyn EffectTx| -> Result<(DeferredRecord, i64), RuntimeError> {
                    let now = this.clock.now();
                    let Some(operator) = resolve(tx, &q.operator)? else {
                        return Err(Error::denied("unknown or inactive operator").into());
                    };
                    if !operator.has_role(OPERATOR_ROLE) {
                        return Err(
                            Error::denied("the principal does not hold the role operator").into(),
                        );
                    }
                    let record = match load_status_ref(tx, &q.status_ref)? {
                        Loaded::Deferred(rec) if rec.scope.tenant == operator.tenant => *rec,
                        _ => return Err(Error::not_found().into()),
                    };
                    Self::resolvable(&record)?;
                    let ev = outbox::for_operation(tx, record.id)?.ok_or_else(|| {
                        contract_violation("deferred operation without outbox event")
                    })?;
                    if ev.lease_until.is_some_and(|until| now < until) {
                        return Err(Error::new(
                        ErrorCode::OperationInProgress,
                        "a worker holds a live lease on the operation; resolve after it expires",
                    )
                    .into());
                    }
                    Ok((record, ev.fencing_token))
                },
            )
            .await?;
        let (tool, downstream) = self.tool(&record.scope.tool)?;
        let receipt = downstream
            .status(&record.status_ref)
            .await
            .map_err(|_| Error::unavailable("the downstream status query failed"))?;
        let checked = match (&receipt, r.outcome) {
            (Some(_), ResolveAs::Failed) => {
                return Err(Error::conflict(
                    "the downstream holds a receipt for this operation: it happened;                      resolve it as succeeded",
                )
                .into())
            }
            (None, ResolveAs::Succeeded) => {
                return Err(Error::new(
                    ErrorCode::OutcomeUnknown,
                    "the downstream holds no receipt: success cannot be recorded without one",
                )
                .into())
            }
            (Some(receipt), ResolveAs::Succeeded) => {
                Some(Self::check_receipt(tool.as_ref(), &record, receipt)?)
            }
            (None, ResolveAs::Failed) => None,
        };
        let identity = query_identity(&record.provider, &record.status_ref);
        let this = self.clone();
        self.store
            .write(
                move |tx: &mut dyn EffectTx| -> Result<Answer, RuntimeError> {
                    let now = this.clock.now();
                    tx.lock_key(&operation_lock(record.id))
                        .map_err(|e| stored(tx, e))?;
                    let current = load_id(tx, record.id)?;
                    Self::resolvable(&current)?;
                    let ev = outbox::for_operation(tx, current.id)?.ok_or_else(|| {
                        contract_violation("deferred operation without outbox event")
                    })?;
                    if ev.fencing_token != token {
                        return Err(Error::new(
                            ErrorCode::OperationInProgress,
                            "a worker claimed the operation meanwhile; nothing was changed",
                        )
                        .into());
                    }
                    outbox::complete_by_reconciliation(tx, ev.id, token, now)?
                        .map_err(RuntimeError::Fenced)?;
                    let mut detail = json!({
                        "as": r.outcome.as_str(),
                        "operator": r.operator,
                        "reason": r.reason,
                        "previous_state": current.state.as_str(),
                    });
                    let answer = match &checked {
                        Some((result, receipt_id)) => {
                            let provider = ProviderContext {
                                call_id: identity.clone(),
                                response_id: identity.clone(),
                                ..current.provider.clone()
                            };
                            Self::write_success(
                                tx,
                                &current,
                                &provider,
                                receipt.as_ref().unwrap_or(&Value::Null),
                                receipt_id,
                                result,
                                ("status_query", None, Some(&identity)),
                                now,
                            )?;
                            detail["evidence"] = json!("receipt");
                            detail["receipt_id"] = json!(receipt_id);
                            Answer::Done {
                                status_ref: current.status_ref.clone(),
                                state: OperationState::Succeeded,
                                delivery: Delivery::ReceiptReconciled,
                                result: result.clone(),
                            }
                        }
                        None => {
                            let result = failure_result(
                                RESOLVED_FAILED_CODE,
                                "an operator resolved the unknown outcome as failed",
                            );
                            Self::write_failure(
                                tx,
                                &current,
                                &result,
                                &json!({"code": RESOLVED_FAILED_CODE, "via": "operator"}),
                                now,
                            )?;
                            detail["evidence"] = json!("no_receipt");
                            Answer::Done {
                                status_ref: current.status_ref.clone(),
                                state: OperationState::Failed,
                                delivery: Delivery::Fresh,
                                result,
                            }
                        }
                    };
                    insert_event(tx, current.id, now, "resolved", &detail)?;
                    Ok(answer)
                },
            )
            .await
    }

    /// Only `outcome_unknown` and `dead` operations can be resolved.
    fn resolvable(record: &DeferredRecord) -> Result<(), RuntimeError> {
        match record.state {
            OperationState::OutcomeUnknown | OperationState::Dead => Ok(()),
            OperationState::Accepted | OperationState::Processing => Err(Error::new(
                ErrorCode::OperationInProgress,
                format!(
                    "the operation is {}: only outcome_unknown or dead operations can be resolved",
                    record.state.as_str()
                ),
            )
            .into()),
            state => Err(Error::invalid(format!(
                "the operation is {}: only outcome_unknown or dead operations can be resolved",
                state.as_str()
            ))
            .into()),
        }
    }

    /// Runs one claimed lease: preflight, heartbeat, downstream submit, transaction C.
    pub async fn execute(
        &self,
        lease: &Lease,
        failure: Option<CrashPoint>,
    ) -> Result<Processed, RuntimeError> {
        let record = match self.preflight(lease).await {
            Ok(r) => r,
            Err(RuntimeError::Refused(e)) => {
                self.record_attempt(lease, e.code.as_str(), None).await?;
                return Err(RuntimeError::Refused(e));
            }
            Err(RuntimeError::Store(StoreError::Contract(m))) => {
                self.record_attempt(lease, "storage_contract", None).await?;
                return Err(RuntimeError::Store(StoreError::Contract(m)));
            }
            Err(e) => return Err(e),
        };
        let unknown = |state| {
            Processed::Unknown(Answer::Unknown {
                status_ref: record.status_ref.clone(),
                state,
            })
        };
        // Heartbeat: a full lease for the downstream call, and proof nobody took over.
        let mut lease = self.renew(lease).await?;
        let (tool, downstream) = self.tool(&record.scope.tool)?;
        let request = downstream_request(&record);
        let submitted = {
            let submit = downstream.submit(&record.scope, &request);
            tokio::pin!(submit);
            // While the downstream call runs, renew the lease every third of its length. Once
            // fenced (someone reclaimed), stop renewing; transaction C will be refused.
            let period =
                std::time::Duration::from_secs((self.config.lease_seconds / 3).max(1) as u64);
            let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            let mut fenced = false;
            loop {
                tokio::select! {
                    r = &mut submit => break r,
                    _ = beat.tick(), if !fenced => match self.renew(&lease).await {
                        Ok(renewed) => lease = renewed,
                        Err(RuntimeError::Fenced(_)) => fenced = true,
                        // A busy store is retried at the next beat.
                        Err(_) => {}
                    },
                }
            }
        };
        let receipt = match submitted {
            Ok(r) => r,
            Err(DownstreamError::Refused { code, message }) if valid_refusal(&code, &message) => {
                let answer = self.fail(&lease, failure_result(&code, &message)).await?;
                return Ok(Processed::Delivered(answer));
            }
            Err(e) => {
                let code = match e {
                    DownstreamError::Conflict => "downstream_conflict",
                    DownstreamError::Unavailable(_) => "downstream_unavailable",
                    DownstreamError::Rejected(_) => "downstream_rejected",
                    DownstreamError::Refused { .. } => "downstream_refusal_invalid",
                };
                self.record_attempt(&lease, code, Some(OperationState::OutcomeUnknown))
                    .await?;
                return Ok(unknown(OperationState::OutcomeUnknown));
            }
        };
        if self.point(CrashPoint::AfterDownstreamCommit, failure).await {
            return Ok(unknown(OperationState::Processing));
        }
        if let Err(e) = Self::check_receipt(tool.as_ref(), &record, &receipt) {
            self.record_attempt(
                &lease,
                "receipt_invalid",
                Some(OperationState::OutcomeUnknown),
            )
            .await?;
            return Err(e);
        }
        Ok(Processed::Delivered(self.complete(&lease, receipt).await?))
    }

    /// Claims and runs one event as worker `owner`.
    pub async fn process(
        &self,
        event_id: i64,
        owner: &str,
        failure: Option<CrashPoint>,
    ) -> Result<Processed, RuntimeError> {
        let lease = match self.claim(event_id, owner).await? {
            ClaimOutcome::Claimed(lease) => lease,
            other => return Ok(Processed::NotClaimed(other)),
        };
        if self.point(CrashPoint::AfterClaim, failure).await {
            let status_ref = self.status_ref_of(lease.operation_id).await?;
            return Ok(Processed::Unknown(Answer::Unknown {
                status_ref,
                state: OperationState::Processing,
            }));
        }
        self.execute(&lease, failure).await
    }

    async fn status_ref_of(&self, operation_id: i64) -> Result<String, RuntimeError> {
        self.store
            .read(move |tx: &mut dyn EffectTx| Ok(load_id(tx, operation_id)?.status_ref))
            .await
    }

    /// Events ready at the current time: pending ones and those with an expired lease.
    pub async fn ready(&self, limit: i64) -> Result<Vec<i64>, RuntimeError> {
        let now = self.clock.now();
        self.store
            .read(move |tx: &mut dyn EffectTx| Ok(outbox::ready(tx, now, limit)?))
            .await
    }

    /// One worker pass: enumerate ready events and process each.
    pub async fn run_pass(&self, owner: &str, limit: i64) -> Result<PassSummary, RuntimeError> {
        let ids = self.ready(limit).await?;
        let mut summary = PassSummary {
            ready: ids.len(),
            ..PassSummary::default()
        };
        for id in ids {
            match self.process(id, owner, None).await {
                Ok(Processed::Delivered(Answer::Done {
                    state: OperationState::Failed,
                    ..
                })) => summary.failed += 1,
                Ok(Processed::Delivered(_)) => summary.delivered += 1,
                Ok(Processed::Unknown(_)) => summary.unknown += 1,
                Ok(Processed::NotClaimed(ClaimOutcome::Exhausted)) => summary.dead += 1,
                Ok(Processed::NotClaimed(_)) => summary.skipped += 1,
                Err(RuntimeError::Fenced(_)) => summary.skipped += 1,
                Err(e) => {
                    let code = match &e {
                        RuntimeError::Refused(err) => err.code.as_str().to_string(),
                        RuntimeError::Store(s) => s.cli_code().to_ascii_lowercase(),
                        RuntimeError::Fenced(_) => "fenced".into(),
                    };
                    *summary.refused.entry(code).or_default() += 1;
                }
            }
        }
        Ok(summary)
    }

    /// An explicit status query in the secure order: current principal → registry and
    /// input schema → current resource authorization → purpose-bound query identity →
    /// status ref within the caller's scope → recomputed request digest → key, revisions and
    /// provider path → (if unfinished) downstream receipt + output contract → transaction C
    /// (`receipt_reconciled`). Every refusal before the scope match is the same `not_found`.
    pub async fn status(&self, query: &StatusQuery) -> Result<Answer, RuntimeError> {
        let this = self.clone();
        let q = query.clone();
        let record = self
            .store
            .read(move |tx: &mut dyn EffectTx| {
                snapshot(tx, |tx| {
                    let Some(principal) = resolve(tx, &q.principal)? else {
                        return Err(Error::not_found().into());
                    };
                    let (tool, _) = this.tool(&q.tool)?;
                    let p =
                        this.prepare(&principal, &q.tool, &q.key, &q.arguments, &q.provider, None)?;
                    tool.check_access(tx, &principal, &p.arguments)
                        .map_err(hide_refusal)?;
                    check_id("status_ref", &q.status_ref, 128).map_err(|_| Error::not_found())?;
                    let record = match load_status_ref(tx, &q.status_ref)? {
                        Loaded::Deferred(r) => *r,
                        _ => return Err(Error::not_found().into()),
                    };
                    if record.scope.tenant != principal.tenant
                        || record.scope.subject != principal.subject
                        || record.scope.tool != q.tool
                    {
                        return Err(Error::not_found().into());
                    }
                    if record.scope.key != p.scope.key {
                        return Err(Error::conflict(
                            "the status reference belongs to another idempotency key",
                        )
                        .into());
                    }
                    Self::compare(&record, &p)?;
                    Ok(record)
                })
            })
            .await?;
        if matches!(
            record.state,
            OperationState::Succeeded | OperationState::Failed
        ) {
            return Self::answer_existing(&record);
        }
        let (tool, downstream) = self.tool(&record.scope.tool)?;
        let receipt = match downstream.status(&record.status_ref).await {
            Ok(Some(r)) => r,
            Ok(None) => {
                return Ok(Answer::Unknown {
                    status_ref: record.status_ref,
                    state: record.state,
                })
            }
            Err(_) => return Err(Error::unavailable("the downstream status query failed").into()),
        };
        let (result, receipt_id) = Self::check_receipt(tool.as_ref(), &record, &receipt)?;
        let identity = query_identity(&query.provider, &record.status_ref);
        let this = self.clone();
        self.store
            .write(
                move |tx: &mut dyn EffectTx| -> Result<Answer, RuntimeError> {
                    let now = this.clock.now();
                    tx.lock_key(&operation_lock(record.id))
                        .map_err(|e| stored(tx, e))?;
                    let current = load_id(tx, record.id)?;
                    if current.state == OperationState::Succeeded {
                        // Reconciled meanwhile (worker or another query): replay.
                        return Self::answer_existing(&current);
                    }
                    let ev = outbox::for_operation(tx, record.id)?.ok_or_else(|| {
                        contract_violation("deferred operation without outbox event")
                    })?;
                    outbox::complete_by_reconciliation(tx, ev.id, ev.fencing_token, now)?
                        .map_err(RuntimeError::Fenced)?;
                    let provider = ProviderContext {
                        call_id: identity.clone(),
                        response_id: identity.clone(),
                        ..current.provider.clone()
                    };
                    Self::write_success(
                        tx,
                        &current,
                        &provider,
                        &receipt,
                        &receipt_id,
                        &result,
                        ("status_query", None, Some(&identity)),
                        now,
                    )?;
                    Ok(Answer::Done {
                        status_ref: current.status_ref,
                        state: OperationState::Succeeded,
                        delivery: Delivery::ReceiptReconciled,
                        result: result.clone(),
                    })
                },
            )
            .await
    }

    /// Reads the deferred operation with this status ref (operators; no authorization).
    pub async fn inspect(&self, status_ref: &str) -> Result<Option<DeferredRecord>, RuntimeError> {
        let status_ref = status_ref.to_string();
        self.store
            .read(
                move |tx: &mut dyn EffectTx| match load_status_ref(tx, &status_ref)? {
                    Loaded::Deferred(r) => Ok(Some(*r)),
                    _ => Ok(None),
                },
            )
            .await
    }
}
