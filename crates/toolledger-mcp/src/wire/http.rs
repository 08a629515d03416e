//! The HTTP side of the strict wire entry, as axum middleware for a streamable HTTP MCP
//! endpoint (rmcp's `StreamableHttpService`):
//!
//! - [`guard_host_and_origin`]: the `Host` header must name an allowed host
//!   ([`AllowedHosts`]: loopback, plus the operator's own names), and a present `Origin`
//!   header must name one too; otherwise 403 before anything else runs (DNS rebinding and
//!   cross-site requests from a browser never reach authentication or a tool).
//! - [`strict_body`]: a JSON POST body is read (at most
//!   [`MAX_MESSAGE_BYTES`](super::MAX_MESSAGE_BYTES); more is 413) and checked by
//!   [`check_message`](super::check_message); a refused body is answered 400 with the JSON-RPC
//!   error as `application/json`, and an accepted one is passed on unchanged.
//! - [`end_session`]: `DELETE` of a legacy session answers 204 No Content once the session
//!   is closed (rmcp answers 202, which clients read as a failed termination) and 404 for a
//!   session the server does not know.
//! - [`limit_in_flight`]: at most [`InFlight::limit`] requests are handled at once; one more
//!   is answered 503 `unavailable` with `Retry-After: 1` at once, without being read, so a
//!   server under more load than it can serve keeps its memory bounded and answers every
//!   request (a refused call did nothing: the client retries it under the same operation id).
//! - [`LimitedListener`]: at most so many connections open at once; the next one waits in the
//!   kernel's accept queue until one closes, so the memory the open connections hold is
//!   bounded as well.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, Method, StatusCode};
use rmcp::transport::streamable_http_server::SessionManager;

use super::{check_message, WireError, MAX_MESSAGE_BYTES};

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
    next.run(request).await
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

/// Middleware: checks a JSON POST body with the strict wire entry before the MCP service
/// reads it. Refused: 400 with the JSON-RPC error body (-32700, -32600 or -32602 with the
/// request's id); over [`MAX_MESSAGE_BYTES`]: 413 with the -32700 `too_large` body. Other
/// requests (GET, DELETE, another content type) pass untouched; the service answers them.
pub async fn strict_body(request: Request, next: Next) -> Response {
    if request.method() != Method::POST || !is_json(request.headers()) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_MESSAGE_BYTES).await {
        Ok(bytes) => bytes,
        Err(e) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                return jsonrpc_error(StatusCode::PAYLOAD_TOO_LARGE, &WireError::too_large());
            }
            return json_error(
                StatusCode::BAD_REQUEST,
                "body_unreadable",
                "the request body could not be read",
            );
        }
    };
    if let Err(error) = check_message(&bytes) {
        tracing::debug!(
            code = error.code,
            rule = error.rule,
            "refused an incoming message"
        );
        return jsonrpc_error(StatusCode::BAD_REQUEST, &error);
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Middleware for `DELETE` of a legacy session (`Mcp-Session-Id`): 404 when `sessions` does
/// not know the session, 204 No Content when the service closed it (rmcp's 202 is mapped),
/// anything else the service answered as it is.
pub async fn end_session<M: SessionManager>(
    State(sessions): State<Arc<M>>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != Method::DELETE {
        return next.run(request).await;
    }
    let known = match request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
    {
        Some(id) => sessions.has_session(&Arc::from(id)).await.unwrap_or(false),
        None => return next.run(request).await,
    };
    let response = next.run(request).await;
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

/// How many requests an HTTP endpoint handles at once ([`limit_in_flight`]).
#[derive(Debug)]
pub struct InFlight {
    permits: Arc<tokio::sync::Semaphore>,
    limit: usize,
}

impl InFlight {
    /// At most `limit` requests at once (at least 1).
    pub fn new(limit: usize) -> Self {
        let limit = limit.max(1);
        InFlight {
            permits: Arc::new(tokio::sync::Semaphore::new(limit)),
            limit,
        }
    }

    /// The most requests handled at once.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Requests being handled now.
    pub fn in_flight(&self) -> usize {
        self.limit - self.permits.available_permits()
    }
}

/// Middleware: handles the request while fewer than [`InFlight::limit`] others are handled;
/// otherwise answers 503 `{"error": {"code": "unavailable", …}}` with `Retry-After: 1` at
/// once, without reading the body, and counts it in
/// `toolledger_http_requests_shed_total`. The permit is held until the response's head is
/// ready (for a JSON response, the whole call).
pub async fn limit_in_flight(
    State(limit): State<Arc<InFlight>>,
    request: Request,
    next: Next,
) -> Response {
    let Ok(_permit) = limit.permits.clone().try_acquire_owned() else {
        metrics::counter!("toolledger_http_requests_shed_total").increment(1);
        let mut response = json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the server is handling as many requests as it can; retry the same request later",
        );
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
        return response;
    };
    next.run(request).await
}

/// A TCP listener that keeps at most `limit` connections open: while that many are open it
/// accepts no more (they wait in the kernel's accept queue), and a connection's slot is freed
/// when the server drops it.
#[derive(Debug)]
pub struct LimitedListener {
    inner: tokio::net::TcpListener,
    permits: Arc<tokio::sync::Semaphore>,
}

impl LimitedListener {
    /// `inner`, keeping at most `limit` connections open (at least 1).
    pub fn new(inner: tokio::net::TcpListener, limit: usize) -> Self {
        LimitedListener {
            inner,
            permits: Arc::new(tokio::sync::Semaphore::new(limit.max(1))),
        }
    }
}

/// A connection accepted by a [`LimitedListener`], holding its slot until dropped.
#[derive(Debug)]
pub struct LimitedStream {
    stream: tokio::net::TcpStream,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl axum::serve::Listener for LimitedListener {
    type Io = LimitedStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let slot = loop {
            match self.permits.clone().acquire_owned().await {
                Ok(slot) => break slot,
                // The semaphore is never closed; were it, accept without a slot.
                Err(_) => tokio::task::yield_now().await,
            }
        };
        let (stream, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        (
            LimitedStream {
                stream,
                _slot: slot,
            },
            addr,
        )
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

impl tokio::io::AsyncRead for LimitedStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for LimitedStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
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
