//! An rmcp client spawns the built server with `TokioChildProcess`: the 2026-07-28 lifecycle
//! (discover, automatic multi-round fulfilment through the client's elicitation handler) and
//! the initialize lifecycle. Each case runs on both backends: a fresh SQLite file
//! (`sqlite::…`) and a fresh schema of the test PostgreSQL database (`postgres::…`, skipped
//! loudly without `TOOLLEDGER_TEST_DATABASE_URL`, failing in CI).

#[macro_use]
mod support;

use std::future::Future;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ElicitRequestParams, ElicitResult, ElicitationAction,
    ErrorData, ProtocolVersion,
};
use rmcp::service::RequestContext;
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt};
use serde_json::{json, Map, Value};
use support::wire::*;

on_both_backends!(
    rmcp_client_in_2026_07_28_mode_fulfils_the_body_round_and_replays,
    rmcp_client_with_initialize_lists_tools_and_calls_set_interval,
);

#[derive(Clone, Default)]
struct BodyWriter;

impl ClientHandler for BodyWriter {
    /// Declares form elicitation: the server asks only clients that did.
    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut info = rmcp::model::ClientConfig::default();
        info.capabilities.elicitation = Some(
            rmcp::model::ElicitationCapability::new()
                .with_form(rmcp::model::FormElicitationCapability::new()),
        );
        info
    }

    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(json!({"body": "alpha"})))
    }
}

/// `serve` as alice on `db`, with exactly the key variables the ledger's servers share
/// (none on SQLite, whose keys come from its key file).
fn command(db: &Db) -> tokio::process::Command {
    serve_command(db, &["--principal".into(), "alice".into()]).into()
}

/// Runs one case's client on a runtime of its own (the cases are plain `fn(Db)`).
fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn rmcp_client_in_2026_07_28_mode_fulfils_the_body_round_and_replays(db: Db) {
    block_on(async {
        let transport = TokioChildProcess::new(command(&db)).unwrap();
        let client = BodyWriter
            .serve_with_lifecycle(
                transport,
                ClientLifecycleMode::Discover {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                },
            )
            .await
            .unwrap();
        let args = object(json!({"operation_id": "rmcp-1", "title": "spec"}));
        let done = client
            .call_tool(CallToolRequestParams::new("create_issue").with_arguments(args.clone()))
            .await
            .unwrap();
        assert_eq!(done.is_error, Some(false));
        assert_eq!(
            done.structured_content,
            Some(
                json!({"operationId": "rmcp-1", "effectId": 1, "result": "created 1",
                    "replayed": false, "state": "applied"})
            )
        );

        // Drive the rounds by hand to resend one exact continuation.
        let first = client
            .call_tool_once(
                CallToolRequestParams::new("create_issue")
                    .with_arguments(object(json!({"operation_id": "rmcp-2", "title": "spec"}))),
            )
            .await
            .unwrap();
        let CallToolResponse::InputRequired(ir) = first else {
            panic!("expected input_required");
        };
        let state = ir.request_state.unwrap();
        let mut responses = rmcp::model::InputResponses::new();
        responses.insert(
            "body".into(),
            json!({"action": "accept", "content": {"body": "beta"}}),
        );
        let mut replayed = Vec::new();
        for _ in 0..2 {
            let mut p = CallToolRequestParams::new("create_issue")
                .with_arguments(object(json!({"operation_id": "rmcp-2", "title": "spec"})))
                .with_input_responses(responses.clone());
            p.request_state = Some(state.clone());
            let CallToolResponse::Complete(r) = client.call_tool_once(p).await.unwrap() else {
                panic!("expected a complete result");
            };
            replayed.push(r.structured_content.unwrap()["replayed"].clone());
        }
        assert_eq!(replayed, [json!(false), json!(true)]);
        client.cancel().await.unwrap();
    });
    assert_eq!(count(&db, "issues"), 2);
    assert_eq!(count(&db, "operations"), 2);
}

fn rmcp_client_with_initialize_lists_tools_and_calls_set_interval(db: Db) {
    block_on(async {
        let transport = TokioChildProcess::new(command(&db)).unwrap();
        let client = ().serve(transport).await.unwrap();
        let tools = client.list_all_tools().await.unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert!(names.contains(&"set_interval"), "{names:?}");
        let created = client
            .call_tool(
                CallToolRequestParams::new("create_automation").with_arguments(object(
                    json!({"request_id": "rm-c", "interval_minutes": 10}),
                )),
            )
            .await
            .unwrap();
        let id = created.structured_content.unwrap()["id"].clone();
        let set = client
            .call_tool(
                CallToolRequestParams::new("set_interval").with_arguments(object(json!({
            "request_id": "rm-s", "automation_id": id, "expected_version": 1,
            "interval_minutes": 20}))),
            )
            .await
            .unwrap();
        assert_eq!(
            set.structured_content,
            Some(json!({"id": id, "interval_minutes": 20, "version": 2, "replayed": false}))
        );
        client.cancel().await.unwrap();
    });
    assert_eq!(count(&db, "automations"), 1);
}
