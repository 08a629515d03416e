//! [`GuardedServer`]: an rmcp server over a router of guarded routes, and [`ToolCall`], the
//! whole of one `tools/call` as a route's handler sees it.
//!
//! It serves both lifecycles rmcp supports: MCP 2026-07-28 (no `initialize`, per-request
//! metadata, multi-round `input_required`) and the `initialize` lifecycle of 2025-11-25 and
//! older, where a multi-round tool may ask through elicitation ([`ToolCall::peer`]) instead of
//! `input_required`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rmcp::handler::server::tool::{ToolCallContext, ToolRouter};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ElicitRequestParams, ErrorData,
    Implementation, InputRequest, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
    RequestMetaObject, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{RoleServer, ServerHandler};
use serde_json::{Map, Value};

use crate::caller::Caller;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One `tools/call`, with the caller already resolved.
#[derive(Clone, Debug)]
pub struct ToolCall {
    /// The current principal.
    pub caller: Caller,
    /// The tool's arguments (an empty object when absent).
    pub arguments: Map<String, Value>,
    /// `requestState` echoed by a continuation.
    pub request_state: Option<String>,
    /// `inputResponses` of a continuation.
    pub input_responses: Option<BTreeMap<String, Value>>,
    /// The request's `_meta` (progress token, vendor keys), if it carried one.
    pub meta: Option<RequestMetaObject>,
    /// Cancelled when the client cancels the request (`notifications/cancelled`); `None`
    /// when the request came without one.
    pub cancelled: Option<tokio_util::sync::CancellationToken>,
    /// Whether the peer negotiated MCP 2026-07-28 or newer (may receive `input_required`).
    pub multi_round: bool,
    /// The capabilities the client declared (per request in 2026-07-28, at `initialize`
    /// before); an input request the client did not declare must not be sent.
    pub client_capabilities: Option<ClientCapabilities>,
    /// The client, for server-to-client requests (elicitation) under the initialize
    /// lifecycle; `None` when the request came without one.
    pub peer: Option<Peer<RoleServer>>,
}

/// What a [`GuardedServer`] tells of a session its client opens under the `initialize`
/// lifecycle, for a server that relays requests to its client: the proxy passes its
/// upstream's `roots/list`, sampling and elicitation requests on to it.
pub trait ClientEvents: Send + Sync + 'static {
    /// A client finished the `initialize` handshake (its capabilities are in
    /// `peer.peer_info()`).
    fn initialized(&self, peer: Peer<RoleServer>);
    /// The client said its roots changed (`notifications/roots/list_changed`).
    fn roots_list_changed(&self, peer: Peer<RoleServer>);
}

/// An rmcp `ServerHandler` over a [`ToolRouter`] wrapped by [`crate::LedgerGuard::router`] (or
/// [`crate::LedgerGuard::router_unchecked`]): what `toolledger serve`, the proxy and any server whose
/// tools are routes rather than `#[tool_handler]` methods serve. `tools/list` answers in the
/// order given to [`GuardedServer::with_order`] (names not listed follow by name), and
/// `tools/call` of a name the router does not hold is the JSON-RPC error -32602 naming it.
/// Cheap to clone: every HTTP session gets a clone.
pub struct GuardedServer<S> {
    service: Arc<S>,
    router: Arc<ToolRouter<S>>,
    listed: Arc<Vec<Tool>>,
    name: Arc<str>,
    events: Option<Arc<dyn ClientEvents>>,
}

impl<S> Clone for GuardedServer<S> {
    fn clone(&self) -> Self {
        GuardedServer {
            service: self.service.clone(),
            router: self.router.clone(),
            listed: self.listed.clone(),
            name: self.name.clone(),
            events: self.events.clone(),
        }
    }
}

impl<S: Send + Sync + 'static> GuardedServer<S> {
    /// Server `name` serving `router` (already wrapped by the ledger) with `service` as the
    /// routes' `&self`.
    pub fn new(name: impl Into<String>, service: S, router: ToolRouter<S>) -> Self {
        let listed = router.list_all();
        GuardedServer {
            service: Arc::new(service),
            router: Arc::new(router),
            listed: Arc::new(listed),
            name: Arc::from(name.into()),
            events: None,
        }
    }

    /// Tells `events` of each session a client opens under the `initialize` lifecycle, and of
    /// its roots changing.
    pub fn with_client_events(mut self, events: Arc<dyn ClientEvents>) -> Self {
        self.events = Some(events);
        self
    }

    /// Lists the tools named in `order` first, in that order.
    pub fn with_order<N: AsRef<str>>(mut self, order: &[N]) -> Self {
        let mut listed = self.listed.as_ref().clone();
        let ranks: std::collections::HashMap<&str, usize> = order
            .iter()
            .enumerate()
            .rev()
            .map(|(i, n)| (n.as_ref(), i))
            .collect();
        let rank = |t: &Tool| ranks.get(t.name.as_ref()).copied().unwrap_or(order.len());
        listed.sort_by_key(|t| rank(t));
        self.listed = Arc::new(listed);
        self
    }

    /// The tools, in listing order.
    pub fn tools(&self) -> &[Tool] {
        &self.listed
    }

    /// Serves this server on the strict stdio transport ([`crate::wire::stdio::stdio`]) with
    /// at most `max_in_flight` requests unanswered, until the client closes stdin or the
    /// process gets SIGTERM or SIGINT. A signal ends the session as the client's leaving
    /// does: no line is read any more, the calls in flight are answered (rmcp waits a few
    /// seconds for them), then the transport closes and this returns. A client that leaves
    /// before the session starts ends it too.
    pub async fn serve_stdio(self, max_in_flight: usize) {
        let stop = tokio_util::sync::CancellationToken::new();
        let signalled = stop.clone();
        let watcher = tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!(target: "toolledger::serve", "stopping on a signal");
            signalled.cancel();
        });
        let transport = crate::wire::stdio::stdio()
            .with_max_in_flight(max_in_flight)
            .with_stop(stop);
        if let Ok(running) = rmcp::ServiceExt::serve(self, transport).await {
            let _ = running.waiting().await;
        }
        watcher.abort();
    }
}

/// Resolves when the process gets SIGTERM or SIGINT (Ctrl-C elsewhere).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The tenant a stdio caller named by [`crate::LedgerGuardBuilder::from_env`] is created in
/// when the ledger does not have it yet.
pub const STDIO_TENANT: &str = "local";

impl crate::LedgerGuard {
    /// The server of `router` (an application's `#[tool_router]`) with `service` as its
    /// tools' `&self`: every route and `get_operation_status` wrapped by
    /// [`crate::LedgerGuard::router`], named after the running executable.
    pub fn server<S: Send + Sync + 'static>(
        &self,
        service: S,
        router: ToolRouter<S>,
    ) -> Result<GuardedServer<S>, toolledger::Error> {
        let router = self.router(router + crate::status_router())?;
        let name = std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.file_stem()?.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "toolledger".into());
        Ok(GuardedServer::new(name, service, router))
    }

    /// Serves [`crate::LedgerGuard::server`] of `router` on stdio
    /// ([`GuardedServer::serve_stdio`]) until the client leaves or the process is stopped.
    ///
    /// Every call is made by the configured principal ([`crate::LedgerGuardBuilder::principal`],
    /// `TOOLLEDGER_PRINCIPAL` with [`crate::LedgerGuardBuilder::from_env`]): stdio is trusted
    /// configuration, so a principal the ledger does not have yet is created, in the tenant
    /// [`STDIO_TENANT`] with no roles or scopes. A deactivated one is refused before anything
    /// is served (`permission_denied`): re-activating it is an operator's decision.
    pub async fn serve_stdio<S: Send + Sync + 'static>(
        &self,
        service: S,
        router: ToolRouter<S>,
    ) -> Result<(), toolledger::Error> {
        let crate::CallerSource::Configured(name) = self.caller_source() else {
            return Err(toolledger::Error::invalid(
                "a stdio server acts for one configured principal: set TOOLLEDGER_PRINCIPAL \
                 or call LedgerGuardBuilder::principal",
            ));
        };
        let ensured = self.principals().ensure(name, STDIO_TENANT).await?;
        if ensured == toolledger::authz::Ensured::Inactive {
            return Err(toolledger::Error::denied(format!(
                "the principal {name:?} is deactivated in this ledger"
            )));
        }
        let server = self.server(service, router)?;
        server
            .serve_stdio(crate::wire::stdio::DEFAULT_MAX_IN_FLIGHT)
            .await;
        Ok(())
    }
}

impl<S: Send + Sync + 'static> ServerHandler for GuardedServer<S> {
    fn get_info(&self) -> ServerConfig {
        server_info(&self.name)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let span = crate::trace::request("tools/list", None, &context);
        let listed = ListToolsResult::with_all_items(self.listed.to_vec());
        crate::trace::end(&span);
        Ok(listed)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.router.get(name).cloned()
    }

    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        if let Some(events) = &self.events {
            events.initialized(context.peer);
        }
    }

    async fn on_roots_list_changed(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        if let Some(events) = &self.events {
            events.roots_list_changed(context.peer);
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !self.router.has_route(&request.name) {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {}", request.name),
                None,
            ));
        }
        let call = ToolCallContext::new(self.service.as_ref(), request, context);
        self.router.call(call).await
    }
}

fn server_info(name: &str) -> ServerConfig {
    let mut capabilities = ServerCapabilities::builder().enable_tools().build();
    capabilities.experimental = Some(
        [(
            crate::carriers::CAPABILITY.to_string(),
            crate::carriers::capability(),
        )]
        .into_iter()
        .collect(),
    );
    let mut info = ServerConfig::new(capabilities);
    info.server_info = Implementation::new(name.to_string(), env!("CARGO_PKG_VERSION"));
    info.instructions = Some(
        "Side-effecting tools are guarded by a durable ledger: retry with the same \
         operation id to replay; after a lost reply call get_operation_status."
            .into(),
    );
    info
}

/// Whether a client with `capabilities` declared what `request` needs: sampling for
/// `sampling/createMessage`, roots for `roots/list`, and for `elicitation/create` elicitation
/// in the request's mode (an elicitation capability naming neither mode means form).
pub(crate) fn client_accepts(
    capabilities: Option<&ClientCapabilities>,
    request: &InputRequest,
) -> bool {
    let Some(caps) = capabilities else {
        return false;
    };
    match request {
        InputRequest::CreateMessage(_) => caps.sampling.is_some(),
        InputRequest::ListRoots(_) => caps.roots.is_some(),
        InputRequest::Elicitation(e) => {
            let Some(elicitation) = &caps.elicitation else {
                return false;
            };
            let neither = elicitation.form.is_none() && elicitation.url.is_none();
            match &e.params {
                ElicitRequestParams::FormElicitationParams { .. } => {
                    neither || elicitation.form.is_some()
                }
                _ => elicitation.url.is_some(),
            }
        }
        // A kind of input request this server does not know the capability of: never sent.
        _ => false,
    }
}

/// Whether the request in `ctx` was made under MCP 2026-07-28 or newer.
pub(crate) fn is_multi_round(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}
