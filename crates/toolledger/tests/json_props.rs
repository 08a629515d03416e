//! Property tests for the strict parser and the canonical encoder.

use proptest::prelude::*;
use serde_json::{Map, Value};
use toolledger::json::{
    canonical_string, check_depth, parse, parse_canonical, write_canonical_str, Limits,
    MAX_SAFE_INTEGER,
};

fn interesting_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => any::<char>(),
        2 => prop::char::range('a', 'e'),
        1 => Just('\u{1F600}'),
        1 => Just('\u{10FFFF}'),
        1 => Just('\u{E000}'),
        1 => Just('\u{FFFD}'),
        1 => Just('\u{FEFF}'),
        1 => Just('\u{7F}'),
        1 => Just('"'),
        1 => Just('\\'),
        1 => Just('/'),
        2 => (0u32..0x20).prop_map(|c| char::from_u32(c).unwrap()),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(interesting_char(), 0..8).prop_map(|cs| cs.into_iter().collect())
}

fn integer() -> impl Strategy<Value = i64> {
    prop_oneof![
        -MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER,
        -1000i64..1000,
        Just(MAX_SAFE_INTEGER),
        Just(-MAX_SAFE_INTEGER),
        Just(0),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        integer().prop_map(|n| Value::Number(n.into())),
        text().prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((text(), inner), 0..6)
                .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// One random edit of a byte string.
#[derive(Debug, Clone)]
enum Edit {
    Replace(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let byte = prop_oneof![
        any::<u8>(),
        prop::sample::select(b"\"\\{}[],:0123456789eE.-+ utfnNI\x00\x1f\xff\xc3\xed".to_vec()),
    ];
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(i, b)| Edit::Replace(i, b)),
        (any::<usize>(), byte).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Delete),
        any::<usize>().prop_map(Edit::Truncate),
    ]
}

fn apply(bytes: &mut Vec<u8>, e: &Edit) {
    let n = bytes.len();
    match *e {
        Edit::Replace(i, b) if n > 0 => bytes[i % n] = b,
        Edit::Insert(i, b) => bytes.insert(i % (n + 1), b),
        Edit::Delete(i) if n > 0 => {
            bytes.remove(i % n);
        }
        Edit::Truncate(i) => bytes.truncate(i % (n + 1)),
        _ => {}
    }
}

/// Whatever the strict parser accepts, serde_json accepts too, with the same canonical form.
fn agrees_with_serde_json(bytes: &[u8]) {
    if let Ok(mine) = parse(bytes, &Limits::DEFAULT) {
        let theirs: Value = serde_json::from_slice(bytes).expect("serde_json accepts it too");
        assert_eq!(
            canonical_string(&mine).unwrap(),
            canonical_string(&theirs).unwrap()
        );
    }
}

/// Decides integrality and range by moving the decimal point in the digit string, a method
/// independent of the parser's.
fn oracle(negative: bool, int: &str, frac: &str, exp: i32) -> Result<i64, &'static str> {
    let digits = format!("{int}{frac}");
    let point = int.len() as i64 + i64::from(exp);
    let (whole, after) = if point <= 0 {
        (
            String::new(),
            format!("{}{digits}", "0".repeat((-point) as usize)),
        )
    } else if point as usize >= digits.len() {
        (
            format!("{digits}{}", "0".repeat(point as usize - digits.len())),
            String::new(),
        )
    } else {
        (
            digits[..point as usize].to_string(),
            digits[point as usize..].to_string(),
        )
    };
    let whole = whole.trim_start_matches('0');
    // A fraction, or 10^21 and beyond: the double (checked by the caller).
    if after.bytes().any(|b| b != b'0') || whole.len() >= 22 {
        return Err("double");
    }
    let max = MAX_SAFE_INTEGER.to_string();
    if whole.len() > max.len() || (whole.len() == max.len() && whole > max.as_str()) {
        return Err("integer_out_of_range");
    }
    let n: i64 = if whole.is_empty() {
        0
    } else {
        whole.parse().unwrap()
    };
    Ok(if negative { -n } else { n })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn canonical_output_round_trips(v in value()) {
        let text = canonical_string(&v).unwrap();
        let back = parse(text.as_bytes(), &Limits::DEFAULT).unwrap();
        prop_assert_eq!(&back, &v);
        prop_assert_eq!(canonical_string(&back).unwrap(), text.clone());
        prop_assert_eq!(parse_canonical(text.as_bytes()).unwrap(), v);
    }

    #[test]
    fn serde_json_output_parses_to_the_same_value(v in value()) {
        let compact = serde_json::to_vec(&v).unwrap();
        prop_assert_eq!(parse(&compact, &Limits::DEFAULT).unwrap(), v.clone());
        let pretty = serde_json::to_vec_pretty(&v).unwrap();
        prop_assert_eq!(parse(&pretty, &Limits::DEFAULT).unwrap(), v);
    }

    #[test]
    fn object_keys_are_ordered_by_scalar_value(
        entries in prop::collection::btree_map(text(), integer(), 0..12)
    ) {
        let obj = Value::Object(
            entries.iter().map(|(k, n)| (k.clone(), Value::Number((*n).into()))).collect()
        );
        let mut keys: Vec<&String> = entries.keys().collect();
        keys.sort_by_key(|k| k.chars().collect::<Vec<char>>());
        let mut expected = String::from("{");
        for (i, k) in keys.iter().enumerate() {
            if i > 0 {
                expected.push(',');
            }
            write_canonical_str(k, &mut expected);
            expected.push(':');
            expected.push_str(&entries[*k].to_string());
        }
        expected.push('}');
        prop_assert_eq!(canonical_string(&obj).unwrap(), expected);
    }

    #[test]
    fn canonical_strings_escape_exactly_the_required_characters(s in text()) {
        let mut out = String::new();
        write_canonical_str(&s, &mut out);
        let inner = &out[1..out.len() - 1];
        // No raw control characters, quotes only escaped, and nothing else escaped.
        prop_assert!(!inner.chars().any(|c| (c as u32) < 0x20));
        let mut expected = String::new();
        for c in s.chars() {
            match c {
                '"' => expected.push_str("\\\""),
                '\\' => expected.push_str("\\\\"),
                '\u{8}' => expected.push_str("\\b"),
                '\u{c}' => expected.push_str("\\f"),
                '\n' => expected.push_str("\\n"),
                '\r' => expected.push_str("\\r"),
                '\t' => expected.push_str("\\t"),
                c if (c as u32) < 0x20 => expected.push_str(&format!("\\u{:04x}", c as u32)),
                c => expected.push(c),
            }
        }
        prop_assert_eq!(inner, expected.as_str());
    }

    #[test]
    fn number_integrality_matches_an_independent_oracle(
        negative in any::<bool>(),
        int in "0|[1-9][0-9]{0,19}",
        frac in proptest::option::of("[0-9]{1,20}"),
        exp in proptest::option::of(-40i32..40),
        upper in any::<bool>(),
    ) {
        let mut text = String::new();
        if negative {
            text.push('-');
        }
        text.push_str(&int);
        if let Some(f) = &frac {
            text.push('.');
            text.push_str(f);
        }
        if let Some(e) = exp {
            text.push(if upper { 'E' } else { 'e' });
            text.push_str(&e.to_string());
        }
        let expected = oracle(negative, &int, frac.as_deref().unwrap_or(""), exp.unwrap_or(0));
        let got = parse(text.as_bytes(), &Limits::DEFAULT);
        match expected {
            Ok(n) => prop_assert_eq!(got.unwrap(), Value::Number(n.into()), "{}", text),
            Err("double") => {
                let f: f64 = text.parse().unwrap();
                match got {
                    Ok(v) => {
                        // The double the digits round to (an integral one within ±(2^53−1)
                        // as that integer).
                        let g = v.as_f64().unwrap();
                        prop_assert_eq!(g, f, "{}", text);
                        prop_assert!(f != 0.0 && f.is_finite(), "{}", text);
                        prop_assert_eq!(v.is_f64(), f.fract() != 0.0 || f.abs() >= 1e21, "{}", text);
                    }
                    Err(e) if f == 0.0 || !f.is_finite() => {
                        prop_assert_eq!(e.code, "number_out_of_range", "{}", text)
                    }
                    Err(e) => {
                        prop_assert_eq!(e.code, "integer_out_of_range", "{}", text);
                        prop_assert!(f.fract() == 0.0 && f.abs() < 1e21, "{}", text);
                    }
                }
            }
            Err(code) => prop_assert_eq!(got.unwrap_err().code, code, "{}", text),
        }
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = check_depth(&bytes, 4);
        let _ = parse(&bytes, &Limits::DEFAULT);
        let _ = parse(&bytes, &Limits { max_bytes: 64, max_depth: 2 });
        agrees_with_serde_json(&bytes);
    }

    #[test]
    fn random_json_like_bytes_never_panic(
        bytes in prop::collection::vec(
            prop::sample::select(b"\"\\{}[],:019eE.-+ utfnrlasNI\x00\xc3\xa9".to_vec()),
            0..128,
        )
    ) {
        let _ = parse(&bytes, &Limits::DEFAULT);
        agrees_with_serde_json(&bytes);
    }

    #[test]
    fn mutated_documents_never_panic(
        v in value(),
        edits in prop::collection::vec(edit(), 1..6),
        pretty in any::<bool>(),
    ) {
        let mut bytes = if pretty {
            serde_json::to_vec_pretty(&v).unwrap()
        } else {
            canonical_string(&v).unwrap().into_bytes()
        };
        for e in &edits {
            apply(&mut bytes, e);
            let _ = parse(&bytes, &Limits::DEFAULT);
            let _ = parse_canonical(&bytes);
            agrees_with_serde_json(&bytes);
        }
    }
}
