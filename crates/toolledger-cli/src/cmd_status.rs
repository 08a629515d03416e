//! `toolledger status --fixture CASE.json --status-ref REF`: the explicit status query.
//!
//! It observes and, when the payments service holds a receipt the ledger has not reconciled,
//! reconciles it (transaction C: local receipt + operation `succeeded` + event `delivered`,
//! delivery `receipt_reconciled`). It never submits anything downstream. After revocation, or
//! for a reference that is not the caller's, the answer is the same `NOT_FOUND` as for a
//! reference that does not exist.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use toolledger::clock::ManualClock;
use toolledger::runtime::StatusQuery;

use crate::cmd_dispatch::{
    block_on, call_of, finish, load_fixture, DeadlineArgs, RuntimeStoreArgs,
};

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

/// Runs `status`.
pub fn run(args: StatusArgs) -> ExitCode {
    let f = match load_fixture(&args.fixture) {
        Ok(f) => f,
        Err(code) => return code,
    };
    block_on(async move {
        let store = match args.store.open(false) {
            Ok(s) => s,
            Err(code) => return code,
        };
        let call = match call_of(&f) {
            Ok(c) => c,
            Err(code) => return code,
        };
        let rt = match args
            .store
            .runtime(&store, Arc::new(ManualClock::new(f.now)))
        {
            Ok(rt) => rt.with_deadlines(args.deadlines.deadlines()),
            Err(code) => return code,
        };
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
