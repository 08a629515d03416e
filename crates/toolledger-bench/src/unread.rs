//! The `overload-stdio` workload: a stdio client that never reads its answers.
//!
//! For `toolledger serve` and for `toolledger proxy` (in front of the example upstream), each
//! in its own process on a fresh SQLite ledger: the client completes the `initialize`
//! handshake, then for `--overload-seconds` writes `tools/list` requests as fast as the server
//! takes them and reads nothing. A server that stops reading requests while its answers wait
//! (back-pressure) soon blocks the client's writes; one that keeps reading buffers answers
//! without bound. The server's resident memory is sampled once a second. Afterwards the client
//! reads again: every request written must be answered (`lost` is 0).
//!
//! One JSON line per server: requests written, whether the writes were blocked at the end,
//! the server's resident memory before, once a second, at its peak (`VmHWM`) and after the
//! answers were read, and how many answers arrived.

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout};
use toolledger::store::sqlite::Synchronous;

use super::mcp::{self, ServerDb};
use super::proxy;
use super::report::{peak_rss_mb, print_line, reset_peak_rss_of, rss_mb};

/// How long the client waits for the answers it did not read, once it reads again.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

/// One `overload-stdio` line.
#[derive(Debug, Serialize)]
pub struct UnreadReport {
    workload: &'static str,
    /// `serve` or `proxy`.
    server: &'static str,
    backend: &'static str,
    synchronous: &'static str,
    seconds: f64,
    /// `tools/list` requests the server took (written whole) while nothing was read.
    requests_written: u64,
    /// Whether the last write was still waiting for the server when the time was up.
    writes_blocked_at_end: bool,
    /// Seconds into the run of the last request the server took.
    last_write_after_s: f64,
    server_rss_mb_before: f64,
    /// Once a second while nothing was read.
    server_rss_mb_per_second: Vec<f64>,
    server_peak_rss_mb: Option<f64>,
    server_rss_mb_after: f64,
    /// Answers read afterwards (every request's, when nothing was lost).
    answered: u64,
    lost: u64,
}

impl UnreadReport {
    /// Prints the line on stdout.
    pub fn print(&self) {
        print_line(self, self.workload);
    }
}

/// Runs the workload against `serve` and then `proxy`, each on a ledger beside `db`.
pub async fn run(
    db: &Path,
    seconds: f64,
    synchronous: Synchronous,
) -> Result<Vec<UnreadReport>, &'static str> {
    let serve_db = db.with_extension("serve.sqlite");
    mcp::prepare_db(&serve_db, false).await?;
    let mut serve = mcp::serve_command(&ServerDb::Sqlite {
        path: serve_db,
        synchronous,
    })?;
    serve.args(["--principal", mcp::PRINCIPAL]);
    let proxy = proxy::prepared(&db.with_extension("proxy.sqlite"), synchronous).await?;
    let mut out = Vec::new();
    for (server, command) in [("serve", serve), ("proxy", proxy)] {
        let mut report = unread(command, seconds).await?;
        report.server = server;
        report.synchronous = synchronous.as_str();
        out.push(report);
    }
    Ok(out)
}

async fn unread(
    mut command: tokio::process::Command,
    seconds: f64,
) -> Result<UnreadReport, &'static str> {
    let unavailable = "BENCH_SERVER_UNAVAILABLE";
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|_| unavailable)?;
    let pid = child.id().ok_or(unavailable)?.to_string();
    let mut stdin = child.stdin.take().ok_or(unavailable)?;
    let mut stdout = BufReader::new(child.stdout.take().ok_or(unavailable)?);

    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "toolledger-bench", "version": env!("CARGO_PKG_VERSION")}}});
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    stdin
        .write_all(format!("{initialize}\n{initialized}\n").as_bytes())
        .await
        .map_err(|_| unavailable)?;
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(60), stdout.read_line(&mut line))
        .await
        .map_err(|_| unavailable)?
        .map_err(|_| unavailable)?;
    if serde_json::from_str::<Value>(&line).map_or(true, |v| v.get("result").is_none()) {
        return Err(unavailable);
    }
    reset_peak_rss_of(&pid);
    let before = rss_mb(&pid);

    // The sampler: the server's memory once a second until the writer stops.
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (done, pid) = (done.clone(), pid.clone());
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            while !done.load(Ordering::Relaxed) {
                tick.tick().await;
                samples.push(rss_mb(&pid));
            }
            samples
        })
    };
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(seconds);
    let mut last_write = 0.0;
    let mut written = 0u64;
    let mut blocked = false;
    loop {
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        let request = format!(
            "{}\n",
            json!({"jsonrpc": "2.0", "id": written + 1, "method": "tools/list"})
        );
        // A line shorter than PIPE_BUF is written whole or not at all.
        match tokio::time::timeout_at(deadline, stdin.write_all(request.as_bytes())).await {
            Ok(Ok(())) => {
                written += 1;
                last_write = started.elapsed().as_secs_f64();
            }
            Ok(Err(_)) => return Err("BENCH_FAILED"),
            Err(_) => {
                blocked = true;
                break;
            }
        }
    }
    done.store(true, Ordering::Relaxed);
    let per_second = sampler.await.unwrap_or_default();
    let peak = peak_rss_mb(&pid);

    let answered = drain(&mut stdout, written).await;
    let after = rss_mb(&pid);
    drop(stdin);
    stop(child).await;
    Ok(UnreadReport {
        workload: "overload-stdio",
        server: "",
        backend: "sqlite",
        synchronous: "",
        seconds,
        requests_written: written,
        writes_blocked_at_end: blocked,
        last_write_after_s: (last_write * 1000.0).round() / 1000.0,
        server_rss_mb_before: before,
        server_rss_mb_per_second: per_second,
        server_peak_rss_mb: peak,
        server_rss_mb_after: after,
        answered,
        lost: written.saturating_sub(answered),
    })
}

/// Reads answers until request `last`'s arrives (or [`DRAIN_LIMIT`] passes); how many
/// `tools/list` answers arrived.
async fn drain(stdout: &mut BufReader<ChildStdout>, last: u64) -> u64 {
    let mut answered = 0u64;
    let mut line = String::new();
    let until = tokio::time::Instant::now() + DRAIN_LIMIT;
    while answered < last {
        line.clear();
        match tokio::time::timeout_at(until, stdout.read_line(&mut line)).await {
            Ok(Ok(n)) if n > 0 => {
                let answer = serde_json::from_str::<Value>(&line).ok();
                let listed = answer
                    .as_ref()
                    .and_then(|a| a.pointer("/result/tools"))
                    .is_some_and(Value::is_array);
                if listed {
                    answered += 1;
                }
            }
            _ => break,
        }
    }
    answered
}

/// Lets the server end on its closed stdin, then kills it.
async fn stop(mut child: Child) {
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}
