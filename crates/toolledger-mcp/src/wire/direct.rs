//! A `tools/call` of MCP 2026-07-28 over HTTP, answered in the task that read it.
//!
//! rmcp's streamable HTTP service answers a stateless request by reading its body again (its
//! untagged reading tries every request type before `tools/call`), turning the message into a
//! `serde_json::Value` to compare it with the request's `Mcp-*` headers, and starting a
//! service loop of its own for the one request (a task, channels, a peer, cancellation
//! tokens). [`DirectCalls`] answers the common case without those: a `tools/call` the strict
//! entry already read ([`CheckedCall`]), under MCP 2026-07-28, whose headers are exactly what
//! rmcp accepts without looking further:
//!
//! - `POST`, no `Mcp-Session-Id`;
//! - one `Accept` header listing `application/json` and `text/event-stream`, without
//!   parameters or quotes;
//! - one `MCP-Protocol-Version: 2026-07-28`, and the same version in the request's `_meta`
//!   with every key that version requires there;
//! - one `Mcp-Method: tools/call` and one `Mcp-Name` equal to the tool's name as it is (not
//!   Base64-encoded);
//! - a tool whose input schema promotes no argument to an `Mcp-Param-*` header.
//!
//! Every other request, and every request when [`crate::front::HttpFront::direct_tool_calls`]
//! is off, goes to rmcp's service unchanged, which answers it (or refuses it) as before.
//!
//! The handler is called as rmcp's loop calls it: the request's `_meta` and extensions (with
//! the HTTP request's parts) move into its context, the context's cancellation token is
//! cancelled when the client goes away before the answer, and it runs in a task of its own.
//! The answer is rmcp's: the same JSON-RPC message, status (400 for a header mismatch, an
//! unsupported version or a missing client capability, 404 for an unknown method, else 200)
//! and `Content-Type`.
//!
//! One difference: the context's peer is shared by the calls answered here, and it delivers
//! nothing. Requests to the client are refused under 2026-07-28 anyway (rmcp's rule: a tool
//! answers with an input-required result instead); a notification a handler sends during the
//! call (progress, a log message) is dropped, counted in
//! `toolledger_http_direct_messages_dropped_total` and logged once at `warn`. A server whose
//! tools send notifications turns the direct path off.

use std::sync::OnceLock;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, StatusCode};
use rmcp::model::{
    ClientCapabilities, ClientJsonRpcMessage, ClientRequest, ErrorCode, GetExtensions, GetMeta,
    Implementation, InitializeRequestParams, JsonRpcRequest, ProtocolVersion, RequestMetaObject,
    ServerJsonRpcMessage,
};
use rmcp::service::{RequestContext, RoleServer, RunningService};
use rmcp::transport::Transport;
use rmcp::{ServerHandler, Service};
use tokio_util::sync::CancellationToken;

/// A `tools/call` request the strict entry read from an HTTP body, kept in the request's
/// extensions for [`DirectCalls`] (and removed before rmcp's service sees the request).
#[derive(Clone, Debug)]
pub(crate) struct CheckedCall(pub(crate) JsonRpcRequest<ClientRequest>);

/// The protocol version the direct path serves.
const VERSION: ProtocolVersion = ProtocolVersion::V_2026_07_28;

/// How a `Mcp-Name` (or `Mcp-Param-*`) value marks a Base64-encoded name.
const BASE64_PREFIX: &str = "=?base64?";

/// The key of an input schema's annotation that promotes an argument to a header.
const HEADER_ANNOTATION: &str = "x-mcp-header";

/// Answers eligible `tools/call` requests with `server`'s handler directly (see the module
/// documentation).
pub(crate) struct DirectCalls<S: ServerHandler> {
    server: S,
    /// A service loop that never receives a message: it only gives the calls their peer. It
    /// stops when this is dropped.
    idle: OnceLock<RunningService<RoleServer, S>>,
}

impl<S: ServerHandler + Clone> DirectCalls<S> {
    /// Direct calls of `server` (cloned for each call, as rmcp's service does).
    pub(crate) fn new(server: S) -> Self {
        DirectCalls {
            server,
            idle: OnceLock::new(),
        }
    }

    /// Whether rmcp's service would take `call`, with these request headers, to its
    /// per-request path for MCP 2026-07-28 without refusing it: then [`DirectCalls::answer`]
    /// answers it the same way.
    pub(crate) fn takes(
        &self,
        method: &http::Method,
        headers: &HeaderMap,
        call: &JsonRpcRequest<ClientRequest>,
    ) -> bool {
        let ClientRequest::CallToolRequest(request) = &call.request else {
            return false;
        };
        let name = request.params.name.as_ref();
        let meta = call.request.get_meta();
        method == http::Method::POST
            && !headers.contains_key("mcp-session-id")
            && accepts_json_and_events(headers)
            && sole(headers, "mcp-protocol-version") == Some(VERSION.as_str())
            && sole(headers, "mcp-method") == Some("tools/call")
            && sole(headers, "mcp-name").is_some_and(|n| n == name && !n.starts_with(BASE64_PREFIX))
            && meta.protocol_version().as_ref() == Some(&VERSION)
            && meta.missing_required_keys(&VERSION).is_empty()
            && !self
                .server
                .get_tool(name)
                .is_some_and(|tool| annotates(&tool.input_schema))
    }

    /// Answers `call` (which [`DirectCalls::takes`]) with the server's handler, `parts` in its
    /// context's extensions, as rmcp's per-request path would.
    pub(crate) async fn answer(
        &self,
        parts: http::request::Parts,
        call: JsonRpcRequest<ClientRequest>,
    ) -> Response
    where
        S: Send + Sync + 'static,
    {
        let JsonRpcRequest {
            id, mut request, ..
        } = call;
        let mut meta = RequestMetaObject::new();
        std::mem::swap(&mut meta, request.get_meta_mut());
        let mut extensions = std::mem::take(request.extensions_mut());
        // rmcp's loop gives the handler a child of the request's token; the request's token is
        // cancelled when the client goes away before the answer (the in-flight limit's
        // `ClientGone`, when the request passed it: this future then runs on without a client).
        let request_ct = parts
            .extensions
            .get::<super::http::ClientGone>()
            .map_or_else(CancellationToken::new, |gone| gone.0.child_token());
        extensions.insert(parts);
        let mut context = RequestContext::new(id.clone(), self.peer());
        context.ct = request_ct.child_token();
        context.meta = meta;
        context.extensions = extensions;
        let server = self.server.clone();
        let disconnected = request_ct.clone().drop_guard();
        let handled =
            tokio::spawn(async move { server.handle_request(request, context).await }).await;
        disconnected.disarm();
        request_ct.cancel();
        let message = match handled {
            Ok(Ok(result)) => ServerJsonRpcMessage::response(result, id),
            Ok(Err(error)) => ServerJsonRpcMessage::error(error, Some(id)),
            Err(_) => {
                tracing::error!("a tool call's handler ended without an answer");
                return (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the tool call ended without an answer",
                )
                    .into_response();
            }
        };
        let status = status_of(&message);
        match serde_json::to_vec(&message) {
            Ok(body) => (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                Body::from(body),
            )
                .into_response(),
            Err(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the tool call's answer could not be written",
            )
                .into_response(),
        }
    }

    /// The peer of the calls answered here: that of a service loop started at the first call
    /// (in the runtime) which never receives a message.
    fn peer(&self) -> rmcp::Peer<RoleServer> {
        self.idle
            .get_or_init(|| {
                let info = InitializeRequestParams::new(
                    ClientCapabilities::default(),
                    Implementation::default(),
                )
                .with_protocol_version(VERSION);
                rmcp::service::serve_directly(self.server.clone(), Idle, Some(info))
            })
            .peer()
            .clone()
    }
}

/// The HTTP status rmcp's per-request path gives an answer (its request's `_meta` complete).
fn status_of(message: &ServerJsonRpcMessage) -> StatusCode {
    let ServerJsonRpcMessage::Error(error) = message else {
        return StatusCode::OK;
    };
    let code = error.error.code;
    if code == ErrorCode::UNSUPPORTED_PROTOCOL_VERSION
        || code == ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY
        || code == ErrorCode::HEADER_MISMATCH
    {
        StatusCode::BAD_REQUEST
    } else if code == ErrorCode::METHOD_NOT_FOUND {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::OK
    }
}

/// The one value of header `name`, as text; `None` when it is absent, repeated or not text.
fn sole<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return None;
    }
    first.to_str().ok()
}

/// One plain `Accept` header (no parameters, no quotes) listing both media types a streamable
/// HTTP client must accept.
fn accepts_json_and_events(headers: &HeaderMap) -> bool {
    let Some(accept) = sole(headers, "accept") else {
        return false;
    };
    if accept.contains([';', '"']) {
        return false;
    }
    let listed = |wanted: &str| {
        accept
            .split(',')
            .any(|entry| entry.trim().eq_ignore_ascii_case(wanted))
    };
    listed("application/json") && listed("text/event-stream")
}

/// Whether a JSON schema carries the header annotation anywhere.
fn annotates(schema: &serde_json::Map<String, serde_json::Value>) -> bool {
    fn within(value: &serde_json::Value) -> bool {
        match value {
            serde_json::Value::Object(map) => annotates(map),
            serde_json::Value::Array(items) => items.iter().any(within),
            _ => false,
        }
    }
    schema.contains_key(HEADER_ANNOTATION) || schema.values().any(within)
}

/// The idle loop's transport: it never receives, and drops what the loop sends (a
/// notification a handler sent during a direct call).
struct Idle;

impl Transport<RoleServer> for Idle {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        static WARNED: std::sync::Once = std::sync::Once::new();
        metrics::counter!("toolledger_http_direct_messages_dropped_total").increment(1);
        let kind = match item {
            ServerJsonRpcMessage::Notification(_) => "notification",
            ServerJsonRpcMessage::Request(_) => "request",
            _ => "answer",
        };
        WARNED.call_once(|| {
            tracing::warn!(
                kind,
                "a tool sent a message during a direct HTTP call; it was not delivered (turn \
                 direct tool calls off for tools that send notifications)"
            );
        });
        std::future::ready(Ok(()))
    }

    fn receive(
        &mut self,
    ) -> impl std::future::Future<Output = Option<ClientJsonRpcMessage>> + Send {
        std::future::pending()
    }

    fn close(&mut self) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send {
        std::future::ready(Ok(()))
    }
}
