//! An upstream that starts slowly: rmcp's automatic lifecycle waits 10 s for the answer to
//! `server/discover` before it falls back to `initialize`, so an upstream that answers later
//! (a Python server starting on a loaded machine, an `npx` that installs its package first)
//! made the handshake fail with two answers for one request. The late answer says what the
//! upstream speaks: a modern upstream's result is followed by a connection with MCP 2026-07-28
//! alone, a legacy upstream's error (`server-everything` from npm) by one with `initialize`
//! alone. Either way the call goes through once.

#![cfg(unix)]

#[macro_use]
mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde_json::{json, Value};
use support::wire::{Db, Ledger};

/// Longer than the automatic lifecycle's 10 s wait for `server/discover`.
const START_DELAY_SECONDS: u32 = 11;

/// A `toolledger proxy` over stdio in front of `sh -c SCRIPT BIN ARGS…`, initialized.
struct Proxy {
    child: std::process::Child,
    stdin: ChildStdin,
    replies: Receiver<String>,
    log: std::thread::JoinHandle<Vec<String>>,
    next_id: u64,
    /// Holds the proxy's configuration file.
    _dir: tempfile::TempDir,
}

impl Proxy {
    fn start(db: &Db, config: &str, script: &str, args: &[&str]) -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("proxy.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut child = Command::new(support::BIN)
            .arg("proxy")
            .args(db.store_args())
            .args([
                "--principal",
                "alice",
                "--config",
                config_path.to_str().unwrap(),
            ])
            .args(["--", "sh", "-c", script, support::BIN])
            .args(args)
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
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let stderr = child.stderr.take().unwrap();
        let log = std::thread::spawn(move || {
            BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
                .collect::<Vec<_>>()
        });
        let stdin = child.stdin.take().unwrap();
        let mut proxy = Proxy {
            child,
            stdin,
            replies,
            log,
            next_id: 1,
            _dir: dir,
        };
        let init = proxy.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "slow-upstream-test", "version": "1"}}),
        );
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        proxy.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        proxy
    }

    fn send(&mut self, message: Value) {
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends a request and waits for the answer that carries its id.
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let line = self
            .replies
            .recv_timeout(Duration::from_secs(120))
            .expect("the proxy answers");
        let reply: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(reply["id"], id, "{reply}");
        reply
    }

    /// Calls `tool` with `arguments` twice; the two results.
    fn call_twice(&mut self, tool: &str, arguments: Value) -> (Value, Value) {
        let params = json!({"name": tool, "arguments": arguments});
        let first = self.request("tools/call", params.clone());
        let again = self.request("tools/call", params);
        (first["result"].clone(), again["result"].clone())
    }

    /// Closes the proxy's stdin, waits for it to exit; its log.
    fn finish(self) -> String {
        let Proxy {
            mut child,
            stdin,
            log,
            ..
        } = self;
        drop(stdin);
        let _ = child.wait();
        log.join().unwrap().join("\n")
    }
}

fn ledger(result: &Value) -> &Value {
    &result["_meta"]["io.toolledger/ledger"]
}

#[test]
fn an_upstream_that_answers_discover_late_is_connected_with_the_modern_lifecycle() {
    let db = Db::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let charges = dir.path().join("charges.sqlite");
    // The upstream reads nothing for a while, then starts: both the `server/discover` and the
    // fallback `initialize` are waiting on its stdin by then.
    let script = format!("sleep {START_DELAY_SECONDS}; exec \"$0\" upstream-example --db \"$1\"");
    let mut proxy = Proxy::start(
        &db,
        "[tools.charge]\nforward_operation_id = \"_meta\"\n",
        &script,
        &[charges.to_str().unwrap()],
    );
    let (first, again) = proxy.call_twice(
        "charge",
        json!({"customer": "c-1", "amount_cents": 250, "operation_id": "slow-1"}),
    );
    assert_eq!(first["isError"], false, "{first}");
    let charge_id = first["structuredContent"]["charge_id"].clone();
    assert!(charge_id.is_i64(), "{first}");
    assert_eq!(ledger(&again)["replayed"], true, "{again}");
    assert_eq!(again["structuredContent"]["charge_id"], charge_id);

    let log = proxy.finish();
    assert!(
        log.contains("answered server/discover late"),
        "the late answer was seen and handled: {log}"
    );
    let rows = toolledger_testkit::db::sqlite_count(&charges, "charges");
    assert_eq!(rows, 1, "one charge for one operation");
}

#[test]
fn an_upstream_that_refuses_discover_late_is_connected_with_initialize() {
    let Some(node) = support::clients::node() else {
        return;
    };
    let everything = support::clients::server_everything();
    let db = Db::sqlite();
    // `server-everything` speaks the initialize lifecycle alone and answers `server/discover`
    // with an error; started late, that error arrives after the fallback `initialize` was sent.
    let script = format!("sleep {START_DELAY_SECONDS}; exec \"$1\" \"$2\" stdio");
    let mut proxy = Proxy::start(
        &db,
        "",
        &script,
        &[node.to_str().unwrap(), everything.to_str().unwrap()],
    );
    let (first, again) = proxy.call_twice(
        "toggle-simulated-logging",
        json!({"operation_id": "slow-legacy-1"}),
    );
    assert_ne!(first["isError"], true, "{first}");
    assert_eq!(ledger(&first)["replayed"], false, "{first}");
    assert_eq!(ledger(&again)["replayed"], true, "{again}");
    assert_eq!(again["content"], first["content"], "the same answer");

    let log = proxy.finish();
    assert!(
        log.contains("refused server/discover late"),
        "the late refusal was seen and handled: {log}"
    );
    assert!(
        !log.contains("uncorrelated"),
        "no handshake failed on the late answer: {log}"
    );
    assert_eq!(support::wire::count(&db, "operations"), 1);
}
