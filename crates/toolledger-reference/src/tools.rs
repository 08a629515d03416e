//! The tool registry of `toolledger serve`: which reference tools the server offers, and the
//! fault points (a testing aid) they honour.

use std::sync::Arc;

use rmcp::model::{CallToolResponse, ErrorData, Tool, ToolAnnotations};
use serde_json::Value;
use toolledger::authz::PrincipalStore;
use toolledger::engine::{FaultHook, FaultPoint};
use toolledger::runtime::Runtime;
use toolledger_mcp::deferred::{reply_schema, DeferredMcpTool};
use toolledger_mcp::reply::tool_result;
use toolledger_mcp::server::{BoxFuture, McpTool, ToolCall};
use toolledger_mcp::status::{EffectObserver, StatusTool};
use toolledger_mcp::tool::LedgerResultObserver;
use toolledger_mcp::Guard;

use crate::automations;
use crate::drafts::{CreateDraft, DraftObserver};
use crate::issues::{CreateIssue, IssueObserver};
use crate::refunds;

/// A named crash point accepted by `--fault`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Fault {
    /// Exit 70 after COMMIT, before any reply byte.
    DropAfterCommit,
    /// Exit 71 after the ledger row is inserted, before the effect (nothing commits).
    ExitAfterLedgerInsert,
    /// Exit 72 after the effect row is inserted, before COMMIT (nothing commits).
    ExitAfterEffectInsert,
    /// Exit 73 after a multi-step operation's first step committed.
    ExitAfterPartialFirstCommit,
    /// The watcher step of `create_issue` fails.
    WatcherFailure,
    /// The compensation after a failed watcher step fails too.
    CompensationFailure,
}

/// Ends the process at once with `status`: no unwinding, no destructors, nothing printed. Only
/// for the simulated crashes of the fault points, whose exit statuses are documented with each
/// [`Fault`].
pub fn crash(status: i32) -> ! {
    std::process::exit(status)
}

/// The set of faults a server runs with. Faults never fire on a replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// `drop-after-commit` (exit 70).
    pub drop_after_commit: bool,
    /// `exit-after-ledger-insert` (exit 71).
    pub exit_after_ledger_insert: bool,
    /// `exit-after-effect-insert` (exit 72).
    pub exit_after_effect_insert: bool,
    /// `exit-after-partial-first-commit` (exit 73).
    pub exit_after_partial_first_commit: bool,
    /// `watcher-failure`.
    pub watcher_failure: bool,
    /// `compensation-failure`.
    pub compensation_failure: bool,
}

impl Faults {
    /// The set named by `list`.
    pub fn from_list(list: &[Fault]) -> Self {
        let mut f = Faults::default();
        for fault in list {
            match fault {
                Fault::DropAfterCommit => f.drop_after_commit = true,
                Fault::ExitAfterLedgerInsert => f.exit_after_ledger_insert = true,
                Fault::ExitAfterEffectInsert => f.exit_after_effect_insert = true,
                Fault::ExitAfterPartialFirstCommit => f.exit_after_partial_first_commit = true,
                Fault::WatcherFailure => f.watcher_failure = true,
                Fault::CompensationFailure => f.compensation_failure = true,
            }
        }
        f
    }

    /// The engine hook for the ledger's own fault points (fresh calls only).
    pub fn engine_hook(self) -> Option<FaultHook> {
        if !(self.drop_after_commit
            || self.exit_after_ledger_insert
            || self.exit_after_effect_insert)
        {
            return None;
        }
        Some(Arc::new(move |point| match point {
            FaultPoint::AfterLedgerInsert if self.exit_after_ledger_insert => crash(71),
            FaultPoint::AfterEffect if self.exit_after_effect_insert => crash(72),
            FaultPoint::AfterCommit if self.drop_after_commit => crash(70),
            _ => {}
        }))
    }
}

/// Everything the reference tools need.
#[derive(Clone)]
pub struct ToolEnv {
    /// The guard (engine, keys, deadlines).
    pub guard: Guard,
    /// Active faults.
    pub faults: Faults,
    /// Run with no ledger (the control).
    pub unguarded: bool,
    /// The principal store (re-read on every call).
    pub principals: PrincipalStore,
    /// The deferred-effect runtime for `refund_order` (`None`: the tool is not offered).
    pub runtime: Option<Runtime>,
}

/// `refund_order` as served over MCP: a deferred effect through the outbox to the payments
/// service, by the deferred-tool adapter of `toolledger-mcp` (the runtime owns the rules; the
/// adapter carries the call over MCP with the caller the server resolved).
pub fn refund_tool(runtime: Runtime) -> DeferredMcpTool {
    let definition = Tool::new(
        refunds::TOOL,
        "Refund (part of) an order you own; needs an approval from `toolledger approve \
         --tool refund_order`. Delivered through the outbox to the payments service. \
         Retrying with the same idempotency_key never refunds twice; an unfinished refund \
         answers OUTCOME_UNKNOWN with its status_ref.",
        as_object(serde_json::json!({
            "type": "object",
            "properties": {
                "idempotency_key": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"},
                "order_id": {"type": "string", "minLength": 1, "maxLength": 64},
                "amount_cents": {"type": "integer", "minimum": 1,
                                 "maximum": refunds::MAX_AMOUNT_CENTS},
                "approval": {"type": "string"},
            },
            "required": ["idempotency_key", "order_id", "amount_cents"],
            "additionalProperties": false,
        })),
    )
    .with_raw_output_schema(Arc::new(reply_schema()))
    .with_annotations(
        ToolAnnotations::new()
            .read_only(false)
            .destructive(true)
            .idempotent(true)
            .open_world(true),
    );
    DeferredMcpTool::new(runtime, definition, refunds::deferred_arguments)
}

/// An automation tool (`create_automation`, `set_interval`) served over MCP; the
/// domain rules live in [`automations`].
pub struct AutomationTool {
    name: &'static str,
    env: ToolEnv,
}

impl AutomationTool {
    /// The tool `name` (one of [`automations::TOOLS`]).
    pub fn new(name: &'static str, env: ToolEnv) -> Self {
        AutomationTool { name, env }
    }
}

fn as_object(v: Value) -> Arc<serde_json::Map<String, Value>> {
    Arc::new(match v {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    })
}

impl McpTool for AutomationTool {
    fn definition(&self) -> Tool {
        let (description, destructive) = if self.name == automations::SET_INTERVAL {
            (
                "Set an automation's interval (5-1440 minutes) if its version is still \
                 expected_version; needs automation:write. Retrying with the same request_id \
                 replays the recorded result.",
                true,
            )
        } else {
            (
                "Create an automation with an interval (5-1440 minutes); needs \
                 automation:write. Retrying with the same request_id replays the recorded result.",
                false,
            )
        };
        Tool::new(
            self.name,
            description,
            as_object(automations::input_schema(self.name).unwrap_or(Value::Null)),
        )
        .with_raw_output_schema(as_object(automations::output_schema()))
        .with_annotations(
            ToolAnnotations::new()
                .read_only(false)
                .destructive(destructive)
                .idempotent(true)
                .open_world(false),
        )
    }

    fn call(&self, call: ToolCall) -> BoxFuture<'_, Result<CallToolResponse, ErrorData>> {
        Box::pin(async move {
            let c = self.env.guard.config();
            let options = automations::ToolOptions {
                authority_ttl: Some(c.authority_ttl),
                retention_ttl: Some(c.retention_ttl),
            };
            let result = automations::call_tool_with(
                self.env.guard.engine(),
                &self.env.principals,
                &call.caller.name,
                self.name,
                Value::Object(call.arguments),
                &options,
            )
            .await;
            Ok(CallToolResponse::Complete(tool_result(result)))
        })
    }
}

/// The reference server's tools, in `tools/list` order. With `unguarded` only the control
/// (`create_issue` without a ledger) and `get_operation_status` are offered.
/// `get_operation_status` answers for every guarded tool offered: with the issue and draft
/// rows as evidence for their tools, with the stored result for the others.
pub fn registry(env: &ToolEnv) -> Vec<Arc<dyn McpTool>> {
    let store = env.guard.engine().store().clone();
    let mut observed: Vec<(String, Arc<dyn EffectObserver>)> = vec![(
        crate::issues::TOOL.to_string(),
        Arc::new(IssueObserver::new(store.clone())),
    )];
    let mut tools: Vec<Arc<dyn McpTool>> = vec![Arc::new(CreateIssue::new(
        env.guard.clone(),
        env.faults,
        env.unguarded,
    ))];
    // The control runs without a ledger; tools that only exist with one are not offered.
    if !env.unguarded {
        for name in [automations::CREATE_AUTOMATION, automations::SET_INTERVAL] {
            tools.push(Arc::new(AutomationTool::new(name, env.clone())));
            observed.push((name.to_string(), Arc::new(LedgerResultObserver)));
        }
        tools.push(Arc::new(CreateDraft::new(env.guard.clone())));
        observed.push((
            crate::drafts::TOOL.to_string(),
            Arc::new(DraftObserver::new(store)),
        ));
        if let Some(runtime) = &env.runtime {
            tools.push(Arc::new(refund_tool(runtime.clone())));
            observed.push((refunds::TOOL.to_string(), Arc::new(LedgerResultObserver)));
        }
    }
    tools.insert(1, Arc::new(StatusTool::new(env.guard.clone(), observed)));
    tools
}
