//! Builders for the calls tests make: a bare principal and an inline call with every option
//! left at its default.

use std::collections::BTreeSet;

use serde_json::Value;
use toolledger::engine::InlineCall;
use toolledger::model::{Principal, ToolContract};

/// A principal with no roles or scopes.
pub fn principal(tenant: &str, subject: &str) -> Principal {
    Principal {
        tenant: tenant.into(),
        subject: subject.into(),
        roles: BTreeSet::new(),
        scopes: BTreeSet::new(),
    }
}

/// An inline call of `tool` (contract revision `1`) by `principal` under `key`: no fingerprint,
/// no deadlines, keys per principal.
pub fn inline_call(principal: &Principal, tool: &str, key: &str, arguments: Value) -> InlineCall {
    InlineCall {
        principal: principal.clone(),
        contract: ToolContract::uniform(tool, "1"),
        key: key.into(),
        arguments,
        fingerprint: None,
        authority_deadline: None,
        retention_deadline: None,
        shared_key_namespace: false,
    }
}
