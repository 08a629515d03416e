//! `Guarded::dispatch`, in-process over rmcp: an ordinary `#[tool]` method whose effect is
//! deferred, served through `LedgerGuard::router`; the caller comes from the ledger's
//! `CallerSource`, the reply is the `DeferredReply` with its declared output schema.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolRequestParams, CallToolResponse, ProtocolVersion};
use rmcp::{schemars, tool, tool_handler, tool_router};
use rmcp::{ClientLifecycleMode, ClientServiceExt, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};
use toolledger::clock::{ManualClock, SharedClock};
use toolledger::runtime::{CrashPoint, ProviderProfile, Registry, Runtime};
use toolledger_mcp::{
    status_router, DeferredArguments, DeferredOutcome, Guarded, LedgerGuard, Refusal,
};
use toolledger_testkit::downstream::SqliteDownstream;
use toolledger_testkit::replies::body_of;
use toolledger_testkit::tools::ShipAnyParcel;

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Ship {
    operation_id: String,
    #[schemars(length(min = 1))]
    parcel: String,
}

#[derive(Clone)]
struct Parcels {
    runtime: Runtime,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Parcels {
    /// Ship a parcel through the outbox; retry with the same operation_id to replay.
    #[tool(output_schema = toolledger_mcp::deferred::output_schema())]
    async fn ship_parcel(
        &self,
        g: Guarded,
        Parameters(p): Parameters<Ship>,
    ) -> Result<DeferredOutcome, Refusal> {
        let call = DeferredArguments::new(p.operation_id, json!({"parcel": p.parcel}));
        g.dispatch(&self.runtime, call).await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Parcels {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_tool_method_dispatches_once_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let clock: SharedClock = Arc::new(ManualClock::new(1_000_000));
    let ledger = LedgerGuard::builder()
        .database(dir.path().join("l.sqlite").display().to_string())
        .principal("alice")
        .clock(clock.clone())
        .open()
        .unwrap();
    ledger
        .principals()
        .add("alice", "acme", &[], &[], false)
        .await
        .unwrap();
    let downstream = SqliteDownstream::open(dir.path().join("d.sqlite"), clock.clone()).unwrap();
    let registry = Registry::new()
        .register(Arc::new(ShipAnyParcel::unchecked()), Arc::new(downstream))
        .allow_profile(ProviderProfile::mcp());
    let runtime = Runtime::new(ledger.store().clone(), clock, registry);
    // An operation whose process "died" after the downstream committed, before transaction C.
    let crashed = DeferredArguments::new("op-9".to_string(), json!({"parcel": "p-9"}))
        .into_call("alice", "ship_parcel");
    let crashed = runtime
        .dispatch(&crashed, Some(CrashPoint::AfterDownstreamCommit))
        .await
        .unwrap();
    let server = Parcels {
        runtime,
        tool_router: ledger
            .router(Parcels::tool_router() + status_router())
            .unwrap(),
    };
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let mode = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    let client = ().serve_with_lifecycle(client_io, mode).await.unwrap();

    let tools = client.list_all_tools().await.unwrap();
    let ship = tools.iter().find(|t| t.name == "ship_parcel").unwrap();
    let schema = serde_json::to_value(ship.output_schema.as_ref().unwrap()).unwrap();
    assert!(schema["properties"].get("status_ref").is_some(), "{schema}");

    let call = |parcel: &str| {
        CallToolRequestParams::new("ship_parcel").with_arguments(
            json!({"operation_id": "op-1", "parcel": parcel})
                .as_object()
                .cloned()
                .unwrap(),
        )
    };
    let mut replies = Vec::new();
    for parcel in ["p-1", "p-1", "p-2", ""] {
        let CallToolResponse::Complete(r) = client.call_tool_once(call(parcel)).await.unwrap()
        else {
            panic!("expected a complete result");
        };
        replies.push(body_of(&r));
    }
    let (err, first) = &replies[0];
    assert!(!err, "{first}");
    assert_eq!(first["code"], "OK");
    assert_eq!(first["delivery"], "fresh");
    assert_eq!(first["result"]["parcel"], "p-1");
    assert_eq!(replies[1].1["delivery"], "local_replay");
    assert_eq!(replies[1].1["status_ref"], first["status_ref"]);
    assert_eq!(replies[2].1["error"]["code"], "operation_conflict");
    assert_eq!(
        replies[3].1["error"]["code"], "invalid_arguments",
        "the input schema is checked before anything runs"
    );

    // Its retry is an error result naming the reference to query, never a success.
    let unknown = CallToolRequestParams::new("ship_parcel").with_arguments(
        json!({"operation_id": "op-9", "parcel": "p-9"})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let CallToolResponse::Complete(r) = client.call_tool_once(unknown).await.unwrap() else {
        panic!("expected a complete result");
    };
    assert_eq!(r.is_error, Some(true), "{r:?}");
    let text = r.content[0].as_text().unwrap().text.clone();
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["error"]["code"], "outcome_unknown", "{body}");
    assert_eq!(body["error"]["status_ref"], json!(crashed.status_ref()));
    let structured = r.structured_content.unwrap();
    assert_eq!(structured["code"], "OUTCOME_UNKNOWN", "{structured}");
    assert!(structured.get("result").is_none(), "{structured}");
    client.cancel().await.unwrap();
}
