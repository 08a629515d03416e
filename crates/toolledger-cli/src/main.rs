//! The `toolledger` binary.

use clap::Parser;

/// A durable ledger for side-effecting tool calls.
#[derive(Parser, Debug)]
#[command(name = "toolledger", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Create (or check) a ledger database and apply migrations.
    Migrate {
        /// SQLite database file.
        #[arg(long, default_value = "toolledger.sqlite")]
        db: std::path::PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Migrate { db } => {
            let opts =
                toolledger::store::sqlite::OpenOptions::new("sqlite:default").allow_migrate(true);
            match toolledger::store::sqlite::SqliteStore::open(&db, opts) {
                Ok(_) => {
                    println!("{{\"migrated\":true}}");
                    std::process::ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{{\"error\":{{\"code\":\"{}\"}}}}", e.cli_code());
                    std::process::ExitCode::from(2)
                }
            }
        }
    }
}
