//! `toolledger status --status-ref REF [--fixture CASE.json]`: an operation's status.
//!
//! **Without `--fixture`** (any operation, inline or deferred, however it was made — by
//! `dispatch`, over MCP or by `call`): the ledger's answer, read-only. The ledger is opened
//! read-only (`common::Access::ReadOnly`), nothing is written, the downstream is not asked
//! and no deadline is checked. The answer has the shape of `dispatch`'s:
//! `applied`/`succeeded` are PASS (`OK`, exit 0) with the stored result; `failed` is `FAILED`
//! and `partial` is `PARTIAL` (BLOCK, exit 1) with the stored result; every unfinished state
//! (`in_progress`, `accepted`, `processing`, `outcome_unknown`, `dead`) is `OUTCOME_UNKNOWN`
//! (BLOCK, exit 1) naming the state, and `"stuck":true` for an `in_progress` operation past
//! the in-progress expiry. A tombstone (compacted after its retention deadline) answers its
//! state with `"result":null` and `compacted_at`. An unknown reference is `NOT_FOUND` (exit 1)
//! — also one whose tombstone was deleted at the horizon. It answers the
//! operator, who can read the database anyway: it re-checks no caller's authorization.
//!
//! **With `--fixture`**: the caller's explicit status query of a deferred operation. It
//! re-checks the caller (the fixture's principal and intent) and, when the payments service
//! holds a receipt the ledger has not reconciled, reconciles it (transaction C: the local
//! receipt, the operation `succeeded` and the event `delivered`; delivery
//! `receipt_reconciled`), so it opens
//! the ledger for writing. It never submits anything downstream. After revocation, or for a
//! reference that is not the caller's, the answer is the same `NOT_FOUND` as for a reference
//! that does not exist.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};
use toolledger::clock::{Clock, ManualClock, SystemClock};
use toolledger::operations::{self, Found, Selector};
use toolledger::runtime::StatusQuery;
use toolledger::Error;
use toolledger_cli::common::{self, RuntimeStoreArgs, StoreConfig};
use toolledger_cli::exit::{Failure, Outcome};

use crate::cmd_dispatch::{block_on, call_of, finish, load_fixture, runtime, DeadlineArgs};

/// `status` options.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub store: RuntimeStoreArgs,
    /// The fixture of the original call: ask as its caller (and reconcile a downstream
    /// receipt). Without it, the ledger's answer, read-only.
    #[arg(long)]
    pub fixture: Option<PathBuf>,
    /// The opaque reference `dispatch` (or the MCP tool) returned.
    #[arg(long)]
    pub status_ref: String,
    /// Accepted for symmetry with `dispatch`; a status query never checks deadlines.
    #[command(flatten)]
    pub deadlines: DeadlineArgs,
    /// Use this Unix time instead of the wall clock (without --fixture; tests).
    #[arg(long)]
    pub clock_epoch: Option<i64>,
}

/// Runs `status` on the ledger `store` resolves to.
pub fn run(args: StatusArgs, store: StoreConfig) -> Result<Outcome, Failure> {
    let Some(fixture) = args.fixture.clone() else {
        return ledger_answer(args, store);
    };
    let f = load_fixture(&fixture)?;
    block_on(async move {
        let ledger = store.open()?;
        let call = call_of(&f)?;
        let rt = runtime(&store, &ledger, Arc::new(ManualClock::new(f.now)))?
            .with_deadlines(args.deadlines.deadlines());
        let query = StatusQuery {
            principal: call.principal,
            tool: call.tool,
            key: call.key,
            arguments: call.arguments,
            provider: call.provider,
            status_ref: args.status_ref,
        };
        finish(rt.status(&query).await)
    })
}

/// The answer object for an operation's row in the timeline (see the module docs).
fn answer(op: &Value) -> (Value, Outcome) {
    let state = op["state"].as_str().unwrap_or_default();
    let mut out = json!({
        "status": state,
        "status_ref": op["status_ref"],
        "tool": op["tool"],
    });
    let (code, gate) = match state {
        "applied" | "succeeded" => ("OK", "PASS"),
        "failed" => ("FAILED", "BLOCK"),
        "partial" => ("PARTIAL", "BLOCK"),
        _ => ("OUTCOME_UNKNOWN", "BLOCK"),
    };
    out["code"] = json!(code);
    out["gate"] = json!(gate);
    if code != "OUTCOME_UNKNOWN" {
        out["result"] = op["result"].clone();
    }
    if code == "FAILED" {
        out["error"] = op["result"].clone();
    }
    if let Some(stuck) = op.get("stuck") {
        out["stuck"] = stuck.clone();
    }
    // A tombstone: the result was removed after the retention deadline.
    if let Some(at) = op.get("compacted_at") {
        out["compacted_at"] = at.clone();
    }
    (out, Outcome::pass_if(gate == "PASS"))
}

/// `status --status-ref REF` without a fixture: the ledger's answer, read-only.
fn ledger_answer(args: StatusArgs, store: StoreConfig) -> Result<Outcome, Failure> {
    let now = match args.clock_epoch {
        Some(t) => t,
        None => SystemClock.now(),
    };
    let sel = Selector::StatusRef(args.status_ref);
    let found = block_on(async move {
        let ledger = store.open()?;
        ledger
            .read(move |tx| operations::timeline(tx, &sel, now))
            .await
            .map_err(Failure::from)
    })?;
    match found {
        Found::One(t) => {
            let (out, outcome) = answer(&t["operation"]);
            common::print_json(&out);
            Ok(outcome)
        }
        _ => Err(Failure::Refused(Error::not_found())),
    }
}
