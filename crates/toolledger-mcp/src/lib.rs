//! toolledger-mcp: guard side-effecting rmcp tools with the toolledger ledger.
//!
//! A retry with the same operation id replays the stored result instead of repeating the
//! effect; a lost reply becomes a `get_operation_status` query, never a second effect.
//!
//! Guarding an ordinary rmcp server (everything below but rmcp's own items is in
//! [`prelude`]):
//! - [`LedgerGuardBuilder::from_env`] and [`LedgerGuard::serve_stdio`]: a whole stdio server,
//!   configured as the `toolledger` binary is (`examples/guarded_tool.rs`: 30 lines of code).
//! - [`LedgerGuard`] (built by [`LedgerGuard::builder`]): opens the ledger — a SQLite file, or
//!   PostgreSQL for a `postgres://` URL (feature `postgres`) — with the application's own
//!   portable migrations, or takes a store the application opened
//!   ([`LedgerGuardBuilder::store`]); loads the keys and binds them to the ledger, and fixes
//!   where callers come from (a configured principal on stdio, bearer tokens over HTTP).
//! - [`Guarded`]: an rmcp extractor. A guarded tool is a plain `#[tool]` method taking typed
//!   `Parameters<T>` and `g: Guarded`; `g.run(operation_id, intent, effect)` runs the effect
//!   under the ledger and answers a [`Receipt`] (output schema from its result type) or a
//!   [`Refusal`] in-band. [`Guarded::ask`]/[`Guarded::run_answered`] make it multi-round.
//! - [`status_router`]: `get_operation_status` as an rmcp router, added once.
//! - [`Guarded::dispatch`] and [`Guarded::deliver`]: deferred tools, whose effect is delivered
//!   through the outbox to a downstream system (or an external API's call) by the runtime
//!   ([`toolledger::runtime::Runtime`]), answered in-band as a [`DeferredReply`]; see
//!   [`deferred`].
//! - [`LedgerGuard::router`]: wraps the combined router once; validates every call's
//!   arguments against the tool's input schema before anything is fingerprinted or written
//!   ([`LedgerGuard::router_unchecked`] for tools that judge their own arguments).
//! - [`GuardedServer`]: an rmcp `ServerHandler` over a wrapped router, for servers whose tools
//!   are routes rather than `#[tool_handler]` methods — [`call_route`] makes a route whose
//!   handler takes the whole [`ToolCall`] (tools known only at run time, like a proxy's).
//!
//! The underlying pieces:
//! - [`Guard`]: fingerprint, deadlines and the engine call for one guarded request (what
//!   [`LedgerGuard::guard`] hands out), configured by [`GuardConfig`].
//! - [`status::StatusTool`]: the read-only `get_operation_status` tool.
//! - [`caller::CallerSource`]: who calls — trusted configuration on stdio, bearer tokens over
//!   HTTP via [`caller::bearer_auth`]; re-read from the principal store on every call.
//! - [`KeyMaterial`]: the state and fingerprint keys from the environment or a 0600 key file
//!   beside the database; a server with other keys than the database was written with refuses
//!   to start ([`KeyError`]).
//! - [`error_of`]: the ledger's error object of an in-band tool result, for a client.
//! - For tools that shape their own answers (routes of [`call_route`], like the proxy's
//!   forwards): [`reply`] (in-band results and errors, [`reply::respond`]),
//!   [`guard::GuardedRequest`], [`guard::arguments_digest`] and [`guard::outcome_json`],
//!   [`StateSealer`] (the sealed `requestState` of [`Guard::sealer`]),
//!   [`guarded::check_arguments`] and [`caller::revoked`].
//! - [`wire`]: the strict wire entry of a server: every incoming message checked with the
//!   ledger's strict JSON rules before rmcp reads it, every refused one answered with a
//!   JSON-RPC error — [`wire::StdioTransport`] for stdio (serve a guarded server with
//!   `server.serve(wire::stdio::stdio())`), axum middleware for HTTP (`wire::http`).
//! - `front` (feature `http`): the whole `/mcp` service of an HTTP server in one builder —
//!   Host/Origin, bearer tokens, the strict body, in-flight and connection limits, sessions,
//!   health routes — around any rmcp `ServerHandler`.
//!
//! Features: `http` (the streamable HTTP front: axum and hyper), `postgres` (a `postgres://`
//! ledger). Without either, a guard on a SQLite file served over stdio.

#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod caller;
pub mod carriers;
pub mod deferred;
#[cfg(feature = "http")]
pub mod front;
pub mod guard;
pub mod guarded;
mod keys;
pub mod ledger;
mod observe;
pub mod reply;
pub mod server;
mod state;
pub mod status;
pub mod telemetry;
pub mod trace;
pub mod wire;

#[cfg(feature = "http")]
pub use caller::bearer_auth;
pub use caller::{AuthenticatedName, Caller, CallerSource};
pub use deferred::{DeferredAdapter, DeferredArguments, DeferredOutcome, DeferredReply};
pub use guard::{Guard, GuardConfig, GuardedRequest, Resumed};
pub use guarded::{
    call_route, rounds, status_router, Answered, CallerRead, Guarded, Receipt, Refusal, Rounds,
};
pub use keys::{KeyError, KeyMaterial};
pub use ledger::{LedgerGuard, LedgerGuardBuilder, OpenError};
pub use reply::error_of;
pub use server::{ClientEvents, GuardedServer, ToolCall};
pub use state::{StateBinding, StateSealer};
pub use status::{EffectObserver, LedgerResultObserver, Observation, StatusTool};

/// What a guarded tool and its server are written with, in one import:
/// `use toolledger_mcp::prelude::*;`.
pub mod prelude {
    pub use crate::{Guarded, LedgerGuard, LedgerGuardBuilder, Receipt, Refusal};
    pub use toolledger::effect::{EffectTx, RowExt};
    pub use toolledger::engine::InlineEffect;
    pub use toolledger::model::Principal;
    pub use toolledger::store::Migration;
}
