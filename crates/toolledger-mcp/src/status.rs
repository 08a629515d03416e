//! `get_operation_status`: read-only recovery after a lost reply.
//!
//! The status tool never checks deadlines, never writes and always answers. It reads the
//! caller's own ledger row for the operation id and asks the tool's [`EffectObserver`] which
//! physical effect rows belong to it. Only a finished ledger row whose effect rows are present
//! and consistent with the stored result is `authoritative`; an unfinished or absent row is
//! `unknown` — absence never means "not applied". Another principal's operation is
//! indistinguishable from an absent one. `freshWriteAuthorized` is always `false`: a status
//! answer never grants a new write.

use std::sync::Arc;

use rmcp::model::{CallToolResponse, ErrorData, Tool, ToolAnnotations};
use serde_json::{json, Map, Value};
use toolledger::engine::OperationRecord;
use toolledger::model::{Error, OperationState};

use crate::caller::Caller;
use crate::guard::{operation_id_from, Guard};
use crate::reply::{tool_error, tool_ok};
use crate::server::{BoxFuture, McpTool, ToolCall};

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
}

impl StatusTool {
    /// Name of the tool on the wire.
    pub const NAME: &'static str = "get_operation_status";

    /// A status tool answering for the guarded tools `tools` (name, observer).
    pub fn new(guard: Guard, tools: Vec<(String, Arc<dyn EffectObserver>)>) -> Self {
        StatusTool { guard, tools }
    }

    /// The status object for `operation_id` as seen by `call`'s caller.
    pub async fn status(&self, call: &ToolCall, operation_id: &str) -> Result<Value, Error> {
        self.status_of(&call.caller, operation_id).await
    }

    /// The status object for `operation_id` as seen by `caller`: the first of the tools (in
    /// the order given) under which the caller has a ledger row for this id answers.
    pub async fn status_of(&self, caller: &Caller, operation_id: &str) -> Result<Value, Error> {
        let p = &caller.principal;
        let mut found = None;
        for (tool, observer) in &self.tools {
            if let Some(record) = self
                .guard
                .engine()
                .lookup(&p.tenant, &p.subject, tool, operation_id)
                .await?
            {
                found = Some((record, observer.clone()));
                break;
            }
        }
        let backend = self.guard.backend_id().to_string();
        let principal = caller.name.clone();
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
            Some((record, observer)) => {
                let seen = observer.observe(&record).await?;
                match record.state {
                    OperationState::Applied | OperationState::Partial if seen.consistent => (
                        record.state.as_str(),
                        true,
                        seen.matching_ids,
                        format!(
                            "ledger row {} and its effect rows agree",
                            record.state.as_str()
                        ),
                        seen.stored_result,
                    ),
                    OperationState::Applied | OperationState::Partial => (
                        "unknown",
                        false,
                        seen.matching_ids,
                        "the ledger row is finished but its effect rows do not match the stored \
                         result; an operator must reconcile"
                            .to_string(),
                        seen.stored_result,
                    ),
                    other => (
                        "unknown",
                        false,
                        seen.matching_ids,
                        format!(
                            "the operation is {}; its outcome is not settled",
                            other.as_str()
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
            "state": {"type": "string", "enum": ["applied", "partial", "unknown"]},
            "matchingIds": {"type": "array", "items": {"type": "integer"}},
            "detail": {"type": "string"},
            "storedResult": {},
        },
        "required": ["operationId", "principal", "backend", "observedAt", "authoritative",
                     "freshWriteAuthorized", "scopeBinding", "state", "matchingIds", "detail",
                     "storedResult"],
    }) {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The JSON Schema of the status tool's arguments: `{operation_id}` and nothing else.
pub fn input_schema() -> Map<String, Value> {
    match json!({
        "type": "object",
        "properties": {"operation_id": {"type": "string", "minLength": 1, "maxLength": 256}},
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

impl McpTool for StatusTool {
    fn definition(&self) -> Tool {
        Self::tool()
    }

    fn call(&self, call: ToolCall) -> BoxFuture<'_, Result<CallToolResponse, ErrorData>> {
        Box::pin(async move {
            let result = async {
                if let Some(extra) = call.arguments.keys().find(|k| *k != "operation_id") {
                    return Err(Error::invalid(format!("unknown argument {extra}")));
                }
                let op = operation_id_from(&call.arguments, "operation_id")?.to_string();
                self.status(&call, &op).await
            }
            .await;
            Ok(CallToolResponse::Complete(match result {
                Ok(v) => tool_ok(v),
                Err(e) => tool_error(&e),
            }))
        })
    }
}
