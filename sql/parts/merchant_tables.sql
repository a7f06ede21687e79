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

