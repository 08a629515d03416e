//! Multi-host simulation on one PostgreSQL database: two `toolledger serve` processes and two
//! `toolledger worker` processes share one ledger, as servers and workers on different hosts
//! would. The same continuation goes to both servers at once; both workers poll one backlog.
//! One server and one worker are SIGKILLed mid-run; the survivors finish. Exactly one effect
//! per operation, every delivery reconciled once, no lost intent.
//! (`TOOLLEDGER_TEST_DATABASE_URL`; skipped with one loud line when unset, failing in CI.)

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::toolledger;
use support::wire::Server;
use toolledger_testkit::conformance::Harness;
use toolledger_testkit::db::{scalar, sqlite_count};
use toolledger_testkit::kill::Killed;

const STATE_KEY: &str = "7374617465206b657920666f7220746865206d756c74692d686f73742074657374";
const FP_KEY: &str = "66696e6765727072696e74206b657920666f7220746865206d756c74692d686f7374";

fn run(url: &str, args: &[&str]) -> (i32, Value) {
    let out = toolledger()
        .args(args)
        .args(["--database-url", url])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), v)
}

/// One `toolledger serve` on stdio acting for `alice`.
/// A `serve` on the shared ledger; its payments stand-in keeps its receipts in `downstream`
/// (not the default location in the user's data directory).
fn start_server(url: &str, downstream: &Path) -> Server {
    let mut command = toolledger();
    command
        .args(["serve", "--principal", "alice", "--database-url", url])
        .arg("--downstream-db")
        .arg(downstream)
        .env("TOOLLEDGER_STATE_KEY_HEX", STATE_KEY)
        .env("TOOLLEDGER_FINGERPRINT_KEY_HEX", FP_KEY);
    Server::spawn(command)
}

/// `toolledger worker` `name` on the ledger at `url`.
fn start_worker(url: &str, downstream: &Path, name: &str) -> Killed {
    Killed(
        toolledger()
            .args(["worker", "--database-url", url, "--downstream-db"])
            .arg(downstream)
            .args(["--worker-id", name, "--poll-interval", "50", "--batch", "4"])
            .args(["--lease-seconds", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_and_two_workers_share_one_postgres_ledger() {
    let Some(h) = Harness::postgres() else { return };
    let store = h.open();
    let url = h.database_url().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let downstream = dir.path().join("payments.sqlite");

    assert_eq!(run(&url, &["migrate"]).0, 0);
    let (code, _) = run(
        &url,
        &[
            "principal",
            "add",
            "alice",
            "--tenant",
            "acme",
            "--role",
            "editor",
            "--scope",
            "automation:write",
        ],
    );
    assert_eq!(code, 0);

    // --- Deferred effects: a backlog of accepted intents, two workers, one killed. ---
    const N: usize = 10;
    let template: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/fixtures/refund-order.json"),
        )
        .unwrap(),
    )
    .unwrap();
    for i in 0..N {
        let mut f = template.clone();
        f["arguments"]["idempotency_key"] = json!(format!("refund-{i}"));
        f["arguments"]["order_id"] = json!(format!("ord-{i}"));
        f["arguments"]["approval"] = json!(format!("approval-{i:04}"));
        f["provider"]["call_id"] = json!(format!("call-{i}"));
        f["setup"]["orders"][0]["id"] = json!(format!("ord-{i}"));
        let path = dir.path().join(format!("case-{i}.json"));
        std::fs::write(&path, f.to_string()).unwrap();
        let p = path.to_str().unwrap();
        let ds = downstream.to_str().unwrap();
        let (code, v) = run(
            &url,
            &[
                "approve",
                "--fixture",
                p,
                "--approver",
                "bob",
                "--downstream-db",
                ds,
            ],
        );
        assert_eq!(code, 0, "{v}");
        let (code, v) = run(
            &url,
            &[
                "dispatch",
                "--fixture",
                p,
                "--failure",
                "after_intent_commit",
                "--downstream-db",
                ds,
            ],
        );
        assert_eq!(
            (code, v["code"].as_str()),
            (1, Some("OUTCOME_UNKNOWN")),
            "{v}"
        );
    }
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM outbox WHERE state = 'pending'"
        )
        .await,
        N as i64
    );
    let mut w1 = start_worker(&url, &downstream, "w1");
    let _w2 = start_worker(&url, &downstream, "w2");
    // Kill w1 as soon as it holds a lease (mid-run), leaving that lease to expire.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held = scalar(
            &store,
            "SELECT count(*) FROM operation_events WHERE kind = 'claimed' AND detail LIKE '%\"lease_owner\":\"w1\"%'",
        )
        .await;
        if held > 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = w1.0.kill();
    let _ = w1.0.wait();

    // --- Inline effects: the same continuation to both servers at once; one server killed. ---
    let servers_downstream = dir.path().join("servers-payments.sqlite");
    let mut a = start_server(&url, &servers_downstream);
    let mut b = start_server(&url, &servers_downstream);
    const M: usize = 8;
    let mut a_alive = true;
    let mut id = 0;
    for i in 0..M {
        let op = format!("issue-{i}");
        let args = json!({"operation_id": op, "title": format!("title {i}")});
        id += 1;
        let first = if a_alive { &mut a } else { &mut b };
        first.send_call(id, json!({"name": "create_issue", "arguments": args}));
        let r = first.recv_result(id);
        assert_eq!(r["resultType"], "input_required", "{r}");
        let state = r["requestState"].as_str().unwrap().to_string();
        let cont = json!({
            "name": "create_issue",
            "arguments": args,
            "requestState": state,
            "inputResponses": {"body": {"action": "accept", "content": {"body": format!("body {i}")}}},
        });
        id += 1;
        if a_alive {
            a.send_call(id, cont.clone());
        }
        b.send_call(id, cont);
        if a_alive && i == M / 2 {
            // The reply of A is lost with A; B's answer stands.
            a.kill();
            a_alive = false;
            let rb = b.recv_result(id);
            assert_eq!(rb["isError"], false, "{rb}");
            continue;
        }
        let rb = b.recv_result(id);
        assert_eq!(rb["isError"], false, "{rb}");
        if a_alive {
            let ra = a.recv_result(id);
            assert_eq!(ra["isError"], false, "{ra}");
            let (sa, sb) = (&ra["structuredContent"], &rb["structuredContent"]);
            assert_eq!(
                sa["effectId"], sb["effectId"],
                "one effect for both servers"
            );
            let replays = [sa["replayed"].as_bool(), sb["replayed"].as_bool()];
            assert!(
                replays == [Some(true), Some(false)] || replays == [Some(false), Some(true)],
                "one fresh answer and one replay: {sa} {sb}"
            );
        }
    }
    // Every operation has exactly one issue; the survivor reports each as applied.
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM issues").await,
        M as i64
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM (SELECT operation_key FROM issues GROUP BY operation_key HAVING count(*) > 1) AS d"
        )
        .await,
        0
    );
    for i in 0..M {
        id += 1;
        b.send_call(
            id,
            json!({"name": "get_operation_status", "arguments": {"operation_id": format!("issue-{i}")}}),
        );
        let st = b.recv_result(id);
        assert_eq!(st["structuredContent"]["state"], "applied", "{st}");
        assert_eq!(
            st["structuredContent"]["matchingIds"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }

    // The surviving worker finishes the backlog, including the killed worker's lease.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = scalar(
            &store,
            "SELECT count(*) FROM operations WHERE effect_kind = 'deferred' AND state = 'succeeded'",
        )
        .await;
        if done == N as i64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "backlog not finished: {done} of {N}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM outbox WHERE state = 'delivered'"
        )
        .await,
        N as i64
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM local_receipts").await,
        N as i64
    );
    // One reconciled delivery per operation, each under the token of the claim that made it.
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM local_receipts r JOIN outbox e ON e.operation_id = r.operation_id
             WHERE r.fencing_token = e.fencing_token"
        )
        .await,
        N as i64
    );
    let effects = sqlite_count(&downstream, "downstream_receipts");
    assert_eq!(
        effects, N as i64,
        "exactly one downstream effect per operation"
    );
    let (code, audit) = run(&url, &["audit"]);
    assert_eq!(code, 0, "{audit}");
    assert_eq!(audit["gate"], "PASS");
}
