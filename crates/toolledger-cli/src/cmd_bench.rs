//! `toolledger bench`: the harness of the `toolledger-bench` crate, linked with the `bench`
//! feature (on by default). A binary built without it still knows the command and says how to
//! get it, rather than calling it unknown.

use crate::exit::{Failure, Outcome};

#[cfg(feature = "bench")]
pub use toolledger_bench::BenchArgs;

/// What `toolledger bench` takes in a build without the harness: anything, refused as a whole.
#[cfg(not(feature = "bench"))]
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// Runs `toolledger bench`.
#[cfg(feature = "bench")]
pub fn run(args: BenchArgs) -> Result<Outcome, Failure> {
    match toolledger_bench::run(args) {
        Ok(()) => Ok(Outcome::Pass),
        Err(toolledger_bench::Failure {
            code,
            message: Some(message),
        }) => Err(Failure::explained(code, message)),
        Err(toolledger_bench::Failure { code, .. }) => Err(Failure::code(code)),
    }
}

/// Runs `toolledger bench` in a build without the harness: `BENCH_NOT_BUILT`.
#[cfg(not(feature = "bench"))]
pub fn run(_args: BenchArgs) -> Result<Outcome, Failure> {
    Err(Failure::explained(
        "BENCH_NOT_BUILT",
        "this toolledger was built without the benchmark harness; build it from source with \
         its default features (cargo install toolledger-cli) to run `toolledger bench`",
    ))
}
