//! Seed 000: automations with a versioned interval, changed through request-id receipts.
//!
//! Two tools, `create_automation {request_id, interval_minutes}` and
//! `set_interval {request_id, automation_id, expected_version, interval_minutes}`, run through
//! the library's [`Engine`]: the ledger's `operations` table holds the receipts, keyed by
//! (tenant = workspace, subject = principal, tool, request id). The rules, in order:
//!
//! 1. the current principal is re-read from the principal store and must hold
//!    `automation:write` (`permission_denied` otherwise);
//! 2. the arguments are validated (`invalid_arguments`): request id `[A-Za-z0-9_-]{1,64}`,
//!    positive integer ids and versions (booleans and strings are not integers), interval
//!    5–1440 minutes, no unknown or missing fields;
//! 3. inside the write transaction, *before* the receipt lookup, the principal is read again
//!    and the automation must still be in the caller's workspace (`not_found` otherwise, even
//!    with an old receipt; nothing is resurrected);
//! 4. the receipt lookup: same request id and same validated payload → the stored result,
//!    `replayed: true` (a historical result, not a fresh snapshot); same request id with
//!    another payload → `operation_conflict`;
//! 5. only for a fresh request: the version check (`version_conflict`) and the update,
//!    committed together with the receipt. A failed receipt write rolls the update back.

use std::sync::Arc;

use serde_json::{json, Map, Value};
use toolledger::authz::{resolve_in, PrincipalStore};
use toolledger::effect::{EffectTx, RowExt, SqlValue};
use toolledger::engine::{Engine, InlineCall, InlineEffect, Outcome};
use toolledger::store::Migration;
use toolledger::store::Store;
use toolledger::{Error, ErrorCode, Principal, ToolContract};

/// Migration namespace of this domain.
pub const NAMESPACE: &str = "reference.automations";

/// The `automations` table.
pub const MIGRATIONS: &[Migration] = &[Migration {
    namespace: NAMESPACE,
    version: 1,
    sql: "CREATE TABLE automations (
              id               INTEGER PRIMARY KEY,
              tenant           TEXT    NOT NULL CHECK (length(tenant) BETWEEN 1 AND 128),
              interval_minutes INTEGER NOT NULL CHECK (interval_minutes BETWEEN 5 AND 1440),
              version          INTEGER NOT NULL CHECK (version > 0)
          ) STRICT;
          CREATE INDEX automations_by_tenant ON automations(tenant);",
}];

/// The scope both tools require.
pub const SCOPE: &str = "automation:write";

/// `create_automation`.
pub const CREATE_AUTOMATION: &str = "create_automation";

/// `set_interval`.
pub const SET_INTERVAL: &str = "set_interval";

/// The tools of this domain.
pub const TOOLS: &[&str] = &[CREATE_AUTOMATION, SET_INTERVAL];

/// Contract revision of both tools.
pub const CONTRACT_REV: &str = "1";

/// Smallest accepted interval (minutes).
pub const MIN_INTERVAL: i64 = 5;

/// Largest accepted interval (minutes).
pub const MAX_INTERVAL: i64 = 1440;

/// Deadlines given to new receipts, relative to the engine clock's "now".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ToolOptions {
    /// Seconds after which a receipt grants no write, not even a replay.
    pub authority_ttl: Option<i64>,
    /// Seconds after which a receipt is no longer replayed (it stays as a tombstone).
    pub retention_ttl: Option<i64>,
}

/// Whether `tool` belongs to this domain.
pub fn is_tool(tool: &str) -> bool {
    TOOLS.contains(&tool)
}

/// The contract of `tool`, if it belongs to this domain.
pub fn contract(tool: &str) -> Option<ToolContract> {
    is_tool(tool).then(|| ToolContract::uniform(tool, CONTRACT_REV))
}

/// The JSON Schema of `tool`'s arguments, if it belongs to this domain.
pub fn input_schema(tool: &str) -> Option<Value> {
    let request_id = json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"});
    let positive =
        json!({"type": "integer", "minimum": 1, "maximum": toolledger::json::MAX_SAFE_INTEGER});
    let interval = json!({"type": "integer", "minimum": MIN_INTERVAL, "maximum": MAX_INTERVAL});
    match tool {
        CREATE_AUTOMATION => Some(json!({
            "type": "object",
            "properties": {"request_id": request_id, "interval_minutes": interval},
            "required": ["request_id", "interval_minutes"],
            "additionalProperties": false,
        })),
        SET_INTERVAL => Some(json!({
            "type": "object",
            "properties": {
                "request_id": request_id,
                "automation_id": positive,
                "expected_version": positive,
                "interval_minutes": interval,
            },
            "required": ["request_id", "automation_id", "expected_version", "interval_minutes"],
            "additionalProperties": false,
        })),
        _ => None,
    }
}

/// The JSON Schema of both tools' results (`replayed` is added to the caller-visible reply).
pub fn output_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "interval_minutes": {"type": "integer"},
            "version": {"type": "integer"},
            "replayed": {"type": "boolean"},
        },
        "required": ["id", "interval_minutes", "version", "replayed"],
    })
}

/// Runs `tool` for the principal called `principal_name` and returns the caller-visible reply:
/// `{id, interval_minutes, version, replayed}`.
pub async fn call_tool(
    engine: &Engine,
    principals: &PrincipalStore,
    principal_name: &str,
    tool: &str,
    args: Value,
) -> Result<Value, Error> {
    call_tool_with(
        engine,
        principals,
        principal_name,
        tool,
        args,
        &ToolOptions::default(),
    )
    .await
}

/// [`call_tool`] with deadlines for new receipts.
pub async fn call_tool_with(
    engine: &Engine,
    principals: &PrincipalStore,
    principal_name: &str,
    tool: &str,
    args: Value,
    options: &ToolOptions,
) -> Result<Value, Error> {
    run(engine, principals, principal_name, tool, args, options)
        .await
        .map(|o| reply(&o))
}

/// The caller-visible reply for an outcome: the stored result plus `replayed`.
pub fn reply(outcome: &Outcome) -> Value {
    let mut out = match &outcome.result {
        Value::Object(m) => m.clone(),
        other => {
            let mut m = Map::new();
            m.insert("result".into(), other.clone());
            m
        }
    };
    out.insert("replayed".into(), Value::Bool(outcome.replayed));
    Value::Object(out)
}

/// Runs `tool` and returns the engine's [`Outcome`] (with status reference and operation id).
pub async fn run(
    engine: &Engine,
    principals: &PrincipalStore,
    principal_name: &str,
    tool: &str,
    args: Value,
    options: &ToolOptions,
) -> Result<Outcome, Error> {
    let contract = contract(tool).ok_or_else(|| Error::invalid("unknown tool"))?;
    let principal = principals
        .resolve(principal_name)
        .await?
        .ok_or_else(|| Error::denied("unknown or inactive principal"))?;
    if !principal.has_scope(SCOPE) {
        return Err(Error::denied("automation:write is required"));
    }
    let request = Request::parse(tool, &args)?;
    let now = engine.clock().now();
    let call = InlineCall {
        principal,
        contract,
        key: request.request_id.clone(),
        arguments: request.payload(),
        fingerprint: None,
        authority_deadline: options.authority_ttl.map(|t| now.saturating_add(t)),
        retention_deadline: options.retention_ttl.map(|t| now.saturating_add(t)),
        shared_key_namespace: false,
    };
    let effect: Arc<dyn InlineEffect> = Arc::new(AutomationEffect {
        principal_name: principal_name.to_string(),
        action: request.action,
    });
    engine.execute_inline(call, effect).await
}

/// Inserts an automation row directly (fixtures for tests and demos). `id` `None` lets the
/// database choose. Returns the id.
pub async fn seed_automation<S: Clone + Into<Store>>(
    store: &S,
    id: Option<i64>,
    tenant: &str,
    interval_minutes: i64,
    version: i64,
) -> Result<i64, Error> {
    let tenant = tenant.to_string();
    let store: Store = store.clone().into();
    store
        .write(move |tx: &mut dyn EffectTx| {
            let row = match id {
                Some(id) => tx.query_opt(
                    "INSERT INTO automations(id, tenant, interval_minutes, version)
                     VALUES (?1, ?2, ?3, ?4) RETURNING id",
                    &[
                        id.into(),
                        tenant.as_str().into(),
                        interval_minutes.into(),
                        version.into(),
                    ],
                ),
                None => tx.query_opt(
                    "INSERT INTO automations(tenant, interval_minutes, version)
                     VALUES (?1, ?2, ?3) RETURNING id",
                    &[
                        tenant.as_str().into(),
                        interval_minutes.into(),
                        version.into(),
                    ],
                ),
            };
            row.and_then(|r| r.ok_or_else(Error::not_found)?.int(0))
                .map_err(|_| Error::invalid("automation fixture refused"))
        })
        .await
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Create {
        interval: i64,
    },
    SetInterval {
        automation_id: i64,
        expected_version: i64,
        interval: i64,
    },
}

struct Request {
    request_id: String,
    action: Action,
}

fn is_request_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn integer(v: &Value) -> Option<i64> {
    // Only JSON integers: booleans, strings and fractional numbers are not.
    match v {
        Value::Number(n) => n
            .as_i64()
            .filter(|i| i.unsigned_abs() <= toolledger::json::MAX_SAFE_INTEGER as u64),
        _ => None,
    }
}

impl Request {
    fn parse(tool: &str, args: &Value) -> Result<Self, Error> {
        let obj = args
            .as_object()
            .ok_or_else(|| Error::invalid("arguments must be a JSON object"))?;
        let allowed: &[&str] = if tool == SET_INTERVAL {
            &[
                "request_id",
                "automation_id",
                "expected_version",
                "interval_minutes",
            ]
        } else {
            &["request_id", "interval_minutes"]
        };
        if let Some(unknown) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
            let shown: String = unknown.chars().take(32).collect();
            return Err(Error::invalid(format!("unknown field {shown:?}")));
        }
        let field = |name: &str| {
            obj.get(name)
                .ok_or_else(|| Error::invalid(format!("{name} is required")))
        };
        let request_id = field("request_id")?
            .as_str()
            .filter(|s| is_request_id(s))
            .ok_or_else(|| Error::invalid("request_id must be 1-64 letters, digits, _ or -"))?
            .to_string();
        let interval = integer(field("interval_minutes")?)
            .filter(|i| (MIN_INTERVAL..=MAX_INTERVAL).contains(i))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "interval_minutes must be an integer from {MIN_INTERVAL} to {MAX_INTERVAL}"
                ))
            })?;
        let action = if tool == SET_INTERVAL {
            let positive = |name: &str| -> Result<i64, Error> {
                integer(field(name)?)
                    .filter(|i| *i >= 1)
                    .ok_or_else(|| Error::invalid(format!("{name} must be a positive integer")))
            };
            Action::SetInterval {
                automation_id: positive("automation_id")?,
                expected_version: positive("expected_version")?,
                interval,
            }
        } else {
            Action::Create { interval }
        };
        Ok(Request { request_id, action })
    }

    /// The validated payload the receipt is bound to (the request id is the key, not part of
    /// the intent).
    fn payload(&self) -> Value {
        match self.action {
            Action::Create { interval } => json!({ "interval_minutes": interval }),
            Action::SetInterval {
                automation_id,
                expected_version,
                interval,
            } => json!({
                "automation_id": automation_id,
                "expected_version": expected_version,
                "interval_minutes": interval,
            }),
        }
    }
}

struct AutomationEffect {
    principal_name: String,
    action: Action,
}

fn result_of(row: &[SqlValue]) -> Result<Value, Error> {
    let get = |i: usize| {
        row.get(i)
            .and_then(SqlValue::as_i64)
            .ok_or_else(|| Error::unavailable("automation row is malformed"))
    };
    Ok(json!({"id": get(0)?, "interval_minutes": get(1)?, "version": get(2)?}))
}

impl InlineEffect for AutomationEffect {
    fn authorize(&self, tx: &mut dyn EffectTx, principal: &Principal) -> Result<(), Error> {
        // The principal as it is inside this transaction: still active, same workspace,
        // still holding the scope.
        let current = resolve_in(tx, &self.principal_name)?;
        match current {
            Some(p) if p.tenant == principal.tenant && p.has_scope(SCOPE) => {}
            _ => return Err(Error::denied("automation:write is required")),
        }
        if let Action::SetInterval { automation_id, .. } = self.action {
            let visible = tx.query(
                "SELECT 1 FROM automations WHERE id = ?1 AND tenant = ?2",
                &[automation_id.into(), principal.tenant.as_str().into()],
            )?;
            if visible.is_empty() {
                return Err(Error::not_found());
            }
        }
        Ok(())
    }

    fn apply(&self, tx: &mut dyn EffectTx, principal: &Principal) -> Result<Value, Error> {
        let rows = match self.action {
            Action::Create { interval } => tx.query(
                "INSERT INTO automations(tenant, interval_minutes, version) VALUES (?1, ?2, 1)
                 RETURNING id, interval_minutes, version",
                &[principal.tenant.as_str().into(), interval.into()],
            )?,
            Action::SetInterval {
                automation_id,
                expected_version,
                interval,
            } => tx.query(
                "UPDATE automations SET interval_minutes = ?1, version = version + 1
                 WHERE id = ?2 AND tenant = ?3 AND version = ?4
                 RETURNING id, interval_minutes, version",
                &[
                    interval.into(),
                    automation_id.into(),
                    principal.tenant.as_str().into(),
                    expected_version.into(),
                ],
            )?,
        };
        match rows.first() {
            Some(row) => result_of(row),
            None => Err(Error::new(
                ErrorCode::VersionConflict,
                "version conflict; reload before forming a new intent",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_follows_seed_000() {
        let ok = json!({"request_id": "edit-42", "automation_id": 1, "expected_version": 1,
                        "interval_minutes": 30});
        let r = Request::parse(SET_INTERVAL, &ok).unwrap();
        assert_eq!(
            r.payload(),
            json!({"automation_id": 1, "expected_version": 1, "interval_minutes": 30})
        );
        let bad = |k: &str, v: Value| {
            let mut a = ok.clone();
            a[k] = v;
            Request::parse(SET_INTERVAL, &a).err().map(|e| e.code)
        };
        let invalid = Some(ErrorCode::InvalidArguments);
        assert_eq!(bad("automation_id", json!(true)), invalid);
        assert_eq!(bad("automation_id", json!("1 OR 1=1")), invalid);
        assert_eq!(bad("automation_id", json!(1.5)), invalid);
        assert_eq!(bad("expected_version", json!(0)), invalid);
        assert_eq!(bad("expected_version", json!(-3)), invalid);
        assert_eq!(bad("interval_minutes", json!(4)), invalid);
        assert_eq!(bad("interval_minutes", json!(1441)), invalid);
        assert_eq!(bad("interval_minutes", json!(true)), invalid);
        assert_eq!(bad("interval_minutes", json!(5)), None);
        assert_eq!(bad("interval_minutes", json!(1440)), None);
        assert_eq!(bad("request_id", json!("")), invalid);
        assert_eq!(bad("request_id", json!("x".repeat(65))), invalid);
        assert_eq!(bad("request_id", json!("x".repeat(64))), None);
        assert_eq!(bad("request_id", json!(null)), invalid);
        assert_eq!(bad("request_id", json!("unsafe key")), invalid);
        assert_eq!(bad("request_id", json!("é")), invalid);
        assert_eq!(bad("extra", json!(1)), invalid);
        assert!(Request::parse(SET_INTERVAL, &json!([])).is_err());
        assert!(Request::parse(CREATE_AUTOMATION, &ok).is_err());
        assert!(Request::parse(
            CREATE_AUTOMATION,
            &json!({"request_id": "c", "interval_minutes": 9})
        )
        .is_ok());
    }

    fn field_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-3i64..1500).prop_map(|i| json!(i)),
            any::<i64>().prop_map(|i| json!(i)),
            (-1e6f64..1e6).prop_map(|f| json!(f)),
            "[A-Za-z0-9_ -]{0,70}".prop_map(Value::String),
            Just(json!([])),
            Just(json!({})),
        ]
    }

    proptest::proptest! {
        /// Any JSON in any field: never a panic; accepted exactly when every field satisfies
        /// seed 000's rules (checked here independently of the parser).
        #[test]
        fn set_interval_validation_matches_the_rules(
            id in field_value(), target in field_value(), version in field_value(),
            minutes in field_value(), extra in proptest::option::of(field_value()),
        ) {
            let mut args = json!({"request_id": id, "automation_id": target,
                                  "expected_version": version, "interval_minutes": minutes});
            if let Some(e) = &extra {
                args["extra"] = e.clone();
            }
            let int = |v: &Value| v.as_i64().filter(|_| v.is_i64() || v.is_u64());
            let safe = |i: i64| i.unsigned_abs() <= toolledger::json::MAX_SAFE_INTEGER as u64;
            let expected = extra.is_none()
                && id.as_str().is_some_and(|s| {
                    (1..=64).contains(&s.len())
                        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                })
                && int(&target).is_some_and(|i| i >= 1 && safe(i))
                && int(&version).is_some_and(|i| i >= 1 && safe(i))
                && int(&minutes).is_some_and(|i| (5..=1440).contains(&i));
            match Request::parse(SET_INTERVAL, &args) {
                Ok(_) => proptest::prop_assert!(expected, "accepted {}", args),
                Err(e) => {
                    proptest::prop_assert!(!expected, "refused {}: {}", args, e);
                    proptest::prop_assert_eq!(e.code, ErrorCode::InvalidArguments);
                }
            }
        }
    }

    #[test]
    fn schemas_exist_for_every_tool() {
        for t in TOOLS {
            assert!(input_schema(t).is_some());
            assert_eq!(contract(t).unwrap().name, *t);
        }
        assert!(input_schema("nope").is_none());
    }
}
