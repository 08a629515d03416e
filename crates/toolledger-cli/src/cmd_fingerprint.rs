//! `toolledger fingerprint`: one JSON request per line on stdin, one lowercase hex keyed
//! request fingerprint per line on stdout.
//!
//! - The key comes from `TOOLLEDGER_FINGERPRINT_KEY_HEX` (hex, at least 32 bytes, no default).
//!   A missing, non-hex or short key exits 2 before reading stdin with
//!   `{"error":{"code":"KEY_ERROR","message":"TOOLLEDGER_FINGERPRINT_KEY_HEX: CODE: reason"}}`
//!   on stderr (`CODE`: `missing_key`, `invalid_key_hex`, `key_too_short`); the key's bytes are
//!   never printed.
//! - Each line is parsed with the strict parser and [`Limits::DEFAULT`] (a trailing `\r` is
//!   JSON whitespace, so CRLF input works). Digests are printed as lines are read; the first
//!   bad line N stops the run with
//!   `{"error":{"code":"INVALID_INPUT","message":"line N: CODE: reason"}}` on stderr and exit 2,
//!   so the digests of lines before N have already been printed and no later line is read.
//!   Failing to read stdin or write stdout is `INPUT_IO_ERROR` / `OUTPUT_IO_ERROR`.
//! - Blank lines at the end of the input are ignored; a blank line followed by another request
//!   is a bad line. Empty input prints nothing and exits 0.

use std::io::{self, BufRead, BufWriter, Read, Write};

use toolledger::digest::{fingerprint, FingerprintInput, FingerprintKey};
use toolledger::json::Limits;

use crate::exit::{Failure, Outcome};

/// The environment variable that holds the hex key.
pub const KEY_ENV: &str = "TOOLLEDGER_FINGERPRINT_KEY_HEX";

/// Runs the command on the process's stdin and stdout; a failure is one JSON error object on
/// stderr (exit 2).
pub fn run() -> Result<Outcome, Failure> {
    let key_error =
        |detail: String| Failure::explained("KEY_ERROR", format!("{KEY_ENV}: {detail}"));
    let key = match std::env::var_os(KEY_ENV) {
        None => {
            return Err(key_error(
                "missing_key: not set; there is no default key (set it to the hex of at least \
                 32 bytes)"
                    .into(),
            ))
        }
        Some(v) => match v.into_string() {
            Ok(hex) => FingerprintKey::from_hex(&hex),
            Err(_) => return Err(key_error("invalid_key_hex: not valid hex".into())),
        },
    };
    let key = key.map_err(|e| key_error(e.to_string()))?;
    let stdin = io::stdin().lock();
    let mut stdout = BufWriter::new(io::stdout().lock());
    let outcome = fingerprint_lines(&key, stdin, &mut stdout);
    let flushed = stdout.flush();
    match outcome {
        Err(LineError::Input(message)) => Err(Failure::explained("INVALID_INPUT", message)),
        Err(LineError::Read) => Err(Failure::explained("INPUT_IO_ERROR", "stdin: read failed")),
        Err(LineError::Write) => Err(write_failed()),
        Ok(()) if flushed.is_err() => Err(write_failed()),
        Ok(()) => Ok(Outcome::Pass),
    }
}

fn write_failed() -> Failure {
    Failure::explained("OUTPUT_IO_ERROR", "stdout: write failed")
}

/// Why [`fingerprint_lines`] stopped.
#[derive(Debug, PartialEq, Eq)]
enum LineError {
    /// A bad line: `line N: CODE: reason`.
    Input(String),
    /// Stdin could not be read.
    Read,
    /// Stdout could not be written.
    Write,
}

fn is_blank(line: &[u8]) -> bool {
    line.iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
}

/// Fingerprints every line of `input` into `out`.
fn fingerprint_lines<R: BufRead, W: Write>(
    key: &FingerprintKey,
    mut input: R,
    out: &mut W,
) -> Result<(), LineError> {
    let limits = Limits::DEFAULT;
    let mut buf = Vec::with_capacity(1024);
    let mut number = 0usize;
    // The first line of a run of blank lines; an error only if a request follows it.
    let mut first_blank: Option<usize> = None;
    loop {
        buf.clear();
        let read = input
            .by_ref()
            .take(limits.max_bytes as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|_| LineError::Read)?;
        if read == 0 {
            return Ok(());
        }
        number += 1;
        let line = match buf.split_last() {
            Some((b'\n', line)) => line,
            _ if buf.len() > limits.max_bytes => {
                return Err(LineError::Input(format!(
                    "line {number}: too_large: the line is longer than {} bytes",
                    limits.max_bytes
                )))
            }
            _ => &buf[..],
        };
        if is_blank(line) {
            first_blank.get_or_insert(number);
            continue;
        }
        if let Some(blank) = first_blank {
            return Err(LineError::Input(format!(
                "line {blank}: syntax: blank line between requests"
            )));
        }
        let digest = FingerprintInput::from_json(line, &limits)
            .and_then(|request| fingerprint(key, &request))
            .map_err(|e| LineError::Input(format!("line {number}: {e}")))?;
        writeln!(out, "{digest}").map_err(|_| LineError::Write)?;
    }
}
