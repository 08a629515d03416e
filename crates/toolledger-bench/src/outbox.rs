//! The `outbox-drain` workload: deferred operations already accepted (transaction A: ledger
//! row + outbox event, untimed), then drained by worker calls — claim under a lease with a
//! fencing token, the downstream submit, and transaction C (local receipt) — `concurrency` at
//! a time. This is what `toolledger worker` does per event.
//!
//! The downstream is an in-memory, idempotent stand-in that answers at once, so the line
//! measures the ledger's side of a delivery (two durable write transactions per event), not a
//! payments service.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;
use toolledger::clock::{SharedClock, SystemClock};
use toolledger::digest::sha256_hex;
use toolledger::downstream::{scope_digest, BoxFuture, Downstream, DownstreamError};
use toolledger::model::Scope;
use toolledger::runtime::{
    DeferredCall, DeferredTool, Processed, ProviderContext, ProviderProfile, Registry, Runtime,
};
use toolledger::{Error, ToolContract};

use super::report::Report;
use super::run::drive;

const TOOL: &str = "bench_deliver";
const PRINCIPAL: &str = "bench";

/// A deferred tool with no approval and no business checks: only the ledger's work remains.
struct BenchDeferred;

impl DeferredTool for BenchDeferred {
    fn contract(&self) -> ToolContract {
        ToolContract::uniform(TOOL, "1")
    }

    fn validate(&self, arguments: &Value) -> Result<Value, Error> {
        match arguments.get("n").and_then(Value::as_i64) {
            Some(n) if arguments.as_object().is_some_and(|o| o.len() == 1) => Ok(json!({"n": n})),
            _ => Err(Error::invalid("arguments are exactly {n: integer}")),
        }
    }

    fn accept_receipt(&self, arguments: &Value, receipt: &Value) -> Result<Value, Error> {
        if receipt.get("request").and_then(|r| r.get("arguments")) != Some(arguments) {
            return Err(Error::invalid("the receipt is for other arguments"));
        }
        Ok(json!({"n": arguments["n"], "receipt_id": receipt["receipt_id"]}))
    }
}

/// An idempotent downstream that keeps its receipts in memory.
#[derive(Debug, Default)]
struct MemoryDownstream {
    by_scope: Mutex<HashMap<String, Value>>,
    /// Status reference → scope digest.
    by_status_ref: Mutex<HashMap<String, String>>,
}

fn poisoned() -> DownstreamError {
    DownstreamError::Unavailable("downstream poisoned".into())
}

impl MemoryDownstream {
    fn submit_now(&self, scope: &Scope, request: &Value) -> Result<Value, DownstreamError> {
        let status_ref = request
            .get("status_ref")
            .and_then(Value::as_str)
            .ok_or_else(|| DownstreamError::Rejected("request needs a status_ref".into()))?;
        let text = toolledger::json::canonical_string(request)
            .map_err(|_| DownstreamError::Rejected("request is not canonical JSON".into()))?;
        let request_sha = sha256_hex(text.as_bytes());
        let key = scope_digest(scope);
        let mut by_scope = self.by_scope.lock().map_err(|_| poisoned())?;
        if let Some(existing) = by_scope.get(&key) {
            if existing["request_sha256"] != request_sha.as_str() {
                return Err(DownstreamError::Conflict);
            }
            return Ok(existing.clone());
        }
        let receipt = json!({
            "receipt_id": format!("rcpt_{}", &request_sha[..32]),
            "scope_digest": key,
            "status_ref": status_ref,
            "request_sha256": request_sha,
            "request": request,
        });
        self.by_status_ref
            .lock()
            .map_err(|_| poisoned())?
            .insert(status_ref.to_string(), key.clone());
        by_scope.insert(key, receipt.clone());
        Ok(receipt)
    }
}

impl Downstream for MemoryDownstream {
    fn submit<'a>(
        &'a self,
        scope: &'a Scope,
        request: &'a Value,
    ) -> BoxFuture<'a, Result<Value, DownstreamError>> {
        Box::pin(async move { self.submit_now(scope, request) })
    }

    fn status<'a>(
        &'a self,
        status_ref: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, DownstreamError>> {
        Box::pin(async move {
            let key = self
                .by_status_ref
                .lock()
                .map_err(|_| poisoned())?
                .get(status_ref)
                .cloned();
            let by_scope = self.by_scope.lock().map_err(|_| poisoned())?;
            Ok(key.and_then(|k| by_scope.get(&k).cloned()))
        })
    }
}

/// Accepts `ops` deferred operations (untimed), then drains them with `concurrency` workers.
pub async fn run(
    db: PathBuf,
    concurrency: usize,
    ops: usize,
    tuning: super::Tuning,
) -> Result<Report, &'static str> {
    let store = super::open_bench_store(&db, tuning)?;
    let writer = store.clone();
    let clock: SharedClock = Arc::new(SystemClock);
    PrincipalStore::new(store.clone())
        .add(PRINCIPAL, "bench", &[], &[], false)
        .await
        .map_err(|_| "BENCH_SETUP_FAILED")?;
    let registry = Registry::new()
        .register(
            Arc::new(BenchDeferred),
            Arc::new(MemoryDownstream::default()),
        )
        .allow_profile(ProviderProfile::mcp());
    let runtime = Arc::new(Runtime::new(store, clock, registry));

    let accepted = drive("outbox-accept", 64, ops, {
        let rt = runtime.clone();
        move |i| {
            let rt = rt.clone();
            async move {
                let key = format!("drain-{i:08}");
                let call = DeferredCall {
                    new_intent: false,
                    principal: PRINCIPAL.into(),
                    tool: TOOL.into(),
                    provider: ProviderContext::mcp(&key),
                    key,
                    arguments: json!({"n": i}),
                    approval_id: None,
                };
                rt.accept(&call).await.is_ok()
            }
        }
    })
    .await;
    if accepted.failed > 0 {
        return Err("BENCH_SEED_FAILED");
    }
    let ids = Arc::new(
        runtime
            .ready(ops as i64)
            .await
            .map_err(|_| "BENCH_SEED_FAILED")?,
    );
    if ids.len() != ops {
        return Err("BENCH_SEED_FAILED");
    }
    let before = writer.writer_stats();
    let measured = drive("outbox-drain", concurrency, ops, move |i| {
        let rt = runtime.clone();
        let id = ids[i];
        async move {
            matches!(
                rt.process(id, "bench-worker", None).await,
                Ok(Processed::Delivered(_))
            )
        }
    })
    .await;
    Ok(Report::new("outbox-drain", concurrency, ops, measured)
        .with_writer(before, writer.writer_stats()))
}
