//! Guard your own side-effecting tool in an ordinary rmcp server: the whole program.
//!
//! A tiny notes server: `create_note {operation_id, text}` inserts a row into the
//! application's own `notes` table. The tool is a plain `#[tool]` method; its `Guarded`
//! argument commits the insert in the same transaction as the ledger row, so a retry with the
//! same operation id replays the stored result instead of inserting again, the same id with
//! other text is `operation_conflict`, `get_operation_status` answers after a lost reply, and
//! a call outside the input schema (derived from `Note`) is refused before anything runs.
//!
//! ```sh
//! TOOLLEDGER_DB=notes.sqlite cargo run -p toolledger-mcp --example guarded_tool
//! ```
//!
//! serves it over the strict stdio transport. The configuration comes from the environment
//! (`LedgerGuardBuilder::from_env`): `TOOLLEDGER_DB` (a SQLite file) or
//! `TOOLLEDGER_DATABASE_URL` (a `postgres://` URL, with `TOOLLEDGER_STATE_KEY_HEX` and
//! `TOOLLEDGER_FINGERPRINT_KEY_HEX`), and `TOOLLEDGER_PRINCIPAL`, the caller (default
//! `local`; created on first use). tests/example_guarded_tool.rs drives it in-process,
//! tests/python_sdk.rs with the official Python SDK, and the toolledger binary's
//! history_example test kills it at random moments.

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::{schemars, tool, tool_router};
use toolledger_mcp::prelude::*;

/// The application's own table, migrated beside the ledger's: SQL both backends accept.
const SQL: &str = "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL)";
pub const NOTES: Migration = Migration::new("notes", 1, SQL);
const INSERT: &str = "INSERT INTO notes SELECT count(*) + 1, ?1 FROM notes";

/// The tool's arguments; the input schema (unknown fields refused) is derived from them.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Note {
    /// Idempotency key: retry with the same one to replay instead of repeating.
    operation_id: String,
    /// The note.
    #[schemars(length(min = 1, max = 1000))]
    text: String,
}

/// The server's tools.
pub struct Notes;

#[tool_router(vis = "pub")]
impl Notes {
    /// Create a note; retry with the same operation_id to replay.
    #[tool(annotations(destructive_hint = false, idempotent_hint = true))]
    async fn create_note(&self, g: Guarded, n: Parameters<Note>) -> Result<Json<Receipt>, Refusal> {
        let intent = serde_json::json!({"text": n.0.text});
        // The effect: one note row, inside the ledger's transaction.
        let effect = move |tx: &mut dyn EffectTx, _: &Principal| {
            Ok(serde_json::json!({"effectId": tx.insert_id(INSERT, &[n.0.text.clone().into()])?}))
        };
        g.run(&n.0.operation_id, intent, effect).await
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ledger = LedgerGuardBuilder::from_env().migrations(&[NOTES]).open()?;
    Ok(ledger.serve_stdio(Notes, Notes::tool_router()).await?)
}
