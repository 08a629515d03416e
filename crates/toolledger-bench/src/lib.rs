//! The benchmark harness behind `toolledger bench`: throughput and latency of the ledger's
//! hot paths. The `toolledger` binary links it only with its `bench` feature (on by default
//! for a build from source; the packaged binaries leave it out), and [`run`] is the whole
//! entry point: parsed [`BenchArgs`] in, one JSON line per workload on stdout.
//!
//! Every workload runs against its own fresh database file in `--db-dir` (default: the system
//! temporary directory), with the store's production pragmas (`journal_mode=WAL`,
//! `synchronous=FULL`). One JSON line per workload goes to stdout; a progress bar goes to
//! stderr only when stderr is a terminal.
//!
//! Workloads:
//! - `ceiling`: a raw one-row `INSERT` + `COMMIT` loop on one connection with the same pragmas
//!   on the same disk, the durable single-commit ceiling every other line is compared with. It
//!   is sequential by definition and always runs at concurrency 1.
//! - `fresh`: distinct keys through [`Engine::execute_inline`] with an inline effect inserting
//!   one row; each call is durable before it is answered (group commit shares the fsyncs).
//! - `replay`: exact retries of already-applied operations (the read-pool fast path).
//! - `conflict`: a known key with different arguments (`operation_conflict`, read path).
//! - `mcp-stdio`: real `tools/call` round trips against `toolledger serve` over stdio, as
//!   two lines, `mcp-stdio-fresh` and `mcp-stdio-replay` (see [`mcp`]).
//! - `mcp-http`: the same against `toolledger serve --http` with bearer tokens, one keep-alive
//!   connection per caller: `mcp-http-fresh` and `mcp-http-replay`.
//! - `outbox-drain`: accepted deferred operations delivered by worker calls (see [`outbox`]).
//! - `operations-list`: the first page of `toolledger operations list` on a ledger of
//!   `--list-rows` operations (default 100,000), without and with a state filter, as two
//!   lines, `operations-list` and `operations-list-state` (see [`listing`]). Only when asked
//!   for with `--workload operations-list`: its seed is large.
//! - `console-list`: the operator console's list page (`GET /console`, rendered HTML) on a
//!   ledger of `--list-rows` operations, over HTTP (see [`console`]). Only when asked for
//!   with `--workload console-list`: its seed is large.
//! - `proxy`: `charge` of the built-in example upstream called directly and through
//!   `toolledger proxy` over stdio, fresh and replayed, as five lines, `proxy-direct-fresh`,
//!   `proxy-fresh-unguarded` (the re-plan guard off), `proxy-fresh`, `proxy-direct-lookup` and
//!   `proxy-replay`; the proxied lines carry what the
//!   proxy adds (see [`proxy`]). Only when asked for with `--workload proxy`.
//! - `overload`: fresh calls offered at `--overload-factor` times the store's measured
//!   capacity for `--overload-seconds` by `--overload-callers` callers, then checked: every
//!   call answered (a result or `unavailable`), nothing acknowledged lost, memory before, once
//!   a second, at peak and after, and the rate served right after (see [`overload`]). The
//!   engine runs in this process. Only when asked for with `--workload overload`; at the
//!   highest `--concurrency` given (64 by default).
//! - `overload-http`: the same against `create_automation` of a `toolledger serve --http`
//!   child (with `--max-in-flight`), one keep-alive connection per caller; the memory is the
//!   server's alone. Only when asked for with `--workload overload-http`.
//! - `python-sdk`: the baseline of `mcp-stdio`, the same calls to a server written with the
//!   official Python SDK that deduplicates by hand (a SQLite lookup-or-insert under a lock),
//!   as `python-sdk-fresh` and `python-sdk-replay` (see [`mcp`]). Only when asked for with
//!   `--workload python-sdk`; `--python` names an interpreter with `mcp` installed.
//! - `retention-soak`: fresh calls and one replay in ten with a short retention on a clock that
//!   moves one second per call, `--ops` calls crossing `--soak-periods` retention periods
//!   (the tombstone horizon is one period too), once with the pruner off and once with it
//!   running every `--soak-prune-interval` seconds, as two lines (`--soak-rounds` pairs of
//!   them, the order alternating); each has the ledger's size
//!   sampled `--soak-samples` times, what the pruner did and how fast, and fresh and replay
//!   latency, the pruner-on line also its p99 over the pruner-off line's (see [`soak`]). At
//!   the highest `--concurrency` given. Only when asked for with `--workload retention-soak`.
//!
//! With `--backend postgres --database-url URL` the `ceiling`, `fresh`, `replay`,
//! `conflict`, `overload`, `overload-http` and `retention-soak` workloads run against
//! PostgreSQL, each in a fresh schema of that database (each soak run in its own), dropped
//! afterwards; `ceiling` is then a raw one-row `INSERT … ON CONFLICT DO NOTHING` +
//! `COMMIT` loop through the same store (compare it with `pgbench` on the same server), and
//! `proxy` runs the proxy on ledgers in schemas of their own (its upstream keeps its SQLite
//! file). The `mcp-stdio`, `mcp-http`, `outbox-drain`, `operations-list`, `console-list`,
//! `overload-stdio` and `python-sdk` workloads are SQLite-only.

mod ack;
mod console;
mod listing;
mod mcp;
mod outbox;
mod overload;
mod pg;
mod proxy;
mod report;
mod run;
mod soak;
mod unread;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use toolledger::clock::{SharedClock, SystemClock};
use toolledger::effect::EffectTx;
use toolledger::engine::{Engine, InlineCall, InlineEffect};
use toolledger::store::sqlite::{OpenOptions, SqliteStore, Synchronous};
use toolledger::store::Migration;
use toolledger::{Error, ErrorCode, Principal, ToolContract};

use toolledger_reference::ledger::SyncMode;

pub use report::Report;
use run::{drive, Measured};
use toolledger::store::StoreOptions;

/// The table the benchmark's inline effect writes to (namespace `bench`).
pub const BENCH_MIGRATIONS: &[Migration] = &[Migration {
    namespace: "bench",
    version: 1,
    sql: "CREATE TABLE bench_effects (
    id            INTEGER PRIMARY KEY,
    operation_key TEXT    NOT NULL UNIQUE CHECK (length(operation_key) BETWEEN 1 AND 256),
    n             INTEGER NOT NULL,
    created_at    INTEGER NOT NULL
) STRICT;",
}];

/// The tool name the benchmark's operations are recorded under.
pub const BENCH_TOOL: &str = "bench_write";

/// A workload `toolledger bench` can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Workload {
    /// Raw one-row INSERT + COMMIT loop (the durable single-commit ceiling).
    Ceiling,
    /// Distinct keys, inline effect, durable.
    Fresh,
    /// Exact retries of applied operations.
    Replay,
    /// A known key with a different intent.
    Conflict,
    /// tools/call round trips against `toolledger serve` over stdio (fresh and replay).
    McpStdio,
    /// tools/call round trips against `toolledger serve --http` with bearer tokens, one
    /// keep-alive connection per caller (fresh and replay).
    McpHttp,
    /// Accepted deferred operations delivered by worker calls (claim, downstream, receipt).
    OutboxDrain,
    /// The first page of `operations list` on a large ledger, without and with a state
    /// filter (not part of the default set).
    OperationsList,
    /// The operator console's list page over HTTP on a large ledger (not part of the default
    /// set).
    ConsoleList,
    /// `charge` of the built-in example upstream, directly and through `toolledger proxy`
    /// over stdio, fresh and replayed (not part of the default set).
    Proxy,
    /// Fresh calls offered at several times the store's capacity for a bounded time, then
    /// checked; the engine in this process (not part of the default set).
    Overload,
    /// The same against `toolledger serve --http` in its own process, whose memory is
    /// reported (not part of the default set).
    OverloadHttp,
    /// A stdio client that writes `tools/list` for `--overload-seconds` and never reads the
    /// answers, against `serve` and `proxy`; the server's memory is reported (not part of the
    /// default set).
    OverloadStdio,
    /// The baseline of `mcp-stdio`: the same calls to a server written with the official
    /// Python SDK doing its own SQLite lookup-or-insert (needs `--python` with `mcp`
    /// installed; not part of the default set).
    PythonSdk,
    /// Fresh calls and replays with a short retention on a fast clock, with the pruner off
    /// and on: the ledger's size over time, prune rate, latency (not part of the default set).
    RetentionSoak,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Ceiling => "ceiling",
            Workload::Fresh => "fresh",
            Workload::Replay => "replay",
            Workload::Conflict => "conflict",
            Workload::McpStdio => "mcp-stdio",
            Workload::McpHttp => "mcp-http",
            Workload::OutboxDrain => "outbox-drain",
            Workload::OperationsList => "operations-list",
            Workload::ConsoleList => "console-list",
            Workload::Proxy => "proxy",
            Workload::Overload => "overload",
            Workload::OverloadHttp => "overload-http",
            Workload::OverloadStdio => "overload-stdio",
            Workload::PythonSdk => "python-sdk",
            Workload::RetentionSoak => "retention-soak",
        }
    }

    /// Whether the workload runs on SQLite only.
    fn sqlite_only(self) -> bool {
        matches!(
            self,
            Workload::McpStdio
                | Workload::McpHttp
                | Workload::OutboxDrain
                | Workload::OperationsList
                | Workload::ConsoleList
                | Workload::OverloadStdio
                | Workload::PythonSdk
        )
    }
}

/// The storage backend a benchmark runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// The embedded SQLite store.
    Sqlite,
    /// PostgreSQL (needs `--database-url`).
    Postgres,
}

/// Options of `toolledger bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Workload to run (repeatable). Default: every available workload.
    #[arg(long = "workload", value_enum)]
    pub workloads: Vec<Workload>,
    /// Callers in flight (repeatable). Default: 1 and 64.
    #[arg(long = "concurrency")]
    pub concurrency: Vec<usize>,
    /// Operations per workload and concurrency.
    #[arg(long, default_value_t = 5000)]
    pub ops: usize,
    /// Operations seeded into the ledger `operations-list` and `console-list` read (untimed).
    #[arg(long, default_value_t = 100_000)]
    pub list_rows: usize,
    /// Storage backend.
    #[arg(long, value_enum, default_value = "sqlite")]
    pub backend: Backend,
    /// PostgreSQL database for `--backend postgres` (each workload gets a fresh schema in it).
    #[arg(long, env = "TOOLLEDGER_DATABASE_URL", value_name = "URL")]
    pub database_url: Option<String>,
    /// Directory for the benchmark databases (default: the system temporary directory). Use
    /// the disk you want to measure; the ceiling line runs on the same directory.
    #[arg(long)]
    pub db_dir: Option<PathBuf>,
    /// Read connections (and reader threads) of the store; default: the store's default.
    #[arg(long)]
    pub readers: Option<usize>,
    /// SQLite `synchronous` mode of every benchmark database, the ceiling's included (`full`
    /// by default; `normal` gives up durability on power failure, see BENCHMARKS.md).
    #[arg(long, value_enum, default_value = "full")]
    pub sqlite_synchronous: SyncMode,
    /// Testing aid: run fresh operations against this database and print each key on stdout
    /// as soon as its operation is acknowledged (durable), instead of measuring.
    #[arg(long, hide = true)]
    pub ack_db: Option<PathBuf>,
    /// Testing aid: the same against this schema of `--database-url` (with `--backend
    /// postgres`; created if missing, never dropped).
    #[arg(long, hide = true, value_name = "NAME")]
    pub ack_schema: Option<String>,
    /// `overload`: how long calls arrive at the overload rate, in seconds (`overload-stdio`:
    /// how long the client writes without reading).
    #[arg(long, default_value_t = 10.0)]
    pub overload_seconds: f64,
    /// `overload`: the offered rate as a multiple of the store's measured capacity.
    #[arg(long, default_value_t = 4.0)]
    pub overload_factor: f64,
    /// `overload`: callers issuing the overload's calls (the most calls in flight; with
    /// `overload-http`, one connection each).
    #[arg(long, default_value_t = 2048)]
    pub overload_callers: usize,
    /// `python-sdk`: the Python interpreter that runs the baseline server (with the `mcp`
    /// package installed).
    #[arg(
        long,
        env = "TOOLLEDGER_PYTHON",
        default_value = "python3",
        value_name = "PATH"
    )]
    pub python: PathBuf,
    /// `overload-http`: the server's `--max-in-flight`.
    #[arg(long, default_value_t = toolledger_mcp::wire::stdio::DEFAULT_MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// `retention-soak`: retention periods a run crosses. The ledger's clock moves one second
    /// per call, so the retention, and the tombstone horizon after it, is `--ops /
    /// --soak-periods` seconds.
    #[arg(long, default_value_t = 10)]
    pub soak_periods: usize,
    /// `retention-soak`: real seconds from the start of one pass of the pruner to the start of
    /// the next (as `--prune-interval`).
    #[arg(long, default_value_t = 1.0)]
    pub soak_prune_interval: f64,
    /// `retention-soak`: samples of the ledger's size during a run (besides the one before
    /// the first call).
    #[arg(long, default_value_t = 10)]
    pub soak_samples: usize,
    /// `retention-soak`: calls offered per second, a steady load whose latency counts from
    /// each call's due time (0: as fast as the callers go).
    #[arg(long, default_value_t = 0.0)]
    pub soak_rate: f64,
    /// `retention-soak`: rows per prune transaction (default: the background pruner's; on
    /// SQLite, where the store's writer does the pruning, at most its own step sizes; on
    /// PostgreSQL at most the background pruner's batch of 100).
    #[arg(long, default_value_t = toolledger::prune::DEFAULT_BATCH)]
    pub soak_prune_batch: usize,
    /// `retention-soak`: the pruner's rest after each transaction, as a multiple of the time
    /// it took (default: the background pruner's; 0: none).
    #[arg(long, default_value_t = toolledger::prune::BACKGROUND_PACE)]
    pub soak_prune_pace: u32,
    /// `retention-soak`: pairs of runs, pruner off and on, the order alternating (off first,
    /// then on first, …); each pruner-on line compares with the off line of its pair. Even
    /// counts put each side first as often: the first run of an invocation tends to have the
    /// worse tail.
    #[arg(long, default_value_t = 1)]
    pub soak_rounds: usize,
}

/// Refuses the flag combinations a benchmark cannot run with, before anything is opened.
fn validate(args: &BenchArgs) -> Result<(), Failure> {
    let refuse = |code, message: &str| Err(Failure::explained(code, message));
    let postgres = args.backend == Backend::Postgres;
    if postgres && args.database_url.is_none() {
        return refuse(
            "BACKEND_UNAVAILABLE",
            "--backend postgres needs --database-url",
        );
    }
    if postgres && args.workloads.iter().any(|w| w.sqlite_only()) {
        return refuse(
            "WORKLOAD_UNAVAILABLE",
            "mcp-stdio, mcp-http, outbox-drain, operations-list, console-list, \
             overload-stdio and python-sdk run on SQLite only",
        );
    }
    if postgres && args.sqlite_synchronous != SyncMode::Full {
        return refuse(
            "INVALID_ARGUMENTS",
            "--sqlite-synchronous applies to SQLite only",
        );
    }
    if postgres && args.ack_db.is_some() {
        return refuse(
            "INVALID_ARGUMENTS",
            "--ack-db is a SQLite file; on PostgreSQL use --ack-schema",
        );
    }
    if let Some(schema) = &args.ack_schema {
        if !postgres {
            return refuse("INVALID_ARGUMENTS", "--ack-schema needs --backend postgres");
        }
        if !toolledger::store::postgres::valid_schema_name(schema) {
            return refuse(
                "INVALID_ARGUMENTS",
                "schema names are lowercase letters, digits and underscores",
            );
        }
    }
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(args.overload_seconds)
        || args.overload_seconds > 3600.0
        || !positive(args.overload_factor)
        || args.overload_factor > 1000.0
    {
        return refuse(
            "INVALID_ARGUMENTS",
            "--overload-seconds must be in (0, 3600] and --overload-factor in (0, 1000]",
        );
    }
    if args.ops == 0
        || args.concurrency.contains(&0)
        || args.readers == Some(0)
        || args.list_rows == 0
        || args.overload_callers == 0
        || args.max_in_flight == 0
    {
        return refuse(
            "INVALID_ARGUMENTS",
            "--ops, --concurrency, --readers, --list-rows, --overload-callers and \
             --max-in-flight must be at least 1",
        );
    }
    if args.soak_periods == 0
        || args.soak_periods > args.ops
        || args.soak_samples == 0
        || args.soak_samples > 1000
        || !positive(args.soak_prune_interval)
        || args.soak_prune_interval > 3600.0
        || !(args.soak_rate >= 0.0 && args.soak_rate.is_finite())
        || !(1..=20).contains(&args.soak_rounds)
    {
        return refuse(
            "INVALID_ARGUMENTS",
            "--soak-periods must be in [1, --ops], --soak-samples in [1, 1000], \
             --soak-prune-interval in (0, 3600], --soak-rate a finite number ≥ 0 and \
             --soak-rounds in [1, 20]",
        );
    }
    if args.overload_callers > 100_000 || args.max_in_flight > 1_000_000 {
        return refuse(
            "INVALID_ARGUMENTS",
            "--overload-callers is at most 100000 and --max-in-flight at most 1000000",
        );
    }
    Ok(())
}

/// Why a benchmark stopped without its lines: a stable, upper-case code, and for a refused
/// argument what to change. Never a path, SQL or a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The stable code (`INVALID_ARGUMENTS`, `BENCH_FAILED`, `DATABASE_UNAVAILABLE`, …).
    pub code: &'static str,
    /// What to change, when the arguments were at fault.
    pub message: Option<String>,
}

impl Failure {
    /// A failure named by its code alone.
    pub fn code(code: &'static str) -> Failure {
        Failure {
            code,
            message: None,
        }
    }

    /// A failure with a message saying what to change.
    pub fn explained(code: &'static str, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: Some(message.into()),
        }
    }
}

impl From<toolledger::store::StoreError> for Failure {
    fn from(e: toolledger::store::StoreError) -> Self {
        Failure::code(e.code())
    }
}

/// `bytes` random bytes from the operating system, in hex (names of schemas, runs and keys);
/// `None` when no randomness could be read.
pub(crate) fn random_hex(bytes: usize) -> Option<String> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).ok()?;
    Some(hex::encode(b))
}

/// Runs `toolledger bench`.
pub fn run(args: BenchArgs) -> Result<(), Failure> {
    validate(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|_| Failure::code("RUNTIME_ERROR"))?;
    if let (Some(schema), Some(url)) = (&args.ack_schema, &args.database_url) {
        let concurrency = args.concurrency.first().copied().unwrap_or(64);
        return runtime.block_on(ack::run_pg(url, schema, concurrency, args.ops));
    }
    if let Some(path) = args.ack_db.clone() {
        let concurrency = args.concurrency.first().copied().unwrap_or(64);
        return runtime.block_on(ack::run(path, concurrency, args.ops, tuning(&args)));
    }
    runtime.block_on(run_all(&args)).map_err(Failure::code)
}

/// How the benchmark's SQLite stores are opened.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tuning {
    /// Read connections; `None` for the store's default.
    pub readers: Option<usize>,
    /// The write connection's `synchronous` mode.
    pub synchronous: Synchronous,
}

fn tuning(args: &BenchArgs) -> Tuning {
    Tuning {
        readers: args.readers,
        synchronous: args.sqlite_synchronous.into(),
    }
}

fn plan(args: &BenchArgs) -> (Vec<Workload>, Vec<usize>) {
    let mut workloads = if args.workloads.is_empty() {
        vec![
            Workload::Ceiling,
            Workload::Fresh,
            Workload::Replay,
            Workload::Conflict,
            Workload::McpStdio,
            Workload::McpHttp,
            Workload::OutboxDrain,
        ]
    } else {
        args.workloads.clone()
    };
    // The ceiling runs first so every later line can carry its ratio to it.
    workloads.sort();
    workloads.dedup();
    let mut concurrency = if args.concurrency.is_empty() {
        vec![1, 64]
    } else {
        args.concurrency.clone()
    };
    concurrency.dedup();
    (workloads, concurrency)
}

async fn run_all(args: &BenchArgs) -> Result<(), &'static str> {
    let dir = match &args.db_dir {
        Some(d) => tempfile::Builder::new()
            .prefix("toolledger-bench-")
            .tempdir_in(d),
        None => tempfile::Builder::new()
            .prefix("toolledger-bench-")
            .tempdir(),
    }
    .map_err(|_| "DATABASE_IO_ERROR")?;
    let (mut workloads, concurrency) = plan(args);
    if args.backend == Backend::Postgres {
        workloads.retain(|w| !w.sqlite_only());
    }
    let mut ceiling: Option<f64> = None;
    let mut seq = 0usize;
    let tune = tuning(args);
    for workload in workloads {
        let highest = [concurrency.iter().copied().max().unwrap_or(64)];
        let levels: &[usize] = match workload {
            Workload::Ceiling => &[1],
            Workload::Overload | Workload::OverloadHttp | Workload::RetentionSoak => &highest,
            _ => &concurrency,
        };
        if workload == Workload::OverloadStdio {
            seq += 1;
            let db = dir
                .path()
                .join(format!("{seq:02}-{}.sqlite", workload.name()));
            for r in unread::run(&db, args.overload_seconds, tune.synchronous).await? {
                r.print();
            }
            continue;
        }
        if workload == Workload::RetentionSoak {
            seq += 1;
            let base = dir.path().join(format!("{seq:02}-{}", workload.name()));
            let target = match (args.backend, &args.database_url) {
                (Backend::Postgres, Some(url)) => soak::Target::Postgres(url.clone()),
                _ => soak::Target::Sqlite(base, tune),
            };
            let shape = soak::Shape {
                concurrency: levels[0],
                ops: args.ops,
                periods: args.soak_periods,
                prune_interval: std::time::Duration::from_secs_f64(args.soak_prune_interval),
                samples: args.soak_samples,
                rate: (args.soak_rate > 0.0).then_some(args.soak_rate),
                prune_batch: args.soak_prune_batch.max(1),
                prune_pace: args.soak_prune_pace,
                rounds: args.soak_rounds,
            };
            for r in soak::run(target, shape).await? {
                report::print_line(&r, r.workload);
            }
            continue;
        }
        if matches!(workload, Workload::Overload | Workload::OverloadHttp) {
            seq += 1;
            let db = dir
                .path()
                .join(format!("{seq:02}-{}.sqlite", workload.name()));
            run_overload(args, workload, db, levels[0], tune)
                .await?
                .print();
            continue;
        }
        for &c in levels {
            seq += 1;
            let db = dir
                .path()
                .join(format!("{seq:02}-{}-c{c}.sqlite", workload.name()));
            report::reset_peak_rss();
            let reports: Vec<Report> = match (args.backend, &args.database_url) {
                (Backend::Postgres, Some(url)) => {
                    if workload == Workload::Proxy {
                        let reports = proxy::run(db, c, args.ops, tune.synchronous, Some(url));
                        for mut r in reports.await? {
                            r.backend = "postgres";
                            r.synchronous = "on";
                            r.ratio_to_ceiling = ceiling.map(|base| round2(r.ops_per_sec / base));
                            r.print();
                        }
                        continue;
                    }
                    let pg = pg::BenchSchema::open(url)?;
                    let reports = match workload {
                        Workload::Ceiling => vec![pg::ceiling(&pg, args.ops).await?],
                        Workload::Fresh => vec![fresh_on(pg.engine(), c, args.ops).await?],
                        Workload::Replay => vec![replay_on(pg.engine(), c, args.ops).await?],
                        Workload::Conflict => {
                            vec![conflict_on(pg.engine(), c, args.ops).await?]
                        }
                        // SQLite-only workloads never get here; the overloads and the soak
                        // ran above.
                        _ => Vec::new(),
                    };
                    tokio::task::spawn_blocking(move || pg.drop_schema())
                        .await
                        .map_err(|_| "BENCH_FAILED")?;
                    reports
                        .into_iter()
                        .map(|mut r| {
                            r.backend = "postgres";
                            r.synchronous = "on";
                            r
                        })
                        .collect()
                }
                _ => match workload {
                    Workload::Ceiling => vec![ceiling_loop(db, args.ops, tune.synchronous).await?],
                    Workload::Fresh => vec![fresh(db, c, args.ops, tune).await?],
                    Workload::Replay => vec![replay(db, c, args.ops, tune).await?],
                    Workload::Conflict => vec![conflict(db, c, args.ops, tune).await?],
                    Workload::McpStdio => {
                        mcp::run(db, c, args.ops, tune.synchronous, mcp::Wire::Stdio).await?
                    }
                    Workload::McpHttp => {
                        mcp::run(db, c, args.ops, tune.synchronous, mcp::Wire::Http).await?
                    }
                    Workload::OutboxDrain => vec![outbox::run(db, c, args.ops, tune).await?],
                    Workload::OperationsList => {
                        listing::run(db, c, args.ops, args.list_rows, tune).await?
                    }
                    Workload::ConsoleList => {
                        console::run(db, c, args.ops, args.list_rows, tune).await?
                    }
                    Workload::Proxy => proxy::run(db, c, args.ops, tune.synchronous, None).await?,
                    Workload::PythonSdk => {
                        let wire = mcp::Wire::PythonSdk(args.python.clone());
                        mcp::run(db, c, args.ops, tune.synchronous, wire).await?
                    }
                    Workload::Overload
                    | Workload::OverloadHttp
                    | Workload::OverloadStdio
                    | Workload::RetentionSoak => Vec::new(),
                }
                .into_iter()
                .map(|mut r| {
                    r.synchronous = tune.synchronous.as_str();
                    r
                })
                .collect(),
            };
            for mut r in reports {
                if workload == Workload::Ceiling {
                    ceiling = Some(r.ops_per_sec);
                }
                r.ratio_to_ceiling = ceiling.map(|base| round2(r.ops_per_sec / base));
                r.print();
            }
        }
    }
    Ok(())
}

/// The `overload` or `overload-http` workload on the chosen backend, at `concurrency`
/// closed-loop callers.
async fn run_overload(
    args: &BenchArgs,
    workload: Workload,
    db: PathBuf,
    concurrency: usize,
    tune: Tuning,
) -> Result<overload::OverloadReport, &'static str> {
    let shape = overload::Shape {
        concurrency,
        ops: args.ops,
        seconds: args.overload_seconds,
        factor: args.overload_factor,
        callers: args.overload_callers,
        closed_loop_max: if workload == Workload::OverloadHttp {
            args.max_in_flight
        } else {
            usize::MAX
        },
    };
    let postgres = args.backend == Backend::Postgres;
    let labels = overload::Labels {
        workload: workload.name(),
        backend: if postgres { "postgres" } else { "sqlite" },
        synchronous: if postgres {
            "on"
        } else {
            tune.synchronous.as_str()
        },
        limits: toolledger::store::QueueLimits::default(),
        max_in_flight: (workload == Workload::OverloadHttp).then_some(args.max_in_flight),
    };
    let url = args.database_url.as_deref().filter(|_| postgres);
    if workload == Workload::OverloadHttp {
        let connections = args
            .overload_callers
            .max(concurrency)
            .max(overload::CAPACITY_CALLERS);
        let server = overload::HttpServer::start(
            &db,
            tune.synchronous,
            url,
            args.max_in_flight,
            connections,
        )
        .await?;
        let report = overload::run(server.target.clone(), shape, labels).await;
        server.finish().await;
        return report;
    }
    match url {
        Some(url) => {
            let pg = pg::BenchSchema::open(url)?;
            let target = Arc::new(overload::EngineTarget(pg.engine()));
            let report = overload::run(target, shape, labels).await;
            tokio::task::spawn_blocking(move || pg.drop_schema())
                .await
                .map_err(|_| "BENCH_FAILED")?;
            report
        }
        None => {
            let target = Arc::new(overload::EngineTarget(bench_engine(&db, tune)?));
            overload::run(target, shape, labels).await
        }
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The inline effect of the benchmark: one row in `bench_effects`.
pub struct BenchEffect {
    key: String,
    n: i64,
}

impl BenchEffect {
    /// An effect recording `key`.
    pub fn new(key: String, n: i64) -> Self {
        BenchEffect { key, n }
    }
}

impl InlineEffect for BenchEffect {
    fn apply(&self, tx: &mut dyn EffectTx, _principal: &Principal) -> Result<Value, Error> {
        let id = tx
            .insert_id(
                "INSERT INTO bench_effects(operation_key, n, created_at) VALUES (?1, ?2, ?3)",
                &[self.key.as_str().into(), self.n.into(), unix_now().into()],
            )?
            .ok_or_else(|| Error::unavailable("effect row id missing"))?;
        Ok(json!({"effect_id": id, "n": self.n}))
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Opens a benchmark database with the bench table.
pub fn open_bench_store(
    path: &std::path::Path,
    tuning: Tuning,
) -> Result<SqliteStore, &'static str> {
    let mut opts = OpenOptions::new("sqlite:bench")
        .with_migrations(BENCH_MIGRATIONS)
        .with_synchronous(tuning.synchronous);
    if let Some(n) = tuning.readers {
        opts.readers = n;
    }
    SqliteStore::open(path, opts).map_err(|e| e.code())
}

/// An engine over a benchmark database.
pub fn bench_engine(path: &std::path::Path, tuning: Tuning) -> Result<Engine, &'static str> {
    let clock: SharedClock = Arc::new(SystemClock);
    Ok(Engine::new(open_bench_store(path, tuning)?, clock))
}

fn principal() -> Principal {
    Principal {
        tenant: "bench".into(),
        subject: "bench-caller".into(),
        roles: Default::default(),
        scopes: Default::default(),
    }
}

/// The call for operation `n` under `key`; `variant` changes the intent (for conflicts).
pub fn bench_call(key: String, n: i64, variant: bool) -> InlineCall {
    let arguments = if variant {
        json!({"n": n, "variant": true})
    } else {
        json!({"n": n})
    };
    InlineCall {
        principal: principal(),
        contract: ToolContract::uniform(BENCH_TOOL, "1"),
        key,
        arguments,
        fingerprint: None,
        authority_deadline: None,
        retention_deadline: None,
        shared_key_namespace: false,
    }
}

/// One fresh operation; `Ok(true)` when it was applied now (not replayed).
pub async fn fresh_op(engine: &Engine, key: String, n: i64) -> Result<bool, Error> {
    let effect: Arc<dyn InlineEffect> = Arc::new(BenchEffect::new(key.clone(), n));
    let outcome = engine
        .execute_inline(bench_call(key, n, false), effect)
        .await?;
    Ok(!outcome.replayed)
}

fn key_of(prefix: &str, i: usize) -> String {
    format!("{prefix}-{i:08}")
}

async fn ceiling_loop(
    db: PathBuf,
    ops: usize,
    synchronous: Synchronous,
) -> Result<Report, &'static str> {
    let progress = run::progress("ceiling", 1, ops);
    let bar = progress.clone();
    let measured = tokio::task::spawn_blocking(move || -> Result<Measured, &'static str> {
        let conn = toolledger::store::sqlite::raw::connect(&db).map_err(|e| e.code())?;
        if synchronous == Synchronous::Normal {
            conn.execute_batch("PRAGMA synchronous=NORMAL;")
                .map_err(|_| "SQLITE_ERROR")?;
        }
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS ceiling (
                 id INTEGER PRIMARY KEY,
                 k TEXT NOT NULL UNIQUE,
                 created_at INTEGER NOT NULL
             ) STRICT;",
        )
        .map_err(|_| "SQLITE_ERROR")?;
        let mut lat = Vec::with_capacity(ops);
        let cpu_before = run::process_cpu();
        let started = Instant::now();
        for i in 0..ops {
            let t0 = Instant::now();
            conn.execute_batch("BEGIN IMMEDIATE")
                .map_err(|_| "SQLITE_ERROR")?;
            conn.prepare_cached("INSERT INTO ceiling(k, created_at) VALUES (?1, unixepoch())")
                .and_then(|mut s| s.execute([key_of("ceiling", i)]))
                .map_err(|_| "SQLITE_ERROR")?;
            conn.execute_batch("COMMIT").map_err(|_| "SQLITE_ERROR")?;
            lat.push(t0.elapsed().as_micros() as u64);
            bar.inc(1);
        }
        Ok(Measured {
            elapsed: started.elapsed(),
            latencies_us: lat,
            failed: 0,
            cpu: run::process_cpu().saturating_sub(cpu_before),
        })
    })
    .await
    .map_err(|_| "BENCH_FAILED")??;
    progress.finish_and_clear();
    Ok(Report::new("ceiling", 1, ops, measured))
}

async fn fresh(
    db: PathBuf,
    concurrency: usize,
    ops: usize,
    tuning: Tuning,
) -> Result<Report, &'static str> {
    fresh_on(bench_engine(&db, tuning)?, concurrency, ops).await
}

async fn fresh_on(engine: Engine, concurrency: usize, ops: usize) -> Result<Report, &'static str> {
    let writer = engine.store().driver_as::<SqliteStore>().cloned();
    let before = writer.as_ref().map(|s| s.writer_stats());
    let measured = drive("fresh", concurrency, ops, move |i| {
        let engine = engine.clone();
        async move {
            matches!(
                fresh_op(&engine, key_of("fresh", i), i as i64).await,
                Ok(true)
            )
        }
    })
    .await;
    let report = Report::new("fresh", concurrency, ops, measured);
    Ok(match (writer, before) {
        (Some(s), Some(before)) => report.with_writer(before, s.writer_stats()),
        _ => report,
    })
}

/// Applies `count` operations (untimed) so replays and conflicts have something to find.
async fn seed(engine: &Engine, count: usize) -> Result<(), &'static str> {
    let measured = drive("seed", 64, count, {
        let engine = engine.clone();
        move |i| {
            let engine = engine.clone();
            async move { fresh_op(&engine, key_of("seed", i), i as i64).await.is_ok() }
        }
    })
    .await;
    if measured.failed > 0 {
        return Err("BENCH_SEED_FAILED");
    }
    Ok(())
}

/// How many distinct operations replays and conflicts cycle through.
fn seeded(ops: usize) -> usize {
    ops.clamp(1, 1000)
}

async fn replay(
    db: PathBuf,
    concurrency: usize,
    ops: usize,
    tuning: Tuning,
) -> Result<Report, &'static str> {
    replay_on(bench_engine(&db, tuning)?, concurrency, ops).await
}

async fn replay_on(engine: Engine, concurrency: usize, ops: usize) -> Result<Report, &'static str> {
    let k = seeded(ops);
    seed(&engine, k).await?;
    let measured = drive("replay", concurrency, ops, move |i| {
        let engine = engine.clone();
        async move {
            let n = i % k;
            let effect: Arc<dyn InlineEffect> =
                Arc::new(BenchEffect::new(key_of("seed", n), n as i64));
            matches!(
                engine
                    .execute_inline(bench_call(key_of("seed", n), n as i64, false), effect)
                    .await,
                Ok(o) if o.replayed
            )
        }
    })
    .await;
    Ok(Report::new("replay", concurrency, ops, measured))
}

async fn conflict(
    db: PathBuf,
    concurrency: usize,
    ops: usize,
    tuning: Tuning,
) -> Result<Report, &'static str> {
    conflict_on(bench_engine(&db, tuning)?, concurrency, ops).await
}

async fn conflict_on(
    engine: Engine,
    concurrency: usize,
    ops: usize,
) -> Result<Report, &'static str> {
    let k = seeded(ops);
    seed(&engine, k).await?;
    let measured = drive("conflict", concurrency, ops, move |i| {
        let engine = engine.clone();
        async move {
            let n = i % k;
            let effect: Arc<dyn InlineEffect> =
                Arc::new(BenchEffect::new(key_of("seed", n), n as i64));
            matches!(
                engine
                    .execute_inline(bench_call(key_of("seed", n), n as i64, true), effect)
                    .await,
                Err(e) if e.code == ErrorCode::OperationConflict
            )
        }
    })
    .await;
    Ok(Report::new("conflict", concurrency, ops, measured))
}

/// Whether stderr is a terminal (the progress bar is drawn only then).
pub fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}
