//! Explicit status queries in their secure order, and reconciliation of a downstream
//! receipt they find (transaction C, `receipt_reconciled`); operator inspection.

use super::*;

impl Runtime {
    /// An explicit status query in the secure order: current principal → registry and
    /// input schema → current resource authorization → purpose-bound query identity →
    /// status ref within the caller's scope → recomputed request digest → key, revisions and
    /// provider path → (if unfinished) downstream receipt + output contract → transaction C
    /// (`receipt_reconciled`). Every refusal before the scope match is the same `not_found`.
    pub async fn status(&self, query: &StatusQuery) -> Result<Answer, RuntimeError> {
        let this = self.clone();
        let q = query.clone();
        let record = self
            .store
            .read(move |tx: &mut dyn EffectTx| {
                snapshot(tx, |tx| {
                    let Some(principal) = resolve(tx, &q.principal)? else {
                        return Err(Error::not_found().into());
                    };
                    let (tool, _) = this.tool(&q.tool)?;
                    let p =
                        this.prepare(&principal, &q.tool, &q.key, &q.arguments, &q.provider, None)?;
                    tool.check_access(tx, &principal, &p.arguments)
                        .map_err(hide_refusal)?;
                    check_id("status_ref", &q.status_ref, 128).map_err(|_| Error::not_found())?;
                    let record = match load_status_ref(tx, &q.status_ref)? {
                        Loaded::Deferred(r) => *r,
                        _ => return Err(Error::not_found().into()),
                    };
                    if record.scope.tenant != principal.tenant
                        || record.scope.subject != principal.subject
                        || record.scope.tool != q.tool
                    {
                        return Err(Error::not_found().into());
                    }
                    if record.scope.key != p.scope.key {
                        return Err(Error::conflict(
                            "the status reference belongs to another idempotency key",
                        )
                        .into());
                    }
                    Self::compare(&record, &p)?;
                    Ok(record)
                })
            })
            .await?;
        if matches!(
            record.state,
            OperationState::Succeeded | OperationState::Failed
        ) {
            return Self::answer_existing(&record);
        }
        let (tool, downstream) = self.tool(&record.scope.tool)?;
        let request = downstream_request(&record);
        let receipt = match downstream.status_of(&record.status_ref, &request).await {
            Ok(Some(r)) => r,
            Ok(None) => {
                return Ok(Answer::Unknown {
                    status_ref: record.status_ref,
                    state: record.state,
                })
            }
            Err(_) => return Err(Error::unavailable("the downstream status query failed").into()),
        };
        let (result, receipt_id) = Self::check_receipt(tool.as_ref(), &record, &receipt)?;
        let identity = query_identity(&query.provider, &record.status_ref);
        self.write_at(move |_, tx, now| -> Result<Answer, RuntimeError> {
            let current = load_locked(tx, record.id)?;
            if current.state == OperationState::Succeeded {
                // Reconciled meanwhile (worker or another query): replay.
                return Self::answer_existing(&current);
            }
            let ev = outbox_event(tx, record.id)?;
            outbox::complete_by_reconciliation(tx, ev.id, ev.fencing_token, now)?;
            Self::write_reconciled(tx, &current, &identity, &receipt, &receipt_id, &result, now)?;
            Ok(Answer::Done {
                status_ref: current.status_ref,
                state: OperationState::Succeeded,
                delivery: Delivery::ReceiptReconciled,
                result: result.clone(),
            })
        })
        .await
    }

    /// Reads the deferred operation with this status ref (operators; no authorization).
    pub async fn inspect(&self, status_ref: &str) -> Result<Option<DeferredRecord>, RuntimeError> {
        let status_ref = status_ref.to_string();
        self.store
            .read(
                move |tx: &mut dyn EffectTx| match load_status_ref(tx, &status_ref)? {
                    Loaded::Deferred(r) => Ok(Some(*r)),
                    _ => Ok(None),
                },
            )
            .await
    }

    /// The outbox event of the deferred operation with this status ref (operators and the
    /// proxy; no authorization): whether it was ever claimed and whether a lease is live.
    pub async fn event_of(
        &self,
        status_ref: &str,
    ) -> Result<Option<outbox::OutboxEvent>, RuntimeError> {
        let status_ref = status_ref.to_string();
        self.store
            .read(
                move |tx: &mut dyn EffectTx| match load_status_ref(tx, &status_ref)? {
                    Loaded::Deferred(r) => Ok(outbox::for_operation(tx, r.id)?),
                    _ => Ok(None),
                },
            )
            .await
    }
}
