//! Storage over years: compaction after retention and the tombstone horizon.
//!
//! [`prune`] does, in bounded batches of short write transactions:
//!
//! 1. **Compaction.** An operation that is settled (`applied`, `succeeded`, `failed`) and whose
//!    retention deadline has passed (`retention_deadline <= now`) loses its payload: its
//!    events, intent context, outbox event and local receipt are deleted, its arguments and
//!    result become JSON `null`, and `compacted_at` is set. What remains is a **tombstone**:
//!    scope, request digest, fingerprint, revisions, state, deadlines, status reference. A
//!    replay of it is refused with `operation_retention_expired` (or
//!    `operation_authority_expired`, which is checked first), another intent under its key is
//!    `operation_conflict`, and a status read shows its state without a result. Unsettled
//!    operations (`in_progress`, `partial`, `accepted`, `processing`, `outcome_unknown`,
//!    `dead`) are never touched: they wait for an operator and are reported as kept.
//! 2. **The horizon.** A tombstone whose retention deadline lies `tombstone_ttl` seconds or
//!    more in the past is deleted; its key is forgotten and may be used again. The approval
//!    its operation consumed stays (an approval id is never issued twice, and business rows
//!    may refer to it): it is only unlinked from the deleted row. With no horizon (`None`,
//!    the CLI's `never`) nothing is deleted.
//!
//! One pruner at a time per ledger: every batch transaction first locks the one row of
//! `prune_state` without waiting ([`EffectTx::query_opt_locked`]: `FOR UPDATE SKIP LOCKED` on
//! PostgreSQL; SQLite's single writer serializes anyway). A pruner that finds it locked stops
//! and reports `busy`, so two pruners never work on the same rows and never wait for each
//! other; writers of operations never touch that row. The rows a batch changes are past
//! their retention deadline and settled, so no call writes them any more.

use serde::Serialize;

use crate::clock::SharedClock;
use crate::effect::{EffectTx, RowExt};
use crate::ledger;
use crate::model::Error;
#[cfg(doc)]
use crate::store::Driver;
use crate::store::{BackgroundRefused, BackgroundWork, Store, StoreError};

/// Rows changed in one transaction unless [`PruneOptions::batch`] says otherwise.
pub const DEFAULT_BATCH: usize = 500;

/// The most rows a pruner working [`PruneOptions::beside_writes`] changes in one transaction of
/// its own, where the store has no writer to hand its work to (PostgreSQL). Each batch holds
/// a backend's CPU and writes its rows' log at once while live calls wait for theirs: at 2,000
/// calls/s on two cores, batches of [`DEFAULT_BATCH`] rows made the live calls' p99 about
/// twice the pruner-off figure, batches of 100 about one and a half times.
pub const BACKGROUND_BATCH: usize = 100;

/// How long the background pruner rests after each batch, as a multiple of the time the batch
/// took ([`PruneOptions::pace`]): it holds the database's writer at most half the time.
pub const BACKGROUND_PACE: u32 = 1;

/// The tombstone horizon unless configured otherwise: 30 days after the retention deadline.
pub const DEFAULT_TOMBSTONE_TTL_SECS: i64 = 30 * 86_400;

/// What one run of [`prune`] does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PruneOptions {
    /// Most operations compacted and most tombstones deleted in this run (each); `None`:
    /// until nothing is left.
    pub limit: Option<u64>,
    /// Most rows changed in one transaction (at least 1).
    pub batch: usize,
    /// Seconds after its retention deadline at which a tombstone is deleted; `None`: never.
    pub tombstone_ttl: Option<i64>,
    /// Count what would be done, change nothing.
    pub dry_run: bool,
    /// After each committed transaction, rest this many times as long as it took (0: none),
    /// so live calls get the writer between batches.
    pub pace: u32,
    /// Hand the work to the store's writer where it has one ([`Driver::background`]: SQLite),
    /// which does a few rows ([`ALONG_ROWS`], or [`ROWS_PER_CALLER`] per caller) at the end of
    /// each transaction it commits for live calls and up to [`ALONE_ROWS`] alone when nothing
    /// else waits (each at most `batch`),
    /// so a call never waits behind a whole batch. Elsewhere (PostgreSQL), batches of its own
    /// of at most [`BACKGROUND_BATCH`] rows (and at most `batch`).
    pub beside_writes: bool,
    /// After a run that removed rows, free pages are given back to the file system (SQLite,
    /// [`Driver::reclaim_space`]) only beyond this percentage of the pages in use; those kept
    /// are reused by the rows written next. 0: every free page.
    pub keep_free_percent: u8,
}

/// The free pages the background pruner keeps for new rows, as a percentage of the pages in
/// use ([`PruneOptions::keep_free_percent`]). Under a steady load a pass frees about what the
/// next interval writes; giving those pages back only to grow the file again would cost the
/// writer a page move for each, in transactions beside live calls. A ledger whose load falls
/// still shrinks to within a quarter of its data.
pub const BACKGROUND_KEEP_FREE_PERCENT: u8 = 25;

/// Rows the store's writer prunes at the end of a transaction it commits for live calls
/// ([`PruneOptions::beside_writes`]), or [`ROWS_PER_CALLER`] for each job of that transaction
/// when that is more.
pub const ALONG_ROWS: usize = 16;

/// Rows pruned at the end of a writer's transaction for each caller's job in it: every call
/// writes one operation, which is later compacted once and deleted once. A writer too busy
/// to ever be idle (no steps alone) still prunes as fast as calls come in, so the ledger stops
/// growing under any steady load; its transactions then carry that work.
pub const ROWS_PER_CALLER: usize = 2;

/// Rows the store's writer prunes in a transaction of its own, when no call has come for a
/// moment ([`PruneOptions::beside_writes`]): about a millisecond of its time.
pub const ALONE_ROWS: usize = 64;

impl PruneOptions {
    /// The options of the pruner that runs beside live calls (`serve`, `proxy`, `worker`):
    /// [`PruneOptions::beside_writes`] where the store's writer takes it, else batches of
    /// [`BACKGROUND_BATCH`] rows and a rest of [`BACKGROUND_PACE`] after each.
    pub fn background(tombstone_ttl: Option<i64>) -> Self {
        PruneOptions {
            pace: BACKGROUND_PACE,
            beside_writes: true,
            keep_free_percent: BACKGROUND_KEEP_FREE_PERCENT,
            tombstone_ttl,
            ..PruneOptions::default()
        }
    }
}

impl PruneOptions {
    /// Rows per transaction of the pruner's own, where the store has no writer to take its
    /// work ([`PruneOptions::beside_writes`] runs: at most [`BACKGROUND_BATCH`]).
    pub fn own_batch(&self) -> usize {
        match self.beside_writes {
            true => self.batch.min(BACKGROUND_BATCH),
            false => self.batch,
        }
    }
}

/// Rests `pace` times as long as the transaction begun at `started` took.
async fn rest(started: std::time::Instant, pace: u32) {
    if pace > 0 {
        tokio::time::sleep(started.elapsed() * pace).await;
    }
}

impl Default for PruneOptions {
    fn default() -> Self {
        PruneOptions {
            limit: None,
            batch: DEFAULT_BATCH,
            tombstone_ttl: Some(DEFAULT_TOMBSTONE_TTL_SECS),
            dry_run: false,
            pace: 0,
            beside_writes: false,
            keep_free_percent: 0,
        }
    }
}

/// What one run of [`prune`] did (or, dry, would do).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Operations compacted to tombstones.
    pub compacted: u64,
    /// Tombstones deleted at the horizon (their keys forgotten).
    pub deleted: u64,
    /// Operations past their retention deadline kept because they are not settled.
    pub kept_unsettled: u64,
    /// Seconds since the oldest of those was created (`None` when there is none).
    pub oldest_unsettled_age_seconds: Option<i64>,
    /// Write transactions committed.
    pub batches: u64,
    /// Another pruner held the ledger's prune lease: this run stopped early.
    pub busy: bool,
    /// Nothing was changed: the counts say what a run would do.
    pub dry_run: bool,
    /// Free pages given back to the file system afterwards (SQLite in `auto_vacuum =
    /// INCREMENTAL` mode; 0 elsewhere).
    pub reclaimed_pages: i64,
    /// "Now" of the run (Unix seconds).
    pub now: i64,
}

/// The pruner's running totals, kept in the ledger (`prune_state`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PruneTotals {
    /// Operations compacted, ever.
    pub compacted_total: i64,
    /// Tombstones deleted, ever.
    pub deleted_total: i64,
    /// When a pruner last committed a batch.
    pub last_run_at: Option<i64>,
}

/// Operation rows by kind: live (with their payload) and tombstones.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RowCounts {
    /// Rows with their payload.
    pub live: i64,
    /// Tombstones.
    pub tombstones: i64,
}

/// Runs one pass of compaction and the horizon over `store` at `clock`'s now.
///
/// A failure is the store's (its kind kept: `unavailable` and the like); batches committed
/// before it stay committed.
///
/// The pass is a span `prune` under the current trace context, with what it did
/// (`toolledger.prune.compacted`, `…deleted`, `…kept_unsettled`, `…busy`, `…dry_run`) or
/// `error.type`.
pub async fn prune(
    store: &Store,
    clock: &SharedClock,
    opts: &PruneOptions,
) -> Result<PruneReport, StoreError> {
    use opentelemetry::context::FutureExt as _;
    use opentelemetry::KeyValue;
    let cx = crate::trace::start(
        "prune",
        opentelemetry::trace::SpanKind::Internal,
        Vec::new(),
    );
    let out = prune_unspanned(store, clock, opts)
        .with_context(cx.clone())
        .await;
    if let Ok(r) = &out {
        for (key, n) in [
            ("toolledger.prune.compacted", r.compacted),
            ("toolledger.prune.deleted", r.deleted),
            ("toolledger.prune.kept_unsettled", r.kept_unsettled),
        ] {
            crate::trace::set_on(
                &cx,
                KeyValue::new(key, i64::try_from(n).unwrap_or(i64::MAX)),
            );
        }
        crate::trace::set_on(&cx, KeyValue::new("toolledger.prune.busy", r.busy));
        crate::trace::set_on(&cx, KeyValue::new("toolledger.prune.dry_run", r.dry_run));
    }
    crate::trace::end(
        &cx,
        out.as_ref().err().map(|e| e.code().to_ascii_lowercase()),
    );
    out
}

async fn prune_unspanned(
    store: &Store,
    clock: &SharedClock,
    opts: &PruneOptions,
) -> Result<PruneReport, StoreError> {
    let now = clock.now();
    let mut report = PruneReport {
        dry_run: opts.dry_run,
        now,
        ..PruneReport::default()
    };
    let cap = opts.limit.unwrap_or(u64::MAX);
    if opts.dry_run {
        dry_run(store, now, opts.tombstone_ttl, cap, &mut report).await?;
    } else if !(opts.beside_writes && beside_writes(store, opts, &mut report).await?) {
        in_batches(store, opts, &mut report).await?;
    }
    if !opts.dry_run && report.compacted + report.deleted > 0 {
        report.reclaimed_pages = reclaim(store, opts.pace, opts.keep_free_percent).await?;
    }
    let (kept, oldest) = store
        .read(move |tx: &mut dyn EffectTx| kept(tx, now).map_err(|e| tx.store_error(e)))
        .await?;
    report.kept_unsettled = kept.max(0) as u64;
    report.oldest_unsettled_age_seconds = oldest.map(|c| now.saturating_sub(c).max(0));
    Ok(report)
}

/// Prunes in batches of [`PruneOptions::own_batch`] rows, each a write transaction of its own.
async fn in_batches(
    store: &Store,
    opts: &PruneOptions,
    report: &mut PruneReport,
) -> Result<(), StoreError> {
    let (now, batch) = (report.now, opts.own_batch().max(1) as u64);
    let cap = opts.limit.unwrap_or(u64::MAX);
    let compactable = store.driver().compactable_operations();
    while report.compacted < cap {
        let n = batch.min(cap - report.compacted) as i64;
        let started = std::time::Instant::now();
        let Some(done) = store
            .write(move |tx: &mut dyn EffectTx| {
                compact_batch(tx, compactable, now, n).map_err(|e| tx.store_error(e))
            })
            .await?
        else {
            report.busy = true;
            return Ok(());
        };
        report.batches += 1;
        report.compacted += done;
        if (done as i64) < n {
            break;
        }
        rest(started, opts.pace).await;
    }
    let Some(ttl) = opts.tombstone_ttl else {
        return Ok(());
    };
    let horizon = now.saturating_sub(ttl);
    while report.deleted < cap {
        let n = batch.min(cap - report.deleted) as i64;
        let started = std::time::Instant::now();
        let Some(done) = store
            .write(move |tx: &mut dyn EffectTx| {
                delete_batch(tx, now, horizon, n).map_err(|e| tx.store_error(e))
            })
            .await?
        else {
            report.busy = true;
            return Ok(());
        };
        report.batches += 1;
        report.deleted += done;
        if (done as i64) < n {
            break;
        }
        rest(started, opts.pace).await;
    }
    Ok(())
}

/// Hands the run to the store's writer ([`Driver::background`]) and waits for it; `false`
/// when the store has no such writer (the caller prunes in batches instead). Another pruner's
/// work held by the writer is `busy`.
async fn beside_writes(
    store: &Store,
    opts: &PruneOptions,
    report: &mut PruneReport,
) -> Result<bool, StoreError> {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let work = Box::new(Beside {
        compactable: store.driver().compactable_operations(),
        now: report.now,
        horizon: opts.tombstone_ttl.map(|ttl| report.now.saturating_sub(ttl)),
        cap: opts.limit.unwrap_or(u64::MAX),
        batch: opts.batch.max(1),
        phase: Phase::Compact,
        step: (0, 0),
        done: PruneReport::default(),
        answer: Some(sender),
    });
    match store.driver().background(work) {
        Ok(()) => {}
        Err(BackgroundRefused::NoWriter) => return Ok(false),
        Err(BackgroundRefused::Busy) => {
            report.busy = true;
            return Ok(true);
        }
    }
    let done = receiver
        .await
        .map_err(|_| StoreError::Unavailable("the writer stopped".into()))??;
    report.compacted = done.compacted;
    report.deleted = done.deleted;
    report.batches = done.batches;
    report.busy = done.busy;
    Ok(true)
}

/// Rows of a [`Beside`] step in a transaction holding `callers` callers' jobs (0: alone),
/// at most `batch`.
fn step_rows(batch: usize, callers: usize) -> usize {
    let rows = match callers {
        0 => ALONE_ROWS,
        n => ALONG_ROWS.max(ROWS_PER_CALLER * n),
    };
    batch.min(rows)
}

/// Where a [`Beside`] run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Compact,
    Delete,
    Done,
}

/// One pruning run done by the store's writer, a step at a time ([`BackgroundWork`]).
struct Beside {
    /// The driver's query of the operations to compact ([`Driver::compactable_operations`]).
    compactable: &'static str,
    now: i64,
    /// Tombstones whose retention deadline is at or before it are deleted (`None`: none).
    horizon: Option<i64>,
    cap: u64,
    batch: usize,
    phase: Phase,
    /// What the last step did, `(compacted, deleted)`, counted once its transaction commits.
    step: (u64, u64),
    /// What committed steps did.
    done: PruneReport,
    answer: Option<tokio::sync::oneshot::Sender<Result<PruneReport, StoreError>>>,
}

impl Beside {
    /// The phase after one that did `done` of the `n` rows it asked for, `total` so far.
    fn after(&self, phase: Phase, done: u64, n: u64, total: u64) -> Phase {
        let more = done == n && total < self.cap;
        match (phase, more) {
            (Phase::Compact, true) | (Phase::Delete, true) => phase,
            (Phase::Compact, false) if self.horizon.is_some() => Phase::Delete,
            _ => Phase::Done,
        }
    }
}

impl BackgroundWork for Beside {
    fn step(&mut self, tx: &mut dyn EffectTx, callers: usize) -> Result<bool, StoreError> {
        let rows = step_rows(self.batch, callers) as u64;
        self.step = (0, 0);
        let (phase, total) = match self.phase {
            Phase::Compact => (Phase::Compact, self.done.compacted),
            Phase::Delete => (Phase::Delete, self.done.deleted),
            Phase::Done => return Ok(false),
        };
        let n = rows.min(self.cap.saturating_sub(total));
        let done = match (phase, self.horizon) {
            (Phase::Compact, _) => compact_batch(tx, self.compactable, self.now, n as i64),
            (_, Some(horizon)) => delete_batch(tx, self.now, horizon, n as i64),
            (_, None) => Ok(Some(0)),
        }
        .map_err(|e| tx.store_error(e))?;
        let Some(done) = done else {
            self.done.busy = true;
            self.phase = Phase::Done;
            return Ok(false);
        };
        self.step = match phase {
            Phase::Compact => (done, 0),
            _ => (0, done),
        };
        self.phase = self.after(phase, done, n, total + done);
        Ok(self.phase != Phase::Done)
    }

    fn settled(&mut self, failure: Option<&StoreError>) {
        let (compacted, deleted) = std::mem::take(&mut self.step);
        if failure.is_none() && compacted + deleted > 0 {
            self.done.compacted += compacted;
            self.done.deleted += deleted;
            self.done.batches += 1;
        }
    }

    fn abandoned(&self) -> bool {
        self.answer.as_ref().is_none_or(|a| a.is_closed())
    }

    fn finish(mut self: Box<Self>, failure: Option<StoreError>) {
        if let Some(answer) = self.answer.take() {
            let _ = answer.send(match failure {
                None => Ok(std::mem::take(&mut self.done)),
                Some(e) => Err(e),
            });
        }
    }
}

/// Seconds between two background prune passes unless configured otherwise (`serve`,
/// `proxy` and `worker`'s `--prune-interval`; 0 turns the background pruner off).
pub const DEFAULT_INTERVAL_SECS: u64 = 300;

/// When the background pruner's passes begin: every `every`, the first one interval from now.
/// A pass that runs longer than the interval is followed at once by the next (the ticks it
/// missed are not made up), so a pruner that falls behind works without a pause until it has
/// caught up, and one that keeps up starts a pass every interval.
pub fn pass_schedule(every: std::time::Duration) -> tokio::time::Interval {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

/// Runs [`prune`] on the [`pass_schedule`] of `every` (a pass begins every `every`, the first
/// one interval after the start; one that ran longer is followed at once) until `shutdown`
/// completes: the background pruner of `serve`, `proxy` and `worker`. Each pass works until
/// the rows due at its start are done, in batches of [`PruneOptions::batch`] rows, each its
/// own write transaction. A pass that fails is logged (target
/// `toolledger::prune`, warn) and the next one runs on time; a pass that finds another pruner
/// working ends early (`busy`) and is not an error. Each pass records
/// `toolledger_prune_rows_total{kind}` (`compacted`, `deleted`) and
/// `toolledger_prune_passes_total{outcome}` (`ok`, `busy`, `failed`).
pub async fn run_every<F: std::future::Future>(
    store: Store,
    clock: SharedClock,
    opts: PruneOptions,
    every: std::time::Duration,
    shutdown: F,
) -> F::Output {
    tokio::pin!(shutdown);
    let mut ticks = pass_schedule(every);
    loop {
        tokio::select! {
            biased;
            stopped = &mut shutdown => return stopped,
            _ = ticks.tick() => {}
        }
        tokio::select! {
            biased;
            stopped = &mut shutdown => return stopped,
            res = prune(&store, &clock, &opts) => record(&res),
        }
    }
}

/// Logs and counts one background pass.
fn record(res: &Result<PruneReport, StoreError>) {
    match res {
        Ok(r) => {
            for (kind, n) in [("compacted", r.compacted), ("deleted", r.deleted)] {
                metrics::counter!("toolledger_prune_rows_total", "kind" => kind).increment(n);
            }
            let outcome = if r.busy { "busy" } else { "ok" };
            metrics::counter!("toolledger_prune_passes_total", "outcome" => outcome).increment(1);
            if r.compacted + r.deleted > 0 {
                tracing::info!(
                    target: "toolledger::prune",
                    compacted = r.compacted,
                    deleted = r.deleted,
                    kept_unsettled = r.kept_unsettled,
                    "prune pass"
                );
            }
        }
        Err(e) => {
            metrics::counter!("toolledger_prune_passes_total", "outcome" => "failed").increment(1);
            tracing::warn!(
                target: "toolledger::prune",
                code = e.code(),
                error = %e.caller_error().message,
                "prune pass failed"
            );
        }
    }
}

/// Pages given back per transaction by [`reclaim`].
const RECLAIM_STEP: i64 = 1_000;

/// Gives the database's free pages beyond `keep_free_percent` of the pages in use back to the
/// file system in steps of [`RECLAIM_STEP`] pages, each its own short write transaction
/// ([`crate::store::Driver::reclaim_space`]).
async fn reclaim(store: &Store, pace: u32, keep_free_percent: u8) -> Result<i64, StoreError> {
    let mut total = 0;
    // Bounded: the pruner's next pass goes on where this one stopped.
    for _ in 0..100 {
        let started = std::time::Instant::now();
        let handle = store.clone();
        let n = store
            .write(move |tx: &mut dyn EffectTx| {
                handle
                    .driver()
                    .reclaim_space(tx, RECLAIM_STEP, keep_free_percent)
            })
            .await?;
        total += n;
        if n < RECLAIM_STEP {
            break;
        }
        rest(started, pace).await;
    }
    Ok(total)
}

/// How many live operations past their retention deadline at `now` are not settled (they
/// wait for an operator, and pruning keeps them), and the creation time of the oldest.
pub fn kept(tx: &mut dyn EffectTx, now: i64) -> Result<(i64, Option<i64>), Error> {
    ledger::kept_unsettled(tx, now)
}

/// Counts what a run would do, within `cap` for each kind.
async fn dry_run(
    store: &Store,
    now: i64,
    ttl: Option<i64>,
    cap: u64,
    report: &mut PruneReport,
) -> Result<(), StoreError> {
    let cap = cap.min(i64::MAX as u64) as i64;
    let compactable = store.driver().compactable_operations();
    let (compacted, deleted) = store
        .read(move |tx: &mut dyn EffectTx| {
            dry_counts(tx, compactable, now, ttl, cap).map_err(|e| tx.store_error(e))
        })
        .await?;
    report.compacted = compacted.max(0) as u64;
    report.deleted = deleted.max(0) as u64;
    Ok(())
}

/// What a run would compact (found by the driver's query `compactable`) and delete:
/// `(operations, tombstones)`.
fn dry_counts(
    tx: &mut dyn EffectTx,
    compactable: &str,
    now: i64,
    ttl: Option<i64>,
    cap: i64,
) -> Result<(i64, i64), Error> {
    let compacted = ledger::count_of(tx, compactable, now, cap)?;
    let Some(ttl) = ttl else {
        return Ok((compacted, 0));
    };
    let deleted = ledger::count_of(tx, ledger::EXPIRED_TOMBSTONES, now.saturating_sub(ttl), cap)?;
    Ok((compacted, deleted))
}

/// Takes the ledger's prune lease for this transaction; `false` when another pruner holds it.
fn take_lease(tx: &mut dyn EffectTx) -> Result<bool, Error> {
    Ok(tx
        .query_opt_locked("SELECT id FROM prune_state WHERE id = 1", &[])?
        .is_some())
}

/// Compacts up to `n` operations (found by the driver's query `compactable`); `None` when
/// another pruner holds the lease.
fn compact_batch(
    tx: &mut dyn EffectTx,
    compactable: &str,
    now: i64,
    n: i64,
) -> Result<Option<u64>, Error> {
    if !take_lease(tx)? {
        return Ok(None);
    }
    let (ids, found) = ledger::ids_of(tx, compactable, now, n)?;
    if found == 0 {
        return Ok(Some(0));
    }
    let list = ledger::marks(1, ids.len());
    for table in [
        "operation_events",
        "local_receipts",
        "outbox",
        "deferred_intents",
    ] {
        tx.execute(
            &format!("DELETE FROM {table} WHERE operation_id IN ({list})"),
            &ids,
        )?;
    }
    let done = ledger::compact(tx, ids, now)? as u64;
    tx.execute(
        "UPDATE prune_state SET compacted_total = compacted_total + ?1, last_run_at = ?2
         WHERE id = 1",
        &[(done as i64).into(), now.into()],
    )?;
    Ok(Some(done))
}

/// Deletes up to `n` tombstones past the horizon, unlinking the approvals their operations
/// consumed (which stay, consumed); `None` when another pruner holds the lease.
fn delete_batch(
    tx: &mut dyn EffectTx,
    now: i64,
    horizon: i64,
    n: i64,
) -> Result<Option<u64>, Error> {
    if !take_lease(tx)? {
        return Ok(None);
    }
    let (ids, found) = ledger::ids_of(tx, ledger::EXPIRED_TOMBSTONES, horizon, n)?;
    if found == 0 {
        return Ok(Some(0));
    }
    let list = ledger::marks(1, ids.len());
    tx.execute(
        &format!(
            "UPDATE approvals SET consumed_operation = NULL WHERE consumed_operation IN ({list})"
        ),
        &ids,
    )?;
    let done = ledger::delete_tombstones(tx, &ids)? as u64;
    tx.execute(
        "UPDATE prune_state SET deleted_total = deleted_total + ?1, last_run_at = ?2
         WHERE id = 1",
        &[(done as i64).into(), now.into()],
    )?;
    Ok(Some(done))
}

/// The pruner's running totals (read-only).
pub async fn totals(store: &Store) -> Result<PruneTotals, StoreError> {
    store
        .read(|tx: &mut dyn EffectTx| totals_in(tx).map_err(|e| tx.store_error(e)))
        .await
}

/// The pruner's running totals in the snapshot `tx` reads.
pub fn totals_in(tx: &mut dyn EffectTx) -> Result<PruneTotals, Error> {
    let row = tx
        .query_opt(
            "SELECT compacted_total, deleted_total, last_run_at FROM prune_state WHERE id = 1",
            &[],
        )?
        .ok_or_else(|| Error::unavailable("the prune state is missing"))?;
    Ok(PruneTotals {
        compacted_total: row.int(0)?,
        deleted_total: row.int(1)?,
        last_run_at: row.opt_int(2)?,
    })
}

/// Operation rows by kind, live and tombstones, in the snapshot `tx` reads.
pub fn row_counts(tx: &mut dyn EffectTx) -> Result<RowCounts, Error> {
    let (all, tombstones) = ledger::row_counts(tx)?;
    Ok(RowCounts {
        live: all - tombstones,
        tombstones,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seconds (from the start) at which passes lasting `passes` seconds each begin on the
    /// schedule of `every` seconds.
    async fn pass_starts(every: u64, passes: &[u64]) -> Vec<u64> {
        let t0 = tokio::time::Instant::now();
        let mut ticks = pass_schedule(std::time::Duration::from_secs(every));
        let mut starts = Vec::new();
        for pass in passes {
            ticks.tick().await;
            starts.push(t0.elapsed().as_secs());
            tokio::time::sleep(std::time::Duration::from_secs(*pass)).await;
        }
        starts
    }

    #[tokio::test(start_paused = true)]
    async fn passes_begin_every_interval_and_one_that_ran_longer_is_followed_at_once() {
        // Short passes: one begins every interval, not an interval after the last one ended.
        assert_eq!(pass_starts(10, &[2, 2, 2, 2]).await, [10, 20, 30, 40]);
        // Passes longer than the interval: back to back.
        assert_eq!(pass_starts(10, &[15, 15, 15, 15]).await, [10, 25, 40, 55]);
        // After a long pass the next begins at once, and the ones it missed are not made up:
        // the schedule goes on an interval after that.
        assert_eq!(pass_starts(10, &[35, 1, 1, 1]).await, [10, 45, 55, 65]);
    }

    #[test]
    fn a_step_along_callers_prunes_two_rows_per_caller_at_least_the_floor_and_at_most_a_batch() {
        // Alone: a fixed step.
        assert_eq!(step_rows(DEFAULT_BATCH, 0), ALONE_ROWS);
        // Along a few callers: the floor.
        assert_eq!(step_rows(DEFAULT_BATCH, 1), ALONG_ROWS);
        assert_eq!(step_rows(DEFAULT_BATCH, 8), ALONG_ROWS);
        // Along many: as many rows as those calls will need pruned (compacted and deleted).
        assert_eq!(step_rows(DEFAULT_BATCH, 9), 18);
        assert_eq!(step_rows(DEFAULT_BATCH, 128), 256);
        // Never more than a batch.
        assert_eq!(step_rows(100, 128), 100);
        assert_eq!(step_rows(10, 0), 10);
        assert_eq!(step_rows(10, 1), 10);
    }
}
