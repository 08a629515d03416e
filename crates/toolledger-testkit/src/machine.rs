//! What a test needs from the machine it runs on (an interpreter, a browser, a program on the
//! path, the right to mount): without it the test skips with one loud line on stderr, except
//! under [`CI_ENV`], where it fails — CI runs every test.

use std::path::PathBuf;

use crate::db::CI_ENV;

/// Skips the calling test — one line on stderr, `!!! SKIPPED: {why} !!!`, written straight to
/// the stderr handle, which the test harness does not capture — or, under [`CI_ENV`], fails
/// it. The caller returns after it.
pub fn skip(why: &str) {
    if std::env::var_os(CI_ENV).is_some() {
        panic!("{CI_ENV} is set, and a test cannot skip in CI: {why}");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "!!! SKIPPED: {why} !!!");
}

/// The program the environment variable `var` names (an interpreter: `TOOLLEDGER_PYTHON`,
/// `TOOLLEDGER_NODE`), or `None` after [`skip`] when it is unset or empty; `what` says what
/// the tests need it for.
pub fn program(var: &str, what: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ => {
            skip(&format!("the {what} tests need {var} (.ci/run sets it)"));
            None
        }
    }
}
