//! Where the operation id may travel through `toolledger serve`, on both backends, over HTTP
//! and stdio: the tool's own key argument (`create_automation`'s `request_id`, marked
//! `x-toolledger-key`), `_meta["io.toolledger/operation_id"]`, `params.idempotencyKey` and,
//! over HTTP, the `Idempotency-Key` header. Each names the operation alone (a retry under
//! another carrier replays it); two that disagree are `invalid_arguments` naming both and
//! nothing is recorded. The proxy's carriers are in `proxy_carriers.rs`.

#[macro_use]
mod support;
#[path = "support/raw.rs"]
mod raw;

use raw::{RawHttp, RawStdio};
use serde_json::{json, Value};
use support::wire::{add_principal, meta, Db, Ledger};

on_both_backends!(
    every_carrier_names_the_operation_over_http,
    every_carrier_names_the_operation_over_stdio,
);

/// A carrier's name, the `tools/call` params naming operation `op` by it, and its headers.
fn carried(
    carrier: &str,
    op: &'static str,
    minutes: u64,
) -> (Value, Vec<(&'static str, &'static str)>) {
    let mut params = json!({"name": "create_automation",
                            "arguments": {"interval_minutes": minutes}, "_meta": meta()});
    let mut headers = vec![];
    match carrier {
        "argument" => params["arguments"]["request_id"] = json!(op),
        "_meta" => params["_meta"]["io.toolledger/operation_id"] = json!(op),
        "params.idempotencyKey" => params["idempotencyKey"] = json!(op),
        "Idempotency-Key" => headers.push(("Idempotency-Key", op)),
        other => panic!("no carrier {other}"),
    }
    (params, headers)
}

fn request(params: &Value) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
}

fn automation(result: &Value) -> (i64, bool) {
    assert_eq!(result["isError"], false, "{result}");
    let s = &result["structuredContent"];
    (s["id"].as_i64().unwrap(), s["replayed"].as_bool().unwrap())
}

fn refusal(result: &Value) -> Value {
    assert_eq!(result["isError"], true, "{result}");
    serde_json::from_str::<Value>(result["content"][0]["text"].as_str().unwrap()).unwrap()["error"]
        .clone()
}

/// One `tools/call`: its params and headers in, the JSON-RPC answer out.
type Call<'a> = dyn FnMut(&Value, &[(&str, &str)]) -> Value + 'a;

/// Runs the carriers through `call`.
fn check_carriers(db: &Db, carriers: &[&str], call: &mut Call<'_>) {
    const OPS: [&str; 4] = ["op-a", "op-b", "op-c", "op-d"];
    let mut ids = vec![];
    for (i, carrier) in carriers.iter().enumerate() {
        let (params, headers) = carried(carrier, OPS[i], 15 + i as u64);
        let (id, replayed) = automation(&call(&params, &headers)["result"]);
        assert!(!replayed, "{carrier}: a new operation");
        assert!(!ids.contains(&id), "{carrier}: a new automation");
        ids.push(id);
        // The same operation named by every other carrier replays it.
        for other in carriers.iter().filter(|c| *c != carrier) {
            let (params, headers) = carried(other, OPS[i], 15 + i as u64);
            let again = automation(&call(&params, &headers)["result"]);
            assert_eq!(again, (id, true), "{carrier} then {other}");
        }
    }
    // Two carriers that disagree: refused, naming both; nothing recorded.
    let before = db.scalar("SELECT count(*) FROM operations");
    let (mut params, headers) = carried(carriers[1], "op-x1", 30);
    params["arguments"]["request_id"] = json!("op-x2");
    let e = refusal(&call(&params, &headers)["result"]);
    assert_eq!(e["code"], "invalid_arguments", "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("request_id"), "{message}");
    assert!(
        message.contains(carriers[1].trim_end_matches(" header")),
        "{message}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM operations"), before);
}

fn every_carrier_names_the_operation_over_http(db: Db) {
    let token = add_principal(
        &db,
        "hank",
        "acme",
        &["editor"],
        &["automation:write"],
        true,
    )
    .unwrap();
    let server = RawHttp::start(&db, &[], &[]);
    let auth = format!("Bearer {token}");
    let mut call = |params: &Value, headers: &[(&str, &str)]| {
        let mut all = vec![
            ("Authorization", auth.as_str()),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "create_automation"),
        ];
        all.extend_from_slice(headers);
        let r = server.post(&all, request(params).to_string().as_bytes());
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    check_carriers(
        &db,
        &[
            "argument",
            "_meta",
            "params.idempotencyKey",
            "Idempotency-Key",
        ],
        &mut call,
    );
}

fn every_carrier_names_the_operation_over_stdio(db: Db) {
    add_principal(
        &db,
        "hank",
        "acme",
        &["editor"],
        &["automation:write"],
        false,
    );
    let mut server = RawStdio::start(&db, "hank", &[]);
    let mut call = |params: &Value, headers: &[(&str, &str)]| {
        assert!(headers.is_empty(), "no headers on stdio");
        server.send(&request(params));
        server.recv()
    };
    check_carriers(
        &db,
        &["argument", "_meta", "params.idempotencyKey"],
        &mut call,
    );
}
