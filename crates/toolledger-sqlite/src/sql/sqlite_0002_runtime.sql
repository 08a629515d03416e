-- toolledger core schema, version 2 (SQLite): the deferred-effect runtime.
-- Approvals, the provider/approval context of each deferred intent, the outbox with leases and
-- fencing tokens, and local receipts. Timestamps are whole Unix seconds; JSON is canonical.

-- A human's consent bound to one exact intent. `binding` is the canonical binding object the
-- tool defines (request or payload digest, revisions, provider context…); `binding_digest` is
-- SHA-256 over the canonical envelope {tenant, subject, tool, idempotency_key, binding}.
-- Valid on the half-open interval [approved_at, expires_at); consumed at most once.
CREATE TABLE approvals (
    approval_id        TEXT    PRIMARY KEY NOT NULL CHECK (length(approval_id) BETWEEN 8 AND 128),
    tenant             TEXT    NOT NULL CHECK (length(tenant) BETWEEN 1 AND 128),
    subject            TEXT    NOT NULL CHECK (length(subject) BETWEEN 1 AND 128),
    tool               TEXT    NOT NULL CHECK (length(tool) BETWEEN 1 AND 128),
    idempotency_key    TEXT    NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 256),
    approver           TEXT    NOT NULL CHECK (length(approver) BETWEEN 1 AND 128),
    binding            TEXT    NOT NULL CHECK (json_valid(binding) AND json_type(binding) = 'object'),
    binding_digest     TEXT    NOT NULL CHECK (length(binding_digest) = 64),
    approved_at        INTEGER NOT NULL CHECK (approved_at >= 0),
    expires_at         INTEGER NOT NULL,
    consumed_at        INTEGER,
    consumed_operation INTEGER UNIQUE REFERENCES operations(id),
    CHECK (approved_at < expires_at),
    CHECK (approver <> subject),
    CHECK (consumed_operation IS NULL OR consumed_at IS NOT NULL),
    CHECK (consumed_at IS NULL OR consumed_at >= approved_at)
) STRICT;

-- The provider call context and approval binding of one deferred operation, written in the
-- same transaction as the operation row (transaction A) and never updated.
CREATE TABLE deferred_intents (
    operation_id        INTEGER PRIMARY KEY NOT NULL REFERENCES operations(id),
    provider            TEXT    NOT NULL CHECK (length(provider) BETWEEN 1 AND 64),
    api_family          TEXT    NOT NULL CHECK (length(api_family) BETWEEN 1 AND 64),
    adapter_revision    TEXT    NOT NULL CHECK (length(adapter_revision) BETWEEN 1 AND 64),
    turn_id             TEXT    NOT NULL CHECK (length(turn_id) BETWEEN 1 AND 128),
    call_id             TEXT    NOT NULL CHECK (length(call_id) BETWEEN 1 AND 128),
    response_id         TEXT    NOT NULL CHECK (length(response_id) BETWEEN 1 AND 128),
    downstream_key      TEXT    NOT NULL UNIQUE CHECK (length(downstream_key) = 64),
    approval_id         TEXT    UNIQUE REFERENCES approvals(approval_id),
    approver            TEXT,
    approval_digest     TEXT    CHECK (approval_digest IS NULL OR length(approval_digest) = 64),
    approved_at         INTEGER,
    approval_expires_at INTEGER,
    created_at          INTEGER NOT NULL,
    CHECK ((approval_id IS NULL) = (approver IS NULL)
       AND (approval_id IS NULL) = (approval_digest IS NULL)
       AND (approval_id IS NULL) = (approved_at IS NULL)
       AND (approval_id IS NULL) = (approval_expires_at IS NULL)),
    CHECK (approved_at IS NULL OR approved_at < approval_expires_at)
) STRICT;

-- Pending delivery of one accepted operation. A claim moves it to `processing` under a lease
-- and increments `fencing_token`; every later transition is conditional on that token.
CREATE TABLE outbox (
    id             INTEGER PRIMARY KEY,
    operation_id   INTEGER NOT NULL UNIQUE REFERENCES operations(id),
    -- An OR chain, not IN: see the operations table in sqlite_0001_core.sql.
    state          TEXT    NOT NULL CHECK (state = 'pending' OR state = 'processing'
                                           OR state = 'delivered' OR state = 'dead'),
    fencing_token  INTEGER NOT NULL CHECK (fencing_token >= 0),
    lease_owner    TEXT    CHECK (lease_owner IS NULL OR length(lease_owner) BETWEEN 1 AND 128),
    lease_until    INTEGER,
    attempt_count  INTEGER NOT NULL CHECK (attempt_count >= 0),
    max_attempts   INTEGER NOT NULL CHECK (max_attempts BETWEEN 1 AND 1000),
    last_error     TEXT    CHECK (last_error IS NULL OR length(last_error) BETWEEN 1 AND 64),
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    delivered_at   INTEGER,
    CHECK ((state = 'processing') = (lease_owner IS NOT NULL)),
    CHECK ((lease_owner IS NULL) = (lease_until IS NULL)),
    CHECK ((state = 'delivered') = (delivered_at IS NOT NULL)),
    CHECK (attempt_count <= max_attempts)
) STRICT;
CREATE INDEX outbox_ready ON outbox(state, lease_until);

-- Downstream evidence reconciled into the ledger (transaction C), one per operation.
CREATE TABLE local_receipts (
    id                  INTEGER PRIMARY KEY,
    operation_id        INTEGER NOT NULL UNIQUE REFERENCES operations(id),
    receipt_id          TEXT    NOT NULL UNIQUE CHECK (length(receipt_id) BETWEEN 1 AND 128),
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
