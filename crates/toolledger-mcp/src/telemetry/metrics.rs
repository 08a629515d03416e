//! Metrics: Prometheus text from the process's `metrics` recorder, at `GET /metrics` of a
//! server's router ([`metrics_routes`]) or on a listener of its own ([`start_metrics`]).
//! Counters and histograms are recorded where things happen
//! (`toolledger_tool_calls_total{tool,outcome}`, `toolledger_tool_call_duration_seconds{tool}`);
//! the ledger's gauges are read from the store at a scrape, at most once per
//! [`LEDGER_GAUGES_EVERY`] (a scrape within it of the last read is answered from that read, so
//! scraping more often costs the ledger nothing): `toolledger_operations{state}`,
//! `toolledger_operation_oldest_age_seconds{state}` (how long the oldest operation in that state
//! has been there: an old `outcome_unknown` or `in_progress` is what an operator looks for),
//! `toolledger_outbox_events{state}` and `toolledger_outbox_oldest_age_seconds{state}` (the
//! backlog and its age). A state with no rows reports 0. Retention: `toolledger_operation_rows
//! {kind}` (`live`, `tombstone`), `toolledger_pruned_rows{kind}` (the ledger's pruning totals),
//! `toolledger_unsettled_past_retention` and its oldest age (what pruning has to keep for an
//! operator); a background pruner counts `toolledger_prune_rows_total{kind}` and
//! `toolledger_prune_passes_total{outcome}`.
//!
//! `/metrics` answers as `/mcp` does: only a `Host` (and `Origin`, when present) naming a
//! loopback host or an allowed host, within the listener's in-flight limit.

use std::net::SocketAddr;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::wire::http::{AllowedHosts, ConnectionLimits, InFlightLimit};
use toolledger::clock::SharedClock;
use toolledger::model::OperationState;
use toolledger::store::Store;

/// Buckets of the latency histograms (seconds): calls answered from the ledger take tens of
/// microseconds, fresh ones a commit (a millisecond or a few), deferred and proxied ones the
/// downstream's time (up to the call timeout).
pub const LATENCY_BUCKETS: [f64; 18] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 60.0,
];

/// Buckets of the commit batch size histogram (jobs or calls per transaction).
pub const BATCH_BUCKETS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// Every series the process exports, with its type and `# HELP` text.
pub const SERIES: [(&str, &str, &str); 23] = [
    ("counter", "toolledger_tool_calls_total", "Tool calls answered, by tool and outcome (fresh, replayed, failed, outcome_unknown, …)."),
    ("histogram", "toolledger_tool_call_duration_seconds", "Time from a tool call's arrival to its answer, by tool."),
    ("counter", "toolledger_fencing_rejections_total", "Writes refused because the outbox event's fencing token moved on, by step."),
    ("counter", "toolledger_http_requests_shed_total", "HTTP requests answered 503 by the in-flight limit before they were read."),
    ("counter", "toolledger_http_requests_shed_per_principal_total", "HTTP requests answered 503 because their principal had its share of the in-flight limit."),
    ("counter", "toolledger_http_body_timeouts_total", "HTTP request bodies that did not arrive within the body timeout (408)."),
    ("counter", "toolledger_http_connections_timed_out_total", "HTTP connections closed because no request head arrived within the header timeout."),
    ("counter", "toolledger_store_connections_recycled_total", "Database connections replaced after a failure, by backend."),
    ("counter", "toolledger_store_overload_total", "Store jobs answered unavailable because their queue was full or they waited too long, by reason."),
    ("gauge", "toolledger_store_queue_depth", "Jobs waiting in a store queue, as last seen, by backend and queue."),
    ("histogram", "toolledger_store_commit_batch_size", "Jobs (SQLite writer) or inline calls (PostgreSQL batch) per transaction, by backend."),
    ("counter", "toolledger_worker_events_total", "Outbox events a worker finished, by outcome."),
    ("counter", "toolledger_worker_passes_total", "Worker passes over the ready outbox events."),
    ("gauge", "toolledger_operations", "Operations in the ledger, by state (read at most every 5 s)."),
    ("gauge", "toolledger_operation_oldest_age_seconds", "Age of the oldest operation in each state (read at most every 5 s)."),
    ("gauge", "toolledger_outbox_events", "Outbox events, by state (read at most every 5 s)."),
    ("gauge", "toolledger_outbox_oldest_age_seconds", "Age of the oldest outbox event in each state (read at most every 5 s)."),
    ("gauge", "toolledger_operation_rows", "Operation rows by kind: live (with their payload) and tombstone (read at most every 5 s)."),
    ("gauge", "toolledger_pruned_rows", "Rows the ledger's pruners removed so far, by kind: compacted, deleted (read at most every 5 s)."),
    ("gauge", "toolledger_unsettled_past_retention", "Unsettled operations past their retention deadline, which pruning keeps for an operator (read at most every 5 s)."),
    ("gauge", "toolledger_unsettled_past_retention_oldest_age_seconds", "Age of the oldest unsettled operation past its retention deadline (read at most every 5 s)."),
    ("counter", "toolledger_prune_rows_total", "Rows this process's background pruner removed, by kind."),
    ("counter", "toolledger_prune_passes_total", "Background prune passes of this process, by outcome (ok, busy, failed)."),
];

/// The process's Prometheus recorder, installed on first use: latencies and batch sizes as
/// histograms with buckets (aggregatable across instances), every series with `# HELP`.
pub fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        use metrics_exporter_prometheus::Matcher;
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("toolledger_store_commit_batch_size".into()),
                    &BATCH_BUCKETS,
                )
            })
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        // Another recorder installed first (never the case in the binary) keeps its own.
        let _ = metrics::set_global_recorder(recorder);
        for (kind, name, help) in SERIES {
            match kind {
                "counter" => metrics::describe_counter!(name, help),
                "gauge" => metrics::describe_gauge!(name, help),
                _ => metrics::describe_histogram!(name, help),
            }
        }
        handle
    })
}

const OUTBOX_STATES: [&str; 4] = ["pending", "processing", "delivered", "dead"];

/// The least time between two reads of the ledger's gauges by `/metrics`.
pub const LEDGER_GAUGES_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads the ledger's gauges from `store` and renders every series as Prometheus text.
pub async fn render(store: &Store, clock: &SharedClock) -> Result<String, ()> {
    read_gauges(store, clock).await?;
    Ok(recorder().render())
}

/// The ledger's gauges of one `/metrics` route, read at most once per
/// [`LEDGER_GAUGES_EVERY`]: concurrent scrapes wait for one read.
struct LedgerGauges {
    store: Store,
    clock: SharedClock,
    last_read: tokio::sync::Mutex<Option<std::time::Instant>>,
}

impl LedgerGauges {
    /// Every series as Prometheus text, the ledger's gauges as last read (read again when
    /// that was [`LEDGER_GAUGES_EVERY`] ago or more, or never).
    async fn render(&self) -> Result<String, ()> {
        let mut last = self.last_read.lock().await;
        if last.is_none_or(|at| at.elapsed() >= LEDGER_GAUGES_EVERY) {
            read_gauges(&self.store, &self.clock).await?;
            *last = Some(std::time::Instant::now());
        }
        drop(last);
        Ok(recorder().render())
    }
}

/// Reads the ledger's gauges from `store` into the process's recorder.
async fn read_gauges(store: &Store, clock: &SharedClock) -> Result<(), ()> {
    recorder();
    let now = clock.now();
    let (operations, outbox) = store
        .read(move |tx| toolledger::audit::state_counts(tx, now))
        .await
        .map_err(|_: toolledger::store::StoreError| ())?;
    let (rows, totals, (kept, oldest)) = store
        .read(move |tx: &mut dyn toolledger::effect::EffectTx| {
            use toolledger::prune;
            Ok::<_, toolledger::Error>((
                prune::row_counts(tx)?,
                prune::totals_in(tx)?,
                prune::kept(tx, now)?,
            ))
        })
        .await
        .map_err(|_| ())?;
    for (kind, n) in [("live", rows.live), ("tombstone", rows.tombstones)] {
        metrics::gauge!("toolledger_operation_rows", "kind" => kind).set(n as f64);
    }
    for (kind, n) in [
        ("compacted", totals.compacted_total),
        ("deleted", totals.deleted_total),
    ] {
        metrics::gauge!("toolledger_pruned_rows", "kind" => kind).set(n as f64);
    }
    metrics::gauge!("toolledger_unsettled_past_retention").set(kept as f64);
    metrics::gauge!("toolledger_unsettled_past_retention_oldest_age_seconds")
        .set(oldest.map_or(0.0, |c| now.saturating_sub(c).max(0) as f64));
    let set = |name: &'static str,
               age: &'static str,
               state: &str,
               rows: &[toolledger::audit::StateCount]| {
        let found = rows.iter().find(|r| r.state == state);
        metrics::gauge!(name, "state" => state.to_string())
            .set(found.map_or(0.0, |r| r.count as f64));
        metrics::gauge!(age, "state" => state.to_string())
            .set(found.map_or(0.0, |r| r.oldest_age_seconds as f64));
    };
    for state in OperationState::ALL {
        set(
            "toolledger_operations",
            "toolledger_operation_oldest_age_seconds",
            state.as_str(),
            &operations,
        );
    }
    for state in OUTBOX_STATES {
        set(
            "toolledger_outbox_events",
            "toolledger_outbox_oldest_age_seconds",
            state,
            &outbox,
        );
    }
    Ok(())
}

/// `GET /metrics` over `store`, to merge into a server's router (outside any bearer layer),
/// within `limit` and the `Host` and `Origin` rules of `hosts` as `/mcp` is
/// ([`InFlightLimit::guard`]: 503 beyond the limit, 403 `host_not_allowed` or
/// `origin_not_allowed` otherwise). The ledger's gauges are read at most once per
/// [`LEDGER_GAUGES_EVERY`].
pub fn metrics_routes(
    store: Store,
    clock: SharedClock,
    limit: &InFlightLimit,
    hosts: &AllowedHosts,
) -> axum::Router {
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    recorder();
    let gauges = std::sync::Arc::new(LedgerGauges {
        store,
        clock,
        last_read: tokio::sync::Mutex::new(None),
    });
    let routes = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let gauges = gauges.clone();
            async move {
                match gauges.render().await {
                    Ok(text) => (
                        StatusCode::OK,
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        text,
                    )
                        .into_response(),
                    Err(()) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
                }
            }
        }),
    );
    limit.guard(routes, hosts)
}

/// Serves the `--metrics` listener ([`spawn_metrics_server`]) when `at` names an address, and
/// logs where.
pub async fn start_metrics(
    at: Option<SocketAddr>,
    store: &Store,
    clock: &SharedClock,
    limits: ConnectionLimits,
) -> Result<(), &'static str> {
    if let Some(at) = at {
        let local = spawn_metrics_server(at, store.clone(), clock.clone(), limits).await?;
        tracing::info!(metrics = %format!("http://{local}/metrics"), "serving metrics");
    }
    Ok(())
}

/// Connections the `--metrics` listener keeps open at once (a scraper needs one or two).
pub const METRICS_MAX_CONNECTIONS: usize = 64;

/// Serves `GET /metrics` and `GET /healthz` on `addr` until the process ends (for stdio `serve`,
/// the proxy on stdio and `worker`), at most [`METRICS_MAX_CONNECTIONS`] connections and as
/// many requests at once, within the head and body deadlines of `limits`. `/metrics` answers
/// the `Host` names of `TOOLLEDGER_ALLOWED_HOSTS` and the loopback names only. Returns once
/// listening; a bind failure is `BIND_ERROR`.
pub async fn spawn_metrics_server(
    addr: SocketAddr,
    store: Store,
    clock: SharedClock,
    limits: ConnectionLimits,
) -> Result<SocketAddr, &'static str> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|_| "BIND_ERROR")?;
    let local = listener.local_addr().map_err(|_| "BIND_ERROR")?;
    // The hosts of TOOLLEDGER_ALLOWED_HOSTS (besides the loopback names) may read.
    let named = std::env::var("TOOLLEDGER_ALLOWED_HOSTS").unwrap_or_default();
    let hosts = AllowedHosts::with_hosts(named.split(',').filter(|h| !h.trim().is_empty()))
        .unwrap_or_else(|_| AllowedHosts::loopback());
    let limit = InFlightLimit::new(METRICS_MAX_CONNECTIONS);
    let app = metrics_routes(store, clock, &limit, &hosts).route(
        "/healthz",
        axum::routing::get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
    );
    let limits = ConnectionLimits {
        max_connections: METRICS_MAX_CONNECTIONS,
        ..limits
    };
    tokio::spawn(crate::wire::http::serve(
        listener,
        app,
        limits,
        std::future::pending(),
    ));
    Ok(local)
}
