//! An upstream that starts slowly: rmcp's automatic lifecycle waits 10 s for the answer to
//! `server/discover` before it falls back to `initialize`, so a modern upstream that answers
//! later (a Python server starting on a loaded machine) made the handshake fail with two
//! answers for one request. The proxy then connects again with MCP 2026-07-28 alone, and the
//! call goes through once.

#![cfg(unix)]

#[macro_use]
mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc::channel;
use std::time::Duration;

use serde_json::{json, Value};
use support::wire::{Db, Ledger};

/// Longer than the automatic lifecycle's 10 s wait for `server/discover`.
const START_DELAY_SECONDS: u32 = 11;

#[test]
fn an_upstream_that_answers_discover_late_is_connected_with_the_modern_lifecycle() {
    let db = Db::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let charges = dir.path().join("charges.sqlite");
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        "[tools.charge]\nforward_operation_id = \"_meta\"\n",
    )
    .unwrap();
    // The upstream reads nothing for a while, then starts: both the `server/discover` and the
    // fallback `initialize` are waiting on its stdin by then.
    let script = format!("sleep {START_DELAY_SECONDS}; exec \"$0\" upstream-example --db \"$1\"");
    let mut proxy = Command::new(support::BIN)
        .arg("proxy")
        .args(db.store_args())
        .args(["--principal", "alice", "--config", config.to_str().unwrap()])
        .args(["--", "sh", "-c", &script, support::BIN])
        .arg(&charges)
        .env_remove("TOOLLEDGER_STATE_KEY_HEX")
        .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
        .env_remove("TOOLLEDGER_UPSTREAM_DELAY_MS")
        .envs(db.key_env())
        .env("RUST_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, replies) = channel();
    let stdout = proxy.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let stderr = proxy.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let mut stdin = proxy.stdin.take().unwrap();
    let mut send = |message: Value| {
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    };
    let recv = || -> Value {
        let line = replies
            .recv_timeout(Duration::from_secs(120))
            .expect("the proxy answers");
        serde_json::from_str(&line).unwrap()
    };

    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "slow-upstream-test", "version": "1"}}}),
    );
    let init = recv();
    assert_eq!(init["id"], 1, "{init}");
    assert!(init["result"]["serverInfo"].is_object(), "{init}");
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "charge",
        "arguments": {"customer": "c-1", "amount_cents": 250, "operation_id": "slow-1"}}});
    send(call.clone());
    let first = recv();
    assert_eq!(first["id"], 2, "{first}");
    assert_eq!(first["result"]["isError"], false, "{first}");
    let charge_id = first["result"]["structuredContent"]["charge_id"].clone();
    assert!(charge_id.is_i64(), "{first}");
    send(call);
    let again = recv();
    assert_eq!(
        again["result"]["_meta"]["io.toolledger/ledger"]["replayed"], true,
        "{again}"
    );
    assert_eq!(again["result"]["structuredContent"]["charge_id"], charge_id);

    drop(stdin);
    let _ = proxy.wait();
    let log = log.join().unwrap().join("\n");
    assert!(
        log.contains("answered server/discover late"),
        "the late answer was seen and handled: {log}"
    );
    let rows = toolledger_testkit::db::sqlite_count(&charges, "charges");
    assert_eq!(rows, 1, "one charge for one operation");
}
