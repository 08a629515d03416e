//! Operator resolution of unsure operations: deferred ones (`outcome_unknown`, `dead`, or
//! `processing` under an expired lease) backed by the downstream's evidence, and inline ones
//! stuck `in_progress` or left `partial`, backed by the ledger's own record of their steps.

use super::*;
use crate::ledger::{self, LedgerRow};

/// Which operation a resolution settles, as read in its first (read-only) transaction.
enum Target {
    /// A deferred operation and the fencing token of its outbox event at that read.
    Deferred(Box<DeferredRecord>, i64),
    /// An inline operation.
    Inline(Box<LedgerRow>),
}

fn in_progress(message: String) -> RuntimeError {
    Error::new(ErrorCode::OperationInProgress, message).into()
}

impl Runtime {
    /// An operator settles an unsure operation.
    ///
    /// The operator must currently hold [`OPERATOR_ROLE`] in the operation's tenant
    /// (`permission_denied` otherwise; a reference outside the tenant is `not_found`). The
    /// reason is 1 to 512 characters. Every resolution appends a `resolved` operation event
    /// `{as, operator, reason, previous_state, evidence}` at the resolution time.
    ///
    /// **Deferred** operations resolve as `succeeded` or `failed` (`applied`/`partial` are
    /// `invalid_arguments`). Resolvable: `outcome_unknown`, `dead`, and `processing` whose
    /// lease has expired (the worker that held it is presumed gone: its outcome is unknown).
    /// `accepted` (no worker has claimed it) and a live lease (a worker may be calling the
    /// downstream right now) are `operation_in_progress`; a finished operation is
    /// `invalid_arguments`. The downstream is asked first: with a receipt, `failed` is refused
    /// (`operation_conflict`: the evidence says it happened) and `succeeded` reconciles it like
    /// a status query (transaction C, delivery `receipt_reconciled`); without one, `succeeded`
    /// is refused (`outcome_unknown`: no result to record) and `failed` stores
    /// `{code: "resolved_failed", message}`. The event closes as `delivered` with a new
    /// fencing token, so a worker still holding an old lease changes nothing.
    ///
    /// **Inline** operations resolve as `applied` or `partial` (`succeeded`/`failed` are
    /// `invalid_arguments`: the first step of an inline operation committed together with its
    /// ledger row, so "nothing happened" would be false). An `in_progress` operation is
    /// resolvable once it is stuck ([`ledger::IN_PROGRESS_EXPIRY_SECS`] after its last change;
    /// before, `operation_in_progress`: its later steps may still be running); it becomes
    /// `applied` or `partial` with the first step's result (its `first_step` event) as the
    /// stored result. A `partial` operation may be resolved as `applied` (an operator completed
    /// the remaining steps); its result stays. An `applied` operation is `invalid_arguments`.
    ///
    /// It is a span `resolve` (`toolledger.status_ref`, `toolledger.resolution`, and
    /// `error.type` when refused) under the current trace context.
    pub async fn resolve(&self, resolution: &Resolution) -> Result<Answer, RuntimeError> {
        use opentelemetry::context::FutureExt as _;
        use opentelemetry::KeyValue;
        let cx = crate::trace::start(
            "resolve",
            opentelemetry::trace::SpanKind::Internal,
            vec![
                KeyValue::new("toolledger.status_ref", resolution.status_ref.clone()),
                KeyValue::new("toolledger.resolution", resolution.outcome.as_str()),
            ],
        );
        let answer = self
            .resolve_unlogged(resolution)
            .with_context(cx.clone())
            .await;
        crate::trace::end(&cx, answer.as_ref().err().map(RuntimeError::pass_code));
        count_fenced("resolve", &answer);
        let r = resolution;
        match &answer {
            Ok(_) => tracing::info!(
                target: "toolledger::resolve", status_ref = %r.status_ref, operator = %r.operator,
                outcome = ?r.outcome, "resolved by an operator"),
            Err(e) => tracing::warn!(
                target: "toolledger::resolve", status_ref = %r.status_ref, operator = %r.operator,
                error = %e, "resolution refused"),
        }
        answer
    }

    /// What the downstream holds for the deferred operation `status_ref`, for an operator
    /// deciding how to settle it: the downstream's receipt, or `None` when it holds none. The
    /// downstream's status is asked (nothing is submitted) and nothing is written: a receipt
    /// found here is not reconciled into the ledger (an explicit status query or `resolve`
    /// records it).
    ///
    /// `operator` must currently hold [`OPERATOR_ROLE`] in the operation's tenant
    /// (`permission_denied`); a reference outside the tenant, or of an inline operation, is
    /// `not_found`; a downstream that does not answer is `unavailable`.
    pub async fn downstream_evidence(
        &self,
        operator: &str,
        status_ref: &str,
    ) -> Result<Option<Value>, RuntimeError> {
        check_id("operator", operator, 128)?;
        check_id("status_ref", status_ref, 128).map_err(|_| Error::not_found())?;
        let (who, reference) = (operator.to_string(), status_ref.to_string());
        let record = self
            .store
            .read(
                move |tx: &mut dyn EffectTx| -> Result<DeferredRecord, RuntimeError> {
                    let Some(operator) = resolve(tx, &who)? else {
                        return Err(Error::denied("unknown or inactive operator").into());
                    };
                    if !operator.has_role(OPERATOR_ROLE) {
                        return Err(
                            Error::denied("the principal does not hold the role operator").into(),
                        );
                    }
                    match load_status_ref(tx, &reference)? {
                        Loaded::Deferred(rec) if rec.scope.tenant == operator.tenant => Ok(*rec),
                        _ => Err(Error::not_found().into()),
                    }
                },
            )
            .await?;
        let (_, downstream) = self.tool(&record.scope.tool)?;
        let request = downstream_request(&record);
        downstream
            .status_of(&record.status_ref, &request)
            .await
            .map_err(|_| Error::unavailable("the downstream status query failed").into())
    }

    async fn resolve_unlogged(&self, resolution: &Resolution) -> Result<Answer, RuntimeError> {
        let r = resolution.clone();
        let n = r.reason.chars().count();
        if n == 0 || n > 512 || r.reason.chars().any(|c| c.is_control() && c != '\n') {
            return Err(Error::invalid("reason must be 1 to 512 characters").into());
        }
        check_id("operator", &r.operator, 128)?;
        check_id("status_ref", &r.status_ref, 128).map_err(|_| Error::not_found())?;
        let this = self.clone();
        let q = r.clone();
        let target = self
            .store
            .read(
                move |tx: &mut dyn EffectTx| -> Result<Target, RuntimeError> {
                    let now = this.clock.now();
                    let Some(operator) = resolve(tx, &q.operator)? else {
                        return Err(Error::denied("unknown or inactive operator").into());
                    };
                    if !operator.has_role(OPERATOR_ROLE) {
                        return Err(
                            Error::denied("the principal does not hold the role operator").into(),
                        );
                    }
                    match load_status_ref(tx, &q.status_ref)? {
                        Loaded::Deferred(rec) if rec.scope.tenant == operator.tenant => {
                            Self::deferred_as(q.outcome)?;
                            Self::resolvable(&rec)?;
                            let ev = outbox_event(tx, rec.id)?;
                            Self::lease_expired(&rec, &ev, now)?;
                            Ok(Target::Deferred(rec, ev.fencing_token))
                        }
                        Loaded::NotDeferred => {
                            let row = ledger::rows_by_status_ref(tx, &q.status_ref)?
                                .pop()
                                .filter(|row| row.tenant == operator.tenant)
                                .ok_or_else(Error::not_found)?;
                            Self::inline_resolvable(&row, q.outcome, now)?;
                            Ok(Target::Inline(Box::new(row)))
                        }
                        _ => Err(Error::not_found().into()),
                    }
                },
            )
            .await?;
        match target {
            Target::Deferred(record, token) => self.resolve_deferred(r, *record, token).await,
            Target::Inline(row) => self.resolve_inline(r, *row).await,
        }
    }

    async fn resolve_deferred(
        &self,
        r: Resolution,
        record: DeferredRecord,
        token: i64,
    ) -> Result<Answer, RuntimeError> {
        let (tool, downstream) = self.tool(&record.scope.tool)?;
        let receipt = downstream
            .status(&record.status_ref)
            .await
            .map_err(|_| Error::unavailable("the downstream status query failed"))?;
        let mut operator_receipt = None;
        let checked = match (&receipt, r.outcome) {
            (Some(_), ResolveAs::Failed) => {
                return Err(Error::conflict(
                    "the downstream holds a receipt for this operation: it happened; \
                     resolve it as succeeded",
                )
                .into())
            }
            (None, ResolveAs::Succeeded) => match &r.evidence {
                None => {
                    return Err(Error::new(
                        ErrorCode::OutcomeUnknown,
                        "the downstream holds no receipt: success is recorded only with the \
                         operator's evidence (--evidence JSON)",
                    )
                    .into())
                }
                Some(evidence) => {
                    let (result, receipt) =
                        Self::operator_receipt(tool.as_ref(), &record, &r, evidence)?;
                    let receipt_id = receipt["receipt_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    operator_receipt = Some(receipt);
                    Some((result, receipt_id))
                }
            },
            (Some(receipt), _) => Some(Self::check_receipt(tool.as_ref(), &record, receipt)?),
            (None, _) => None,
        };
        let by_operator = operator_receipt.is_some();
        let receipt = operator_receipt.or(receipt);
        let identity = query_identity(&record.provider, &record.status_ref);
        self.write_at(move |_, tx, now| -> Result<Answer, RuntimeError> {
            let current = load_locked(tx, record.id)?;
            Self::resolvable(&current)?;
            let ev = outbox_event(tx, current.id)?;
            if ev.fencing_token != token {
                return Err(in_progress(
                    "a worker claimed the operation meanwhile; nothing was changed".into(),
                ));
            }
            Self::lease_expired(&current, &ev, now)?;
            outbox::complete_by_reconciliation(tx, ev.id, token, now)?;
            let mut detail = json!({
                "as": r.outcome.as_str(),
                "operator": r.operator,
                "reason": r.reason,
                "previous_state": current.state.as_str(),
            });
            let answer = match &checked {
                Some((result, receipt_id)) => {
                    Self::write_reconciled(
                        tx,
                        &current,
                        &identity,
                        receipt.as_ref().unwrap_or(&Value::Null),
                        receipt_id,
                        result,
                        now,
                    )?;
                    detail["evidence"] = json!(if by_operator { "operator" } else { "receipt" });
                    detail["receipt_id"] = json!(receipt_id);
                    if let Some(evidence) = &r.evidence {
                        detail["operator_evidence"] = evidence.clone();
                    }
                    Answer::Done {
                        status_ref: current.status_ref.clone(),
                        state: OperationState::Succeeded,
                        delivery: Delivery::ReceiptReconciled,
                        result: result.clone(),
                    }
                }
                None => {
                    let result = failure_result(
                        RESOLVED_FAILED_CODE,
                        "an operator resolved the unknown outcome as failed",
                    );
                    Self::write_failure(
                        tx,
                        &current,
                        &result,
                        &json!({"code": RESOLVED_FAILED_CODE, "via": "operator"}),
                        now,
                    )?;
                    detail["evidence"] = json!("no_receipt");
                    Answer::Done {
                        status_ref: current.status_ref.clone(),
                        state: OperationState::Failed,
                        delivery: Delivery::Fresh,
                        result,
                    }
                }
            };
            insert_event(tx, current.id, now, "resolved", &detail)?;
            Ok(answer)
        })
        .await
    }

    async fn resolve_inline(&self, r: Resolution, row: LedgerRow) -> Result<Answer, RuntimeError> {
        let id = row.id;
        self.write_at(move |_, tx, now| -> Result<Answer, RuntimeError> {
            lock_operation(tx, id)?;
            let current = ledger::rows_by_status_ref(tx, &row.status_ref)?
                .pop()
                .filter(|c| c.id == id)
                .ok_or_else(|| contract_violation("the resolved operation vanished"))?;
            Self::inline_resolvable(&current, r.outcome, now)?;
            let state = match r.outcome {
                ResolveAs::Applied => OperationState::Applied,
                _ => OperationState::Partial,
            };
            let (result, evidence) = match current.state {
                OperationState::InProgress => {
                    let first = ledger::load_events(tx, id)
                        .map_err(|e| stored(tx, e))?
                        .into_iter()
                        .find(|(_, _, kind, _)| kind == "first_step")
                        .map(|(_, _, _, detail)| detail)
                        .ok_or_else(|| {
                            contract_violation("an in-progress operation without its first step")
                        })?;
                    let (text, digest) = ledger::encode_stored(&first).ok_or_else(|| {
                        contract_violation("the first step's result is not canonical")
                    })?;
                    let n = ledger::settle(
                        tx,
                        id,
                        ledger::Unfinished::Inline,
                        state,
                        &text,
                        &digest,
                        now,
                    )
                    .map_err(|e| stored(tx, e))?;
                    if n != 1 {
                        return Err(contract_violation(
                            "the operation left in_progress meanwhile",
                        ));
                    }
                    (first, "first_step")
                }
                _ => {
                    let n = ledger::partial_to_applied(tx, id, now).map_err(|e| stored(tx, e))?;
                    if n != 1 {
                        return Err(contract_violation("the operation left partial meanwhile"));
                    }
                    let result = current
                        .result
                        .clone()
                        .ok_or_else(|| contract_violation("a partial operation without result"))?;
                    (result, "operator")
                }
            };
            let detail = json!({
                "as": r.outcome.as_str(),
                "operator": r.operator,
                "reason": r.reason,
                "previous_state": current.state.as_str(),
                "evidence": evidence,
            });
            insert_event(tx, id, now, "resolved", &detail)?;
            Ok(Answer::Done {
                status_ref: current.status_ref,
                state,
                delivery: Delivery::Fresh,
                result,
            })
        })
        .await
    }

    /// The result and receipt of a success an operator confirmed on `evidence` (a JSON object
    /// in the canonical domain, at most 16 KiB): the receipt binds the operation as a
    /// downstream's would, names the operator and carries the evidence.
    fn operator_receipt(
        tool: &dyn DeferredTool,
        record: &DeferredRecord,
        r: &Resolution,
        evidence: &Value,
    ) -> Result<(Value, Value), RuntimeError> {
        let text = json::canonical_string(evidence)
            .map_err(|e| Error::invalid(format!("evidence {}", e.message)))?;
        if !evidence.is_object() || text.len() > 16 * 1024 {
            return Err(Error::invalid("evidence must be a JSON object of at most 16 KiB").into());
        }
        let confirmation = json!({
            "by": "operator",
            "operator": r.operator,
            "reason": r.reason,
            "evidence": evidence,
        });
        let result = tool.confirmed_result(&record.arguments, &confirmation)?;
        json::canonical_string(&result)
            .map_err(|_| contract_violation("the confirmed result is not canonical"))?;
        let receipt_id = format!(
            "operator-{}",
            &digest::sha256_hex(record.status_ref.as_bytes())[..32]
        );
        let mut receipt = bound_receipt(&downstream_request(record), &receipt_id, result.clone());
        receipt["confirmed"] = confirmation;
        Ok((result, receipt))
    }

    /// A deferred operation resolves as `succeeded` or `failed`.
    fn deferred_as(outcome: ResolveAs) -> Result<(), RuntimeError> {
        match outcome {
            ResolveAs::Succeeded | ResolveAs::Failed => Ok(()),
            other => Err(Error::invalid(format!(
                "a deferred operation resolves as succeeded or failed, not {}",
                other.as_str()
            ))
            .into()),
        }
    }

    /// Which inline operations may be resolved as what, at `now` (see [`Runtime::resolve`]).
    fn inline_resolvable(
        row: &LedgerRow,
        outcome: ResolveAs,
        now: i64,
    ) -> Result<(), RuntimeError> {
        if matches!(outcome, ResolveAs::Succeeded | ResolveAs::Failed) {
            return Err(Error::invalid(format!(
                "an inline operation resolves as applied or partial, not {}: its first step \
                 committed together with its ledger row",
                outcome.as_str()
            ))
            .into());
        }
        match row.state {
            OperationState::InProgress => {
                if !ledger::in_progress_expired(row.updated_at, now) {
                    return Err(in_progress(format!(
                        "the operation is in_progress and may still be finishing: it can be \
                         resolved from {} on ({} seconds after its last change)",
                        row.updated_at
                            .saturating_add(ledger::IN_PROGRESS_EXPIRY_SECS),
                        ledger::IN_PROGRESS_EXPIRY_SECS
                    )));
                }
                Ok(())
            }
            OperationState::Partial if outcome == ResolveAs::Applied => Ok(()),
            OperationState::Partial => Err(Error::invalid(
                "the operation is already partial: resolve it as applied once its remaining \
                 steps are done",
            )
            .into()),
            state => Err(Error::invalid(format!(
                "the operation is {}: only in_progress or partial inline operations can be \
                 resolved",
                state.as_str()
            ))
            .into()),
        }
    }

    /// A `processing` operation is resolvable only once its lease has expired.
    fn lease_expired(
        record: &DeferredRecord,
        ev: &outbox::OutboxEvent,
        now: i64,
    ) -> Result<(), RuntimeError> {
        match ev.lease_until {
            Some(until) if now < until => Err(in_progress(format!(
                "the operation is {} and a worker holds a live lease on it until {until}; \
                 resolve it after the lease expires",
                record.state.as_str()
            ))),
            _ => Ok(()),
        }
    }

    /// Which deferred operations can be resolved: `outcome_unknown`, `dead` and
    /// `processing` (whose lease the caller checks with `lease_expired`).
    pub(super) fn resolvable(record: &DeferredRecord) -> Result<(), RuntimeError> {
        match record.state {
            OperationState::OutcomeUnknown | OperationState::Dead | OperationState::Processing => {
                Ok(())
            }
            OperationState::Accepted => Err(in_progress(
                "the operation is accepted and no worker has claimed it yet: run `toolledger \
                 worker`; it can be resolved once it is outcome_unknown or dead, or processing \
                 under an expired lease"
                    .into(),
            )),
            state => Err(Error::invalid(format!(
                "the operation is {}: only outcome_unknown, dead or processing (lease expired) \
                 deferred operations can be resolved",
                state.as_str()
            ))
            .into()),
        }
    }
}
