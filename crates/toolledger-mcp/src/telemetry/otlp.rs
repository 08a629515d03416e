//! Traces and the MCP conventions' metrics: the OpenTelemetry SDK and its OTLP exporters over
//! HTTP/protobuf, configured by the standard `OTEL_*` variables ([`init_traces`]).

/// The variables any one of which turns trace export on.
pub const TRACE_ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The variables any one of which turns metric export on (with the traces' switches).
pub const METRIC_ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// How long the process waits at its end for the spans still queued to be sent.
pub const TRACE_FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The process's OTLP export (traces, and the metrics when they are exported too), shut down
/// when dropped: the spans still queued and the metrics' last readings are sent, within
/// [`TRACE_FLUSH_TIMEOUT`] each.
pub struct Traces {
    traces: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
    metrics: Option<opentelemetry_sdk::metrics::SdkMeterProvider>,
}

impl Drop for Traces {
    fn drop(&mut self) {
        if let Some(t) = &self.traces {
            let _ = t.shutdown_with_timeout(TRACE_FLUSH_TIMEOUT);
        }
        if let Some(m) = &self.metrics {
            let _ = m.shutdown_with_timeout(TRACE_FLUSH_TIMEOUT);
        }
    }
}

/// The propagators `OTEL_PROPAGATORS` names (a comma-separated list; unset or empty:
/// `tracecontext,baggage`), in order, of the ones this build has: `tracecontext` and `baggage`;
/// `none` anywhere means none. The others it names (`b3`, `jaeger`, …) are returned apart.
fn propagator_names(value: Option<&str>) -> (Vec<&'static str>, Vec<String>) {
    let value = value.map(str::trim).filter(|v| !v.is_empty());
    let mut kept = Vec::new();
    let mut unknown = Vec::new();
    for name in value.unwrap_or("tracecontext,baggage").split(',') {
        match name.trim() {
            "" => {}
            "none" => return (Vec::new(), Vec::new()),
            "tracecontext" if !kept.contains(&"tracecontext") => kept.push("tracecontext"),
            "baggage" if !kept.contains(&"baggage") => kept.push("baggage"),
            "tracecontext" | "baggage" => {}
            other => unknown.push(other.to_string()),
        }
    }
    (kept, unknown)
}

/// Installs the process's propagators from `OTEL_PROPAGATORS` ([`propagator_names`]); a
/// propagator this build does not have is named in a warning and left out.
fn install_propagators() {
    use opentelemetry::propagation::{TextMapCompositePropagator, TextMapPropagator};
    use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
    let value = std::env::var("OTEL_PROPAGATORS").ok();
    let (kept, unknown) = propagator_names(value.as_deref());
    for name in unknown {
        tracing::warn!(target: "toolledger::traces", propagator = %name,
            "OTEL_PROPAGATORS names a propagator this build does not have (it has tracecontext and baggage); left out");
    }
    let propagators: Vec<Box<dyn TextMapPropagator + Send + Sync>> = kept
        .into_iter()
        .map(|name| -> Box<dyn TextMapPropagator + Send + Sync> {
            match name {
                "tracecontext" => Box::new(TraceContextPropagator::new()),
                _ => Box::new(BaggagePropagator::new()),
            }
        })
        .collect();
    opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(propagators));
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
/// proxy that exports nothing. `OTEL_PROPAGATORS` chooses among `tracecontext` and `baggage`
/// (both by default; `none` turns propagation off); another name is warned of and left out. `version` is the service's `service.version`. Call it after
/// [`init_logs`](super::init_logs), outside the async runtime; keep the answer until the
/// command ends.
pub fn init_traces(version: &'static str) -> Option<Traces> {
    install_propagators();
    let off = |exporter: &str| {
        std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"))
            || std::env::var(exporter).is_ok_and(|v| v.trim() == "none")
    };
    let traces = TRACE_ENDPOINT_VARS.iter().any(|v| env_set(v)) && !off("OTEL_TRACES_EXPORTER");
    let metrics = METRIC_ENDPOINT_VARS.iter().any(|v| env_set(v)) && !off("OTEL_METRICS_EXPORTER");
    if !traces && !metrics {
        return None;
    }
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Ok(p) = std::env::var(var) {
            if p.trim() != "http/protobuf" {
                tracing::warn!(target: "toolledger::traces", variable = var, protocol = %p,
                    "traces and metrics are not exported: only the http/protobuf protocol is supported");
                return None;
            }
        }
    }
    // An https endpoint's TLS: the one provider of the binary (a second install is refused,
    // which is fine: the first was this one).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut resource = opentelemetry_sdk::Resource::builder();
    let named = env_set("OTEL_SERVICE_NAME")
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    if !named {
        resource = resource.with_service_name("toolledger");
    }
    let resource = resource
        .with_attribute(opentelemetry::KeyValue::new("service.version", version))
        .build();
    let export = Traces {
        traces: traces.then(|| tracer_provider(resource.clone())).flatten(),
        metrics: metrics.then(|| meter_provider(resource)).flatten(),
    };
    (export.traces.is_some() || export.metrics.is_some()).then_some(export)
}

/// The tracer provider exporting over OTLP, installed as the process's; `None` (warned of)
/// when the exporter cannot be built.
fn tracer_provider(
    resource: opentelemetry_sdk::Resource,
) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
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
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    Some(provider)
}

/// The meter provider exporting over OTLP every `OTEL_METRIC_EXPORT_INTERVAL` (60 s by
/// default) on a thread of the SDK's own, installed as the process's; `None` (warned of) when
/// the exporter cannot be built.
fn meter_provider(
    resource: opentelemetry_sdk::Resource,
) -> Option<opentelemetry_sdk::metrics::SdkMeterProvider> {
    let exporter = match opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(target: "toolledger::traces", error = %e, "metrics are not exported over OTLP");
            return None;
        }
    };
    let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
        .with_periodic_exporter(exporter)
        .with_resource(resource)
        .build();
    opentelemetry::global::set_meter_provider(provider.clone());
    Some(provider)
}

#[cfg(test)]
mod tests {
    use super::propagator_names;

    #[test]
    fn otel_propagators_chooses_among_tracecontext_and_baggage() {
        let both = (vec!["tracecontext", "baggage"], Vec::<String>::new());
        assert_eq!(propagator_names(None), both);
        assert_eq!(propagator_names(Some(" ")), both);
        assert_eq!(
            propagator_names(Some("baggage")),
            (vec!["baggage"], Vec::<String>::new())
        );
        assert_eq!(
            propagator_names(Some("tracecontext, b3 ,tracecontext,jaeger")),
            (
                vec!["tracecontext"],
                vec!["b3".to_string(), "jaeger".to_string()]
            )
        );
        assert_eq!(
            propagator_names(Some("tracecontext,none")),
            (Vec::new(), Vec::new())
        );
    }
}
