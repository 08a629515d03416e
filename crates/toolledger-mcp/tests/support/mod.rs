//! What the tests that run `examples/guarded_tool.rs` as a process share.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The `guarded_tool` example's executable, built (or found up to date) by cargo once per
/// test binary.
pub fn guarded_tool_binary() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        toolledger_testkit::kill::cargo_build(
            env!("CARGO_MANIFEST_DIR").as_ref(),
            &["-p", env!("CARGO_PKG_NAME"), "--example", "guarded_tool"],
            "guarded_tool",
        )
    })
    .clone()
}
