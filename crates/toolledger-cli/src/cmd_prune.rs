//! `toolledger prune [--dry-run] [--limit N] [--batch N] [--tombstone-ttl DUR|never]`:
//! compaction after retention and the tombstone horizon, once, for cron and operators.
//!
//! Runs [`toolledger::prune::prune`]: settled operations past their retention deadline become
//! tombstones, tombstones past the horizon are deleted (their keys forgotten), in batches of
//! short transactions. Prints one JSON summary: `compacted`, `deleted`, `approvals_deleted`,
//! `kept_unsettled` (operations past their retention deadline that wait for an operator),
//! `oldest_unsettled_age_seconds`, `batches`, `busy` (another pruner of the ledger was
//! working: this run stopped early; not an error), `dry_run`, `tombstone_ttl_seconds` (null
//! for `never`), `rows` (live and tombstone operation rows after the run) and `totals` (the
//! ledger's running totals). `--dry-run` opens the ledger read-only and changes nothing.

use std::sync::Arc;

use serde_json::json;
use toolledger::clock::{ManualClock, SharedClock, SystemClock};
use toolledger::effect::EffectTx;
use toolledger::prune::{self, PruneOptions};
use toolledger_cli::common::{self, StoreArgs, StoreConfig};
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
}

/// Runs `prune` on the ledger `store` resolves to.
pub fn run(args: PruneArgs, store: StoreConfig) -> Result<Outcome, Failure> {
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
        };
        let report = prune::prune(&ledger, &clock, &opts).await?;
        let (rows, totals) = ledger
            .read(|tx: &mut dyn EffectTx| {
                let read = |tx: &mut dyn EffectTx| {
                    Ok::<_, toolledger::Error>((prune::row_counts(tx)?, prune::totals_in(tx)?))
                };
                read(tx).map_err(|e| toolledger::outbox::store_error(tx, e))
            })
            .await?;
        common::print_json(&json!({
            "code": "OK",
            "gate": "PASS",
            "compacted": report.compacted,
            "deleted": report.deleted,
            "approvals_deleted": report.approvals_deleted,
            "kept_unsettled": report.kept_unsettled,
            "oldest_unsettled_age_seconds": report.oldest_unsettled_age_seconds,
            "batches": report.batches,
            "busy": report.busy,
            "dry_run": report.dry_run,
            "now": report.now,
            "tombstone_ttl_seconds": opts.tombstone_ttl,
            "rows": rows,
            "totals": totals,
        }));
        Ok(Outcome::Pass)
    })
}
