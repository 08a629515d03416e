//! Closing an operation: the receipt checks (generic bindings and the tool's output
//! contract), the local receipt and call-binding digest, and transaction C (`succeeded`) or
//! the closing transaction of a definitive refusal (`failed`), both fenced by the lease.

use super::*;
use crate::ledger;

impl Runtime {
    /// Checks a downstream receipt against the record (generic bindings) and the tool's
    /// output contract. Returns the tool result and the receipt id.
    pub(super) fn check_receipt(
        tool: &dyn DeferredTool,
        record: &DeferredRecord,
        receipt: &Value,
    ) -> Result<(Value, String), RuntimeError> {
        let bad = |what: &str| -> RuntimeError {
            Error::new(
                ErrorCode::OutcomeUnknown,
                format!("the downstream receipt does not bind this operation: {what}"),
            )
            .into()
        };
        let request = downstream_request(record);
        let request_text = json::canonical_string(&request)
            .map_err(|_| contract_violation("request not canonical"))?;
        let field = |k: &str| receipt.get(k).and_then(Value::as_str);
        let receipt_id = field("receipt_id")
            .ok_or_else(|| bad("receipt id"))?
            .to_string();
        check_id("receipt id", &receipt_id, 128).map_err(|_| bad("receipt id"))?;
        if field("status_ref") != Some(record.status_ref.as_str()) {
            return Err(bad("status ref"));
        }
        if field("scope_digest") != Some(record.downstream_key.as_str()) {
            return Err(bad("scope"));
        }
        if field("request_sha256") != Some(digest::sha256_hex(request_text.as_bytes()).as_str()) {
            return Err(bad("request digest"));
        }
        if receipt.get("request") != Some(&request) {
            return Err(bad("request"));
        }
        let result = tool
            .accept_receipt(&record.arguments, receipt)
            .map_err(|e| bad(&e.message))?;
        json::canonical_string(&result).map_err(|_| bad("result is not canonical"))?;
        Ok((result, receipt_id))
    }

    pub(super) fn binding_digest(
        record: &DeferredRecord,
        provider: &ProviderContext,
        result_digest: &str,
        receipt_id: &str,
    ) -> Result<String, RuntimeError> {
        let request = downstream_request(record);
        let request_text = json::canonical_string(&request)
            .map_err(|_| contract_violation("request not canonical"))?;
        digest::call_binding_digest(&CallBinding {
            provider: provider.provider.clone(),
            api_family: provider.api_family.clone(),
            adapter_rev: provider.adapter_revision.clone(),
            turn_id: Some(provider.turn_id.clone()),
            call_id: provider.call_id.clone(),
            response_id: Some(provider.response_id.clone()),
            operation_id: record.id.to_string(),
            idempotency_key: record.scope.key.clone(),
            contract: record.contract.clone(),
            request_digest: record.request_digest.clone(),
            result_digest: Some(result_digest.to_string()),
            downstream_request_ref: Some(digest::sha256_hex(request_text.as_bytes())),
            downstream_receipt_ref: Some(receipt_id.to_string()),
            downstream_status_ref: Some(record.status_ref.clone()),
        })
        .map_err(|_| contract_violation("call binding is not canonical"))
    }

    /// Writes the local receipt and the `succeeded` result (part of transaction C).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_success(
        tx: &mut dyn EffectTx,
        record: &DeferredRecord,
        provider: &ProviderContext,
        receipt: &Value,
        receipt_id: &str,
        result: &Value,
        via: (&str, Option<i64>, Option<&str>),
        now: i64,
    ) -> Result<(), RuntimeError> {
        let prepared = Self::prepare_success(record, provider, receipt, receipt_id, result)?;
        Self::write_prepared(tx, record.id, &prepared, via, now)
    }

    /// Everything transaction C writes that does not depend on the database: the canonical
    /// texts and digests of the receipt and the result, and the call-binding digest. Pure, so a
    /// worker computes it before its job reaches the store's writer.
    fn prepare_success(
        record: &DeferredRecord,
        provider: &ProviderContext,
        receipt: &Value,
        receipt_id: &str,
        result: &Value,
    ) -> Result<PreparedSuccess, RuntimeError> {
        let (result_text, result_digest) = encode_result(result)?;
        let receipt_text = json::canonical_string(receipt)
            .map_err(|_| contract_violation("receipt not canonical"))?;
        let binding = Self::binding_digest(record, provider, &result_digest, receipt_id)?;
        Ok(PreparedSuccess {
            receipt_id: receipt_id.to_string(),
            receipt_digest: digest::sha256_hex(receipt_text.as_bytes()),
            receipt_text,
            binding,
            result_text,
            result_digest,
        })
    }

    /// The writes of [`Runtime::write_success`], from a [`PreparedSuccess`].
    fn write_prepared(
        tx: &mut dyn EffectTx,
        operation_id: i64,
        prepared: &PreparedSuccess,
        via: (&str, Option<i64>, Option<&str>),
        now: i64,
    ) -> Result<(), RuntimeError> {
        tx.execute_unanswered(
            "INSERT INTO local_receipts (operation_id, receipt_id, receipt, receipt_digest,
                 call_binding_digest, reconciled_via, fencing_token, query_identity, reconciled_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            &[
                operation_id.into(),
                prepared.receipt_id.as_str().into(),
                prepared.receipt_text.as_str().into(),
                prepared.receipt_digest.as_str().into(),
                prepared.binding.as_str().into(),
                via.0.into(),
                via.1.into(),
                via.2.into(),
                now.into(),
            ],
        )
        .map_err(|e| stored(tx, e))?;
        Self::settle_row(
            tx,
            operation_id,
            OperationState::Succeeded,
            &prepared.result_text,
            &prepared.result_digest,
            now,
        )?;
        insert_event(
            tx,
            operation_id,
            now,
            "receipt_reconciled",
            &json!({"receipt_id": prepared.receipt_id, "via": via.0}),
        )
    }

    /// The start of a worker's closing transaction: the operation's lock, the outbox event
    /// closed under the lease's fencing token, and the operation read back.
    fn close_claimed(
        tx: &mut dyn EffectTx,
        lease: &Lease,
        now: i64,
    ) -> Result<DeferredRecord, RuntimeError> {
        lock_operation(tx, lease.operation_id)?;
        outbox::complete(tx, lease, now)?;
        load_id(tx, lease.operation_id)
    }

    /// Writes a receipt a status query (or an operator's resolution) found: the local receipt
    /// under the query's purpose-bound `identity` and the `succeeded` result.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_reconciled(
        tx: &mut dyn EffectTx,
        record: &DeferredRecord,
        identity: &str,
        receipt: &Value,
        receipt_id: &str,
        result: &Value,
        now: i64,
    ) -> Result<(), RuntimeError> {
        let provider = ProviderContext {
            call_id: identity.to_string(),
            response_id: identity.to_string(),
            ..record.provider.clone()
        };
        Self::write_success(
            tx,
            record,
            &provider,
            receipt,
            receipt_id,
            result,
            ("status_query", None, Some(identity)),
            now,
        )
    }

    /// Transaction C for a worker holding `lease`: local receipt + operation `succeeded` +
    /// event `delivered`, conditional on the fencing token. A stale lease gets
    /// [`RuntimeError::Fenced`] and nothing changes.
    pub async fn complete(&self, lease: &Lease, receipt: Value) -> Result<Answer, RuntimeError> {
        let answer = self.complete_unlogged(lease, receipt).await;
        Self::log_completed(lease, answer)
    }

    /// Transaction C for a worker holding `lease` whose receipt was already checked against
    /// `record` (read by the worker's preflight): everything that needs no database (canonical
    /// texts, digests) is computed here, so the job the store's writer runs holds only the
    /// fenced writes. The operation's identity fields never change after acceptance, and the
    /// fenced outbox update and the conditional settle refuse a record that moved on.
    pub(super) async fn complete_checked(
        &self,
        lease: &Lease,
        record: &DeferredRecord,
        receipt: &Value,
        checked: (Value, String),
    ) -> Result<Answer, RuntimeError> {
        let (result, receipt_id) = checked;
        let answer = async {
            let prepared =
                Self::prepare_success(record, &record.provider, receipt, &receipt_id, &result)?;
            let held = lease.clone();
            self.write_at(move |_, tx, now| -> Result<(), RuntimeError> {
                lock_operation(tx, held.operation_id)?;
                outbox::complete(tx, &held, now)?;
                Self::write_prepared(
                    tx,
                    held.operation_id,
                    &prepared,
                    ("worker", Some(held.token), None),
                    now,
                )
            })
            .await?;
            Ok(Answer::Done {
                status_ref: record.status_ref.clone(),
                state: OperationState::Succeeded,
                delivery: Delivery::Fresh,
                result,
            })
        }
        .await;
        Self::log_completed(lease, answer)
    }

    /// Counts and logs the end of transaction C.
    fn log_completed(
        lease: &Lease,
        answer: Result<Answer, RuntimeError>,
    ) -> Result<Answer, RuntimeError> {
        count_fenced("complete", &answer);
        // The settle step of whoever holds the lease (a worker, the proxy's forward, a
        // server's or `dispatch`'s own delivery): `owner` says which.
        match &answer {
            Ok(_) => tracing::info!(
                target: "toolledger::delivery", event_id = lease.event_id,
                operation = lease.operation_id, fencing_token = lease.token,
                owner = %lease.owner, "succeeded: the downstream's receipt is recorded"),
            Err(e) => tracing::warn!(
                target: "toolledger::delivery", event_id = lease.event_id,
                operation = lease.operation_id, owner = %lease.owner, error = %e,
                "the receipt could not be recorded"),
        }
        answer
    }

    async fn complete_unlogged(
        &self,
        lease: &Lease,
        receipt: Value,
    ) -> Result<Answer, RuntimeError> {
        let lease = lease.clone();
        self.write_at(move |this, tx, now| -> Result<Answer, RuntimeError> {
            let record = Self::close_claimed(tx, &lease, now)?;
            let (tool, _) = this.tool(&record.scope.tool)?;
            let (result, receipt_id) = Self::check_receipt(tool.as_ref(), &record, &receipt)?;
            Self::write_success(
                tx,
                &record,
                &record.provider,
                &receipt,
                &receipt_id,
                &result,
                ("worker", Some(lease.token), None),
                now,
            )?;
            Ok(Answer::Done {
                status_ref: record.status_ref,
                state: OperationState::Succeeded,
                delivery: Delivery::Fresh,
                result,
            })
        })
        .await
    }

    /// Writes the `failed` result of a definitive refusal (part of the closing transaction).
    pub(super) fn write_failure(
        tx: &mut dyn EffectTx,
        record: &DeferredRecord,
        result: &Value,
        detail: &Value,
        now: i64,
    ) -> Result<(), RuntimeError> {
        let (result_text, result_digest) = encode_result(result)?;
        Self::settle_row(
            tx,
            record.id,
            OperationState::Failed,
            &result_text,
            &result_digest,
            now,
        )?;
        insert_event(tx, record.id, now, "failed", detail)
    }

    /// Moves an unfinished deferred operation to its terminal `state` with its canonical
    /// result; a row that already left the unfinished states is a storage-contract violation.
    pub(super) fn settle_row(
        tx: &mut dyn EffectTx,
        operation_id: i64,
        state: OperationState,
        result_text: &str,
        result_digest: &str,
        now: i64,
    ) -> Result<(), RuntimeError> {
        let n = ledger::settle(
            tx,
            operation_id,
            ledger::Unfinished::Deferred,
            state,
            result_text,
            result_digest,
            now,
        )
        .map_err(|e| stored(tx, e))?;
        if n != 1 {
            return Err(contract_violation("operation left the unfinished states"));
        }
        Ok(())
    }

    /// The closing transaction of a definitive downstream refusal, for a worker holding
    /// `lease`: event `delivered` (closed) + operation `failed` with `result` (`{code,
    /// message}`), conditional on the fencing token. A stale lease gets
    /// [`RuntimeError::Fenced`] and nothing changes.
    pub async fn fail(&self, lease: &Lease, result: Value) -> Result<Answer, RuntimeError> {
        let code = result["code"].as_str().unwrap_or("-").to_string();
        let answer = self.fail_unlogged(lease, result).await;
        count_fenced("fail", &answer);
        match &answer {
            Ok(_) => tracing::info!(
                target: "toolledger::delivery", event_id = lease.event_id,
                operation = lease.operation_id, owner = %lease.owner, code = %code,
                "failed: the downstream refused for good"),
            Err(e) => tracing::warn!(
                target: "toolledger::delivery", event_id = lease.event_id,
                operation = lease.operation_id, owner = %lease.owner, error = %e,
                "the refusal could not be recorded"),
        }
        answer
    }

    async fn fail_unlogged(&self, lease: &Lease, result: Value) -> Result<Answer, RuntimeError> {
        let lease = lease.clone();
        self.write_at(move |_, tx, now| -> Result<Answer, RuntimeError> {
            let record = Self::close_claimed(tx, &lease, now)?;
            Self::write_failure(
                tx,
                &record,
                &result,
                &json!({"code": result["code"], "fencing_token": lease.token,
                            "via": "worker"}),
                now,
            )?;
            Ok(Answer::Done {
                status_ref: record.status_ref,
                state: OperationState::Failed,
                delivery: Delivery::Fresh,
                result: result.clone(),
            })
        })
        .await
    }
}

/// The canonical text of a result to store, and its digest.
fn encode_result(result: &Value) -> Result<(String, String), RuntimeError> {
    ledger::encode_stored(result).ok_or_else(|| contract_violation("result not canonical"))
}

/// The database-free part of transaction C ([`Runtime::write_success`]).
struct PreparedSuccess {
    receipt_id: String,
    receipt_text: String,
    receipt_digest: String,
    binding: String,
    result_text: String,
    result_digest: String,
}
