//! docs/operations.md, section 1, runs as written: its `$ ` command lines, in order, in one
//! `sh -e` on a new ledger (in a directory holding `examples/fixtures/refund-order.json`),
//! every step exiting and printing what the page shows, and the refund ending `succeeded`.

#[path = "support/doc.rs"]
mod doc;

use serde_json::Value;

#[test]
fn section_1_runs_as_written_and_settles_the_refund() {
    if !doc::require("jq") {
        return;
    }
    let section = doc::section(&doc::page("operations.md"), "## 1. ");
    let steps = doc::steps(&section);
    let verbs: Vec<String> = steps
        .iter()
        .map(|s| {
            let words: Vec<&str> = s.command.split_whitespace().collect();
            let at = words.iter().position(|w| w.ends_with("toolledger"));
            let at = at.unwrap_or_else(|| panic!("not a toolledger command: {}", s.command));
            words[at + 1].to_string()
        })
        .collect();
    // The refund is approved before it is dispatched, and settled by `resolve`.
    let first = |verb: &str| verbs.iter().position(|v| v == verb).unwrap();
    assert!(first("approve") < first("dispatch"), "{verbs:?}");
    assert!(first("dispatch") < first("resolve"), "{verbs:?}");

    let dir = tempfile::tempdir().unwrap();
    let fixtures = dir.path().join("examples/fixtures");
    std::fs::create_dir_all(&fixtures).unwrap();
    std::fs::copy(
        doc::example_fixture("refund-order.json"),
        fixtures.join("refund-order.json"),
    )
    .unwrap();
    let ran = doc::run(&steps, dir.path());
    for (step, r) in steps.iter().zip(&ran) {
        doc::check(step, r);
    }

    // Every step spoke of the one operation `dispatch` made.
    let dispatched = &ran[first("dispatch")];
    let status_ref: Value = serde_json::from_str(dispatched.stdout.trim()).unwrap();
    let status_ref = status_ref["status_ref"].as_str().unwrap().to_string();
    for r in &ran {
        for (at, _) in r.stdout.match_indices("\"op_") {
            let found = &r.stdout[at + 1..at + 1 + status_ref.len()];
            assert_eq!(found, status_ref, "{}", r.stdout);
        }
    }
    // The end state the page describes: the refund succeeded, its receipt reconciled.
    let rows = doc::ledger_rows(dir.path());
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["status_ref"], status_ref.as_str());
    assert_eq!(rows[0]["state"], "succeeded");
    assert_eq!(rows[0]["tool"], "refund_order");
}
