//! The operation engine for inline effects: reserve a scope, run the effect in the same
//! transaction, store the canonical result, and replay it for an exact retry.
//!
//! # One call, one transaction
//!
//! [`Engine::execute_inline`] runs, in one write transaction:
//!
//! 1. [`InlineEffect::authorize`]: the current access check (is the resource still in the
//!    caller's workspace?). It runs *before* the ledger lookup, so a saved result never
//!    outlives the caller's access to the resource.
//! 2. With [`InlineCall::shared_key_namespace`]: the same `(tool, key)` held by another
//!    principal is `operation_conflict`.
//! 3. Scope lookup `(tenant, subject, tool, key)`. Same request digest and fingerprint →
//!    deadlines (authority before retention), then state → replay of the stored result.
//!    Different digest or fingerprint → `operation_conflict` (before any deadline).
//! 4. Fresh scope: the call's deadlines, [`FaultPoint::AfterLedgerInsert`] (the scope is
//!    reserved: free, and every other writer of it waits for this transaction),
//!    [`InlineEffect::apply`], [`FaultPoint::AfterEffect`], then the ledger row, written once
//!    with its state (`applied`), canonical result and result digest. Nobody can see the
//!    difference to inserting an `in_progress` row first and updating it: both happen inside
//!    one uncommitted transaction, and it saves a write per call.
//! 5. After `COMMIT`: [`FaultPoint::AfterCommit`] (fresh calls only, never on a replay).
//!
//! Any error rolls the whole call back: no ledger row, no effect row.
//!
//! On PostgreSQL concurrent calls share transactions (group commit, `engine/batch.rs`):
//! each call runs the same checks in the same order inside its own savepoint, and the ledger
//! rows of a batch's fresh calls go out in one multi-row insert.
//!
//! # Replay fast path
//!
//! On SQLite every call first runs steps 1–3 on a pooled read connection inside one read
//! snapshot (on PostgreSQL the write transaction does it directly, see below). A
//! replay, a conflict, an expired deadline or a refused authorization is answered from that
//! snapshot without touching the writer: none of them writes anything, and all checks see one
//! consistent state. Only when the scope is absent does the call go to the writer, which runs
//! the whole sequence again inside `BEGIN IMMEDIATE`, so two racing first attempts serialize
//! there (and across processes, on SQLite's write lock plus `UNIQUE(scope)`). On PostgreSQL the
//! write transaction first takes an advisory lock on `(tool, key)` ([`EffectTx::lock_key`]),
//! which serializes racing writers of one key the same way. Consequently
//! [`InlineEffect::authorize`] and [`InlineEffect::check_replay`] must only read.
//!
//! The engine runs on any [`Store`] backend; it knows no SQL dialect. The rows, statements,
//! status references, deadline check and events it uses are the ledger's (the crate's
//! `ledger` module), shared with the deferred path in [`crate::runtime`]; the order of checks
//! on an existing row (conflict, deadlines, state, replay) is written once and run by both the
//! single-call path and group commit.
//!
//! # Replays from memory
//!
//! A settled operation (`applied`, `succeeded`, `failed`) does not change until the pruner
//! compacts it after its retention deadline. Once an engine has read one from the store, it
//! keeps a copy (bounded by size), and answers later calls of the same scope from the copy:
//! the same checks in the same order (the effect's access check, conflict, deadlines, the
//! replay check), without a round trip to the store's threads. The store still answers when
//! the effect's checks read it (a row is kept only when the checks of the call that read it
//! sent no statement, and an answer from memory runs them against a transaction that answers
//! none: one that tries is answered by the store instead), in a shared key namespace, and once the
//! retention deadline is within [`KEPT_ROW_MARGIN_SECS`] of the latest time the engine's clock
//! has shown. A fresh call's own row is never kept: its first retry reads it back and checks
//! it against the storage contract.
//!
//! # Stored JSON
//!
//! Arguments and results are stored as canonical JSON (see [`crate::json`]). On every read they are
//! parsed strictly and re-encoded; stored text that is not byte-identical to its canonical
//! form, or a result whose digest does not match, is a storage-contract error and never
//! reaches a caller.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::clock::SharedClock;
use crate::effect::{EffectTx, SqlValue};
use crate::ledger;
use crate::model::{Error, ErrorCode, OperationState, Principal, ToolContract};
use crate::store::{OperationRow, Store};

/// A named point on the fresh path where a test or `--fault` may crash the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// The scope is reserved (free, and its other writers wait for this transaction); the
    /// effect has not run; nothing is committed. (The ledger row itself is written with the
    /// result, after the effect, in the same transaction.)
    AfterLedgerInsert,
    /// The effect ran, the ledger row is not yet written; not committed.
    AfterEffect,
    /// The transaction committed; the caller has not been answered.
    AfterCommit,
}

/// A callback invoked at each [`FaultPoint`] of a fresh call. It runs on the thread that
/// reaches the point (the store's writer thread for the first two).
pub type FaultHook = Arc<dyn Fn(FaultPoint) + Send + Sync>;

/// One request to run an inline effect under an idempotency scope.
#[derive(Clone, Debug)]
pub struct InlineCall {
    /// The trusted caller, as the principal store says it is now.
    pub principal: Principal,
    /// The tool and its revisions.
    pub contract: ToolContract,
    /// The idempotency key (MCP operation id, request id). 1–256 characters.
    pub key: String,
    /// The validated business arguments (without the key). Must be canonical-encodable.
    pub arguments: Value,
    /// Optional fingerprint of the logical request (64 lowercase hex characters).
    pub fingerprint: Option<String>,
    /// Unix second from which no write (not even an exact replay) is allowed.
    pub authority_deadline: Option<i64>,
    /// Unix second from which the stored result is no longer replayed.
    pub retention_deadline: Option<i64>,
    /// When set, keys share one namespace per tool: the same `(tool, key)` under another
    /// tenant or subject is `operation_conflict`.
    pub shared_key_namespace: bool,
}

/// A side effect that commits in the same transaction as its ledger row.
///
/// Everything it does must go through the [`EffectTx`] it is given: a transaction may be rolled
/// back and run again (a deadlock; on PostgreSQL also a batch in which another call failed
/// after writing, see `engine/batch.rs`), so `apply` may run more than once for one call,
/// while only the run that commits leaves a trace.
pub trait InlineEffect: Send + Sync + 'static {
    /// The current access check, run inside the call's transaction *before* the ledger lookup
    /// (fresh calls and replays alike). Must only read. Default: allow.
    fn authorize(&self, tx: &mut dyn EffectTx, principal: &Principal) -> Result<(), Error> {
        let _ = (tx, principal);
        Ok(())
    }

    /// Performs the effect and returns its result (canonical-encodable JSON).
    fn apply(&self, tx: &mut dyn EffectTx, principal: &Principal) -> Result<Value, Error>;

    /// An extra check run before a stored result is replayed, after `authorize` and the
    /// scope lookup (e.g. the stored result still refers to a visible resource). Must only
    /// read. Default: allow, since `authorize` already ran for this call.
    fn check_replay(
        &self,
        tx: &mut dyn EffectTx,
        principal: &Principal,
        record: &OperationRecord,
    ) -> Result<(), Error> {
        let _ = (tx, principal, record);
        Ok(())
    }
}

/// A closure is an inline effect: its body is [`InlineEffect::apply`], with the default
/// (allowing) access and replay checks.
///
/// ```
/// # use serde_json::json;
/// # use toolledger_core::effect::EffectTx;
/// # use toolledger_core::engine::InlineEffect;
/// # use toolledger_core::model::Principal;
/// fn effect() -> impl InlineEffect {
///     |tx: &mut dyn EffectTx, p: &Principal| {
///         tx.execute("INSERT INTO notes(author) VALUES (?1)", &[p.subject.clone().into()])?;
///         Ok(json!({"created": true}))
///     }
/// }
/// ```
impl<F> InlineEffect for F
where
    F: Fn(&mut dyn EffectTx, &Principal) -> Result<Value, Error> + Send + Sync + 'static,
{
    fn apply(&self, tx: &mut dyn EffectTx, principal: &Principal) -> Result<Value, Error> {
        self(tx, principal)
    }
}

/// What a call returned.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Outcome {
    /// The result: fresh, or the stored historical result on a replay.
    pub result: Value,
    /// Whether the result was replayed from the ledger rather than produced now.
    pub replayed: bool,
    /// The operation's state.
    pub state: OperationState,
    /// Opaque reference for status queries.
    pub status_ref: String,
    /// Ledger row id.
    pub operation_id: i64,
}

/// The result of [`Engine::begin_steps`].
#[derive(Clone, Debug, PartialEq)]
pub enum Begun {
    /// The scope already held a finished operation with the same intent.
    Replayed(Outcome),
    /// The first step committed together with an `in_progress` ledger row.
    Started {
        /// Ledger row id, to pass to [`Engine::finish_steps`].
        operation_id: i64,
        /// What the first step returned.
        first_result: Value,
        /// Opaque reference for status queries.
        status_ref: String,
    },
}

/// One ledger row, read back and checked against the storage contract.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OperationRecord {
    /// Ledger row id.
    pub id: i64,
    /// Tenant of the scope.
    pub tenant: String,
    /// Subject of the scope.
    pub subject: String,
    /// Tool of the scope.
    pub tool: String,
    /// Idempotency key of the scope.
    pub key: String,
    /// Request digest of the accepted intent.
    pub request_digest: String,
    /// Fingerprint of the accepted request, if any.
    pub fingerprint: Option<String>,
    /// `inline` or `deferred`.
    pub effect_kind: String,
    /// Current state.
    pub state: OperationState,
    /// Stored result, once there is one.
    pub result: Option<Value>,
    /// SHA-256 of the canonical result.
    pub result_digest: Option<String>,
    /// Opaque reference for status queries.
    pub status_ref: String,
    /// Authority deadline (Unix seconds).
    pub authority_deadline: Option<i64>,
    /// Retention deadline (Unix seconds).
    pub retention_deadline: Option<i64>,
    /// When the row was created (Unix seconds).
    pub created_at: i64,
    /// When the row last changed (Unix seconds).
    pub updated_at: i64,
    /// The contract the intent was accepted under.
    pub contract: ToolContract,
    /// The accepted, canonical arguments (JSON `null` once compacted).
    pub arguments: Value,
    /// When the operation was compacted to a tombstone after its retention deadline: its
    /// arguments, result and history are gone; its scope, request digest, state, deadlines
    /// and status reference remain, so its key stays taken.
    pub compacted_at: Option<i64>,
}

/// One entry of an operation's append-only history.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OperationEvent {
    /// Event row id (increasing).
    pub id: i64,
    /// When it was recorded (Unix seconds).
    pub at: i64,
    /// What happened, e.g. `first_step`, `watcher_failed`.
    pub kind: String,
    /// Canonical detail.
    pub detail: Value,
}

/// The inline-effect engine over one store and one clock. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    store: Store,
    clock: SharedClock,
    fault: Option<FaultHook>,
    /// Group commit of inline calls, when the driver offers it.
    batcher: Option<Arc<batch::Batcher>>,
    /// Settled rows recently read, for exact retries.
    replays: Arc<replays::Replays>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.store)
            .field("clock", &self.clock)
            .field("fault_hook", &self.fault.is_some())
            .finish()
    }
}

/// How the writer finished a call.
enum Written {
    Replayed(Outcome),
    Fresh(Outcome),
}

/// How the writer finished a multi-step begin.
enum WrittenBegin {
    Replayed(Outcome),
    Started(i64, Value, String),
}

impl Engine {
    /// An engine over `store` (a [`Store`], or a backend handle such as a
    /// SQLite or PostgreSQL store handle) using `clock` for deadlines and timestamps.
    pub fn new(store: impl Into<Store>, clock: SharedClock) -> Self {
        let mut engine = Engine {
            store: store.into(),
            clock,
            fault: None,
            batcher: None,
            replays: Arc::new(replays::Replays::new()),
        };
        engine.make_batcher();
        engine
    }

    /// Installs a hook called at each [`FaultPoint`] of a fresh call.
    pub fn with_fault_hook(mut self, hook: FaultHook) -> Self {
        self.fault = Some(hook);
        self.make_batcher();
        self
    }

    fn make_batcher(&mut self) {
        if let Some(driver) = self.store.driver().batching() {
            self.batcher = Some(Arc::new(batch::Batcher::new(
                driver,
                self.clock.clone(),
                self.fault.clone(),
                self.replays.clone(),
            )));
        }
    }

    /// The underlying store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The engine's clock.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// Whether a call first looks for its scope in a read snapshot. On SQLite it does: all
    /// writes share one writer thread, and replays, conflicts and refusals must not queue
    /// behind it. On PostgreSQL writers run in parallel and the write transaction's `BEGIN`,
    /// key lock and scope lookup go out in one round trip, so a separate read transaction
    /// would only add round trips to every fresh call without making replays cheaper.
    fn reads_first(&self) -> bool {
        self.store.driver().reads_first()
    }

    fn fire(&self, point: FaultPoint) {
        if let Some(h) = &self.fault {
            h(point);
        }
    }

    /// Runs `effect` under `call`'s scope: a fresh effect committed together with its ledger
    /// row, or the stored result of an earlier identical call. See the module docs for the
    /// exact order of checks.
    pub async fn execute_inline(
        &self,
        call: InlineCall,
        effect: Arc<dyn InlineEffect>,
    ) -> Result<Outcome, Error> {
        let prepared = Arc::new(Prepared::new(call)?);
        let out = self.execute_prepared(prepared.clone(), effect).await;
        log_store_error("execute", &prepared.contract.name, &prepared.key, &out);
        out
    }

    async fn execute_prepared(
        &self,
        prepared: Arc<Prepared>,
        effect: Arc<dyn InlineEffect>,
    ) -> Result<Outcome, Error> {
        if let Some(answer) = self.answer_from_memory(&prepared, effect.as_ref()) {
            return answer;
        }
        if let Some(batcher) = &self.batcher {
            return match batcher.run(prepared, effect).await? {
                Written::Replayed(o) => Ok(o),
                Written::Fresh(o) => {
                    self.fire(FaultPoint::AfterCommit);
                    Ok(o)
                }
            };
        }
        if self.reads_first() {
            if let Some(found) = self.examine_on_reader(&prepared, &effect).await? {
                return Ok(found);
            }
        }
        let fault = self.fault.clone();
        let clock = self.clock.clone();
        let replays = self.replays.clone();
        // Drawn before the write so the writer does not wait for it (unused on a replay).
        let status_ref = ledger::new_status_ref()?;
        let written = self
            .store
            .write(move |tx: &mut dyn EffectTx| -> Result<Written, Error> {
                let now = clock.now();
                tx.lock_key(&prepared.lock_key())?;
                if let Some(found) = examine(tx, &prepared, effect.as_ref(), now, &replays)? {
                    return Ok(Written::Replayed(found));
                }
                // The scope is free and every writer of it waits for this transaction (the
                // key lock; SQLite's single writer): the effect runs, then the ledger row is
                // written once, already `applied`.
                let (result, (text, digest)) =
                    run_fresh(tx, &prepared, effect.as_ref(), fault.as_ref(), now)?;
                let id = insert_applied(tx, &prepared, &status_ref, &text, &digest, now)?;
                Ok(Written::Fresh(Outcome {
                    result,
                    replayed: false,
                    state: OperationState::Applied,
                    status_ref: status_ref.clone(),
                    operation_id: id,
                }))
            })
            .await?;
        match written {
            Written::Replayed(o) => Ok(o),
            Written::Fresh(o) => {
                self.fire(FaultPoint::AfterCommit);
                Ok(o)
            }
        }
    }

    /// Starts a multi-step inline effect: commits the ledger row (`in_progress`) together
    /// with the first step, and records the first step's result as a `first_step` event.
    /// Later steps run outside this transaction; [`Engine::finish_steps`] closes the
    /// operation. A retry while the operation is unfinished is `operation_in_progress`; a
    /// retry after it finished replays the stored result.
    ///
    /// Fault points `AfterLedgerInsert` and `AfterEffect` fire here; `AfterCommit` fires
    /// after [`Engine::finish_steps`] commits.
    pub async fn begin_steps(
        &self,
        call: InlineCall,
        first: Arc<dyn InlineEffect>,
    ) -> Result<Begun, Error> {
        let prepared = Arc::new(Prepared::new(call)?);
        let out = self.begin_prepared(prepared.clone(), first).await;
        log_store_error("begin_steps", &prepared.contract.name, &prepared.key, &out);
        out
    }

    async fn begin_prepared(
        &self,
        prepared: Arc<Prepared>,
        first: Arc<dyn InlineEffect>,
    ) -> Result<Begun, Error> {
        if self.reads_first() {
            if let Some(found) = self.examine_on_reader(&prepared, &first).await? {
                return Ok(Begun::Replayed(found));
            }
        }
        let fault = self.fault.clone();
        let clock = self.clock.clone();
        let replays = self.replays.clone();
        let written = self
            .store
            .write(
                move |tx: &mut dyn EffectTx| -> Result<WrittenBegin, Error> {
                    let now = clock.now();
                    tx.lock_key(&prepared.lock_key())?;
                    if let Some(found) = examine(tx, &prepared, first.as_ref(), now, &replays)? {
                        return Ok(WrittenBegin::Replayed(found));
                    }
                    let Some((id, status_ref)) = reserve(tx, &prepared, now)? else {
                        return examine(tx, &prepared, first.as_ref(), now, &replays)?
                            .map(WrittenBegin::Replayed)
                            .ok_or_else(|| contract_error("the reserved scope is not readable"));
                    };
                    if let Some(h) = &fault {
                        h(FaultPoint::AfterLedgerInsert);
                    }
                    let result = first.apply(tx, &prepared.principal)?;
                    let (text, _) = encode_result(&result)?;
                    if let Some(h) = &fault {
                        h(FaultPoint::AfterEffect);
                    }
                    ledger::insert_event(tx, id, now, "first_step", &text)?;
                    Ok(WrittenBegin::Started(id, result, status_ref))
                },
            )
            .await?;
        Ok(match written {
            WrittenBegin::Replayed(o) => Begun::Replayed(o),
            WrittenBegin::Started(operation_id, first_result, status_ref) => Begun::Started {
                operation_id,
                first_result,
                status_ref,
            },
        })
    }

    /// Finishes an operation started by [`Engine::begin_steps`]: sets `state` (`applied` or
    /// `partial`), stores `result`, and appends `events` (kind, detail) in the same
    /// transaction. Fails with `operation_conflict` if the operation is not `in_progress`.
    pub async fn finish_steps(
        &self,
        operation_id: i64,
        state: OperationState,
        result: Value,
        events: Vec<(String, Value)>,
    ) -> Result<Outcome, Error> {
        if !matches!(state, OperationState::Applied | OperationState::Partial) {
            return Err(Error::invalid(
                "a multi-step operation finishes as applied or partial",
            ));
        }
        let (text, digest) = encode_result(&result)?;
        let mut encoded = Vec::with_capacity(events.len());
        for (kind, detail) in &events {
            check_event_kind(kind)?;
            let d = crate::json::canonical_string(detail)
                .map_err(|_| Error::invalid("event detail is outside the canonical JSON domain"))?;
            encoded.push((kind.clone(), d));
        }
        let clock = self.clock.clone();
        let outcome = self
            .store
            .write(move |tx: &mut dyn EffectTx| {
                let now = clock.now();
                let Some((current, status_ref)) = ledger::state_of(tx, operation_id)? else {
                    return Err(Error::not_found());
                };
                if current != OperationState::InProgress.as_str() {
                    return Err(Error::conflict("operation is not in progress"));
                }
                for (kind, detail) in &encoded {
                    ledger::insert_event(tx, operation_id, now, kind, detail)?;
                }
                let changed = ledger::settle(
                    tx,
                    operation_id,
                    ledger::Unfinished::Inline,
                    state,
                    &text,
                    &digest,
                    now,
                )?;
                if changed != 1 {
                    // Finished by a concurrent caller between the check and this update
                    // (possible where writers run in parallel): this finish changes nothing.
                    return Err(Error::conflict("operation is not in progress"));
                }
                Ok(Outcome {
                    result: result.clone(),
                    replayed: false,
                    state,
                    status_ref,
                    operation_id,
                })
            })
            .await;
        log_store_error("finish_steps", "-", &operation_id.to_string(), &outcome);
        let outcome = outcome?;
        self.fire(FaultPoint::AfterCommit);
        Ok(outcome)
    }

    /// Appends one event to an operation's history in its own transaction.
    pub async fn record_event(
        &self,
        operation_id: i64,
        kind: &str,
        detail: Value,
    ) -> Result<(), Error> {
        check_event_kind(kind)?;
        let detail = crate::json::canonical_string(&detail)
            .map_err(|_| Error::invalid("event detail is outside the canonical JSON domain"))?;
        let kind = kind.to_string();
        let clock = self.clock.clone();
        let out = self
            .store
            .write(move |tx: &mut dyn EffectTx| {
                if !ledger::exists(tx, operation_id)? {
                    return Err(Error::not_found());
                }
                ledger::insert_event(tx, operation_id, clock.now(), &kind, &detail)
            })
            .await;
        log_store_error("record_event", "-", &operation_id.to_string(), &out);
        out
    }

    /// Reads one scope's ledger row. Read-only: never checks deadlines, never writes.
    pub async fn lookup(
        &self,
        tenant: &str,
        subject: &str,
        tool: &str,
        key: &str,
    ) -> Result<Option<OperationRecord>, Error> {
        let args = [
            tenant.to_string(),
            subject.to_string(),
            tool.to_string(),
            key.to_string(),
        ];
        let out = self
            .store
            .read(move |tx: &mut dyn EffectTx| {
                load_records(tx, ledger::BY_SCOPE, &args).map(|mut v| v.pop())
            })
            .await;
        log_store_error("lookup", tool, key, &out);
        out
    }

    /// The answer for a first round of a multi-round operation whose scope may already hold
    /// it (read-only): `Ok(None)` when the scope is free, so the tool asks for its input;
    /// otherwise what a replay of the finished request would answer. `same_request` is given
    /// the stored, canonical intent and says whether it is the one this first round begins;
    /// when it is not, or when another principal holds the key in a shared namespace, the
    /// answer is `operation_conflict`. Then deadlines, then state, exactly as for a replay:
    /// the stored result with `replayed: true`, `outcome_unknown`, or `operation_in_progress`.
    pub async fn replay_for_first_round(
        &self,
        principal: &Principal,
        tool: &str,
        key: &str,
        shared_key_namespace: bool,
        same_request: impl FnOnce(&Value) -> bool + Send + 'static,
    ) -> Result<Option<Outcome>, Error> {
        let now = self.clock.now();
        let (tenant, subject) = (principal.tenant.clone(), principal.subject.clone());
        let args = [
            tenant.clone(),
            subject.clone(),
            tool.to_string(),
            key.to_string(),
        ];
        self.store
            .read(move |tx: &mut dyn EffectTx| {
                if shared_key_namespace
                    && ledger::key_held_elsewhere(tx, &args[2], &args[3], &tenant, &subject)?
                {
                    return Err(key_taken());
                }
                let Some(record) = load_records(tx, ledger::BY_SCOPE, &args)?.pop() else {
                    return Ok(None);
                };
                // A tombstone keeps no arguments to compare: it answers by its deadlines.
                if record.compacted_at.is_none() && !same_request(&record.arguments) {
                    return Err(Error::conflict(
                        "this key was already used for a different request",
                    ));
                }
                settled(&record, now, |_| Ok(())).map(Some)
            })
            .await
    }

    /// Every ledger row for `(tool, key)` under any principal (for tools whose keys share one
    /// namespace). Read-only.
    pub async fn lookup_by_key_any_principal(
        &self,
        tool: &str,
        key: &str,
    ) -> Result<Vec<OperationRecord>, Error> {
        let args = [tool.to_string(), key.to_string()];
        self.store
            .read(move |tx: &mut dyn EffectTx| load_records(tx, ledger::BY_TOOL_KEY, &args))
            .await
    }

    /// The ledger row with this status reference. Read-only.
    pub async fn lookup_status_ref(
        &self,
        status_ref: &str,
    ) -> Result<Option<OperationRecord>, Error> {
        let args = [status_ref.to_string()];
        let out = self
            .store
            .read(move |tx: &mut dyn EffectTx| {
                load_records(tx, ledger::BY_STATUS_REF, &args).map(|mut v| v.pop())
            })
            .await;
        log_store_error("lookup_status_ref", "-", status_ref, &out);
        out
    }

    /// An operation's history, oldest first. Read-only.
    pub async fn events(&self, operation_id: i64) -> Result<Vec<OperationEvent>, Error> {
        self.store
            .read(move |tx: &mut dyn EffectTx| {
                Ok(ledger::load_events(tx, operation_id)?
                    .into_iter()
                    .map(|(id, at, kind, detail)| OperationEvent {
                        id,
                        at,
                        kind,
                        detail,
                    })
                    .collect())
            })
            .await
    }

    /// Steps 1–3 of a call on one read snapshot. `Ok(None)`: the scope is absent.
    async fn examine_on_reader(
        &self,
        prepared: &Arc<Prepared>,
        effect: &Arc<dyn InlineEffect>,
    ) -> Result<Option<Outcome>, Error> {
        let prepared = prepared.clone();
        let effect = effect.clone();
        let replays = self.replays.clone();
        let now = self.clock.now();
        self.store
            .read(move |tx: &mut dyn EffectTx| {
                examine(tx, &prepared, effect.as_ref(), now, &replays)
            })
            .await
    }

    /// The answer to a call whose scope holds a settled row this engine read before, without
    /// the store (see `engine/replays.rs`); `None` when the store must answer.
    fn answer_from_memory(
        &self,
        prepared: &Prepared,
        effect: &dyn InlineEffect,
    ) -> Option<Result<Outcome, Error>> {
        if prepared.shared_key_namespace {
            return None;
        }
        let now = self.clock.now();
        let kept = self.replays.get(prepared, now)?;
        replays::answer(&kept, prepared, effect, self.store.dialect(), now)
    }
}

/// Logs a failure of the store under an inline call as it happens (target
/// `toolledger::engine`, level warn): the step, the tool (`-` where the step names only an
/// operation), the operation (the call's key, or the ledger row id or status reference), the
/// code and the store's caller-safe message, which keeps the failure's kind (`store
/// unavailable`, `write refused by the database`, `storage contract violated: …`) and never
/// carries SQL text, paths or arguments. Every store failure reaches the caller as
/// `unavailable`; refusals (conflicts, deadlines, an effect's own refusal) are answers, not
/// logged here.
fn log_store_error<T>(step: &'static str, tool: &str, operation: &str, r: &Result<T, Error>) {
    if let Err(e) = r {
        if e.code == ErrorCode::Unavailable {
            tracing::warn!(
                target: "toolledger::engine", step, tool, operation, code = e.code.as_str(),
                error = %e.message, "store error");
        }
    }
}

/// A validated call with its digest.
struct Prepared {
    principal: Principal,
    contract: ToolContract,
    key: String,
    arguments_text: String,
    request_digest: String,
    fingerprint: Option<String>,
    authority_deadline: Option<i64>,
    retention_deadline: Option<i64>,
    shared_key_namespace: bool,
}

fn check_len(what: &str, s: &str, max: usize) -> Result<(), Error> {
    let n = s.chars().count();
    if n == 0 || n > max {
        return Err(Error::invalid(format!(
            "{what} must be 1 to {max} characters"
        )));
    }
    // PostgreSQL text cannot hold U+0000; refused on every backend alike.
    if s.contains('\0') {
        return Err(Error::invalid(format!("{what} must not contain U+0000")));
    }
    Ok(())
}

fn check_event_kind(kind: &str) -> Result<(), Error> {
    check_len("event kind", kind, 64)
}

impl Prepared {
    /// The columns of this call's new ledger row.
    fn new_row<'a>(&'a self, status_ref: &'a str, now: i64) -> ledger::NewRow<'a> {
        ledger::NewRow {
            tenant: &self.principal.tenant,
            subject: &self.principal.subject,
            key: &self.key,
            contract: &self.contract,
            request_digest: &self.request_digest,
            arguments_text: &self.arguments_text,
            fingerprint: self.fingerprint.as_deref(),
            status_ref,
            authority_deadline: self.authority_deadline,
            retention_deadline: self.retention_deadline,
            now,
        }
    }

    /// The key writers of this `(tool, key)` serialize on: the scope check, the shared
    /// namespace check and the reservation must not interleave with another writer's.
    fn lock_key(&self) -> String {
        format!("scope\u{1f}{}\u{1f}{}", self.contract.name, self.key)
    }

    fn new(call: InlineCall) -> Result<Self, Error> {
        check_len("tenant", &call.principal.tenant, 128)?;
        check_len("subject", &call.principal.subject, 128)?;
        check_len("tool name", &call.contract.name, 128)?;
        check_len("idempotency key", &call.key, 256)?;
        if let Some(f) = &call.fingerprint {
            if !ledger::is_hex64(f) {
                return Err(Error::invalid(
                    "fingerprint must be 64 lowercase hex digits",
                ));
            }
        }
        let arguments_text = crate::json::canonical_string(&call.arguments)
            .map_err(|e| Error::invalid(format!("arguments: {}", e.message)))?;
        let request_digest = crate::digest::request_digest_of_canonical(
            &call.principal.tenant,
            &call.principal.subject,
            &call.contract,
            &arguments_text,
        );
        Ok(Prepared {
            principal: call.principal,
            contract: call.contract,
            key: call.key,
            arguments_text,
            request_digest,
            fingerprint: call.fingerprint,
            authority_deadline: call.authority_deadline,
            retention_deadline: call.retention_deadline,
            shared_key_namespace: call.shared_key_namespace,
        })
    }
}

fn encode_result(result: &Value) -> Result<(String, String), Error> {
    ledger::encode_stored(result).ok_or_else(|| {
        Error::new(
            ErrorCode::Unavailable,
            "effect result is outside the canonical JSON domain",
        )
    })
}

fn contract_error(what: &str) -> Error {
    Error::from(ledger::contract(what))
}

mod batch;
mod replays;

/// An engine answers the exact retries of a settled operation it has read from memory only
/// while the operation's retention deadline is more than this many seconds ahead of the latest
/// time its clock has shown, so a pruner whose clock runs up to this much ahead has not yet
/// compacted it. (See "Replays from memory" in the module docs.)
pub const KEPT_ROW_MARGIN_SECS: i64 = replays::RETENTION_MARGIN;

/// The inline view of a decoded ledger row.
fn record(row: OperationRow) -> Result<OperationRecord, Error> {
    let r = ledger::decode(row)?;
    Ok(OperationRecord {
        id: r.id,
        tenant: r.tenant,
        subject: r.subject,
        tool: r.tool,
        key: r.key,
        request_digest: r.request_digest,
        fingerprint: r.fingerprint,
        effect_kind: r.effect_kind,
        state: r.state,
        result: r.result,
        result_digest: r.result_digest,
        status_ref: r.status_ref,
        authority_deadline: r.authority_deadline,
        retention_deadline: r.retention_deadline,
        created_at: r.created_at,
        updated_at: r.updated_at,
        contract: r.contract,
        arguments: r.arguments,
        compacted_at: r.compacted_at,
    })
}

fn load_records(
    tx: &mut dyn EffectTx,
    sql: &str,
    args: &[String],
) -> Result<Vec<OperationRecord>, Error> {
    let params: Vec<SqlValue> = args.iter().map(|a| SqlValue::from(a.as_str())).collect();
    tx.query(sql, &params)?
        .into_iter()
        .map(|row| record(OperationRow::from_values(row)?))
        .collect()
}

/// The refusal of a key another principal holds in a shared key namespace.
fn key_taken() -> Error {
    Error::conflict("this operation id is already used for another request")
}

/// Authorize, shared-namespace check, scope lookup, and for an existing row [`judge`] (a
/// settled row is then kept in `replays` when the effect's checks sent no statement).
/// `Ok(None)` means the scope is absent.
fn examine(
    tx: &mut dyn EffectTx,
    p: &Prepared,
    effect: &dyn InlineEffect,
    now: i64,
    replays: &replays::Replays,
) -> Result<Option<Outcome>, Error> {
    let mut checks = replays::Watched::new(tx);
    effect.authorize(&mut checks, &p.principal)?;
    let authorize_sent = checks.sent;
    if p.shared_key_namespace
        && ledger::key_held_elsewhere(
            tx,
            &p.contract.name,
            &p.key,
            &p.principal.tenant,
            &p.principal.subject,
        )?
    {
        return Err(key_taken());
    }
    let args = [
        p.principal.tenant.clone(),
        p.principal.subject.clone(),
        p.contract.name.clone(),
        p.key.clone(),
    ];
    let Some(record) = load_records(tx, ledger::BY_SCOPE, &args)?.pop() else {
        return Ok(None);
    };
    let mut checks = replays::Watched::new(tx);
    let answer = judge(&mut checks, p, effect, &record, now);
    if !(authorize_sent || checks.sent) {
        replays.keep(record, now);
    }
    answer.map(Some)
}

/// The checks after the scope lookup, for an existing row of the call's scope, in their one
/// order: conflict, deadlines (authority before retention), state, replay. The single-call
/// path ([`examine`]), a batch's call (`batch.rs`) and an answer from memory (`replays.rs`)
/// all run them through here.
fn judge(
    tx: &mut dyn EffectTx,
    p: &Prepared,
    effect: &dyn InlineEffect,
    record: &OperationRecord,
    now: i64,
) -> Result<Outcome, Error> {
    if record.request_digest != p.request_digest || record.fingerprint != p.fingerprint {
        return Err(Error::conflict(
            "this key was already used for a different request",
        ));
    }
    settled(record, now, |record| {
        effect.check_replay(tx, &p.principal, record)
    })
}

/// The answer for an existing row whose request is the caller's: deadlines (authority before
/// retention), then the state — a finished operation replays its stored result once `check`
/// allows it, an unsure one is `outcome_unknown`, an unfinished one `operation_in_progress`.
fn settled(
    record: &OperationRecord,
    now: i64,
    check: impl FnOnce(&OperationRecord) -> Result<(), Error>,
) -> Result<Outcome, Error> {
    ledger::check_deadlines(record.authority_deadline, record.retention_deadline, now)?;
    if record.compacted_at.is_some() {
        // Compacted after its retention deadline (a clock set back does not bring it back).
        return Err(ledger::retention_expired());
    }
    match record.state {
        s if s.is_terminal() => {
            check(record)?;
            let result = record
                .result
                .clone()
                .ok_or_else(|| contract_error("finished operation without a result"))?;
            Ok(Outcome {
                result,
                replayed: true,
                state: record.state,
                status_ref: record.status_ref.clone(),
                operation_id: record.id,
            })
        }
        OperationState::OutcomeUnknown | OperationState::Dead => Err(Error::new(
            ErrorCode::OutcomeUnknown,
            format!(
                "the outcome is not known; query status {}",
                record.status_ref
            ),
        )),
        OperationState::InProgress => Err(Error::new(
            ErrorCode::OperationInProgress,
            ledger::in_progress_message(&record.status_ref, record.updated_at, now),
        )),
        _ => Err(Error::new(
            ErrorCode::OperationInProgress,
            format!(
                "the operation has not finished; query status {}",
                record.status_ref
            ),
        )),
    }
}

/// The fresh path of a call whose scope is free and locked, up to the ledger row: the call's
/// own deadlines, [`FaultPoint::AfterLedgerInsert`], the effect, its canonical result and
/// digest, [`FaultPoint::AfterEffect`]. Shared by the single-call and the batch path.
fn run_fresh(
    tx: &mut dyn EffectTx,
    p: &Prepared,
    effect: &dyn InlineEffect,
    fault: Option<&FaultHook>,
    now: i64,
) -> Result<(Value, (String, String)), Error> {
    ledger::check_deadlines(p.authority_deadline, p.retention_deadline, now)?;
    if let Some(h) = fault {
        h(FaultPoint::AfterLedgerInsert);
    }
    let result = effect.apply(tx, &p.principal)?;
    let encoded = encode_result(&result)?;
    if let Some(h) = fault {
        h(FaultPoint::AfterEffect);
    }
    Ok((result, encoded))
}

/// Inserts the `in_progress` ledger row for a fresh scope after the call's own deadlines
/// (`INSERT … ON CONFLICT DO NOTHING`). `None` when another transaction holds the scope.
fn reserve(tx: &mut dyn EffectTx, p: &Prepared, now: i64) -> Result<Option<(i64, String)>, Error> {
    ledger::check_deadlines(p.authority_deadline, p.retention_deadline, now)?;
    let status_ref = ledger::new_status_ref()?;
    let id = ledger::insert_open(
        tx,
        &p.new_row(&status_ref, now),
        "inline",
        OperationState::InProgress,
    )?;
    Ok(id.map(|id| (id, status_ref)))
}

/// Inserts the ledger row of a fresh inline call, `applied` with its canonical result. The
/// scope was checked free under the key lock in the same transaction, so a row already there
/// means the lock was bypassed: a storage-contract error, and the transaction rolls back.
fn insert_applied(
    tx: &mut dyn EffectTx,
    p: &Prepared,
    status_ref: &str,
    result_text: &str,
    result_digest: &str,
    now: i64,
) -> Result<i64, Error> {
    ledger::insert_applied(tx, &p.new_row(status_ref, now), result_text, result_digest)?
        .ok_or_else(|| contract_error("the scope was taken under the key lock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request digest of a prepared call, for `arguments` under `contract`.
    fn prepared_digest(key: &str, contract: &ToolContract, arguments: Value) -> String {
        let call = InlineCall {
            principal: Principal {
                tenant: "t".into(),
                subject: "s".into(),
                roles: Default::default(),
                scopes: Default::default(),
            },
            contract: contract.clone(),
            key: key.into(),
            arguments,
            fingerprint: None,
            authority_deadline: None,
            retention_deadline: None,
            shared_key_namespace: false,
        };
        Prepared::new(call).unwrap().request_digest
    }

    #[test]
    fn request_digest_excludes_the_key_and_binds_the_intent() {
        let c = ToolContract::uniform("tool", "1");
        let a = prepared_digest("k1", &c, serde_json::json!({"x": 1}));
        assert_eq!(a.len(), 64);
        assert_eq!(a, prepared_digest("k2", &c, serde_json::json!({"x": 1})));
        assert_ne!(a, prepared_digest("k1", &c, serde_json::json!({"x": 2})));
        let c2 = ToolContract::uniform("tool", "2");
        assert_ne!(a, prepared_digest("k1", &c2, serde_json::json!({"x": 1})));
    }

    #[test]
    fn a_prepared_call_has_the_request_digest_of_its_arguments() {
        let c = ToolContract::uniform("refund", "3");
        for arguments in [
            serde_json::json!({}),
            serde_json::json!({"amount": 12.5, "currency": "EUR", "z": [1, {"b": null, "a": true}]}),
            serde_json::json!({"note": "caf\u{e9} \u{1f600} \"quoted\"", "n": -0.0, "big": 1e21}),
            serde_json::json!([1, 2.25, "x"]),
            serde_json::json!(null),
        ] {
            let expected =
                crate::digest::request_digest("t", "s", &c, &arguments).expect("canonical");
            assert_eq!(
                prepared_digest("k", &c, arguments.clone()),
                expected,
                "{arguments}"
            );
        }
    }
}
