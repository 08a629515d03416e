//! `toolledger demo agent`: exactly-once from the agent's side.
//!
//! An agent keeps a journal (a SQLite file) of what it means to do: the operation id of each
//! intent is written there before the call is sent, so an agent that dies mid-call and starts
//! again finds the same id. The server is the binary's own charge upstream
//! (`upstream-example`), which charges once per call and never deduplicates. On a fresh
//! temporary directory, with the ledger (`toolledger proxy` in front of it) and without:
//!
//! - **crash**: the agent writes its intent, sends `charge`, and dies after the upstream
//!   committed and before the reply (its connection closes, as when its process is killed).
//!   A new agent reads the journal and sends the same call again. With the ledger the proxy
//!   finished the forward and recorded it, and the retry under the journal's id is replayed:
//!   one charge. Without it the retry charges again.
//! - **re-plan**: a charge's reply is lost (the upstream is slower than the proxy waits), and
//!   the model plans the same charge again under a new operation id. With the ledger that is
//!   `possible_duplicate`, naming the first, and nothing is sent: one charge. Without it, a
//!   second charge.
//!
//! Passes only when the charge files read back match.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::proxy::{charges, error_of, upstream, wait_for_charges};
use crate::session::Session;
use crate::DemoReport;

/// How long any one step may take.
const STEP: Duration = Duration::from_secs(30);
/// The upstream's delay between committing a charge and replying in the crash story: long
/// enough to die in, short enough for a proxy that loses its client to finish the forward.
const CRASH_DELAY_MS: &str = "1500";
/// The upstream's delay in the re-plan story: longer than the proxy's call timeout.
const SLOW_DELAY_MS: &str = "3000";
const CUSTOMER: &str = "c-7";
const AMOUNT_CENTS: i64 = 4200;

/// The agent's journal: one row per intent, its operation id written before the first send.
struct Journal {
    conn: rusqlite::Connection,
}

impl Journal {
    fn open(path: &Path) -> Result<Journal, &'static str> {
        let conn = rusqlite::Connection::open(path).map_err(|_| "DEMO_IO_ERROR")?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;
             CREATE TABLE IF NOT EXISTS intents (intent TEXT PRIMARY KEY,
                 operation_id TEXT NOT NULL, settled INTEGER NOT NULL DEFAULT 0);",
        )
        .map_err(|_| "DEMO_IO_ERROR")?;
        Ok(Journal { conn })
    }

    /// The operation id of `intent`: the one written before, else a new one, written now.
    fn operation_id(&self, intent: &str) -> Result<String, &'static str> {
        let known: Option<String> = self
            .conn
            .query_row(
                "SELECT operation_id FROM intents WHERE intent = ?1",
                [intent],
                |r| r.get(0),
            )
            .ok();
        if let Some(id) = known {
            return Ok(id);
        }
        let id = new_id()?;
        self.conn
            .execute(
                "INSERT INTO intents (intent, operation_id) VALUES (?1, ?2)",
                [intent, id.as_str()],
            )
            .map_err(|_| "DEMO_IO_ERROR")?;
        Ok(id)
    }

    /// The intents not settled yet.
    fn pending(&self) -> Result<Vec<String>, &'static str> {
        let mut s = self
            .conn
            .prepare("SELECT intent FROM intents WHERE settled = 0 ORDER BY intent")
            .map_err(|_| "DEMO_IO_ERROR")?;
        let rows = s.query_map([], |r| r.get(0)).map_err(|_| "DEMO_IO_ERROR")?;
        rows.collect::<Result<_, _>>().map_err(|_| "DEMO_IO_ERROR")
    }

    fn settle(&self, intent: &str) -> Result<(), &'static str> {
        self.conn
            .execute("UPDATE intents SET settled = 1 WHERE intent = ?1", [intent])
            .map(|_| ())
            .map_err(|_| "DEMO_IO_ERROR")
    }
}

fn new_id() -> Result<String, &'static str> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|_| "DEMO_IO_ERROR")?;
    Ok(format!("agent-{}", hex::encode(bytes)))
}

/// `toolledger proxy` on `ledger` (as its local principal, with `config` if given) in front
/// of the upstream.
fn proxy(exe: &Path, ledger: &Path, config: Option<&str>, file: &Path, delay_ms: &str) -> Command {
    let mut c = Command::new(exe);
    c.arg("proxy").arg("--db").arg(ledger);
    if let Some(config) = config {
        c.args(["--config", config]);
    }
    c.arg("--")
        .arg(exe)
        .arg("upstream-example")
        .arg("--db")
        .arg(file)
        .args(["--reply-delay-ms", delay_ms])
        .env_remove("TOOLLEDGER_UPSTREAM_DELAY_MS")
        .env_remove("TOOLLEDGER_TEST_HOLD_AT")
        .env_remove("TOOLLEDGER_STATE_KEY_HEX")
        .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
        .env_remove("TOOLLEDGER_DATABASE_URL")
        .env("RUST_LOG", "off");
    c
}

fn charge(operation_id: Option<&str>) -> Value {
    let mut a = json!({"customer": CUSTOMER, "amount_cents": AMOUNT_CENTS});
    if let Some(id) = operation_id {
        a["operation_id"] = json!(id);
    }
    json!({"name": "charge", "arguments": a})
}

/// The crash story: the agent dies mid-call; a new agent resumes its journal.
fn crash(exe: &Path, dir: &Path, ledger: bool) -> Result<Value, &'static str> {
    let tag = if ledger { "with" } else { "without" };
    let file = dir.join(format!("charges-crash-{tag}.sqlite"));
    let journal = Journal::open(&dir.join(format!("journal-{tag}.sqlite")))?;
    let ledger_file = dir.join("ledger.sqlite");
    let server = |delay: &str| match ledger {
        true => proxy(exe, &ledger_file, None, &file, delay),
        false => upstream(exe, &file, delay),
    };
    // The first agent: intent written, call sent, killed before the reply.
    let id = journal.operation_id("charge c-7 for order 7")?;
    let mut s = Session::start(server(CRASH_DELAY_MS))?;
    s.send(charge(ledger.then_some(id.as_str())))?;
    wait_for_charges(&file, 1)?;
    // Its connection closes as the agent dies; a proxy finishes the forward it was given.
    s.exit_code()?;
    // The next agent: what is pending in the journal, sent again under its id.
    let pending = journal.pending()?;
    let mut answers = Vec::new();
    for intent in &pending {
        let id = journal.operation_id(intent)?;
        let mut s = Session::start(server("0"))?;
        let answer = s
            .call(charge(ledger.then_some(id.as_str())), STEP)?
            .ok_or("DEMO_PROTOCOL_ERROR")?;
        s.exit_code()?;
        if error_of(&answer).is_null() {
            journal.settle(intent)?;
        }
        answers.push(answer);
    }
    let resumed = answers.first().cloned().unwrap_or(Value::Null);
    Ok(json!({
        "operation_id": id,
        "resumed": pending.len(),
        "replayed": resumed["_meta"]["io.toolledger/ledger"]["replayed"] == true,
        "charge_id": resumed["structuredContent"]["charge_id"],
        "charges": charges(&file),
    }))
}

/// The re-plan story: a lost reply, then the same charge under a new operation id.
fn replan(exe: &Path, dir: &Path, ledger: bool) -> Result<Value, &'static str> {
    let tag = if ledger { "with" } else { "without" };
    let file = dir.join(format!("charges-replan-{tag}.sqlite"));
    let config = dir.join("proxy.toml");
    let config = config.to_str().ok_or("DEMO_IO_ERROR")?;
    let ledger_file = dir.join("ledger.sqlite");
    let mut s = Session::start(match ledger {
        true => proxy(exe, &ledger_file, Some(config), &file, SLOW_DELAY_MS),
        false => upstream(exe, &file, SLOW_DELAY_MS),
    })?;
    let (first_id, second_id) = (new_id()?, new_id()?);
    // The first call's reply is lost: the proxy stops waiting (its call timeout), a client
    // without it gives up waiting.
    let first = match ledger {
        true => s
            .call(charge(Some(&first_id)), STEP)?
            .ok_or("DEMO_PROTOCOL_ERROR")?,
        false => {
            s.send(charge(None))?;
            wait_for_charges(&file, 1)?;
            Value::Null
        }
    };
    // The model plans the same charge again, under a new operation id.
    let second = s
        .call(charge(ledger.then_some(second_id.as_str())), STEP)?
        .ok_or("DEMO_PROTOCOL_ERROR")?;
    let second_error = error_of(&second);
    let _ = s.exit_code();
    if !ledger {
        wait_for_charges(&file, 2)?;
    }
    Ok(json!({
        "first": error_of(&first)["code"],
        "replan": second_error["code"],
        "names": second_error["earlier"]["operation_id"] == json!(first_id),
        "charges": charges(&file),
    }))
}

/// Runs the demo on a fresh temporary directory with the current executable as the proxy
/// and the upstream.
pub(crate) fn run() -> Result<DemoReport, &'static str> {
    let exe = std::env::current_exe().map_err(|_| "DEMO_SPAWN_ERROR")?;
    let dir = tempfile::tempdir().map_err(|_| "DEMO_IO_ERROR")?;
    // The proxy gives up waiting after a second: the re-plan story's reply is lost.
    std::fs::write(
        dir.path().join("proxy.toml"),
        "[tools.charge]\ncall_timeout_seconds = 1\n",
    )
    .map_err(|_| "DEMO_IO_ERROR")?;
    let crash_with = crash(&exe, dir.path(), true)?;
    let crash_without = crash(&exe, dir.path(), false)?;
    let replan_with = replan(&exe, dir.path(), true)?;
    let replan_without = replan(&exe, dir.path(), false)?;
    let checks = json!({
        "a_resumed_agent_gets_its_charge_back_once": crash_with["resumed"] == 1
            && crash_with["replayed"] == true
            && crash_with["charges"] == 1,
        "without_the_ledger_the_resumed_agent_charges_twice": crash_without["charges"] == 2,
        "a_replan_is_a_possible_duplicate_naming_the_first": replan_with["first"] == "outcome_unknown"
            && replan_with["replan"] == "possible_duplicate"
            && replan_with["names"] == true
            && replan_with["charges"] == 1,
        "without_the_ledger_the_replan_charges_twice": replan_without["charges"] == 2,
    });
    let lines = vec![
        "An agent that loses replies, with the ledger and without:".to_string(),
        format!(
            "  crash:   the agent wrote its intent to its journal (operation id {}), sent charge, and died before the reply",
            crash_with["operation_id"].as_str().unwrap_or("?")
        ),
        format!(
            "  resume:  a new agent found it pending and sent the same id: charge {} came back replayed; {} charge",
            crash_with["charge_id"], crash_with["charges"]
        ),
        format!(
            "  re-plan: a reply was lost ({}), the model planned the same charge under a new id: {}, naming the first; {} charge",
            replan_with["first"].as_str().unwrap_or("?"),
            replan_with["replan"].as_str().unwrap_or("?"),
            replan_with["charges"]
        ),
        format!(
            "  without the ledger: the resumed agent charged again ({} charges), and so did the re-plan ({} charges)",
            crash_without["charges"], replan_without["charges"]
        ),
    ];
    let summary = json!({
        "demo": "agent",
        "crash": {"with_ledger": crash_with, "without_ledger": crash_without},
        "replan": {"with_ledger": replan_with, "without_ledger": replan_without},
    });
    Ok(DemoReport::checked(checks, summary, lines))
}
