//! The HTTP front's in-flight limit bounds the work, not only the connections waiting for it:
//! a request whose client goes away while its handler still runs keeps its permit until the
//! handler is done, on the direct path and through rmcp's service alike. The client going away
//! is the request's future being dropped, as hyper drops it when the connection closes.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};
use toolledger_mcp::front::HttpFront;
use toolledger_mcp::LedgerGuard;
use tower::ServiceExt;

/// How long the test waits for something that must happen.
const BOUND: Duration = Duration::from_secs(20);

/// A server whose `hold` tool runs until the test releases it, whatever happens to its
/// caller, and says when it started and ended (and whether it was told its client left).
#[derive(Clone)]
struct Holder {
    release: Arc<Semaphore>,
    events: mpsc::UnboundedSender<Event>,
}

#[derive(Debug, PartialEq)]
enum Event {
    Started,
    Ended { told_client_left: bool },
}

fn tools() -> Vec<Tool> {
    ["hold", "quick"]
        .into_iter()
        .map(|name| {
            let Value::Object(schema) = json!({"type": "object"}) else {
                unreachable!()
            };
            Tool::new(name.to_string(), "probe", Arc::new(schema))
        })
        .collect()
}

impl ServerHandler for Holder {
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
        if request.name == "hold" {
            let _ = self.events.send(Event::Started);
            let _permit = self.release.acquire().await;
            let _ = self.events.send(Event::Ended {
                told_client_left: context.ct.is_cancelled(),
            });
        }
        Ok(CallToolResponse::Complete(CallToolResult::structured(
            json!({"done": request.name}),
        )))
    }
}

fn call(name: &str) -> Request<Body> {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": name, "arguments": {}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "probe", "version": "1"},
        }},
    });
    Request::post("/mcp")
        .header("host", "localhost")
        .header("authorization", "Bearer TOKEN")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", name)
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn status(router: &axum::Router, token: &str, name: &str) -> StatusCode {
    let mut request = call(name);
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    router.clone().oneshot(request).await.unwrap().status()
}

async fn next_event(events: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(BOUND, events.recv())
        .await
        .expect("the handler reports in time")
        .expect("the handler is alive")
}

async fn a_client_that_leaves_keeps_its_permit_while_the_work_runs(direct: bool) {
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
    let release = Arc::new(Semaphore::new(0));
    let (tx, mut events) = mpsc::unbounded_channel();
    let holder = Holder {
        release: release.clone(),
        events: tx,
    };
    let router = HttpFront {
        max_in_flight: 1,
        direct_tool_calls: direct,
        ..HttpFront::default()
    }
    .router(holder, ledger.principals().clone());

    // The only slot's request starts its work, then its client goes away.
    let mut first = call("hold");
    first
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let client = tokio::spawn(router.clone().oneshot(first));
    assert_eq!(next_event(&mut events).await, Event::Started);
    client.abort();
    let _ = client.await;

    // The work still runs: its permit is still held, so the next request is shed.
    assert_eq!(
        status(&router, &token, "quick").await,
        StatusCode::SERVICE_UNAVAILABLE,
        "the permit was given back while the work still ran"
    );

    // Once the work ends, its permit is back.
    release.add_permits(1);
    let ended = next_event(&mut events).await;
    if direct {
        assert_eq!(
            ended,
            Event::Ended {
                told_client_left: true
            },
            "the handler is still told its client left"
        );
    }
    let until = tokio::time::Instant::now() + BOUND;
    loop {
        let got = status(&router, &token, "quick").await;
        if got == StatusCode::OK {
            break;
        }
        assert_eq!(got, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            tokio::time::Instant::now() < until,
            "the permit never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_direct_path_a_client_that_leaves_keeps_its_permit_while_the_work_runs() {
    a_client_that_leaves_keeps_its_permit_while_the_work_runs(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_rmcp_a_client_that_leaves_keeps_its_permit_while_the_work_runs() {
    a_client_that_leaves_keeps_its_permit_while_the_work_runs(false).await;
}
