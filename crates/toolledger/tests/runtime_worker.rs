//! `runtime::Worker` over a program's own deferred tool: a tool and a downstream registered
//! here (not the reference ones), delivered, refused and reclaimed by the library worker on
//! SQLite and on PostgreSQL; each failure reaches the hook and the log as it happens, with its
//! event, operation and code and never the arguments; fencing rejections and worker events are
//! counted.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;
use toolledger::clock::ManualClock;
use toolledger::digest::sha256_hex;
use toolledger::downstream::{scope_digest, BoxFuture, Downstream, DownstreamError};
use toolledger::effect::EffectTx;
use toolledger::outbox::ClaimOutcome;
use toolledger::runtime::{
    Accepted, DeferredCall, DeferredTool, ProviderContext, ProviderProfile, Registry, Runtime,
    RuntimeError, Worker,
};
use toolledger::store::Store;
use toolledger::{Error, ErrorCode, Principal, Scope, ToolContract};
use toolledger_testkit::both_drivers;
use toolledger_testkit::conformance::Harness;
use toolledger_testkit::db;

const T0: i64 = 1_767_225_600;

/// The program's own tool: ship a parcel to an address. It reads no table (the testkit's
/// `ShipParcel` reads the conformance `parcels` table); its business check is a switch the
/// scenario turns to make the worker's recheck refuse.
struct ShipParcel {
    closed: Arc<AtomicBool>,
}

impl DeferredTool for ShipParcel {
    fn contract(&self) -> ToolContract {
        ToolContract::uniform("ship_parcel", "1")
    }

    fn validate(&self, arguments: &Value) -> Result<Value, Error> {
        match arguments.get("address").and_then(Value::as_str) {
            Some(a) if arguments.as_object().is_some_and(|o| o.len() == 1) => {
                Ok(json!({"address": a}))
            }
            _ => Err(Error::invalid("arguments are exactly {address: string}")),
        }
    }

    fn check(&self, _: &mut dyn EffectTx, _: &Principal, _: &Value) -> Result<(), Error> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::new(
                ErrorCode::BusinessStateChanged,
                "the depot is closed",
            ));
        }
        Ok(())
    }

    fn accept_receipt(&self, arguments: &Value, receipt: &Value) -> Result<Value, Error> {
        Ok(json!({"address": arguments["address"], "tracking": receipt["receipt_id"]}))
    }
}

/// The program's own downstream: a carrier keeping its receipts in memory, idempotent by scope.
#[derive(Debug, Default)]
struct Carrier {
    receipts: Mutex<HashMap<String, Value>>,
    submits: Mutex<usize>,
}

impl Downstream for Carrier {
    fn submit<'a>(
        &'a self,
        scope: &'a Scope,
        request: &'a Value,
    ) -> BoxFuture<'a, Result<Value, DownstreamError>> {
        Box::pin(async move {
            *self.submits.lock().unwrap() += 1;
            let text = toolledger::json::canonical_string(request)
                .map_err(|_| DownstreamError::Rejected("not canonical".into()))?;
            let sha = sha256_hex(text.as_bytes());
            let mut receipts = self.receipts.lock().unwrap();
            let receipt = receipts
                .entry(
                    request["status_ref"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
                .or_insert_with(|| {
                    json!({
                        "receipt_id": format!("parcel_{}", &sha[..16]),
                        "scope_digest": scope_digest(scope),
                        "status_ref": request["status_ref"],
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
        Box::pin(async move { Ok(self.receipts.lock().unwrap().get(status_ref).cloned()) })
    }
}

/// A writer into a shared buffer, for the test's log subscriber.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn lines(&self) -> Vec<Value> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON log line"))
            .collect()
    }
}

fn call(key: &str, address: &str) -> DeferredCall {
    DeferredCall {
        new_intent: false,
        principal: "alice".into(),
        tool: "ship_parcel".into(),
        key: key.into(),
        arguments: json!({"address": address}),
        approval_id: None,
        provider: ProviderContext::mcp(key),
    }
}

async fn accept(rt: &Runtime, key: &str, address: &str) -> (i64, i64) {
    match rt.accept(&call(key, address)).await.unwrap() {
        Accepted::New {
            operation_id,
            event_id,
            ..
        } => (operation_id, event_id),
        other => panic!("{other:?}"),
    }
}

fn counter(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && l.contains(label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The whole scenario on `store`, under a log subscriber and a metrics recorder of its own
/// (both local to this thread, which runs every future of the scenario).
fn scenario(store: Store) {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let failures = Arc::new(Mutex::new(Vec::new()));
    let seen = failures.clone();
    tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, || {
            rt.block_on(async {
                let clock = ManualClock::new(T0);
                PrincipalStore::new(store.clone())
                    .add("alice", "acme", &[], &[], false)
                    .await
                    .unwrap();
                let closed = Arc::new(AtomicBool::new(false));
                let carrier = Arc::new(Carrier::default());
                let registry = Registry::new()
                    .register(
                        Arc::new(ShipParcel {
                            closed: closed.clone(),
                        }),
                        carrier.clone(),
                    )
                    .allow_profile(ProviderProfile::mcp());
                let runtime = Runtime::new(store.clone(), Arc::new(clock.clone()), registry);
                let worker = Worker::new(runtime.clone(), "shipper")
                    .batch(10)
                    .poll_interval(Duration::from_millis(10))
                    .on_failure(move |f| {
                        seen.lock()
                            .unwrap()
                            .push((f.event_id, f.operation, f.code()))
                    });

                // Two parcels accepted; one pass delivers both.
                accept(&runtime, "parcel-1", "1 Main St").await;
                accept(&runtime, "parcel-2", "2 Main St").await;
                let s = worker.run_once().await.unwrap();
                assert_eq!((s.ready, s.delivered, s.skipped), (2, 2, 0), "{s:?}");
                assert!(s.refused.is_empty());
                assert_eq!(
                    db::scalar(
                        &store,
                        "SELECT count(*) FROM operations WHERE state = 'succeeded'"
                    )
                    .await,
                    2
                );
                assert_eq!(db::count(&store, "local_receipts").await, 2);

                // The depot closes after the third is accepted: the worker's recheck refuses
                // it before the carrier is called, and says so with event, operation and code.
                let (op3, ev3) = accept(&runtime, "parcel-3", "3 Secret Lane").await;
                closed.store(true, Ordering::SeqCst);
                let submits = *carrier.submits.lock().unwrap();
                let s = worker.run_once().await.unwrap();
                assert_eq!(s.refused.get("business_state_changed"), Some(&1), "{s:?}");
                assert_eq!(*carrier.submits.lock().unwrap(), submits);
                assert_eq!(
                    *failures.lock().unwrap(),
                    vec![(Some(ev3), Some(op3), "business_state_changed".to_string())]
                );
                let lines = logs.lines();
                let logged = lines
                    .iter()
                    .find(|l| l["target"] == "toolledger::worker" && l["message"] == "event failed")
                    .unwrap_or_else(|| panic!("no failure log line: {lines:?}"));
                assert_eq!(logged["event_id"], ev3);
                assert_eq!(logged["operation"], op3);
                assert_eq!(logged["code"], "business_state_changed");
                assert_eq!(logged["owner"], "shipper");
                assert_eq!(logged["level"], "WARN");
                let all = lines.iter().map(Value::to_string).collect::<String>();
                assert!(
                    !all.contains("Secret Lane"),
                    "a log line names the arguments"
                );

                // The depot reopens; the refused event is ready again once its lease expired:
                // another worker's claim took it meanwhile, and its stale heartbeat is fenced.
                closed.store(false, Ordering::SeqCst);
                clock.set(T0 + 30);
                let stale = match runtime.claim(ev3, "crashed").await.unwrap() {
                    ClaimOutcome::Claimed(l) => l,
                    other => panic!("{other:?}"),
                };
                clock.set(T0 + 60);
                let scraped = metrics.clone();
                let run = worker
                    .run_until(async {
                        // Until the pass that delivered it has been counted.
                        loop {
                            let m = scraped.render();
                            let label = "outcome=\"delivered\"";
                            if counter(&m, "toolledger_worker_events_total", label) == 3.0 {
                                break "done";
                            }
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    })
                    .await;
                assert_eq!(run.stopped_by, "done");
                assert!(run.passes >= 1);
                assert_eq!(run.totals.delivered, 1, "{:?}", run.totals);
                assert!(matches!(
                    runtime.renew(&stale).await,
                    Err(RuntimeError::Fenced(_))
                ));
                assert_eq!(
                    db::scalar(
                        &store,
                        "SELECT count(*) FROM outbox WHERE state = 'delivered'"
                    )
                    .await,
                    3
                );
            })
        })
    });
    let m = metrics.render();
    assert_eq!(
        counter(&m, "toolledger_fencing_rejections_total", "step=\"renew\""),
        1.0,
        "{m}"
    );
    assert_eq!(
        counter(
            &m,
            "toolledger_worker_events_total",
            "outcome=\"delivered\""
        ),
        3.0,
        "{m}"
    );
    assert_eq!(
        counter(&m, "toolledger_worker_events_total", "outcome=\"refused\""),
        1.0,
        "{m}"
    );
    assert!(
        counter(&m, "toolledger_worker_passes_total", "") >= 3.0,
        "{m}"
    );
}

/// The scenario on a ledger of `db`, run on a blocking thread outside the test's runtime.
async fn a_programs_own_tool_is_delivered_by_the_worker(db: &Harness) {
    let store = db
        .open_with(Some("worker-test"), (&[], &[]), false)
        .unwrap();
    if let Err(e) = tokio::task::spawn_blocking(move || scenario(store)).await {
        std::panic::resume_unwind(e.into_panic());
    }
}
both_drivers!(a_programs_own_tool_is_delivered_by_the_worker);
