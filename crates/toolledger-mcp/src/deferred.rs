//! Deferred tools over MCP: a tool whose effect is delivered through the outbox to a
//! downstream system ([`toolledger::runtime::DeferredTool`]), called like any other tool.
//!
//! One `tools/call` becomes one [`Runtime::dispatch`]:
//!
//! 1. the caller is the one the server resolved for this request ([`crate::CallerSource`]:
//!    the configured principal on stdio, the bearer token's over HTTP), re-read from the
//!    principal store by the runtime inside its own transactions;
//! 2. the tool's wire arguments are split into [`DeferredArguments`]: the operation id (the
//!    idempotency key, which also stands for the provider's turn, call and response ids, see
//!    [`ProviderContext::mcp`]), the business arguments and the approval id, if any;
//! 3. a new intent is accepted together with its outbox event (transaction A) and processed
//!    at once; a finished operation is replayed (`local_replay`) after current
//!    re-authorization; an unfinished one answers `OUTCOME_UNKNOWN` with its `status_ref` and
//!    nothing else happens — dispatch never observes the downstream. Observing is an explicit
//!    status query ([`DeferredAdapter::status`], [`Runtime::status`]), which reconciles a
//!    downstream receipt (`receipt_reconciled`).
//!
//! The reply is `{status_ref, code, delivery, status, result?}` ([`DeferredReply`]), as the
//! result's `structuredContent`. An unknown outcome is never dressed as success: it is an error
//! result (`isError: true`) whose text is `{"error": {"code": "outcome_unknown", "message",
//! "status_ref"}}` ([`DeferredReply::into_tool_result`]). Refusals are the
//! `{error: {code, message}}` of [`crate::error_of`].
//!
//! Two ways to serve one:
//! - [`DeferredAdapter`]: a definition, a runtime and an argument parser, answering a whole
//!   [`ToolCall`] (serve it with [`crate::call_route`]);
//! - [`Guarded::dispatch`], for an ordinary rmcp `#[tool]` method served through
//!   [`crate::LedgerGuard::router`]:
//!
//! ```text
//! #[tool(description = "Refund an order; retry with the same idempotency_key.",
//!        output_schema = toolledger_mcp::deferred::output_schema())]
//! async fn refund_order(&self, g: Guarded, Parameters(p): Parameters<Refund>)
//!     -> Result<DeferredOutcome, Refusal> {
//!     let call = DeferredArguments::new(p.idempotency_key, json!({"order_id": p.order_id}))
//!         .with_approval(p.approval);
//!     g.dispatch(&self.runtime, call).await
//! }
//! ```

use std::sync::Arc;

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ErrorData, JsonObject, Tool};
use rmcp::schemars::{self, JsonSchema};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolledger::model::{Error, ErrorCode, OperationState};
use toolledger::runtime::{Answer, DeferredCall, ProviderContext, Runtime, StatusQuery};

use crate::caller::Caller;
use crate::guarded::{Guarded, Refusal};
use crate::reply::{single_round, tool_ok};
use crate::server::ToolCall;

/// One call's wire arguments split into their roles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeferredArguments {
    /// The operation id (idempotency key).
    pub key: String,
    /// The business arguments (without key and approval), as the tool's
    /// [`DeferredTool::validate`](toolledger::runtime::DeferredTool::validate) takes them.
    pub arguments: Value,
    /// The approval id, if the call carries one.
    pub approval_id: Option<String>,
    /// The caller said this is a new intent (`_meta["io.toolledger/new_intent"]: true`): the
    /// re-plan guard does not compare it with unsettled operations.
    pub new_intent: bool,
}

impl DeferredArguments {
    /// The call with operation id `key` and business `arguments`, without an approval.
    pub fn new(key: impl Into<String>, arguments: Value) -> Self {
        DeferredArguments {
            key: key.into(),
            arguments,
            approval_id: None,
            new_intent: false,
        }
    }

    /// The same call, marked as a new intent when `new_intent` (see
    /// [`DeferredArguments::new_intent`]).
    pub fn with_new_intent(mut self, new_intent: bool) -> Self {
        self.new_intent = new_intent;
        self
    }

    /// The same call carrying `approval` (if `Some`).
    pub fn with_approval(mut self, approval: Option<String>) -> Self {
        self.approval_id = approval;
        self
    }

    /// The runtime call of `principal` for tool `tool`, with the MCP provider context of the
    /// key ([`ProviderContext::mcp`]).
    pub fn into_call(self, principal: &str, tool: &str) -> DeferredCall {
        DeferredCall {
            principal: principal.into(),
            tool: tool.into(),
            provider: ProviderContext::mcp(&self.key),
            key: self.key,
            arguments: self.arguments,
            approval_id: self.approval_id,
            new_intent: self.new_intent,
        }
    }
}

/// The in-band reply of a deferred tool: `{status_ref, code, delivery, status}`, plus `result`
/// when the operation finished.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DeferredReply {
    /// The opaque reference a status query names the operation by.
    pub status_ref: String,
    /// `OK` (succeeded), `FAILED` (failed, with its stored refusal as `result`) or
    /// `OUTCOME_UNKNOWN` (unfinished: the effect may or may not have happened).
    pub code: String,
    /// How the result reached the caller (`fresh`, `local_replay`, `receipt_reconciled`);
    /// `null` while the outcome is unknown.
    pub delivery: Option<String>,
    /// The operation's ledger state (`succeeded`, `failed`, `accepted`, `outcome_unknown`, …).
    pub status: String,
    /// The stored result of a finished operation; absent while the outcome is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

impl From<&Answer> for DeferredReply {
    fn from(answer: &Answer) -> Self {
        match answer {
            Answer::Done {
                status_ref,
                state,
                delivery,
                result,
            } => DeferredReply {
                status_ref: status_ref.clone(),
                code: if *state == OperationState::Succeeded {
                    "OK"
                } else {
                    "FAILED"
                }
                .into(),
                delivery: Some(delivery.as_str().into()),
                status: state.as_str().into(),
                result: Some(result.clone()),
            },
            Answer::Unknown { status_ref, state } => DeferredReply {
                status_ref: status_ref.clone(),
                code: "OUTCOME_UNKNOWN".into(),
                delivery: None,
                status: state.as_str().into(),
                result: None,
            },
        }
    }
}

impl DeferredReply {
    /// Whether the effect may or may not have happened (`OUTCOME_UNKNOWN`).
    pub fn is_unknown(&self) -> bool {
        self.code == "OUTCOME_UNKNOWN"
    }

    /// The MCP tool result of this reply. A finished operation is a plain result whose
    /// `structuredContent` is the reply. An unknown outcome is never dressed as success: it is
    /// an error result (`isError: true`) whose `content[0]` is the JSON text of
    /// `{"error": {"code": "outcome_unknown", "message", "status_ref"}}` — the reference to
    /// query — and whose `structuredContent` is still the reply, which validates against the
    /// tool's output schema, so clients that validate structured content see the real answer.
    pub fn into_tool_result(self) -> CallToolResult {
        let structured = serde_json::to_value(&self).unwrap_or(Value::Null);
        if !self.is_unknown() {
            return tool_ok(structured);
        }
        let body = serde_json::json!({"error": {
            "code": ErrorCode::OutcomeUnknown.as_str(),
            "message": "the effect may or may not have happened; query the operation's status \
                        with its status_ref",
            "status_ref": self.status_ref,
        }});
        let mut result = CallToolResult::structured_error(body);
        result.structured_content = Some(structured);
        result
    }
}

/// What a deferred `#[tool]` method returns ([`Guarded::dispatch`]): the reply, answered as
/// [`DeferredReply::into_tool_result`] says. Declare its schema on the tool with
/// `#[tool(output_schema = toolledger_mcp::deferred::output_schema())]`.
#[derive(Clone, Debug, PartialEq)]
pub struct DeferredOutcome(pub DeferredReply);

impl IntoCallToolResult for DeferredOutcome {
    fn into_call_tool_result(self) -> Result<CallToolResponse, ErrorData> {
        Ok(CallToolResponse::Complete(self.0.into_tool_result()))
    }
}

/// The output schema of a deferred tool ([`DeferredReply`]'s), for `#[tool(output_schema = …)]`.
pub fn output_schema() -> Arc<JsonObject> {
    Arc::new(reply_schema())
}

/// The JSON of [`DeferredReply`] for `answer` (what an MCP client sees as
/// `structuredContent`).
pub fn answer_json(answer: &Answer) -> Value {
    serde_json::to_value(DeferredReply::from(answer)).unwrap_or(Value::Null)
}

/// The output schema of [`DeferredReply`], as a tool definition's `outputSchema`.
pub fn reply_schema() -> JsonObject {
    let mut schema = serde_json::json!({
        "type": "object",
        "properties": {
            "status_ref": {"type": "string"},
            "code": {"type": "string", "enum": ["OK", "FAILED", "OUTCOME_UNKNOWN"]},
            "delivery": {"type": ["string", "null"]},
            "status": {"type": "string"},
            "result": {},
        },
        "required": ["status_ref", "code", "delivery", "status"],
    });
    match schema.take() {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    }
}

/// Splits one call's wire arguments into [`DeferredArguments`]; refuse malformed ones with
/// `invalid_arguments`.
pub type ArgumentParser =
    Arc<dyn Fn(&JsonObject) -> Result<DeferredArguments, Error> + Send + Sync>;

/// Dispatches `call` of `caller` to the deferred tool `tool` of `runtime` (the caller is
/// re-read by the runtime inside its own transactions).
pub async fn dispatch(
    runtime: &Runtime,
    caller: &Caller,
    tool: &str,
    call: DeferredArguments,
) -> Result<Answer, Error> {
    let call = call.into_call(&caller.name, tool);
    runtime.dispatch(&call, None).await.map_err(Error::from)
}

/// A deferred tool whose definition is known at run time: the definition it advertises, the
/// runtime it dispatches to and how its wire arguments split. See the [module docs](self).
#[derive(Clone)]
pub struct DeferredAdapter {
    runtime: Runtime,
    definition: Tool,
    parse: ArgumentParser,
}

impl std::fmt::Debug for DeferredAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredAdapter")
            .field("tool", &self.definition.name)
            .finish_non_exhaustive()
    }
}

impl DeferredAdapter {
    /// The tool advertised as `definition` (whose name is the deferred tool's registered name
    /// in `runtime`), dispatching every call to `runtime` with the arguments `parse` returns.
    /// Without an output schema of its own the definition gets [`reply_schema`].
    pub fn new(
        runtime: Runtime,
        definition: Tool,
        parse: impl Fn(&JsonObject) -> Result<DeferredArguments, Error> + Send + Sync + 'static,
    ) -> Self {
        let definition = if definition.output_schema.is_some() {
            definition
        } else {
            definition.with_raw_output_schema(Arc::new(reply_schema()))
        };
        DeferredAdapter {
            runtime,
            definition,
            parse: Arc::new(parse),
        }
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.definition.name
    }

    /// The runtime calls are dispatched to.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Dispatches one call of `caller` with these wire arguments (what
    /// [`DeferredAdapter::call`] does, without the transport).
    pub async fn dispatch(
        &self,
        caller: &Caller,
        arguments: &JsonObject,
    ) -> Result<DeferredReply, Error> {
        self.dispatch_as(caller, arguments, false).await
    }

    /// [`DeferredAdapter::dispatch`] of a call the caller marked as a new intent (or not).
    pub async fn dispatch_as(
        &self,
        caller: &Caller,
        arguments: &JsonObject,
        new_intent: bool,
    ) -> Result<DeferredReply, Error> {
        let call = (self.parse)(arguments)?.with_new_intent(new_intent);
        let answer = dispatch(&self.runtime, caller, self.name(), call).await?;
        Ok(DeferredReply::from(&answer))
    }

    /// The explicit status query for the operation `status_ref` of `caller`, called with
    /// these wire arguments: the only path that asks the downstream, and reconciles its
    /// receipt (`receipt_reconciled`) when the effect happened. Every refusal before the
    /// caller's own scope matches is `not_found`.
    pub async fn status(
        &self,
        caller: &Caller,
        arguments: &JsonObject,
        status_ref: &str,
    ) -> Result<DeferredReply, Error> {
        let call = (self.parse)(arguments)?;
        let query = StatusQuery {
            principal: caller.name.clone(),
            tool: self.name().to_string(),
            provider: ProviderContext::mcp(&call.key),
            key: call.key,
            arguments: call.arguments,
            status_ref: status_ref.into(),
        };
        let answer = self.runtime.status(&query).await.map_err(Error::from)?;
        Ok(DeferredReply::from(&answer))
    }
}

impl DeferredAdapter {
    /// The definition the tool advertises.
    pub fn definition(&self) -> Tool {
        self.definition.clone()
    }

    /// Answers one call (see [`call_route`](crate::call_route) to serve it as a route):
    /// single round, refusals in-band, an unknown outcome as an error result carrying its
    /// `status_ref`.
    pub async fn call(&self, call: ToolCall) -> Result<CallToolResponse, ErrorData> {
        let result = async {
            single_round(call.request_state.is_some(), call.input_responses.is_some())?;
            let new_intent = crate::carriers::new_intent(call.meta.as_ref());
            self.dispatch_as(&call.caller, &call.arguments, new_intent)
                .await
        }
        .await;
        crate::reply::respond(result.map(|r| CallToolResponse::Complete(r.into_tool_result())))
    }
}

impl Guarded {
    /// Dispatches a deferred effect for this `#[tool]` call: the caller is resolved like every
    /// guarded tool's, the tool's name is the deferred tool's registered name in `runtime`,
    /// and `call` carries the operation id, business arguments and approval. The reply is
    /// a [`DeferredOutcome`] (declare [`output_schema`] on the tool); an unknown outcome is an
    /// error result carrying its `status_ref`, and refusals are in-band.
    pub async fn dispatch(
        self,
        runtime: &Runtime,
        call: DeferredArguments,
    ) -> Result<DeferredOutcome, Refusal> {
        single_round(false, self.answers().is_some())?;
        let new_intent = call.new_intent || crate::carriers::new_intent(Some(self.meta()));
        let caller = self.caller().await?;
        let call = call.with_new_intent(new_intent);
        let answer = dispatch(runtime, &caller, self.tool(), call).await?;
        Ok(DeferredOutcome(DeferredReply::from(&answer)))
    }

    /// [`Guarded::dispatch`] on the ledger's own runtime, the one built from
    /// [`crate::LedgerGuardBuilder::deferred`]: the tool's effect — an external API's call
    /// ([`toolledger::runtime::External`]) or any deferred tool's delivery — runs once, after
    /// its intent is committed, and its answer is stored and replayed; a lost answer is
    /// `outcome_unknown` until `get_operation_status` reconciles it (the external call's
    /// lookup) or an operator resolves it. `unavailable` when the ledger has no runtime.
    pub async fn deliver(self, call: DeferredArguments) -> Result<DeferredOutcome, Refusal> {
        let Some(runtime) = self.ledger().runtime().cloned() else {
            return Err(Refusal(Error::unavailable(
                "this server delivers no deferred effects (LedgerGuard::builder().deferred)",
            )));
        };
        self.dispatch(&runtime, call).await
    }
}
