-- toolledger core schema, version 5 (PostgreSQL): compaction after retention and the
-- tombstone horizon. The same columns, constraints, indexes and table as
-- sqlite_0005_retention.sql (which explains them).
ALTER TABLE operations ADD COLUMN compacted_at BIGINT;
ALTER TABLE operations ADD CONSTRAINT operations_tombstone_check
    CHECK (compacted_at IS NULL OR (arguments = 'null' AND result = 'null'
        AND state IN ('applied', 'succeeded', 'failed')));

CREATE INDEX operations_live_by_retention ON operations(retention_deadline)
    WHERE compacted_at IS NULL AND retention_deadline IS NOT NULL;
CREATE INDEX operations_tombstones_by_retention ON operations(retention_deadline)
    WHERE compacted_at IS NOT NULL;

CREATE TABLE prune_state (
    id                BIGINT  PRIMARY KEY CHECK (id = 1),
    compacted_total   BIGINT  NOT NULL CHECK (compacted_total >= 0),
    deleted_total     BIGINT  NOT NULL CHECK (deleted_total >= 0),
    last_run_at       BIGINT
);
INSERT INTO prune_state(id, compacted_total, deleted_total) VALUES (1, 0, 0);
