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
	CONSTRAINT order_expire_after_create CHECK (expire_at > created_at)
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

CREATE FUNCTION payidem._order_no_forget()
RETURNS void
AS 'MODULE_PATHNAME', 'payidem_order_no_forget'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._order_no_forget() IS
	'Internal: makes the next gen_order_no() in this database reserve in this installation''s order_no_hwm.';

------------------------------------------------------------------------------
-- Idempotency functions (C: src/idem.c)
------------------------------------------------------------------------------

-- (end of idempotency functions)

------------------------------------------------------------------------------
-- State machines: transition functions and triggers (C)
------------------------------------------------------------------------------

-- (end of state-machine functions)

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

------------------------------------------------------------------------------
-- Privileges: nothing for PUBLIC.  Grant to your application and operator
-- roles explicitly (see README, "Privileges").
------------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA payidem FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA payidem FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA payidem FROM PUBLIC;
REVOKE ALL ON SCHEMA payidem FROM PUBLIC;

-- A fresh order_no_hwm: forget any reservation cached for this database by an
-- earlier installation, so the first number reserves in this sequence.
SELECT payidem._order_no_forget();
