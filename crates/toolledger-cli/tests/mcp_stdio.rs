//! The multi-round `create_issue` matrix over real stdio: raw JSON-RPC lines against the
//! built `toolledger serve`, MCP 2026-07-28 (no initialize), with the database read back after
//! every case, on SQLite and on PostgreSQL.

#[macro_use]
mod support;

use serde_json::{json, Value};
use support::wire::*;

const EPOCH: &str = "1800000000";

// Every case below runs twice: on a fresh SQLite file (`sqlite::…`) and on a fresh schema of
// the test PostgreSQL database (`postgres::…`; skipped with one loud line without
// `TOOLLEDGER_TEST_DATABASE_URL`, failing in CI).
on_both_backends!(
    first_round_is_input_required_with_a_sealed_state_and_writes_nothing,
    identical_retry_replays_the_stored_result_and_creates_one_issue,
    lost_reply_then_restart_status_and_exact_replay,
    recovery_by_status_alone_never_resends_the_continuation,
    changed_input_responses_under_the_same_token_conflict,
    a_second_token_on_a_committed_id_conflicts_and_a_tampered_token_is_invalid,
    another_principal_cannot_use_alices_token_see_her_status_or_reuse_her_id,
    after_the_authority_deadline_even_an_exact_replay_is_refused_but_status_reads,
    after_retention_a_replay_is_refused_and_the_tombstone_blocks_a_fresh_token,
    an_expired_request_state_is_refused_generically,
    input_responses_without_request_state_are_continuation_unsupported,
    bad_arguments_and_declined_input_write_nothing,
    a_revoked_principal_is_refused_and_sees_nothing,
    watcher_step_adds_a_watcher_and_applies,
    watcher_failure_with_failed_compensation_ends_partial_with_every_attempt_recorded,
    watcher_failure_with_compensation_records_the_compensation,
    exit_after_partial_first_commit_leaves_an_in_progress_row,
    a_fault_never_fires_on_a_replay,
    two_processes_sending_the_same_continuation_at_once_make_one_issue,
    legacy_initialize_lifecycle_lists_tools_and_refuses_the_second_round_clearly,
    tool_annotations_are_honest,
    continuations_survive_a_restart_with_environment_keys_and_fail_with_other_keys,
    a_server_with_another_fingerprint_key_than_the_database_refuses_to_start,
    legacy_lifecycle_asks_for_the_body_by_elicitation_and_a_retried_call_replays,
    the_same_continuation_twice_in_flight_on_one_connection_makes_one_issue,
    exit_after_ledger_insert_leaves_no_rows,
    exit_after_effect_insert_leaves_no_rows,
);

fn args(op: &str) -> Value {
    json!({"operation_id": op, "title": "spec"})
}

/// First round + continuation on one server; returns (token, continuation result).
fn create(server: &mut Server, op: &str, text: &str) -> (String, Value) {
    let first = server.call("create_issue", args(op));
    let token = request_state(&first);
    let done = server.resume("create_issue", args(op), &token, body(text));
    (token, done)
}

fn first_round_is_input_required_with_a_sealed_state_and_writes_nothing(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let reply = s.call_raw(json!({"name": "create_issue", "arguments": args("case-01")}));
    let token = reply["result"]["requestState"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(token.starts_with("rs2."), "{token}");
    assert_eq!(
        reply,
        json!({"jsonrpc": "2.0", "id": 1, "result": {
            "resultType": "input_required",
            "inputRequests": {"body": {"method": "elicitation/create", "params": {
                "mode": "form",
                "message": "Provide the issue body",
                "requestedSchema": {"type": "object",
                    "properties": {"body": {"type": "string", "description": "Issue body"}},
                    "required": ["body"]}}}},
            "requestState": token,
        }})
    );
    let st = s.status("case-01");
    assert_eq!(st["state"], "unknown");
    assert_eq!(st["authoritative"], false);
    assert_eq!(st["matchingIds"], json!([]));
    assert_eq!(st["storedResult"], Value::Null);
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 0);
    assert_eq!(count(&db, "operations"), 0);
}

fn identical_retry_replays_the_stored_result_and_creates_one_issue(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let (token, first) = create(&mut s, "case-02", "alpha");
    let expected = |replayed: bool| {
        json!({
            "operationId": "case-02", "effectId": 1, "result": "created 1",
            "replayed": replayed, "state": "applied",
        })
    };
    assert_eq!(first["isError"], false);
    assert_eq!(first["structuredContent"], expected(false));
    let text: Value = serde_json::from_str(first["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text, expected(false));
    let again = s.resume("create_issue", args("case-02"), &token, body("alpha"));
    assert_eq!(again["structuredContent"], expected(true));
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "operations"), 1);
}

fn lost_reply_then_restart_status_and_exact_replay(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let token = request_state(&s.call("create_issue", args("case-03")));
    assert_eq!(s.finish(), 0);

    let mut s = Server::start(
        &db,
        "alice",
        &["--clock-epoch", EPOCH, "--fault", "drop-after-commit"],
    );
    s.send(
        &json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "create_issue", "arguments": args("case-03"), "requestState": token,
        "inputResponses": body("alpha"), "_meta": meta()}}),
    );
    assert_eq!(s.try_recv(), None, "no reply byte after commit");
    assert_eq!(s.wait_exit(), 70);
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "operations"), 1);

    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let mut st = s.status("case-03");
    let status_ref = st["statusRef"].take();
    assert!(
        status_ref.as_str().unwrap().starts_with("op_"),
        "{status_ref}"
    );
    assert_eq!(
        st,
        json!({
            "operationId": "case-03", "principal": "alice", "backend": db.backend(),
            "observedAt": 1_800_000_000i64, "authoritative": true,
            "freshWriteAuthorized": false,
            "scopeBinding": {"operationId": "case-03", "principal": "alice", "backend": db.backend()},
            "state": "applied", "matchingIds": [1],
            "detail": "ledger row applied and its effect rows agree",
            "storedResult": "created 1",
            "tool": "create_issue", "ledgerState": "applied", "statusRef": null,
        })
    );
    let replay = s.resume("create_issue", args("case-03"), &token, body("alpha"));
    assert_eq!(
        replay["structuredContent"],
        json!({"operationId": "case-03", "effectId": 1, "result": "created 1",
               "replayed": true, "state": "applied"})
    );
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "operations"), 1);
}

fn recovery_by_status_alone_never_resends_the_continuation(db: Db) {
    let mut s = Server::start(
        &db,
        "alice",
        &["--clock-epoch", EPOCH, "--fault", "drop-after-commit"],
    );
    let token = request_state(&s.call("create_issue", args("case-09")));
    s.send(
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "create_issue", "arguments": args("case-09"), "requestState": token,
        "inputResponses": body("alpha"), "_meta": meta()}}),
    );
    assert_eq!(s.try_recv(), None);
    assert_eq!(s.wait_exit(), 70);
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let st = s.status("case-09");
    assert_eq!(st["state"], "applied");
    assert_eq!(st["authoritative"], true);
    assert_eq!(st["storedResult"], "created 1");
    assert_eq!(st["matchingIds"], json!([1]));
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "operations"), 1);
}

fn changed_input_responses_under_the_same_token_conflict(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let (token, first) = create(&mut s, "case-04", "alpha");
    assert_eq!(first["structuredContent"]["replayed"], false);
    let changed = s.resume("create_issue", args("case-04"), &token, body("beta"));
    assert_eq!(error_code(&changed), "operation_conflict");
    let changed_title = s.resume_reply(
        "create_issue",
        json!({"operation_id": "case-04", "title": "other"}),
        &token,
        body("alpha"),
    );
    assert_state_invalid(&changed_title);
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "operations"), 1);
}

fn a_second_token_on_a_committed_id_conflicts_and_a_tampered_token_is_invalid(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let t1 = request_state(&s.call("create_issue", args("case-05")));
    let t2 = request_state(&s.call("create_issue", args("case-05")));
    assert_ne!(t1, t2);
    let done = s.resume("create_issue", args("case-05"), &t1, body("alpha"));
    assert_eq!(done["structuredContent"]["replayed"], false);
    let second = s.resume("create_issue", args("case-05"), &t2, body("alpha"));
    assert_eq!(error_code(&second), "operation_conflict");
    let mut bytes = t1.clone().into_bytes();
    let i = bytes.len() - 5;
    bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(bytes).unwrap();
    let bad = s.resume_reply("create_issue", args("case-05"), &tampered, body("alpha"));
    assert_eq!(
        assert_state_invalid(&bad),
        "the continuation state is invalid, expired or not yours"
    );
    let garbage = s.resume_reply(
        "create_issue",
        args("case-05"),
        "not-a-token",
        body("alpha"),
    );
    assert_state_invalid(&garbage);
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "operations"), 1);
}

fn another_principal_cannot_use_alices_token_see_her_status_or_reuse_her_id(db: Db) {
    let mut a = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let (token, _) = create(&mut a, "case-06", "alpha");
    assert_eq!(a.finish(), 0);

    for other in ["bob", "carol"] {
        let mut b = Server::start(&db, other, &["--clock-epoch", EPOCH]);
        let stolen = b.resume_reply("create_issue", args("case-06"), &token, body("alpha"));
        assert_state_invalid(&stolen);
        let st = b.status("case-06");
        assert_eq!(st["state"], "unknown");
        assert_eq!(st["principal"], other);
        assert_eq!(st["matchingIds"], json!([]));
        assert_eq!(st["storedResult"], Value::Null);
        // Operation ids are each principal's own: the same id is another operation, which
        // neither learns of nor blocks alice's.
        let (_, mine) = create(&mut b, "case-06", other);
        assert_eq!(mine["structuredContent"]["replayed"], false, "{mine}");
        assert_eq!(mine["structuredContent"]["state"], "applied", "{mine}");
        assert_eq!(b.finish(), 0);
    }
    assert_eq!(count(&db, "issues"), 3);
    assert_eq!(count(&db, "operations"), 3);
    // Alice's own operation is untouched: her retry still replays her answer.
    let mut a = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let again = a.resume("create_issue", args("case-06"), &token, body("alpha"));
    assert_eq!(again["structuredContent"]["replayed"], true, "{again}");
    assert_eq!(a.finish(), 0);
}

fn after_the_authority_deadline_even_an_exact_replay_is_refused_but_status_reads(db: Db) {
    let flags = ["--authority-ttl", "60", "--request-state-ttl", "100000"];
    let mut s = Server::start(
        &db,
        "alice",
        &[&["--clock-epoch", EPOCH][..], &flags].concat(),
    );
    let (token, _) = create(&mut s, "case-07", "alpha");
    assert_eq!(s.finish(), 0);
    let mut s = Server::start(
        &db,
        "alice",
        &[&["--clock-epoch", "1800000060"][..], &flags].concat(),
    );
    let replay = s.resume("create_issue", args("case-07"), &token, body("alpha"));
    assert_eq!(error_code(&replay), "operation_authority_expired");
    let st = s.status("case-07");
    assert_eq!(st["state"], "applied");
    assert_eq!(st["storedResult"], "created 1");
    assert_eq!(st["freshWriteAuthorized"], false);
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "operations"), 1);
}

fn after_retention_a_replay_is_refused_and_the_tombstone_blocks_a_fresh_token(db: Db) {
    let flags = [
        "--authority-ttl",
        "100000",
        "--replay-ttl",
        "60",
        "--request-state-ttl",
        "100000",
    ];
    let mut s = Server::start(
        &db,
        "alice",
        &[&["--clock-epoch", EPOCH][..], &flags].concat(),
    );
    let (token, _) = create(&mut s, "case-10", "alpha");
    assert_eq!(s.finish(), 0);
    let mut s = Server::start(
        &db,
        "alice",
        &[&["--clock-epoch", "1800000100"][..], &flags].concat(),
    );
    let replay = s.resume("create_issue", args("case-10"), &token, body("alpha"));
    assert_eq!(error_code(&replay), "operation_retention_expired");
    // A client starting over gets the same answer as the replay, not a fresh token.
    let fresh = s.call("create_issue", args("case-10"));
    assert_eq!(error_code(&fresh), "operation_retention_expired");
    assert_eq!(s.status("case-10")["state"], "applied");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "operations"), 1);
}

fn an_expired_request_state_is_refused_generically(db: Db) {
    let mut s = Server::start(
        &db,
        "alice",
        &["--clock-epoch", EPOCH, "--request-state-ttl", "30"],
    );
    let token = request_state(&s.call("create_issue", args("case-ttl")));
    assert_eq!(s.finish(), 0);
    let mut s = Server::start(
        &db,
        "alice",
        &["--clock-epoch", "1800000030", "--request-state-ttl", "30"],
    );
    let late = s.resume_reply("create_issue", args("case-ttl"), &token, body("alpha"));
    assert_state_invalid(&late);
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 0);
    assert_eq!(count(&db, "operations"), 0);
}

fn input_responses_without_request_state_are_continuation_unsupported(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let r = s.call_raw(json!({"name": "create_issue", "arguments": args("case-11"),
                              "inputResponses": body("alpha")}));
    assert_eq!(error_code(&r["result"]), "continuation_unsupported");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 0);
    assert_eq!(count(&db, "operations"), 0);
}

fn bad_arguments_and_declined_input_write_nothing(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    for bad in [
        json!({"title": "spec"}),
        json!({"operation_id": "", "title": "spec"}),
        json!({"operation_id": "x", "title": 5}),
        json!({"operation_id": "x", "title": "spec", "extra": true}),
        json!({"operation_id": "x", "title": "spec", "watcher": ""}),
    ] {
        assert_eq!(
            error_code(&s.call("create_issue", bad)),
            "invalid_arguments"
        );
    }
    let token = request_state(&s.call("create_issue", args("case-bad")));
    let declined = s.resume(
        "create_issue",
        args("case-bad"),
        &token,
        json!({"body": {"action": "decline"}}),
    );
    assert_eq!(error_code(&declined), "invalid_arguments");
    let missing = s.resume("create_issue", args("case-bad"), &token, json!({}));
    assert_eq!(error_code(&missing), "invalid_arguments");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 0);
    assert_eq!(count(&db, "operations"), 0);
}

fn a_revoked_principal_is_refused_and_sees_nothing(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let (token, _) = create(&mut s, "case-rev", "alpha");
    assert_eq!(s.finish(), 0);
    // Revoked while a server runs: the principal is re-read on every call.
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    assert_eq!(s.status("case-rev")["state"], "applied");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = db.store();
    rt.block_on(async {
        toolledger::authz::PrincipalStore::new(store)
            .revoke("alice", &[], &[], true)
            .await
            .unwrap();
    });
    let replay = s.resume("create_issue", args("case-rev"), &token, body("alpha"));
    assert_eq!(error_code(&replay), "permission_denied");
    let st = s.call("get_operation_status", json!({"operation_id": "case-rev"}));
    assert_eq!(error_code(&st), "permission_denied");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
}

fn watcher_step_adds_a_watcher_and_applies(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let a = json!({"operation_id": "case-w", "title": "spec", "watcher": "bob"});
    let token = request_state(&s.call("create_issue", a.clone()));
    let done = s.resume("create_issue", a, &token, body("alpha"));
    assert_eq!(done["structuredContent"]["state"], "applied");
    assert_eq!(s.status("case-w")["state"], "applied");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issue_watchers"), 1);
    let kinds: Vec<String> = events(&db).into_iter().map(|e| e.0).collect();
    assert_eq!(kinds, ["first_step", "watcher_added"]);
}

fn watcher_failure_with_failed_compensation_ends_partial_with_every_attempt_recorded(db: Db) {
    let flags = [
        "--clock-epoch",
        EPOCH,
        "--fault",
        "watcher-failure",
        "--fault",
        "compensation-failure",
    ];
    let mut s = Server::start(&db, "alice", &flags);
    let a = json!({"operation_id": "case-12", "title": "spec", "watcher": "bob"});
    let token = request_state(&s.call("create_issue", a.clone()));
    let done = s.resume("create_issue", a.clone(), &token, body("alpha"));
    assert_eq!(
        done["structuredContent"],
        json!({"operationId": "case-12", "effectId": 1, "result": "created 1",
               "replayed": false, "state": "partial"})
    );
    let replay = s.resume("create_issue", a, &token, body("alpha"));
    assert_eq!(replay["structuredContent"]["state"], "partial");
    assert_eq!(replay["structuredContent"]["replayed"], true);
    let st = s.status("case-12");
    assert_eq!(st["state"], "partial");
    assert_eq!(st["matchingIds"], json!([1]));
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "issue_watchers"), 0);
    assert_eq!(count(&db, "compensations"), 0);
    let ev = events(&db);
    let kinds: Vec<&str> = ev.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        kinds,
        ["first_step", "watcher_failed", "compensation_failed"]
    );
    assert_eq!(ev[1].1["watcher"], "bob");
}

fn watcher_failure_with_compensation_records_the_compensation(db: Db) {
    let mut s = Server::start(
        &db,
        "alice",
        &["--clock-epoch", EPOCH, "--fault", "watcher-failure"],
    );
    let a = json!({"operation_id": "case-12b", "title": "spec", "watcher": "bob"});
    let token = request_state(&s.call("create_issue", a.clone()));
    let done = s.resume("create_issue", a, &token, body("alpha"));
    assert_eq!(done["structuredContent"]["state"], "partial");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "compensations"), 1);
    let kinds: Vec<String> = events(&db).into_iter().map(|e| e.0).collect();
    assert_eq!(
        kinds,
        ["first_step", "watcher_failed", "compensation_applied"]
    );
}

fn crash_before_commit(db: Db, fault: &str, code: i32) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH, "--fault", fault]);
    let token = request_state(&s.call("create_issue", args("case-f")));
    s.send(
        &json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": "create_issue", "arguments": args("case-f"), "requestState": token,
        "inputResponses": body("alpha"), "_meta": meta()}}),
    );
    assert_eq!(s.try_recv(), None);
    assert_eq!(s.wait_exit(), code);
    assert_eq!(count(&db, "issues"), 0);
    assert_eq!(count(&db, "operations"), 0);
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    assert_eq!(s.status("case-f")["state"], "unknown");
    // Nothing committed, so the same continuation may now run for the first time.
    let retry = s.resume("create_issue", args("case-f"), &token, body("alpha"));
    assert_eq!(retry["structuredContent"]["replayed"], false);
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
}

fn exit_after_ledger_insert_leaves_no_rows(db: Db) {
    crash_before_commit(db, "exit-after-ledger-insert", 71);
}

fn exit_after_effect_insert_leaves_no_rows(db: Db) {
    crash_before_commit(db, "exit-after-effect-insert", 72);
}

fn exit_after_partial_first_commit_leaves_an_in_progress_row(db: Db) {
    let a = json!({"operation_id": "case-73", "title": "spec", "watcher": "bob"});
    let mut s = Server::start(
        &db,
        "alice",
        &[
            "--clock-epoch",
            EPOCH,
            "--fault",
            "exit-after-partial-first-commit",
        ],
    );
    let token = request_state(&s.call("create_issue", a.clone()));
    s.send(
        &json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": "create_issue", "arguments": a, "requestState": token,
        "inputResponses": body("alpha"), "_meta": meta()}}),
    );
    assert_eq!(s.try_recv(), None);
    assert_eq!(s.wait_exit(), 73);
    assert_eq!(count(&db, "operations"), 1);
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM operations WHERE state = 'in_progress'"
        ),
        1
    );
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let st = s.status("case-73");
    assert_eq!(st["state"], "unknown");
    assert_eq!(st["authoritative"], false);
    let replay = s.resume("create_issue", a, &token, body("alpha"));
    assert_eq!(error_code(&replay), "operation_in_progress");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "issue_watchers"), 0);
}

fn a_fault_never_fires_on_a_replay(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let (token, _) = create(&mut s, "case-nf", "alpha");
    assert_eq!(s.finish(), 0);
    for fault in [
        "drop-after-commit",
        "exit-after-ledger-insert",
        "exit-after-effect-insert",
    ] {
        let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH, "--fault", fault]);
        let replay = s.resume("create_issue", args("case-nf"), &token, body("alpha"));
        assert_eq!(replay["structuredContent"]["replayed"], true, "{fault}");
        assert_eq!(s.finish(), 0);
    }
    assert_eq!(count(&db, "issues"), 1);
}

fn two_processes_sending_the_same_continuation_at_once_make_one_issue(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let token = request_state(&s.call("create_issue", args("case-08")));
    assert_eq!(s.finish(), 0);
    let mut a = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let mut b = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    // Both servers are up (each answers a status) before the race starts.
    assert_eq!(a.status("case-08")["state"], "unknown");
    assert_eq!(b.status("case-08")["state"], "unknown");
    let line = json!({"jsonrpc": "2.0", "id": 50, "method": "tools/call", "params": {
        "name": "create_issue", "arguments": args("case-08"), "requestState": token,
        "inputResponses": body("alpha"), "_meta": meta()}})
    .to_string();
    a.send_line(&line);
    b.send_line(&line);
    let ra = a.recv();
    let rb = b.recv();
    let mut replayed = [
        ra["result"]["structuredContent"]["replayed"]
            .as_bool()
            .unwrap(),
        rb["result"]["structuredContent"]["replayed"]
            .as_bool()
            .unwrap(),
    ];
    replayed.sort();
    assert_eq!(replayed, [false, true]);
    assert_eq!(
        ra["result"]["structuredContent"]["effectId"],
        rb["result"]["structuredContent"]["effectId"]
    );
    assert_eq!(a.finish(), 0);
    assert_eq!(b.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "operations"), 1);
}

fn legacy_initialize_lifecycle_lists_tools_and_refuses_the_second_round_clearly(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    s.send(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "legacy", "version": "1"}}}),
    );
    let init = s.recv();
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25");
    assert_eq!(init["result"]["serverInfo"]["name"], "toolledger");
    s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    s.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    let list = s.recv();
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"create_issue") && names.contains(&"get_operation_status"));
    s.send(
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "create_issue", "arguments": args("legacy-1")}}),
    );
    let r = s.recv();
    assert_eq!(error_code(&r["result"]), "continuation_unsupported");
    assert!(r["result"].get("resultType").is_none(), "legacy shape: {r}");
    s.send(
        &json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
        "name": "get_operation_status", "arguments": {"operation_id": "legacy-1"}}}),
    );
    let st = s.recv();
    assert_eq!(st["result"]["structuredContent"]["state"], "unknown");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 0);
}

fn tool_annotations_are_honest(db: Db) {
    for (flags, idempotent) in [(vec![], true), (vec!["--unguarded"], false)] {
        let mut s = Server::start(&db, "alice", &flags);
        s.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                       "params": {"_meta": meta()}}));
        let list = s.recv();
        let tools = list["result"]["tools"].as_array().unwrap().clone();
        let find = |n: &str| tools.iter().find(|t| t["name"] == n).unwrap().clone();
        let status = find("get_operation_status");
        assert_eq!(status["annotations"]["readOnlyHint"], true);
        let create = find("create_issue");
        assert_eq!(create["annotations"]["readOnlyHint"], false);
        assert_eq!(create["annotations"]["idempotentHint"], idempotent);
        for tool in &tools {
            assert_eq!(tool["outputSchema"]["type"], "object", "{tool}");
        }
        assert_eq!(s.finish(), 0);
    }
}

#[test]
fn serve_refuses_to_start_without_a_principal_or_with_a_short_key() {
    let (_d, db) = fresh_db();
    let out = std::process::Command::new(bin())
        .args(["serve", "--db"])
        .arg(&db)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(String::from_utf8_lossy(&out.stderr).trim())
            .unwrap()["error"]["code"],
        "PRINCIPAL_REQUIRED"
    );
    let out = std::process::Command::new(bin())
        .args(serve_args(&db, "alice", &[]))
        .env("TOOLLEDGER_STATE_KEY_HEX", "abcd")
        .env("TOOLLEDGER_FINGERPRINT_KEY_HEX", "ab".repeat(32))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(err["error"]["code"], "KEY_ERROR");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("abcd"));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(db.to_str().unwrap()));
    // A principal the ledger does not have would be denied every call: no start.
    let out = std::process::Command::new(bin())
        .args(serve_args(&db, "ghost", &[]))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(err["error"]["code"], "PRINCIPAL_NOT_FOUND", "{err}");
}

fn continuations_survive_a_restart_with_environment_keys_and_fail_with_other_keys(db: Db) {
    let fp = "cd".repeat(32);
    let start = |state_key: &str| {
        Server::start_with_env(
            &db,
            "alice",
            &["--clock-epoch", EPOCH],
            &[
                ("TOOLLEDGER_STATE_KEY_HEX", state_key),
                ("TOOLLEDGER_FINGERPRINT_KEY_HEX", &fp),
            ],
        )
    };
    let old = "11".repeat(32);
    let new = "22".repeat(32);
    let mut s = start(&old);
    let token = request_state(&s.call("create_issue", args("k-1")));
    assert_eq!(s.finish(), 0);
    // Rotated: the new key seals, the old one still opens.
    let mut s = start(&format!("{new},{old}"));
    let done = s.resume("create_issue", args("k-1"), &token, body("alpha"));
    assert_eq!(done["structuredContent"]["replayed"], false, "{done}");
    assert_eq!(s.finish(), 0);
    // Retired: a token of a key no longer configured does not open.
    let mut s = start(&new);
    let again = s.resume_reply("create_issue", args("k-1"), &token, body("alpha"));
    assert_state_invalid(&again);
    assert_eq!(s.finish(), 0);
    // A state key the database never saw (no rotation from a known one) does not start.
    let stranger = "33".repeat(32);
    let refused = refused_start(
        &db,
        &[
            ("TOOLLEDGER_STATE_KEY_HEX", &stranger),
            ("TOOLLEDGER_FINGERPRINT_KEY_HEX", &fp),
        ],
    );
    assert!(refused.contains("TOOLLEDGER_STATE_KEY_HEX"), "{refused}");
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM key_ids WHERE purpose = 'state'"),
        2,
        "the old key and the rotated-in new one"
    );
}

/// Starts `serve` with `env` and expects it to refuse at once: exit 2 with `KEY_MISMATCH`.
/// Returns the message, which names no key.
fn refused_start(db: &Db, env: &[(&str, &str)]) -> String {
    let out = serve_command(db, &["--principal".into(), "alice".into()])
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(err["error"]["code"], "KEY_MISMATCH", "{err}");
    let message = err["error"]["message"].as_str().unwrap().to_string();
    for (_, key) in env {
        assert!(!message.contains(key), "{message}");
    }
    message
}

fn a_server_with_another_fingerprint_key_than_the_database_refuses_to_start(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    create(&mut s, "kb-1", "alpha");
    assert_eq!(s.finish(), 0);
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM key_ids WHERE purpose = 'fingerprint'"
        ),
        1
    );
    let (other_state, other_fp) = ("44".repeat(32), "55".repeat(32));
    let refused = refused_start(
        &db,
        &[
            ("TOOLLEDGER_STATE_KEY_HEX", &other_state),
            ("TOOLLEDGER_FINGERPRINT_KEY_HEX", &other_fp),
        ],
    );
    assert!(refused.contains("fingerprint key"), "{refused}");
    if let Db::Sqlite(file) = &db {
        // A SQLite database restored without its key file: new keys would be made, and
        // are refused (the new key file stays, the database is unchanged).
        let keys = toolledger_mcp::KeyMaterial::file_path(file.path());
        let saved = std::fs::read(&keys).unwrap();
        std::fs::remove_file(&keys).unwrap();
        refused_start(&db, &[]);
        std::fs::write(&keys, saved).unwrap();
    }
    // With the database's own keys, the operation still replays.
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let again = s.call("create_issue", args("kb-1"));
    assert_eq!(again["structuredContent"]["replayed"], true, "{again}");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
}

fn legacy_lifecycle_asks_for_the_body_by_elicitation_and_a_retried_call_replays(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    s.send(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"elicitation": {"form": {}}},
        "clientInfo": {"name": "legacy", "version": "1"}}}),
    );
    assert_eq!(s.recv()["result"]["protocolVersion"], "2025-11-25");
    s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    // `answer`: the body to give when the server asks; `None`: the server must not ask.
    let mut call = |id: i64, title: &str, answer: Option<&str>| {
        s.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "create_issue", "arguments": {"operation_id": "legacy-e", "title": title}}}),
        );
        if let Some(text) = answer {
            let ask = s.recv();
            assert_eq!(ask["method"], "elicitation/create", "{ask}");
            assert_eq!(ask["params"]["message"], "Provide the issue body");
            assert_eq!(
                ask["params"]["requestedSchema"]["required"],
                json!(["body"])
            );
            s.send(&json!({"jsonrpc": "2.0", "id": ask["id"], "result": {
                "action": "accept", "content": {"body": text}}}));
        }
        let reply = s.recv();
        assert_eq!(reply["id"], id, "{reply}");
        reply["result"].clone()
    };
    let first = call(10, "spec", Some("alpha"));
    assert_eq!(
        first["structuredContent"],
        json!({"operationId": "legacy-e", "effectId": 1, "result": "created 1",
               "replayed": false, "state": "applied"})
    );
    // The operation exists: a retried call replays without asking for the body again.
    let again = call(11, "spec", None);
    assert_eq!(again["structuredContent"]["replayed"], true, "{again}");
    assert_eq!(again["structuredContent"]["effectId"], 1);
    // The same id with another title is another request.
    let changed = call(12, "other", None);
    assert_eq!(error_code(&changed), "operation_conflict");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "operations"), 1);
}

fn the_same_continuation_twice_in_flight_on_one_connection_makes_one_issue(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", EPOCH]);
    let token = request_state(&s.call("create_issue", args("case-inflight")));
    for id in [100, 101] {
        s.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "create_issue", "arguments": args("case-inflight"), "requestState": token,
            "inputResponses": body("alpha"), "_meta": meta()}}),
        );
    }
    let (a, b) = (s.recv(), s.recv());
    let mut ids = [a["id"].as_i64().unwrap(), b["id"].as_i64().unwrap()];
    ids.sort();
    assert_eq!(ids, [100, 101]);
    let mut replayed = [
        a["result"]["structuredContent"]["replayed"]
            .as_bool()
            .unwrap(),
        b["result"]["structuredContent"]["replayed"]
            .as_bool()
            .unwrap(),
    ];
    replayed.sort();
    assert_eq!(replayed, [false, true]);
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "issues"), 1);
    assert_eq!(count(&db, "operations"), 1);
}
