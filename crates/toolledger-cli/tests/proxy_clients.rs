//! `toolledger proxy` with programs nobody here wrote on both sides: the official SDKs'
//! clients (Python `mcp` 2.3.0, its high-level `Client` and its `ClientSession`; the
//! TypeScript SDK v2; the MCP Inspector's command line) in both MCP lifecycles, over the proxy's stdio and its streamable HTTP
//! with bearer tokens; upstreams `@modelcontextprotocol/server-everything` (npm, stdio) and the
//! Python SDK's charge server, on stdio and over streamable HTTP.
//!
//! Drivers: `tests/proxy/py_client.py` and `tests/js/proxy/ts_client.mjs` (one JSON spec in,
//! one JSON line per answered call out; see `tests/proxy/README.md`).

#[macro_use]
mod support;
#[path = "support/raw.rs"]
mod raw;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::clients::{node, proxy_fixture, python, server_everything, ts_client};
use support::wire::{add_principal, toolledger, Db, Ledger};
use toolledger_testkit::kill::free_port;
use toolledger_testkit::stdio::wait_listening;

#[derive(Clone, Copy, Debug)]
enum Driver {
    PyClient,
    PySession,
    Ts,
}

const DRIVERS: [Driver; 3] = [Driver::PyClient, Driver::PySession, Driver::Ts];

/// Both interpreters, or `None` (skipped loudly outside CI).
fn interpreters() -> Option<(PathBuf, PathBuf)> {
    Some((python()?, node()?))
}

/// Runs `driver` on `spec`; its output lines.
fn drive(driver: Driver, spec: &Value, py: &PathBuf, node: &PathBuf) -> Vec<Value> {
    let mut spec = spec.clone();
    let c = match driver {
        Driver::PyClient | Driver::PySession => {
            spec["api"] = json!(if matches!(driver, Driver::PyClient) {
                "client"
            } else {
                "session"
            });
            let mut c = Command::new(py);
            c.arg(proxy_fixture("py_client.py"));
            c
        }
        Driver::Ts => {
            let mut c = Command::new(node);
            c.arg(ts_client());
            c
        }
    };
    support::clients::run_driver(c, &spec)
}

/// The answer to call `i` (a result), from a driver's lines.
fn result(lines: &[Value], i: usize) -> Value {
    support::clients::driver_result(lines, i)
}

fn tools(lines: &[Value]) -> Vec<Value> {
    lines
        .iter()
        .find_map(|l| l["tools"].as_array().cloned())
        .expect("a tools line")
}

fn ledger(result: &Value) -> Value {
    result["_meta"]["io.toolledger/ledger"].clone()
}

/// The text of a result's first content block.
fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The stdio server spec of `toolledger proxy` on `db` in front of `upstream`.
fn proxy_server(db: &Db, upstream: &[String], env: &[(&str, String)]) -> Value {
    let mut args = vec!["proxy".to_string()];
    args.extend(db.store_args());
    args.extend(["--principal".into(), "alice".into(), "--".into()]);
    args.extend(upstream.iter().cloned());
    let mut e = serde_json::Map::new();
    for (k, v) in db.key_env() {
        e.insert(k.into(), json!(v));
    }
    for (k, v) in env {
        e.insert((*k).into(), json!(v));
    }
    // The drivers pass only what the spec names; a PATH lets the proxy start its upstream.
    e.insert(
        "PATH".into(),
        json!(std::env::var("PATH").unwrap_or_default()),
    );
    json!({"command": support::BIN, "args": args, "env": e})
}

fn server_everything_through_the_proxy(db: Db) {
    let Some((py, node)) = interpreters() else {
        return;
    };
    let upstream = vec![
        node.display().to_string(),
        server_everything().display().to_string(),
        "stdio".into(),
    ];
    let server = proxy_server(&db, &upstream, &[]);
    for lifecycle in ["legacy", "2026-07-28"] {
        for driver in DRIVERS {
            let op = format!("toggle-{lifecycle}-{driver:?}");
            let spec = json!({
                "transport": "stdio", "server": server, "lifecycle": lifecycle,
                "list_tools": true,
                "calls": [
                    {"name": "echo", "arguments": {"message": "hi"}},
                    {"name": "get-sum", "arguments": {"a": 2, "b": 40}},
                    {"name": "toggle-simulated-logging", "arguments": {"operation_id": op}},
                    {"name": "toggle-simulated-logging", "arguments": {"operation_id": op}},
                    {"name": "toggle-simulated-logging", "arguments": {}},
                ],
            });
            let lines = drive(driver, &spec, &py, &node);
            let listed = tools(&lines);
            let tool = |n: &str| {
                listed
                    .iter()
                    .find(|t| t["name"] == n)
                    .cloned()
                    .unwrap_or_else(|| panic!("{n} not listed: {listed:?}"))
            };
            assert!(
                tool("echo")["inputSchema"]["properties"]
                    .get("operation_id")
                    .is_none(),
                "read-only tools pass through"
            );
            let toggle = tool("toggle-simulated-logging");
            assert!(toggle["inputSchema"]["required"]
                .as_array()
                .unwrap()
                .contains(&json!("operation_id")));
            tool("get_operation_status");
            assert_eq!(
                text(&result(&lines, 0)),
                "Echo: hi",
                "{driver:?} {lifecycle}"
            );
            assert!(text(&result(&lines, 1)).contains("42"), "{lines:?}");
            let first = result(&lines, 2);
            assert_ne!(first["isError"], true, "{first}");
            assert_eq!(ledger(&first)["replayed"], false, "{first}");
            let again = result(&lines, 3);
            assert_eq!(ledger(&again)["replayed"], true, "{again}");
            assert_eq!(again["content"], first["content"], "the same answer");
            let refused = result(&lines, 4);
            assert_eq!(refused["isError"], true);
            assert!(text(&refused).contains("invalid_arguments"), "{refused}");
        }
    }
    // One ledger row per guarded call that carried an operation id.
    assert_eq!(support::wire::count(&db, "operations"), 6);
}

fn charge_db(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("charges.sqlite")
}

fn charges(path: &Path) -> i64 {
    toolledger_testkit::db::sqlite_count(path, "charges")
}

fn charge_calls(op: &str) -> Value {
    let args = json!({"customer": "c-1", "amount_cents": 250, "operation_id": op});
    json!([
        {"name": "charge", "arguments": args},
        {"name": "charge", "arguments": args},
        {"name": "get_operation_status", "arguments": {"operation_id": op}},
    ])
}

fn check_charge_story(lines: &[Value], op: &str) {
    let first = result(lines, 0);
    assert_eq!(first["isError"], false, "{first}");
    assert_eq!(first["structuredContent"]["amount_cents"], 250);
    assert_eq!(ledger(&first)["replayed"], false);
    let again = result(lines, 1);
    assert_eq!(ledger(&again)["replayed"], true);
    assert_eq!(again["structuredContent"], first["structuredContent"]);
    assert_eq!(again["content"], first["content"]);
    let status = result(lines, 2);
    assert_eq!(
        status["structuredContent"]["state"], "succeeded",
        "{status}"
    );
    assert_eq!(status["structuredContent"]["operationId"], op);
}

/// A `toolledger proxy --http` process; its `/mcp` URL.
struct HttpProxy {
    child: Child,
    url: String,
}

impl HttpProxy {
    fn start(db: &Db, upstream_flags: &[String], env: &[(&str, String)]) -> HttpProxy {
        let mut c = toolledger();
        c.arg("proxy")
            .args(db.store_args())
            .args(["--http", "127.0.0.1:0"])
            .args(upstream_flags)
            .env_remove("TOOLLEDGER_STATE_KEY_HEX")
            .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
            .envs(db.key_env())
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let (url, _) = wait_listening(child.stderr.take().unwrap());
        HttpProxy { child, url }
    }
}

impl Drop for HttpProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sdk_clients_replay_through_the_proxy(db: Db) {
    let Some((py, node)) = interpreters() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cdb = charge_db(&dir);
    let upstream = vec![
        py.display().to_string(),
        proxy_fixture("charge_server.py").display().to_string(),
    ];
    let env = [("CHARGE_DB", cdb.display().to_string())];
    // stdio: each client starts its own proxy.
    let server = proxy_server(&db, &upstream, &env);
    let mut expected = 0;
    for lifecycle in ["legacy", "2026-07-28"] {
        for driver in DRIVERS {
            let op = format!("stdio-{lifecycle}-{driver:?}");
            let spec = json!({"transport": "stdio", "server": server, "lifecycle": lifecycle,
                              "calls": charge_calls(&op)});
            check_charge_story(&drive(driver, &spec, &py, &node), &op);
            expected += 1;
            assert_eq!(charges(&cdb), expected, "one charge per operation id");
        }
    }
    // HTTP: one proxy, bearer tokens.
    let token = add_principal(&db, "hank", "acme", &[], &[], true).unwrap();
    let mut flags = vec!["--".to_string()];
    flags.extend(upstream.iter().cloned());
    let proxy = HttpProxy::start(&db, &flags, &env);
    for lifecycle in ["legacy", "2026-07-28"] {
        for driver in DRIVERS {
            let op = format!("http-{lifecycle}-{driver:?}");
            let spec = json!({"transport": "http", "url": proxy.url, "token": token,
                              "lifecycle": lifecycle, "calls": charge_calls(&op)});
            check_charge_story(&drive(driver, &spec, &py, &node), &op);
            expected += 1;
            assert_eq!(charges(&cdb), expected);
        }
    }
}

/// An HTTP upstream that refuses requests without its bearer token: the token reaches it from
/// the configuration file's `${ENV}` substitution, from a headers file and from
/// `TOOLLEDGER_UPSTREAM_HEADERS` — never from the command line.
/// The charge server over HTTP behind bearer `secret`, on a free port: the port it listens on
/// once it answers as itself (its own 401 to a request without the token). A port another
/// test's server took between the probe and the bind makes it exit; it is started again on
/// another port.
fn http_charge_server(py: &Path, cdb: &Path, secret: &str) -> (Child, u16) {
    for _ in 0..5 {
        let port = free_port();
        let mut child = Command::new(py)
            .arg(proxy_fixture("charge_server.py"))
            .args(["--http", &port.to_string()])
            .env("CHARGE_DB", cdb)
            .env("CHARGE_BEARER", secret)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < until {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if answers_as_the_charge_server(port, secret) {
                return (child, port);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("the HTTP upstream never listened");
}

/// Whether `127.0.0.1:port` answers as the charge server behind `secret` does: 401
/// `unauthorized` without the token (its own refusal), something else with it.
fn answers_as_the_charge_server(port: u16, secret: &str) -> bool {
    let addr = format!("127.0.0.1:{port}");
    let get = |headers: &[(&str, &str)]| raw::exchange(&addr, "GET", "/mcp", headers, b"");
    let bearer = format!("Bearer {secret}");
    get(&[]).is_some_and(|r| r.status == 401 && r.body == "unauthorized")
        && get(&[("Authorization", &bearer)]).is_some_and(|r| r.status != 401)
}

fn an_http_upstream(db: Db) {
    let Some((py, node)) = interpreters() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cdb = charge_db(&dir);
    // Each test its own secret: a charge server of another test on a recycled port does not
    // pass for this one.
    let backend = if db.is_postgres() { "pg" } else { "sqlite" };
    let secret = &format!("upstream-secret-{}-{backend}", std::process::id());
    let (mut upstream, port) = http_charge_server(&py, &cdb, secret);
    let url = format!("http://127.0.0.1:{port}/mcp");
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        "[upstream_headers]\nAuthorization = \"Bearer ${CHARGE_TOKEN}\"\n",
    )
    .unwrap();
    let headers_file = dir.path().join("headers");
    std::fs::write(
        &headers_file,
        format!("# the upstream's token\nAuthorization: Bearer {secret}\n"),
    )
    .unwrap();
    let base = |extra: &[&str]| {
        let mut args = vec!["proxy".to_string()];
        args.extend(db.store_args());
        args.extend([
            "--principal".into(),
            "alice".into(),
            "--upstream-url".into(),
        ]);
        args.push(url.clone());
        args.extend(extra.iter().map(|s| s.to_string()));
        assert!(
            args.iter().all(|a| !a.contains(secret)),
            "not on the command line"
        );
        let mut e = serde_json::Map::new();
        for (k, v) in db.key_env() {
            e.insert(k.into(), json!(v));
        }
        (args, e)
    };
    let config_arg = config.display().to_string();
    let file_arg = headers_file.display().to_string();
    let (args, mut e) = base(&["--config", &config_arg]);
    e.insert("CHARGE_TOKEN".into(), json!(secret));
    let from_config = json!({"command": support::BIN, "args": args, "env": e});
    let (args, e) = base(&["--upstream-headers-file", &file_arg]);
    let from_file = json!({"command": support::BIN, "args": args, "env": e});
    let (args, mut e) = base(&[]);
    e.insert(
        "TOOLLEDGER_UPSTREAM_HEADERS".into(),
        json!(format!("Authorization: Bearer {secret}")),
    );
    let from_env = json!({"command": support::BIN, "args": args, "env": e});
    for (driver, server) in DRIVERS.into_iter().zip([from_config, from_file, from_env]) {
        let op = format!("upstream-http-{driver:?}");
        let spec = json!({"transport": "stdio", "server": server, "lifecycle": "legacy",
                          "calls": charge_calls(&op)});
        check_charge_story(&drive(driver, &spec, &py, &node), &op);
    }
    assert_eq!(charges(&cdb), 3);

    // Without the variable the configuration names, the proxy refuses to start and says which
    // variable; with a wrong token the upstream refuses and the proxy says so, showing no token.
    // The proxy started with `--config` and `token` as CHARGE_TOKEN (unset when `None`): it
    // must refuse to start; its stderr.
    let refused = |token: Option<&str>| {
        let (args, e) = base(&["--config", &config_arg]);
        let mut command = std::process::Command::new(support::BIN);
        command
            .args(&args)
            .envs(
                e.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string())),
            )
            .env_remove("CHARGE_TOKEN")
            .stdin(Stdio::null());
        if let Some(t) = token {
            command.env("CHARGE_TOKEN", t);
        }
        let out = command.output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = refused(None);
    assert!(
        stderr.contains("CONFIG_INVALID") && stderr.contains("${CHARGE_TOKEN}"),
        "{stderr}"
    );
    let stderr = refused(Some("wrong-token-77"));
    assert!(stderr.contains("UPSTREAM_UNAVAILABLE"), "{stderr}");
    assert!(!stderr.contains("wrong-token-77"), "{stderr}");
    let _ = upstream.kill();
    let _ = upstream.wait();
}

/// One run of the MCP Inspector's command line against the stdio `server` (a session config
/// file in `scratch`); its `result`.
fn inspector(node: &PathBuf, scratch: &std::path::Path, server: &Value, args: &[&str]) -> Value {
    let config = scratch.join("mcp.json");
    std::fs::write(
        &config,
        json!({"mcpServers": {"proxy": server}}).to_string(),
    )
    .unwrap();
    let launcher = support::clients::repo().join(
        "tests/js/node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js",
    );
    let out = Command::new(node)
        .arg(launcher)
        .args(["--cli", "--config"])
        .arg(&config)
        .args([
            "--server",
            "proxy",
            "--protocol-era",
            "legacy",
            "--format",
            "json",
            "--quiet",
        ])
        .args(args)
        // Its own state stays out of the user's home directory.
        .env("HOME", scratch)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert!(
        printed.get("result").is_some(),
        "the Inspector printed no result: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    printed["result"].clone()
}

fn the_inspector_lists_and_calls_through_the_proxy(db: Db) {
    let Some((py, node)) = interpreters() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cdb = charge_db(&dir);
    let upstream = vec![
        py.display().to_string(),
        proxy_fixture("charge_server.py").display().to_string(),
    ];
    let server = proxy_server(&db, &upstream, &[("CHARGE_DB", cdb.display().to_string())]);
    let listed = inspector(&node, dir.path(), &server, &["--method", "tools/list"]);
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"charge") && names.contains(&"get_operation_status"),
        "{names:?}"
    );
    let args =
        json!({"customer": "c-9", "amount_cents": 900, "operation_id": "insp-1"}).to_string();
    let call = [
        "--method",
        "tools/call",
        "--tool-name",
        "charge",
        "--tool-args-json",
        &args,
    ];
    let first = inspector(&node, dir.path(), &server, &call);
    assert_eq!(first["structuredContent"]["amount_cents"], 900, "{first}");
    let again = inspector(&node, dir.path(), &server, &call);
    assert_eq!(ledger(&again)["replayed"], true, "{again}");
    assert_eq!(again["structuredContent"], first["structuredContent"]);
    assert_eq!(charges(&cdb), 1, "one charge for two Inspector runs");

    // An effect an operator confirmed: the Inspector takes the answer every retry gets.
    let config = dir.path().join("proxy.toml");
    std::fs::write(&config, "[tools.slow]\ncall_timeout_seconds = 1\n").unwrap();
    let mut timed = server.clone();
    let at = timed["args"]
        .as_array()
        .unwrap()
        .iter()
        .position(|a| a == "--")
        .unwrap();
    let args = timed["args"].as_array_mut().unwrap();
    args.insert(at, json!(config.display().to_string()));
    args.insert(at, json!("--config"));
    let slow = json!({"seconds": 2.5, "operation_id": "insp-slow"}).to_string();
    let call = [
        "--method",
        "tools/call",
        "--tool-name",
        "slow",
        "--tool-args-json",
        &slow,
    ];
    let lost = inspector(&node, dir.path(), &timed, &call);
    assert!(lost.to_string().contains("outcome_unknown"), "{lost}");
    let status_ref = ledger(&lost)["statusRef"].as_str().unwrap().to_string();
    add_principal(&db, "olga", "acme", &["operator"], &[], false);
    let resolved = toolledger()
        .args(["resolve", "--status-ref", &status_ref, "--as", "succeeded"])
        .args([
            "--reason",
            "the upstream's log shows it",
            "--operator",
            "olga",
        ])
        .args(["--evidence", r#"{"log_line": "slept 2.5s"}"#])
        .args(db.store_args())
        .envs(db.key_env())
        .output()
        .unwrap();
    assert!(resolved.status.success(), "{resolved:?}");
    let confirmed = inspector(&node, dir.path(), &timed, &call);
    assert_eq!(confirmed["isError"], true, "{confirmed}");
    assert!(
        confirmed.to_string().contains("effect_confirmed"),
        "{confirmed}"
    );
    assert_eq!(
        confirmed["_meta"]["io.toolledger/confirmed"]["by"], "operator",
        "{confirmed}"
    );
}

/// server-everything's `simulate-research-query` declares `execution.taskSupport: "required"`
/// (a plain `tools/call` of it can only fail), which rmcp's tool type does not keep: the proxy
/// reads it from the upstream's own answers, over stdio and over HTTP, passes the tool through
/// unguarded and says why at start.
fn a_tool_that_requires_tasks_is_passed_through(db: Db) {
    let Some((py, node)) = interpreters() else {
        return;
    };
    let everything = server_everything().display().to_string();
    let port = free_port();
    let mut http_upstream = Command::new(&node)
        .args([everything.as_str(), "streamableHttp"])
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    support::clients::wait_listening(port, "server-everything");
    let url = format!("http://127.0.0.1:{port}/mcp");
    let stdio = vec![
        node.display().to_string(),
        everything.clone(),
        "stdio".into(),
    ];
    let over_http = proxy_server(&db, &[], &[]);
    let mut over_http_args: Vec<Value> = over_http["args"].as_array().unwrap().clone();
    // `… --principal alice --` → `… --principal alice --upstream-url URL`.
    over_http_args.pop();
    over_http_args.extend([json!("--upstream-url"), json!(url)]);
    let mut over_http = over_http.clone();
    over_http["args"] = json!(over_http_args);
    for (upstream, server) in [
        ("stdio", proxy_server(&db, &stdio, &[])),
        ("http", over_http),
    ] {
        let spec = json!({"transport": "stdio", "server": server, "lifecycle": "legacy",
                          "list_tools": true, "calls": []});
        let lines = drive(Driver::PyClient, &spec, &py, &node);
        let listed = tools(&lines);
        let schema = |n: &str| {
            listed
                .iter()
                .find(|t| t["name"] == n)
                .unwrap_or_else(|| panic!("{upstream}: {n} not listed: {listed:?}"))["inputSchema"]
                .clone()
        };
        assert!(
            schema("simulate-research-query")["properties"]
                .get("operation_id")
                .is_none(),
            "{upstream}: a tool that requires tasks is not guarded"
        );
        assert!(
            schema("toggle-simulated-logging")["properties"]
                .get("operation_id")
                .is_some(),
            "{upstream}: the other tools are guarded as before"
        );
        // The start-up warning names the tool and the reason.
        let args: Vec<String> = server["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let mut proxy = toolledger()
            .args(&args)
            .envs(db.key_env())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(proxy.stderr.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let warning = stderr.lines().map_while(Result::ok).find(|l| {
                l.contains("simulate-research-query") && l.contains("requires task execution")
            });
            let _ = tx.send(warning);
        });
        let warned = rx.recv_timeout(Duration::from_secs(60)).ok().flatten();
        let _ = proxy.kill();
        let _ = proxy.wait();
        assert!(warned.is_some(), "{upstream}: no start-up warning");
    }
    let _ = http_upstream.kill();
    let _ = http_upstream.wait();
}

on_both_backends!(
    a_tool_that_requires_tasks_is_passed_through,
    the_inspector_lists_and_calls_through_the_proxy,
    server_everything_through_the_proxy,
    sdk_clients_replay_through_the_proxy,
    an_http_upstream,
);
