//! The ledger in front of any MCP server, in any language, without changing it.
//!
//! The proxy is an MCP server to its clients and an MCP client of its upstream (a child
//! process on stdio, or a streamable HTTP endpoint). It lists the upstream's tools plus
//! `get_operation_status`. Each guarded tool gains a required string argument, the operation
//! id (`operation_id` unless configured otherwise; `_meta["io.toolledger/operation_id"]` is
//! accepted too), which is removed before the call goes upstream — unless the upstream
//! declares an argument of that name itself (its own idempotency key), which is then the key
//! and is forwarded unchanged. Tools the upstream marks `readOnlyHint: true` pass through
//! unguarded unless the configuration ([`config`]) says otherwise; a tool's required scopes
//! are checked on every route, passed through or guarded, and a tool the configuration says
//! is guarded is never passed through on the upstream's word (the proxy refuses to start).
//!
//! A guarded call is a deferred operation of the ledger's runtime ([`effect`]):
//!
//! - the intent (scope, arguments, principal) is committed before anything is sent
//!   (transaction A); the same operation id with other arguments is `operation_conflict`;
//! - the forward runs under a claimed lease with a fencing token, and at most once: the
//!   outbox event allows one claim, so a forward that was (or may have been) sent is never
//!   sent again by the proxy on its own;
//! - a definitive upstream answer — a result, or a tool result with `isError: true` — is
//!   stored (transaction C; an error result makes the operation `failed`) and every retry
//!   gets it back as it was, with `_meta["io.toolledger/ledger"]` saying
//!   `{operationId, statusRef, replayed, state}`;
//! - a retry while the forward is in flight is `operation_in_progress`;
//! - a lost answer (the upstream crashed, the connection failed, the call timed out, the proxy
//!   died after sending) leaves the operation `outcome_unknown` with its `status_ref`, settled
//!   by `get_operation_status` (which runs the tool's configured reconcile lookup), or by an
//!   operator (`toolledger resolve`);
//! - the upstream's own JSON-RPC errors go back to the caller unchanged and are never stored
//!   as results (the operation stays `outcome_unknown`: the upstream saw the request);
//! - the caller's principal and the tool's required scopes are re-read at acceptance, before
//!   the forward, at every replay and at every status query.
//!
//! An operation whose intent committed but whose forward was never claimed (the proxy stopped
//! in between) is forwarded by the next retry: nothing was sent for it. An upstream round
//! that answers `input_required` did not act either: the answer goes to a 2026-07-28 client
//! with the proxy's own sealed `requestState` (carrying the upstream's), and the client's
//! continuation is forwarded under the same operation.

#![warn(missing_docs)]

pub mod config;
pub mod effect;
pub mod offline;
pub mod tasks;
pub mod tools;
pub mod upstream;

mod traced_http;

use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::tool::ToolRouter;
use rmcp::model::{CallToolResponse, ErrorData, Tool};
use toolledger::runtime::{
    Deadlines, DeferredTool, PointHook, ProviderProfile, Registry, Runtime, RuntimeConfig,
};
use toolledger_mcp::{call_route, CallerRead, GuardedServer, LedgerGuard, StatusTool, ToolCall};

pub use config::{ConfigError, ProxyConfig, ToolPolicy};
pub use upstream::{
    ChildEnv, ClientRelay, Lifecycle, Upstream, UpstreamError, UpstreamSpec, STRIPPED_ENV,
};

use effect::{ProxiedTool, UpstreamEffect};
use tools::{GuardedForward, Passthrough, ProxyStatus, StatusEntry};

/// Seconds a forward's lease outlasts its call timeout: the lease is renewed while the call
/// runs; after a crash the operation reads as `outcome_unknown` once it has expired.
pub const LEASE_MARGIN_SECONDS: u64 = 30;

/// Why the proxy could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The upstream could not be reached, or did not list its tools.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The configuration does not fit the upstream's tools (the message names the key).
    #[error("{0}")]
    Config(String),
}

/// Checks the configuration against the tools the upstream lists: every reconcile lookup of a
/// guarded tool names a tool the upstream lists and the proxy passes through as read-only (a
/// lookup runs unasked, so it must not act). Settings for tools the upstream does not list
/// and lookups of tools that are not guarded are only warned about.
fn check_against(listed: &[rmcp::model::Tool], config: &ProxyConfig) -> Result<(), BuildError> {
    let by_name: std::collections::HashMap<&str, &rmcp::model::Tool> =
        listed.iter().map(|t| (t.name.as_ref(), t)).collect();
    let policy_of = |name: &str| {
        by_name.get(name).map(|t| {
            let read_only = t
                .annotations
                .as_ref()
                .and_then(|a| a.read_only_hint)
                .unwrap_or(false);
            config.policy(name, read_only)
        })
    };
    for (name, settings) in &config.tools {
        let Some(policy) = policy_of(name) else {
            tracing::warn!(target: "toolledger::proxy", tool = %name,
                "the configuration has settings for a tool the upstream does not list");
            continue;
        };
        let Some(reconcile) = &settings.reconcile else {
            continue;
        };
        if !policy.guarded {
            tracing::warn!(target: "toolledger::proxy", tool = %name,
                "the tool is passed through, so its reconcile lookup is never used");
            continue;
        }
        match policy_of(&reconcile.tool) {
            None => {
                return Err(BuildError::Config(format!(
                    "tools.{name}.reconcile.tool names {}, which the upstream does not list",
                    reconcile.tool
                )))
            }
            Some(p) if p.guarded => {
                return Err(BuildError::Config(format!(
                    "tools.{name}.reconcile.tool names {lookup}, which is guarded: the upstream \
                     does not mark it read-only (readOnlyHint), and a lookup must not act; if it \
                     is read-only, say so with [tools.{lookup}] guarded = false",
                    lookup = reconcile.tool
                )))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// What the proxy serves: the tools, in the upstream's order, then `get_operation_status`.
pub struct Proxy {
    /// Every tool as a route (`ToolRoute::new_dyn`): guarded forwards, passed-through tools
    /// and `get_operation_status`. Serve it with [`Proxy::server`].
    pub router: ToolRouter<()>,
    /// The tools' names in listing order.
    pub order: Vec<String>,
    /// The guarded tools' names.
    pub guarded: Vec<String>,
    /// The tools passed through unguarded.
    pub passed_through: Vec<String>,
}

impl Proxy {
    /// Lists the upstream's tools and builds the proxy's over `ledger` (opened with
    /// [`toolledger_mcp::LedgerGuardBuilder`]): guarded ones (as the configuration and the
    /// upstream's read-only hints say) run through a runtime on the ledger's store and clock,
    /// the others are forwarded as they are; status queries read the ledger through its guard.
    /// `hook`, when given, is awaited at each of the runtime's crash points (tests hold the
    /// process there to kill it). The configuration is checked against the listed tools
    /// first.
    pub async fn build(
        ledger: &LedgerGuard,
        upstream: Arc<Upstream>,
        config: &ProxyConfig,
        hook: Option<PointHook>,
    ) -> Result<Proxy, BuildError> {
        let guard = ledger.guard().clone();
        let (listed, task_required) = upstream.list_tools().await?;
        check_against(&listed, config)?;
        let mut registry = Registry::new().allow_profile(ProviderProfile::mcp());
        let mut plan = Vec::new();
        for tool in listed {
            if tool.name == StatusTool::NAME {
                tracing::warn!(target: "toolledger::proxy", tool = %tool.name,
                    "the upstream's tool has the name of the proxy's status tool; it is not offered");
                continue;
            }
            let read_only = tool
                .annotations
                .as_ref()
                .and_then(|a| a.read_only_hint)
                .unwrap_or(false);
            let mut policy = config.policy(&tool.name, read_only);
            let configured_guarded =
                config.tools.get(tool.name.as_ref()).and_then(|t| t.guarded) == Some(true);
            if configured_guarded && task_required.contains(tool.name.as_ref()) {
                return Err(BuildError::Config(format!(
                    "tools.{name} says guarded = true, but the upstream requires task execution                      for it (execution.taskSupport = \"required\"), which the ledger's forward \
                     cannot do; the proxy does not pass a tool the configuration guards through \
                     unguarded",
                    name = tool.name
                )));
            }
            if policy.guarded && task_required.contains(tool.name.as_ref()) {
                tracing::warn!(target: "toolledger::proxy", tool = %tool.name,
                    "the upstream's tool requires task execution (execution.taskSupport = \"required\"), which the ledger's forward cannot do; it is passed through unguarded");
                policy.guarded = false;
            }
            if policy.guarded {
                let proxied = Arc::new(ProxiedTool::new(&tool, policy));
                let effect = Arc::new(UpstreamEffect::new(upstream.clone(), &proxied));
                registry = registry.register(proxied.clone(), effect.clone());
                plan.push((tool, Some((proxied, effect))));
            } else {
                plan.push((tool, None));
            }
        }
        let mut out = Proxy {
            router: ToolRouter::new(),
            order: Vec::new(),
            guarded: Vec::new(),
            passed_through: Vec::new(),
        };
        let mut entries = Vec::new();
        // One registry for every guarded tool's runtime (a runtime's clone shares it): a copy
        // per tool would make the proxy's memory grow with the square of the upstream's tools.
        let base = Runtime::new(ledger.store().clone(), guard.clock().clone(), registry);
        for (tool, guarded) in plan {
            match guarded {
                Some((proxied, effect)) => {
                    let p = proxied.policy();
                    let mut runtime = base
                        .clone()
                        .with_config(RuntimeConfig {
                            lease_seconds: (p.call_timeout_seconds + LEASE_MARGIN_SECONDS) as i64,
                            max_attempts: 1,
                        })
                        .with_deadlines(Deadlines {
                            authority_ttl: Some(p.authority_ttl_seconds),
                            retention_ttl: Some(p.retention_ttl_seconds),
                        })
                        .with_replan_window(p.replan_window_seconds)
                        .with_forwarder("proxy");
                    if let Some(h) = &hook {
                        runtime = runtime.with_hook(h.clone());
                    }
                    out.guarded.push(proxied.contract().name);
                    let forward = Arc::new(GuardedForward::new(
                        &tool,
                        proxied.clone(),
                        runtime.clone(),
                        guard.sealer().clone(),
                    ));
                    out.add(forward.definition(), CallerRead::NameOnly, move |call| {
                        let forward = forward.clone();
                        async move { forward.run(call).await }
                    });
                    entries.push(StatusEntry {
                        tool: proxied,
                        runtime,
                        effect,
                    });
                }
                None => {
                    let policy = config.policy(&tool.name, true);
                    let timeout = Duration::from_secs(policy.call_timeout_seconds);
                    out.passed_through.push(tool.name.to_string());
                    let passthrough = Arc::new(Passthrough::new(
                        &tool,
                        upstream.clone(),
                        timeout,
                        policy.required_scopes,
                    ));
                    out.add(
                        passthrough.definition(),
                        CallerRead::Resolved,
                        move |call| {
                            let passthrough = passthrough.clone();
                            async move { passthrough.call(call).await }
                        },
                    );
                }
            }
        }
        let status = Arc::new(ProxyStatus::new(guard, entries));
        out.add(StatusTool::tool(), CallerRead::Resolved, move |call| {
            let status = status.clone();
            async move { status.call(call).await }
        });
        Ok(out)
    }

    fn add<F, Fut>(&mut self, definition: Tool, read: CallerRead, handler: F)
    where
        F: Fn(ToolCall) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<CallToolResponse, ErrorData>> + Send + 'static,
    {
        self.order.push(definition.name.to_string());
        self.router.add_route(call_route(definition, read, handler));
    }

    /// The proxy as an rmcp server over `ledger` (whose caller source says who calls: the
    /// configured principal on stdio, bearer tokens over HTTP). The upstream owns its tools'
    /// schemas and judges their arguments, so the routes are not checked against them here.
    pub fn server(self, ledger: &LedgerGuard) -> GuardedServer<()> {
        GuardedServer::new("toolledger-proxy", (), ledger.router_unchecked(self.router))
            .with_order(&self.order)
    }
}

/// The pid of the stdio upstream a `toolledger proxy` process started: its child, read from
/// `/proc` (Linux; `None` elsewhere, and until the child exists). What a script, a demo or a
/// benchmark needs to watch or stop the upstream behind a running proxy.
pub fn upstream_pid(proxy_pid: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let pid = entry.ok()?.file_name().to_str()?.parse::<u32>().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the parenthesised command name come the state, then the parent's pid.
        let i = stat.rfind(')')?;
        let ppid = stat[i + 1..]
            .split_whitespace()
            .nth(1)?
            .parse::<u32>()
            .ok()?;
        (ppid == proxy_pid).then_some(pid)
    })
}
