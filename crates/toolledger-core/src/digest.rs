//! The digests that bind an operation: the request digest (business intent,
//! excludes the idempotency key), the call binding digest (provider call identity, key,
//! contract and downstream evidence), the result digest, and the keyed fingerprint of one
//! logical MCP request.
//!
//! Every digest is lowercase hex of SHA-256 over canonical JSON (see [`crate::json`]), so
//! another implementation that follows these rules (docs/contract.md) computes the same bytes. The exact object
//! hashed is written down on each function; the test vectors in
//! `tests/vectors/digests.json` were produced by an independent implementation.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::json::{self, write_canonical, write_canonical_str, JsonError, Limits};
use crate::model::ToolContract;

/// Why a digest could not be computed. The `code` is stable; the message never contains the
/// key and at most a short excerpt of the input.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct DigestError {
    /// Stable short code: `key_too_short`, `invalid_key_hex`, `invalid_input`, or a
    /// [`JsonError`] code such as `non_integral_number`.
    pub code: &'static str,
    /// Human-readable detail.
    pub message: String,
}

impl DigestError {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        DigestError {
            code,
            message: message.into(),
        }
    }
}

impl From<JsonError> for DigestError {
    fn from(e: JsonError) -> Self {
        DigestError {
            code: e.code,
            message: e.message,
        }
    }
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex_lower(&Sha256::digest(bytes))
}

/// Lowercase hex of `bytes`, written through a lookup table into one allocation (the digests
/// are on every call's path; `hex::encode` goes through a `char` iterator).
pub fn hex_lower(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(HEX[usize::from(b >> 4)]);
        out.push(HEX[usize::from(b & 0x0f)]);
    }
    // Only ASCII hex digits were written.
    String::from_utf8(out).unwrap_or_default()
}

/// Writes one canonical JSON object whose keys the caller supplies in sorted order (checked in
/// debug builds), without building an intermediate `Value`.
struct ObjectWriter<'a> {
    out: &'a mut String,
    last: Option<&'static str>,
}

impl<'a> ObjectWriter<'a> {
    fn new(out: &'a mut String) -> Self {
        out.push('{');
        ObjectWriter { out, last: None }
    }

    fn key(&mut self, key: &'static str) {
        debug_assert!(
            self.last
                .is_none_or(|last| last.as_bytes() < key.as_bytes()),
            "keys out of canonical order"
        );
        if self.last.is_some() {
            self.out.push(',');
        }
        self.last = Some(key);
        write_canonical_str(key, self.out);
        self.out.push(':');
    }

    fn str(&mut self, key: &'static str, value: &str) {
        self.key(key);
        write_canonical_str(value, self.out);
    }

    fn opt(&mut self, key: &'static str, value: Option<&str>) {
        match value {
            Some(v) => self.str(key, v),
            None => {
                self.key(key);
                self.out.push_str("null");
            }
        }
    }

    fn value(&mut self, key: &'static str, value: &Value) -> Result<(), JsonError> {
        self.key(key);
        write_canonical(value, self.out)
    }

    /// A member whose value is already canonical JSON text.
    fn canonical(&mut self, key: &'static str, text: &str) {
        self.key(key);
        self.out.push_str(text);
    }

    fn contract(&mut self, key: &'static str, c: &ToolContract) {
        self.key(key);
        let mut inner = ObjectWriter::new(self.out);
        inner.str("effect_rev", &c.effect_rev);
        inner.str("handler_rev", &c.handler_rev);
        inner.str("input_rev", &c.input_rev);
        inner.str("name", &c.name);
        inner.str("output_rev", &c.output_rev);
        inner.str("policy_rev", &c.policy_rev);
        inner.str("producer_rev", &c.producer_rev);
        inner.finish();
    }

    fn finish(self) {
        self.out.push('}');
    }
}

/// The canonical JSON the request digest hashes:
///
/// ```json
/// {"arguments":ARGS,"effect_rev":E,"input_rev":I,"output_rev":O,
///  "subject":SUBJECT,"tenant":TENANT,"tool":CONTRACT_NAME}
/// ```
///
/// (one line, no whitespace, keys in this order). The idempotency key is not part of it.
pub fn request_canonical(
    tenant: &str,
    subject: &str,
    contract: &ToolContract,
    arguments: &Value,
) -> Result<String, JsonError> {
    let mut out = String::with_capacity(160);
    let mut w = ObjectWriter::new(&mut out);
    w.value("arguments", arguments)?;
    request_members(&mut w, tenant, subject, contract);
    w.finish();
    Ok(out)
}

/// The members of [`request_canonical`] after `arguments`.
fn request_members(w: &mut ObjectWriter<'_>, tenant: &str, subject: &str, contract: &ToolContract) {
    w.str("effect_rev", &contract.effect_rev);
    w.str("input_rev", &contract.input_rev);
    w.str("output_rev", &contract.output_rev);
    w.str("subject", subject);
    w.str("tenant", tenant);
    w.str("tool", &contract.name);
}

/// [`request_digest`] of arguments given as their canonical text (what
/// [`json::canonical_string`] made of them), which is not encoded again.
pub(crate) fn request_digest_of_canonical(
    tenant: &str,
    subject: &str,
    contract: &ToolContract,
    arguments_text: &str,
) -> String {
    let mut out = String::with_capacity(160 + arguments_text.len());
    let mut w = ObjectWriter::new(&mut out);
    w.canonical("arguments", arguments_text);
    request_members(&mut w, tenant, subject, contract);
    w.finish();
    sha256_hex(out.as_bytes())
}

/// The request digest: lowercase hex SHA-256 of [`request_canonical`], i.e. of the canonical
/// JSON object `{"tenant","subject","tool","arguments","input_rev","output_rev","effect_rev"}`
/// (`tool` is the contract's name). It is the business intent only: the idempotency key, the
/// handler/producer/policy revisions and any provider identity are excluded, so a retry under
/// a new key has the same request digest. Fails only when `arguments` lie outside the
/// canonical domain.
pub fn request_digest(
    tenant: &str,
    subject: &str,
    contract: &ToolContract,
    arguments: &Value,
) -> Result<String, JsonError> {
    Ok(sha256_hex(
        request_canonical(tenant, subject, contract, arguments)?.as_bytes(),
    ))
}

/// The result digest: lowercase hex SHA-256 of the canonical JSON of `result`.
pub fn result_digest(result: &Value) -> Result<String, JsonError> {
    let mut out = String::with_capacity(128);
    write_canonical(result, &mut out)?;
    Ok(sha256_hex(out.as_bytes()))
}

/// Everything the call binding digest binds: the provider call identity, the operation and its
/// idempotency key, the full tool contract, the request and result digests, and the
/// downstream references. Absent optional values are hashed as `null`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallBinding {
    /// Provider that issued the call (e.g. `mcp`, a model vendor).
    pub provider: String,
    /// API family of the provider (e.g. `tools/call`, `responses`).
    pub api_family: String,
    /// Revision of the adapter that translated the provider call.
    pub adapter_rev: String,
    /// Provider turn id, when the provider has turns.
    pub turn_id: Option<String>,
    /// Provider call id (for MCP the JSON-RPC request id, as a string).
    pub call_id: String,
    /// Provider response id, when there is one.
    pub response_id: Option<String>,
    /// Ledger operation id.
    pub operation_id: String,
    /// Idempotency key of the scope.
    pub idempotency_key: String,
    /// The tool contract with all six revisions.
    pub contract: ToolContract,
    /// The request digest ([`request_digest`]).
    pub request_digest: String,
    /// The result digest ([`result_digest`]), once there is a result.
    pub result_digest: Option<String>,
    /// Reference of the request sent downstream (deferred effects).
    pub downstream_request_ref: Option<String>,
    /// Reference of the downstream receipt.
    pub downstream_receipt_ref: Option<String>,
    /// Reference a downstream status query uses.
    pub downstream_status_ref: Option<String>,
}

impl CallBinding {
    /// The canonical JSON the call binding digest hashes:
    ///
    /// ```json
    /// {"adapter_rev":_,"api_family":_,"call_id":_,
    ///  "contract":{"effect_rev":_,"handler_rev":_,"input_rev":_,"name":_,
    ///              "output_rev":_,"policy_rev":_,"producer_rev":_},
    ///  "downstream_receipt_ref":_|null,"downstream_request_ref":_|null,
    ///  "downstream_status_ref":_|null,"idempotency_key":_,"operation_id":_,"provider":_,
    ///  "request_digest":_,"response_id":_|null,"result_digest":_|null,"turn_id":_|null}
    /// ```
    ///
    /// (one line, no whitespace, keys in this order).
    pub fn canonical(&self) -> String {
        let mut out = String::with_capacity(512);
        let mut w = ObjectWriter::new(&mut out);
        w.str("adapter_rev", &self.adapter_rev);
        w.str("api_family", &self.api_family);
        w.str("call_id", &self.call_id);
        w.contract("contract", &self.contract);
        w.opt(
            "downstream_receipt_ref",
            self.downstream_receipt_ref.as_deref(),
        );
        w.opt(
            "downstream_request_ref",
            self.downstream_request_ref.as_deref(),
        );
        w.opt(
            "downstream_status_ref",
            self.downstream_status_ref.as_deref(),
        );
        w.str("idempotency_key", &self.idempotency_key);
        w.str("operation_id", &self.operation_id);
        w.str("provider", &self.provider);
        w.str("request_digest", &self.request_digest);
        w.opt("response_id", self.response_id.as_deref());
        w.opt("result_digest", self.result_digest.as_deref());
        w.opt("turn_id", self.turn_id.as_deref());
        w.finish();
        out
    }
}

/// The call binding digest: lowercase hex SHA-256 of [`CallBinding::canonical`]. Unlike the
/// request digest it includes the idempotency key, so a legal package moved onto another key
/// or call no longer verifies.
///
/// Returns a `Result` so the signature stays stable if the binding ever carries JSON values;
/// today every field is a string and it cannot fail.
pub fn call_binding_digest(binding: &CallBinding) -> Result<String, JsonError> {
    Ok(sha256_hex(binding.canonical().as_bytes()))
}

/// The secret key of the fingerprint: at least [`FingerprintKey::MIN_LEN`] bytes, no default.
/// `Debug` never prints it.
#[derive(Clone)]
pub struct FingerprintKey {
    mac: Hmac<Sha256>,
}

impl FingerprintKey {
    /// The shortest accepted key, in bytes.
    pub const MIN_LEN: usize = 32;

    /// A key from raw bytes; fewer than [`Self::MIN_LEN`] bytes → `key_too_short`.
    pub fn from_bytes(key: &[u8]) -> Result<Self, DigestError> {
        if key.len() < Self::MIN_LEN {
            return Err(DigestError::new(
                "key_too_short",
                format!(
                    "the fingerprint key has {} bytes, at least {} are required",
                    key.len(),
                    Self::MIN_LEN
                ),
            ));
        }
        let mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
            .map_err(|_| DigestError::new("invalid_key", "the key was refused"))?;
        Ok(FingerprintKey { mac })
    }

    /// A key from hex (either case, no whitespace); not hex → `invalid_key_hex`, fewer than
    /// [`Self::MIN_LEN`] bytes → `key_too_short`.
    pub fn from_hex(key_hex: &str) -> Result<Self, DigestError> {
        let bytes = hex::decode(key_hex).map_err(|_| {
            DigestError::new(
                "invalid_key_hex",
                "the fingerprint key is not an even-length hex string",
            )
        })?;
        Self::from_bytes(&bytes)
    }

    /// `H(name, v) = hex(HMAC-SHA256(key, utf8(name) ‖ 0x00 ‖ canonical(v)))`, with an absent
    /// `v` hashed as `null`.
    pub fn keyed_digest(&self, name: &str, value: Option<&Value>) -> Result<String, JsonError> {
        let mut text = String::with_capacity(64);
        match value {
            Some(v) => write_canonical(v, &mut text)?,
            None => text.push_str("null"),
        }
        let mut mac = self.mac.clone();
        mac.update(name.as_bytes());
        mac.update(&[0]);
        mac.update(text.as_bytes());
        Ok(hex_lower(&mac.finalize().into_bytes()))
    }
}

impl fmt::Debug for FingerprintKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FingerprintKey(<redacted>)")
    }
}

/// One logical MCP request, as `toolledger fingerprint` reads it:
/// `{"principal":S,"tool_id":S,"tool_version":S,"arguments":V,"continuation_state":V?,
/// "input_responses":V?}`. Unknown fields are refused; an absent or `null`
/// `continuation_state`/`input_responses` is `None` and hashed as `null`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FingerprintInput {
    /// The trusted caller.
    pub principal: String,
    /// Tool name.
    pub tool_id: String,
    /// Tool version.
    pub tool_version: String,
    /// Tool arguments (any JSON value in the canonical domain; MCP sends an object).
    pub arguments: Value,
    /// Opaque continuation state, if any.
    #[serde(default)]
    pub continuation_state: Option<Value>,
    /// Input responses, if any.
    #[serde(default)]
    pub input_responses: Option<Value>,
}

const FINGERPRINT_FIELDS: [&str; 6] = [
    "principal",
    "tool_id",
    "tool_version",
    "arguments",
    "continuation_state",
    "input_responses",
];

fn excerpt(s: &str) -> String {
    const MAX: usize = 24;
    if s.chars().count() <= MAX {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{head:?}…")
    }
}

impl FingerprintInput {
    /// Reads the input from one strictly parsed JSON object. Errors (`invalid_input`) name the
    /// offending field, quoting at most a short excerpt of an unknown field's name.
    pub fn from_value(value: Value) -> Result<Self, DigestError> {
        let Value::Object(mut map) = value else {
            return Err(DigestError::new(
                "invalid_input",
                "the request must be a JSON object",
            ));
        };
        if let Some(unknown) = map
            .keys()
            .find(|k| !FINGERPRINT_FIELDS.contains(&k.as_str()))
        {
            return Err(DigestError::new(
                "invalid_input",
                format!("unknown field {}", excerpt(unknown)),
            ));
        }
        let mut string = |name: &str| match map.remove(name) {
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(DigestError::new(
                "invalid_input",
                format!("field \"{name}\" must be a string"),
            )),
            None => Err(DigestError::new(
                "invalid_input",
                format!("missing field \"{name}\""),
            )),
        };
        let principal = string("principal")?;
        let tool_id = string("tool_id")?;
        let tool_version = string("tool_version")?;
        let arguments = map
            .remove("arguments")
            .ok_or_else(|| DigestError::new("invalid_input", "missing field \"arguments\""))?;
        let optional = |v: Option<Value>| v.filter(|v| !v.is_null());
        Ok(FingerprintInput {
            principal,
            tool_id,
            tool_version,
            arguments,
            continuation_state: optional(map.remove("continuation_state")),
            input_responses: optional(map.remove("input_responses")),
        })
    }

    /// Parses one JSON document strictly (see [`json::parse`]) and reads the input from it.
    pub fn from_json(bytes: &[u8], limits: &Limits) -> Result<Self, DigestError> {
        Self::from_value(json::parse(bytes, limits)?)
    }
}

/// The keyed fingerprint:
/// `hex(SHA-256(canonical({principal, tool_id, tool_version, arguments,
/// continuation_state: H("continuation_state", cs), input_responses: H("input_responses", ir)})))`
/// with `H` = [`FingerprintKey::keyed_digest`]. Fails when a value lies outside the canonical
/// domain (for example a fractional number in a hand-built `Value`).
pub fn fingerprint(key: &FingerprintKey, input: &FingerprintInput) -> Result<String, DigestError> {
    let cs = key.keyed_digest("continuation_state", input.continuation_state.as_ref())?;
    let ir = key.keyed_digest("input_responses", input.input_responses.as_ref())?;
    let mut out = String::with_capacity(256);
    let mut w = ObjectWriter::new(&mut out);
    w.value("arguments", &input.arguments)?;
    w.str("continuation_state", &cs);
    w.str("input_responses", &ir);
    w.str("principal", &input.principal);
    w.str("tool_id", &input.tool_id);
    w.str("tool_version", &input.tool_version);
    w.finish();
    Ok(sha256_hex(out.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KAT_KEY: &[u8; 32] = b"test-only-cross-language-key-32b";

    #[test]
    fn hex_lower_matches_the_hex_crate() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(hex_lower(&bytes), hex::encode(&bytes));
        assert_eq!(hex_lower(&[]), "");
    }

    #[test]
    fn documented_known_answer() {
        let key = FingerprintKey::from_bytes(KAT_KEY).unwrap();
        let input = FingerprintInput::from_json(
            br#"{"principal":"alice","tool_id":"create_issue","tool_version":"1.0","arguments":{"title":"spec"},"continuation_state":"awaiting-body","input_responses":{"body":{"action":"accept","content":{"body":"alpha"}}}}"#,
            &Limits::DEFAULT,
        )
        .unwrap();
        assert_eq!(
            fingerprint(&key, &input).unwrap(),
            "8053811d58bacfa928adfe862a3e1bda8040d18feef86b1b6eca9cd807c2cd97"
        );
    }

    #[test]
    fn object_writer_matches_the_value_encoder() {
        let c = ToolContract {
            name: "t".into(),
            input_rev: "i".into(),
            output_rev: "o".into(),
            effect_rev: "e".into(),
            handler_rev: "h".into(),
            producer_rev: "p".into(),
            policy_rev: "y".into(),
        };
        let args = json!({"b": [1, "\u{1F600}"], "a": null});
        let expected = json::canonical_string(&json!({
            "tenant": "T", "subject": "S", "tool": "t", "arguments": args,
            "input_rev": "i", "output_rev": "o", "effect_rev": "e",
        }))
        .unwrap();
        assert_eq!(request_canonical("T", "S", &c, &args).unwrap(), expected);
    }
}
