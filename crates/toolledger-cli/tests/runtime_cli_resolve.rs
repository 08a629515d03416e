//! `dispatch` of a refund the payments service refuses (`failed`, replayed), `toolledger
//! resolve` of a dead operation, and deadlines from `--authority-ttl` / `--replay-ttl`.

mod support;

use support::runtime::*;

const NOW: i64 = 1_767_225_600;

fn second_refund(d: &Db, amount: &str) -> std::path::PathBuf {
    variant(
        d.dir.path(),
        "second.json",
        &[
            ("refund-ord-1001-a", "refund-ord-1001-b"),
            ("approval-ord-1001-a", "approval-ord-1001-b"),
            ("\"amount_cents\": 1250", amount),
            ("call-0001", "call-0002"),
        ],
    )
}

#[test]
fn a_refund_above_the_captured_amount_fails_and_replays_the_stored_failure() {
    let d = Db::new();
    let first = variant(
        d.dir.path(),
        "first.json",
        &[("\"amount_cents\": 1250", "\"amount_cents\": 4000")],
    );
    let second = second_refund(&d, "\"amount_cents\": 2000");
    assert_eq!(d.approve(&first, "bob").code, 0);
    assert_eq!(d.approve(&second, "bob").code, 0);
    assert_eq!(d.dispatch(&first, &[]).code, 0);
    let failed = d.dispatch(&second, &[]);
    assert_eq!(failed.code, 1, "{}", failed.stdout);
    let v = failed.json();
    assert_eq!(v["gate"], "BLOCK");
    assert_eq!(v["code"], "FAILED");
    assert_eq!(v["status"], "failed");
    assert_eq!(v["delivery"], "fresh");
    assert_eq!(v["error"]["code"], "refund_exceeds_captured");
    let replay = d.dispatch(&second, &[]);
    assert_eq!(replay.code, 1);
    assert_eq!(replay.json()["delivery"], "local_replay");
    assert_eq!(replay.json()["status_ref"], v["status_ref"]);
    assert_eq!(d.downstream_receipts(), 1);
    let audit = d.run("audit", &[]);
    assert_eq!(audit.code, 0, "{}", audit.stdout);
}

#[test]
fn an_operator_resolves_a_dead_operation_as_failed() {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    let blocked = d.dispatch(&f, &["--failure", "after_intent_commit"]);
    assert_eq!(blocked.code, 1);
    let sr = blocked.json()["status_ref"].as_str().unwrap().to_string();
    let resolve = |as_: &str, operator: &str, at: i64| {
        d.run(
            "resolve",
            &[
                "--status-ref",
                &sr,
                "--as",
                as_,
                "--reason",
                "payments dashboard shows no refund",
                "--operator",
                operator,
                "--clock-epoch",
                &at.to_string(),
            ],
        )
    };
    // Not an operator.
    let r = resolve("failed", "bob", NOW);
    assert_eq!(r.code, 1);
    assert_eq!(r.json()["code"], "PERMISSION_DENIED");
    let events = d.int("SELECT count(*) FROM operation_events");
    assert_eq!(
        run(&[
            "principal",
            "add",
            "olga",
            "--tenant",
            "acme",
            "--role",
            "operator",
            "--db",
            d.db()
        ])
        .code,
        0
    );
    // Only outcome_unknown or dead operations can be resolved.
    let r = resolve("failed", "olga", NOW);
    assert_eq!(r.code, 1);
    assert_eq!(r.json()["code"], "OPERATION_IN_PROGRESS");
    assert_eq!(d.int("SELECT count(*) FROM operation_events"), events);
    // Revoked requester: every worker attempt is refused until the event is dead.
    assert_eq!(
        run(&["principal", "revoke", "alice", "--all", "--db", d.db()]).code,
        0
    );
    for i in 0..6 {
        let at = (NOW + 30 * i).to_string();
        let w = d.run("worker", &["--once", "--clock-epoch", &at]);
        assert_eq!(w.code, 0, "{}", w.stdout);
    }
    assert_eq!(
        d.text("SELECT state FROM operations"),
        "dead",
        "attempts exhausted"
    );
    let later = NOW + 1000;
    let r = resolve("failed", "bob", later);
    assert_eq!(r.json()["code"], "PERMISSION_DENIED");
    let r = resolve("succeeded", "olga", later);
    assert_eq!(r.code, 1);
    assert_eq!(r.json()["code"], "OUTCOME_UNKNOWN");
    let r = resolve("failed", "olga", later);
    assert_eq!(r.code, 0, "{}", r.stdout);
    let v = r.json();
    assert_eq!(v["status"], "failed");
    assert_eq!(v["result"]["code"], "resolved_failed");
    assert_eq!(d.text("SELECT state FROM outbox"), "delivered");
    let detail = d.text("SELECT detail FROM operation_events WHERE kind = 'resolved'");
    assert!(detail.contains("\"operator\":\"olga\""), "{detail}");
    assert_eq!(d.run("audit", &[]).code, 0);
    // Resolved once: a second resolution is refused and changes nothing.
    let events = d.int("SELECT count(*) FROM operation_events");
    assert_eq!(resolve("failed", "olga", later).code, 1);
    assert_eq!(d.int("SELECT count(*) FROM operation_events"), events);
}

#[test]
fn dispatch_stores_deadlines_and_refuses_a_replay_after_the_authority_deadline() {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    let first = d.dispatch(&f, &["--authority-ttl", "60", "--replay-ttl", "600"]);
    assert_eq!(first.code, 0, "{}", first.stdout);
    assert_eq!(d.int("SELECT authority_deadline FROM operations"), NOW + 60);
    assert_eq!(
        d.int("SELECT retention_deadline FROM operations"),
        NOW + 600
    );
    let sr = first.json()["status_ref"].as_str().unwrap().to_string();
    let late = variant(
        d.dir.path(),
        "late.json",
        &[("\"now\": 1767225600", "\"now\": 1767225660")],
    );
    let r = d.dispatch(&late, &[]);
    assert_eq!(r.code, 1);
    assert_eq!(r.json()["code"], "OPERATION_AUTHORITY_EXPIRED");
    // Status never checks deadlines.
    let s = d.status(&late, &sr);
    assert_eq!(s.code, 0, "{}", s.stdout);
    assert_eq!(s.json()["delivery"], "local_replay");
}

/// `resolve` is an operator command: it names no demo (no `--downstream-db`, nothing about the
/// payments stand-in in its help). The reference server's refunds demo keeps its stand-in's
/// file where `TOOLLEDGER_DOWNSTREAM_DB` says, for `resolve` as for the demo's own commands:
/// a receipt the stand-in holds there is found, so `--as failed` is refused and `--as
/// succeeded` reconciles it.
#[test]
fn resolve_names_no_demo_and_finds_the_stand_in_where_the_demo_keeps_it() {
    let help = run(&["resolve", "--help"]);
    assert_eq!(help.code, 0);
    for demo in ["downstream-db", "payments", "stand-in"] {
        assert!(!help.stdout.contains(demo), "{}", help.stdout);
    }
    let d = Db::new();
    let payments = d.dir.path().join("elsewhere").join("payments.sqlite");
    std::fs::create_dir(payments.parent().unwrap()).unwrap();
    let with_stand_in = |args: &[&str]| -> Run {
        toolledger()
            .args(args)
            .args(["--db", d.db()])
            .env("TOOLLEDGER_DOWNSTREAM_DB", &payments)
            .env_remove("TOOLLEDGER_TEST_HOLD_AT")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
            .into()
    };
    let f = example("refund-order.json");
    let f = f.to_str().unwrap();
    assert_eq!(
        with_stand_in(&["approve", "--fixture", f, "--approver", "bob"]).code,
        0
    );
    let crash = with_stand_in(&[
        "dispatch",
        "--fixture",
        f,
        "--failure",
        "after_downstream_commit",
    ]);
    assert_eq!(crash.json()["code"], "OUTCOME_UNKNOWN", "{}", crash.stdout);
    let sr = crash.json()["status_ref"].as_str().unwrap().to_string();
    assert!(
        payments.exists(),
        "the demo's stand-in is where the variable says"
    );
    assert!(!d.downstream().exists(), "and not beside the ledger");
    assert_eq!(
        run(&[
            "principal",
            "add",
            "olga",
            "--tenant",
            "acme",
            "--role",
            "operator",
            "--db",
            d.db()
        ])
        .code,
        0
    );
    let later = (NOW + 1000).to_string();
    let resolve = |as_: &str, extra: &[&str]| {
        let mut args = vec![
            "resolve",
            "--status-ref",
            &sr,
            "--as",
            as_,
            "--reason",
            "checked the payments service",
            "--operator",
            "olga",
            "--clock-epoch",
            &later,
        ];
        args.extend_from_slice(extra);
        with_stand_in(&args)
    };
    let named = resolve("failed", &["--downstream-db", payments.to_str().unwrap()]);
    assert_eq!(named.code, 2, "{}", named.stderr);
    assert!(named.stderr.contains("USAGE_ERROR"), "{}", named.stderr);
    let failed = resolve("failed", &[]);
    assert_eq!(failed.code, 1, "{}", failed.stdout);
    assert_eq!(
        failed.json()["code"],
        "OPERATION_CONFLICT",
        "{}",
        failed.stdout
    );
    let ok = resolve("succeeded", &[]);
    assert_eq!(ok.code, 0, "{} {}", ok.stdout, ok.stderr);
    assert_eq!(ok.json()["delivery"], "receipt_reconciled");
    assert!(
        !d.downstream().exists(),
        "no stand-in was made beside the ledger"
    );
}
