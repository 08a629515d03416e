//! docs/deploy.md, "Calling `/mcp` by hand with curl", runs as written: the principal and
//! its token, `serve --http`, a guarded `tools/call` with the real `curl` and its retry, in
//! one `sh -e` (the page's port swapped for a free one); the retry answers what the first call
//! answered, marked replayed, and the ledger holds one operation.

#[path = "support/doc.rs"]
mod doc;

use serde_json::Value;
use toolledger_testkit::kill::free_port;

#[test]
fn the_curl_example_calls_a_guarded_tool_and_its_retry_replays_the_answer() {
    if !doc::require("curl") || !doc::require("jq") {
        return;
    }
    let section = doc::section(
        &doc::page("deploy.md"),
        "## Calling `/mcp` by hand with curl",
    );
    let port = free_port();
    let mut swapped = 0;
    let steps: Vec<doc::Step> = doc::steps(&section)
        .into_iter()
        .map(|mut s| {
            if s.command.contains("127.0.0.1:8080") {
                swapped += 1;
                s.command = s
                    .command
                    .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"));
            }
            s
        })
        .collect();
    // The server's address and the URL.
    assert_eq!(swapped, 2, "{steps:?}");

    let dir = tempfile::tempdir().unwrap();
    let ran = doc::run(&steps, dir.path());
    for (step, r) in steps.iter().zip(&ran) {
        doc::check(step, r);
    }

    let answers: Vec<Value> = steps
        .iter()
        .zip(&ran)
        .filter(|(s, _)| s.command.starts_with("curl ") && s.command.contains("tools/call"))
        .map(|(_, r)| serde_json::from_str(r.stdout.trim()).unwrap())
        .collect();
    assert_eq!(answers.len(), 2, "a call and its retry");
    let (first, retry) = (&answers[0]["result"], &answers[1]["result"]);
    assert_eq!(first["isError"], false, "{first}");
    assert_eq!(first["structuredContent"]["replayed"], false, "{first}");
    assert_eq!(retry["structuredContent"]["replayed"], true, "{retry}");
    // The same answer, but for the replay mark.
    let unmarked = |v: &Value| {
        let mut v = v.clone();
        v["structuredContent"]["replayed"] = Value::Null;
        let mut text: Value =
            serde_json::from_str(v["content"][0]["text"].as_str().unwrap()).unwrap();
        text["replayed"] = Value::Null;
        v["content"][0]["text"] = text;
        v
    };
    assert_eq!(unmarked(first), unmarked(retry));

    // One operation, applied once.
    let rows = doc::ledger_rows(dir.path());
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["tool"], "create_automation");
    assert_eq!(rows[0]["key"], "auto-1");
    assert_eq!(rows[0]["state"], "applied");
}
