//! Real process deaths: `toolledger dispatch` is held at each crash point (the testing aid
//! `TOOLLEDGER_TEST_HOLD_AT`), killed with SIGKILL, and both SQLite files are inspected
//! afterwards. Then recovery runs: the worker delivers or status reconciles, and nothing is
//! paid twice. Also: the worker's graceful stop on SIGTERM.

#![cfg(unix)]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use support::runtime::*;

const T0: i64 = 1_767_225_600;

/// Spawns `toolledger ARGS` held at `point` and waits until it reports being there.
fn spawn_held(args: &[&str], point: &str) -> Child {
    let mut child = Command::new(BIN)
        .args(args)
        .env("TOOLLEDGER_TEST_HOLD_AT", point)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert_eq!(
        line.trim(),
        format!(r#"{{"held_at":"{point}"}}"#),
        "the process must reach the point"
    );
    child
}

/// SIGKILL, and check it really died of it.
fn kill9(mut child: Child) {
    child.kill().unwrap();
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9));
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert_eq!(out, "", "a killed dispatch never answered");
}

fn killed_at(point: &str) -> Db {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    let child = spawn_held(
        &["dispatch", "--db", d.db(), "--fixture", f.to_str().unwrap()],
        point,
    );
    kill9(child);
    d
}

#[test]
fn sigkill_after_intent_commit() {
    let d = killed_at("after_intent_commit");
    let f = example("refund-order.json");
    assert_eq!(d.text("SELECT state FROM operations"), "accepted");
    assert_eq!(
        d.text("SELECT state || ':' || fencing_token || ':' || attempt_count FROM outbox"),
        "pending:0:0"
    );
    assert_eq!(d.int("SELECT count(*) FROM deferred_intents"), 1);
    assert_eq!(d.int("SELECT count(*) FROM local_receipts"), 0);
    assert_eq!(d.downstream_receipts(), 0);
    // The retried dispatch only reports; the worker delivers.
    let r = d.dispatch(&f, &[]);
    assert_eq!(r.code, 1);
    assert_eq!(r.json()["code"], "OUTCOME_UNKNOWN");
    assert_eq!(r.json()["status"], "accepted");
    assert_eq!(d.text("SELECT state FROM outbox"), "pending");
    let w = d.run("worker", &["--once", "--clock-epoch", &T0.to_string()]);
    assert_eq!(w.json()["delivered"], 1);
    assert_eq!(d.dispatch(&f, &[]).json()["delivery"], "local_replay");
    assert_eq!(d.downstream_receipts(), 1);
    assert_eq!(d.run("audit", &[]).code, 0);
}

#[test]
fn sigkill_after_claim() {
    let d = killed_at("after_claim");
    let f = example("refund-order.json");
    assert_eq!(d.text("SELECT state FROM operations"), "processing");
    assert_eq!(
        d.text("SELECT state || ':' || fencing_token || ':' || lease_until FROM outbox"),
        format!("processing:1:{}", T0 + 30)
    );
    assert_eq!(d.downstream_receipts(), 0);
    let r = d.dispatch(&f, &[]);
    assert_eq!(r.json()["code"], "OUTCOME_UNKNOWN");
    assert_eq!(r.json()["status"], "processing");
    let early = d.run(
        "worker",
        &["--once", "--clock-epoch", &(T0 + 10).to_string()],
    );
    assert_eq!(early.json()["delivered"], 0);
    let late = d.run(
        "worker",
        &["--once", "--clock-epoch", &(T0 + 30).to_string()],
    );
    assert_eq!(late.json()["delivered"], 1);
    assert_eq!(d.int("SELECT fencing_token FROM outbox"), 2);
    assert_eq!(d.downstream_receipts(), 1);
    assert_eq!(d.run("audit", &[]).code, 0);
}

#[test]
fn sigkill_after_downstream_commit() {
    let d = killed_at("after_downstream_commit");
    let f = example("refund-order.json");
    // Downstream committed in its own file; the ledger has no receipt.
    assert_eq!(d.downstream_receipts(), 1);
    assert_eq!(d.int("SELECT count(*) FROM local_receipts"), 0);
    assert_eq!(d.text("SELECT state FROM operations"), "processing");
    assert_eq!(d.text("SELECT state FROM outbox"), "processing");
    let r = d.dispatch(&f, &[]);
    assert_eq!(r.code, 1);
    assert_eq!(r.json()["code"], "OUTCOME_UNKNOWN");
    let sr = r.json()["status_ref"].as_str().unwrap().to_string();
    assert_eq!(d.int("SELECT count(*) FROM local_receipts"), 0);
    let s = d.status(&f, &sr);
    assert_eq!(s.code, 0, "{}", s.stderr);
    assert_eq!(s.json()["delivery"], "receipt_reconciled");
    assert_eq!(d.text("SELECT state FROM outbox"), "delivered");
    assert_eq!(d.downstream_receipts(), 1, "no second effect");
    assert_eq!(d.run("audit", &[]).code, 0);
}

fn sigterm(child: &Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

#[test]
fn the_worker_stops_on_sigterm_and_abandons_unfinished_work_without_releasing_it() {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    assert_eq!(
        d.dispatch(&f, &["--failure", "after_intent_commit"]).code,
        1
    );
    // The worker claims, then is held before its downstream call.
    let child = spawn_held(
        &[
            "worker",
            "--db",
            d.db(),
            "--clock-epoch",
            &T0.to_string(),
            "--worker-id",
            "w-term",
            "--poll-interval",
            "50",
        ],
        "after_claim",
    );
    sigterm(&child);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["stopped_by"], "SIGTERM");
    assert_eq!(summary["delivered"], 0);
    // Not released: still its lease, its token; nothing went downstream.
    assert_eq!(
        d.text("SELECT state || ':' || lease_owner || ':' || fencing_token FROM outbox"),
        "processing:w-term:1"
    );
    assert_eq!(d.downstream_receipts(), 0);
    // An idle polling worker stops cleanly too, after delivering what it found.
    let idle = Command::new(BIN)
        .args([
            "worker",
            "--db",
            d.db(),
            "--clock-epoch",
            &(T0 + 30).to_string(),
            "--poll-interval",
            "50",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while d.int("SELECT count(*) FROM local_receipts") == 0 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    sigterm(&idle);
    let out = idle.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["stopped_by"], "SIGTERM");
    assert!(summary["delivered"].as_u64().unwrap() >= 1);
}
