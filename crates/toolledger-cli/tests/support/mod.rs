//! The helpers every CLI integration test shares; a test file takes them with `mod support;`
//! (`#[macro_use] mod support;` for `on_both_backends!`) and uses the part it needs:
//!
//! - this module: the built binary ([`bin`], [`BIN`]), one finished run of it ([`Run`]), and
//!   a temporary directory holding a SQLite ledger path ([`Db`]);
//! - [`wire`]: the MCP wire tests' ledgers of either backend, the `toolledger serve` process
//!   they talk to over stdio, and `on_both_backends!`;
//! - [`runtime`]: the deferred-runtime commands (`approve`, `dispatch`, `status`, …) on a
//!   [`Db`], and fixtures;
//! - [`clients`]: the interpreters and programs of other people's MCP clients and servers;
//! - [`ack`]: the acknowledgement stream of `bench --ack-db/--ack-schema` (crash tests).
//!
//! Each test binary compiles all of it and uses a part, hence the `allow`s.

#![allow(dead_code, unused_imports, unused_macros)]

pub mod ack;
pub mod clients;
pub mod runtime;
#[macro_use]
pub mod wire;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The built binary.
pub const BIN: &str = env!("CARGO_BIN_EXE_toolledger");

/// The built binary, as a path.
pub fn bin() -> PathBuf {
    PathBuf::from(BIN)
}

/// A command running the built binary.
pub fn toolledger() -> Command {
    Command::new(BIN)
}

/// One finished run of the binary.
pub struct Run {
    /// Its exit status (-1 when killed by a signal).
    pub code: i32,
    /// What it printed on stdout.
    pub stdout: String,
    /// What it printed on stderr.
    pub stderr: String,
}

impl Run {
    /// Stdout as one JSON value (panics, showing both streams, when it is not).
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

/// A temporary directory with a SQLite ledger path in it (`ledger.sqlite`, not created yet)
/// and the payments stand-in's default file beside it.
pub struct Db {
    /// The directory (removed on drop).
    pub dir: tempfile::TempDir,
    /// The ledger path.
    pub db: PathBuf,
}

impl Db {
    /// A fresh directory; nothing is created in it yet.
    pub fn new() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ledger.sqlite");
        Db { dir, db }
    }

    /// The ledger path as a flag value.
    pub fn db(&self) -> &str {
        self.db.to_str().unwrap()
    }

    /// The ledger path.
    pub fn path(&self) -> &Path {
        &self.db
    }

    /// Where the payments stand-in keeps its receipts by default.
    pub fn downstream(&self) -> PathBuf {
        toolledger_reference::refunds::default_downstream_path(&self.db)
    }
}
