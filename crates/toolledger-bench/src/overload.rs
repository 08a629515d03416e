//! The `overload` and `overload-http` workloads: fresh calls offered at several times what the
//! server can serve, for a bounded time, then checked.
//!
//! `overload` calls the engine in this process (the store's own queues are what refuses);
//! `overload-http` calls `create_automation` on a `toolledger serve --http` child process over
//! keep-alive HTTP/1.1 connections (the server's in-flight limit and the store's queues refuse),
//! so the memory it reports is the server's alone.
//!
//! 1. *Capacity*: `--ops` fresh calls, closed loop, at [`CAPACITY_CALLERS`] callers (at least
//!    `--concurrency`, at most the server's in-flight limit) measure what is served when the
//!    store's batches are full (after as many calls to warm it up).
//! 2. *Overload*: for `--overload-seconds`, fresh calls are due at `--overload-factor` times
//!    that rate (open loop: each call is due on schedule, whether or not earlier ones were
//!    answered), issued by `--overload-callers` callers, so at most that many are in flight
//!    (a call due while every caller waits is issued late, and the lag is reported). What
//!    cannot be served in time is answered `unavailable`.
//! 3. *Check*: every call was answered (a result or `unavailable`); every acknowledged call
//!    replays its acknowledged result; the effect table gained exactly one row per
//!    acknowledged call (a call answered `unavailable` wrote nothing).
//! 4. *After*: `--ops` fresh calls again, closed loop, measure normal service right after.
//!
//! One JSON line reports the rates, the answers, what was lost (must be 0), and the measured
//! process's resident memory before, at its peak, once a second during the overload, and
//! after it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use toolledger::effect::{EffectTx, RowExt};
use toolledger::engine::{Engine, InlineEffect};
use toolledger::store::{QueueLimits, Store};
use toolledger::{Error, ErrorCode};

use super::mcp::McpClient;
use super::report::rss_mb;
use super::run::drive;
use super::{bench_call, key_of, BenchEffect};

/// Closed-loop callers of the capacity phase, at least: enough to fill the stores' batches
/// (SQLite commits up to 128 jobs at once), well below a queue's default depth.
pub const CAPACITY_CALLERS: usize = 256;

/// How one call was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Applied now; the effect's row id.
    Applied(i64),
    /// Replayed; the effect's row id.
    Replayed(i64),
    /// `unavailable` from the store (its queue was full or the wait too long).
    Unavailable,
    /// 503 `unavailable` from the HTTP server's in-flight limit (nothing was read).
    Shed,
    /// Any other answer, or none (the transport failed).
    Other,
}

/// A call in flight.
pub type Call = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// What an overload run drives.
pub trait Target: Send + Sync + 'static {
    /// Operation `i` of `phase` (its key is the same every time it is called).
    fn call(&self, phase: &'static str, i: usize) -> Call;
    /// Effect rows written so far.
    fn effect_rows(&self) -> Pin<Box<dyn Future<Output = Result<i64, &'static str>> + Send>>;
    /// The process whose memory is reported: `self` or a pid.
    fn process(&self) -> String;
}

/// The engine in this process, with the bench's inline effect.
pub struct EngineTarget(pub Engine);

impl Target for EngineTarget {
    fn call(&self, phase: &'static str, i: usize) -> Call {
        let engine = self.0.clone();
        Box::pin(async move {
            let key = key_of(phase, i);
            let effect: Arc<dyn InlineEffect> = Arc::new(BenchEffect::new(key.clone(), i as i64));
            match engine
                .execute_inline(bench_call(key, i as i64, false), effect)
                .await
            {
                Ok(o) => match (o.result["effect_id"].as_i64(), o.replayed) {
                    (Some(id), false) => Answer::Applied(id),
                    (Some(id), true) => Answer::Replayed(id),
                    (None, _) => Answer::Other,
                },
                Err(e) if e.code == ErrorCode::Unavailable => Answer::Unavailable,
                Err(_) => Answer::Other,
            }
        })
    }

    fn effect_rows(&self) -> Pin<Box<dyn Future<Output = Result<i64, &'static str>> + Send>> {
        count_rows(self.0.store().clone(), "SELECT count(*) FROM bench_effects")
    }

    fn process(&self) -> String {
        "self".into()
    }
}

/// `create_automation` on a `serve --http` child; `store` is the same ledger, opened here to
/// count the effect rows.
pub(super) struct HttpTarget {
    /// The server and the connections to it.
    pub(super) client: Arc<McpClient>,
    /// The server's ledger.
    pub(super) store: Store,
}

impl Target for HttpTarget {
    fn call(&self, phase: &'static str, i: usize) -> Call {
        let client = self.client.clone();
        Box::pin(async move {
            let arguments = json!({"request_id": key_of(phase, i), "interval_minutes": 30});
            let Some(reply) = client.call("create_automation", arguments).await else {
                return Answer::Other;
            };
            // The in-flight limit's 503 body is `{"error": {"code": "unavailable", …}}`.
            if reply["error"]["code"] == "unavailable" {
                return Answer::Shed;
            }
            let result = &reply["result"];
            if result["isError"] == false {
                let content = &result["structuredContent"];
                return match (content["id"].as_i64(), content["replayed"].as_bool()) {
                    (Some(id), Some(false)) => Answer::Applied(id),
                    (Some(id), Some(true)) => Answer::Replayed(id),
                    _ => Answer::Other,
                };
            }
            match toolledger_mcp::error_of(result) {
                Some(e) if e["code"] == "unavailable" => Answer::Unavailable,
                _ => Answer::Other,
            }
        })
    }

    fn effect_rows(&self) -> Pin<Box<dyn Future<Output = Result<i64, &'static str>> + Send>> {
        count_rows(self.store.clone(), "SELECT count(*) FROM automations")
    }

    fn process(&self) -> String {
        self.client.pid().to_string()
    }
}

fn count_rows(
    store: Store,
    sql: &'static str,
) -> Pin<Box<dyn Future<Output = Result<i64, &'static str>> + Send>> {
    Box::pin(async move {
        store
            .read(move |tx: &mut dyn EffectTx| -> Result<i64, Error> {
                tx.query_opt(sql, &[])?
                    .ok_or_else(|| Error::unavailable("no count"))?
                    .int(0)
            })
            .await
            .map_err(|_| "BENCH_FAILED")
    })
}

/// How the overload phase is shaped.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Closed-loop callers of the after phase (and of the capacity phase, at least).
    pub concurrency: usize,
    /// Calls of the capacity and after phases.
    pub ops: usize,
    /// How long calls are due at the overload rate.
    pub seconds: f64,
    /// The overload rate as a multiple of the measured capacity.
    pub factor: f64,
    /// Callers of the overload phase: at most this many calls in flight.
    pub callers: usize,
    /// The most closed-loop callers (the server's in-flight limit, so the closed-loop phases
    /// are never refused at the door).
    pub closed_loop_max: usize,
}

/// The `overload` / `overload-http` line.
#[derive(Debug, Serialize)]
pub struct OverloadReport {
    /// `overload` or `overload-http`.
    pub workload: &'static str,
    /// Storage backend.
    pub backend: &'static str,
    /// Whose memory the `rss` fields are: `bench` (this process, the engine and the load
    /// generator) or `server` (the `serve --http` child alone).
    pub process: &'static str,
    /// Fresh calls per second served, closed loop, before the overload.
    pub capacity_ops_per_sec: f64,
    /// Calls per second the overload aimed at (`--overload-factor` × capacity).
    pub target_ops_per_sec: f64,
    /// Calls per second actually issued (the calls over the time it took to issue them).
    pub offered_ops_per_sec: f64,
    /// Seconds from the first call issued to the last.
    pub seconds: f64,
    /// Callers of the overload phase (the most calls in flight).
    pub callers: usize,
    /// How late the most delayed call was issued, in milliseconds (every caller was waiting).
    pub max_issue_lag_ms: u64,
    /// Calls issued.
    pub calls: usize,
    /// Calls answered with a result.
    pub applied: usize,
    /// Calls answered `unavailable`, by the store or by the in-flight limit.
    pub unavailable: usize,
    /// Of those, the ones the HTTP server's in-flight limit answered (503).
    pub shed: usize,
    /// Calls answered with another error, or whose transport failed.
    pub other_errors: usize,
    /// Calls not answered within the patience (four queue waits and 30 s).
    pub unanswered: usize,
    /// Acknowledged calls whose replay did not return the acknowledged result.
    pub acknowledged_lost: usize,
    /// Effect rows beyond one per acknowledged call (an `unavailable` call that wrote); a
    /// negative number is acknowledged calls without their row.
    pub extra_effects: i64,
    /// The longest any call waited for its answer, in milliseconds.
    pub max_answer_ms: u64,
    /// Resident memory of the measured process before the overload, in MiB.
    pub rss_before_mb: f64,
    /// Its peak resident memory from the overload's start to the end of the run, in MiB.
    pub peak_rss_mb: f64,
    /// Its resident memory at the end of each second of the overload, in MiB.
    pub rss_by_second_mb: Vec<f64>,
    /// Its resident memory once every call was answered and checked, in MiB.
    pub rss_after_mb: f64,
    /// Fresh calls per second served right after the overload (closed loop).
    pub after_ops_per_sec: f64,
    /// Calls of the after phase that failed (must be 0).
    pub after_failed: usize,
    /// The store's queue depth.
    pub queue_depth: usize,
    /// The store's longest queue wait, in milliseconds.
    pub queue_wait_ms: u64,
    /// The HTTP server's in-flight limit (`overload-http` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<usize>,
    /// SQLite `synchronous` mode, or `on` for PostgreSQL.
    pub synchronous: &'static str,
}

impl OverloadReport {
    /// Prints the line on stdout.
    pub fn print(&self) {
        match serde_json::to_string(self) {
            Ok(line) => println!("{line}"),
            Err(_) => println!("{{\"workload\":\"overload\",\"error\":\"unprintable\"}}"),
        }
    }
}

/// What one overload caller saw.
#[derive(Default)]
struct Tally {
    applied: Vec<(u32, i64)>,
    unavailable: usize,
    shed: usize,
    other: usize,
    unanswered: usize,
    max_answer_us: u64,
}

/// The fixed parts of the report.
pub struct Labels {
    /// `overload` or `overload-http`.
    pub workload: &'static str,
    /// Storage backend.
    pub backend: &'static str,
    /// SQLite `synchronous` mode, or `on`.
    pub synchronous: &'static str,
    /// The store's queue limits.
    pub limits: QueueLimits,
    /// The HTTP server's in-flight limit.
    pub max_in_flight: Option<usize>,
}

/// Runs the workload on `target` (a fresh database).
pub async fn run<T: Target>(
    target: Arc<T>,
    shape: Shape,
    labels: Labels,
) -> Result<OverloadReport, &'static str> {
    let process = target.process();
    // 1. Capacity, after a warm-up of as many calls.
    let callers = shape
        .concurrency
        .max(CAPACITY_CALLERS)
        .min(shape.closed_loop_max);
    let closed_loop = shape.concurrency.min(shape.closed_loop_max);
    let mut capacity = None;
    for phase in ["warm-up", "capacity"] {
        let t = target.clone();
        let measured = drive(phase, callers, shape.ops, move |i| {
            let call = t.call(phase, i);
            async move {
                let answer = call.await;
                if !matches!(answer, Answer::Applied(_)) {
                    // Said once per failed call on stderr, so a failed run says why.
                    eprintln!(
                        "{}",
                        json!({"phase": phase, "answer": format!("{answer:?}")})
                    );
                }
                matches!(answer, Answer::Applied(_))
            }
        })
        .await;
        if measured.failed > 0 {
            return Err("BENCH_FAILED");
        }
        capacity = Some(measured);
    }
    let capacity = capacity.ok_or("BENCH_FAILED")?;
    let capacity_rate = shape.ops as f64 / capacity.elapsed.as_secs_f64().max(1e-9);
    let offered = (capacity_rate * shape.factor).max(1.0);
    let calls = (offered * shape.seconds).ceil() as usize;
    let rows_before = target.effect_rows().await?;

    // 2. Overload: calls due on schedule, issued by a bounded set of callers.
    let rss_before_mb = rss_mb(&process);
    super::report::reset_peak_rss_of(&process);
    let patience = labels.limits.wait * 4 + Duration::from_secs(30);
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        let process = process.clone();
        tokio::spawn(async move {
            let mut by_second = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            while sampling.load(Ordering::Relaxed) {
                tick.tick().await;
                by_second.push(rss_mb(&process));
            }
            by_second
        })
    };
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let max_lag_us = Arc::new(AtomicU64::new(0));
    let last_issue_us = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::with_capacity(shape.callers);
    for _ in 0..shape.callers.max(1) {
        let (target, next) = (target.clone(), next.clone());
        let (max_lag_us, last_issue_us) = (max_lag_us.clone(), last_issue_us.clone());
        workers.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= calls {
                    break;
                }
                let due = started + Duration::from_secs_f64(i as f64 / offered);
                let now = Instant::now();
                if due > now {
                    tokio::time::sleep_until(due.into()).await;
                } else {
                    max_lag_us.fetch_max((now - due).as_micros() as u64, Ordering::Relaxed);
                }
                let t0 = Instant::now();
                last_issue_us.fetch_max(
                    t0.duration_since(started).as_micros() as u64,
                    Ordering::Relaxed,
                );
                match tokio::time::timeout(patience, target.call("overload", i)).await {
                    Ok(Answer::Applied(id)) => tally.applied.push((i as u32, id)),
                    Ok(Answer::Unavailable) => tally.unavailable += 1,
                    Ok(Answer::Shed) => tally.shed += 1,
                    Ok(Answer::Replayed(_) | Answer::Other) => tally.other += 1,
                    Err(_) => tally.unanswered += 1,
                }
                tally.max_answer_us = tally.max_answer_us.max(t0.elapsed().as_micros() as u64);
            }
            tally
        }));
    }
    let mut all = Tally::default();
    for worker in workers {
        let t = worker.await.map_err(|_| "BENCH_FAILED")?;
        all.applied.extend(t.applied);
        all.unavailable += t.unavailable;
        all.shed += t.shed;
        all.other += t.other;
        all.unanswered += t.unanswered;
        all.max_answer_us = all.max_answer_us.max(t.max_answer_us);
    }
    sampling.store(false, Ordering::Relaxed);
    let seconds = (last_issue_us.load(Ordering::Relaxed) as f64 / 1e6).max(1e-6);

    // 3. Check: every acknowledged call replays its result; one effect row per call.
    let acknowledged = Arc::new(std::mem::take(&mut all.applied));
    let lost = if acknowledged.is_empty() {
        0
    } else {
        let (acks, t) = (acknowledged.clone(), target.clone());
        drive("read back", closed_loop, acks.len(), move |j| {
            let (i, id) = acks[j];
            let call = t.call("overload", i as usize);
            async move { call.await == Answer::Replayed(id) }
        })
        .await
        .failed
    };
    let rows = target.effect_rows().await? - rows_before;
    let rss_by_second_mb = sampler.await.unwrap_or_default();
    let rss_after_mb = rss_mb(&process);

    // 4. Normal service right after.
    let after = {
        let t = target.clone();
        drive("after", closed_loop, shape.ops, move |i| {
            let call = t.call("after", i);
            async move { matches!(call.await, Answer::Applied(_)) }
        })
        .await
    };
    // The kernel's high-water mark lags the resident counters a little; a sample above it
    // is the peak.
    let peak_rss_mb = rss_by_second_mb
        .iter()
        .copied()
        .chain([rss_before_mb, rss_after_mb])
        .fold(
            super::report::peak_rss_mb(&process).unwrap_or(0.0),
            f64::max,
        );
    let round = |x: f64| (x * 10.0).round() / 10.0;
    Ok(OverloadReport {
        workload: labels.workload,
        backend: labels.backend,
        process: if process == "self" { "bench" } else { "server" },
        capacity_ops_per_sec: round(capacity_rate),
        target_ops_per_sec: round(offered),
        offered_ops_per_sec: round(calls as f64 / seconds),
        seconds: (seconds * 100.0).round() / 100.0,
        callers: shape.callers,
        max_issue_lag_ms: max_lag_us.load(Ordering::Relaxed) / 1000,
        calls,
        applied: acknowledged.len(),
        unavailable: all.unavailable + all.shed,
        shed: all.shed,
        other_errors: all.other,
        unanswered: all.unanswered,
        acknowledged_lost: lost,
        extra_effects: rows - acknowledged.len() as i64,
        max_answer_ms: all.max_answer_us / 1000,
        rss_before_mb,
        peak_rss_mb,
        rss_by_second_mb,
        rss_after_mb,
        after_ops_per_sec: round(shape.ops as f64 / after.elapsed.as_secs_f64().max(1e-9)),
        after_failed: after.failed,
        queue_depth: labels.limits.depth,
        queue_wait_ms: labels.limits.wait.as_millis() as u64,
        max_in_flight: labels.max_in_flight,
        synchronous: labels.synchronous,
    })
}

/// An `overload-http` server: the child, the ledger it runs on (opened here too), and what to
/// drop when done.
pub(super) struct HttpServer {
    /// The target the workload drives.
    pub(super) target: Arc<HttpTarget>,
    /// The PostgreSQL schema dropped afterwards.
    pg: Option<super::pg::BenchSchema>,
}

impl HttpServer {
    /// Starts `serve --http --max-in-flight N` (with room for `connections`) on a fresh
    /// ledger: the SQLite file `db`, or a fresh schema of the PostgreSQL database at `url`;
    /// `connections` keep-alive connections are opened to it.
    pub(super) async fn start(
        db: &std::path::Path,
        synchronous: toolledger::store::sqlite::Synchronous,
        url: Option<&str>,
        max_in_flight: usize,
        connections: usize,
    ) -> Result<HttpServer, &'static str> {
        raise_open_files_limit();
        let (server_db, store, pg) = match url {
            None => {
                let store: Store = toolledger_reference::ledger::open_sqlite(
                    db,
                    Some(super::mcp::BACKEND_ID.to_string()),
                    false,
                    toolledger::store::sqlite::Synchronous::Full,
                )
                .map_err(|e| e.code())?
                .into();
                let server_db = super::mcp::ServerDb::Sqlite {
                    path: db.to_path_buf(),
                    synchronous,
                };
                (server_db, store, None)
            }
            Some(url) => {
                let backend_id = "postgres:bench-mcp";
                let pg = super::pg::BenchSchema::open_with(
                    url,
                    backend_id,
                    toolledger_reference::PG_MIGRATIONS,
                )?;
                let separator = if url.contains('?') { '&' } else { '?' };
                let server_db = super::mcp::ServerDb::Postgres {
                    url: format!("{url}{separator}options=-c%20search_path%3D{}", pg.name()),
                    backend_id: backend_id.to_string(),
                    dir: db.parent().unwrap_or(db).to_path_buf(),
                };
                (server_db, pg.engine().store().clone(), Some(pg))
            }
        };
        let token = super::mcp::add_principal(store.clone(), true)
            .await?
            .ok_or("BENCH_SETUP_FAILED")?;
        // Room for every connection of the bench: the workload measures the in-flight limit,
        // not callers left waiting to be accepted.
        let extra = [
            "--max-in-flight".to_string(),
            max_in_flight.to_string(),
            "--max-connections".to_string(),
            (connections + 64).to_string(),
        ];
        let started = McpClient::start_http(&server_db, &extra, token, connections).await;
        let client = match started {
            Ok(client) => client,
            Err(code) => {
                drop_schema(pg).await;
                return Err(code);
            }
        };
        Ok(HttpServer {
            target: Arc::new(HttpTarget { client, store }),
            pg,
        })
    }

    /// Stops the server and drops the PostgreSQL schema.
    pub(super) async fn finish(self) {
        let HttpServer { target, pg } = self;
        if let Ok(target) = Arc::try_unwrap(target) {
            super::mcp::finish(target.client).await;
        }
        drop_schema(pg).await;
    }
}

async fn drop_schema(pg: Option<super::pg::BenchSchema>) {
    if let Some(pg) = pg {
        let _ = tokio::task::spawn_blocking(move || pg.drop_schema()).await;
    }
}

/// Raises this process's soft limit of open files to its hard limit (the server child
/// inherits it): `overload-http` holds thousands of connections.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
