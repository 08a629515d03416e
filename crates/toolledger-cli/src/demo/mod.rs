//! The demos `toolledger demo` runs and what they need, apart from the command files: each
//! demo starts real server processes of this same binary and checks what a client sees.
//!
//! - [`lost_reply`]: `demo lost-reply`, README's main job: a reply lost on the way back,
//!   recovered by a retry that replays and a status query, on SQLite or PostgreSQL;
//! - [`proxy`]: `demo proxy`: a lost charge reply without and through `toolledger proxy`;
//! - [`agent`]: `demo agent`: an agent that dies mid-call and resumes from its journal, and a
//!   model's re-plan after a lost reply, with the ledger and without;
//! - [`session`]: the demos' raw stdio client of a server process;
//! - [`upstream`]: `toolledger upstream-example` (hidden), the small unguarded MCP server with
//!   a charge side effect that the proxy's demo and benchmark put the proxy in front of.

pub mod agent;
pub mod lost_reply;
pub mod proxy;
pub mod session;
pub mod upstream;
