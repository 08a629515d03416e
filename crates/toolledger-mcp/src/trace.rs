//! OpenTelemetry spans of the MCP requests a guarded server answers, following the MCP
//! semantic conventions (OpenTelemetry's GenAI conventions, status: development).
//!
//! Every `tools/call` that reaches a route wrapped by [`crate::LedgerGuard::router`] is one
//! span of kind `SERVER` (a [`crate::GuardedServer`]'s `tools/list` one named `tools/list`), named `tools/call {tool}`, with `mcp.method.name`,
//! `gen_ai.tool.name`, `gen_ai.operation.name = execute_tool`, `jsonrpc.request.id`,
//! `mcp.protocol.version`, `network.transport` (`pipe` on stdio, `tcp` over HTTP),
//! `error.type` (`tool_error` for an `isError` result, the JSON-RPC error code of an error
//! answer, which `rpc.response.status_code` also carries) and what the ledger did:
//! `toolledger.outcome` (`executed`, `replayed`, `conflict`, `unknown`,
//! `possible_duplicate`, `refused`), `toolledger.error_code` (the in-band refusal's code) and
//! `toolledger.status_ref` (the operation's opaque status reference, which `toolledger
//! operations show` takes). The ledger's steps are the span's events (`toolledger.accept`,
//! `toolledger.record`, `toolledger.replay`, `toolledger.conflict`, `toolledger.status`) or,
//! for a call the proxy makes upstream, a child span of kind `CLIENT` ([`client_span`]).
//!
//! Never recorded: the operation id (the idempotency key), anything derived from it, argument
//! values, results, tokens, and `mcp.session.id` (a session id lets whoever reads it act in
//! that session; MCP 2026-07-28 has none).
//!
//! The caller's trace continues: W3C `traceparent`, `tracestate` and `baggage` are read from
//! the request's `_meta` (unprefixed keys) and, when it has none, from the HTTP request's
//! headers, through the process's global propagator. Spans go to the process's global tracer
//! provider: without one (a program that installs no OpenTelemetry SDK) each is a no-op that
//! costs a few allocations-free calls, and attributes are only computed for a span that is
//! recorded.

use std::future::Future;

use opentelemetry::context::{FutureExt as _, WithContext};
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{global, Context, KeyValue};
use rmcp::model::{CallToolResponse, ErrorData, JsonObject, RequestMetaObject};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde_json::Value;
use toolledger::model::ErrorCode;

/// The instrumentation scope's name of every span this crate and the proxy make.
pub const TRACER: &str = "toolledger";

/// The W3C trace context fields, as they travel in `_meta` and in HTTP headers.
const FIELDS: [&str; 3] = ["traceparent", "tracestate", "baggage"];

struct MetaFields<'a>(&'a JsonObject);

impl Extractor for MetaFields<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.as_str()
    }

    fn keys(&self) -> Vec<&str> {
        FIELDS
            .into_iter()
            .filter(|k| self.0.contains_key(*k))
            .collect()
    }
}

struct HeaderFields<'a>(&'a http::HeaderMap);

impl Extractor for HeaderFields<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        FIELDS
            .into_iter()
            .filter(|k| self.0.contains_key(*k))
            .collect()
    }
}

struct MetaInjector<'a>(&'a mut JsonObject);

impl Injector for MetaInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_string(), Value::String(value));
    }
}

/// The caller's context: the trace context in `meta`, else in `headers` (an HTTP request's),
/// else the current one.
pub fn caller_context(meta: &JsonObject, headers: Option<&http::HeaderMap>) -> Context {
    if meta.contains_key(FIELDS[0]) {
        return global::get_text_map_propagator(|p| p.extract(&MetaFields(meta)));
    }
    match headers {
        Some(h) if h.contains_key(FIELDS[0]) => {
            global::get_text_map_propagator(|p| p.extract(&HeaderFields(h)))
        }
        _ => Context::current(),
    }
}

/// Writes the current context (its span, trace state and baggage) into `meta`, for a request
/// this process sends: the receiver's spans become children of the current span. Nothing is
/// written when there is no valid current span.
pub fn inject_meta(meta: &mut RequestMetaObject) {
    let cx = Context::current();
    if !cx.span().span_context().is_valid() {
        return;
    }
    global::get_text_map_propagator(|p| p.inject_context(&cx, &mut MetaInjector(&mut meta.0 .0)));
}

/// `f` run with the current context attached: what a task spawned for the current request
/// (the proxy's forward) runs, so its spans are the request's children.
pub fn in_current<F: Future>(f: F) -> WithContext<F> {
    f.with_context(Context::current())
}

/// `f` run with `cx` attached.
pub fn in_context<F: Future>(cx: &Context, f: F) -> WithContext<F> {
    f.with_context(cx.clone())
}

/// An event named `name` on the current span (nothing when it is not recorded).
pub fn event(name: &'static str) {
    Context::map_current(|cx| {
        let span = cx.span();
        if span.is_recording() {
            span.add_event(name, Vec::new());
        }
    });
}

/// A `CLIENT` span for a request this process sends to another MCP server, child of the
/// current span: `tools/call {tool}` with `toolledger.step` = `step` (`forward`: the
/// guarded call itself; `reconcile`: the reconcile lookup; `pass_through`). Run the request
/// with the returned context attached ([`in_context`]), so [`inject_meta`] hands this span to
/// the receiver, and end it with [`end_client`], which also records the request's duration in
/// the conventions' histogram `mcp.client.operation.duration` (seconds; `mcp.method.name`,
/// `gen_ai.tool.name`, `gen_ai.operation.name`, `error.type` when it failed) through the
/// process's meter provider (a no-op without one).
pub fn client_span(step: &'static str, tool: &str) -> Context {
    let parent = Context::current();
    let tracer = global::tracer(TRACER);
    let mut span = tracer
        .span_builder("tools/call")
        .with_kind(SpanKind::Client)
        .start_with_context(&tracer, &parent);
    if span.is_recording() {
        span.update_name(format!("tools/call {tool}"));
        span.set_attributes([
            KeyValue::new("mcp.method.name", "tools/call"),
            KeyValue::new("gen_ai.tool.name", tool.to_string()),
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("toolledger.step", step),
        ]);
    }
    parent.with_span(span).with_value(ClientCall {
        tool: tool.to_string(),
        started: std::time::Instant::now(),
    })
}

/// What [`end_client`] needs to record a [`client_span`]'s duration.
struct ClientCall {
    tool: String,
    started: std::time::Instant,
}

/// `mcp.client.operation.duration`, made on first use (after the program installed its meter
/// provider).
fn client_duration() -> &'static opentelemetry::metrics::Histogram<f64> {
    static HISTOGRAM: std::sync::OnceLock<opentelemetry::metrics::Histogram<f64>> =
        std::sync::OnceLock::new();
    HISTOGRAM.get_or_init(|| {
        global::meter(TRACER)
            .f64_histogram("mcp.client.operation.duration")
            .with_unit("s")
            .with_description("The duration of the MCP requests the process sent")
            .build()
    })
}

/// Ends a [`client_span`]: `error` names what went wrong (`tool_error` for an `isError`
/// result, a JSON-RPC error code, `timeout`, `not_sent`, `transport`), `None` for a success.
pub fn end_client(cx: &Context, error: Option<&str>) {
    if let Some(call) = cx.get::<ClientCall>() {
        let mut attributes = vec![
            KeyValue::new("mcp.method.name", "tools/call"),
            KeyValue::new("gen_ai.tool.name", call.tool.clone()),
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
        ];
        if let Some(e) = error {
            attributes.push(KeyValue::new("error.type", e.to_string()));
        }
        client_duration().record(call.started.elapsed().as_secs_f64(), &attributes);
    }
    let span = cx.span();
    if let Some(e) = error.filter(|_| span.is_recording()) {
        span.set_attribute(KeyValue::new("error.type", e.to_string()));
        span.set_status(Status::error(e.to_string()));
    }
    span.end();
}

/// The span of one `tools/call` of `tool` this server answers, child of the caller's context
/// ([`caller_context`]); the context holding it, to run the call in and to [`finish`].
pub(crate) fn tool_call(tool: &str, ctx: &RequestContext<RoleServer>) -> Context {
    request("tools/call", Some(tool), ctx)
}

/// The span of one request of `method` (with the tool it names, if any) this server answers;
/// a request other than `tools/call` ends with [`end`].
pub(crate) fn request(
    method: &'static str,
    tool: Option<&str>,
    ctx: &RequestContext<RoleServer>,
) -> Context {
    let headers = ctx
        .extensions
        .get::<http::request::Parts>()
        .map(|p| &p.headers);
    let parent = caller_context(&ctx.meta, headers);
    let tracer = global::tracer(TRACER);
    let mut span = tracer
        .span_builder(method)
        .with_kind(SpanKind::Server)
        .start_with_context(&tracer, &parent);
    if span.is_recording() {
        if let Some(tool) = tool {
            span.update_name(format!("{method} {tool}"));
            span.set_attributes([
                KeyValue::new("gen_ai.tool.name", tool.to_string()),
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
            ]);
        }
        span.set_attributes([
            KeyValue::new("mcp.method.name", method),
            KeyValue::new("jsonrpc.request.id", ctx.id.to_string()),
            KeyValue::new(
                "network.transport",
                if headers.is_some() { "tcp" } else { "pipe" },
            ),
        ]);
        if let Some(v) = ctx.protocol_version() {
            span.set_attribute(KeyValue::new(
                "mcp.protocol.version",
                v.as_str().to_string(),
            ));
        }
    }
    parent.with_span(span)
}

/// Ends the span of [`request`] in `cx`.
pub(crate) fn end(cx: &Context) {
    cx.span().end();
}

/// What the ledger did for one answer, by the conventions' and the ledger's vocabulary.
#[derive(Debug, Default, PartialEq, Eq)]
struct Reading {
    outcome: Option<&'static str>,
    error_type: Option<String>,
    rpc_code: Option<String>,
    error_code: Option<String>,
    status_ref: Option<String>,
    /// The operation's state, as a status query answered it.
    state: Option<String>,
}

fn read(response: &Result<CallToolResponse, ErrorData>, status_query: bool) -> Reading {
    let result = match response {
        Err(e) => {
            let code = e.code.0.to_string();
            return Reading {
                outcome: (!status_query).then_some("refused"),
                error_type: Some(code.clone()),
                rpc_code: Some(code),
                ..Reading::default()
            };
        }
        Ok(CallToolResponse::Complete(result)) => result,
        // A first round (`input_required`) or a task: nothing was done yet.
        Ok(_) => return Reading::default(),
    };
    let is_error = result.is_error == Some(true);
    let structured = result.structured_content.as_ref().unwrap_or(&Value::Null);
    let ledger = result
        .meta
        .as_ref()
        .and_then(|m| m.get(crate::reply::META_LEDGER));
    let error = is_error
        .then(|| {
            let text = &result.content.first()?.as_text()?.text;
            serde_json::from_str::<Value>(text).ok()
        })
        .flatten();
    let error = error.as_ref().map(|e| &e["error"]);
    let code = error.and_then(|e| e["code"].as_str());
    let replayed = ledger.is_some_and(|l| l["replayed"] == Value::Bool(true))
        || structured["replayed"] == Value::Bool(true)
        || structured["delivery"] == "local_replay";
    let outcome = if status_query {
        None
    } else {
        Some(
            match code.and_then(|c| ErrorCode::ALL.into_iter().find(|k| k.as_str() == c)) {
                Some(ErrorCode::OperationConflict) => "conflict",
                Some(ErrorCode::OutcomeUnknown | ErrorCode::OperationInProgress) => "unknown",
                Some(ErrorCode::PossibleDuplicate) => "possible_duplicate",
                Some(_) => "refused",
                None if replayed => "replayed",
                // An effect that ran now and answered an error (a stored failure).
                None if ledger.is_some() => "executed",
                None if is_error => "refused",
                None => "executed",
            },
        )
    };
    let status_ref = ledger
        .and_then(|l| l["statusRef"].as_str())
        .or_else(|| structured["status_ref"].as_str())
        .or_else(|| structured["statusRef"].as_str())
        .or_else(|| error.and_then(|e| e["status_ref"].as_str()))
        .map(str::to_string);
    Reading {
        outcome,
        error_type: is_error.then(|| "tool_error".to_string()),
        rpc_code: None,
        error_code: code.map(str::to_string),
        status_ref,
        state: status_query
            .then(|| structured["state"].as_str().map(str::to_string))
            .flatten(),
    }
}

/// Ends the span of [`tool_call`] in `cx` with what `response` says; `status_query`: the
/// call was `get_operation_status` (no outcome of its own; its answer's state is recorded).
pub(crate) fn finish(
    cx: &Context,
    response: &Result<CallToolResponse, ErrorData>,
    status_query: bool,
) {
    let span = cx.span();
    if span.is_recording() {
        let r = read(response, status_query);
        let mut attributes = Vec::with_capacity(6);
        if let Some(o) = r.outcome {
            attributes.push(KeyValue::new("toolledger.outcome", o));
        }
        if let Some(c) = &r.rpc_code {
            attributes.push(KeyValue::new("rpc.response.status_code", c.clone()));
        }
        if let Some(c) = r.error_code {
            attributes.push(KeyValue::new("toolledger.error_code", c));
        }
        if let Some(s) = r.status_ref {
            attributes.push(KeyValue::new("toolledger.status_ref", s));
        }
        if let Some(s) = r.state {
            attributes.push(KeyValue::new("toolledger.operation.state", s));
        }
        if let Some(e) = &r.error_type {
            attributes.push(KeyValue::new("error.type", e.clone()));
        }
        span.set_attributes(attributes);
        if let Some(e) = r.error_type {
            span.set_status(Status::error(e));
        }
        let step = match (status_query, r.outcome) {
            (true, _) => Some("toolledger.status"),
            (_, Some("executed")) => Some("toolledger.record"),
            (_, Some("replayed")) => Some("toolledger.replay"),
            (_, Some("conflict")) => Some("toolledger.conflict"),
            _ => None,
        };
        if let Some(step) = step {
            span.add_event(step, Vec::new());
        }
    }
    span.end();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::{tool_error, tool_ok};
    use serde_json::json;
    use toolledger::model::Error;

    #[test]
    fn outcomes_follow_the_ledger_and_never_name_a_replay_executed() {
        let ok = |v: Value| Ok(CallToolResponse::Complete(tool_ok(v)));
        let fresh = read(&ok(json!({"operationId": "k", "replayed": false})), false);
        assert_eq!(fresh.outcome, Some("executed"));
        assert_eq!(fresh.error_type, None);
        let replay = read(&ok(json!({"operationId": "k", "replayed": true})), false);
        assert_eq!(replay.outcome, Some("replayed"));
        let conflict = Ok(CallToolResponse::Complete(tool_error(&Error::new(
            ErrorCode::OperationConflict,
            "no",
        ))));
        let r = read(&conflict, false);
        assert_eq!(r.outcome, Some("conflict"));
        assert_eq!(r.error_type.as_deref(), Some("tool_error"));
        assert_eq!(r.error_code.as_deref(), Some("operation_conflict"));
        let rpc = Err(ErrorData::invalid_params("bad", None));
        let r = read(&rpc, false);
        assert_eq!(r.outcome, Some("refused"));
        assert_eq!(r.rpc_code.as_deref(), Some("-32602"));
        assert_eq!(read(&rpc, true).outcome, None);
    }
}
