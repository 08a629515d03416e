//! Logs and metrics of the long-running commands (`serve`, `worker`).
//!
//! Logs: `tracing` events to stderr, filtered by `RUST_LOG` (default `info`), as text or as one
//! JSON object per line (`--log-format json`). They name tools, operation ids, principals and
//! outcomes, never arguments, tokens or keys. stdout is left alone: on stdio it is the MCP
//! channel.
//!
//! Metrics: Prometheus text from the process's `metrics` recorder, at `GET /metrics` on
//! `serve --http` or on the address given by `--metrics ADDR`. Counters and histograms are
//! recorded where things happen (`toolledger_tool_calls_total{tool,outcome}`,
//! `toolledger_tool_call_duration_seconds{tool}`); the ledger's gauges are read from the store
//! at each scrape: `toolledger_operations{state}`,
//! `toolledger_operation_oldest_age_seconds{state}` (how long the oldest operation in that state
//! has been there: an old `outcome_unknown` or `in_progress` is what an operator looks for),
//! `toolledger_outbox_events{state}` and `toolledger_outbox_oldest_age_seconds{state}` (the
//! backlog and its age). A state with no rows reports 0.

use std::net::SocketAddr;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use toolledger::clock::SharedClock;
use toolledger::model::OperationState;
use toolledger::store::Store;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The logging and metrics options of a long-running command.
#[derive(clap::Args, Debug, Clone)]
pub struct TelemetryArgs {
    /// Log line format on stderr (the level comes from RUST_LOG, default info).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Also serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
}

/// Installs the stderr log subscriber once (later calls do nothing).
pub fn init_logs(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        // A client that closed our stderr must not make a log line a crash: the subscriber
        // would otherwise report its failed write with `eprintln!`, which panics then.
        .log_internal_errors(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// The process's Prometheus recorder, installed on first use.
pub fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        // Another recorder installed first (never the case in the binary) keeps its own.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

const OUTBOX_STATES: [&str; 4] = ["pending", "processing", "delivered", "dead"];

/// Reads the ledger's gauges from `store` and renders every series as Prometheus text.
pub async fn render(store: &Store, clock: &SharedClock) -> Result<String, ()> {
    let handle = recorder();
    let now = clock.now();
    let (operations, outbox) = store
        .read(move |tx| toolledger::audit::state_counts(tx, now))
        .await
        .map_err(|_: toolledger::store::StoreError| ())?;
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
    Ok(handle.render())
}

/// `GET /metrics` over `store`, to merge into a server's router (outside any bearer layer).
pub fn metrics_routes(store: Store, clock: SharedClock) -> axum::Router {
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    recorder();
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (store, clock) = (store.clone(), clock.clone());
            async move {
                match render(&store, &clock).await {
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
    )
}

/// Connections the `--metrics` listener keeps open at once (a scraper needs one or two).
pub const METRICS_MAX_CONNECTIONS: usize = 64;

/// Serves `GET /metrics` and `GET /healthz` on `addr` until the process ends (for stdio `serve`,
/// the proxy on stdio and `worker`), at most [`METRICS_MAX_CONNECTIONS`] connections at once,
/// each closed when it sends no request head within `header_timeout`. Returns once listening;
/// a bind failure is `BIND_ERROR`.
pub async fn spawn_metrics_server(
    addr: SocketAddr,
    store: Store,
    clock: SharedClock,
    header_timeout: std::time::Duration,
) -> Result<SocketAddr, &'static str> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|_| "BIND_ERROR")?;
    let local = listener.local_addr().map_err(|_| "BIND_ERROR")?;
    let app = metrics_routes(store, clock).route(
        "/healthz",
        axum::routing::get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
    );
    let limits = toolledger_mcp::wire::http::ConnectionLimits {
        max_connections: METRICS_MAX_CONNECTIONS,
        header_timeout,
    };
    tokio::spawn(toolledger_mcp::wire::http::serve(
        listener,
        app,
        limits,
        std::future::pending(),
    ));
    Ok(local)
}
