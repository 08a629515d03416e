//! Strict JSON: the canonical form of DESIGN §6.
//!
//! Values are `serde_json::Value` so they move freely between the ledger, rmcp and handlers, but
//! only values inside the canonical domain can be encoded: integers with |n| ≤ 2^53−1 (an
//! integral float such as `1.0` is written `1`), strings, booleans, null, arrays and objects.

use serde_json::Value;

/// The largest integer magnitude in the canonical domain: 2^53 − 1.
pub const MAX_SAFE_INTEGER: i64 = 9_007_199_254_740_991;

/// Why a value or a document is outside the strict domain. The `code` is stable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct JsonError {
    /// Stable short code, e.g. `duplicate_key`, `too_deep`.
    pub code: &'static str,
    /// Human-readable detail (never echoes more than a short excerpt of the input).
    pub message: String,
}

impl JsonError {
    pub(crate) fn new(code: &'static str, message: impl Into<String>) -> Self {
        JsonError {
            code,
            message: message.into(),
        }
    }
}

/// Encodes `value` in canonical form (DESIGN §6).
pub fn canonical_string(value: &Value) -> Result<String, JsonError> {
    let mut out = String::with_capacity(64);
    write_canonical(value, &mut out)?;
    Ok(out)
}

/// Appends the canonical form of `value` to `out`. On error `out` holds a partial encoding.
pub fn write_canonical(value: &Value, out: &mut String) -> Result<(), JsonError> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(n, out)?,
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            // Sorting by UTF-8 bytes is sorting by Unicode scalar value.
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_canonical(v, out)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// The canonical integer a JSON number stands for, or why it has none.
pub fn canonical_integer(n: &serde_json::Number) -> Result<i64, JsonError> {
    if let Some(i) = n.as_i64() {
        if (-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).contains(&i) {
            return Ok(i);
        }
        return Err(JsonError::new(
            "integer_out_of_range",
            "integers must lie within ±(2^53−1)",
        ));
    }
    if n.as_u64().is_some() {
        return Err(JsonError::new(
            "integer_out_of_range",
            "integers must lie within ±(2^53−1)",
        ));
    }
    match n.as_f64() {
        Some(f) if !f.is_finite() => Err(JsonError::new(
            "non_finite_number",
            "NaN and Infinity are not JSON",
        )),
        Some(f) if f.fract() != 0.0 => Err(JsonError::new(
            "non_integral_number",
            "only integral numbers are in the canonical domain",
        )),
        Some(f) if f.abs() <= MAX_SAFE_INTEGER as f64 => Ok(f as i64),
        _ => Err(JsonError::new(
            "integer_out_of_range",
            "integers must lie within ±(2^53−1)",
        )),
    }
}

fn write_number(n: &serde_json::Number, out: &mut String) -> Result<(), JsonError> {
    let i = canonical_integer(n)?;
    use std::fmt::Write;
    let _ = write!(out, "{i}");
    Ok(())
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: Option<&str> = match b {
            b'"' => Some("\\\""),
            b'\\' => Some("\\\\"),
            0x08 => Some("\\b"),
            0x0c => Some("\\f"),
            b'\n' => Some("\\n"),
            b'\r' => Some("\\r"),
            b'\t' => Some("\\t"),
            0x00..=0x1f => None,
            _ => continue,
        };
        out.push_str(&s[start..i]);
        match esc {
            Some(e) => out.push_str(e),
            None => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.push_str("\\u00");
                out.push(HEX[(b >> 4) as usize] as char);
                out.push(HEX[(b & 0xf) as usize] as char);
            }
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn encodes_sorted_compact_and_escaped() {
        let v = json!({"b": [1, true, null], "a": "x\"\\\n\u{1}\u{7f}é", "": 0});
        assert_eq!(
            canonical_string(&v).unwrap(),
            "{\"\":0,\"a\":\"x\\\"\\\\\\n\\u0001\u{7f}é\",\"b\":[1,true,null]}"
        );
    }

    #[test]
    fn integral_floats_become_integers_and_fractions_are_refused() {
        assert_eq!(canonical_string(&json!(1.0)).unwrap(), "1");
        assert_eq!(canonical_string(&json!(-0.0)).unwrap(), "0");
        assert_eq!(
            canonical_string(&json!(1.5)).unwrap_err().code,
            "non_integral_number"
        );
        assert_eq!(
            canonical_string(&json!(9_007_199_254_740_992_i64))
                .unwrap_err()
                .code,
            "integer_out_of_range"
        );
        assert_eq!(
            canonical_string(&json!(-9_007_199_254_740_991_i64)).unwrap(),
            "-9007199254740991"
        );
        assert_eq!(
            canonical_string(&json!(u64::MAX)).unwrap_err().code,
            "integer_out_of_range"
        );
    }

    #[test]
    fn keys_sort_by_scalar_value_not_utf16() {
        // U+FFFD (BMP) sorts before U+1F600 (astral) by scalar value; UTF-16 order would differ
        // for private-use U+E000 vs astral, so check both.
        let v = json!({"\u{1F600}": 1, "\u{E000}": 2, "\u{FFFD}": 3, "z": 4});
        assert_eq!(
            canonical_string(&v).unwrap(),
            "{\"z\":4,\"\u{E000}\":2,\"\u{FFFD}\":3,\"\u{1F600}\":1}"
        );
    }
}
