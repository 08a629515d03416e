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

use std::sync::Arc;

use toolledger_mcp::{CallerSource, GuardConfig, LedgerGuard};

use crate::common::{RuntimeStoreArgs, StoreConfig};
use crate::exit::{Failure, Outcome};
use crate::serving::{open_ledger, run_server, serve_http, stdio_principal, ClockArgs, ServerArgs};
use toolledger_cli::telemetry::{start_metrics, TelemetryArgs};
use toolledger_reference::downstream::SqliteDownstream;
use toolledger_reference::tools::{Fault, Faults, ReferenceTools, ToolEnv};

/// Options of `toolledger serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub store: RuntimeStoreArgs,
    /// Principal the stdio caller acts as (resolved from the principal store on each call).
    #[arg(long)]
    pub principal: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub clock: ClockArgs,
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
    run_server(args.telemetry.log_format, serve(args, config))
}

async fn serve(args: ServeArgs, config: StoreConfig) -> Result<(), Failure> {
    let front = args.server.front.resolve()?;
    let store = config.open()?;
    let clock = args.clock.clock();
    let faults = Faults::from_list(&args.fault);
    // The payments stand-in `refund_order` delivers to: a runtime of the ledger's.
    let payments = SqliteDownstream::open(&config.downstream, clock.clone())
        .map_err(|_| Failure::code("DOWNSTREAM_UNAVAILABLE"))?;
    let mut builder = LedgerGuard::builder()
        .clock(clock.clone())
        .config(GuardConfig {
            authority_ttl: args.authority_ttl,
            retention_ttl: args.replay_ttl,
            request_state_ttl: args.request_state_ttl,
            shared_key_namespace: false,
        })
        .deferred(toolledger_reference::refunds::registry(Arc::new(payments)));
    if let Some(hook) = faults.engine_hook() {
        builder = builder.fault_hook(hook);
    }
    let ledger = open_ledger(&config, store, builder)?;
    let principals = ledger.principals().clone();
    let stdio_caller = match args.server.http {
        None => {
            Some(stdio_principal("serve", args.principal.as_deref(), false, &principals).await?)
        }
        Some(_) => None,
    };
    let runtime = ledger.runtime().cloned();
    let console = runtime.clone().filter(|_| args.server.console).map(|rt| {
        crate::cmd_console::console(&principals, clock.clone(), rt.clone())
            .with_evidence(crate::cmd_console::evidence(rt))
            .with_secure_cookies(args.server.secure_cookies)
    });
    let env = ToolEnv {
        runtime,
        guard: ledger.guard().clone(),
        faults,
        unguarded: args.unguarded,
        principals: principals.clone(),
    };
    let tools = ReferenceTools::new(env);
    start_metrics(args.telemetry.metrics, ledger.store(), &clock, front.limits)
        .await
        .map_err(Failure::code)?;
    let pruner = args.prune.spawn(ledger.store(), &clock);
    let served = match (args.server.http, stdio_caller) {
        (Some(addr), _) => {
            let console = console.map(|c| c.router(front.hosts.clone()));
            let server = tools
                .server(CallerSource::BearerToken)
                .map_err(|e| Failure::explained("CONFIG_ERROR", e.message))?;
            serve_http(addr, server, &ledger, &front, console).await
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
