-- toolledger core schema, version 8 (SQLite only): the re-plan guard's index with its states
-- written as an OR chain.
--
-- Version 7 wrote the index's predicate as `state IN (…four states…)`. SQLite evaluates an
-- IN list of more than two constants by building a temporary index for every statement that
-- writes an `operations` row, to test the row against the predicate: a worker's claim and
-- its settle each paid for it, about a third more CPU per delivered event (BENCHMARKS.md,
-- 2026-12-07). The core tables' value lists are OR chains for the same reason. The index
-- holds the same rows; the guard's lookup names the same OR chain, so SQLite still proves it
-- usable.
DROP INDEX operations_unsettled_by_digest;
CREATE INDEX operations_unsettled_by_digest ON operations(request_digest)
    WHERE state = 'in_progress' OR state = 'accepted' OR state = 'processing'
       OR state = 'outcome_unknown';
