//! OpenTelemetry spans of the ledger's work outside a request: a worker's deliveries, an
//! operator's resolutions, prune passes; and the trace context handed to an external call.
//!
//! Through the OpenTelemetry API only: spans go to the process's global tracer provider, and
//! without one (a program that installs no SDK) each is a no-op. Never recorded: an operation
//! id (the idempotency key), anything derived from it, argument values or results; an
//! operation is named by its opaque status reference (`toolledger.status_ref`).

use std::collections::BTreeMap;

use opentelemetry::propagation::Injector;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{global, Context, KeyValue};

/// The instrumentation scope of the spans this crate makes (the same as the MCP crate's).
const TRACER: &str = "toolledger";

/// Starts a span `name` of `kind` under the current context, with `attributes`; its context.
pub(crate) fn start(name: &'static str, kind: SpanKind, attributes: Vec<KeyValue>) -> Context {
    let tracer = global::tracer(TRACER);
    let span = tracer
        .span_builder(name)
        .with_kind(kind)
        .with_attributes(attributes)
        .start_with_context(&tracer, &Context::current());
    Context::current_with_span(span)
}

/// Sets the attribute `make` builds on the current span, built only when that span is
/// recorded (a call that nothing traces allocates nothing here).
pub(crate) fn set(make: impl FnOnce() -> KeyValue) {
    let cx = Context::current();
    let span = cx.span();
    if span.is_recording() {
        span.set_attribute(make());
    }
}

/// Sets `attribute` on the span of `cx` (when it is recorded).
pub(crate) fn set_on(cx: &Context, attribute: KeyValue) {
    let span = cx.span();
    if span.is_recording() {
        span.set_attribute(attribute);
    }
}

/// Ends the span of `cx`, marked an error of `error_type` when there is one.
pub(crate) fn end(cx: &Context, error_type: Option<String>) {
    let span = cx.span();
    if let Some(error) = error_type {
        span.set_attribute(KeyValue::new("error.type", error));
        span.set_status(Status::error(""));
    }
    span.end();
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Injector for Fields<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_string(), value);
    }
}

/// The current trace context as the process's propagators write it (`traceparent`,
/// `tracestate`, `baggage`): what an outgoing request carries to continue the trace. Empty
/// when nothing traces.
pub(crate) fn current_fields() -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    global::get_text_map_propagator(|p| {
        p.inject_context(&Context::current(), &mut Fields(&mut fields))
    });
    fields
}
