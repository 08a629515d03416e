//! What a tool call leaves for operators: one `tracing` event and two metric series per call.
//!
//! The event (target `toolledger::call`, level `info`; `warn` for an unsure outcome) carries
//! the tool, the principal, the operation id when the answer names one, the outcome and the
//! latency — never arguments, tokens or keys. The metrics go to whatever `metrics` recorder the
//! process installed (the `toolledger` binary exports them as Prometheus text):
//! `toolledger_tool_calls_total{tool, outcome}` and
//! `toolledger_tool_call_duration_seconds{tool}`. The same measured duration goes to the MCP
//! semantic conventions' histogram `mcp.server.operation.duration` (seconds; `mcp.method.name`,
//! `gen_ai.tool.name`, `gen_ai.operation.name`, `error.type` when the call failed) through the
//! process's OpenTelemetry meter provider: without one (no OTLP export configured) it is a
//! no-op.
//!
//! Outcomes: `fresh` (an effect ran now), `replayed` (a stored result), `input_required` (a
//! first round), the error code of an in-band refusal (`operation_conflict`,
//! `outcome_unknown`, …), or `protocol_error` (a JSON-RPC error such as an invalid
//! `requestState`). The error of an in-band refusal is read from `content[0]`, as
//! [`crate::reply::error_of`] reads it from a serialized result.

use std::borrow::Cow;
use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Counter, Histogram};
use rmcp::model::{CallToolResponse, ErrorData};
use serde_json::Value;
use toolledger_core::metric::{Registered, RegisteredByLabel};

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

/// One tool's name and its series, registered once per recorder.
pub(crate) struct CallSeries {
    tool: String,
    duration: Registered<Histogram>,
    calls: RegisteredByLabel<Counter>,
    /// `mcp.server.operation.duration` and the attributes of a call that did not fail, made on
    /// the first call (after the program installed its meter provider).
    operation: OnceLock<Operation>,
}

/// The conventions' duration histogram of one tool.
struct Operation {
    histogram: opentelemetry::metrics::Histogram<f64>,
    attributes: [opentelemetry::KeyValue; 3],
}

impl Operation {
    fn new(tool: &str) -> Self {
        use opentelemetry::KeyValue;
        let histogram = opentelemetry::global::meter(crate::trace::TRACER)
            .f64_histogram("mcp.server.operation.duration")
            .with_unit("s")
            .with_description("The duration of the MCP requests the server answered")
            .build();
        Operation {
            histogram,
            attributes: [
                KeyValue::new("mcp.method.name", "tools/call"),
                KeyValue::new("gen_ai.tool.name", tool.to_string()),
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
            ],
        }
    }

    /// Records `seconds` for an answer that failed with `error` (`None`: it did not fail).
    fn record(&self, seconds: f64, error: Option<Cow<'static, str>>) {
        match error {
            None => self.histogram.record(seconds, &self.attributes),
            Some(error) => {
                let mut attributes = self.attributes.to_vec();
                attributes.push(opentelemetry::KeyValue::new("error.type", error));
                self.histogram.record(seconds, &attributes);
            }
        }
    }
}

/// The conventions' `error.type` of an answer: the JSON-RPC error's code, `tool_error` for a
/// result with `isError`, or `None`.
fn error_type(response: &Result<CallToolResponse, ErrorData>) -> Option<Cow<'static, str>> {
    match response {
        Err(e) => Some(e.code.0.to_string().into()),
        Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => Some("tool_error".into()),
        Ok(_) => None,
    }
}

impl CallSeries {
    /// The series of `tool`.
    pub(crate) fn new(tool: &str) -> Self {
        CallSeries {
            tool: tool.to_string(),
            duration: Registered::new(),
            calls: RegisteredByLabel::new(),
            operation: OnceLock::new(),
        }
    }

    /// The tool's name.
    pub(crate) fn tool(&self) -> &str {
        &self.tool
    }

    /// `toolledger_tool_calls_total{tool,outcome}` for `outcome`.
    fn calls(&self, outcome: &str) -> Counter {
        self.calls.get(outcome, || {
            metrics::counter!("toolledger_tool_calls_total", "tool" => self.tool.clone(), "outcome" => outcome.to_string())
        })
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
    let seconds = elapsed.as_secs_f64();
    series.duration().record(seconds);
    series
        .operation
        .get_or_init(|| Operation::new(&series.tool))
        .record(seconds, error_type(response));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::{tool_error, tool_ok};
    use serde_json::json;
    use toolledger::model::{Error, ErrorCode};

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
