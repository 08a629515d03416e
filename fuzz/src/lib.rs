//! What the fuzz targets share: the properties of the strict JSON parser and the canonical
//! encoder, an independent encoder of the canonical form written from its rules, and the
//! in-process reference server the wire target drives over the strict stdio transport.

pub mod wire;

use serde_json::Value;
use toolledger::json::{self, JsonError, Limits, MAX_SAFE_INTEGER};

/// Every error code the strict parser and the canonical encoder document.
pub const JSON_CODES: &[&str] = &[
    "too_large",
    "invalid_utf8",
    "too_deep",
    "syntax",
    "duplicate_key",
    "non_finite_number",
    "invalid_escape",
    "lone_surrogate",
    "integer_out_of_range",
    "number_out_of_range",
    "non_canonical",
];

/// Limits large enough for any re-encoding of a value accepted under `limits`: the same
/// depth, and room for numbers written out in full (`1e15` is 16 digits) and escapes.
pub fn roomy(limits: &Limits) -> Limits {
    Limits {
        max_bytes: usize::MAX,
        max_depth: limits.max_depth,
    }
}

/// Asserts what every refusal of the strict parser promises: a documented code, and a short
/// message that never carries the input.
pub fn check_json_error(e: &JsonError) {
    assert!(JSON_CODES.contains(&e.code), "undocumented code {e:?}");
    assert!(e.message.len() <= 120, "long message: {e:?}");
}

/// Asserts that `v` is inside the canonical domain: integers within ±(2^53−1), and finite
/// doubles that are not integral or are at least 10^21 in magnitude.
pub fn assert_in_domain(v: &Value) {
    match v {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap();
            assert!(f.is_finite(), "{f}");
            assert!(
                f.fract() != 0.0 || f.abs() >= 1e21,
                "an integral double: {f}"
            );
        }
        Value::Number(n) => {
            let i = n.as_i64().unwrap_or_else(|| panic!("not an i64: {n}"));
            assert!((-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).contains(&i), "{i}");
        }
        Value::Array(items) => items.iter().for_each(assert_in_domain),
        Value::Object(map) => map.values().for_each(assert_in_domain),
        _ => {}
    }
}

/// The ECMAScript `Number::toString` form of the finite, nonzero double `f` (RFC 8785),
/// written from the specification: the fewest significant digits that read back as `f`, of
/// those the nearest (ties to even: Rust's fixed-precision formatting is exact and rounds
/// half to even), laid out plainly for decimal exponents from -7 to 20 and as `d.ddde±x`
/// otherwise.
fn oracle_double(f: f64, out: &mut String) {
    let a = f.abs();
    let sci = (0..=16)
        .map(|p| format!("{a:.p$e}"))
        .find(|s| s.parse::<f64>() == Ok(a))
        .unwrap_or_else(|| format!("{a:e}"));
    let (mantissa, exp) = sci.split_once('e').unwrap();
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let digits = digits.trim_end_matches('0');
    let digits = if digits.is_empty() { "0" } else { digits };
    let k = digits.len() as i32;
    let n = exp.parse::<i32>().unwrap() + 1;
    if f < 0.0 {
        out.push('-');
    }
    if k <= n && n <= 21 {
        out.push_str(digits);
        out.push_str(&"0".repeat((n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.push_str(&"0".repeat((-n) as usize));
        out.push_str(digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = n - 1;
        out.push_str(&format!("e{}{}", if e < 0 { '-' } else { '+' }, e.abs()));
    }
}

/// The canonical form of `v`, written independently of `toolledger::json` from the published
/// rules: no whitespace; object keys sorted by Unicode scalar value; strings escape only `"`,
/// `\` and U+0000–U+001F (`\b \f \n \r \t` short, others `\u00xx` lowercase), everything
/// else raw; integers within ±(2^53−1), an integral float written as the integer; other
/// doubles in the ECMAScript form, integral ones from 2^53 up to 10^21 refused.
/// `None` when `v` is outside the canonical domain.
pub fn oracle_canonical(v: &Value) -> Option<String> {
    let mut out = String::new();
    oracle_write(v, &mut out)?;
    Some(out)
}

fn oracle_write(v: &Value, out: &mut String) -> Option<()> {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let i = if let Some(i) = n.as_i64() {
                i
            } else if n.is_u64() {
                return None;
            } else {
                let f = n.as_f64()?;
                if !f.is_finite() {
                    return None;
                }
                if f.trunc() != f || f.abs() >= 1e21 {
                    oracle_double(f, out);
                    return Some(());
                }
                if f.abs() > MAX_SAFE_INTEGER as f64 {
                    return None;
                }
                f as i64
            };
            if i.unsigned_abs() > MAX_SAFE_INTEGER as u64 {
                return None;
            }
            out.push_str(&i.to_string());
        }
        Value::String(s) => oracle_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (k, item) in items.iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                oracle_write(item, out)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.chars().cmp(b.chars()));
            out.push('{');
            for (k, key) in keys.iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                oracle_string(key, out);
                out.push(':');
                oracle_write(&map[*key], out)?;
            }
            out.push('}');
        }
    }
    Some(())
}

fn oracle_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The strict parser's properties on one input under `limits`: it never panics; a refusal
/// has a documented code; an accepted document is in the canonical domain, re-parses equal
/// from its compact and canonical encodings, and serde_json reads it as the same value.
/// Returns the accepted value.
pub fn check_parse(data: &[u8], limits: &Limits) -> Option<Value> {
    let _ = json::check_depth(data, limits.max_depth);
    let value = match json::parse(data, limits) {
        Ok(value) => value,
        Err(e) => {
            check_json_error(&e);
            return None;
        }
    };
    assert!(data.len() <= limits.max_bytes);
    assert_in_domain(&value);
    let compact = serde_json::to_vec(&value).expect("a Value encodes");
    let again = json::parse(&compact, &roomy(limits)).expect("its compact form parses");
    assert_eq!(again, value);
    let canonical = json::canonical_string(&value).expect("an accepted value is canonical");
    let again = json::parse_canonical_with(canonical.as_bytes(), &roomy(limits))
        .expect("its canonical form parses as canonical");
    assert_eq!(again, value);
    let theirs: Value = serde_json::from_slice(data).expect("serde_json accepts it too");
    assert_eq!(
        json::canonical_string(&theirs).as_deref(),
        Ok(canonical.as_str()),
        "serde_json reads another value"
    );
    Some(value)
}
