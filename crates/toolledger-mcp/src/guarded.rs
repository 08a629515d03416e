//! Guarded tools as ordinary rmcp `#[tool]` methods.
//!
//! A guarded tool takes typed [`Parameters<T>`](rmcp::handler::server::wrapper::Parameters)
//! (its input schema comes from `schemars`) and one [`Guarded`] argument, and returns
//! `Result<Json<Receipt<R>>, Refusal>` (its output schema comes from `R`; spelled out, since
//! rmcp's `#[tool]` finds `Json` in the return type by its name):
//!
//! ```text
//! #[tool(description = "Create a note; retry with the same operation_id to replay.")]
//! async fn create_note(&self, g: Guarded, Parameters(p): Parameters<NewNote>)
//!     -> Result<Json<Receipt<NoteCreated>>, Refusal> {
//!     g.run(&p.operation_id, json!({"text": p.text}), InsertNote(p.text)).await
//! }
//! ```
//!
//! The router the tools are served from must pass through [`LedgerGuard::router`], once, with
//! [`status_router`] added: `ledger.router(Self::tool_router() + status_router())`, which
//! [`LedgerGuard::server`] and [`LedgerGuard::serve_stdio`] do. For every call the wrapped
//! router
//!
//! 1. validates the wire arguments against the tool's advertised input schema (see
//!    [`LedgerGuard::router`] for why a JSON Schema validator and not serde alone): a call
//!    that does not conform is answered in-band with `invalid_arguments` and nothing runs,
//!    so nothing is fingerprinted and nothing is written;
//! 2. records what [`Guarded`] needs (the raw arguments, the continuation fields, the
//!    protocol version) before any extractor consumes them, so `g: Guarded` may come before
//!    or after `Parameters<T>`;
//! 3. answers a `Parameters<T>` deserialization failure in-band with `invalid_arguments`
//!    too, instead of rmcp's text-only error.
//!
//! [`Guarded::run`] resolves the caller (re-reading the principal store), fingerprints the
//! wire arguments and hands the effect to [`crate::Guard`]: a retry with the same operation id
//! replays (`replayed: true`), the same id with other arguments is `operation_conflict`, and
//! every refusal is the in-band `{error: {code, message}}` (read by [`crate::error_of`]). Multi-round
//! tools use [`Guarded::ask`] and [`Guarded::run_answered`] (MCP 2026-07-28 `input_required`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::{IntoCallToolResult, ToolCallContext, ToolRoute, ToolRouter};
use rmcp::handler::server::wrapper::Json;
use rmcp::model::{
    CallToolResponse, CallToolResult, ClientCapabilities, ErrorCode as RpcErrorCode, ErrorData,
    InputRequest, InputResponses, JsonObject,
};
use rmcp::schemars::{self, JsonSchema};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolledger::approval::{self, ApprovalTarget};
use toolledger::effect::EffectTx;
use toolledger::engine::{Begun, InlineEffect, OperationRecord, Outcome};
use toolledger::model::{Error, ErrorCode, Principal, ToolContract};

use crate::caller::Caller;
use crate::guard::{outcome_json, Guard, GuardedRequest, Resumed};
use crate::ledger::LedgerGuard;
use crate::reply::tool_error;
use crate::server::{client_accepts, is_multi_round, ToolCall};
use crate::status::StatusTool;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The longest validation message echoed to the client (instances may be long strings).
const MAX_MESSAGE: usize = 300;

/// What the wrapped router records for one call, in the request's extensions (shared: every
/// clone of the request's context is a reference count).
type CallScope = Arc<Scope>;

#[derive(Clone)]
struct Scope {
    ledger: LedgerGuard,
    status: Arc<StatusTool>,
    arguments: JsonObject,
    request_state: Option<String>,
    input_responses: Option<InputResponses>,
    multi_round: bool,
    client_capabilities: Option<ClientCapabilities>,
}

/// A refused guarded call: answered in-band as `isError: true` with the JSON text of
/// `{error: {code, message}}` (read by [`crate::error_of`]); an invalid `requestState`
/// is the JSON-RPC error -32602 instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal(pub Error);

impl Refusal {
    /// The stable error code.
    pub fn code(&self) -> ErrorCode {
        self.0.code
    }
}

impl From<Error> for Refusal {
    fn from(e: Error) -> Self {
        Refusal(e)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Refusal {}

impl IntoCallToolResult for Refusal {
    fn into_call_tool_result(self) -> Result<CallToolResponse, ErrorData> {
        crate::reply::respond(Err(self.0))
    }
}

/// The reply of a guarded call: `{operationId, …the stored result's fields, replayed, state}`,
/// typed by the effect's result `R` (an object whose fields are merged in), so `#[tool]` derives the output schema from it.
///
/// Without a type, the result is any JSON object: `Receipt` is `Receipt<serde_json::Value>`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Receipt<R = Value> {
    /// The operation id (idempotency key) of the call.
    #[serde(rename = "operationId")]
    pub operation_id: String,
    /// The effect's result: fresh, or the stored one on a replay.
    #[serde(flatten)]
    pub result: R,
    /// Whether the result was replayed from the ledger rather than produced now.
    pub replayed: bool,
    /// The operation's ledger state (`applied` for a committed inline effect).
    pub state: String,
}

impl<R: Serialize> Receipt<R> {
    /// The receipt as a complete tool response (for tools that return `CallToolResponse`,
    /// e.g. multi-round ones).
    pub fn into_response(self) -> CallToolResponse {
        match serde_json::to_value(&self) {
            Ok(v) => CallToolResponse::Complete(CallToolResult::structured(v)),
            Err(_) => CallToolResponse::Complete(tool_error(&Error::unavailable(
                "the result could not be encoded",
            ))),
        }
    }
}

fn receipt<R: DeserializeOwned>(
    operation_id: &str,
    outcome: &Outcome,
) -> Result<Receipt<R>, Refusal> {
    serde_json::from_value(outcome_json(operation_id, outcome)).map_err(|e| {
        tracing::error!(error = %e, "a guarded tool's result does not match its declared type");
        Refusal(Error::unavailable(
            "the operation's result does not match the tool's result type; ask \
             get_operation_status",
        ))
    })
}

/// The extractor for a guarded tool: who is calling, which tool, which wire arguments, and
/// the ledger to run the effect under. See the [module docs](self).
pub struct Guarded {
    scope: CallScope,
    tool: String,
    context: RequestContext<RoleServer>,
}

impl std::fmt::Debug for Guarded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guarded")
            .field("tool", &self.tool)
            .field("multi_round", &self.scope.multi_round)
            .finish_non_exhaustive()
    }
}

/// The refusal of a guarded tool served without [`LedgerGuard::router`].
fn unwrapped() -> ErrorData {
    ErrorData::internal_error(
        "a guarded tool must be served through LedgerGuard::router",
        None,
    )
}

impl<S> FromContextPart<ToolCallContext<'_, S>> for Guarded {
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, ErrorData> {
        let scope = context.request_context.extensions.get::<CallScope>();
        let scope = scope.cloned().ok_or_else(unwrapped)?;
        Ok(Guarded {
            scope,
            tool: context.name.to_string(),
            context: context.request_context.clone(),
        })
    }
}

fn check_operation_id(operation_id: &str) -> Result<(), Refusal> {
    let n = operation_id.chars().count();
    if n == 0 || n > 256 {
        return Err(Refusal(Error::invalid(
            "the operation id must be 1 to 256 characters",
        )));
    }
    Ok(())
}

impl Guarded {
    /// The tool's name (the `#[tool]` method's).
    pub fn tool(&self) -> &str {
        &self.tool
    }

    /// The wire arguments, as validated and as fingerprinted.
    pub fn arguments(&self) -> &JsonObject {
        &self.scope.arguments
    }

    /// The ledger.
    pub fn ledger(&self) -> &LedgerGuard {
        &self.scope.ledger
    }

    /// The request's `_meta` (the progress token, the operation id's carriers, vendor keys).
    pub fn meta(&self) -> &rmcp::model::RequestMetaObject {
        &self.context.meta
    }

    /// Whether the caller marked this call as a new intent
    /// (`_meta["io.toolledger/new_intent"]: true`): the re-plan guard lets it through.
    pub fn new_intent(&self) -> bool {
        crate::carriers::new_intent(Some(&self.context.meta))
    }

    /// Whether the session may receive `input_required` (MCP 2026-07-28 or newer).
    pub fn multi_round(&self) -> bool {
        self.scope.multi_round
    }

    /// The client's `inputResponses` when this call is a continuation.
    pub fn answers(&self) -> Option<&InputResponses> {
        self.scope.input_responses.as_ref()
    }

    /// The current caller, re-read from the principal store.
    pub async fn caller(&self) -> Result<Caller, Refusal> {
        let ledger = &self.scope.ledger;
        Ok(ledger
            .caller_source()
            .resolve(ledger.principals(), &self.context)
            .await?)
    }

    /// The whole call, for a tool that handles the protocol itself (a proxy's forward, a
    /// multi-round tool with its own rounds): the caller re-read from the principal store,
    /// the wire arguments, the continuation fields, the request's `_meta`, its cancellation
    /// and the client.
    pub async fn call(self) -> Result<ToolCall, Refusal> {
        let caller = self.caller().await?;
        Ok(self.into_call(caller))
    }

    /// [`Guarded::call`] with the caller known by name only ([`Caller::unread`]), for a tool
    /// that reads the principal itself in the same read of the store as everything else it
    /// checks (a deferred runtime re-reads it in the snapshot it examines the ledger in).
    pub fn call_unread(self) -> Result<ToolCall, Refusal> {
        let name = self.scope.ledger.caller_source().name(&self.context)?;
        Ok(self.into_call(Caller::unread(name)))
    }

    /// The extractor of a route that owns its whole context: nothing is cloned, so the
    /// arguments move into the [`ToolCall`] when no one else holds the call's scope.
    fn take<S>(ctx: ToolCallContext<'_, S>) -> Result<Self, ErrorData> {
        let mut context = ctx.request_context;
        let scope = context.extensions.remove::<CallScope>();
        let scope = scope.ok_or_else(unwrapped)?;
        Ok(Guarded {
            scope,
            tool: ctx.name.to_string(),
            context,
        })
    }

    /// [`Guarded::call`] for `caller`, consuming the extractor: the arguments move when no
    /// one else holds them.
    fn into_call(self, caller: Caller) -> ToolCall {
        let Guarded { scope, context, .. } = self;
        let scope = Arc::try_unwrap(scope).unwrap_or_else(|shared| shared.as_ref().clone());
        let multi_round = scope.multi_round;
        ToolCall {
            caller,
            arguments: scope.arguments,
            request_state: scope.request_state,
            input_responses: scope.input_responses,
            meta: (!context.meta.is_empty()).then_some(context.meta),
            cancelled: Some(context.ct),
            multi_round,
            client_capabilities: scope.client_capabilities,
            peer: Some(context.peer),
        }
    }

    /// [`Guarded::into_call`] without giving up the extractor (its scope is then copied).
    fn call_as(&self, caller: Caller) -> ToolCall {
        let copy = Guarded {
            scope: self.scope.clone(),
            tool: self.tool.clone(),
            context: self.context.clone(),
        };
        copy.into_call(caller)
    }

    /// Refuses a continuation of a single-round tool and an operation id out of bounds.
    fn single_round(&self, operation_id: &str) -> Result<(), Refusal> {
        crate::reply::single_round(
            self.scope.request_state.is_some(),
            self.scope.input_responses.is_some(),
        )?;
        check_operation_id(operation_id)
    }

    fn contract(&self) -> ToolContract {
        ToolContract::uniform(self.tool.clone(), self.scope.ledger.revision())
    }

    fn request<'a>(
        &'a self,
        caller: &'a Caller,
        contract: &'a ToolContract,
        operation_id: &'a str,
    ) -> GuardedRequest<'a> {
        GuardedRequest {
            caller,
            contract,
            operation_id,
            arguments: &self.scope.arguments,
        }
    }

    /// Runs a single-round effect under the ledger: `intent` is the business intent (without
    /// the operation id; digested into the request digest, so the same id with another intent
    /// is `operation_conflict`), `effect` commits at most once per operation id in the
    /// ledger's transaction. A retry replays the stored result with `replayed: true`.
    pub async fn run<R: DeserializeOwned>(
        self,
        operation_id: &str,
        intent: Value,
        effect: impl InlineEffect,
    ) -> Result<Json<Receipt<R>>, Refusal> {
        self.single_round(operation_id)?;
        let (caller, contract) = (self.caller().await?, self.contract());
        let request = self.request(&caller, &contract, operation_id);
        let outcome = self
            .scope
            .ledger
            .guard()
            .run(&request, intent, Arc::new(effect))
            .await?;
        receipt(operation_id, &outcome).map(Json)
    }

    /// [`Guarded::run`] for an effect a human approves first: the approval id is the wire
    /// argument `approval_field` (absent: `approval_required`), and it must name an unused,
    /// unexpired approval for exactly this intent —
    /// [`ApprovalTarget::for_intent`]`(caller, tool, operation_id, intent)`, which an approver
    /// grants with `toolledger approve --tool TOOL --requester NAME --key ID --arguments
    /// INTENT` — by a current approver other than the caller. It is consumed in the effect's
    /// transaction (`approval_invalid` when bound to another intent, used or expired). The
    /// approval id is not part of the fingerprint, so an exact retry replays even after its
    /// approval was used or has expired.
    pub async fn run_approved<R: DeserializeOwned>(
        self,
        operation_id: &str,
        intent: Value,
        approval_field: &str,
        effect: impl InlineEffect,
    ) -> Result<Json<Receipt<R>>, Refusal> {
        self.single_round(operation_id)?;
        let approval = match self.scope.arguments.get(approval_field) {
            None => None,
            Some(Value::String(id)) => Some(id.clone()),
            Some(_) => {
                return Err(Refusal(Error::invalid(format!(
                    "{approval_field} must be a string"
                ))))
            }
        };
        let mut fingerprinted = self.scope.arguments.clone();
        fingerprinted.remove(approval_field);
        let (caller, contract) = (self.caller().await?, self.contract());
        let request = GuardedRequest {
            caller: &caller,
            contract: &contract,
            operation_id,
            arguments: &fingerprinted,
        };
        let guard = self.scope.ledger.guard();
        let approved = Approved {
            inner: effect,
            tool: self.tool.clone(),
            operation_id: operation_id.to_string(),
            intent: intent.clone(),
            approval,
            now: guard.clock().now(),
        };
        let outcome = guard.run(&request, intent, Arc::new(approved)).await?;
        receipt(operation_id, &outcome).map(Json)
    }

    /// The first round of a multi-round tool: answers `input_required` asking for
    /// `requests`, with a sealed `requestState` bound to this caller, tool, operation id and
    /// arguments (the operation's deadlines are fixed now). Needs an MCP 2026-07-28 session.
    ///
    /// `known` is the business intent the first round fixes; the continuation's intent (given
    /// to [`Guarded::run_answered`]) must be `known` plus one field per input request, named
    /// as the request. When this caller's scope already holds the operation, the first round
    /// answers as a replay would (the stored result with `replayed: true`, or the deadline,
    /// `outcome_unknown` or `operation_in_progress` answer), so a client that lost its
    /// `requestState` and starts over recovers its result; another intent under the same id is
    /// `operation_conflict`. An input request the client did not declare the capability for
    /// (e.g. form elicitation) is never sent: the call is `continuation_unsupported` and
    /// writes nothing.
    pub async fn ask(
        &self,
        operation_id: &str,
        known: Value,
        step: &str,
        requests: Vec<(String, InputRequest)>,
    ) -> Result<CallToolResponse, Refusal> {
        if !self.scope.multi_round {
            return Err(Refusal(Error::new(
                ErrorCode::ContinuationUnsupported,
                "this tool asks for input with input_required, which needs MCP 2026-07-28",
            )));
        }
        match self
            .rounds_of(operation_id, known, step, requests, false)
            .await?
        {
            Rounds::Respond(response) => Ok(response),
            Rounds::Answered(_) => Err(Refusal(Error::new(
                ErrorCode::ContinuationUnsupported,
                "this tool asks for input with input_required, which needs MCP 2026-07-28",
            ))),
        }
    }

    /// The continuation of a multi-round tool: verifies `requestState` (this caller, tool,
    /// operation id and arguments, unexpired) and runs the effect, fingerprinted over the
    /// arguments, the state and the answers. The exact continuation sent again replays.
    pub async fn run_answered<R: DeserializeOwned>(
        self,
        operation_id: &str,
        intent: Value,
        effect: impl InlineEffect,
    ) -> Result<Json<Receipt<R>>, Refusal> {
        let (Some(state), Some(answers)) = (&self.scope.request_state, &self.scope.input_responses)
        else {
            return Err(Refusal(Error::new(
                ErrorCode::ContinuationUnsupported,
                "a continuation needs both requestState and inputResponses",
            )));
        };
        check_operation_id(operation_id)?;
        let (caller, contract) = (self.caller().await?, self.contract());
        let request = self.request(&caller, &contract, operation_id);
        let guard = self.scope.ledger.guard();
        let answered = resume(guard, &request, state, Some(answers))?;
        let outcome = guard
            .run_resumed(&request, &answered.resumed, intent, Arc::new(effect))
            .await?;
        receipt(operation_id, &outcome).map(Json)
    }

    /// Verifies a continuation whose `requestState` the tool carries itself (say, inside a
    /// state of its own that also names the operation): `state` must have been issued by
    /// [`Guarded::ask`] or [`Guarded::rounds`] to this caller, for this tool, operation id and
    /// arguments, and be unexpired. The answers are this call's `inputResponses` (none: an
    /// empty object). Run the effect with [`Guarded::run_rounds`]; the round it answers is
    /// `resumed.binding.step`.
    pub async fn resume(&self, operation_id: &str, state: &str) -> Result<Answered, Refusal> {
        check_operation_id(operation_id)?;
        let (caller, contract) = (self.caller().await?, self.contract());
        let request = self.request(&caller, &contract, operation_id);
        let responses = self.scope.input_responses.as_ref();
        Ok(resume(
            self.scope.ledger.guard(),
            &request,
            state,
            responses,
        )?)
    }
}

fn shorten(mut s: String) -> String {
    if s.chars().count() > MAX_MESSAGE {
        s = s.chars().take(MAX_MESSAGE).collect();
        s.push('…');
    }
    s
}

/// Checks `arguments` against a tool's compiled input schema: `invalid_arguments` naming the
/// first failing argument (shortened), before anything is fingerprinted or written.
pub fn check_arguments(
    validator: &jsonschema::Validator,
    arguments: &JsonObject,
) -> Result<(), Error> {
    let instance = Value::Object(arguments.clone());
    let Some(first) = validator.iter_errors(&instance).next() else {
        return Ok(());
    };
    let at = first.instance_path().to_string();
    let at = if at.is_empty() {
        "arguments".into()
    } else {
        format!("argument {at}")
    };
    Err(Error::invalid(shorten(format!("{at}: {first}"))))
}

/// rmcp's `Parameters<T>` refusal (the router turns it into a text-only error).
fn is_parameters_error(e: &ErrorData) -> bool {
    e.code == RpcErrorCode::INVALID_PARAMS
        && e.message.starts_with("failed to deserialize parameters:")
}

fn complete_error(e: &Error) -> Result<CallToolResponse, ErrorData> {
    Ok(CallToolResponse::Complete(tool_error(e)))
}

/// What one wrapped route holds.
struct Wrapped<S> {
    inner: Arc<rmcp::handler::server::tool::DynCallToolHandler<S>>,
    validator: Option<Arc<jsonschema::Validator>>,
    ledger: LedgerGuard,
    status: Arc<StatusTool>,
    /// The tool's name and its metric series.
    series: Arc<crate::observe::CallSeries>,
    /// The argument that carries the tool's operation id, if it has one
    /// ([`crate::carriers::key_argument`]).
    key_argument: Option<String>,
}

fn call_wrapped<'a, S: Send + Sync + 'static>(
    w: &Wrapped<S>,
    mut ctx: ToolCallContext<'a, S>,
) -> BoxFuture<'a, Result<CallToolResponse, ErrorData>> {
    let status_query = w.key_argument.is_none() && w.series.tool() == StatusTool::NAME;
    let span = crate::trace::tool_call(w.series.tool(), &ctx.request_context);
    let refused = |e: &Error| {
        let response = complete_error(e);
        crate::trace::finish(&span, &response, status_query);
        Box::pin(std::future::ready(response)) as BoxFuture<'a, _>
    };
    let mut arguments = ctx.arguments.clone().unwrap_or_default();
    if let Some(name) = &w.key_argument {
        // The operation id may travel outside the arguments (`_meta`, `params.idempotencyKey`,
        // the `Idempotency-Key` header): carriers that disagree are refused, and a key carried
        // elsewhere becomes the argument before anything is validated.
        let meta = &ctx.request_context.meta;
        match crate::carriers::carried_key(Some(meta), name, arguments.get(name)) {
            Err(e) => return refused(&e),
            Ok(Some(key)) if !arguments.contains_key(name) => {
                arguments.insert(name.clone(), Value::String(key));
                ctx.arguments = Some(arguments.clone());
            }
            Ok(_) => {}
        }
    }
    if let Some(Err(e)) = w.validator.as_ref().map(|v| check_arguments(v, &arguments)) {
        return refused(&e);
    }
    let scope = Arc::new(Scope {
        ledger: w.ledger.clone(),
        status: w.status.clone(),
        arguments,
        request_state: ctx.request_state.clone(),
        input_responses: ctx.input_responses.clone(),
        multi_round: is_multi_round(&ctx.request_context),
        client_capabilities: ctx.request_context.client_capabilities(),
    });
    ctx.request_context.extensions.insert(scope);
    let series = w.series.clone();
    // Named for the log line without a read of the principal store.
    let principal = w.ledger.caller_source().name(&ctx.request_context).ok();
    let started = std::time::Instant::now();
    let fut = crate::trace::in_context(&span, (w.inner)(ctx));
    Box::pin(async move {
        let response = match fut.await {
            Err(e) if is_parameters_error(&e) => {
                let detail = e
                    .message
                    .trim_start_matches("failed to deserialize parameters:");
                complete_error(&Error::invalid(shorten(format!("arguments:{detail}"))))
            }
            other => other,
        };
        crate::observe::tool_call(&series, principal.as_deref(), &response, started.elapsed());
        crate::trace::finish(&span, &response, status_query);
        response
    })
}

impl LedgerGuard {
    /// Wraps every route of `router` (the application's `#[tool_router]` plus
    /// [`status_router`]) so [`Guarded`] tools and `get_operation_status` run under this
    /// ledger. Call it once, when the server is built, and serve the result (e.g. from a
    /// `tool_router` field with `#[tool_handler(router = self.tool_router)]`).
    ///
    /// Every route's wire arguments are validated against its advertised input schema
    /// before anything runs. The validator is a real JSON Schema (2020-12) validator, not
    /// serde alone: the schema `schemars` derives says more than `Deserialize` checks —
    /// length, range and pattern constraints (`#[schemars(length(min = 1))]`) are only in
    /// the schema — and a `Deserialize` that accepts something the schema forbids would let
    /// a non-conforming call be fingerprinted and written. serde still runs afterwards (for
    /// `Parameters<T>`), and its refusals are answered the same way (`invalid_arguments`).
    ///
    /// `get_operation_status` answers for every tool of `router`; fails if a route's input
    /// schema is not a valid JSON Schema.
    pub fn router<S: Send + Sync + 'static>(
        &self,
        router: ToolRouter<S>,
    ) -> Result<ToolRouter<S>, Error> {
        self.wrap(router, true)
    }

    /// [`LedgerGuard::router`] without the input-schema check: for routes that validate
    /// their own arguments — tools whose refusals carry domain error codes, or a proxy whose
    /// upstream owns the schema and judges the arguments itself.
    pub fn router_unchecked<S: Send + Sync + 'static>(
        &self,
        router: ToolRouter<S>,
    ) -> ToolRouter<S> {
        match self.wrap(router, false) {
            Ok(router) => router,
            Err(_) => unreachable!("no schema is compiled without the check"),
        }
    }

    fn wrap<S: Send + Sync + 'static>(
        &self,
        mut router: ToolRouter<S>,
        validate: bool,
    ) -> Result<ToolRouter<S>, Error> {
        let mut names: Vec<String> = router
            .map
            .keys()
            .filter(|n| *n != StatusTool::NAME)
            .map(|n| n.to_string())
            .collect();
        names.sort();
        let observed = names
            .iter()
            .map(|n| (n.clone(), self.observer(n)))
            .collect();
        let status = Arc::new(
            StatusTool::new(self.guard().clone(), observed).with_runtime(self.runtime().cloned()),
        );
        for route in router.map.values_mut() {
            let validator = if validate {
                let schema = Value::Object(route.attr.input_schema.as_ref().clone());
                let validator = jsonschema::validator_for(&schema).map_err(|_| {
                    Error::invalid(format!(
                        "the input schema of tool {} is not a valid JSON Schema",
                        route.attr.name
                    ))
                })?;
                Some(Arc::new(validator))
            } else {
                None
            };
            let wrapped = Wrapped {
                inner: route.call.clone(),
                validator,
                ledger: self.clone(),
                status: status.clone(),
                series: Arc::new(crate::observe::CallSeries::new(&route.attr.name)),
                key_argument: (route.attr.name != StatusTool::NAME)
                    .then(|| crate::carriers::key_argument(&route.attr.input_schema))
                    .flatten(),
            };
            *route = ToolRoute::new_dyn(route.attr.clone(), move |ctx| call_wrapped(&wrapped, ctx));
        }
        Ok(router)
    }
}

async fn status_call(mut ctx: ToolCallContext<'_, impl Send + Sync>) -> CallToolResult {
    let Some(scope) = ctx.request_context.extensions.remove::<CallScope>() else {
        return tool_error(&Error::unavailable(
            "get_operation_status must be served through LedgerGuard::router",
        ));
    };
    match scope
        .ledger
        .caller_source()
        .resolve(scope.ledger.principals(), &ctx.request_context)
        .await
    {
        Ok(caller) => scope.status.answer(&caller, &scope.arguments).await,
        Err(e) => tool_error(&e),
    }
}

/// The read-only `get_operation_status` tool as an rmcp router to add to the application's
/// own (`Self::tool_router() + status_router()`, then [`LedgerGuard::router`]). It answers
/// for every tool of the wrapped router by operation id, with the shape of
/// [`StatusTool`]: it never writes, never authorizes a fresh write, and absence is `unknown`.
pub fn status_router<S: Send + Sync + 'static>() -> ToolRouter<S> {
    ToolRouter::new().with_route(ToolRoute::new_dyn(StatusTool::tool(), |ctx| {
        Box::pin(async move { Ok(CallToolResponse::Complete(status_call(ctx).await)) })
            as BoxFuture<'_, _>
    }))
}

/// Whose principal a [`call_route`] reads before its handler runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallerRead {
    /// The caller is re-read from the principal store ([`Guarded::call`]).
    Resolved,
    /// The caller is known by name only; the handler reads the principal itself
    /// ([`Guarded::call_unread`]).
    NameOnly,
}

/// A dynamic route (`ToolRoute::new_dyn`) for `definition` whose handler takes the whole call
/// ([`ToolCall`]): for tools whose definitions are known only at run time (a proxy's upstream
/// tools) or that drive the protocol themselves. Serve it through [`LedgerGuard::router`] (or
/// [`LedgerGuard::router_unchecked`]) like any other route; a caller that cannot be resolved
/// is refused in-band before `handler` runs.
pub fn call_route<S, F, Fut>(
    definition: rmcp::model::Tool,
    read: CallerRead,
    handler: F,
) -> ToolRoute<S>
where
    S: Send + Sync + 'static,
    F: Fn(ToolCall) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<CallToolResponse, ErrorData>> + Send + 'static,
{
    let handler = Arc::new(handler);
    ToolRoute::new_dyn(definition, move |ctx: ToolCallContext<'_, S>| {
        let handler = handler.clone();
        let guarded = Guarded::take(ctx);
        Box::pin(async move {
            let g = guarded?;
            let call = match read {
                CallerRead::Resolved => g.call().await,
                CallerRead::NameOnly => g.call_unread(),
            };
            match call {
                Ok(call) => handler(call).await,
                Err(refusal) => refusal.into_call_tool_result(),
            }
        }) as BoxFuture<'_, _>
    })
}

/// The verified answers of a multi-round call: run the effect with them
/// ([`Guarded::run_rounds`], [`Guarded::begin_rounds`], or [`Guard::run_resumed`] /
/// [`Guard::begin_resumed`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Answered {
    /// The verified continuation: the deadlines the first round fixed and the fingerprint of
    /// the whole logical request (arguments, continuation state, answers).
    pub resumed: Resumed,
    /// The answers, shaped like `inputResponses`: one field per input request.
    pub answers: Value,
}

/// Where the rounds of a multi-round call stand ([`rounds`], [`Guarded::rounds`]).
#[derive(Clone, Debug)]
pub enum Rounds {
    /// Answer the client now: `input_required` asking for the inputs (MCP 2026-07-28), or
    /// what a replay of this operation answers (the stored result with `replayed: true`, or
    /// the deadline, `outcome_unknown` or `operation_in_progress` answer).
    Respond(CallToolResponse),
    /// Every input is answered: by a verified continuation (`requestState` and
    /// `inputResponses`), or, under the initialize lifecycle, by the client's answers to
    /// elicitation requests sent inside this call.
    Answered(Answered),
}

fn input_unsupported(name: &str) -> Error {
    Error::new(
        ErrorCode::ContinuationUnsupported,
        format!(
            "this tool needs input {name:?}, and the client did not declare the capability to \
             be asked for it; nothing was written"
        ),
    )
}

/// The rounds of one call of a multi-round tool, under both lifecycles:
///
/// - a continuation (`requestState` with `inputResponses`) is verified: this caller, tool,
///   operation id and arguments, unexpired ([`Guard::resume`]);
/// - `inputResponses` without `requestState` is `continuation_unsupported`;
/// - a first round for an operation the caller's scope already holds answers as a replay
///   would ([`Guard::replay_for_first_round`]: `known` is the intent the first round fixes,
///   the continuation's intent adds one field per input request, named as the request);
/// - otherwise, under MCP 2026-07-28 the inputs are asked for with `input_required` and a
///   sealed `requestState` ([`Guard::first_round`]); under the initialize lifecycle each is
///   asked inside this call with `elicitation/create` (form requests only), and the answers
///   continue at once with the fixed state `{step, mode: "elicitation"}`
///   ([`Guard::elicited`]), so a retried call with the same answers replays.
///
/// An input the client did not declare the capability for is never asked: the call is
/// `continuation_unsupported` and nothing is written.
pub async fn rounds(
    guard: &Guard,
    request: &GuardedRequest<'_>,
    call: &ToolCall,
    known: &JsonObject,
    step: &str,
    requests: Vec<(String, InputRequest)>,
) -> Result<Rounds, Error> {
    if let Some(state) = call.request_state.as_deref() {
        let answered = resume(guard, request, state, call.input_responses.as_ref())?;
        return Ok(Rounds::Answered(answered));
    }
    if call.input_responses.is_some() {
        return Err(Error::new(
            ErrorCode::ContinuationUnsupported,
            "input responses arrived without the requestState they answer; nothing was written",
        ));
    }
    ask_for(guard, request, call, known, step, requests).await
}

/// Verifies a continuation ([`Guard::resume`]) with its answers (none: an empty object).
fn resume(
    guard: &Guard,
    request: &GuardedRequest<'_>,
    state: &str,
    responses: Option<&InputResponses>,
) -> Result<Answered, Error> {
    let answers = Value::Object(responses.cloned().unwrap_or_default().into_iter().collect());
    let resumed = guard.resume(request, state, &answers)?;
    Ok(Answered { resumed, answers })
}

/// A round that asks for `requests` (whatever continuation the call carries): the replay
/// answer when the caller's scope holds the operation, else `input_required` (MCP
/// 2026-07-28) or elicitation inside the call (the initialize lifecycle).
async fn ask_for(
    guard: &Guard,
    request: &GuardedRequest<'_>,
    call: &ToolCall,
    known: &JsonObject,
    step: &str,
    requests: Vec<(String, InputRequest)>,
) -> Result<Rounds, Error> {
    let names: Vec<&str> = requests.iter().map(|(name, _)| name.as_str()).collect();
    if let Some(outcome) = guard.replay_for_first_round(request, known, &names).await? {
        return Ok(Rounds::Respond(CallToolResponse::Complete(
            CallToolResult::structured(outcome_json(request.operation_id, &outcome)),
        )));
    }
    if call.multi_round {
        let caps = call.client_capabilities.as_ref();
        if let Some((name, _)) = requests.iter().find(|(_, r)| !client_accepts(caps, r)) {
            return Err(input_unsupported(name));
        }
        let ir = guard.first_round(request, step, requests)?;
        return Ok(Rounds::Respond(CallToolResponse::InputRequired(ir)));
    }
    let mut answers = JsonObject::new();
    for (name, input) in requests {
        let peer = call.peer.as_ref().ok_or_else(|| input_unsupported(&name))?;
        let form = peer
            .supported_elicitation_modes()
            .contains(&rmcp::service::ElicitationMode::Form);
        let InputRequest::Elicitation(elicit) = input else {
            return Err(input_unsupported(&name));
        };
        if !form
            || !matches!(
                elicit.params,
                rmcp::model::ElicitRequestParams::FormElicitationParams { .. }
            )
        {
            return Err(input_unsupported(&name));
        }
        let answer = peer
            .create_elicitation(elicit.params)
            .await
            .map_err(|_| Error::unavailable(format!("the client did not answer {name:?}")))?;
        let answer = serde_json::to_value(&answer)
            .map_err(|_| Error::unavailable("the client's answer could not be read"))?;
        answers.insert(name, answer);
    }
    let answers = Value::Object(answers);
    let resumed = guard.elicited(request, step, &answers)?;
    Ok(Rounds::Answered(Answered { resumed, answers }))
}

impl Guarded {
    /// The rounds of this call of a multi-round tool, under either lifecycle: see [`rounds`].
    /// Answer [`Rounds::Respond`] as it is; run the effect of [`Rounds::Answered`] with
    /// [`Guarded::run_rounds`] (or [`Guarded::begin_rounds`] for a multi-step effect).
    pub async fn rounds(
        &self,
        operation_id: &str,
        known: Value,
        step: &str,
        requests: Vec<(String, InputRequest)>,
    ) -> Result<Rounds, Refusal> {
        self.rounds_of(operation_id, known, step, requests, true)
            .await
    }

    /// [`rounds`], or only its asking part ([`ask_for`]) when `continuation` is false.
    async fn rounds_of(
        &self,
        operation_id: &str,
        known: Value,
        step: &str,
        requests: Vec<(String, InputRequest)>,
        continuation: bool,
    ) -> Result<Rounds, Refusal> {
        check_operation_id(operation_id)?;
        let Value::Object(known) = known else {
            return Err(Refusal(Error::invalid(
                "a first round's intent must be an object",
            )));
        };
        let call = self.call_as(self.caller().await?);
        let contract = self.contract();
        let request = self.request(&call.caller, &contract, operation_id);
        let guard = self.scope.ledger.guard();
        Ok(if continuation {
            rounds(guard, &request, &call, &known, step, requests).await?
        } else {
            ask_for(guard, &request, &call, &known, step, requests).await?
        })
    }

    /// Runs the effect of answered rounds in one transaction with its ledger row; the exact
    /// continuation sent again (or the same answers elicited again) replays.
    pub async fn run_rounds<R: DeserializeOwned>(
        self,
        operation_id: &str,
        answered: &Answered,
        intent: Value,
        effect: impl InlineEffect,
    ) -> Result<Json<Receipt<R>>, Refusal> {
        let (caller, contract) = (self.caller().await?, self.contract());
        let request = self.request(&caller, &contract, operation_id);
        let outcome = self
            .scope
            .ledger
            .guard()
            .run_resumed(&request, &answered.resumed, intent, Arc::new(effect))
            .await?;
        receipt(operation_id, &outcome).map(Json)
    }

    /// Starts a multi-step effect of answered rounds: `first` commits with an `in_progress`
    /// ledger row. Finish the steps with [`Guarded::finish`] (`applied`, or `partial` after a
    /// failed later step and its compensation, every attempt as an event); a replay answers
    /// [`Begun::Replayed`].
    pub async fn begin_rounds(
        &self,
        operation_id: &str,
        answered: &Answered,
        intent: Value,
        first: impl InlineEffect,
    ) -> Result<Begun, Refusal> {
        let (caller, contract) = (self.caller().await?, self.contract());
        let request = self.request(&caller, &contract, operation_id);
        Ok(self
            .scope
            .ledger
            .guard()
            .begin_resumed(&request, &answered.resumed, intent, Arc::new(first))
            .await?)
    }

    /// Finishes a multi-step operation [`Guarded::begin_rounds`] started: `state` is
    /// `applied` or `partial`, `result` is stored and replayed, `events` (name, detail)
    /// record every later step and compensation.
    pub async fn finish(
        &self,
        operation_id: &str,
        begun: i64,
        state: toolledger::model::OperationState,
        result: Value,
        events: Vec<(String, Value)>,
    ) -> Result<Json<Receipt<Value>>, Refusal> {
        let outcome = self
            .scope
            .ledger
            .guard()
            .engine()
            .finish_steps(begun, state, result, events)
            .await?;
        receipt(operation_id, &outcome).map(Json)
    }
}

/// An inline effect that consumes its approval first, in the same transaction.
struct Approved<E> {
    inner: E,
    tool: String,
    operation_id: String,
    intent: Value,
    approval: Option<String>,
    now: i64,
}

impl<E: InlineEffect> InlineEffect for Approved<E> {
    fn authorize(&self, tx: &mut dyn EffectTx, principal: &Principal) -> Result<(), Error> {
        self.inner.authorize(tx, principal)
    }

    fn apply(&self, tx: &mut dyn EffectTx, principal: &Principal) -> Result<Value, Error> {
        let expected =
            ApprovalTarget::for_intent(principal, &self.tool, &self.operation_id, &self.intent)?;
        let mut resolve =
            |tx: &mut dyn EffectTx, name: &str| toolledger::authz::resolve_in(tx, name);
        approval::consume(
            tx,
            self.approval.as_deref(),
            &expected,
            self.now,
            None,
            &mut resolve,
        )?;
        self.inner.apply(tx, principal)
    }

    fn check_replay(
        &self,
        tx: &mut dyn EffectTx,
        principal: &Principal,
        record: &OperationRecord,
    ) -> Result<(), Error> {
        self.inner.check_replay(tx, principal, record)
    }
}
