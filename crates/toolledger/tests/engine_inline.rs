//! The inline engine on each driver (SQLite and PostgreSQL, through the conformance
//! [`Harness`]) with a tiny test effect: replay, conflict, deadlines, shared key namespaces,
//! multi-step operations, fault points, rollback and the storage contract.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use toolledger::clock::{ManualClock, SharedClock};
use toolledger::effect::{EffectTx, SqlValue};
use toolledger::engine::{
    Begun, Engine, FaultPoint, InlineCall, InlineEffect, OperationRecord, Outcome,
};
use toolledger::store::{Migration, Store};
use toolledger::{Error, ErrorCode, OperationState, Principal, ToolContract};
use toolledger_testkit::both_drivers;
use toolledger_testkit::calls::{inline_call, principal};
use toolledger_testkit::conformance::{Harness, T0};
use toolledger_testkit::db::{count, execute_batch};

/// The tenants [`MakeWidget`] hides (`(sqlite, postgres)`); its rows go to the harness's
/// `widgets` table.
const HIDDEN: (&[Migration], &[Migration]) = (
    &[Migration {
        namespace: "test.hidden",
        version: 1,
        sql: "CREATE TABLE hidden(tenant TEXT NOT NULL) STRICT;",
    }],
    &[Migration {
        namespace: "test.hidden",
        version: 1,
        sql: "CREATE TABLE hidden(tenant TEXT NOT NULL);",
    }],
);

struct Fixture<'h> {
    h: &'h Harness,
    clock: ManualClock,
    engine: Engine,
}

impl Fixture<'_> {
    /// The rows of `table`.
    async fn count(&self, table: &str) -> i64 {
        count(self.engine.store(), table).await
    }
}

fn fixture(h: &Harness) -> Fixture<'_> {
    let clock = ManualClock::new(T0);
    let shared: SharedClock = Arc::new(clock.clone());
    Fixture {
        h,
        clock,
        engine: Engine::new(open(h), shared),
    }
}

/// A new handle on the harness's database.
fn open(h: &Harness) -> Store {
    h.open_with(Some("engine-test"), HIDDEN, false)
        .expect("open the test database")
}

fn call(who: &Principal, key: &str, name: &str) -> InlineCall {
    inline_call(who, "make_widget", key, json!({ "name": name }))
}

/// Inserts one widget; refuses tenants listed in `hidden`; counts replay checks.
struct MakeWidget {
    name: String,
    fail_after_insert: bool,
    replay_checks: Arc<Mutex<u32>>,
}

impl MakeWidget {
    fn new(name: &str) -> Arc<Self> {
        Arc::new(MakeWidget {
            name: name.into(),
            fail_after_insert: false,
            replay_checks: Arc::default(),
        })
    }
}

impl InlineEffect for MakeWidget {
    fn authorize(&self, tx: &mut dyn EffectTx, principal: &Principal) -> Result<(), Error> {
        let hidden = tx.query(
            "SELECT 1 FROM hidden WHERE tenant = ?1",
            &[principal.tenant.as_str().into()],
        )?;
        if hidden.is_empty() {
            Ok(())
        } else {
            Err(Error::not_found())
        }
    }

    fn apply(&self, tx: &mut dyn EffectTx, principal: &Principal) -> Result<Value, Error> {
        let rows = tx.query(
            "INSERT INTO widgets(tenant, name) VALUES (?1, ?2) RETURNING id",
            &[
                principal.tenant.as_str().into(),
                SqlValue::Text(self.name.clone()),
            ],
        )?;
        if self.fail_after_insert {
            return Err(Error::new(ErrorCode::VersionConflict, "deliberate failure"));
        }
        let id = rows[0][0].as_i64().unwrap();
        Ok(json!({ "id": id, "name": self.name }))
    }

    fn check_replay(
        &self,
        _tx: &mut dyn EffectTx,
        _principal: &Principal,
        record: &OperationRecord,
    ) -> Result<(), Error> {
        assert!(record.state.is_terminal());
        *self.replay_checks.lock().unwrap() += 1;
        Ok(())
    }
}

fn code(r: Result<Outcome, Error>) -> ErrorCode {
    r.unwrap_err().code
}

async fn exact_retry_replays_the_stored_result_without_a_second_effect(h: &Harness) {
    let f = fixture(h);
    let alice = principal("team-a", "alice");
    let effect = MakeWidget::new("gear");
    let first = f
        .engine
        .execute_inline(call(&alice, "k1", "gear"), effect.clone())
        .await
        .unwrap();
    assert!(!first.replayed);
    assert_eq!(first.state, OperationState::Applied);
    assert_eq!(first.result, json!({"id": 1, "name": "gear"}));
    assert!(first.status_ref.starts_with("op_"));
    assert_eq!(*effect.replay_checks.lock().unwrap(), 0);

    // Through a new store handle, as after a lost reply.
    let again = Engine::new(open(f.h), Arc::new(f.clock.clone()));
    let second = again
        .execute_inline(call(&alice, "k1", "gear"), effect.clone())
        .await
        .unwrap();
    assert!(second.replayed);
    assert_eq!(second.result, first.result);
    assert_eq!(second.status_ref, first.status_ref);
    assert_eq!(second.operation_id, first.operation_id);
    assert_eq!(*effect.replay_checks.lock().unwrap(), 1);
    assert_eq!(f.count("widgets").await, 1);
    assert_eq!(f.count("operations").await, 1);

    let rec = f
        .engine
        .lookup("team-a", "alice", "make_widget", "k1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.result, Some(first.result.clone()));
    assert_eq!(rec.arguments, json!({"name": "gear"}));
    assert_eq!(rec.effect_kind, "inline");
    assert_eq!(rec.created_at, T0);
    assert!(f
        .engine
        .lookup("team-a", "alice", "make_widget", "other")
        .await
        .unwrap()
        .is_none());
    let by_ref = f
        .engine
        .lookup_status_ref(&first.status_ref)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(by_ref, rec);
}

async fn same_key_with_another_intent_is_a_conflict_and_writes_nothing(h: &Harness) {
    let f = fixture(h);
    let alice = principal("team-a", "alice");
    f.engine
        .execute_inline(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
        .await
        .unwrap();
    let err = code(
        f.engine
            .execute_inline(call(&alice, "k1", "cog"), MakeWidget::new("cog"))
            .await,
    );
    assert_eq!(err, ErrorCode::OperationConflict);
    // Another contract revision is another intent too.
    let mut c = call(&alice, "k1", "gear");
    c.contract = ToolContract::uniform("make_widget", "2");
    assert_eq!(
        code(f.engine.execute_inline(c, MakeWidget::new("gear")).await),
        ErrorCode::OperationConflict
    );
    // So is another fingerprint.
    let mut c = call(&alice, "k1", "gear");
    c.fingerprint = Some("a".repeat(64));
    assert_eq!(
        code(f.engine.execute_inline(c, MakeWidget::new("gear")).await),
        ErrorCode::OperationConflict
    );
    assert_eq!(f.count("widgets").await, 1);
    assert_eq!(f.count("operations").await, 1);

    // The same key under another subject or tenant is a separate scope.
    for who in [principal("team-a", "bob"), principal("team-b", "alice")] {
        let o = f
            .engine
            .execute_inline(call(&who, "k1", "cog"), MakeWidget::new("cog"))
            .await
            .unwrap();
        assert!(!o.replayed);
    }
    assert_eq!(f.count("operations").await, 3);
}

async fn authorization_runs_before_the_ledger_lookup(h: &Harness) {
    let f = fixture(h);
    let alice = principal("team-a", "alice");
    f.engine
        .execute_inline(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
        .await
        .unwrap();
    execute_batch(
        f.engine.store(),
        "INSERT INTO hidden(tenant) VALUES ('team-a')",
    )
    .await;
    // The saved result is not returned, and a conflicting intent cannot probe the key.
    for name in ["gear", "cog"] {
        assert_eq!(
            code(
                f.engine
                    .execute_inline(call(&alice, "k1", name), MakeWidget::new(name))
                    .await
            ),
            ErrorCode::NotFound
        );
    }
    assert_eq!(
        code(
            f.engine
                .execute_inline(call(&alice, "k2", "new"), MakeWidget::new("new"))
                .await
        ),
        ErrorCode::NotFound
    );
    assert_eq!(f.count("widgets").await, 1);
    assert_eq!(f.count("operations").await, 1);
}

async fn authority_deadline_blocks_even_an_exact_replay_but_not_a_status_read(h: &Harness) {
    let f = fixture(h);
    let alice = principal("team-a", "alice");
    let mut c = call(&alice, "k1", "gear");
    c.authority_deadline = Some(T0 + 10);
    c.retention_deadline = Some(T0 + 5);
    f.engine
        .execute_inline(c.clone(), MakeWidget::new("gear"))
        .await
        .unwrap();
    f.clock.set(T0 + 9);
    assert!(
        f.engine
            .execute_inline(c.clone(), MakeWidget::new("gear"))
            .await
            .unwrap_err()
            .code
            == ErrorCode::OperationRetentionExpired,
        "retention passed at T0+5"
    );
    f.clock.set(T0 + 10);
    // Both passed: authority is reported first.
    assert_eq!(
        code(
            f.engine
                .execute_inline(c.clone(), MakeWidget::new("gear"))
                .await
        ),
        ErrorCode::OperationAuthorityExpired
    );
    // A different intent under the key is still a conflict: conflict comes before deadlines.
    assert_eq!(
        code(
            f.engine
                .execute_inline(call(&alice, "k1", "cog"), MakeWidget::new("cog"))
                .await
        ),
        ErrorCode::OperationConflict
    );
    let rec = f
        .engine
        .lookup("team-a", "alice", "make_widget", "k1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.authority_deadline, Some(T0 + 10));
    assert_eq!(rec.state, OperationState::Applied);
    assert_eq!(f.count("widgets").await, 1);
}

async fn deadline_boundary_is_half_open(h: &Harness) {
    let f = fixture(h);
    let alice = principal("team-a", "alice");
    let mut c = call(&alice, "k1", "gear");
    c.authority_deadline = Some(T0 + 10);
    f.engine
        .execute_inline(c.clone(), MakeWidget::new("gear"))
        .await
        .unwrap();
    f.clock.set(T0 + 9);
    assert!(
        f.engine
            .execute_inline(c.clone(), MakeWidget::new("gear"))
            .await
            .unwrap()
            .replayed
    );
    f.clock.set(T0 + 10);
    assert_eq!(
        code(f.engine.execute_inline(c, MakeWidget::new("gear")).await),
        ErrorCode::OperationAuthorityExpired
    );
}

async fn retention_expiry_leaves_a_tombstone_that_keeps_the_key_used(h: &Harness) {
    let f = fixture(h);
    let alice = principal("team-a", "alice");
    let mut c = call(&alice, "k1", "gear");
    c.retention_deadline = Some(T0 + 60);
    f.engine
        .execute_inline(c.clone(), MakeWidget::new("gear"))
        .await
        .unwrap();
    f.clock.set(T0 + 60);
    assert_eq!(
        code(
            f.engine
                .execute_inline(c.clone(), MakeWidget::new("gear"))
                .await
        ),
        ErrorCode::OperationRetentionExpired
    );
    // A new intent cannot take the key over.
    let mut fresh = call(&alice, "k1", "cog");
    fresh.retention_deadline = Some(T0 + 600);
    assert_eq!(
        code(f.engine.execute_inline(fresh, MakeWidget::new("cog")).await),
        ErrorCode::OperationConflict
    );
    assert_eq!(f.count("operations").await, 1);
    assert_eq!(f.count("widgets").await, 1);
}

async fn a_fresh_call_past_its_own_deadline_writes_nothing(h: &Harness) {
    let f = fixture(h);
    let alice = principal("team-a", "alice");
    let mut c = call(&alice, "k1", "gear");
    c.authority_deadline = Some(T0);
    assert_eq!(
        code(f.engine.execute_inline(c, MakeWidget::new("gear")).await),
        ErrorCode::OperationAuthorityExpired
    );
    let mut c = call(&alice, "k1", "gear");
    c.retention_deadline = Some(T0 - 1);
    assert_eq!(
        code(f.engine.execute_inline(c, MakeWidget::new("gear")).await),
        ErrorCode::OperationRetentionExpired
    );
    assert_eq!(f.count("operations").await, 0);
    assert_eq!(f.count("widgets").await, 0);
}

async fn shared_key_namespace_refuses_a_key_held_by_another_principal(h: &Harness) {
    let f = fixture(h);
    let alice = principal("team-a", "alice");
    let bob = principal("team-a", "bob");
    let mut c = call(&alice, "case-03", "gear");
    c.shared_key_namespace = true;
    f.engine
        .execute_inline(c, MakeWidget::new("gear"))
        .await
        .unwrap();
    let mut c = call(&bob, "case-03", "gear");
    c.shared_key_namespace = true;
    assert_eq!(
        code(f.engine.execute_inline(c, MakeWidget::new("gear")).await),
        ErrorCode::OperationConflict
    );
    assert_eq!(f.count("operations").await, 1);
    // Without the shared namespace the key is bob's own.
    f.engine
        .execute_inline(call(&bob, "case-03", "gear"), MakeWidget::new("gear"))
        .await
        .unwrap();
    let all = f
        .engine
        .lookup_by_key_any_principal("make_widget", "case-03")
        .await
        .unwrap();
    let subjects: Vec<&str> = all.iter().map(|r| r.subject.as_str()).collect();
    assert_eq!(subjects, ["alice", "bob"]);
}

async fn multi_step_operation_is_in_progress_until_finished_then_replays_partial(h: &Harness) {
    let f = fixture(h);
    let alice = principal("team-a", "alice");
    let begun = f
        .engine
        .begin_steps(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
        .await
        .unwrap();
    let Begun::Started {
        operation_id,
        first_result,
        status_ref,
    } = begun
    else {
        panic!("expected a fresh start, got {begun:?}");
    };
    assert_eq!(first_result, json!({"id": 1, "name": "gear"}));
    // Committed: visible from another handle.
    assert_eq!(f.count("widgets").await, 1);
    let err = f
        .engine
        .begin_steps(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::OperationInProgress);
    assert_eq!(
        code(
            f.engine
                .execute_inline(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
                .await
        ),
        ErrorCode::OperationInProgress
    );
    f.engine
        .record_event(operation_id, "watcher_attempt", json!({"attempt": 1}))
        .await
        .unwrap();
    let done = f
        .engine
        .finish_steps(
            operation_id,
            OperationState::Partial,
            json!({"issue": 1, "watcher": "failed"}),
            vec![("compensation_failed".into(), json!({"reason": "x"}))],
        )
        .await
        .unwrap();
    assert_eq!(done.state, OperationState::Partial);
    assert_eq!(done.status_ref, status_ref);
    assert!(!done.replayed);

    let replay = f
        .engine
        .begin_steps(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
        .await
        .unwrap();
    match replay {
        Begun::Replayed(o) => {
            assert!(o.replayed);
            assert_eq!(o.state, OperationState::Partial);
            assert_eq!(o.result, json!({"issue": 1, "watcher": "failed"}));
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    let kinds: Vec<String> = f
        .engine
        .events(operation_id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        ["first_step", "watcher_attempt", "compensation_failed"]
    );
    // Finishing twice is refused and changes nothing.
    let err = f
        .engine
        .finish_steps(operation_id, OperationState::Applied, json!({}), vec![])
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::OperationConflict);
    let err = f
        .engine
        .finish_steps(operation_id, OperationState::Failed, json!({}), vec![])
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidArguments);
    assert_eq!(
        f.engine
            .record_event(999, "x", json!(null))
            .await
            .unwrap_err()
            .code,
        ErrorCode::NotFound
    );
    assert_eq!(f.count("widgets").await, 1);
}

fn recording_hook() -> (Arc<Mutex<Vec<FaultPoint>>>, toolledger::engine::FaultHook) {
    let seen: Arc<Mutex<Vec<FaultPoint>>> = Arc::default();
    let s = seen.clone();
    (seen, Arc::new(move |p| s.lock().unwrap().push(p)))
}

async fn fault_points_fire_in_order_on_fresh_calls_only(h: &Harness) {
    let f = fixture(h);
    let (seen, hook) = recording_hook();
    let engine = f.engine.clone().with_fault_hook(hook);
    let alice = principal("team-a", "alice");
    engine
        .execute_inline(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
        .await
        .unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [
            FaultPoint::AfterLedgerInsert,
            FaultPoint::AfterEffect,
            FaultPoint::AfterCommit
        ]
    );
    seen.lock().unwrap().clear();
    assert!(
        engine
            .execute_inline(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
            .await
            .unwrap()
            .replayed
    );
    assert!(seen.lock().unwrap().is_empty(), "no fault on a replay");
    // A refused call reaches no fault point either.
    let _ = engine
        .execute_inline(call(&alice, "k1", "cog"), MakeWidget::new("cog"))
        .await;
    assert!(seen.lock().unwrap().is_empty());
}

/// A crash (the fault hook panics) at `point`, before the commit, leaves neither ledger row
/// nor effect, and the retry is a fresh call.
async fn crash_before_commit(h: &Harness, point: FaultPoint) {
    let f = fixture(h);
    let engine = f.engine.clone().with_fault_hook(Arc::new(move |p| {
        if p == point {
            panic!("simulated crash");
        }
    }));
    let alice = principal("team-a", "alice");
    let err = engine
        .execute_inline(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Unavailable, "{point:?}");
    assert_eq!(f.count("operations").await, 0, "{point:?}");
    assert_eq!(f.count("widgets").await, 0, "{point:?}");
    // The retry is a fresh call.
    let o = f
        .engine
        .execute_inline(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
        .await
        .unwrap();
    assert!(!o.replayed);
}

async fn a_crash_after_the_ledger_insert_leaves_neither_ledger_row_nor_effect(h: &Harness) {
    crash_before_commit(h, FaultPoint::AfterLedgerInsert).await;
}

async fn a_crash_after_the_effect_leaves_neither_ledger_row_nor_effect(h: &Harness) {
    crash_before_commit(h, FaultPoint::AfterEffect).await;
}

async fn effect_failure_and_ledger_write_failure_roll_back_everything(h: &Harness) {
    let f = fixture(h);
    let alice = principal("team-a", "alice");
    let failing = Arc::new(MakeWidget {
        name: "gear".into(),
        fail_after_insert: true,
        replay_checks: Arc::default(),
    });
    let err = f
        .engine
        .execute_inline(call(&alice, "k1", "gear"), failing)
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::VersionConflict);
    assert_eq!(f.count("widgets").await, 0);
    assert_eq!(f.count("operations").await, 0);

    // A constraint inside the effect.
    let long = "x".repeat(40);
    let err = f
        .engine
        .execute_inline(call(&alice, "k1", &long), MakeWidget::new(&long))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Unavailable);
    assert!(!err.message.contains("length"), "{}", err.message);

    // The ledger's own write (after the effect ran) refused.
    h.fail_inserts_into(f.engine.store(), "operations").await;
    let err = f
        .engine
        .execute_inline(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Unavailable);
    assert_eq!(f.count("widgets").await, 0);
    assert_eq!(f.count("operations").await, 0);
    h.allow_inserts_into(f.engine.store(), "operations").await;
    assert!(
        !f.engine
            .execute_inline(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(f.count("widgets").await, 1);
}

async fn malformed_calls_are_invalid_arguments_and_write_nothing(h: &Harness) {
    let f = fixture(h);
    let alice = principal("team-a", "alice");
    let mut bad = vec![
        call(&alice, "", "gear"),
        call(&alice, &"k".repeat(257), "gear"),
        call(&alice, "k\u{0}1", "gear"),
        call(&principal("team\u{0}a", "alice"), "k1", "gear"),
    ];
    let mut c = call(&alice, "k1", "gear");
    c.arguments = json!({"name": 9.1e15});
    bad.push(c);
    let mut c = call(&alice, "k1", "gear");
    c.arguments = json!({"n": 9_007_199_254_740_992u64});
    bad.push(c);
    let mut c = call(&alice, "k1", "gear");
    c.fingerprint = Some("ABC".into());
    bad.push(c);
    bad.push(call(&principal("", "alice"), "k1", "gear"));
    for c in bad {
        let err = f
            .engine
            .execute_inline(c, MakeWidget::new("gear"))
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArguments, "{err}");
    }
    assert_eq!(f.count("operations").await, 0);
    assert_eq!(f.count("widgets").await, 0);
}

async fn non_canonical_stored_json_never_reaches_a_caller(h: &Harness) {
    let f = fixture(h);
    let alice = principal("team-a", "alice");
    f.engine
        .execute_inline(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
        .await
        .unwrap();
    let store = f.engine.store();
    // A non-canonical result whose digest matches its (altered) bytes.
    let text = r#"{"name":"gear", "id":1}"#;
    use sha2::Digest;
    let digest = hex::encode(sha2::Sha256::digest(text.as_bytes()));
    execute_batch(
        store,
        &format!("UPDATE operations SET result = '{text}', result_digest = '{digest}'"),
    )
    .await;
    let err = f
        .engine
        .execute_inline(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Unavailable);
    assert!(err.message.contains("storage contract"), "{}", err.message);
    assert!(f
        .engine
        .lookup("team-a", "alice", "make_widget", "k1")
        .await
        .is_err());

    // Canonical text but a digest that does not match.
    execute_batch(
        store,
        r#"UPDATE operations SET result = '{"id":2,"name":"gear"}', result_digest = (
             SELECT result_digest FROM operations)"#,
    )
    .await;
    let err = f
        .engine
        .execute_inline(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
        .await
        .unwrap_err();
    assert!(err.message.contains("storage contract"), "{}", err.message);

    // Duplicate keys in stored arguments.
    let good = r#"{"id":1,"name":"gear"}"#;
    let digest = hex::encode(sha2::Sha256::digest(good.as_bytes()));
    execute_batch(
        store,
        &format!(
            r#"UPDATE operations SET result = '{good}', result_digest = '{digest}',
             arguments = '{{"name":"gear","name":"gear"}}'"#
        ),
    )
    .await;
    assert!(f
        .engine
        .lookup("team-a", "alice", "make_widget", "k1")
        .await
        .is_err());
    execute_batch(
        store,
        r#"UPDATE operations SET arguments = '{"name":"gear"}'"#,
    )
    .await;
    let o = f
        .engine
        .execute_inline(call(&alice, "k1", "gear"), MakeWidget::new("gear"))
        .await
        .unwrap();
    assert!(o.replayed);
    assert_eq!(o.result, json!({"id": 1, "name": "gear"}));
    assert_eq!(f.count("widgets").await, 1);
}

both_drivers!(
    exact_retry_replays_the_stored_result_without_a_second_effect,
    same_key_with_another_intent_is_a_conflict_and_writes_nothing,
    authorization_runs_before_the_ledger_lookup,
    authority_deadline_blocks_even_an_exact_replay_but_not_a_status_read,
    deadline_boundary_is_half_open,
    retention_expiry_leaves_a_tombstone_that_keeps_the_key_used,
    a_fresh_call_past_its_own_deadline_writes_nothing,
    shared_key_namespace_refuses_a_key_held_by_another_principal,
    multi_step_operation_is_in_progress_until_finished_then_replays_partial,
    fault_points_fire_in_order_on_fresh_calls_only,
    a_crash_after_the_ledger_insert_leaves_neither_ledger_row_nor_effect,
    a_crash_after_the_effect_leaves_neither_ledger_row_nor_effect,
    effect_failure_and_ledger_write_failure_roll_back_everything,
    malformed_calls_are_invalid_arguments_and_write_nothing,
    non_canonical_stored_json_never_reaches_a_caller,
);
