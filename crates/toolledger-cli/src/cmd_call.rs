//! `toolledger call TOOL --principal NAME --args JSON`: one invocation of a reference tool
//! through the ledger, without MCP.
//!
//! Prints the tool's reply (exit 0) or `{"error":{"code","message"}}` (exit 1) on stdout. A
//! database that cannot be opened exits 2 with the stable error shape on stderr.

use std::sync::Arc;

use serde_json::json;
use toolledger::authz::PrincipalStore;
use toolledger::clock::{ManualClock, SharedClock, SystemClock};
use toolledger::engine::Engine;
use toolledger::json::{parse, Limits};
use toolledger::Error;

use crate::common::{self, StoreArgs, StoreConfig};
use crate::exit::{Failure, Outcome};
use toolledger_reference::automations;

/// Arguments of `toolledger call`.
#[derive(clap::Args, Debug)]
pub struct CallArgs {
    /// Tool name, e.g. `set_interval`.
    pub tool: String,
    /// Principal to act as (resolved from the principal store now).
    #[arg(long)]
    pub principal: String,
    /// Tool arguments as one JSON object.
    #[arg(long)]
    pub args: String,
    /// Pin the clock to this Unix second (testing aid).
    #[arg(long)]
    pub clock_epoch: Option<i64>,
    /// Seconds after which a new receipt grants no write, not even a replay.
    #[arg(long)]
    pub authority_ttl: Option<i64>,
    /// Seconds after which a new receipt is no longer replayed.
    #[arg(long)]
    pub replay_ttl: Option<i64>,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// The tool's in-band error on stdout (exit 1).
fn tool_error(e: &Error) -> Outcome {
    common::print_json(&json!({"error": {"code": e.code.as_str(), "message": e.message}}));
    Outcome::Block
}

/// Runs `toolledger call` on the ledger `store` resolves to.
pub fn run(args: CallArgs, store: &StoreConfig) -> Result<Outcome, Failure> {
    let store = store.open()?;
    let clock: SharedClock = match args.clock_epoch {
        Some(epoch) => Arc::new(ManualClock::new(epoch)),
        None => Arc::new(SystemClock),
    };
    let tool_args = match parse(args.args.as_bytes(), &Limits::DEFAULT) {
        Ok(v) => v,
        Err(e) => {
            return Ok(tool_error(&Error::invalid(format!(
                "--args: {}",
                e.message
            ))))
        }
    };
    if !automations::is_tool(&args.tool) {
        return Ok(tool_error(&Error::invalid("unknown tool")));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|_| Failure::code("RUNTIME_ERROR"))?;
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
    Ok(match reply {
        Ok(v) => {
            common::print_json(&v);
            Outcome::Pass
        }
        Err(e) => tool_error(&e),
    })
}
