//! Transaction A and `dispatch`: shape checks and the request digest, the read-only
//! examination of an existing scope (access before the ledger, then the item-by-item
//! comparison, the deadlines and the stored answer), the reservation of a new scope with its
//! approval, intent context and outbox event, and `dispatch`, which accepts and then works the
//! new intent at once.

use super::*;
use crate::ledger;

impl Runtime {
    /// Shape checks and digest: tool, provider profile, key, arguments.
    pub(super) fn prepare(
        &self,
        principal: &Principal,
        tool_name: &str,
        key: &str,
        arguments: &Value,
        provider: &ProviderContext,
        approval_id: Option<&str>,
    ) -> Result<Prepared, RuntimeError> {
        let (tool, _) = self.tool(tool_name)?;
        provider.check()?;
        if !self.registry.has_profile(&provider.profile()) {
            return Err(Error::invalid("unregistered provider profile").into());
        }
        check_id("idempotency key", key, 256)?;
        let contract = tool.contract();
        let arguments = tool.validate(arguments)?;
        let arguments_text = json::canonical_string(&arguments)
            .map_err(|e| Error::invalid(format!("arguments: {}", e.message)))?;
        let request_digest =
            digest::request_digest(&principal.tenant, &principal.subject, &contract, &arguments)
                .map_err(|e| Error::invalid(format!("arguments: {}", e.message)))?;
        if let Some(a) = approval_id {
            approval::check_approval_id(a)
                .map_err(|_| Error::new(ErrorCode::ApprovalInvalid, "approval is not valid"))?;
        }
        Ok(Prepared {
            scope: Scope {
                tenant: principal.tenant.clone(),
                subject: principal.subject.clone(),
                tool: contract.name.clone(),
                key: key.to_string(),
            },
            contract,
            arguments,
            arguments_text,
            request_digest,
            provider: provider.clone(),
            approval_id: approval_id.map(str::to_string),
        })
    }

    /// Compares every bound item of an authoritative row with a new request. Self-inconsistent
    /// rows are storage-contract errors; differences are `operation_conflict`.
    pub(super) fn compare(record: &DeferredRecord, p: &Prepared) -> Result<(), RuntimeError> {
        if record.scope != p.scope {
            return Err(contract_violation(
                "row does not belong to the scope it was read by",
            ));
        }
        let conflict = |what: &str| -> RuntimeError {
            Error::conflict(format!(
                "the idempotency key was used for a different {what}"
            ))
            .into()
        };
        if record.compacted_at.is_some() {
            // A tombstone keeps the request digest and the revisions, nothing else.
            if record.request_digest != p.request_digest {
                return Err(conflict("request"));
            }
            if record.contract != p.contract {
                return Err(conflict("contract revision"));
            }
            return Ok(());
        }
        let recomputed = digest::request_digest(
            &record.scope.tenant,
            &record.scope.subject,
            &record.contract,
            &record.arguments,
        )
        .map_err(|_| contract_violation("stored arguments are outside the canonical domain"))?;
        if recomputed != record.request_digest {
            return Err(contract_violation(
                "stored request digest does not match the stored intent",
            ));
        }
        if record.request_digest != p.request_digest || record.arguments_text != p.arguments_text {
            return Err(conflict("request"));
        }
        if record.contract != p.contract {
            return Err(conflict("contract revision"));
        }
        if record.provider.profile() != p.provider.profile() {
            return Err(conflict("provider, API family or adapter revision"));
        }
        if let (Some(given), Some(stored)) = (&p.approval_id, &record.approval) {
            if *given != stored.approval_id {
                return Err(conflict("approval"));
            }
        }
        Ok(())
    }

    /// Answer for an existing, matching row after re-authorization (`not_found` otherwise).
    pub(super) fn answer_existing(record: &DeferredRecord) -> Result<Answer, RuntimeError> {
        if record.compacted_at.is_some() {
            return Err(Error::new(
                ErrorCode::OperationRetentionExpired,
                format!(
                    "the operation {} and its result was removed after its retention deadline",
                    record.state
                ),
            )
            .into());
        }
        match record.state {
            OperationState::Succeeded | OperationState::Failed => Ok(Answer::Done {
                status_ref: record.status_ref.clone(),
                state: record.state,
                delivery: Delivery::LocalReplay,
                result: record
                    .result
                    .clone()
                    .ok_or_else(|| contract_violation("finished operation without result"))?,
            }),
            state => Ok(Answer::Unknown {
                status_ref: record.status_ref.clone(),
                state,
            }),
        }
    }

    /// Reads the scope in one snapshot: authenticate, shape, digest, scope lookup and compare,
    /// and for an existing row the current access check.
    pub(super) async fn examine(
        &self,
        call: &DeferredCall,
    ) -> Result<(Prepared, Option<Answer>), RuntimeError> {
        let this = self.clone();
        let call = call.clone();
        self.store
            .read(move |tx: &mut dyn EffectTx| {
                snapshot(tx, |tx| {
                    let Some(principal) = resolve(tx, &call.principal)? else {
                        return Err(Error::denied("unknown or inactive principal").into());
                    };
                    let p = this.prepare(
                        &principal,
                        &call.tool,
                        &call.key,
                        &call.arguments,
                        &call.provider,
                        call.approval_id.as_deref(),
                    )?;
                    if [
                        &p.provider.turn_id,
                        &p.provider.call_id,
                        &p.provider.response_id,
                    ]
                    .iter()
                    .any(|id| id.starts_with(QUERY_IDENTITY_PREFIX))
                    {
                        return Err(Error::invalid(
                            "a status query identity cannot be used to dispatch",
                        )
                        .into());
                    }
                    // Current resource authorization before the ledger is consulted, so a
                    // stored result or a conflict never tells a caller more than `not_found`.
                    let (tool, _) = this.tool(&p.scope.tool)?;
                    tool.check_access(tx, &principal, &p.arguments)
                        .map_err(hide_refusal)?;
                    match load_scope(tx, &p.scope)? {
                        Loaded::Absent => {
                            if let (Some(window), false) = (this.replan_window, call.new_intent) {
                                let since = this.clock.now().saturating_sub(window);
                                if let Some(earlier) =
                                    ledger::unsettled_twin(tx, &p.scope, &p.request_digest, since)?
                                {
                                    return Err(Error::possible_duplicate(earlier).into());
                                }
                            }
                            Ok((p, None))
                        }
                        Loaded::NotDeferred => Err(Error::conflict(
                            "the idempotency key was used for a different effect",
                        )
                        .into()),
                        Loaded::Deferred(record) => {
                            Self::compare(&record, &p)?;
                            ledger::check_deadlines(
                                record.authority_deadline,
                                record.retention_deadline,
                                this.clock.now(),
                            )?;
                            let answer = Self::answer_existing(&record)?;
                            Ok((p, Some(answer)))
                        }
                    }
                })
            })
            .await
    }

    /// Transaction A: re-resolve the principal, re-run the tool's checks, reserve the scope,
    /// compare the authoritative row, and for a new intent consume the approval and write the
    /// intent context and the outbox event. All or nothing.
    pub async fn accept(&self, call: &DeferredCall) -> Result<Accepted, RuntimeError> {
        let (prepared, existing) = self.examine(call).await?;
        if let Some(answer) = existing {
            return self.existing_accepted(&prepared, answer).await;
        }
        self.write_intent(call.principal.clone(), prepared, true)
            .await
    }

    pub(super) async fn existing_accepted(
        &self,
        prepared: &Prepared,
        answer: Answer,
    ) -> Result<Accepted, RuntimeError> {
        let scope = prepared.scope.clone();
        let record = self
            .store
            .read(move |tx: &mut dyn EffectTx| match load_scope(tx, &scope)? {
                Loaded::Deferred(r) => Ok(*r),
                _ => Err(contract_violation("operation vanished")),
            })
            .await?;
        let state = match &answer {
            Answer::Done { state, .. } | Answer::Unknown { state, .. } => *state,
        };
        Ok(Accepted::Existing {
            operation_id: record.id,
            status_ref: answer.status_ref().to_string(),
            state,
        })
    }

    /// Transaction A: records the intent of `p` and its outbox event. `flush`: whether the
    /// commit waits for the disk before answering; `false` only for a caller that claims the
    /// event next, whose flushed claim carries the intent to the disk before anything is
    /// sent or anyone is told.
    pub(super) async fn write_intent(
        &self,
        principal_name: String,
        p: Prepared,
        flush: bool,
    ) -> Result<Accepted, RuntimeError> {
        let status_ref = ledger::new_status_ref()?;
        self.write_flushed_or_not(
            flush,
            move |this, tx, now| -> Result<Accepted, RuntimeError> {
                check_now(now)?;
                let (authority_deadline, retention_deadline) = this.deadlines.at(now)?;
                // A lease taken right after acceptance must end inside the portable range.
                outbox::lease_until(now, this.config.lease_seconds).map_err(|_| {
                    Error::invalid("a lease would end outside the portable time range")
                })?;
                // The same resolver, re-read inside the reservation transaction.
                let Some(principal) = resolve(tx, &principal_name)? else {
                    return Err(Error::denied("unknown or inactive principal").into());
                };
                if principal.tenant != p.scope.tenant || principal.subject != p.scope.subject {
                    return Err(Error::denied("the principal changed during the call").into());
                }
                let (tool, _) = this.tool(&p.scope.tool)?;
                tool.check(tx, &principal, &p.arguments)?;
                let row = ledger::NewRow {
                    tenant: &p.scope.tenant,
                    subject: &p.scope.subject,
                    key: &p.scope.key,
                    contract: &p.contract,
                    request_digest: &p.request_digest,
                    arguments_text: &p.arguments_text,
                    fingerprint: None,
                    status_ref: &status_ref,
                    authority_deadline,
                    retention_deadline,
                    now,
                };
                let inserted = ledger::insert_open(tx, &row, "deferred", OperationState::Accepted)
                    .map_err(|e| stored(tx, e))?;
                let Some(operation_id) = inserted else {
                    // Someone else holds the key: read the authoritative row back and compare
                    // every bound item.
                    let record = match load_scope(tx, &p.scope)? {
                        Loaded::Deferred(r) => *r,
                        Loaded::NotDeferred => {
                            return Err(Error::conflict(
                                "the idempotency key was used for a different effect",
                            )
                            .into())
                        }
                        Loaded::Absent => {
                            return Err(contract_violation("reserved row is missing"))
                        }
                    };
                    Self::compare(&record, &p)?;
                    return Ok(Accepted::Existing {
                        operation_id: record.id,
                        status_ref: record.status_ref,
                        state: record.state,
                    });
                };
                // The row is the one just inserted from `p`: nothing to read back.
                let approval = if tool.requires_approval() {
                    let target =
                        approval_target(&p.scope, &p.contract, &p.request_digest, &p.provider);
                    Some(approval::consume(
                        tx,
                        p.approval_id.as_deref(),
                        &target,
                        now,
                        Some(operation_id),
                        &mut |tx, name| authz::resolve_in(tx, name),
                    )?)
                } else {
                    None
                };
                tx.execute_unanswered(
                    "INSERT INTO deferred_intents (operation_id, provider, api_family,
                         adapter_revision, turn_id, call_id, response_id, downstream_key,
                         approval_id, approver, approval_digest, approved_at,
                         approval_expires_at, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
                    &[
                        operation_id.into(),
                        p.provider.provider.as_str().into(),
                        p.provider.api_family.as_str().into(),
                        p.provider.adapter_revision.as_str().into(),
                        p.provider.turn_id.as_str().into(),
                        p.provider.call_id.as_str().into(),
                        p.provider.response_id.as_str().into(),
                        scope_digest(&p.scope).into(),
                        approval.as_ref().map(|a| a.approval_id.clone()).into(),
                        approval.as_ref().map(|a| a.approver.clone()).into(),
                        approval.as_ref().map(|a| a.binding_digest.clone()).into(),
                        approval.as_ref().map(|a| a.approved_at).into(),
                        approval.as_ref().map(|a| a.expires_at).into(),
                        now.into(),
                    ],
                )
                .map_err(|e| stored(tx, e))?;
                let event_id = outbox::enqueue(tx, operation_id, now, this.config.max_attempts)?;
                insert_event(
                    tx,
                    operation_id,
                    now,
                    "intent_accepted",
                    &json!({"event_id": event_id}),
                )?;
                Ok(Accepted::New {
                    operation_id,
                    event_id,
                    status_ref: status_ref.clone(),
                })
            },
        )
        .await
    }

    /// `dispatch`: a new intent is accepted (transaction A) and processed at once by
    /// this caller acting as a worker; an existing finished one is replayed (`local_replay`,
    /// after current re-authorization); an existing unfinished one answers `outcome_unknown`
    /// with its status ref and nothing else happens. `failure` stops the fresh path at a crash
    /// point as if the process died there.
    pub async fn dispatch(
        &self,
        call: &DeferredCall,
        failure: Option<CrashPoint>,
    ) -> Result<Answer, RuntimeError> {
        let (prepared, existing) = self.examine(call).await?;
        if let Some(answer) = existing {
            return Ok(answer);
        }
        // The intent's commit does not wait for the disk: this caller claims its event next,
        // and the claim's commit, flushed before anything is sent, carries the intent with
        // it. Until then nobody has been told of it: a crash of the machine that undoes it
        // undoes a call nothing was sent for and nobody was answered on.
        match self
            .write_intent(call.principal.clone(), prepared, false)
            .await?
        {
            Accepted::Existing { .. } => {
                // Someone else accepted the same intent first: observe only.
                let (_, existing) = self.examine(call).await?;
                existing.ok_or_else(|| contract_violation("accepted operation vanished"))
            }
            Accepted::New {
                event_id,
                status_ref,
                ..
            } => {
                if self.point(CrashPoint::AfterIntentCommit, failure).await {
                    return Ok(Answer::Unknown {
                        status_ref,
                        state: OperationState::Accepted,
                    });
                }
                let owner = format!("{}-{}", self.forwarder, std::process::id());
                match self.process(event_id, &owner, failure).await? {
                    Processed::Delivered(a) | Processed::Unknown(a) => Ok(a),
                    Processed::NotClaimed(_) => Ok(Answer::Unknown {
                        status_ref,
                        state: OperationState::Accepted,
                    }),
                }
            }
        }
    }
}
