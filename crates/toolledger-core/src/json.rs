//! Strict JSON and its canonical form.
//!
//! Values are `serde_json::Value` so they move freely between the ledger, rmcp and handlers, but
//! only values inside the canonical domain can be encoded: strings, booleans, null, arrays,
//! objects and numbers. Numbers are written as RFC 8785 (JCS) writes them: an integer with
//! |n| ≤ 2^53−1 as its digits (an integral float such as `1.0` is written `1`), any other
//! number as the ECMAScript shortest round-trip form of the IEEE double it denotes (`12.5`,
//! `0.1`, `1e-7`, `1.5e+300`). NaN, ±Infinity and numbers outside the double range are refused,
//! and so is an integer from 2^53 up to 10^21 (`integer_out_of_range`): a double cannot hold
//! every such integer, so two different ones (`9007199254740993` and `9007199254740992`)
//! would silently get one canonical form. Send such numbers (ids, say) as strings.

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

    /// The same error one level down, under the member or index `segment`: the message starts
    /// with the JSON pointer of the refused value (`at /amount: …`, `at /items/0: …`), so a
    /// caller learns which field to fix. The message stays short: a member name is cut at 24
    /// characters and a pointer longer than 48 keeps its innermost part (`at …/lines/0: …`).
    fn within(mut self, segment: &str) -> Self {
        let mut escaped: String = segment
            .chars()
            .take(24)
            .collect::<String>()
            .replace('~', "~0")
            .replace('/', "~1");
        if segment.chars().count() > 24 {
            escaped.push('…');
        }
        // The base messages hold no ": ", so the last one ends the pointer.
        self.message = match self
            .message
            .strip_prefix("at ")
            .and_then(|rest| rest.rsplit_once(": "))
        {
            Some((pointer, _)) if pointer.starts_with('…') => self.message,
            Some((pointer, message)) => {
                let longer = format!("/{escaped}{pointer}");
                if longer.chars().count() > 48 {
                    format!("at …{pointer}: {message}")
                } else {
                    format!("at {longer}: {message}")
                }
            }
            None => format!("at /{escaped}: {}", self.message),
        };
        self
    }
}

/// Encodes `value` in canonical form.
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
                write_canonical(item, out).map_err(|e| e.within(&i.to_string()))?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            // Sorting by UTF-8 bytes is sorting by Unicode scalar value. serde_json's default
            // map already iterates in that order; only an insertion-ordered map (the
            // `preserve_order` feature) needs the sort.
            let sorted = map
                .keys()
                .zip(map.keys().skip(1))
                .all(|(a, b)| a.as_bytes() < b.as_bytes());
            if sorted {
                write_entries(map.iter(), out)?;
            } else {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                write_entries(entries.into_iter(), out)?;
            }
        }
    }
    Ok(())
}

fn write_entries<'v>(
    entries: impl Iterator<Item = (&'v String, &'v Value)>,
    out: &mut String,
) -> Result<(), JsonError> {
    out.push('{');
    for (i, (k, v)) in entries.enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(k, out);
        out.push(':');
        write_canonical(v, out).map_err(|e| e.within(k))?;
    }
    out.push('}');
    Ok(())
}

/// The canonical integer a JSON number stands for, or why it has none.
pub fn canonical_integer(n: &serde_json::Number) -> Result<i64, JsonError> {
    if let Some(i) = n.as_i64() {
        if (-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).contains(&i) {
            return Ok(i);
        }
        return Err(out_of_safe_range());
    }
    if n.as_u64().is_some() {
        return Err(out_of_safe_range());
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
        _ => Err(out_of_safe_range()),
    }
}

fn write_number(n: &serde_json::Number, out: &mut String) -> Result<(), JsonError> {
    use std::fmt::Write;
    if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
        return write_double(f, out);
    }
    let i = canonical_integer(n)?;
    let _ = write!(out, "{i}");
    Ok(())
}

/// The smallest magnitude JCS writes in exponent form; below it an integral double is written
/// with all its digits.
const EXPONENT_FORM: f64 = 1e21;

fn out_of_safe_range() -> JsonError {
    JsonError::new(
        "integer_out_of_range",
        "integers beyond ±(2^53−1) are sent as strings",
    )
}

/// Writes a double: an integral one within ±(2^53−1) as an integer, any other in the RFC 8785
/// (JCS) form, the ECMAScript shortest round-trip form. An integral double from 2^53 up to
/// 10^21 is refused (`integer_out_of_range`): it may stand for an integer a double cannot hold,
/// and two such integers would silently become one.
fn write_double(f: f64, out: &mut String) -> Result<(), JsonError> {
    use std::fmt::Write;
    if !f.is_finite() {
        return Err(JsonError::new(
            "non_finite_number",
            "NaN and Infinity are not JSON",
        ));
    }
    if f.fract() == 0.0 {
        if f.abs() <= MAX_SAFE_INTEGER as f64 {
            let _ = write!(out, "{}", f as i64);
            return Ok(());
        }
        if f.abs() < EXPONENT_FORM {
            return Err(out_of_safe_range());
        }
    }
    write_jcs_double(f, out);
    Ok(())
}

/// Appends the ECMAScript `Number::toString` form of the finite double `f` (RFC 8785 section
/// 3.2.2.3): the shortest digits that round-trip (of two equally near, the even one), in plain
/// notation for decimal exponents from -6 to 20 and in exponent notation (`1e+21`, `1.5e-7`)
/// otherwise.
fn write_jcs_double(f: f64, out: &mut String) {
    let mut buffer = ryu_js::Buffer::new();
    out.push_str(buffer.format_finite(f));
}

/// The JSON value of the double `f` as the canonical domain holds it: an integral double within
/// ±(2^53−1) becomes the integer, other finite doubles stay doubles; `Err` (a stable code) for
/// what [`write_canonical`] refuses.
fn double_value(f: f64) -> Result<Value, &'static str> {
    if !f.is_finite() {
        return Err("number_out_of_range");
    }
    if f.fract() == 0.0 {
        if f.abs() <= MAX_SAFE_INTEGER as f64 {
            return Ok(Value::Number((f as i64).into()));
        }
        if f.abs() < EXPONENT_FORM {
            return Err("integer_out_of_range");
        }
    }
    serde_json::Number::from_f64(f)
        .map(Value::Number)
        .ok_or("number_out_of_range")
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

/// Appends the canonical form of the string `s` (quotes and escapes included) to `out`.
pub fn write_canonical_str(s: &str, out: &mut String) {
    write_string(s, out);
}

// ---------------------------------------------------------------------------------------------
// Strict parsing
// ---------------------------------------------------------------------------------------------

/// Size and nesting limits for [`parse`].
///
/// Depth counts open arrays and objects: a scalar has depth 0, `[]` and `{}` depth 1,
/// `[[1]]` depth 2. A document is refused when its depth exceeds `max_depth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted document, in bytes.
    pub max_bytes: usize,
    /// Deepest accepted nesting of arrays and objects. Values above [`MAX_DEPTH_CEILING`] are
    /// treated as [`MAX_DEPTH_CEILING`], so the recursive parser never runs out of stack.
    pub max_depth: usize,
}

/// The hard ceiling on nesting depth, whatever [`Limits::max_depth`] says.
pub const MAX_DEPTH_CEILING: usize = 512;

impl Limits {
    /// Fixture files: at most 65,536 bytes and nesting depth 32.
    pub const FIXTURE: Limits = Limits {
        max_bytes: 65_536,
        max_depth: 32,
    };

    /// Tool arguments, results and stored ledger JSON: at most 1 MiB and nesting depth 64.
    pub const DEFAULT: Limits = Limits {
        max_bytes: 1 << 20,
        max_depth: 64,
    };

    fn effective_depth(&self) -> usize {
        self.max_depth.min(MAX_DEPTH_CEILING)
    }
}

fn too_deep(max_depth: usize) -> JsonError {
    JsonError::new(
        "too_deep",
        format!("nesting is deeper than {max_depth} levels"),
    )
}

/// Checks, by one linear scan and without recursion, that no array or object in `bytes` is
/// nested deeper than `max_depth` (see [`Limits`] for how depth is counted).
///
/// The scan knows about strings: brackets inside string literals do not count, and a
/// backslash escapes the byte after it. It does not validate anything else; malformed input
/// that passes here is refused by the parser. Error code: `too_deep`.
pub fn check_depth(bytes: &[u8], max_depth: usize) -> Result<(), JsonError> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut i = 0;
    let len = bytes.len();
    while i < len {
        let b = bytes[i];
        if in_string {
            match b {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'[' | b'{' => {
                    depth += 1;
                    if depth > max_depth {
                        return Err(too_deep(max_depth));
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        i += 1;
    }
    Ok(())
}

/// Parses one strict JSON document.
///
/// Checks run in this order, each with a stable error code:
/// 1. `too_large`: more than `limits.max_bytes` bytes;
/// 2. `invalid_utf8`: the bytes are not UTF-8;
/// 3. `too_deep`: nesting deeper than `limits.max_depth`, found by [`check_depth`] before any
///    recursive parsing (so thousands of levels are a clean error, never a stack overflow);
/// 4. the recursive-descent parse of RFC 8259 JSON, refusing
///    - `syntax`: anything outside the grammar, including a leading byte order mark (U+FEFF),
///      trailing data after the value, trailing commas, leading zeros, and raw control
///      characters (U+0000–U+001F) inside strings;
///    - `duplicate_key`: an object with the same key twice (after unescaping), at any depth;
///    - `non_finite_number`: the literals `NaN`, `Infinity` and `-Infinity`;
///    - `invalid_escape`: an escape other than `\" \\ \/ \b \f \n \r \t \uXXXX`;
///    - `lone_surrogate`: a `\u` escape of a surrogate that is not part of a high–low pair;
///    - `integer_out_of_range`: a number whose exact decimal value is an integer with
///      2^53 − 1 < |n| < 10^21, decided from the digits and the exponent without floating
///      point (`1.0`, `10e-1` and `1e2` are the integers 1, 1 and 100);
///    - `number_out_of_range`: a number beyond the range of a double (`1e400`), or a nonzero
///      one so small that it rounds to zero (`1e-400`).
///
/// An integer within ±(2^53−1) is an integer in the result (`-0` becomes `0`); any other number
/// is the double its digits round to (`0.1`, `1.5e300`), or the integer when that double is
/// integral and within ±(2^53−1). Messages give a byte offset, never the input itself.
pub fn parse(bytes: &[u8], limits: &Limits) -> Result<Value, JsonError> {
    if bytes.len() > limits.max_bytes {
        return Err(JsonError::new(
            "too_large",
            format!(
                "document has {} bytes, the limit is {}",
                bytes.len(),
                limits.max_bytes
            ),
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        JsonError::new(
            "invalid_utf8",
            format!("invalid UTF-8 at byte {}", e.valid_up_to()),
        )
    })?;
    let max_depth = limits.effective_depth();
    check_depth(bytes, max_depth)?;
    if bytes.starts_with("\u{FEFF}".as_bytes()) {
        return Err(JsonError::new("syntax", "a byte order mark is not allowed"));
    }
    let mut p = Parser {
        text,
        bytes,
        pos: 0,
        max_depth,
    };
    let value = p.value(0)?;
    p.skip_ws();
    if p.pos != bytes.len() {
        return Err(p.syntax("trailing data after the value"));
    }
    Ok(value)
}

/// Parses `bytes` with [`Limits::DEFAULT`] and requires them to be exactly the canonical
/// encoding of the result (error code `non_canonical` otherwise). Use it for JSON the ledger
/// stored itself: anything else means the stored bytes were altered.
pub fn parse_canonical(bytes: &[u8]) -> Result<Value, JsonError> {
    parse_canonical_with(bytes, &Limits::DEFAULT)
}

/// [`parse_canonical`] with explicit limits.
pub fn parse_canonical_with(bytes: &[u8], limits: &Limits) -> Result<Value, JsonError> {
    let value = parse(bytes, limits)?;
    let mut out = String::with_capacity(bytes.len());
    write_canonical(&value, &mut out)?;
    if out.as_bytes() != bytes {
        return Err(JsonError::new(
            "non_canonical",
            "the document is not in canonical form",
        ));
    }
    Ok(value)
}

/// Parses `bytes` strictly and returns their canonical encoding.
pub fn canonicalize(bytes: &[u8], limits: &Limits) -> Result<String, JsonError> {
    let value = parse(bytes, limits)?;
    let mut out = String::with_capacity(bytes.len());
    write_canonical(&value, &mut out)?;
    Ok(out)
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    max_depth: usize,
}

impl<'a> Parser<'a> {
    fn syntax(&self, what: &str) -> JsonError {
        JsonError::new("syntax", format!("{what} at byte {}", self.pos))
    }

    fn err_at(&self, code: &'static str, what: &str, at: usize) -> JsonError {
        JsonError::new(code, format!("{what} at byte {at}"))
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    #[inline]
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.skip_ws();
        match self.peek() {
            None => Err(self.syntax("unexpected end of input")),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
            Some(b'N' | b'I') => {
                if self.rest().starts_with(b"NaN") || self.rest().starts_with(b"Infinity") {
                    Err(self.err_at(
                        "non_finite_number",
                        "NaN and Infinity are not JSON",
                        self.pos,
                    ))
                } else {
                    Err(self.syntax("unexpected character"))
                }
            }
            Some(_) => Err(self.syntax("unexpected character")),
        }
    }

    #[inline]
    fn rest(&self) -> &'a [u8] {
        &self.bytes[self.pos..]
    }

    fn literal(&mut self, word: &str, value: Value) -> Result<Value, JsonError> {
        if self.rest().starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(value)
        } else {
            Err(self.syntax("invalid literal"))
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, JsonError> {
        if depth > self.max_depth {
            return Err(too_deep(self.max_depth));
        }
        self.pos += 1; // '{'
        let mut map = serde_json::Map::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(map));
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(self.syntax("expected an object key"));
            }
            let key_at = self.pos;
            let key = self.string()?;
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(self.syntax("expected ':'"));
            }
            self.pos += 1;
            let value = self.value(depth)?;
            if map.insert(key, value).is_some() {
                return Err(self.err_at("duplicate_key", "duplicate object key", key_at));
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(map));
                }
                None => return Err(self.syntax("unexpected end of input")),
                Some(_) => return Err(self.syntax("expected ',' or '}'")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, JsonError> {
        if depth > self.max_depth {
            return Err(too_deep(self.max_depth));
        }
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                None => return Err(self.syntax("unexpected end of input")),
                Some(_) => return Err(self.syntax("expected ',' or ']'")),
            }
        }
    }

    /// Parses a string literal starting at the opening quote.
    fn string(&mut self) -> Result<String, JsonError> {
        self.pos += 1; // '"'
        let start = self.pos;
        // Fast path: no escapes. `text` is valid UTF-8 and the stops are ASCII, so every slice
        // below falls on a character boundary.
        loop {
            match self.peek() {
                None => return Err(self.syntax("unterminated string")),
                Some(b'"') => {
                    let s = self.text[start..self.pos].to_owned();
                    self.pos += 1;
                    return Ok(s);
                }
                Some(b'\\') => break,
                Some(0x00..=0x1f) => return Err(self.syntax("raw control character in string")),
                Some(_) => self.pos += 1,
            }
        }
        let mut out = String::with_capacity(self.pos - start + 16);
        out.push_str(&self.text[start..self.pos]);
        loop {
            let chunk = self.pos;
            loop {
                match self.peek() {
                    None => return Err(self.syntax("unterminated string")),
                    Some(b'"' | b'\\') => break,
                    Some(0x00..=0x1f) => return Err(self.syntax("raw control character in string")),
                    Some(_) => self.pos += 1,
                }
            }
            out.push_str(&self.text[chunk..self.pos]);
            if self.peek() == Some(b'"') {
                self.pos += 1;
                return Ok(out);
            }
            self.escape(&mut out)?;
        }
    }

    /// Decodes one escape sequence starting at the backslash.
    fn escape(&mut self, out: &mut String) -> Result<(), JsonError> {
        let at = self.pos;
        self.pos += 1; // '\\'
        let c = match self.peek() {
            None => return Err(self.syntax("unterminated string")),
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                self.pos += 1;
                let unit = self.hex4(at)?;
                let c = match unit {
                    0xD800..=0xDBFF => {
                        if !self.rest().starts_with(b"\\u") {
                            return Err(self.err_at("lone_surrogate", "unpaired surrogate", at));
                        }
                        let low_at = self.pos;
                        self.pos += 2;
                        let low = self.hex4(low_at)?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return Err(self.err_at("lone_surrogate", "unpaired surrogate", at));
                        }
                        let scalar = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                        char::from_u32(scalar).expect("a surrogate pair is a scalar value")
                    }
                    0xDC00..=0xDFFF => {
                        return Err(self.err_at("lone_surrogate", "unpaired surrogate", at))
                    }
                    _ => char::from_u32(unit).expect("a non-surrogate BMP unit is a scalar"),
                };
                out.push(c);
                return Ok(());
            }
            Some(_) => return Err(self.err_at("invalid_escape", "invalid escape", at)),
        };
        self.pos += 1;
        out.push(c);
        Ok(())
    }

    /// Reads four hex digits of a `\u` escape that began at `at`.
    fn hex4(&mut self, at: usize) -> Result<u32, JsonError> {
        let mut unit = 0u32;
        for _ in 0..4 {
            let d = match self.peek() {
                Some(b @ b'0'..=b'9') => b - b'0',
                Some(b @ b'a'..=b'f') => b - b'a' + 10,
                Some(b @ b'A'..=b'F') => b - b'A' + 10,
                _ => return Err(self.err_at("invalid_escape", "invalid \\u escape", at)),
            };
            unit = (unit << 4) | u32::from(d);
            self.pos += 1;
        }
        Ok(unit)
    }

    fn digits(&mut self) -> &'a [u8] {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        &self.bytes[start..self.pos]
    }

    /// Parses a number and decides, exactly from its decimal text, whether it is an integer
    /// within ±(2^53−1).
    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.pos;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
            if self.rest().starts_with(b"Infinity") {
                return Err(self.err_at(
                    "non_finite_number",
                    "NaN and Infinity are not JSON",
                    start,
                ));
            }
        }
        let int = match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(self.syntax("leading zero in number"));
                }
                &self.bytes[self.pos - 1..self.pos]
            }
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.syntax("invalid number")),
        };
        let mut frac: &[u8] = &[];
        if self.peek() == Some(b'.') {
            self.pos += 1;
            frac = self.digits();
            if frac.is_empty() {
                return Err(self.syntax("digits expected after '.'"));
            }
        }
        let mut exponent: i64 = 0;
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            let exp_negative = match self.peek() {
                Some(b'-') => {
                    self.pos += 1;
                    true
                }
                Some(b'+') => {
                    self.pos += 1;
                    false
                }
                _ => false,
            };
            let exp = self.digits();
            if exp.is_empty() {
                return Err(self.syntax("digits expected in exponent"));
            }
            for &d in exp {
                exponent = exponent
                    .saturating_mul(10)
                    .saturating_add(i64::from(d - b'0'));
            }
            if exp_negative {
                exponent = -exponent;
            }
        }
        let exact = integer_from_parts(negative, int, frac, exponent);
        let value = match exact {
            Exact::Integer(v) => Ok(v),
            Exact::Beyond => Err("integer_out_of_range"),
            // A fraction, or a magnitude written in exponent form by JCS: the double the
            // digits round to (Rust's parse rounds correctly).
            Exact::Double => {
                let text = &self.text[start..self.pos];
                match text.parse::<f64>() {
                    Ok(0.0) => Err("number_out_of_range"),
                    Ok(f) => double_value(f),
                    Err(_) => Err("syntax"),
                }
            }
        };
        value.map_err(|code| {
            let what = match code {
                "integer_out_of_range" => "integers beyond ±(2^53−1) are sent as strings",
                "number_out_of_range" => "the number is outside the range of a 64-bit float",
                _ => "invalid number",
            };
            self.err_at(code, what, start)
        })
    }
}

/// What the digits of a number denote exactly.
enum Exact {
    /// An integer within ±(2^53−1).
    Integer(Value),
    /// An integer from 2^53 up to (not including) 10^21.
    Beyond,
    /// A number with a fraction, or of magnitude 10^21 or more: held as the nearest double.
    Double,
}

/// What `±(int.frac) × 10^exponent` denotes, decided exactly on the digits.
fn integer_from_parts(negative: bool, int: &[u8], frac: &[u8], exponent: i64) -> Exact {
    let len = int.len() + frac.len();
    let digit = |k: usize| -> u8 {
        if k < int.len() {
            int[k] - b'0'
        } else {
            frac[k - int.len()] - b'0'
        }
    };
    let Some(first) = (0..len).find(|&k| digit(k) != 0) else {
        return Exact::Integer(Value::Number(0.into()));
    };
    let last = (first..len)
        .rev()
        .find(|&k| digit(k) != 0)
        .expect("a nonzero digit exists");
    let trailing_zeros = (len - 1 - last) as i64;
    let significant = (last - first + 1) as i64;
    // value = digits[first..=last] × 10^scale
    let scale = exponent
        .saturating_sub(frac.len() as i64)
        .saturating_add(trailing_zeros);
    if scale < 0 {
        return Exact::Double;
    }
    let width = significant.saturating_add(scale);
    // 10^21 has 22 decimal digits; 2^53 − 1 has 16.
    if width >= 22 {
        return Exact::Double;
    }
    if width > 16 {
        return Exact::Beyond;
    }
    let mut magnitude: u64 = 0;
    for k in first..=last {
        magnitude = magnitude * 10 + u64::from(digit(k));
    }
    magnitude *= 10u64.pow(scale as u32);
    if magnitude > MAX_SAFE_INTEGER as u64 {
        return Exact::Beyond;
    }
    let n = magnitude as i64;
    Exact::Integer(Value::Number(if negative { -n } else { n }.into()))
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
    fn integral_floats_become_integers_and_fractions_take_the_jcs_form() {
        assert_eq!(canonical_string(&json!(1.0)).unwrap(), "1");
        assert_eq!(canonical_string(&json!(-0.0)).unwrap(), "0");
        assert_eq!(canonical_string(&json!(1.5)).unwrap(), "1.5");
        assert_eq!(canonical_string(&json!(12.5)).unwrap(), "12.5");
        assert_eq!(canonical_string(&json!(1e300)).unwrap(), "1e+300");
        assert_eq!(
            canonical_string(&json!(9_007_199_254_740_992.0_f64))
                .unwrap_err()
                .code,
            "integer_out_of_range"
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
    fn a_refusal_names_the_pointer_of_the_refused_value() {
        let e = canonical_string(&json!({"order": {"lines": [1, {"qty": 9.1e15}]}})).unwrap_err();
        assert_eq!(e.code, "integer_out_of_range");
        assert!(
            e.message.starts_with("at /order/lines/1/qty: "),
            "{}",
            e.message
        );
        let e = canonical_string(&json!({"a/b~": f64::MAX.floor() / 1e300})).map(|_| ());
        assert!(e.is_ok());
        let e = canonical_string(&json!({"a/b~": 1e17})).unwrap_err();
        assert!(e.message.starts_with("at /a~1b~0: "), "{}", e.message);
        // However deep and however long the names, the message stays short and keeps the
        // innermost part of the pointer.
        let mut v = json!({"x".repeat(100): 1e17});
        for _ in 0..20 {
            v = json!({"y".repeat(100): [v]});
        }
        let e = canonical_string(&v).unwrap_err();
        assert!(e.message.len() <= 120, "{}", e.message);
        assert!(e.message.starts_with("at …/"), "{}", e.message);
        assert!(e.message.ends_with("are sent as strings"), "{}", e.message);
    }

    #[test]
    fn the_jcs_form_of_rfc_8785s_examples() {
        // RFC 8785 appendix B, including the integral doubles the canonical form refuses
        // (their JCS text is still checked here).
        for (bits, expected) in [
            (0x0000000000000001_u64, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ] {
            let mut out = String::new();
            write_jcs_double(f64::from_bits(bits), &mut out);
            assert_eq!(out, expected, "{bits:016x}");
        }
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
