//! `toolledger proxy` in front of an upstream written by others: the official Python SDK's
//! `MCPServer` charge server (`tests/proxy/charge_server.py`, which adds one row to its own
//! SQLite file per `charge` and never deduplicates), driven over the proxy's stdio with raw
//! JSON-RPC lines so each semantic is pinned exactly, on both backends:
//!
//! - the tool list: guarded tools gain a required `operation_id`, read-only ones pass
//!   through, `get_operation_status` is added;
//! - one forward per operation: a retry replays the upstream's exact answer (`replayed`),
//!   the same id with other arguments is `operation_conflict`, an upstream error result is
//!   stored (`failed`) and replayed, the upstream's JSON-RPC error comes back unchanged and is
//!   never stored;
//! - the intent and the claim are in the ledger while the upstream works, and a retry then is
//!   `operation_in_progress`;
//! - a lost answer (upstream killed, timeout, proxy killed after the upstream answered) is
//!   `outcome_unknown` and never forwarded again; the upstream is started again for the next
//!   call; the reconcile lookup settles it; `operations list` and `resolve` settle it too;
//! - a proxy killed after the intent committed but before the claim forwards on the retry;
//! - progress notifications reach the client under its own token; a cancelled guarded call
//!   still runs to its recorded end upstream, and the retry replays it;
//! - an upstream round that asks for input (`input_required`) reaches the client with the
//!   proxy's own sealed `requestState`, bound to the operation, and the continuation is the
//!   forward that acts;
//! - principal and scopes are re-read at replay and status;
//! - the operation id as `_meta`, forwarded as an argument or in `_meta`, or the upstream's
//!   own key argument.

#[macro_use]
mod support;
#[path = "support/raw.rs"]
mod raw;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::clients::{proxy_fixture, python};
use support::wire::{add_principal, toolledger, Db, Ledger, Server};

/// One proxy test's world: the ledger, the upstream's own file, a scratch directory.
struct World {
    db: Db,
    dir: tempfile::TempDir,
    python: PathBuf,
}

impl World {
    fn new(db: Db) -> Option<World> {
        let python = python()?;
        Some(World {
            db,
            dir: tempfile::tempdir().unwrap(),
            python,
        })
    }

    fn charge_db(&self) -> PathBuf {
        self.dir.path().join("charges.sqlite")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("proxy.log")
    }

    /// Writes `config` (TOML) and returns its path.
    fn config(&self, config: &str) -> PathBuf {
        let p = self.dir.path().join("proxy.toml");
        std::fs::write(&p, config).unwrap();
        p
    }

    /// The proxy's command: as `principal`, with `extra` flags, in front of the charge server
    /// (whose reply is delayed `delay_ms` after its commit).
    fn command(&self, principal: &str, extra: &[&str], delay_ms: u64) -> Command {
        let mut c = toolledger();
        c.arg("proxy")
            .args(self.db.store_args())
            .args(["--principal", principal])
            .args(extra)
            .arg("--")
            .arg(&self.python)
            .arg(proxy_fixture("charge_server.py"))
            .env("CHARGE_DB", self.charge_db())
            .env("CHARGE_DELAY_MS", delay_ms.to_string())
            .env_remove("TOOLLEDGER_STATE_KEY_HEX")
            .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
            .envs(self.db.key_env());
        c
    }

    fn start(&self, extra: &[&str], delay_ms: u64) -> Server {
        self.start_as("alice", extra, delay_ms, &[])
    }

    fn start_as(&self, who: &str, extra: &[&str], delay_ms: u64, env: &[(&str, &str)]) -> Server {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .unwrap();
        let mut c = self.command(who, extra, delay_ms);
        c.envs(env.iter().copied());
        Server::spawn_with_stderr(c, Stdio::from(log))
    }

    /// Rows of the charge server's own table.
    fn charges(&self) -> i64 {
        if !self.charge_db().exists() {
            return 0;
        }
        let conn = rusqlite::Connection::open(self.charge_db()).unwrap();
        conn.query_row("SELECT count(*) FROM charges", [], |r| r.get(0))
            .unwrap_or(0)
    }

    /// The `(reference, idempotency_key)` of every charge row.
    fn charge_keys(&self) -> Vec<(Option<String>, Option<String>)> {
        let conn = rusqlite::Connection::open(self.charge_db()).unwrap();
        let mut s = conn
            .prepare("SELECT reference, idempotency_key FROM charges ORDER BY id")
            .unwrap();
        s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// Waits until the upstream has committed `n` charge rows.
    fn wait_for_charges(&self, n: i64) {
        let until = Instant::now() + Duration::from_secs(30);
        while self.charges() < n {
            assert!(
                Instant::now() < until,
                "the upstream never committed its charge"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the proxy's log shows `needle`.
    fn wait_for_log(&self, needle: &str) {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let log = std::fs::read_to_string(self.log()).unwrap_or_default();
            if log.contains(needle) {
                return;
            }
            assert!(
                Instant::now() < until,
                "the proxy never logged {needle}: {log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The Python SDK's driver (`api`: `client` or `session`) against a proxy it starts on the
    /// world's ledger with `extra` flags: lists the tools, then makes `calls`. Its lines.
    /// The proxy (before `extra`: this world's ledger as alice; after: the charge server)
    /// driven by an official SDK's client: `api` is the Python SDK's `client` or `session`, or
    /// `ts` for the TypeScript SDK v2 (`None` when Node is missing outside CI, loudly).
    fn client(&self, extra: &[&str], api: &str, calls: Value) -> Option<Vec<Value>> {
        let mut args = vec!["proxy".to_string()];
        args.extend(self.db.store_args());
        args.extend(["--principal".into(), "alice".into()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend([
            "--".into(),
            self.python.display().to_string(),
            proxy_fixture("charge_server.py").display().to_string(),
        ]);
        let mut env = serde_json::Map::new();
        for (k, v) in self.db.key_env() {
            env.insert(k.into(), json!(v));
        }
        env.insert("CHARGE_DB".into(), json!(self.charge_db()));
        env.insert(
            "PATH".into(),
            json!(std::env::var("PATH").unwrap_or_default()),
        );
        let spec = json!({"transport": "stdio", "lifecycle": "legacy", "api": api,
            "list_tools": true, "calls": calls,
            "server": {"command": support::BIN, "args": args, "env": env}});
        let driver = if api == "ts" {
            let mut c = Command::new(support::clients::node()?);
            c.arg(support::clients::ts_client());
            c
        } else {
            let mut c = Command::new(&self.python);
            c.arg(proxy_fixture("py_client.py"));
            c
        };
        Some(support::clients::run_driver(driver, &spec))
    }

    fn cli(&self, args: &[&str]) -> (i32, String) {
        let out = toolledger()
            .arg(args[0])
            .args(&args[1..])
            .args(self.db.store_args())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }
}

fn charge(op: &str, amount: i64) -> Value {
    json!({"customer": "c-1", "amount_cents": amount, "operation_id": op})
}

/// The `{code, status_ref?}` error of an in-band error result.
fn error_of(result: &Value) -> Value {
    assert_eq!(result["isError"], true, "not an error result: {result}");
    let text = result["content"][0]["text"].as_str().unwrap();
    serde_json::from_str::<Value>(text).unwrap()["error"].clone()
}

fn ledger_meta(result: &Value) -> Value {
    result["_meta"]["io.toolledger/ledger"].clone()
}

/// The result without the ledger's `replayed` flag: what must be identical on every replay.
fn content(result: &Value) -> Value {
    let mut r = result.clone();
    if let Some(l) = r.pointer_mut("/_meta/io.toolledger~1ledger") {
        l.as_object_mut().unwrap().remove("replayed");
    }
    r
}

fn the_tool_list(db: Db) {
    let Some(w) = World::new(db) else { return };
    let mut p = w.start(&[], 0);
    p.send(&json!({"jsonrpc": "2.0", "id": 900, "method": "tools/list",
                   "params": {"_meta": support::wire::meta()}}));
    let tools = p.recv()["result"]["tools"].as_array().unwrap().clone();
    let find = |n: &str| tools.iter().find(|t| t["name"] == n).cloned();
    let charge = find("charge").expect("charge is listed");
    assert_eq!(
        charge["inputSchema"]["properties"]["operation_id"]["type"],
        "string"
    );
    assert!(charge["inputSchema"]["required"]
        .as_array()
        .unwrap()
        .contains(&json!("operation_id")));
    for read_only in ["find_charge", "count_charges"] {
        let t = find(read_only).expect("read-only tools are listed");
        assert!(
            t["inputSchema"]["properties"].get("operation_id").is_none(),
            "{read_only} passes through unguarded: {t}"
        );
    }
    assert!(find("get_operation_status").is_some());
}

fn a_retry_replays_the_upstream_answer(db: Db) {
    let Some(w) = World::new(db) else { return };
    let mut p = w.start(&[], 0);
    let first = p.call("charge", charge("op-1", 500));
    assert_eq!(first["isError"], false, "{first}");
    assert_eq!(first["structuredContent"]["amount_cents"], 500);
    let meta = ledger_meta(&first);
    assert_eq!(meta["replayed"], false);
    assert_eq!(meta["state"], "succeeded");
    assert_eq!(meta["operationId"], "op-1");
    for _ in 0..3 {
        let again = p.call("charge", charge("op-1", 500));
        assert_eq!(ledger_meta(&again)["replayed"], true, "{again}");
        assert_eq!(content(&again), content(&first));
    }
    // A new proxy process replays it too. (The first one stops as a client stops it: its
    // stdin closed, it writes its last log lines.)
    p.finish();
    let mut p = w.start(&[], 0);
    let again = p.call("charge", charge("op-1", 500));
    assert_eq!(content(&again), content(&first));
    assert_eq!(w.charges(), 1, "one upstream effect");
    // Same id, other arguments: refused, nothing forwarded.
    let other = p.call("charge", charge("op-1", 700));
    assert_eq!(error_of(&other)["code"], "operation_conflict");
    assert_eq!(w.charges(), 1);
    // A read-only tool passes through, without an operation id.
    let count = p.call("count_charges", json!({}));
    assert_eq!(count["structuredContent"]["count"], 1, "{count}");
    // A guarded call without an operation id is refused before anything is recorded.
    let missing = p.call("charge", json!({"customer": "c-1", "amount_cents": 5}));
    assert_eq!(error_of(&missing)["code"], "invalid_arguments");
    // The log says what happened in the ledger's words: the proxy's forward settled the
    // operation (no worker runs here), under the proxy's lease. (Stopped by closing its
    // stdin, so it writes its last log lines.)
    p.finish();
    let log = std::fs::read_to_string(w.log()).unwrap();
    assert!(!log.contains("toolledger::worker"), "{log}");
    assert!(!log.contains("reconciled"), "{log}");
    let settled = log
        .lines()
        .find(|l| l.contains("succeeded: the downstream's receipt is recorded"))
        .unwrap_or_else(|| panic!("no settle line: {log}"));
    assert!(settled.contains("toolledger::delivery"), "{settled}");
    assert!(settled.contains("owner=proxy-"), "{settled}");
    assert_eq!(support::wire::count(&w.db, "operations"), 1);
}

fn an_upstream_error_result_is_stored_and_replayed(db: Db) {
    let Some(w) = World::new(db) else { return };
    let mut p = w.start(&[], 0);
    let first = p.call("charge", charge("op-0", 0));
    assert_eq!(first["isError"], true);
    assert!(
        first["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("must be positive"),
        "the upstream's own words: {first}"
    );
    assert_eq!(ledger_meta(&first)["state"], "failed");
    let again = p.call("charge", charge("op-0", 0));
    assert_eq!(ledger_meta(&again)["replayed"], true);
    assert_eq!(content(&again), content(&first));
    assert_eq!(w.charges(), 0);
}

fn an_upstream_jsonrpc_error_comes_back_unchanged_and_is_not_stored(db: Db) {
    let Some(w) = World::new(db) else { return };
    let mut p = w.start(&[], 0);
    let reply = p.call_raw(json!({"name": "charge", "arguments": charge("op-13", 13)}));
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    assert_eq!(reply["error"]["message"], "amount_cents 13 is not accepted");
    assert_eq!(reply["error"]["data"], json!({"amount_cents": 13}));
    // Not stored as a result: the retry is not a replay of it, and nothing is forwarded again.
    let again = p.call("charge", charge("op-13", 13));
    let e = error_of(&again);
    assert_eq!(e["code"], "outcome_unknown", "{again}");
    assert!(e["status_ref"].as_str().unwrap().starts_with("op_"));
    assert_eq!(w.charges(), 0);
    let stored =
        w.db.pairs("SELECT state, coalesce(result, '') FROM operations");
    assert_eq!(stored, vec![("outcome_unknown".into(), String::new())]);
}

fn a_retry_during_the_forward_is_in_progress(db: Db) {
    let Some(w) = World::new(db) else { return };
    let mut p = w.start(&[], 2_000);
    p.send_call(
        1,
        json!({"name": "charge", "arguments": charge("op-slow", 300)}),
    );
    w.wait_for_charges(1);
    // The upstream has committed and not answered yet: the ledger already holds the intent
    // and the claim of the one forward.
    assert_eq!(
        w.db.pairs("SELECT idempotency_key, state FROM operations"),
        vec![("op-slow".into(), "processing".into())]
    );
    assert_eq!(
        w.db.scalar("SELECT fencing_token FROM outbox"),
        1,
        "claimed once"
    );
    assert_eq!(
        w.db.pairs("SELECT state, CAST(attempt_count AS TEXT) FROM outbox"),
        vec![("processing".into(), "1".into())]
    );
    p.send_call(
        2,
        json!({"name": "charge", "arguments": charge("op-slow", 300)}),
    );
    let retry = p.recv_result(2);
    let e = error_of(&retry);
    assert_eq!(e["code"], "operation_in_progress", "{retry}");
    let first = p.recv_result(1);
    assert_eq!(first["isError"], false, "{first}");
    let after = p.call("charge", charge("op-slow", 300));
    assert_eq!(content(&after), content(&first));
    assert_eq!(w.charges(), 1);
}

/// The pid of the proxy's upstream child process.
fn upstream_pid(proxy: &Server) -> i32 {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new("pgrep")
            .args(["-P", &proxy.pid().to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(pid) = text.lines().next().and_then(|l| l.trim().parse().ok()) {
            return pid;
        }
        assert!(Instant::now() < until, "the proxy has no upstream child");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn a_lost_upstream_answer_is_unknown_until_reconciled(db: Db) {
    let Some(w) = World::new(db) else { return };
    let config = w.config(
        r#"
        [tools.charge]
        forward_operation_id = "_meta"
        [tools.charge.reconcile]
        tool = "find_charge"
        arguments = { reference = "{operation_id}" }
        found_when = "/structuredContent/found"
        result = { charge_id = "/structuredContent/charge/id", customer = "/structuredContent/charge/customer", amount_cents = "/structuredContent/charge/amount_cents" }
        "#,
    );
    let config = config.display().to_string();
    let mut p = w.start(&["--config", &config], 5_000);
    p.send_call(
        1,
        json!({"name": "charge", "arguments": charge("op-lost", 900)}),
    );
    w.wait_for_charges(1);
    // The upstream committed the charge; its answer is lost with it.
    let pid = upstream_pid(&p);
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let lost = p.recv_result(1);
    w.wait_for_log("the upstream exited; starting it again");
    let e = error_of(&lost);
    assert_eq!(e["code"], "outcome_unknown", "{lost}");
    let status_ref = e["status_ref"].as_str().unwrap().to_string();
    // A retry is told the same, and is never forwarded again.
    let retry = p.call("charge", charge("op-lost", 900));
    assert_eq!(error_of(&retry)["code"], "outcome_unknown");
    assert_eq!(error_of(&retry)["status_ref"], status_ref.as_str());
    assert_eq!(w.charges(), 1);
    // The operator sees it.
    let (code, listed) = w.cli(&["operations", "list", "--state", "outcome_unknown"]);
    assert_eq!(code, 0);
    assert!(listed.contains(&status_ref), "{listed}");
    // The status query runs the reconcile lookup (on a restarted upstream) and records it.
    let status = p.status("op-lost");
    assert_eq!(status["state"], "succeeded", "{status}");
    assert_eq!(status["authoritative"], true);
    assert_eq!(status["ledgerState"], "succeeded");
    // The operator sees the lookup's answer on the timeline, before the reconciled receipt.
    let (code, shown) = w.cli(&["operations", "show", &status_ref]);
    assert_eq!(code, 0, "{shown}");
    let shown: Value = serde_json::from_str(&shown).unwrap();
    let kinds: Vec<&str> = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    let at = kinds.iter().position(|k| *k == "reconcile_lookup");
    assert!(
        at.is_some_and(|i| kinds[i + 1..].contains(&"receipt_reconciled")),
        "{kinds:?}"
    );
    let looked = &shown["events"][at.unwrap()]["detail"];
    assert_eq!(looked["lookup"], "find_charge", "{looked}");
    assert_eq!(looked["found"], true, "{looked}");
    // The upstream knows the operation by its upstream key (the scope digest), never by the
    // caller's raw operation id; the lookup asked for that key.
    let upstream_key = shown["intent"]["downstream_key"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(upstream_key.len(), 64, "{shown}");
    assert_eq!(
        looked["answer"]["structuredContent"]["charge"]["reference"],
        upstream_key.as_str(),
        "{looked}"
    );
    let replay = p.call("charge", charge("op-lost", 900));
    assert_eq!(replay["isError"], false, "{replay}");
    // The configured mapping of the lookup's answer, in the tool's own output schema; never
    // the lookup's answer dressed as the tool's.
    assert_eq!(
        replay["structuredContent"],
        json!({"charge_id": 1, "customer": "c-1", "amount_cents": 900}),
        "{replay}"
    );
    assert!(
        replay["structuredContent"].get("found").is_none(),
        "{replay}"
    );
    assert_eq!(
        replay["_meta"]["io.toolledger/confirmed"]["by"], "lookup",
        "{replay}"
    );
    assert_eq!(
        replay["_meta"]["io.toolledger/confirmed"]["evidence"]["structuredContent"]["charge"]
            ["reference"],
        upstream_key.as_str(),
        "the evidence: {replay}"
    );
    assert_eq!(w.charges(), 1, "never a second forward");
    drop(p);
    // The official SDKs, which check a success against the tool's output schema, accept the
    // replay: the Python SDK's `Client` and its session, the TypeScript SDK v2's client.
    for api in ["client", "session", "ts"] {
        let Some(lines) = w.client(
            &["--config", &config],
            api,
            json!([{"name": "charge", "arguments": charge("op-lost", 900)}]),
        ) else {
            continue;
        };
        let r = support::clients::driver_result(&lines, 0);
        assert_eq!(r["isError"], false, "{api}: {lines:?}");
        assert_eq!(
            r["structuredContent"]["amount_cents"], 900,
            "{api}: {lines:?}"
        );
    }
    assert_eq!(w.charges(), 1, "never a second forward");
    w.wait_for_log("upstream started");
    let log = std::fs::read_to_string(w.log()).unwrap();
    assert!(
        log.matches("upstream started").count() >= 2,
        "the upstream was started again: {log}"
    );
}

fn a_stopped_proxy_answers_the_call_in_flight_and_lets_its_upstream_exit(db: Db) {
    let Some(w) = World::new(db) else { return };
    let mark = w.dir.path().join("upstream-exited");
    let env = [("CHARGE_EXIT_MARK", mark.to_str().unwrap())];
    let mut p = w.start_as("alice", &[], 1_000, &env);
    p.send_call(
        1,
        json!({"name": "charge", "arguments": charge("op-term", 700)}),
    );
    // The upstream has committed the charge and holds its answer for a second.
    w.wait_for_charges(1);
    let upstream = upstream_pid(&p);
    // SAFETY: signals to our own child process.
    assert_eq!(unsafe { libc::kill(p.pid() as i32, libc::SIGTERM) }, 0);
    // The call in flight is answered with the upstream's result, not cut off.
    let answered = p.recv_result(1);
    assert_eq!(answered["isError"], false, "{answered}");
    assert_eq!(
        answered["structuredContent"]["amount_cents"], 700,
        "{answered}"
    );
    assert_eq!(p.wait_exit(), 0);
    // The upstream ended because its stdin closed (not by a signal or a kill), before the
    // proxy exited.
    let exited = std::fs::read_to_string(&mark).unwrap_or_default();
    assert_eq!(exited, "stdin closed; exited\n");
    // SAFETY: signal 0 only asks whether the process exists.
    assert_ne!(
        unsafe { libc::kill(upstream, 0) },
        0,
        "the upstream still runs"
    );
    w.wait_for_log("upstream stopped");
    // The operation is settled in the ledger, not left unknown.
    let (code, listed) = w.cli(&["operations", "list"]);
    assert_eq!(code, 0);
    let rows: Vec<Value> = listed
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1, "{listed}");
    assert_eq!(rows[0]["key"], "op-term", "{listed}");
    assert_eq!(rows[0]["state"], "succeeded", "{listed}");
    assert_eq!(w.charges(), 1);
}

fn a_timeout_is_outcome_unknown_and_resolvable(db: Db) {
    let Some(w) = World::new(db) else { return };
    // A reconcile rule whose pointer is not in the lookup's answer: it cannot decide, and says
    // so in the log and on the timeline.
    let config = w.config(
        r#"
        [tools.slow]
        call_timeout_seconds = 1
        [tools.slow.reconcile]
        tool = "find_charge"
        arguments = { reference = "{operation_id}" }
        found_when = "/structuredContent/nope"
        "#,
    );
    let config = config.display().to_string();
    let mut p = w.start(&["--config", &config], 0);
    let r = p.call("slow", json!({"seconds": 3, "operation_id": "op-t"}));
    let e = error_of(&r);
    assert_eq!(e["code"], "outcome_unknown", "{r}");
    assert_eq!(
        ledger_meta(&r)["replayed"],
        false,
        "this call forwarded: {r}"
    );
    let status_ref = e["status_ref"].as_str().unwrap().to_string();
    // A retry is answered from the ledger, not forwarded: `replayed: true`.
    let again = p.call("slow", json!({"seconds": 3, "operation_id": "op-t"}));
    assert_eq!(error_of(&again)["code"], "outcome_unknown", "{again}");
    assert_eq!(ledger_meta(&again)["replayed"], true, "{again}");
    assert_eq!(ledger_meta(&again)["state"], "outcome_unknown", "{again}");
    let status = p.status("op-t");
    assert_eq!(status["ledgerState"], "outcome_unknown", "{status}");
    w.wait_for_log("found_when pointer resolves to nothing");
    let log = std::fs::read_to_string(w.log()).unwrap();
    assert!(log.contains("/structuredContent/nope"), "{log}");
    let (_, shown) = w.cli(&["operations", "show", &status_ref]);
    let shown: Value = serde_json::from_str(&shown).unwrap();
    // The outbox of an unsure operation is not `processing`: its event is `leased`, by the
    // proxy's forward.
    assert_eq!(shown["operation"]["state"], "outcome_unknown", "{shown}");
    assert_eq!(shown["outbox"]["state"], "leased", "{shown}");
    let owner = shown["outbox"]["lease_owner"].as_str().unwrap_or_default();
    assert!(owner.starts_with("proxy-"), "{shown}");
    assert_eq!(shown["claims"][0]["lease_owner"], owner, "{shown}");
    let looked = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|e| e["kind"] == "reconcile_lookup")
        .map(|e| e["detail"].clone())
        .unwrap_or_else(|| panic!("no lookup event: {shown}"));
    assert_eq!(looked["found"], false, "{looked}");
    let problem = looked["problem"].as_str().unwrap_or_default();
    assert!(
        problem.contains("/structuredContent/nope") && problem.contains("structuredContent:{"),
        "names the pointer and the answer's shape: {looked}"
    );
    add_principal(&w.db, "olga", "acme", &["operator"], &[], false);
    let (code, out) = w.cli(&[
        "resolve",
        "--status-ref",
        &status_ref,
        "--as",
        "failed",
        "--reason",
        "the upstream's logs show the call never ran",
        "--operator",
        "olga",
    ]);
    assert_eq!(code, 0, "{out}");
    let replay = p.call("slow", json!({"seconds": 3, "operation_id": "op-t"}));
    assert_eq!(error_of(&replay)["code"], "resolved_failed", "{replay}");
    assert_eq!(ledger_meta(&replay)["state"], "failed");
    let (code, audit) = w.cli(&["audit"]);
    assert_eq!(code, 0, "{audit}");
    assert!(audit.contains("\"gate\":\"PASS\""), "{audit}");
}

/// Runs the proxy until it reports holding at `point`, then kills it.
fn kill_at(w: &World, point: &str, op: &str) {
    let mut p = w.start_as("alice", &[], 0, &[("TOOLLEDGER_TEST_HOLD_AT", point)]);
    p.send_call(1, json!({"name": "charge", "arguments": charge(op, 100)}));
    w.wait_for_log(&format!("{{\"held_at\":\"{point}\"}}"));
    p.kill();
}

fn a_proxy_killed_before_its_claim_forwards_on_the_retry(db: Db) {
    let Some(w) = World::new(db) else { return };
    kill_at(&w, "after_intent_commit", "op-a");
    assert_eq!(w.charges(), 0);
    let mut p = w.start(&[], 0);
    let r = p.call("charge", charge("op-a", 100));
    assert_eq!(
        r["isError"], false,
        "nothing was sent, so the retry forwards: {r}"
    );
    assert_eq!(ledger_meta(&r)["replayed"], false);
    assert_eq!(w.charges(), 1);
}

fn a_proxy_killed_after_the_upstream_answered_is_unknown(db: Db) {
    let Some(w) = World::new(db) else { return };
    kill_at(&w, "after_downstream_commit", "op-b");
    assert_eq!(w.charges(), 1, "the upstream acted");
    let mut p = w.start(&[], 0);
    // The lease of the dead proxy's forward is live for a while: in progress, not forwarded.
    let r = p.call("charge", charge("op-b", 100));
    let code = error_of(&r)["code"].as_str().unwrap().to_string();
    assert!(
        code == "operation_in_progress" || code == "outcome_unknown",
        "{r}"
    );
    assert_eq!(w.charges(), 1, "never a second forward");
}

fn principal_and_scopes_are_rechecked(db: Db) {
    let Some(w) = World::new(db) else { return };
    add_principal(&w.db, "pat", "acme", &[], &["payments:write"], false);
    let config = w.config("[tools.charge]\nrequired_scopes = [\"payments:write\"]\n");
    let config = config.display().to_string();
    let mut p = w.start_as("pat", &["--config", &config], 0, &[]);
    let first = p.call("charge", charge("op-s", 100));
    assert_eq!(first["isError"], false, "{first}");
    // The scope is withdrawn: the replay and the status query no longer show the operation.
    add_principal(&w.db, "pat", "acme", &[], &[], false);
    let replay = p.call("charge", charge("op-s", 100));
    assert_eq!(error_of(&replay)["code"], "not_found", "{replay}");
    let status = p.status("op-s");
    assert_eq!(status["state"], "unknown", "{status}");
    assert_eq!(status["statusRef"], Value::Null, "{status}");
    // A principal without the scope cannot charge at all.
    let mut q = w.start_as("bob", &["--config", &config], 0, &[]);
    let refused = q.call("charge", charge("op-bob", 100));
    assert_eq!(error_of(&refused)["code"], "not_found", "{refused}");
    // The principal is deactivated while the proxy runs: its next replay is refused (the
    // server does not read the principal before a guarded call; the runtime does, in the
    // snapshot it reads the operation in), and nothing is forwarded.
    add_principal(&w.db, "pat", "acme", &[], &["payments:write"], false);
    let again = p.call("charge", charge("op-s", 100));
    assert_eq!(again["isError"], false, "{again}");
    let out = toolledger()
        .args(["principal", "revoke", "pat", "--all"])
        .args(w.db.store_args())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let revoked = p.call("charge", charge("op-s", 100));
    assert_eq!(error_of(&revoked)["code"], "permission_denied", "{revoked}");
    let fresh = p.call("charge", charge("op-s2", 100));
    assert_eq!(error_of(&fresh)["code"], "permission_denied", "{fresh}");
    assert_eq!(w.charges(), 1);
}

fn the_operation_id_travels_as_configured(db: Db) {
    let Some(w) = World::new(db) else { return };
    // By `_meta` from the client; forwarded as the upstream's own argument.
    let config = w.config("[tools.charge]\nforward_operation_id = \"idempotency_key\"\n");
    let config = config.display().to_string();
    let mut p = w.start(&["--config", &config], 0);
    // The protocol's per-request `_meta`, with the vendor key beside it.
    let mut params = json!({"name": "charge", "arguments": {"customer": "c-1", "amount_cents": 5}});
    let mut meta = support::wire::meta();
    meta["io.toolledger/operation_id"] = json!("op-m2");
    params["_meta"] = meta;
    p.send(&json!({"jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": params}));
    let by_meta = p.recv_result(77);
    assert_eq!(by_meta["isError"], false, "{by_meta}");
    assert_eq!(ledger_meta(&by_meta)["operationId"], "op-m2");
    drop(p);
    // The upstream's own key argument is the key, forwarded unchanged.
    let config = w.config("[tools.charge]\nkey_argument = \"idempotency_key\"\n");
    let config = config.display().to_string();
    let mut p = w.start(&["--config", &config], 0);
    let own = json!({"customer": "c-1", "amount_cents": 6, "idempotency_key": "k-own"});
    let first = p.call("charge", own.clone());
    assert_eq!(first["isError"], false, "{first}");
    let again = p.call("charge", own);
    assert_eq!(ledger_meta(&again)["replayed"], true);
    // What reaches the upstream is each operation's upstream key (its scope digest, shown as
    // `downstream_key` by `operations show`), never the caller's raw id.
    let upstream_key = |result: &Value| {
        let status_ref = ledger_meta(result)["statusRef"]
            .as_str()
            .unwrap()
            .to_string();
        let (code, shown) = w.cli(&["operations", "show", &status_ref]);
        assert_eq!(code, 0, "{shown}");
        let shown: Value = serde_json::from_str(&shown).unwrap();
        shown["intent"]["downstream_key"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (m2, own) = (upstream_key(&by_meta), upstream_key(&first));
    assert_ne!(m2, own);
    let keys = w.charge_keys();
    assert!(
        keys.iter().any(|k| k.1.as_deref() == Some(m2.as_str())),
        "forwarded as an argument: {keys:?}"
    );
    assert!(
        keys.iter().any(|k| k.1.as_deref() == Some(own.as_str())),
        "the upstream's own key argument carries the upstream key: {keys:?}"
    );
    assert_eq!(
        keys.iter()
            .filter(|k| k.1.as_deref() == Some(own.as_str()))
            .count(),
        1
    );
    assert!(
        keys.iter()
            .all(|k| !matches!(k.1.as_deref(), Some("op-m2" | "k-own"))),
        "never the raw id: {keys:?}"
    );
}

/// The `{"error": …}` line a failed command ends its stderr with.
fn failure(stderr: &[u8]) -> Value {
    let text = String::from_utf8_lossy(stderr);
    serde_json::from_str(text.lines().last().unwrap_or("")).unwrap_or(Value::Null)
}

fn bad_configuration_and_upstream_are_refused(db: Db) {
    let Some(w) = World::new(db) else { return };
    let config = w.config("[tools.charge]\nguarded = \"sometimes\"\n");
    let out = w
        .command("alice", &["--config", &config.display().to_string()], 0)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = failure(&out.stderr);
    assert_eq!(err["error"]["code"], "CONFIG_INVALID", "{err}");
    // Reconcile rules are checked against the upstream's tools at start.
    for (rule, names) in [
        ("tool = \"find_charge\"", "found_when is required"),
        (
            "tool = \"lookup_everything\"\nfound_when = \"/x\"",
            "lookup_everything, which the upstream does not list",
        ),
        (
            "tool = \"charge\"\nfound_when = \"/x\"",
            "does not mark it read-only",
        ),
    ] {
        let config = w.config(&format!("[tools.charge.reconcile]\n{rule}\n"));
        let out = w
            .command("alice", &["--config", &config.display().to_string()], 0)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{rule}");
        let err = failure(&out.stderr);
        assert_eq!(err["error"]["code"], "CONFIG_INVALID", "{err}");
        let message = err["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(names), "{rule}: {err}");
    }
    let out = toolledger()
        .arg("proxy")
        .args(w.db.store_args())
        .args(["--principal", "alice", "--", "/nonexistent/upstream"])
        .envs(w.db.key_env())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = failure(&out.stderr);
    assert_eq!(err["error"]["code"], "UPSTREAM_UNAVAILABLE", "{err}");
    let shown = String::from_utf8_lossy(&out.stderr);
    assert!(!shown.contains("/nonexistent"), "no paths: {shown}");
}

fn progress_and_cancellation_pass_through(db: Db) {
    let Some(w) = World::new(db) else { return };
    let mut p = w.start(&[], 0);
    // The client's progress token: the upstream's progress reaches the client under it.
    let mut meta = support::wire::meta();
    meta["progressToken"] = json!("tok-7");
    p.send(
        &json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "slow", "arguments": {"seconds": 1, "operation_id": "op-p"}, "_meta": meta}}),
    );
    let mut progress = Vec::new();
    let result = loop {
        let line = p.recv();
        if line["method"] == "notifications/progress" {
            progress.push(line["params"].clone());
            continue;
        }
        assert_eq!(line["id"], 5, "{line}");
        break line["result"].clone();
    };
    assert_eq!(result["isError"], false, "{result}");
    // A result with a fractional number (`slept: 1.0`) is replayed exactly as it came.
    let replay = p.call("slow", json!({"seconds": 1, "operation_id": "op-p"}));
    assert_eq!(ledger_meta(&replay)["replayed"], true);
    assert_eq!(content(&replay), content(&result));
    assert_eq!(
        replay["structuredContent"].to_string(),
        result["structuredContent"].to_string()
    );
    assert!(progress.len() >= 2, "progress passed through: {progress:?}");
    assert!(
        progress.iter().all(|n| n["progressToken"] == "tok-7"),
        "{progress:?}"
    );
    // The client cancels a guarded call in flight (as the official SDK clients do when their
    // read timeout fires): the client stops waiting, the forward does not. The upstream is not
    // told, its answer is recorded, and the retry replays it instead of finding the operation
    // outcome_unknown.
    p.send_call(
        6,
        json!({"name": "slow", "arguments": {"seconds": 3, "operation_id": "op-c"}}),
    );
    w.wait_for_log("upstream started");
    std::thread::sleep(Duration::from_millis(500));
    p.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                   "params": {"requestId": 6, "reason": "the user changed their mind",
                              "_meta": support::wire::meta()}}),
    );
    let during = p.call("slow", json!({"seconds": 3, "operation_id": "op-c"}));
    assert_eq!(
        error_of(&during)["code"],
        "operation_in_progress",
        "{during}"
    );
    let until = Instant::now() + Duration::from_secs(30);
    let retry = loop {
        std::thread::sleep(Duration::from_millis(300));
        let retry = p.call("slow", json!({"seconds": 3, "operation_id": "op-c"}));
        if retry["isError"] != true || Instant::now() > until {
            break retry;
        }
        assert_eq!(error_of(&retry)["code"], "operation_in_progress", "{retry}");
    };
    assert_eq!(
        retry["isError"], false,
        "the upstream's answer is replayed: {retry}"
    );
    assert_eq!(ledger_meta(&retry)["replayed"], true, "{retry}");
    assert_eq!(retry["structuredContent"]["slept"], 3.0, "{retry}");
    let log = std::fs::read_to_string(w.log()).unwrap_or_default();
    assert!(
        !log.contains("slow: cancelled by the client"),
        "a guarded forward is not cancelled upstream: {log}"
    );
}

fn an_upstream_round_asking_for_input_passes_through_bound_to_the_operation(db: Db) {
    let Some(w) = World::new(db) else { return };
    let mut p = w.start(&[], 0);
    let args = json!({"customer": "c-2", "amount_cents": 4200, "operation_id": "op-mr"});
    // Round one: the upstream (the Python SDK's resolver) asks the user to confirm.
    let first = p.call("confirm_charge", args.clone());
    assert_eq!(first["resultType"], "input_required", "{first}");
    let requests = first["inputRequests"].as_object().unwrap().clone();
    assert_eq!(requests.len(), 1, "{first}");
    let (ask, request) = requests.iter().next().unwrap();
    assert_eq!(request["method"], "elicitation/create", "{request}");
    let state = first["requestState"].as_str().unwrap().to_string();
    assert_eq!(w.charges(), 0, "nothing is charged before the answer");
    assert_eq!(
        w.db.pairs("SELECT state, coalesce(last_error, '') FROM outbox"),
        vec![("pending".into(), "input_required".into())],
        "the event waits for the continuation"
    );
    assert_eq!(
        w.db.pairs("SELECT idempotency_key, state FROM operations"),
        vec![("op-mr".into(), "accepted".into())]
    );
    // A state that is not the proxy's, or is bound to other arguments, is refused as the
    // protocol error it is, and changes nothing.
    let forged = p.call_raw(json!({"name": "confirm_charge", "arguments": args,
        "requestState": "not-a-state", "inputResponses": {ask: {"action": "accept",
        "content": {"confirm": true}}}}));
    assert_eq!(forged["error"]["code"], -32602, "{forged}");
    assert_eq!(forged["error"]["data"]["code"], "request_state_invalid");
    let mut other = args.clone();
    other["amount_cents"] = json!(1);
    let moved = p.call_raw(json!({"name": "confirm_charge", "arguments": other,
        "requestState": state, "inputResponses": {ask: {"action": "accept",
        "content": {"confirm": true}}}}));
    assert!(
        moved["error"]["code"] == -32602 || moved["result"]["isError"] == true,
        "{moved}"
    );
    assert_eq!(w.charges(), 0);
    // Round two with the answer: the one forward that acts.
    let done = p.resume(
        "confirm_charge",
        args.clone(),
        &state,
        json!({ask: {"action": "accept", "content": {"confirm": true}}}),
    );
    assert_eq!(done["isError"], false, "{done}");
    assert_eq!(done["structuredContent"]["amount_cents"], 4200);
    assert_eq!(ledger_meta(&done)["state"], "succeeded");
    assert_eq!(w.charges(), 1);
    // The operation is finished: a retry of either round replays.
    let again = p.call("confirm_charge", args.clone());
    assert_eq!(ledger_meta(&again)["replayed"], true, "{again}");
    assert_eq!(content(&again), content(&done));
    assert_eq!(w.charges(), 1);
    let kinds: Vec<String> =
        w.db.pairs("SELECT kind, detail FROM operation_events ORDER BY id")
            .into_iter()
            .map(|(k, _)| k)
            .collect();
    assert!(kinds.contains(&"awaiting_input".to_string()), "{kinds:?}");
}

/// Real tools take decimal amounts: a read-only tool passed through gets `12.5` and `1e-7` as
/// sent, a guarded one records `12.5` in canonical form (`12.50` is the same intent, `12.51`
/// another), the replay is the upstream's answer, and the official Python SDK's `Client` and
/// the TypeScript SDK v2 validate it against the tool's output schema. An integer no double holds is refused
/// in-band, naming the field, and nothing is recorded.
fn fractional_numbers_pass_and_are_one_intent(db: Db) {
    let Some(w) = World::new(db) else { return };
    let mut p = w.start(&[], 0);
    let converted = p.call("convert", json!({"amount": 12.5, "rate": 1e-7}));
    assert_eq!(converted["isError"], false, "{converted}");
    assert_eq!(
        converted["structuredContent"]["converted"],
        json!(12.5 * 1e-7)
    );
    let pay =
        |amount: Value| json!({"customer": "c-1", "amount": amount, "operation_id": "op-pay"});
    let first = p.call("pay", pay(json!(12.5)));
    assert_eq!(first["isError"], false, "{first}");
    assert_eq!(first["structuredContent"]["amount"], json!(12.5));
    // `12.50` on the wire is the same number.
    let meta = support::wire::meta();
    p.send_line(&format!(r#"{{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{{"name":"pay","arguments":{{"customer":"c-1","amount":12.50,"operation_id":"op-pay"}},"_meta":{meta}}}}}"#));
    let again = p.recv_result(77);
    assert_eq!(ledger_meta(&again)["replayed"], true, "{again}");
    assert_eq!(again["structuredContent"], first["structuredContent"]);
    let other = p.call("pay", pay(json!(12.51)));
    assert_eq!(error_of(&other)["code"], "operation_conflict", "{other}");
    p.send_line(&format!(r#"{{"jsonrpc":"2.0","id":78,"method":"tools/call","params":{{"name":"pay","arguments":{{"customer":"c-1","amount":9007199254740993,"operation_id":"op-big"}},"_meta":{meta}}}}}"#));
    let big = p.recv_result(78);
    let e = error_of(&big);
    assert_eq!(e["code"], "invalid_arguments", "{big}");
    assert!(e["message"].as_str().unwrap().contains("/amount"), "{big}");
    assert_eq!(w.charges(), 1, "one payment");
    drop(p);
    for api in ["client", "ts"] {
        let Some(lines) = w.client(
            &[],
            api,
            json!([
                {"name": "pay", "arguments": pay(json!(12.5))},
                {"name": "convert", "arguments": {"amount": 2.5, "rate": 0.5}},
            ]),
        ) else {
            continue;
        };
        let replay = support::clients::driver_result(&lines, 0);
        assert_eq!(replay["isError"], false, "{api}: {lines:?}");
        assert_eq!(
            replay["structuredContent"]["amount"],
            json!(12.5),
            "{api}: {lines:?}"
        );
        assert_eq!(
            support::clients::driver_result(&lines, 1)["structuredContent"]["converted"],
            json!(1.25)
        );
    }
    assert_eq!(w.charges(), 1, "one payment");
    assert_eq!(
        w.db.scalar("SELECT count(*) FROM operations WHERE arguments LIKE '%12.5%'"),
        1,
        "the intent holds 12.5"
    );
}

/// An operator who verified the effect records it with evidence; every retry is then told the
/// effect happened, in a shape the official SDKs (Python `Client` and session, TypeScript v2)
/// accept for a tool with an output schema (an
/// error result `effect_confirmed`: no result conforming to the schema exists).
fn an_operator_confirms_a_success_with_evidence(db: Db) {
    let Some(w) = World::new(db) else { return };
    let config = w.config("[tools.slow]\ncall_timeout_seconds = 1\n");
    let config = config.display().to_string();
    let mut p = w.start(&["--config", &config], 0);
    let r = p.call("slow", json!({"seconds": 2.5, "operation_id": "op-e"}));
    let e = error_of(&r);
    assert_eq!(e["code"], "outcome_unknown", "{r}");
    let status_ref = e["status_ref"].as_str().unwrap().to_string();
    add_principal(&w.db, "olga", "acme", &["operator"], &[], false);
    let resolve = |extra: &[&str]| {
        let mut args = vec![
            "resolve",
            "--status-ref",
            &status_ref,
            "--as",
            "succeeded",
            "--reason",
            "the upstream's log shows the sleep finished",
            "--operator",
            "olga",
        ];
        args.extend_from_slice(extra);
        w.cli(&args)
    };
    let (code, out) = resolve(&[]);
    assert_eq!(code, 1, "no receipt, no evidence: refused: {out}");
    let (code, out) = resolve(&["--evidence", "[1]"]);
    assert_eq!(code, 2, "evidence is an object (a usage error): {out}");
    let (code, out) = resolve(&[
        "--evidence",
        r#"{"log_line": "slept 2.5s", "seconds": 2.5}"#,
    ]);
    assert_eq!(code, 0, "{out}");
    let replay = p.call("slow", json!({"seconds": 2.5, "operation_id": "op-e"}));
    assert_eq!(error_of(&replay)["code"], "effect_confirmed", "{replay}");
    assert_eq!(ledger_meta(&replay)["state"], "succeeded", "{replay}");
    let confirmed = &replay["_meta"]["io.toolledger/confirmed"];
    assert_eq!(confirmed["by"], "operator", "{replay}");
    assert_eq!(confirmed["operator"], "olga");
    assert_eq!(confirmed["evidence"]["seconds"], 2.5);
    let status = p.status("op-e");
    assert_eq!(status["state"], "succeeded", "{status}");
    drop(p);
    for api in ["client", "session", "ts"] {
        let Some(lines) = w.client(
            &["--config", &config],
            api,
            json!([{"name": "slow", "arguments": {"seconds": 2.5, "operation_id": "op-e"}}]),
        ) else {
            continue;
        };
        let r = support::clients::driver_result(&lines, 0);
        assert_eq!(r["isError"], true, "{api}: {lines:?}");
        assert!(
            r.to_string().contains("effect_confirmed"),
            "{api}: {lines:?}"
        );
    }
    let (code, audit) = w.cli(&["audit"]);
    assert_eq!(code, 0, "{audit}");
    assert!(audit.contains("\"gate\":\"PASS\""), "{audit}");
}

/// An operator who verified the effect also gives the tool's result (`--result`), checked
/// against the output schema the tool declared when the call was accepted (`--output-schema`,
/// the tool's `outputSchema` as the upstream lists it; another schema is refused): every retry
/// is then a success whose `structuredContent` is that result, which the official SDKs accept.
/// A result that does not fit, or a missing or different schema, is refused and changes
/// nothing.
fn an_operator_confirms_a_success_with_a_result_that_fits_the_schema(db: Db) {
    let Some(w) = World::new(db) else { return };
    let config = w.config("[tools.slow]\ncall_timeout_seconds = 1\n");
    let config = config.display().to_string();
    let mut p = w.start(&["--config", &config], 0);
    p.send(&json!({"jsonrpc": "2.0", "id": 900, "method": "tools/list",
                   "params": {"_meta": support::wire::meta()}}));
    let tools = p.recv()["result"]["tools"].as_array().unwrap().clone();
    let slow = tools.iter().find(|t| t["name"] == "slow").unwrap().clone();
    let schema_file = w.dir.path().join("slow-output-schema.json");
    std::fs::write(&schema_file, slow["outputSchema"].to_string()).unwrap();
    let schema_file = schema_file.display().to_string();
    let other_schema = w.dir.path().join("other-schema.json");
    std::fs::write(&other_schema, r#"{"type":"object"}"#).unwrap();
    let other_schema = other_schema.display().to_string();
    let r = p.call("slow", json!({"seconds": 2.5, "operation_id": "op-r"}));
    let e = error_of(&r);
    assert_eq!(e["code"], "outcome_unknown", "{r}");
    let status_ref = e["status_ref"].as_str().unwrap().to_string();
    add_principal(&w.db, "olga", "acme", &["operator"], &[], false);
    let resolve = |extra: &[&str]| {
        let mut args = vec![
            "resolve",
            "--status-ref",
            &status_ref,
            "--as",
            "succeeded",
            "--reason",
            "the upstream's log shows the sleep finished",
            "--operator",
            "olga",
            "--evidence",
            r#"{"log_line": "slept 2.5s"}"#,
        ];
        args.extend_from_slice(extra);
        w.cli(&args)
    };
    let unsure = || {
        w.db.scalar("SELECT count(*) FROM operations WHERE state = 'outcome_unknown'")
    };
    for (extra, why) in [
        (
            vec![
                "--result",
                r#"{"slept": "long"}"#,
                "--output-schema",
                &schema_file,
            ],
            "does not conform",
        ),
        (
            vec![
                "--result",
                r#"{"nap": 2.5}"#,
                "--output-schema",
                &schema_file,
            ],
            "does not conform",
        ),
        (vec!["--result", r#"{"slept": 2.5}"#], "--output-schema"),
        (
            vec![
                "--result",
                r#"{"slept": 2.5}"#,
                "--output-schema",
                &other_schema,
            ],
            "not the one",
        ),
    ] {
        let (code, out) = resolve(&extra);
        assert_eq!(code, 1, "{extra:?}: {out}");
        assert!(out.contains("INVALID_ARGUMENTS"), "{extra:?}: {out}");
        assert!(out.contains(why), "{extra:?}: {out}");
        assert_eq!(unsure(), 1, "{extra:?} changed the operation");
    }
    let (code, out) = resolve(&[
        "--result",
        r#"{"slept": 2.5}"#,
        "--output-schema",
        &schema_file,
    ]);
    assert_eq!(code, 0, "{out}");
    let replay = p.call("slow", json!({"seconds": 2.5, "operation_id": "op-r"}));
    assert_eq!(replay["isError"], false, "{replay}");
    assert_eq!(
        replay["structuredContent"],
        json!({"slept": 2.5}),
        "{replay}"
    );
    assert_eq!(ledger_meta(&replay)["state"], "succeeded", "{replay}");
    assert_eq!(replay["_meta"]["io.toolledger/confirmed"]["by"], "operator");
    drop(p);
    for api in ["client", "session", "ts"] {
        let Some(lines) = w.client(
            &["--config", &config],
            api,
            json!([{"name": "slow", "arguments": {"seconds": 2.5, "operation_id": "op-r"}}]),
        ) else {
            continue;
        };
        let r = support::clients::driver_result(&lines, 0);
        assert_eq!(r["isError"], false, "{api}: {lines:?}");
        assert_eq!(
            r["structuredContent"]["slept"],
            json!(2.5),
            "{api}: {lines:?}"
        );
    }
    let (code, audit) = w.cli(&["audit"]);
    assert_eq!(code, 0, "{audit}");
}

/// The console's resolve form does what `resolve --result --output-schema` does: the operator
/// who verified the effect pastes the tool's result and its output schema; a result that does
/// not fit, or another schema, is shown refused and changes nothing; a fitting one is stored,
/// and the retry through the proxy is a success whose `structuredContent` is that result.
fn the_console_confirms_a_success_with_a_result_that_fits_the_schema(db: Db) {
    let Some(w) = World::new(db) else { return };
    let config = w.config("[tools.slow]\ncall_timeout_seconds = 1\n");
    let config = config.display().to_string();
    let mut p = w.start(&["--config", &config], 0);
    p.send(&json!({"jsonrpc": "2.0", "id": 900, "method": "tools/list",
                   "params": {"_meta": support::wire::meta()}}));
    let tools = p.recv()["result"]["tools"].as_array().unwrap().clone();
    let schema = tools.iter().find(|t| t["name"] == "slow").unwrap()["outputSchema"].to_string();
    let r = p.call("slow", json!({"seconds": 2.5, "operation_id": "op-c"}));
    let e = error_of(&r);
    assert_eq!(e["code"], "outcome_unknown", "{r}");
    let status_ref = e["status_ref"].as_str().unwrap().to_string();
    drop(p);
    let olga = add_principal(&w.db, "olga", "acme", &["operator"], &[], true).unwrap();

    let mut console = toolledger()
        .arg("console")
        .args(["--http", "127.0.0.1:0"])
        .args(w.db.store_args())
        .envs(w.db.key_env())
        .env_remove("TOOLLEDGER_ALLOWED_HOSTS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (url, _) = toolledger_testkit::stdio::wait_listening(console.stderr.take().unwrap());
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/console")
        .to_string();
    let session = raw::console_sign_in(&addr, &olga);
    let page_path = format!("/console/operations/{status_ref}");
    let page = raw::exchange(&addr, "GET", &page_path, &[("Cookie", &session)], b"").unwrap();
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("name=\"result\""), "{}", page.body);
    assert!(
        page.body.contains("name=\"output_schema\""),
        "{}",
        page.body
    );
    let csrf = raw::console_csrf(&page.body[page.body.find("id=\"resolve\"").unwrap()..]);
    let resolve = |result: &str, output_schema: &str| {
        let body = raw::form_body(&[
            ("csrf", &csrf),
            ("as", "succeeded"),
            ("reason", "the upstream's log shows the sleep finished"),
            ("evidence", r#"{"log_line": "slept 2.5s"}"#),
            ("result", result),
            ("output_schema", output_schema),
        ]);
        raw::exchange(
            &addr,
            "POST",
            &format!("{page_path}/resolve"),
            &[
                ("Cookie", &session),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            body.as_bytes(),
        )
        .unwrap()
    };
    let unsure = || {
        w.db.scalar("SELECT count(*) FROM operations WHERE state = 'outcome_unknown'")
    };
    for (result, output_schema, why) in [
        (r#"{"slept": "long"}"#, schema.as_str(), "does not conform"),
        (r#"{"slept": 2.5}"#, "", "output schema"),
        (r#"{"slept": 2.5}"#, r#"{"type":"object"}"#, "not the one"),
        ("[2.5]", schema.as_str(), "must be a JSON object"),
    ] {
        let r = resolve(result, output_schema);
        assert_eq!(r.status, 422, "{result} {output_schema}: {}", r.body);
        assert!(r.body.contains("invalid_arguments"), "{}", r.body);
        assert!(r.body.contains(why), "{why}: {}", r.body);
        assert_eq!(unsure(), 1, "{result} changed the operation");
    }
    let r = resolve(r#"{"slept": 2.5}"#, &schema);
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(unsure(), 0);
    let _ = console.kill();
    let _ = console.wait();

    let mut p = w.start(&["--config", &config], 0);
    let replay = p.call("slow", json!({"seconds": 2.5, "operation_id": "op-c"}));
    assert_eq!(replay["isError"], false, "{replay}");
    assert_eq!(
        replay["structuredContent"],
        json!({"slept": 2.5}),
        "{replay}"
    );
    assert_eq!(replay["_meta"]["io.toolledger/confirmed"]["by"], "operator");
}

/// Over the proxy's stdio the key travels in the argument, in `_meta` or as
/// `params.idempotencyKey`: each names the operation alone (one charge; the same operation under
/// the argument replays it), and two that disagree are `invalid_arguments` naming both, with
/// nothing charged. (Over HTTP, with the `Idempotency-Key` header too: `proxy_carriers.rs`.)
fn every_carrier_names_the_operation_over_stdio(db: Db) {
    let Some(w) = World::new(db) else { return };
    let mut p = w.start(&[], 0);
    let mut id = 1000;
    let mut call = |p: &mut Server, params: Value| {
        id += 1;
        p.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}));
        let reply = p.recv();
        assert_eq!(reply["id"], id, "{reply}");
        reply["result"].clone()
    };
    let charge = |customer: &str| {
        json!({"name": "charge", "arguments": {"customer": customer, "amount_cents": 250},
               "_meta": support::wire::meta()})
    };
    let mut by_argument = charge("c-a");
    by_argument["arguments"]["operation_id"] = json!("op-a");
    let mut by_meta = charge("c-b");
    by_meta["_meta"]["io.toolledger/operation_id"] = json!("op-b");
    let mut by_params = charge("c-c");
    by_params["idempotencyKey"] = json!("op-c");
    for (i, (carrier, params, op)) in [
        ("argument", by_argument, "op-a"),
        ("_meta", by_meta, "op-b"),
        ("params.idempotencyKey", by_params, "op-c"),
    ]
    .into_iter()
    .enumerate()
    {
        let first = call(&mut p, params.clone());
        assert_eq!(first["isError"], false, "{carrier}: {first}");
        assert_eq!(ledger_meta(&first)["replayed"], false, "{carrier}: {first}");
        assert_eq!(w.charges(), i as i64 + 1, "{carrier}: one charge");
        let mut again = params.clone();
        again["arguments"]["operation_id"] = json!(op);
        let replay = call(&mut p, again);
        assert_eq!(
            ledger_meta(&replay)["replayed"],
            true,
            "{carrier}: {replay}"
        );
        assert_eq!(w.charges(), i as i64 + 1, "{carrier}: replayed");
    }
    let mut disagree = charge("c-x");
    disagree["arguments"]["operation_id"] = json!("op-x1");
    disagree["idempotencyKey"] = json!("op-x2");
    let refused = call(&mut p, disagree);
    let e = error_of(&refused);
    assert_eq!(e["code"], "invalid_arguments", "{refused}");
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("operation_id") && message.contains("params.idempotencyKey"),
        "{message}"
    );
    assert_eq!(w.charges(), 3, "a refused call reaches nothing");
}

/// A charge server on streamable HTTP at `port`, sharing the world's charge file.
fn http_upstream(w: &World, port: u16) -> std::process::Child {
    support::clients::charge_server_http(&w.python, port, &w.charge_db(), &[])
}

/// An upstream that cannot be reached has not been sent anything: the call is `unavailable`
/// (retryable), nothing is unsure, the timeline says `not_sent`, and once the upstream is back
/// the retry under the same operation id forwards it, once. Neither the answer nor the log
/// carries the upstream's URL secrets or an internal type name.
fn an_unreachable_upstream_is_not_sent_and_the_retry_forwards(db: Db) {
    let Some(w) = World::new(db) else { return };
    let port = support::clients::free_port();
    let mut upstream = http_upstream(&w, port);
    let url = format!("http://127.0.0.1:{port}/mcp?token=url-secret-123");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(w.log())
        .unwrap();
    let mut c = toolledger();
    c.arg("proxy")
        .args(w.db.store_args())
        .args(["--principal", "alice", "--upstream-url", &url])
        .env_remove("TOOLLEDGER_STATE_KEY_HEX")
        .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
        .envs(w.db.key_env());
    let mut p = Server::spawn_with_stderr(c, Stdio::from(log));
    let first = p.call("charge", charge("op-up", 100));
    assert_eq!(first["isError"], false, "{first}");
    let _ = upstream.kill();
    let _ = upstream.wait();
    // The upstream is gone: nothing can be sent.
    let down = p.call("charge", charge("op-down", 200));
    let e = error_of(&down);
    assert_eq!(e["code"], "unavailable", "not outcome_unknown: {down}");
    assert_eq!(ledger_meta(&down)["retryable"], true, "{down}");
    let again = p.call("charge", charge("op-down", 200));
    assert_eq!(error_of(&again)["code"], "unavailable", "{again}");
    // A read-only tool passed through says the same, without internals.
    let look = p.call("find_charge", json!({"reference": "op-up"}));
    assert_eq!(error_of(&look)["code"], "unavailable", "{look}");
    for answer in [&down, &again, &look] {
        let text = answer.to_string();
        for leak in [
            "url-secret-123",
            "127.0.0.1",
            "rmcp",
            "reqwest",
            "WorkerTransport",
        ] {
            assert!(!text.contains(leak), "{leak} leaked: {text}");
        }
    }
    let kinds: Vec<String> =
        w.db.pairs("SELECT kind, detail FROM operation_events ORDER BY id")
            .into_iter()
            .map(|(k, _)| k)
            .collect();
    assert!(kinds.contains(&"not_sent".to_string()), "{kinds:?}");
    assert!(
        !kinds
            .iter()
            .any(|k| k == "sent_outcome_unknown" || k == "attempt_refused"),
        "{kinds:?}"
    );
    let (code, unsure) = w.cli(&["operations", "list", "--state", "outcome_unknown"]);
    assert_eq!(code, 0);
    assert!(!unsure.contains("op-down"), "nothing is unsure: {unsure}");
    // Back up: the retry forwards, once.
    let mut upstream = http_upstream(&w, port);
    let ok = p.call("charge", charge("op-down", 200));
    assert_eq!(ok["isError"], false, "{ok}");
    assert_eq!(ledger_meta(&ok)["replayed"], false);
    let replay = p.call("charge", charge("op-down", 200));
    assert_eq!(ledger_meta(&replay)["replayed"], true, "{replay}");
    assert_eq!(w.charges(), 2, "one charge per operation id");
    let _ = upstream.kill();
    let _ = upstream.wait();
    drop(p);
    let log = std::fs::read_to_string(w.log()).unwrap();
    assert!(
        !log.contains("url-secret-123"),
        "the URL's query reached the log: {log}"
    );
    assert!(log.contains("token=[redacted]"), "{log}");
}

on_both_backends!(
    fractional_numbers_pass_and_are_one_intent,
    an_operator_confirms_a_success_with_evidence,
    an_operator_confirms_a_success_with_a_result_that_fits_the_schema,
    the_console_confirms_a_success_with_a_result_that_fits_the_schema,
    every_carrier_names_the_operation_over_stdio,
    an_unreachable_upstream_is_not_sent_and_the_retry_forwards,
    an_upstream_round_asking_for_input_passes_through_bound_to_the_operation,
    progress_and_cancellation_pass_through,
    the_tool_list,
    a_retry_replays_the_upstream_answer,
    an_upstream_error_result_is_stored_and_replayed,
    an_upstream_jsonrpc_error_comes_back_unchanged_and_is_not_stored,
    a_retry_during_the_forward_is_in_progress,
    a_lost_upstream_answer_is_unknown_until_reconciled,
    a_timeout_is_outcome_unknown_and_resolvable,
    a_stopped_proxy_answers_the_call_in_flight_and_lets_its_upstream_exit,
    a_proxy_killed_before_its_claim_forwards_on_the_retry,
    a_proxy_killed_after_the_upstream_answered_is_unknown,
    principal_and_scopes_are_rechecked,
    the_operation_id_travels_as_configured,
    bad_configuration_and_upstream_are_refused,
);
