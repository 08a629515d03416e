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
//! - [`ack`]: the acknowledgement stream of `bench --ack-db/--ack-schema` (crash tests);
//! - [`SOAK_ARGS`] and [`check_soak_lines`]: a tiny `bench --workload retention-soak` and its
//!   four lines;
//! - [`json_lines`]: the JSON lines of a run that succeeded.
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

/// The flags of a tiny `bench --workload retention-soak` of 400 calls in two rounds (either
/// backend).
pub const SOAK_ARGS: &[&str] = &[
    "--workload",
    "retention-soak",
    "--ops",
    "400",
    "--concurrency",
    "4",
    "--soak-periods",
    "4",
    "--soak-samples",
    "4",
    "--soak-prune-interval",
    "0.01",
    "--soak-rounds",
    "2",
];

/// Checks the four lines of [`SOAK_ARGS`]' `bench --workload retention-soak` of `ops` calls on
/// `backend`: pruner off then on, then on then off; every call ended as expected; the samples run from the first call to
/// the last; and every fresh call is a row, a tombstone or a deleted tombstone at the end.
/// No figure is asserted.
pub fn check_soak_lines(lines: &[Value], backend: &str, ops: u64) {
    // Two rounds, the order alternating: off then on, on then off.
    assert_eq!(lines.len(), 4, "{lines:?}");
    let order = [("off", 1), ("on", 1), ("on", 2), ("off", 2)];
    for (v, (pruner, round)) in lines.iter().zip(order) {
        assert_eq!(v["workload"], "retention-soak", "{v}");
        assert_eq!(v["backend"], backend, "{v}");
        assert_eq!(v["pruner"], pruner, "{v}");
        assert_eq!(v["round"], round, "{v}");
        assert_eq!(v["ops"], ops, "{v}");
        let (fresh, replays) = (
            v["fresh_ops"].as_u64().unwrap(),
            v["replay_ops"].as_u64().unwrap(),
        );
        assert_eq!(fresh + replays, ops, "{v}");
        assert!(replays > 0, "{v}");
        assert_eq!(v["fresh_failed"], 0, "{v}");
        assert_eq!(v["replay_failed"], 0, "{v}");
        assert_eq!(v["prune_failed"], 0, "{v}");
        for kind in ["fresh", "replay"] {
            let p50 = v[format!("{kind}_p50_us")].as_u64().unwrap();
            assert!(p50 <= v[format!("{kind}_p99_us")].as_u64().unwrap(), "{v}");
        }
        let samples = v["samples"].as_array().unwrap();
        assert!(samples.len() >= 2, "{v}");
        assert_eq!(samples[0]["ops"], 0, "{v}");
        let last = samples.last().unwrap();
        assert_eq!(last["ops"], ops, "{v}");
        assert!(last["bytes"].as_i64().unwrap() > 0, "{v}");
        let rows = last["live"].as_u64().unwrap() + last["tombstones"].as_u64().unwrap();
        assert_eq!(rows + v["deleted"].as_u64().unwrap(), fresh, "{v}");
        assert!(v["growth_second_half"].as_f64().is_some(), "{v}");
        // The server's log written per call: PostgreSQL's line says it, SQLite's has no such
        // figure.
        match backend {
            "postgres" => assert!(v["wal_bytes_per_call"].as_f64().unwrap() > 0.0, "{v}"),
            _ => assert!(v.get("wal_bytes_per_call").is_none(), "{v}"),
        }
        // The default batch: on PostgreSQL the background pruner's own batches are smaller
        // than `toolledger prune`'s, on SQLite it only caps the writer's steps.
        let batch = match backend {
            "postgres" => toolledger::prune::BACKGROUND_BATCH,
            _ => toolledger::prune::DEFAULT_BATCH,
        };
        assert_eq!(v["prune_batch"], batch, "{v}");
        assert!(v["prune_rows_per_sec"].as_f64().is_some(), "{v}");
    }
    for v in lines {
        if v["pruner"] == "off" {
            assert_eq!(v["prune_passes"], 0, "{v}");
            assert_eq!(v["compacted"], 0, "{v}");
            assert!(v.get("fresh_p99_vs_off").is_none(), "{v}");
        } else {
            assert!(v["fresh_p99_vs_off"].as_f64().is_some(), "{v}");
        }
    }
}

/// The JSON lines `out` printed on stdout; panics with its stderr unless it succeeded.
pub fn json_lines(out: std::process::Output) -> Vec<serde_json::Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
