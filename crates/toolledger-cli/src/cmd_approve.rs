//! `toolledger approve`: a human approves one exact intent.
//!
//! Two ways to name the intent:
//! - `--fixture CASE.json`: the call a runtime fixture describes; the approval id is the
//!   fixture's `arguments.approval` (or `--approval-id`), granted at the fixture's `now`;
//! - `--tool TOOL --requester NAME --key KEY --arguments JSON`: a call from an MCP client;
//!   the tool defines what is bound (see `reference::approval_target`: a reference tool's
//!   binding, or the intent of any other guarded tool); granted now (or at
//!   `--now`), with a fresh random id unless `--approval-id` is given.
//!
//! The approver must currently be an active principal of the requester's tenant holding the
//! role `approver`, and must not be the requester. The approval is valid on
//! `[approved_at, approved_at + ttl)` and is consumed once by the call it approves.
//!
//! Everything that can be checked without the database is checked before it is opened. The
//! rest — the fixture's principals that do not exist yet (its orders are not created: an
//! approval binds an intent, not a business row), the requester, the approver and the approval
//! itself — is one write transaction: a refused approval changes nothing.

use std::path::PathBuf;

use serde_json::json;
use toolledger::approval::{self, Approval};
use toolledger::authz;
use toolledger::clock::{Clock, SystemClock};
use toolledger::effect::EffectTx;
use toolledger::store::StoreError;
use toolledger::Error;
use toolledger_cli::common::{self, RuntimeStoreArgs, StoreConfig};
use toolledger_cli::exit::{Failure, Outcome};
use toolledger_cli::fixture::{Fixture, SetupPrincipal};
use toolledger_reference::{self as reference, refunds};

use crate::cmd_dispatch::{block_on, load_fixture};

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
    /// The call's arguments as JSON (for `refund_order`: `{"order_id":…,"amount_cents":…}`;
    /// for your own guarded tool that runs `Guarded::run_approved`: the intent it records).
    #[arg(long, value_name = "JSON", value_parser = common::json_value)]
    pub arguments: Option<serde_json::Value>,
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

/// What the approval is for, decided before the database is opened.
enum Intent {
    /// The call a fixture describes (its requester and principals may come from its setup).
    Fixture {
        principals: Vec<SetupPrincipal>,
        requester: String,
        key: String,
        business: serde_json::Value,
        provider: toolledger::runtime::ProviderContext,
    },
    /// A call from an MCP client.
    Call {
        tool: String,
        requester: String,
        key: String,
        arguments: serde_json::Value,
    },
}

/// Why the approval transaction stopped (it rolled back; nothing was written).
enum Refusal {
    /// A typed refusal (exit 1).
    Refused(Error),
    /// The fixture's setup could not be applied (exit 2).
    Fixture,
    /// The store failed (exit 2).
    Store(StoreError),
}

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Self {
        Refusal::Store(e)
    }
}

impl From<Error> for Refusal {
    fn from(e: Error) -> Self {
        Refusal::Refused(e)
    }
}

/// The fixture's intent, approval id and grant time.
fn fixture_intent(f: Fixture, args: &ApproveArgs) -> Result<(Intent, String, i64), Failure> {
    let parsed = refunds::parse_tool_arguments(&f.arguments).map_err(Failure::Refused)?;
    let id = match args.approval_id.clone().or(parsed.approval) {
        Some(id) => id,
        None => approval::new_approval_id().map_err(Failure::Refused)?,
    };
    let now = args.now.unwrap_or(f.now);
    let intent = Intent::Fixture {
        principals: f.setup.principals,
        requester: f.principal,
        key: parsed.key,
        business: parsed.business,
        provider: f.provider,
    };
    Ok((intent, id, now))
}

/// Runs `approve` on the ledger `store` resolves to.
pub fn run(args: ApproveArgs, store: StoreConfig) -> Result<Outcome, Failure> {
    let (intent, approval_id, now) = match &args.fixture {
        Some(path) => fixture_intent(load_fixture(path)?, &args)?,
        None => {
            let (Some(tool), Some(requester), Some(key), Some(arguments)) =
                (&args.tool, &args.requester, &args.key, &args.arguments)
            else {
                return Err(Failure::explained(
                    "USAGE_ERROR",
                    "name the intent to approve: --fixture F, or --tool T --requester NAME --key \
                     K --arguments JSON",
                ));
            };
            let arguments = arguments.clone();
            let id = match args.approval_id.clone() {
                Some(id) => id,
                None => approval::new_approval_id().map_err(Failure::Refused)?,
            };
            let intent = Intent::Call {
                tool: tool.clone(),
                requester: requester.clone(),
                key: key.clone(),
                arguments,
            };
            (intent, id, args.now.unwrap_or_else(|| SystemClock.now()))
        }
    };
    approval::check_approval_id(&approval_id).map_err(Failure::Refused)?;
    let Some(expires_at) = now.checked_add(args.ttl) else {
        return Err(Failure::Refused(Error::invalid(
            "the approval window overflows",
        )));
    };
    approval::check_window(now, expires_at).map_err(Failure::Refused)?;
    let approver = args.approver.clone();
    block_on(async move {
        let store = store.open()?;
        let granted = store
            .write(move |tx: &mut dyn EffectTx| {
                grant_in(tx, &intent, &approval_id, &approver, now, expires_at)
            })
            .await;
        let a = match granted {
            Ok(a) => a,
            Err(Refusal::Refused(e)) => return Err(Failure::Refused(e)),
            Err(Refusal::Fixture) => return Err(Failure::code("FIXTURE_CONTRACT_ERROR")),
            Err(Refusal::Store(e)) => return Err(e.into()),
        };
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

/// The approval transaction: the fixture's missing principals, the current requester and
/// approver, and the approval. Any refusal rolls all of it back.
fn grant_in(
    tx: &mut dyn EffectTx,
    intent: &Intent,
    approval_id: &str,
    approver_name: &str,
    now: i64,
    expires_at: i64,
) -> Result<Approval, Refusal> {
    let requester_name = match intent {
        Intent::Fixture {
            principals,
            requester,
            ..
        } => {
            for p in principals {
                authz::insert_in(tx, &p.name, &p.tenant, &p.roles, &p.scopes, now)
                    .map_err(|_| Refusal::Fixture)?;
            }
            requester
        }
        Intent::Call { requester, .. } => requester,
    };
    let Some(requester) = authz::resolve_in(tx, requester_name)? else {
        return Err(Error::invalid("unknown requester").into());
    };
    let target = match intent {
        Intent::Fixture {
            key,
            business,
            provider,
            ..
        } => refunds::approval_target_for(&requester, key, business, provider)?,
        Intent::Call {
            tool,
            key,
            arguments,
            ..
        } => reference::approval_target(tool, &requester, key, arguments)?,
    };
    let Some(approver) = authz::resolve_in(tx, approver_name)? else {
        return Err(Error::denied("the approver is not eligible for this intent").into());
    };
    Ok(approval::issue(
        tx,
        approval_id,
        &target,
        approver_name,
        &approver,
        now,
        expires_at,
    )?)
}
