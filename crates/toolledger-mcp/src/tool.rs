//! [`GuardedTool`]: a single-round side-effecting tool under the guard, in a few lines.
//!
//! Declare the contract and schema, say which argument carries the operation id, and give a
//! function that validates a call and returns the business intent plus the effect. Replay,
//! conflict, in-progress, deadlines, fingerprinting and the reply shape are handled:
//! the reply is `{operationId, …stored result fields, replayed, state}` and errors are in-band.

use std::sync::Arc;

use rmcp::model::{CallToolResponse, ErrorData, Tool, ToolAnnotations};
use serde_json::{Map, Value};
use toolledger::engine::{InlineEffect, OperationRecord};
use toolledger::model::{Error, ToolContract};

use crate::guard::{operation_id_from, outcome_json, Guard, GuardedRequest};
use crate::reply::tool_result;
use crate::server::{BoxFuture, McpTool, ToolCall};
use crate::status::{EffectObserver, Observation};

/// Validates one call and returns `(intent, effect)`: the business intent (digested into the
/// request digest; exclude the operation id) and the effect to run at most once.
pub type EffectBuilder =
    Arc<dyn Fn(&ToolCall) -> Result<(Value, Arc<dyn InlineEffect>), Error> + Send + Sync>;

/// A guarded single-round tool.
pub struct GuardedTool {
    guard: Guard,
    contract: ToolContract,
    description: String,
    input_schema: Arc<Map<String, Value>>,
    operation_id_field: String,
    destructive: bool,
    build: EffectBuilder,
}

impl GuardedTool {
    /// A tool named by `contract.name` whose arguments follow `input_schema` (a JSON Schema
    /// object) and whose effect `build` returns. The operation id is read from the argument
    /// `operation_id` unless [`GuardedTool::operation_id_field`] says otherwise.
    pub fn new(
        guard: Guard,
        contract: ToolContract,
        description: impl Into<String>,
        input_schema: Value,
        build: impl Fn(&ToolCall) -> Result<(Value, Arc<dyn InlineEffect>), Error>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        GuardedTool {
            guard,
            contract,
            description: description.into(),
            input_schema: Arc::new(match input_schema {
                Value::Object(m) => m,
                _ => Map::new(),
            }),
            operation_id_field: "operation_id".into(),
            destructive: false,
            build: Arc::new(build),
        }
    }

    /// Reads the operation id from argument `field`.
    pub fn operation_id_field(mut self, field: impl Into<String>) -> Self {
        self.operation_id_field = field.into();
        self
    }

    /// Marks the effect as destructive (it overwrites or deletes), for the tool annotations.
    pub fn destructive(mut self, destructive: bool) -> Self {
        self.destructive = destructive;
        self
    }

    async fn handle(&self, call: ToolCall) -> Result<Value, Error> {
        crate::reply::single_round(call.request_state.is_some(), call.input_responses.is_some())?;
        let op = operation_id_from(&call.arguments, &self.operation_id_field)?.to_string();
        let (intent, effect) = (self.build)(&call)?;
        let request = GuardedRequest {
            caller: &call.caller,
            contract: &self.contract,
            operation_id: &op,
            arguments: &call.arguments,
        };
        let outcome = self.guard.run(&request, intent, effect).await?;
        Ok(outcome_json(&op, &outcome))
    }
}

impl McpTool for GuardedTool {
    fn definition(&self) -> Tool {
        Tool::new(
            self.contract.name.clone(),
            self.description.clone(),
            self.input_schema.clone(),
        )
        .with_annotations(
            ToolAnnotations::new()
                .read_only(false)
                .destructive(self.destructive)
                .idempotent(true)
                .open_world(false),
        )
    }

    fn call(&self, call: ToolCall) -> BoxFuture<'_, Result<CallToolResponse, ErrorData>> {
        Box::pin(async move {
            Ok(CallToolResponse::Complete(tool_result(
                self.handle(call).await,
            )))
        })
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
