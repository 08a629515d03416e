//! `toolledger worker [--once] [--poll-interval MS]`: the outbox worker.
//!
//! Each pass enumerates the events that are ready — pending ones and those whose lease has
//! expired — and processes them: claim (lease + fencing token), recheck, downstream submit,
//! transaction C. Without `--once` it polls until SIGTERM or SIGINT. On a signal it stops at
//! once: work in flight is abandoned, never released — its lease stays until it expires and a
//! later claim (with a higher fencing token) takes it over; everything already committed stays.
//! Prints one JSON summary on exit.
//!
//! `--max-attempts N` is applied at claim time: an event this worker finds already claimed N
//! times becomes `dead` (whatever limit it was enqueued with). `skipped` counts the events the
//! worker did not work on because another worker held them (under a live lease when a pass
//! looked, or claimed first), summed over passes.
//!
//! The passes are [`toolledger::runtime::Worker`]'s, the library worker a program runs over
//! its own registered deferred tools; this command runs it over the reference tools.
//!
//! Every failure is printed as it happens, one JSON line on stderr:
//! `{"error":{"code","message"},"event_id":N,"worker":ID}` for an event whose processing
//! failed (counted under `refused` in the summary), and `{"error":{"code","message"},
//! "worker":ID}` for a pass that failed as a whole (a long-running worker goes on polling;
//! `--once` exits 2 with that error instead).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolledger::clock::{ManualClock, SharedClock, SystemClock};
use toolledger::runtime::{PassSummary, RuntimeConfig, RuntimeError, Worker};
use toolledger_cli::common::{self, RuntimeStoreArgs, StoreConfig};
use toolledger_cli::exit::{self, Failure, Outcome};

use crate::cmd_dispatch::{block_on, runtime};

/// `worker` options.
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub store: RuntimeStoreArgs,
    #[command(flatten)]
    pub telemetry: toolledger_cli::telemetry::TelemetryArgs,
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
    /// Claims an event may have had before this worker declares it dead instead of claiming
    /// it again (applied at each claim, whatever limit the event was enqueued with).
    #[arg(long, default_value_t = toolledger::outbox::DEFAULT_MAX_ATTEMPTS)]
    pub max_attempts: i64,
    #[command(flatten)]
    pub prune: toolledger_cli::prune::PruneFlags,
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

/// Prints one failure of worker `owner` as a JSON line on stderr: of the event `event_id`, or
/// (`None`) of a whole pass.
fn report(owner: &str, event_id: Option<i64>, e: &RuntimeError) {
    let (code, message) = match e {
        RuntimeError::Refused(err) => (err.code.as_str().to_string(), err.message.clone()),
        RuntimeError::Store(s) => (
            s.code().to_string(),
            exit::store_message(s)
                .or_else(|| exit::hint(s.code()).map(str::to_string))
                .unwrap_or_else(|| s.caller_error().message),
        ),
        RuntimeError::Fenced(f) => ("fenced".to_string(), f.to_string()),
    };
    let mut line = json!({"error": {"code": code, "message": message}, "worker": owner});
    if let Some(id) = event_id {
        line["event_id"] = json!(id);
    }
    eprintln!("{line}");
}

/// Runs `worker` on the ledger `store` resolves to.
pub fn run(args: WorkerArgs, store: StoreConfig) -> Result<Outcome, Failure> {
    let usage = |message: &str| Err(Failure::explained("USAGE_ERROR", message));
    if !(1..=86_400).contains(&args.lease_seconds) {
        return usage("--lease-seconds must be 1 to 86400");
    }
    if !(1..=toolledger::outbox::MAX_ATTEMPTS_LIMIT).contains(&args.max_attempts) {
        return usage("--max-attempts must be 1 to 1000");
    }
    if !(1..=10_000).contains(&args.batch) {
        return usage("--batch must be 1 to 10000");
    }
    toolledger_cli::telemetry::init_logs(args.telemetry.log_format);
    // Each delivery is a span when the OTEL_* variables name a collector; the last are sent
    // when this ends.
    let _traces = toolledger_cli::telemetry::init_traces();
    block_on(async move {
        let ledger = store.open()?;
        let clock: SharedClock = match args.clock_epoch {
            Some(t) => Arc::new(ManualClock::new(t)),
            None => Arc::new(SystemClock),
        };
        toolledger_cli::telemetry::start_metrics(
            args.telemetry.metrics,
            &ledger,
            &clock,
            toolledger_mcp::wire::http::ConnectionLimits::default(),
        )
        .await
        .map_err(Failure::code)?;
        let rt = runtime(&store, &ledger, clock.clone())?.with_config(RuntimeConfig {
            lease_seconds: args.lease_seconds,
            max_attempts: args.max_attempts,
        });
        let owner = args
            .worker_id
            .clone()
            .unwrap_or_else(|| format!("worker-{}", std::process::id()));
        let once = args.once;
        let reporter = owner.clone();
        let worker = Worker::new(rt, owner.clone())
            .batch(args.batch)
            .poll_interval(Duration::from_millis(args.poll_interval))
            // `--once` answers a failed pass with its exit-2 error instead of a line.
            .on_failure(move |f| {
                if f.event_id.is_some() || !once {
                    report(&reporter, f.event_id, f.error)
                }
            });
        let pruner = if once {
            toolledger_cli::prune::Pruner::none()
        } else {
            args.prune.spawn(&ledger, &clock)
        };
        let mut shutdown = shutdown_signal();
        let (passes, totals, stopped_by) = if once {
            tokio::select! {
                biased;
                sig = &mut shutdown => (0, PassSummary::default(), sig),
                res = worker.run_once() => match res {
                    Ok(s) => (1, s, "once"),
                    Err(RuntimeError::Store(e)) => return Err(e.into()),
                    Err(_) => return Err(Failure::code("WORKER_ERROR")),
                },
            }
        } else {
            let run = worker.run_until(shutdown).await;
            (run.passes, run.totals, run.stopped_by)
        };
        pruner.stop().await;
        common::print_json(&json!({
            "dead": totals.dead,
            "delivered": totals.delivered,
            "passes": passes,
            "refused": totals.refused,
            "skipped": totals.skipped,
            "stopped_by": stopped_by,
            "unknown": totals.unknown,
            "worker": owner,
        }));
        Ok(Outcome::Pass)
    })
}
