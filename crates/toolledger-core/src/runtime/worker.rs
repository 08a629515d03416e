//! The worker: claims (lease and fencing token), heartbeats, the downstream submit under a
//! renewed lease, refused attempts, and worker passes over the ready events.

use super::*;
use crate::ledger;

impl Runtime {
    /// Claims `event_id` for `owner` now.
    pub async fn claim(&self, event_id: i64, owner: &str) -> Result<ClaimOutcome, RuntimeError> {
        let out = self.claim_unlogged(event_id, owner).await;
        match &out {
            Ok(ClaimOutcome::Claimed(l)) if l.attempt > 1 => tracing::info!(
                target: "toolledger::worker", event_id, operation = l.operation_id,
                attempt = l.attempt, fencing_token = l.token, owner, "claimed again (an earlier lease expired)"),
            Ok(ClaimOutcome::Claimed(l)) => tracing::debug!(
                target: "toolledger::worker", event_id, operation = l.operation_id,
                attempt = l.attempt, fencing_token = l.token, owner, "claimed"),
            Ok(ClaimOutcome::Exhausted) => tracing::warn!(
                target: "toolledger::worker", event_id, owner,
                "dead letter: attempts exhausted; an operator decides (toolledger resolve)"),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(target: "toolledger::worker", event_id, owner, error = %e, "claim failed")
            }
        }
        out
    }

    async fn claim_unlogged(
        &self,
        event_id: i64,
        owner: &str,
    ) -> Result<ClaimOutcome, RuntimeError> {
        let owner = owner.to_string();
        self.write_at(move |this, tx, now| -> Result<ClaimOutcome, RuntimeError> {
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
            Ok(out)
        })
        .await
    }

    /// Extends a held lease (heartbeat). [`RuntimeError::Fenced`] if it was taken over.
    pub async fn renew(&self, lease: &Lease) -> Result<Lease, RuntimeError> {
        let held = lease.clone();
        let renewed = self
            .write_at(move |this, tx, now| -> Result<Lease, RuntimeError> {
                check_now(now)?;
                outbox::renew(tx, &held, now, this.config.lease_seconds)?
                    .map_err(RuntimeError::Fenced)
            })
            .await;
        if let Err(RuntimeError::Fenced(_)) = &renewed {
            tracing::warn!(
                target: "toolledger::worker", event_id = lease.event_id,
                operation = lease.operation_id, fencing_token = lease.token, owner = %lease.owner,
                "fencing rejection: the lease was taken over");
        }
        renewed
    }

    /// Records a failed attempt (conditional on the token); the lease stays until it expires.
    pub(super) async fn record_attempt(
        &self,
        lease: &Lease,
        code: &str,
        state: Option<OperationState>,
    ) -> Result<(), RuntimeError> {
        tracing::warn!(
            target: "toolledger::worker", event_id = lease.event_id,
            operation = lease.operation_id, attempt = lease.attempt, code,
            state = state.map(OperationState::as_str).unwrap_or("unchanged"),
            "attempt failed");
        let lease = lease.clone();
        let code = code.to_string();
        self.write_at(move |_, tx, now| -> Result<(), RuntimeError> {
            outbox::record_attempt_error(tx, &lease, &code, now)?.map_err(RuntimeError::Fenced)?;
            if let Some(state) = state {
                ledger::mark_deferred(tx, lease.operation_id, state, now)
                    .map_err(|e| stored(tx, e))?;
            }
            insert_event(
                tx,
                lease.operation_id,
                now,
                "attempt_refused",
                &json!({"code": code, "attempt": lease.attempt, "fencing_token": lease.token}),
            )
        })
        .await
    }

    /// Runs one claimed lease: preflight, heartbeat, downstream submit, transaction C.
    pub async fn execute(
        &self,
        lease: &Lease,
        failure: Option<CrashPoint>,
    ) -> Result<Processed, RuntimeError> {
        let record = match self.preflight(lease).await {
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
        // Heartbeat: a full lease for the downstream call, and proof nobody took over.
        let mut lease = self.renew(lease).await?;
        let (tool, downstream) = self.tool(&record.scope.tool)?;
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
                };
                self.record_attempt(&lease, code, Some(OperationState::OutcomeUnknown))
                    .await?;
                return Ok(unknown(OperationState::OutcomeUnknown));
            }
        };
        if self.point(CrashPoint::AfterDownstreamCommit, failure).await {
            return Ok(unknown(OperationState::Processing));
        }
        if let Err(e) = Self::check_receipt(tool.as_ref(), &record, &receipt) {
            self.record_attempt(
                &lease,
                "receipt_invalid",
                Some(OperationState::OutcomeUnknown),
            )
            .await?;
            return Err(e);
        }
        Ok(Processed::Delivered(self.complete(&lease, receipt).await?))
    }

    /// Claims and runs one event as worker `owner`.
    pub async fn process(
        &self,
        event_id: i64,
        owner: &str,
        failure: Option<CrashPoint>,
    ) -> Result<Processed, RuntimeError> {
        let lease = match self.claim(event_id, owner).await? {
            ClaimOutcome::Claimed(lease) => lease,
            other => return Ok(Processed::NotClaimed(other)),
        };
        if self.point(CrashPoint::AfterClaim, failure).await {
            let status_ref = self.status_ref_of(lease.operation_id).await?;
            return Ok(Processed::Unknown(Answer::Unknown {
                status_ref,
                state: OperationState::Processing,
            }));
        }
        self.execute(&lease, failure).await
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
        self.run_pass_reporting(owner, limit, |_, _| {}).await
    }

    /// [`Runtime::run_pass`], calling `report(event_id, error)` for each event whose
    /// processing failed (the failures the summary counts under `refused`), as it happens.
    pub async fn run_pass_reporting(
        &self,
        owner: &str,
        limit: i64,
        mut report: impl FnMut(i64, &RuntimeError),
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
            match self.process(id, owner, None).await {
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
                    report(id, &e);
                    *summary.refused.entry(e.pass_code()).or_default() += 1;
                }
            }
        }
        Ok(summary)
    }
}

impl RuntimeError {
    /// The code a worker pass counts this failure under ([`PassSummary::refused`]): the
    /// refusal's error code, or the store failure's code in lower case.
    pub fn pass_code(&self) -> String {
        match self {
            RuntimeError::Refused(err) => err.code.as_str().to_string(),
            RuntimeError::Store(s) => s.cli_code().to_ascii_lowercase(),
            RuntimeError::Fenced(_) => "fenced".into(),
        }
    }
}
