//! The reference tools: the domains the reference MCP server and the demos use. They use only
//! the public API of the `toolledger` library, exactly as a user's own server would.

use toolledger::store::Migration;

pub mod automations;
pub mod issues;
pub mod tools;

/// The reference domain's migrations, each module under its own namespace.
pub const MIGRATIONS: &[Migration] = &[automations::MIGRATIONS[0], issues::MIGRATIONS[0]];
