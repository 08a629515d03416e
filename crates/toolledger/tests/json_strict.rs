//! The strict parser: every refused class has its stable code, and the accepted forms parse to
//! the values the canonical form says they stand for.

use serde_json::{json, Value};
use toolledger::json::{
    canonical_string, canonicalize, check_depth, parse, parse_canonical, parse_canonical_with,
    Limits, MAX_DEPTH_CEILING,
};

fn code_of(text: &[u8]) -> &'static str {
    match parse(text, &Limits::DEFAULT) {
        Ok(v) => panic!(
            "expected an error for {:?}, got {v}",
            String::from_utf8_lossy(text)
        ),
        Err(e) => e.code,
    }
}

fn ok(text: &str) -> Value {
    parse(text.as_bytes(), &Limits::DEFAULT)
        .unwrap_or_else(|e| panic!("expected {text:?} to parse, got {e}"))
}

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

#[test]
fn accepts_ordinary_documents() {
    assert_eq!(
        ok(" {\"a\" : [1, -2, true, false, null, \"x\"], \"b\": {}} \r\n"),
        json!({"a": [1, -2, true, false, null, "x"], "b": {}})
    );
    assert_eq!(ok("[]"), json!([]));
    assert_eq!(ok("\"\""), json!(""));
    assert_eq!(ok("0"), json!(0));
}

#[test]
fn integral_decimal_forms_become_integers() {
    for (text, n) in [
        ("1.0", 1_i64),
        ("10e-1", 1),
        ("1e2", 100),
        ("1E+2", 100),
        ("0.5e1", 5),
        ("-0", 0),
        ("-0.0e5", 0),
        ("0e-999999999999999999999", 0),
        ("123.4500e2", 12345),
        ("9007199254740991", 9_007_199_254_740_991),
        ("-9007199254740991", -9_007_199_254_740_991),
        ("9.007199254740991e15", 9_007_199_254_740_991),
        ("90071992547409910e-1", 9_007_199_254_740_991),
        ("100000000000000000000e-20", 1),
    ] {
        let v = ok(text);
        assert_eq!(v, json!(n), "{text}");
        assert!(
            v.as_i64().is_some(),
            "{text} must be an integer, not a float"
        );
    }
}

#[test]
fn non_integral_numbers_become_the_double_they_denote() {
    for (text, canonical) in [
        ("1.5", "1.5"),
        ("1e-1", "0.1"),
        ("0.1", "0.1"),
        ("-2.25", "-2.25"),
        ("15e-1", "1.5"),
        ("1.0000000000000000000001", "1"),
        ("[1, 2.5]", "[1,2.5]"),
        ("12.50", "12.5"),
        ("1e-7", "1e-7"),
        ("1.5e300", "1.5e+300"),
        ("1e21", "1e+21"),
        (
            "{\"a\": [10000000000000000000000000000000]}",
            "{\"a\":[1e+31]}",
        ),
    ] {
        let v = ok(text);
        assert_eq!(canonical_string(&v).unwrap(), canonical, "{text}");
        assert_eq!(parse_canonical(canonical.as_bytes()).unwrap(), v, "{text}");
    }
}

#[test]
fn integers_beyond_two_to_the_53_are_refused() {
    for text in [
        "9007199254740992",
        "-9007199254740992",
        "18446744073709551616",
        "1e16",
        "9.007199254740992e15",
        "12345678901234567.5",
        "999999999999999999999",
    ] {
        assert_eq!(code_of(text.as_bytes()), "integer_out_of_range", "{text}");
    }
}

#[test]
fn numbers_outside_the_double_range_are_refused() {
    for text in [
        "1e400",
        "-1e400",
        "1e99999999999999999999",
        "1e-400",
        "1e-99999999999999999999",
    ] {
        assert_eq!(code_of(text.as_bytes()), "number_out_of_range", "{text}");
    }
}

#[test]
fn non_finite_literals_are_refused() {
    for text in [
        "NaN",
        "Infinity",
        "-Infinity",
        "[1, NaN]",
        "{\"a\": -Infinity}",
    ] {
        assert_eq!(code_of(text.as_bytes()), "non_finite_number", "{text}");
    }
}

#[test]
fn duplicate_keys_are_refused_at_any_depth() {
    for text in [
        r#"{"a":1,"a":1}"#,
        r#"{"a":1,"b":2,"a":3}"#,
        r#"{"x":{"y":[{"k":1,"k":2}]}}"#,
        r#"[[[{"":0,"":0}]]]"#,
        // The same key after unescaping.
        r#"{"a":1,"\u0061":2}"#,
        r#"{"é":1,"\u00e9":2}"#,
    ] {
        assert_eq!(code_of(text.as_bytes()), "duplicate_key", "{text}");
    }
    // Equal keys in sibling objects are fine.
    assert_eq!(ok(r#"[{"a":1},{"a":2}]"#), json!([{"a": 1}, {"a": 2}]));
}

#[test]
fn invalid_utf8_is_refused() {
    for bytes in [
        &b"\"\xff\""[..],
        b"\"\xc3\"",
        b"\"\xed\xa0\x80\"",     // an encoded surrogate
        b"\"\xf4\x90\x80\x80\"", // beyond U+10FFFF
        b"\"\xc0\xaf\"",         // overlong
        b"[1, \"ok\", \"\xe2\x82\"]",
    ] {
        assert_eq!(code_of(bytes), "invalid_utf8", "{bytes:?}");
    }
}

#[test]
fn lone_surrogates_are_refused() {
    for text in [
        r#""\ud800""#,
        r#""\uDBFF x""#,
        r#""\udc00""#,
        r#""\ud800\u0041""#,
        r#""\ud800\ud800""#,
        r#""a\ude00\ud83d""#,
        r#"{"\ud800":1}"#,
    ] {
        assert_eq!(code_of(text.as_bytes()), "lone_surrogate", "{text}");
    }
    assert_eq!(ok(r#""\ud83d\ude00""#), json!("\u{1F600}"));
    assert_eq!(ok(r#""\uD83D\uDE00""#), json!("\u{1F600}"));
}

#[test]
fn invalid_escapes_are_refused() {
    for text in [
        r#""\a""#,
        r#""\x41""#,
        r#""\u12""#,
        r#""\u12g4""#,
        r#""\U0041""#,
        r#""\'""#,
        r#""\ud800\uzzzz""#,
    ] {
        assert_eq!(code_of(text.as_bytes()), "invalid_escape", "{text}");
    }
    assert_eq!(
        ok(r#""\"\\\/\b\f\n\r\t\u0000\u001F\u00e9\uFFFF""#),
        json!("\"\\/\u{8}\u{c}\n\r\t\u{0}\u{1f}é\u{FFFF}")
    );
}

#[test]
fn syntax_errors_are_refused() {
    for text in [
        "",
        "   ",
        "{",
        "[1,]",
        "{\"a\":1,}",
        "[1 2]",
        "{\"a\" 1}",
        "{a:1}",
        "{1:1}",
        "'a'",
        "01",
        "-",
        "+1",
        ".5",
        "1.",
        "1e",
        "1e+",
        "0x10",
        "tru",
        "nul",
        "True",
        "[1] 2",
        "{} {}",
        "1 x",
        "\"unterminated",
        "\"a\\",
        "[",
        "]",
        "/* comment */ 1",
        "\u{FEFF}{}",
        "\u{a0}1",
        "Nope",
    ] {
        assert_eq!(code_of(text.as_bytes()), "syntax", "{text:?}");
    }
}

#[test]
fn raw_control_characters_inside_strings_are_syntax_errors() {
    for b in 0u8..0x20 {
        let text = [b'"', b'a', b, b'"'];
        assert_eq!(code_of(&text), "syntax", "byte {b:#04x}");
        // The same character escaped is fine.
        let escaped = format!("\"a\\u{b:04x}\"");
        assert_eq!(ok(&escaped), Value::String(format!("a{}", b as char)));
    }
    // DEL is not a control character for JSON.
    assert_eq!(ok("\"\u{7f}\""), json!("\u{7f}"));
}

#[test]
fn size_limit_is_enforced_in_bytes() {
    let limits = Limits {
        max_bytes: 10,
        max_depth: 4,
    };
    assert_eq!(parse(b"\"12345678\"", &limits).unwrap(), json!("12345678"));
    assert_eq!(
        parse(b"\"123456789\"", &limits).unwrap_err().code,
        "too_large"
    );
    let big = format!("\"{}\"", "x".repeat(Limits::FIXTURE.max_bytes));
    assert_eq!(
        parse(big.as_bytes(), &Limits::FIXTURE).unwrap_err().code,
        "too_large"
    );
    // Size is checked before anything else.
    assert_eq!(parse(&[0xff; 11], &limits).unwrap_err().code, "too_large");
}

#[test]
fn depth_limit_is_exact() {
    let limits = Limits::FIXTURE;
    assert_eq!(parse(nested(32).as_bytes(), &limits).unwrap(), {
        let mut v = json!([]);
        for _ in 1..32 {
            v = json!([v]);
        }
        v
    });
    assert_eq!(
        parse(nested(33).as_bytes(), &limits).unwrap_err().code,
        "too_deep"
    );
    let objects = format!("{}1{}", "{\"a\":".repeat(33), "}".repeat(33));
    assert_eq!(
        parse(objects.as_bytes(), &limits).unwrap_err().code,
        "too_deep"
    );
    let objects = format!("{}1{}", "{\"a\":".repeat(32), "}".repeat(32));
    assert!(parse(objects.as_bytes(), &limits).is_ok());
}

#[test]
fn thousands_of_levels_inside_the_size_limit_are_a_clean_error() {
    // 4,096 levels fit in 64 KiB; this must be too_deep, not a stack overflow.
    let deep = nested(4_096);
    assert!(deep.len() <= Limits::FIXTURE.max_bytes);
    assert_eq!(
        parse(deep.as_bytes(), &Limits::FIXTURE).unwrap_err().code,
        "too_deep"
    );
    // Unclosed, and mixed with objects.
    let open = "[{\"a\":".repeat(10_000);
    assert_eq!(
        parse(open.as_bytes(), &Limits::DEFAULT).unwrap_err().code,
        "too_deep"
    );
    // A depth limit above the ceiling is clamped, so even a careless limit cannot overflow.
    let careless = Limits {
        max_bytes: usize::MAX,
        max_depth: usize::MAX,
    };
    let deeper = nested(100_000);
    assert_eq!(
        parse(deeper.as_bytes(), &careless).unwrap_err().code,
        "too_deep"
    );
    assert!(parse(nested(MAX_DEPTH_CEILING).as_bytes(), &careless).is_ok());
}

#[test]
fn depth_scan_ignores_brackets_inside_strings() {
    let text = format!("[\"{}\"]", "[{".repeat(100));
    assert!(check_depth(text.as_bytes(), 1).is_ok());
    // An escaped quote does not end the string.
    let text = format!("[\"\\\"{}\"]", "[".repeat(100));
    assert!(check_depth(text.as_bytes(), 1).is_ok());
    // An escaped backslash before the closing quote does end it.
    let text = "[\"\\\\\", [[1]]]";
    assert!(check_depth(text.as_bytes(), 3).is_ok());
    assert_eq!(
        check_depth(text.as_bytes(), 2).unwrap_err().code,
        "too_deep"
    );
    assert!(parse(
        format!("[\"{}\"]", "[".repeat(100)).as_bytes(),
        &Limits::FIXTURE
    )
    .is_ok());
}

#[test]
fn astral_and_private_use_characters_pass_through_raw() {
    let v = ok("{\"\u{1F600}\":\"\u{E000}\",\"\u{FFFD}\":\"\\ud83d\\ude00\"}");
    assert_eq!(v, json!({"\u{1F600}": "\u{E000}", "\u{FFFD}": "\u{1F600}"}));
    assert_eq!(
        canonical_string(&v).unwrap(),
        "{\"\u{FFFD}\":\"\u{1F600}\",\"\u{1F600}\":\"\u{E000}\"}"
    );
}

#[test]
fn canonical_parse_requires_byte_identity() {
    let canonical = "{\"a\":[1,\"\\u0001\",\"é\"],\"b\":null}";
    assert_eq!(
        parse_canonical(canonical.as_bytes()).unwrap(),
        json!({"a": [1, "\u{1}", "é"], "b": null})
    );
    for text in [
        "{\"b\":null,\"a\":1}", // key order
        "{\"a\": 1}",           // whitespace
        "[1.0]",                // integral float
        "-0",                   // negative zero
        "\"\\u00e9\"",          // unnecessary escape
        "\"\\/\"",              // escaped solidus
        "\"\\u0008\"",          // long form of a short escape
        "\"\\u001F\"",          // uppercase hex
        "1e2",
        " 1",
        "1\n",
    ] {
        assert_eq!(
            parse_canonical(text.as_bytes()).unwrap_err().code,
            "non_canonical",
            "{text:?}"
        );
    }
    // The strict checks still come first.
    assert_eq!(
        parse_canonical(b"{\"a\":1,\"a\":1}").unwrap_err().code,
        "duplicate_key"
    );
    assert_eq!(
        parse_canonical_with(
            nested(3).as_bytes(),
            &Limits {
                max_bytes: 100,
                max_depth: 2
            }
        )
        .unwrap_err()
        .code,
        "too_deep"
    );
}

#[test]
fn canonicalize_normalizes_accepted_text() {
    assert_eq!(
        canonicalize(
            b" { \"b\" : 1.0 , \"a\" : \"\\u00e9\\/\" } ",
            &Limits::DEFAULT
        )
        .unwrap(),
        "{\"a\":\"é/\",\"b\":1}"
    );
}

#[test]
fn messages_do_not_echo_the_input() {
    let secret = "s3cr3t-value-that-must-not-leak";
    for text in [
        format!("{{\"{secret}\":1,\"{secret}\":2}}"),
        format!("[\"{secret}\", 1e17]"),
        format!("[\"{secret}\" \"{secret}\"]"),
        format!("\"{secret}\\q\""),
        format!("\"{secret}\\ud800\""),
    ] {
        let e = parse(text.as_bytes(), &Limits::DEFAULT).unwrap_err();
        assert!(!e.message.contains("s3cr3t"), "{e}");
        assert!(e.message.len() < 80, "{e}");
    }
}
