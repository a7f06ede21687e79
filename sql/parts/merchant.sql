------------------------------------------------------------------------------
-- Merchants, their secrets and signatures, channels, bindings, routing (crypto
-- in C: src/crypto.c)
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
-- A notification's v2 signature: HMAC-SHA256 of "payidem-notification-v2", a
-- NUL byte and the message, which no text (what sign() signs) can hold, so
-- the two never verify as each other (docs/notifications.md "Signature").
CREATE FUNCTION payidem._notify_v2_sign(aad text, key_version integer, nonce bytea, ciphertext bytea,
	auth_tag bytea, message text)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_notify_v2_sign'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
CREATE FUNCTION payidem._notify_v2_verify(aad text, key_version integer, nonce bytea, ciphertext bytea,
	auth_tag bytea, message text, signature text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_notify_v2_verify'
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

-- The attributes of a new merchant (create_merchant, and its copies on shards).
CREATE FUNCTION payidem._check_merchant_fields(name text, merchant_type text, fee_rate numeric,
	settle_cycle text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF name IS NULL OR length(btrim(name)) NOT BETWEEN 1 AND 128 THEN
		PERFORM payidem._raise_invalid('invalid merchant name',
			format('The name was %s; it must have 1 to 128 characters.', coalesce(quote_literal(left(name, 64)), 'NULL')));
	END IF;
	PERFORM payidem._check_no_controls('invalid merchant name', 'The name', name);
	PERFORM payidem._check_code('merchant type', merchant_type, '^[a-z][a-z0-9_]{0,31}$',
		'a merchant type is a lower-case code such as retail or catering.');
	PERFORM payidem._check_rate('merchant fee', fee_rate);
	PERFORM payidem._check_code('settlement cycle', settle_cycle, '^[TD][0-9]{1,2}$',
		'a settlement cycle is T<n> or D<n>, e.g. T1 or D0.');
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
		PERFORM payidem._raise_not_found('merchant', p_merchant_no, 'payidem.merchant', 'merchant_no');
	END IF;
	RETURN m;
END
$$;

-- The same, for a change a closed merchant no longer takes (closed is final):
-- a new API secret, a channel binding, a reporting role.  PI004 if it is
-- closed; action says what it is refused.
CREATE FUNCTION payidem._open_merchant_for_update(p_merchant_no text, action text)
RETURNS payidem.merchant
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	m payidem.merchant := payidem._merchant_for_update(p_merchant_no);
BEGIN
	IF m.status = 'closed' THEN
		RAISE EXCEPTION 'merchant % is closed', m.merchant_no USING
			ERRCODE = 'PI004',
			DETAIL = format('Merchant %s has status closed; a closed merchant %s.', m.merchant_no, action),
			HINT = 'A closed merchant stays closed; create a new merchant instead.';
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
		PERFORM payidem._raise_not_found('channel', p_channel_no, 'payidem.channel', 'channel_no');
	END IF;
	RETURN c;
END
$$;

-- associated data binding a sealed record to its row: for a merchant's API
-- secret 'merchant_secret:<merchant_no>:<version>' (src/crypto.c, which the
-- notification's signature calls too)
CREATE FUNCTION payidem._secret_aad(p_merchant_no text, p_version integer)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_secret_aad_sql'
LANGUAGE C IMMUTABLE STRICT;

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
	m := payidem._open_merchant_for_update(rotate_merchant_secret.merchant_no, 'gets no new API secret');

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
		PERFORM payidem._raise_not_found('merchant', sign.merchant_no, 'payidem.merchant', 'merchant_no');
	END IF;
	-- a closed merchant's key is dead: it signs nothing more
	IF EXISTS (SELECT 1 FROM payidem.merchant m
				WHERE m.merchant_no OPERATOR(pg_catalog.=) s.merchant_no AND m.status OPERATOR(pg_catalog.=) 'closed') THEN
		RAISE EXCEPTION 'merchant % is closed', s.merchant_no USING
			ERRCODE = 'PI004',
			DETAIL = format('Merchant %s has status closed; its API secret no longer signs or verifies.', s.merchant_no);
	END IF;
	IF payload IS NULL THEN
		PERFORM payidem._raise_invalid('payload to sign must not be NULL',
			'payload was NULL.',
			'Pass the exact text that will be sent, e.g. the JSON body.');
	END IF;
	RETURN payidem._hmac_sign(payidem._secret_aad(s.merchant_no, s.secret_version),
							  s.key_version, s.nonce, s.ciphertext, s.auth_tag, payload);
END
$$;
COMMENT ON FUNCTION payidem.sign(text, text) IS
	'HMAC-SHA256 (64 lowercase hex) of the payload under the merchant''s current API secret; PI004 for a closed merchant.';

-- Every secret of a merchant valid now: the current one and, within its
-- grace window, the previous one; none for a closed merchant.  What
-- verify_signature() accepts and a notification is signed with: one decision
-- in C (src/notify.c, secrets_valid_now()), which the notification's
-- signature calls without SQL; read with the caller's SELECT right on
-- merchant and merchant_secret, the newest first.
CREATE FUNCTION payidem._secrets_valid_now(p_merchant_no text)
RETURNS SETOF payidem.merchant_secret
AS 'MODULE_PATHNAME', 'payidem_secrets_valid_now'
LANGUAGE C STABLE;
COMMENT ON FUNCTION payidem._secrets_valid_now(text) IS
	'Internal: the merchant''s API secrets valid now, newest first (none if the merchant is closed).';

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
		PERFORM payidem._raise_invalid('invalid merchant status',
			format('The status was %s; it must be active, frozen or closed.', coalesce(quote_literal(left(status, 64)), 'NULL')));
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
		PERFORM payidem._raise_invalid('invalid channel weight',
			format('The weight was %s; it must be from 0 to 10000.', coalesce(weight::text, 'NULL')));
	END IF;
	IF allowed_merchant_types IS NOT NULL AND (cardinality(allowed_merchant_types) = 0
		OR array_position(allowed_merchant_types, NULL) IS NOT NULL
		OR array_to_string(allowed_merchant_types, ',') !~ '^[a-z][a-z0-9_]{0,31}(,[a-z][a-z0-9_]{0,31})*$') THEN
		PERFORM payidem._raise_invalid('invalid list of allowed merchant types',
			format('The list was %s; it must be NULL (all types) or a non-empty list of lower-case merchant types.',
				left(allowed_merchant_types::text, 200)));
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
		PERFORM payidem._raise_invalid('invalid channel status',
			format('The status was %s; it must be active or disabled.', coalesce(quote_literal(left(status, 64)), 'NULL')));
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
		PERFORM payidem._raise_invalid('channel configuration must be a JSON object',
			format('It was a JSON %s.', coalesce(jsonb_typeof(config), 'NULL')),
			'Pass e.g. {"app_id": "...", "private_key": "..."}.');
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
		PERFORM payidem._raise('PI009', format('channel %s has no configuration',
			coalesce(quote_literal(left(get_channel_config.channel_no, 64)), 'NULL')),
			hint => 'Store one with payidem.set_channel_config().');
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
	m := payidem._open_merchant_for_update(bind_channel.merchant_no, 'is bound to no channel');
	c := payidem._channel_for_update(bind_channel.channel_no);
	IF bind_channel.fee_rate IS NOT NULL THEN
		PERFORM payidem._check_rate('merchant fee', bind_channel.fee_rate);
	END IF;
	PERFORM payidem._check_limit('single limit', single_limit);
	PERFORM payidem._check_limit('daily limit', daily_limit);
	IF single_limit > daily_limit THEN
		PERFORM payidem._raise_invalid('single limit exceeds daily limit',
			format('The single limit was %s and the daily limit %s.', single_limit, daily_limit));
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
		PERFORM payidem._raise('PI009', format('merchant %s is not bound to channel %s',
			coalesce(quote_literal(left(unbind_channel.merchant_no, 64)), 'NULL'),
			coalesce(quote_literal(left(unbind_channel.channel_no, 64)), 'NULL')));
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
		PERFORM payidem._raise_not_found('merchant', route_channel.merchant_no,
			'payidem.merchant', 'merchant_no');
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

