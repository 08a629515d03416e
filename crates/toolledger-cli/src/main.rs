//! The `toolledger` binary: reference MCP server, outbox worker, operator commands, demos and
//! benchmarks.

mod cmd_approve;
mod cmd_audit;
mod cmd_bench;
mod cmd_call;
mod cmd_console;
mod cmd_demo;
mod cmd_dispatch;
mod cmd_fingerprint;
mod cmd_operations;
mod cmd_principal;
mod cmd_proxy;
mod cmd_prune;
mod cmd_resolve;
mod cmd_serve;
mod cmd_status;
mod cmd_worker;
mod diagnose;
mod serving;

use toolledger_cli::common::{self, StoreConfig};
use toolledger_cli::exit::{self, Failure, Outcome};

/// Records travel between threads (built on a store thread, dropped on the async runtime's),
/// where glibc's allocator serializes frees on the arena that made them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::Parser;
use common::{Access, StoreArgs};

/// `toolledger --version`: the package's version and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TOOLLEDGER_BUILD_COMMIT"),
    ")"
);

/// A durable ledger for side-effecting tool calls.
#[derive(Parser, Debug)]
#[command(name = "toolledger", version = VERSION, about)]
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
    /// Print the keyed request fingerprint of each JSON request line on stdin, one lowercase
    /// hex digest per line; the key is read from TOOLLEDGER_FINGERPRINT_KEY_HEX.
    Fingerprint,
    /// Approve one exact intent (the approver must hold the role `approver`).
    Approve(cmd_approve::ApproveArgs),
    /// Audit a ledger (read-only): integrity, foreign keys, WAL + FULL, runtime invariants,
    /// counts.
    Audit(cmd_audit::AuditArgs),
    /// Dispatch the deferred call a runtime fixture describes (the refund write path).
    Dispatch(cmd_dispatch::DispatchArgs),
    /// An operation's status: the ledger's answer (read-only), or with --fixture the
    /// caller's explicit status query, which reconciles a downstream receipt.
    Status(cmd_status::StatusArgs),
    /// Operator: settle an unsure operation (deferred: succeeded or failed; inline: applied
    /// or partial).
    Resolve(cmd_resolve::ResolveArgs),
    /// Operator: find and explain operations (read-only).
    Operations {
        #[command(subcommand)]
        cmd: cmd_operations::OperationsCmd,
    },
    /// Deliver pending outbox events and reclaim expired leases.
    Worker(cmd_worker::WorkerArgs),
    /// Compact settled operations past their retention deadline to tombstones and delete
    /// tombstones past the horizon (`--tombstone-ttl`), in short batches; one JSON summary.
    Prune(cmd_prune::PruneArgs),
    /// Create a ledger database or migrate an existing one forward.
    Migrate {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Operator console: web pages listing unsure operations, their timelines, and a
    /// resolve form for operators (`--http ADDR`, then open http://ADDR/console).
    Console(cmd_console::ConsoleArgs),
    /// Run the reference MCP server (stdio, or streamable HTTP with --http).
    Serve(cmd_serve::ServeArgs),
    /// Put the ledger in front of another MCP server: `toolledger proxy [flags] -- COMMAND
    /// [ARGS…]` (stdio upstream) or `--upstream-url URL` (streamable HTTP upstream).
    Proxy(cmd_proxy::ProxyArgs),
    /// Testing and demo aid: a small MCP server on stdio with a side effect and no ledger.
    ///
    /// `charge {customer, amount_cents}` adds one row to the SQLite file --db and never
    /// deduplicates (the row keeps the request's `_meta["io.toolledger/operation_id"]` as its
    /// reference); `find_charge {reference}` and `count_charges` are read-only. The proxy's
    /// demo and benchmark run it as their upstream. Not a supported interface.
    #[command(hide = true)]
    UpstreamExample(toolledger_demo::upstream::UpstreamExampleArgs),
    /// Print a shell completion script on stdout (`toolledger completions bash >
    /// ~/.local/share/bash-completion/completions/toolledger`).
    Completions {
        /// The shell the script is for.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) on stdout (`toolledger manpage > toolledger.1`).
    Manpage,
}

fn main() -> ExitCode {
    let parsed = Cli::try_parse().map_err(|e| exit::usage_failure(e, &command_path()));
    let result = parsed.and_then(run);
    // The command's last log lines reach stderr before its outcome does.
    toolledger_cli::log_sink::flush();
    exit::finish(result)
}

/// The subcommand path the process's arguments name (`toolledger principal token add`), for
/// usage errors: the leading arguments that are subcommand names, nothing the user typed
/// beyond them.
fn command_path() -> String {
    use clap::CommandFactory;
    let mut command = Cli::command();
    let mut path = vec![command.get_name().to_string()];
    for arg in std::env::args().skip(1) {
        let Some(sub) = command.find_subcommand(&arg).cloned() else {
            break;
        };
        path.push(sub.get_name().to_string());
        command = sub;
    }
    path.join(" ")
}

/// Resolves the ledger flags of the command (once, before anything is opened) and runs it; an
/// I/O failure on a SQLite ledger is explained (which file, without its path).
fn run(cli: Cli) -> Result<Outcome, Failure> {
    let serving = matches!(cli.command, Command::Serve(_) | Command::Proxy(_));
    let mut opened = None;
    run_command(cli, &mut opened).map_err(|f| match &opened {
        Some(config) => diagnose::explain(f, config, serving),
        None => f,
    })
}

/// Remembers the ledger a command opens, for [`diagnose::explain`].
fn remember(opened: &mut Option<StoreConfig>, config: StoreConfig) -> StoreConfig {
    *opened = Some(config.clone());
    config
}

fn run_command(cli: Cli, opened: &mut Option<StoreConfig>) -> Result<Outcome, Failure> {
    match cli.command {
        Command::Principal { cmd } => {
            let store = remember(opened, cmd.store().resolve(cmd.access())?);
            cmd_principal::run(cmd, &store)
        }
        Command::Bench(args) => cmd_bench::run(args),
        Command::Call(args) => {
            let store = remember(opened, args.store.resolve(Access::OpenOrCreate)?);
            cmd_call::run(args, &store)
        }
        Command::Demo(args) => cmd_demo::run(args),
        Command::Fingerprint => cmd_fingerprint::run(),
        Command::Approve(args) => {
            // Only a fixture's setup can bring the principals an approval needs into a new
            // ledger; without one, a missing SQLite file is refused and not created.
            let access = match args.fixture {
                Some(_) => Access::OpenOrCreate,
                None => Access::Existing,
            };
            let store = remember(opened, args.store.resolve(access)?);
            cmd_approve::run(args, store)
        }
        Command::Audit(args) => {
            let store = remember(opened, args.store.resolve(Access::ReadOnly)?);
            cmd_audit::run(store)
        }
        Command::Dispatch(args) => {
            let store = remember(opened, args.store.resolve(Access::OpenOrCreate)?);
            cmd_dispatch::run(args, store)
        }
        Command::Status(args) => {
            let access = match args.fixture {
                Some(_) => Access::Existing,
                None => Access::ReadOnly,
            };
            let store = remember(opened, args.store.resolve(access)?);
            cmd_status::run(args, store)
        }
        Command::Resolve(args) => {
            let store = remember(opened, args.store.resolve_operator(Access::Existing)?);
            cmd_resolve::run(args, store)
        }
        Command::Operations { cmd } => {
            let store = cmd.store().resolve(Access::ReadOnly)?;
            cmd_operations::run(cmd, store)
        }
        Command::Worker(args) => {
            let store = remember(opened, args.store.resolve(Access::Existing)?);
            cmd_worker::run(args, store)
        }
        Command::Prune(args) => {
            let access = if args.dry_run {
                Access::ReadOnly
            } else {
                Access::Existing
            };
            let store = remember(opened, args.store.resolve(access)?);
            cmd_prune::run(args, store)
        }
        Command::Migrate { store } => {
            let config = remember(opened, store.resolve(Access::Migrate)?);
            let store = config.open()?;
            common::print_json(&serde_json::json!({
                "migrated": true,
                "backend_id": store.backend_id(),
            }));
            Ok(Outcome::Pass)
        }
        Command::Serve(args) => {
            let store = remember(opened, args.store.resolve(Access::OpenOrCreate)?);
            cmd_serve::run(args, store)
        }
        Command::Console(args) => {
            let store = remember(opened, args.store.resolve_operator(Access::Existing)?);
            cmd_console::run(args, store)
        }
        Command::Proxy(args) => {
            let store = remember(opened, args.store.resolve(Access::OpenOrCreate)?);
            cmd_proxy::run(args, store)
        }
        Command::UpstreamExample(args) => cmd_demo::upstream_example(args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "toolledger", &mut std::io::stdout());
            Ok(Outcome::Pass)
        }
        Command::Manpage => {
            use clap::CommandFactory;
            // Like println!: a closed stdout is the reader's choice, not an error to report.
            let _ = clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout());
            Ok(Outcome::Pass)
        }
    }
}

#[cfg(test)]
mod tests {
    /// The binary's allocator never asks Linux for transparent huge pages: with them, each
    /// thread touching its own part of the allocator's arena made the process resident in
    /// 2 MiB steps. Checked where Linux gives huge pages only to memory that asks
    /// (`transparent_hugepage/enabled` = `madvise`, the common default); elsewhere the
    /// allocator's request changes nothing and the test says so.
    #[test]
    fn the_allocator_asks_for_no_huge_pages() {
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !mode.contains("[madvise]") {
            eprintln!(
                "SKIPPED the_allocator_asks_for_no_huge_pages: transparent huge pages are {:?} \
                 here, not `madvise`",
                mode.trim()
            );
            return;
        }
        // Threads that each allocate and touch a few MiB, as store connection threads do.
        let held: Vec<Vec<Vec<u8>>> = (0..8)
            .map(|i| {
                std::thread::spawn(move || {
                    (0..64).map(|j| vec![(i + j) as u8; 64 * 1024]).collect()
                })
            })
            .map(|t| t.join().unwrap())
            .collect();
        let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
        let huge_kb: u64 = rollup
            .lines()
            .find_map(|l| l.strip_prefix("AnonHugePages:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("AnonHugePages in smaps_rollup");
        assert_eq!(huge_kb, 0, "{rollup}");
        drop(held);
    }
}
