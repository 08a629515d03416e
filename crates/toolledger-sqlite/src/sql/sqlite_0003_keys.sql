-- toolledger core schema, version 3 (SQLite): the keys the ledger was written with.
-- The id of a key is the first 8 bytes of its SHA-256, in hex: it names the key without
-- revealing it. `fingerprint` holds the one fingerprint key (the ledger's fingerprints are only
-- comparable under it); `state` holds every requestState sealing key that was ever active, so
-- a rotation (new key listed before the old one) is recognised and a server started with keys
-- this database never saw is refused instead of answering false conflicts.
CREATE TABLE key_ids (
    purpose     TEXT    NOT NULL CHECK (purpose IN ('fingerprint', 'state')),
    key_id      TEXT    NOT NULL CHECK (length(key_id) = 16),
    recorded_at INTEGER NOT NULL CHECK (recorded_at >= 0),
    PRIMARY KEY (purpose, key_id)
);
