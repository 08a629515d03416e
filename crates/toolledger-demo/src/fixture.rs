//! The runtime fixture format (`toolledger.fixture/v1`): one write operation for
//! `toolledger dispatch`, `status` and `approve`. See `docs/fixture-format.md`.
//!
//! Reading is strict and happens before anything touches a database: at most 65,536 bytes,
//! UTF-8, nesting at most 32 levels (checked by a linear scan before the parser recurses), no
//! duplicate keys, no NaN/Infinity, no unknown fields at any level, typed timestamps (a
//! boolean or a string is not a timestamp), and a registered provider profile. Every refusal
//! has a stable, path-free code for the CLI's exit-2 output.

use std::io::Read;
use std::path::Path;

use serde_json::{Map, Value};
use toolledger::approval::MAX_PORTABLE_TIMESTAMP;
use toolledger::json::{self, Limits};
use toolledger::runtime::ProviderContext;

use toolledger_reference::refunds;

/// The only format this program reads.
pub const FORMAT_V1: &str = "toolledger.fixture/v1";

/// Why a fixture was refused. `code` is stable and path-free.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct FixtureError {
    /// `FIXTURE_IO_ERROR`, `FIXTURE_TOO_LARGE`, `FIXTURE_NOT_UTF8`, `FIXTURE_TOO_DEEP`,
    /// `FIXTURE_DUPLICATE_KEY`, `FIXTURE_NON_FINITE`, `FIXTURE_INVALID_JSON` or
    /// `FIXTURE_CONTRACT_ERROR`.
    pub code: &'static str,
    /// Detail for humans: never a path, and of the input only an unknown field's name, cut
    /// to [`MAX_ECHOED_CHARS`] characters.
    pub message: String,
}

/// The most characters of an unknown field's name a message repeats.
pub const MAX_ECHOED_CHARS: usize = 32;

/// `name` for a message: at most [`MAX_ECHOED_CHARS`] characters, `…` marking a cut.
fn echoed(name: &str) -> String {
    match name.char_indices().nth(MAX_ECHOED_CHARS) {
        Some((at, _)) => format!("{}…", &name[..at]),
        None => name.to_string(),
    }
}

fn contract(message: impl Into<String>) -> FixtureError {
    FixtureError {
        code: "FIXTURE_CONTRACT_ERROR",
        message: message.into(),
    }
}

/// A principal the fixture needs, created only when absent (an existing row, revoked or not,
/// is never changed: the principal store stays the authority).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetupPrincipal {
    /// Name (subject).
    pub name: String,
    /// Tenant.
    pub tenant: String,
    /// Roles granted on creation.
    pub roles: Vec<String>,
    /// Scopes granted on creation.
    pub scopes: Vec<String>,
}

/// An order the fixture needs, created only when absent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetupOrder {
    /// Order id.
    pub id: String,
    /// Tenant.
    pub tenant: String,
    /// Owner subject.
    pub owner_subject: String,
    /// Amount in cents.
    pub amount_cents: i64,
    /// Whether it may be refunded.
    pub refundable: bool,
}

/// World state a fresh database needs for the fixture.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Setup {
    /// Principals.
    pub principals: Vec<SetupPrincipal>,
    /// Orders.
    pub orders: Vec<SetupOrder>,
}

/// One parsed fixture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fixture {
    /// The injected clock (Unix seconds).
    pub now: i64,
    /// The calling principal's name.
    pub principal: String,
    /// The provider call context.
    pub provider: ProviderContext,
    /// Tool name.
    pub tool: String,
    /// The tool's arguments, exactly as the tool receives them.
    pub arguments: Value,
    /// World state to create when absent.
    pub setup: Setup,
}

fn object<'a>(
    v: &'a Value,
    what: &str,
    required: &[&str],
    optional: &[&str],
) -> Result<&'a Map<String, Value>, FixtureError> {
    let obj = v
        .as_object()
        .ok_or_else(|| contract(format!("{what} must be an object")))?;
    for k in obj.keys() {
        if !required.contains(&k.as_str()) && !optional.contains(&k.as_str()) {
            return Err(contract(format!("{what}: unknown field `{}`", echoed(k))));
        }
    }
    for k in required {
        if !obj.contains_key(*k) {
            return Err(contract(format!("{what}: missing field `{k}`")));
        }
    }
    Ok(obj)
}

fn string(obj: &Map<String, Value>, what: &str, key: &str) -> Result<String, FixtureError> {
    match obj.get(key) {
        Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= 128 => Ok(s.clone()),
        _ => Err(contract(format!(
            "{what}.{key} must be a string of 1 to 128 characters"
        ))),
    }
}

fn strings(obj: &Map<String, Value>, what: &str, key: &str) -> Result<Vec<String>, FixtureError> {
    match obj.get(key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| contract(format!("{what}.{key} must hold strings")))
            })
            .collect(),
        Some(_) => Err(contract(format!(
            "{what}.{key} must be an array of strings"
        ))),
    }
}

fn timestamp(obj: &Map<String, Value>, key: &str) -> Result<i64, FixtureError> {
    match obj.get(key) {
        // The strict parser leaves only integers; booleans and strings are not timestamps.
        Some(Value::Number(n)) => n
            .as_i64()
            .filter(|t| (0..=MAX_PORTABLE_TIMESTAMP).contains(t))
            .ok_or_else(|| contract(format!("{key} is outside the portable time range"))),
        _ => Err(contract(format!("{key} must be an integer Unix timestamp"))),
    }
}

fn provider(v: &Value) -> Result<ProviderContext, FixtureError> {
    const FIELDS: &[&str] = &[
        "provider",
        "api_family",
        "adapter_revision",
        "turn_id",
        "call_id",
        "response_id",
    ];
    let obj = object(v, "provider", FIELDS, &[])?;
    let ctx = ProviderContext {
        provider: string(obj, "provider", "provider")?,
        api_family: string(obj, "provider", "api_family")?,
        adapter_revision: string(obj, "provider", "adapter_revision")?,
        turn_id: string(obj, "provider", "turn_id")?,
        call_id: string(obj, "provider", "call_id")?,
        response_id: string(obj, "provider", "response_id")?,
    };
    if !refunds::provider_profiles().contains(&ctx.profile()) {
        return Err(contract("unregistered provider profile"));
    }
    Ok(ctx)
}

fn setup(v: Option<&Value>) -> Result<Setup, FixtureError> {
    let Some(v) = v else {
        return Ok(Setup::default());
    };
    let obj = object(v, "setup", &[], &["principals", "orders"])?;
    let mut out = Setup::default();
    let list = |key: &str| -> Result<Vec<Value>, FixtureError> {
        match obj.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => Ok(a.clone()),
            Some(_) => Err(contract(format!("setup.{key} must be an array"))),
        }
    };
    for p in list("principals")? {
        let o = object(
            &p,
            "setup.principals[]",
            &["name", "tenant"],
            &["roles", "scopes"],
        )?;
        out.principals.push(SetupPrincipal {
            name: string(o, "principal", "name")?,
            tenant: string(o, "principal", "tenant")?,
            roles: strings(o, "principal", "roles")?,
            scopes: strings(o, "principal", "scopes")?,
        });
    }
    for order in list("orders")? {
        let o = object(
            &order,
            "setup.orders[]",
            &[
                "id",
                "tenant",
                "owner_subject",
                "amount_cents",
                "refundable",
            ],
            &[],
        )?;
        let amount_cents = o
            .get("amount_cents")
            .and_then(Value::as_i64)
            .filter(|a| (1..=refunds::MAX_AMOUNT_CENTS).contains(a))
            .ok_or_else(|| contract("order.amount_cents must be an integer from 1 to 100000000"))?;
        let refundable = o
            .get("refundable")
            .and_then(Value::as_bool)
            .ok_or_else(|| contract("order.refundable must be a boolean"))?;
        out.orders.push(SetupOrder {
            id: string(o, "order", "id")?,
            tenant: string(o, "order", "tenant")?,
            owner_subject: string(o, "order", "owner_subject")?,
            amount_cents,
            refundable,
        });
    }
    Ok(out)
}

/// Parses fixture bytes (see the module docs for every check).
pub fn parse(bytes: &[u8]) -> Result<Fixture, FixtureError> {
    let value = json::parse(bytes, &Limits::FIXTURE).map_err(|e| FixtureError {
        code: match e.code {
            "too_large" => "FIXTURE_TOO_LARGE",
            "invalid_utf8" => "FIXTURE_NOT_UTF8",
            "too_deep" => "FIXTURE_TOO_DEEP",
            "duplicate_key" => "FIXTURE_DUPLICATE_KEY",
            "non_finite_number" => "FIXTURE_NON_FINITE",
            _ => "FIXTURE_INVALID_JSON",
        },
        message: e.message,
    })?;
    let obj = object(
        &value,
        "fixture",
        &[
            "format",
            "now",
            "principal",
            "provider",
            "tool",
            "arguments",
        ],
        &["setup", "description"],
    )?;
    if obj.get("format") != Some(&Value::String(FORMAT_V1.into())) {
        return Err(contract(format!("format must be \"{FORMAT_V1}\"")));
    }
    if let Some(d) = obj.get("description") {
        if !d.is_string() {
            return Err(contract("description must be a string"));
        }
    }
    let tool = string(obj, "fixture", "tool")?;
    if tool != refunds::TOOL {
        return Err(contract("unregistered tool"));
    }
    let arguments = obj.get("arguments").cloned().unwrap_or(Value::Null);
    if !arguments.is_object() {
        return Err(contract("arguments must be an object"));
    }
    Ok(Fixture {
        now: timestamp(obj, "now")?,
        principal: string(obj, "fixture", "principal")?,
        provider: provider(obj.get("provider").unwrap_or(&Value::Null))?,
        tool,
        arguments,
        setup: setup(obj.get("setup"))?,
    })
}

/// Reads and parses the fixture at `path`. At most 65,537 bytes are read, so an oversized file
/// is refused without loading it.
pub fn load(path: &Path) -> Result<Fixture, FixtureError> {
    let io = || FixtureError {
        code: "FIXTURE_IO_ERROR",
        message: "the fixture could not be read".into(),
    };
    let file = std::fs::File::open(path).map_err(|_| io())?;
    let mut bytes = Vec::new();
    file.take(Limits::FIXTURE.max_bytes as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|_| io())?;
    parse(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{
      "format": "toolledger.fixture/v1",
      "now": 1767225600,
      "principal": "alice",
      "provider": {"provider": "openai", "api_family": "responses",
                   "adapter_revision": "2026-07-01", "turn_id": "t", "call_id": "c",
                   "response_id": "r"},
      "tool": "refund_order",
      "arguments": {"idempotency_key": "k", "order_id": "o", "amount_cents": 5,
                    "approval": "approval-1"},
      "setup": {"principals": [{"name": "alice", "tenant": "acme"}],
                "orders": [{"id": "o", "tenant": "acme", "owner_subject": "alice",
                            "amount_cents": 50, "refundable": true}]}
    }"#;

    fn code(text: &str) -> &'static str {
        parse(text.as_bytes()).unwrap_err().code
    }

    #[test]
    fn a_good_fixture_parses() {
        let f = parse(GOOD.as_bytes()).unwrap();
        assert_eq!(f.now, 1_767_225_600);
        assert_eq!(f.setup.orders[0].amount_cents, 50);
        assert_eq!(f.provider.call_id, "c");
    }

    #[test]
    fn every_rejected_class_has_its_code() {
        assert_eq!(
            code(&GOOD.replacen("\"now\"", "\"now\": 1, \"now\"", 1)),
            "FIXTURE_DUPLICATE_KEY"
        );
        assert_eq!(
            code(&GOOD.replace("\"amount_cents\": 5", "\"amount_cents\": NaN")),
            "FIXTURE_NON_FINITE"
        );
        assert_eq!(
            code(&GOOD.replace("1767225600", "Infinity")),
            "FIXTURE_NON_FINITE"
        );
        assert_eq!(
            parse(&[b'{', 0xff, b'}']).unwrap_err().code,
            "FIXTURE_NOT_UTF8"
        );
        let mut big = GOOD.to_string();
        big.insert_str(1, &format!("\"description\": \"{}\",", "x".repeat(70_000)));
        assert_eq!(code(&big), "FIXTURE_TOO_LARGE");
        let deep = format!("{}{}", "[".repeat(4096), "]".repeat(4096));
        assert!(deep.len() < 65_536);
        assert_eq!(code(&deep), "FIXTURE_TOO_DEEP");
        assert_eq!(
            code(&GOOD.replace("\"tool\"", "\"extra\": 1, \"tool\"")),
            "FIXTURE_CONTRACT_ERROR"
        );
        assert_eq!(
            code(&GOOD.replace("\"turn_id\": \"t\"", "\"turn_id\": \"t\", \"x\": \"y\"")),
            "FIXTURE_CONTRACT_ERROR"
        );
        assert_eq!(
            code(&GOOD.replace("2026-07-01", "2020-01-01")),
            "FIXTURE_CONTRACT_ERROR"
        );
        assert_eq!(
            code(&GOOD.replace("1767225600", "true")),
            "FIXTURE_CONTRACT_ERROR"
        );
        assert_eq!(
            code(&GOOD.replace("1767225600", "\"1767225600\"")),
            "FIXTURE_CONTRACT_ERROR"
        );
        assert_eq!(
            code(&GOOD.replace("1767225600", "253402300800")),
            "FIXTURE_CONTRACT_ERROR"
        );
        assert_eq!(
            code(&GOOD.replace("fixture/v1", "fixture/v2")),
            "FIXTURE_CONTRACT_ERROR"
        );
        assert_eq!(
            code(&GOOD.replace("\"refundable\": true", "\"refundable\": 1")),
            "FIXTURE_CONTRACT_ERROR"
        );
        assert_eq!(code("{\"format\": "), "FIXTURE_INVALID_JSON");
    }

    /// Found by the fuzz target `fixture`: a long unknown field name was repeated whole in
    /// the message. Now a message repeats at most 32 characters of it.
    #[test]
    fn an_unknown_field_is_named_in_at_most_32_characters() {
        let name = format!("{}é{}", "a".repeat(31), "b".repeat(2000));
        let text = GOOD.replacen("\"tool\"", &format!("\"{name}\": 1, \"tool\""), 1);
        let e = parse(text.as_bytes()).unwrap_err();
        assert_eq!(e.code, "FIXTURE_CONTRACT_ERROR");
        assert_eq!(
            e.message,
            format!("fixture: unknown field `{}é…`", "a".repeat(31))
        );
        let short = GOOD.replacen("\"tool\"", "\"extra\": 1, \"tool\"", 1);
        assert_eq!(
            parse(short.as_bytes()).unwrap_err().message,
            "fixture: unknown field `extra`"
        );
    }

    /// Every cut and single-byte edit of a good fixture is refused with a documented code
    /// (the contract code exactly when the bytes are strict JSON) or is a fixture that keeps
    /// every rule (the fuzz target `fixture` explores the same with coverage guidance).
    #[test]
    fn every_cut_and_byte_edit_of_a_fixture_is_refused_with_a_code_or_valid() {
        const CODES: &[&str] = &[
            "FIXTURE_TOO_LARGE",
            "FIXTURE_NOT_UTF8",
            "FIXTURE_TOO_DEEP",
            "FIXTURE_DUPLICATE_KEY",
            "FIXTURE_NON_FINITE",
            "FIXTURE_INVALID_JSON",
            "FIXTURE_CONTRACT_ERROR",
        ];
        let good = GOOD.as_bytes();
        let mut accepted = 0;
        for i in 0..good.len() {
            let mut variants = vec![good[..i].to_vec()];
            let mut deleted = good.to_vec();
            deleted.remove(i);
            variants.push(deleted);
            for b in [b'"', b'{', b']', b'1', b'-', b'x', 0xff] {
                let mut replaced = good.to_vec();
                replaced[i] = b;
                variants.push(replaced);
            }
            for bytes in variants {
                let strict = json::parse(&bytes, &Limits::FIXTURE);
                match parse(&bytes) {
                    Ok(f) => {
                        accepted += 1;
                        assert!(strict.is_ok());
                        assert!((0..=MAX_PORTABLE_TIMESTAMP).contains(&f.now));
                        assert_eq!(f.tool, refunds::TOOL);
                        assert!(f.arguments.is_object());
                        assert!(refunds::provider_profiles().contains(&f.provider.profile()));
                        for o in &f.setup.orders {
                            assert!((1..=refunds::MAX_AMOUNT_CENTS).contains(&o.amount_cents));
                        }
                    }
                    Err(e) => {
                        assert!(CODES.contains(&e.code), "{e:?}");
                        assert_eq!(e.code == "FIXTURE_CONTRACT_ERROR", strict.is_ok(), "{e:?}");
                    }
                }
            }
        }
        // Edits inside string values (ids, names) leave valid fixtures: both sides are seen.
        assert!(accepted > 0);
    }
}
