//! `toolledger dispatch --fixture CASE.json [--failure POINT]`, and the hub the commands of
//! the deferred runtime share.
//!
//! **`dispatch`** runs the write path of a deferred call (a refund delivered through the
//! outbox): a new intent is accepted (transaction A) and processed at once; an existing
//! finished one is replayed after current re-authorization; an existing unfinished one only
//! answers `OUTCOME_UNKNOWN` with its `status_ref`. Exit 0 PASS, 1 BLOCK, 2 fixture/database
//! failure (stderr carries only a stable `{"error":{"code":…}}`).
//!
//! **The hub.** `approve`, `audit`, `status`, `resolve` and `worker` share what is here: the
//! runtime over an opened ledger and its payments stand-in ([`runtime`]), with the
//! [`HOLD_ENV`] testing hook installed ([`hold_hook`]); the deadline flags ([`DeadlineArgs`])
//! and the `--failure` value parser ([`parse_point`]); a current-thread async runtime for a
//! command's body ([`block_on`]); fixtures ([`load_fixture`], [`apply_setup`], [`call_of`]);
//! and the PASS/BLOCK answer objects ([`print_answer`], [`finish`]). Each fallible step answers
//! `Result<_, Failure>`, so a command's errors leave through the binary's one exit path
//! (`toolledger_cli::exit::finish`). The ledger is opened from the command's `StoreConfig`,
//! which `main` resolves from its `RuntimeStoreArgs` before the command runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use toolledger::authz::PrincipalStore;
use toolledger::clock::{ManualClock, SharedClock};
use toolledger::downstream::BoxFuture;
use toolledger::runtime::{
    Answer, CrashPoint, Deadlines, DeferredCall, PointHook, Runtime, RuntimeError,
};
use toolledger::store::Store;
use toolledger::{Error, OperationState};
use toolledger_cli::common::{self, RuntimeStoreArgs, StoreConfig};
use toolledger_cli::exit::{Failure, Outcome};
use toolledger_cli::fixture::{self, Fixture, Setup};
use toolledger_reference::downstream::SqliteDownstream;
use toolledger_reference::refunds;

/// Environment variable naming a crash point at which the process stops and waits to be killed
/// (a testing aid for real SIGKILL tests): it prints `{"held_at":POINT}` on stderr first.
pub const HOLD_ENV: &str = "TOOLLEDGER_TEST_HOLD_AT";

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

/// The runtime over the opened `store`, the payments stand-in the config names and `clock`,
/// with the [`HOLD_ENV`] hook when it names a crash point.
pub fn runtime(
    config: &StoreConfig,
    store: &Store,
    clock: SharedClock,
) -> Result<Runtime, Failure> {
    let rt = refunds::runtime(store, &config.downstream, clock)
        .map_err(|_| Failure::code("DOWNSTREAM_IO_ERROR"))?;
    Ok(match hold_hook() {
        Some(h) => rt.with_hook(h),
        None => rt,
    })
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
    /// The ledger and the payments stand-in's file.
    #[command(flatten)]
    pub store: RuntimeStoreArgs,
    /// The fixture describing the call (format `toolledger.fixture/v1`).
    #[arg(long)]
    pub fixture: PathBuf,
    /// Stop at this point as if the process crashed there (`after_intent_commit`,
    /// `after_claim`, `after_downstream_commit`); the answer is `OUTCOME_UNKNOWN`.
    #[arg(long, value_parser = parse_point)]
    pub failure: Option<CrashPoint>,
    /// Deadlines the operation gets if this call accepts it.
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
pub fn block_on<T>(
    fut: impl std::future::Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|_| Failure::code("RUNTIME_ERROR"))?
        .block_on(fut)
}

/// Loads a fixture; a bad one fails with its stable code.
pub fn load_fixture(path: &Path) -> Result<Fixture, Failure> {
    fixture::load(path).map_err(|e| Failure::code(e.code))
}

/// Creates the fixture's principals and orders that do not exist yet. Existing rows (revoked
/// or not) are never changed.
pub async fn apply_setup(
    store: &Store,
    setup: &Setup,
    now: i64,
    downstream: Option<&SqliteDownstream>,
) -> Result<(), Failure> {
    let principals = PrincipalStore::new(store.clone()).with_clock(Arc::new(ManualClock::new(now)));
    for p in &setup.principals {
        match principals.entry(&p.name).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                principals
                    .add(&p.name, &p.tenant, &p.roles, &p.scopes, false)
                    .await
                    .map_err(|_| Failure::code("FIXTURE_CONTRACT_ERROR"))?;
            }
            Err(_) => {
                let code = toolledger::driver::database_error_code(store.dialect());
                return Err(Failure::code(code));
            }
        }
    }
    for o in &setup.orders {
        // The payments stand-in learns what it captured for the order (existing amounts stay).
        if let Some(d) = downstream {
            d.set_captured(&o.tenant, &o.id, o.amount_cents)
                .map_err(|_| Failure::code("DOWNSTREAM_IO_ERROR"))?;
        }
        refunds::ensure_order(
            store,
            &o.tenant,
            &o.id,
            &o.owner_subject,
            o.amount_cents,
            o.refundable,
        )
        .await?;
    }
    Ok(())
}

/// The call a fixture describes; invalid tool arguments are refused (BLOCK).
pub fn call_of(f: &Fixture) -> Result<DeferredCall, Failure> {
    let parsed = refunds::parse_tool_arguments(&f.arguments).map_err(Failure::Refused)?;
    Ok(DeferredCall {
        new_intent: false,
        principal: f.principal.clone(),
        tool: f.tool.clone(),
        key: parsed.key,
        arguments: parsed.business,
        approval_id: parsed.approval,
        provider: f.provider.clone(),
    })
}

/// Prints the PASS or BLOCK object for an answer.
pub fn print_answer(answer: &Answer) -> Outcome {
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
            Outcome::Pass
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
            Outcome::Block
        }
        Answer::Unknown { status_ref, state } => {
            common::print_json(&json!({
                "code": "OUTCOME_UNKNOWN",
                "gate": "BLOCK",
                "status": state.as_str(),
                "status_ref": status_ref,
            }));
            Outcome::Block
        }
    }
}

/// A runtime result as the command's answer: PASS/BLOCK on stdout, or a store failure.
pub fn finish(result: Result<Answer, RuntimeError>) -> Result<Outcome, Failure> {
    match result {
        Ok(a) => Ok(print_answer(&a)),
        Err(RuntimeError::Refused(e)) => Err(Failure::Refused(e)),
        Err(RuntimeError::Store(s)) => Err(s.into()),
        Err(RuntimeError::Fenced(_)) => Err(Failure::Refused(Error::unavailable(
            "the lease was taken over; observe with status",
        ))),
    }
}

/// Runs `dispatch` on the ledger `store` resolves to.
pub fn run(args: DispatchArgs, store: StoreConfig) -> Result<Outcome, Failure> {
    let f = load_fixture(&args.fixture)?;
    block_on(async move {
        let ledger = store.open()?;
        let clock: SharedClock = Arc::new(ManualClock::new(f.now));
        let downstream = SqliteDownstream::open(&store.downstream, clock.clone())
            .map_err(|_| Failure::code("DOWNSTREAM_IO_ERROR"))?;
        apply_setup(&ledger, &f.setup, f.now, Some(&downstream)).await?;
        drop(downstream);
        let call = call_of(&f)?;
        let rt = runtime(&store, &ledger, clock)?.with_deadlines(args.deadlines.deadlines());
        finish(rt.dispatch(&call, args.failure).await)
    })
}
