//! The deferred-tool adapter without a transport: one MCP call is one dispatch of the
//! runtime, replies are in-band `{status_ref, code, delivery, status, result?}`, dispatch never
//! observes an unfinished operation and the explicit status query reconciles it.

use std::collections::BTreeSet;
use std::sync::Arc;

use rmcp::model::{CallToolResponse, JsonObject, Tool};
use serde_json::{json, Value};
use toolledger::authz::PrincipalStore;
use toolledger::clock::{ManualClock, SharedClock};
use toolledger::model::{Error, Principal};
use toolledger::runtime::{CrashPoint, ProviderProfile, Registry, Runtime};
use toolledger::store::sqlite::{OpenOptions, SqliteStore};
use toolledger_mcp::{Caller, DeferredAdapter, DeferredArguments, ToolCall};
use toolledger_testkit::downstream::SqliteDownstream;
use toolledger_testkit::tools::ShipAnyParcel;

fn parse(arguments: &JsonObject) -> Result<DeferredArguments, Error> {
    let key = arguments
        .get("operation_id")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::invalid("operation_id is required"))?;
    let mut business = arguments.clone();
    business.remove("operation_id");
    Ok(DeferredArguments::new(key, Value::Object(business)))
}

struct Fixture {
    _dir: tempfile::TempDir,
    tool: DeferredAdapter,
    caller: Caller,
    rt: tokio::runtime::Runtime,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let clock: SharedClock = Arc::new(ManualClock::new(1_000_000));
    let store = SqliteStore::open(
        dir.path().join("l.sqlite"),
        OpenOptions::new("sqlite:deferred"),
    )
    .unwrap();
    let downstream = SqliteDownstream::open(dir.path().join("d.sqlite"), clock.clone()).unwrap();
    let registry = Registry::new()
        .register(Arc::new(ShipAnyParcel::strict()), Arc::new(downstream))
        .allow_profile(ProviderProfile::mcp());
    let runtime = Runtime::new(store.clone(), clock.clone(), registry);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(
        PrincipalStore::new(store)
            .with_clock(clock)
            .add("alice", "acme", &[], &[], false),
    )
    .unwrap();
    let definition = Tool::new("ship_parcel", "Ship a parcel.", Arc::new(JsonObject::new()));
    let caller = Caller {
        name: "alice".into(),
        principal: Principal {
            tenant: "acme".into(),
            subject: "alice".into(),
            roles: BTreeSet::new(),
            scopes: BTreeSet::new(),
        },
    };
    Fixture {
        _dir: dir,
        tool: DeferredAdapter::new(runtime, definition, parse),
        caller,
        rt,
    }
}

fn object(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

impl Fixture {
    fn call(&self, arguments: Value, request_state: Option<&str>) -> Value {
        let call = ToolCall {
            caller: self.caller.clone(),
            arguments: object(arguments),
            request_state: request_state.map(str::to_string),
            input_responses: None,
            meta: None,
            cancelled: None,
            multi_round: true,
            client_capabilities: None,
            peer: None,
        };
        match self.rt.block_on(self.tool.call(call)) {
            Ok(CallToolResponse::Complete(r)) => serde_json::to_value(r).unwrap(),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_call_is_delivered_once_then_replayed_and_refusals_are_in_band() {
    let f = fixture();
    let schema = f.tool.definition().output_schema.expect("an output schema");
    assert_eq!(
        schema["required"],
        json!(["status_ref", "code", "delivery", "status"])
    );

    let first = f.call(json!({"operation_id": "op-1", "parcel": "p-1"}), None);
    assert_eq!(first["isError"], false, "{first}");
    let s = &first["structuredContent"];
    assert_eq!(s["code"], "OK");
    assert_eq!(s["status"], "succeeded");
    assert_eq!(s["delivery"], "fresh");
    assert_eq!(s["result"]["parcel"], "p-1");
    let text: Value = serde_json::from_str(first["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(&text, s, "the text content is the structured reply");

    let again = f.call(json!({"operation_id": "op-1", "parcel": "p-1"}), None);
    let a = &again["structuredContent"];
    assert_eq!(a["delivery"], "local_replay");
    assert_eq!(a["status_ref"], s["status_ref"]);
    assert_eq!(a["result"], s["result"]);

    let changed = f.call(json!({"operation_id": "op-1", "parcel": "p-2"}), None);
    assert_eq!(changed["isError"], true);
    assert_eq!(
        toolledger_mcp::error_of(&changed).unwrap()["code"],
        "operation_conflict"
    );

    let bad = f.call(json!({"operation_id": "op-2", "parcel": ""}), None);
    assert_eq!(
        toolledger_mcp::error_of(&bad).unwrap()["code"],
        "invalid_arguments"
    );

    let continued = f.call(json!({"operation_id": "op-3", "parcel": "p-3"}), Some("x"));
    assert_eq!(
        toolledger_mcp::error_of(&continued).unwrap()["code"],
        "continuation_unsupported"
    );
}

#[test]
fn dispatch_never_observes_and_the_status_query_reconciles() {
    let f = fixture();
    let arguments = object(json!({"operation_id": "op-9", "parcel": "p-9"}));
    // The process "dies" after the downstream committed its receipt, before transaction C.
    let call = parse(&arguments).unwrap().into_call("alice", "ship_parcel");
    let crashed =
        f.rt.block_on(
            f.tool
                .runtime()
                .dispatch(&call, Some(CrashPoint::AfterDownstreamCommit)),
        )
        .unwrap();
    let status_ref = crashed.status_ref().to_string();

    let retried = f.call(Value::Object(arguments.clone()), None);
    // An unknown outcome is an error result naming the reference to query, never a success.
    assert_eq!(retried["isError"], true, "{retried}");
    let text: Value =
        serde_json::from_str(retried["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text["error"]["code"], "outcome_unknown", "{retried}");
    assert_eq!(text["error"]["status_ref"], json!(status_ref));
    let r = &retried["structuredContent"];
    assert_eq!(r["code"], "OUTCOME_UNKNOWN", "{retried}");
    assert_eq!(r["delivery"], Value::Null);
    assert_eq!(r["status_ref"], json!(status_ref));
    assert!(
        r.get("result").is_none(),
        "an unknown outcome has no result"
    );

    let reconciled =
        f.rt.block_on(f.tool.status(&f.caller, &arguments, &status_ref))
            .unwrap();
    assert_eq!(reconciled.code, "OK");
    assert_eq!(reconciled.delivery.as_deref(), Some("receipt_reconciled"));
    assert_eq!(reconciled.result.as_ref().unwrap()["parcel"], "p-9");

    let replayed = f.call(Value::Object(arguments), None);
    assert_eq!(replayed["structuredContent"]["delivery"], "local_replay");
}
