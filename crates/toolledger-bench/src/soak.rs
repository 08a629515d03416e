//! The `retention-soak` workload: steady fresh calls (and some replays) with a short
//! retention on a fast clock, once with the pruner off and once with it on (or `rounds` such
//! pairs, the order alternating), and the size of the ledger over time.
//!
//! The ledger's clock moves one second per operation started ([`OpClock`]), so simulated time
//! passes as fast as the store serves calls and a run of `ops` operations spans `ops` seconds
//! whatever the machine. Every fresh call gets a retention deadline `period = ops / periods`
//! seconds after its start, and the pruner's tombstone horizon is the same `period`: an
//! operation is compacted one period after it was made and deleted one period later, so the
//! ledger should hold about two periods of operations once the run has crossed the first
//! horizon. Every tenth call replays a recent operation (still within its retention).
//!
//! The pruner is [`toolledger::prune::prune`] every `prune_interval` of real time, each pass
//! working until nothing expired is left, by default with the background pruner's options
//! ([`toolledger::prune::PruneOptions::background`]: on SQLite a few rows at the end of each
//! transaction the writer commits and small steps alone when it is idle; on PostgreSQL a rest
//! after each batch), as `serve` runs it (`prune_batch` and `prune_pace` change them); the
//! workload times each pass. With a `rate` the calls arrive at that
//! steady rate (latency from each call's due time) instead of as fast as the callers go. The effect writes nothing besides the ledger's row, so the
//! database holds the ledger alone. Its size is sampled `samples` times: SQLite's pages in
//! use (`page_count - freelist_count`, times `page_size`) and the file with its WAL;
//! PostgreSQL's `pg_total_relation_size` of every table in the workload's schema.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};
use toolledger::clock::{Clock, SharedClock, SystemClock};
use toolledger::effect::{EffectTx, RowExt};
use toolledger::engine::{Engine, InlineEffect};
use toolledger::prune::{prune, PruneOptions};
use toolledger::store::Store;
use toolledger::{Error, Principal};

use super::report::{self, Report};
use super::run::drive_classes;
use super::{bench_call, key_of, pg, Tuning};

/// Every `REPLAY_EVERY`-th call is a replay.
const REPLAY_EVERY: usize = 10;

/// What a soak does.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Callers in flight.
    pub concurrency: usize,
    /// Calls per run (fresh and replays); also the simulated seconds a run spans.
    pub ops: usize,
    /// Retention periods a run crosses.
    pub periods: usize,
    /// Real time between two prune passes.
    pub prune_interval: Duration,
    /// Size samples per run besides the one before the first call.
    pub samples: usize,
    /// Calls offered per second (`None`: as fast as the callers go).
    pub rate: Option<f64>,
    /// Rows per prune transaction: on PostgreSQL the background pruner's batches (at most
    /// 100), on SQLite the most rows of one of the writer's steps.
    pub prune_batch: usize,
    /// The pruner's rest after each transaction, as a multiple of its duration.
    pub prune_pace: u32,
    /// Pairs of runs (pruner off and on), the order alternating from pair to pair.
    pub rounds: usize,
}

impl Shape {
    /// The retention (and the tombstone horizon), in simulated seconds.
    fn period(&self) -> i64 {
        (self.ops / self.periods).max(1) as i64
    }

    /// How far back a replay reaches, in operations: well within the retention, and far
    /// enough back that the replayed call has been answered.
    fn replay_distance(&self) -> usize {
        (self.period() as usize / 4)
            .clamp(1, 1000)
            .max(self.concurrency * 4)
    }

    /// The fresh operation call `i` replays, if it is a replay.
    fn replays(&self, i: usize) -> Option<usize> {
        let d = self.replay_distance();
        if i % REPLAY_EVERY != REPLAY_EVERY - 1 || i <= d {
            return None;
        }
        let j = i - d;
        Some(if j % REPLAY_EVERY == REPLAY_EVERY - 1 {
            j - 1
        } else {
            j
        })
    }
}

/// Where a soak runs.
pub enum Target {
    /// Fresh SQLite files named from this path and the run (`-1-off.sqlite`, `-1-on.sqlite`,
    /// `-2-on.sqlite`, …).
    Sqlite(PathBuf, Tuning),
    /// A fresh schema per run in the database at this URL.
    Postgres(String),
}

/// The ledger's clock in a soak: `epoch` plus one second per operation started.
#[derive(Debug)]
struct OpClock {
    epoch: i64,
    started: Arc<AtomicUsize>,
}

impl Clock for OpClock {
    fn now(&self) -> i64 {
        self.epoch + self.started.load(Ordering::SeqCst) as i64
    }
}

/// The soak's inline effect: an answer, no business row.
struct Answer(i64);

impl InlineEffect for Answer {
    fn apply(&self, _tx: &mut dyn EffectTx, _principal: &Principal) -> Result<Value, Error> {
        Ok(json!({"n": self.0}))
    }
}

/// The size of the ledger at one point of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Operations started so far (= simulated seconds since the start).
    pub ops: usize,
    /// Real seconds since the first call.
    pub seconds: f64,
    /// Operation rows with their payload.
    pub live: i64,
    /// Tombstones.
    pub tombstones: i64,
    /// SQLite: pages in use times the page size; PostgreSQL: `pg_total_relation_size` of the
    /// schema's tables (indexes and TOAST included).
    pub bytes: i64,
    /// SQLite: the database file and its WAL on disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_bytes: Option<u64>,
}

/// One run's line: `retention-soak` with the pruner on or off.
#[derive(Debug, Serialize)]
pub struct SoakReport {
    /// `retention-soak`.
    pub workload: &'static str,
    /// Storage backend.
    pub backend: &'static str,
    /// `on` or `off`.
    pub pruner: &'static str,
    /// The pair of runs this one belongs to (from 1); odd pairs run the pruner off first,
    /// even pairs on first.
    pub round: usize,
    /// Callers in flight.
    pub concurrency: usize,
    /// Calls made (fresh and replays).
    pub ops: usize,
    /// Wall time of the calls.
    pub seconds: f64,
    /// `ops / seconds`.
    pub ops_per_sec: f64,
    /// Simulated seconds the run spanned (one per call).
    pub simulated_seconds: usize,
    /// Retention of every operation, in simulated seconds.
    pub retention_seconds: i64,
    /// The tombstone horizon, in simulated seconds after the retention deadline.
    pub tombstone_ttl_seconds: i64,
    /// Real time from the start of one prune pass to the start of the next (ms).
    pub prune_interval_ms: u64,
    /// Calls offered per second (absent: as fast as the callers go).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offered_rate: Option<f64>,
    /// Rows per prune transaction: on PostgreSQL the background pruner's batches (at most
    /// 100), on SQLite the most rows of one of the writer's steps.
    pub prune_batch: usize,
    /// The pruner's rest after each transaction, as a multiple of its duration.
    pub prune_pace: u32,
    /// Fresh calls.
    pub fresh_ops: usize,
    /// Fresh calls that were not applied.
    pub fresh_failed: usize,
    /// Median latency of a fresh call (µs).
    pub fresh_p50_us: u64,
    /// 99th-percentile latency of a fresh call (µs).
    pub fresh_p99_us: u64,
    /// Replays.
    pub replay_ops: usize,
    /// Replays that did not replay.
    pub replay_failed: usize,
    /// Median latency of a replay (µs).
    pub replay_p50_us: u64,
    /// 99th-percentile latency of a replay (µs).
    pub replay_p99_us: u64,
    /// The first call that did not end as expected: its error's code and message, or the
    /// replay flag it got; absent when every call did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
    /// PostgreSQL only: write-ahead log the server inserted from the first call to the end of
    /// the run (the advance of `pg_current_wal_insert_lsn()`: the whole server's log, so
    /// another database's writes meanwhile count too), in bytes per call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wal_bytes_per_call: Option<f64>,
    /// `fresh_p99_us` over the pruner-off run's (on the pruner-on line).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fresh_p99_vs_off: Option<f64>,
    /// `replay_p99_us` over the pruner-off run's (on the pruner-on line).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_p99_vs_off: Option<f64>,
    /// Prune passes run.
    pub prune_passes: u64,
    /// Prune passes that failed.
    pub prune_failed: u64,
    /// Operations compacted to tombstones.
    pub compacted: u64,
    /// Tombstones deleted at the horizon.
    pub deleted: u64,
    /// Free pages given back to the file system (SQLite).
    pub reclaimed_pages: i64,
    /// Real seconds the prune passes took, together.
    pub prune_busy_seconds: f64,
    /// The longest prune pass (ms).
    pub prune_longest_pass_ms: u64,
    /// Rows compacted and deleted per second of pass.
    pub prune_rows_per_busy_sec: f64,
    /// Rows compacted and deleted per second of the run.
    pub prune_rows_per_sec: f64,
    /// `bytes` at the end over `bytes` at the sample nearest half the run: about 1 when the
    /// size has levelled off, about 2 when it grows with the calls.
    pub growth_second_half: f64,
    /// CPU time per call (µs, every thread of this process, the pruner's included).
    pub cpu_us_per_op: f64,
    /// Peak resident set of this process during the run (MiB).
    pub peak_rss_mb: f64,
    /// The `synchronous` setting.
    pub synchronous: &'static str,
    /// The ledger's size over the run.
    pub samples: Vec<Sample>,
}

/// What the prune passes of one run did.
#[derive(Default)]
struct Tally {
    passes: u64,
    failed: u64,
    compacted: u64,
    deleted: u64,
    reclaimed_pages: i64,
    busy: Duration,
    longest: Duration,
}

/// Runs the soak `shape.rounds` times with the pruner off and on, two lines a round in the
/// order they ran: off first in odd rounds, on first in even ones. Whichever runs first in an
/// invocation tends to have the worse tail (an A/A pair, the pruner never running, measured
/// 0.25–0.54× on PostgreSQL), so an even number of rounds puts each side first equally often.
pub async fn run(target: Target, shape: Shape) -> Result<Vec<SoakReport>, &'static str> {
    let ratio = |a: u64, b: u64| (b > 0).then(|| super::round2(a as f64 / b as f64));
    let mut lines = Vec::with_capacity(2 * shape.rounds);
    for round in 1..=shape.rounds.max(1) {
        let on_first = round % 2 == 0;
        let mut pair = [
            run_once(&target, shape, on_first, round).await?,
            run_once(&target, shape, !on_first, round).await?,
        ];
        let (on, off) = if on_first { (0, 1) } else { (1, 0) };
        pair[on].fresh_p99_vs_off = ratio(pair[on].fresh_p99_us, pair[off].fresh_p99_us);
        pair[on].replay_p99_vs_off = ratio(pair[on].replay_p99_us, pair[off].replay_p99_us);
        lines.extend(pair);
    }
    Ok(lines)
}

/// One run on a fresh database (schema).
async fn run_once(
    target: &Target,
    shape: Shape,
    pruner: bool,
    round: usize,
) -> Result<SoakReport, &'static str> {
    let suffix = if pruner { "on" } else { "off" };
    let (store, file, schema, backend, synchronous) = match target {
        Target::Sqlite(base, tuning) => {
            let path = PathBuf::from(format!("{}-{round}-{suffix}.sqlite", base.display()));
            let store = Store::from(super::open_bench_store(&path, *tuning)?);
            (
                store,
                Some(path),
                None,
                "sqlite",
                tuning.synchronous.as_str(),
            )
        }
        Target::Postgres(url) => {
            let schema = pg::BenchSchema::open(url)?;
            (schema.store(), None, Some(schema), "postgres", "on")
        }
    };
    report::reset_peak_rss();
    let started = Arc::new(AtomicUsize::new(0));
    let clock: SharedClock = Arc::new(OpClock {
        epoch: SystemClock.now(),
        started: started.clone(),
    });
    let engine = Engine::new(store.clone(), clock.clone());
    let period = shape.period();
    let first = sample(&store, file.clone(), 0, Instant::now()).await?;
    let wal_before = wal_bytes(&store, backend).await;

    let (stop_pruner, stopped) = tokio::sync::oneshot::channel::<()>();
    let opts = PruneOptions {
        batch: shape.prune_batch,
        pace: shape.prune_pace,
        ..PruneOptions::background(Some(period))
    };
    // On SQLite the store's writer takes the pruner's work, in steps `batch` only caps.
    let prune_batch = match backend {
        "postgres" => opts.own_batch(),
        _ => opts.batch,
    };
    let pruning = pruner.then(|| {
        tokio::spawn(prune_every(
            store.clone(),
            clock.clone(),
            opts,
            shape.prune_interval,
            stopped,
        ))
    });
    let t0 = Instant::now();
    let (stop_sampler, sampler_stopped) = tokio::sync::oneshot::channel::<()>();
    let sampling = tokio::spawn(sample_every(
        store.clone(),
        file.clone(),
        started.clone(),
        shape,
        t0,
        sampler_stopped,
    ));

    // The first call that did not end as expected, and why (a failure tells its cause).
    let first_failure: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let failures = first_failure.clone();
    let [fresh, replay] = drive_classes(
        "retention-soak",
        shape.concurrency,
        shape.ops,
        shape.rate,
        move |i| usize::from(shape.replays(i).is_some()),
        move |i| {
            let engine = engine.clone();
            let clock = clock.clone();
            let started = started.clone();
            let first_failure = failures.clone();
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                let (n, replay) = match shape.replays(i) {
                    Some(j) => (j, true),
                    None => (i, false),
                };
                let mut call = bench_call(key_of("soak", n), n as i64, false);
                call.retention_deadline = Some(clock.now() + period);
                let effect: Arc<dyn InlineEffect> = Arc::new(Answer(n as i64));
                let out = engine.execute_inline(call, effect).await;
                let ok = matches!(&out, Ok(o) if o.replayed == replay);
                if !ok {
                    let what = match out {
                        Ok(o) => format!("replayed is {}, not {replay}", o.replayed),
                        Err(e) => format!("{}: {}", e.code, e.message),
                    };
                    if let Ok(mut first) = first_failure.lock() {
                        first.get_or_insert(what);
                    }
                }
                ok
            }
        },
    )
    .await;
    let seconds = t0.elapsed();
    let _ = stop_sampler.send(());
    let _ = stop_pruner.send(());
    let tally = match pruning {
        Some(task) => task.await.map_err(|_| "BENCH_FAILED")?,
        None => Tally::default(),
    };
    let mut samples = vec![first];
    samples.extend(sampling.await.map_err(|_| "BENCH_FAILED")??);
    samples.push(sample(&store, file.clone(), shape.ops, t0).await?);
    let wal_bytes_per_call = match (wal_before, wal_bytes(&store, backend).await) {
        (Some(before), Some(after)) => {
            Some(((after - before) as f64 / shape.ops.max(1) as f64).round())
        }
        _ => None,
    };
    drop(store);
    if let Some(schema) = schema {
        tokio::task::spawn_blocking(move || schema.drop_schema())
            .await
            .map_err(|_| "BENCH_FAILED")?;
    }

    let cpu = fresh.cpu;
    let (fresh, replay) = (
        Report::new("fresh", shape.concurrency, fresh.latencies_us.len(), fresh),
        Report::new(
            "replay",
            shape.concurrency,
            replay.latencies_us.len(),
            replay,
        ),
    );
    let secs = seconds.as_secs_f64().max(1e-9);
    let rows = (tally.compacted + tally.deleted) as f64;
    let busy = tally.busy.as_secs_f64();
    let half = samples
        .iter()
        .min_by_key(|s| s.ops.abs_diff(shape.ops / 2))
        .map_or(0, |s| s.bytes);
    let last = samples.last().map_or(0, |s| s.bytes);
    Ok(SoakReport {
        workload: "retention-soak",
        backend,
        pruner: suffix,
        round,
        concurrency: shape.concurrency,
        ops: shape.ops,
        seconds: (secs * 1000.0).round() / 1000.0,
        ops_per_sec: (shape.ops as f64 / secs).round(),
        simulated_seconds: shape.ops,
        retention_seconds: period,
        tombstone_ttl_seconds: period,
        prune_interval_ms: shape.prune_interval.as_millis() as u64,
        offered_rate: shape.rate,
        prune_batch,
        prune_pace: shape.prune_pace,
        fresh_ops: fresh.ops,
        fresh_failed: fresh.failed,
        fresh_p50_us: fresh.p50_us,
        fresh_p99_us: fresh.p99_us,
        replay_ops: replay.ops,
        replay_failed: replay.failed,
        replay_p50_us: replay.p50_us,
        replay_p99_us: replay.p99_us,
        wal_bytes_per_call,
        first_failure: first_failure.lock().ok().and_then(|f| f.clone()),
        fresh_p99_vs_off: None,
        replay_p99_vs_off: None,
        prune_passes: tally.passes,
        prune_failed: tally.failed,
        compacted: tally.compacted,
        deleted: tally.deleted,
        reclaimed_pages: tally.reclaimed_pages,
        prune_busy_seconds: (busy * 1000.0).round() / 1000.0,
        prune_longest_pass_ms: tally.longest.as_millis() as u64,
        prune_rows_per_busy_sec: if busy > 0.0 {
            (rows / busy).round()
        } else {
            0.0
        },
        prune_rows_per_sec: (rows / secs).round(),
        growth_second_half: if half > 0 {
            super::round2(last as f64 / half as f64)
        } else {
            0.0
        },
        cpu_us_per_op: (cpu.as_secs_f64() * 1e6 / shape.ops as f64 * 10.0).round() / 10.0,
        peak_rss_mb: fresh.peak_rss_mb,
        synchronous,
        samples,
    })
}

/// The PostgreSQL server's write-ahead log insert position, in bytes; `None` on SQLite, or
/// when the server does not say.
async fn wal_bytes(store: &Store, backend: &str) -> Option<i64> {
    if backend != "postgres" {
        return None;
    }
    store
        .read(|tx: &mut dyn EffectTx| -> Result<Option<i64>, Error> {
            Ok(tx
                .query_opt(
                    "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint",
                    &[],
                )
                .ok()
                .flatten()
                .and_then(|row| row.int(0).ok()))
        })
        .await
        .ok()
        .flatten()
}

/// [`prune`] on the pass schedule of `every` until `stop`, as the background pruner does,
/// timing each pass (a pass in flight is finished).
async fn prune_every(
    store: Store,
    clock: SharedClock,
    opts: PruneOptions,
    every: Duration,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Tally {
    let mut tally = Tally::default();
    let mut ticks = toolledger::prune::pass_schedule(every);
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => return tally,
            _ = ticks.tick() => {}
        }
        let t0 = Instant::now();
        let res = prune(&store, &clock, &opts).await;
        let took = t0.elapsed();
        tally.passes += 1;
        tally.busy += took;
        tally.longest = tally.longest.max(took);
        match res {
            Ok(r) => {
                tally.compacted += r.compacted;
                tally.deleted += r.deleted;
                tally.reclaimed_pages += r.reclaimed_pages;
            }
            Err(_) => tally.failed += 1,
        }
    }
}

/// Samples the ledger each time another `ops / samples` operations have started, until
/// `stop` (the last sample is the caller's, after the last call and the last prune pass).
async fn sample_every(
    store: Store,
    file: Option<PathBuf>,
    started: Arc<AtomicUsize>,
    shape: Shape,
    t0: Instant,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Result<Vec<Sample>, &'static str> {
    let step = (shape.ops / shape.samples.max(1)).max(1);
    let mut next = step;
    let mut samples = Vec::new();
    while next < shape.ops {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        let n = started.load(Ordering::SeqCst);
        if n >= next {
            samples.push(sample(&store, file.clone(), n, t0).await?);
            next = (n / step + 1) * step;
        }
    }
    Ok(samples)
}

/// The ledger's rows and size now.
async fn sample(
    store: &Store,
    file: Option<PathBuf>,
    ops: usize,
    t0: Instant,
) -> Result<Sample, &'static str> {
    let sqlite = file.is_some();
    let (live, tombstones, bytes) = store
        .read(
            move |tx: &mut dyn EffectTx| -> Result<(i64, i64, i64), Error> {
                let rows = toolledger::prune::row_counts(tx)?;
                let size = if sqlite {
                    "SELECT (p.page_count - f.freelist_count) * s.page_size
                 FROM pragma_page_count() AS p, pragma_freelist_count() AS f,
                      pragma_page_size() AS s"
                } else {
                    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = current_schema() AND c.relkind = 'r'"
                };
                let bytes = tx
                    .query_opt(size, &[])?
                    .ok_or_else(|| Error::unavailable("no size"))?
                    .int(0)?;
                Ok((rows.live, rows.tombstones, bytes))
            },
        )
        .await
        .map_err(|_| "BENCH_FAILED")?;
    let file_bytes = file.map(|path| {
        let len = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
        len(&path) + len(&PathBuf::from(format!("{}-wal", path.display())))
    });
    Ok(Sample {
        ops,
        seconds: super::round2(t0.elapsed().as_secs_f64()),
        live,
        tombstones,
        bytes,
        file_bytes,
    })
}
