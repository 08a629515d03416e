//! Eight OS processes contending on one ledger file: one intent for one scope, one winner
//! among different intents under one key, one claim among eight workers. This shows local
//! uniqueness across processes on one host; it does not show distributed exactly-once.

mod support;

use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};

use support::runtime::*;

const T0: i64 = 1_767_225_600;

/// Runs the argument lists as simultaneous processes (released together by a barrier).
fn race(arg_lists: Vec<Vec<String>>) -> Vec<Run> {
    let barrier = Arc::new(Barrier::new(arg_lists.len()));
    let handles: Vec<_> = arg_lists
        .into_iter()
        .map(|args| {
            let b = barrier.clone();
            std::thread::spawn(move || {
                b.wait();
                Run::from(
                    Command::new(BIN)
                        .args(&args)
                        .stdin(Stdio::null())
                        .output()
                        .unwrap(),
                )
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn eight_processes_dispatching_the_same_intent_create_one_intent() {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    let args: Vec<Vec<String>> = (0..8)
        .map(|_| {
            vec![
                "dispatch".into(),
                "--db".into(),
                d.db().into(),
                "--fixture".into(),
                f.to_str().unwrap().into(),
                "--failure".into(),
                "after_intent_commit".into(),
            ]
        })
        .collect();
    let runs = race(args);
    let mut refs = std::collections::BTreeSet::new();
    for r in &runs {
        assert_eq!(r.code, 1, "{} {}", r.stdout, r.stderr);
        assert_eq!(r.json()["code"], "OUTCOME_UNKNOWN");
        refs.insert(r.json()["status_ref"].as_str().unwrap().to_string());
    }
    assert_eq!(refs.len(), 1);
    assert_eq!(d.int("SELECT count(*) FROM operations"), 1);
    assert_eq!(d.int("SELECT count(*) FROM outbox"), 1);
    assert_eq!(d.downstream_receipts(), 0);
}

#[test]
fn eight_processes_with_different_intents_under_one_key_have_one_winner() {
    let d = Db::new();
    let mut args = Vec::new();
    for i in 0..8 {
        let f = variant(
            d.dir.path(),
            &format!("f{i}.json"),
            &[
                (
                    "\"amount_cents\": 1250",
                    &format!("\"amount_cents\": {}", 1000 + i),
                ),
                (
                    "\"approval\": \"approval-ord-1001-a\"",
                    &format!("\"approval\": \"approval-contender-{i}\""),
                ),
            ],
        );
        assert_eq!(d.approve(&f, "bob").code, 0);
        args.push(vec![
            "dispatch".to_string(),
            "--db".into(),
            d.db().into(),
            "--fixture".into(),
            f.to_str().unwrap().into(),
        ]);
    }
    let runs = race(args);
    let winners = runs.iter().filter(|r| r.code == 0).count();
    let conflicts = runs
        .iter()
        .filter(|r| r.code == 1 && r.json()["code"] == "OPERATION_CONFLICT")
        .count();
    assert_eq!(
        (winners, conflicts),
        (1, 7),
        "{:?}",
        runs.iter().map(|r| &r.stdout).collect::<Vec<_>>()
    );
    assert_eq!(d.int("SELECT count(*) FROM operations"), 1);
    assert_eq!(d.downstream_receipts(), 1);
    assert_eq!(
        d.int("SELECT count(*) FROM approvals WHERE consumed_at IS NOT NULL"),
        1
    );
}

#[test]
fn eight_worker_processes_claiming_one_event_deliver_it_once() {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    assert_eq!(
        d.dispatch(&f, &["--failure", "after_intent_commit"]).code,
        1
    );
    let args: Vec<Vec<String>> = (0..8)
        .map(|i| {
            vec![
                "worker".into(),
                "--once".into(),
                "--db".into(),
                d.db().into(),
                "--clock-epoch".into(),
                T0.to_string(),
                "--worker-id".into(),
                format!("w{i}"),
            ]
        })
        .collect();
    let runs = race(args);
    let delivered: u64 = runs
        .iter()
        .map(|r| {
            assert_eq!(r.code, 0, "{}", r.stderr);
            r.json()["delivered"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(delivered, 1);
    assert_eq!(d.int("SELECT fencing_token FROM outbox"), 1, "one claim");
    assert_eq!(d.int("SELECT attempt_count FROM outbox"), 1);
    assert_eq!(d.int("SELECT count(*) FROM local_receipts"), 1);
    assert_eq!(d.downstream_receipts(), 1);
}
