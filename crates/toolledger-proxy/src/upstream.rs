//! The upstream MCP server: a child process on stdio that the proxy starts and restarts, or a
//! streamable HTTP endpoint. The proxy is an ordinary MCP client of it (rmcp's), speaking
//! whichever lifecycle the upstream offers: MCP 2026-07-28 when it answers `server/discover`,
//! the `initialize` handshake otherwise.
//!
//! A child that exits is started again (after a second; longer, up to 30 s, while it keeps
//! exiting within seconds of its start), and a call that finds no live connection makes one
//! at once; an HTTP upstream is reconnected at the next call. Each connection must complete
//! its MCP handshake within the start timeout ([`DEFAULT_START_TIMEOUT`] unless set). Every
//! start and exit is logged, and the child's stderr goes to the proxy's log, line by line,
//! each line capped at [`MAX_STDERR_LINE_BYTES`] (target `toolledger::upstream`). A child's
//! environment is the proxy's without the ledger's secrets ([`STRIPPED_ENV`]), changed as its
//! [`ChildEnv`] says.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CallToolResult,
    CancelledNotificationParam, ClientCapabilities, ClientConfig, ClientRequest, ErrorData,
    Implementation, ProgressNotificationParam, ProgressToken, ProtocolVersion, RequestId,
    RequestMetaObject, ServerResult, Tool,
};
use rmcp::service::{
    ClientInitializeError, ClientLifecycleMode, ClientServiceExt, NotificationContext, Peer,
    PeerRequestOptions, QuitReason, RequestContext, RunningService,
    RunningServiceCancellationToken, ServiceError,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, RoleServer};
use tokio::io::AsyncBufReadExt;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::tasks::{self, ChildTransport, TaskRequired};

/// Where a forwarded call's progress notifications go, and what cancels it: the client's
/// request, as the proxy received it.
#[derive(Clone, Debug, Default)]
pub struct CallRoute {
    /// The client and the progress token its request carried.
    pub progress: Option<(Peer<RoleServer>, ProgressToken)>,
    /// Cancelled when the client cancels its request.
    pub cancelled: Option<CancellationToken>,
    /// What the call is to the ledger, for its span's `toolledger.step`: `forward`,
    /// `pass_through`, `reconcile` (empty: `upstream`).
    pub step: &'static str,
}

/// The `error.type` of an upstream's answer for the span of the call that got it: `tool_error`
/// for an `isError` result, the JSON-RPC error's code, or what kept the answer away.
fn error_type(answer: &Result<CallToolResponse, UpstreamError>) -> Option<String> {
    match answer {
        Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => Some("tool_error".into()),
        Ok(_) => None,
        Err(UpstreamError::Protocol(e)) => Some(e.code.0.to_string()),
        Err(UpstreamError::NotSent(_)) => Some("not_sent".into()),
        Err(UpstreamError::Timeout(_)) => Some("timeout".into()),
        Err(UpstreamError::Cancelled) => Some("cancelled".into()),
        Err(_) => Some("transport".into()),
    }
}

type Routes = Arc<std::sync::Mutex<HashMap<ProgressToken, (Peer<RoleServer>, ProgressToken)>>>;

/// The one client of a stdio proxy, to which the upstream's requests for the client (roots,
/// sampling, elicitation) are relayed. Empty until that client initializes (under the
/// `initialize` lifecycle), and always on an HTTP proxy, whose upstream serves many callers:
/// there no caller's roots are given to the upstream, and its requests for a client are
/// refused.
#[derive(Default)]
pub struct ClientRelay {
    /// Whether requests are relayed at all (a stdio proxy's one client).
    enabled: AtomicBool,
    client: std::sync::Mutex<Option<Peer<RoleServer>>>,
    /// The upstream, told when the client's roots change.
    upstream: std::sync::Mutex<std::sync::Weak<Upstream>>,
}

impl ClientRelay {
    fn client(&self) -> Option<(Peer<RoleServer>, ClientCapabilities)> {
        if !self.enabled.load(Ordering::Relaxed) {
            return None;
        }
        let peer = self.client.lock().ok()?.clone()?;
        let capabilities = peer.peer_info()?.capabilities.clone();
        Some((peer, capabilities))
    }

    /// Tells the upstream that the roots changed (it asks for them again), when the client
    /// has roots to give.
    fn announce_roots(&self) {
        let has_roots = self.client().is_some_and(|(_, caps)| caps.roots.is_some());
        let upstream = self.upstream.lock().ok().and_then(|u| u.upgrade());
        if let (true, Some(upstream)) = (has_roots, upstream) {
            tokio::spawn(async move {
                let peer = upstream
                    .current
                    .lock()
                    .await
                    .as_ref()
                    .map(|c| c.peer.clone());
                if let Some(peer) = peer {
                    let _ = peer.notify_roots_list_changed().await;
                }
            });
        }
    }
}

impl toolledger_mcp::ClientEvents for ClientRelay {
    fn initialized(&self, peer: Peer<RoleServer>) {
        if !self.enabled.load(Ordering::Relaxed) {
            return;
        }
        if let Ok(mut client) = self.client.lock() {
            *client = Some(peer);
        }
        self.announce_roots();
    }

    fn roots_list_changed(&self, _peer: Peer<RoleServer>) {
        self.announce_roots();
    }
}

/// A failed relay of a request to the client, as the upstream's error.
fn relay_error(e: ServiceError) -> ErrorData {
    match e {
        ServiceError::McpError(data) => data,
        _ => ErrorData::internal_error("the proxy's client did not answer", None),
    }
}

/// The proxy as the upstream's client: passes the upstream's progress notifications on to
/// the client whose call they belong to, under that client's own progress token, and relays
/// the upstream's requests for a client to the proxy's own client ([`ClientRelay`]).
#[derive(Clone, Default)]
struct ProxyClient {
    routes: Routes,
    relay: Arc<ClientRelay>,
}

impl ClientHandler for ProxyClient {
    fn get_info(&self) -> ClientConfig {
        let mut config = client_config();
        // Roots are always declared: without a client to ask, the list is empty, and the
        // upstream is told when a client with roots arrives.
        let mut roots = rmcp::model::RootsCapabilities::default();
        roots.list_changed = Some(true);
        config.capabilities.roots = Some(roots);
        if self.relay.enabled.load(Ordering::Relaxed) {
            config.capabilities.sampling = Some(Default::default());
            config.capabilities.elicitation = Some(Default::default());
        }
        config
    }

    #[allow(deprecated)] // roots/list: what a client of the `initialize` lifecycle is asked
    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ListRootsResult, ErrorData> {
        match self.relay.client() {
            Some((peer, caps)) if caps.roots.is_some() => {
                peer.list_roots().await.map_err(relay_error)
            }
            _ => Ok(rmcp::model::ListRootsResult::default()),
        }
    }

    #[allow(deprecated)] // sampling/createMessage: what a client of that lifecycle is asked
    async fn create_message(
        &self,
        params: rmcp::model::CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, ErrorData> {
        match self.relay.client() {
            Some((peer, caps)) if caps.sampling.is_some() => {
                peer.create_message(params).await.map_err(relay_error)
            }
            _ => Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                "the proxy's client does not offer sampling",
                None,
            )),
        }
    }

    async fn create_elicitation(
        &self,
        params: rmcp::model::ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, ErrorData> {
        match self.relay.client() {
            Some((peer, caps)) if caps.elicitation.is_some() => {
                peer.create_elicitation(params).await.map_err(relay_error)
            }
            _ => Ok(rmcp::model::ElicitResult::new(
                rmcp::model::ElicitationAction::Decline,
            )),
        }
    }

    fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + Send + '_ {
        let route = self
            .routes
            .lock()
            .ok()
            .and_then(|r| r.get(&params.progress_token).cloned());
        async move {
            if let Some((peer, token)) = route {
                let mut params = params;
                params.progress_token = token;
                let _ = peer.notify_progress(params).await;
            }
        }
    }
}

/// Tells the upstream a request it is still working on was given up (dropped unless
/// disarmed by an answer).
struct Abandoned(Option<(Peer<RoleClient>, RequestId)>);

impl Drop for Abandoned {
    fn drop(&mut self) {
        if let Some((peer, id)) = self.0.take() {
            tokio::spawn(async move {
                let params = CancelledNotificationParam::new(
                    Some(id),
                    Some("cancelled by the proxy's client or its timeout".into()),
                );
                let _ = peer.notify_cancelled(params).await;
            });
        }
    }
}

/// A `tools/call` answer as the client sees it.
fn response(result: ServerResult) -> Result<CallToolResponse, UpstreamError> {
    match result {
        ServerResult::CallToolResult(r) => Ok(CallToolResponse::Complete(r)),
        ServerResult::InputRequiredResult(r) => Ok(CallToolResponse::InputRequired(r)),
        ServerResult::CreateTaskResult(r) => Ok(CallToolResponse::Task(r)),
        // A reply without `content` decodes as an empty result.
        ServerResult::EmptyResult(_) => Ok(CallToolResponse::Complete(CallToolResult::default())),
        _ => Err(UpstreamError::Transport(
            "its answer to tools/call is not a tool result".into(),
        )),
    }
}

/// Removes a progress route when the call it belongs to ends, however it ends.
struct RouteGuard(Routes, Option<ProgressToken>);

impl Drop for RouteGuard {
    fn drop(&mut self) {
        if let (Some(token), Ok(mut routes)) = (self.1.take(), self.0.lock()) {
            routes.remove(&token);
        }
    }
}

/// Where the upstream is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpstreamSpec {
    /// A command the proxy starts, talking MCP on its stdin and stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// What its environment differs from the proxy's by (beyond [`STRIPPED_ENV`]).
        env: ChildEnv,
    },
    /// A streamable HTTP endpoint.
    Http {
        /// Its URL (`https://host/mcp`).
        url: String,
        /// Headers sent with every request (`Authorization: Bearer …` among them).
        headers: Vec<(String, String)>,
    },
}

/// The ledger's own secrets, never passed to a stdio upstream: the keys, the database URL
/// (which may hold a password) and the HTTP upstream's headers. The child inherits the rest of
/// the proxy's environment, changed by [`ChildEnv`].
pub const STRIPPED_ENV: &[&str] = &[
    "TOOLLEDGER_STATE_KEY_HEX",
    "TOOLLEDGER_FINGERPRINT_KEY_HEX",
    "TOOLLEDGER_DATABASE_URL",
    "TOOLLEDGER_UPSTREAM_HEADERS",
];

/// How a stdio upstream's environment differs from the proxy's, besides [`STRIPPED_ENV`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChildEnv {
    /// Variables removed (names).
    pub remove: Vec<String>,
    /// Variables set (name, value), after the removals.
    pub set: Vec<(String, String)>,
}

impl ChildEnv {
    /// Applies the removals of [`STRIPPED_ENV`] and of `self`, then the settings, to `cmd`.
    fn apply(&self, cmd: &mut tokio::process::Command) {
        for name in STRIPPED_ENV
            .iter()
            .copied()
            .chain(self.remove.iter().map(String::as_str))
        {
            cmd.env_remove(name);
        }
        for (name, value) in &self.set {
            cmd.env(name, value);
        }
    }
}

/// Which lifecycle the proxy speaks to its upstream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Lifecycle {
    /// `server/discover` first (MCP 2026-07-28), the `initialize` handshake when the upstream
    /// is older.
    #[default]
    Auto,
    /// Only the `initialize` handshake.
    Legacy,
    /// Only MCP 2026-07-28.
    Modern,
}

/// Why a call to the upstream did not produce an answer.
///
/// The `Display` form is what a client may be told: it names no internal type and no upstream
/// address. [`UpstreamError::detail`] adds what an operator needs in the log, with the
/// upstream URL's credentials and query values redacted.
#[derive(Clone, Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The upstream answered with a JSON-RPC error: passed back to the client unchanged.
    #[error("the upstream answered with a JSON-RPC error")]
    Protocol(ErrorData),
    /// The request provably never reached the upstream: no connection could be made (refused,
    /// the name did not resolve, the child could not be started or was restarting), or the
    /// request was not written. Nothing can have happened; the call may be made again.
    #[error("the upstream could not be reached; the call was not sent")]
    NotSent(String),
    /// The connection failed or closed after the request may have been sent and before an
    /// answer (whether the upstream acted is not known).
    #[error("the connection to the upstream failed before it answered")]
    Transport(String),
    /// No answer within the call timeout (the request was cancelled upstream).
    #[error("the upstream did not answer within {0} s")]
    Timeout(u64),
    /// The client cancelled its request; the cancellation was passed on upstream.
    #[error("the client cancelled the call")]
    Cancelled,
    /// The upstream's answer is beyond what the proxy keeps (the detail says which limit).
    #[error("the upstream's answer is too large")]
    TooLarge(String),
}

impl UpstreamError {
    /// The error with its detail, for the log (secrets in the upstream URL redacted).
    pub fn detail(&self) -> String {
        match self {
            UpstreamError::NotSent(d) | UpstreamError::Transport(d) if !d.is_empty() => {
                format!("{self} ({})", redact_urls(d))
            }
            _ => self.to_string(),
        }
    }

    /// Why the upstream could not be started or listed, for the proxy's start-up error: the
    /// detail in the proxy's words (secrets in URLs redacted), without the wording of a call.
    pub fn start_reason(&self) -> String {
        match self {
            UpstreamError::NotSent(d) | UpstreamError::Transport(d) if !d.is_empty() => {
                redact_urls(d)
            }
            UpstreamError::NotSent(_) | UpstreamError::Transport(_) => {
                "the connection failed or closed".into()
            }
            UpstreamError::Protocol(e) => {
                format!("it answered with a JSON-RPC error ({})", e.message)
            }
            UpstreamError::Timeout(s) => format!("it did not answer within {s} s"),
            UpstreamError::Cancelled => "the start was cancelled".into(),
            UpstreamError::TooLarge(d) => d.clone(),
        }
    }

    /// Whether the request provably never reached the upstream.
    pub fn not_sent(&self) -> bool {
        matches!(self, UpstreamError::NotSent(_))
    }
}

/// `text` with the user information and query values of every `http://` or `https://` URL in
/// it replaced by `[redacted]` (a token in `?key=…` must not reach a log).
pub use toolledger_mcp::telemetry::redact_urls;

/// Why a connection's MCP handshake failed, in the proxy's words: no internal type name, no
/// URL credential or query value (rmcp's own messages carry both).
fn handshake_words(e: &ClientInitializeError) -> String {
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    match e {
        ClientInitializeError::LegacyFallbackFailed { fallback, .. } => handshake_words(fallback),
        ClientInitializeError::ConnectionClosed(_) => {
            "it closed the connection during the MCP handshake (a child that exited, or a \
             server that hung up)"
                .into()
        }
        ClientInitializeError::TransportError { error, .. } => {
            match error
                .error
                .downcast_ref::<StreamableHttpError<reqwest::Error>>()
            {
                Some(StreamableHttpError::Client(r)) if r.is_connect() => {
                    "no connection could be made (refused, unreachable, or the name did not \
                     resolve)"
                        .into()
                }
                Some(StreamableHttpError::Client(r)) if r.is_timeout() => {
                    "the connection timed out".into()
                }
                Some(StreamableHttpError::Client(r)) => match r.status() {
                    Some(status) => format!("it answered HTTP {status}"),
                    None => "the HTTP request failed".into(),
                },
                Some(StreamableHttpError::AuthRequired(_))
                | Some(StreamableHttpError::InsufficientScope(_)) => {
                    "it asked for credentials (HTTP 401 or 403): check the upstream headers".into()
                }
                Some(_) => "it answered the MCP handshake with something other than MCP".into(),
                None => "the connection failed during the MCP handshake".into(),
            }
        }
        ClientInitializeError::JsonRpcError(data) => format!(
            "it refused the MCP handshake with a JSON-RPC error ({})",
            redact_urls(&data.message)
        ),
        ClientInitializeError::NoCompatibleProtocolVersion {
            server_supported, ..
        } => format!(
            "it speaks no MCP version the proxy speaks (it offers {})",
            server_supported
                .iter()
                .map(|v| v.as_str().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        ClientInitializeError::Cancelled => "the MCP handshake was cancelled".into(),
        _ => "it answered the MCP handshake with something other than its result".into(),
    }
}

/// The most tools the proxy takes from an upstream's listing.
pub const MAX_LISTED_TOOLS: usize = 2_000;
/// The most `tools/list` pages the proxy asks for.
pub const MAX_LIST_PAGES: usize = 50;
/// The most bytes of tool definitions (their JSON) the proxy keeps from a listing.
pub const MAX_LISTED_BYTES: usize = 32 << 20;

/// Every page of the upstream's `tools/list`, within the caps above (each answer is itself
/// bounded by rmcp's largest message, 16 MiB).
async fn list_bounded(peer: &Peer<RoleClient>) -> Result<Vec<Tool>, UpstreamError> {
    let mut tools = Vec::new();
    let mut bytes = 0usize;
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_LIST_PAGES {
        let params =
            cursor.map(|c| rmcp::model::PaginatedRequestParams::default().with_cursor(Some(c)));
        let page = peer.list_tools(params).await?;
        for tool in page.tools {
            bytes += serde_json::to_vec(&tool).map(|v| v.len()).unwrap_or(0);
            tools.push(tool);
            if tools.len() > MAX_LISTED_TOOLS {
                return Err(UpstreamError::TooLarge(format!(
                    "it lists more than {MAX_LISTED_TOOLS} tools"
                )));
            }
            if bytes > MAX_LISTED_BYTES {
                return Err(UpstreamError::TooLarge(format!(
                    "its tool definitions exceed {} MiB",
                    MAX_LISTED_BYTES >> 20
                )));
            }
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(tools);
        }
    }
    Err(UpstreamError::TooLarge(format!(
        "its tools/list has more than {MAX_LIST_PAGES} pages"
    )))
}

/// The detail of a transport error without rmcp's wrapper (which names internal types).
fn transport_detail(e: &rmcp::transport::DynamicTransportError) -> String {
    e.error.to_string()
}

/// Whether a failed send of a request over HTTP provably never reached the upstream: the
/// connection was never made (refused, unresolvable name, TLS handshake). A closed worker
/// channel is no such proof: the worker may have posted the request before it stopped.
fn http_not_sent(e: &rmcp::transport::DynamicTransportError) -> bool {
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    matches!(
        e.error.downcast_ref::<StreamableHttpError<reqwest::Error>>(),
        Some(StreamableHttpError::Client(r)) if r.is_connect()
    )
}

impl From<ServiceError> for UpstreamError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::McpError(data) => UpstreamError::Protocol(data),
            ServiceError::Timeout { timeout } => UpstreamError::Timeout(timeout.as_secs()),
            ServiceError::TransportSend(t) => UpstreamError::Transport(transport_detail(&t)),
            ServiceError::TransportClosed => {
                UpstreamError::Transport("the connection closed".into())
            }
            _ => UpstreamError::Transport(String::new()),
        }
    }
}

struct Connection {
    generation: u64,
    peer: Peer<RoleClient>,
    /// Dropped with the connection: stops the client service (and the child with it).
    _stop: StopOnDrop,
    /// Completes once the client service has ended and closed its transport (the child has
    /// exited, or the HTTP session was ended).
    ended: tokio::sync::watch::Receiver<bool>,
}

/// How long [`Upstream::close`] waits for the service to end: the child's own exit after
/// its stdin closes, then after `SIGTERM`, then its kill, with a second to spare.
const CLOSE_WAIT: Duration = Duration::from_secs(8);

/// Stops a client service when dropped.
struct StopOnDrop(Option<RunningServiceCancellationToken>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(ct) = self.0.take() {
            ct.cancel();
        }
    }
}

/// The most bytes of one line of a child's stderr the log keeps; the rest of the line is
/// read and dropped (the log line says how many bytes), so a child that writes without a
/// newline cannot grow the proxy's memory.
pub const MAX_STDERR_LINE_BYTES: usize = 8 * 1024;

/// Reads one line of `reader` into `line` (cleared first, without its newline), keeping at
/// most `cap` bytes of it: `Some(dropped bytes)`, or `None` at the end of the input.
async fn read_capped_line<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    cap: usize,
) -> std::io::Result<Option<usize>> {
    line.clear();
    let mut dropped = 0usize;
    let mut any = false;
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(any.then_some(dropped));
        }
        any = true;
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        let room = cap.saturating_sub(line.len());
        let keep = chunk.len().min(room);
        line.extend_from_slice(&chunk[..keep]);
        dropped += chunk.len() - keep;
        let used = done.unwrap_or(buf.len());
        reader.consume(used);
        if done.is_some() {
            return Ok(Some(dropped));
        }
    }
}

/// Seconds a child must have run for its exit to be restarted after the shortest backoff.
const HEALTHY_RUN_SECONDS: u64 = 5;
/// The longest wait before starting a child that keeps exiting again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A supervised connection to the upstream. Cheap to share (`Arc`).
pub struct Upstream {
    spec: UpstreamSpec,
    lifecycle: Lifecycle,
    current: Mutex<Option<Connection>>,
    starts: AtomicU64,
    handler: ProxyClient,
    /// This upstream, for the supervisor of each child (which must not keep it alive).
    me: std::sync::Weak<Upstream>,
    /// Milliseconds to wait before the next restart of a child that exited.
    backoff_ms: AtomicU64,
    /// The lifecycle connections use: the configured one until an automatic lifecycle learns
    /// from a late answer to `server/discover` (one that came after the fallback to
    /// `initialize`) which one the upstream speaks ([`Lifecycle::Modern`] when it was a
    /// result, [`Lifecycle::Legacy`] when it was an error); every later connection uses that.
    lifecycle_now: std::sync::Mutex<Lifecycle>,
    /// Filled from a stdio child's own `tools/list` answers while [`Upstream::list_tools`] runs.
    task_required: Arc<TaskRequired>,
    /// Set by [`Upstream::close`]: no connection is made again.
    closed: AtomicBool,
    /// Milliseconds a connection may take to complete its MCP handshake.
    start_timeout_ms: AtomicU64,
}

/// How long the MCP handshake with a new connection may take by default: long enough for an
/// `npx -y` or `uvx` upstream to install itself on a cold cache.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a connection to the upstream was not made.
enum Startup {
    /// The automatic lifecycle's `server/discover` was answered after its fallback to
    /// `initialize`; the value is what that answer says the upstream speaks
    /// ([`Lifecycle::Modern`] or [`Lifecycle::Legacy`]).
    LateDiscover(Lifecycle),
    /// Any other failure.
    Failed(UpstreamError),
}

impl Startup {
    fn into_error(self) -> UpstreamError {
        match self {
            Startup::LateDiscover(_) => {
                UpstreamError::NotSent("its lifecycle could not be agreed".into())
            }
            Startup::Failed(e) => e,
        }
    }
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.spec {
            UpstreamSpec::Stdio { .. } => "stdio",
            UpstreamSpec::Http { .. } => "http",
        };
        f.debug_struct("Upstream")
            .field("kind", &kind)
            .field("starts", &self.starts.load(Ordering::Relaxed))
            .finish()
    }
}

fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("toolledger-proxy", env!("CARGO_PKG_VERSION")),
    )
}

impl Upstream {
    /// An upstream at `spec`, not yet connected.
    pub fn new(spec: UpstreamSpec, lifecycle: Lifecycle) -> Arc<Self> {
        if matches!(spec, UpstreamSpec::Http { .. }) {
            // reqwest is built without a crypto provider of its own: ring, as everywhere else.
            // An error means one is installed already.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        Arc::new_cyclic(|me| Upstream {
            spec,
            lifecycle,
            current: Mutex::new(None),
            starts: AtomicU64::new(0),
            handler: ProxyClient::default(),
            me: me.clone(),
            backoff_ms: AtomicU64::new(1_000),
            lifecycle_now: std::sync::Mutex::new(lifecycle),
            task_required: Arc::default(),
            closed: AtomicBool::new(false),
            start_timeout_ms: AtomicU64::new(DEFAULT_START_TIMEOUT.as_millis() as u64),
        })
    }

    /// Sets how long a new connection (a child's start, a reconnection) may take to complete
    /// its MCP handshake before it is given up and the child stopped
    /// ([`DEFAULT_START_TIMEOUT`] unless set).
    pub fn set_start_timeout(&self, timeout: Duration) {
        self.start_timeout_ms
            .store(timeout.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    /// How long a new connection may take to complete its MCP handshake.
    pub fn start_timeout(&self) -> Duration {
        Duration::from_millis(self.start_timeout_ms.load(Ordering::Relaxed))
    }

    /// Stops the upstream for good, as the proxy's own shutdown does: a stdio child's stdin is
    /// closed and the child given time to exit on its own (then `SIGTERM`, then a kill), an
    /// HTTP session is ended; waits for that (bounded). Calls after this are not sent.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        let Some(connection) = self.current.lock().await.take() else {
            return;
        };
        let generation = connection.generation;
        let mut ended = connection.ended.clone();
        drop(connection);
        let done = tokio::time::timeout(CLOSE_WAIT, ended.wait_for(|e| *e)).await;
        match done {
            Ok(_) => tracing::info!(target: "toolledger::upstream", generation, "upstream stopped"),
            Err(_) => tracing::warn!(target: "toolledger::upstream", generation,
                "the upstream did not stop in time"),
        }
    }

    /// The relay of this upstream's requests for a client (roots, sampling, elicitation) to
    /// the proxy's own client: give it to the server the client talks to
    /// ([`toolledger_mcp::GuardedServer::with_client_events`]). Relaying starts with
    /// `enabled` — for a stdio proxy's one client; an HTTP proxy's upstream serves many
    /// callers and is given no caller's roots. Call before the first connection.
    pub fn client_relay(self: &Arc<Self>, enabled: bool) -> Arc<ClientRelay> {
        let relay = self.handler.relay.clone();
        relay.enabled.store(enabled, Ordering::Relaxed);
        if let Ok(mut upstream) = relay.upstream.lock() {
            *upstream = Arc::downgrade(self);
        }
        relay
    }

    /// How many times a connection was made (the child started) so far.
    pub fn starts(&self) -> u64 {
        self.starts.load(Ordering::Relaxed)
    }

    fn mode(&self) -> ClientLifecycleMode {
        let modern = vec![ProtocolVersion::V_2026_07_28];
        let lifecycle = *self.lifecycle_now.lock().unwrap_or_else(|e| e.into_inner());
        match lifecycle {
            Lifecycle::Auto => ClientLifecycleMode::Auto {
                preferred_versions: modern,
                legacy_version: None,
            },
            Lifecycle::Legacy => ClientLifecycleMode::Initialize,
            Lifecycle::Modern => ClientLifecycleMode::Discover {
                preferred_versions: modern,
            },
        }
    }

    /// The live connection's peer, connecting (again) when there is none.
    async fn peer(&self) -> Result<Peer<RoleClient>, UpstreamError> {
        let mut current = self.current.lock().await;
        if self.closed.load(Ordering::Relaxed) {
            return Err(UpstreamError::NotSent("the proxy is stopping".into()));
        }
        if let Some(c) = current.as_ref() {
            if !c.peer.is_transport_closed() {
                return Ok(c.peer.clone());
            }
            tracing::warn!(target: "toolledger::upstream", generation = c.generation,
                "the upstream connection closed; reconnecting");
        }
        let generation = self.starts.fetch_add(1, Ordering::Relaxed) + 1;
        let connection = match self.connect(generation).await {
            Err(Startup::LateDiscover(learned)) => {
                // The upstream took longer than the automatic lifecycle waits for its
                // `server/discover` answer (a slow start on a loaded machine, an `npx` that
                // installs first), and both that request and the fallback `initialize` were
                // waiting for it. Its late answer says which lifecycle it speaks: connect again
                // with that one alone, which waits.
                *self.lifecycle_now.lock().unwrap_or_else(|e| e.into_inner()) = learned;
                if learned == Lifecycle::Modern {
                    tracing::warn!(target: "toolledger::upstream", generation,
                        "the upstream answered server/discover late; connecting again with MCP 2026-07-28");
                } else {
                    tracing::warn!(target: "toolledger::upstream", generation,
                        "the upstream refused server/discover late; connecting again with initialize");
                }
                self.connect(generation).await
            }
            other => other,
        }
        .map_err(Startup::into_error)?;
        let peer = connection.peer.clone();
        *current = Some(connection);
        Ok(peer)
    }

    async fn connect(&self, generation: u64) -> Result<Connection, Startup> {
        let failed = |e: &dyn std::fmt::Display| {
            let detail = redact_urls(&e.to_string());
            tracing::warn!(target: "toolledger::upstream", generation, error = %detail,
                "the upstream could not be started");
            Startup::Failed(UpstreamError::NotSent(detail))
        };
        let late = || {
            let secs = self.start_timeout().as_secs();
            tracing::warn!(target: "toolledger::upstream", generation, seconds = secs,
                "the upstream did not complete the MCP handshake in time; it is stopped");
            Startup::Failed(UpstreamError::NotSent(format!(
                "it did not complete the MCP handshake within {secs} s"
            )))
        };
        let refused = |e: &ClientInitializeError| {
            let detail = handshake_words(e);
            tracing::warn!(target: "toolledger::upstream", generation, error = %detail,
                "the upstream could not be started");
            Startup::Failed(UpstreamError::NotSent(detail))
        };
        let handshake = |e: ClientInitializeError| match e {
            // The answer to `server/discover` arrived after the fallback to `initialize`: a
            // result (the upstream speaks MCP 2026-07-28) or an error (it does not).
            ClientInitializeError::ConflictInitResponseId(..)
                if self.lifecycle == Lifecycle::Auto =>
            {
                Startup::LateDiscover(Lifecycle::Modern)
            }
            ClientInitializeError::UncorrelatedErrorResponse { .. }
                if self.lifecycle == Lifecycle::Auto =>
            {
                Startup::LateDiscover(Lifecycle::Legacy)
            }
            e => refused(&e),
        };
        match &self.spec {
            UpstreamSpec::Stdio { command, args, env } => {
                let mut cmd = tokio::process::Command::new(command);
                env.apply(&mut cmd);
                cmd.args(args)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .kill_on_drop(true);
                let mut child = cmd.spawn().map_err(|e| failed(&e))?;
                let stderr = child.stderr.take();
                let transport = ChildTransport::new(child, self.task_required.clone())
                    .map_err(|e| failed(&e))?;
                let pid = transport.id();
                if let Some(stderr) = stderr {
                    tokio::spawn(async move {
                        let mut stderr = tokio::io::BufReader::new(stderr);
                        let mut line = Vec::new();
                        while let Ok(Some(cut)) =
                            read_capped_line(&mut stderr, &mut line, MAX_STDERR_LINE_BYTES).await
                        {
                            let text = String::from_utf8_lossy(&line);
                            if cut > 0 {
                                tracing::info!(target: "toolledger::upstream", pid,
                                    truncated_bytes = cut, "{text}");
                            } else {
                                tracing::info!(target: "toolledger::upstream", pid, "{text}");
                            }
                        }
                    });
                }
                let service = self
                    .handler
                    .clone()
                    .serve_with_lifecycle(transport, self.mode());
                let service = tokio::time::timeout(self.start_timeout(), service)
                    .await
                    .map_err(|_| late())?
                    .map_err(handshake)?;
                tracing::info!(target: "toolledger::upstream", generation, pid,
                    protocol = ?service.peer().peer_info().map(|i| i.protocol_version.clone()),
                    "upstream started");
                let peer = service.peer().clone();
                let stop = StopOnDrop(Some(service.cancellation_token()));
                let (end, ended) = tokio::sync::watch::channel(false);
                self.supervise(generation, pid, service, end);
                Ok(Connection {
                    generation,
                    peer,
                    _stop: stop,
                    ended,
                })
            }
            UpstreamSpec::Http { url, headers } => {
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                let mut custom = HashMap::new();
                for (name, value) in headers {
                    let bearer = value
                        .strip_prefix("Bearer ")
                        .filter(|_| name.eq_ignore_ascii_case("authorization"));
                    if let Some(token) = bearer {
                        config = config.auth_header(token.to_string());
                        continue;
                    }
                    let n = http::HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| failed(&"an upstream header name is invalid"))?;
                    let v = http::HeaderValue::from_str(value)
                        .map_err(|_| failed(&"an upstream header value is invalid"))?;
                    custom.insert(n, v);
                }
                let config = config.custom_headers(custom);
                let client = crate::traced_http::TracedHttp::new()
                    .ok_or_else(|| failed(&"the HTTP client could not be built"))?;
                let transport = StreamableHttpClientTransport::with_client(client, config);
                let service = self
                    .handler
                    .clone()
                    .serve_with_lifecycle(transport, self.mode());
                let service = tokio::time::timeout(self.start_timeout(), service)
                    .await
                    .map_err(|_| late())?
                    .map_err(handshake)?;
                tracing::info!(target: "toolledger::upstream", generation,
                    protocol = ?service.peer().peer_info().map(|i| i.protocol_version.clone()),
                    "upstream connected");
                let peer = service.peer().clone();
                let stop = StopOnDrop(Some(service.cancellation_token()));
                let (end, ended) = tokio::sync::watch::channel(false);
                // An HTTP upstream is reconnected at the next call; it has no process to restart.
                tokio::spawn(async move {
                    let reason = service.waiting().await;
                    end.send_replace(true);
                    if !matches!(reason, Ok(QuitReason::Cancelled)) {
                        tracing::warn!(target: "toolledger::upstream", generation,
                            "the upstream connection ended; the next call reconnects");
                    }
                });
                Ok(Connection {
                    generation,
                    peer,
                    _stop: stop,
                    ended,
                })
            }
        }
    }

    /// Watches child `generation`: when it exits (and the proxy did not stop it), logs it and
    /// starts it again after a backoff that grows while it keeps exiting soon after starting.
    fn supervise(
        &self,
        generation: u64,
        pid: Option<u32>,
        service: RunningService<RoleClient, ProxyClient>,
        end: tokio::sync::watch::Sender<bool>,
    ) {
        let me = self.me.clone();
        let started = std::time::Instant::now();
        tokio::spawn(async move {
            let reason = service.waiting().await;
            end.send_replace(true);
            if matches!(reason, Ok(QuitReason::Cancelled)) {
                return; // stopped by the proxy
            }
            let Some(upstream) = me.upgrade() else {
                return;
            };
            let wait = if started.elapsed() >= Duration::from_secs(HEALTHY_RUN_SECONDS) {
                upstream.backoff_ms.store(1_000, Ordering::Relaxed);
                Duration::from_secs(1)
            } else {
                let ms = upstream.backoff_ms.load(Ordering::Relaxed);
                let next = (ms * 2).min(MAX_BACKOFF.as_millis() as u64);
                upstream.backoff_ms.store(next, Ordering::Relaxed);
                Duration::from_millis(ms)
            };
            tracing::warn!(target: "toolledger::upstream", generation, pid,
                restart_in_ms = wait.as_millis() as u64, "the upstream exited; starting it again");
            drop(upstream);
            tokio::time::sleep(wait).await;
            let Some(upstream) = me.upgrade() else {
                return;
            };
            // Only if nobody has replaced this child meanwhile (a call reconnects at once).
            let stale = upstream
                .current
                .lock()
                .await
                .as_ref()
                .is_some_and(|c| c.generation == generation);
            if stale {
                if let Err(e) = upstream.peer().await {
                    tracing::warn!(target: "toolledger::upstream", error = %e.detail(),
                        "the upstream did not start again; the next call tries once more");
                }
            }
        });
    }

    /// Whether the failed send `e` provably left nothing with the upstream: over stdio the
    /// line was not written (a request is read only once its whole line is), over HTTP the
    /// connection was never made.
    fn unsent(&self, e: &rmcp::transport::DynamicTransportError) -> bool {
        match &self.spec {
            UpstreamSpec::Stdio { .. } => true,
            UpstreamSpec::Http { .. } => http_not_sent(e),
        }
    }

    /// The upstream's tools (every page), and the names of those whose
    /// `execution.taskSupport` is `required` (read from the upstream's own answers: rmcp's
    /// `Tool` does not keep `execution`). An HTTP upstream whose tools cannot be listed a second
    /// time, on a session of the proxy's own, is taken to require tasks for none (logged).
    ///
    /// A listing beyond [`MAX_LISTED_TOOLS`] tools, [`MAX_LIST_PAGES`] pages or
    /// [`MAX_LISTED_BYTES`] of tool definitions is refused ([`UpstreamError::TooLarge`]): an
    /// upstream cannot grow the proxy's memory by listing without end.
    pub async fn list_tools(&self) -> Result<(Vec<Tool>, BTreeSet<String>), UpstreamError> {
        let peer = self.peer().await?;
        match &self.spec {
            UpstreamSpec::Stdio { .. } => {
                self.task_required.start();
                let tools = list_bounded(&peer).await;
                let required = self.task_required.finish();
                Ok((tools?, required))
            }
            UpstreamSpec::Http { url, headers } => {
                let tools = list_bounded(&peer).await?;
                let required = match tasks::list_over_http(url, headers).await {
                    Ok(required) => required,
                    Err(e) => {
                        tracing::warn!(target: "toolledger::proxy", error = %redact_urls(&e),
                            "the upstream's tools could not be listed a second time to read their task support; none is taken to require tasks");
                        BTreeSet::new()
                    }
                };
                Ok((tools, required))
            }
        }
    }

    /// One `tools/call`, answered within `timeout` (after which the request is cancelled
    /// upstream and the outcome is [`UpstreamError::Timeout`]). The upstream's progress
    /// notifications go to the client `route` names, and its cancellation is passed on.
    pub async fn call_tool(
        &self,
        params: CallToolRequestParams,
        timeout: Duration,
        route: &CallRoute,
    ) -> Result<CallToolResponse, UpstreamError> {
        self.call_tool_as(params, timeout, route, None).await
    }

    /// [`Upstream::call_tool`] declaring `capabilities` (the client's) for this request to an
    /// upstream on MCP 2026-07-28, which may then answer `input_required` asking for them; an
    /// older upstream learned the proxy's own (none) at `initialize`.
    pub async fn call_tool_as(
        &self,
        params: CallToolRequestParams,
        timeout: Duration,
        route: &CallRoute,
        capabilities: Option<&ClientCapabilities>,
    ) -> Result<CallToolResponse, UpstreamError> {
        // The call's own span, a child of the client's request: the upstream receives it as
        // its parent in `_meta`.
        let step = if route.step.is_empty() {
            "upstream"
        } else {
            route.step
        };
        let cx = toolledger_mcp::trace::client_span(step, &params.name);
        let answer = toolledger_mcp::trace::in_context(
            &cx,
            self.send_call(params, timeout, route, capabilities),
        )
        .await;
        toolledger_mcp::trace::end_client(&cx, error_type(&answer).as_deref());
        answer
    }

    async fn send_call(
        &self,
        params: CallToolRequestParams,
        timeout: Duration,
        route: &CallRoute,
        capabilities: Option<&ClientCapabilities>,
    ) -> Result<CallToolResponse, UpstreamError> {
        // No connection (every error of `peer` is NotSent): nothing was sent.
        let peer = self.peer().await?;
        let mut options = PeerRequestOptions::no_options();
        let modern = peer
            .peer_info()
            .is_some_and(|i| i.protocol_version.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
        if let (Some(caps), true) = (capabilities, modern) {
            let mut meta = RequestMetaObject::default();
            meta.set_client_capabilities(caps.clone());
            options.meta = Some(meta);
        }
        let mut meta = options.meta.take().unwrap_or_default();
        toolledger_mcp::trace::inject_meta(&mut meta);
        options.meta = (!meta.is_empty()).then_some(meta);
        // rmcp gives every request a progress token of its own; the upstream's progress for
        // this call arrives under it and is routed to the client's token.
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        // Refused before the transport had it: nothing was sent.
        let handle = peer
            .send_request_with_option(request, options)
            .await
            .map_err(|e| UpstreamError::NotSent(UpstreamError::from(e).detail()))?;
        let mut guard = RouteGuard(self.handler.routes.clone(), None);
        if let Some(client) = &route.progress {
            if let Ok(mut routes) = self.handler.routes.lock() {
                routes.insert(handle.progress_token.clone(), client.clone());
            }
            guard.1 = Some(handle.progress_token.clone());
        }
        let mut abandoned = Abandoned(Some((peer.clone(), handle.id.clone())));
        let cancelled = route.cancelled.clone().unwrap_or_default();
        // Leaving early (timeout, cancellation) tells the upstream: `notifications/cancelled`.
        let answer = tokio::select! {
            answer = tokio::time::timeout(timeout, handle.await_response()) => match answer {
                Ok(answer) => {
                    abandoned.0 = None;
                    match answer {
                        Ok(answer) => response(answer),
                        Err(ServiceError::TransportSend(t)) if self.unsent(&t) => {
                            Err(UpstreamError::NotSent(transport_detail(&t)))
                        }
                        Err(e) => Err(e.into()),
                    }
                }
                Err(_) => Err(UpstreamError::Timeout(timeout.as_secs())),
            },
            _ = cancelled.cancelled() => Err(UpstreamError::Cancelled),
        };
        drop(abandoned);
        drop(guard);
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stderr_line_is_kept_up_to_its_cap_and_the_rest_is_counted() {
        let mut input: Vec<u8> = b"short\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 100_000));
        input.extend(b"\nlast");
        let mut reader = tokio::io::BufReader::with_capacity(1024, &input[..]);
        let mut line = Vec::new();
        assert_eq!(
            read_capped_line(&mut reader, &mut line, 10).await.unwrap(),
            Some(0)
        );
        assert_eq!(line, b"short");
        assert_eq!(
            read_capped_line(&mut reader, &mut line, 10).await.unwrap(),
            Some(100_000 - 10)
        );
        assert_eq!(line, b"xxxxxxxxxx");
        assert_eq!(
            read_capped_line(&mut reader, &mut line, 10).await.unwrap(),
            Some(0)
        );
        assert_eq!(line, b"last");
        assert_eq!(
            read_capped_line(&mut reader, &mut line, 10).await.unwrap(),
            None
        );
    }
}
