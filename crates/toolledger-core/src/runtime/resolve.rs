//! Operator resolution of `outcome_unknown` and `dead` operations, backed by the
//! downstream's evidence.

use super::*;

impl Runtime {
    /// An operator settles an `outcome_unknown` or `dead` operation.
    ///
    /// The operator must currently hold [`OPERATOR_ROLE`] in the operation's tenant
    /// (`permission_denied` otherwise; a reference outside the tenant is `not_found`). Only
    /// `outcome_unknown` and `dead` operations without a live lease can be resolved
    /// (`operation_in_progress` for `accepted`/`processing` or a live lease, `invalid_arguments`
    /// for a finished one). The downstream is asked first: with a receipt, `failed` is refused
    /// (`operation_conflict`: the evidence says it happened) and `succeeded` reconciles it like a
    /// status query (transaction C, delivery `receipt_reconciled`); without one, `succeeded` is
    /// refused (`outcome_unknown`: no result to record) and `failed` stores
    /// `{code: "resolved_failed", message}`. Every resolution appends a `resolved` operation
    /// event with the operator and the reason; the event closes as `delivered` with a new
    /// fencing token, so a worker still holding an old lease changes nothing.
    pub async fn resolve(&self, resolution: &Resolution) -> Result<Answer, RuntimeError> {
        let r = resolution.clone();
        let n = r.reason.chars().count();
        if n == 0 || n > 512 || r.reason.chars().any(|c| c.is_control() && c != '\n') {
            return Err(Error::invalid("reason must be 1 to 512 characters").into());
        }
        check_id("operator", &r.operator, 128)?;
        check_id("status_ref", &r.status_ref, 128).map_err(|_| Error::not_found())?;
        let this = self.clone();
        let q = r.clone();
        let (record, token) = self
            .store
            .read(
                move |tx: &mut dyn EffectTx| -> Result<(DeferredRecord, i64), RuntimeError> {
                    let now = this.clock.now();
                    let Some(operator) = resolve(tx, &q.operator)? else {
                        return Err(Error::denied("unknown or inactive operator").into());
                    };
                    if !operator.has_role(OPERATOR_ROLE) {
                        return Err(
                            Error::denied("the principal does not hold the role operator").into(),
                        );
                    }
                    let record = match load_status_ref(tx, &q.status_ref)? {
                        Loaded::Deferred(rec) if rec.scope.tenant == operator.tenant => *rec,
                        _ => return Err(Error::not_found().into()),
                    };
                    Self::resolvable(&record)?;
                    let ev = outbox_event(tx, record.id)?;
                    if ev.lease_until.is_some_and(|until| now < until) {
                        return Err(Error::new(
                        ErrorCode::OperationInProgress,
                        "a worker holds a live lease on the operation; resolve after it expires",
                    )
                    .into());
                    }
                    Ok((record, ev.fencing_token))
                },
            )
            .await?;
        let (tool, downstream) = self.tool(&record.scope.tool)?;
        let receipt = downstream
            .status(&record.status_ref)
            .await
            .map_err(|_| Error::unavailable("the downstream status query failed"))?;
        let checked = match (&receipt, r.outcome) {
            (Some(_), ResolveAs::Failed) => {
                return Err(Error::conflict(
                    "the downstream holds a receipt for this operation: it happened;                      resolve it as succeeded",
                )
                .into())
            }
            (None, ResolveAs::Succeeded) => {
                return Err(Error::new(
                    ErrorCode::OutcomeUnknown,
                    "the downstream holds no receipt: success cannot be recorded without one",
                )
                .into())
            }
            (Some(receipt), ResolveAs::Succeeded) => {
                Some(Self::check_receipt(tool.as_ref(), &record, receipt)?)
            }
            (None, ResolveAs::Failed) => None,
        };
        let identity = query_identity(&record.provider, &record.status_ref);
        self.write_at(move |_, tx, now| -> Result<Answer, RuntimeError> {
            let current = load_locked(tx, record.id)?;
            Self::resolvable(&current)?;
            let ev = outbox_event(tx, current.id)?;
            if ev.fencing_token != token {
                return Err(Error::new(
                    ErrorCode::OperationInProgress,
                    "a worker claimed the operation meanwhile; nothing was changed",
                )
                .into());
            }
            outbox::complete_by_reconciliation(tx, ev.id, token, now)?
                .map_err(RuntimeError::Fenced)?;
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
                    detail["evidence"] = json!("receipt");
                    detail["receipt_id"] = json!(receipt_id);
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

    /// Only `outcome_unknown` and `dead` operations can be resolved.
    pub(super) fn resolvable(record: &DeferredRecord) -> Result<(), RuntimeError> {
        match record.state {
            OperationState::OutcomeUnknown | OperationState::Dead => Ok(()),
            OperationState::Accepted | OperationState::Processing => Err(Error::new(
                ErrorCode::OperationInProgress,
                format!(
                    "the operation is {}: only outcome_unknown or dead operations can be resolved",
                    record.state.as_str()
                ),
            )
            .into()),
            state => Err(Error::invalid(format!(
                "the operation is {}: only outcome_unknown or dead operations can be resolved",
                state.as_str()
            ))
            .into()),
        }
    }
}
