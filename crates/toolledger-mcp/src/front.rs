//! The whole HTTP front of a guarded MCP server, in one builder (feature `http`).
//!
//! [`HttpFront::router`] returns `/mcp` — rmcp's streamable HTTP service around your
//! `ServerHandler` — inside every layer the wire guarantees need, outermost first:
//!
//! 1. the in-flight limit ([`HttpFront::max_in_flight`]; one more request is 503 `unavailable`
//!    with `Retry-After: 1`, unread; a request's permit is held until its work ends, even when
//!    its client went away; [`HttpFront::router_within`] shares the limit with other routes);
//! 2. `Host` and `Origin` ([`HttpFront::hosts`]; 403 for any other host: DNS rebinding and
//!    cross-site requests never reach authentication);
//! 3. the bearer token (401 unless it names an active principal; the principal is what
//!    [`crate::Guarded`] and [`crate::CallerSource::BearerToken`] act for);
//! 4. the principal's share of the in-flight limit ([`HttpFront::max_in_flight_per_principal`]);
//! 5. the strict body, read within [`ConnectionLimits::body_timeout`] (400 for a message the ledger's
//!    strict JSON refuses, 408, 413);
//! 6. a legacy session's owner (404 for another principal's session id) and the end of a
//!    session (`DELETE` → 204, or 404 for an unknown one).
//!
//! [`health_routes`] adds `GET /healthz` and `GET /readyz` outside all of them, and
//! [`HttpFront::serve`] runs the listener with [`HttpFront::limits`]: at most so many
//! connections, a connection that sends no complete request head in time is closed, and every
//! request body of every route is read within [`ConnectionLimits::body_timeout`] of its head
//! and is at most [`MAX_MESSAGE_BYTES`] long.
//!
//! ```no_run
//! # async fn run(server: impl rmcp::ServerHandler + Clone + Send + Sync + 'static,
//! #              principals: toolledger::authz::PrincipalStore,
//! #              store: toolledger::store::Store) -> std::io::Result<()> {
//! use toolledger_mcp::front::{health_routes, HttpFront};
//!
//! let front = HttpFront::default(); // loopback hosts only; see the fields for the limits
//! let app = front.router(server, principals).merge(health_routes(store));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! front.serve(listener, app, std::future::pending()).await
//! # }
//! ```

use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use toolledger::authz::PrincipalStore;
use toolledger::store::Store;

use crate::caller::authenticate;
use crate::wire::direct::{CheckedCall, DirectCalls};
use crate::wire::http::{
    bind_sessions, end_session, host_and_origin, limit_in_flight, limit_per_principal, strict_body,
    AllowedHosts, BodyTimeout, ConnectionLimits, InFlightLimit, PerPrincipal, SessionOwners,
    DEFAULT_MAX_IN_FLIGHT_PER_PRINCIPAL,
};
use crate::wire::MAX_MESSAGE_BYTES;

/// [`HttpFront::max_in_flight`] by default: as many requests as the store's queues hold jobs,
/// so a server past its capacity refuses at its door before its queues refuse inside it.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// The HTTP front's settings. [`Default`]: loopback hosts only, [`DEFAULT_MAX_IN_FLIGHT`],
/// [`DEFAULT_MAX_IN_FLIGHT_PER_PRINCIPAL`] and the default [`ConnectionLimits`].
#[derive(Clone, Debug)]
pub struct HttpFront {
    /// The hosts the server answers for (`Host`, and `Origin` when present).
    pub hosts: AllowedHosts,
    /// Requests handled at once.
    pub max_in_flight: usize,
    /// Requests of one principal handled at once.
    pub max_in_flight_per_principal: usize,
    /// The listener's limits; its body deadline ([`ConnectionLimits::body_timeout`]) is also
    /// the deadline of `/mcp`'s strict body under any listener.
    pub limits: ConnectionLimits,
    /// Whether a `tools/call` of MCP 2026-07-28 that rmcp's service would take as it is
    /// (see [`crate::wire`]'s direct path) is answered in the task that read it, without rmcp
    /// reading it again and starting a service loop for it. The answer is the same; a
    /// notification a tool sends during such a call is not delivered. On by default; turn it
    /// off for tools that send notifications.
    pub direct_tool_calls: bool,
}

impl Default for HttpFront {
    fn default() -> Self {
        HttpFront {
            hosts: AllowedHosts::loopback(),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_in_flight_per_principal: DEFAULT_MAX_IN_FLIGHT_PER_PRINCIPAL,
            limits: ConnectionLimits::default(),
            direct_tool_calls: true,
        }
    }
}

impl HttpFront {
    /// `/mcp`: `server` (cloned for each session) as rmcp's streamable HTTP service, JSON
    /// responses, within every layer of the front; callers are the principals of
    /// `principals` their bearer tokens name.
    pub fn router<S>(&self, server: S, principals: PrincipalStore) -> axum::Router
    where
        S: rmcp::ServerHandler + Clone + Send + Sync + 'static,
    {
        self.router_within(server, principals, &InFlightLimit::new(self.max_in_flight))
    }

    /// [`HttpFront::router`] with `limit` as its in-flight limit instead of a limit of
    /// [`HttpFront::max_in_flight`] of its own, so that other routes of the server can share it
    /// ([`InFlightLimit::guard`]).
    pub fn router_within<S>(
        &self,
        server: S,
        principals: PrincipalStore,
        limit: &InFlightLimit,
    ) -> axum::Router
    where
        S: rmcp::ServerHandler + Clone + Send + Sync + 'static,
    {
        // rmcp checks the Host header against the same list (after ours, which runs first and
        // also judges Origin), and reads at most the wire entry's largest message.
        let config = StreamableHttpServerConfig::default()
            .with_json_response(true)
            .with_sse_keep_alive(None)
            .with_allowed_hosts(self.hosts.entries())
            .with_max_request_body_bytes(MAX_MESSAGE_BYTES);
        let sessions = Arc::new(LocalSessionManager::default());
        let factory = server.clone();
        let service =
            StreamableHttpService::new(move || Ok(factory.clone()), sessions.clone(), config);
        // One value shared by every request: axum's layers would clone each layer, and every
        // layer inside it, per request, and rmcp's service registers a cancellation token
        // when cloned.
        let pipeline = Arc::new(Pipeline {
            in_flight: limit.clone(),
            hosts: self.hosts.clone(),
            principals,
            per_principal: Arc::new(PerPrincipal::new(self.max_in_flight_per_principal)),
            body_timeout: BodyTimeout(self.limits.body_timeout),
            owners: SessionOwners::new(sessions),
            direct: self.direct_tool_calls.then(|| DirectCalls::new(server)),
            service,
        });
        axum::Router::new().route(
            "/mcp",
            axum::routing::any(move |request: Request| {
                let pipeline = pipeline.clone();
                async move { pipeline.pass(request).await }
            }),
        )
    }

    /// Serves `app` on `listener` within [`HttpFront::limits`] until `shutdown` completes,
    /// then lets open connections finish (see [`crate::wire::http::serve`]).
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        app: axum::Router,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> std::io::Result<()> {
        crate::wire::http::serve(listener, app, self.limits, shutdown).await
    }
}

/// Every layer of the front, in the order a request meets them, and the MCP service at the
/// end: one value per router, so a request clones nothing but its own data on its way.
struct Pipeline<S: rmcp::ServerHandler> {
    in_flight: InFlightLimit,
    hosts: AllowedHosts,
    principals: PrincipalStore,
    per_principal: Arc<PerPrincipal>,
    body_timeout: BodyTimeout,
    owners: SessionOwners<LocalSessionManager>,
    direct: Option<DirectCalls<S>>,
    service: StreamableHttpService<S, LocalSessionManager>,
}

impl<S: rmcp::ServerHandler + Clone + Send + Sync + 'static> Pipeline<S> {
    /// `request` through every layer, outermost first — the in-flight limit, `Host` and
    /// `Origin`, the bearer token, the principal's share, the strict body, a legacy
    /// session's owner and end — then the MCP service. Inside the in-flight limit the request
    /// is handled in a task of its own, which keeps its permit until its work is done even when
    /// the client goes away.
    async fn pass(self: Arc<Self>, request: Request) -> Response {
        let this = self.clone();
        limit_in_flight(self.in_flight.in_flight(), request, move |r| async move {
            this.inside(r).await
        })
        .await
    }

    /// Every layer inside the in-flight limit.
    async fn inside(&self, request: Request) -> Response {
        host_and_origin(&self.hosts, request, |r| {
            authenticate(&self.principals, r, |r| {
                limit_per_principal(&self.per_principal, r, |r| {
                    strict_body(self.body_timeout, r, |r| {
                        bind_sessions(&self.owners, r, |r| {
                            end_session(self.owners.sessions(), r, |r| self.mcp(r))
                        })
                    })
                })
            })
        })
        .await
    }

    /// `/mcp`: a `tools/call` the direct path takes is answered there; anything else by
    /// rmcp's service.
    async fn mcp(&self, request: Request) -> Response {
        let (mut parts, body) = request.into_parts();
        let checked = parts.extensions.remove::<CheckedCall>();
        if let (Some(direct), Some(CheckedCall(call))) = (&self.direct, checked) {
            if direct.takes(&parts.method, &parts.headers, &call) {
                return direct.answer(parts, call).await;
            }
        }
        self.service
            .handle(Request::from_parts(parts, body))
            .await
            .into_response()
    }
}

/// `GET /healthz` (liveness: the process serves requests) and `GET /readyz` (readiness: the
/// ledger's store answers a read), for any host and without a token, and with no detail a
/// stranger could use.
pub fn health_routes(store: Store) -> axum::Router {
    use axum::http::StatusCode;
    use axum::routing::get;
    axum::Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
        )
        .route(
            "/readyz",
            get(move || {
                let store = store.clone();
                async move {
                    let answered = store.read(|tx| tx.query("SELECT 1", &[]).map(|_| ())).await;
                    match answered {
                        Ok(()) => (
                            StatusCode::OK,
                            axum::Json(serde_json::json!({"status": "ready"})),
                        ),
                        Err(_) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            axum::Json(serde_json::json!({"status": "unavailable"})),
                        ),
                    }
                }
            }),
        )
}
