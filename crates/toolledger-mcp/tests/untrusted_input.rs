//! Property tests of the two places a client's bytes enter a server before anything else
//! reads them (the fuzz targets `request_state` and `wire` explore the same properties with
//! coverage guidance): the requestState opener never accepts a token it did not seal, and the
//! wire entry refuses with a documented JSON-RPC error and passes only canonical arguments.

use proptest::prelude::*;
use rmcp::model::{ClientRequest, JsonRpcMessage};
use serde_json::{json, Value};
use toolledger::model::ErrorCode;
use toolledger_mcp::wire::{check_message, INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR};
use toolledger_mcp::StateBinding;
use toolledger_mcp::StateSealer;
use toolledger_testkit::mutate::{edits, Edit};

const TTL: i64 = 600;

fn binding(operation_id: &str) -> StateBinding {
    StateBinding {
        tenant: "acme".into(),
        subject: "alice".into(),
        tool: "create_issue".into(),
        operation_id: operation_id.into(),
        args_digest: "00".repeat(32),
        nonce: "n1".into(),
        step: "awaiting-body".into(),
        issued_at: 1_000,
        authority_deadline: 2_000,
        retention_deadline: 3_000,
        upstream_state: None,
    }
}

fn ring() -> StateSealer {
    StateSealer::new(&[vec![7u8; 32], vec![9u8; 32]], TTL).unwrap()
}

fn open(s: &StateSealer, token: &str, b: &StateBinding, now: i64) -> Option<StateBinding> {
    match s.open(token, &b.tenant, &b.subject, &b.tool, &b.operation_id, now) {
        Ok(opened) => Some(opened),
        Err(e) => {
            assert_eq!(e.code, ErrorCode::RequestStateInvalid);
            None
        }
    }
}

const TOKEN_BYTES: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ ";

const JSON_BYTES: &[u8] = b"\"\\{}[],:0129eE.-+ utfnNI\x00\x1f\xff\xc3\xed";

/// Edits with bytes from `alphabet`.
fn edits_from(alphabet: &[u8], count: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Edit>> {
    edits(prop::sample::select(alphabet.to_vec()), count)
}

/// A tools/call line with `arguments` spliced in as raw text.
fn call_line(id: &str, arguments: &str) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"t","arguments":{arguments}}}}}"#)
        .into_bytes()
}

/// What every outcome of the wire entry promises.
fn check_wire(line: &[u8]) {
    match check_message(line) {
        Err(e) => {
            assert!([PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS].contains(&e.code));
            assert_eq!(e.id.is_some(), e.code == INVALID_PARAMS, "{e:?}");
            let body = e.to_json();
            assert_eq!(body["jsonrpc"], "2.0");
            assert_eq!(body["error"]["code"], json!(e.code));
        }
        Ok(JsonRpcMessage::Request(request)) => {
            if let ClientRequest::CallToolRequest(call) = &request.request {
                if let Some(arguments) = &call.params.arguments {
                    toolledger::json::canonical_string(&Value::Object(arguments.clone()))
                        .expect("accepted arguments are in the canonical domain");
                }
            }
        }
        Ok(_) => {}
    }
}

fn argument_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "{",
            "}",
            "[",
            "]",
            ",",
            ":",
            "\"a\"",
            "\"b\"",
            "1",
            "1.5",
            "1e400",
            "-0",
            "2.0",
            "9007199254740992",
            "\"\\ud800\"",
            "null",
            "true",
            "NaN",
            " ",
        ]),
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn edited_tokens_never_open(
        operation in "[a-z0-9-]{1,12}",
        edits in edits_from(TOKEN_BYTES, 1..5),
    ) {
        let s = ring();
        let b = binding(&operation);
        let token = s.seal(&b).unwrap();
        prop_assert_eq!(open(&s, &token, &b, 1_100), Some(b.clone()));
        let mut edited = token.clone().into_bytes();
        for e in &edits {
            e.apply(&mut edited);
        }
        let edited = String::from_utf8(edited).unwrap();
        if edited != token {
            prop_assert_eq!(open(&s, &edited, &b, 1_100), None, "{}", edited);
        }
    }

    #[test]
    fn a_token_opens_for_its_own_identity_within_its_lifetime_only(
        tenant in "(acme|acm|eacme|)",
        subject in "(alice|alic|ealice|)",
        operation in "(op-1|op-|op-11)",
        now in 0i64..3_000,
    ) {
        let s = ring();
        let b = binding("op-1");
        let token = s.seal(&b).unwrap();
        let mut other = b.clone();
        other.tenant = tenant;
        other.subject = subject;
        other.operation_id = operation;
        let own = other.tenant == b.tenant && other.subject == b.subject
            && other.operation_id == b.operation_id;
        prop_assert_eq!(open(&s, &token, &other, now).is_some(), own && now < b.issued_at + TTL);
    }

    #[test]
    fn arbitrary_text_is_never_a_token(text in ".{0,80}", prefix in "(rs2\\.|rs1\\.|)") {
        let s = ring();
        let b = binding("op-1");
        prop_assert_eq!(open(&s, &format!("{prefix}{text}"), &b, 1_100), None);
    }

    #[test]
    fn tool_call_lines_are_refused_cleanly_or_carry_canonical_arguments(
        arguments in argument_text(),
        id in "(1|\"r\"|null|1.5|)",
    ) {
        check_wire(&call_line(&id, &arguments));
    }

    #[test]
    fn edited_messages_are_refused_cleanly(edits in edits_from(JSON_BYTES, 1..6)) {
        let mut line = call_line("7", r#"{"operation_id":"issue-1","title":"spec","n":[1,2.0]}"#);
        for e in &edits {
            e.apply(&mut line);
            check_wire(&line);
        }
    }

    #[test]
    fn random_bytes_are_refused_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
        check_wire(&bytes);
    }
}
