//! The reference tools: the domains the reference MCP server and the demos use. They use only
//! the public API of the `toolledger` library, exactly as a user's own server would.

use toolledger::store::Migration;

pub mod automations;
pub mod drafts;
pub mod issues;
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

/// What `toolledger approve --tool TOOL` approves for a reference tool that takes approvals:
/// the requester's scope `key` with the tool's binding of `arguments` (for `refund_order` the
/// business arguments `{order_id, amount_cents}` and the MCP provider context of `key`).
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
        _ => Err(toolledger::Error::invalid("this tool takes no approvals")),
    }
}
