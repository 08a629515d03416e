//! Where the operation id may travel, and the re-plan guard, through `toolledger proxy` in
//! front of the official Python SDK's charge server, on both backends:
//!
//! - the four carriers — the argument, `_meta["io.toolledger/operation_id"]`,
//!   `params.idempotencyKey` and (over HTTP) the `Idempotency-Key` header — each name the
//!   operation alone (a retry under another carrier replays); two that disagree are
//!   `invalid_arguments` naming both, and nothing is recorded; the capability
//!   `io.toolledger/idempotency` is advertised;
//! - a re-plan after a lost reply (the same arguments under a new operation id, while the
//!   first is `outcome_unknown`) is `possible_duplicate` naming the earlier operation and is
//!   not forwarded; `_meta["io.toolledger/new_intent"]: true` proceeds; other arguments
//!   proceed; once the earlier operation is settled, the same arguments proceed again.

#![cfg(unix)]

#[macro_use]
mod support;
#[path = "support/raw.rs"]
mod raw;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use raw::exchange;
use serde_json::{json, Value};
use support::clients::{proxy_fixture, python};
use support::wire::{add_principal, meta, Db, Ledger};
use toolledger_testkit::kill::{free_port, Killed};
use toolledger_testkit::stdio::wait_listening;

on_both_backends!(
    every_carrier_names_the_operation_and_disagreeing_ones_are_refused,
    a_replan_after_a_lost_reply_is_a_possible_duplicate,
);

/// A `proxy --http` in front of the charge server (answering `delay_ms` after each charge),
/// with a call timeout of `timeout_s`.
struct Proxy {
    _proxy: Killed,
    addr: String,
    charges: PathBuf,
    db_args: Vec<String>,
    key_env: Vec<(String, String)>,
    _dir: tempfile::TempDir,
}

impl Proxy {
    fn start(db: &Db, delay_ms: u64, timeout_s: u64) -> Option<Proxy> {
        let python = python()?;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("proxy.toml");
        std::fs::write(&config, format!("call_timeout_seconds = {timeout_s}\n")).unwrap();
        let charges = dir.path().join("charges.sqlite");
        let addr = format!("127.0.0.1:{}", free_port());
        let mut proxy = Killed(
            Command::new(support::BIN)
                .arg("proxy")
                .args(db.store_args())
                .args(["--config", config.to_str().unwrap(), "--http", &addr, "--"])
                .arg(&python)
                .arg(proxy_fixture("charge_server.py"))
                .env_remove("TOOLLEDGER_STATE_KEY_HEX")
                .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
                .env_remove("TOOLLEDGER_ALLOWED_HOSTS")
                .envs(db.key_env())
                .env("CHARGE_DB", &charges)
                .env("CHARGE_DELAY_MS", delay_ms.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        wait_listening(proxy.0.stderr.take().unwrap());
        Some(Proxy {
            _proxy: proxy,
            addr,
            charges,
            db_args: db.store_args(),
            key_env: db
                .key_env()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            _dir: dir,
        })
    }

    /// The JSON-RPC answer to `tools/call` params `params` (its `_meta` completed) as `token`,
    /// with `headers` added.
    fn rpc(&self, token: &str, params: Value, headers: &[(&str, &str)]) -> Value {
        let mut params = params;
        let mut m = meta();
        if let Some(extra) = params.get("_meta").and_then(Value::as_object) {
            for (k, v) in extra {
                m[k] = v.clone();
            }
        }
        params["_meta"] = m;
        let name = params["name"].as_str().unwrap().to_string();
        let auth = format!("Bearer {token}");
        let mut all = vec![
            ("Authorization", auth.as_str()),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", name.as_str()),
        ];
        all.extend_from_slice(headers);
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
        let r = exchange(
            &self.addr,
            "POST",
            "/mcp",
            &all,
            body.to_string().as_bytes(),
        )
        .expect("an HTTP answer");
        assert!(r.status == 200 || r.status == 400, "{}", r.body);
        r.json()
    }

    fn call(&self, token: &str, params: Value, headers: &[(&str, &str)]) -> Value {
        let answer = self.rpc(token, params, headers);
        assert!(answer.get("result").is_some(), "{answer}");
        answer["result"].clone()
    }

    fn charges(&self) -> i64 {
        if !self.charges.exists() {
            return 0;
        }
        let conn = rusqlite::Connection::open(&self.charges).unwrap();
        conn.query_row("SELECT count(*) FROM charges", [], |r| r.get(0))
            .unwrap_or(0)
    }

    fn cli(&self, args: &[&str]) -> (i32, String) {
        let out = Command::new(support::BIN)
            .args(args)
            .args(&self.db_args)
            .env_remove("TOOLLEDGER_STATE_KEY_HEX")
            .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
            .envs(self.key_env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }
}

/// A carrier's name, a call's params naming the operation by it, and the call's headers.
type Carried = (&'static str, Value, Vec<(&'static str, &'static str)>);

fn error(result: &Value) -> Value {
    assert_eq!(result["isError"], true, "not an error result: {result}");
    let text = result["content"][0]["text"].as_str().unwrap();
    serde_json::from_str::<Value>(text).unwrap()["error"].clone()
}

fn replayed(result: &Value) -> bool {
    result["_meta"]["io.toolledger/ledger"]["replayed"] == true
}

fn charge_params(customer: &str) -> Value {
    json!({"name": "charge", "arguments": {"customer": customer, "amount_cents": 250}})
}

fn with_arg(mut params: Value, op: &str) -> Value {
    params["arguments"]["operation_id"] = json!(op);
    params
}

fn with_meta(mut params: Value, key: &str, value: Value) -> Value {
    params["_meta"] = json!({ key: value });
    params
}

fn with_params_key(mut params: Value, op: &str) -> Value {
    params["idempotencyKey"] = json!(op);
    params
}

fn every_carrier_names_the_operation_and_disagreeing_ones_are_refused(db: Db) {
    let token = add_principal(&db, "hank", "acme", &["editor"], &[], true).unwrap();
    let Some(p) = Proxy::start(&db, 0, 30) else {
        return;
    };
    let carriers: Vec<Carried> = vec![
        (
            "argument",
            with_arg(charge_params("c-arg"), "op-arg"),
            vec![],
        ),
        (
            "_meta",
            with_meta(
                charge_params("c-meta"),
                "io.toolledger/operation_id",
                json!("op-meta"),
            ),
            vec![],
        ),
        (
            "params.idempotencyKey",
            with_params_key(charge_params("c-params"), "op-params"),
            vec![],
        ),
        (
            "Idempotency-Key",
            charge_params("c-header"),
            vec![("Idempotency-Key", "op-header")],
        ),
    ];
    for (i, (carrier, params, headers)) in carriers.iter().enumerate() {
        let first = p.call(&token, params.clone(), headers);
        assert_eq!(first["isError"], false, "{carrier}: {first}");
        assert!(!replayed(&first), "{carrier}: {first}");
        let op = first["_meta"]["io.toolledger/ledger"]["operationId"].clone();
        assert_eq!(p.charges(), i as i64 + 1, "{carrier}: one charge");
        // The same operation named by another carrier replays it.
        let customer = params["arguments"]["customer"].as_str().unwrap();
        let again = p.call(
            &token,
            with_arg(charge_params(customer), op.as_str().unwrap()),
            &[],
        );
        assert!(replayed(&again), "{carrier}: {again}");
        assert_eq!(p.charges(), i as i64 + 1, "{carrier}: replayed");
    }
    // Two carriers that disagree: refused, naming both, nothing recorded.
    for (params, headers, names) in [
        (
            with_params_key(with_arg(charge_params("c-x"), "op-x1"), "op-x2"),
            vec![],
            ["the argument operation_id", "params.idempotencyKey"],
        ),
        (
            with_meta(
                charge_params("c-y"),
                "io.toolledger/operation_id",
                json!("op-y1"),
            ),
            vec![("Idempotency-Key", "op-y2")],
            ["_meta", "Idempotency-Key header"],
        ),
    ] {
        let refused = p.call(&token, params, &headers);
        let e = error(&refused);
        assert_eq!(e["code"], "invalid_arguments", "{refused}");
        let message = e["message"].as_str().unwrap();
        for name in names {
            assert!(message.contains(name), "{message}");
        }
    }
    assert_eq!(p.charges(), 4, "a refused call reaches nothing");
    let (_, listed) = p.cli(&["operations", "list", "--json", "--limit", "100"]);
    assert!(!listed.contains("op-x"), "nothing recorded: {listed}");
    assert!(!listed.contains("op-y"), "nothing recorded: {listed}");
    // A malformed params.idempotencyKey is the JSON-RPC error -32602.
    let mut bad = charge_params("c-z");
    bad["idempotencyKey"] = json!(42);
    let answer = p.rpc(&token, bad, &[]);
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    // The carriers are advertised.
    let discover = exchange(
        &p.addr,
        "POST",
        "/mcp",
        &[
            ("Authorization", format!("Bearer {token}").as_str()),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "server/discover"),
        ],
        json!({"jsonrpc": "2.0", "id": 9, "method": "server/discover",
               "params": {"_meta": meta()}})
        .to_string()
        .as_bytes(),
    )
    .unwrap()
    .json();
    let advertised = discover
        .pointer("/result/capabilities/experimental/io.toolledger~1idempotency")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(
        advertised["carriers"],
        json!([
            "argument",
            "_meta",
            "params.idempotencyKey",
            "Idempotency-Key"
        ]),
        "{discover}"
    );
}

fn a_replan_after_a_lost_reply_is_a_possible_duplicate(db: Db) {
    let token = add_principal(&db, "hank", "acme", &["editor"], &[], true).unwrap();
    add_principal(&db, "olga", "acme", &["operator"], &[], false);
    // Each charge answers 3 s after it commits; the proxy gives up after 1 s: lost replies.
    let Some(p) = Proxy::start(&db, 3_000, 1) else {
        return;
    };
    let lost = p.call(&token, with_arg(charge_params("c-1"), "plan-1"), &[]);
    let e = error(&lost);
    assert_eq!(e["code"], "outcome_unknown", "{lost}");
    let first_ref = e["status_ref"].as_str().unwrap().to_string();
    assert_eq!(p.charges(), 1);
    // The agent re-plans the same charge under a new operation id: refused, not forwarded.
    let replan = p.call(&token, with_arg(charge_params("c-1"), "plan-2"), &[]);
    let e = error(&replan);
    assert_eq!(e["code"], "possible_duplicate", "{replan}");
    assert_eq!(e["earlier"]["operation_id"], "plan-1", "{replan}");
    assert_eq!(e["earlier"]["status_ref"], first_ref.as_str(), "{replan}");
    assert_eq!(e["earlier"]["state"], "outcome_unknown", "{replan}");
    assert_eq!(e["status_ref"], first_ref.as_str(), "{replan}");
    assert_eq!(p.charges(), 1, "the re-plan was not forwarded");
    let (_, listed) = p.cli(&["operations", "list", "--json", "--limit", "100"]);
    assert!(!listed.contains("plan-2"), "nothing recorded: {listed}");
    // The same under the header carrier.
    let replan = p.call(
        &token,
        charge_params("c-1"),
        &[("Idempotency-Key", "plan-3")],
    );
    assert_eq!(error(&replan)["code"], "possible_duplicate", "{replan}");
    // Other arguments are another intent.
    let other = p.call(&token, with_arg(charge_params("c-2"), "plan-4"), &[]);
    assert_eq!(error(&other)["code"], "outcome_unknown", "{other}");
    assert_eq!(p.charges(), 2);
    // The caller says it is a new intent: it proceeds.
    let again = p.call(
        &token,
        with_meta(
            with_arg(charge_params("c-1"), "plan-5"),
            "io.toolledger/new_intent",
            json!(true),
        ),
        &[],
    );
    assert_eq!(error(&again)["code"], "outcome_unknown", "{again}");
    assert_eq!(p.charges(), 3);
    // Once the earlier operations are settled, the same arguments proceed again.
    for op in ["plan-1", "plan-5"] {
        let (code, shown) = p.cli(&[
            "operations",
            "show",
            "--tool",
            "charge",
            "--key",
            op,
            "--tenant",
            "acme",
            "--subject",
            "hank",
        ]);
        assert_eq!(code, 0, "{shown}");
        let shown: Value = serde_json::from_str(&shown).unwrap();
        let status_ref = shown["operation"]["status_ref"]
            .as_str()
            .unwrap()
            .to_string();
        let (code, out) = p.cli(&[
            "resolve",
            "--status-ref",
            &status_ref,
            "--as",
            "failed",
            "--reason",
            "the charge was refunded by hand",
            "--operator",
            "olga",
        ]);
        assert_eq!(code, 0, "{out}");
    }
    let settled = p.call(&token, with_arg(charge_params("c-1"), "plan-6"), &[]);
    assert_eq!(error(&settled)["code"], "outcome_unknown", "{settled}");
    assert_eq!(p.charges(), 4, "a settled earlier operation never blocks");
}
