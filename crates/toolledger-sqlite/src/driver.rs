//! How the SQLite store serves the ledger: [`Driver`] over its writer thread (each job in
//! its own savepoint of a group-commit batch) and its reader threads (one snapshot per read).

use super::*;

impl Driver for SqliteStore {
    fn backend_id(&self) -> &str {
        SqliteStore::backend_id(self)
    }

    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn submit_write(&self, job: Box<dyn WriteJob>) {
        if let Err((err, job)) = self.submit_job(Job::Again(job)) {
            job.refuse(err);
        }
    }

    fn submit_read(&self, job: Box<dyn ReadJob>) {
        if let Err((err, job)) = self.submit_read_job(job) {
            job.run(Err(err));
        }
    }

    fn background(&self, work: Box<dyn BackgroundWork>) -> Result<(), BackgroundRefused> {
        // One at a time; the writer clears the mark once the work it took on is over.
        if self.inner.stats.background.swap(true, Ordering::AcqRel) {
            return Err(BackgroundRefused::Busy);
        }
        if self.submit_job(Job::Background(work)).is_err() {
            self.inner.stats.background.store(false, Ordering::Release);
            return Err(BackgroundRefused::Busy);
        }
        Ok(())
    }

    fn physical_checks(
        &self,
        tx: &mut dyn EffectTx,
    ) -> Result<(bool, serde_json::Value), StoreError> {
        let journal = super::read_only::journal_mode(&self.inner.path, self.inner.read_only);
        audit_checks::physical_checks(tx, journal)
    }

    fn compactable_operations(&self) -> &'static str {
        // Without statistics SQLite's planner would take the index on `state`, which nearly
        // every row matches, and sort them all for each batch: the partial index on the
        // retention deadline yields the oldest candidates first and stops at the limit.
        "SELECT id FROM operations INDEXED BY operations_live_by_retention
     WHERE compacted_at IS NULL AND retention_deadline IS NOT NULL AND retention_deadline <= ?1
       AND (state = 'applied' OR state = 'succeeded' OR state = 'failed')
     ORDER BY retention_deadline LIMIT ?2"
    }

    fn reclaim_space(
        &self,
        tx: &mut dyn EffectTx,
        max_pages: i64,
        keep_free_percent: u8,
    ) -> Result<i64, StoreError> {
        use toolledger_core::audit::scalar;
        // 2: INCREMENTAL. A file created before it was the default stays NONE until an
        // operator runs `toolledger prune --vacuum`; its free pages are reused all the same.
        if scalar(tx, "PRAGMA auto_vacuum")? != 2 {
            return Ok(0);
        }
        let before = scalar(tx, "PRAGMA freelist_count")?;
        let in_use = scalar(tx, "PRAGMA page_count")? - before;
        let keep = in_use * i64::from(keep_free_percent) / 100;
        let pages = max_pages.min(before - keep);
        if pages <= 0 {
            return Ok(0);
        }
        // Stepped to the end (a query, not a batch): each step gives back one page.
        tx.query(&format!("PRAGMA incremental_vacuum({pages})"), &[])
            .map_err(|e| tx.store_error(e))?;
        Ok(before - scalar(tx, "PRAGMA freelist_count")?)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl From<SqliteStore> for Store {
    fn from(s: SqliteStore) -> Self {
        Store::new(s)
    }
}

/// The audit's physical checks, in this driver's dialect.
mod audit_checks {
    use serde_json::{json, Value};
    use toolledger_core::audit::{column, rows, scalar};
    use toolledger_core::effect::EffectTx;
    use toolledger_core::store::StoreError;

    /// SQLite's physical checks: `(pass, checks)`. `journal` is the file's journal mode when
    /// the connection cannot report it (a read-only connection to an immutable file).
    pub(super) fn physical_checks(
        tx: &mut dyn EffectTx,
        journal: Option<String>,
    ) -> Result<(bool, Value), StoreError> {
        let integrity = column(tx, "PRAGMA integrity_check")?;
        let fk = rows(tx, "PRAGMA foreign_key_check")?.len();
        let journal = match journal {
            Some(j) => j,
            None => column(tx, "PRAGMA journal_mode")?.pop().unwrap_or_default(),
        };
        let synchronous = scalar(tx, "PRAGMA synchronous")?;
        let integrity_ok = integrity.len() == 1 && integrity[0] == "ok";
        let journal_ok = journal.eq_ignore_ascii_case("wal");
        let sync_ok = synchronous == 2;
        Ok((
            integrity_ok && fk == 0 && journal_ok && sync_ok,
            json!({
                "integrity_check": if integrity_ok { "ok".to_string() } else { format!("{} problems", integrity.len()) },
                "foreign_key_violations": fk,
                "journal_mode": journal.to_ascii_lowercase(),
                "synchronous": match synchronous { 0 => "off", 1 => "normal", 2 => "full", 3 => "extra", _ => "unknown" },
            }),
        ))
    }
}
