//! Traces against a real OTLP/HTTP receiver (`tests/py/otlp_receiver.py`, which decodes each
//! export with the official protobuf definitions of `opentelemetry-proto`): the span tree of
//! a fresh call, a replay, a conflict and a lost reply, from `serve` (stdio and HTTP) and
//! through the proxy (to a Python upstream, and to `serve` as the upstream, whose span is the
//! forward's child); the caller's `traceparent` honoured from `_meta` and from the HTTP
//! header; no operation id or argument value anywhere in the export; and a collector that is
//! not there changes no answer.

#[macro_use]
mod support;
#[path = "support/raw.rs"]
mod raw;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::clients::{proxy_fixture, python, repo};
use support::toolledger;
use support::wire::*;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{PARENT_ID}-01")
}

/// The receiver: a Python child writing the spans it gets to `out` as JSON lines.
struct Receiver {
    child: Child,
    out: PathBuf,
    port: u16,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    fn start(dir: &Path) -> Option<Receiver> {
        let python = python()?;
        let out = dir.join("spans.jsonl");
        let mut child = Command::new(python)
            .arg(repo().join("crates/toolledger-cli/tests/py/otlp_receiver.py"))
            .arg(&out)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("receiver said {line:?} (is opentelemetry-proto installed?)"))
            .parse()
            .unwrap();
        Some(Receiver { child, out, port })
    }

    /// The variables that send a process's spans here, promptly.
    fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "50".into()),
            ("OTEL_SERVICE_NAME".into(), "toolledger-test".into()),
        ]
    }

    /// The spans received so far.
    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Waits until at least `n` spans of kind SERVER arrived; returns every span.
    fn wait_for_servers(&self, n: usize) -> Vec<Value> {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let spans = self.spans();
            if spans.iter().filter(|s| s["kind"] == "SERVER").count() >= n {
                return spans;
            }
            assert!(
                Instant::now() < until,
                "{} spans arrived, {n} server spans awaited: {spans:#?}",
                spans.len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The histogram data points received so far (every export: cumulative readings).
    fn metrics(&self) -> Vec<Value> {
        std::fs::read_to_string(self.out.with_extension("jsonl.metrics"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The raw decoded exports, whole.
    fn raw(&self) -> String {
        std::fs::read_to_string(self.out.with_extension("jsonl.raw")).unwrap_or_default()
    }
}

fn with_env(c: &mut Command, env: &[(String, String)]) {
    for (k, v) in env {
        c.env(k, v);
    }
}

/// A 2026-07-28 `tools/call` with `traceparent` in its `_meta`; the whole reply.
fn traced_call(s: &mut Server, id: i64, name: &str, arguments: Value) -> Value {
    let mut m = meta();
    m["traceparent"] = json!(traceparent());
    m["tracestate"] = json!("vendor=1");
    s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                   "params": {"name": name, "arguments": arguments, "_meta": m}}));
    let reply = s.recv();
    assert_eq!(reply["id"], id, "{reply}");
    reply["result"].clone()
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

/// The server span answering request `id`.
fn server_span(spans: &[Value], id: i64) -> &Value {
    spans
        .iter()
        .find(|s| s["kind"] == "SERVER" && attr(s, "jsonrpc.request.id") == &json!(id.to_string()))
        .unwrap_or_else(|| panic!("no server span for request {id}: {spans:#?}"))
}

fn children<'a>(spans: &'a [Value], parent: &Value) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| s["parent_span_id"] == parent["span_id"] && s["trace_id"] == parent["trace_id"])
        .collect()
}

fn events(span: &Value) -> Vec<String> {
    span["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect()
}

/// The conventions' attributes every tools/call server span carries, under the caller's trace.
fn assert_tool_call(span: &Value, tool: &str, transport: &str) {
    assert_eq!(span["name"], format!("tools/call {tool}"), "{span}");
    assert_eq!(span["trace_id"], TRACE_ID, "{span}");
    assert_eq!(span["parent_span_id"], PARENT_ID, "{span}");
    assert_eq!(attr(span, "mcp.method.name"), "tools/call", "{span}");
    assert_eq!(attr(span, "gen_ai.tool.name"), tool, "{span}");
    assert_eq!(
        attr(span, "gen_ai.operation.name"),
        "execute_tool",
        "{span}"
    );
    assert_eq!(attr(span, "mcp.protocol.version"), "2026-07-28", "{span}");
    assert_eq!(attr(span, "network.transport"), transport, "{span}");
    assert!(attr(span, "mcp.session.id").is_null(), "{span}");
    assert_eq!(span["service"], "toolledger-test", "{span}");
}

/// Nothing the caller chose as a key or argument is anywhere in the export.
fn assert_exports_none_of(receiver: &Receiver, secrets: &[&str]) {
    let raw = receiver.raw();
    assert!(!raw.is_empty());
    for s in secrets {
        assert!(!raw.contains(s), "{s:?} is in the export:\n{raw}");
    }
}

/// Requests 1 to 3 to `serve`: `create_automation` under `key` every `minutes` (executed), the
/// same again (replayed), and under `key` every `minutes + 1` (a conflict).
fn fresh_replay_conflict(s: &mut Server, key: &str, minutes: i64) {
    let args = json!({"request_id": key, "interval_minutes": minutes});
    let fresh = traced_call(s, 1, "create_automation", args.clone());
    assert_eq!(fresh["isError"], false, "{fresh}");
    let again = traced_call(s, 2, "create_automation", args);
    assert_eq!(again["structuredContent"]["replayed"], true, "{again}");
    let other = json!({"request_id": key, "interval_minutes": minutes + 1});
    let conflict = traced_call(s, 3, "create_automation", other);
    assert_eq!(error_code(&conflict), "operation_conflict");
}

#[test]
fn serve_on_stdio_continues_the_callers_trace_and_says_what_the_ledger_did() {
    let dir = tempfile::tempdir().unwrap();
    let Some(receiver) = Receiver::start(dir.path()) else {
        return;
    };
    let db = Db::sqlite();
    let mut c = serve_command(&db, &["--principal".into(), "alice".into()]);
    with_env(&mut c, &receiver.env());
    let mut s = Server::spawn(c);
    fresh_replay_conflict(&mut s, "key-otel-zq81", 1417);
    let status = traced_call(
        &mut s,
        4,
        "get_operation_status",
        json!({"operation_id": "key-otel-zq81"}),
    );
    assert_eq!(status["isError"], false, "{status}");
    assert_eq!(s.finish(), 0);
    let spans = receiver.wait_for_servers(4);

    let fresh = server_span(&spans, 1);
    assert_tool_call(fresh, "create_automation", "pipe");
    assert_eq!(attr(fresh, "toolledger.outcome"), "executed");
    assert_eq!(events(fresh), ["toolledger.record"]);
    assert!(attr(fresh, "error.type").is_null(), "{fresh}");
    let replay = server_span(&spans, 2);
    assert_tool_call(replay, "create_automation", "pipe");
    assert_eq!(attr(replay, "toolledger.outcome"), "replayed");
    assert_eq!(events(replay), ["toolledger.replay"]);
    let conflict = server_span(&spans, 3);
    assert_eq!(attr(conflict, "toolledger.outcome"), "conflict");
    assert_eq!(attr(conflict, "error.type"), "tool_error");
    assert_eq!(
        attr(conflict, "toolledger.error_code"),
        "operation_conflict"
    );
    assert_eq!(conflict["status"], "ERROR");
    let status = server_span(&spans, 4);
    assert_tool_call(status, "get_operation_status", "pipe");
    assert!(attr(status, "toolledger.outcome").is_null(), "{status}");
    assert_eq!(events(status), ["toolledger.status"]);
    assert_exports_none_of(
        &receiver,
        &["key-otel-zq81", "int_value: 1417", "int_value: 1418"],
    );
}

#[test]
fn serve_over_http_takes_the_trace_context_from_the_headers() {
    let dir = tempfile::tempdir().unwrap();
    let Some(receiver) = Receiver::start(dir.path()) else {
        return;
    };
    let db = Db::sqlite();
    let token = add_principal(&db, "alice", "acme", &[], &["automation:write"], true).unwrap();
    let owned = receiver.env();
    let env: Vec<(&str, &str)> = owned
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let server = raw::RawHttp::start(&db, &[], &env);
    let auth = format!("Bearer {token}");
    let tp = traceparent();
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "create_automation",
        "arguments": {"request_id": "key-http-zq82", "interval_minutes": 1419},
        "_meta": meta()}});
    let r = server.post(
        &[
            ("Authorization", &auth),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "create_automation"),
            ("traceparent", &tp),
        ],
        body.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(server.stop(), 0);
    let spans = receiver.wait_for_servers(1);
    let span = server_span(&spans, 7);
    assert_tool_call(span, "create_automation", "tcp");
    assert_eq!(attr(span, "toolledger.outcome"), "executed");
    assert_exports_none_of(&receiver, &["key-http-zq82", "int_value: 1419", &token]);
}

/// `toolledger proxy` as alice on a fresh ledger, in front of `upstream`, with `extra` flags.
fn proxy(
    db: &Db,
    dir: &Path,
    extra: &[&str],
    upstream: &[&str],
    env: &[(String, String)],
) -> Server {
    let mut c = toolledger();
    c.arg("proxy")
        .args(db.store_args())
        .args(["--principal", "alice"])
        .args(extra)
        .arg("--")
        .args(upstream)
        .env("CHARGE_DB", dir.join("charges.sqlite"))
        .env_remove("TOOLLEDGER_STATE_KEY_HEX")
        .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
        .envs(db.key_env());
    with_env(&mut c, env);
    let log = std::fs::File::create(dir.join("proxy.log")).unwrap();
    Server::spawn_with_stderr(c, Stdio::from(log))
}

#[test]
fn the_proxy_traces_a_fresh_call_a_replay_a_conflict_and_a_lost_reply() {
    let dir = tempfile::tempdir().unwrap();
    let Some(receiver) = Receiver::start(dir.path()) else {
        return;
    };
    let python = python().unwrap();
    let config = dir.path().join("proxy.toml");
    std::fs::write(&config, "[tools.slow]\ncall_timeout_seconds = 1\n").unwrap();
    let db = Db::sqlite();
    let mut p = proxy(
        &db,
        dir.path(),
        &["--config", config.to_str().unwrap()],
        &[
            python.to_str().unwrap(),
            proxy_fixture("charge_server.py").to_str().unwrap(),
        ],
        &receiver.env(),
    );
    let charge =
        json!({"customer": "cust-zq83", "amount_cents": 4820, "operation_id": "key-proxy-zq84"});
    let fresh = traced_call(&mut p, 1, "charge", charge.clone());
    assert_eq!(fresh["isError"], false, "{fresh}");
    let again = traced_call(&mut p, 2, "charge", charge);
    assert_eq!(
        again["_meta"]["io.toolledger/ledger"]["replayed"], true,
        "{again}"
    );
    let other =
        json!({"customer": "cust-zq83", "amount_cents": 4821, "operation_id": "key-proxy-zq84"});
    let conflict = traced_call(&mut p, 3, "charge", other);
    assert_eq!(error_code(&conflict), "operation_conflict");
    let lost = traced_call(
        &mut p,
        4,
        "slow",
        json!({"seconds": 3, "operation_id": "key-lost-zq85"}),
    );
    assert_eq!(error_code(&lost), "outcome_unknown", "{lost}");
    assert_eq!(p.finish(), 0);
    let spans = receiver.wait_for_servers(4);

    let fresh = server_span(&spans, 1);
    assert_tool_call(fresh, "charge", "pipe");
    assert_eq!(attr(fresh, "toolledger.outcome"), "executed");
    assert_eq!(events(fresh), ["toolledger.accept", "toolledger.record"]);
    assert!(attr(fresh, "toolledger.status_ref").is_string(), "{fresh}");
    let forward = children(&spans, fresh);
    assert_eq!(forward.len(), 1, "{forward:#?}");
    assert_eq!(forward[0]["kind"], "CLIENT");
    assert_eq!(forward[0]["name"], "tools/call charge");
    assert_eq!(attr(forward[0], "toolledger.step"), "forward");
    assert!(attr(forward[0], "error.type").is_null(), "{}", forward[0]);

    let replay = server_span(&spans, 2);
    assert_eq!(attr(replay, "toolledger.outcome"), "replayed");
    assert!(
        children(&spans, replay).is_empty(),
        "a replay forwards nothing"
    );
    let conflict = server_span(&spans, 3);
    assert_eq!(attr(conflict, "toolledger.outcome"), "conflict");
    assert!(children(&spans, conflict).is_empty());

    let lost = server_span(&spans, 4);
    assert_tool_call(lost, "slow", "pipe");
    assert_eq!(attr(lost, "toolledger.outcome"), "unknown");
    assert_eq!(attr(lost, "toolledger.error_code"), "outcome_unknown");
    assert_eq!(attr(lost, "error.type"), "tool_error");
    assert!(attr(lost, "toolledger.status_ref").is_string(), "{lost}");
    let forward = children(&spans, lost);
    assert_eq!(forward.len(), 1, "{forward:#?}");
    assert_eq!(attr(forward[0], "toolledger.step"), "forward");
    assert_eq!(attr(forward[0], "error.type"), "timeout");
    assert_eq!(forward[0]["status"], "ERROR");
    assert_exports_none_of(
        &receiver,
        &[
            "key-proxy-zq84",
            "key-lost-zq85",
            "cust-zq83",
            "int_value: 4820",
            "int_value: 4821",
        ],
    );
}

#[test]
fn through_the_proxy_to_serve_the_upstreams_span_is_the_forwards_child() {
    let dir = tempfile::tempdir().unwrap();
    let Some(receiver) = Receiver::start(dir.path()) else {
        return;
    };
    let db = Db::sqlite();
    let upstream_db = dir.path().join("upstream.sqlite");
    add_principal(
        &upstream_db,
        "bob",
        "local",
        &[],
        &["automation:write"],
        false,
    );
    let mut p = proxy(
        &db,
        dir.path(),
        &[],
        &[
            support::BIN,
            "serve",
            "--db",
            upstream_db.to_str().unwrap(),
            "--principal",
            "bob",
        ],
        &receiver.env(),
    );
    let args = json!({"request_id": "key-up-zq86", "interval_minutes": 1422, "operation_id": "key-proxy-zq87"});
    let r = traced_call(&mut p, 1, "create_automation", args);
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(p.finish(), 0);
    let spans = receiver.wait_for_servers(2);
    // Both answered a request with id 1: the proxy's is the one under the caller's span.
    let proxied = spans
        .iter()
        .find(|s| s["kind"] == "SERVER" && s["parent_span_id"] == PARENT_ID)
        .unwrap_or_else(|| panic!("no span under the caller's: {spans:#?}"));
    assert_tool_call(proxied, "create_automation", "pipe");
    let forward = children(&spans, proxied);
    assert_eq!(forward.len(), 1, "{spans:#?}");
    assert_eq!(forward[0]["kind"], "CLIENT");
    let upstream = children(&spans, forward[0]);
    assert_eq!(upstream.len(), 1, "{spans:#?}");
    assert_eq!(upstream[0]["kind"], "SERVER");
    assert_eq!(upstream[0]["name"], "tools/call create_automation");
    assert_eq!(attr(upstream[0], "toolledger.outcome"), "executed");
    assert_exports_none_of(
        &receiver,
        &["key-up-zq86", "key-proxy-zq87", "int_value: 1422"],
    );
}

#[test]
fn a_collector_that_is_not_there_changes_no_answer() {
    // A port nothing listens on any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let answers = |env: &[(String, String)]| {
        let db = Db::sqlite();
        let mut c = serve_command(
            &db,
            &[
                "--principal".into(),
                "alice".into(),
                "--clock-epoch".into(),
                "1800000000".into(),
            ],
        );
        with_env(&mut c, env);
        let mut s = Server::spawn(c);
        let args = json!({"request_id": "r-1", "interval_minutes": 30});
        let mut out = Vec::new();
        for (id, a) in [
            (1, args.clone()),
            (2, args),
            (3, json!({"request_id": "r-1", "interval_minutes": 31})),
        ] {
            out.push(traced_call(&mut s, id, "create_automation", a));
        }
        let started = Instant::now();
        assert_eq!(s.finish(), 0);
        (out, started.elapsed())
    };
    let (plain, _) = answers(&[]);
    let dead = vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_string(),
            format!("http://127.0.0.1:{port}"),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY".to_string(), "50".to_string()),
    ];
    let (traced, exit) = answers(&dead);
    assert_eq!(traced, plain);
    assert!(exit < Duration::from_secs(10), "the exit waited {exit:?}");
}

#[test]
fn the_proxy_over_http_continues_the_trace_from_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let Some(receiver) = Receiver::start(dir.path()) else {
        return;
    };
    let python = python().unwrap();
    let db = Db::sqlite();
    let token = add_principal(&db, "hank", "acme", &["editor"], &[], true).unwrap();
    let addr = format!("127.0.0.1:{}", toolledger_testkit::kill::free_port());
    let mut c = toolledger();
    c.arg("proxy")
        .args(db.store_args())
        .args(["--http", &addr, "--"])
        .arg(&python)
        .arg(proxy_fixture("charge_server.py"))
        .env_remove("TOOLLEDGER_STATE_KEY_HEX")
        .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
        .env_remove("TOOLLEDGER_ALLOWED_HOSTS")
        .envs(db.key_env())
        .env("CHARGE_DB", dir.path().join("charges.sqlite"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    with_env(&mut c, &receiver.env());
    let mut child = toolledger_testkit::kill::Killed(c.spawn().unwrap());
    toolledger_testkit::stdio::wait_listening(child.0.stderr.take().unwrap());
    let auth = format!("Bearer {token}");
    let tp = traceparent();
    let call = |id: i64| {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "charge",
            "arguments": {"customer": "cust-zq88", "amount_cents": 1433,
                          "operation_id": "key-http-proxy-zq89"},
            "_meta": meta()}});
        let r = raw::exchange(
            &addr,
            "POST",
            "/mcp",
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
                ("MCP-Protocol-Version", "2026-07-28"),
                ("Mcp-Method", "tools/call"),
                ("Mcp-Name", "charge"),
                ("traceparent", &tp),
            ],
            body.to_string().as_bytes(),
        )
        .expect("an HTTP answer");
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["result"].clone()
    };
    let fresh = call(1);
    assert_eq!(fresh["isError"], false, "{fresh}");
    let again = call(2);
    assert_eq!(
        again["_meta"]["io.toolledger/ledger"]["replayed"], true,
        "{again}"
    );
    // SIGTERM: the proxy stops as an operator stops it, sending what it queued.
    // SAFETY: a signal to our own child process.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let _ = child.0.wait();
    let spans = receiver.wait_for_servers(2);
    let fresh = server_span(&spans, 1);
    assert_tool_call(fresh, "charge", "tcp");
    assert_eq!(attr(fresh, "toolledger.outcome"), "executed");
    let forward = children(&spans, fresh);
    assert_eq!(forward.len(), 1, "{spans:#?}");
    assert_eq!(attr(forward[0], "toolledger.step"), "forward");
    let replay = server_span(&spans, 2);
    assert_tool_call(replay, "charge", "tcp");
    assert_eq!(attr(replay, "toolledger.outcome"), "replayed");
    assert!(children(&spans, replay).is_empty());
    assert_exports_none_of(
        &receiver,
        &[
            "key-http-proxy-zq89",
            "cust-zq88",
            "int_value: 1433",
            &token,
        ],
    );
}

#[test]
fn the_proxy_sends_an_http_upstream_the_trace_context_in_headers_too() {
    let dir = tempfile::tempdir().unwrap();
    let Some(receiver) = Receiver::start(dir.path()) else {
        return;
    };
    let python = python().unwrap();
    let headers = dir.path().join("traceparent.log");
    let port = support::clients::free_port();
    let mut upstream = support::clients::charge_server_http(
        &python,
        port,
        &dir.path().join("charges.sqlite"),
        &[("CHARGE_HEADER_LOG", headers.as_os_str())],
    );
    let db = Db::sqlite();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let mut p = proxy(
        &db,
        dir.path(),
        &["--upstream-url", &url],
        &[],
        &receiver.env(),
    );
    let charge =
        json!({"customer": "cust-zq91", "amount_cents": 4830, "operation_id": "key-proxy-zq92"});
    let r = traced_call(&mut p, 1, "charge", charge);
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(p.finish(), 0);
    let _ = upstream.kill();
    let _ = upstream.wait();
    let spans = receiver.wait_for_servers(1);
    let proxied = spans
        .iter()
        .find(|s| s["kind"] == "SERVER" && s["parent_span_id"] == PARENT_ID)
        .unwrap_or_else(|| panic!("no span under the caller's: {spans:#?}"));
    let forward = children(&spans, proxied);
    assert_eq!(forward.len(), 1, "{spans:#?}");
    assert_eq!(forward[0]["kind"], "CLIENT");
    // The one request that carried a trace context is the forward, under the forward's span:
    // the caller's trace, the forward as parent.
    let sent = std::fs::read_to_string(&headers).unwrap_or_default();
    let expected = format!(
        "00-{TRACE_ID}-{}-01",
        forward[0]["span_id"].as_str().unwrap()
    );
    assert_eq!(
        sent.lines().collect::<Vec<_>>(),
        [expected.as_str()],
        "{sent}"
    );
    // The forward's duration, by the conventions, sent at the proxy's end.
    let until = Instant::now() + Duration::from_secs(30);
    let forwarded = loop {
        let found = receiver.metrics().into_iter().find(|p| {
            p["name"] == "mcp.client.operation.duration"
                && p["attributes"]["gen_ai.tool.name"] == "charge"
        });
        match found {
            Some(p) => break p,
            None if Instant::now() < until => std::thread::sleep(Duration::from_millis(50)),
            None => panic!(
                "no mcp.client.operation.duration: {:#?}",
                receiver.metrics()
            ),
        }
    };
    assert_eq!(forwarded["count"], 1, "{forwarded}");
    assert_eq!(forwarded["unit"], "s", "{forwarded}");
    assert!(
        forwarded["attributes"]["error.type"].is_null(),
        "{forwarded}"
    );
    assert_exports_none_of(&receiver, &["key-proxy-zq92", "int_value: 4830"]);
}

#[test]
fn otel_propagators_none_starts_a_trace_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let Some(receiver) = Receiver::start(dir.path()) else {
        return;
    };
    let db = Db::sqlite();
    let mut c = serve_command(&db, &["--principal".into(), "alice".into()]);
    with_env(&mut c, &receiver.env());
    c.env("OTEL_PROPAGATORS", "none");
    let mut s = Server::spawn(c);
    let args = json!({"request_id": "key-otel-zq93", "interval_minutes": 1431});
    let fresh = traced_call(&mut s, 1, "create_automation", args);
    assert_eq!(fresh["isError"], false, "{fresh}");
    assert_eq!(s.finish(), 0);
    let spans = receiver.wait_for_servers(1);
    let span = server_span(&spans, 1);
    assert_eq!(attr(span, "toolledger.outcome"), "executed");
    assert_ne!(span["trace_id"], TRACE_ID, "{span}");
    assert_eq!(span["parent_span_id"], "", "{span}");
}

#[test]
fn serve_exports_the_conventions_operation_duration_with_the_calls_it_answered() {
    let dir = tempfile::tempdir().unwrap();
    let Some(receiver) = Receiver::start(dir.path()) else {
        return;
    };
    let db = Db::sqlite();
    let mut c = serve_command(&db, &["--principal".into(), "alice".into()]);
    with_env(&mut c, &receiver.env());
    let mut s = Server::spawn(c);
    fresh_replay_conflict(&mut s, "key-otel-zq94", 1432);
    // The process's end sends the last reading.
    assert_eq!(s.finish(), 0);
    let until = Instant::now() + Duration::from_secs(30);
    let points = loop {
        let points: Vec<Value> = receiver
            .metrics()
            .into_iter()
            .filter(|p| p["name"] == "mcp.server.operation.duration")
            .collect();
        if !points.is_empty() || Instant::now() > until {
            break points;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Readings are cumulative: the last export holds every call.
    let count = |error: Option<&str>| {
        points
            .iter()
            .filter(|p| p["attributes"]["gen_ai.tool.name"] == "create_automation")
            .filter(|p| p["attributes"]["error.type"].as_str() == error)
            .map(|p| p["count"].as_u64().unwrap())
            .max()
            .unwrap_or(0)
    };
    assert_eq!(count(None), 2, "{points:#?}");
    assert_eq!(count(Some("tool_error")), 1, "{points:#?}");
    for p in &points {
        assert_eq!(p["unit"], "s", "{p}");
        assert_eq!(p["attributes"]["mcp.method.name"], "tools/call", "{p}");
        assert_eq!(
            p["attributes"]["gen_ai.operation.name"], "execute_tool",
            "{p}"
        );
        assert_eq!(p["service"], "toolledger-test", "{p}");
        assert!(p["sum"].as_f64().unwrap() > 0.0, "{p}");
    }
    assert_exports_none_of(&receiver, &["key-otel-zq94", "int_value: 1432"]);
}

#[test]
fn an_operators_prune_run_is_a_span_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let Some(receiver) = Receiver::start(dir.path()) else {
        return;
    };
    let db = Db::sqlite();
    let mut c = toolledger();
    c.arg("prune").args(db.store_args()).envs(db.key_env());
    with_env(&mut c, &receiver.env());
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let until = Instant::now() + Duration::from_secs(30);
    let span = loop {
        if let Some(s) = receiver.spans().into_iter().find(|s| s["name"] == "prune") {
            break s;
        }
        assert!(Instant::now() < until, "no prune span arrived");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(span["kind"], "INTERNAL", "{span}");
    assert_eq!(span["parent_span_id"], "", "{span}");
    assert_eq!(span["service"], "toolledger-test", "{span}");
    assert_eq!(attr(&span, "toolledger.prune.dry_run"), false, "{span}");
}
