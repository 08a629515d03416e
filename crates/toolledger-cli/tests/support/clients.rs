//! The interpreters the tests with other people's MCP clients and servers need, and where
//! those programs are: `TOOLLEDGER_PYTHON` (a python with `mcp==2.3.0`) and `TOOLLEDGER_NODE`
//! (Node 22, with `npm ci` run in `tests/js`). Unset, a test that needs one says so loudly and
//! skips, except under CI (`TOOLLEDGER_CI` set), where a missing interpreter is a failure
//! ([`program`]).

use std::path::{Path, PathBuf};

pub use toolledger_testkit::machine::program;

/// The Python with the official MCP SDK.
pub fn python() -> Option<PathBuf> {
    program("TOOLLEDGER_PYTHON", "Python SDK (mcp==2.3.0)")
}

/// Node 22, with the JavaScript packages of `tests/js` installed.
pub fn node() -> Option<PathBuf> {
    let node = program("TOOLLEDGER_NODE", "Node 22 JavaScript")?;
    assert!(
        repo()
            .join("tests/js/node_modules/@modelcontextprotocol")
            .is_dir(),
        "TOOLLEDGER_NODE is set but tests/js/node_modules is missing: run `bash .ci/node.sh`"
    );
    Some(node)
}

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The proxy's fixtures (`tests/proxy`): the charge server and the Python driver.
pub fn proxy_fixture(name: &str) -> PathBuf {
    repo().join("tests/proxy").join(name)
}

/// The TypeScript SDK v2 driver of the proxy tests.
pub fn ts_client() -> PathBuf {
    repo().join("tests/js/proxy/ts_client.mjs")
}

/// `@modelcontextprotocol/server-everything`'s entry point (run it with `stdio`).
pub fn server_everything() -> PathBuf {
    repo().join("tests/js/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
}

/// Runs a client driver (`tests/proxy/py_client.py`, `ts_client.mjs`): `command` with the JSON
/// `spec` as its one argument. Its JSON output lines; panics with them and its stderr unless
/// it exits 0.
pub fn run_driver(
    mut command: std::process::Command,
    spec: &serde_json::Value,
) -> Vec<serde_json::Value> {
    let out = command
        .arg(spec.to_string())
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{command:?} failed: {lines:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lines
}

/// The result of call `i` in a driver's lines.
pub fn driver_result(lines: &[serde_json::Value], i: usize) -> serde_json::Value {
    lines
        .iter()
        .find(|l| l["i"] == i)
        .and_then(|l| l.get("result").cloned())
        .unwrap_or_else(|| panic!("call {i} has no result: {lines:?}"))
}

/// Waits until something listens on `127.0.0.1:port` (an upstream just spawned); panics
/// naming `what` after a minute.
pub fn wait_listening(port: u16, what: &str) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < until, "{what} never listened");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A local port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The test charge server (`tests/proxy/charge_server.py`) over streamable HTTP at `port`,
/// with `charges` as its database and `env` added, once it listens.
pub fn charge_server_http(
    python: &Path,
    port: u16,
    charges: &Path,
    env: &[(&str, &std::ffi::OsStr)],
) -> std::process::Child {
    let child = std::process::Command::new(python)
        .arg(proxy_fixture("charge_server.py"))
        .args(["--http", &port.to_string()])
        .env("CHARGE_DB", charges)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(port, "the HTTP upstream");
    child
}

/// `@modelcontextprotocol/server-filesystem`'s entry point (its allowed directories are its
/// arguments, or the client's roots).
pub fn server_filesystem() -> PathBuf {
    repo().join("tests/js/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js")
}
