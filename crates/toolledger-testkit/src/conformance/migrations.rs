//! Schema binding and migrations: the backend id a database is bound to, outdated and too-new
//! schemas, and concurrent first opens.

use toolledger::effect::{Dialect, EffectTx};
use toolledger::store::{Migration, Store, StoreError};

use super::harness::Harness;
use crate::db::count;

/// The database is bound to its backend id; another id is refused, an unknown newer schema
/// is refused, an older one needs an explicit migrate.
pub async fn schema_binding_and_migrations(h: &Harness) {
    let first = h.open();
    assert_eq!(first.backend_id(), "conformance");
    let adopted = h.open_with(None, (&[], &[]), false).unwrap();
    assert_eq!(adopted.backend_id(), "conformance");
    assert!(matches!(
        h.open_with(Some("other"), (&[], &[]), false).unwrap_err(),
        StoreError::BackendMismatch
    ));
    const V1: &[Migration] = &[Migration {
        namespace: "conformance.extra",
        version: 1,
        sql: "CREATE TABLE extra_a(x BIGINT NOT NULL);",
    }];
    const V2: &[Migration] = &[
        V1[0],
        Migration {
            namespace: "conformance.extra",
            version: 2,
            sql: "CREATE TABLE extra_b(x BIGINT NOT NULL);",
        },
    ];
    h.open_with(None, (V1, V1), false).unwrap();
    assert!(matches!(
        h.open_with(None, (V2, V2), false).unwrap_err(),
        StoreError::SchemaOutdated {
            found: 1,
            current: 2,
            ..
        }
    ));
    let migrated = h.open_with(None, (V2, V2), true).unwrap();
    assert_eq!(count(&migrated, "extra_b").await, 0);
    migrated
        .write(|tx: &mut dyn EffectTx| {
            tx.execute(
                "INSERT INTO schema_migrations(namespace, version) VALUES ('toolledger', 999)",
                &[],
            )
        })
        .await
        .unwrap();
    assert!(matches!(
        h.open_with(None, (V2, V2), false).unwrap_err(),
        StoreError::SchemaTooNew { found: 999, .. }
    ));
}

/// Opening a new database from eight threads at once builds it exactly once.
pub async fn concurrent_first_opens_do_not_race(h: &Harness) {
    let opened: Vec<Result<Store, StoreError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| h.open_with(Some("conformance"), (&[], &[]), false)))
            .collect();
        handles.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for o in &opened {
        assert!(o.is_ok(), "{o:?}");
    }
    let store = opened.into_iter().next().unwrap().unwrap();
    // The driver's core migrations and the harness's own one, each recorded once.
    let core = match h.dialect() {
        Dialect::Sqlite => toolledger::store::sqlite::CORE_MIGRATIONS.len(),
        _ => toolledger::store::postgres::CORE_MIGRATIONS.len(),
    };
    assert_eq!(count(&store, "schema_migrations").await, core as i64 + 1);
}
