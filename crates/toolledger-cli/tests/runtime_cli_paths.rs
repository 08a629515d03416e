//! The deferred runtime's CLI paths: PASS, BLOCK → status → PASS, audit, replay across processes,
//! crash points injected in process, worker passes and revocation.

mod support;

use serde_json::json;
use support::runtime::*;

const T0: i64 = 1_767_225_600;

#[test]
fn the_pass_path_and_a_replay_in_a_new_process() {
    let d = Db::new();
    let f = example("refund-order.json");
    let a = d.approve(&f, "bob");
    assert_eq!(a.code, 0, "{}", a.stderr);
    assert_eq!(a.json()["approval_id"], "approval-ord-1001-a");
    let first = d.dispatch(&f, &[]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let v = first.json();
    assert_eq!(v["gate"], "PASS");
    assert_eq!(v["code"], "OK");
    assert_eq!(v["delivery"], "fresh");
    assert_eq!(v["status"], "succeeded");
    assert_eq!(v["result"]["amount_cents"], 1250);
    assert!(first.stderr.is_empty());
    let again = d.dispatch(&f, &[]);
    assert_eq!(again.code, 0);
    assert_eq!(again.json()["delivery"], "local_replay");
    assert_eq!(again.json()["status_ref"], v["status_ref"]);
    assert_eq!(again.json()["result"], v["result"]);
    assert_eq!(d.downstream_receipts(), 1);
    assert_eq!(d.int("SELECT count(*) FROM operations"), 1);
    let audit = d.run("audit", &[]);
    assert_eq!(audit.code, 0, "{}", audit.stdout);
    let r = audit.json();
    assert_eq!(r["gate"], "PASS");
    assert_eq!(r["checks"]["journal_mode"], "wal");
    assert_eq!(r["checks"]["synchronous"], "full");
    assert_eq!(r["checks"]["integrity_check"], "ok");
    assert_eq!(r["counts"]["operations"], json!({"succeeded": 1}));
    assert_eq!(r["counts"]["outbox"], json!({"delivered": 1}));
    assert_eq!(r["downstream"]["receipts"], 1);
}

#[test]
fn block_then_status_then_pass() {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    let blocked = d.dispatch(&f, &["--failure", "after_downstream_commit"]);
    assert_eq!(blocked.code, 1, "{}", blocked.stderr);
    let b = blocked.json();
    assert_eq!(b["gate"], "BLOCK");
    assert_eq!(b["code"], "OUTCOME_UNKNOWN");
    let sr = b["status_ref"].as_str().unwrap().to_string();
    assert_eq!(d.downstream_receipts(), 1);
    assert_eq!(d.int("SELECT count(*) FROM local_receipts"), 0);
    // Dispatch again: the same status ref, still unknown, nothing reconciled.
    let again = d.dispatch(&f, &[]);
    assert_eq!(again.code, 1);
    assert_eq!(again.json()["status_ref"], sr.as_str());
    assert_eq!(again.json()["code"], "OUTCOME_UNKNOWN");
    assert_eq!(d.int("SELECT count(*) FROM local_receipts"), 0);
    // The explicit status query reconciles.
    let s = d.status(&f, &sr);
    assert_eq!(s.code, 0, "{}", s.stderr);
    let sv = s.json();
    assert_eq!(sv["gate"], "PASS");
    assert_eq!(sv["delivery"], "receipt_reconciled");
    assert_eq!(sv["status"], "succeeded");
    assert_eq!(sv["status_ref"], sr.as_str());
    assert_eq!(d.status(&f, &sr).json()["delivery"], "local_replay");
    assert_eq!(d.dispatch(&f, &[]).json()["delivery"], "local_replay");
    assert_eq!(d.downstream_receipts(), 1);
    assert_eq!(d.run("audit", &[]).code, 0);
}

#[test]
fn after_intent_commit_and_after_claim_are_recovered_by_a_worker() {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    let r = d.dispatch(&f, &["--failure", "after_intent_commit"]);
    assert_eq!(r.code, 1);
    assert_eq!(r.json()["status"], "accepted");
    assert_eq!(d.text("SELECT state FROM outbox"), "pending");
    let w = d.run("worker", &["--once", "--clock-epoch", &T0.to_string()]);
    assert_eq!(w.code, 0, "{}", w.stderr);
    assert_eq!(w.json()["delivered"], 1);
    assert_eq!(w.json()["stopped_by"], "once");
    assert_eq!(d.dispatch(&f, &[]).json()["delivery"], "local_replay");

    let d = Db::new();
    assert_eq!(d.approve(&f, "bob").code, 0);
    let r = d.dispatch(&f, &["--failure", "after_claim"]);
    assert_eq!(r.code, 1);
    assert_eq!(r.json()["status"], "processing");
    let early = d.run(
        "worker",
        &["--once", "--clock-epoch", &(T0 + 29).to_string()],
    );
    assert_eq!(
        early.json()["delivered"],
        0,
        "an unexpired lease is not taken over"
    );
    assert_eq!(d.downstream_receipts(), 0);
    let late = d.run(
        "worker",
        &["--once", "--clock-epoch", &(T0 + 30).to_string()],
    );
    assert_eq!(late.json()["delivered"], 1);
    assert_eq!(d.int("SELECT fencing_token FROM local_receipts"), 2);
    assert_eq!(d.run("audit", &[]).code, 0);
}

#[test]
fn revocation_hides_the_operation_behind_the_same_not_found() {
    let d = Db::new();
    let f = example("refund-support-admin.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    let pass = d.dispatch(&f, &[]);
    assert_eq!(pass.code, 0, "{}", pass.stdout);
    let sr = pass.json()["status_ref"].as_str().unwrap().to_string();
    let absent = d.status(&f, "op_00000000000000000000000000000000");
    assert_eq!(absent.code, 1);
    let revoke = run(&[
        "principal",
        "revoke",
        "carol",
        "--role",
        "support_admin",
        "--db",
        d.db(),
    ]);
    assert_eq!(revoke.code, 0, "{}", revoke.stderr);
    let status = d.status(&f, &sr);
    let replay = d.dispatch(&f, &[]);
    assert_eq!(status.code, 1);
    assert_eq!(status.json(), absent.json());
    assert_eq!(replay.json(), absent.json());
    assert_eq!(absent.json()["code"], "NOT_FOUND");
    assert!(!status.stdout.contains("ord-2002"));
}

#[test]
fn refusals_are_blocks_with_typed_codes() {
    let d = Db::new();
    let f = example("refund-order.json");
    // No approval issued.
    let r = d.dispatch(&f, &[]);
    assert_eq!(r.code, 1);
    assert_eq!(r.json()["code"], "APPROVAL_INVALID");
    // The requester cannot approve their own intent.
    let own = d.approve(&f, "alice");
    assert_eq!(own.code, 1);
    assert_eq!(own.json()["code"], "PERMISSION_DENIED");
    // A different intent under the same key conflicts.
    assert_eq!(d.approve(&f, "bob").code, 0);
    assert_eq!(d.dispatch(&f, &[]).code, 0);
    let other = variant(
        d.dir.path(),
        "other.json",
        &[("\"amount_cents\": 1250", "\"amount_cents\": 1300")],
    );
    let c = d.dispatch(&other, &[]);
    assert_eq!(c.code, 1);
    assert_eq!(c.json()["code"], "OPERATION_CONFLICT");
    // Invalid tool arguments.
    let bad = variant(
        d.dir.path(),
        "bad.json",
        &[("\"amount_cents\": 1250", "\"amount_cents\": 0")],
    );
    let b = d.dispatch(&bad, &[]);
    assert_eq!(b.code, 1);
    assert_eq!(b.json()["code"], "INVALID_ARGUMENTS");
    assert_eq!(d.int("SELECT count(*) FROM operations"), 1);
}

/// A ledger holding the example refund, approved and delivered; and the fixture's path.
fn delivered_refund() -> (Db, std::path::PathBuf) {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    assert_eq!(d.dispatch(&f, &[]).code, 0);
    (d, f)
}

#[test]
fn audit_blocks_on_broken_invariants_and_names_receipts_only_opaquely() {
    let (d, f) = delivered_refund();
    let receipt_id = d.text("SELECT receipt_id FROM local_receipts");
    d.ledger()
        .execute_batch("UPDATE operations SET state = 'processing'")
        .unwrap();
    let a = d.run("audit", &[]);
    assert_eq!(a.code, 1);
    let v = a.json();
    assert_eq!(v["gate"], "BLOCK");
    let rules: Vec<&str> = v["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["rule"].as_str().unwrap())
        .collect();
    assert!(rules.contains(&"orphan_receipt"), "{rules:?}");
    assert!(rules.contains(&"delivered_event_without_succeeded_operation"));
    assert!(
        !a.stdout.contains(&receipt_id),
        "receipts are named opaquely"
    );
    assert!(!a.stdout.contains("ord-1001"));
    // A tampered receipt body is found too.
    let d2 = Db::new();
    assert_eq!(d2.approve(&f, "bob").code, 0);
    assert_eq!(d2.dispatch(&f, &[]).code, 0);
    d2.ledger()
        .execute_batch("UPDATE local_receipts SET receipt = replace(receipt, '1250', '9999')")
        .unwrap();
    let a2 = d2.run("audit", &[]);
    assert_eq!(a2.code, 1);
    assert!(a2.stdout.contains("stored_json_or_digest_mismatch"));
}

#[test]
fn store_failures_exit_2_with_a_path_free_code() {
    let d = Db::new();
    let f = example("refund-order.json");
    let missing = d.run("audit", &[]);
    assert_eq!(missing.code, 2);
    assert_eq!(missing.stdout, "");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(missing.stderr.trim()).unwrap()["error"]["code"],
        "DATABASE_NOT_FOUND"
    );
    std::fs::write(&d.db, vec![0x42u8; 8192]).unwrap();
    for (r, code) in [
        // One code for one cause, whether the command opens the ledger to write or to read.
        (d.dispatch(&f, &[]), "NOT_A_LEDGER"),
        (d.run("audit", &[]), "NOT_A_LEDGER"),
        (d.status(&f, "op_x"), "NOT_A_LEDGER"),
    ] {
        assert_eq!(r.code, 2);
        assert_eq!(r.stdout, "");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(r.stderr.trim()).unwrap()["error"]["code"],
            code
        );
        assert!(!r.stderr.contains(d.dir.path().to_str().unwrap()));
    }
    // A trigger-injected failure inside transaction A: exit 2, nothing of the intent remains.
    let d = Db::new();
    assert_eq!(d.approve(&f, "bob").code, 0);
    d.ledger()
        .execute_batch(
            "CREATE TRIGGER fail_outbox BEFORE INSERT ON outbox
             BEGIN SELECT RAISE(ABORT, 'injected'); END;",
        )
        .unwrap();
    let r = d.dispatch(&f, &[]);
    assert_eq!(r.code, 2);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(r.stderr.trim()).unwrap()["error"]["code"],
        "SQLITE_ERROR"
    );
    assert_eq!(d.int("SELECT count(*) FROM operations"), 0);
    assert_eq!(d.int("SELECT count(*) FROM outbox"), 0);
    assert_eq!(
        d.int("SELECT count(*) FROM approvals WHERE consumed_at IS NOT NULL"),
        0
    );
}

#[test]
fn migrating_a_version_5_ledger_keeps_its_receipts_and_drops_the_receipt_id_uniqueness() {
    let (d, f) = delivered_refund();
    let receipts = "SELECT group_concat(id || ':' || operation_id || ':' || receipt_id || ':' || \
                    receipt_digest || ':' || call_binding_digest || ':' || reconciled_via || ':' || \
                    fencing_token || ':' || reconciled_at, ',') FROM local_receipts";
    let before = d.text(receipts);
    assert!(before.contains(":worker:"), "{before}");
    // Turn the file into a schema-v5 ledger: its receipt ids unique, versions 6 and 7 not
    // applied.
    d.ledger()
        .execute_batch(
            "CREATE TABLE v5 (
                 id INTEGER PRIMARY KEY,
                 operation_id INTEGER NOT NULL UNIQUE REFERENCES operations(id),
                 receipt_id TEXT NOT NULL UNIQUE, receipt TEXT NOT NULL,
                 receipt_digest TEXT NOT NULL, call_binding_digest TEXT NOT NULL,
                 reconciled_via TEXT NOT NULL, fencing_token INTEGER, query_identity TEXT,
                 reconciled_at INTEGER NOT NULL) STRICT;
             INSERT INTO v5 SELECT * FROM local_receipts;
             DROP TABLE local_receipts;
             ALTER TABLE v5 RENAME TO local_receipts;
             DROP INDEX operations_unsettled_by_digest;
             DELETE FROM schema_migrations WHERE namespace = 'toolledger' AND version >= 6;",
        )
        .unwrap();
    let unique = "SELECT count(*) FROM pragma_index_list('local_receipts') WHERE \"unique\" = 1";
    assert_eq!(d.int(unique), 2, "operation_id and receipt_id");
    assert_eq!(d.run("audit", &[]).code, 2, "SCHEMA_OUTDATED");
    assert_eq!(d.run("migrate", &[]).code, 0);
    assert_eq!(d.int(unique), 1, "operation_id only");
    assert_eq!(d.text(receipts), before);
    assert_eq!(d.run("audit", &[]).code, 0);
    // The same fixture again replays the migrated operation.
    assert_eq!(d.dispatch(&f, &[]).code, 0);
    assert_eq!(d.int("SELECT count(*) FROM local_receipts"), 1);
}

#[test]
fn an_older_schema_needs_migrate_and_a_newer_one_is_refused() {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.run("migrate", &[]).code, 0);
    // Turn the file into a schema-v1 ledger (before the runtime tables existed).
    d.ledger()
        .execute_batch(
            "DROP INDEX operations_by_state; DROP INDEX operations_live_by_retention;
             DROP INDEX operations_unsettled_by_digest;
             DROP INDEX operations_tombstones_by_retention; DROP TABLE prune_state;
             ALTER TABLE operations DROP COLUMN compacted_at;
             DROP TABLE key_ids; DROP TABLE local_receipts; DROP TABLE outbox;
             DROP TABLE deferred_intents; DROP TABLE approvals;
             DELETE FROM schema_migrations WHERE namespace = 'toolledger' AND version >= 2;",
        )
        .unwrap();
    let r = d.approve(&f, "bob");
    assert_eq!(r.code, 2);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(r.stderr.trim()).unwrap()["error"]["code"],
        "SCHEMA_OUTDATED"
    );
    let hint: serde_json::Value = serde_json::from_str(r.stderr.trim()).unwrap();
    assert!(
        hint["error"]["message"]
            .as_str()
            .unwrap()
            .contains("run `toolledger migrate`"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains(d.dir.path().to_str().unwrap()));
    assert_eq!(
        d.int("SELECT count(*) FROM sqlite_schema WHERE name = 'outbox'"),
        0
    );
    assert_eq!(d.run("migrate", &[]).code, 0);
    assert_eq!(d.approve(&f, "bob").code, 0);
    assert_eq!(d.dispatch(&f, &[]).code, 0);
    // A schema newer than this program knows is refused, never touched.
    d.ledger()
        .execute_batch("INSERT INTO schema_migrations VALUES ('toolledger', 99)")
        .unwrap();
    for r in [
        d.dispatch(&f, &[]),
        d.run("audit", &[]),
        d.run("migrate", &[]),
    ] {
        assert_eq!(r.code, 2);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(r.stderr.trim()).unwrap()["error"]["code"],
            "SCHEMA_TOO_NEW"
        );
    }
}
