//! The `overload` workload: fresh calls offered at several times what the store can serve,
//! for a bounded time, then checked.
//!
//! 1. *Capacity*: `--ops` fresh calls, closed loop, at [`CAPACITY_CALLERS`] callers (at least
//!    `--concurrency`) measure what the store serves when its batches are full (after as many
//!    calls to warm it up).
//! 2. *Overload*: for `--overload-seconds`, fresh calls arrive at `--overload-factor` times
//!    that rate (open loop: each call is issued on schedule, whether or not earlier ones were
//!    answered). The store's bounded queues answer what they cannot serve in time
//!    `unavailable`.
//! 3. *Check*: every call was answered (a result or `unavailable`); every acknowledged call
//!    replays its acknowledged result; the effect table holds exactly one row per
//!    acknowledged call (a call answered `unavailable` wrote nothing).
//! 4. *After*: `--ops` fresh calls again, closed loop, measure normal service right after.
//!
//! One JSON line reports the rates, the answers, what was lost (must be 0), and the process's
//! resident memory before the overload and at its peak.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use toolledger::effect::{EffectTx, RowExt};
use toolledger::engine::{Engine, InlineEffect};
use toolledger::store::QueueLimits;
use toolledger::{Error, ErrorCode};

use super::run::drive;
use super::{bench_call, fresh_op, key_of, BenchEffect};

/// Closed-loop callers of the capacity phase, at least: enough to fill the stores' batches
/// (SQLite commits up to 128 jobs at once), well below a queue's default depth.
pub const CAPACITY_CALLERS: usize = 256;

/// A call not answered yet.
const PENDING: i64 = -1;
/// A call answered `unavailable`.
const UNAVAILABLE: i64 = -2;
/// A call answered with any other error.
const OTHER: i64 = -3;

/// How the overload phase is shaped.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Closed-loop callers of the capacity and after phases.
    pub concurrency: usize,
    /// Calls of the capacity and after phases.
    pub ops: usize,
    /// How long calls arrive at the overload rate.
    pub seconds: f64,
    /// The overload rate as a multiple of the measured capacity.
    pub factor: f64,
}

/// The `overload` line.
#[derive(Debug, Serialize)]
pub struct OverloadReport {
    /// Always `overload`.
    pub workload: &'static str,
    /// Storage backend.
    pub backend: &'static str,
    /// Fresh calls per second the store served, closed loop, before the overload.
    pub capacity_ops_per_sec: f64,
    /// Calls per second the overload aimed at (`--overload-factor` × capacity).
    pub target_ops_per_sec: f64,
    /// Calls per second actually offered (the calls over the time it took to issue them).
    pub offered_ops_per_sec: f64,
    /// How long calls were offered.
    pub seconds: f64,
    /// Calls offered.
    pub calls: usize,
    /// Calls answered with a result.
    pub applied: usize,
    /// Calls answered `unavailable`.
    pub unavailable: usize,
    /// Calls answered with another error.
    pub other_errors: usize,
    /// Calls never answered.
    pub unanswered: usize,
    /// Acknowledged calls whose replay did not return the acknowledged result.
    pub acknowledged_lost: usize,
    /// Effect rows beyond one per acknowledged call (an `unavailable` call that wrote).
    pub extra_effects: i64,
    /// The longest any call waited for its answer, in milliseconds.
    pub max_answer_ms: u64,
    /// Resident memory of the process before the overload, in MiB.
    pub rss_before_mb: f64,
    /// Peak resident memory of the process during the run, in MiB.
    pub peak_rss_mb: f64,
    /// Fresh calls per second served right after the overload (closed loop).
    pub after_ops_per_sec: f64,
    /// Calls of the after phase that failed (must be 0).
    pub after_failed: usize,
    /// The store's queue depth.
    pub queue_depth: usize,
    /// The store's longest queue wait, in milliseconds.
    pub queue_wait_ms: u64,
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

/// Resident memory (`VmRSS`) of this process, in MiB with one decimal.
fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    (kb / 1024.0 * 10.0).round() / 10.0
}

/// Runs the workload on `engine` (a fresh database with the bench table).
pub async fn run(
    engine: Engine,
    shape: Shape,
    backend: &'static str,
    synchronous: &'static str,
    limits: QueueLimits,
) -> Result<OverloadReport, &'static str> {
    // 1. Capacity, after a warm-up of as many calls.
    let callers = shape.concurrency.max(CAPACITY_CALLERS);
    let mut capacity = None;
    for phase in ["warm-up", "capacity"] {
        let engine = engine.clone();
        let measured = drive(phase, callers, shape.ops, move |i| {
            let engine = engine.clone();
            async move {
                let out = fresh_op(&engine, key_of(phase, i), i as i64).await;
                if let Err(e) = &out {
                    // Said once per failed call on stderr, so a failed run says why.
                    eprintln!(
                        "{}",
                        serde_json::json!({"phase": phase, "code": e.code.as_str(), "message": e.message})
                    );
                }
                matches!(out, Ok(true))
            }
        })
        .await;
        if measured.failed > 0 {
            return Err("BENCH_FAILED");
        }
        capacity = Some(measured);
    }
    let capacity = capacity.ok_or("BENCH_FAILED")?;
    if capacity.failed > 0 {
        return Err("BENCH_FAILED");
    }
    let capacity_rate = shape.ops as f64 / capacity.elapsed.as_secs_f64().max(1e-9);
    let offered = (capacity_rate * shape.factor).max(1.0);
    let calls = (offered * shape.seconds).ceil() as usize;

    // 2. Overload, open loop.
    let outcomes: Arc<Vec<AtomicI64>> =
        Arc::new((0..calls).map(|_| AtomicI64::new(PENDING)).collect());
    let max_answer_us = Arc::new(AtomicI64::new(0));
    let rss_before_mb = rss_mb();
    super::report::reset_peak_rss();
    let started = Instant::now();
    let mut issued = 0usize;
    let mut ticker = tokio::time::interval(Duration::from_millis(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let answered = Arc::new(AtomicUsize::new(0));
    while issued < calls {
        ticker.tick().await;
        let due = ((started.elapsed().as_secs_f64() * offered) as usize).min(calls);
        while issued < due {
            let i = issued;
            issued += 1;
            let engine = engine.clone();
            let outcomes = outcomes.clone();
            let max_answer_us = max_answer_us.clone();
            let answered = answered.clone();
            tokio::spawn(async move {
                let t0 = Instant::now();
                let key = key_of("overload", i);
                let effect: Arc<dyn InlineEffect> =
                    Arc::new(BenchEffect::new(key.clone(), i as i64));
                let out = engine
                    .execute_inline(bench_call(key, i as i64, false), effect)
                    .await;
                let value = match out {
                    Ok(o) if !o.replayed => effect_id(&o.result).unwrap_or(OTHER),
                    Ok(_) => OTHER,
                    Err(e) if e.code == ErrorCode::Unavailable => UNAVAILABLE,
                    Err(_) => OTHER,
                };
                outcomes[i].store(value, Ordering::Relaxed);
                max_answer_us.fetch_max(t0.elapsed().as_micros() as i64, Ordering::Relaxed);
                answered.fetch_add(1, Ordering::Release);
            });
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    // Every call is answered within the queue's wait plus one transaction; give it ample time.
    let patience = limits.wait * 4 + Duration::from_secs(30);
    let drain_started = Instant::now();
    while answered.load(Ordering::Acquire) < calls && drain_started.elapsed() < patience {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let mut applied = Vec::new();
    let (mut unavailable, mut other, mut unanswered) = (0, 0, 0);
    for (i, o) in outcomes.iter().enumerate() {
        match o.load(Ordering::Relaxed) {
            PENDING => unanswered += 1,
            UNAVAILABLE => unavailable += 1,
            OTHER => other += 1,
            id => applied.push((i, id)),
        }
    }

    // 3. Check: every acknowledged call replays its result; one effect row per call.
    let acknowledged = Arc::new(applied);
    let lost = if acknowledged.is_empty() {
        0
    } else {
        let acks = acknowledged.clone();
        let engine = engine.clone();
        drive("read back", shape.concurrency, acks.len(), move |j| {
            let engine = engine.clone();
            let (i, id) = acks[j];
            async move {
                let key = key_of("overload", i);
                let effect: Arc<dyn InlineEffect> =
                    Arc::new(BenchEffect::new(key.clone(), i as i64));
                matches!(
                    engine.execute_inline(bench_call(key, i as i64, false), effect).await,
                    Ok(o) if o.replayed && effect_id(&o.result) == Some(id)
                )
            }
        })
        .await
        .failed
    };
    let rows = engine
        .store()
        .read(|tx: &mut dyn EffectTx| -> Result<i64, Error> {
            tx.query_opt(
                "SELECT count(*) FROM bench_effects WHERE operation_key LIKE 'overload-%'",
                &[],
            )?
            .ok_or_else(|| Error::unavailable("no count"))?
            .int(0)
        })
        .await
        .map_err(|_| "BENCH_FAILED")?;

    // 4. Normal service right after.
    let after = {
        let engine = engine.clone();
        drive("after", shape.concurrency, shape.ops, move |i| {
            let engine = engine.clone();
            async move {
                matches!(
                    fresh_op(&engine, key_of("after", i), i as i64).await,
                    Ok(true)
                )
            }
        })
        .await
    };
    let peak_rss_mb = super::report::peak_rss_mb("self").unwrap_or(0.0);
    let round = |x: f64| (x * 10.0).round() / 10.0;
    Ok(OverloadReport {
        workload: "overload",
        backend,
        capacity_ops_per_sec: round(capacity_rate),
        target_ops_per_sec: round(offered),
        offered_ops_per_sec: round(calls as f64 / seconds.max(1e-9)),
        seconds: (seconds * 100.0).round() / 100.0,
        calls,
        applied: acknowledged.len(),
        unavailable,
        other_errors: other,
        unanswered,
        acknowledged_lost: lost,
        extra_effects: rows - acknowledged.len() as i64,
        max_answer_ms: (max_answer_us.load(Ordering::Relaxed).max(0) / 1000) as u64,
        rss_before_mb,
        peak_rss_mb,
        after_ops_per_sec: round(shape.ops as f64 / after.elapsed.as_secs_f64().max(1e-9)),
        after_failed: after.failed,
        queue_depth: limits.depth,
        queue_wait_ms: limits.wait.as_millis() as u64,
        synchronous,
    })
}

/// The effect row id in a bench result.
fn effect_id(result: &serde_json::Value) -> Option<i64> {
    result["effect_id"].as_i64()
}
