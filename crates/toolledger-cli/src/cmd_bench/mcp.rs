//! The `mcp-stdio` workload: real `tools/call` round trips against `toolledger serve` over
//! stdio (MCP 2026-07-28 requests with per-request `_meta`), many requests in flight on one
//! connection. The tool is the reference `create_automation` (an inline effect: one row in
//! `automations` committed with its ledger row). `fresh` sends new request ids; `replay`
//! repeats request ids that were applied before the measurement.
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

const BACKEND_ID: &str = "sqlite:bench-mcp";
const PRINCIPAL: &str = "bench";

type Pending = Arc<Mutex<HashMap<i64, oneshot::Sender<Value>>>>;

/// One `toolledger serve` child and a multiplexed JSON-RPC client over its stdio.
struct McpClient {
    child: Child,
    pid: u32,
    lines: Option<mpsc::UnboundedSender<String>>,
    pending: Pending,
    next_id: AtomicI64,
}

impl McpClient {
    async fn start(db: &Path, synchronous: Synchronous) -> Result<Arc<McpClient>, &'static str> {
        let exe = std::env::current_exe().map_err(|_| "BENCH_SERVER_UNAVAILABLE")?;
        let mut child = tokio::process::Command::new(exe)
            .arg("serve")
            .arg("--db")
            .arg(db)
            .args(["--backend-id", BACKEND_ID, "--principal", PRINCIPAL])
            .args(["--sqlite-synchronous", synchronous.as_str()])
            .env_remove("TOOLLEDGER_STATE_KEY_HEX")
            .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|_| "BENCH_SERVER_UNAVAILABLE")?;
        let pid = child.id().ok_or("BENCH_SERVER_UNAVAILABLE")?;
        let stdin = child.stdin.take().ok_or("BENCH_SERVER_UNAVAILABLE")?;
        let stdout = child.stdout.take().ok_or("BENCH_SERVER_UNAVAILABLE")?;
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));

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
                let waiter = readers.lock().ok().and_then(|mut p| p.remove(&id));
                if let Some(w) = waiter {
                    let _ = w.send(reply);
                }
            }
            // The server went away: every waiter learns it by its dropped sender.
            if let Ok(mut p) = readers.lock() {
                p.clear();
            }
        });
        Ok(Arc::new(McpClient {
            child,
            pid,
            lines: Some(tx),
            pending,
            next_id: AtomicI64::new(1),
        }))
    }

    /// One `tools/call`; the JSON-RPC reply, or `None` if the server went away.
    async fn call(&self, name: &str, arguments: Value) -> Option<Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "tools/call",
            "params": {
                "name": name,
                "arguments": arguments,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                    "io.modelcontextprotocol/clientInfo": {"name": "toolledger-bench",
                                                           "version": "1"},
                },
            },
        });
        let (tx, rx) = oneshot::channel();
        self.pending.lock().ok()?.insert(id, tx);
        self.lines.as_ref()?.send(request.to_string()).ok()?;
        rx.await.ok()
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
        let result = &reply["result"];
        result["isError"] == false && result["structuredContent"]["replayed"] == replayed
    }

    fn peak_rss_mb(&self) -> Option<f64> {
        peak_rss_mb(&self.pid.to_string())
    }

    fn reset_peak_rss(&self) {
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5");
    }

    fn cpu(&self) -> Duration {
        process_cpu_of(self.pid)
    }

    /// Closes the server's stdin and waits for it to exit.
    async fn finish(mut self) {
        self.lines.take();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        let _ = self.child.kill().await;
    }
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

/// User + system CPU time of process `pid` so far, from `/proc/<pid>/stat`.
fn process_cpu_of(pid: u32) -> Duration {
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

/// Creates the database with the bench principal (scope `automation:write`).
async fn prepare_db(db: &Path) -> Result<(), &'static str> {
    let store = crate::common::open_store(db, Some(BACKEND_ID.to_string()), false)
        .map_err(|e| e.cli_code())?;
    toolledger::authz::PrincipalStore::new(store)
        .add(
            PRINCIPAL,
            "bench",
            &[],
            &["automation:write".to_string()],
            false,
        )
        .await
        .map_err(|_| "BENCH_SETUP_FAILED")?;
    Ok(())
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
    r.server_cpu_us_per_op =
        Some((server_cpu.as_secs_f64() * 1e6 / ops.max(1) as f64 * 10.0).round() / 10.0);
    r
}

/// Runs `mcp-stdio` fresh and replay at `concurrency` with `ops` calls each; `db` names the
/// database of this line (the replay line uses a second file beside it).
pub async fn run(
    db: PathBuf,
    concurrency: usize,
    ops: usize,
    synchronous: Synchronous,
) -> Result<Vec<Report>, &'static str> {
    let mut reports = Vec::with_capacity(2);

    prepare_db(&db).await?;
    let client = McpClient::start(&db, synchronous).await?;
    let fresh = measure(
        &client,
        "mcp-stdio-fresh",
        concurrency,
        ops,
        |i| format!("fresh-{i}"),
        false,
    )
    .await;
    finish(client).await;
    reports.push(fresh);

    let replay_db = db.with_extension("replay.sqlite");
    prepare_db(&replay_db).await?;
    let client = McpClient::start(&replay_db, synchronous).await?;
    let distinct = ops.clamp(1, 1000);
    let seeded = drive("mcp-seed", 64, distinct, {
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
        "mcp-stdio-replay",
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

async fn finish(client: Arc<McpClient>) {
    match Arc::try_unwrap(client) {
        Ok(c) => c.finish().await,
        Err(shared) => drop(shared),
    }
}
