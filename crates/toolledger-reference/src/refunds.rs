//! `refund_order`: a deferred effect delivered through the outbox to a downstream
//! payments service.
//!
//! `refund_order {idempotency_key, order_id, amount_cents, approval}`:
//! - the business arguments are `{order_id, amount_cents}`; the key is the idempotency key and
//!   `approval` the id of an approval issued by `toolledger approve` (required);
//! - access is owner-only: the caller's tenant must own the order and the caller must be its
//!   `owner_subject`, unless the caller *currently* holds the role `support_admin` (re-read from
//!   the principal store at every check). Anything else is `not_found`, the same shape as an
//!   order that does not exist;
//! - business state: the order must be refundable and the amount at most the order's amount
//!   (`business_state_changed` otherwise), checked at acceptance and again by the worker
//!   before the payments service is called;
//! - the result is `{order_id, amount_cents, receipt_id, refund: "completed"}`.
//!
//! The payments service stand-in ([`SqliteDownstream`]) keeps its receipts in its own file,
//! by default `<db>.downstream.sqlite` beside the ledger.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rmcp::schemars::{self, JsonSchema};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use toolledger::approval::ApprovalTarget;
use toolledger::clock::SharedClock;
use toolledger::downstream::Downstream;
use toolledger::effect::{EffectTx, SqlValue};
use toolledger::runtime::{
    approval_target, Answer, DeferredCall, DeferredTool, ProviderContext, ProviderProfile,
    Registry, Runtime,
};
use toolledger::store::Migration;
use toolledger::store::Store;
use toolledger::{Error, ErrorCode, Principal, Scope, ToolContract};
use toolledger_mcp::deferred::DeferredOutcome;
use toolledger_mcp::{DeferredArguments, DeferredReply, ToolCall};

use crate::domain;
use crate::downstream::SqliteDownstream;

/// Migration namespace of this domain.
pub const NAMESPACE: &str = "reference.refunds";

/// The `orders` table.
pub const MIGRATIONS: &[Migration] = &[Migration {
    namespace: NAMESPACE,
    version: 1,
    sql: "CREATE TABLE orders (
              tenant        TEXT    NOT NULL CHECK (length(tenant) BETWEEN 1 AND 128),
              id            TEXT    NOT NULL CHECK (length(id) BETWEEN 1 AND 64),
              owner_subject TEXT    NOT NULL CHECK (length(owner_subject) BETWEEN 1 AND 128),
              amount_cents  INTEGER NOT NULL CHECK (amount_cents BETWEEN 1 AND 100000000),
              refundable    INTEGER NOT NULL CHECK (refundable IN (0, 1)),
              PRIMARY KEY (tenant, id)
          ) STRICT;",
}];

/// [`MIGRATIONS`] in PostgreSQL dialect (same namespace, versions and constraints).
pub const PG_MIGRATIONS: &[Migration] = &[Migration {
    namespace: NAMESPACE,
    version: 1,
    sql: "CREATE TABLE orders (
              tenant        TEXT    NOT NULL CHECK (length(tenant) BETWEEN 1 AND 128),
              id            TEXT    NOT NULL CHECK (length(id) BETWEEN 1 AND 64),
              owner_subject TEXT    NOT NULL CHECK (length(owner_subject) BETWEEN 1 AND 128),
              amount_cents  BIGINT  NOT NULL CHECK (amount_cents BETWEEN 1 AND 100000000),
              refundable    BIGINT  NOT NULL CHECK (refundable IN (0, 1)),
              PRIMARY KEY (tenant, id)
          );",
}];

/// The tool name.
pub const TOOL: &str = "refund_order";

/// The role that may refund another subject's order in the same tenant.
pub const SUPPORT_ADMIN: &str = "support_admin";

/// Largest refundable amount in cents.
pub const MAX_AMOUNT_CENTS: i64 = 100_000_000;

/// The provider profiles `refund_order` accepts calls from.
pub fn provider_profiles() -> Vec<ProviderProfile> {
    vec![
        ProviderProfile::new("openai", "responses", "2026-07-01"),
        ProviderProfile::new("anthropic", "messages", "2026-07-01"),
        ProviderProfile::mcp(),
    ]
}

/// The current contract of `refund_order`.
pub fn contract() -> ToolContract {
    ToolContract {
        name: TOOL.into(),
        input_rev: "refund_order.input.1".into(),
        output_rev: "refund_order.output.1".into(),
        effect_rev: "refund_order.effect.1".into(),
        handler_rev: "refund_order.handler.1".into(),
        producer_rev: "refund_order.producer.1".into(),
        policy_rev: "refund_order.policy.1".into(),
    }
}

/// The tool's arguments split into their roles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundArguments {
    /// The idempotency key.
    pub key: String,
    /// The approval id, if given.
    pub approval: Option<String>,
    /// The business arguments `{order_id, amount_cents}`.
    pub business: Value,
}

fn is_id(s: &str, max: usize) -> bool {
    (1..=max).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

fn business(order_id: &Value, amount: &Value) -> Result<Value, Error> {
    let order_id = order_id.as_str().filter(|s| is_id(s, 64)).ok_or_else(|| {
        Error::invalid("order_id must be 1 to 64 characters from [A-Za-z0-9_.:-]")
    })?;
    // Booleans and strings are not integers; the strict parser leaves only integers.
    let amount = amount
        .as_i64()
        .filter(|a| (1..=MAX_AMOUNT_CENTS).contains(a))
        .ok_or_else(|| Error::invalid("amount_cents must be an integer from 1 to 100000000"))?;
    Ok(json!({"amount_cents": amount, "order_id": order_id}))
}

/// The wire arguments of `refund_order`. Their schema is the tool's input schema;
/// [`parse_tool_arguments`] holds the same rules for callers that do not come through the
/// router.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RefundArgs {
    /// The idempotency key.
    #[schemars(
        regex(pattern = "^[A-Za-z0-9_.:-]{1,128}$"),
        extend("x-toolledger-key" = true)
    )]
    pub idempotency_key: String,
    /// The order to refund.
    #[schemars(length(min = 1, max = 64))]
    pub order_id: String,
    /// The amount to refund, in cents.
    #[schemars(range(min = 1, max = 100_000_000))]
    pub amount_cents: i64,
    /// The approval id from `toolledger approve --tool refund_order`.
    pub approval: Option<String>,
}

impl RefundArgs {
    /// The arguments split into their roles, checked by the tool's rules.
    pub fn split(self) -> Result<RefundArguments, Error> {
        if !is_id(&self.idempotency_key, 128) {
            return Err(Error::invalid(
                "idempotency_key must be 1 to 128 characters from [A-Za-z0-9_.:-]",
            ));
        }
        let business = business(&json!(self.order_id), &json!(self.amount_cents))?;
        Ok(RefundArguments {
            key: self.idempotency_key,
            approval: self.approval,
            business,
        })
    }
}

/// Validates the full tool arguments `{idempotency_key, order_id, amount_cents, approval?}`:
/// no unknown or missing fields, typed values.
pub fn parse_tool_arguments(arguments: &Value) -> Result<RefundArguments, Error> {
    let obj = arguments
        .as_object()
        .ok_or_else(|| Error::invalid("arguments must be an object"))?;
    domain::arguments::<RefundArgs>(obj)?.split()
}

/// `refund_order` as a [`DeferredTool`].
#[derive(Clone, Debug, Default)]
pub struct RefundOrder;

struct Order {
    amount_cents: i64,
    refundable: bool,
}

fn visible_order(
    tx: &mut dyn EffectTx,
    principal: &Principal,
    arguments: &Value,
) -> Result<Order, Error> {
    let id = arguments["order_id"].as_str().unwrap_or_default();
    let rows = tx.query(
        "SELECT owner_subject, amount_cents, refundable FROM orders
         WHERE tenant = ?1 AND id = ?2",
        &[
            SqlValue::from(principal.tenant.as_str()),
            SqlValue::from(id),
        ],
    )?;
    let Some(row) = rows.into_iter().next() else {
        return Err(Error::not_found());
    };
    let owner = row[0].as_str().unwrap_or_default();
    if owner != principal.subject && !principal.has_role(SUPPORT_ADMIN) {
        return Err(Error::not_found());
    }
    Ok(Order {
        amount_cents: row[1].as_i64().unwrap_or(0),
        refundable: row[2].as_i64() == Some(1),
    })
}

impl DeferredTool for RefundOrder {
    fn contract(&self) -> ToolContract {
        contract()
    }

    fn validate(&self, arguments: &Value) -> Result<Value, Error> {
        let obj = arguments
            .as_object()
            .ok_or_else(|| Error::invalid("arguments must be an object"))?;
        if obj.len() != 2 {
            return Err(Error::invalid(
                "business arguments are exactly order_id and amount_cents",
            ));
        }
        let missing = Value::Null;
        business(
            obj.get("order_id").unwrap_or(&missing),
            obj.get("amount_cents").unwrap_or(&missing),
        )
    }

    fn check_access(
        &self,
        tx: &mut dyn EffectTx,
        principal: &Principal,
        arguments: &Value,
    ) -> Result<(), Error> {
        visible_order(tx, principal, arguments).map(|_| ())
    }

    fn check(
        &self,
        tx: &mut dyn EffectTx,
        principal: &Principal,
        arguments: &Value,
    ) -> Result<(), Error> {
        let order = visible_order(tx, principal, arguments)?;
        let amount = arguments["amount_cents"].as_i64().unwrap_or(i64::MAX);
        if !order.refundable {
            return Err(Error::new(
                ErrorCode::BusinessStateChanged,
                "the order is not refundable",
            ));
        }
        if amount > order.amount_cents {
            return Err(Error::new(
                ErrorCode::BusinessStateChanged,
                "the refund exceeds the order amount",
            ));
        }
        Ok(())
    }

    fn requires_approval(&self) -> bool {
        true
    }

    fn accept_receipt(&self, arguments: &Value, receipt: &Value) -> Result<Value, Error> {
        let receipt_id = receipt
            .get("receipt_id")
            .and_then(Value::as_str)
            .filter(|s| is_id(s, 128))
            .ok_or_else(|| Error::invalid("receipt_id is malformed"))?;
        if receipt.get("request").and_then(|r| r.get("arguments")) != Some(arguments) {
            return Err(Error::invalid("the receipt is for other arguments"));
        }
        let result = json!({
            "amount_cents": arguments["amount_cents"],
            "order_id": arguments["order_id"],
            "receipt_id": receipt_id,
            "refund": "completed",
        });
        check_result(&result)?;
        Ok(result)
    }
}

/// The output contract: exactly `{amount_cents, order_id, receipt_id, refund: "completed"}`.
pub fn check_result(result: &Value) -> Result<(), Error> {
    let bad = || Error::invalid("result does not match the output contract");
    let obj = result.as_object().ok_or_else(bad)?;
    if obj.len() != 4
        || obj.get("refund") != Some(&json!("completed"))
        || !obj
            .get("receipt_id")
            .and_then(Value::as_str)
            .is_some_and(|s| is_id(s, 128))
    {
        return Err(bad());
    }
    let missing = Value::Null;
    business(
        obj.get("order_id").unwrap_or(&missing),
        obj.get("amount_cents").unwrap_or(&missing),
    )
    .map_err(|_| bad())?;
    Ok(())
}

/// Where the payments stand-in keeps its receipts for the ledger at `db`, unless told otherwise:
/// `<db>.downstream.sqlite`.
pub fn default_downstream_path(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_os_string();
    s.push(".downstream.sqlite");
    PathBuf::from(s)
}

/// The registry with `refund_order` delivered to `downstream`, accepting [`provider_profiles`].
pub fn registry(downstream: Arc<dyn Downstream>) -> Registry {
    let mut registry = Registry::new().register(Arc::new(RefundOrder), downstream);
    for p in provider_profiles() {
        registry = registry.allow_profile(p);
    }
    registry
}

/// A runtime over `store` with `refund_order` and the payments stand-in at `downstream_db`.
pub fn runtime<S: Clone + Into<Store>>(
    store: &S,
    downstream_db: &Path,
    clock: SharedClock,
) -> Result<Runtime, Error> {
    let downstream = SqliteDownstream::open(downstream_db, clock.clone())
        .map_err(|_| Error::unavailable("the payments service is unavailable"))?;
    Ok(Runtime::new(
        store.clone(),
        clock,
        registry(Arc::new(downstream)),
    ))
}

/// The call for `refund_order` arguments from an MCP client: the idempotency key stands for
/// the provider's turn, call and response ids ([`ProviderContext::mcp`]).
pub fn mcp_call(principal: &str, arguments: &Value) -> Result<DeferredCall, Error> {
    let arguments = arguments
        .as_object()
        .ok_or_else(|| Error::invalid("arguments must be an object"))?;
    Ok(deferred_arguments(arguments)?.into_call(principal, TOOL))
}

/// What an approver approves for `refund_order`: the requester's scope, the request digest of
/// the business arguments, the six revisions and the provider call context.
pub fn approval_target_for(
    requester: &Principal,
    key: &str,
    business_arguments: &Value,
    provider: &ProviderContext,
) -> Result<ApprovalTarget, Error> {
    let arguments = RefundOrder.validate(business_arguments)?;
    let contract = contract();
    let digest = toolledger::digest::request_digest(
        &requester.tenant,
        &requester.subject,
        &contract,
        &arguments,
    )
    .map_err(|e| Error::invalid(e.message))?;
    let scope = Scope {
        tenant: requester.tenant.clone(),
        subject: requester.subject.clone(),
        tool: TOOL.into(),
        key: key.into(),
    };
    Ok(approval_target(&scope, &contract, &digest, provider))
}

/// The tool result an MCP client sees: `{status_ref, code, delivery, status}` plus `result`
/// when the refund completed ([`toolledger_mcp::DeferredReply`]).
pub fn answer_json(answer: &Answer) -> Value {
    toolledger_mcp::deferred::answer_json(answer)
}

/// The wire arguments of one `refund_order` call split for the deferred runtime: the
/// idempotency key, the business arguments `{order_id, amount_cents}` and the approval.
pub fn deferred_arguments(arguments: &Map<String, Value>) -> Result<DeferredArguments, Error> {
    Ok(deferred(
        domain::arguments::<RefundArgs>(arguments)?.split()?,
    ))
}

fn deferred(parsed: RefundArguments) -> DeferredArguments {
    DeferredArguments::new(parsed.key, parsed.business).with_approval(parsed.approval)
}

/// Answers one call of `refund_order` with `args` (its wire arguments, typed): a single round,
/// dispatched to `runtime` for the caller the server resolved; a finished refund replays, an
/// unfinished one is `OUTCOME_UNKNOWN` with its `status_ref`.
pub async fn call(
    runtime: &Runtime,
    call: &ToolCall,
    args: RefundArgs,
) -> Result<DeferredOutcome, Error> {
    domain::single_round(
        call,
        "this tool has a single round; it takes no requestState or inputResponses",
    )?;
    let new_intent = toolledger_mcp::carriers::new_intent(call.meta.as_ref());
    let arguments = deferred(args.split()?).with_new_intent(new_intent);
    let answer = toolledger_mcp::deferred::dispatch(runtime, &call.caller, TOOL, arguments).await?;
    Ok(DeferredOutcome(DeferredReply::from(&answer)))
}

/// Inserts an order unless one with the same tenant and id exists (fixtures and demos).
pub async fn ensure_order<S: Clone + Into<Store>>(
    store: &S,
    tenant: &str,
    id: &str,
    owner_subject: &str,
    amount_cents: i64,
    refundable: bool,
) -> Result<(), toolledger::store::StoreError> {
    let (tenant, id, owner) = (
        tenant.to_string(),
        id.to_string(),
        owner_subject.to_string(),
    );
    let store: Store = store.clone().into();
    store
        .write(move |tx: &mut dyn EffectTx| {
            tx.execute(
                "INSERT INTO orders (tenant, id, owner_subject, amount_cents, refundable)
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (tenant, id) DO NOTHING",
                &[
                    tenant.as_str().into(),
                    id.as_str().into(),
                    owner.as_str().into(),
                    amount_cents.into(),
                    i64::from(refundable).into(),
                ],
            )
            .map_err(|e| tx.store_error(e))?;
            Ok(())
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_arguments_are_strict() {
        let ok = parse_tool_arguments(&json!({
            "idempotency_key": "k-1", "order_id": "ord-1", "amount_cents": 5, "approval": "approval-1"
        }))
        .unwrap();
        assert_eq!(ok.business, json!({"amount_cents": 5, "order_id": "ord-1"}));
        assert_eq!(ok.approval.as_deref(), Some("approval-1"));
        for bad in [
            json!({"idempotency_key": "k", "order_id": "o", "amount_cents": true}),
            json!({"idempotency_key": "k", "order_id": "o", "amount_cents": 0}),
            json!({"idempotency_key": "k", "order_id": "o", "amount_cents": "5"}),
            json!({"idempotency_key": "k", "order_id": "o", "amount_cents": 5, "extra": 1}),
            json!({"idempotency_key": "", "order_id": "o", "amount_cents": 5}),
            json!({"idempotency_key": "k", "order_id": "o o", "amount_cents": 5}),
            json!({"idempotency_key": "k", "amount_cents": 5}),
            json!({"idempotency_key": "k", "order_id": "o", "amount_cents": 5, "approval": 7}),
        ] {
            assert_eq!(
                parse_tool_arguments(&bad).unwrap_err().code,
                ErrorCode::InvalidArguments,
                "{bad}"
            );
        }
    }

    #[test]
    fn results_follow_the_output_contract() {
        let good = json!({"amount_cents": 5, "order_id": "o", "receipt_id": "rcpt_1", "refund": "completed"});
        assert!(check_result(&good).is_ok());
        let mut extra = good.clone();
        extra["x"] = json!(1);
        assert!(check_result(&extra).is_err());
        let mut wrong = good.clone();
        wrong["refund"] = json!("pending");
        assert!(check_result(&wrong).is_err());
    }
}
