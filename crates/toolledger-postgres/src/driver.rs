//! How the PostgreSQL store serves the ledger: [`Driver`] for its transactions and
//! [`BatchDriver`] for group commit of inline calls (the batch lookup and insert SQL).

use super::*;

/// Every ledger row of a batch's `(tool, key)` pairs, selecting [`OperationRow::COLUMNS`].
/// `OFFSET 0` keeps the lateral subquery from being pulled up into a plain join: planned
/// while the table is new and small (and the plan then cached for the connection), that
/// join became a hash join over a sequential scan of `operations`, whose cost grew with the
/// table. As written it is always a nested loop over the scope's unique index, which leads
/// with `(tool, idempotency_key)`.
static LOOKUP: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT o.* FROM jsonb_to_recordset(?1::text::jsonb) AS q(tool text, k text)
     CROSS JOIN LATERAL (SELECT {} FROM operations WHERE tool = q.tool AND idempotency_key = q.k OFFSET 0) AS o",
        OperationRow::COLUMNS
    )
});

/// The ledger rows of a batch, given as one JSON array of objects: one statement text for
/// any number of rows, so every connection prepares and plans it once (a `VALUES` list per row
/// count was a new statement to plan for each batch size on each connection).
const INSERT_ROWS: &str = "INSERT INTO operations(tenant, subject, tool, idempotency_key,
    request_digest, input_rev, output_rev, effect_rev, handler_rev, producer_rev, policy_rev,
    arguments, fingerprint, status_ref, authority_deadline, retention_deadline, created_at,
    updated_at, result, result_digest, effect_kind, state)
  SELECT r.tenant, r.subject, r.tool, r.k, r.request_digest, r.input_rev, r.output_rev,
    r.effect_rev, r.handler_rev, r.producer_rev, r.policy_rev, r.arguments, r.fingerprint,
    r.status_ref, r.authority_deadline, r.retention_deadline, ?2, ?2, r.result,
    r.result_digest, 'inline', 'applied'
  FROM jsonb_to_recordset(?1::text::jsonb) AS r(tenant text, subject text, tool text, k text,
    request_digest text, input_rev text, output_rev text, effect_rev text, handler_rev text,
    producer_rev text, policy_rev text, arguments text, fingerprint text, status_ref text,
    authority_deadline bigint, retention_deadline bigint, result text, result_digest text)
  RETURNING id, status_ref";

/// A batch's rows as the one JSON array parameter of [`LOOKUP`] or [`INSERT_ROWS`].
fn json_list(rows: &[serde_json::Value]) -> Result<String, Error> {
    serde_json::to_string(rows).map_err(|_| Error::unavailable("batch rows are not encodable"))
}

impl BatchTx for PgTx<'_> {
    fn effect_tx(&mut self) -> &mut dyn EffectTx {
        self
    }

    fn lock_keys(&mut self, keys: &[String]) -> Result<(), Error> {
        PgTx::lock_keys(self, keys)
    }

    fn lookup_scopes(&mut self, scopes: &[ScopeKey<'_>]) -> Result<Vec<OperationRow>, Error> {
        let pairs: Vec<serde_json::Value> = scopes
            .iter()
            .map(|s| serde_json::json!({"tool": s.tool, "k": s.key}))
            .collect();
        self.query(&LOOKUP, &[json_list(&pairs)?.into()])?
            .into_iter()
            .map(|row| Ok(OperationRow::from_values(row)?))
            .collect()
    }

    fn insert_applied_then_commit(
        &mut self,
        rows: &[AppliedRow<'_>],
        now: i64,
    ) -> Result<Vec<(i64, String)>, Error> {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                let c = r.contract;
                serde_json::json!({
                    "tenant": r.tenant,
                    "subject": r.subject,
                    "tool": c.name,
                    "k": r.key,
                    "request_digest": r.request_digest,
                    "input_rev": c.input_rev,
                    "output_rev": c.output_rev,
                    "effect_rev": c.effect_rev,
                    "handler_rev": c.handler_rev,
                    "producer_rev": c.producer_rev,
                    "policy_rev": c.policy_rev,
                    "arguments": r.arguments,
                    "fingerprint": r.fingerprint,
                    "status_ref": r.status_ref,
                    "authority_deadline": r.authority_deadline,
                    "retention_deadline": r.retention_deadline,
                    "result": r.result,
                    "result_digest": r.result_digest,
                })
            })
            .collect();
        self.query_then_commit(INSERT_ROWS, &[json_list(&rows)?.into(), now.into()])?
            .iter()
            .map(|row| Ok((row.int(0)?, row.text(1)?)))
            .collect()
    }

    fn savepoint(&mut self) -> Result<(), Error> {
        PgTx::savepoint(self)
    }

    fn release_savepoint(&mut self) {
        PgTx::release_savepoint(self)
    }

    fn rollback_to_savepoint(&mut self) -> bool {
        PgTx::rollback_to_savepoint(self)
    }

    fn flights(&self) -> u64 {
        PgTx::flights(self)
    }

    fn drop_unsent_lock(&mut self) {
        PgTx::drop_unsent_lock(self)
    }

    fn take_retry(&mut self) -> bool {
        PgTx::take_retry(self)
    }
}

impl BatchWriter for PgWriter<'_> {
    fn write(
        &mut self,
        f: &mut dyn FnMut(&mut dyn BatchTx) -> Result<(), Error>,
    ) -> Result<(), Error> {
        PgWriter::write(self, |tx: &mut PgTx<'_>| f(tx))
    }

    fn discard_connection(&mut self) {
        PgWriter::discard_connection(self)
    }
}

/// How an erased write job's transaction ended.
enum Failure {
    /// The job refused its own writes; its answer is inside it.
    Job,
    /// The store failed (connect, commit).
    Store(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

impl Driver for PgStore {
    fn backend_id(&self) -> &str {
        PgStore::backend_id(self)
    }

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn submit_write(&self, job: Box<dyn WriteJob>) {
        let sent = self.submit(Box::new(move |slot: Result<&mut Slot, StoreError>| {
            let mut job = job;
            let slot = match slot {
                Ok(slot) => slot,
                Err(e) => return job.finish(Some(e)),
            };
            let flush = job.waits_for_disk();
            let out = write_on(slot, flush, &mut |tx: &mut PgTx<'_>| {
                if job.run(tx) {
                    Ok(())
                } else {
                    Err(Failure::Job)
                }
            });
            match out {
                Ok(()) | Err(Failure::Job) => job.finish(None),
                Err(Failure::Store(e)) => job.finish(Some(e)),
            }
        }));
        // A job that could not be sent has been answered why.
        drop(sent);
    }

    fn submit_read(&self, job: Box<dyn ReadJob>) {
        let sent = self.submit(Box::new(move |slot: Result<&mut Slot, StoreError>| {
            let slot = match slot {
                Ok(slot) => slot,
                Err(e) => return job.run(Err(e)),
            };
            let mut job = Some(job);
            let out: Result<(), StoreError> = read_on(slot, |tx| {
                if let Some(j) = job.take() {
                    j.run(Ok(tx));
                }
                Ok(())
            });
            if let (Err(e), Some(j)) = (out, job.take()) {
                j.run(Err(e));
            }
        }));
        // A job that could not be sent has been answered why.
        drop(sent);
    }

    fn reads_first(&self) -> bool {
        // Writers run in parallel, and the write transaction's `BEGIN`, key lock and scope
        // lookup go out in one round trip: a separate read first would only add round trips.
        false
    }

    fn batching(&self) -> Option<Arc<dyn BatchDriver>> {
        Some(Arc::new(self.clone()))
    }

    fn physical_checks(
        &self,
        tx: &mut dyn EffectTx,
    ) -> Result<(bool, serde_json::Value), StoreError> {
        audit_checks::physical_checks(tx)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl BatchDriver for PgStore {
    fn batch_writers(&self) -> usize {
        PgStore::batch_writers(self)
    }

    fn spawn_batch_job(&self, writer: usize, job: BatchJob) -> Result<(), StoreError> {
        PgStore::spawn_batch_job(self, writer, move |w: &mut PgWriter<'_>| job(w))
    }

    fn queue_limits(&self) -> QueueLimits {
        PgStore::queue_limits(self)
    }
}

impl From<PgStore> for Store {
    fn from(s: PgStore) -> Self {
        Store::new(s)
    }
}

/// The audit's physical checks, in this driver's dialect.
mod audit_checks {
    use serde_json::{json, Value};
    use toolledger_core::audit::{column, scalar};
    use toolledger_core::effect::EffectTx;
    use toolledger_core::store::StoreError;

    /// PostgreSQL's physical checks (there is no `integrity_check`): `(pass, checks)`.
    pub(super) fn physical_checks(tx: &mut dyn EffectTx) -> Result<(bool, Value), StoreError> {
        let unvalidated = scalar(
            tx,
            "SELECT count(*) FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
             WHERE n.nspname = current_schema() AND NOT c.convalidated",
        )?;
        let disabled_fk_triggers = scalar(
            tx,
            "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = current_schema() AND t.tgisinternal AND t.tgenabled = 'D'",
        )?;
        let fsync = column(tx, "SELECT current_setting('fsync')")?
            .pop()
            .unwrap_or_default();
        let sync_commit = column(tx, "SELECT current_setting('synchronous_commit')")?
            .pop()
            .unwrap_or_default();
        let amcheck = scalar(
            tx,
            "SELECT count(*) FROM pg_extension WHERE extname = 'amcheck'",
        )? > 0;
        let index_check = if amcheck {
            let n = scalar(
                tx,
                "SELECT count(*) FROM (SELECT bt_index_check(c.oid) FROM pg_index i
                   JOIN pg_class c ON c.oid = i.indexrelid
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                   JOIN pg_am a ON a.oid = c.relam
                 WHERE n.nspname = current_schema() AND a.amname = 'btree') AS checked",
            )?;
            json!(format!("ok ({n} btree indexes)"))
        } else {
            json!("amcheck not installed")
        };
        let pass =
            unvalidated == 0 && disabled_fk_triggers == 0 && fsync == "on" && sync_commit != "off";
        Ok((
            pass,
            json!({
                "unvalidated_constraints": unvalidated,
                "disabled_foreign_key_triggers": disabled_fk_triggers,
                "fsync": fsync,
                "synchronous_commit": sync_commit,
                "index_check": index_check,
            }),
        ))
    }
}
