//! Streamable HTTP: bearer tokens from the principal store (stored hashed), 401 before any
//! dispatch, two principals isolated exactly as on stdio, and both lifecycles.

#[macro_use]
mod support;
#[path = "support/raw.rs"]
mod raw;

use raw::{HttpResponse, RawHttp};
use serde_json::{json, Value};
use support::wire::*;

on_both_backends!(
    health_endpoints_answer_without_a_token_and_sigterm_stops_the_server_cleanly,
    missing_unknown_or_malformed_tokens_get_401_before_dispatch,
    two_principals_over_http_are_isolated_as_on_stdio,
    legacy_initialize_lifecycle_over_http_lists_and_calls_tools,
    metrics_count_the_calls_and_the_ledger_and_logs_name_no_arguments,
    a_store_error_under_an_inline_call_is_logged_with_tool_operation_and_code,
    a_request_past_the_in_flight_limit_gets_503_unavailable_and_changes_nothing,
    a_connection_past_the_connection_limit_waits_until_one_closes,
);

fn start_http(db: &Db) -> RawHttp {
    start_http_logging(db, &[]).0
}

/// `serve --http` with `extra` flags; the receiver gets every stderr line after the address.
fn start_http_logging(db: &Db, extra: &[&str]) -> (RawHttp, std::sync::mpsc::Receiver<String>) {
    let mut args = vec!["--clock-epoch", "1800000000"];
    args.extend_from_slice(extra);
    RawHttp::start_logging(db, &args, &[("RUST_LOG", "info")])
}

fn post(server: &RawHttp, headers: &[(&str, &str)], body: &Value) -> HttpResponse {
    server.post(headers, body.to_string().as_bytes())
}

/// `GET path` without any credentials.
fn get(server: &RawHttp, path: &str) -> HttpResponse {
    server.request("GET", path, &[], b"")
}

/// A 2026-07-28 `tools/call` as `token`; returns the JSON-RPC `result`.
fn call(server: &RawHttp, token: &str, params: Value) -> Value {
    call_reply(server, token, params)["result"].clone()
}

/// `tools/call` returning the whole JSON-RPC reply.
fn call_reply(server: &RawHttp, token: &str, params: Value) -> Value {
    let mut params = params;
    params["_meta"] = meta();
    let name = params["name"].as_str().unwrap().to_string();
    let auth = format!("Bearer {token}");
    let r = post(
        server,
        &[
            ("Authorization", &auth),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", &name),
        ],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn args(op: &str) -> Value {
    json!({"operation_id": op, "title": "spec"})
}

fn health_endpoints_answer_without_a_token_and_sigterm_stops_the_server_cleanly(db: Db) {
    let mut server = start_http(&db);
    let live = get(&server, "/healthz");
    assert_eq!(live.status, 200, "{}", live.body);
    assert_eq!(live.json(), json!({"status": "ok"}));
    let ready = get(&server, "/readyz");
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(ready.json(), json!({"status": "ready"}));
    // The MCP endpoint itself still needs a token.
    let denied = post(
        &server,
        &[],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}),
    );
    assert_eq!(denied.status, 401);

    // SIGTERM: stop accepting, finish what is in flight, exit 0.
    let pid = server.child.id() as i32;
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = server.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

fn missing_unknown_or_malformed_tokens_get_401_before_dispatch(db: Db) {
    let alice = add_principal(&db, "alice", "acme", &["editor"], &[], true).unwrap();
    let server = start_http(&db);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "create_issue", "arguments": args("h-1"), "_meta": meta()}});
    let forged = format!("{}0", &alice[..alice.len() - 1]);
    for headers in [
        vec![],
        vec![("Authorization", "Bearer tl_unknown")],
        vec![("Authorization", "Basic YWxpY2U6eA==")],
        vec![("Authorization", "Bearer ")],
        vec![("Authorization", forged.as_str())],
    ] {
        let mut h = headers.clone();
        h.push(("MCP-Protocol-Version", "2026-07-28"));
        let r = post(&server, &h, &body);
        assert_eq!(r.status, 401, "{headers:?}: {}", r.body);
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        // The body is JSON, and says so.
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.json()["error"]["code"], "unauthorized", "{}", r.body);
        assert!(!r.body.contains("tl_"), "no token echoed: {}", r.body);
    }
    assert_eq!(count(&db, "operations"), 0);
    assert_eq!(count(&db, "issues"), 0);
    // Only the hash is stored.
    let stored = scalar(
        &db,
        "SELECT count(*) FROM principal_tokens WHERE length(token_sha256) = 64",
    );
    assert_eq!(stored, 1);
    // The token is an opaque ASCII word, so it can stand in the query text as a literal.
    assert!(
        alice
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
        "{alice}"
    );
    let leaked = scalar(
        &db,
        &format!("SELECT count(*) FROM principal_tokens WHERE token_sha256 = '{alice}'"),
    );
    assert_eq!(leaked, 0);
}

fn two_principals_over_http_are_isolated_as_on_stdio(db: Db) {
    let alice = add_principal(&db, "alice", "acme", &["editor"], &[], true).unwrap();
    let bob = add_principal(&db, "bob", "acme", &["editor"], &[], true).unwrap();
    let server = start_http(&db);

    let first = call(
        &server,
        &alice,
        json!({"name": "create_issue", "arguments": args("h-2")}),
    );
    let token = request_state(&first);
    let cont = |who: &str, state: &str, text: &str| {
        call_reply(
            &server,
            who,
            json!({"name": "create_issue", "arguments": args("h-2"), "requestState": state,
                   "inputResponses": body(text)}),
        )
    };
    let done = cont(&alice, &token, "alpha")["result"].clone();
    assert_eq!(
        done["structuredContent"],
        json!({"operationId": "h-2", "effectId": 1, "result": "created 1",
               "replayed": false, "state": "applied"})
    );
    let again = cont(&alice, &token, "alpha")["result"].clone();
    assert_eq!(again["structuredContent"]["replayed"], true);

    let stolen = cont(&bob, &token, "alpha");
    assert_state_invalid(&stolen);
    let st = call(
        &server,
        &bob,
        json!({"name": "get_operation_status", "arguments": {"operation_id": "h-2"}}),
    );
    assert_eq!(st["structuredContent"]["state"], "unknown");
    assert_eq!(st["structuredContent"]["principal"], "bob");
    // Operation ids are each principal's own: bob's call under alice's id is his own
    // operation (asked for its body like any new one), neither refused nor told hers exists.
    let bobs = call(
        &server,
        &bob,
        json!({"name": "create_issue", "arguments": args("h-2")}),
    );
    let bobs_state = request_state(&bobs);
    let done = cont(&bob, &bobs_state, "bravo")["result"].clone();
    assert_eq!(done["structuredContent"]["replayed"], false, "{done}");
    assert_eq!(done["structuredContent"]["state"], "applied", "{done}");
    // Alice's state is still refused for bob, bob's for alice.
    assert_state_invalid(&cont(&bob, &token, "alpha"));
    assert_state_invalid(&cont(&alice, &bobs_state, "bravo"));

    let mine = call(
        &server,
        &alice,
        json!({"name": "get_operation_status", "arguments": {"operation_id": "h-2"}}),
    );
    assert_eq!(mine["structuredContent"]["state"], "applied");
    assert_eq!(mine["structuredContent"]["storedResult"], "created 1");
    assert_eq!(mine["structuredContent"]["principal"], "alice");
    assert_eq!(count(&db, "issues"), 2);
    assert_eq!(count(&db, "operations"), 2);
}

fn legacy_initialize_lifecycle_over_http_lists_and_calls_tools(db: Db) {
    let alice = add_principal(&db, "alice", "acme", &["editor"], &[], true).unwrap();
    let server = start_http(&db);
    let auth = format!("Bearer {alice}");
    let init = post(
        &server,
        &[("Authorization", &auth)],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "legacy-http", "version": "1"}}}),
    );
    assert_eq!(init.status, 200, "{}", init.body);
    let session = init.header("mcp-session-id").unwrap().to_string();
    let v = init.json();
    assert_eq!(v["result"]["protocolVersion"], "2025-11-25");
    let headers = [
        ("Authorization", auth.as_str()),
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    let note = post(
        &server,
        &headers,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert_eq!(note.status, 202, "{}", note.body);
    let list = post(
        &server,
        &headers,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    );
    let names: Vec<String> = list.json()["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        names.iter().any(|n| n == "get_operation_status"),
        "{names:?}"
    );
    let st = post(
        &server,
        &headers,
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "get_operation_status", "arguments": {"operation_id": "h-3"}}}),
    );
    assert_eq!(st.json()["result"]["structuredContent"]["state"], "unknown");
    assert_eq!(count(&db, "operations"), 0);
}

/// The value of the one sample of `name` whose labels include every `label="value"` given.
fn sample(metrics: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn metrics_count_the_calls_and_the_ledger_and_logs_name_no_arguments(db: Db) {
    let token = add_principal(&db, "meter", "acme", &[], &["automation:write"], true).unwrap();
    // At debug level too: rmcp's own debug events carry whole messages, which the server keeps
    // out of its log unless RUST_LOG names rmcp.
    let (server, logs) = RawHttp::start_logging(
        &db,
        &["--clock-epoch", "1800000000", "--log-format", "json"],
        &[("RUST_LOG", "debug")],
    );
    let create = json!({"name": "create_automation",
                        "arguments": {"request_id": "m-1", "interval_minutes": 30}});
    let first = call(&server, &token, create.clone());
    assert_eq!(first["structuredContent"]["replayed"], false, "{first}");
    let id = first["structuredContent"]["id"].clone();
    let again = call(&server, &token, create);
    assert_eq!(again["structuredContent"]["replayed"], true);
    let stale = call(
        &server,
        &token,
        json!({"name": "set_interval", "arguments": {"request_id": "m-2", "automation_id": id,
               "expected_version": 7, "interval_minutes": 45}}),
    );
    assert_eq!(error_code(&stale), "version_conflict");

    // No token needed: /metrics is outside the bearer layer, like the health endpoints.
    let m = get(&server, "/metrics");
    assert_eq!(m.status, 200, "{}", m.body);
    let calls = |tool: &str, outcome: &str| {
        sample(
            &m.body,
            "toolledger_tool_calls_total",
            &[("tool", tool), ("outcome", outcome)],
        )
    };
    assert_eq!(calls("create_automation", "fresh"), Some(1.0), "{}", m.body);
    assert_eq!(calls("create_automation", "replayed"), Some(1.0));
    assert_eq!(calls("set_interval", "version_conflict"), Some(1.0));
    assert!(
        sample(
            &m.body,
            "toolledger_tool_call_duration_seconds_count",
            &[("tool", "create_automation")]
        )
        .is_some(),
        "{}",
        m.body
    );
    // Latencies are histograms with buckets (aggregatable across instances), not summaries,
    // and every series says what it is.
    assert!(
        sample(
            &m.body,
            "toolledger_tool_call_duration_seconds_bucket",
            &[("tool", "create_automation"), ("le", "0.001")]
        )
        .is_some(),
        "{}",
        m.body
    );
    assert!(!m.body.contains("quantile=\""), "{}", m.body);
    for line in m.body.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = line.split(' ').nth(2).unwrap();
        assert!(
            m.body.contains(&format!("# HELP {name} ")),
            "{name} has no HELP: {}",
            m.body
        );
    }
    let applied = scalar(
        &db,
        "SELECT count(*) FROM operations WHERE state = 'applied'",
    );
    assert_eq!(
        sample(&m.body, "toolledger_operations", &[("state", "applied")]),
        Some(applied as f64)
    );
    assert_eq!(
        sample(
            &m.body,
            "toolledger_operations",
            &[("state", "outcome_unknown")]
        ),
        Some(0.0)
    );
    assert!(sample(&m.body, "toolledger_outbox_events", &[("state", "pending")]).is_some());
    // Stopped as an operator stops it, so its last log lines are written.
    assert_eq!(server.stop(), 0);

    let lines: Vec<Value> = logs
        .iter()
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    let replayed = lines
        .iter()
        .find(|l| l["tool"] == "create_automation" && l["outcome"] == "replayed")
        .unwrap_or_else(|| panic!("no log line of the replay: {lines:?}"));
    assert_eq!(replayed["principal"], "meter");
    assert_eq!(replayed["level"], "INFO");

    let all = lines
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    for secret in [token.as_str(), "interval_minutes", "expected_version"] {
        assert!(!all.contains(secret), "a log line names {secret}: {all}");
    }
}

fn a_store_error_under_an_inline_call_is_logged_with_tool_operation_and_code(db: Db) {
    let token = add_principal(&db, "writer", "acme", &[], &["automation:write"], true).unwrap();
    let (server, logs) = start_http_logging(&db, &["--log-format", "json"]);
    // The server has migrated; from now on the database refuses every new automation, with a
    // message naming a path that must not reach the log.
    let refusal = "injected refusal at /secret/path";
    match &db {
        Db::Sqlite(d) => rusqlite::Connection::open(d.path())
            .unwrap()
            .execute_batch(&format!(
                "CREATE TRIGGER injected BEFORE INSERT ON automations
                 BEGIN SELECT RAISE(ABORT, '{refusal}'); END;"
            ))
            .unwrap(),
        Db::Postgres { store, .. } => {
            let sql = format!(
                "CREATE FUNCTION injected() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN RAISE EXCEPTION '{refusal}'; END $$;
                 CREATE TRIGGER injected BEFORE INSERT ON automations
                 FOR EACH ROW EXECUTE FUNCTION injected();"
            );
            store
                .write_blocking(move |tx| tx.execute_batch(&sql))
                .unwrap()
        }
    }
    let failed = call(
        &server,
        &token,
        json!({"name": "create_automation",
               "arguments": {"request_id": "store-err-1", "interval_minutes": 30}}),
    );
    assert_eq!(error_code(&failed), "unavailable", "{failed}");
    assert_eq!(count(&db, "operations"), 0, "nothing was committed");
    assert_eq!(server.stop(), 0);

    let lines: Vec<Value> = logs
        .iter()
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    let logged = lines
        .iter()
        .find(|l| l["target"] == "toolledger::engine")
        .unwrap_or_else(|| panic!("no store error in the log: {lines:?}"));
    assert_eq!(logged["level"], "WARN");
    assert_eq!(logged["message"], "store error");
    assert_eq!(logged["tool"], "create_automation");
    assert_eq!(logged["operation"], "store-err-1");
    assert_eq!(logged["step"], "execute");
    assert_eq!(logged["code"], "unavailable");
    assert!(logged["error"].is_string(), "{logged}");
    let all = lines
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    for leak in [
        "injected",
        "/secret/path",
        "INSERT",
        "interval_minutes",
        token.as_str(),
    ] {
        assert!(!all.contains(leak), "a log line names {leak}: {all}");
    }
}

/// A `tools/call` of `create_automation` under `request_id` as raw HTTP: the request head
/// (with `Content-Length`) and the body, separately.
fn create_request(server: &RawHttp, token: &str, request_id: &str) -> (String, Vec<u8>) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "create_automation", "_meta": meta(),
        "arguments": {"request_id": request_id, "interval_minutes": 30}}})
    .to_string()
    .into_bytes();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Authorization: Bearer {token}\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: create_automation\r\n\
         Content-Length: {}\r\n\r\n",
        server.addr,
        body.len()
    );
    (head, body)
}

fn a_request_past_the_in_flight_limit_gets_503_unavailable_and_changes_nothing(db: Db) {
    use std::io::{Read, Write};
    let token = add_principal(&db, "busy", "acme", &[], &["automation:write"], true).unwrap();
    let server = start_http_logging(&db, &["--max-in-flight", "1"]).0;

    // A takes the one slot: its head is sent, its body only in part, so the server holds the
    // request (reading the body) until the rest comes.
    let (head, body) = create_request(&server, &token, "held-1");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut held = 'held: loop {
        let mut held = std::net::TcpStream::connect(&server.addr).unwrap();
        held.write_all(head.as_bytes()).unwrap();
        held.write_all(&body[..10]).unwrap();
        held.flush().unwrap();
        // Wait until it holds the slot: a bare GET then finds no room (and is otherwise 401).
        // A probe that held the slot when A arrived had A refused: then A starts over.
        loop {
            let probe = get(&server, "/mcp");
            if probe.status == 503 {
                break 'held held;
            }
            assert_eq!(probe.status, 401, "{probe:?}");
            assert!(
                std::time::Instant::now() < deadline,
                "the held request never took the slot"
            );
            held.set_nonblocking(true).unwrap();
            let answered = matches!(held.peek(&mut [0u8; 1]), Ok(n) if n > 0);
            held.set_nonblocking(false).unwrap();
            if answered {
                continue 'held;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };

    // B, a whole call, is refused at once: 503, Retry-After, the stable code, nothing run.
    let (b_head, b_body) = create_request(&server, &token, "refused-1");
    let mut whole = b_head.into_bytes();
    whole.extend_from_slice(&b_body);
    let refused = server.request("POST", "/mcp", &[], b"");
    assert_eq!(
        refused.status, 503,
        "a bodiless POST is refused before it is read"
    );
    let mut b = std::net::TcpStream::connect(&server.addr).unwrap();
    b.write_all(&whole).unwrap();
    let mut raw = String::new();
    let _ = b.read_to_string(&mut raw);
    assert!(raw.starts_with("HTTP/1.1 503"), "{raw}");
    assert!(raw.to_ascii_lowercase().contains("retry-after: 1"), "{raw}");
    let (_, json_body) = raw.split_once("\r\n\r\n").unwrap();
    let v: Value = serde_json::from_str(json_body).unwrap();
    assert_eq!(v["error"]["code"], "unavailable", "{raw}");
    for secret in [token.as_str(), "refused-1", "interval_minutes"] {
        assert!(!raw.contains(secret), "the refusal echoes {secret}: {raw}");
    }
    // The official SDKs' clients, refused the same way, report a failed exchange (never a
    // result), and nothing ran.
    let sdk_ids = ["sdk-py", "sdk-ts"];
    let sdks = sdk_drivers();
    for ((program, driver), id) in sdks.iter().zip(sdk_ids) {
        let (code, lines) = sdk_call(program, driver, &server, &token, id);
        assert_eq!(code, Some(3), "{driver:?}: a lost exchange: {lines:?}");
        assert!(
            lines.iter().all(|l| l.get("result").is_none()),
            "{driver:?}: {lines:?}"
        );
    }
    assert_eq!(scalar(&db, "SELECT count(*) FROM operations"), 0);
    assert_eq!(scalar(&db, "SELECT count(*) FROM automations"), 0);

    // A's body completes: it runs as if nothing happened.
    held.write_all(&body[10..]).unwrap();
    let mut raw = String::new();
    let _ = held.read_to_string(&mut raw);
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    let (_, json_body) = raw.split_once("\r\n\r\n").unwrap();
    let v: Value = serde_json::from_str(json_body).unwrap_or_else(|e| panic!("{e}: {raw}"));
    assert_eq!(v["result"]["structuredContent"]["replayed"], false, "{raw}");

    // B, retried under the same id once there is room, is applied now (nothing was stored
    // before), and its retry replays.
    let create = json!({"name": "create_automation",
                        "arguments": {"request_id": "refused-1", "interval_minutes": 30}});
    let first = call(&server, &token, create.clone());
    assert_eq!(first["structuredContent"]["replayed"], false, "{first}");
    let again = call(&server, &token, create);
    assert_eq!(again["structuredContent"]["replayed"], true, "{again}");
    // The SDKs' retries under the same ids are applied now.
    for ((program, driver), id) in sdks.iter().zip(sdk_ids) {
        let (code, lines) = sdk_call(program, driver, &server, &token, id);
        assert_eq!(code, Some(0), "{driver:?}: {lines:?}");
        let result = lines.iter().find_map(|l| l.get("result")).unwrap();
        assert_eq!(result["structuredContent"]["replayed"], false, "{result}");
    }
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM automations"),
        2 + sdks.len() as i64
    );

    let m = get(&server, "/metrics");
    let shed = sample(&m.body, "toolledger_http_requests_shed_total", &[]).unwrap_or(0.0);
    assert!(
        shed >= 3.0,
        "the probe, the bodiless POST and B: {}",
        m.body
    );
}

/// The official SDKs' drivers: (interpreter, script) of the Python SDK's `Client` and the
/// TypeScript SDK v2 (none when an interpreter is missing outside CI; a failure in CI).
fn sdk_drivers() -> Vec<(std::path::PathBuf, std::path::PathBuf)> {
    let mut drivers = Vec::new();
    if let Some(py) = support::clients::python() {
        drivers.push((py, support::clients::proxy_fixture("py_client.py")));
    }
    if let Some(node) = support::clients::node() {
        drivers.push((node, support::clients::ts_client()));
    }
    drivers
}

/// One `create_automation` under `request_id` by an SDK driver over HTTP (MCP 2026-07-28);
/// its exit code (3: the exchange was lost) and output lines.
fn sdk_call(
    program: &std::path::Path,
    driver: &std::path::Path,
    server: &RawHttp,
    token: &str,
    request_id: &str,
) -> (Option<i32>, Vec<Value>) {
    let spec = json!({"transport": "http", "url": format!("http://{}/mcp", server.addr),
        "token": token, "lifecycle": "2026-07-28", "api": "client",
        "calls": [{"name": "create_automation",
                   "arguments": {"request_id": request_id, "interval_minutes": 30}}]});
    let out = std::process::Command::new(program)
        .arg(driver)
        .arg(spec.to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (out.status.code(), lines)
}

/// Sends `GET /healthz` on `stream` (keep-alive) and reads one response: its status line, or
/// `None` when nothing came within `wait`.
fn healthz_on(
    stream: &mut std::net::TcpStream,
    addr: &str,
    wait: std::time::Duration,
) -> Option<String> {
    use std::io::{Read, Write};
    stream
        .write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .unwrap();
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    Some(text.lines().next().unwrap_or_default().to_string())
}

fn a_connection_past_the_connection_limit_waits_until_one_closes(db: Db) {
    let server = start_http_logging(&db, &["--max-connections", "1"]).0;
    let long = std::time::Duration::from_secs(30);
    // A holds the one connection (keep-alive) and is served.
    let mut a = std::net::TcpStream::connect(&server.addr).unwrap();
    let status = healthz_on(&mut a, &server.addr, long).expect("A is served");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    // B's connect completes in the kernel, but the server does not take it while A is open.
    let mut b = std::net::TcpStream::connect(&server.addr).unwrap();
    let early = healthz_on(&mut b, &server.addr, std::time::Duration::from_millis(500));
    assert_eq!(early, None, "B was served while A held the only connection");
    // A closes: B is taken and served.
    drop(a);
    use std::io::Read;
    b.set_read_timeout(Some(long)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
        let n = b.read(&mut buf).unwrap();
        assert!(n > 0, "B's connection closed unanswered");
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}
