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
		PERFORM payidem._raise_invalid('invalid API secret', 'An API secret has 16 to 256 characters.');	-- never the value
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
		PERFORM payidem._raise_invalid('invalid API secret', 'An API secret has 16 to 256 characters.');
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
		PERFORM payidem._raise_invalid('invalid reference document',
			'It must be what payidem.export_reference() returns: an object with merchants, secrets, channels, configs and bindings.');
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
		PERFORM payidem._raise_invalid('placed_lines and placed_partitions differ in length',
			format('%s lines, %s partitions.', coalesce(cardinality(placed_lines), 0),
				coalesce(cardinality(placed_partitions), 0)));
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

