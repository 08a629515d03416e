//! A program's own deferred tool, delivered by the library worker.
//!
//! `send_invoice` is a tool of this program (not one of the reference tools), delivered to
//! `Mailer`, this program's own downstream. Calls are accepted into the ledger (transaction A:
//! the intent and its outbox event), then `runtime::Worker` drains the outbox: it claims each
//! event under a lease with a fencing token, rechecks the call, calls the downstream and
//! records its receipt. A second run of the program replays instead of sending again.
//!
//! ```sh
//! cargo run -p toolledger --example deferred_worker -- /tmp/invoices.sqlite
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;
use toolledger::clock::SystemClock;
use toolledger::digest::sha256_hex;
use toolledger::downstream::{scope_digest, BoxFuture, Downstream, DownstreamError};
use toolledger::runtime::{
    DeferredCall, DeferredTool, ProviderContext, ProviderProfile, Registry, Runtime, Worker,
};
use toolledger::{Error, Scope, ToolContract};

/// The tool: send invoice `invoice` to `to`. No approval; any active principal may send.
struct SendInvoice;

impl DeferredTool for SendInvoice {
    fn contract(&self) -> ToolContract {
        ToolContract::uniform("send_invoice", "1")
    }

    fn validate(&self, arguments: &Value) -> Result<Value, Error> {
        let field = |k| arguments.get(k).and_then(Value::as_str);
        match (field("invoice"), field("to")) {
            (Some(invoice), Some(to)) if arguments.as_object().is_some_and(|o| o.len() == 2) => {
                Ok(json!({"invoice": invoice, "to": to}))
            }
            _ => Err(Error::invalid("arguments are exactly {invoice, to}")),
        }
    }

    fn accept_receipt(&self, arguments: &Value, receipt: &Value) -> Result<Value, Error> {
        Ok(json!({"invoice": arguments["invoice"], "message_id": receipt["receipt_id"]}))
    }
}

/// The downstream: a mail service, idempotent under the ledger's scope, answering status
/// queries by the ledger's status reference. (Here in memory; a real one is a remote API.)
#[derive(Debug, Default)]
struct Mailer {
    sent: Mutex<HashMap<String, Value>>,
}

impl Downstream for Mailer {
    fn submit<'a>(
        &'a self,
        scope: &'a Scope,
        request: &'a Value,
    ) -> BoxFuture<'a, Result<Value, DownstreamError>> {
        Box::pin(async move {
            let text = toolledger::json::canonical_string(request)
                .map_err(|_| DownstreamError::Rejected("not canonical JSON".into()))?;
            let sha = sha256_hex(text.as_bytes());
            let status_ref = request["status_ref"].as_str().unwrap_or_default();
            let mut sent = self.sent.lock().expect("mailer");
            let receipt = sent.entry(status_ref.to_string()).or_insert_with(|| {
                println!(
                    "mailer: sending {} to {}",
                    request["arguments"]["invoice"], request["arguments"]["to"]
                );
                json!({
                    "receipt_id": format!("msg_{}", &sha[..16]),
                    "scope_digest": scope_digest(scope),
                    "status_ref": status_ref,
                    "request_sha256": sha,
                    "request": request,
                })
            });
            Ok(receipt.clone())
        })
    }

    fn status<'a>(
        &'a self,
        status_ref: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, DownstreamError>> {
        Box::pin(async move { Ok(self.sent.lock().expect("mailer").get(status_ref).cloned()) })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "invoices.sqlite".to_string());
    let ledger = toolledger::Ledger::open(&path)?;
    let principals = PrincipalStore::new(ledger.store());
    if principals.resolve("billing").await?.is_none() {
        principals.add("billing", "acme", &[], &[], false).await?;
    }

    let registry = Registry::new()
        .register(Arc::new(SendInvoice), Arc::new(Mailer::default()))
        .allow_profile(ProviderProfile::mcp());
    let runtime = Runtime::new(ledger.store(), Arc::new(SystemClock), registry);

    // Accept three sends (a second run finds them and accepts nothing new).
    for n in 1..=3 {
        let key = format!("invoice-{n}");
        let call = DeferredCall {
            new_intent: false,
            principal: "billing".into(),
            tool: "send_invoice".into(),
            arguments: json!({"invoice": format!("INV-{n:04}"), "to": "ap@example.com"}),
            approval_id: None,
            provider: ProviderContext::mcp(&key),
            key,
        };
        println!("accepted: {:?}", runtime.accept(&call).await?);
    }

    // Drain the outbox: one pass now, then poll until nothing is left (or Ctrl-C).
    let worker = Worker::new(runtime.clone(), format!("invoices-{}", std::process::id()))
        .batch(16)
        .poll_interval(Duration::from_millis(200))
        .on_failure(|f| eprintln!("failed: event {:?}: {}", f.event_id, f.code()));
    let first = worker.run_once().await?;
    println!("first pass: {first:?}");
    let run = worker
        .run_until(async {
            loop {
                let ready = runtime.ready(1).await;
                if matches!(ready.as_deref(), Ok([])) {
                    return "drained";
                }
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => return "ctrl-c",
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        })
        .await;
    println!(
        "stopped: {} after {} more passes, {} delivered",
        run.stopped_by, run.passes, run.totals.delivered
    );
    Ok(())
}
