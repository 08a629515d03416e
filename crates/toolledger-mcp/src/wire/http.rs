//! The HTTP side of the strict wire entry: the steps a request to a streamable HTTP MCP
//! endpoint passes before rmcp's `StreamableHttpService` (or the direct path) answers it. Each
//! takes the rest of the request's way as a function, so the front chains them in one future
//! per request; [`guard_host_and_origin`] is also axum middleware, for other routers:
//!
//! - [`guard_host_and_origin`]: the `Host` header must name an allowed host
//!   ([`AllowedHosts`]: loopback, plus the operator's own names), and a present `Origin`
//!   header must name one too; otherwise 403 before anything else runs (DNS rebinding and
//!   cross-site requests from a browser never reach authentication or a tool).
//! - `strict_body`: a JSON POST body is read (at most
//!   [`MAX_MESSAGE_BYTES`]; more is 413) and checked by
//!   [`check_message`]; a refused body is answered 400 with the JSON-RPC
//!   error as `application/json`, and an accepted one is passed on unchanged (a `tools/call`
//!   with the message it was read as, for the front's direct path).
//! - `end_session`: `DELETE` of a legacy session answers 204 No Content once the session
//!   is closed (rmcp answers 202, which clients read as a failed termination) and 404 for a
//!   session the server does not know.
//! - `limit_in_flight`: at most the `InFlight` limit of requests are handled at once; one more
//!   is answered 503 `unavailable` with `Retry-After: 1` at once, without being read, so a
//!   server under more load than it can serve keeps its memory bounded and answers every
//!   request (a refused call did nothing: the client retries it under the same operation id).
//!   An admitted request runs in a task of its own holding its permit until its work ends,
//!   whether or not its client still waits; [`InFlightLimit`] puts other routes under the
//!   same limit.
//! - `limit_per_principal`: inside the bearer layer, at most the `PerPrincipal` limit
//!   requests of one principal at once, so one caller cannot take every slot of the whole
//!   limit; one more is answered the same 503.
//! - [`serve`]: the listener: at most so many connections open at once (the next one waits in
//!   the kernel's accept queue until one closes), and a connection that sends no complete
//!   request head in time — new, slow, or idle between requests — is closed; every request
//!   body of every route must arrive within the listener's body deadline and be at most
//!   [`MAX_MESSAGE_BYTES`] ([`read_body`] tells a reader which failed), so a slow or idle client
//!   holds neither a connection nor a request slot for long, whichever route it calls.

use std::future::Future;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, Method, StatusCode};
use rmcp::transport::streamable_http_server::SessionManager;

use super::{check_message, WireError, MAX_MESSAGE_BYTES};

/// Moves the `Idempotency-Key` header of a `tools/call` into its `_meta` under
/// [`crate::carriers::META_HEADER_KEY`]. `Ok(true)` when the message changed (the header, or
/// a `params.idempotencyKey` the wire entry moved, is in its `_meta`); a header that is not
/// one visible ASCII value is 400 with the JSON-RPC error -32602.
#[allow(clippy::result_large_err)]
fn carry_header_key(
    headers: &HeaderMap,
    call: &mut rmcp::model::JsonRpcRequest<rmcp::model::ClientRequest>,
) -> Result<bool, Response> {
    use rmcp::model::GetMeta;
    if !matches!(call.request, rmcp::model::ClientRequest::CallToolRequest(_)) {
        return Ok(false);
    }
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(value) = values.next() else {
        return Ok(call
            .request
            .get_meta()
            .contains_key(crate::carriers::META_PARAMS_KEY));
    };
    let text = value
        .to_str()
        .ok()
        .filter(|_| values.next().is_none())
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let Some(text) = text else {
        let error = WireError {
            code: super::INVALID_PARAMS,
            id: Some(call.id.clone()),
            message: "the Idempotency-Key header is one visible ASCII value".into(),
            rule: None,
        };
        return Err(jsonrpc_error(StatusCode::BAD_REQUEST, &error));
    };
    call.request.get_meta_mut().insert(
        crate::carriers::META_HEADER_KEY.into(),
        serde_json::Value::String(text.to_string()),
    );
    Ok(true)
}

/// The hosts an HTTP endpoint answers for: the names a `Host` header may carry, and the hosts
/// an `Origin` may name. Loopback names are always allowed; an operator adds the names the
/// server is reached by (`HOST` matches any port, `HOST:PORT` that port only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedHosts {
    entries: Vec<Authority>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Authority {
    host: String,
    port: Option<u16>,
}

/// An `--allowed-host` entry that is not a host name, an IP address or `HOST:PORT`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a host name or HOST:PORT: {0:?}")]
pub struct BadHost(pub String);

/// The loopback names every endpoint answers for.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

impl AllowedHosts {
    /// Only the loopback names ([`LOOPBACK_HOSTS`], any port).
    pub fn loopback() -> Self {
        AllowedHosts {
            entries: LOOPBACK_HOSTS
                .iter()
                .map(|h| Authority {
                    host: (*h).to_string(),
                    port: None,
                })
                .collect(),
        }
    }

    /// The loopback names and `extra` (each `HOST` or `HOST:PORT`; IPv6 in brackets with a
    /// port, `[::1]:8080`).
    pub fn with_hosts<S: AsRef<str>>(extra: impl IntoIterator<Item = S>) -> Result<Self, BadHost> {
        let mut hosts = AllowedHosts::loopback();
        for entry in extra {
            let entry = entry.as_ref().trim();
            let parsed = parse_entry(entry).ok_or_else(|| BadHost(entry.to_string()))?;
            if !hosts.entries.contains(&parsed) {
                hosts.entries.push(parsed);
            }
        }
        Ok(hosts)
    }

    /// The entries as `HOST` / `HOST:PORT` strings (the form rmcp's own host check takes).
    pub fn entries(&self) -> Vec<String> {
        self.entries
            .iter()
            .map(|a| {
                let host = if a.host.contains(':') {
                    format!("[{}]", a.host)
                } else {
                    a.host.clone()
                };
                match a.port {
                    Some(port) => format!("{host}:{port}"),
                    None => host,
                }
            })
            .collect()
    }

    /// Whether a `Host` header value names an allowed host (and port, where the entry has one).
    pub fn allows_host(&self, value: &str) -> bool {
        let Ok(authority) = value.parse::<http::uri::Authority>() else {
            return false;
        };
        let host = normalize(authority.host());
        let port = authority.port_u16();
        self.entries
            .iter()
            .any(|a| a.host == host && a.port.is_none_or(|p| Some(p) == port))
    }

    /// Whether an `Origin` header value names an allowed host. The port is not compared: a
    /// page served by an allowed host on another port (a local inspector, a console) may
    /// call the endpoint. `null` and anything that is not `scheme://host[:port]` are foreign.
    pub fn allows_origin(&self, value: &str) -> bool {
        let Ok(uri) = value.parse::<http::Uri>() else {
            return false;
        };
        let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
            return false;
        };
        if !matches!(scheme, "http" | "https") || uri.path() != "/" && !uri.path().is_empty() {
            return false;
        }
        let host = normalize(authority.host());
        self.entries.iter().any(|a| a.host == host)
    }
}

fn normalize(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

fn parse_entry(entry: &str) -> Option<Authority> {
    if entry.is_empty() || entry.contains(['/', '@', '?', '#', ' ']) {
        return None;
    }
    // A bare IPv6 address (`::1`) has colons but no port.
    if entry.parse::<std::net::Ipv6Addr>().is_ok() {
        return Some(Authority {
            host: entry.to_ascii_lowercase(),
            port: None,
        });
    }
    let authority = entry.parse::<http::uri::Authority>().ok()?;
    let host = normalize(authority.host());
    if host.is_empty() {
        return None;
    }
    Some(Authority {
        host,
        port: authority.port_u16(),
    })
}

fn json_error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({"error": {"code": code, "message": message}}).to_string(),
    )
        .into_response()
}

/// Middleware: 403 unless the `Host` header names an allowed host and any `Origin` header
/// names one too (see [`AllowedHosts`]). A request without `Origin` (every non-browser
/// client) is judged by its `Host` alone.
pub async fn guard_host_and_origin(
    State(hosts): State<Arc<AllowedHosts>>,
    request: Request,
    next: Next,
) -> Response {
    host_and_origin(&hosts, request, |r| next.run(r)).await
}

/// [`guard_host_and_origin`] with `next` the rest of the request's way.
pub(crate) async fn host_and_origin<F: Future<Output = Response>>(
    hosts: &AllowedHosts,
    request: Request,
    next: impl FnOnce(Request) -> F,
) -> Response {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    if !host.is_some_and(|h| hosts.allows_host(&h)) {
        return json_error(
            StatusCode::FORBIDDEN,
            "host_not_allowed",
            "the Host header does not name a host this server answers for",
        );
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        if !origin.to_str().is_ok_and(|o| hosts.allows_origin(o)) {
            return json_error(
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                "the Origin header does not name a host this server answers for",
            );
        }
    }
    next(request).await
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
        })
}

fn jsonrpc_error(status: StatusCode, error: &WireError) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        error.to_bytes(),
    )
        .into_response()
}

/// How long a request body may take to arrive in full ([`strict_body`]'s state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BodyTimeout(pub std::time::Duration);

/// `BodyTimeout` by default.
pub const DEFAULT_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl Default for BodyTimeout {
    fn default() -> Self {
        BodyTimeout(DEFAULT_BODY_TIMEOUT)
    }
}

/// Checks a JSON POST body with the strict wire entry before the MCP service
/// reads it. The body must arrive in full within the [`BodyTimeout`] (408 `body_timeout`
/// otherwise, and the connection is closed: a slow body cannot hold a request slot). Refused:
/// 400 with the JSON-RPC error body (-32700, -32600 or -32602 with the request's id); over
/// [`MAX_MESSAGE_BYTES`]: 413 with the -32700 `too_large` body. Other requests (GET, DELETE,
/// another content type) pass untouched; the service answers them.
pub(crate) async fn strict_body<F: Future<Output = Response>>(
    deadline: BodyTimeout,
    request: Request,
    next: impl FnOnce(Request) -> F,
) -> Response {
    if request.method() != Method::POST || !is_json(request.headers()) {
        return next(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let bytes = match read_body_within(body, MAX_MESSAGE_BYTES, deadline.0).await {
        Ok(bytes) => bytes,
        Err(refusal) => return refusal,
    };
    let mut bytes = bytes;
    match check_message(&bytes) {
        Ok(rmcp::model::JsonRpcMessage::Request(mut call))
            if matches!(call.request, rmcp::model::ClientRequest::CallToolRequest(_)) =>
        {
            // The operation id's carriers rmcp does not keep (the `Idempotency-Key` header,
            // `params.idempotencyKey`) travel in the request's `_meta`: the body rmcp reads is
            // the message with them moved there.
            match carry_header_key(&parts.headers, &mut call) {
                Err(refusal) => return refusal,
                Ok(moved) => {
                    if moved {
                        if let Ok(body) = serde_json::to_vec(&call) {
                            bytes = body.into();
                        }
                    }
                }
            }
            parts.extensions.insert(super::direct::CheckedCall(call));
        }
        Ok(_) => {}
        Err(error) => {
            tracing::debug!(
                code = error.code,
                rule = error.rule,
                "refused an incoming message"
            );
            return jsonrpc_error(StatusCode::BAD_REQUEST, &error);
        }
    }
    next(Request::from_parts(parts, Body::from(bytes))).await
}

/// For `DELETE` of a legacy session (`Mcp-Session-Id`): 404 when `sessions` does
/// not know the session, 204 No Content when the service closed it (rmcp's 202 is mapped),
/// anything else the service answered as it is.
pub(crate) async fn end_session<M: SessionManager, F: Future<Output = Response>>(
    sessions: &M,
    request: Request,
    next: impl FnOnce(Request) -> F,
) -> Response {
    if request.method() != Method::DELETE {
        return next(request).await;
    }
    let known = match request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
    {
        Some(id) => sessions.has_session(&Arc::from(id)).await.unwrap_or(false),
        None => return next(request).await,
    };
    let response = next(request).await;
    if response.status() != StatusCode::ACCEPTED {
        return response;
    }
    if known {
        StatusCode::NO_CONTENT.into_response()
    } else {
        json_error(
            StatusCode::NOT_FOUND,
            "session_not_found",
            "no such session",
        )
    }
}

/// Which principal opened each legacy session ([`bind_sessions`]' state).
pub(crate) struct SessionOwners<M> {
    sessions: Arc<M>,
    owners: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

/// Sessions remembered before the ones the session manager no longer knows are forgotten.
const SESSION_OWNERS_PRUNE_AT: usize = 10_000;

impl<M: SessionManager> SessionOwners<M> {
    /// The owners of the sessions `sessions` holds.
    pub(crate) fn new(sessions: Arc<M>) -> Self {
        SessionOwners {
            sessions,
            owners: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    fn owner(&self, id: &str) -> Option<String> {
        let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        owners.get(id).cloned()
    }

    async fn remember(&self, id: String, owner: String) {
        let stale: Vec<String> = {
            let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
            if owners.len() < SESSION_OWNERS_PRUNE_AT {
                Vec::new()
            } else {
                owners.keys().cloned().collect()
            }
        };
        let mut gone = Vec::new();
        for known in stale {
            if !self
                .sessions
                .has_session(&Arc::from(known.as_str()))
                .await
                .unwrap_or(false)
            {
                gone.push(known);
            }
        }
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        for g in gone {
            owners.remove(&g);
        }
        owners.insert(id, owner);
    }

    /// The session manager whose sessions these are.
    pub(crate) fn sessions(&self) -> &M {
        &self.sessions
    }

    fn forget(&self, id: &str) {
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        owners.remove(id);
    }
}

/// Inside the bearer step: a legacy session (`Mcp-Session-Id`) belongs to the
/// principal whose request opened it. Another principal presenting its id — to call in it, or
/// to `DELETE` it — is answered 404 `session_not_found`, as for a session that does not exist.
pub(crate) async fn bind_sessions<M: SessionManager, F: Future<Output = Response>>(
    owners: &SessionOwners<M>,
    request: Request,
    next: impl FnOnce(Request) -> F,
) -> Response {
    let caller = request
        .extensions()
        .get::<crate::caller::AuthenticatedName>()
        .map(|n| n.0.clone());
    let presented = request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let deleting = request.method() == Method::DELETE;
    if let Some(id) = &presented {
        if let Some(owner) = owners.owner(id) {
            if caller.as_deref() != Some(owner.as_str()) {
                return json_error(
                    StatusCode::NOT_FOUND,
                    "session_not_found",
                    "no such session",
                );
            }
        }
    }
    let response = next(request).await;
    match (&presented, caller) {
        (None, Some(caller)) => {
            let opened = response
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            if let Some(id) = opened {
                owners.remember(id, caller).await;
            }
        }
        (Some(id), _) if deleting && response.status().is_success() => owners.forget(id),
        _ => {}
    }
    response
}

/// How many requests an HTTP endpoint handles at once ([`limit_in_flight`]).
#[derive(Debug)]
pub(crate) struct InFlight {
    permits: Arc<tokio::sync::Semaphore>,
}

impl InFlight {
    /// At most `limit` requests at once (at least 1).
    pub(crate) fn new(limit: usize) -> Self {
        InFlight {
            permits: Arc::new(tokio::sync::Semaphore::new(limit.max(1))),
        }
    }
}

/// Set on a request by [`limit_in_flight`]: cancelled when the client stops waiting for the
/// answer (its connection closed), while the request's work goes on to its end.
#[derive(Clone, Debug)]
pub(crate) struct ClientGone(pub(crate) tokio_util::sync::CancellationToken);

/// Handles the request while fewer than the [`InFlight`] limit of others are handled;
/// otherwise answers 503 `{"error": {"code": "unavailable", …}}` with `Retry-After: 1` at
/// once, without reading the body, and counts it in
/// `toolledger_http_requests_shed_total`.
///
/// The request is handled in a task of its own, which holds the permit until the response's
/// head is ready (for a JSON response, the whole call): a client that goes away meanwhile
/// stops waiting ([`ClientGone`] is cancelled) but does not give the permit back while its
/// work still runs, so the limit bounds the work, not only the connections waiting for it.
pub(crate) async fn limit_in_flight<F>(
    limit: &InFlight,
    mut request: Request,
    next: impl FnOnce(Request) -> F,
) -> Response
where
    F: Future<Output = Response> + Send + 'static,
{
    let Ok(permit) = limit.permits.clone().try_acquire_owned() else {
        metrics::counter!("toolledger_http_requests_shed_total").increment(1);
        return shed(
            "the server is handling as many requests as it can; retry the same request later",
        );
    };
    let gone = tokio_util::sync::CancellationToken::new();
    request.extensions_mut().insert(ClientGone(gone.clone()));
    let waiting = gone.drop_guard();
    let work = next(request);
    let handled = tokio::spawn(async move {
        let response = work.await;
        drop(permit);
        response
    })
    .await;
    waiting.disarm();
    handled.unwrap_or_else(|_| {
        tracing::error!("an HTTP request's handler ended without an answer");
        json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the request ended without an answer",
        )
    })
}

/// A limit on the requests handled at once, shared by every route it guards: the front's
/// `/mcp` ([`crate::front::HttpFront::router_within`]) and the routes given to
/// [`InFlightLimit::guard`], such as a server's `/metrics`.
#[derive(Clone, Debug)]
pub struct InFlightLimit(Arc<InFlight>);

impl InFlightLimit {
    /// At most `limit` requests at once (at least 1).
    pub fn new(limit: usize) -> Self {
        InFlightLimit(Arc::new(InFlight::new(limit)))
    }

    pub(crate) fn in_flight(&self) -> &InFlight {
        &self.0
    }

    /// `router`'s routes within this limit (one more request is answered 503 `unavailable`
    /// with `Retry-After: 1`, unread; the permit lives as long as the request's work) and,
    /// inside it, the `Host` and `Origin` rules of `hosts` (403 otherwise), as `/mcp` is.
    pub fn guard(&self, router: axum::Router, hosts: &AllowedHosts) -> axum::Router {
        let limit = self.0.clone();
        let hosts = Arc::new(hosts.clone());
        router.layer(axum::middleware::from_fn(
            move |request: Request, next: Next| {
                let (limit, hosts) = (limit.clone(), hosts.clone());
                async move {
                    limit_in_flight(&limit, request, move |r| async move {
                        host_and_origin(&hosts, r, |r| next.run(r)).await
                    })
                    .await
                }
            },
        ))
    }
}

/// How many requests one principal may have handled at once ([`limit_per_principal`]), beside
/// the endpoint's whole [`InFlight`] limit, so that one caller cannot take every slot.
#[derive(Debug)]
pub(crate) struct PerPrincipal {
    limit: usize,
    held: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

/// `PerPrincipal`'s limit by default.
pub const DEFAULT_MAX_IN_FLIGHT_PER_PRINCIPAL: usize = 256;

/// One request's share of its principal's [`PerPrincipal`] limit, given back when dropped.
struct Share {
    owner: Arc<PerPrincipal>,
    name: String,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self.owner.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.name);
            }
        }
    }
}

impl PerPrincipal {
    /// At most `limit` requests of one principal at once (at least 1).
    pub(crate) fn new(limit: usize) -> Self {
        PerPrincipal {
            limit: limit.max(1),
            held: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    fn try_take(self: &Arc<Self>, name: &str) -> Option<Share> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.entry(name.to_string()).or_insert(0);
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(Share {
            owner: self.clone(),
            name: name.to_string(),
        })
    }
}

/// The 503 `unavailable` answer with `Retry-After: 1` of a request refused before it ran.
fn shed(message: &str) -> Response {
    let mut response = json_error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    response
}

/// Inside the bearer step: handles the request while its principal has fewer
/// than the [`PerPrincipal`] limit of others handled; otherwise answers 503 `unavailable` with
/// `Retry-After: 1` before the body is read, counted in
/// `toolledger_http_requests_shed_per_principal_total`. Requests without an authenticated
/// principal pass.
pub(crate) async fn limit_per_principal<F: Future<Output = Response>>(
    limit: &Arc<PerPrincipal>,
    request: Request,
    next: impl FnOnce(Request) -> F,
) -> Response {
    let Some(name) = request
        .extensions()
        .get::<crate::caller::AuthenticatedName>()
        .map(|n| n.0.clone())
    else {
        return next(request).await;
    };
    let Some(_share) = limit.try_take(&name) else {
        metrics::counter!("toolledger_http_requests_shed_per_principal_total").increment(1);
        return shed(
            "this caller has as many requests in flight as one caller may; retry the same \
             request later",
        );
    };
    next(request).await
}

/// The limits of one HTTP listener ([`serve`]), the same for every route it serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once; while that many are open the next one waits in the kernel's
    /// accept queue until one closes.
    pub max_connections: usize,
    /// How long a connection may take to send a complete request head: from when it opens,
    /// and again from when it finished a response on a kept-alive connection (the idle wait
    /// counts). A connection that takes longer is closed.
    pub header_timeout: std::time::Duration,
    /// How long a request body may take to arrive in full, counted from its head, on every
    /// route; past it, reading the body fails ([`BodyFailure::TimedOut`]) and the connection
    /// is closed after the answer.
    pub body_timeout: std::time::Duration,
}

/// [`ConnectionLimits::max_connections`] by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// [`ConnectionLimits::header_timeout`] by default.
pub const DEFAULT_HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long [`serve`] lets open connections finish after it was told to stop.
pub(crate) const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
        }
    }
}

/// Serves `app` over HTTP/1.1 on `listener` within `limits` until `shutdown` completes, then
/// lets open connections finish their requests (at most `DRAIN_TIMEOUT`).
///
/// Each connection is hyper's HTTP/1 connection with a timer: one that does not send a
/// complete request head within [`ConnectionLimits::header_timeout`] — a new connection that
/// sends nothing, or sends its head slowly, or a kept-alive one idle between requests — is
/// closed (counted in `toolledger_http_connections_timed_out_total`). At most
/// [`ConnectionLimits::max_connections`] are open at once. Every request body, whatever its
/// route, is read within [`ConnectionLimits::body_timeout`] of its head and is at most
/// [`MAX_MESSAGE_BYTES`] ([`read_body`] tells which failed); a connection whose body ran out of
/// time is closed after its answer.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let body_timeout = limits.body_timeout;
    let app = app.layer(axum::middleware::from_fn(
        move |request: Request, next: Next| bound_body(body_timeout, request, next),
    ));
    let service = hyper_util::service::TowerToHyperService::new(app);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let connection =
            graceful.watch(builder.serve_connection(TokioIo::new(stream), service.clone()));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                if e.is_timeout() {
                    metrics::counter!("toolledger_http_connections_timed_out_total").increment(1);
                    tracing::debug!("closed a connection that sent no request head in time");
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await;
    Ok(())
}

/// [`serve`]'s bound on every request body: at most [`MAX_MESSAGE_BYTES`], in full within
/// `deadline` of the head; `Connection: close` on the answer to a request whose body ran out
/// of time.
async fn bound_body(deadline: std::time::Duration, request: Request, next: Next) -> Response {
    let expired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let request = request.map(|body| {
        Body::new(http_body_util::Limited::new(
            DeadlineBody {
                inner: body,
                deadline: Box::pin(tokio::time::sleep(deadline)),
                expired: expired.clone(),
            },
            MAX_MESSAGE_BYTES,
        ))
    });
    let mut response = next.run(request).await;
    if expired.load(std::sync::atomic::Ordering::Relaxed) {
        response
            .headers_mut()
            .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    response
}

/// The error of a request body that did not arrive in full within the listener's
/// [`ConnectionLimits::body_timeout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub struct BodyTimedOut;

/// A body that fails with [`BodyTimedOut`] once its deadline passes.
struct DeadlineBody {
    inner: Body,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    expired: Arc<std::sync::atomic::AtomicBool>,
}

impl axum::body::HttpBody for DeadlineBody {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.expired
                .store(true, std::sync::atomic::Ordering::Relaxed);
            return Poll::Ready(Some(Err(BodyTimedOut.into())));
        }
        std::pin::Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Why a request body could not be read in full ([`read_body`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFailure {
    /// Longer than the limit (the reader's, or the listener's [`MAX_MESSAGE_BYTES`]).
    TooLarge,
    /// Not in full within the listener's [`ConnectionLimits::body_timeout`].
    TimedOut,
    /// The connection failed while it was read.
    Unreadable,
}

/// Whether `error` or one of its sources is a `T`.
fn caused_by<T: std::error::Error + 'static>(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(error);
    while let Some(e) = at {
        if e.is::<T>() {
            return true;
        }
        at = e.source();
    }
    false
}

/// The whole of `body`, at most `limit` bytes, or why not. Under [`serve`] a body also ends at
/// the listener's deadline ([`BodyFailure::TimedOut`]).
pub async fn read_body(body: Body, limit: usize) -> Result<axum::body::Bytes, BodyFailure> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        if caused_by::<http_body_util::LengthLimitError>(&e) {
            BodyFailure::TooLarge
        } else if caused_by::<BodyTimedOut>(&e) {
            BodyFailure::TimedOut
        } else {
            BodyFailure::Unreadable
        }
    })
}

/// The whole body of `request`, at most `limit` bytes, read within `deadline`: `Err` is the
/// response to send instead — 413 with the JSON-RPC `too_large` error over the limit, 408
/// `body_timeout` past the deadline (or the listener's; counted in
/// `toolledger_http_body_timeouts_total`), 400 `body_unreadable` when the connection failed.
pub(crate) async fn read_body_within(
    body: Body,
    limit: usize,
    deadline: std::time::Duration,
) -> Result<axum::body::Bytes, Response> {
    let failure = match tokio::time::timeout(deadline, read_body(body, limit)).await {
        Ok(Ok(bytes)) => return Ok(bytes),
        Ok(Err(failure)) => failure,
        Err(_) => BodyFailure::TimedOut,
    };
    Err(match failure {
        BodyFailure::TooLarge => {
            jsonrpc_error(StatusCode::PAYLOAD_TOO_LARGE, &WireError::too_large())
        }
        BodyFailure::Unreadable => json_error(
            StatusCode::BAD_REQUEST,
            "body_unreadable",
            "the request body could not be read",
        ),
        BodyFailure::TimedOut => {
            metrics::counter!("toolledger_http_body_timeouts_total").increment(1);
            let mut response = json_error(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                "the request body did not arrive in time",
            );
            response
                .headers_mut()
                .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
            response
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_origins() {
        let hosts = AllowedHosts::with_hosts(["mcp.example.com", "Other.Example:8443"]).unwrap();
        for ok in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:1",
            "[::1]:80",
            "mcp.example.com",
            "MCP.example.com.:443",
            "other.example:8443",
        ] {
            assert!(hosts.allows_host(ok), "{ok}");
        }
        for foreign in [
            "evil.example",
            "other.example:8444",
            "other.example",
            "",
            "a b",
        ] {
            assert!(!hosts.allows_host(foreign), "{foreign}");
        }
        for ok in [
            "http://localhost:6274",
            "https://mcp.example.com",
            "http://[::1]:3000",
            "https://other.example",
        ] {
            assert!(hosts.allows_origin(ok), "{ok}");
        }
        for foreign in [
            "null",
            "https://evil.example",
            "https://localhost.evil.example",
            "file://localhost",
            "localhost",
            "http://localhost/path",
        ] {
            assert!(!hosts.allows_origin(foreign), "{foreign}");
        }
        for bad in ["", "http://x", "a/b", "user@host"] {
            assert!(AllowedHosts::with_hosts([bad]).is_err(), "{bad}");
        }
        assert_eq!(
            AllowedHosts::with_hosts(["::1", "h:1"]).unwrap().entries(),
            ["localhost", "127.0.0.1", "[::1]", "h:1"]
        );
    }
}
