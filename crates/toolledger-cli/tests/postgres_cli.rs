//! The `toolledger` commands with `--database-url`: migrate, principal, the deferred refund
//! path (approve → dispatch with a crash → status → replay → audit) and `demo lost-reply`,
//! whose read-back must equal the SQLite run's. (`TOOLLEDGER_TEST_DATABASE_URL`; skipped with
//! one loud line when unset, failing in CI.)

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::bin;
use toolledger::effect::{EffectTx, RowExt};
use toolledger_testkit::conformance::{test_database_url, Harness};

struct Out {
    code: i32,
    json: Value,
    stderr: String,
}

fn run(url: &str, args: &[&str]) -> Out {
    let out = Command::new(bin())
        .args(args)
        .args(["--database-url", url])
        .env_remove("TOOLLEDGER_DATABASE_URL")
        .output()
        .unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        json: serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim())
            .unwrap_or(Value::Null),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    }
}

fn fixture() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/fixtures/refund-order.json")
        .display()
        .to_string()
}

/// A PostgreSQL schema of its own (`Harness`), its store and URL, and the refund fixture
/// with the path of its downstream's file.
struct Refunds {
    store: toolledger::store::Store,
    url: String,
    ds: String,
    f: String,
    _dir: tempfile::TempDir,
    _h: Harness,
}

impl Refunds {
    /// `toolledger ARGS --fixture F --downstream-db DS` on this schema.
    fn refund(&self, args: &[&str]) -> Out {
        let mut all = args.to_vec();
        all.extend(["--fixture", &self.f, "--downstream-db", &self.ds]);
        run(&self.url, &all)
    }
}

/// [`Refunds`], or `None` (the test skipped, loudly) without a test database.
fn refunds() -> Option<Refunds> {
    let h = Harness::postgres()?;
    let dir = tempfile::tempdir().unwrap();
    Some(Refunds {
        store: h.open(),
        url: h.database_url().unwrap(),
        ds: dir.path().join("payments.sqlite").display().to_string(),
        f: fixture(),
        _dir: dir,
        _h: h,
    })
}

#[test]
fn migrate_principal_and_the_runtime_path_on_postgres() {
    let Some(r) = refunds() else { return };

    let m = run(&r.url, &["migrate"]);
    assert_eq!(m.code, 0, "{}", m.stderr);
    assert_eq!(m.json["backend_id"], "conformance");
    let p = run(
        &r.url,
        &["principal", "add", "carol", "--tenant", "t9", "--token"],
    );
    assert_eq!(p.code, 0, "{}", p.stderr);
    let listed = run(&r.url, &["principal", "list"]);
    assert_eq!(listed.json["principals"][0]["name"], "carol");
    assert_eq!(listed.json["principals"][0]["tokens"], 1);

    let a = r.refund(&["approve", "--approver", "bob"]);
    assert_eq!(a.code, 0, "{}", a.stderr);
    let crash = r.refund(&["dispatch", "--failure", "after_downstream_commit"]);
    assert_eq!(crash.code, 1);
    assert_eq!(crash.json["code"], "OUTCOME_UNKNOWN");
    let status_ref = crash.json["status_ref"].as_str().unwrap().to_string();
    let again = r.refund(&["dispatch"]);
    assert_eq!(again.json["status_ref"], status_ref.as_str());
    assert_eq!(
        again.json["code"], "OUTCOME_UNKNOWN",
        "dispatch only observes"
    );
    let st = r.refund(&["status", "--status-ref", &status_ref]);
    assert_eq!(st.code, 0, "{}", st.stderr);
    assert_eq!(st.json["delivery"], "receipt_reconciled");
    let replay = r.refund(&["dispatch"]);
    assert_eq!(replay.code, 0);
    assert_eq!(replay.json["delivery"], "local_replay");
    let audit = run(&r.url, &["audit", "--downstream-db", &r.ds]);
    assert_eq!(audit.code, 0, "{}", audit.json);
    assert_eq!(audit.json["gate"], "PASS");
    assert_eq!(audit.json["backend"], "postgres");
    assert_eq!(audit.json["checks"]["unvalidated_constraints"], 0);
    assert_eq!(audit.json["counts"]["local_receipts"], 1);

    // A violated semantic rule blocks the audit, by opaque reference only.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(
        r.store
            .write(|tx: &mut dyn EffectTx| tx.execute("DELETE FROM local_receipts", &[])),
    )
    .unwrap();
    let audit = run(&r.url, &["audit", "--downstream-db", &r.ds]);
    assert_eq!(audit.code, 1);
    assert_eq!(
        audit.json["violations"][0]["rule"],
        "succeeded_operation_without_receipt"
    );
    assert_eq!(audit.json["violations"][0]["refs"][0], status_ref.as_str());

    // A schema newer than this program is refused with a stable, path-free code.
    rt.block_on(r.store.write(|tx: &mut dyn EffectTx| {
        tx.execute(
            "INSERT INTO schema_migrations(namespace, version) VALUES ('toolledger', 999)",
            &[],
        )
    }))
    .unwrap();
    let refused = run(&r.url, &["principal", "list"]);
    assert_eq!(refused.code, 2);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(refused.stderr.trim()).unwrap()["error"]["code"],
        "SCHEMA_TOO_NEW"
    );
}

/// One text from `sql` (which yields one row of one column) on `store`.
fn pg_text(
    rt: &tokio::runtime::Runtime,
    store: &toolledger::store::Store,
    sql: &'static str,
) -> String {
    rt.block_on(store.read(
        move |tx: &mut dyn EffectTx| -> Result<String, toolledger::Error> {
            tx.query_opt(sql, &[])?.expect("a row").text(0)
        },
    ))
    .unwrap()
}

/// Schema version 9 undone: the columns of the tables every call writes back to plain text and
/// integers, with their single-column CHECK constraints as versions 1 and 2 named them.
const BEFORE_DOMAINS: &str = "
ALTER TABLE operations
    ALTER COLUMN tenant TYPE TEXT, ALTER COLUMN subject TYPE TEXT, ALTER COLUMN tool TYPE TEXT,
    ALTER COLUMN idempotency_key TYPE TEXT, ALTER COLUMN request_digest TYPE TEXT,
    ALTER COLUMN arguments TYPE TEXT, ALTER COLUMN fingerprint TYPE TEXT,
    ALTER COLUMN effect_kind TYPE TEXT, ALTER COLUMN state TYPE TEXT,
    ALTER COLUMN result TYPE TEXT, ALTER COLUMN result_digest TYPE TEXT,
    ALTER COLUMN status_ref TYPE TEXT,
    ADD CONSTRAINT operations_tenant_check CHECK (length(tenant) BETWEEN 1 AND 128),
    ADD CONSTRAINT operations_subject_check CHECK (length(subject) BETWEEN 1 AND 128),
    ADD CONSTRAINT operations_tool_check CHECK (length(tool) BETWEEN 1 AND 128),
    ADD CONSTRAINT operations_idempotency_key_check
        CHECK (length(idempotency_key) BETWEEN 1 AND 256),
    ADD CONSTRAINT operations_request_digest_check CHECK (length(request_digest) = 64),
    ADD CONSTRAINT operations_arguments_check CHECK (arguments::jsonb IS NOT NULL),
    ADD CONSTRAINT operations_fingerprint_check
        CHECK (fingerprint IS NULL OR length(fingerprint) = 64),
    ADD CONSTRAINT operations_effect_kind_check CHECK (effect_kind IN ('inline', 'deferred')),
    ADD CONSTRAINT operations_state_check CHECK (state IN ('in_progress', 'applied', 'partial',
        'accepted', 'processing', 'succeeded', 'outcome_unknown', 'failed', 'dead')),
    ADD CONSTRAINT operations_result_check CHECK (result IS NULL OR result::jsonb IS NOT NULL),
    ADD CONSTRAINT operations_result_digest_check
        CHECK (result_digest IS NULL OR length(result_digest) = 64),
    ADD CONSTRAINT operations_status_ref_check CHECK (length(status_ref) BETWEEN 8 AND 128);
ALTER TABLE operation_events
    ALTER COLUMN kind TYPE TEXT, ALTER COLUMN detail TYPE TEXT,
    ADD CONSTRAINT operation_events_kind_check CHECK (length(kind) BETWEEN 1 AND 64),
    ADD CONSTRAINT operation_events_detail_check CHECK (detail::jsonb IS NOT NULL);
ALTER TABLE deferred_intents
    ALTER COLUMN provider TYPE TEXT, ALTER COLUMN api_family TYPE TEXT,
    ALTER COLUMN adapter_revision TYPE TEXT, ALTER COLUMN turn_id TYPE TEXT,
    ALTER COLUMN call_id TYPE TEXT, ALTER COLUMN response_id TYPE TEXT,
    ALTER COLUMN downstream_key TYPE TEXT, ALTER COLUMN approval_digest TYPE TEXT,
    ADD CONSTRAINT deferred_intents_provider_check CHECK (length(provider) BETWEEN 1 AND 64),
    ADD CONSTRAINT deferred_intents_api_family_check CHECK (length(api_family) BETWEEN 1 AND 64),
    ADD CONSTRAINT deferred_intents_adapter_revision_check
        CHECK (length(adapter_revision) BETWEEN 1 AND 64),
    ADD CONSTRAINT deferred_intents_turn_id_check CHECK (length(turn_id) BETWEEN 1 AND 128),
    ADD CONSTRAINT deferred_intents_call_id_check CHECK (length(call_id) BETWEEN 1 AND 128),
    ADD CONSTRAINT deferred_intents_response_id_check
        CHECK (length(response_id) BETWEEN 1 AND 128),
    ADD CONSTRAINT deferred_intents_downstream_key_check CHECK (length(downstream_key) = 64),
    ADD CONSTRAINT deferred_intents_approval_digest_check
        CHECK (approval_digest IS NULL OR length(approval_digest) = 64);
ALTER TABLE outbox
    ALTER COLUMN state TYPE TEXT, ALTER COLUMN fencing_token TYPE BIGINT,
    ALTER COLUMN lease_owner TYPE TEXT, ALTER COLUMN attempt_count TYPE BIGINT,
    ALTER COLUMN max_attempts TYPE BIGINT, ALTER COLUMN last_error TYPE TEXT,
    ADD CONSTRAINT outbox_state_check
        CHECK (state IN ('pending', 'processing', 'delivered', 'dead')),
    ADD CONSTRAINT outbox_fencing_token_check CHECK (fencing_token >= 0),
    ADD CONSTRAINT outbox_lease_owner_check
        CHECK (lease_owner IS NULL OR length(lease_owner) BETWEEN 1 AND 128),
    ADD CONSTRAINT outbox_attempt_count_check CHECK (attempt_count >= 0),
    ADD CONSTRAINT outbox_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 1000),
    ADD CONSTRAINT outbox_last_error_check
        CHECK (last_error IS NULL OR length(last_error) BETWEEN 1 AND 64);
ALTER TABLE local_receipts
    ALTER COLUMN receipt_id TYPE TEXT, ALTER COLUMN receipt TYPE TEXT,
    ALTER COLUMN receipt_digest TYPE TEXT, ALTER COLUMN call_binding_digest TYPE TEXT,
    ALTER COLUMN reconciled_via TYPE TEXT, ALTER COLUMN fencing_token TYPE BIGINT,
    ALTER COLUMN query_identity TYPE TEXT,
    ADD CONSTRAINT local_receipts_receipt_id_check CHECK (length(receipt_id) BETWEEN 1 AND 128),
    ADD CONSTRAINT local_receipts_receipt_check
        CHECK (jsonb_typeof(receipt::jsonb) = 'object'),
    ADD CONSTRAINT local_receipts_receipt_digest_check CHECK (length(receipt_digest) = 64),
    ADD CONSTRAINT local_receipts_call_binding_digest_check
        CHECK (length(call_binding_digest) = 64),
    ADD CONSTRAINT local_receipts_reconciled_via_check
        CHECK (reconciled_via IN ('worker', 'status_query')),
    ADD CONSTRAINT local_receipts_fencing_token_check
        CHECK (fencing_token IS NULL OR fencing_token > 0),
    ADD CONSTRAINT local_receipts_query_identity_check
        CHECK (query_identity IS NULL OR length(query_identity) BETWEEN 1 AND 128);
DROP DOMAIN tl_text_1_64, tl_text_1_128, tl_text_1_256, tl_status_ref, tl_sha256_hex, tl_json,
    tl_json_object, tl_effect_kind, tl_operation_state, tl_outbox_state, tl_reconciled_via,
    tl_count, tl_attempt_limit, tl_fencing_token;
";

#[test]
fn migrating_a_version_6_ledger_on_postgres_keeps_its_operations_under_one_scope_index() {
    let Some(r) = refunds() else { return };
    assert_eq!(r.refund(&["approve", "--approver", "bob"]).code, 0);
    let first = r.refund(&["dispatch"]);
    assert_eq!(first.code, 0, "{}", first.stderr);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let indexes = "SELECT string_agg(indexdef, ' | ' ORDER BY indexname) FROM pg_indexes
                   WHERE schemaname = current_schema() AND tablename = 'operations'";
    let rows = "SELECT string_agg(id || ':' || tenant || ':' || subject || ':' || tool || ':' ||
                    idempotency_key || ':' || state || ':' || status_ref || ':' || result_digest,
                    ',' ORDER BY id) FROM operations";
    let migrated = pg_text(&rt, &r.store, indexes);
    assert!(
        migrated.contains("UNIQUE INDEX operations_scope_key ON")
            && migrated.contains("(tool, idempotency_key, tenant, subject)"),
        "{migrated}"
    );
    assert!(!migrated.contains("operations_by_tool_key"), "{migrated}");
    // Turn the database into a schema-v6 ledger: the scope unique in its old column order and
    // the `(tool, idempotency_key)` index of its own, versions 7 to 9 not applied.
    rt.block_on(r.store.write(|tx: &mut dyn EffectTx| {
        tx.execute(
            "ALTER TABLE operations ADD CONSTRAINT operations_tenant_subject_tool_idempotency_key_key
                 UNIQUE (tenant, subject, tool, idempotency_key)",
            &[],
        )?;
        tx.execute("ALTER TABLE operations DROP CONSTRAINT operations_scope_key", &[])?;
        tx.execute(
            "CREATE INDEX operations_by_tool_key ON operations(tool, idempotency_key)",
            &[],
        )?;
        // Version 8 (the re-plan guard's index) and 9 (the domains) came after it.
        tx.execute("DROP INDEX operations_unsettled_by_digest", &[])?;
        tx.execute_batch(BEFORE_DOMAINS)?;
        tx.execute(
            "DELETE FROM schema_migrations WHERE namespace = 'toolledger' AND version >= 7",
            &[],
        )
    }))
    .unwrap();
    let before = pg_text(&rt, &r.store, rows);
    assert!(before.contains(":succeeded:"), "{before}");
    assert!(pg_text(&rt, &r.store, indexes).contains("operations_by_tool_key"));
    assert_eq!(
        run(&r.url, &["audit", "--downstream-db", &r.ds]).code,
        2,
        "SCHEMA_OUTDATED"
    );

    let m = run(&r.url, &["migrate"]);
    assert_eq!(m.code, 0, "{}", m.stderr);
    assert_eq!(pg_text(&rt, &r.store, indexes), migrated);
    assert_eq!(pg_text(&rt, &r.store, rows), before);
    let audit = run(&r.url, &["audit", "--downstream-db", &r.ds]);
    assert_eq!(audit.json["gate"], "PASS", "{}", audit.json);
    // Version 9 made the single-column rules domains, and they still refuse what they refused.
    let domains = "SELECT count(*)::text FROM information_schema.columns
                   WHERE table_schema = current_schema() AND domain_name LIKE 'tl\\_%'";
    assert_eq!(pg_text(&rt, &r.store, domains), "35");
    for bad in [
        "UPDATE operations SET state = 'settled'",
        "UPDATE operations SET arguments = '{not json'",
        "UPDATE outbox SET max_attempts = 0",
        "UPDATE operation_events SET kind = ''",
        "UPDATE local_receipts SET receipt = '[]'",
    ] {
        let refused = rt.block_on(
            r.store
                .write(move |tx: &mut dyn EffectTx| tx.execute(bad, &[]).map(|_| ())),
        );
        assert!(refused.is_err(), "{bad} is refused");
    }
    assert_eq!(pg_text(&rt, &r.store, rows), before);
    // The migrated operation replays under its key.
    let replay = r.refund(&["dispatch"]);
    assert_eq!(replay.code, 0, "{}", replay.stderr);
    assert_eq!(replay.json["delivery"], "local_replay");
    assert_eq!(replay.json["status_ref"], first.json["status_ref"]);
}

#[test]
fn an_unreachable_database_is_a_clean_store_error() {
    if test_database_url().is_none() {
        return;
    }
    let out = run(
        "postgres://nobody@127.0.0.1:1/none?connect_timeout=2",
        &["principal", "list"],
    );
    assert_eq!(out.code, 2);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(out.stderr.trim()).unwrap()["error"]["code"],
        "DATABASE_UNREACHABLE"
    );
}

fn strip_volatile(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| {
                    ![
                        "observedAt",
                        "backend",
                        "scopeBinding",
                        "statusRef",
                        "database",
                    ]
                    .contains(&k.as_str())
                })
                .map(|(k, v)| (k.clone(), strip_volatile(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_volatile).collect()),
        other => other.clone(),
    }
}

#[test]
fn demo_lost_reply_reads_back_the_same_on_postgres_as_on_sqlite() {
    let Some(url) = test_database_url() else {
        return;
    };
    let on = |extra: &[&str]| -> Value {
        let out = Command::new(bin())
            .args(["demo", "lost-reply"])
            .args(extra)
            .env_remove("TOOLLEDGER_DATABASE_URL")
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let sqlite = on(&[]);
    let postgres = on(&["--database-url", &url]);
    assert_eq!(postgres["ok"], true, "{postgres}");
    assert_eq!(sqlite["database"], "sqlite");
    assert_eq!(postgres["database"], "postgres");
    assert_eq!(strip_volatile(&sqlite), strip_volatile(&postgres));
}

#[test]
fn bench_runs_the_ledger_workloads_on_postgres() {
    let Some(url) = test_database_url() else {
        return;
    };
    let out = Command::new(bin())
        .args(["bench", "--backend", "postgres", "--database-url", &url])
        .args(["--ops", "60", "--concurrency", "1", "--concurrency", "4"])
        .env_remove("TOOLLEDGER_DATABASE_URL")
        .output()
        .unwrap();
    let lines = support::json_lines(out);
    let names: Vec<(String, u64)> = lines
        .iter()
        .map(|v| {
            (
                v["workload"].as_str().unwrap().to_string(),
                v["concurrency"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("ceiling".to_string(), 1),
            ("fresh".to_string(), 1),
            ("fresh".to_string(), 4),
            ("replay".to_string(), 1),
            ("replay".to_string(), 4),
            ("conflict".to_string(), 1),
            ("conflict".to_string(), 4),
        ]
    );
    for v in &lines {
        assert_eq!(v["backend"], "postgres", "{v}");
        assert_eq!(v["succeeded"], 60, "{v}");
        assert_eq!(v["failed"], 0, "{v}");
    }
    let refused = Command::new(bin())
        .args(["bench", "--backend", "postgres", "--workload", "mcp-stdio"])
        .args(["--database-url", &url])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
}

#[test]
fn the_retention_soak_runs_on_postgres() {
    let Some(url) = test_database_url() else {
        return;
    };
    let out = Command::new(bin())
        .args(["bench", "--backend", "postgres", "--database-url", &url])
        .args(support::SOAK_ARGS)
        .env_remove("TOOLLEDGER_DATABASE_URL")
        .output()
        .unwrap();
    let lines = support::json_lines(out);
    support::check_soak_lines(&lines, "postgres", 400);
}

#[test]
fn serve_and_proxy_without_keys_on_postgres_name_the_missing_variables() {
    let Some(h) = Harness::postgres() else { return };
    let store = h.open();
    let url = h.database_url().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ds = dir.path().join("payments.sqlite").display().to_string();
    assert_eq!(run(&url, &["migrate"]).code, 0);
    let key = "ab".repeat(32);
    let start = |args: &[&str], state_key: Option<&str>| {
        let mut command = Command::new(bin());
        // The URL before any `--`: what follows one is the proxy's upstream command.
        command
            .arg(args[0])
            .args(["--database-url", &url])
            .args(&args[1..])
            .current_dir(dir.path())
            .env_remove("TOOLLEDGER_DATABASE_URL")
            .env_remove("TOOLLEDGER_STATE_KEY_HEX")
            .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX");
        if let Some(k) = state_key {
            command.env("TOOLLEDGER_STATE_KEY_HEX", k);
        }
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        let v: Value = serde_json::from_str(&stderr).unwrap_or_else(|e| panic!("{e}: {stderr}"));
        assert_eq!(v["error"]["code"], "KEY_ERROR", "{stderr}");
        let message = v["error"]["message"].as_str().unwrap().to_string();
        // No path, no URL, no key: only the variables and how to make a key.
        for leak in ["/", "postgres:", "127.0.0.1", &key] {
            assert!(!message.contains(leak), "{leak:?} in {message}");
        }
        assert!(message.contains("openssl rand -hex 32"), "{message}");
        message
    };
    let serve = ["serve", "--http", "127.0.0.1:0", "--downstream-db", &ds];
    let proxy = ["proxy", "--http", "127.0.0.1:0", "--", "true"];
    for args in [&serve[..], &proxy[..]] {
        let message = start(args, None);
        assert!(
            message.starts_with(
                "TOOLLEDGER_STATE_KEY_HEX and TOOLLEDGER_FINGERPRINT_KEY_HEX are not set"
            ),
            "{args:?}: {message}"
        );
        // With the state key given, only the fingerprint key is named.
        let message = start(args, Some(&key));
        assert!(
            message.starts_with("TOOLLEDGER_FINGERPRINT_KEY_HEX is not set"),
            "{args:?}: {message}"
        );
        assert!(!message.contains("TOOLLEDGER_STATE_KEY_HEX"), "{message}");
    }
    // Nothing was recorded: the keys are checked before they are bound to the database.
    assert_eq!(
        toolledger_testkit::db::scalar_blocking(&store, "SELECT count(*) FROM key_ids"),
        0
    );
}
