//! `toolledger audit`: one read snapshot of the ledger checked for physical and semantic
//! integrity.
//!
//! Inside one read transaction: `PRAGMA integrity_check`, `PRAGMA foreign_key_check`, the
//! journal mode and synchronous level, the semantic rules of the deferred runtime, and row
//! counts. PASS (exit 0) needs `integrity_check = ok`, no foreign-key violation, WAL,
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

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::{Connection, OpenFlags};
use serde_json::{json, Value};
use toolledger::digest::sha256_hex;
use toolledger::effect::{Dialect, EffectTx, RowExt};
use toolledger::json as strict;
use toolledger::store::StoreError;
use toolledger_cli::common::{self, RuntimeStoreArgs, StoreConfig};
use toolledger_cli::exit::{Failure, Outcome};

use crate::cmd_dispatch::block_on;

/// `audit` options.
#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    #[command(flatten)]
    pub store: RuntimeStoreArgs,
}

/// The semantic rules, by name, with the query returning the offending rows' opaque references.
const RULES: &[(&str, &str)] = &[
    (
        "succeeded_operation_without_receipt",
        "SELECT o.status_ref FROM operations o
         WHERE o.effect_kind = 'deferred' AND o.state = 'succeeded'
           AND NOT EXISTS (SELECT 1 FROM local_receipts r WHERE r.operation_id = o.id)",
    ),
    (
        "delivered_event_without_succeeded_operation",
        "SELECT o.status_ref FROM outbox e JOIN operations o ON o.id = e.operation_id
         WHERE e.state = 'delivered' AND o.state <> 'succeeded' AND o.state <> 'failed'",
    ),
    (
        "failed_operation_not_closed",
        "SELECT o.status_ref FROM operations o JOIN outbox e ON e.operation_id = o.id
         WHERE o.effect_kind = 'deferred' AND o.state = 'failed' AND e.state <> 'delivered'",
    ),
    (
        "succeeded_operation_not_delivered",
        "SELECT o.status_ref FROM operations o JOIN outbox e ON e.operation_id = o.id
         WHERE o.state = 'succeeded' AND e.state <> 'delivered'",
    ),
    (
        "deferred_operation_without_event_or_context",
        "SELECT o.status_ref FROM operations o
         WHERE o.effect_kind = 'deferred'
           AND (NOT EXISTS (SELECT 1 FROM outbox e WHERE e.operation_id = o.id)
             OR NOT EXISTS (SELECT 1 FROM deferred_intents d WHERE d.operation_id = o.id))",
    ),
    (
        "orphan_receipt",
        "SELECT 'receipt:' || r.id FROM local_receipts r JOIN operations o ON o.id = r.operation_id
         LEFT JOIN outbox e ON e.operation_id = o.id
         WHERE o.state <> 'succeeded' OR e.state IS DISTINCT FROM 'delivered'",
    ),
    (
        "approval_not_consumed_by_its_operation",
        "SELECT o.status_ref FROM deferred_intents d JOIN operations o ON o.id = d.operation_id
         LEFT JOIN approvals a ON a.approval_id = d.approval_id
         WHERE d.approval_id IS NOT NULL
           AND (a.consumed_operation IS DISTINCT FROM o.id
             OR a.binding_digest IS DISTINCT FROM d.approval_digest)",
    ),
];

/// Receipts are reported by an opaque hash of their row id, never by content or downstream id.
fn opaque(reference: String) -> String {
    match reference.strip_prefix("receipt:") {
        Some(id) => format!(
            "receipt-{}",
            &sha256_hex(format!("receipt:{id}").as_bytes())[..16]
        ),
        None => reference,
    }
}

fn failed(tx: &mut dyn EffectTx, e: toolledger::Error) -> StoreError {
    toolledger::outbox::store_error(tx, e)
}

fn contract(e: toolledger::Error) -> StoreError {
    StoreError::Contract(e.message)
}

fn rows(
    tx: &mut dyn EffectTx,
    sql: &str,
) -> Result<Vec<Vec<toolledger::effect::SqlValue>>, StoreError> {
    tx.query(sql, &[]).map_err(|e| failed(tx, e))
}

fn column(tx: &mut dyn EffectTx, sql: &str) -> Result<Vec<String>, StoreError> {
    rows(tx, sql)?
        .iter()
        .map(|r| r.text(0).map_err(contract))
        .collect()
}

fn counts_by(tx: &mut dyn EffectTx, sql: &str) -> Result<BTreeMap<String, i64>, StoreError> {
    rows(tx, sql)?
        .iter()
        .map(|r| Ok((r.text(0).map_err(contract)?, r.int(1).map_err(contract)?)))
        .collect()
}

fn scalar(tx: &mut dyn EffectTx, sql: &str) -> Result<i64, StoreError> {
    rows(tx, sql)?
        .first()
        .ok_or_else(|| StoreError::Contract("no row".into()))?
        .int(0)
        .map_err(contract)
}

/// Stored JSON that is not canonical, results or receipts that do not match their digests.
fn content_violations(tx: &mut dyn EffectTx) -> Result<Vec<String>, StoreError> {
    let mut bad = Vec::new();
    let ops = rows(
        tx,
        "SELECT status_ref, arguments, result, result_digest FROM operations
         WHERE effect_kind = 'deferred'",
    )?;
    for r in ops {
        let sr = r.text(0).map_err(contract)?;
        let args = r.text(1).map_err(contract)?;
        let result = r.opt_text(2).map_err(contract)?;
        let digest = r.opt_text(3).map_err(contract)?;
        let args_ok = strict::parse_canonical(args.as_bytes()).is_ok();
        let result_ok = match (&result, &digest) {
            (Some(t), Some(d)) => {
                strict::parse_canonical(t.as_bytes()).is_ok() && sha256_hex(t.as_bytes()) == *d
            }
            (None, None) => true,
            _ => false,
        };
        if !args_ok || !result_ok {
            bad.push(sr);
        }
    }
    for r in rows(tx, "SELECT id, receipt, receipt_digest FROM local_receipts")? {
        let id = r.int(0).map_err(contract)?;
        let receipt = r.text(1).map_err(contract)?;
        let digest = r.text(2).map_err(contract)?;
        if strict::parse_canonical(receipt.as_bytes()).is_err()
            || sha256_hex(receipt.as_bytes()) != digest
        {
            bad.push(opaque(format!("receipt:{id}")));
        }
    }
    Ok(bad)
}

/// SQLite's physical checks: `(pass, checks)`.
fn sqlite_checks(tx: &mut dyn EffectTx) -> Result<(bool, Value), StoreError> {
    let integrity = column(tx, "PRAGMA integrity_check")?;
    let fk = rows(tx, "PRAGMA foreign_key_check")?.len();
    let journal = column(tx, "PRAGMA journal_mode")?.pop().unwrap_or_default();
    let synchronous = scalar(tx, "PRAGMA synchronous")?;
    let integrity_ok = integrity.len() == 1 && integrity[0] == "ok";
    let journal_ok = journal.eq_ignore_ascii_case("wal");
    let sync_ok = synchronous == 2;
    Ok((
        integrity_ok && fk == 0 && journal_ok && sync_ok,
        json!({
            "integrity_check": if integrity_ok { "ok".to_string() } else { format!("{} problems", integrity.len()) },
            "foreign_key_violations": fk,
            "journal_mode": journal.to_ascii_lowercase(),
            "synchronous": match synchronous { 0 => "off", 1 => "normal", 2 => "full", 3 => "extra", _ => "unknown" },
        }),
    ))
}

/// PostgreSQL's physical checks (there is no `integrity_check`): `(pass, checks)`.
fn postgres_checks(tx: &mut dyn EffectTx) -> Result<(bool, Value), StoreError> {
    let unvalidated = scalar(
        tx,
        "SELECT count(*) FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
         WHERE n.nspname = current_schema() AND NOT c.convalidated",
    )?;
    let disabled_fk_triggers = scalar(
        tx,
        "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = current_schema() AND t.tgisinternal AND t.tgenabled = 'D'",
    )?;
    let fsync = column(tx, "SELECT current_setting('fsync')")?
        .pop()
        .unwrap_or_default();
    let sync_commit = column(tx, "SELECT current_setting('synchronous_commit')")?
        .pop()
        .unwrap_or_default();
    let amcheck = scalar(
        tx,
        "SELECT count(*) FROM pg_extension WHERE extname = 'amcheck'",
    )? > 0;
    let index_check = if amcheck {
        let n = scalar(
            tx,
            "SELECT count(*) FROM (SELECT bt_index_check(c.oid) FROM pg_index i
               JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
               JOIN pg_am a ON a.oid = c.relam
             WHERE n.nspname = current_schema() AND a.amname = 'btree') AS checked",
        )?;
        json!(format!("ok ({n} btree indexes)"))
    } else {
        json!("amcheck not installed")
    };
    let pass =
        unvalidated == 0 && disabled_fk_triggers == 0 && fsync == "on" && sync_commit != "off";
    Ok((
        pass,
        json!({
            "unvalidated_constraints": unvalidated,
            "disabled_foreign_key_triggers": disabled_fk_triggers,
            "fsync": fsync,
            "synchronous_commit": sync_commit,
            "index_check": index_check,
        }),
    ))
}

/// Everything read inside the one snapshot.
fn snapshot(tx: &mut dyn EffectTx) -> Result<Value, StoreError> {
    let (physical_ok, checks) = match tx.dialect() {
        Dialect::Sqlite => sqlite_checks(tx)?,
        Dialect::Postgres => postgres_checks(tx)?,
    };
    let mut violations = Vec::new();
    for (rule, sql) in RULES {
        let refs: Vec<String> = column(tx, sql)?.into_iter().map(opaque).collect();
        if !refs.is_empty() {
            violations.push(json!({"rule": rule, "refs": refs}));
        }
    }
    let content = content_violations(tx)?;
    if !content.is_empty() {
        violations.push(json!({"rule": "stored_json_or_digest_mismatch", "refs": content}));
    }
    let counts = json!({
        "operations": counts_by(tx,
            "SELECT state, count(*) FROM operations GROUP BY state ORDER BY state")?,
        "outbox": counts_by(tx,
            "SELECT state, count(*) FROM outbox GROUP BY state ORDER BY state")?,
        "local_receipts": scalar(tx, "SELECT count(*) FROM local_receipts")?,
        "approvals": {
            "issued": scalar(tx, "SELECT count(*) FROM approvals")?,
            "consumed": scalar(tx,
                "SELECT count(*) FROM approvals WHERE consumed_at IS NOT NULL")?,
        },
        "operation_events": scalar(tx, "SELECT count(*) FROM operation_events")?,
    });
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

/// Receipt count of the payments stand-in, read-only, when its file exists.
fn downstream_counts(path: &Path) -> Option<Value> {
    if !path.exists() {
        return None;
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).ok()?;
    let n: i64 = conn
        .query_row("SELECT count(*) FROM downstream_receipts", [], |r| r.get(0))
        .ok()?;
    Some(json!({"receipts": n}))
}

/// Runs `audit` on the ledger `store` resolves to.
pub fn run(store: StoreConfig) -> Result<Outcome, Failure> {
    block_on(async move {
        let ledger = store.open()?;
        let mut report = ledger.read(snapshot).await?;
        if let Some(d) = downstream_counts(&store.downstream) {
            report["downstream"] = d;
        }
        let pass = report["gate"] == "PASS";
        common::print_json(&report);
        Ok(Outcome::pass_if(pass))
    })
}
