\echo Use "CREATE EXTENSION payidem" to load this file. \quit

/*
 * payidem 1.0 — schema.
 *
 * Money is bigint in the currency's minor unit; rates are numeric(7,6)
 * fractions.  Status columns of "order", payment and refund reference the
 * state-machine whitelist (payidem.state), so an unknown status is refused by a
 * foreign key; which changes between statuses are allowed is enforced by the
 * state-machine triggers.  Nothing is granted to PUBLIC.
 */

------------------------------------------------------------------------------
-- State machines: the data-driven whitelist and the append-only log
------------------------------------------------------------------------------

CREATE TABLE payidem.state (
	entity		text	NOT NULL,
	status		text	NOT NULL,
	initial		boolean	NOT NULL DEFAULT false,
	terminal	boolean	NOT NULL DEFAULT false,
	builtin		boolean	NOT NULL DEFAULT false,
	CONSTRAINT state_pkey PRIMARY KEY (entity, status),
	CONSTRAINT state_entity_format CHECK (entity ~ '^[a-z][a-z0-9_]{0,31}$'),
	CONSTRAINT state_status_format CHECK (status ~ '^[a-z][a-z0-9_]{0,31}$'),
	CONSTRAINT state_initial_not_terminal CHECK (NOT (initial AND terminal))
);
CREATE UNIQUE INDEX state_one_initial ON payidem.state (entity) WHERE initial;
COMMENT ON TABLE payidem.state IS
	'State-machine whitelist: the statuses of each entity (order, payment, refund, or one a DBA adds).';
COMMENT ON COLUMN payidem.state.initial IS
	'The status a new row must be inserted with; exactly one per entity.';
COMMENT ON COLUMN payidem.state.terminal IS
	'No transition may leave a terminal status.';
COMMENT ON COLUMN payidem.state.builtin IS
	'Row installed by the extension (not dumped by pg_dump; CREATE EXTENSION recreates it).';

CREATE TABLE payidem.transition (
	entity		text	NOT NULL,
	from_status	text	NOT NULL,
	to_status	text	NOT NULL,
	builtin		boolean	NOT NULL DEFAULT false,
	CONSTRAINT transition_pkey PRIMARY KEY (entity, from_status, to_status),
	CONSTRAINT transition_from_known FOREIGN KEY (entity, from_status)
		REFERENCES payidem.state (entity, status),
	CONSTRAINT transition_to_known FOREIGN KEY (entity, to_status)
		REFERENCES payidem.state (entity, status),
	CONSTRAINT transition_not_to_self CHECK (from_status <> to_status)
);
CREATE INDEX transition_to ON payidem.transition (entity, to_status);
COMMENT ON TABLE payidem.transition IS
	'State-machine whitelist: the allowed status changes. Insert rows to add a flow; the triggers see it in the next statement.';
COMMENT ON COLUMN payidem.transition.builtin IS
	'Row installed by the extension (not dumped by pg_dump; CREATE EXTENSION recreates it).';

INSERT INTO payidem.state (entity, status, initial, terminal, builtin) VALUES
	('order',   'pending',            true,  false, true),
	('order',   'paid',               false, false, true),
	('order',   'partially_refunded', false, false, true),
	('order',   'refunded',           false, true,  true),
	('order',   'closed',             false, true,  true),
	('payment', 'pending',            true,  false, true),
	('payment', 'succeeded',          false, false, true),
	('payment', 'failed',             false, true,  true),
	('payment', 'closed',             false, false, true),
	('payment', 'partially_refunded', false, false, true),
	('payment', 'refunded',           false, true,  true),
	('refund',  'pending',            true,  false, true),
	('refund',  'succeeded',          false, true,  true),
	('refund',  'failed',             false, true,  true);

INSERT INTO payidem.transition (entity, from_status, to_status, builtin) VALUES
	('order',   'pending',            'paid',               true),
	('order',   'pending',            'closed',             true),
	('order',   'paid',               'partially_refunded', true),
	('order',   'paid',               'refunded',           true),
	('order',   'partially_refunded', 'refunded',           true),
	('payment', 'pending',            'succeeded',          true),
	('payment', 'pending',            'failed',             true),
	('payment', 'pending',            'closed',             true),
	('payment', 'closed',             'succeeded',          true),
	('payment', 'succeeded',          'partially_refunded', true),
	('payment', 'succeeded',          'refunded',           true),
	('payment', 'partially_refunded', 'refunded',           true),
	('refund',  'pending',            'succeeded',          true),
	('refund',  'pending',            'failed',             true);

CREATE TABLE payidem.status_log (
	log_id		bigserial	NOT NULL,
	entity		text		NOT NULL,
	entity_no	text		NOT NULL,
	from_status	text,
	to_status	text		NOT NULL,
	changed_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	changed_by	text		NOT NULL DEFAULT CURRENT_USER,
	txid		bigint		NOT NULL DEFAULT pg_catalog.txid_current(),
	CONSTRAINT status_log_pkey PRIMARY KEY (log_id),
	CONSTRAINT status_log_changed CHECK (from_status IS DISTINCT FROM to_status)
);
CREATE INDEX status_log_entity ON payidem.status_log (entity, entity_no, log_id);
COMMENT ON TABLE payidem.status_log IS
	'Append-only history of every status an order, payment or refund took (insert = from_status NULL).';
COMMENT ON COLUMN payidem.status_log.entity_no IS
	'order_no, payment_no or refund_no of the row that changed.';
COMMENT ON COLUMN payidem.status_log.txid IS
	'Transaction that made the change (txid_current()), to group changes made together.';

------------------------------------------------------------------------------
-- Merchants and channels
------------------------------------------------------------------------------

CREATE TABLE payidem.merchant (
	merchant_no		text			NOT NULL,
	merchant_name	text			NOT NULL,
	merchant_type	text			NOT NULL,
	fee_rate		numeric(7,6)	NOT NULL,
	settle_cycle	text			NOT NULL DEFAULT 'T1',
	status			text			NOT NULL DEFAULT 'active',
	api_key			text			NOT NULL,
	created_at		timestamptz		NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz		NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT merchant_pkey PRIMARY KEY (merchant_no),
	CONSTRAINT merchant_api_key_key UNIQUE (api_key),
	-- 'M' + 15 characters of Crockford base32 (no I, L, O, U): random, not a counter
	CONSTRAINT merchant_no_format CHECK (merchant_no ~ '^M[0-9A-HJKMNP-TV-Z]{15}$'),
	CONSTRAINT merchant_name_length CHECK (pg_catalog.length(pg_catalog.btrim(merchant_name)) BETWEEN 1 AND 128),
	CONSTRAINT merchant_type_format CHECK (merchant_type ~ '^[a-z][a-z0-9_]{0,31}$'),
	CONSTRAINT merchant_fee_rate_range CHECK (fee_rate >= 0 AND fee_rate < 1),
	CONSTRAINT merchant_settle_cycle_format CHECK (settle_cycle ~ '^[TD][0-9]{1,2}$'),
	CONSTRAINT merchant_status_known CHECK (status IN ('active', 'frozen', 'closed')),
	CONSTRAINT merchant_api_key_format CHECK (api_key ~ '^[0-9A-Za-z_-]{16,64}$')
);
COMMENT ON TABLE payidem.merchant IS
	'Merchants of the platform. Secrets never live here: see merchant_secret.';
COMMENT ON COLUMN payidem.merchant.merchant_no IS
	'M + 15 random Crockford base32 characters: unguessable, not a counter.';
COMMENT ON COLUMN payidem.merchant.merchant_type IS
	'Merchant category; channels may admit only some categories (channel.allowed_merchant_types).';
COMMENT ON COLUMN payidem.merchant.fee_rate IS
	'What the merchant pays, as a fraction (0.006000 = 0.6%); fee = round(amount * rate) half-up.';
COMMENT ON COLUMN payidem.merchant.settle_cycle IS
	'Settlement cycle: T<n> (n working days after the trade) or D<n> (n calendar days).';
COMMENT ON COLUMN payidem.merchant.api_key IS
	'Public key identifying the merchant in API calls; its secret is in merchant_secret.';

CREATE TABLE payidem.merchant_secret (
	merchant_no		text		NOT NULL,
	secret_version	integer		NOT NULL,
	key_version		integer		NOT NULL,
	nonce			bytea		NOT NULL,
	ciphertext		bytea		NOT NULL,
	auth_tag		bytea		NOT NULL,
	valid_from		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	valid_until		timestamptz,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT merchant_secret_pkey PRIMARY KEY (merchant_no, secret_version),
	CONSTRAINT merchant_secret_merchant_fkey FOREIGN KEY (merchant_no)
		REFERENCES payidem.merchant (merchant_no),
	CONSTRAINT merchant_secret_version_positive CHECK (secret_version > 0),
	CONSTRAINT merchant_secret_key_version_positive CHECK (key_version > 0),
	CONSTRAINT merchant_secret_nonce_length CHECK (pg_catalog.length(nonce) = 12),
	CONSTRAINT merchant_secret_tag_length CHECK (pg_catalog.length(auth_tag) = 16),
	CONSTRAINT merchant_secret_ciphertext_nonempty CHECK (pg_catalog.length(ciphertext) > 0),
	CONSTRAINT merchant_secret_window CHECK (valid_until IS NULL OR valid_until > valid_from)
);
-- one current secret per merchant; older ones carry the end of their grace window
CREATE UNIQUE INDEX merchant_secret_one_current ON payidem.merchant_secret (merchant_no)
	WHERE valid_until IS NULL;
COMMENT ON TABLE payidem.merchant_secret IS
	'Merchant API secrets, AES-256-GCM encrypted under the master key; several may be valid at once during a rotation.';
COMMENT ON COLUMN payidem.merchant_secret.key_version IS
	'Version of the master key the record is encrypted with (for master-key rotation).';
COMMENT ON COLUMN payidem.merchant_secret.nonce IS
	'96-bit random GCM nonce, new for every record.';
COMMENT ON COLUMN payidem.merchant_secret.valid_until IS
	'End of validity (set on rotation to now() + grace); NULL = current secret.';

CREATE TABLE payidem.channel (
	channel_no				text			NOT NULL,
	channel_type			text			NOT NULL,
	fee_rate				numeric(7,6)	NOT NULL,
	status					text			NOT NULL DEFAULT 'active',
	weight					integer			NOT NULL DEFAULT 100,
	allowed_merchant_types	text[],
	single_limit			bigint,
	daily_limit				bigint,
	created_at				timestamptz		NOT NULL DEFAULT pg_catalog.now(),
	updated_at				timestamptz		NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT channel_pkey PRIMARY KEY (channel_no),
	CONSTRAINT channel_no_format CHECK (channel_no ~ '^[A-Z][A-Z0-9_]{1,31}$'),
	CONSTRAINT channel_type_format CHECK (channel_type ~ '^[a-z][a-z0-9_]{0,31}$'),
	CONSTRAINT channel_fee_rate_range CHECK (fee_rate >= 0 AND fee_rate < 1),
	CONSTRAINT channel_status_known CHECK (status IN ('active', 'disabled')),
	CONSTRAINT channel_weight_range CHECK (weight BETWEEN 0 AND 10000),
	CONSTRAINT channel_allowed_types_valid CHECK (
		allowed_merchant_types IS NULL
		OR (pg_catalog.cardinality(allowed_merchant_types) > 0
			AND pg_catalog.array_position(allowed_merchant_types, NULL) IS NULL
			AND pg_catalog.array_to_string(allowed_merchant_types, ',')
				~ '^[a-z][a-z0-9_]{0,31}(,[a-z][a-z0-9_]{0,31})*$')),
	CONSTRAINT channel_single_limit_positive CHECK (single_limit > 0),
	CONSTRAINT channel_daily_limit_positive CHECK (daily_limit > 0),
	CONSTRAINT channel_limits_ordered CHECK (single_limit <= daily_limit)
);
CREATE INDEX channel_route ON payidem.channel (channel_type) WHERE status = 'active';
COMMENT ON TABLE payidem.channel IS
	'Payment channels (an account at WeChat Pay, Alipay, UnionPay, ...). Keys and certificates are in channel_config.';
COMMENT ON COLUMN payidem.channel.channel_no IS
	'Channel code, upper case, e.g. WXPAY_001.';
COMMENT ON COLUMN payidem.channel.fee_rate IS
	'What the channel costs the platform, as a fraction of the amount.';
COMMENT ON COLUMN payidem.channel.weight IS
	'Relative share of traffic when several eligible channels of one type exist (0 = none).';
COMMENT ON COLUMN payidem.channel.allowed_merchant_types IS
	'Merchant categories the channel admits; NULL = all.';
COMMENT ON COLUMN payidem.channel.single_limit IS
	'Largest amount of one payment on this channel (minor units); NULL = no limit.';
COMMENT ON COLUMN payidem.channel.daily_limit IS
	'Largest sum of pending + succeeded attempts per merchant and day on this channel; NULL = no limit.';

CREATE TABLE payidem.channel_config (
	channel_no	text		NOT NULL,
	key_version	integer		NOT NULL,
	nonce		bytea		NOT NULL,
	ciphertext	bytea		NOT NULL,
	auth_tag	bytea		NOT NULL,
	created_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT channel_config_pkey PRIMARY KEY (channel_no),
	CONSTRAINT channel_config_channel_fkey FOREIGN KEY (channel_no)
		REFERENCES payidem.channel (channel_no),
	CONSTRAINT channel_config_key_version_positive CHECK (key_version > 0),
	CONSTRAINT channel_config_nonce_length CHECK (pg_catalog.length(nonce) = 12),
	CONSTRAINT channel_config_tag_length CHECK (pg_catalog.length(auth_tag) = 16),
	CONSTRAINT channel_config_ciphertext_nonempty CHECK (pg_catalog.length(ciphertext) > 0)
);
COMMENT ON TABLE payidem.channel_config IS
	'Channel keys and certificates (a jsonb document), AES-256-GCM encrypted under the master key.';
COMMENT ON COLUMN payidem.channel_config.key_version IS
	'Version of the master key the record is encrypted with.';

CREATE TABLE payidem.merchant_channel (
	merchant_no		text			NOT NULL,
	channel_no		text			NOT NULL,
	fee_rate		numeric(7,6),
	single_limit	bigint,
	daily_limit		bigint,
	status			text			NOT NULL DEFAULT 'active',
	weight			integer			NOT NULL DEFAULT 100,
	created_at		timestamptz		NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz		NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT merchant_channel_pkey PRIMARY KEY (merchant_no, channel_no),
	CONSTRAINT merchant_channel_merchant_fkey FOREIGN KEY (merchant_no)
		REFERENCES payidem.merchant (merchant_no),
	CONSTRAINT merchant_channel_channel_fkey FOREIGN KEY (channel_no)
		REFERENCES payidem.channel (channel_no),
	CONSTRAINT merchant_channel_fee_rate_range CHECK (fee_rate >= 0 AND fee_rate < 1),
	CONSTRAINT merchant_channel_single_limit_positive CHECK (single_limit > 0),
	CONSTRAINT merchant_channel_daily_limit_positive CHECK (daily_limit > 0),
	CONSTRAINT merchant_channel_limits_ordered CHECK (single_limit <= daily_limit),
	CONSTRAINT merchant_channel_status_known CHECK (status IN ('active', 'disabled')),
	CONSTRAINT merchant_channel_weight_range CHECK (weight BETWEEN 0 AND 10000)
);
CREATE INDEX merchant_channel_channel ON payidem.merchant_channel (channel_no);
COMMENT ON TABLE payidem.merchant_channel IS
	'Which channels a merchant may use, with its own rate, limits and routing weight.';
COMMENT ON COLUMN payidem.merchant_channel.fee_rate IS
	'Merchant rate on this channel; NULL = merchant.fee_rate.';
COMMENT ON COLUMN payidem.merchant_channel.single_limit IS
	'Largest amount of one payment of this merchant on this channel; NULL = no limit.';
COMMENT ON COLUMN payidem.merchant_channel.daily_limit IS
	'Largest sum of pending + succeeded attempts of this merchant on this channel per day; NULL = no limit.';

------------------------------------------------------------------------------
-- Orders, payment attempts, refunds
------------------------------------------------------------------------------

CREATE TABLE payidem."order" (
	order_no		text		NOT NULL,
	merchant_no		text		NOT NULL,
	out_trade_no	text		NOT NULL,
	subject			text		NOT NULL,
	body			text,
	amount			bigint		NOT NULL,
	currency		char(3)		NOT NULL DEFAULT 'CNY',
	status			text		NOT NULL DEFAULT 'pending',
	status_entity	text		NOT NULL GENERATED ALWAYS AS ('order'::text) STORED,
	refunded_amount	bigint		NOT NULL DEFAULT 0,
	notify_url		text,
	return_url		text,
	notify_status	text		NOT NULL DEFAULT 'none',
	notify_attempts	integer		NOT NULL DEFAULT 0,
	next_notify_at	timestamptz,
	expire_at		timestamptz	NOT NULL,
	paid_at			timestamptz,
	paid_payment_no	text,
	closed_at		timestamptz,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT order_pkey PRIMARY KEY (order_no),
	CONSTRAINT order_out_trade_no_key UNIQUE (merchant_no, out_trade_no),
	CONSTRAINT order_merchant_key UNIQUE (order_no, merchant_no),
	CONSTRAINT order_merchant_fkey FOREIGN KEY (merchant_no)
		REFERENCES payidem.merchant (merchant_no),
	CONSTRAINT order_status_known FOREIGN KEY (status_entity, status)
		REFERENCES payidem.state (entity, status),
	CONSTRAINT order_no_format CHECK (order_no ~ '^PO[0-9]{24}$'),
	CONSTRAINT order_out_trade_no_format CHECK (out_trade_no ~ '^[0-9A-Za-z_.|*@-]{1,64}$'),
	CONSTRAINT order_subject_length CHECK (pg_catalog.length(pg_catalog.btrim(subject)) BETWEEN 1 AND 256),
	CONSTRAINT order_body_length CHECK (pg_catalog.length(body) <= 1024),
	CONSTRAINT order_amount_positive CHECK (amount > 0),
	CONSTRAINT order_currency_format CHECK (currency ~ '^[A-Z]{3}$'),
	CONSTRAINT order_refunded_range CHECK (refunded_amount >= 0 AND refunded_amount <= amount),
	CONSTRAINT order_notify_url_format CHECK (
		notify_url ~ '^https?://[^[:space:]]+$' AND pg_catalog.length(notify_url) <= 1024),
	CONSTRAINT order_return_url_format CHECK (
		return_url ~ '^https?://[^[:space:]]+$' AND pg_catalog.length(return_url) <= 1024),
	CONSTRAINT order_notify_status_known CHECK (notify_status IN ('none', 'pending', 'sent', 'failed')),
	CONSTRAINT order_notify_attempts_nonnegative CHECK (notify_attempts >= 0),
	CONSTRAINT order_expire_after_create CHECK (expire_at > created_at),
	CONSTRAINT order_paid_payment_format CHECK (paid_payment_no ~ '^PY[0-9]{24}$')
);
CREATE INDEX order_notify_due ON payidem."order" (next_notify_at) WHERE notify_status = 'pending';
CREATE INDEX order_pending_expiry ON payidem."order" (expire_at) WHERE status = 'pending';
CREATE INDEX order_merchant_created ON payidem."order" (merchant_no, created_at);
COMMENT ON TABLE payidem."order" IS
	'Merchant orders: one order, possibly several payment attempts.';
COMMENT ON COLUMN payidem."order".order_no IS
	'Platform order number, payidem.gen_order_no(''PO'').';
COMMENT ON COLUMN payidem."order".out_trade_no IS
	'The merchant''s own order number; unique per merchant (a repeat with the same amount and subject returns the same order).';
COMMENT ON COLUMN payidem."order".amount IS
	'Amount in the currency''s minor unit (fen, cents).';
COMMENT ON COLUMN payidem."order".status IS
	'Order status, one of payidem.state where entity = ''order''; changes follow payidem.transition.';
COMMENT ON COLUMN payidem."order".status_entity IS
	'Always ''order'': lets the status reference payidem.state (entity, status).';
COMMENT ON COLUMN payidem."order".refunded_amount IS
	'Sum of succeeded refunds, minor units; never above amount.';
COMMENT ON COLUMN payidem."order".notify_status IS
	'Merchant notification (outbox): none, pending (due at next_notify_at), sent, failed (gave up).';
COMMENT ON COLUMN payidem."order".paid_payment_no IS
	'The payment attempt that paid the order (its refunds move the order''s refunded_amount).';
COMMENT ON COLUMN payidem."order".expire_at IS
	'No payment may start after this instant.';

CREATE TABLE payidem.payment (
	payment_no		text		NOT NULL,
	order_no		text		NOT NULL,
	merchant_no		text		NOT NULL,
	channel_no		text		NOT NULL,
	amount			bigint		NOT NULL,
	status			text		NOT NULL DEFAULT 'pending',
	status_entity	text		NOT NULL GENERATED ALWAYS AS ('payment'::text) STORED,
	transaction_id	text,
	fee_amount		bigint,
	cost_amount		bigint,
	refunded_amount	bigint		NOT NULL DEFAULT 0,
	paid_at			timestamptz,
	closed_at		timestamptz,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT payment_pkey PRIMARY KEY (payment_no),
	CONSTRAINT payment_transaction_key UNIQUE (channel_no, transaction_id),
	CONSTRAINT payment_order_key UNIQUE (payment_no, order_no),
	CONSTRAINT payment_order_fkey FOREIGN KEY (order_no, merchant_no)
		REFERENCES payidem."order" (order_no, merchant_no),
	CONSTRAINT payment_channel_fkey FOREIGN KEY (channel_no)
		REFERENCES payidem.channel (channel_no),
	CONSTRAINT payment_status_known FOREIGN KEY (status_entity, status)
		REFERENCES payidem.state (entity, status),
	CONSTRAINT payment_no_format CHECK (payment_no ~ '^PY[0-9]{24}$'),
	CONSTRAINT payment_amount_positive CHECK (amount > 0),
	CONSTRAINT payment_transaction_id_format CHECK (transaction_id ~ '^[[:graph:]]{1,64}$'),
	CONSTRAINT payment_fee_range CHECK (fee_amount >= 0 AND fee_amount <= amount),
	CONSTRAINT payment_cost_range CHECK (cost_amount >= 0 AND cost_amount <= amount),
	CONSTRAINT payment_refunded_range CHECK (refunded_amount >= 0 AND refunded_amount <= amount)
);
-- At most one pending attempt per order: two concurrent begin_payment calls
-- can never both leave one behind.
CREATE UNIQUE INDEX payment_one_pending_per_order ON payidem.payment (order_no) WHERE status = 'pending';
CREATE INDEX payment_order ON payidem.payment (order_no);
CREATE INDEX payment_channel_paid ON payidem.payment (channel_no, paid_at);
CREATE INDEX payment_merchant_channel_created ON payidem.payment (merchant_no, channel_no, created_at);
COMMENT ON TABLE payidem.payment IS
	'Payment attempts: one order may have several (e.g. WeChat failed, then Alipay succeeded); at most one pending.';
COMMENT ON COLUMN payidem.payment.payment_no IS
	'Platform payment number, payidem.gen_order_no(''PY''); sent to the channel as its out_trade_no.';
COMMENT ON COLUMN payidem.payment.status IS
	'Attempt status, one of payidem.state where entity = ''payment''.';
COMMENT ON COLUMN payidem.payment.status_entity IS
	'Always ''payment'': lets the status reference payidem.state (entity, status).';
COMMENT ON COLUMN payidem.payment.transaction_id IS
	'The channel''s transaction id; unique per channel.';
COMMENT ON COLUMN payidem.payment.fee_amount IS
	'What the merchant pays for this payment, round(amount * rate) half-up, minor units.';
COMMENT ON COLUMN payidem.payment.cost_amount IS
	'What the channel charges the platform for this payment, minor units.';
COMMENT ON COLUMN payidem.payment.refunded_amount IS
	'Sum of succeeded refunds of this payment, minor units; never above amount.';

CREATE TABLE payidem.refund (
	refund_no			text		NOT NULL,
	payment_no			text		NOT NULL,
	order_no			text		NOT NULL,
	merchant_no			text		NOT NULL,
	out_refund_no		text		NOT NULL,
	amount				bigint		NOT NULL,
	status				text		NOT NULL DEFAULT 'pending',
	status_entity		text		NOT NULL GENERATED ALWAYS AS ('refund'::text) STORED,
	channel_refund_id	text,
	reason				text,
	refunded_at			timestamptz,
	created_at			timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at			timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT refund_pkey PRIMARY KEY (refund_no),
	CONSTRAINT refund_out_refund_no_key UNIQUE (merchant_no, out_refund_no),
	CONSTRAINT refund_payment_fkey FOREIGN KEY (payment_no, order_no)
		REFERENCES payidem.payment (payment_no, order_no),
	CONSTRAINT refund_order_fkey FOREIGN KEY (order_no, merchant_no)
		REFERENCES payidem."order" (order_no, merchant_no),
	CONSTRAINT refund_status_known FOREIGN KEY (status_entity, status)
		REFERENCES payidem.state (entity, status),
	CONSTRAINT refund_no_format CHECK (refund_no ~ '^RF[0-9]{24}$'),
	CONSTRAINT refund_out_refund_no_format CHECK (out_refund_no ~ '^[0-9A-Za-z_.|*@-]{1,64}$'),
	CONSTRAINT refund_amount_positive CHECK (amount > 0),
	CONSTRAINT refund_channel_refund_id_format CHECK (channel_refund_id ~ '^[[:graph:]]{1,64}$'),
	CONSTRAINT refund_reason_length CHECK (pg_catalog.length(reason) <= 256)
);
CREATE INDEX refund_payment ON payidem.refund (payment_no);
CREATE INDEX refund_order ON payidem.refund (order_no);
COMMENT ON TABLE payidem.refund IS
	'Refunds of a payment; pending + succeeded refunds never exceed the payment amount.';
COMMENT ON COLUMN payidem.refund.refund_no IS
	'Platform refund number, payidem.gen_order_no(''RF'').';
COMMENT ON COLUMN payidem.refund.out_refund_no IS
	'The merchant''s own refund number; unique per merchant.';
COMMENT ON COLUMN payidem.refund.status IS
	'Refund status, one of payidem.state where entity = ''refund''.';
COMMENT ON COLUMN payidem.refund.status_entity IS
	'Always ''refund'': lets the status reference payidem.state (entity, status).';
COMMENT ON COLUMN payidem.refund.channel_refund_id IS
	'The channel''s id for the refund, once it has one.';

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

------------------------------------------------------------------------------
-- Anomalies and reconciliation
------------------------------------------------------------------------------

CREATE TABLE payidem.anomaly (
	anomaly_id		bigserial	NOT NULL,
	kind			text		NOT NULL,
	order_no		text,
	payment_no		text,
	channel_no		text,
	amount			bigint,
	detail			jsonb		NOT NULL DEFAULT '{}',
	handle_status	text		NOT NULL DEFAULT 'open',
	handled_by		text,
	handled_at		timestamptz,
	note			text,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT anomaly_pkey PRIMARY KEY (anomaly_id),
	CONSTRAINT anomaly_order_fkey FOREIGN KEY (order_no)
		REFERENCES payidem."order" (order_no),
	CONSTRAINT anomaly_payment_fkey FOREIGN KEY (payment_no)
		REFERENCES payidem.payment (payment_no),
	CONSTRAINT anomaly_payment_order_fkey FOREIGN KEY (payment_no, order_no)
		REFERENCES payidem.payment (payment_no, order_no),
	CONSTRAINT anomaly_channel_fkey FOREIGN KEY (channel_no)
		REFERENCES payidem.channel (channel_no),
	CONSTRAINT anomaly_kind_format CHECK (kind ~ '^[a-z][a-z0-9_]{1,63}$'),
	CONSTRAINT anomaly_amount_nonnegative CHECK (amount >= 0),
	CONSTRAINT anomaly_detail_object CHECK (pg_catalog.jsonb_typeof(detail) = 'object'),
	CONSTRAINT anomaly_handle_status_known CHECK (handle_status IN ('open', 'handled', 'ignored')),
	CONSTRAINT anomaly_handled_consistent CHECK ((handle_status = 'open') = (handled_at IS NULL))
);
CREATE INDEX anomaly_open ON payidem.anomaly (created_at) WHERE handle_status = 'open';
CREATE INDEX anomaly_order ON payidem.anomaly (order_no);
CREATE INDEX anomaly_payment ON payidem.anomaly (payment_no);
COMMENT ON TABLE payidem.anomaly IS
	'Money that needs a person: paid_after_close, duplicate_payment, amount_mismatch, unknown_transaction, channel_only, ...';
COMMENT ON COLUMN payidem.anomaly.kind IS
	'What went wrong: paid_after_close, duplicate_payment, amount_mismatch, transaction_conflict, unknown_transaction, channel_only, ...';
COMMENT ON COLUMN payidem.anomaly.amount IS
	'Money concerned, minor units (e.g. the amount to refund).';
COMMENT ON COLUMN payidem.anomaly.handle_status IS
	'open until a person marks it handled or ignored (handled_at/handled_by/note say when, who and why).';

CREATE TABLE payidem.channel_bill (
	channel_no		text		NOT NULL,
	bill_date		date		NOT NULL,
	transaction_id	text		NOT NULL,
	payment_no		text,
	amount			bigint		NOT NULL,
	fee				bigint		NOT NULL DEFAULT 0,
	status			text		NOT NULL,
	paid_at			timestamptz,
	imported_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT channel_bill_pkey PRIMARY KEY (channel_no, bill_date, transaction_id),
	CONSTRAINT channel_bill_channel_fkey FOREIGN KEY (channel_no)
		REFERENCES payidem.channel (channel_no),
	CONSTRAINT channel_bill_transaction_id_format CHECK (transaction_id ~ '^[[:graph:]]{1,64}$'),
	CONSTRAINT channel_bill_amount_positive CHECK (amount > 0),
	CONSTRAINT channel_bill_fee_nonnegative CHECK (fee >= 0),
	CONSTRAINT channel_bill_status_known CHECK (status IN ('succeeded', 'refunded'))
);
CREATE INDEX channel_bill_transaction ON payidem.channel_bill (channel_no, transaction_id);
COMMENT ON TABLE payidem.channel_bill IS
	'Channel statement lines as imported (COPY-able: channel_no, bill_date, transaction_id, payment_no, amount, fee, status, paid_at).';
COMMENT ON COLUMN payidem.channel_bill.bill_date IS
	'The channel''s business day, cut at midnight in payidem.bill_timezone.';
COMMENT ON COLUMN payidem.channel_bill.payment_no IS
	'Our payment number as the channel echoes it (not trusted: no foreign key).';
COMMENT ON COLUMN payidem.channel_bill.fee IS
	'What the channel charged for the line, minor units.';

CREATE TABLE payidem.recon_batch (
	recon_batch_no	text		NOT NULL,
	channel_no		text		NOT NULL,
	bill_date		date		NOT NULL,
	status			text		NOT NULL DEFAULT 'running',
	matched			bigint		NOT NULL DEFAULT 0,
	platform_only	bigint		NOT NULL DEFAULT 0,
	channel_only	bigint		NOT NULL DEFAULT 0,
	amount_mismatch	bigint		NOT NULL DEFAULT 0,
	status_mismatch	bigint		NOT NULL DEFAULT 0,
	started_at		timestamptz	NOT NULL DEFAULT pg_catalog.clock_timestamp(),
	finished_at		timestamptz,
	CONSTRAINT recon_batch_pkey PRIMARY KEY (recon_batch_no),
	CONSTRAINT recon_batch_day_key UNIQUE (recon_batch_no, channel_no, bill_date),
	CONSTRAINT recon_batch_channel_fkey FOREIGN KEY (channel_no)
		REFERENCES payidem.channel (channel_no),
	CONSTRAINT recon_batch_no_format CHECK (recon_batch_no ~ '^[0-9A-Z_-]{1,64}$'),
	CONSTRAINT recon_batch_status_known CHECK (status IN ('running', 'done', 'failed')),
	CONSTRAINT recon_batch_counts_nonnegative CHECK (
		matched >= 0 AND platform_only >= 0 AND channel_only >= 0
		AND amount_mismatch >= 0 AND status_mismatch >= 0),
	CONSTRAINT recon_batch_finished_after_start CHECK (finished_at >= started_at),
	CONSTRAINT recon_batch_finished_when_ended CHECK ((status = 'running') = (finished_at IS NULL))
);
CREATE INDEX recon_batch_channel_day ON payidem.recon_batch (channel_no, bill_date);
COMMENT ON TABLE payidem.recon_batch IS
	'One reconciliation run of a channel and bill day: counts and timing.';

CREATE TABLE payidem.reconciliation (
	recon_id		bigserial	NOT NULL,
	recon_batch_no	text		NOT NULL,
	channel_no		text		NOT NULL,
	bill_date		date		NOT NULL,
	diff_type		text		NOT NULL,
	transaction_id	text,
	payment_no		text,
	platform_amount	bigint,
	channel_amount	bigint,
	platform_status	text,
	channel_status	text,
	handle_status	text		NOT NULL DEFAULT 'open',
	handled_by		text,
	handled_at		timestamptz,
	note			text,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT reconciliation_pkey PRIMARY KEY (recon_id),
	CONSTRAINT reconciliation_batch_fkey FOREIGN KEY (recon_batch_no, channel_no, bill_date)
		REFERENCES payidem.recon_batch (recon_batch_no, channel_no, bill_date),
	CONSTRAINT reconciliation_diff_type_known CHECK (
		diff_type IN ('platform_only', 'channel_only', 'amount_mismatch', 'status_mismatch')),
	CONSTRAINT reconciliation_handle_status_known CHECK (
		handle_status IN ('open', 'handled', 'ignored', 'auto_resolved')),
	CONSTRAINT reconciliation_sides_consistent CHECK (
		CASE diff_type
			WHEN 'platform_only' THEN platform_amount IS NOT NULL AND channel_amount IS NULL
			WHEN 'channel_only' THEN platform_amount IS NULL AND channel_amount IS NOT NULL
			WHEN 'amount_mismatch' THEN platform_amount IS DISTINCT FROM channel_amount
				AND platform_amount IS NOT NULL AND channel_amount IS NOT NULL
			ELSE platform_status IS DISTINCT FROM channel_status
		END),
	CONSTRAINT reconciliation_amounts_nonnegative CHECK (platform_amount >= 0 AND channel_amount >= 0)
);
CREATE INDEX reconciliation_channel_day ON payidem.reconciliation (channel_no, bill_date, handle_status);
CREATE INDEX reconciliation_payment ON payidem.reconciliation (payment_no);
CREATE INDEX reconciliation_transaction ON payidem.reconciliation (channel_no, transaction_id);
COMMENT ON TABLE payidem.reconciliation IS
	'Reconciliation differences only (matched lines are not stored), each followed up by a person.';
COMMENT ON COLUMN payidem.reconciliation.diff_type IS
	'platform_only (we have it, the bill does not), channel_only (money taken, no record of ours), amount_mismatch, status_mismatch.';
COMMENT ON COLUMN payidem.reconciliation.handle_status IS
	'open, handled or ignored by a person, or auto_resolved (a midnight straddle found in the next day''s bill).';

------------------------------------------------------------------------------
-- Order numbers (C, shared memory)
------------------------------------------------------------------------------

CREATE SEQUENCE payidem.order_no_hwm AS bigint MINVALUE 0 START WITH 0 NO CYCLE;
COMMENT ON SEQUENCE payidem.order_no_hwm IS
	'Durable high-water mark of order numbers: UTC epoch second up to which numbers may have been issued. Written only by gen_order_no().';

CREATE FUNCTION payidem.gen_order_no(prefix text DEFAULT 'PO')
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_gen_order_no'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.gen_order_no(text) IS
	'Next 26-character order number: prefix, UTC second, shard, per-second sequence, ISO 7064 check digits. Never repeats.';

CREATE FUNCTION payidem.order_no_valid(order_no text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_order_no_valid'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem.order_no_valid(text) IS
	'true if the text is a well-formed order number with correct check digits; never raises an error.';

CREATE FUNCTION payidem.order_no_parse(order_no text)
RETURNS TABLE (prefix text, issued_at timestamptz, shard integer, seq integer)
AS 'MODULE_PATHNAME', 'payidem_order_no_parse'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE ROWS 1;
COMMENT ON FUNCTION payidem.order_no_parse(text) IS
	'The parts of an order number; SQLSTATE 22023 if it is not valid.';

CREATE FUNCTION payidem.stats()
RETURNS TABLE (name text, value bigint)
AS 'MODULE_PATHNAME', 'payidem_stats'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem.stats() IS
	'Counters from shared memory since server start: order numbers issued, clock rollbacks absorbed, seconds borrowed, ...';

CREATE FUNCTION payidem._order_no_mark()
RETURNS bigint
AS 'MODULE_PATHNAME', 'payidem_order_no_mark'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._order_no_mark() IS
	'Internal: the first second above every order number this server issued (0 if none or not preloaded).';

-- A new installation starts its high-water mark above every number this server
-- has issued, also in an earlier installation dropped from this database.
SELECT pg_catalog.setval('payidem.order_no_hwm', payidem._order_no_mark());

------------------------------------------------------------------------------
-- Idempotency functions (C: src/idem.c)
------------------------------------------------------------------------------

-- Each runs its statements as the owner of payidem.idempotency (see
-- src/idem.c), so a role needs only EXECUTE on the function; none is PUBLIC.

CREATE FUNCTION payidem.idem_claim(idem_key text, biz_type text, order_no text,
                                   channel text, amount bigint,
                                   fingerprint text DEFAULT NULL,
                                   lease interval DEFAULT '30 seconds')
RETURNS TABLE (outcome text, status text, result jsonb, attempts integer)
AS 'MODULE_PATHNAME', 'payidem_idem_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;
COMMENT ON FUNCTION payidem.idem_claim(text, text, text, text, bigint, text, interval) IS
	'Claim an idempotency key; the primary key decides. outcome: claimed (run the logic), in_progress (someone holds a live lease), replay (completed: answer with result), reclaimed (failed or lease expired: run the logic). PI001 if reused with other parameters.';

CREATE FUNCTION payidem.idem_finish(idem_key text, status text, result jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'payidem_idem_finish'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.idem_finish(text, text, jsonb) IS
	'Finish a processing key as completed (later claims replay result) or failed (the next claim reclaims it). PI009 unknown key, PI002 not processing.';

CREATE FUNCTION payidem.idem_purge(older_than interval DEFAULT '24 hours')
RETURNS bigint
AS 'MODULE_PATHNAME', 'payidem_idem_purge'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.idem_purge(interval) IS
	'Delete completed and failed keys unchanged for longer than older_than; never a processing key. Returns the number deleted.';

-- (end of idempotency functions)

------------------------------------------------------------------------------
-- State machines: transition functions and triggers (C)
------------------------------------------------------------------------------

-- Whitelist cache invalidation: DML does not invalidate anything by itself,
-- so every change of state/transition queues a relcache invalidation that the
-- state-machine code listens for (this session's next command, and every other
-- session's next statement after commit).  ENABLE ALWAYS: also during a
-- restore run with session_replication_role = replica.
CREATE FUNCTION payidem.whitelist_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_whitelist_changed'
LANGUAGE C;
COMMENT ON FUNCTION payidem.whitelist_changed() IS
	'Trigger on payidem.state and payidem.transition: makes every session re-read the whitelist at its next statement.';

CREATE TRIGGER whitelist_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON payidem.state
	FOR EACH STATEMENT EXECUTE FUNCTION payidem.whitelist_changed();
ALTER TABLE payidem.state ENABLE ALWAYS TRIGGER whitelist_changed;
CREATE TRIGGER whitelist_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON payidem.transition
	FOR EACH STATEMENT EXECUTE FUNCTION payidem.whitelist_changed();
ALTER TABLE payidem.transition ENABLE ALWAYS TRIGGER whitelist_changed;

-- The guard: no INSERT in a non-initial status, no status change outside
-- payidem.transition, whoever runs it; every accepted one is logged.
-- Ordinary (ENABLE ORIGIN) triggers: a restore run with
-- session_replication_role = replica (superuser only) loads rows as they were.
CREATE FUNCTION payidem.status_guard()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_status_guard'
LANGUAGE C;
COMMENT ON FUNCTION payidem.status_guard() IS
	'Constraint trigger (entity, key column): refuses inserts in a non-initial status and status changes not in payidem.transition (PI002); logs accepted ones in status_log.';

CREATE CONSTRAINT TRIGGER status_guard
	AFTER INSERT OR UPDATE OF status ON payidem."order"
	FOR EACH ROW EXECUTE FUNCTION payidem.status_guard('order', 'order_no');
CREATE CONSTRAINT TRIGGER status_guard
	AFTER INSERT OR UPDATE OF status ON payidem.payment
	FOR EACH ROW EXECUTE FUNCTION payidem.status_guard('payment', 'payment_no');
CREATE CONSTRAINT TRIGGER status_guard
	AFTER INSERT OR UPDATE OF status ON payidem.refund
	FOR EACH ROW EXECUTE FUNCTION payidem.status_guard('refund', 'refund_no');

-- status_log is append-only, for every role, also under
-- session_replication_role = replica (ENABLE ALWAYS).  No bypass setting.
CREATE FUNCTION payidem.status_log_append_only()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_status_log_append_only'
LANGUAGE C;
COMMENT ON FUNCTION payidem.status_log_append_only() IS
	'Trigger on payidem.status_log: refuses UPDATE, DELETE and TRUNCATE for every role.';

CREATE TRIGGER status_log_append_only
	BEFORE UPDATE OR DELETE OR TRUNCATE ON payidem.status_log
	FOR EACH STATEMENT EXECUTE FUNCTION payidem.status_log_append_only();
ALTER TABLE payidem.status_log ENABLE ALWAYS TRIGGER status_log_append_only;

-- The transition functions: one conditional UPDATE each (optimistic lock).
CREATE FUNCTION payidem.transit_order(order_no text, to_status text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_transit_order'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.transit_order(text, text) IS
	'Move an order to to_status if payidem.transition allows it from its current status: true = moved, false = already there, PI009 = no such order, PI002 = not allowed, 22023 = unknown status.';

CREATE FUNCTION payidem.transit_payment(payment_no text, to_status text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_transit_payment'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.transit_payment(text, text) IS
	'Move a payment attempt to to_status if payidem.transition allows it: true = moved, false = already there, PI009 = no such payment, PI002 = not allowed, 22023 = unknown status.';

CREATE FUNCTION payidem.transit_refund(refund_no text, to_status text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_transit_refund'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.transit_refund(text, text) IS
	'Move a refund to to_status if payidem.transition allows it: true = moved, false = already there, PI009 = no such refund, PI002 = not allowed, 22023 = unknown status.';

-- (end of state-machine functions)

------------------------------------------------------------------------------
-- Merchants, channels, secrets, routing, roles (crypto in C: src/crypto.c)
------------------------------------------------------------------------------

-- C primitives.  The master key never passes through SQL; these see only
-- sealed records.  Not granted to anyone: only the SECURITY DEFINER API
-- functions below call them.
CREATE FUNCTION payidem._seal(aad text, plaintext bytea,
	OUT key_version integer, OUT nonce bytea, OUT ciphertext bytea, OUT auth_tag bytea)
AS 'MODULE_PATHNAME', 'payidem_seal'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
CREATE FUNCTION payidem._open(aad text, key_version integer, nonce bytea, ciphertext bytea, auth_tag bytea)
RETURNS bytea
AS 'MODULE_PATHNAME', 'payidem_open'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
CREATE FUNCTION payidem._hmac_sign(aad text, key_version integer, nonce bytea, ciphertext bytea,
	auth_tag bytea, payload text)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_hmac_sign'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
CREATE FUNCTION payidem._hmac_verify(aad text, key_version integer, nonce bytea, ciphertext bytea,
	auth_tag bytea, payload text, signature text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_hmac_verify'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
CREATE FUNCTION payidem._random_code(prefix text, len integer)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_random_code'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
CREATE FUNCTION payidem._random_secret()
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_random_secret'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
CREATE FUNCTION payidem.master_key_version()
RETURNS integer
AS 'MODULE_PATHNAME', 'payidem_master_key_version'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem.master_key_version() IS
	'Version of the current master key (payidem.master_key_file); 55000 if it is not configured.';

-- Shared input checks: one place for each rule and its message.
CREATE FUNCTION payidem._check_rate(what text, rate numeric)
RETURNS numeric
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF rate IS NULL OR rate < 0 OR rate >= 1 OR rate <> round(rate, 6) THEN
		RAISE EXCEPTION 'invalid % rate', what USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The rate was %s; it must be a fraction from 0 up to but not including 1, with at most 6 decimals.',
							coalesce(rate::text, 'NULL')),
			HINT = 'Write 0.6% as 0.006.';
	END IF;
	RETURN rate;
END
$$;

CREATE FUNCTION payidem._check_code(what text, value text, pattern text, rule text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF value IS NULL OR value !~ pattern THEN
		RAISE EXCEPTION 'invalid %', what USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The value was %s; %s', coalesce(quote_literal(left(value, 64)), 'NULL'), rule);
	END IF;
	RETURN value;
END
$$;

CREATE FUNCTION payidem._check_limit(what text, value bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF value IS NOT NULL AND value <= 0 THEN
		RAISE EXCEPTION 'invalid %', what USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The limit was %s; a limit is a positive amount in minor units, or NULL for none.', value);
	END IF;
	RETURN value;
END
$$;

CREATE FUNCTION payidem._merchant_for_update(p_merchant_no text)
RETURNS payidem.merchant
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	m payidem.merchant;
BEGIN
	SELECT * INTO m FROM payidem.merchant WHERE merchant_no OPERATOR(pg_catalog.=) p_merchant_no FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'merchant % does not exist', coalesce(quote_literal(left(p_merchant_no, 64)), 'NULL') USING
			ERRCODE = 'PI009';
	END IF;
	RETURN m;
END
$$;

CREATE FUNCTION payidem._channel_for_update(p_channel_no text)
RETURNS payidem.channel
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	c payidem.channel;
BEGIN
	SELECT * INTO c FROM payidem.channel WHERE channel_no OPERATOR(pg_catalog.=) p_channel_no FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'channel % does not exist', coalesce(quote_literal(left(p_channel_no, 64)), 'NULL') USING
			ERRCODE = 'PI009';
	END IF;
	RETURN c;
END
$$;

-- associated data binding a sealed record to its row
CREATE FUNCTION payidem._secret_aad(p_merchant_no text, p_version integer)
RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN 'merchant_secret:' OPERATOR(pg_catalog.||) p_merchant_no
	OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) p_version::text;

CREATE FUNCTION payidem._config_aad(p_channel_no text)
RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN 'channel_config:' OPERATOR(pg_catalog.||) p_channel_no;

CREATE FUNCTION payidem.create_merchant(name text, merchant_type text, fee_rate numeric,
	settle_cycle text DEFAULT 'T1')
RETURNS TABLE (merchant_no text, api_key text, api_secret text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_no     text;
	v_key    text;
	v_secret text;
	v_sealed record;
BEGIN
	IF name IS NULL OR length(btrim(name)) NOT BETWEEN 1 AND 128 THEN
		RAISE EXCEPTION 'invalid merchant name' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The name was %s; it must have 1 to 128 characters.', coalesce(quote_literal(left(name, 64)), 'NULL'));
	END IF;
	PERFORM payidem._check_code('merchant type', create_merchant.merchant_type, '^[a-z][a-z0-9_]{0,31}$',
		'a merchant type is a lower-case code such as retail or catering.');
	PERFORM payidem._check_rate('merchant fee', create_merchant.fee_rate);
	PERFORM payidem._check_code('settlement cycle', create_merchant.settle_cycle, '^[TD][0-9]{1,2}$',
		'a settlement cycle is T<n> or D<n>, e.g. T1 or D0.');

	-- 75 random bits each: a collision is astronomically rare, but retry anyway
	LOOP
		v_no := payidem._random_code('M', 15);
		v_key := payidem._random_code('ak_', 26);
		INSERT INTO payidem.merchant AS m (merchant_no, merchant_name, merchant_type, fee_rate, settle_cycle, api_key)
		VALUES (v_no, btrim(name), create_merchant.merchant_type, create_merchant.fee_rate,
				create_merchant.settle_cycle, v_key)
		ON CONFLICT DO NOTHING;
		EXIT WHEN FOUND;
	END LOOP;

	v_secret := payidem._random_secret();
	v_sealed := payidem._seal(payidem._secret_aad(v_no, 1), convert_to(v_secret, 'UTF8'));
	INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag)
	VALUES (v_no, 1, v_sealed.key_version, v_sealed.nonce, v_sealed.ciphertext, v_sealed.auth_tag);

	merchant_no := v_no;
	api_key := v_key;
	api_secret := v_secret;
	RETURN NEXT;
END
$$;
COMMENT ON FUNCTION payidem.create_merchant(text, text, numeric, text) IS
	'New active merchant with a random merchant_no and api_key; the API secret is returned once and stored only encrypted.';

CREATE FUNCTION payidem.rotate_merchant_secret(merchant_no text, grace interval DEFAULT '24 hours')
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	m        payidem.merchant;
	v_next   integer;
	v_secret text;
	v_sealed record;
BEGIN
	IF grace IS NULL OR grace < interval '0' THEN
		RAISE EXCEPTION 'invalid grace period' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The grace period was %s; it must be zero or positive.', coalesce(grace::text, 'NULL'));
	END IF;
	m := payidem._merchant_for_update(rotate_merchant_secret.merchant_no);

	-- secrets still in an earlier grace window end now: only current + previous stay valid
	UPDATE payidem.merchant_secret s
	   SET valid_until = greatest(now(), s.valid_from + interval '1 microsecond')
	 WHERE s.merchant_no = m.merchant_no AND s.valid_until > now();
	-- the current secret gets the grace window
	UPDATE payidem.merchant_secret s
	   SET valid_until = greatest(now() + grace, s.valid_from + interval '1 microsecond')
	 WHERE s.merchant_no = m.merchant_no AND s.valid_until IS NULL;

	SELECT coalesce(max(s.secret_version), 0) + 1 INTO v_next
	  FROM payidem.merchant_secret s WHERE s.merchant_no = m.merchant_no;
	v_secret := payidem._random_secret();
	v_sealed := payidem._seal(payidem._secret_aad(m.merchant_no, v_next), convert_to(v_secret, 'UTF8'));
	INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag)
	VALUES (m.merchant_no, v_next, v_sealed.key_version, v_sealed.nonce, v_sealed.ciphertext, v_sealed.auth_tag);
	UPDATE payidem.merchant SET updated_at = now() WHERE payidem.merchant.merchant_no = m.merchant_no;
	RETURN v_secret;
END
$$;
COMMENT ON FUNCTION payidem.rotate_merchant_secret(text, interval) IS
	'New API secret (returned once); the previous one stays valid for the grace period, older ones end now.';

CREATE FUNCTION payidem.sign(merchant_no text, payload text)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	s payidem.merchant_secret;
BEGIN
	SELECT * INTO s FROM payidem.merchant_secret ms
	 WHERE ms.merchant_no OPERATOR(pg_catalog.=) sign.merchant_no AND ms.valid_until IS NULL;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'merchant % does not exist', coalesce(quote_literal(left(sign.merchant_no, 64)), 'NULL') USING
			ERRCODE = 'PI009';
	END IF;
	IF payload IS NULL THEN
		RAISE EXCEPTION 'payload to sign must not be NULL' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	RETURN payidem._hmac_sign(payidem._secret_aad(s.merchant_no, s.secret_version),
							  s.key_version, s.nonce, s.ciphertext, s.auth_tag, payload);
END
$$;
COMMENT ON FUNCTION payidem.sign(text, text) IS
	'HMAC-SHA256 (64 lowercase hex) of the payload under the merchant''s current API secret.';

CREATE FUNCTION payidem.verify_signature(api_key text, payload text, signature text)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	s  payidem.merchant_secret;
	ok boolean := false;
BEGIN
	IF api_key IS NULL OR payload IS NULL OR signature IS NULL THEN
		RETURN false;
	END IF;
	-- every secret valid now: the current one and, within its grace window, the previous one
	FOR s IN
		SELECT ms.* FROM payidem.merchant m
		  JOIN payidem.merchant_secret ms ON ms.merchant_no = m.merchant_no
		 WHERE m.api_key OPERATOR(pg_catalog.=) verify_signature.api_key
		   AND ms.valid_from <= now()
		   AND (ms.valid_until IS NULL OR ms.valid_until > now())
	LOOP
		-- no early exit: the time taken does not say which secret matched
		ok := payidem._hmac_verify(payidem._secret_aad(s.merchant_no, s.secret_version),
								   s.key_version, s.nonce, s.ciphertext, s.auth_tag,
								   payload, signature) OR ok;
	END LOOP;
	RETURN ok;
END
$$;
COMMENT ON FUNCTION payidem.verify_signature(text, text, text) IS
	'true if the signature is the HMAC-SHA256 of the payload under a secret of that api_key valid now (current, or previous within its grace window).';

CREATE FUNCTION payidem.set_merchant_status(merchant_no text, status text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	m payidem.merchant;
BEGIN
	IF status IS NULL OR status NOT IN ('active', 'frozen', 'closed') THEN
		RAISE EXCEPTION 'invalid merchant status' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The status was %s; it must be active, frozen or closed.', coalesce(quote_literal(left(status, 64)), 'NULL'));
	END IF;
	m := payidem._merchant_for_update(set_merchant_status.merchant_no);
	IF m.status = 'closed' AND status <> 'closed' THEN
		RAISE EXCEPTION 'merchant % is closed', m.merchant_no USING
			ERRCODE = 'PI002',
			DETAIL = format('merchant %L: ''closed'' -> %L is not allowed', m.merchant_no, status),
			HINT = 'A closed merchant stays closed; create a new merchant instead.';
	END IF;
	UPDATE payidem.merchant SET status = set_merchant_status.status, updated_at = now()
	 WHERE payidem.merchant.merchant_no = m.merchant_no;
END
$$;
CREATE FUNCTION payidem.freeze_merchant(merchant_no text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC SELECT payidem.set_merchant_status(merchant_no, 'frozen'); END;
CREATE FUNCTION payidem.unfreeze_merchant(merchant_no text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC SELECT payidem.set_merchant_status(merchant_no, 'active'); END;
CREATE FUNCTION payidem.close_merchant(merchant_no text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC SELECT payidem.set_merchant_status(merchant_no, 'closed'); END;
COMMENT ON FUNCTION payidem.set_merchant_status(text, text) IS
	'Set a merchant active, frozen or closed (closed is final). freeze_/unfreeze_/close_merchant are shorthands.';

CREATE FUNCTION payidem.create_channel(channel_no text, channel_type text, fee_rate numeric,
	weight integer DEFAULT 100, allowed_merchant_types text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._check_code('channel code', create_channel.channel_no, '^[A-Z][A-Z0-9_]{1,31}$',
		'a channel code is upper case, e.g. WXPAY_001.');
	PERFORM payidem._check_code('channel type', create_channel.channel_type, '^[a-z][a-z0-9_]{0,31}$',
		'a channel type is a lower-case code such as wechat, alipay or unionpay.');
	PERFORM payidem._check_rate('channel fee', create_channel.fee_rate);
	IF weight IS NULL OR weight NOT BETWEEN 0 AND 10000 THEN
		RAISE EXCEPTION 'invalid channel weight' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The weight was %s; it must be from 0 to 10000.', coalesce(weight::text, 'NULL'));
	END IF;
	IF allowed_merchant_types IS NOT NULL AND (cardinality(allowed_merchant_types) = 0
		OR array_position(allowed_merchant_types, NULL) IS NOT NULL
		OR array_to_string(allowed_merchant_types, ',') !~ '^[a-z][a-z0-9_]{0,31}(,[a-z][a-z0-9_]{0,31})*$') THEN
		RAISE EXCEPTION 'invalid list of allowed merchant types' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The list was %s; it must be NULL (all types) or a non-empty list of lower-case merchant types.',
							left(allowed_merchant_types::text, 200));
	END IF;
	INSERT INTO payidem.channel (channel_no, channel_type, fee_rate, weight, allowed_merchant_types)
	VALUES (create_channel.channel_no, create_channel.channel_type, create_channel.fee_rate,
			create_channel.weight, create_channel.allowed_merchant_types)
	ON CONFLICT DO NOTHING;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'channel % already exists', create_channel.channel_no USING
			ERRCODE = 'duplicate_object',
			HINT = 'Choose another channel code, or change the existing channel.';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.create_channel(text, text, numeric, integer, text[]) IS
	'New active payment channel; its keys go in with set_channel_config().';

CREATE FUNCTION payidem.set_channel_status(channel_no text, status text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	c payidem.channel;
BEGIN
	IF status IS NULL OR status NOT IN ('active', 'disabled') THEN
		RAISE EXCEPTION 'invalid channel status' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The status was %s; it must be active or disabled.', coalesce(quote_literal(left(status, 64)), 'NULL'));
	END IF;
	c := payidem._channel_for_update(set_channel_status.channel_no);
	UPDATE payidem.channel SET status = set_channel_status.status, updated_at = now()
	 WHERE payidem.channel.channel_no = c.channel_no;
END
$$;
COMMENT ON FUNCTION payidem.set_channel_status(text, text) IS
	'Enable (active) or disable a channel; a disabled channel is never routed to and starts no payment.';

CREATE FUNCTION payidem.set_channel_config(channel_no text, config jsonb)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	c        payidem.channel;
	v_sealed record;
BEGIN
	c := payidem._channel_for_update(set_channel_config.channel_no);
	IF config IS NULL OR jsonb_typeof(config) <> 'object' THEN
		RAISE EXCEPTION 'channel configuration must be a JSON object' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('It was a JSON %s.', coalesce(jsonb_typeof(config), 'NULL')),
			HINT = 'Pass e.g. {"app_id": "...", "private_key": "..."}.';
	END IF;
	v_sealed := payidem._seal(payidem._config_aad(c.channel_no), convert_to(config::text, 'UTF8'));
	INSERT INTO payidem.channel_config AS cc (channel_no, key_version, nonce, ciphertext, auth_tag)
	VALUES (c.channel_no, v_sealed.key_version, v_sealed.nonce, v_sealed.ciphertext, v_sealed.auth_tag)
	ON CONFLICT ON CONSTRAINT channel_config_pkey DO UPDATE
	   SET key_version = excluded.key_version, nonce = excluded.nonce,
		   ciphertext = excluded.ciphertext, auth_tag = excluded.auth_tag, updated_at = now();
END
$$;
COMMENT ON FUNCTION payidem.set_channel_config(text, jsonb) IS
	'Store a channel''s keys and certificates (a JSON object), encrypted under the master key.';

CREATE FUNCTION payidem.get_channel_config(channel_no text)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	cc payidem.channel_config;
BEGIN
	SELECT * INTO cc FROM payidem.channel_config x WHERE x.channel_no OPERATOR(pg_catalog.=) get_channel_config.channel_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'channel % has no configuration', coalesce(quote_literal(left(get_channel_config.channel_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			HINT = 'Store one with payidem.set_channel_config().';
	END IF;
	RETURN convert_from(payidem._open(payidem._config_aad(cc.channel_no), cc.key_version, cc.nonce,
									  cc.ciphertext, cc.auth_tag), 'UTF8')::jsonb;
END
$$;
COMMENT ON FUNCTION payidem.get_channel_config(text) IS
	'The decrypted configuration of a channel.';

CREATE FUNCTION payidem.bind_channel(merchant_no text, channel_no text, fee_rate numeric DEFAULT NULL,
	single_limit bigint DEFAULT NULL, daily_limit bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	m payidem.merchant;
	c payidem.channel;
BEGIN
	m := payidem._merchant_for_update(bind_channel.merchant_no);
	c := payidem._channel_for_update(bind_channel.channel_no);
	IF bind_channel.fee_rate IS NOT NULL THEN
		PERFORM payidem._check_rate('merchant fee', bind_channel.fee_rate);
	END IF;
	PERFORM payidem._check_limit('single limit', single_limit);
	PERFORM payidem._check_limit('daily limit', daily_limit);
	IF single_limit > daily_limit THEN
		RAISE EXCEPTION 'single limit exceeds daily limit' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The single limit was %s and the daily limit %s.', single_limit, daily_limit);
	END IF;
	IF c.allowed_merchant_types IS NOT NULL AND NOT m.merchant_type = ANY (c.allowed_merchant_types) THEN
		RAISE EXCEPTION 'channel % does not admit merchants of type %', c.channel_no, m.merchant_type USING
			ERRCODE = 'PI004',
			DETAIL = format('Channel %s admits %s; merchant %s is %s.', c.channel_no,
							array_to_string(c.allowed_merchant_types, ', '), m.merchant_no, m.merchant_type),
			HINT = 'Bind a channel that admits this merchant type, or change the channel''s allowed_merchant_types.';
	END IF;
	INSERT INTO payidem.merchant_channel AS b (merchant_no, channel_no, fee_rate, single_limit, daily_limit)
	VALUES (m.merchant_no, c.channel_no, bind_channel.fee_rate, bind_channel.single_limit, bind_channel.daily_limit)
	ON CONFLICT ON CONSTRAINT merchant_channel_pkey DO UPDATE
	   SET fee_rate = excluded.fee_rate, single_limit = excluded.single_limit,
		   daily_limit = excluded.daily_limit, status = 'active', updated_at = now();
END
$$;
COMMENT ON FUNCTION payidem.bind_channel(text, text, numeric, bigint, bigint) IS
	'Let a merchant use a channel, with an optional own rate and limits (binding again updates them and re-activates).';

CREATE FUNCTION payidem.unbind_channel(merchant_no text, channel_no text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	UPDATE payidem.merchant_channel b SET status = 'disabled', updated_at = now()
	 WHERE b.merchant_no OPERATOR(pg_catalog.=) unbind_channel.merchant_no
	   AND b.channel_no OPERATOR(pg_catalog.=) unbind_channel.channel_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'merchant % is not bound to channel %',
			coalesce(quote_literal(left(unbind_channel.merchant_no, 64)), 'NULL'),
			coalesce(quote_literal(left(unbind_channel.channel_no, 64)), 'NULL') USING
			ERRCODE = 'PI009';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.unbind_channel(text, text) IS
	'Disable a merchant''s binding to a channel (kept for history; bind_channel re-activates it).';

CREATE FUNCTION payidem.route_channel(merchant_no text, channel_type text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	m       payidem.merchant;
	v_total bigint;
	v_pick  double precision;
	r       record;
BEGIN
	SELECT * INTO m FROM payidem.merchant x WHERE x.merchant_no OPERATOR(pg_catalog.=) route_channel.merchant_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'merchant % does not exist', coalesce(quote_literal(left(route_channel.merchant_no, 64)), 'NULL') USING
			ERRCODE = 'PI009';
	END IF;
	IF m.status <> 'active' THEN
		RAISE EXCEPTION 'merchant % is %', m.merchant_no, m.status USING
			ERRCODE = 'PI004',
			HINT = 'Only active merchants take payments.';
	END IF;
	-- effective weight: channel weight x binding weight
	SELECT sum(c.weight::bigint * b.weight) INTO v_total
	  FROM payidem.merchant_channel b
	  JOIN payidem.channel c ON c.channel_no = b.channel_no
	 WHERE b.merchant_no = m.merchant_no AND b.status = 'active'
	   AND c.status = 'active' AND c.channel_type OPERATOR(pg_catalog.=) route_channel.channel_type
	   AND (c.allowed_merchant_types IS NULL OR m.merchant_type = ANY (c.allowed_merchant_types))
	   AND c.weight > 0 AND b.weight > 0;
	IF v_total IS NULL THEN
		RAISE EXCEPTION 'no channel of type % is available to merchant %',
			coalesce(quote_literal(left(route_channel.channel_type, 64)), 'NULL'), m.merchant_no USING
			ERRCODE = 'PI004',
			DETAIL = 'A channel must be active, of that type, bound and active for the merchant, admit its merchant type, and have a weight above 0.',
			HINT = 'Bind an active channel of this type with payidem.bind_channel().';
	END IF;
	v_pick := random() * v_total;
	FOR r IN
		SELECT c.channel_no, c.weight::bigint * b.weight AS w
		  FROM payidem.merchant_channel b
		  JOIN payidem.channel c ON c.channel_no = b.channel_no
		 WHERE b.merchant_no = m.merchant_no AND b.status = 'active'
		   AND c.status = 'active' AND c.channel_type OPERATOR(pg_catalog.=) route_channel.channel_type
		   AND (c.allowed_merchant_types IS NULL OR m.merchant_type = ANY (c.allowed_merchant_types))
		   AND c.weight > 0 AND b.weight > 0
		 ORDER BY c.channel_no
	LOOP
		v_pick := v_pick - r.w;
		IF v_pick < 0 THEN
			RETURN r.channel_no;
		END IF;
	END LOOP;
	RETURN r.channel_no;		-- rounding at the very end of the range
END
$$;
COMMENT ON FUNCTION payidem.route_channel(text, text) IS
	'Weighted random choice among the channels of a type that are active, bound and active for the merchant, and admit its type (weight = channel weight x binding weight). Uses random(): setseed() makes it repeatable.';

CREATE FUNCTION payidem.reencrypt_secrets()
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_current integer := payidem.master_key_version();
	v_count   bigint := 0;
	v_sealed  record;
	s         payidem.merchant_secret;
	cc        payidem.channel_config;
BEGIN
	FOR s IN SELECT * FROM payidem.merchant_secret x WHERE x.key_version <> v_current FOR UPDATE LOOP
		v_sealed := payidem._seal(payidem._secret_aad(s.merchant_no, s.secret_version),
			payidem._open(payidem._secret_aad(s.merchant_no, s.secret_version),
						  s.key_version, s.nonce, s.ciphertext, s.auth_tag));
		UPDATE payidem.merchant_secret x
		   SET key_version = v_sealed.key_version, nonce = v_sealed.nonce,
			   ciphertext = v_sealed.ciphertext, auth_tag = v_sealed.auth_tag
		 WHERE x.merchant_no = s.merchant_no AND x.secret_version = s.secret_version;
		v_count := v_count + 1;
	END LOOP;
	FOR cc IN SELECT * FROM payidem.channel_config x WHERE x.key_version <> v_current FOR UPDATE LOOP
		v_sealed := payidem._seal(payidem._config_aad(cc.channel_no),
			payidem._open(payidem._config_aad(cc.channel_no), cc.key_version, cc.nonce, cc.ciphertext, cc.auth_tag));
		UPDATE payidem.channel_config x
		   SET key_version = v_sealed.key_version, nonce = v_sealed.nonce,
			   ciphertext = v_sealed.ciphertext, auth_tag = v_sealed.auth_tag, updated_at = now()
		 WHERE x.channel_no = cc.channel_no;
		v_count := v_count + 1;
	END LOOP;
	RETURN v_count;
END
$$;
COMMENT ON FUNCTION payidem.reencrypt_secrets() IS
	'Master-key rotation: re-encrypt every secret and channel configuration not yet under the current key; returns how many.';

------------------------------------------------------------------------------
-- Roles: application, auditor, merchant-scoped reporting (row-level security)
------------------------------------------------------------------------------

CREATE TABLE payidem.merchant_role (
	role_name	name		NOT NULL,
	merchant_no	text		NOT NULL,
	created_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT merchant_role_pkey PRIMARY KEY (role_name, merchant_no),
	CONSTRAINT merchant_role_merchant_fkey FOREIGN KEY (merchant_no)
		REFERENCES payidem.merchant (merchant_no)
);
COMMENT ON TABLE payidem.merchant_role IS
	'Reporting roles mapped to merchants: such a role reads only its merchants'' orders, payments, refunds and anomalies (row-level security). Managed with map_merchant_role()/unmap_merchant_role().';

CREATE TABLE payidem.auditor_role (
	role_name	name		NOT NULL,
	created_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT auditor_role_pkey PRIMARY KEY (role_name)
);
COMMENT ON TABLE payidem.auditor_role IS
	'Roles granted read access to all merchants'' rows (without secrets) by grant_auditor().';

-- Used by the row-level security policies, which pass the querying role (the
-- policy expression runs as that role; inside this SECURITY DEFINER function
-- CURRENT_USER would be the owner).  Runs as the extension's owner, so the
-- mapping tables need no grants.
CREATE FUNCTION payidem._row_visible(p_merchant_no text, p_role name)
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN EXISTS (SELECT 1 FROM payidem.auditor_role a WHERE a.role_name = p_role)
	OR EXISTS (SELECT 1 FROM payidem.merchant_role r
				WHERE r.role_name = p_role AND r.merchant_no = p_merchant_no);

ALTER TABLE payidem."order" ENABLE ROW LEVEL SECURITY;
ALTER TABLE payidem.payment ENABLE ROW LEVEL SECURITY;
ALTER TABLE payidem.refund ENABLE ROW LEVEL SECURITY;
ALTER TABLE payidem.anomaly ENABLE ROW LEVEL SECURITY;
CREATE POLICY merchant_rows ON payidem."order" FOR SELECT
	USING (payidem._row_visible(merchant_no, CURRENT_USER));
CREATE POLICY merchant_rows ON payidem.payment FOR SELECT
	USING (payidem._row_visible(merchant_no, CURRENT_USER));
CREATE POLICY merchant_rows ON payidem.refund FOR SELECT
	USING (payidem._row_visible(merchant_no, CURRENT_USER));
CREATE POLICY merchant_rows ON payidem.anomaly FOR SELECT
	USING (payidem._row_visible((SELECT o.merchant_no FROM payidem."order" o WHERE o.order_no = anomaly.order_no),
								CURRENT_USER));

CREATE FUNCTION payidem._check_role(role regrole)
RETURNS name
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	r pg_roles;
BEGIN
	SELECT * INTO r FROM pg_catalog.pg_roles WHERE oid = role;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'role does not exist' USING ERRCODE = 'undefined_object';
	END IF;
	IF r.rolsuper OR r.rolbypassrls THEN
		RAISE EXCEPTION 'role % bypasses row-level security', r.rolname USING
			ERRCODE = 'invalid_parameter_value',
			HINT = 'Use an ordinary role without SUPERUSER or BYPASSRLS.';
	END IF;
	RETURN r.rolname;
END
$$;

-- The application's API: what grant_app() makes executable.
CREATE FUNCTION payidem.app_functions()
RETURNS SETOF regprocedure
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT p.oid::regprocedure
	  FROM pg_catalog.pg_proc p
	 WHERE p.pronamespace = 'payidem'::regnamespace
	   AND p.proname IN ('gen_order_no', 'order_no_valid', 'order_no_parse', 'stats',
						 'idem_claim', 'idem_finish',
						 'transit_order', 'transit_payment', 'transit_refund',
						 'sign', 'verify_signature', 'route_channel', 'get_channel_config',
						 'create_order', 'begin_payment', 'apply_payment_result', 'close_payment',
						 'close_order', 'refund', 'apply_refund_result', 'notify_due', 'notify_result',
						 'reconcile', 'resolve_diff');
END;
COMMENT ON FUNCTION payidem.app_functions() IS
	'The functions grant_app() lets an application role execute.';

CREATE FUNCTION payidem.grant_app(role regrole)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	f regprocedure;
	v_role name := payidem._check_role(role);
BEGIN
	EXECUTE format('GRANT USAGE ON SCHEMA payidem TO %I', v_role);
	FOR f IN SELECT * FROM payidem.app_functions() LOOP
		EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, v_role);
	END LOOP;
END
$$;
COMMENT ON FUNCTION payidem.grant_app(regrole) IS
	'Let an application role call payidem''s API functions (payidem.app_functions()); it gets no direct access to any table.';

CREATE FUNCTION payidem.grant_auditor(role regrole)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_role name := payidem._check_role(role);
BEGIN
	EXECUTE format('GRANT USAGE ON SCHEMA payidem TO %I', v_role);
	EXECUTE format('GRANT EXECUTE ON FUNCTION payidem._row_visible(text, name) TO %I', v_role);
	EXECUTE format('GRANT SELECT ON payidem.merchant, payidem.channel, payidem.merchant_channel, '
				   'payidem."order", payidem.payment, payidem.refund, payidem.anomaly, payidem.status_log, '
				   'payidem.state, payidem.transition, payidem.channel_bill, payidem.recon_batch, '
				   'payidem.reconciliation TO %I', v_role);
	INSERT INTO payidem.auditor_role (role_name) VALUES (v_role) ON CONFLICT DO NOTHING;
END
$$;
COMMENT ON FUNCTION payidem.grant_auditor(regrole) IS
	'Read-only access to every merchant''s business rows; never to merchant_secret, channel_config or idempotency results.';

CREATE FUNCTION payidem.map_merchant_role(role regrole, merchant_no text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_role name := payidem._check_role(role);
BEGIN
	PERFORM payidem._merchant_for_update(map_merchant_role.merchant_no);
	EXECUTE format('GRANT USAGE ON SCHEMA payidem TO %I', v_role);
	EXECUTE format('GRANT EXECUTE ON FUNCTION payidem._row_visible(text, name) TO %I', v_role);
	EXECUTE format('GRANT SELECT ON payidem."order", payidem.payment, payidem.refund, payidem.anomaly TO %I', v_role);
	INSERT INTO payidem.merchant_role (role_name, merchant_no)
	VALUES (v_role, map_merchant_role.merchant_no) ON CONFLICT DO NOTHING;
END
$$;
COMMENT ON FUNCTION payidem.map_merchant_role(regrole, text) IS
	'Let a reporting role read the orders, payments, refunds and anomalies of one merchant (row-level security).';

CREATE FUNCTION payidem.unmap_merchant_role(role regrole, merchant_no text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	DELETE FROM payidem.merchant_role r
	 WHERE r.role_name = role::text::name AND r.merchant_no OPERATOR(pg_catalog.=) unmap_merchant_role.merchant_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'role % is not mapped to merchant %', role,
			coalesce(quote_literal(left(unmap_merchant_role.merchant_no, 64)), 'NULL') USING
			ERRCODE = 'PI009';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.unmap_merchant_role(regrole, text) IS
	'Remove a reporting role''s access to one merchant''s rows.';

-- (end of merchant functions)

------------------------------------------------------------------------------
-- Payment flow: orders, attempts, results, refunds, notifications
------------------------------------------------------------------------------

-- (end of payment-flow functions)

------------------------------------------------------------------------------
-- Reconciliation
------------------------------------------------------------------------------

-- (end of reconciliation functions)

------------------------------------------------------------------------------
-- pg_dump keeps the rows of every data table (built-in whitelist rows are
-- recreated by CREATE EXTENSION, so they are left out of the dump).
------------------------------------------------------------------------------

SELECT pg_catalog.pg_extension_config_dump('payidem.state', 'WHERE NOT builtin');
SELECT pg_catalog.pg_extension_config_dump('payidem.transition', 'WHERE NOT builtin');
SELECT pg_catalog.pg_extension_config_dump('payidem.status_log', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.status_log_log_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.merchant', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.merchant_secret', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.channel', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.channel_config', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.merchant_channel', '');
SELECT pg_catalog.pg_extension_config_dump('payidem."order"', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.payment', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.refund', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.idempotency', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.anomaly', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.anomaly_anomaly_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.channel_bill', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.recon_batch', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.reconciliation', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.reconciliation_recon_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.order_no_hwm', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.merchant_role', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.auditor_role', '');

------------------------------------------------------------------------------
-- Privileges: nothing for PUBLIC.  Grant to your application and operator
-- roles explicitly (see README, "Privileges").
------------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA payidem FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA payidem FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA payidem FROM PUBLIC;
REVOKE ALL ON SCHEMA payidem FROM PUBLIC;

