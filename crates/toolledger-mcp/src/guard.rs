//! The guard: runs a tool's effect under the ledger so a retry replays and never repeats.
//!
//! A guarded call is identified by its operation id (the idempotency key) and bound to the
//! current principal. [`Guard`] computes the request's keyed fingerprint (including
//! the continuation state and input responses), fixes the operation's deadlines, and hands the
//! effect to the [`Engine`], which looks up the scope (same id + different fingerprint or intent
//! → `operation_conflict`, before any deadline), checks deadlines (authority before retention)
//! and the state, and either replays the stored result or commits the effect together with the
//! ledger row.
//!
//! Multi-round tools (MCP 2026-07-28 `input_required`) call [`Guard::first_round`] to obtain a
//! sealed `requestState` and [`Guard::resume`] to verify it on the continuation; the token binds
//! the round to this caller, tool, operation id and first-round arguments, but the ledger is
//! what makes the effect single.

use std::sync::Arc;

use rmcp::model::{InputRequest, InputRequests, InputRequiredResult};
use serde_json::{json, Map, Value};
use toolledger::clock::SharedClock;
use toolledger::digest::{fingerprint, sha256_hex, FingerprintInput, FingerprintKey};
use toolledger::engine::{Begun, Engine, InlineCall, InlineEffect, Outcome};
use toolledger::model::{Error, ErrorCode, ToolContract};

use crate::caller::Caller;
use crate::keys::KeyMaterial;
use crate::state::{StateBinding, StateSealer};

/// Deadlines and namespace rules for guarded operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardConfig {
    /// Seconds after the first round (or a single-round call) during which the operation may
    /// write, including exact replays.
    pub authority_ttl: i64,
    /// Seconds after the first round during which a stored result is replayed.
    pub retention_ttl: i64,
    /// Seconds a sealed `requestState` stays valid.
    pub request_state_ttl: i64,
    /// Whether operation ids share one namespace across principals: another principal's use
    /// of an id is `operation_conflict` (off by default: each principal's ids are its own,
    /// and another principal's call under the same id is its own operation).
    pub shared_key_namespace: bool,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            authority_ttl: 24 * 3600,
            retention_ttl: 7 * 24 * 3600,
            request_state_ttl: 3600,
            shared_key_namespace: false,
        }
    }
}

/// What a guarded call is about: who, which tool, which operation, which wire arguments.
#[derive(Clone, Copy, Debug)]
pub struct GuardedRequest<'a> {
    /// The resolved caller.
    pub caller: &'a Caller,
    /// The tool contract (its name is the MCP tool name).
    pub contract: &'a ToolContract,
    /// The operation id (idempotency key) taken from the arguments.
    pub operation_id: &'a str,
    /// The tool's wire arguments, fingerprinted as sent.
    pub arguments: &'a Map<String, Value>,
}

/// A verified continuation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resumed {
    /// The opened binding.
    pub binding: StateBinding,
    /// The fingerprint of the whole logical request (arguments, state, input responses).
    pub fingerprint: String,
}

/// Runs effects under the ledger. Cheap to clone.
#[derive(Clone)]
pub struct Guard {
    engine: Engine,
    sealer: StateSealer,
    fingerprint_key: FingerprintKey,
    config: GuardConfig,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("engine", &self.engine)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn internal(e: impl std::fmt::Display) -> Error {
    Error::invalid(format!(
        "arguments are outside the canonical JSON domain: {e}"
    ))
}

/// Hex SHA-256 of the canonical form of `arguments`.
pub fn arguments_digest(arguments: &Map<String, Value>) -> Result<String, Error> {
    let text =
        toolledger::json::canonical_string(&Value::Object(arguments.clone())).map_err(internal)?;
    Ok(sha256_hex(text.as_bytes()))
}

impl Guard {
    /// A guard over `engine` with `keys` and `config`.
    pub fn new(engine: Engine, keys: &KeyMaterial, config: GuardConfig) -> Result<Self, Error> {
        let sealer = StateSealer::new(&keys.state_keys, config.request_state_ttl)?;
        let fingerprint_key = FingerprintKey::from_bytes(&keys.fingerprint_key)
            .map_err(|_| Error::unavailable("the fingerprint key is invalid"))?;
        Ok(Guard {
            engine,
            sealer,
            fingerprint_key,
            config,
        })
    }

    /// The sealer of continuation tokens (`requestState`).
    pub fn sealer(&self) -> &StateSealer {
        &self.sealer
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The clock deadlines are measured with.
    pub fn clock(&self) -> &SharedClock {
        self.engine.clock()
    }

    /// The configuration.
    pub fn config(&self) -> &GuardConfig {
        &self.config
    }

    /// The backend id of the ledger.
    pub fn backend_id(&self) -> &str {
        self.engine.store().backend_id()
    }

    /// The keyed fingerprint of one logical request: caller, tool and input revision,
    /// arguments, continuation state and input responses.
    pub fn fingerprint(
        &self,
        request: &GuardedRequest<'_>,
        continuation_state: Option<Value>,
        input_responses: Option<Value>,
    ) -> Result<String, Error> {
        let input = FingerprintInput {
            principal: request.caller.name.clone(),
            tool_id: request.contract.name.clone(),
            tool_version: request.contract.input_rev.clone(),
            arguments: Value::Object(request.arguments.clone()),
            continuation_state,
            input_responses,
        };
        fingerprint(&self.fingerprint_key, &input).map_err(|e| Error::invalid(e.message))
    }

    fn inline_call(
        &self,
        request: &GuardedRequest<'_>,
        intent: Value,
        fingerprint: String,
        authority_deadline: i64,
        retention_deadline: i64,
    ) -> InlineCall {
        InlineCall {
            principal: request.caller.principal.clone(),
            contract: request.contract.clone(),
            key: request.operation_id.to_string(),
            arguments: intent,
            fingerprint: Some(fingerprint),
            authority_deadline: Some(authority_deadline),
            retention_deadline: Some(retention_deadline),
            shared_key_namespace: self.config.shared_key_namespace,
        }
    }

    /// A single-round guarded call: `intent` is the business intent (digested into the request
    /// digest), `effect` runs at most once per operation id.
    pub async fn run(
        &self,
        request: &GuardedRequest<'_>,
        intent: Value,
        effect: Arc<dyn InlineEffect>,
    ) -> Result<Outcome, Error> {
        let fp = self.fingerprint(request, None, None)?;
        let now = self.clock().now();
        let call = self.inline_call(
            request,
            intent,
            fp,
            now.saturating_add(self.config.authority_ttl),
            now.saturating_add(self.config.retention_ttl),
        );
        self.engine.execute_inline(call, effect).await
    }

    /// What a first round answers when the caller's scope already holds this operation, so a
    /// client that lost its `requestState` (or its reply) and starts over recovers: `Ok(None)`
    /// when the scope is free (ask for the input); otherwise the stored result with
    /// `replayed: true`, or the deadline, `outcome_unknown` or `operation_in_progress` answer a
    /// replay would get. `known` is the business intent the first round fixes and `answered`
    /// the names of the intent's fields its answers fill in: the stored intent without those
    /// fields must equal `known` exactly, else the key was used for another request
    /// (`operation_conflict`). Tools keep to this by building the continuation's intent as
    /// `known` plus one field per answered input.
    pub async fn replay_for_first_round(
        &self,
        request: &GuardedRequest<'_>,
        known: &Map<String, Value>,
        answered: &[&str],
    ) -> Result<Option<Outcome>, Error> {
        let expected =
            toolledger::json::canonical_string(&Value::Object(known.clone())).map_err(internal)?;
        let answered: Vec<String> = answered.iter().map(|s| s.to_string()).collect();
        self.engine
            .replay_for_first_round(
                &request.caller.principal,
                &request.contract.name,
                request.operation_id,
                self.config.shared_key_namespace,
                move |stored| {
                    let Value::Object(stored) = stored else {
                        return false;
                    };
                    let mut fixed = stored.clone();
                    for field in &answered {
                        fixed.remove(field);
                    }
                    toolledger::json::canonical_string(&Value::Object(fixed))
                        .is_ok_and(|s| s == expected)
                },
            )
            .await
    }

    /// The first round of a multi-round tool: seals a `requestState` bound to the caller, tool,
    /// operation id and arguments, with the operation's deadlines fixed now, and returns the
    /// `input_required` result asking for `input_requests`.
    pub fn first_round(
        &self,
        request: &GuardedRequest<'_>,
        step: &str,
        input_requests: Vec<(String, InputRequest)>,
    ) -> Result<InputRequiredResult, Error> {
        let now = self.clock().now();
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).map_err(|_| Error::unavailable("no randomness"))?;
        let binding = StateBinding {
            tenant: request.caller.principal.tenant.clone(),
            subject: request.caller.principal.subject.clone(),
            tool: request.contract.name.clone(),
            operation_id: request.operation_id.to_string(),
            args_digest: arguments_digest(request.arguments)?,
            nonce: hex::encode(nonce),
            step: step.to_string(),
            issued_at: now,
            authority_deadline: now.saturating_add(self.config.authority_ttl),
            retention_deadline: now.saturating_add(self.config.retention_ttl),
            upstream_state: None,
        };
        let token = self.sealer.seal(&binding)?;
        let requests: InputRequests = input_requests.into_iter().collect();
        Ok(InputRequiredResult::new(Some(requests), Some(token)))
    }

    /// Verifies a continuation: the token must open for this caller, tool and operation id,
    /// be unexpired and match the arguments; then the whole logical request is fingerprinted.
    pub fn resume(
        &self,
        request: &GuardedRequest<'_>,
        request_state: &str,
        input_responses: &Value,
    ) -> Result<Resumed, Error> {
        let p = &request.caller.principal;
        let binding = self.sealer.open(
            request_state,
            &p.tenant,
            &p.subject,
            &request.contract.name,
            request.operation_id,
            self.clock().now(),
        )?;
        if binding.args_digest != arguments_digest(request.arguments)? {
            return Err(Error::new(
                ErrorCode::RequestStateInvalid,
                "the continuation state is invalid, expired or not yours",
            ));
        }
        let state = serde_json::to_value(&binding).map_err(internal)?;
        let fingerprint = self.fingerprint(request, Some(state), Some(input_responses.clone()))?;
        Ok(Resumed {
            binding,
            fingerprint,
        })
    }

    /// The round that answers `step` inside one call of the initialize lifecycle, where the
    /// server asked the client through elicitation instead of `input_required`. There is no
    /// token: the continuation state is the fixed `{step, mode: "elicitation"}`, so a retried
    /// call with the same arguments and the same answers has the same fingerprint and replays.
    pub fn elicited(
        &self,
        request: &GuardedRequest<'_>,
        step: &str,
        input_responses: &Value,
    ) -> Result<Resumed, Error> {
        let now = self.clock().now();
        let binding = StateBinding {
            tenant: request.caller.principal.tenant.clone(),
            subject: request.caller.principal.subject.clone(),
            tool: request.contract.name.clone(),
            operation_id: request.operation_id.to_string(),
            args_digest: arguments_digest(request.arguments)?,
            nonce: String::new(),
            step: step.to_string(),
            issued_at: now,
            authority_deadline: now.saturating_add(self.config.authority_ttl),
            retention_deadline: now.saturating_add(self.config.retention_ttl),
            upstream_state: None,
        };
        let state = json!({"step": step, "mode": "elicitation"});
        let fingerprint = self.fingerprint(request, Some(state), Some(input_responses.clone()))?;
        Ok(Resumed {
            binding,
            fingerprint,
        })
    }

    /// Runs a continuation's effect in one transaction with its ledger row.
    pub async fn run_resumed(
        &self,
        request: &GuardedRequest<'_>,
        resumed: &Resumed,
        intent: Value,
        effect: Arc<dyn InlineEffect>,
    ) -> Result<Outcome, Error> {
        let call = self.resumed_call(request, resumed, intent);
        self.engine.execute_inline(call, effect).await
    }

    fn resumed_call(
        &self,
        request: &GuardedRequest<'_>,
        resumed: &Resumed,
        intent: Value,
    ) -> InlineCall {
        let binding = &resumed.binding;
        let (authority, retention) = (binding.authority_deadline, binding.retention_deadline);
        let fingerprint = resumed.fingerprint.clone();
        self.inline_call(request, intent, fingerprint, authority, retention)
    }

    /// Starts a continuation's multi-step effect: the first step commits with an `in_progress`
    /// ledger row; finish with [`Engine::finish_steps`].
    pub async fn begin_resumed(
        &self,
        request: &GuardedRequest<'_>,
        resumed: &Resumed,
        intent: Value,
        first: Arc<dyn InlineEffect>,
    ) -> Result<Begun, Error> {
        let call = self.resumed_call(request, resumed, intent);
        self.engine.begin_steps(call, first).await
    }
}

/// Reads the operation id from `arguments[field]`: a string of 1–256 characters.
pub fn operation_id_from<'a>(
    arguments: &'a Map<String, Value>,
    field: &str,
) -> Result<&'a str, Error> {
    match arguments.get(field) {
        Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= 256 => Ok(s),
        Some(Value::String(_)) => Err(Error::invalid(format!(
            "{field} must be 1 to 256 characters"
        ))),
        Some(_) => Err(Error::invalid(format!("{field} must be a string"))),
        None => Err(Error::invalid(format!("{field} is required"))),
    }
}

/// The standard result of a guarded call: `{operationId, result…, replayed, state}` where the
/// stored result object's fields are merged in.
pub fn outcome_json(operation_id: &str, outcome: &Outcome) -> Value {
    let mut out = Map::new();
    out.insert("operationId".into(), json!(operation_id));
    if let Value::Object(stored) = &outcome.result {
        for (k, v) in stored {
            out.insert(k.clone(), v.clone());
        }
    } else {
        out.insert("result".into(), outcome.result.clone());
    }
    out.insert("replayed".into(), json!(outcome.replayed));
    out.insert("state".into(), json!(outcome.state.as_str()));
    Value::Object(out)
}
