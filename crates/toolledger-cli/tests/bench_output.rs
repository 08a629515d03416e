//! `toolledger bench` prints one well-formed JSON line per workload and concurrency, every
//! operation ends as the workload expects, and bad options are refused with a stable code.
//! Correctness only: no figure is asserted.

mod support;

use std::collections::BTreeSet;

use serde_json::Value;

fn bench(args: &[&str]) -> std::process::Output {
    support::toolledger()
        .arg("bench")
        .args(args)
        .output()
        .expect("run toolledger bench")
}

#[test]
fn every_workload_prints_a_complete_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(&["--ops", "200", "--db-dir", dir.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "no progress bar when stderr is not a terminal"
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut seen = BTreeSet::new();
    let mut ceiling = None;
    for line in stdout.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let workload = v["workload"].as_str().unwrap().to_string();
        let concurrency = v["concurrency"].as_u64().unwrap();
        assert_eq!(v["backend"], "sqlite", "{line}");
        assert_eq!(v["ops"], 200, "{line}");
        assert_eq!(v["succeeded"], 200, "{line}");
        assert_eq!(v["failed"], 0, "{line}");
        assert_eq!(v["synchronous"], "full", "{line}");
        let seconds = v["seconds"].as_f64().unwrap();
        let rate = v["ops_per_sec"].as_f64().unwrap();
        assert!(seconds > 0.0 && rate > 0.0, "{line}");
        let (p50, p99) = (v["p50_us"].as_u64().unwrap(), v["p99_us"].as_u64().unwrap());
        assert!(p50 <= p99, "{line}");
        assert!(v["peak_rss_mb"].as_f64().unwrap() > 0.0, "{line}");
        let ratio = v["ratio_to_ceiling"].as_f64().unwrap();
        if workload == "ceiling" {
            assert_eq!(concurrency, 1);
            assert_eq!(ratio, 1.0);
            ceiling = Some(rate);
        } else {
            let base = ceiling.expect("the ceiling line comes first");
            assert!((ratio - rate / base).abs() < 0.01 + ratio * 0.01, "{line}");
        }
        assert!(
            seen.insert((workload, concurrency)),
            "duplicate line {line}"
        );
    }
    let expected: BTreeSet<(String, u64)> = [
        ("ceiling", 1),
        ("fresh", 1),
        ("fresh", 64),
        ("replay", 1),
        ("replay", 64),
        ("conflict", 1),
        ("conflict", 64),
        ("mcp-stdio-fresh", 1),
        ("mcp-stdio-fresh", 64),
        ("mcp-stdio-replay", 1),
        ("mcp-stdio-replay", 64),
        ("mcp-http-fresh", 1),
        ("mcp-http-fresh", 64),
        ("mcp-http-replay", 1),
        ("mcp-http-replay", 64),
        ("outbox-drain", 1),
        ("outbox-drain", 64),
    ]
    .into_iter()
    .map(|(w, c)| (w.to_string(), c))
    .collect();
    assert_eq!(expected, seen);
    // The benchmark's databases live in a temporary directory inside --db-dir and are removed.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn selected_workloads_and_concurrency_only() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(&[
        "--workload",
        "replay",
        "--concurrency",
        "3",
        "--ops",
        "50",
        "--db-dir",
        dir.path().to_str().unwrap(),
    ]);
    let lines = support::json_lines(out);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["workload"], "replay");
    assert_eq!(lines[0]["concurrency"], 3);
    assert_eq!(lines[0]["succeeded"], 50);
    assert!(lines[0].get("ratio_to_ceiling").is_none(), "no ceiling ran");
}

#[test]
fn synchronous_normal_is_opt_in_and_reported_on_every_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(&[
        "--workload",
        "ceiling",
        "--workload",
        "fresh",
        "--workload",
        "mcp-stdio",
        "--concurrency",
        "4",
        "--ops",
        "40",
        "--sqlite-synchronous",
        "normal",
        "--db-dir",
        dir.path().to_str().unwrap(),
    ]);
    let lines = support::json_lines(out);
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l["workload"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["ceiling", "fresh", "mcp-stdio-fresh", "mcp-stdio-replay"]
    );
    for line in &lines {
        assert_eq!(line["synchronous"], "normal", "{line}");
        assert_eq!(line["failed"], 0, "{line}");
        assert_eq!(line["succeeded"], line["ops"], "{line}");
    }
}

#[test]
fn operations_list_prints_a_line_without_and_one_with_a_state_filter() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(&[
        "--workload",
        "operations-list",
        "--list-rows",
        "2500",
        "--concurrency",
        "4",
        "--ops",
        "40",
        "--db-dir",
        dir.path().to_str().unwrap(),
    ]);
    let lines = support::json_lines(out);
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l["workload"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["operations-list", "operations-list-state"]);
    for l in &lines {
        assert_eq!(l["backend"], "sqlite", "{l}");
        assert_eq!(l["concurrency"], 4, "{l}");
        assert_eq!(l["rows"], 2500, "{l}");
        assert_eq!(l["ops"], 40, "{l}");
        // Every read returned the page the seed implies: the newest 100, and the two
        // operations (one in a thousand) left in progress.
        assert_eq!(l["succeeded"], 40, "{l}");
        assert_eq!(l["failed"], 0, "{l}");
        let (p50, p99) = (l["p50_us"].as_u64().unwrap(), l["p99_us"].as_u64().unwrap());
        assert!(p50 <= p99, "{l}");
        assert!(l.get("ratio_to_ceiling").is_none(), "no ceiling ran");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn console_list_prints_one_line_of_pages_that_listed_the_stuck_operations() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(&[
        "--workload",
        "console-list",
        "--list-rows",
        "2500",
        "--concurrency",
        "4",
        "--ops",
        "40",
        "--db-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let l = &lines[0];
    assert_eq!(l["workload"], "console-list", "{l}");
    assert_eq!(l["backend"], "sqlite", "{l}");
    assert_eq!(l["concurrency"], 4, "{l}");
    assert_eq!(l["rows"], 2500, "{l}");
    assert_eq!(l["ops"], 40, "{l}");
    // Every page answered 200 with the two operations (one in a thousand) left in progress,
    // listed as stuck.
    assert_eq!(l["succeeded"], 40, "{l}");
    assert_eq!(l["failed"], 0, "{l}");
    let (p50, p99) = (l["p50_us"].as_u64().unwrap(), l["p99_us"].as_u64().unwrap());
    assert!(p50 <= p99, "{l}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn the_proxy_workload_prints_direct_and_proxied_lines_and_what_the_proxy_adds() {
    check_proxy_lines(&[], "sqlite");
}

/// The same on PostgreSQL: the proxy's ledgers in schemas of their own, its SQLite-only
/// figures (commits, the ledger's file growth, bytes written) absent.
#[test]
fn the_proxy_workload_runs_the_proxy_on_postgresql_too() {
    let Some(url) = toolledger_testkit::db::test_database_url() else {
        return;
    };
    check_proxy_lines(
        &["--backend", "postgres", "--database-url", &url],
        "postgres",
    );
}

/// Runs the proxy workload at 1 and 4 in flight with `extra` and checks its lines.
fn check_proxy_lines(extra: &[&str], backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--workload",
        "proxy",
        "--concurrency",
        "1",
        "--concurrency",
        "4",
        "--ops",
        "30",
        "--db-dir",
        dir.path().to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = bench(&args);
    let lines = support::json_lines(out);
    let sqlite = backend == "sqlite";
    let names: Vec<(&str, u64)> = lines
        .iter()
        .map(|l| {
            (
                l["workload"].as_str().unwrap(),
                l["concurrency"].as_u64().unwrap(),
            )
        })
        .collect();
    let level = |c| {
        [
            ("proxy-direct-fresh", c),
            ("proxy-fresh-unguarded", c),
            ("proxy-fresh", c),
            ("proxy-direct-lookup", c),
            ("proxy-replay", c),
        ]
    };
    assert_eq!(names, [level(1), level(4)].concat());
    for l in &lines {
        assert_eq!(l["backend"], backend, "{l}");
        assert_eq!(l["ops"], 30, "{l}");
        // Every fresh call charged once, every replay came from the ledger, every lookup
        // found its charge.
        assert_eq!(l["succeeded"], 30, "{l}");
        assert_eq!(l["failed"], 0, "{l}");
        let (p50, p99) = (l["p50_us"].as_u64().unwrap(), l["p99_us"].as_u64().unwrap());
        assert!(p50 <= p99, "{l}");
        assert!(l["ops_per_sec"].as_f64().unwrap() > 0.0, "{l}");
        assert!(l["server_peak_rss_mb"].as_f64().unwrap() > 0.0, "{l}");
        assert!(l["server_cpu_us_per_op"].is_number(), "{l}");
        let workload = l["workload"].as_str().unwrap();
        // Fresh calls write to storage (the proxy's ledger, the upstream's charges); the
        // fresh proxied lines say how much the ledger grew per call. On PostgreSQL the
        // proxy's writes are the server's: none of that is the proxy's to report.
        let proxied_fresh = matches!(workload, "proxy-fresh" | "proxy-fresh-unguarded");
        if workload == "proxy-direct-fresh" || (sqlite && proxied_fresh) {
            assert!(
                l["server_write_bytes_per_op"].as_f64().unwrap() > 0.0,
                "{l}"
            );
        }
        if !sqlite && proxied_fresh {
            for field in ["server_write_bytes_per_op", "commits_per_op"] {
                assert!(l.get(field).is_none(), "{field} on PostgreSQL: {l}");
            }
        }
        match workload {
            "proxy-fresh" | "proxy-fresh-unguarded" if !sqlite => {
                // The schema's tables grew by each call's rows.
                assert!(l["ledger_bytes_per_op"].as_f64().unwrap() > 0.0, "{l}");
            }
            "proxy-fresh" | "proxy-fresh-unguarded" => {
                assert!(l["ledger_bytes_per_op"].as_f64().unwrap() > 0.0, "{l}");
                // Each fresh call commits at least once (intent before the forward).
                assert!(l["commits_per_op"].as_f64().unwrap() > 0.0, "{l}");
                assert!(l["mean_batch"].as_f64().unwrap() >= 1.0, "{l}");
            }
            _ => assert!(l.get("ledger_bytes_per_op").is_none(), "{l}"),
        }
        let baseline = match workload {
            "proxy-fresh" | "proxy-fresh-unguarded" => Some("proxy-direct-fresh"),
            "proxy-replay" => Some("proxy-direct-lookup"),
            _ => None,
        };
        match baseline {
            Some(b) => {
                assert_eq!(l["baseline"], b, "{l}");
                assert!(l["added_p50_us"].is_i64(), "{l}");
                assert!(l["added_p99_us"].is_i64(), "{l}");
                assert!(l["throughput_ratio"].as_f64().unwrap() > 0.0, "{l}");
                assert!(l["upstream_cpu_us_per_op"].is_number(), "{l}");
            }
            None => {
                for field in [
                    "baseline",
                    "added_p50_us",
                    "added_p99_us",
                    "throughput_ratio",
                ] {
                    assert!(l.get(field).is_none(), "{field} on a direct line: {l}");
                }
            }
        }
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Checks one `overload` line: every call answered, nothing acknowledged lost, no effect of
/// a refused call, normal service right after.
fn check_overload_line(stdout: &str, workload: &str, backend: &str) -> Value {
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let v: Value = serde_json::from_str(lines[0]).unwrap();
    let line = lines[0];
    assert_eq!(v["workload"], workload, "{line}");
    assert_eq!(v["backend"], backend, "{line}");
    let process = if workload == "overload" {
        "bench"
    } else {
        "server"
    };
    assert_eq!(v["process"], process, "{line}");
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {line}"));
    let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}: {line}"));
    assert!(n("calls") > 0, "{line}");
    assert_eq!(
        n("applied") + n("unavailable") + n("other_errors") + n("unanswered"),
        n("calls"),
        "{line}"
    );
    assert_eq!(n("unanswered"), 0, "every call answered: {line}");
    assert_eq!(n("other_errors"), 0, "a result or unavailable: {line}");
    assert_eq!(n("acknowledged_lost"), 0, "{line}");
    assert_eq!(v["extra_effects"], 0, "{line}");
    assert_eq!(n("after_failed"), 0, "normal service right after: {line}");
    assert_eq!(n("queue_depth"), 1024, "{line}");
    assert_eq!(n("queue_wait_ms"), 5000, "{line}");
    for k in [
        "capacity_ops_per_sec",
        "target_ops_per_sec",
        "offered_ops_per_sec",
        "seconds",
        "after_ops_per_sec",
        "rss_before_mb",
    ] {
        assert!(f(k) > 0.0, "{k}: {line}");
    }
    assert!(f("peak_rss_mb") >= f("rss_before_mb"), "{line}");
    assert!(f("rss_after_mb") > 0.0, "{line}");
    let by_second = v["rss_by_second_mb"].as_array().unwrap();
    assert!(
        by_second
            .iter()
            .all(|m| m.as_f64().is_some_and(|m| m > 0.0 && m <= f("peak_rss_mb"))),
        "{line}"
    );
    assert!(n("shed") <= n("unavailable"), "{line}");
    assert!(
        (f("target_ops_per_sec") / f("capacity_ops_per_sec") - 3.0).abs() < 0.05,
        "the factor: {line}"
    );
    v
}

const OVERLOAD: &[&str] = &[
    "--workload",
    "overload",
    "--ops",
    "300",
    "--overload-seconds",
    "1",
    "--overload-factor",
    "3",
    "--overload-callers",
    "64",
];

/// Runs `bench` with `args` on SQLite, and on PostgreSQL when the test database is set; each
/// line checked by [`check_overload_line`] as `workload`, returned.
fn overload_lines(args: &[&str], workload: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = ["--db-dir", dir.path().to_str().unwrap()];
    let url = toolledger_testkit::db::test_database_url();
    let postgres = url
        .as_deref()
        .map(|url| ["--backend", "postgres", "--database-url", url]);
    let mut lines = Vec::new();
    for (backend, extra) in [
        ("sqlite", Some(&sqlite[..])),
        ("postgres", postgres.as_ref().map(|p| &p[..])),
    ] {
        let Some(extra) = extra else { continue };
        let mut all = args.to_vec();
        all.extend_from_slice(extra);
        let out = bench(&all);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        lines.push(check_overload_line(
            &String::from_utf8(out.stdout).unwrap(),
            workload,
            backend,
        ));
    }
    lines
}

#[test]
fn the_overload_workload_answers_every_call_and_loses_nothing() {
    for v in overload_lines(OVERLOAD, "overload") {
        assert_eq!(
            v["shed"], 0,
            "no HTTP server, nothing shed at its door: {v}"
        );
    }
}

/// `overload-http`: a `serve --http` child with a small in-flight limit, more callers than
/// it lets in; every call answered, nothing lost, the server's memory reported.
#[test]
fn the_overload_http_workload_answers_every_call_and_reports_the_servers_memory() {
    let mut args = OVERLOAD.to_vec();
    args[1] = "overload-http";
    args.extend(["--max-in-flight", "8", "--concurrency", "4"]);
    for v in overload_lines(&args, "overload-http") {
        assert_eq!(v["max_in_flight"], 8, "{v}");
        assert_eq!(v["callers"], 64, "{v}");
    }
}

#[test]
fn the_retention_soak_prints_a_pruner_off_and_a_pruner_on_line_with_samples() {
    let dir = tempfile::tempdir().unwrap();
    let db_dir = ["--db-dir", dir.path().to_str().unwrap()];
    let out = bench(&[support::SOAK_ARGS, &db_dir].concat());
    let lines = support::json_lines(out);
    support::check_soak_lines(&lines, "sqlite", 400);
    assert!(lines[0]["samples"][1]["file_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn bad_options_are_refused_with_a_stable_code() {
    for (args, code) in [
        (&["--backend", "postgres"][..], "BACKEND_UNAVAILABLE"),
        (&["--ops", "0"][..], "INVALID_ARGUMENTS"),
        (&["--list-rows", "0"][..], "INVALID_ARGUMENTS"),
        (
            &[
                "--backend",
                "postgres",
                "--database-url",
                "postgres://u@127.0.0.1:1/db",
                "--workload",
                "operations-list",
            ][..],
            "WORKLOAD_UNAVAILABLE",
        ),
        (
            &[
                "--backend",
                "postgres",
                "--database-url",
                "postgres://u@127.0.0.1:1/db",
                "--workload",
                "outbox-drain",
            ][..],
            "WORKLOAD_UNAVAILABLE",
        ),
        (
            &[
                "--backend",
                "postgres",
                "--database-url",
                "postgres://u@127.0.0.1:1/db",
                "--workload",
                "console-list",
            ][..],
            "WORKLOAD_UNAVAILABLE",
        ),
        (&["--concurrency", "0"][..], "INVALID_ARGUMENTS"),
        (&["--overload-seconds", "0"][..], "INVALID_ARGUMENTS"),
        (&["--overload-factor", "0"][..], "INVALID_ARGUMENTS"),
        (&["--overload-factor", "NaN"][..], "INVALID_ARGUMENTS"),
        (&["--overload-callers", "0"][..], "INVALID_ARGUMENTS"),
        (&["--max-in-flight", "0"][..], "INVALID_ARGUMENTS"),
        (&["--soak-periods", "0"][..], "INVALID_ARGUMENTS"),
        (&["--soak-samples", "0"][..], "INVALID_ARGUMENTS"),
        (&["--soak-rounds", "0"][..], "INVALID_ARGUMENTS"),
        (&["--soak-rounds", "21"][..], "INVALID_ARGUMENTS"),
        (&["--soak-prune-interval", "0"][..], "INVALID_ARGUMENTS"),
        (
            &[
                "--backend",
                "postgres",
                "--database-url",
                "postgres://u@127.0.0.1:1/db",
                "--ack-db",
                "/nonexistent/x.sqlite",
            ][..],
            "INVALID_ARGUMENTS",
        ),
        (
            &[
                "--backend",
                "postgres",
                "--database-url",
                "postgres://u@127.0.0.1:1/db",
                "--ack-schema",
                "Bad;Name",
            ][..],
            "INVALID_ARGUMENTS",
        ),
        (&["--ack-schema", "tl_x"][..], "INVALID_ARGUMENTS"),
        (
            &[
                "--backend",
                "postgres",
                "--database-url",
                "postgres://u@127.0.0.1:1/db",
                "--sqlite-synchronous",
                "normal",
            ][..],
            "INVALID_ARGUMENTS",
        ),
    ] {
        let out = bench(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty());
        let err: Value = serde_json::from_slice(&out.stderr).unwrap();
        assert_eq!(err["error"]["code"], code, "{args:?}");
    }
}

/// `overload-stdio`: against `serve` and `proxy`, a client that never reads is soon blocked
/// (the server stopped reading requests while its answers waited), and once it reads again
/// every request it wrote is answered.
#[test]
fn a_client_that_never_reads_is_held_back_and_then_answered() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(&[
        "--workload",
        "overload-stdio",
        "--overload-seconds",
        "3",
        "--db-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let servers: Vec<&str> = lines
        .iter()
        .map(|v| v["server"].as_str().unwrap())
        .collect();
    assert_eq!(servers, ["serve", "proxy"], "{stdout}");
    for v in &lines {
        assert_eq!(v["workload"], "overload-stdio", "{v}");
        let written = v["requests_written"].as_u64().unwrap();
        assert!(written > 0, "{v}");
        assert_eq!(v["writes_blocked_at_end"], true, "back-pressure: {v}");
        assert_eq!(v["answered"], written, "{v}");
        assert_eq!(v["lost"], 0, "{v}");
        assert!(v["server_peak_rss_mb"].as_f64().unwrap() > 0.0, "{v}");
        assert!(
            !v["server_rss_mb_per_second"].as_array().unwrap().is_empty(),
            "{v}"
        );
    }
}

#[test]
fn the_python_sdk_baseline_prints_a_fresh_and_a_replay_line() {
    let Some(python) = support::clients::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = support::toolledger()
        .arg("bench")
        .args([
            "--workload",
            "python-sdk",
            "--concurrency",
            "4",
            "--ops",
            "40",
        ])
        .arg("--db-dir")
        .arg(dir.path())
        .arg("--python")
        .arg(python)
        .output()
        .unwrap();
    let lines = support::json_lines(out);
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l["workload"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["python-sdk-fresh", "python-sdk-replay"]);
    for l in &lines {
        // Every fresh call inserted its row, every replay found the stored one.
        assert_eq!(
            (l["succeeded"].as_u64(), l["failed"].as_u64()),
            (Some(40), Some(0)),
            "{l}"
        );
        assert!(l["server_cpu_us_per_op"].is_number(), "{l}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
