//! `toolledger call TOOL --principal NAME --args JSON`: one invocation of a reference tool
//! through the ledger, without MCP.
//!
//! Every tool `toolledger serve` offers can be called: `create_automation` and `set_interval`
//! run on the inline engine directly; `create_issue`, `create_draft`, `refund_order` and
//! `get_operation_status` run through the same tool registry as the server, with the server's
//! keys (`TOOLLEDGER_STATE_KEY_HEX` / `TOOLLEDGER_FINGERPRINT_KEY_HEX`, or the key file beside
//! a SQLite database, created on first use and bound to the database like `serve` does), so a
//! call and a server replay each other's operations. A multi-round tool answers
//! `{"resultType":"input_required","inputRequests":…,"requestState":…}`; the next round is
//! the same call with `--request-state` and `--input-responses`.
//!
//! Prints the tool's reply (exit 0) or `{"error":{"code","message"}}` (exit 1) on stdout. A
//! database or key that cannot be opened exits 2 with the stable error shape on stderr.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::model::{CallToolResponse, ClientCapabilities};
use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;
use toolledger::clock::{ManualClock, SharedClock, SystemClock};
use toolledger::engine::Engine;
use toolledger::store::Store;
use toolledger::Error;
use toolledger_mcp::{Caller, GuardConfig, LedgerGuard, ToolCall};
use toolledger_reference::downstream::SqliteDownstream;
use toolledger_reference::tools::{Faults, ReferenceTools, ToolEnv};

use crate::common::{self, RuntimeStoreArgs, StoreConfig};
use crate::exit::{Failure, Outcome};
use toolledger_reference::automations;

/// The tools `call` knows, in the order `--help` lists them.
pub const TOOLS: &[&str] = &[
    "create_issue",
    "get_operation_status",
    "create_automation",
    "set_interval",
    "create_draft",
    "refund_order",
];

/// Arguments of `toolledger call`.
#[derive(clap::Args, Debug)]
pub struct CallArgs {
    /// Tool name: create_issue, get_operation_status, create_automation, set_interval,
    /// create_draft or refund_order.
    pub tool: String,
    /// Principal to act as (resolved from the principal store now).
    #[arg(long)]
    pub principal: String,
    /// Tool arguments as one JSON object.
    #[arg(long, value_name = "JSON", value_parser = common::json_value)]
    pub args: Value,
    /// The `requestState` of the previous round of a multi-round call (`create_issue`).
    #[arg(long, requires = "input_responses")]
    pub request_state: Option<String>,
    /// The input responses of this round, as one JSON object (for `create_issue`:
    /// `{"body":{"action":"accept","content":{"body":"…"}}}`).
    #[arg(long, value_name = "JSON", value_parser = common::json_object)]
    pub input_responses: Option<Value>,
    /// Pin the clock to this Unix second (testing aid).
    #[arg(long)]
    pub clock_epoch: Option<i64>,
    /// Seconds after which a new receipt grants no write, not even a replay (default for the
    /// tools run like the server: 86400).
    #[arg(long)]
    pub authority_ttl: Option<i64>,
    /// Seconds after which a new receipt is no longer replayed (default for the tools run like
    /// the server: 604800).
    #[arg(long)]
    pub replay_ttl: Option<i64>,
    #[command(flatten)]
    pub store: RuntimeStoreArgs,
}

/// The tool's in-band error on stdout (exit 1).
fn tool_error(e: &Error) -> Outcome {
    common::print_json(&json!({"error": {"code": e.code.as_str(), "message": e.message}}));
    Outcome::Block
}

/// Runs `toolledger call` on the ledger `store` resolves to.
pub fn run(args: CallArgs, config: &StoreConfig) -> Result<Outcome, Failure> {
    let tool_args = args.args.clone();
    let input_responses = match &args.input_responses {
        Some(Value::Object(m)) => Some(m.clone().into_iter().collect::<BTreeMap<_, _>>()),
        _ => None,
    };
    if !TOOLS.contains(&args.tool.as_str()) {
        return Ok(tool_error(&Error::invalid(format!(
            "unknown tool; `call` knows {}",
            TOOLS.join(", ")
        ))));
    }
    let store = config.open()?;
    let clock: SharedClock = match args.clock_epoch {
        Some(epoch) => Arc::new(ManualClock::new(epoch)),
        None => Arc::new(SystemClock),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|_| Failure::code("RUNTIME_ERROR"))?;
    if automations::is_tool(&args.tool) {
        let engine = Engine::new(store.clone(), clock.clone());
        let principals = PrincipalStore::new(store).with_clock(clock);
        let options = automations::ToolOptions {
            authority_ttl: args.authority_ttl,
            retention_ttl: args.replay_ttl,
        };
        let reply = rt.block_on(automations::call_tool_with(
            &engine,
            &principals,
            &args.principal,
            &args.tool,
            tool_args,
            &options,
        ));
        return Ok(match reply {
            Ok(v) => {
                common::print_json(&v);
                Outcome::Pass
            }
            Err(e) => tool_error(&e),
        });
    }
    let Value::Object(arguments) = tool_args else {
        return Ok(tool_error(&Error::invalid("--args must be a JSON object")));
    };
    rt.block_on(call_registered(
        &args,
        config,
        store,
        clock,
        arguments,
        input_responses,
    ))
}

/// Calls a tool of the server's registry, as `serve` would for a caller named `--principal`.
async fn call_registered(
    args: &CallArgs,
    config: &StoreConfig,
    store: Store,
    clock: SharedClock,
    arguments: serde_json::Map<String, Value>,
    input_responses: Option<BTreeMap<String, Value>>,
) -> Result<Outcome, Failure> {
    let defaults = GuardConfig::default();
    let guard_config = GuardConfig {
        authority_ttl: args.authority_ttl.unwrap_or(defaults.authority_ttl),
        retention_ttl: args.replay_ttl.unwrap_or(defaults.retention_ttl),
        ..defaults
    };
    let payments = SqliteDownstream::open(&config.downstream, clock.clone())
        .map_err(|_| Failure::code("DOWNSTREAM_IO_ERROR"))?;
    let builder = LedgerGuard::builder()
        .clock(clock)
        .config(guard_config)
        .deferred(toolledger_reference::refunds::registry(Arc::new(payments)));
    let ledger = crate::serving::open_ledger(config, store, builder)?;
    let principals = ledger.principals().clone();
    let env = ToolEnv {
        guard: ledger.guard().clone(),
        faults: Faults::default(),
        unguarded: false,
        principals: principals.clone(),
        runtime: ledger.runtime().cloned(),
    };
    let tools = ReferenceTools::new(env);
    let principal = match principals.resolve(&args.principal).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            return Ok(tool_error(&Error::denied(
                "the caller is not an active principal",
            )))
        }
        Err(e) => return Ok(tool_error(&e)),
    };
    // The caller of a command line can answer a form: `create_issue` asks for its body in a
    // second round (`input_required`) instead of refusing.
    let client_capabilities: Option<ClientCapabilities> =
        serde_json::from_value(json!({"elicitation": {"form": {}}})).ok();
    let call = ToolCall {
        caller: Caller {
            name: args.principal.clone(),
            principal,
        },
        arguments,
        request_state: args.request_state.clone(),
        input_responses,
        meta: None,
        cancelled: None,
        multi_round: true,
        client_capabilities,
        peer: None,
    };
    match tools.call(&args.tool, call).await {
        Ok(response) => Ok(print_response(response)),
        Err(e) => Ok(tool_error(&Error::invalid(e.message.to_string()))),
    }
}

/// Prints a tool's MCP answer as `call` prints a reply: the structured result (exit 0), the
/// in-band error object (exit 1), or the `input_required` round (exit 0).
fn print_response(response: CallToolResponse) -> Outcome {
    let (value, complete) = match response {
        CallToolResponse::Complete(result) => (serde_json::to_value(&result), true),
        CallToolResponse::InputRequired(round) => (serde_json::to_value(&round), false),
        CallToolResponse::Task(task) => (serde_json::to_value(&task), false),
        _ => (
            Ok(json!({"error": {"code": "unavailable",
                                  "message": "the tool answered in a form `call` cannot print"}})),
            false,
        ),
    };
    let value = value.unwrap_or(Value::Null);
    if !complete {
        common::print_json(&value);
        return Outcome::Pass;
    }
    if let Some(error) = toolledger_mcp::error_of(&value) {
        common::print_json(&json!({ "error": error }));
        return Outcome::Block;
    }
    let body = match value.get("structuredContent") {
        Some(v) if !v.is_null() => v.clone(),
        _ => value["content"][0]["text"]
            .as_str()
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or(Value::Null),
    };
    common::print_json(&body);
    Outcome::Pass
}
