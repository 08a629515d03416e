//! `toolledger demo lost-reply` through the built binary: plain lines on a terminal, one JSON
//! object with plain names when piped or with `--json`, and no jargon in either.

mod support;

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

use serde_json::Value;
use support::BIN;

/// Words of the test harness that must not reach a reader of the demo.
const JARGON: &[&str] = &[
    "case-03",
    "guarded-matrix",
    "70",
    "fault",
    "drop-after-commit",
];

/// Runs the binary with stdout on a pseudo-terminal; returns (exit status, what it printed).
fn on_a_terminal(args: &[&str]) -> (i32, String) {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two new descriptors into the provided integers.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: both descriptors were just opened and are owned here only.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("TOOLLEDGER_DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::from(slave))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = Vec::new();
    let mut reader = std::fs::File::from(master);
    // Reading the master ends with an error (EIO) once the child closed the terminal.
    let _ = reader.read_to_end(&mut out);
    let status = child.wait().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out).replace("\r\n", "\n"),
    )
}

fn piped(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("TOOLLEDGER_DATABASE_URL")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
    )
}

#[test]
fn on_a_terminal_the_demo_tells_the_story_in_plain_lines_and_ends_with_ok() {
    let (code, text) = on_a_terminal(&["demo", "lost-reply"]);
    assert_eq!(code, 0, "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last().copied(), Some("ok"), "{text}");
    for (label, content) in [
        ("sent:", "create_issue \"spec\""),
        ("lost:", "stopped before replying"),
        ("status:", "applied with the stored result \"created 1\""),
        ("replay:", "replayed: true"),
        ("rows:", "1 issue, 1 operation"),
        ("without the ledger:", "creates issue #2: 2 issues"),
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.trim_start().starts_with(label) && l.contains(content)),
            "no {label:?} line with {content:?}: {text}"
        );
    }
    assert!(!text.trim_start().starts_with('{'), "not JSON: {text}");
    for word in JARGON {
        assert!(!text.contains(word), "{word:?} in {text}");
    }
}

#[test]
fn piped_or_with_json_the_demo_prints_one_object_with_plain_names() {
    let (code, stdout) = piped(&["demo", "lost-reply"]);
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(stdout.trim().lines().count(), 1, "one line: {stdout}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["demo"], "lost-reply");
    assert_eq!(v["database"], "sqlite");
    assert_eq!(v["guarded"]["reply_lost"], true);
    assert_eq!(v["guarded"]["replay"]["replayed"], true);
    assert_eq!(v["unguarded"]["retry"]["issue_id"], 2);
    assert!(v["unguarded"].get("replay").is_none(), "{v}");
    for word in JARGON {
        assert!(!stdout.contains(word), "{word:?} in {stdout}");
    }
    assert!(!stdout.contains("freshWriteAuthorized"), "{stdout}");
    let checks = v["checks"].as_object().unwrap();
    assert!(checks.len() >= 5);
    assert!(checks.values().all(|c| c == &Value::Bool(true)), "{v}");

    // --json prints the same object on a terminal.
    let (code, text) = on_a_terminal(&["demo", "lost-reply", "--json"]);
    assert_eq!(code, 0, "{text}");
    let on_tty: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(on_tty["ok"], true);
    assert_eq!(on_tty["guarded"], v["guarded"]);
}

#[test]
fn the_proxy_demo_counts_two_charges_without_the_proxy_and_one_with_it() {
    let (code, stdout) = piped(&["demo", "proxy"]);
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(stdout.trim().lines().count(), 1, "one line: {stdout}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["demo"], "proxy");
    assert_eq!(v["without_proxy"]["reply_lost"], true, "{v}");
    assert_eq!(v["without_proxy"]["charges"], 2, "{v}");
    assert_eq!(v["with_proxy"]["charges"], 1, "{v}");
    let first = &v["with_proxy"]["first_answer"];
    assert_eq!(first["outcome"], "outcome_unknown", "{v}");
    assert_eq!(v["with_proxy"]["retry_answer"], *first, "{v}");
    assert_eq!(v["with_proxy"]["status"]["state"], "succeeded", "{v}");
    assert_eq!(v["with_proxy"]["replay"]["replayed"], true, "{v}");
    let checks = v["checks"].as_object().unwrap();
    assert!(checks.len() >= 5);
    assert!(checks.values().all(|c| c == &Value::Bool(true)), "{v}");

    let (code, text) = on_a_terminal(&["demo", "proxy"]);
    assert_eq!(code, 0, "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last().copied(), Some("ok"), "{text}");
    for (label, content) in [
        ("without the proxy:", "2 charges"),
        ("with the proxy:", "outcome unknown"),
        ("status:", "succeeded"),
        ("replay:", "replayed: true"),
        ("charges:", "1 with the proxy, 2 without"),
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.trim_start().starts_with(label) && l.contains(content)),
            "no {label:?} line with {content:?}: {text}"
        );
    }
}

#[test]
fn the_agent_demo_resumes_from_the_journal_and_refuses_the_replan() {
    let (code, stdout) = piped(&["demo", "agent"]);
    assert_eq!(code, 0, "{stdout}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["demo"], "agent");
    let crash = &v["crash"];
    assert_eq!(crash["with_ledger"]["resumed"], 1, "{v}");
    assert_eq!(crash["with_ledger"]["replayed"], true, "{v}");
    assert_eq!(crash["with_ledger"]["charges"], 1, "{v}");
    assert_eq!(crash["without_ledger"]["charges"], 2, "{v}");
    let replan = &v["replan"];
    assert_eq!(replan["with_ledger"]["first"], "outcome_unknown", "{v}");
    assert_eq!(replan["with_ledger"]["replan"], "possible_duplicate", "{v}");
    assert_eq!(replan["with_ledger"]["names"], true, "{v}");
    assert_eq!(replan["with_ledger"]["charges"], 1, "{v}");
    assert_eq!(replan["without_ledger"]["charges"], 2, "{v}");

    let (code, text) = on_a_terminal(&["demo", "agent"]);
    assert_eq!(code, 0, "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last().copied(), Some("ok"), "{text}");
    for (label, content) in [
        ("crash:", "died before the reply"),
        ("resume:", "replayed; 1 charge"),
        ("re-plan:", "possible_duplicate"),
        ("without the ledger:", "2 charges"),
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.trim_start().starts_with(label) && l.contains(content)),
            "no {label:?} line with {content:?}: {text}"
        );
    }
}
