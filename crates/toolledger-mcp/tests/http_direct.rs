//! The HTTP front's direct path for `tools/call` under MCP 2026-07-28 answers exactly as rmcp's
//! streamable HTTP service does. Each request below goes to two fronts of the same server, one
//! with `direct_tool_calls` on and one with it off (every request through rmcp): both answer
//! with the same status, `Content-Type` and body. The server's handler reports what its
//! context held (the `_meta`, the HTTP request's parts and the caller in them, the protocol
//! versions, the cancellation token) in the answer, so a context built differently shows.
//!
//! Which path answered is told by the context's peer: rmcp starts a loop, with a peer of its
//! own, for every stateless request, while the direct path's calls share one.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, InitializeRequestParams,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Value};
use toolledger_mcp::front::HttpFront;
use toolledger_mcp::{AuthenticatedName, LedgerGuard};
use tower::ServiceExt;

/// The client information of the peers the handler was called with (kept, so that no two
/// are ever at the same address).
#[derive(Clone, Default)]
struct Probe {
    peers: Peers,
}

type Peers = Arc<Mutex<Vec<Arc<InitializeRequestParams>>>>;

fn tool(name: &str, schema: Value) -> Tool {
    let Value::Object(schema) = schema else {
        unreachable!("a schema is an object")
    };
    Tool::new(name.to_string(), "probe", Arc::new(schema))
}

fn tools() -> Vec<Tool> {
    vec![
        tool(
            "echo",
            json!({"type": "object", "properties": {"x": {"type": "number"}}}),
        ),
        tool(
            "annotated",
            json!({"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}),
        ),
    ]
}

impl ServerHandler for Probe {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let peer_info = context.peer.peer_info();
        if let Some(info) = &peer_info {
            self.peers.lock().unwrap().push(info.clone());
        }
        match request.name.as_ref() {
            "echo" | "annotated" => {
                let parts = context.extensions.get::<http::request::Parts>();
                Ok(CallToolResponse::Complete(CallToolResult::structured(
                    json!({
                        "arguments": request.arguments,
                        "params_meta": request.meta,
                        "meta": context.meta,
                        "host": parts.and_then(|p| p.headers.get("host")).and_then(|v| v.to_str().ok()),
                        "caller": parts.and_then(|p| p.extensions.get::<AuthenticatedName>()).map(|n| n.0.clone()),
                        "protocol": context.protocol_version().map(|v| v.to_string()),
                        "peer_protocol": peer_info.map(|i| i.protocol_version.to_string()),
                        "cancelled": context.ct.is_cancelled(),
                        "id": context.id,
                    }),
                )))
            }
            "mismatch" => Err(ErrorData::header_mismatch("the probe says so", None)),
            "notify" => {
                let _ = context.peer.notify_tool_list_changed().await;
                Ok(CallToolResponse::Complete(CallToolResult::structured(
                    json!({"notified": true}),
                )))
            }
            other => Err(ErrorData::invalid_params(
                format!("unknown tool {other}"),
                None,
            )),
        }
    }
}

struct Fronts {
    direct: axum::Router,
    through_rmcp: axum::Router,
    direct_peers: Peers,
    token: String,
    _dir: tempfile::TempDir,
}

async fn fronts() -> Fronts {
    let dir = tempfile::tempdir().unwrap();
    let ledger = LedgerGuard::builder()
        .database(dir.path().join("l.sqlite").display().to_string())
        .bearer_tokens()
        .open()
        .unwrap();
    let token = ledger
        .principals()
        .add("alice", "t1", &[], &[], true)
        .await
        .unwrap()
        .unwrap();
    let principals = ledger.principals().clone();
    let direct_probe = Probe::default();
    let direct_peers = direct_probe.peers.clone();
    let direct = HttpFront::default().router(direct_probe, principals.clone());
    let through_rmcp = HttpFront {
        direct_tool_calls: false,
        ..HttpFront::default()
    }
    .router(Probe::default(), principals);
    Fronts {
        direct,
        through_rmcp,
        direct_peers,
        token,
        _dir: dir,
    }
}

/// A request's headers and body, before they are sent.
#[derive(Clone)]
struct Call {
    headers: Vec<(&'static str, String)>,
    body: Value,
}

const VERSION: &str = "2026-07-28";

fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "probe", "version": "1"},
        "progressToken": 7,
    })
}

/// A `tools/call` of `name` as an MCP 2026-07-28 client sends it.
fn call(name: &str, arguments: Value) -> Call {
    Call {
        headers: vec![
            ("content-type", "application/json".into()),
            ("accept", "application/json, text/event-stream".into()),
            ("mcp-protocol-version", VERSION.into()),
            ("mcp-method", "tools/call".into()),
            ("mcp-name", name.into()),
        ],
        body: json!({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "_meta": meta()},
        }),
    }
}

impl Call {
    fn set(mut self, name: &'static str, value: &str) -> Self {
        self.headers.retain(|(n, _)| *n != name);
        self.headers.push((name, value.to_string()));
        self
    }
    fn add(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_string()));
        self
    }
    fn without(mut self, name: &'static str) -> Self {
        self.headers.retain(|(n, _)| *n != name);
        self
    }
    fn body(mut self, edit: impl FnOnce(&mut Value)) -> Self {
        edit(&mut self.body);
        self
    }
}

struct Answer {
    status: StatusCode,
    content_type: Option<String>,
    body: String,
}

async fn send(router: &axum::Router, token: &str, call: &Call) -> Answer {
    let mut request = Request::post("/mcp")
        .header("host", "localhost")
        .header("authorization", format!("Bearer {token}"));
    for (name, value) in &call.headers {
        request = request.header(*name, value.as_str());
    }
    let request = request
        .body(Body::from(call.body.to_string()))
        .expect("a request");
    let response = router.clone().oneshot(request).await.expect("an answer");
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        content_type,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

/// The cases: what is sent, and whether the direct path takes it.
fn cases() -> Vec<(&'static str, Call, bool)> {
    let echo = || {
        call(
            "echo",
            json!({"x": 12.5, "nested": {"a": [1, 2.25, "three"]}}),
        )
    };
    vec![
        ("a plain call", echo(), true),
        (
            "a string id",
            echo().body(|b| b["id"] = json!("req-1")),
            true,
        ),
        (
            "no arguments",
            echo().body(|b| {
                b["params"].as_object_mut().unwrap().remove("arguments");
            }),
            true,
        ),
        (
            "accept in another order and case",
            echo().set("accept", "TEXT/EVENT-STREAM,application/JSON"),
            true,
        ),
        (
            "a content type with a charset",
            echo().set("content-type", "application/json; charset=utf-8"),
            true,
        ),
        ("an unknown tool", call("nothing", json!({})), true),
        (
            "a handler's header mismatch",
            call("mismatch", json!({})),
            true,
        ),
        (
            "an accept with weights",
            echo().set("accept", "application/json;q=1, text/event-stream"),
            false,
        ),
        (
            "an accept without event streams",
            echo().set("accept", "application/json"),
            false,
        ),
        ("no accept", echo().without("accept"), false),
        (
            "two accept headers",
            echo()
                .set("accept", "application/json")
                .add("accept", "text/event-stream"),
            false,
        ),
        ("no Mcp-Name", echo().without("mcp-name"), false),
        ("another Mcp-Name", echo().set("mcp-name", "other"), false),
        (
            "an Mcp-Name in another case",
            echo().set("mcp-name", "ECHO"),
            false,
        ),
        (
            "an Mcp-Name in Base64",
            echo().set("mcp-name", "=?base64?ZWNobw==?="),
            false,
        ),
        (
            "two Mcp-Name headers",
            echo().add("mcp-name", "echo"),
            false,
        ),
        ("no Mcp-Method", echo().without("mcp-method"), false),
        (
            "another Mcp-Method",
            echo().set("mcp-method", "tools/list"),
            false,
        ),
        (
            "no protocol version header",
            echo().without("mcp-protocol-version"),
            false,
        ),
        (
            "an older protocol version header",
            echo().set("mcp-protocol-version", "2025-06-18"),
            false,
        ),
        (
            "an unknown protocol version header",
            echo().set("mcp-protocol-version", "2099-01-01"),
            false,
        ),
        (
            "_meta without client capabilities",
            echo().body(|b| {
                b["params"]["_meta"]
                    .as_object_mut()
                    .unwrap()
                    .remove("io.modelcontextprotocol/clientCapabilities");
            }),
            false,
        ),
        (
            "_meta naming another version",
            echo().body(|b| {
                b["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] =
                    json!("2025-11-25")
            }),
            false,
        ),
        (
            "no _meta (an older client)",
            echo().set("mcp-protocol-version", "2025-06-18").body(|b| {
                b["params"].as_object_mut().unwrap().remove("_meta");
            }),
            false,
        ),
        (
            "a session id",
            echo().set("mcp-session-id", "not-a-session"),
            false,
        ),
        (
            "a tool with a header annotation and its header",
            call("annotated", json!({"region": "eu"})).set("mcp-param-region", "eu"),
            false,
        ),
        (
            "a tool with a header annotation without its header",
            call("annotated", json!({"region": "eu"})),
            false,
        ),
    ]
}

#[tokio::test]
async fn direct_calls_answer_as_rmcp_does() {
    let fronts = fronts().await;
    for (what, call, direct) in cases() {
        let peers_before = fronts.direct_peers.lock().unwrap().len();
        let one = send(&fronts.direct, &fronts.token, &call).await;
        let two = send(&fronts.direct, &fronts.token, &call).await;
        let rmcp = send(&fronts.through_rmcp, &fronts.token, &call).await;
        for answer in [&one, &two] {
            assert_eq!(answer.status, rmcp.status, "{what}: status");
            assert_eq!(
                answer.content_type, rmcp.content_type,
                "{what}: content type"
            );
            assert_eq!(answer.body, rmcp.body, "{what}: body");
        }
        // Which path answered: the two calls share a peer on the direct path only.
        let peers = fronts.direct_peers.lock().unwrap().clone();
        let new = &peers[peers_before..];
        if direct {
            assert_eq!(new.len(), 2, "{what}: the handler ran twice");
            assert!(Arc::ptr_eq(&new[0], &new[1]), "{what}: answered directly");
        } else if new.len() == 2 {
            assert!(
                !Arc::ptr_eq(&new[0], &new[1]),
                "{what}: answered by rmcp's service"
            );
        }
    }
}

/// The answers the handler gave on the direct path: what its context held.
#[tokio::test]
async fn a_direct_call_gets_the_context_rmcp_gives() {
    let fronts = fronts().await;
    let (_, call, _) = cases().remove(0);
    let answer = send(&fronts.direct, &fronts.token, &call).await;
    assert_eq!(answer.status, StatusCode::OK);
    let body: Value = serde_json::from_str(&answer.body).unwrap();
    let seen = &body["result"]["structuredContent"];
    assert_eq!(
        seen["arguments"],
        json!({"x": 12.5, "nested": {"a": [1, 2.25, "three"]}})
    );
    assert_eq!(seen["meta"], meta(), "the request's _meta is the context's");
    assert_eq!(
        seen["params_meta"],
        Value::Null,
        "and no longer the params'"
    );
    assert_eq!(seen["host"], "localhost", "the HTTP request's parts");
    assert_eq!(seen["caller"], "alice", "the bearer token's principal");
    assert_eq!(seen["protocol"], VERSION);
    assert_eq!(seen["peer_protocol"], VERSION);
    assert_eq!(seen["cancelled"], false);
    assert_eq!(body["id"], 1);
}

/// The one difference, as documented: a notification sent during a direct call is not
/// delivered (rmcp streams it before the answer); the answer itself is the same.
#[tokio::test]
async fn a_notification_during_a_direct_call_is_dropped() {
    let fronts = fronts().await;
    let call = call("notify", json!({}));
    let direct = send(&fronts.direct, &fronts.token, &call).await;
    assert_eq!(direct.status, StatusCode::OK);
    assert_eq!(direct.content_type.as_deref(), Some("application/json"));
    let body: Value = serde_json::from_str(&direct.body).unwrap();
    assert_eq!(
        body["result"]["structuredContent"],
        json!({"notified": true})
    );
    let rmcp = send(&fronts.through_rmcp, &fronts.token, &call).await;
    assert_eq!(rmcp.content_type.as_deref(), Some("text/event-stream"));
    assert!(
        rmcp.body.contains("notifications/tools/list_changed"),
        "{}",
        rmcp.body
    );
    assert!(rmcp.body.contains("\"notified\":true"), "{}", rmcp.body);
}
