//! The automation tools over the MCP wire: `create_automation` and `set_interval`,
//! replay by request id, version conflict, scope checks, and nothing written on refusal.

#[macro_use]
mod support;

use serde_json::json;
use support::wire::*;

on_both_backends!(
    create_then_set_interval_replays_and_refuses_stale_versions,
    without_automation_write_scope_nothing_is_written,
    a_lost_set_interval_reply_is_recovered_by_the_same_request_id,
    a_stdio_server_serves_its_metrics_on_the_metrics_address,
    the_metrics_address_may_come_from_the_environment,
);

fn create_then_set_interval_replays_and_refuses_stale_versions(db: Db) {
    let mut s = Server::start(&db, "alice", &["--clock-epoch", "1800000000"]);
    let created = s.call(
        "create_automation",
        json!({"request_id": "req-c1", "interval_minutes": 30}),
    );
    assert_eq!(created["isError"], false, "{created}");
    let c = created["structuredContent"].clone();
    assert_eq!(c["interval_minutes"], 30);
    assert_eq!(c["version"], 1);
    assert_eq!(c["replayed"], false);
    let id = c["id"].as_i64().unwrap();

    let set = json!({"request_id": "req-s1", "automation_id": id, "expected_version": 1,
                     "interval_minutes": 60});
    let first = s.call("set_interval", set.clone());
    assert_eq!(
        first["structuredContent"],
        json!({"id": id, "interval_minutes": 60, "version": 2, "replayed": false})
    );
    let again = s.call("set_interval", set);
    assert_eq!(
        again["structuredContent"],
        json!({"id": id, "interval_minutes": 60, "version": 2, "replayed": true})
    );
    let stale = s.call(
        "set_interval",
        json!({"request_id": "req-s2", "automation_id": id, "expected_version": 1,
               "interval_minutes": 90}),
    );
    assert_eq!(error_code(&stale), "version_conflict");
    let reuse = s.call(
        "set_interval",
        json!({"request_id": "req-s1", "automation_id": id, "expected_version": 2,
               "interval_minutes": 90}),
    );
    assert_eq!(error_code(&reuse), "operation_conflict");
    for bad in [
        json!({"request_id": "bad id!", "automation_id": id, "expected_version": 2,
               "interval_minutes": 90}),
        json!({"request_id": "r", "automation_id": id, "expected_version": 2,
               "interval_minutes": 4}),
        json!({"request_id": "r", "automation_id": true, "expected_version": 2,
               "interval_minutes": 90}),
    ] {
        assert_eq!(
            error_code(&s.call("set_interval", bad)),
            "invalid_arguments"
        );
    }
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "automations"), 1);
    assert_eq!(count(&db, "operations"), 2);
    assert_eq!(
        scalar(
            &db,
            &format!("SELECT interval_minutes FROM automations WHERE id = {id}")
        ),
        60
    );
}

fn without_automation_write_scope_nothing_is_written(db: Db) {
    add_principal(&db, "dave", "acme", &["editor"], &[], false);
    let mut s = Server::start(&db, "dave", &[]);
    let r = s.call(
        "create_automation",
        json!({"request_id": "req-d", "interval_minutes": 30}),
    );
    assert_eq!(error_code(&r), "permission_denied");
    assert_eq!(s.finish(), 0);
    assert_eq!(count(&db, "automations"), 0);
    assert_eq!(count(&db, "operations"), 0);
}

fn a_lost_set_interval_reply_is_recovered_by_the_same_request_id(db: Db) {
    let mut s = Server::start(&db, "alice", &[]);
    let id = s.call(
        "create_automation",
        json!({"request_id": "req-c", "interval_minutes": 30}),
    )["structuredContent"]["id"]
        .as_i64()
        .unwrap();
    assert_eq!(s.finish(), 0);
    let set = json!({"request_id": "req-lost", "automation_id": id, "expected_version": 1,
                     "interval_minutes": 45});
    let mut s = Server::start(&db, "alice", &["--fault", "drop-after-commit"]);
    s.send(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "set_interval", "arguments": set, "_meta": meta()}}),
    );
    assert_eq!(s.try_recv(), None);
    assert_eq!(s.wait_exit(), 70);
    let mut s = Server::start(&db, "alice", &[]);
    // After the lost reply, the status tool knows both automation operations.
    for (op, tool) in [("req-c", "create_automation"), ("req-lost", "set_interval")] {
        let st = s.status(op);
        assert_eq!(st["state"], "applied", "{st}");
        assert_eq!(st["authoritative"], true);
        assert_eq!(st["tool"], tool);
        assert_eq!(st["ledgerState"], "applied");
    }
    assert_eq!(s.status("req-lost")["storedResult"]["version"], 2);
    let replay = s.call("set_interval", set);
    assert_eq!(
        replay["structuredContent"],
        json!({"id": id, "interval_minutes": 45, "version": 2, "replayed": true})
    );
    assert_eq!(s.finish(), 0);
    assert_eq!(
        scalar(
            &db,
            &format!("SELECT version FROM automations WHERE id = {id}")
        ),
        2
    );
}

/// `GET /metrics` on `addr`; the body.
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    raw.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// A free port: bound and released here, then named to a server.
fn free_addr() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string()
}

fn the_metrics_address_may_come_from_the_environment(db: Db) {
    let addr = free_addr();
    let mut s = Server::start_with_env(&db, "alice", &[], &[("TOOLLEDGER_METRICS", &addr)]);
    let created = s.call(
        "create_automation",
        json!({"request_id": "req-e", "interval_minutes": 30}),
    );
    assert_eq!(created["isError"], false, "{created}");
    let body = scrape(&addr);
    assert!(
        body.lines()
            .any(|l| l.starts_with("toolledger_tool_calls_total{")
                && l.contains("outcome=\"fresh\"")
                && l.ends_with(" 1")),
        "{body}"
    );
    assert_eq!(s.finish(), 0);
}

fn a_stdio_server_serves_its_metrics_on_the_metrics_address(db: Db) {
    let addr = free_addr();
    let mut s = Server::start(&db, "alice", &["--metrics", &addr]);
    let created = s.call(
        "create_automation",
        json!({"request_id": "req-m", "interval_minutes": 30}),
    );
    assert_eq!(created["isError"], false, "{created}");
    let body = scrape(&addr);
    let fresh = body
        .lines()
        .find(|l| {
            l.starts_with("toolledger_tool_calls_total{")
                && l.contains("tool=\"create_automation\"")
                && l.contains("outcome=\"fresh\"")
        })
        .unwrap_or_else(|| panic!("no call counter: {body}"));
    assert!(fresh.ends_with(" 1"), "{fresh}");
    assert!(
        body.contains("toolledger_operations{state=\"applied\"} 1"),
        "{body}"
    );
    // The store's own series: the queues' depth as last seen (nothing waits once the call was
    // answered and the scrape read its gauges), and the sizes of the commits' batches (the
    // fresh call's commit among them).
    let (backend, queues): (&str, &[&str]) = if db.is_postgres() {
        ("postgres", &["jobs", "inline_batch"])
    } else {
        ("sqlite", &["writer", "reader"])
    };
    let value = |line: &str| -> f64 { line.rsplit(' ').next().unwrap().parse().unwrap() };
    for queue in queues {
        let depth = body
            .lines()
            .find(|l| {
                l.starts_with("toolledger_store_queue_depth{")
                    && l.contains(&format!("backend=\"{backend}\""))
                    && l.contains(&format!("queue=\"{queue}\""))
            })
            .unwrap_or_else(|| panic!("no {queue} queue depth: {body}"));
        assert!((0.0..=64.0).contains(&value(depth)), "{depth}");
    }
    let series = |suffix: &str| {
        body.lines()
            .find(|l| {
                l.starts_with(&format!("toolledger_store_commit_batch_size{suffix}{{"))
                    && l.contains(&format!("backend=\"{backend}\""))
            })
            .map(value)
            .unwrap_or_else(|| panic!("no commit batch size{suffix}: {body}"))
    };
    let (batches, jobs) = (series("_count"), series("_sum"));
    assert!(batches >= 1.0, "{body}");
    // Every batch holds at least one job and at most the writer's limit.
    assert!(jobs >= batches && jobs <= batches * 128.0, "{body}");
    assert_eq!(s.finish(), 0);
}
