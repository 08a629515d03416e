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

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use rusqlite::{Connection, OpenFlags};
use serde_json::{json, Value};
use toolledger::digest::sha256_hex;
use toolledger::json as strict;
use toolledger::store::StoreError;
use toolledger_cli::common;

use crate::cmd_dispatch::{block_on, RuntimeStoreArgs};

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
         WHERE e.state = 'delivered' AND o.state <> 'succeeded'",
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
         WHERE o.state <> 'succeeded' OR e.state IS NOT 'delivered'",
    ),
    (
        "approval_not_consumed_by_its_operation",
        "SELECT o.status_ref FROM deferred_intents d JOIN operations o ON o.id = d.operation_id
         LEFT JOIN approvals a ON a.approval_id = d.approval_id
         WHERE d.approval_id IS NOT NULL
           AND (a.consumed_operation IS NOT o.id OR a.binding_digest IS NOT d.approval_digest)",
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

fn column(conn: &Connection, sql: &str) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

fn counts_by(conn: &Connection, sql: &str) -> Result<BTreeMap<String, i64>, StoreError> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
        .collect::<Result<BTreeMap<_, _>, _>>()?;
    Ok(rows)
}

fn scalar(conn: &Connection, sql: &str) -> Result<i64, StoreError> {
    Ok(conn.query_row(sql, [], |r| r.get(0))?)
}

/// Stored JSON that is not canonical, results or receipts that do not match their digests.
fn content_violations(conn: &Connection) -> Result<Vec<String>, StoreError> {
    let mut bad = Vec::new();
    let mut stmt = conn.prepare(
        "SELECT status_ref, arguments, result, result_digest FROM operations
         WHERE effect_kind = 'deferred'",
    )?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
                r.get::<_, Option<String>>(3)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    for (sr, args, result, digest) in rows {
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
    let mut stmt = conn.prepare("SELECT id, receipt, receipt_digest FROM local_receipts")?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    for (id, receipt, digest) in rows {
        if strict::parse_canonical(receipt.as_bytes()).is_err()
            || sha256_hex(receipt.as_bytes()) != digest
        {
            bad.push(opaque(format!("receipt:{id}")));
        }
    }
    Ok(bad)
}

/// Everything read inside the one snapshot.
fn snapshot(conn: &Connection) -> Result<Value, StoreError> {
    conn.execute_batch("BEGIN")?;
    let out = (|| -> Result<Value, StoreError> {
        let integrity = column(conn, "PRAGMA integrity_check")?;
        let fk: i64 = {
            let mut stmt = conn.prepare("PRAGMA foreign_key_check")?;
            let mut rows = stmt.query([])?;
            let mut n = 0;
            while rows.next()?.is_some() {
                n += 1;
            }
            n
        };
        let journal: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
        let synchronous: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
        let mut violations = Vec::new();
        for (rule, sql) in RULES {
            let refs: Vec<String> = column(conn, sql)?.into_iter().map(opaque).collect();
            if !refs.is_empty() {
                violations.push(json!({"rule": rule, "refs": refs}));
            }
        }
        let content = content_violations(conn)?;
        if !content.is_empty() {
            violations.push(json!({"rule": "stored_json_or_digest_mismatch", "refs": content}));
        }
        let counts = json!({
            "operations": counts_by(conn,
                "SELECT state, count(*) FROM operations GROUP BY state ORDER BY state")?,
            "outbox": counts_by(conn,
                "SELECT state, count(*) FROM outbox GROUP BY state ORDER BY state")?,
            "local_receipts": scalar(conn, "SELECT count(*) FROM local_receipts")?,
            "approvals": {
                "issued": scalar(conn, "SELECT count(*) FROM approvals")?,
                "consumed": scalar(conn,
                    "SELECT count(*) FROM approvals WHERE consumed_at IS NOT NULL")?,
            },
            "operation_events": scalar(conn, "SELECT count(*) FROM operation_events")?,
        });
        let integrity_ok = integrity.len() == 1 && integrity[0] == "ok";
        let journal_ok = journal.eq_ignore_ascii_case("wal");
        let sync_ok = synchronous == 2;
        let pass = integrity_ok && fk == 0 && journal_ok && sync_ok && violations.is_empty();
        Ok(json!({
            "gate": if pass { "PASS" } else { "BLOCK" },
            "code": if pass { "OK" } else { "AUDIT_FAILED" },
            "checks": {
                "integrity_check": if integrity_ok { "ok".to_string() } else { format!("{} problems", integrity.len()) },
                "foreign_key_violations": fk,
                "journal_mode": journal.to_ascii_lowercase(),
                "synchronous": match synchronous { 0 => "off", 1 => "normal", 2 => "full", 3 => "extra", _ => "unknown" },
            },
            "violations": violations,
            "counts": counts,
        }))
    })();
    let _ = conn.execute_batch("COMMIT");
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    out
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

/// Runs `audit`.
pub fn run(args: AuditArgs) -> ExitCode {
    block_on(async move {
        let store = match args.store.open(false) {
            Ok(s) => s,
            Err(code) => return code,
        };
        let mut report = match store.read(snapshot).await {
            Ok(v) => v,
            Err(e) => return common::fail_store(&e),
        };
        if let Some(d) = downstream_counts(&args.store.downstream_path()) {
            report["downstream"] = d;
        }
        let pass = report["gate"] == "PASS";
        common::print_json(&report);
        if pass {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        }
    })
}
