//! The `operations-list` workload: what `toolledger operations list` costs on a large ledger.
//!
//! The ledger is seeded first (untimed) through the public inline path, 64 callers at a time:
//! `--list-rows` operations (default 100,000), of which one in a thousand is left
//! `in_progress` (a multi-step operation whose first step committed, [`Engine::begin_steps`]),
//! the rest `applied`. Then two lines, each `ops` reads of the first page (100 rows, newest
//! first, the command's default) in one read snapshot of the store, exactly the query the
//! command runs:
//!
//! - `operations-list`: no filter (the newest 100 of every operation);
//! - `operations-list-state`: `--state in_progress` (the handful of unsure operations among
//!   the finished ones, served by the `operations_by_state` index).
//!
//! Both lines carry `rows` (the operations in the ledger) and count a read as succeeded when
//! it returned the page the seed implies.

use std::path::PathBuf;
use std::sync::Arc;

use toolledger::clock::{Clock, SystemClock};
use toolledger::engine::{Begun, Engine, InlineEffect};
use toolledger::operations::{self, ListQuery};
use toolledger::OperationState;

use super::report::Report;
use super::run::drive;
use super::{bench_call, bench_engine, fresh_op, key_of, BenchEffect, Tuning};

/// Rows of the first page (the command's default `--limit`).
const PAGE: u32 = 100;

/// One operation in this many is left `in_progress`.
const UNSURE_EVERY: usize = 1000;

/// Seeds `rows` operations, then measures both listings with `concurrency` readers.
pub async fn run(
    db: PathBuf,
    concurrency: usize,
    ops: usize,
    rows: usize,
    tuning: Tuning,
) -> Result<Vec<Report>, &'static str> {
    let engine = bench_engine(&db, tuning)?;
    let unsure = seed(&engine, rows).await?;
    let store = engine.store().clone();
    let all = listing("operations-list", Vec::new(), rows.min(PAGE as usize));
    let filtered = listing(
        "operations-list-state",
        vec![OperationState::InProgress],
        unsure.min(PAGE as usize),
    );
    let mut reports = Vec::new();
    for (name, query, expected) in [all, filtered] {
        let measured = drive(name, concurrency, ops, {
            let store = store.clone();
            move |_| {
                let (store, query) = (store.clone(), query.clone());
                async move {
                    let page = store
                        .read(move |tx| operations::list(tx, &query))
                        .await
                        .map(|p: Vec<_>| p.len());
                    matches!(page, Ok(n) if n == expected)
                }
            }
        })
        .await;
        let mut r = Report::new(name, concurrency, ops, measured);
        r.rows = Some(rows);
        reports.push(r);
    }
    Ok(reports)
}

fn listing(
    name: &'static str,
    states: Vec<OperationState>,
    expected: usize,
) -> (&'static str, ListQuery, usize) {
    let query = ListQuery {
        states,
        now: SystemClock.now(),
        limit: PAGE,
        ..ListQuery::default()
    };
    (name, query, expected)
}

/// Seeds `rows` operations; returns how many were left `in_progress`.
pub(super) async fn seed(engine: &Engine, rows: usize) -> Result<usize, &'static str> {
    let measured = drive("seed", 64, rows, {
        let engine = engine.clone();
        move |i| {
            let engine = engine.clone();
            async move {
                if i % UNSURE_EVERY == UNSURE_EVERY - 1 {
                    let key = key_of("unsure", i);
                    let first: Arc<dyn InlineEffect> =
                        Arc::new(BenchEffect::new(key.clone(), i as i64));
                    matches!(
                        engine
                            .begin_steps(bench_call(key, i as i64, false), first)
                            .await,
                        Ok(Begun::Started { .. })
                    )
                } else {
                    fresh_op(&engine, key_of("seed", i), i as i64)
                        .await
                        .unwrap_or(false)
                }
            }
        }
    })
    .await;
    if measured.failed > 0 {
        return Err("BENCH_SEED_FAILED");
    }
    Ok(rows / UNSURE_EVERY)
}
