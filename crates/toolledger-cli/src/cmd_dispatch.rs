//! `toolledger dispatch --fixture CASE.json [--failure POINT]`: the deferred write path.
//!
//! A new intent is accepted (transaction A) and processed at once; an existing finished one is
//! replayed after current re-authorization; an existing unfinished one only answers
//! `OUTCOME_UNKNOWN` with its `status_ref`. Exit 0 PASS, 1 BLOCK, 2 fixture/database failure
//! (stderr carries only a stable `{"error":{"code":…}}`).
//!
//! Also the shared plumbing of the runtime commands (`status`, `approve`, `worker`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;
use toolledger::clock::{ManualClock, SharedClock};
use toolledger::downstream::BoxFuture;
use toolledger::runtime::{
    Answer, CrashPoint, Deadlines, DeferredCall, PointHook, Runtime, RuntimeError,
};
use toolledger::store::Store;
use toolledger::{Error, OperationState};
use toolledger_cli::common::{self, StoreArgs};
use toolledger_cli::fixture::{self, Fixture, Setup};
use toolledger_cli::reference::refunds;
use toolledger_testkit::downstream::SqliteDownstream;

/// Environment variable naming a crash point at which the process stops and waits to be killed
/// (a testing aid for real SIGKILL tests): it prints `{"held_at":POINT}` on stderr first.
pub const HOLD_ENV: &str = "TOOLLEDGER_TEST_HOLD_AT";

/// Store options of the runtime commands.
#[derive(clap::Args, Debug, Clone)]
pub struct RuntimeStoreArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The payments stand-in's own SQLite file (default: `<db>.downstream.sqlite`; with
    /// `--database-url` that is `toolledger.sqlite.downstream.sqlite` in the working
    /// directory unless `--db` or this option says otherwise).
    #[arg(long)]
    pub downstream_db: Option<PathBuf>,
}

/// Deadlines new operations get at acceptance (seconds; unset: no deadline).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DeadlineArgs {
    /// Seconds from acceptance until the authority deadline: after it no write, not even an
    /// exact replay.
    #[arg(long)]
    pub authority_ttl: Option<i64>,
    /// Seconds from acceptance until the retention deadline: after it a replay is refused and
    /// the row stays as a tombstone.
    #[arg(long)]
    pub replay_ttl: Option<i64>,
}

impl DeadlineArgs {
    /// The runtime's deadlines.
    pub fn deadlines(&self) -> Deadlines {
        Deadlines {
            authority_ttl: self.authority_ttl,
            retention_ttl: self.replay_ttl,
        }
    }
}

impl RuntimeStoreArgs {
    /// The downstream file to use.
    pub fn downstream_path(&self) -> PathBuf {
        self.downstream_db
            .clone()
            .unwrap_or_else(|| refunds::default_downstream_path(&self.store.db))
    }

    /// Opens the ledger (creating it when `create`, otherwise refusing a missing file).
    pub fn open(&self, create: bool) -> Result<Store, ExitCode> {
        if !create && !self.store.exists() {
            return Err(common::fail("DATABASE_NOT_FOUND"));
        }
        self.store
            .open_with(false)
            .map_err(|e| common::fail_store(&e))
    }

    /// The runtime over the opened store, its payments stand-in and `clock`.
    pub fn runtime(&self, store: &Store, clock: SharedClock) -> Result<Runtime, ExitCode> {
        let rt = refunds::runtime(store, &self.downstream_path(), clock)
            .map_err(|_| common::fail("DOWNSTREAM_IO_ERROR"))?;
        Ok(match hold_hook() {
            Some(h) => rt.with_hook(h),
            None => rt,
        })
    }
}

/// Parses a crash point name for `--failure`.
pub fn parse_point(s: &str) -> Result<CrashPoint, String> {
    CrashPoint::parse(s).ok_or_else(|| {
        "expected after_intent_commit, after_claim or after_downstream_commit".to_string()
    })
}

/// `dispatch` options.
#[derive(clap::Args, Debug)]
pub struct DispatchArgs {
    #[command(flatten)]
    pub store: RuntimeStoreArgs,
    /// The fixture describing the call (format `toolledger.fixture/v1`).
    #[arg(long)]
    pub fixture: PathBuf,
    /// Stop at this point as if the process crashed there (`after_intent_commit`,
    /// `after_claim`, `after_downstream_commit`); the answer is `OUTCOME_UNKNOWN`.
    #[arg(long, value_parser = parse_point)]
    pub failure: Option<CrashPoint>,
    #[command(flatten)]
    pub deadlines: DeadlineArgs,
}

/// The hook installed when [`HOLD_ENV`] names a crash point.
pub fn hold_hook() -> Option<PointHook> {
    let point = CrashPoint::parse(&std::env::var(HOLD_ENV).ok()?)?;
    Some(Arc::new(
        move |reached: CrashPoint| -> BoxFuture<'static, ()> {
            Box::pin(async move {
                if reached == point {
                    use std::io::Write;
                    let mut err = std::io::stderr();
                    let _ = writeln!(err, "{}", json!({"held_at": point.as_str()}));
                    let _ = err.flush();
                    std::future::pending::<()>().await;
                }
            })
        },
    ))
}

/// Runs `fut` on a fresh current-thread runtime.
pub fn block_on(fut: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(fut),
        Err(_) => common::fail("RUNTIME_ERROR"),
    }
}

/// Loads a fixture or answers exit 2 with its code.
pub fn load_fixture(path: &Path) -> Result<Fixture, ExitCode> {
    fixture::load(path).map_err(|e| common::fail(e.code))
}

/// Creates the fixture's principals and orders that do not exist yet. Existing rows (revoked
/// or not) are never changed.
pub async fn apply_setup(
    store: &Store,
    setup: &Setup,
    now: i64,
    downstream: Option<&SqliteDownstream>,
) -> Result<(), ExitCode> {
    let principals = PrincipalStore::new(store.clone()).with_clock(Arc::new(ManualClock::new(now)));
    for p in &setup.principals {
        match principals.entry(&p.name).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                principals
                    .add(&p.name, &p.tenant, &p.roles, &p.scopes, false)
                    .await
                    .map_err(|_| common::fail("FIXTURE_CONTRACT_ERROR"))?;
            }
            Err(_) => return Err(common::fail("SQLITE_ERROR")),
        }
    }
    for o in &setup.orders {
        // The payments stand-in learns what it captured for the order (existing amounts stay).
        if let Some(d) = downstream {
            d.set_captured(&o.tenant, &o.id, o.amount_cents)
                .map_err(|_| common::fail("DOWNSTREAM_IO_ERROR"))?;
        }
        refunds::ensure_order(
            store,
            &o.tenant,
            &o.id,
            &o.owner_subject,
            o.amount_cents,
            o.refundable,
        )
        .await
        .map_err(|e| common::fail_store(&e))?;
    }
    Ok(())
}

/// The call a fixture describes, or the BLOCK answer for invalid tool arguments.
pub fn call_of(f: &Fixture) -> Result<DeferredCall, ExitCode> {
    let parsed = refunds::parse_tool_arguments(&f.arguments).map_err(|e| print_refusal(&e))?;
    Ok(DeferredCall {
        principal: f.principal.clone(),
        tool: f.tool.clone(),
        key: parsed.key,
        arguments: parsed.business,
        approval_id: parsed.approval,
        provider: f.provider.clone(),
    })
}

/// Prints the PASS or BLOCK object for an answer and returns its exit code.
pub fn print_answer(answer: &Answer) -> ExitCode {
    match answer {
        Answer::Done {
            status_ref,
            state: OperationState::Succeeded,
            delivery,
            result,
        } => {
            common::print_json(&json!({
                "code": "OK",
                "delivery": delivery.as_str(),
                "gate": "PASS",
                "result": result,
                "status": "succeeded",
                "status_ref": status_ref,
            }));
            ExitCode::SUCCESS
        }
        Answer::Done {
            status_ref,
            state,
            delivery,
            result,
        } => {
            common::print_json(&json!({
                "code": "FAILED",
                "delivery": delivery.as_str(),
                "error": result,
                "gate": "BLOCK",
                "result": result,
                "status": state.as_str(),
                "status_ref": status_ref,
            }));
            ExitCode::from(1)
        }
        Answer::Unknown { status_ref, state } => {
            common::print_json(&json!({
                "code": "OUTCOME_UNKNOWN",
                "gate": "BLOCK",
                "status": state.as_str(),
                "status_ref": status_ref,
            }));
            ExitCode::from(1)
        }
    }
}

/// Prints the BLOCK object for a typed refusal and returns exit 1.
pub fn print_refusal(e: &Error) -> ExitCode {
    common::print_json(&json!({
        "code": e.code.as_str().to_ascii_uppercase(),
        "error": {"code": e.code.as_str(), "message": e.message},
        "gate": "BLOCK",
    }));
    ExitCode::from(1)
}

/// The exit for a runtime result: PASS/BLOCK on stdout, or exit 2 for store failures.
pub fn finish(result: Result<Answer, RuntimeError>) -> ExitCode {
    match result {
        Ok(a) => print_answer(&a),
        Err(RuntimeError::Refused(e)) => print_refusal(&e),
        Err(RuntimeError::Store(s)) => common::fail_store(&s),
        Err(RuntimeError::Fenced(_)) => print_refusal(&Error::unavailable(
            "the lease was taken over; observe with status",
        )),
    }
}

/// Runs `dispatch`.
pub fn run(args: DispatchArgs) -> ExitCode {
    let f = match load_fixture(&args.fixture) {
        Ok(f) => f,
        Err(code) => return code,
    };
    block_on(async move {
        let store = match args.store.open(true) {
            Ok(s) => s,
            Err(code) => return code,
        };
        let clock: SharedClock = Arc::new(ManualClock::new(f.now));
        let downstream = match SqliteDownstream::open(args.store.downstream_path(), clock.clone()) {
            Ok(d) => d,
            Err(_) => return common::fail("DOWNSTREAM_IO_ERROR"),
        };
        if let Err(code) = apply_setup(&store, &f.setup, f.now, Some(&downstream)).await {
            return code;
        }
        drop(downstream);
        let call = match call_of(&f) {
            Ok(c) => c,
            Err(code) => return code,
        };
        let rt = match args.store.runtime(&store, clock) {
            Ok(rt) => rt.with_deadlines(args.deadlines.deadlines()),
            Err(code) => return code,
        };
        finish(rt.dispatch(&call, args.failure).await)
    })
}

/// `{"status_ref": …}`-style JSON for values that are not answers (used by `approve`).
pub fn print_value(v: &Value) -> ExitCode {
    common::print_json(v);
    ExitCode::SUCCESS
}
