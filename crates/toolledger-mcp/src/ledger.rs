//! [`LedgerGuard`]: everything a guarded rmcp server needs, opened by one builder.
//!
//! ```no_run
//! # fn main() -> Result<(), toolledger_mcp::OpenError> {
//! let ledger = toolledger_mcp::LedgerGuard::builder()
//!     .database("notes.sqlite") // or "postgres://user@host:5432/db"
//!     .principal("alice") // stdio: the trusted caller; HTTP: `.bearer_tokens()`
//!     .open()?;
//! # let _ = ledger; Ok(()) }
//! ```
//!
//! The database is a SQLite file unless it is a `postgres://` (or `postgresql://`) URL.
//! The application's own tables come as [`Migration`]s applied beside the ledger's on either
//! backend, so their SQL must be portable: `BIGINT`/`TEXT` columns, `PRIMARY KEY`, `NOT NULL`,
//! `CHECK`, `UNIQUE`, no `STRICT`, no `AUTOINCREMENT`/`SERIAL`/identity columns (compute an id
//! in the effect, e.g. `coalesce(max(id), 0) + 1`, or use a natural key).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use toolledger::authz::PrincipalStore;
use toolledger::clock::{SharedClock, SystemClock};
use toolledger::engine::{Engine, FaultHook};
use toolledger::is_postgres_url;
use toolledger::model::Error;
use toolledger::runtime::{Deadlines, Registry, Runtime};
use toolledger::store::{Migration, Store, StoreError};
use toolledger::{Ledger, LedgerOptions};

use crate::caller::CallerSource;
use crate::guard::{Guard, GuardConfig};
use crate::keys::{KeyError, KeyMaterial};
use crate::status::EffectObserver;
use crate::status::LedgerResultObserver;

/// Why [`LedgerGuardBuilder::open`] failed. Messages name no paths, URLs or SQL. Its `Debug`
/// is its message, so a `main` that returns it prints what to fix.
#[derive(thiserror::Error)]
pub enum OpenError {
    /// No database was named.
    #[error(
        "no database given: name a SQLite file or a postgres:// URL (TOOLLEDGER_DATABASE_URL, \
         or TOOLLEDGER_DB for a SQLite file)"
    )]
    NoDatabase,
    /// The store could not be opened, bound or migrated.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The keys could not be loaded.
    #[error(transparent)]
    Keys(#[from] KeyError),
    /// PostgreSQL has no key file beside it: the keys must come from the environment (or
    /// [`LedgerGuardBuilder::keys`]).
    #[error(
        "a PostgreSQL ledger needs TOOLLEDGER_STATE_KEY_HEX and TOOLLEDGER_FINGERPRINT_KEY_HEX"
    )]
    KeysRequired,
    /// The guard refused its keys or configuration.
    #[error("{0}")]
    Guard(Error),
}

impl std::fmt::Debug for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Builds a [`LedgerGuard`]; see [`LedgerGuard::builder`].
#[derive(Default)]
pub struct LedgerGuardBuilder {
    database: Option<String>,
    store: Option<Store>,
    fault_hook: Option<FaultHook>,
    backend_id: Option<String>,
    migrations: Vec<Migration>,
    migrate: bool,
    keys: Option<KeyMaterial>,
    caller: Option<CallerSource>,
    clock: Option<SharedClock>,
    config: GuardConfig,
    revision: Option<String>,
    observers: BTreeMap<String, Arc<dyn EffectObserver>>,
    deferred: Option<Registry>,
    /// `None`: the runtime's default window.
    replan_window: Option<Option<i64>>,
}

impl std::fmt::Debug for LedgerGuardBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerGuardBuilder")
            .field("backend_id", &self.backend_id)
            .field("migrations", &self.migrations.len())
            .field("caller", &self.caller)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The environment variable [`LedgerGuardBuilder::from_env`] reads a PostgreSQL URL from (or,
/// as for the `toolledger` binary, any database: a SQLite file too).
pub const DATABASE_URL_ENV: &str = "TOOLLEDGER_DATABASE_URL";
/// The environment variable [`LedgerGuardBuilder::from_env`] reads a SQLite file from when
/// [`DATABASE_URL_ENV`] is not set: the one the `toolledger` binary's `--db` reads.
pub const DB_ENV: &str = "TOOLLEDGER_DB";
/// The environment variable [`LedgerGuardBuilder::from_env`] reads the stdio caller from.
pub const PRINCIPAL_ENV: &str = "TOOLLEDGER_PRINCIPAL";
/// The stdio caller when [`PRINCIPAL_ENV`] is not set.
pub const DEFAULT_PRINCIPAL: &str = "local";

impl LedgerGuardBuilder {
    /// A builder configured from the environment, as the `toolledger` binary is:
    /// - the database from `TOOLLEDGER_DATABASE_URL` (a `postgres://` URL, or a SQLite file),
    ///   else the SQLite file `TOOLLEDGER_DB` (neither set: [`OpenError::NoDatabase`]);
    /// - the keys as [`LedgerGuardBuilder::keys`] says by default (`TOOLLEDGER_STATE_KEY_HEX`
    ///   and `TOOLLEDGER_FINGERPRINT_KEY_HEX`, else the key file beside a SQLite database);
    /// - every call made by the principal `TOOLLEDGER_PRINCIPAL` (default `local`), as a stdio
    ///   server's caller is ([`crate::LedgerGuard::serve_stdio`]).
    ///
    /// The other settings keep their defaults and may still be changed.
    pub fn from_env() -> Self {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        let builder = LedgerGuardBuilder::default();
        let builder = match var(DATABASE_URL_ENV).or_else(|| var(DB_ENV)) {
            Some(database) => builder.database(database),
            None => builder,
        };
        builder.principal(var(PRINCIPAL_ENV).unwrap_or_else(|| DEFAULT_PRINCIPAL.into()))
    }

    /// The ledger database: a SQLite file path, or a `postgres://` URL for PostgreSQL.
    pub fn database(mut self, path_or_url: impl Into<String>) -> Self {
        self.database = Some(path_or_url.into());
        self
    }

    /// A ledger the application opened itself (its own store options, a shared store), used
    /// instead of opening [`LedgerGuardBuilder::database`]: it must be open and migrated
    /// already, so [`LedgerGuardBuilder::backend_id`], [`LedgerGuardBuilder::migrations`] and
    /// [`LedgerGuardBuilder::allow_migrate`] do not apply. The keys are still bound to it.
    /// Without [`LedgerGuardBuilder::keys`] they come from the environment, or from the key
    /// file beside [`LedgerGuardBuilder::database`] when it names the store's SQLite file.
    pub fn store(mut self, store: impl Into<Store>) -> Self {
        self.store = Some(store.into());
        self
    }

    /// The backend id the database must be bound to (default: adopt the existing binding; a
    /// new database is bound to `sqlite:default` or `postgres:default`).
    pub fn backend_id(mut self, id: impl Into<String>) -> Self {
        self.backend_id = Some(id.into());
        self
    }

    /// The application's own migrations, applied on either backend (portable SQL; see the
    /// module docs).
    pub fn migrations(mut self, migrations: &[Migration]) -> Self {
        self.migrations.extend_from_slice(migrations);
        self
    }

    /// Applies pending migrations to an existing database (default: refuse an older schema).
    pub fn allow_migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// The state and fingerprint keys. Default: [`KeyMaterial::load`], i.e. the environment,
    /// else (SQLite only) a 0600 key file beside the database.
    pub fn keys(mut self, keys: KeyMaterial) -> Self {
        self.keys = Some(keys);
        self
    }

    /// Every call is made by principal `name` (trusted configuration, e.g. stdio), re-read
    /// from the principal store on every call.
    pub fn principal(mut self, name: impl Into<String>) -> Self {
        self.caller = Some(CallerSource::Configured(name.into()));
        self
    }

    /// Every call is made by the principal its bearer token resolved to (HTTP behind
    /// `bearer_auth`, feature `http`). This is the default: without a bearer layer no call
    /// has a caller, so nothing runs.
    pub fn bearer_tokens(mut self) -> Self {
        self.caller = Some(CallerSource::BearerToken);
        self
    }

    /// The clock deadlines and timestamps are measured with (default: wall-clock time).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// A hook the engine calls at its crash points of a fresh call (after the ledger row, after
    /// the effect, after the commit; never on a replay): a testing aid for crash-recovery
    /// tests, which end the process there. Default: none.
    pub fn fault_hook(mut self, hook: FaultHook) -> Self {
        self.fault_hook = Some(hook);
        self
    }

    /// Deadlines and namespace rules (default: [`GuardConfig::default`]).
    pub fn config(mut self, config: GuardConfig) -> Self {
        self.config = config;
        self
    }

    /// The contract revision every guarded tool is bound to (default `"1"`). Change it when a
    /// tool's arguments, effect or result change meaning: an old operation id then conflicts
    /// instead of replaying a result of the old contract.
    pub fn revision(mut self, revision: impl Into<String>) -> Self {
        self.revision = Some(revision.into());
        self
    }

    /// The observer `get_operation_status` asks about `tool`'s effect rows. Default for every
    /// tool: [`LedgerResultObserver`] (the stored result names its row as `effectId`).
    pub fn observer(mut self, tool: impl Into<String>, observer: Arc<dyn EffectObserver>) -> Self {
        self.observers.insert(tool.into(), observer);
        self
    }

    /// The tools whose effect the runtime delivers (external calls, [`Registry::external`],
    /// or any deferred tools): their calls run through [`crate::Guarded::deliver`], and
    /// `get_operation_status` on one whose outcome is unknown runs the tool's status query
    /// (an external call's lookup) to reconcile it. The runtime shares the ledger, clock and
    /// deadlines.
    pub fn deferred(mut self, registry: Registry) -> Self {
        self.deferred = Some(registry);
        self
    }

    /// The re-plan guard's window for the deferred tools (default one day,
    /// [`toolledger::runtime::DEFAULT_REPLAN_WINDOW_SECONDS`]; `None` turns it off): a call
    /// under a new operation id whose intent equals an operation of the same caller and tool
    /// accepted within the window and still unsettled is refused with `possible_duplicate`
    /// naming it, unless its `_meta` says `"io.toolledger/new_intent": true`. See
    /// [`toolledger::runtime::Runtime::with_replan_window`].
    pub fn replan_window(mut self, window: Option<std::time::Duration>) -> Self {
        self.replan_window = Some(window.map(|d| d.as_secs().min(i64::MAX as u64) as i64));
        self
    }

    /// Opens the database (creating and migrating a new one) unless a
    /// [`LedgerGuardBuilder::store`] was given, loads the keys, binds them to the ledger (keys
    /// other than the ones it was written with are [`OpenError::Keys`]) and builds the guard. Blocking: call it before serving (or from `spawn_blocking`).
    pub fn open(self) -> Result<LedgerGuard, OpenError> {
        let database = self.database;
        if self.store.is_none() && database.is_none() {
            return Err(OpenError::NoDatabase);
        }
        let postgres = database.as_deref().is_some_and(is_postgres_url);
        // Keys first: a configuration that cannot run must not create or migrate anything.
        let key_file = database.as_deref().filter(|_| !postgres).map(Path::new);
        let keys = match self.keys {
            Some(keys) => keys,
            None => match KeyMaterial::load(key_file) {
                Err(KeyError::Unset { .. }) if postgres => return Err(OpenError::KeysRequired),
                other => other?,
            },
        };
        let store = match (self.store, database) {
            (Some(store), _) => store,
            (None, Some(database)) => {
                let opts = LedgerOptions {
                    backend_id: self.backend_id,
                    sqlite_migrations: self.migrations.clone(),
                    postgres_migrations: self.migrations,
                    migrate: self.migrate,
                    schema: None,
                };
                Ledger::open_with(&database, opts)?.into()
            }
            (None, None) => unreachable!("no database is refused above"),
        };
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        crate::keys::bind_blocking(&store, &keys, clock.now())?;
        let mut engine = Engine::new(store.clone(), clock.clone());
        if let Some(hook) = self.fault_hook {
            engine = engine.with_fault_hook(hook);
        }
        let deadlines = Deadlines {
            authority_ttl: Some(self.config.authority_ttl),
            retention_ttl: Some(self.config.retention_ttl),
        };
        let runtime = self.deferred.map(|r| {
            Runtime::new(store.clone(), clock.clone(), r)
                .with_deadlines(deadlines)
                .with_replan_window(
                    self.replan_window
                        .unwrap_or(Some(toolledger::runtime::DEFAULT_REPLAN_WINDOW_SECONDS)),
                )
        });
        let guard = Guard::new(engine, &keys, self.config).map_err(OpenError::Guard)?;
        Ok(LedgerGuard {
            inner: Arc::new(Inner {
                guard,
                principals: PrincipalStore::new(store).with_clock(clock),
                revision: self.revision.unwrap_or_else(|| "1".into()),
                observers: self.observers,
                runtime,
            }),
            caller: self.caller.unwrap_or(CallerSource::BearerToken),
        })
    }
}

#[derive(Clone)]
struct Inner {
    guard: Guard,
    principals: PrincipalStore,
    revision: String,
    observers: BTreeMap<String, Arc<dyn EffectObserver>>,
    runtime: Option<Runtime>,
}

/// An open ledger with its guard, principal store and caller source. Cheap to clone.
///
/// Serve tools through it with [`LedgerGuard::router`]; a tool takes a
/// [`crate::Guarded`] argument to run its effect under the ledger.
#[derive(Clone)]
pub struct LedgerGuard {
    inner: Arc<Inner>,
    caller: CallerSource,
}

impl std::fmt::Debug for LedgerGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerGuard")
            .field("guard", &self.inner.guard)
            .field("caller", &self.caller)
            .field("revision", &self.inner.revision)
            .finish_non_exhaustive()
    }
}

impl LedgerGuard {
    /// A builder; name at least the database.
    pub fn builder() -> LedgerGuardBuilder {
        LedgerGuardBuilder::default()
    }

    /// The guard (fingerprints, deadlines, the engine).
    pub fn guard(&self) -> &Guard {
        &self.inner.guard
    }

    /// The ledger store (for the application's own reads).
    pub fn store(&self) -> &Store {
        self.inner.guard.engine().store()
    }

    /// The runtime of the tools given to [`LedgerGuardBuilder::deferred`], if any.
    pub fn runtime(&self) -> Option<&Runtime> {
        self.inner.runtime.as_ref()
    }

    /// The principal store (add principals; the bearer layer's state).
    pub fn principals(&self) -> &PrincipalStore {
        &self.inner.principals
    }

    /// Where callers come from.
    pub fn caller_source(&self) -> &CallerSource {
        &self.caller
    }

    /// A guard over a ledger the application opened itself: `guard` (its engine, keys and
    /// deadlines), the principal store of the same database and where callers come from.
    /// Contract revision `"1"`, no observers, no runtime until given.
    pub fn from_parts(guard: Guard, principals: PrincipalStore, caller: CallerSource) -> Self {
        LedgerGuard {
            inner: Arc::new(Inner {
                guard,
                principals,
                revision: "1".into(),
                observers: BTreeMap::new(),
                runtime: None,
            }),
            caller,
        }
    }

    /// The same ledger with callers from `caller` (e.g. one guard per transport: the
    /// configured principal on stdio, bearer tokens over HTTP).
    pub fn with_caller(&self, caller: CallerSource) -> Self {
        LedgerGuard {
            inner: self.inner.clone(),
            caller,
        }
    }

    /// The same ledger with `observer` for `tool`'s effect rows (see
    /// [`LedgerGuardBuilder::observer`]).
    pub fn with_observer(
        mut self,
        tool: impl Into<String>,
        observer: Arc<dyn EffectObserver>,
    ) -> Self {
        Arc::make_mut(&mut self.inner)
            .observers
            .insert(tool.into(), observer);
        self
    }

    /// The contract revision guarded tools are bound to.
    pub fn revision(&self) -> &str {
        &self.inner.revision
    }

    /// The observer for `tool`'s effect rows.
    pub fn observer(&self, tool: &str) -> Arc<dyn EffectObserver> {
        match self.inner.observers.get(tool) {
            Some(o) => o.clone(),
            None => Arc::new(LedgerResultObserver),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(byte: u8) -> KeyMaterial {
        KeyMaterial {
            state_keys: vec![vec![byte; 32]],
            fingerprint_key: vec![byte; 32],
        }
    }

    #[test]
    fn a_store_the_application_opened_is_bound_to_the_keys() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ledger.sqlite");
        let store: Store = Ledger::open_with(db.to_str().unwrap(), LedgerOptions::default())
            .unwrap()
            .into();
        let builder = || LedgerGuard::builder().store(store.clone());
        let ledger = builder().keys(keys(1)).open().unwrap();
        assert!(ledger.runtime().is_none());
        // The same keys again are the ledger's; others refuse to open.
        builder().keys(keys(1)).open().unwrap();
        let refused = builder().keys(keys(2)).open().unwrap_err();
        assert!(
            matches!(
                refused,
                OpenError::Keys(KeyError::FingerprintMismatch { .. })
            ),
            "{refused}"
        );
    }
}
