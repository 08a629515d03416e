//! Tools for tests of what serves a tool (an MCP adapter, a router) rather than of business
//! rules: [`ShipAnyParcel`], a deferred tool over no business state.

use serde_json::{json, Value};
use toolledger::model::{Error, ToolContract};
use toolledger::runtime::DeferredTool;

/// `ship_parcel {parcel}` (contract revision `1`) over no business state: anyone may ship any
/// parcel, without an approval; the result is `{parcel, shipped: <receipt_id>}`. Unlike the
/// conformance suite's [`ShipParcel`](crate::conformance::ShipParcel), it reads no table.
///
/// [`ShipAnyParcel::strict`] checks its arguments itself; [`ShipAnyParcel::unchecked`] leaves
/// that to what serves it (an input schema checked before the tool runs), so a test can show
/// that check at work.
#[derive(Clone, Copy, Debug)]
pub struct ShipAnyParcel {
    strict: bool,
}

impl ShipAnyParcel {
    /// Refuses (`invalid_arguments`) anything but `{parcel: <non-empty string>}`, and a
    /// receipt without a `receipt_id`.
    pub fn strict() -> ShipAnyParcel {
        ShipAnyParcel { strict: true }
    }

    /// Takes `parcel`, and the receipt's `receipt_id`, as they come.
    pub fn unchecked() -> ShipAnyParcel {
        ShipAnyParcel { strict: false }
    }
}

impl DeferredTool for ShipAnyParcel {
    fn contract(&self) -> ToolContract {
        ToolContract::uniform("ship_parcel", "1")
    }

    fn validate(&self, arguments: &Value) -> Result<Value, Error> {
        if !self.strict {
            return Ok(json!({"parcel": arguments["parcel"]}));
        }
        match arguments.get("parcel").and_then(Value::as_str) {
            Some(p) if !p.is_empty() && arguments.as_object().is_some_and(|o| o.len() == 1) => {
                Ok(json!({"parcel": p}))
            }
            _ => Err(Error::invalid("parcel must be a non-empty string")),
        }
    }

    fn accept_receipt(&self, arguments: &Value, receipt: &Value) -> Result<Value, Error> {
        if !self.strict {
            return Ok(json!({"parcel": arguments["parcel"], "shipped": receipt["receipt_id"]}));
        }
        let id = receipt
            .get("receipt_id")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::invalid("receipt_id is missing"))?;
        Ok(json!({"parcel": arguments["parcel"], "shipped": id}))
    }
}
