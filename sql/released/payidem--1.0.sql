\echo Use "CREATE EXTENSION payidem" to load this file. \quit

/*
 * payidem 1.0 -- schema.
 *
 * Money is bigint in the currency's minor unit; rates are numeric(7,6)
 * fractions.  Which statuses a row of "order", payment and refund may take is
 * enforced by the state-machine triggers at the end of each statement (PI002,
 * also for a status the whitelist payidem.state does not know), and only
 * there: no foreign key checks it a second time; the whitelist's own guard
 * keeps a status in use from being deleted.  Nothing is granted to PUBLIC.
 *
 * Order, payment and refund numbers carry ISO 7064 MOD 97-10 check digits
 * (see order_no_valid()).  The tables check them with built-in operators only,
 * so a role that may write a table needs no EXECUTE on a payidem function: the
 * prefix's letters read as two digits each (P=25, O=24, Y=34, R=27, F=15), and
 * the whole number is then 1 modulo 97.  (The CASE keeps the cast from seeing
 * anything but digits; a NULL passes, as in any CHECK.)
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
	('payment', 'failed',             false, false, true),
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
	('payment', 'failed',             'succeeded',          true),
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
	-- an entity's history in order (WHERE entity = ... AND entity_no = ...
	-- ORDER BY log_id), and the one index a logged change writes: log_id
	-- itself comes from its sequence for every row the triggers write
	CONSTRAINT status_log_pkey PRIMARY KEY (entity, entity_no, log_id),
	CONSTRAINT status_log_changed CHECK (from_status IS DISTINCT FROM to_status)
);
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

-- Formats of the values that are written once and never change, as domains
-- rather than table CHECK constraints: a domain's check runs when a value is
-- written to the column (INSERT, or an UPDATE that sets it) from an
-- expression compiled once per backend, while PostgreSQL re-reads and
-- evaluates every table CHECK on every UPDATE of the row, whatever it
-- changes.  Each is text (or char(3)) underneath: clients see the base type.
-- The number domains use built-in operators only (a role writing the tables
-- needs no EXECUTE on payidem's functions): the MOD 97-10 sum, and check
-- digits 02..98 as gen_order_no() writes them -- without it 00, 01 and 99
-- would give a second spelling of some numbers.  They do not check the time
-- part as order_no_valid() does.
CREATE DOMAIN payidem.order_number AS text
	CONSTRAINT order_number_format CHECK (CASE WHEN VALUE !~ '^PO[0-9]{24}$' THEN false
		ELSE ('2524' || substr(VALUE, 3))::numeric % 97 = 1 AND substr(VALUE, 25) BETWEEN '02' AND '98' END);
COMMENT ON DOMAIN payidem.order_number IS
	'An order number: PO + 24 digits, MOD 97-10 check digits valid (as payidem.order_no_valid()).';
CREATE DOMAIN payidem.payment_number AS text
	CONSTRAINT payment_number_format CHECK (CASE WHEN VALUE !~ '^PY[0-9]{24}$' THEN false
		ELSE ('2534' || substr(VALUE, 3))::numeric % 97 = 1 AND substr(VALUE, 25) BETWEEN '02' AND '98' END);
COMMENT ON DOMAIN payidem.payment_number IS
	'A payment number: PY + 24 digits, MOD 97-10 check digits valid.';
CREATE DOMAIN payidem.refund_number AS text
	CONSTRAINT refund_number_format CHECK (CASE WHEN VALUE !~ '^RF[0-9]{24}$' THEN false
		ELSE ('2715' || substr(VALUE, 3))::numeric % 97 = 1 AND substr(VALUE, 25) BETWEEN '02' AND '98' END);
COMMENT ON DOMAIN payidem.refund_number IS
	'A refund number: RF + 24 digits, MOD 97-10 check digits valid.';
CREATE DOMAIN payidem.merchant_ref AS text
	CONSTRAINT merchant_ref_format CHECK (VALUE ~ '^[0-9A-Za-z_.|*@-]+$' AND pg_catalog.length(VALUE) <= 64);
COMMENT ON DOMAIN payidem.merchant_ref IS
	'A merchant''s own number (out_trade_no, out_refund_no): 1 to 64 of 0-9 A-Z a-z _ . | * @ -.';
CREATE DOMAIN payidem.channel_ref AS text
	CONSTRAINT channel_ref_format CHECK (VALUE ~ '^[[:graph:]]+$' AND pg_catalog.length(VALUE) <= 64);
COMMENT ON DOMAIN payidem.channel_ref IS
	'A channel''s id (transaction_id, channel_refund_id): 1 to 64 printable characters, no spaces.';
CREATE DOMAIN payidem.http_url AS text
	CONSTRAINT http_url_format CHECK (VALUE ~ '^https?://[^[:space:]]+$' AND pg_catalog.length(VALUE) <= 1024);
COMMENT ON DOMAIN payidem.http_url IS
	'An http or https URL without spaces, at most 1024 characters.';
CREATE DOMAIN payidem.currency_code AS char(3)
	CONSTRAINT currency_code_format CHECK (VALUE ~ '^[A-Z]{3}$');
COMMENT ON DOMAIN payidem.currency_code IS
	'An ISO 4217 currency code: three upper-case letters.';
-- Single-column rules of the order, payment and refund tables: as domains they
-- are checked when the column is written, not on every UPDATE of the row.
CREATE DOMAIN payidem.minor_amount AS bigint
	CONSTRAINT minor_amount_positive CHECK (VALUE > 0);
COMMENT ON DOMAIN payidem.minor_amount IS
	'An amount of money in the currency''s minor unit (fen, cents): a positive bigint.';
CREATE DOMAIN payidem.order_subject AS text
	CONSTRAINT order_subject_length CHECK (pg_catalog.length(pg_catalog.btrim(VALUE)) BETWEEN 1 AND 256);
COMMENT ON DOMAIN payidem.order_subject IS
	'What an order pays for: 1 to 256 characters, not only spaces.';
CREATE DOMAIN payidem.order_body AS text
	CONSTRAINT order_body_length CHECK (pg_catalog.length(VALUE) <= 1024);
COMMENT ON DOMAIN payidem.order_body IS
	'An order''s longer description: at most 1024 characters.';
CREATE DOMAIN payidem.notify_status AS text
	CONSTRAINT notify_status_known CHECK (VALUE IN ('pending', 'sent', 'failed'));
COMMENT ON DOMAIN payidem.notify_status IS
	'Delivery state of a merchant notification event: pending (due at next_attempt_at), sent or failed (gave up).';
CREATE DOMAIN payidem.attempt_count AS integer
	CONSTRAINT attempt_count_nonnegative CHECK (VALUE >= 0);
COMMENT ON DOMAIN payidem.attempt_count IS
	'A number of attempts made so far: zero or more.';
CREATE DOMAIN payidem.refund_reason AS text
	CONSTRAINT refund_reason_length CHECK (pg_catalog.length(VALUE) <= 256);
COMMENT ON DOMAIN payidem.refund_reason IS
	'Why a refund was made: at most 256 characters.';

-- A format's pattern is written once, in its domain; the flow functions test
-- an argument against the domain of the column it goes to (payidem._fits,
-- src/payidem.c: the domain's own CHECKs, without raising), so they can say
-- which argument is wrong, with the rule in words written once below.
CREATE FUNCTION payidem._fits(value text, domain regtype)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_fits'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem._fits(text, regtype) IS
	'Internal: whether value satisfies every CHECK of the text domain (no error raised).';
CREATE FUNCTION payidem._format_rule(domain regtype)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE domain::text
	WHEN 'payidem.merchant_ref' THEN '1 to 64 characters of 0-9, A-Z, a-z and _ . | * @ -'
	WHEN 'payidem.channel_ref' THEN '1 to 64 printable characters without spaces'
	WHEN 'payidem.http_url' THEN 'an http:// or https:// URL without spaces, at most 1024 characters'
	END;
COMMENT ON FUNCTION payidem._format_rule(regtype) IS
	'Internal: the format of a domain that arguments are checked against, in words, for error messages.';
-- 22023 for an argument (what) that is not of its format; DETAIL shows the
-- value (at most 64 characters) and the rule
CREATE FUNCTION payidem._invalid_format(what text, value text, domain regtype, hint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_detail text := format('The value was %s; it must be %s.', coalesce(quote_literal(left(value, 64)), 'NULL'),
							payidem._format_rule(domain));
BEGIN
	IF hint IS NULL THEN
		RAISE EXCEPTION 'invalid %', what USING ERRCODE = 'invalid_parameter_value', DETAIL = v_detail;
	END IF;
	RAISE EXCEPTION 'invalid %', what USING ERRCODE = 'invalid_parameter_value', DETAIL = v_detail, HINT = hint;
END
$$;
COMMENT ON FUNCTION payidem._invalid_format(text, text, regtype, text) IS
	'Internal: raise 22023 "invalid <what>" for a value not of the domain''s format.';

CREATE TABLE payidem."order" (
	order_no		payidem.order_number NOT NULL,
	merchant_no		text		NOT NULL,
	out_trade_no	payidem.merchant_ref NOT NULL,
	subject			payidem.order_subject NOT NULL,
	body			payidem.order_body,
	amount			payidem.minor_amount NOT NULL,
	currency		payidem.currency_code NOT NULL DEFAULT 'CNY',
	status			text		NOT NULL DEFAULT 'pending',
	refunded_amount	bigint		NOT NULL DEFAULT 0,
	notify_url		payidem.http_url,
	return_url		payidem.http_url,
	expire_at		timestamptz	NOT NULL,
	paid_at			timestamptz,
	paid_payment_no	payidem.payment_number,
	closed_at		timestamptz,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT order_pkey PRIMARY KEY (order_no),
	CONSTRAINT order_out_trade_no_key UNIQUE (merchant_no, out_trade_no),
	CONSTRAINT order_merchant_key UNIQUE (order_no, merchant_no),
	CONSTRAINT order_merchant_fkey FOREIGN KEY (merchant_no)
		REFERENCES payidem.merchant (merchant_no),
	CONSTRAINT order_refunded_range CHECK (refunded_amount >= 0 AND refunded_amount <= amount),
	CONSTRAINT order_expire_after_create CHECK (expire_at > created_at)
) WITH (fillfactor = 85);
-- No index of "order" names status, paid_at or paid_payment_no, in its key or
-- its predicate: the update that pays an order is HOT (no index entry
-- written), and the 15 % left free on each page (fillfactor) is where its new
-- version goes.  Which pending orders expire when is kept in order_expiry.
COMMENT ON TABLE payidem."order" IS
	'Merchant orders: one order, possibly several payment attempts.';

-- The orders that may expire, by expiry time: a row is added when an order
-- is inserted pending, becomes pending again, or has its expire_at moved
-- while pending (trigger order_expiry_queue, src/housekeeping.c, for every
-- writer); housekeeping reads it in expire_at order and removes, once their
-- time has passed, the rows of orders no longer pending at that time
-- (_prune_expiry_queue).  So an order is written to it once, a payment
-- writes nothing to it, and it holds about the orders of one expiry period.
-- It is derived data: not dumped; a restore's COPY of "order" makes it again.
CREATE TABLE payidem.order_expiry (
	expire_at		timestamptz	NOT NULL,
	order_no		text		NOT NULL,
	CONSTRAINT order_expiry_pkey PRIMARY KEY (expire_at, order_no)
);
COMMENT ON TABLE payidem.order_expiry IS
	'The pending orders by expiry time, for housekeeping and query_due(); rows of orders no longer pending are removed after their expire_at.';
COMMENT ON COLUMN payidem."order".order_no IS
	'Platform order number, payidem.gen_order_no(''PO'').';
COMMENT ON COLUMN payidem."order".out_trade_no IS
	'The merchant''s own order number; unique per merchant (a repeat with the same amount and subject returns the same order).';
COMMENT ON COLUMN payidem."order".amount IS
	'Amount in the currency''s minor unit (fen, cents).';
COMMENT ON COLUMN payidem."order".status IS
	'Order status, one of payidem.state where entity = ''order''; changes follow payidem.transition.';
COMMENT ON COLUMN payidem."order".refunded_amount IS
	'Sum of succeeded refunds, minor units; never above amount.';
COMMENT ON COLUMN payidem."order".notify_url IS
	'Where the merchant''s notifications of this order go (payidem.notify_event); NULL: none are written.';
COMMENT ON COLUMN payidem."order".paid_payment_no IS
	'The payment attempt that paid the order (its refunds move the order''s refunded_amount).';
COMMENT ON COLUMN payidem."order".expire_at IS
	'No payment may start after this instant.';

CREATE TABLE payidem.payment (
	payment_no		payidem.payment_number NOT NULL,
	order_no		text		NOT NULL,
	merchant_no		text		NOT NULL,
	channel_no		text		NOT NULL,
	amount			payidem.minor_amount NOT NULL,
	status			text		NOT NULL DEFAULT 'pending',
	transaction_id	payidem.channel_ref,
	fee_amount		bigint,
	cost_amount		bigint,
	refunded_amount	bigint		NOT NULL DEFAULT 0,
	paid_at			timestamptz,
	closed_at		timestamptz,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT payment_pkey PRIMARY KEY (payment_no),
	-- the target of the (payment_no, order_no) foreign keys; order_no first,
	-- so that it also finds an order's attempts
	CONSTRAINT payment_order_key UNIQUE (order_no, payment_no),
	CONSTRAINT payment_order_fkey FOREIGN KEY (order_no, merchant_no)
		REFERENCES payidem."order" (order_no, merchant_no),
	CONSTRAINT payment_channel_fkey FOREIGN KEY (channel_no)
		REFERENCES payidem.channel (channel_no),
	CONSTRAINT payment_fee_range CHECK (fee_amount >= 0 AND fee_amount <= amount),
	CONSTRAINT payment_cost_range CHECK (cost_amount >= 0 AND cost_amount <= amount),
	CONSTRAINT payment_refunded_range CHECK (refunded_amount >= 0 AND refunded_amount <= amount)
) WITH (fillfactor = 85);
CREATE INDEX payment_merchant_channel_created ON payidem.payment (merchant_no, channel_no, created_at);
-- No index of payment names status, transaction_id or paid_at, in its key or
-- its predicate: the update that records a success is HOT (no index entry
-- written; the 15 % left free on each page is where its new version goes).
-- The rules and look-ups that need those columns use the payment's keys,
-- below.

-- A payment's keys that change when it is paid or ends, each a table of its
-- own with the payment's unique constraint of old, kept by the trigger
-- status_keys (src/flow.c) for every writer of payment:
--   payment_pending: at most one pending attempt per order (its primary key,
--     payment_one_pending_per_order): a row while an attempt is pending, so
--     two concurrent begin_payment calls can never both leave one behind;
--   payment_paid: a channel's transaction id is one payment
--     (payment_transaction_key), and a channel's payments by the time they
--     were paid, for reconciliation (payment_channel_paid): a row for each
--     payment with a transaction id or a paid_at.
-- Derived data: not dumped; a restore's COPY of payment makes them again, and
-- payidem.rebuild_payment_keys() does after writes with the triggers off.
CREATE TABLE payidem.payment_pending (
	order_no		text		NOT NULL,
	payment_no		text		NOT NULL,
	CONSTRAINT payment_one_pending_per_order PRIMARY KEY (order_no)
);
COMMENT ON TABLE payidem.payment_pending IS
	'The pending payment attempt of each order (at most one), kept from payidem.payment by its trigger status_keys.';
CREATE TABLE payidem.payment_paid (
	payment_no		text		NOT NULL,
	channel_no		text		NOT NULL,
	transaction_id	text,
	paid_at			timestamptz,
	CONSTRAINT payment_transaction_key UNIQUE (channel_no, transaction_id)
);
CREATE INDEX payment_channel_paid ON payidem.payment_paid (channel_no, paid_at);
COMMENT ON TABLE payidem.payment_paid IS
	'Each payment with a transaction id or a paid_at, by channel: one payment per transaction id; reconciliation''s payments of a day. Kept from payidem.payment by its trigger status_keys.';
COMMENT ON TABLE payidem.payment IS
	'Payment attempts: one order may have several (e.g. WeChat failed, then Alipay succeeded); at most one pending.';
COMMENT ON COLUMN payidem.payment.payment_no IS
	'Platform payment number, payidem.gen_order_no(''PY''); sent to the channel as its out_trade_no.';
COMMENT ON COLUMN payidem.payment.status IS
	'Attempt status, one of payidem.state where entity = ''payment''.';
COMMENT ON COLUMN payidem.payment.transaction_id IS
	'The channel''s transaction id; unique per channel.';
COMMENT ON COLUMN payidem.payment.fee_amount IS
	'What the merchant pays for this payment, round(amount * rate) half-up, minor units.';
COMMENT ON COLUMN payidem.payment.cost_amount IS
	'What the channel charges the platform for this payment, minor units.';
COMMENT ON COLUMN payidem.payment.refunded_amount IS
	'Sum of succeeded refunds of this payment, minor units; never above amount.';

CREATE TABLE payidem.refund (
	refund_no			payidem.refund_number NOT NULL,
	payment_no			text		NOT NULL,
	order_no			text		NOT NULL,
	merchant_no			text		NOT NULL,
	out_refund_no		payidem.merchant_ref NOT NULL,
	amount				payidem.minor_amount NOT NULL,
	status				text		NOT NULL DEFAULT 'pending',
	channel_refund_id	payidem.channel_ref,
	reason				payidem.refund_reason,
	refunded_at			timestamptz,
	created_at			timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at			timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT refund_pkey PRIMARY KEY (refund_no),
	CONSTRAINT refund_out_refund_no_key UNIQUE (merchant_no, out_refund_no),
	CONSTRAINT refund_payment_fkey FOREIGN KEY (payment_no, order_no)
		REFERENCES payidem.payment (payment_no, order_no),
	CONSTRAINT refund_order_fkey FOREIGN KEY (order_no, merchant_no)
		REFERENCES payidem."order" (order_no, merchant_no)
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
COMMENT ON COLUMN payidem.refund.channel_refund_id IS
	'The channel''s id for the refund, once it has one.';

-- The merchant-notification outbox: one row per event, written by a trigger
-- in the transaction of the change it reports (status_notify, below), so an
-- event is delivered if and only if that change committed.  The id carries
-- the shard's two digits (id % 100), as the order numbers do, so the router
-- knows where an event lives.
-- Single-column rules as domains (checked where the column is written; a
-- CHECK constraint would be read from the catalog at every INSERT, which
-- runs on the hot path of a first success).  What ties the columns
-- together -- a refund event names its refund, only a pending event has a
-- next attempt -- is kept by the only writers, the status_notify trigger,
-- notify_due() and notify_result().  No foreign keys: the trigger copies the
-- order's number and merchant (and the refund's number) from the row whose
-- change it reports, in that row's transaction, and orders and refunds are
-- never deleted (keep_money_records); a foreign key would check at every
-- event, at the cost of a query, what the one writer makes true.
CREATE DOMAIN payidem.notify_event_type AS text
	CONSTRAINT notify_event_type_known CHECK (VALUE IN ('order.paid', 'refund.succeeded', 'order.closed'));
COMMENT ON DOMAIN payidem.notify_event_type IS
	'What a merchant notification reports: order.paid, refund.succeeded or order.closed.';
CREATE DOMAIN payidem.notify_response AS text
	CONSTRAINT notify_response_length CHECK (pg_catalog.length(VALUE) <= 256);
COMMENT ON DOMAIN payidem.notify_response IS
	'The start of a merchant''s answer to a failed delivery: at most 256 characters.';
CREATE SEQUENCE payidem.notify_event_seq AS bigint MINVALUE 1 MAXVALUE 92233720368547758 NO CYCLE;
CREATE TABLE payidem.notify_event (
	event_id		bigint		NOT NULL,
	event			payidem.notify_event_type NOT NULL,
	order_no		text		NOT NULL,
	merchant_no		text		NOT NULL,
	refund_no		text,
	payload			text		NOT NULL,
	status			payidem.notify_status NOT NULL DEFAULT 'pending',
	attempts		payidem.attempt_count NOT NULL DEFAULT 0,
	next_attempt_at	timestamptz,
	last_attempt_at	timestamptz,
	last_response	payidem.notify_response,
	sent_at			timestamptz,
	created_at		timestamptz	NOT NULL,
	CONSTRAINT notify_event_pkey PRIMARY KEY (event_id)
);
CREATE INDEX notify_event_due ON payidem.notify_event (next_attempt_at) WHERE status = 'pending';
CREATE INDEX notify_event_failed ON payidem.notify_event (created_at) WHERE status = 'failed';
COMMENT ON TABLE payidem.notify_event IS
	'Merchant notifications (outbox): one row per order.paid, refund.succeeded and order.closed event of an order with a notify_url; handed out by notify_due(), answered by notify_result().';
COMMENT ON COLUMN payidem.notify_event.event_id IS
	'The event''s id, unique across shards: a sequence number times 100 plus payidem.shard_id.';
COMMENT ON COLUMN payidem.notify_event.payload IS
	'The JSON text sent, byte for byte what the signature covers; the state of the order at the event.';
COMMENT ON COLUMN payidem.notify_event.next_attempt_at IS
	'When a pending event is due next (also pushed forward while a worker holds it, the lease).';
COMMENT ON COLUMN payidem.notify_event.last_response IS
	'The start (256 characters) of the last failed attempt''s response, as notify_result() reported it.';

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
-- A channel_only difference raises one anomaly, never a second one on a re-run.
CREATE UNIQUE INDEX anomaly_channel_only_once ON payidem.anomaly
	(channel_no, (detail ->> 'bill_date'), (detail ->> 'transaction_id'))
	WHERE kind = 'channel_only';
COMMENT ON COLUMN payidem.anomaly.kind IS
	'What went wrong: paid_after_close, duplicate_payment, amount_mismatch, transaction_conflict, unknown_transaction, channel_only, ...';
COMMENT ON COLUMN payidem.anomaly.amount IS
	'Money concerned, minor units (e.g. the amount to refund).';
COMMENT ON COLUMN payidem.anomaly.handle_status IS
	'open until a person marks it handled or ignored (handled_at/handled_by/note say when, who and why).';

CREATE TABLE payidem.channel_bill (
	channel_no		text		NOT NULL,
	bill_date		date		NOT NULL,
	transaction_id	payidem.channel_ref NOT NULL,
	payment_no		text,
	amount			bigint		NOT NULL,
	fee				bigint		NOT NULL DEFAULT 0,
	status			text		NOT NULL,
	paid_at			timestamptz,
	imported_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT channel_bill_pkey PRIMARY KEY (channel_no, bill_date, transaction_id),
	CONSTRAINT channel_bill_channel_fkey FOREIGN KEY (channel_no)
		REFERENCES payidem.channel (channel_no),
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
	bill_timezone	text,
	bill_lines		bigint		NOT NULL DEFAULT 0,
	bill_amount_total numeric(38,0) NOT NULL DEFAULT 0,	-- a day's sum may pass bigint
	platform_payments bigint	NOT NULL DEFAULT 0,
	platform_amount_total numeric(38,0) NOT NULL DEFAULT 0,
	straddled		bigint		NOT NULL DEFAULT 0,
	auto_resolved	bigint		NOT NULL DEFAULT 0,
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
	CONSTRAINT recon_batch_finished_when_ended CHECK ((status = 'running') = (finished_at IS NULL)),
	CONSTRAINT recon_batch_totals_nonnegative CHECK (
		bill_lines >= 0 AND bill_amount_total >= 0 AND platform_payments >= 0
		AND platform_amount_total >= 0 AND straddled >= 0 AND auto_resolved >= 0)
);
CREATE INDEX recon_batch_channel_day ON payidem.recon_batch (channel_no, bill_date);
COMMENT ON TABLE payidem.recon_batch IS
	'One reconciliation run of a channel and bill day: counts and timing.';
-- what each run saw, beyond the counts of the contract
COMMENT ON COLUMN payidem.recon_batch.recon_batch_no IS
	'RC-<channel_no>-<YYYYMMDD>-<run>, run = 001, 002, ... per channel and bill day.';
COMMENT ON COLUMN payidem.recon_batch.bill_timezone IS
	'The payidem.bill_timezone the run used to cut the day.';
COMMENT ON COLUMN payidem.recon_batch.bill_lines IS
	'Lines of the channel''s bill of that day.';
COMMENT ON COLUMN payidem.recon_batch.bill_amount_total IS
	'Sum of the amounts of the bill''s lines, minor units.';
COMMENT ON COLUMN payidem.recon_batch.platform_payments IS
	'Platform payments of the channel (succeeded, partially_refunded, refunded) whose paid_at falls on the day.';
COMMENT ON COLUMN payidem.recon_batch.platform_amount_total IS
	'Sum of the amounts of those payments, minor units.';
COMMENT ON COLUMN payidem.recon_batch.straddled IS
	'Midnight straddles: bill lines of the day matched to payments of another day, and payments of the day found in the bill of another day.';
COMMENT ON COLUMN payidem.recon_batch.auto_resolved IS
	'Open platform_only differences of other days that this run found in the day''s bill and marked auto_resolved.';

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
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION payidem.order_no_valid(text) IS
	'true if the text is a well-formed order number with correct check digits; false otherwise, also for NULL; never raises an error.';

CREATE FUNCTION payidem.order_no_parse(order_no text)
RETURNS TABLE (prefix text, issued_at timestamptz, shard integer, seq integer)
AS 'MODULE_PATHNAME', 'payidem_order_no_parse'
LANGUAGE C IMMUTABLE PARALLEL SAFE ROWS 1;
COMMENT ON FUNCTION payidem.order_no_parse(text) IS
	'The parts of an order number; SQLSTATE 22023 if it is not valid or NULL.';

CREATE FUNCTION payidem.order_no_make(prefix text, issued_at timestamptz, shard integer, seq integer)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_order_no_make'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION payidem.order_no_make(text, timestamptz, integer, integer) IS
	'The number with these parts and its check digits (the inverse of order_no_parse). Reserves nothing: gen_order_no() may issue the same number. For fixtures, benchmarks and migrations.';

CREATE FUNCTION payidem.stats()
RETURNS TABLE (name text, value bigint, server_value bigint)
AS 'MODULE_PATHNAME', 'payidem_stats'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem.stats() IS
	'Counters from shared memory since the server started: value for the current database, server_value for every database. Order numbers issued, clock rollbacks absorbed, seconds borrowed, claims and payment results by outcome, transitions, notifications, housekeeping (docs/operations.md).';

CREATE FUNCTION payidem._count(counter text, n bigint DEFAULT 1)
RETURNS void
AS 'MODULE_PATHNAME', 'payidem_count_sql'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._count(text, bigint) IS
	'Internal: add n to a counter of stats() (for the SQL parts that count).';

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

CREATE FUNCTION payidem.idem_record(idem_key text, biz_type text, order_no text,
                                    channel text, amount bigint, result jsonb,
                                    fingerprint text DEFAULT NULL)
RETURNS TABLE (outcome text, status text, result jsonb, attempts integer)
AS 'MODULE_PATHNAME', 'payidem_idem_record'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;
COMMENT ON FUNCTION payidem.idem_record(text, text, text, text, bigint, jsonb, text) IS
	'idem_claim() and idem_finish(key, ''completed'', result) in one write, when the business effect commits in the same transaction: claimed (the key is now completed with result: run the logic), replay, in_progress as for idem_claim(); a failed or expired key is reclaimed and completed at once (reclaimed). PI001 if reused with other parameters.';

CREATE FUNCTION payidem.idem_purge(older_than interval DEFAULT '24 hours')
RETURNS bigint
AS 'MODULE_PATHNAME', 'payidem_idem_purge'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.idem_purge(interval) IS
	'Delete completed and failed keys unchanged for longer than older_than; never a processing key. Returns the number deleted.';

CREATE FUNCTION payidem._idem_purge_batch(older_than interval, max_rows integer)
RETURNS bigint
AS 'MODULE_PATHNAME', 'payidem_idem_purge_batch'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._idem_purge_batch(interval, integer) IS
	'Internal (housekeeping): idem_purge(older_than), at most max_rows keys, oldest first; keys another transaction holds are left for the next batch.';

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

-- What the whitelist tables refuse:
--   * changing or deleting a built-in row (payidem's own functions rely on
--     them, and pg_dump does not keep them: CREATE EXTENSION recreates them on
--     restore, so an edit would silently come undone), or making a row
--     built-in;
--   * a transition that leaves a terminal status, and making a status
--     terminal while transitions leave it;
--   * deleting or renaming a status that rows of its entity have (the status
--     triggers refuse a status the whitelist does not know, so the tables
--     need no foreign key to payidem.state: see _status_in_use).
-- ENABLE ALWAYS like whitelist_changed: a restore loads only your own rows.

-- Whether rows of the entity have the status (src/state_machine.c): looked
-- at with the latest snapshot, first without a lock, then under a SHARE
-- lock on the entity's table held to the end of the transaction, which waits
-- for writers that might be giving a row the status and keeps new ones out
-- until the change commits (they then see the whitelist without it).  The
-- guard runs as the owner (SECURITY DEFINER), so whoever may change the
-- whitelist needs no EXECUTE on it.
CREATE FUNCTION payidem._status_in_use(entity text, status text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_status_in_use'
LANGUAGE C VOLATILE;

CREATE FUNCTION payidem._whitelist_guard()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_in_use boolean := false;
BEGIN
	IF TG_OP = 'TRUNCATE' THEN
		RAISE EXCEPTION 'payidem.% cannot be truncated', TG_TABLE_NAME USING
			ERRCODE = 'insufficient_privilege',
			DETAIL = 'It holds the built-in state machines that payidem''s functions rely on.',
			HINT = 'Delete your own rows: DELETE FROM payidem.' || TG_TABLE_NAME || ' WHERE NOT builtin.';
	END IF;
	IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.builtin THEN
		RAISE EXCEPTION 'built-in rows of payidem.% cannot be changed or deleted', TG_TABLE_NAME USING
			ERRCODE = 'insufficient_privilege',
			DETAIL = format('%s row %s is built in: payidem''s functions rely on it, and CREATE EXTENSION recreates it on a restore.',
							TG_TABLE_NAME, to_jsonb(OLD) - 'builtin'),
			HINT = 'Add statuses and transitions of your own; only rows with builtin = false can be changed or deleted.';
	END IF;
	-- (nested: PL/pgSQL may evaluate every operand of an AND, and a
	-- transition row has no status field)
	IF TG_TABLE_NAME = 'state' AND TG_OP IN ('UPDATE', 'DELETE') THEN
		IF TG_OP = 'DELETE' THEN
			v_in_use := payidem._status_in_use(OLD.entity, OLD.status);
		ELSIF (NEW.entity, NEW.status) IS DISTINCT FROM (OLD.entity, OLD.status) THEN
			v_in_use := payidem._status_in_use(OLD.entity, OLD.status);
		END IF;
	END IF;
	IF v_in_use THEN
		RAISE EXCEPTION 'status % of % is in use', quote_literal(OLD.status), OLD.entity USING
			ERRCODE = 'foreign_key_violation',
			DETAIL = format('Rows of payidem.%s have status %L; the whitelist cannot lose it.',
							CASE OLD.entity WHEN 'order' THEN '"order"' ELSE OLD.entity END, OLD.status),
			HINT = format('Move them to another status first (payidem.transit_%s), or keep the status.', OLD.entity);
	END IF;
	IF TG_OP = 'DELETE' THEN
		RETURN OLD;
	END IF;
	IF NEW.builtin THEN
		RAISE EXCEPTION 'only CREATE EXTENSION installs built-in rows' USING
			ERRCODE = 'insufficient_privilege',
			DETAIL = format('%s row %s has builtin = true.', TG_TABLE_NAME, to_jsonb(NEW) - 'builtin'),
			HINT = 'Insert it with builtin = false (the default), so that pg_dump keeps it.';
	END IF;
	IF TG_TABLE_NAME = 'transition' THEN
		IF EXISTS (SELECT 1 FROM payidem.state s
					WHERE s.entity = NEW.entity AND s.status = NEW.from_status AND s.terminal) THEN
			RAISE EXCEPTION 'a transition cannot leave a terminal status' USING
				ERRCODE = 'check_violation',
				DETAIL = format('%s: ''%s'' is terminal in payidem.state; the transition was ''%s'' -> ''%s''.',
								NEW.entity, NEW.from_status, NEW.from_status, NEW.to_status),
				HINT = 'Leave from a status that is not terminal, or add your own status for the new path.';
		END IF;
	ELSIF NEW.terminal THEN
		IF EXISTS (SELECT 1 FROM payidem.transition t
					WHERE t.entity = NEW.entity AND t.from_status = NEW.status) THEN
			RAISE EXCEPTION 'a status that transitions leave cannot be terminal' USING
				ERRCODE = 'check_violation',
				DETAIL = format('%s: transitions in payidem.transition leave ''%s''.', NEW.entity, NEW.status),
				HINT = 'Delete those transitions first, or keep the status non-terminal.';
		END IF;
	END IF;
	RETURN NEW;
END
$$;
COMMENT ON FUNCTION payidem._whitelist_guard() IS
	'Trigger on payidem.state and payidem.transition: built-in rows are fixed; no transition leaves a terminal status; a status rows have is not deleted or renamed.';

CREATE TRIGGER whitelist_guard
	BEFORE INSERT OR UPDATE OR DELETE ON payidem.state
	FOR EACH ROW EXECUTE FUNCTION payidem._whitelist_guard();
CREATE TRIGGER whitelist_guard_truncate
	BEFORE TRUNCATE ON payidem.state
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._whitelist_guard();
CREATE TRIGGER whitelist_guard
	BEFORE INSERT OR UPDATE OR DELETE ON payidem.transition
	FOR EACH ROW EXECUTE FUNCTION payidem._whitelist_guard();
CREATE TRIGGER whitelist_guard_truncate
	BEFORE TRUNCATE ON payidem.transition
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._whitelist_guard();
ALTER TABLE payidem.state ENABLE ALWAYS TRIGGER whitelist_guard;
ALTER TABLE payidem.state ENABLE ALWAYS TRIGGER whitelist_guard_truncate;
ALTER TABLE payidem.transition ENABLE ALWAYS TRIGGER whitelist_guard;
ALTER TABLE payidem.transition ENABLE ALWAYS TRIGGER whitelist_guard_truncate;

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
	AFTER INSERT OR UPDATE ON payidem."order"
	FOR EACH ROW EXECUTE FUNCTION payidem.status_guard('order', 'order_no');
CREATE CONSTRAINT TRIGGER status_guard
	AFTER INSERT OR UPDATE ON payidem.payment
	FOR EACH ROW EXECUTE FUNCTION payidem.status_guard('payment', 'payment_no');
CREATE CONSTRAINT TRIGGER status_guard
	AFTER INSERT OR UPDATE ON payidem.refund
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

-- A status and its bookkeeping never disagree (DESIGN section 5), whoever writes:
-- the flow functions, transit_*(), a DBA's own UPDATE (src/ledger.c, where
-- the rules are written).  What one row says about itself is checked at the
-- end of each statement (status_ledger); what rows say about each other -- an
-- order's paying payment, a payment's refunds -- at commit
-- (status_ledger_at_commit), when every row of a flow step is written.
-- Refused with PI002: the message names the invariant, DETAIL the values,
-- HINT the flow function that does the bookkeeping.  Ordinary triggers, like
-- status_guard: session_replication_role = replica (superuser) skips them.
-- Named status_ledger*: triggers of one event fire in name order, so a
-- change the whitelist refuses is reported as that (status_guard) first.
-- The statuses of a payment whose money arrived (src/ledger.c, the one list,
-- which the bookkeeping triggers and apply_payment_result() read too);
-- IMMUTABLE, so `status = ANY (payidem._paid_payment_statuses())` is a
-- constant once planned.
CREATE FUNCTION payidem._paid_payment_statuses()
RETURNS text[]
AS 'MODULE_PATHNAME', 'payidem_paid_payment_statuses'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._paid_payment_statuses() IS
	'Internal: the payment statuses in which its money has arrived (succeeded, partially_refunded, refunded).';

CREATE FUNCTION payidem.ledger_row()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_ledger_row'
LANGUAGE C;
COMMENT ON FUNCTION payidem.ledger_row() IS
	'Trigger on payidem."order" and payidem.payment: a paid order names its payment and has paid_at; a succeeded payment has its transaction id, paid_at and fees; a status agrees with the refunded amount (PI002).';
CREATE FUNCTION payidem.ledger_at_commit()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_ledger_at_commit'
LANGUAGE C;
COMMENT ON FUNCTION payidem.ledger_at_commit() IS
	'Deferred constraint trigger on payidem."order", payment and refund: at commit, a paid order''s payment is a succeeded payment of it, and refunded amounts add up and are mirrored on the order (PI002). Reads as the tables'' owner.';

CREATE TRIGGER status_ledger
	AFTER INSERT OR UPDATE ON payidem."order"
	FOR EACH ROW EXECUTE FUNCTION payidem.ledger_row();
CREATE TRIGGER status_ledger
	AFTER INSERT OR UPDATE ON payidem.payment
	FOR EACH ROW EXECUTE FUNCTION payidem.ledger_row();
CREATE CONSTRAINT TRIGGER status_ledger_at_commit
	AFTER UPDATE ON payidem."order" DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION payidem.ledger_at_commit();
CREATE CONSTRAINT TRIGGER status_ledger_at_commit
	AFTER UPDATE ON payidem.payment DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION payidem.ledger_at_commit();
CREATE CONSTRAINT TRIGGER status_ledger_at_commit
	AFTER UPDATE ON payidem.refund DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION payidem.ledger_at_commit();

-- Money records are kept (DESIGN section 5): no DELETE or TRUNCATE of orders,
-- payments, refunds or anomalies, for any role.  Ordinary triggers: the
-- superuser's session_replication_role = replica is the one way around.
CREATE FUNCTION payidem._keep_money_records()
RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	RAISE EXCEPTION 'rows of payidem.% cannot be deleted', quote_ident(TG_TABLE_NAME) USING
		ERRCODE = 'insufficient_privilege',
		DETAIL = format('payidem.%s holds money records; %s is refused for every role.', quote_ident(TG_TABLE_NAME), TG_OP),
		HINT = CASE TG_TABLE_NAME
				   WHEN 'anomaly' THEN 'Set its handle_status to handled or ignored instead.'
				   WHEN 'order' THEN 'Close a pending order with payidem.close_order(); a paid one is refunded with payidem.refund().'
				   WHEN 'payment' THEN 'Close a pending payment with payidem.close_payment(); a succeeded one is refunded with payidem.refund().'
				   ELSE 'A refund ends succeeded or failed through payidem.apply_refund_result().' END;
END
$$;
COMMENT ON FUNCTION payidem._keep_money_records() IS
	'Trigger on payidem."order", payment, refund and anomaly: refuses DELETE and TRUNCATE.';

CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem."order"
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem."order"
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem.payment
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem.payment
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem.refund
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem.refund
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem.anomaly
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem.anomaly
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();

-- The transition functions: one conditional UPDATE each (optimistic lock).
CREATE FUNCTION payidem.transit_order(order_no text, to_status text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_transit_order'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.transit_order(text, text) IS
	'Move an order to to_status if payidem.transition allows it from its current status: true = moved, false = already there, PI009 = no such order, PI002 = not allowed, 22023 = unknown status.';

CREATE FUNCTION payidem.transit_payment(payment_no text, to_status text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_transit_payment'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.transit_payment(text, text) IS
	'Move a payment attempt to to_status if payidem.transition allows it: true = moved, false = already there, PI009 = no such payment, PI002 = not allowed, 22023 = unknown status.';

CREATE FUNCTION payidem.transit_refund(refund_no text, to_status text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_transit_refund'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
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

-- A duration argument (an order's expiry, a secret's grace period): not NULL,
-- and now() plus it is after now (or now itself, where allow_zero) and at most
-- now() plus 100 years.  The end is what is checked: PostgreSQL compares
-- intervals counting a month as 30 days, but adds months and days to a time
-- by the calendar ('1 month -29 days' can end before it starts), and a sum past
-- the timestamp range is 22008.  22023 for all of these; no exception block
-- (create_order calls this for every order).
CREATE FUNCTION payidem._check_duration(message text, what text, value interval,
										allow_zero boolean, hint text)
RETURNS interval
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_end timestamptz;
BEGIN
	-- each part (months, days, time) within 100 years, so that the sum below
	-- cannot leave the timestamp range; then the end itself
	IF value IS NOT NULL
	   AND abs(extract(year FROM value) * 12 + extract(month FROM value)) <= 1200
	   AND abs(extract(day FROM value)) <= 36525
	   AND abs(extract(hour FROM value) * 3600 + extract(minute FROM value) * 60
			   + extract(second FROM value)) <= 3155760000 THEN	-- 36525 days, in seconds
		v_end := now() + value;
	END IF;
	IF v_end IS NULL OR v_end < now() OR (v_end = now() AND NOT allow_zero)
	   OR v_end > now() + interval '100 years' THEN
		RAISE EXCEPTION '%', message USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('%s was %s; it must be %s interval of at most 100 years.', what,
							coalesce(value::text, 'NULL'),
							CASE WHEN allow_zero THEN 'a zero or positive' ELSE 'a positive' END),
			HINT = hint;
	END IF;
	RETURN value;
END
$$;

-- The day of a channel's bill (load_bill, reconcile): a calendar day a bill
-- can have, from 1970 to 9999 (so that the next midnight exists too).
CREATE FUNCTION payidem._check_bill_date(bill_date date)
RETURNS date
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF NOT isfinite(bill_date) OR bill_date < date '1970-01-01' OR bill_date > date '9999-12-31' THEN
		RAISE EXCEPTION 'invalid bill date' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The bill date was %s; a bill covers one calendar day from 1970-01-01 to 9999-12-31.',
							CASE WHEN isfinite(bill_date)	-- ISO, whatever DateStyle (to_char stops at 294276)
								 THEN format('%s-%s-%s', extract(year FROM bill_date),
											 lpad(extract(month FROM bill_date)::text, 2, '0'),
											 lpad(extract(day FROM bill_date)::text, 2, '0'))
								 ELSE bill_date::text END);
	END IF;
	RETURN bill_date;
END
$$;

-- The attributes of a new merchant (create_merchant, and its copies on shards).
CREATE FUNCTION payidem._check_merchant_fields(name text, merchant_type text, fee_rate numeric,
	settle_cycle text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF name IS NULL OR length(btrim(name)) NOT BETWEEN 1 AND 128 THEN
		RAISE EXCEPTION 'invalid merchant name' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The name was %s; it must have 1 to 128 characters.', coalesce(quote_literal(left(name, 64)), 'NULL'));
	END IF;
	PERFORM payidem._check_code('merchant type', merchant_type, '^[a-z][a-z0-9_]{0,31}$',
		'a merchant type is a lower-case code such as retail or catering.');
	PERFORM payidem._check_rate('merchant fee', fee_rate);
	PERFORM payidem._check_code('settlement cycle', settle_cycle, '^[TD][0-9]{1,2}$',
		'a settlement cycle is T<n> or D<n>, e.g. T1 or D0.');
END
$$;

-- A missing identifier is malformed input (22023), not "does not exist".
CREATE FUNCTION payidem._require(what text, value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF value IS NULL THEN
		RAISE EXCEPTION '% must not be NULL', what USING
			ERRCODE = 'invalid_parameter_value',
			HINT = format('Pass the %s.', what);
	END IF;
	RETURN value;
END
$$;

-- An order, payment or refund number must be one before it is looked up:
-- PO/PY/RF, 24 digits, a real date and matching check digits (a valid number
-- that names no row is PI009).
-- A point in time as an application reads it, whatever its session's
-- DateStyle and TimeZone: UTC, ISO 8601, microseconds.
-- C (src/notify.c), where the events' payloads are written with the same
-- code: the format is written once.
CREATE FUNCTION payidem._utc(t timestamptz)
RETURNS text
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
AS 'MODULE_PATHNAME', 'payidem_utc';
COMMENT ON FUNCTION payidem._utc(timestamptz) IS
	'Internal: a timestamp as UTC ISO 8601 text (2026-11-30T07:33:36.463208Z), for payloads and the read API.';

CREATE FUNCTION payidem._check_number(kind text, value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_prefix text := CASE kind WHEN 'order' THEN 'PO' WHEN 'payment' THEN 'PY' ELSE 'RF' END;
	v_detail text;
BEGIN
	IF value IS NULL OR value !~ ('^' || v_prefix || '[0-9]{24}$') THEN
		RAISE EXCEPTION 'invalid % number', kind USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The value was %s; %s %s number is %s followed by 24 digits.',
							coalesce(quote_literal(left(value, 64)) ||
									 CASE WHEN length(value) > 64 THEN format('... (%s characters)', length(value)) ELSE '' END,
									 'NULL'),
							CASE kind WHEN 'order' THEN 'an' ELSE 'a' END, kind, v_prefix),
			HINT = 'Pass the number payidem returned when it created the ' || kind || '.';
	END IF;
	IF NOT payidem.order_no_valid(value) THEN
		-- only on this error path: order_no_parse() says what is wrong
		BEGIN
			PERFORM payidem.order_no_parse(value);
		EXCEPTION WHEN invalid_parameter_value THEN
			GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
		END;
		RAISE EXCEPTION 'invalid % number %', kind, quote_literal(value) USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = v_detail,
			HINT = 'Pass the number payidem returned when it created the ' || kind || '.';
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
	PERFORM payidem._require('merchant_no', p_merchant_no);
	SELECT * INTO m FROM payidem.merchant WHERE merchant_no OPERATOR(pg_catalog.=) p_merchant_no FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'merchant % does not exist', coalesce(quote_literal(left(p_merchant_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.merchant has no row with that merchant_no.';
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
	PERFORM payidem._require('channel_no', p_channel_no);
	SELECT * INTO c FROM payidem.channel WHERE channel_no OPERATOR(pg_catalog.=) p_channel_no FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'channel % does not exist', coalesce(quote_literal(left(p_channel_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.channel has no row with that channel_no.';
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
	PERFORM payidem._check_merchant_fields(name, create_merchant.merchant_type,
										   create_merchant.fee_rate, create_merchant.settle_cycle);

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
	PERFORM payidem._check_duration('invalid grace period', 'The grace period', grace, true,
									'The default is ''24 hours''; 0 ends the previous secret now.');
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
	PERFORM payidem._require('merchant_no', sign.merchant_no);
	SELECT * INTO s FROM payidem.merchant_secret ms
	 WHERE ms.merchant_no OPERATOR(pg_catalog.=) sign.merchant_no AND ms.valid_until IS NULL;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'merchant % does not exist', coalesce(quote_literal(left(sign.merchant_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.merchant has no row with that merchant_no.';
	END IF;
	-- a closed merchant's key is dead: it signs nothing more
	IF EXISTS (SELECT 1 FROM payidem.merchant m
				WHERE m.merchant_no OPERATOR(pg_catalog.=) s.merchant_no AND m.status OPERATOR(pg_catalog.=) 'closed') THEN
		RAISE EXCEPTION 'merchant % is closed', s.merchant_no USING
			ERRCODE = 'PI004',
			DETAIL = format('Merchant %s has status closed; its API secret no longer signs or verifies.', s.merchant_no);
	END IF;
	IF payload IS NULL THEN
		RAISE EXCEPTION 'payload to sign must not be NULL' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = 'payload was NULL.',
			HINT = 'Pass the exact text that will be sent, e.g. the JSON body.';
	END IF;
	RETURN payidem._hmac_sign(payidem._secret_aad(s.merchant_no, s.secret_version),
							  s.key_version, s.nonce, s.ciphertext, s.auth_tag, payload);
END
$$;
COMMENT ON FUNCTION payidem.sign(text, text) IS
	'HMAC-SHA256 (64 lowercase hex) of the payload under the merchant''s current API secret; PI004 for a closed merchant.';

-- Every secret of a merchant valid now: the current one and, within its
-- grace window, the previous one; none for a closed merchant.  What
-- verify_signature() accepts and a notification is signed with.
CREATE FUNCTION payidem._secrets_valid_now(p_merchant_no text)
RETURNS SETOF payidem.merchant_secret
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
	SELECT ms.* FROM payidem.merchant m
	  JOIN payidem.merchant_secret ms ON ms.merchant_no OPERATOR(pg_catalog.=) m.merchant_no
	 WHERE m.merchant_no OPERATOR(pg_catalog.=) p_merchant_no
	   AND m.status OPERATOR(pg_catalog.<>) 'closed'
	   AND ms.valid_from OPERATOR(pg_catalog.<=) pg_catalog.now()
	   AND (ms.valid_until IS NULL OR ms.valid_until OPERATOR(pg_catalog.>) pg_catalog.now())
$$;
COMMENT ON FUNCTION payidem._secrets_valid_now(text) IS
	'Internal: the merchant''s API secrets valid now (none if the merchant is closed).';

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
	FOR s IN
		SELECT v.* FROM payidem.merchant m, payidem._secrets_valid_now(m.merchant_no) v
		 WHERE m.api_key OPERATOR(pg_catalog.=) verify_signature.api_key
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
	'true if the signature is the HMAC-SHA256 of the payload under a secret of that api_key valid now (current, or previous within its grace window); false for a closed merchant.';

-- The one rule of a merchant's status: closed is final.  Raises PI002 if a
-- change would reopen a closed merchant (set_merchant_status, and the copy
-- of partition 0's merchants, import_reference); hint: what to do instead.
CREATE FUNCTION payidem._merchant_status_change(merchant_no text, from_status text, to_status text, hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF from_status = 'closed' AND to_status <> 'closed' THEN
		RAISE EXCEPTION 'merchant % is closed', merchant_no USING
			ERRCODE = 'PI002',
			DETAIL = format('merchant %L: ''closed'' -> %L is not allowed', merchant_no, to_status),
			HINT = hint;
	END IF;
END
$$;

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
	PERFORM payidem._merchant_status_change(m.merchant_no, m.status, status,
											'A closed merchant stays closed; create a new merchant instead.');
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

-- The same, from a file in payidem.secret_dir that the server reads itself
-- (src/crypto.c): the configuration is never a statement's text or
-- parameter, so no logging setting can capture it (docs/security.md).
CREATE FUNCTION payidem.load_channel_config(channel_no text, file_name text)
RETURNS void
AS 'MODULE_PATHNAME', 'payidem_load_channel_config'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.load_channel_config(text, text) IS
	'set_channel_config(channel_no, <the JSON object in payidem.secret_dir/file_name>), read by the server so that the keys never appear in a statement (and so in no log). The file: a plain file, chmod 600, owned by the server''s user.';

CREATE FUNCTION payidem.get_channel_config(channel_no text)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	cc payidem.channel_config;
BEGIN
	PERFORM payidem._require('channel_no', get_channel_config.channel_no);
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
	PERFORM payidem._require('merchant_no', unbind_channel.merchant_no);
	PERFORM payidem._require('channel_no', unbind_channel.channel_no);
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
	PERFORM payidem._require('merchant_no', route_channel.merchant_no);
	PERFORM payidem._require('channel_type', route_channel.channel_type);
	SELECT * INTO m FROM payidem.merchant x WHERE x.merchant_no OPERATOR(pg_catalog.=) route_channel.merchant_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'merchant % does not exist', coalesce(quote_literal(left(route_channel.merchant_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.merchant has no row with that merchant_no.';
	END IF;
	IF m.status <> 'active' THEN
		RAISE EXCEPTION 'merchant % is %', m.merchant_no, m.status USING
			ERRCODE = 'PI004',
			DETAIL = format('Merchant %s has status %s.', m.merchant_no, m.status),
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

-- Roles are kept by OID (regrole), not by name: a role dropped and created
-- again under the same name is a new role and inherits nothing.  pg_dump
-- writes regrole values as role names, so a restore maps them to the roles of
-- the target cluster (restore the roles first, as for any GRANT).
CREATE TABLE payidem.merchant_role (
	role		regrole		NOT NULL,
	merchant_no	text		NOT NULL,
	created_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT merchant_role_pkey PRIMARY KEY (role, merchant_no),
	CONSTRAINT merchant_role_merchant_fkey FOREIGN KEY (merchant_no)
		REFERENCES payidem.merchant (merchant_no)
);
COMMENT ON TABLE payidem.merchant_role IS
	'Reporting roles mapped to merchants: such a role reads only its merchants'' orders, payments, refunds and anomalies (row-level security). Managed with map_merchant_role()/unmap_merchant_role(); a role is kept by OID, so a new role with a dropped one''s name inherits nothing.';

CREATE TABLE payidem.auditor_role (
	role		regrole		NOT NULL,
	created_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT auditor_role_pkey PRIMARY KEY (role)
);
COMMENT ON TABLE payidem.auditor_role IS
	'Roles granted read access to all merchants'' rows (without secrets) by grant_auditor(), until revoke_auditor(); kept by OID.';

-- Used by the row-level security policies, which pass the querying role's
-- OID (the policy expression runs as that role; inside this SECURITY DEFINER
-- function CURRENT_USER would be the owner).  Runs as the extension's owner,
-- so the mapping tables need no grants.
-- (SECURITY DEFINER: it reads the mapping tables, which a mapped role may
-- not; and it answers only for a role the session can act as, so that no
-- role learns another's mappings by calling it with that role's name)
CREATE FUNCTION payidem._row_visible(p_merchant_no text, p_role regrole)
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN pg_catalog.pg_has_role(SESSION_USER, p_role, 'MEMBER')
	AND (EXISTS (SELECT 1 FROM payidem.auditor_role a WHERE a.role = p_role)
		 OR EXISTS (SELECT 1 FROM payidem.merchant_role r
					 WHERE r.role = p_role AND r.merchant_no = p_merchant_no));

-- Rows of roles that no longer exist (a role is dropped with DROP OWNED BY,
-- which revokes the grants but cannot see these rows): removed whenever a
-- mapping is changed, so that they are not left behind for good.
CREATE FUNCTION payidem._forget_dropped_roles()
RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	DELETE FROM payidem.auditor_role a
	 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles u WHERE u.oid = a.role::oid);
	DELETE FROM payidem.merchant_role r
	 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles u WHERE u.oid = r.role::oid);
END;

ALTER TABLE payidem."order" ENABLE ROW LEVEL SECURITY;
ALTER TABLE payidem.payment ENABLE ROW LEVEL SECURITY;
ALTER TABLE payidem.refund ENABLE ROW LEVEL SECURITY;
ALTER TABLE payidem.anomaly ENABLE ROW LEVEL SECURITY;
CREATE POLICY merchant_rows ON payidem."order" FOR SELECT
	USING (payidem._row_visible(merchant_no, (SELECT u.oid::regrole FROM pg_catalog.pg_roles u WHERE u.rolname = CURRENT_USER)));
CREATE POLICY merchant_rows ON payidem.payment FOR SELECT
	USING (payidem._row_visible(merchant_no, (SELECT u.oid::regrole FROM pg_catalog.pg_roles u WHERE u.rolname = CURRENT_USER)));
CREATE POLICY merchant_rows ON payidem.refund FOR SELECT
	USING (payidem._row_visible(merchant_no, (SELECT u.oid::regrole FROM pg_catalog.pg_roles u WHERE u.rolname = CURRENT_USER)));
CREATE POLICY merchant_rows ON payidem.anomaly FOR SELECT
	USING (payidem._row_visible((SELECT o.merchant_no FROM payidem."order" o WHERE o.order_no = anomaly.order_no),
								(SELECT u.oid::regrole FROM pg_catalog.pg_roles u WHERE u.rolname = CURRENT_USER)));

-- The role a grant function names: not NULL and existing (22023, 42704); to be
-- granted something (to_grant), also an ordinary role that row-level security
-- applies to, and not one of the predefined roles (22023).  Revoking and
-- unmapping take any role that exists, so that a grant can always be undone.
CREATE FUNCTION payidem._check_role(role regrole, to_grant boolean DEFAULT true)
RETURNS name
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	r pg_roles;
BEGIN
	IF role IS NULL THEN
		RAISE EXCEPTION 'role must not be null' USING
			ERRCODE = 'invalid_parameter_value',
			HINT = 'Name an existing role, e.g. ''shop_app''.';
	END IF;
	SELECT * INTO r FROM pg_catalog.pg_roles WHERE oid = role;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'role does not exist' USING
			ERRCODE = 'undefined_object',
			DETAIL = format('No role has OID %s (it was dropped).', role::oid);
	END IF;
	IF NOT to_grant THEN
		RETURN r.rolname;
	END IF;
	-- the predefined roles (pg_read_all_data, pg_database_owner, ...: the
	-- pg_ prefix is reserved to them) hold or pass on more than a grant here
	-- should give
	IF r.rolname ~ '^pg_' AND NOT (r.rolsuper OR r.rolbypassrls) THEN
		RAISE EXCEPTION 'role % is a predefined role', r.rolname USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = 'Predefined roles are shared by every database of the server, and some are members of others.',
			HINT = 'Create a role of its own for the application and name that one.';
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
						 'idem_claim', 'idem_record', 'idem_finish', '_idem_key_held',
						 'transit_order', 'transit_payment', 'transit_refund',
						 'sign', 'verify_signature', 'route_channel', 'get_channel_config',
						 'create_order', 'begin_payment', 'apply_payment_result', 'close_payment',
						 'close_order', 'refund', 'apply_refund_result', 'notify_due', 'notify_result',
						 'verify_notification', 'query_due',
						 'reconcile', 'resolve_diff', 'resolve_anomaly', 'get_order', 'find_order');
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
	EXECUTE format('GRANT EXECUTE ON FUNCTION payidem._row_visible(text, regrole) TO %I', v_role);
	EXECUTE format('GRANT SELECT ON payidem.merchant, payidem.channel, payidem.merchant_channel, '
				   'payidem."order", payidem.payment, payidem.refund, payidem.anomaly, payidem.status_log, '
				   'payidem.state, payidem.transition, payidem.channel_bill, payidem.recon_batch, '
				   'payidem.reconciliation, payidem.recon_summary, payidem.open_anomalies, '
				   'payidem.open_differences, payidem.notify_event, payidem.notification_backlog TO %I', v_role);
	PERFORM payidem._forget_dropped_roles();
	INSERT INTO payidem.auditor_role (role) VALUES (grant_auditor.role) ON CONFLICT DO NOTHING;
END
$$;
COMMENT ON FUNCTION payidem.grant_auditor(regrole) IS
	'Read-only access to every merchant''s business rows; never to merchant_secret, channel_config or idempotency results.';

CREATE FUNCTION payidem.revoke_auditor(role regrole)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_role name := payidem._check_role(role, to_grant => false);
BEGIN
	PERFORM payidem._forget_dropped_roles();
	DELETE FROM payidem.auditor_role a WHERE a.role = revoke_auditor.role;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'role % is not an auditor', role USING
			ERRCODE = 'PI009',
			HINT = 'payidem.auditor_role lists the roles grant_auditor() has made auditors.';
	END IF;
	-- what grant_auditor() granted, except what a merchant mapping still needs
	EXECUTE format('REVOKE SELECT ON payidem.merchant, payidem.channel, payidem.merchant_channel, '
				   'payidem.status_log, payidem.state, payidem.transition, payidem.channel_bill, '
				   'payidem.recon_batch, payidem.reconciliation, payidem.recon_summary, '
				   'payidem.open_differences, payidem.notify_event, payidem.notification_backlog FROM %I', v_role);
	IF NOT EXISTS (SELECT 1 FROM payidem.merchant_role r WHERE r.role = revoke_auditor.role) THEN
		EXECUTE format('REVOKE SELECT ON payidem."order", payidem.payment, payidem.refund, payidem.anomaly, '
					   'payidem.open_anomalies FROM %I', v_role);
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.revoke_auditor(regrole) IS
	'Undo grant_auditor(): the role no longer sees every merchant''s rows (a merchant mapping it has stays).';

CREATE FUNCTION payidem.map_merchant_role(role regrole, merchant_no text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_role name := payidem._check_role(role);
BEGIN
	PERFORM payidem._merchant_for_update(map_merchant_role.merchant_no);
	EXECUTE format('GRANT USAGE ON SCHEMA payidem TO %I', v_role);
	EXECUTE format('GRANT EXECUTE ON FUNCTION payidem._row_visible(text, regrole) TO %I', v_role);
	EXECUTE format('GRANT SELECT ON payidem."order", payidem.payment, payidem.refund, payidem.anomaly, '
				   'payidem.open_anomalies TO %I', v_role);
	PERFORM payidem._forget_dropped_roles();
	INSERT INTO payidem.merchant_role (role, merchant_no)
	VALUES (map_merchant_role.role, map_merchant_role.merchant_no) ON CONFLICT DO NOTHING;
END
$$;
COMMENT ON FUNCTION payidem.map_merchant_role(regrole, text) IS
	'Let a reporting role read the orders, payments, refunds and anomalies of one merchant (row-level security).';

CREATE FUNCTION payidem.unmap_merchant_role(role regrole, merchant_no text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._check_role(role, to_grant => false);
	PERFORM payidem._forget_dropped_roles();
	DELETE FROM payidem.merchant_role r
	 WHERE r.role = unmap_merchant_role.role AND r.merchant_no OPERATOR(pg_catalog.=) unmap_merchant_role.merchant_no;
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

-- Lock order, everywhere in this section: payment row(s) first, then the
-- order row, then refund rows.  begin_payment and close_order, which start from
-- an order, take the order's pending attempt first where they lock it.
-- All nine functions run as the extension owner (SECURITY DEFINER): an
-- application role needs only EXECUTE (grant_app); no table is granted.

-- What an anomaly row records of a channel's raw message: never a signature or key.
CREATE FUNCTION payidem._flow_raw(raw jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN raw IS NULL THEN NULL
			WHEN pg_catalog.jsonb_typeof(raw) OPERATOR(pg_catalog.=) 'object'
			THEN raw OPERATOR(pg_catalog.-) ARRAY['sign', 'signature', 'paySign', 'key', 'secret',
												  'api_secret', 'private_key', 'password', 'token']
			ELSE raw END;
COMMENT ON FUNCTION payidem._flow_raw(jsonb) IS
	'Internal: a channel message as recorded in anomaly.detail, without top-level signature/key/secret fields.';

CREATE FUNCTION payidem.create_order(merchant_no text, out_trade_no text, amount bigint, subject text,
	notify_url text DEFAULT NULL, return_url text DEFAULT NULL,
	expire_in interval DEFAULT '2 hours', body text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_merchant_no text := create_order.merchant_no;
	v_out_trade_no text := create_order.out_trade_no;
	v_amount bigint := create_order.amount;
	v_subject text := create_order.subject;
	v_status text;
	v_order_no text;
	o payidem."order";
BEGIN
	PERFORM payidem._require('merchant_no', create_order.merchant_no);
	IF v_amount IS NULL OR v_amount <= 0 THEN
		RAISE EXCEPTION 'invalid order amount' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The amount was %s; it must be a positive number of minor units (fen, cents).',
							coalesce(v_amount::text, 'NULL')),
			HINT = 'Pass 12.50 CNY as 1250.';
	END IF;
	IF v_subject IS NULL OR NOT payidem._fits(v_subject, 'payidem.order_subject') THEN
		RAISE EXCEPTION 'invalid order subject' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The subject was %s; it must have 1 to 256 characters (not only spaces).',
							coalesce(quote_literal(left(v_subject, 64)), 'NULL')),
			HINT = 'Describe what is being paid for, e.g. ''Green tea 250 g''.';
	END IF;
	IF v_out_trade_no IS NULL OR NOT payidem._fits(v_out_trade_no, 'payidem.merchant_ref') THEN
		PERFORM payidem._invalid_format('out_trade_no', v_out_trade_no, 'payidem.merchant_ref',
										'Use the merchant''s own order number, e.g. SHOP-20261129-0001.');
	END IF;
	PERFORM payidem._check_duration('invalid expiry', 'expire_in', expire_in, false,
									'The default is ''2 hours''.');
	IF NOT payidem._fits(notify_url, 'payidem.http_url') THEN
		PERFORM payidem._invalid_format('notify_url', notify_url, 'payidem.http_url',
										'Pass NULL for no merchant notification.');
	END IF;
	IF NOT payidem._fits(return_url, 'payidem.http_url') THEN
		PERFORM payidem._invalid_format('return_url', return_url, 'payidem.http_url', 'Pass NULL for none.');
	END IF;
	IF NOT payidem._fits(body, 'payidem.order_body') THEN
		RAISE EXCEPTION 'invalid order body' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The body has %s characters; at most 1024 are allowed.', length(body));
	END IF;

	SELECT m.status INTO v_status FROM payidem.merchant m WHERE m.merchant_no = v_merchant_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'merchant % does not exist', coalesce(quote_literal(left(v_merchant_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.merchant has no row with that merchant_no.';
	END IF;
	IF v_status <> 'active' THEN
		RAISE EXCEPTION 'merchant % is %', v_merchant_no, v_status USING
			ERRCODE = 'PI004',
			DETAIL = format('Merchant %s has status %s.', v_merchant_no, v_status),
			HINT = 'Only active merchants take orders.';
	END IF;

	-- the unique constraint decides between concurrent first calls; the loser
	-- waits for the winner's commit, then reads its row below
	INSERT INTO payidem."order" AS x (order_no, merchant_no, out_trade_no, subject, body, amount,
									  notify_url, return_url, expire_at)
	VALUES (payidem.gen_order_no('PO'), v_merchant_no, v_out_trade_no, v_subject, create_order.body, v_amount,
			create_order.notify_url, create_order.return_url, now() + expire_in)
	ON CONFLICT ON CONSTRAINT order_out_trade_no_key DO NOTHING
	RETURNING x.order_no INTO v_order_no;
	IF v_order_no IS NOT NULL THEN
		RETURN v_order_no;
	END IF;

	SELECT * INTO o FROM payidem."order" x
	 WHERE x.merchant_no = v_merchant_no AND x.out_trade_no = v_out_trade_no;
	IF NOT FOUND THEN	-- cannot happen: the conflicting row is committed and never deleted
		RAISE EXCEPTION 'order % of merchant % vanished', v_out_trade_no, v_merchant_no;
	END IF;
	IF o.amount <> v_amount THEN
		RAISE EXCEPTION 'out_trade_no % was already used with another amount', v_out_trade_no USING
			ERRCODE = 'PI001',
			DETAIL = format('Order %s of merchant %s (out_trade_no %s) has amount %s; this call asked for %s.',
							o.order_no, v_merchant_no, v_out_trade_no, o.amount, v_amount),
			HINT = 'A repeated create_order must carry the same amount and subject; use a new out_trade_no for a new order.';
	END IF;
	IF o.subject <> v_subject THEN
		RAISE EXCEPTION 'out_trade_no % was already used with another subject', v_out_trade_no USING
			ERRCODE = 'PI001',
			DETAIL = format('Order %s of merchant %s (out_trade_no %s) has subject %L; this call asked for %L.',
							o.order_no, v_merchant_no, v_out_trade_no, left(o.subject, 64), left(v_subject, 64)),
			HINT = 'A repeated create_order must carry the same amount and subject; use a new out_trade_no for a new order.';
	END IF;
	RETURN o.order_no;
END
$$;
COMMENT ON FUNCTION payidem.create_order(text, text, bigint, text, text, text, interval, text) IS
	'New pending order (order_no = gen_order_no(''PO'')). Idempotent on (merchant_no, out_trade_no): the same amount and subject return the existing order_no, others raise PI001. PI009 unknown merchant, PI004 merchant not active, 22023 bad input.';

-- REPEATABLE READ and the checks that read other sessions' rows after a lock:
-- under READ COMMITTED each statement sees what committed before it, so a sum
-- read after taking a row lock counts the rows of whoever held it; under
-- SERIALIZABLE a race ends in 40001.  A REPEATABLE READ snapshot would miss
-- them (two refunds above the paid amount, a daily limit passed, a pending
-- attempt left on a closed order): refused instead.
CREATE FUNCTION payidem._refuse_repeatable_read(fn text, reads text)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF current_setting('transaction_isolation') = 'repeatable read' THEN
		RAISE EXCEPTION '%() cannot run in a REPEATABLE READ transaction', fn USING
			ERRCODE = 'feature_not_supported',
			DETAIL = format('It checks %s after taking a row lock; a REPEATABLE READ snapshot does not show what other sessions committed meanwhile.', reads),
			HINT = 'Call it in READ COMMITTED (the default) or SERIALIZABLE (retry on SQLSTATE 40001).';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._refuse_repeatable_read(text, text) IS
	'Internal to begin_payment(), close_order() and refund(): raises 0A000 inside a REPEATABLE READ transaction.';

CREATE FUNCTION payidem.begin_payment(order_no text, channel_no text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_order_no text := begin_payment.order_no;
	v_channel_no text := begin_payment.channel_no;
	o payidem."order";
	m payidem.merchant;
	c payidem.channel;
	b payidem.merchant_channel;
	p payidem.payment;
	v_tz text;
	v_day_start timestamptz;
	v_used numeric;		-- a day's sum may pass the bigint range
	v_payment_no text;
BEGIN
	IF current_setting('transaction_isolation') = 'repeatable read' THEN
		PERFORM payidem._refuse_repeatable_read('begin_payment', 'the order''s pending attempt and the daily limit');
	END IF;
	PERFORM payidem._require('channel_no', begin_payment.channel_no);
	PERFORM payidem._check_number('order', begin_payment.order_no);
	SELECT * INTO o FROM payidem."order" x WHERE x.order_no = v_order_no FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'order % does not exist', coalesce(quote_literal(left(v_order_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem."order" has no row with that order_no.';
	END IF;
	IF o.status <> 'pending' THEN
		RAISE EXCEPTION 'order % cannot take a payment', o.order_no USING
			ERRCODE = 'PI002',
			DETAIL = format('Order %s is %s; only a pending order takes a payment.', o.order_no, o.status),
			HINT = CASE WHEN o.status = 'closed' THEN 'Create a new order (with a new out_trade_no).'
						ELSE 'The order is already paid.' END;
	END IF;
	IF o.expire_at <= now() THEN
		RAISE EXCEPTION 'order % has expired', o.order_no USING
			ERRCODE = 'PI008',
			DETAIL = format('Order %s expired at %s.', o.order_no, o.expire_at),
			HINT = 'Close it with payidem.close_order() and create a new order.';
	END IF;

	SELECT * INTO m FROM payidem.merchant x WHERE x.merchant_no = o.merchant_no;
	IF m.status <> 'active' THEN
		RAISE EXCEPTION 'merchant % is %', m.merchant_no, m.status USING
			ERRCODE = 'PI004',
			DETAIL = format('Merchant %s has status %s.', m.merchant_no, m.status),
			HINT = 'Only active merchants take payments.';
	END IF;
	SELECT * INTO c FROM payidem.channel x WHERE x.channel_no = v_channel_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'channel % does not exist', coalesce(quote_literal(left(v_channel_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.channel has no row with that channel_no.';
	END IF;
	IF c.status <> 'active' THEN
		RAISE EXCEPTION 'channel % is %', c.channel_no, c.status USING
			ERRCODE = 'PI004',
			DETAIL = format('Channel %s has status %s.', c.channel_no, c.status),
			HINT = 'Route the payment to an active channel (payidem.route_channel()).';
	END IF;
	SELECT * INTO b FROM payidem.merchant_channel x
	 WHERE x.merchant_no = m.merchant_no AND x.channel_no = c.channel_no;
	IF NOT FOUND OR b.status <> 'active' THEN
		RAISE EXCEPTION 'merchant % is not bound to channel %', m.merchant_no, c.channel_no USING
			ERRCODE = 'PI004',
			DETAIL = CASE WHEN FOUND THEN format('The binding is %s.', b.status) ELSE 'There is no binding.' END,
			HINT = 'Bind the channel with payidem.bind_channel().';
	END IF;
	IF c.allowed_merchant_types IS NOT NULL AND NOT m.merchant_type = ANY (c.allowed_merchant_types) THEN
		RAISE EXCEPTION 'channel % does not admit merchants of type %', c.channel_no, m.merchant_type USING
			ERRCODE = 'PI004',
			DETAIL = format('Channel %s admits %s; merchant %s is %s.', c.channel_no,
							array_to_string(c.allowed_merchant_types, ', '), m.merchant_no, m.merchant_type);
	END IF;

	-- at most one pending attempt per order (we hold the order's lock, so
	-- this read is stable; the partial unique index is the final guard)
	SELECT * INTO p FROM payidem.payment x WHERE x.order_no = o.order_no AND x.status = 'pending';
	IF FOUND THEN
		IF p.channel_no = c.channel_no THEN
			RETURN p.payment_no;			-- a retried call: the same attempt
		END IF;
		RAISE EXCEPTION 'order % has a payment in progress on channel %', o.order_no, p.channel_no USING
			ERRCODE = 'PI003',
			DETAIL = format('Payment %s of order %s is pending on channel %s; this call asked for channel %s.',
							p.payment_no, o.order_no, p.channel_no, c.channel_no),
			HINT = format('Query channel %s, then close payment %s with payidem.close_payment() before starting another.',
						  p.channel_no, p.payment_no);
	END IF;

	IF o.amount > b.single_limit OR o.amount > c.single_limit THEN
		RAISE EXCEPTION 'amount exceeds the single-payment limit' USING
			ERRCODE = 'PI007',
			DETAIL = format('Order %s is for %s; the single limit is %s for merchant %s on channel %s and %s for the channel.',
							o.order_no, o.amount, coalesce(b.single_limit::text, 'none'), m.merchant_no,
							c.channel_no, coalesce(c.single_limit::text, 'none')),
			HINT = 'Use another channel, or raise the limit with payidem.bind_channel().';
	END IF;
	IF b.daily_limit IS NOT NULL OR c.daily_limit IS NOT NULL THEN
		-- serialize the day's sum of this merchant on this channel
		PERFORM 1 FROM payidem.merchant_channel x
		 WHERE x.merchant_no = m.merchant_no AND x.channel_no = c.channel_no FOR UPDATE;
		v_tz := coalesce(nullif(current_setting('payidem.limit_timezone', true), ''), 'UTC');
		v_day_start := date_trunc('day', now() AT TIME ZONE v_tz) AT TIME ZONE v_tz;
		SELECT coalesce(sum(x.amount), 0) INTO v_used FROM payidem.payment x
		 WHERE x.merchant_no = m.merchant_no AND x.channel_no = c.channel_no
		   AND x.created_at >= v_day_start
		   AND (x.status = 'pending' OR x.status = ANY (payidem._paid_payment_statuses()));
		IF v_used + o.amount > b.daily_limit OR v_used + o.amount > c.daily_limit THEN
			RAISE EXCEPTION 'amount exceeds the daily limit' USING
				ERRCODE = 'PI007',
				DETAIL = format('Merchant %s has %s pending or paid on channel %s today (%s); with %s more the daily limit (merchant %s, channel %s) would be exceeded.',
								m.merchant_no, v_used, c.channel_no, v_tz, o.amount,
								coalesce(b.daily_limit::text, 'none'), coalesce(c.daily_limit::text, 'none')),
				HINT = 'Use another channel, or try again tomorrow.';
		END IF;
	END IF;

	v_payment_no := payidem.gen_order_no('PY');
	INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)
	VALUES (v_payment_no, o.order_no, m.merchant_no, c.channel_no, o.amount);
	RETURN v_payment_no;
END
$$;
COMMENT ON FUNCTION payidem.begin_payment(text, text) IS
	'Start (or, on the same channel, return again) the pending payment attempt of an order; payment_no = gen_order_no(''PY''). PI009, PI002 (order not pending), PI008 (expired), PI004 (merchant/channel/binding/type), PI003 (pending on another channel), PI007 (limits).';

-- The argument checks of apply_payment_result(), run only when its one-expression
-- test finds something wrong: each raises its own error.
CREATE FUNCTION payidem._check_payment_result_args(payment_no text, source text, status text,
	transaction_id text, amount bigint, paid_at timestamptz)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF payment_no IS NULL OR left(payment_no, 2) <> 'PY' OR NOT payidem.order_no_valid(payment_no) THEN
		PERFORM payidem._check_number('payment', payment_no);
	END IF;
	IF source IS NULL OR source NOT IN ('callback', 'query', 'close') THEN
		RAISE EXCEPTION 'invalid result source' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The source was %s; it must be callback, query or close.',
							coalesce(quote_literal(left(source, 64)), 'NULL'));
	END IF;
	IF status IS NULL OR status NOT IN ('succeeded', 'failed', 'closed') THEN
		RAISE EXCEPTION 'invalid payment result status' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The status was %s; it must be succeeded, failed or closed.',
							coalesce(quote_literal(left(status, 64)), 'NULL'));
	END IF;
	IF amount IS NOT NULL AND amount <= 0 THEN
		RAISE EXCEPTION 'invalid reported amount' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The amount was %s; it must be positive.', amount),
			HINT = 'Pass the amount the channel reports, in minor units.';
	END IF;
	IF NOT payidem._fits(transaction_id, 'payidem.channel_ref') THEN
		PERFORM payidem._invalid_format('transaction_id', transaction_id, 'payidem.channel_ref');
	END IF;
	IF NOT isfinite(paid_at) THEN
		RAISE EXCEPTION 'invalid paid_at' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The value was %s; it must be a real point in time, or NULL for now.', paid_at),
			HINT = 'Pass the time the channel reports the payment was made.';
	END IF;
	IF status = 'succeeded' AND (transaction_id IS NULL OR amount IS NULL) THEN
		RAISE EXCEPTION 'a success must carry the channel''s transaction id and amount' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('Payment %s: transaction_id was %s and amount was %s.', payment_no,
							coalesce(quote_literal(transaction_id), 'NULL'), coalesce(amount::text, 'NULL')),
			HINT = 'Pass both as the channel reported them: a success without them can be neither reconciled nor refunded.';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._check_payment_result_args(text, text, text, text, bigint, timestamptz) IS
	'Internal to apply_payment_result(): raises the error (22023, or PI009/22023 from _check_number) for the first invalid argument.';

-- The two writes of a first success, as direct executor updates of the rows
-- apply_payment_result() holds locked (src/flow.c): triggers, constraints,
-- domains and indexes as for an UPDATE, without its per-statement work.
CREATE FUNCTION payidem._record_payment_success(payment_row tid, payment_no text,
	transaction_id payidem.channel_ref, paid_at timestamptz, fee_amount bigint, cost_amount bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_record_payment_success'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._record_payment_success(tid, text, payidem.channel_ref, timestamptz, bigint, bigint) IS
	'Internal to apply_payment_result(): the payment at payment_row (locked by the caller, key payment_no) becomes succeeded with paid_at, the fees and, unless NULL, transaction_id. False (nothing done) if the table has statement-level UPDATE triggers, transition tables, rules or row-level security that applies to the caller, or the caller may not update it: the caller then runs the UPDATE in SQL.';
CREATE FUNCTION payidem._record_order_paid(order_row tid, order_no text,
	paid_payment_no payidem.payment_number, paid_at timestamptz)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_record_order_paid'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._record_order_paid(tid, text, payidem.payment_number, timestamptz) IS
	'Internal to apply_payment_result(): the order at order_row (locked by the caller, key order_no) becomes paid by paid_payment_no at paid_at (its order.paid event is written by the status_notify trigger). False (nothing done) as for _record_payment_success().';

-- The fee of an amount at a rate, exact and rounded half-up (src/flow.c: the
-- one place a fee is computed, which the C path of apply_payment_result()
-- uses too).
CREATE FUNCTION payidem._fee(amount bigint, rate numeric)
RETURNS bigint
AS 'MODULE_PATHNAME', 'payidem_fee'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem._fee(bigint, numeric) IS
	'Internal: amount * rate in minor units, rounded half-up (exact numeric arithmetic).';

-- The transaction-level lock two deliveries of one channel transaction id
-- for two payments take (src/flow.c, where its key is made for both paths).
CREATE FUNCTION payidem._lock_transaction_id(channel_no text, transaction_id text, wait boolean)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_lock_transaction_id'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._lock_transaction_id(text, text, boolean) IS
	'Internal to apply_payment_result(): take the transaction-level lock on channel_no''s transaction_id; without waiting, false if another transaction holds it.';

-- The one rule for a reported paid_at (src/flow.c, payidem.max_clock_skew),
-- which the C path of apply_payment_result() applies too.
CREATE FUNCTION payidem._check_paid_at(payment_no text, created_at timestamptz, paid_at timestamptz)
RETURNS void
AS 'MODULE_PATHNAME', 'payidem_check_paid_at'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._check_paid_at(text, timestamptz, timestamptz) IS
	'Internal to apply_payment_result(): 22023 unless paid_at lies between the attempt''s creation and now, each widened by payidem.max_clock_skew.';
CREATE FUNCTION payidem._paid_at_ok(created_at timestamptz, paid_at timestamptz)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_paid_at_ok'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem._paid_at_ok(timestamptz, timestamptz) IS
	'Internal to apply_payment_result(): the rule of _check_paid_at(), as a test.';

-- The contract of apply_payment_result() in full.  apply_payment_result()
-- itself (src/flow.c) decides a repeated success and the first success of a
-- pending payment of a pending order, and passes every other call here
-- unchanged.
CREATE FUNCTION payidem._apply_payment_result(payment_no text, source text, status text,
	transaction_id text, amount bigint, paid_at timestamptz, raw jsonb)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	-- aliases, not copies: a copy is an expression, set up again in every
	-- transaction
	v_payment_no ALIAS FOR $1;
	v_source ALIAS FOR $2;
	v_status ALIAS FOR $3;
	v_txn ALIAS FOR $4;
	v_amount ALIAS FOR $5;
	v_paid_at timestamptz;
	v_outcome text;
	v_other text;
	v_kind text;
	v_rate numeric;
	v_cost_rate numeric;
	v_order_status text;
	v_order_paid_by text;
	v_order_row tid;
	p record;					-- the payment's columns this function reads
BEGIN
	-- A repeated success of a payment that already succeeded (the same amount
	-- and transaction id) is answered from the committed row, without a
	-- lock: from succeeded, a payment only moves on to refunded states,
	-- which answer a success the same way.  Such a repeat's arguments are
	-- valid: the row vouches for all but the source and paid_at, which are
	-- checked here.
	IF v_status = 'succeeded' AND v_source IN ('callback', 'query', 'close') THEN
		SELECT x.status, x.amount, x.transaction_id, x.created_at INTO p
		  FROM payidem.payment x WHERE x.payment_no = v_payment_no;
		IF FOUND AND p.status = ANY (payidem._paid_payment_statuses())
			AND v_amount = p.amount AND v_txn = p.transaction_id
			AND (_apply_payment_result.paid_at IS NULL OR payidem._paid_at_ok(p.created_at, _apply_payment_result.paid_at)) THEN
			RETURN 'duplicate';
		END IF;
	END IF;

	-- The arguments: valid ones pass one expression; the checks of
	-- _check_payment_result_args() word the error.
	IF v_payment_no IS NULL OR left(v_payment_no, 2) <> 'PY' OR NOT payidem.order_no_valid(v_payment_no)
		OR v_source IS NULL OR v_source NOT IN ('callback', 'query', 'close')
		OR v_status IS NULL OR v_status NOT IN ('succeeded', 'failed', 'closed')
		OR (v_status = 'succeeded' AND (v_txn IS NULL OR v_amount IS NULL))
		OR v_amount <= 0 OR NOT payidem._fits(v_txn, 'payidem.channel_ref')
		OR NOT isfinite(_apply_payment_result.paid_at) THEN
		PERFORM payidem._check_payment_result_args(v_payment_no, v_source, v_status, v_txn, v_amount,
												   _apply_payment_result.paid_at);
	END IF;

	SELECT x.order_no INTO v_other FROM payidem.payment x WHERE x.payment_no = v_payment_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'payment % does not exist', coalesce(quote_literal(left(v_payment_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.payment has no row with that payment_no.';
	END IF;
	-- The lock order of every flow function (docs/payment-flow.md): the
	-- order, then its payment.  Only a success changes the order; a failure
	-- or close report locks the payment alone.  FOR NO KEY UPDATE, as an
	-- UPDATE that keeps the key locks: the KEY SHARE locks that inserts of
	-- payments, refunds and anomalies take on their order and payment
	-- through the foreign keys do not wait for it (a FOR UPDATE lock would
	-- make refund(), which holds the payment, wait for the order).
	IF v_status = 'succeeded' THEN
		-- the order, locked (its number never changes), and the rates of the fees
		SELECT x.ctid, x.status, x.paid_payment_no, coalesce(b.fee_rate, m.fee_rate), c.fee_rate
		  INTO v_order_row, v_order_status, v_order_paid_by, v_rate, v_cost_rate
		  FROM payidem."order" x
		  JOIN payidem.merchant m ON m.merchant_no = x.merchant_no
		  JOIN payidem.payment y ON y.payment_no = v_payment_no
		  JOIN payidem.channel c ON c.channel_no = y.channel_no
		  LEFT JOIN payidem.merchant_channel b ON b.merchant_no = m.merchant_no AND b.channel_no = c.channel_no
		 WHERE x.order_no = v_other
		   FOR NO KEY UPDATE OF x;
	END IF;
	SELECT x.ctid, x.payment_no, x.order_no, x.channel_no, x.amount, x.status, x.transaction_id,
		   x.created_at INTO p
	  FROM payidem.payment x WHERE x.payment_no = v_payment_no FOR NO KEY UPDATE;

	IF v_status = 'succeeded' THEN
		v_paid_at := coalesce(_apply_payment_result.paid_at, now());
		IF _apply_payment_result.paid_at IS NOT NULL THEN
			PERFORM payidem._check_paid_at(p.payment_no, p.created_at, v_paid_at);
		END IF;
		IF p.status = ANY (payidem._paid_payment_statuses()) THEN
			IF v_amount = p.amount AND v_txn = p.transaction_id THEN
				RETURN 'duplicate';		-- applied meanwhile, by the delivery we waited for
			END IF;
			v_kind := 'conflicting_result';		-- another transaction id or amount: a second charge?
		END IF;
		IF v_kind IS NOT NULL THEN
			-- decided above
		ELSIF v_amount <> p.amount THEN
			v_kind := 'amount_mismatch';
		ELSIF v_txn IS DISTINCT FROM p.transaction_id THEN
			-- (a transaction id the payment already has is no other's: unique)
			-- two deliveries carrying one transaction id for two payments:
			-- the second waits until the first commits, then (READ
			-- COMMITTED: a new snapshot per statement) finds its row below.
			-- The C path of apply_payment_result() takes the same lock.
			IF NOT payidem._lock_transaction_id(p.channel_no, v_txn, false) THEN
				PERFORM payidem._lock_transaction_id(p.channel_no, v_txn, true);
				IF current_setting('transaction_isolation') <> 'read committed' THEN
					RAISE EXCEPTION 'transaction id % is being applied to another payment at the same time', quote_literal(v_txn) USING
						ERRCODE = 'serialization_failure',
						DETAIL = format('Payment %s waited for another delivery of %s on channel %s; this transaction''s snapshot cannot see its outcome.',
										p.payment_no, quote_literal(v_txn), p.channel_no),
						HINT = 'Retry the transaction, or apply results in READ COMMITTED.';
				END IF;
			END IF;
			SELECT x.payment_no INTO v_other FROM payidem.payment_paid x
			 WHERE x.channel_no = p.channel_no AND x.transaction_id = v_txn AND x.payment_no <> p.payment_no;
			IF FOUND THEN
				v_kind := 'transaction_conflict';
			END IF;
		END IF;
	ELSIF p.status = ANY (payidem._paid_payment_statuses()) THEN
		-- the channel's word of success stands; a later failure/close report
		-- contradicts it
		v_kind := 'conflicting_result';
	ELSIF p.status = v_status THEN
		RETURN 'duplicate';
	ELSIF p.status IN ('failed', 'closed') THEN
		-- a failed attempt is not closed (nor a closed one failed) afterwards
		RETURN 'rejected';
	END IF;

	-- A refusal changes nothing but one anomaly row, and a repeat of the
	-- same refusal adds none.
	IF v_kind IS NOT NULL THEN
		IF NOT EXISTS (SELECT 1 FROM payidem.anomaly a
						WHERE a.payment_no = p.payment_no AND a.kind = v_kind AND a.handle_status = 'open'
						  AND a.detail @> jsonb_build_object('reported_status', v_status,
															 'reported_amount', v_amount,
															 'transaction_id', v_txn)) THEN
			INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail)
			VALUES (v_kind, p.order_no, p.payment_no, p.channel_no, coalesce(v_amount, p.amount),
					jsonb_build_object('reported_status', v_status, 'reported_amount', v_amount,
									   'transaction_id', v_txn, 'source', v_source,
									   'payment_status', p.status, 'payment_amount', p.amount,
									   'payment_transaction_id', p.transaction_id,
									   'other_payment_no', CASE WHEN v_kind = 'transaction_conflict' THEN v_other END,
									   'raw', payidem._flow_raw(raw)));
		END IF;
		RETURN 'rejected';
	END IF;

	IF v_status <> 'succeeded' THEN
		-- failed or closed of a pending payment
		PERFORM payidem.transit_payment(p.payment_no, v_status);
		RETURN 'applied';
	END IF;

	-- pending, closed or failed -> succeeded: the channel's word wins.  It
	-- pays the order if the order is still pending; otherwise money arrived
	-- where it should not, and an anomaly asks for its refund.
	-- The status and the fields in one update of the row we hold locked
	-- (then the order's): the status_guard trigger checks each change
	-- against the whitelist and logs it, exactly as for transit_payment();
	-- one new row version each.  A direct update (src/flow.c) unless the
	-- table has statement triggers, rules or row security that applies:
	-- then the same UPDATE in SQL.
	v_outcome := CASE WHEN v_order_status = 'pending' THEN 'applied' ELSE 'anomaly' END;
	IF NOT payidem._record_payment_success(p.ctid, p.payment_no, v_txn, v_paid_at,
											payidem._fee(p.amount, v_rate),
											payidem._fee(p.amount, v_cost_rate)) THEN
		UPDATE payidem.payment x
		   SET status = 'succeeded', updated_at = now(),
			   transaction_id = v_txn, paid_at = v_paid_at,
			   fee_amount = payidem._fee(p.amount, v_rate),
			   cost_amount = payidem._fee(p.amount, v_cost_rate)
		 WHERE x.payment_no = p.payment_no;
	END IF;
	IF v_order_status = 'pending' THEN
		IF NOT payidem._record_order_paid(v_order_row, p.order_no, p.payment_no, v_paid_at) THEN
			UPDATE payidem."order" x
			   SET status = 'paid', updated_at = now(),
				   paid_payment_no = p.payment_no, paid_at = v_paid_at
			 WHERE x.order_no = p.order_no;
		END IF;
	ELSE
		v_kind := CASE WHEN v_order_status = 'closed' THEN 'paid_after_close' ELSE 'duplicate_payment' END;
		INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail)
		VALUES (v_kind, p.order_no, p.payment_no, p.channel_no, p.amount,
				jsonb_build_object('transaction_id', v_txn, 'source', v_source, 'paid_at', v_paid_at,
								   'payment_status_before', p.status,
								   'order_status', v_order_status, 'paid_payment_no', v_order_paid_by,
								   'action', 'refund this payment with payidem.refund()',
								   'raw', payidem._flow_raw(raw)));
	END IF;
	RETURN v_outcome;
END
$$;
COMMENT ON FUNCTION payidem._apply_payment_result(text, text, text, text, bigint, timestamptz, jsonb) IS
	'Internal to apply_payment_result(): the whole contract in PL/pgSQL, for every call apply_payment_result() does not decide itself.';

CREATE FUNCTION payidem.apply_payment_result(payment_no text, source text, status text,
	transaction_id text DEFAULT NULL, amount bigint DEFAULT NULL,
	paid_at timestamptz DEFAULT NULL, raw jsonb DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_apply_payment_result'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION payidem.apply_payment_result(text, text, text, text, bigint, timestamptz, jsonb) IS
	'Apply a channel''s word on a payment (source callback|query|close; status succeeded|failed|closed; a success needs its transaction_id and amount, a paid_at within the attempt''s lifetime) exactly once per payment and status. Returns applied, duplicate, anomaly (a late success of a closed or failed payment whose order is closed or paid otherwise: paid_after_close, duplicate_payment; the payment is recorded succeeded and refund() takes it) or rejected (amount_mismatch, transaction_conflict, conflicting_result: nothing changes but an anomaly row).';

CREATE FUNCTION payidem.close_payment(payment_no text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_outcome text;
	v_status text;
BEGIN
	PERFORM payidem._check_number('payment', close_payment.payment_no);
	v_outcome := payidem.apply_payment_result(close_payment.payment_no, 'close', 'closed');
	IF v_outcome = 'applied' THEN
		RETURN true;
	ELSIF v_outcome = 'duplicate' THEN
		RETURN false;
	END IF;
	SELECT x.status INTO v_status FROM payidem.payment x WHERE x.payment_no = close_payment.payment_no;
	RAISE EXCEPTION 'payment % cannot be closed', close_payment.payment_no USING
		ERRCODE = 'PI002',
		DETAIL = format('Payment %s is %s; only a pending payment can be closed.', close_payment.payment_no, v_status),
		HINT = CASE WHEN v_status = 'failed' THEN 'A failed payment needs no closing.'
					ELSE 'The payment succeeded: refund it with payidem.refund() instead.' END;
END
$$;
COMMENT ON FUNCTION payidem.close_payment(text) IS
	'Close a pending payment attempt (after the channel confirmed it is closed): true = closed now, false = already closed; PI002 if it succeeded or failed, PI009 if unknown.';

CREATE FUNCTION payidem.close_order(order_no text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_order_no text := close_order.order_no;
	v_pending text;
	o payidem."order";
BEGIN
	IF current_setting('transaction_isolation') = 'repeatable read' THEN
		PERFORM payidem._refuse_repeatable_read('close_order', 'for a pending attempt of the order');
	END IF;
	PERFORM payidem._check_number('order', close_order.order_no);
	-- the lock order of every flow function: the order, then its payments
	-- (an attempt begin_payment() is committing is seen once the order's
	-- lock is ours: it held that lock)
	SELECT * INTO o FROM payidem."order" x WHERE x.order_no = v_order_no FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'order % does not exist', coalesce(quote_literal(left(v_order_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem."order" has no row with that order_no.';
	END IF;
	IF o.status = 'closed' THEN
		RETURN false;
	ELSIF o.status <> 'pending' THEN
		RAISE EXCEPTION 'order % cannot be closed', o.order_no USING
			ERRCODE = 'PI002',
			DETAIL = format('Order %s is %s; only a pending order can be closed.', o.order_no, o.status),
			HINT = 'A paid order is refunded, not closed: see payidem.refund().';
	END IF;
	-- with the order locked no new attempt can start; close the pending one
	SELECT x.payment_no INTO v_pending FROM payidem.payment x
	 WHERE x.order_no = o.order_no AND x.status = 'pending';
	IF v_pending IS NOT NULL THEN
		PERFORM payidem.apply_payment_result(v_pending, 'close', 'closed');
	END IF;
	PERFORM payidem.transit_order(o.order_no, 'closed');
	RETURN true;
END
$$;
COMMENT ON FUNCTION payidem.close_order(text) IS
	'Close a pending order and its pending payment attempt (query and close it at the channel first): true = closed now, false = already closed; PI002 if paid or refunded, PI009 if unknown. A success arriving later is recorded as anomaly paid_after_close.';

-- The payment's keys (payidem.payment_pending, payidem.payment_paid): its
-- trigger, on every write of a payment (src/flow.c: in C, it returns at once
-- unless the payment became or stopped being pending, or its channel,
-- transaction id or paid_at changed; the keys are written as their owner,
-- whoever writes the payment).  status_keys fires after status_guard, so a
-- change the whitelist refuses is reported as that first.  ENABLE ALWAYS:
-- also in session_replication_role = replica (a restore or a replication
-- apply loading payments), where the other triggers stand aside; only a
-- DISABLE TRIGGER leaves the keys behind (rebuild_payment_keys(), below).
CREATE FUNCTION payidem._payment_keys()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_payment_keys'
LANGUAGE C;
COMMENT ON FUNCTION payidem._payment_keys() IS
	'Trigger status_keys on payidem.payment: its pending attempt per order and its transaction id and paid_at per channel into payidem.payment_pending and payidem.payment_paid.';
CREATE TRIGGER status_keys
	AFTER INSERT OR UPDATE OR DELETE ON payidem.payment
	FOR EACH ROW EXECUTE FUNCTION payidem._payment_keys();
ALTER TABLE payidem.payment ENABLE ALWAYS TRIGGER status_keys;
CREATE FUNCTION payidem._payment_keys_truncate()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	TRUNCATE payidem.payment_pending, payidem.payment_paid;
	RETURN NULL;
END
$$;
COMMENT ON FUNCTION payidem._payment_keys_truncate() IS
	'Trigger status_keys_truncate on payidem.payment: a TRUNCATE of the payments empties their keys too.';
CREATE TRIGGER status_keys_truncate
	AFTER TRUNCATE ON payidem.payment
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._payment_keys_truncate();
ALTER TABLE payidem.payment ENABLE ALWAYS TRIGGER status_keys_truncate;

-- The keys made again from the payments: after payments were written with
-- the triggers off (session_replication_role = replica, DISABLE TRIGGER);
-- how many rows they hold.  Refused (23505, naming the constraint) if the
-- payments break a rule the keys carry: two pending attempts of one order,
-- one transaction id on two payments of a channel.
CREATE FUNCTION payidem._payment_keys_fill()
RETURNS bigint
AS 'MODULE_PATHNAME', 'payidem_payment_keys_fill'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION payidem._payment_keys_fill() IS
	'Internal (rebuild_payment_keys): the keys of every payment, as trigger status_keys makes them, into the emptied payidem.payment_pending and payidem.payment_paid; how many rows.';
CREATE FUNCTION payidem.rebuild_payment_keys()
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	LOCK TABLE payidem.payment IN SHARE MODE;
	DELETE FROM payidem.payment_pending;
	DELETE FROM payidem.payment_paid;
	RETURN payidem._payment_keys_fill();
END
$$;
COMMENT ON FUNCTION payidem.rebuild_payment_keys() IS
	'Make payidem.payment_pending and payidem.payment_paid again from the payments (after payments were written with the triggers off); how many rows they hold. Reads every payment under a SHARE lock.';

-- The expiry queue (payidem.order_expiry): its trigger, on every insert of an
-- order and every change of an order's status or expire_at (src/housekeeping.c:
-- in C, it returns at once unless the order is pending with a time not yet
-- queued; the queue is written as the table's owner, whoever writes the order).
CREATE FUNCTION payidem._queue_expiry()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_queue_expiry'
LANGUAGE C;
COMMENT ON FUNCTION payidem._queue_expiry() IS
	'Trigger order_expiry_queue on payidem."order": a pending order''s expire_at into payidem.order_expiry.';
-- (every UPDATE, not UPDATE OF status, expire_at: a BEFORE trigger may change
-- either without the statement naming it)
CREATE TRIGGER order_expiry_queue
	AFTER INSERT OR UPDATE ON payidem."order"
	FOR EACH ROW EXECUTE FUNCTION payidem._queue_expiry();

-- The queue made again from the orders: for pending orders written with the
-- triggers off (session_replication_role = replica, DISABLE TRIGGER), which
-- add no row; how many rows it added.
CREATE FUNCTION payidem.rebuild_expiry_queue()
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
	WITH added AS (
		INSERT INTO payidem.order_expiry (expire_at, order_no)
		SELECT x.expire_at, x.order_no FROM payidem."order" x WHERE x.status = 'pending'
		ON CONFLICT ON CONSTRAINT order_expiry_pkey DO NOTHING
		RETURNING 1)
	SELECT count(*) FROM added
$$;
COMMENT ON FUNCTION payidem.rebuild_expiry_queue() IS
	'Queue the expiry of every pending order not queued at its expire_at (after pending orders were written with the triggers off); how many rows were added. Reads every order.';

-- Housekeeping (the background worker, src/housekeeping.c): a run first
-- removes from the queue, in batches, the rows whose time has passed and
-- whose order is no longer pending at that time (locking those orders FOR
-- SHARE SKIP LOCKED, so an order a transaction is changing is looked at
-- again next time, and one made pending again meanwhile keeps its row);
-- then reads the expired orders once and closes each in a transaction of
-- its own, so it never holds more than one order's lock, a failure on one
-- order stops only that one, and no call scans again what the ones before
-- it passed.
CREATE FUNCTION payidem._prune_expiry_queue(max_rows integer)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
	WITH done AS (
		SELECT q.expire_at, q.order_no
		  FROM payidem.order_expiry q JOIN payidem."order" x ON x.order_no = q.order_no
		 WHERE q.expire_at <= now() AND (x.status <> 'pending' OR x.expire_at <> q.expire_at)
		 ORDER BY q.expire_at, q.order_no
		 LIMIT max_rows
		   FOR SHARE OF x SKIP LOCKED),
	gone AS (
		DELETE FROM payidem.order_expiry q USING done d
		 WHERE q.expire_at = d.expire_at AND q.order_no = d.order_no
		RETURNING 1),
	-- rows whose order does not exist (only a writer of the queue itself
	-- could make one)
	orphans AS (
		DELETE FROM payidem.order_expiry q
		 WHERE q.expire_at <= now()
		   AND NOT EXISTS (SELECT 1 FROM payidem."order" x WHERE x.order_no = q.order_no)
		RETURNING 1)
	SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM orphans)
$$;
COMMENT ON FUNCTION payidem._prune_expiry_queue(integer) IS
	'Internal (housekeeping): remove up to max_rows rows of payidem.order_expiry past their time whose order is no longer pending at it; how many were removed.';

CREATE FUNCTION payidem._expired_orders(max_rows integer)
RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
	SELECT x.order_no::text
	  FROM payidem.order_expiry q JOIN payidem."order" x ON x.order_no = q.order_no
	 WHERE q.expire_at <= now() AND x.status = 'pending' AND x.expire_at = q.expire_at
	   AND NOT EXISTS (SELECT 1 FROM payidem.payment p
						WHERE p.order_no = x.order_no AND p.status = 'pending')
	 ORDER BY q.expire_at, q.order_no
	 LIMIT max_rows
$$;
COMMENT ON FUNCTION payidem._expired_orders(integer) IS
	'Internal (housekeeping): up to max_rows orders past expire_at with no pending attempt, oldest expiry first; no lock taken.';

-- Close one of them as close_order() closes it, if it still is one: its lock
-- is taken with SKIP LOCKED (an order a payment call holds is left for the
-- next run), and its attempts are read once the lock is ours (an attempt
-- begin_payment() committed meanwhile is the channel's to decide).  true:
-- closed now.
CREATE FUNCTION payidem._close_expired_order(order_no text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_order_no text;
BEGIN
	SELECT x.order_no INTO v_order_no FROM payidem."order" x
	 WHERE x.order_no = _close_expired_order.order_no AND x.status = 'pending' AND x.expire_at <= now()
	   FOR NO KEY UPDATE SKIP LOCKED;
	IF v_order_no IS NULL
	   OR EXISTS (SELECT 1 FROM payidem.payment p WHERE p.order_no = v_order_no AND p.status = 'pending') THEN
		RETURN false;
	END IF;
	RETURN payidem.close_order(v_order_no);
END
$$;
COMMENT ON FUNCTION payidem._close_expired_order(text) IS
	'Internal (housekeeping): close this order if it is still pending, expired, free (SKIP LOCKED) and without a pending attempt; true if closed now.';

CREATE FUNCTION payidem.refund(payment_no text, amount bigint, out_refund_no text, reason text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_payment_no text := refund.payment_no;
	v_amount bigint := refund.amount;
	v_out_refund_no text := refund.out_refund_no;
	v_refund_no text;
	v_order_no text;
	v_committed bigint;
	p payidem.payment;
	r payidem.refund;
BEGIN
	IF current_setting('transaction_isolation') = 'repeatable read' THEN
		PERFORM payidem._refuse_repeatable_read('refund', 'the refunded total of the payment');
	END IF;
	PERFORM payidem._check_number('payment', refund.payment_no);
	IF v_amount IS NULL OR v_amount <= 0 THEN
		RAISE EXCEPTION 'invalid refund amount' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The amount was %s; it must be a positive number of minor units.', coalesce(v_amount::text, 'NULL'));
	END IF;
	IF v_out_refund_no IS NULL OR NOT payidem._fits(v_out_refund_no, 'payidem.merchant_ref') THEN
		PERFORM payidem._invalid_format('out_refund_no', v_out_refund_no, 'payidem.merchant_ref',
										'Use the merchant''s own refund number.');
	END IF;
	IF NOT payidem._fits(reason, 'payidem.refund_reason') THEN
		RAISE EXCEPTION 'invalid refund reason' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The reason has %s characters; at most 256 are allowed.', length(reason));
	END IF;

	-- serializes the refunds of one payment; in the lock order of every flow
	-- function, the order first (its number never changes), so a refund and
	-- its result in one transaction cannot deadlock with a payment result
	SELECT x.order_no INTO v_order_no FROM payidem.payment x WHERE x.payment_no = v_payment_no;
	IF FOUND THEN
		PERFORM 1 FROM payidem."order" x WHERE x.order_no = v_order_no FOR NO KEY UPDATE;
	END IF;
	SELECT * INTO p FROM payidem.payment x WHERE x.payment_no = v_payment_no FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'payment % does not exist', coalesce(quote_literal(left(v_payment_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.payment has no row with that payment_no.';
	END IF;

	<<attempt>>
	LOOP
		SELECT * INTO r FROM payidem.refund x
		 WHERE x.merchant_no = p.merchant_no AND x.out_refund_no = v_out_refund_no;
		IF FOUND THEN
			IF r.payment_no <> p.payment_no OR r.amount <> v_amount THEN
				RAISE EXCEPTION 'out_refund_no % was already used for another refund', v_out_refund_no USING
					ERRCODE = 'PI001',
					DETAIL = CASE WHEN r.payment_no <> p.payment_no
							 THEN format('Refund %s (out_refund_no %s) is for payment %s; this call names payment %s.',
										 r.refund_no, v_out_refund_no, r.payment_no, p.payment_no)
							 ELSE format('Refund %s (out_refund_no %s) is for amount %s; this call asked for %s.',
										 r.refund_no, v_out_refund_no, r.amount, v_amount) END,
					HINT = 'A repeated refund must carry the same payment and amount; use a new out_refund_no for a new refund.';
			END IF;
			RETURN r.refund_no;
		END IF;

		IF p.status NOT IN ('succeeded', 'partially_refunded') THEN
			RAISE EXCEPTION 'payment % cannot be refunded', p.payment_no USING
				ERRCODE = 'PI002',
				DETAIL = format('Payment %s is %s; only a succeeded or partially refunded payment can be refunded.',
								p.payment_no, p.status);
		END IF;
		SELECT coalesce(sum(x.amount), 0) INTO v_committed FROM payidem.refund x
		 WHERE x.payment_no = p.payment_no AND x.status IN ('pending', 'succeeded');
		-- (compared as amount - committed: v_committed + v_amount could overflow)
		IF v_amount > p.amount - v_committed THEN
			RAISE EXCEPTION 'refund exceeds the paid amount' USING
				ERRCODE = 'PI006',
				DETAIL = format('Payment %s is for %s; %s is already refunded or being refunded, so at most %s more can be refunded, not %s.',
								p.payment_no, p.amount, v_committed, p.amount - v_committed, v_amount);
		END IF;

		-- a concurrent refund of another payment of this merchant may take the
		-- same out_refund_no: then read its row and decide as above
		INSERT INTO payidem.refund AS x (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount, reason)
		VALUES (payidem.gen_order_no('RF'), p.payment_no, p.order_no, p.merchant_no, v_out_refund_no, v_amount, reason)
		ON CONFLICT ON CONSTRAINT refund_out_refund_no_key DO NOTHING
		RETURNING x.refund_no INTO v_refund_no;
		IF v_refund_no IS NOT NULL THEN
			RETURN v_refund_no;
		END IF;
	END LOOP attempt;
END
$$;
COMMENT ON FUNCTION payidem.refund(text, bigint, text, text) IS
	'Start a refund of a succeeded or partially refunded payment (refund_no = gen_order_no(''RF''), pending). Idempotent on (merchant, out_refund_no): same payment and amount return the existing refund_no, else PI001. PI006 if pending + succeeded refunds would exceed the payment amount, PI002 wrong payment status, PI009 unknown payment.';

CREATE FUNCTION payidem.apply_refund_result(refund_no text, status text, channel_refund_id text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_refund_no text := apply_refund_result.refund_no;
	v_status text := apply_refund_result.status;
	v_crid text := apply_refund_result.channel_refund_id;
	v_payment_no text;
	v_order_no text;
	v_refunded bigint;
	v_order_refunded bigint;
	p payidem.payment;
	r payidem.refund;
	o payidem."order";
BEGIN
	PERFORM payidem._check_number('refund', apply_refund_result.refund_no);
	IF v_status IS NULL OR v_status NOT IN ('succeeded', 'failed') THEN
		RAISE EXCEPTION 'invalid refund result status' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The status was %s; it must be succeeded or failed.',
							coalesce(quote_literal(left(v_status, 64)), 'NULL'));
	END IF;
	IF NOT payidem._fits(v_crid, 'payidem.channel_ref') THEN
		PERFORM payidem._invalid_format('channel_refund_id', v_crid, 'payidem.channel_ref');
	END IF;

	-- the lock order of every flow function: the order (a success moves
	-- it), then the payment, then the refund; their numbers never change
	SELECT x.payment_no, x.order_no INTO v_payment_no, v_order_no FROM payidem.refund x WHERE x.refund_no = v_refund_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'refund % does not exist', coalesce(quote_literal(left(v_refund_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.refund has no row with that refund_no.';
	END IF;
	IF v_status = 'succeeded' THEN
		SELECT * INTO o FROM payidem."order" x WHERE x.order_no = v_order_no FOR NO KEY UPDATE;
	END IF;
	SELECT * INTO p FROM payidem.payment x WHERE x.payment_no = v_payment_no FOR NO KEY UPDATE;
	SELECT * INTO r FROM payidem.refund x WHERE x.refund_no = v_refund_no FOR NO KEY UPDATE;

	IF r.status NOT IN ('pending', v_status) THEN
		-- succeeded and failed are both final: the other word comes too late
		IF v_status = 'succeeded' AND NOT EXISTS (
				SELECT 1 FROM payidem.anomaly a
				 WHERE a.payment_no = p.payment_no AND a.kind = 'refund_success_after_failure'
				   AND a.handle_status = 'open' AND a.detail @> jsonb_build_object('refund_no', r.refund_no)) THEN
			-- the channel says money went back on a refund we recorded as failed
			INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail)
			VALUES ('refund_success_after_failure', p.order_no, p.payment_no, p.channel_no, r.amount,
					jsonb_build_object('refund_no', r.refund_no, 'channel_refund_id', v_crid));
		END IF;
		RETURN 'rejected';
	END IF;

	-- a repeat is answered from the refund's row, which we hold locked: it
	-- is the record of the decision (no idempotency key: DESIGN section 4)
	IF r.status = v_status THEN
		RETURN 'duplicate';
	END IF;

	IF v_status = 'failed' THEN
		PERFORM payidem.transit_refund(r.refund_no, 'failed');
		RETURN 'applied';
	END IF;

	-- The refund, its payment and (only if that payment paid it) the order,
	-- each row's status with its refunded amount, in one statement: the
	-- bookkeeping checks across rows see all three written also when they
	-- run at the end of each statement (SET CONSTRAINTS ... IMMEDIATE).
	-- status_guard checks and logs each status change.
	v_refunded := p.refunded_amount + r.amount;
	v_order_refunded := o.refunded_amount + r.amount;
	WITH refund_done AS (
		UPDATE payidem.refund x
		   SET status = 'succeeded', refunded_at = now(), updated_at = now(),
			   channel_refund_id = coalesce(v_crid, x.channel_refund_id)
		 WHERE x.refund_no = r.refund_no
		RETURNING x.refund_no),
	payment_done AS (
		UPDATE payidem.payment x
		   SET refunded_amount = v_refunded, updated_at = now(),
			   status = CASE WHEN v_refunded >= p.amount THEN 'refunded' ELSE 'partially_refunded' END
		 WHERE x.payment_no = p.payment_no
		RETURNING x.payment_no)
	UPDATE payidem."order" x
	   SET refunded_amount = v_order_refunded, updated_at = now(),
		   status = CASE WHEN v_order_refunded >= o.amount THEN 'refunded' ELSE 'partially_refunded' END
	 WHERE x.order_no = o.order_no AND o.paid_payment_no = p.payment_no;
	RETURN 'applied';
END
$$;
COMMENT ON FUNCTION payidem.apply_refund_result(text, text, text) IS
	'Apply a channel''s refund result (succeeded|failed) exactly once: succeeded moves the refunded amounts and statuses of the payment and, if that payment paid the order, of the order. Returns applied, duplicate or rejected (the other final word came first).';

-- Merchant notifications: one event per order.paid, refund.succeeded and
-- order.closed, written by the status_notify triggers (below) in the
-- transaction of the change, whoever makes it (a flow function, its C fast
-- path, a DBA's transit_order()).  The payload is built once, when the event
-- is written, and never again: it says the state at the event.

-- The event of an order that became paid or closed, or of a refund that
-- succeeded: src/notify.c, the one place an event's row and payload are
-- made and the one place it is decided which changes have one
-- (docs/notifications.md).  Not SECURITY DEFINER: it switches to the tables'
-- owner itself, so that the event is written whoever changed the row,
-- without a setting saved and restored on every call; it reads by key and
-- writes the event directly (src/write.c), without SQL.
CREATE FUNCTION payidem._status_event()
RETURNS trigger
LANGUAGE c
AS 'MODULE_PATHNAME', 'payidem_status_event';
COMMENT ON FUNCTION payidem._status_event() IS
	'Trigger status_notify on payidem."order" and payidem.refund: the notification event of the change, with its payload (docs/notifications.md).';

-- Named to fire after status_guard and status_ledger (AFTER triggers fire in
-- name order): a change they refuse writes no event.  No WHEN clause: the
-- function returns at once for a change it does not report (a WHEN clause
-- would be read from the catalog and planned at every direct update of the
-- payment flow, which builds its executor state per call).
CREATE TRIGGER status_notify
	AFTER UPDATE ON payidem."order"
	FOR EACH ROW
	EXECUTE FUNCTION payidem._status_event();
CREATE TRIGGER status_notify
	AFTER UPDATE ON payidem.refund
	FOR EACH ROW
	EXECUTE FUNCTION payidem._status_event();

-- The signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<payload>")>,
-- one v1 per secret of the merchant valid now (two during a rotation's grace
-- period, the current one first).  The only place a notification is signed.
CREATE FUNCTION payidem._sign_notification(p_merchant_no text, p_payload text)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_t text := floor(extract(epoch FROM now()))::bigint::text;
	v_sig text := 't=' || v_t;
	s payidem.merchant_secret;
BEGIN
	FOR s IN SELECT * FROM payidem._secrets_valid_now(p_merchant_no) ORDER BY secret_version DESC LOOP
		v_sig := v_sig || ',v1=' || payidem._hmac_sign(payidem._secret_aad(s.merchant_no, s.secret_version),
														s.key_version, s.nonce, s.ciphertext, s.auth_tag,
														v_t || '.' || p_payload);
	END LOOP;
	RETURN v_sig;
END
$$;
COMMENT ON FUNCTION payidem._sign_notification(text, text) IS
	'Internal: the signature header of a notification payload, signed now (docs/notifications.md).';

CREATE FUNCTION payidem.notify_due(max_rows integer DEFAULT 100)
RETURNS TABLE (event_id bigint, order_no text, merchant_no text, notify_url text,
			   event text, payload text, signature text, attempt integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_lease constant interval := '60 seconds';
	v_max_attempts constant integer := 16;		-- notify_result()'s schedule has 15 waits
	v_given_up bigint;
	n record;
BEGIN
	IF max_rows IS NULL OR max_rows <= 0 THEN
		RAISE EXCEPTION 'invalid max_rows' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('max_rows was %s; it must be positive.', coalesce(max_rows::text, 'NULL')),
			HINT = 'Pass how many events one worker takes at a time, e.g. 100.';
	END IF;
	-- a closed merchant's key signs nothing more: its due events are given
	-- up (failed), not handed out, and never hold up the others; so is an
	-- event whose last attempt was handed out and never answered
	WITH gone AS (
		SELECT e.event_id,
			   CASE WHEN m.status = 'closed' THEN 'merchant closed' ELSE 'no answer to the last attempt' END AS why
		  FROM payidem.notify_event e JOIN payidem.merchant m ON m.merchant_no = e.merchant_no
		 WHERE e.status = 'pending' AND e.next_attempt_at <= now()
		   AND (m.status = 'closed' OR e.attempts >= v_max_attempts)
		   FOR UPDATE OF e SKIP LOCKED)
	UPDATE payidem.notify_event e
	   SET status = 'failed', next_attempt_at = NULL, last_response = gone.why
	  FROM gone WHERE e.event_id = gone.event_id;
	GET DIAGNOSTICS v_given_up = ROW_COUNT;
	IF v_given_up > 0 THEN
		PERFORM payidem._count('notify_failed', v_given_up);
	END IF;
	-- Events another worker holds are skipped.  Handing an event out is its
	-- next attempt (attempts counts hand-outs; the one handed out is named by
	-- attempt, and notify_result() takes reports of that one only) and
	-- leases it: its next_attempt_at moves ahead, so it is not handed out
	-- again after this transaction ends, until notify_result() or the lease
	-- runs out (a worker that died: that attempt had no answer).
	FOR n IN
		WITH due AS (
			SELECT e.event_id FROM payidem.notify_event e
			 WHERE e.status = 'pending' AND e.next_attempt_at <= now()
			   AND e.attempts < v_max_attempts
			   AND NOT EXISTS (SELECT 1 FROM payidem.merchant m
								WHERE m.merchant_no = e.merchant_no AND m.status = 'closed')
			 ORDER BY e.next_attempt_at
			 LIMIT max_rows
			 FOR UPDATE SKIP LOCKED)
		UPDATE payidem.notify_event e
		   SET next_attempt_at = now() + v_lease, attempts = e.attempts + 1, last_attempt_at = now()
		  FROM due WHERE e.event_id = due.event_id
		RETURNING e.event_id, e.order_no, e.merchant_no, e.event, e.payload, e.attempts
	LOOP
		signature := payidem._sign_notification(n.merchant_no, n.payload);
		IF signature !~ ',v1=' THEN
			-- no secret of the merchant is valid now: nothing to sign with; the
			-- event waits (this was no attempt) and is not sent unsigned
			UPDATE payidem.notify_event e
			   SET attempts = e.attempts - 1, next_attempt_at = now() + interval '5 minutes',
				   last_response = 'no valid API secret'
			 WHERE e.event_id = n.event_id;
			CONTINUE;
		END IF;
		event_id := n.event_id;
		order_no := n.order_no;
		merchant_no := n.merchant_no;
		SELECT x.notify_url INTO notify_url FROM payidem."order" x WHERE x.order_no = n.order_no;
		event := n.event;
		payload := n.payload;
		attempt := n.attempts;
		RETURN NEXT;
	END LOOP;
END
$$;
COMMENT ON FUNCTION payidem.notify_due(integer) IS
	'Hand out up to max_rows due notification events (FOR UPDATE SKIP LOCKED: two workers never get the same one; each hand-out is the event''s next attempt and leases it for 60 s): the payload text to POST as it is and its signature header (t=...,v1=...). Report each with notify_result(). Events of a closed merchant, and those whose 16th attempt went unanswered, are given up (failed), not handed out.';

CREATE FUNCTION payidem.notify_result(event_id bigint, ok boolean, response text DEFAULT NULL,
									 attempt integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	-- wait after the n-th failed attempt; after the 16th attempt: failed
	v_schedule constant interval[] := ARRAY['15 seconds', '15 seconds', '30 seconds', '3 minutes',
		'10 minutes', '20 minutes', '30 minutes', '30 minutes', '30 minutes', '60 minutes',
		'3 hours', '3 hours', '3 hours', '6 hours', '6 hours']::interval[];
	e payidem.notify_event;
BEGIN
	IF notify_result.event_id IS NULL OR notify_result.event_id <= 0 THEN
		RAISE EXCEPTION 'invalid event_id' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('event_id was %s; it must be an id notify_due() handed out.',
							coalesce(notify_result.event_id::text, 'NULL'));
	END IF;
	IF ok IS NULL THEN
		RAISE EXCEPTION 'notification result must not be NULL' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = 'ok was NULL.',
			HINT = 'Pass true if the merchant acknowledged the notification, false otherwise.';
	END IF;
	SELECT * INTO e FROM payidem.notify_event x WHERE x.event_id = notify_result.event_id FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'notification event % does not exist', notify_result.event_id USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.notify_event has no row with that event_id.';
	END IF;
	IF e.status <> 'pending' OR e.attempts = 0 THEN
		RETURN;			-- already sent or given up, or never handed out: nothing to report
	END IF;
	-- a report of an attempt that is not the last one handed out (its lease
	-- ran out and the event went to another worker) is stale: it changes nothing
	IF notify_result.attempt IS NOT NULL AND notify_result.attempt <> e.attempts THEN
		RETURN;
	END IF;
	IF ok THEN
		UPDATE payidem.notify_event x
		   SET status = 'sent', next_attempt_at = NULL, sent_at = now()
		 WHERE x.event_id = e.event_id;
		PERFORM payidem._count('notify_sent');
	ELSIF e.attempts > cardinality(v_schedule) THEN
		UPDATE payidem.notify_event x
		   SET status = 'failed', next_attempt_at = NULL, last_response = left(response, 256)
		 WHERE x.event_id = e.event_id;
		PERFORM payidem._count('notify_failed');
	ELSE
		UPDATE payidem.notify_event x
		   SET next_attempt_at = now() + v_schedule[e.attempts], last_response = left(response, 256)
		 WHERE x.event_id = e.event_id;
		PERFORM payidem._count('notify_retried');
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.notify_result(bigint, boolean, text, integer) IS
	'Report one delivery attempt of an event: ok = sent; not ok = retry after 15s, 15s, 30s, 3m, 10m, 20m, 30m, 30m, 30m, 60m, 3h, 3h, 3h, 6h, 6h, then failed (16 attempts); the start of a failure''s response is kept. No change if the event is no longer pending, or if attempt (as notify_due() handed it out) is given and is not the last one handed out. PI009 unknown event.';

-- The receiver's check, for tests and for merchants running PostgreSQL: a
-- signature header of the payload under a secret of api_key valid now, made
-- at most tolerance ago (or ahead: clocks differ).  Unknown schemes in the
-- header (anything but t and v1) are ignored, as a receiver should.
CREATE FUNCTION payidem.verify_notification(api_key text, payload text, signature text,
											tolerance interval DEFAULT '5 minutes')
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_part text;
	v_t text;
	v_sigs text[] := '{}';
	v_sig text;
	ok boolean := false;
BEGIN
	IF tolerance IS NULL OR tolerance < interval '0' THEN
		RAISE EXCEPTION 'invalid tolerance' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('tolerance was %s; it must be zero or more.', coalesce(tolerance::text, 'NULL')),
			HINT = 'Pass how old a notification may be, e.g. ''5 minutes''.';
	END IF;
	IF api_key IS NULL OR payload IS NULL OR signature IS NULL OR length(signature) > 1024 THEN
		RETURN false;
	END IF;
	FOREACH v_part IN ARRAY string_to_array(signature, ',') LOOP
		IF v_part ~ '^t=[0-9]{1,12}$' THEN
			IF v_t IS NOT NULL THEN
				RETURN false;		-- two timestamps: which one was signed?
			END IF;
			v_t := substr(v_part, 3);
		ELSIF v_part ~ '^v1=[0-9a-f]{64}$' THEN
			v_sigs := v_sigs || substr(v_part, 4);
		END IF;
	END LOOP;
	IF v_t IS NULL OR cardinality(v_sigs) = 0
	   OR abs(floor(extract(epoch FROM now())) - v_t::numeric) > extract(epoch FROM tolerance) THEN
		RETURN false;
	END IF;
	FOREACH v_sig IN ARRAY v_sigs LOOP
		ok := payidem.verify_signature(api_key, v_t || '.' || payload, v_sig) OR ok;
	END LOOP;
	RETURN ok;
END
$$;
COMMENT ON FUNCTION payidem.verify_notification(text, text, text, interval) IS
	'true if the signature header (t=...,v1=...) signs the payload under a secret of api_key valid now and its t is within tolerance of now; false otherwise (a stale t, a changed byte, a rotated-out secret, a closed merchant).';

-- Attempts past their order's expiry: the application asks the channel and
-- reports with apply_payment_result(..., 'query' | 'close', ...).  A lease
-- per attempt (60 s, as notify_due()'s) keeps two callers, or one calling
-- again, from querying the same attempt at once.
CREATE TABLE payidem.query_lease (
	payment_no		text		NOT NULL,
	leased_until	timestamptz	NOT NULL,
	CONSTRAINT query_lease_pkey PRIMARY KEY (payment_no)
);
COMMENT ON TABLE payidem.query_lease IS
	'Which expired pending attempts query_due() handed out, until when; query_due() drops the leases of attempts no longer pending.';

CREATE FUNCTION payidem.query_due(max_rows integer DEFAULT 100)
RETURNS TABLE (payment_no text, order_no text, channel_no text, expire_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_lease constant interval := '60 seconds';
	-- the advisory-lock space of query_due() (the first key of the pair)
	v_lock_class constant integer := hashtext('payidem.query_due');
	v_taken integer := 0;
	c record;
BEGIN
	IF max_rows IS NULL OR max_rows <= 0 THEN
		RAISE EXCEPTION 'invalid max_rows' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('max_rows was %s; it must be positive.', coalesce(max_rows::text, 'NULL')),
			HINT = 'Pass how many attempts one worker queries at a time, e.g. 100.';
	END IF;
	-- the leases of attempts that are no longer pending are dropped (they can
	-- never be handed out again, so no caller writes them meanwhile); one
	-- another caller is dropping is left to it
	DELETE FROM payidem.query_lease l
	 WHERE l.payment_no IN (SELECT x.payment_no FROM payidem.query_lease x
							 WHERE x.leased_until <= now()
							   AND NOT EXISTS (SELECT 1 FROM payidem.payment p
												WHERE p.payment_no = x.payment_no AND p.status = 'pending')
							   FOR UPDATE SKIP LOCKED);
	-- Two callers never get the same attempt, and neither waits for the other.
	-- The candidates are read in expiry order and taken one at a time, until
	-- max_rows are had: an attempt another caller is handing out (its
	-- transaction-scoped advisory lock) is skipped, as SKIP LOCKED skips a
	-- row; one whose lease that caller committed after this query's snapshot
	-- is refused by the lease write itself (the upsert decides on the latest
	-- row).  Only the attempts handed out are locked (a lock per candidate
	-- read, never per pending attempt), and the attempts' rows not at all, so
	-- a payment result never waits for query_due().
	FOR c IN
		SELECT p.payment_no::text AS payment_no, p.order_no, p.channel_no, o.expire_at
		  FROM payidem.order_expiry q
		  JOIN payidem."order" o ON o.order_no = q.order_no AND o.expire_at = q.expire_at
		  JOIN payidem.payment p ON p.order_no = o.order_no AND p.status = 'pending'
		 WHERE q.expire_at <= now() AND o.status = 'pending'
		   AND NOT EXISTS (SELECT 1 FROM payidem.query_lease l
							WHERE l.payment_no = p.payment_no AND l.leased_until > now())
		 ORDER BY o.expire_at, p.payment_no
	LOOP
		CONTINUE WHEN NOT pg_try_advisory_xact_lock(v_lock_class, hashtext(c.payment_no));
		INSERT INTO payidem.query_lease AS l (payment_no, leased_until)
		VALUES (c.payment_no, now() + v_lease)
		ON CONFLICT ON CONSTRAINT query_lease_pkey DO UPDATE SET leased_until = excluded.leased_until
		 WHERE l.leased_until <= now();
		CONTINUE WHEN NOT FOUND;
		payment_no := c.payment_no;
		order_no := c.order_no;
		channel_no := c.channel_no;
		expire_at := c.expire_at;
		RETURN NEXT;
		v_taken := v_taken + 1;
		EXIT WHEN v_taken >= max_rows;
	END LOOP;
END
$$;
COMMENT ON FUNCTION payidem.query_due(integer) IS
	'Up to max_rows pending payment attempts whose order has expired, oldest expiry first, each leased for 60 s (two callers never get the same one, and never wait for each other): query the channel, then report with apply_payment_result(payment_no, ''query'' or ''close'', ...).';

-- The read API: an order with its attempts and refunds, as an application
-- reads it (it has no table privileges).  get_order() and find_order() are
-- C (src/read_api.c) only to know who calls and whether row-level security
-- applies to it; _read_order() decides, run as the tables' owner.
-- (a string body: a parsed one would tie the tables' row types to this
-- function and refuse an ALTER TABLE of them that rewrites the table)
CREATE FUNCTION payidem._order_json(o payidem."order")
RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
SELECT jsonb_build_object(
	'order_no', o.order_no, 'merchant_no', o.merchant_no, 'out_trade_no', o.out_trade_no,
	'subject', o.subject, 'body', o.body, 'amount', o.amount, 'currency', o.currency,
	'status', o.status, 'refunded_amount', o.refunded_amount, 'paid_payment_no', o.paid_payment_no,
	'paid_at', payidem._utc(o.paid_at), 'expire_at', payidem._utc(o.expire_at),
	'closed_at', payidem._utc(o.closed_at), 'created_at', payidem._utc(o.created_at),
	'updated_at', payidem._utc(o.updated_at), 'notify_url', o.notify_url, 'return_url', o.return_url,
	'payments', coalesce((
		SELECT jsonb_agg(jsonb_build_object(
					'payment_no', p.payment_no, 'channel_no', p.channel_no, 'amount', p.amount,
					'status', p.status, 'transaction_id', p.transaction_id, 'fee_amount', p.fee_amount,
					'cost_amount', p.cost_amount, 'refunded_amount', p.refunded_amount,
					'paid_at', payidem._utc(p.paid_at), 'closed_at', payidem._utc(p.closed_at),
					'created_at', payidem._utc(p.created_at)) ORDER BY p.created_at, p.payment_no)
		  FROM payidem.payment p WHERE p.order_no = o.order_no), '[]'),
	'refunds', coalesce((
		SELECT jsonb_agg(jsonb_build_object(
					'refund_no', r.refund_no, 'payment_no', r.payment_no, 'out_refund_no', r.out_refund_no,
					'amount', r.amount, 'status', r.status, 'channel_refund_id', r.channel_refund_id,
					'reason', r.reason, 'refunded_at', payidem._utc(r.refunded_at),
					'created_at', payidem._utc(r.created_at)) ORDER BY r.created_at, r.refund_no)
		  FROM payidem.refund r WHERE r.order_no = o.order_no), '[]'))
$$;
COMMENT ON FUNCTION payidem._order_json(payidem."order") IS
	'Internal to get_order() and find_order(): the order, its attempts and its refunds as one JSON object (times in UTC ISO 8601).';

-- Who reads what: a caller row-level security does not apply to, or one
-- without SELECT on "order" (an application role), reads every order; any
-- other reads what its row-level security shows it (the policies' rule,
-- _row_visible): a merchant-mapped role, a member of one, one unmapped.
CREATE FUNCTION payidem._read_order(order_no text, merchant_no text, out_trade_no text,
	caller regrole, scoped boolean)
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	o payidem."order";
BEGIN
	IF _read_order.merchant_no IS NULL AND _read_order.out_trade_no IS NULL THEN
		PERFORM payidem._check_number('order', _read_order.order_no);
		SELECT * INTO o FROM payidem."order" x WHERE x.order_no = _read_order.order_no;
		-- (an order the caller may not read does not exist for it)
		IF NOT FOUND OR (scoped AND NOT payidem._row_visible(o.merchant_no, caller)) THEN
			RAISE EXCEPTION 'order % does not exist', quote_literal(_read_order.order_no) USING
				ERRCODE = 'PI009',
				DETAIL = 'payidem."order" has no row with that order_no.';
		END IF;
	ELSE
		PERFORM payidem._require('merchant_no', _read_order.merchant_no);
		PERFORM payidem._require('out_trade_no', _read_order.out_trade_no);
		SELECT * INTO o FROM payidem."order" x
		 WHERE x.merchant_no = _read_order.merchant_no AND x.out_trade_no = _read_order.out_trade_no;
		IF NOT FOUND OR (scoped AND NOT payidem._row_visible(o.merchant_no, caller)) THEN
			RAISE EXCEPTION 'merchant % has no order %', quote_literal(left(_read_order.merchant_no, 64)),
				quote_literal(left(_read_order.out_trade_no, 64)) USING
				ERRCODE = 'PI009',
				DETAIL = 'payidem."order" has no row with that merchant_no and out_trade_no.';
		END IF;
	END IF;
	RETURN payidem._order_json(o);
END
$$;
COMMENT ON FUNCTION payidem._read_order(text, text, text, regrole, boolean) IS
	'Internal to get_order() and find_order() (src/read_api.c): the order as JSON, if the caller may read it; PI009 otherwise.';

CREATE FUNCTION payidem.get_order(order_no text)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'payidem_get_order'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.get_order(text) IS
	'The order with its payment attempts and refunds, as JSON (times in UTC ISO 8601). PI009 unknown (or one the caller''s row-level security hides), 22023 malformed number.';

CREATE FUNCTION payidem.find_order(merchant_no text, out_trade_no text)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'payidem_find_order'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.find_order(text, text) IS
	'The order a merchant created with out_trade_no, as get_order() shows it. PI009 if there is none (or the caller''s row-level security hides it).';

-- (end of payment-flow functions)

------------------------------------------------------------------------------
-- Reconciliation
------------------------------------------------------------------------------

-- How it works (docs/reconciliation.md has the operator's guide):
--  * load_bill() (or a plain COPY) fills channel_bill with the channel's lines.
--  * reconcile(channel, day) puts the day's bill lines and the day's paid
--    payments of that channel through ONE hash full join on transaction_id;
--    only what is left over (about 1 % on a normal day) is looked at again,
--    by index, for midnight straddles.  Only differences are stored.
--  * A re-run of a channel+day keeps the recon_id of a difference that is
--    still there, drops open ones that are gone, never re-opens or doubles
--    one a person handled or ignored.  Runs of one channel are serialised by
--    a transaction-level advisory lock (hashtext('payidem.reconcile'),
--    hashtext(channel_no)), which load_bill() takes too.

CREATE FUNCTION payidem._bill_timezone()
RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN coalesce(nullif(pg_catalog.current_setting('payidem.bill_timezone', true), ''), 'UTC');
COMMENT ON FUNCTION payidem._bill_timezone() IS
	'The setting payidem.bill_timezone (UTC when unset).';

-- One CSV record (RFC 4180 quoting, one physical line); NULL when a double
-- quote is misplaced or not closed.  Lines without quotes never come here.
CREATE FUNCTION payidem._csv_fields(line text)
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	fields		text[] := '{}';
	field		text := '';
	ch			text;
	i			integer := 1;
	n			integer := length(line);
	in_quotes	boolean := false;
	was_quoted	boolean := false;
BEGIN
	WHILE i <= n LOOP
		ch := substr(line, i, 1);
		IF in_quotes THEN
			IF ch = '"' THEN
				IF substr(line, i + 1, 1) = '"' THEN
					field := field || '"';
					i := i + 1;
				ELSE
					in_quotes := false;
				END IF;
			ELSE
				field := field || ch;
			END IF;
		ELSIF ch = ',' THEN
			fields := fields || field;
			field := '';
			was_quoted := false;
		ELSIF ch = '"' THEN
			IF field <> '' OR was_quoted THEN
				RETURN NULL;
			END IF;
			in_quotes := true;
			was_quoted := true;
		ELSIF was_quoted THEN
			RETURN NULL;
		ELSE
			field := field || ch;
		END IF;
		i := i + 1;
	END LOOP;
	IF in_quotes THEN
		RETURN NULL;
	END IF;
	RETURN fields || field;
END
$$;
COMMENT ON FUNCTION payidem._csv_fields(text) IS
	'Split one CSV record with double-quoted fields; NULL if the quoting is malformed.';

-- The records of a CSV text: physical line number and fields.  Blank lines,
-- a byte-order mark and a header line (first line starting with channel_no)
-- are skipped; line numbers stay those of the text.
CREATE FUNCTION payidem._bill_lines(csv text)
RETURNS TABLE(line_no bigint, fields text[])
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT t.n,
		   CASE WHEN pg_catalog.strpos(t.line, '"') = 0
				THEN pg_catalog.string_to_array(t.line, ',')
				ELSE payidem._csv_fields(t.line) END
	  FROM (SELECT s.n, pg_catalog.ltrim(pg_catalog.rtrim(s.l, pg_catalog.chr(13)), pg_catalog.chr(65279)) AS line
			  FROM pg_catalog.string_to_table(csv, pg_catalog.chr(10)) WITH ORDINALITY AS s(l, n)) t
	 WHERE pg_catalog.btrim(t.line, ' ' || pg_catalog.chr(9)) <> ''
	   AND NOT (t.n = 1 AND t.line ~* '^"?channel_no"?,');
END;
COMMENT ON FUNCTION payidem._bill_lines(text) IS
	'Records of a channel bill CSV text with their line numbers (blank lines, BOM and header skipped).';

-- A bill time: ISO 8601; without an offset it is a wall-clock time in tz.
CREATE FUNCTION payidem._bill_time(value text, tz text)
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN CASE
	WHEN value IS NULL OR value = '' THEN NULL
	WHEN value ~ '([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)$' THEN value::timestamptz
	ELSE pg_catalog.timezone(tz, value::timestamp)
END;
COMMENT ON FUNCTION payidem._bill_time(text, text) IS
	'Read a bill line''s paid_at: with an offset as given, without one as wall-clock time in the given zone.';

CREATE FUNCTION payidem.load_bill(channel_no text, bill_date date, csv text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	v_channel	text := load_bill.channel_no;
	v_day		date := load_bill.bill_date;
	v_csv		text := load_bill.csv;
	v_tz		text := payidem._bill_timezone();
	v_day_text	text;
	v_bad		record;
	v_rows		bigint;
	-- the shape of a paid_at; the cast still checks the ranges
	c_time		constant text := '^[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?( ?([Zz]|[+-][0-9]{2}(:?[0-9]{2})?))?$';
	c_hint		constant text := 'Nothing was imported. The layout is channel_no,bill_date,transaction_id,payment_no,amount,fee,status,paid_at (see docs/reconciliation.md); fix the line and load the whole bill again.';
BEGIN
	IF v_channel IS NULL OR v_day IS NULL OR v_csv IS NULL THEN
		RAISE EXCEPTION 'channel_no, bill_date and csv must not be null' USING
			ERRCODE = 'invalid_parameter_value';
	END IF;
	PERFORM payidem._check_bill_date(v_day);
	IF NOT EXISTS (SELECT 1 FROM payidem.channel c WHERE c.channel_no OPERATOR(pg_catalog.=) v_channel) THEN
		RAISE EXCEPTION 'channel % does not exist', quote_literal(left(v_channel, 64)) USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.channel has no row with that channel_no.';
	END IF;
	v_day_text := to_char(v_day, 'YYYY-MM-DD');
	PERFORM pg_advisory_xact_lock(hashtext('payidem.reconcile'), hashtext(v_channel));

	-- the first bad line, if any (field by field, then duplicates)
	SELECT c.line_no, c.problem[1] AS field, c.problem[2] AS value, c.problem[3] AS rule
	  INTO v_bad
	  FROM (SELECT l.line_no,
				   CASE
					WHEN l.f IS NULL THEN
						ARRAY[NULL, NULL, 'a double quote is misplaced or not closed']
					WHEN cardinality(l.f) <> 8 THEN
						ARRAY[NULL, NULL, format('the line has %s fields instead of 8', cardinality(l.f))]
					WHEN l.f[1] NOT IN ('', v_channel) THEN
						ARRAY['channel_no', l.f[1], format('is not the channel of this bill (%s)', v_channel)]
					WHEN l.f[2] <> '' AND l.f[2] !~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' THEN
						ARRAY['bill_date', l.f[2], 'is not a date written YYYY-MM-DD']
					WHEN l.f[2] <> '' AND l.f[2] <> v_day_text THEN
						ARRAY['bill_date', l.f[2], format('is not the day of this bill (%s)', v_day_text)]
					WHEN NOT payidem._fits(l.f[3], 'payidem.channel_ref') THEN
						ARRAY['transaction_id', l.f[3], 'must be ' || payidem._format_rule('payidem.channel_ref')]
					WHEN l.f[4] <> '' AND NOT payidem._fits(l.f[4], 'payidem.channel_ref') THEN
						ARRAY['payment_no', l.f[4], 'must be empty or ' || payidem._format_rule('payidem.channel_ref')]
					-- at most the bigint maximum, as create_order() takes (compared as text)
					WHEN l.f[5] !~ '^[0-9]+$' OR l.f[5] ~ '^0+$' OR length(ltrim(l.f[5], '0')) > 19
						 OR (length(ltrim(l.f[5], '0')) = 19
							 AND ltrim(l.f[5], '0') COLLATE "C" > '9223372036854775807') THEN
						ARRAY['amount', l.f[5], 'must be a positive integer in minor units (fen, cents)']
					WHEN l.f[6] <> '' AND (l.f[6] !~ '^[0-9]+$' OR length(ltrim(l.f[6], '0')) > 19
						 OR (length(ltrim(l.f[6], '0')) = 19
							 AND ltrim(l.f[6], '0') COLLATE "C" > '9223372036854775807')) THEN
						ARRAY['fee', l.f[6], 'must be empty or a non-negative integer in minor units (fen, cents)']
					WHEN l.f[7] NOT IN ('succeeded', 'refunded') THEN
						ARRAY['status', l.f[7], 'must be succeeded or refunded']
					WHEN l.f[8] <> '' AND l.f[8] !~ c_time THEN
						ARRAY['paid_at', l.f[8], 'is not a time written YYYY-MM-DD HH:MM:SS[.ffffff][+HH:MM]']
					WHEN l.first_line <> l.line_no THEN
						ARRAY['transaction_id', l.f[3], format('appears already on line %s', l.first_line)]
				   END AS problem
			  FROM (SELECT b.line_no, b.fields AS f,
						   min(b.line_no) OVER (PARTITION BY b.fields[3]) AS first_line
					  FROM payidem._bill_lines(v_csv) b) l) c
	 WHERE c.problem IS NOT NULL
	 ORDER BY c.line_no
	 LIMIT 1;
	IF FOUND THEN
		IF v_bad.field IS NULL THEN
			RAISE EXCEPTION 'invalid line % in the channel bill', v_bad.line_no USING
				ERRCODE = 'invalid_parameter_value',
				DETAIL = format('Line %s: %s.', v_bad.line_no, v_bad.rule),
				HINT = c_hint;
		END IF;
		RAISE EXCEPTION 'invalid % on line % of the channel bill', v_bad.field, v_bad.line_no USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('Line %s, field %s: %s %s.', v_bad.line_no, v_bad.field,
							quote_literal(left(v_bad.value, 64)), v_bad.rule),
			HINT = c_hint;
	END IF;

	-- a bill loaded again replaces the channel's earlier bill of that day
	DELETE FROM payidem.channel_bill cb
	 WHERE cb.channel_no OPERATOR(pg_catalog.=) v_channel AND cb.bill_date OPERATOR(pg_catalog.=) v_day;
	BEGIN
		INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, payment_no, amount, fee, status, paid_at)
		SELECT v_channel, v_day, b.fields[3], nullif(b.fields[4], ''), b.fields[5]::bigint,
			   coalesce(nullif(b.fields[6], '')::bigint, 0), b.fields[7],
			   CASE
				WHEN b.fields[8] = '' THEN NULL
				WHEN b.fields[8] ~ '([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)$' THEN b.fields[8]::timestamptz
				ELSE timezone(v_tz, b.fields[8]::timestamp)
			   END
		  FROM payidem._bill_lines(v_csv) b;
		GET DIAGNOSTICS v_rows = ROW_COUNT;
	EXCEPTION WHEN data_exception THEN
		-- a paid_at of the right shape but out of range (month 13, 25 o'clock):
		-- find its line (only on this error path, line by line)
		FOR v_bad IN SELECT b.line_no, b.fields[8] AS value FROM payidem._bill_lines(v_csv) b ORDER BY b.line_no LOOP
			BEGIN
				PERFORM payidem._bill_time(v_bad.value, v_tz);
			EXCEPTION WHEN data_exception THEN
				RAISE EXCEPTION 'invalid paid_at on line % of the channel bill', v_bad.line_no USING
					ERRCODE = 'invalid_parameter_value',
					DETAIL = format('Line %s, field paid_at: %s is not a valid time (%s).', v_bad.line_no,
									quote_literal(left(v_bad.value, 64)), SQLERRM),
					HINT = c_hint;
			END;
		END LOOP;
		RAISE;
	END;
	RETURN v_rows;
END
$$;
COMMENT ON FUNCTION payidem.load_bill(text, date, text) IS
	'Import a channel''s bill of one day from CSV text (channel_no,bill_date,transaction_id,payment_no,amount,fee,status,paid_at; channel_no and bill_date may be empty); replaces that day''s earlier bill; all lines or none (22023 naming the line and field); returns the number of lines.';

-- Refunded as far as bill day ending at `day_end` is concerned: a refunded or
-- partially refunded payment whose first succeeded refund (if the refund
-- table knows it) happened before the end of the day.  A refund made after
-- the day is not a difference of that day's bill.
CREATE FUNCTION payidem._refunded_by(payment_no text, payment_status text, day_end timestamptz)
RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN payment_status IN ('refunded', 'partially_refunded')
	AND NOT EXISTS (SELECT 1 FROM payidem.refund rf
					 WHERE rf.payment_no OPERATOR(pg_catalog.=) _refunded_by.payment_no
					   AND rf.status OPERATOR(pg_catalog.=) 'succeeded'
					HAVING pg_catalog.min(coalesce(rf.refunded_at, rf.updated_at)) >= day_end);
COMMENT ON FUNCTION payidem._refunded_by(text, text, timestamptz) IS
	'Whether a payment counts as refunded for the bill day that ends at day_end.';

-- One row the day's join did not match, as reconcile() carries it from the
-- join to the difference rules (internal).
CREATE TYPE payidem._recon_leftover AS (
	p_no text, p_txn text, p_amount bigint, p_status text,
	b_txn text, b_amount bigint, b_status text);
COMMENT ON TYPE payidem._recon_leftover IS
	'Internal to reconcile(): a payment and/or bill line the day''s join may not have matched.';

-- The arguments of reconcile(), checked, and how many bill lines of that
-- channel and day are loaded (the router asks every partition the same).
CREATE FUNCTION payidem._bill_day_lines(channel_no text, bill_date date)
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF channel_no IS NULL OR bill_date IS NULL THEN
		RAISE EXCEPTION 'channel_no and bill_date must not be null' USING
			ERRCODE = 'invalid_parameter_value';
	END IF;
	PERFORM payidem._check_bill_date(bill_date);
	IF NOT EXISTS (SELECT 1 FROM payidem.channel c WHERE c.channel_no OPERATOR(pg_catalog.=) _bill_day_lines.channel_no) THEN
		RAISE EXCEPTION 'channel % does not exist', quote_literal(left(channel_no, 64)) USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.channel has no row with that channel_no.';
	END IF;
	RETURN (SELECT count(*) FROM payidem.channel_bill b
			 WHERE b.channel_no OPERATOR(pg_catalog.=) _bill_day_lines.channel_no
			   AND b.bill_date OPERATOR(pg_catalog.=) _bill_day_lines.bill_date);
END
$$;
COMMENT ON FUNCTION payidem._bill_day_lines(text, date) IS
	'Internal to reconcile() (here and on the router): checks its channel and day (22023, PI009) and counts the day''s loaded bill lines.';

CREATE FUNCTION payidem.reconcile(channel_no text, bill_date date, allow_empty boolean DEFAULT false)
RETURNS TABLE(recon_batch_no text, matched bigint, platform_only bigint,
			  channel_only bigint, amount_mismatch bigint, status_mismatch bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- The planner cannot know how many differences a day has (a CTE, a table
-- just written): a nested-loop anti-join of the day's differences against
-- the stored ones would be quadratic at 10,000+ differences.  Joins here
-- are hash joins; the look-ups that must be nested loops (LATERAL ... LIMIT,
-- subplans, = ANY) are not affected by this setting.  Step 1 alone is
-- planned with nested loops allowed: it reads the day's payments by key
-- from payment_paid, and whether to fetch each payment by its key or to
-- hash the whole table is the planner's to decide from the day's size (a
-- hash join there reads every payment ever made, each day).  The setting
-- also adds a huge "disabled" cost to the plans, which would trigger JIT
-- compilation (about 2 s a statement) on every run: JIT is off here.
SET enable_nestloop = off SET jit = off AS $$
#variable_conflict use_column
DECLARE
	v_channel	text := reconcile.channel_no;
	v_day		date := reconcile.bill_date;
	v_tz		text := payidem._bill_timezone();
	v_from		timestamptz;
	v_to		timestamptz;
	v_batch		text;
	v_run		bigint;
	v_matched	bigint;
	v_bill_lines bigint;
	v_bill_amount numeric;	-- sums of bigint amounts: may pass the bigint range
	v_payments	bigint;
	v_pay_amount numeric;
	v_rows		bigint;
	-- what the join left over (the differences, before the straddle check)
	l_rows		payidem._recon_leftover[];
	n			record;
BEGIN
	-- no bill, no reconciliation: without one every payment of the day would
	-- be reported platform_only
	IF payidem._bill_day_lines(v_channel, v_day) = 0 AND allow_empty IS NOT TRUE THEN
		RAISE EXCEPTION 'no bill of channel % for % is loaded', v_channel, to_char(v_day, 'YYYY-MM-DD') USING
			ERRCODE = 'object_not_in_prerequisite_state',
			DETAIL = format('payidem.channel_bill has no line of channel %s for bill day %s.', v_channel,
							to_char(v_day, 'YYYY-MM-DD')),
			HINT = 'Load the day''s bill with payidem.load_bill() first; if the channel really reported nothing that day, call reconcile(channel_no, bill_date, allow_empty => true).';
	END IF;
	-- the bill day, midnight to midnight in the channel's zone
	v_from := timezone(v_tz, v_day::timestamp);
	v_to := timezone(v_tz, (v_day + 1)::timestamp);

	-- one run per channel at a time (also keeps two runs of a day from
	-- doubling differences, and a straddle update from racing its day)
	PERFORM pg_advisory_xact_lock(hashtext('payidem.reconcile'), hashtext(v_channel));

	SELECT coalesce(max(substring(b.recon_batch_no FROM '-([0-9]{1,9})$')::bigint), 0) + 1
	  INTO v_run
	  FROM payidem.recon_batch b
	 WHERE b.channel_no = v_channel AND b.bill_date = v_day;
	v_batch := format('RC-%s-%s-%s', v_channel, to_char(v_day, 'YYYYMMDD'),
					  CASE WHEN v_run < 1000 THEN lpad(v_run::text, 3, '0') ELSE v_run::text END);
	INSERT INTO payidem.recon_batch (recon_batch_no, channel_no, bill_date, status, bill_timezone)
	VALUES (v_batch, v_channel, v_day, 'running', v_tz);

	PERFORM set_config('enable_nestloop', 'on', true);	-- for step 1 alone (above)
	-- 1. The day: one hash full join of the bill and the platform's payments,
	--    counted in the same pass.  Per row only the test that keeps the rows
	--    that may differ (as cheap as the plain FULL JOIN's WHERE): they are
	--    kept as one array of rows, and what kind of difference each is, is
	--    worked out for them alone (step 2).  A candidate may still match: a
	--    payment refunded after the day's end, billed as succeeded.
	SELECT count(*), count(b.transaction_id), coalesce(sum(b.amount), 0),
		   count(p.payment_no), coalesce(sum(p.amount), 0),
		   array_agg(ROW(p.payment_no, p.transaction_id, p.amount, p.status,
						 b.transaction_id, b.amount, b.status)::payidem._recon_leftover)
			 FILTER (WHERE p.payment_no IS NULL OR b.transaction_id IS NULL OR p.amount <> b.amount
						OR (b.status = 'refunded') = (p.status = 'succeeded'))
	  INTO v_rows, v_bill_lines, v_bill_amount, v_payments, v_pay_amount, l_rows
	  FROM (SELECT pay.payment_no, pay.transaction_id, pay.amount, pay.status
			  FROM payidem.payment_paid pp
			  JOIN payidem.payment pay ON pay.payment_no = pp.payment_no
			 WHERE pp.channel_no = v_channel
			   AND pp.paid_at >= v_from AND pp.paid_at < v_to
			   AND pay.status = ANY (payidem._paid_payment_statuses())) p
	  FULL JOIN
		   -- only what the join needs: the hash of the bill is its biggest
		   -- cost; the payment number the channel echoes is read for the
		   -- bill-only lines alone (bo below)
		   (SELECT cb.transaction_id, cb.amount, cb.status
			  FROM payidem.channel_bill cb
			 WHERE cb.channel_no = v_channel AND cb.bill_date = v_day) b
		ON b.transaction_id = p.transaction_id;
	PERFORM set_config('enable_nestloop', 'off', true);	-- (the function's SET restores it at exit)
	v_matched := v_rows - coalesce(cardinality(l_rows), 0);

	-- 2. The leftovers: straddles, then the day's differences replace its
	--    open ones; one statement, one snapshot.
	WITH r AS MATERIALIZED (
		SELECT u.p_no, u.p_txn, u.p_amount, u.p_status, u.b_txn, u.b_amount, u.b_status,
			   CASE
				WHEN u.p_no IS NULL THEN 'bill_only'
				WHEN u.b_txn IS NULL THEN 'platform_only'
				WHEN u.p_amount <> u.b_amount THEN 'amount_mismatch'
				WHEN (u.b_status = 'refunded' AND u.p_status = 'succeeded')
				  OR (u.b_status = 'succeeded' AND u.p_status <> 'succeeded'
					  AND payidem._refunded_by(u.p_no, u.p_status, v_to)) THEN 'status_mismatch'
				ELSE 'matched'
			   END AS kind
		  FROM unnest(l_rows) AS u
	),
	-- a bill line without a payment of the day: ours from another day (a
	-- midnight straddle), ours but not paid, or unknown.  It is ours and paid
	-- (x_paid) when the payment has this transaction id -- or has none, was
	-- paid this bill day, and is the one whose number this line alone of the
	-- day's unmatched lines echoes -- and no earlier day's bill lists the
	-- transaction with the same status (that would be billing it twice; a
	-- later day's line is the repeat, so re-running this day changes nothing).
	bo AS (
		SELECT r.b_txn, bn.b_no, r.b_amount, r.b_status,
			   x.payment_no AS x_no, x.order_no AS x_order, x.amount AS x_amount, x.status AS x_status,
			   coalesce(x.by_txn AND x.status = ANY (payidem._paid_payment_statuses()), false)
			   AND NOT (coalesce(x.by_no, false)
						AND count(*) OVER (PARTITION BY x.by_no, x.payment_no) > 1)
			   AND NOT EXISTS (SELECT 1 FROM payidem.channel_bill cb
								WHERE cb.channel_no = v_channel AND cb.transaction_id = r.b_txn
								  AND cb.bill_date < v_day AND cb.status = r.b_status) AS x_paid,
			   CASE WHEN x.by_txn THEN payidem._refunded_by(x.payment_no, x.status, v_to) ELSE false END AS x_refunded,
			   coalesce(x.paid_at >= v_from AND x.paid_at < v_to, false) AS x_of_the_day
		  FROM r
		 -- (LIMIT 1, the line is unique: a look-up per line, never a hash
		 -- join against the whole bill)
		 CROSS JOIN LATERAL (
				SELECT cb.payment_no AS b_no
				  FROM payidem.channel_bill cb
				 WHERE cb.channel_no = v_channel AND cb.bill_date = v_day AND cb.transaction_id = r.b_txn
				 LIMIT 1) bn
		  LEFT JOIN LATERAL (
				SELECT pay.payment_no, pay.order_no, pay.amount, pay.status, true AS by_txn, false AS by_no,
					   pay.paid_at
				  FROM payidem.payment_paid pp
				 -- the payment by its key (LIMIT: a look-up, never a hash
				 -- of every payment)
				 CROSS JOIN LATERAL (
						SELECT p1.payment_no, p1.order_no, p1.amount, p1.status, p1.paid_at
						  FROM payidem.payment p1
						 WHERE p1.payment_no = pp.payment_no
						 LIMIT 1) pay
				 WHERE pp.channel_no = v_channel AND pp.transaction_id = r.b_txn
				UNION ALL
				-- else the payment number the channel echoes: the same payment
				-- if ours has no transaction id (a success reported without
				-- one) and was paid this bill day, otherwise for the record only
				SELECT pay.payment_no, pay.order_no, pay.amount, pay.status,
					   pay.transaction_id IS NULL AND pay.paid_at >= v_from AND pay.paid_at < v_to,
					   pay.transaction_id IS NULL, pay.paid_at
				  FROM payidem.payment pay
				 WHERE pay.payment_no = bn.b_no AND pay.channel_no = v_channel
				LIMIT 1) x ON true
		 WHERE r.kind = 'bill_only'
	),
	-- a payment of the day missing from the bill: in the bill of another day?
	-- (One without a transaction id is in this bill if a line echoing its
	-- number was matched to it above.)
	po AS (
		SELECT r.p_no, r.p_txn, r.p_amount, r.p_status,
			   EXISTS (SELECT 1 FROM payidem.channel_bill cb
						WHERE cb.channel_no = v_channel AND cb.transaction_id = r.p_txn
						  AND cb.bill_date <> v_day) AS elsewhere
		  FROM r
		 WHERE r.kind = 'platform_only'
		   AND NOT (r.p_txn IS NULL AND EXISTS (SELECT 1 FROM bo WHERE bo.x_no = r.p_no AND bo.x_paid))
	),
	found AS MATERIALIZED (
		SELECT r.kind AS diff_type, r.p_txn AS transaction_id, r.p_no AS payment_no,
			   r.p_amount AS platform_amount, r.b_amount AS channel_amount,
			   r.p_status AS platform_status, r.b_status AS channel_status
		  FROM r
		 WHERE r.kind IN ('amount_mismatch', 'status_mismatch')
		UNION ALL
		SELECT 'platform_only', po.p_txn, po.p_no, po.p_amount, NULL, po.p_status, NULL
		  FROM po
		 WHERE NOT po.elsewhere
		UNION ALL
		SELECT s.diff_type, s.b_txn, coalesce(s.x_no, s.b_no),
			   CASE WHEN s.x_paid THEN s.x_amount END, s.b_amount, s.x_status, s.b_status
		  FROM (SELECT bo.*,
					   CASE
						WHEN NOT bo.x_paid THEN 'channel_only'
						WHEN bo.x_amount <> bo.b_amount THEN 'amount_mismatch'
						WHEN (bo.b_status = 'refunded' AND bo.x_status = 'succeeded')
						  OR (bo.b_status = 'succeeded' AND bo.x_refunded) THEN 'status_mismatch'
					   END AS diff_type
				  FROM bo) s
		 WHERE s.diff_type IS NOT NULL
	),
	-- platform_only differences of other days that this bill explains
	auto AS (
		UPDATE payidem.reconciliation rc
		   SET handle_status = 'auto_resolved', handled_at = now(), handled_by = 'payidem.reconcile',
			   note = format('found in the bill of %s (%s)', to_char(v_day, 'YYYY-MM-DD'), v_batch),
			   updated_at = now()
		 WHERE rc.channel_no = v_channel
		   AND (rc.transaction_id = ANY (ARRAY(SELECT bo.b_txn FROM bo WHERE bo.x_paid))
				OR (rc.transaction_id IS NULL
					AND rc.payment_no = ANY (ARRAY(SELECT bo.x_no FROM bo WHERE bo.x_paid))))
		   AND rc.diff_type = 'platform_only' AND rc.handle_status = 'open'
		   AND rc.bill_date <> v_day
		RETURNING rc.recon_id
	),
	-- open differences found again keep their recon_id, with today's values
	kept AS (
		UPDATE payidem.reconciliation rc
		   SET recon_batch_no = v_batch, payment_no = f.payment_no,
			   platform_amount = f.platform_amount, channel_amount = f.channel_amount,
			   platform_status = f.platform_status, channel_status = f.channel_status,
			   updated_at = now()
		  FROM found f
		 WHERE rc.channel_no = v_channel AND rc.bill_date = v_day AND rc.handle_status = 'open'
		   AND rc.diff_type = f.diff_type
		   AND (rc.transaction_id IS NULL) = (f.transaction_id IS NULL)
		   AND coalesce(rc.transaction_id, rc.payment_no) = coalesce(f.transaction_id, f.payment_no)
		RETURNING rc.recon_id
	),
	-- open differences not found again are gone (bill corrected, payment fixed)
	dropped AS (
		DELETE FROM payidem.reconciliation rc
		 WHERE rc.channel_no = v_channel AND rc.bill_date = v_day AND rc.handle_status = 'open'
		   AND NOT EXISTS (SELECT 1 FROM found f
							WHERE f.diff_type = rc.diff_type
							  AND (f.transaction_id IS NULL) = (rc.transaction_id IS NULL)
							  AND coalesce(f.transaction_id, f.payment_no) = coalesce(rc.transaction_id, rc.payment_no))
		RETURNING rc.recon_id
	),
	-- the anomaly of a channel_only difference that is gone goes with it
	settled AS (
		UPDATE payidem.anomaly a
		   SET handle_status = 'handled', handled_at = now(), handled_by = 'payidem.reconcile',
			   note = format('its difference is gone in %s (the bill no longer shows it)', v_batch),
			   updated_at = now()
		 WHERE a.kind = 'channel_only' AND a.handle_status = 'open' AND a.channel_no = v_channel
		   AND a.detail ->> 'bill_date' = to_char(v_day, 'YYYY-MM-DD')
		   AND (a.detail ->> 'recon_id')::bigint IN (SELECT d.recon_id FROM dropped d)
		RETURNING a.anomaly_id
	),
	-- new ones; one a person handled or ignored is not opened again
	added AS (
		INSERT INTO payidem.reconciliation AS rc
			(recon_batch_no, channel_no, bill_date, diff_type, transaction_id, payment_no,
			 platform_amount, channel_amount, platform_status, channel_status)
		SELECT v_batch, v_channel, v_day, f.diff_type, f.transaction_id, f.payment_no,
			   f.platform_amount, f.channel_amount, f.platform_status, f.channel_status
		  FROM found f
		 WHERE NOT EXISTS (SELECT 1 FROM payidem.reconciliation e
							WHERE e.channel_no = v_channel AND e.bill_date = v_day
							  AND e.diff_type = f.diff_type
							  AND (e.transaction_id IS NULL) = (f.transaction_id IS NULL)
							  AND coalesce(e.transaction_id, e.payment_no) = coalesce(f.transaction_id, f.payment_no))
		RETURNING rc.recon_id, rc.diff_type, rc.transaction_id, rc.channel_amount
	),
	-- money taken without a record of ours: an anomaly, once per difference
	alerted AS (
		INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail)
		SELECT 'channel_only', bo.x_order, bo.x_no, v_channel, a.channel_amount,
			   jsonb_strip_nulls(jsonb_build_object(
				   'transaction_id', a.transaction_id,
				   'bill_date', to_char(v_day, 'YYYY-MM-DD'),
				   'recon_id', a.recon_id,
				   'recon_batch_no', v_batch,
				   'channel_status', bo.b_status,
				   'channel_payment_no', bo.b_no,
				   'platform_status', bo.x_status))
		  FROM added a
		  JOIN bo ON bo.b_txn = a.transaction_id
		 WHERE a.diff_type = 'channel_only'
		-- one per channel, day and transaction; one that a run closed because
		-- its difference was gone is opened again now that it is back (one a
		-- person handled stays as the person left it)
		ON CONFLICT (channel_no, (detail ->> 'bill_date'), (detail ->> 'transaction_id'))
			WHERE kind = 'channel_only'
			DO UPDATE SET handle_status = 'open', handled_at = NULL, handled_by = NULL, note = NULL,
						  amount = EXCLUDED.amount, detail = EXCLUDED.detail, updated_at = now()
			WHERE anomaly.handled_by = 'payidem.reconcile' AND anomaly.handle_status <> 'open'
		RETURNING anomaly_id
	)
	SELECT (SELECT count(*) FROM r WHERE r.kind = 'matched') AS matched_candidates,
		   (SELECT count(*) FROM found f WHERE f.diff_type = 'platform_only') AS platform_only,
		   (SELECT count(*) FROM found f WHERE f.diff_type = 'channel_only') AS channel_only,
		   (SELECT count(*) FROM found f WHERE f.diff_type = 'amount_mismatch') AS amount_mismatch,
		   (SELECT count(*) FROM found f WHERE f.diff_type = 'status_mismatch') AS status_mismatch,
		   (SELECT count(*) FROM bo
			 WHERE bo.x_paid AND bo.x_amount = bo.b_amount
			   AND NOT ((bo.b_status = 'refunded' AND bo.x_status = 'succeeded')
						OR (bo.b_status = 'succeeded' AND bo.x_refunded))) AS matched_across,
		   (SELECT count(*) FROM bo WHERE bo.x_paid AND NOT bo.x_of_the_day)
			 + (SELECT count(*) FROM po WHERE po.elsewhere) AS straddled,
		   (SELECT count(*) FROM auto) AS auto_resolved,
		   (SELECT count(*) FROM kept) + (SELECT count(*) FROM dropped)
			 + (SELECT count(*) FROM alerted) AS touched
	  INTO n;

	UPDATE payidem.recon_batch b
	   SET status = 'done', finished_at = clock_timestamp(),
		   matched = v_matched + n.matched_candidates + n.matched_across,
		   platform_only = n.platform_only, channel_only = n.channel_only,
		   amount_mismatch = n.amount_mismatch, status_mismatch = n.status_mismatch,
		   bill_lines = v_bill_lines, bill_amount_total = v_bill_amount,
		   platform_payments = v_payments, platform_amount_total = v_pay_amount,
		   straddled = n.straddled, auto_resolved = n.auto_resolved
	 WHERE b.recon_batch_no = v_batch;

	RETURN QUERY SELECT v_batch, v_matched + n.matched_candidates + n.matched_across, n.platform_only, n.channel_only,
						n.amount_mismatch, n.status_mismatch;
END
$$;
COMMENT ON FUNCTION payidem.reconcile(text, date, boolean) IS
	'Reconcile a channel''s bill of one day (cut in payidem.bill_timezone) against the platform''s payments (55000 if no bill line of that day is loaded, unless allow_empty): one hash full join on transaction_id; stores only the differences (platform_only, channel_only, amount_mismatch, status_mismatch), replacing the day''s open ones and keeping handled ones; auto-resolves midnight straddles; a channel_only difference also raises an anomaly.';

-- How a person closes a difference or an anomaly: one rule for both.
CREATE FUNCTION payidem._check_resolution(what text, handle_status text, note text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF handle_status IS NULL OR handle_status NOT IN ('handled', 'ignored') THEN
		RAISE EXCEPTION 'invalid handle status %', coalesce(quote_literal(left(handle_status, 64)), 'NULL') USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('A person resolves %s as handled or ignored.', what);
	END IF;
	IF length(note) > 1024 THEN
		RAISE EXCEPTION 'note too long' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The note has %s characters; at most 1024 are kept.', length(note));
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._check_resolution(text, text, text) IS
	'Internal to resolve_diff() and resolve_anomaly(): handle_status handled or ignored, a note of at most 1024 characters (22023).';

CREATE FUNCTION payidem.resolve_diff(recon_id bigint, handle_status text, note text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	v_id		bigint := resolve_diff.recon_id;
	v_status	text := resolve_diff.handle_status;
	v_note		text := resolve_diff.note;
	d			payidem.reconciliation;
BEGIN
	PERFORM payidem._require('recon_id', resolve_diff.recon_id::text);
	PERFORM payidem._check_resolution('a difference', v_status, v_note);

	UPDATE payidem.reconciliation rc
	   SET handle_status = v_status, handled_by = session_user, handled_at = now(),
		   note = v_note, updated_at = now()
	 WHERE rc.recon_id = v_id AND rc.handle_status = 'open'
	RETURNING rc.* INTO d;
	IF NOT FOUND THEN
		SELECT rc.* INTO d FROM payidem.reconciliation rc WHERE rc.recon_id = v_id;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'reconciliation difference % does not exist', coalesce(v_id::text, 'NULL') USING
				ERRCODE = 'PI009';
		END IF;
		RAISE EXCEPTION 'reconciliation difference % is not open', v_id USING
			ERRCODE = 'PI002',
			DETAIL = format('It is already %s%s.', d.handle_status,
							CASE WHEN d.handled_by IS NOT NULL THEN ' by ' || d.handled_by ELSE '' END),
			HINT = 'Only an open difference can be resolved.';
	END IF;

	-- the alarm raised for a channel_only difference is closed with it
	IF d.diff_type = 'channel_only' THEN
		UPDATE payidem.anomaly a
		   SET handle_status = v_status, handled_by = session_user, handled_at = now(),
			   note = v_note, updated_at = now()
		 WHERE a.kind = 'channel_only' AND a.channel_no = d.channel_no
		   AND a.detail ->> 'bill_date' = to_char(d.bill_date, 'YYYY-MM-DD')
		   AND a.detail ->> 'transaction_id' = d.transaction_id
		   AND a.handle_status = 'open';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.resolve_diff(bigint, text, text) IS
	'A person closes an open reconciliation difference as handled or ignored (22023 otherwise; PI009 unknown id; PI002 not open), recording who, when and a note; closes the anomaly of a channel_only difference too.';

-- The daily report: the last run of each channel and day, and what is still open.
CREATE VIEW payidem.recon_summary AS
SELECT b.channel_no, b.bill_date,
	   b.recon_batch_no AS last_batch_no, b.finished_at, b.bill_timezone,
	   b.bill_lines, b.bill_amount_total, b.platform_payments, b.platform_amount_total,
	   b.matched, b.platform_only, b.channel_only, b.amount_mismatch, b.status_mismatch,
	   b.straddled,
	   coalesce(d.open_count, 0) AS open_count,
	   coalesce(d.open_amount, 0) AS open_amount,
	   coalesce(d.open_channel_only, 0) AS open_channel_only,
	   coalesce(d.handled_count, 0) AS handled_count,
	   coalesce(d.ignored_count, 0) AS ignored_count,
	   coalesce(d.auto_resolved_count, 0) AS auto_resolved_count
  FROM (SELECT DISTINCT ON (rb.channel_no, rb.bill_date) rb.*
		  FROM payidem.recon_batch rb
		 WHERE rb.status = 'done'
		 ORDER BY rb.channel_no, rb.bill_date, rb.started_at DESC,
				  pg_catalog.length(rb.recon_batch_no) DESC, rb.recon_batch_no DESC) b
  LEFT JOIN (SELECT rc.channel_no, rc.bill_date,
					count(*) FILTER (WHERE rc.handle_status = 'open') AS open_count,
					sum(CASE rc.diff_type
						 WHEN 'platform_only' THEN rc.platform_amount
						 WHEN 'channel_only' THEN rc.channel_amount
						 WHEN 'amount_mismatch' THEN pg_catalog.abs(rc.platform_amount - rc.channel_amount)
						 ELSE coalesce(rc.channel_amount, rc.platform_amount)
						END) FILTER (WHERE rc.handle_status = 'open') AS open_amount,
					count(*) FILTER (WHERE rc.handle_status = 'open' AND rc.diff_type = 'channel_only') AS open_channel_only,
					count(*) FILTER (WHERE rc.handle_status = 'handled') AS handled_count,
					count(*) FILTER (WHERE rc.handle_status = 'ignored') AS ignored_count,
					count(*) FILTER (WHERE rc.handle_status = 'auto_resolved') AS auto_resolved_count
			   FROM payidem.reconciliation rc
			  GROUP BY rc.channel_no, rc.bill_date) d
	ON d.channel_no = b.channel_no AND d.bill_date = b.bill_date;
COMMENT ON VIEW payidem.recon_summary IS
	'Daily reconciliation report per channel and bill day: the last run''s counts and totals, and the differences still open (count, money concerned, channel_only among them) or closed by a person or automatically.';
COMMENT ON COLUMN payidem.recon_summary.open_amount IS
	'Money concerned by the open differences, minor units: the amount of a platform_only, channel_only or status_mismatch, the gap of an amount_mismatch.';

-- (end of reconciliation functions)

------------------------------------------------------------------------------
-- Scale-out: shard-side helpers for the payidem_router extension (DESIGN section 9)
------------------------------------------------------------------------------
--
-- A shard is an ordinary payidem database whose payidem.shard_id is its
-- PL/Proxy partition number, so the shard digits inside every order, payment
-- and refund number (characters 17-18) say which partition holds the row.
-- The router (payidem_router) calls the API functions of the shards with the
-- same names; these helpers cover what a single database never needed:
--
--   shard_prepare(shard)      make this database partition <shard> (once)
--   shard_info()              what the router checks: partition, database, key
--   import_merchant(...)      the copy of a merchant made on partition 0
--   import_merchant_secret()  the copy of a rotated merchant secret
--   import_channel(...)       create a channel, or accept an identical one
--   load_bill_part(...)       keep this shard's lines of a channel bill
--   bill_unplaced_lines(...)  the lines of a bill no payment number places
--   export_reference()        partition 0's reference data, for sync_shards()
--   import_reference(doc)     make this shard's reference data that of partition 0
--   _idem_key_held(key)       whether this shard holds an idempotency key
--   _idem_keys_misplaced(n)   whether it holds one that n partitions put elsewhere
--
-- The import functions are idempotent: the router replays them on every
-- partition (RUN ON ALL), including the one where the row was made, and an
-- operator may replay them after a shard was down.

-- Reconciliation difference ids, like order numbers, name their partition:
-- on partition s they start at s * 10^15 (router: resolve_diff routes by
-- recon_id / 10^15).
CREATE FUNCTION payidem.shard_prepare(shard_id integer)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_floor bigint;
BEGIN
	IF shard_id IS NULL OR shard_id NOT BETWEEN 0 AND 99 THEN
		RAISE EXCEPTION 'invalid shard number' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The shard number was %s; it must be from 0 to 99 (the PL/Proxy partition number).',
							coalesce(shard_id::text, 'NULL'));
	END IF;
	IF EXISTS (SELECT 1 FROM payidem."order") AND payidem.shard_id() <> shard_id THEN
		RAISE EXCEPTION 'this database already holds orders of shard %', payidem.shard_id() USING
			ERRCODE = 'object_not_in_prerequisite_state',
			DETAIL = format('Its order numbers carry shard digits %s; it cannot become partition %s.',
							lpad(payidem.shard_id()::text, 2, '0'), shard_id),
			HINT = 'Give a shard a number once, before it takes orders.';
	END IF;
	-- new sessions of this database, and this session from now on
	EXECUTE format('ALTER DATABASE %I SET payidem.shard_id = %s', current_database(), shard_id);
	PERFORM set_config('payidem.shard_id', shard_id::text, false);
	-- the ids the router routes by: reconciliation differences and anomalies
	-- of shard i start above i * 10^15
	v_floor := shard_id::bigint * 1000000000000000;
	IF shard_id > 0 AND (SELECT s.last_value FROM payidem.reconciliation_recon_id_seq s) < v_floor THEN
		PERFORM setval('payidem.reconciliation_recon_id_seq', v_floor, true);
	END IF;
	IF shard_id > 0 AND (SELECT s.last_value FROM payidem.anomaly_anomaly_id_seq s) < v_floor THEN
		PERFORM setval('payidem.anomaly_anomaly_id_seq', v_floor, true);
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.shard_prepare(integer) IS
	'Make this database PL/Proxy partition <shard_id> of a payidem cluster: sets payidem.shard_id for the database (ALTER DATABASE) and moves reconciliation ids to shard_id * 10^15 so they name their partition. Once, before the shard takes orders.';

CREATE FUNCTION payidem.shard_id()
RETURNS integer
LANGUAGE sql STABLE		-- inlined (see _utc)
RETURN coalesce(nullif(pg_catalog.current_setting('payidem.shard_id', true), ''), '0')::integer;
COMMENT ON FUNCTION payidem.shard_id() IS
	'This database''s shard number (payidem.shard_id): the partition number the router knows it by.';

CREATE FUNCTION payidem.shard_info(
	OUT shard_id integer, OUT database name, OUT master_key_version integer,
	OUT merchants bigint, OUT channels bigint, OUT orders bigint)
RETURNS record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT payidem.shard_id(), pg_catalog.current_database(), payidem.master_key_version(),
		   (SELECT pg_catalog.count(*) FROM payidem.merchant),
		   (SELECT pg_catalog.count(*) FROM payidem.channel),
		   (SELECT pg_catalog.count(*) FROM payidem."order");
END;
COMMENT ON FUNCTION payidem.shard_info() IS
	'What the router''s cluster_check() compares: shard number, database, master key version (55000 if no key), counts of merchants, channels, orders.';

-- Whether the merchant's current secret is p_secret: decides whether an import
-- is a replay.  The decrypted secret never leaves the function.
CREATE FUNCTION payidem._current_secret_is(p_merchant_no text, p_secret text)
RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	s payidem.merchant_secret;
BEGIN
	SELECT * INTO s FROM payidem.merchant_secret x
	 WHERE x.merchant_no OPERATOR(pg_catalog.=) p_merchant_no AND x.valid_until IS NULL;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	RETURN payidem._open(payidem._secret_aad(s.merchant_no, s.secret_version),
						 s.key_version, s.nonce, s.ciphertext, s.auth_tag)
		   OPERATOR(pg_catalog.=) pg_catalog.convert_to(p_secret, 'UTF8');
END
$$;

CREATE FUNCTION payidem.import_merchant(merchant_no text, name text, merchant_type text, fee_rate numeric,
	settle_cycle text, api_key text, api_secret text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	m        payidem.merchant;
	v_sealed record;
BEGIN
	PERFORM payidem._check_code('merchant number', import_merchant.merchant_no, '^M[0-9A-HJKMNP-TV-Z]{15}$',
		'a merchant number is M followed by 15 Crockford base32 characters.');
	PERFORM payidem._check_code('API key', import_merchant.api_key, '^[0-9A-Za-z_-]{16,64}$',
		'an API key has 16 to 64 characters of 0-9, A-Z, a-z, _ and -.');
	IF api_secret IS NULL OR length(api_secret) NOT BETWEEN 16 AND 256 THEN
		RAISE EXCEPTION 'invalid API secret' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = 'An API secret has 16 to 256 characters.';	-- never the value
	END IF;
	PERFORM payidem._check_merchant_fields(name, import_merchant.merchant_type,
										   import_merchant.fee_rate, import_merchant.settle_cycle);

	INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, settle_cycle, api_key)
	VALUES (import_merchant.merchant_no, btrim(name), import_merchant.merchant_type, import_merchant.fee_rate,
			import_merchant.settle_cycle, import_merchant.api_key)
	ON CONFLICT DO NOTHING;
	IF FOUND THEN
		v_sealed := payidem._seal(payidem._secret_aad(import_merchant.merchant_no, 1), convert_to(api_secret, 'UTF8'));
		INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag)
		VALUES (import_merchant.merchant_no, 1, v_sealed.key_version, v_sealed.nonce, v_sealed.ciphertext, v_sealed.auth_tag);
		RETURN 'imported';
	END IF;

	-- already here (partition 0 made it, or a replay): it must be the same merchant
	SELECT * INTO m FROM payidem.merchant x WHERE x.merchant_no OPERATOR(pg_catalog.=) import_merchant.merchant_no;
	IF NOT FOUND OR m.api_key <> import_merchant.api_key OR m.merchant_type <> import_merchant.merchant_type
	   OR m.fee_rate <> import_merchant.fee_rate OR m.settle_cycle <> import_merchant.settle_cycle
	   OR m.merchant_name <> btrim(name)
	   OR NOT payidem._current_secret_is(m.merchant_no, api_secret) THEN
		RAISE EXCEPTION 'merchant % exists on shard % with other attributes',
			import_merchant.merchant_no, payidem.shard_id() USING
			ERRCODE = 'duplicate_object',
			DETAIL = CASE WHEN NOT FOUND THEN format('The API key %s belongs to another merchant.', import_merchant.api_key)
						  ELSE 'Its name, type, rate, settlement cycle, API key or current secret differ from the copy.' END,
			HINT = 'Reference data must be written through the router, which writes the same row on every shard.';
	END IF;
	RETURN 'present';
END
$$;
COMMENT ON FUNCTION payidem.import_merchant(text, text, text, numeric, text, text, text) IS
	'Scale-out: store a merchant created on partition 0 (same merchant_no, api_key and secret, the secret sealed with this shard''s master key). Idempotent: returns imported or present; duplicate_object if a different merchant holds the number or key.';

CREATE FUNCTION payidem.import_merchant_secret(merchant_no text, api_secret text, grace interval DEFAULT '24 hours')
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_sealed  record;
	v_version integer;
BEGIN
	IF api_secret IS NULL OR length(api_secret) NOT BETWEEN 16 AND 256 THEN
		RAISE EXCEPTION 'invalid API secret' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = 'An API secret has 16 to 256 characters.';
	END IF;
	PERFORM payidem._merchant_for_update(import_merchant_secret.merchant_no);
	IF payidem._current_secret_is(import_merchant_secret.merchant_no, api_secret) THEN
		RETURN 'present';
	END IF;
	-- the same rotation (grace windows and all) as rotate_merchant_secret(),
	-- then its fresh random secret is replaced by the one of partition 0
	PERFORM payidem.rotate_merchant_secret(import_merchant_secret.merchant_no, grace);
	SELECT s.secret_version INTO v_version FROM payidem.merchant_secret s
	 WHERE s.merchant_no OPERATOR(pg_catalog.=) import_merchant_secret.merchant_no AND s.valid_until IS NULL;
	v_sealed := payidem._seal(payidem._secret_aad(import_merchant_secret.merchant_no, v_version),
							  convert_to(api_secret, 'UTF8'));
	UPDATE payidem.merchant_secret s
	   SET key_version = v_sealed.key_version, nonce = v_sealed.nonce,
		   ciphertext = v_sealed.ciphertext, auth_tag = v_sealed.auth_tag
	 WHERE s.merchant_no OPERATOR(pg_catalog.=) import_merchant_secret.merchant_no AND s.secret_version = v_version;
	RETURN 'rotated';
END
$$;
COMMENT ON FUNCTION payidem.import_merchant_secret(text, text, interval) IS
	'Scale-out: make a secret rotated on partition 0 the current secret here too (same grace rule as rotate_merchant_secret). Returns rotated, or present if it already is current.';

-- The same, from a file in payidem.secret_dir (see load_channel_config).
CREATE FUNCTION payidem.load_merchant_secret(merchant_no text, file_name text, grace interval DEFAULT '24 hours')
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_load_merchant_secret'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.load_merchant_secret(text, text, interval) IS
	'import_merchant_secret(merchant_no, <the text of payidem.secret_dir/file_name, one final line end dropped>, grace), read by the server so that the secret never appears in a statement (and so in no log).';

CREATE FUNCTION payidem.import_channel(channel_no text, channel_type text, fee_rate numeric,
	weight integer DEFAULT 100, allowed_merchant_types text[] DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	c payidem.channel;
BEGIN
	SELECT * INTO c FROM payidem.channel x WHERE x.channel_no OPERATOR(pg_catalog.=) import_channel.channel_no;
	IF NOT FOUND THEN
		PERFORM payidem.create_channel(channel_no, channel_type, fee_rate, weight, allowed_merchant_types);
		RETURN 'created';
	END IF;
	IF c.channel_type IS DISTINCT FROM import_channel.channel_type OR c.fee_rate IS DISTINCT FROM import_channel.fee_rate
	   OR c.weight IS DISTINCT FROM import_channel.weight
	   OR c.allowed_merchant_types IS DISTINCT FROM import_channel.allowed_merchant_types THEN
		RAISE EXCEPTION 'channel % already exists', c.channel_no USING
			ERRCODE = 'duplicate_object',
			DETAIL = format('On shard %s it is %s at rate %s, weight %s; this call asked for %s at rate %s, weight %s.',
							payidem.shard_id(), c.channel_type, c.fee_rate, c.weight,
							channel_type, fee_rate, weight),
			HINT = 'Choose another channel code, or change the existing channel.';
	END IF;
	RETURN 'present';
END
$$;
COMMENT ON FUNCTION payidem.import_channel(text, text, numeric, integer, text[]) IS
	'Scale-out: create_channel(), or nothing if an identical channel exists (a replay through the router); duplicate_object if it differs.';

-- Reference data as partition 0 holds it, for the router's sync_shards() and
-- add_shards(): merchants, their secrets, channels, channel configurations
-- and bindings, secrets and configurations in clear (each shard seals them
-- with its own master key).  Only the router's connection role may call it;
-- the document travels as a result and a bound parameter, never in a
-- statement's text.
CREATE FUNCTION payidem.export_reference()
RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT pg_catalog.jsonb_build_object(
		'merchants', (SELECT coalesce(pg_catalog.jsonb_agg(
							 pg_catalog.to_jsonb(m) OPERATOR(pg_catalog.-) 'created_at'::text
							 OPERATOR(pg_catalog.-) 'updated_at'::text ORDER BY m.merchant_no), '[]')
						FROM payidem.merchant m),
		'secrets', (SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
						   'merchant_no', s.merchant_no, 'secret_version', s.secret_version,
						   'secret', pg_catalog.convert_from(payidem._open(payidem._secret_aad(s.merchant_no, s.secret_version),
								s.key_version, s.nonce, s.ciphertext, s.auth_tag), 'UTF8'),
						   'valid_from', s.valid_from, 'valid_until', s.valid_until)
						   ORDER BY s.merchant_no, s.secret_version), '[]')
					  FROM payidem.merchant_secret s),
		'channels', (SELECT coalesce(pg_catalog.jsonb_agg(
							pg_catalog.to_jsonb(c) OPERATOR(pg_catalog.-) 'created_at'::text
							OPERATOR(pg_catalog.-) 'updated_at'::text ORDER BY c.channel_no), '[]')
					   FROM payidem.channel c),
		'configs', (SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
						   'channel_no', cc.channel_no,
						   'config', pg_catalog.convert_from(payidem._open(payidem._config_aad(cc.channel_no),
								cc.key_version, cc.nonce, cc.ciphertext, cc.auth_tag), 'UTF8')::jsonb)
						   ORDER BY cc.channel_no), '[]')
					  FROM payidem.channel_config cc),
		'bindings', (SELECT coalesce(pg_catalog.jsonb_agg(
							pg_catalog.to_jsonb(b) OPERATOR(pg_catalog.-) 'created_at'::text
							OPERATOR(pg_catalog.-) 'updated_at'::text ORDER BY b.merchant_no, b.channel_no), '[]')
					   FROM payidem.merchant_channel b));
END;
COMMENT ON FUNCTION payidem.export_reference() IS
	'Scale-out: this shard''s merchants, secrets, channels, channel configurations and bindings as one document (secrets and configurations decrypted) for the router''s sync_shards(); callable by the router''s connection role only.';

-- Make this shard's reference data what partition 0 exported: add what is
-- missing, change what differs, remove secrets and configurations partition
-- 0 does not have and disable its bindings; merchants and channels only this
-- shard has are left alone with their secrets, configurations and bindings
-- (they may hold orders) and counted.  Idempotent:
-- a second run changes nothing.
CREATE FUNCTION payidem.import_reference(reference jsonb)
RETURNS TABLE (kind text, added bigint, changed bigint, removed bigint, left_alone bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	s        record;
	v_sealed record;
	v_add    bigint;
	v_change bigint;
	v_remove bigint;
BEGIN
	IF reference IS NULL OR jsonb_typeof(reference) <> 'object'
	   OR NOT reference ?& ARRAY['merchants', 'secrets', 'channels', 'configs', 'bindings'] THEN
		RAISE EXCEPTION 'invalid reference document' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = 'It must be what payidem.export_reference() returns: an object with merchants, secrets, channels, configs and bindings.';
	END IF;
	-- a merchant closed here stays closed: partition 0 must close it too,
	-- not this shard reopen it
	PERFORM payidem._merchant_status_change(m.merchant_no, m.status, r.status,
			format('It is closed on shard %s: close it everywhere through the router (payidem.close_merchant(%L)), then repeat.',
				   payidem.shard_id(), m.merchant_no))
	   FROM jsonb_populate_recordset(NULL::payidem.merchant, reference -> 'merchants') r
	   JOIN payidem.merchant m ON m.merchant_no = r.merchant_no
	  WHERE m.status IS DISTINCT FROM r.status;

	-- merchants
	WITH r AS (SELECT * FROM jsonb_populate_recordset(NULL::payidem.merchant, reference -> 'merchants')),
	w AS (
		INSERT INTO payidem.merchant AS m (merchant_no, merchant_name, merchant_type, fee_rate, settle_cycle, status, api_key)
		SELECT r.merchant_no, r.merchant_name, r.merchant_type, r.fee_rate, r.settle_cycle, r.status, r.api_key FROM r
		ON CONFLICT ON CONSTRAINT merchant_pkey DO UPDATE
		   SET merchant_name = excluded.merchant_name, merchant_type = excluded.merchant_type,
			   fee_rate = excluded.fee_rate, settle_cycle = excluded.settle_cycle, status = excluded.status,
			   api_key = excluded.api_key, updated_at = now()
		 WHERE (m.merchant_name, m.merchant_type, m.fee_rate, m.settle_cycle, m.status, m.api_key)
			   IS DISTINCT FROM (excluded.merchant_name, excluded.merchant_type, excluded.fee_rate,
								 excluded.settle_cycle, excluded.status, excluded.api_key)
		RETURNING m.xmax = 0 AS inserted)
	SELECT count(*) FILTER (WHERE w.inserted), count(*) FILTER (WHERE NOT w.inserted) INTO v_add, v_change FROM w;
	kind := 'merchants'; added := v_add; changed := v_change; removed := 0;
	left_alone := (SELECT count(*) FROM payidem.merchant m
					WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'merchants') e
									   WHERE e ->> 'merchant_no' = m.merchant_no));
	RETURN NEXT;

	-- secrets: the same versions, windows and secrets; first those this
	-- shard has and partition 0 has not, then the ones that stop being
	-- current, then the rest (one current secret per merchant at all times)
	v_add := 0; v_change := 0;
	WITH r AS (SELECT * FROM jsonb_to_recordset(reference -> 'secrets') AS x(merchant_no text, secret_version integer))
	DELETE FROM payidem.merchant_secret s
	 WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'merchants') e
					WHERE e ->> 'merchant_no' = s.merchant_no)
	   AND NOT EXISTS (SELECT 1 FROM r WHERE r.merchant_no = s.merchant_no AND r.secret_version = s.secret_version);
	GET DIAGNOSTICS v_remove = ROW_COUNT;
	FOR s IN
		SELECT r.*, x.merchant_no IS NOT NULL AS present,
			   x.merchant_no IS NOT NULL
			   AND (x.valid_from, x.valid_until) IS NOT DISTINCT FROM (r.valid_from, r.valid_until)
			   AND payidem._open(payidem._secret_aad(x.merchant_no, x.secret_version),
								 x.key_version, x.nonce, x.ciphertext, x.auth_tag)
				   = convert_to(r.secret, 'UTF8') AS same
		  FROM jsonb_to_recordset(reference -> 'secrets')
			   AS r(merchant_no text, secret_version integer, secret text, valid_from timestamptz, valid_until timestamptz)
		  LEFT JOIN payidem.merchant_secret x ON x.merchant_no = r.merchant_no AND x.secret_version = r.secret_version
		 ORDER BY r.valid_until IS NULL, r.merchant_no, r.secret_version
	LOOP
		CONTINUE WHEN s.same;
		v_sealed := payidem._seal(payidem._secret_aad(s.merchant_no, s.secret_version), convert_to(s.secret, 'UTF8'));
		IF s.present THEN
			UPDATE payidem.merchant_secret x
			   SET key_version = v_sealed.key_version, nonce = v_sealed.nonce, ciphertext = v_sealed.ciphertext,
				   auth_tag = v_sealed.auth_tag, valid_from = s.valid_from, valid_until = s.valid_until
			 WHERE x.merchant_no = s.merchant_no AND x.secret_version = s.secret_version;
			v_change := v_change + 1;
		ELSE
			INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext,
												 auth_tag, valid_from, valid_until)
			VALUES (s.merchant_no, s.secret_version, v_sealed.key_version, v_sealed.nonce, v_sealed.ciphertext,
					v_sealed.auth_tag, s.valid_from, s.valid_until);
			v_add := v_add + 1;
		END IF;
	END LOOP;
	kind := 'secrets'; added := v_add; changed := v_change; removed := v_remove; left_alone := 0;
	RETURN NEXT;

	-- channels
	WITH r AS (SELECT * FROM jsonb_populate_recordset(NULL::payidem.channel, reference -> 'channels')),
	w AS (
		INSERT INTO payidem.channel AS c (channel_no, channel_type, fee_rate, status, weight, allowed_merchant_types,
										  single_limit, daily_limit)
		SELECT r.channel_no, r.channel_type, r.fee_rate, r.status, r.weight, r.allowed_merchant_types,
			   r.single_limit, r.daily_limit FROM r
		ON CONFLICT ON CONSTRAINT channel_pkey DO UPDATE
		   SET channel_type = excluded.channel_type, fee_rate = excluded.fee_rate, status = excluded.status,
			   weight = excluded.weight, allowed_merchant_types = excluded.allowed_merchant_types,
			   single_limit = excluded.single_limit, daily_limit = excluded.daily_limit, updated_at = now()
		 WHERE (c.channel_type, c.fee_rate, c.status, c.weight, c.allowed_merchant_types, c.single_limit, c.daily_limit)
			   IS DISTINCT FROM (excluded.channel_type, excluded.fee_rate, excluded.status, excluded.weight,
								 excluded.allowed_merchant_types, excluded.single_limit, excluded.daily_limit)
		RETURNING c.xmax = 0 AS inserted)
	SELECT count(*) FILTER (WHERE w.inserted), count(*) FILTER (WHERE NOT w.inserted) INTO v_add, v_change FROM w;
	kind := 'channels'; added := v_add; changed := v_change; removed := 0;
	left_alone := (SELECT count(*) FROM payidem.channel c
					WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'channels') e
									   WHERE e ->> 'channel_no' = c.channel_no));
	RETURN NEXT;

	-- channel configurations
	v_add := 0; v_change := 0;
	DELETE FROM payidem.channel_config cc
	 WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'channels') e
					WHERE e ->> 'channel_no' = cc.channel_no)
	   AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'configs') e
						WHERE e ->> 'channel_no' = cc.channel_no);
	GET DIAGNOSTICS v_remove = ROW_COUNT;
	FOR s IN
		SELECT r.*, x.channel_no IS NOT NULL AS present,
			   x.channel_no IS NOT NULL
			   AND convert_from(payidem._open(payidem._config_aad(x.channel_no), x.key_version, x.nonce,
											  x.ciphertext, x.auth_tag), 'UTF8')::jsonb = r.config AS same
		  FROM jsonb_to_recordset(reference -> 'configs') AS r(channel_no text, config jsonb)
		  LEFT JOIN payidem.channel_config x ON x.channel_no = r.channel_no
	LOOP
		CONTINUE WHEN s.same;
		PERFORM payidem.set_channel_config(s.channel_no, s.config);
		IF s.present THEN v_change := v_change + 1; ELSE v_add := v_add + 1; END IF;
	END LOOP;
	kind := 'configs'; added := v_add; changed := v_change; removed := v_remove; left_alone := 0;
	RETURN NEXT;

	-- bindings; one partition 0 does not have is disabled here (unbound)
	WITH r AS (SELECT * FROM jsonb_populate_recordset(NULL::payidem.merchant_channel, reference -> 'bindings')),
	w AS (
		INSERT INTO payidem.merchant_channel AS b (merchant_no, channel_no, fee_rate, single_limit, daily_limit,
												   status, weight)
		SELECT r.merchant_no, r.channel_no, r.fee_rate, r.single_limit, r.daily_limit, r.status, r.weight FROM r
		ON CONFLICT ON CONSTRAINT merchant_channel_pkey DO UPDATE
		   SET fee_rate = excluded.fee_rate, single_limit = excluded.single_limit, daily_limit = excluded.daily_limit,
			   status = excluded.status, weight = excluded.weight, updated_at = now()
		 WHERE (b.fee_rate, b.single_limit, b.daily_limit, b.status, b.weight)
			   IS DISTINCT FROM (excluded.fee_rate, excluded.single_limit, excluded.daily_limit,
								 excluded.status, excluded.weight)
		RETURNING b.xmax = 0 AS inserted)
	SELECT count(*) FILTER (WHERE w.inserted), count(*) FILTER (WHERE NOT w.inserted) INTO v_add, v_change FROM w;
	UPDATE payidem.merchant_channel b SET status = 'disabled', updated_at = now()
	 WHERE b.status <> 'disabled'
	   AND EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'merchants') e
					WHERE e ->> 'merchant_no' = b.merchant_no)
	   AND EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'channels') e
					WHERE e ->> 'channel_no' = b.channel_no)
	   AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'bindings') e
						WHERE e ->> 'merchant_no' = b.merchant_no AND e ->> 'channel_no' = b.channel_no);
	GET DIAGNOSTICS v_remove = ROW_COUNT;
	kind := 'bindings'; added := v_add; changed := v_change; removed := v_remove; left_alone := 0;
	RETURN NEXT;
END
$$;
COMMENT ON FUNCTION payidem.import_reference(jsonb) IS
	'Scale-out: make this shard''s reference data what payidem.export_reference() on partition 0 returned (missing rows added, differing ones changed, secrets and configurations partition 0 lacks removed, such bindings disabled; merchants and channels only this shard has are left alone). One row per kind with the counts; a second run changes nothing. PI002 if it would reopen a merchant closed here.';

-- The partition a channel bill line belongs to by the payment number the
-- channel echoes: its shard digits; NULL for a line without a valid number
-- of the cluster (the router places it by its transaction id, or gives it to
-- partition 0).
CREATE FUNCTION payidem._bill_line_partition(payment_no text, partitions integer)
RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN payment_no IS NOT NULL AND payidem.order_no_valid(payment_no)
				 AND pg_catalog.substr(payment_no, 17, 2)::integer < partitions
			THEN pg_catalog.substr(payment_no, 17, 2)::integer END;

-- Check a whole bill as load_bill() does, keeping nothing: a trial load,
-- rolled back.
CREATE FUNCTION payidem._bill_check(channel_no text, bill_date date, csv text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem.load_bill(channel_no, bill_date, csv);
	RAISE EXCEPTION USING ERRCODE = 'PI000', MESSAGE = 'bill checked';
EXCEPTION WHEN SQLSTATE 'PI000' THEN
	NULL;
END
$$;

-- The lines of a bill that its payment numbers do not place, with their
-- transaction ids: the router places them where the transaction's success
-- was applied (its payidem.transaction_placement), in one look-up per bill.
-- The whole bill is checked, as load_bill() checks it.
CREATE FUNCTION payidem.bill_unplaced_lines(channel_no text, bill_date date, csv text, partitions integer)
RETURNS TABLE (line_no bigint, transaction_id text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._bill_check(channel_no, bill_date, csv);
	RETURN QUERY
		SELECT b.line_no, nullif(b.fields[3], '')
		  FROM payidem._bill_lines(csv) b
		 WHERE payidem._bill_line_partition(nullif(b.fields[4], ''), partitions) IS NULL
		   AND nullif(b.fields[3], '') IS NOT NULL;
END
$$;
COMMENT ON FUNCTION payidem.bill_unplaced_lines(text, date, text, integer) IS
	'Scale-out: the lines of a channel bill (checked whole, as load_bill() checks it) whose payment_no names no partition of a cluster of that many, with their transaction ids.';

CREATE FUNCTION payidem.load_bill_part(channel_no text, bill_date date, csv text, partitions integer,
	placed_lines bigint[] DEFAULT NULL, placed_partitions integer[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_me   integer := payidem.shard_id();
	v_mine text;
BEGIN
	IF partitions IS NULL OR partitions < 1 OR v_me >= partitions THEN
		RAISE EXCEPTION 'shard % is not a partition of a %-partition cluster', v_me, partitions USING
			ERRCODE = 'invalid_parameter_value',
			HINT = 'Check payidem.shard_id on the shards against the router''s server payidem (payidem.cluster_check()).';
	END IF;
	IF cardinality(placed_lines) IS DISTINCT FROM cardinality(placed_partitions) THEN
		RAISE EXCEPTION 'placed_lines and placed_partitions differ in length' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('%s lines, %s partitions.', coalesce(cardinality(placed_lines), 0),
							coalesce(cardinality(placed_partitions), 0));
	END IF;
	-- every shard checks the whole bill, so a bad line fails the load on all
	-- of them and none keeps a part (the router has no two-phase commit)
	PERFORM payidem._bill_check(channel_no, bill_date, csv);
	-- this shard's lines: those its payment number names, then those the
	-- router placed by transaction id, the rest on partition 0; the others
	-- become blank lines, so that line numbers in messages stay those of the
	-- whole bill
	SELECT string_agg(CASE WHEN b.line_no IS NULL
							 OR coalesce(payidem._bill_line_partition(nullif(b.fields[4], ''), partitions),
										 pl.partition, 0) = v_me
						   THEN t.line ELSE '' END,
					  chr(10) ORDER BY t.n)
	  INTO v_mine
	  FROM string_to_table(csv, chr(10)) WITH ORDINALITY AS t(line, n)
	  LEFT JOIN payidem._bill_lines(csv) b ON b.line_no = t.n
	  LEFT JOIN unnest(placed_lines, placed_partitions) AS pl(line_no, partition) ON pl.line_no = t.n;
	RETURN payidem.load_bill(channel_no, bill_date, coalesce(v_mine, ''));
END
$$;
COMMENT ON FUNCTION payidem.load_bill_part(text, date, text, integer, bigint[], integer[]) IS
	'Scale-out: load_bill() of the lines of a channel bill that belong to this shard: those whose payment_no names it, and those the router placed here by transaction id (placed_lines[i] on placed_partitions[i]); the rest belong to partition 0. The whole bill is checked first, so a bad line fails every shard alike.';

-- Idempotency keys after the router added partitions: a key made before
-- lives where the partition count of its day put it, so the router asks
-- that partition whether it holds the key (granted to application roles
-- with idem_claim: it tells no more than a claim does), and, to know when
-- the counts of before no longer matter, whether any key it holds is not
-- where today's count puts it (the router's idem_purge).  By the hash, not
-- by time: no clock decides it.
CREATE FUNCTION payidem._idem_key_held(idem_key text)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	-- (PL/pgSQL: its plan is kept, as it is on a claim's path while a growth is unsettled)
	RETURN EXISTS (SELECT 1 FROM payidem.idempotency i WHERE i.idem_key = _idem_key_held.idem_key);
END
$$;
COMMENT ON FUNCTION payidem._idem_key_held(text) IS
	'Scale-out: whether this shard holds the idempotency key (for the router, after it added partitions).';

CREATE FUNCTION payidem._idem_keys_misplaced(partitions integer)
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN EXISTS (SELECT 1 FROM payidem.idempotency i
				WHERE (pg_catalog.hashtext(i.idem_key) OPERATOR(pg_catalog.&) (partitions OPERATOR(pg_catalog.-) 1))
					  OPERATOR(pg_catalog.<>) payidem.shard_id());
COMMENT ON FUNCTION payidem._idem_keys_misplaced(integer) IS
	'Scale-out: whether this shard holds an idempotency key that hashtext(idem_key) over that many partitions puts on another partition (for the router''s idem_purge).';

REVOKE ALL ON FUNCTION payidem.shard_prepare(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem.shard_id() FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem.shard_info() FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem._current_secret_is(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem.import_merchant(text, text, text, numeric, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem.import_merchant_secret(text, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem.import_channel(text, text, numeric, integer, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem.export_reference() FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem.import_reference(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem._bill_line_partition(text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem._bill_check(text, date, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem.bill_unplaced_lines(text, date, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem.load_bill_part(text, date, text, integer, bigint[], integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem._idem_key_held(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem._idem_keys_misplaced(integer) FROM PUBLIC;

-- (end of shard helpers)

------------------------------------------------------------------------------
-- What a person should look at (DESIGN section 10)
------------------------------------------------------------------------------

CREATE FUNCTION payidem.resolve_anomaly(anomaly_id bigint, handle_status text, note text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	a payidem.anomaly;
BEGIN
	PERFORM payidem._require('anomaly_id', resolve_anomaly.anomaly_id::text);
	PERFORM payidem._check_resolution('an anomaly', resolve_anomaly.handle_status, resolve_anomaly.note);
	UPDATE payidem.anomaly x
	   SET handle_status = resolve_anomaly.handle_status, handled_by = session_user, handled_at = now(),
		   note = resolve_anomaly.note, updated_at = now()
	 WHERE x.anomaly_id = resolve_anomaly.anomaly_id AND x.handle_status = 'open'
	RETURNING x.* INTO a;
	IF NOT FOUND THEN
		SELECT x.* INTO a FROM payidem.anomaly x WHERE x.anomaly_id = resolve_anomaly.anomaly_id;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'anomaly % does not exist', resolve_anomaly.anomaly_id USING
				ERRCODE = 'PI009',
				DETAIL = 'payidem.anomaly has no row with that anomaly_id.';
		END IF;
		RAISE EXCEPTION 'anomaly % is not open', a.anomaly_id USING
			ERRCODE = 'PI002',
			DETAIL = format('It is already %s.', a.handle_status),
			HINT = 'Only an open anomaly can be resolved.';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.resolve_anomaly(bigint, text, text) IS
	'Close an open anomaly as handled (e.g. refunded through refund()) or ignored, with a note; records the session user and the time. PI009 unknown, PI002 not open, 22023 bad status or note.';

-- Views of what is open, oldest first.  security_invoker: a merchant-scoped
-- role sees its merchant's rows only (the tables' row-level security).
CREATE VIEW payidem.open_anomalies WITH (security_invoker = true) AS
SELECT a.anomaly_id, a.kind, a.order_no, a.payment_no, a.channel_no, a.amount, a.created_at,
	   pg_catalog.now() - a.created_at AS open_for, a.detail ->> 'action' AS action, a.detail
  FROM payidem.anomaly a
 WHERE a.handle_status = 'open'
 ORDER BY a.created_at, a.anomaly_id;
COMMENT ON VIEW payidem.open_anomalies IS
	'Open anomalies (money that needs a person), oldest first; resolve each with payidem.resolve_anomaly().';
CREATE VIEW payidem.open_differences WITH (security_invoker = true) AS
SELECT r.recon_id, r.channel_no, r.bill_date, r.diff_type, r.transaction_id, r.payment_no,
	   r.platform_amount, r.channel_amount, r.platform_status, r.channel_status, r.created_at,
	   pg_catalog.now() - r.created_at AS open_for
  FROM payidem.reconciliation r
 WHERE r.handle_status = 'open'
 ORDER BY r.bill_date, r.recon_id;
COMMENT ON VIEW payidem.open_differences IS
	'Open reconciliation differences, oldest bill day first; resolve each with payidem.resolve_diff().';
-- The notification backlog: events not delivered, by state and by how many
-- attempts they have had; the oldest due one says how far behind the
-- workers are.  Sent events are not read (the partial indexes on pending and
-- failed events serve it).
CREATE VIEW payidem.notification_backlog AS
SELECT e.status, e.attempts, pg_catalog.count(*) AS events,
	   pg_catalog.count(*) FILTER (WHERE e.next_attempt_at <= pg_catalog.now()) AS due_now,
	   pg_catalog.min(e.next_attempt_at) FILTER (WHERE e.next_attempt_at <= pg_catalog.now()) AS oldest_due_at,
	   pg_catalog.now() - pg_catalog.min(e.next_attempt_at) FILTER (WHERE e.next_attempt_at <= pg_catalog.now()) AS behind_by,
	   pg_catalog.min(e.created_at) AS oldest_event_at
  FROM (SELECT x.status, x.attempts, x.next_attempt_at, x.created_at
		  FROM payidem.notify_event x WHERE x.status = 'pending'
		UNION ALL
		SELECT x.status, x.attempts, x.next_attempt_at, x.created_at
		  FROM payidem.notify_event x WHERE x.status = 'failed') e
 GROUP BY e.status, e.attempts
 ORDER BY e.status DESC, e.attempts;
COMMENT ON VIEW payidem.notification_backlog IS
	'Undelivered notification events by status (pending, failed) and attempts so far: how many, how many due now, the oldest due and how far behind it is.';

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
SELECT pg_catalog.pg_extension_config_dump('payidem.notify_event', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.notify_event_seq', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.query_lease', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.idempotency', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.anomaly', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.anomaly_anomaly_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.channel_bill', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.recon_batch', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.reconciliation', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.reconciliation_recon_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.order_no_hwm', '');
-- (rows of roles that no longer exist are left out: pg_dump would write their
-- regrole as a bare OID, which in another cluster may be some other role)
SELECT pg_catalog.pg_extension_config_dump('payidem.merchant_role',
	'WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles u WHERE u.oid = role::oid)');
SELECT pg_catalog.pg_extension_config_dump('payidem.auditor_role',
	'WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles u WHERE u.oid = role::oid)');

------------------------------------------------------------------------------
-- Privileges: nothing for PUBLIC.  Grant to your application and operator
-- roles explicitly (see README, "Privileges").
------------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA payidem FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA payidem FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA payidem FROM PUBLIC;
REVOKE ALL ON SCHEMA payidem FROM PUBLIC;

