//! Seed 004's editorial drafts: `create_draft {operation, slug, title, text, kind, approval}`.
//!
//! - The caller must hold the role `editor` now (checked first, on every call, replays too).
//! - A new draft needs a human approval issued by `toolledger approve --tool create_draft`,
//!   bound to the requester, the operation and the digest of `{slug, title, text, kind}`; it is
//!   consumed in the same transaction that writes the draft and the ledger row, so a refused or
//!   rolled-back call leaves it unused. Missing → `approval_required`; unknown, expired,
//!   changed or used → `approval_invalid`.
//! - The operation id decides redelivery: the same operation with the same payload replays
//!   `{slug, draft: true, replayed: true}` (never the text), even after the approval was used
//!   or has expired; the same operation with another payload is `operation_conflict`.
//! - The slug decides the document: another operation for an existing slug is refused
//!   (`business_state_changed`) and never overwrites it.
//!
//! Table (namespace `reference.drafts`): `drafts`.

use std::sync::Arc;

use rmcp::model::{CallToolResponse, Tool, ToolAnnotations};
use serde_json::{json, Map, Value};
use toolledger::approval::{self, ApprovalTarget};
use toolledger::authz;
use toolledger::digest::sha256_hex;
use toolledger::effect::RowExt;
use toolledger::effect::{EffectTx, SqlValue};
use toolledger::engine::{InlineEffect, OperationRecord};
use toolledger::model::{Error, ErrorCode, Principal, ToolContract};
use toolledger::store::Migration;
use toolledger::store::Store;
use toolledger_mcp::guard::{operation_id_from, GuardedRequest};
use toolledger_mcp::reply::tool_result;
use toolledger_mcp::server::{BoxFuture, McpTool, ToolCall};
use toolledger_mcp::status::{EffectObserver, Observation};
use toolledger_mcp::Guard;

/// The drafts table.
pub const MIGRATIONS: &[Migration] = &[Migration {
    namespace: "reference.drafts",
    version: 1,
    sql: "
CREATE TABLE drafts (
    id             INTEGER PRIMARY KEY,
    tenant         TEXT    NOT NULL CHECK (length(tenant) BETWEEN 1 AND 128),
    subject        TEXT    NOT NULL CHECK (length(subject) BETWEEN 1 AND 128),
    operation      TEXT    NOT NULL CHECK (length(operation) BETWEEN 1 AND 256),
    slug           TEXT    NOT NULL CHECK (length(slug) BETWEEN 1 AND 64),
    title          TEXT    NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
    text           TEXT    NOT NULL CHECK (length(text) BETWEEN 1 AND 20000),
    kind           TEXT    NOT NULL CHECK (kind IN ('article', 'note', 'page')),
    payload_digest TEXT    NOT NULL CHECK (length(payload_digest) = 64),
    approval_id    TEXT    NOT NULL REFERENCES approvals(approval_id),
    created_at     INTEGER NOT NULL,
    UNIQUE (tenant, slug),
    UNIQUE (tenant, subject, operation)
) STRICT;
",
}];

/// The tool name.
pub const TOOL: &str = "create_draft";

/// The role a caller needs.
pub const EDITOR_ROLE: &str = "editor";

/// The contract (all revisions `1`).
pub fn contract() -> ToolContract {
    ToolContract::uniform(TOOL, "1")
}

/// Validated arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraftArgs {
    /// Operation id (idempotency key).
    pub operation: String,
    /// The draft's name in the library.
    pub slug: String,
    /// Title.
    pub title: String,
    /// Full text.
    pub text: String,
    /// `article`, `note` or `page`.
    pub kind: String,
    /// Approval id from `toolledger approve`.
    pub approval: Option<String>,
}

impl DraftArgs {
    /// The payload the operation and the approval are bound to.
    pub fn payload(&self) -> Value {
        json!({"slug": self.slug, "title": self.title, "text": self.text, "kind": self.kind})
    }

    /// SHA-256 of the canonical payload.
    pub fn payload_digest(&self) -> Result<String, Error> {
        let text = toolledger::json::canonical_string(&self.payload())
            .map_err(|e| Error::invalid(e.message))?;
        Ok(sha256_hex(text.as_bytes()))
    }
}

fn text_field(args: &Map<String, Value>, name: &str, max: usize) -> Result<String, Error> {
    match args.get(name) {
        Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= max => Ok(s.clone()),
        Some(Value::String(_)) => Err(Error::invalid(format!(
            "{name} must be 1 to {max} characters"
        ))),
        Some(_) => Err(Error::invalid(format!("{name} must be a string"))),
        None => Err(Error::invalid(format!("{name} is required"))),
    }
}

/// Validates `create_draft`'s arguments (the approval is optional here; the effect asks for
/// it when a new draft would be written).
pub fn parse_args(args: &Map<String, Value>) -> Result<DraftArgs, Error> {
    const KNOWN: [&str; 6] = ["operation", "slug", "title", "text", "kind", "approval"];
    if let Some(k) = args.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(Error::invalid(format!("unknown argument {k}")));
    }
    let operation = operation_id_from(args, "operation")?.to_string();
    let slug = text_field(args, "slug", 64)?;
    if !slug
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(Error::invalid("slug may contain only a-z, 0-9 and -"));
    }
    let title = text_field(args, "title", 200)?;
    let text = text_field(args, "text", 20_000)?;
    let kind = text_field(args, "kind", 16)?;
    if !matches!(kind.as_str(), "article" | "note" | "page") {
        return Err(Error::invalid("kind must be article, note or page"));
    }
    let approval = match args.get("approval") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 128 => Some(s.clone()),
        Some(_) => return Err(Error::invalid("approval must be a string")),
    };
    Ok(DraftArgs {
        operation,
        slug,
        title,
        text,
        kind,
        approval,
    })
}

/// What an approval for `create_draft` binds: the requester's scope for `operation` and the
/// digest of the payload `{slug, title, text, kind}` given in `arguments`.
pub fn approval_target_for(
    requester: &Principal,
    operation: &str,
    arguments: &Value,
) -> Result<ApprovalTarget, Error> {
    let mut map = match arguments {
        Value::Object(m) => m.clone(),
        _ => return Err(Error::invalid("arguments must be an object")),
    };
    map.remove("approval");
    map.insert("operation".into(), json!(operation));
    let args = parse_args(&map)?;
    target(requester, &args)
}

fn target(requester: &Principal, args: &DraftArgs) -> Result<ApprovalTarget, Error> {
    Ok(ApprovalTarget {
        tenant: requester.tenant.clone(),
        subject: requester.subject.clone(),
        tool: TOOL.into(),
        idempotency_key: args.operation.clone(),
        binding: json!({"operation": args.operation, "payload_digest": args.payload_digest()?}),
    })
}

/// The inline effect: consume the approval, then insert the draft.
struct InsertDraft {
    args: DraftArgs,
    now: i64,
}

impl InlineEffect for InsertDraft {
    fn apply(&self, tx: &mut dyn EffectTx, principal: &Principal) -> Result<Value, Error> {
        let expected = target(principal, &self.args)?;
        let mut resolve = |tx: &mut dyn EffectTx, name: &str| authz::resolve_in(tx, name);
        let approval = approval::consume(
            tx,
            self.args.approval.as_deref(),
            &expected,
            self.now,
            None,
            &mut resolve,
        )?;
        let taken = tx.query(
            "SELECT 1 FROM drafts WHERE tenant = ?1 AND slug = ?2",
            &[
                principal.tenant.clone().into(),
                self.args.slug.clone().into(),
            ],
        )?;
        if !taken.is_empty() {
            return Err(Error::new(
                ErrorCode::BusinessStateChanged,
                "a draft with this slug already exists; it is never overwritten",
            ));
        }
        tx.execute(
            "INSERT INTO drafts(tenant, subject, operation, slug, title, text, kind,
                 payload_digest, approval_id, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            &[
                principal.tenant.clone().into(),
                principal.subject.clone().into(),
                self.args.operation.clone().into(),
                self.args.slug.clone().into(),
                self.args.title.clone().into(),
                self.args.text.clone().into(),
                self.args.kind.clone().into(),
                self.args.payload_digest()?.into(),
                SqlValue::Text(approval.approval_id),
                self.now.into(),
            ],
        )?;
        Ok(json!({"slug": self.args.slug, "draft": true}))
    }
}

/// `create_draft` under the guard.
pub struct CreateDraft {
    guard: Guard,
}

impl CreateDraft {
    /// The tool over `guard`.
    pub fn new(guard: Guard) -> Self {
        CreateDraft { guard }
    }

    async fn handle(&self, call: ToolCall) -> Result<Value, Error> {
        if !call.caller.principal.has_role(EDITOR_ROLE) {
            return Err(Error::denied("create_draft needs the role editor"));
        }
        if call.request_state.is_some() || call.input_responses.is_some() {
            return Err(Error::new(
                ErrorCode::ContinuationUnsupported,
                "create_draft has a single round",
            ));
        }
        let args = parse_args(&call.arguments)?;
        // The approval is consumed by the first write; it is not part of the intent, so an
        // exact retry replays even after its approval was used or has expired.
        let mut fingerprinted = call.arguments.clone();
        fingerprinted.remove("approval");
        let contract = contract();
        let request = GuardedRequest {
            caller: &call.caller,
            contract: &contract,
            operation_id: &args.operation,
            arguments: &fingerprinted,
        };
        let effect = Arc::new(InsertDraft {
            args: args.clone(),
            now: self.guard.clock().now(),
        });
        let outcome = self.guard.run(&request, args.payload(), effect).await?;
        Ok(json!({
            "slug": outcome.result.get("slug").cloned().unwrap_or(Value::Null),
            "draft": true,
            "replayed": outcome.replayed,
        }))
    }
}

fn input_schema() -> Map<String, Value> {
    match json!({
        "type": "object",
        "properties": {
            "operation": {"type": "string", "minLength": 1, "maxLength": 256,
                "description": "Stable id of this intent; reuse it on every retry"},
            "slug": {"type": "string", "pattern": "^[a-z0-9-]{1,64}$"},
            "title": {"type": "string", "minLength": 1, "maxLength": 200},
            "text": {"type": "string", "minLength": 1, "maxLength": 20000},
            "kind": {"type": "string", "enum": ["article", "note", "page"]},
            "approval": {"type": "string",
                "description": "Approval id issued by `toolledger approve --tool create_draft`"},
        },
        "required": ["operation", "slug", "title", "text", "kind"],
        "additionalProperties": false,
    }) {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

impl McpTool for CreateDraft {
    fn definition(&self) -> Tool {
        Tool::new(
            TOOL,
            "Create an editorial draft (role editor, approval required). The same operation \
             with the same payload replays {slug, draft, replayed}; never the text.",
            Arc::new(input_schema()),
        )
        .with_annotations(
            ToolAnnotations::new()
                .read_only(false)
                .destructive(false)
                .idempotent(true)
                .open_world(false),
        )
    }

    fn call(&self, call: ToolCall) -> BoxFuture<'_, CallToolResponse> {
        Box::pin(async move { CallToolResponse::Complete(tool_result(self.handle(call).await)) })
    }
}

/// Reads the draft an operation wrote, for `get_operation_status` (never shows the text).
pub struct DraftObserver {
    store: Store,
}

impl DraftObserver {
    /// An observer over `store`.
    pub fn new(store: Store) -> Self {
        DraftObserver { store }
    }
}

impl EffectObserver for DraftObserver {
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
            let rows: Vec<(i64, String)> = self
                .store
                .read(
                    move |tx: &mut dyn EffectTx| -> Result<Vec<(i64, String)>, Error> {
                        let params: Vec<_> = args.iter().map(|a| a.as_str().into()).collect();
                        tx.query(
                            "SELECT id, slug FROM drafts WHERE tenant = ?1 AND subject = ?2
                           AND operation = ?3 ORDER BY id",
                            &params,
                        )?
                        .iter()
                        .map(|row| Ok((row.int(0)?, row.text(1)?)))
                        .collect()
                    },
                )
                .await?;
            let stored_slug = record
                .result
                .as_ref()
                .and_then(|r| r.get("slug"))
                .and_then(Value::as_str);
            let consistent = rows.len() == 1 && stored_slug == Some(rows[0].1.as_str());
            Ok(Observation {
                matching_ids: rows.iter().map(|r| r.0).collect(),
                consistent,
                stored_result: record.result.clone().unwrap_or(Value::Null),
            })
        })
    }
}
