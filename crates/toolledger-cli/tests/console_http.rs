//! The console's pages mounted on `serve --http --console` (beside `/mcp`, under the same
//! Host/Origin rules, outside the bearer layer of `/mcp`; `--console` needs `--http`), and
//! `proxy --http --console` likewise, and `toolledger console` on its own (health endpoints, an
//! existing ledger only).

#[macro_use]
mod support;
#[path = "support/raw.rs"]
mod raw;

use raw::RawHttp;
use support::wire::*;
use toolledger_testkit::stdio::wait_listening;

fn the_console_is_served_beside_mcp(db: Db) {
    let plain = RawHttp::start(&db, &[], &[]);
    assert_eq!(plain.request("GET", "/console/login", &[], b"").status, 404);
    drop(plain);

    let s = RawHttp::start(&db, &["--console"], &[]);
    let login = s.request("GET", "/console/login", &[], b"");
    assert_eq!(login.status, 200, "{}", login.body);
    assert!(login.body.contains("name=\"csrf\""));
    let cookie = login.header("set-cookie").unwrap();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    // Without a session the list leads to the login form; no bearer token is asked for.
    let list = s.request("GET", "/console", &[], b"");
    assert_eq!(list.status, 303);
    assert_eq!(list.header("location"), Some("/console/login"));
    // The servers' Host and Origin rules hold for the console too.
    let foreign = s.request("GET", "/console/login", &[("Host", "evil.example")], b"");
    assert_eq!(foreign.status, 403);
    let cross = s.request(
        "POST",
        "/console/login",
        &[("Origin", "http://evil.example")],
        b"",
    );
    assert_eq!(cross.status, 403);
    // `/mcp` still wants its bearer token.
    assert_eq!(s.post(&[], b"{}").status, 401);
}

on_both_backends!(
    the_console_is_served_beside_mcp,
    the_console_runs_on_its_own,
    a_standalone_console_shows_a_proxied_operation
);

#[test]
fn console_needs_http() {
    let db = Db::sqlite();
    let out = serve_command(&db, &["--console".to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// `toolledger console` on its own: health endpoints for any host, `/` leads to the console.
fn the_console_runs_on_its_own(db: Db) {
    use std::io::{Read, Write};
    let mut child = std::process::Command::new(support::bin())
        .arg("console")
        .args(["--http", "127.0.0.1:0"])
        .args(db.store_args())
        .envs(db.key_env())
        .env_remove("TOOLLEDGER_ALLOWED_HOSTS")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (url, _) = wait_listening(child.stderr.take().unwrap());
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/console")
        .to_string();
    let get = |path: &str, host: &str| {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).unwrap();
        r
    };
    assert!(get("/healthz", "10.0.0.7").starts_with("HTTP/1.1 200"));
    assert!(get("/readyz", "10.0.0.7").starts_with("HTTP/1.1 200"));
    let root = get("/", &addr);
    assert!(root.starts_with("HTTP/1.1 303"), "{root}");
    assert!(root.contains("location: /console"), "{root}");
    assert!(get("/console/login", &addr).starts_with("HTTP/1.1 200"));
    assert!(get("/console/login", "evil.example").starts_with("HTTP/1.1 403"));
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn the_console_refuses_a_missing_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("absent.sqlite");
    let out = support::toolledger()
        .args(["console", "--http", "127.0.0.1:0", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(!db.exists(), "no ledger is created");
}

/// `proxy --http --console` serves the pages beside the proxied `/mcp`.
#[test]
fn the_proxy_serves_the_console_too() {
    use std::io::{Read, Write};
    let db = Db::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let charges = dir.path().join("charges.sqlite");
    let mut child = std::process::Command::new(support::bin())
        .arg("proxy")
        .args(db.store_args())
        .args(["--http", "127.0.0.1:0", "--console", "--"])
        .arg(support::bin())
        .args(["upstream-example", "--db"])
        .arg(&charges)
        .env_remove("TOOLLEDGER_ALLOWED_HOSTS")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (url, _) = wait_listening(child.stderr.take().unwrap());
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_string();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "GET /console/login HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("name=\"csrf\""));
    let _ = child.kill();
    let _ = child.wait();
}

/// `toolledger console` on its own, on a ledger a proxy wrote: a proxied operation's page shows
/// its state, events and the ledger's evidence, and says plainly that this console cannot ask
/// the upstream and how the operation is settled instead — never a failed question.
fn a_standalone_console_shows_a_proxied_operation(db: Db) {
    use serde_json::json;
    let olga = add_principal(&db, "olga", "acme", &["operator"], &[], true).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let charges = dir.path().join("charges.sqlite");
    let mut proxy = std::process::Command::new(support::bin());
    proxy
        .arg("proxy")
        .args(db.store_args())
        .args(["--principal", "alice", "--"])
        .arg(support::bin())
        .args(["upstream-example", "--db"])
        .arg(&charges)
        .env_remove("TOOLLEDGER_STATE_KEY_HEX")
        .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
        .envs(db.key_env());
    let mut proxy = Server::spawn(proxy);
    let charged = proxy.call(
        "charge",
        json!({"customer": "c-1", "amount_cents": 250, "operation_id": "console-1"}),
    );
    assert_eq!(charged["isError"], false, "{charged}");
    assert_eq!(proxy.finish(), 0);
    let rows = db.pairs("SELECT status_ref, state FROM operations");
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (status_ref, state) = rows[0].clone();

    let mut child = std::process::Command::new(support::bin())
        .arg("console")
        .args(["--http", "127.0.0.1:0"])
        .args(db.store_args())
        .envs(db.key_env())
        .env_remove("TOOLLEDGER_ALLOWED_HOSTS")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (url, _) = wait_listening(child.stderr.take().unwrap());
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/console")
        .to_string();
    let request = |method: &str, path: &str, headers: &[(&str, &str)], body: &str| {
        raw::exchange(&addr, method, path, headers, body.as_bytes()).expect("an answer")
    };
    // Sign in as the operator.
    let session = raw::console_sign_in(&addr, &olga);

    let page = request(
        "GET",
        &format!("/console/operations/{status_ref}"),
        &[("Cookie", &session)],
        "",
    );
    assert_eq!(page.status, 200, "{}", page.body);
    // What the ledger holds is shown: the state, the events, the ledger's own evidence.
    assert!(
        page.body.contains(&format!("class=\"state {state}\"")),
        "{}",
        page.body
    );
    assert!(page.body.contains("id=\"events\""), "{}", page.body);
    assert!(page.body.contains("Evidence: intent and local receipt"));
    // What needs the proxy is said plainly; no question to a downstream this console lacks.
    assert!(
        page.body.contains("id=\"downstream-elsewhere\""),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("Recorded by `toolledger proxy`: this console cannot ask the upstream"),
        "{}",
        page.body
    );
    assert!(!page.body.contains("could not be asked"), "{}", page.body);
    assert!(!page.body.contains("unknown tool"), "{}", page.body);
    let _ = child.kill();
    let _ = child.wait();
}
