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
    "non_integral_number",
    "integer_out_of_range",
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

/// Asserts that `v` is inside the canonical domain: integers within ±(2^53−1) only.
pub fn assert_in_domain(v: &Value) {
    match v {
        Value::Number(n) => {
            let i = n.as_i64().unwrap_or_else(|| panic!("not an i64: {n}"));
            assert!((-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).contains(&i), "{i}");
        }
        Value::Array(items) => items.iter().for_each(assert_in_domain),
        Value::Object(map) => map.values().for_each(assert_in_domain),
        _ => {}
    }
}

/// The canonical form of `v`, written independently of `toolledger::json` from the published
/// rules: no whitespace; object keys sorted by Unicode scalar value; strings escape only `"`,
/// `\` and U+0000–U+001F (`\b \f \n \r \t` short, others `\u00xx` lowercase), everything
/// else raw; integers within ±(2^53−1) only, an integral float written as the integer.
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
                if !f.is_finite() || f.trunc() != f || f.abs() > MAX_SAFE_INTEGER as f64 {
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
