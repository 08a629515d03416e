//! Faults of the machine under `toolledger serve` on SQLite: the file system of the ledger
//! fills up or fails `fsync` under a running server — calls answer `unavailable` (no path in
//! the error), nothing acknowledged is lost, acknowledged calls still replay, and the same
//! server serves normally once the fault is gone, without a restart — or is remounted
//! read-only (refused by Linux while the server runs; with the server stopped, `serve` refuses
//! to start with a stable code and the read-only commands still answer).
//!
//! The ledger lives on a small tmpfs mounted for the test under a unique directory in /tmp and
//! unmounted by a guard even when the test fails. Mounting needs root (CI runs as root): without
//! the capability the tests skip with one loud line, and under `TOOLLEDGER_CI` they fail.
//!
//! A failing `fsync` is injected with a preloaded shim (built here with the system C
//! compiler) that makes `fsync` and `fdatasync` fail with `EIO` while a trigger file exists:
//! the kernels these tests run on have no device-mapper (`dm-flakey`) to fail a real device.

#[macro_use]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::wire::*;
use toolledger_testkit::machine::skip;

/// Skips (one loud line) or, under CI, fails.
fn unavailable_capability(what: &str) {
    skip(&format!("machine-fault test: {what}"));
}

/// A tmpfs of `size` mounted on a fresh directory under /tmp; unmounted and removed on drop.
struct Mount {
    dir: PathBuf,
}

impl Mount {
    /// Mounts a tmpfs of `size` (`mount -o size=`), or `None` (after the skip notice) when
    /// this machine cannot.
    fn tmpfs(size: &str) -> Option<Mount> {
        let dir = tempfile::Builder::new()
            .prefix("toolledger-faults-")
            .tempdir_in("/tmp")
            .unwrap()
            .keep();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(&dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = std::fs::remove_dir(&dir);
            unavailable_capability("cannot mount a tmpfs (needs root)");
            return None;
        }
        Some(Mount { dir })
    }

    fn path(&self) -> &Path {
        &self.dir
    }

    /// `mount -o remount,{mode}`; whether it succeeded.
    fn try_remount(&self, mode: &str) -> bool {
        Command::new("mount")
            .args(["-o", &format!("remount,{mode}")])
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// `mount -o remount,{mode}`, which must succeed.
    fn remount(&self, mode: &str) {
        assert!(self.try_remount(mode), "remount {mode}");
    }

    /// Writes a filler file until the file system is full; returns its path.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.dir.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0x5au8; 16 * 1024];
        loop {
            if f.write_all(&chunk).is_err() {
                break;
            }
        }
        // Single bytes take whatever a partial chunk left.
        while f.write_all(&[0]).is_ok() {}
        let _ = f.flush();
        path
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // Read-write again first, so a lazy unmount never leaves a read-only tree behind.
        let _ = Command::new("mount")
            .args(["-o", "remount,rw"])
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A ledger on `mount` with the wire tests' principals.
fn ledger_on(mount: &Mount) -> PathBuf {
    let db = mount.path().join("ledger.sqlite");
    for (name, tenant) in [("alice", "acme"), ("bob", "acme")] {
        add_principal(
            db.as_path(),
            name,
            tenant,
            &["editor"],
            &["automation:write"],
            false,
        );
    }
    db
}

fn create(s: &mut Server, request_id: &str) -> Value {
    s.call(
        "create_automation",
        json!({"request_id": request_id, "interval_minutes": 30}),
    )
}

/// The acknowledged result of a call (its structured content without `replayed`).
fn acknowledged(reply: &Value) -> Option<Value> {
    if reply["isError"] != false {
        return None;
    }
    let mut c = reply["structuredContent"].clone();
    c.as_object_mut()?.remove("replayed");
    Some(c)
}

/// Asserts that `reply` is an `unavailable` error that names no path.
fn refused_unavailable(reply: &Value, mount: &Mount) {
    assert_eq!(error_code(reply), "unavailable", "{reply}");
    let text = reply.to_string();
    let dir = mount.path().display().to_string();
    assert!(!text.contains(&dir), "a path leaked: {text}");
    assert!(!text.contains("/tmp"), "a path leaked: {text}");
    assert!(
        !text.contains("ledger.sqlite"),
        "a file name leaked: {text}"
    );
}

/// The message of an error result.
fn error_message(reply: &Value) -> String {
    toolledger_mcp::error_of(reply).unwrap_or_default()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Every acknowledged call replays its acknowledged result, and the ledger holds one
/// automation per acknowledged request id.
fn all_acknowledged_replay(s: &mut Server, acked: &[(String, Value)]) {
    for (id, result) in acked {
        let again = create(s, id);
        assert_eq!(again["structuredContent"]["replayed"], true, "{again}");
        assert_eq!(acknowledged(&again).as_ref(), Some(result), "{id}");
    }
}

fn automations(db: &Path) -> i64 {
    db.scalar("SELECT count(*) FROM automations")
}

#[test]
fn a_full_disk_answers_unavailable_and_the_server_recovers_when_space_returns() {
    let Some(mount) = Mount::tmpfs("2m") else {
        return;
    };
    let db = ledger_on(&mount);
    let mut s = Server::start(db.as_path(), "alice", &[]);
    let mut acked = Vec::new();
    for i in 0..5 {
        let id = format!("before-{i}");
        let r = acknowledged(&create(&mut s, &id)).expect("served before the fault");
        acked.push((id, r));
    }

    let filler = mount.fill();
    // Writes until one is refused (a write may still fit in space SQLite already holds).
    let mut refused = Vec::new();
    for i in 0..200 {
        let id = format!("full-{i}");
        let reply = create(&mut s, &id);
        match acknowledged(&reply) {
            Some(r) => acked.push((id, r)),
            None => {
                refused_unavailable(&reply, &mount);
                // SQLITE_FULL is transient (it ends when space returns): `store unavailable`.
                assert_eq!(error_message(&reply), "store unavailable");
                refused.push(id);
                if refused.len() >= 3 {
                    break;
                }
            }
        }
    }
    assert!(!refused.is_empty(), "a full disk must refuse writes");
    // Acknowledged calls still replay on the full disk.
    all_acknowledged_replay(&mut s, &acked);

    // Space returns: the same server, no restart, takes the refused calls again.
    std::fs::remove_file(filler).unwrap();
    for id in &refused {
        let reply = create(&mut s, id);
        let r = acknowledged(&reply).unwrap_or_else(|| panic!("served after the fault: {reply}"));
        assert_eq!(reply["structuredContent"]["replayed"], false, "{reply}");
        acked.push((id.clone(), r));
    }
    all_acknowledged_replay(&mut s, &acked);
    assert_eq!(s.finish(), 0);
    assert_eq!(automations(&db), acked.len() as i64, "one effect per call");
    assert_eq!(
        db.scalar("SELECT count(*) FROM operations WHERE state = 'applied'"),
        acked.len() as i64
    );
    assert_integrity(&db);
}

/// `mount -o remount,ro` of the ledger's file system. Linux refuses it (`EBUSY`) while a
/// file on it is open for writing, which a running server's ledger always is: the server
/// keeps serving. With the server stopped the remount succeeds; `serve` then refuses to start
/// with a stable code and a sentence naming no path, the read-only commands still answer, and
/// after `remount,rw` a server serves again with every acknowledged call replaying.
#[test]
fn a_read_only_remount_is_refused_under_a_server_and_read_only_commands_still_answer() {
    let Some(mount) = Mount::tmpfs("8m") else {
        return;
    };
    let db = ledger_on(&mount);
    let mut s = Server::start(db.as_path(), "alice", &[]);
    let mut acked = Vec::new();
    for i in 0..5 {
        let id = format!("before-{i}");
        let r = acknowledged(&create(&mut s, &id)).expect("served before the remount");
        acked.push((id, r));
    }
    assert!(
        !mount.try_remount("ro"),
        "Linux refuses a read-only remount while the ledger is open for writing"
    );
    let r = acknowledged(&create(&mut s, "during")).expect("still served");
    acked.push(("during".into(), r));
    assert_eq!(s.finish(), 0);

    mount.remount("ro");
    let out = serve_command(db.as_path(), &["--principal".to_string(), "alice".into()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "serve refuses a read-only ledger"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let error: Value =
        serde_json::from_str(stderr.trim()).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert_eq!(error["error"]["code"], "DATABASE_IO_ERROR", "{stderr}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("read-only"),
        "{stderr}"
    );
    assert!(!stderr.contains("/tmp"), "a path leaked: {stderr}");
    // The read-only commands still answer.
    let listed = toolledger()
        .args(["operations", "list", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert_eq!(listed.lines().count(), acked.len(), "{listed}");
    let audit = toolledger()
        .args(["audit", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(audit.status.success(), "{audit:?}");
    let audit: Value = serde_json::from_slice(&audit.stdout).unwrap();
    assert_eq!(audit["gate"], "PASS", "{audit}");

    mount.remount("rw");
    let mut s = Server::start(db.as_path(), "alice", &[]);
    all_acknowledged_replay(&mut s, &acked);
    let r = acknowledged(&create(&mut s, "after")).expect("served after rw");
    acked.push(("after".into(), r));
    assert_eq!(s.finish(), 0);
    assert_eq!(automations(&db), acked.len() as i64, "one effect per call");
    assert_integrity(&db);
}

/// The C source of the `fsync` shim: `fsync` and `fdatasync` fail with `EIO` while the file
/// named by `TOOLLEDGER_FAULT_FSYNC_TRIGGER` exists.
const FSYNC_SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

static int failing(void) {
    const char *trigger = getenv("TOOLLEDGER_FAULT_FSYNC_TRIGGER");
    return trigger && access(trigger, F_OK) == 0;
}

int fsync(int fd) {
    static int (*real)(int);
    if (failing()) { errno = EIO; return -1; }
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (failing()) { errno = EIO; return -1; }
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}
"#;

/// Builds the shim into `dir`; `None` (after the skip notice) without a C compiler.
fn build_fsync_shim(dir: &Path) -> Option<PathBuf> {
    let src = dir.join("fsync_shim.c");
    let lib = dir.join("fsync_shim.so");
    std::fs::write(&src, FSYNC_SHIM).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let ok = Command::new(cc)
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl")
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        unavailable_capability("no C compiler to build the fsync shim");
        return None;
    }
    Some(lib)
}

#[test]
fn a_failing_fsync_answers_unavailable_and_nothing_acknowledged_is_lost() {
    let work = tempfile::tempdir().unwrap();
    let Some(shim) = build_fsync_shim(work.path()) else {
        return;
    };
    let trigger = work.path().join("fail-fsync");
    let db = work.path().join("ledger.sqlite");
    add_principal(
        db.as_path(),
        "alice",
        "acme",
        &["editor"],
        &["automation:write"],
        false,
    );
    let start = |db: &Path| {
        let mut command = serve_command(db, &["--principal".to_string(), "alice".into()]);
        command
            .env("LD_PRELOAD", &shim)
            .env("TOOLLEDGER_FAULT_FSYNC_TRIGGER", &trigger);
        Server::spawn(command)
    };
    let mut s = start(&db);
    let mut acked = Vec::new();
    for i in 0..5 {
        let id = format!("before-{i}");
        let r = acknowledged(&create(&mut s, &id)).expect("served before the fault");
        acked.push((id, r));
    }

    std::fs::write(&trigger, b"").unwrap();
    let mut refused = Vec::new();
    for i in 0..3 {
        let id = format!("fsync-{i}");
        let reply = create(&mut s, &id);
        assert_eq!(error_code(&reply), "unavailable", "{reply}");
        // An I/O failure, not a transient one: the message says so.
        assert_eq!(
            error_message(&reply),
            "database file could not be opened, read or written"
        );
        assert!(
            !reply.to_string().contains("/tmp"),
            "a path leaked: {reply}"
        );
        refused.push(id);
    }
    // Reads need no fsync: acknowledged calls replay.
    all_acknowledged_replay(&mut s, &acked);

    std::fs::remove_file(&trigger).unwrap();
    for id in &refused {
        let reply = create(&mut s, id);
        let r = acknowledged(&reply).unwrap_or_else(|| panic!("served after the fault: {reply}"));
        acked.push((id.clone(), r));
    }
    all_acknowledged_replay(&mut s, &acked);
    assert_eq!(s.finish(), 0);
    assert_eq!(automations(&db), acked.len() as i64, "one effect per call");

    // After a restart (the write-ahead log recovered from the file), still one effect per
    // acknowledged call, and each replays what it acknowledged.
    let mut s = start(&db);
    all_acknowledged_replay(&mut s, &acked);
    assert_eq!(s.finish(), 0);
    assert_eq!(automations(&db), acked.len() as i64);
    assert_integrity(&db);
}

fn assert_integrity(db: &Path) {
    let conn = rusqlite::Connection::open(db).unwrap();
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
}
