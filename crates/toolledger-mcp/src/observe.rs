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

use std::time::Duration;

use rmcp::model::{CallToolResponse, ErrorData};
use serde_json::Value;

/// The outcome label and the operation id of a tool's answer.
fn classify(response: &Result<CallToolResponse, ErrorData>) -> (String, Option<String>) {
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
                .find_map(|k| structured[*k].as_str().map(str::to_string))
                .or_else(|| ledger.and_then(|l| l["operationId"].as_str().map(str::to_string)))
                .or_else(|| {
                    error
                        .as_ref()
                        .and_then(|e| e["status_ref"].as_str().map(str::to_string))
                });
            if let Some(code) = error.as_ref().and_then(|e| e["code"].as_str()) {
                return (code.to_string(), operation);
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

/// Records one finished call of `tool` by `principal` (`None`: not resolved) that answered
/// `response` after `elapsed`.
pub(crate) fn tool_call(
    tool: &str,
    principal: Option<&str>,
    response: &Result<CallToolResponse, ErrorData>,
    elapsed: Duration,
) {
    let (outcome, operation) = classify(response);
    let latency_ms = elapsed.as_secs_f64() * 1000.0;
    let principal = principal.unwrap_or("-");
    let operation = operation.as_deref().unwrap_or("-");
    if matches!(
        outcome.as_str(),
        "outcome_unknown" | "operation_in_progress"
    ) {
        tracing::warn!(target: "toolledger::call", tool, principal, operation, outcome = %outcome, latency_ms, "tool call");
    } else {
        tracing::info!(target: "toolledger::call", tool, principal, operation, outcome = %outcome, latency_ms, "tool call");
    }
    metrics::counter!("toolledger_tool_calls_total", "tool" => tool.to_string(), "outcome" => outcome)
        .increment(1);
    metrics::histogram!("toolledger_tool_call_duration_seconds", "tool" => tool.to_string())
        .record(elapsed.as_secs_f64());
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
        assert_eq!(
            classify(&ok(json!({"operationId": "a", "replayed": false}))),
            ("fresh".into(), Some("a".into()))
        );
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
