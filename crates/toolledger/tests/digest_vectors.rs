//! The digests against vectors computed by an independent implementation
//! (`tools/gen_digest_vectors.py`), plus the properties each digest promises.

use serde_json::{json, Value};
use toolledger::digest::{
    call_binding_digest, fingerprint, request_canonical, request_digest, result_digest, sha256_hex,
    CallBinding, FingerprintInput, FingerprintKey,
};
use toolledger::json::{canonical_string, canonicalize, Limits};
use toolledger::ToolContract;

const KAT_KEY: &[u8] = b"test-only-cross-language-key-32b";
const KAT_LINE: &str = r#"{"principal":"alice","tool_id":"create_issue","tool_version":"1.0","arguments":{"title":"spec"},"continuation_state":"awaiting-body","input_responses":{"body":{"action":"accept","content":{"body":"alpha"}}}}"#;
const KAT_FINGERPRINT: &str = "8053811d58bacfa928adfe862a3e1bda8040d18feef86b1b6eca9cd807c2cd97";

/// The vector file, read with serde_json (not with the parser under test).
fn vectors() -> Value {
    let text = include_str!("vectors/digests.json");
    serde_json::from_str(text).expect("vectors/digests.json is JSON")
}

fn section(name: &str) -> Vec<Value> {
    let cases = vectors()[name].as_array().cloned().unwrap_or_default();
    assert!(
        cases.len() >= 20,
        "section {name} has {} cases",
        cases.len()
    );
    cases
}

fn s(v: &Value) -> &str {
    v.as_str().expect("a string in the vector file")
}

#[test]
fn documented_known_answer_vector() {
    let key = FingerprintKey::from_bytes(KAT_KEY).unwrap();
    let input = FingerprintInput::from_json(KAT_LINE.as_bytes(), &Limits::DEFAULT).unwrap();
    assert_eq!(fingerprint(&key, &input).unwrap(), KAT_FINGERPRINT);
    let key = FingerprintKey::from_hex(&hex::encode(KAT_KEY)).unwrap();
    assert_eq!(fingerprint(&key, &input).unwrap(), KAT_FINGERPRINT);
}

#[test]
fn request_digests_match_the_vectors() {
    for case in section("request") {
        let contract: ToolContract = serde_json::from_value(case["contract"].clone()).unwrap();
        let canonical = request_canonical(
            s(&case["tenant"]),
            s(&case["subject"]),
            &contract,
            &case["arguments"],
        )
        .unwrap();
        assert_eq!(canonical, s(&case["canonical"]));
        let digest = request_digest(
            s(&case["tenant"]),
            s(&case["subject"]),
            &contract,
            &case["arguments"],
        )
        .unwrap();
        assert_eq!(digest, s(&case["digest"]), "{canonical}");
    }
}

#[test]
fn result_digests_match_the_vectors() {
    for case in section("result") {
        assert_eq!(
            canonical_string(&case["result"]).unwrap(),
            s(&case["canonical"])
        );
        assert_eq!(
            result_digest(&case["result"]).unwrap(),
            s(&case["digest"]),
            "{}",
            case["canonical"]
        );
    }
}

#[test]
fn call_binding_digests_match_the_vectors() {
    for case in section("call_binding") {
        let binding: CallBinding = serde_json::from_value(case["binding"].clone()).unwrap();
        assert_eq!(binding.canonical(), s(&case["canonical"]));
        assert_eq!(call_binding_digest(&binding).unwrap(), s(&case["digest"]));
    }
}

#[test]
fn fingerprints_match_the_vectors() {
    let cases = section("fingerprint");
    assert_eq!(s(&cases[0]["fingerprint"]), KAT_FINGERPRINT);
    for case in cases {
        let key = FingerprintKey::from_hex(s(&case["key_hex"])).unwrap();
        let input = FingerprintInput::from_value(case["input"].clone()).unwrap();
        assert_eq!(
            key.keyed_digest("continuation_state", input.continuation_state.as_ref())
                .unwrap(),
            s(&case["continuation_state_hash"])
        );
        assert_eq!(
            key.keyed_digest("input_responses", input.input_responses.as_ref())
                .unwrap(),
            s(&case["input_responses_hash"])
        );
        assert_eq!(fingerprint(&key, &input).unwrap(), s(&case["fingerprint"]));
        // The same request read from its line with the strict parser.
        let from_line =
            FingerprintInput::from_json(s(&case["line"]).as_bytes(), &Limits::DEFAULT).unwrap();
        assert_eq!(
            fingerprint(&key, &from_line).unwrap(),
            s(&case["fingerprint"])
        );
    }
}

#[test]
fn canonicalization_matches_the_vectors() {
    for case in section("canonicalize") {
        let text = s(&case["text"]);
        let got = canonicalize(text.as_bytes(), &Limits::DEFAULT);
        match (&case["canonical"], &case["error"]) {
            (Value::String(expected), _) => assert_eq!(got.unwrap(), *expected, "{text}"),
            (_, Value::String(code)) => assert_eq!(got.unwrap_err().code, code, "{text}"),
            _ => panic!("malformed vector {case}"),
        }
    }
}

/// Doubles by bit pattern (RFC 8785's appendix B examples first, then random ones): the
/// canonical form is the JCS form the independent implementation computed, or the same refusal.
/// Each is checked as an in-memory double and as the text the strict parser reads back.
#[test]
fn non_integral_numbers_take_the_rfc_8785_form() {
    let cases = vectors()["numbers"].as_array().cloned().unwrap_or_default();
    assert!(cases.len() >= 100, "{} number vectors", cases.len());
    assert_eq!(
        s(&cases[12]["canonical"]),
        "1e+23",
        "RFC 8785's examples come first"
    );
    for case in cases {
        let bits = u64::from_str_radix(s(&case["bits"]), 16).unwrap();
        let f = f64::from_bits(bits);
        let value = serde_json::Number::from_f64(f).map(Value::Number);
        match (&case["canonical"], &case["error"]) {
            (Value::String(expected), _) => {
                let value = value.expect("a finite double");
                assert_eq!(canonical_string(&value).unwrap(), *expected, "{bits:016x}");
                // The canonical text reads back as the same double.
                let back = canonicalize(expected.as_bytes(), &Limits::DEFAULT).unwrap();
                assert_eq!(back, *expected, "{bits:016x}");
                // And the shortest Rust form of the double parses to the same canonical form.
                let text = format!("{f:e}");
                assert_eq!(
                    canonicalize(text.as_bytes(), &Limits::DEFAULT).unwrap(),
                    *expected,
                    "{text}"
                );
            }
            (_, Value::String(code)) => {
                if let Some(value) = value {
                    assert_eq!(
                        canonical_string(&value).unwrap_err().code,
                        code,
                        "{bits:016x}"
                    );
                } else {
                    assert_eq!(code, "non_finite_number", "{bits:016x}");
                }
            }
            _ => panic!("malformed vector {case}"),
        }
    }
}

/// Fingerprints and request digests of arguments carrying non-integral numbers.
#[test]
fn float_arguments_fingerprint_as_the_vectors_say() {
    let cases = section("float_fingerprint");
    for case in cases {
        let key = FingerprintKey::from_hex(s(&case["key_hex"])).unwrap();
        let input = FingerprintInput::from_value(case["input"].clone()).unwrap();
        assert_eq!(fingerprint(&key, &input).unwrap(), s(&case["fingerprint"]));
        let from_line =
            FingerprintInput::from_json(s(&case["line"]).as_bytes(), &Limits::DEFAULT).unwrap();
        assert_eq!(
            fingerprint(&key, &from_line).unwrap(),
            s(&case["fingerprint"])
        );
        let contract = ToolContract::uniform("charge", "1");
        let arguments = &case["input"]["arguments"];
        assert_eq!(
            request_canonical("acme", "alice", &contract, arguments).unwrap(),
            s(&case["request_canonical"])
        );
        assert_eq!(
            request_digest("acme", "alice", &contract, arguments).unwrap(),
            s(&case["request_digest"])
        );
    }
}

fn contract() -> ToolContract {
    ToolContract::uniform("create_issue", "1")
}

#[test]
fn request_digest_covers_the_intent_and_nothing_else() {
    let args = json!({"title": "spec"});
    let base = request_digest("acme", "alice", &contract(), &args).unwrap();
    assert_eq!(base.len(), 64);
    assert!(base
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    // An integral float in the arguments is the same intent as the integer.
    assert_eq!(
        request_digest("acme", "alice", &contract(), &json!({"n": 2.0})).unwrap(),
        request_digest("acme", "alice", &contract(), &json!({"n": 2})).unwrap()
    );

    let mut changed = Vec::new();
    changed.push(request_digest("other", "alice", &contract(), &args).unwrap());
    changed.push(request_digest("acme", "bob", &contract(), &args).unwrap());
    changed.push(request_digest("acme", "alice", &contract(), &json!({"title": "x"})).unwrap());
    for edit in [
        |c: &mut ToolContract| c.name = "other".into(),
        |c: &mut ToolContract| c.input_rev = "2".into(),
        |c: &mut ToolContract| c.output_rev = "2".into(),
        |c: &mut ToolContract| c.effect_rev = "2".into(),
    ] {
        let mut c = contract();
        edit(&mut c);
        changed.push(request_digest("acme", "alice", &c, &args).unwrap());
    }
    for d in &changed {
        assert_ne!(*d, base);
    }
    // Handler, producer and policy revisions are not business intent.
    for edit in [
        |c: &mut ToolContract| c.handler_rev = "2".into(),
        |c: &mut ToolContract| c.producer_rev = "2".into(),
        |c: &mut ToolContract| c.policy_rev = "2".into(),
    ] {
        let mut c = contract();
        edit(&mut c);
        assert_eq!(request_digest("acme", "alice", &c, &args).unwrap(), base);
    }
    // Field boundaries are unambiguous.
    assert_ne!(
        request_digest("ab", "c", &contract(), &args).unwrap(),
        request_digest("a", "bc", &contract(), &args).unwrap()
    );
}

#[test]
fn digests_refuse_values_outside_the_canonical_domain() {
    assert_eq!(
        request_digest("a", "b", &contract(), &json!({"x": 9.1e15}))
            .unwrap_err()
            .code,
        "integer_out_of_range"
    );
    assert_eq!(
        result_digest(&json!([9_007_199_254_740_992_u64]))
            .unwrap_err()
            .code,
        "integer_out_of_range"
    );
    let key = FingerprintKey::from_bytes(KAT_KEY).unwrap();
    let mut input = FingerprintInput::from_json(KAT_LINE.as_bytes(), &Limits::DEFAULT).unwrap();
    input.continuation_state = Some(json!(1e20));
    assert_eq!(
        fingerprint(&key, &input).unwrap_err().code,
        "integer_out_of_range"
    );
}

#[test]
fn result_digest_is_sha256_of_the_canonical_form() {
    let v = json!({"b": 1.0, "a": "é"});
    assert_eq!(
        result_digest(&v).unwrap(),
        sha256_hex("{\"a\":\"é\",\"b\":1}".as_bytes())
    );
    assert_eq!(
        sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
}

fn binding() -> CallBinding {
    CallBinding {
        provider: "mcp".into(),
        api_family: "tools/call".into(),
        adapter_rev: "1".into(),
        turn_id: None,
        call_id: "17".into(),
        response_id: None,
        operation_id: "op-1".into(),
        idempotency_key: "key-1".into(),
        contract: contract(),
        request_digest: "r".repeat(64),
        result_digest: None,
        downstream_request_ref: None,
        downstream_receipt_ref: None,
        downstream_status_ref: None,
    }
}

#[test]
fn call_binding_digest_changes_with_every_field() {
    type Edit = fn(&mut CallBinding);
    let edits: [Edit; 19] = [
        |b| b.provider = "x".into(),
        |b| b.api_family = "x".into(),
        |b| b.adapter_rev = "x".into(),
        |b| b.turn_id = Some("x".into()),
        |b| b.call_id = "x".into(),
        |b| b.response_id = Some("x".into()),
        |b| b.operation_id = "x".into(),
        |b| b.idempotency_key = "x".into(),
        |b| b.request_digest = "x".into(),
        |b| b.result_digest = Some("x".into()),
        |b| b.downstream_request_ref = Some("x".into()),
        |b| b.downstream_receipt_ref = Some("x".into()),
        |b| b.downstream_status_ref = Some(String::new()),
        |b| b.contract.name = "x".into(),
        |b| b.contract.input_rev = "x".into(),
        |b| b.contract.output_rev = "x".into(),
        |b| b.contract.effect_rev = "x".into(),
        |b| b.contract.handler_rev = "x".into(),
        |b| b.contract.producer_rev = "x".into(),
    ];
    let base = call_binding_digest(&binding()).unwrap();
    let mut seen = std::collections::BTreeSet::from([base.clone()]);
    for edit in edits {
        let mut b = binding();
        edit(&mut b);
        assert!(seen.insert(call_binding_digest(&b).unwrap()), "{b:?}");
    }
    let mut b = binding();
    b.contract.policy_rev = "x".into();
    assert!(seen.insert(call_binding_digest(&b).unwrap()));
}

#[test]
fn call_binding_refuses_unknown_fields() {
    let mut v = serde_json::to_value(binding()).unwrap();
    assert_eq!(
        serde_json::from_value::<CallBinding>(v.clone()).unwrap(),
        binding()
    );
    v["extra"] = json!(1);
    assert!(serde_json::from_value::<CallBinding>(v).is_err());
}

#[test]
fn fingerprint_keys_are_at_least_32_bytes_and_never_printed() {
    assert_eq!(
        FingerprintKey::from_bytes(&KAT_KEY[..31]).unwrap_err().code,
        "key_too_short"
    );
    assert_eq!(
        FingerprintKey::from_bytes(b"").unwrap_err().code,
        "key_too_short"
    );
    assert_eq!(
        FingerprintKey::from_hex(&"ab".repeat(31)).unwrap_err().code,
        "key_too_short"
    );
    for bad in ["xyz", "abc", &format!("{}zz", "ab".repeat(32)), " ab"] {
        let e = FingerprintKey::from_hex(bad).unwrap_err();
        assert_eq!(e.code, "invalid_key_hex", "{bad:?}");
        assert!(!e.message.contains("zz"));
    }
    assert!(FingerprintKey::from_hex(&"AB".repeat(32)).is_ok());
    let key = FingerprintKey::from_bytes(KAT_KEY).unwrap();
    let shown = format!("{key:?}");
    assert!(!shown.contains("test-only"), "{shown}");
    assert!(!shown.contains(&hex::encode(KAT_KEY)), "{shown}");
}

#[test]
fn fingerprint_depends_on_the_key_and_every_field() {
    let key = FingerprintKey::from_bytes(KAT_KEY).unwrap();
    let other_key = FingerprintKey::from_bytes(&[7u8; 32]).unwrap();
    let input = FingerprintInput::from_json(KAT_LINE.as_bytes(), &Limits::DEFAULT).unwrap();
    let base = fingerprint(&key, &input).unwrap();
    assert_ne!(fingerprint(&other_key, &input).unwrap(), base);
    type Edit = fn(&mut FingerprintInput);
    let edits: [Edit; 8] = [
        |i| i.principal = "bob".into(),
        |i| i.tool_id = "x".into(),
        |i| i.tool_version = "2".into(),
        |i| i.arguments = json!({"title": "other"}),
        |i| i.continuation_state = None,
        |i| i.continuation_state = Some(json!("awaiting-title")),
        |i| i.input_responses = None,
        |i| i.input_responses = Some(json!({})),
    ];
    let mut seen = std::collections::BTreeSet::from([base]);
    for edit in edits {
        let mut i = input.clone();
        edit(&mut i);
        assert!(seen.insert(fingerprint(&key, &i).unwrap()), "{i:?}");
    }
}

#[test]
fn fingerprint_input_is_read_strictly() {
    let absent = FingerprintInput::from_json(
        br#"{"principal":"a","tool_id":"t","tool_version":"1","arguments":{}}"#,
        &Limits::DEFAULT,
    )
    .unwrap();
    let null = FingerprintInput::from_json(
        br#"{"principal":"a","tool_id":"t","tool_version":"1","arguments":{},"continuation_state":null,"input_responses":null}"#,
        &Limits::DEFAULT,
    )
    .unwrap();
    assert_eq!(absent, null);
    assert_eq!(absent.continuation_state, None);

    for (text, code) in [
        (r#"[]"#, "invalid_input"),
        (
            r#"{"tool_id":"t","tool_version":"1","arguments":{}}"#,
            "invalid_input",
        ),
        (
            r#"{"principal":"a","tool_version":"1","arguments":{}}"#,
            "invalid_input",
        ),
        (
            r#"{"principal":"a","tool_id":"t","arguments":{}}"#,
            "invalid_input",
        ),
        (
            r#"{"principal":"a","tool_id":"t","tool_version":"1"}"#,
            "invalid_input",
        ),
        (
            r#"{"principal":1,"tool_id":"t","tool_version":"1","arguments":{}}"#,
            "invalid_input",
        ),
        (
            r#"{"principal":"a","tool_id":"t","tool_version":1,"arguments":{}}"#,
            "invalid_input",
        ),
        (
            r#"{"principal":"a","tool_id":"t","tool_version":"1","arguments":{},"extra":0}"#,
            "invalid_input",
        ),
        (
            r#"{"principal":"a","principal":"b","tool_id":"t","tool_version":"1","arguments":{}}"#,
            "duplicate_key",
        ),
        (
            r#"{"principal":"a","tool_id":"t","tool_version":"1","arguments":{"n":1e17}}"#,
            "integer_out_of_range",
        ),
        (
            r#"{"principal":"a","tool_id":"t","tool_version":"1","arguments":NaN}"#,
            "non_finite_number",
        ),
        (
            r#"{"principal":"a","tool_id":"t","tool_version":"1","arguments":{}} x"#,
            "syntax",
        ),
    ] {
        assert_eq!(
            FingerprintInput::from_json(text.as_bytes(), &Limits::DEFAULT)
                .unwrap_err()
                .code,
            code,
            "{text}"
        );
    }
    // Unknown field names are quoted only as a short excerpt.
    let long = "k".repeat(500);
    let text = format!(
        r#"{{"principal":"a","tool_id":"t","tool_version":"1","arguments":{{}},"{long}":0}}"#
    );
    let e = FingerprintInput::from_json(text.as_bytes(), &Limits::DEFAULT).unwrap_err();
    assert!(e.message.len() < 80, "{e}");
    // The serde form is just as strict about unknown fields.
    assert!(serde_json::from_str::<FingerprintInput>(
        r#"{"principal":"a","tool_id":"t","tool_version":"1","arguments":{},"extra":0}"#
    )
    .is_err());
}
