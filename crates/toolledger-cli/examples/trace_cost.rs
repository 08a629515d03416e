//! The cost of one call's span with the OpenTelemetry SDK installed as `serve` installs it,
//! measured in-process:
//!
//! ```sh
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:9 OTEL_TRACES_SAMPLER=always_off \
//!   cargo run --release -p toolledger-cli --example trace_cost
//! ```
//!
//! Per iteration: the caller's context read from a `_meta` (with or without a `traceparent`),
//! a span started under it, ended, and its context attached to a future that is polled once —
//! what `call_wrapped` does per `tools/call` — under the sampler named by `OTEL_TRACES_SAMPLER`
//! (the SDK reads it), with a batch exporter to an endpoint nothing listens on (spans that are
//! sampled are queued and dropped; their export is not this thread's work).

use std::future::Future as _;
use std::time::Instant;

use opentelemetry::trace::TraceContextExt as _;
use serde_json::{json, Map, Value};
use toolledger_mcp::trace::{caller_context, client_span, end_client, in_context};

fn main() {
    // Without an endpoint nothing is installed: the no-op tracer's cost.
    let traces = toolledger_cli::telemetry::init_traces();
    let n: u32 = 1_000_000;
    let plain: Map<String, Value> = Map::new();
    let mut traced = Map::new();
    traced.insert(
        "traceparent".into(),
        json!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    );
    for (label, meta) in [("no traceparent", &plain), ("traceparent", &traced)] {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let started = Instant::now();
        let mut recorded = 0u32;
        for _ in 0..n {
            let parent = caller_context(meta, None);
            let span = {
                let _attached = parent.attach();
                client_span("forward", "create_automation")
            };
            recorded += span.span().is_recording() as u32;
            let mut fut = std::pin::pin!(in_context(&span, async { 1 }));
            let _ = fut.as_mut().poll(&mut cx);
            end_client(&span, None);
        }
        let per = started.elapsed().as_nanos() as f64 / f64::from(n);
        println!(
            "sampler={} {label}: {per:.0} ns per call ({recorded} of {n} recorded)",
            std::env::var("OTEL_TRACES_SAMPLER").unwrap_or_else(|_| "default".into())
        );
    }
    drop(traces);
}
