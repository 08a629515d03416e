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
use std::process::ExitCode;

use serde_json::json;
use toolledger::approval::{self, ApprovalTarget};
use toolledger::authz::PrincipalStore;
use toolledger::clock::{Clock, SystemClock};
use toolledger::json::{self, Limits};
use toolledger::Error;
use toolledger_cli::common;
use toolledger_cli::reference::{self, refunds};

use crate::cmd_dispatch::{
    apply_setup, block_on, load_fixture, print_refusal, print_value, RuntimeStoreArgs,
};

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

/// Runs `approve`.
pub fn run(args: ApproveArgs) -> ExitCode {
    let fixture = match &args.fixture {
        Some(path) => match load_fixture(path) {
            Ok(f) => Some(f),
            Err(code) => return code,
        },
        None => None,
    };
    if fixture.is_none() && args.tool.is_none() {
        return common::fail("USAGE_ERROR");
    }
    block_on(async move {
        let store = match args.store.open(true) {
            Ok(s) => s,
            Err(code) => return code,
        };
        let principals = PrincipalStore::new(store.clone());
        let (target, approval_id, now): (ApprovalTarget, String, i64) = match &fixture {
            Some(f) => {
                if let Err(code) = apply_setup(&store, &f.setup, f.now, None).await {
                    return code;
                }
                let parsed = match refunds::parse_tool_arguments(&f.arguments) {
                    Ok(p) => p,
                    Err(e) => return print_refusal(&e),
                };
                let Some(id) = args.approval_id.clone().or(parsed.approval.clone()) else {
                    return common::fail("FIXTURE_CONTRACT_ERROR");
                };
                let requester = match principals.resolve(&f.principal).await {
                    Ok(Some(p)) => p,
                    Ok(None) => return print_refusal(&Error::invalid("unknown requester")),
                    Err(e) => return print_refusal(&e),
                };
                match refunds::approval_target_for(
                    &requester,
                    &parsed.key,
                    &parsed.business,
                    &f.provider,
                ) {
                    Ok(t) => (t, id, args.now.unwrap_or(f.now)),
                    Err(e) => return print_refusal(&e),
                }
            }
            None => {
                let (Some(tool), Some(requester), Some(key), Some(arguments)) =
                    (&args.tool, &args.requester, &args.key, &args.arguments)
                else {
                    return common::fail("USAGE_ERROR");
                };
                let arguments = match json::parse(arguments.as_bytes(), &Limits::DEFAULT) {
                    Ok(v) => v,
                    Err(_) => return common::fail("ARGUMENTS_INVALID_JSON"),
                };
                let requester = match principals.resolve(requester).await {
                    Ok(Some(p)) => p,
                    Ok(None) => return print_refusal(&Error::invalid("unknown requester")),
                    Err(e) => return print_refusal(&e),
                };
                let target = match reference::approval_target(tool, &requester, key, &arguments) {
                    Ok(t) => t,
                    Err(e) => return print_refusal(&e),
                };
                let id = match args.approval_id.clone() {
                    Some(id) => id,
                    None => match approval::new_approval_id() {
                        Ok(id) => id,
                        Err(e) => return print_refusal(&e),
                    },
                };
                (target, id, args.now.unwrap_or_else(|| SystemClock.now()))
            }
        };
        let Some(expires_at) = now.checked_add(args.ttl) else {
            return print_refusal(&Error::invalid("the approval window overflows"));
        };
        match approval::grant(
            &store,
            &approval_id,
            &target,
            &args.approver,
            now,
            expires_at,
        )
        .await
        {
            Ok(a) => print_value(&json!({
                "approval_id": a.approval_id,
                "approved_at": a.approved_at,
                "approver": a.approver,
                "binding_digest": a.binding_digest,
                "expires_at": a.expires_at,
                "idempotency_key": a.target.idempotency_key,
                "subject": a.target.subject,
                "tenant": a.target.tenant,
                "tool": a.target.tool,
            })),
            Err(e) => print_refusal(&e),
        }
    })
}
