//! The strict wire entry over streamable HTTP: a body that is not strict JSON-RPC is 400 with
//! the JSON-RPC error (never 415), a malformed or non-strict `tools/call` is 400 with -32602
//! and writes nothing, `Host` and `Origin` must name an allowed host (403 otherwise;
//! `--allowed-host` / `TOOLLEDGER_ALLOWED_HOSTS` add names), the health endpoints answer any
//! host, and ending a legacy session answers 204 (404 for an unknown one), which the official
//! Python SDK accepts without a warning. Each case runs on a fresh SQLite file and on a fresh
//! PostgreSQL schema.

#[macro_use]
mod support;
#[path = "support/raw.rs"]
mod raw;

use std::process::Command;

use raw::{HttpResponse, RawHttp};
use serde_json::{json, Value};
use support::clients::python;
use support::wire::*;

on_both_backends!(
    bodies_that_are_not_strict_json_rpc_get_400_with_the_json_rpc_error,
    non_strict_or_malformed_tool_calls_get_400_with_invalid_params_and_write_nothing,
    foreign_hosts_and_origins_get_403_before_authentication,
    allowed_hosts_from_the_flag_and_the_environment_answer,
    ending_a_legacy_session_answers_204_and_an_unknown_one_404,
    a_legacy_session_belongs_to_the_principal_that_opened_it,
    python_sdk_ends_a_legacy_session_without_a_warning,
);

fn token(db: &Db) -> String {
    add_principal(
        db,
        "alice",
        "acme",
        &["editor"],
        &["automation:write"],
        true,
    )
    .unwrap()
}

/// The headers of an authenticated 2026-07-28 request.
fn auth(token: &str) -> String {
    format!("Bearer {token}")
}

/// A 2026-07-28 `tools/call` body.
fn call_body(id: Value, mut params: Value) -> Vec<u8> {
    params["_meta"] = meta();
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
        .to_string()
        .into_bytes()
}

/// POSTs a `tools/call` with the standard 2026-07-28 headers.
fn post_call(server: &RawHttp, bearer: &str, name: &str, body: &[u8]) -> HttpResponse {
    server.post(
        &[
            ("Authorization", bearer),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", name),
        ],
        body,
    )
}

/// `get_operation_status` answers: the endpoint serves.
fn status_call(server: &RawHttp, bearer: &str, headers: &[(&str, &str)]) -> HttpResponse {
    let mut all = vec![
        ("Authorization", bearer),
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "get_operation_status"),
    ];
    all.extend_from_slice(headers);
    server.post(
        &all,
        &call_body(
            json!(1),
            json!({"name": "get_operation_status", "arguments": {"operation_id": "h-0"}}),
        ),
    )
}

fn assert_serves(r: &HttpResponse) {
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["result"]["structuredContent"]["state"],
        "unknown",
        "{}",
        r.body
    );
}

/// Asserts a 400 (or `status`) answer carrying JSON-RPC error `code` with `id`.
fn assert_jsonrpc_error(r: &HttpResponse, status: u16, code: i64, id: Value) -> Value {
    assert_eq!(r.status, status, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    let v: Value = serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body));
    assert_eq!(v["jsonrpc"], "2.0", "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    assert_eq!(v["id"], id, "{v}");
    v
}

fn nothing_written(db: &Db) {
    for table in ["operations", "operation_events", "issues", "automations"] {
        assert_eq!(count(db, table), 0, "{table}");
    }
}

fn bodies_that_are_not_strict_json_rpc_get_400_with_the_json_rpc_error(db: Db) {
    let bearer = auth(&token(&db));
    let server = RawHttp::start(&db, &[], &[]);
    let deep = "[".repeat(100_000);
    let parse_errors: Vec<(&[u8], &str)> = vec![
        (b"NaN", "non_finite_number"),
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":1e400}}"#,
            "number_out_of_range",
        ),
        (br#""\ud800""#, "lone_surrogate"),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"p\xffng\"}",
            "invalid_utf8",
        ),
        (br#"{"jsonrpc":"2.0","id":1,"#, "syntax"),
        (
            br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#,
            "duplicate_key",
        ),
        (deep.as_bytes(), "too_deep"),
    ];
    for (body, rule) in parse_errors {
        let r = server.post(&[("Authorization", &bearer)], body);
        let v = assert_jsonrpc_error(&r, 400, -32700, Value::Null);
        assert_eq!(v["error"]["data"]["rule"], rule, "{v}");
    }
    for body in [
        r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
        r#"42"#,
        r#"{"jsonrpc":"1.0","id":1,"method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","id":{},"method":"tools/list"}"#,
    ] {
        let r = server.post(&[("Authorization", &bearer)], body.as_bytes());
        assert_jsonrpc_error(&r, 400, -32600, Value::Null);
    }
    // Over the size limit: 413, with the same JSON-RPC error body.
    let big = vec![b' '; (4 << 20) + 1];
    let r = server.post(&[("Authorization", &bearer)], &big);
    let v = assert_jsonrpc_error(&r, 413, -32700, Value::Null);
    assert_eq!(v["error"]["data"]["rule"], "too_large");
    // Authentication still comes first: without a token, even garbage is 401.
    let r = server.post(&[], b"NaN");
    assert_eq!(r.status, 401, "{}", r.body);
    assert_serves(&status_call(&server, &bearer, &[]));
    nothing_written(&db);
}

fn non_strict_or_malformed_tool_calls_get_400_with_invalid_params_and_write_nothing(db: Db) {
    let bearer = auth(&token(&db));
    let server = RawHttp::start(&db, &[], &[]);
    let meta = meta().to_string();
    let dup = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"create_automation","arguments":{{"request_id":"dup-a","request_id":"dup-b","interval_minutes":30}},"_meta":{meta}}}}}"#
    );
    let r = post_call(&server, &bearer, "create_automation", dup.as_bytes());
    let v = assert_jsonrpc_error(&r, 400, -32602, json!(7));
    assert_eq!(v["error"]["data"]["code"], "invalid_arguments", "{v}");
    assert_eq!(v["error"]["data"]["rule"], "duplicate_key", "{v}");
    assert!(!r.body.contains("dup-"), "no input echoed: {}", r.body);
    let surrogate = format!(
        r#"{{"jsonrpc":"2.0","id":"s","method":"tools/call","params":{{"name":"create_automation","arguments":{{"request_id":"\ud800","interval_minutes":30}},"_meta":{meta}}}}}"#
    );
    let r = post_call(&server, &bearer, "create_automation", surrogate.as_bytes());
    let v = assert_jsonrpc_error(&r, 400, -32602, json!("s"));
    assert_eq!(v["error"]["data"]["rule"], "lone_surrogate", "{v}");

    let args = json!({"request_id": "h-1", "interval_minutes": 30});
    for (id, params) in [
        (json!(11), json!({"arguments": args})),
        (json!(12), json!({"name": 5, "arguments": args})),
        (
            json!(13),
            json!({"name": "create_automation", "arguments": "x"}),
        ),
        (
            json!(14),
            json!({"name": "create_automation", "arguments": [1]}),
        ),
        (
            json!(15),
            json!({"name": "create_automation", "arguments": args, "inputResponses": 12345}),
        ),
        (
            json!("r-16"),
            json!({"name": "create_automation", "arguments": args, "requestState": 5}),
        ),
    ] {
        let r = post_call(
            &server,
            &bearer,
            "create_automation",
            &call_body(id.clone(), params),
        );
        let v = assert_jsonrpc_error(&r, 400, -32602, id);
        assert_eq!(v["error"]["data"]["code"], "invalid_arguments", "{v}");
    }
    nothing_written(&db);
    // The strict call is served and written once.
    let r = post_call(
        &server,
        &bearer,
        "create_automation",
        &call_body(
            json!(20),
            json!({"name": "create_automation", "arguments": args}),
        ),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["result"]["isError"], false, "{}", r.body);
    assert_eq!(count(&db, "automations"), 1);
    assert_eq!(count(&db, "operations"), 1);
}

fn forbidden(r: &HttpResponse, code: &str) {
    assert_eq!(r.status, 403, "{}", r.body);
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["error"]["code"], code, "{v}");
}

fn foreign_hosts_and_origins_get_403_before_authentication(db: Db) {
    let bearer = auth(&token(&db));
    let server = RawHttp::start(&db, &[], &[]);
    let port = server.addr.rsplit(':').next().unwrap().to_string();
    forbidden(
        &status_call(&server, &bearer, &[("Host", "mcp.example.com")]),
        "host_not_allowed",
    );
    let rebinding = format!("evil.example:{port}");
    forbidden(
        &status_call(&server, &bearer, &[("Host", &rebinding)]),
        "host_not_allowed",
    );
    for origin in [
        "https://evil.example",
        "null",
        "http://localhost.evil.example:6274",
    ] {
        forbidden(
            &status_call(&server, &bearer, &[("Origin", origin)]),
            "origin_not_allowed",
        );
    }
    // Before the token is looked at: a foreign page learns nothing, not even 401.
    let r = server.post(&[("Origin", "https://evil.example")], b"{}");
    forbidden(&r, "origin_not_allowed");
    // Loopback Host, with no Origin or a loopback one (an inspector on another port): served.
    assert_serves(&status_call(&server, &bearer, &[]));
    let localhost = format!("localhost:{port}");
    assert_serves(&status_call(
        &server,
        &bearer,
        &[("Host", &localhost), ("Origin", "http://localhost:6274")],
    ));
    assert_serves(&status_call(
        &server,
        &bearer,
        &[("Origin", "http://127.0.0.1:3000")],
    ));
    // The health endpoints answer whatever the Host (probes address a server by its IP).
    for path in ["/healthz", "/readyz"] {
        let r = server.request("GET", path, &[("Host", "10.1.2.3:8080")], b"");
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    nothing_written(&db);
}

fn allowed_hosts_from_the_flag_and_the_environment_answer(db: Db) {
    let bearer = auth(&token(&db));
    let flagged = RawHttp::start(
        &db,
        &[
            "--allowed-host",
            "mcp.example.com",
            "--allowed-host",
            "api.example.com:443",
        ],
        &[],
    );
    assert_serves(&status_call(
        &flagged,
        &bearer,
        &[("Host", "mcp.example.com")],
    ));
    assert_serves(&status_call(
        &flagged,
        &bearer,
        &[
            ("Host", "MCP.Example.com:8080"),
            ("Origin", "https://mcp.example.com"),
        ],
    ));
    assert_serves(&status_call(
        &flagged,
        &bearer,
        &[("Host", "api.example.com:443")],
    ));
    forbidden(
        &status_call(&flagged, &bearer, &[("Host", "api.example.com:8443")]),
        "host_not_allowed",
    );
    forbidden(
        &status_call(
            &flagged,
            &bearer,
            &[
                ("Host", "mcp.example.com"),
                ("Origin", "https://evil.example"),
            ],
        ),
        "origin_not_allowed",
    );
    drop(flagged);

    let from_env = RawHttp::start(
        &db,
        &[],
        &[("TOOLLEDGER_ALLOWED_HOSTS", "a.example, mcp.example.net,")],
    );
    assert_serves(&status_call(
        &from_env,
        &bearer,
        &[("Host", "mcp.example.net")],
    ));
    assert_serves(&status_call(&from_env, &bearer, &[("Host", "a.example:9")]));
    forbidden(
        &status_call(&from_env, &bearer, &[("Host", "b.example")]),
        "host_not_allowed",
    );
    drop(from_env);

    // An entry that is no host is refused at start, with a stable code.
    let out = serve_command(
        &db,
        &[
            "--http".into(),
            "127.0.0.1:0".into(),
            "--allowed-host".into(),
            "https://x/y".into(),
        ],
    )
    .env_remove("TOOLLEDGER_ALLOWED_HOSTS")
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ALLOWED_HOST_INVALID"), "{stderr}");
    nothing_written(&db);
}

/// Opens a legacy (2025-11-25) session as `bearer`; its `Mcp-Session-Id`.
fn legacy_session(server: &RawHttp, bearer: &str) -> String {
    let init = server.post(
        &[("Authorization", bearer)],
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "wire-legacy", "version": "1"}}})
        .to_string()
        .as_bytes(),
    );
    assert_eq!(init.status, 200, "{}", init.body);
    init.header("mcp-session-id").unwrap().to_string()
}

/// Another principal presenting a legacy session's id can neither call in it nor end it: 404,
/// as for a session that does not exist; its owner still can.
fn a_legacy_session_belongs_to_the_principal_that_opened_it(db: Db) {
    let alice = auth(&token(&db));
    let bob = auth(&add_principal(&db, "bob", "acme", &["editor"], &[], true).unwrap());
    let server = RawHttp::start(&db, &[], &[]);
    let session = legacy_session(&server, &alice);
    let headers = |bearer: &str| {
        vec![
            ("Authorization".to_string(), bearer.to_string()),
            ("Mcp-Session-Id".to_string(), session.clone()),
            ("MCP-Protocol-Version".to_string(), "2025-11-25".to_string()),
            ("Content-Type".to_string(), "application/json".to_string()),
            (
                "Accept".to_string(),
                "application/json, text/event-stream".to_string(),
            ),
        ]
    };
    let send = |bearer: &str, method: &str, body: &[u8]| {
        let h = headers(bearer);
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        server.request(method, "/mcp", &h, body)
    };
    let initialized = send(
        &alice,
        "POST",
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert!(initialized.status < 300, "{}", initialized.body);
    let list = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let theirs = send(&bob, "POST", list);
    assert_eq!(theirs.status, 404, "{}", theirs.body);
    assert_eq!(theirs.json()["error"]["code"], "session_not_found");
    let ended = send(&bob, "DELETE", b"");
    assert_eq!(ended.status, 404, "{}", ended.body);
    let mine = send(&alice, "POST", list);
    assert_eq!(mine.status, 200, "{}", mine.body);
    assert!(mine.body.contains("get_operation_status"), "{}", mine.body);
    let end = send(&alice, "DELETE", b"");
    assert_eq!(end.status, 204, "{}", end.body);
}

fn ending_a_legacy_session_answers_204_and_an_unknown_one_404(db: Db) {
    let bearer = auth(&token(&db));
    let server = RawHttp::start(&db, &[], &[]);
    let session = legacy_session(&server, &bearer);
    let headers = [
        ("Authorization", bearer.as_str()),
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    let end = server.request("DELETE", "/mcp", &headers, b"");
    assert_eq!(end.status, 204, "{}", end.body);
    assert_eq!(end.body, "");
    // Gone: a request in it and a second DELETE are 404.
    let again = server.request("DELETE", "/mcp", &headers, b"");
    assert_eq!(again.status, 404, "{}", again.body);
    let mut post_headers = headers.to_vec();
    post_headers.push(("Content-Type", "application/json"));
    post_headers.push(("Accept", "application/json, text/event-stream"));
    let after = server.request(
        "POST",
        "/mcp",
        &post_headers,
        br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    );
    assert_eq!(after.status, 404, "{}", after.body);
    // DELETE still needs the token.
    let r = server.request("DELETE", "/mcp", &headers[1..], b"");
    assert_eq!(r.status, 401, "{}", r.body);
    nothing_written(&db);
}

/// The Python SDK in legacy mode over HTTP: it lists the tools, and on leaving ends its
/// session with DELETE; every log record about the termination is collected.
const LEGACY_SESSION_SCRIPT: &str = r#"
import asyncio, json, logging, sys
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

records = []
class Collect(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
log = logging.getLogger("mcp")
log.addHandler(Collect())
log.setLevel(logging.DEBUG)

async def main():
    url, token = sys.argv[1], sys.argv[2]
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
            tools = await client.list_tools()
            names = sorted(t.name for t in tools.tools)
    print(json.dumps({"tools": names,
                      "termination": [m for m in records if "termination" in m.lower()]}))

asyncio.run(main())
"#;

fn python_sdk_ends_a_legacy_session_without_a_warning(db: Db) {
    let Some(py) = python() else { return };
    let token = token(&db);
    let server = RawHttp::start(&db, &[], &[]);
    let url = format!("http://{}/mcp", server.addr);
    let out = Command::new(py)
        .arg("-c")
        .arg(LEGACY_SESSION_SCRIPT)
        .arg(&url)
        .arg(&token)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "get_operation_status"),
        "{v}"
    );
    assert_eq!(v["termination"], json!([]), "{v}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("Session termination failed"), "{stderr}");
}
