//! Proxied operations settled without the proxy: what `toolledger resolve` registers for an
//! operation the proxy recorded, whose upstream it cannot reach.
//!
//! The offline tool has the operation's recorded contract and no upstream: resolving as
//! `failed` records the operator's word (with their reason) — the reconcile lookup is not
//! run; resolving as `succeeded` needs the operator's evidence (`--evidence JSON`), which is
//! recorded as the receipt, and every retry through the proxy is told the effect happened.
//! Run `get_operation_status` through the proxy first when the tool has a reconcile lookup:
//! it records the upstream's evidence itself.

use std::sync::Arc;

use serde_json::Value;
use toolledger::downstream::{BoxFuture, Downstream, DownstreamError};
use toolledger::effect::EffectTx;
use toolledger::model::{Error, Principal, Scope, ToolContract};
use toolledger::runtime::{DeferredRecord, DeferredTool};

use crate::effect::EFFECT_REVISION;

/// Whether the ledger recorded `record` through the proxy.
pub fn is_proxied(record: &DeferredRecord) -> bool {
    record.contract.effect_rev == EFFECT_REVISION
}

struct OfflineTool(ToolContract);

impl DeferredTool for OfflineTool {
    fn contract(&self) -> ToolContract {
        self.0.clone()
    }

    fn validate(&self, arguments: &Value) -> Result<Value, Error> {
        Ok(arguments.clone())
    }

    fn check_access(&self, _: &mut dyn EffectTx, _: &Principal, _: &Value) -> Result<(), Error> {
        Ok(())
    }

    fn check(&self, _: &mut dyn EffectTx, _: &Principal, _: &Value) -> Result<(), Error> {
        Err(Error::invalid(
            "a proxied tool is forwarded by `toolledger proxy` only",
        ))
    }

    fn requires_approval(&self) -> bool {
        false
    }

    fn accept_receipt(&self, _: &Value, _: &Value) -> Result<Value, Error> {
        Err(Error::invalid("no upstream here to take a receipt from"))
    }
}

#[derive(Debug)]
struct NoUpstream;

impl Downstream for NoUpstream {
    fn submit<'a>(
        &'a self,
        _: &'a Scope,
        _: &'a Value,
    ) -> BoxFuture<'a, Result<Value, DownstreamError>> {
        Box::pin(async {
            Err(DownstreamError::Rejected(
                "a proxied tool is forwarded by `toolledger proxy` only".into(),
            ))
        })
    }

    fn status<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<Value>, DownstreamError>> {
        Box::pin(async { Ok(None) })
    }
}

/// The tool and downstream to register for the proxied operation `record`.
pub fn tool_for(record: &DeferredRecord) -> (Arc<dyn DeferredTool>, Arc<dyn Downstream>) {
    (
        Arc::new(OfflineTool(record.contract.clone())),
        Arc::new(NoUpstream),
    )
}
