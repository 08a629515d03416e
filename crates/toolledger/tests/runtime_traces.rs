//! The spans of the ledger's work outside a request, recorded by the OpenTelemetry SDK's own
//! in-memory exporter: a worker's delivery (and the trace context its external call is
//! handed), an operator's resolution (and a refused one), a prune pass. None of them carries
//! an operation id or an argument value. One test: the tracer provider is the process's.

use std::sync::{Arc, Mutex};

use opentelemetry::trace::SpanKind;
use opentelemetry::Value as OtelValue;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;
use toolledger::clock::{ManualClock, SharedClock};
use toolledger::downstream::DownstreamError;
use toolledger::prune::{prune, PruneOptions};
use toolledger::runtime::{
    Answer, DeferredCall, External, ExternalRequest, ProviderContext, Registry, Resolution,
    ResolveAs, Runtime,
};
use toolledger::{OperationState, ToolContract};
use toolledger_testkit::conformance::harness::{Harness, T0};

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a OtelValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn text(span: &SpanData, key: &str) -> Option<String> {
    attr(span, key).map(|v| v.as_str().into_owned())
}

fn send(key: &str) -> DeferredCall {
    DeferredCall {
        new_intent: false,
        principal: "alice".into(),
        tool: "send_email".into(),
        key: key.into(),
        arguments: json!({"to": "ap-zq95@example.com"}),
        approval_id: None,
        provider: ProviderContext::mcp(key),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_resolutions_and_prune_passes_are_spans_without_keys_or_arguments() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );

    let h = Harness::sqlite();
    let store = h.open();
    let principals = PrincipalStore::new(store.clone());
    principals
        .add("alice", "t1", &[], &[], false)
        .await
        .unwrap();
    principals
        .add("ops", "t1", &["operator".to_string()], &[], false)
        .await
        .unwrap();
    // The API: nothing sent, then an answer, then a lost answer; it keeps what it was given.
    let seen: Arc<Mutex<Vec<ExternalRequest>>> = Arc::default();
    let answers = Arc::new(Mutex::new(vec![
        Err(DownstreamError::NotSent("connection refused".into())),
        Ok(json!({"message_id": "m-1"})),
        Err(DownstreamError::Unavailable("reset".into())),
    ]));
    let (api_seen, api_answers) = (seen.clone(), answers.clone());
    let api = External::new(move |r: ExternalRequest| {
        api_seen.lock().unwrap().push(r);
        let mut answers = api_answers.lock().unwrap();
        let answer: Result<Value, DownstreamError> = if answers.len() > 1 {
            answers.remove(0)
        } else {
            answers[0].clone()
        };
        async move { answer }
    });
    let registry = Registry::new().external(ToolContract::uniform("send_email", "1"), api);
    let manual = Arc::new(ManualClock::new(T0));
    let clock: SharedClock = manual.clone();
    let rt = Runtime::new(store.clone(), clock.clone(), registry);

    // Nothing was sent: the event waits, and a worker pass delivers it.
    let waiting = rt.dispatch(&send("key-zq96"), None).await.unwrap();
    assert!(
        matches!(
            waiting,
            Answer::Unknown {
                state: OperationState::Accepted,
                ..
            }
        ),
        "{waiting:?}"
    );
    let status_ref = waiting.status_ref().to_string();
    let pass = rt.run_pass("worker-1", 10).await.unwrap();
    assert_eq!(pass.delivered, 1, "{pass:?}");

    // Lost: outcome_unknown, then an operator resolves it as failed, and a refused resolution.
    let lost = rt.dispatch(&send("key-zq97"), None).await.unwrap();
    assert!(
        matches!(
            lost,
            Answer::Unknown {
                state: OperationState::OutcomeUnknown,
                ..
            }
        ),
        "{lost:?}"
    );
    // The lease of the worker that lost the answer expires first.
    manual.advance(60);
    let resolution = |status_ref: &str| Resolution {
        status_ref: status_ref.into(),
        outcome: ResolveAs::Failed,
        reason: "the mail server has no record".into(),
        operator: "ops".into(),
        evidence: None,
    };
    let settled = rt.resolve(&resolution(lost.status_ref())).await;
    assert!(settled.is_ok(), "{settled:?}");
    assert!(rt.resolve(&resolution("no-such-reference")).await.is_err());

    let report = prune(&store, &clock, &PruneOptions::default())
        .await
        .unwrap();
    let _ = provider.force_flush();
    let spans = exporter.get_finished_spans().unwrap();

    // The delivery: a CONSUMER span that recorded a result, under which the API was called.
    let deliveries: Vec<&SpanData> = spans.iter().filter(|s| s.name == "deliver").collect();
    assert_eq!(deliveries.len(), 1, "{spans:#?}");
    let deliver = deliveries[0];
    assert_eq!(deliver.span_kind, SpanKind::Consumer);
    assert_eq!(
        text(deliver, "gen_ai.tool.name").as_deref(),
        Some("send_email")
    );
    assert_eq!(text(deliver, "toolledger.status_ref"), Some(status_ref));
    assert_eq!(
        text(deliver, "toolledger.outcome").as_deref(),
        Some("executed")
    );
    let seen = seen.lock().unwrap();
    assert!(
        seen[0].trace_context.is_empty(),
        "the call made outside any trace is handed none: {:?}",
        seen[0].trace_context
    );
    let handed = &seen[1].trace_context["traceparent"];
    let expected = format!(
        "00-{}-{}-01",
        deliver.span_context.trace_id(),
        deliver.span_context.span_id()
    );
    assert_eq!(
        handed, &expected,
        "the API's call continues the delivery's trace"
    );

    // The resolutions: one settled, one refused.
    let resolves: Vec<&SpanData> = spans.iter().filter(|s| s.name == "resolve").collect();
    assert_eq!(resolves.len(), 2, "{spans:#?}");
    let settled = resolves
        .iter()
        .find(|s| text(s, "toolledger.status_ref").as_deref() == Some(lost.status_ref()))
        .unwrap();
    assert_eq!(
        text(settled, "toolledger.resolution").as_deref(),
        Some("failed")
    );
    assert!(attr(settled, "error.type").is_none(), "{settled:?}");
    let refused = resolves
        .iter()
        .find(|s| text(s, "toolledger.status_ref").as_deref() == Some("no-such-reference"))
        .unwrap();
    assert!(attr(refused, "error.type").is_some(), "{refused:?}");

    // The prune pass, with what it did.
    let passes: Vec<&SpanData> = spans.iter().filter(|s| s.name == "prune").collect();
    assert_eq!(passes.len(), 1, "{spans:#?}");
    assert_eq!(
        attr(passes[0], "toolledger.prune.compacted"),
        Some(&OtelValue::I64(report.compacted as i64))
    );
    assert_eq!(
        attr(passes[0], "toolledger.prune.busy"),
        Some(&OtelValue::Bool(false))
    );

    let everything = format!("{spans:?}");
    for secret in ["key-zq96", "key-zq97", "ap-zq95"] {
        assert!(!everything.contains(secret), "{secret} is in a span");
    }
}
