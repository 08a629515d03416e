//! Runs `examples/guarded_tool.rs` in-process with an rmcp client: a user's own guarded tool
//! replays instead of repeating, `get_operation_status` finds the operation without being
//! told its tool, arguments outside the input schema are refused before anything is written,
//! and the tool advertises schemas derived from its types.

#[allow(dead_code)]
#[path = "../examples/guarded_tool.rs"]
mod example;

use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use serde_json::{json, Value};
use toolledger::authz::Ensured;
use toolledger_mcp::server::STDIO_TENANT;
use toolledger_mcp::LedgerGuard;
use toolledger_testkit::replies::body_of;

struct Session {
    ledger: LedgerGuard,
    client: RunningService<RoleClient, ()>,
    _dir: tempfile::TempDir,
}

async fn session() -> Session {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("notes.sqlite");
    // What the example's `main` does, with the configuration it reads from the environment.
    let ledger = LedgerGuard::builder()
        .database(db.to_str().unwrap())
        .principal("alice")
        .migrations(&[example::NOTES])
        .open()
        .unwrap();
    let known = ledger.principals().ensure("alice", STDIO_TENANT).await;
    assert_eq!(known.unwrap(), Ensured::Created);
    let notes = ledger
        .server(example::Notes, example::Notes::tool_router())
        .unwrap();
    let client = toolledger_testkit::replies::connect(notes).await;
    Session {
        ledger,
        client,
        _dir: dir,
    }
}

impl Session {
    /// `(isError, structuredContent)` of one call.
    async fn call(&self, tool: &str, args: Value) -> (bool, Value) {
        let r = toolledger_testkit::replies::call_tool(&self.client, tool, args).await;
        body_of(&r)
    }

    async fn count(&self, table: &str) -> i64 {
        toolledger_testkit::db::count(self.ledger.store(), table).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_creates_one_note_and_replays_the_retry() {
    let s = session().await;
    let args = json!({"operation_id": "note-1", "text": "hello"});
    let first = s.call("create_note", args.clone()).await;
    assert_eq!(
        first,
        (
            false,
            json!({"operationId": "note-1", "effectId": 1, "replayed": false, "state": "applied"})
        )
    );
    let (err, retry) = s.call("create_note", args).await;
    assert!(!err);
    assert_eq!(retry["replayed"], true);
    assert_eq!(retry["effectId"], 1);
    let (err, conflict) = s
        .call(
            "create_note",
            json!({"operation_id": "note-1", "text": "other"}),
        )
        .await;
    assert!(err);
    assert_eq!(conflict["error"]["code"], "operation_conflict");
    let (err, status) = s
        .call("get_operation_status", json!({"operation_id": "note-1"}))
        .await;
    assert!(!err, "{status}");
    assert_eq!(status["state"], "applied");
    assert_eq!(status["authoritative"], true);
    assert_eq!(status["principal"], "alice");
    assert_eq!(status["matchingIds"], json!([1]));
    assert_eq!(status["storedResult"], json!({"effectId": 1}));
    let (_, unknown) = s
        .call(
            "get_operation_status",
            json!({"operation_id": "never-used"}),
        )
        .await;
    assert_eq!(unknown["state"], "unknown");
    assert_eq!(unknown["authoritative"], false);
    assert_eq!(s.count("notes").await, 1);
    assert_eq!(s.count("operations").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_outside_the_input_schema_are_refused_and_nothing_is_written() {
    let s = session().await;
    let long = "x".repeat(1001);
    for (args, what) in [
        (
            json!({"operation_id": "bad-1", "text": "hi", "extra": 1}),
            "extra",
        ),
        (json!({"operation_id": "bad-2", "text": 7}), "text"),
        (json!({"operation_id": "bad-3"}), "text"),
        (json!({"operation_id": "bad-4", "text": ""}), "text"),
        (json!({"operation_id": "bad-5", "text": long}), "text"),
        // Not in the example's schema: the guard refuses an empty operation id itself.
        (json!({"operation_id": "", "text": "hi"}), "operation id"),
    ] {
        let (err, body) = s.call("create_note", args.clone()).await;
        assert!(err, "{args} was accepted: {body}");
        assert_eq!(body["error"]["code"], "invalid_arguments", "{args}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(what), "{args}: {message}");
        assert!(message.chars().count() <= 320, "{message}");
    }
    // A single-round tool takes no continuation.
    let mut p = CallToolRequestParams::new("create_note").with_arguments(
        json!({"operation_id": "c-1", "text": "hi"})
            .as_object()
            .cloned()
            .unwrap(),
    );
    p.request_state = Some("forged".into());
    let r = s.client.call_tool(p).await.unwrap();
    assert_eq!(r.is_error, Some(true));
    assert_eq!(body_of(&r).1["error"]["code"], "continuation_unsupported");
    let (err, body) = s
        .call(
            "get_operation_status",
            json!({"operation_id": "x", "extra": "create_note"}),
        )
        .await;
    assert!(err);
    assert_eq!(body["error"]["code"], "invalid_arguments");
    assert_eq!(s.count("notes").await, 0);
    assert_eq!(s.count("operations").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_advertises_schemas_derived_from_its_types() {
    let s = session().await;
    let tools = s.client.list_all_tools().await.unwrap();
    let mut names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
    names.sort();
    assert_eq!(names, ["create_note", "get_operation_status"]);
    let note = tools.iter().find(|t| t.name == "create_note").unwrap();
    let input = Value::Object(note.input_schema.as_ref().clone());
    assert_eq!(input["additionalProperties"], false, "{input}");
    assert_eq!(
        input["required"],
        json!(["operation_id", "text"]),
        "{input}"
    );
    assert_eq!(input["properties"]["text"]["maxLength"], 1000, "{input}");
    // The result is any object (`Receipt` of a `Value`): its receipt's fields are typed.
    let output = Value::Object(note.output_schema.as_ref().unwrap().as_ref().clone());
    let mut props: Vec<_> = output["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    props.sort();
    assert_eq!(props, ["operationId", "replayed", "state"], "{output}");
    let annotations = note.annotations.as_ref().unwrap();
    assert_eq!(annotations.destructive_hint, Some(false));
    assert_eq!(annotations.idempotent_hint, Some(true));
}

/// `create_note` with `arguments` and, when given, `_meta["io.toolledger/operation_id"]`.
async fn call_with_meta(s: &Session, arguments: Value, key: Option<&str>) -> (bool, Value) {
    let mut p = CallToolRequestParams::new("create_note")
        .with_arguments(arguments.as_object().cloned().unwrap());
    if let Some(key) = key {
        let mut meta = serde_json::Map::new();
        meta.insert("io.toolledger/operation_id".into(), json!(key));
        p.meta = Some(rmcp::model::RequestMetaObject(meta.into()));
    }
    body_of(&s.client.call_tool(p).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_takes_the_key_from_meta_or_the_argument_and_refuses_two_that_disagree() {
    let s = session().await;
    // The key in `_meta` alone names the operation.
    let (err, first) = call_with_meta(&s, json!({"text": "from meta"}), Some("note-m")).await;
    assert!(!err, "{first}");
    assert_eq!(first["operationId"], "note-m");
    assert_eq!(first["replayed"], false);
    // The same operation named by the argument replays it, and so does `_meta` again.
    let (_, by_argument) = s
        .call(
            "create_note",
            json!({"operation_id": "note-m", "text": "from meta"}),
        )
        .await;
    assert_eq!(by_argument["replayed"], true, "{by_argument}");
    assert_eq!(by_argument["effectId"], first["effectId"]);
    let (_, again) = call_with_meta(&s, json!({"text": "from meta"}), Some("note-m")).await;
    assert_eq!(again["replayed"], true, "{again}");
    // Two carriers that disagree: refused, naming both; nothing written.
    let (err, refused) = call_with_meta(
        &s,
        json!({"operation_id": "note-x", "text": "hi"}),
        Some("note-y"),
    )
    .await;
    assert!(err, "{refused}");
    assert_eq!(refused["error"]["code"], "invalid_arguments", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("operation_id") && message.contains("_meta"),
        "{message}"
    );
    assert_eq!(s.count("notes").await, 1);
    assert_eq!(s.count("operations").await, 1);
}
