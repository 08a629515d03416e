//! The upstream MCP server: a child process on stdio that the proxy starts and restarts, or a
//! streamable HTTP endpoint. The proxy is an ordinary MCP client of it (rmcp's), speaking
//! whichever lifecycle the upstream offers: MCP 2026-07-28 when it answers `server/discover`,
//! the `initialize` handshake otherwise.
//!
//! A connection that is gone (the child exited, the HTTP session ended) is replaced on the
//! next use; every start and exit is logged, and the child's stderr goes to the proxy's log,
//! line by line (target `toolledger::upstream`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, ErrorData,
    Implementation, ProtocolVersion, Tool,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, Peer, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::RoleClient;
use tokio::io::AsyncBufReadExt;
use tokio::sync::Mutex;

/// Where the upstream is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpstreamSpec {
    /// A command the proxy starts, talking MCP on its stdin and stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
    },
    /// A streamable HTTP endpoint.
    Http {
        /// Its URL (`https://host/mcp`).
        url: String,
        /// Headers sent with every request (`Authorization: Bearer …` among them).
        headers: Vec<(String, String)>,
    },
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
#[derive(Clone, Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The upstream answered with a JSON-RPC error: passed back to the client unchanged.
    #[error("the upstream answered with a JSON-RPC error")]
    Protocol(ErrorData),
    /// The connection failed or closed before an answer (whether the upstream acted is not
    /// known).
    #[error("the upstream connection failed: {0}")]
    Transport(String),
    /// No answer within the call timeout (the request was cancelled upstream).
    #[error("the upstream did not answer within {0} s")]
    Timeout(u64),
}

impl From<ServiceError> for UpstreamError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::McpError(data) => UpstreamError::Protocol(data),
            ServiceError::Timeout { timeout } => UpstreamError::Timeout(timeout.as_secs()),
            other => UpstreamError::Transport(other.to_string()),
        }
    }
}

struct Connection {
    generation: u64,
    peer: Peer<RoleClient>,
    /// Dropped with the connection: stops the client service (and the child with it).
    _service: Arc<dyn std::any::Any + Send + Sync>,
}

/// A supervised connection to the upstream. Cheap to share (`Arc`).
pub struct Upstream {
    spec: UpstreamSpec,
    lifecycle: Lifecycle,
    current: Mutex<Option<Connection>>,
    starts: AtomicU64,
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
        Arc::new(Upstream {
            spec,
            lifecycle,
            current: Mutex::new(None),
            starts: AtomicU64::new(0),
        })
    }

    /// How many times a connection was made (the child started) so far.
    pub fn starts(&self) -> u64 {
        self.starts.load(Ordering::Relaxed)
    }

    fn mode(&self) -> ClientLifecycleMode {
        let modern = vec![ProtocolVersion::V_2026_07_28];
        match self.lifecycle {
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
        if let Some(c) = current.as_ref() {
            if !c.peer.is_transport_closed() {
                return Ok(c.peer.clone());
            }
            tracing::warn!(target: "toolledger::upstream", generation = c.generation,
                "the upstream connection closed; reconnecting");
        }
        let generation = self.starts.fetch_add(1, Ordering::Relaxed) + 1;
        let connection = self.connect(generation).await?;
        let peer = connection.peer.clone();
        *current = Some(connection);
        Ok(peer)
    }

    async fn connect(&self, generation: u64) -> Result<Connection, UpstreamError> {
        let failed = |e: &dyn std::fmt::Display| {
            tracing::warn!(target: "toolledger::upstream", generation, error = %e,
                "the upstream could not be started");
            UpstreamError::Transport(format!("the upstream could not be started: {e}"))
        };
        match &self.spec {
            UpstreamSpec::Stdio { command, args } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args);
                let (transport, stderr) = TokioChildProcess::builder(cmd)
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|e| failed(&e))?;
                let pid = transport.id();
                if let Some(stderr) = stderr {
                    tokio::spawn(async move {
                        let mut lines = tokio::io::BufReader::new(stderr).lines();
                        while let Ok(Some(line)) = lines.next_line().await {
                            tracing::info!(target: "toolledger::upstream", pid, "{line}");
                        }
                    });
                }
                let service = client_config()
                    .serve_with_lifecycle(transport, self.mode())
                    .await
                    .map_err(|e| failed(&e))?;
                tracing::info!(target: "toolledger::upstream", generation, pid,
                    protocol = ?service.peer().peer_info().map(|i| i.protocol_version.clone()),
                    "upstream started");
                let peer = service.peer().clone();
                Ok(Connection {
                    generation,
                    peer,
                    _service: Arc::new(Mutex::new(service)),
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
                        .map_err(|_| failed(&"an --upstream-header name is invalid"))?;
                    let v = http::HeaderValue::from_str(value)
                        .map_err(|_| failed(&"an --upstream-header value is invalid"))?;
                    custom.insert(n, v);
                }
                let config = config.custom_headers(custom);
                let transport = StreamableHttpClientTransport::from_config(config);
                let service = client_config()
                    .serve_with_lifecycle(transport, self.mode())
                    .await
                    .map_err(|e| failed(&e))?;
                tracing::info!(target: "toolledger::upstream", generation,
                    protocol = ?service.peer().peer_info().map(|i| i.protocol_version.clone()),
                    "upstream connected");
                let peer = service.peer().clone();
                Ok(Connection {
                    generation,
                    peer,
                    _service: Arc::new(Mutex::new(service)),
                })
            }
        }
    }

    /// The upstream's tools (every page).
    pub async fn list_tools(&self) -> Result<Vec<Tool>, UpstreamError> {
        let peer = self.peer().await?;
        Ok(peer.list_all_tools().await?)
    }

    /// One `tools/call`, answered within `timeout` (after which the request is cancelled
    /// upstream and the outcome is [`UpstreamError::Timeout`]).
    pub async fn call_tool(
        &self,
        params: CallToolRequestParams,
        timeout: Duration,
    ) -> Result<CallToolResponse, UpstreamError> {
        let peer = self.peer().await?;
        match tokio::time::timeout(timeout, peer.call_tool_once(params)).await {
            Ok(answer) => Ok(answer?),
            Err(_) => Err(UpstreamError::Timeout(timeout.as_secs())),
        }
    }
}
