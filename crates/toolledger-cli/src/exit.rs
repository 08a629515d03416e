//! The one way out of the `toolledger` binary: every command returns
//! `Result<Outcome, Failure>`, and [`finish`] turns that into what the user sees and the
//! process's exit status.
//!
//! | result | output | exit |
//! | --- | --- | --- |
//! | [`Outcome::Pass`] | whatever the command printed on stdout | 0 |
//! | [`Outcome::Block`] | whatever the command printed on stdout (a refusal, a failed check) | 1 |
//! | [`Failure::Refused`] | `{"code":CODE,"error":{"code","message"},"gate":"BLOCK"}` on stdout | 1 |
//! | [`Failure::Code`] | `{"error":{"code":CODE}}` on stderr | 2 |
//! | [`Failure::Explained`] | `{"error":{"code":CODE,"message":MESSAGE}}` on stderr | 2 |
//! | [`Failure::Line`] | one plain line on stderr (`fingerprint`'s format) | 2 |
//! | [`Failure::Usage`] | the command-line parser's own message (help and version included) | its own: 2, or 0 for `--help` and `--version` |
//!
//! Codes are stable, upper-case identifiers and messages never carry paths, SQL, URLs or key
//! material: a user acts on the code, and the message only says which flag or value is wrong.
//!
//! The single exception to returning through [`finish`] is a simulated crash (`serve --fault`):
//! it must end the process at the exact point it names, without unwinding, and does so through
//! [`crash`].

use std::borrow::Cow;
use std::process::ExitCode;

use serde_json::json;
use toolledger::store::StoreError;
use toolledger::Error;

/// How a command that ran to its end went; its output is already printed on stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Exit 0: the command did what was asked (PASS).
    Pass,
    /// Exit 1: the command ran, and its answer is a refusal or a failed check (BLOCK).
    Block,
}

/// Why a command stopped without an answer of its own; [`finish`] prints it.
#[derive(Debug)]
pub enum Failure {
    /// Exit 1 with the gate's BLOCK object for a typed refusal on stdout.
    Refused(Error),
    /// Exit 2 with `{"error":{"code":CODE}}` on stderr.
    Code(Cow<'static, str>),
    /// Exit 2 with `{"error":{"code":CODE,"message":MESSAGE}}` on stderr.
    Explained {
        /// The stable code.
        code: &'static str,
        /// What to change, naming flags or values, never paths or secrets.
        message: String,
    },
    /// Exit 2 with one plain line on stderr.
    Line(String),
    /// The command line did not parse (or asked for help or the version).
    Usage(clap::Error),
}

impl Failure {
    /// [`Failure::Code`] for a static code.
    pub fn code(code: &'static str) -> Failure {
        Failure::Code(Cow::Borrowed(code))
    }

    /// [`Failure::Explained`].
    pub fn explained(code: &'static str, message: impl Into<String>) -> Failure {
        Failure::Explained {
            code,
            message: message.into(),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::code(e.cli_code())
    }
}

impl From<clap::Error> for Failure {
    fn from(e: clap::Error) -> Failure {
        Failure::Usage(e)
    }
}

impl Outcome {
    /// [`Outcome::Pass`] when `pass`, otherwise [`Outcome::Block`].
    pub fn pass_if(pass: bool) -> Outcome {
        if pass {
            Outcome::Pass
        } else {
            Outcome::Block
        }
    }
}

/// Prints what `result` says (see the module docs) and returns the process's exit status.
pub fn finish(result: Result<Outcome, Failure>) -> ExitCode {
    match result {
        Ok(Outcome::Pass) => ExitCode::SUCCESS,
        Ok(Outcome::Block) => ExitCode::from(1),
        Err(Failure::Refused(e)) => {
            println!(
                "{}",
                json!({
                    "code": e.code.as_str().to_ascii_uppercase(),
                    "error": {"code": e.code.as_str(), "message": e.message},
                    "gate": "BLOCK",
                })
            );
            ExitCode::from(1)
        }
        Err(Failure::Code(code)) => {
            eprintln!("{}", json!({"error": {"code": code}}));
            ExitCode::from(2)
        }
        Err(Failure::Explained { code, message }) => {
            eprintln!("{}", json!({"error": {"code": code, "message": message}}));
            ExitCode::from(2)
        }
        Err(Failure::Line(line)) => {
            eprintln!("{line}");
            ExitCode::from(2)
        }
        Err(Failure::Usage(e)) => {
            let _ = e.print();
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
        }
    }
}

/// Ends the process at once with `status`: no unwinding, no destructors, nothing printed. Only
/// for the simulated crashes of `serve --fault`, whose exit statuses are documented with each
/// fault.
pub fn crash(status: i32) -> ! {
    std::process::exit(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_keep_their_stable_codes() {
        match Failure::from(StoreError::BackendMismatch) {
            Failure::Code(c) => assert_eq!(c, "BACKEND_MISMATCH"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn outcomes_map_to_zero_and_one() {
        assert_eq!(finish(Ok(Outcome::Pass)), ExitCode::SUCCESS);
        assert_eq!(finish(Ok(Outcome::Block)), ExitCode::from(1));
        assert_eq!(finish(Err(Failure::code("X"))), ExitCode::from(2));
        assert_eq!(Outcome::pass_if(false), Outcome::Block);
    }
}
