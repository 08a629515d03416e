//! Logs, metrics and traces of the long-running commands (`serve`, `proxy`, `worker`,
//! `console`): `toolledger-mcp`'s [`telemetry`](toolledger_mcp::telemetry) set-up, which a
//! guarded server of a user's can call too, and the flags that choose it.
//!
//! Logs go to stderr (`--log-format text|json`, the level from `RUST_LOG`), buffered and
//! scrubbed of secrets; they name tools, operation ids, principals and outcomes, never
//! arguments, tokens or keys. Metrics are served at `GET /metrics` (`serve --http`, or
//! `--metrics ADDR`), traces exported over OTLP when the `OTEL_*` variables ask for it.

use std::net::SocketAddr;

pub use toolledger_mcp::telemetry::{init_logs, metrics_routes, start_metrics, LogFormat, Traces};

/// The logging and metrics options of a long-running command.
#[derive(clap::Args, Debug, Clone)]
pub struct TelemetryArgs {
    /// Log line format on stderr (the level comes from RUST_LOG, default info).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Also serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR", env = "TOOLLEDGER_METRICS")]
    pub metrics: Option<SocketAddr>,
}

/// Turns trace export on when the `OTEL_*` variables ask for it, the binary's version as the
/// service's ([`toolledger_mcp::telemetry::init_traces`]).
pub fn init_traces() -> Option<Traces> {
    toolledger_mcp::telemetry::init_traces(env!("CARGO_PKG_VERSION"))
}
