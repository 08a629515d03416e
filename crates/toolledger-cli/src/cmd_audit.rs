//! `toolledger audit`: one read snapshot of the ledger checked for physical and semantic
//! integrity.
//!
//! Inside one read transaction: the driver's physical checks
//! ([`toolledger::driver::Driver::physical_checks`]: on SQLite `PRAGMA integrity_check`,
//! `PRAGMA foreign_key_check`, the journal mode and synchronous level), the ledger's semantic
//! rules and content checks ([`toolledger::audit`]), and row counts. PASS (exit 0) needs `integrity_check = ok`, no foreign-key violation, WAL,
//! `synchronous = FULL` and no semantic violation; otherwise BLOCK (exit 1). Violations name
//! rows only by opaque references (status refs, or a hash for receipts), never their content.
//! When the payments stand-in's file exists its receipt count is reported beside (read
//! separately, not part of the snapshot).
//!
//! On PostgreSQL (`--database-url`) the semantic rules, content checks and counts are the same
//! queries; there is no `integrity_check`, so the physical gate is: every constraint of the
//! ledger's schema is validated (`pg_constraint.convalidated`), no foreign-key trigger is
//! disabled, `fsync` is on and `synchronous_commit` is not `off`, and — when the `amcheck`
//! extension is installed — `bt_index_check` passes on every B-tree index of the schema.

use serde_json::{json, Value};
use toolledger::audit;
use toolledger::effect::EffectTx;
use toolledger::store::{Store, StoreError};
use toolledger_cli::common::{self, RuntimeStoreArgs, StoreConfig};
use toolledger_cli::exit::{Failure, Outcome};
use toolledger_reference::downstream::SqliteDownstream;

use crate::cmd_dispatch::block_on;

/// `audit` options.
#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    #[command(flatten)]
    pub store: RuntimeStoreArgs,
}

/// Everything read inside the one snapshot: the driver's physical checks, the ledger's
/// semantic rules and content checks, and counts.
fn snapshot(tx: &mut dyn EffectTx, store: &Store) -> Result<Value, StoreError> {
    let (physical_ok, checks) = store.driver().physical_checks(tx)?;
    let violations: Vec<Value> = audit::violations(tx)?
        .iter()
        .map(audit::Violation::to_json)
        .collect();
    let counts = audit::counts(tx)?;
    let pass = physical_ok && violations.is_empty();
    Ok(json!({
        "gate": if pass { "PASS" } else { "BLOCK" },
        "code": if pass { "OK" } else { "AUDIT_FAILED" },
        "backend": tx.dialect().as_str(),
        "checks": checks,
        "violations": violations,
        "counts": counts,
    }))
}

/// Runs `audit` on the ledger `store` resolves to (opened read-only: it creates, migrates and
/// writes nothing, and refuses a file that holds no ledger with `NOT_A_LEDGER`).
pub fn run(store: StoreConfig) -> Result<Outcome, Failure> {
    block_on(async move {
        let ledger = store.open()?;
        let handle = ledger.clone();
        let mut report = ledger.read(move |tx| snapshot(tx, &handle)).await?;
        // Read separately, not part of the snapshot; creates no file.
        if let Some(n) = SqliteDownstream::receipt_count_read_only(&store.downstream) {
            report["downstream"] = json!({"receipts": n});
        }
        let pass = report["gate"] == "PASS";
        common::print_json(&report);
        Ok(Outcome::pass_if(pass))
    })
}
