//! `get_operation_status`: read-only recovery after a lost reply.
//!
//! The status tool never checks deadlines, never writes and always answers. It reads the
//! caller's own ledger row for the operation id — under every guarded tool of the server, or
//! only under `tool` when the call names one — and asks the tool's [`EffectObserver`] which
//! physical effect rows belong to it. Only a finished ledger row whose effect rows are present
//! and consistent with the stored result is `authoritative`, and `state` is then the ledger's
//! own word for it: `applied` or `partial` (an inline effect), `succeeded` (a deferred one
//! whose downstream receipt was reconciled) or `failed` (a deferred effect the downstream
//! refused for good; nothing was applied). An
//! unfinished or absent row is `unknown` — absence never means "not applied"; `ledgerState`
//! says which unfinished state (e.g. `outcome_unknown`) and `statusRef` names the operation
//! for `toolledger resolve`. Another principal's operation is indistinguishable from an
//! absent one. `freshWriteAuthorized` is always `false`: a status answer never grants a new
//! write. A tombstone (an operation compacted after its retention deadline) shows its
//! settled state, not authoritative, with `storedResult` null: its result is no longer kept.

use std::sync::Arc;

use rmcp::model::{CallToolResponse, CallToolResult, ErrorData, Tool, ToolAnnotations};
use serde_json::{json, Map, Value};
use toolledger::engine::OperationRecord;
use toolledger::model::{Error, OperationState};
use toolledger::runtime::{Runtime, StatusQuery};

use crate::caller::Caller;
use crate::guard::{operation_id_from, Guard};
use crate::reply::{tool_error, tool_ok};
use crate::server::{BoxFuture, ToolCall};

/// What an observer found for one ledger row.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// Ids of the physical effect rows written by this operation.
    pub matching_ids: Vec<i64>,
    /// Whether the effect rows agree with the stored result.
    pub consistent: bool,
    /// The stored result as the status answer shows it.
    pub stored_result: Value,
}

/// Reads a tool's physical effect rows for a ledger row (read-only).
pub trait EffectObserver: Send + Sync + 'static {
    /// Observes the effect of `record`.
    fn observe<'a>(
        &'a self,
        record: &'a OperationRecord,
    ) -> BoxFuture<'a, Result<Observation, Error>>;
}

/// The `get_operation_status` tool over a set of guarded tools.
pub struct StatusTool {
    guard: Guard,
    tools: Vec<(String, Arc<dyn EffectObserver>)>,
    runtime: Option<Runtime>,
}

impl StatusTool {
    /// Name of the tool on the wire.
    pub const NAME: &'static str = "get_operation_status";

    /// A status tool answering for the guarded tools `tools` (name, observer).
    pub fn new(guard: Guard, tools: Vec<(String, Arc<dyn EffectObserver>)>) -> Self {
        StatusTool {
            guard,
            tools,
            runtime: None,
        }
    }

    /// The same tool, which first runs `runtime`'s status query ([`Runtime::status`]: the
    /// downstream's lookup, reconciled when it shows the effect happened) for an operation of
    /// one of `runtime`'s tools whose outcome is not settled.
    pub fn with_runtime(mut self, runtime: Option<Runtime>) -> Self {
        self.runtime = runtime;
        self
    }

    /// Runs the runtime's status query for `record` when it is an unsettled operation of one
    /// of the runtime's tools; `true` when it ran and settled it. A query that cannot tell
    /// (no lookup, nothing found, the downstream unavailable) leaves the row as it is.
    async fn reconcile(&self, caller: &Caller, record: &OperationRecord) -> bool {
        let Some(runtime) = &self.runtime else {
            return false;
        };
        let unsettled = matches!(
            record.state,
            OperationState::OutcomeUnknown | OperationState::Processing
        );
        if !unsettled || runtime.registry().tool(&record.tool).is_none() {
            return false;
        }
        let Ok(Some(deferred)) = runtime.inspect(&record.status_ref).await else {
            return false;
        };
        let query = StatusQuery {
            principal: caller.name.clone(),
            tool: record.tool.clone(),
            key: deferred.scope.key.clone(),
            arguments: deferred.arguments.clone(),
            provider: deferred.provider.clone(),
            status_ref: deferred.status_ref.clone(),
        };
        matches!(
            runtime.status(&query).await,
            Ok(toolledger::runtime::Answer::Done { .. })
        )
    }

    /// The status object for `operation_id` as seen by `call`'s caller.
    pub async fn status(&self, call: &ToolCall, operation_id: &str) -> Result<Value, Error> {
        self.status_of(&call.caller, operation_id).await
    }

    /// The status object for `operation_id` as seen by `caller`: the first of the tools (in
    /// the order given) under which the caller has a ledger row for this id answers.
    pub async fn status_of(&self, caller: &Caller, operation_id: &str) -> Result<Value, Error> {
        self.status_for(caller, operation_id, None).await
    }

    /// The arguments `{operation_id, tool?}` of a status call, checked.
    pub fn arguments(arguments: &Map<String, Value>) -> Result<(String, Option<String>), Error> {
        if let Some(extra) = arguments
            .keys()
            .find(|k| !matches!(k.as_str(), "operation_id" | "tool"))
        {
            return Err(Error::invalid(format!("unknown argument {extra}")));
        }
        let op = operation_id_from(arguments, "operation_id")?.to_string();
        let tool = match arguments.get("tool") {
            None => None,
            Some(Value::String(t)) => Some(t.clone()),
            Some(_) => return Err(Error::invalid("tool must be a string")),
        };
        Ok((op, tool))
    }

    /// The status object for `operation_id` as seen by `caller`, under `tool` only when
    /// given (a tool this server does not guard is `invalid_arguments`), else under the first
    /// of the tools (in the order given) where the caller has a ledger row for this id.
    pub async fn status_for(
        &self,
        caller: &Caller,
        operation_id: &str,
        tool: Option<&str>,
    ) -> Result<Value, Error> {
        if let Some(t) = tool {
            if !self.tools.iter().any(|(name, _)| name == t) {
                return Err(Error::invalid(format!(
                    "{t:?} is not a guarded tool of this server"
                )));
            }
        }
        let p = &caller.principal;
        let mut found = None;
        for (name, observer) in &self.tools {
            if tool.is_some_and(|t| t != name) {
                continue;
            }
            let tool = name;
            if let Some(mut record) = self
                .guard
                .engine()
                .lookup(&p.tenant, &p.subject, tool, operation_id)
                .await?
            {
                if self.reconcile(caller, &record).await {
                    if let Some(settled) = self
                        .guard
                        .engine()
                        .lookup(&p.tenant, &p.subject, tool, operation_id)
                        .await?
                    {
                        record = settled;
                    }
                }
                found = Some((record, observer.clone()));
                break;
            }
        }
        let backend = self.guard.backend_id().to_string();
        let principal = caller.name.clone();
        let ledger_state = found.as_ref().map(|(r, _)| r.state.as_str());
        let status_ref = found.as_ref().map(|(r, _)| r.status_ref.clone());
        let found_tool = found.as_ref().map(|(r, _)| r.tool.clone());
        let (state, authoritative, matching, detail, stored) = match found {
            None => (
                "unknown",
                false,
                Vec::new(),
                "no ledger row for this operation id is visible to you; absence does not prove \
                 the operation was not applied"
                    .to_string(),
                Value::Null,
            ),
            Some((record, _)) if record.compacted_at.is_some() => (
                // A tombstone is a settled operation: its state, in the ledger's word.
                record.state.as_str(),
                false,
                Vec::new(),
                format!(
                    "the operation {}; its result was removed after its retention deadline \
                     (a tombstone keeps its key taken)",
                    record.state.as_str()
                ),
                Value::Null,
            ),
            Some((record, observer)) => {
                let seen = observer.observe(&record).await?;
                // The ledger's own word for a settled row: `succeeded` for a deferred effect,
                // never `applied` beside `ledgerState: "succeeded"`.
                let settled = record.state.is_terminal().then(|| record.state.as_str());
                match settled {
                    Some(state) if seen.consistent => (
                        state,
                        true,
                        seen.matching_ids,
                        format!(
                            "ledger row {} and its effect rows agree",
                            record.state.as_str()
                        ),
                        seen.stored_result,
                    ),
                    Some(_) => (
                        "unknown",
                        false,
                        seen.matching_ids,
                        "the ledger row is finished but its effect rows do not match the stored \
                         result; an operator must reconcile"
                            .to_string(),
                        seen.stored_result,
                    ),
                    None => (
                        "unknown",
                        false,
                        seen.matching_ids,
                        format!(
                            "the operation is {}; its outcome is not settled",
                            record.state.as_str()
                        ),
                        Value::Null,
                    ),
                }
            }
        };
        Ok(json!({
            "operationId": operation_id,
            "principal": principal,
            "backend": backend,
            "observedAt": self.guard.clock().now(),
            "authoritative": authoritative,
            "freshWriteAuthorized": false,
            "scopeBinding": {
                "operationId": operation_id,
                "principal": principal,
                "backend": backend,
            },
            "state": state,
            "matchingIds": matching,
            "detail": detail,
            "storedResult": stored,
            "tool": found_tool,
            "ledgerState": ledger_state,
            "statusRef": status_ref,
        }))
    }
}

/// The JSON Schema of the status object.
pub fn output_schema() -> Map<String, Value> {
    let binding = json!({
        "type": "object",
        "properties": {
            "operationId": {"type": "string"},
            "principal": {"type": "string"},
            "backend": {"type": "string"},
        },
        "required": ["operationId", "principal", "backend"],
    });
    match json!({
        "type": "object",
        "properties": {
            "operationId": {"type": "string"},
            "principal": {"type": "string"},
            "backend": {"type": "string"},
            "observedAt": {"type": "integer"},
            "authoritative": {"type": "boolean"},
            "freshWriteAuthorized": {"type": "boolean", "const": false},
            "scopeBinding": binding,
            "state": {
                "type": "string",
                "enum": ["applied", "partial", "succeeded", "failed", "unknown"],
            },
            "matchingIds": {"type": "array", "items": {"type": "integer"}},
            "detail": {"type": "string"},
            "storedResult": {},
            "tool": {"type": ["string", "null"]},
            "ledgerState": {"type": ["string", "null"]},
            "statusRef": {"type": ["string", "null"]},
        },
        "required": ["operationId", "principal", "backend", "observedAt", "authoritative",
                     "freshWriteAuthorized", "scopeBinding", "state", "matchingIds", "detail",
                     "storedResult"],
    }) {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The JSON Schema of the status tool's arguments: `{operation_id, tool?}` and nothing else.
pub fn input_schema() -> Map<String, Value> {
    match json!({
        "type": "object",
        "properties": {
            "operation_id": {"type": "string", "minLength": 1, "maxLength": 256},
            "tool": {"type": "string", "minLength": 1, "maxLength": 128,
                     "description": "Only this tool's operation (when one id was used with several tools)"},
        },
        "required": ["operation_id"],
        "additionalProperties": false,
    }) {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

impl StatusTool {
    /// The tool's definition: name, argument and result schemas, read-only annotations.
    pub fn tool() -> Tool {
        Tool::new(
            Self::NAME,
            "Read-only: what the ledger knows about one of your operations. Never writes, never \
             authorizes a fresh write; absence is `unknown`.",
            Arc::new(input_schema()),
        )
        .with_raw_output_schema(Arc::new(output_schema()))
        .with_annotations(
            ToolAnnotations::new()
                .read_only(true)
                .destructive(false)
                .idempotent(true)
                .open_world(false),
        )
    }
}

impl StatusTool {
    /// Answers one `get_operation_status` call of `caller` with these wire arguments.
    pub async fn answer(&self, caller: &Caller, arguments: &Map<String, Value>) -> CallToolResult {
        let result = async {
            let (op, tool) = Self::arguments(arguments)?;
            self.status_for(caller, &op, tool.as_deref()).await
        }
        .await;
        match result {
            Ok(v) => tool_ok(v),
            Err(e) => tool_error(&e),
        }
    }

    /// Answers one `get_operation_status` call.
    pub async fn call(&self, call: ToolCall) -> Result<CallToolResponse, ErrorData> {
        Ok(CallToolResponse::Complete(
            self.answer(&call.caller, &call.arguments).await,
        ))
    }
}

/// An observer for effects that commit in the ledger's own transaction and whose result names
/// the effect row as `effectId`: the stored result is the evidence. Use a real observer that
/// reads the effect table when one is available.
#[derive(Clone, Copy, Debug, Default)]
pub struct LedgerResultObserver;

impl EffectObserver for LedgerResultObserver {
    fn observe<'a>(
        &'a self,
        record: &'a OperationRecord,
    ) -> BoxFuture<'a, Result<Observation, Error>> {
        Box::pin(async move {
            let result = record.result.clone().unwrap_or(Value::Null);
            Ok(Observation {
                matching_ids: result
                    .get("effectId")
                    .and_then(Value::as_i64)
                    .into_iter()
                    .collect(),
                consistent: record.result.is_some(),
                stored_result: result,
            })
        })
    }
}
