//! The worker: claims (lease and fencing token), heartbeats, the downstream submit under a
//! renewed lease, refused attempts, and worker passes over the ready events.

use super::*;
use crate::ledger;
use crate::trace;
use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;

/// The outcome of the worker's checks before a downstream call: the operation's record, or
/// why it may not be sent.
pub(super) type Checked = Result<DeferredRecord, RuntimeError>;

impl Runtime {
    /// Claims `event_id` for `owner` now.
    pub async fn claim(&self, event_id: i64, owner: &str) -> Result<ClaimOutcome, RuntimeError> {
        let out = self.claim_unlogged(event_id, owner, false).await;
        Self::log_claim(event_id, owner, out.as_ref().map(|(c, _)| c));
        out.map(|(claimed, _)| claimed)
    }

    /// [`Runtime::claim`] that, when it claims, also makes the worker's checks before the
    /// downstream call ([`Runtime::preflight`]) in the claim's own transaction: one hand-off
    /// to the store instead of two. Their outcome is kept apart: a refusal does not undo the
    /// claim, it is recorded on it as [`Runtime::execute`] records one.
    pub(super) async fn claim_checked(
        &self,
        event_id: i64,
        owner: &str,
    ) -> Result<(ClaimOutcome, Option<Checked>), RuntimeError> {
        let out = self.claim_unlogged(event_id, owner, true).await;
        Self::log_claim(event_id, owner, out.as_ref().map(|(c, _)| c));
        out
    }

    fn log_claim(event_id: i64, owner: &str, out: Result<&ClaimOutcome, &RuntimeError>) {
        match out {
            Ok(ClaimOutcome::Claimed(l)) if l.attempt > 1 => tracing::info!(
                target: "toolledger::delivery", event_id, operation = l.operation_id,
                attempt = l.attempt, fencing_token = l.token, owner, "claimed again (an earlier lease expired)"),
            Ok(ClaimOutcome::Claimed(l)) => tracing::debug!(
                target: "toolledger::delivery", event_id, operation = l.operation_id,
                attempt = l.attempt, fencing_token = l.token, owner, "claimed"),
            Ok(ClaimOutcome::Exhausted) => tracing::warn!(
                target: "toolledger::delivery", event_id, owner,
                "dead letter: attempts exhausted; an operator decides (toolledger resolve)"),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(target: "toolledger::delivery", event_id, owner, error = %e, "claim failed")
            }
        }
    }

    async fn claim_unlogged(
        &self,
        event_id: i64,
        owner: &str,
        check: bool,
    ) -> Result<(ClaimOutcome, Option<Checked>), RuntimeError> {
        let owner = owner.to_string();
        self.write_at(move |this, tx, now| -> Result<_, RuntimeError> {
            check_now(now)?;
            let out = outbox::claim(
                tx,
                event_id,
                &owner,
                now,
                this.config.lease_seconds,
                this.config.max_attempts,
            )?;
            match &out {
                ClaimOutcome::Claimed(lease) => insert_event(
                    tx,
                    lease.operation_id,
                    now,
                    "claimed",
                    &json!({"attempt": lease.attempt, "fencing_token": lease.token,
                                "lease_owner": lease.owner, "lease_until": lease.until}),
                )?,
                ClaimOutcome::Exhausted => {
                    if let Some(ev) = outbox::load(tx, event_id)? {
                        insert_event(
                            tx,
                            ev.operation_id,
                            now,
                            "dead",
                            &json!({
                                "attempts": ev.attempt_count}),
                        )?;
                    }
                }
                _ => {}
            }
            let checked = match &out {
                ClaimOutcome::Claimed(lease) if check => {
                    match Self::checks(tx, lease.operation_id, &this.clock, &this.registry) {
                        // A store failure undoes the claim with the rest: nothing was decided.
                        Err(RuntimeError::Store(e)) if !matches!(e, StoreError::Contract(_)) => {
                            return Err(RuntimeError::Store(e))
                        }
                        checked => Some(checked),
                    }
                }
                _ => None,
            };
            Ok((out, checked))
        })
        .await
    }

    /// Extends a held lease (heartbeat). [`RuntimeError::Fenced`] if it was taken over.
    pub async fn renew(&self, lease: &Lease) -> Result<Lease, RuntimeError> {
        let held = lease.clone();
        let renewed = self
            .write_at(move |this, tx, now| -> Result<Lease, RuntimeError> {
                check_now(now)?;
                Ok(outbox::renew(tx, &held, now, this.config.lease_seconds)?)
            })
            .await;
        count_fenced("renew", &renewed);
        if let Err(RuntimeError::Fenced(_)) = &renewed {
            tracing::warn!(
                target: "toolledger::delivery", event_id = lease.event_id,
                operation = lease.operation_id, fencing_token = lease.token, owner = %lease.owner,
                "fencing rejection: the lease was taken over");
        }
        renewed
    }

    /// Records a failed attempt (conditional on the token); the lease stays until it expires.
    /// The event is `attempt_refused` when `state` is `None` (refused before the downstream
    /// call), `sent_outcome_unknown` when the operation becomes unsure.
    pub(super) async fn record_attempt(
        &self,
        lease: &Lease,
        code: &str,
        state: Option<OperationState>,
    ) -> Result<(), RuntimeError> {
        let kind = match state {
            None => "attempt_refused",
            Some(_) => "sent_outcome_unknown",
        };
        tracing::warn!(
            target: "toolledger::delivery", event_id = lease.event_id,
            operation = lease.operation_id, owner = %lease.owner, attempt = lease.attempt, code,
            state = state.map(OperationState::as_str).unwrap_or("unchanged"),
            "attempt failed");
        let lease = lease.clone();
        let code = code.to_string();
        let recorded = self
            .write_at(move |_, tx, now| -> Result<(), RuntimeError> {
                outbox::record_attempt_error(tx, &lease, &code, now)?;
                if let Some(state) = state {
                    ledger::mark_deferred(tx, lease.operation_id, state, now)
                        .map_err(|e| stored(tx, e))?;
                }
                insert_event(
                    tx,
                    lease.operation_id,
                    now,
                    kind,
                    &json!({"code": code, "attempt": lease.attempt, "fencing_token": lease.token}),
                )
            })
            .await;
        count_fenced("attempt", &recorded);
        recorded
    }

    /// Gives the event of `lease` back for a continuation (the downstream asked for more
    /// input and did not act): pending again, the operation `accepted`, an `awaiting_input`
    /// event recorded. [`RuntimeError::Fenced`] if the lease was taken over.
    async fn rearm(&self, lease: &Lease) -> Result<(), RuntimeError> {
        tracing::info!(
            target: "toolledger::delivery", event_id = lease.event_id,
            operation = lease.operation_id, owner = %lease.owner, attempt = lease.attempt,
            "awaiting input: the event is given back for the continuation");
        self.give_back(lease, "input_required", "awaiting_input", None)
            .await
    }

    /// Gives the event of `lease` back because its request provably never reached the
    /// downstream: pending again, uncounted, the operation `accepted`, a `not_sent` event
    /// recorded with `why`. The next call (or worker pass) forwards it.
    async fn not_sent(&self, lease: &Lease, why: &str) -> Result<(), RuntimeError> {
        tracing::warn!(
            target: "toolledger::delivery", event_id = lease.event_id,
            operation = lease.operation_id, owner = %lease.owner, attempt = lease.attempt, reason = why,
            "not sent: the downstream was not reached; the event is given back");
        self.give_back(lease, "not_sent", "not_sent", Some(why))
            .await
    }

    async fn give_back(
        &self,
        lease: &Lease,
        code: &'static str,
        kind: &'static str,
        why: Option<&str>,
    ) -> Result<(), RuntimeError> {
        let lease = lease.clone();
        let mut detail = json!({"attempt": lease.attempt, "fencing_token": lease.token});
        if let Some(why) = why {
            detail["reason"] = json!(why);
        }
        self.write_at(move |_, tx, now| -> Result<(), RuntimeError> {
            outbox::rearm(tx, &lease, code, now)?;
            ledger::mark_deferred(tx, lease.operation_id, OperationState::Accepted, now)
                .map_err(|e| stored(tx, e))?;
            insert_event(tx, lease.operation_id, now, kind, &detail)
        })
        .await
    }

    /// Runs one claimed lease: preflight, heartbeat, downstream submit, transaction C.
    pub async fn execute(
        &self,
        lease: &Lease,
        failure: Option<CrashPoint>,
    ) -> Result<Processed, RuntimeError> {
        let checked = self.preflight(lease).await;
        self.execute_checked(lease, checked, failure).await
    }

    /// [`Runtime::execute`] with the outcome of its checks already known (`checked`, made
    /// in the claim's transaction or by [`Runtime::preflight`]).
    async fn execute_checked(
        &self,
        lease: &Lease,
        checked: Checked,
        failure: Option<CrashPoint>,
    ) -> Result<Processed, RuntimeError> {
        let record = match checked {
            Ok(r) => r,
            Err(RuntimeError::Refused(e)) => {
                self.record_attempt(lease, e.code.as_str(), None).await?;
                return Err(RuntimeError::Refused(e));
            }
            Err(RuntimeError::Store(StoreError::Contract(m))) => {
                self.record_attempt(lease, "storage_contract", None).await?;
                return Err(RuntimeError::Store(StoreError::Contract(m)));
            }
            Err(e) => return Err(e),
        };
        let unknown = |state| {
            Processed::Unknown(Answer::Unknown {
                status_ref: record.status_ref.clone(),
                state,
            })
        };
        // Heartbeat: a full lease for the downstream call, and proof nobody took over. A lease
        // with at least two thirds of its length left needs neither: nobody can take it over
        // before it expires, and the renewals during the call keep it (this spares a fresh
        // claim's path one commit).
        let left = lease.until.saturating_sub(self.clock.now());
        let mut lease = if left.saturating_mul(3) >= self.config.lease_seconds.saturating_mul(2) {
            lease.clone()
        } else {
            self.renew(lease).await?
        };
        let (tool, downstream) = self.tool(&record.scope.tool)?;
        trace::set(|| KeyValue::new("gen_ai.tool.name", record.scope.tool.clone()));
        trace::set(|| KeyValue::new("toolledger.status_ref", record.status_ref.clone()));
        let request = downstream_request(&record);
        let submitted = {
            let submit = downstream.submit(&record.scope, &request);
            tokio::pin!(submit);
            // While the downstream call runs, renew the lease every third of its length. Once
            // fenced (someone reclaimed), stop renewing; transaction C will be refused.
            let period =
                std::time::Duration::from_secs((self.config.lease_seconds / 3).max(1) as u64);
            let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            let mut fenced = false;
            loop {
                tokio::select! {
                    r = &mut submit => break r,
                    _ = beat.tick(), if !fenced => match self.renew(&lease).await {
                        Ok(renewed) => lease = renewed,
                        Err(RuntimeError::Fenced(_)) => fenced = true,
                        // A busy store is retried at the next beat.
                        Err(_) => {}
                    },
                }
            }
        };
        let receipt = match submitted {
            Ok(r) => r,
            Err(DownstreamError::Refused { code, message }) if valid_refusal(&code, &message) => {
                let answer = self.fail(&lease, failure_result(&code, &message)).await?;
                return Ok(Processed::Delivered(answer));
            }
            Err(DownstreamError::Continue) => {
                self.rearm(&lease).await?;
                return Ok(unknown(OperationState::Accepted));
            }
            Err(DownstreamError::NotSent(why)) => {
                self.not_sent(&lease, &why).await?;
                return Ok(unknown(OperationState::Accepted));
            }
            Err(DownstreamError::Failed { result }) if json::canonical_string(&result).is_ok() => {
                let answer = self.fail(&lease, result).await?;
                return Ok(Processed::Delivered(answer));
            }
            Err(e) => {
                let code = match e {
                    DownstreamError::Conflict => "downstream_conflict",
                    DownstreamError::Unavailable(_) => "downstream_unavailable",
                    DownstreamError::Rejected(_) => "downstream_rejected",
                    DownstreamError::Refused { .. } | DownstreamError::Failed { .. } => {
                        "downstream_refusal_invalid"
                    }
                    DownstreamError::Continue => "downstream_continue",
                    DownstreamError::NotSent(_) => "downstream_not_sent",
                };
                self.record_attempt(&lease, code, Some(OperationState::OutcomeUnknown))
                    .await?;
                return Ok(unknown(OperationState::OutcomeUnknown));
            }
        };
        if self.point(CrashPoint::AfterDownstreamCommit, failure).await {
            return Ok(unknown(OperationState::Processing));
        }
        let checked = match Self::check_receipt(tool.as_ref(), &record, &receipt) {
            Ok(checked) => checked,
            Err(e) => {
                self.record_attempt(
                    &lease,
                    "receipt_invalid",
                    Some(OperationState::OutcomeUnknown),
                )
                .await?;
                return Err(e);
            }
        };
        Ok(Processed::Delivered(
            self.complete_checked(&lease, &record, &receipt, checked)
                .await?,
        ))
    }

    /// [`Runtime::execute`] for a worker pass, in a span `deliver` (kind `CONSUMER`: the
    /// worker takes the event from the outbox) under which the downstream's or external
    /// API's call runs: its `gen_ai.tool.name`, its `toolledger.status_ref`, and
    /// `toolledger.outcome` (`executed` when a result was recorded, `unknown` for an outcome
    /// left unknown; none when the event waits for another attempt) or `error.type`.
    async fn deliver(&self, lease: &Lease, checked: Checked) -> Result<Processed, RuntimeError> {
        let cx = trace::start(
            "deliver",
            SpanKind::Consumer,
            vec![KeyValue::new("gen_ai.operation.name", "execute_tool")],
        );
        let processed = self
            .execute_checked(lease, checked, None)
            .with_context(cx.clone())
            .await;
        let error = match &processed {
            Ok(Processed::Delivered(_)) => {
                trace::set_on(&cx, KeyValue::new("toolledger.outcome", "executed"));
                None
            }
            Ok(Processed::Unknown(Answer::Unknown {
                state: OperationState::OutcomeUnknown,
                ..
            })) => {
                trace::set_on(&cx, KeyValue::new("toolledger.outcome", "unknown"));
                None
            }
            Ok(_) => None,
            Err(e) => Some(e.pass_code()),
        };
        trace::end(&cx, error);
        processed
    }

    /// Claims and runs one event as worker `owner`.
    pub async fn process(
        &self,
        event_id: i64,
        owner: &str,
        failure: Option<CrashPoint>,
    ) -> Result<Processed, RuntimeError> {
        let (lease, checked) = match self.claim_checked(event_id, owner).await? {
            (ClaimOutcome::Claimed(lease), Some(checked)) => (lease, checked),
            (other, _) => return Ok(Processed::NotClaimed(other)),
        };
        if self.point(CrashPoint::AfterClaim, failure).await {
            let status_ref = self.status_ref_of(lease.operation_id).await?;
            return Ok(Processed::Unknown(Answer::Unknown {
                status_ref,
                state: OperationState::Processing,
            }));
        }
        self.execute_checked(&lease, checked, failure).await
    }

    pub(super) async fn status_ref_of(&self, operation_id: i64) -> Result<String, RuntimeError> {
        self.store
            .read(move |tx: &mut dyn EffectTx| Ok(load_id(tx, operation_id)?.status_ref))
            .await
    }

    /// Events ready at the current time: pending ones and those with an expired lease.
    pub async fn ready(&self, limit: i64) -> Result<Vec<i64>, RuntimeError> {
        let now = self.clock.now();
        self.store
            .read(move |tx: &mut dyn EffectTx| Ok(outbox::ready(tx, now, limit)?))
            .await
    }

    /// One worker pass: enumerate ready events and process each.
    pub async fn run_pass(&self, owner: &str, limit: i64) -> Result<PassSummary, RuntimeError> {
        self.pass(owner, limit, |_| {}).await
    }

    /// [`Runtime::run_pass`], calling `report(event_id, error)` for each event whose
    /// processing failed (the failures the summary counts under `refused`), as it happens.
    pub async fn run_pass_reporting(
        &self,
        owner: &str,
        limit: i64,
        mut report: impl FnMut(i64, &RuntimeError),
    ) -> Result<PassSummary, RuntimeError> {
        self.pass(owner, limit, |f| {
            if let Some(id) = f.event_id {
                report(id, f.error)
            }
        })
        .await
    }

    /// The one worker pass: the ready events and the held ones in one snapshot, then claim
    /// and execute each ready event; each failed event is given to `report` with the
    /// operation its claim named.
    async fn pass(
        &self,
        owner: &str,
        limit: i64,
        mut report: impl FnMut(WorkerFailure<'_>),
    ) -> Result<PassSummary, RuntimeError> {
        let now = self.clock.now();
        let (ids, held) = self
            .store
            .read(move |tx: &mut dyn EffectTx| -> Result<_, RuntimeError> {
                Ok((outbox::ready(tx, now, limit)?, outbox::held(tx, now)?))
            })
            .await?;
        let mut summary = PassSummary {
            ready: ids.len(),
            skipped: usize::try_from(held).unwrap_or(0),
            ..PassSummary::default()
        };
        for id in ids {
            let (operation, processed) = match self.claim_checked(id, owner).await {
                Ok((ClaimOutcome::Claimed(lease), Some(checked))) => {
                    // The same crash point as `process` (tests hold the worker there).
                    self.point(CrashPoint::AfterClaim, None).await;
                    (
                        Some(lease.operation_id),
                        self.deliver(&lease, checked).await,
                    )
                }
                Ok((other, _)) => (None, Ok(Processed::NotClaimed(other))),
                Err(e) => (None, Err(e)),
            };
            match processed {
                Ok(Processed::Delivered(Answer::Done {
                    state: OperationState::Failed,
                    ..
                })) => summary.failed += 1,
                Ok(Processed::Delivered(_)) => summary.delivered += 1,
                Ok(Processed::Unknown(_)) => summary.unknown += 1,
                Ok(Processed::NotClaimed(ClaimOutcome::Exhausted)) => summary.dead += 1,
                Ok(Processed::NotClaimed(_)) => summary.skipped += 1,
                Err(RuntimeError::Fenced(_)) => summary.skipped += 1,
                Err(e) => {
                    report(WorkerFailure {
                        event_id: Some(id),
                        operation,
                        error: &e,
                    });
                    *summary.refused.entry(e.pass_code()).or_default() += 1;
                }
            }
        }
        Ok(summary)
    }
}

/// One failure a [`Worker`] met: of one event (`event_id`, and the operation its claim named
/// when it got that far), or of a whole pass (both `None`).
#[derive(Debug)]
pub struct WorkerFailure<'a> {
    /// The outbox event whose processing failed; `None` when the pass failed as a whole.
    pub event_id: Option<i64>,
    /// The operation's row id, when the event was claimed.
    pub operation: Option<i64>,
    /// What went wrong.
    pub error: &'a RuntimeError,
}

impl WorkerFailure<'_> {
    /// The code the failure is counted under ([`RuntimeError::pass_code`]).
    pub fn code(&self) -> String {
        self.error.pass_code()
    }
}

type FailureHook = Arc<dyn Fn(&WorkerFailure<'_>) + Send + Sync>;

/// A worker over a [`Runtime`]'s registry: the deferred tools a program registered with their
/// downstreams, delivered from the outbox pass after pass.
///
/// Each pass takes up to `batch` ready events (pending ones and those whose lease expired),
/// claims each under a lease with a fencing token, rechecks it and calls its downstream
/// ([`Runtime::process`]). Every failure is logged as it happens (target
/// `toolledger::worker`, fields `event_id`, `operation`, `code`, `owner`; never arguments or
/// secrets) and handed to the hook of [`Worker::on_failure`], if any. Counters:
/// `toolledger_worker_passes_total` and `toolledger_worker_events_total{outcome}` (outcome
/// `delivered`, `failed`, `unknown`, `refused`, `dead`, `skipped`).
///
/// ```no_run
/// # async fn demo(runtime: toolledger_core::runtime::Runtime) {
/// use std::time::Duration;
/// use toolledger_core::runtime::Worker;
/// let worker = Worker::new(runtime, "worker-1")
///     .batch(64)
///     .poll_interval(Duration::from_millis(500));
/// let run = worker.run_until(async { let _ = tokio::signal::ctrl_c().await; }).await;
/// println!("{} passes, {} delivered", run.passes, run.totals.delivered);
/// # }
/// ```
#[derive(Clone)]
pub struct Worker {
    runtime: Runtime,
    owner: String,
    batch: i64,
    poll_interval: std::time::Duration,
    on_failure: Option<FailureHook>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("owner", &self.owner)
            .field("batch", &self.batch)
            .field("poll_interval", &self.poll_interval)
            .finish_non_exhaustive()
    }
}

/// What [`Worker::run_until`] did before it stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerRun<S> {
    /// Passes that completed.
    pub passes: u64,
    /// The passes' summaries, summed.
    pub totals: PassSummary,
    /// What the shutdown future returned.
    pub stopped_by: S,
}

impl Worker {
    /// Most events one pass takes, by default.
    pub const DEFAULT_BATCH: i64 = 64;

    /// Time between passes, by default.
    pub const DEFAULT_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

    /// A worker delivering `runtime`'s outbox as lease owner `owner` (its lease length and
    /// attempt limit are the runtime's [`RuntimeConfig`]).
    pub fn new(runtime: Runtime, owner: impl Into<String>) -> Worker {
        Worker {
            runtime,
            owner: owner.into(),
            batch: Self::DEFAULT_BATCH,
            poll_interval: Self::DEFAULT_POLL_INTERVAL,
            on_failure: None,
        }
    }

    /// Most events one pass takes (at least 1).
    pub fn batch(mut self, batch: i64) -> Worker {
        self.batch = batch.max(1);
        self
    }

    /// Time between the end of one pass and the start of the next in [`Worker::run_until`].
    pub fn poll_interval(mut self, interval: std::time::Duration) -> Worker {
        self.poll_interval = interval;
        self
    }

    /// Also calls `hook` with every failure, as it happens (after it was logged).
    pub fn on_failure(
        mut self,
        hook: impl Fn(&WorkerFailure<'_>) + Send + Sync + 'static,
    ) -> Worker {
        self.on_failure = Some(Arc::new(hook));
        self
    }

    /// The lease owner name.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The runtime it delivers for.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    fn failed(&self, f: &WorkerFailure<'_>) {
        let code = f.code();
        let message = match f.error {
            RuntimeError::Refused(e) => e.message.clone(),
            RuntimeError::Store(s) => s.caller_error().message,
            RuntimeError::Fenced(_) => "the lease was taken over".to_string(),
        };
        match f.event_id {
            Some(event_id) => tracing::warn!(
                target: "toolledger::worker", event_id, operation = f.operation, code = %code,
                owner = %self.owner, reason = %message, "event failed"),
            None => tracing::warn!(
                target: "toolledger::worker", code = %code, owner = %self.owner,
                reason = %message, "worker pass failed"),
        }
        if let Some(hook) = &self.on_failure {
            hook(f);
        }
    }

    /// One pass over the events ready now. A pass that failed as a whole (the store did not
    /// answer) is logged, handed to the failure hook and returned.
    pub async fn run_once(&self) -> Result<PassSummary, RuntimeError> {
        let out = self
            .runtime
            .pass(&self.owner, self.batch, |f| {
                metrics::counter!("toolledger_worker_events_total", "outcome" => "refused")
                    .increment(1);
                self.failed(&f)
            })
            .await;
        match &out {
            Ok(s) => {
                metrics::counter!("toolledger_worker_passes_total").increment(1);
                for (outcome, n) in [
                    ("delivered", s.delivered),
                    ("failed", s.failed),
                    ("unknown", s.unknown),
                    ("dead", s.dead),
                    ("skipped", s.skipped),
                ] {
                    if n > 0 {
                        metrics::counter!("toolledger_worker_events_total", "outcome" => outcome)
                            .increment(n as u64);
                    }
                }
            }
            Err(e) => self.failed(&WorkerFailure {
                event_id: None,
                operation: None,
                error: e,
            }),
        }
        out
    }

    /// Runs passes, [`Worker::poll_interval`] apart, until `shutdown` completes. A pass that
    /// fails as a whole is logged and the worker goes on (a busy or briefly unavailable store).
    /// Shutdown stops it at once, even inside a pass: work in flight keeps its lease until
    /// the lease expires, and a later claim (with a higher fencing token) takes it over;
    /// everything already committed stays.
    pub async fn run_until<F: std::future::Future>(&self, shutdown: F) -> WorkerRun<F::Output> {
        tokio::pin!(shutdown);
        let mut passes = 0;
        let mut totals = PassSummary::default();
        loop {
            tokio::select! {
                biased;
                stopped_by = &mut shutdown => return WorkerRun { passes, totals, stopped_by },
                res = self.run_once() => {
                    if let Ok(s) = res {
                        passes += 1;
                        totals.add(&s);
                    }
                }
            }
            tokio::select! {
                biased;
                stopped_by = &mut shutdown => return WorkerRun { passes, totals, stopped_by },
                _ = tokio::time::sleep(self.poll_interval) => {}
            }
        }
    }
}

impl RuntimeError {
    /// The code a worker pass counts this failure under ([`PassSummary::refused`]): the
    /// refusal's error code, or the store failure's code in lower case.
    pub fn pass_code(&self) -> String {
        match self {
            RuntimeError::Refused(err) => err.code.as_str().to_string(),
            RuntimeError::Store(s) => s.code().to_ascii_lowercase(),
            RuntimeError::Fenced(_) => "fenced".into(),
        }
    }
}
