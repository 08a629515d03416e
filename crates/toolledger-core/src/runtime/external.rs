//! An effect that is one call to an external API — send an email, charge a card — delivered
//! by the runtime, from two closures instead of a [`DeferredTool`] and a [`Downstream`] of
//! one's own.
//!
//! [`External`] is the downstream: the runtime commits the intent (transaction A) before the
//! closure runs, the closure makes the call once with [`ExternalRequest::idempotency_key`] (the
//! operation's status reference, the same on every attempt, to be sent as the API's own
//! idempotency key), and what it answers is stored (transaction C) and replayed to every
//! retry. An answer that is lost — the closure fails with [`DownstreamError::Unavailable`], the
//! process dies mid-call — leaves the operation `outcome_unknown`: it is never called again
//! on its own. A status query runs the optional lookup with the same request (its key
//! included) and reconciles what the API says happened, or an operator resolves it.
//!
//! [`ExternalTool`] is the tool: a contract, the arguments kept as given (canonical JSON), no
//! checks of its own and no approval; the stored result is what the call answered.
//! [`Registry::external`] registers the two together.
//!
//! ```no_run
//! # use serde_json::json;
//! # use toolledger_core::downstream::DownstreamError;
//! # use toolledger_core::model::ToolContract;
//! # use toolledger_core::runtime::{External, ExternalRequest, Registry};
//! let registry = Registry::new().external(
//!     ToolContract::uniform("send_email", "1"),
//!     External::new(|req: ExternalRequest| async move {
//!         // POST the message with `Idempotency-Key: req.idempotency_key` …
//!         Ok::<_, DownstreamError>(json!({"message_id": "m-1", "to": req.arguments["to"]}))
//!     }),
//! );
//! ```

use std::future::Future;

use super::*;

/// What an external call is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalRequest {
    /// The key to send the API as its idempotency key: the operation's status reference,
    /// the same on every attempt and every lookup of this operation, and different for every
    /// other operation (another principal's call under the same operation id included).
    pub idempotency_key: String,
    /// The tool's name.
    pub tool: String,
    /// The call's canonical arguments (without the operation id).
    pub arguments: Value,
    /// The W3C trace context of the delivery this call is part of (`traceparent`,
    /// `tracestate`, `baggage`, as the process's propagators write them): send them as the
    /// API request's HTTP headers and its spans join the call's trace. Empty when nothing is
    /// traced. The call also runs with that context current.
    pub trace_context: std::collections::BTreeMap<String, String>,
}

impl ExternalRequest {
    fn of(request: DownstreamRequest) -> ExternalRequest {
        ExternalRequest {
            idempotency_key: request.status_ref,
            tool: request.tool,
            arguments: request.arguments,
            trace_context: crate::trace::current_fields(),
        }
    }
}

/// The typed form of a request the runtime sends downstream; anything else is rejected.
fn typed(request: &Value) -> Result<DownstreamRequest, DownstreamError> {
    DownstreamRequest::from_json(request)
        .ok_or_else(|| DownstreamError::Rejected("not a request of the runtime".into()))
}

type Call =
    dyn Fn(ExternalRequest) -> BoxFuture<'static, Result<Value, DownstreamError>> + Send + Sync;
type Lookup = dyn Fn(ExternalRequest) -> BoxFuture<'static, Result<Option<Value>, DownstreamError>>
    + Send
    + Sync;

/// A [`Downstream`] made of the call to an external API and, optionally, a lookup of what it
/// did (see the module docs).
///
/// The call answers:
/// - `Ok(result)`: the API did it; `result` (canonical JSON: no fractional numbers) is stored
///   and replayed;
/// - [`DownstreamError::Refused`] or [`DownstreamError::Failed`]: the API definitively did
///   not do it; stored as the operation's failure and replayed;
/// - [`DownstreamError::NotSent`]: certainly nothing reached the API (no connection was
///   made); the operation is `accepted` again and the next call of it tries again;
/// - [`DownstreamError::Unavailable`]: the answer is lost (a timeout, a reset connection):
///   the effect may have happened, the operation is `outcome_unknown`.
///
/// A request that is not the runtime's ([`DownstreamRequest`]) is
/// [`DownstreamError::Rejected`] without a call.
///
/// The lookup answers `Ok(Some(result))` when the API shows the effect happened (the
/// result to store), `Ok(None)` when it shows nothing (the outcome stays unknown: absence is
/// not proof), or an error when it cannot tell now.
#[derive(Clone)]
pub struct External {
    call: Arc<Call>,
    lookup: Option<Arc<Lookup>>,
}

impl std::fmt::Debug for External {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("External")
            .field("lookup", &self.lookup.is_some())
            .finish_non_exhaustive()
    }
}

impl External {
    /// The external effect `call`, without a lookup: an unknown outcome waits for an
    /// operator.
    pub fn new<F, Fut>(call: F) -> External
    where
        F: Fn(ExternalRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, DownstreamError>> + Send + 'static,
    {
        External {
            call: Arc::new(move |r| Box::pin(call(r))),
            lookup: None,
        }
    }

    /// The same effect with `lookup`, which status queries run to reconcile an unknown
    /// outcome.
    pub fn with_lookup<F, Fut>(mut self, lookup: F) -> External
    where
        F: Fn(ExternalRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<Value>, DownstreamError>> + Send + 'static,
    {
        self.lookup = Some(Arc::new(move |r| Box::pin(lookup(r))));
        self
    }
}

/// The receipt of an external call: the runtime's bindings, and the call's answer as the
/// result. The status reference stands for the receipt id (the API's own ids are in the
/// result).
fn receipt(request: &Value, status_ref: &str, result: Value) -> Value {
    bound_receipt(request, status_ref, result)
}

impl Downstream for External {
    fn submit<'a>(
        &'a self,
        _scope: &'a Scope,
        request: &'a Value,
    ) -> BoxFuture<'a, Result<Value, DownstreamError>> {
        Box::pin(async move {
            let typed = typed(request)?;
            let status_ref = typed.status_ref.clone();
            let result = (self.call)(ExternalRequest::of(typed)).await?;
            Ok(receipt(request, &status_ref, result))
        })
    }

    fn status<'a>(
        &'a self,
        _status_ref: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, DownstreamError>> {
        // A lookup is made with the request (`status_of`); a reference alone finds nothing.
        Box::pin(async { Ok(None) })
    }

    fn status_of<'a>(
        &'a self,
        _status_ref: &'a str,
        request: &'a Value,
    ) -> BoxFuture<'a, Result<Option<Value>, DownstreamError>> {
        Box::pin(async move {
            let Some(lookup) = &self.lookup else {
                return Ok(None);
            };
            let typed = typed(request)?;
            let status_ref = typed.status_ref.clone();
            let found = lookup(ExternalRequest::of(typed)).await?;
            Ok(found.map(|result| receipt(request, &status_ref, result)))
        })
    }
}

/// The [`DeferredTool`] of an [`External`] effect: its contract, the arguments as given (a
/// JSON object), any active principal, no approval; the result is what the call answered.
#[derive(Clone, Debug)]
pub struct ExternalTool {
    contract: ToolContract,
}

impl ExternalTool {
    /// The tool with `contract`.
    pub fn new(contract: ToolContract) -> ExternalTool {
        ExternalTool { contract }
    }
}

impl DeferredTool for ExternalTool {
    fn contract(&self) -> ToolContract {
        self.contract.clone()
    }

    fn validate(&self, arguments: &Value) -> Result<Value, Error> {
        if !arguments.is_object() {
            return Err(Error::invalid("the arguments are a JSON object"));
        }
        json::canonical_string(arguments)
            .map_err(|e| Error::invalid(format!("the arguments are not canonical JSON: {e}")))?;
        Ok(arguments.clone())
    }

    fn accept_receipt(&self, _arguments: &Value, receipt: &Value) -> Result<Value, Error> {
        Ok(receipt["result"].clone())
    }
}

impl Registry {
    /// Registers the external effect `external` as the tool `contract` names
    /// ([`ExternalTool`]), and accepts MCP calls ([`ProviderProfile::mcp`]).
    pub fn external(self, contract: ToolContract, external: External) -> Self {
        self.register(Arc::new(ExternalTool::new(contract)), Arc::new(external))
            .allow_profile(ProviderProfile::mcp())
    }
}
