//! Tool results on the wire: a JSON object in `structuredContent` and the same JSON as text in
//! `content`; errors in-band with `isError: true` and the JSON text of
//! `{error: {code, message}}` as `content[0]`, without `structuredContent` — a tool's declared
//! output schema describes its results, and clients that validate structured content against it
//! (even on errors) must see the tool's real error code, never a schema failure.
//!
//! One refusal is not a tool result but a protocol error: a `requestState` that does not open
//! (tampered, expired, foreign, or not bound to these arguments) is the JSON-RPC error -32602
//! with `data: {"code": "request_state_invalid"}` ([`respond`], [`protocol_error`]), as the MCP
//! specification asks of a server that cannot trust the state a client echoed.

use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, ErrorData};
use serde_json::{json, Value};
use toolledger::model::{Error, ErrorCode};

/// The `_meta` key of a result that passed through the ledger without being reshaped (the
/// proxy's replies carry the upstream's own content): `{operationId, statusRef, replayed,
/// state}`.
pub const META_LEDGER: &str = "io.toolledger/ledger";

/// A successful tool result carrying `value` (an object) as structured content and as text.
pub fn tool_ok(value: Value) -> CallToolResult {
    CallToolResult::structured(value)
}

/// The JSON body of an in-band tool error.
pub(crate) fn error_body(error: &Error) -> Value {
    let mut body = json!({"error": {"code": error.code.as_str(), "message": error.message}});
    if let Some(earlier) = &error.earlier {
        // A `possible_duplicate` names the earlier operation to ask about.
        body["error"]["status_ref"] = json!(earlier.status_ref);
        body["error"]["earlier"] = json!({
            "operation_id": earlier.operation_id,
            "status_ref": earlier.status_ref,
            "state": earlier.state,
        });
    }
    body
}

/// An in-band tool error: `isError: true`, `content[0]` the JSON text of
/// `{error: {code, message}}`, no `structuredContent`.
pub fn tool_error(error: &Error) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(error_body(error).to_string())])
}

/// The `{error: {code, message}}` object of a tool result's JSON (`content[0]`'s text), if it
/// is an error result.
pub fn error_of(result: &Value) -> Option<Value> {
    if result.get("isError") != Some(&Value::Bool(true)) {
        return None;
    }
    let text = result["content"][0]["text"].as_str()?;
    serde_json::from_str::<Value>(text)
        .ok()?
        .get("error")
        .cloned()
}

/// Refuses a continuation (`requestState` or `inputResponses`) sent to a single-round tool:
/// `continuation_unsupported`.
pub(crate) fn single_round(request_state: bool, input_responses: bool) -> Result<(), Error> {
    if request_state || input_responses {
        return Err(Error::new(
            toolledger::model::ErrorCode::ContinuationUnsupported,
            "this tool has a single round; it takes no requestState or inputResponses",
        ));
    }
    Ok(())
}

/// The JSON-RPC error for `error` when it is a protocol error rather than a tool result:
/// `request_state_invalid` → -32602 (invalid params) with `data.code`; `None` otherwise.
pub(crate) fn protocol_error(error: &Error) -> Option<ErrorData> {
    (error.code == ErrorCode::RequestStateInvalid).then(|| {
        ErrorData::invalid_params(
            error.message.clone(),
            Some(json!({"code": error.code.as_str()})),
        )
    })
}

/// A tool's answer on the wire: `Ok` as is, a protocol error (`protocol_error`) as a
/// JSON-RPC error, every other refusal in-band ([`tool_error`]).
pub fn respond(result: Result<CallToolResponse, Error>) -> Result<CallToolResponse, ErrorData> {
    match result {
        Ok(r) => Ok(r),
        Err(e) => match protocol_error(&e) {
            Some(rpc) => Err(rpc),
            None => Ok(CallToolResponse::Complete(tool_error(&e))),
        },
    }
}

/// `Ok(value)` → [`tool_ok`], `Err(e)` → [`tool_error`].
pub fn tool_result(result: Result<Value, Error>) -> CallToolResult {
    match result {
        Ok(v) => tool_ok(v),
        Err(e) => tool_error(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolledger::model::ErrorCode;

    #[test]
    fn errors_are_in_band_with_code_and_message() {
        let r = tool_error(&Error::new(ErrorCode::OperationConflict, "nope"));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["isError"], true);
        assert!(v.get("structuredContent").is_none(), "{v}");
        let text = v["content"][0]["text"].as_str().unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(text).unwrap(),
            json!({"error": {"code": "operation_conflict", "message": "nope"}})
        );
        assert_eq!(
            error_of(&v),
            Some(json!({"code": "operation_conflict", "message": "nope"}))
        );
        assert_eq!(error_of(&json!({"isError": false})), None);
    }

    #[test]
    fn an_invalid_request_state_is_a_json_rpc_error_and_nothing_else_is() {
        let bad = Error::new(ErrorCode::RequestStateInvalid, "the state is invalid");
        let rpc = respond(Err(bad)).unwrap_err();
        assert_eq!(rpc.code, rmcp::model::ErrorCode::INVALID_PARAMS);
        assert_eq!(rpc.data, Some(json!({"code": "request_state_invalid"})));
        let conflict = Error::new(ErrorCode::OperationConflict, "nope");
        assert!(protocol_error(&conflict).is_none());
        match respond(Err(conflict)).unwrap() {
            CallToolResponse::Complete(r) => assert_eq!(r.is_error, Some(true)),
            other => panic!("{other:?}"),
        }
    }
}
