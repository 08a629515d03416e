//! Where a call's operation id (its idempotency key) may travel, and how a caller says a call
//! is a new intent.
//!
//! A guarded call names its operation by any of four carriers:
//!
//! | carrier | where |
//! |---|---|
//! | the argument | the tool's key argument (`operation_id`, or the property its input schema marks `"x-toolledger-key": true`) |
//! | `_meta` | `params._meta["io.toolledger/operation_id"]` |
//! | `params.idempotencyKey` | a string member of the `tools/call` params |
//! | the `Idempotency-Key` header | on the HTTP listeners |
//!
//! The strict wire entry moves `params.idempotencyKey` and the header into the request's
//! `_meta` under [`META_PARAMS_KEY`] and [`META_HEADER_KEY`] (rmcp keeps no member it does not
//! know), so every route sees all four in the same place. [`carried_key`] reads them: the
//! same value in several is one key; two that differ are `invalid_arguments` naming both; a
//! call that carries the key elsewhere needs no argument (the guard puts it into the
//! arguments before they are validated).
//!
//! `_meta["io.toolledger/new_intent"]: true` ([`META_NEW_INTENT`]) tells the re-plan guard
//! this call is another intent even if it equals an earlier, unsettled operation.
//!
//! What is accepted is advertised as the experimental capability
//! `io.toolledger/idempotency` ([`capability`]).

use rmcp::model::{JsonObject, RequestMetaObject};
use serde_json::{json, Value};
use toolledger::model::Error;

/// The `_meta` key a client names the operation by.
pub const META_OPERATION_ID: &str = "io.toolledger/operation_id";
/// The `_meta` key the wire entry moves `params.idempotencyKey` to.
pub const META_PARAMS_KEY: &str = "io.toolledger/params_idempotency_key";
/// The `_meta` key the HTTP front moves the `Idempotency-Key` header to.
pub const META_HEADER_KEY: &str = "io.toolledger/idempotency_key_header";
/// The `_meta` key by which a caller says a call is a new intent (`true`).
pub const META_NEW_INTENT: &str = "io.toolledger/new_intent";
/// The name of the experimental capability that advertises the carriers.
pub const CAPABILITY: &str = "io.toolledger/idempotency";
/// The schema keyword that marks a tool's key argument (when it is not `operation_id`).
pub const KEY_KEYWORD: &str = "x-toolledger-key";
/// The longest operation id, in characters.
pub const MAX_KEY_CHARS: usize = 256;

/// The experimental capability `io.toolledger/idempotency`: which carriers a server reads,
/// the `_meta` keys, and that it guards re-plans.
pub fn capability() -> JsonObject {
    let value = json!({
        "carriers": ["argument", "_meta", "params.idempotencyKey", "Idempotency-Key"],
        "metaKey": META_OPERATION_ID,
        "newIntentMetaKey": META_NEW_INTENT,
        "replanGuard": true,
    });
    match value {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    }
}

/// Whether the request's `_meta` says the call is a new intent.
pub fn new_intent(meta: Option<&RequestMetaObject>) -> bool {
    meta.and_then(|m| m.get(META_NEW_INTENT)) == Some(&Value::Bool(true))
}

/// The name of the argument that carries a tool's key in `schema` (its input schema): the
/// property marked `"x-toolledger-key": true`, else `operation_id` when the schema has it.
pub fn key_argument(schema: &JsonObject) -> Option<String> {
    let properties = schema.get("properties")?.as_object()?;
    properties
        .iter()
        .find(|(_, p)| p.get(KEY_KEYWORD) == Some(&Value::Bool(true)))
        .map(|(name, _)| name.clone())
        .or_else(|| {
            properties
                .contains_key("operation_id")
                .then(|| "operation_id".to_string())
        })
}

/// The key a call carries outside its arguments, and where: `_meta`, `params.idempotencyKey`
/// or the `Idempotency-Key` header. `argument` is the value of the key argument, if the
/// call has one (named `argument_name`). `Ok(None)` when no carrier outside the arguments
/// has one; `invalid_arguments` when two carriers disagree or one is not a usable key.
pub fn carried_key(
    meta: Option<&RequestMetaObject>,
    argument_name: &str,
    argument: Option<&Value>,
) -> Result<Option<String>, Error> {
    // The common case — the key in the argument only — costs three lookups and nothing else.
    let carried = |m: &RequestMetaObject| {
        [META_OPERATION_ID, META_PARAMS_KEY, META_HEADER_KEY]
            .iter()
            .any(|k| m.contains_key(*k))
    };
    if !meta.is_some_and(carried) {
        return match argument {
            None => Ok(None),
            Some(Value::String(k)) if !k.is_empty() && k.chars().count() <= MAX_KEY_CHARS => {
                Ok(None)
            }
            Some(v) => usable(v, &format!("the argument {argument_name}")).map(|_| None),
        };
    }
    let mut seen: Vec<(String, String)> = Vec::new();
    if let Some(v) = argument {
        seen.push((
            format!("the argument {argument_name}"),
            usable(v, argument_name)?,
        ));
    }
    let mut outside = None;
    if let Some(meta) = meta {
        for (key, carrier) in [
            (META_OPERATION_ID, "_meta[\"io.toolledger/operation_id\"]"),
            (META_PARAMS_KEY, "params.idempotencyKey"),
            (META_HEADER_KEY, "the Idempotency-Key header"),
        ] {
            if let Some(v) = meta.get(key) {
                let k = usable(v, carrier)?;
                outside.get_or_insert_with(|| k.clone());
                seen.push((carrier.to_string(), k));
            }
        }
    }
    if let Some((first, first_key)) = seen.first() {
        if let Some((other, _)) = seen.iter().find(|(_, k)| k != first_key) {
            return Err(Error::invalid(format!(
                "{first} and {other} carry different operation ids; send one, or the same in \
                 each"
            )));
        }
    }
    Ok(outside)
}

/// `v` as an operation id: a string of 1 to [`MAX_KEY_CHARS`] characters.
fn usable(v: &Value, carrier: &str) -> Result<String, Error> {
    match v {
        Value::String(s) if !s.is_empty() && s.chars().count() <= MAX_KEY_CHARS => Ok(s.clone()),
        _ => Err(Error::invalid(format!(
            "{carrier}: the operation id must be a string of 1 to {MAX_KEY_CHARS} characters"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, Value)]) -> RequestMetaObject {
        let mut m = RequestMetaObject::default();
        for (k, v) in pairs {
            m.insert((*k).into(), v.clone());
        }
        m
    }

    #[test]
    fn every_carrier_is_read_and_two_that_disagree_are_named() {
        let k = |s: &str| Value::String(s.into());
        assert_eq!(carried_key(None, "operation_id", Some(&k("a"))), Ok(None));
        for key in [META_OPERATION_ID, META_PARAMS_KEY, META_HEADER_KEY] {
            let m = meta(&[(key, k("op-1"))]);
            assert_eq!(
                carried_key(Some(&m), "operation_id", None),
                Ok(Some("op-1".into()))
            );
            assert_eq!(
                carried_key(Some(&m), "operation_id", Some(&k("op-1"))),
                Ok(Some("op-1".into()))
            );
            let e = carried_key(Some(&m), "operation_id", Some(&k("op-2"))).unwrap_err();
            assert!(e.message.contains("the argument operation_id"), "{e}");
        }
        let m = meta(&[(META_PARAMS_KEY, k("a")), (META_HEADER_KEY, k("b"))]);
        let e = carried_key(Some(&m), "operation_id", None).unwrap_err();
        assert!(e.message.contains("params.idempotencyKey"), "{e}");
        assert!(e.message.contains("Idempotency-Key header"), "{e}");
        let bad = meta(&[(META_PARAMS_KEY, json!(7))]);
        assert!(carried_key(Some(&bad), "operation_id", None).is_err());
        assert!(new_intent(Some(&meta(&[(META_NEW_INTENT, json!(true))]))));
        assert!(!new_intent(Some(&meta(&[(META_NEW_INTENT, json!("yes"))]))));
    }

    #[test]
    fn the_key_argument_is_marked_or_named_operation_id() {
        let schema = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            key_argument(&schema(
                json!({"properties": {"operation_id": {}, "x": {}}})
            )),
            Some("operation_id".into())
        );
        assert_eq!(
            key_argument(&schema(
                json!({"properties": {"request_id": {"x-toolledger-key": true}, "operation_id": {}}})
            )),
            Some("request_id".into())
        );
        assert_eq!(
            key_argument(&schema(json!({"properties": {"x": {}}}))),
            None
        );
    }
}
