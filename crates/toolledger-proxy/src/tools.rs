//! The tools the proxy serves: each upstream tool, guarded or passed through, and
//! `get_operation_status`.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    InputRequiredResult, JsonObject, ResultType, Tool,
};
use serde_json::{json, Map, Value};
use toolledger::authz::PrincipalStore;
use toolledger::engine::OperationRecord;
use toolledger::model::{Error, ErrorCode, OperationState, Principal};
use toolledger::outbox::{ClaimOutcome, EventState};
use toolledger::runtime::{
    Answer, DeferredCall, Delivery, Processed, ProviderContext, Runtime, StatusQuery,
};
use toolledger_mcp::guard::arguments_digest;
use toolledger_mcp::reply::{respond, tool_error, META_LEDGER};
use toolledger_mcp::server::BoxFuture;
use toolledger_mcp::{Caller, EffectObserver, Guard, Observation, StatusTool};
use toolledger_mcp::{StateBinding, StateSealer, ToolCall};

use crate::config::META_OPERATION_ID;
use crate::effect::{
    forwarding, upstream_result, CallScope, Captured, Continuation, ProxiedTool, UpstreamEffect,
};
use crate::upstream::{CallRoute, Upstream, UpstreamError};

/// The definition clients see for a guarded upstream tool: the upstream's, with the
/// operation id argument added (required, a string) unless the upstream declares it itself.
pub fn guarded_definition(upstream: &Tool, key_argument: &str) -> Tool {
    let mut tool = upstream.clone();
    let mut schema: JsonObject = upstream.input_schema.as_ref().clone();
    let properties = schema
        .entry("properties")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Value::Object(p) = properties {
        p.entry(key_argument.to_string()).or_insert_with(|| {
            json!({
                "type": "string",
                "minLength": 1,
                "maxLength": 256,
                "description": "Operation id: choose a new one per intended effect and reuse it \
                    on every retry of that effect; a retry replays the stored result."
            })
        });
        // Marks the key argument, so a key carried elsewhere (`_meta`,
        // `params.idempotencyKey`, the `Idempotency-Key` header) is read as this argument.
        if let Some(Value::Object(key)) = p.get_mut(key_argument) {
            key.insert(
                toolledger_mcp::carriers::KEY_KEYWORD.into(),
                Value::Bool(true),
            );
        }
    }
    let required = schema
        .entry("required")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(r) = required {
        if !r.iter().any(|v| v.as_str() == Some(key_argument)) {
            r.push(Value::String(key_argument.to_string()));
        }
    }
    tool.input_schema = Arc::new(schema);
    let note = format!(
        " (Guarded by toolledger: pass `{key_argument}`; a retry with the same value replays \
         the first answer; after a lost reply call get_operation_status.)"
    );
    let description = upstream.description.as_deref().unwrap_or("").to_string() + &note;
    tool.description = Some(description.trim_start().to_string().into());
    tool
}

/// The route of a passed-through `call`: its client, progress token and cancellation (a
/// cancelled pass-through is cancelled upstream too).
fn route(call: &ToolCall) -> CallRoute {
    CallRoute {
        cancelled: call.cancelled.clone(),
        step: "pass_through",
        ..guarded_route(call)
    }
}

/// The route of a guarded `call`'s forward: its client and progress token, and no
/// cancellation. Once sent, a forward runs to its recorded end whatever happens to the request
/// that asked for it (the client cancelled it, its connection dropped): a cancellation stops
/// the waiting, never the ledger's work, so a retry replays what the upstream answered instead
/// of finding the operation `outcome_unknown`. The call timeout still bounds it.
fn guarded_route(call: &ToolCall) -> CallRoute {
    let token = call.meta.as_ref().and_then(|m| m.get_progress_token());
    CallRoute {
        progress: token.and_then(|t| call.peer.clone().map(|p| (p, t))),
        cancelled: None,
        step: "forward",
    }
}

fn error_result(code: &str, message: &str, status_ref: Option<&str>) -> CallToolResult {
    let mut error = json!({"code": code, "message": message});
    if let Some(s) = status_ref {
        error["status_ref"] = json!(s);
    }
    CallToolResult::error(vec![ContentBlock::text(
        json!({ "error": error }).to_string(),
    )])
}

/// `result` as a complete result: an upstream on an older MCP version sends no `resultType`,
/// which clients of 2026-07-28 require (rmcp leaves it out again for older clients).
fn complete(mut result: CallToolResult) -> CallToolResult {
    result.result_type = Some(ResultType::COMPLETE);
    result
}

fn with_ledger_meta(
    mut result: CallToolResult,
    key: &str,
    status_ref: &str,
    replayed: bool,
    state: OperationState,
) -> CallToolResult {
    let mut meta = result.meta.take().unwrap_or_default();
    meta.insert(
        META_LEDGER.into(),
        json!({
            "operationId": key,
            "statusRef": status_ref,
            "replayed": replayed,
            "state": state.as_str(),
        }),
    );
    result.meta = Some(meta);
    complete(result)
}

/// The answer to a retry of an operation whose effect was confirmed without the upstream's
/// own answer (a reconcile lookup found it, or an operator confirmed it): stored as
/// `{confirmed: {by, lookup | operator, reason?, evidence}, mapped?}`.
///
/// - with `mapped` (the configured mapping of the lookup's answer, checked against the tool's
///   output schema when it was recorded): a success whose `structuredContent` is `mapped`;
/// - else, for a tool without an output schema: a success whose text says the effect happened
///   and whose `structuredContent` is `{effect_confirmed: true, confirmed}`;
/// - else (an output schema, no mapping): an error result with code `effect_confirmed`,
///   because no result conforming to the schema exists and clients validate successes
///   against it. Its message says the effect happened.
///
/// Every form carries the confirmation in `_meta["io.toolledger/confirmed"]`.
pub fn confirmed_reply(stored: &Value, output_schema: bool) -> Option<CallToolResult> {
    let confirmation = stored.get("confirmed")?;
    let who = match confirmation["by"].as_str() {
        Some("operator") => format!(
            "by operator {}",
            confirmation["operator"].as_str().unwrap_or("?")
        ),
        _ => format!(
            "by the upstream's lookup {}",
            confirmation["lookup"].as_str().unwrap_or("?")
        ),
    };
    let message = format!(
        "The effect of this call happened: it was confirmed {who} after the upstream's own \
         answer was lost. Do not call again under a new operation id."
    );
    let mut out = match stored.get("mapped") {
        Some(mapped) => {
            let mut r = CallToolResult::structured(mapped.clone());
            r.content = vec![ContentBlock::text(mapped.to_string())];
            r
        }
        None if output_schema => CallToolResult::error(vec![ContentBlock::text(
            json!({"error": {"code": "effect_confirmed", "message": message},
                   "confirmed": confirmation})
            .to_string(),
        )]),
        None => {
            let mut r = CallToolResult::structured(
                json!({"effect_confirmed": true, "confirmed": confirmation}),
            );
            r.content = vec![ContentBlock::text(format!(
                "{message} Evidence: {}",
                confirmation["evidence"]
            ))];
            r
        }
    };
    let mut meta = out.meta.take().unwrap_or_default();
    meta.insert("io.toolledger/confirmed".into(), confirmation.clone());
    out.meta = Some(meta);
    Some(out)
}

/// The client's answer for a runtime answer: the upstream's stored result as it was (with
/// the ledger's `_meta`), a confirmed effect ([`confirmed_reply`]; `output_schema`: whether
/// the tool declares one), an operator's failure as an error result, or `outcome_unknown`.
///
/// `_meta["io.toolledger/ledger"].replayed` is `false` only for the call that produced the
/// answer by forwarding (delivery `fresh`, or the unsure end of its own forward); every answer
/// from the ledger without a new forward — a stored result, an operation in progress, an
/// unknown outcome a retry finds — is `true` ([`unknown_reply`] says which for an unknown
/// outcome). An `Answer::Unknown` given here is taken as found by a retry.
pub fn reply(key: &str, answer: &Answer, output_schema: bool) -> CallToolResult {
    if let Answer::Unknown { .. } = answer {
        return unknown_reply(key, answer, output_schema, true);
    }
    match answer {
        Answer::Done {
            status_ref,
            state,
            delivery,
            result,
        } => {
            let out = upstream_result(result)
                .or_else(|| confirmed_reply(result, output_schema))
                .unwrap_or_else(|| {
                    let code = result["code"].as_str().unwrap_or("failed");
                    let message = result["message"].as_str().unwrap_or("the operation failed");
                    error_result(code, message, Some(status_ref))
                });
            with_ledger_meta(out, key, status_ref, *delivery != Delivery::Fresh, *state)
        }
        Answer::Unknown { .. } => unknown_reply(key, answer, output_schema, true),
    }
}

/// The `outcome_unknown` error result for `answer` (an [`Answer::Unknown`]); `replayed`:
/// whether it comes from the ledger (a retry of an operation already unsure) rather than from
/// this call's own forward. Any other answer is given [`reply`].
pub fn unknown_reply(
    key: &str,
    answer: &Answer,
    output_schema: bool,
    replayed: bool,
) -> CallToolResult {
    let Answer::Unknown { status_ref, state } = answer else {
        return reply(key, answer, output_schema);
    };
    with_ledger_meta(
        error_result(
            ErrorCode::OutcomeUnknown.as_str(),
            "the upstream may or may not have acted on this operation; call \
             get_operation_status with its operation id, or an operator settles it",
            Some(status_ref),
        ),
        key,
        status_ref,
        replayed,
        *state,
    )
}

/// A guarded upstream tool: every call is one deferred operation of the ledger.
pub struct GuardedForward {
    definition: Tool,
    tool: Arc<ProxiedTool>,
    runtime: Runtime,
    sealer: StateSealer,
}

impl GuardedForward {
    /// The guarded form of `upstream` (its definition), run by `runtime` (whose registry
    /// holds `tool`).
    /// Its continuations' `requestState` is sealed with `sealer`.
    pub fn new(
        upstream: &Tool,
        tool: Arc<ProxiedTool>,
        runtime: Runtime,
        sealer: StateSealer,
    ) -> Self {
        GuardedForward {
            definition: guarded_definition(upstream, &tool.policy().key_argument),
            tool,
            runtime,
            sealer,
        }
    }

    fn output_schema(&self) -> bool {
        self.definition.output_schema.is_some()
    }

    /// The operation id of a call, and its upstream arguments (the id removed unless the
    /// upstream declares it).
    fn split(&self, call: &ToolCall) -> Result<(String, Value), Error> {
        let name = &self.tool.policy().key_argument;
        let mut arguments = call.arguments.clone();
        let from_meta = call
            .meta
            .as_ref()
            .and_then(|m| m.get(META_OPERATION_ID))
            .cloned();
        let key = match (arguments.get(name), from_meta) {
            (Some(v), _) => v.clone(),
            (None, Some(v)) => v,
            (None, None) => {
                return Err(Error::invalid(format!(
                    "{name} is required: the operation id, as this argument, \
                     _meta[\"io.toolledger/operation_id\"], params.idempotencyKey or the \
                     Idempotency-Key header"
                )))
            }
        };
        let key = match key {
            Value::String(s) if !s.is_empty() && s.chars().count() <= 256 => s,
            _ => {
                return Err(Error::invalid(format!(
                    "{name} must be 1 to 256 characters"
                )))
            }
        };
        if !self.tool.declares_key() {
            arguments.remove(name);
        }
        Ok((key, Value::Object(arguments)))
    }

    /// What this call carries down to its forward: its route, the client's capabilities
    /// (when it can answer `input_required`) and, for a continuation, the upstream's state
    /// unsealed from ours.
    async fn scope(
        &self,
        call: &ToolCall,
        key: &str,
        arguments: &Value,
    ) -> Result<CallScope, Error> {
        let continuation = match (&call.request_state, &call.input_responses) {
            (None, None) => None,
            (Some(token), Some(responses)) => {
                let p = &self.principal(call).await?;
                let binding = self.sealer.open(
                    token,
                    &p.tenant,
                    &p.subject,
                    &self.definition.name,
                    key,
                    self.runtime.clock().now(),
                )?;
                let digest = arguments_digest(arguments.as_object().unwrap_or(&Map::new()))?;
                if binding.args_digest != digest || binding.step != CONTINUE_STEP {
                    return Err(Error::new(
                        ErrorCode::RequestStateInvalid,
                        "the continuation state is invalid, expired or not yours",
                    ));
                }
                Some(Continuation {
                    input_responses: responses.clone().into_iter().collect(),
                    upstream_state: binding.upstream_state,
                })
            }
            _ => {
                return Err(Error::invalid(
                    "a continuation sends both requestState and inputResponses",
                ))
            }
        };
        Ok(CallScope {
            route: guarded_route(call),
            capabilities: call
                .multi_round
                .then(|| call.client_capabilities.clone())
                .flatten(),
            continuation,
        })
    }

    /// The upstream's request for input, passed to the client with the proxy's own sealed
    /// `requestState` (binding the caller, tool, operation id and arguments, and carrying the
    /// upstream's state).
    async fn ask(
        &self,
        call: &ToolCall,
        key: &str,
        arguments: &Value,
        asked: InputRequiredResult,
    ) -> Result<CallToolResponse, Error> {
        if !call.multi_round {
            return Err(Error::new(
                ErrorCode::ContinuationUnsupported,
                "the upstream asks for more input, which this client's MCP version cannot \
                 answer; nothing was done",
            ));
        }
        let p = &self.principal(call).await?;
        let now = self.runtime.clock().now();
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).map_err(|_| Error::unavailable("no randomness"))?;
        let policy = self.tool.policy();
        let binding = StateBinding {
            tenant: p.tenant.clone(),
            subject: p.subject.clone(),
            tool: self.definition.name.to_string(),
            operation_id: key.to_string(),
            args_digest: arguments_digest(arguments.as_object().unwrap_or(&Map::new()))?,
            nonce: nonce.iter().map(|b| format!("{b:02x}")).collect(),
            step: CONTINUE_STEP.into(),
            issued_at: now,
            authority_deadline: now.saturating_add(policy.authority_ttl_seconds),
            retention_deadline: now.saturating_add(policy.retention_ttl_seconds),
            upstream_state: asked.request_state.clone(),
        };
        let token = self.sealer.seal(&binding)?;
        let mut out = asked;
        out.request_state = Some(token);
        Ok(CallToolResponse::InputRequired(out))
    }

    /// The caller's principal, read now (the server left it unread: see
    /// [`toolledger_mcp::CallerRead::NameOnly`]); needed only to seal or open a continuation's state.
    async fn principal(&self, call: &ToolCall) -> Result<Principal, Error> {
        PrincipalStore::new(self.runtime.store().clone())
            .resolve(&call.caller.name)
            .await?
            .ok_or_else(toolledger_mcp::caller::revoked)
    }

    /// Handles one call in a task of its own, so that the forward and its record run to their
    /// end even when the request's own task is dropped (its connection closed, its client
    /// cancelled it): the caller stops waiting, the ledger does not ([`GuardedForward::answer`]).
    pub async fn run(self: Arc<Self>, call: ToolCall) -> Result<CallToolResponse, ErrorData> {
        // The task continues the request's trace: its forward's span is the request's child.
        let answer = toolledger_mcp::trace::in_current(async move { self.answer(call).await });
        match tokio::spawn(answer).await {
            Ok(answer) => answer,
            Err(_) => Err(ErrorData::internal_error(
                "the call ended without an answer",
                None,
            )),
        }
    }

    /// Answers one call. The caller comes by name only ([`CallerRead::NameOnly`]): the
    /// runtime reads the principal in the snapshot it examines the operation in (and again
    /// when it records an intent), so a read of the principal store before the call would be
    /// a second read, and a second hand-off to the store's reader threads, per call.
    pub async fn answer(&self, call: ToolCall) -> Result<CallToolResponse, ErrorData> {
        let outcome = async {
            let (key, arguments) = self.split(&call)?;
            let scope = self.scope(&call, &key, &arguments).await?;
            let deferred = DeferredCall {
                new_intent: toolledger_mcp::carriers::new_intent(call.meta.as_ref()),
                principal: call.caller.name.clone(),
                tool: self.definition.name.to_string(),
                provider: ProviderContext::mcp(&key),
                key,
                arguments,
                approval_id: None,
            };
            // The principal is read (and its scopes checked) by the runtime, in the snapshot
            // it reads the operation in.
            let (answer, captured, sent) =
                forwarding(scope.clone(), self.runtime.dispatch(&deferred, None)).await;
            let (key, arguments) = (&deferred.key, &deferred.arguments);
            let settled = match captured {
                Captured::Protocol(rpc) => return Ok(Err(rpc)),
                Captured::InputRequired(asked) => {
                    return Ok(Ok(self.ask(&call, key, arguments, asked).await?))
                }
                Captured::NotSent(why) => Settled::NotSent(why),
                Captured::Nothing => self.settle(&deferred, answer?, scope, sent).await?,
            };
            Ok(match settled {
                Settled::Answer(r) => Ok(CallToolResponse::Complete(r)),
                Settled::Protocol(rpc) => Err(rpc),
                Settled::Asked(asked) => Ok(self.ask(&call, key, arguments, asked).await?),
                Settled::NotSent(why) => Ok(CallToolResponse::Complete(not_sent(key, &why))),
            })
        }
        .await;
        match outcome {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(rpc)) => Err(rpc),
            Err(e) => respond(Err(e)),
        }
    }

    /// The answer to give for `answer`: an unfinished operation whose event is unclaimed is
    /// forwarded now (nothing was sent for it yet: its intent committed and the process that
    /// accepted it stopped, or the upstream asked for input and this call brings it); one
    /// under a live lease is `operation_in_progress`; one that another call of the same
    /// operation finished meanwhile is replayed; the JSON-RPC error of this call's own forward
    /// goes back unchanged.
    ///
    /// `sent`: whether this call's dispatch forwarded. An answer this call did not forward
    /// for is answered from the ledger and says `replayed: true` (see [`reply`]).
    async fn settle(
        &self,
        deferred: &DeferredCall,
        answer: Answer,
        scope: CallScope,
        sent: bool,
    ) -> Result<Settled, Error> {
        let key = deferred.key.as_str();
        let Answer::Unknown { status_ref, state } = &answer else {
            return Ok(Settled::Answer(reply(key, &answer, self.output_schema())));
        };
        if matches!(state, OperationState::Accepted | OperationState::Processing) {
            if let Some(event) = self.runtime.event_of(status_ref).await? {
                let now = self.runtime.clock().now();
                let in_progress = || {
                    let r = error_result(
                        ErrorCode::OperationInProgress.as_str(),
                        "the upstream is working on this operation now; retry later with the \
                         same operation id",
                        Some(status_ref),
                    );
                    Ok(Settled::Answer(with_ledger_meta(
                        r, key, status_ref, true, *state,
                    )))
                };
                // Read after this call's own look at the operation: a concurrent call of the
                // same operation may have claimed it, or finished it, in between.
                let again = if event.state == EventState::Pending && event.attempt_count == 0 {
                    let owner = format!("proxy-{}", std::process::id());
                    let (processed, captured, forwarded) =
                        forwarding(scope, self.runtime.process(event.id, &owner, None)).await;
                    match captured {
                        Captured::Protocol(rpc) => return Ok(Settled::Protocol(rpc)),
                        Captured::InputRequired(asked) => return Ok(Settled::Asked(asked)),
                        Captured::NotSent(why) => return Ok(Settled::NotSent(why)),
                        Captured::Nothing => {}
                    }
                    match processed? {
                        Processed::Delivered(a) => Some(a),
                        Processed::Unknown(a) => {
                            return Ok(Settled::Answer(unknown_reply(
                                key,
                                &a,
                                self.output_schema(),
                                !forwarded,
                            )))
                        }
                        Processed::NotClaimed(ClaimOutcome::Leased { until }) if until > now => {
                            return in_progress()
                        }
                        Processed::NotClaimed(ClaimOutcome::Finished { .. }) => {
                            Some(self.runtime.dispatch(deferred, None).await?)
                        }
                        Processed::NotClaimed(_) => None,
                    }
                } else if event.state == EventState::Processing
                    && event.lease_until.is_some_and(|u| u > now)
                {
                    return in_progress();
                } else if event.state == EventState::Delivered {
                    Some(self.runtime.dispatch(deferred, None).await?)
                } else {
                    None
                };
                if let Some(again) = again {
                    if !matches!(again, Answer::Unknown { .. }) {
                        return Ok(Settled::Answer(reply(key, &again, self.output_schema())));
                    }
                }
            }
        }
        // Still `accepted`: the intent is recorded and no forward is claimed or in flight, so
        // nothing was sent; the next retry forwards it.
        if *state == OperationState::Accepted {
            return Ok(Settled::NotSent(
                "the upstream was not called for this operation".into(),
            ));
        }
        let unknown = Answer::Unknown {
            status_ref: status_ref.clone(),
            state: if *state == OperationState::Processing {
                OperationState::OutcomeUnknown
            } else {
                *state
            },
        };
        Ok(Settled::Answer(unknown_reply(
            key,
            &unknown,
            self.output_schema(),
            !sent,
        )))
    }
}

/// How [`GuardedForward::settle`] ended.
enum Settled {
    /// A tool result for the client.
    Answer(CallToolResult),
    /// The upstream's JSON-RPC error, unchanged.
    Protocol(ErrorData),
    /// The upstream asked for input.
    Asked(InputRequiredResult),
    /// The forward never reached the upstream.
    NotSent(String),
}

/// The answer to a call whose forward never reached the upstream: `unavailable`, retryable
/// under the same operation id (nothing was sent, nothing is unsure; the next call forwards).
fn not_sent(key: &str, why: &str) -> CallToolResult {
    let mut r = tool_error(&Error::unavailable(format!(
        "{why}; nothing happened: retry later with the same operation id"
    )));
    let mut meta = r.meta.take().unwrap_or_default();
    meta.insert(
        META_LEDGER.into(),
        json!({"operationId": key, "replayed": false, "state": OperationState::Accepted.as_str(),
               "retryable": true}),
    );
    r.meta = Some(meta);
    complete(r)
}

/// The `step` of the proxy's sealed continuation state.
const CONTINUE_STEP: &str = "proxy-upstream-round";

impl GuardedForward {
    /// The definition clients see ([`guarded_definition`]).
    pub fn definition(&self) -> Tool {
        self.definition.clone()
    }
}

/// An upstream tool passed through unguarded (read-only tools, by default).
pub struct Passthrough {
    definition: Tool,
    upstream: Arc<Upstream>,
    timeout: std::time::Duration,
    /// Scopes the caller must hold: checked on this route as on a guarded one, so an upstream
    /// that marks a scoped tool read-only (or task-required) cannot lift its scopes.
    required_scopes: Vec<String>,
}

impl Passthrough {
    /// `tool` of `upstream`, forwarded as it is called by a caller holding every one of
    /// `required_scopes`, with at most `timeout` per call.
    pub fn new(
        tool: &Tool,
        upstream: Arc<Upstream>,
        timeout: std::time::Duration,
        required_scopes: Vec<String>,
    ) -> Self {
        Passthrough {
            definition: tool.clone(),
            upstream,
            timeout,
            required_scopes,
        }
    }
}

impl Passthrough {
    /// The upstream's definition, unchanged.
    pub fn definition(&self) -> Tool {
        self.definition.clone()
    }

    /// Forwards one call as it is, once the caller is known to hold the tool's scopes
    /// (the principal is read for this call: [`toolledger_mcp::CallerRead::Resolved`]).
    pub async fn call(&self, call: ToolCall) -> Result<CallToolResponse, ErrorData> {
        // Refused as a guarded tool refuses it: the same answer as for a tool the caller
        // may not see.
        if self
            .required_scopes
            .iter()
            .any(|s| !call.caller.principal.has_scope(s))
        {
            return respond(Err(Error::not_found()));
        }
        {
            let route = route(&call);
            let mut params = CallToolRequestParams::new(self.definition.name.clone());
            params.arguments = Some(call.arguments);
            params.request_state = call.request_state;
            params.input_responses = call.input_responses;
            match self.upstream.call_tool(params, self.timeout, &route).await {
                Ok(CallToolResponse::Complete(result)) => {
                    Ok(CallToolResponse::Complete(complete(result)))
                }
                Ok(answer) => Ok(answer),
                Err(UpstreamError::Protocol(rpc)) => Err(rpc),
                Err(e) => {
                    tracing::warn!(target: "toolledger::proxy", tool = %self.definition.name,
                        error = %e.detail(), "a passed-through call got no answer");
                    Ok(CallToolResponse::Complete(tool_error(&Error::unavailable(
                        e.to_string(),
                    ))))
                }
            }
        }
    }
}

/// One guarded tool as the status tool sees it: its runtime and its upstream effect.
pub struct StatusEntry {
    /// The tool's contract and policy.
    pub tool: Arc<ProxiedTool>,
    /// Its runtime.
    pub runtime: Runtime,
    /// Its upstream effect (the reconcile lookup).
    pub effect: Arc<UpstreamEffect>,
}

impl StatusEntry {
    fn name(&self) -> String {
        toolledger::runtime::DeferredTool::contract(self.tool.as_ref()).name
    }
}

/// What a proxied operation's effect is, as far as the ledger knows: the stored upstream
/// answer is the whole record (there are no effect rows of ours to compare it with).
struct StoredAnswer;

impl EffectObserver for StoredAnswer {
    fn observe<'a>(
        &'a self,
        record: &'a OperationRecord,
    ) -> BoxFuture<'a, Result<Observation, Error>> {
        Box::pin(async move {
            Ok(Observation {
                matching_ids: Vec::new(),
                consistent: true,
                stored_result: record.result.clone().unwrap_or(Value::Null),
            })
        })
    }
}

/// `get_operation_status` over the guarded tools: the ledger's status answer, after the
/// tool's reconcile lookup (when configured) had its chance to settle an unsure operation.
/// A tool whose required scopes the caller no longer holds is not looked in: its operations
/// are as invisible as another principal's.
pub struct ProxyStatus {
    guard: Guard,
    entries: Vec<StatusEntry>,
}

impl ProxyStatus {
    /// The status tool over the guarded tools of `entries`, reading the ledger through `guard`.
    pub fn new(guard: Guard, entries: Vec<StatusEntry>) -> Self {
        ProxyStatus { guard, entries }
    }

    fn visible(&self, caller: &Caller) -> Vec<&StatusEntry> {
        self.entries
            .iter()
            .filter(|e| {
                e.tool
                    .policy()
                    .required_scopes
                    .iter()
                    .all(|s| caller.principal.has_scope(s))
            })
            .collect()
    }

    /// Runs the reconcile lookup of the caller's unsure operation `key` under each visible
    /// guarded tool (or only `tool`), recording what it finds through the runtime's status
    /// query.
    async fn reconcile(&self, caller: &Caller, key: &str, tool: Option<&str>) {
        for entry in self.visible(caller) {
            let name = entry.name();
            if tool.is_some_and(|t| t != name) {
                continue;
            }
            let row = self
                .guard
                .engine()
                .lookup(
                    &caller.principal.tenant,
                    &caller.principal.subject,
                    &name,
                    key,
                )
                .await;
            let Ok(Some(row)) = row else {
                continue;
            };
            if matches!(
                row.state,
                OperationState::Succeeded | OperationState::Failed | OperationState::Accepted
            ) {
                return;
            }
            let Ok(Some(record)) = entry.runtime.inspect(&row.status_ref).await else {
                return;
            };
            let Some(seen) = entry.effect.look_up(&record).await else {
                return;
            };
            if let Err(e) = self
                .guard
                .engine()
                .record_event(row.id, "reconcile_lookup", seen.event_detail())
                .await
            {
                tracing::warn!(target: "toolledger::proxy", status_ref = %record.status_ref,
                    error = %e, "the reconcile lookup's answer was not recorded");
            }
            if seen.found {
                let query = StatusQuery {
                    principal: caller.name.clone(),
                    tool: name.clone(),
                    key: key.to_string(),
                    arguments: record.arguments.clone(),
                    provider: ProviderContext::mcp(key),
                    status_ref: record.status_ref.clone(),
                };
                if let Err(e) = entry.runtime.status(&query).await {
                    tracing::warn!(target: "toolledger::proxy", status_ref = %record.status_ref,
                        error = %e, "the reconcile lookup's receipt was not recorded");
                }
            }
            return;
        }
    }
}

impl ProxyStatus {
    /// Answers one `get_operation_status` call.
    pub async fn call(&self, call: ToolCall) -> Result<CallToolResponse, ErrorData> {
        {
            if let Ok((key, tool)) = StatusTool::arguments(&call.arguments) {
                self.reconcile(&call.caller, &key, tool.as_deref()).await;
            }
            let observed: Vec<(String, Arc<dyn EffectObserver>)> = self
                .visible(&call.caller)
                .into_iter()
                .map(|e| (e.name(), Arc::new(StoredAnswer) as Arc<dyn EffectObserver>))
                .collect();
            StatusTool::new(self.guard.clone(), observed)
                .call(call)
                .await
        }
    }
}
