//! Operators find, explain and settle unsure operations with the built binary: `operations
//! list` (filters, order, limit, JSON lines), `operations show` (the timeline), `status
//! --status-ref` without a fixture, and `resolve` of a stuck `in_progress` inline operation,
//! a `partial` one and a deferred one left `processing` by a crash after the downstream
//! commit — on SQLite and on PostgreSQL. Refusals change nothing.

#[macro_use]
mod support;

use serde_json::{json, Value};
use support::wire::*;
use support::Run;

const EPOCH: i64 = 1_800_000_000;
/// The in-progress expiry (seconds), as documented.
const EXPIRY: i64 = 300;

on_both_backends!(
    a_stuck_in_progress_operation_is_found_explained_and_settled,
    a_refund_left_processing_is_resolved_against_the_downstream_once_its_lease_expired,
    list_filters_by_state_tool_and_age_orders_and_limits,
    bad_operator_input_is_a_stable_code_and_changes_nothing,
);

/// Runs `cmd` on `db` (its store flags after the subcommand words) with `extra` flags.
fn cli(db: &Db, cmd: &[&str], extra: &[&str]) -> Run {
    let mut c = support::toolledger();
    c.args(cmd)
        .args(db.store_args())
        .args(extra)
        .env_remove("TOOLLEDGER_TEST_HOLD_AT")
        .stdin(std::process::Stdio::null());
    c.output().unwrap().into()
}

fn lines(r: &Run) -> Vec<Value> {
    r.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn at(t: i64) -> String {
    t.to_string()
}

/// Every row of the ledger's history tables, for "nothing changed" checks.
fn fingerprint_of(db: &Db) -> Vec<(String, String)> {
    let mut v = db.pairs(
        "SELECT status_ref || ':' || state, CAST(updated_at AS TEXT) FROM operations ORDER BY id",
    );
    v.extend(db.pairs("SELECT CAST(id AS TEXT), kind || detail FROM operation_events ORDER BY id"));
    v
}

fn resolve(db: &Db, sr: &str, as_: &str, t: i64) -> Run {
    cli(
        db,
        &["resolve"],
        &[
            "--status-ref",
            sr,
            "--as",
            as_,
            "--reason",
            "issue tracker shows the issue, no watcher",
            "--operator",
            "olga",
            "--clock-epoch",
            &at(t),
        ],
    )
}

fn a_stuck_in_progress_operation_is_found_explained_and_settled(db: Db) {
    add_principal(&db, "olga", "acme", &["operator"], &[], false);
    let epoch = at(EPOCH);
    let mut s = Server::start(
        &db,
        "alice",
        &[
            "--clock-epoch",
            &epoch,
            "--fault",
            "exit-after-partial-first-commit",
        ],
    );
    let a = json!({"operation_id": "case-73", "title": "spec", "watcher": "bob"});
    let token = request_state(&s.call("create_issue", a.clone()));
    s.send(
        &json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": "create_issue", "arguments": a, "requestState": token,
        "inputResponses": body("alpha"), "_meta": meta()}}),
    );
    assert_eq!(s.wait_exit(), 73);

    // Found: the one in_progress operation, with its principal and age.
    let list = cli(
        &db,
        &["operations", "list"],
        &["--state", "in_progress", "--clock-epoch", &at(EPOCH + 10)],
    );
    assert_eq!(list.code, 0, "{}", list.stderr);
    let rows = lines(&list);
    assert_eq!(rows.len(), 1, "{}", list.stdout);
    let r = &rows[0];
    assert_eq!(
        (
            &r["tool"],
            &r["key"],
            &r["tenant"],
            &r["subject"],
            &r["state"]
        ),
        (
            &json!("create_issue"),
            &json!("case-73"),
            &json!("acme"),
            &json!("alice"),
            &json!("in_progress")
        )
    );
    assert_eq!(r["age_seconds"], 10);
    let sr = r["status_ref"].as_str().unwrap().to_string();

    // Explained: by tool and key, the first step's event, not stuck yet; stuck at the expiry.
    let show = cli(
        &db,
        &["operations", "show"],
        &[
            "--tool",
            "create_issue",
            "--key",
            "case-73",
            "--clock-epoch",
            &at(EPOCH + 10),
        ],
    );
    assert_eq!(show.code, 0, "{}", show.stderr);
    let t = show.json();
    assert_eq!(t["operation"]["status_ref"], sr.as_str());
    assert_eq!(t["operation"]["stuck"], false);
    let kinds: Vec<&str> = t["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["first_step"]);
    assert_eq!(t["outbox"], Value::Null);
    assert_eq!(t["resolution"], Value::Null);
    let stuck = cli(
        &db,
        &["operations", "show", &sr],
        &["--clock-epoch", &at(EPOCH + EXPIRY)],
    );
    assert_eq!(stuck.json()["operation"]["stuck"], true);
    let status = cli(
        &db,
        &["status"],
        &["--status-ref", &sr, "--clock-epoch", &at(EPOCH + EXPIRY)],
    );
    assert_eq!(status.code, 1);
    assert_eq!(
        status.json(),
        json!({"code": "OUTCOME_UNKNOWN", "gate": "BLOCK", "status": "in_progress",
               "status_ref": sr, "stuck": true, "tool": "create_issue"})
    );

    // A replay after the expiry says the operation is stuck and names the command.
    let mut s = Server::start(&db, "alice", &["--clock-epoch", &at(EPOCH + EXPIRY)]);
    let replay = s.resume("create_issue", a.clone(), &token, body("alpha"));
    assert_eq!(error_code(&replay), "operation_in_progress");
    let message = toolledger_mcp::error_of(&replay).unwrap()["message"].clone();
    assert!(
        message
            .as_str()
            .unwrap()
            .contains(&format!("toolledger resolve --status-ref {sr}")),
        "{message}"
    );
    assert_eq!(s.finish(), 0);

    // Refused where resolving would lie or race, and nothing changes.
    let before = fingerprint_of(&db);
    let early = resolve(&db, &sr, "partial", EPOCH + EXPIRY - 1);
    assert_eq!(early.code, 1);
    assert_eq!(early.json()["code"], "OPERATION_IN_PROGRESS");
    let failed = resolve(&db, &sr, "failed", EPOCH + EXPIRY);
    assert_eq!(failed.code, 1);
    assert_eq!(failed.json()["code"], "INVALID_ARGUMENTS");
    add_principal(&db, "omar", "acme", &["editor"], &[], false);
    let not_operator = cli(
        &db,
        &["resolve"],
        &[
            "--status-ref",
            &sr,
            "--as",
            "partial",
            "--reason",
            "x",
            "--operator",
            "omar",
            "--clock-epoch",
            &at(EPOCH + EXPIRY),
        ],
    );
    assert_eq!(not_operator.json()["code"], "PERMISSION_DENIED");
    assert_eq!(fingerprint_of(&db), before);

    // Settled as partial, with the first step's result, and audited.
    let done = resolve(&db, &sr, "partial", EPOCH + EXPIRY);
    assert_eq!(done.code, 0, "{}", done.stdout);
    let v = done.json();
    assert_eq!(v["status"], "partial");
    assert_eq!(v["resolved_as"], "partial");
    assert_eq!(v["result"]["effectId"], 1);
    let t = cli(&db, &["operations", "show", &sr], &[]).json();
    assert_eq!(t["operation"]["state"], "partial");
    assert_eq!(t["resolution"]["operator"], "olga");
    assert_eq!(t["resolution"]["previous_state"], "in_progress");
    assert_eq!(t["resolution"]["at"], EPOCH + EXPIRY);
    assert_eq!(t["resolution"]["evidence"], "first_step");
    // The replay now returns the stored result.
    let mut s = Server::start(&db, "alice", &["--clock-epoch", &at(EPOCH + EXPIRY)]);
    let replay = s.resume("create_issue", a, &token, body("alpha"));
    assert_eq!(replay["structuredContent"]["state"], "partial", "{replay}");
    assert_eq!(replay["structuredContent"]["replayed"], true);
    assert_eq!(s.finish(), 0);

    // A partial operation settles as applied once the watcher was added by hand.
    let again = resolve(&db, &sr, "partial", EPOCH + EXPIRY + 1);
    assert_eq!(again.json()["code"], "INVALID_ARGUMENTS");
    let applied = resolve(&db, &sr, "applied", EPOCH + EXPIRY + 1);
    assert_eq!(applied.code, 0, "{}", applied.stdout);
    assert_eq!(applied.json()["status"], "applied");
    let status = cli(&db, &["status"], &["--status-ref", &sr]);
    assert_eq!(status.code, 0);
    assert_eq!(status.json()["code"], "OK");
    assert_eq!(status.json()["result"]["effectId"], 1);
    let finished = resolve(&db, &sr, "applied", EPOCH + EXPIRY + 2);
    assert_eq!(finished.json()["code"], "INVALID_ARGUMENTS");
    let resolved: Vec<(String, Value)> = events(&db)
        .into_iter()
        .filter(|e| e.0 == "resolved")
        .collect();
    assert_eq!(resolved.len(), 2);
    assert_eq!(resolved[1].1["previous_state"], "partial");
    assert_eq!(count(&db, "issues"), 1, "no effect ran again");
}

fn a_refund_left_processing_is_resolved_against_the_downstream_once_its_lease_expired(db: Db) {
    add_principal(&db, "bob", "acme", &["approver"], &[], false);
    add_principal(&db, "olga", "acme", &["operator"], &[], false);
    let f = support::runtime::example("refund-order.json");
    let f = f.to_str().unwrap();
    assert_eq!(
        cli(&db, &["approve"], &["--fixture", f, "--approver", "bob"]).code,
        0
    );
    let d = cli(
        &db,
        &["dispatch"],
        &["--fixture", f, "--failure", "after_downstream_commit"],
    );
    assert_eq!(d.code, 1, "{}", d.stdout);
    let v = d.json();
    assert_eq!(v["code"], "OUTCOME_UNKNOWN");
    assert_eq!(v["status"], "processing");
    let sr = v["status_ref"].as_str().unwrap().to_string();
    let now = 1_767_225_600i64;

    // The same state name everywhere: dispatch, list, show, status.
    let list = cli(
        &db,
        &["operations", "list"],
        &["--tool", "refund_order", "--clock-epoch", &at(now + 5)],
    );
    let rows = lines(&list);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["state"], "processing");
    assert_eq!(rows[0]["effect_kind"], "deferred");
    let t = cli(
        &db,
        &["operations", "show", &sr],
        &["--clock-epoch", &at(now + 5)],
    )
    .json();
    assert_eq!(t["operation"]["state"], "processing");
    // The outbox's word for a claimed event: never an operation's state.
    assert_eq!(t["outbox"]["state"], "leased");
    assert_eq!(t["outbox"]["fencing_token"], 1);
    assert_eq!(t["outbox"]["lease_live"], true);
    assert_eq!(t["claims"][0]["fencing_token"], 1);
    assert_eq!(t["claims"][0]["lease_until"], now + 30);
    assert_eq!(t["intent"]["approval"]["approver"], "bob");
    assert_eq!(t["receipt"], Value::Null);
    let status = cli(&db, &["status"], &["--status-ref", &sr]);
    assert_eq!(status.json()["status"], "processing");
    assert_eq!(status.json()["code"], "OUTCOME_UNKNOWN");

    // A live lease: a worker may be calling the downstream right now.
    let before = fingerprint_of(&db);
    let live = cli(
        &db,
        &["resolve"],
        &[
            "--status-ref",
            &sr,
            "--as",
            "succeeded",
            "--reason",
            "dashboard",
            "--operator",
            "olga",
            "--clock-epoch",
            &at(now + 29),
        ],
    );
    assert_eq!(live.code, 1);
    assert_eq!(live.json()["code"], "OPERATION_IN_PROGRESS");
    assert!(live.stdout.contains("processing"), "{}", live.stdout);
    // After it expired: the downstream holds a receipt, so `failed` would lie.
    let lie = cli(
        &db,
        &["resolve"],
        &[
            "--status-ref",
            &sr,
            "--as",
            "failed",
            "--reason",
            "dashboard",
            "--operator",
            "olga",
            "--clock-epoch",
            &at(now + 30),
        ],
    );
    assert_eq!(lie.json()["code"], "OPERATION_CONFLICT");
    let inline_word = cli(
        &db,
        &["resolve"],
        &[
            "--status-ref",
            &sr,
            "--as",
            "applied",
            "--reason",
            "dashboard",
            "--operator",
            "olga",
            "--clock-epoch",
            &at(now + 30),
        ],
    );
    assert_eq!(inline_word.json()["code"], "INVALID_ARGUMENTS");
    assert_eq!(fingerprint_of(&db), before);
    let ok = cli(
        &db,
        &["resolve"],
        &[
            "--status-ref",
            &sr,
            "--as",
            "succeeded",
            "--reason",
            "dashboard shows it",
            "--operator",
            "olga",
            "--clock-epoch",
            &at(now + 30),
        ],
    );
    assert_eq!(ok.code, 0, "{}", ok.stdout);
    assert_eq!(ok.json()["delivery"], "receipt_reconciled");
    let t = cli(&db, &["operations", "show", &sr], &[]).json();
    assert_eq!(t["operation"]["state"], "succeeded");
    assert_eq!(t["outbox"]["state"], "delivered");
    assert_eq!(
        t["outbox"]["fencing_token"], 2,
        "the resolution fenced the old lease"
    );
    assert_eq!(t["receipt"]["reconciled_via"], "status_query");
    assert_eq!(t["resolution"]["previous_state"], "processing");
    assert_eq!(t["resolution"]["evidence"], "receipt");
    let status = cli(&db, &["status"], &["--status-ref", &sr]);
    assert_eq!(
        (status.code, status.json()["code"].clone()),
        (0, json!("OK"))
    );
}

fn call_at(db: &Db, key: &str, t: i64) {
    let args = json!({"request_id": key, "interval_minutes": 60}).to_string();
    let r = cli(
        db,
        &["call", "create_automation"],
        &[
            "--principal",
            "alice",
            "--args",
            &args,
            "--clock-epoch",
            &at(t),
        ],
    );
    assert_eq!(r.code, 0, "{} / {}", r.stdout, r.stderr);
}

fn list_filters_by_state_tool_and_age_orders_and_limits(db: Db) {
    for (i, key) in ["k1", "k2", "k3", "k4"].iter().enumerate() {
        call_at(&db, key, EPOCH + 100 * i as i64);
    }
    let list = |extra: &[&str]| {
        let mut args = vec!["--clock-epoch", "1800000400"];
        args.extend_from_slice(extra);
        let r = cli(&db, &["operations", "list"], &args);
        assert_eq!(r.code, 0, "{}", r.stderr);
        lines(&r)
    };
    let keys = |rows: &[Value]| -> Vec<String> {
        rows.iter()
            .map(|r| r["key"].as_str().unwrap().to_string())
            .collect()
    };
    let all = list(&[]);
    assert_eq!(keys(&all), ["k4", "k3", "k2", "k1"], "newest first");
    assert_eq!(
        all.iter()
            .map(|r| r["age_seconds"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        [100, 200, 300, 400]
    );
    assert!(all
        .iter()
        .all(|r| r["state"] == "applied" && r["tool"] == "create_automation"));
    assert_eq!(keys(&list(&["--oldest-first"])), ["k1", "k2", "k3", "k4"]);
    assert_eq!(keys(&list(&["--limit", "2"])), ["k4", "k3"]);
    assert_eq!(keys(&list(&["--older-than", "250"])), ["k2", "k1"]);
    assert_eq!(
        keys(&list(&["--state", "applied", "--state", "partial"])).len(),
        4
    );
    assert!(list(&["--state", "outcome_unknown"]).is_empty());
    assert!(list(&["--tool", "refund_order"]).is_empty());
    assert_eq!(list(&["--tool", "create_automation", "--json"]).len(), 4);
}

fn bad_operator_input_is_a_stable_code_and_changes_nothing(db: Db) {
    call_at(&db, "k1", EPOCH);
    let before = fingerprint_of(&db);
    let refused = |cmd: &[&str], extra: &[&str], code: &str| {
        let r = cli(&db, cmd, extra);
        assert_eq!(r.code, 2, "{cmd:?} {extra:?}: {}", r.stderr);
        assert_eq!(r.stdout, "");
        let v: Value = serde_json::from_str(r.stderr.trim()).unwrap();
        assert_eq!(v["error"]["code"], code, "{}", r.stderr);
        assert!(!r.stderr.contains("postgres://"), "{}", r.stderr);
    };
    refused(
        &["operations", "list"],
        &["--state", "unknown"],
        "UNKNOWN_STATE",
    );
    refused(
        &["operations", "list"],
        &["--state", "OUTCOME_UNKNOWN"],
        "UNKNOWN_STATE",
    );
    refused(&["operations", "list"], &["--limit", "0"], "USAGE_ERROR");
    refused(
        &["operations", "list"],
        &["--limit", "10001"],
        "USAGE_ERROR",
    );
    refused(&["operations", "list"], &["--older-than=-1"], "USAGE_ERROR");
    refused(&["operations", "show"], &[], "USAGE_ERROR");
    refused(
        &["operations", "show", "op_x"],
        &["--tool", "t"],
        "USAGE_ERROR",
    );
    refused(&["operations", "show"], &["--key", "k1"], "USAGE_ERROR");
    let missing = cli(&db, &["operations", "show", "op_missing"], &[]);
    assert_eq!(missing.code, 1);
    assert_eq!(missing.json()["code"], "NOT_FOUND");
    let missing = cli(&db, &["status"], &["--status-ref", "op_missing"]);
    assert_eq!(missing.code, 1);
    assert_eq!(missing.json()["code"], "NOT_FOUND");
    let by_key = cli(
        &db,
        &["operations", "show"],
        &[
            "--tool",
            "create_automation",
            "--key",
            "k1",
            "--tenant",
            "other",
        ],
    );
    assert_eq!(by_key.json()["code"], "NOT_FOUND");
    let by_key = cli(
        &db,
        &["operations", "show"],
        &[
            "--tool",
            "create_automation",
            "--key",
            "k1",
            "--tenant",
            "acme",
            "--subject",
            "alice",
        ],
    );
    assert_eq!(by_key.code, 0);
    assert_eq!(
        by_key.json()["operation"]["arguments"]["interval_minutes"],
        60
    );
    assert_eq!(fingerprint_of(&db), before, "refusals changed nothing");
    // The same key under two principals needs --tenant and --subject.
    let args = json!({"request_id": "k1", "interval_minutes": 60}).to_string();
    let carol = cli(
        &db,
        &["call", "create_automation"],
        &[
            "--principal",
            "carol",
            "--args",
            &args,
            "--clock-epoch",
            &at(EPOCH),
        ],
    );
    assert_eq!(carol.code, 0, "{} / {}", carol.stdout, carol.stderr);
    refused(
        &["operations", "show"],
        &["--tool", "create_automation", "--key", "k1"],
        "AMBIGUOUS_OPERATION",
    );
    let carols = cli(
        &db,
        &["operations", "show"],
        &[
            "--tool",
            "create_automation",
            "--key",
            "k1",
            "--tenant",
            "other",
        ],
    );
    assert_eq!(carols.json()["operation"]["subject"], "carol");
}

#[test]
fn the_state_filter_of_the_list_is_served_by_an_index() {
    let d = support::Db::new();
    assert_eq!(support::runtime::run(&["migrate", "--db", d.db()]).code, 0);
    let c = rusqlite::Connection::open(d.path()).unwrap();
    // The statement `operations list --state outcome_unknown --state dead` runs.
    let mut plan = c
        .prepare(
            "EXPLAIN QUERY PLAN SELECT id, status_ref, tool, idempotency_key, tenant, subject,
                 effect_kind, state, created_at, updated_at
             FROM operations WHERE state IN (?1, ?2) ORDER BY id DESC LIMIT ?3",
        )
        .unwrap();
    let steps: Vec<String> = plan
        .query_map(["outcome_unknown", "dead", "100"], |r| {
            r.get::<_, String>(3)
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        steps
            .iter()
            .any(|s| s.contains("USING INDEX operations_by_state")),
        "{steps:?}"
    );
    assert!(
        !steps.iter().any(|s| s.starts_with("SCAN operations")),
        "{steps:?}"
    );
}
