//! `toolledger fingerprint` as a user runs it: the built binary, stdin lines, the key in the
//! environment.

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::Stdio;

use serde_json::Value;

const KEY_ENV: &str = "TOOLLEDGER_FINGERPRINT_KEY_HEX";
const KAT_KEY_HEX: &str = "746573742d6f6e6c792d63726f73732d6c616e67756167652d6b65792d333262";
const KAT_LINE: &str = r#"{"principal":"alice","tool_id":"create_issue","tool_version":"1.0","arguments":{"title":"spec"},"continuation_state":"awaiting-body","input_responses":{"body":{"action":"accept","content":{"body":"alpha"}}}}"#;
const KAT_FINGERPRINT: &str = "8053811d58bacfa928adfe862a3e1bda8040d18feef86b1b6eca9cd807c2cd97";
const PLAIN_LINE: &str = r#"{"principal":"alice","tool_id":"create_issue","tool_version":"1.0","arguments":{"title":"spec"}}"#;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(key_hex: Option<&str>, stdin: &[u8]) -> Run {
    let mut cmd = support::toolledger();
    cmd.arg("fingerprint")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove(KEY_ENV);
    if let Some(k) = key_hex {
        cmd.env(KEY_ENV, k);
    }
    let mut child = cmd.spawn().expect("spawn toolledger");
    let mut pipe = child.stdin.take().unwrap();
    let input = stdin.to_vec();
    // Write from another thread so a full stdout pipe cannot deadlock the test; the child may
    // exit early on a bad line, so a broken pipe here is expected.
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    });
    let out = child.wait_with_output().expect("wait for toolledger");
    writer.join().unwrap();
    Run {
        code: out.status.code().expect("exited normally"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn ok(key_hex: &str, stdin: &[u8]) -> Vec<String> {
    let r = run(Some(key_hex), stdin);
    assert_eq!(r.code, 0, "stderr: {}", r.stderr);
    assert_eq!(r.stderr, "");
    r.stdout.lines().map(str::to_owned).collect()
}

fn plain_digest() -> String {
    ok(KAT_KEY_HEX, PLAIN_LINE.as_bytes()).remove(0)
}

#[test]
fn prints_the_documented_known_answer() {
    let r = run(Some(KAT_KEY_HEX), format!("{KAT_LINE}\n").as_bytes());
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, format!("{KAT_FINGERPRINT}\n"));
    assert_eq!(r.stderr, "");
}

#[test]
fn matches_every_independently_generated_vector() {
    let vectors: Value =
        serde_json::from_str(include_str!("../../toolledger/tests/vectors/digests.json")).unwrap();
    let mut by_key: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    let cases = vectors["fingerprint"].as_array().unwrap();
    assert!(cases.len() >= 20);
    for case in cases {
        let entry = by_key
            .entry(case["key_hex"].as_str().unwrap().to_owned())
            .or_default();
        entry.0.push_str(case["line"].as_str().unwrap());
        entry.0.push('\n');
        entry
            .1
            .push(case["fingerprint"].as_str().unwrap().to_owned());
    }
    assert!(by_key.len() >= 3);
    for (key, (input, expected)) in by_key {
        assert_eq!(ok(&key, input.as_bytes()), expected, "key {key}");
        // Uppercase hex names the same key.
        assert_eq!(ok(&key.to_uppercase(), input.as_bytes()), expected);
    }
}

#[test]
fn output_is_one_lowercase_digest_per_line_in_order() {
    let plain = plain_digest();
    let input = format!("{KAT_LINE}\n{PLAIN_LINE}\n{KAT_LINE}\n");
    let lines = ok(KAT_KEY_HEX, input.as_bytes());
    assert_eq!(
        lines,
        vec![
            KAT_FINGERPRINT.to_owned(),
            plain,
            KAT_FINGERPRINT.to_owned()
        ]
    );
    for l in &lines {
        assert_eq!(l.len(), 64);
        assert!(l
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }
}

#[test]
fn line_endings_and_trailing_blank_lines_are_accepted() {
    let plain = plain_digest();
    let expected = vec![KAT_FINGERPRINT.to_owned(), plain];
    for input in [
        format!("{KAT_LINE}\n{PLAIN_LINE}"),
        format!("{KAT_LINE}\n{PLAIN_LINE}\n"),
        format!("{KAT_LINE}\r\n{PLAIN_LINE}\r\n"),
        format!("{KAT_LINE}\n{PLAIN_LINE}\n\n"),
        format!("{KAT_LINE}\n{PLAIN_LINE}\n  \n\r\n"),
        format!("  {KAT_LINE}  \n\t{PLAIN_LINE}\n"),
    ] {
        assert_eq!(ok(KAT_KEY_HEX, input.as_bytes()), expected, "{input:?}");
    }
    assert_eq!(ok(KAT_KEY_HEX, b""), Vec::<String>::new());
    assert_eq!(ok(KAT_KEY_HEX, b"\n"), Vec::<String>::new());
}

#[test]
fn absent_and_null_continuation_fields_are_the_same_request() {
    let with_nulls = r#"{"principal":"alice","tool_id":"create_issue","tool_version":"1.0","arguments":{"title":"spec"},"continuation_state":null,"input_responses":null}"#;
    assert_eq!(ok(KAT_KEY_HEX, with_nulls.as_bytes()), vec![plain_digest()]);
}

fn fails(key_hex: Option<&str>, stdin: &[u8]) -> Run {
    let r = run(key_hex, stdin);
    assert_eq!(r.code, 2, "stdout: {} stderr: {}", r.stdout, r.stderr);
    assert_eq!(
        r.stderr.lines().count(),
        1,
        "one line on stderr: {:?}",
        r.stderr
    );
    r
}

/// The `(code, message)` of the one exit-2 JSON error object on stderr.
fn error(r: &Run) -> (String, String) {
    let v: serde_json::Value = serde_json::from_str(r.stderr.trim())
        .unwrap_or_else(|e| panic!("stderr is not one JSON object ({e}): {:?}", r.stderr));
    let keys: Vec<&String> = v["error"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["code", "message"], "{}", r.stderr);
    (
        v["error"]["code"].as_str().unwrap().to_string(),
        v["error"]["message"].as_str().unwrap().to_string(),
    )
}

#[test]
fn a_missing_key_is_refused() {
    let r = fails(None, KAT_LINE.as_bytes());
    let (code, message) = error(&r);
    assert_eq!(code, "KEY_ERROR");
    assert!(message.starts_with(KEY_ENV), "{message}");
    assert!(message.contains("missing_key"), "{message}");
    assert_eq!(r.stdout, "");
}

#[test]
fn a_short_or_malformed_key_is_refused_without_echoing_it() {
    let short = &KAT_KEY_HEX[..62]; // 31 bytes
    let r = fails(Some(short), KAT_LINE.as_bytes());
    assert_eq!(error(&r).0, "KEY_ERROR");
    assert!(error(&r).1.contains("key_too_short"), "{}", r.stderr);
    assert!(!r.stderr.contains(short));
    assert_eq!(r.stdout, "");

    let r = fails(Some(""), KAT_LINE.as_bytes());
    assert!(r.stderr.contains("key_too_short"), "{}", r.stderr);

    for bad in [
        format!("{KAT_KEY_HEX}zz"),
        format!("{KAT_KEY_HEX}a"),
        format!(" {KAT_KEY_HEX}"),
    ] {
        let r = fails(Some(&bad), KAT_LINE.as_bytes());
        assert_eq!(error(&r).0, "KEY_ERROR");
        assert!(error(&r).1.contains("invalid_key_hex"), "{}", r.stderr);
        assert!(!r.stderr.contains(KAT_KEY_HEX), "{}", r.stderr);
        assert_eq!(r.stdout, "");
    }
}

#[test]
fn a_bad_line_stops_with_its_number_after_the_good_lines_before_it() {
    let input = format!(
        "{KAT_LINE}\n{KAT_LINE}\n{{\"principal\":\"a\",\"principal\":\"b\"}}\n{PLAIN_LINE}\n"
    );
    let r = fails(Some(KAT_KEY_HEX), input.as_bytes());
    assert_eq!(r.stdout, format!("{KAT_FINGERPRINT}\n{KAT_FINGERPRINT}\n"));
    let (code, message) = error(&r);
    assert_eq!(code, "INVALID_INPUT");
    assert!(message.starts_with("line 3: duplicate_key"), "{message}");
}

#[test]
fn each_kind_of_bad_line_is_reported() {
    let deep = format!("{}{}", "[".repeat(4_096), "]".repeat(4_096));
    let huge = format!(
        r#"{{"principal":"a","tool_id":"t","tool_version":"1","arguments":"{}"}}"#,
        "x".repeat(1 << 20)
    );
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"not json".to_vec(), "line 1: syntax"),
        (b"{\"principal\":\"\xff\"}".to_vec(), "line 1: invalid_utf8"),
        (deep.into_bytes(), "line 1: too_deep"),
        (huge.into_bytes(), "line 1: too_large"),
        (b"[]".to_vec(), "line 1: invalid_input"),
        (
            br#"{"principal":"a","tool_id":"t","tool_version":"1","arguments":{},"extra":1}"#
                .to_vec(),
            "line 1: invalid_input",
        ),
        (
            br#"{"principal":"a","tool_id":"t","tool_version":"1"}"#.to_vec(),
            "line 1: invalid_input",
        ),
        (
            br#"{"principal":"a","tool_id":"t","tool_version":"1","arguments":{"n":1e17}}"#
                .to_vec(),
            "line 1: integer_out_of_range",
        ),
        (
            br#"{"principal":"a","tool_id":"t","tool_version":"1","arguments":{"n":9007199254740992}}"#
                .to_vec(),
            "line 1: integer_out_of_range",
        ),
        (
            br#"{"principal":"a","tool_id":"t","tool_version":"1","arguments":NaN}"#.to_vec(),
            "line 1: non_finite_number",
        ),
        (
            br#"{"principal":"\ud800","tool_id":"t","tool_version":"1","arguments":{}}"#.to_vec(),
            "line 1: lone_surrogate",
        ),
        (
            format!("{KAT_LINE} {KAT_LINE}").into_bytes(),
            "line 1: syntax",
        ),
        (
            format!("{KAT_LINE}\n\n{KAT_LINE}\n").into_bytes(),
            "line 2: syntax",
        ),
    ];
    for (input, prefix) in cases {
        let r = fails(Some(KAT_KEY_HEX), &input);
        let (code, message) = error(&r);
        assert_eq!(code, "INVALID_INPUT", "{}", r.stderr);
        assert!(
            message.starts_with(prefix),
            "expected {prefix:?}, got {:?}",
            r.stderr
        );
        assert!(r.stderr.len() < 250, "{}", r.stderr);
    }
}
