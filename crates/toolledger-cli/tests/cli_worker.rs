//! `toolledger worker` through the built binary: `--max-attempts` applied at claim time,
//! events under live leases reported as skipped, each failure a JSON line on stderr, and bad
//! options refused before the ledger is touched.

mod support;

use serde_json::Value;
use support::runtime::*;

/// The fixtures' clock.
const T0: i64 = 1_767_225_600;

/// A ledger whose one refund was claimed at T0 by a process that then stopped (its lease runs
/// until T0 + 30).
fn claimed_and_abandoned() -> Db {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    let r = d.dispatch(&f, &["--failure", "after_claim"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(d.text("SELECT state FROM outbox"), "processing");
    assert_eq!(d.int("SELECT attempt_count FROM outbox"), 1);
    d
}

fn worker(d: &Db, at: i64, extra: &[&str]) -> Run {
    let at = at.to_string();
    let mut args = vec!["--once", "--clock-epoch", &at];
    args.extend_from_slice(extra);
    d.run("worker", &args)
}

#[test]
fn once_reports_an_event_under_a_live_lease_as_skipped() {
    let d = claimed_and_abandoned();
    let w = worker(&d, T0 + 10, &[]);
    assert_eq!(w.code, 0, "{}", w.stderr);
    let v = w.json();
    assert_eq!(v["skipped"], 1, "{v}");
    assert_eq!(v["delivered"], 0);
    assert_eq!(v["stopped_by"], "once");
    assert_eq!(d.downstream_receipts(), 0);
    assert_eq!(d.text("SELECT state FROM outbox"), "processing");
    // Once the lease has run out, the event is taken over and nothing is skipped.
    let w = worker(&d, T0 + 30, &[]);
    assert_eq!(w.json()["skipped"], 0);
    assert_eq!(w.json()["delivered"], 1);
}

#[test]
fn max_attempts_is_applied_when_the_worker_claims() {
    // The event was enqueued allowing 5 claims; this worker allows 1, already used.
    let d = claimed_and_abandoned();
    assert_eq!(d.int("SELECT max_attempts FROM outbox"), 5);
    let w = worker(&d, T0 + 30, &["--max-attempts", "1"]);
    assert_eq!(w.code, 0, "{}", w.stderr);
    let v = w.json();
    assert_eq!(v["dead"], 1, "{v}");
    assert_eq!(v["delivered"], 0);
    assert_eq!(d.text("SELECT state FROM outbox"), "dead");
    assert_eq!(d.text("SELECT state FROM operations"), "dead");
    assert_eq!(d.int("SELECT max_attempts FROM outbox"), 1);
    assert_eq!(d.downstream_receipts(), 0);
    assert_eq!(d.run("audit", &[]).code, 0);

    // A limit of 2 allows the second claim, and the event records the limit it ran under.
    let d = claimed_and_abandoned();
    let w = worker(&d, T0 + 30, &["--max-attempts", "2"]);
    assert_eq!(w.json()["delivered"], 1, "{}", w.stdout);
    assert_eq!(d.int("SELECT attempt_count FROM outbox"), 2);
    assert_eq!(d.int("SELECT max_attempts FROM outbox"), 2);
    assert_eq!(d.run("audit", &[]).code, 0);
}

#[test]
fn each_failed_event_is_a_json_line_on_stderr() {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    let r = d.dispatch(&f, &["--failure", "after_intent_commit"]);
    assert_eq!(r.code, 1);
    // The requester loses its grants before the worker's recheck.
    let revoke = run(&["principal", "revoke", "alice", "--all", "--db", d.db()]);
    assert_eq!(revoke.code, 0, "{}", revoke.stderr);
    let w = worker(&d, T0, &["--worker-id", "w-test", "--log-format", "json"]);
    assert_eq!(w.code, 0, "{}", w.stderr);
    assert_eq!(w.json()["refused"]["permission_denied"], 1, "{}", w.stdout);
    // With JSON logs every stderr line is JSON: the log events, and the failure lines.
    let all: Vec<Value> = w
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).expect("each stderr line is JSON"))
        .collect();
    let logged = all
        .iter()
        .find(|l| l["target"] == "toolledger::worker" && l["code"] == "permission_denied");
    assert!(
        logged.is_some(),
        "the failed attempt is a log event: {}",
        w.stderr
    );
    let lines: Vec<&Value> = all.iter().filter(|l| l.get("error").is_some()).collect();
    assert_eq!(lines.len(), 1, "{}", w.stderr);
    assert_eq!(lines[0]["worker"], "w-test");
    assert_eq!(lines[0]["error"]["code"], "permission_denied");
    assert!(lines[0]["error"]["message"].is_string());
    assert_eq!(
        lines[0]["event_id"],
        d.int("SELECT id FROM outbox"),
        "{}",
        w.stderr
    );
    assert_eq!(d.downstream_receipts(), 0);
}

#[test]
fn out_of_range_options_are_usage_errors_that_touch_nothing() {
    let d = claimed_and_abandoned();
    let hash = || std::fs::read(&d.db).unwrap();
    let before = hash();
    for (args, flag) in [
        (&["--max-attempts", "0"][..], "--max-attempts"),
        (&["--max-attempts", "1001"], "--max-attempts"),
        (&["--lease-seconds", "0"], "--lease-seconds"),
        (&["--batch", "0"], "--batch"),
    ] {
        let w = worker(&d, T0 + 30, args);
        assert_eq!(w.code, 2, "{args:?}");
        assert_eq!(w.stdout, "");
        let v: Value = serde_json::from_str(w.stderr.trim()).unwrap();
        assert_eq!(v["error"]["code"], "USAGE_ERROR");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(flag),
            "{}",
            w.stderr
        );
    }
    assert!(before == hash(), "the ledger file is byte-identical");
    assert_eq!(d.text("SELECT state FROM outbox"), "processing");
}
