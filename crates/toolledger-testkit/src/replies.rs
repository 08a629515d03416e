//! A tool's result as an MCP client of a guarded server reads it ([`body_of`]), and such a
//! client of a server in the same process ([`connect`]).

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::ServiceExt;
use serde_json::{json, Value};

/// `(isError, body)` of a tool's result: its structured content, or for an error result
/// (which carries no structured content, asserted) the `{"error": …}` object parsed from
/// `content[0]`. Panics when an error result has no such object.
pub fn body_of(r: &CallToolResult) -> (bool, Value) {
    let err = r.is_error.unwrap_or(false);
    if err {
        assert!(
            r.structured_content.is_none(),
            "an error result has no structured content"
        );
        let v = serde_json::to_value(r).expect("a result serializes");
        let error = toolledger_mcp::error_of(&v).expect("an error object in content[0]");
        return (true, json!({ "error": error }));
    }
    (false, r.structured_content.clone().unwrap_or(Value::Null))
}

/// An rmcp client of `server`, which serves it in this process over an in-memory pipe (on a
/// spawned task, until the client goes away).
pub async fn connect<S: rmcp::ServerHandler>(server: S) -> RunningService<RoleClient, ()> {
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_io)
        .await
        .expect("an in-process MCP session")
}

/// Calls `tool` with the JSON object `arguments` over `client`; panics when the call itself
/// fails (a protocol error, not a tool's error result).
pub async fn call_tool(
    client: &RunningService<RoleClient, ()>,
    tool: &str,
    arguments: Value,
) -> CallToolResult {
    let arguments = arguments
        .as_object()
        .cloned()
        .expect("arguments are an object");
    let call = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
    client.call_tool(call).await.expect("the tool call")
}
