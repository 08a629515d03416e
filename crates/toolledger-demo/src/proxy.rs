//! `toolledger demo proxy`: the ledger in front of a server it did not write.
//!
//! The server is the binary's own example upstream (`toolledger upstream-example`): a charge
//! server that adds one row to its own SQLite file per `charge` and never deduplicates. On a
//! fresh temporary directory, twice:
//!
//! - without the proxy, the client calls `charge`; the server commits the charge and is killed
//!   before it replies; the client, who cannot tell, retries: two charges;
//! - through `toolledger proxy` (configured to forward the operation id in `_meta` and to look
//!   an unsure charge up with `find_charge`), the same lost reply: the proxy answers that the
//!   outcome is unknown, with a status reference; the retry under the same operation id is
//!   told the same and is never sent to the server; `get_operation_status` runs the lookup,
//!   finds the charge and records it; the retry then gets it back (replayed): one charge.
//!
//! Passes only when the charge files read back match.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;

use crate::session::Session;
use crate::{block_on, open_ledger, DemoReport};

const BACKEND: &str = "sqlite:demo";
/// The operation id the client picks before its first send.
const OPERATION: &str = "charge-1";
const CUSTOMER: &str = "c-1";
const AMOUNT_CENTS: i64 = 1200;
/// How long the server waits between committing a charge and replying: the window in which
/// the demo kills it.
const REPLY_DELAY_MS: &str = "30000";
/// How long any one step may take.
const STEP: Duration = Duration::from_secs(30);

/// The proxy's configuration: the operation id travels in `_meta`, and an unsure charge is
/// looked up by it.
const CONFIG: &str = r#"[tools.charge]
forward_operation_id = "_meta"

[tools.charge.reconcile]
tool = "find_charge"
arguments = { reference = "{operation_id}" }
found_when = "/structuredContent/found"
result = { charge_id = "/structuredContent/charge/id", customer = "/structuredContent/charge/customer", amount_cents = "/structuredContent/charge/amount_cents" }
"#;

/// One `tools/call` of `name` and its result.
fn call(s: &mut Session, name: &str, arguments: Value) -> Result<Value, &'static str> {
    s.call(json!({"name": name, "arguments": arguments}), STEP)?
        .ok_or("DEMO_PROTOCOL_ERROR")
}

/// The binary's example upstream alone, charging into `charges` `delay_ms` after each commit.
pub(crate) fn upstream(exe: &Path, charges: &Path, delay_ms: &str) -> Command {
    let mut c = Command::new(exe);
    c.arg("upstream-example")
        .arg("--db")
        .arg(charges)
        .args(["--reply-delay-ms", delay_ms])
        .env_remove("TOOLLEDGER_UPSTREAM_DELAY_MS");
    c
}

/// Rows in a charge file (0 before the server created it).
pub(crate) fn charges(path: &Path) -> i64 {
    let Ok(conn) =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
    else {
        return 0;
    };
    let _ = conn.busy_timeout(Duration::from_secs(5));
    conn.query_row("SELECT count(*) FROM charges", [], |r| r.get(0))
        .unwrap_or(0)
}

/// Waits until the charge file holds `n` rows.
pub(crate) fn wait_for_charges(path: &Path, n: i64) -> Result<(), &'static str> {
    let until = Instant::now() + STEP;
    while charges(path) < n {
        if Instant::now() > until {
            return Err("DEMO_TIMEOUT");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The pid of the proxy's upstream, once it has started.
fn upstream_of(proxy: u32) -> Result<i32, &'static str> {
    let until = Instant::now() + STEP;
    loop {
        if let Some(pid) = toolledger_proxy::upstream_pid(proxy) {
            return Ok(pid as i32);
        }
        if Instant::now() > until {
            return Err("DEMO_TIMEOUT");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn kill(pid: i32) {
    // SAFETY: kill has no memory preconditions; the pid is the proxy's child, started by it.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// The `{code, status_ref}` of an error result, or `null` for a result that is not an error.
pub(crate) fn error_of(result: &Value) -> Value {
    if result["isError"] != true {
        return Value::Null;
    }
    result["content"][0]["text"]
        .as_str()
        .and_then(|t| serde_json::from_str::<Value>(t).ok())
        .map(|v| v["error"].clone())
        .unwrap_or(Value::Null)
}

/// What the client heard back, in plain words: the charge's id, or why not.
fn answer(result: &Value) -> Value {
    let e = error_of(result);
    if e.is_null() {
        json!({"charge_id": result["structuredContent"]["charge_id"]})
    } else {
        json!({"outcome": e["code"], "status_ref": e["status_ref"]})
    }
}

fn charge_args(with_id: bool) -> Value {
    let mut a = json!({"customer": CUSTOMER, "amount_cents": AMOUNT_CENTS});
    if with_id {
        a["operation_id"] = json!(OPERATION);
    }
    a
}

/// Without the proxy: the reply is lost, the retry charges again.
fn without_proxy(exe: &Path, dir: &Path) -> Result<Value, &'static str> {
    let file = dir.join("charges-without-proxy.sqlite");
    let mut s = Session::start(upstream(exe, &file, REPLY_DELAY_MS))?;
    s.send(json!({"name": "charge", "arguments": charge_args(false)}))?;
    wait_for_charges(&file, 1)?;
    // The charge server committed the charge and is killed before it replies.
    let replied = s.reply(Duration::ZERO)?.is_some();
    s.kill();

    let mut s = Session::start(upstream(exe, &file, "0"))?;
    let retry = call(&mut s, "charge", charge_args(false))?;
    s.exit_code()?;
    Ok(json!({
        "reply_lost": !replied,
        "retry": answer(&retry),
        "charges": charges(&file),
    }))
}

/// Through the proxy: the reply is lost, the retry is told so, the status query finds the
/// charge, and the retry then gets it back.
fn with_proxy(exe: &Path, dir: &Path) -> Result<Value, &'static str> {
    let file = dir.join("charges-with-proxy.sqlite");
    let ledger = dir.join("ledger.sqlite");
    let config = dir.join("proxy.toml");
    std::fs::write(&config, CONFIG).map_err(|_| "DEMO_IO_ERROR")?;
    let store = open_ledger(&ledger, Some(BACKEND))?;
    block_on(async {
        let principals = PrincipalStore::new(store);
        let added = principals.add("alice", "demo", &[], &[], false).await;
        added.map_err(|_| "STORE_ERROR")
    })?;

    let mut proxy = Command::new(exe);
    proxy
        .arg("proxy")
        .arg("--db")
        .arg(&ledger)
        .args(["--backend-id", BACKEND, "--principal", "alice"])
        .arg("--config")
        .arg(&config)
        .arg("--")
        .arg(exe)
        .arg("upstream-example")
        .arg("--db")
        .arg(&file)
        .args(["--reply-delay-ms", REPLY_DELAY_MS])
        .env_remove("TOOLLEDGER_UPSTREAM_DELAY_MS")
        .env_remove("TOOLLEDGER_TEST_HOLD_AT")
        .env("RUST_LOG", "off");
    let mut s = Session::start(proxy)?;
    s.send(json!({"name": "charge", "arguments": charge_args(true)}))?;
    wait_for_charges(&file, 1)?;
    // The charge server committed the charge and is killed before it replies.
    kill(upstream_of(s.pid())?);
    let first = s.reply(STEP)?.ok_or("DEMO_PROTOCOL_ERROR")?;
    let retry = call(&mut s, "charge", charge_args(true))?;
    let status = call(
        &mut s,
        "get_operation_status",
        json!({"operation_id": OPERATION}),
    )?;
    let replay = call(&mut s, "charge", charge_args(true))?;
    s.exit_code()?;

    let status = &status["structuredContent"];
    let ledger_meta = &replay["_meta"]["io.toolledger/ledger"];
    let charged = &replay["structuredContent"];
    let confirmed = &replay["_meta"]["io.toolledger/confirmed"];
    Ok(json!({
        "first_answer": answer(&first),
        "retry_answer": answer(&retry),
        "status": {
            "state": status["state"],
            "settled": status["authoritative"],
        },
        "replay": {
            "replayed": ledger_meta["replayed"],
            "confirmed_by": confirmed["by"],
            "charge_id": charged["charge_id"],
            "reference": confirmed["evidence"]["structuredContent"]["charge"]["reference"],
        },
        "charges": charges(&file),
    }))
}

/// Runs the demo on a fresh temporary directory with the current executable as the proxy and
/// the charge server.
pub(crate) fn run() -> Result<DemoReport, &'static str> {
    let exe: PathBuf = std::env::current_exe().map_err(|_| "DEMO_SPAWN_ERROR")?;
    let dir = tempfile::tempdir().map_err(|_| "DEMO_IO_ERROR")?;
    let without = without_proxy(&exe, dir.path())?;
    let with = with_proxy(&exe, dir.path())?;

    let first = &with["first_answer"];
    let status_ref = &first["status_ref"];
    let checks = json!({
        "without_the_proxy_the_retry_charges_twice": without["reply_lost"] == true
            && without["charges"] == 2
            && without["retry"]["charge_id"] == 2,
        "the_proxy_says_the_outcome_is_unknown": first["outcome"] == "outcome_unknown"
            && status_ref.is_string(),
        "the_retry_is_not_sent_again": with["retry_answer"]["outcome"] == "outcome_unknown"
            && with["retry_answer"]["status_ref"] == *status_ref,
        "the_status_query_finds_the_charge": with["status"]["state"] == "succeeded"
            && with["status"]["settled"] == true,
        "the_retry_then_gets_it_back": with["replay"]["replayed"] == true
            && with["replay"]["confirmed_by"] == "lookup"
            && with["replay"]["charge_id"] == 1
            && with["replay"]["reference"]
                .as_str()
                .is_some_and(|r| r.len() == 64 && r != OPERATION),
        "with_the_proxy_one_charge": with["charges"] == 1,
    });
    let lines = story_lines(&without, &with);
    let summary = json!({
        "demo": "proxy",
        "operation_id": OPERATION,
        "sent": {"tool": "charge", "customer": CUSTOMER, "amount_cents": AMOUNT_CENTS},
        "without_proxy": without,
        "with_proxy": with,
    });
    Ok(DemoReport::checked(checks, summary, lines))
}

/// The story in a few plain lines, for a terminal.
fn story_lines(without: &Value, with: &Value) -> Vec<String> {
    let text = |v: &Value| match v {
        Value::String(s) => s.replace('_', " "),
        other => other.to_string(),
    };
    vec![
        "The ledger in front of a charge server it did not write:".to_string(),
        format!(
            "  sent:    charge {CUSTOMER} {AMOUNT_CENTS} cents; the server charged and was \
             stopped before replying"
        ),
        format!(
            "  without the proxy: the client cannot tell, retries, and is charged again \
             (charge #{}): {} charges",
            text(&without["retry"]["charge_id"]),
            text(&without["charges"]),
        ),
        format!(
            "  with the proxy:    the same call under operation id {OPERATION}, the same lost \
             reply; the proxy answers: {}",
            text(&with["first_answer"]["outcome"]),
        ),
        format!(
            "  retry:   the same answer ({}); nothing is sent to the server again",
            text(&with["retry_answer"]["outcome"]),
        ),
        format!(
            "  status:  get_operation_status asks the server for the charge and says {}",
            text(&with["status"]["state"]),
        ),
        format!(
            "  replay:  the retry now gets charge #{} back (replayed: {})",
            text(&with["replay"]["charge_id"]),
            text(&with["replay"]["replayed"]),
        ),
        format!(
            "  charges: {} with the proxy, {} without",
            text(&with["charges"]),
            text(&without["charges"]),
        ),
    ]
}
