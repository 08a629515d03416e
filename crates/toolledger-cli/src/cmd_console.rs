//! `toolledger console --http ADDR [store flags]`: the operator console on its own, at
//! `http://ADDR/console` (see `toolledger_console` for the pages and their rules).
//!
//! The console lists the ledger's unsure operations, shows an operation's timeline, and lets
//! a principal holding the role `operator` settle one: it signs in with a bearer token
//! (`toolledger principal token add`) and resolves through the same code path as
//! `toolledger resolve`. Requests must name a loopback host or an `--allowed-host` (Host, and
//! Origin when present); `/healthz` and `/readyz` answer any host. Sessions live in memory
//! and end when the process stops. The same pages are served by `serve --http --console`
//! and `proxy --http --console`.

use std::net::SocketAddr;
use std::sync::Arc;

use toolledger::authz::PrincipalStore;
use toolledger::clock::SharedClock;
use toolledger::runtime::{Resolution, Runtime};
use toolledger_cli::common::{StoreArgs, StoreConfig};
use toolledger_cli::exit::{Failure, Outcome};
use toolledger_cli::telemetry::{init_logs, LogFormat};
use toolledger_console::{ConfirmedResult, Console, Evidence, Held, Resolver};
use toolledger_mcp::front::{health_routes, HttpFront};

use crate::serving::{listen, AllowedHostArgs, ClockArgs, ListenerArgs};

/// Options of `toolledger console`.
#[derive(clap::Args, Debug, Clone)]
pub struct ConsoleArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Serve the console at `http://ADDR/console`.
    #[arg(long, value_name = "ADDR")]
    pub http: SocketAddr,
    #[command(flatten)]
    pub hosts: AllowedHostArgs,
    #[command(flatten)]
    pub listener: ListenerArgs,
    /// Mark the console's cookies `Secure` (sent back over HTTPS only): for a console behind a
    /// TLS-terminating proxy. A request carrying `X-Forwarded-Proto: https` gets them anyway.
    #[arg(long, env = "TOOLLEDGER_SECURE_COOKIES")]
    pub secure_cookies: bool,
    #[command(flatten)]
    pub clock: ClockArgs,
    /// Log line format on stderr (the level comes from RUST_LOG, default info).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// The console's resolver: [`crate::cmd_resolve::settle_confirmed`] with `rt`.
pub(crate) fn resolver(rt: Runtime) -> Resolver {
    Arc::new(
        move |resolution: Resolution, confirmed: Option<ConfirmedResult>| {
            let rt = rt.clone();
            Box::pin(async move {
                crate::cmd_resolve::settle_confirmed(rt, &resolution, confirmed.as_ref()).await
            })
        },
    )
}

/// What the console says of an operation the proxy recorded, whose upstream it cannot ask.
const PROXIED: &str = "Recorded by `toolledger proxy`: this console cannot ask the upstream. \
     The proxy's status query (`get_operation_status` through the proxy) asks it and records \
     what it holds; without the proxy, settle the operation here or with `toolledger resolve` \
     on evidence you checked yourself.";

/// What the console says of a deferred operation of a tool this process does not serve.
const NOT_SERVED: &str = "This console does not serve this operation's tool, so it cannot ask \
     its downstream: the server that serves the tool asks it (`toolledger resolve` there asks \
     it before settling).";

/// The console's downstream evidence: [`Runtime::downstream_evidence`] with `rt` (whose
/// registry knows the deferred tools and their downstreams). An operation of a tool `rt` does
/// not serve — every proxied one, whose upstream only the proxy reaches — is not asked: the
/// page says how it is settled instead.
pub(crate) fn evidence(rt: Runtime) -> Evidence {
    Arc::new(move |operator: String, status_ref: String| {
        let rt = rt.clone();
        Box::pin(async move {
            if let Some(record) = rt.inspect(&status_ref).await? {
                if rt.registry().tool(&record.scope.tool).is_none() {
                    let note = if toolledger_proxy::offline::is_proxied(&record) {
                        PROXIED
                    } else {
                        NOT_SERVED
                    };
                    return Ok(Held::NotHere(note.to_string()));
                }
            }
            rt.downstream_evidence(&operator, &status_ref)
                .await
                .map(Held::Asked)
        })
    })
}

/// The console over `store` for the servers' `--console`: resolving with `rt`.
pub(crate) fn console(principals: &PrincipalStore, clock: SharedClock, rt: Runtime) -> Console {
    Console::new(
        principals.store().clone(),
        principals.clone(),
        clock,
        resolver(rt),
    )
}

/// Runs the console until SIGTERM or SIGINT.
pub fn run(args: ConsoleArgs, config: StoreConfig) -> Result<Outcome, Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|_| Failure::code("RUNTIME_ERROR"))?;
    runtime
        .block_on(serve(args, config))
        .map(|()| Outcome::Pass)
}

async fn serve(args: ConsoleArgs, config: StoreConfig) -> Result<(), Failure> {
    init_logs(args.log_format);
    // The library's front with the console's hosts and listener limits (it serves no `/mcp`).
    let front = HttpFront {
        hosts: args.hosts.resolve()?,
        limits: args.listener.limits(),
        ..HttpFront::default()
    };
    let store = config.open()?;
    let clock = args.clock.clock();
    let rt = crate::cmd_dispatch::runtime(&config, &store, clock.clone())?;
    let principals = PrincipalStore::new(store.clone()).with_clock(clock.clone());
    let app = console(&principals, clock, rt.clone())
        .with_evidence(evidence(rt))
        .with_secure_cookies(args.secure_cookies)
        .router(front.hosts.clone())
        .route(
            "/",
            axum::routing::get(|| async { axum::response::Redirect::to("/console") }),
        )
        .merge(health_routes(store));
    listen(args.http, "/console", app, &front).await
}
