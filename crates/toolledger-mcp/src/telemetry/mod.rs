//! Logs, metrics and traces of a long-running server, as the `toolledger` binary sets them up
//! (feature `telemetry`; [`redact_urls`] always).
//!
//! Logs ([`init_logs`]): `tracing` events to stderr, filtered by `RUST_LOG` (default `info`),
//! as text or as one JSON object per line ([`LogFormat`]), on `tracing-subscriber`'s `fmt`
//! layer with a faster field formatter and timer of the same output ([`log_line`]) and a
//! buffered stderr writer that scrubs secrets ([`log_sink`]): `info` lines are buffered for a
//! few milliseconds and written together, `warn` and `error` lines at once. rmcp's events are
//! capped at `warn` (its debug events carry whole messages, its info events are per-request
//! bookkeeping over HTTP) unless `RUST_LOG` names `rmcp`. stdout is left alone: on stdio it is
//! the MCP channel.
//!
//! Metrics ([`metrics_routes`], [`start_metrics`]): Prometheus text from the process's
//! `metrics` recorder, the ledger's gauges read from the store at a scrape.
//!
//! Traces ([`init_traces`]): the OpenTelemetry SDK and its OTLP exporter, configured by the
//! standard `OTEL_*` variables.

#[cfg(feature = "telemetry")]
pub mod log_line;
#[cfg(feature = "telemetry")]
pub mod log_sink;
#[cfg(feature = "telemetry")]
mod metrics;
#[cfg(feature = "telemetry")]
mod otlp;

#[cfg(feature = "telemetry")]
pub use metrics::{
    metrics_routes, recorder, render, spawn_metrics_server, start_metrics, BATCH_BUCKETS,
    LATENCY_BUCKETS, LEDGER_GAUGES_EVERY, METRICS_MAX_CONNECTIONS, SERIES,
};
#[cfg(feature = "telemetry")]
pub use otlp::{
    init_traces, Traces, METRIC_ENDPOINT_VARS, TRACE_ENDPOINT_VARS, TRACE_FLUSH_TIMEOUT,
};

/// How log lines are written.
#[cfg(feature = "telemetry")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the stderr log subscriber once (later calls do nothing): `RUST_LOG` (default
/// `info`) with rmcp capped at `warn` and the OpenTelemetry SDK's own lines at `warn` unless
/// `RUST_LOG` names them, lines in `format` through [`log_sink::BufferedStderr`].
#[cfg(feature = "telemetry")]
pub fn init_logs(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let spec = std::env::var("RUST_LOG").unwrap_or_default();
    let mut filter = EnvFilter::try_new(&spec)
        .ok()
        .filter(|_| !spec.trim().is_empty())
        .unwrap_or_else(|| EnvFilter::new("info"));
    if !spec.contains("rmcp") {
        // rmcp's debug and trace events carry whole messages (tool arguments, inputResponses),
        // and its info events are a session's bookkeeping (over HTTP three lines per request,
        // one a dump of the client's initialize parameters): kept out unless RUST_LOG names
        // rmcp itself. Its warnings and errors stay.
        if let Ok(directive) = "rmcp=warn".parse() {
            filter = filter.add_directive(directive);
        }
        // The fatal error of an rmcp client transport (an HTTP upstream that cannot be
        // reached) is said again, in the proxy's words, by the proxy's own warning; rmcp's
        // line is its error's debug dump (internal type names, the request's URL).
        if let Ok(directive) = "rmcp::transport::worker=off".parse() {
            filter = filter.add_directive(directive);
        }
    }
    if !spec.contains("opentelemetry") {
        // The OpenTelemetry SDK's own info lines are its set-up's bookkeeping; its warnings
        // and errors (a failed export, spans dropped from a full queue) stay.
        if let Ok(directive) = "opentelemetry=warn".parse() {
            filter = filter.add_directive(directive);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(log_sink::BufferedStderr)
        .with_timer(log_line::LineTime)
        .with_ansi(false)
        // A client that closed our stderr must not make a log line a crash: the subscriber
        // would otherwise report its failed write with `eprintln!`, which panics then.
        .log_internal_errors(false);
    let _ = match format {
        LogFormat::Text => builder.fmt_fields(log_line::LineFields).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// `text` with the user information and query values of every `http://` or `https://` URL in
/// it replaced by `[redacted]` (a token in `?key=…` must not reach a log).
pub fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = ["http://", "https://"]
        .iter()
        .filter_map(|scheme| rest.find(scheme))
        .min()
    {
        out.push_str(&rest[..at]);
        let url_len = rest[at..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ')' | '>' | '<' | ','))
            .unwrap_or(rest.len() - at);
        out.push_str(&redact_url(&rest[at..at + url_len]));
        rest = &rest[at + url_len..];
    }
    out.push_str(rest);
    out
}

fn redact_url(url: &str) -> String {
    let (scheme, after) = url.split_at(url.find("://").map_or(0, |i| i + 3));
    let authority_end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (authority, path) = after.split_at(authority_end);
    let authority = match authority.rfind('@') {
        Some(i) => format!("[redacted]@{}", &authority[i + 1..]),
        None => authority.to_string(),
    };
    let (path, fragment) = match path.find('#') {
        Some(i) => path.split_at(i),
        None => (path, ""),
    };
    let path = match path.split_once('?') {
        Some((p, query)) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) => format!("{k}=[redacted]"),
                    None => pair.to_string(),
                })
                .collect();
            format!("{p}?{}", pairs.join("&"))
        }
        None => path.to_string(),
    };
    let fragment = if fragment.is_empty() {
        ""
    } else {
        "#[redacted]"
    };
    format!("{scheme}{authority}{path}{fragment}")
}
