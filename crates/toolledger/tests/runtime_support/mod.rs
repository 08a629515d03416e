//! Shared set-up for the runtime tests: a ledger on either driver (a testkit [`Harness`]: a
//! fresh SQLite file or a fresh PostgreSQL schema), a downstream stand-in in its own file, a
//! small refund tool over a test `test_orders` table, and principals. Each behaviour is an
//! `async fn name(db: &Harness)` run on every driver by [`both_drivers!`].

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};
use toolledger::approval::{self, Approval};
use toolledger::authz::PrincipalStore;
use toolledger::clock::{ManualClock, SharedClock};
use toolledger::effect::{EffectTx, SqlValue};
use toolledger::runtime::{
    approval_target, DeferredCall, DeferredTool, ProviderContext, ProviderProfile, Registry,
    Runtime, RuntimeConfig, RuntimeError, StatusQuery,
};
use toolledger::store::{Migration, Store};
use toolledger::{Error, ErrorCode, Principal, Scope, ToolContract};
pub use toolledger_testkit::both_drivers;
pub use toolledger_testkit::conformance::Harness;
use toolledger_testkit::db;
use toolledger_testkit::downstream::{CountingDownstream, SqliteDownstream};

/// The start of the tests' clock (2026-01-01T00:00:00Z).
pub const T0: i64 = 1_767_225_600;

/// The test `test_orders` table the refund tool reads (SQLite).
pub const MIGRATIONS: &[Migration] = &[Migration {
    namespace: "test.orders",
    version: 1,
    sql: "CREATE TABLE test_orders (
        tenant TEXT NOT NULL,
        id TEXT NOT NULL,
        owner_subject TEXT NOT NULL,
        amount_cents INTEGER NOT NULL CHECK (amount_cents > 0),
        refundable INTEGER NOT NULL CHECK (refundable IN (0, 1)),
        PRIMARY KEY (tenant, id)
    ) STRICT;",
}];

/// [`MIGRATIONS`] in PostgreSQL dialect.
pub const PG_MIGRATIONS: &[Migration] = &[Migration {
    namespace: "test.orders",
    version: 1,
    sql: "CREATE TABLE test_orders (
        tenant TEXT NOT NULL,
        id TEXT NOT NULL,
        owner_subject TEXT NOT NULL,
        amount_cents BIGINT NOT NULL CHECK (amount_cents > 0),
        refundable BIGINT NOT NULL CHECK (refundable IN (0, 1)),
        PRIMARY KEY (tenant, id)
    );",
}];

/// A refund tool over `test_orders`: owner-only, `support_admin` may refund others' orders in
/// the same tenant; approval required.
pub struct TestRefund {
    /// The contract it declares (its revision varies by test).
    pub contract: ToolContract,
}

impl TestRefund {
    /// The tool at contract revision `rev`.
    pub fn v(rev: &str) -> Self {
        TestRefund {
            contract: ToolContract::uniform("refund_order", rev),
        }
    }
}

fn order(tx: &mut dyn EffectTx, principal: &Principal, args: &Value) -> Result<(i64, bool), Error> {
    let id = args["order_id"].as_str().unwrap_or_default();
    let rows = tx.query(
        "SELECT owner_subject, amount_cents, refundable FROM test_orders
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
    if owner != principal.subject && !principal.has_role("support_admin") {
        return Err(Error::not_found());
    }
    Ok((row[1].as_i64().unwrap_or(0), row[2].as_i64() == Some(1)))
}

impl DeferredTool for TestRefund {
    fn contract(&self) -> ToolContract {
        self.contract.clone()
    }

    fn validate(&self, arguments: &Value) -> Result<Value, Error> {
        let obj = arguments
            .as_object()
            .ok_or_else(|| Error::invalid("object expected"))?;
        if obj.len() != 2 {
            return Err(Error::invalid("exactly order_id and amount_cents"));
        }
        let id = obj
            .get("order_id")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::invalid("order_id"))?;
        let amount = obj
            .get("amount_cents")
            .and_then(Value::as_i64)
            .filter(|a| *a > 0)
            .ok_or_else(|| Error::invalid("amount_cents"))?;
        Ok(json!({"order_id": id, "amount_cents": amount}))
    }

    fn check_access(
        &self,
        tx: &mut dyn EffectTx,
        principal: &Principal,
        arguments: &Value,
    ) -> Result<(), Error> {
        order(tx, principal, arguments).map(|_| ())
    }

    fn check(
        &self,
        tx: &mut dyn EffectTx,
        principal: &Principal,
        arguments: &Value,
    ) -> Result<(), Error> {
        let (amount, refundable) = order(tx, principal, arguments)?;
        if !refundable || arguments["amount_cents"].as_i64().unwrap_or(i64::MAX) > amount {
            return Err(Error::new(
                ErrorCode::BusinessStateChanged,
                "order is not refundable",
            ));
        }
        Ok(())
    }

    fn requires_approval(&self) -> bool {
        true
    }

    fn accept_receipt(&self, arguments: &Value, receipt: &Value) -> Result<Value, Error> {
        Ok(json!({
            "amount_cents": arguments["amount_cents"],
            "order_id": arguments["order_id"],
            "receipt_id": receipt["receipt_id"],
        }))
    }
}

/// Counts calls into the downstream so tests can prove "never queried".
pub type Counting = CountingDownstream;

/// An OpenAI Responses provider context for the call `call`.
pub fn openai(call: &str) -> ProviderContext {
    ProviderContext {
        provider: "openai".into(),
        api_family: "responses".into(),
        adapter_revision: "2026-07-01".into(),
        turn_id: format!("turn-{call}"),
        call_id: format!("call-{call}"),
        response_id: format!("resp-{call}"),
    }
}

/// A ledger with orders and principals, a downstream in its own file, and a runtime over them.
pub struct Fixture<'a> {
    /// The ledger.
    pub store: Store,
    /// The clock every part reads.
    pub clock: ManualClock,
    /// The downstream, counting calls.
    pub downstream: Counting,
    /// A runtime with the refund tool at revision `v1`.
    pub runtime: Runtime,
    /// The principal store.
    pub principals: PrincipalStore,
    /// The downstream's file.
    pub downstream_db: PathBuf,
    _dir: tempfile::TempDir,
    /// The ledger's database.
    pub db: &'a Harness,
}

impl<'a> Fixture<'a> {
    /// A fresh ledger in `harness` with principals alice, bob (approver), carol (support admin),
    /// erin in `acme`; dave (support admin) and gina (approver) in `globex`; orders ord-1, ord-2
    /// and ord-9.
    pub async fn new(harness: &'a Harness) -> Fixture<'a> {
        let dir = tempfile::tempdir().unwrap();
        let downstream_db = dir.path().join("downstream.sqlite");
        let store = open_store(harness);
        let clock = ManualClock::new(T0);
        let shared: SharedClock = Arc::new(clock.clone());
        let downstream = CountingDownstream::new(
            SqliteDownstream::open(&downstream_db, shared.clone()).unwrap(),
        );
        let principals = PrincipalStore::new(store.clone()).with_clock(shared.clone());
        for (name, tenant, roles) in [
            ("alice", "acme", vec![]),
            ("bob", "acme", vec!["approver".to_string()]),
            ("carol", "acme", vec!["support_admin".to_string()]),
            ("erin", "acme", vec![]),
            ("dave", "globex", vec!["support_admin".to_string()]),
            ("gina", "globex", vec!["approver".to_string()]),
        ] {
            principals
                .add(name, tenant, &roles, &[], false)
                .await
                .unwrap();
        }
        db::execute_batch(
            &store,
            "INSERT INTO test_orders VALUES ('acme', 'ord-1', 'alice', 5000, 1);
             INSERT INTO test_orders VALUES ('acme', 'ord-2', 'erin', 7000, 1);
             INSERT INTO test_orders VALUES ('globex', 'ord-9', 'dave', 100, 1);",
        )
        .await;
        let runtime = Self::runtime_for(&store, &clock, &downstream, "v1");
        Fixture {
            store,
            clock,
            downstream,
            runtime,
            principals,
            downstream_db,
            _dir: dir,
            db: harness,
        }
    }

    /// A new, independent handle on the ledger (new connections, new writer).
    pub fn open_store(&self) -> Store {
        open_store(self.db)
    }

    /// A runtime over `store` with the refund tool at revision `rev` and the usual providers.
    pub fn runtime_for(
        store: &Store,
        clock: &ManualClock,
        downstream: &Counting,
        rev: &str,
    ) -> Runtime {
        let registry = Registry::new()
            .register(Arc::new(TestRefund::v(rev)), Arc::new(downstream.clone()))
            .allow_profile(ProviderProfile::new("openai", "responses", "2026-07-01"))
            .allow_profile(ProviderProfile::new("anthropic", "messages", "2026-07-01"))
            .allow_profile(ProviderProfile::mcp());
        Runtime::new(store.clone(), Arc::new(clock.clone()), registry).with_config(RuntimeConfig {
            lease_seconds: 30,
            max_attempts: 3,
        })
    }

    /// A runtime over a second, independent store handle on the same database.
    pub fn second_runtime(&self, rev: &str) -> Runtime {
        Self::runtime_for(&self.open_store(), &self.clock, &self.downstream, rev)
    }

    /// A refund of `amount` cents on `order` by `principal` under `key`, approval `approval-<key>`.
    pub fn call(&self, principal: &str, key: &str, order: &str, amount: i64) -> DeferredCall {
        DeferredCall {
            new_intent: false,
            principal: principal.into(),
            tool: "refund_order".into(),
            key: key.into(),
            arguments: json!({"order_id": order, "amount_cents": amount}),
            approval_id: Some(format!("approval-{key}")),
            provider: openai(key),
        }
    }

    /// The status query for `call`, answered as `status_ref`.
    pub fn query(&self, call: &DeferredCall, status_ref: &str) -> StatusQuery {
        StatusQuery {
            principal: call.principal.clone(),
            tool: call.tool.clone(),
            key: call.key.clone(),
            arguments: call.arguments.clone(),
            provider: call.provider.clone(),
            status_ref: status_ref.into(),
        }
    }

    /// Issues the approval `call.approval_id` for `call` by `approver`, valid for an hour.
    pub async fn approve(&self, call: &DeferredCall, approver: &str) -> Result<Approval, Error> {
        self.approve_window(call, approver, self.clock_now(), self.clock_now() + 3600)
            .await
    }

    /// Issues the approval `call.approval_id` for `call` by `approver`, valid in the window given.
    pub async fn approve_window(
        &self,
        call: &DeferredCall,
        approver: &str,
        approved_at: i64,
        expires_at: i64,
    ) -> Result<Approval, Error> {
        let requester = self
            .principals
            .resolve(&call.principal)
            .await
            .unwrap()
            .expect("requester exists");
        let contract = TestRefund::v("v1").contract;
        let args = TestRefund::v("v1").validate(&call.arguments).unwrap();
        let digest = toolledger::digest::request_digest(
            &requester.tenant,
            &requester.subject,
            &contract,
            &args,
        )
        .unwrap();
        let scope = Scope {
            tenant: requester.tenant.clone(),
            subject: requester.subject.clone(),
            tool: "refund_order".into(),
            key: call.key.clone(),
        };
        let target = approval_target(&scope, &contract, &digest, &call.provider);
        approval::grant(
            &self.store,
            call.approval_id.as_deref().unwrap(),
            &target,
            approver,
            approved_at,
            expires_at,
        )
        .await
    }

    /// The clock's time.
    pub fn clock_now(&self) -> i64 {
        use toolledger::clock::Clock;
        self.clock.now()
    }

    /// The rows of `table` in the ledger.
    pub async fn count(&self, table: &str) -> i64 {
        db::count(&self.store, table).await
    }

    /// The text one ledger query answers (`None`: no row or NULL).
    pub async fn scalar_text(&self, sql: &str) -> Option<String> {
        db::opt_text(&self.store, sql).await
    }

    /// The integer one ledger query answers (`None`: no row or NULL).
    pub async fn scalar_int(&self, sql: &str) -> Option<i64> {
        db::opt_int(&self.store, sql).await
    }

    /// Runs raw SQL on the ledger in one write transaction (tampering, triggers,
    /// business-state changes).
    pub async fn sql(&self, sql: &str) {
        db::execute_batch(&self.store, sql).await
    }

    /// Row counts of the ledger's runtime tables: (operations, outbox, deferred_intents,
    /// local_receipts, consumed approvals).
    pub async fn counts(&self) -> (i64, i64, i64, i64, i64) {
        (
            self.count("operations").await,
            self.count("outbox").await,
            self.count("deferred_intents").await,
            self.count("local_receipts").await,
            self.scalar_int("SELECT count(*) FROM approvals WHERE consumed_at IS NOT NULL")
                .await
                .unwrap(),
        )
    }

    /// Receipts the downstream holds.
    pub fn downstream_receipts(&self) -> i64 {
        self.downstream.receipts()
    }
}

/// A new handle on `db` bound to the backend id `test`, with the test orders table.
pub fn open_store(db: &Harness) -> Store {
    db.open_with(Some("test"), (MIGRATIONS, PG_MIGRATIONS), false)
        .expect("open the test ledger")
}

/// A fresh database of the same driver as `db` (for a behaviour that needs several).
pub fn another(db: &Harness) -> Harness {
    match db.dialect() {
        toolledger::effect::Dialect::Sqlite => Harness::sqlite(),
        toolledger::effect::Dialect::Postgres => {
            Harness::postgres().expect("the PostgreSQL test database")
        }
    }
}

/// The error of an expected refusal.
pub fn refused(r: Result<impl std::fmt::Debug, RuntimeError>) -> Error {
    match r {
        Err(RuntimeError::Refused(e)) => e,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The code of an expected refusal.
pub fn code(r: Result<impl std::fmt::Debug, RuntimeError>) -> ErrorCode {
    refused(r).code
}
