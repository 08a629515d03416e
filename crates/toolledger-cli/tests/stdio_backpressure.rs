//! A stdio client that writes requests and never reads its answers: the server (`serve`, and
//! the proxy) stops reading once its in-flight requests' answers cannot be written, so the
//! client's writes block and the server's memory stays bounded instead of growing with every
//! request sent.

#[macro_use]
mod support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::wire::*;

/// The most resident memory a server may reach (its high-water mark, `VmHWM`).
const MAX_RSS_KB: u64 = 128 * 1024;
/// Requests the client tries to send (each answer is a whole tool list).
const REQUESTS: usize = 200_000;

fn peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Starts `command` with stdout piped and never read, writes `tools/list` requests until
/// [`REQUESTS`] are written or the writes stop making progress for two seconds, and returns
/// (requests written, the server's peak resident memory in KiB).
fn flood(mut command: Command) -> (usize, u64) {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let _unread = child.stdout.take().unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    std::thread::spawn(move || {
        let init = concat!(
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"flood","version":"1"}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "\n"
        );
        if stdin.write_all(init.as_bytes()).is_err() {
            return;
        }
        for id in 1..=REQUESTS {
            let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/list\"}}\n");
            if stdin.write_all(line.as_bytes()).is_err() {
                return;
            }
            counter.store(id, Ordering::Relaxed);
        }
    });
    let mut last = (0, Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let n = sent.load(Ordering::Relaxed);
        if n >= REQUESTS {
            break;
        }
        if n != last.0 {
            last = (n, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(2) {
            break;
        }
    }
    let peak = peak_rss_kb(child.id());
    let _ = child.kill();
    let _ = child.wait();
    (sent.load(Ordering::Relaxed), peak)
}

#[test]
fn serve_stops_reading_a_client_that_does_not_read() {
    let db = Db::sqlite();
    add_principal(&db, "alice", "acme", &["editor"], &[], false);
    let (sent, peak) = flood(serve_command(&db, &["--principal".into(), "alice".into()]));
    assert!(sent < REQUESTS, "the server read every request: {sent}");
    assert!(
        peak < MAX_RSS_KB,
        "peak RSS {peak} KiB after {sent} requests"
    );
}

#[test]
fn the_proxy_stops_reading_a_client_that_does_not_read() {
    let db = Db::sqlite();
    add_principal(&db, "alice", "acme", &["editor"], &[], false);
    let dir = tempfile::tempdir().unwrap();
    let mut command = toolledger();
    command
        .arg("proxy")
        .args(db.store_args())
        .args(["--principal", "alice", "--"])
        .arg(support::bin())
        .args(["upstream-example", "--db"])
        .arg(dir.path().join("charges.sqlite"))
        .envs(db.key_env());
    let (sent, peak) = flood(command);
    assert!(sent < REQUESTS, "the proxy read every request: {sent}");
    assert!(
        peak < MAX_RSS_KB,
        "peak RSS {peak} KiB after {sent} requests"
    );
}
