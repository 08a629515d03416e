-- toolledger core schema, version 5 (SQLite): compaction after retention and the tombstone
-- horizon.
--
-- A settled operation (applied, succeeded, failed) whose retention deadline has passed is
-- compacted by `toolledger prune`: its events, intent context, outbox event and local receipt
-- are deleted and the row stays as a tombstone — scope, request digest, fingerprint,
-- revisions, state, deadlines, status reference — with `compacted_at` set and its arguments
-- and result replaced by JSON `null` (the result digest is that of `null`). A tombstone still
-- holds its key: a replay is refused with `operation_retention_expired` and another intent is
-- `operation_conflict`. Once the tombstone horizon has passed too, the row is deleted and the
-- key is forgotten.
ALTER TABLE operations ADD COLUMN compacted_at INTEGER
    CHECK (compacted_at IS NULL OR (arguments = 'null' AND result = 'null'
        AND (state = 'applied' OR state = 'succeeded' OR state = 'failed')));

-- The live rows by retention deadline: the pruner's candidates, oldest first.
CREATE INDEX operations_live_by_retention ON operations(retention_deadline)
    WHERE compacted_at IS NULL AND retention_deadline IS NOT NULL;
-- The tombstones by retention deadline: the horizon's candidates, oldest first.
CREATE INDEX operations_tombstones_by_retention ON operations(retention_deadline)
    WHERE compacted_at IS NOT NULL;

-- One row: the pruner's lease (a pruner's transaction holds it locked, so two pruners of one
-- ledger never work at once) and its running totals.
CREATE TABLE prune_state (
    id                INTEGER PRIMARY KEY CHECK (id = 1),
    compacted_total   INTEGER NOT NULL CHECK (compacted_total >= 0),
    deleted_total     INTEGER NOT NULL CHECK (deleted_total >= 0),
    last_run_at       INTEGER
) STRICT;
INSERT INTO prune_state(id, compacted_total, deleted_total) VALUES (1, 0, 0);
