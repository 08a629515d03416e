-- toolledger core schema, version 7 (PostgreSQL only): one index fewer on `operations`.
--
-- The scope's unique index now leads with `(tool, idempotency_key)`, so it serves both
-- lookups: a call's scope (all four columns) and a batch's rows of one key under a tool (the
-- group commit's lookup, and a shared key namespace's "taken by another tenant" check), which
-- had an index of their own. Every call and every compaction wrote an entry in each; they now
-- write one. The same columns are unique as before: `ON CONFLICT (tenant, subject, tool,
-- idempotency_key)` names the same set of columns in any order.
--
-- Building the index reads the whole table once, inside the migration's transaction, with
-- writes to `operations` held meanwhile: on a large ledger, run the upgrade in a quiet moment.
-- SQLite keeps its schema as it is: changing a table's constraints there means rebuilding the
-- table, and its rows are referred to by every other ledger table.
ALTER TABLE operations ADD CONSTRAINT operations_scope_key
    UNIQUE (tool, idempotency_key, tenant, subject);
ALTER TABLE operations DROP CONSTRAINT operations_tenant_subject_tool_idempotency_key_key;
DROP INDEX operations_by_tool_key;
