//! The migration policy, written once for every driver.
//!
//! Opening a ledger database binds it to a backend id and brings its schema to the versions
//! this program knows — or refuses, and then changes nothing:
//!
//! - a new (empty) database is bound to the requested backend id (or the driver's default)
//!   and built to the current schema;
//! - a database bound to another backend id is refused ([`StoreError::BackendMismatch`]); one
//!   with tables but no bookkeeping is another application's ([`StoreError::NotALedger`]),
//!   and one whose bookkeeping lacks its binding is damaged ([`StoreError::Corrupt`]);
//! - a namespace recorded at a version newer than this program knows is refused
//!   ([`StoreError::SchemaTooNew`]), as is a namespace whose recorded versions have a gap;
//! - a namespace recorded at an older version is refused unless migration is allowed
//!   ([`StoreError::SchemaOutdated`]: run `toolledger migrate`); a namespace never recorded
//!   (tables an application adds) is created without ceremony;
//! - pending migrations run in order — the core namespace ([`CORE_NAMESPACE`]) first, then the
//!   others by name, each by version — and each is recorded as it is applied; [`run`] reports
//!   every one it applied.
//!
//! The migration list itself is checked first ([`plan`]): versions start at 1 with no gap,
//! and one version of a namespace has one SQL text ([`StoreError::MigrationsInvalid`]).
//!
//! A driver opens its bootstrap transaction with its own locking (SQLite: one
//! `BEGIN IMMEDIATE`; PostgreSQL: an advisory lock, after creating its schema), implements
//! [`MigrationHooks`] over that transaction with its own SQL, calls [`run`], and commits only
//! when it returns `Ok` — so a refusal or a failing migration leaves the database as it was.

use std::collections::{BTreeMap, BTreeSet};

use super::{Migration, StoreError};

/// The namespace of the library's own tables; its migrations run before any other.
pub const CORE_NAMESPACE: &str = "toolledger";

/// What a database holds, as its driver reads it at the start of bootstrap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Binding {
    /// Nothing at all: a new database.
    Empty,
    /// Tables, but not the ledger's bookkeeping: another program's database.
    Foreign,
    /// The ledger's bookkeeping, bound to this backend id (`None`: the binding is missing).
    Bound(Option<String>),
}

/// What a driver does for [`run`], inside its one bootstrap transaction and with its own SQL.
/// Every hook reports failures with the driver's [`StoreError`] kinds.
pub trait MigrationHooks {
    /// What the database holds: nothing, someone else's tables, or the ledger's bookkeeping
    /// (`store_metadata`) with the backend id it is bound to.
    fn binding(&mut self) -> Result<Binding, StoreError>;

    /// Creates the bookkeeping tables (`store_metadata`, `schema_migrations`) in an empty
    /// database and binds it to `backend_id`.
    fn bind(&mut self, backend_id: &str) -> Result<(), StoreError>;

    /// Every `(namespace, version)` recorded as applied, in any order.
    fn applied_versions(&mut self) -> Result<Vec<(String, u32)>, StoreError>;

    /// Runs one migration's SQL.
    fn apply(&mut self, migration: &Migration) -> Result<(), StoreError>;

    /// Records `migration` as applied.
    fn record(&mut self, migration: &Migration) -> Result<(), StoreError>;
}

/// What to open a database as.
#[derive(Clone, Copy, Debug)]
pub struct MigrationRequest<'a> {
    /// The backend id the database must be bound to; `None` adopts the existing binding.
    pub backend_id: Option<&'a str>,
    /// The backend id a new database gets when `backend_id` is `None`.
    pub default_backend_id: &'a str,
    /// Every migration this program knows (the driver's core ones and the application's).
    pub migrations: &'a [Migration],
    /// Whether an existing database at an older version may be migrated forward.
    pub allow_migrate: bool,
}

/// What [`run`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrationReport {
    /// The backend id the database is bound to.
    pub backend_id: String,
    /// Whether the database was new (bound and built now).
    pub created: bool,
    /// The migrations applied now, `(namespace, version)` in the order they ran.
    pub applied: Vec<(&'static str, u32)>,
}

fn invalid(namespace: &str, reason: String) -> StoreError {
    StoreError::MigrationsInvalid {
        namespace: namespace.to_string(),
        reason,
    }
}

/// Checks a migration list and puts it in the order it runs: the core namespace first, then
/// the others by name, each by version. A migration given twice with the same SQL counts once.
/// Refused: a version 0, one version with two SQL texts, or versions that do not run 1, 2, 3…
/// without a gap.
pub fn plan(migrations: &[Migration]) -> Result<Vec<Migration>, StoreError> {
    let mut by_ns: BTreeMap<&'static str, BTreeMap<u32, Migration>> = BTreeMap::new();
    for m in migrations {
        if m.namespace.is_empty() || m.namespace.len() > 64 {
            return Err(invalid(
                m.namespace,
                "a namespace is 1 to 64 characters".into(),
            ));
        }
        if m.version == 0 {
            return Err(invalid(m.namespace, "versions start at 1".into()));
        }
        let versions = by_ns.entry(m.namespace).or_default();
        match versions.get(&m.version) {
            Some(seen) if seen.sql != m.sql => {
                return Err(invalid(
                    m.namespace,
                    format!("version {} is given twice with different SQL", m.version),
                ))
            }
            Some(_) => {}
            None => {
                versions.insert(m.version, *m);
            }
        }
    }
    for (ns, versions) in &by_ns {
        for (expected, &version) in (1u32..).zip(versions.keys()) {
            if version != expected {
                return Err(invalid(ns, format!("version {expected} is missing")));
            }
        }
    }
    let core = by_ns.remove(CORE_NAMESPACE);
    Ok(core
        .into_iter()
        .chain(by_ns.into_values())
        .flat_map(BTreeMap::into_values)
        .collect())
}

/// The newest version of each namespace in `ordered`.
fn newest_versions(ordered: &[Migration]) -> BTreeMap<&'static str, u32> {
    let mut known: BTreeMap<&str, u32> = BTreeMap::new();
    for m in ordered {
        let max = known.entry(m.namespace).or_insert(0);
        *max = (*max).max(m.version);
    }
    known
}

/// The recorded version of every namespace in `known` the database has recorded (namespaces
/// this program does not know belong to other programs: left alone), and whether the core
/// namespace is among the recorded ones. A recorded version newer than `known` is
/// [`StoreError::SchemaTooNew`]; recorded versions with a gap are [`StoreError::Corrupt`].
fn recorded_versions<'a>(
    hooks: &mut dyn MigrationHooks,
    known: &BTreeMap<&'a str, u32>,
) -> Result<(BTreeMap<&'a str, u32>, bool), StoreError> {
    let mut recorded: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for (ns, version) in hooks.applied_versions()? {
        recorded.entry(ns).or_default().insert(version);
    }
    let mut have = BTreeMap::new();
    for (&ns, &supported) in known {
        let Some(versions) = recorded.get(ns) else {
            continue;
        };
        let found = versions.last().copied().unwrap_or(0);
        if found > supported {
            return Err(StoreError::SchemaTooNew {
                namespace: ns.to_string(),
                found,
                supported,
            });
        }
        if versions.len() != found as usize || versions.first() != Some(&1) {
            return Err(StoreError::Corrupt(format!(
                "the recorded migrations of {ns} have a gap"
            )));
        }
        have.insert(ns, found);
    }
    Ok((have, recorded.contains_key(CORE_NAMESPACE)))
}

/// Applies the migration policy (see the module docs) through `hooks`. The caller commits its
/// transaction only on `Ok`.
pub fn run(
    hooks: &mut dyn MigrationHooks,
    request: &MigrationRequest<'_>,
) -> Result<MigrationReport, StoreError> {
    let ordered = plan(request.migrations)?;
    let known = newest_versions(&ordered);

    let (backend_id, created) = match hooks.binding()? {
        Binding::Empty => {
            let id = request.backend_id.unwrap_or(request.default_backend_id);
            hooks.bind(id)?;
            (id.to_string(), true)
        }
        Binding::Foreign => {
            return Err(StoreError::NotALedger(
                "a database of another application".into(),
            ))
        }
        Binding::Bound(None) => return Err(StoreError::Corrupt("missing backend id".into())),
        Binding::Bound(Some(bound)) => match request.backend_id {
            Some(wanted) if wanted != bound => return Err(StoreError::BackendMismatch),
            _ => (bound, false),
        },
    };

    let (have, _) = recorded_versions(hooks, &known)?;
    if !created && !request.allow_migrate {
        for (ns, &current) in &known {
            let found = have.get(ns).copied().unwrap_or(0);
            if found > 0 && found < current {
                return Err(StoreError::SchemaOutdated {
                    namespace: (*ns).to_string(),
                    found,
                    current,
                });
            }
        }
    }

    let mut applied = Vec::new();
    for m in &ordered {
        if m.version > have.get(m.namespace).copied().unwrap_or(0) {
            hooks.apply(m)?;
            hooks.record(m)?;
            applied.push((m.namespace, m.version));
        }
    }
    Ok(MigrationReport {
        backend_id,
        created,
        applied,
    })
}

/// The read-only form of [`run`]: checks that the database is a ledger this program can read
/// as it is, and changes nothing. Only the reading hooks ([`MigrationHooks::binding`],
/// [`MigrationHooks::applied_versions`]) are called.
///
/// Refused: an empty or foreign database, or one without a backend id
/// ([`StoreError::NotALedger`]); another backend id ([`StoreError::BackendMismatch`]); no core
/// namespace recorded ([`StoreError::NotALedger`]); a known namespace newer than this program
/// ([`StoreError::SchemaTooNew`]) or older ([`StoreError::SchemaOutdated`]: run `toolledger
/// migrate`); recorded versions with a gap ([`StoreError::Corrupt`]). A namespace this program
/// knows but the database never recorded (an application's tables it does not use) is not
/// an error: it is reported missing, never created. The report's `applied` is always empty.
pub fn check(
    hooks: &mut dyn MigrationHooks,
    request: &MigrationRequest<'_>,
) -> Result<MigrationReport, StoreError> {
    let ordered = plan(request.migrations)?;
    let known = newest_versions(&ordered);
    let backend_id = match hooks.binding()? {
        Binding::Empty => return Err(StoreError::NotALedger("an empty database".into())),
        Binding::Foreign => {
            return Err(StoreError::NotALedger(
                "a database of another application".into(),
            ))
        }
        Binding::Bound(None) => return Err(StoreError::NotALedger("no backend id".into())),
        Binding::Bound(Some(bound)) => match request.backend_id {
            Some(wanted) if wanted != bound => return Err(StoreError::BackendMismatch),
            _ => bound,
        },
    };
    let (have, core_recorded) = recorded_versions(hooks, &known)?;
    if !core_recorded {
        return Err(StoreError::NotALedger("no ledger schema".into()));
    }
    for (ns, &found) in &have {
        let current = known[ns];
        if found < current {
            return Err(StoreError::SchemaOutdated {
                namespace: (*ns).to_string(),
                found,
                current,
            });
        }
    }
    Ok(MigrationReport {
        backend_id,
        created: false,
        applied: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An in-memory database: what the hooks would read and write.
    #[derive(Default)]
    struct Fake {
        foreign_tables: bool,
        bookkeeping: bool,
        backend_id: Option<String>,
        recorded: Vec<(String, u32)>,
        /// Every hook that changed something, in order.
        log: Vec<String>,
        /// A migration whose SQL fails.
        failing: Option<(&'static str, u32)>,
    }

    impl Fake {
        fn bound(id: &str, recorded: &[(&str, u32)]) -> Fake {
            Fake {
                bookkeeping: true,
                backend_id: Some(id.into()),
                recorded: recorded.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
                ..Fake::default()
            }
        }
    }

    impl MigrationHooks for Fake {
        fn binding(&mut self) -> Result<Binding, StoreError> {
            Ok(match (self.bookkeeping, self.foreign_tables) {
                (true, _) => Binding::Bound(self.backend_id.clone()),
                (false, true) => Binding::Foreign,
                (false, false) => Binding::Empty,
            })
        }

        fn bind(&mut self, backend_id: &str) -> Result<(), StoreError> {
            assert!(!self.bookkeeping, "bound twice");
            self.bookkeeping = true;
            self.backend_id = Some(backend_id.into());
            self.log.push(format!("bind {backend_id}"));
            Ok(())
        }

        fn applied_versions(&mut self) -> Result<Vec<(String, u32)>, StoreError> {
            Ok(self.recorded.clone())
        }

        fn apply(&mut self, m: &Migration) -> Result<(), StoreError> {
            if self.failing == Some((m.namespace, m.version)) {
                return Err(StoreError::Unavailable("disk busy".into()));
            }
            self.log
                .push(format!("apply {}:{} {}", m.namespace, m.version, m.sql));
            Ok(())
        }

        fn record(&mut self, m: &Migration) -> Result<(), StoreError> {
            self.recorded.push((m.namespace.to_string(), m.version));
            self.log
                .push(format!("record {}:{}", m.namespace, m.version));
            Ok(())
        }
    }

    const fn m(namespace: &'static str, version: u32, sql: &'static str) -> Migration {
        Migration {
            namespace,
            version,
            sql,
        }
    }

    const CORE: &[Migration] = &[m("toolledger", 1, "core1"), m("toolledger", 2, "core2")];

    fn request<'a>(
        backend_id: Option<&'a str>,
        migrations: &'a [Migration],
        allow_migrate: bool,
    ) -> MigrationRequest<'a> {
        MigrationRequest {
            backend_id,
            default_backend_id: "fake:default",
            migrations,
            allow_migrate,
        }
    }

    #[test]
    fn a_new_database_is_bound_and_built_in_order() {
        let all = [
            m("zeta", 1, "z1"),
            m("app", 2, "a2"),
            CORE[1],
            m("app", 1, "a1"),
            CORE[0],
        ];
        let mut db = Fake::default();
        let report = run(&mut db, &request(Some("alpha"), &all, false)).unwrap();
        assert_eq!(report.backend_id, "alpha");
        assert!(report.created);
        assert_eq!(
            report.applied,
            vec![
                ("toolledger", 1),
                ("toolledger", 2),
                ("app", 1),
                ("app", 2),
                ("zeta", 1)
            ]
        );
        assert_eq!(
            db.log,
            [
                "bind alpha",
                "apply toolledger:1 core1",
                "record toolledger:1",
                "apply toolledger:2 core2",
                "record toolledger:2",
                "apply app:1 a1",
                "record app:1",
                "apply app:2 a2",
                "record app:2",
                "apply zeta:1 z1",
                "record zeta:1",
            ]
        );
        // Opened again: nothing to do.
        let again = run(&mut db, &request(Some("alpha"), &all, false)).unwrap();
        assert!(!again.created);
        assert!(again.applied.is_empty());
    }

    #[test]
    fn a_new_database_without_a_requested_id_gets_the_default() {
        let mut db = Fake::default();
        let report = run(&mut db, &request(None, CORE, false)).unwrap();
        assert_eq!(report.backend_id, "fake:default");
        assert_eq!(db.backend_id.as_deref(), Some("fake:default"));
    }

    #[test]
    fn the_binding_is_adopted_or_must_match() {
        let mut db = Fake::bound("alpha", &[("toolledger", 1), ("toolledger", 2)]);
        let adopted = run(&mut db, &request(None, CORE, false)).unwrap();
        assert_eq!(adopted.backend_id, "alpha");
        assert!(!adopted.created);
        assert!(matches!(
            run(&mut db, &request(Some("beta"), CORE, true)).unwrap_err(),
            StoreError::BackendMismatch
        ));
        assert!(db.log.is_empty(), "nothing changed: {:?}", db.log);
    }

    #[test]
    fn foreign_or_unbound_databases_are_not_adopted() {
        let mut foreign = Fake {
            foreign_tables: true,
            ..Fake::default()
        };
        assert!(matches!(
            run(&mut foreign, &request(None, CORE, true)).unwrap_err(),
            StoreError::NotALedger(_)
        ));
        assert!(foreign.log.is_empty());
        let mut unbound = Fake {
            bookkeeping: true,
            ..Fake::default()
        };
        assert!(matches!(
            run(&mut unbound, &request(None, CORE, true)).unwrap_err(),
            StoreError::Corrupt(_)
        ));
        assert!(unbound.log.is_empty());
    }

    #[test]
    fn a_newer_schema_is_refused_even_with_migrate() {
        let mut db = Fake::bound(
            "s",
            &[("toolledger", 1), ("toolledger", 2), ("toolledger", 3)],
        );
        for allow in [false, true] {
            match run(&mut db, &request(None, CORE, allow)).unwrap_err() {
                StoreError::SchemaTooNew {
                    namespace,
                    found,
                    supported,
                } => assert_eq!((namespace.as_str(), found, supported), ("toolledger", 3, 2)),
                other => panic!("{other:?}"),
            }
        }
        assert!(db.log.is_empty());
    }

    #[test]
    fn an_older_schema_needs_migrate_and_then_runs_only_what_is_pending() {
        let mut db = Fake::bound("s", &[("toolledger", 1)]);
        match run(&mut db, &request(None, CORE, false)).unwrap_err() {
            StoreError::SchemaOutdated {
                namespace,
                found,
                current,
            } => assert_eq!((namespace.as_str(), found, current), ("toolledger", 1, 2)),
            other => panic!("{other:?}"),
        }
        assert!(db.log.is_empty(), "never migrated silently");
        let report = run(&mut db, &request(None, CORE, true)).unwrap();
        assert_eq!(report.applied, vec![("toolledger", 2)]);
        assert_eq!(db.log, ["apply toolledger:2 core2", "record toolledger:2"]);
    }

    #[test]
    fn a_namespace_never_recorded_is_created_without_migrate() {
        let app = [CORE[0], CORE[1], m("app", 1, "a1")];
        let mut db = Fake::bound("s", &[("toolledger", 1), ("toolledger", 2)]);
        let report = run(&mut db, &request(None, &app, false)).unwrap();
        assert_eq!(report.applied, vec![("app", 1)]);
    }

    #[test]
    fn namespaces_of_other_programs_are_left_alone() {
        let mut db = Fake::bound("s", &[("toolledger", 1), ("toolledger", 2), ("other", 7)]);
        let report = run(&mut db, &request(None, CORE, false)).unwrap();
        assert!(report.applied.is_empty());
    }

    #[test]
    fn a_gap_in_the_recorded_versions_is_refused() {
        let mut db = Fake::bound("s", &[("toolledger", 2)]);
        assert!(matches!(
            run(&mut db, &request(None, CORE, true)).unwrap_err(),
            StoreError::Corrupt(_)
        ));
        assert!(db.log.is_empty());
    }

    #[test]
    fn malformed_migration_lists_are_refused_before_anything_runs() {
        let gap = [CORE[0], CORE[1], m("app", 1, "a1"), m("app", 3, "a3")];
        let starts_at_two = [m("app", 2, "a2")];
        let zero = [m("app", 0, "a0")];
        let clash = [m("app", 1, "a1"), m("app", 1, "other")];
        let nameless = [m("", 1, "x")];
        for list in [&gap[..], &starts_at_two, &zero, &clash, &nameless] {
            let mut db = Fake::default();
            let err = run(&mut db, &request(None, list, true)).unwrap_err();
            assert!(
                matches!(err, StoreError::MigrationsInvalid { .. }),
                "{list:?}: {err:?}"
            );
            assert!(db.log.is_empty(), "{list:?}: {:?}", db.log);
        }
    }

    #[test]
    fn a_migration_given_twice_runs_once() {
        let twice = [CORE[0], CORE[1], m("app", 1, "a1"), m("app", 1, "a1")];
        let mut db = Fake::default();
        let report = run(&mut db, &request(None, &twice, false)).unwrap();
        assert_eq!(
            report.applied.iter().filter(|(n, _)| *n == "app").count(),
            1
        );
    }

    #[test]
    fn a_read_only_check_changes_nothing_and_refuses_what_is_not_a_current_ledger() {
        let app = [CORE[0], CORE[1], m("app", 1, "a1")];
        let mut empty = Fake::default();
        assert!(matches!(
            check(&mut empty, &request(None, CORE, false)).unwrap_err(),
            StoreError::NotALedger(_)
        ));
        let mut foreign = Fake {
            foreign_tables: true,
            ..Fake::default()
        };
        assert!(matches!(
            check(&mut foreign, &request(None, CORE, false)).unwrap_err(),
            StoreError::NotALedger(_)
        ));
        let mut old = Fake::bound("s", &[("toolledger", 1)]);
        assert!(matches!(
            check(&mut old, &request(None, CORE, true)).unwrap_err(),
            StoreError::SchemaOutdated { found: 1, .. }
        ));
        let mut newer = Fake::bound(
            "s",
            &[("toolledger", 1), ("toolledger", 2), ("toolledger", 3)],
        );
        assert!(matches!(
            check(&mut newer, &request(None, CORE, false)).unwrap_err(),
            StoreError::SchemaTooNew { found: 3, .. }
        ));
        let mut current = Fake::bound("s", &[("toolledger", 1), ("toolledger", 2)]);
        assert!(matches!(
            check(&mut current, &request(Some("other"), &app, false)).unwrap_err(),
            StoreError::BackendMismatch
        ));
        let report = check(&mut current, &request(None, &app, false)).unwrap();
        assert_eq!(report.backend_id, "s");
        assert!(
            report.applied.is_empty(),
            "the app namespace is not created"
        );
        for db in [&empty, &foreign, &old, &newer, &current] {
            assert!(db.log.is_empty(), "{:?}", db.log);
        }
    }

    #[test]
    fn a_failing_migration_stops_the_run() {
        let mut db = Fake {
            failing: Some(("toolledger", 2)),
            ..Fake::default()
        };
        let err = run(&mut db, &request(None, CORE, false)).unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert_eq!(
            db.log,
            [
                "bind fake:default",
                "apply toolledger:1 core1",
                "record toolledger:1"
            ],
            "nothing after the failure (the driver rolls back the rest)"
        );
    }
}
