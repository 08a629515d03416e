//! What a tool call leaves for operators: one `tracing` event and two metric series per call.
//!
//! The event (target `toolledger::call`, level `info`; `warn` for an unsure outcome) carries
//! the tool, the principal, the operation id when the answer names one, the outcome and the
//! latency — never arguments, tokens or keys. The metrics go to whatever `metrics` recorder the
//! process installed (the `toolledger` binary exports them as Prometheus text):
//! `toolledger_tool_calls_total{tool, outcome}` and
//! `toolledger_tool_call_duration_seconds{tool}`.
//!
//! Outcomes: `fresh` (an effect ran now), `replayed` (a stored result), `input_required` (a
//! first round), the error code of an in-band refusal (`operation_conflict`,
//! `outcome_unknown`, …), or `protocol_error` (a JSON-RPC error such as an invalid
//! `requestState`). The error of an in-band refusal is read from `content[0]`, as
//! [`crate::reply::error_of`] reads it from a serialized result.

use std::borrow::Cow;
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use metrics::{Counter, Histogram};
use rmcp::model::{CallToolResponse, ErrorData};
use serde_json::Value;
use toolledger::metric::{self, Registered};

/// The outcome label and the operation id of a tool's answer.
fn classify(
    response: &Result<CallToolResponse, ErrorData>,
) -> (Cow<'static, str>, Option<Cow<'_, str>>) {
    match response {
        Err(_) => ("protocol_error".into(), None),
        Ok(CallToolResponse::InputRequired(_)) => ("input_required".into(), None),
        Ok(CallToolResponse::Complete(result)) => {
            // Read the fields in place: the result is not re-serialized on every call.
            let structured = result.structured_content.as_ref().unwrap_or(&Value::Null);
            let ledger = result
                .meta
                .as_ref()
                .and_then(|m| m.get(crate::reply::META_LEDGER));
            let error = if result.is_error == Some(true) {
                result
                    .content
                    .first()
                    .and_then(|c| c.as_text())
                    .and_then(|t| serde_json::from_str::<Value>(&t.text).ok())
                    .and_then(|v| v.get("error").cloned())
            } else {
                None
            };
            let operation = ["operationId", "status_ref"]
                .iter()
                .find_map(|k| structured[*k].as_str().map(Cow::Borrowed))
                .or_else(|| ledger.and_then(|l| l["operationId"].as_str().map(Cow::Borrowed)))
                .or_else(|| {
                    error
                        .as_ref()
                        .and_then(|e| e["status_ref"].as_str().map(|s| Cow::Owned(s.to_string())))
                });
            if let Some(code) = error.as_ref().and_then(|e| e["code"].as_str()) {
                return (Cow::Owned(code.to_string()), operation);
            }
            if let Some(ledger) = ledger {
                // A stored upstream answer: an error result of the upstream's is `failed`.
                let outcome = match (ledger["replayed"] == Value::Bool(true), result.is_error) {
                    (_, Some(true)) => "failed",
                    (true, _) => "replayed",
                    (false, _) => "fresh",
                };
                return (outcome.into(), operation);
            }
            if error.is_some() {
                return ("error".into(), operation);
            }
            let replayed = structured["replayed"] == Value::Bool(true)
                || structured["delivery"] == "local_replay";
            let outcome = if replayed { "replayed" } else { "fresh" };
            (outcome.into(), operation)
        }
        Ok(_) => ("other".into(), None),
    }
}

/// Most outcomes of one tool whose counters are kept; others are looked up each time.
const KEPT_OUTCOMES: usize = 32;

/// One tool's name and its series, registered once per recorder.
pub(crate) struct CallSeries {
    tool: String,
    duration: Registered<Histogram>,
    /// The recorder the counters are of, and a counter per outcome seen.
    calls: RwLock<(usize, Vec<(String, Counter)>)>,
}

impl CallSeries {
    /// The series of `tool`.
    pub(crate) fn new(tool: &str) -> Self {
        CallSeries {
            tool: tool.to_string(),
            duration: Registered::new(),
            calls: RwLock::new((0, Vec::new())),
        }
    }

    /// `toolledger_tool_calls_total{tool,outcome}` for `outcome`.
    fn calls(&self, outcome: &str) -> Counter {
        let recorder = metric::recorder_id();
        {
            let kept = self.calls.read().unwrap_or_else(PoisonError::into_inner);
            if kept.0 == recorder {
                if let Some((_, counter)) = kept.1.iter().find(|(o, _)| o == outcome) {
                    return counter.clone();
                }
            }
        }
        let counter = metrics::counter!("toolledger_tool_calls_total", "tool" => self.tool.clone(), "outcome" => outcome.to_string());
        let mut kept = self.calls.write().unwrap_or_else(PoisonError::into_inner);
        if kept.0 != recorder {
            *kept = (recorder, Vec::new());
        }
        if kept.1.len() < KEPT_OUTCOMES && !kept.1.iter().any(|(o, _)| o == outcome) {
            kept.1.push((outcome.to_string(), counter.clone()));
        }
        counter
    }

    /// `toolledger_tool_call_duration_seconds{tool}`.
    fn duration(&self) -> Histogram {
        self.duration.get(
            || metrics::histogram!("toolledger_tool_call_duration_seconds", "tool" => self.tool.clone()),
        )
    }
}

/// Records one finished call of the tool of `series` by `principal` (`None`: not resolved)
/// that answered `response` after `elapsed`.
pub(crate) fn tool_call(
    series: &CallSeries,
    principal: Option<&str>,
    response: &Result<CallToolResponse, ErrorData>,
    elapsed: Duration,
) {
    let (outcome, operation) = classify(response);
    let latency_ms = elapsed.as_secs_f64() * 1000.0;
    let tool = series.tool.as_str();
    let principal = principal.unwrap_or("-");
    let operation = operation.as_deref().unwrap_or("-");
    if matches!(&*outcome, "outcome_unknown" | "operation_in_progress") {
        tracing::warn!(target: "toolledger::call", tool, principal, operation, outcome = %outcome, latency_ms, "tool call");
    } else {
        tracing::info!(target: "toolledger::call", tool, principal, operation, outcome = %outcome, latency_ms, "tool call");
    }
    series.calls(&outcome).increment(1);
    series.duration().record(elapsed.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::{tool_error, tool_ok};
    use metrics::{Gauge, Key, KeyName, Metadata, Recorder, SharedString, Unit};
    use serde_json::json;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use toolledger::model::{Error, ErrorCode};

    /// A recorder of counters by their labels' values (`tool/outcome`), counting how many
    /// times each was registered.
    #[derive(Default)]
    struct Counters {
        counts: Mutex<HashMap<String, Arc<AtomicU64>>>,
        registrations: AtomicU64,
    }

    impl Counters {
        fn count(&self, labels: &str) -> u64 {
            let counts = self.counts.lock().unwrap();
            counts.get(labels).map_or(0, |c| c.load(Ordering::Relaxed))
        }
    }

    impl Recorder for Counters {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            self.registrations.fetch_add(1, Ordering::Relaxed);
            let labels: Vec<&str> = key.labels().map(|l| l.value()).collect();
            let mut counts = self.counts.lock().unwrap();
            Counter::from_arc(counts.entry(labels.join("/")).or_default().clone())
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn a_tools_counters_are_kept_per_outcome_and_per_recorder() {
        let series = CallSeries::new("refund");
        let first = Counters::default();
        metrics::with_local_recorder(&first, || {
            for outcome in ["fresh", "fresh", "replayed", "fresh", "operation_conflict"] {
                series.calls(outcome).increment(1);
            }
        });
        assert_eq!(first.count("refund/fresh"), 3);
        assert_eq!(first.count("refund/replayed"), 1);
        assert_eq!(first.count("refund/operation_conflict"), 1);
        // Each outcome's series was looked up in the recorder once.
        assert_eq!(first.registrations.load(Ordering::Relaxed), 3);
        // Another recorder gets its own counters; the first one's are left as they were.
        let second = Counters::default();
        metrics::with_local_recorder(&second, || series.calls("fresh").increment(1));
        assert_eq!(second.count("refund/fresh"), 1);
        assert_eq!(first.count("refund/fresh"), 3);
    }

    #[test]
    fn outcomes_name_fresh_replayed_refusals_and_protocol_errors() {
        let ok = |v: Value| Ok(CallToolResponse::Complete(tool_ok(v)));
        let fresh = ok(json!({"operationId": "a", "replayed": false}));
        assert_eq!(classify(&fresh), ("fresh".into(), Some("a".into())));
        assert_eq!(
            classify(&ok(json!({"operationId": "a", "replayed": true}))).0,
            "replayed"
        );
        let refused = Ok(CallToolResponse::Complete(tool_error(&Error::new(
            ErrorCode::OperationConflict,
            "no",
        ))));
        assert_eq!(classify(&refused).0, "operation_conflict");
        let rpc = Err(ErrorData::invalid_params("bad", None));
        assert_eq!(classify(&rpc).0, "protocol_error");
    }
}
