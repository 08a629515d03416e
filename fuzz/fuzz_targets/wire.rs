//! The MCP wire entry: one line in. `check_message` never panics; a refusal is a JSON-RPC
//! error of the documented shape; an accepted `tools/call` has canonical arguments. The same
//! line then goes through the strict stdio transport into the reference server on a SQLite
//! ledger: a refused line is answered with exactly that error and writes nothing, and an
//! accepted request is answered.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmcp::model::{ClientRequest, JsonRpcMessage, RequestId};
use serde_json::{json, Value};
use toolledger::json;
use toolledger_fuzz::wire::harness;
use toolledger_mcp::wire::{check_message, INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR};

fuzz_target!(|data: &[u8]| {
    // One line: a newline inside would end it, so it stands for a space here.
    let line: Vec<u8> = data
        .iter()
        .map(|b| if *b == b'\n' { b' ' } else { *b })
        .collect();
    // The transport takes a line's `\r\n` as its end, and skips an empty line.
    let message = line.strip_suffix(b"\r").unwrap_or(&line);
    if message.is_empty() {
        return;
    }
    let checked = check_message(message);
    let awaited = match &checked {
        Err(e) => {
            assert!([PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS].contains(&e.code));
            assert_eq!(e.id.is_some(), e.code == INVALID_PARAMS, "{e:?}");
            assert!(e.message.len() <= 400, "long message: {e:?}");
            let body = e.to_json();
            assert_eq!(body["jsonrpc"], "2.0");
            assert_eq!(body["error"]["code"], json!(e.code));
            None
        }
        Ok(JsonRpcMessage::Request(request)) => {
            if let ClientRequest::CallToolRequest(call) = &request.request {
                if let Some(arguments) = &call.params.arguments {
                    let arguments = Value::Object(arguments.clone());
                    json::canonical_string(&arguments).expect("accepted arguments are canonical");
                }
            }
            Some(match &request.id {
                RequestId::Number(n) => json!(n),
                RequestId::String(s) => json!(&**s),
            })
        }
        Ok(_) => None,
    };
    let h = harness();
    let before = checked.is_err().then(|| h.rows());
    let answers = h.session(&line, awaited.as_ref());
    if let Err(e) = &checked {
        assert_eq!(answers, vec![e.to_bytes()], "the answer to a refused line");
        assert_eq!(before, Some(h.rows()), "a refused line wrote");
    }
});
