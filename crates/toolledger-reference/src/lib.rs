//! toolledger-reference: the reference tool domains that `toolledger serve`, the demos and the
//! benchmarks use.
//!
//! This crate is built only on the public APIs of `toolledger` and `toolledger-mcp`, exactly as
//! a user's own server would be: nothing here reaches into a private module of the library or
//! of the binary.
//!
//! - [`automations`]: `create_automation` and `set_interval`, request-id receipts on the
//!   inline engine.
//! - [`domain`]: what every domain is built from (typed arguments, the single-round refusal,
//!   the guarded request and its receipt, the observer over a domain's effect rows).
//! - [`downstream`]: the payments service stand-in `refund_order` delivers to (receipts in a
//!   SQLite file of its own, committed apart from the ledger), which `toolledger dispatch` and
//!   `toolledger worker` drive.
//! - [`ledger`]: opening a SQLite ledger with the reference tables.
//! - [`issues`]: `create_issue`, a multi-round tool (`input_required`, or elicitation under the
//!   initialize lifecycle) with a compensated second step.
//! - [`drafts`]: `create_draft`, an inline effect that needs a human approval.
//! - [`refunds`]: `refund_order`, a deferred effect delivered through the outbox to a payments
//!   service through the deferred runtime of `toolledger`.
//! - [`tools`]: the tools a reference server offers, as `#[tool_router]` methods taking a
//!   [`toolledger_mcp::Guarded`] call and typed `Parameters`, and the fault points (a testing
//!   aid) they honour.

#![warn(missing_docs)]

use toolledger::store::Migration;

pub mod automations;
pub mod domain;
pub mod downstream;
pub mod drafts;
pub mod issues;
pub mod ledger;
pub mod refunds;
pub mod tools;

/// The reference domain's migrations, each module under its own namespace.
pub const MIGRATIONS: &[Migration] = &[
    automations::MIGRATIONS[0],
    drafts::MIGRATIONS[0],
    issues::MIGRATIONS[0],
    refunds::MIGRATIONS[0],
];

/// [`MIGRATIONS`] in PostgreSQL dialect.
pub const PG_MIGRATIONS: &[Migration] = &[
    automations::PG_MIGRATIONS[0],
    drafts::PG_MIGRATIONS[0],
    issues::PG_MIGRATIONS[0],
    refunds::PG_MIGRATIONS[0],
];

/// What `toolledger approve --tool TOOL` approves: for a reference tool that takes approvals,
/// the requester's scope `key` with the tool's binding of `arguments` (for `refund_order` the
/// business arguments `{order_id, amount_cents}` and the MCP provider context of `key`); for
/// any other tool, the intent `arguments` of a guarded tool that runs its effect with
/// `Guarded::run_approved` ([`toolledger::approval::ApprovalTarget::for_intent`]). The
/// reference tools that take none are refused.
pub fn approval_target(
    tool: &str,
    requester: &toolledger::Principal,
    key: &str,
    arguments: &serde_json::Value,
) -> Result<toolledger::approval::ApprovalTarget, toolledger::Error> {
    match tool {
        refunds::TOOL => refunds::approval_target_for(
            requester,
            key,
            arguments,
            &toolledger::runtime::ProviderContext::mcp(key),
        ),
        drafts::TOOL => drafts::approval_target_for(requester, key, arguments),
        issues::TOOL | automations::CREATE_AUTOMATION | automations::SET_INTERVAL => {
            Err(toolledger::Error::invalid("this tool takes no approvals"))
        }
        // Any other tool is a guarded tool that approves its intent
        // (`toolledger_mcp::Guarded::run_approved`): `arguments` is that intent.
        _ => toolledger::approval::ApprovalTarget::for_intent(requester, tool, key, arguments),
    }
}

/// A JSON object (a schema) as a tool definition holds it; anything else is the empty object.
pub(crate) fn object(
    v: serde_json::Value,
) -> std::sync::Arc<serde_json::Map<String, serde_json::Value>> {
    std::sync::Arc::new(match v {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    fn alice() -> toolledger::Principal {
        toolledger::Principal {
            tenant: "acme".into(),
            subject: "alice".into(),
            roles: Default::default(),
            scopes: Default::default(),
        }
    }

    #[test]
    fn approve_binds_a_user_tool_to_its_intent_and_refuses_reference_tools_without_approvals() {
        let intent = json!({"slug": "hello", "text": "Hello"});
        let target = super::approval_target("publish_post", &alice(), "post-1", &intent).unwrap();
        let expected = toolledger::approval::ApprovalTarget::for_intent(
            &alice(),
            "publish_post",
            "post-1",
            &intent,
        )
        .unwrap();
        assert_eq!(target, expected);
        assert!(target.binding["intent_digest"].is_string());
        let other = json!({"slug": "hello", "text": "Bye"});
        let changed = super::approval_target("publish_post", &alice(), "post-1", &other).unwrap();
        assert_ne!(changed.digest().unwrap(), target.digest().unwrap());
        for tool in [super::issues::TOOL, super::automations::SET_INTERVAL] {
            let refused = super::approval_target(tool, &alice(), "k", &intent).unwrap_err();
            assert_eq!(refused.code, toolledger::model::ErrorCode::InvalidArguments);
        }
    }
}
