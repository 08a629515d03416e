//! The guard's own rules, without a transport: fingerprints, continuation binding, deadlines
//! taken from the token, and the reply shape.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use toolledger::clock::ManualClock;
use toolledger::effect::EffectTx;
use toolledger::engine::{Engine, InlineEffect};
use toolledger::model::{Error, ErrorCode, Principal, ToolContract};
use toolledger::store::sqlite::{OpenOptions, SqliteStore};
use toolledger_mcp::guard::{outcome_json, GuardedRequest};
use toolledger_mcp::{Caller, Guard, GuardConfig, KeyMaterial};

fn caller(name: &str) -> Caller {
    Caller {
        name: name.into(),
        principal: Principal {
            tenant: "acme".into(),
            subject: name.into(),
            roles: BTreeSet::new(),
            scopes: BTreeSet::new(),
        },
    }
}

fn guard(dir: &std::path::Path, clock: &ManualClock) -> Guard {
    let store = SqliteStore::open(dir.join("g.sqlite"), OpenOptions::new("sqlite:guard")).unwrap();
    let keys =
        KeyMaterial::from_values(Some("11".repeat(32)), Some("22".repeat(32)), None).unwrap();
    let config = GuardConfig {
        authority_ttl: 100,
        retention_ttl: 1000,
        request_state_ttl: 50,
        shared_key_namespace: true,
    };
    Guard::new(Engine::new(store, Arc::new(clock.clone())), &keys, config).unwrap()
}

fn args(title: &str) -> Map<String, Value> {
    match json!({"operation_id": "op-1", "title": title}) {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

struct Noop;

impl InlineEffect for Noop {
    fn apply(&self, _tx: &mut dyn EffectTx, _p: &Principal) -> Result<Value, Error> {
        Ok(json!({"effectId": 7, "result": "done"}))
    }
}

#[test]
fn fingerprints_separate_callers_states_and_answers_but_not_identical_requests() {
    let dir = tempfile::tempdir().unwrap();
    let g = guard(dir.path(), &ManualClock::new(1000));
    let contract = ToolContract::uniform("create_issue", "1.0");
    let (alice, bob) = (caller("alice"), caller("bob"));
    let a = args("spec");
    let req = |c| GuardedRequest {
        caller: c,
        contract: &contract,
        operation_id: "op-1",
        arguments: &a,
    };
    let answer = json!({"body": {"action": "accept", "content": {"body": "x"}}});
    let base = g
        .fingerprint(&req(&alice), Some(json!("s1")), Some(answer.clone()))
        .unwrap();
    assert_eq!(
        base,
        g.fingerprint(&req(&alice), Some(json!("s1")), Some(answer.clone()))
            .unwrap()
    );
    for other in [
        g.fingerprint(&req(&bob), Some(json!("s1")), Some(answer.clone())),
        g.fingerprint(&req(&alice), Some(json!("s2")), Some(answer.clone())),
        g.fingerprint(&req(&alice), Some(json!("s1")), None),
        g.fingerprint(&req(&alice), None, Some(answer.clone())),
    ] {
        assert_ne!(other.unwrap(), base);
    }
    let e1 = g.elicited(&req(&alice), "awaiting-body", &answer).unwrap();
    let e2 = g.elicited(&req(&alice), "awaiting-body", &answer).unwrap();
    assert_eq!(e1.fingerprint, e2.fingerprint);
    assert_eq!(e1.binding.authority_deadline, 1100);
    assert_eq!(e1.binding.retention_deadline, 2000);
}

#[test]
fn a_continuation_is_bound_to_its_arguments_and_expires_on_the_guard_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1000);
    let g = guard(dir.path(), &clock);
    let contract = ToolContract::uniform("create_issue", "1.0");
    let alice = caller("alice");
    let a = args("spec");
    let b = args("other");
    let req_a = GuardedRequest {
        caller: &alice,
        contract: &contract,
        operation_id: "op-1",
        arguments: &a,
    };
    let req_b = GuardedRequest {
        arguments: &b,
        ..req_a
    };
    let ir = g.first_round(&req_a, "awaiting-body", vec![]).unwrap();
    let token = ir.request_state.unwrap();
    let answer = json!({});
    let resumed = g.resume(&req_a, &token, &answer).unwrap();
    assert_eq!(resumed.binding.issued_at, 1000);
    assert_eq!(resumed.binding.authority_deadline, 1100);
    assert_eq!(
        g.resume(&req_b, &token, &answer).unwrap_err().code,
        ErrorCode::RequestStateInvalid
    );
    clock.set(1050);
    assert_eq!(
        g.resume(&req_a, &token, &answer).unwrap_err().code,
        ErrorCode::RequestStateInvalid
    );
}

#[tokio::test]
async fn run_replays_and_the_reply_merges_the_stored_result() {
    let dir = tempfile::tempdir().unwrap();
    let g = guard(dir.path(), &ManualClock::new(1000));
    let contract = ToolContract::uniform("note", "1");
    let alice = caller("alice");
    let a = args("spec");
    let req = GuardedRequest {
        caller: &alice,
        contract: &contract,
        operation_id: "op-1",
        arguments: &a,
    };
    let first = g.run(&req, json!({"t": 1}), Arc::new(Noop)).await.unwrap();
    let again = g.run(&req, json!({"t": 1}), Arc::new(Noop)).await.unwrap();
    assert!(!first.replayed && again.replayed);
    assert_eq!(
        outcome_json("op-1", &again),
        json!({"operationId": "op-1", "effectId": 7, "result": "done", "replayed": true,
               "state": "applied"})
    );
    let changed = g
        .run(&req, json!({"t": 2}), Arc::new(Noop))
        .await
        .unwrap_err();
    assert_eq!(changed.code, ErrorCode::OperationConflict);
}
