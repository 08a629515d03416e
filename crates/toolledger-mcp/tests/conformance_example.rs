//! The official MCP conformance suite against examples/conformance_server.rs, in-process over
//! streamable HTTP behind a header-adding proxy (the suite sends no bearer token): the
//! scenarios whose fixture tools the example guards (`tools-list`, `tools-call-simple-text`,
//! `tools-call-error`, every `input-required-result-*` at 2026-07-28; the single-round ones at
//! 2025-11-25), judged against the `example` section of tests/conformance/baseline.json.
//!
//! Afterwards the ledger is read: every committed operation is one ledger row with exactly the
//! one `fixture_effects` row it names, and the operations the suite completes are there, once
//! each — the error fixture and the refused continuations wrote nothing. Without Node
//! (`TOOLLEDGER_NODE`) the tests skip loudly; in CI (`TOOLLEDGER_CI`) they fail instead.

#[allow(dead_code)]
#[path = "../examples/conformance_server.rs"]
mod example;
#[path = "../../../tests/conformance/harness.rs"]
mod harness;

use std::collections::BTreeMap;

use toolledger::effect::{EffectTx, RowExt};
use toolledger_mcp::LedgerGuard;

/// The scenarios run at 2026-07-28 (the input-required ones exist only there).
const SCENARIOS_2026: &[&str] = &[
    "tools-list",
    "tools-call-simple-text",
    "tools-call-error",
    "input-required-result-basic-elicitation",
    "input-required-result-basic-sampling",
    "input-required-result-basic-list-roots",
    "input-required-result-request-state",
    "input-required-result-multiple-input-requests",
    "input-required-result-multi-round",
    "input-required-result-missing-input-response",
    "input-required-result-non-tool-request",
    "input-required-result-result-type",
    "input-required-result-unsupported-methods",
    "input-required-result-tampered-state",
    "input-required-result-capability-check",
    "input-required-result-ignore-extra-params",
    "input-required-result-validate-input",
];

/// The scenarios run at 2025-11-25 (initialize lifecycle: no input_required).
const SCENARIOS_2025: &[&str] = &["tools-list", "tools-call-simple-text", "tools-call-error"];

/// Per tool: (ledger rows, effect rows, ledger rows whose effectId names one of its effect rows).
async fn rows_per_tool(ledger: &LedgerGuard) -> BTreeMap<String, (i64, i64, i64)> {
    let sql = "SELECT t.tool,
            (SELECT count(*) FROM operations o WHERE o.tool = t.tool),
            (SELECT count(*) FROM fixture_effects e WHERE e.tool = t.tool),
            (SELECT count(*) FROM operations o JOIN fixture_effects e
                ON e.tool = o.tool AND e.author = o.subject
               AND e.id = CAST(json_extract(o.result, '$.effectId') AS INTEGER)
              WHERE o.tool = t.tool AND o.state = 'applied')
        FROM (SELECT tool FROM operations UNION SELECT tool FROM fixture_effects) t";
    ledger
        .store()
        .read(move |tx: &mut dyn EffectTx| {
            let rows = tx.query(sql, &[])?;
            rows.iter()
                .map(|r| Ok((r.text(0)?, (r.int(1)?, r.int(2)?, r.int(3)?))))
                .collect::<Result<BTreeMap<_, _>, toolledger::Error>>()
        })
        .await
        .unwrap()
}

/// Serves the example, runs `scenarios` at `revision`, checks the ledger holds `completed`
/// operations (tool → count) and nothing else, then judges the suite's verdicts.
async fn example_meets(
    revision: &str,
    scenarios: &'static [&'static str],
    completed: &[(&str, i64)],
) {
    let Some(suite) = harness::Suite::find() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("conformance.sqlite").display().to_string();
    let (ledger, app) = example::open(&db).await.unwrap();
    let token = ledger
        .principals()
        .add(example::PRINCIPAL, "conformance", &[], &[], true)
        .await
        .unwrap()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let proxy = harness::bearer_proxy(addr, token).await;
    let url = format!("http://{proxy}/mcp");
    let revision_owned = revision.to_string();
    let results = tokio::task::spawn_blocking(move || {
        suite.run_scenarios(&url, &revision_owned, scenarios, "example")
    })
    .await
    .unwrap();

    let rows = rows_per_tool(&ledger).await;
    let expected: BTreeMap<String, (i64, i64, i64)> = completed
        .iter()
        .map(|(tool, n)| (tool.to_string(), (*n, *n, *n)))
        .collect();
    assert_eq!(
        rows, expected,
        "per tool: (ledger rows, effect rows, ledger rows naming their effect row)"
    );
    harness::judge("example", revision, &results);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_fails_no_2026_07_28_scenario_outside_its_baseline_and_commits_once_each() {
    let completed = [
        ("test_simple_text", 1),
        ("test_input_required_result_elicitation", 1),
        ("test_input_required_result_sampling", 1),
        ("test_input_required_result_list_roots", 1),
        ("test_input_required_result_request_state", 1),
        ("test_input_required_result_multiple_inputs", 1),
        ("test_input_required_result_multi_round", 1),
    ];
    example_meets("2026-07-28", SCENARIOS_2026, &completed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_fails_no_2025_11_25_scenario_outside_its_baseline_and_commits_once_each() {
    example_meets("2025-11-25", SCENARIOS_2025, &[("test_simple_text", 1)]).await;
}
