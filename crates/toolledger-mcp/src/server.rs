//! A small rmcp server over a set of tools, each told who the caller is.
//!
//! [`LedgerServer`] implements rmcp's `ServerHandler`: `tools/list` lists every [`McpTool`]'s
//! definition, `tools/call` resolves the caller (see [`CallerSource`]) and hands the call to
//! the named tool. It serves both lifecycles rmcp supports: MCP 2026-07-28 (no `initialize`,
//! per-request metadata, multi-round `input_required`) and the `initialize` lifecycle of
//! 2025-11-25 and older, where a multi-round tool may ask through elicitation
//! ([`ToolCall::peer`]) instead of `input_required`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ElicitRequestParams, ErrorData,
    Implementation, InputRequest, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
    RequestMetaObject, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{RoleServer, ServerHandler};
use serde_json::{Map, Value};
use toolledger::authz::PrincipalStore;

use crate::caller::{Caller, CallerSource};
use crate::reply::tool_error;

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

/// A tool a [`LedgerServer`] serves.
pub trait McpTool: Send + Sync + 'static {
    /// The tool's definition for `tools/list` (name, schemas, honest annotations).
    fn definition(&self) -> Tool;

    /// Handles one call. Tool failures are returned in-band, protocol errors (an invalid
    /// `requestState`) as JSON-RPC errors; [`crate::reply::respond`] does both.
    fn call(&self, call: ToolCall) -> BoxFuture<'_, Result<CallToolResponse, ErrorData>>;

    /// Whether the tool reads the caller's principal itself, in the same read of the store as
    /// everything else it checks (a deferred runtime re-reads it in the snapshot it examines
    /// the ledger in, and again in the transaction that records an intent). The server then
    /// does not read the principal store before the call, and [`ToolCall::caller`] carries the
    /// name only ([`Caller::unread`]). `false` unless a tool says so.
    fn reads_principal(&self) -> bool {
        false
    }
}

/// The rmcp server handler.
#[derive(Clone)]
pub struct LedgerServer {
    tools: Arc<Vec<Arc<dyn McpTool>>>,
    /// Each tool's definition, built once: schemas are not rebuilt on every call.
    definitions: Arc<Vec<Tool>>,
    principals: PrincipalStore,
    caller: CallerSource,
    name: String,
}

impl LedgerServer {
    /// A server named `name` over `tools`, taking its caller from `caller`.
    pub fn new(
        name: impl Into<String>,
        tools: Vec<Arc<dyn McpTool>>,
        principals: PrincipalStore,
        caller: CallerSource,
    ) -> Self {
        let definitions = tools.iter().map(|t| t.definition()).collect();
        LedgerServer {
            tools: Arc::new(tools),
            definitions: Arc::new(definitions),
            principals,
            caller,
            name: name.into(),
        }
    }

    /// The same tools with another caller source (e.g. one per transport).
    pub fn with_caller(&self, caller: CallerSource) -> Self {
        LedgerServer {
            caller,
            ..self.clone()
        }
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.definitions.iter().position(|d| d.name == name)
    }

    fn find(&self, name: &str) -> Option<&Arc<dyn McpTool>> {
        self.position(name).and_then(|i| self.tools.get(i))
    }
}

/// Whether a client with `capabilities` declared what `request` needs: sampling for
/// `sampling/createMessage`, roots for `roots/list`, and for `elicitation/create` elicitation
/// in the request's mode (an elicitation capability naming neither mode means form).
pub fn client_accepts(capabilities: Option<&ClientCapabilities>, request: &InputRequest) -> bool {
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
pub fn is_multi_round(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

impl ServerHandler for LedgerServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = Implementation::new(self.name.clone(), env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "Side-effecting tools are guarded by a durable ledger: retry with the same \
             operation id to replay; after a lost reply call get_operation_status."
                .into(),
        );
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.definitions.to_vec()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.position(name)
            .and_then(|i| self.definitions.get(i))
            .cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(tool) = self.find(&request.name).cloned() else {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {}", request.name),
                None,
            ));
        };
        let started = std::time::Instant::now();
        let caller = if tool.reads_principal() {
            self.caller.name(&context).map(Caller::unread)
        } else {
            self.caller.resolve(&self.principals, &context).await
        };
        let caller = match caller {
            Ok(c) => c,
            Err(e) => {
                let response = Ok(CallToolResponse::Complete(tool_error(&e)));
                crate::observe::tool_call(&request.name, None, &response, started.elapsed());
                return response;
            }
        };
        let principal = caller.name.clone();
        let call = ToolCall {
            caller,
            arguments: request.arguments.unwrap_or_default(),
            request_state: request.request_state,
            input_responses: request.input_responses,
            // rmcp hands the request's `_meta` to the context.
            meta: request
                .meta
                .or_else(|| (!context.meta.is_empty()).then(|| context.meta.clone())),
            cancelled: Some(context.ct.clone()),
            multi_round: is_multi_round(&context),
            client_capabilities: context.client_capabilities(),
            peer: Some(context.peer.clone()),
        };
        let response = tool.call(call).await;
        crate::observe::tool_call(
            &request.name,
            Some(&principal),
            &response,
            started.elapsed(),
        );
        response
    }
}
