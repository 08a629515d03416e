//! `toolledger resolve --status-ref REF --as succeeded|failed|applied|partial --reason TEXT
//! --operator NAME`: an operator settles an unsure operation.
//!
//! The operator must currently hold the role `operator` in the operation's tenant.
//!
//! - A deferred operation (`outcome_unknown`, `dead`, or `processing` whose lease has
//!   expired) resolves as `succeeded` or `failed`. The payments service is asked first: with
//!   a receipt, `--as failed` is refused and `--as succeeded` reconciles it (transaction C);
//!   without one, `--as succeeded` needs `--evidence JSON` (what the operator verified,
//!   recorded as the receipt with operator and reason) and `--as failed` stores the failure
//!   result `{code: "resolved_failed", message}`. For an operation the proxy recorded,
//!   `--result JSON` adds the tool's result, checked against the output schema the tool
//!   declared when the call was accepted (`--output-schema FILE`, verified against the
//!   recorded revision): every retry through the proxy is then a success with that result.
//! - An inline operation stuck `in_progress` (unchanged for the in-progress expiry, 300 s)
//!   resolves as `applied` or `partial`, with its first step's result; a `partial` one may be
//!   resolved as `applied` once its remaining steps were done by hand.
//!
//! Every resolution appends a `resolved` operation event (operator, reason, previous state,
//! evidence, time). Exit 0 when the resolution was recorded, 1 for a refusal (BLOCK, nothing
//! changed), 2 for database failures. See `toolledger::runtime::Runtime::resolve`.

use std::sync::Arc;

use serde_json::json;
use toolledger::clock::{ManualClock, SharedClock, SystemClock};
use toolledger::runtime::{Answer, Resolution, ResolveAs, Runtime, RuntimeError};
use toolledger::Error;
use toolledger_cli::common::{self, StoreArgs, StoreConfig};
use toolledger_cli::exit::{Failure, Outcome};
use toolledger_console::ConfirmedResult;

use crate::cmd_dispatch::{block_on, runtime};

fn parse_as(s: &str) -> Result<ResolveAs, String> {
    ResolveAs::parse(s).ok_or_else(|| "expected succeeded, failed, applied or partial".into())
}

/// `resolve` options.
#[derive(clap::Args, Debug)]
pub struct ResolveArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The operation's opaque reference.
    #[arg(long)]
    pub status_ref: String,
    /// The outcome to record. Deferred: `succeeded` (needs the downstream's receipt, or
    /// `--evidence`) or `failed` (refused when the downstream holds a receipt). Inline:
    /// `applied` or `partial`.
    #[arg(long = "as", value_parser = parse_as)]
    pub outcome: ResolveAs,
    /// Why; recorded in the operation's events.
    #[arg(long)]
    pub reason: String,
    /// The operator's principal name (role `operator` in the operation's tenant).
    #[arg(long)]
    pub operator: String,
    /// What you verified, as a JSON object (`{"message_id": "…"}`): lets a deferred
    /// operation whose downstream holds no receipt be resolved as `succeeded`, with this as
    /// its receipt; every retry is then told the effect happened, with this evidence.
    #[arg(long, value_name = "JSON", value_parser = common::json_object)]
    pub evidence: Option<serde_json::Value>,
    /// With `--as succeeded --evidence`, for an operation `toolledger proxy` recorded: the
    /// tool's result, as a JSON object, which every retry then receives as a success (for a
    /// tool with an output schema, the only success its clients accept). Refused, changing
    /// nothing, when it does not conform to the tool's output schema.
    #[arg(long, value_name = "JSON", value_parser = common::json_value, requires = "evidence")]
    pub result: Option<serde_json::Value>,
    /// The output schema `--result` is checked against: the tool's `outputSchema` as the
    /// upstream lists it (`tools/list`), in a JSON file. It must be the schema the tool
    /// declared when the call was accepted (the ledger recorded its revision). Needed when the
    /// tool declared one.
    #[arg(long, value_name = "FILE", value_parser = common::json_file, requires = "result")]
    pub output_schema: Option<serde_json::Value>,
    /// Use this Unix time instead of the wall clock (tests).
    #[arg(long)]
    pub clock_epoch: Option<i64>,
}

/// Runs `resolve` on the ledger `store` resolves to.
pub fn run(args: ResolveArgs, store: StoreConfig) -> Result<Outcome, Failure> {
    // The resolution is a span when the OTEL_* variables name a collector.
    let _traces = toolledger_cli::telemetry::init_traces();
    block_on(async move {
        let ledger = store.open()?;
        let clock: SharedClock = match args.clock_epoch {
            Some(t) => Arc::new(ManualClock::new(t)),
            None => Arc::new(SystemClock),
        };
        let rt = runtime(&store, &ledger, clock)?;
        let resolution = Resolution {
            status_ref: args.status_ref,
            outcome: args.outcome,
            reason: args.reason,
            operator: args.operator,
            evidence: args.evidence.clone(),
        };
        let confirmed = args.result.as_ref().map(|result| ConfirmedResult {
            result: result.clone(),
            output_schema: args.output_schema.clone(),
        });
        match settle_confirmed(rt, &resolution, confirmed.as_ref()).await {
            Ok(Answer::Done {
                status_ref,
                state,
                delivery,
                result,
            }) => {
                common::print_json(&json!({
                    "code": "OK",
                    "delivery": delivery.as_str(),
                    "gate": "PASS",
                    "resolved_as": resolution.outcome.as_str(),
                    "result": result,
                    "status": state.as_str(),
                    "status_ref": status_ref,
                }));
                Ok(Outcome::Pass)
            }
            Ok(Answer::Unknown { .. }) => Err(Failure::Refused(Error::new(
                toolledger::ErrorCode::OutcomeUnknown,
                "the operation is still unresolved",
            ))),
            Err(RuntimeError::Refused(e)) => Err(Failure::Refused(e)),
            Err(RuntimeError::Store(s)) => Err(s.into()),
            Err(RuntimeError::Fenced(_)) => Err(Failure::Refused(Error::new(
                toolledger::ErrorCode::OperationInProgress,
                "a worker claimed the operation meanwhile; nothing was changed",
            ))),
        }
    })
}

/// Settles `resolution` with `rt`: the one resolution code path of `toolledger resolve` and
/// the console. An operation the proxy recorded whose tool `rt` does not know is settled
/// offline (its tool registered from the operation's own record, without the upstream).
/// With `confirmed`, the tool's result an operator gives with a confirmed success: checked
/// against the schema the tool declared when the call was accepted and stored with the
/// confirmation, so every retry is a success carrying it. Only for a success an operator
/// confirms (`succeeded` with evidence) of an operation the proxy recorded, settled offline;
/// anything else with a result is refused (`invalid_arguments`) and nothing changes.
pub(crate) async fn settle_confirmed(
    rt: Runtime,
    resolution: &Resolution,
    confirmed: Option<&ConfirmedResult>,
) -> Result<Answer, RuntimeError> {
    let mut rt = rt;
    let refuse = |message: &str| Err(RuntimeError::Refused(Error::invalid(message)));
    if confirmed.is_some() && resolution.outcome != ResolveAs::Succeeded {
        return refuse("a result goes with the outcome succeeded");
    }
    if let Ok(Some(record)) = rt.inspect(&resolution.status_ref).await {
        // A confirmed result is stored by the offline tool even where this process serves the
        // tool (the proxy's own console): it is checked against the contract the call was
        // accepted under, not the upstream's listing now.
        if toolledger_proxy::offline::is_proxied(&record)
            && (confirmed.is_some() || rt.registry().tool(&record.scope.tool).is_none())
        {
            let mapped = match confirmed {
                Some(c) => Some(toolledger_proxy::offline::checked_result(
                    &record,
                    &c.result,
                    c.output_schema.as_ref(),
                )?),
                None => None,
            };
            let (tool, downstream) = toolledger_proxy::offline::tool_confirming(&record, mapped);
            let registry = rt.registry().clone().register(tool, downstream);
            rt = Runtime::new(rt.store().clone(), rt.clock().clone(), registry);
        } else if confirmed.is_some() {
            return refuse("a result applies to an operation `toolledger proxy` recorded");
        }
    }
    rt.resolve(resolution).await
}
