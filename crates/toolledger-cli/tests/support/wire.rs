//! The MCP wire tests' helpers: a fresh ledger of either backend ([`Db`]), the built
//! `toolledger serve` spawned on it ([`serve_command`], [`Server`]) speaking raw JSON-RPC
//! lines over its stdio, and reading the database back.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde_json::{json, Value};
use toolledger::effect::{EffectTx, RowExt};
use toolledger::store::Store;
use toolledger_testkit::conformance::Harness;
use toolledger_testkit::db::ServerLock;
pub use toolledger_testkit::stdio::{meta, Server};

pub use super::{bin, toolledger};

/// Backend id every SQLite wire test binds its database to.
pub const BACKEND: &str = "sqlite:mcp-wire";

/// Backend id every PostgreSQL wire test binds its schema to.
pub const PG_BACKEND: &str = "postgres:mcp-wire";

/// Continuation-state key the servers of a PostgreSQL test share (no key file there).
pub const PG_STATE_KEY: &str =
    "6d63702077697265206d61747269782073746174652d6b657920706f737467726573";
/// Fingerprint key the servers of a PostgreSQL test share.
pub const PG_FP_KEY: &str = "6d63702077697265206d617472697820666970722d6b657920706f7374677265";

/// A ledger the wire tests run against: a SQLite file (read back on a read-only rusqlite
/// connection) or a PostgreSQL schema (read back through the library's `Store`).
pub trait Ledger {
    /// The `serve`/`migrate` flags that select this database.
    fn store_args(&self) -> Vec<String>;
    /// Key variables every server of this ledger gets (PostgreSQL has no key file).
    fn key_env(&self) -> Vec<(&'static str, &'static str)>;
    /// The backend id the database is bound to.
    fn backend(&self) -> &str;
    /// A library handle on the database (reference tables, bound backend id).
    fn store(&self) -> Store;
    /// Runs one query returning a single i64.
    fn scalar(&self, sql: &str) -> i64;
    /// Text rows of a query returning two columns.
    fn pairs(&self, sql: &str) -> Vec<(String, String)>;
}

impl Ledger for Path {
    fn store_args(&self) -> Vec<String> {
        vec![
            "--db".into(),
            self.display().to_string(),
            "--backend-id".into(),
            BACKEND.into(),
        ]
    }

    fn key_env(&self) -> Vec<(&'static str, &'static str)> {
        Vec::new()
    }

    fn backend(&self) -> &str {
        BACKEND
    }

    fn store(&self) -> Store {
        Store::from(
            toolledger_cli::common::open_store(self, Some(BACKEND.to_string()), false).unwrap(),
        )
    }

    fn scalar(&self, sql: &str) -> i64 {
        toolledger_testkit::db::sqlite_scalar(self, sql)
    }

    fn pairs(&self, sql: &str) -> Vec<(String, String)> {
        let conn = toolledger_testkit::db::sqlite_read_only(self);
        let mut stmt = conn.prepare(sql).unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }
}

impl Ledger for PathBuf {
    fn store_args(&self) -> Vec<String> {
        self.as_path().store_args()
    }
    fn key_env(&self) -> Vec<(&'static str, &'static str)> {
        Vec::new()
    }
    fn backend(&self) -> &str {
        BACKEND
    }
    fn store(&self) -> Store {
        self.as_path().store()
    }
    fn scalar(&self, sql: &str) -> i64 {
        self.as_path().scalar(sql)
    }
    fn pairs(&self, sql: &str) -> Vec<(String, String)> {
        self.as_path().pairs(sql)
    }
}

/// A fresh wire-test database of either backend, with principals `alice` and `bob` (tenant
/// `acme`, role editor, scope automation:write) and `carol` in tenant `other`.
pub enum Db {
    /// A temporary SQLite file.
    Sqlite(super::Db),
    /// A fresh schema of the test PostgreSQL database (dropped with the harness).
    Postgres {
        /// Owns (and at the end drops) the schema.
        h: Harness,
        /// The URL other processes use to reach the schema.
        url: String,
        /// A handle for reading back and for principals.
        store: Store,
        /// Holds `--db`, which with `--database-url` only places the payments stand-in's own
        /// SQLite file (a separate system) in a temporary directory.
        dir: tempfile::TempDir,
    },
}

/// Runs each named case (a `fn(Db)`) twice: on a fresh SQLite file (`sqlite::…`) and on a
/// fresh schema of the test PostgreSQL database (`postgres::…`; skipped with one loud line
/// without `TOOLLEDGER_TEST_DATABASE_URL`, failing in CI).
#[allow(unused_macros)]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $name() {
                    super::$name(super::Db::sqlite());
                }
            )*
        }
        mod postgres {
            $(
                #[test]
                fn $name() {
                    if let Some(db) = super::Db::postgres() {
                        super::$name(db);
                    }
                }
            )*
        }
    };
}

impl Db {
    /// Whether this is the PostgreSQL backend.
    pub fn is_postgres(&self) -> bool {
        matches!(self, Db::Postgres { .. })
    }

    /// A fresh SQLite database.
    pub fn sqlite() -> Db {
        let db = super::Db::new();
        add_principals(db.path());
        Db::Sqlite(db)
    }

    /// A fresh PostgreSQL schema; `None` when PostgreSQL tests are skipped (one loud line;
    /// in CI they fail instead).
    pub fn postgres() -> Option<Db> {
        Some(Db::postgres_in(Harness::postgres()?))
    }

    /// A fresh PostgreSQL schema for a test that holds the server lock exclusively (it
    /// restarts the server); `None` when PostgreSQL tests are skipped.
    pub fn postgres_while_holding(exclusive: &ServerLock) -> Option<Db> {
        Some(Db::postgres_in(Harness::postgres_while_holding(exclusive)?))
    }

    fn postgres_in(h: Harness) -> Db {
        // Creates the schema; the reference tables come with the CLI's own migrations.
        drop(h.open_with(Some(PG_BACKEND), (&[], &[]), false).unwrap());
        let url = h.database_url().unwrap();
        let store =
            toolledger_cli::common::open_postgres(&url, Some(PG_BACKEND.into()), true).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let db = Db::Postgres { h, url, store, dir };
        add_principals(&db);
        db
    }
}

impl Ledger for Db {
    fn store_args(&self) -> Vec<String> {
        match self {
            Db::Sqlite(d) => d.path().store_args(),
            Db::Postgres { url, dir, .. } => vec![
                "--database-url".into(),
                url.clone(),
                "--backend-id".into(),
                PG_BACKEND.into(),
                "--db".into(),
                dir.path().join("ledger.sqlite").display().to_string(),
            ],
        }
    }

    fn key_env(&self) -> Vec<(&'static str, &'static str)> {
        match self {
            Db::Sqlite(..) => Vec::new(),
            Db::Postgres { .. } => vec![
                ("TOOLLEDGER_STATE_KEY_HEX", PG_STATE_KEY),
                ("TOOLLEDGER_FINGERPRINT_KEY_HEX", PG_FP_KEY),
            ],
        }
    }

    fn backend(&self) -> &str {
        match self {
            Db::Sqlite(..) => BACKEND,
            Db::Postgres { .. } => PG_BACKEND,
        }
    }

    fn store(&self) -> Store {
        match self {
            Db::Sqlite(d) => d.path().store(),
            Db::Postgres { store, .. } => store.clone(),
        }
    }

    fn scalar(&self, sql: &str) -> i64 {
        match self {
            Db::Sqlite(d) => d.path().scalar(sql),
            Db::Postgres { store, .. } => toolledger_testkit::db::scalar_blocking(store, sql),
        }
    }

    fn pairs(&self, sql: &str) -> Vec<(String, String)> {
        match self {
            Db::Sqlite(d) => d.path().pairs(sql),
            Db::Postgres { store, .. } => {
                let (store, sql) = (store.clone(), sql.to_string());
                std::thread::spawn(move || {
                    store
                        .read_blocking(move |tx: &mut dyn EffectTx| {
                            tx.query(&sql, &[])?
                                .iter()
                                .map(|r| Ok((r.text(0)?, r.text(1)?)))
                                .collect::<Result<Vec<_>, toolledger::Error>>()
                        })
                        .unwrap()
                })
                .join()
                .unwrap()
            }
        }
    }
}

fn add_principals<L: Ledger + ?Sized>(db: &L) {
    for (name, tenant) in [("alice", "acme"), ("bob", "acme"), ("carol", "other")] {
        add_principal(db, name, tenant, &["editor"], &["automation:write"], false);
    }
}

/// A fresh SQLite database with principals `alice` and `bob` (tenant `acme`, role editor,
/// scope automation:write) and `carol` in tenant `other`. Returns the temp dir and the db path.
pub fn fresh_db() -> (tempfile::TempDir, PathBuf) {
    let super::Db { dir, db } = super::Db::new();
    add_principals(db.as_path());
    (dir, db)
}

/// Adds (or replaces) a principal; returns its bearer token when `token` is set.
pub fn add_principal<L: Ledger + ?Sized>(
    db: &L,
    name: &str,
    tenant: &str,
    roles: &[&str],
    scopes: &[&str],
    token: bool,
) -> Option<String> {
    let (name, tenant) = (name.to_string(), tenant.to_string());
    let roles: Vec<String> = roles.iter().map(|s| s.to_string()).collect();
    let scopes: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
    let store = db.store();
    // A thread of its own, so callers inside a tokio runtime can use it too.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            toolledger::authz::PrincipalStore::new(store)
                .add(&name, &tenant, &roles, &scopes, token)
                .await
                .unwrap()
        })
    })
    .join()
    .unwrap()
}

/// Counts rows of `table` (read on a read-only connection on SQLite, one snapshot on
/// PostgreSQL).
pub fn count<L: Ledger + ?Sized>(db: &L, table: &str) -> i64 {
    db.scalar(&format!("SELECT count(*) FROM {table}"))
}

/// Runs one query returning a single i64.
pub fn scalar<L: Ledger + ?Sized>(db: &L, sql: &str) -> i64 {
    db.scalar(sql)
}

/// Operation events of the first ledger row, as (kind, detail JSON).
pub fn events<L: Ledger + ?Sized>(db: &L) -> Vec<(String, Value)> {
    db.pairs("SELECT kind, detail FROM operation_events ORDER BY id")
        .into_iter()
        .map(|(k, d)| (k, serde_json::from_str(&d).unwrap()))
        .collect()
}

/// The `serve` arguments for `db` as `principal`, followed by `extra` flags.
pub fn serve_args<L: Ledger + ?Sized>(db: &L, principal: &str, extra: &[&str]) -> Vec<String> {
    let mut a = vec!["serve".to_string()];
    a.extend(db.store_args());
    a.extend(["--principal".to_string(), principal.into()]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// `toolledger serve` on `db` with `args` (after the ledger's flags) and exactly the key
/// variables the ledger's servers share (none on SQLite, whose keys come from its key file).
pub fn serve_command<L: Ledger + ?Sized>(db: &L, args: &[String]) -> Command {
    let mut command = toolledger();
    command
        .arg("serve")
        .args(db.store_args())
        .args(args)
        .env_remove("TOOLLEDGER_STATE_KEY_HEX")
        .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
        .envs(db.key_env());
    command
}

/// Starting `toolledger serve` on a wire-test ledger.
pub trait StartServer: Sized {
    /// Starts the server as `principal` with `extra` flags.
    fn start<L: Ledger + ?Sized>(db: &L, principal: &str, extra: &[&str]) -> Self;

    /// Starts the server with key variables from `env` (others from the key file).
    fn start_with_env<L: Ledger + ?Sized>(
        db: &L,
        principal: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self;
}

impl StartServer for Server {
    /// Starts the server as `principal` with `extra` flags.
    fn start<L: Ledger + ?Sized>(db: &L, principal: &str, extra: &[&str]) -> Server {
        Server::start_with_env(db, principal, extra, &[])
    }

    /// Starts the server with key variables from `env` (others from the key file).
    fn start_with_env<L: Ledger + ?Sized>(
        db: &L,
        principal: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Server {
        let mut args = vec!["--principal".to_string(), principal.into()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut command = serve_command(db, &args);
        command.envs(env.iter().copied());
        Server::spawn(command)
    }
}

/// `inputResponses` answering the body request.
pub fn body(text: &str) -> Value {
    json!({"body": {"action": "accept", "content": {"body": text}}})
}

/// The `requestState` of an `input_required` result (asserting its shape).
pub fn request_state(result: &Value) -> String {
    assert_eq!(result["resultType"], "input_required", "{result}");
    result["requestState"].as_str().unwrap().to_string()
}

/// Asserts that `reply` (a whole JSON-RPC reply) refuses an invalid `requestState` as the
/// protocol error -32602 with `data.code = request_state_invalid`; returns its message.
pub fn assert_state_invalid(reply: &Value) -> String {
    assert!(reply.get("result").is_none(), "{reply}");
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    assert_eq!(
        reply["error"]["data"]["code"], "request_state_invalid",
        "{reply}"
    );
    reply["error"]["message"].as_str().unwrap().to_string()
}

/// The error code of an in-band tool error.
pub fn error_code(result: &Value) -> String {
    assert_eq!(result["isError"], true, "{result}");
    toolledger_mcp::error_of(result).unwrap_or_default()["code"]
        .as_str()
        .unwrap()
        .to_string()
}

/// `toolledger approve` on `db` by `ed` of `alice`'s call of `tool` under `key` with
/// `arguments`, with `extra` flags (`--ttl`, `--now`); returns the approval id.
pub fn approve<L: Ledger + ?Sized>(
    db: &L,
    tool: &str,
    key: &str,
    arguments: &Value,
    extra: &[&str],
) -> String {
    let mut command = Command::new(bin());
    command
        .arg("approve")
        .args(db.store_args())
        .envs(db.key_env())
        .args(extra);
    toolledger_testkit::reference::approve(command, "ed", "alice", tool, key, arguments)
}

/// The key a guarded proxied operation of `subject` (of `tenant`) on `tool` under the caller's
/// operation id `key` is known by upstream: the SHA-256 of its canonical scope (what
/// `operations show` shows as the intent's `downstream_key`). Strings are written as JSON
/// strings, which for the plain ids of the tests is their canonical form.
pub fn upstream_key(tenant: &str, subject: &str, tool: &str, key: &str) -> String {
    use sha2::Digest;
    let s = |v: &str| serde_json::to_string(v).unwrap();
    let text = format!(
        "{{\"idempotency_key\":{},\"subject\":{},\"tenant\":{},\"tool\":{}}}",
        s(key),
        s(subject),
        s(tenant),
        s(tool)
    );
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}
