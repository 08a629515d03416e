//! Group commit for inline calls on a driver whose writers run in parallel (PostgreSQL).
//!
//! Concurrent [`Engine::execute_inline`](super::Engine::execute_inline) calls wait in one
//! queue; up to [`BatchDriver::batch_writers`] batch writers each take up to [`MAX_BATCH`]
//! of them and run them in one transaction (`READ COMMITTED` on PostgreSQL):
//!
//! 1. the advisory locks of every call's `(tool, key)` (the same locks a single writer takes,
//!    in sorted order, so two batches never deadlock on them) go out in one statement,
//!    pipelined with one lookup of every row of those `(tool, key)` pairs;
//! 2. each call then runs, in order: authorize, the shared-namespace check, the scope row from
//!    the lookup (conflict, deadlines, state, replay), and for a fresh scope its deadlines and
//!    the effect. A call that fails before sending any statement (a conflict, a deadline, a
//!    refusal of its checks) has changed nothing and alone gets its error. A call that fails
//!    after sending statements may have written, or left the transaction aborted: the batch
//!    is rolled back and run again in *careful* mode, each call inside its own savepoint, where
//!    a failing call rolls back to its savepoint and alone gets its error, and a call that met
//!    a deadlock or another transient conflict goes back to the queue. (Savepoints on every
//!    call cost two more statements and a subtransaction per call; effects rarely fail after
//!    writing, so batches run without them first. After a batch that needed them, the
//!    writer's next batch starts careful.);
//! 3. one multi-row `INSERT` writes the ledger rows of every fresh call, already `applied`
//!    with their canonical results (written once, never inserted and then updated), and the
//!    batch commits. Callers are answered only after `COMMIT` returned.
//!
//! A lone call is not delayed: a free batch writer takes it at once. While a batch runs, the
//! calls that arrive queue up and form the next one. Two calls of one `(tool, key)` never
//! share a batch (the second waits for the next one, and then sees the first's row).
//!
//! The order of checks and every answer are those of the single-call path in the parent
//! module; only the ledger row is written after the effect instead of before it, inside the
//! same transaction, which nobody can observe. [`FaultPoint::AfterLedgerInsert`](super::FaultPoint::AfterLedgerInsert) fires when
//! the call's scope is known to be free and locked, just before the effect.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

use super::replays::{Replays, Watched};
use super::{
    judge, key_taken, record, run_fresh, FaultHook, InlineEffect, Outcome, Prepared, Written,
};
use crate::clock::SharedClock;

use crate::metric::{BatchSize, QueueDepth};
use crate::model::{Error, OperationState};
use crate::store::{
    queue_full, queue_wait_expired, AppliedRow, BatchDriver, BatchTx, BatchWriter, OperationRow,
    QueueLimits, ScopeKey, StoreError,
};

/// The most calls one batch holds. PostgreSQL keeps up to 64 subtransaction ids per
/// transaction in shared memory; more makes every other session's snapshot checks slower.
pub(crate) const MAX_BATCH: usize = 32;

/// Times one call may go back to the queue after a transient conflict before its error is
/// the answer.
const MAX_CALL_ATTEMPTS: u32 = 5;

/// One queued call.
struct Pending {
    prepared: Arc<Prepared>,
    effect: Arc<dyn InlineEffect>,
    reply: oneshot::Sender<Result<Written, Error>>,
    attempts: u32,
    /// When the call first entered the queue.
    queued_at: Instant,
}

struct State {
    queue: VecDeque<Pending>,
    /// Which batch writers are started and not yet finished.
    running: Vec<bool>,
}

/// The queue of one engine's inline calls and its batch writers.
pub(crate) struct Batcher {
    store: Arc<dyn BatchDriver>,
    clock: SharedClock,
    fault: Option<FaultHook>,
    /// The engine's settled rows, for exact retries.
    replays: Arc<Replays>,
    writers: usize,
    limits: QueueLimits,
    state: Mutex<State>,
}

/// How one call of a batch ended inside the transaction.
enum CallEnd {
    /// Answered from the ledger: a replay, or an error (nothing of it is kept).
    Done(Result<Written, Error>),
    /// Fresh: its ledger row is in the batch insert; the outcome lacks the row id. With the
    /// canonical result and its digest.
    Fresh(Outcome, Option<(String, String)>),
    /// A transient conflict: queue it again.
    Again(Error),
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("writers", &self.writers)
            .finish_non_exhaustive()
    }
}

impl Batcher {
    pub(crate) fn new(
        store: Arc<dyn BatchDriver>,
        clock: SharedClock,
        fault: Option<FaultHook>,
        replays: Arc<Replays>,
    ) -> Self {
        let writers = store.batch_writers();
        let limits = store.queue_limits();
        Batcher {
            writers,
            limits,
            store,
            clock,
            fault,
            replays,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                running: vec![false; writers],
            }),
        }
    }

    /// Queues one call and waits until the batch holding it has committed.
    pub(crate) async fn run(
        self: &Arc<Self>,
        prepared: Arc<Prepared>,
        effect: Arc<dyn InlineEffect>,
    ) -> Result<Written, Error> {
        let (reply, answer) = oneshot::channel();
        self.enqueue(Pending {
            prepared,
            effect,
            reply,
            attempts: 0,
            queued_at: Instant::now(),
        });
        answer
            .await
            .unwrap_or_else(|_| Err(Error::unavailable("the database writer stopped")))
    }

    /// Queues `pending`, or answers it `unavailable` when the queue is full.
    fn enqueue(self: &Arc<Self>, pending: Pending) {
        let start = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if st.queue.len() >= self.limits.depth.max(1) {
                drop(st);
                let _ = pending.reply.send(Err(Error::from(queue_full())));
                return;
            }
            st.queue.push_back(pending);
            INLINE_QUEUE.set(st.queue.len());
            claim_writer(&mut st)
        };
        if let Some(writer) = start {
            self.start_writer(writer);
        }
    }

    /// Starts batch writer `writer`, already marked running.
    fn start_writer(self: &Arc<Self>, writer: usize) {
        let me = self.clone();
        if self
            .store
            .spawn_batch_job(writer, Box::new(move |w| me.work(writer, w)))
            .is_err()
        {
            // No thread to run it (the store is closing): answer whatever no running writer
            // will take.
            let orphans = {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                st.running[writer] = false;
                if st.running.iter().any(|r| *r) {
                    Vec::new()
                } else {
                    st.queue.drain(..).collect()
                }
            };
            for p in orphans {
                let _ = p.reply.send(Err(Error::unavailable("store closed")));
            }
        }
    }

    /// Batch writer `writer`: runs batches until the queue is empty.
    fn work(self: Arc<Self>, writer: usize, w: &mut dyn BatchWriter) {
        let mut careful = false;
        loop {
            let batch = {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                if st.queue.is_empty() {
                    st.running[writer] = false;
                    return;
                }
                let batch = take_batch(&mut st.queue);
                INLINE_QUEUE.set(st.queue.len());
                batch
            };
            // Calls that waited past the queue's limit are answered without running.
            let now = Instant::now();
            let batch = if batch.iter().any(|p| self.limits.expired(p.queued_at, now)) {
                let (live, expired): (Vec<Pending>, Vec<Pending>) = batch
                    .into_iter()
                    .partition(|p| !self.limits.expired(p.queued_at, now));
                for p in expired {
                    let _ = p.reply.send(Err(Error::from(queue_wait_expired())));
                }
                if live.is_empty() {
                    continue;
                }
                live
            } else {
                batch
            };
            // The batch's calls share one transaction (and one commit, when any is fresh).
            BATCH_SIZE.record(batch.len());
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.run_batch(w, batch, careful)
            }));
            careful = run.as_ref().is_ok_and(|undone| *undone);
            if run.is_err() {
                // A panic outside any call's effect (a call's own panic is caught inside the
                // transaction). The batch's replies were dropped with it (its callers answer
                // `unavailable`); the connection is closed, so the server rolls back whatever
                // the batch had written, and the writer goes on with a new one.
                w.discard_connection();
            }
        }
    }

    /// Runs one batch and answers its calls (or queues them again). Returns whether a call
    /// failed after sending statements, so that its writes had to be undone.
    fn run_batch(&self, w: &mut dyn BatchWriter, batch: Vec<Pending>, careful: bool) -> bool {
        let calls: Vec<(&Prepared, &dyn InlineEffect)> = batch
            .iter()
            .map(|p| (p.prepared.as_ref(), p.effect.as_ref()))
            .collect();
        let mut careful = careful;
        let (out, undone) = loop {
            let mut undone = false;
            let mut ends = None;
            let out = w
                .write(&mut |tx| {
                    undone = false;
                    ends = Some(self.transaction(tx, &calls, careful, &mut undone)?);
                    Ok(())
                })
                .and_then(|()| {
                    ends.take()
                        .ok_or_else(|| Error::unavailable("the batch did not run"))
                });
            if undone && !careful {
                careful = true;
                continue;
            }
            break (out, undone);
        };
        let ends = match out {
            Ok(ends) => ends,
            Err(e) => {
                for p in batch {
                    let _ = p.reply.send(Err(e.clone()));
                }
                return undone;
            }
        };
        let mut again = Vec::new();
        for (p, end) in batch.into_iter().zip(ends) {
            match end {
                CallEnd::Done(r) => {
                    let _ = p.reply.send(r);
                }
                CallEnd::Fresh(o, _) => {
                    let _ = p.reply.send(Ok(Written::Fresh(o)));
                }
                CallEnd::Again(e) if p.attempts + 1 >= MAX_CALL_ATTEMPTS => {
                    let _ = p.reply.send(Err(e));
                }
                CallEnd::Again(_) => again.push(Pending {
                    attempts: p.attempts + 1,
                    ..p
                }),
            }
        }
        if !again.is_empty() {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            for p in again.into_iter().rev() {
                st.queue.push_front(p);
            }
        }
        undone
    }

    /// One attempt at the batch's transaction (run again whole after a deadlock). Without
    /// `careful`, calls run without savepoints, and the first call that fails after sending a
    /// statement ends the attempt with an error and `undone` set (the caller runs the batch
    /// again, careful). With `careful`, each call runs in its own savepoint, and `undone` tells
    /// whether one of them was rolled back after sending statements.
    fn transaction(
        &self,
        tx: &mut dyn BatchTx,
        calls: &[(&Prepared, &dyn InlineEffect)],
        careful: bool,
        undone: &mut bool,
    ) -> Result<Vec<CallEnd>, Error> {
        let now = self.clock.now();
        let mut keys: Vec<String> = calls.iter().map(|(p, _)| p.lock_key()).collect();
        keys.sort_unstable();
        tx.lock_keys(&keys)?;
        let scopes: Vec<ScopeKey<'_>> = calls
            .iter()
            .map(|(p, _)| ScopeKey {
                tool: &p.contract.name,
                key: &p.key,
            })
            .collect();
        let mut rows: HashMap<(String, String), Vec<OperationRow>> = HashMap::new();
        for row in tx.lookup_scopes(&scopes)? {
            rows.entry((row.tool.clone(), row.idempotency_key.clone()))
                .or_default()
                .push(row);
        }

        let mut ends = Vec::with_capacity(calls.len());
        let mut fresh: Vec<(usize, String, String, String)> = Vec::new();
        for (i, (p, effect)) in calls.iter().enumerate() {
            let found = rows
                .remove(&(p.contract.name.clone(), p.key.clone()))
                .unwrap_or_default();
            let flights = tx.flights();
            if careful {
                tx.savepoint()?;
            }
            // A panicking effect fails alone, like any other failing call (as on SQLite's
            // writer): what it did is undone and the batch goes on.
            let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.call(tx, p, *effect, found, now)
            }))
            .unwrap_or_else(|_| {
                Err(Error::from(StoreError::Database(
                    "write job panicked".into(),
                )))
            });
            match ended {
                Ok(CallEnd::Fresh(outcome, encoded)) => {
                    if careful {
                        tx.release_savepoint();
                    }
                    let (text, digest) = encoded.unwrap_or_default();
                    fresh.push((i, outcome.status_ref.clone(), text, digest));
                    ends.push(CallEnd::Fresh(outcome, None));
                }
                Ok(end) => {
                    if careful {
                        tx.release_savepoint();
                    }
                    ends.push(end);
                }
                Err(e) if tx.flights() == flights => {
                    // Nothing of the call reached the server: nothing to undo.
                    if careful {
                        tx.release_savepoint();
                    }
                    tx.drop_unsent_lock();
                    ends.push(CallEnd::Done(Err(e)));
                }
                Err(e) if careful => {
                    *undone = true;
                    if tx.rollback_to_savepoint() {
                        ends.push(CallEnd::Again(e));
                    } else {
                        ends.push(CallEnd::Done(Err(e)));
                    }
                }
                Err(e) => {
                    // What the call wrote, or the aborted transaction it left, can only be
                    // undone with the whole transaction: roll back and run the batch careful.
                    tx.take_retry();
                    *undone = true;
                    return Err(e);
                }
            }
        }
        if !fresh.is_empty() {
            let ids = insert_rows(tx, calls, &fresh, now)?;
            for (i, status_ref, _, _) in &fresh {
                let id = ids
                    .get(status_ref)
                    .copied()
                    .ok_or_else(|| super::contract_error("a ledger row was not written"))?;
                if let CallEnd::Fresh(o, _) = &mut ends[*i] {
                    o.operation_id = id;
                }
            }
        }
        Ok(ends)
    }

    /// One call inside its savepoint: the checks of `examine` on the batch's lookup, then
    /// (fresh scope) the effect.
    fn call(
        &self,
        tx: &mut dyn BatchTx,
        p: &Prepared,
        effect: &dyn InlineEffect,
        found: Vec<OperationRow>,
        now: i64,
    ) -> Result<CallEnd, Error> {
        let mut checks = Watched::new(tx.effect_tx());
        effect.authorize(&mut checks, &p.principal)?;
        let authorize_sent = checks.sent;
        let mut own = None;
        for row in found {
            let mine = row.tenant == p.principal.tenant && row.subject == p.principal.subject;
            if mine {
                own = Some(row);
            } else if p.shared_key_namespace {
                return Err(key_taken());
            }
        }
        if let Some(row) = own {
            let found = record(row)?;
            let mut checks = Watched::new(tx.effect_tx());
            let answer = judge(&mut checks, p, effect, &found, now);
            if !(authorize_sent || checks.sent) {
                self.replays.keep(found, now);
            }
            return Ok(CallEnd::Done(Ok(Written::Replayed(answer?))));
        }
        let (result, encoded) = run_fresh(tx.effect_tx(), p, effect, self.fault.as_ref(), now)?;
        let status_ref = crate::ledger::new_status_ref()?;
        Ok(CallEnd::Fresh(
            Outcome {
                result,
                replayed: false,
                state: OperationState::Applied,
                status_ref,
                operation_id: 0,
            },
            Some(encoded),
        ))
    }
}

/// Marks a batch writer that is not running as running, and names it.
fn claim_writer(st: &mut State) -> Option<usize> {
    let free = st.running.iter().position(|r| !*r)?;
    st.running[free] = true;
    Some(free)
}

/// `toolledger_store_queue_depth{backend="postgres",queue="inline_batch"}`: the inline calls
/// waiting for a batch writer, as last seen. (Only PostgreSQL's driver batches; SQLite's
/// writer groups its jobs itself.)
static INLINE_QUEUE: QueueDepth = QueueDepth::new("postgres", "inline_batch");
/// Inline calls per batch transaction.
static BATCH_SIZE: BatchSize = BatchSize::new("postgres");

/// Takes up to [`MAX_BATCH`] calls from the front of `queue`, at most one per `(tool, key)`;
/// the rest keep their order.
fn take_batch(queue: &mut VecDeque<Pending>) -> Vec<Pending> {
    let mut batch = Vec::new();
    let mut keys = HashSet::new();
    let mut rest = VecDeque::new();
    while let Some(p) = queue.pop_front() {
        if batch.len() < MAX_BATCH && keys.insert(p.prepared.lock_key()) {
            batch.push(p);
        } else if batch.len() >= MAX_BATCH {
            rest.push_back(p);
            rest.extend(queue.drain(..));
            break;
        } else {
            rest.push_back(p);
        }
    }
    *queue = rest;
    batch
}

/// The ledger rows of the fresh calls, `applied`, in one statement. Returns each row's id
/// by status reference.
fn insert_rows(
    tx: &mut dyn BatchTx,
    calls: &[(&Prepared, &dyn InlineEffect)],
    fresh: &[(usize, String, String, String)],
    now: i64,
) -> Result<HashMap<String, i64>, Error> {
    let rows: Vec<AppliedRow<'_>> = fresh
        .iter()
        .map(|(i, status_ref, result_text, digest)| {
            let p = calls[*i].0;
            AppliedRow {
                tenant: &p.principal.tenant,
                subject: &p.principal.subject,
                contract: &p.contract,
                key: &p.key,
                request_digest: &p.request_digest,
                arguments: &p.arguments_text,
                fingerprint: p.fingerprint.as_deref(),
                status_ref,
                authority_deadline: p.authority_deadline,
                retention_deadline: p.retention_deadline,
                result: result_text,
                result_digest: digest,
            }
        })
        .collect();
    let mut ids = HashMap::with_capacity(fresh.len());
    // The batch ends here: the insert and COMMIT go out together.
    for (id, status_ref) in tx.insert_applied_then_commit(&rows, now)? {
        ids.insert(status_ref, id);
    }
    Ok(ids)
}
