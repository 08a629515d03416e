//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in tests/js)
//! against `toolledger serve --http`, at the 2026-07-28 and the 2025-11-25 requirements, each at
//! its own wire. A header-adding proxy supplies the bearer token the suite cannot send.
//!
//! The test fails when a scenario outside tests/conformance/baseline.json fails, and when a
//! baselined one passes. The baseline lists only scenarios whose fixture tools, resources or
//! prompts the reference server does not have, or whose capability it does not declare; see
//! docs/conformance.md. Without Node (`TOOLLEDGER_NODE`) the tests skip loudly; in CI
//! (`TOOLLEDGER_CI`) they fail instead.

#[path = "../../../tests/conformance/harness.rs"]
mod harness;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use serde_json::Value;
use toolledger_testkit::stdio::wait_listening;

const BIN: &str = env!("CARGO_BIN_EXE_toolledger");

/// A running `toolledger serve --http` (killed on drop) and a bearer token it accepts.
struct Serve {
    child: Child,
    addr: SocketAddr,
    token: String,
    _dir: tempfile::TempDir,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn toolledger() -> Command {
    let mut c = Command::new(BIN);
    // SQLite keeps the keys in its key file; the caller's environment must not override them.
    c.env_remove("TOOLLEDGER_STATE_KEY_HEX")
        .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX");
    c
}

fn start_serve() -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.sqlite").display().to_string();
    let added = toolledger()
        .args(["principal", "add", "conformance", "--tenant", "conformance"])
        .args(["--token", "--db", &db])
        .output()
        .unwrap();
    assert!(added.status.success(), "principal add: {added:?}");
    let added: Value = serde_json::from_slice(&added.stdout).unwrap();
    let token = added["token"].as_str().unwrap().to_string();
    let mut child = toolledger()
        .args(["serve", "--db", &db, "--http", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (url, _) = wait_listening(child.stderr.take().unwrap());
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .parse()
        .unwrap();
    Serve {
        child,
        addr,
        token,
        _dir: dir,
    }
}

/// Runs the suite's requirement set `revision` against a fresh `serve --http` and judges it.
fn serve_meets(revision: &str) {
    let Some(suite) = harness::Suite::find() else {
        return;
    };
    let serve = start_serve();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let proxy = rt.block_on(harness::bearer_proxy(serve.addr, serve.token.clone()));
    let url = format!("http://{proxy}/mcp");
    let scenarios = suite.run_requirements(&url, revision, "serve");
    harness::judge("serve", revision, &scenarios);
}

#[test]
fn serve_fails_no_2026_07_28_scenario_outside_the_baseline() {
    serve_meets("2026-07-28");
}

#[test]
fn serve_fails_no_2025_11_25_scenario_outside_the_baseline() {
    serve_meets("2025-11-25");
}
