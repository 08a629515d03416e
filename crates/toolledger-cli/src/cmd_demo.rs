//! `toolledger demo [NAME]`: short, self-checking stories on a fresh temporary database.
//!
//! Each demo tells what it did and what it read back from the database, and passes only if
//! the read-back matches the story. On a terminal it prints a few plain lines and `ok` (or
//! which checks failed); piped, or with `--json`, one JSON object. Bare `toolledger demo` runs
//! every demo in [`DEMOS`] (one combined object). Exit 0: every check passed; 1: a check
//! failed; 2: the demo could not run (I/O, database).
//!
//! To add a demo: add a variant to [`DemoCmd`], a `fn() -> Result<DemoReport, &'static str>`,
//! and one entry in [`DEMOS`].

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use toolledger::authz::PrincipalStore;
use toolledger::clock::{SharedClock, SystemClock};
use toolledger::engine::Engine;
use toolledger::Error;

use crate::common;
use crate::exit::{Failure, Outcome};
use toolledger_reference::automations;

/// Arguments of `toolledger demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Which demo to run; every demo when omitted.
    #[command(subcommand)]
    pub which: Option<DemoCmd>,
    /// Run `lost-reply` on fresh schemas of this PostgreSQL database instead of temporary
    /// SQLite files (`receipts` always uses a temporary SQLite file).
    #[arg(
        long,
        global = true,
        env = "TOOLLEDGER_DATABASE_URL",
        value_name = "URL"
    )]
    pub database_url: Option<String>,
    /// Print one JSON object even on a terminal (piped output is always JSON).
    #[arg(long, global = true)]
    pub json: bool,
}

/// The demos.
#[derive(clap::Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemoCmd {
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

impl DemoCmd {
    /// The demo's name in [`DEMOS`].
    pub fn name(self) -> &'static str {
        match self {
            DemoCmd::Receipts => "receipts",
            DemoCmd::LostReply => "lost-reply",
            DemoCmd::Proxy => "proxy",
            DemoCmd::Agent => "agent",
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

/// A demo: `Err` carries a stable exit-2 code when it could not run at all.
pub type DemoFn = fn() -> Result<DemoReport, &'static str>;

/// Every demo, in the order bare `toolledger demo` runs them.
pub const DEMOS: &[(&str, DemoFn)] = &[
    ("lost-reply", crate::demo::lost_reply::run),
    ("proxy", crate::demo::proxy::run),
    ("agent", crate::demo::agent::run),
    ("receipts", receipts),
];

/// Runs `toolledger demo`.
pub fn run(args: DemoArgs) -> Result<Outcome, Failure> {
    let selected: Vec<&(&str, DemoFn)> = match args.which {
        Some(cmd) => DEMOS.iter().filter(|(n, _)| *n == cmd.name()).collect(),
        None => DEMOS.iter().collect(),
    };
    let mut all_ok = true;
    let mut reports = Map::new();
    let mut lines = Vec::new();
    for (name, demo) in &selected {
        let outcome = match (&args.database_url, *name) {
            (Some(url), "lost-reply") => crate::demo::lost_reply::run_on(Some(url)),
            _ => demo(),
        };
        let r = outcome.map_err(Failure::code)?;
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
            lines.push(format!("  FAILED ({name}): {}", failed.join(", ")));
        }
        reports.insert((*name).to_string(), r.summary);
    }
    if !args.json && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        for line in &lines {
            println!("{line}");
        }
        println!("{}", if all_ok { "ok" } else { "FAILED" });
        return Ok(Outcome::pass_if(all_ok));
    }
    let out = if args.which.is_some() && reports.len() == 1 {
        reports
            .into_iter()
            .next()
            .map(|(_, v)| v)
            .unwrap_or(Value::Null)
    } else {
        json!({"demos": reports, "ok": all_ok})
    };
    common::print_json(&out);
    Ok(Outcome::pass_if(all_ok))
}

fn runtime() -> Result<tokio::runtime::Runtime, &'static str> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|_| "RUNTIME_ERROR")
}

fn error_json(e: &Error) -> Value {
    json!({"error": {"code": e.code.as_str(), "message": e.message}})
}

struct Handles {
    engine: Engine,
    principals: PrincipalStore,
}

fn handles(path: &Path) -> Result<Handles, &'static str> {
    let store = common::open_store(path, None, false).map_err(|e| e.cli_code())?;
    let clock: SharedClock = Arc::new(SystemClock);
    Ok(Handles {
        engine: Engine::new(store.clone(), clock.clone()),
        principals: PrincipalStore::new(store).with_clock(clock),
    })
}

impl Handles {
    async fn call(&self, tool: &str, args: Value) -> Result<Value, Error> {
        automations::call_tool(&self.engine, &self.principals, "alice", tool, args).await
    }
}

/// The request-id receipts story on a fresh temporary SQLite file.
pub fn receipts() -> Result<DemoReport, &'static str> {
    let dir = tempfile::tempdir().map_err(|_| "DEMO_IO_ERROR")?;
    let path = dir.path().join("receipts.sqlite");
    let rt = runtime()?;
    let story = rt.block_on(receipts_story(&path))?;
    let read_back = read_back(&path).map_err(|_| "SQLITE_ERROR")?;
    let (steps, replies) = match story {
        Ok(v) => v,
        Err((steps, e)) => {
            return Ok(DemoReport {
                ok: false,
                lines: vec![format!("Request-id receipts: a step failed: {}", e.message)],
                summary: json!({"demo": "receipts", "steps": steps, "failed": error_json(&e),
                                "read_back": read_back, "ok": false}),
            })
        }
    };
    let [created, retry, later, old_retry] = replies;
    let id = created["id"].clone();
    let checks = json!({
        "lost_reply_retry_replayed": retry["replayed"] == json!(true)
            && retry == json!({"id": id, "interval_minutes": 30, "version": 2, "replayed": true}),
        "later_edit_fresh": later == json!({"id": id, "interval_minutes": 60, "version": 3,
                                            "replayed": false}),
        "old_retry_returns_historical_result": old_retry == retry,
        "operations_rows": read_back["operations"] == json!(3),
        "edit_42_receipts": read_back["edit_42_receipts"] == json!(1),
        "automation_row_unchanged_by_old_retry": read_back["automation"]
            == json!({"id": id, "interval_minutes": 60, "version": 3}),
    });
    let ok = checks
        .as_object()
        .is_some_and(|m| m.values().all(|v| v == &json!(true)));
    let lines = vec![
        "Request-id receipts, on a temporary SQLite ledger:".to_string(),
        format!(
            "  set_interval edit-42 (30 minutes) committed and its reply was lost; the retry \
             through a new store handle replayed: {}",
            retry["replayed"]
        ),
        "  set_interval edit-43 (60 minutes) then changed the automation".to_string(),
        format!(
            "  the old retry of edit-42 again returns its historical result ({} minutes); the \
             row keeps {} minutes",
            old_retry["interval_minutes"], read_back["automation"]["interval_minutes"]
        ),
        format!(
            "  rows:    {} operations, {} receipt for edit-42",
            read_back["operations"], read_back["edit_42_receipts"]
        ),
    ];
    Ok(DemoReport {
        ok,
        lines,
        summary: json!({
            "demo": "receipts",
            "steps": steps,
            "read_back": read_back,
            "checks": checks,
            "ok": ok,
        }),
    })
}

type Story = Result<(Vec<Value>, [Value; 4]), (Vec<Value>, Error)>;

async fn receipts_story(path: &Path) -> Result<Story, &'static str> {
    let mut steps = Vec::new();
    macro_rules! attempt {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(e) => return Ok(Err((steps, e))),
            }
        };
    }
    let first = handles(path)?;
    attempt!(
        first
            .principals
            .add(
                "alice",
                "team-a",
                &[],
                &[automations::SCOPE.to_string()],
                false
            )
            .await
    );
    steps.push(json!({"step": "principal add alice --tenant team-a --scope automation:write"}));
    let created = attempt!(
        first
            .call(
                automations::CREATE_AUTOMATION,
                json!({"request_id": "create-1", "interval_minutes": 15})
            )
            .await
    );
    steps.push(json!({"step": "create_automation create-1", "reply": created}));
    let id = created["id"].clone();
    let edit_42 = json!({"request_id": "edit-42", "automation_id": id, "expected_version": 1,
                         "interval_minutes": 30});

    // The handler commits; the reply never reaches the client.
    let lost = attempt!(first.call(automations::SET_INTERVAL, edit_42.clone()).await);
    drop(lost);
    drop(first);
    steps.push(json!({"step": "set_interval edit-42", "reply": null,
                      "note": "committed, reply lost in transit"}));

    // The client retries through a new store handle (new connections).
    let second = handles(path)?;
    let retry = attempt!(
        second
            .call(automations::SET_INTERVAL, edit_42.clone())
            .await
    );
    steps.push(json!({"step": "retry set_interval edit-42 (new store handle)", "reply": retry}));

    let later = attempt!(
        second
            .call(
                automations::SET_INTERVAL,
                json!({"request_id": "edit-43", "automation_id": id, "expected_version": 2,
                       "interval_minutes": 60})
            )
            .await
    );
    steps.push(json!({"step": "set_interval edit-43", "reply": later}));

    let old_retry = attempt!(second.call(automations::SET_INTERVAL, edit_42).await);
    steps.push(
        json!({"step": "retry set_interval edit-42 again", "reply": old_retry,
                      "note": "historical result; the row keeps the newer edit"}),
    );
    Ok(Ok((steps, [created, retry, later, old_retry])))
}

fn read_back(path: &Path) -> rusqlite::Result<Value> {
    let conn = rusqlite::Connection::open(path)?;
    let operations: i64 = conn.query_row("SELECT count(*) FROM operations", [], |r| r.get(0))?;
    let edit_42: i64 = conn.query_row(
        "SELECT count(*) FROM operations WHERE tool = 'set_interval' AND idempotency_key = 'edit-42'",
        [],
        |r| r.get(0),
    )?;
    let automation = conn
        .query_row(
            "SELECT id, interval_minutes, version FROM automations ORDER BY id LIMIT 1",
            [],
            |r| {
                Ok(
                    json!({"id": r.get::<_, i64>(0)?, "interval_minutes": r.get::<_, i64>(1)?,
                          "version": r.get::<_, i64>(2)?}),
                )
            },
        )
        .unwrap_or(Value::Null);
    let automations: i64 = conn.query_row("SELECT count(*) FROM automations", [], |r| r.get(0))?;
    Ok(json!({
        "operations": operations,
        "edit_42_receipts": edit_42,
        "automations": automations,
        "automation": automation,
    }))
}
