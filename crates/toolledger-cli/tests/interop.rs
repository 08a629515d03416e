//! The interop matrix: MCP clients nobody on this project wrote, driving `toolledger serve`
//! over stdio and over streamable HTTP (`serve --http`, bearer token from
//! `principal add --token`), in MCP 2026-07-28 (no initialize, multi-round
//! `input_required`/`requestState`) and in the initialize lifecycle.
//!
//! Clients (small scripts; each prints one JSON object, one entry per case, and this file
//! asserts on it and on the database rows):
//!
//! - the Python SDK `mcp==2.3.0`: its high-level `Client` with an elicitation callback
//!   (`tests/py/interop_client.py`) and its session API, `ClientSession`, driven by hand
//!   (`tests/py/interop_session.py`); both lifecycles;
//! - the TypeScript SDK v2, `@modelcontextprotocol/client` 2.4.0 on Node 22
//!   (`tests/js/interop/ts-v2.mjs`); both lifecycles;
//! - the TypeScript SDK v1, `@modelcontextprotocol/sdk` 1.32.2 (`ts-v1.mjs`): initialize
//!   lifecycle only (it speaks no 2026-07-28); it validates `structuredContent` against the
//!   output schema even on error results;
//! - the MCP Inspector's command line, `@modelcontextprotocol/inspector` 2.12.0 `--cli`
//!   (`inspector.mjs`), one run per request, the token in `--header`; both eras.
//!
//! Cases (each client, each transport, each lifecycle it speaks):
//!
//! - `tools_list`: all six tools, each with an object input and output schema the client
//!   accepted;
//! - `create_issue`: through the client's own round handling (the SDKs' input_required driver
//!   in 2026-07-28, elicitation/create under initialize), fresh; `create_issue_again`: the
//!   same call again, which (the client keeping no requestState between calls) is a client
//!   starting over with the same operation id and body: the stored result, `replayed: true`;
//! - session API in 2026-07-28 only: the first round (`input_required` for `body`), the
//!   continuation, the exact continuation again (`replayed: true`), a restart without the
//!   lost requestState (the stored result, not a new round that would end in
//!   `operation_conflict`), and a tampered requestState (JSON-RPC -32602 with
//!   `data.code = request_state_invalid`, nothing written);
//! - `create_issue_without_elicitation`: a client that declares no elicitation is answered
//!   `continuation_unsupported` and nothing is written, in either lifecycle;
//! - `automations`: `create_automation`, `set_interval` fresh and replayed, and with a stale
//!   version: `version_conflict`, read from the JSON text of content[0], no exception from
//!   schema validation;
//! - `drafts`: `create_draft` without an approval (`approval_required`), with one from
//!   `toolledger approve` (fresh, then replayed);
//! - `refund`: `refund_order` meets an unavailable payments service and answers
//!   `outcome_unknown` (an error result naming its `status_ref`, with `structuredContent`
//!   that validates); `get_operation_status` says `unknown`; one `toolledger worker --once`
//!   pass delivers it; `get_operation_status` then says `applied` and the retry replays
//!   (`local_replay`);
//! - `status`: `get_operation_status` for each of the five write tools' operations;
//! - `http_session_termination` (the TypeScript SDKs over HTTP, initialize lifecycle, the
//!   only one with a session): the client's `terminateSession()` (DELETE) is accepted.
//!
//! Omitted, and why: the Inspector's CLI declares no elicitation and cannot answer an input
//! request, so it runs no multi-round `create_issue` (its `create_issue` is the
//! undeclared-capability case, and its status for that id is `unknown`); the high-level
//! clients (Python `Client`, both TypeScript SDKs) hide requestState, so the exact
//! continuation replay and the tampered token are run only through the session API; the
//! TypeScript SDK v1 has no 2026-07-28. PostgreSQL runs the Python `Client` and the
//! TypeScript SDK v2 over both transports and both lifecycles; every combination runs on
//! SQLite.
//!
//! The unsure refund: the payments stand-in's own SQLite file gets a trigger refusing every
//! receipt committed before `NOW + 50`. The server runs at `--clock-epoch NOW`, so its
//! delivery fails after the intent committed (`outcome_unknown`); the worker runs at
//! `NOW + 100`, after the dispatch's lease, and delivers.
//!
//! Every case of one combination is checked and all failures are reported together, so one
//! run shows the whole row of the matrix. The database is then read back: exactly one
//! operation and one effect row per operation id, none for the refused calls.
//!
//! Without `TOOLLEDGER_PYTHON` (a python with `mcp==2.3.0`) or `TOOLLEDGER_NODE` (Node 22,
//! with `npm ci` run in `tests/js`) the tests that need it say so loudly and skip, except
//! under CI (`TOOLLEDGER_CI` set), where a missing interpreter is a failure.

#[macro_use]
mod support;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::wire::*;
use toolledger_testkit::reference::add_order;
use toolledger_testkit::stdio::wait_listening;

/// The servers' clock.
const NOW: i64 = 1_800_000_000;
/// The worker's clock: after the dispatch's 30 s lease, and after the payments stand-in
/// accepts receipts again.
const WORKER_AT: i64 = NOW + 100;
/// The payments stand-in refuses receipts committed before this second.
const PAYMENTS_BACK_AT: i64 = NOW + 50;
/// How long one client run may take before it is stopped (a hung client must not hang CI).
const CLIENT_LIMIT: Duration = Duration::from_secs(240);

const TOOLS: [&str; 6] = [
    "create_issue",
    "get_operation_status",
    "create_automation",
    "set_interval",
    "create_draft",
    "refund_order",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClientKind {
    /// The Python SDK's high-level `mcp.Client`.
    PythonClient,
    /// The Python SDK's `mcp.ClientSession`, rounds driven by hand.
    PythonSession,
    /// `@modelcontextprotocol/client` 2.4.0.
    TypeScriptV2,
    /// `@modelcontextprotocol/sdk` 1.32.2.
    TypeScriptV1,
    /// `@modelcontextprotocol/inspector` 2.12.0 `--cli`.
    Inspector,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Stdio,
    Http,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lifecycle {
    /// MCP 2026-07-28: no initialize, multi-round.
    Modern,
    /// The initialize lifecycle.
    Initialize,
}

use ClientKind::*;
use Lifecycle::*;
use Transport::*;

macro_rules! matrix {
    (
        both: [$($both:ident = $bc:ident $bt:ident $bl:ident),* $(,)?],
        sqlite: [$($only:ident = $sc:ident $st:ident $sl:ident),* $(,)?] $(,)?
    ) => {
        mod sqlite {
            use super::*;
            $( #[test] fn $both() { story(Db::sqlite(), $bc, $bt, $bl); } )*
            $( #[test] fn $only() { story(Db::sqlite(), $sc, $st, $sl); } )*
        }
        mod postgres {
            use super::*;
            $(
                #[test]
                fn $both() {
                    if let Some(db) = Db::postgres() {
                        story(db, $bc, $bt, $bl);
                    }
                }
            )*
        }
    };
}

matrix! {
    both: [
        python_client_stdio_2026_07_28 = PythonClient Stdio Modern,
        python_client_stdio_initialize = PythonClient Stdio Initialize,
        python_client_http_2026_07_28 = PythonClient Http Modern,
        python_client_http_initialize = PythonClient Http Initialize,
        typescript_v2_stdio_2026_07_28 = TypeScriptV2 Stdio Modern,
        typescript_v2_stdio_initialize = TypeScriptV2 Stdio Initialize,
        typescript_v2_http_2026_07_28 = TypeScriptV2 Http Modern,
        typescript_v2_http_initialize = TypeScriptV2 Http Initialize,
    ],
    sqlite: [
        python_session_stdio_2026_07_28 = PythonSession Stdio Modern,
        python_session_stdio_initialize = PythonSession Stdio Initialize,
        python_session_http_2026_07_28 = PythonSession Http Modern,
        python_session_http_initialize = PythonSession Http Initialize,
        typescript_v1_stdio_initialize = TypeScriptV1 Stdio Initialize,
        typescript_v1_http_initialize = TypeScriptV1 Http Initialize,
        inspector_stdio_2026_07_28 = Inspector Stdio Modern,
        inspector_stdio_initialize = Inspector Stdio Initialize,
        inspector_http_2026_07_28 = Inspector Http Modern,
        inspector_http_initialize = Inspector Http Initialize,
    ],
}

// ---------------------------------------------------------------------------------------
// The clients' interpreters and scripts.

use support::clients::{node, python, repo};

/// The interpreter and script of `client`, or `None` when the interpreter is not configured.
fn program(client: ClientKind) -> Option<(PathBuf, PathBuf)> {
    let py = |script: &str| {
        Some((
            python()?,
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/py")
                .join(script),
        ))
    };
    let js = |script: &str| Some((node()?, repo().join("tests/js/interop").join(script)));
    match client {
        PythonClient => py("interop_client.py"),
        PythonSession => py("interop_session.py"),
        TypeScriptV2 => js("ts-v2.mjs"),
        TypeScriptV1 => js("ts-v1.mjs"),
        Inspector => js("inspector.mjs"),
    }
}

// ---------------------------------------------------------------------------------------
// Setting up the ledger: principals, an order, approvals, an unavailable payments service.

/// The `--db` path of `db`'s flags (with PostgreSQL it only places the payments stand-in).
fn ledger_path(db: &Db) -> PathBuf {
    let args = db.store_args();
    let i = args.iter().position(|a| a == "--db").expect("a --db flag");
    PathBuf::from(&args[i + 1])
}

/// The payments stand-in's own file, beside the ledger's `--db` path.
fn payments(db: &Db) -> PathBuf {
    toolledger_reference::refunds::default_downstream_path(&ledger_path(db))
}

/// Creates the payments stand-in's file and makes it refuse every receipt committed before
/// [`PAYMENTS_BACK_AT`]: a delivery at the servers' clock fails (the service is
/// unavailable), the worker's delivery later succeeds.
fn payments_unavailable_until_later(db: &Db) {
    let path = payments(db);
    let clock = std::sync::Arc::new(toolledger::clock::ManualClock::new(NOW));
    drop(toolledger_testkit::downstream::SqliteDownstream::open(&path, clock).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(&format!(
        "CREATE TRIGGER payments_down BEFORE INSERT ON downstream_receipts
         WHEN NEW.committed_at < {PAYMENTS_BACK_AT}
         BEGIN SELECT RAISE(ABORT, 'payments service unavailable'); END;"
    ))
    .unwrap();
}

fn payments_receipts(db: &Db) -> i64 {
    toolledger_testkit::db::sqlite_count(&payments(db), "downstream_receipts")
}

fn draft_payload() -> Value {
    json!({"slug": "interop-draft", "title": "Interop", "text": "draft text", "kind": "article"})
}

// ---------------------------------------------------------------------------------------
// The HTTP server.

struct HttpServer {
    child: Child,
    url: String,
}

impl HttpServer {
    fn start(db: &Db) -> HttpServer {
        let args = ["--http", "127.0.0.1:0", "--clock-epoch", &NOW.to_string()].map(String::from);
        let mut child = serve_command(db, &args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (url, _) = wait_listening(child.stderr.take().unwrap());
        HttpServer { child, url }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// One client run.

fn env_object(pairs: Vec<(&'static str, &'static str)>) -> Value {
    Value::Object(
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_string(), Value::from(v)))
            .collect(),
    )
}

/// Runs `interpreter script spec` (at most [`CLIENT_LIMIT`]); its stdout as JSON.
fn run_client(interpreter: &Path, script: &Path, spec: &Value) -> Value {
    let mut child = Command::new(interpreter)
        .arg(script)
        .arg(spec.to_string())
        .current_dir(script.parent().unwrap())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a client stopped for hanging takes its servers along.
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("{} does not start: {e}", interpreter.display()));
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).map(|_| s)
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).map(|_| s)
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > CLIENT_LIMIT {
            // SAFETY: signalling the process group of our own child.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out.join().unwrap().unwrap_or_default();
    let stderr = err.join().unwrap().unwrap_or_default();
    let tail = |s: &str| {
        s.chars()
            .rev()
            .take(4000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<String>()
    };
    let Some(status) = status else {
        panic!(
            "{} did not finish and was stopped; stderr:\n{}",
            script.display(),
            tail(&stderr)
        );
    };
    assert!(
        status.success(),
        "{} failed ({status}); stderr:\n{}",
        script.display(),
        tail(&stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "{} printed no JSON object ({e}): {stdout:?}; stderr:\n{}",
            script.display(),
            tail(&stderr)
        )
    })
}

// ---------------------------------------------------------------------------------------
// The story and its checks.

/// The failed checks of one combination, reported together.
struct Checks {
    label: String,
    failed: Vec<String>,
}

impl Checks {
    fn eq(&mut self, case: &str, got: &Value, want: Value) {
        if *got != want {
            self.failed
                .push(format!("{case}: got {got}\n    want {want}"));
        }
    }

    fn that(&mut self, case: &str, ok: bool, got: &Value, what: &str) {
        if !ok {
            self.failed.push(format!("{case}: {what}; got {got}"));
        }
    }

    fn finish(self) {
        if !self.failed.is_empty() {
            panic!(
                "{}: {} failed check(s):\n  - {}",
                self.label,
                self.failed.len(),
                self.failed.join("\n  - ")
            );
        }
    }
}

fn ok(structured: Value) -> Value {
    json!({"isError": false, "structured": structured})
}

fn issue(replayed: bool) -> Value {
    ok(
        json!({"operationId": "iss-1", "effectId": 1, "result": "created 1",
              "replayed": replayed, "state": "applied"}),
    )
}

/// The code of an error result as the client read it from content[0] (`null` if none).
fn code(seen: &Value) -> &Value {
    &seen["error"]["code"]
}

fn story(db: Db, client: ClientKind, transport: Transport, lifecycle: Lifecycle) {
    let Some((interpreter, script)) = program(client) else {
        return;
    };
    let label = format!(
        "{client:?} over {transport:?}, {lifecycle:?}, {}",
        db.backend()
    );
    add_principal(&db, "ed", "acme", &["approver"], &[], false);
    let token = add_principal(
        &db,
        "alice",
        "acme",
        &["editor"],
        &["automation:write"],
        transport == Http,
    );
    add_order(&db.store(), "acme", "o-1", "alice", 5000);
    // `toolledger approve` by `ed` for alice, valid from NOW.
    let now = NOW.to_string();
    let from_now = ["--now", now.as_str()];
    let draft_approval = approve(&db, "create_draft", "dr-1", &draft_payload(), &from_now);
    let refund_approval = approve(
        &db,
        "refund_order",
        "rf-1",
        &json!({"order_id": "o-1", "amount_cents": 1200}),
        &from_now,
    );
    payments_unavailable_until_later(&db);

    let lifecycle_name = match lifecycle {
        Modern => "2026-07-28",
        Initialize => "legacy",
    };
    let mut worker_args = vec!["worker".to_string(), "--once".into()];
    worker_args.extend(["--clock-epoch".into(), WORKER_AT.to_string()]);
    worker_args.extend(db.store_args());
    let mut spec = json!({
        "transport": match transport { Stdio => "stdio", Http => "http" },
        "lifecycle": lifecycle_name,
        "worker": {"command": bin(), "args": worker_args, "env": env_object(db.key_env())},
        "approvals": {"draft": draft_approval, "refund": refund_approval},
    });
    let http = (transport == Http).then(|| HttpServer::start(&db));
    match &http {
        Some(server) => {
            spec["url"] = json!(server.url);
            spec["token"] = json!(token.expect("a bearer token"));
        }
        None => {
            let args = serve_args(&db, "alice", &["--clock-epoch", &NOW.to_string()]);
            spec["server"] = json!({"command": bin(), "args": args,
                                    "env": env_object(db.key_env())});
        }
    }

    let v = run_client(&interpreter, &script, &spec);
    drop(http);
    let mut c = Checks {
        label,
        failed: Vec::new(),
    };

    // tools/list: every tool, with object schemas the client accepted.
    let listed = &v["tools_list"];
    let mut names: Vec<&str> = listed
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    names.sort_unstable();
    let mut want: Vec<&str> = TOOLS.to_vec();
    want.sort_unstable();
    c.that("tools_list", names == want, listed, "all six tools");
    for tool in TOOLS {
        c.eq(
            &format!("tools_list.{tool}"),
            &listed[tool],
            json!({"input": "object", "output": "object"}),
        );
    }

    // create_issue through the client's own round handling.
    let multi_round = client != Inspector;
    if multi_round {
        if client == PythonSession && lifecycle == Modern {
            c.eq(
                "create_issue_first_round",
                &v["create_issue_first_round"],
                json!({"resultType": "input_required", "inputRequestKeys": ["body"],
                       "hasRequestState": true}),
            );
            c.eq("create_issue", &v["create_issue"], issue(false));
            c.eq(
                "create_issue_continuation_replay",
                &v["create_issue_continuation_replay"],
                issue(true),
            );
            c.eq(
                "create_issue_restart_without_state",
                &v["create_issue_restart_without_state"],
                json!({"first": issue(true)}),
            );
            let tampered = &v["tampered_request_state"];
            c.that(
                "tampered_request_state",
                tampered["jsonrpcError"]["code"] == -32602
                    && tampered["jsonrpcError"]["data"]["code"] == "request_state_invalid",
                tampered,
                "a JSON-RPC error -32602 with data.code request_state_invalid",
            );
        } else {
            c.eq("create_issue", &v["create_issue"], issue(false));
            c.eq("create_issue_again", &v["create_issue_again"], issue(true));
        }
    }
    let undeclared = &v["create_issue_without_elicitation"];
    c.that(
        "create_issue_without_elicitation",
        undeclared["isError"] == true && *code(undeclared) == "continuation_unsupported",
        undeclared,
        "an error result continuation_unsupported",
    );

    // The TypeScript SDKs end an initialize-lifecycle HTTP session with DELETE.
    if matches!(client, TypeScriptV2 | TypeScriptV1) && transport == Http && lifecycle == Initialize
    {
        c.eq(
            "http_session_termination",
            &v["http_session_termination"],
            json!({"hadSession": true, "terminated": true}),
        );
    }

    // Automations: fresh, replayed, stale version.
    let a = &v["automations"];
    let id = a["created"]["structured"]["id"].clone();
    c.that("automations.created", id.is_i64(), a, "an automation id");
    c.eq(
        "automations.created",
        &a["created"],
        ok(json!({"id": id, "interval_minutes": 30, "version": 1, "replayed": false})),
    );
    c.eq(
        "automations.set_interval",
        &a["updated"],
        ok(json!({"id": id, "interval_minutes": 60, "version": 2, "replayed": false})),
    );
    c.eq(
        "automations.set_interval_again",
        &a["again"],
        ok(json!({"id": id, "interval_minutes": 60, "version": 2, "replayed": true})),
    );
    c.that(
        "automations.stale_version",
        a["stale"]["isError"] == true && *code(&a["stale"]) == "version_conflict",
        &a["stale"],
        "an error result version_conflict read from content[0]",
    );

    // Drafts: without and with approval.
    let d = &v["drafts"];
    c.that(
        "drafts.without_approval",
        d["without_approval"]["isError"] == true
            && *code(&d["without_approval"]) == "approval_required",
        &d["without_approval"],
        "an error result approval_required",
    );
    c.eq(
        "drafts.approved",
        &d["first"],
        ok(json!({"slug": "interop-draft", "draft": true, "replayed": false})),
    );
    c.eq(
        "drafts.approved_again",
        &d["again"],
        ok(json!({"slug": "interop-draft", "draft": true, "replayed": true})),
    );

    // The refund: outcome_unknown, status, the worker delivers, status, replay.
    let r = &v["refund"];
    let first = &r["first"];
    let status_ref = first["error"]["status_ref"].clone();
    c.that(
        "refund.outcome_unknown",
        first["isError"] == true
            && *code(first) == "outcome_unknown"
            && status_ref.as_str().is_some_and(|s| s.starts_with("op_"))
            && first["structured"]["code"] == "OUTCOME_UNKNOWN"
            && first["structured"]["status_ref"] == status_ref,
        first,
        "an error result outcome_unknown naming its status_ref, structuredContent the reply",
    );
    c.that(
        "refund.status_before_delivery",
        r["status_before"]["isError"] == false
            && r["status_before"]["structured"]["state"] == "unknown"
            && r["status_before"]["structured"]["operationId"] == "rf-1",
        &r["status_before"],
        "state unknown",
    );
    c.that(
        "refund.worker",
        r["worker"]["exit"] == 0 && r["worker"]["report"]["delivered"] == 1,
        &r["worker"],
        "one delivery",
    );
    c.that(
        "refund.status_after_delivery",
        r["status_after"]["isError"] == false
            && r["status_after"]["structured"]["state"] == "succeeded",
        &r["status_after"],
        "state applied",
    );
    let again = &r["again"]["structured"];
    c.that(
        "refund.replay",
        r["again"]["isError"] == false
            && again["code"] == "OK"
            && again["delivery"] == "local_replay"
            && again["status"] == "succeeded"
            && again["status_ref"] == status_ref,
        &r["again"],
        "OK, local_replay, succeeded, the same status_ref",
    );

    // get_operation_status for every write tool's operation.
    for op in ["iss-1", "auto-1", "si-1", "dr-1", "rf-1"] {
        let st = &v["status"][op];
        // The ledger's own word: an inline effect is `applied`, the deferred refund
        // `succeeded`.
        let want = if op == "iss-1" && !multi_round {
            "unknown"
        } else if op == "rf-1" {
            "succeeded"
        } else {
            "applied"
        };
        c.that(
            &format!("status.{op}"),
            st["isError"] == false
                && st["structured"]["operationId"] == op
                && st["structured"]["state"] == want
                && st["structured"]["freshWriteAuthorized"] == false,
            st,
            &format!("state {want}"),
        );
    }

    // The rows: one operation and one effect row per operation id, none for refused calls.
    let mut written = vec!["auto-1", "si-1", "dr-1", "rf-1"];
    if multi_round {
        written.push("iss-1");
    }
    for op in &written {
        let n = scalar(
            &db,
            &format!("SELECT count(*) FROM operations WHERE idempotency_key = '{op}'"),
        );
        c.that(
            &format!("rows.operations.{op}"),
            n == 1,
            &json!(n),
            "exactly one ledger row",
        );
    }
    for op in ["iss-nocap", "iss-t", "si-2", "dr-0"] {
        let n = scalar(
            &db,
            &format!("SELECT count(*) FROM operations WHERE idempotency_key = '{op}'"),
        );
        c.that(
            &format!("rows.operations.{op}"),
            n == 0,
            &json!(n),
            "no ledger row",
        );
    }
    let total = count(&db, "operations");
    c.that(
        "rows.operations",
        total == written.len() as i64,
        &json!(total),
        &format!("{} ledger rows", written.len()),
    );
    let issues = i64::from(multi_round);
    let n = scalar(
        &db,
        "SELECT count(*) FROM issues WHERE operation_key = 'iss-1' AND body = 'alpha'",
    );
    c.that(
        "rows.issues.iss-1",
        n == issues,
        &json!(n),
        "the issue once",
    );
    let n = count(&db, "issues");
    c.that("rows.issues", n == issues, &json!(n), "no other issue");
    let n = count(&db, "automations");
    c.that("rows.automations", n == 1, &json!(n), "one automation");
    let n = scalar(
        &db,
        "SELECT count(*) FROM automations WHERE version = 2 AND interval_minutes = 60",
    );
    c.that(
        "rows.automations.set_interval",
        n == 1,
        &json!(n),
        "version 2, 60 minutes (the stale update wrote nothing)",
    );
    let n = count(&db, "drafts");
    c.that("rows.drafts", n == 1, &json!(n), "one draft");
    let n = scalar(
        &db,
        "SELECT count(*) FROM approvals WHERE consumed_at IS NOT NULL",
    );
    c.that(
        "rows.approvals",
        n == 2,
        &json!(n),
        "both approvals consumed once",
    );
    let n = payments_receipts(&db);
    c.that(
        "rows.payments_receipts",
        n == 1,
        &json!(n),
        "one refund at the payments service",
    );
    c.finish();
}
