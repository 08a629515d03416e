//! The strict wire entry of an MCP server: every incoming JSON-RPC message is checked before
//! any library re-parses it leniently, and every message that is refused is answered.
//!
//! [`check_message`] is the one validator; the stdio transport ([`stdio::StdioTransport`])
//! runs it on every line and the HTTP middleware (`http::strict_body`) on every POST body,
//! so both transports refuse exactly the same messages with exactly the same errors:
//!
//! | what arrives | JSON-RPC error | `id` |
//! |---|---|---|
//! | not UTF-8, not JSON, over [`MAX_MESSAGE_BYTES`], nested deeper than [`MAX_MESSAGE_DEPTH`], or breaking the strict rules below | -32700 parse error, `data.rule` | `null` |
//! | JSON, but not one JSON-RPC 2.0 message (not an object, a batch, no `"jsonrpc": "2.0"`, a `method` that is not a string, an `id` that is neither a string nor an integer) | -32600 invalid request | `null` |
//! | a `tools/call` whose params break the strict rules or have the wrong shape, or any request whose params are not an object | -32602 invalid params, `data.code = "invalid_arguments"` | the request's |
//!
//! The strict rules (the ledger's, from [`toolledger::json`]) are: UTF-8 only; no byte order
//! mark; no duplicate object key at any depth; no lone surrogate escape; no `NaN`/`Infinity`;
//! no number outside the range of a 64-bit float. `tools/call` params, which the ledger
//! fingerprints and stores, are moreover held to [`Limits::DEFAULT`] in size and depth. Any
//! number a double holds passes the wire (`12.5`, `1e-7`); an integer beyond ±(2^53−1) too:
//! a guarded tool refuses it in-band (`invalid_arguments` naming the field), a tool passed
//! through forwards it.
//!
//! Error messages name the broken rule and a byte offset, never the input.

#[cfg(feature = "http")]
pub(crate) mod direct;
#[cfg(feature = "http")]
pub mod http;
pub mod stdio;

use rmcp::model::{
    CallToolRequest, CallToolRequestMethod, ClientJsonRpcMessage, ClientRequest, ConstString,
    JsonRpcMessage, JsonRpcRequest, RequestId,
};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use toolledger::json::{self as strict, JsonError, Limits};

pub use stdio::StdioTransport;

/// The largest message accepted, in bytes (a stdio line without its newline, an HTTP body).
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// The deepest nesting of arrays and objects accepted in a message (counted as in
/// [`Limits`]). `tools/call` arguments, two levels down, are held to [`Limits::DEFAULT`].
pub const MAX_MESSAGE_DEPTH: usize = 96;

/// JSON-RPC 2.0: the message is not (strict) JSON.
pub const PARSE_ERROR: i32 = -32700;
/// JSON-RPC 2.0: the JSON is not a valid request object.
pub const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC 2.0: the method's params are invalid.
pub const INVALID_PARAMS: i32 = -32602;

/// The fast path's limits: a message this small and shallow that parses under the ledger's
/// own rules has `tools/call` params within [`Limits::DEFAULT`] too.
const FAST: Limits = Limits {
    max_bytes: Limits::DEFAULT.max_bytes,
    max_depth: Limits::DEFAULT.max_depth + 1,
};

/// Why an incoming message was refused: the JSON-RPC error it is answered with.
#[derive(Clone, Debug, PartialEq)]
pub struct WireError {
    /// [`PARSE_ERROR`], [`INVALID_REQUEST`] or [`INVALID_PARAMS`].
    pub code: i32,
    /// The request's id for [`INVALID_PARAMS`]; `None` (written `"id": null`) otherwise.
    pub id: Option<RequestId>,
    /// What is wrong, naming the rule (never echoing the input).
    pub message: String,
    /// The strict-JSON rule broken, when one was (`duplicate_key`, `too_large`, …: the stable
    /// codes of [`JsonError`]).
    pub rule: Option<&'static str>,
}

impl WireError {
    fn parse(e: &JsonError) -> WireError {
        WireError {
            code: PARSE_ERROR,
            id: None,
            message: format!("Parse error: not strict JSON ({}: {})", e.code, e.message),
            rule: Some(e.code),
        }
    }

    fn invalid_request(what: &str) -> WireError {
        WireError {
            code: INVALID_REQUEST,
            id: None,
            message: format!("Invalid request: {what}"),
            rule: None,
        }
    }

    fn invalid_params(id: RequestId, what: String, rule: Option<&'static str>) -> WireError {
        WireError {
            code: INVALID_PARAMS,
            id: Some(id),
            message: format!("Invalid params: {what}"),
            rule,
        }
    }

    /// The line a message over [`MAX_MESSAGE_BYTES`] is answered with.
    pub fn too_large() -> WireError {
        WireError::parse(&too_large())
    }

    /// The JSON-RPC error response object.
    pub fn to_json(&self) -> Value {
        let mut data = Map::new();
        if self.code == INVALID_PARAMS {
            data.insert("code".into(), json!("invalid_arguments"));
        }
        if let Some(rule) = self.rule {
            data.insert("rule".into(), json!(rule));
        }
        let mut error = json!({"code": self.code, "message": self.message});
        if !data.is_empty() {
            error["data"] = Value::Object(data);
        }
        let id = match &self.id {
            Some(RequestId::Number(n)) => json!(n),
            Some(RequestId::String(s)) => json!(&**s),
            None => Value::Null,
        };
        json!({"jsonrpc": "2.0", "id": id, "error": error})
    }

    /// [`WireError::to_json`] as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.to_json().to_string().into_bytes()
    }
}

fn too_large() -> JsonError {
    JsonError {
        code: "too_large",
        message: format!("the message is larger than {MAX_MESSAGE_BYTES} bytes"),
    }
}

/// Checks one incoming message (a stdio line without its newline, or an HTTP body) and
/// returns it as rmcp's typed message, or the error it must be answered with (see the
/// module documentation for the rules).
pub fn check_message(bytes: &[u8]) -> Result<ClientJsonRpcMessage, WireError> {
    let value = match strict::parse(bytes, &FAST) {
        Ok(value) => value,
        Err(first) => outside_the_fast_path(bytes, first)?,
    };
    let mut message = classify(&value, bytes)?;
    carry_params_key(&value, &mut message)?;
    Ok(message)
}

/// Moves a `tools/call`'s `params.idempotencyKey` (a carrier of the operation id that rmcp
/// does not keep) into the request's `_meta` under
/// [`crate::carriers::META_PARAMS_KEY`], where the guard reads every carrier. One that is not
/// a string is -32602.
fn carry_params_key(value: &Value, message: &mut ClientJsonRpcMessage) -> Result<(), WireError> {
    let Some(key) = value.pointer("/params/idempotencyKey") else {
        return Ok(());
    };
    let JsonRpcMessage::Request(JsonRpcRequest { id, request, .. }) = message else {
        return Ok(());
    };
    if !matches!(request, ClientRequest::CallToolRequest(_)) {
        return Ok(());
    }
    if !key.is_string() {
        return Err(WireError::invalid_params(
            id.clone(),
            "tools/call params.idempotencyKey is a string".into(),
            None,
        ));
    }
    use rmcp::model::GetMeta;
    request
        .get_meta_mut()
        .insert(crate::carriers::META_PARAMS_KEY.into(), key.clone());
    Ok(())
}

/// A message the ledger's own parser refused under the fast path's limits: either it breaks
/// a strict rule (answered -32700, or -32602 when the break is in `tools/call` params), or it
/// is acceptable wire JSON with numbers outside the canonical domain, or larger or deeper
/// than the fast path admits.
fn outside_the_fast_path(bytes: &[u8], first: JsonError) -> Result<Value, WireError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(WireError::parse(&too_large()));
    }
    if first.code == "invalid_utf8" {
        return Err(WireError::parse(&first));
    }
    strict::check_depth(bytes, MAX_MESSAGE_DEPTH).map_err(|e| WireError::parse(&e))?;
    if let Some(refused) = tool_call_params_error(bytes) {
        return Err(refused);
    }
    // A break of a rule the wire shares with the ledger (grammar, duplicate key, lone
    // surrogate, `NaN`) is answered as the ledger's parser found it, at its first offset. Only
    // numbers outside the canonical domain, or a message over the fast path's size or depth,
    // may still be acceptable wire JSON.
    if !matches!(
        first.code,
        "integer_out_of_range" | "too_large" | "too_deep"
    ) {
        return Err(WireError::parse(&first));
    }
    wire_parse(bytes).map_err(|e| WireError::parse(&e))
}

/// The -32602 answer to a `tools/call` request whose params break the ledger's rules, found
/// without parsing anything but the params strictly (the envelope is read leniently, so the
/// request's id is known even when the params hold a lone surrogate or a duplicate key).
fn tool_call_params_error(bytes: &[u8]) -> Option<WireError> {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        jsonrpc: Option<&'a RawValue>,
        #[serde(borrow)]
        id: Option<&'a RawValue>,
        #[serde(borrow)]
        method: Option<&'a RawValue>,
        #[serde(borrow)]
        params: Option<&'a RawValue>,
    }
    let envelope: Envelope<'_> = serde_json::from_slice(bytes).ok()?;
    let text =
        |raw: Option<&RawValue>| raw.and_then(|r| strict::parse(r.get().as_bytes(), &FAST).ok());
    if text(envelope.jsonrpc)? != "2.0" || text(envelope.method)? != CallToolRequestMethod::VALUE {
        return None;
    }
    let id = request_id(&text(envelope.id)?)?;
    let params = envelope.params?;
    let checked = match strict::parse(params.get().as_bytes(), &Limits::DEFAULT) {
        // An integer a double cannot hold is the tool's to judge (a guarded tool refuses it
        // in-band naming the field; a tool passed through forwards it): only the other rules
        // are the wire's.
        Err(e) if e.code == "integer_out_of_range" => wire_parse(params.get().as_bytes()),
        other => other,
    };
    match checked {
        Ok(_) => None,
        Err(e) => Some(WireError::invalid_params(
            id,
            format!(
                "tools/call params break the strict JSON rules ({}: {}; offsets count from the \
                 start of params)",
                e.code, e.message
            ),
            Some(e.code),
        )),
    }
}

fn request_id(id: &Value) -> Option<RequestId> {
    match id {
        Value::String(s) => Some(RequestId::String(s.as_str().into())),
        Value::Number(n) => n.as_i64().map(RequestId::Number),
        _ => None,
    }
}

/// Sorts a message, parsed as `value` from `bytes`, into one JSON-RPC message (request,
/// notification, response, error) and converts it to rmcp's typed message.
///
/// rmcp reads the bytes themselves: they passed the rules, so its lenient parser sees exactly
/// `value`, and reading a slice (its strings borrowed while its untagged enums try their
/// variants) costs less than reading an owned `Value`.
fn classify(value: &Value, bytes: &[u8]) -> Result<ClientJsonRpcMessage, WireError> {
    let map = match value {
        Value::Object(map) => map,
        Value::Array(_) => {
            return Err(WireError::invalid_request(
                "batches are not supported; send one JSON-RPC message at a time",
            ))
        }
        _ => {
            return Err(WireError::invalid_request(
                "a JSON-RPC message is an object",
            ))
        }
    };
    if map.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(WireError::invalid_request(
            "a JSON-RPC 2.0 message has \"jsonrpc\": \"2.0\"",
        ));
    }
    let answer = map.contains_key("result") || map.contains_key("error");
    match map.get("method") {
        None => {}
        Some(Value::String(_)) if answer => {
            return Err(WireError::invalid_request(
                "a message with a method carries no result or error",
            ))
        }
        Some(Value::String(method)) => {
            if let Some(id) = map.get("id") {
                let id = request_id(id).ok_or_else(|| {
                    WireError::invalid_request("a request id is a string or an integer")
                })?;
                check_params(&id, method, map.get("params"))?;
                if method == CallToolRequestMethod::VALUE {
                    if let Some(message) = tool_call_request(bytes) {
                        return Ok(message);
                    }
                }
            }
        }
        Some(_) => return Err(WireError::invalid_request("the method is a string")),
    }
    let message: ClientJsonRpcMessage = serde_json::from_slice(bytes).map_err(|_| {
        WireError::invalid_request("not a JSON-RPC request, notification, result or error")
    })?;
    // A request for another known method whose params do not fit it is left to the server:
    // several such methods are removed in MCP 2026-07-28, where the answer is -32601.
    Ok(message)
}

/// A `tools/call` request (a message with an id and that method, and neither result nor
/// error) read straight as one: the message rmcp's own reading gives, without its trying
/// every request type before `tools/call` in turn (each failure an error value with a
/// formatted message). `None` when its params do not fit a `tools/call` request: rmcp's
/// reading then decides what it is.
fn tool_call_request(bytes: &[u8]) -> Option<ClientJsonRpcMessage> {
    let request: JsonRpcRequest<CallToolRequest> = serde_json::from_slice(bytes).ok()?;
    Some(JsonRpcMessage::Request(JsonRpcRequest {
        jsonrpc: request.jsonrpc,
        id: request.id,
        request: ClientRequest::from(request.request),
    }))
}

/// The shape of a request's params, checked before rmcp deserializes them: params are an
/// object when present (MCP has no positional params); `tools/call` names its tool with a
/// string and carries `arguments`, `inputResponses` and `_meta` as objects and `requestState`
/// as a string (each optional; `null` counts as absent, as in rmcp).
fn check_params(id: &RequestId, method: &str, params: Option<&Value>) -> Result<(), WireError> {
    let refuse = |what: String| Err(WireError::invalid_params(id.clone(), what, None));
    let params = match params {
        None | Some(Value::Null) => None,
        Some(Value::Object(p)) => Some(p),
        Some(_) => return refuse("MCP request params are an object".into()),
    };
    if method != CallToolRequestMethod::VALUE {
        return Ok(());
    }
    let Some(params) = params else {
        return refuse("tools/call params are an object naming the tool".into());
    };
    match params.get("name") {
        Some(Value::String(_)) => {}
        None => return refuse("tools/call params.name is missing".into()),
        Some(_) => return refuse("tools/call params.name is a string".into()),
    }
    for (field, object) in [
        ("arguments", true),
        ("inputResponses", true),
        ("_meta", true),
        ("requestState", false),
    ] {
        let fits = match params.get(field) {
            None | Some(Value::Null) => true,
            Some(v) if object => v.is_object(),
            Some(v) => v.is_string(),
        };
        if !fits {
            let kind = if object { "an object" } else { "a string" };
            return refuse(format!("tools/call params.{field} is {kind}"));
        }
    }
    Ok(())
}

/// Parses a message under the wire rules: serde_json's grammar (UTF-8, no `NaN`, no lone
/// surrogate in a string, every number within a 64-bit float's range, no byte order mark)
/// plus no duplicate key at any depth. The caller has checked size and depth.
fn wire_parse(bytes: &[u8]) -> Result<Value, JsonError> {
    serde_json::from_slice::<WireValue>(bytes)
        .map(|v| v.0)
        .map_err(|e| {
            let text = e.to_string();
            let code = if text.starts_with(DUPLICATE_KEY) {
                "duplicate_key"
            } else if text.contains("surrogate") || text.contains("unicode code point") {
                "lone_surrogate"
            } else if text.contains("number out of range") {
                "number_out_of_range"
            } else if text.contains("recursion limit") {
                "too_deep"
            } else {
                "syntax"
            };
            // serde_json's messages name a line and column, never the input.
            JsonError {
                code,
                message: text,
            }
        })
}

const DUPLICATE_KEY: &str = "duplicate object key";

/// A `serde_json::Value` that refuses duplicate object keys while it is parsed.
struct WireValue(Value);

impl<'de> Deserialize<'de> for WireValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(WireVisitor).map(WireValue)
    }
}

struct WireVisitor;

impl<'de> Visitor<'de> for WireVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number out of range"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(WireValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let WireValue(value) = access.next_value()?;
            if map.insert(key, value).is_some() {
                return Err(serde::de::Error::custom(DUPLICATE_KEY));
            }
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_call_read_straight_is_the_message_rmcp_reads() {
        let lines = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund","arguments":{"amount":12.5,"order":{"id":"o-1","lines":[1,2]}}}}"#,
            r#"{"jsonrpc":"2.0","id":"r-7","method":"tools/call","params":{"name":"t","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","progressToken":3}}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t","requestState":"abc","inputResponses":{"q":{"action":"accept","content":{"ok":true}}}}}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t","task":{"ttl":1000},"extra":[null]},"also":"ignored"}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"t"}}"#,
        ];
        for line in lines {
            let straight = tool_call_request(line.as_bytes()).expect("read straight");
            let rmcp: ClientJsonRpcMessage = serde_json::from_slice(line.as_bytes()).unwrap();
            assert!(
                matches!(&straight, JsonRpcMessage::Request(r) if matches!(r.request, ClientRequest::CallToolRequest(_))),
                "{line}"
            );
            assert_eq!(format!("{straight:?}"), format!("{rmcp:?}"), "{line}");
            assert_eq!(
                serde_json::to_value(&straight).unwrap(),
                serde_json::to_value(&rmcp).unwrap(),
                "{line}"
            );
            let checked = check_message(line.as_bytes()).unwrap();
            assert_eq!(format!("{checked:?}"), format!("{rmcp:?}"), "{line}");
        }
    }

    fn refused(line: &[u8]) -> WireError {
        check_message(line).expect_err("refused")
    }

    #[test]
    fn strict_breaks_are_parse_errors_with_a_null_id() {
        let deep = "[".repeat(100_000);
        let long = format!("[{}1]", "1".repeat(400));
        let cases: [(&[u8], &str); 9] = [
            (b"NaN", "non_finite_number"),
            (b"{\"x\":Infinity}", "non_finite_number"),
            (b"[1e400]", "number_out_of_range"),
            (long.as_bytes(), "number_out_of_range"),
            (b"\"\\ud800\"", "lone_surrogate"),
            (b"{\"a\":1,\"a\":2}", "duplicate_key"),
            (b"{\"a\":\xff}", "invalid_utf8"),
            (deep.as_bytes(), "too_deep"),
            (b"{\"jsonrpc\":", "syntax"),
        ];
        for (line, rule) in cases {
            let e = refused(line);
            assert_eq!(
                (e.code, e.id.clone(), e.rule),
                (PARSE_ERROR, None, Some(rule)),
                "{e:?}"
            );
            assert_eq!(e.to_json()["id"], Value::Null);
            assert_eq!(e.to_json()["error"]["data"]["rule"], rule);
        }
    }

    #[test]
    fn json_that_is_not_one_json_rpc_message_is_an_invalid_request() {
        for line in [
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            r#"5"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
            r#"{"id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":5}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1}"#,
        ] {
            let e = refused(line.as_bytes());
            assert_eq!(
                (e.code, e.id.clone()),
                (INVALID_REQUEST, None),
                "{line}: {e:?}"
            );
        }
    }

    #[test]
    fn malformed_tool_call_params_are_invalid_params_with_the_request_id() {
        for params in [
            r#"{}"#,
            r#"{"name":5}"#,
            r#"{"name":"t","arguments":"x"}"#,
            r#"{"name":"t","arguments":[1]}"#,
            r#"{"name":"t","inputResponses":12345}"#,
            r#"{"name":"t","requestState":5}"#,
            r#"{"name":"t","_meta":"m"}"#,
            r#""x""#,
        ] {
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":"r-7","method":"tools/call","params":{params}}}"#
            );
            let e = refused(line.as_bytes());
            assert_eq!(e.code, INVALID_PARAMS, "{params}: {e:?}");
            assert_eq!(e.id, Some(RequestId::String("r-7".into())));
            assert_eq!(e.to_json()["error"]["data"]["code"], "invalid_arguments");
        }
        let missing = refused(br#"{"jsonrpc":"2.0","id":3,"method":"tools/call"}"#);
        assert_eq!(
            (missing.code, missing.id),
            (INVALID_PARAMS, Some(RequestId::Number(3)))
        );
    }

    #[test]
    fn every_number_a_tool_may_take_passes_the_wire_as_received() {
        let line = br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"convert","arguments":{"amount":12.5,"rate":1e-7,"id":9007199254740993,"big":123456789012345678}}}"#;
        let message = check_message(line).expect("accepted");
        let ClientJsonRpcMessage::Request(request) = message else {
            panic!("a request")
        };
        let value = serde_json::to_value(&request.request).unwrap();
        let arguments = &value["params"]["arguments"];
        assert_eq!(arguments["amount"], json!(12.5));
        assert_eq!(arguments["rate"], json!(1e-7));
        assert_eq!(arguments["id"], json!(9_007_199_254_740_993_u64));
        assert_eq!(arguments["big"], json!(123_456_789_012_345_678_u64));
    }

    #[test]
    fn strict_breaks_in_tool_call_params_are_invalid_params_naming_the_rule() {
        let cases: [(&[u8], &str); 6] = [
            (
                br#"{"request_id":"dup-a","request_id":"dup-b"}"#,
                "duplicate_key",
            ),
            (br#"{"x":{"y":1,"y":2}}"#, "duplicate_key"),
            (br#"{"x":"\ud800"}"#, "lone_surrogate"),
            (br#"{"x":1e400}"#, "number_out_of_range"),
            (br#"{"x":1e-400}"#, "number_out_of_range"),
            (br#"{"x":9007199254740992,"x":1}"#, "duplicate_key"),
        ];
        for (arguments, rule) in cases {
            let mut line = br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"t","arguments":"#.to_vec();
            line.extend_from_slice(arguments);
            line.extend_from_slice(b"}}");
            let e = refused(&line);
            assert_eq!(
                (e.code, e.id.clone(), e.rule),
                (INVALID_PARAMS, Some(RequestId::Number(9)), Some(rule)),
                "{e:?}"
            );
            assert!(e.message.contains(rule), "{}", e.message);
            assert!(!e.message.contains("dup-"), "no echo: {}", e.message);
        }
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"t","arguments":{{"a":{}1{}}}}}}}"#,
            "[".repeat(70),
            "]".repeat(70)
        );
        let e = refused(deep.as_bytes());
        assert_eq!((e.code, e.rule), (INVALID_PARAMS, Some("too_deep")));
    }

    #[test]
    fn known_methods_with_params_that_do_not_fit_are_invalid_params() {
        // Other known methods' params are the server's to judge (`initialize` and
        // `logging/setLevel` are removed in 2026-07-28, where the server answers -32601).
        for method in ["initialize", "logging/setLevel"] {
            let line = format!(r#"{{"jsonrpc":"2.0","id":4,"method":"{method}","params":{{}}}}"#);
            assert!(check_message(line.as_bytes()).is_ok(), "{method}");
        }
        let e = refused(br#"{"jsonrpc":"2.0","id":4,"method":"tools/list","params":[1]}"#);
        assert_eq!(e.code, INVALID_PARAMS);
        let e = refused(br#"{"jsonrpc":"2.0","id":4,"method":"x/y","params":[1]}"#);
        assert_eq!(e.code, INVALID_PARAMS);
        // An unknown method is left to the server (-32601).
        let m = check_message(br#"{"jsonrpc":"2.0","id":4,"method":"x/y","params":{}}"#).unwrap();
        assert!(matches!(m, JsonRpcMessage::Request(_)));
    }

    #[test]
    fn valid_messages_pass_including_fractions_outside_tool_call_params() {
        let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"n":1}}}"#;
        assert!(matches!(
            check_message(call),
            Ok(JsonRpcMessage::Request(_))
        ));
        let progress = br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":0.5}}"#;
        assert!(matches!(
            check_message(progress),
            Ok(JsonRpcMessage::Notification(_))
        ));
        let answer =
            br#"{"jsonrpc":"2.0","id":1,"result":{"action":"accept","content":{"x":2.5}}}"#;
        assert!(matches!(
            check_message(answer),
            Ok(JsonRpcMessage::Response(_))
        ));
        // Still no duplicate key or lone surrogate there.
        let dup = br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":0.5,"progress":1}}"#;
        assert_eq!(refused(dup).rule, Some("duplicate_key"));
    }

    #[test]
    fn over_the_size_limit_is_a_parse_error() {
        let mut big = b"\"".to_vec();
        big.resize(MAX_MESSAGE_BYTES + 1, b'a');
        big.push(b'"');
        let e = refused(&big);
        assert_eq!((e.code, e.rule), (PARSE_ERROR, Some("too_large")));
    }
}

#[cfg(test)]
mod carrier_tests {
    use super::*;

    #[test]
    fn params_idempotency_key_moves_into_meta_and_must_be_a_string() {
        let line = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t","arguments":{},"idempotencyKey":"k-1"}}"#;
        let JsonRpcMessage::Request(r) = check_message(line).unwrap() else {
            panic!("a request")
        };
        use rmcp::model::GetMeta;
        assert_eq!(
            r.request.get_meta().get(crate::carriers::META_PARAMS_KEY),
            Some(&json!("k-1"))
        );
        // The body rmcp reads again over HTTP carries it in `_meta`.
        let again = serde_json::to_value(&r).unwrap();
        assert_eq!(
            again["params"]["_meta"][crate::carriers::META_PARAMS_KEY],
            json!("k-1"),
            "{again}"
        );
        let bad = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t","idempotencyKey":5}}"#;
        let e = check_message(bad).unwrap_err();
        assert_eq!(e.code, INVALID_PARAMS);
    }
}
