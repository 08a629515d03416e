//! Seed 003's issue tracker: `create_issue`, a multi-round tool (MCP 2026-07-28
//! `input_required`; under the initialize lifecycle the body is asked for by elicitation)
//! whose continuation commits the ledger row and the issue row in one transaction. With a
//! `watcher`, adding the watcher is a second step; if it fails the issue stays, a compensation
//! is tried, and the operation ends `partial` with every attempt recorded as an operation event.
//!
//! Tables (namespace `reference.issues`): `issues` (ids from 1), `issue_watchers`,
//! `compensations`.

use std::sync::Arc;

use rmcp::model::{
    CallToolResponse, ElicitRequest, ElicitRequestParams, InputRequest, Tool, ToolAnnotations,
};
use rmcp::service::ElicitationMode;
use serde_json::{json, Map, Value};
use toolledger::effect::RowExt;
use toolledger::effect::{EffectTx, SqlValue};
use toolledger::engine::{Begun, InlineEffect, OperationRecord, Outcome};
use toolledger::model::{Error, ErrorCode, OperationState, Principal, ToolContract};
use toolledger::store::Migration;
use toolledger::store::Store;
use toolledger_mcp::guard::{operation_id_from, outcome_json, GuardedRequest};
use toolledger_mcp::reply::{tool_error, tool_ok};
use toolledger_mcp::server::{BoxFuture, McpTool, ToolCall};
use toolledger_mcp::status::{EffectObserver, Observation};
use toolledger_mcp::Guard;

use super::tools::Faults;

/// The issue tables.
pub const MIGRATIONS: &[Migration] = &[Migration {
    namespace: "reference.issues",
    version: 1,
    sql: "
CREATE TABLE issues (
    id            INTEGER PRIMARY KEY,
    tenant        TEXT    NOT NULL CHECK (length(tenant) BETWEEN 1 AND 128),
    subject       TEXT    NOT NULL CHECK (length(subject) BETWEEN 1 AND 128),
    operation_key TEXT    CHECK (operation_key IS NULL OR length(operation_key) BETWEEN 1 AND 256),
    title         TEXT    NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
    body          TEXT    NOT NULL CHECK (length(body) <= 10000),
    created_at    INTEGER NOT NULL
) STRICT;
CREATE INDEX issues_by_operation ON issues(tenant, subject, operation_key);
CREATE TABLE issue_watchers (
    id          INTEGER PRIMARY KEY,
    issue_id    INTEGER NOT NULL REFERENCES issues(id),
    watcher     TEXT    NOT NULL CHECK (length(watcher) BETWEEN 1 AND 128),
    created_at  INTEGER NOT NULL,
    UNIQUE (issue_id, watcher)
) STRICT;
CREATE TABLE compensations (
    id          INTEGER PRIMARY KEY,
    issue_id    INTEGER NOT NULL REFERENCES issues(id),
    action      TEXT    NOT NULL CHECK (length(action) BETWEEN 1 AND 64),
    reason      TEXT    NOT NULL CHECK (length(reason) BETWEEN 1 AND 256),
    created_at  INTEGER NOT NULL
) STRICT;
",
}];

/// The tool name.
pub const TOOL: &str = "create_issue";

/// The contract: all revisions `1.0` (the fingerprint's `tool_version`).
pub fn contract() -> ToolContract {
    ToolContract::uniform(TOOL, "1.0")
}

/// Validated first-round arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssueArgs {
    /// Operation id (idempotency key).
    pub operation_id: String,
    /// Issue title.
    pub title: String,
    /// Optional watcher to add as a second step.
    pub watcher: Option<String>,
}

fn string_field(
    args: &Map<String, Value>,
    name: &str,
    max: usize,
    required: bool,
) -> Result<Option<String>, Error> {
    match args.get(name) {
        None if !required => Ok(None),
        None => Err(Error::invalid(format!("{name} is required"))),
        Some(Value::String(s)) => {
            let n = s.chars().count();
            if n == 0 || n > max {
                Err(Error::invalid(format!(
                    "{name} must be 1 to {max} characters"
                )))
            } else {
                Ok(Some(s.clone()))
            }
        }
        Some(_) => Err(Error::invalid(format!("{name} must be a string"))),
    }
}

/// Validates `create_issue`'s arguments (unknown fields refused).
pub fn parse_args(args: &Map<String, Value>) -> Result<IssueArgs, Error> {
    if let Some(k) = args
        .keys()
        .find(|k| !matches!(k.as_str(), "operation_id" | "title" | "watcher"))
    {
        return Err(Error::invalid(format!("unknown argument {k}")));
    }
    let operation_id = operation_id_from(args, "operation_id")?.to_string();
    let title = string_field(args, "title", 200, true)?.unwrap_or_default();
    let watcher = string_field(args, "watcher", 128, false)?;
    Ok(IssueArgs {
        operation_id,
        title,
        watcher,
    })
}

/// The body from `inputResponses.body = {action: "accept", content: {body}}`.
pub fn parse_body(input_responses: &Value) -> Result<String, Error> {
    let answer = input_responses
        .get("body")
        .ok_or_else(|| Error::invalid("inputResponses.body is required"))?;
    if answer.get("action").and_then(Value::as_str) != Some("accept") {
        return Err(Error::invalid(
            "the body request was not accepted; nothing was created",
        ));
    }
    match answer.get("content").and_then(|c| c.get("body")) {
        Some(Value::String(s)) if s.chars().count() <= 10_000 => Ok(s.clone()),
        Some(Value::String(_)) => Err(Error::invalid("body must be at most 10000 characters")),
        _ => Err(Error::invalid(
            "inputResponses.body.content.body must be a string",
        )),
    }
}

fn body_request() -> Result<InputRequest, Error> {
    let schema = serde_json::from_value(json!({
        "type": "object",
        "properties": {"body": {"type": "string", "description": "Issue body"}},
        "required": ["body"],
    }))
    .map_err(|_| Error::unavailable("elicitation schema"))?;
    Ok(InputRequest::Elicitation(ElicitRequest::new(
        ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: "Provide the issue body".into(),
            requested_schema: schema,
        },
    )))
}

fn insert_issue(
    tx: &mut dyn EffectTx,
    principal: &Principal,
    operation_key: Option<&str>,
    title: &str,
    body: &str,
    now: i64,
) -> Result<i64, Error> {
    let rows = tx.query(
        "INSERT INTO issues(tenant, subject, operation_key, title, body, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING id",
        &[
            principal.tenant.clone().into(),
            principal.subject.clone().into(),
            operation_key.map(str::to_string).into(),
            title.into(),
            body.into(),
            now.into(),
        ],
    )?;
    rows.first()
        .and_then(|r| r.first())
        .and_then(SqlValue::as_i64)
        .ok_or_else(|| Error::unavailable("issue id missing"))
}

fn created(id: i64) -> Value {
    json!({"effectId": id, "result": format!("created {id}")})
}

/// The inline effect: one issue row, bound to its operation.
struct InsertIssue {
    operation_key: String,
    title: String,
    body: String,
    now: i64,
}

impl InlineEffect for InsertIssue {
    fn apply(&self, tx: &mut dyn EffectTx, principal: &Principal) -> Result<Value, Error> {
        let id = insert_issue(
            tx,
            principal,
            Some(&self.operation_key),
            &self.title,
            &self.body,
            self.now,
        )?;
        Ok(created(id))
    }
}

/// `create_issue` under the guard (or, with `unguarded`, with no ledger at all).
pub struct CreateIssue {
    guard: Guard,
    faults: Faults,
    unguarded: bool,
}

impl CreateIssue {
    /// The tool over `guard`; `unguarded` drops the ledger (the control that shows duplicates).
    pub fn new(guard: Guard, faults: Faults, unguarded: bool) -> Self {
        CreateIssue {
            guard,
            faults,
            unguarded,
        }
    }

    fn store(&self) -> &Store {
        self.guard.engine().store()
    }

    async fn handle(&self, call: ToolCall) -> Result<CallToolResponse, Error> {
        let args = parse_args(&call.arguments)?;
        let contract = contract();
        let request = GuardedRequest {
            caller: &call.caller,
            contract: &contract,
            operation_id: &args.operation_id,
            arguments: &call.arguments,
        };
        let (resumed, responses) = match call.request_state.as_deref() {
            Some(state) => {
                let responses = Value::Object(
                    call.input_responses
                        .clone()
                        .unwrap_or_default()
                        .into_iter()
                        .collect(),
                );
                (self.guard.resume(&request, state, &responses)?, responses)
            }
            None if call.input_responses.is_some() => {
                return Err(Error::new(
                    ErrorCode::ContinuationUnsupported,
                    "input responses arrived without the requestState they answer; nothing was \
                     created",
                ));
            }
            None if call.multi_round => {
                let ir = self.guard.first_round(
                    &request,
                    "awaiting-body",
                    vec![("body".into(), body_request()?)],
                )?;
                return Ok(CallToolResponse::InputRequired(ir));
            }
            None => {
                let responses = self.elicit_body(&call).await?;
                (
                    self.guard.elicited(&request, "awaiting-body", &responses)?,
                    responses,
                )
            }
        };
        let body = parse_body(&responses)?;
        let now = self.guard.clock().now();
        if self.unguarded {
            return self.unguarded_effect(&call, &args, &body, now).await;
        }
        let mut intent = json!({"title": args.title, "body": body});
        if let Some(w) = &args.watcher {
            intent["watcher"] = json!(w);
        }
        let effect = Arc::new(InsertIssue {
            operation_key: args.operation_id.clone(),
            title: args.title.clone(),
            body,
            now,
        });
        let outcome = match &args.watcher {
            None => {
                self.guard
                    .run_resumed(&request, &resumed, intent, effect)
                    .await?
            }
            Some(watcher) => {
                match self
                    .guard
                    .begin_resumed(&request, &resumed, intent, effect)
                    .await?
                {
                    Begun::Replayed(o) => o,
                    Begun::Started {
                        operation_id,
                        first_result,
                        ..
                    } => {
                        if self.faults.exit_after_partial_first_commit {
                            std::process::exit(73);
                        }
                        self.watcher_steps(operation_id, first_result, watcher)
                            .await?
                    }
                }
            }
        };
        Ok(CallToolResponse::Complete(tool_ok(outcome_json(
            &args.operation_id,
            &outcome,
        ))))
    }

    /// Under the initialize lifecycle there is no `input_required`: the body is asked for with
    /// an `elicitation/create` request inside the call, when the client declared form
    /// elicitation. Returns the answer shaped like `inputResponses`.
    async fn elicit_body(&self, call: &ToolCall) -> Result<Value, Error> {
        let unsupported = || {
            Error::new(
                ErrorCode::ContinuationUnsupported,
                "create_issue needs a second round for the body: input_required (MCP \
                 2026-07-28) or form elicitation, and this client declared neither",
            )
        };
        let peer = call.peer.as_ref().ok_or_else(unsupported)?;
        if !peer
            .supported_elicitation_modes()
            .contains(&ElicitationMode::Form)
        {
            return Err(unsupported());
        }
        let InputRequest::Elicitation(request) = body_request()? else {
            return Err(unsupported());
        };
        let answer = peer
            .create_elicitation(request.params)
            .await
            .map_err(|_| Error::unavailable("the client did not answer the body request"))?;
        let answer = serde_json::to_value(&answer)
            .map_err(|_| Error::unavailable("the client's answer could not be read"))?;
        Ok(json!({"body": answer}))
    }

    /// The second step (add the watcher) and, if it fails, the compensation; then the
    /// operation is finished `applied` or `partial` with every attempt as an event.
    async fn watcher_steps(
        &self,
        operation_id: i64,
        first_result: Value,
        watcher: &str,
    ) -> Result<Outcome, Error> {
        let issue_id = first_result
            .get("effectId")
            .and_then(Value::as_i64)
            .ok_or_else(|| Error::unavailable("first step result lacks its issue id"))?;
        let now = self.guard.clock().now();
        let mut events = Vec::new();
        let fail_watcher = self.faults.watcher_failure;
        let w = watcher.to_string();
        let added = self
            .store()
            .write(move |tx: &mut dyn EffectTx| -> Result<(), Error> {
                if fail_watcher {
                    return Err(Error::unavailable("watcher service refused the request"));
                }
                tx.execute(
                    "INSERT INTO issue_watchers(issue_id, watcher, created_at) VALUES (?1, ?2, ?3)",
                    &[issue_id.into(), w.as_str().into(), now.into()],
                )
                .map_err(|_| Error::unavailable("the watcher could not be added"))?;
                Ok(())
            })
            .await;
        let state = match added {
            Ok(()) => {
                events.push((
                    "watcher_added".to_string(),
                    json!({"issueId": issue_id, "watcher": watcher}),
                ));
                OperationState::Applied
            }
            Err(e) => {
                events.push((
                    "watcher_failed".to_string(),
                    json!({"issueId": issue_id, "watcher": watcher, "error": e.message}),
                ));
                let fail_comp = self.faults.compensation_failure;
                let compensated = self
                    .store()
                    .write(move |tx: &mut dyn EffectTx| -> Result<i64, Error> {
                        if fail_comp {
                            return Err(Error::unavailable("compensation could not be recorded"));
                        }
                        tx.query_opt(
                            "INSERT INTO compensations(issue_id, action, reason, created_at)
                             VALUES (?1, 'watcher_not_added_notice', 'watcher step failed', ?2)
                             RETURNING id",
                            &[issue_id.into(), now.into()],
                        )
                        .and_then(|row| row.ok_or_else(Error::not_found)?.int(0))
                        .map_err(|_| Error::unavailable("compensation could not be recorded"))
                    })
                    .await;
                match compensated {
                    Ok(id) => events.push((
                        "compensation_applied".to_string(),
                        json!({"issueId": issue_id, "compensationId": id,
                               "action": "watcher_not_added_notice"}),
                    )),
                    Err(e) => events.push((
                        "compensation_failed".to_string(),
                        json!({"issueId": issue_id, "action": "watcher_not_added_notice",
                               "error": e.message}),
                    )),
                }
                OperationState::Partial
            }
        };
        self.guard
            .engine()
            .finish_steps(operation_id, state, first_result, events)
            .await
    }

    /// The control: no ledger, every continuation inserts a new issue.
    async fn unguarded_effect(
        &self,
        call: &ToolCall,
        args: &IssueArgs,
        body: &str,
        now: i64,
    ) -> Result<CallToolResponse, Error> {
        let principal = call.caller.principal.clone();
        let (title, body) = (args.title.clone(), body.to_string());
        let exit_72 = self.faults.exit_after_effect_insert;
        let id = self
            .store()
            .write(move |tx: &mut dyn EffectTx| -> Result<i64, Error> {
                let id = tx
                    .query_opt(
                        "INSERT INTO issues(tenant, subject, operation_key, title, body, created_at)
                         VALUES (?1, ?2, NULL, ?3, ?4, ?5) RETURNING id",
                        &[
                            principal.tenant.as_str().into(),
                            principal.subject.as_str().into(),
                            title.as_str().into(),
                            body.as_str().into(),
                            now.into(),
                        ],
                    )
                    .and_then(|row| row.ok_or_else(Error::not_found)?.int(0))
                    .map_err(|_| Error::unavailable("the issue could not be stored"))?;
                if exit_72 {
                    std::process::exit(72);
                }
                Ok(id)
            })
            .await?;
        if self.faults.drop_after_commit {
            std::process::exit(70);
        }
        let mut out = created(id);
        out["operationId"] = json!(args.operation_id);
        out["replayed"] = json!(false);
        out["state"] = json!("applied");
        Ok(CallToolResponse::Complete(tool_ok(out)))
    }
}

fn input_schema() -> Map<String, Value> {
    match json!({
        "type": "object",
        "properties": {
            "operation_id": {"type": "string", "minLength": 1, "maxLength": 256,
                "description": "Stable id of this logical operation; reuse it on every retry"},
            "title": {"type": "string", "minLength": 1, "maxLength": 200},
            "watcher": {"type": "string", "minLength": 1, "maxLength": 128},
        },
        "required": ["operation_id", "title"],
        "additionalProperties": false,
    }) {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

impl McpTool for CreateIssue {
    fn definition(&self) -> Tool {
        Tool::new(
            TOOL,
            "Create an issue. Asks for the body in a second round (input_required). Retrying \
             with the same operation_id and continuation replays the stored result; after a \
             lost reply call get_operation_status.",
            Arc::new(input_schema()),
        )
        .with_annotations(
            ToolAnnotations::new()
                .read_only(false)
                .destructive(false)
                .idempotent(!self.unguarded)
                .open_world(false),
        )
    }

    fn call(&self, call: ToolCall) -> BoxFuture<'_, CallToolResponse> {
        Box::pin(async move {
            match self.handle(call).await {
                Ok(r) => r,
                Err(e) => CallToolResponse::Complete(tool_error(&e)),
            }
        })
    }
}

/// Reads the issue rows an operation wrote, for `get_operation_status`.
pub struct IssueObserver {
    store: Store,
}

impl IssueObserver {
    /// An observer over `store`.
    pub fn new(store: Store) -> Self {
        IssueObserver { store }
    }
}

impl EffectObserver for IssueObserver {
    fn observe<'a>(
        &'a self,
        record: &'a OperationRecord,
    ) -> BoxFuture<'a, Result<Observation, Error>> {
        Box::pin(async move {
            let args = [
                record.tenant.clone(),
                record.subject.clone(),
                record.key.clone(),
            ];
            let ids: Vec<i64> = self
                .store
                .read(move |tx: &mut dyn EffectTx| -> Result<Vec<i64>, Error> {
                    let params: Vec<_> = args.iter().map(|a| a.as_str().into()).collect();
                    tx.query(
                        "SELECT id FROM issues WHERE tenant = ?1 AND subject = ?2
                           AND operation_key = ?3 ORDER BY id",
                        &params,
                    )?
                    .iter()
                    .map(|row| row.int(0))
                    .collect()
                })
                .await?;
            let stored_id = record
                .result
                .as_ref()
                .and_then(|r| r.get("effectId"))
                .and_then(Value::as_i64);
            let consistent = stored_id.is_some_and(|id| ids == [id]);
            let stored_result = record
                .result
                .as_ref()
                .and_then(|r| r.get("result"))
                .cloned()
                .unwrap_or(Value::Null);
            Ok(Observation {
                matching_ids: ids,
                consistent,
                stored_result,
            })
        })
    }
}
