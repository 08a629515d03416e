//! A guarded upstream tool as a deferred effect of the ledger's runtime.
//!
//! [`ProxiedTool`] is the tool's contract and checks ([`DeferredTool`]); [`UpstreamEffect`] is
//! its downstream ([`Downstream`]): `submit` forwards the call to the upstream, `status` runs
//! the configured read-only lookup. Every guarantee is the runtime's: the intent is committed
//! (transaction A) before anything is sent, the forward runs under a claimed lease with a
//! fencing token, the upstream's definitive answer is stored (transaction C) and replayed.
//!
//! The stored result is `{"upstream": <the tool result's JSON>}`, or, for a result the
//! ledger's canonical JSON would not keep as it is (a number with a fraction or an exponent,
//! say), `{"upstream_text": "<its JSON text>"}`; either way a replay gives the client the
//! upstream's content as it was.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ErrorData,
    InputRequiredResult, InputResponses, Tool,
};
use serde_json::{json, Map, Value};
use toolledger::downstream::{BoxFuture, Downstream, DownstreamError};
use toolledger::effect::EffectTx;
use toolledger::model::{Error, Principal, Scope, ToolContract};
use toolledger::runtime::{bound_receipt, downstream_request, DeferredRecord, DeferredTool};

use crate::config::{Forward, ToolPolicy, META_OPERATION_ID};
use crate::upstream::{CallRoute, Upstream, UpstreamError};

/// The effect revision of every tool the proxy guards: how the ledger tells a proxied
/// operation from others.
pub const EFFECT_REVISION: &str = "proxy-forward-1";

/// The revision of a schema as a contract records it: the first 16 hex digits of the SHA-256
/// of its canonical JSON (`null` for a tool without an output schema).
pub fn revision(value: &Value) -> String {
    let text = toolledger::json::canonical_string(value).unwrap_or_else(|_| value.to_string());
    toolledger::digest::sha256_hex(text.as_bytes())[..16].to_string()
}

/// Whether `v` holds a number written with a fraction or an exponent (`1.0`, `2.5`): the
/// canonical form would rewrite or refuse it, so such a result is stored as its text.
fn has_float(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.is_f64(),
        Value::Array(a) => a.iter().any(has_float),
        Value::Object(o) => o.values().any(has_float),
        _ => false,
    }
}

/// The stored form of an upstream tool result (see the module docs).
pub fn stored_result(result: &CallToolResult) -> Value {
    let value = serde_json::to_value(result).unwrap_or(Value::Null);
    if !has_float(&value) && toolledger::json::canonical_string(&value).is_ok() {
        json!({ "upstream": value })
    } else {
        json!({ "upstream_text": value.to_string() })
    }
}

/// The upstream tool result a stored result holds, if it holds one (an operator's
/// resolution stores `{code, message}` instead).
pub fn upstream_result(stored: &Value) -> Option<CallToolResult> {
    if let Some(v) = stored.get("upstream") {
        // Read in place: a replay does not copy the stored result before decoding it.
        return serde::Deserialize::deserialize(v).ok();
    }
    let text = stored.get("upstream_text")?.as_str()?;
    serde_json::from_str(text).ok()
}

/// A guarded upstream tool's contract and checks.
pub struct ProxiedTool {
    contract: ToolContract,
    policy: ToolPolicy,
    /// The upstream's input schema, compiled; `None` when it does not compile (the upstream
    /// still checks its arguments).
    validator: Option<jsonschema::Validator>,
    /// Whether the upstream declares the key argument itself (then it is forwarded).
    declares_key: bool,
    /// The upstream's output schema, compiled, when it declares one that compiles.
    output: Option<Arc<jsonschema::Validator>>,
}

impl ProxiedTool {
    /// The guarded form of upstream tool `tool` under `policy`.
    pub fn new(tool: &Tool, policy: ToolPolicy) -> Self {
        let input = Value::Object(tool.input_schema.as_ref().clone());
        let output = tool
            .output_schema
            .as_ref()
            .map(|s| Value::Object(s.as_ref().clone()))
            .unwrap_or(Value::Null);
        let policy_rev = revision(&json!({
            "forward": format!("{:?}", policy.forward),
            "key": policy.key_argument,
            "scopes": policy.required_scopes,
        }));
        let contract = ToolContract {
            name: tool.name.to_string(),
            input_rev: revision(&input),
            output_rev: revision(&output),
            effect_rev: EFFECT_REVISION.into(),
            handler_rev: EFFECT_REVISION.into(),
            producer_rev: EFFECT_REVISION.into(),
            policy_rev,
        };
        let declares_key = input
            .pointer("/properties")
            .and_then(Value::as_object)
            .is_some_and(|p| p.contains_key(&policy.key_argument));
        let validator = match jsonschema::validator_for(&input) {
            Ok(v) => Some(v),
            Err(_) => {
                tracing::warn!(target: "toolledger::proxy", tool = %tool.name,
                    "the upstream's input schema does not compile; arguments are not checked \
                     before they are recorded");
                None
            }
        };
        let output = tool
            .output_schema
            .as_ref()
            .and_then(|s| jsonschema::validator_for(&Value::Object(s.as_ref().clone())).ok())
            .map(Arc::new);
        ProxiedTool {
            contract,
            policy,
            validator,
            declares_key,
            output,
        }
    }

    /// The tool's settings.
    pub fn policy(&self) -> &ToolPolicy {
        &self.policy
    }

    /// Whether the upstream declares the operation id argument itself.
    pub fn declares_key(&self) -> bool {
        self.declares_key
    }

    fn scopes(&self, principal: &Principal) -> Result<(), Error> {
        match self
            .policy
            .required_scopes
            .iter()
            .find(|s| !principal.has_scope(s))
        {
            Some(s) => Err(Error::denied(format!("the caller lacks the scope {s}"))),
            None => Ok(()),
        }
    }
}

impl DeferredTool for ProxiedTool {
    fn contract(&self) -> ToolContract {
        self.contract.clone()
    }

    fn validate(&self, arguments: &Value) -> Result<Value, Error> {
        let Value::Object(map) = arguments else {
            return Err(Error::invalid("arguments must be an object"));
        };
        if let Err(e) = toolledger::json::canonical_string(arguments) {
            return Err(Error::invalid(format!("arguments {}", e.message)));
        }
        if let Some(v) = &self.validator {
            toolledger_mcp::guarded::check_arguments(v, map)?;
        }
        Ok(arguments.clone())
    }

    fn check_access(
        &self,
        _tx: &mut dyn EffectTx,
        principal: &Principal,
        _arguments: &Value,
    ) -> Result<(), Error> {
        self.scopes(principal)
    }

    fn accept_receipt(&self, _arguments: &Value, receipt: &Value) -> Result<Value, Error> {
        let result = receipt
            .get("result")
            .cloned()
            .ok_or_else(|| Error::invalid("the receipt carries no result"))?;
        if result.get("upstream").is_none()
            && result.get("upstream_text").is_none()
            && result.get("confirmed").is_none()
        {
            return Err(Error::invalid(
                "the receipt's result is not an upstream result",
            ));
        }
        Ok(result)
    }
}

/// What one reconcile lookup saw, recorded on the operation as a `reconcile_lookup` event
/// ([`Lookup::event_detail`]) so an operator sees the last answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Lookup {
    /// The lookup tool.
    pub lookup: String,
    /// Whether the answer is evidence of the effect.
    pub found: bool,
    /// The lookup's tool result (absent when the lookup failed).
    pub answer: Option<Value>,
    /// What kept the lookup from deciding, or from building the tool's result.
    pub problem: Option<String>,
}

/// The most bytes of a lookup's answer an event keeps; a larger one is kept as its shape.
pub const MAX_RECORDED_ANSWER_BYTES: usize = 16 * 1024;

impl Lookup {
    /// The event's detail: `{lookup, found, answer | answer_shape, problem?}`.
    pub fn event_detail(&self) -> Value {
        let mut d = json!({"lookup": self.lookup, "found": self.found});
        if let Some(answer) = &self.answer {
            match toolledger::json::canonical_string(answer) {
                Ok(text) if text.len() <= MAX_RECORDED_ANSWER_BYTES => d["answer"] = answer.clone(),
                _ => d["answer_shape"] = json!(shape(answer)),
            }
        }
        if let Some(p) = &self.problem {
            d["problem"] = json!(p);
        }
        d
    }
}

/// Values handed from one step of a call to a later one by status ref, taken once: the
/// receipt a reconcile lookup found, which the runtime's status query then records.
#[derive(Clone)]
pub struct Handoff<T>(Arc<Mutex<HashMap<String, T>>>);

impl<T> Default for Handoff<T> {
    fn default() -> Self {
        Handoff(Arc::new(Mutex::new(HashMap::new())))
    }
}

impl<T> Handoff<T> {
    fn put(&self, status_ref: &str, value: T) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(status_ref.to_string(), value);
        }
    }

    /// The value left for `status_ref`, if any (taken).
    pub fn take(&self, status_ref: &str) -> Option<T> {
        self.0.lock().ok()?.remove(status_ref)
    }
}

/// A continuation round of a multi-round call: what the client answered and the upstream's
/// own `requestState` for the round.
#[derive(Clone, Debug)]
pub struct Continuation {
    /// The client's `inputResponses`.
    pub input_responses: InputResponses,
    /// The upstream's `requestState` (unsealed from the proxy's own).
    pub upstream_state: Option<String>,
}

/// What one client call carries down to the forward it may make.
#[derive(Clone, Debug, Default)]
pub struct CallScope {
    /// The client's progress token and cancellation.
    pub route: CallRoute,
    /// The capabilities the client declared, passed on to a 2026-07-28 upstream so it may ask
    /// for input; `None` for clients that cannot answer `input_required`.
    pub capabilities: Option<ClientCapabilities>,
    /// The round this call continues, if it is a continuation.
    pub continuation: Option<Continuation>,
}

/// What came back up from the forward besides the runtime's answer.
#[derive(Debug, Default)]
pub enum Captured {
    /// Nothing: the runtime's answer says it all.
    #[default]
    Nothing,
    /// The upstream's JSON-RPC error: back to this caller unchanged, never stored.
    Protocol(ErrorData),
    /// The upstream asked for input and did not act; the event was given back.
    InputRequired(InputRequiredResult),
    /// The forward never reached the upstream; the event was given back uncounted. What the
    /// caller may be told (no address, no internal names).
    NotSent(String),
}

struct Forwarding {
    scope: CallScope,
    captured: std::cell::RefCell<Captured>,
    /// Whether this call's dispatch forwarded (sent, or began to send, the call upstream).
    sent: std::cell::Cell<bool>,
}

tokio::task_local! {
    static FORWARD: Forwarding;
}

/// Runs `f` (a dispatch that may forward) for a client call described by `scope`, and returns
/// what its own forward left besides the answer, and whether it forwarded at all (`false`:
/// the answer came from the ledger alone). Only the call whose forward it was sees it; a
/// concurrent retry of the same operation does not.
pub async fn forwarding<F: std::future::Future>(
    scope: CallScope,
    f: F,
) -> (F::Output, Captured, bool) {
    let forwarding = Forwarding {
        scope,
        captured: std::cell::RefCell::new(Captured::Nothing),
        sent: std::cell::Cell::new(false),
    };
    FORWARD
        .scope(forwarding, async {
            let out = f.await;
            let (captured, sent) =
                FORWARD.with(|c| (std::mem::take(&mut *c.captured.borrow_mut()), c.sent.get()));
            (out, captured, sent)
        })
        .await
}

/// The downstream of a guarded upstream tool: the upstream itself.
pub struct UpstreamEffect {
    upstream: Arc<Upstream>,
    tool: String,
    policy: ToolPolicy,
    declares_key: bool,
    evidence: Handoff<Value>,
    /// The tool's output schema, compiled (a mapped reconcile result is checked against it).
    output: Option<Arc<jsonschema::Validator>>,
}

/// The shape of a JSON value for a log line: its member names and types, never its values.
pub fn shape(v: &Value) -> String {
    fn walk(v: &Value, depth: usize, out: &mut String) {
        match v {
            Value::Object(o) if depth < 3 => {
                out.push('{');
                for (i, (k, x)) in o.iter().take(12).enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(k);
                    out.push(':');
                    walk(x, depth + 1, out);
                }
                out.push('}');
            }
            Value::Object(_) => out.push_str("object"),
            Value::Array(a) => out.push_str(&format!("array[{}]", a.len())),
            Value::String(_) => out.push_str("string"),
            Value::Number(_) => out.push_str("number"),
            Value::Bool(_) => out.push_str("bool"),
            Value::Null => out.push_str("null"),
        }
    }
    let mut out = String::new();
    walk(v, 0, &mut out);
    out
}

impl std::fmt::Debug for UpstreamEffect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamEffect")
            .field("tool", &self.tool)
            .finish_non_exhaustive()
    }
}

impl UpstreamEffect {
    /// Forwards of `tool` to `upstream`.
    pub fn new(upstream: Arc<Upstream>, tool: &ProxiedTool) -> Self {
        UpstreamEffect {
            upstream,
            tool: tool.contract.name.clone(),
            policy: tool.policy.clone(),
            declares_key: tool.declares_key,
            evidence: Handoff::default(),
            output: tool.output.clone(),
        }
    }

    /// Runs the tool's reconcile lookup for the operation `record` (`None` when none is
    /// configured) and says what it saw. With evidence of the effect, its receipt is left for
    /// the runtime's next status query of this operation, which records it (transaction C)
    /// as the result.
    pub async fn look_up(&self, record: &DeferredRecord) -> Option<Lookup> {
        let reconcile = self.policy.reconcile.as_ref()?;
        let mut params = CallToolRequestParams::new(reconcile.tool.clone());
        params.arguments = Some(reconcile.arguments_for(&record.downstream_key));
        let mut seen = Lookup {
            lookup: reconcile.tool.clone(),
            found: false,
            answer: None,
            problem: None,
        };
        let answer = match self
            .upstream
            .call_tool(
                params,
                self.timeout(),
                &CallRoute {
                    step: "reconcile",
                    ..CallRoute::default()
                },
            )
            .await
        {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(target: "toolledger::proxy", status_ref = %record.status_ref,
                    error = %e.detail(), "the reconcile lookup failed");
                seen.problem = Some(format!("the lookup failed: {e}"));
                return Some(seen);
            }
        };
        let CallToolResponse::Complete(result) = answer else {
            seen.problem = Some("the lookup asked for input; a lookup cannot be answered".into());
            return Some(seen);
        };
        let answer = serde_json::to_value(&result).unwrap_or(Value::Null);
        seen.answer = Some(answer.clone());
        if !reconcile.pointer_resolves(&answer) {
            let found_when = reconcile.found_when.as_deref().unwrap_or("");
            tracing::warn!(target: "toolledger::proxy", status_ref = %record.status_ref,
                tool = %self.tool, lookup = %reconcile.tool, found_when,
                answer_shape = %shape(&answer),
                "the reconcile rule's found_when pointer resolves to nothing in the lookup's \
                 answer: the rule cannot find the effect; check the configuration");
            seen.problem = Some(format!(
                "found_when {found_when} resolves to nothing in the answer, shaped {}",
                shape(&answer)
            ));
            return Some(seen);
        }
        if !reconcile.is_evidence(&answer) {
            tracing::info!(target: "toolledger::proxy", status_ref = %record.status_ref,
                tool = %self.tool, lookup = %reconcile.tool, "reconcile lookup found no effect");
            return Some(seen);
        }
        let evidence = if toolledger::json::canonical_string(&answer).is_ok() {
            answer.clone()
        } else {
            json!({ "text": answer.to_string() })
        };
        let mut stored = json!({
            "confirmed": {"by": "lookup", "lookup": reconcile.tool, "evidence": evidence},
        });
        match reconcile.map_result(&answer) {
            None => {}
            Some(Ok(mapped)) => match self.conforms(&mapped) {
                Ok(()) => stored["mapped"] = mapped,
                Err(why) => {
                    tracing::warn!(target: "toolledger::proxy",
                        status_ref = %record.status_ref, tool = %self.tool, why = %why,
                        "the reconcile rule's result does not conform to the tool's output \
                         schema; retries are told the effect happened without it");
                    seen.problem = Some(format!(
                        "the mapped result does not conform to the output schema ({why})"
                    ));
                }
            },
            Some(Err(why)) => {
                tracing::warn!(target: "toolledger::proxy",
                    status_ref = %record.status_ref, tool = %self.tool, why = %why.0,
                    answer_shape = %shape(&answer),
                    "the reconcile rule's result mapping does not fit the lookup's answer");
                seen.problem = Some(format!("the result mapping does not fit: {}", why.0));
            }
        }
        let request = downstream_request(record);
        self.evidence
            .put(&record.status_ref, receipt(&request, stored));
        tracing::info!(target: "toolledger::proxy", status_ref = %record.status_ref,
            tool = %self.tool, lookup = %reconcile.tool, "reconcile lookup found the effect");
        seen.found = true;
        Some(seen)
    }

    /// Whether `mapped` conforms to the tool's output schema (anything does without one).
    fn conforms(&self, mapped: &Value) -> Result<(), String> {
        match &self.output {
            Some(v) => v
                .validate(mapped)
                .map_err(|e| format!("at {}: {}", e.instance_path(), e)),
            None => Ok(()),
        }
    }

    /// The forward of one call: `arguments` with the operation's upstream key (see
    /// [`upstream_key`]) where the policy sends it — as an argument, in `_meta`, or as the
    /// upstream's own key argument.
    fn params(&self, key: &str, arguments: &Value) -> CallToolRequestParams {
        let mut args: Map<String, Value> = arguments.as_object().cloned().unwrap_or_default();
        let mut params = CallToolRequestParams::new(self.tool.clone());
        match &self.policy.forward {
            Forward::No => {}
            Forward::Argument(name) => {
                args.insert(name.clone(), Value::String(key.to_string()));
            }
            Forward::Meta => {
                let mut meta = rmcp::model::RequestMetaObject::default();
                meta.insert(META_OPERATION_ID.into(), Value::String(key.to_string()));
                params.meta = Some(meta);
            }
        }
        if self.declares_key {
            args.insert(
                self.policy.key_argument.clone(),
                Value::String(key.to_string()),
            );
        }
        params.arguments = Some(args);
        params
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.policy.call_timeout_seconds)
    }
}

/// The key an operation is known by upstream: the forwarded operation id, the value of the
/// upstream's own key argument, and what a reconcile lookup's `{operation_id}` stands for. It
/// is the operation's scope digest (the `downstream_key` of `toolledger operations show`):
/// the SHA-256 of the whole idempotency scope — tenant, subject, tool and the caller's key —
/// so two tenants' (or two subjects') `order-42` are two keys upstream, and it is the same
/// after restarts and on every host of the ledger. Never the caller's raw key.
pub fn upstream_key(scope: &Scope, request: &Value) -> String {
    request["scope_digest"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| toolledger::downstream::scope_digest(scope))
}

/// The receipt of a forward: the runtime's generic bindings plus the stored result.
fn receipt(request: &Value, result: Value) -> Value {
    let id = format!("upstream-{}", request["status_ref"].as_str().unwrap_or(""));
    bound_receipt(request, &id, result)
}

impl Downstream for UpstreamEffect {
    fn submit<'a>(
        &'a self,
        scope: &'a Scope,
        request: &'a Value,
    ) -> BoxFuture<'a, Result<Value, DownstreamError>> {
        Box::pin(async move {
            let key = upstream_key(scope, request);
            let mut params = self.params(&key, &request["arguments"]);
            let call = FORWARD
                .try_with(|f| {
                    f.sent.set(true);
                    f.scope.clone()
                })
                .unwrap_or_default();
            // The intent and this forward's claim are committed: the forward follows.
            toolledger_mcp::trace::event("toolledger.accept");
            if let Some(c) = &call.continuation {
                params.input_responses = Some(c.input_responses.clone());
                params.request_state = c.upstream_state.clone();
            }
            let capture = |what: Captured| {
                let _ = FORWARD.try_with(|c| *c.captured.borrow_mut() = what);
            };
            let answer = self
                .upstream
                .call_tool_as(
                    params,
                    self.timeout(),
                    &call.route,
                    call.capabilities.as_ref(),
                )
                .await;
            match answer {
                Ok(CallToolResponse::Complete(result)) => {
                    let stored = stored_result(&result);
                    if result.is_error == Some(true) {
                        Err(DownstreamError::Failed { result: stored })
                    } else {
                        Ok(receipt(request, stored))
                    }
                }
                Ok(CallToolResponse::InputRequired(r)) => {
                    // The upstream did not act yet: the event goes back for the next round.
                    capture(Captured::InputRequired(r));
                    Err(DownstreamError::Continue)
                }
                Ok(_) => Err(DownstreamError::Rejected(
                    "the upstream started a task; the proxy forwards calls that answer in place"
                        .into(),
                )),
                Err(UpstreamError::Protocol(e)) => {
                    capture(Captured::Protocol(e));
                    Err(DownstreamError::Rejected(
                        "the upstream answered with a JSON-RPC error".into(),
                    ))
                }
                Err(e) if e.not_sent() => {
                    capture(Captured::NotSent(e.to_string()));
                    Err(DownstreamError::NotSent(e.detail()))
                }
                Err(e) => Err(DownstreamError::Unavailable(e.detail())),
            }
        })
    }

    fn status<'a>(
        &'a self,
        status_ref: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, DownstreamError>> {
        // The lookup needs the operation's key and request, which the status ref alone does
        // not carry: [`UpstreamEffect::look_up`] ran it before this query and left what it
        // found. Nothing left: no evidence either way.
        let found = self.evidence.take(status_ref);
        Box::pin(async move { Ok(found) })
    }
}
