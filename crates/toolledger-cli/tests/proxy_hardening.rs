//! `toolledger proxy` probed as an attacker, and by a caller that goes away, in front of the
//! official Python SDK's charge server (`tests/proxy/charge_server.py`):
//!
//! - a caller's HTTP connection dropped while the upstream works does not abandon the
//!   forward: the answer is recorded and the retry replays it (one effect);
//! - a tool's required scopes hold on every route: a tool the upstream marks read-only is
//!   passed through, and still refused to a caller without the scope;
//! - what goes upstream is derived from the whole scope: two tenants' `order-42` are two keys
//!   to an upstream that deduplicates on its idempotency key, and one tenant never gets the
//!   other's result;
//! - a stdio upstream never sees the ledger's secrets in its environment, and gets what
//!   `--upstream-env` and `[upstream_env]` say;
//! - an upstream that never completes its handshake is given up after the start deadline,
//!   with an error naming its command, and a client that closes stdin while the upstream
//!   starts is not waited for.

#![cfg(unix)]

#[macro_use]
mod support;
#[path = "support/raw.rs"]
mod raw;

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use raw::exchange;
use serde_json::{json, Value};
use support::clients::{proxy_fixture, python};
use support::wire::{add_principal, meta, Db, Ledger};
use toolledger_testkit::kill::{free_port, Killed};
use toolledger_testkit::stdio::wait_listening;

on_both_backends!(
    a_dropped_connection_does_not_abandon_the_forward,
    scopes_hold_on_passed_through_tools,
    two_tenants_keys_never_meet_upstream,
);

/// A `proxy --http` in front of the charge server, with its files.
struct HttpProxy {
    _proxy: Killed,
    addr: String,
    charges: PathBuf,
    _dir: tempfile::TempDir,
}

impl HttpProxy {
    /// Starts the proxy on `db` with the configuration `config` (TOML), the charge server
    /// answering `delay_ms` after each charge commits, with `env` for it.
    fn start(db: &Db, config: &str, delay_ms: u64, env: &[(&str, &str)]) -> Option<HttpProxy> {
        let python = python()?;
        let dir = tempfile::tempdir().unwrap();
        let config_file = dir.path().join("proxy.toml");
        std::fs::write(&config_file, config).unwrap();
        let charges = dir.path().join("charges.sqlite");
        let addr = format!("127.0.0.1:{}", free_port());
        let mut proxy = Killed(
            Command::new(support::BIN)
                .arg("proxy")
                .args(db.store_args())
                .args(["--config", config_file.to_str().unwrap(), "--http", &addr])
                .arg("--")
                .arg(&python)
                .arg(proxy_fixture("charge_server.py"))
                .env_remove("TOOLLEDGER_STATE_KEY_HEX")
                .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
                .env_remove("TOOLLEDGER_ALLOWED_HOSTS")
                .envs(db.key_env())
                .env("CHARGE_DB", &charges)
                .env("CHARGE_DELAY_MS", delay_ms.to_string())
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        wait_listening(proxy.0.stderr.take().unwrap());
        Some(HttpProxy {
            _proxy: proxy,
            addr,
            charges,
            _dir: dir,
        })
    }

    /// The HTTP request of a 2026-07-28 `tools/call` of `name` as `token`.
    fn request(&self, token: &str, name: &str, arguments: Value) -> Vec<u8> {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "_meta": meta()}})
        .to_string();
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
             Authorization: Bearer {token}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
             Mcp-Method: tools/call\r\nMcp-Name: {name}\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .into_bytes()
    }

    /// A call's tool result.
    fn call(&self, token: &str, name: &str, arguments: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "_meta": meta()}});
        let auth = format!("Bearer {token}");
        let r = exchange(
            &self.addr,
            "POST",
            "/mcp",
            &[
                ("Authorization", auth.as_str()),
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
                ("MCP-Protocol-Version", "2026-07-28"),
                ("Mcp-Method", "tools/call"),
                ("Mcp-Name", name),
            ],
            body.to_string().as_bytes(),
        )
        .expect("an HTTP answer");
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["result"].clone()
    }

    /// `(customer, amount_cents, idempotency_key)` of every charge row.
    fn charges(&self) -> Vec<(String, i64, Option<String>)> {
        if !self.charges.exists() {
            return Vec::new();
        }
        let conn = rusqlite::Connection::open(&self.charges).unwrap();
        let mut s = conn
            .prepare("SELECT customer, amount_cents, reference FROM charges ORDER BY id")
            .unwrap();
        s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map(|rows| rows.collect::<Result<_, _>>().unwrap())
            .unwrap_or_default()
    }
}

fn error_code(result: &Value) -> Value {
    assert_eq!(result["isError"], true, "not an error result: {result}");
    let text = result["content"][0]["text"].as_str().unwrap();
    serde_json::from_str::<Value>(text).unwrap()["error"]["code"].clone()
}

/// Over `proxy --http`, the caller's connection closes 0.3 s after the upstream charged and
/// before it answers (2 s after its commit). The forward runs to its end: the retry replays
/// the recorded answer, one charge, nothing unsure.
fn a_dropped_connection_does_not_abandon_the_forward(db: Db) {
    let token = add_principal(&db, "hank", "acme", &["editor"], &[], true).unwrap();
    let Some(p) = HttpProxy::start(&db, "", 2_000, &[]) else {
        return;
    };
    let args = json!({"customer": "c-1", "amount_cents": 700, "operation_id": "op-drop"});
    let mut socket = TcpStream::connect(&p.addr).unwrap();
    socket
        .write_all(&p.request(&token, "charge", args.clone()))
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while p.charges().is_empty() {
        assert!(Instant::now() < until, "the upstream never charged");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    socket.shutdown(std::net::Shutdown::Both).unwrap();
    drop(socket);
    std::thread::sleep(Duration::from_millis(3_000));
    let retry = p.call(&token, "charge", args);
    assert_eq!(retry["isError"], false, "the answer was recorded: {retry}");
    let ledger = &retry["_meta"]["io.toolledger/ledger"];
    assert_eq!(ledger["replayed"], true, "{retry}");
    assert_eq!(ledger["state"], "succeeded", "{retry}");
    assert_eq!(retry["structuredContent"]["amount_cents"], 700, "{retry}");
    assert_eq!(p.charges().len(), 1, "one charge");
}

/// `required_scopes` on tools the upstream marks read-only (passed through) and on a guarded
/// one: a caller without the scope gets the same refusal on every route (`not_found`, as for
/// a tool it may not see) and nothing reaches the upstream; a caller with it is served.
fn scopes_hold_on_passed_through_tools(db: Db) {
    let bob = add_principal(&db, "bo", "acme", &["editor"], &[], true).unwrap();
    let pat = add_principal(
        &db,
        "pat",
        "acme",
        &["editor"],
        &["payments:read", "payments:write"],
        true,
    )
    .unwrap();
    let config = r#"
        [tools.find_charge]
        required_scopes = ["payments:read"]
        [tools.count_charges]
        required_scopes = ["payments:read"]
        [tools.charge]
        required_scopes = ["payments:write"]
    "#;
    let Some(p) = HttpProxy::start(&db, config, 0, &[]) else {
        return;
    };
    let find = json!({"reference": "r-1"});
    let count = json!({});
    let charge = json!({"customer": "c-1", "amount_cents": 5, "operation_id": "op-s"});
    for (name, args) in [
        ("find_charge", &find),
        ("count_charges", &count),
        ("charge", &charge),
    ] {
        let refused = p.call(&bob, name, args.clone());
        assert_eq!(error_code(&refused), "not_found", "{name}: {refused}");
    }
    assert!(p.charges().is_empty(), "nothing reached the upstream");
    let counted = p.call(&pat, "count_charges", count);
    assert_eq!(counted["isError"], false, "{counted}");
    assert_eq!(counted["structuredContent"]["count"], 0, "{counted}");
    let charged = p.call(&pat, "charge", charge);
    assert_eq!(charged["isError"], false, "{charged}");
}

/// An upstream that deduplicates on its idempotency key (as payment APIs do), the operation id
/// forwarded as that key: tenant beta's `order-42` for 1 cent, then tenant acme's `order-42`
/// for 5000. Two charges, each tenant its own; neither key upstream is the raw id.
fn two_tenants_keys_never_meet_upstream(db: Db) {
    let bea = add_principal(&db, "bea", "beta", &["editor"], &[], true).unwrap();
    let ann = add_principal(&db, "ann", "acme", &["editor"], &[], true).unwrap();
    let config = "[tools.charge]\nforward_operation_id = \"idempotency_key\"\n";
    let Some(p) = HttpProxy::start(&db, config, 0, &[("CHARGE_DEDUPLICATE", "1")]) else {
        return;
    };
    let b = p.call(
        &bea,
        "charge",
        json!({"customer": "c-b", "amount_cents": 1, "operation_id": "order-42"}),
    );
    assert_eq!(b["isError"], false, "{b}");
    let a = p.call(
        &ann,
        "charge",
        json!({"customer": "c-a", "amount_cents": 5000, "operation_id": "order-42"}),
    );
    assert_eq!(a["isError"], false, "{a}");
    assert_eq!(
        a["structuredContent"]["amount_cents"], 5000,
        "acme's own charge, not beta's: {a}"
    );
    assert_eq!(a["structuredContent"]["customer"], "c-a", "{a}");
    let rows = p.charges();
    let expected = vec![
        (
            "c-b".to_string(),
            1,
            Some(support::wire::upstream_key(
                "beta", "bea", "charge", "order-42",
            )),
        ),
        (
            "c-a".to_string(),
            5000,
            Some(support::wire::upstream_key(
                "acme", "ann", "charge", "order-42",
            )),
        ),
    ];
    assert_eq!(rows, expected, "two charges under two upstream keys");
    // The same key again is each tenant's own replay, and the upstream deduplicates a
    // forward it was already sent (here: none).
    let again = p.call(
        &ann,
        "charge",
        json!({"customer": "c-a", "amount_cents": 5000, "operation_id": "order-42"}),
    );
    assert_eq!(again["_meta"]["io.toolledger/ledger"]["replayed"], true);
    assert_eq!(p.charges().len(), 2);
}

/// The proxy's command in front of `sh -c SCRIPT` (the script ends by starting the charge
/// server) on a fresh SQLite ledger, as the local principal.
fn stdio_proxy(dir: &Path, flags: &[&str], script: &str) -> Command {
    let mut c = Command::new(support::BIN);
    c.arg("proxy")
        .args(["--db", dir.join("ledger.sqlite").to_str().unwrap()])
        .args(flags)
        .args(["--", "sh", "-c", script])
        .env("CHARGE_DB", dir.join("charges.sqlite"));
    c
}

/// A stdio upstream's environment: the ledger's keys and database URL are not in it, the
/// variables `--upstream-env` and `[upstream_env]` set are, and those removed are not.
#[test]
fn the_upstream_never_sees_the_ledgers_secrets() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("env.txt");
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        "upstream_env_remove = [\"TL_TEST_DROPPED\"]\n[upstream_env]\nTL_FROM_CONFIG = \"${TL_TEST_SOURCE}-x\"\n",
    )
    .unwrap();
    let script = format!(
        "env > '{}'; exec '{}' '{}'",
        dump.display(),
        python.display(),
        proxy_fixture("charge_server.py").display()
    );
    let secret_state = "aa".repeat(32);
    let secret_fingerprint = "bb".repeat(32);
    let mut c = stdio_proxy(
        dir.path(),
        &[
            "--config",
            config.to_str().unwrap(),
            "--upstream-env",
            "TL_FROM_FLAG=flag-value",
            "--upstream-env-remove",
            "TL_TEST_DROPPED_TOO",
        ],
        &script,
    );
    c.env("TOOLLEDGER_STATE_KEY_HEX", &secret_state)
        .env("TOOLLEDGER_FINGERPRINT_KEY_HEX", &secret_fingerprint)
        .env("TL_TEST_SOURCE", "from-env")
        .env("TL_TEST_DROPPED", "dropped-1")
        .env("TL_TEST_DROPPED_TOO", "dropped-2")
        .env("TL_TEST_KEPT", "kept-1");
    let mut p = toolledger_testkit::stdio::Server::spawn(c);
    let counted = p.call("count_charges", json!({}));
    assert_eq!(counted["isError"], false, "{counted}");
    let env = std::fs::read_to_string(&dump).unwrap();
    for secret in [
        secret_state.as_str(),
        secret_fingerprint.as_str(),
        "TOOLLEDGER_STATE_KEY_HEX",
        "TOOLLEDGER_FINGERPRINT_KEY_HEX",
        "dropped-1",
        "dropped-2",
    ] {
        assert!(!env.contains(secret), "{secret} reached the upstream");
    }
    for present in [
        "TL_TEST_KEPT=kept-1",
        "TL_FROM_FLAG=flag-value",
        "TL_FROM_CONFIG=from-env-x",
    ] {
        assert!(env.lines().any(|l| l == present), "{present} is missing");
    }
}

/// The last JSON line of a failed command's stderr.
fn failure(stderr: &[u8]) -> Value {
    let text = String::from_utf8_lossy(stderr);
    serde_json::from_str(text.lines().last().unwrap_or("")).unwrap_or(Value::Null)
}

/// An upstream that never answers the handshake is given up after `--upstream-start-timeout`:
/// `UPSTREAM_UNAVAILABLE` naming its command (not its directory), and no word of a call.
#[test]
fn an_upstream_that_never_starts_is_given_up_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (reader, _writer) = std::os::unix::net::UnixStream::pair().unwrap();
    let out = stdio_proxy(
        dir.path(),
        &["--upstream-start-timeout", "2"],
        "exec /bin/sleep 1000",
    )
    .stdin(Stdio::from(std::os::fd::OwnedFd::from(reader)))
    .output()
    .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the proxy gave up"
    );
    assert_eq!(out.status.code(), Some(2));
    let err = failure(&out.stderr);
    assert_eq!(err["error"]["code"], "UPSTREAM_UNAVAILABLE", "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("`sh`"), "names the command: {message}");
    assert!(message.contains("2 s"), "names the deadline: {message}");
    assert!(!message.contains("call was not sent"), "{message}");
    // A command that cannot be started at all is named without its directory.
    let out = Command::new(support::BIN)
        .arg("proxy")
        .args(["--db", dir.path().join("ledger.sqlite").to_str().unwrap()])
        .args(["--", "/nonexistent/dir/upstream-x"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = failure(&out.stderr);
    assert_eq!(err["error"]["code"], "UPSTREAM_UNAVAILABLE", "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("`upstream-x`"), "{message}");
    assert!(!message.contains("/nonexistent"), "{message}");
    assert!(!message.contains("call was not sent"), "{message}");
}

/// A client that closes the proxy's stdin while the upstream is still starting is not waited
/// for: the proxy stops its upstream and exits at once, long before the start deadline.
#[test]
fn a_client_that_goes_away_during_the_start_is_not_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("upstream.pid");
    let script = format!("echo $$ > '{}'; exec /bin/sleep 1000", mark.display());
    let mut child = stdio_proxy(dir.path(), &["--upstream-start-timeout", "600"], &script)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while !mark.exists() {
        assert!(Instant::now() < until, "the upstream never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let closed = Instant::now();
    drop(child.stdin.take());
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("the proxy kept waiting for its upstream after its client left");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        closed.elapsed() < Duration::from_secs(20),
        "{status:?} after {:?}",
        closed.elapsed()
    );
    // The upstream is gone with it.
    let pid: i32 = std::fs::read_to_string(&mark)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(15);
    // SAFETY: signal 0 only asks whether the process exists.
    while unsafe { libc::kill(pid, 0) } == 0 {
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true);
        if zombie {
            break;
        }
        assert!(Instant::now() < until, "the upstream still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A proxy whose HTTP upstream cannot be reached logs and answers in its own words: no line of
/// its whole log — its own, rmcp's or reqwest's, at the default level or at `trace` — shows
/// the URL's password or query values or the header's token, and the default log and the error
/// name no internal type.
#[test]
fn a_failing_start_shows_no_secret_and_no_internal_name() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    for level in ["", "trace"] {
        let out = Command::new(support::BIN)
            .arg("proxy")
            .args(["--db", dir.path().join("ledger.sqlite").to_str().unwrap()])
            .args([
                "--upstream-url",
                &format!("http://user:pw-secret-1@127.0.0.1:{port}/mcp?key=query-secret-2&v=1"),
                "--upstream-header",
                "Authorization: Bearer header-secret-3",
                "--upstream-header",
                "X-Api-Key: header-secret-4",
            ])
            .env("RUST_LOG", level)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for secret in [
            "pw-secret-1",
            "query-secret-2",
            "header-secret-3",
            "header-secret-4",
        ] {
            assert!(!all.contains(secret), "RUST_LOG={level}: {secret} in {all}");
        }
        let err = failure(&out.stderr);
        assert_eq!(err["error"]["code"], "UPSTREAM_UNAVAILABLE", "{err}");
        if level.is_empty() {
            for internal in ["rmcp::transport", "reqwest::", "Transport [", "hyper_util"] {
                assert!(!all.contains(internal), "{internal} in {all}");
            }
            let message = err["error"]["message"].as_str().unwrap();
            assert!(message.contains("no connection could be made"), "{message}");
        }
    }
}

/// The proxy's peak resident memory (`VmHWM`), in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// An upstream that lists without end — endless pages, too many tools, definitions too large
/// — is refused at start with a clear error naming the limit; one with 2,000 tools is served
/// in bounded memory (the tool table is linear); one that floods its stderr without a newline
/// is logged truncated, in bounded memory, and still served.
#[test]
fn a_hostile_upstream_cannot_grow_the_proxys_memory() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hostile = proxy_fixture("hostile_upstream.py");
    let proxy = |mode: &str, extra: &[(&str, &str)]| {
        let mut c = Command::new(support::BIN);
        c.arg("proxy")
            .args(["--db", dir.path().join("ledger.sqlite").to_str().unwrap()])
            .arg("--")
            .arg(&python)
            .arg(&hostile)
            .env("HOSTILE_MODE", mode)
            .envs(extra.iter().copied());
        c
    };
    for (mode, limit) in [
        ("endless_pages", "more than 50 pages"),
        ("many_tools", "more than 2000 tools"),
        ("fat_tools", "exceed 32 MiB"),
    ] {
        let out = proxy(mode, &[]).stdin(Stdio::null()).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{mode}");
        let err = failure(&out.stderr);
        assert_eq!(
            err["error"]["code"], "UPSTREAM_UNAVAILABLE",
            "{mode}: {err}"
        );
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains(limit), "{mode}: {message}");
    }

    let mut p =
        toolledger_testkit::stdio::Server::spawn(proxy("tools", &[("HOSTILE_TOOLS", "2000")]));
    p.send(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta()}}),
    );
    let listed = p.recv();
    assert_eq!(
        listed["result"]["tools"].as_array().map(Vec::len),
        Some(2001),
        "the 2,000 tools and get_operation_status"
    );
    let peak = peak_kib(p.pid());
    assert!(peak < 200 * 1024, "2,000 tools took {peak} KiB");
    drop(p);

    let log = dir.path().join("flood.log");
    let mut p = toolledger_testkit::stdio::Server::spawn_with_stderr(
        proxy("stderr_flood", &[("HOSTILE_STDERR_MB", "200")]),
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    let pong = p.call("ping", json!({}));
    assert_eq!(pong["structuredContent"]["pong"], true, "{pong}");
    let peak = peak_kib(p.pid());
    assert!(peak < 150 * 1024, "a 200 MiB stderr line took {peak} KiB");
    let until = Instant::now() + Duration::from_secs(30);
    let logged = loop {
        let logged = std::fs::read_to_string(&log).unwrap();
        if logged.contains("truncated_bytes=209707008") || Instant::now() > until {
            break logged;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(p);
    assert!(
        logged.contains("truncated_bytes=209707008"),
        "the truncation is logged with the bytes dropped"
    );
    assert!(
        logged.len() < 1 << 20,
        "the log holds the line's first bytes only"
    );
}

/// The Python SDK's `Client` (the `initialize` lifecycle) with `extra` spec members, driving a
/// stdio proxy on a fresh ledger in `dir` in front of `node UPSTREAM_ARGS…`.
fn through_stdio_proxy(
    dir: &Path,
    node: &Path,
    upstream: &[String],
    calls: Value,
    extra: Value,
) -> Vec<Value> {
    let python = python().expect("python");
    let mut args = vec![
        "proxy".to_string(),
        "--db".into(),
        dir.join("ledger.sqlite").display().to_string(),
        "--".into(),
        node.display().to_string(),
    ];
    args.extend(upstream.iter().cloned());
    let mut spec = json!({"transport": "stdio", "lifecycle": "legacy", "api": "client",
        "calls": calls,
        "server": {"command": support::BIN, "args": args,
                   "env": {"PATH": std::env::var("PATH").unwrap_or_default()}}});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    let mut driver = Command::new(python);
    driver.arg(proxy_fixture("py_client.py"));
    support::clients::run_driver(driver, &spec)
}

/// `@modelcontextprotocol/server-filesystem` started without directories takes its allowed
/// directories from its client's roots. Behind a stdio proxy, the client's roots reach it: it
/// lists the directory, and a guarded write into it succeeds (and replays).
#[test]
fn the_clients_roots_reach_the_upstream() {
    let (Some(_), Some(node)) = (python(), support::clients::node()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("work");
    std::fs::create_dir(&root).unwrap();
    let root = root.canonicalize().unwrap();
    let file = root.join("note.txt");
    let write = json!({"path": file, "content": "hello", "operation_id": "w-1"});
    let lines = through_stdio_proxy(
        dir.path(),
        &node,
        &[support::clients::server_filesystem().display().to_string()],
        // The upstream takes the roots in when it is told they changed, which races with
        // the first call: the directory listing is asked again until it shows them (as an
        // agent polls); without the relay it never does.
        json!([
            {"name": "list_allowed_directories", "arguments": {},
             "until": root.display().to_string()},
            {"name": "write_file", "arguments": write},
            {"name": "write_file", "arguments": write},
        ]),
        json!({"roots": [format!("file://{}", root.display())]}),
    );
    assert!(
        lines.iter().any(|l| l.get("roots_asked").is_some()),
        "the upstream asked the client for its roots: {lines:?}"
    );
    let allowed = support::clients::driver_result(&lines, 0);
    assert!(
        allowed.to_string().contains(&root.display().to_string()),
        "{allowed}"
    );
    let written = support::clients::driver_result(&lines, 1);
    assert_ne!(written["isError"], true, "{written}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "hello");
    let again = support::clients::driver_result(&lines, 2);
    assert_eq!(
        again["_meta"]["io.toolledger/ledger"]["replayed"], true,
        "{again}"
    );
}

/// `@modelcontextprotocol/server-everything`'s `trigger-sampling-request` (a guarded tool)
/// asks its client for an LLM sample during the call: behind a stdio proxy the request reaches
/// the proxy's client, whose answer comes back in the tool's result, recorded and replayed.
#[test]
fn the_upstreams_sampling_request_reaches_the_client() {
    let (Some(_), Some(node)) = (python(), support::clients::node()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let call = json!({"name": "trigger-sampling-request",
        "arguments": {"prompt": "say hi", "maxTokens": 5, "operation_id": "s-1"}});
    let lines = through_stdio_proxy(
        dir.path(),
        &node,
        &[
            support::clients::server_everything().display().to_string(),
            "stdio".into(),
        ],
        json!([call, call]),
        json!({"sampling": "sampled-by-the-client"}),
    );
    let first = support::clients::driver_result(&lines, 0);
    assert_ne!(first["isError"], true, "{first}");
    assert!(
        first.to_string().contains("sampled-by-the-client"),
        "{first}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.get("sampled").is_some()).count(),
        1,
        "sampled once: the retry replays: {lines:?}"
    );
    let again = support::clients::driver_result(&lines, 1);
    assert_eq!(
        again["_meta"]["io.toolledger/ledger"]["replayed"], true,
        "{again}"
    );
}

/// An upstream that requires task execution for a tool cannot pass it through unguarded when
/// the configuration guards it: the proxy refuses to start, naming the tool. Not configured,
/// the tool passes through (as documented), its scopes still checked.
#[test]
fn a_configured_guard_is_never_downgraded_by_the_upstream() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.toml");
    std::fs::write(&config, "[tools.pay]\nguarded = true\n").unwrap();
    let out = Command::new(support::BIN)
        .arg("proxy")
        .args(["--db", dir.path().join("ledger.sqlite").to_str().unwrap()])
        .args(["--config", config.to_str().unwrap(), "--"])
        .arg(&python)
        .arg(proxy_fixture("hostile_upstream.py"))
        .env("HOSTILE_MODE", "task_required")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = failure(&out.stderr);
    assert_eq!(err["error"]["code"], "CONFIG_INVALID", "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("tools.pay"), "{message}");
    assert!(message.contains("taskSupport"), "{message}");
    let mut p = toolledger_testkit::stdio::Server::spawn({
        let mut c = Command::new(support::BIN);
        c.arg("proxy")
            .args(["--db", dir.path().join("ledger.sqlite").to_str().unwrap()])
            .arg("--")
            .arg(&python)
            .arg(proxy_fixture("hostile_upstream.py"))
            .env("HOSTILE_MODE", "task_required");
        c
    });
    p.send(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta()}}),
    );
    let listed = p.recv();
    let pay = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "pay")
        .cloned()
        .unwrap();
    assert!(
        pay["inputSchema"]["properties"]
            .get("operation_id")
            .is_none(),
        "not configured, a task-required tool passes through: {pay}"
    );
}
