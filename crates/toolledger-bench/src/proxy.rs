//! The `proxy` workload: what `toolledger proxy` adds in front of an upstream, measured
//! against the same upstream called directly, in one run.
//!
//! The upstream is the binary's example charge server (`toolledger upstream-example`, one
//! durable row per `charge`, no deduplication of its own); clients talk MCP 2026-07-28 over
//! stdio, `concurrency` requests in flight on one connection (pipelined, matched by id). Five
//! lines per concurrency, each with its own server processes:
//!
//! - `proxy-direct-fresh`: `charge` sent to the upstream directly;
//! - `proxy-fresh`: `charge` through the proxy (guarded; the operation id forwarded in
//!   `_meta`), a new operation id per call: intent, claim, forward, result, each durable;
//!   compared with `proxy-direct-fresh`;
//! - `proxy-fresh-unguarded`: the same through a proxy whose re-plan guard is off
//!   (`replan_window_seconds = 0`) on a ledger of its own; compared with `proxy-direct-fresh`,
//!   so the two fresh lines' ratios show what the guard's lookup costs (the guard's index is
//!   part of the schema, so it is maintained in both);
//! - `proxy-direct-lookup`: `find_charge` of an earlier charge's reference sent to the
//!   upstream directly. The upstream has no replay of its own; a lookup by reference is the
//!   least an upstream that deduplicated itself would do for a retry, and a round trip with
//!   no write;
//! - `proxy-replay`: retries through the proxy of operations it completed before the
//!   measurement (answered from the ledger, never forwarded); compared with
//!   `proxy-direct-lookup`.
//!
//! Proxied lines carry `baseline`, `added_p50_us`, `added_p99_us` and `throughput_ratio`;
//! their `server_peak_rss_mb` and `server_cpu_us_per_op` are the proxy's (peak reset before
//! the measurement), `upstream_cpu_us_per_op` the upstream's, `server_write_bytes_per_op`
//! what the proxy wrote to storage per call; the fresh lines' `ledger_bytes_per_op` is how
//! much the ledger's files grew per call. `cpu_us_per_op` counts this client and the process
//! it talks to.
//!
//! With `--backend postgres` the proxy's ledgers are PostgreSQL schemas of their own
//! (`tl_bench_<random>`, dropped afterwards; the proxy is started with `--database-url` and
//! the schema as its `search_path`); the upstream keeps its SQLite file. `commits_per_op` and
//! `server_write_bytes_per_op` are then absent (the proxy's transactions and writes are the
//! database server's), and `ledger_bytes_per_op` is how much the schema's tables grew, with
//! their indexes and TOAST.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use toolledger::store::sqlite::Synchronous;

use super::mcp::{finish, per_op, process_cpu_of, process_write_bytes_of, McpClient};
use super::report::Report;
use super::run::{drive, Measured};

const BACKEND_ID: &str = "sqlite:bench-proxy";
const PG_BACKEND_ID: &str = "postgres:bench-proxy";
const PRINCIPAL: &str = "bench";

/// The proxy's configuration: `charge` guarded, its operation id forwarded in `_meta`, an
/// unsure charge looked up by it.
const CONFIG: &str = r#"[tools.charge]
forward_operation_id = "_meta"

[tools.charge.reconcile]
tool = "find_charge"
arguments = { reference = "{operation_id}" }
found_when = "/structuredContent/found"
"#;

/// [`CONFIG`] with the re-plan guard off.
fn unguarded_config() -> String {
    CONFIG.replacen(
        "[tools.charge]\n",
        "[tools.charge]\nreplan_window_seconds = 0\n",
        1,
    )
}

/// The files of one concurrency level's lines.
struct Files {
    direct_charges: PathBuf,
    charges: PathBuf,
    ledger: PathBuf,
    config: PathBuf,
    /// The proxy's ledger on PostgreSQL instead of the file `ledger`.
    pg: Option<PgLedger>,
}

/// A proxy's ledger in a PostgreSQL schema of its own.
struct PgLedger {
    schema: super::pg::BenchSchema,
    /// The URL that makes the schema the proxy's `search_path`.
    url: String,
    /// The ledger's state and fingerprint keys (a PostgreSQL ledger keeps no key file).
    keys: [String; 2],
}

impl Files {
    /// The ledger `ledger` and the other files beside it.
    fn beside(ledger: &Path) -> Files {
        Files {
            direct_charges: ledger.with_extension("direct-charges.sqlite"),
            charges: ledger.with_extension("charges.sqlite"),
            ledger: ledger.to_path_buf(),
            config: ledger.with_extension("proxy.toml"),
            pg: None,
        }
    }

    /// Drops the PostgreSQL schema, if the ledger is one.
    async fn drop_schema(&mut self) {
        if let Some(pg) = self.pg.take() {
            let _ = tokio::task::spawn_blocking(move || pg.schema.drop_schema()).await;
        }
    }
}

/// `url` with `search_path` set to `schema` for every session it opens.
fn with_search_path(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20search_path%3D{schema}")
}

fn upstream_command(exe: &Path, charges: &Path, synchronous: Synchronous) -> Vec<String> {
    vec![
        exe.display().to_string(),
        "upstream-example".into(),
        "--db".into(),
        charges.display().to_string(),
        "--sqlite-synchronous".into(),
        synchronous.as_str().into(),
    ]
}

fn direct(exe: &Path, charges: &Path, synchronous: Synchronous) -> tokio::process::Command {
    let mut argv = upstream_command(exe, charges, synchronous).into_iter();
    let mut c = tokio::process::Command::new(argv.next().unwrap_or_default());
    c.args(argv).env_remove("TOOLLEDGER_UPSTREAM_DELAY_MS");
    c
}

fn proxied(exe: &Path, files: &Files, synchronous: Synchronous) -> tokio::process::Command {
    proxied_with(exe, files, synchronous, None)
}

/// [`proxied`], serving its Prometheus metrics at `127.0.0.1:{metrics}` when given.
fn proxied_with(
    exe: &Path,
    files: &Files,
    synchronous: Synchronous,
    metrics: Option<u16>,
) -> tokio::process::Command {
    let metrics = metrics.map(|port| ["--metrics".to_string(), format!("127.0.0.1:{port}")]);
    let mut c = tokio::process::Command::new(exe);
    c.env_remove("TOOLLEDGER_METRICS");
    c.arg("proxy").args(metrics.iter().flatten());
    match &files.pg {
        Some(pg) => c
            .arg("--database-url")
            .arg(&pg.url)
            .args(["--backend-id", PG_BACKEND_ID]),
        None => c
            .arg("--db")
            .arg(&files.ledger)
            .args(["--backend-id", BACKEND_ID])
            .args(["--sqlite-synchronous", synchronous.as_str()]),
    };
    c.args(["--principal", PRINCIPAL])
        .arg("--config")
        .arg(&files.config)
        .arg("--")
        .args(upstream_command(exe, &files.charges, synchronous))
        .env_remove("TOOLLEDGER_UPSTREAM_DELAY_MS")
        .env_remove("TOOLLEDGER_TEST_HOLD_AT")
        .env_remove("TOOLLEDGER_STATE_KEY_HEX")
        .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX");
    if let Some(pg) = &files.pg {
        c.env("TOOLLEDGER_STATE_KEY_HEX", &pg.keys[0])
            .env("TOOLLEDGER_FINGERPRINT_KEY_HEX", &pg.keys[1]);
    }
    c
}

/// Creates the ledger with the bench principal and writes the proxy's configuration.
async fn prepare(files: &mut Files) -> Result<(), &'static str> {
    prepare_with(files, CONFIG, None).await
}

/// [`prepare`] with the configuration `config`; the ledger is a new schema in the PostgreSQL
/// database at `pg_url` when given (kept in `files`).
async fn prepare_with(
    files: &mut Files,
    config: &str,
    pg_url: Option<&str>,
) -> Result<(), &'static str> {
    std::fs::write(&files.config, config).map_err(|_| "BENCH_SETUP_FAILED")?;
    let store: toolledger::store::Store = match pg_url {
        Some(url) => {
            let schema = super::pg::BenchSchema::open_with(
                url,
                PG_BACKEND_ID,
                toolledger_reference::PG_MIGRATIONS,
            )?;
            let store = schema.store();
            let key = || super::random_hex(32).ok_or("BENCH_SETUP_FAILED");
            files.pg = Some(PgLedger {
                url: with_search_path(url, schema.name()),
                keys: [key()?, key()?],
                schema,
            });
            store
        }
        None => toolledger_reference::ledger::open_sqlite(
            &files.ledger,
            Some(BACKEND_ID.to_string()),
            false,
            Synchronous::Full,
        )
        .map_err(|e| e.code())?
        .into(),
    };
    toolledger::authz::PrincipalStore::new(store)
        .add(PRINCIPAL, "bench", &[], &[], false)
        .await
        .map_err(|_| "BENCH_SETUP_FAILED")?;
    Ok(())
}

/// `toolledger proxy` in front of the example upstream, on a new ledger `ledger` (with the
/// bench principal) and the configuration and charges files beside it.
pub(super) async fn prepared(
    ledger: &Path,
    synchronous: Synchronous,
) -> Result<tokio::process::Command, &'static str> {
    let exe = std::env::current_exe().map_err(|_| "BENCH_SERVER_UNAVAILABLE")?;
    let mut files = Files::beside(ledger);
    prepare(&mut files).await?;
    Ok(proxied(&exe, &files, synchronous))
}

/// What a call is expected to answer.
#[derive(Clone, Copy)]
enum Expect {
    /// A charge made now by the upstream itself.
    Charged,
    /// A charge forwarded by the proxy now.
    Fresh,
    /// A charge the proxy answers from its ledger.
    Replayed,
    /// A lookup that found the charge.
    Found,
}

fn as_expected(reply: &Value, expect: Expect) -> bool {
    let result = &reply["result"];
    if result["isError"] != false {
        return false;
    }
    let replayed = &result["_meta"]["io.toolledger/ledger"]["replayed"];
    let charged = result["structuredContent"]["charge_id"].is_i64();
    match expect {
        Expect::Charged => charged,
        Expect::Fresh => charged && replayed == false,
        Expect::Replayed => charged && replayed == true,
        Expect::Found => result["structuredContent"]["found"] == true,
    }
}

/// The upstream a line's calls end at: the server itself, or the proxy's child.
fn upstream_pid(client: &McpClient, through_proxy: bool) -> Option<u32> {
    if through_proxy {
        toolledger_proxy::upstream_pid(client.pid())
    } else {
        Some(client.pid())
    }
}

/// A free local port (for the proxy's metrics listener).
fn free_port() -> Option<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
    listener.local_addr().ok().map(|a| a.port())
}

/// The SQLite writer's commits and the jobs they carried so far, from the proxy's Prometheus
/// metrics at `127.0.0.1:{port}` (`toolledger_store_commit_batch_size`: its count and sum;
/// none yet is 0); `None` when the listener does not answer.
async fn writer_totals(port: u16) -> Option<(u64, u64)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request =
        format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await.ok()?;
    let value = |name: &str| {
        body.lines()
            .filter(|l| l.starts_with(name) && l.contains("backend=\"sqlite\""))
            .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    if !body.starts_with("HTTP/1.1 200") {
        return None;
    }
    // No series yet: nothing was committed.
    let count = value("toolledger_store_commit_batch_size_count").unwrap_or(0.0);
    let sum = value("toolledger_store_commit_batch_size_sum").unwrap_or(0.0);
    Some((count as u64, sum as u64))
}

/// Waits until the proxy's metrics listener at `port` answers.
async fn metrics_up(port: u16) -> bool {
    for _ in 0..200 {
        if writer_totals(port).await.is_some() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    false
}

/// The bytes of the ledger's database file and its WAL.
fn ledger_size(ledger: &Path) -> u64 {
    let size = |p: PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mut wal = ledger.as_os_str().to_owned();
    wal.push("-wal");
    size(ledger.to_path_buf()) + size(PathBuf::from(wal))
}

fn per_op_us(cpu: std::time::Duration, ops: usize) -> f64 {
    (cpu.as_secs_f64() * 1e6 / ops.max(1) as f64 * 10.0).round() / 10.0
}

/// Measures `ops` calls of `tool` with `arguments(i)` at `concurrency`.
async fn measure(
    client: &Arc<McpClient>,
    label: &'static str,
    concurrency: usize,
    ops: usize,
    tool: &'static str,
    arguments: impl Fn(usize) -> Value + Send + Sync + 'static,
    expect: Expect,
) -> Report {
    let through_proxy = matches!(expect, Expect::Fresh | Expect::Replayed);
    // One untimed call first: the server (and the proxy's upstream) are up before the clock
    // starts.
    let _ = client.call("count_charges", json!({})).await;
    let upstream = upstream_pid(client, through_proxy);
    client.reset_peak_rss();
    let server_before = client.cpu();
    let written_before = process_write_bytes_of(client.pid());
    let upstream_before = upstream.map(process_cpu_of);
    let c = client.clone();
    let mut m: Measured = drive(label, concurrency, ops, move |i| {
        let c = c.clone();
        let args = arguments(i);
        async move {
            c.call(tool, args)
                .await
                .is_some_and(|reply| as_expected(&reply, expect))
        }
    })
    .await;
    let server_cpu = client.cpu().saturating_sub(server_before);
    m.cpu += server_cpu;
    let mut r = Report::new(label, concurrency, ops, m);
    r.server_peak_rss_mb = client.peak_rss_mb();
    r.server_cpu_us_per_op = Some(per_op_us(server_cpu, ops));
    r.server_write_bytes_per_op = written_before
        .zip(process_write_bytes_of(client.pid()))
        .map(|(before, after)| per_op(after.saturating_sub(before), ops));
    if through_proxy {
        if let (Some(pid), Some(before)) = (upstream, upstream_before) {
            r.upstream_cpu_us_per_op =
                Some(per_op_us(process_cpu_of(pid).saturating_sub(before), ops));
        }
    }
    r
}

fn charge(i: usize) -> Value {
    json!({"customer": format!("c-{i}"), "amount_cents": 100 + (i % 1000) as i64})
}

/// The key the proxy forwarded operation `op-{i}` of the bench principal under (its scope
/// digest), which the upstream recorded as the charge's reference.
fn upstream_key(i: usize) -> String {
    toolledger::downstream::scope_digest(&toolledger::Scope {
        tenant: "bench".into(),
        subject: PRINCIPAL.into(),
        tool: "charge".into(),
        key: format!("op-{i}"),
    })
}

fn charge_with_id(i: usize) -> Value {
    let mut a = charge(i);
    a["operation_id"] = json!(format!("op-{i}"));
    a
}

/// Runs the five lines at `concurrency` with `ops` calls each; `db` names this level's
/// files (the others sit beside it). The proxy's ledgers are schemas in the PostgreSQL
/// database at `pg_url` when given.
pub async fn run(
    db: PathBuf,
    concurrency: usize,
    ops: usize,
    synchronous: Synchronous,
    pg_url: Option<&str>,
) -> Result<Vec<Report>, &'static str> {
    let mut files = Files::beside(&db);
    let mut unguarded_files = Files::beside(&db.with_extension("unguarded.sqlite"));
    let out = lines(
        &mut files,
        &mut unguarded_files,
        concurrency,
        ops,
        synchronous,
        pg_url,
    )
    .await;
    files.drop_schema().await;
    unguarded_files.drop_schema().await;
    out
}

async fn lines(
    files: &mut Files,
    unguarded_files: &mut Files,
    concurrency: usize,
    ops: usize,
    synchronous: Synchronous,
    pg_url: Option<&str>,
) -> Result<Vec<Report>, &'static str> {
    let exe = std::env::current_exe().map_err(|_| "BENCH_SERVER_UNAVAILABLE")?;
    prepare_with(files, CONFIG, pg_url).await?;

    let client = McpClient::over_stdio(direct(&exe, &files.direct_charges, synchronous))?;
    let direct_fresh = measure(
        &client,
        "proxy-direct-fresh",
        concurrency,
        ops,
        "charge",
        charge,
        Expect::Charged,
    )
    .await;
    finish(client).await;

    prepare_with(unguarded_files, &unguarded_config(), pg_url).await?;
    let files: &Files = files;
    let mut fresh_lines = Vec::with_capacity(2);
    for (label, files) in [
        ("proxy-fresh-unguarded", &*unguarded_files),
        ("proxy-fresh", files),
    ] {
        let on_pg = files.pg.is_some();
        let size_before = match &files.pg {
            Some(pg) => pg.schema.size().await,
            None => Some(ledger_size(&files.ledger)),
        };
        // The SQLite writer's commits; PostgreSQL's transactions are the server's.
        let port = free_port().filter(|_| !on_pg);
        let client = McpClient::over_stdio(proxied_with(&exe, files, synchronous, port))?;
        // The writer's commits, around the measurement (the untimed first call included).
        let _ = client.call("count_charges", json!({})).await;
        let up = match port {
            Some(p) => metrics_up(p).await,
            None => false,
        };
        let totals_before = match (port, up) {
            (Some(p), true) => writer_totals(p).await,
            _ => None,
        };
        let mut line = measure(
            &client,
            label,
            concurrency,
            ops,
            "charge",
            charge_with_id,
            Expect::Fresh,
        )
        .await
        .compared_with(&direct_fresh);
        let totals_after = match (port, totals_before) {
            (Some(p), Some(_)) => writer_totals(p).await,
            _ => None,
        };
        if let (Some((c0, j0)), Some((c1, j1))) = (totals_before, totals_after) {
            line = line.with_commits(c1.saturating_sub(c0), j1.saturating_sub(j0));
        }
        finish(client).await;
        let size_after = match &files.pg {
            Some(pg) => pg.schema.size().await,
            None => Some(ledger_size(&files.ledger)),
        };
        if on_pg {
            // What the proxy process wrote is not the ledger's: the server writes that.
            line.server_write_bytes_per_op = None;
        }
        if let (Some(before), Some(after)) = (size_before, size_after) {
            line.ledger_bytes_per_op = Some(per_op(after.saturating_sub(before), ops));
        }
        fresh_lines.push(line);
    }
    let fresh = fresh_lines.pop().expect("the guarded line");
    let unguarded = fresh_lines.pop().expect("the unguarded line");

    // Retries and lookups cycle through the first operations the fresh line completed.
    let distinct = ops.clamp(1, 1000);
    let client = McpClient::over_stdio(direct(&exe, &files.charges, synchronous))?;
    let lookup = measure(
        &client,
        "proxy-direct-lookup",
        concurrency,
        ops,
        "find_charge",
        move |i| json!({"reference": upstream_key(i % distinct)}),
        Expect::Found,
    )
    .await;
    finish(client).await;

    let client = McpClient::over_stdio(proxied(&exe, files, synchronous))?;
    let replay = measure(
        &client,
        "proxy-replay",
        concurrency,
        ops,
        "charge",
        move |i| charge_with_id(i % distinct),
        Expect::Replayed,
    )
    .await
    .compared_with(&lookup);
    finish(client).await;

    Ok(vec![direct_fresh, unguarded, fresh, lookup, replay])
}
