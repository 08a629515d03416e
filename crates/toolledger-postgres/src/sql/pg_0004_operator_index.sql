-- toolledger core schema, version 4 (PostgreSQL): the operators' view of the ledger.
-- `toolledger operations list --state S` reads the newest operations of a few states among
-- many (the unsure ones: outcome_unknown, dead, in_progress, partial): this index finds them
-- without scanning the table, newest first by id.
CREATE INDEX operations_by_state ON operations(state, id);
