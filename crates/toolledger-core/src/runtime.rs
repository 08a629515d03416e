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
//!
//! # Status references
//!
//! A deferred operation's status reference comes from the ledger's one generator, like an
//! inline one: `op_` and 32 hex digits whose first 48 bits are the creation time in
//! milliseconds and the other 80 random. (References written before were fully random; both
//! shapes are opaque to callers and are looked up the same way.)
//!
//! # Modules
//!
//! This module holds the vocabulary (calls, answers, tools, the registry, tunables) and the
//! [`Runtime`] handle; its jobs are one submodule each, all over the ledger's one row codec,
//! status-reference generator, deadline check and event writer:
//!
//! - `record`: the deferred view of a ledger row ([`DeferredRecord`]), its loaders, and the
//!   bindings derived from it ([`approval_target`], [`downstream_request`], [`query_identity`]);
//! - `accept`: transaction A and [`Runtime::dispatch`];
//! - `worker`: claims, leases and heartbeats, the downstream submit, worker passes;
//! - `preflight`: the worker's re-checks before any downstream call;
//! - `settle`: receipt checks and transaction C ([`Runtime::complete`], [`Runtime::fail`]);
//! - `status`: explicit status queries and their reconciliation, [`Runtime::inspect`];
//! - `resolve`: operator resolution ([`Runtime::resolve`]);
//! - `external`: an effect that is one call to an external API, from closures ([`External`],
//!   [`ExternalTool`], [`Registry::external`]).

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

mod accept;
mod external;
mod preflight;
mod record;
mod resolve;
mod settle;
mod status;
mod worker;

pub use external::{External, ExternalRequest, ExternalTool};
pub use worker::{Worker, WorkerFailure, WorkerRun};

use record::*;
pub use record::{
    approval_target, bound_receipt, downstream_request, query_identity, DeferredRecord,
    DownstreamRequest, IntentApproval,
};

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

impl From<outbox::OutboxError> for RuntimeError {
    fn from(e: outbox::OutboxError) -> Self {
        match e {
            outbox::OutboxError::Fenced(f) => RuntimeError::Fenced(f),
            outbox::OutboxError::Store(s) => RuntimeError::Store(s),
        }
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

/// Counts a fencing rejection at `step` (`toolledger_fencing_rejections_total{step}`): a write
/// refused because a newer claim or a reconciliation moved the event's fencing token on.
fn count_fenced<T>(step: &'static str, r: &Result<T, RuntimeError>) {
    if let Err(RuntimeError::Fenced(_)) = r {
        metrics::counter!("toolledger_fencing_rejections_total", "step" => step).increment(1);
    }
}

fn contract_violation(what: &str) -> RuntimeError {
    RuntimeError::Store(StoreError::Contract(what.to_string()))
}

/// A failed ledger statement: the backend's storage error (or a storage-contract error).
fn stored(tx: &mut dyn EffectTx, e: Error) -> RuntimeError {
    RuntimeError::Store(tx.store_error(e))
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
    /// The default allows every caller the runtime authorized: for tools whose arguments name
    /// no resource of their own.
    fn check_access(
        &self,
        tx: &mut dyn EffectTx,
        principal: &Principal,
        arguments: &Value,
    ) -> Result<(), Error> {
        let _ = (tx, principal, arguments);
        Ok(())
    }

    /// Access plus the current business state (e.g. the order is still refundable), used at
    /// reservation and before the worker's downstream effect. `business_state_changed` when
    /// the state no longer allows the effect. The default is [`DeferredTool::check_access`]
    /// alone: no business state to check.
    fn check(
        &self,
        tx: &mut dyn EffectTx,
        principal: &Principal,
        arguments: &Value,
    ) -> Result<(), Error> {
        self.check_access(tx, principal, arguments)
    }

    /// Whether a new intent needs an approval. The default is `false`.
    fn requires_approval(&self) -> bool {
        false
    }

    /// Checks a downstream receipt against the per-tool output contract and the accepted
    /// arguments, and returns the tool result. Generic bindings (status ref, scope, request
    /// digest) are already checked by the runtime.
    fn accept_receipt(&self, arguments: &Value, receipt: &Value) -> Result<Value, Error>;

    /// The stored result of an operation an operator confirmed as succeeded without a
    /// downstream receipt, on the evidence `confirmation` (`{by: "operator", operator, reason,
    /// evidence}`): what every retry is answered with. It must say the effect happened and
    /// carry the evidence; it must not pretend to be the downstream's own answer. The default
    /// is `{"confirmed": confirmation}`.
    fn confirmed_result(&self, _arguments: &Value, confirmation: &Value) -> Result<Value, Error> {
        Ok(json!({ "confirmed": confirmation }))
    }
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
    /// The caller says this is a new intent even if it equals an unsettled earlier one (the
    /// re-plan guard does not look: see [`Runtime::with_replan_window`]).
    pub new_intent: bool,
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
    /// Claims before an event is dead: written into each event this runtime enqueues, and
    /// applied (and written into the event) by each of its claims.
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

/// How an operator settles an unsure operation with [`Runtime::resolve`]: a deferred one as
/// `succeeded` or `failed`, an inline one as `applied` or `partial`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolveAs {
    /// Deferred: the effect happened: requires the downstream's receipt, reconciled like a
    /// status query.
    Succeeded,
    /// Deferred: the effect did not happen: refused when the downstream holds a receipt.
    Failed,
    /// Inline: every step happened (an operator completed the remaining ones); the stored
    /// result is the first step's.
    Applied,
    /// Inline: the first step happened and the remaining ones did not; the stored result is
    /// the first step's.
    Partial,
}

impl ResolveAs {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            ResolveAs::Succeeded => "succeeded",
            ResolveAs::Failed => "failed",
            ResolveAs::Applied => "applied",
            ResolveAs::Partial => "partial",
        }
    }

    /// The name's value, if it is one (`succeeded`, `failed`, `applied`, `partial`).
    pub fn parse(s: &str) -> Option<ResolveAs> {
        [
            ResolveAs::Succeeded,
            ResolveAs::Failed,
            ResolveAs::Applied,
            ResolveAs::Partial,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

/// An operator's resolution of an unsure operation: an `outcome_unknown`, `dead` or stale
/// `processing` deferred one, or an inline one stuck `in_progress` or left `partial`.
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
    /// What the operator verified (a JSON object: an upstream's message id, a payment
    /// reference, a screenshot's link): with it, a deferred operation whose downstream holds
    /// no receipt may be resolved as `succeeded`, and this is recorded as its receipt.
    pub evidence: Option<Value>,
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

/// Summary of one worker pass (or, summed with [`PassSummary::add`], of several).
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
    /// Not worked on because someone else holds them: events under a live lease when the
    /// pass looked, and ready events another worker claimed first (or that finished meanwhile).
    pub skipped: usize,
    /// Declared dead (attempts exhausted).
    pub dead: usize,
}

impl PassSummary {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &PassSummary) {
        self.ready += other.ready;
        self.delivered += other.delivered;
        self.failed += other.failed;
        self.unknown += other.unknown;
        self.skipped += other.skipped;
        self.dead += other.dead;
        for (code, n) in &other.refused {
            *self.refused.entry(code.clone()).or_default() += n;
        }
    }
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

fn check_now(now: i64) -> Result<(), Error> {
    if !(0..=MAX_PORTABLE_TIMESTAMP).contains(&now) {
        return Err(Error::invalid(
            "the clock is outside the portable time range",
        ));
    }
    Ok(())
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
    /// Seconds back a new key's intent is compared with unsettled operations (the re-plan
    /// guard); `None`: off.
    replan_window: Option<i64>,
    forwarder: &'static str,
}

/// How long back, by default, a call under a new key is compared with the caller's unsettled
/// operations of the same tool and intent (the re-plan guard): one day.
pub const DEFAULT_REPLAN_WINDOW_SECONDS: i64 = 86_400;

/// Who holds the lease of a delivery [`Runtime::dispatch`] makes at once, by default: its
/// lease owner is `dispatch-PID`.
pub const DEFAULT_FORWARDER: &str = "dispatch";

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
            replan_window: Some(DEFAULT_REPLAN_WINDOW_SECONDS),
            forwarder: DEFAULT_FORWARDER,
        }
    }

    /// Sets the re-plan guard's window: a call under a new key whose intent (tool, caller,
    /// canonical arguments, contract) equals an operation accepted within the last `seconds`
    /// that is still unsettled — accepted and not sent, processing, or `outcome_unknown` — is
    /// refused with `possible_duplicate` naming it, and nothing is recorded (a call with
    /// [`DeferredCall::new_intent`] proceeds). A settled earlier operation never blocks.
    /// `None` turns the guard off. Default: [`DEFAULT_REPLAN_WINDOW_SECONDS`].
    ///
    /// The window's trade-off: a longer one catches a re-plan that comes later (an agent
    /// resumed the next day), and makes a caller who really means the same thing twice while
    /// the first is unsure say so (`new_intent`) for longer.
    pub fn with_replan_window(mut self, seconds: Option<i64>) -> Self {
        self.replan_window = seconds.filter(|s| *s > 0);
        self
    }

    /// The re-plan guard's window in seconds (`None`: off).
    pub fn replan_window(&self) -> Option<i64> {
        self.replan_window
    }

    /// Names who delivers what [`Runtime::dispatch`] accepts at once: the lease owner of that
    /// delivery is `NAME-PID` (`proxy-4711` for the proxy's forward), as the operation's
    /// `claimed` event, `operations show` and the logs (`owner`) say. Default
    /// [`DEFAULT_FORWARDER`].
    pub fn with_forwarder(mut self, name: &'static str) -> Self {
        self.forwarder = name;
        self
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

    /// Runs `f` in a write transaction with the runtime's [`TxContext`] and the clock's time,
    /// read inside the transaction (again when it is retried).
    async fn write_at<T, F>(&self, f: F) -> Result<T, RuntimeError>
    where
        F: FnMut(&TxContext, &mut dyn EffectTx, i64) -> Result<T, RuntimeError> + Send + 'static,
        T: Send + 'static,
    {
        self.write_flushed_or_not(true, f).await
    }

    /// [`Runtime::write_at`]; `flush: false` commits without waiting for the disk
    /// ([`Store::write_unflushed`]), for a write nobody is told of before a flushed one.
    async fn write_flushed_or_not<T, F>(&self, flush: bool, mut f: F) -> Result<T, RuntimeError>
    where
        F: FnMut(&TxContext, &mut dyn EffectTx, i64) -> Result<T, RuntimeError> + Send + 'static,
        T: Send + 'static,
    {
        let ctx = TxContext {
            clock: self.clock.clone(),
            registry: self.registry.clone(),
            config: self.config,
            deadlines: self.deadlines,
        };
        let job = move |tx: &mut dyn EffectTx| {
            let now = ctx.clock.now();
            f(&ctx, tx, now)
        };
        if flush {
            self.store.write(job).await
        } else {
            self.store.write_unflushed(job).await
        }
    }

    fn tool(&self, name: &str) -> Result<ToolEntry, Error> {
        tool_entry(&self.registry, name)
    }
}

/// What a write job of the runtime uses: everything of the [`Runtime`] but its store handle. A
/// job must not own a handle of the store it runs on, or the last handle could be dropped on
/// the store's own writer thread.
struct TxContext {
    clock: SharedClock,
    registry: Arc<Registry>,
    config: RuntimeConfig,
    deadlines: Deadlines,
}

impl TxContext {
    fn tool(&self, name: &str) -> Result<ToolEntry, Error> {
        tool_entry(&self.registry, name)
    }
}

/// The registered tool called `name`; `invalid_arguments` for an unknown one.
fn tool_entry(registry: &Registry, name: &str) -> Result<ToolEntry, Error> {
    registry
        .entry(name)
        .ok_or_else(|| Error::invalid("unknown tool"))
}
