//! `Guarded` beyond the single-round example, in-process: a multi-round tool
//! (`input_required` under MCP 2026-07-28) whose exact continuation replays, a tampered
//! `requestState` (a JSON-RPC error), a client starting over (a replay), a client that did not
//! declare elicitation (never asked), the initialize lifecycle (no `input_required`), extractor order
//! (`Parameters<T>` first), a revoked caller, a guarded tool served without
//! `LedgerGuard::router`, and `Guarded::rounds` with a two-step effect: the body elicited
//! inside the call under the initialize lifecycle, asked with `input_required` under
//! 2026-07-28, and a failed second step finishing `partial`.

use std::sync::Arc;

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientConfig, ElicitRequest,
    ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationCapability,
    FormElicitationCapability, InputRequest, InputResponses, ProtocolVersion,
};
use rmcp::service::RequestContext;
use rmcp::service::{RoleClient, RunningService};
use rmcp::{schemars, tool, tool_handler, tool_router};
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use toolledger::clock::ManualClock;
use toolledger::effect::{EffectTx, RowExt};
use toolledger::engine::Begun;
use toolledger::engine::InlineEffect;
use toolledger::model::OperationState;
use toolledger::model::{Error, Principal};
use toolledger::store::Migration;
use toolledger_mcp::guard::outcome_json;
use toolledger_mcp::{status_router, GuardConfig, Guarded, LedgerGuard, Receipt, Refusal, Rounds};
use toolledger_testkit::replies::body_of;

const ISSUES: Migration = Migration {
    namespace: "test.issues",
    version: 1,
    sql: "CREATE TABLE issues (id BIGINT PRIMARY KEY, title TEXT NOT NULL, body TEXT NOT NULL)",
};

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct NewIssue {
    operation_id: String,
    title: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Created {
    #[serde(rename = "effectId")]
    effect_id: i64,
    result: String,
}

struct InsertIssue {
    title: String,
    body: String,
}

impl InlineEffect for InsertIssue {
    fn apply(&self, tx: &mut dyn EffectTx, _p: &Principal) -> Result<Value, Error> {
        let row = tx
            .query_opt(
                "INSERT INTO issues(id, title, body) SELECT coalesce(max(id), 0) + 1, ?1, ?2 \
                 FROM issues RETURNING id",
                &[self.title.clone().into(), self.body.clone().into()],
            )?
            .unwrap_or_default();
        let id = row.int(0)?;
        Ok(json!({"effectId": id, "result": format!("created {id}")}))
    }
}

fn body_request() -> InputRequest {
    let schema = serde_json::from_value(json!({
        "type": "object",
        "properties": {"body": {"type": "string"}},
        "required": ["body"],
    }))
    .unwrap();
    InputRequest::Elicitation(ElicitRequest::new(
        ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: "Provide the issue body".into(),
            requested_schema: schema,
        },
    ))
}

#[derive(Clone)]
struct Issues {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Issues {
    /// Create an issue; its body is asked for in a second round.
    #[tool(output_schema = schema_for_output::<Receipt<Created>>())]
    async fn create_issue(
        &self,
        Parameters(p): Parameters<NewIssue>,
        g: Guarded,
    ) -> Result<CallToolResponse, Refusal> {
        let Some(answers) = g.answers() else {
            let ask = vec![("body".to_string(), body_request())];
            let known = json!({"title": p.title});
            return g.ask(&p.operation_id, known, "awaiting-body", ask).await;
        };
        let body = answers
            .get("body")
            .and_then(|a| a["content"]["body"].as_str())
            .ok_or_else(|| Refusal(Error::invalid("the body answer is missing")))?
            .to_string();
        let intent = json!({"title": p.title, "body": body});
        let effect = InsertIssue {
            title: p.title,
            body,
        };
        let receipt = g.run_answered::<Created>(&p.operation_id, intent, effect);
        Ok(receipt.await?.0.into_response())
    }
}

/// The body answer of `answers` (`{body: {action, content: {body}}}`).
fn body_of_answers(answers: &Value) -> Result<String, Refusal> {
    answers["body"]["content"]["body"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| Refusal(Error::invalid("the body answer is missing")))
}

#[tool_router(router = rounds_router)]
impl Issues {
    /// Create a watched issue: the body is asked for under either lifecycle (input_required,
    /// or elicitation inside the call), then two steps: the issue, then its watcher (a title
    /// starting with "unwatchable" fails the second step and finishes `partial`).
    #[tool(output_schema = schema_for_output::<Receipt<Created>>())]
    async fn create_watched_issue(
        &self,
        g: Guarded,
        Parameters(p): Parameters<NewIssue>,
    ) -> Result<CallToolResponse, Refusal> {
        let ask = vec![("body".to_string(), body_request())];
        let known = json!({"title": p.title});
        let answered = match g
            .rounds(&p.operation_id, known, "awaiting-body", ask)
            .await?
        {
            Rounds::Respond(response) => return Ok(response),
            Rounds::Answered(answered) => answered,
        };
        let body = body_of_answers(&answered.answers)?;
        let intent = json!({"title": p.title, "body": body});
        let first = InsertIssue {
            title: p.title.clone(),
            body,
        };
        let begun = g.begin_rounds(&p.operation_id, &answered, intent, first);
        let (operation, first_result) = match begun.await? {
            Begun::Replayed(outcome) => {
                return Ok(CallToolResponse::Complete(CallToolResult::structured(
                    outcome_json(&p.operation_id, &outcome),
                )))
            }
            Begun::Started {
                operation_id,
                first_result,
                ..
            } => (operation_id, first_result),
        };
        let (state, event) = if p.title.starts_with("unwatchable") {
            (OperationState::Partial, "watcher_failed")
        } else {
            (OperationState::Applied, "watcher_added")
        };
        let events = vec![(event.to_string(), json!({"watcher": "bob"}))];
        let receipt = g.finish(&p.operation_id, operation, state, first_result, events);
        Ok(receipt.await?.0.into_response())
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Issues {}

struct World {
    ledger: LedgerGuard,
    clock: ManualClock,
    _dir: tempfile::TempDir,
}

async fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let ledger = LedgerGuard::builder()
        .database(dir.path().join("l.sqlite").display().to_string())
        .migrations(&[ISSUES])
        .principal("alice")
        .clock(Arc::new(clock.clone()))
        .config(GuardConfig {
            authority_ttl: 100,
            ..GuardConfig::default()
        })
        .open()
        .unwrap();
    ledger
        .principals()
        .add("alice", "acme", &[], &[], false)
        .await
        .unwrap();
    World {
        ledger,
        clock,
        _dir: dir,
    }
}

/// A client that declares form elicitation (`declares: false`: no capabilities at all).
#[derive(Clone, Copy)]
struct Client {
    declares: bool,
}

impl ClientHandler for Client {
    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        if self.declares {
            info.capabilities.elicitation =
                Some(ElicitationCapability::new().with_form(FormElicitationCapability::new()));
        }
        info
    }

    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, rmcp::ErrorData> {
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(json!({"body": "asked"})))
    }
}

impl World {
    async fn connect(
        &self,
        router: ToolRouter<Issues>,
        modern: bool,
    ) -> RunningService<RoleClient, Client> {
        self.connect_as(router, modern, Client { declares: true })
            .await
    }

    async fn connect_as(
        &self,
        router: ToolRouter<Issues>,
        modern: bool,
        client: Client,
    ) -> RunningService<RoleClient, Client> {
        let server = Issues {
            tool_router: router,
        };
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            if let Ok(running) = server.serve(server_io).await {
                let _ = running.waiting().await;
            }
        });
        if modern {
            let mode = ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            };
            client.serve_with_lifecycle(client_io, mode).await.unwrap()
        } else {
            client.serve(client_io).await.unwrap()
        }
    }

    async fn guarded(&self, modern: bool) -> RunningService<RoleClient, Client> {
        let router = self
            .ledger
            .router(Issues::tool_router() + status_router())
            .unwrap();
        self.connect(router, modern).await
    }

    async fn issues(&self) -> i64 {
        toolledger_testkit::db::count(self.ledger.store(), "issues").await
    }
}

fn args(op: &str) -> serde_json::Map<String, Value> {
    json!({"operation_id": op, "title": "spec"})
        .as_object()
        .cloned()
        .unwrap()
}

fn answers(body: &str) -> InputResponses {
    let mut r = InputResponses::new();
    r.insert(
        "body".into(),
        json!({"action": "accept", "content": {"body": body}}),
    );
    r
}

fn continuation(op: &str, state: &str, body: &str) -> CallToolRequestParams {
    let mut p = CallToolRequestParams::new("create_issue")
        .with_arguments(args(op))
        .with_input_responses(answers(body));
    p.request_state = Some(state.to_string());
    p
}

fn complete(r: CallToolResponse) -> (bool, Value) {
    let CallToolResponse::Complete(r) = r else {
        panic!("expected a complete result, got {r:?}");
    };
    body_of(&r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_did_not_declare_elicitation_is_never_asked_and_nothing_is_written() {
    let w = world().await;
    let router = w
        .ledger
        .router(Issues::tool_router() + status_router())
        .unwrap();
    let client = w.connect_as(router, true, Client { declares: false }).await;
    let r = client
        .call_tool_once(CallToolRequestParams::new("create_issue").with_arguments(args("nc-1")))
        .await
        .unwrap();
    let (err, body) = complete(r);
    assert!(err, "{body}");
    assert_eq!(body["error"]["code"], "continuation_unsupported", "{body}");
    assert_eq!(w.issues().await, 0);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_round_tool_asks_then_commits_once_and_the_exact_continuation_replays() {
    let w = world().await;
    let client = w.guarded(true).await;
    let first = client
        .call_tool_once(CallToolRequestParams::new("create_issue").with_arguments(args("mr-1")))
        .await
        .unwrap();
    let CallToolResponse::InputRequired(ir) = first else {
        panic!("expected input_required, got {first:?}");
    };
    let keys: Vec<_> = ir.input_requests.unwrap().keys().cloned().collect();
    assert_eq!(keys, ["body"]);
    let state = ir.request_state.unwrap();
    assert_eq!(w.issues().await, 0, "the first round writes nothing");

    let mut seen = Vec::new();
    for _ in 0..2 {
        let r = client
            .call_tool_once(continuation("mr-1", &state, "alpha"))
            .await
            .unwrap();
        seen.push(complete(r));
    }
    assert_eq!(
        seen[0],
        (
            false,
            json!({"operationId": "mr-1", "effectId": 1, "result": "created 1",
                   "replayed": false, "state": "applied"})
        )
    );
    assert_eq!(seen[1].1["replayed"], true);

    // Another answer under the same operation id is another request.
    let other = client
        .call_tool_once(continuation("mr-1", &state, "beta"))
        .await
        .unwrap();
    let (err, body) = complete(other);
    assert!(err);
    assert_eq!(body["error"]["code"], "operation_conflict");

    // A tampered token, or one for another operation id, opens nothing: the protocol error
    // -32602 with `data.code`, not a tool result.
    let mut tampered = state.clone();
    tampered.pop();
    tampered.push(if state.ends_with('A') { 'B' } else { 'A' });
    for p in [
        continuation("mr-1", &tampered, "alpha"),
        continuation("mr-2", &state, "alpha"),
    ] {
        let e = client.call_tool_once(p).await.unwrap_err();
        let rmcp::ServiceError::McpError(e) = e else {
            panic!("expected a JSON-RPC error, got {e:?}");
        };
        assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS);
        assert_eq!(e.data, Some(json!({"code": "request_state_invalid"})));
    }

    // A client that lost its requestState starts over: its first round is the replay.
    let again = client
        .call_tool_once(CallToolRequestParams::new("create_issue").with_arguments(args("mr-1")))
        .await
        .unwrap();
    let (err, body) = complete(again);
    assert!(!err, "{body}");
    assert_eq!(
        body,
        json!({"operationId": "mr-1", "effectId": 1, "result": "created 1",
               "replayed": true, "state": "applied"})
    );
    // Starting over with another title under that id is another request.
    let mut changed = args("mr-1");
    changed.insert("title".into(), json!("other"));
    let other = client
        .call_tool_once(CallToolRequestParams::new("create_issue").with_arguments(changed))
        .await
        .unwrap();
    assert_eq!(complete(other).1["error"]["code"], "operation_conflict");

    // The authority deadline was fixed by the first round: past it, not even the exact
    // continuation writes (or replays).
    w.clock.advance(101);
    let late = client
        .call_tool_once(continuation("mr-1", &state, "alpha"))
        .await
        .unwrap();
    let (err, body) = complete(late);
    assert!(err);
    assert_eq!(
        body["error"]["code"], "operation_authority_expired",
        "{body}"
    );
    assert_eq!(w.issues().await, 1);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_initialize_lifecycle_cannot_be_asked_and_nothing_is_written() {
    let w = world().await;
    let client = w.guarded(false).await;
    let r = client
        .call_tool(CallToolRequestParams::new("create_issue").with_arguments(args("old-1")))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(true));
    assert_eq!(body_of(&r).1["error"]["code"], "continuation_unsupported");
    assert_eq!(w.issues().await, 0);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_caller_is_refused_on_the_next_call() {
    let w = world().await;
    let client = w.guarded(true).await;
    w.ledger
        .principals()
        .revoke("alice", &[], &[], true)
        .await
        .unwrap();
    let r = client
        .call_tool_once(CallToolRequestParams::new("create_issue").with_arguments(args("rv-1")))
        .await
        .unwrap();
    let (err, body) = complete(r);
    assert!(err);
    assert_eq!(body["error"]["code"], "permission_denied", "{body}");
    let status = client
        .call_tool(
            CallToolRequestParams::new("get_operation_status").with_arguments(
                json!({"operation_id": "rv-1"})
                    .as_object()
                    .cloned()
                    .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(status.is_error, Some(true));
    assert_eq!(w.issues().await, 0);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_tool_served_without_the_ledger_router_fails_loudly() {
    let w = world().await;
    let client = w.connect(Issues::tool_router(), true).await;
    let r = client
        .call_tool_once(CallToolRequestParams::new("create_issue").with_arguments(args("nr-1")))
        .await;
    let e = r.expect_err("an unwrapped guarded tool must not answer");
    assert!(e.to_string().contains("LedgerGuard::router"), "{e}");
    assert_eq!(w.issues().await, 0);
    client.cancel().await.unwrap();
}

impl World {
    async fn with_rounds(&self, modern: bool) -> RunningService<RoleClient, Client> {
        let routes = Issues::rounds_router() + status_router();
        let router = self.ledger.router(routes).unwrap();
        self.connect(router, modern).await
    }

    async fn watchers(&self) -> Vec<String> {
        let rows = self
            .ledger
            .store()
            .read(|tx: &mut dyn EffectTx| {
                tx.query(
                    "SELECT e.kind FROM operation_events e JOIN operations o \
                     ON o.id = e.operation_id WHERE e.kind LIKE 'watcher_%' ORDER BY e.id",
                    &[],
                )
            })
            .await
            .unwrap();
        rows.iter().map(|r| r.text(0).unwrap()).collect()
    }
}

fn watched(op: &str, title: &str) -> CallToolRequestParams {
    let arguments = json!({"operation_id": op, "title": title});
    CallToolRequestParams::new("create_watched_issue")
        .with_arguments(arguments.as_object().cloned().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_elicit_inside_the_call_under_the_initialize_lifecycle_and_replay_after() {
    let w = world().await;
    let client = w.with_rounds(false).await;
    let first = client.call_tool(watched("old-1", "spec")).await.unwrap();
    let (error, body) = body_of(&first);
    assert!(!error, "{body}");
    assert_eq!(body["state"], "applied", "{body}");
    assert_eq!(body["replayed"], false);
    assert_eq!(
        w.issues().await,
        1,
        "the body was elicited and the issue created at once"
    );
    let again = client.call_tool(watched("old-1", "spec")).await.unwrap();
    let (_, replay) = body_of(&again);
    assert_eq!(replay["replayed"], true, "{replay}");
    assert_eq!(replay["effectId"], body["effectId"]);
    assert_eq!(w.issues().await, 1);
    assert_eq!(w.watchers().await, ["watcher_added"]);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_ask_with_input_required_then_a_failed_second_step_finishes_partial() {
    let w = world().await;
    let client = w.with_rounds(true).await;
    let asked = client
        .call_tool_once(watched("new-1", "unwatchable spec"))
        .await
        .unwrap();
    let CallToolResponse::InputRequired(ir) = asked else {
        panic!("a modern client is asked with input_required: {asked:?}");
    };
    assert_eq!(w.issues().await, 0, "nothing is written before the answer");
    let mut continued = watched("new-1", "unwatchable spec").with_input_responses(answers("b"));
    continued.request_state = ir.request_state.clone();
    let (error, done) = complete(client.call_tool_once(continued.clone()).await.unwrap());
    assert!(!error, "{done}");
    assert_eq!(done["state"], "partial", "{done}");
    assert_eq!(w.issues().await, 1);
    assert_eq!(w.watchers().await, ["watcher_failed"]);
    let (_, replay) = complete(client.call_tool_once(continued).await.unwrap());
    assert_eq!(replay["replayed"], true, "{replay}");
    assert_eq!(replay["state"], "partial");
    assert_eq!(w.issues().await, 1, "the exact continuation replays");
    client.cancel().await.unwrap();
}
