//! Names the build's commit in `toolledger --version`: `TOOLLEDGER_BUILD_COMMIT` when set (a
//! packager's override), else the commit a crates.io package records in `.cargo_vcs_info.json`,
//! else `git rev-parse` of the checkout being built; a build from none of these says `unknown`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TOOLLEDGER_BUILD_COMMIT");
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let manifest = Path::new(&manifest);
    let commit = std::env::var("TOOLLEDGER_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| packaged_commit(manifest))
        .or_else(|| git_commit(manifest))
        .map(|c| c.trim().chars().take(12).collect::<String>())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=TOOLLEDGER_BUILD_COMMIT={commit}");
}

/// The commit `cargo package` wrote beside the manifest.
fn packaged_commit(manifest: &Path) -> Option<String> {
    let info = manifest.join(".cargo_vcs_info.json");
    watch(&info);
    let text = std::fs::read_to_string(info).ok()?;
    let at = text.find("\"sha1\"")?;
    let rest = &text[at + 6..];
    let start = rest.find('"')? + 1;
    let end = start + rest[start..].find('"')?;
    Some(rest[start..end].to_string())
}

/// The checked-out commit, rebuilt when HEAD moves.
fn git_commit(manifest: &Path) -> Option<String> {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(manifest)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
    };
    let git_dir = git(&["rev-parse", "--absolute-git-dir"])?;
    let git_dir = Path::new(&git_dir);
    watch(&git_dir.join("HEAD"));
    if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch(&git_dir.join(reference));
    }
    watch(&git_dir.join("packed-refs"));
    git(&["rev-parse", "HEAD"])
}

/// Reruns this script when `path` changes; a path that does not exist is not watched (cargo
/// would rerun the script at every build).
fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
