//! Inline effects through the engine: multi-step operations and their finish, rollback of the
//! whole call on a failure, and handles racing one scope.

use std::sync::Arc;

use serde_json::json;

use toolledger::engine::{Begun, Engine, Outcome};
use toolledger::model::{ErrorCode, OperationState};

use super::harness::{code, engine, widget, widget_call, Harness, WidgetEffect};
use crate::calls::principal;
use crate::db::count;

/// Multi-step: the first step commits with an `in_progress` row; a retry meanwhile is
/// `operation_in_progress`; finishing stores the result and events; a retry then replays.
pub async fn multi_step_operations(h: &Harness) {
    let (e, _) = engine(h);
    let p = principal("t1", "alice");
    let begun = e
        .begin_steps(widget_call(&p, "k1", "a"), widget("a"))
        .await
        .unwrap();
    let Begun::Started {
        operation_id,
        first_result,
        ..
    } = begun
    else {
        panic!("expected a fresh start");
    };
    assert_eq!(
        code(e.begin_steps(widget_call(&p, "k1", "a"), widget("a")).await),
        ErrorCode::OperationInProgress
    );
    let done = e
        .finish_steps(
            operation_id,
            OperationState::Partial,
            first_result.clone(),
            vec![("second_failed".into(), json!({"why": "test"}))],
        )
        .await
        .unwrap();
    assert_eq!(done.state, OperationState::Partial);
    assert_eq!(
        code(
            e.finish_steps(operation_id, OperationState::Applied, json!({}), vec![])
                .await
        ),
        ErrorCode::OperationConflict
    );
    let replay = e
        .begin_steps(widget_call(&p, "k1", "a"), widget("a"))
        .await
        .unwrap();
    assert!(matches!(
        replay,
        Begun::Replayed(Outcome { replayed: true, .. })
    ));
    let kinds: Vec<String> = e
        .events(operation_id)
        .await
        .unwrap()
        .into_iter()
        .map(|ev| ev.kind)
        .collect();
    assert_eq!(kinds, ["first_step", "second_failed"]);
    assert_eq!(count(e.store(), "widgets").await, 1);
}

/// Two handles finishing one multi-step operation at once: one finishes it, the other gets
/// `operation_conflict` and records nothing.
pub async fn racing_finishes_of_one_operation_have_one_winner(h: &Harness) {
    let (e, clock) = engine(h);
    let p = principal("t1", "alice");
    let Begun::Started { operation_id, .. } = e
        .begin_steps(widget_call(&p, "k1", "a"), widget("a"))
        .await
        .unwrap()
    else {
        panic!("expected a fresh start");
    };
    let mut tasks = Vec::new();
    for i in 0..8 {
        let other = Engine::new(h.open(), Arc::new(clock.clone()));
        tasks.push(tokio::spawn(async move {
            other
                .finish_steps(
                    operation_id,
                    OperationState::Applied,
                    json!({"finisher": i}),
                    vec![("finished".into(), json!({"by": i}))],
                )
                .await
        }));
    }
    let mut won = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(o) => won.push(o.result),
            Err(err) => assert_eq!(err.code, ErrorCode::OperationConflict, "{err:?}"),
        }
    }
    assert_eq!(won.len(), 1);
    let events = e.events(operation_id).await.unwrap();
    let finished: Vec<_> = events.iter().filter(|ev| ev.kind == "finished").collect();
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0].detail["by"], won[0]["finisher"]);
    let rec = e
        .lookup("t1", "alice", "make_widget", "k1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.result.as_ref(), Some(&won[0]));
}

/// A failure after the effect wrote — an effect error, a database CHECK, an injected trigger
/// failure — rolls the whole call back: no ledger row, no effect row; later calls succeed.
pub async fn rollback_on_injected_failure(h: &Harness) {
    let (e, _) = engine(h);
    let p = principal("t1", "alice");
    let failing = Arc::new(WidgetEffect {
        name: "a".into(),
        fail_after_insert: true,
    });
    assert_eq!(
        code(e.execute_inline(widget_call(&p, "k1", "a"), failing).await),
        ErrorCode::VersionConflict
    );
    let long = "x".repeat(40);
    assert_eq!(
        code(
            e.execute_inline(widget_call(&p, "k2", &long), widget(&long))
                .await
        ),
        ErrorCode::Unavailable
    );
    h.fail_inserts_into(e.store(), "widgets").await;
    let err = e
        .execute_inline(widget_call(&p, "k3", "c"), widget("c"))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Unavailable);
    assert!(!err.message.contains("injected"), "{}", err.message);
    assert!(
        !err.message.to_ascii_uppercase().contains("INSERT"),
        "{}",
        err.message
    );
    assert_eq!(count(e.store(), "operations").await, 0);
    assert_eq!(count(e.store(), "widgets").await, 0);
    h.allow_inserts_into(e.store(), "widgets").await;
    e.execute_inline(widget_call(&p, "k3", "c"), widget("c"))
        .await
        .unwrap();
    assert_eq!(count(e.store(), "widgets").await, 1);
}

/// Eight handles race one scope: one effect, one fresh answer, seven replays. Eight handles
/// race one key with different intents: one winner, seven conflicts.
pub async fn contention_eight_handles(h: &Harness) {
    let (e0, clock) = engine(h);
    let p = principal("t1", "alice");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let e = Engine::new(h.open(), Arc::new(clock.clone()));
        let call = widget_call(&p, "same", "a");
        tasks.push(tokio::spawn(async move {
            e.execute_inline(call, widget("a")).await
        }));
    }
    let mut fresh = 0;
    let mut replays = 0;
    for t in tasks {
        let out = t.await.unwrap().unwrap();
        if out.replayed {
            replays += 1;
        } else {
            fresh += 1;
        }
    }
    assert_eq!((fresh, replays), (1, 7));
    assert_eq!(count(e0.store(), "widgets").await, 1);

    let mut tasks = Vec::new();
    for i in 0..8 {
        let e = Engine::new(h.open(), Arc::new(clock.clone()));
        let name = format!("n{i}");
        let call = widget_call(&p, "contested", &name);
        tasks.push(tokio::spawn(async move {
            e.execute_inline(call, widget(&name)).await
        }));
    }
    let mut won = 0;
    let mut conflicts = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(o) => {
                assert!(!o.replayed);
                won += 1;
            }
            Err(err) => {
                assert_eq!(err.code, ErrorCode::OperationConflict, "{err:?}");
                conflicts += 1;
            }
        }
    }
    assert_eq!((won, conflicts), (1, 7));
    assert_eq!(count(e0.store(), "widgets").await, 2);
    assert_eq!(count(e0.store(), "operations").await, 2);
}

/// Many principals racing one shared-namespace key from separate handles: exactly one wins.
pub async fn contention_shared_namespace(h: &Harness) {
    let (e0, clock) = engine(h);
    let mut tasks = Vec::new();
    for i in 0..8 {
        let e = Engine::new(h.open(), Arc::new(clock.clone()));
        let mut call = widget_call(&principal("t1", &format!("user{i}")), "op-x", "a");
        call.shared_key_namespace = true;
        tasks.push(tokio::spawn(async move {
            e.execute_inline(call, widget("a")).await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(err) => assert_eq!(err.code, ErrorCode::OperationConflict, "{err:?}"),
        }
    }
    assert_eq!(ok, 1);
    assert_eq!(count(e0.store(), "operations").await, 1);
    assert_eq!(count(e0.store(), "widgets").await, 1);
}
