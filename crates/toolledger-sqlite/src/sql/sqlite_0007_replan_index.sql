-- toolledger core schema, version 7: the re-plan guard's index.
--
-- A guarded call under a new operation id whose intent (request digest) equals an earlier,
-- unsettled operation of the same caller and tool is refused as a possible duplicate. The
-- lookup reads this partial index, which holds only the unsettled operations: a row enters
-- it when it is recorded unfinished and leaves it when it settles, so it stays as small as
-- the set of operations in flight or unsure.
CREATE INDEX operations_unsettled_by_digest ON operations(request_digest)
    WHERE state IN ('in_progress', 'accepted', 'processing', 'outcome_unknown');
