//! An external call as a deferred effect (`runtime::External`, `Registry::external`), on every
//! driver: the call runs once per operation with the operation's status reference as its
//! idempotency key and its answer is replayed; a lost answer is `outcome_unknown` and is never
//! called again by a retry; the lookup reconciles what the API did; a call that certainly
//! sent nothing is tried again; a definitive refusal is stored and replayed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;
use toolledger::clock::ManualClock;
use toolledger::downstream::DownstreamError;
use toolledger::runtime::{
    Answer, DeferredCall, Delivery, External, ExternalRequest, ProviderContext, Registry, Runtime,
    StatusQuery,
};
use toolledger::{OperationState, ToolContract};
use toolledger_testkit::conformance::harness::{Harness, T0};

/// What the fake API saw and will answer.
#[derive(Default)]
struct Api {
    calls: AtomicUsize,
    seen: Mutex<Vec<ExternalRequest>>,
    /// The answers of successive calls; after the last, the last again.
    answers: Mutex<Vec<Result<Value, DownstreamError>>>,
    /// What the lookup finds.
    found: Mutex<Option<Value>>,
}

impl Api {
    fn answering(answers: Vec<Result<Value, DownstreamError>>) -> Arc<Api> {
        Arc::new(Api {
            answers: Mutex::new(answers),
            ..Api::default()
        })
    }

    fn external(self: &Arc<Api>, with_lookup: bool) -> External {
        let api = self.clone();
        let external = External::new(move |r: ExternalRequest| {
            let api = api.clone();
            async move {
                api.calls.fetch_add(1, Ordering::SeqCst);
                api.seen.lock().unwrap().push(r);
                let mut answers = api.answers.lock().unwrap();
                if answers.len() > 1 {
                    answers.remove(0)
                } else {
                    answers[0].clone()
                }
            }
        });
        if !with_lookup {
            return external;
        }
        let api = self.clone();
        external.with_lookup(move |r: ExternalRequest| {
            let api = api.clone();
            async move {
                api.seen.lock().unwrap().push(r);
                Ok(api.found.lock().unwrap().clone())
            }
        })
    }

    /// The idempotency keys of every call and lookup, in order.
    fn keys(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        seen.iter().map(|r| r.idempotency_key.clone()).collect()
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

async fn runtime(h: &Harness, api: &Arc<Api>, with_lookup: bool) -> Runtime {
    let store = h.open();
    let principals = PrincipalStore::new(store.clone());
    for who in ["alice", "bob"] {
        principals.add(who, "t1", &[], &[], false).await.unwrap();
    }
    let registry = Registry::new().external(
        ToolContract::uniform("send_email", "1"),
        api.external(with_lookup),
    );
    Runtime::new(store, Arc::new(ManualClock::new(T0)), registry)
}

fn send(principal: &str, key: &str, to: &str) -> DeferredCall {
    DeferredCall {
        new_intent: false,
        principal: principal.into(),
        tool: "send_email".into(),
        key: key.into(),
        arguments: json!({"to": to}),
        approval_id: None,
        provider: ProviderContext::mcp(key),
    }
}

fn status_query(call: &DeferredCall, status_ref: &str) -> StatusQuery {
    StatusQuery {
        principal: call.principal.clone(),
        tool: call.tool.clone(),
        key: call.key.clone(),
        arguments: call.arguments.clone(),
        provider: call.provider.clone(),
        status_ref: status_ref.into(),
    }
}

fn done(answer: &Answer) -> (OperationState, Delivery, Value) {
    match answer {
        Answer::Done {
            state,
            delivery,
            result,
            ..
        } => (*state, *delivery, result.clone()),
        other => panic!("expected a finished operation, got {other:?}"),
    }
}

async fn the_call_runs_once_under_the_operations_key_and_its_answer_is_replayed(h: &Harness) {
    let driver = h.dialect();
    let api = Api::answering(vec![Ok(json!({"message_id": "m-1"}))]);
    let rt = runtime(h, &api, false).await;
    let call = send("alice", "mail-1", "ap@example.com");
    let first = rt.dispatch(&call, None).await.unwrap();
    assert_eq!(
        done(&first),
        (
            OperationState::Succeeded,
            Delivery::Fresh,
            json!({"message_id": "m-1"})
        ),
        "{driver:?}"
    );
    let seen = api.seen.lock().unwrap()[0].clone();
    assert_eq!(seen.idempotency_key, first.status_ref(), "{driver:?}");
    assert_eq!(seen.tool, "send_email");
    assert_eq!(seen.arguments, json!({"to": "ap@example.com"}));

    let again = rt.dispatch(&call, None).await.unwrap();
    assert_eq!(
        done(&again),
        (
            OperationState::Succeeded,
            Delivery::LocalReplay,
            json!({"message_id": "m-1"})
        ),
        "{driver:?}"
    );
    assert_eq!(api.calls(), 1, "{driver:?}: a retry must not call the API");

    // Another principal's operation under the same id is its own, with its own key.
    let bobs = rt
        .dispatch(&send("bob", "mail-1", "ap@example.com"), None)
        .await
        .unwrap();
    assert_eq!(api.calls(), 2, "{driver:?}");
    let keys = api.keys();
    assert_eq!(keys, [first.status_ref(), bobs.status_ref()], "{driver:?}");
    assert_ne!(keys[0], keys[1], "{driver:?}");
}

async fn a_lost_answer_stays_unknown_and_is_never_called_again(h: &Harness) {
    let driver = h.dialect();
    let api = Api::answering(vec![Err(DownstreamError::Unavailable("reset".into()))]);
    let rt = runtime(h, &api, false).await;
    let call = send("alice", "mail-1", "ap@example.com");
    let lost = rt.dispatch(&call, None).await.unwrap();
    let Answer::Unknown { state, status_ref } = &lost else {
        panic!("{driver:?}: expected outcome_unknown, got {lost:?}");
    };
    assert_eq!(*state, OperationState::OutcomeUnknown, "{driver:?}");
    for _ in 0..2 {
        let retry = rt.dispatch(&call, None).await.unwrap();
        assert!(
            matches!(retry, Answer::Unknown { .. }),
            "{driver:?}: {retry:?}"
        );
    }
    // Without a lookup a status query cannot tell: still unknown, and still one call.
    let asked = rt.status(&status_query(&call, status_ref)).await.unwrap();
    assert!(
        matches!(asked, Answer::Unknown { .. }),
        "{driver:?}: {asked:?}"
    );
    assert_eq!(
        api.calls(),
        1,
        "{driver:?}: an unknown outcome must not be sent again"
    );
}

async fn the_lookup_reconciles_what_the_api_did(h: &Harness) {
    let driver = h.dialect();
    let api = Api::answering(vec![Err(DownstreamError::Unavailable("timeout".into()))]);
    let rt = runtime(h, &api, true).await;
    let call = send("alice", "mail-1", "ap@example.com");
    let lost = rt.dispatch(&call, None).await.unwrap();
    let status_ref = lost.status_ref().to_string();

    // The API shows nothing yet: absence is not proof, the outcome stays unknown.
    let nothing = rt.status(&status_query(&call, &status_ref)).await.unwrap();
    assert!(
        matches!(nothing, Answer::Unknown { .. }),
        "{driver:?}: {nothing:?}"
    );

    *api.found.lock().unwrap() = Some(json!({"message_id": "m-9"}));
    let found = rt.status(&status_query(&call, &status_ref)).await.unwrap();
    assert_eq!(
        done(&found),
        (
            OperationState::Succeeded,
            Delivery::ReceiptReconciled,
            json!({"message_id": "m-9"})
        ),
        "{driver:?}"
    );
    let looked_up = api.seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(looked_up.idempotency_key, status_ref, "{driver:?}");
    assert_eq!(looked_up.arguments, json!({"to": "ap@example.com"}));

    let replay = rt.dispatch(&call, None).await.unwrap();
    assert_eq!(done(&replay).2, json!({"message_id": "m-9"}), "{driver:?}");
    assert_eq!(api.calls(), 1, "{driver:?}");
}

async fn nothing_sent_is_tried_again_and_a_refusal_is_stored(h: &Harness) {
    let driver = h.dialect();
    let api = Api::answering(vec![
        Err(DownstreamError::NotSent("connection refused".into())),
        Ok(json!({"message_id": "m-2"})),
    ]);
    let rt = runtime(h, &api, false).await;
    let call = send("alice", "mail-1", "ap@example.com");
    let first = rt.dispatch(&call, None).await.unwrap();
    assert!(
        matches!(
            first,
            Answer::Unknown {
                state: OperationState::Accepted,
                ..
            }
        ),
        "{driver:?}: nothing was sent, so the intent waits: {first:?}"
    );
    // The next delivery of the same operation (here the worker's pass) sends it.
    rt.run_pass("test-worker", 10).await.unwrap();
    let sent = rt.dispatch(&call, None).await.unwrap();
    assert_eq!(done(&sent).2, json!({"message_id": "m-2"}), "{driver:?}");
    assert_eq!(api.calls(), 2, "{driver:?}");
    let keys = api.keys();
    assert_eq!(
        keys[0], keys[1],
        "{driver:?}: the same operation, the same key"
    );

    let refusing = Api::answering(vec![Err(DownstreamError::Refused {
        code: "mailbox_unknown".into(),
        message: "no such mailbox".into(),
    })]);
    let rt = runtime_again(h, &refusing).await;
    let call = send("alice", "mail-2", "nobody@example.com");
    let refused = rt.dispatch(&call, None).await.unwrap();
    let (state, _, result) = done(&refused);
    assert_eq!(state, OperationState::Failed, "{driver:?}");
    assert_eq!(result["code"], "mailbox_unknown", "{driver:?}: {result}");
    let replayed = rt.dispatch(&call, None).await.unwrap();
    assert_eq!(done(&replayed).2, result, "{driver:?}");
    assert_eq!(refusing.calls(), 1, "{driver:?}");
}

/// A second runtime on the same database (its principals already exist).
async fn runtime_again(h: &Harness, api: &Arc<Api>) -> Runtime {
    let registry = Registry::new().external(
        ToolContract::uniform("send_email", "1"),
        api.external(false),
    );
    Runtime::new(h.open(), Arc::new(ManualClock::new(T0)), registry)
}

toolledger_testkit::both_drivers!(
    the_call_runs_once_under_the_operations_key_and_its_answer_is_replayed,
    a_lost_answer_stays_unknown_and_is_never_called_again,
    the_lookup_reconciles_what_the_api_did,
    nothing_sent_is_tried_again_and_a_refusal_is_stored,
);
