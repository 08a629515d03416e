//! Traces: the OpenTelemetry SDK and its OTLP exporter over HTTP/protobuf, configured by the
//! standard `OTEL_*` variables ([`init_traces`]).

/// The variables any one of which turns trace export on.
pub const TRACE_ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// How long the process waits at its end for the spans still queued to be sent.
pub const TRACE_FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The process's trace export, shut down (its queue flushed, within [`TRACE_FLUSH_TIMEOUT`])
/// when dropped.
pub struct Traces(opentelemetry_sdk::trace::SdkTracerProvider);

impl Drop for Traces {
    fn drop(&mut self) {
        let _ = self.0.shutdown_with_timeout(TRACE_FLUSH_TIMEOUT);
    }
}

fn env_set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.trim().is_empty())
}

/// Turns traces on when the standard OpenTelemetry variables ask for them: an OTLP endpoint
/// (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, or `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`),
/// unless `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. Spans go over OTLP
/// HTTP/protobuf (`OTEL_EXPORTER_OTLP_PROTOCOL` other than `http/protobuf` is refused with a
/// warning), batched on a thread of the SDK's own with a bounded queue (`OTEL_BSP_*`): a
/// collector that is down or slow costs a logged error per failed batch and dropped spans,
/// never a call's time or answer. The sampler is `OTEL_TRACES_SAMPLER` (default
/// `parentbased_always_on`), the service `OTEL_SERVICE_NAME` (default `toolledger`), more
/// resource attributes `OTEL_RESOURCE_ATTRIBUTES`, headers (an API key) `OTEL_EXPORTER_OTLP_HEADERS`.
///
/// W3C trace context (`traceparent`, `tracestate`, `baggage`) is read from requests and
/// passed upstream whether or not spans are exported: a caller's trace continues through a
/// proxy that exports nothing. `version` is the service's `service.version`. Call it after
/// [`init_logs`](super::init_logs), outside the async runtime; keep the answer until the
/// command ends.
pub fn init_traces(version: &'static str) -> Option<Traces> {
    use opentelemetry::propagation::TextMapCompositePropagator;
    use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
    opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ]));
    if !TRACE_ENDPOINT_VARS.iter().any(|v| env_set(v))
        || std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.trim() == "none")
    {
        return None;
    }
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Ok(p) = std::env::var(var) {
            if p.trim() != "http/protobuf" {
                tracing::warn!(target: "toolledger::traces", variable = var, protocol = %p,
                    "traces are not exported: only the http/protobuf protocol is supported");
                return None;
            }
            break;
        }
    }
    // An https endpoint's TLS: the one provider of the binary (a second install is refused,
    // which is fine: the first was this one).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(target: "toolledger::traces", error = %e, "traces are not exported");
            return None;
        }
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    let named = env_set("OTEL_SERVICE_NAME")
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    if !named {
        resource = resource.with_service_name("toolledger");
    }
    let resource = resource
        .with_attribute(opentelemetry::KeyValue::new("service.version", version))
        .build();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    Some(Traces(provider))
}
