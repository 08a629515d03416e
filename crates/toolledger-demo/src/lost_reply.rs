//! `toolledger demo lost-reply`: a multi-round call's lost reply, against the real server
//! binary.
//!
//! On a fresh temporary SQLite file: the first round of `create_issue` asks for the issue's
//! body; the second round commits issue #1 and the server stops before replying (its
//! `drop-after-commit` fault point), so the client knows nothing; after a restart,
//! `get_operation_status` reads the stored result back and an exact replay returns it without
//! creating issue #2. The same story against `--unguarded` (no ledger) shows the duplicate the
//! guard prevents: there the repeated call is a retry that creates a second issue. Passes only
//! when the database read-back matches.
//!
//! With `--database-url postgres://…` the same story runs on PostgreSQL: each run gets a fresh
//! schema of its own in that database (dropped afterwards), and the server processes share
//! state and fingerprint keys through the environment (random per demo unless
//! `TOOLLEDGER_STATE_KEY_HEX`/`TOOLLEDGER_FINGERPRINT_KEY_HEX` are set).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;
use toolledger::effect::{EffectTx, RowExt};
use toolledger::store::postgres::{PgOptions, PgStore};
use toolledger::store::Store;

use crate::session::Session;
use crate::{block_on, open_ledger, random_hex, DemoReport};
use toolledger::store::StoreOptions;

const BACKEND: &str = "sqlite:demo";
const PG_BACKEND: &str = "postgres:demo";

/// Where one run of the story keeps its ledger.
enum Target {
    Sqlite(PathBuf),
    Postgres {
        /// The URL the server processes use (with the run's `search_path`).
        url: String,
        /// The run's own schema (dropped afterwards).
        store: PgStore,
        /// Keys every server process of the run shares.
        keys: [(&'static str, String); 2],
    },
}

impl Target {
    fn postgres(url: &str) -> Result<Target, &'static str> {
        let schema = format!("tl_demo_{}", &random_hex(32)?[..16]);
        let store = PgStore::open(
            url,
            PgOptions::new(PG_BACKEND)
                .with_migrations(toolledger_reference::PG_MIGRATIONS)
                .in_schema(schema.clone()),
        )
        .map_err(|e| e.code())?;
        let sep = if url.contains('?') { '&' } else { '?' };
        let key = |var: &'static str| -> Result<(&'static str, String), &'static str> {
            match std::env::var(var) {
                Ok(v) => Ok((var, v)),
                Err(_) => Ok((var, random_hex(32)?)),
            }
        };
        Ok(Target::Postgres {
            url: format!("{url}{sep}options=-c%20search_path%3D{schema}"),
            store,
            keys: [
                key("TOOLLEDGER_STATE_KEY_HEX")?,
                key("TOOLLEDGER_FINGERPRINT_KEY_HEX")?,
            ],
        })
    }

    fn serve_command(&self, exe: &Path) -> Command {
        let mut c = Command::new(exe);
        c.arg("serve");
        match self {
            Target::Sqlite(db) => {
                c.arg("--db").arg(db).args(["--backend-id", BACKEND]);
            }
            Target::Postgres { url, keys, .. } => {
                c.args(["--database-url", url]);
                for (k, v) in keys {
                    c.env(k, v);
                }
            }
        }
        c
    }

    fn store(&self) -> Result<Store, &'static str> {
        match self {
            Target::Sqlite(db) => open_ledger(db, Some(BACKEND)).map(Store::from),
            Target::Postgres { store, .. } => Ok(Store::from(store.clone())),
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Target::Postgres { store, .. } = self {
            let _ = store.drop_schema_blocking();
        }
    }
}
/// The operation id the client picks before its first send.
const OPERATION: &str = "new-issue-1";
/// The issue the client asks for.
const TITLE: &str = "spec";
/// Its body, sent in the second round.
const BODY: &str = "alpha";
/// How the server exits under `--fault drop-after-commit`.
const EXIT_AFTER_COMMIT: i32 = 70;

/// How long a demo waits for one reply.
const STEP: Duration = Duration::from_secs(60);

/// A session with `toolledger serve` on `target` as alice, with `extra` flags.
fn start(exe: &Path, target: &Target, extra: &[&str]) -> Result<Session, &'static str> {
    let mut command = target.serve_command(exe);
    command.args(["--principal", "alice"]).args(extra);
    Session::start(command)
}

fn count(target: &Target, table: &str) -> Result<i64, &'static str> {
    let store = target.store()?;
    let sql = format!("SELECT count(*) FROM {table}");
    block_on(async move {
        store
            .read(move |tx: &mut dyn EffectTx| {
                tx.query_opt(&sql, &[])?
                    .ok_or_else(toolledger::Error::not_found)?
                    .int(0)
            })
            .await
            .map_err(|_| "STORE_ERROR")
    })
}

fn prepare(target: &Target) -> Result<(), &'static str> {
    let store = target.store()?;
    block_on(async move {
        PrincipalStore::new(store)
            .add("alice", "demo", &["editor".to_string()], &[], false)
            .await
            .map_err(|_| "STORE_ERROR")?;
        Ok(())
    })
}

/// One run of the story; returns its summary.
fn story(exe: &Path, db: &Target, unguarded: bool) -> Result<Value, &'static str> {
    prepare(db)?;
    let mode: &[&str] = if unguarded { &["--unguarded"] } else { &[] };
    let arguments = json!({"operation_id": OPERATION, "title": TITLE});

    let mut s = start(exe, db, mode)?;
    let first = s
        .call(
            json!({"name": "create_issue", "arguments": arguments}),
            STEP,
        )?
        .ok_or("DEMO_PROTOCOL_ERROR")?;
    let input_required = first["resultType"] == "input_required";
    let token = first["requestState"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    s.exit_code()?;

    let continuation = json!({
        "name": "create_issue",
        "arguments": arguments,
        "requestState": token,
        "inputResponses": {"body": {"action": "accept", "content": {"body": BODY}}},
    });
    let crashing = [mode, &["--fault", "drop-after-commit"]].concat();
    let mut s = start(exe, db, &crashing)?;
    let lost = s.call(continuation.clone(), STEP)?;
    let crash_code = s.exit_code()?;

    let mut s = start(exe, db, mode)?;
    let status = s
        .call(
            json!({"name": "get_operation_status", "arguments": {"operation_id": OPERATION}}),
            STEP,
        )?
        .ok_or("DEMO_PROTOCOL_ERROR")?;
    let replay = s.call(continuation, STEP)?.ok_or("DEMO_PROTOCOL_ERROR")?;
    s.exit_code()?;

    let status = &status["structuredContent"];
    let replay = &replay["structuredContent"];
    Ok(json!({
        "asked_for_body": input_required,
        "reply_lost": lost.is_none() && crash_code == EXIT_AFTER_COMMIT,
        "status": {
            "state": status["state"],
            "authoritative": status["authoritative"],
            "stored_result": status["storedResult"],
            "issue_ids": status["matchingIds"],
            "new_write_allowed": status["freshWriteAuthorized"],
        },
        // Without the ledger the same call runs again: it is a retry, not a replay.
        (if unguarded { "retry" } else { "replay" }): {
            "replayed": replay["replayed"],
            "issue_id": replay["effectId"],
            "result": replay["result"],
        },
        "rows": {
            "issues": count(db, "issues")?,
            "operations": count(db, "operations")?,
        },
    }))
}

/// Runs the demo on temporary SQLite files, or with `database_url` on fresh schemas of that
/// PostgreSQL database, with the current executable as the server.
pub(crate) fn run(database_url: Option<&str>) -> Result<DemoReport, &'static str> {
    let exe: PathBuf = std::env::current_exe().map_err(|_| "DEMO_SPAWN_ERROR")?;
    let dir = tempfile::tempdir().map_err(|_| "DEMO_IO_ERROR")?;
    let target = |name: &str| -> Result<Target, &'static str> {
        match database_url {
            Some(url) => Target::postgres(url),
            None => Ok(Target::Sqlite(dir.path().join(format!("{name}.sqlite")))),
        }
    };
    let guarded = story(&exe, &target("guarded")?, false)?;
    let control = story(&exe, &target("unguarded")?, true)?;

    let st = &guarded["status"];
    let rp = &guarded["replay"];
    let checks = json!({
        "server_asked_for_the_body": guarded["asked_for_body"] == true,
        "reply_lost_after_commit": guarded["reply_lost"] == true,
        "status_found_the_stored_result": st["state"] == "applied"
            && st["authoritative"] == true
            && st["new_write_allowed"] == false
            && st["issue_ids"] == json!([1])
            && st["stored_result"] == "created 1",
        "replay_returned_the_stored_result": rp["replayed"] == true
            && rp["issue_id"] == 1
            && rp["result"] == "created 1",
        "one_issue_one_operation": guarded["rows"] == json!({"issues": 1, "operations": 1}),
        "without_the_ledger_the_retry_duplicates": control["rows"]
            == json!({"issues": 2, "operations": 0})
            && control["status"]["state"] == "unknown"
            && control["retry"]["replayed"] == false
            && control["retry"]["issue_id"] == 2,
    });
    let database = if database_url.is_some() {
        "postgres"
    } else {
        "sqlite"
    };
    let lines = story_lines(database, &guarded, &control);
    let summary = json!({
        "demo": "lost-reply",
        "database": database,
        "operation_id": OPERATION,
        "sent": {"tool": "create_issue", "title": TITLE, "body": BODY},
        "guarded": guarded,
        "unguarded": control,
    });
    Ok(DemoReport::checked(checks, summary, lines))
}

/// The story in a few plain lines, for a terminal.
fn story_lines(database: &str, guarded: &Value, control: &Value) -> Vec<String> {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let ids = |v: &Value| match v.as_array() {
        Some(a) => a
            .iter()
            .map(|id| format!("#{id}"))
            .collect::<Vec<_>>()
            .join(", "),
        None => text(v),
    };
    let st = &guarded["status"];
    let rp = &guarded["replay"];
    let rows = &guarded["rows"];
    let database = if database == "postgres" {
        "PostgreSQL"
    } else {
        "SQLite"
    };
    vec![
        format!("A lost reply, on a temporary {database} ledger:"),
        format!(
            "  sent:    create_issue \"{TITLE}\" under operation id {OPERATION}; the server \
             asked for the body, and the client sent \"{BODY}\""
        ),
        "  lost:    the server committed the issue and stopped before replying; the client \
         cannot tell whether it exists"
            .to_string(),
        format!(
            "  status:  get_operation_status says {} with the stored result \"{}\" (issue {})",
            text(&st["state"]),
            text(&st["stored_result"]),
            ids(&st["issue_ids"]),
        ),
        format!(
            "  replay:  the same call again returns \"{}\" (replayed: {}); no new issue",
            text(&rp["result"]),
            text(&rp["replayed"]),
        ),
        format!(
            "  rows:    {} issue, {} operation",
            text(&rows["issues"]),
            text(&rows["operations"]),
        ),
        format!(
            "  without the ledger: status says {}, and the same retry creates issue #{}: {} \
             issues for one request",
            text(&control["status"]["state"]),
            text(&control["retry"]["issue_id"]),
            text(&control["rows"]["issues"]),
        ),
    ]
}
