-- toolledger core schema, version 8 (SQLite only): the re-plan guard's index keyed on what
-- changes once.
--
-- Version 7's index held the rows whose `state` was unsettled. A worker's claim moves a row
-- from `accepted` to `processing`, both unsettled, yet SQLite rewrites an index entry whenever
-- a column its predicate names changes: every delivery updated the index twice, each time at
-- a random leaf (the key is a SHA-256 digest), which cost a third of a delivery's CPU with a
-- backlog of accepted operations (BENCHMARKS.md, 2026-12-07). The predicate is now "no result
-- yet": every settled state has a result and the claim does not touch it, so a delivery
-- updates the index once, when it settles. The index also holds `dead` operations (no result);
-- the guard's lookup still names the unsettled states. PostgreSQL keeps its version: an update
-- there that changes an indexed column (`state` is in `operations_by_state`) writes a new
-- entry in every index whose predicate holds, whatever the predicate names.
DROP INDEX operations_unsettled_by_digest;
CREATE INDEX operations_unsettled_by_digest ON operations(request_digest)
    WHERE result IS NULL;
