//! Strict fixtures through the binary: every rejected class exits 2 with its stable, path-free
//! code on stderr, prints nothing on stdout and touches no database.

mod support;

use support::runtime::*;

fn refused(name: &str, bytes: &[u8], expected: &str) {
    let d = Db::new();
    let path = d.dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    for cmd in ["dispatch", "status", "approve"] {
        let extra: Vec<&str> = match cmd {
            "dispatch" => vec!["--fixture", path.to_str().unwrap()],
            "status" => vec!["--fixture", path.to_str().unwrap(), "--status-ref", "op_x"],
            _ => vec!["--fixture", path.to_str().unwrap(), "--approver", "bob"],
        };
        let r = d.run(cmd, &extra);
        assert_eq!(r.code, 2, "{name} {cmd}: {}", r.stdout);
        assert_eq!(r.stdout, "", "{name} {cmd}");
        let error: serde_json::Value = serde_json::from_str(r.stderr.trim()).unwrap();
        assert_eq!(error["error"]["code"], expected, "{name} {cmd}");
        assert!(
            error["error"]["message"].is_string(),
            "{name} {cmd}: a hint"
        );
        assert!(!r.stderr.contains(d.dir.path().to_str().unwrap()));
        assert!(!d.db.exists(), "{name} {cmd}: no database is created");
    }
}

fn good() -> String {
    std::fs::read_to_string(example("refund-order.json")).unwrap()
}

#[test]
fn duplicate_keys_are_refused() {
    let text = good().replacen("\"now\"", "\"now\": 1, \"now\"", 1);
    refused("dup.json", text.as_bytes(), "FIXTURE_DUPLICATE_KEY");
    let nested = good().replacen("\"call_id\"", "\"call_id\": \"x\", \"call_id\"", 1);
    refused("dup2.json", nested.as_bytes(), "FIXTURE_DUPLICATE_KEY");
}

#[test]
fn nan_and_infinity_are_refused() {
    let nan = good().replace("\"amount_cents\": 1250", "\"amount_cents\": NaN");
    refused("nan.json", nan.as_bytes(), "FIXTURE_NON_FINITE");
    let inf = good().replace("\"now\": 1767225600", "\"now\": -Infinity");
    refused("inf.json", inf.as_bytes(), "FIXTURE_NON_FINITE");
}

#[test]
fn non_utf8_is_refused() {
    let mut bytes = good().into_bytes();
    let at = bytes.iter().position(|b| *b == b'a').unwrap();
    bytes[at] = 0xfe;
    refused("latin.json", &bytes, "FIXTURE_NOT_UTF8");
}

#[test]
fn oversize_is_refused() {
    let text = good().replacen(
        "\"description\": \"",
        &format!("\"description\": \"{}", "x".repeat(65_536)),
        1,
    );
    refused("big.json", text.as_bytes(), "FIXTURE_TOO_LARGE");
}

#[test]
fn deep_nesting_under_the_size_limit_is_a_clean_error() {
    let deep = format!("{{\"format\": {}{}}}", "[".repeat(4096), "]".repeat(4096));
    assert!(deep.len() < 65_536);
    refused("deep.json", deep.as_bytes(), "FIXTURE_TOO_DEEP");
}

#[test]
fn unknown_fields_are_refused_at_every_level() {
    let top = good().replacen("\"tool\"", "\"retries\": 3, \"tool\"", 1);
    refused("top.json", top.as_bytes(), "FIXTURE_CONTRACT_ERROR");
    let provider = good().replacen("\"call_id\"", "\"model\": \"x\", \"call_id\"", 1);
    refused(
        "provider.json",
        provider.as_bytes(),
        "FIXTURE_CONTRACT_ERROR",
    );
    let order = good().replacen(
        "\"refundable\": true",
        "\"refundable\": true, \"vip\": true",
        1,
    );
    refused("order.json", order.as_bytes(), "FIXTURE_CONTRACT_ERROR");
}

#[test]
fn an_unregistered_provider_profile_is_refused() {
    let text = good().replace(
        "\"adapter_revision\": \"2026-07-01\"",
        "\"adapter_revision\": \"2019-01-01\"",
    );
    refused("profile.json", text.as_bytes(), "FIXTURE_CONTRACT_ERROR");
    let text = good().replace("\"provider\": \"openai\"", "\"provider\": \"acme-llm\"");
    refused("vendor.json", text.as_bytes(), "FIXTURE_CONTRACT_ERROR");
}

#[test]
fn timestamps_must_be_typed_integers() {
    for (name, now) in [
        ("bool.json", "true"),
        ("string.json", "\"1767225600\""),
        ("null.json", "null"),
        ("overflow.json", "253402300800"),
        ("negative.json", "-1"),
    ] {
        let text = good().replace("\"now\": 1767225600", &format!("\"now\": {now}"));
        refused(name, text.as_bytes(), "FIXTURE_CONTRACT_ERROR");
    }
}

#[test]
fn an_unknown_format_version_or_tool_is_refused() {
    let v2 = good().replace("toolledger.fixture/v1", "toolledger.fixture/v2");
    refused("v2.json", v2.as_bytes(), "FIXTURE_CONTRACT_ERROR");
    let tool = good().replace("\"tool\": \"refund_order\"", "\"tool\": \"create_issue\"");
    refused("tool.json", tool.as_bytes(), "FIXTURE_CONTRACT_ERROR");
}

#[test]
fn unreadable_and_malformed_fixtures() {
    refused(
        "trailing.json",
        b"{\"format\": 1} x",
        "FIXTURE_INVALID_JSON",
    );
    let d = Db::new();
    let r = d.dispatch(&d.dir.path().join("absent.json"), &[]);
    assert_eq!(r.code, 2);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(r.stderr.trim()).unwrap()["error"]["code"],
        "FIXTURE_IO_ERROR"
    );
    let r = d.dispatch(d.dir.path(), &[]);
    assert_eq!(r.code, 2);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(r.stderr.trim()).unwrap()["error"]["code"],
        "FIXTURE_IO_ERROR"
    );
}
