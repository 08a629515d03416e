//! The acknowledgement stream (a testing aid for crash tests): fresh operations against one
//! database, each key printed on stdout the moment its call returns, which is after its
//! batch's `COMMIT`. A test kills the process mid-run and checks that every printed key is in
//! the database.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use toolledger::clock::{SharedClock, SystemClock};
use toolledger::engine::Engine;
use toolledger::store::postgres::{PgOptions, PgStore};

use super::pg::BENCH_PG_MIGRATIONS;
use super::{bench_engine, fresh_op, key_of, Tuning};
use crate::Failure;
use toolledger::store::StoreOptions;

/// Runs `ops` fresh operations with `concurrency` callers against the SQLite file `path`,
/// under the keys `ack-<run>-00000000`, … with `<run>` random per process, so every run on
/// the same file applies new operations.
pub async fn run(
    path: PathBuf,
    concurrency: usize,
    ops: usize,
    tuning: Tuning,
) -> Result<(), Failure> {
    let run = run_id().map_err(Failure::code)?;
    let engine = bench_engine(&path, tuning).map_err(Failure::code)?;
    stream(engine, format!("ack-{run}"), concurrency, ops).await
}

/// Runs `ops` fresh operations with `concurrency` callers against the PostgreSQL schema
/// `schema` of the database at `url` (created with the bench tables if missing, and left in
/// place afterwards for the caller to inspect). The keys are `ack-<run>-00000000`, … with
/// `<run>` random per process, so every run on the same schema applies new operations.
pub async fn run_pg(
    url: &str,
    schema: &str,
    concurrency: usize,
    ops: usize,
) -> Result<(), Failure> {
    let run = run_id().map_err(Failure::code)?;
    let mut opts = PgOptions::new("postgres:bench")
        .with_migrations(BENCH_PG_MIGRATIONS)
        .in_schema(schema);
    opts.max_connections = 64;
    let store = PgStore::open(url, opts)?;
    let clock: SharedClock = Arc::new(SystemClock);
    let engine = Engine::new(store, clock);
    stream(engine, format!("ack-{run}"), concurrency, ops).await
}

/// Eight random hex digits naming one run's keys.
fn run_id() -> Result<String, &'static str> {
    crate::random_hex(4).ok_or("DATABASE_IO_ERROR")
}

/// The stream itself: operation `i` runs under `<prefix>-<i>` and its key is printed (and
/// flushed) as soon as the call returns `Ok`, applied now or replayed.
async fn stream(
    engine: Engine,
    prefix: String,
    concurrency: usize,
    ops: usize,
) -> Result<(), Failure> {
    let prefix = Arc::new(prefix);
    let measured = super::run::drive("ack", concurrency, ops, move |i| {
        let engine = engine.clone();
        let key = key_of(&prefix, i);
        async move {
            match fresh_op(&engine, key.clone(), i as i64).await {
                Ok(_) => {
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{key}").is_ok() && out.flush().is_ok()
                }
                Err(_) => false,
            }
        }
    })
    .await;
    if measured.failed > 0 {
        return Err(Failure::code("BENCH_FAILED"));
    }
    Ok(())
}
