//! Helpers for the runtime CLI tests: run the built `toolledger` binary, parse its one JSON
//! object, and read both SQLite files (ledger and payments stand-in) directly.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_toolledger");

pub fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/fixtures")
        .join(name)
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "stdout is not one JSON object ({e}): {:?} / {:?}",
                self.stdout, self.stderr
            )
        })
    }
}

impl From<Output> for Run {
    fn from(o: Output) -> Self {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

pub fn run(args: &[&str]) -> Run {
    Command::new(BIN)
        .args(args)
        .env_remove("TOOLLEDGER_TEST_HOLD_AT")
        .stdin(Stdio::null())
        .output()
        .expect("binary runs")
        .into()
}

/// A temporary directory with a ledger path and the default downstream path beside it.
pub struct Db {
    pub dir: tempfile::TempDir,
    pub db: PathBuf,
}

impl Db {
    pub fn new() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ledger.sqlite");
        Db { dir, db }
    }

    pub fn db(&self) -> &str {
        self.db.to_str().unwrap()
    }

    pub fn downstream(&self) -> PathBuf {
        let mut s = self.db.as_os_str().to_os_string();
        s.push(".downstream.sqlite");
        PathBuf::from(s)
    }

    pub fn run(&self, cmd: &str, extra: &[&str]) -> Run {
        let mut args = vec![cmd, "--db", self.db()];
        args.extend_from_slice(extra);
        run(&args)
    }

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

    pub fn dispatch(&self, fixture: &Path, extra: &[&str]) -> Run {
        let mut args = vec!["--fixture", fixture.to_str().unwrap()];
        args.extend_from_slice(extra);
        self.run("dispatch", &args)
    }

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

    pub fn ledger(&self) -> rusqlite::Connection {
        let c = rusqlite::Connection::open(&self.db).unwrap();
        c.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
        c
    }

    pub fn int(&self, sql: &str) -> i64 {
        self.ledger().query_row(sql, [], |r| r.get(0)).unwrap()
    }

    pub fn text(&self, sql: &str) -> String {
        self.ledger().query_row(sql, [], |r| r.get(0)).unwrap()
    }

    /// Receipts in the payments stand-in's own file (0 when the file does not exist).
    pub fn downstream_receipts(&self) -> i64 {
        if !self.downstream().exists() {
            return 0;
        }
        let c = rusqlite::Connection::open(self.downstream()).unwrap();
        c.query_row("SELECT count(*) FROM downstream_receipts", [], |r| r.get(0))
            .unwrap()
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
