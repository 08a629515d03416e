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
}

impl CallSeries {
    /// The series of `tool`.
    pub(crate) fn new(tool: &str) -> Self {
        CallSeries {
            tool: tool.to_string(),
            duration: Registered::new(),
            calls: RegisteredByLabel::new(),
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
    series.duration().record(elapsed.as_secs_f64());
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
