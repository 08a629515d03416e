//! `toolledger fingerprint`: one JSON request per line on stdin, one lowercase hex keyed
//! request fingerprint per line on stdout.
//!
//! - The key comes from `TOOLLEDGER_FINGERPRINT_KEY_HEX` (hex, at least 32 bytes, no default).
//!   A missing, non-hex or short key prints one line
//!   `TOOLLEDGER_FINGERPRINT_KEY_HEX: CODE: reason` on stderr and exits 2 before reading stdin.
//! - Each line is parsed with the strict parser and [`Limits::DEFAULT`] (a trailing `\r` is
//!   JSON whitespace, so CRLF input works). Digests are printed as lines are read; the first
//!   bad line N stops the run with `line N: CODE: reason` on stderr and exit 2, so the digests
//!   of lines before N have already been printed and no later line is read.
//! - Blank lines at the end of the input are ignored; a blank line followed by another request
//!   is a bad line. Empty input prints nothing and exits 0.

use std::io::{self, BufRead, BufWriter, Read, Write};

use toolledger::digest::{fingerprint, FingerprintInput, FingerprintKey};
use toolledger::json::Limits;

use crate::exit::{Failure, Outcome};

/// The environment variable that holds the hex key.
pub const KEY_ENV: &str = "TOOLLEDGER_FINGERPRINT_KEY_HEX";

/// Runs the command on the process's stdin and stdout; a failure is one plain line on
/// stderr (exit 2).
pub fn run() -> Result<Outcome, Failure> {
    let key = match std::env::var_os(KEY_ENV) {
        None => {
            return Err(Failure::Line(format!(
                "{KEY_ENV}: missing_key: not set; there is no default key"
            )))
        }
        Some(v) => match v.into_string() {
            Ok(hex) => FingerprintKey::from_hex(&hex),
            Err(_) => {
                return Err(Failure::Line(format!(
                    "{KEY_ENV}: invalid_key_hex: not valid hex"
                )))
            }
        },
    };
    let key = key.map_err(|e| Failure::Line(format!("{KEY_ENV}: {e}")))?;
    let stdin = io::stdin().lock();
    let mut stdout = BufWriter::new(io::stdout().lock());
    let outcome = fingerprint_lines(&key, stdin, &mut stdout);
    let flushed = stdout.flush();
    match outcome {
        Err(message) => Err(Failure::Line(message)),
        Ok(()) if flushed.is_err() => Err(Failure::Line("stdout: write failed".into())),
        Ok(()) => Ok(Outcome::Pass),
    }
}

fn is_blank(line: &[u8]) -> bool {
    line.iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
}

/// Fingerprints every line of `input` into `out`; the error is the one-line message for stderr.
fn fingerprint_lines<R: BufRead, W: Write>(
    key: &FingerprintKey,
    mut input: R,
    out: &mut W,
) -> Result<(), String> {
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
            .map_err(|_| "stdin: read failed".to_string())?;
        if read == 0 {
            return Ok(());
        }
        number += 1;
        let line = match buf.split_last() {
            Some((b'\n', line)) => line,
            _ if buf.len() > limits.max_bytes => {
                return Err(format!(
                    "line {number}: too_large: the line is longer than {} bytes",
                    limits.max_bytes
                ))
            }
            _ => &buf[..],
        };
        if is_blank(line) {
            first_blank.get_or_insert(number);
            continue;
        }
        if let Some(blank) = first_blank {
            return Err(format!("line {blank}: syntax: blank line between requests"));
        }
        let digest = FingerprintInput::from_json(line, &limits)
            .and_then(|request| fingerprint(key, &request))
            .map_err(|e| format!("line {number}: {e}"))?;
        writeln!(out, "{digest}").map_err(|_| "stdout: write failed".to_string())?;
    }
}
