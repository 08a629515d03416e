//! The `toolledger` binary: reference MCP server, outbox worker, operator commands, demos and
//! benchmarks.

mod cmd_fingerprint;
mod common;
mod reference;

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
    /// Print the DESIGN §6 fingerprint of each JSON request line on stdin, one lowercase hex
    /// digest per line; the key is read from TOOLLEDGER_FINGERPRINT_KEY_HEX.
    Fingerprint,
    /// Create a ledger database or migrate an existing one forward.
    Migrate {
        #[command(flatten)]
        store: StoreArgs,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Fingerprint => cmd_fingerprint::run(),
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
    }
}
