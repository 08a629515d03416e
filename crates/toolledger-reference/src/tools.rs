//! The tool registry of `toolledger serve`: which reference tools the server offers, and the
//! fault points (a testing aid) they honour.

use std::sync::Arc;

use rmcp::handler::server::tool::{IntoCallToolResult, ToolRouter};
use rmcp::model::{CallToolResponse, ErrorData, Tool};
use rmcp::{tool, tool_router};
use serde_json::Value;
use toolledger::authz::PrincipalStore;
use toolledger::engine::{FaultHook, FaultPoint};
use toolledger::model::Error;
use toolledger::runtime::Runtime;
use toolledger_mcp::deferred::DeferredAdapter;
use toolledger_mcp::internal::{tool_error, tool_result};
use toolledger_mcp::status::{EffectObserver, LedgerResultObserver};
use toolledger_mcp::{
    status_router, CallerSource, Guard, Guarded, GuardedServer, LedgerGuard, StatusTool, ToolCall,
};

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

/// The tools `toolledger serve` offers, as ordinary rmcp `#[tool]` methods taking a
/// [`Guarded`] call, in `tools/list` order: `create_issue`, `get_operation_status`,
/// `create_automation`, `set_interval`, `create_draft`, `refund_order`. Each method hands the
/// call to its domain ([`issues`](crate::issues), [`automations`], [`drafts`](crate::drafts),
/// [`refunds`]), which validates its own arguments with the domain's error codes.
#[derive(Clone)]
pub struct ReferenceTools {
    env: ToolEnv,
    issue: Arc<CreateIssue>,
    draft: Arc<CreateDraft>,
    refund: Option<Arc<DeferredAdapter>>,
}

/// The listing order of the reference tools.
const ORDER: &[&str] = &[
    crate::issues::TOOL,
    StatusTool::NAME,
    automations::CREATE_AUTOMATION,
    automations::SET_INTERVAL,
    crate::drafts::TOOL,
    refunds::TOOL,
];

#[tool_router(router = routes)]
impl ReferenceTools {
    #[tool(
        name = "create_issue",
        description = "Create an issue. Asks for the body in a second round (input_required). \
            Retrying with the same operation_id and continuation replays the stored result; \
            after a lost reply call get_operation_status.",
        input_schema = crate::issues::input_schema(),
        output_schema = crate::issues::output_schema(),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn create_issue(&self, g: Guarded) -> Result<CallToolResponse, ErrorData> {
        self.answer(crate::issues::TOOL, g).await
    }

    #[tool(
        name = "create_automation",
        description = "Create an automation with an interval (5-1440 minutes); needs \
            automation:write. Retrying with the same request_id replays the recorded result.",
        input_schema = automation_schema(automations::CREATE_AUTOMATION),
        output_schema = crate::object(automations::output_schema()),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn create_automation(&self, g: Guarded) -> Result<CallToolResponse, ErrorData> {
        self.answer(automations::CREATE_AUTOMATION, g).await
    }

    #[tool(
        name = "set_interval",
        description = "Set an automation's interval (5-1440 minutes) if its version is still \
            expected_version; needs automation:write. Retrying with the same request_id \
            replays the recorded result.",
        input_schema = automation_schema(automations::SET_INTERVAL),
        output_schema = crate::object(automations::output_schema()),
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn set_interval(&self, g: Guarded) -> Result<CallToolResponse, ErrorData> {
        self.answer(automations::SET_INTERVAL, g).await
    }

    #[tool(
        name = "create_draft",
        description = "Create an editorial draft (role editor, approval required). The same \
            operation with the same payload replays {slug, draft, replayed}; never the text.",
        input_schema = crate::drafts::input_schema(),
        output_schema = crate::drafts::output_schema(),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn create_draft(&self, g: Guarded) -> Result<CallToolResponse, ErrorData> {
        self.answer(crate::drafts::TOOL, g).await
    }

    #[tool(
        name = "refund_order",
        description = "Refund (part of) an order you own; needs an approval from `toolledger \
            approve --tool refund_order`. Delivered through the outbox to the payments \
            service. Retrying with the same idempotency_key never refunds twice; an \
            unfinished refund answers OUTCOME_UNKNOWN with its status_ref.",
        input_schema = refund_schema(),
        output_schema = toolledger_mcp::deferred::output_schema(),
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn refund_order(&self, g: Guarded) -> Result<CallToolResponse, ErrorData> {
        self.answer(refunds::TOOL, g).await
    }
}

fn automation_schema(tool: &str) -> Arc<serde_json::Map<String, Value>> {
    crate::object(automations::input_schema(tool).unwrap_or(Value::Null))
}

fn refund_schema() -> Arc<serde_json::Map<String, Value>> {
    crate::object(serde_json::json!({
        "type": "object",
        "properties": {
            "idempotency_key": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$",
                                toolledger_mcp::carriers::KEY_KEYWORD: true},
            "order_id": {"type": "string", "minLength": 1, "maxLength": 64},
            "amount_cents": {"type": "integer", "minimum": 1,
                             "maximum": refunds::MAX_AMOUNT_CENTS},
            "approval": {"type": "string"},
        },
        "required": ["idempotency_key", "order_id", "amount_cents"],
        "additionalProperties": false,
    }))
}

impl ReferenceTools {
    /// The tools over `env`.
    pub fn new(env: ToolEnv) -> Self {
        ReferenceTools {
            issue: Arc::new(CreateIssue::new(
                env.guard.clone(),
                env.faults,
                env.unguarded,
            )),
            draft: Arc::new(CreateDraft::new(env.guard.clone())),
            refund: env.runtime.clone().map(|runtime| {
                let tools = Self::routes();
                let definition = tools.get(refunds::TOOL).cloned();
                let definition = definition.unwrap_or_else(|| {
                    Tool::new(refunds::TOOL, "", Arc::new(serde_json::Map::new()))
                });
                Arc::new(DeferredAdapter::new(
                    runtime,
                    definition,
                    refunds::deferred_arguments,
                ))
            }),
            env,
        }
    }

    /// The tools offered: with `unguarded` only the control (`create_issue` without a
    /// ledger) and `get_operation_status`; `refund_order` only with a runtime.
    fn offered(&self, name: &str) -> bool {
        match name {
            crate::issues::TOOL | StatusTool::NAME => true,
            refunds::TOOL => !self.env.unguarded && self.env.runtime.is_some(),
            _ => !self.env.unguarded,
        }
    }

    fn restrict(&self, routes: &mut ToolRouter<Self>) {
        let names: Vec<String> = routes.map.keys().map(|n| n.to_string()).collect();
        for name in names.iter().filter(|n| !self.offered(n)) {
            routes.remove_route(name);
        }
        if self.env.unguarded {
            // The control keeps no ledger, so a retry repeats the effect.
            if let Some(route) = routes.map.get_mut(crate::issues::TOOL) {
                route.attr.annotations = route.attr.annotations.take().map(|a| a.idempotent(false));
            }
        }
    }

    /// The server `toolledger serve` runs: these tools and `get_operation_status` (with the
    /// issue and draft rows as evidence for their tools, the stored result for the others),
    /// through the ledger's guard with callers from `caller`.
    pub fn server(self, caller: CallerSource) -> GuardedServer<ReferenceTools> {
        let store = self.env.guard.engine().store().clone();
        let ledger =
            LedgerGuard::from_parts(self.env.guard.clone(), self.env.principals.clone(), caller)
                .with_observer(
                    crate::issues::TOOL,
                    Arc::new(IssueObserver::new(store.clone())),
                )
                .with_observer(crate::drafts::TOOL, Arc::new(DraftObserver::new(store)));
        let mut routes = Self::routes() + status_router();
        self.restrict(&mut routes);
        // Each domain checks its own arguments and answers with its own codes.
        let routes = ledger.router_unchecked(routes);
        GuardedServer::new("toolledger", self, routes).with_order(ORDER)
    }

    async fn answer(&self, tool: &str, g: Guarded) -> Result<CallToolResponse, ErrorData> {
        match g.call().await {
            Ok(call) => self.call(tool, call).await,
            Err(refusal) => refusal.into_call_tool_result(),
        }
    }

    /// `get_operation_status` over the offered tools, as the server's: the issue and draft
    /// rows are the evidence for their tools, the stored result for the others.
    fn status(&self) -> StatusTool {
        let store = self.env.guard.engine().store().clone();
        let observed = ORDER
            .iter()
            .filter(|n| **n != StatusTool::NAME && self.offered(n))
            .map(|n| {
                let observer: Arc<dyn EffectObserver> = match *n {
                    crate::issues::TOOL => Arc::new(IssueObserver::new(store.clone())),
                    crate::drafts::TOOL => Arc::new(DraftObserver::new(store.clone())),
                    _ => Arc::new(LedgerResultObserver),
                };
                (n.to_string(), observer)
            })
            .collect();
        StatusTool::new(self.env.guard.clone(), observed)
    }

    /// Runs one call of `tool` (as `toolledger call` does, without a transport); a tool this
    /// server does not offer is `invalid_arguments`.
    pub async fn call(&self, tool: &str, call: ToolCall) -> Result<CallToolResponse, ErrorData> {
        if !self.offered(tool) {
            return Ok(CallToolResponse::Complete(tool_error(&Error::invalid(
                "unknown tool",
            ))));
        }
        match tool {
            StatusTool::NAME => self.status().call(call).await,
            crate::issues::TOOL => self.issue.call(call).await,
            crate::drafts::TOOL => self.draft.call(call).await,
            refunds::TOOL => self.refund(call).await,
            automations::CREATE_AUTOMATION | automations::SET_INTERVAL => Ok(
                CallToolResponse::Complete(tool_result(self.automation(tool, call).await)),
            ),
            _ => Ok(CallToolResponse::Complete(tool_error(&Error::invalid(
                "unknown tool",
            )))),
        }
    }

    async fn automation(&self, tool: &str, call: ToolCall) -> Result<Value, Error> {
        let c = self.env.guard.config();
        let options = automations::ToolOptions {
            authority_ttl: Some(c.authority_ttl),
            retention_ttl: Some(c.retention_ttl),
        };
        // The caller was read from the principal store when the call was extracted.
        automations::run_as(
            self.env.guard.engine(),
            call.caller.principal,
            &call.caller.name,
            tool,
            Value::Object(call.arguments),
            &options,
        )
        .await
        .map(|outcome| automations::reply(&outcome))
    }

    /// `refund_order`: a deferred effect through the outbox to the payments service, by the
    /// deferred-tool adapter of `toolledger-mcp` (the runtime owns the rules; the adapter
    /// carries the call with the caller the server resolved).
    async fn refund(&self, call: ToolCall) -> Result<CallToolResponse, ErrorData> {
        match &self.refund {
            Some(refund) => refund.call(call).await,
            None => Ok(CallToolResponse::Complete(tool_error(&Error::invalid(
                "unknown tool",
            )))),
        }
    }
}
