-- toolledger core schema, version 1 (SQLite).
-- Timestamps are whole Unix seconds. JSON columns hold canonical JSON.

-- The principal store: the current-principal resolver re-reads it at every check.
CREATE TABLE principals (
    name        TEXT    PRIMARY KEY NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    tenant      TEXT    NOT NULL CHECK (length(tenant) BETWEEN 1 AND 128),
    roles       TEXT    NOT NULL CHECK (json_valid(roles) AND json_type(roles) = 'array'),
    scopes      TEXT    NOT NULL CHECK (json_valid(scopes) AND json_type(scopes) = 'array'),
    active      INTEGER NOT NULL CHECK (active IN (0, 1)),
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
) STRICT;

-- Bearer tokens, stored only as SHA-256 of the token.
CREATE TABLE principal_tokens (
    token_sha256 TEXT    PRIMARY KEY NOT NULL CHECK (length(token_sha256) = 64),
    principal    TEXT    NOT NULL REFERENCES principals(name) ON DELETE CASCADE,
    created_at   INTEGER NOT NULL
) STRICT;

-- One row per idempotency scope (tenant, subject, tool, key).
CREATE TABLE operations (
    id                 INTEGER PRIMARY KEY,
    tenant             TEXT    NOT NULL CHECK (length(tenant) BETWEEN 1 AND 128),
    subject            TEXT    NOT NULL CHECK (length(subject) BETWEEN 1 AND 128),
    tool               TEXT    NOT NULL CHECK (length(tool) BETWEEN 1 AND 128),
    idempotency_key    TEXT    NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 256),
    request_digest     TEXT    NOT NULL CHECK (length(request_digest) = 64),
    input_rev          TEXT    NOT NULL,
    output_rev         TEXT    NOT NULL,
    effect_rev         TEXT    NOT NULL,
    handler_rev        TEXT    NOT NULL,
    producer_rev       TEXT    NOT NULL,
    policy_rev         TEXT    NOT NULL,
    arguments          TEXT    NOT NULL CHECK (json_valid(arguments)),
    fingerprint        TEXT    CHECK (fingerprint IS NULL OR length(fingerprint) = 64),
    effect_kind        TEXT    NOT NULL CHECK (effect_kind IN ('inline', 'deferred')),
    -- Value lists are written as OR chains: SQLite evaluates an IN list of more than two
    -- constants by building a temporary index for every statement that writes a row, a
    -- measurable share of each ledger write.
    state              TEXT    NOT NULL CHECK (state = 'in_progress' OR state = 'applied'
                                   OR state = 'partial' OR state = 'accepted'
                                   OR state = 'processing' OR state = 'succeeded'
                                   OR state = 'outcome_unknown' OR state = 'failed'
                                   OR state = 'dead'),
    result             TEXT    CHECK (result IS NULL OR json_valid(result)),
    result_digest      TEXT    CHECK (result_digest IS NULL OR length(result_digest) = 64),
    status_ref         TEXT    NOT NULL UNIQUE CHECK (length(status_ref) BETWEEN 8 AND 128),
    authority_deadline INTEGER,
    retention_deadline INTEGER,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    UNIQUE (tenant, subject, tool, idempotency_key),
    CHECK ((result IS NULL) = (result_digest IS NULL)),
    CHECK (NOT (state = 'applied' OR state = 'partial' OR state = 'succeeded'
                OR state = 'failed') OR result IS NOT NULL)
) STRICT;
-- Keys shared across principals (one operation-id namespace per tool) are looked up by key.
CREATE INDEX operations_by_tool_key ON operations(tool, idempotency_key);

-- Append-only history of what happened to an operation (attempts, steps, compensations).
CREATE TABLE operation_events (
    id            INTEGER PRIMARY KEY,
    operation_id  INTEGER NOT NULL REFERENCES operations(id),
    at            INTEGER NOT NULL,
    kind          TEXT    NOT NULL CHECK (length(kind) BETWEEN 1 AND 64),
    detail        TEXT    NOT NULL CHECK (json_valid(detail))
) STRICT;
CREATE INDEX operation_events_by_operation ON operation_events(operation_id);
