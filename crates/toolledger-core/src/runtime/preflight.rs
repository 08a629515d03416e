//! The worker's checks before any downstream call: the authority deadline, the current
//! contract and request digest, the principal, the tool's checks, and the durable approval.

use super::*;
use crate::ledger;

impl Runtime {
    /// The worker's checks before any downstream effect, in one read snapshot.
    pub(super) async fn preflight(&self, lease: &Lease) -> Result<DeferredRecord, RuntimeError> {
        let this = self.clone();
        let operation_id = lease.operation_id;
        self.store
            .read(move |tx: &mut dyn EffectTx| {
                snapshot(tx, |tx| {
                    Self::checks(tx, operation_id, &this.clock, &this.registry)
                })
            })
            .await
    }

    /// The checks of [`Runtime::preflight`] in `tx`, which a claim's own transaction runs
    /// too (see [`Runtime::claim_checked`]).
    pub(super) fn checks(
        tx: &mut dyn EffectTx,
        operation_id: i64,
        clock: &SharedClock,
        registry: &Registry,
    ) -> Result<DeferredRecord, RuntimeError> {
        let record = load_id(tx, operation_id)?;
        // No downstream call after the authority deadline (retention is only
        // about replays).
        ledger::check_deadlines(record.authority_deadline, None, clock.now())?;
        let Some(tool) = registry.tool(&record.scope.tool).cloned() else {
            return Err(
                Error::new(ErrorCode::ContractDrift, "tool is no longer registered").into(),
            );
        };
        let current = tool.contract();
        if current != record.contract {
            return Err(Error::new(
                ErrorCode::ContractDrift,
                "the tool contract changed since the intent was accepted",
            )
            .into());
        }
        let validated = tool.validate(&record.arguments).map_err(|_| {
            Error::new(
                ErrorCode::ContractDrift,
                "stored arguments fail the input schema",
            )
        })?;
        let recomputed = digest::request_digest(
            &record.scope.tenant,
            &record.scope.subject,
            &current,
            &validated,
        )
        .map_err(|_| contract_violation("stored arguments are not canonical"))?;
        if recomputed != record.request_digest || validated != record.arguments {
            return Err(Error::new(
                ErrorCode::ContractDrift,
                "the request digest does not match the accepted intent",
            )
            .into());
        }
        let Some(principal) = resolve(tx, &record.scope.subject)? else {
            return Err(Error::denied("the principal is no longer active").into());
        };
        if principal.tenant != record.scope.tenant {
            return Err(Error::denied("the principal moved to another tenant").into());
        }
        tool.check(tx, &principal, &record.arguments)?;
        Self::verify_durable_approval(tx, &record, tool.requires_approval())?;
        Ok(record)
    }

    /// Recomputes the approval digest from the durable identities and compares it with the
    /// intent row and the approval row.
    pub(super) fn verify_durable_approval(
        tx: &mut dyn EffectTx,
        record: &DeferredRecord,
        required: bool,
    ) -> Result<(), RuntimeError> {
        let invalid = || -> RuntimeError {
            Error::new(
                ErrorCode::ApprovalInvalid,
                "the stored approval no longer matches the accepted intent",
            )
            .into()
        };
        let Some(stored) = &record.approval else {
            if required {
                return Err(
                    Error::new(ErrorCode::ApprovalRequired, "the intent has no approval").into(),
                );
            }
            return Ok(());
        };
        let target = approval_target(
            &record.scope,
            &record.contract,
            &record.request_digest,
            &record.provider,
        );
        let digest = target.digest()?;
        if digest != stored.approval_digest || stored.approved_at >= stored.expires_at {
            return Err(invalid());
        }
        let row = approval::load(tx, &stored.approval_id)
            .map_err(|_| invalid())?
            .ok_or_else(invalid)?;
        if row.binding_digest != digest
            || row.target.digest()? != digest
            || row.approver != stored.approver
            || row.approved_at != stored.approved_at
            || row.expires_at != stored.expires_at
            || row.consumed_operation != Some(record.id)
        {
            return Err(invalid());
        }
        Ok(())
    }
}
