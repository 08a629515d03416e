//! The downstream system a deferred effect is delivered to.
//!
//! A downstream must be idempotent under our key: submitting the same scope with the same
//! request again returns the receipt of the first submission and changes nothing; the same
//! scope with a different request is refused. It must also answer a status query by our
//! opaque `status_ref`, so a lost reply becomes a query, never a second effect.
//!
//! A downstream commits separately from the ledger: exactly the gap the ledger's
//! `outcome_unknown` state exists for. An offline stand-in (a payments service in its own
//! SQLite file) lives in `toolledger-testkit`.

use std::future::Future;
use std::pin::Pin;

use serde_json::{json, Value};

use crate::json;
use crate::model::Scope;

/// A boxed, sendable future (the downstream trait is object safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a downstream call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DownstreamError {
    /// The same idempotency scope was submitted earlier with a different request.
    #[error("downstream refused: the key was used for another request")]
    Conflict,
    /// The call did not complete (timeout, connection lost, busy). Whether the effect
    /// happened is unknown; ask [`Downstream::status`].
    #[error("downstream unavailable: {0}")]
    Unavailable(String),
    /// The request is malformed for this downstream.
    #[error("downstream rejected the request: {0}")]
    Rejected(String),
    /// A definitive business refusal: the downstream did not apply the request and never
    /// will under this idempotency scope (a repeat gets the same refusal). The runtime records
    /// the operation as `failed` with `{code, message}` as its stored result.
    #[error("downstream refused the request: {code}")]
    Refused {
        /// Stable snake_case reason, e.g. `refund_exceeds_captured`.
        code: String,
        /// Human-readable explanation (no secrets, no paths).
        message: String,
    },
    /// A definitive answer that the request did not succeed, in the downstream's own words:
    /// `result` (canonical JSON) is stored as the operation's result and the operation is
    /// `failed`; every retry replays it. For downstreams whose refusals carry more than a code
    /// and a message (an MCP tool result with `isError: true`, say).
    #[error("downstream answered with a failure result")]
    Failed {
        /// The result to store and replay.
        result: Value,
    },
    /// The request provably never reached the downstream (no connection could be made, the
    /// downstream process was not running, the request was not written): nothing can have
    /// happened. The runtime gives the claim back uncounted (the outbox event is re-armed), the
    /// operation is `accepted` again with a `not_sent` event, and the next call forwards it.
    /// Return it only when that is certain: once any byte of the request may have reached the
    /// downstream, the answer is [`DownstreamError::Unavailable`].
    #[error("downstream not reached: {0}")]
    NotSent(String),
    /// The downstream did not act: it asks to be called again with more input (the first
    /// rounds of a multi-round call). The event is given back for that next call
    /// (the outbox event is re-armed) and the operation is `accepted` again.
    #[error("downstream asks for more input before it acts")]
    Continue,
}

/// A downstream system that applies an effect and gives a receipt.
pub trait Downstream: Send + Sync + std::fmt::Debug {
    /// Applies `request` under `scope` (idempotently) and returns the receipt, a JSON object
    /// with at least `receipt_id`, `status_ref`, `scope_digest`, `request_sha256` and
    /// `request`. `request` must carry our opaque `status_ref` (a string).
    fn submit<'a>(
        &'a self,
        scope: &'a Scope,
        request: &'a Value,
    ) -> BoxFuture<'a, Result<Value, DownstreamError>>;

    /// The receipt recorded for `status_ref`, if the effect happened.
    fn status<'a>(
        &'a self,
        status_ref: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, DownstreamError>>;

    /// The status query the runtime makes: the receipt for `status_ref`, whose submitted
    /// request was `request` (the same value [`Downstream::submit`] was given). For a
    /// downstream that can only look an effect up by what was sent, and must bind its answer
    /// to that request; by default [`Downstream::status`].
    fn status_of<'a>(
        &'a self,
        status_ref: &'a str,
        request: &'a Value,
    ) -> BoxFuture<'a, Result<Option<Value>, DownstreamError>> {
        let _ = request;
        self.status(status_ref)
    }
}

/// SHA-256 of the canonical scope object: the key the downstream deduplicates on.
pub fn scope_digest(scope: &Scope) -> String {
    let v = json!({
        "idempotency_key": scope.key,
        "subject": scope.subject,
        "tenant": scope.tenant,
        "tool": scope.tool,
    });
    // The scope holds only strings, so it is always in the canonical domain.
    let text = json::canonical_string(&v).unwrap_or_default();
    crate::digest::sha256_hex(text.as_bytes())
}
