//! The tool registry of `toolledger serve`: which reference tools the server offers, and the
//! fault points (a testing aid) they honour.

use std::sync::Arc;

use rmcp::handler::server::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResponse, CallToolResult, ErrorData};
use rmcp::{tool, tool_router};
use toolledger::authz::PrincipalStore;
use toolledger::engine::{FaultHook, FaultPoint};
use toolledger::model::Error;
use toolledger::runtime::Runtime;
use toolledger_mcp::status::{EffectObserver, LedgerResultObserver};
use toolledger_mcp::{
    status_router, Caller, CallerSource, Guard, Guarded, GuardedServer, LedgerGuard, Refusal,
    StatusTool, ToolCall,
};

use crate::automations::{self, Arguments, CreateAutomation, SetInterval};
use crate::domain;
use crate::drafts::{self, CreateDraft, DraftArgs};
use crate::issues::{self, CreateIssue, IssueArgs};
use crate::refunds::{self, RefundArgs};

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
/// [`Guarded`] call and their typed arguments, in `tools/list` order: `create_issue`,
/// `get_operation_status`, `create_automation`, `set_interval`, `create_draft`,
/// `refund_order`. The router checks every call's arguments against the tool's input schema
/// (derived from the arguments' type) before a method runs; each method hands the call to its
/// domain ([`issues`], [`automations`], [`drafts`], [`refunds`]).
#[derive(Clone)]
pub struct ReferenceTools {
    env: ToolEnv,
    issue: Arc<CreateIssue>,
    draft: Arc<CreateDraft>,
}

/// The listing order of the reference tools.
const ORDER: &[&str] = &[
    issues::TOOL,
    StatusTool::NAME,
    automations::CREATE_AUTOMATION,
    automations::SET_INTERVAL,
    drafts::TOOL,
    refunds::TOOL,
];

#[tool_router(router = routes)]
impl ReferenceTools {
    #[tool(
        name = "create_issue",
        description = "Create an issue. Asks for the body in a second round (input_required). \
            Retrying with the same operation_id and continuation replays the stored result; \
            after a lost reply call get_operation_status.",
        output_schema = issues::output_schema(),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn create_issue(
        &self,
        g: Guarded,
        Parameters(args): Parameters<IssueArgs>,
    ) -> Result<CallToolResponse, Refusal> {
        let call = g.call().await?;
        Ok(self.issue.call(&call, args).await?)
    }

    #[tool(
        name = "create_automation",
        description = "Create an automation with an interval (5-1440 minutes); needs \
            automation:write. Retrying with the same request_id replays the recorded result.",
        output_schema = crate::object(automations::output_schema()),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn create_automation(
        &self,
        g: Guarded,
        Parameters(args): Parameters<CreateAutomation>,
    ) -> Result<CallToolResponse, Refusal> {
        let caller = g.caller().await?;
        Ok(self.automation(&caller, Arguments::Create(args)).await?)
    }

    #[tool(
        name = "set_interval",
        description = "Set an automation's interval (5-1440 minutes) if its version is still \
            expected_version; needs automation:write. Retrying with the same request_id \
            replays the recorded result.",
        output_schema = crate::object(automations::output_schema()),
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn set_interval(
        &self,
        g: Guarded,
        Parameters(args): Parameters<SetInterval>,
    ) -> Result<CallToolResponse, Refusal> {
        let caller = g.caller().await?;
        Ok(self
            .automation(&caller, Arguments::SetInterval(args))
            .await?)
    }

    #[tool(
        name = "create_draft",
        description = "Create an editorial draft (role editor, approval required). The same \
            operation with the same payload replays {slug, draft, replayed}; never the text.",
        output_schema = drafts::output_schema(),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn create_draft(
        &self,
        g: Guarded,
        Parameters(args): Parameters<DraftArgs>,
    ) -> Result<CallToolResponse, Refusal> {
        let call = g.call().await?;
        Ok(self.draft(&call, args).await?)
    }

    #[tool(
        name = "refund_order",
        description = "Refund (part of) an order you own; needs an approval from `toolledger \
            approve --tool refund_order`. Delivered through the outbox to the payments \
            service. Retrying with the same idempotency_key never refunds twice; an \
            unfinished refund answers OUTCOME_UNKNOWN with its status_ref.",
        output_schema = toolledger_mcp::deferred::output_schema(),
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn refund_order(
        &self,
        g: Guarded,
        Parameters(args): Parameters<RefundArgs>,
    ) -> Result<CallToolResponse, Refusal> {
        let call = g.call().await?;
        Ok(self.refund(&call, args).await?)
    }
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
            env,
        }
    }

    /// The tools offered: with `unguarded` only the control (`create_issue` without a
    /// ledger) and `get_operation_status`; `refund_order` only with a runtime.
    fn offered(&self, name: &str) -> bool {
        match name {
            issues::TOOL | StatusTool::NAME => true,
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
            if let Some(route) = routes.map.get_mut(issues::TOOL) {
                route.attr.annotations = route.attr.annotations.take().map(|a| a.idempotent(false));
            }
        }
    }

    /// The server `toolledger serve` runs: these tools and `get_operation_status` (with the
    /// issue and draft rows as evidence for their tools, the stored result for the others),
    /// through the ledger's guard with callers from `caller`. Fails only if an input schema
    /// is not a valid JSON Schema.
    pub fn server(self, caller: CallerSource) -> Result<GuardedServer<ReferenceTools>, Error> {
        let store = self.env.guard.engine().store().clone();
        let ledger =
            LedgerGuard::from_parts(self.env.guard.clone(), self.env.principals.clone(), caller)
                .with_observer(issues::TOOL, Arc::new(issues::observer(store.clone())))
                .with_observer(drafts::TOOL, Arc::new(drafts::observer(store)));
        let mut routes = Self::routes() + status_router();
        self.restrict(&mut routes);
        let routes = ledger.router(routes)?;
        Ok(GuardedServer::new("toolledger", self, routes).with_order(ORDER))
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
                    issues::TOOL => Arc::new(issues::observer(store.clone())),
                    drafts::TOOL => Arc::new(drafts::observer(store.clone())),
                    _ => Arc::new(LedgerResultObserver),
                };
                (n.to_string(), observer)
            })
            .collect();
        StatusTool::new(self.env.guard.clone(), observed)
    }

    /// Runs one call of `tool` without a transport, as `toolledger call` does: the call's
    /// wire arguments are read as the tool's typed arguments (the rules of its input schema
    /// are checked by the domain), then answered as the server's `#[tool]` method answers. A
    /// tool this server does not offer is `invalid_arguments`.
    pub async fn call(&self, tool: &str, call: ToolCall) -> Result<CallToolResponse, ErrorData> {
        if tool == StatusTool::NAME {
            return self.status().call(call).await;
        }
        let args = &call.arguments;
        let answer = async {
            match tool {
                _ if !self.offered(tool) => Err(Error::invalid("unknown tool")),
                issues::TOOL => self.issue.call(&call, domain::arguments(args)?).await,
                drafts::TOOL => self.draft(&call, domain::arguments(args)?).await,
                refunds::TOOL => self.refund(&call, domain::arguments(args)?).await,
                automations::CREATE_AUTOMATION => {
                    let args = Arguments::Create(domain::arguments(args)?);
                    self.automation(&call.caller, args).await
                }
                automations::SET_INTERVAL => {
                    let args = Arguments::SetInterval(domain::arguments(args)?);
                    self.automation(&call.caller, args).await
                }
                _ => Err(Error::invalid("unknown tool")),
            }
        }
        .await;
        rmcp::handler::server::tool::IntoCallToolResult::into_call_tool_result(
            answer.map_err(Refusal),
        )
    }

    /// `create_automation` and `set_interval` for `caller` (read from the principal store
    /// when the call was extracted), with the guard's deadlines for new receipts.
    async fn automation(
        &self,
        caller: &Caller,
        args: Arguments,
    ) -> Result<CallToolResponse, Error> {
        let c = self.env.guard.config();
        let options = automations::ToolOptions {
            authority_ttl: Some(c.authority_ttl),
            retention_ttl: Some(c.retention_ttl),
        };
        let outcome = automations::run_typed(
            self.env.guard.engine(),
            caller.principal.clone(),
            &caller.name,
            args,
            &options,
        )
        .await?;
        Ok(complete(automations::reply(&outcome)))
    }

    async fn draft(&self, call: &ToolCall, args: DraftArgs) -> Result<CallToolResponse, Error> {
        Ok(complete(self.draft.call(call, args).await?))
    }

    /// `refund_order`: a deferred effect through the outbox to the payments service (the
    /// runtime owns the rules); not offered without a runtime.
    async fn refund(&self, call: &ToolCall, args: RefundArgs) -> Result<CallToolResponse, Error> {
        let Some(runtime) = &self.env.runtime else {
            return Err(Error::invalid("unknown tool"));
        };
        let outcome = refunds::call(runtime, call, args).await?;
        Ok(CallToolResponse::Complete(outcome.0.into_tool_result()))
    }
}

/// A complete result carrying `value` as structured content and as text.
fn complete(value: serde_json::Value) -> CallToolResponse {
    CallToolResponse::Complete(CallToolResult::structured(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// The listed input schemas keep their arguments, required members and key marks.
    #[test]
    fn input_schemas_list_the_arguments_the_tools_take() {
        let key = toolledger_mcp::carriers::KEY_KEYWORD;
        let expected = [
            (
                issues::TOOL,
                vec!["operation_id", "title", "watcher"],
                vec!["operation_id", "title"],
                None,
            ),
            (
                drafts::TOOL,
                vec!["approval", "kind", "operation", "slug", "text", "title"],
                vec!["operation", "slug", "title", "text", "kind"],
                Some("operation"),
            ),
            (
                automations::CREATE_AUTOMATION,
                vec!["interval_minutes", "request_id"],
                vec!["request_id", "interval_minutes"],
                Some("request_id"),
            ),
            (
                automations::SET_INTERVAL,
                vec![
                    "automation_id",
                    "expected_version",
                    "interval_minutes",
                    "request_id",
                ],
                vec![
                    "request_id",
                    "automation_id",
                    "expected_version",
                    "interval_minutes",
                ],
                Some("request_id"),
            ),
            (
                refunds::TOOL,
                vec!["amount_cents", "approval", "idempotency_key", "order_id"],
                vec!["idempotency_key", "order_id", "amount_cents"],
                Some("idempotency_key"),
            ),
        ];
        let routes = ReferenceTools::routes();
        for (tool, properties, required, marked) in expected {
            let schema = Value::Object(routes.get(tool).unwrap().input_schema.as_ref().clone());
            let listed: Vec<&str> = schema["properties"]
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(listed, properties, "{tool}");
            assert_eq!(schema["required"], json!(required), "{tool}");
            assert_eq!(schema["additionalProperties"], false, "{tool}");
            let keyed: Vec<&String> = schema["properties"]
                .as_object()
                .unwrap()
                .iter()
                .filter(|(_, p)| p[key] == true)
                .map(|(name, _)| name)
                .collect();
            assert_eq!(keyed.first().map(|k| k.as_str()), marked, "{tool}");
        }
        let draft = routes.get(drafts::TOOL).unwrap().input_schema.clone();
        assert_eq!(
            draft["properties"]["kind"]["enum"],
            json!(["article", "note", "page"])
        );
    }
}
