//! What every reference domain is built from, so a domain states only what is its own (its
//! tables, its typed arguments and their rules, its effect):
//!
//! - [`arguments`]: a call's typed arguments from its wire arguments (`invalid_arguments` when
//!   they do not deserialize), for the callers that do not come through the rmcp router
//!   (`toolledger call`, `toolledger approve`);
//! - [`text_rule`]: a text argument's length rule, for arguments read without the schema;
//! - [`single_round`]: the refusal of a continuation sent to a single-round tool;
//! - [`request`] and [`receipt`]: a guarded call's request and its reply;
//! - [`RowObserver`]: `get_operation_status`'s evidence, read from the domain's effect rows.

use rmcp::model::CallToolResponse;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use toolledger::effect::{EffectTx, RowExt};
use toolledger::engine::{OperationRecord, Outcome};
use toolledger::model::{Error, ErrorCode, ToolContract};
use toolledger::store::Store;
use toolledger_mcp::server::BoxFuture;
use toolledger_mcp::status::{EffectObserver, Observation};
use toolledger_mcp::{GuardedRequest, Receipt, ToolCall};

/// The typed arguments `T` of a call from its wire arguments; `invalid_arguments` naming what
/// does not fit (an unknown, missing or mistyped field).
pub fn arguments<T: DeserializeOwned>(arguments: &Map<String, Value>) -> Result<T, Error> {
    serde_json::from_value(Value::Object(arguments.clone()))
        .map_err(|e| Error::invalid(format!("arguments: {e}")))
}

/// The length rule of a text argument the input schema states (1 to `max` characters), for
/// arguments read without the schema: `invalid_arguments` naming `name` otherwise.
pub fn text_rule(value: &str, name: &str, max: usize) -> Result<(), Error> {
    let n = value.chars().count();
    if n == 0 || n > max {
        return Err(Error::invalid(format!(
            "{name} must be 1 to {max} characters"
        )));
    }
    Ok(())
}

/// Refuses a continuation (`requestState` or `inputResponses`) sent to a single-round tool:
/// `continuation_unsupported` with `message`.
pub fn single_round(call: &ToolCall, message: &str) -> Result<(), Error> {
    if call.request_state.is_some() || call.input_responses.is_some() {
        return Err(Error::new(ErrorCode::ContinuationUnsupported, message));
    }
    Ok(())
}

/// The guarded request of `call` under `contract` for `operation_id`, fingerprinting
/// `arguments` (the call's wire arguments, or the part of them that is the intent).
pub fn request<'a>(
    call: &'a ToolCall,
    contract: &'a ToolContract,
    operation_id: &'a str,
    arguments: &'a Map<String, Value>,
) -> GuardedRequest<'a> {
    GuardedRequest {
        caller: &call.caller,
        contract,
        operation_id,
        arguments,
    }
}

/// The reply of a guarded call: `{operationId, …the stored result's fields, replayed, state}`.
pub fn receipt(operation_id: &str, outcome: &Outcome) -> CallToolResponse {
    Receipt {
        operation_id: operation_id.to_string(),
        result: outcome.result.clone(),
        replayed: outcome.replayed,
        state: outcome.state.as_str().to_string(),
    }
    .into_response()
}

/// How a domain judges the rows an operation wrote: `(id, text)` pairs, in id order, against
/// the operation's ledger row.
pub type Judge = fn(&OperationRecord, &[(i64, String)]) -> Observation;

/// `get_operation_status`'s evidence for one domain: the rows a `SELECT id, <text column>`
/// finds for the operation (parameters: tenant, subject, operation id), judged by the domain.
pub struct RowObserver {
    store: Store,
    select: &'static str,
    judge: Judge,
}

impl RowObserver {
    /// An observer over `store` reading the rows `select` finds, judged by `judge`.
    pub fn new(store: Store, select: &'static str, judge: Judge) -> Self {
        RowObserver {
            store,
            select,
            judge,
        }
    }
}

impl EffectObserver for RowObserver {
    fn observe<'a>(
        &'a self,
        record: &'a OperationRecord,
    ) -> BoxFuture<'a, Result<Observation, Error>> {
        Box::pin(async move {
            let args = [
                record.tenant.clone(),
                record.subject.clone(),
                record.key.clone(),
            ];
            let select = self.select;
            let rows = self
                .store
                .read(
                    move |tx: &mut dyn EffectTx| -> Result<Vec<(i64, String)>, Error> {
                        let params: Vec<_> = args.iter().map(|a| a.as_str().into()).collect();
                        tx.query(select, &params)?
                            .iter()
                            .map(|row| Ok((row.int(0)?, row.text(1)?)))
                            .collect()
                    },
                )
                .await?;
            Ok((self.judge)(record, &rows))
        })
    }
}
