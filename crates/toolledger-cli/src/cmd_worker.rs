//! `toolledger worker [--once] [--poll-interval MS]`: the outbox worker.
//!
//! Each pass enumerates the events that are ready — pending ones and those whose lease has
//! expired — and processes them: claim (lease + fencing token), recheck, downstream submit,
//! transaction C. Without `--once` it polls until SIGTERM or SIGINT. On a signal it stops at
//! once: work in flight is abandoned, never released — its lease stays until it expires and a
//! later claim (with a higher fencing token) takes it over; everything already committed stays.
//! Prints one JSON summary on exit.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolledger::clock::{ManualClock, SharedClock, SystemClock};
use toolledger::runtime::{RuntimeConfig, RuntimeError};
use toolledger_cli::common::{self, RuntimeStoreArgs, StoreConfig};
use toolledger_cli::exit::{Failure, Outcome};

use crate::cmd_dispatch::{block_on, runtime};

/// `worker` options.
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub store: RuntimeStoreArgs,
    /// Run one pass and exit.
    #[arg(long)]
    pub once: bool,
    /// Milliseconds between passes.
    #[arg(long, default_value_t = 1000)]
    pub poll_interval: u64,
    /// Most events taken per pass.
    #[arg(long, default_value_t = 64)]
    pub batch: i64,
    /// Lease owner name (default `worker-<pid>`).
    #[arg(long)]
    pub worker_id: Option<String>,
    /// Pin the clock to this Unix second (testing aid; default: wall time).
    #[arg(long)]
    pub clock_epoch: Option<i64>,
    /// Lease length in seconds.
    #[arg(long, default_value_t = toolledger::outbox::DEFAULT_LEASE_SECONDS)]
    pub lease_seconds: i64,
    /// Claims before an event is declared dead.
    #[arg(long, default_value_t = toolledger::outbox::DEFAULT_MAX_ATTEMPTS)]
    pub max_attempts: i64,
}

#[derive(Default)]
struct Totals {
    passes: u64,
    delivered: usize,
    unknown: usize,
    skipped: usize,
    dead: usize,
    refused: BTreeMap<String, usize>,
}

fn shutdown_signal() -> Pin<Box<dyn Future<Output = &'static str>>> {
    Box::pin(async {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            if let Ok(mut term) = signal(SignalKind::terminate()) {
                tokio::select! {
                    _ = term.recv() => return "SIGTERM",
                    _ = tokio::signal::ctrl_c() => return "SIGINT",
                }
            }
        }
        let _ = tokio::signal::ctrl_c().await;
        "SIGINT"
    })
}

/// Runs `worker` on the ledger `store` resolves to.
pub fn run(args: WorkerArgs, store: StoreConfig) -> Result<Outcome, Failure> {
    if !(1..=86_400).contains(&args.lease_seconds)
        || !(1..=1000).contains(&args.max_attempts)
        || !(1..=10_000).contains(&args.batch)
    {
        return Err(Failure::code("USAGE_ERROR"));
    }
    block_on(async move {
        let ledger = store.open()?;
        let clock: SharedClock = match args.clock_epoch {
            Some(t) => Arc::new(ManualClock::new(t)),
            None => Arc::new(SystemClock),
        };
        let rt = runtime(&store, &ledger, clock)?.with_config(RuntimeConfig {
            lease_seconds: args.lease_seconds,
            max_attempts: args.max_attempts,
        });
        let owner = args
            .worker_id
            .clone()
            .unwrap_or_else(|| format!("worker-{}", std::process::id()));
        let mut shutdown = shutdown_signal();
        let mut totals = Totals::default();
        let stopped_by;
        loop {
            tokio::select! {
                biased;
                sig = &mut shutdown => { stopped_by = sig; break; }
                res = rt.run_pass(&owner, args.batch) => match res {
                    Ok(s) => {
                        totals.passes += 1;
                        totals.delivered += s.delivered;
                        totals.unknown += s.unknown;
                        totals.skipped += s.skipped;
                        totals.dead += s.dead;
                        for (code, n) in s.refused {
                            *totals.refused.entry(code).or_default() += n;
                        }
                    }
                    Err(RuntimeError::Store(e)) if args.once => return Err(e.into()),
                    Err(_) if args.once => return Err(Failure::code("WORKER_ERROR")),
                    // A long-running worker rides out a busy or briefly unavailable store.
                    Err(_) => {}
                },
            }
            if args.once {
                stopped_by = "once";
                break;
            }
            tokio::select! {
                biased;
                sig = &mut shutdown => { stopped_by = sig; break; }
                _ = tokio::time::sleep(Duration::from_millis(args.poll_interval)) => {}
            }
        }
        common::print_json(&json!({
            "dead": totals.dead,
            "delivered": totals.delivered,
            "passes": totals.passes,
            "refused": totals.refused,
            "skipped": totals.skipped,
            "stopped_by": stopped_by,
            "unknown": totals.unknown,
            "worker": owner,
        }));
        Ok(Outcome::Pass)
    })
}
