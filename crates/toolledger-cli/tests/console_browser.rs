//! The operator console in a real headless browser (Debian's `chromium` driven over
//! WebDriver by `chromedriver`): a refund made over MCP whose payments call failed is
//! `outcome_unknown`; an operator signs in with a bearer token, finds it in the list, opens its
//! timeline, is refused "succeeded" (the payments service holds no receipt), resolves it as
//! failed with a reason, and it leaves the list; the ledger holds it `failed`. A CSRF-less POST
//! and a non-operator's forged POST are refused and change nothing; a tool name and a reason
//! containing `<script>` are shown as text. Screenshots of the three pages are saved under
//! `target/console-screenshots/`.
//!
//! Without `/usr/bin/chromium` and `/usr/bin/chromedriver` the test skips with one loud line,
//! and fails under `TOOLLEDGER_CI`.

#[macro_use]
mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use support::wire::*;
use toolledger::effect::EffectTx;
use toolledger::engine::{Begun, Engine, InlineEffect};
use toolledger::{Error, OperationState, Principal};
use toolledger_testkit::kill::{free_port, Killed};
use toolledger_testkit::reference::add_order;
use toolledger_testkit::stdio::wait_listening;

on_both_backends!(an_operator_settles_a_lost_refund_in_the_browser);

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const XSS_TOOL: &str = "<script>alert('tool')</script>";
const REASON: &str = "payments dashboard shows no refund <script>alert('reason')</script>";

/// Whether the browser is here; skips loudly, or fails in CI, when it is not.
fn browser_present() -> bool {
    if Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists() {
        return true;
    }
    toolledger_testkit::machine::skip(&format!(
        "console browser test: {CHROMIUM} or {CHROMEDRIVER} is missing \
         (apt-get install chromium chromium-driver)"
    ));
    false
}

/// Waits until something accepts connections on `port` (at most 30 s).
fn wait_for_port(port: u16) {
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "nothing listens on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `toolledger console` on the test ledger, its clock an hour ahead (past the lease the failed
/// delivery left); returns the process and its base URL.
fn start_console(db: &Db) -> (Killed, String) {
    let later = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    let mut child = Command::new(bin())
        .arg("console")
        .args(["--http", "127.0.0.1:0"])
        .args(["--clock-epoch", &later.to_string()])
        .args(db.store_args())
        .envs(db.key_env())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (url, _) = wait_listening(child.stderr.take().unwrap());
    let base = url.trim_end_matches("/console").to_string();
    (Killed(child), base)
}

/// One raw HTTP/1.1 request to the console (what a forged form would send); returns the
/// status code and the body.
fn raw_post(base: &str, path: &str, cookie: &str, form: &str) -> (u16, String) {
    let addr = base.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{form}",
        form.len()
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap();
    (status, reply)
}

struct Step;

impl InlineEffect for Step {
    fn apply(&self, _tx: &mut dyn EffectTx, _p: &Principal) -> Result<Value, Error> {
        Ok(json!({"issue": 1}))
    }
}

/// A `partial` inline operation of a tool whose name is markup, by alice.
fn xss_operation(db: &Db) -> String {
    let store = db.store();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let engine = Engine::new(store, Arc::new(toolledger::clock::SystemClock));
            let call = toolledger_testkit::calls::inline_call(
                &toolledger_testkit::calls::principal("acme", "alice"),
                XSS_TOOL,
                "xss-1",
                json!({"title": "t"}),
            );
            let Begun::Started {
                operation_id,
                status_ref,
                ..
            } = engine.begin_steps(call, Arc::new(Step)).await.unwrap()
            else {
                panic!("started")
            };
            engine
                .finish_steps(operation_id, OperationState::Partial, json!({}), vec![])
                .await
                .unwrap();
            status_ref
        })
    })
    .join()
    .unwrap()
}

/// The payments stand-in's file of `db` (the default beside `--db`).
fn downstream_file(db: &Db) -> PathBuf {
    let args = db.store_args();
    let at = args.iter().position(|a| a == "--db").unwrap();
    PathBuf::from(format!("{}.downstream.sqlite", args[at + 1]))
}

/// A refund made over MCP while the payments service fails (its receipts table is away): the
/// call may have reached it, so the operation is `outcome_unknown`. Returns its status_ref.
fn lost_refund(db: &Db) -> String {
    add_principal(db, "ed", "acme", &["approver"], &[], false);
    add_order(&db.store(), "acme", "o-1", "alice", 5000);
    let business = json!({"order_id": "o-1", "amount_cents": 1200});
    let approval = approve(db, "refund_order", "refund-1", &business, &[]);
    let mut s = Server::start(db, "alice", &[]);
    // Answered: the server has opened the payments service's file. Now its receipts table
    // is away, so the refund's delivery fails after it may have reached the service.
    assert_eq!(s.status("refund-1")["state"], "unknown");
    let side = rusqlite::Connection::open(downstream_file(db)).unwrap();
    side.execute_batch("ALTER TABLE downstream_receipts RENAME TO receipts_away")
        .unwrap();
    let reply = s.call(
        "refund_order",
        json!({"idempotency_key": "refund-1", "order_id": "o-1", "amount_cents": 1200,
               "approval": approval}),
    );
    side.execute_batch("ALTER TABLE receipts_away RENAME TO downstream_receipts")
        .unwrap();
    assert_eq!(error_code(&reply), "outcome_unknown", "{reply}");
    assert_eq!(s.finish(), 0);
    let rows = db.pairs("SELECT status_ref, state FROM operations WHERE tool = 'refund_order'");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].1, "outcome_unknown");
    rows[0].0.clone()
}

fn state_of(db: &Db, status_ref: &str) -> String {
    db.pairs(&format!(
        "SELECT status_ref, state FROM operations WHERE status_ref = '{status_ref}'"
    ))[0]
        .1
        .clone()
}

fn screenshots_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let dir = target.join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    std::fs::write(screenshots_dir().join(name), png).unwrap();
}

async fn browser(port: u16, profile: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1200,800",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a chromedriver session")
}

/// Signs in with `token`; lands on the list.
async fn sign_in(c: &Client, base: &str, token: &str) {
    c.goto(&format!("{base}/console")).await.unwrap();
    let field = c.wait().for_element(Locator::Id("token")).await.unwrap();
    field.send_keys(token).await.unwrap();
    c.find(Locator::Id("login"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    if c.wait().for_element(Locator::Id("counts")).await.is_err() {
        panic!(
            "no list after signing in: {} {}",
            c.current_url().await.unwrap(),
            c.source().await.unwrap()
        );
    }
}

/// The session cookie and the CSRF token of the page shown now.
async fn session_of(c: &Client) -> (String, String) {
    let cookie = c
        .get_named_cookie("toolledger_console")
        .await
        .expect("the session cookie");
    assert_eq!(cookie.http_only(), Some(true));
    let csrf = c
        .find(Locator::Css("input[name=csrf]"))
        .await
        .unwrap()
        .attr("value")
        .await
        .unwrap()
        .unwrap();
    (format!("toolledger_console={}", cookie.value()), csrf)
}

async fn drive(db: &Db, base: &str, port: u16, profile: &Path, lost: &str, xss: &str) {
    let olga = add_principal(db, "olga", "acme", &["operator"], &[], true).unwrap();
    let vic = add_principal(db, "vic", "acme", &[], &[], true).unwrap();
    let c = browser(port, profile).await;

    // The operator signs in and sees the lost refund in the list; the markup tool name is
    // text, and the page runs no script.
    sign_in(&c, base, &olga).await;
    let row = c
        .find(Locator::Css(&format!("tr[data-status-ref='{lost}']")))
        .await
        .expect("the outcome_unknown refund is listed");
    assert!(row.text().await.unwrap().contains("refund_order"));
    let tool_cell = c
        .find(Locator::Css(&format!(
            "tr[data-status-ref='{xss}'] td.tool"
        )))
        .await
        .unwrap();
    assert_eq!(tool_cell.text().await.unwrap(), XSS_TOOL);
    let scripts = c
        .execute("return document.scripts.length", vec![])
        .await
        .unwrap();
    assert_eq!(scripts, json!(0));
    let counts = c
        .find(Locator::Id("counts"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(counts.contains("outcome_unknown"), "{counts}");
    screenshot(&c, "list.png").await;

    // A POST without the CSRF token is refused and changes nothing.
    let (olga_cookie, _) = session_of(&c).await;
    let (status, body) = raw_post(
        base,
        &format!("/console/operations/{xss}/resolve"),
        &olga_cookie,
        "as=applied&reason=no+csrf",
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("csrf_invalid"));
    assert_eq!(state_of(db, xss), "partial");

    // Its timeline.
    row.find(Locator::Css("a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let state = c.wait().for_element(Locator::Id("state")).await.unwrap();
    assert_eq!(state.text().await.unwrap(), "outcome_unknown");
    let events = c
        .find(Locator::Id("events"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(events.contains("claimed"), "{events}");
    c.find(Locator::Id("claims"))
        .await
        .expect("the claim, its lease and fencing token");
    // The payments service is asked, at this view, what it holds: nothing.
    let evidence = c
        .find(Locator::Id("downstream-evidence"))
        .await
        .expect("what the downstream holds, shown to the operator")
        .text()
        .await
        .unwrap();
    assert!(evidence.contains("holds no receipt"), "{evidence}");
    screenshot(&c, "operation.png").await;

    // "succeeded" is refused exactly as `toolledger resolve` refuses it: no receipt.
    let choose = |outcome: &'static str| {
        let c = c.clone();
        async move {
            c.find(Locator::Css(&format!("input[name=as][value={outcome}]")))
                .await
                .unwrap()
                .click()
                .await
                .unwrap();
        }
    };
    choose("succeeded").await;
    c.find(Locator::Id("reason"))
        .await
        .unwrap()
        .send_keys("it went through")
        .await
        .unwrap();
    c.find(Locator::Id("resolve-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let refusal = c.wait().for_element(Locator::Id("refusal")).await.unwrap();
    let refusal = refusal.text().await.unwrap();
    assert!(refusal.contains("(outcome_unknown)"), "{refusal}");
    assert!(refusal.contains("holds no receipt"), "{refusal}");
    assert_eq!(state_of(db, lost), "outcome_unknown");

    // Resolved as failed, with a reason that is shown as text.
    choose("failed").await;
    c.find(Locator::Id("reason"))
        .await
        .unwrap()
        .send_keys(REASON)
        .await
        .unwrap();
    screenshot(&c, "resolve.png").await;
    c.find(Locator::Id("resolve-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let Ok(reason) = c
        .wait()
        .for_element(Locator::Css("#resolution td.reason"))
        .await
    else {
        panic!("not resolved: {}", c.source().await.unwrap());
    };
    assert_eq!(reason.text().await.unwrap(), REASON);
    assert_eq!(
        c.find(Locator::Id("state"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "failed"
    );
    assert_eq!(state_of(db, lost), "failed");
    let detail = db.pairs("SELECT kind, detail FROM operation_events WHERE kind = 'resolved'");
    assert_eq!(detail.len(), 1);
    assert!(detail[0].1.contains("\"operator\":\"olga\""), "{detail:?}");

    // Gone from the list.
    c.goto(&format!("{base}/console")).await.unwrap();
    c.wait().for_element(Locator::Id("counts")).await.unwrap();
    assert!(c
        .find(Locator::Css(&format!("tr[data-status-ref='{lost}']")))
        .await
        .is_err());

    // A non-operator sees no resolve form, and a forged POST with its own valid CSRF token
    // is refused.
    c.find(Locator::Css("header form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait().for_element(Locator::Id("token")).await.unwrap();
    sign_in(&c, base, &vic).await;
    c.goto(&format!("{base}/console/operations/{xss}"))
        .await
        .unwrap();
    c.wait().for_element(Locator::Id("state")).await.unwrap();
    assert!(c.find(Locator::Id("resolve")).await.is_err());
    let (vic_cookie, vic_csrf) = session_of(&c).await;
    let (status, body) = raw_post(
        base,
        &format!("/console/operations/{xss}/resolve"),
        &vic_cookie,
        &format!("csrf={vic_csrf}&as=applied&reason=forged"),
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("permission_denied"));
    assert_eq!(state_of(db, xss), "partial");
    c.close().await.unwrap();
}

fn an_operator_settles_a_lost_refund_in_the_browser(db: Db) {
    if !browser_present() {
        return;
    }
    let lost = lost_refund(&db);
    let xss = xss_operation(&db);
    let (_console, base) = start_console(&db);
    let port = free_port();
    let _driver = Killed(
        Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port);
    let profile = tempfile::tempdir().unwrap();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(drive(&db, &base, port, profile.path(), &lost, &xss));
}
