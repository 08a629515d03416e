//! The demos of the `toolledger` binary, and what they need: short, self-checking stories on
//! fresh temporary databases, each starting real server processes of the binary that runs it
//! ([`std::env::current_exe`]) and checking what a client sees.
//!
//! Each demo tells what it did and what it read back from the database, and passes only if
//! the read-back matches the story. On a terminal [`run`] prints a few plain lines and `ok` (or
//! which checks failed); piped, or with `json`, one JSON object. Without a [`Demo`] it runs
//! every demo in [`Demo::ALL`] (one combined object).
//!
//! - `lost-reply`: the main job of the ledger: a reply lost on the way back, recovered by a
//!   status query and a retry that replays, on SQLite or PostgreSQL;
//! - `proxy`: a lost charge reply without and through `toolledger proxy`;
//! - `agent`: an agent that dies mid-call and resumes from its journal, and a model's re-plan
//!   after a lost reply, with the ledger and without;
//! - `receipts`: request-id receipts, in process.
//!
//! Beside them: [`upstream`], the small unguarded MCP server with a charge side effect that
//! the proxy's demo and benchmark put the proxy in front of (`toolledger upstream-example`),
//! and [`fixture`], the runtime fixture format `toolledger dispatch`, `status` and `approve`
//! read.
//!
//! To add a demo: a module with a `run` returning a [`DemoReport`], a variant of [`Demo`] and
//! its entry in [`Demo::ALL`].

#![warn(missing_docs)]

use std::path::Path;

use serde_json::{json, Map, Value};
use toolledger::store::sqlite::{SqliteStore, Synchronous};

mod agent;
pub mod fixture;
mod lost_reply;
mod proxy;
mod receipts;
mod session;
pub mod upstream;

/// The demos (`toolledger demo NAME`).
#[derive(clap::Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Demo {
    /// Request-id receipts: a committed edit whose reply is lost, the retry through a new
    /// store handle (replayed), a later edit, and the old retry again (historical result, row
    /// unchanged).
    Receipts,
    /// A lost reply: a multi-round create_issue whose reply is lost after commit, recovered by
    /// status and an exact replay through the server binary; then the unguarded control.
    LostReply,
    /// The ledger in front of a server it did not write: a charge whose reply is lost, retried
    /// without the proxy (charged twice) and through `toolledger proxy` (status, replay: once).
    Proxy,
    /// Exactly-once from the agent's side: an agent killed mid-call resumes from its journal
    /// (one charge), and a model's re-plan after a lost reply is refused as a possible
    /// duplicate (one charge); without the ledger, two charges each.
    Agent,
}

impl Demo {
    /// Every demo, in the order [`run`] without a demo runs them.
    pub const ALL: [Demo; 4] = [Demo::LostReply, Demo::Proxy, Demo::Agent, Demo::Receipts];

    /// The demo's name (its command-line name, and its key in the combined JSON object).
    pub fn name(self) -> &'static str {
        match self {
            Demo::Receipts => "receipts",
            Demo::LostReply => "lost-reply",
            Demo::Proxy => "proxy",
            Demo::Agent => "agent",
        }
    }

    /// Runs the demo (`lost-reply` on fresh schemas of the PostgreSQL database at
    /// `database_url` when given, the others always on temporary SQLite files).
    fn report(self, database_url: Option<&str>) -> Result<DemoReport, &'static str> {
        match self {
            Demo::LostReply => lost_reply::run(database_url),
            Demo::Proxy => proxy::run(),
            Demo::Agent => agent::run(),
            Demo::Receipts => receipts::run(),
        }
    }
}

/// What one demo reports.
pub struct DemoReport {
    /// Whether every check passed.
    pub ok: bool,
    /// The JSON summary (steps, read-back, checks).
    pub summary: Value,
    /// The story in a few plain lines, for a terminal.
    pub lines: Vec<String>,
}

impl DemoReport {
    /// A report whose `ok` says whether every value of `checks` is `true`; `summary` gets
    /// `checks` and `ok`.
    fn checked(checks: Value, mut summary: Value, lines: Vec<String>) -> DemoReport {
        let ok = checks
            .as_object()
            .is_some_and(|m| m.values().all(|v| v == &Value::Bool(true)));
        summary["checks"] = checks;
        summary["ok"] = Value::Bool(ok);
        DemoReport { ok, summary, lines }
    }
}

/// Runs `which` (every demo when `None`) and prints the outcome on stdout: plain lines on a
/// terminal unless `json`, else one JSON object (the demo's own for one named demo, else
/// `{"demos": {NAME: …}, "ok": …}`). `Ok(true)` when every check passed, `Ok(false)` when one
/// failed; `Err` carries a stable code when a demo could not run at all (I/O, database).
pub fn run(
    which: Option<Demo>,
    database_url: Option<&str>,
    json: bool,
) -> Result<bool, &'static str> {
    let selected = match which {
        Some(demo) => vec![demo],
        None => Demo::ALL.to_vec(),
    };
    let mut all_ok = true;
    let mut reports = Map::new();
    let mut lines = Vec::new();
    for demo in selected {
        let r = demo.report(database_url)?;
        all_ok &= r.ok;
        lines.extend(r.lines);
        if !r.ok {
            let failed: Vec<&str> = r.summary["checks"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter(|(_, v)| *v != &json!(true))
                        .map(|(k, _)| k.as_str())
                        .collect()
                })
                .unwrap_or_default();
            lines.push(format!("  FAILED ({}): {}", demo.name(), failed.join(", ")));
        }
        reports.insert(demo.name().to_string(), r.summary);
    }
    if !json && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        for line in &lines {
            println!("{line}");
        }
        println!("{}", if all_ok { "ok" } else { "FAILED" });
        return Ok(all_ok);
    }
    let out = match which {
        Some(demo) => reports.remove(demo.name()).unwrap_or(Value::Null),
        None => json!({"demos": reports, "ok": all_ok}),
    };
    println!("{out}");
    Ok(all_ok)
}

/// Runs `fut` to its end on a runtime of its own (`RUNTIME_ERROR` when none can start).
fn block_on<T>(
    fut: impl std::future::Future<Output = Result<T, &'static str>>,
) -> Result<T, &'static str> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|_| "RUNTIME_ERROR")?
        .block_on(fut)
}

/// Opens (creating it when missing) the SQLite ledger `db` with the reference tables, as
/// `toolledger serve` does; a failure is the store's stable code.
fn open_ledger(db: &Path, backend_id: Option<&str>) -> Result<SqliteStore, &'static str> {
    toolledger_reference::ledger::open_sqlite(
        db,
        backend_id.map(str::to_string),
        false,
        Synchronous::Full,
    )
    .map_err(|e| e.code())
}

/// `bytes` random bytes from the operating system, in hex.
fn random_hex(bytes: usize) -> Result<String, &'static str> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|_| "DEMO_IO_ERROR")?;
    Ok(hex::encode(b))
}
