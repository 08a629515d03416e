//! Tool results on the wire: a JSON object in `structuredContent` and the same JSON as text in
//! `content`; errors in-band with `isError: true` and `{error: {code, message}}`.

use rmcp::model::CallToolResult;
use serde_json::{json, Value};
use toolledger::model::Error;

/// A successful tool result carrying `value` (an object) as structured content and as text.
pub fn tool_ok(value: Value) -> CallToolResult {
    CallToolResult::structured(value)
}

/// The JSON body of an in-band tool error.
pub fn error_body(error: &Error) -> Value {
    json!({"error": {"code": error.code.as_str(), "message": error.message}})
}

/// An in-band tool error: `isError: true`, `structuredContent: {error: {code, message}}`.
pub fn tool_error(error: &Error) -> CallToolResult {
    CallToolResult::structured_error(error_body(error))
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
        assert_eq!(
            v["structuredContent"],
            json!({"error": {"code": "operation_conflict", "message": "nope"}})
        );
        let text = v["content"][0]["text"].as_str().unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(text).unwrap(),
            v["structuredContent"]
        );
    }
}
