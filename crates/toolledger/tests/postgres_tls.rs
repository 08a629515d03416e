//! TLS to PostgreSQL: `sslmode=require` and the default `prefer` really encrypt (the server's
//! `pg_stat_ssl` says so), `disable` does not, and the `verify-*` modes check the certificate.
//! (`TOOLLEDGER_TEST_DATABASE_URL`; skipped with one loud line when unset, failing in CI.)
//!
//! The server must have `ssl = on`. Debian's packaged cluster, which `.ci/run` starts, has it on
//! with the snakeoil certificate, so in CI (`TOOLLEDGER_CI` set) a server without TLS fails
//! these tests; locally they are skipped with one loud line.

use toolledger::effect::{EffectTx, RowExt};
use toolledger::store::postgres::{PgOptions, PgStore};
use toolledger::store::StoreError;
use toolledger_testkit::db::{test_database_url, with_param, ServerLock, CI_ENV};

fn scalar_text(store: &PgStore, sql: &'static str) -> Result<String, StoreError> {
    toolledger::store::Store::from(store.clone()).read_blocking(move |tx: &mut dyn EffectTx| {
        tx.query_opt(sql, &[])
            .map_err(|e| StoreError::Database(e.to_string()))?
            .expect("a row")
            .text(0)
            .map_err(|e| StoreError::Database(e.to_string()))
    })
}

/// Whether this session's connection is encrypted, as the server sees it.
fn session_uses_tls(url: &str) -> Result<bool, StoreError> {
    let store = PgStore::open_unchecked(url, PgOptions::any_backend())?;
    let ssl = scalar_text(
        &store,
        "SELECT CASE WHEN ssl THEN 'on' ELSE 'off' END FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )?;
    Ok(ssl == "on")
}

/// The test URL and the server's certificate file, when the server speaks TLS.
fn tls_server() -> Option<(String, String, ServerLock)> {
    let url = test_database_url()?;
    let lock = ServerLock::acquire(false).unwrap();
    let plain = with_param(&url, "sslmode=disable");
    let store = PgStore::open_unchecked(&plain, PgOptions::any_backend()).unwrap();
    let ssl = scalar_text(&store, "SELECT current_setting('ssl')").unwrap();
    if ssl != "on" {
        let msg = "!!! PostgreSQL TLS tests: the test server has ssl = off, so sslmode=require \
                   cannot be tested; turn ssl on (Debian's cluster has it on by default) !!!";
        if std::env::var_os(CI_ENV).is_some() {
            panic!("{msg}");
        }
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{msg}");
        return None;
    }
    let cert = scalar_text(&store, "SELECT current_setting('ssl_cert_file')").unwrap();
    Some((url, cert, lock))
}

#[test]
fn sslmode_require_and_prefer_encrypt_and_disable_does_not() {
    let Some((url, _, _lock)) = tls_server() else {
        return;
    };
    assert!(session_uses_tls(&with_param(&url, "sslmode=require")).unwrap());
    assert!(
        session_uses_tls(&url).unwrap(),
        "the default (prefer) uses TLS when the server offers it"
    );
    assert!(session_uses_tls(&with_param(&url, "sslmode=prefer")).unwrap());
    assert!(!session_uses_tls(&with_param(&url, "sslmode=disable")).unwrap());
}

#[test]
fn a_whole_ledger_runs_over_tls() {
    let Some((url, _, _lock)) = tls_server() else {
        return;
    };
    let schema = toolledger_testkit::db::fresh_schema_name();
    let url = with_param(&url, "sslmode=require");
    let store = PgStore::open(&url, PgOptions::new("tls").in_schema(schema.clone())).unwrap();
    assert_eq!(store.backend_id(), "tls");
    let ssl = scalar_text(
        &store,
        "SELECT CASE WHEN ssl THEN 'on' ELSE 'off' END FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )
    .unwrap();
    assert_eq!(ssl, "on");
    store.drop_schema_blocking().unwrap();
}

#[test]
fn verify_modes_check_the_server_certificate() {
    let Some((url, cert, _lock)) = tls_server() else {
        return;
    };
    // The Mozilla roots do not vouch for a test server's self-signed certificate.
    let err = session_uses_tls(&with_param(&url, "sslmode=verify-full")).unwrap_err();
    assert!(matches!(err, StoreError::Unreachable(_)), "{err:?}");
    let err = session_uses_tls(&with_param(&url, "sslmode=verify-ca")).unwrap_err();
    assert!(matches!(err, StoreError::Unreachable(_)), "{err:?}");
    // The server's own certificate as the root: verify-ca accepts it.
    if std::fs::metadata(&cert).is_ok() {
        let ca = with_param(&url, &format!("sslmode=verify-ca&sslrootcert={cert}"));
        assert!(session_uses_tls(&ca).unwrap());
        // `require` with a root certificate checks the chain too (libpq's rule).
        let other = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            other.path(),
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let bad = with_param(
            &url,
            &format!("sslmode=require&sslrootcert={}", other.path().display()),
        );
        let err = PgStore::open_unchecked(&bad, PgOptions::any_backend()).unwrap_err();
        assert!(
            !err.to_string()
                .contains(&other.path().display().to_string()),
            "{err}"
        );
    }
}
