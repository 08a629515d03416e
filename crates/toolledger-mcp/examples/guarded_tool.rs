//! Guard your own side-effecting tool in an ordinary rmcp server.
//!
//! A tiny notes server: `create_note {operation_id, text}` inserts a row into the
//! application's own `notes` table. The tool is a plain `#[tool]` method; its `Guarded`
//! argument commits the insert in the same transaction as the ledger row, so a retry with the
//! same operation id replays the stored result instead of inserting again, the same id with
//! other arguments is `operation_conflict`, `get_operation_status` answers after a lost
//! reply, and a call that does not match the input schema is refused before anything runs.
//!
//! `TOOLLEDGER_PRINCIPAL=alice cargo run -p toolledger-mcp --example guarded_tool -- serve
//! [DATABASE]` serves it over stdio as the principal the variable names (added to the ledger
//! when new; tests/example_guarded_tool.rs drives it in-process, and tests/python_sdk.rs with
//! the official Python SDK).
//!
//! DATABASE is a SQLite file or a `postgres://` URL (default: `$TOOLLEDGER_DATABASE_URL`,
//! else a temporary SQLite file). PostgreSQL takes its keys from `TOOLLEDGER_STATE_KEY_HEX`
//! and `TOOLLEDGER_FINGERPRINT_KEY_HEX`; SQLite keeps them in a key file beside the database.

use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Json, wrapper::Parameters};
use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolledger::effect::{EffectTx, RowExt};
use toolledger::{model::Principal, store::Migration};
use toolledger_mcp::{status_router, Guarded, LedgerGuard, Receipt, Refusal};

/// The application's own table, migrated beside the ledger's: SQL both backends accept.
pub const NOTES: Migration = Migration {
    namespace: "example.notes",
    version: 1,
    sql: "CREATE TABLE notes (id BIGINT PRIMARY KEY, author TEXT NOT NULL,
              text TEXT NOT NULL CHECK (length(text) BETWEEN 1 AND 1000))",
};

/// Portable too: no `AUTOINCREMENT`/`SERIAL`, the effect numbers its rows.
const INSERT_NOTE: &str = "INSERT INTO notes(id, author, text) \
    SELECT coalesce(max(id), 0) + 1, ?1, ?2 FROM notes RETURNING id";

/// The tool's arguments; the input schema (unknown fields refused) is derived from it.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewNote {
    /// Idempotency key: retry with the same one to replay instead of repeating.
    #[schemars(length(min = 1, max = 256))]
    operation_id: String,
    /// The note.
    #[schemars(length(min = 1, max = 1000))]
    text: String,
}

/// What the effect returns (and a replay returns again); the output schema is derived from it.
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
pub struct NoteCreated {
    /// The new row's id.
    #[serde(rename = "effectId")]
    effect_id: i64,
    /// A human-readable summary.
    result: String,
}

/// The server: an ordinary rmcp tool router, wrapped once by the ledger.
#[derive(Clone)]
pub struct Notes {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Notes {
    /// Create a note; retry with the same operation_id to replay.
    #[tool(annotations(destructive_hint = false, idempotent_hint = true))]
    async fn create_note(
        &self,
        g: Guarded,
        Parameters(note): Parameters<NewNote>,
    ) -> Result<Json<Receipt<NoteCreated>>, Refusal> {
        let intent = json!({"text": note.text});
        // The effect: one note row, inside the ledger's transaction.
        let effect = move |tx: &mut dyn EffectTx, p: &Principal| {
            let params = [p.subject.clone().into(), note.text.clone().into()];
            let id = tx
                .query_opt(INSERT_NOTE, &params)?
                .unwrap_or_default()
                .int(0)?;
            Ok(json!({"effectId": id, "result": format!("note {id}")}))
        };
        g.run(&note.operation_id, intent, effect).await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Notes {}

/// Opens the ledger at `database` (a SQLite file or a `postgres://` URL) for `principal` (added
/// when new) and builds the server.
pub async fn open(
    database: &str,
    principal: &str,
) -> Result<(LedgerGuard, Notes), Box<dyn std::error::Error>> {
    let builder = LedgerGuard::builder().database(database);
    let ledger = builder.migrations(&[NOTES]).principal(principal).open()?;
    let principals = ledger.principals();
    if principals.resolve(principal).await?.is_none() {
        principals.add(principal, "acme", &[], &[], false).await?;
    }
    let tool_router = ledger.router(Notes::tool_router() + status_router())?;
    Ok((ledger, Notes { tool_router }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let temporary = dir.path().join("notes.sqlite").display().to_string();
    let given = std::env::args().skip(1).find(|a| a != "serve");
    let database = given.or(std::env::var("TOOLLEDGER_DATABASE_URL").ok());
    let principal =
        std::env::var("TOOLLEDGER_PRINCIPAL").map_err(|_| "set TOOLLEDGER_PRINCIPAL")?;
    let (_ledger, notes) = open(&database.unwrap_or(temporary), &principal).await?;
    // The strict stdio transport: every line checked before rmcp reads it, every refused one
    // answered, and at most so many requests unanswered.
    let running = notes.serve(toolledger_mcp::wire::stdio::stdio()).await?;
    running.waiting().await?;
    Ok(())
}
