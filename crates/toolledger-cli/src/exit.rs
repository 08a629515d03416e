//! The one way out of the `toolledger` binary: every command returns
//! `Result<Outcome, Failure>`, and [`finish`] turns that into what the user sees and the
//! process's exit status.
//!
//! | result | output | exit |
//! | --- | --- | --- |
//! | [`Outcome::Pass`] | whatever the command printed on stdout | 0 |
//! | [`Outcome::Block`] | whatever the command printed on stdout (a refusal, a failed check) | 1 |
//! | [`Failure::Refused`] | `{"code":CODE,"error":{"code","message"},"gate":"BLOCK"}` on stdout | 1 |
//! | [`Failure::Code`] | `{"error":{"code":CODE,"message":HINT}}` on stderr ([`hint`]; no `message` for a code without one) | 2 |
//! | [`Failure::Explained`] | `{"error":{"code":CODE,"message":MESSAGE}}` on stderr | 2 |
//! | [`Failure::Usage`] | `{"error":{"code":"USAGE_ERROR","message":…}}` on stderr; `--help` and `--version` print their text on stdout | 2, or 0 for `--help` and `--version` |
//!
//! Codes are stable, upper-case identifiers and messages never carry paths, SQL, URLs or key
//! material: a user acts on the code, and the message says what to change or run next.
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
    /// Exit 2 with `{"error":{"code":CODE,"message":HINT}}` on stderr, the message being the
    /// code's [`hint`] (left out for a code without one).
    Code(Cow<'static, str>),
    /// Exit 2 with `{"error":{"code":CODE,"message":MESSAGE}}` on stderr.
    Explained {
        /// The stable code.
        code: &'static str,
        /// What to change, naming flags or values, never paths or secrets.
        message: String,
    },
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
        match store_message(&e) {
            Some(message) => Failure::explained(e.code(), message),
            None => Failure::code(e.code()),
        }
    }
}

/// The message of a store failure whose code needs its own words: what was wrong with the
/// database URL, or the connection error (never the URL or its password: the store's reason
/// is its own words, or the server's with the password removed). `None` for the codes whose
/// [`hint`] says it all.
pub fn store_message(e: &StoreError) -> Option<String> {
    match e {
        StoreError::UrlInvalid(reason) => Some(format!(
            "--database-url (or TOOLLEDGER_DATABASE_URL) is not a usable PostgreSQL URL: \
             {reason}; write it as postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        )),
        StoreError::Unreachable(reason) => Some(format!(
            "cannot connect to the database --database-url (or TOOLLEDGER_DATABASE_URL) \
             names: {reason}; check the host, port, user and database, and that the server \
             is running"
        )),
        _ => None,
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
            match hint(&code) {
                Some(message) => {
                    eprintln!("{}", json!({"error": {"code": code, "message": message}}))
                }
                None => eprintln!("{}", json!({"error": {"code": code}})),
            }
            ExitCode::from(2)
        }
        Err(Failure::Explained { code, message }) => {
            eprintln!("{}", json!({"error": {"code": code, "message": message}}));
            ExitCode::from(2)
        }
        Err(Failure::Usage(e)) if is_help_or_version(&e) => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        Err(Failure::Usage(e)) => {
            eprintln!(
                "{}",
                json!({"error": {"code": "USAGE_ERROR", "message": usage_message(&e, "toolledger")}})
            );
            ExitCode::from(2)
        }
    }
}

/// The failure for a command line that did not parse: help and the version stay
/// [`Failure::Usage`] (their own text, exit 0); anything else is `USAGE_ERROR` with
/// [`usage_message`].
pub fn usage_failure(e: clap::Error, command: &str) -> Failure {
    if is_help_or_version(&e) {
        Failure::Usage(e)
    } else {
        Failure::explained("USAGE_ERROR", usage_message(&e, command))
    }
}

/// Whether the parser stopped to print help or the version (exit 0, its own text).
fn is_help_or_version(e: &clap::Error) -> bool {
    use clap::error::ErrorKind;
    matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
}

/// A value the user typed, quoted in a message only when it looks like a flag or subcommand
/// name: anything else (a path, a URL, a token) may be private.
fn word(value: &str) -> Option<String> {
    let plain = !value.is_empty()
        && value.len() <= 40
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'));
    plain.then(|| format!("'{value}'"))
}

/// The parser's error as one line that names the flag and what is wrong with it, and the
/// command whose `--help` explains it. Values the user typed are left out (they may be paths,
/// URLs or secrets), except flag and subcommand names.
/// `command` (e.g. `toolledger worker`) is named when the parser's error does not say which
/// command it was parsing.
pub fn usage_message(e: &clap::Error, command: &str) -> String {
    use clap::error::{ContextKind, ErrorKind};
    let get = |kind: ContextKind| e.get(kind).map(|v| v.to_string());
    let arg = get(ContextKind::InvalidArg).unwrap_or_else(|| "an argument".into());
    let mut message = match e.kind() {
        ErrorKind::InvalidValue => {
            let mut m = format!("invalid value for {arg}");
            if let Some(valid) = get(ContextKind::ValidValue) {
                m.push_str(&format!(" (expected one of: {valid})"));
            }
            m
        }
        ErrorKind::ValueValidation => match std::error::Error::source(e) {
            Some(source) => format!("invalid value for {arg}: {source}"),
            None => format!("invalid value for {arg}"),
        },
        ErrorKind::UnknownArgument => {
            let typed = get(ContextKind::InvalidArg).unwrap_or_default();
            let mut m = match typed.starts_with('-').then(|| word(&typed)).flatten() {
                Some(flag) => format!("unexpected argument {flag}"),
                None => "unexpected argument".to_string(),
            };
            if let Some(s) = get(ContextKind::SuggestedArg) {
                m.push_str(&format!(" (did you mean '{s}'?)"));
            }
            m
        }
        ErrorKind::InvalidSubcommand => {
            let typed = get(ContextKind::InvalidSubcommand).unwrap_or_default();
            let mut m = match word(&typed) {
                Some(name) => format!("unknown subcommand {name}"),
                None => "unknown subcommand".to_string(),
            };
            if let Some(s) = get(ContextKind::SuggestedSubcommand) {
                m.push_str(&format!(" (did you mean '{s}'?)"));
            }
            m
        }
        ErrorKind::MissingRequiredArgument => format!("missing required argument {arg}"),
        ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            "a subcommand is required".to_string()
        }
        ErrorKind::ArgumentConflict => match get(ContextKind::PriorArg) {
            Some(prior) => format!("{arg} cannot be used with {prior}"),
            None => format!("{arg} cannot be used with the other arguments given"),
        },
        ErrorKind::NoEquals
        | ErrorKind::TooManyValues
        | ErrorKind::TooFewValues
        | ErrorKind::WrongNumberOfValues => format!("wrong number of values for {arg}"),
        ErrorKind::InvalidUtf8 => "an argument is not valid UTF-8".to_string(),
        _ => "the command line is not valid".to_string(),
    };
    // `Usage: toolledger worker [OPTIONS]` → `toolledger worker`.
    let command = get(ContextKind::Usage)
        .and_then(|usage| {
            let line = usage.lines().find(|l| !l.trim().is_empty())?.to_string();
            let words: Vec<&str> = line
                .trim_start_matches("Usage:")
                .split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<', '-']))
                .collect();
            (!words.is_empty()).then(|| words.join(" "))
        })
        .unwrap_or_else(|| command.to_string());
    message.push_str(&format!("; see `{command} --help`"));
    message
}

/// What to do about an exit-2 code that carries no message of its own: a path-free hint
/// naming the flag to check or the command to run, or `None` where the code says it all.
pub fn hint(code: &str) -> Option<&'static str> {
    Some(match code {
        "STORE_UNAVAILABLE" => {
            "the database is busy, locked or unreachable, or a statement timed out; retry"
        }
        "BACKEND_MISMATCH" => {
            "the database is bound to another backend id; pass that id with --backend-id, or \
             leave --backend-id out to adopt the database's binding"
        }
        "SCHEMA_TOO_NEW" => {
            "the database was written by a newer toolledger; use that version (or a newer one)"
        }
        "SCHEMA_OUTDATED" => {
            "the database's schema is older than this program; run `toolledger migrate` with \
             the same --db or --database-url first"
        }
        "MIGRATIONS_INVALID" => {
            "this build's own migration list is malformed; it cannot open any database"
        }
        "NOT_A_LEDGER" => {
            "this is not a toolledger ledger (not SQLite, another application's database, or \
             for a command that needs an existing ledger an empty file); check --db or \
             --database-url; nothing was changed"
        }
        "UNKNOWN_STATE" => {
            "--state takes a ledger state: in_progress, applied, partial, accepted, processing, \
             succeeded, outcome_unknown, failed or dead"
        }
        "AMBIGUOUS_OPERATION" => {
            "several principals hold this key for the tool; add --tenant and --subject"
        }
        "DATABASE_CORRUPT" => {
            "the ledger is damaged (the database reports corruption, or its recorded \
             migrations have a gap); restore it from a backup"
        }
        "DATABASE_URL_INVALID" => {
            "--database-url is not a usable PostgreSQL URL; write it as \
             postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        }
        "DATABASE_UNREACHABLE" => {
            "cannot connect to the database --database-url names; check the host, port, user \
             and database, and that the server is running"
        }
        "PERSISTENCE_CONTRACT_ERROR" => {
            "stored data violates the storage contract; `toolledger audit` names the rows"
        }
        "SQLITE_ERROR" | "POSTGRES_ERROR" | "STORE_ERROR" => {
            "the database refused a write or failed; `toolledger audit` checks the ledger's \
             integrity"
        }
        "DATABASE_IO_ERROR" => {
            "the database could not be opened or created; check that --db names a writable \
             file in an existing directory"
        }
        "NETWORK_FILESYSTEM" => {
            "the SQLite file is on a network filesystem; use a local disk, or PostgreSQL \
             (--database-url)"
        }
        "DATABASE_NOT_FOUND" => {
            "there is no ledger at --db (TOOLLEDGER_DB, or by default toolledger/ledger.sqlite \
             in the platform data directory); check --db (and --database-url), or create the \
             ledger with `toolledger migrate`"
        }
        "DATA_DIR_UNKNOWN" => {
            "the default ledger lives in the platform data directory, and none could be \
             determined (no home directory); pass --db PATH or set TOOLLEDGER_DB"
        }
        "DOWNSTREAM_IO_ERROR" | "DOWNSTREAM_UNAVAILABLE" => {
            "the reference demo's payments stand-in file could not be opened or created; \
             check --downstream-db (or TOOLLEDGER_DOWNSTREAM_DB)"
        }
        "FIXTURE_IO_ERROR" => "the fixture file could not be read; check --fixture",
        "FIXTURE_TOO_LARGE" => "the fixture is larger than 65,536 bytes",
        "FIXTURE_NOT_UTF8" => "the fixture is not UTF-8",
        "FIXTURE_TOO_DEEP" => "the fixture nests deeper than 32 levels",
        "FIXTURE_DUPLICATE_KEY" => "the fixture repeats a key in one object",
        "FIXTURE_NON_FINITE" => "the fixture holds a non-finite number (NaN or Infinity)",
        "FIXTURE_INVALID_JSON" => "the fixture is not valid JSON",
        "FIXTURE_CONTRACT_ERROR" => {
            "the fixture does not follow its format (toolledger.fixture/v1): a field is \
             missing, unknown or of the wrong type"
        }
        "USAGE_ERROR" => "the command line is not valid; see `toolledger --help`",
        "PRINCIPAL_REQUIRED" => {
            "`serve` on stdio acts for one principal: pass --principal NAME (or use --http, \
             where each caller presents a bearer token)"
        }
        "KEY_ERROR" => {
            "the keys could not be loaded: check TOOLLEDGER_STATE_KEY_HEX and \
             TOOLLEDGER_FINGERPRINT_KEY_HEX (both required with PostgreSQL; `openssl rand -hex \
             32` makes a key), or the key file beside the SQLite database"
        }
        "BIND_ERROR" => "the --http address could not be bound: it is in use or not permitted",
        "SERVE_ERROR" => "the HTTP server stopped with an error",
        "RUNTIME_ERROR" => "the async runtime could not start (out of threads or memory?)",
        "WORKER_ERROR" => "the worker pass failed; the worker's stderr lines say why",
        "DEMO_IO_ERROR" => "the demo could not create or read its temporary files",
        "DEMO_SPAWN_ERROR" => "the demo could not start the server (this same binary)",
        "DEMO_PROTOCOL_ERROR" => "the server's reply was not the JSON-RPC the demo expected",
        _ => return None,
    })
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
