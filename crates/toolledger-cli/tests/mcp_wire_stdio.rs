//! The strict wire entry on stdio: every line that is not valid JSON-RPC is answered with a
//! JSON-RPC error (`id: null`; -32700 for what is not strict JSON, -32600 for JSON that is not
//! one JSON-RPC message) and the server keeps serving; a `tools/call` whose params break the
//! strict rules or have the wrong shape is -32602 with the request's id, and writes nothing.
//! Each case runs on a fresh SQLite file and on a fresh PostgreSQL schema.

#[macro_use]
mod support;
#[path = "support/raw.rs"]
mod raw;

use raw::RawStdio;
use serde_json::{json, Value};
use support::wire::*;

on_both_backends!(
    every_line_that_is_not_strict_json_rpc_is_answered_and_the_server_keeps_serving,
    duplicate_keys_in_arguments_are_refused_and_nothing_is_written,
    strict_breaks_in_tool_call_params_are_invalid_params_and_nothing_is_written,
    malformed_tool_call_params_are_invalid_params_not_method_not_found,
    a_refused_line_before_initialize_leaves_the_legacy_lifecycle_working,
);

/// A 2026-07-28 `tools/call` request with `id` and `params` (its `_meta` added).
fn call(id: Value, mut params: Value) -> Value {
    params["_meta"] = meta();
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// The JSON-RPC error of `reply` as (code, id), asserting the reply is an error.
fn error_of(reply: &Value) -> (i64, Value) {
    assert!(
        reply.get("result").is_none(),
        "an error, not a result: {reply}"
    );
    (
        reply["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("{reply}")),
        reply["id"].clone(),
    )
}

/// The server answers `get_operation_status`: it is still serving.
fn still_serving(server: &mut RawStdio, id: i64) {
    server.send(&call(
        json!(id),
        json!({"name": "get_operation_status", "arguments": {"operation_id": "w-0"}}),
    ));
    let reply = server.recv();
    assert_eq!(reply["id"], id, "{reply}");
    assert_eq!(
        reply["result"]["structuredContent"]["state"], "unknown",
        "{reply}"
    );
}

fn nothing_written(db: &Db) {
    for table in ["operations", "operation_events", "issues", "automations"] {
        assert_eq!(count(db, table), 0, "{table}");
    }
}

fn every_line_that_is_not_strict_json_rpc_is_answered_and_the_server_keeps_serving(db: Db) {
    let mut server = RawStdio::start(&db, "alice", &[]);
    let long_integer = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{{\"n\":{}}}}}",
        "7".repeat(400)
    );
    let deep = "[".repeat(100_000);
    let mut garbage = vec![b'#'; 10 << 20];
    garbage[5 << 20] = b'{';
    let parse_errors: Vec<(&str, Vec<u8>, &str)> = vec![
        ("NaN", b"NaN".to_vec(), "non_finite_number"),
        (
            "Infinity",
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":Infinity}}"#.to_vec(),
            "non_finite_number",
        ),
        (
            "1e400",
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":1e400}}"#.to_vec(),
            "number_out_of_range",
        ),
        (
            "400 digits",
            long_integer.into_bytes(),
            "number_out_of_range",
        ),
        (
            "invalid UTF-8",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"p\xffng\"}".to_vec(),
            "invalid_utf8",
        ),
        ("lone surrogate", br#""\ud800""#.to_vec(), "lone_surrogate"),
        (
            "lone surrogate in a method",
            br#"{"jsonrpc":"2.0","id":1,"method":"ping\udc00"}"#.to_vec(),
            "lone_surrogate",
        ),
        (
            "malformed",
            br#"{"jsonrpc":"2.0","id":1,"#.to_vec(),
            "syntax",
        ),
        ("not JSON at all", b"hello".to_vec(), "syntax"),
        (
            "duplicate top-level key",
            br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#.to_vec(),
            "duplicate_key",
        ),
        ("100,000 levels", deep.into_bytes(), "too_deep"),
        ("10 MB of garbage", garbage, "too_large"),
    ];
    for (n, (what, line, rule)) in parse_errors.into_iter().enumerate() {
        server.line(&line);
        let reply = server.recv();
        assert_eq!(error_of(&reply), (-32700, Value::Null), "{what}: {reply}");
        assert_eq!(reply["jsonrpc"], "2.0", "{what}");
        assert_eq!(reply["error"]["data"]["rule"], rule, "{what}: {reply}");
        still_serving(&mut server, 100 + n as i64);
    }
    for (n, line) in [
        r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
        r#"[]"#,
        r#"42"#,
        r#""tools/call""#,
        r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
        r#"{"id":1,"method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":7}"#,
        r#"{"jsonrpc":"2.0","id":true,"method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","id":null,"method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","error":{}}"#,
        r#"{"jsonrpc":"2.0"}"#,
    ]
    .into_iter()
    .enumerate()
    {
        server.line(line.as_bytes());
        let reply = server.recv();
        assert_eq!(error_of(&reply), (-32600, Value::Null), "{line}: {reply}");
        still_serving(&mut server, 200 + n as i64);
    }
    // Empty lines are no messages: nothing to answer, the next reply is the next request's.
    server.line(b"");
    server.line(b"\r");
    still_serving(&mut server, 300);
    nothing_written(&db);
    assert_eq!(server.finish(), 0);
}

fn duplicate_keys_in_arguments_are_refused_and_nothing_is_written(db: Db) {
    let mut server = RawStdio::start(&db, "alice", &[]);
    let meta = meta().to_string();
    let dup = format!(
        r#"{{"jsonrpc":"2.0","id":"d-1","method":"tools/call","params":{{"name":"create_automation","arguments":{{"request_id":"dup-a","request_id":"dup-b","interval_minutes":30}},"_meta":{meta}}}}}"#
    );
    server.line(dup.as_bytes());
    let reply = server.recv();
    assert_eq!(error_of(&reply), (-32602, json!("d-1")), "{reply}");
    assert_eq!(
        reply["error"]["data"]["code"], "invalid_arguments",
        "{reply}"
    );
    assert_eq!(reply["error"]["data"]["rule"], "duplicate_key", "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("duplicate_key"), "{message}");
    assert!(
        !message.contains("dup-"),
        "the message echoes no input: {message}"
    );
    nothing_written(&db);

    // A duplicate deep inside a continuation's inputResponses: nothing written either, and
    // the honest continuation afterwards commits exactly one issue.
    let args = json!({"operation_id": "w-dup", "title": "t"});
    server.send(&call(
        json!(2),
        json!({"name": "create_issue", "arguments": args}),
    ));
    let first = server.recv();
    let state = request_state(&first["result"]);
    let dup_body = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"create_issue","arguments":{args},"requestState":"{state}","inputResponses":{{"body":{{"action":"accept","content":{{"body":"a","body":"b"}}}}}},"_meta":{meta}}}}}"#
    );
    server.line(dup_body.as_bytes());
    let reply = server.recv();
    assert_eq!(error_of(&reply), (-32602, json!(3)), "{reply}");
    assert_eq!(reply["error"]["data"]["rule"], "duplicate_key");
    assert_eq!(count(&db, "issues"), 0);
    assert_eq!(count(&db, "operations"), 0);
    server.send(&call(
        json!(4),
        json!({"name": "create_issue", "arguments": args, "requestState": state,
               "inputResponses": body("b")}),
    ));
    let done = server.recv();
    assert_eq!(
        done["result"]["structuredContent"]["state"], "applied",
        "{done}"
    );
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "operations"), 1);
    assert_eq!(server.finish(), 0);
}

fn strict_breaks_in_tool_call_params_are_invalid_params_and_nothing_is_written(db: Db) {
    let mut server = RawStdio::start(&db, "alice", &[]);
    let meta = meta().to_string();
    for (n, (interval, rule)) in [
        (r#""\ud800""#, "lone_surrogate"),
        ("1e400", "number_out_of_range"),
        (&*"9".repeat(400), "number_out_of_range"),
    ]
    .into_iter()
    .enumerate()
    {
        let id = 10 + n as i64;
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"create_automation","arguments":{{"request_id":"s-{n}","interval_minutes":{interval}}},"_meta":{meta}}}}}"#
        );
        server.line(line.as_bytes());
        let reply = server.recv();
        assert_eq!(error_of(&reply), (-32602, json!(id)), "{rule}: {reply}");
        assert_eq!(reply["error"]["data"]["code"], "invalid_arguments");
        assert_eq!(reply["error"]["data"]["rule"], rule, "{reply}");
    }
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{{"name":"create_automation","arguments":{{"request_id":"s-deep","interval_minutes":30,"x":{}1{}}},"_meta":{meta}}}}}"#,
        "[".repeat(80),
        "]".repeat(80)
    );
    server.line(deep.as_bytes());
    let reply = server.recv();
    assert_eq!(error_of(&reply), (-32602, json!(20)), "{reply}");
    assert_eq!(reply["error"]["data"]["rule"], "too_deep");
    // Numbers a double holds pass the wire; the tool refuses what it does not take, in-band,
    // naming the field.
    for (n, interval) in ["9007199254740992", "30.5"].into_iter().enumerate() {
        let id = 30 + n as i64;
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"create_automation","arguments":{{"request_id":"n-{n}","interval_minutes":{interval}}},"_meta":{meta}}}}}"#
        );
        server.line(line.as_bytes());
        let reply = server.recv();
        assert_eq!(reply["id"], json!(id), "{reply}");
        assert_eq!(reply["result"]["isError"], true, "{interval}: {reply}");
        let text = reply["result"]["content"][0]["text"].as_str().unwrap_or("");
        assert!(text.contains("invalid_arguments"), "{interval}: {reply}");
        assert!(text.contains("interval_minutes"), "{interval}: {reply}");
    }
    nothing_written(&db);
    // The same call, strict, is served and written.
    server.send(&call(
        json!(21),
        json!({"name": "create_automation",
               "arguments": {"request_id": "s-ok", "interval_minutes": 30}}),
    ));
    let ok = server.recv();
    assert_eq!(ok["result"]["isError"], false, "{ok}");
    assert_eq!(count(&db, "automations"), 1);
    assert_eq!(count(&db, "operations"), 1);
    assert_eq!(server.finish(), 0);
}

fn malformed_tool_call_params_are_invalid_params_not_method_not_found(db: Db) {
    let mut server = RawStdio::start(&db, "alice", &[]);
    let args = json!({"request_id": "m-1", "interval_minutes": 30});
    let cases = [
        (json!("m-a"), json!({"arguments": args})),
        (json!(31), json!({"name": 5, "arguments": args})),
        (
            json!("m-c"),
            json!({"name": "create_automation", "arguments": "request_id=m-1"}),
        ),
        (
            json!(33),
            json!({"name": "create_automation", "arguments": [args]}),
        ),
        (
            json!("m-e"),
            json!({"name": "create_automation", "arguments": args, "inputResponses": 12345}),
        ),
        (
            json!(35),
            json!({"name": "create_automation", "arguments": args, "requestState": 5}),
        ),
    ];
    for (id, params) in cases {
        server.send(&call(id.clone(), params.clone()));
        let reply = server.recv();
        assert_eq!(error_of(&reply), (-32602, id), "{params}: {reply}");
        assert_eq!(reply["error"]["data"]["code"], "invalid_arguments");
    }
    for (id, params) in [
        (json!(36), json!("create_automation")),
        (json!(37), json!([1])),
    ] {
        server.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}));
        let reply = server.recv();
        assert_eq!(error_of(&reply), (-32602, id), "{reply}");
    }
    server.send(&json!({"jsonrpc": "2.0", "id": 38, "method": "tools/call"}));
    assert_eq!(error_of(&server.recv()), (-32602, json!(38)));
    // A method the server does not have is still "method not found".
    server.send(
        &json!({"jsonrpc": "2.0", "id": 39, "method": "tools/frobnicate",
                        "params": {"_meta": meta()}}),
    );
    let reply = server.recv();
    assert_eq!(error_of(&reply), (-32601, json!(39)), "{reply}");
    nothing_written(&db);
    assert_eq!(server.finish(), 0);
}

fn a_refused_line_before_initialize_leaves_the_legacy_lifecycle_working(db: Db) {
    let mut server = RawStdio::start(&db, "alice", &[]);
    server.line(b"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"id\":1}");
    assert_eq!(error_of(&server.recv()), (-32700, Value::Null));
    server.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}));
    assert_eq!(error_of(&server.recv()), (-32602, json!(1)));
    server.send(
        &json!({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "wire-legacy", "version": "1"}}}),
    );
    let init = server.recv();
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    server.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    server.line(b"Infinity");
    assert_eq!(error_of(&server.recv()), (-32700, Value::Null));
    server.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}));
    let list = server.recv();
    assert_eq!(list["id"], 3, "{list}");
    assert!(
        list["result"]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{list}"
    );
    nothing_written(&db);
    assert_eq!(server.finish(), 0);
}
