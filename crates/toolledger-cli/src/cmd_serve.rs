//! `toolledger serve`: the reference MCP server, on stdio or streamable HTTP.
//!
//! stdio by default, with the caller named by `--principal` (required: the reference tools
//! check roles and scopes, which a principal made up on the spot would not have) and
//! re-resolved from the principal store on every call. `--http ADDR` serves streamable HTTP at
//! `/mcp`, mapping `Authorization: Bearer` tokens to principals (unknown or missing token → 401
//! before any dispatch). Both MCP 2026-07-28 (no initialize, multi-round) and the older initialize
//! lifecycle are served; in the latter, `create_issue` asks for its body by elicitation (or
//! answers `continuation_unsupported` to a client that declared no form elicitation).
//!
//! Both transports enter through the strict wire entry (`toolledger_mcp::wire`): every line
//! on stdio and every POST body over HTTP is checked with the ledger's strict JSON rules
//! before rmcp reads it, and every refused one is answered with a JSON-RPC error. Over HTTP,
//! `/mcp` answers only requests whose `Host` (and `Origin`, when present) names a loopback
//! host or an `--allowed-host`; `/healthz` and `/readyz` answer any host, so probes that
//! address the server by its pod or instance IP work.
//!
//! With `--console`, the operator console's pages (`toolledger_console`) are served under
//! `/console` beside `/mcp`, under the same Host/Origin rules and with their own sessions.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use toolledger::authz::PrincipalStore;
use toolledger::clock::{ManualClock, SharedClock, SystemClock};
use toolledger::engine::Engine;
use toolledger::store::Store;
pub(crate) use toolledger_mcp::front::health_routes;
use toolledger_mcp::front::HttpFront;
use toolledger_mcp::wire::http::{
    self as wire_http, AllowedHosts, ConnectionLimits, InFlightLimit,
};
use toolledger_mcp::KeyError;
use toolledger_mcp::{CallerSource, Guard, GuardConfig, GuardedServer, KeyMaterial};

use crate::common::{RuntimeStoreArgs, StoreConfig};
use crate::exit::{Failure, Outcome};
use toolledger_cli::telemetry::{init_logs, metrics_routes, start_metrics, TelemetryArgs};
use toolledger_reference::tools::{Fault, Faults, ReferenceTools, ToolEnv};

/// Options of `toolledger serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub store: RuntimeStoreArgs,
    /// Principal the stdio caller acts as (resolved from the principal store on each call).
    #[arg(long)]
    pub principal: Option<String>,
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
    /// Pin the clock to this Unix second (testing aid; production uses wall time).
    #[arg(long, value_name = "SECS")]
    pub clock_epoch: Option<i64>,
    /// Seconds an operation may write (including exact replays) after its first round.
    #[arg(long, default_value_t = 86_400, value_parser = clap::value_parser!(i64).range(1..))]
    pub authority_ttl: i64,
    /// Seconds a stored result is replayed after the operation's first round.
    #[arg(long, default_value_t = 604_800, value_parser = clap::value_parser!(i64).range(1..))]
    pub replay_ttl: i64,
    /// Seconds a sealed requestState stays valid.
    #[arg(long, default_value_t = 3_600, value_parser = clap::value_parser!(i64).range(1..))]
    pub request_state_ttl: i64,
    /// Run `create_issue` with no ledger: the control that shows duplicate effects (only it and
    /// `get_operation_status` are offered).
    #[arg(long)]
    pub unguarded: bool,
    /// Testing aid: crash at a named point (repeatable). Never fires on a replay.
    #[arg(long, value_enum, value_name = "POINT")]
    pub fault: Vec<Fault>,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    #[command(flatten)]
    pub prune: toolledger_cli::prune::PruneFlags,
}

/// Runs the server on the ledger `config` resolves to, until stdin closes (stdio) or the
/// process is stopped (HTTP).
pub fn run(args: ServeArgs, config: StoreConfig) -> Result<Outcome, Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|_| Failure::code("RUNTIME_ERROR"))?;
    init_logs(args.telemetry.log_format);
    let traces = toolledger_cli::telemetry::init_traces();
    let result = runtime.block_on(serve(args, config));
    // The spans still queued are sent (within a bound) before the process ends.
    drop(traces);
    // A pending stdin read cannot be cancelled; do not wait for it.
    runtime.shutdown_background();
    result.map(|()| Outcome::Pass)
}

async fn serve(args: ServeArgs, config: StoreConfig) -> Result<(), Failure> {
    init_logs(args.telemetry.log_format);
    let front = args.front.resolve()?;
    let store = config.open()?;
    let clock: SharedClock = match args.clock_epoch {
        Some(epoch) => Arc::new(ManualClock::new(epoch)),
        None => Arc::new(SystemClock),
    };
    let keys = bound_keys(&config, &store, &clock).await?;
    let faults = Faults::from_list(&args.fault);
    let mut engine = Engine::new(store.clone(), clock.clone());
    if let Some(hook) = faults.engine_hook() {
        engine = engine.with_fault_hook(hook);
    }
    let guard_config = GuardConfig {
        authority_ttl: args.authority_ttl,
        retention_ttl: args.replay_ttl,
        request_state_ttl: args.request_state_ttl,
        shared_key_namespace: false,
    };
    let guard = Guard::new(engine, &keys, guard_config).map_err(|_| Failure::code("KEY_ERROR"))?;
    let runtime = toolledger_reference::refunds::runtime(&store, &config.downstream, clock.clone())
        .map_err(|_| Failure::code("DOWNSTREAM_UNAVAILABLE"))?
        .with_deadlines(toolledger::runtime::Deadlines {
            authority_ttl: Some(args.authority_ttl),
            retention_ttl: Some(args.replay_ttl),
        });
    let principals = PrincipalStore::new(store.clone()).with_clock(clock.clone());
    let stdio_caller = match args.http {
        None => {
            Some(stdio_principal("serve", args.principal.as_deref(), false, &principals).await?)
        }
        Some(_) => None,
    };
    let console = args.console.then(|| {
        crate::cmd_console::console(&principals, clock.clone(), runtime.clone())
            .with_evidence(crate::cmd_console::evidence(runtime.clone()))
            .with_secure_cookies(args.secure_cookies)
    });
    let env = ToolEnv {
        runtime: Some(runtime),
        guard,
        faults,
        unguarded: args.unguarded,
        principals: principals.clone(),
    };
    let tools = ReferenceTools::new(env);
    start_metrics(args.telemetry.metrics, &store, &clock, front.limits)
        .await
        .map_err(Failure::code)?;
    let pruner = args.prune.spawn(&store, &clock);
    let served = match (args.http, stdio_caller) {
        (Some(addr), _) => {
            let console = console.map(|c| c.router(front.hosts.clone()));
            let server = tools
                .server(CallerSource::BearerToken)
                .map_err(|e| Failure::explained("CONFIG_ERROR", e.message))?;
            serve_http(addr, server, principals, front, clock, console).await
        }
        (None, Some(caller)) => {
            let server = tools
                .server(CallerSource::Configured(caller))
                .map_err(|e| Failure::explained("CONFIG_ERROR", e.message))?;
            server.serve_stdio(front.max_in_flight).await;
            Ok(())
        }
        (None, None) => unreachable!("a stdio session's caller is resolved above"),
    };
    pruner.stop().await;
    served
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

/// Binds `addr`, says where `path` is served (`{"listening": URL}` on stderr), and serves
/// `app` within `limits` until SIGTERM or SIGINT.
pub(crate) async fn listen(
    addr: SocketAddr,
    path: &str,
    app: axum::Router,
    limits: ConnectionLimits,
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
    wire_http::serve(
        listener,
        app,
        limits,
        toolledger_mcp::server::shutdown_signal(),
    )
    .await
    .map_err(|_| Failure::code("SERVE_ERROR"))
}

/// The ledger's keys, loaded and bound to the database: keys other than the ones it was
/// written with refuse to start. With PostgreSQL the servers of a deployment share their keys
/// through the environment; the key file beside a SQLite database has no counterpart there.
pub(crate) async fn bound_keys(
    config: &StoreConfig,
    store: &Store,
    clock: &SharedClock,
) -> Result<KeyMaterial, Failure> {
    let keys = KeyMaterial::load(config.sqlite_path())
        .map_err(|e| Failure::explained("KEY_ERROR", e.to_string()))?;
    toolledger_mcp::internal::bind(store, &keys, clock.now())
        .await
        .map_err(|e| match e {
            KeyError::Store => Failure::code("DATABASE_IO_ERROR"),
            other => Failure::explained("KEY_MISMATCH", other.to_string()),
        })?;
    Ok(keys)
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

/// Serves `server` (built for bearer-token callers) over streamable HTTP at
/// `http://ADDR/mcp` (bearer principals, Host/Origin rules, strict bodies), with `/healthz`,
/// `/readyz` and `/metrics`, and the operator console's pages when given, until SIGTERM or
/// SIGINT.
pub(crate) async fn serve_http<S: Send + Sync + 'static>(
    addr: SocketAddr,
    server: GuardedServer<S>,
    principals: PrincipalStore,
    front: HttpFront,
    clock: SharedClock,
    console: Option<axum::Router>,
) -> Result<(), Failure> {
    let store = principals.store().clone();
    // `/mcp` inside the library's front; `/metrics` shares its in-flight limit and Host and
    // Origin rules; the health endpoints answer outside them. The listener bounds every
    // route's request head and body alike.
    let in_flight = InFlightLimit::new(front.max_in_flight);
    let app = front
        .router_within(server, principals, &in_flight)
        .merge(health_routes(store.clone()))
        .merge(metrics_routes(store, clock, &in_flight, &front.hosts));
    // The console's pages carry their own Host/Origin guard and sessions; the bearer layer
    // of `/mcp` is not theirs.
    let app = match console {
        Some(pages) => app.merge(pages),
        None => app,
    };
    listen(addr, "/mcp", app, front.limits).await
}
