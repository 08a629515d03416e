//! The deferred runtime's commands through the built binary: runs of `approve`, `dispatch`,
//! `status`, … on a [`Db`] (one JSON object each), both SQLite files (ledger and payments
//! stand-in) read directly, and fixtures.

use std::path::{Path, PathBuf};
use std::process::Stdio;

pub use super::{bin, toolledger, Db, Run, BIN};

/// A runtime example fixture of the repository.
pub fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/fixtures")
        .join(name)
}

/// Runs the binary with `args` (no stdin, no crash-point hold) and waits for it.
pub fn run(args: &[&str]) -> Run {
    toolledger()
        .args(args)
        .env_remove("TOOLLEDGER_TEST_HOLD_AT")
        .stdin(Stdio::null())
        .output()
        .expect("binary runs")
        .into()
}

impl Db {
    /// Runs `cmd --db <ledger> extra…`.
    pub fn run(&self, cmd: &str, extra: &[&str]) -> Run {
        let mut args = vec![cmd, "--db", self.db()];
        args.extend_from_slice(extra);
        run(&args)
    }

    /// `approve --fixture FIXTURE --approver APPROVER`.
    pub fn approve(&self, fixture: &Path, approver: &str) -> Run {
        self.run(
            "approve",
            &[
                "--fixture",
                fixture.to_str().unwrap(),
                "--approver",
                approver,
            ],
        )
    }

    /// `dispatch --fixture FIXTURE extra…`.
    pub fn dispatch(&self, fixture: &Path, extra: &[&str]) -> Run {
        let mut args = vec!["--fixture", fixture.to_str().unwrap()];
        args.extend_from_slice(extra);
        self.run("dispatch", &args)
    }

    /// `status --fixture FIXTURE --status-ref REF`.
    pub fn status(&self, fixture: &Path, status_ref: &str) -> Run {
        self.run(
            "status",
            &[
                "--fixture",
                fixture.to_str().unwrap(),
                "--status-ref",
                status_ref,
            ],
        )
    }

    /// A fresh connection to the ledger file (waiting up to 5 s on a busy database).
    pub fn ledger(&self) -> rusqlite::Connection {
        let c = rusqlite::Connection::open(&self.db).unwrap();
        c.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
        c
    }

    /// One integer a query on the ledger returns.
    pub fn int(&self, sql: &str) -> i64 {
        toolledger_testkit::db::sqlite_scalar(&self.db, sql)
    }

    /// One text a query on the ledger returns.
    pub fn text(&self, sql: &str) -> String {
        self.ledger().query_row(sql, [], |r| r.get(0)).unwrap()
    }

    /// Receipts in the payments stand-in's own file (0 when the file does not exist).
    pub fn downstream_receipts(&self) -> i64 {
        if !self.downstream().exists() {
            return 0;
        }
        toolledger_testkit::db::sqlite_count(&self.downstream(), "downstream_receipts")
    }
}

/// Writes `text` as a fixture file in `dir`.
pub fn write_fixture(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// The example fixture with textual replacements applied, written into `dir`.
pub fn variant(dir: &Path, name: &str, replacements: &[(&str, &str)]) -> PathBuf {
    let mut text = std::fs::read_to_string(example("refund-order.json")).unwrap();
    for (from, to) in replacements {
        assert!(text.contains(from), "{from}");
        text = text.replace(from, to);
    }
    write_fixture(dir, name, &text)
}
