//! Proxied operations settled without the proxy: what `toolledger resolve` registers for an
//! operation the proxy recorded, whose upstream it cannot reach.
//!
//! The offline tool has the operation's recorded contract and no upstream: resolving as
//! `failed` records the operator's word (with their reason) — the reconcile lookup is not
//! run; resolving as `succeeded` needs the operator's evidence (`--evidence JSON`), which is
//! recorded as the receipt, and every retry through the proxy is told the effect happened.
//! With the tool's result as well (`--result JSON`, [`checked_result`]), stored beside the
//! confirmation as its `mapped` result, every retry is a success carrying that result — the
//! only form the official SDK clients accept as a success for a tool with an output schema.
//! Run `get_operation_status` through the proxy first when the tool has a reconcile lookup:
//! it records the upstream's evidence itself.
//!
//! The ledger records a proxied operation's contract, whose `output_rev` is the revision of
//! the output schema the tool declared when the call was accepted ([`revision`]), not the
//! schema itself. So an operator who gives a result gives the schema too (the tool's
//! `outputSchema` as the upstream lists it): it must be the one whose revision was recorded,
//! and the result must conform to it.

use std::sync::Arc;

use serde_json::Value;
use toolledger::downstream::{BoxFuture, Downstream, DownstreamError};
use toolledger::effect::EffectTx;
use toolledger::model::{Error, Principal, Scope, ToolContract};
use toolledger::runtime::{DeferredRecord, DeferredTool};

use crate::effect::{revision, EFFECT_REVISION};

/// Whether the ledger recorded `record` through the proxy.
pub fn is_proxied(record: &DeferredRecord) -> bool {
    record.contract.effect_rev == EFFECT_REVISION
}

/// The largest result an operator may record (canonical JSON).
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

/// The operator's `result` for the proxied operation `record`, checked: a JSON object in the
/// ledger's canonical domain, of at most [`MAX_RESULT_BYTES`], conforming to `output_schema`,
/// which must be the schema the tool declared when the call was accepted (its revision is the
/// recorded `output_rev`). A tool that declared none needs no schema (`None`). Every refusal
/// is `invalid_arguments` saying what does not fit; nothing is written here.
pub fn checked_result(
    record: &DeferredRecord,
    result: &Value,
    output_schema: Option<&Value>,
) -> Result<Value, Error> {
    if !result.is_object() {
        return Err(Error::invalid(
            "the result must be a JSON object: the tool's structured result",
        ));
    }
    let text = toolledger::json::canonical_string(result)
        .map_err(|e| Error::invalid(format!("the result {}", e.message)))?;
    if text.len() > MAX_RESULT_BYTES {
        return Err(Error::invalid("the result is larger than 64 KiB"));
    }
    let recorded = &record.contract.output_rev;
    let schema = match output_schema {
        Some(schema) => {
            if revision(schema) != *recorded {
                return Err(Error::invalid(
                    "the output schema given is not the one the tool declared when the call \
                     was accepted (its revision differs from the recorded output_rev)",
                ));
            }
            schema
        }
        None if *recorded == revision(&Value::Null) => return Ok(result.clone()),
        None => {
            return Err(Error::invalid(
                "the tool declared an output schema when the call was accepted: give it \
                 (its outputSchema as the upstream lists it; `toolledger resolve` takes it \
                 with --output-schema FILE), so the result is checked against it",
            ))
        }
    };
    let validator = jsonschema::validator_for(schema)
        .map_err(|_| Error::invalid("the output schema given does not compile"))?;
    if let Some(why) = validator.iter_errors(result).next() {
        return Err(Error::invalid(format!(
            "the result does not conform to the tool's output schema: {why}"
        )));
    }
    Ok(result.clone())
}

struct OfflineTool {
    contract: ToolContract,
    /// The operator's checked result, stored beside the confirmation as `mapped`.
    mapped: Option<Value>,
}

impl DeferredTool for OfflineTool {
    fn contract(&self) -> ToolContract {
        self.contract.clone()
    }

    fn validate(&self, arguments: &Value) -> Result<Value, Error> {
        Ok(arguments.clone())
    }

    fn check(&self, _: &mut dyn EffectTx, _: &Principal, _: &Value) -> Result<(), Error> {
        Err(Error::invalid(
            "a proxied tool is forwarded by `toolledger proxy` only",
        ))
    }

    fn accept_receipt(&self, _: &Value, _: &Value) -> Result<Value, Error> {
        Err(Error::invalid("no upstream here to take a receipt from"))
    }

    fn confirmed_result(&self, _: &Value, confirmation: &Value) -> Result<Value, Error> {
        let mut stored = serde_json::json!({ "confirmed": confirmation });
        if let Some(mapped) = &self.mapped {
            stored["mapped"] = mapped.clone();
        }
        Ok(stored)
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
    tool_confirming(record, None)
}

/// [`tool_for`], whose confirmation of a success stores `mapped` (a result
/// [`checked_result`] accepted) as the tool's result: every retry is then a success with it.
pub fn tool_confirming(
    record: &DeferredRecord,
    mapped: Option<Value>,
) -> (Arc<dyn DeferredTool>, Arc<dyn Downstream>) {
    (
        Arc::new(OfflineTool {
            contract: record.contract.clone(),
            mapped,
        }),
        Arc::new(NoUpstream),
    )
}
