//! The `mcp-stdio` and `mcp-http` workloads: real `tools/call` round trips against
//! `toolledger serve` (MCP 2026-07-28 requests with per-request `_meta`). `mcp-stdio` keeps
//! many requests in flight on one stdio connection; `mcp-http` serves streamable HTTP
//! (`serve --http`, JSON responses) to as many HTTP/1.1 keep-alive connections as there are
//! callers, each request carrying a bearer token that the server maps to its principal. The
//! tool is the reference `create_automation` (an inline effect: one row in `automations`
//! committed with its ledger row). `fresh` sends new request ids; `replay` repeats request ids
//! that were applied before the measurement.
//!
//! `python-sdk` is the baseline both are compared with: the same calls over stdio to a server
//! written with the official Python SDK's `MCPServer` (`python/sdk_baseline.py`), whose one
//! tool does by hand what the ledger does: a SQLite lookup-or-insert of the request id under a
//! lock, WAL and `synchronous=FULL`. It runs under the interpreter `--python` names, which
//! must have `mcp` installed.
//!
//! Each line runs its own server process, so `server_peak_rss_mb` is that server's peak;
//! `cpu_us_per_op` counts this client and the server together.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::process::{Child, ChildStdin};
use tokio::sync::{mpsc, oneshot};
use toolledger::store::sqlite::Synchronous;

use super::report::{peak_rss_mb, Report};
use super::run::{drive, Measured};

pub(super) const BACKEND_ID: &str = "sqlite:bench-mcp";
pub(super) const PRINCIPAL: &str = "bench";

/// The waiters of the requests in flight; `None` once the server went away, so a request
/// made after that is answered at once.
type Pending = Arc<Mutex<Option<HashMap<i64, oneshot::Sender<Value>>>>>;

/// The per-request metadata of an MCP 2026-07-28 client.
fn request_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "toolledger-bench", "version": "1"},
    })
}

/// Whether a `tools/call` reply is the `create_automation` answer a workload expects.
fn as_expected(reply: &Value, replayed: bool) -> bool {
    let result = &reply["result"];
    result["isError"] == false && result["structuredContent"]["replayed"] == replayed
}

/// How the bench reaches one `toolledger serve` process.
enum Transport {
    /// JSON-RPC lines over the child's stdin/stdout, multiplexed by request id.
    Stdio {
        lines: Option<mpsc::UnboundedSender<String>>,
        pending: Pending,
    },
    /// Streamable HTTP: one keep-alive HTTP/1.1 connection per caller, taken from a pool (a
    /// new one when the pool is empty).
    Http {
        connections: tokio::sync::Mutex<Vec<HttpConnection>>,
        authority: String,
        authorization: String,
    },
}

pub(super) type HttpConnection =
    hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// Opens one HTTP/1.1 connection to `addr` (its driver runs on the runtime).
pub(super) async fn http_connection(addr: &str) -> Option<HttpConnection> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let _ = stream.set_nodelay(true);
    let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    Some(send)
}

/// One `toolledger serve` child and a client over its stdio or its HTTP endpoint.
pub(super) struct McpClient {
    child: Child,
    pid: u32,
    transport: Transport,
    next_id: AtomicI64,
}

/// Which server and transport a workload measures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wire {
    /// `serve` on stdio (`mcp-stdio`).
    Stdio,
    /// `serve --http` with bearer tokens (`mcp-http`).
    Http,
    /// The Python SDK baseline on stdio, under this interpreter (`python-sdk`).
    PythonSdk(PathBuf),
}

/// The baseline server of `python-sdk`, written beside its database when the line runs.
const SDK_BASELINE: &str = include_str!("../python/sdk_baseline.py");

impl Wire {
    fn label(&self, line: &str) -> &'static str {
        match (self, line) {
            (Wire::Stdio, "fresh") => "mcp-stdio-fresh",
            (Wire::Stdio, _) => "mcp-stdio-replay",
            (Wire::Http, "fresh") => "mcp-http-fresh",
            (Wire::Http, _) => "mcp-http-replay",
            (Wire::PythonSdk(_), "fresh") => "python-sdk-fresh",
            (Wire::PythonSdk(_), _) => "python-sdk-replay",
        }
    }
}

/// The ledger a `serve` child runs on.
pub(super) enum ServerDb {
    /// A SQLite file.
    Sqlite {
        /// The ledger file.
        path: PathBuf,
        /// Its `synchronous` mode.
        synchronous: Synchronous,
    },
    /// A PostgreSQL database (a URL whose `options` may set the `search_path`); `dir` holds the
    /// files the server keeps beside its ledger.
    Postgres {
        /// The connection URL.
        url: String,
        /// The ledger's backend id.
        backend_id: String,
        /// A directory for the server's side files.
        dir: PathBuf,
    },
}

impl McpClient {
    async fn start(
        db: &Path,
        synchronous: Synchronous,
        wire: &Wire,
        token: Option<String>,
        connections: usize,
    ) -> Result<Arc<McpClient>, &'static str> {
        if let Wire::PythonSdk(python) = wire {
            let script = db.with_extension("py");
            std::fs::write(&script, SDK_BASELINE).map_err(|_| "DATABASE_IO_ERROR")?;
            let mut command = tokio::process::Command::new(python);
            command.arg(script).env("BASELINE_DB", db);
            return McpClient::over_stdio(command);
        }
        let db = ServerDb::Sqlite {
            path: db.to_path_buf(),
            synchronous,
        };
        if *wire == Wire::Stdio {
            let mut command = serve_command(&db)?;
            command.args(["--principal", PRINCIPAL]);
            return McpClient::over_stdio(command);
        }
        McpClient::start_http(&db, &[], token.ok_or("BENCH_SETUP_FAILED")?, connections).await
    }

    /// Starts `serve --http` on `db` with `extra` flags and opens `connections` keep-alive
    /// connections to it, each request carrying `token`.
    pub(super) async fn start_http(
        db: &ServerDb,
        extra: &[String],
        token: String,
        connections: usize,
    ) -> Result<Arc<McpClient>, &'static str> {
        let mut command = serve_command(db)?;
        command
            .args(["--http", "127.0.0.1:0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|_| "BENCH_SERVER_UNAVAILABLE")?;
        let pid = child.id().ok_or("BENCH_SERVER_UNAVAILABLE")?;
        let transport = http_transport(&mut child, &token, connections).await?;
        Ok(Arc::new(McpClient {
            child,
            pid,
            transport,
            next_id: AtomicI64::new(1),
        }))
    }

    /// Starts `command`, an MCP server on stdio (its stderr discarded), and a client of it that
    /// keeps any number of requests in flight on the one connection.
    pub(super) fn over_stdio(
        mut command: tokio::process::Command,
    ) -> Result<Arc<McpClient>, &'static str> {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|_| "BENCH_SERVER_UNAVAILABLE")?;
        let pid = child.id().ok_or("BENCH_SERVER_UNAVAILABLE")?;
        let stdin = child.stdin.take().ok_or("BENCH_SERVER_UNAVAILABLE")?;
        let stdout = child.stdout.take().ok_or("BENCH_SERVER_UNAVAILABLE")?;
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));

        let (tx, rx) = mpsc::unbounded_channel::<String>();
        tokio::spawn(write_lines(stdin, rx));
        let readers = pending.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(reply) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let Some(id) = reply.get("id").and_then(Value::as_i64) else {
                    continue;
                };
                let waiter = readers
                    .lock()
                    .ok()
                    .and_then(|mut p| p.as_mut()?.remove(&id));
                if let Some(w) = waiter {
                    let _ = w.send(reply);
                }
            }
            // The server went away: every waiter learns it by its dropped sender, and a
            // request made from now on at once.
            if let Ok(mut p) = readers.lock() {
                *p = None;
            }
        });
        Ok(Arc::new(McpClient {
            child,
            pid,
            transport: Transport::Stdio {
                lines: Some(tx),
                pending,
            },
            next_id: AtomicI64::new(1),
        }))
    }

    /// One `tools/call`; the JSON-RPC reply, or `None` if the server went away.
    pub(super) async fn call(&self, name: &str, arguments: Value) -> Option<Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "_meta": request_meta()},
        });
        match &self.transport {
            Transport::Stdio { lines, pending } => {
                let (tx, rx) = oneshot::channel();
                pending.lock().ok()?.as_mut()?.insert(id, tx);
                lines.as_ref()?.send(request.to_string()).ok()?;
                rx.await.ok()
            }
            Transport::Http {
                connections,
                authority,
                authorization,
            } => {
                let pooled = connections.lock().await.pop();
                let mut conn = match pooled {
                    Some(conn) => conn,
                    None => http_connection(authority).await?,
                };
                let req = hyper::Request::post("/mcp")
                    .header("host", authority.as_str())
                    .header("authorization", authorization.as_str())
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .header("mcp-protocol-version", "2026-07-28")
                    .header("mcp-method", "tools/call")
                    .header("mcp-name", name)
                    .body(http_body_util::Full::new(bytes::Bytes::from(
                        request.to_string(),
                    )))
                    .ok()?;
                let reply = async {
                    conn.ready().await.ok()?;
                    let response = conn.send_request(req).await.ok()?;
                    let body = http_body_util::BodyExt::collect(response.into_body())
                        .await
                        .ok()?
                        .to_bytes();
                    serde_json::from_slice::<Value>(&body).ok()
                }
                .await;
                if reply.is_some() {
                    connections.lock().await.push(conn);
                }
                reply
            }
        }
    }

    /// `create_automation` under `request_id`; whether it ended as expected (`replayed`).
    async fn create_automation(&self, request_id: &str, replayed: bool) -> bool {
        let Some(reply) = self
            .call(
                "create_automation",
                json!({"request_id": request_id, "interval_minutes": 30}),
            )
            .await
        else {
            return false;
        };
        as_expected(&reply, replayed)
    }

    /// The server's process id.
    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    pub(super) fn peak_rss_mb(&self) -> Option<f64> {
        peak_rss_mb(&self.pid.to_string())
    }

    pub(super) fn reset_peak_rss(&self) {
        super::report::reset_peak_rss_of(&self.pid.to_string());
    }

    pub(super) fn cpu(&self) -> Duration {
        process_cpu_of(self.pid)
    }

    /// Stops the server: closes its stdin (stdio) or sends SIGTERM (HTTP: graceful shutdown),
    /// and waits for it to exit.
    async fn finish(mut self) {
        match &mut self.transport {
            Transport::Stdio { lines, .. } => {
                lines.take();
            }
            Transport::Http { connections, .. } => {
                connections.lock().await.clear();
                // SAFETY: kill has no memory preconditions; the pid is our own child's.
                unsafe {
                    libc::kill(self.pid as i32, libc::SIGTERM);
                }
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        let _ = self.child.kill().await;
    }
}

/// `toolledger serve` on `db` (no transport flags yet). On PostgreSQL the server's keys come
/// from the environment, fresh for each run.
pub(super) fn serve_command(db: &ServerDb) -> Result<tokio::process::Command, &'static str> {
    let exe = std::env::current_exe().map_err(|_| "BENCH_SERVER_UNAVAILABLE")?;
    let mut command = tokio::process::Command::new(exe);
    command.arg("serve");
    match db {
        ServerDb::Sqlite { path, synchronous } => {
            command
                .arg("--db")
                .arg(path)
                .args(["--backend-id", BACKEND_ID])
                .args(["--sqlite-synchronous", synchronous.as_str()])
                .env_remove("TOOLLEDGER_STATE_KEY_HEX")
                .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX");
        }
        ServerDb::Postgres {
            url,
            backend_id,
            dir,
        } => {
            command
                .arg("--db")
                .arg(dir.join("serve.sqlite"))
                .args(["--database-url", url])
                .args(["--backend-id", backend_id])
                .env("TOOLLEDGER_STATE_KEY_HEX", key_hex()?)
                .env("TOOLLEDGER_FINGERPRINT_KEY_HEX", key_hex()?);
        }
    }
    Ok(command)
}

/// A fresh 32-byte key in hex.
fn key_hex() -> Result<String, &'static str> {
    crate::random_hex(32).ok_or("BENCH_SETUP_FAILED")
}

/// Reads the address `serve --http` announces on stderr and opens `connections` keep-alive
/// connections to it.
async fn http_transport(
    child: &mut Child,
    token: &str,
    connections: usize,
) -> Result<Transport, &'static str> {
    let stderr = child.stderr.take().ok_or("BENCH_SERVER_UNAVAILABLE")?;
    let mut lines = BufReader::new(stderr).lines();
    let listening = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(url) = serde_json::from_str::<Value>(&line)
                .ok()
                .and_then(|v| v["listening"].as_str().map(str::to_string))
            {
                return Some(url);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .ok_or("BENCH_SERVER_UNAVAILABLE")?;
    // Keep draining stderr so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let authority = listening
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_string();
    let mut pool = Vec::with_capacity(connections);
    for _ in 0..connections.max(1) {
        pool.push(
            http_connection(&authority)
                .await
                .ok_or("BENCH_SERVER_UNAVAILABLE")?,
        );
    }
    Ok(Transport::Http {
        connections: tokio::sync::Mutex::new(pool),
        authority,
        authorization: format!("Bearer {token}"),
    })
}

/// Writes request lines in order, flushing only when no more are queued (one write for many
/// requests under load).
async fn write_lines(stdin: ChildStdin, mut rx: mpsc::UnboundedReceiver<String>) {
    let mut out = BufWriter::new(stdin);
    while let Some(line) = rx.recv().await {
        let mut next = Some(line);
        while let Some(l) = next {
            if out.write_all(l.as_bytes()).await.is_err() || out.write_all(b"\n").await.is_err() {
                return;
            }
            next = rx.try_recv().ok();
        }
        if out.flush().await.is_err() {
            return;
        }
    }
}

/// Bytes process `pid` caused to be written to storage so far (`write_bytes` of
/// `/proc/<pid>/io`), when the kernel reports it.
pub(super) fn process_write_bytes_of(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// `bytes` over `ops`, to one decimal.
pub(super) fn per_op(bytes: u64, ops: usize) -> f64 {
    (bytes as f64 / ops.max(1) as f64 * 10.0).round() / 10.0
}

/// User + system CPU time of process `pid` so far, from `/proc/<pid>/stat`.
pub(super) fn process_cpu_of(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // fields[0] is the state (field 3), so field n is fields[n - 3].
    let total = ticks(11) + ticks(12);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Duration::from_micros(total * 1_000_000 / hz)
}

/// Creates the database with the bench principal (scope `automation:write`); with `token`, the
/// principal gets a bearer token, which is returned.
pub(super) async fn prepare_db(db: &Path, token: bool) -> Result<Option<String>, &'static str> {
    let store = toolledger_reference::ledger::open_sqlite(
        db,
        Some(BACKEND_ID.to_string()),
        false,
        Synchronous::Full,
    )
    .map_err(|e| e.code())?;
    add_principal(store.into(), token).await
}

/// Adds the bench principal (scope `automation:write`) to the ledger `store`; with `token`,
/// the principal gets a bearer token, which is returned.
pub(super) async fn add_principal(
    store: toolledger::store::Store,
    token: bool,
) -> Result<Option<String>, &'static str> {
    toolledger::authz::PrincipalStore::new(store)
        .add(
            PRINCIPAL,
            "bench",
            &[],
            &["automation:write".to_string()],
            token,
        )
        .await
        .map_err(|_| "BENCH_SETUP_FAILED")
}

async fn measure(
    client: &Arc<McpClient>,
    label: &'static str,
    concurrency: usize,
    ops: usize,
    key: impl Fn(usize) -> String + Send + Sync + 'static,
    replayed: bool,
) -> Report {
    client.reset_peak_rss();
    let server_cpu_before = client.cpu();
    let written_before = process_write_bytes_of(client.pid());
    let c = client.clone();
    let mut m: Measured = drive(label, concurrency, ops, move |i| {
        let c = c.clone();
        let k = key(i);
        async move { c.create_automation(&k, replayed).await }
    })
    .await;
    let server_cpu = client.cpu().saturating_sub(server_cpu_before);
    m.cpu += server_cpu;
    let mut r = Report::new(label, concurrency, ops, m);
    r.server_peak_rss_mb = client.peak_rss_mb();
    r.server_write_bytes_per_op = written_before
        .zip(process_write_bytes_of(client.pid()))
        .map(|(before, after)| per_op(after.saturating_sub(before), ops));
    r.server_cpu_us_per_op =
        Some((server_cpu.as_secs_f64() * 1e6 / ops.max(1) as f64 * 10.0).round() / 10.0);
    r
}

/// Runs `mcp-stdio`, `mcp-http` or `python-sdk` fresh and replay at `concurrency` with `ops`
/// calls each; `db` names the database of this line (the replay line uses a second file beside
/// it).
pub async fn run(
    db: PathBuf,
    concurrency: usize,
    ops: usize,
    synchronous: Synchronous,
    wire: Wire,
) -> Result<Vec<Report>, &'static str> {
    let mut reports = Vec::with_capacity(2);
    let http = wire == Wire::Http;
    let ledger = !matches!(wire, Wire::PythonSdk(_));

    let token = if ledger {
        prepare_db(&db, http).await?
    } else {
        None
    };
    let client = McpClient::start(&db, synchronous, &wire, token, concurrency).await?;
    // One call before the clock starts: the server is up (an interpreter takes a while).
    if !client.create_automation("warm-up", false).await {
        finish(client).await;
        return Err("BENCH_SERVER_UNAVAILABLE");
    }
    let fresh = measure(
        &client,
        wire.label("fresh"),
        concurrency,
        ops,
        |i| format!("fresh-{i}"),
        false,
    )
    .await;
    finish(client).await;
    reports.push(fresh);

    let replay_db = db.with_extension("replay.sqlite");
    let token = if ledger {
        prepare_db(&replay_db, http).await?
    } else {
        None
    };
    let seeders = if http { concurrency.max(1) } else { 64 };
    let client = McpClient::start(&replay_db, synchronous, &wire, token, seeders).await?;
    let distinct = ops.clamp(1, 1000);
    let seeded = drive("mcp-seed", seeders, distinct, {
        let c = client.clone();
        move |i| {
            let c = c.clone();
            async move { c.create_automation(&format!("seed-{i}"), false).await }
        }
    })
    .await;
    if seeded.failed > 0 {
        finish(client).await;
        return Err("BENCH_SEED_FAILED");
    }
    let replay = measure(
        &client,
        wire.label("replay"),
        concurrency,
        ops,
        move |i| format!("seed-{}", i % distinct),
        true,
    )
    .await;
    finish(client).await;
    reports.push(replay);
    Ok(reports)
}

/// Stops the client's server once no caller holds the client any more.
pub(super) async fn finish(client: Arc<McpClient>) {
    match Arc::try_unwrap(client) {
        Ok(c) => c.finish().await,
        Err(shared) => drop(shared),
    }
}
