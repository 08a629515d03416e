//! Guard your own side-effecting rmcp tool.
//!
//! A tiny notes server: `create_note {operation_id, text}` inserts a row into the user's own
//! `notes` table. Wrapped in a [`GuardedTool`], the insert commits in the same transaction as
//! the ledger row, so a retry with the same operation id replays the stored result instead of
//! inserting again, and `get_operation_status` answers after a lost reply.
//!
//! Run it with `cargo run -p toolledger-mcp --example guarded_tool`: it serves the tools to an
//! in-process rmcp client, calls `create_note` twice with one operation id, asks for status,
//! and prints what it saw (exit 0 when there is exactly one note).

use std::sync::Arc;

use rmcp::model::CallToolRequestParams;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;
use toolledger::clock::SystemClock;
use toolledger::effect::EffectTx;
use toolledger::engine::{Engine, InlineEffect};
use toolledger::model::{Error, Principal, ToolContract};
use toolledger::store::sqlite::{OpenOptions, SqliteStore};
use toolledger::store::Migration;
use toolledger_mcp::tool::{GuardedTool, LedgerResultObserver};
use toolledger_mcp::{CallerSource, Guard, GuardConfig, KeyMaterial, LedgerServer, StatusTool};

/// The application's own table, migrated beside the ledger's.
const NOTES: Migration = Migration {
    namespace: "example.notes",
    version: 1,
    sql: "CREATE TABLE notes (
              id INTEGER PRIMARY KEY,
              author TEXT NOT NULL,
              text TEXT NOT NULL CHECK (length(text) BETWEEN 1 AND 1000)
          ) STRICT;",
};

/// The effect: one note row. It runs inside the ledger's transaction.
struct InsertNote {
    text: String,
}

impl InlineEffect for InsertNote {
    fn apply(&self, tx: &mut dyn EffectTx, principal: &Principal) -> Result<Value, Error> {
        let rows = tx.query(
            "INSERT INTO notes(author, text) VALUES (?1, ?2) RETURNING id",
            &[principal.subject.clone().into(), self.text.clone().into()],
        )?;
        let id = rows[0][0].as_i64().unwrap_or_default();
        Ok(json!({"effectId": id, "result": format!("note {id}")}))
    }
}

/// The guarded tool: contract, schema, and how to turn a call into (intent, effect).
fn create_note(guard: Guard) -> GuardedTool {
    GuardedTool::new(
        guard,
        ToolContract::uniform("create_note", "1"),
        "Create a note; retry with the same operation_id to replay.",
        json!({
            "type": "object",
            "properties": {
                "operation_id": {"type": "string", "minLength": 1, "maxLength": 256},
                "text": {"type": "string", "minLength": 1, "maxLength": 1000},
            },
            "required": ["operation_id", "text"],
            "additionalProperties": false,
        }),
        |call| {
            let text = match call.arguments.get("text") {
                Some(Value::String(t)) if !t.is_empty() => t.clone(),
                _ => return Err(Error::invalid("text must be a non-empty string")),
            };
            let effect: Arc<dyn InlineEffect> = Arc::new(InsertNote { text: text.clone() });
            Ok((json!({"text": text}), effect))
        },
    )
}

async fn count_notes(store: &SqliteStore) -> Result<i64, Error> {
    store
        .read(|conn| {
            conn.query_row("SELECT count(*) FROM notes", [], |r| r.get(0))
                .map_err(|_| Error::unavailable("notes could not be counted"))
        })
        .await
}

/// Builds the server, runs one client session against it, and returns the summary.
pub async fn run(dir: &std::path::Path) -> Result<Value, Box<dyn std::error::Error>> {
    let db = dir.join("notes.sqlite");
    let store = SqliteStore::open(
        &db,
        OpenOptions::new("sqlite:notes").with_migrations(&[NOTES]),
    )?;
    let principals = PrincipalStore::new(store.clone());
    principals.add("alice", "acme", &[], &[], false).await?;

    // Keys from TOOLLEDGER_*_KEY_HEX, else a 0600 key file beside the database.
    let keys = KeyMaterial::load(Some(&db))?;
    let engine = Engine::new(store.clone(), Arc::new(SystemClock));
    let guard = Guard::new(engine, &keys, GuardConfig::default())?;

    let server = LedgerServer::new(
        "notes",
        vec![
            Arc::new(create_note(guard.clone())),
            Arc::new(StatusTool::new(
                guard,
                vec![("create_note".into(), Arc::new(LedgerResultObserver))],
            )),
        ],
        principals,
        CallerSource::Configured("alice".into()),
    );

    // Serve in-process; a real server would use `rmcp::transport::stdio()`.
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    let serving = tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let client = ().serve(client_io).await?;
    let args = json!({"operation_id": "note-1", "text": "hello"});
    let call = || {
        CallToolRequestParams::new("create_note")
            .with_arguments(args.as_object().cloned().unwrap_or_default())
    };
    let first = client.call_tool(call()).await?.structured_content;
    let retry = client.call_tool(call()).await?.structured_content;
    let status = client
        .call_tool(
            CallToolRequestParams::new("get_operation_status").with_arguments(
                json!({"operation_id": "note-1"})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            ),
        )
        .await?
        .structured_content;
    client.cancel().await?;
    serving.abort();
    Ok(json!({
        "first": first,
        "retry": retry,
        "status_state": status.as_ref().map(|s| s["state"].clone()),
        "notes": count_notes(&store).await?,
    }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let summary = run(dir.path()).await?;
    println!("{summary}");
    if summary["notes"] != 1 || summary["retry"]["replayed"] != true {
        std::process::exit(1);
    }
    Ok(())
}
