-- toolledger core schema, version 6 (SQLite): a local receipt's `receipt_id` is no longer
-- unique across operations.
--
-- A receipt is bound to exactly one operation by what it carries (the operation's status
-- reference, scope digest and request digest, checked before it is written), and each
-- operation has at most one local receipt (`operation_id` stays unique); nothing looks a
-- receipt up by its id. The unique index on the id was the only index a delivery wrote at a
-- random place (ids derive from random status references), a leaf page of its own per
-- delivery, and it bounded how fast deferred calls commit.
--
-- SQLite cannot drop a column's UNIQUE in place: the table is rebuilt with the same columns,
-- checks and rows. No other table refers to it.
CREATE TABLE local_receipts_v6 (
    id                  INTEGER PRIMARY KEY,
    operation_id        INTEGER NOT NULL UNIQUE REFERENCES operations(id),
    receipt_id          TEXT    NOT NULL CHECK (length(receipt_id) BETWEEN 1 AND 128),
    receipt             TEXT    NOT NULL CHECK (json_valid(receipt) AND json_type(receipt) = 'object'),
    receipt_digest      TEXT    NOT NULL CHECK (length(receipt_digest) = 64),
    call_binding_digest TEXT    NOT NULL CHECK (length(call_binding_digest) = 64),
    reconciled_via      TEXT    NOT NULL CHECK (reconciled_via IN ('worker', 'status_query')),
    fencing_token       INTEGER CHECK (fencing_token IS NULL OR fencing_token > 0),
    query_identity      TEXT    CHECK (query_identity IS NULL OR length(query_identity) BETWEEN 1 AND 128),
    reconciled_at       INTEGER NOT NULL,
    CHECK ((reconciled_via = 'worker') = (fencing_token IS NOT NULL)),
    CHECK ((reconciled_via = 'status_query') = (query_identity IS NOT NULL))
) STRICT;
INSERT INTO local_receipts_v6 (id, operation_id, receipt_id, receipt, receipt_digest,
        call_binding_digest, reconciled_via, fencing_token, query_identity, reconciled_at)
    SELECT id, operation_id, receipt_id, receipt, receipt_digest, call_binding_digest,
        reconciled_via, fencing_token, query_identity, reconciled_at
    FROM local_receipts;
DROP TABLE local_receipts;
ALTER TABLE local_receipts_v6 RENAME TO local_receipts;
