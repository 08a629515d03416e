-- toolledger core schema, version 9 (PostgreSQL): the single-column rules of the tables every
-- call writes become domains.
--
-- PostgreSQL rebuilds a table's CHECK constraints from their stored text for every statement
-- that inserts or updates one of its rows, and checks all of them, whichever columns changed:
-- about a quarter of the server's work per forwarded call. A domain's rule is read once per
-- session and checked only where a value is assigned to a column of that domain. The rules are
-- the same as before (a NULL passes a domain's rule as it passed the column's `x IS NULL OR`);
-- NOT NULL stays on the columns, and the rules that span columns stay table constraints.
--
-- Changing a column's type rewrites its table and rebuilds its indexes under an exclusive lock:
-- this migration takes time in proportion to the ledger's size.

CREATE DOMAIN tl_text_1_64 AS TEXT CHECK (length(VALUE) BETWEEN 1 AND 64);
CREATE DOMAIN tl_text_1_128 AS TEXT CHECK (length(VALUE) BETWEEN 1 AND 128);
CREATE DOMAIN tl_text_1_256 AS TEXT CHECK (length(VALUE) BETWEEN 1 AND 256);
CREATE DOMAIN tl_status_ref AS TEXT CHECK (length(VALUE) BETWEEN 8 AND 128);
CREATE DOMAIN tl_sha256_hex AS TEXT CHECK (length(VALUE) = 64);
CREATE DOMAIN tl_json AS TEXT CHECK (VALUE IS NULL OR VALUE::jsonb IS NOT NULL);
CREATE DOMAIN tl_json_object AS TEXT CHECK (jsonb_typeof(VALUE::jsonb) = 'object');
CREATE DOMAIN tl_effect_kind AS TEXT CHECK (VALUE IN ('inline', 'deferred'));
CREATE DOMAIN tl_operation_state AS TEXT CHECK (VALUE IN ('in_progress', 'applied', 'partial',
    'accepted', 'processing', 'succeeded', 'outcome_unknown', 'failed', 'dead'));
CREATE DOMAIN tl_outbox_state AS TEXT
    CHECK (VALUE IN ('pending', 'processing', 'delivered', 'dead'));
CREATE DOMAIN tl_reconciled_via AS TEXT CHECK (VALUE IN ('worker', 'status_query'));
CREATE DOMAIN tl_count AS BIGINT CHECK (VALUE >= 0);
CREATE DOMAIN tl_attempt_limit AS BIGINT CHECK (VALUE BETWEEN 1 AND 1000);
CREATE DOMAIN tl_fencing_token AS BIGINT CHECK (VALUE > 0);

ALTER TABLE operations
    DROP CONSTRAINT operations_tenant_check,
    DROP CONSTRAINT operations_subject_check,
    DROP CONSTRAINT operations_tool_check,
    DROP CONSTRAINT operations_idempotency_key_check,
    DROP CONSTRAINT operations_request_digest_check,
    DROP CONSTRAINT operations_arguments_check,
    DROP CONSTRAINT operations_fingerprint_check,
    DROP CONSTRAINT operations_effect_kind_check,
    DROP CONSTRAINT operations_state_check,
    DROP CONSTRAINT operations_result_check,
    DROP CONSTRAINT operations_result_digest_check,
    DROP CONSTRAINT operations_status_ref_check,
    ALTER COLUMN tenant TYPE tl_text_1_128,
    ALTER COLUMN subject TYPE tl_text_1_128,
    ALTER COLUMN tool TYPE tl_text_1_128,
    ALTER COLUMN idempotency_key TYPE tl_text_1_256,
    ALTER COLUMN request_digest TYPE tl_sha256_hex,
    ALTER COLUMN arguments TYPE tl_json,
    ALTER COLUMN fingerprint TYPE tl_sha256_hex,
    ALTER COLUMN effect_kind TYPE tl_effect_kind,
    ALTER COLUMN state TYPE tl_operation_state,
    ALTER COLUMN result TYPE tl_json,
    ALTER COLUMN result_digest TYPE tl_sha256_hex,
    ALTER COLUMN status_ref TYPE tl_status_ref;

ALTER TABLE operation_events
    DROP CONSTRAINT operation_events_kind_check,
    DROP CONSTRAINT operation_events_detail_check,
    ALTER COLUMN kind TYPE tl_text_1_64,
    ALTER COLUMN detail TYPE tl_json;

ALTER TABLE deferred_intents
    DROP CONSTRAINT deferred_intents_provider_check,
    DROP CONSTRAINT deferred_intents_api_family_check,
    DROP CONSTRAINT deferred_intents_adapter_revision_check,
    DROP CONSTRAINT deferred_intents_turn_id_check,
    DROP CONSTRAINT deferred_intents_call_id_check,
    DROP CONSTRAINT deferred_intents_response_id_check,
    DROP CONSTRAINT deferred_intents_downstream_key_check,
    DROP CONSTRAINT deferred_intents_approval_digest_check,
    ALTER COLUMN provider TYPE tl_text_1_64,
    ALTER COLUMN api_family TYPE tl_text_1_64,
    ALTER COLUMN adapter_revision TYPE tl_text_1_64,
    ALTER COLUMN turn_id TYPE tl_text_1_128,
    ALTER COLUMN call_id TYPE tl_text_1_128,
    ALTER COLUMN response_id TYPE tl_text_1_128,
    ALTER COLUMN downstream_key TYPE tl_sha256_hex,
    ALTER COLUMN approval_digest TYPE tl_sha256_hex;

ALTER TABLE outbox
    DROP CONSTRAINT outbox_state_check,
    DROP CONSTRAINT outbox_fencing_token_check,
    DROP CONSTRAINT outbox_lease_owner_check,
    DROP CONSTRAINT outbox_attempt_count_check,
    DROP CONSTRAINT outbox_max_attempts_check,
    DROP CONSTRAINT outbox_last_error_check,
    ALTER COLUMN state TYPE tl_outbox_state,
    ALTER COLUMN fencing_token TYPE tl_count,
    ALTER COLUMN lease_owner TYPE tl_text_1_128,
    ALTER COLUMN attempt_count TYPE tl_count,
    ALTER COLUMN max_attempts TYPE tl_attempt_limit,
    ALTER COLUMN last_error TYPE tl_text_1_64;

ALTER TABLE local_receipts
    DROP CONSTRAINT local_receipts_receipt_id_check,
    DROP CONSTRAINT local_receipts_receipt_check,
    DROP CONSTRAINT local_receipts_receipt_digest_check,
    DROP CONSTRAINT local_receipts_call_binding_digest_check,
    DROP CONSTRAINT local_receipts_reconciled_via_check,
    DROP CONSTRAINT local_receipts_fencing_token_check,
    DROP CONSTRAINT local_receipts_query_identity_check,
    ALTER COLUMN receipt_id TYPE tl_text_1_128,
    ALTER COLUMN receipt TYPE tl_json_object,
    ALTER COLUMN receipt_digest TYPE tl_sha256_hex,
    ALTER COLUMN call_binding_digest TYPE tl_sha256_hex,
    ALTER COLUMN reconciled_via TYPE tl_reconciled_via,
    ALTER COLUMN fencing_token TYPE tl_fencing_token,
    ALTER COLUMN query_identity TYPE tl_text_1_128;
