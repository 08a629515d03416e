//! `toolledger upstream-example`: a small MCP server with a side effect and no ledger, shipped
//! in the binary so the proxy's demo and benchmark run on a machine with nothing else
//! installed. It is a testing and demo aid, hidden from `toolledger --help`.
//!
//! ```text
//! toolledger upstream-example --db charges.sqlite [--reply-delay-ms MS]
//! ```
//!
//! It serves MCP on stdio, written as an outside team would write a server with rmcp's tool
//! macros, and knows nothing of the ledger:
//!
//! - `charge {customer, amount_cents}` inserts one row into its own SQLite file and answers
//!   `{charge_id, customer, amount_cents}` as structured content. It never deduplicates: two
//!   calls are two charges, whatever they carry. The row's `reference` is the request's
//!   `_meta["io.toolledger/operation_id"]` when present (what the proxy forwards when a tool is
//!   configured with `forward_operation_id = "_meta"`), else empty. `amount_cents` ≤ 0 is a
//!   tool error and charges nothing.
//! - `find_charge {reference}` (read-only): `{found, charge}`, the first charge with that
//!   reference, for the proxy's reconcile lookup.
//! - `count_charges` (read-only): `{count}`.
//!
//! With `--reply-delay-ms` (or `TOOLLEDGER_UPSTREAM_DELAY_MS`) a charge waits that long after
//! its row is committed before it answers, so a test or demo can lose the reply by killing
//! the server in between.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Json, wrapper::Parameters};
use rmcp::model::RequestMetaObject;
use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};
use toolledger_reference::ledger::SyncMode;

/// The `_meta` key the charge's reference is read from.
const OPERATION_ID_META: &str = "io.toolledger/operation_id";

/// How long a writer waits for another process's write lock on the same file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS charges (
    id           INTEGER PRIMARY KEY,
    customer     TEXT    NOT NULL,
    amount_cents INTEGER NOT NULL,
    reference    TEXT,
    created_at   INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS charges_reference ON charges(reference);";

/// Options of `toolledger upstream-example`.
#[derive(clap::Args, Debug, Clone)]
pub struct UpstreamExampleArgs {
    /// The SQLite file the charges are kept in (created when missing).
    #[arg(long, value_name = "FILE")]
    pub db: PathBuf,
    /// Milliseconds each charge waits after its row is committed before it answers.
    #[arg(
        long,
        value_name = "MS",
        env = "TOOLLEDGER_UPSTREAM_DELAY_MS",
        default_value_t = 0
    )]
    pub reply_delay_ms: u64,
    /// SQLite `synchronous` mode of the charge file.
    #[arg(long, value_enum, default_value = "full")]
    pub sqlite_synchronous: SyncMode,
}

/// `charge`'s arguments.
#[derive(Deserialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    /// Who is charged.
    customer: String,
    /// How much, in cents (positive).
    amount_cents: i64,
}

/// `charge`'s answer.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Charged {
    /// The new charge's id.
    charge_id: i64,
    /// Who was charged.
    customer: String,
    /// How much, in cents.
    amount_cents: i64,
}

/// `find_charge`'s arguments.
#[derive(Deserialize, schemars::JsonSchema)]
pub struct FindArgs {
    /// The reference the charge was recorded with.
    reference: String,
}

/// One stored charge.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Charge {
    /// Its id.
    id: i64,
    /// Who was charged.
    customer: String,
    /// How much, in cents.
    amount_cents: i64,
    /// The operation id its request carried, if any.
    reference: Option<String>,
}

/// `find_charge`'s answer.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Found {
    /// Whether a charge has the reference.
    found: bool,
    /// The first such charge.
    charge: Option<Charge>,
}

/// `count_charges`'s answer.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Count {
    /// How many charges exist.
    count: i64,
}

/// The server: one connection to its file, used by one call at a time.
#[derive(Clone)]
pub struct ChargeServer {
    conn: Arc<Mutex<rusqlite::Connection>>,
    reply_delay: Duration,
    tool_router: ToolRouter<Self>,
}

fn open(path: &Path, synchronous: SyncMode) -> rusqlite::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    let mode = match synchronous {
        SyncMode::Full => "FULL",
        SyncMode::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", mode)?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl ChargeServer {
    /// Runs `f` on the connection on a blocking thread.
    async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, String> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let conn = conn.lock().map_err(|_| "the database is unavailable")?;
            f(&conn).map_err(|_| "the database is unavailable")
        })
        .await
        .map_err(|_| "the database is unavailable".to_string())?
        .map_err(str::to_string)
    }
}

#[tool_router]
impl ChargeServer {
    /// Charge a customer. Every call creates a new charge.
    #[tool(annotations(
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false
    ))]
    async fn charge(
        &self,
        meta: RequestMetaObject,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Charged>, String> {
        if args.amount_cents <= 0 {
            return Err(format!(
                "amount_cents must be positive, got {}",
                args.amount_cents
            ));
        }
        let reference = meta
            .get(OPERATION_ID_META)
            .and_then(|v| v.as_str())
            .map(str::to_string);
        let (customer, amount) = (args.customer.clone(), args.amount_cents);
        let charge_id = self
            .with_conn(move |c| {
                c.prepare_cached(
                    "INSERT INTO charges(customer, amount_cents, reference, created_at)
                     VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(rusqlite::params![
                    customer,
                    amount,
                    reference,
                    unix_now()
                ])?;
                Ok(c.last_insert_rowid())
            })
            .await?;
        if !self.reply_delay.is_zero() {
            tokio::time::sleep(self.reply_delay).await;
        }
        Ok(Json(Charged {
            charge_id,
            customer: args.customer,
            amount_cents: args.amount_cents,
        }))
    }

    /// Find the first charge recorded with this reference.
    #[tool(annotations(read_only_hint = true))]
    async fn find_charge(
        &self,
        Parameters(args): Parameters<FindArgs>,
    ) -> Result<Json<Found>, String> {
        let charge = self
            .with_conn(move |c| {
                let mut s = c.prepare_cached(
                    "SELECT id, customer, amount_cents, reference FROM charges
                     WHERE reference = ?1 ORDER BY id LIMIT 1",
                )?;
                let mut rows = s.query_map([&args.reference], |r| {
                    Ok(Charge {
                        id: r.get(0)?,
                        customer: r.get(1)?,
                        amount_cents: r.get(2)?,
                        reference: r.get(3)?,
                    })
                })?;
                rows.next().transpose()
            })
            .await?;
        Ok(Json(Found {
            found: charge.is_some(),
            charge,
        }))
    }

    /// How many charges exist.
    #[tool(annotations(read_only_hint = true))]
    async fn count_charges(&self) -> Result<Json<Count>, String> {
        let count = self
            .with_conn(|c| c.query_row("SELECT count(*) FROM charges", [], |r| r.get(0)))
            .await?;
        Ok(Json(Count { count }))
    }
}

#[tool_handler(router = self.tool_router, name = "toolledger-upstream-example")]
impl ServerHandler for ChargeServer {}

/// Why the example upstream could not serve: a stable code, and for some codes the words
/// to say with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// `DATABASE_UNAVAILABLE` or `RUNTIME_ERROR`.
    pub code: &'static str,
    /// What to change, when the code does not say it.
    pub message: Option<&'static str>,
}

/// Serves the example upstream on stdio until its input closes.
pub fn run(args: UpstreamExampleArgs) -> Result<(), Failure> {
    let conn = open(&args.db, args.sqlite_synchronous).map_err(|_| Failure {
        code: "DATABASE_UNAVAILABLE",
        message: Some("the --db file cannot be opened or created as a SQLite database"),
    })?;
    let server = ChargeServer {
        conn: Arc::new(Mutex::new(conn)),
        reply_delay: Duration::from_millis(args.reply_delay_ms),
        tool_router: ChargeServer::tool_router(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|_| Failure {
            code: "RUNTIME_ERROR",
            message: None,
        })?;
    runtime.block_on(async move {
        if let Ok(running) = server.serve(rmcp::transport::stdio_pipes()).await {
            let _ = running.waiting().await;
        }
    });
    runtime.shutdown_background();
    Ok(())
}
