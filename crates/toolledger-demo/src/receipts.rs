//! `toolledger demo receipts`: request-id receipts, in process, on a fresh temporary SQLite
//! file: a committed edit whose reply is lost, the retry through a new store handle
//! (replayed), a later edit, and the old retry again (its historical result; the row keeps
//! the later edit).

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;
use toolledger::clock::{SharedClock, SystemClock};
use toolledger::effect::{EffectTx, RowExt};
use toolledger::engine::Engine;
use toolledger::store::Store;
use toolledger::Error;
use toolledger_reference::automations;

use crate::{block_on, open_ledger, DemoReport};

fn error_json(e: &Error) -> Value {
    json!({"error": {"code": e.code.as_str(), "message": e.message}})
}

struct Handles {
    engine: Engine,
    principals: PrincipalStore,
}

fn handles(path: &Path) -> Result<Handles, &'static str> {
    let store = open_ledger(path, None)?;
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
pub(crate) fn run() -> Result<DemoReport, &'static str> {
    let dir = tempfile::tempdir().map_err(|_| "DEMO_IO_ERROR")?;
    let path = dir.path().join("receipts.sqlite");
    let story = block_on(receipts_story(&path))?;
    let read_back = block_on(read_back(&path))?;
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
    let summary = json!({"demo": "receipts", "steps": steps, "read_back": read_back});
    Ok(DemoReport::checked(checks, summary, lines))
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

/// What the ledger holds after the story, read through a new store handle.
async fn read_back(path: &Path) -> Result<Value, &'static str> {
    let store = Store::from(open_ledger(path, None).map_err(|_| "SQLITE_ERROR")?);
    store
        .read(|tx: &mut dyn EffectTx| {
            let mut count = |sql: &str| -> Result<i64, Error> {
                tx.query_opt(sql, &[])?.ok_or_else(Error::not_found)?.int(0)
            };
            let operations = count("SELECT count(*) FROM operations")?;
            let edit_42 = count(
                "SELECT count(*) FROM operations \
                 WHERE tool = 'set_interval' AND idempotency_key = 'edit-42'",
            )?;
            let automations = count("SELECT count(*) FROM automations")?;
            let automation = match tx.query_opt(
                "SELECT id, interval_minutes, version FROM automations ORDER BY id LIMIT 1",
                &[],
            )? {
                Some(r) => json!({"id": r.int(0)?, "interval_minutes": r.int(1)?,
                                  "version": r.int(2)?}),
                None => Value::Null,
            };
            Ok::<_, Error>(json!({
                "operations": operations,
                "edit_42_receipts": edit_42,
                "automations": automations,
                "automation": automation,
            }))
        })
        .await
        .map_err(|_| "SQLITE_ERROR")
}
