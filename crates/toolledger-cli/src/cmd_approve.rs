//! `toolledger approve`: a human approves one exact intent.
//!
//! Two ways to name the intent:
//! - `--fixture CASE.json`: the call a runtime fixture describes; the approval id is the
//!   fixture's `arguments.approval` (or `--approval-id`), granted at the fixture's `now`;
//! - `--tool TOOL --requester NAME --key KEY --arguments JSON`: a call from an MCP client;
//!   the tool defines what is bound (see `reference::approval_target`); granted now (or at
//!   `--now`), with a fresh random id unless `--approval-id` is given.
//!
//! The approver must currently be an active principal of the requester's tenant holding the
//! role `approver`, and must not be the requester. The approval is valid on
//! `[approved_at, approved_at + ttl)` and is consumed once by the call it approves.

use std::path::PathBuf;

use serde_json::json;
use toolledger::approval::{self, ApprovalTarget};
use toolledger::authz::PrincipalStore;
use toolledger::clock::{Clock, SystemClock};
use toolledger::json::{self, Limits};
use toolledger::Error;
use toolledger_cli::common::{self, RuntimeStoreArgs, StoreConfig};
use toolledger_cli::exit::{Failure, Outcome};
use toolledger_reference::{self as reference, refunds};

use crate::cmd_dispatch::{apply_setup, block_on, load_fixture};

/// `approve` options.
#[derive(clap::Args, Debug)]
pub struct ApproveArgs {
    #[command(flatten)]
    pub store: RuntimeStoreArgs,
    /// The approving principal (must hold the role `approver` now).
    #[arg(long)]
    pub approver: String,
    /// Approve the call this runtime fixture describes.
    #[arg(long, conflicts_with_all = ["tool", "requester", "key", "arguments"])]
    pub fixture: Option<PathBuf>,
    /// Tool of the call to approve.
    #[arg(long, requires_all = ["requester", "key", "arguments"])]
    pub tool: Option<String>,
    /// Principal that will make the call.
    #[arg(long)]
    pub requester: Option<String>,
    /// Idempotency key (operation id) of the call.
    #[arg(long)]
    pub key: Option<String>,
    /// The call's arguments as JSON (for `refund_order`: `{"order_id":…,"amount_cents":…}`).
    #[arg(long)]
    pub arguments: Option<String>,
    /// Approval id to issue (default: the fixture's `arguments.approval`, or a random id).
    #[arg(long)]
    pub approval_id: Option<String>,
    /// Seconds the approval stays valid.
    #[arg(long, default_value_t = 3600)]
    pub ttl: i64,
    /// Grant time in Unix seconds (default: the fixture's `now`, or wall time).
    #[arg(long)]
    pub now: Option<i64>,
}

/// Runs `approve` on the ledger `store` resolves to.
pub fn run(args: ApproveArgs, store: StoreConfig) -> Result<Outcome, Failure> {
    let fixture = match &args.fixture {
        Some(path) => Some(load_fixture(path)?),
        None => None,
    };
    if fixture.is_none() && args.tool.is_none() {
        return Err(Failure::code("USAGE_ERROR"));
    }
    block_on(async move {
        let store = store.open()?;
        let principals = PrincipalStore::new(store.clone());
        let (target, approval_id, now): (ApprovalTarget, String, i64) = match &fixture {
            Some(f) => {
                apply_setup(&store, &f.setup, f.now, None).await?;
                let parsed =
                    refunds::parse_tool_arguments(&f.arguments).map_err(Failure::Refused)?;
                let Some(id) = args.approval_id.clone().or(parsed.approval.clone()) else {
                    return Err(Failure::code("FIXTURE_CONTRACT_ERROR"));
                };
                let requester = match principals.resolve(&f.principal).await {
                    Ok(Some(p)) => p,
                    Ok(None) => return Err(Failure::Refused(Error::invalid("unknown requester"))),
                    Err(e) => return Err(Failure::Refused(e)),
                };
                let target = refunds::approval_target_for(
                    &requester,
                    &parsed.key,
                    &parsed.business,
                    &f.provider,
                )
                .map_err(Failure::Refused)?;
                (target, id, args.now.unwrap_or(f.now))
            }
            None => {
                let (Some(tool), Some(requester), Some(key), Some(arguments)) =
                    (&args.tool, &args.requester, &args.key, &args.arguments)
                else {
                    return Err(Failure::code("USAGE_ERROR"));
                };
                let arguments = json::parse(arguments.as_bytes(), &Limits::DEFAULT)
                    .map_err(|_| Failure::code("ARGUMENTS_INVALID_JSON"))?;
                let requester = match principals.resolve(requester).await {
                    Ok(Some(p)) => p,
                    Ok(None) => return Err(Failure::Refused(Error::invalid("unknown requester"))),
                    Err(e) => return Err(Failure::Refused(e)),
                };
                let target = reference::approval_target(tool, &requester, key, &arguments)
                    .map_err(Failure::Refused)?;
                let id = match args.approval_id.clone() {
                    Some(id) => id,
                    None => approval::new_approval_id().map_err(Failure::Refused)?,
                };
                (target, id, args.now.unwrap_or_else(|| SystemClock.now()))
            }
        };
        let Some(expires_at) = now.checked_add(args.ttl) else {
            return Err(Failure::Refused(Error::invalid(
                "the approval window overflows",
            )));
        };
        let a = approval::grant(
            &store,
            &approval_id,
            &target,
            &args.approver,
            now,
            expires_at,
        )
        .await
        .map_err(Failure::Refused)?;
        common::print_json(&json!({
            "approval_id": a.approval_id,
            "approved_at": a.approved_at,
            "approver": a.approver,
            "binding_digest": a.binding_digest,
            "expires_at": a.expires_at,
            "idempotency_key": a.target.idempotency_key,
            "subject": a.target.subject,
            "tenant": a.target.tenant,
            "tool": a.target.tool,
        }));
        Ok(Outcome::Pass)
    })
}
