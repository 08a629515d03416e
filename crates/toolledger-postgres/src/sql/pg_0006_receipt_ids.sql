-- toolledger core schema, version 6 (PostgreSQL): a local receipt's `receipt_id` is no longer
-- unique across operations (sqlite_0006_receipt_ids.sql explains why).
ALTER TABLE local_receipts DROP CONSTRAINT local_receipts_receipt_id_key;
