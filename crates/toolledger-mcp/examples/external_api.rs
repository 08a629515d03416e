//! An external-API tool: `send_email` calls a mail service once per operation.
//!
//! The intent is committed before the call; the call carries a key stable for the operation
//! (send it as the API's `Idempotency-Key`); its answer is stored and every retry replays it.
//! A lost answer leaves the operation `outcome_unknown` — never sent again on its own — until
//! `get_operation_status` runs the lookup and finds what the service did.
//!
//! ```sh
//! TOOLLEDGER_PRINCIPAL=billing MAIL_SPOOL=/tmp/mail.jsonl \
//!   cargo run -p toolledger-mcp --example external_api -- /tmp/mail.sqlite   # MCP on stdio
//! ```
//!
//! The mail service here is a stand-in (`Mailer`: a JSON-lines file, deduplicating by key, with
//! `MAIL_LOSE_REPLY=1` to lose every answer after sending and `MAIL_REPLY_DELAY_MS` to answer
//! late); yours is an HTTP client.

use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler, ServiceExt};
use serde_json::json;
use toolledger::runtime::{External, Registry};
use toolledger::ToolContract;
use toolledger_mcp::{deferred::output_schema, status_router, DeferredArguments};
use toolledger_mcp::{DeferredOutcome, Guarded, LedgerGuard, Refusal};

type BoxError = Box<dyn std::error::Error>;

#[derive(serde::Deserialize, schemars::JsonSchema)]
pub struct Email {
    operation_id: String,
    to: String,
    subject: String,
}

#[derive(Clone)]
pub struct Mail {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Mail {
    /// Send an email. A retry with the same operation_id never sends it twice.
    #[tool(output_schema = output_schema())]
    async fn send_email(
        &self,
        g: Guarded,
        Parameters(e): Parameters<Email>,
    ) -> Result<DeferredOutcome, Refusal> {
        let arguments = json!({"to": e.to, "subject": e.subject});
        g.deliver(DeferredArguments::new(e.operation_id, arguments))
            .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Mail {}

/// Opens the ledger at `database` for `principal` (added when new), sending through `mailer`.
pub async fn open(
    db: &str,
    principal: &str,
    mailer: Mailer,
) -> Result<(LedgerGuard, Mail), BoxError> {
    let (send, find) = (mailer.clone(), mailer);
    let email = External::new(move |r| send.clone().send(r))
        .with_lookup(move |r| find.clone().find(r.idempotency_key));
    let registry = Registry::new().external(ToolContract::uniform("send_email", "1"), email);
    let ledger = LedgerGuard::builder().database(db).principal(principal);
    let ledger = ledger.deferred(registry).open()?;
    let principals = ledger.principals();
    let _known = principals.add(principal, "example", &[], &[], false).await;
    let tool_router = ledger.router(Mail::tool_router() + status_router())?;
    Ok((ledger, Mail { tool_router }))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let principal =
        std::env::var("TOOLLEDGER_PRINCIPAL").map_err(|_| "set TOOLLEDGER_PRINCIPAL")?;
    let db = std::env::args().nth(1);
    let db = db.as_deref().unwrap_or("mail.sqlite");
    let (_ledger, mail) = open(db, &principal, Mailer::from_env()).await?;
    let running = mail.serve(toolledger_mcp::wire::stdio::stdio()).await?;
    running.waiting().await?;
    Ok(())
}

use serde_json::Value;
use toolledger::{downstream::DownstreamError, runtime::ExternalRequest};

/// The mail service stand-in: one JSON line per message sent, at most one per key.
#[derive(Clone, Debug)]
pub struct Mailer {
    pub spool: std::path::PathBuf,
    pub lose_reply: bool,
    /// How long the service takes to answer after it sent (`MAIL_REPLY_DELAY_MS`).
    pub reply_delay: std::time::Duration,
}

impl Mailer {
    /// The spool `MAIL_SPOOL` (default `mail.jsonl`), losing answers when `MAIL_LOSE_REPLY`
    /// is set.
    pub fn from_env() -> Mailer {
        let spool = std::env::var("MAIL_SPOOL").unwrap_or_else(|_| "mail.jsonl".into());
        let delay_ms = std::env::var("MAIL_REPLY_DELAY_MS").ok();
        Mailer {
            spool: spool.into(),
            lose_reply: std::env::var_os("MAIL_LOSE_REPLY").is_some(),
            reply_delay: std::time::Duration::from_millis(
                delay_ms.and_then(|d| d.parse().ok()).unwrap_or(0),
            ),
        }
    }

    pub async fn send(self, request: ExternalRequest) -> Result<Value, DownstreamError> {
        let key = request.idempotency_key;
        if let Some(sent) = self.clone().find(key.clone()).await? {
            return Ok(sent);
        }
        let sent = json!({"message_id": format!("msg-{key}"), "to": request.arguments["to"]});
        let line = json!({"key": key, "sent": sent}).to_string() + "\n";
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.spool)
            .map_err(|_| DownstreamError::NotSent("the mail service is not reachable".into()))?;
        file.write_all(line.as_bytes())
            .map_err(|e| DownstreamError::Unavailable(e.to_string()))?;
        tokio::time::sleep(self.reply_delay).await;
        match self.lose_reply {
            true => Err(DownstreamError::Unavailable("the answer was lost".into())),
            false => Ok(sent),
        }
    }

    pub async fn find(self, key: String) -> Result<Option<Value>, DownstreamError> {
        let text = std::fs::read_to_string(&self.spool).unwrap_or_default();
        Ok(text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|m| m["key"] == key.as_str())
            .map(|m| m["sent"].clone()))
    }
}
