//! `toolledger worker` through the built binary: `--max-attempts` applied at claim time,
//! events under live leases reported as skipped, each failure a JSON line on stderr, bad
//! options refused before the ledger is touched, and a polling worker's metrics endpoint.

mod support;

use serde_json::Value;
use support::runtime::*;

/// The fixtures' clock.
const T0: i64 = 1_767_225_600;

/// A ledger whose one refund was claimed at T0 by a process that then stopped (its lease runs
/// until T0 + 30).
fn claimed_and_abandoned() -> Db {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    let r = d.dispatch(&f, &["--failure", "after_claim"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(d.text("SELECT state FROM outbox"), "processing");
    assert_eq!(d.int("SELECT attempt_count FROM outbox"), 1);
    d
}

fn worker(d: &Db, at: i64, extra: &[&str]) -> Run {
    let at = at.to_string();
    let mut args = vec!["--once", "--clock-epoch", &at];
    args.extend_from_slice(extra);
    d.run("worker", &args)
}

#[test]
fn once_reports_an_event_under_a_live_lease_as_skipped() {
    let d = claimed_and_abandoned();
    let w = worker(&d, T0 + 10, &[]);
    assert_eq!(w.code, 0, "{}", w.stderr);
    let v = w.json();
    assert_eq!(v["skipped"], 1, "{v}");
    assert_eq!(v["delivered"], 0);
    assert_eq!(v["stopped_by"], "once");
    assert_eq!(d.downstream_receipts(), 0);
    assert_eq!(d.text("SELECT state FROM outbox"), "processing");
    // Once the lease has run out, the event is taken over and nothing is skipped.
    let w = worker(&d, T0 + 30, &[]);
    assert_eq!(w.json()["skipped"], 0);
    assert_eq!(w.json()["delivered"], 1);
}

#[test]
fn max_attempts_is_applied_when_the_worker_claims() {
    // The event was enqueued allowing 5 claims; this worker allows 1, already used.
    let d = claimed_and_abandoned();
    assert_eq!(d.int("SELECT max_attempts FROM outbox"), 5);
    let w = worker(&d, T0 + 30, &["--max-attempts", "1"]);
    assert_eq!(w.code, 0, "{}", w.stderr);
    let v = w.json();
    assert_eq!(v["dead"], 1, "{v}");
    assert_eq!(v["delivered"], 0);
    assert_eq!(d.text("SELECT state FROM outbox"), "dead");
    assert_eq!(d.text("SELECT state FROM operations"), "dead");
    assert_eq!(d.int("SELECT max_attempts FROM outbox"), 1);
    assert_eq!(d.downstream_receipts(), 0);
    assert_eq!(d.run("audit", &[]).code, 0);

    // A limit of 2 allows the second claim, and the event records the limit it ran under.
    let d = claimed_and_abandoned();
    let w = worker(&d, T0 + 30, &["--max-attempts", "2"]);
    assert_eq!(w.json()["delivered"], 1, "{}", w.stdout);
    assert_eq!(d.int("SELECT attempt_count FROM outbox"), 2);
    assert_eq!(d.int("SELECT max_attempts FROM outbox"), 2);
    assert_eq!(d.run("audit", &[]).code, 0);
}

#[test]
fn each_failed_event_is_a_json_line_on_stderr() {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    let r = d.dispatch(&f, &["--failure", "after_intent_commit"]);
    assert_eq!(r.code, 1);
    // The requester loses its grants before the worker's recheck.
    let revoke = run(&["principal", "revoke", "alice", "--all", "--db", d.db()]);
    assert_eq!(revoke.code, 0, "{}", revoke.stderr);
    let w = worker(&d, T0, &["--worker-id", "w-test", "--log-format", "json"]);
    assert_eq!(w.code, 0, "{}", w.stderr);
    assert_eq!(w.json()["refused"]["permission_denied"], 1, "{}", w.stdout);
    // With JSON logs every stderr line is JSON: the log events, and the failure lines.
    let all: Vec<Value> = w
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).expect("each stderr line is JSON"))
        .collect();
    let logged = all
        .iter()
        .find(|l| l["target"] == "toolledger::worker" && l["code"] == "permission_denied");
    assert!(
        logged.is_some(),
        "the failed attempt is a log event: {}",
        w.stderr
    );
    let lines: Vec<&Value> = all.iter().filter(|l| l.get("error").is_some()).collect();
    assert_eq!(lines.len(), 1, "{}", w.stderr);
    assert_eq!(lines[0]["worker"], "w-test");
    assert_eq!(lines[0]["error"]["code"], "permission_denied");
    assert!(lines[0]["error"]["message"].is_string());
    assert_eq!(
        lines[0]["event_id"],
        d.int("SELECT id FROM outbox"),
        "{}",
        w.stderr
    );
    assert_eq!(d.downstream_receipts(), 0);
}

#[test]
fn out_of_range_options_are_usage_errors_that_touch_nothing() {
    let d = claimed_and_abandoned();
    let hash = || std::fs::read(&d.db).unwrap();
    let before = hash();
    for (args, flag) in [
        (&["--max-attempts", "0"][..], "--max-attempts"),
        (&["--max-attempts", "1001"], "--max-attempts"),
        (&["--lease-seconds", "0"], "--lease-seconds"),
        (&["--batch", "0"], "--batch"),
    ] {
        let w = worker(&d, T0 + 30, args);
        assert_eq!(w.code, 2, "{args:?}");
        assert_eq!(w.stdout, "");
        let v: Value = serde_json::from_str(w.stderr.trim()).unwrap();
        assert_eq!(v["error"]["code"], "USAGE_ERROR");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(flag),
            "{}",
            w.stderr
        );
    }
    assert!(before == hash(), "the ledger file is byte-identical");
    assert_eq!(d.text("SELECT state FROM outbox"), "processing");
}

/// A free local port: bound and released here, then named to the worker.
fn free_addr() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string()
}

/// `GET /metrics` on `addr`: the body, or `None` while nothing listens there.
fn scrape(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).ok()?;
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    Some(raw.split_once("\r\n\r\n")?.1.to_string())
}

/// The value of the sample of `name` whose line contains `labels` (`None`: no such line).
fn sample(body: &str, name: &str, labels: &str) -> Option<f64> {
    body.lines()
        .find(|l| {
            (l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
                && l.contains(labels)
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn a_polling_worker_serves_metrics_that_count_what_it_did() {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.approve(&f, "bob").code, 0);
    assert_eq!(
        d.dispatch(&f, &["--failure", "after_intent_commit"]).code,
        1
    );
    assert_eq!(d.text("SELECT state FROM outbox"), "pending");
    let addr = free_addr();
    let at = T0.to_string();
    let child = toolledger()
        .args(["worker", "--db", d.db(), "--poll-interval", "50"])
        .args([
            "--worker-id",
            "w-metrics",
            "--clock-epoch",
            &at,
            "--metrics",
            &addr,
        ])
        .env_remove("TOOLLEDGER_TEST_HOLD_AT")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Scrape until the pass that delivered the refund has been counted, and the ledger's
    // gauges (read at most every 5 s, whatever the scrape rate) were read since.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let body = loop {
        if let Some(body) = scrape(&addr) {
            let delivered = sample(
                &body,
                "toolledger_worker_events_total",
                "outcome=\"delivered\"",
            );
            let settled = sample(&body, "toolledger_operations", "state=\"succeeded\"");
            if delivered.is_some() && settled == Some(1.0) {
                break body;
            }
        }
        assert!(std::time::Instant::now() < deadline, "nothing delivered");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let _ = unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out: Run = child.wait_with_output().unwrap().into();
    assert_eq!(out.code, 0, "{}", out.stderr);
    let summary = out.json();
    assert_eq!(summary["delivered"], 1, "{summary}");
    assert_eq!(summary["stopped_by"], "SIGTERM");

    // What the worker did, counted where it happened…
    assert_eq!(
        sample(
            &body,
            "toolledger_worker_events_total",
            "outcome=\"delivered\""
        ),
        Some(1.0),
        "{body}"
    );
    for outcome in ["refused", "dead", "unknown", "failed"] {
        let label = format!("outcome=\"{outcome}\"");
        assert_eq!(
            sample(&body, "toolledger_worker_events_total", &label),
            None,
            "{body}"
        );
    }
    let passes = sample(&body, "toolledger_worker_passes_total", "").unwrap();
    assert!(passes >= 1.0 && passes <= summary["passes"].as_f64().unwrap());
    assert_eq!(
        sample(&body, "toolledger_fencing_rejections_total", ""),
        None,
        "nothing was fenced: {body}"
    );
    // …the ledger read at a scrape…
    assert_eq!(
        sample(&body, "toolledger_operations", "state=\"succeeded\""),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(&body, "toolledger_outbox_events", "state=\"delivered\""),
        Some(1.0)
    );
    assert_eq!(
        sample(&body, "toolledger_outbox_events", "state=\"pending\""),
        Some(0.0)
    );
    // …and the store: the claim and transaction C were commits of the writer.
    let commits = sample(
        &body,
        "toolledger_store_commit_batch_size_count",
        "backend=\"sqlite\"",
    )
    .unwrap_or_else(|| panic!("no commit batch sizes: {body}"));
    assert!(commits >= 2.0, "{body}");
    assert!(sample(&body, "toolledger_store_queue_depth", "queue=\"writer\"").is_some());
    assert_eq!(d.text("SELECT state FROM operations"), "succeeded");
    assert_eq!(d.downstream_receipts(), 1);
}
