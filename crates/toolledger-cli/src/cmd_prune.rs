//! `toolledger prune [--dry-run] [--limit N] [--batch N] [--tombstone-ttl DUR|never]`:
//! compaction after retention and the tombstone horizon, once, for cron and operators.
//!
//! Runs [`toolledger::prune::prune`]: settled operations past their retention deadline become
//! tombstones, tombstones past the horizon are deleted (their keys forgotten), in batches of
//! short transactions. Prints one JSON summary: `compacted`, `deleted`,
//! `kept_unsettled` (operations past their retention deadline that wait for an operator),
//! `oldest_unsettled_age_seconds`, `batches`, `busy` (another pruner of the ledger was
//! working: this run stopped early; not an error), `dry_run`, `tombstone_ttl_seconds` (null
//! for `never`), `rows` (live and tombstone operation rows after the run) and `totals` (the
//! ledger's running totals), `reclaimed_pages` (free pages a SQLite file in `auto_vacuum =
//! INCREMENTAL` mode gave back). `--dry-run` opens the ledger read-only and changes nothing.
//!
//! `--vacuum` (SQLite): afterwards, one `VACUUM` of the whole file, which also switches a file
//! created before `auto_vacuum = INCREMENTAL` was the default to it, so later prunes give
//! pages back. It rewrites the file and holds the write lock while it runs (writers wait or
//! answer `unavailable`): run it once, at a quiet time, with room for a copy of the file.

use std::sync::Arc;

use serde_json::json;
use toolledger::clock::{ManualClock, SharedClock, SystemClock};
use toolledger::effect::EffectTx;
use toolledger::prune::{self, PruneOptions};
use toolledger_cli::common::{self, Backend, StoreArgs, StoreConfig};
use toolledger_cli::exit::{Failure, Outcome};
use toolledger_cli::prune::{parse_ttl, TombstoneTtl};

use crate::cmd_dispatch::block_on;

/// `prune` options.
#[derive(clap::Args, Debug)]
pub struct PruneArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Count what a run would do and change nothing (the ledger is opened read-only).
    #[arg(long)]
    pub dry_run: bool,
    /// Most operations compacted, and most tombstones deleted, in this run (each).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// Rows changed per transaction (1 to 10000).
    #[arg(long, value_name = "N", default_value_t = prune::DEFAULT_BATCH as u64,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub batch: u64,
    /// How long a tombstone keeps its key after the retention deadline: seconds, or with a
    /// unit (`30d`, `12h`), or `never`. After it, the key is forgotten and may be used again.
    #[arg(long, value_name = "DUR|never", default_value = "30d", value_parser = parse_ttl)]
    pub tombstone_ttl: TombstoneTtl,
    /// Pin the clock to this Unix second (testing aid; default: wall time).
    #[arg(long, value_name = "SECS")]
    pub clock_epoch: Option<i64>,
    /// SQLite: afterwards, rewrite the file with `VACUUM` (once, at a quiet time): it
    /// switches an older file to `auto_vacuum = INCREMENTAL` and gives every free page back.
    #[arg(long, conflicts_with_all = ["dry_run", "database_url"])]
    pub vacuum: bool,
}

/// Runs `prune` on the ledger `store` resolves to.
pub fn run(args: PruneArgs, store: StoreConfig) -> Result<Outcome, Failure> {
    // The pass is a span when the OTEL_* variables name a collector.
    let _traces = toolledger_cli::telemetry::init_traces();
    block_on(async move {
        let ledger = store.open()?;
        let clock: SharedClock = match args.clock_epoch {
            Some(t) => Arc::new(ManualClock::new(t)),
            None => Arc::new(SystemClock),
        };
        let opts = PruneOptions {
            limit: args.limit,
            batch: args.batch as usize,
            tombstone_ttl: args.tombstone_ttl.0,
            dry_run: args.dry_run,
            pace: 0,
            // Alone on its store: the batches are its own transactions.
            beside_writes: false,
            // An operator's run gives every free page back.
            keep_free_percent: 0,
        };
        let report = prune::prune(&ledger, &clock, &opts).await?;
        let vacuumed = match (&store.backend, args.vacuum) {
            (Backend::Sqlite { path, .. }, true) => Some(vacuum(path)?),
            _ => None,
        };
        let (rows, totals) = ledger
            .read(|tx: &mut dyn EffectTx| {
                let read = |tx: &mut dyn EffectTx| {
                    Ok::<_, toolledger::Error>((prune::row_counts(tx)?, prune::totals_in(tx)?))
                };
                read(tx).map_err(|e| tx.store_error(e))
            })
            .await?;
        common::print_json(&json!({
            "code": "OK",
            "gate": "PASS",
            "compacted": report.compacted,
            "deleted": report.deleted,
            "kept_unsettled": report.kept_unsettled,
            "oldest_unsettled_age_seconds": report.oldest_unsettled_age_seconds,
            "batches": report.batches,
            "busy": report.busy,
            "dry_run": report.dry_run,
            "now": report.now,
            "tombstone_ttl_seconds": opts.tombstone_ttl,
            "rows": rows,
            "totals": totals,
            "reclaimed_pages": report.reclaimed_pages,
            "vacuum": vacuumed,
        }));
        Ok(Outcome::Pass)
    })
}

/// `VACUUM` of the SQLite file at `path` on a connection that asks for `auto_vacuum =
/// INCREMENTAL`: `{auto_vacuum, pages_before, pages_after}`.
fn vacuum(path: &std::path::Path) -> Result<serde_json::Value, Failure> {
    let conn = toolledger::store::sqlite::raw::connect(path)?;
    let failed = |_| Failure::code("STORE_UNAVAILABLE");
    let pages =
        |c: &rusqlite::Connection| c.query_row("PRAGMA page_count", [], |r| r.get::<_, i64>(0));
    let before = pages(&conn).map_err(failed)?;
    conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")
        .map_err(failed)?;
    let after = pages(&conn).map_err(failed)?;
    let mode: i64 = conn
        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
        .map_err(failed)?;
    Ok(json!({
        "auto_vacuum": if mode == 2 { "incremental" } else { "none" },
        "pages_before": before,
        "pages_after": after,
    }))
}
