//! `toolledger demo [NAME]`: the self-checking demos of `toolledger-demo`, on fresh temporary
//! databases; and `toolledger upstream-example`, its example upstream MCP server. Exit 0:
//! every check passed; 1: a check failed; 2: the demo could not run (I/O, database).

use toolledger_cli::exit::{Failure, Outcome};
use toolledger_demo::upstream::{self, UpstreamExampleArgs};
use toolledger_demo::Demo;

/// Arguments of `toolledger demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Which demo to run; every demo when omitted.
    #[command(subcommand)]
    pub which: Option<Demo>,
    /// Run `lost-reply` on fresh schemas of this PostgreSQL database instead of temporary
    /// SQLite files (`receipts` always uses a temporary SQLite file).
    #[arg(
        long,
        global = true,
        env = "TOOLLEDGER_DATABASE_URL",
        value_name = "URL"
    )]
    pub database_url: Option<String>,
    /// Print one JSON object even on a terminal (piped output is always JSON).
    #[arg(long, global = true)]
    pub json: bool,
}

/// Runs `toolledger demo`.
pub fn run(args: DemoArgs) -> Result<Outcome, Failure> {
    toolledger_demo::run(args.which, args.database_url.as_deref(), args.json)
        .map(Outcome::pass_if)
        .map_err(Failure::code)
}

/// Runs `toolledger upstream-example` until its input closes.
pub fn upstream_example(args: UpstreamExampleArgs) -> Result<Outcome, Failure> {
    match upstream::run(args) {
        Ok(()) => Ok(Outcome::Pass),
        Err(upstream::Failure {
            code,
            message: Some(message),
        }) => Err(Failure::explained(code, message)),
        Err(upstream::Failure { code, .. }) => Err(Failure::code(code)),
    }
}
