//! The `toolledger` binary: reference MCP server, outbox worker, operator commands, demos and
//! benchmarks.

mod cmd_approve;
mod cmd_audit;
mod cmd_bench;
mod cmd_call;
mod cmd_demo;
mod cmd_dispatch;
mod cmd_fingerprint;
mod cmd_principal;
mod cmd_resolve;
mod cmd_serve;
mod cmd_status;
mod cmd_worker;
mod demo_lost_reply;

use toolledger_cli::{common, reference};

/// Records travel between threads (built on a store thread, dropped on the async runtime's),
/// where glibc's allocator serializes frees on the arena that made them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::Parser;
use common::StoreArgs;

/// A durable ledger for side-effecting tool calls.
#[derive(Parser, Debug)]
#[command(name = "toolledger", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Manage principals: who may call which tools.
    Principal {
        #[command(subcommand)]
        cmd: cmd_principal::PrincipalCmd,
    },
    /// Measure throughput and latency of the ledger's hot paths (one JSON line per workload).
    Bench(cmd_bench::BenchArgs),
    /// Invoke one reference tool through the ledger, without MCP.
    Call(cmd_call::CallArgs),
    /// Run self-checking demos on a fresh temporary database.
    Demo(cmd_demo::DemoArgs),
    /// Print the keyed fingerprint of each JSON request line on stdin, one lowercase hex
    /// digest per line; the key is read from TOOLLEDGER_FINGERPRINT_KEY_HEX.
    Fingerprint,
    /// Approve one exact intent (the approver must hold the role `approver`).
    Approve(cmd_approve::ApproveArgs),
    /// Audit a ledger: integrity, foreign keys, WAL + FULL, runtime invariants, counts.
    Audit(cmd_audit::AuditArgs),
    /// Dispatch the deferred call a runtime fixture describes.
    Dispatch(cmd_dispatch::DispatchArgs),
    /// Explicit status query for a dispatched operation; reconciles a downstream receipt.
    Status(cmd_status::StatusArgs),
    /// Operator: settle an outcome_unknown (or dead) operation as succeeded or failed.
    Resolve(cmd_resolve::ResolveArgs),
    /// Deliver pending outbox events and reclaim expired leases.
    Worker(cmd_worker::WorkerArgs),
    /// Create a ledger database or migrate an existing one forward.
    Migrate {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Run the reference MCP server (stdio, or streamable HTTP with --http).
    Serve(cmd_serve::ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Principal { cmd } => cmd_principal::run(cmd),
        Command::Bench(args) => cmd_bench::run(args),
        Command::Call(args) => cmd_call::run(args),
        Command::Demo(args) => cmd_demo::run(args),
        Command::Fingerprint => cmd_fingerprint::run(),
        Command::Approve(args) => cmd_approve::run(args),
        Command::Audit(args) => cmd_audit::run(args),
        Command::Dispatch(args) => cmd_dispatch::run(args),
        Command::Status(args) => cmd_status::run(args),
        Command::Resolve(args) => cmd_resolve::run(args),
        Command::Worker(args) => cmd_worker::run(args),
        Command::Migrate { store } => match store.open_with(true) {
            Ok(s) => {
                common::print_json(&serde_json::json!({
                    "migrated": true,
                    "backend_id": s.backend_id(),
                }));
                ExitCode::SUCCESS
            }
            Err(e) => common::fail_store(&e),
        },
        Command::Serve(args) => cmd_serve::run(args),
    }
}
