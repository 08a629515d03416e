//! `toolledger status --fixture CASE.json --status-ref REF`: the explicit status query.
//!
//! It observes and, when the payments service holds a receipt the ledger has not reconciled,
//! reconciles it (transaction C: local receipt + operation `succeeded` + event `delivered`,
//! delivery `receipt_reconciled`). It never submits anything downstream. After revocation, or
//! for a reference that is not the caller's, the answer is the same `NOT_FOUND` as for a
//! reference that does not exist.

use std::path::PathBuf;
use std::sync::Arc;

use toolledger::clock::ManualClock;
use toolledger::runtime::StatusQuery;
use toolledger_cli::common::{RuntimeStoreArgs, StoreConfig};
use toolledger_cli::exit::{Failure, Outcome};

use crate::cmd_dispatch::{block_on, call_of, finish, load_fixture, runtime, DeadlineArgs};

/// `status` options.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub store: RuntimeStoreArgs,
    /// The fixture of the original call.
    #[arg(long)]
    pub fixture: PathBuf,
    /// The opaque reference `dispatch` returned.
    #[arg(long)]
    pub status_ref: String,
    /// Accepted for symmetry with `dispatch`; a status query never checks deadlines.
    #[command(flatten)]
    pub deadlines: DeadlineArgs,
}

/// Runs `status` on the ledger `store` resolves to.
pub fn run(args: StatusArgs, store: StoreConfig) -> Result<Outcome, Failure> {
    let f = load_fixture(&args.fixture)?;
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
