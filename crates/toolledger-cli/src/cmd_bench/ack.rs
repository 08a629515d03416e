//! The acknowledgement stream (a testing aid for crash tests): fresh operations against one
//! database, each key printed on stdout the moment its call returns, which is after its
//! batch's `COMMIT`. A test kills the process mid-run and checks that every printed key is in
//! the database.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use super::{bench_engine, fresh_op, key_of};

/// Runs `ops` fresh operations with `concurrency` callers against `path`.
pub async fn run(
    path: PathBuf,
    concurrency: usize,
    ops: usize,
    readers: Option<usize>,
) -> ExitCode {
    let engine = match bench_engine(&path, readers) {
        Ok(e) => e,
        Err(code) => return crate::common::fail(code),
    };
    let measured = super::run::drive("ack", concurrency, ops, move |i| {
        let engine = engine.clone();
        async move {
            let key = key_of("ack", i);
            match fresh_op(&engine, key.clone(), i as i64).await {
                Ok(_) => {
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{key}").is_ok() && out.flush().is_ok()
                }
                Err(_) => false,
            }
        }
    })
    .await;
    if measured.failed > 0 {
        return crate::common::fail("BENCH_FAILED");
    }
    ExitCode::SUCCESS
}
