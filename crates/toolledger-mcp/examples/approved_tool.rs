//! A guarded tool that needs a human approval: `publish_post {operation_id, slug, text,
//! approval?}` inserts one row into the application's own `posts` table, but only with an
//! approval another person granted for exactly this intent. Without one the call is
//! `approval_required`; an approval for another intent, or one already used, is
//! `approval_invalid`; the approval is consumed in the same transaction as the post and the
//! ledger row, and a retry with the same operation id replays.
//!
//! The approver computes the same target from the requester, the tool, the operation id and
//! the intent the tool records (`{"slug", "text"}`):
//!
//! ```text
//! toolledger approve --db posts.sqlite --approver bob --tool publish_post \
//!     --requester alice --key post-1 --arguments '{"slug":"hello","text":"Hello"}'
//! ```
//!
//! `TOOLLEDGER_PRINCIPAL=alice cargo run -p toolledger-mcp --example approved_tool -- DATABASE`
//! serves it over stdio (tests/example_approved_tool.rs drives it in-process).

use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Json, wrapper::Parameters};
use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolledger::effect::EffectTx;
use toolledger::{model::Principal, store::Migration};
use toolledger_mcp::{status_router, Guarded, LedgerGuard, Receipt, Refusal};

/// The application's own table, migrated beside the ledger's.
pub const POSTS: Migration = Migration {
    namespace: "example.posts",
    version: 1,
    sql: "CREATE TABLE posts (slug TEXT PRIMARY KEY, author TEXT NOT NULL, text TEXT NOT NULL)",
};

/// The tool's arguments.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewPost {
    /// Idempotency key: retry with the same one to replay instead of repeating.
    #[schemars(length(min = 1, max = 256))]
    operation_id: String,
    /// The post's address.
    #[schemars(regex(pattern = "^[a-z0-9-]{1,64}$"))]
    slug: String,
    /// The post.
    #[schemars(length(min = 1, max = 10000))]
    text: String,
    /// The approval id `toolledger approve` printed for this exact intent.
    #[allow(dead_code)]
    approval: Option<String>,
}

/// What the effect returns (and a replay returns again).
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
pub struct Published {
    /// The post's address.
    slug: String,
}

/// The server: an ordinary rmcp tool router, wrapped once by the ledger.
#[derive(Clone)]
pub struct Posts {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Posts {
    /// Publish a post once another person approved it; retry with the same operation_id.
    #[tool(annotations(destructive_hint = false, idempotent_hint = true))]
    async fn publish_post(
        &self,
        g: Guarded,
        Parameters(post): Parameters<NewPost>,
    ) -> Result<Json<Receipt<Published>>, Refusal> {
        // The intent the approval binds: what is published, not the approval id itself.
        let intent = json!({"slug": post.slug, "text": post.text});
        let op = post.operation_id.clone();
        let effect = move |tx: &mut dyn EffectTx, p: &Principal| {
            let row = [
                post.slug.clone().into(),
                p.subject.clone().into(),
                post.text.clone().into(),
            ];
            tx.execute(
                "INSERT INTO posts(slug, author, text) VALUES (?1, ?2, ?3)",
                &row,
            )?;
            Ok(json!({"slug": post.slug}))
        };
        g.run_approved(&op, intent, "approval", effect).await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Posts {}

/// Opens the ledger at `database` for `principal` (who must be a principal of the ledger)
/// and builds the server.
pub fn open(
    database: &str,
    principal: &str,
) -> Result<(LedgerGuard, Posts), Box<dyn std::error::Error>> {
    let builder = LedgerGuard::builder().database(database);
    let ledger = builder.migrations(&[POSTS]).principal(principal).open()?;
    let tool_router = ledger.router(Posts::tool_router() + status_router())?;
    Ok((ledger, Posts { tool_router }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database = std::env::args().nth(1).ok_or("name the database")?;
    let principal =
        std::env::var("TOOLLEDGER_PRINCIPAL").map_err(|_| "set TOOLLEDGER_PRINCIPAL")?;
    let (_ledger, posts) = open(&database, &principal)?;
    let running = posts.serve(toolledger_mcp::wire::stdio::stdio()).await?;
    running.waiting().await?;
    Ok(())
}
