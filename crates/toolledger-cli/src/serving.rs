//! What the servers (`serve`, `proxy`, `console`) share: their flag groups, the guarded ledger
//! they open with the library's builder (`toolledger_mcp::LedgerGuardBuilder`), and the HTTP
//! listener of the library's front (`toolledger_mcp::front::HttpFront`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use toolledger::authz::PrincipalStore;
use toolledger::clock::{ManualClock, SharedClock, SystemClock};
use toolledger::store::Store;
use toolledger_cli::common::StoreConfig;
use toolledger_cli::exit::{Failure, Outcome};
use toolledger_cli::telemetry::{init_logs, metrics_routes, LogFormat};
use toolledger_mcp::front::{health_routes, HttpFront};
use toolledger_mcp::wire::http::{
    self as wire_http, AllowedHosts, ConnectionLimits, InFlightLimit,
};
use toolledger_mcp::{
    GuardedServer, KeyError, KeyMaterial, LedgerGuard, LedgerGuardBuilder, OpenError,
};

/// Runs an MCP server (`serve`, `proxy`) to its end on a two-thread runtime: the logs in
/// `log_format` and, when the `OTEL_*` variables ask for it, the trace exporter are set up
/// first, and the spans still queued are sent (within a bound) before it returns. A pending
/// stdin read cannot be cancelled, so the runtime does not wait for it.
pub fn run_server(
    log_format: LogFormat,
    server: impl std::future::Future<Output = Result<(), Failure>>,
) -> Result<Outcome, Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|_| Failure::code("RUNTIME_ERROR"))?;
    init_logs(log_format);
    let traces = toolledger_cli::telemetry::init_traces();
    let result = runtime.block_on(server);
    drop(traces);
    runtime.shutdown_background();
    result.map(|()| Outcome::Pass)
}

/// How an MCP server (`serve`, `proxy`) is reached: stdio, or streamable HTTP with its front
/// and, beside `/mcp`, the operator console.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// Serve streamable HTTP at `http://ADDR/mcp` with bearer tokens instead of stdio.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    #[command(flatten)]
    pub front: HttpFrontArgs,
    /// With --http: also serve the operator console at `http://ADDR/console`.
    #[arg(long, requires = "http")]
    pub console: bool,
    /// Mark the console's cookies `Secure` (sent back over HTTPS only): for a console behind a
    /// TLS-terminating proxy. A request carrying `X-Forwarded-Proto: https` gets them anyway.
    #[arg(long, requires = "console", env = "TOOLLEDGER_SECURE_COOKIES")]
    pub secure_cookies: bool,
}

/// The `--clock-epoch` flag of the servers.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClockArgs {
    /// Pin the clock to this Unix second (testing aid; production uses wall time).
    #[arg(long, value_name = "SECS")]
    pub clock_epoch: Option<i64>,
}

impl ClockArgs {
    /// The clock this flag sets: pinned, or wall time.
    pub(crate) fn clock(&self) -> SharedClock {
        match self.clock_epoch {
            Some(epoch) => Arc::new(ManualClock::new(epoch)),
            None => Arc::new(SystemClock),
        }
    }
}

/// The `--allowed-host` flag of the HTTP servers (`serve`, `proxy`, `console`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct AllowedHostArgs {
    /// With --http: a host name the server is reached by, besides the loopback names
    /// (repeatable; `HOST` for any port, `HOST:PORT` for one). Requests whose Host header,
    /// or Origin header when present, names another host are refused with 403.
    #[arg(
        long = "allowed-host",
        value_name = "HOST",
        env = "TOOLLEDGER_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
}

/// The front of the MCP HTTP servers (`serve`, `proxy`): the hosts they answer for and how
/// many requests they handle at once.
#[derive(clap::Args, Debug, Clone)]
pub struct HttpFrontArgs {
    #[command(flatten)]
    pub hosts: AllowedHostArgs,
    /// Requests handled at once. Over --http one more is answered 503 `unavailable` with
    /// `Retry-After: 1` at once (nothing ran: retry it under the same operation id); on stdio
    /// no further message is read until one is answered.
    #[arg(
        long,
        value_name = "N",
        env = "TOOLLEDGER_MAX_IN_FLIGHT",
        default_value_t = DEFAULT_MAX_IN_FLIGHT,
        value_parser = clap::value_parser!(u32).range(1..=1_000_000)
    )]
    pub max_in_flight: u32,
    /// With --http: requests of one principal handled at once, so that one caller cannot take
    /// every slot of --max-in-flight; one more is answered 503 `unavailable` with
    /// `Retry-After: 1` before anything runs.
    #[arg(
        long,
        value_name = "N",
        env = "TOOLLEDGER_MAX_IN_FLIGHT_PER_PRINCIPAL",
        default_value_t = wire_http::DEFAULT_MAX_IN_FLIGHT_PER_PRINCIPAL as u32,
        value_parser = clap::value_parser!(u32).range(1..=1_000_000)
    )]
    pub max_in_flight_per_principal: u32,
    #[command(flatten)]
    pub listener: ListenerArgs,
}

/// The limits of an HTTP listener (`serve --http`, `proxy --http`, `console`, and the
/// timeouts of `--metrics`), the same for every route it serves.
#[derive(clap::Args, Debug, Clone)]
pub struct ListenerArgs {
    /// With --http: connections open at once; while that many are open the next one waits to
    /// be accepted until one closes.
    #[arg(
        long,
        value_name = "N",
        env = "TOOLLEDGER_MAX_CONNECTIONS",
        default_value_t = DEFAULT_MAX_CONNECTIONS,
        value_parser = clap::value_parser!(u32).range(1..=1_000_000)
    )]
    pub max_connections: u32,
    /// Seconds a connection may take to send a complete request head — from when it opens,
    /// and again while it idles between requests; then it is closed.
    #[arg(
        long,
        value_name = "SECS",
        env = "TOOLLEDGER_HEADER_TIMEOUT",
        default_value_t = wire_http::DEFAULT_HEADER_TIMEOUT.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub header_timeout: u64,
    /// With --http: seconds a request body may take to arrive in full after its head, on
    /// every route (`/mcp`, the console's forms); a slower one is answered 408
    /// `body_timeout` and its connection closed.
    #[arg(
        long,
        value_name = "SECS",
        env = "TOOLLEDGER_BODY_TIMEOUT",
        default_value_t = wire_http::DEFAULT_BODY_TIMEOUT.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub body_timeout: u64,
}

impl ListenerArgs {
    /// The limits these flags set.
    pub(crate) fn limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: self.max_connections as usize,
            header_timeout: Duration::from_secs(self.header_timeout),
            body_timeout: Duration::from_secs(self.body_timeout),
        }
    }
}

/// `--max-connections` by default.
pub const DEFAULT_MAX_CONNECTIONS: u32 = wire_http::DEFAULT_MAX_CONNECTIONS as u32;

/// `--max-in-flight` by default.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = toolledger_mcp::front::DEFAULT_MAX_IN_FLIGHT as u32;

impl HttpFrontArgs {
    /// The library's front with these flags' settings.
    pub(crate) fn resolve(&self) -> Result<HttpFront, Failure> {
        Ok(HttpFront {
            hosts: self.hosts.resolve()?,
            max_in_flight: self.max_in_flight as usize,
            max_in_flight_per_principal: self.max_in_flight_per_principal as usize,
            limits: self.listener.limits(),
            // The reference tools and the proxy send no notifications during a call.
            direct_tool_calls: true,
        })
    }
}

impl AllowedHostArgs {
    /// The `--allowed-host` list. An empty entry (a trailing comma in the variable) names
    /// nothing and is skipped.
    pub(crate) fn resolve(&self) -> Result<AllowedHosts, Failure> {
        AllowedHosts::with_hosts(self.allowed_hosts.iter().filter(|h| !h.trim().is_empty()))
            .map_err(|e| Failure::explained("ALLOWED_HOST_INVALID", e.to_string()))
    }
}

/// The guarded ledger over `store` (opened as `config` says), built by `builder` with the
/// ledger's keys: loaded from the environment, else the key file beside a SQLite ledger, and
/// bound to it — keys other than the ones it was written with refuse to start. With
/// PostgreSQL the servers of a deployment share their keys through the environment; the key
/// file beside a SQLite database has no counterpart there.
pub(crate) fn open_ledger(
    config: &StoreConfig,
    store: Store,
    builder: LedgerGuardBuilder,
) -> Result<LedgerGuard, Failure> {
    let keys = KeyMaterial::load(config.sqlite_path())
        .map_err(|e| Failure::explained("KEY_ERROR", e.to_string()))?;
    builder.store(store).keys(keys).open().map_err(|e| match e {
        OpenError::Keys(KeyError::Store) => Failure::code("DATABASE_IO_ERROR"),
        OpenError::Keys(other) => Failure::explained("KEY_MISMATCH", other.to_string()),
        _ => Failure::code("KEY_ERROR"),
    })
}

/// The principal a stdio session of `command` (`serve`, `proxy`) acts for, decided before
/// anything else starts (the proxy's upstream included): `--principal NAME`, which must be an
/// active principal of the ledger; without it, the local principal
/// ([`crate::cmd_principal::local_principal`], created on first use) when `local_by_default`,
/// else `PRINCIPAL_REQUIRED`.
pub(crate) async fn stdio_principal(
    command: &str,
    named: Option<&str>,
    local_by_default: bool,
    principals: &PrincipalStore,
) -> Result<String, Failure> {
    let Some(principal) = named else {
        if local_by_default {
            return crate::cmd_principal::local_principal(principals, command).await;
        }
        return Err(Failure::explained(
            "PRINCIPAL_REQUIRED",
            format!(
                "`{command}` on stdio acts for one principal: pass --principal NAME (or use \
                 --http, where each caller presents a bearer token)"
            ),
        ));
    };
    // A principal that does not exist (or was deactivated) would be denied every call:
    // refuse to start instead. It is still re-read on every call.
    if !matches!(principals.resolve(principal).await, Ok(Some(_))) {
        return Err(Failure::explained(
            "PRINCIPAL_NOT_FOUND",
            format!(
                "`{command} --principal` names no active principal of this ledger; add it with \
                 `toolledger principal add`"
            ),
        ));
    }
    Ok(principal.to_string())
}

/// Binds `addr`, says where `path` is served (`{"listening": URL}` on stderr), and serves
/// `app` with `front`'s listener until SIGTERM or SIGINT.
pub(crate) async fn listen(
    addr: SocketAddr,
    path: &str,
    app: axum::Router,
    front: &HttpFront,
) -> Result<(), Failure> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|_| Failure::code("BIND_ERROR"))?;
    let local = listener
        .local_addr()
        .map_err(|_| Failure::code("BIND_ERROR"))?;
    eprintln!(
        "{}",
        serde_json::json!({"listening": format!("http://{local}{path}")})
    );
    front
        .serve(listener, app, toolledger_mcp::server::shutdown_signal())
        .await
        .map_err(|_| Failure::code("SERVE_ERROR"))
}

/// Serves `server` (built over `ledger` for bearer-token callers) behind `front` at
/// `http://ADDR/mcp` (bearer principals, Host/Origin rules, strict bodies), with `/healthz`,
/// `/readyz` and `/metrics`, and the operator console's pages when given, until SIGTERM or
/// SIGINT.
pub(crate) async fn serve_http<S: Send + Sync + 'static>(
    addr: SocketAddr,
    server: GuardedServer<S>,
    ledger: &LedgerGuard,
    front: &HttpFront,
    console: Option<axum::Router>,
) -> Result<(), Failure> {
    let store = ledger.store().clone();
    let clock = ledger.guard().clock().clone();
    // `/mcp` inside the library's front; `/metrics` shares its in-flight limit and Host and
    // Origin rules; the health endpoints answer outside them. The listener bounds every
    // route's request head and body alike.
    let in_flight = InFlightLimit::new(front.max_in_flight);
    let app = front
        .router_within(server, ledger.principals().clone(), &in_flight)
        .merge(health_routes(store.clone()))
        .merge(metrics_routes(store, clock, &in_flight, &front.hosts));
    // The console's pages carry their own Host/Origin guard and sessions; the bearer layer
    // of `/mcp` is not theirs.
    let app = match console {
        Some(pages) => app.merge(pages),
        None => app,
    };
    listen(addr, "/mcp", app, front).await
}
