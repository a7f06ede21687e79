------------------------------------------------------------------------------
-- Idempotency
------------------------------------------------------------------------------

CREATE TABLE payidem.idempotency (
	idem_key		text		NOT NULL,
	biz_type		text		NOT NULL,
	order_no		text,
	channel			text,
	channel_txn_id	text,
	amount			bigint,
	fingerprint		text,
	status			text		NOT NULL DEFAULT 'processing',
	result			jsonb,
	attempts		integer		NOT NULL DEFAULT 1,
	locked_until	timestamptz,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT idempotency_pkey PRIMARY KEY (idem_key),
	CONSTRAINT idempotency_key_length CHECK (pg_catalog.length(idem_key) BETWEEN 1 AND 255),
	CONSTRAINT idempotency_biz_type_length CHECK (pg_catalog.length(biz_type) BETWEEN 1 AND 64),
	CONSTRAINT idempotency_amount_positive CHECK (amount > 0),
	CONSTRAINT idempotency_status_known CHECK (status IN ('processing', 'completed', 'failed')),
	CONSTRAINT idempotency_attempts_positive CHECK (attempts > 0),
	CONSTRAINT idempotency_lease_when_processing CHECK (status <> 'processing' OR locked_until IS NOT NULL)
);
CREATE INDEX idempotency_updated ON payidem.idempotency (updated_at);
COMMENT ON TABLE payidem.idempotency IS
	'Idempotency keys (recommended shape biz_type:order_no:event): the primary key decides who runs the business logic.';
COMMENT ON COLUMN payidem.idempotency.fingerprint IS
	'Caller-supplied digest of the request parameters; a reuse of the key with another fingerprint is an error.';
COMMENT ON COLUMN payidem.idempotency.result IS
	'What the first successful run answered; replayed to duplicates.';
COMMENT ON COLUMN payidem.idempotency.attempts IS
	'How many times the key was claimed (first claim + reclaims after failure or lease expiry).';
COMMENT ON COLUMN payidem.idempotency.locked_until IS
	'Lease: while status is processing and this is in the future, the claim is held; after it, another caller may reclaim.';

